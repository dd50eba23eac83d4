// Conformance of every registered implementation of the softmax ops against
// the oracle, reference.cpp, with TransformerEngine's softmax tolerances
// (spec/ops.md: atol 2e-3 for bf16, 1e-4 otherwise; rtol by the dtype rule).
//
// Also: the reference backward against central finite differences of a
// double-precision forward written here, the backward in place, bad inputs
// (error naming op, argument and expectation; outputs untouched), NaN/Inf
// rows, fully masked rows, and large aligned outputs (streaming stores).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "backends/portable/cpu_paths.h"
#include "test_support.h"

namespace {

using tefl::DType;
using tefl::Status;
using tefl::testing::Compare;
using tefl::testing::CompareResult;
using tefl::testing::CpuImplementations;
using tefl::testing::MustServe;
using tefl::testing::RunImpl;
using tefl::testing::RunImplDL;
using tefl::testing::Tensor;
using tefl::testing::Tolerance;
using tefl::testing::ToleranceFor;
using tefl::testing::WithPortableSwitch;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;

enum class Variant { kPlain, kMasked, kUpperTriang, kAlignedCausal };
struct OpInfo {
  const char* fwd;
  const char* bwd;
  Variant v;
};
const OpInfo kOps[] = {
    {"scaled_softmax_forward", "scaled_softmax_backward", Variant::kPlain},
    {"scaled_masked_softmax_forward", "scaled_masked_softmax_backward", Variant::kMasked},
    {"scaled_upper_triang_masked_softmax_forward", "scaled_upper_triang_masked_softmax_backward",
     Variant::kUpperTriang},
    {"scaled_aligned_causal_masked_softmax_forward", "scaled_aligned_causal_masked_softmax_backward",
     Variant::kAlignedCausal},
};

// TE's softmax tolerance for an output dtype.
Tolerance SoftmaxTolerance(DType t) { return {t == DType::kBF16 ? 2e-3 : 1e-4, ToleranceFor(t).rtol}; }

const char* Short(DType t) { return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16"; }

std::string ShapeName(const std::vector<int64_t>& s) {
  std::string n;
  for (size_t i = 0; i < s.size(); ++i) n += (i ? "x" : "") + std::to_string(s[i]);
  return n;
}

Tensor Output(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  o.Fill(kSentinel);
  return o;
}

// A mask [mb, 1, sq, sk] with ~30% masked, and row 1 of the first batch
// fully masked when sq > 1.
Tensor MakeMask(int64_t mb, int64_t sq, int64_t sk, const std::string& seed) {
  Tensor m(DType::kU8, {mb, 1, sq, sk});
  Tensor u(DType::kF32, {mb, 1, sq, sk});
  u.Uniform("mask/" + seed, 0.0, 1.0);
  for (int64_t i = 0; i < m.numel(); ++i) m.set(i, u.at(i) < 0.3 ? 1 : 0);
  if (sq > 1 && mb > 0)
    for (int64_t j = 0; j < sk; ++j) m.set(sk + j, 1);
  return m;
}

tefl_softmax_attrs Attrs(float scale) { return {TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, scale}; }

// Runs op on every CPU implementation and compares with the reference.
// `in` are the inputs; `out_dtype`/`shape` the single output. `check` runs
// extra assertions on each result (reference included).
using ExtraCheck = std::function<void(const std::string& impl, const Tensor& out)>;
void CheckAll(const std::string& op, std::vector<Tensor> in, DType out_dtype, const std::vector<int64_t>& shape,
              float scale, const ExtraCheck& check = nullptr) {
  const tefl_softmax_attrs attrs = Attrs(scale);
  std::vector<Tensor*> inp;
  for (Tensor& t : in) inp.push_back(&t);
  Tensor ref = Output(out_dtype, shape);
  {
    const Status s = RunImpl(op, kReference, inp, {&ref}, &attrs);
    ASSERT_TRUE(s.ok()) << "reference: " << s.ToString();
    ASSERT_TRUE(ref.GuardsIntact());
    if (check) check(kReference, ref);
  }
  const std::vector<std::string> impls = CpuImplementations(op);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  for (const std::string& impl : impls) {
    SCOPED_TRACE("impl " + impl);
    std::vector<Tensor> run_in = in;
    std::vector<Tensor*> rp;
    for (Tensor& t : run_in) rp.push_back(&t);
    Tensor out = Output(out_dtype, shape);
    const Status s = RunImpl(op, impl, rp, {&out}, &attrs);
    if (!s.ok() && !MustServe(impl) && (s.code() == TEFL_FAILED_PRECONDITION || s.IsUnsupported())) {
      std::printf("[  NOTE    ] %s declined %s: %s\n", impl.c_str(), op.c_str(), s.message().c_str());
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_TRUE(run_in[i].SameBytes(in[i])) << "input " << i << " was modified";
      EXPECT_TRUE(run_in[i].GuardsIntact()) << "input " << i << " guards";
    }
    EXPECT_TRUE(out.GuardsIntact()) << "wrote outside the output";
    const Tolerance tol = SoftmaxTolerance(out_dtype);
    const CompareResult r = Compare(out, ref, tol);
    EXPECT_EQ(r.mismatches, 0) << op << " (" << tefl::DTypeName(out_dtype) << "): " << r.ToString()
                               << (r.first_bad >= 0
                                       ? fmt::format(" got {} want {}", out.at(r.first_bad), ref.at(r.first_bad))
                                       : std::string());
    if (check) check(impl, out);
  }
}

// The forward inputs of `info` on `shape` (rank 4, or 3 for upper-triang).
std::vector<Tensor> FwdInputs(const OpInfo& info, DType tx, const std::vector<int64_t>& shape, bool mask_broadcast,
                              const std::string& seed) {
  std::vector<Tensor> in;
  Tensor x(tx, shape);
  x.Uniform("x/" + seed, -4.0, 4.0);
  in.push_back(x);
  if (info.v == Variant::kMasked) in.push_back(MakeMask(mask_broadcast ? 1 : shape[0], shape[2], shape[3], seed));
  return in;
}

// y for the backward: the reference forward of the same variant, in dtype ty.
Tensor ForwardResult(const OpInfo& info, DType ty, const std::vector<int64_t>& shape, float scale,
                     const std::string& seed) {
  std::vector<Tensor> in = FwdInputs(info, DType::kF32, shape, true, seed);
  std::vector<Tensor*> p;
  for (Tensor& t : in) p.push_back(&t);
  Tensor y = Output(ty, shape);
  const tefl_softmax_attrs attrs = Attrs(scale);
  const Status s = RunImpl(info.fwd, kReference, p, {&y}, &attrs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return y;
}

// ---- The grid: op x dtypes x shape x scale x (mask broadcast) ----------------------------
// Forward: input a, output c. Backward: output_grads a, softmax_results b, input_grads c.
struct Combo {
  DType a, b, c;
};
const Combo kCombos[] = {
    {DType::kF32, DType::kF32, DType::kF32},   {DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kF16, DType::kF16, DType::kF16},   {DType::kBF16, DType::kF32, DType::kF32},
    {DType::kF32, DType::kBF16, DType::kBF16}, {DType::kF16, DType::kBF16, DType::kF32},
};

// Rank-4 shapes: sk = 1, non-multiples of the vector width, sq < sk and
// sq > sk (aligned causal), zero batches, and one long row.
const std::vector<int64_t> kShapes4[] = {{1, 1, 1, 1}, {2, 3, 5, 17}, {1, 2, 7, 33},   {2, 1, 3, 129}, {1, 2, 20, 7},
                                         {0, 2, 3, 8}, {2, 2, 8, 64}, {1, 1, 4, 2048}, {3, 2, 4, 1},   {1, 1, 2, 0}};
const std::vector<int64_t> kShapes3[] = {{1, 1, 1},   {3, 17, 17}, {2, 33, 33}, {1, 129, 129}, {0, 4, 4},
                                         {2, 64, 64}, {1, 5, 5},   {2, 0, 0},   {4, 2, 2},     {1, 40, 40}};
static_assert(std::size(kShapes3) == std::size(kShapes4));
// The scale of a case: kScales[shape index % 3].
constexpr float kScales[] = {1.0f, 0.125f, -2.5f};

// One test per (op, direction, shape); the dtype combos run inside it (one
// process per test under ctest: fewer, larger tests keep the suite fast).
using GridParam = std::tuple<int, bool, int>;  // op, backward, shape

const std::vector<int64_t>& ShapeOf(int op, int shape) {
  return kOps[op].v == Variant::kUpperTriang ? kShapes3[shape] : kShapes4[shape];
}

std::string ComboName(bool bwd, const Combo& c) {
  return bwd ? fmt::format("dy{}_y{}_dx{}", Short(c.a), Short(c.b), Short(c.c))
             : fmt::format("x{}_y{}", Short(c.a), Short(c.c));
}

std::string GridName(const GridParam& p) {
  const auto& [op, bwd, shape] = p;
  return fmt::format("{}_{}", bwd ? kOps[op].bwd : kOps[op].fwd, ShapeName(ShapeOf(op, shape)));
}

class SoftmaxConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(SoftmaxConformance, MatchesReference) {
  const auto& [op, bwd, shape_i] = GetParam();
  const OpInfo& info = kOps[op];
  const std::vector<int64_t>& shape = ShapeOf(op, shape_i);
  const float scale = kScales[shape_i % 3];
  for (const Combo& c : kCombos) {
    const std::string seed = GridName(GetParam()) + "_" + ComboName(bwd, c);
    SCOPED_TRACE(seed);
    if (!bwd) {
      for (bool broadcast : {false, true}) {
        if (broadcast && info.v != Variant::kMasked) continue;
        SCOPED_TRACE(broadcast ? "mask broadcast over batch" : "mask per batch");
        CheckAll(info.fwd, FwdInputs(info, c.a, shape, broadcast, seed), c.c, shape, scale);
      }
      continue;
    }
    Tensor dy(c.a, shape);
    dy.Uniform("dy/" + seed);
    CheckAll(info.bwd, {dy, ForwardResult(info, c.b, shape, scale, seed)}, c.c, shape, scale);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, SoftmaxConformance,
                         ::testing::Combine(::testing::Range(0, int(std::size(kOps))), ::testing::Bool(),
                                            ::testing::Range(0, int(std::size(kShapes4)))),
                         [](const ::testing::TestParamInfo<GridParam>& p) { return GridName(p.param); });

// ---- Finite differences ----------------------------------------------------------------
// A double-precision forward of each variant (scores scale * x in double, TE's
// -10000 for masked scores, 0 for rows with no kept column).
std::vector<double> ForwardDouble(Variant v, const std::vector<double>& x, const std::vector<int64_t>& shape,
                                  const Tensor* mask, double scale) {
  const int nd = int(shape.size());
  const int64_t sk = shape[size_t(nd - 1)], sq = shape[size_t(nd - 2)];
  const int64_t heads = nd == 4 ? shape[1] : 1;
  const int64_t rows = int64_t(x.size()) / std::max<int64_t>(sk, 1);
  std::vector<double> y(x.size(), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % sq;
    int64_t kept = sk;
    if (v == Variant::kUpperTriang) kept = std::min(sk, i + 1);
    if (v == Variant::kAlignedCausal) kept = std::clamp<int64_t>(i + sk - sq + 1, 0, sk);
    std::vector<double> s(static_cast<size_t>(kept));
    bool any = false;
    for (int64_t j = 0; j < kept; ++j) {
      bool masked = false;
      if (mask) {
        const int64_t b = r / (heads * sq);
        const int64_t mb = mask->shape()[0] == 1 ? 0 : b;
        masked = mask->at((mb * sq + i) * sk + j) != 0;
      }
      s[size_t(j)] = masked ? -10000.0 : scale * x[size_t(r * sk + j)];
      any = any || !masked;
    }
    if (!any) continue;
    const double mx = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& e : s) sum += (e = std::exp(e - mx));
    for (int64_t j = 0; j < kept; ++j) y[size_t(r * sk + j)] = s[size_t(j)] / sum;
  }
  return y;
}

TEST(SoftmaxReference, BackwardMatchesFiniteDifferences) {
  for (const OpInfo& info : kOps) {
    for (float scale : {1.0f, 0.5f, -1.5f}) {
      const std::vector<int64_t> shape = info.v == Variant::kUpperTriang     ? std::vector<int64_t>{2, 5, 5}
                                         : info.v == Variant::kAlignedCausal ? std::vector<int64_t>{2, 1, 6, 4}
                                                                             : std::vector<int64_t>{2, 2, 3, 7};
      const std::string seed = fmt::format("fd_{}_{}", info.fwd, scale);
      SCOPED_TRACE(seed);
      std::vector<Tensor> in = FwdInputs(info, DType::kF32, shape, false, seed);
      const Tensor* mask = info.v == Variant::kMasked ? &in[1] : nullptr;
      const int64_t n = in[0].numel();
      std::vector<double> x(static_cast<size_t>(n)), dy(static_cast<size_t>(n));
      Tensor dyt(DType::kF32, shape);
      dyt.Uniform("dy/" + seed);
      for (int64_t i = 0; i < n; ++i) x[size_t(i)] = in[0].at(i), dy[size_t(i)] = dyt.at(i);
      const std::vector<double> y = ForwardDouble(info.v, x, shape, mask, scale);

      // The double forward is the reference's forward (fp32 output).
      std::vector<Tensor*> p;
      for (Tensor& t : in) p.push_back(&t);
      Tensor yref = Output(DType::kF32, shape);
      const tefl_softmax_attrs attrs = Attrs(scale);
      ASSERT_TRUE(RunImpl(info.fwd, kReference, p, {&yref}, &attrs).ok());
      for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(yref.at(i), y[size_t(i)], 1e-6) << i;

      // Reference backward with y from the double forward.
      Tensor yt(DType::kF32, shape), dx = Output(DType::kF32, shape);
      for (int64_t i = 0; i < n; ++i) yt.set(i, y[size_t(i)]);
      ASSERT_TRUE(RunImpl(info.bwd, kReference, {&dyt, &yt}, {&dx}, &attrs).ok());

      // dL/dx_k of L = sum(dy * y(x)) by central differences.
      const double h = 1e-4;
      for (int64_t k = 0; k < n; ++k) {
        std::vector<double> xp = x, xm = x;
        xp[size_t(k)] += h;
        xm[size_t(k)] -= h;
        const std::vector<double> yp = ForwardDouble(info.v, xp, shape, mask, scale);
        const std::vector<double> ym = ForwardDouble(info.v, xm, shape, mask, scale);
        double lp = 0, lm = 0;
        for (int64_t i = 0; i < n; ++i) lp += dy[size_t(i)] * yp[size_t(i)], lm += dy[size_t(i)] * ym[size_t(i)];
        const double fd = (lp - lm) / (2 * h);
        EXPECT_NEAR(dx.at(k), fd, 1e-5 + 1e-5 * std::abs(fd)) << "element " << k;
      }
    }
  }
}

// ---- Backward in place ------------------------------------------------------------------
TEST(SoftmaxConformanceSpecial, BackwardInPlace) {
  for (const OpInfo& info : kOps) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      const std::vector<int64_t> shape =
          info.v == Variant::kUpperTriang ? std::vector<int64_t>{3, 37, 37} : std::vector<int64_t>{2, 2, 9, 37};
      const std::string seed = fmt::format("inplace_{}_{}", info.bwd, DTypeName(dt));
      SCOPED_TRACE(seed);
      const Tensor y = ForwardResult(info, dt, shape, 0.7f, seed);
      Tensor dy(dt, shape);
      dy.Uniform("dy/" + seed);
      const tefl_softmax_attrs attrs = Attrs(0.7f);
      Tensor ref = Output(dt, shape);
      Tensor dyc = dy, yc = y;
      ASSERT_TRUE(RunImpl(info.bwd, kReference, {&dyc, &yc}, {&ref}, &attrs).ok());
      for (const std::string& impl : CpuImplementations(info.bwd)) {
        SCOPED_TRACE(impl);
        Tensor out_of_place = Output(dt, shape);
        Tensor a = dy, b = y;
        const Status s1 = RunImpl(info.bwd, impl, {&a, &b}, {&out_of_place}, &attrs);
        // Any other implementation may decline (strict policy: FAILED_PRECONDITION).
        if (!MustServe(impl) && (s1.IsUnsupported() || s1.code() == TEFL_FAILED_PRECONDITION)) continue;
        ASSERT_TRUE(s1.ok()) << s1.ToString();
        Tensor inplace = dy, b2 = y;
        const Status s2 = RunImpl(info.bwd, impl, {&inplace, &b2}, {&inplace}, &attrs);
        ASSERT_TRUE(s2.ok()) << s2.ToString();
        EXPECT_TRUE(inplace.SameBytes(out_of_place)) << "in-place input_grads differ from out-of-place";
        EXPECT_TRUE(inplace.GuardsIntact());
        const CompareResult r = Compare(inplace, ref, SoftmaxTolerance(dt));
        EXPECT_EQ(r.mismatches, 0) << r.ToString();
      }
    }
  }
}

// A partial overlap (not the exact alias) is still rejected, and so is
// softmax_results over input_grads.
TEST(SoftmaxConformanceSpecial, BackwardPartialAliasRejected) {
  Tensor dy(DType::kF32, {1, 1, 4, 8}), y(DType::kF32, {1, 1, 4, 8});
  dy.Uniform("dy");
  y.Uniform("y");
  const tefl_softmax_attrs attrs = Attrs(1.0f);
  DLTensor shifted = dy.dl();
  std::vector<int64_t> small = {1, 1, 3, 8};
  DLTensor in0 = dy.dl();
  in0.shape = small.data();
  shifted.shape = small.data();
  shifted.byte_offset = 8 * 4;  // one row later: overlaps dy's rows 1-2
  Tensor y3(DType::kF32, {1, 1, 3, 8});
  const Status s = RunImplDL("scaled_softmax_backward", "default.portable", {&in0, y3.ptr()}, {&shifted}, &attrs);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.message();
  const Status s2 = RunImpl("scaled_softmax_backward", "default.portable", {&dy, &y}, {&y}, &attrs);
  EXPECT_FALSE(s2.ok());
}

// ---- Bad inputs ---------------------------------------------------------------------------
struct BadCase {
  std::string name, op;
  std::vector<Tensor> in;
  std::vector<int64_t> out_shape;
  DType out_dtype;
  float scale;
  std::vector<std::string> expect;  // substrings of the message
};

TEST(SoftmaxConformanceSpecial, BadInputsRejectedOutputsUntouched) {
  auto t = [](DType d, std::vector<int64_t> s) {
    Tensor x(d, std::move(s));
    x.Uniform("bad");
    return x;
  };
  const DType f = DType::kF32, u8 = DType::kU8;
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<BadCase> cases = {
      {"mask batch not 1 or b",
       "scaled_masked_softmax_forward",
       {t(f, {4, 2, 3, 5}), t(u8, {2, 1, 3, 5})},
       {4, 2, 3, 5},
       f,
       1.0f,
       {"scaled_masked_softmax_forward", "'mask'", "[4 or 1, 1, 3, 5]", "[2, 1, 3, 5]"}},
      {"mask over heads",
       "scaled_masked_softmax_forward",
       {t(f, {4, 2, 3, 5}), t(u8, {4, 2, 3, 5})},
       {4, 2, 3, 5},
       f,
       1.0f,
       {"'mask'", "[4 or 1, 1, 3, 5]"}},
      {"mask sq",
       "scaled_masked_softmax_forward",
       {t(f, {1, 2, 3, 5}), t(u8, {1, 1, 4, 5})},
       {1, 2, 3, 5},
       f,
       1.0f,
       {"'mask'", "[1, 1, 3, 5]", "[1, 1, 4, 5]"}},
      {"mask rank",
       "scaled_masked_softmax_forward",
       {t(f, {1, 2, 3, 5}), t(u8, {3, 5})},
       {1, 2, 3, 5},
       f,
       1.0f,
       {"'mask'"}},
      {"mask dtype float",
       "scaled_masked_softmax_forward",
       {t(f, {1, 2, 3, 5}), t(f, {1, 1, 3, 5})},
       {1, 2, 3, 5},
       f,
       1.0f,
       {"'mask'", "uint8"}},
      {"mask dtype int32",
       "scaled_masked_softmax_forward",
       {t(f, {1, 2, 3, 5}), t(DType::kI32, {1, 1, 3, 5})},
       {1, 2, 3, 5},
       f,
       1.0f,
       {"'mask'", "uint8"}},
      {"upper triang not square",
       "scaled_upper_triang_masked_softmax_forward",
       {t(f, {2, 3, 5})},
       {2, 3, 5},
       f,
       1.0f,
       {"scaled_upper_triang_masked_softmax_forward", "'input'", "square", "[2, 3, 5]"}},
      {"upper triang backward not square",
       "scaled_upper_triang_masked_softmax_backward",
       {t(f, {2, 3, 5}), t(f, {2, 3, 5})},
       {2, 3, 5},
       f,
       1.0f,
       {"'output_grads'", "square"}},
      {"upper triang rank 4",
       "scaled_upper_triang_masked_softmax_forward",
       {t(f, {1, 2, 3, 3})},
       {1, 2, 3, 3},
       f,
       1.0f,
       {"'input'", "rank 3"}},
      {"softmax rank 3",
       "scaled_softmax_forward",
       {t(f, {2, 3, 5})},
       {2, 3, 5},
       f,
       1.0f,
       {"scaled_softmax_forward", "'input'", "rank 4", "[2, 3, 5]"}},
      {"aligned causal rank 2",
       "scaled_aligned_causal_masked_softmax_forward",
       {t(f, {3, 5})},
       {3, 5},
       f,
       1.0f,
       {"'input'", "rank 4"}},
      {"output shape",
       "scaled_softmax_forward",
       {t(f, {1, 2, 3, 5})},
       {1, 2, 3, 6},
       f,
       1.0f,
       {"'softmax_results'", "[1, 2, 3, 5]", "[1, 2, 3, 6]"}},
      {"backward y shape",
       "scaled_softmax_backward",
       {t(f, {1, 2, 3, 5}), t(f, {1, 2, 5, 3})},
       {1, 2, 3, 5},
       f,
       1.0f,
       {"'softmax_results'", "[1, 2, 3, 5]"}},
      {"backward dx shape",
       "scaled_masked_softmax_backward",
       {t(f, {1, 2, 3, 5}), t(f, {1, 2, 3, 5})},
       {2, 2, 3, 5},
       f,
       1.0f,
       {"'input_grads'"}},
      {"integer input", "scaled_softmax_forward", {t(DType::kI32, {1, 1, 2, 2})}, {1, 1, 2, 2}, f, 1.0f, {"'input'"}},
      {"scale NaN", "scaled_softmax_forward", {t(f, {1, 1, 2, 2})}, {1, 1, 2, 2}, f, nan, {"'scale'"}},
      {"scale inf",
       "scaled_softmax_backward",
       {t(f, {1, 1, 2, 2}), t(f, {1, 1, 2, 2})},
       {1, 1, 2, 2},
       f,
       inf,
       {"'scale'"}},
  };
  for (BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    for (const std::string& impl : {std::string(kReference), std::string("default.portable")}) {
      std::vector<Tensor*> p;
      for (Tensor& x : c.in) p.push_back(&x);
      Tensor out = Output(c.out_dtype, c.out_shape);
      const Tensor pristine = out;
      const tefl_softmax_attrs attrs = Attrs(c.scale);
      const Status s = RunImpl(c.op, impl, p, {&out}, &attrs);
      ASSERT_FALSE(s.ok()) << impl;
      EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
      for (const std::string& e : c.expect)
        EXPECT_NE(s.message().find(e), std::string::npos) << "'" << e << "' not in: " << s.message();
      EXPECT_TRUE(out.SameBytes(pristine)) << "output written on error";
    }
  }
}

// ---- Special values and masks ----------------------------------------------------------
// Rows: 0 normal, 1 NaN at column 3, 2 +inf at column 5, 3 -inf at column 2,
// 4 all -inf. IEEE: NaN row -> NaN; +inf -> exp(inf - inf) = NaN, so NaN;
// -inf among finite -> 0 there; all -inf -> NaN (-inf - -inf).
TEST(SoftmaxConformanceSpecial, NanAndInfRows) {
  const double inf = std::numeric_limits<double>::infinity();
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (int64_t sk : {9, 64}) {
      const std::vector<int64_t> shape = {1, 1, 5, sk};
      const std::string seed = fmt::format("nan_{}_{}", DTypeName(dt), sk);
      SCOPED_TRACE(seed);
      Tensor x(dt, shape);
      x.Uniform(seed);
      x.set(1 * sk + 3, std::nan(""));
      x.set(2 * sk + 5, inf);
      x.set(3 * sk + 2, -inf);
      for (int64_t j = 0; j < sk; ++j) x.set(4 * sk + j, -inf);
      CheckAll("scaled_softmax_forward", {x}, dt, shape, 1.0f, [&](const std::string& impl, const Tensor& y) {
        SCOPED_TRACE(impl);
        for (int64_t j = 0; j < sk; ++j) {
          EXPECT_TRUE(std::isfinite(y.at(j))) << "row 0";
          EXPECT_TRUE(std::isnan(y.at(1 * sk + j))) << "row 1 (NaN) col " << j;
          EXPECT_TRUE(std::isnan(y.at(2 * sk + j))) << "row 2 (+inf) col " << j;
          EXPECT_TRUE(std::isnan(y.at(4 * sk + j))) << "row 4 (all -inf) col " << j;
          if (j == 2) {
            EXPECT_EQ(y.at(3 * sk + j), 0.0);
          } else {
            EXPECT_TRUE(std::isfinite(y.at(3 * sk + j)) && y.at(3 * sk + j) > 0) << "row 3 col " << j;
          }
        }
      });
      // Masked: a NaN under the mask is replaced by -10000 and does not
      // poison the row; causal: a NaN in a dropped column is ignored.
      Tensor m(DType::kU8, {1, 1, 5, sk});
      m.set(1 * sk + 3, 1);
      m.set(2 * sk + 5, 1);
      CheckAll("scaled_masked_softmax_forward", {x, m}, dt, shape, 1.0f, [&](const std::string& impl, const Tensor& y) {
        SCOPED_TRACE(impl);
        for (int64_t j = 0; j < sk; ++j) {
          EXPECT_TRUE(std::isfinite(y.at(1 * sk + j))) << "row 1 col " << j;
          EXPECT_TRUE(std::isfinite(y.at(2 * sk + j))) << "row 2 col " << j;
        }
      });
      Tensor xc(dt, {1, 1, 5, sk});
      xc.Uniform(seed + "c");
      xc.set(0 * sk + sk - 1, std::nan(""));  // row 0 keeps sk - 4 columns (i + sk - sq + 1)
      xc.set(1 * sk + sk - 1, inf);           // row 1 keeps sk - 3
      CheckAll("scaled_aligned_causal_masked_softmax_forward", {xc}, dt, shape, 1.0f,
               [&](const std::string& impl, const Tensor& y) {
                 SCOPED_TRACE(impl);
                 for (int64_t j = 0; j < sk; ++j) {
                   EXPECT_TRUE(std::isfinite(y.at(0 * sk + j))) << "row 0 col " << j;
                   EXPECT_TRUE(std::isfinite(y.at(1 * sk + j))) << "row 1 col " << j;
                 }
               });
    }
  }
}

