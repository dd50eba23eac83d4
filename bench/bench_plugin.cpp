// Plugins: load + registration time, and dispatch overhead through a plugin's
// kernel against calling that kernel directly (same tiny call, same run).
// Uses the test plugin tests/plugins/libtefl_plugin_testgood.so.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstdio>
#include <memory>

#include "tefl/tefl.hpp"
#include "tiny_call.h"

namespace {

const char* PluginFile() { return TEFL_TEST_PLUGIN_DIR "/libtefl_plugin_testgood.so"; }

// Loading into a fresh registry each time: resolution, safety checks,
// dlopen (already mapped after the first), ABI check, staged registration
// and commit.
void BM_LoadPluginIntoFreshRegistry(benchmark::State& state) {
  for (auto _ : state) {
    state.PauseTiming();
    auto registry = std::make_unique<tefl::OpRegistry>();
    state.ResumeTiming();
    if (!tefl::LoadPlugin(PluginFile(), *registry).ok()) state.SkipWithError("load failed");
    state.PauseTiming();
    registry.reset();
    state.ResumeTiming();
  }
}
BENCHMARK(BM_LoadPluginIntoFreshRegistry);

struct PluginManager {
  tefl::OpRegistry registry;
  tefl::OpManager manager{&registry};
  PluginManager() {
    manager.EnsureInitialized();
    (void)tefl::LoadPlugin(PluginFile(), registry);
  }
};
PluginManager& Shared() {
  static auto* m = new PluginManager();
  return *m;
}

void BM_PluginKernelDirect(benchmark::State& state) {
  TinyCall c;
  auto impl = Shared().registry.GetImplementation("rmsnorm_fwd", "vendor.testgood");
  if (!impl) {
    state.SkipWithError("plugin not loaded");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(impl->kernel(&c.frame, impl->user_data));
}
BENCHMARK(BM_PluginKernelDirect);

void BM_PluginKernelThroughManager(benchmark::State& state) {
  TinyCall c;
  tefl::PolicyContext vendor(tefl::GetPolicy().WithPrefer("vendor"));
  tefl::CallOptions opts;
  opts.manager = &Shared().manager;
  if (!tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts).ok() ||
      Shared().manager.GetSelectedImplId("rmsnorm_fwd") != "vendor.testgood") {
    state.SkipWithError("the plugin's kernel did not run");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(tefl::rmsnorm_fwd(c.tx, c.tg, 1e-5f, c.tz, c.trs, opts));
}
BENCHMARK(BM_PluginKernelThroughManager);

void BM_PluginKernelPreparedRun(benchmark::State& state) {
  TinyCall c;
  tefl::PolicyContext vendor(tefl::GetPolicy().WithPrefer("vendor"));
  tefl::PreparedCall call;
  void* in[] = {c.x.data(), c.g.data()};
  void* out[] = {c.z.data(), c.rs.data()};
  if (!Shared().manager.Prepare(TEFL_OP_RMSNORM_FWD, c.in, c.out, &c.attrs, &call).ok() || !call.Run(in, out).ok() ||
      Shared().manager.GetSelectedImplId("rmsnorm_fwd") != "vendor.testgood") {
    state.SkipWithError("the plugin's kernel did not run");
    return;
  }
  for (auto _ : state) benchmark::DoNotOptimize(call.Run(in, out));
}
BENCHMARK(BM_PluginKernelPreparedRun);

}  // namespace

int main(int argc, char** argv) {
  // The first load of the process (cold dlopen), timed once by hand.
  tefl::OpRegistry first;
  const auto t0 = std::chrono::steady_clock::now();
  const bool ok = tefl::LoadPlugin(PluginFile(), first).ok();
  const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
  std::printf("first load of %s: %s, %.1f us\n", PluginFile(), ok ? "ok" : "FAILED", us);
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return ok ? 0 : 1;
}
