#include "check/cases.h"

#include <fmt/format.h>

#include "core/catalogue.h"

namespace tefl::check {

std::vector<const DLTensor*> Case::InputPtrs() const {
  std::vector<const DLTensor*> p;
  for (const std::optional<Tensor>& t : inputs) p.push_back(t ? &t->dl() : nullptr);
  return p;
}

std::vector<DLTensor*> Case::OutputPtrs() {
  std::vector<DLTensor*> p;
  for (size_t i = 0; i < outputs.size(); ++i) p.push_back(absent(i) ? nullptr : outputs[i].ptr());
  return p;
}

Status RunPinned(const std::string& op, const std::string& impl_id, const std::vector<const DLTensor*>& in,
                 const std::vector<DLTensor*>& out, const void* attrs) {
  SelectionPolicy policy;
  const Status made =
      SelectionPolicy::Make("flagos", /*strict=*/true, {{op, {"impl:" + impl_id}}}, {}, std::nullopt, &policy);
  if (!made.ok()) return made;
  PolicyContext ctx(policy);
  return GetDefaultManager().Call(op, in, out, attrs);
}

namespace cases_internal {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Tensor Input(DType t, std::vector<int64_t> shape, const std::string& seed, double lo, double hi) {
  Tensor v(t, std::move(shape));
  v.Uniform(seed, lo, hi);
  return v;
}

Tensor Output(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  if (t == DType::kU8 || t == DType::kI32) {
    o.Fill(t == DType::kU8 ? 0xA5 : -31337);
  } else {
    o.Fill(kSentinel);
  }
  return o;
}

}  // namespace cases_internal

std::vector<Case> BuiltinCases(const std::string& op_name, const GridOptions& options) {
  const OpSchema* op = FindOp(op_name);
  if (op == nullptr) return {};
  const std::string family = op->family;
  const std::string name = op->name;
  using namespace cases_internal;
  std::optional<DescribeOnly> describe;
  if (options.describe_only) describe.emplace();
  std::vector<Case> cases;
  if (family == "normalization") cases = NormalizationCases(name, options);
  if (family == "activation") cases = ActivationCases(name, options);
  if (family == "softmax") cases = SoftmaxCases(name, options);
  if (family == "rope") cases = RopeCases(name, options);
  if (family == "dropout") cases = DropoutCases(name, options);
  if (family == "attention") cases = AttentionCases(name, options);
  if (family == "quantization") cases = QuantizationCases(name, options);
  if (family == "gemm") cases = GemmCases(name, options);
  if (options.first_only && cases.size() > 1) cases.resize(1);
  return cases;
}

}  // namespace tefl::check
