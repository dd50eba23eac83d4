// Conformance of every registered implementation of the normalization ops
// against the oracle, reference.cpp (every sum in double, one rounding per
// output), with TransformerEngine's tolerances (spec/ops.md, Tolerances).
//
// Implementations are enumerated from the default registry, so a new backend
// is covered without touching this file. Each one is run alone through a
// strict policy whose per-op order is just "impl:<id>": the call runs exactly
// that implementation or fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "test_support.h"

namespace {

using tefl::DType;
using tefl::Status;
using tefl::testing::Compare;
using tefl::testing::CompareResult;
using tefl::testing::Tensor;
using tefl::testing::Tolerance;
using tefl::testing::ToleranceFor;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;  // outputs start as this
constexpr float kEps = 1e-5f;
using tefl::testing::CpuImplementations;
using tefl::testing::MustServe;
using tefl::testing::Named;
using tefl::testing::NamedTensor;
using tefl::testing::Ptrs;
using tefl::testing::RunImpl;
using tefl::testing::RunImplDL;

bool IsFwd(const std::string& op) { return op == "layernorm_fwd" || op == "rmsnorm_fwd"; }
bool IsLayerNorm(const std::string& op) { return op.rfind("layernorm", 0) == 0; }

// ---- One call's tensors ---------------------------------------------------------------
struct Problem {
  std::string op;
  std::vector<NamedTensor> in, out;
  tefl_norm_fwd_attrs fwd_attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, kEps, 0, 0};
  tefl_norm_bwd_attrs bwd_attrs{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};

  const void* attrs() const {
    return IsFwd(op) ? static_cast<const void*>(&fwd_attrs) : static_cast<const void*>(&bwd_attrs);
  }
  Tensor& In(const std::string& name) { return Named(in, name, "input"); }
  Tensor& Out(const std::string& name) { return Named(out, name, "output"); }
};

// Tolerance of an output (spec/ops.md): z by its dtype; statistics rtol 5e-5;
// backward outputs atol = rtol = 5e-4, never tighter than TE's dtype rule.
Tolerance ToleranceOf(const std::string& name, DType dtype) {
  const Tolerance by_dtype = ToleranceFor(dtype);
  if (name == "z") return by_dtype;
  if (name == "mu" || name == "rsigma") return {1e-6, 5e-5};
  return {std::max(5e-4, by_dtype.atol), std::max(5e-4, by_dtype.rtol)};
}

// dtypes of one case. Forward: x, z, gamma/beta. Backward: x, dz/dx/add (the
// "z" slot), gamma/dgamma/dbeta.
struct Combo {
  DType x, z, g;
};
std::string ComboName(const Combo& c) {
  auto n = [](DType t) { return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16"; };
  return fmt::format("x{}_z{}_g{}", n(c.x), n(c.z), n(c.g));
}

// The statistics' shape: x.shape[:-1] for x of rank > 2, else [N].
std::vector<int64_t> StatsShape(const std::vector<int64_t>& x) {
  if (x.size() > 2) return std::vector<int64_t>(x.begin(), x.end() - 1);
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < x.size(); ++d) rows *= x[d];
  return {rows};
}

Tensor Output(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  o.Fill(kSentinel);
  return o;
}

