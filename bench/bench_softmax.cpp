// Softmax kernels at a realistic attention size next to this machine's copy
// bandwidth measured in the same run with the same threads:
//   BM_Copy/<dtype>_bytes        a parallel memcpy of the input's bytes (read + write)
//   BM_Softmax/<op>/<dtype>/<impl>  the op through OpManager on warm,
//                      preallocated outputs, pinned to one implementation
// Sizes: [b, h, sq, sk] = [4, 16, 2048, 2048] (TEFL_BENCH_SOFTMAX_B overrides
// b; fp32 is 1 GiB per tensor), upper-triangular [b * 16, 2048, 2048], mask
// [b, 1, 2048, 2048]. GB/s = (bytes read + bytes written) / time, counting
// the whole output (the causal ops write zeros above the diagonal) and, for
// the masked op, the mask; pct_of_copy = GB/s as a percentage of BM_Copy's.
// Each op runs for at least 1.5 s (MinTime): a handful of iterations at fp32.
// reference.cpp is measured only with TEFL_BENCH_REFERENCE=1 (seconds per call).
#include <cstdlib>
#include <string>

#include "bench_support.h"

namespace {

using tefl::bench::Buffer;
using tefl::bench::View;

int64_t Batch() {
  const char* b = std::getenv("TEFL_BENCH_SOFTMAX_B");
  return b && std::atoi(b) > 0 ? std::atoi(b) : 4;
}
constexpr int64_t kHeads = 16, kSeq = 2048;

void BM_Softmax(benchmark::State& state, const std::string& op, tefl::DType dt, const std::string& impl) {
  const int64_t b = Batch();
  const size_t elem = tefl::bench::ElemBytes(dt);
  const bool triang = op.find("upper_triang") != std::string::npos;
  const bool masked =
      op.find("masked_softmax_forward") != std::string::npos && !triang && op.find("aligned") == std::string::npos;
  const bool backward = op.find("backward") != std::string::npos;
  int64_t shape4[4] = {b, kHeads, kSeq, kSeq}, shape3[3] = {b * kHeads, kSeq, kSeq}, mshape[4] = {b, 1, kSeq, kSeq};
  int64_t* shape = triang ? shape3 : shape4;
  const int nd = triang ? 3 : 4;
  const size_t n = size_t(b * kHeads * kSeq * kSeq);
  Buffer x(n * elem), y(n * elem), dy(backward ? n * elem : 0), mask(masked ? size_t(b * kSeq * kSeq) : 0);
  for (size_t i = 0; i < n; ++i) tefl::StoreFromFloat(x.data.get(), int64_t(i), dt, float(i % 97) * 0.01f - 0.4f);
  if (backward) {
    for (size_t i = 0; i < n; ++i) tefl::StoreFromFloat(dy.data.get(), int64_t(i), dt, float(i % 89) * 0.01f - 0.3f);
    // softmax_results: any values in [0, 1) do for timing.
    for (size_t i = 0; i < n; ++i) tefl::StoreFromFloat(x.data.get(), int64_t(i), dt, float(i % 61) * 0.0001f);
  }
  if (masked)
    for (size_t i = 0; i < mask.bytes; ++i) mask.data.get()[i] = char((i * 7) % 5 == 0);
  DLTensor tx = View(x, dt, shape, nd), ty = View(y, dt, shape, nd), tdy = View(dy, dt, shape, nd),
           tm = View(mask, tefl::DType::kU8, mshape, 4);
  std::optional<tefl::SelectionPolicy> pinned = tefl::bench::PinnedPolicy(op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl_softmax_attrs attrs{TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, 0.125f};
  std::vector<const DLTensor*> in;
  if (backward) {
    in = {&tdy, &tx};
  } else if (masked) {
    in = {&tx, &tm};
  } else {
    in = {&tx};
  }
  std::vector<DLTensor*> out = {&ty};
  auto run = [&] { return tefl::GetDefaultManager().Call(op, in, out, &attrs); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  const double bytes = double(n * elem * (backward ? 3 : 2) + mask.bytes);
  state.SetBytesProcessed(int64_t(double(state.iterations()) * bytes));
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  const int64_t b = Batch();
  for (auto [dt, dname] : {std::pair{tefl::DType::kBF16, "bf16"}, std::pair{tefl::DType::kF32, "fp32"}}) {
    tefl::bench::RegisterCopy(std::string(dname) + "_bytes",
                              size_t(b * kHeads * kSeq * kSeq) * tefl::bench::ElemBytes(dt));
    for (const char* op :
         {"scaled_softmax_forward", "scaled_masked_softmax_forward", "scaled_upper_triang_masked_softmax_forward",
          "scaled_aligned_causal_masked_softmax_forward", "scaled_softmax_backward"}) {
      for (const std::string& impl : tefl::bench::CpuImpls(op)) {
        // reference.cpp takes seconds per call at this size: opt in.
        if (impl == "reference.cpp" && !std::getenv("TEFL_BENCH_REFERENCE")) continue;
        const std::string name = std::string("BM_Softmax/") + op + "/" + dname + "/" + impl;
        benchmark::RegisterBenchmark(name.c_str(), BM_Softmax, std::string(op), dt, impl)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(1.5);
      }
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
