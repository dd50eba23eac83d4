// Built-in cases of the softmax ops (spec/ops.md, "Softmax"): the grid's
// shape is [b, h, sq, sk] ([b * h, sq, sq] for the upper-triangular
// variant, which needs sq == sk). Each shape runs with scale 1 and 0.125.
#include <algorithm>

#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1, 1, 1}, {2, 3, 5, 17}, {1, 2, 33, 33}, {2, 2, 16, 129}, {1, 4, 64, 256}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

Tolerance SoftmaxTol(DType t) {
  const Tolerance d = ToleranceFor(t);
  return {t == DType::kBF16 ? 2e-3 : 1e-4, d.rtol};
}

std::string ForwardOf(const std::string& op) {
  return op.substr(0, op.size() - std::string("backward").size()) + "forward";
}

}  // namespace

std::vector<Case> SoftmaxCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  const bool bwd = op.size() > 8 && op.compare(op.size() - 8, 8, "backward") == 0;
  const std::string fwd_op = bwd ? ForwardOf(op) : op;
  const bool masked = fwd_op == "scaled_masked_softmax_forward";
  const bool triang = fwd_op == "scaled_upper_triang_masked_softmax_forward";
  const bool aligned = fwd_op == "scaled_aligned_causal_masked_softmax_forward";
  for (std::vector<int64_t> xs : Shapes(o)) {
    if (xs.size() != 4) continue;
    if (triang) {
      if (xs[2] != xs[3]) continue;
      xs = {xs[0] * xs[1], xs[2], xs[3]};
    }
    if (aligned && xs[2] > xs[3]) continue;
    for (DType t : DTypes(o)) {
      for (float scale : {1.0f, 0.125f}) {
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString(xs);
        c.note = scale == 1.0f ? "scale 1" : "scale 0.125";
        const std::string seed = fwd_op + c.dtype + c.shape + c.note;
        c.attrs = AttrBytes(tefl_softmax_attrs{TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, scale});
        // Scores in [-8, 8): after scaling, rows from peaked to flat.
        Tensor x = Input(t, xs, "x" + seed, -8.0, 8.0);
        std::optional<Tensor> mask;
        if (masked) {
          // [b, 1, sq, sk], about a third masked; the first row of each
          // batch fully masked (its output must be 0).
          Tensor m(DType::kU8, {xs[0], 1, xs[2], xs[3]});
          if (!DescribingOnly() && m.numel() > 0) {  // (an empty mask may have 2^60 batch rows)
            Tensor u = Input(DType::kF32, {m.numel()}, "mask" + seed, 0.0, 1.0);
            for (int64_t i = 0; i < m.numel(); ++i) m.set(i, u.at(i) < 0.33 ? 1 : 0);
            for (int64_t b = 0; b < xs[0]; ++b)
              for (int64_t j = 0; j < xs[3]; ++j) m.set(b * xs[2] * xs[3] + j, 1);
          }
          mask = m;
        }
        if (!bwd) {
          c.inputs = {x};
          if (masked) c.inputs.push_back(mask);
        } else {
          // y from reference.cpp's forward of the same scores.
          Tensor y = Output(t, xs);
          std::vector<const DLTensor*> fin = {&x.dl()};
          if (masked) fin.push_back(&mask->dl());
          if (!DescribingOnly() && !RunPinned(fwd_op, "reference.cpp", fin, {y.ptr()}, c.attrs_ptr()).ok()) continue;
          c.inputs = {Input(t, xs, "dy" + seed), y};
        }
        c.outputs = {Output(t, xs)};
        c.tolerances = {SoftmaxTol(t)};
        c.exact = {false};
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
