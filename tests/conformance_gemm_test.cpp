// Conformance of every CPU implementation of the GEMM ops (generic_gemm,
// te_general_grouped_gemm) against the oracle, reference.cpp (a naive triple
// loop in double), plus: the reference against hand-computed values and an
// independent column-major statement of TransformerEngine's fprop/dgrad/wgrad
// calls (docs/ops-gemm.md's layout mapping), bad input (clear error, outputs
// untouched), NaN/Inf, zero sizes, grouped GEMM with an empty group, and
// concurrent calls.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
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
using tefl::testing::RunImplDL;
using tefl::testing::Tensor;
using tefl::testing::ToleranceFor;
using tefl::testing::WithPortableSwitch;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr const char* kGemm = "generic_gemm";
constexpr const char* kGrouped = "te_general_grouped_gemm";
constexpr double kSentinel = -31337.0;

bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
const char* Short(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kBF16:
      return "bf16";
    case DType::kF16:
      return "f16";
    case DType::kE4M3:
      return "e4m3";
    case DType::kE5M2:
      return "e5m2";
    default:
      return "?";
  }
}

tefl_gemm_attrs DefaultAttrs() { return {TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 0, 1.0f, 1.0f, 0, 0, 0, 0}; }

// ---- One call: positional tensors (absent optional ones are nullopt) ----------------
struct Problem {
  std::string op = kGemm;
  std::vector<std::optional<Tensor>> in, out;
  tefl_gemm_attrs attrs = DefaultAttrs();
  // K-aware error bound per element of D and pre_gelu_out (see MagnitudeOf).
  std::vector<double> magnitude;
  std::vector<double> col_magnitude;  // DGELU bias_grad: per column (per group), the sum of magnitude
  int64_t k = 0;

  std::vector<const DLTensor*> InPtrs() {
    std::vector<const DLTensor*> v;
    for (auto& t : in) v.push_back(t ? t->ptr() : nullptr);
    return v;
  }
  std::vector<DLTensor*> OutPtrs() {
    std::vector<DLTensor*> v;
    for (auto& t : out) v.push_back(t ? t->ptr() : nullptr);
    return v;
  }
  Status Run(const std::string& impl) { return RunImplDL(op, impl, InPtrs(), OutPtrs(), &attrs); }
};
// generic_gemm argument positions.
enum { kA, kB, kC, kBias, kAScaleInv, kBScaleInv, kDScale };
enum { kD, kPreGelu, kBiasGrad, kDAmax };

Tensor Sentinel(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  o.Fill(kSentinel);
  return o;
}
Tensor Scalar1(double v) {
  Tensor t(DType::kF32, {1});
  t.Fill(v);
  return t;
}

// Whether impl declined the call (a plugin's implementation may; the
// built-ins must serve). Prints the same NOTE line as CheckAll.
bool Declined(const std::string& impl, const std::string& op, const Status& s) {
  if (s.ok() || MustServe(impl) || !(s.code() == TEFL_FAILED_PRECONDITION || s.IsUnsupported())) return false;
  std::printf("[  NOTE    ] %s declined %s: %s\n", impl.c_str(), op.c_str(), s.message().c_str());
  return true;
}

// One generic_gemm case of the grid.
struct Epilogue {
  const char* name;
  bool c, bias, gelu, pre, grad, accumulate;
  float alpha, beta;
};
struct DTypes {
  DType a, b, d;
};

// sum over k of |alpha * op(A)[m, k] op(B)[k, n]| + |beta Cterm| + |bias|, in
// double with the same dequantization as the reference: the scale of the
// rounding error of any fp32 summation order of that element.
std::vector<double> MagnitudeOf(const Problem& p, int64_t m, int64_t n, int64_t k) {
  const tefl_gemm_attrs& at = p.attrs;
  const Tensor& a = *p.in[kA];
  const Tensor& b = *p.in[kB];
  const double sa = p.in[kAScaleInv] ? float(p.in[kAScaleInv]->at(0)) : 1.0;
  const double sb = p.in[kBScaleInv] ? float(p.in[kBScaleInv]->at(0)) : 1.0;
  std::vector<double> s(size_t(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      double acc = 0;
      for (int64_t kk = 0; kk < k; ++kk)
        acc +=
            std::fabs(a.at(at.transa ? kk * m + i : i * k + kk) * sa * b.at(at.transb ? j * k + kk : kk * n + j) * sb);
      double v = std::fabs(double(at.alpha)) * acc;
      if (p.in[kC]) v += std::fabs(double(at.beta) * p.in[kC]->at(i * n + j));
      if (at.accumulate) v += std::fabs(double(at.beta) * p.out[kD]->at(i * n + j));
      if (p.in[kBias]) v += std::fabs(p.in[kBias]->at(j));
      s[size_t(i * n + j)] = v;
    }
  return s;
}

// Relative spacing of an output dtype (one unit in the last place at 1).
double Ulp(DType t) {
  switch (t) {
    case DType::kBF16:
      return 0x1p-7;
    case DType::kF16:
      return 0x1p-10;
    case DType::kE4M3:
      return 0x1p-3;
    case DType::kE5M2:
      return 0x1p-2;
    default:
      return 0x1p-23;
  }
}

// The comparison for GEMM results. TE's element rule (ToleranceFor) assumes
// one rounding of an exact result; a BLAS sums K products in fp32 in its own
// blocked order, so its error against the double reference is bounded by
// gamma_K * sum_k |a_k b_k| ~= K * 2^-24 * magnitude (the standard
// worst-case bound for any summation order), plus a few roundings for the
// epilogue (alpha, beta C, bias, GELU whose slope is at most 1.13; FP8 D:
// d_scale multiplies everything) and the output rounding itself (<= 1 ulp
// of |r| each side). An element passes if TE's rule or that bound holds.
// The bound stays far below what a wrong element changes: dropping one
// product, a wrong bias or a misplaced row changes an element by about
// magnitude / K, which exceeds K * 2^-24 * magnitude for every K < 4000
// (the self-test KAwareComparisonCatchesOneWrongElement shows it).
CompareResult CompareGemm(const Tensor& got, const Tensor& want, const std::vector<double>& magnitude, int64_t k,
                          double factor) {
  const auto te = ToleranceFor(got.dtype());
  CompareResult r;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const double t = got.at(i), e = want.at(i);
    bool bad;
    if (std::isnan(e) || std::isnan(t)) {
      bad = std::isnan(e) != std::isnan(t);
    } else if (std::isinf(e) || std::isinf(t)) {
      bad = t != e;
    } else {
      const double diff = std::fabs(t - e);
      r.max_abs = std::max(r.max_abs, diff);
      if (e != 0) r.max_rel = std::max(r.max_rel, diff / std::fabs(e));
      const bool te_bad = diff > te.atol && (e == 0 || diff / std::fabs(e) > te.rtol);
      const double bound =
          double(k + 8) * 0x1p-24 * factor * magnitude[size_t(i)] + 2 * Ulp(got.dtype()) * std::fabs(e) + 1e-30;
      bad = te_bad && diff > bound;
    }
    if (bad) {
      if (r.first_bad < 0) r.first_bad = i;
      ++r.mismatches;
    }
  }
  return r;
}

Problem MakeGemm(const DTypes& dt, const Epilogue& ep, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                 const std::string& seed, bool with_magnitude = true) {
  Problem p;
  p.k = k;
  p.attrs.transa = ta;
  p.attrs.transb = tb;
  p.attrs.alpha = ep.alpha;
  p.attrs.beta = ep.beta;
  p.attrs.accumulate = ep.accumulate;
  p.attrs.gelu = ep.gelu;
  p.attrs.grad = ep.grad;
  const DType side = IsFp8(dt.d) ? DType::kF32 : dt.d;  // C, pre_gelu_out
  const DType vec = IsFp8(dt.a) ? DType::kBF16 : dt.a;  // bias, bias_grad
  p.in.resize(7);
  p.out.resize(4);
  p.in[kA] = Tensor(dt.a, ta ? std::vector<int64_t>{k, m} : std::vector<int64_t>{m, k});
  p.in[kA]->Uniform("A/" + seed);
  p.in[kB] = Tensor(dt.b, tb ? std::vector<int64_t>{n, k} : std::vector<int64_t>{k, n});
  p.in[kB]->Uniform("B/" + seed);
  if (ep.c) {
    p.in[kC] = Tensor(side, {m, n});
    p.in[kC]->Uniform("C/" + seed);
  }
  if (ep.bias) {
    p.in[kBias] = Tensor(vec, {n});
    p.in[kBias]->Uniform("bias/" + seed);
  }
  if (IsFp8(dt.a)) p.in[kAScaleInv] = Scalar1(0.75);  // not powers of two: scales are really applied
  if (IsFp8(dt.b)) p.in[kBScaleInv] = Scalar1(1.25);
  if (IsFp8(dt.d)) p.in[kDScale] = Scalar1(0.375);
  p.out[kD] = Sentinel(dt.d, {m, n});
  if (ep.accumulate) p.out[kD]->Uniform("D0/" + seed);
  if (ep.pre) p.out[kPreGelu] = Sentinel(side, {m, n});
  if (ep.pre && ep.gelu && ep.grad) p.out[kPreGelu]->Uniform("P/" + seed, -3.0, 3.0);  // DGELU: an input
  if (ep.grad) p.out[kBiasGrad] = Sentinel(vec, {ep.gelu ? n : m});
  if (IsFp8(dt.d)) p.out[kDAmax] = Sentinel(DType::kF32, {1});
  if (!with_magnitude) return p;  // a problem only run, never compared (MagnitudeOf costs M N K)
  p.magnitude = MagnitudeOf(p, m, n, k);
  p.col_magnitude.assign(size_t(n), 0.0);
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) p.col_magnitude[size_t(j)] += p.magnitude[size_t(i * n + j)];
  return p;
}

// Runs every CPU implementation on p and compares with the reference.
void CheckAll(Problem& p) {
  Problem ref = p;
  {
    const Status s = ref.Run(kReference);
    ASSERT_TRUE(s.ok()) << "reference: " << s.ToString();
  }
  const std::vector<std::string> impls = CpuImplementations(p.op);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  const double gelu_factor = p.attrs.gelu ? 1.2 : 1.0;
  double d_scale = 1.0;  // the largest (grouped: one per group)
  if (p.in.size() > kDScale && p.in[kDScale]) {
    d_scale = 0.0;
    for (int64_t i = 0; i < p.in[kDScale]->numel(); ++i) d_scale = std::max(d_scale, p.in[kDScale]->at(i));
  }
  for (const std::string& impl : impls) {
    if (impl == kReference) continue;
    SCOPED_TRACE("impl " + impl);
    Problem run = p;
    const Status s = run.Run(impl);
    if (Declined(impl, p.op, s)) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < run.in.size(); ++i) {
      if (!run.in[i]) continue;
      EXPECT_TRUE(run.in[i]->SameBytes(*p.in[i])) << "input " << i << " was modified";
      EXPECT_TRUE(run.in[i]->GuardsIntact()) << "input " << i << " guards";
    }
    for (size_t i = 0; i < run.out.size(); ++i) {
      if (!run.out[i]) continue;
      const Tensor& got = *run.out[i];
      const Tensor& want = *ref.out[i];
      EXPECT_TRUE(got.GuardsIntact()) << "wrote outside output " << i;
      CompareResult r;
      // Output positions: generic_gemm and the grouped GEMM agree (D, pre_gelu_out, bias_grad, d_amax).
      if (i == kBiasGrad && p.attrs.gelu) {  // DGELU: column sums of D, K-aware per element
        r = CompareGemm(got, want, p.col_magnitude, p.k, gelu_factor);
      } else if (i == kBiasGrad) {
        r = Compare(got, want, ToleranceFor(got.dtype()));
      } else if (i == kDAmax) {
        double max_mag = 0;
        for (double v : p.magnitude) max_mag = std::max(max_mag, v);
        const std::vector<double> mag1(size_t(got.numel()), max_mag);
        r = CompareGemm(got, want, mag1, p.k, gelu_factor);
      } else if (i == kPreGelu) {
        r = CompareGemm(got, want, p.magnitude, p.k, 1.0);
      } else {
        std::vector<double> mag = p.magnitude;
        for (double& v : mag) v *= d_scale;
        r = CompareGemm(got, want, mag, p.k, gelu_factor);
      }
      EXPECT_EQ(r.mismatches, 0) << "output " << i << " (" << tefl::DTypeName(got.dtype()) << "): " << r.ToString()
                                 << (r.first_bad >= 0
                                         ? fmt::format(" got {} want {}", got.at(r.first_bad), want.at(r.first_bad))
                                         : std::string());
    }
  }
}