// Builds the inputs and sentinel-filled outputs of `op`. Backward inputs take
// mu / rsigma from the reference forward (fp32 statistics).
Problem MakeProblem(const std::string& op, const Combo& c, bool zcg, const std::vector<int64_t>& xs,
                    const std::string& seed) {
  Problem p;
  p.op = op;
  p.fwd_attrs.zero_centered_gamma = zcg;
  p.bwd_attrs.zero_centered_gamma = zcg;
  const int64_t h = xs.back();
  const std::vector<int64_t> ss = StatsShape(xs);
  auto input = [&](const std::string& name, DType t, std::vector<int64_t> shape) {
    Tensor v(t, std::move(shape));
    v.Uniform(name + "/" + seed);
    p.in.push_back({name, v});
  };
  if (IsFwd(op)) {
    input("x", c.x, xs);
    input("gamma", c.g, {h});
    if (IsLayerNorm(op)) input("beta", c.g, {h});
    p.out.push_back({"z", Output(c.z, xs)});
    if (IsLayerNorm(op)) p.out.push_back({"mu", Output(DType::kF32, ss)});
    p.out.push_back({"rsigma", Output(DType::kF32, ss)});
    return p;
  }
  // Backward: statistics from the reference forward of the same x.
  const bool ln = IsLayerNorm(op);
  Tensor x(c.x, xs), gamma(c.g, {h}), beta(c.g, {h});
  x.Uniform("x/" + seed);
  gamma.Uniform("gamma/" + seed);
  beta.Uniform("beta/" + seed);
  Tensor z = Output(DType::kF32, xs), mu = Output(DType::kF32, ss), rsigma = Output(DType::kF32, ss);
  tefl_norm_fwd_attrs fa{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, kEps, zcg, 0};
  const Status s = ln ? RunImpl("layernorm_fwd", kReference, {&x, &gamma, &beta}, {&z, &mu, &rsigma}, &fa)
                      : RunImpl("rmsnorm_fwd", kReference, {&x, &gamma}, {&z, &rsigma}, &fa);
  EXPECT_TRUE(s.ok()) << "reference forward for the backward inputs: " << s.ToString();
  input("dz", c.z, xs);
  p.in.push_back({"x", x});
  if (op == "rmsnorm_bwd_add") input("add", c.z, xs);
  if (ln) p.in.push_back({"mu", mu});
  p.in.push_back({"rsigma", rsigma});
  p.in.push_back({"gamma", gamma});
  p.out.push_back({"dx", Output(c.z, xs)});
  p.out.push_back({"dgamma", Output(c.g, {h})});
  if (ln) p.out.push_back({"dbeta", Output(c.g, {h})});
  return p;
}

// Runs every CPU implementation on `p` and compares each output with the
// reference's. `check` (optional) runs extra assertions on each result.
using ExtraCheck = std::function<void(const std::string& impl, Problem& result)>;

void CheckAllImplementations(Problem& p, const ExtraCheck& check = nullptr) {
  // The reference's answer.
  Problem ref = p;
  {
    const Status s = RunImpl(p.op, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs());
    ASSERT_TRUE(s.ok()) << "reference: " << s.ToString();
    for (NamedTensor& o : ref.out) ASSERT_TRUE(o.t.GuardsIntact()) << "reference wrote outside '" << o.name << "'";
    if (check) check(kReference, ref);
  }
  const std::vector<std::string> impls = CpuImplementations(p.op);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  for (const std::string& impl : impls) {
    SCOPED_TRACE("impl " + impl);
    Problem run = p;  // fresh sentinel outputs, pristine inputs
    const Status s = RunImpl(p.op, impl, Ptrs(run.in), Ptrs(run.out), run.attrs());
    if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) {
      std::printf("[  NOTE    ] %s declined %s: %s\n", impl.c_str(), p.op.c_str(), s.message().c_str());
      continue;
    }
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < run.in.size(); ++i) {
      EXPECT_TRUE(run.in[i].t.SameBytes(p.in[i].t)) << "input '" << run.in[i].name << "' was modified";
      EXPECT_TRUE(run.in[i].t.GuardsIntact()) << "input '" << run.in[i].name << "' guards";
    }
    for (size_t i = 0; i < run.out.size(); ++i) {
      const NamedTensor& got = run.out[i];
      const NamedTensor& want = ref.out[i];
      EXPECT_TRUE(got.t.GuardsIntact()) << "wrote outside '" << got.name << "'";
      const Tolerance tol = ToleranceOf(got.name, got.t.dtype());
      const CompareResult r = Compare(got.t, want.t, tol);
      EXPECT_EQ(r.mismatches, 0) << "'" << got.name << "' (" << tefl::DTypeName(got.t.dtype()) << ", atol " << tol.atol
                                 << ", rtol " << tol.rtol << "): " << r.ToString()
                                 << (r.first_bad >= 0
                                         ? fmt::format(" got {} want {}", got.t.at(r.first_bad), want.t.at(r.first_bad))
                                         : std::string());
    }
    if (check) check(impl, run);
  }
}

// ---- The grid: op x dtypes x zero_centered_gamma x shape -------------------------------
const char* const kOps[] = {"layernorm_fwd", "rmsnorm_fwd", "layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"};

