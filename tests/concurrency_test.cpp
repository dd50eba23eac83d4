// 8 threads dispatch (half of them through prepared calls) while another
// thread flips policies (global and scoped),
// registers implementations and makes one of them fail: no crash, no race
// (this binary also runs under ThreadSanitizer), every result correct.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "core/logging.h"
#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

constexpr int64_t kRows = 4, kHidden = 64;

// A correct fp32 RMSNorm (any vendor registered here computes the real thing).
Status GoodRms(const tefl_call_frame& f) {
  const float* x = static_cast<const float*>(f.inputs[0]->data);
  const float* g = static_cast<const float*>(f.inputs[1]->data);
  float* z = static_cast<float*>(f.outputs[0]->data);
  float* rs = static_cast<float*>(f.outputs[1]->data);
  const float eps = static_cast<const tefl_norm_fwd_attrs*>(f.attrs)->eps;
  for (int64_t r = 0; r < kRows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < kHidden; ++j) ss += double(x[r * kHidden + j]) * x[r * kHidden + j];
    const double inv = 1.0 / std::sqrt(ss / kHidden + eps);
    for (int64_t j = 0; j < kHidden; ++j) z[r * kHidden + j] = float(x[r * kHidden + j] * inv * g[j]);
    rs[r] = float(inv);
  }
  return Status::OK();
}
Status FailingRms(const tefl_call_frame&) { return Status(TEFL_RUNTIME_ERROR, "flaky vendor"); }
Status DecliningRms(const tefl_call_frame&) { return Status(TEFL_UNSUPPORTED, "not today"); }

