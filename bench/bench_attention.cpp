// Attention kernels (fused_attn_fwd / fused_attn_bwd) at b = 2, h = 16, d =
// 64 and 128, s = sq = sk = 512 and 2048 (bshd), causal and not, fp32 and
// bf16, next to this machine's fp32 GEMM rate measured in the same run:
//   BM_Sgemm/<n>                   OpenBLAS cblas_sgemm, n x n x n (2 n^3 flops)
//   BM_AttnFwd/<dtype>/s<s>/d<d>/<mask>/<impl>
//   BM_AttnBwd/<dtype>/s<s>/d<d>/<mask>/<impl>
// Each op runs through OpManager pinned to one implementation (strict
// impl:ID policy) on preallocated outputs. FLOP convention (the issue's):
// forward 4 b h sq sk d (halved for causal), backward 2.5x forward.
// Counters: GFLOPS; gemm_GFLOPS = the OpenBLAS sgemm rate around this
// benchmark (median of 1024^3 runs, 3 just before and 3 just after: the
// machine is shared and its load drifts); pct_of_gemm = GFLOPS as a
// percentage of it.
// Only default.portable (and other non-reference CPU impls) run at these
// sizes; reference.cpp would take minutes. Filter with
// --benchmark_filter, e.g. 'BM_Sgemm|BM_AttnFwd/fp32/s2048'.
#include <cblas.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bench_support.h"
#include "tefl/attention.hpp"

namespace {

using tefl::bench::Buffer;
using tefl::bench::View;
constexpr int64_t kBatch = 2, kHeads = 16;

double SgemmSeconds(int n, std::vector<float>& a, std::vector<float>& b, std::vector<float>& c) {
  const auto t0 = std::chrono::steady_clock::now();
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void BM_Sgemm(benchmark::State& state) {
  const int n = int(state.range(0));
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    benchmark::ClobberMemory();
  }
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * n * double(n) * n * double(state.iterations()) * 1e-9, benchmark::Counter::kIsRate);
}

void Fill(Buffer& b, tefl::DType dt, int64_t n, int seed) {
  uint32_t x = 2463534242u + uint32_t(seed);
  for (int64_t i = 0; i < n; ++i) {
    x ^= x << 13, x ^= x >> 17, x ^= x << 5;
    tefl::StoreFromFloat(b.data.get(), i, dt, float(x % 2001) / 1000.0f - 1.0f);
  }
}

