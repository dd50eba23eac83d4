// tefl demo: one GPT-style transformer layer, forward and backward, on
// synthetic data, every op that tefl has through the manager:
//   rmsnorm -> QKV GEMM -> RoPE -> causal attention -> output projection ->
//   residual -> rmsnorm -> SwiGLU MLP -> residual, and the backward pass.
// The layer runs twice: under the policy in force (TE_FL_* variables) and
// pinned to reference.cpp; each op's outputs are compared between the two.
// Every projection product (forward, dgrad, wgrad) is tefl's generic_gemm
// (row-major, transposes as attributes: docs/ops-gemm.md), attention is
// fused_attn_fwd/bwd (bshd, causal); the residual adds are the demo's own
// plain loops, marked "demo code" in the table.
#include <fmt/format.h>

#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <random>

#include "cli_support.h"
#include "core/thread_pool.h"
#include "tefl/ops.h"

namespace tefl::cli {
namespace {

using Clock = std::chrono::steady_clock;
using Floats = std::vector<float>;

struct Config {
  int64_t batch = 2, seq = 128, hidden = 256, heads = 4, ffn = 512;
  DType dtype = DType::kF32;
  uint64_t seed = 1;
  int64_t tokens() const { return batch * seq; }
  int64_t head_dim() const { return hidden / heads; }
};

struct OpStat {
  std::string op, impl;
  bool demo_code = false;
  int64_t calls = 0;
  double seconds = 0;
  std::vector<Floats> outputs;  // every output of every call, in order
};

// An integer option's check (CLI::Range says "Value abc not in range 1 to
// 65536" of a value that is no number at all).
CLI::Validator IntegerIn(int64_t lo, int64_t hi) {
  return CLI::Validator(
      [lo, hi](std::string& text) -> std::string {
        int64_t v = 0;
        const char* end = text.data() + text.size();
        const auto [ptr, ec] = std::from_chars(text.data(), end, v);
        if (text.empty() || ptr != end) return fmt::format("'{}' is not an integer", text);
        if (ec != std::errc() || v < lo || v > hi) return fmt::format("{} is out of range {}..{}", text, lo, hi);
        return std::string();
      },
      fmt::format("INT in [{} - {}]", lo, hi));
}

Floats RandomFloats(size_t n, float scale, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  Floats v(n);
  for (float& x : v) x = dist(rng);
  return v;
}

class Layer {
 public:
  explicit Layer(const Config& cfg) : cfg_(cfg) {
    const int64_t d = cfg.hidden, f = cfg.ffn;
    const float wd = 1.0f / std::sqrt(float(d)), wf = 1.0f / std::sqrt(float(f));
    w_qkv_ = RandomFloats(size_t(d * 3 * d), wd, cfg.seed + 1);
    w_o_ = RandomFloats(size_t(d * d), wd, cfg.seed + 2);
    w_1_ = RandomFloats(size_t(d * 2 * f), wd, cfg.seed + 3);
    w_2_ = RandomFloats(size_t(f * d), wf, cfg.seed + 4);
    g1_ = RandomFloats(size_t(d), 0.1f, cfg.seed + 5);
    g2_ = RandomFloats(size_t(d), 0.1f, cfg.seed + 6);
    for (float& g : g1_) g += 1.0f;
    for (float& g : g2_) g += 1.0f;
    x_ = RandomFloats(size_t(cfg.tokens() * d), 1.0f, cfg.seed + 7);
    dy_ = RandomFloats(size_t(cfg.tokens() * d), 1.0f, cfg.seed + 8);
    // RoPE angles: position * 10000^(-2i/Dh), rotate-half layout (cat(f, f)).
    const int64_t hd = cfg.head_dim();
    freqs_.resize(size_t(cfg.seq * hd));
    for (int64_t p = 0; p < cfg.seq; ++p)
      for (int64_t i = 0; i < hd; ++i)
        freqs_[size_t(p * hd + i)] = float(p) * std::pow(10000.0f, -2.0f * float(i % (hd / 2)) / float(hd));
  }

  // Forward and backward once; returns the seconds of the whole pass: the
  // op calls and the demo's own bookkeeping (tensor conversions, the copies
  // kept for the error comparison, head slicing).
  double Run(std::map<std::string, OpStat>* stats, std::vector<std::string>* order) {
    stats_ = stats;
    order_ = order;
    const auto t0 = Clock::now();
    Forward();
    Backward();
    return std::chrono::duration<double>(Clock::now() - t0).count();
  }

