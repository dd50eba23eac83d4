// Runs one implementation on one built-in case, on the implementation's
// device through that device's runtime (tefl_device_runtime: alloc, copies,
// sync), and compares every output with reference.cpp's under the case's
// tolerances. What `tefl check` prints, one line per (impl, case).
#ifndef TEFL_SRC_CHECK_RUNNER_H_
#define TEFL_SRC_CHECK_RUNNER_H_

#include <string>

#include "check/cases.h"

namespace tefl::check {

enum class Verdict { kPass, kFail, kDeclined };
const char* VerdictName(Verdict v);

struct CheckResult {
  std::string impl_id, op, dtype, shape, note;
  Verdict verdict = Verdict::kPass;
  bool compared = false;            // the outputs were compared (else the figures below mean nothing)
  double max_abs = 0, max_rel = 0;  // over every output
  int64_t mismatches = 0;
  std::string reason;  // FAIL: what went wrong; DECLINED: the implementation's reason
};

// `expected` are reference.cpp's outputs for the case (RunReference).
CheckResult RunCheck(const Case& c, const std::string& impl_id, DLDeviceType device,
                     const std::vector<Tensor>& expected);
// reference.cpp's outputs for the case, or an error.
Status RunReference(const Case& c, std::vector<Tensor>* expected);

// The implementation's own reason in the message of a call pinned to it
// with a strict policy, without the policy's preamble ("op: strict mode
// (...): the first candidate X cannot run: ", "... X declined: ", "... X
// failed: "): check and bench pin each implementation themselves, so the
// preamble says nothing the user asked for. Other messages unchanged.
std::string ImplReason(const std::string& message);

}  // namespace tefl::check

#endif  // TEFL_SRC_CHECK_RUNNER_H_
