// Built-in cases of the RoPE ops (spec/ops.md, "RoPE"): the grid's shape is
// [s, b, h, d], run as sbhd, as bshd and packed as thd (b sequences of
// unequal lengths summing to s * b tokens), rotate-half and interleaved,
// with d2 = d and d2 = d / 2 (the tail copied); the qkv ops as sbhd and bshd.
#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1, 1, 2}, {5, 2, 3, 8}, {17, 3, 2, 64}, {64, 2, 4, 128}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

}  // namespace

// fused_qkv_rope_forward/backward: the grid's [s, b, h, d] is h head groups of
// 2 q heads, 1 k head and 1 v head of size d (q_split 2d, k_split = v_split = d).
std::vector<Case> QkvRopeCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  const bool fwd = op == "fused_qkv_rope_forward";
  for (const std::vector<int64_t>& g : Shapes(o)) {
    if (g.size() != 4 || g[3] % 2 != 0) continue;
    const int64_t s = g[0], b = g[1], h = g[2], d = g[3];
    for (DType t : DTypes(o)) {
      for (int32_t format : {TEFL_QKV_SBHD, TEFL_QKV_BSHD}) {
        for (int32_t interleaved : {0, 1}) {
          for (int64_t d2 : {d, (d / 2) & ~int64_t(1)}) {
            if (d2 == 0) continue;
            Case c;
            c.op = op;
            c.dtype = DTypeName(t);
            auto lay = [&](int64_t heads, int64_t last) {
              return format == TEFL_QKV_SBHD ? std::vector<int64_t>{s, b, heads, last}
                                             : std::vector<int64_t>{b, s, heads, last};
            };
            const std::vector<int64_t> qkv = lay(h, 4 * d), q = lay(2 * h, d), kv = lay(h, d);
            c.shape = ShapeString(qkv);
            c.note = std::string(format == TEFL_QKV_SBHD ? "sbhd" : "bshd") + (interleaved ? " interleaved" : "") +
                     " d2=" + std::to_string(d2) + " q/k/v heads 2/1/1 per group";
            const std::string seed = op + c.dtype + c.shape + c.note;
            c.attrs = AttrBytes(tefl_qkv_rope_attrs{TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, format, interleaved, 1, 0,
                                                    int32_t(2 * d), int32_t(d), int32_t(d)});
            Tensor qf = Input(DType::kF32, {s, 1, 1, d2}, "qf" + seed, 0.0, double(s));
            Tensor kf = Input(DType::kF32, {s, 1, 1, d2}, "kf" + seed, 0.0, double(s));
            if (fwd) {
              c.inputs = {Input(t, qkv, "x" + seed), qf, kf, std::nullopt};
              c.outputs = {Output(t, q), Output(t, kv), Output(t, kv)};
            } else {
              c.inputs = {
                  Input(t, q, "dq" + seed), Input(t, kv, "dk" + seed), Input(t, kv, "dv" + seed), qf, kf, std::nullopt};
              c.outputs = {Output(t, qkv)};
            }
            c.tolerances.assign(c.outputs.size(), ToleranceFor(t));
            c.exact.assign(c.outputs.size(), false);
            out.push_back(std::move(c));
            if (o.first_only) return out;
          }
        }
      }
    }
  }
  return out;
}

std::vector<Case> RopeCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  if (op == "fused_qkv_rope_forward" || op == "fused_qkv_rope_backward") return QkvRopeCases(op, o);
  if (op != "fused_rope_forward" && op != "fused_rope_backward") return out;
  for (const std::vector<int64_t>& g : Shapes(o)) {
    if (g.size() != 4) continue;
    const int64_t s = g[0], b = g[1], h = g[2], d = g[3];
    int64_t tokens = 0;
    if (__builtin_mul_overflow(s, b, &tokens)) continue;  // s * b tokens (thd, freqs) past int64
    for (DType t : DTypes(o)) {
      for (int32_t format : {TEFL_QKV_SBHD, TEFL_QKV_BSHD, TEFL_QKV_THD}) {
        if (format == TEFL_QKV_THD && tokens > INT32_MAX) continue;  // int32 cu_seqlens cannot count them
        for (int32_t interleaved : {0, 1}) {
          for (int64_t d2 : {d, (d / 2) & ~int64_t(1)}) {
            if (d2 == 0 && d != 0) continue;
            Case c;
            c.op = op;
            c.dtype = DTypeName(t);
            std::vector<int64_t> xs = format == TEFL_QKV_SBHD   ? std::vector<int64_t>{s, b, h, d}
                                      : format == TEFL_QKV_BSHD ? std::vector<int64_t>{b, s, h, d}
                                                                : std::vector<int64_t>{s * b, h, d};
            c.shape = ShapeString(xs);
            const char* fname = format == TEFL_QKV_SBHD ? "sbhd" : format == TEFL_QKV_BSHD ? "bshd" : "thd";
            c.note = std::string(fname) + (interleaved ? " interleaved" : "") + " d2=" + std::to_string(d2);
            const std::string seed = op + c.dtype + c.shape + c.note;
            c.attrs = AttrBytes(tefl_rope_attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, format, interleaved, 1, 0});
            // Angles like inv_freq * position: up to ~s radians.
            Tensor freqs = Input(DType::kF32, {s * b, 1, 1, d2}, "f" + seed, 0.0, double(s));
            std::optional<Tensor> cu;
            if (format == TEFL_QKV_THD) {
              // b sequences of unequal lengths (the first possibly empty).
              Tensor cs(DType::kI32, {b + 1});
              const int64_t total = s * b;
              for (int64_t i = 0; i <= b; ++i) cs.set(i, double(i == b ? total : (total * i * i) / (b * b)));
              cu = cs;
            }
            c.inputs = {Input(t, xs, "x" + seed), freqs, std::nullopt, cu};
            c.outputs = {Output(t, xs)};
            c.tolerances = {ToleranceFor(t)};
            c.exact = {false};
            out.push_back(std::move(c));
            if (o.first_only) return out;
          }
        }
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