 private:
  // ---- tensors crossing into tefl ------------------------------------------
  Tensor ToTensor(const Floats& v, std::vector<int64_t> shape, DType dt) const {
    Tensor t(dt, std::move(shape));
    for (int64_t i = 0; i < t.numel(); ++i) t.set(i, v[size_t(i)]);
    return t;
  }
  static Floats ToFloats(const Tensor& t) {
    Floats v(size_t(t.numel()));
    for (int64_t i = 0; i < t.numel(); ++i) v[size_t(i)] = float(t.at(i));
    return v;
  }
  OpStat& Stat(const std::string& op, bool demo) {
    auto it = stats_->find(op);
    if (it == stats_->end()) {
      order_->push_back(op);
      it = stats_->emplace(op, OpStat{op, demo ? "demo code" : "", demo}).first;
    }
    return it->second;
  }
  // One op through the manager; its outputs are recorded for the comparison.
  void Call(const char* op, std::vector<Tensor*> in, std::vector<Tensor*> out, const void* attrs,
            const std::string& label = "") {
    std::vector<const DLTensor*> din;
    std::vector<DLTensor*> dout;
    for (Tensor* t : in) din.push_back(t ? &t->dl() : nullptr);
    for (Tensor* t : out) dout.push_back(t ? t->ptr() : nullptr);
    OpManager& mgr = GetDefaultManager();
    const auto t0 = Clock::now();
    const Status s = mgr.Call(op, din, dout, attrs);
    const double dt = std::chrono::duration<double>(Clock::now() - t0).count();
    if (!s.ok()) throw CliError(fmt::format("demo: {} failed: {}", op, s.message()));
    OpStat& st = Stat(label.empty() ? std::string(op) : label, false);
    st.impl = mgr.GetSelectedImplId(op);
    ++st.calls;
    st.seconds += dt;
    for (Tensor* t : out)
      if (t) st.outputs.push_back(ToFloats(*t));
  }
  // The demo's own code, timed and recorded like an op.
  template <class Fn>
  void Own(const std::string& label, Fn&& fn, std::vector<const Floats*> outputs) {
    const auto t0 = Clock::now();
    fn();
    OpStat& st = Stat(label, true);
    ++st.calls;
    st.seconds += std::chrono::duration<double>(Clock::now() - t0).count();
    for (const Floats* o : outputs) st.outputs.push_back(*o);
  }
  // C[m, n] = op(a) op(b) through generic_gemm (row-major; op = transpose
  // when ta / tb). `what` names the product in the table.
  void MatMul(const std::string& what, int64_t m, int64_t n, int64_t k, const Floats& a, bool ta, const Floats& b,
              bool tb, Floats* c) {
    const DType dt = cfg_.dtype;
    Tensor at = ToTensor(a, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, dt);
    Tensor bt = ToTensor(b, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, dt);
    Tensor ct(dt, {m, n});
    tefl_gemm_attrs g{};
    g.struct_size = TEFL_GEMM_ATTRS_STRUCT_SIZE;
    g.transa = ta ? 1 : 0;
    g.transb = tb ? 1 : 0;
    g.alpha = 1.0f;
    g.beta = 0.0f;
    Call("generic_gemm", {&at, &bt, nullptr, nullptr, nullptr, nullptr, nullptr}, {&ct, nullptr, nullptr, nullptr}, &g,
         "generic_gemm (" + what + ")");
    *c = ToFloats(ct);
  }

  // Head slices: q/k/v [b, s, H, Dh] from qkv [T, 3D] (part 0, 1, 2), and back.
  Floats Slice(const Floats& qkv, int part) const {
    const int64_t t = cfg_.tokens(), d = cfg_.hidden;
    Floats out(size_t(t * d));
    for (int64_t r = 0; r < t; ++r)
      for (int64_t j = 0; j < d; ++j) out[size_t(r * d + j)] = qkv[size_t(r * 3 * d + part * d + j)];
    return out;
  }
  void Unslice(const Floats& src, int part, Floats* qkv) const {
    const int64_t t = cfg_.tokens(), d = cfg_.hidden;
    for (int64_t r = 0; r < t; ++r)
      for (int64_t j = 0; j < d; ++j) (*qkv)[size_t(r * 3 * d + part * d + j)] = src[size_t(r * d + j)];
  }
  tefl_attention_attrs AttentionAttrs() const {
    tefl_attention_attrs a{};
    a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
    a.qkv_format = TEFL_QKV_BSHD;
    a.mask_type = TEFL_ATTN_MASK_CAUSAL;
    a.window_left = -1;
    a.window_right = 0;
    a.softmax_type = TEFL_ATTN_SOFTMAX_VANILLA;
    a.scale = 1.0f / std::sqrt(float(cfg_.head_dim()));
    return a;
  }

