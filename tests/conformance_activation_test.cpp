// Conformance of every registered implementation of the 29 activation ops
// against the oracle, reference.cpp (double arithmetic, one rounding per
// output), with TransformerEngine's tolerances (spec/ops.md, Tolerances); the
// reference's backward against central finite differences of its forward;
// validation (bad shapes, dtypes and attributes leave outputs untouched); and
// NaN / Inf behaviour.
//
// Implementations are enumerated from the default registry, so a new backend
// is covered without touching this file; each is run alone through a strict
// policy (RunImpl): the call runs exactly that implementation or fails.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <iterator>
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
using tefl::testing::Named;
using tefl::testing::NamedTensor;
using tefl::testing::Ptrs;
using tefl::testing::RunImpl;
using tefl::testing::RunImplDL;
using tefl::testing::Tensor;
using tefl::testing::Tolerance;
using tefl::testing::ToleranceFor;
using tefl::testing::WithPortableSwitch;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;  // outputs start as this
constexpr double kInf = std::numeric_limits<double>::infinity();
const double kNaN = std::nan("");

// ---- The ops ----------------------------------------------------------------------------
enum class Kind { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };

struct OpInfo {
  const char* name;
  Kind kind;
  const char* fwd;  // the forward op whose derivative this is (itself for forward ops)
  bool clamped;     // takes tefl_clamped_swiglu_attrs
  bool kink0;       // derivative jumps at 0 (relu family)
};

const OpInfo kOps[] = {
    {"gelu", Kind::kFwd, "gelu", false, false},
    {"qgelu", Kind::kFwd, "qgelu", false, false},
    {"relu", Kind::kFwd, "relu", false, true},
    {"srelu", Kind::kFwd, "srelu", false, true},
    {"silu", Kind::kFwd, "silu", false, false},
    {"dgelu", Kind::kBwd, "gelu", false, false},
    {"dqgelu", Kind::kBwd, "qgelu", false, false},
    {"drelu", Kind::kBwd, "relu", false, true},
    {"dsrelu", Kind::kBwd, "srelu", false, true},
    {"dsilu", Kind::kBwd, "silu", false, false},
    {"glu", Kind::kGatedFwd, "glu", false, false},
    {"geglu", Kind::kGatedFwd, "geglu", false, false},
    {"qgeglu", Kind::kGatedFwd, "qgeglu", false, false},
    {"reglu", Kind::kGatedFwd, "reglu", false, true},
    {"sreglu", Kind::kGatedFwd, "sreglu", false, true},
    {"swiglu", Kind::kGatedFwd, "swiglu", false, false},
    {"clamped_swiglu", Kind::kGatedFwd, "clamped_swiglu", true, false},
    {"dglu", Kind::kGatedBwd, "glu", false, false},
    {"dgeglu", Kind::kGatedBwd, "geglu", false, false},
    {"dqgeglu", Kind::kGatedBwd, "qgeglu", false, false},
    {"dreglu", Kind::kGatedBwd, "reglu", false, true},
    {"dsreglu", Kind::kGatedBwd, "sreglu", false, true},
    {"dswiglu", Kind::kGatedBwd, "swiglu", false, false},
    {"clamped_dswiglu", Kind::kGatedBwd, "clamped_swiglu", true, false},
    {"dbias_dgelu", Kind::kDbias, "gelu", false, false},
    {"dbias_dsilu", Kind::kDbias, "silu", false, false},
    {"dbias_drelu", Kind::kDbias, "relu", false, true},
    {"dbias_dqgelu", Kind::kDbias, "qgelu", false, false},
    {"dbias_dsrelu", Kind::kDbias, "srelu", false, true},
};

const OpInfo& Info(const std::string& name) {
  for (const OpInfo& o : kOps)
    if (name == o.name) return o;
  ADD_FAILURE() << "unknown op " << name;
  return kOps[0];
}

bool Gated(Kind k) { return k == Kind::kGatedFwd || k == Kind::kGatedBwd; }
bool HasGrad(Kind k) { return k == Kind::kBwd || k == Kind::kGatedBwd || k == Kind::kDbias; }

// ---- One call's tensors -------------------------------------------------------------------
// dtypes of one case: x (fwd_input), g (grad), y (output / dinput), db (dbias).
struct Combo {
  DType x, g, y, db;
};
const char* Short(DType t) { return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16"; }
std::string ComboName(const Combo& c) {
  if (c.x == c.g && c.x == c.y && c.x == c.db) return Short(c.x);
  return fmt::format("x{}_g{}_y{}_db{}", Short(c.x), Short(c.g), Short(c.y), Short(c.db));
}

struct Problem {
  OpInfo op;
  std::vector<NamedTensor> in, out;
  tefl_clamped_swiglu_attrs clamp{TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};
  bool default_attrs = false;  // pass NULL attrs (clamped ops)

  const void* attrs() const { return op.clamped && !default_attrs ? &clamp : nullptr; }
  Tensor& In(const std::string& name) { return Named(in, name, "input"); }
  Tensor& Out(const std::string& name) { return Named(out, name, "output"); }
};

Tensor Output(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  o.Fill(kSentinel);
  return o;
}

std::vector<int64_t> WithLast(std::vector<int64_t> lead, int64_t last) {
  lead.push_back(last);
  return lead;
}

// Inputs (uniform in [-2, 1), seeded by name) and sentinel outputs of `op`
// for leading dims `lead` and hidden size h (gated inputs are [lead, 2h]).
Problem MakeProblem(const OpInfo& op, const Combo& c, const std::vector<int64_t>& lead, int64_t h,
                    const std::string& seed) {
  Problem p;
  p.op = op;
  const std::vector<int64_t> xs = WithLast(lead, Gated(op.kind) ? 2 * h : h);
  const std::vector<int64_t> hs = WithLast(lead, h);
  auto input = [&](const std::string& name, DType t, const std::vector<int64_t>& shape) {
    Tensor v(t, shape);
    v.Uniform(name + "/" + seed);
    p.in.push_back({name, v});
  };
  switch (op.kind) {
    case Kind::kFwd:
      input("input", c.x, xs);
      p.out.push_back({"output", Output(c.y, xs)});
      break;
    case Kind::kGatedFwd:
      input("input", c.x, xs);
      p.out.push_back({"output", Output(c.y, hs)});
      break;
    case Kind::kBwd:
    case Kind::kDbias:
      input("grad", c.g, xs);
      input("fwd_input", c.x, xs);
      p.out.push_back({"dinput", Output(c.y, xs)});
      if (op.kind == Kind::kDbias) p.out.push_back({"dbias", Output(c.db, {h})});
      break;
    case Kind::kGatedBwd:
      input("grad", c.g, hs);
      input("fwd_input", c.x, xs);
      p.out.push_back({"dinput", Output(c.y, xs)});
      break;
  }
  return p;
}

// dbias is a sum over N rows: its error is bounded relative to the sum of
// the terms' magnitudes, not to the (possibly cancelling) sum itself. Each
// column j passes when |t - r| <= atol + rtol * sum_i |dinput[i, j]| (TE's
// dtype atol/rtol; the terms from the reference's dinput), or when t and r
// are neighbouring values of a 16-bit dbias.
CompareResult CompareDbias(const Tensor& got, const Tensor& want, const Tensor& ref_dinput) {
  CompareResult r;
  const int64_t h = want.numel();
  const int64_t rows = h == 0 ? 0 : ref_dinput.numel() / h;
  const Tolerance tol = ToleranceFor(got.dtype());
  for (int64_t j = 0; j < h; ++j) {
    double mag = 0.0;
    for (int64_t i = 0; i < rows; ++i) mag += std::fabs(ref_dinput.at(i * h + j));
    const double t = got.at(j), e = want.at(j);
    bool bad;
    if (std::isnan(e) || std::isnan(t)) {
      bad = std::isnan(e) != std::isnan(t);
    } else if (std::isinf(e) || std::isinf(t)) {
      bad = t != e;
    } else {
      const double diff = std::fabs(t - e);
      r.max_abs = std::max(r.max_abs, diff);
      if (mag > 0) r.max_rel = std::max(r.max_rel, diff / mag);
      bad = diff > tol.atol + tol.rtol * mag;
      if (bad && got.dtype() != DType::kF32) {
        // One unit in the last place of e in the 16-bit dtype.
        const double ulp = std::ldexp(1.0, std::ilogb(e == 0 ? 1e-30 : e) - (got.dtype() == DType::kBF16 ? 7 : 10));
        bad = diff > ulp;
      }
    }
    if (bad) {
      if (r.first_bad < 0) r.first_bad = j;
      ++r.mismatches;
    }
  }
  return r;
}

// Runs every CPU implementation on `p` and compares each output with the
// reference's. `check` (optional) runs extra assertions on every result
// (the reference's included).
using ExtraCheck = std::function<void(const std::string& impl, Problem& result)>;

void CheckAllImplementations(Problem& p, const ExtraCheck& check = nullptr) {
  Problem ref = p;
  {
    const Status s = RunImpl(p.op.name, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs());
    ASSERT_TRUE(s.ok()) << "reference: " << s.ToString();
    for (NamedTensor& o : ref.out) ASSERT_TRUE(o.t.GuardsIntact()) << "reference wrote outside '" << o.name << "'";
    for (NamedTensor& o : ref.out) {
      for (int64_t i = 0; i < o.t.numel(); ++i) {
        ASSERT_NE(o.t.at(i), kSentinel) << "reference left '" << o.name << "'[" << i << "] unwritten";
      }
    }
    if (check) check(kReference, ref);
  }
  const std::vector<std::string> impls = CpuImplementations(p.op.name);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered";
  for (const std::string& impl : impls) {
    if (impl == kReference) continue;
    SCOPED_TRACE("impl " + impl);
    Problem run = p;  // fresh sentinel outputs, pristine inputs
    const Status s = RunImpl(p.op.name, impl, Ptrs(run.in), Ptrs(run.out), run.attrs());
    if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) {
      std::printf("[  NOTE    ] %s declined %s: %s\n", impl.c_str(), p.op.name, s.message().c_str());
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
      const Tolerance tol = ToleranceFor(got.t.dtype());
      const CompareResult r =
          got.name == "dbias" ? CompareDbias(got.t, want.t, ref.out[0].t) : Compare(got.t, want.t, tol);
      EXPECT_EQ(r.mismatches, 0) << "'" << got.name << "' (" << tefl::DTypeName(got.t.dtype()) << ", atol " << tol.atol
                                 << ", rtol " << tol.rtol << "): " << r.ToString()
                                 << (r.first_bad >= 0
                                         ? fmt::format(" got {} want {}", got.t.at(r.first_bad), want.t.at(r.first_bad))
                                         : std::string());
    }
    if (check) check(impl, run);
  }
}