// NaN in output_grads makes that row of input_grads NaN, only that row.
TEST(SoftmaxConformanceSpecial, NanInBackward) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    const std::vector<int64_t> shape = {1, 2, 3, 40};
    const Tensor y = ForwardResult(kOps[0], dt, shape, 1.0f, "nanbwd");
    Tensor dy(dt, shape);
    dy.Uniform("dy_nanbwd");
    dy.set(2 * 40 + 7, std::nan(""));
    CheckAll("scaled_softmax_backward", {dy, y}, dt, shape, 1.0f, [&](const std::string& impl, const Tensor& dx) {
      SCOPED_TRACE(impl);
      for (int64_t r = 0; r < 6; ++r)
        for (int64_t j = 0; j < 40; ++j)
          EXPECT_EQ(std::isnan(dx.at(r * 40 + j)), r == 2) << "row " << r << " col " << j;
    });
  }
}

// Fully masked rows and aligned-causal rows above the diagonal are exactly
// 0; upper-triangular rows are 0 right of the diagonal and sum to 1.
TEST(SoftmaxConformanceSpecial, EmptyRowsAreZero) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(dt));
    const std::vector<int64_t> shape = {2, 3, 4, 19};
    Tensor x(dt, shape);
    x.Uniform("empty_rows");
    Tensor m(DType::kU8, {1, 1, 4, 19});
    for (int64_t j = 0; j < 19; ++j) m.set(2 * 19 + j, 1);  // row 2 fully masked
    m.set(0 * 19 + 5, 1);
    CheckAll("scaled_masked_softmax_forward", {x, m}, dt, shape, 1.0f, [&](const std::string& impl, const Tensor& y) {
      SCOPED_TRACE(impl);
      for (int64_t r = 0; r < 24; ++r) {
        double sum = 0;
        for (int64_t j = 0; j < 19; ++j) sum += y.at(r * 19 + j);
        if (r % 4 == 2) {
          EXPECT_EQ(sum, 0.0) << "fully masked row " << r;
        } else {
          EXPECT_NEAR(sum, 1.0, 2e-2) << "row " << r;
        }
        if (r % 4 == 0) {
          EXPECT_EQ(y.at(r * 19 + 5), 0.0);
        }
      }
    });
    const std::vector<int64_t> tall = {1, 2, 9, 4};  // sq > sk: rows 0-4 keep nothing
    Tensor xt(dt, tall);
    xt.Uniform("tall");
    CheckAll("scaled_aligned_causal_masked_softmax_forward", {xt}, dt, tall, 1.0f,
             [&](const std::string& impl, const Tensor& y) {
               SCOPED_TRACE(impl);
               for (int64_t r = 0; r < 18; ++r) {
                 const int64_t i = r % 9, kept = std::clamp<int64_t>(i + 4 - 9 + 1, 0, 4);
                 for (int64_t j = kept; j < 4; ++j) EXPECT_EQ(y.at(r * 4 + j), 0.0) << r << "," << j;
                 for (int64_t j = 0; j < kept; ++j) EXPECT_GT(y.at(r * 4 + j), 0.0) << r << "," << j;
               }
             });
    const std::vector<int64_t> sq3 = {2, 21, 21};
    Tensor xs(dt, sq3);
    xs.Uniform("triang");
    CheckAll("scaled_upper_triang_masked_softmax_forward", {xs}, dt, sq3, 2.0f,
             [&](const std::string& impl, const Tensor& y) {
               SCOPED_TRACE(impl);
               for (int64_t r = 0; r < 42; ++r) {
                 const int64_t i = r % 21;
                 double sum = 0;
                 for (int64_t j = 0; j < 21; ++j) {
                   if (j > i) {
                     EXPECT_EQ(y.at(r * 21 + j), 0.0);
                   }
                   sum += y.at(r * 21 + j);
                 }
                 EXPECT_NEAR(sum, 1.0, 2e-2);
               }
             });
  }
}

