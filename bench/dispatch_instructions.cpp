// Repeatable instruction counts of the dispatch path, for
// `valgrind --tool=callgrind` (see bench/callgrind_dispatch.sh): each loop
// below runs exactly kCalls calls after a warm-up, so inclusive instructions
// of a loop / kCalls = instructions per call.
#include <cstdio>
#include <memory>
#include <vector>

#include "core/catalogue.h"
#include "core/validate.h"
#include "tefl/tefl.hpp"
#include "tiny_call.h"

namespace {

constexpr int kCalls = 10000;

tefl_status* NoopKernel(const tefl_call_frame* f, void*) {
  asm volatile("" : : "r"(f) : "memory");
  return nullptr;
}

__attribute__((noinline)) int LoopValidate(TinyCall& c) {
  const tefl::OpSchema& op = *tefl::FindOp(TEFL_OP_RMSNORM_FWD);
  const tefl::CallArgs args{c.in, 2, c.out, 2, &c.attrs};
  tefl::SigKey key;
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += tefl::ValidateCall(op, args, &key) != nullptr;
  return errors;
}

// The same call through the per-thread validation memo (a hit after the first).
__attribute__((noinline)) int LoopValidateMemo(TinyCall& c, tefl::ValidationMemo* memo) {
  const tefl::OpSchema& op = *tefl::FindOp(TEFL_OP_RMSNORM_FWD);
  const tefl::CallArgs args{c.in, 2, c.out, 2, &c.attrs};
  tefl::SigKey key;
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += tefl::ValidateCallMemo(op, args, &key, memo) != nullptr;
  return errors;
}

__attribute__((noinline)) int LoopManagerCall(TinyCall& c, tefl::OpManager& m) {
  tefl::CallOptions opts;
  opts.manager = &m;
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += !tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts).ok();
  return errors;
}

// A prepared call run on the same pointers: pointer checks, the remembered
// chain, the indirect call.
__attribute__((noinline)) int LoopPreparedRun(TinyCall& c, tefl::PreparedCall& call) {
  void* in[] = {c.x.data(), c.g.data()};
  void* out[] = {c.z.data(), c.rs.data()};
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += !call.Run(in, out).ok();
  return errors;
}

// The same, alternating between two sets of buffers: the full pointer checks
// on every run.
__attribute__((noinline)) int LoopPreparedRunNewPointers(TinyCall& c, TinyCall& d, tefl::PreparedCall& call) {
  void* in[2][2] = {{c.x.data(), c.g.data()}, {d.x.data(), d.g.data()}};
  void* out[2][2] = {{c.z.data(), c.rs.data()}, {d.z.data(), d.rs.data()}};
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += !call.Run(in[i & 1], out[i & 1]).ok();
  return errors;
}

__attribute__((noinline)) int LoopKernelDirect(TinyCall& c) {
  int errors = 0;
  for (int i = 0; i < kCalls; ++i) errors += NoopKernel(&c.frame, nullptr) != nullptr;
  return errors;
}

}  // namespace

int main() {
  tefl::OpRegistry registry;
  tefl::OpImpl impl;
  impl.op_name = "rmsnorm_fwd";
  impl.impl_id = "default.noop";
  impl.priority = 1000;
  impl.kernel = NoopKernel;
  if (!registry.RegisterImpl(impl).ok()) return 1;
  tefl::OpManager manager(&registry);
  TinyCall c, d;
  tefl::CallOptions opts;
  opts.manager = &manager;
  if (!tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts).ok()) return 1;  // warm: resolve once
  auto memo = std::make_unique<tefl::ValidationMemo>();
  tefl::PreparedCall prepared;
  if (!manager.Prepare(TEFL_OP_RMSNORM_FWD, c.in, c.out, &c.attrs, &prepared).ok()) return 1;
  const int errors = LoopValidate(c) + LoopValidateMemo(c, memo.get()) + LoopManagerCall(c, manager) +
                     LoopPreparedRun(c, prepared) + LoopPreparedRunNewPointers(c, d, prepared) + LoopKernelDirect(c);
  std::printf("%d calls per loop, %d errors\n", kCalls, errors);
  return errors != 0;
}