// ---- The grid: op x dtypes, every shape --------------------------------------------------
const Combo kCombos[] = {
    {DType::kF32, DType::kF32, DType::kF32, DType::kF32},
    {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16},
    {DType::kF16, DType::kF16, DType::kF16, DType::kF16},
    // mixed: bf16 input with fp32 grad and output; fp32 input, fp16 grad, bf16 output
    {DType::kBF16, DType::kF32, DType::kF32, DType::kF32},
    {DType::kF32, DType::kF16, DType::kBF16, DType::kF32},
};

// Leading dims and H (gated inputs have 2H): zero rows, zero H, single rows,
// H off every vector width, rank 3, and enough elements for several threads
// (64 x 1000: several 8192-element blocks; 100 rows: dbias blocks of 50 rows).
struct Shape {
  std::vector<int64_t> lead;
  int64_t h;
};
const Shape kShapes[] = {{{0}, 17}, {{4}, 0},     {{1}, 1},   {{1}, 3},    {{1}, 129},  {{3}, 17},
                         {{5}, 33}, {{2, 3}, 33}, {{6}, 129}, {{100}, 40}, {{64}, 1000}};

std::string ShapeName(const Shape& s) {
  std::string n;
  for (int64_t d : s.lead) n += std::to_string(d) + "x";
  return n + "H" + std::to_string(s.h);
}

using GridParam = std::tuple<int, int>;  // op, combo

std::string GridName(const GridParam& p) {
  return fmt::format("{}_{}", kOps[std::get<0>(p)].name, ComboName(kCombos[std::get<1>(p)]));
}

class ActivationConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(ActivationConformance, MatchesReference) {
  const auto& [op, combo] = GetParam();
  for (const Shape& shape : kShapes) {
    const std::string seed = fmt::format("{}_{}_{}", kOps[op].name, ComboName(kCombos[combo]), ShapeName(shape));
    SCOPED_TRACE(seed);
    Problem p = MakeProblem(kOps[op], kCombos[combo], shape.lead, shape.h, seed);
    // An active clamp (the data is in [-2, 1)): both sides of both clamps.
    p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 0.75f, 1.5f};
    CheckAllImplementations(p);
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, ActivationConformance,
                         ::testing::Combine(::testing::Range(0, int(std::size(kOps))),
                                            ::testing::Range(0, int(std::size(kCombos)))),
                         [](const ::testing::TestParamInfo<GridParam>& param_info) {
                           return GridName(param_info.param);
                         });

// ---- Clamped SwiGLU: defaults, attributes, boundaries -------------------------------------
// NULL attrs mean limit 7, alpha 1.702; data scaled to [-16, 8) crosses both
// clamps.
TEST(ActivationSpecial, ClampedDefaultsAndAttrs) {
  for (const char* name : {"clamped_swiglu", "clamped_dswiglu"}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      const std::string seed = fmt::format("{}_{}_defaults", name, Short(t));
      SCOPED_TRACE(seed);
      Problem p = MakeProblem(Info(name), {t, t, t, t}, {9}, 45, seed);
      Tensor& x = p.In(p.op.kind == Kind::kGatedFwd ? "input" : "fwd_input");
      for (int64_t i = 0; i < x.numel(); ++i) x.set(i, x.at(i) * 8.0);
      p.default_attrs = true;
      Problem explicit_attrs = p;
      explicit_attrs.default_attrs = false;
      explicit_attrs.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};
      CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
        Problem e = explicit_attrs;
        ASSERT_TRUE(RunImpl(name, impl, Ptrs(e.in), Ptrs(e.out), e.attrs()).ok());
        EXPECT_TRUE(e.out[0].t.SameBytes(res.out[0].t)) << impl << ": NULL attrs differ from {7, 1.702}";
      });
      for (float alpha : {-0.5f, 3.0f}) {
        Problem q = p;
        q.default_attrs = false;
        q.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 2.5f, alpha};
        CheckAllImplementations(q);
      }
      Problem unbounded = p;  // limit +inf: no clamp at all
      unbounded.default_attrs = false;
      unbounded.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, std::numeric_limits<float>::infinity(), 1.702f};
      CheckAllImplementations(unbounded);
    }
  }
}