// ---- The grid: dtypes x epilogue (parameters), x transposes x shapes (inner) --------
const DTypes kDTypes[] = {
    {DType::kF32, DType::kF32, DType::kF32},    {DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kF16, DType::kF16, DType::kF16},    {DType::kBF16, DType::kBF16, DType::kF32},
    {DType::kF32, DType::kF32, DType::kF16},    {DType::kE4M3, DType::kE4M3, DType::kBF16},
    {DType::kE4M3, DType::kE5M2, DType::kF32},  {DType::kE5M2, DType::kE4M3, DType::kE4M3},
    {DType::kE4M3, DType::kE4M3, DType::kE5M2},
};
const Epilogue kEpilogues[] = {
    {"plain", false, false, false, false, false, false, 1.0f, 1.0f},
    {"bias", false, true, false, false, false, false, 1.0f, 1.0f},
    {"gelu_bias_pre", false, true, true, true, false, false, 1.0f, 1.0f},
    {"gelu", false, false, true, false, false, false, 1.0f, 1.0f},
    {"c_alpha_beta", true, false, false, false, false, false, 0.5f, -1.5f},
    {"c_bias_beta0", true, true, false, false, false, false, 2.0f, 0.0f},
    {"accumulate", false, false, false, false, false, true, 1.0f, 1.0f},
    {"accumulate_beta_bias", false, true, false, false, false, true, -0.75f, 0.5f},
    {"grad", false, false, false, false, true, false, 1.0f, 1.0f},
    {"dgelu", false, false, true, true, true, false, 1.0f, 1.0f},               // TE's DGELU epilogue
    {"dgelu_c_alpha_beta", true, false, true, true, true, false, 0.5f, -1.5f},  // DGELU over alpha AB + beta C
};
struct Shape {
  int64_t m, n, k;
};
const Shape kShapes[] = {{1, 1, 1},     {1, 37, 129}, {129, 1, 37}, {33, 65, 37},
                         {17, 31, 129}, {0, 5, 7},    {6, 0, 7},    {5, 6, 0}};

class GemmConformance : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(GemmConformance, MatchesReference) {
  const DTypes& dt = kDTypes[std::get<0>(GetParam())];
  const Epilogue& ep = kEpilogues[std::get<1>(GetParam())];
  if (ep.accumulate && IsFp8(dt.d)) {  // rejected by validation: D's prior FP8 content has no defined scale
    Problem p = MakeGemm(dt, ep, 3, 4, 5, false, false, "fp8acc");
    for (const std::string& impl : CpuImplementations(kGemm))
      EXPECT_EQ(p.Run(impl).code(), TEFL_INVALID_ARGUMENT) << impl;
    return;
  }
  for (const Shape& s : kShapes)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={}", s.m, s.n, s.k, ta, tb));
      Problem p = MakeGemm(dt, ep, s.m, s.n, s.k, ta, tb, fmt::format("{}{}{}", s.m, s.n, s.k));
      CheckAll(p);
      if (::testing::Test::HasFatalFailure()) return;
    }
}

INSTANTIATE_TEST_SUITE_P(Grid, GemmConformance,
                         ::testing::Combine(::testing::Range(0, int(std::size(kDTypes))),
                                            ::testing::Range(0, int(std::size(kEpilogues)))),
                         [](const auto& pinfo) {
                           const DTypes& d = kDTypes[std::get<0>(pinfo.param)];
                           return fmt::format("{}_{}_to_{}_{}", Short(d.a), Short(d.b), Short(d.d),
                                              kEpilogues[std::get<1>(pinfo.param)].name);
                         });

// Large: 256 x 384 x 320 in a few configurations (BLAS blocking, threads).
TEST(GemmConformanceSpecial, Large) {
  struct L {
    DTypes dt;
    int epi;
    bool ta, tb;
  };
  const L cases[] = {{{DType::kF32, DType::kF32, DType::kF32}, 0, false, false},
                     {{DType::kBF16, DType::kBF16, DType::kBF16}, 2, false, true},
                     {{DType::kE4M3, DType::kE4M3, DType::kE4M3}, 1, true, false}};
  for (const L& c : cases) {
    SCOPED_TRACE(fmt::format("{} {}", Short(c.dt.a), kEpilogues[c.epi].name));
    Problem p = MakeGemm(c.dt, kEpilogues[c.epi], 256, 384, 320, c.ta, c.tb, "large");
    CheckAll(p);
  }
}

// The comparison is tight enough to see one wrong element: the reference
// result with one element changed by one product's worth fails.
TEST(GemmConformanceSpecial, KAwareComparisonCatchesOneWrongElement) {
  for (int64_t k : {37, 320}) {
    Problem p = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[0], 16, 24, k, false, false, "self");
    ASSERT_TRUE(p.Run(kReference).ok());
    Tensor bad = *p.out[kD];
    const int64_t e = 5 * 24 + 7;
    // one missing product term a[5, 3] * b[3, 7]
    bad.set(e, bad.at(e) - p.in[kA]->at(5 * k + 3) * p.in[kB]->at(3 * 24 + 7));
    EXPECT_EQ(CompareGemm(*p.out[kD], *p.out[kD], p.magnitude, k, 1.0).mismatches, 0);
    EXPECT_EQ(CompareGemm(bad, *p.out[kD], p.magnitude, k, 1.0).mismatches, 1) << "K = " << k;
  }
}

// ---- The reference against values worked out by hand ------------------------------
TEST(GemmReference, KnownValues) {
  Problem p;
  p.in.resize(7);
  p.out.resize(4);
  p.in[kA] = Tensor(DType::kF32, {2, 2});
  p.in[kB] = Tensor(DType::kF32, {2, 2});
  p.in[kC] = Tensor(DType::kF32, {2, 2});
  p.in[kBias] = Tensor(DType::kF32, {2});
  const double a[] = {1, 2, 3, 4}, b[] = {5, 6, 7, 8}, c[] = {1, -1, 2, -2}, bias[] = {10, 20};
  for (int i = 0; i < 4; ++i) {
    p.in[kA]->set(i, a[i]);
    p.in[kB]->set(i, b[i]);
    p.in[kC]->set(i, c[i]);
  }
  p.in[kBias]->set(0, bias[0]);
  p.in[kBias]->set(1, bias[1]);
  p.out[kD] = Sentinel(DType::kF32, {2, 2});
  p.attrs.alpha = 2.0f;
  p.attrs.beta = 3.0f;
  // A B = [[19, 22], [43, 50]]; 2 AB + 3 C + bias = [[51, 61], [102, 114]]
  for (const std::string& impl : CpuImplementations(kGemm)) {
    Problem run = p;
    const Status s = run.Run(impl);
    if (Declined(impl, kGemm, s)) continue;
    ASSERT_TRUE(s.ok()) << impl << ": " << s.ToString();
    const double want[] = {51, 61, 102, 114};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(run.out[kD]->at(i), want[i]) << impl << " element " << i;
  }
  // transa, transb: A^T B^T = (B A)^T; B A = [[23, 34], [31, 46]] -> [[23, 31], [34, 46]]
  p.in[kC].reset();
  p.in[kBias].reset();
  p.attrs = DefaultAttrs();
  p.attrs.transa = p.attrs.transb = 1;
  for (const std::string& impl : CpuImplementations(kGemm)) {
    Problem run = p;
    const Status s = run.Run(impl);
    if (Declined(impl, kGemm, s)) continue;
    ASSERT_TRUE(s.ok()) << impl << ": " << s.ToString();
    const double want[] = {23, 31, 34, 46};
    for (int i = 0; i < 4; ++i) EXPECT_EQ(run.out[kD]->at(i), want[i]) << impl << " element " << i;
  }
  // GELU (tanh form) of AB: gelu(19) = 19, and pre_gelu_out = AB; gelu(-1) by the formula.
  p.attrs = DefaultAttrs();
  p.attrs.gelu = 1;
  p.in[kA]->set(0, -1);  // row 0: [-1, 2] -> [9, 10]; shift with a bias of -10, -11: [-1, -1]
  p.in[kBias] = Tensor(DType::kF32, {2});
  p.in[kBias]->set(0, -10);
  p.in[kBias]->set(1, -11);
  p.out[kPreGelu] = Sentinel(DType::kF32, {2, 2});
  const double g1 = -1.0 * (0.5 + 0.5 * std::tanh(-1.0 * (0.79788456 + 0.03567741)));
  for (const std::string& impl : CpuImplementations(kGemm)) {
    Problem run = p;
    const Status s = run.Run(impl);
    if (Declined(impl, kGemm, s)) continue;
    ASSERT_TRUE(s.ok()) << impl << ": " << s.ToString();
    EXPECT_EQ(run.out[kPreGelu]->at(0), -1.0) << impl;
    EXPECT_EQ(run.out[kPreGelu]->at(1), -1.0) << impl;
    EXPECT_NEAR(run.out[kD]->at(0), g1, 1e-6) << impl;
    EXPECT_NEAR(run.out[kD]->at(3), 50 - 11, 1e-5) << impl;  // gelu(39) = 39 in fp32
  }
}

// ---- TransformerEngine's column-major calls and tefl's row-major statement --------
// TE (cuBLAS) computes, in column-major storage, D = op(A) op(B) with "TN"
// meaning transa = T, transb = N. ColMajorGemm is an independent statement
// of that (plain loops over column-major indices). tefl's documented
// mapping: the same memory, tefl A = TE's B, tefl B = TE's A, tefl transa =
// TE's transb, tefl transb = TE's transa.
std::vector<double> ColMajorGemm(const Tensor& a, int64_t lda_rows, const Tensor& b, int64_t ldb_rows, bool ta, bool tb,
                                 int64_t m, int64_t n, int64_t k) {
  // A col-major with lda_rows rows; op(A) is m x k; op(B) k x n; D m x n col-major.
  std::vector<double> d(size_t(m * n));
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < m; ++i) {
      double s = 0;
      for (int64_t kk = 0; kk < k; ++kk) {
        const double av = ta ? a.at(i * lda_rows + kk) : a.at(kk * lda_rows + i);
        const double bv = tb ? b.at(kk * ldb_rows + j) : b.at(j * ldb_rows + kk);
        s += av * bv;
      }
      d[size_t(j * m + i)] = s;
    }
  return d;
}