  void Add(const std::string& what, const Floats& a, const Floats& b, Floats* c) {
    c->resize(a.size());
    Own("residual add (" + what + ")",
        [&] {
          for (size_t i = 0; i < a.size(); ++i) (*c)[i] = a[i] + b[i];
        },
        {c});
  }

  void Forward() {
    const int64_t t = cfg_.tokens(), d = cfg_.hidden, f = cfg_.ffn, s = cfg_.seq, b = cfg_.batch;
    const int64_t h = cfg_.heads, hd = cfg_.head_dim();
    const DType dt = cfg_.dtype;
    const tefl_norm_fwd_attrs norm{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};
    // 1. rmsnorm
    Tensor x = ToTensor(x_, {t, d}, dt), g1 = ToTensor(g1_, {d}, dt), n1(dt, {t, d}), rs1(DType::kF32, {t});
    Call("rmsnorm_fwd", {&x, &g1}, {&n1, &rs1}, &norm);
    n1_ = ToFloats(n1);
    rs1_ = rs1;
    // 2. QKV projection
    MatMul("qkv projection", t, 3 * d, d, n1_, false, w_qkv_, false, &qkv_);
    // 3. RoPE on q and k, bshd [b, s, H, Dh]
    const tefl_rope_attrs rope{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_BSHD, 0, 1, 0};
    Tensor freqs = ToTensor(freqs_, {s, 1, 1, hd}, DType::kF32);
    for (int part = 0; part < 2; ++part) {
      Tensor in = ToTensor(Slice(qkv_, part), {b, s, h, hd}, dt), out(dt, {b, s, h, hd});
      Call("fused_rope_forward", {&in, &freqs, nullptr, nullptr}, {&out}, &rope);
      (part == 0 ? q_ : k_) = ToFloats(out);
    }
    v_ = Slice(qkv_, 2);
    // 4. causal attention (flash: no [s, s] scores in memory); o is [b, s, H, Dh] = [T, D]
    const tefl_attention_attrs attn = AttentionAttrs();
    Tensor qt = ToTensor(q_, {b, s, h, hd}, dt), kt = ToTensor(k_, {b, s, h, hd}, dt),
           vt = ToTensor(v_, {b, s, h, hd}, dt);
    Tensor ot(dt, {b, s, h, hd}), stats(DType::kF32, {b, h, s});
    Call("fused_attn_fwd", {&qt, &kt, &vt, nullptr, nullptr, nullptr}, {&ot, &stats}, &attn);
    o_ = ToFloats(ot);
    stats_lse_ = stats;
    // 5. output projection, residual
    Floats a;
    MatMul("output projection", t, d, d, o_, false, w_o_, false, &a);
    Add("attention", x_, a, &r1_);
    // 6. rmsnorm, SwiGLU MLP, residual
    Tensor r1 = ToTensor(r1_, {t, d}, dt), g2 = ToTensor(g2_, {d}, dt), n2(dt, {t, d}), rs2(DType::kF32, {t});
    Call("rmsnorm_fwd", {&r1, &g2}, {&n2, &rs2}, &norm);
    n2_ = ToFloats(n2);
    rs2_ = rs2;
    MatMul("mlp up", t, 2 * f, d, n2_, false, w_1_, false, &u_);
    Tensor u = ToTensor(u_, {t, 2 * f}, dt), m(dt, {t, f});
    Call("swiglu", {&u}, {&m}, nullptr);
    m_ = ToFloats(m);
    Floats down, y;
    MatMul("mlp down", t, d, f, m_, false, w_2_, false, &down);
    Add("mlp", r1_, down, &y);
  }