// TE's boundaries: a == limit passes gradient to a, a above it does not;
// b passes gradient iff -limit <= b <= limit. Checked by value on every
// implementation (the reference included).
TEST(ActivationSpecial, ClampedBoundaries) {
  const float lim = 2.5f, alpha = 1.702f;
  const float up = std::nextafter(lim, 10.0f), down = std::nextafter(-lim, -10.0f);
  // (a, b) pairs: a at, above and below the limit; b at and beyond +-limit.
  const std::vector<std::pair<float, float>> ab = {{lim, 0.5f},  {up, 0.5f},   {0.5f, lim},   {0.5f, up},
                                                   {0.5f, -lim}, {0.5f, down}, {-9.0f, 9.0f}, {9.0f, -9.0f}};
  const int64_t h = int64_t(ab.size());
  auto sig = [](double v) { return 1.0 / (1.0 + std::exp(-v)); };
  for (const std::string& impl : CpuImplementations("clamped_dswiglu")) {
    SCOPED_TRACE(impl);
    Tensor x(DType::kF32, {1, 2 * h}), g(DType::kF32, {1, h});
    for (int64_t j = 0; j < h; ++j) {
      x.set(j, ab[size_t(j)].first);
      x.set(h + j, ab[size_t(j)].second);
      g.set(j, 1.0);
    }
    tefl_clamped_swiglu_attrs attrs{TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, lim, alpha};
    Tensor dx = Output(DType::kF32, {1, 2 * h}), y = Output(DType::kF32, {1, h});
    ASSERT_TRUE(RunImpl("clamped_dswiglu", impl, {&g, &x}, {&dx}, &attrs).ok());
    ASSERT_TRUE(RunImpl("clamped_swiglu", impl, {&x}, {&y}, &attrs).ok());
    for (int64_t j = 0; j < h; ++j) {
      const double a = ab[size_t(j)].first, b = ab[size_t(j)].second;
      const double ac = std::min(a, double(lim)), bc = std::clamp(b, -double(lim), double(lim)) + 1.0;
      const double s = sig(double(alpha) * ac);
      const double act = ac * s, dact = a > lim ? 0.0 : double(alpha) * ac * s * (1 - s) + s;
      const double db = (b < -lim || b > lim) ? 0.0 : act;
      SCOPED_TRACE(fmt::format("a={} b={}", a, b));
      EXPECT_NEAR(y.at(j), act * bc, 1e-6 + 5e-6 * std::fabs(act * bc));
      EXPECT_NEAR(dx.at(j), dact * bc, 1e-6 + 5e-6 * std::fabs(dact * bc));
      EXPECT_NEAR(dx.at(h + j), db, 1e-6 + 5e-6 * std::fabs(db));
      if (a > lim) {
        EXPECT_EQ(dx.at(j), 0.0) << "gradient through the active clamp of a";
      }
      if (a == lim) {
        EXPECT_NE(dx.at(j), 0.0) << "a == limit passes gradient (TE)";
      }
      if (b < -lim || b > lim) {
        EXPECT_EQ(dx.at(h + j), 0.0) << "gradient through the active clamp of b";
      }
      if (b == lim || b == -lim) {
        EXPECT_NE(dx.at(h + j), 0.0) << "|b| == limit passes gradient (TE)";
      }
    }
  }
}

// ---- NaN and Inf ---------------------------------------------------------------------------
// Values around every threshold of the formulas (exp overflow at 88.7, the
// clamp limit 7, fp32 x^2 overflow above 1.8e19, FLT_MAX) plus NaN, +-inf,
// +-0 and subnormals.
std::vector<double> SpecialValues() {
  return {kNaN,
          kInf,
          -kInf,
          0.0,
          -0.0,
          1e-40,
          -1e-40,
          1e-30,
          1e30,
          -1e30,
          double(FLT_MAX),
          -double(FLT_MAX),
          100.0,
          -100.0,
          88.75,
          -88.75,
          20.0,
          -20.0,
          9.5,
          -9.5,
          7.0,
          -7.0,
          double(std::nextafter(7.0f, 8.0f)),
          double(std::nextafter(-7.0f, -8.0f)),
          0.5,
          -0.5,
          3e19,
          -3e19,
          1e19,
          -1e19,
          1.0,
          -1.0};
}

// Every op with special values in x (in each half of a gated input) and, for
// backward ops, in grad: every implementation agrees with the reference on
// NaN-ness and infinities (Compare), and NaN in gives NaN out in the same
// element.
//
// fp32 evaluation overflows where an intermediate passes FLT_MAX even when the
// exact result would not (srelu(3e19) * 0.1, FLT_MAX * gelu'(0.9) * 0.5), as
// TE's fp32 kernels do; the double reference stays finite there. So the
// factors next to a special value are fixed at 1.5 (grad and the gate next
// to a special x), and grad specials stop at 1e30, next to x = 0.5 (a huge
// grad scales the fp32 error of act'(x) near its roots past any atol).
TEST(ActivationSpecial, NanAndInf) {
  const std::vector<double> sv = SpecialValues();
  const int64_t h = int64_t(sv.size());
  for (const OpInfo& op : kOps) {
    for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
      for (bool in_grad : {false, true}) {
        if (in_grad && !HasGrad(op.kind)) continue;
        const std::string seed = fmt::format("{}_{}_{}", op.name, Short(t), in_grad ? "grad" : "x");
        SCOPED_TRACE(seed);
        // Row 0: specials in x (gated: in a, with b = 1.5), grad 1.5.
        // Row 1: specials in b (gated), else plain data. Row 2: specials in
        // grad (when in_grad), else plain data.
        Problem p = MakeProblem(op, {t, t, t, t}, {3}, h, seed);
        p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};
        const bool gated = Gated(op.kind);
        Tensor& x = p.In(op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd ? "input" : "fwd_input");
        const int64_t xw = gated ? 2 * h : h;
        if (in_grad) {
          for (int64_t j = 0; j < h; ++j) {
            const double v = std::fabs(sv[size_t(j)]) > 1e30 && std::isfinite(sv[size_t(j)]) ? 1e30 : sv[size_t(j)];
            p.In("grad").set(2 * h + j, v);
            x.set(2 * xw + j, 0.5);  // act' well away from its roots
          }
        } else {
          for (int64_t j = 0; j < h; ++j) {
            x.set(j, sv[size_t(j)]);
            if (gated) x.set(h + j, 1.5);
            if (HasGrad(op.kind)) p.In("grad").set(j, 1.5);
          }
          if (gated)
            for (int64_t j = 0; j < h; ++j) x.set(xw + h + j, sv[size_t(j)]);
        }
        CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
          SCOPED_TRACE(impl);
          const Tensor& y = res.out[0].t;
          for (int64_t j = 0; j < h; ++j) {
            if (!std::isnan(sv[size_t(j)])) continue;
            if (in_grad) {
              // dinput (the activation half for gated ops) is NaN where grad is.
              EXPECT_TRUE(std::isnan(y.at(gated ? 2 * (2 * h) + j : 2 * h + j))) << "grad NaN at " << j;
            } else if (op.kind == Kind::kFwd || op.kind == Kind::kBwd || op.kind == Kind::kDbias) {
              EXPECT_TRUE(std::isnan(y.at(j))) << "x NaN at " << j;
            } else if (op.kind == Kind::kGatedFwd) {
              EXPECT_TRUE(std::isnan(y.at(j))) << "a NaN at " << j;
              EXPECT_TRUE(std::isnan(y.at(h + j))) << "b NaN at " << j;
            } else {
              EXPECT_TRUE(std::isnan(y.at(j))) << "da at a NaN, " << j;
              EXPECT_TRUE(std::isnan(y.at(h + j))) << "db at a NaN, " << j;
              EXPECT_TRUE(std::isnan(y.at(xw + j))) << "da at b NaN, " << j;
            }
          }
          if (op.kind == Kind::kDbias && !in_grad) {
            EXPECT_TRUE(std::isnan(res.Out("dbias").at(0))) << "dbias of the NaN column";
          }
        });
      }
    }
  }
}

