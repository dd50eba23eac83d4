// Built-in cases of the GEMM ops (spec/ops.md "GEMM", docs/ops-gemm.md).
//
// generic_gemm: per dtype, the three TE products in row-major form (fprop
// with bias, with bias + GELU (pre_gelu_out too), wgrad with the bias
// gradient), each over a few shapes; absent optional outputs are NULL.
// tests/conformance_gemm_test.cpp has the full grid (FP8, transposes,
// accumulate, alpha/beta, bad input).
//
// Tolerance: an implementation sums K products in fp32 in its own order, so
// the error against the double reference is bounded by ~K * 2^-24 * sum |a b|
// (|a|, |b| <= 2 here), not by TE's one-rounding rule; each output's
// tolerance is the larger of the two.
#include <algorithm>
#include <array>

#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

struct GroupedShape {
  std::vector<int64_t> splits;
  int64_t n, k;
};

std::vector<GroupedShape> Shapes(const GridOptions& o) {
  if (o.shape && o.shape->size() == 2) {  // A's shape [S, K]: three groups, the middle one empty; N = 64
    const int64_t s = (*o.shape)[0];
    return {{{s / 2, 0, s - s / 2}, 64, (*o.shape)[1]}};
  }
  return {{{3, 0, 17, 1}, 19, 37}, {{1}, 1, 1}, {{64, 0, 128, 64}, 256, 320}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

Tolerance GemmTolerance(DType t, int64_t k) {
  const Tolerance d = ToleranceFor(t);
  const double bound = double(k + 8) * 0x1p-24 * (4.0 * double(k) + 2.0);
  return {std::max(d.atol, bound), std::max(d.rtol, 1e-5 * double(k))};
}

}  // namespace

namespace {

// generic_gemm cases. Shapes [M, K] x [K, N]: tiny, skinny, odd, mid-size.
std::vector<Case> GenericGemmCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 40, 37}, {33, 1, 129}, {65, 96, 72}};
  if (o.shape && o.shape->size() == 2) shapes = {{(*o.shape)[0], (*o.shape)[1], (*o.shape)[1]}};  // [M, K], N = K
  for (const auto& [m, n, k] : shapes) {
    for (DType t : DTypes(o)) {
      for (int variant = 0; variant < 3; ++variant) {  // fprop + bias; + GELU; wgrad with bias_grad
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString({m, k});
        static const char* const kNotes[] = {"fprop (transb), bias", "fprop (transb), bias, gelu",
                                             "wgrad (transa), grad"};
        c.note = kNotes[variant];
        const std::string seed = op + c.dtype + c.shape + c.note;
        tefl_gemm_attrs a{TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 0, 1.0f, 0.0f, 0, 0, 0, 0};
        if (variant < 2) a.transb = 1;  // D = x W^T: B is [N, K]
        if (variant == 1) a.gelu = 1;
        if (variant == 2) a.transa = 1, a.grad = 1;  // D = dy^T x: A is [K, M]
        c.attrs = AttrBytes(a);
        c.inputs = {Input(t, variant == 2 ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, "A" + seed),
                    Input(t, variant < 2 ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, "B" + seed),
                    std::nullopt,
                    variant < 2 ? std::optional<Tensor>(Input(t, {n}, "bias" + seed)) : std::nullopt,
                    std::nullopt,
                    std::nullopt,
                    std::nullopt};
        c.outputs = {Output(t, {m, n}), Output(t, {m, n}), Output(t, {m}), Output(DType::kF32, {1})};
        c.output_absent = {false, variant != 1, variant != 2, true};
        c.tolerances = {GemmTolerance(t, k), GemmTolerance(t, k), GemmTolerance(t, k), ToleranceFor(DType::kF32)};
        c.exact = {false, false, false, false};
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace

std::vector<Case> GemmCases(const std::string& op, const GridOptions& o) {
  if (op == "generic_gemm") return GenericGemmCases(op, o);
  std::vector<Case> out;
  if (op != "te_general_grouped_gemm") return out;
  for (const GroupedShape& sh : Shapes(o)) {
    int64_t rows = 0;
    for (int64_t s : sh.splits) rows += s;
    const int64_t g = int64_t(sh.splits.size());
    for (DType t : DTypes(o)) {
      for (int variant = 0; variant < 2; ++variant) {  // plain; transb + bias + GELU
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString({rows, sh.k});
        c.note = variant ? "transb, bias, gelu" : "";
        const std::string seed = op + c.dtype + c.shape + c.note;
        tefl_gemm_attrs a{TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, variant, 1.0f, 1.0f, 0, variant, 0, 0};
        c.attrs = AttrBytes(a);
        Tensor splits(DType::kI64, {g});
        for (int64_t i = 0; i < g; ++i) splits.set(i, double(sh.splits[size_t(i)]));
        c.inputs = {
            Input(t, {rows, sh.k}, "A" + seed),
            Input(t, variant ? std::vector<int64_t>{g, sh.n, sh.k} : std::vector<int64_t>{g, sh.k, sh.n}, "B" + seed),
            splits};
        if (variant)
          c.inputs.push_back(Input(t, {g, sh.n}, "bias" + seed));
        else
          c.inputs.push_back(std::nullopt);
        c.outputs = {Output(t, {rows, sh.n})};
        c.tolerances = {GemmTolerance(t, sh.k)};
        c.exact = {false};
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
