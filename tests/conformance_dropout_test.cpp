// Conformance of every registered implementation of dropout_fwd / dropout_bwd
// against the oracle, reference.cpp, and of both against an independent
// scalar Philox-4x32-10 written here and checked on Random123's known-answer
// vectors: the mask is a pure function of (seed, offset, element index).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "backends/portable/cpu_paths.h"
#include "backends/portable/dropout_hooks.h"
#include "test_support.h"

namespace {

using tefl::DType;
using tefl::Status;
using tefl::testing::Compare;
using tefl::testing::CompareResult;
using tefl::testing::CpuImplementations;
using tefl::testing::MustServe;
using tefl::testing::RunImpl;
using tefl::testing::Tensor;
using tefl::testing::ToleranceFor;
using tefl::testing::WithPortableSwitch;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;

// ---- An independent Philox-4x32-10 ------------------------------------------------------
struct Words {
  uint32_t w[4];
};
Words Philox(Words ctr, uint32_t k0, uint32_t k1) {
  for (int round = 0; round < 10; ++round) {
    const uint64_t a = uint64_t(0xD2511F53u) * ctr.w[0];
    const uint64_t b = uint64_t(0xCD9E8D57u) * ctr.w[2];
    const Words next = {
        {uint32_t(b >> 32) ^ ctr.w[1] ^ k0, uint32_t(b), uint32_t(a >> 32) ^ ctr.w[3] ^ k1, uint32_t(a)}};
    ctr = next;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return ctr;
}

// The keep rule (include/tefl/ops.h): Philox with key (lo, hi seed) and
// counter (lo, hi g, lo, hi offset) for the group g = i / 8 of element i; its
// four words laid out little-endian as 16 bytes, element i takes the u16 at
// byte 2 * (i % 8) and is kept iff that half >= ceil(p * 2^16).
uint32_t Half(uint64_t seed, uint64_t offset, uint64_t g, int k) {
  const Words w = Philox({{uint32_t(g), uint32_t(g >> 32), uint32_t(offset), uint32_t(offset >> 32)}}, uint32_t(seed),
                         uint32_t(seed >> 32));
  uint8_t bytes[16];
  for (int b = 0; b < 16; ++b) bytes[b] = uint8_t(w.w[b / 4] >> (8 * (b % 4)));
  return uint32_t(bytes[2 * k]) | uint32_t(bytes[2 * k + 1]) << 8;
}
uint8_t KeepInGroup(uint64_t seed, uint64_t offset, float p, uint64_t g, int k) {
  return double(Half(seed, offset, g, k)) >= std::ceil(double(p) * 65536.0) ? 1 : 0;
}
uint8_t Keep(uint64_t seed, uint64_t offset, float p, uint64_t i) {
  return KeepInGroup(seed, offset, p, i / 8, int(i % 8));
}

TEST(DropoutPhilox, KnownAnswers) {
  // Random123 kat_vectors, philox4x32 with 10 rounds.
  Words z = Philox({{0, 0, 0, 0}}, 0, 0);
  EXPECT_EQ(z.w[0], 0x6627e8d5u);
  EXPECT_EQ(z.w[1], 0xe169c58du);
  EXPECT_EQ(z.w[2], 0xbc57ac4cu);
  EXPECT_EQ(z.w[3], 0x9b00dbd8u);
  Words f = Philox({{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu);
  EXPECT_EQ(f.w[0], 0x408f276du);
  EXPECT_EQ(f.w[1], 0x41c83b0eu);
  EXPECT_EQ(f.w[2], 0xa20bc7c6u);
  EXPECT_EQ(f.w[3], 0x6d5451fdu);
}

tefl_dropout_attrs Attrs(uint64_t seed, uint64_t offset, float p) {
  return {TEFL_DROPOUT_ATTRS_STRUCT_SIZE, seed, offset, p};
}

Tensor Sentinel(DType t, const std::vector<int64_t>& shape) {
  Tensor o(t, shape);
  o.Fill(t == DType::kU8 ? 77 : kSentinel);
  return o;
}

// Forward on every implementation: the mask equals the scalar Philox's and the
// reference's byte for byte; the output matches the reference.
void CheckForward(DType tx, DType ty, const std::vector<int64_t>& shape, uint64_t seed, uint64_t offset, float p,
                  const std::string& name) {
  Tensor x(tx, shape);
  x.Uniform("x/" + name);
  const tefl_dropout_attrs attrs = Attrs(seed, offset, p);
  Tensor ry = Sentinel(ty, shape), rm = Sentinel(DType::kU8, shape);
  Tensor xr = x;
  ASSERT_TRUE(RunImpl("dropout_fwd", kReference, {&xr}, {&ry, &rm}, &attrs).ok());
  for (int64_t i = 0; i < rm.numel(); ++i)
    ASSERT_EQ(rm.at(i), Keep(seed, offset, p, uint64_t(i))) << "reference mask at " << i;
  for (const std::string& impl : CpuImplementations("dropout_fwd")) {
    SCOPED_TRACE(impl);
    Tensor xi = x, y = Sentinel(ty, shape), m = Sentinel(DType::kU8, shape);
    const Status s = RunImpl("dropout_fwd", impl, {&xi}, {&y, &m}, &attrs);
    if (!s.ok() && !MustServe(impl) && s.IsUnsupported()) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(xi.SameBytes(x)) << "input modified";
    EXPECT_TRUE(y.GuardsIntact() && m.GuardsIntact() && xi.GuardsIntact());
    EXPECT_TRUE(m.SameBytes(rm)) << "mask differs from the reference";
    const CompareResult r = Compare(y, ry, ToleranceFor(ty));
    EXPECT_EQ(r.mismatches, 0) << r.ToString();
  }
}

// Backward on every implementation against the reference (any nonzero mask
// byte is kept).
void CheckBackward(DType tx, DType ty, const std::vector<int64_t>& shape, float p, const std::string& name) {
  Tensor dy(tx, shape), m(DType::kU8, shape);
  dy.Uniform("dy/" + name);
  for (int64_t i = 0; i < m.numel(); ++i) m.set(i, double((i * 7 + 3) % 5 == 0 ? 0 : (i % 3) + 1));
  const tefl_dropout_attrs attrs = Attrs(1, 2, p);
  Tensor ref = Sentinel(ty, shape);
  Tensor a = dy, b = m;
  ASSERT_TRUE(RunImpl("dropout_bwd", kReference, {&a, &b}, {&ref}, &attrs).ok());
  for (const std::string& impl : CpuImplementations("dropout_bwd")) {
    SCOPED_TRACE(impl);
    Tensor di = dy, mi = m, dx = Sentinel(ty, shape);
    const Status s = RunImpl("dropout_bwd", impl, {&di, &mi}, {&dx}, &attrs);
    if (!s.ok() && !MustServe(impl) && s.IsUnsupported()) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    EXPECT_TRUE(di.SameBytes(dy) && mi.SameBytes(m)) << "input modified";
    EXPECT_TRUE(dx.GuardsIntact());
    const CompareResult r = Compare(dx, ref, ToleranceFor(ty));
    EXPECT_EQ(r.mismatches, 0) << r.ToString();
  }
}

struct Combo {
  DType x, y;
};
const Combo kCombos[] = {{DType::kF32, DType::kF32},
                         {DType::kBF16, DType::kBF16},
                         {DType::kF16, DType::kF16},
                         {DType::kBF16, DType::kF32},
                         {DType::kF32, DType::kF16}};
// Element counts not multiples of 8 or of the vector width, crossing the
// 4096-element blocks and the thread chunks; a scalar; empty.
const std::vector<int64_t> kShapes[] = {{0}, {1}, {3}, {7, 5}, {64}, {3, 1001}, {2, 4096}, {5, 3, 4099}, {}, {4, 0}};
constexpr float kPs[] = {0.0f, 0.1f, 0.5f, 0.9f, 1e-6f};

// One test per (direction, dtypes, shape); the p values run inside it.
using GridParam = std::tuple<bool, int, int>;  // backward, combo, shape
std::string ShapeName(const std::vector<int64_t>& s) {
  std::string n = "s";
  for (size_t i = 0; i < s.size(); ++i) n += (i ? "x" : "") + std::to_string(s[i]);
  return n;
}
const char* Short(DType t) { return t == DType::kF32 ? "f32" : t == DType::kF16 ? "f16" : "bf16"; }
std::string GridName(const GridParam& gp) {
  const auto& [bwd, combo, shape] = gp;
  return fmt::format("{}_{}_{}_{}", bwd ? "dropout_bwd" : "dropout_fwd", Short(kCombos[combo].x),
                     Short(kCombos[combo].y), ShapeName(kShapes[shape]));
}

class DropoutConformance : public ::testing::TestWithParam<GridParam> {};

TEST_P(DropoutConformance, MatchesReference) {
  const auto& [bwd, combo, shape] = GetParam();
  for (size_t pi = 0; pi < std::size(kPs); ++pi) {
    const std::string name = fmt::format("{}_p{}", GridName(GetParam()), kPs[pi]);
    SCOPED_TRACE(name);
    if (bwd) {
      CheckBackward(kCombos[combo].x, kCombos[combo].y, kShapes[shape], kPs[pi], name);
    } else {
      CheckForward(kCombos[combo].x, kCombos[combo].y, kShapes[shape], 0x123456789abcdefull + pi,
                   uint64_t(shape) << 33 | 5, kPs[pi], name);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grid, DropoutConformance,
                         ::testing::Combine(::testing::Bool(), ::testing::Range(0, int(std::size(kCombos))),
                                            ::testing::Range(0, int(std::size(kShapes)))),
                         [](const ::testing::TestParamInfo<GridParam>& gp) { return GridName(gp.param); });

// Seeds and offsets with both 32-bit halves set select different masks; the
// same (seed, offset) gives the same mask on every call.
TEST(DropoutSpecial, SeedAndOffsetSelectTheMask) {
  const std::vector<int64_t> shape = {1000};
  Tensor x(DType::kF32, shape);
  x.Uniform("x");
  auto mask_of = [&](uint64_t seed, uint64_t offset) {
    Tensor y(DType::kF32, shape), m(DType::kU8, shape);
    const tefl_dropout_attrs a = Attrs(seed, offset, 0.5f);
    EXPECT_TRUE(RunImpl("dropout_fwd", "default.portable", {&x}, {&y, &m}, &a).ok());
    return m;
  };
  const Tensor base = mask_of(0xFFFFFFFF00000001ull, 0x100000000ull);
  EXPECT_TRUE(base.SameBytes(mask_of(0xFFFFFFFF00000001ull, 0x100000000ull)));
  for (auto [seed, offset] : {std::pair<uint64_t, uint64_t>{0xFFFFFFFF00000002ull, 0x100000000ull},
                              {0xFFFFFFFE00000001ull, 0x100000000ull},
                              {0xFFFFFFFF00000001ull, 0x100000001ull},
                              {0xFFFFFFFF00000001ull, 0x200000000ull}}) {
    EXPECT_FALSE(base.SameBytes(mask_of(seed, offset))) << std::hex << seed << " " << offset;
  }
  for (int64_t i = 0; i < 1000; ++i) ASSERT_EQ(base.at(i), Keep(0xFFFFFFFF00000001ull, 0x100000000ull, 0.5f, i));
}

// Over 1M elements the kept fraction is within 5 sigma of 1 - p (the rule's
// P(kept) = 1 - ceil(p 2^16) / 2^16 is within 2^-16 of it: KeptFractionIsTheThresholds).
TEST(DropoutSpecial, KeptFractionStatistics) {
  const int64_t n = 1 << 20;
  for (float p : {0.1f, 0.3f, 0.5f, 0.9f}) {
    for (const std::string& impl : CpuImplementations("dropout_fwd")) {
      SCOPED_TRACE(fmt::format("p {} {}", p, impl));
      Tensor x(DType::kBF16, {n}), y(DType::kBF16, {n}), m(DType::kU8, {n});
      x.Fill(1.0);
      const tefl_dropout_attrs a = Attrs(42, 7, p);
      ASSERT_TRUE(RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a).ok());
      int64_t kept = 0;
      const auto* b = static_cast<const uint8_t*>(m.bytes());
      for (int64_t i = 0; i < n; ++i) kept += b[i];
      const double mean = double(n) * (1.0 - p), sigma = std::sqrt(double(n) * p * (1.0 - p));
      EXPECT_LE(std::abs(double(kept) - mean), 5 * sigma) << "kept " << kept << " of " << n;
      // The kept outputs are 1 / (1 - p) (rounded to bf16), the others 0.
      const double scale = double(tefl::BF16ToFloat(tefl::FloatToBF16(float(1.0 / (1.0 - p)))));
      for (int64_t i = 0; i < n; i += 997) ASSERT_EQ(y.at(i), b[i] ? scale : 0.0) << i;
    }
  }
}

// P(kept) = 1 - threshold16 / 2^16 with threshold16 = ceil(p 2^16): for
// p = 0.1 (threshold16 6554) over 2^20 elements the kept count is within 5
// sigma of n (1 - 6554 / 65536), on every implementation.
TEST(DropoutSpecial, KeptFractionIsTheThresholds) {
  const int64_t n = 1 << 20;
  const float p = 0.1f;
  const double threshold16 = std::ceil(double(p) * 65536.0);
  ASSERT_EQ(threshold16, 6554.0);
  const double keep = 1.0 - threshold16 / 65536.0;
  for (const std::string& impl : CpuImplementations("dropout_fwd")) {
    SCOPED_TRACE(impl);
    Tensor x(DType::kF32, {n}), y(DType::kF32, {n}), m(DType::kU8, {n});
    x.Fill(1.0);
    const tefl_dropout_attrs a = Attrs(0x5EED5EED12345678ull, 0xABCDEF0000000011ull, p);
    ASSERT_TRUE(RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a).ok());
    int64_t kept = 0;
    const auto* b = static_cast<const uint8_t*>(m.bytes());
    for (int64_t i = 0; i < n; ++i) kept += b[i];
    const double mean = double(n) * keep, sigma = std::sqrt(double(n) * keep * (1.0 - keep));
    EXPECT_LE(std::abs(double(kept) - mean), 5 * sigma) << "kept " << kept << " of " << n;
  }
}

// The threshold's edges. p = 1 - 2^-17: threshold16 = ceil(65535.5) = 2^16,
// nothing kept (no half reaches it). p = 2^-17: threshold16 = 1, exactly the
// elements whose half is 0 dropped (~16 of 2^20). p = 1 - 2^-16:
// threshold16 = 65535, only halves 0xFFFF kept. Every implementation, the
// mask against the independent rule, the output against x * (kept ? 1 / (1 -
// p) : 0).
TEST(DropoutSpecial, ThresholdEdges) {
  const int64_t n = (1 << 20) + 13;
  struct Edge {
    float p;
    double threshold16;
  };
  const Edge edges[] = {{1.0f - 0x1p-17f, 65536.0}, {0x1p-17f, 1.0}, {1.0f - 0x1p-16f, 65535.0}};
  const uint64_t seed = 0x0123456789ABCDEFull, offset = 0x0000000300000009ull;
  for (const Edge& edge : edges) {
    ASSERT_EQ(std::ceil(double(edge.p) * 65536.0), edge.threshold16);
    // The elements whose half reaches the edge (computed once, independently).
    std::vector<int64_t> special;
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t h = Half(seed, offset, uint64_t(i) / 8, int(i % 8));
      if (edge.threshold16 == 1.0 ? h == 0 : h == 0xFFFFu) special.push_back(i);
    }
    for (const std::string& impl : CpuImplementations("dropout_fwd")) {
      SCOPED_TRACE(fmt::format("p {} {}", edge.p, impl));
      Tensor x(DType::kF32, {n}), y(DType::kF32, {n}), m(DType::kU8, {n});
      x.Fill(2.0);
      const tefl_dropout_attrs a = Attrs(seed, offset, edge.p);
      ASSERT_TRUE(RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a).ok());
      const auto* b = static_cast<const uint8_t*>(m.bytes());
      std::vector<int64_t> flipped;  // dropped for threshold16 1, kept otherwise
      for (int64_t i = 0; i < n; ++i) {
        if ((b[i] != 0) == (edge.threshold16 == 1.0)) continue;
        flipped.push_back(i);
      }
      if (edge.threshold16 == 65536.0) {
        EXPECT_TRUE(flipped.empty()) << flipped.size() << " kept, first " << flipped.front();
      } else {
        EXPECT_FALSE(special.empty()) << "the test's n is too small to reach the edge";
        EXPECT_EQ(flipped, special);
      }
      const double scale = double(float(1.0 / (1.0 - double(edge.p))));
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y.at(i), b[i] ? 2.0 * scale : 0.0) << i;
    }
  }
}

// p = 0 keeps everything: output == input, mask all ones.
TEST(DropoutSpecial, ZeroPKeepsAll) {
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    for (const std::string& impl : CpuImplementations("dropout_fwd")) {
      Tensor x(t, {3, 333}), y(t, {3, 333}), m(DType::kU8, {3, 333});
      x.Uniform("zero_p");
      const tefl_dropout_attrs a = Attrs(9, 9, 0.0f);
      ASSERT_TRUE(RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a).ok());
      EXPECT_TRUE(y.SameBytes(x)) << impl;
      for (int64_t i = 0; i < m.numel(); ++i) ASSERT_EQ(m.at(i), 1.0) << impl << " " << i;
    }
  }
}

