// Built-in cases of the normalization ops (spec/ops.md, "Normalization").
#include <algorithm>

#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

constexpr float kEps = 1e-5f;

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1}, {3, 17}, {33, 129}, {4, 8, 256}, {64, 1024}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

// The statistics' shape: [N].
std::vector<int64_t> Rows(const std::vector<int64_t>& x) {
  int64_t n = 1;
  for (size_t d = 0; d + 1 < x.size(); ++d) n *= x[d];
  return {n};
}

Tolerance BackwardTol(DType t) {
  const Tolerance d = ToleranceFor(t);
  return {std::max(5e-4, d.atol), std::max(5e-4, d.rtol)};
}

}  // namespace

std::vector<Case> NormalizationCases(const std::string& op, const GridOptions& o) {
  // The fused FP8-output variants (family normalization): cases_quantization.cpp.
  if (op.size() > 4 && op.compare(op.size() - 4, 4, "_fp8") == 0) return QuantizationCases(op, o);
  std::vector<Case> out;
  const bool ln = op.rfind("layernorm", 0) == 0;
  const bool fwd = op == "layernorm_fwd" || op == "rmsnorm_fwd";
  for (const std::vector<int64_t>& xs : Shapes(o)) {
    if (xs.empty() || xs.back() < 1) continue;
    const int64_t h = xs.back();
    const std::vector<int64_t> ns = Rows(xs);
    for (DType t : DTypes(o)) {
      for (int zcg = 0; zcg < 2; ++zcg) {
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString(xs);
        c.note = zcg ? "zero_centered_gamma" : "";
        const std::string seed = op + c.dtype + c.shape + c.note;
        Tensor x = Input(t, xs, "x" + seed), gamma = Input(t, {h}, "gamma" + seed), beta = Input(t, {h}, "beta" + seed);
        if (fwd) {
          c.attrs = AttrBytes(tefl_norm_fwd_attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, kEps, zcg, 0});
          c.inputs = {x, gamma};
          if (ln) c.inputs.push_back(beta);
          c.outputs.push_back(Output(t, xs));
          c.tolerances.push_back(ToleranceFor(t));
          if (ln) {
            c.outputs.push_back(Output(DType::kF32, ns));
            c.tolerances.push_back({1e-6, 5e-5});
          }
          c.outputs.push_back(Output(DType::kF32, ns));
          c.tolerances.push_back({1e-6, 5e-5});
        } else {
          // Statistics from reference.cpp's forward of the same x.
          const tefl_norm_fwd_attrs fa{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, kEps, zcg, 0};
          Tensor z = Output(DType::kF32, xs), mu = Output(DType::kF32, ns), rsigma = Output(DType::kF32, ns);
          // (Not computed for a case that only describes a call.)
          const Status s =
              DescribingOnly() ? Status::OK()
              : ln             ? RunPinned("layernorm_fwd", "reference.cpp", {&x.dl(), &gamma.dl(), &beta.dl()},
                                           {z.ptr(), mu.ptr(), rsigma.ptr()}, &fa)
                   : RunPinned("rmsnorm_fwd", "reference.cpp", {&x.dl(), &gamma.dl()}, {z.ptr(), rsigma.ptr()}, &fa);
          if (!s.ok()) continue;
          c.attrs = AttrBytes(tefl_norm_bwd_attrs{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, zcg, 0});
          Tensor dz = Input(t, xs, "dz" + seed);
          c.inputs = {dz, x};
          if (op == "rmsnorm_bwd_add") c.inputs.push_back(Input(t, xs, "add" + seed));
          if (ln) c.inputs.push_back(mu);
          c.inputs.push_back(rsigma);
          c.inputs.push_back(gamma);
          c.outputs = {Output(t, xs), Output(t, {h})};
          if (ln) c.outputs.push_back(Output(t, {h}));
          c.tolerances.assign(c.outputs.size(), BackwardTol(t));
        }
        c.exact.assign(c.outputs.size(), false);
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