// A dense sweep of x over [-30, 30] (step 1/1024: every exp range the
// formulas reach, both tails of every sigmoid) with grad 1 and gate 1, fp32:
// every implementation within TE's fp32 rule everywhere. The worst ratio
// min(|error| / atol, relative error / rtol) (a mismatch above 1) is printed
// for the record.
TEST(ActivationSpecial, DenseSweep) {
  const int64_t n = 60 * 1024 + 1;
  for (const OpInfo& op : kOps) {
    SCOPED_TRACE(op.name);
    const bool gated = Gated(op.kind);
    Problem p = MakeProblem(op, {DType::kF32, DType::kF32, DType::kF32, DType::kF32}, {1}, n, "sweep");
    Tensor& x = p.In(op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd ? "input" : "fwd_input");
    for (int64_t j = 0; j < n; ++j) {
      x.set(j, -30.0 + double(j) / 1024.0);
      if (gated) x.set(n + j, 1.0);
    }
    if (HasGrad(op.kind)) p.In("grad").Fill(1.0);
    CheckAllImplementations(p, [&](const std::string& impl, Problem& res) {
      if (impl == kReference) return;
      Problem ref = p;
      ASSERT_TRUE(RunImpl(op.name, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs()).ok());
      double worst = 0.0;
      const Tensor& got = res.out[0].t;
      const Tensor& want = ref.out[0].t;
      for (int64_t i = 0; i < want.numel(); ++i) {
        const double w = want.at(i), g = got.at(i), diff = std::fabs(g - w);
        if (!std::isfinite(w)) continue;
        const double by_rel = w == 0 ? kInf : diff / std::fabs(w) / 5e-6;
        worst = std::max(worst, std::min(diff / 1e-6, by_rel));
      }
      std::printf("[  NOTE    ] %s on %s: worst error / tolerance %.3f\n", op.name, impl.c_str(), worst);
    });
  }
}

// The relu family's bf16 results are exact in fp32 (products of at most three
// bf16 significands), so their rounding to bf16 meets exact ties; those
// round to even on every target, as the reference does, while the sigmoid
// ops' full steps may round ties away from zero on AVX2/SSE4 (activation.cpp,
// kBf16TiesAway). Data 1 + j/128 times 1 + r/128 (gate or gradient): every
// output bit for bit equal to the reference's, on data with ties.
TEST(ActivationSpecial, ExactOpsRoundBf16TiesToEven) {
  const int64_t rows = 128, h = 128;
  int64_t ties = 0;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < h; ++j) {
      const float prod = float(1.0 + double(j) / 128.0) * float(1.0 + double(r) / 128.0);  // exact
      uint32_t bits;
      std::memcpy(&bits, &prod, sizeof(bits));
      ties += (bits & 0xFFFFu) == 0x8000u;
    }
  ASSERT_EQ(ties, 281);  // the data has ties to round
  for (const char* name :
       {"relu", "srelu", "drelu", "dsrelu", "reglu", "sreglu", "dreglu", "dsreglu", "dbias_drelu", "dbias_dsrelu"}) {
    SCOPED_TRACE(name);
    const OpInfo& op = Info(name);
    const bool fwd = op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd;
    Problem p = MakeProblem(op, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16}, {rows}, h, "ties");
    Tensor& x = p.In(fwd ? "input" : "fwd_input");
    const int64_t w = Gated(op.kind) ? 2 * h : h;
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < h; ++j) {
        x.set(r * w + j, 1.0 + double(j) / 128.0);
        if (Gated(op.kind)) x.set(r * w + h + j, 1.0 + double(r) / 128.0);
      }
    if (HasGrad(op.kind)) {
      Tensor& g = p.In("grad");
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t j = 0; j < h; ++j) g.set(r * h + j, 1.0 + double(r) / 128.0);
    }
    Problem ref = p, run = p;
    ASSERT_TRUE(RunImpl(op.name, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs()).ok());
    ASSERT_TRUE(RunImpl(op.name, "default.portable", Ptrs(run.in), Ptrs(run.out), run.attrs()).ok());
    // dbias (a column sum, rounded once) is not one product: outputs[0] only.
    const Tensor& got = run.out[0].t;
    const Tensor& want = ref.out[0].t;
    const auto* gb = static_cast<const uint16_t*>(got.bytes());
    const auto* wb = static_cast<const uint16_t*>(want.bytes());
    int64_t bad = 0;
    for (int64_t i = 0; i < want.numel(); ++i)
      if (gb[i] != wb[i] && bad++ < 5)
        ADD_FAILURE() << "element " << i << ": bits " << std::hex << gb[i] << ", reference " << wb[i] << std::dec;
    EXPECT_EQ(bad, 0);
  }
}

// Ops with bf16 data take cheaper sigmoids in default.portable: forward ops
// a degree-3 exp and the reciprocal estimate without Newton step (relative
// error ~1.5e-4, under bf16's half ulp), derivatives a degree-4 exp (2.6e-6:
// they cancel near their roots). Every bf16 value in [-30, 30] (both tails
// of every sigmoid) with grad and gate 1: every op within TE's bf16 rule
// against the reference (dbias in bf16 too); forward ops, where |reference|
// >= atol, at most one bf16 ulp from it (one rounding of an error far below
// a half ulp; the share one ulp off is printed).
TEST(ActivationSpecial, DenseSweepBf16) {
  std::vector<double> xs;
  for (uint32_t b = 0; b < 0x10000u; ++b) {
    const double v = tefl::BF16ToFloat(uint16_t(b));
    if (std::isfinite(v) && std::fabs(v) <= 30.0) xs.push_back(v);
  }
  const int64_t n = int64_t(xs.size());
  for (const OpInfo& op : kOps) {
    SCOPED_TRACE(op.name);
    const bool gated = Gated(op.kind);
    const bool fwd = op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd;
    Problem p = MakeProblem(op, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16}, {1}, n, "sweep");
    Tensor& x = p.In(fwd ? "input" : "fwd_input");
    for (int64_t j = 0; j < n; ++j) {
      x.set(j, xs[size_t(j)]);
      if (gated) x.set(n + j, 1.0);
    }
    if (HasGrad(op.kind)) p.In("grad").Fill(1.0);
    Problem ref = p;
    ASSERT_TRUE(RunImpl(op.name, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs()).ok());
    Problem run = p;
    ASSERT_TRUE(RunImpl(op.name, "default.portable", Ptrs(run.in), Ptrs(run.out), run.attrs()).ok());
    const CompareResult r = Compare(run.out[0].t, ref.out[0].t, ToleranceFor(DType::kBF16));
    EXPECT_EQ(r.mismatches, 0) << r.ToString();
    if (op.kind == Kind::kDbias) {
      // One row: dbias is dinput summed in fp32 and rounded once.
      const CompareResult rd = Compare(run.out[1].t, ref.out[1].t, ToleranceFor(DType::kBF16));
      EXPECT_EQ(rd.mismatches, 0) << "'dbias': " << rd.ToString();
    }
    if (!fwd) continue;
    const auto* got = static_cast<const uint16_t*>(run.out[0].t.bytes());
    const auto* want = static_cast<const uint16_t*>(ref.out[0].t.bytes());
    int64_t off1 = 0;
    for (int64_t j = 0; j < n; ++j) {
      // Below atol the reference's own tail (1 + tanh(y) in double, for
      // gelu) is not accurate to a bf16 ulp; atol governs there.
      if (got[j] == want[j] || std::fabs(ref.out[0].t.at(j)) < 1e-5) continue;
      // Same sign: bf16 bit patterns are ordered by magnitude.
      const int d = int(got[j] & 0x7FFF) - int(want[j] & 0x7FFF);
      const bool neighbours =
          (got[j] & 0x8000) == (want[j] & 0x8000) ? (d == 1 || d == -1) : (got[j] & 0x7FFF) + (want[j] & 0x7FFF) == 1;
      if (neighbours) {
        ++off1;
      } else {
        ADD_FAILURE() << "x = " << xs[size_t(j)] << ": bits " << std::hex << got[j] << ", reference " << want[j];
      }
    }
    std::printf("[  NOTE    ] %s bf16 on default.portable: %.3f%% of %lld outputs one ulp from the reference\n",
                op.name, 100.0 * double(off1) / double(n), static_cast<long long>(n));
  }
}