TEST(GemmLayout, TransformerEngineCallsMapToRowMajor) {
  const int64_t tokens = 7, in_f = 11, out_f = 5;
  Tensor x(DType::kF32, {tokens, in_f}), w(DType::kF32, {out_f, in_f}), dy(DType::kF32, {tokens, out_f});
  x.Uniform("x");
  w.Uniform("w");
  dy.Uniform("dy");
  struct Call {
    const char* name;
    const Tensor* te_a;
    const Tensor* te_b;
    bool te_ta, te_tb;
    int64_t m, n, k;     // TE's column-major m, n, k
    int64_t rows, cols;  // tefl's row-major D
  };
  // The column-major views: a row-major [r, c] tensor is a column-major [c, r]
  // matrix with leading dimension c.
  const Call calls[] = {
      // fprop "TN": A = W (col-major [in, out]), B = x (col-major [in, tokens]); D col [out, tokens] = y row [tokens,
      // out]
      {"fprop TN", &w, &x, true, false, out_f, tokens, in_f, tokens, out_f},
      // dgrad "NN": A = W (col [in, out]), B = dy (col [out, tokens]); D col [in, tokens] = dx row [tokens, in]
      {"dgrad NN", &w, &dy, false, false, in_f, tokens, out_f, tokens, in_f},
      // wgrad "NT": A = x (col [in, tokens]), B = dy (col [out, tokens]); D col [in, out] = dW row [out, in]
      {"wgrad NT", &x, &dy, false, true, in_f, out_f, tokens, out_f, in_f},
  };
  for (const Call& c : calls) {
    SCOPED_TRACE(c.name);
    const std::vector<double> te =
        ColMajorGemm(*c.te_a, c.te_a->shape()[1], *c.te_b, c.te_b->shape()[1], c.te_ta, c.te_tb, c.m, c.n, c.k);
    for (const std::string& impl : CpuImplementations(kGemm)) {
      SCOPED_TRACE(impl);
      Problem p;
      p.in.resize(7);
      p.out.resize(4);
      p.in[kA] = *c.te_b;
      p.in[kB] = *c.te_a;
      p.attrs.transa = c.te_tb;
      p.attrs.transb = c.te_ta;
      p.out[kD] = Sentinel(DType::kF32, {c.rows, c.cols});
      const bool wgrad = std::string(c.name) == "wgrad NT";
      if (wgrad) {  // TE: generic_gemm(x, dy, NT, grad=True) also returns grad_bias = dy.sum(0)
        p.attrs.grad = 1;
        p.out[kBiasGrad] = Sentinel(DType::kF32, {out_f});
      }
      const Status s = p.Run(impl);
      if (Declined(impl, kGemm, s)) continue;
      ASSERT_TRUE(s.ok()) << s.ToString();
      // Row-major D[r, c] is column-major D[c, r]: the same memory.
      for (int64_t i = 0; i < c.rows * c.cols; ++i)
        EXPECT_NEAR(p.out[kD]->at(i), te[size_t(i)], 1e-4 * (1 + std::fabs(te[size_t(i)]))) << "element " << i;
      // And the row-major meaning: fprop y = x W^T, dgrad dx = dy W, wgrad dW = dy^T x.
      for (int64_t r = 0; r < c.rows; ++r)
        for (int64_t q = 0; q < c.cols; ++q) {
          double want = 0;
          if (std::string(c.name) == "fprop TN")
            for (int64_t kk = 0; kk < in_f; ++kk) want += x.at(r * in_f + kk) * w.at(q * in_f + kk);
          else if (std::string(c.name) == "dgrad NN")
            for (int64_t kk = 0; kk < out_f; ++kk) want += dy.at(r * out_f + kk) * w.at(kk * in_f + q);
          else
            for (int64_t kk = 0; kk < tokens; ++kk) want += dy.at(kk * out_f + r) * x.at(kk * in_f + q);
          EXPECT_NEAR(p.out[kD]->at(r * c.cols + q), want, 1e-4 * (1 + std::fabs(want)));
        }
      if (wgrad)
        for (int64_t o = 0; o < out_f; ++o) {
          double sum = 0;
          for (int64_t t = 0; t < tokens; ++t) sum += dy.at(t * out_f + o);
          EXPECT_NEAR(p.out[kBiasGrad]->at(o), sum, 1e-5) << "grad_bias = dy.sum(0), column " << o;
        }
    }
  }
}

// ---- NaN and Inf ---------------------------------------------------------------
TEST(GemmConformanceSpecial, NanAndInfPropagate) {
  // 40 x 33 x 37: large enough for default.portable's bf16 dot-product path.
  const int64_t m = 40, n = 33, k = 37;
  for (int epi : {2, 1})  // GELU (epilogue pass); bias only (bf16: straight from the tiles)
    for (DType t : {DType::kF32, DType::kBF16}) {
      SCOPED_TRACE(fmt::format("{} {}", Short(t), kEpilogues[epi].name));
      Problem p = MakeGemm({t, t, t}, kEpilogues[epi], m, n, k, false, true, "naninf");
      p.in[kA]->set(2 * k + 4, std::nan(""));                             // row 2 of D: NaN
      p.in[kB]->set(5 * k + 3, std::numeric_limits<double>::infinity());  // column 5: +-inf or NaN
      p.in[kBias]->set(11, -std::numeric_limits<double>::infinity());     // column 11: -inf (gelu(-inf) NaN)
      p.magnitude = MagnitudeOf(p, m, n, k);
      for (double& v : p.magnitude)
        if (!std::isfinite(v)) v = 0;
      CheckAll(p);
      Problem ref = p;
      ASSERT_TRUE(ref.Run(kReference).ok());
      for (int64_t j = 0; j < n; ++j) EXPECT_TRUE(std::isnan(ref.out[kD]->at(2 * n + j))) << j;
      const Tensor& pre = epi == 2 ? *ref.out[kPreGelu] : *ref.out[kD];
      EXPECT_FALSE(std::isfinite(pre.at(0 * n + 5)));
      EXPECT_FALSE(std::isfinite(pre.at(0 * n + 11)));
    }
}

// d_amax is NaN when any element of D is NaN (as quantize's amax), on every
// implementation and path: a NaN in the first row of A, then rows whose |D|
// is far larger (the max must not drop the NaN for them), and a NaN in the
// last row only; fp32 and FP8 D, fp32 and bf16 operands (32^3 and more: the
// bf16 tiles then the epilogue pass), one and several threads' rows.
TEST(GemmConformanceSpecial, NanInDGivesNanAmax) {
  const int64_t m = 300, n = 40, k = 64;
  for (DType t : {DType::kF32, DType::kBF16})
    for (DType td : {DType::kF32, DType::kE4M3})
      for (int64_t nan_row : {int64_t(0), m - 1})
        for (const char* impl : {"default.portable", kReference}) {
          SCOPED_TRACE(
              fmt::format("{} x {} -> {}, NaN in row {} of A, {}", Short(t), Short(t), Short(td), nan_row, impl));
          Problem p = MakeGemm({t, t, td}, kEpilogues[0], m, n, k, false, false, "nanamax", false);
          for (int64_t i = 1; i < m; ++i) p.in[kA]->set(i * k, 1e30);  // |D| ~ 1e30 in rows after the first
          p.in[kA]->set(nan_row * k + 5, std::nan(""));
          p.out[kDAmax] = Sentinel(DType::kF32, {1});
          ASSERT_TRUE(p.Run(impl).ok());
          EXPECT_TRUE(std::isnan(p.out[kDAmax]->at(0))) << "d_amax = " << p.out[kDAmax]->at(0);
        }
}

// bf16 subnormal inputs count (the vdpbf16ps path would read them as 0, so
// default.portable falls back to the exact path when it sees one).
TEST(GemmConformanceSpecial, SubnormalBf16Inputs) {
  const int64_t m = 40, n = 48, k = 40;
  Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kF32}, kEpilogues[0], m, n, k, false, false, "subn");
  for (int64_t i = 0; i < m * k; ++i) p.in[kA]->set(i, p.in[kA]->at(i) * 1e-39);  // subnormal in bf16
  for (int64_t i = 0; i < k * n; ++i) p.in[kB]->set(i, p.in[kB]->at(i) * 1e38);
  p.magnitude = MagnitudeOf(p, m, n, k);
  CheckAll(p);
  Problem ref = p;
  ASSERT_TRUE(ref.Run(kReference).ok());
  double sum = 0;
  for (int64_t i = 0; i < m * n; ++i) sum += std::fabs(ref.out[kD]->at(i));
  EXPECT_GT(sum, 1.0) << "the products of subnormal A and large B are not negligible";
}

// The same past the first 2048-value blocks of the vectorised scan: B's
// first 4096 values are 0, the rest subnormal.
TEST(GemmConformanceSpecial, SubnormalBf16InputsLarge) {
  const int64_t m = 96, n = 64, k = 96;
  Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kF32}, kEpilogues[0], m, n, k, false, false, "subn2");
  for (int64_t i = 0; i < m * k; ++i) p.in[kA]->set(i, p.in[kA]->at(i) * 1e38);
  for (int64_t i = 0; i < k * n; ++i) p.in[kB]->set(i, i < 4096 ? 0.0 : p.in[kB]->at(i) * 1e-39);  // subnormal
  p.magnitude = MagnitudeOf(p, m, n, k);
  CheckAll(p);
  Problem ref = p;
  ASSERT_TRUE(ref.Run(kReference).ok());
  double sum = 0;
  for (int64_t i = 0; i < m * n; ++i) sum += std::fabs(ref.out[kD]->at(i));
  EXPECT_GT(sum, 1.0) << "the products of large A and subnormal B are not negligible";
}

// default.portable checks for subnormals while it packs the operands (each
// packing path its own way): one subnormal bf16 value, everything else in
// its operand zero and the other operand large, must reach D wherever it
// sits: full 8-row blocks (vector transpose and its leftover pairs), partial
// blocks/panels, an odd K's last pair, every transpose.
TEST(GemmConformanceSpecial, OneSubnormalAnywhereIsSeen) {
  const Shape shapes[] = {{40, 64, 40}, {37, 45, 41}};
  for (const Shape& sh : shapes)
    for (int t = 0; t < 4; ++t)
      for (int in_b = 0; in_b < 2; ++in_b) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t n_elems = in_b ? sh.k * sh.n : sh.m * sh.k;
        for (int64_t pos : {int64_t(0), n_elems / 2 + 3, n_elems - 1}) {
          SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} subnormal in {} at {}", sh.m, sh.n, sh.k, ta, tb,
                                   in_b ? "B" : "A", pos));
          Problem p =
              MakeGemm({DType::kBF16, DType::kBF16, DType::kF32}, kEpilogues[0], sh.m, sh.n, sh.k, ta, tb, "one_subn");
          Tensor& sub = *p.in[in_b ? kB : kA];
          Tensor& big = *p.in[in_b ? kA : kB];
          sub.Fill(0.0);
          sub.set(pos, 3e-39);  // subnormal in bf16
          big.Fill(1e38);
          p.magnitude = MagnitudeOf(p, sh.m, sh.n, sh.k);
          CheckAll(p);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
}

// The bf16 tiles (vdpbf16ps, AMX) also flush subnormal *products* to 0, so
// default.portable takes the exact path when a product of two nonzero
// inputs can fall below 2^-126 (the smallest magnitudes of A and B multiply
// to less), although no input is subnormal: 2^-64 somewhere in one operand
// (the rest 0) times 2^-63 everywhere in the other gives D entries of
// exactly 2^-127, which the tiles flushed to 0. Every packing and scanning
// path, both D dtypes (2^-127 is a bf16 subnormal too).
TEST(GemmConformanceSpecial, SubnormalProductsOfNormalInputsAreExact) {
  const double tiny = std::ldexp(1.0, -64), small = std::ldexp(1.0, -63), prod = std::ldexp(1.0, -127);
  const Shape shapes[] = {{40, 64, 40}, {37, 45, 42}, {70, 33, 41}, {96, 160, 64}};
  for (const Shape& sh : shapes)
    for (DType td : {DType::kF32, DType::kBF16})
      for (int t = 0; t < 4; ++t)
        for (int in_b = 0; in_b < 2; ++in_b) {
          const bool ta = t & 1, tb = t & 2;
          const int64_t n_elems = in_b ? sh.k * sh.n : sh.m * sh.k, pos = n_elems / 2 + 3;
          SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} D {}: 2^-64 in {} at {}", sh.m, sh.n, sh.k, ta, tb,
                                   Short(td), in_b ? "B" : "A", pos));
          Problem p = MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[0], sh.m, sh.n, sh.k, ta, tb, "tiny_prod");
          p.in[in_b ? kB : kA]->Fill(0.0);
          p.in[in_b ? kB : kA]->set(pos, tiny);
          p.in[in_b ? kA : kB]->Fill(small);
          ASSERT_TRUE(p.Run("default.portable").ok());
          // The row of D (A's element) or column (B's) the tiny value feeds.
          const int64_t row = ta ? pos % sh.m : pos / sh.k, col = tb ? pos / sh.k : pos % sh.n;
          int64_t wrong = 0;
          for (int64_t i = 0; i < sh.m; ++i)
            for (int64_t j = 0; j < sh.n; ++j) {
              const double want = (in_b ? j == col : i == row) ? prod : 0.0;
              wrong += p.out[kD]->at(i * sh.n + j) != want;
            }
          EXPECT_EQ(wrong, 0) << "D entries other than the exact 2^-127 / 0";
        }
  // 32 products of 2^-127 each sum to the normal 2^-122 (the reviewer's case: zero from the tiles).
  for (DType td : {DType::kF32, DType::kBF16}) {
    Problem p = MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[0], 64, 64, 32, false, false, "tiny_sum");
    p.in[kA]->Fill(small);
    p.in[kB]->Fill(tiny);
    ASSERT_TRUE(p.Run("default.portable").ok());
    EXPECT_EQ(p.out[kD]->at(0), std::ldexp(1.0, -122)) << Short(td);
    EXPECT_EQ(p.out[kD]->at(64 * 64 - 1), std::ldexp(1.0, -122)) << Short(td);
  }
}

