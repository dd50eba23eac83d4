// Norm kernels at a realistic size, [8192, 4096], next to this machine's copy
// bandwidth measured in the same run with the same threads:
//   BM_Copy            a parallel memcpy of x's bytes into z (read + write)
//   BM_Norm/op/dtype/impl   the op through OpManager on warm, preallocated
//                      outputs, pinned to one implementation (strict impl:ID)
// Counters: GB/s = (bytes read + bytes written) / time; pct_of_copy = GB/s as
// a percentage of BM_Copy's GB/s in this run (copy is measured first).
#include <string>

#include "bench_support.h"

namespace {

using tefl::bench::Buffer;
using tefl::bench::View;
constexpr int64_t kRows = 8192, kHidden = 4096;

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

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  // Per dtype: the copy of x's bytes first, then every op x impl against it.
  for (auto [dt, dname] : {std::pair{tefl::DType::kF32, "fp32"}, std::pair{tefl::DType::kBF16, "bf16"}}) {
    tefl::bench::RegisterCopy(std::string(dname) + "_bytes", size_t(kRows * kHidden) * tefl::bench::ElemBytes(dt));
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
  return tefl::bench::RunBenchmarks(argc, argv);
}