const Combo kCombos[] = {
    {DType::kF32, DType::kF32, DType::kF32},
    {DType::kBF16, DType::kBF16, DType::kF32},
    {DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kF16, DType::kF16, DType::kF32},
    {DType::kF16, DType::kF16, DType::kF16},
    // mixed: x bf16 with fp32 z (dz/dx), and fp32 x with bf16 z
    {DType::kBF16, DType::kF32, DType::kF32},
    {DType::kF32, DType::kBF16, DType::kF32},
};

const std::vector<int64_t> kShapes[] = {{0, 64},   {1, 1},    {1, 7},     {3, 17},   {5, 64},
                                        {4, 4095}, {2, 8192}, {64, 1024}, {2, 3, 33}};

using GridParam = std::tuple<int, int, bool, int>;  // op, combo, zcg, shape

std::string ShapeName(const std::vector<int64_t>& s) {
  std::string n;
  for (size_t i = 0; i < s.size(); ++i) n += (i ? "x" : "") + std::to_string(s[i]);
  return n;
}

std::string GridName(const GridParam& p) {
  const auto& [op, combo, zcg, shape] = p;
  return fmt::format("{}_{}_zcg{}_{}", kOps[op], ComboName(kCombos[combo]), int(zcg), ShapeName(kShapes[shape]));
}

class NormConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(NormConformance, MatchesReference) {
  const auto& [op, combo, zcg, shape] = GetParam();
  const std::string seed = GridName(GetParam());
  Problem p = MakeProblem(kOps[op], kCombos[combo], zcg, kShapes[shape], seed);
  CheckAllImplementations(p);
}

INSTANTIATE_TEST_SUITE_P(Grid, NormConformance,
                         ::testing::Combine(::testing::Range(0, int(std::size(kOps))),
                                            ::testing::Range(0, int(std::size(kCombos))), ::testing::Bool(),
                                            ::testing::Range(0, int(std::size(kShapes)))),
                         [](const ::testing::TestParamInfo<GridParam>& param_info) {
                           return GridName(param_info.param);
                         });

// ---- Special values ---------------------------------------------------------------------------
// Forward problem with x rows chosen by the test (fp32 unless said).
Problem MakeFwd(const std::string& op, DType tx, DType tz, int64_t rows, int64_t h, float eps, bool zcg,
                const std::string& seed) {
  Problem p = MakeProblem(op, {tx, tz, DType::kF32}, zcg, {rows, h}, seed);
  p.fwd_attrs.eps = eps;
  return p;
}

// Rows of magnitude ~1e30 (x^2 overflows fp32) and ~1e-30 (x^2 underflows
// fp32): the reference accumulates in double and so must every
// implementation.
// default.portable sums in fp32 chunks and must fall back to double for
// these rows (bf16 has fp32's range, so it takes the same fallback).
TEST(NormConformanceSpecial, HugeAndTinyRows) {
  const double kScale[] = {1.0, 1e30, 1e-30, 1e30, 1e-30, 1.0};
  for (const char* op : {"layernorm_fwd", "rmsnorm_fwd"}) {
    for (int64_t h : {1, 7, 64, 1027, 8192}) {
      for (float eps : {kEps, 0.0f}) {
        for (bool zcg : {false, true}) {
          for (DType t : {DType::kF32, DType::kBF16}) {
            const std::string seed = fmt::format("{}_{}_{}_{}_{}", op, h, eps, zcg, tefl::DTypeName(t));
            SCOPED_TRACE(seed);
            Problem p = MakeFwd(op, t, t, 6, h, eps, zcg, seed);
            Tensor& x = p.In("x");
            for (int64_t r = 0; r < 6; ++r)
              for (int64_t j = 0; j < h; ++j) x.set(r * h + j, x.at(r * h + j) * kScale[r]);
            CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
              // The statistics of the huge and tiny rows are finite (except
              // the zero variance of a 1-wide LayerNorm row with eps = 0).
              if (h == 1 && eps == 0.0f && IsLayerNorm(op)) return;
              for (int64_t r = 0; r < 6; ++r)
                EXPECT_TRUE(std::isfinite(res.Out("rsigma").at(r))) << impl << " rsigma[" << r << "]";
            });
          }
        }
      }
    }
  }
}