// IEEE: a kept NaN / inf stays NaN / inf (times 1/(1-p)); a dropped one is
// x * 0 = NaN.
TEST(DropoutSpecial, NanAndInf) {
  const int64_t n = 203;
  Tensor x(DType::kF32, {n});
  x.Uniform("naninf");
  for (int64_t i = 0; i < n; i += 3) x.set(i, i % 2 ? std::numeric_limits<double>::infinity() : std::nan(""));
  const tefl_dropout_attrs a = Attrs(3, 4, 0.5f);
  for (const std::string& impl : CpuImplementations("dropout_fwd")) {
    SCOPED_TRACE(impl);
    Tensor y(DType::kF32, {n}), m(DType::kU8, {n});
    ASSERT_TRUE(RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a).ok());
    for (int64_t i = 0; i < n; i += 3) {
      if (i % 2 == 1 && m.at(i) != 0) {
        EXPECT_EQ(y.at(i), std::numeric_limits<double>::infinity()) << i;
      } else {
        EXPECT_TRUE(std::isnan(y.at(i))) << i;
      }
    }
    Tensor dx(DType::kF32, {n});
    ASSERT_TRUE(RunImpl("dropout_bwd", impl, {&x, &m}, {&dx}, &a).ok());
    EXPECT_TRUE(dx.SameBytes(y)) << "backward with the forward's mask gives the forward's output";
  }
}