// On AVX2 and SSE4, default.portable's all-bf16 gelu, geglu and the
// derivatives of gelu, qgelu and silu (dbias_ forms too) read tables of the
// fp32 path's values (activation.cpp, TEFL_PORTABLE_BF16_ACT_TABLE). Every
// bf16 bit pattern as x (geglu: as its activation half; NaNs and infinities
// included), gradients and gates with both signs and zeros: gelu is the
// fp32 gelu of the same values rounded to nearest even; geglu and dinput the
// fp32 path's products rounded with ties away from zero (StoreStep on these
// targets); dbias (fp32) the fp32 call's dbias bit for bit. With the switch
// off, gelu, geglu, dgelu, dqgelu and dsilu take the cheaper sigmoids, and
// together differ from the fp32 path somewhere (so the tables really ran;
// dgelu's degree-4 exp alone may round every output the same), while dbias_
// with an fp32 dbias computes the fp32 path's values as the table holds
// them: the same bits.
// The TEFL_PORTABLE_* switches: 0/off/false/no turn a path off (any case),
// 1/on/true/yes leave it on, anything else leaves it on with a WARNING that
// names the variable and the value (a value that only looked like "off" used
// to leave the path on silently: only a leading '0' was read).
TEST(ActivationSpecial, PortableSwitchValues) {
  using tefl::backends::PortablePath;
  using tefl::backends::PortablePathOn;
  const char* name = "TEFL_PORTABLE_BF16_FAST_ACT";
  for (const char* off : {"0", "off", "OFF", "false", "No"}) {
    EXPECT_FALSE(WithPortableSwitch(name, off, [] { return PortablePathOn(PortablePath::kBf16FastAct); })) << off;
  }
  for (const char* on : {"1", "on", "TRUE", "yes", ""}) {
    EXPECT_TRUE(WithPortableSwitch(name, on, [] { return PortablePathOn(PortablePath::kBf16FastAct); })) << on;
  }
  for (const char* bad : {"0x", "nope", "2"}) {
    tefl::testing::LogCapture logs(TEFL_LOG_WARNING);
    EXPECT_TRUE(WithPortableSwitch(name, bad, [] { return PortablePathOn(PortablePath::kBf16FastAct); })) << bad;
    EXPECT_EQ(logs.Count(fmt::format("TEFL_PORTABLE_BF16_FAST_ACT='{}' is not one of", bad)), 1) << bad;
  }
}

TEST(ActivationSpecial, Bf16TablesAreTheFp32Path) {
  const std::string target = tefl::backends::PortableTargetName();
  if (target != "AVX2" && target != "SSE4") GTEST_SKIP() << "no tables on target " << target;
  const int64_t rows = 256, h = 256;
  const auto bits_of = [](float v) {
    uint32_t u;
    std::memcpy(&u, &v, sizeof(u));
    return u;
  };
  int64_t computed_differing = 0;                                                    // switch off, the non-dbias ops
  const auto other = [](int64_t i) { return double((i * 37) % 201 - 100) / 16.0; };  // gradient or gate
  for (const char* name : {"gelu", "geglu", "dgelu", "dqgelu", "dsilu", "dbias_dgelu", "dbias_dqgelu", "dbias_dsilu"}) {
    SCOPED_TRACE(name);
    const OpInfo& op = Info(name);
    const bool fwd = op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd;
    const int64_t w = Gated(op.kind) ? 2 * h : h;  // x's row
    Problem b16 = MakeProblem(op, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kF32}, {rows}, h, "table");
    Tensor& x = b16.In(fwd ? "input" : "fwd_input");
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < h; ++j) {
        const uint16_t b = uint16_t(r * h + j);
        std::memcpy(static_cast<unsigned char*>(x.bytes()) + 2 * (r * w + j), &b, 2);
        if (Gated(op.kind)) x.set(r * w + h + j, other(r * h + j));
      }
    if (!fwd) {
      Tensor& g = b16.In("grad");
      for (int64_t i = 0; i < rows * h; ++i) g.set(i, other(i));
    }
    Problem f32 = MakeProblem(op, {DType::kF32, DType::kF32, DType::kF32, DType::kF32}, {rows}, h, "table");
    for (size_t k = 0; k < b16.in.size(); ++k)
      for (int64_t i = 0; i < b16.in[k].t.numel(); ++i) f32.in[k].t.set(i, b16.in[k].t.at(i));  // exact
    ASSERT_TRUE(RunImpl(name, "default.portable", Ptrs(f32.in), Ptrs(f32.out), nullptr).ok());
    for (const char* table : {"1", "0"}) {
      SCOPED_TRACE(std::string("TEFL_PORTABLE_BF16_ACT_TABLE=") + table);
      Problem run = b16;
      const Status st = WithPortableSwitch("TEFL_PORTABLE_BF16_ACT_TABLE", table, [&] {
        return RunImpl(name, "default.portable", Ptrs(run.in), Ptrs(run.out), nullptr);
      });
      ASSERT_TRUE(st.ok()) << st.ToString();
      const auto* got = static_cast<const uint16_t*>(run.out[0].t.bytes());
      const auto* wide = static_cast<const float*>(f32.out[0].t.bytes());
      const bool must_match = table[0] == '1' || op.kind == Kind::kDbias;
      int64_t differing = 0;
      for (int64_t i = 0; i < rows * h; ++i) {
        const float v = wide[i];
        const bool same = std::isnan(v)           ? tefl::BF16ToFloat(got[i]) != tefl::BF16ToFloat(got[i])
                          : op.kind == Kind::kFwd ? got[i] == tefl::FloatToBF16(v)
                                                  : got[i] == uint16_t((bits_of(v) + 0x8000u) >> 16);
        if (!same && differing++ < 5 && must_match)
          ADD_FAILURE() << "x bits " << std::hex << i << ": got " << got[i] << ", fp32 path " << bits_of(v) << std::dec;
      }
      if (op.kind == Kind::kDbias) {
        const auto* db = static_cast<const float*>(run.out[1].t.bytes());
        const auto* want = static_cast<const float*>(f32.out[1].t.bytes());
        for (int64_t j = 0; j < h; ++j) {
          const bool same = std::isnan(want[j]) ? std::isnan(db[j]) : bits_of(db[j]) == bits_of(want[j]);
          if (!same && differing++ < 5 && must_match)
            ADD_FAILURE() << "dbias column " << j << ": " << db[j] << ", fp32 path " << want[j];
        }
      }
      if (must_match) {
        EXPECT_EQ(differing, 0);
      } else {
        computed_differing += differing;
      }
    }
  }
  EXPECT_GT(computed_differing, 0) << "TEFL_PORTABLE_BF16_ACT_TABLE=0 made no difference";
}

// bf16 NaNs of every shape (quiet and signalling, smallest and largest
// payloads, both signs) in x, and in grad for the backward ops: every output
// next to them is NaN. default.portable's all-bf16 path rounds without a NaN
// select (RoundBF16HiFromBF16Data): a widened bf16 NaN has a zero low half,
// so the rounding bias cannot carry it into infinity or the sign.
TEST(ActivationSpecial, Bf16NanPayloads) {
  const uint16_t nans[] = {0x7FC0, 0xFFC0, 0x7F81, 0xFF81, 0x7FFF, 0xFFFF, 0x7FBF, 0xFFC1};
  const int64_t h = 72;  // a few whole steps and a tail on every target
  for (const OpInfo& op : kOps) {
    for (bool in_grad : {false, true}) {
      if (in_grad && !HasGrad(op.kind)) continue;
      SCOPED_TRACE(fmt::format("{} {}", op.name, in_grad ? "grad" : "x"));
      Problem p = MakeProblem(op, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16}, {1}, h, "nanpay");
      const bool fwd = op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd;
      Tensor& x = in_grad ? p.In("grad") : p.In(fwd ? "input" : "fwd_input");
      if (in_grad) p.In("fwd_input").Fill(0.5);
      std::vector<int64_t> at;
      for (int64_t j = 0; j < h; j += 5) at.push_back(j);
      for (size_t k = 0; k < at.size(); ++k) {
        const uint16_t b = nans[k % std::size(nans)];
        std::memcpy(static_cast<unsigned char*>(x.bytes()) + 2 * at[k], &b, 2);
      }
      ASSERT_TRUE(RunImpl(op.name, "default.portable", Ptrs(p.in), Ptrs(p.out), p.attrs()).ok());
      const Tensor& y = p.out[0].t;
      for (int64_t j : at) {
        EXPECT_TRUE(std::isnan(y.at(j))) << "output at " << j << ": " << y.at(j);
        if (op.kind == Kind::kGatedBwd && !in_grad) {
          EXPECT_TRUE(std::isnan(y.at(h + j))) << "db at " << j;
        }
      }
    }
  }
}

