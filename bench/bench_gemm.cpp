// GEMM benchmarks: generic_gemm at 512^3, 2048^3 and 4096 x 4096 x 1024
// (M x N x K), fp32 and bf16 (A, B and D of one dtype, no transposes, no
// epilogue), and one fprop-shaped call with bias + GELU (transb, as TE's
// "TN"), through OpManager, pinned to one implementation (strict impl:ID).
// te_general_grouped_gemm: 8 experts of 512 rows, K = 1024, N = 1024.
//   BM_Copy            a parallel memcpy of D's bytes (baseline of the run)
//   BM_Gemm/...        GFLOP/s = 2 M N K / time; bytes_per_second counts A, B
//                      and D once (pct_of_copy is given for the table's sake:
//                      GEMM is compute bound, GFLOP/s is the figure)
// bench/torch_gemm.py times torch.matmul on the same sizes (2 threads).
#include <string>
#include <vector>

#include "bench_support.h"
#include "tefl/ops.h"

namespace {

using tefl::DType;
using tefl::bench::Buffer;
using tefl::bench::View;

struct Size {
  int64_t m, n, k;
};

void Fill(Buffer& b, DType dt, int64_t n, int64_t salt) {
  for (int64_t i = 0; i < n; ++i) tefl::StoreFromFloat(b.data.get(), i, dt, float((i * 7 + salt) % 101) * 0.02f - 1.0f);
}

void BM_Gemm(benchmark::State& state, Size s, DType dt, const std::string& impl, bool fprop_epilogue) {
  const size_t e = tefl::bench::ElemBytes(dt);
  Buffer a(size_t(s.m * s.k) * e), b(size_t(s.k * s.n) * e), d(size_t(s.m * s.n) * e), bias(size_t(s.n) * e),
      pre(size_t(s.m * s.n) * e);
  Fill(a, dt, s.m * s.k, 1);
  Fill(b, dt, s.k * s.n, 2);
  Fill(bias, dt, s.n, 3);
  int64_t as[2] = {s.m, s.k}, bs[2] = {s.k, s.n}, bts[2] = {s.n, s.k}, ds[2] = {s.m, s.n}, ns[1] = {s.n};
  DLTensor ta = View(a, dt, as, 2), tb = View(b, dt, fprop_epilogue ? bts : bs, 2), td = View(d, dt, ds, 2),
           tbias = View(bias, dt, ns, 1), tpre = View(pre, dt, ds, 2);
  tefl_gemm_attrs attrs{
      TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, fprop_epilogue ? 1 : 0, 1.0f, 1.0f, 0, fprop_epilogue ? 1 : 0, 0, 0};
  const DLTensor* in[7] = {&ta, &tb, nullptr, fprop_epilogue ? &tbias : nullptr, nullptr, nullptr, nullptr};
  DLTensor* out[4] = {&td, fprop_epilogue ? &tpre : nullptr, nullptr, nullptr};
  auto pinned = tefl::bench::PinnedPolicy("generic_gemm", impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& mgr = tefl::GetDefaultManager();
  auto run = [&] { return mgr.Call(TEFL_OP_GENERIC_GEMM, in, out, &attrs); };
  if (tefl::Status st = run(); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(a.bytes + b.bytes + d.bytes));
  state.counters["GFLOP/s"] =
      benchmark::Counter(2e-9 * double(s.m) * double(s.n) * double(s.k), benchmark::Counter::kIsIterationInvariantRate);
}

void BM_Grouped(benchmark::State& state, DType dt, const std::string& impl) {
  const int64_t groups = 8, rows = 512, k = 1024, n = 1024;
  const size_t e = tefl::bench::ElemBytes(dt);
  Buffer a(size_t(groups * rows * k) * e), b(size_t(groups * k * n) * e), d(size_t(groups * rows * n) * e),
      splits(size_t(groups) * 8);
  Fill(a, dt, groups * rows * k, 1);
  Fill(b, dt, groups * k * n, 2);
  for (int64_t g = 0; g < groups; ++g) reinterpret_cast<int64_t*>(splits.data.get())[g] = rows;
  int64_t as[2] = {groups * rows, k}, bs[3] = {groups, n, k}, ds[2] = {groups * rows, n}, ss[1] = {groups};
  DLTensor ta = View(a, dt, as, 2), tb = View(b, dt, bs, 3), td = View(d, dt, ds, 2),
           tsp = View(splits, DType::kI64, ss, 1);
  tefl_gemm_attrs attrs{TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 1, 1.0f, 1.0f, 0, 0, 0, 0};
  // in: A B m_splits bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
  const DLTensor* in[7] = {&ta, &tb, &tsp, nullptr, nullptr, nullptr, nullptr};
  DLTensor* out[4] = {&td, nullptr, nullptr, nullptr};
  auto pinned = tefl::bench::PinnedPolicy("te_general_grouped_gemm", impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& mgr = tefl::GetDefaultManager();
  auto run = [&] { return mgr.Call(TEFL_OP_TE_GENERAL_GROUPED_GEMM, in, out, &attrs); };
  if (tefl::Status st = run(); !st.ok()) {
    state.SkipWithError(st.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(a.bytes + b.bytes + d.bytes));
  state.counters["GFLOP/s"] = benchmark::Counter(2e-9 * double(groups * rows) * double(n) * double(k),
                                                 benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  const Size sizes[] = {{512, 512, 512}, {2048, 2048, 2048}, {4096, 4096, 1024}};
  for (auto [dt, dname] : {std::pair{DType::kF32, "fp32"}, std::pair{DType::kBF16, "bf16"}}) {
    tefl::bench::RegisterCopy(std::string(dname) + "_D_4096x4096", size_t(4096 * 4096) * tefl::bench::ElemBytes(dt));
    for (const std::string& impl : tefl::bench::CpuImpls("generic_gemm")) {
      for (const Size& s : sizes) {
        // The reference (a naive triple loop) only at the smallest size.
        if (impl == "reference.cpp" && s.m > 512) continue;
        const std::string name = "BM_Gemm/" + std::string(dname) + "/" + std::to_string(s.m) + "x" +
                                 std::to_string(s.n) + "x" + std::to_string(s.k) + "/" + impl;
        benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, s, dt, impl, false)->UseRealTime()->MinTime(1.0);
      }
      if (impl == "reference.cpp") continue;
      const std::string name = "BM_Gemm/" + std::string(dname) + "/fprop_bias_gelu_2048x2048x2048/" + impl;
      benchmark::RegisterBenchmark(name.c_str(), BM_Gemm, Size{2048, 2048, 2048}, dt, impl, true)
          ->UseRealTime()
          ->MinTime(1.0);
    }
    for (const std::string& impl : tefl::bench::CpuImpls("te_general_grouped_gemm")) {
      if (impl == "reference.cpp") continue;
      const std::string name = "BM_Grouped/" + std::string(dname) + "/8x512x1024x1024/" + impl;
      benchmark::RegisterBenchmark(name.c_str(), BM_Grouped, dt, impl)->UseRealTime()->MinTime(1.0);
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