// NaNs in gamma / beta whose low 16 bits are set (fp32 0x7FFFFFFF and
// 0xFFFFFFFF): a bf16 rounding bias added to those bits carries out of the
// payload (0x7FFFFFFF + 0x7FFF is 0x80007FFE, i.e. -0.0 as bf16). The
// column must come out NaN in every row, for bf16 z read through each of the
// gamma dtypes (bf16 gamma is read in place by default.portable, fp32 and
// fp16 gamma are converted per call), and no other column may change.
TEST(NormConformanceSpecial, NanPayloadsInGammaAndBeta) {
  for (const char* op : {"layernorm_fwd", "rmsnorm_fwd"}) {
    for (DType tg : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t h : {64, 67}) {
        const std::string seed = fmt::format("{}_{}_{}_nan_payload", op, tefl::DTypeName(tg), h);
        SCOPED_TRACE(seed);
        Problem p = MakeProblem(op, {DType::kBF16, DType::kBF16, tg}, false, {3, h}, seed);
        const bool ln = IsLayerNorm(op);
        const auto set_bits = [](Tensor& t, int64_t i, uint32_t bits) {
          if (t.dtype() == DType::kF32) {
            std::memcpy(static_cast<uint32_t*>(t.bytes()) + i, &bits, 4);
          } else {
            t.set(i, std::bit_cast<float>(bits));  // bf16/fp16 keep the upper payload bits
          }
        };
        // Columns 5 and 6 (gamma), 9 (beta) and 65 (gamma, in the tail when h = 67).
        set_bits(p.In("gamma"), 5, 0x7FFFFFFFu);
        set_bits(p.In("gamma"), 6, 0xFFFFFFFFu);
        set_bits(p.In("gamma"), 65 % h, 0x7FFFFFFFu);
        if (ln) set_bits(p.In("beta"), 9, 0x7FFFFFFFu);
        CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
          SCOPED_TRACE(impl);
          const Tensor& z = res.Out("z");
          for (int64_t r = 0; r < 3; ++r) {
            for (int64_t j = 0; j < h; ++j) {
              const bool nan_col = j == 5 || j == 6 || j == 65 % h || (ln && j == 9);
              EXPECT_EQ(std::isnan(z.at(r * h + j)), nan_col) << "z[" << r << ", " << j << "] = " << z.at(r * h + j);
            }
          }
        });
      }
    }
  }
}

// A NaN in a row makes that row's z and statistics NaN, and only that row's.
// A +Inf makes the row's statistics non-finite (LayerNorm: mean inf, and
// inf - inf in the variance; RMSNorm: rsigma = 1/sqrt(inf) = 0, the
// TransformerEngine result, with z = inf * 0 = NaN at the inf).
TEST(NormConformanceSpecial, NanAndInfRows) {
  const double inf = std::numeric_limits<double>::infinity();
  for (const char* op : {"layernorm_fwd", "rmsnorm_fwd"}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t h : {64, 1027}) {
        const std::string seed = fmt::format("{}_{}_{}", op, tefl::DTypeName(t), h);
        SCOPED_TRACE(seed);
        // rows: 0 normal, 1 NaN at column 3, 2 +Inf at column 5, 3 normal, 4 -Inf at column 0
        Problem p = MakeFwd(op, t, t, 5, h, kEps, false, seed);
        Tensor& x = p.In("x");
        x.set(1 * h + 3, std::nan(""));
        x.set(2 * h + 5, inf);
        x.set(4 * h + 0, -inf);
        const bool ln = IsLayerNorm(op);
        CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
          SCOPED_TRACE(impl);
          const Tensor& z = res.Out("z");
          const Tensor& rs = res.Out("rsigma");
          for (int64_t j = 0; j < h; ++j) EXPECT_TRUE(std::isnan(z.at(1 * h + j))) << "z[1, " << j << "]";
          EXPECT_TRUE(std::isnan(rs.at(1))) << "rsigma[1] = " << rs.at(1);
          if (ln) {
            EXPECT_TRUE(std::isnan(res.Out("mu").at(1))) << "mu[1]";
          }
          for (int64_t r : {0, 3}) {
            EXPECT_TRUE(std::isfinite(rs.at(r))) << "rsigma[" << r << "]";
            if (ln) {
              EXPECT_TRUE(std::isfinite(res.Out("mu").at(r))) << "mu[" << r << "]";
            }
            for (int64_t j = 0; j < h; ++j)
              EXPECT_TRUE(std::isfinite(z.at(r * h + j))) << "z[" << r << ", " << j << "]";
          }
          for (int64_t r : {2, 4}) {
            if (ln) {
              EXPECT_FALSE(std::isfinite(res.Out("mu").at(r))) << "mu[" << r << "]";
              EXPECT_FALSE(std::isfinite(rs.at(r))) << "rsigma[" << r << "]";
            } else {
              EXPECT_EQ(rs.at(r), 0.0) << "rsigma[" << r << "]";
            }
            EXPECT_TRUE(std::isnan(z.at(r * h + (r == 2 ? 5 : 0)))) << "z at the inf of row " << r;
          }
        });
      }
    }
  }
}