// Bad inputs: an error naming op, argument and expectation; outputs untouched.
TEST(DropoutSpecial, BadInputsRejectedOutputsUntouched) {
  struct Case {
    std::string name;
    bool fwd;
    DType x, y, m;
    std::vector<int64_t> xs, ys, ms;
    float p;
    std::vector<std::string> expect;
  };
  const DType f = DType::kF32, u8 = DType::kU8;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<Case> cases = {
      {"p = 1", true, f, f, u8, {8}, {8}, {8}, 1.0f, {"dropout_fwd", "'p' must be in [0, 1), got 1"}},
      {"p < 0", true, f, f, u8, {8}, {8}, {8}, -0.1f, {"'p' must be in [0, 1), got -0.1"}},
      {"p NaN", false, f, f, u8, {8}, {8}, {8}, nan, {"dropout_bwd", "'p'"}},
      {"p = 1 backward", false, f, f, u8, {8}, {8}, {8}, 1.0f, {"dropout_bwd", "'p'"}},
      {"mask float (fwd)", true, f, f, f, {8}, {8}, {8}, 0.5f, {"'mask'", "uint8"}},
      {"mask bool-like int8 (bwd)", false, f, f, DType::kI8, {8}, {8}, {8}, 0.5f, {"'mask'", "uint8"}},
      {"mask shape (fwd)", true, f, f, u8, {2, 4}, {2, 4}, {8}, 0.5f, {"'mask'", "[2, 4]", "[8]"}},
      {"mask shape (bwd)", false, f, f, u8, {2, 4}, {2, 4}, {4, 2}, 0.5f, {"dropout_bwd", "'mask'", "[2, 4]"}},
      {"output shape", true, f, f, u8, {2, 4}, {2, 5}, {2, 4}, 0.5f, {"'output'", "[2, 5]"}},
      {"grad_input shape", false, f, f, u8, {2, 4}, {8}, {2, 4}, 0.5f, {"'grad_input'"}},
      {"integer input", true, DType::kI32, f, u8, {8}, {8}, {8}, 0.5f, {"'input'"}},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    for (const std::string& impl : {std::string(kReference), std::string("default.portable")}) {
      Tensor x(c.x, c.xs);
      x.Uniform("bad");
      Tensor y = Sentinel(c.y, c.ys), m = Sentinel(c.m, c.ms);
      const Tensor y0 = y, m0 = m;
      const tefl_dropout_attrs a = Attrs(1, 1, c.p);
      const Status s =
          c.fwd ? RunImpl("dropout_fwd", impl, {&x}, {&y, &m}, &a) : RunImpl("dropout_bwd", impl, {&x, &m}, {&y}, &a);
      ASSERT_FALSE(s.ok()) << impl;
      EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
      for (const std::string& e : c.expect)
        EXPECT_NE(s.message().find(e), std::string::npos) << "'" << e << "' not in: " << s.message();
      EXPECT_TRUE(y.SameBytes(y0)) << "output written on error";
      EXPECT_TRUE(m.SameBytes(m0)) << "mask written on error";
    }
  }
}