// default.portable rounds bf16 y (forward) and dx (backward) with
// vcvtne2ps2bf16 where the CPU has AVX512-BF16; TEFL_PORTABLE_BF16_CVT=0
// forces Highway's integer rounding. Both give the same bits: rows with wide
// score ranges (subnormal and zero probabilities, where the instruction would
// read subnormals as 0 and the kernel falls back), NaN/inf rows, masked rows
// and odd widths (vector steps and tails).
TEST(SoftmaxConformanceSpecial, Bf16NativeStoreMatchesIntegerRounding) {
  const char* impl = "default.portable";
  const std::vector<int64_t> shape = {2, 3, 6, 83};
  Tensor x(DType::kBF16, shape), dy(DType::kBF16, shape), m(DType::kU8, {1, 1, 6, 83});
  x.Uniform("native_x");
  dy.Uniform("native_dy");
  for (int64_t j = 0; j < 83; ++j) {
    x.set(0 * 83 + j, x.at(j) * 60.0);                     // probabilities down to e^-120: subnormal and 0
    x.set(1 * 83 + j, j % 7 == 0 ? -1e30 : x.at(83 + j));  // zeros
    m.set(2 * 83 + j, j % 3 == 0);
  }
  x.set(3 * 83 + 5, std::nan(""));
  x.set(4 * 83 + 9, std::numeric_limits<double>::infinity());
  for (int64_t j = 0; j < 83; ++j) dy.set(5 * 83 + j, dy.at(5 * 83 + j) * 1e-36);  // subnormal dx
  const tefl_softmax_attrs attrs = Attrs(1.5f);
  for (const char* op : {"scaled_softmax_forward", "scaled_masked_softmax_forward"}) {
    SCOPED_TRACE(op);
    std::vector<Tensor*> in = {&x};
    if (std::string(op) == "scaled_masked_softmax_forward") in.push_back(&m);
    Tensor y0(DType::kBF16, shape), y1(DType::kBF16, shape);
    const Status s0 =
        WithPortableSwitch("TEFL_PORTABLE_BF16_CVT", "0", [&] { return RunImpl(op, impl, in, {&y0}, &attrs); });
    ASSERT_TRUE(s0.ok()) << s0.ToString();
    ASSERT_TRUE(RunImpl(op, impl, in, {&y1}, &attrs).ok());
    EXPECT_EQ(std::memcmp(y0.bytes(), y1.bytes(), y0.nbytes()), 0);
    // Backward on the forward's output.
    Tensor dx0(DType::kBF16, shape), dx1(DType::kBF16, shape);
    const Status b0 = WithPortableSwitch("TEFL_PORTABLE_BF16_CVT", "0", [&] {
      return RunImpl("scaled_softmax_backward", impl, {&dy, &y0}, {&dx0}, &attrs);
    });
    ASSERT_TRUE(b0.ok()) << b0.ToString();
    ASSERT_TRUE(RunImpl("scaled_softmax_backward", impl, {&dy, &y0}, {&dx1}, &attrs).ok());
    EXPECT_EQ(std::memcmp(dx0.bytes(), dx1.bytes(), dx0.nbytes()), 0);
    int64_t subnormal = 0;
    for (int64_t i = 0; i < y0.numel(); ++i) subnormal += y0.at(i) != 0 && std::fabs(y0.at(i)) < 1.1754944e-38;
    for (int64_t i = 0; i < dx0.numel(); ++i) subnormal += dx0.at(i) != 0 && std::fabs(dx0.at(i)) < 1.1754944e-38;
    EXPECT_GT(subnormal, 0) << "the data should reach the subnormal fallback";
  }
}

