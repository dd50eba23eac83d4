// Activation kernels at a realistic size, [8192, 4096] (gated inputs [8192,
// 8192]), next to this machine's copy bandwidth measured in the same run with
// the same threads:
//   BM_Copy/<dtype>_bytes     a parallel memcpy of a [8192, 4096] tensor's bytes
//   BM_Act/<op>/<dtype>/<impl>  the op through OpManager on warm, preallocated
//                              outputs, pinned to one implementation (strict impl:ID)
// Counters: bytes_per_second = (bytes read + bytes written) / time;
// pct_of_copy = that as a percentage of BM_Copy's in this run (copy first).
// Reproduce: build/release/bench/bench_activation --benchmark_repetitions=3
//            --benchmark_report_aggregates_only=true
#include <string>
#include <vector>

#include "bench_support.h"

namespace {

using tefl::DType;
using tefl::bench::Buffer;
using tefl::bench::View;
constexpr int64_t kRows = 8192, kHidden = 4096;

enum class Kind { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };

struct Case {
  const char* op;
  Kind kind;
};
const Case kCases[] = {
    {"gelu", Kind::kFwd},       {"silu", Kind::kFwd},  {"relu", Kind::kFwd},         {"swiglu", Kind::kGatedFwd},
    {"geglu", Kind::kGatedFwd}, {"dgelu", Kind::kBwd}, {"dswiglu", Kind::kGatedBwd}, {"dbias_dgelu", Kind::kDbias},
};

void BM_Act(benchmark::State& state, Case c, DType dt, const std::string& impl) {
  const size_t elem = tefl::bench::ElemBytes(dt);
  const bool gated = c.kind == Kind::kGatedFwd || c.kind == Kind::kGatedBwd;
  const int64_t xw = gated ? 2 * kHidden : kHidden;
  int64_t xs[2] = {kRows, xw}, hs[2] = {kRows, kHidden}, bs[1] = {kHidden};
  const size_t xn = size_t(kRows * xw), hn = size_t(kRows * kHidden);
  Buffer x(xn * elem), g(hn * elem),
      y((c.kind == Kind::kGatedBwd   ? xn
         : c.kind == Kind::kGatedFwd ? hn
                                     : xn) *
        elem),
      db(size_t(kHidden) * 4);
  // Values in [-2, 1), the conformance range.
  for (size_t i = 0; i < xn; ++i) tefl::StoreFromFloat(x.data.get(), int64_t(i), dt, float(i % 97) * 0.03f - 2.0f);
  for (size_t i = 0; i < hn; ++i) tefl::StoreFromFloat(g.data.get(), int64_t(i), dt, float(i % 89) * 0.02f - 1.0f);
  DLTensor tx = View(x, dt, xs, 2), tg = View(g, dt, gated ? hs : xs, 2);
  DLTensor ty = View(y, dt, c.kind == Kind::kGatedFwd ? hs : xs, 2), tdb = View(db, DType::kF32, bs, 1);
  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out = {&ty};
  if (c.kind == Kind::kFwd || c.kind == Kind::kGatedFwd) {
    in = {&tx};
  } else {
    in = {&tg, &tx};
  }
  if (c.kind == Kind::kDbias) out.push_back(&tdb);
  const auto pinned = tefl::bench::PinnedPolicy(c.op, impl);
  if (!pinned) {
    state.SkipWithError("policy");
    return;
  }
  tefl::PolicyContext ctx(*pinned);
  tefl::OpManager& mgr = tefl::GetDefaultManager();
  const int32_t id = tefl_op_id(c.op);
  auto run = [&] { return mgr.Call(id, in, out, nullptr); };
  if (tefl::Status s = run(); !s.ok()) {
    state.SkipWithError(s.ToString().c_str());
    return;
  }
  for (auto _ : state) {
    benchmark::DoNotOptimize(run());
    benchmark::ClobberMemory();
  }
  double bytes = 0;
  for (const DLTensor* t : in) bytes += double(tefl::NumElements(t)) * double(elem);
  bytes += double(tefl::NumElements(&ty)) * double(elem);
  if (c.kind == Kind::kDbias) bytes += double(kHidden) * 4;
  state.SetBytesProcessed(int64_t(double(state.iterations()) * bytes));
}

}  // namespace

int main(int argc, char** argv) {
  tefl::GetDefaultManager().EnsureInitialized();
  // Per dtype: the copy of a [8192, 4096] tensor's bytes first, then every op
  // x impl against it.
  for (auto [dt, dname] : {std::pair{DType::kF32, "fp32"}, std::pair{DType::kBF16, "bf16"}}) {
    tefl::bench::RegisterCopy(std::string(dname) + "_bytes", size_t(kRows * kHidden) * tefl::bench::ElemBytes(dt));
    for (const Case& c : kCases) {
      // Every CPU implementation registered (plugins from TE_FL_PLUGIN_MODULES
      // included), so a vendor's kernel is measured next to the built-ins.
      for (const std::string& impl : tefl::bench::CpuImpls(c.op)) {
        const std::string name = std::string("BM_Act/") + c.op + "/" + dname + "/" + impl;
        benchmark::RegisterBenchmark(name.c_str(), BM_Act, c, dt, impl)
            ->UseRealTime()
            ->MinTime(impl == "reference.cpp" ? 0.1 : 1.0);
      }
    }
  }
  return tefl::bench::RunBenchmarks(argc, argv);
}
