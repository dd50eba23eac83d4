// Test helpers: owning tensors of any float dtype, deterministic data, and
// TransformerEngine's comparison rule (spec/ops.md, Tolerances).
#ifndef TEFL_TESTS_TEST_SUPPORT_H_
#define TEFL_TESTS_TEST_SUPPORT_H_

#include <cstdint>
#include <functional>
#include <mutex>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "tefl/tefl.hpp"

namespace tefl::testing {

class Tensor {
 public:
  Tensor() = default;
  Tensor(DType dtype, std::vector<int64_t> shape);
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);

  DLTensor& dl() { return dl_; }
  const DLTensor& dl() const { return dl_; }
  DLTensor* ptr() { return &dl_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  double at(int64_t i) const { return LoadAsFloat(bytes(), i, dtype_); }
  void set(int64_t i, double v) { StoreFromDouble(bytes(), i, dtype_, v); }
  void* bytes() const { return const_cast<uint8_t*>(storage_.data()) + kGuard; }
  size_t nbytes() const { return size_t(numel_) * size_t(dl_.dtype.bits / 8); }

  // Uniform in [lo, hi) from a seed derived from `name` (deterministic).
  Tensor& Uniform(const std::string& name, double lo = -2.0, double hi = 1.0);
  Tensor& Fill(double v);
  // Whether the guard bytes around the data are intact (no out-of-bounds write).
  bool GuardsIntact() const;
  // Bytes of the data region equal to another tensor's.
  bool SameBytes(const Tensor& other) const;

 private:
  static constexpr size_t kGuard = 64;
  void Bind();
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  std::vector<uint8_t> storage_;
  DLTensor dl_{};
};

struct Tolerance {
  double atol, rtol;
};
// TE's element tolerances for an output dtype.
Tolerance ToleranceFor(DType dtype);

struct CompareResult {
  int64_t mismatches = 0;
  double max_abs = 0, max_rel = 0;
  int64_t first_bad = -1;
  std::string ToString() const;
};
// Mismatch when |t - r| > atol and (r == 0 or |t - r|/|r| > rtol), forgiven
// for non-fp32 outputs when t and r are neighbouring representable values.
// NaN must match NaN, inf must match the same inf.
CompareResult Compare(const Tensor& test, const Tensor& ref, Tolerance tol);

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
