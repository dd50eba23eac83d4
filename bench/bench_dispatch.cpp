// Dispatch overhead of a typed call through OpManager against calling the
// kernel directly, same tiny tensor, same run. Parts:
//   BM_KernelDirect     the no-op kernel called through its function pointer
//   BM_Validate         full schema validation + signature key of an rmsnorm_fwd call
//   BM_ValidateMemo     the same through the per-thread memo (a hit)
//   BM_ManagerCall      the whole typed call (memo validation + cached
//                       resolution + indirect call) to the same no-op kernel
//   BM_PreparedRun      the same call prepared once, run on the same data
//                       pointers each time (remembered pointers + chain + call)
//   BM_PreparedRunNewPointers  the same, alternating between two sets of
//                       buffers, so every run does the full pointer checks
// Resolution and the rest = ManagerCall - ValidateMemo - KernelDirect. Also
// the real portable kernel on the tiny tensor, direct and through the manager.
#include <benchmark/benchmark.h>

#include <memory>
#include <vector>

#include "core/catalogue.h"
#include "core/validate.h"
#include "tefl/tefl.hpp"
#include "tiny_call.h"

namespace {

tefl_status* NoopKernel(const tefl_call_frame* f, void*) {
  benchmark::DoNotOptimize(f->outputs[0]->data);
  return nullptr;
}

// A registry whose first candidate for rmsnorm_fwd is the no-op kernel.
tefl::OpManager& NoopManager() {
  static tefl::OpRegistry* registry = [] {
    auto* r = new tefl::OpRegistry();
    tefl::OpImpl impl;
    impl.op_name = "rmsnorm_fwd";
    impl.impl_id = "default.noop";
    impl.priority = 1000;
    impl.kernel = NoopKernel;
    (void)r->RegisterImpl(impl);
    return r;
  }();
  static tefl::OpManager* manager = new tefl::OpManager(registry);
  return *manager;
}

void BM_KernelDirect(benchmark::State& state) {
  TinyCall c;
  for (auto _ : state) benchmark::DoNotOptimize(NoopKernel(&c.frame, nullptr));
}
BENCHMARK(BM_KernelDirect);

void BM_Validate(benchmark::State& state) {
  TinyCall c;
  const tefl::OpSchema& op = *tefl::FindOp(TEFL_OP_RMSNORM_FWD);
  const tefl::CallArgs args{c.in, 2, c.out, 2, &c.attrs};
  tefl::SigKey key;
  for (auto _ : state) {
    benchmark::DoNotOptimize(tefl::ValidateCall(op, args, &key));
    benchmark::DoNotOptimize(key);
  }
}
BENCHMARK(BM_Validate);

// Validation through the per-thread memo (what OpManager::Call does): a hit
// after the first call re-runs only the pointer checks.
void BM_ValidateMemo(benchmark::State& state) {
  TinyCall c;
  const tefl::OpSchema& op = *tefl::FindOp(TEFL_OP_RMSNORM_FWD);
  const tefl::CallArgs args{c.in, 2, c.out, 2, &c.attrs};
  auto memo = std::make_unique<tefl::ValidationMemo>();
  tefl::SigKey key;
  for (auto _ : state) {
    benchmark::DoNotOptimize(tefl::ValidateCallMemo(op, args, &key, memo.get()));
    benchmark::DoNotOptimize(key);
  }
}
BENCHMARK(BM_ValidateMemo);

void BM_ManagerCall(benchmark::State& state) {
  TinyCall c;
  tefl::OpManager& m = NoopManager();
  tefl::CallOptions opts;
  opts.manager = &m;
  if (!tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts).ok()) state.SkipWithError("call failed");
  for (auto _ : state) benchmark::DoNotOptimize(tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts));
}
BENCHMARK(BM_ManagerCall);

// The same call prepared once (OpManager::Prepare), run on the same
// pointers: pointer checks, the remembered chain, the indirect call.
void BM_PreparedRun(benchmark::State& state) {
  TinyCall c;
  tefl::PreparedCall call;
  if (!NoopManager().Prepare(TEFL_OP_RMSNORM_FWD, c.in, c.out, &c.attrs, &call).ok())
    state.SkipWithError("prepare failed");
  void* in[] = {c.x.data(), c.g.data()};
  void* out[] = {c.z.data(), c.rs.data()};
  for (auto _ : state) benchmark::DoNotOptimize(call.Run(in, out));
}
BENCHMARK(BM_PreparedRun);

void BM_PreparedRunNewPointers(benchmark::State& state) {
  TinyCall c, d;
  tefl::PreparedCall call;
  if (!NoopManager().Prepare(TEFL_OP_RMSNORM_FWD, c.in, c.out, &c.attrs, &call).ok())
    state.SkipWithError("prepare failed");
  void* in[2][2] = {{c.x.data(), c.g.data()}, {d.x.data(), d.g.data()}};
  void* out[2][2] = {{c.z.data(), c.rs.data()}, {d.z.data(), d.rs.data()}};
  int k = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(call.Run(in[k], out[k]));
    k ^= 1;
  }
}
BENCHMARK(BM_PreparedRunNewPointers);

void BM_PortableDirect(benchmark::State& state) {
  TinyCall c;
  tefl::GetDefaultManager().EnsureInitialized();
  auto impl = tefl::GetDefaultRegistry().GetImplementation("rmsnorm_fwd", "default.portable");
  for (auto _ : state) benchmark::DoNotOptimize(impl->kernel(&c.frame, impl->user_data));
}
BENCHMARK(BM_PortableDirect);

void BM_PortableThroughManager(benchmark::State& state) {
  TinyCall c;
  if (!tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs).ok()) state.SkipWithError("call failed");
  for (auto _ : state) benchmark::DoNotOptimize(tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs));
}
BENCHMARK(BM_PortableThroughManager);

void BM_PortablePreparedRun(benchmark::State& state) {
  TinyCall c;
  tefl::PreparedCall call;
  if (!tefl::GetDefaultManager().Prepare(TEFL_OP_RMSNORM_FWD, c.in, c.out, &c.attrs, &call).ok())
    state.SkipWithError("prepare failed");
  void* in[] = {c.x.data(), c.g.data()};
  void* out[] = {c.z.data(), c.rs.data()};
  for (auto _ : state) benchmark::DoNotOptimize(call.Run(in, out));
}
BENCHMARK(BM_PortablePreparedRun);

}  // namespace

BENCHMARK_MAIN();
