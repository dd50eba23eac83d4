// RoPE kernels at a realistic size, 8192 tokens x 32 heads x 128 (d2 = 128),
// next to this machine's copy bandwidth measured in the same run:
//   BM_Copy/<dtype>_bytes              a parallel memcpy of the input's bytes
//   BM_Rope/<op>/<format>/<dtype>/<impl>  the op through OpManager on warm,
//                                      preallocated outputs, pinned to one
//                                      implementation (strict impl:ID)
// Formats (same tokens): sbhd [4096, 2, 32, 128], bshd [2, 4096, 32, 128],
// thd [8192, 32, 128] with cu_seqlens {0, 3000, 8192}; freqs [8192, 1, 1,
// 128] (TE's cat(freqs, freqs) angles). fused_qkv_rope_*: sbhd [4096, 2, 8,
// (4 + 1 + 1) * 128] (8 groups of 4 q heads, 1 k head, 1 v head; GQA).
// Counters: GB/s = (bytes read + bytes written) / time; pct_of_copy = GB/s as
// a percentage of the BM_Copy line before it.
#include <cmath>
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

using tefl::DType;
using tefl::bench::Buffer;
using tefl::bench::ElemBytes;
using tefl::bench::View;

constexpr int64_t kS = 4096, kB = 2, kH = 32, kD = 128, kD2 = 128;
constexpr int64_t kTokens = kS * kB;
constexpr int64_t kGroups = 8, kQHeads = 4;  // qkv: 8 groups x (4 q + 1 k + 1 v) heads = 48 heads

void FillFreqs(Buffer& f, int64_t rows, int64_t d2) {
  auto* p = reinterpret_cast<float*>(f.data.get());
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < d2; ++i)
      p[r * d2 + i] = float(r) * float(1.0 / std::pow(10000.0, double(2 * (i % (d2 / 2))) / double(d2)));
}
void FillInput(Buffer& x, DType dt, int64_t n) {
  for (int64_t i = 0; i < n; ++i) tefl::StoreFromFloat(x.data.get(), i, dt, float(i % 97) * 0.01f - 0.4f);
}

// fused_rope_forward / backward; format 0 sbhd, 1 bshd, 2 thd.
void BM_Rope(benchmark::State& state, const std::string& op, int format, DType dt, const std::string& impl) {
  const size_t elem = ElemBytes(dt);
  const int64_t n = kTokens * kH * kD;
  Buffer x(size_t(n) * elem), y(size_t(n) * elem), freqs(size_t(kTokens * kD2) * 4), cu(3 * 4);
  FillInput(x, dt, n);
  FillFreqs(freqs, kTokens, kD2);
  int64_t xs4[4] = {kS, kB, kH, kD}, bs4[4] = {kB, kS, kH, kD}, ts3[3] = {kTokens, kH, kD};
  int64_t fs[4] = {kTokens, 1, 1, kD2}, cs[1] = {3};
  auto* cup = reinterpret_cast<int32_t*>(cu.data.get());
  cup[0] = 0;
  cup[1] = 3000;
  cup[2] = int32_t(kTokens);
  int64_t* shape = format == 0 ? xs4 : format == 1 ? bs4 : ts3;
  const int ndim = format == 2 ? 3 : 4;
  DLTensor tx = View(x, dt, shape, ndim), ty = View(y, dt, shape, ndim), tf = View(freqs, DType::kF32, fs, 4),
           tcu = View(cu, DType::kI32, cs, 1);
  tefl_rope_attrs attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, format, 0, 1, 0};
  const DLTensor* in[4] = {&tx, &tf, nullptr, format == 2 ? &tcu : nullptr};
  DLTensor* out[1] = {&ty};
  auto pinned = tefl::bench::PinnedPolicy(op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& m = tefl::GetDefaultManager();
  auto run = [&] { return m.Call(op, in, out, &attrs); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(2 * x.bytes)));
}

