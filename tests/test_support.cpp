#include "test_support.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>

#include "backends/portable/cpu_paths.h"
#include "core/logging.h"

namespace tefl::testing {

LogCapture::LogCapture(int level) : previous_level_(GetLogLevel()) {
  SetLogLevel(level);
  SetLogSink([this](int, const std::string& line) {
    std::lock_guard<std::mutex> lock(mu_);
    lines_.push_back(line);
  });
}
LogCapture::~LogCapture() {
  SetLogSink(nullptr);
  SetLogLevel(previous_level_);
}
std::vector<std::string> LogCapture::Lines() const {
  std::lock_guard<std::mutex> lock(mu_);
  return lines_;
}
int LogCapture::Count(const std::string& needle) const {
  std::lock_guard<std::mutex> lock(mu_);
  int n = 0;
  for (const auto& l : lines_) n += l.find(needle) != std::string::npos;
  return n;
}
void LogCapture::Clear() {
  std::lock_guard<std::mutex> lock(mu_);
  lines_.clear();
}

SelectionPolicy::EnvLookup EnvFrom(std::vector<std::pair<std::string, std::string>> vars) {
  auto shared = std::make_shared<std::vector<std::pair<std::string, std::string>>>(std::move(vars));
  return [shared](const char* name) -> const char* {
    for (const auto& [k, v] : *shared)
      if (k == name) return v.c_str();
    return nullptr;
  };
}

Status CallOp(OpManager& manager, const char* op, std::vector<Tensor*> inputs, std::vector<Tensor*> outputs,
              const void* attrs) {
  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out;
  for (Tensor* t : inputs) in.push_back(t ? t->ptr() : nullptr);
  for (Tensor* t : outputs) out.push_back(t ? t->ptr() : nullptr);
  return manager.Call(op, in, out, attrs);
}

bool MustServe(const std::string& impl_id) { return impl_id == "reference.cpp" || impl_id == "default.portable"; }

Status RunImplDL(const std::string& op, const std::string& impl_id, const std::vector<const DLTensor*>& in,
                 const std::vector<DLTensor*>& out, const void* attrs) {
  SelectionPolicy policy;
  const Status made =
      SelectionPolicy::Make("flagos", /*strict=*/true, {{op, {"impl:" + impl_id}}}, {}, std::nullopt, &policy);
  if (!made.ok()) return made;
  PolicyContext ctx(policy);
  OpManager& mgr = GetDefaultManager();
  const Status s = mgr.Call(op, in, out, attrs);
  if (s.ok() && mgr.GetSelectedImplId(op) != impl_id)
    return Status(TEFL_INTERNAL, fmt::format("ran '{}' instead of '{}'", mgr.GetSelectedImplId(op), impl_id));
  return s;
}

Status RunImpl(const std::string& op, const std::string& impl_id, const std::vector<Tensor*>& in,
               const std::vector<Tensor*>& out, const void* attrs) {
  std::vector<const DLTensor*> din;
  std::vector<DLTensor*> dout;
  for (Tensor* t : in) din.push_back(t->ptr());
  for (Tensor* t : out) dout.push_back(t->ptr());
  return RunImplDL(op, impl_id, din, dout, attrs);
}

std::vector<std::string> CpuImplementations(const std::string& op) {
  OpManager& mgr = GetDefaultManager();
  mgr.EnsureInitialized();  // registers the built-ins
  std::vector<std::string> ids;
  for (const OpImpl& impl : mgr.registry().GetImplementations(op))
    if (impl.device_mask & TEFL_DEVICE_BIT(kDLCPU)) ids.push_back(impl.impl_id);
  return ids;
}

Tensor& Named(std::vector<NamedTensor>& v, const std::string& name, const char* what) {
  for (NamedTensor& n : v)
    if (n.name == name) return n.t;
  ADD_FAILURE() << "no " << what << " " << name;
  return v[0].t;
}

std::vector<Tensor*> Ptrs(std::vector<NamedTensor>& v) {
  std::vector<Tensor*> p;
  for (NamedTensor& n : v) p.push_back(&n.t);
  return p;
}

// ---- Variant runs that a CPU makes redundant ---------------------------------------
// ctest runs some suites again with one portable path switched off
// (GemmNoAmx, GemmF32OpenBlas, DropoutNoAvx512, DropoutNoBf16Cvt,
// AttentionNoAmx; tests/CMakeLists.txt), naming in TEFL_TEST_VARIANT_NEEDS
// what the CPU must have for that run to differ from the default one. On a
// CPU without it the variant would repeat the default run test for test
// (under AddressSanitizer ~8 minutes for the GEMM suite on a 2-core Zen 3),
// so every test is skipped, with the reason, which ctest's
// SKIP_REGULAR_EXPRESSION reports. Registered here, in the object every
// suite links (its helpers), so that every suite has it.
namespace {
class RedundantVariantSkip : public ::testing::Environment {
 public:
  void SetUp() override {
    const char* needs = std::getenv("TEFL_TEST_VARIANT_NEEDS");
    if (needs == nullptr) return;
    const std::string n = needs;
    const bool has = n == "amx"          ? tefl::backends::CpuHasAmxBf16()
                     : n == "avx512"     ? tefl::backends::CpuHasAvx512()
                     : n == "avx512bf16" ? tefl::backends::CpuHasAvx512Bf16()
                     : n == "avx512bmi2" ? tefl::backends::CpuHasAvx512Bmi2()
                                         : true;  // an unknown name: run, never skip silently
    if (!has) GTEST_SKIP() << "variant redundant on this CPU: it has no " << n << ", so the run equals the default one";
  }
};
// gtest's own idiom (as TEST's registration): before main's RUN_ALL_TESTS.
[[maybe_unused]] ::testing::Environment* const kRedundantVariantSkip =
    ::testing::AddGlobalTestEnvironment(new RedundantVariantSkip);
}  // namespace

}  // namespace tefl::testing
