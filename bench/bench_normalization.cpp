// Norm kernels at a realistic size, [8192, 4096], next to this machine's copy
// bandwidth measured in the same run with the same threads:
//   BM_Copy            a parallel memcpy of x's bytes into z (read + write)
//   BM_Norm/op/dtype/impl   the op through OpManager on warm, preallocated
//                      outputs, pinned to one implementation (strict impl:ID)
// Counters: GB/s = (bytes read + bytes written) / time; pct_of_copy = GB/s as
// a percentage of BM_Copy's GB/s in this run (copy is measured first).
#include <benchmark/benchmark.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/thread_pool.h"
#include "tefl/tefl.hpp"

namespace {

constexpr int64_t kRows = 8192, kHidden = 4096;
double g_copy_gbps = 0;

// A 64-byte aligned, zero-filled, page-touched buffer.
struct Buffer {
  explicit Buffer(size_t n) : bytes(n), data(static_cast<char*>(std::aligned_alloc(64, (n + 63) / 64 * 64))) {
    std::memset(data.get(), 0, n);
  }
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  size_t bytes;
  std::unique_ptr<char, Free> data;
};

DLTensor View(Buffer& b, tefl::DType dt, int64_t* shape, int ndim) {
  DLTensor t{};
  t.data = b.data.get();
  t.device = {kDLCPU, 0};
  t.ndim = ndim;
  t.dtype = tefl::DLTypeOf(dt);
  t.shape = shape;
  return t;
}

void BM_Copy(benchmark::State& state) {
  const size_t bytes = size_t(kRows * kHidden) * size_t(state.range(0));
  Buffer src(bytes), dst(bytes);
  for (auto _ : state) {
    tefl::ParallelFor(int64_t(bytes / 4096), 1, [&](int64_t b, int64_t e) {
      std::memcpy(dst.data.get() + b * 4096, src.data.get() + b * 4096, size_t(e - b) * 4096);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(int64_t(state.iterations()) * int64_t(2 * bytes));
}

// Runs `op` pinned to `impl` on [kRows, kHidden] of `dt` (gamma/beta in dt too).
void BM_Norm(benchmark::State& state, const char* op, tefl::DType dt, const std::string& impl) {
  const size_t elem = size_t(tefl::DLTypeOf(dt).bits / 8);
  const bool layernorm = std::string(op) == "layernorm_fwd";
  int64_t xs[2] = {kRows, kHidden}, hs[1] = {kHidden}, ns[1] = {kRows};
  Buffer x(size_t(kRows * kHidden) * elem), z(size_t(kRows * kHidden) * elem), gamma(size_t(kHidden) * elem),
      beta(size_t(kHidden) * elem), mu(size_t(kRows) * 4), rsigma(size_t(kRows) * 4);
  for (int64_t i = 0; i < kRows * kHidden; ++i) tefl::StoreFromFloat(x.data.get(), i, dt, float(i % 97) * 0.01f - 0.4f);
  for (int64_t i = 0; i < kHidden; ++i) tefl::StoreFromFloat(gamma.data.get(), i, dt, 1.0f);
  DLTensor tx = View(x, dt, xs, 2), tz = View(z, dt, xs, 2), tg = View(gamma, dt, hs, 1), tb = View(beta, dt, hs, 1),
           tmu = View(mu, tefl::DType::kF32, ns, 1), trs = View(rsigma, tefl::DType::kF32, ns, 1);
  tefl::SelectionPolicy pinned;
  if (!tefl::SelectionPolicy::Make("flagos", true, {{op, {"impl:" + impl}}}, {}, std::nullopt, &pinned).ok()) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(pinned);
  auto run = [&] {
    return layernorm ? tefl::layernorm_fwd(tx, tg, tb, 1e-5f, tz, tmu, trs) : tefl::rmsnorm_fwd(tx, tg, 1e-5f, tz, trs);
  };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  const double bytes = double(2 * x.bytes + gamma.bytes + (layernorm ? beta.bytes + mu.bytes : 0) + rsigma.bytes);
  state.SetBytesProcessed(int64_t(double(state.iterations()) * bytes));
}

}  // namespace

// Copy runs first (registration order); its rate is read back by a reporter
// that adds pct_of_copy to every later line.
class CopyRelativeReporter : public benchmark::ConsoleReporter {
 public:
  CopyRelativeReporter() : ConsoleReporter(isatty(1) ? OO_Defaults : OO_Tabular) {}
  void ReportRuns(const std::vector<Run>& runs) override {
    std::vector<Run> out = runs;
    for (Run& r : out) {
      auto it = r.counters.find("bytes_per_second");
      const double gbps = it != r.counters.end() ? double(it->second) / 1e9 : 0;
      if (r.run_name.function_name.rfind("BM_Copy", 0) == 0) g_copy_gbps = gbps;
      if (g_copy_gbps > 0 && gbps > 0) r.counters["pct_of_copy"] = benchmark::Counter(100.0 * gbps / g_copy_gbps);
    }
    ConsoleReporter::ReportRuns(out);
  }
};

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  // Per dtype: the copy of x's bytes first, then every op x impl against it.
  for (auto [dt, dname] : {std::pair{tefl::DType::kF32, "fp32"}, std::pair{tefl::DType::kBF16, "bf16"}}) {
    const std::string copy = std::string("BM_Copy/") + dname + "_bytes";
    benchmark::RegisterBenchmark(copy.c_str(), BM_Copy)
        ->Arg(int64_t(tefl::DLTypeOf(dt).bits / 8))
        ->UseRealTime()
        ->MinTime(1.0);
    for (const char* op : {"rmsnorm_fwd", "layernorm_fwd"}) {
      // Every CPU implementation registered (plugins from TE_FL_PLUGIN_MODULES
      // included), so a vendor's kernel is measured next to the built-ins.
      for (const tefl::OpImpl& impl : tefl::GetDefaultRegistry().GetImplementations(op)) {
        if (!(impl.device_mask & TEFL_DEVICE_BIT(kDLCPU))) continue;
        const std::string name = std::string("BM_Norm/") + op + "/" + dname + "/" + impl.impl_id;
        benchmark::RegisterBenchmark(name.c_str(), BM_Norm, op, dt, impl.impl_id)->UseRealTime()->MinTime(1.0);
      }
    }
  }
  benchmark::Initialize(&argc, argv);
  CopyRelativeReporter reporter;
  benchmark::RunSpecifiedBenchmarks(&reporter);
  benchmark::Shutdown();
  return 0;
}
