// Shared pieces of the op-family benchmarks: aligned page-touched buffers,
// DLTensor views, the copy-bandwidth baseline measured in the same run, a
// policy that pins one implementation, and a reporter that adds pct_of_copy.
//
// Convention: register "BM_Copy/<label>" (BM_Copy with Arg = bytes copied)
// before the op benchmarks it is the baseline for; every later line with a
// bytes_per_second counter gets pct_of_copy = its GB/s / that copy's GB/s.
#ifndef TEFL_BENCH_BENCH_SUPPORT_H_
#define TEFL_BENCH_BENCH_SUPPORT_H_

#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "tefl/tefl.hpp"

namespace tefl::bench {

// A 64-byte aligned, zero-filled, page-touched buffer.
struct Buffer {
  explicit Buffer(size_t n) : bytes(n), data(static_cast<char*>(std::aligned_alloc(64, (n + 63) / 64 * 64 + 64))) {
    std::memset(data.get(), 0, n);
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  size_t bytes;
  std::unique_ptr<char, Free> data;
};

inline DLTensor View(Buffer& b, DType dt, int64_t* shape, int ndim) {
  DLTensor t{};
  t.data = b.data.get();
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = DLTypeOf(dt);
  t.shape = shape;
  return t;
}

inline size_t ElemBytes(DType dt) { return size_t(DLTypeOf(dt).bits / 8); }

// A parallel memcpy of state.range(0) bytes (read + write counted).
inline void BM_Copy(benchmark::State& state) {
  const size_t bytes = size_t(state.range(0));
  Buffer src(bytes), dst(bytes);
  const int64_t blocks = int64_t((bytes + 4095) / 4096);
  for (auto _ : state) {
    ParallelFor(blocks, 1, [&](int64_t b, int64_t e) {
      const size_t lo = size_t(b) * 4096, hi = std::min(bytes, size_t(e) * 4096);
      std::memcpy(dst.data.get() + lo, src.data.get() + lo, hi - lo);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * bytes));
}

inline void RegisterCopy(const std::string& label, size_t bytes) {
  benchmark::RegisterBenchmark(("BM_Copy/" + label).c_str(), BM_Copy)->Arg(int64_t(bytes))->UseRealTime()->MinTime(1.0);
}

// A strict policy running exactly `impl_id` for `op`.
inline std::optional<SelectionPolicy> PinnedPolicy(const std::string& op, const std::string& impl_id) {
  SelectionPolicy p;
  if (!SelectionPolicy::Make("flagos", true, {{op, {"impl:" + impl_id}}}, {}, std::nullopt, &p).ok())
    return std::nullopt;
  return p;
}

// The CPU implementations registered for `op` (plugins included).
inline std::vector<std::string> CpuImpls(const std::string& op) {
  std::vector<std::string> ids;
  for (const OpImpl& impl : GetDefaultRegistry().GetImplementations(op))
    if (impl.device_mask & TEFL_DEVICE_BIT(kDLCPU)) ids.push_back(impl.impl_id);
  return ids;
}

// Adds pct_of_copy to every line after a BM_Copy line.
class CopyRelativeReporter : public benchmark::ConsoleReporter {
 public:
  CopyRelativeReporter() : ConsoleReporter(isatty(1) ? OO_Defaults : OO_Tabular) {}
  // With repetitions, each aggregate (mean, median) is compared with the
  // copy's aggregate of the same name; stddev and cv rows get no percentage.
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> out = runs;
    for (Run& r : out) {
      if (r.aggregate_name == "stddev" || r.aggregate_name == "cv") continue;
      auto it = r.counters.find("bytes_per_second");
      const double gbps = it != r.counters.end() ? double(it->second) / 1e9 : 0;
      if (r.run_name.function_name.rfind("BM_Copy", 0) == 0) copy_gbps_[r.aggregate_name] = gbps;
      const double copy = copy_gbps_.count(r.aggregate_name) ? copy_gbps_[r.aggregate_name] : 0;
      if (copy > 0 && gbps > 0) r.counters["pct_of_copy"] = benchmark::Counter(100.0 * gbps / copy);
    }
    ConsoleReporter::ReportRuns(out);
  }

 private:
  std::map<std::string, double> copy_gbps_;  // by aggregate name ("" for a single run)
};

// Initialises the library and Google Benchmark, runs, shuts down.
inline int RunBenchmarks(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  CopyRelativeReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}

}  // namespace tefl::bench

#endif  // TEFL_BENCH_BENCH_SUPPORT_H_