// default.portable's forward ops with bf16 outputs use a degree-3 exp
// (relative error 7.5e-5) unless TEFL_PORTABLE_BF16_FAST_ACT=0 (degree 4).
// Both must meet TE's bf16 softmax tolerance against the reference on rows
// with wide score ranges ([-30, 30], probabilities down to e^-60), odd
// widths (1, 17, 2049: vector steps and tails), a fully masked row (exactly
// 0), NaN and -inf scores; and the switch must change some bits (else the
// fast path was never taken).
TEST(SoftmaxConformanceSpecial, Bf16FastExpMatchesReference) {
  const char* impl = "default.portable";
  const double inf = std::numeric_limits<double>::infinity();
  int64_t differing = 0;
  for (const OpInfo& info : kOps) {
    for (int64_t sk : {1, 17, 2049}) {
      for (DType tx : {DType::kBF16, DType::kF32}) {
        const bool rank3 = info.v == Variant::kUpperTriang;
        const int64_t sq = rank3 ? sk : 5;  // upper-triang: square
        const std::vector<int64_t> shape = rank3 ? std::vector<int64_t>{1, sq, sk} : std::vector<int64_t>{2, 2, sq, sk};
        const std::string seed = fmt::format("fastexp_{}_{}_{}", info.fwd, sk, Short(tx));
        SCOPED_TRACE(seed);
        Tensor x(tx, shape);
        x.Uniform(seed, -30.0, 30.0);
        const int64_t rows = x.numel() / sk;
        if (rows > 3) {
          x.set(2 * sk + sk / 2, std::nan(""));  // row 2: NaN (kept column for every variant when sk > 1)
          x.set(3 * sk, -inf);                   // row 3: one -inf score (0 there)
        }
        std::vector<Tensor> in = {x};
        if (info.v == Variant::kMasked) in.push_back(MakeMask(2, sq, sk, seed));  // row 1: fully masked
        std::vector<Tensor*> p;
        for (Tensor& t : in) p.push_back(&t);
        const tefl_softmax_attrs attrs = Attrs(0.75f);
        Tensor ref = Output(DType::kBF16, shape);
        ASSERT_TRUE(RunImpl(info.fwd, kReference, p, {&ref}, &attrs).ok());
        Tensor y[2] = {Output(DType::kBF16, shape), Output(DType::kBF16, shape)};
        for (int fast = 0; fast < 2; ++fast) {
          SCOPED_TRACE(fast ? "TEFL_PORTABLE_BF16_FAST_ACT=1" : "TEFL_PORTABLE_BF16_FAST_ACT=0");
          const Status s = WithPortableSwitch("TEFL_PORTABLE_BF16_FAST_ACT", fast ? "1" : "0",
                                              [&] { return RunImpl(info.fwd, impl, p, {&y[fast]}, &attrs); });
          ASSERT_TRUE(s.ok()) << s.ToString();
          EXPECT_TRUE(y[fast].GuardsIntact());
          const CompareResult r = Compare(y[fast], ref, SoftmaxTolerance(DType::kBF16));
          EXPECT_EQ(r.mismatches, 0) << r.ToString()
                                     << (r.first_bad >= 0 ? fmt::format(" got {} want {}", y[fast].at(r.first_bad),
                                                                        ref.at(r.first_bad))
                                                          : std::string());
          for (int64_t i = 0; i < y[fast].numel(); ++i) {
            const double want = ref.at(i), got = y[fast].at(i);
            if (want == 0.0) {  // masked, dropped, -inf: exactly 0
              EXPECT_EQ(got, 0.0) << "element " << i;
            }
            if (std::isnan(want)) {
              EXPECT_TRUE(std::isnan(got)) << "element " << i;
            }
          }
          if (info.v == Variant::kMasked && sq > 1) {
            for (int64_t j = 0; j < sk; ++j) EXPECT_EQ(y[fast].at(sk + j), 0.0) << "fully masked row, col " << j;
          }
        }
        for (int64_t i = 0; i < y[0].numel(); ++i) differing += y[0].at(i) != y[1].at(i) && !std::isnan(y[0].at(i));
      }
    }
  }
  EXPECT_GT(differing, 0) << "TEFL_PORTABLE_BF16_FAST_ACT made no difference";
}