// default.portable's dropout_fwd has an AVX-512 path (fused Philox, mask and
// output, 128 elements a step, scalar Philox for the tail) and the Highway
// path (TEFL_PORTABLE_DROPOUT_AVX512=0; also the whole suite under ctest's
// DropoutNoAvx512). Both give the same mask and output bytes: every dtype
// pair, sizes around the 128-element step and the 4096-element thread grain,
// p = 0 and tiny p, NaN / inf / subnormal / huge inputs.
TEST(DropoutSpecial, Avx512PathMatchesHighwayPath) {
  const std::vector<int64_t> sizes = {1, 7, 9, 63, 64, 65, 127, 128, 129, 255, 257, 4095, 4097, 3 * 4096 + 61};
  const Combo combos[] = {{DType::kF32, DType::kF32},  {DType::kBF16, DType::kBF16}, {DType::kF16, DType::kF16},
                          {DType::kBF16, DType::kF32}, {DType::kF32, DType::kBF16},  {DType::kF16, DType::kBF16}};
  for (const Combo& c : combos) {
    for (int64_t n : sizes) {
      for (float p : {0.0f, 1e-6f, 0.1f, 0.5f, 0.97f, 1.0f - 0x1p-17f}) {
        SCOPED_TRACE(fmt::format("{} -> {}, n {}, p {}", Short(c.x), Short(c.y), n, p));
        Tensor x(c.x, {n});
        x.Uniform(fmt::format("paths/{}", n));
        const double specials[] = {std::nan(""),
                                   std::numeric_limits<double>::infinity(),
                                   -std::numeric_limits<double>::infinity(),
                                   1e-40,
                                   -3e-39,
                                   3e38,
                                   -65504.0,
                                   0.0};
        // Subnormals only in even 64-element blocks: the odd ones take the
        // bf16 outputs' vcvtne2ps2bf16 step (NaN, Inf), the even ones its
        // by-hand rounding.
        for (int64_t i = 0; i < n; i += 7) {
          const double v = specials[(i / 7) % std::size(specials)];
          if ((i / 64) % 2 == 1 && v != 0.0 && std::fabs(v) < 1e-30) continue;
          x.set(i, v);
        }
        const tefl_dropout_attrs a = Attrs(0xFEDCBA9876543210ull + uint64_t(n), 0x0000000700000003ull, p);
        Tensor y0 = Sentinel(c.y, {n}), m0 = Sentinel(DType::kU8, {n});
        Tensor y1 = Sentinel(c.y, {n}), m1 = Sentinel(DType::kU8, {n});
        const Status s0 = WithPortableSwitch("TEFL_PORTABLE_DROPOUT_AVX512", "0", [&] {
          return RunImpl("dropout_fwd", "default.portable", {&x}, {&y0, &m0}, &a);
        });
        ASSERT_TRUE(s0.ok()) << s0.ToString();
        ASSERT_TRUE(RunImpl("dropout_fwd", "default.portable", {&x}, {&y1, &m1}, &a).ok());
        EXPECT_TRUE(m0.SameBytes(m1)) << "mask";
        EXPECT_TRUE(y0.SameBytes(y1)) << "output";
        EXPECT_TRUE(y1.GuardsIntact() && m1.GuardsIntact());
        for (int64_t i = 0; i < n; ++i) ASSERT_EQ(m1.at(i), Keep(a.seed, a.offset, p, uint64_t(i))) << i;
      }
    }
  }
}