// FP8 scale_inv far from 1: default.portable folds alpha * sa * sb into one
// factor where that is an fp32 normal; where it over- or underflows fp32
// (here 2^140 and 2^-160) while q * scale_inv per operand does not, the
// result must still be the maths' (reference.cpp, in double): finite and
// nonzero.
TEST(GemmConformanceSpecial, Fp8ScalesWhoseProductLeavesFp32) {
  struct Case {
    double q, s;  // every code of A and B, both scale_inv
    const char* what;
  };
  const Case cases[] = {{std::ldexp(1.0, -9), std::ldexp(1.0, 70), "sa * sb = 2^140"},
                        {448.0, std::ldexp(1.0, -60), "sa * sb = 2^-120"},
                        {448.0, std::ldexp(1.0, -75), "sa * sb = 2^-150"}};
  for (const Case& c : cases)
    for (const Shape& sh : {Shape{1, 1, 1}, Shape{40, 33, 24}}) {
      SCOPED_TRACE(fmt::format("{} {}x{}x{}", c.what, sh.m, sh.n, sh.k));
      Problem p = MakeGemm({DType::kE4M3, DType::kE4M3, DType::kF32}, kEpilogues[0], sh.m, sh.n, sh.k, false, false,
                           "fp8scale", false);
      p.in[kA]->Fill(c.q);
      p.in[kB]->Fill(c.q);
      p.in[kAScaleInv] = Scalar1(c.s);
      p.in[kBScaleInv] = Scalar1(c.s);
      Problem ref = p;
      ASSERT_TRUE(p.Run("default.portable").ok());
      ASSERT_TRUE(ref.Run(kReference).ok());
      const double want = ref.out[kD]->at(0), got = p.out[kD]->at(0);
      ASSERT_TRUE(std::isfinite(want) && want != 0.0) << want;
      EXPECT_NEAR(got, want, std::fabs(want) * 1e-6 + std::ldexp(1.0, -149) * double(sh.k)) << "D[0]";
      EXPECT_EQ(p.out[kD]->at(sh.m * sh.n - 1), got) << "every entry is the same sum";
    }
}

// bf16 A, B and D with no C, GELU or amax: default.portable packs and runs
// the tiles in one fork-join and, for an untransposed A with even K, reads A
// in place (no packing; the last row block re-reads its last row). Partial
// row blocks, partial column panels and groups, odd K (packed A), every
// transpose, with and without bias.
TEST(GemmConformanceSpecial, DirectBf16Output) {
  const Shape shapes[] = {{37, 45, 40}, {72, 100, 64}, {130, 33, 258}, {64, 128, 128}, {9, 200, 31}, {200, 9, 62}};
  for (const Shape& sh : shapes)
    for (int t = 0; t < 4; ++t)
      for (int epi : {0, 1}) {
        const bool ta = t & 1, tb = t & 2;
        SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} {}", sh.m, sh.n, sh.k, ta, tb, kEpilogues[epi].name));
        Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[epi], sh.m, sh.n, sh.k, ta, tb,
                             fmt::format("direct{}{}", sh.m, sh.k));
        CheckAll(p);
        if (::testing::Test::HasFatalFailure()) return;
      }
}

// As OneSubnormalAnywhereIsSeen, for the direct bf16-output path (its own
// packing schedule, and the in-place A read of an even K, checked by a scan):
// the subnormal must reach D, i.e. the call must take the exact path.
TEST(GemmConformanceSpecial, OneSubnormalAnywhereIsSeenBf16Output) {
  const Shape shapes[] = {{40, 64, 40}, {37, 45, 42}, {70, 33, 41}};
  for (const Shape& sh : shapes)
    for (int t = 0; t < 4; ++t)
      for (int in_b = 0; in_b < 2; ++in_b) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t n_elems = in_b ? sh.k * sh.n : sh.m * sh.k;
        for (int64_t pos : {int64_t(0), n_elems / 2 + 3, n_elems - 1}) {
          SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} subnormal in {} at {}", sh.m, sh.n, sh.k, ta, tb,
                                   in_b ? "B" : "A", pos));
          Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[0], sh.m, sh.n, sh.k, ta, tb,
                               "one_subn_bf16");
          Tensor& sub = *p.in[in_b ? kB : kA];
          Tensor& big = *p.in[in_b ? kA : kB];
          sub.Fill(0.0);
          sub.set(pos, 3e-39);  // subnormal in bf16
          big.Fill(1e38);
          p.magnitude = MagnitudeOf(p, sh.m, sh.n, sh.k);
          CheckAll(p);
          if (::testing::Test::HasFatalFailure()) return;
        }
      }
}

// The direct bf16-output path splits its tiles over the pool's threads by
// owner-first column groups with 64-row tasks stolen by whichever thread is
// free, so which thread computes a tile varies from call to call (and a call
// made while the pool is busy runs every participant inline). D must be the
// same bytes every time: repeated calls, and calls from two threads at once
// (one of them inline), against the first result. Shapes with several
// column groups (an odd number, a partial last one) and row tasks.
// n copies of p run on default.portable from two threads at once: each must
// succeed and write D with exactly want's bytes.
void ExpectConcurrentRunsMatch(const Problem& p, const Tensor& want, size_t n) {
  std::vector<Problem> runs(n, p);
  std::vector<bool> ok(runs.size(), false);
  auto body = [&](size_t i0) {
    for (size_t i = i0; i < runs.size(); i += 2) ok[i] = runs[i].Run("default.portable").ok();
  };
  std::thread other(body, size_t(1));
  body(0);
  other.join();
  for (size_t i = 0; i < runs.size(); ++i) {
    ASSERT_TRUE(ok[i]) << "concurrent call " << i;
    EXPECT_TRUE(runs[i].out[kD]->SameBytes(want)) << "concurrent call " << i;
  }
}

TEST(GemmConformanceSpecial, DirectBf16ScheduleIndependent) {
  const Shape shapes[] = {{136, 680, 96}, {300, 520, 64}, {520, 130, 62}};
  for (const Shape& sh : shapes)
    for (int epi : {0, 1}) {
      SCOPED_TRACE(fmt::format("{}x{}x{} {}", sh.m, sh.n, sh.k, kEpilogues[epi].name));
      Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[epi], sh.m, sh.n, sh.k, false, false,
                           fmt::format("sched{}{}", sh.m, sh.n));
      CheckAll(p);
      if (::testing::Test::HasFatalFailure()) return;
      Problem first = p;
      ASSERT_TRUE(first.Run("default.portable").ok());
      for (int rep = 0; rep < 8; ++rep) {
        Problem again = p;
        ASSERT_TRUE(again.Run("default.portable").ok());
        ASSERT_TRUE(again.out[kD]->SameBytes(*first.out[kD])) << "sequential call " << rep;
      }
      ExpectConcurrentRunsMatch(p, *first.out[kD], 8);
    }
}

// Expects that `path`'s kernel ran since the count `before` (PortablePathRuns)
// where its switch is on, and did not run where it is off.
void ExpectPathRanWhereOn(tefl::backends::PortablePath path, unsigned long long before) {
  const unsigned long long after = tefl::backends::PortablePathRuns(path);
  if (tefl::backends::PortablePathOn(path)) {
    EXPECT_GT(after, before) << "the path is on but did not run";
  } else {
    EXPECT_EQ(after, before) << "the path is off but ran";
  }
}

// Small inputs whose products stay fp32 normals keep the bf16 tiles: A of
// 2^-60 and B of 2^-60 (products 2^-120) run on AMX where it is on, and D is
// the exact 2^-120 * K.
TEST(GemmConformanceSpecial, SmallNormalProductsKeepTheTiles) {
  using tefl::backends::PortablePath;
  const unsigned long long amx_runs = tefl::backends::PortablePathRuns(PortablePath::kGemmAmx);
  for (DType td : {DType::kF32, DType::kBF16}) {
    Problem p = MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[0], 64, 96, 64, false, false, "small_prod");
    p.in[kA]->Fill(std::ldexp(1.0, -60));
    p.in[kB]->Fill(std::ldexp(1.0, -60));
    ASSERT_TRUE(p.Run("default.portable").ok());
    EXPECT_EQ(p.out[kD]->at(5), std::ldexp(1.0, -114)) << Short(td);
  }
  ExpectPathRanWhereOn(PortablePath::kGemmAmx, amx_runs);
}

// ---- te_general_grouped_gemm ------------------------------------------------------
// in: A B m_splits bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
enum { kGSplits = 2, kGBias = 3 };
struct GroupedCase {
  DType t, td;
  bool transb, bias, accumulate, gelu;
  float alpha, beta;
  bool transa = false, grad = false, pre = false, amax = false;
  DType tb = DType::kUnknown;  // B's dtype when it differs (FP8 mixes); kUnknown: t
  bool per_group_scales = true;
};

