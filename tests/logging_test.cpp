// TE-FL's log lines appear exactly once, at the right level, in TE-FL's
// format; TE_FL_VERBOSE adds dispatch and exec lines.
#include "core/logging.h"

#include <gtest/gtest.h>

#include <regex>

#include "test_support.h"

namespace tefl {
namespace {

using testing::LogCapture;
using testing::Tensor;

Status MyRms(const tefl_call_frame&) { return Status::OK(); }

struct Call {
  Tensor x{DType::kF32, {2, 16}}, g{DType::kF32, {16}}, z{DType::kF32, {2, 16}}, rs{DType::kF32, {2}};
  Call() {
    x.Uniform("x");
    g.Uniform("g");
  }
  Status Run(OpManager& m) { return testing::CallOp(m, "rmsnorm_fwd", {&x, &g}, {&z, &rs}); }
};

TEST(LogLines, RegisteredAndUsingOnceAtInfo) {
  ResetGlobalPolicy();
  LogCapture logs(TEFL_LOG_INFO);
  OpRegistry registry;
  ASSERT_TRUE(registry
                  .RegisterImpl(OpImpl::FromFunction("rmsnorm_fwd", "vendor.mybackend", BackendImplKind::VENDOR,
                                                     "mybackend", 200, MyRms))
                  .ok());
  OpManager manager(&registry);
  PolicyContext vendor_first(GetPolicy().WithPrefer("vendor"));
  Call call;
  for (int i = 0; i < 5; ++i) ASSERT_TRUE(call.Run(manager).ok());
  const std::regex registered(
      R"(^\[TE-FL manager\.cpp:\d+ INFO\] Registered impl_ids: \['default\.portable', 'reference\.cpp', 'vendor\.mybackend'\]$)");
  const std::regex using_line(
      R"(^\[TE-FL manager\.cpp:\d+ INFO\] Op 'rmsnorm_fwd' using 'vendor\.mybackend' \(kind=vendor, vendor=mybackend\)$)");
  int n_registered = 0, n_using = 0;
  for (const auto& l : logs.Lines()) {
    n_registered += std::regex_match(l, registered);
    n_using += std::regex_match(l, using_line);
  }
  EXPECT_EQ(n_registered, 1) << ::testing::PrintToString(logs.Lines());
  EXPECT_EQ(n_using, 1) << ::testing::PrintToString(logs.Lines());
  // When another implementation takes over, that is announced once too.
  {
    PolicyContext flagos(GetPolicy().WithPrefer("flagos"));
    for (int i = 0; i < 3; ++i) ASSERT_TRUE(call.Run(manager).ok());
  }
  EXPECT_EQ(logs.Count("INFO] Op 'rmsnorm_fwd' using 'default.portable' (kind=flagos, vendor=None)"), 1);
}

TEST(LogLines, LevelFiltersAndWarningIsNotInfo) {
  LogCapture logs(TEFL_LOG_WARNING);
  OpManager manager;
  Call call;
  ASSERT_TRUE(call.Run(manager).ok());
  EXPECT_EQ(logs.Count("Registered impl_ids"), 0);  // INFO is below WARNING
  EXPECT_EQ(logs.Count("using"), 0);
  SetLogLevel(TEFL_LOG_ERROR);
  TEFL_LOG(WARNING, "hidden {}", 1);
  TEFL_LOG(ERROR, "shown {}", 2);
  EXPECT_EQ(logs.Count("hidden"), 0);
  EXPECT_EQ(logs.Count("ERROR] shown 2"), 1);
}

TEST(LogLines, VerboseDispatchAndExec) {
  LogCapture logs(TEFL_LOG_ERROR);
  SetVerbose(kVerboseDispatch);
  OpManager manager;
  Call call;
  ASSERT_TRUE(call.Run(manager).ok());
  ASSERT_TRUE(call.Run(manager).ok());
  // One resolution (cached after), listing each candidate.
  EXPECT_EQ(logs.Count("tefl_verbose,dispatch,rmsnorm_fwd,resolve,x:float32[2d]"), 1);
  EXPECT_EQ(logs.Count("tefl_verbose,dispatch,rmsnorm_fwd,candidate,default.portable,accepted"), 1);
  EXPECT_EQ(logs.Count("tefl_verbose,dispatch,rmsnorm_fwd,chain,default.portable|reference.cpp"), 1);
  EXPECT_EQ(logs.Count("tefl_verbose,exec"), 0);
  SetVerbose(kVerboseDispatch | kVerboseExec);
  ASSERT_TRUE(call.Run(manager).ok());
  SetVerbose(0);
  const std::regex exec(
      R"(^tefl_verbose,exec,rmsnorm_fwd,default\.portable,x:float32\[2, 16\] gamma:float32\[16\] -> z:float32\[2, 16\] rsigma:float32\[2\],\d+\.\d{4} ms$)");
  int n = 0;
  for (const auto& l : logs.Lines()) n += std::regex_match(l, exec);
  EXPECT_EQ(n, 1) << ::testing::PrintToString(logs.Lines());
}

TEST(LogLines, VerboseShowsRejectionReasons) {
  LogCapture logs(TEFL_LOG_ERROR);
  SetVerbose(kVerboseDispatch);
  OpManager manager;
  PolicyContext only_vendor(GetPolicy().WithPrefer("vendor").WithStrict(false));
  SelectionPolicy p;
  ASSERT_TRUE(SelectionPolicy::Make("flagos", false, {{"rmsnorm_fwd", {"reference"}}}, {}, std::nullopt, &p).ok());
  PolicyContext per_op(p);
  Call call;
  ASSERT_TRUE(call.Run(manager).ok());
  SetVerbose(0);
  EXPECT_EQ(logs.Count("candidate,default.portable,rejected,matches no token of the order reference"), 1)
      << ::testing::PrintToString(logs.Lines());
}

}  // namespace
}  // namespace tefl