// A NaN in dz propagates through the backward ops: the row's dx and the
// column's dgamma / dbeta; the other columns of dgamma stay finite.
TEST(NormConformanceSpecial, NanInBackward) {
  for (const char* op : {"layernorm_bwd", "rmsnorm_bwd", "rmsnorm_bwd_add"}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const int64_t h = 67;
      const std::string seed = fmt::format("{}_{}_nan", op, tefl::DTypeName(t));
      SCOPED_TRACE(seed);
      Problem p = MakeProblem(op, {t, t, DType::kF32}, false, {4, h}, seed);
      p.In("dz").set(2 * h + 11, std::nan(""));
      CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
        SCOPED_TRACE(impl);
        const Tensor& dx = res.Out("dx");
        for (int64_t j = 0; j < h; ++j) EXPECT_TRUE(std::isnan(dx.at(2 * h + j))) << "dx[2, " << j << "]";
        for (int64_t r : {0, 1, 3})
          for (int64_t j = 0; j < h; ++j)
            EXPECT_TRUE(std::isfinite(dx.at(r * h + j))) << "dx[" << r << ", " << j << "]";
        const Tensor& dg = res.Out("dgamma");
        for (int64_t j = 0; j < h; ++j) EXPECT_EQ(std::isnan(dg.at(j)), j == 11) << "dgamma[" << j << "]";
      });
    }
  }
}

// eps = 0 with an all-zero row: the reference gives rsigma = inf for that
// row (1/sqrt(0)); every implementation must reproduce the reference's
// finiteness pattern (z = 0 * inf = NaN there), other rows unaffected.
TEST(NormConformanceSpecial, ZeroEpsZeroRow) {
  for (const char* op : {"layernorm_fwd", "rmsnorm_fwd"}) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (int64_t h : {33, 64}) {
        for (bool zcg : {false, true}) {
          const std::string seed = fmt::format("{}_{}_{}_{}_eps0", op, tefl::DTypeName(t), h, zcg);
          SCOPED_TRACE(seed);
          Problem p = MakeFwd(op, t, t, 4, h, 0.0f, zcg, seed);
          Tensor& x = p.In("x");
          for (int64_t j = 0; j < h; ++j) x.set(1 * h + j, 0.0);
          // A constant row has zero variance too (LayerNorm); 0.75 keeps the
          // mean exact in any summation order.
          for (int64_t j = 0; j < h; ++j) x.set(3 * h + j, 0.75);
          CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
            SCOPED_TRACE(impl);
            const Tensor& rs = res.Out("rsigma");
            EXPECT_EQ(rs.at(1), std::numeric_limits<double>::infinity()) << "rsigma[1]";
            if (IsLayerNorm(op)) {
              EXPECT_EQ(rs.at(3), std::numeric_limits<double>::infinity()) << "rsigma[3]";
            }
            EXPECT_TRUE(std::isfinite(rs.at(0)) && std::isfinite(rs.at(2)));
          });
        }
      }
    }
  }
}

