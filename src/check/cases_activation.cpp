// Built-in cases of the activation ops (spec/ops.md, "Activations"). The
// grid's shape is [N.., H]: plain ops take x of that shape, gated ops an
// input [N.., 2H] and give [N.., H].
#include <algorithm>
#include <cstring>

#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

enum class Kind { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };

Kind KindOf(const std::string& op) {
  if (op.rfind("dbias_", 0) == 0) return Kind::kDbias;
  const bool gated = op.find("glu") != std::string::npos;
  // Backward names start with 'd' (dgelu, dswiglu, clamped_dswiglu).
  const bool bwd = op[0] == 'd' || op == "clamped_dswiglu";
  if (gated) return bwd ? Kind::kGatedBwd : Kind::kGatedFwd;
  return bwd ? Kind::kBwd : Kind::kFwd;
}

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1}, {3, 17}, {33, 129}, {2, 5, 64}, {64, 1024}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

}  // namespace

std::vector<Case> ActivationCases(const std::string& op, const GridOptions& o) {
  // The fused FP8-output variants (family activation): cases_quantization.cpp.
  if (op.size() > 4 && op.compare(op.size() - 4, 4, "_fp8") == 0) return QuantizationCases(op, o);
  std::vector<Case> out;
  const Kind kind = KindOf(op);
  const bool clamped = op.rfind("clamped_", 0) == 0;
  for (const std::vector<int64_t>& xs : Shapes(o)) {
    if (xs.empty()) continue;
    std::vector<int64_t> wide = xs;  // gated input: [N.., 2H]
    wide.back() *= 2;
    const int64_t h = xs.back();
    for (DType t : DTypes(o)) {
      Case c;
      c.op = op;
      c.dtype = DTypeName(t);
      c.shape = ShapeString(xs);
      const std::string seed = op + c.dtype + c.shape;
      // [-4, 4): both sides of every kink and clamp limit 7 not reached;
      // clamped ops get [-9, 9) so that the clamps act.
      const double lo = clamped ? -9.0 : -4.0, hi = -lo;
      switch (kind) {
        case Kind::kFwd:
          c.inputs = {Input(t, xs, "x" + seed, lo, hi)};
          c.outputs = {Output(t, xs)};
          break;
        case Kind::kBwd:
          c.inputs = {Input(t, xs, "g" + seed), Input(t, xs, "x" + seed, lo, hi)};
          c.outputs = {Output(t, xs)};
          break;
        case Kind::kGatedFwd:
          c.inputs = {Input(t, wide, "x" + seed, lo, hi)};
          c.outputs = {Output(t, xs)};
          break;
        case Kind::kGatedBwd:
          c.inputs = {Input(t, xs, "g" + seed), Input(t, wide, "x" + seed, lo, hi)};
          c.outputs = {Output(t, wide)};
          break;
        case Kind::kDbias:
          c.inputs = {Input(t, xs, "g" + seed), Input(t, xs, "x" + seed, lo, hi)};
          c.outputs = {Output(t, xs), Output(t, {h})};
          break;
      }
      for (const Tensor& t_out : c.outputs) {
        (void)t_out;
        c.tolerances.push_back(ToleranceFor(t));
      }
      // dbias is a column sum over every row: fp32 rounding of the partial
      // sums is allowed at a reduction's tolerance (as norm dgamma).
      if (kind == Kind::kDbias) {
        const Tolerance d = ToleranceFor(t);
        c.tolerances[1] = {std::max(1e-5, d.atol), std::max(1e-4, d.rtol)};
      }
      if (clamped) c.attrs = AttrBytes(tefl_clamped_swiglu_attrs{TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f});
      c.exact.assign(c.outputs.size(), false);
      out.push_back(std::move(c));
      if (o.first_only) return out;
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