  void Backward() {
    const int64_t t = cfg_.tokens(), d = cfg_.hidden, f = cfg_.ffn, s = cfg_.seq, b = cfg_.batch;
    const int64_t h = cfg_.heads, hd = cfg_.head_dim();
    const DType dt = cfg_.dtype;
    const tefl_norm_bwd_attrs norm{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};
    Floats dm, dw2, dn2, dw1;
    MatMul("mlp down, dgrad", t, f, d, dy_, false, w_2_, true, &dm);
    MatMul("mlp down, wgrad", f, d, t, m_, true, dy_, false, &dw2);
    Tensor dmt = ToTensor(dm, {t, f}, dt), u = ToTensor(u_, {t, 2 * f}, dt), du(dt, {t, 2 * f});
    Call("dswiglu", {&dmt, &u}, {&du}, nullptr);
    const Floats duf = ToFloats(du);
    MatMul("mlp up, dgrad", t, d, 2 * f, duf, false, w_1_, true, &dn2);
    MatMul("mlp up, wgrad", d, 2 * f, t, n2_, true, duf, false, &dw1);
    // rmsnorm backward with the residual gradient added (dr1 = dy + ...)
    Tensor dn2t = ToTensor(dn2, {t, d}, dt), r1 = ToTensor(r1_, {t, d}, dt), dyt = ToTensor(dy_, {t, d}, dt);
    Tensor g2 = ToTensor(g2_, {d}, dt), dr1(dt, {t, d}), dg2(dt, {d});
    Call("rmsnorm_bwd_add", {&dn2t, &r1, &dyt, &rs2_, &g2}, {&dr1, &dg2}, &norm);
    const Floats dr1f = ToFloats(dr1);
    Floats d_o, dwo;
    MatMul("output projection, dgrad", t, d, d, dr1f, false, w_o_, true, &d_o);
    MatMul("output projection, wgrad", d, d, t, o_, true, dr1f, false, &dwo);
    // attention backward (recomputes the probabilities from the saved statistics)
    const tefl_attention_attrs attn = AttentionAttrs();
    Tensor qt = ToTensor(q_, {b, s, h, hd}, dt), kt = ToTensor(k_, {b, s, h, hd}, dt),
           vt = ToTensor(v_, {b, s, h, hd}, dt);
    Tensor ot = ToTensor(o_, {b, s, h, hd}, dt), dot = ToTensor(d_o, {b, s, h, hd}, dt);
    Tensor dqt(dt, {b, s, h, hd}), dkt(dt, {b, s, h, hd}), dvt(dt, {b, s, h, hd});
    Call("fused_attn_bwd", {&qt, &kt, &vt, &ot, &dot, &stats_lse_, nullptr, nullptr, nullptr},
         {&dqt, &dkt, &dvt, nullptr}, &attn);
    const Floats dq = ToFloats(dqt), dk = ToFloats(dkt), dv = ToFloats(dvt);
    // RoPE backward, gradients back into [T, 3D]
    const tefl_rope_attrs rope{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_BSHD, 0, 1, 0};
    Tensor freqs = ToTensor(freqs_, {s, 1, 1, hd}, DType::kF32);
    Floats dqkv(size_t(t * 3 * d));
    for (int part = 0; part < 2; ++part) {
      Tensor in = ToTensor(part == 0 ? dq : dk, {b, s, h, hd}, dt), out(dt, {b, s, h, hd});
      Call("fused_rope_backward", {&in, &freqs, nullptr, nullptr}, {&out}, &rope);
      Unslice(ToFloats(out), part, &dqkv);
    }
    Unslice(dv, 2, &dqkv);
    Floats dn1, dwqkv;
    MatMul("qkv projection, dgrad", t, d, 3 * d, dqkv, false, w_qkv_, true, &dn1);
    MatMul("qkv projection, wgrad", d, 3 * d, t, n1_, true, dqkv, false, &dwqkv);
    Tensor dn1t = ToTensor(dn1, {t, d}, dt), x = ToTensor(x_, {t, d}, dt), g1 = ToTensor(g1_, {d}, dt);
    Tensor dx(dt, {t, d}), dg1(dt, {d});
    Call("rmsnorm_bwd_add", {&dn1t, &x, &dr1, &rs1_, &g1}, {&dx, &dg1}, &norm);
  }