Problem MakeGrouped(const GroupedCase& c, const std::vector<int64_t>& splits, int64_t n, int64_t k_or_m) {
  Problem p;
  p.op = kGrouped;
  int64_t rows = 0, kmax = 0;
  for (int64_t s : splits) {
    rows += s;
    kmax = std::max(kmax, s);
  }
  const int64_t g = int64_t(splits.size());
  const bool dgelu = c.gelu && c.grad;
  const DType tb = c.tb == DType::kUnknown ? c.t : c.tb;
  // no transa: K = k_or_m, M of group = split; transa: M = k_or_m, K of group = split.
  const int64_t cols_a = k_or_m;
  p.k = c.transa ? kmax : k_or_m;
  p.attrs.transa = c.transa;
  p.attrs.transb = c.transb;
  p.attrs.accumulate = c.accumulate;
  p.attrs.gelu = c.gelu;
  p.attrs.grad = c.grad;
  p.attrs.alpha = c.alpha;
  p.attrs.beta = c.beta;
  const DType side = IsFp8(c.td) ? DType::kF32 : c.td;  // pre_gelu_out
  const DType vec = IsFp8(c.t) ? DType::kBF16 : c.t;    // bias, bias_grad
  p.in.resize(7);
  p.out.resize(4);
  p.in[kA] = Tensor(c.t, {rows, cols_a});
  p.in[kA]->Uniform("gA");
  if (c.transa)
    p.in[kB] = Tensor(tb, {rows, n});
  else
    p.in[kB] = Tensor(tb, c.transb ? std::vector<int64_t>{g, n, k_or_m} : std::vector<int64_t>{g, k_or_m, n});
  p.in[kB]->Uniform("gB");
  p.in[kGSplits] = Tensor(DType::kI64, {g});
  for (int64_t i = 0; i < g; ++i) p.in[kGSplits]->set(i, double(splits[size_t(i)]));
  if (c.bias) {
    p.in[kGBias] = Tensor(vec, {g, n});
    p.in[kGBias]->Uniform("gbias");
  }
  const int64_t ns = c.per_group_scales ? std::max<int64_t>(g, 1) : 1;
  auto scales = [&](double base) {
    Tensor t(DType::kF32, {ns});
    for (int64_t i = 0; i < ns; ++i) t.set(i, base * (1.0 + 0.25 * double(i % 3)));  // not powers of two
    return t;
  };
  if (IsFp8(c.t)) p.in[kAScaleInv] = scales(0.75);
  if (IsFp8(tb)) p.in[kBScaleInv] = scales(1.25);
  if (IsFp8(c.td)) p.in[kDScale] = scales(0.375);
  const std::vector<int64_t> dshape = c.transa ? std::vector<int64_t>{g, cols_a, n} : std::vector<int64_t>{rows, n};
  p.out[kD] = Sentinel(c.td, dshape);
  if (c.accumulate) p.out[kD]->Uniform("gD0");
  if (c.pre) p.out[kPreGelu] = Sentinel(side, dshape);
  if (c.pre && dgelu) p.out[kPreGelu]->Uniform("gP", -3.0, 3.0);
  if (c.grad)
    p.out[kBiasGrad] = dgelu ? Sentinel(vec, {g, n}) : c.transa ? Sentinel(vec, {g, cols_a}) : Sentinel(vec, {rows});
  if (c.amax) p.out[kDAmax] = Sentinel(DType::kF32, {g});
  // Magnitudes per element of D, group by group (and per column of each group for DGELU's bias_grad).
  const int64_t d_elems = p.out[kD]->numel();
  p.magnitude.assign(size_t(d_elems), 0.0);
  p.col_magnitude.assign(size_t(g * n), 0.0);
  auto scale_of = [&](int idx, int64_t grp) {
    return p.in[idx] ? float(p.in[idx]->at(p.in[idx]->numel() == 1 ? 0 : grp)) : 1.0;
  };
  int64_t row = 0;
  for (int64_t grp = 0; grp < g; ++grp) {
    const int64_t sp = splits[size_t(grp)];
    const int64_t m = c.transa ? cols_a : sp, k = c.transa ? sp : k_or_m;
    const int64_t d0 = c.transa ? grp * m * n : row * n;  // first element of D_g
    const double sa = scale_of(kAScaleInv, grp), sb = scale_of(kBScaleInv, grp);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0;
        for (int64_t kk = 0; kk < k; ++kk) {
          const double av = c.transa ? p.in[kA]->at((row + kk) * m + i) : p.in[kA]->at((row + i) * k + kk);
          const double bv = c.transa   ? p.in[kB]->at((row + kk) * n + j)
                            : c.transb ? p.in[kB]->at((grp * n + j) * k + kk)
                                       : p.in[kB]->at((grp * k + kk) * n + j);
          acc += std::fabs(av * sa * bv * sb);
        }
        double v = std::fabs(double(c.alpha)) * acc;
        if (c.accumulate) v += std::fabs(double(c.beta) * p.out[kD]->at(d0 + i * n + j));
        if (c.bias) v += std::fabs(p.in[kGBias]->at(grp * n + j));
        p.magnitude[size_t(d0 + i * n + j)] = v;
        p.col_magnitude[size_t(grp * n + j)] += v;
      }
    row += sp;
  }
  return p;
}

TEST(GroupedGemm, MatchesReferenceWithAnEmptyGroup) {
  const std::vector<int64_t> splits = {3, 0, 17, 1, 9};
  const GroupedCase cases[] = {
      {DType::kF32, DType::kF32, false, false, false, false, 1.0f, 1.0f},
      {DType::kF32, DType::kF32, true, true, false, false, 1.0f, 1.0f},
      {DType::kBF16, DType::kBF16, true, true, false, true, 1.0f, 1.0f},
      {DType::kF16, DType::kF16, false, true, true, false, 0.5f, 2.0f},
      {DType::kBF16, DType::kF32, true, false, true, false, 1.0f, 1.0f},
      // GELU with its pre-activation, amax
      {DType::kBF16, DType::kBF16, false, true, false, true, 1.0f, 1.0f, false, false, true, true},
      // FP8 operands with per-group scale_inv (E4M3 x E5M2), FP8 D with per-group d_scale and d_amax
      {DType::kE4M3, DType::kBF16, true, true, false, false, 1.0f, 1.0f, false, false, false, true, DType::kE5M2},
      {DType::kE4M3, DType::kE4M3, false, false, false, true, 1.0f, 1.0f, false, false, true, true},
      {DType::kE5M2, DType::kF32, false, false, false, false, 1.0f, 1.0f, false, false, false, false, DType::kE4M3,
       false},  // one scale_inv for all groups ([1])
      // grad: per-row sums of A (fprop/dgrad packing)
      {DType::kF32, DType::kF32, false, false, false, false, 1.0f, 1.0f, false, true},
      // DGELU: D_g = (A_g B_g) * gelu'(pre_gelu_out_g), bias_grad [G, N]
      {DType::kBF16, DType::kBF16, false, false, false, true, 1.0f, 1.0f, false, true, true},
      {DType::kF32, DType::kF16, true, false, true, true, 0.5f, -1.0f, false, true, true, true},
      // transa (TE wgrad "NT"): m_splits splits K; D [G, M, N]; grad: bias_grad [G, M]
      {DType::kF32, DType::kF32, false, false, false, false, 1.0f, 1.0f, true, true},
      {DType::kBF16, DType::kF32, false, true, true, false, 1.0f, 1.0f, true},
      {DType::kE4M3, DType::kBF16, false, false, false, false, 1.0f, 1.0f, true, true, false, true, DType::kE5M2},
      {DType::kF16, DType::kF16, false, false, false, true, 1.0f, 1.0f, true, true, true},  // transa + DGELU
  };
  for (const GroupedCase& c : cases) {
    SCOPED_TRACE(fmt::format("{}x{}->{} transa={} transb={} bias={} acc={} gelu={} grad={} pre={} amax={}", Short(c.t),
                             Short(c.tb == DType::kUnknown ? c.t : c.tb), Short(c.td), c.transa, c.transb, c.bias,
                             c.accumulate, c.gelu, c.grad, c.pre, c.amax));
    Problem p = MakeGrouped(c, splits, 19, 37);
    CheckAll(p);
  }
  // Groups large enough for default.portable's bf16 dot-product path (decided
  // per group), small groups included.
  const GroupedCase bf16_cases[] = {
      {DType::kBF16, DType::kBF16, true, true, false, false, 1.0f, 1.0f},   // bf16 D straight from the tiles
      {DType::kBF16, DType::kBF16, false, false, true, false, 1.0f, 0.5f},  // accumulate: fp32 scratch
      {DType::kBF16, DType::kF32, true, true, false, true, 2.0f, 1.0f},     // GELU epilogue, fp32 D
      {DType::kBF16, DType::kBF16, false, false, false, true, 1.0f, 1.0f, false, true, true, true},  // DGELU
      {DType::kBF16, DType::kBF16, false, false, false, false, 1.0f, 1.0f, true, true},              // wgrad, transa
  };
  for (const GroupedCase& c : bf16_cases) {
    SCOPED_TRACE(fmt::format("large {}->{} transa={} transb={} bias={} acc={} gelu={} grad={}", Short(c.t), Short(c.td),
                             c.transa, c.transb, c.bias, c.accumulate, c.gelu, c.grad));
    Problem p = MakeGrouped(c, {40, 0, 70, 5}, 48, 40);
    CheckAll(p);
  }
  // Every group empty, and no groups at all.
  for (const std::vector<int64_t>& s : {std::vector<int64_t>{0, 0}, std::vector<int64_t>{}}) {
    for (const GroupedCase& c : {cases[1], cases[9], cases[12]}) {
      Problem p = MakeGrouped(c, s, 4, 6);
      CheckAll(p);
    }
  }
}

// fp32 groups large enough for default.portable's own AVX-512 tiles next to
// smaller ones (OpenBLAS, decided per group) and an empty one: plain, bias
// with accumulate, and transa (m_splits splits K). Where the own tiles' switch
// is on, they ran; where it is off, they did not.
TEST(GroupedGemm, F32GroupsOnTheOwnTiles) {
  using tefl::backends::PortablePath;
  const GroupedCase cases[] = {
      {DType::kF32, DType::kF32, false, false, false, false, 1.0f, 1.0f},
      {DType::kF32, DType::kF32, true, true, true, false, 0.5f, 2.0f},
      {DType::kF32, DType::kF32, false, false, false, false, 1.0f, 1.0f, true},
  };
  for (const GroupedCase& c : cases) {
    SCOPED_TRACE(fmt::format("transa={} transb={} bias={} acc={}", c.transa, c.transb, c.bias, c.accumulate));
    // 200 x 160 x 300 (transa: 300 x 160 x 200) >= 2^23 multiply-adds; 37 and 150 below.
    Problem p = MakeGrouped(c, {0, 200, 37, 150}, 160, 300);
    const unsigned long long runs = tefl::backends::PortablePathRuns(PortablePath::kGemmF32Avx512);
    CheckAll(p);
    if (::testing::Test::HasFatalFailure()) return;
    ExpectPathRanWhereOn(PortablePath::kGemmF32Avx512, runs);
  }
}

// The grouped reference equals generic_gemm's reference group by group.
TEST(GroupedGemm, ReferenceEqualsGenericPerGroup) {
  const std::vector<int64_t> splits = {4, 0, 6};
  const int64_t n = 7, k = 5;
  Problem p = MakeGrouped({DType::kF32, DType::kF32, true, true, false, true, 1.0f, 1.0f}, splits, n, k);
  ASSERT_TRUE(p.Run(kReference).ok());
  int64_t row = 0;
  for (size_t grp = 0; grp < splits.size(); ++grp) {
    const int64_t m = splits[grp];
    Problem q;
    q.in.resize(7);
    q.out.resize(4);
    q.in[kA] = Tensor(DType::kF32, {m, k});
    q.in[kB] = Tensor(DType::kF32, {n, k});
    q.in[kBias] = Tensor(DType::kF32, {n});
    for (int64_t i = 0; i < m * k; ++i) q.in[kA]->set(i, p.in[0]->at(row * k + i));
    for (int64_t i = 0; i < n * k; ++i) q.in[kB]->set(i, p.in[1]->at(int64_t(grp) * n * k + i));
    for (int64_t j = 0; j < n; ++j) q.in[kBias]->set(j, p.in[3]->at(int64_t(grp) * n + j));
    q.attrs.transb = 1;
    q.attrs.gelu = 1;
    q.out[kD] = Sentinel(DType::kF32, {m, n});
    ASSERT_TRUE(q.Run(kReference).ok());
    for (int64_t i = 0; i < m * n; ++i) EXPECT_EQ(q.out[kD]->at(i), p.out[0]->at(row * n + i)) << grp << " " << i;
    row += m;
  }
}

