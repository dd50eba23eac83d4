// Dropout kernels at [8192, 4096] next to this machine's copy bandwidth
// measured in the same run with the same threads:
//   BM_Copy/<dtype>_bytes          a parallel memcpy of the input's bytes (read + write)
//   BM_Dropout/<op>/<dtype>/<impl>  the op through OpManager on warm,
//                        preallocated outputs, pinned to one implementation
// GB/s = (bytes read + bytes written) / time: dropout_fwd reads x and writes
// y and the uint8 mask; dropout_bwd reads dy and the mask and writes dx.
// pct_of_copy = GB/s as a percentage of BM_Copy's GB/s in this run.
#include <string>

#include "bench_support.h"

namespace {

using tefl::bench::Buffer;
using tefl::bench::View;
constexpr int64_t kRows = 8192, kCols = 4096;

void BM_Dropout(benchmark::State& state, const std::string& op, tefl::DType dt, const std::string& impl) {
  const size_t n = size_t(kRows * kCols);
  const size_t elem = tefl::bench::ElemBytes(dt);
  int64_t shape[2] = {kRows, kCols};
  Buffer x(n * elem), y(n * elem), mask(n);
  for (size_t i = 0; i < n; ++i) tefl::StoreFromFloat(x.data.get(), int64_t(i), dt, float(i % 97) * 0.01f - 0.4f);
  for (size_t i = 0; i < n; ++i) mask.data.get()[i] = char(i % 10 != 0);
  DLTensor tx = View(x, dt, shape, 2), ty = View(y, dt, shape, 2), tm = View(mask, tefl::DType::kU8, shape, 2);
  std::optional<tefl::SelectionPolicy> pinned = tefl::bench::PinnedPolicy(op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl_dropout_attrs attrs{TEFL_DROPOUT_ATTRS_STRUCT_SIZE, 1234, 0, 0.1f};
  const bool fwd = op == "dropout_fwd";
  std::vector<const DLTensor*> in = fwd ? std::vector<const DLTensor*>{&tx} : std::vector<const DLTensor*>{&tx, &tm};
  std::vector<DLTensor*> out = fwd ? std::vector<DLTensor*>{&ty, &tm} : std::vector<DLTensor*>{&ty};
  auto run = [&] { return tefl::GetDefaultManager().Call(op, in, out, &attrs); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(double(state.iterations()) * double(2 * n * elem + n)));
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  for (auto [dt, dname] : {std::pair{tefl::DType::kBF16, "bf16"}, std::pair{tefl::DType::kF32, "fp32"}}) {
    tefl::bench::RegisterCopy(std::string(dname) + "_bytes", size_t(kRows * kCols) * tefl::bench::ElemBytes(dt));
    for (const char* op : {"dropout_fwd", "dropout_bwd"}) {
      for (const std::string& impl : tefl::bench::CpuImpls(op)) {
        const std::string name = std::string("BM_Dropout/") + op + "/" + dname + "/" + impl;
        benchmark::RegisterBenchmark(name.c_str(), BM_Dropout, std::string(op), dt, impl)
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond)
            ->MinTime(1.0);
      }
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
