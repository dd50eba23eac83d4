// Loads the plugin given as argv[1] the way a user does (TE_FL_PLUGIN_MODULES,
// TE_FL_PREFER=vendor) and checks: it loaded, fp32 rmsnorm_fwd runs on
// vendor.myvendor and matches the reference, bf16 (which it declines) falls
// back to another implementation. Exit 0 on success. Used by
// plugin_install_test.sh with a plugin built against the installed tefl.
#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "test_support.h"

using tefl::DType;
using tefl::testing::Tensor;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: plugin_load_check /abs/path/libtefl_plugin_myvendor.so\n");
    return 2;
  }
  setenv("TE_FL_PLUGIN_MODULES", argv[1], 1);
  setenv("TE_FL_PREFER", "vendor", 1);
  tefl::OpManager& m = tefl::GetDefaultManager();
  Tensor x(DType::kF32, {6, 96}), g(DType::kF32, {96}), z(DType::kF32, {6, 96}), rs(DType::kF32, {6});
  x.Uniform("x");
  g.Uniform("g");
  tefl::Status s = tefl::testing::CallOp(m, "rmsnorm_fwd", {&x, &g}, {&z, &rs});
  bool ok = true;
  auto check = [&](bool cond, const char* what) {
    std::printf("%s: %s\n", cond ? "ok  " : "FAIL", what);
    ok = ok && cond;
  };
  check(s.ok(), "rmsnorm_fwd fp32 succeeded");
  check(m.GetSelectedImplId("rmsnorm_fwd") == "vendor.myvendor", "fp32 ran on vendor.myvendor");
  bool reported = false;
  for (const auto& r : tefl::PluginReports())
    reported = reported || (r.loaded && r.name == "myvendor" && r.vendor == "myvendor" && r.implementations == 1);
  check(reported, "the plugin report says myvendor loaded with 1 implementation");
  Tensor z_ref = z, rs_ref = rs;
  {
    tefl::PolicyContext ref(tefl::GetPolicy().WithPrefer("reference"));
    check(tefl::testing::CallOp(m, "rmsnorm_fwd", {&x, &g}, {&z_ref, &rs_ref}).ok(), "reference ran");
  }
  check(tefl::testing::Compare(z, z_ref, tefl::testing::ToleranceFor(DType::kF32)).mismatches == 0,
        "z matches reference.cpp");
  check(tefl::testing::Compare(rs, rs_ref, {1e-6, 5e-5}).mismatches == 0, "rsigma matches reference.cpp");
  Tensor xb(DType::kBF16, {6, 96}), zb(DType::kBF16, {6, 96});
  xb.Uniform("x");
  s = tefl::testing::CallOp(m, "rmsnorm_fwd", {&xb, &g}, {&zb, &rs});
  check(s.ok() && m.GetSelectedImplId("rmsnorm_fwd") != "vendor.myvendor",
        "bf16 (declined by its supports()) ran elsewhere");
  return ok ? 0 : 1;
}