// The IEEE results of TE's formulas at +-inf, by value.
TEST(ActivationSpecial, InfinityLimits) {
  struct Case {
    const char* op;
    double x, want;  // want NaN: expect NaN
  };
  const Case cases[] = {
      {"gelu", kInf, kInf},   {"gelu", -kInf, kNaN},  // -inf * (0.5 + 0.5 tanh(-inf)) = -inf * 0
      {"silu", kInf, kInf},   {"silu", -kInf, kNaN},  {"qgelu", kInf, kInf}, {"qgelu", -kInf, kNaN},
      {"relu", kInf, kInf},   {"relu", -kInf, 0.0},   {"srelu", kInf, kInf}, {"srelu", -kInf, 0.0},
      {"dgelu", kInf, kNaN},  {"dgelu", -kInf, kNaN},  // inf * 0 in x (1 - t^2)
      {"dsilu", kInf, kNaN},  {"drelu", kInf, 1.0},   {"drelu", -kInf, 0.0}, {"dsrelu", kInf, kInf},
      {"dsrelu", -kInf, 0.0}, {"gelu", 1e30, 1e30},   {"gelu", -1e30, 0.0},  {"dgelu", 1e30, 1.0},
      {"dgelu", -1e30, 0.0},  {"dqgelu", 3e38, 1.0},  {"dsilu", -3e38, 0.0},
  };
  for (const Case& c : cases) {
    const OpInfo& op = Info(c.op);
    for (const std::string& impl : CpuImplementations(c.op)) {
      SCOPED_TRACE(fmt::format("{}({}) on {}", c.op, c.x, impl));
      Tensor x(DType::kF32, {1, 1}), g(DType::kF32, {1, 1}), y = Output(DType::kF32, {1, 1});
      x.set(0, c.x);
      g.set(0, 1.0);
      const Status s = op.kind == Kind::kFwd ? RunImpl(c.op, impl, {&x}, {&y}, nullptr)
                                             : RunImpl(c.op, impl, {&g, &x}, {&y}, nullptr);
      // A non-built-in implementation may decline (strict: FAILED_PRECONDITION)
      // but must not write then.
      if (!MustServe(impl) && (s.IsUnsupported() || s.code() == TEFL_FAILED_PRECONDITION)) {
        EXPECT_EQ(y.at(0), -31337.0) << "declined after writing";
        continue;
      }
      ASSERT_TRUE(s.ok()) << s.ToString();
      if (std::isnan(c.want)) {
        EXPECT_TRUE(std::isnan(y.at(0))) << "got " << y.at(0);
      } else {
        EXPECT_EQ(y.at(0), float(c.want));
      }
    }
  }
}

// ---- Reference backward vs finite differences of the reference forward ---------------------
// Central differences with the perturbed inputs rounded to fp32 first, so the
// step is exactly xp - xm: fd = g (f(xp) - f(xm)) / (xp - xm). Error bound:
// the fp32 rounding of f(xp) and f(xm) (2^-24 |f| each) over the step, plus
// truncation h^2/6 |f'''| (< 1e-5 for these functions at h = 1e-3). Points
// within 2h of a kink (0 for the relu family, +-limit for the clamps) are
// skipped. Non-gated ops perturb x; gated ops perturb a, then b.
Tensor Forward(const std::string& fwd, const Tensor& x, int64_t h_out, const void* attrs) {
  std::vector<int64_t> ys = x.shape();
  ys.back() = h_out;
  Tensor xin = x;
  Tensor y = Output(DType::kF32, ys);
  const Status s = RunImpl(fwd, kReference, {&xin}, {&y}, attrs);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return y;
}

TEST(ActivationGradient, ReferenceMatchesFiniteDifferences) {
  const double step = 1e-3;
  const int64_t rows = 4, h = 37;
  for (const OpInfo& op : kOps) {
    if (!HasGrad(op.kind)) continue;
    for (float limit : {7.0f, 0.75f}) {
      if (!op.clamped && limit != 7.0f) continue;
      SCOPED_TRACE(fmt::format("{} limit {}", op.name, limit));
      const bool gated = op.kind == Kind::kGatedBwd;
      Problem p = MakeProblem(op, {DType::kF32, DType::kF32, DType::kF32, DType::kF32}, {rows}, h,
                              std::string("fd_") + op.name);
      p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, limit, 1.702f};
      ASSERT_TRUE(RunImpl(op.name, kReference, Ptrs(p.in), Ptrs(p.out), p.attrs()).ok());
      const Tensor& g = p.In("grad");
      const Tensor& x = p.In("fwd_input");
      const Tensor& dx = p.Out("dinput");
      const int64_t xw = gated ? 2 * h : h;
      int checked = 0;
      for (int half = 0; half < (gated ? 2 : 1); ++half) {
        Tensor xp = x, xm = x;
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < h; ++j) {
            const int64_t i = r * xw + half * h + j;
            xp.set(i, double(float(x.at(i) + step)));
            xm.set(i, double(float(x.at(i) - step)));
          }
        }
        const Tensor fp = Forward(op.fwd, xp, h, p.attrs()), fm = Forward(op.fwd, xm, h, p.attrs());
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t j = 0; j < h; ++j) {
            const int64_t i = r * xw + half * h + j;
            const int64_t o = r * h + j;  // output / grad element
            const double v = x.at(i);
            const bool near_kink = (op.kink0 && half == 0 && std::fabs(v) < 2 * step) ||
                                   (op.clamped && half == 0 && std::fabs(v - limit) < 2 * step) ||
                                   (op.clamped && half == 1 && std::fabs(std::fabs(v) - limit) < 2 * step);
            if (near_kink) continue;
            const double dxp = xp.at(i) - xm.at(i);
            const double gv = g.at(gated ? o : i);
            const double fd = gv * (fp.at(gated ? o : i) - fm.at(gated ? o : i)) / dxp;
            const double rounding = std::ldexp(std::fabs(fp.at(gated ? o : i)) + std::fabs(fm.at(gated ? o : i)), -24);
            const double tol = std::fabs(gv) * (rounding / dxp + 1e-5) + std::ldexp(std::fabs(dx.at(i)), -24) + 1e-7;
            EXPECT_NEAR(dx.at(i), fd, tol) << "row " << r << " col " << half * h + j << " x " << v;
            ++checked;
          }
        }
      }
      EXPECT_GT(checked, int(rows * h) * (gated ? 2 : 1) * 9 / 10) << "too many points skipped";

      if (op.kind == Kind::kDbias) {
        // dbias = column sums of dinput (of its unrounded values: within the
        // fp32 rounding of each term), and dinput is exactly what the plain
        // backward op gives.
        const Tensor& db = p.Out("dbias");
        for (int64_t j = 0; j < h; ++j) {
          double sum = 0.0, mag = 0.0;
          for (int64_t r = 0; r < rows; ++r) {
            sum += dx.at(r * h + j);
            mag += std::fabs(dx.at(r * h + j));
          }
          EXPECT_NEAR(db.at(j), sum, std::ldexp(mag, -23)) << "dbias[" << j << "]";
        }
        const std::string plain = std::string(op.name).substr(std::strlen("dbias_"));
        Tensor gi = g, xi = x, plain_dx = Output(DType::kF32, x.shape());
        ASSERT_TRUE(RunImpl(plain, kReference, {&gi, &xi}, {&plain_dx}, nullptr).ok());
        EXPECT_TRUE(plain_dx.SameBytes(dx)) << op.name << "'s dinput differs from " << plain << "'s";
      }
    }
  }
}