TEST(Concurrency, DispatchWhilePoliciesFlipAndImplsRegister) {
  OpRegistry registry;
  OpManager manager(&registry);
  ASSERT_TRUE(registry
                  .RegisterImpl(OpImpl::FromFunction("rmsnorm_fwd", "vendor.flaky", BackendImplKind::VENDOR, "flaky",
                                                     1000, FailingRms))
                  .ok());
  ASSERT_TRUE(registry
                  .RegisterImpl(OpImpl::FromFunction("rmsnorm_fwd", "vendor.shy", BackendImplKind::VENDOR, "shy", 900,
                                                     DecliningRms))
                  .ok());
  testing::LogCapture quiet(TEFL_LOG_ERROR);

  Tensor x(DType::kF32, {kRows, kHidden}), g(DType::kF32, {kHidden});
  x.Uniform("x");
  g.Uniform("g");
  Tensor z_ref(DType::kF32, {kRows, kHidden}), rs_ref(DType::kF32, {kRows});
  {
    PolicyContext ref(GetPolicy().WithPrefer("reference"));
    ASSERT_TRUE(testing::CallOp(manager, "rmsnorm_fwd", {&x, &g}, {&z_ref, &rs_ref}).ok());
  }

  std::atomic<bool> stop{false};
  std::atomic<int> failures{0}, calls{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < 8; ++t) {
    workers.emplace_back([&, t] {
      Tensor z(DType::kF32, {kRows, kHidden}), rs(DType::kF32, {kRows});
      // Odd threads run a call prepared once (each its own PreparedCall).
      PreparedCall prepared;
      if (t % 2 == 1) {
        const DLTensor* in[] = {x.ptr(), g.ptr()};
        DLTensor* out[] = {z.ptr(), rs.ptr()};
        if (!manager.Prepare(TEFL_OP_RMSNORM_FWD, in, out, nullptr, &prepared).ok()) failures++;
      }
      void* in_data[] = {x.bytes(), g.bytes()};
      void* out_data[] = {z.bytes(), rs.bytes()};
      int i = 0;
      while (!stop.load() || i < 50) {
        // Some threads use their own scoped policies as well.
        std::optional<PolicyContext> scoped;
        if (t % 2 == 0 && i % 3 == 0) scoped.emplace(GetPolicy().WithPrefer(i % 2 ? "reference" : "vendor"));
        z.Fill(0);
        Status s = prepared.prepared() ? prepared.Run(in_data, out_data)
                                       : testing::CallOp(manager, "rmsnorm_fwd", {&x, &g}, {&z, &rs});
        if (!s.ok() || testing::Compare(z, z_ref, {1e-5, 1e-5}).mismatches != 0 ||
            testing::Compare(rs, rs_ref, {1e-6, 5e-5}).mismatches != 0) {
          failures++;
        }
        calls++;
        ++i;
      }
    });
  }
  std::thread flipper([&] {
    const char* prefers[] = {"vendor", "flagos", "reference"};
    for (int i = 0; i < 300; ++i) {
      SetGlobalPolicy(SelectionPolicy()
                          .WithPrefer(prefers[i % 3])
                          .WithDeniedVendors(i % 4 == 0 ? std::set<std::string>{"dyn"} : std::set<std::string>{}));
      if (i % 25 == 0) {
        Status s = registry.RegisterImpl(OpImpl::FromFunction("rmsnorm_fwd", "vendor.dyn" + std::to_string(i),
                                                              BackendImplKind::VENDOR, "dyn", i, GoodRms));
        if (!s.ok()) failures++;
      }
      if (i % 7 == 0) BumpPolicyEpoch();
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    stop = true;
  });
  flipper.join();
  for (auto& w : workers) w.join();
  ResetGlobalPolicy();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_GE(calls.load(), 400);
  EXPECT_EQ(registry.GetImplementations("rmsnorm_fwd").size(), 2u + 12u + 2u);  // fakes + dyn + built-ins
}

// The host thread pool is shared: concurrent parallel_for calls from many
// threads (and nested ones) all complete with every index covered once.
TEST(Concurrency, ParallelForFromManyThreads) {
  std::vector<std::thread> threads;
  std::atomic<int> bad{0};
  for (int t = 0; t < 6; ++t) {
    threads.emplace_back([&] {
      for (int rep = 0; rep < 50; ++rep) {
        std::vector<std::atomic<int>> hits(257);
        auto body = [](void* ctx, int64_t b, int64_t e) {
          auto* h = static_cast<std::vector<std::atomic<int>>*>(ctx);
          for (int64_t i = b; i < e; ++i) (*h)[size_t(i)]++;
        };
        tefl_host()->parallel_for(257, 1, body, &hits);
        for (auto& h : hits) bad += h.load() != 1;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(bad.load(), 0);
}

// Two managers of one registry, first calls at once: the manager that does
// not register the built-ins and load the configured plugins waits until the
// other has done it, so no call dispatches on a registry still being filled
// (it got UNSUPPORTED "no implementation is registered", or ran without the
// configured plugins). Made deterministic by holding the initialising manager
// inside its plugin loading (the log line of a configured plugin that does not
// exist) while the other manager calls.
TEST(Concurrency, ManagersOfOneRegistryWaitForItsInitialisation) {
  const char* was = std::getenv("TE_FL_PLUGIN_MODULES");
  const std::string saved = was ? was : "";
  setenv("TE_FL_PLUGIN_MODULES", "/nonexistent/libtefl_plugin_concurrency_probe.so", 1);
  const int level_was = GetLogLevel();
  SetLogLevel(TEFL_LOG_WARNING);  // the waiting manager logs nothing (the sink is busy)
  std::mutex mu;
  std::condition_variable cv;
  bool loading = false, second_done = false, second_done_while_loading = false, held = false;
  LogSink previous = SetLogSink([&](int, const std::string& line) {
    if (line.find("concurrency_probe") == std::string::npos) return;
    std::unique_lock<std::mutex> lock(mu);
    if (held) return;
    held = true;
    loading = true;
    cv.notify_all();
    // Long enough for a call that does not wait to finish many times over.
    cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return second_done; });
    second_done_while_loading = second_done;
    loading = false;
  });
  {
    OpRegistry registry;
    OpManager first(&registry), second(&registry);
    auto gelu = [](OpManager& m) {
      Tensor x(DType::kF32, {2, 8}), y(DType::kF32, {2, 8});
      x.Uniform("x");
      const DLTensor* in[] = {x.ptr()};
      DLTensor* out[] = {y.ptr()};
      return m.Call(TEFL_OP_GELU, in, out);
    };
    Status first_status, second_status;
    std::thread a([&] { first_status = gelu(first); });
    std::thread b([&] {
      {
        std::unique_lock<std::mutex> lock(mu);
        // The first manager is loading plugins now (or, failing that, the
        // test goes on and reports that the sink never held it).
        cv.wait_for(lock, std::chrono::seconds(10), [&] { return loading; });
      }
      second_status = gelu(second);
      std::lock_guard<std::mutex> lock(mu);
      second_done = true;
      cv.notify_all();
    });
    a.join();
    b.join();
    EXPECT_TRUE(held);
    EXPECT_FALSE(second_done_while_loading) << "the second manager called before the registry was initialised";
    EXPECT_TRUE(first_status.ok()) << first_status.ToString();
    EXPECT_TRUE(second_status.ok()) << second_status.ToString();
  }
  SetLogSink(std::move(previous));
  SetLogLevel(level_was);
  if (was) {
    setenv("TE_FL_PLUGIN_MODULES", saved.c_str(), 1);
  } else {
    unsetenv("TE_FL_PLUGIN_MODULES");
  }
}

}  // namespace
}  // namespace tefl