void BM_Attn(benchmark::State& state, bool backward, tefl::DType dt, int64_t s, int64_t d, bool causal,
             const std::string& impl) {
  const size_t elem = tefl::bench::ElemBytes(dt);
  const int64_t n = kBatch * s * kHeads * d;
  int64_t shape[4] = {kBatch, s, kHeads, d}, sshape[3] = {kBatch, kHeads, s};
  Buffer q(size_t(n) * elem), k(size_t(n) * elem), v(size_t(n) * elem), o(size_t(n) * elem), d_o(size_t(n) * elem),
      stats(size_t(kBatch * kHeads * s) * 4), dq(size_t(n) * elem), dk(size_t(n) * elem), dv(size_t(n) * elem);
  Fill(q, dt, n, 1);
  Fill(k, dt, n, 2);
  Fill(v, dt, n, 3);
  Fill(d_o, dt, n, 4);
  DLTensor tq = View(q, dt, shape, 4), tk = View(k, dt, shape, 4), tv = View(v, dt, shape, 4),
           to = View(o, dt, shape, 4), tdo = View(d_o, dt, shape, 4), ts = View(stats, tefl::DType::kF32, sshape, 3),
           tdq = View(dq, dt, shape, 4), tdk = View(dk, dt, shape, 4), tdv = View(dv, dt, shape, 4);
  tefl_attention_attrs a{};
  a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
  a.qkv_format = TEFL_QKV_BSHD;
  a.mask_type = causal ? TEFL_ATTN_MASK_CAUSAL : TEFL_ATTN_MASK_NO_MASK;
  a.window_left = a.window_right = -1;
  const char* op = backward ? "fused_attn_bwd" : "fused_attn_fwd";
  auto pinned = tefl::bench::PinnedPolicy(op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::AttentionInputs in{&tq, &tk, &tv, nullptr, nullptr, nullptr};
  tefl::FlashAttentionOutputs fo;
  fo.o = &to;
  fo.stats = &ts;
  tefl::FlashAttentionGrads g;
  g.dq = &tdq;
  g.dk = &tdk;
  g.dv = &tdv;
  // The forward once (backward's saved o and stats).
  {
    auto fwd = tefl::bench::PinnedPolicy("fused_attn_fwd", impl);
    tefl::PolicyContext fctx(*fwd);
    if (tefl::Status st = tefl::FlashAttention(in, a, &fo); !st.ok()) {
      state.SkipWithError(st.ToString().c_str());
      return;
    }
  }
  auto run = [&] {
    return backward ? tefl::FlashAttentionBackward(in, &to, &tdo, &ts, a, &g) : tefl::FlashAttention(in, a, &fo);
  };
  if (tefl::Status st = run(); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  // The GEMM rate around this benchmark (the machine is shared: its load
  // changes during a run): median of 1024^3 sgemms, 3 before and 3 after.
  std::vector<float> ga(1024 * 1024, 0.5f), gb(1024 * 1024, 0.25f), gc(1024 * 1024);
  std::vector<double> gemm_s;
  for (int r = 0; r < 3; ++r) gemm_s.push_back(SgemmSeconds(1024, ga, gb, gc));
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  for (int r = 0; r < 3; ++r) gemm_s.push_back(SgemmSeconds(1024, ga, gb, gc));
  std::sort(gemm_s.begin(), gemm_s.end());
  const double gemm_rate = 2.0 * 1024.0 * 1024.0 * 1024.0 / (0.5 * (gemm_s[2] + gemm_s[3]));
  double flops = 4.0 * double(kBatch * kHeads) * double(s) * double(s) * double(d) * (causal ? 0.5 : 1.0);
  if (backward) flops *= 2.5;
  const double total = flops * double(state.iterations());
  state.counters["GFLOPS"] = benchmark::Counter(total * 1e-9, benchmark::Counter::kIsRate);
  state.counters["pct_of_gemm"] = benchmark::Counter(total / gemm_rate * 100.0, benchmark::Counter::kIsRate);
  state.counters["gemm_GFLOPS"] = gemm_rate * 1e-9;
}

}  // namespace

// --attn_rss=S: instead of benchmarking, one fp32 forward at b = 1, h = 16, d =
// 64, sq = sk = S (bshd, default.portable) and the process's peak RSS (MiB)
// before and after it: the op's extra memory is the difference.
int RssMode(int64_t s) {
  const int64_t n = s * kHeads * 64;
  int64_t shape[4] = {1, s, kHeads, 64}, sshape[3] = {1, kHeads, s};
  Buffer q(size_t(n) * 4), k(size_t(n) * 4), v(size_t(n) * 4), o(size_t(n) * 4), stats(size_t(kHeads * s) * 4);
  Fill(q, tefl::DType::kF32, n, 1);
  Fill(k, tefl::DType::kF32, n, 2);
  Fill(v, tefl::DType::kF32, n, 3);
  DLTensor tq = View(q, tefl::DType::kF32, shape, 4), tk = View(k, tefl::DType::kF32, shape, 4),
           tv = View(v, tefl::DType::kF32, shape, 4), to = View(o, tefl::DType::kF32, shape, 4),
           ts = View(stats, tefl::DType::kF32, sshape, 3);
  tefl_attention_attrs a{};
  a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
  a.qkv_format = TEFL_QKV_BSHD;
  a.window_left = a.window_right = -1;
  auto pinned = tefl::bench::PinnedPolicy("fused_attn_fwd", "default.portable");
  tefl::PolicyContext ctx(*pinned);
  tefl::AttentionInputs in{&tq, &tk, &tv, nullptr, nullptr, nullptr};
  tefl::FlashAttentionOutputs fo;
  fo.o = &to;
  fo.stats = &ts;
  struct rusage ru {};
  getrusage(RUSAGE_SELF, &ru);
  const double before = double(ru.ru_maxrss) / 1024.0;
  const auto t0 = std::chrono::steady_clock::now();
  const tefl::Status st = tefl::FlashAttention(in, a, &fo);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  getrusage(RUSAGE_SELF, &ru);
  std::printf(
      "{\"seq\": %lld, \"impl\": \"default.portable\", \"ok\": %s, \"seconds\": %.3f, "
      "\"rss_before_mib\": %.1f, \"rss_peak_mib\": %.1f}\n",
      static_cast<long long>(s), st.ok() ? "true" : "false", secs, before, double(ru.ru_maxrss) / 1024.0);
  return st.ok() ? 0 : 1;
}

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--attn_rss=", 11) == 0) return RssMode(std::atoll(argv[i] + 11));
  benchmark::RegisterBenchmark("BM_Sgemm", BM_Sgemm)->Arg(1024)->Arg(2048)->UseRealTime()->MinTime(0.5);
  for (bool backward : {false, true}) {
    for (auto [dt, dname] : {std::pair{tefl::DType::kF32, "fp32"}, std::pair{tefl::DType::kBF16, "bf16"}}) {
      for (int64_t s : {512, 2048, 8192}) {
        for (int64_t d : {64, 128}) {
          if (s == 8192 && d == 128) continue;  // ~1 min per call pair here: d = 64 shows the scaling
          for (bool causal : {false, true}) {
            const char* op = backward ? "fused_attn_bwd" : "fused_attn_fwd";
            for (const tefl::OpImpl& impl : tefl::GetDefaultRegistry().GetImplementations(op)) {
              if (!(impl.device_mask & TEFL_DEVICE_BIT(kDLCPU)) || impl.impl_id == "reference.cpp") continue;
              const std::string name = std::string(backward ? "BM_AttnBwd/" : "BM_AttnFwd/") + dname + "/s" +
                                       std::to_string(s) + "/d" + std::to_string(d) + "/" +
                                       (causal ? "causal" : "full") + "/" + impl.impl_id;
              benchmark::RegisterBenchmark(name.c_str(), BM_Attn, backward, dt, s, d, causal, impl.impl_id)
                  ->UseRealTime()
                  ->Unit(benchmark::kMillisecond)
                  ->MinTime(0.5);
            }
          }
        }
      }
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