// dbias is deterministic: the same call twice gives the same bytes, on every
// implementation (large enough for every thread to take rows).
TEST(ActivationSpecial, DbiasDeterministic) {
  for (const char* name : {"dbias_dgelu", "dbias_drelu"}) {
    for (DType t : {DType::kF32, DType::kBF16}) {
      Problem p = MakeProblem(Info(name), {t, t, t, DType::kF32}, {301}, 77, std::string("det_") + name);
      for (const std::string& impl : CpuImplementations(name)) {
        SCOPED_TRACE(impl);
        Problem a = p, b = p;
        ASSERT_TRUE(RunImpl(name, impl, Ptrs(a.in), Ptrs(a.out), nullptr).ok());
        ASSERT_TRUE(RunImpl(name, impl, Ptrs(b.in), Ptrs(b.out), nullptr).ok());
        EXPECT_TRUE(a.Out("dbias").SameBytes(b.Out("dbias")));
        EXPECT_TRUE(a.Out("dinput").SameBytes(b.Out("dinput")));
      }
    }
  }
}

// ---- Large aligned outputs ----------------------------------------------------------------
// Outputs of >= 32 MiB whose rows start 64-byte aligned: default.portable
// writes them with non-temporal stores, a path the grid's sizes and the test
// allocator's alignment never reach. Gated backward below AVX-512 streams
// only when its halves are not a multiple of 4 KiB apart: dgeglu's 8000-byte
// halves stream, dswiglu's 32 KiB ones take regular stores.
TEST(ActivationSpecial, LargeAlignedOutputs) {
  struct Case {
    const char* op;
    DType t;
    int64_t rows, h;
  };
  for (const Case& c : {Case{"gelu", DType::kF32, 1024, 8192}, Case{"swiglu", DType::kBF16, 2048, 8192},
                        Case{"dswiglu", DType::kF32, 512, 8192}, Case{"dgeglu", DType::kBF16, 2100, 4000},
                        Case{"dbias_dsilu", DType::kBF16, 2048, 8192}}) {
    const std::string seed = fmt::format("{}_{}_large", c.op, Short(c.t));
    SCOPED_TRACE(seed);
    Problem p = MakeProblem(Info(c.op), {c.t, c.t, c.t, DType::kF32}, {c.rows}, c.h, seed);
    Problem ref = p;
    ASSERT_TRUE(RunImpl(c.op, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs()).ok());
    for (const std::string& impl : CpuImplementations(c.op)) {
      if (impl == kReference) continue;
      SCOPED_TRACE("impl " + impl);
      Problem run = p;
      // The first output: a view into a larger buffer, moved to the next
      // 64-byte boundary.
      Tensor& want = ref.out[0].t;
      const int64_t numel = want.numel();
      const size_t elem = c.t == DType::kF32 ? 4 : 2;
      Tensor buf(c.t, {numel + 64});
      buf.Fill(kSentinel);
      const Tensor pristine = buf;
      const uintptr_t addr = reinterpret_cast<uintptr_t>(buf.bytes());
      const uint64_t offset = (64 - addr % 64) % 64;
      ASSERT_EQ(offset % elem, 0u);
      DLTensor yv = buf.dl();
      std::vector<int64_t> yshape = want.shape();
      yv.shape = yshape.data();
      yv.ndim = int(yshape.size());
      yv.byte_offset = offset;
      std::vector<const DLTensor*> in;
      for (NamedTensor& n : run.in) in.push_back(n.t.ptr());
      std::vector<DLTensor*> out = {&yv};
      for (size_t i = 1; i < run.out.size(); ++i) out.push_back(run.out[i].t.ptr());
      const Status s = RunImplDL(c.op, impl, in, out, run.attrs());
      if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) continue;
      ASSERT_TRUE(s.ok()) << s.ToString();
      EXPECT_TRUE(buf.GuardsIntact());
      const auto* b = static_cast<const unsigned char*>(buf.bytes());
      const auto* q = static_cast<const unsigned char*>(pristine.bytes());
      EXPECT_EQ(std::memcmp(b, q, offset), 0) << "wrote before the output";
      const size_t end = offset + size_t(numel) * elem;
      EXPECT_EQ(std::memcmp(b + end, q + end, buf.nbytes() - end), 0) << "wrote after the output";
      Tensor y(c.t, yshape);
      std::memcpy(y.bytes(), b + offset, size_t(numel) * elem);
      const CompareResult r = Compare(y, want, ToleranceFor(c.t));
      EXPECT_EQ(r.mismatches, 0) << "'" << ref.out[0].name << "': " << r.ToString();
      if (run.out.size() > 1) {
        const CompareResult rd = CompareDbias(run.out[1].t, ref.out[1].t, want);
        EXPECT_EQ(rd.mismatches, 0) << "'dbias': " << rd.ToString();
      }
    }
  }
}

// default.portable's bf16 stores round with vcvtne2ps2bf16 where the CPU has
// AVX512-BF16 (TEFL_PORTABLE_BF16_CVT=0 forces Highway's integer rounding):
// both paths give the same bits on every op, for data with specials, huge and
// subnormal values (the instruction reads subnormal fp32 as 0; the kernel
// falls back for those steps), odd widths (full steps and tails) and dbias.
TEST(ActivationSpecial, Bf16NativeStoreMatchesIntegerRounding) {
  const char* impl = "default.portable";
  const std::vector<double> sv = SpecialValues();
  std::printf("[  NOTE    ] AVX512-BF16 on this CPU: %s\n",
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
              __builtin_cpu_supports("avx512bf16") ? "yes (both paths compared)" : "no (one path)"
#else
              "no (one path)"
#endif
  );
  for (const OpInfo& op : kOps) {
    SCOPED_TRACE(op.name);
    const int64_t h = 77;
    Problem p = MakeProblem(op, {DType::kBF16, DType::kBF16, DType::kBF16, DType::kBF16}, {6}, h, "native");
    p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};
    Tensor& x = p.In(op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd ? "input" : "fwd_input");
    const int64_t n = x.numel();
    // Row 0 of x: specials; rows 1-2: scaled down into fp32 subnormal
    // outputs (relu(x), gelu(x) ~ x / 2); rows 3-5: plain data.
    for (int64_t i = 0; i < n / 6; ++i) {
      x.set(i, sv[size_t(i) % sv.size()]);
      x.set(n / 6 + i, x.at(n / 6 + i) * 1e-37);
      x.set(2 * n / 6 + i, x.at(2 * n / 6 + i) * 3e-39);
    }
    if (HasGrad(op.kind)) {
      Tensor& g = p.In("grad");
      for (int64_t i = 0; i < g.numel() / 6; ++i) g.set(3 * g.numel() / 6 + i, g.at(3 * g.numel() / 6 + i) * 1e-38);
    }
    Problem hwy = p, native = p;
    const Status s0 = WithPortableSwitch("TEFL_PORTABLE_BF16_CVT", "0", [&] {
      return RunImpl(op.name, impl, Ptrs(hwy.in), Ptrs(hwy.out), hwy.attrs());
    });
    ASSERT_TRUE(s0.ok()) << s0.ToString();
    const Status s1 = RunImpl(op.name, impl, Ptrs(native.in), Ptrs(native.out), native.attrs());
    ASSERT_TRUE(s1.ok()) << s1.ToString();
    for (size_t o = 0; o < p.out.size(); ++o) {
      const Tensor& a = hwy.out[o].t;
      const Tensor& b = native.out[o].t;
      ASSERT_EQ(a.nbytes(), b.nbytes());
      const auto* pa = static_cast<const uint16_t*>(a.bytes());
      const auto* pb = static_cast<const uint16_t*>(b.bytes());
      int64_t diffs = 0;
      // NaN equals NaN whatever its sign: an operation on two NaNs returns
      // one of them (x86: its first source's), and the two paths' code is
      // scheduled by the compiler independently (IEEE 754 leaves the choice
      // open). Every other value must have the same bits.
      const auto is_nan = [](uint16_t v) { return (v & 0x7F80u) == 0x7F80u && (v & 0x7Fu) != 0; };
      for (size_t i = 0; i < a.nbytes() / 2; ++i) {
        if (pa[i] != pb[i] && !(is_nan(pa[i]) && is_nan(pb[i])) && diffs++ < 5)
          ADD_FAILURE() << "'" << p.out[o].name << "' element " << i << ": integer rounding " << std::hex << pa[i]
                        << ", vcvtne2ps2bf16 " << pb[i];
      }
      EXPECT_EQ(diffs, 0) << "'" << p.out[o].name << "'";
    }
  }
}