// Large outputs (>= 32 MiB) whose rows start 64-byte aligned: default.portable
// writes z with non-temporal stores there, a path the grid's sizes and the
// test allocator's alignment never reach.
TEST(NormConformanceSpecial, LargeAlignedOutputs) {
  struct Case {
    const char* op;
    DType t;
    int64_t rows, h;
  };
  for (const Case& c : {Case{"rmsnorm_fwd", DType::kF32, 1024, 8192}, Case{"layernorm_fwd", DType::kBF16, 2048, 8192},
                        Case{"layernorm_fwd", DType::kF16, 2048, 8192}}) {
    const std::string seed = fmt::format("{}_{}_large", c.op, tefl::DTypeName(c.t));
    SCOPED_TRACE(seed);
    Problem p = MakeFwd(c.op, c.t, c.t, c.rows, c.h, kEps, false, seed);
    Problem ref = p;
    ASSERT_TRUE(RunImpl(c.op, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs()).ok());
    for (const std::string& impl : CpuImplementations(c.op)) {
      SCOPED_TRACE("impl " + impl);
      Problem run = p;
      // z: a view into a larger buffer, moved to the next 64-byte boundary.
      const int64_t numel = c.rows * c.h;
      const size_t elem = c.t == DType::kF32 ? 4 : 2;
      Tensor buf(c.t, {numel + 64});
      buf.Fill(kSentinel);
      const Tensor pristine = buf;
      const uintptr_t addr = reinterpret_cast<uintptr_t>(buf.bytes());
      const uint64_t offset = (64 - addr % 64) % 64;
      ASSERT_EQ(offset % elem, 0u);
      DLTensor zv = buf.dl();
      std::vector<int64_t> zshape = {c.rows, c.h};
      zv.shape = zshape.data();
      zv.ndim = 2;
      zv.byte_offset = offset;
      std::vector<const DLTensor*> in;
      for (NamedTensor& n : run.in) in.push_back(n.t.ptr());
      std::vector<DLTensor*> out = {&zv};
      for (size_t i = 1; i < run.out.size(); ++i) out.push_back(run.out[i].t.ptr());
      const Status s = RunImplDL(c.op, impl, in, out, run.attrs());
      if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) continue;
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(buf.GuardsIntact());
      // Bytes of the buffer outside the view are untouched.
      const auto* b = static_cast<const unsigned char*>(buf.bytes());
      const auto* q = static_cast<const unsigned char*>(pristine.bytes());
      EXPECT_EQ(std::memcmp(b, q, offset), 0) << "wrote before z";
      const size_t end = offset + size_t(numel) * elem;
      EXPECT_EQ(std::memcmp(b + end, q + end, buf.nbytes() - end), 0) << "wrote after z";
      Tensor z(c.t, {c.rows, c.h});
      std::memcpy(z.bytes(), b + offset, size_t(numel) * elem);
      const CompareResult rz = Compare(z, ref.Out("z"), ToleranceOf("z", c.t));
      EXPECT_EQ(rz.mismatches, 0) << "'z': " << rz.ToString();
      for (size_t i = 1; i < run.out.size(); ++i) {
        EXPECT_TRUE(run.out[i].t.GuardsIntact()) << run.out[i].name;
        const CompareResult r = Compare(run.out[i].t, ref.out[i].t, ToleranceOf(run.out[i].name, run.out[i].t.dtype()));
        EXPECT_EQ(r.mismatches, 0) << "'" << run.out[i].name << "': " << r.ToString();
      }
    }
  }
}