// te_general_grouped_gemm was first released as (A, B, m_splits, bias) -> (D);
// arguments were appended since. A call in that first form still runs, on
// every implementation and as a prepared call, with the later arguments
// absent, and gives what the full form with them NULL gives. Other counts are
// an error naming both forms.
TEST(GroupedGemm, FirstReleasedFormStillRuns) {
  const std::vector<int64_t> splits = {3, 0, 5};
  Problem full = MakeGrouped({DType::kF32, DType::kF32, true, true, false, true, 1.0f, 1.0f}, splits, 6, 4);
  for (size_t i = 4; i < full.in.size(); ++i) full.in[i].reset();
  for (size_t i = 1; i < full.out.size(); ++i) full.out[i].reset();
  for (const std::string& impl : CpuImplementations(kGrouped)) {
    SCOPED_TRACE(impl);
    Problem a = full, b = full;
    std::vector<const DLTensor*> in = a.InPtrs();
    std::vector<DLTensor*> out = a.OutPtrs();
    in.resize(4);
    out.resize(1);
    const Status first = RunImplDL(kGrouped, impl, in, out, &a.attrs);
    if (Declined(impl, kGrouped, first)) continue;
    ASSERT_TRUE(first.ok()) << first.ToString();
    ASSERT_TRUE(b.Run(impl).ok());
    EXPECT_TRUE(a.out[kD]->SameBytes(*b.out[kD]));
    EXPECT_NE(a.out[kD]->at(0), kSentinel);
  }
  // As a prepared call, run with the first form's four and one pointers.
  Problem c = full;
  std::vector<const DLTensor*> in = c.InPtrs();
  std::vector<DLTensor*> out = c.OutPtrs();
  in.resize(4);
  out.resize(1);
  tefl::OpManager m;
  tefl::PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_TE_GENERAL_GROUPED_GEMM, in, out, &c.attrs, &call).ok());
  Problem d = full;
  std::vector<void*> in_data = {d.in[0]->bytes(), d.in[1]->bytes(), d.in[2]->bytes(), d.in[3]->bytes()};
  std::vector<void*> out_data = {d.out[kD]->bytes()};
  ASSERT_TRUE(call.Run(in_data, out_data).ok());
  Problem e = full;
  ASSERT_TRUE(e.Run(kReference).ok());
  EXPECT_EQ(Compare(*d.out[kD], *e.out[kD], ToleranceFor(DType::kF32)).mismatches, 0);
  // Neither form: the error names both.
  in.resize(5);
  const Status s = m.Call(TEFL_OP_TE_GENERAL_GROUPED_GEMM, in, out, &c.attrs);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("expected 7 inputs and 4 outputs (or 4 and 1, the op's first form), got 5 and 1"),
            std::string::npos)
      << s.message();
}

// ---- Bad input: a clear error naming op, argument and expectation; no output written
struct Bad {
  const char* what;
  std::vector<std::string> needles;
  std::function<void(Problem&)> mutate;
};

void ExpectRejected(Problem& p, const Bad& b) {
  for (const std::string& impl : CpuImplementations(p.op)) {
    SCOPED_TRACE(std::string(b.what) + " / " + impl);
    Problem run = p;
    const Status s = run.Run(impl);
    ASSERT_FALSE(s.ok());
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find(p.op), std::string::npos) << s.message();
    for (const std::string& n : b.needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message();
    for (size_t i = 0; i < run.out.size(); ++i)
      if (run.out[i]) {
        EXPECT_TRUE(run.out[i]->SameBytes(*p.out[i])) << "output " << i << " was written";
        EXPECT_TRUE(run.out[i]->GuardsIntact());
      }
  }
}

TEST(GemmBadInput, ClearErrorAndNoOutputTouched) {
  auto base = [] {
    return MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[0], 4, 6, 5, false, false, "bad");
  };
  const Bad cases[] = {
      {"mismatched K",
       {"'B'", "expected K = 5"},
       [](Problem& p) {
         p.in[kB] = Tensor(DType::kF32, {4, 6});
       }},
      {"mismatched K with transb",
       {"'B'", "transb"},
       [](Problem& p) {
         p.attrs.transb = 1;
         p.in[kB] = Tensor(DType::kF32, {6, 4});
       }},
      {"A not a matrix",
       {"'A'", "rank 2"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kF32, {4, 5, 1});
       }},
      {"bias of the wrong length",
       {"'bias'", "expected shape [6]"},
       [](Problem& p) { p.in[kBias] = Tensor(DType::kF32, {5}); }},
      {"C shape wrong",
       {"'C'", "expected shape [4, 6]"},
       [](Problem& p) {
         p.in[kC] = Tensor(DType::kF32, {6, 4});
       }},
      {"D shape wrong",
       {"'D'", "expected shape [4, 6]"},
       [](Problem& p) {
         p.out[kD] = Sentinel(DType::kF32, {4, 5});
       }},
      {"FP8 A without scale_inv",
       {"'a_scale_inv'", "required"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kE4M3, {4, 5});
         p.in[kB] = Tensor(DType::kE4M3, {5, 6});
         p.in[kBScaleInv] = Scalar1(1);
       }},
      {"FP8 B without scale_inv",
       {"'b_scale_inv'", "required"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kE4M3, {4, 5});
         p.in[kB] = Tensor(DType::kE5M2, {5, 6});
         p.in[kAScaleInv] = Scalar1(1);
       }},
      {"FP8 D without d_scale",
       {"'d_scale'", "required"},
       [](Problem& p) {
         p.out[kD] = Sentinel(DType::kE4M3, {4, 6});
       }},
      {"scale_inv for a non-FP8 A",
       {"'a_scale_inv'", "expected NULL"},
       [](Problem& p) { p.in[kAScaleInv] = Scalar1(1); }},
      {"scale of the wrong shape",
       {"'d_scale'", "expected shape [1]"},
       [](Problem& p) {
         p.out[kD] = Sentinel(DType::kE4M3, {4, 6});
         p.in[kDScale] = Tensor(DType::kF32, {2});
       }},
      {"mixed bf16 x fp32",
       {"'B'", "bfloat16"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kBF16, {4, 5});
       }},
      {"FP8 x bf16",
       {"'B'", "FP8"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kE4M3, {4, 5});
         p.in[kAScaleInv] = Scalar1(1);
         p.in[kB] = Tensor(DType::kBF16, {5, 6});
       }},
      {"int32 A",
       {"'A'"},
       [](Problem& p) {
         p.in[kA] = Tensor(DType::kI32, {4, 5});
       }},
      {"C with accumulate",
       {"'C'", "accumulate"},
       [](Problem& p) {
         p.attrs.accumulate = 1;
         p.in[kC] = Tensor(DType::kF32, {4, 6});
       }},
      {"accumulate into FP8 D",
       {"'D'", "accumulate"},
       [](Problem& p) {
         p.attrs.accumulate = 1;
         p.out[kD] = Sentinel(DType::kE4M3, {4, 6});
         p.in[kDScale] = Scalar1(1);
       }},
      {"pre_gelu_out without gelu",
       {"'pre_gelu_out'", "gelu"},
       [](Problem& p) {
         p.out[kPreGelu] = Sentinel(DType::kF32, {4, 6});
       }},
      {"bias_grad without grad",
       {"'bias_grad'", "grad"},
       [](Problem& p) { p.out[kBiasGrad] = Sentinel(DType::kF32, {4}); }},
      {"bias_grad of the wrong length",
       {"'bias_grad'", "expected shape [4]"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.out[kBiasGrad] = Sentinel(DType::kF32, {6});
       }},
      {"bias with grad",
       {"'bias'", "grad"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.in[kBias] = Tensor(DType::kF32, {6});
       }},
      {"gelu with grad without pre_gelu_out",
       {"'pre_gelu_out'", "required", "[4, 6]"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.attrs.gelu = 1;
       }},
      {"gelu with grad, pre_gelu_out of the wrong shape",
       {"'pre_gelu_out'", "expected shape [4, 6]"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.attrs.gelu = 1;
         p.out[kPreGelu] = Sentinel(DType::kF32, {6, 4});
       }},
      {"gelu with grad, bias_grad [M] instead of [N]",
       {"'bias_grad'", "expected shape [6]", "column sums"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.attrs.gelu = 1;
         p.out[kPreGelu] = Sentinel(DType::kF32, {4, 6});
         p.out[kBiasGrad] = Sentinel(DType::kF32, {4});
       }},
      {"transa out of range", {"'transa'"}, [](Problem& p) { p.attrs.transa = 2; }},
  };
  for (const Bad& b : cases) {
    Problem p = base();
    b.mutate(p);
    for (auto& o : p.out)
      if (o) o->Fill(kSentinel);
    ExpectRejected(p, b);
  }
}

TEST(GroupedGemmBadInput, ClearErrorAndNoOutputTouched) {
  auto base = [] {
    return MakeGrouped({DType::kF32, DType::kF32, false, true, false, false, 1.0f, 1.0f}, {2, 0, 3}, 4, 5);
  };
  const Bad cases[] = {
      {"m_splits sum", {"'m_splits'", "sum of 5"}, [](Problem& p) { p.in[2]->set(2, 2); }},
      {"negative split", {"'m_splits'", "m_splits[1]"}, [](Problem& p) { p.in[2]->set(1, -1); }},
      {"m_splits length", {"'m_splits'", "expected shape [3]"}, [](Problem& p) { p.in[2] = Tensor(DType::kI64, {2}); }},
      {"m_splits int32", {"'m_splits'"}, [](Problem& p) { p.in[2] = Tensor(DType::kI32, {3}); }},
      {"B K mismatch",
       {"'B'", "expected K = 5"},
       [](Problem& p) {
         p.in[1] = Tensor(DType::kF32, {3, 4, 4});
       }},
      {"bias shape", {"'bias'", "expected shape [3, 4]"}, [](Problem& p) { p.in[3] = Tensor(DType::kF32, {4}); }},
      {"D shape",
       {"'D'", "expected shape [5, 4]"},
       [](Problem& p) {
         p.out[0] = Sentinel(DType::kF32, {5, 5});
       }},
      {"transa with transb",
       {"'transa'", "'transb'"},
       [](Problem& p) {
         p.attrs.transa = 1;
         p.attrs.transb = 1;
       }},
      {"transa with a stacked B", {"'B'", "with transa"}, [](Problem& p) { p.attrs.transa = 1; }},
      {"FP8 A without scale_inv",
       {"'a_scale_inv'", "required"},
       [](Problem& p) {
         p.in[0] = Tensor(DType::kE4M3, {5, 5});
         p.in[1] = Tensor(DType::kE4M3, {3, 5, 4});
         p.in[5] = Scalar1(1);
       }},
      {"scale_inv neither [G] nor [1]",
       {"'b_scale_inv'", "expected shape [3]"},
       [](Problem& p) {
         p.in[0] = Tensor(DType::kE4M3, {5, 5});
         p.in[1] = Tensor(DType::kE4M3, {3, 5, 4});
         p.in[4] = Scalar1(1);
         p.in[5] = Tensor(DType::kF32, {2});
       }},
      {"gelu with grad without pre_gelu_out",
       {"'pre_gelu_out'", "required"},
       [](Problem& p) {
         p.attrs.gelu = 1;
         p.attrs.grad = 1;
         p.in[3].reset();
       }},
      {"gelu with grad, pre_gelu_out of the wrong shape",
       {"'pre_gelu_out'", "expected shape [5, 4]"},
       [](Problem& p) {
         p.attrs.gelu = 1;
         p.attrs.grad = 1;
         p.in[3].reset();
         p.out[1] = Sentinel(DType::kF32, {4, 5});
       }},
      {"bias_grad of the wrong shape",
       {"'bias_grad'", "expected shape [5]"},
       [](Problem& p) {
         p.attrs.grad = 1;
         p.in[3].reset();
         p.out[2] = Sentinel(DType::kF32, {3, 4});
       }},
      {"bias with grad", {"'bias'", "grad"}, [](Problem& p) { p.attrs.grad = 1; }},
      {"d_amax not [G]", {"'d_amax'", "expected shape [3]"}, [](Problem& p) { p.out[3] = Sentinel(DType::kF32, {1}); }},
      {"B dtype",
       {"'B'"},
       [](Problem& p) {
         p.in[1] = Tensor(DType::kBF16, {3, 5, 4});
       }},
  };
  for (const Bad& b : cases) {
    Problem p = base();
    b.mutate(p);
    for (auto& o : p.out)
      if (o) o->Fill(kSentinel);
    ExpectRejected(p, b);
  }
}

// ---- Concurrent calls (OpenBLAS under tefl's lock) ----------------------------------
TEST(GemmConcurrency, ParallelCallsMatchSerial) {
  for (const std::string& impl : CpuImplementations(kGemm)) {
    if (impl == kReference) continue;
    std::vector<Problem> ps, serial;
    for (int i = 0; i < 6; ++i) {
      Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kF32}, kEpilogues[i % 3], 64 + i, 96, 80, i & 1, false,
                           fmt::format("conc{}", i));
      Problem first = p;
      const Status s = first.Run(impl);
      if (Declined(impl, kGemm, s)) continue;  // a plugin may decline some epilogues
      ASSERT_TRUE(s.ok()) << impl << ": " << s.ToString();
      ps.push_back(std::move(p));
      serial.push_back(std::move(first));
    }
    std::vector<std::thread> threads;
    std::vector<int> ok(ps.size(), 0);
    for (size_t i = 0; i < ps.size(); ++i)
      threads.emplace_back([&, i] {
        for (int rep = 0; rep < 3; ++rep) ok[i] += ps[i].Run(impl).ok();
      });
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < ps.size(); ++i) {
      EXPECT_EQ(ok[i], 3) << impl;
      EXPECT_TRUE(ps[i].out[kD]->SameBytes(*serial[i].out[kD])) << impl << " call " << i;
    }
  }
}