// Philox groups near multiples of 2^32 (the counter's low word wraps inside a
// 16-counter step, the high word changes) through the AVX-512 path's test
// hook: mask against the independent rule, output against x * scale.
TEST(DropoutSpecial, Avx512PathNearGroupWrap) {
  // Off without AVX-512 + BMI2, and under TEFL_PORTABLE_DROPOUT_AVX512=0 (ctest's DropoutNoAvx512).
  if (!tefl::backends::PortablePathOn(tefl::backends::PortablePath::kDropoutAvx512))
    GTEST_SKIP() << "the AVX-512 path is off (no AVX-512 + BMI2, or TEFL_PORTABLE_DROPOUT_AVX512=0)";
  const int64_t n = 128 * 5 + 37;
  const size_t count = size_t(n);
  std::vector<float> x(count), y(count);
  std::vector<uint8_t> m(count);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] = float(i % 13) - 6.5f;
  for (uint64_t first : {(uint64_t(1) << 32) - 72, (uint64_t(1) << 32) - 64, (uint64_t(1) << 32) - 1,
                         (uint64_t(5) << 32) - 40, (uint64_t(5) << 32) + 3, ~uint64_t(0) - 100}) {
    SCOPED_TRACE(first);
    const float p = 0.3f;
    ASSERT_TRUE(tefl::backends::PortableDropoutFwdAtGroup(DType::kF32, DType::kF32, n, first, 77, 0x123456789ull, p,
                                                          x.data(), y.data(), m.data()));
    const float scale = float(1.0 / (1.0 - double(p)));
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(m[size_t(i)], KeepInGroup(77, 0x123456789ull, p, first + uint64_t(i) / 8, int(i % 8))) << i;
      ASSERT_EQ(y[size_t(i)], m[size_t(i)] ? x[size_t(i)] * scale : x[size_t(i)] * 0.0f) << i;
    }
  }
}