  Config cfg_;
  Floats w_qkv_, w_o_, w_1_, w_2_, g1_, g2_, x_, dy_, freqs_;
  Floats n1_, qkv_, q_, k_, v_, o_, r1_, n2_, u_, m_;
  Tensor rs1_, rs2_, stats_lse_;
  std::map<std::string, OpStat>* stats_ = nullptr;
  std::vector<std::string>* order_ = nullptr;
};

double MaxAbsDiff(const OpStat& a, const OpStat& b) {
  double m = 0;
  for (size_t k = 0; k < a.outputs.size() && k < b.outputs.size(); ++k)
    for (size_t i = 0; i < a.outputs[k].size() && i < b.outputs[k].size(); ++i) {
      const double d = std::fabs(double(a.outputs[k][i]) - double(b.outputs[k][i]));
      if (std::isnan(d)) return d;
      m = std::max(m, d);
    }
  return m;
}

}  // namespace

void AddDemoCommand(CLI::App& app) {
  struct Args {
    Config cfg;
    std::string dtype = "fp32";
    std::vector<std::string> plugins;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Run one GPT-style transformer layer forward and backward through tefl; per-op implementations, "
      "times and error against the reference backend");
  cmd->add_option("--batch", args->cfg.batch, "Sequences")->capture_default_str()->check(IntegerIn(1, 1 << 16));
  cmd->add_option("--seq", args->cfg.seq, "Tokens per sequence")->capture_default_str()->check(IntegerIn(1, 1 << 16));
  cmd->add_option("--hidden", args->cfg.hidden, "Hidden size")->capture_default_str()->check(IntegerIn(2, 1 << 16));
  cmd->add_option("--heads", args->cfg.heads, "Attention heads (must divide hidden, head dim even)")
      ->capture_default_str()
      ->check(IntegerIn(1, 1 << 12));
  cmd->add_option("--ffn", args->cfg.ffn, "MLP inner size")->capture_default_str()->check(IntegerIn(1, 1 << 18));
  cmd->add_option("--dtype", args->dtype, "Activation dtype of the tefl ops: fp32, bf16, fp16")->capture_default_str();
  AddPluginOption(cmd, &args->plugins);
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] {
    Config cfg = args->cfg;
    cfg.dtype = ParseDType(args->dtype);
    if (cfg.hidden % cfg.heads != 0 || cfg.head_dim() % 2 != 0)
      throw UsageError(fmt::format("--heads {} must divide --hidden {} into an even head dim", cfg.heads, cfg.hidden));
    GetDefaultManager().EnsureInitialized();
    LoadPluginsOrThrow(args->plugins);
    Layer layer(cfg);
    // The reference run first (it also warms every code path), then the
    // layer under the policy in force.
    std::map<std::string, OpStat> ref_stats, stats;
    std::vector<std::string> ref_order, order;
    {
      SelectionPolicy reference;
      const Status s = SelectionPolicy::Make("reference", false, {}, {}, std::nullopt, &reference);
      if (!s.ok()) throw CliError(s.message());
      PolicyContext ctx(reference);
      layer.Run(&ref_stats, &ref_order);
    }
    const double pass_seconds = layer.Run(&stats, &order);
    // The layer's time is its ops' (every row of the table: tefl's calls and
    // the residual adds), not the demo's bookkeeping around them.
    double seconds = 0;
    for (const auto& [name, st] : stats) seconds += st.seconds;
    const double tokens_per_s = double(cfg.tokens()) / seconds;
    nlohmann::json rows = nlohmann::json::array();
    Table t({"op", "implementation", "calls", "total time", "max |err| vs reference"});
    for (const std::string& op : order) {
      const OpStat& st = stats.at(op);
      const double err = MaxAbsDiff(st, ref_stats.at(op));
      rows.push_back({{"op", op},
                      {"implementation", st.impl},
                      {"demo_code", st.demo_code},
                      {"calls", st.calls},
                      {"seconds", st.seconds},
                      {"max_abs_error", err}});
      t.Add({op, st.impl, std::to_string(st.calls), fmt::format("{:.3f} ms", st.seconds * 1e3),
             fmt::format("{:.3g}", err)});
    }
    if (args->json) {
      nlohmann::json j = {{"batch", cfg.batch},
                          {"seq", cfg.seq},
                          {"hidden", cfg.hidden},
                          {"heads", cfg.heads},
                          {"ffn", cfg.ffn},
                          {"dtype", args->dtype},
                          {"threads", ThreadPoolSize()},
                          {"seconds", seconds},
                          {"tokens_per_second", tokens_per_s},
                          {"pass_seconds", pass_seconds},
                          {"policy", GetPolicy().Fingerprint()},
                          {"ops", rows}};
      std::printf("%s\n", j.dump(2).c_str());
      return;
    }
    std::printf("tefl demo: one transformer layer, forward + backward\n");
    std::printf("  batch %lld x seq %lld tokens, hidden %lld, %lld heads of %lld, ffn %lld (SwiGLU), %s, %s\n",
                (long long)cfg.batch, (long long)cfg.seq, (long long)cfg.hidden, (long long)cfg.heads,
                (long long)cfg.head_dim(), (long long)cfg.ffn, args->dtype.c_str(),
                Plural(size_t(ThreadPoolSize()), "thread").c_str());
    std::printf("  policy %s\n\n%s\n", PolicySummary(GetPolicy()).c_str(), t.ToString().c_str());
    std::printf("'demo code': the residual adds are the demo's own plain loops (tefl has no add op).\n");
    std::printf(
        "layer forward + backward: %.1f ms, %.0f tokens/s (the table's times summed; the whole pass took %.1f ms "
        "with the demo's own tensor copies and conversions)\n",
        seconds * 1e3, tokens_per_s, pass_seconds * 1e3);
  });
}

}  // namespace tefl::cli