// A backward dx of 32 MiB into a 64-byte aligned view (default.portable
// streams it with non-temporal stores) holds the same bytes as into a view
// one element further (not aligned: plain stores), and writes nothing outside
// the view. Checked against itself, not the reference: the grid covers the
// maths, and a reference run at this size takes minutes under ASan.
TEST(NormConformanceSpecial, LargeBackwardStreamedAsPlain) {
  for (const char* op : {"layernorm_bwd", "rmsnorm_bwd"}) {
    for (DType dt : {DType::kBF16, DType::kF32}) {
      SCOPED_TRACE(fmt::format("{} {}", op, DTypeName(dt)));
      const bool ln = std::string(op) == "layernorm_bwd";
      const int64_t rows = dt == DType::kF32 ? 1024 : 2048, h = 8192, numel = rows * h;
      const size_t elem = dt == DType::kF32 ? 4 : 2;
      Tensor dz(dt, {rows, h}), x(dt, {rows, h}), mu(DType::kF32, {rows}), rs(DType::kF32, {rows}), g(dt, {h});
      dz.Uniform("dz/large");
      x.Uniform("x/large");
      mu.Uniform("mu/large", -0.5, 0.5);
      rs.Uniform("rs/large", 0.5, 1.5);
      g.Uniform("g/large");
      tefl_norm_bwd_attrs attrs{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};
      std::vector<int64_t> shape = {rows, h};
      // dx at element `shift` past the buffer's first 64-byte boundary.
      const auto run = [&](int64_t shift, Tensor& buf, Tensor& dg, Tensor& db) {
        buf.Fill(kSentinel);
        const uintptr_t addr = reinterpret_cast<uintptr_t>(buf.bytes());
        DLTensor dx = buf.dl();
        dx.shape = shape.data();
        dx.ndim = 2;
        dx.byte_offset = (64 - addr % 64) % 64 + uint64_t(shift) * elem;
        std::vector<const DLTensor*> in = {dz.ptr(), x.ptr()};
        if (ln) in.push_back(mu.ptr());
        in.push_back(rs.ptr());
        in.push_back(g.ptr());
        std::vector<DLTensor*> out = {&dx, dg.ptr()};
        if (ln) out.push_back(db.ptr());
        const Status s = RunImplDL(op, "default.portable", in, out, &attrs);
        EXPECT_TRUE(s.ok()) << s.ToString();
        return size_t(dx.byte_offset);
      };
      Tensor streamed(dt, {numel + 64}), plain(dt, {numel + 64});
      Tensor dg1(dt, {h}), db1(dt, {h}), dg2(dt, {h}), db2(dt, {h});
      const size_t o1 = run(0, streamed, dg1, db1);
      const size_t o2 = run(1, plain, dg2, db2);
      const auto* b1 = static_cast<const unsigned char*>(streamed.bytes());
      const auto* b2 = static_cast<const unsigned char*>(plain.bytes());
      EXPECT_EQ(std::memcmp(b1 + o1, b2 + o2, size_t(numel) * elem), 0) << "streamed dx differs";
      EXPECT_TRUE(dg1.SameBytes(dg2));
      if (ln) {
        EXPECT_TRUE(db1.SameBytes(db2));
      }
      EXPECT_TRUE(streamed.GuardsIntact());
      Tensor sentinel(dt, {1});
      sentinel.Fill(kSentinel);
      for (size_t i = 0; i < o1; i += elem)
        EXPECT_EQ(std::memcmp(b1 + i, sentinel.bytes(), elem), 0) << "wrote before dx";
      for (size_t i = o1 + size_t(numel) * elem; i < streamed.nbytes(); i += elem)
        ASSERT_EQ(std::memcmp(b1 + i, sentinel.bytes(), elem), 0) << "wrote after dx";
    }
  }
}

// The implementations this file covers (printed for the log; at least the
// two built-ins for every op).
// rmsnorm_bwd_add in place (dx is add): every implementation gives what it
// gives out of place, in every float dtype.
TEST(NormConformanceSpecial, RmsNormBwdAddInPlace) {
  for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const std::string& impl : CpuImplementations("rmsnorm_bwd_add")) {
      SCOPED_TRACE(std::string(DTypeName(dt)) + " " + impl);
      Tensor dz(dt, {5, 67}), x(dt, {5, 67}), add(dt, {5, 67}), rs(DType::kF32, {5}), g(dt, {67});
      dz.Uniform("dz");
      x.Uniform("x");
      add.Uniform("add");
      rs.Uniform("rs", 0.5, 1.5);
      g.Uniform("g");
      Tensor dx(dt, {5, 67}), dg(dt, {67}), dg2(dt, {67});
      tefl_norm_bwd_attrs attrs{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};
      const Status out_of_place = RunImpl("rmsnorm_bwd_add", impl, {&dz, &x, &add, &rs, &g}, {&dx, &dg}, &attrs);
      if (!MustServe(impl) && out_of_place.IsUnsupported()) continue;
      ASSERT_TRUE(out_of_place.ok()) << out_of_place.ToString();
      Tensor inplace = add;  // becomes dx
      ASSERT_TRUE(RunImpl("rmsnorm_bwd_add", impl, {&dz, &x, &inplace, &rs, &g}, {&inplace, &dg2}, &attrs).ok());
      EXPECT_TRUE(inplace.SameBytes(dx)) << "in-place dx differs from out-of-place dx";
      EXPECT_TRUE(dg2.SameBytes(dg));
    }
  }
}

TEST(NormConformanceSpecial, ImplementationsCovered) {
  for (const char* op : kOps) {
    const std::vector<std::string> ids = CpuImplementations(op);
    std::string list;
    for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
    std::printf("[  NOTE    ] %s: %s\n", op, list.c_str());
    for (const char* must : tefl::testing::kMustServeImpls)
      EXPECT_NE(std::find(ids.begin(), ids.end(), must), ids.end()) << op << " lacks " << must;
  }
}

}  // namespace