// Scores far above the exp's range: each score is rounded before the max is
// subtracted, so the max scores 0 exactly (a fused x * scale - max could
// exceed 0 by half an ulp of the max: the exp overflowed from ~1.5e9 on and
// the rows came out NaN or with -0). Finite x: no NaN, no negative output, and
// the reference's values, on both bf16 paths and the fp32 output.
TEST(SoftmaxConformanceSpecial, HugeScaleScoresStayFinite) {
  const char* impl = "default.portable";
  for (const OpInfo& info : kOps) {
    for (float scale : {3e9f, 1e20f, -1e20f, 1e37f}) {
      for (int64_t sk : {2, 17, 2049}) {
        for (DType ty : {DType::kBF16, DType::kF32}) {
          const bool rank3 = info.v == Variant::kUpperTriang;
          const int64_t sq = rank3 ? sk : 3;
          const std::vector<int64_t> shape =
              rank3 ? std::vector<int64_t>{1, sq, sk} : std::vector<int64_t>{1, 2, sq, sk};
          const std::string seed = fmt::format("hugescale_{}_{}_{}_{}", info.fwd, scale, sk, Short(ty));
          SCOPED_TRACE(seed);
          Tensor x(DType::kBF16, shape);
          x.Uniform(seed, -3.0, 3.0);
          x.set(0, 1.1015625);  // the audit's row: [1.1015625, 0] at scale 3e9 gave [NaN, NaN]
          x.set(1, 0.0);
          std::vector<Tensor> in = {x};
          if (info.v == Variant::kMasked) in.push_back(MakeMask(1, sq, sk, seed));
          std::vector<Tensor*> p;
          for (Tensor& t : in) p.push_back(&t);
          const tefl_softmax_attrs attrs = Attrs(scale);
          Tensor ref = Output(ty, shape);
          ASSERT_TRUE(RunImpl(info.fwd, kReference, p, {&ref}, &attrs).ok());
          for (int fast = 0; fast < (ty == DType::kBF16 ? 2 : 1); ++fast) {
            SCOPED_TRACE(fast ? "TEFL_PORTABLE_BF16_FAST_ACT=1" : "TEFL_PORTABLE_BF16_FAST_ACT=0");
            Tensor y = Output(ty, shape);
            const Status st = WithPortableSwitch("TEFL_PORTABLE_BF16_FAST_ACT", fast ? "1" : "0",
                                                 [&] { return RunImpl(info.fwd, impl, p, {&y}, &attrs); });
            ASSERT_TRUE(st.ok()) << st.ToString();
            for (int64_t i = 0; i < y.numel(); ++i) {
              ASSERT_FALSE(std::isnan(y.at(i))) << "element " << i << " (reference " << ref.at(i) << ")";
              ASSERT_FALSE(std::signbit(y.at(i))) << "element " << i << " is " << y.at(i);
            }
            const CompareResult r = Compare(y, ref, SoftmaxTolerance(ty));
            EXPECT_EQ(r.mismatches, 0) << r.ToString();
          }
        }
      }
    }
  }
}

