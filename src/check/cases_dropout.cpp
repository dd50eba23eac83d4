// Built-in cases of the dropout ops (spec/ops.md, "Dropout"): the mask must
// match reference.cpp bit for bit (same seed and offset, same mask, on any
// implementation and thread count).
#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1}, {3, 17}, {33, 129}, {64, 1024}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

}  // namespace

std::vector<Case> DropoutCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  const bool fwd = op == "dropout_fwd";
  for (const std::vector<int64_t>& xs : Shapes(o)) {
    for (DType t : DTypes(o)) {
      for (float p : {0.1f, 0.5f}) {
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString(xs);
        c.note = "p " + std::string(p == 0.1f ? "0.1" : "0.5");
        const std::string seed = op + c.dtype + c.shape + c.note;
        const tefl_dropout_attrs a{TEFL_DROPOUT_ATTRS_STRUCT_SIZE, 1234, 8, p};
        c.attrs = AttrBytes(a);
        Tensor x = Input(t, xs, "x" + seed);
        if (fwd) {
          c.inputs = {x};
          c.outputs = {Output(t, xs), Output(DType::kU8, xs)};
          c.tolerances = {ToleranceFor(t), {0, 0}};
          c.exact = {false, true};
        } else {
          Tensor y = Output(t, xs), mask = Output(DType::kU8, xs);
          if (!DescribingOnly() &&
              !RunPinned("dropout_fwd", "reference.cpp", {&x.dl()}, {y.ptr(), mask.ptr()}, &a).ok())
            continue;
          c.inputs = {Input(t, xs, "dy" + seed), mask};
          c.outputs = {Output(t, xs)};
          c.tolerances = {ToleranceFor(t)};
          c.exact = {false};
        }
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
