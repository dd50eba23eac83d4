// Test helpers: owning tensors of any float dtype, deterministic data, and
// TransformerEngine's comparison rule (spec/ops.md, Tolerances).
#ifndef TEFL_TESTS_TEST_SUPPORT_H_
#define TEFL_TESTS_TEST_SUPPORT_H_

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "backends/portable/cpu_paths.h"
#include "check/tensor.h"
#include "core/dtype.h"
#include "tefl/tefl.hpp"

namespace tefl::testing {

using check::Compare;
using check::CompareResult;
using check::Tensor;
using check::Tolerance;
using check::ToleranceFor;

// Runs run() with environment variable `name` (one of default.portable's
// TEFL_PORTABLE_* switches, cpu_paths.h) set to `value`, re-reading the
// switches before and after; the variable's previous value, or its absence,
// is restored (a ctest run may set it for the whole process). Returns run()'s
// result.
template <class Run>
auto WithPortableSwitch(const char* name, const char* value, Run&& run) {
  const char* was = std::getenv(name);
  const std::string saved = was ? was : "";
  setenv(name, value, 1);
  tefl::backends::ReloadPortableSwitches();
  auto result = run();
  if (was) {
    setenv(name, saved.c_str(), 1);
  } else {
    unsetenv(name);
  }
  tefl::backends::ReloadPortableSwitches();
  return result;
}

// Captures log lines while alive (and restores the previous sink after).
class LogCapture {
 public:
  explicit LogCapture(int level = TEFL_LOG_DEBUG);
  ~LogCapture();
  std::vector<std::string> Lines() const;
  int Count(const std::string& needle) const;
  void Clear();

 private:
  mutable std::mutex mu_;
  std::vector<std::string> lines_;
  int previous_level_;
};

// A call's tensors by argument name (conformance suites).
struct NamedTensor {
  std::string name;
  Tensor t;
};
// The tensor called `name` (a test failure naming `what` and the first
// tensor when there is none).
Tensor& Named(std::vector<NamedTensor>& v, const std::string& name, const char* what);
std::vector<Tensor*> Ptrs(std::vector<NamedTensor>& v);

// An environment lookup over a fixed map (for policy parsing tests).
SelectionPolicy::EnvLookup EnvFrom(std::vector<std::pair<std::string, std::string>> vars);

// Calls one op by name with explicit tensors; returns the status.
Status CallOp(OpManager& manager, const char* op, std::vector<Tensor*> inputs, std::vector<Tensor*> outputs,
              const void* attrs = nullptr);

// ---- Conformance helpers (every op family's suite uses these) -------------
constexpr const char* kReferenceImpl = "reference.cpp";
// Built-in implementations that must serve every call of a conformance suite.
// Any other implementation may decline a call (TEFL_UNSUPPORTED is part of
// the contract); a decline is reported, never counted as a pass.
inline constexpr const char* kMustServeImpls[] = {"reference.cpp", "default.portable"};
bool MustServe(const std::string& impl_id);

// Runs `op` on exactly `impl_id` (a strict policy whose per-op order is just
// "impl:<id>"): the call runs that implementation or fails.
Status RunImplDL(const std::string& op, const std::string& impl_id, const std::vector<const DLTensor*>& in,
                 const std::vector<DLTensor*>& out, const void* attrs);
Status RunImpl(const std::string& op, const std::string& impl_id, const std::vector<Tensor*>& in,
               const std::vector<Tensor*>& out, const void* attrs);

// The registered implementations of `op` that run on the CPU (plugins loaded
// from TE_FL_PLUGIN_MODULES included).
std::vector<std::string> CpuImplementations(const std::string& op);

}  // namespace tefl::testing

#endif  // TEFL_TESTS_TEST_SUPPORT_H_