// TE's masked score is exactly -10000 (not -inf): when the kept scores are
// near -10000 the masked columns take part. A row of x = -10000 (scale 1)
// with half its columns masked is uniform over every column; a row of
// -10003 with one column masked puts ~e^3 / (e^3 + sk - 1) on that column.
TEST(SoftmaxConformanceSpecial, MaskedScoreIsMinus10000) {
  for (int64_t sk : {8, 37}) {
    SCOPED_TRACE(sk);
    const std::vector<int64_t> shape = {1, 1, 2, sk};
    Tensor x(DType::kF32, shape);
    Tensor m(DType::kU8, {1, 1, 2, sk});
    for (int64_t j = 0; j < sk; ++j) {
      x.set(j, -10000.0);
      x.set(sk + j, -10003.0);
      m.set(j, j % 2);
    }
    m.set(sk + 1, 1);
    const double e3 = std::exp(3.0);
    CheckAll("scaled_masked_softmax_forward", {x, m}, DType::kF32, shape, 1.0f,
             [&](const std::string& impl, const Tensor& y) {
               SCOPED_TRACE(impl);
               for (int64_t j = 0; j < sk; ++j) {
                 EXPECT_NEAR(y.at(j), 1.0 / double(sk), 1e-6) << j;
                 EXPECT_NEAR(y.at(sk + j), (j == 1 ? e3 : 1.0) / (e3 + double(sk - 1)), 1e-6) << j;
               }
             });
  }
}