// fused_qkv_rope_forward / backward, sbhd.
void BM_QkvRope(benchmark::State& state, const std::string& op, DType dt, const std::string& impl) {
  const size_t elem = ElemBytes(dt);
  const int64_t per_group = (kQHeads + 2) * kD;
  const int64_t n = kTokens * kGroups * per_group;
  Buffer qkv(size_t(n) * elem), q(size_t(kTokens * kGroups * kQHeads * kD) * elem),
      k(size_t(kTokens * kGroups * kD) * elem), v(size_t(kTokens * kGroups * kD) * elem), qf(size_t(kS * kD2) * 4),
      kf(size_t(kS * kD2) * 4);
  FillInput(qkv, dt, n);
  FillInput(q, dt, kTokens * kGroups * kQHeads * kD);
  FillInput(k, dt, kTokens * kGroups * kD);
  FillInput(v, dt, kTokens * kGroups * kD);
  FillFreqs(qf, kS, kD2);
  FillFreqs(kf, kS, kD2);
  int64_t sqkv[4] = {kS, kB, kGroups, per_group}, sq[4] = {kS, kB, kGroups * kQHeads, kD},
          sk[4] = {kS, kB, kGroups, kD}, fs[4] = {kS, 1, 1, kD2};
  DLTensor tqkv = View(qkv, dt, sqkv, 4), tq = View(q, dt, sq, 4), tk = View(k, dt, sk, 4), tv = View(v, dt, sk, 4),
           tqf = View(qf, DType::kF32, fs, 4), tkf = View(kf, DType::kF32, fs, 4);
  tefl_qkv_rope_attrs attrs{TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0,          1, 0,
                            int32_t(kQHeads * kD),           int32_t(kD),   int32_t(kD)};
  const bool bwd = op == "fused_qkv_rope_backward";
  std::vector<const DLTensor*> in = bwd ? std::vector<const DLTensor*>{&tq, &tk, &tv, &tqf, &tkf, nullptr}
                                        : std::vector<const DLTensor*>{&tqkv, &tqf, &tkf, nullptr};
  std::vector<DLTensor*> out = bwd ? std::vector<DLTensor*>{&tqkv} : std::vector<DLTensor*>{&tq, &tk, &tv};
  auto pinned = tefl::bench::PinnedPolicy(op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& m = tefl::GetDefaultManager();
  auto run = [&] { return m.Call(op, in, out, &attrs); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(2 * qkv.bytes)));
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  const char* const formats[] = {"sbhd", "bshd", "thd"};
  for (auto [dt, dname] : {std::pair{DType::kF32, "fp32"}, std::pair{DType::kBF16, "bf16"}}) {
    // Per dtype: the copy of the input's bytes first, then every op x format x impl.
    tefl::bench::RegisterCopy(std::string(dname) + "_bytes", size_t(kTokens * kH * kD) * ElemBytes(dt));
    for (const char* op : {"fused_rope_forward", "fused_rope_backward"}) {
      for (int format = 0; format < 3; ++format) {
        for (const std::string& impl : tefl::bench::CpuImpls(op)) {
          const std::string name = std::string("BM_Rope/") + op + "/" + formats[format] + "/" + dname + "/" + impl;
          benchmark::RegisterBenchmark(name.c_str(), BM_Rope, std::string(op), format, dt, impl)
              ->UseRealTime()
              ->MinTime(impl == "reference.cpp" ? 0.1 : 1.0);
        }
      }
    }
    // qkv moves 1.5x the bytes: its own copy baseline.
    tefl::bench::RegisterCopy(std::string(dname) + "_qkv_bytes",
                              size_t(kTokens * kGroups * (kQHeads + 2) * kD) * ElemBytes(dt));
    for (const char* op : {"fused_qkv_rope_forward", "fused_qkv_rope_backward"}) {
      for (const std::string& impl : tefl::bench::CpuImpls(op)) {
        const std::string name = std::string("BM_Rope/") + op + "/sbhd/" + dname + "/" + impl;
        benchmark::RegisterBenchmark(name.c_str(), BM_QkvRope, std::string(op), dt, impl)
            ->UseRealTime()
            ->MinTime(impl == "reference.cpp" ? 0.1 : 1.0);
      }
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