// default.portable's AMX tiles (a CPU with AMX-BF16; elsewhere these shapes
// check the vdpbf16ps or sgemm paths): 32-row blocks, 64-row tasks, 32-column
// panels, K in steps of 32 (zero padded) and chunks of 256 (sums kept between
// chunks; an A read in place, with chunks of 512 below K = 2048, is
// AmxReadsLongUntransposedAInPlace's), several ~1 MiB column groups
// (K = 2048: 256 columns each), every transpose, bf16 D written from the
// tiles (plain, bias) and fp32 D with C (beta) or through the GELU epilogue.
TEST(GemmConformanceSpecial, AmxTilesAcrossBoundaries) {
  using tefl::backends::PortablePath;
  const bool amx_on = tefl::backends::PortablePathOn(PortablePath::kGemmAmx);
  std::printf("[  NOTE    ] AMX tiles %s\n", amx_on ? "on" : "off (not this CPU)");
  const unsigned long long amx_runs = tefl::backends::PortablePathRuns(PortablePath::kGemmAmx);
  const Shape shapes[] = {{33, 33, 255}, {64, 32, 256}, {65, 97, 257}, {31, 129, 513}, {97, 40, 33}, {32, 64, 1}};
  const int epilogues[] = {0, 1, 4, 2};  // plain, bias, c_alpha_beta, gelu_bias_pre
  for (const Shape& sh : shapes)
    for (int t = 0; t < 4; ++t)
      for (int epi : epilogues)
        for (DType td : {DType::kBF16, DType::kF32}) {
          const bool ta = t & 1, tb = t & 2;
          SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} {} D {}", sh.m, sh.n, sh.k, ta, tb,
                                   kEpilogues[epi].name, Short(td)));
          Problem p = MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[epi], sh.m, sh.n, sh.k, ta, tb,
                               fmt::format("amx{}{}{}", sh.m, sh.n, sh.k));
          CheckAll(p);
          if (::testing::Test::HasFatalFailure()) return;
        }
  // Several column groups and row tasks, a partial last group: also the same
  // bytes on a second call.
  for (int t = 0; t < 4; t += 3) {
    const bool ta = t & 1, tb = t & 2;
    SCOPED_TRACE(fmt::format("136x600x2048 transa={} transb={}", ta, tb));
    Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[1], 136, 600, 2048, ta, tb, "amxbig");
    CheckAll(p);
    if (::testing::Test::HasFatalFailure()) return;
    Problem first = p, again = p;
    ASSERT_TRUE(first.Run("default.portable").ok());
    ASSERT_TRUE(again.Run("default.portable").ok());
    EXPECT_TRUE(again.out[kD]->SameBytes(*first.out[kD]));
  }
  ExpectPathRanWhereOn(PortablePath::kGemmAmx, amx_runs);
}

// A bf16 D of >= 8 MiB is written from the AMX tiles with non-temporal
// stores (full 64-byte rows; rows off a 64-byte boundary and the partial
// last panel keep masked stores). With N a multiple of 32 (every row
// aligned), a task of full row blocks converts each panel's rows into a
// staging buffer and streams them out during the next panel's tile steps; a
// task with a partial block stores at once. Each case's rows must be the
// bytes of the same rows computed in a small call (plain stores; each row
// block's sums do not depend on M), which for K < 1024 is itself checked
// against the reference: N = 2064 (not staged), and N = 2048 with packed A
// and a 40-row last task, with A in place (K = 1024) and a 16-row last
// block, and with alpha = 2 (C with beta = 0) and bias; and bias + GELU with
// pre_gelu_out (the fused GELU tile streams D and pre_gelu_out, both
// compared; the last four with the AMX tiles on).
TEST(GemmConformanceSpecial, AmxStreamedOutputMatchesSmallCall) {
  struct Case {
    int64_t m, n, k;
    int epi;
  };
  const Case cases[] = {{2048, 2048 + 16, 40, 1},
                        {2048 + 40, 2048, 96, 1},
                        {2048 + 16, 2048, 1024, 1},
                        {2048 + 40, 2048, 64, 5},
                        {2048 + 40, 2048, 64, 2}};
  auto at = [](const std::optional<Tensor>& t) { return static_cast<uint8_t*>(t->bytes()); };
  // The staged cases exercise the AMX tiles' stores: without them (ctest
  // GemmNoAmx, older CPUs) only the first case runs.
  const bool amx_on = tefl::backends::PortablePathOn(tefl::backends::PortablePath::kGemmAmx);
  for (const Case& c : cases) {
    if (!amx_on && &c != &cases[0]) break;
    const int64_t m = c.m, n = c.n, k = c.k;
    SCOPED_TRACE(fmt::format("{}x{}x{} {}", m, n, k, kEpilogues[c.epi].name));
    Problem big =
        MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[c.epi], m, n, k, false, false, "stream", false);
    ASSERT_GE(m * n * 2, int64_t(8) << 20);
    ASSERT_TRUE(big.Run("default.portable").ok());
    for (int64_t r0 : {int64_t(0), int64_t(1000), m - 96}) {
      SCOPED_TRACE(fmt::format("rows {}..{}", r0, r0 + 96));
      Problem part = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[c.epi], 96, n, k, false, false,
                              "part", false);
      std::memcpy(at(part.in[kA]), at(big.in[kA]) + size_t(r0 * k) * 2, size_t(96 * k) * 2);
      std::memcpy(at(part.in[kB]), at(big.in[kB]), size_t(k * n) * 2);
      std::memcpy(at(part.in[kBias]), at(big.in[kBias]), size_t(n) * 2);
      if (part.in[kC]) std::memcpy(at(part.in[kC]), at(big.in[kC]) + size_t(r0 * n) * 2, size_t(96 * n) * 2);
      // Against the reference once per case (the other rows: the same code on
      // other data); at K = 1024 the small call is a plain in-place AMX call,
      // checked by AmxReadsLongUntransposedAInPlace (the reference here would
      // take ~10 s under ASan).
      if (r0 == 0 && k < 1024) {
        part.magnitude = MagnitudeOf(part, 96, n, k);
        CheckAll(part);
        if (::testing::Test::HasFatalFailure()) return;
      }
      Problem again = part;
      ASSERT_TRUE(again.Run("default.portable").ok());
      EXPECT_EQ(std::memcmp(at(big.out[kD]) + size_t(r0 * n) * 2, at(again.out[kD]), size_t(96 * n) * 2), 0);
      if (big.out[kPreGelu]) {
        EXPECT_EQ(std::memcmp(at(big.out[kPreGelu]) + size_t(r0 * n) * 2, at(again.out[kPreGelu]), size_t(96 * n) * 2),
                  0);
      }
    }
    EXPECT_TRUE(big.out[kD]->GuardsIntact());
    if (big.out[kPreGelu]) {
      EXPECT_TRUE(big.out[kPreGelu]->GuardsIntact());
    }
  }
}

// A bf16 D with GELU (TE's fprop: bias + GELU, pre_gelu_out in bf16 or
// absent) takes the GELU in the tiles' stores (GeluTileBf16; no fp32 D and
// no second pass), against the reference: a partial row block and a partial
// last panel whose columns past N rounded down to 16 are scalar (N = 100),
// transposes, and A read in place (K = 1024). ctest runs it on the AMX tiles
// and, with TEFL_PORTABLE_GEMM_AMX=0, on the vdpbf16ps tiles. Where the CPU
// has AVX512-BF16 the tiles round D and pre_gelu_out with vcvtne2ps2bf16:
// TEFL_PORTABLE_BF16_CVT=0 (Highway's integer rounding) must give the same
// bits.
TEST(GemmConformanceSpecial, Bf16FusedGeluEpilogue) {
  struct Case {
    int64_t m, n, k;
    bool ta, tb;
  };
  const Case cases[] = {{70, 100, 64, false, false},
                        {70, 100, 64, false, true},
                        {33, 96, 96, true, false},
                        {64, 528, 1024, false, false}};
  for (const Case& c : cases)
    for (int epi : {2, 3}) {  // gelu_bias_pre, gelu
      SCOPED_TRACE(fmt::format("{}x{}x{} ta {} tb {} {}", c.m, c.n, c.k, c.ta, c.tb, kEpilogues[epi].name));
      Problem p = MakeGemm({DType::kBF16, DType::kBF16, DType::kBF16}, kEpilogues[epi], c.m, c.n, c.k, c.ta, c.tb,
                           "fused_gelu");
      CheckAll(p);
      if (::testing::Test::HasFatalFailure()) return;
      Problem native = p, integer = p;
      ASSERT_TRUE(native.Run("default.portable").ok());
      ASSERT_TRUE(
          WithPortableSwitch("TEFL_PORTABLE_BF16_CVT", "0", [&] { return integer.Run("default.portable"); }).ok());
      for (size_t o : {size_t(kD), size_t(kPreGelu)}) {
        if (!native.out[o]) continue;
        EXPECT_EQ(std::memcmp(native.out[o]->bytes(), integer.out[o]->bytes(), native.out[o]->nbytes()), 0)
            << "output " << o;
      }
    }
}

// The AMX tiles read an untransposed A with K a multiple of 32 and at least
// 1024 in place (only scanned for subnormals, not packed) when it is 64-byte
// aligned, except a partial last row block, which is still packed: full and
// partial blocks, at K = 1024 and 1056 (K chunks of 16 steps; 1056: a last
// chunk of one step; M = 48: a task of a block read in place and a packed
// partial one, in one tile call) and K = 2048 and 2080 (chunks of 8 steps);
// a bf16 D written from the tiles (plain, bias) and an fp32 D (C with beta,
// bias + GELU), against the reference. One subnormal value of A in a full block or in the partial one
// sends the call to the exact path, with either D. K = 2050 (not a multiple
// of 32) packs A as before.
TEST(GemmConformanceSpecial, AmxReadsLongUntransposedAInPlace) {
  const Shape shapes[] = {{64, 64, 2048}, {70, 96, 1024}, {48, 96, 1056}, {70, 96, 2080}, {33, 64, 2050}};
  for (const Shape& sh : shapes)
    for (int epi : {0, 1, 4, 2}) {  // plain, bias: bf16 D; c_alpha_beta, gelu_bias_pre: fp32 D
      if (sh.k % 32 != 0 && (epi == 1 || epi == 4)) continue;  // the packed fallback: one epilogue per D
      const DType td = epi < 2 ? DType::kBF16 : DType::kF32;
      SCOPED_TRACE(fmt::format("{}x{}x{} {} D {}", sh.m, sh.n, sh.k, kEpilogues[epi].name, Short(td)));
      Problem p =
          MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[epi], sh.m, sh.n, sh.k, false, false, "amxrowa");
      ASSERT_EQ(reinterpret_cast<uintptr_t>(p.in[kA]->bytes()) % 64, 0u) << "only a 64-byte-aligned A is read in place";
      CheckAll(p);
      if (::testing::Test::HasFatalFailure()) return;
    }
  const int64_t m = 70, n = 96, k = 2080;
  const std::pair<int64_t, DType> subnormals[] = {
      {5, DType::kBF16}, {40 * k + 1000, DType::kF32}, {m * k - 1, DType::kBF16}, {m * k - 1, DType::kF32}};
  for (const auto& [pos, td] : subnormals) {
    SCOPED_TRACE(fmt::format("subnormal in A at {}, D {}", pos, Short(td)));
    Problem p = MakeGemm({DType::kBF16, DType::kBF16, td}, kEpilogues[0], m, n, k, false, false, "amxsub");
    p.in[kA]->Fill(0.0);
    p.in[kA]->set(pos, 3e-39);  // subnormal in bf16
    p.in[kB]->Fill(1e38);
    p.magnitude = MagnitudeOf(p, m, n, k);
    CheckAll(p);
    if (::testing::Test::HasFatalFailure()) return;
    Problem got = p;
    ASSERT_TRUE(got.Run("default.portable").ok());
    const int64_t row = pos / k;
    EXPECT_NE(got.out[kD]->at(row * n), 0.0) << "the subnormal's products reach D";
  }
}

