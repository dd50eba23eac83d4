// The built-in conformance grid: for an op, a list of concrete calls (inputs
// filled with deterministic data, outputs filled with a sentinel, attributes,
// and the tolerance of each output from spec/ops.md). `tefl check` runs every
// implementation on them against reference.cpp; `tefl bench` and the demo
// build their calls the same way.
#ifndef TEFL_SRC_CHECK_CASES_H_
#define TEFL_SRC_CHECK_CASES_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "check/tensor.h"
#include "tefl/tefl.hpp"

namespace tefl::check {

constexpr double kSentinel = -31337.0;  // every output starts as this

struct Case {
  std::string op;                             // catalogue name
  std::string dtype;                          // the data dtype, "float32" ...
  std::string shape;                          // the main input's shape, "[33, 129]"
  std::string note;                           // what else is particular ("zero_centered_gamma", "scale 0.125", ...)
  std::vector<std::optional<Tensor>> inputs;  // std::nullopt: an absent optional input
  std::vector<Tensor> outputs;                // sentinel-filled
  std::vector<Tolerance> tolerances;          // per output
  std::vector<bool> exact;                    // per output: must match bit for bit (masks)
  std::vector<unsigned char> attrs;           // the attribute struct; empty: defaults
  // Per output: an optional output this call does not pass (NULL; its
  // Tensor is a placeholder, never compared). Empty: every output is passed.
  std::vector<bool> output_absent;

  bool absent(size_t i) const { return i < output_absent.size() && output_absent[i]; }

  const void* attrs_ptr() const { return attrs.empty() ? nullptr : attrs.data(); }
  std::vector<const DLTensor*> InputPtrs() const;
  std::vector<DLTensor*> OutputPtrs();
};

struct GridOptions {
  std::optional<DType> dtype;                 // only this data dtype
  std::optional<std::vector<int64_t>> shape;  // only this main-input shape (each family reads it its way)
  bool first_only = false;                    // stop after the first case (benchmarks: big shapes)
  // The cases only describe calls (`tefl explain`): built under DescribeOnly
  // (tensors allocated, never written) and the saved tensors of backward
  // cases are not computed. Never run such a case.
  bool describe_only = false;
};

// The cases of `op` (by name or alias); empty for an op without a grid.
// Backward cases take their saved tensors (statistics, softmax output, mask)
// from reference.cpp's forward on the same data.
std::vector<Case> BuiltinCases(const std::string& op, const GridOptions& options = {});

// Runs `op` on exactly `impl_id` through the default manager (a strict
// policy whose order for the op is "impl:<id>").
Status RunPinned(const std::string& op, const std::string& impl_id, const std::vector<const DLTensor*>& in,
                 const std::vector<DLTensor*>& out, const void* attrs);

// Shared by the family files.
namespace cases_internal {
std::string ShapeString(const std::vector<int64_t>& shape);
Tensor Input(DType t, std::vector<int64_t> shape, const std::string& seed, double lo = -2.0, double hi = 1.0);
Tensor Output(DType t, std::vector<int64_t> shape);
template <class Attrs>
std::vector<unsigned char> AttrBytes(const Attrs& a) {
  const auto* p = reinterpret_cast<const unsigned char*>(&a);
  return std::vector<unsigned char>(p, p + sizeof(Attrs));
}
// The family grids.
std::vector<Case> NormalizationCases(const std::string& op, const GridOptions& o);
std::vector<Case> ActivationCases(const std::string& op, const GridOptions& o);
std::vector<Case> SoftmaxCases(const std::string& op, const GridOptions& o);
std::vector<Case> RopeCases(const std::string& op, const GridOptions& o);
std::vector<Case> DropoutCases(const std::string& op, const GridOptions& o);
std::vector<Case> AttentionCases(const std::string& op, const GridOptions& o);
std::vector<Case> QuantizationCases(const std::string& op, const GridOptions& o);
std::vector<Case> GemmCases(const std::string& op, const GridOptions& o);
}  // namespace cases_internal

}  // namespace tefl::check

#endif  // TEFL_SRC_CHECK_CASES_H_