// Outputs of >= 32 MiB (y and mask) are stored non-temporally by the AVX-512 path
// from y's first 64-byte boundary (a scalar head before it), the mask too
// where it is then aligned: same bytes as the Highway path (the tensors'
// data are 64-byte aligned: both streamed), and, through the test hook, with
// y 32 and the mask 16 bytes past a 64-byte boundary (y streamed after its
// head of one group, the mask not). bf16 and fp16 alike.
TEST(DropoutSpecial, Avx512StreamingStoresLargeOutputs) {
  const int64_t n = (int64_t(8) << 20) + 37;
  for (DType t : {DType::kF32, DType::kBF16, DType::kF16}) {
    SCOPED_TRACE(Short(t));
    Tensor x(t, {n});
    x.Uniform("stream");
    const tefl_dropout_attrs a = Attrs(5, 6, 0.25f);
    Tensor y0(t, {n}), m0(DType::kU8, {n}), y1(t, {n}), m1(DType::kU8, {n});
    const Status s0 = WithPortableSwitch("TEFL_PORTABLE_DROPOUT_AVX512", "0", [&] {
      return RunImpl("dropout_fwd", "default.portable", {&x}, {&y0, &m0}, &a);
    });
    ASSERT_TRUE(s0.ok()) << s0.ToString();
    ASSERT_TRUE(RunImpl("dropout_fwd", "default.portable", {&x}, {&y1, &m1}, &a).ok());
    EXPECT_TRUE(m0.SameBytes(m1)) << "mask";
    EXPECT_TRUE(y0.SameBytes(y1)) << "output";
    EXPECT_TRUE(y1.GuardsIntact() && m1.GuardsIntact());
    if (!tefl::backends::PortablePathOn(tefl::backends::PortablePath::kDropoutAvx512)) continue;
    // y 32 bytes past a 64-byte boundary (streamed after a scalar head of 8
    // (fp32) or 16 elements), the mask 16 (not streamed).
    const size_t elem = t == DType::kF32 ? 4 : 2, bytes = size_t(n) * elem;
    auto aligned = [](size_t b) { return static_cast<uint8_t*>(std::aligned_alloc(64, (b + 64 + 63) / 64 * 64)); };
    uint8_t *y2 = aligned(bytes), *m2 = aligned(size_t(n));
    ASSERT_TRUE(y2 != nullptr && m2 != nullptr);
    ASSERT_TRUE(tefl::backends::PortableDropoutFwdAtGroup(t, t, n, 0, 5, 6, 0.25f, x.bytes(), y2 + 32, m2 + 16));
    EXPECT_EQ(std::memcmp(m2 + 16, m1.bytes(), size_t(n)), 0) << "mask (unaligned)";
    EXPECT_EQ(std::memcmp(y2 + 32, y1.bytes(), bytes), 0) << "output (unaligned)";
    std::free(y2);
    std::free(m2);
  }
}

TEST(DropoutSpecial, ImplementationsCovered) {
  for (const char* op : {"dropout_fwd", "dropout_bwd"}) {
    const std::vector<std::string> ids = CpuImplementations(op);
    std::string list;
    for (const std::string& id : ids) list += (list.empty() ? "" : ", ") + id;
    std::printf("[  NOTE    ] %s: %s\n", op, list.c_str());
    for (const char* must : tefl::testing::kMustServeImpls)
      EXPECT_NE(std::find(ids.begin(), ids.end(), must), ids.end()) << op << " lacks " << must;
  }
}

}  // namespace