// Large outputs (>= 32 MiB) with 64-byte aligned rows: default.portable
// streams them with non-temporal stores, a path the grid never reaches.
TEST(SoftmaxConformanceSpecial, LargeAlignedOutputs) {
  struct Case {
    const char* op;
    DType t;
    std::vector<int64_t> shape;
  };
  // Aligned causal with sq > sk: empty, partial and full rows, all streamed.
  for (const Case& c : {Case{"scaled_aligned_causal_masked_softmax_forward", DType::kBF16, {1, 1, 8192, 2048}},
                        Case{"scaled_softmax_backward", DType::kBF16, {1, 1, 8192, 2048}}}) {
    const std::string seed = fmt::format("{}_{}_large", c.op, DTypeName(c.t));
    SCOPED_TRACE(seed);
    const bool bwd = std::string(c.op).find("backward") != std::string::npos;
    std::vector<Tensor> in;
    if (bwd) {
      Tensor dy(c.t, c.shape);
      dy.Uniform("dy" + seed);
      in.push_back(dy);
      in.push_back(ForwardResult(kOps[0], c.t, c.shape, 1.0f, seed));
    } else {
      Tensor x(c.t, c.shape);
      x.Uniform(seed, -4, 4);
      in.push_back(x);
    }
    std::vector<Tensor*> p;
    for (Tensor& x : in) p.push_back(&x);
    const tefl_softmax_attrs attrs = Attrs(1.0f);
    Tensor ref = Output(c.t, c.shape);
    ASSERT_TRUE(RunImpl(c.op, kReference, p, {&ref}, &attrs).ok());
    const int64_t numel = ref.numel();
    const size_t elem = c.t == DType::kF32 ? 4 : 2;
    for (const std::string& impl : CpuImplementations(c.op)) {
      SCOPED_TRACE(impl);
      Tensor buf(c.t, {numel + 64});
      buf.Fill(kSentinel);
      const Tensor pristine = buf;
      const uintptr_t addr = reinterpret_cast<uintptr_t>(buf.bytes());
      const uint64_t offset = (64 - addr % 64) % 64;
      ASSERT_EQ(offset % elem, 0u);
      DLTensor yv = buf.dl();
      std::vector<int64_t> shape = c.shape;
      yv.shape = shape.data();
      yv.ndim = int(shape.size());
      yv.byte_offset = offset;
      std::vector<const DLTensor*> inp;
      for (Tensor& x : in) inp.push_back(x.ptr());
      const Status s = RunImplDL(c.op, impl, inp, {&yv}, &attrs);
      // Any other implementation may decline (strict policy:
      // FAILED_PRECONDITION; oneDNN 2.6 has no bf16 softmax backward without
      // AVX-512), and must then have written nothing.
      if (!s.ok() && !MustServe(impl) && (s.IsUnsupported() || s.code() == TEFL_FAILED_PRECONDITION)) {
        EXPECT_EQ(std::memcmp(buf.bytes(), pristine.bytes(), buf.nbytes()), 0) << "declined after writing";
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(buf.GuardsIntact());
      const auto* b = static_cast<const unsigned char*>(buf.bytes());
      const auto* q = static_cast<const unsigned char*>(pristine.bytes());
      EXPECT_EQ(std::memcmp(b, q, offset), 0) << "wrote before the output";
      const size_t end = offset + size_t(numel) * elem;
      EXPECT_EQ(std::memcmp(b + end, q + end, buf.nbytes() - end), 0) << "wrote after the output";
      Tensor y(c.t, c.shape);
      std::memcpy(y.bytes(), b + offset, size_t(numel) * elem);
      const CompareResult r = Compare(y, ref, SoftmaxTolerance(c.t));
      EXPECT_EQ(r.mismatches, 0) << r.ToString();
    }
  }
}

TEST(SoftmaxConformanceSpecial, ImplementationsCovered) {
  for (const OpInfo& info : kOps) {
    for (const char* op : {info.fwd, info.bwd}) {
      const std::vector<std::string> ids = CpuImplementations(op);
      std::string list;
      for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
      std::printf("[  NOTE    ] %s: %s\n", op, list.c_str());
      for (const char* must : tefl::testing::kMustServeImpls)
        EXPECT_NE(std::find(ids.begin(), ids.end(), must), ids.end()) << op << " lacks " << must;
    }
  }
}

}  // namespace
