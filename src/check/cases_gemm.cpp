// Built-in cases of the GEMM ops (spec/ops.md "GEMM", docs/ops-gemm.md).
//
// generic_gemm: per dtype, the three TE products in row-major form (fprop
// with bias, with bias + GELU (pre_gelu_out too), wgrad with the bias
// gradient) and TE's DGELU epilogue (dgrad with gelu and grad: pre_gelu_out
// an input, bias_grad the column sums of D), each over a few shapes; absent
// optional outputs are NULL. te_general_grouped_gemm: plain, transb + bias +
// GELU, wgrad (transa, grad), FP8 E4M3 operands with per-group scale_inv,
// DGELU.
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

// A sum over `rows` GEMM results (DGELU's bias_grad): their errors add up.
Tolerance SumTolerance(DType t, int64_t k, int64_t rows) {
  const Tolerance d = ToleranceFor(t);
  const Tolerance g = GemmTolerance(t, k);
  return {std::max(d.atol, g.atol * 1.2 * double(std::max<int64_t>(rows, 1))), g.rtol};
}

}  // namespace

namespace {

// generic_gemm cases. Shapes [M, K] x [K, N]: tiny, skinny, odd, mid-size.
std::vector<Case> GenericGemmCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  std::vector<std::array<int64_t, 3>> shapes = {{1, 1, 1}, {1, 40, 37}, {33, 1, 129}, {65, 96, 72}};
  if (o.shape) {  // [M, K], N = K; any other rank: no case (never a grid shape in its place)
    if (o.shape->size() != 2) return out;
    shapes = {{(*o.shape)[0], (*o.shape)[1], (*o.shape)[1]}};
  }
  for (const auto& [m, n, k] : shapes) {
    for (DType t : DTypes(o)) {
      for (int variant = 0; variant < 4; ++variant) {  // fprop + bias; + GELU; wgrad with bias_grad; DGELU
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString({m, k});
        static const char* const kNotes[] = {"fprop (transb), bias", "fprop (transb), bias, gelu",
                                             "wgrad (transa), grad", "dgrad, gelu with grad (DGELU), bias_grad"};
        c.note = kNotes[variant];
        const std::string seed = op + c.dtype + c.shape + c.note;
        tefl_gemm_attrs a{TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 0, 1.0f, 0.0f, 0, 0, 0, 0};
        if (variant < 2) a.transb = 1;  // D = x W^T: B is [N, K]
        if (variant == 1) a.gelu = 1;
        if (variant == 2) a.transa = 1, a.grad = 1;  // D = dy^T x: A is [K, M]
        if (variant == 3) a.gelu = 1, a.grad = 1;    // D = (dy W) * gelu'(pre), pre_gelu_out an input
        c.attrs = AttrBytes(a);
        c.inputs = {Input(t, variant == 2 ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k}, "A" + seed),
                    Input(t, variant < 2 ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n}, "B" + seed),
                    std::nullopt,
                    variant < 2 ? std::optional<Tensor>(Input(t, {n}, "bias" + seed)) : std::nullopt,
                    std::nullopt,
                    std::nullopt,
                    std::nullopt};
        c.outputs = {Output(t, {m, n}), variant == 3 ? Input(t, {m, n}, "P" + seed, -3.0, 3.0) : Output(t, {m, n}),
                     Output(t, {variant == 3 ? n : m}), Output(DType::kF32, {1})};
        c.output_absent = {false, variant != 1 && variant != 3, variant < 2, true};
        c.tolerances = {GemmTolerance(t, k), GemmTolerance(t, k),
                        variant == 3 ? SumTolerance(t, k, m) : GemmTolerance(t, k), ToleranceFor(DType::kF32)};
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
  if (o.shape && o.shape->size() != 2) return out;  // A's shape [S, K] only
  for (const GroupedShape& sh : Shapes(o)) {
    int64_t rows = 0;
    for (int64_t s : sh.splits) rows += s;
    const int64_t g = int64_t(sh.splits.size());
    for (DType t : DTypes(o)) {
      // plain; transb + bias + GELU; wgrad (transa, grad); FP8 E4M3 A/B with per-group scale_inv (transb); DGELU
      for (int variant = 0; variant < 5; ++variant) {
        static const char* const kNotes[] = {"", "transb, bias, gelu", "wgrad (transa: m_splits splits K), grad",
                                             "float8_e4m3fn A/B, per-group scale_inv, transb",
                                             "gelu with grad (DGELU), bias_grad"};
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString({rows, sh.k});
        c.note = kNotes[variant];
        const std::string seed = op + c.dtype + c.shape + c.note;
        const int transb = variant == 1 || variant == 3;
        tefl_gemm_attrs a{TEFL_GEMM_ATTRS_STRUCT_SIZE,
                          variant == 2,
                          transb,
                          1.0f,
                          1.0f,
                          0,
                          variant == 1 || variant == 4,
                          variant == 2 || variant == 4,
                          0};
        c.attrs = AttrBytes(a);
        Tensor splits(DType::kI64, {g});
        int64_t kmax = 0;
        for (int64_t i = 0; i < g; ++i) {
          splits.set(i, double(sh.splits[size_t(i)]));
          kmax = std::max(kmax, sh.splits[size_t(i)]);
        }
        const DType tab = variant == 3 ? DType::kE4M3 : t;
        const int64_t k = variant == 2 ? kmax : sh.k;  // the largest K of a group
        std::optional<Tensor> b_in;
        if (variant == 2)  // A [S, M = sh.k], B [S, N]
          b_in = Input(t, {rows, sh.n}, "B" + seed);
        else
          b_in = Input(tab, transb ? std::vector<int64_t>{g, sh.n, sh.k} : std::vector<int64_t>{g, sh.k, sh.n},
                       "B" + seed);
        std::optional<Tensor> a_si, b_si;
        if (variant == 3) {
          a_si = Tensor(DType::kF32, {g});
          b_si = Tensor(DType::kF32, {g});
          for (int64_t i = 0; i < g; ++i) a_si->set(i, 0.75 + 0.25 * double(i)), b_si->set(i, 1.25 - 0.125 * double(i));
        }
        c.inputs = {Input(tab, {rows, sh.k}, "A" + seed),
                    b_in,
                    splits,
                    variant == 1 ? std::optional<Tensor>(Input(t, {g, sh.n}, "bias" + seed)) : std::nullopt,
                    a_si,
                    b_si,
                    std::nullopt};
        const std::vector<int64_t> dshape =
            variant == 2 ? std::vector<int64_t>{g, sh.k, sh.n} : std::vector<int64_t>{rows, sh.n};
        c.outputs = {Output(t, dshape), variant == 4 ? Input(t, dshape, "P" + seed, -3.0, 3.0) : Output(t, dshape),
                     variant == 2   ? Output(t, {g, sh.k})
                     : variant == 4 ? Output(t, {g, sh.n})
                                    : Output(t, {1}),
                     Output(DType::kF32, {g})};
        c.output_absent = {false, variant != 4, variant != 2 && variant != 4, true};
        c.tolerances = {GemmTolerance(t, k), GemmTolerance(t, k),
                        variant == 4 ? SumTolerance(t, k, rows) : ToleranceFor(t), ToleranceFor(DType::kF32)};
        c.exact = {false, false, false, false};
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