// ---- Validation: bad calls fail before anything is written ---------------------------------
// Runs `p` on every implementation; each call must fail with
// TEFL_INVALID_ARGUMENT, a message naming the op and every `needles`, and
// leave every output byte as it was.
void ExpectRejected(Problem& p, const std::vector<std::string>& needles) {
  for (const std::string& impl : CpuImplementations(p.op.name)) {
    SCOPED_TRACE(impl);
    Problem run = p;
    const Status s = RunImpl(p.op.name, impl, Ptrs(run.in), Ptrs(run.out), run.attrs());
    ASSERT_FALSE(s.ok()) << p.op.name << " accepted a bad call";
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    const std::string msg = s.message();
    EXPECT_NE(msg.find(p.op.name), std::string::npos) << msg;
    for (const std::string& n : needles) EXPECT_NE(msg.find(n), std::string::npos) << "'" << n << "' in: " << msg;
    for (size_t i = 0; i < run.out.size(); ++i)
      EXPECT_TRUE(run.out[i].t.SameBytes(p.out[i].t)) << "output '" << run.out[i].name << "' was written";
  }
}

// Replaces tensor `t` by one of dtype `dt` and shape `shape` (sentinel or
// uniform data, as it was an output or an input).
void Reshape(Tensor& t, std::vector<int64_t> shape, bool output, DType dt) {
  t = Tensor(dt, std::move(shape));
  if (output) {
    t.Fill(kSentinel);
  } else {
    t.Uniform("reshaped");
  }
}

TEST(ActivationValidation, BadShapesDtypesAndAttrs) {
  const Combo f32 = {DType::kF32, DType::kF32, DType::kF32, DType::kF32};
  for (const OpInfo& op : kOps) {
    SCOPED_TRACE(op.name);
    const int64_t h = 6;
    const bool gated = Gated(op.kind);
    const Problem base = MakeProblem(op, f32, {3}, h, std::string("bad_") + op.name);
    const char* xname = HasGrad(op.kind) ? "fwd_input" : "input";
    {  // the valid call passes (the mutations below are what fails)
      Problem ok = base;
      EXPECT_TRUE(RunImpl(op.name, kReference, Ptrs(ok.in), Ptrs(ok.out), ok.attrs()).ok());
    }
    if (gated) {  // odd last dim of the input
      Problem p = base;
      Reshape(p.In(xname), {3, 2 * h + 1}, false, DType::kF32);
      ExpectRejected(p, {"'" + std::string(xname) + "'", "even"});
    }
    {  // rank 0 input
      Problem p = base;
      Reshape(p.In(xname), {}, false, DType::kF32);
      ExpectRejected(p, {"'" + std::string(xname) + "'", "rank"});
    }
    {  // an integer input
      Problem p = base;
      Reshape(p.In(xname), base.in.back().t.shape(), false, DType::kI32);
      ExpectRejected(p, {"'" + std::string(xname) + "'", "dtype"});
    }
    if (HasGrad(op.kind)) {  // grad of the wrong shape: one column more; gated: [N, 2H] instead of [N, H]
      Problem p = base;
      Reshape(p.In("grad"), {3, op.kind == Kind::kGatedBwd ? 2 * h : h + 1}, false, DType::kF32);
      ExpectRejected(p, {"'grad'", "expected shape"});
      Problem q = base;  // and of the wrong rank
      Reshape(q.In("grad"), {3 * (op.kind == Kind::kGatedBwd ? h : h)}, false, DType::kF32);
      ExpectRejected(q, {"'grad'", "expected shape"});
    }
    {  // output / dinput of the wrong shape (gated forward: [N, 2H] instead of [N, H])
      Problem p = base;
      const char* oname = op.kind == Kind::kFwd || op.kind == Kind::kGatedFwd ? "output" : "dinput";
      const int64_t right = p.out[0].t.shape().back();
      Reshape(p.Out(oname), {3, op.kind == Kind::kGatedFwd ? 2 * h : right + 2}, true, DType::kF32);
      ExpectRejected(p, {"'" + std::string(oname) + "'", "expected shape"});
      Problem q = base;  // more rows
      Reshape(q.Out(oname), {4, right}, true, DType::kF32);
      ExpectRejected(q, {"'" + std::string(oname) + "'", "expected shape"});
    }
    if (op.kind == Kind::kDbias) {  // dbias of the wrong length, and 2-D
      Problem p = base;
      Reshape(p.Out("dbias"), {h + 1}, true, DType::kF32);
      ExpectRejected(p, {"'dbias'", fmt::format("[{}]", h)});
      Problem q = base;
      Reshape(q.Out("dbias"), {1, h}, true, DType::kF32);
      ExpectRejected(q, {"'dbias'", fmt::format("[{}]", h)});
    }
    {  // output over an input (no in-place)
      Problem p = base;
      if (op.kind == Kind::kFwd || op.kind == Kind::kBwd || op.kind == Kind::kDbias) {
        Tensor& x = p.In(xname);
        for (const std::string& impl : CpuImplementations(op.name)) {
          std::vector<Tensor*> in = Ptrs(p.in);
          std::vector<Tensor*> out = Ptrs(p.out);
          out[0] = &x;
          const Tensor before = x;
          const Status s = RunImpl(op.name, impl, in, out, p.attrs());
          EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << impl << ": " << s.ToString();
          EXPECT_NE(s.message().find("overlaps"), std::string::npos) << s.message();
          EXPECT_TRUE(x.SameBytes(before)) << impl << " wrote into its input";
        }
      }
    }
    if (op.clamped) {  // limit > 0 and alpha finite
      const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
      for (float limit : {0.0f, -1.0f, nan, -inf}) {
        Problem p = base;
        p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, limit, 1.702f};
        ExpectRejected(p, {"'limit' must be in (0, inf], got"});
      }
      for (float alpha : {inf, -inf, nan}) {
        Problem p = base;
        p.clamp = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, alpha};
        ExpectRejected(p, {"'alpha' must be in [-3.4028235e+38, 3.4028235e+38], got"});
      }
    }
  }
}

// The implementations this file covers (printed for the log; at least the
// two built-ins for every op).
TEST(ActivationSpecial, ImplementationsCovered) {
  for (const OpInfo& op : kOps) {
    const std::vector<std::string> ids = CpuImplementations(op.name);
    std::string list;
    for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
    std::printf("[  NOTE    ] %s: %s\n", op.name, list.c_str());
    for (const char* must : tefl::testing::kMustServeImpls)
      EXPECT_NE(std::find(ids.begin(), ids.end(), must), ids.end()) << op.name << " lacks " << must;
  }
}

}  // namespace