// default.portable's own fp32 tiles (AVX-512; 14 x 32 register tiles, K in
// chunks of 2048, GEMMs of at least 28 x 128 and 2^23 multiply-adds): partial
// row blocks and column panels (of 1-31 columns, 16 among them), a K past one
// chunk and not a multiple of 8, K below one transpose block (7) and just
// above (9), every transpose, C with alpha and beta,
// beta = 0 with C, accumulate, bias + GELU; FP8 and fp16 operands (converted
// to fp32 first) and an fp16 D; bf16 operands with a subnormal (the exact
// fallback of the bf16 path lands here). The same bytes again on 1 and 3 threads
// (ctest GemmThreads1/3 run this too) and from two threads at once.
TEST(GemmConformanceSpecial, F32TilesAcrossBoundaries) {
  using tefl::backends::PortablePath;
  const bool own_on = tefl::backends::PortablePathOn(PortablePath::kGemmF32Avx512);
  // The 1- and 3-thread ctest variants (GemmThreads*) are here for the own
  // tiles' task boundaries; without those tiles they would repeat the
  // default run's OpenBLAS products (~220 s each under AddressSanitizer on a
  // 2-core Zen 3).
  if (!own_on && std::getenv("TEFL_TEST_THREAD_VARIANT") != nullptr)
    GTEST_SKIP() << "own fp32 tiles off: a thread variant of this test repeats the default run";
  std::printf("[  NOTE    ] own fp32 tiles %s\n", own_on ? "on" : "off (OpenBLAS)");
  const Shape shapes[] = {{107, 152, 2100}, {30, 128, 5999}, {1000, 1000, 9}, {385, 150, 200}, {1200, 1008, 7}};
  const int epilogues[] = {0, 4, 5, 6, 2};  // plain, c_alpha_beta, c_bias_beta0, accumulate, gelu_bias_pre
  for (const Shape& sh : shapes)
    for (int t = 0; t < 4; ++t)
      for (int epi : epilogues) {
        if (epi != 0 && t != (sh.k == 9 ? 3 : 0)) continue;  // the epilogues on one layout per shape
        const bool ta = t & 1, tb = t & 2;
        SCOPED_TRACE(fmt::format("{}x{}x{} transa={} transb={} {}", sh.m, sh.n, sh.k, ta, tb, kEpilogues[epi].name));
        Problem p = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[epi], sh.m, sh.n, sh.k, ta, tb,
                             fmt::format("f32t{}{}{}", sh.m, sh.n, sh.k));
        const unsigned long long runs = tefl::backends::PortablePathRuns(PortablePath::kGemmF32Avx512);
        CheckAll(p);
        if (::testing::Test::HasFatalFailure()) return;
        // Every shape here is large enough for the own tiles.
        ExpectPathRanWhereOn(PortablePath::kGemmF32Avx512, runs);
      }
  for (const DTypes& dt :
       {DTypes{DType::kE4M3, DType::kE5M2, DType::kF32}, DTypes{DType::kF16, DType::kF16, DType::kF16}}) {
    SCOPED_TRACE(fmt::format("{} x {} -> {}", Short(dt.a), Short(dt.b), Short(dt.d)));
    Problem p = MakeGemm(dt, kEpilogues[1], 107, 152, 2100, false, true, "f32conv");
    CheckAll(p);
    if (::testing::Test::HasFatalFailure()) return;
  }
  {
    SCOPED_TRACE("bf16 with a subnormal");
    Problem p =
        MakeGemm({DType::kBF16, DType::kBF16, DType::kF32}, kEpilogues[1], 107, 152, 2100, false, false, "f32sub");
    p.in[kA]->set(1234, p.in[kA]->at(1234) * 1e-39);  // subnormal in bf16
    ASSERT_NE(p.in[kA]->at(1234), 0.0);
    CheckAll(p);
    if (::testing::Test::HasFatalFailure()) return;
  }
  // beta = 0 does not read C (BLAS): NaN there stays out of D.
  {
    Problem p =
        MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[5], 107, 152, 2100, false, false, "f32nan");
    for (int64_t i = 0; i < p.in[kC]->numel(); ++i) static_cast<float*>(p.in[kC]->bytes())[i] = std::nanf("");
    CheckAll(p);
    ASSERT_TRUE(p.Run("default.portable").ok());
    for (int64_t i = 0; i < p.out[kD]->numel(); ++i) ASSERT_TRUE(std::isfinite(p.out[kD]->at(i))) << "D[" << i << "]";
  }
  // The same bytes on every call, sequential or concurrent.
  Problem p = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[1], 385, 129, 2500, false, false, "f32same");
  Problem first = p;
  ASSERT_TRUE(first.Run("default.portable").ok());
  ExpectConcurrentRunsMatch(p, *first.out[kD], 4);
}

// An fp32 D of >= 8 MiB that the own tiles store once (K within one chunk,
// beta = 0, no epilogue after the GEMM) is written with non-temporal stores
// (full 64-byte-aligned 32-column rows; the others, here every other row and
// the 8-column last panel, keep masked stores). Checked against the
// reference, with the guards around D intact, next to the same shape with
// beta != 0 and with a bias epilogue (plain stores); with the own tiles on,
// its first and last rows are also the bytes of the same rows computed in a
// smaller call (plain stores; each element of D is summed in one fixed order).
TEST(GemmConformanceSpecial, F32StreamedOutputMatchesReference) {
  const int64_t m = 1030, n = 2056, k = 17;  // D 8.47 MB; rows 8224 bytes apart
  for (int epi : {0, 4, 1}) {                // plain (streamed), c_alpha_beta, bias
    SCOPED_TRACE(kEpilogues[epi].name);
    Problem big = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[epi], m, n, k, false, false, "f32big");
    CheckAll(big);
    if (::testing::Test::HasFatalFailure()) return;
    ASSERT_TRUE(big.Run("default.portable").ok());
    EXPECT_TRUE(big.out[kD]->GuardsIntact());
    if (epi != 0 || !tefl::backends::PortablePathOn(tefl::backends::PortablePath::kGemmF32Avx512)) continue;
    const int64_t rows = 240;  // 240 x 2056 x 17 >= 2^23 multiply-adds: the own tiles, D 1.97 MB
    auto at = [](const std::optional<Tensor>& t) { return static_cast<uint8_t*>(t->bytes()); };
    for (int64_t r0 : {int64_t(0), m - rows}) {
      SCOPED_TRACE(fmt::format("rows {}..{}", r0, r0 + rows));
      Problem part = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[0], rows, n, k, false, false, "part");
      std::memcpy(at(part.in[kA]), at(big.in[kA]) + size_t(r0 * k) * 4, size_t(rows * k) * 4);
      std::memcpy(at(part.in[kB]), at(big.in[kB]), size_t(k * n) * 4);
      ASSERT_TRUE(part.Run("default.portable").ok());
      EXPECT_EQ(std::memcmp(at(big.out[kD]) + size_t(r0 * n) * 4, at(part.out[kD]), size_t(rows * n) * 4), 0);
    }
  }
}

// With two or more threads the own fp32 tiles read an untransposed A in
// place (no packing; a partial last row block is still packed) when
// K <= 512 and N <= 1024, or K <= 64 at any N: partial row blocks and
// panels, odd K, K = 512 exactly and K = 64 with a wide N, each epilogue
// that reads or adds to D (the packed cases plain only), against the
// reference; the same bytes with the path switched off (the products are
// summed in the same order), and the path's run counter moves exactly where
// the rule says (not with one thread, a transposed A, K = 513, or N = 1056
// at K = 65).
TEST(GemmConformanceSpecial, F32ReadsUntransposedAInPlace) {
  using tefl::backends::PortablePath;
  const bool own_on = tefl::backends::PortablePathOn(PortablePath::kGemmF32Avx512);
  const bool in_place_on = tefl::backends::PortablePathOn(PortablePath::kGemmF32AInPlace);
  const int threads = tefl_host()->num_threads();
  std::printf("[  NOTE    ] own fp32 tiles %s, A in place %s, %d threads\n", own_on ? "on" : "off",
              in_place_on ? "on" : "off", threads);
  struct Case {
    Shape sh;
    bool ta;
    bool in_place;  // by the rule, given the own tiles, the switch and >= 2 threads
  };
  const Case cases[] = {
      {{74, 650, 512}, false, true},    // 5 full blocks and one of 4 rows; a 10-column last panel
      {{385, 150, 200}, false, true},   // K = 200
      {{1000, 1000, 9}, false, true},   // K below one transpose block
      {{48, 4104, 64}, false, true},    // K <= 64 at any N
      {{128, 1056, 65}, false, false},  // N > 1024 with K > 64
      {{36, 640, 513}, false, false},   // K > 512
      {{74, 650, 512}, true, false},    // transposed A: packed
  };
  const int epilogues[] = {0, 4, 6, 2};                    // plain, c_alpha_beta, accumulate, gelu_bias_pre
  const bool can = own_on && in_place_on && threads >= 2;  // A may be read in place at all
  for (const Case& c : cases)
    for (int epi : epilogues) {
      const bool expect = can && c.in_place;
      // The packed path's epilogues: F32TilesAcrossBoundaries.
      if (!expect && epi != 0) continue;
      SCOPED_TRACE(fmt::format("{}x{}x{} transa={} {}", c.sh.m, c.sh.n, c.sh.k, c.ta, kEpilogues[epi].name));
      Problem p = MakeGemm({DType::kF32, DType::kF32, DType::kF32}, kEpilogues[epi], c.sh.m, c.sh.n, c.sh.k, c.ta,
                           false, fmt::format("f32ip{}{}{}", c.sh.m, c.sh.n, c.sh.k));
      const unsigned long long own_runs = tefl::backends::PortablePathRuns(PortablePath::kGemmF32Avx512);
      const unsigned long long runs = tefl::backends::PortablePathRuns(PortablePath::kGemmF32AInPlace);
      Problem got = p;
      ASSERT_TRUE(got.Run("default.portable").ok());
      EXPECT_EQ(tefl::backends::PortablePathRuns(PortablePath::kGemmF32AInPlace) - runs, expect ? 1u : 0u);
      EXPECT_EQ(tefl::backends::PortablePathRuns(PortablePath::kGemmF32Avx512) - own_runs, own_on ? 1u : 0u);
      CheckAll(p);
      if (::testing::Test::HasFatalFailure()) return;
      Problem packed = p;
      ASSERT_TRUE(WithPortableSwitch("TEFL_PORTABLE_GEMM_F32_A_IN_PLACE", "0",
                                     [&] { return packed.Run("default.portable").ok(); }));
      EXPECT_TRUE(packed.out[kD]->SameBytes(*got.out[kD])) << "A in place and packed differ";
      if (p.out[kPreGelu]) {
        EXPECT_TRUE(packed.out[kPreGelu]->SameBytes(*got.out[kPreGelu]));
      }
    }
}

TEST(GemmConformanceSpecial, ImplementationsCovered) {
  for (const char* op : {kGemm, kGrouped}) {
    const std::vector<std::string> ids = CpuImplementations(op);
    std::string list;
    for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
    std::printf("[  NOTE    ] %s: %s\n", op, list.c_str());
    for (const char* must : tefl::testing::kMustServeImpls)
      EXPECT_NE(std::find(ids.begin(), ids.end(), must), ids.end()) << op << " lacks " << must;
  }
}

}  // namespace
