// Conformance of the FP8 quantization family: the vector FP8 conversions of
// every CPU implementation against core/fp8.h's scalar ones (exhaustive over
// bf16 and fp16 bit patterns, all 256 codes, ties, saturation, subnormals,
// inf/NaN), the scaling recipes against hand-computed tables, every
// implementation against reference.cpp over dtypes x formats x shapes, and
// bad input (clear error, outputs untouched).
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "core/fp8.h"
#include "test_support.h"

namespace {

using tefl::DType;
using tefl::FloatToFp8;
using tefl::Fp8Format;
using tefl::Fp8ToFloat;
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
using tefl::testing::ToleranceFor;

constexpr const char* kReference = tefl::testing::kReferenceImpl;
constexpr double kSentinel = -31337.0;

const DType kFormats[] = {DType::kE4M3, DType::kE5M2};
const DType kFloats[] = {DType::kF32, DType::kBF16, DType::kF16};

Fp8Format FormatOf(DType t) { return t == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2; }
const char* Name(DType t) { return tefl::DTypeName(t); }

Tensor Scalar(float v) {
  Tensor t(DType::kF32, {1});
  t.set(0, v);
  return t;
}
Tensor Output(DType t, std::vector<int64_t> shape) {
  Tensor o(t, std::move(shape));
  o.Fill(kSentinel);
  return o;
}
uint8_t Code(const Tensor& t, int64_t i) { return static_cast<const uint8_t*>(t.bytes())[i]; }
float F(const Tensor& t, int64_t i) { return static_cast<const float*>(t.bytes())[i]; }
std::vector<std::string> Impls(const std::string& op) {
  std::vector<std::string> impls = CpuImplementations(op);
  for (const char* must : tefl::testing::kMustServeImpls)
    EXPECT_NE(std::find(impls.begin(), impls.end(), must), impls.end()) << must << " is not registered for " << op;
  return impls;
}

// ---- Vector conversions vs the scalar ones ------------------------------------------
// Quantizes `x` (any float dtype) with `scale` on every implementation and
// checks each code against FloatToFp8(float(x) * scale), and amax.
void CheckQuantizeExact(const Tensor& x, float scale, const std::string& what) {
  for (DType fmt : kFormats) {
    for (const std::string& impl : Impls("quantize")) {
      SCOPED_TRACE(fmt::format("{} {} {} scale {}", impl, what, Name(fmt), scale));
      Tensor xin = x, sc = Scalar(scale);
      Tensor q = Output(fmt, x.shape()), amax = Output(DType::kF32, {1}), sinv = Output(DType::kF32, {1});
      const Status s = RunImpl("quantize", impl, {&xin, &sc}, {&q, &amax, &sinv}, nullptr);
      ASSERT_TRUE(s.ok()) << s.ToString();
      int64_t bad = 0;
      float want_amax = 0.0f;
      bool nan = false;
      for (int64_t i = 0; i < x.numel(); ++i) {
        const float v = float(x.at(i));
        nan = nan || std::isnan(v);
        want_amax = std::max(want_amax, std::fabs(v));
        const uint8_t want = FloatToFp8(v * scale, FormatOf(fmt));
        if (Code(q, i) != want && bad++ < 5)
          ADD_FAILURE() << "x[" << i << "] = " << v << " (bits 0x" << std::hex << std::bit_cast<uint32_t>(v)
                        << "): code 0x" << int(Code(q, i)) << ", want 0x" << int(want) << std::dec;
      }
      EXPECT_EQ(bad, 0);
      if (nan) {
        EXPECT_TRUE(std::isnan(F(amax, 0)));
      } else {
        EXPECT_EQ(F(amax, 0), want_amax);
      }
      EXPECT_EQ(F(sinv, 0), 1.0f / scale);
      EXPECT_TRUE(q.GuardsIntact());
    }
  }
}

// Every 16-bit pattern of bf16 / fp16 (incl. subnormals, inf, NaN).
Tensor AllPatterns(DType t) {
  Tensor x(t, {65536});
  auto* p = static_cast<uint16_t*>(x.bytes());
  for (uint32_t i = 0; i < 65536; ++i) p[i] = uint16_t(i);
  return x;
}

TEST(Fp8Vector, EveryBf16PatternQuantizesLikeTheScalarCode) {
  const Tensor x = AllPatterns(DType::kBF16);
  // Positive finite scales take the fast path (NaN spans re-run by the general
  // one); negative, zero and infinite scales the general path.
  for (float scale : {1.0f, 0.0625f, 3.7f, -3.7f, 0.0f, INFINITY}) CheckQuantizeExact(x, scale, "all bf16");
}

// Every 16-bit pattern but the NaNs (a span with a NaN re-runs on the general
// path, and every span of the calls above and below has one), so every
// pattern goes through the fast path's vector body (16-bit input on AVX2:
// Quantize16Avx2) and its tails.
Tensor NonNanPatterns(DType t, uint32_t inf_bits) {
  std::vector<uint16_t> v;
  for (uint32_t i = 0; i < 65536; ++i)
    if ((i & 0x7FFFu) <= inf_bits) v.push_back(uint16_t(i));
  Tensor x(t, {int64_t(v.size())});
  std::memcpy(x.bytes(), v.data(), v.size() * 2);
  return x;
}

TEST(Fp8Vector, EveryNonNanBf16PatternQuantizesLikeTheScalarCodeOnTheFastPath) {
  const Tensor x = NonNanPatterns(DType::kBF16, 0x7F80u);
  ASSERT_EQ(x.numel(), 65536 - 2 * 127);
  for (float scale : {1.0f, 0.0625f, 3.7f, 0x1p-100f, 0x1p100f}) CheckQuantizeExact(x, scale, "non-NaN bf16");
}

TEST(Fp8Vector, EveryNonNanFp16PatternQuantizesLikeTheScalarCodeOnTheFastPath) {
  const Tensor x = NonNanPatterns(DType::kF16, 0x7C00u);
  ASSERT_EQ(x.numel(), 65536 - 2 * 1023);
  // Up to 2^15 the AVX2 body widens by integers (inf fixed after encoding),
  // above it through vcvtph2ps.
  for (float scale : {1.0f, 300.0f, 0.0625f, 3.7f, 1e-6f, 0x1p15f, 0x1.000002p15f, 1e5f})
    CheckQuantizeExact(x, scale, "non-NaN fp16");
}

TEST(Fp8Vector, EveryFp16PatternQuantizesLikeTheScalarCode) {
  const Tensor x = AllPatterns(DType::kF16);
  for (float scale : {1.0f, 300.0f}) CheckQuantizeExact(x, scale, "all fp16");
}

// fp32: every FP8 value, the midpoints between neighbours (ties), one float
// either side of each, +-max and beyond, values below the smallest
// subnormal, inf, NaN, and random bit patterns.
TEST(Fp8Vector, Fp32TiesBoundariesAndRandomBitsQuantizeLikeTheScalarCode) {
  std::vector<float> v;
  for (Fp8Format f : {Fp8Format::kE4M3, Fp8Format::kE5M2}) {
    for (int c = 0; c < 0x7F; ++c) {
      const float a = Fp8ToFloat(uint8_t(c), f), b = Fp8ToFloat(uint8_t(c + 1), f);
      if (!std::isfinite(a) || !std::isfinite(b)) continue;
      const float mid = a + (b - a) / 2;  // exact: one more mantissa bit
      for (float w : {a, mid, std::nextafter(mid, 0.0f), std::nextafter(mid, INFINITY), b})
        for (float s : {1.0f, -1.0f}) v.push_back(s * w);
    }
    const float mx = tefl::TraitsOf(f).max_value;
    for (float w : {mx, std::nextafter(mx, INFINITY), mx * 1.0625f, mx * 1.0625f + 1.0f, mx * 2.0f, FLT_MAX})
      for (float s : {1.0f, -1.0f}) v.push_back(s * w);
    const float tiny = Fp8ToFloat(1, f);  // the smallest subnormal
    for (float w : {tiny / 2, std::nextafter(tiny / 2, 0.0f), std::nextafter(tiny / 2, 1.0f), tiny / 4, 1e-30f,
                    std::numeric_limits<float>::denorm_min()})
      for (float s : {1.0f, -1.0f}) v.push_back(s * w);
  }
  for (float w : {0.0f, -0.0f, INFINITY, -INFINITY, std::numeric_limits<float>::quiet_NaN(),
                  -std::numeric_limits<float>::quiet_NaN(), std::bit_cast<float>(0x7F800001u)})
    v.push_back(w);
  std::mt19937 rng(1234);
  for (int i = 0; i < 200000; ++i) v.push_back(std::bit_cast<float>(uint32_t(rng())));
  for (int i = 0; i < 200000; ++i) v.push_back(std::ldexp(float(rng() % 4096) / 64.0f, int(rng() % 40) - 30));
  Tensor x(DType::kF32, {int64_t(v.size())});
  std::memcpy(x.bytes(), v.data(), v.size() * 4);
  CheckQuantizeExact(x, 1.0f, "fp32 ties/boundaries/random");
  // Without NaN the amax check is exact too.
  std::vector<float> finite;
  for (float w : v)
    if (!std::isnan(w)) finite.push_back(w);
  Tensor xf(DType::kF32, {int64_t(finite.size())});
  std::memcpy(xf.bytes(), finite.data(), finite.size() * 4);
  CheckQuantizeExact(xf, 0.5f, "fp32 finite");
}

// Every code decodes to Fp8ToFloat's value (x dtype fp32 exactly; bf16/fp16
// rounded once), and re-encodes to itself (NaN stays NaN; E5M2 inf saturates
// to max: quantize saturates, as TE's satfinite casts).
TEST(Fp8Vector, Every256CodeDequantizesExactlyAndRoundTrips) {
  for (DType fmt : kFormats) {
    Tensor q(fmt, {256 * 3});  // 3 copies: the vector body and tails both see every code
    for (int i = 0; i < 256 * 3; ++i) static_cast<uint8_t*>(q.bytes())[i] = uint8_t(i % 256);
    for (DType xt : kFloats) {
      for (const std::string& impl : Impls("dequantize")) {
        SCOPED_TRACE(fmt::format("{} {} -> {}", impl, Name(fmt), Name(xt)));
        Tensor qin = q, sinv = Scalar(1.0f), x = Output(xt, {256 * 3});
        const Status s = RunImpl("dequantize", impl, {&qin, &sinv}, {&x}, nullptr);
        ASSERT_TRUE(s.ok()) << s.ToString();
        for (int i = 0; i < 256 * 3; ++i) {
          const float want = Fp8ToFloat(uint8_t(i % 256), FormatOf(fmt));
          if (std::isnan(want)) {
            EXPECT_TRUE(std::isnan(x.at(i))) << "code " << i % 256;
          } else {
            EXPECT_EQ(x.at(i), double(want)) << "code " << i % 256;  // every FP8 value fits bf16/fp16
          }
        }
        // Round trip through quantize on the same implementation.
        Tensor sc = Scalar(1.0f), q2 = Output(fmt, {256 * 3}), amax = Output(DType::kF32, {1}),
               s2 = Output(DType::kF32, {1});
        const Status s3 = RunImpl("quantize", impl, {&x, &sc}, {&q2, &amax, &s2}, nullptr);
        ASSERT_TRUE(s3.ok()) << s3.ToString();
        for (int i = 0; i < 256 * 3; ++i) {
          const uint8_t c = uint8_t(i % 256);
          uint8_t want = c;
          if (fmt == DType::kE5M2 && (c & 0x7F) == 0x7C) want = uint8_t((c & 0x80) | 0x7B);  // inf -> max
          if (std::isnan(Fp8ToFloat(c, FormatOf(fmt)))) {
            EXPECT_EQ(Code(q2, i) & 0x7F, 0x7F) << "code " << int(c);  // NaN stays NaN (0x7F | sign)
          } else {
            EXPECT_EQ(Code(q2, i), want) << "code " << int(c);
          }
        }
      }
    }
  }
}

// Every code times scale_inv, bit for bit against Fp8ToFloat(code) *
// scale_inv rounded to the output dtype: scales where the vector code folds
// its decode factor (2^(127 - bias); 2^8 or 1 through F16C) into scale_inv
// (0.37, -3, 2^7, 2^-100; 2^119 with F16C) and where it cannot (2^8 and 2^119
// without F16C, 2^120, 2^-120: fp32 subnormal results, 0, inf, NaN). NaN results: any NaN
// (the payload of NaN * NaN is the hardware's choice), except with
// scale_inv = 1, where it is Fp8DecodeTable's sign | 0x7FC00000.
TEST(Fp8Vector, Every256CodeTimesScaleInvIsBitExact) {
  for (DType fmt : kFormats) {
    Tensor q(fmt, {256 * 3});
    for (int i = 0; i < 256 * 3; ++i) static_cast<uint8_t*>(q.bytes())[i] = uint8_t(i % 256);
    // 3.0e-5, -1000.7, +-2^100, -2^-100: inside the range of the AVX2 bf16
    // table path (|scale_inv| in [2^-100, 2^100]), with roundings that carry.
    for (float sinv : {1.0f, 0.37f, -3.0f, 0x1p7f, 0x1p-100f, 0x1p8f, 0x1p119f, 0x1p120f, 0x1p-120f, 0.0f, INFINITY,
                       std::numeric_limits<float>::quiet_NaN(), 3.0e-5f, -1000.7f, 0x1p100f, -0x1p100f, -0x1p-100f,
                       0x1.fffffep-1f, 0x1.0000fep0f}) {
      for (DType xt : kFloats) {
        for (const std::string& impl : Impls("dequantize")) {
          SCOPED_TRACE(fmt::format("{} {} -> {} scale_inv {}", impl, Name(fmt), Name(xt), sinv));
          Tensor qin = q, si = Scalar(sinv), x = Output(xt, {256 * 3});
          const Status s = RunImpl("dequantize", impl, {&qin, &si}, {&x}, nullptr);
          ASSERT_TRUE(s.ok()) << s.ToString();
          int bad = 0;
          for (int i = 0; i < 256 * 3; ++i) {
            const float w = Fp8ToFloat(uint8_t(i % 256), FormatOf(fmt)) * sinv;
            uint32_t got = 0, want = 0;
            if (xt == DType::kF32) {
              got = std::bit_cast<uint32_t>(F(x, i));
              want = std::bit_cast<uint32_t>(w);
            } else {
              got = static_cast<const uint16_t*>(x.bytes())[i];
              want = xt == DType::kBF16 ? tefl::FloatToBF16(w) : tefl::FloatToF16(w);
            }
            const bool nan_ok = std::isnan(w) && std::isnan(x.at(i)) && sinv != 1.0f;
            if (got != want && !nan_ok && bad++ < 5)
              ADD_FAILURE() << "code 0x" << std::hex << i % 256 << ": bits 0x" << got << ", want 0x" << want;
          }
          EXPECT_EQ(bad, 0);
        }
      }
    }
  }
}

// Calls large enough to stream their outputs (fp32 sides, >= 32 MiB moved), with
// misaligned outputs (the head before the first 64-byte boundary) and a NaN
// in one block (the fast quantize path re-runs it): every element against the
// scalar code.
TEST(Fp8Vector, LargeStreamedCallsMatchTheScalarCode) {
  const int64_t n = 12 << 20;
  std::mt19937 rng(99);
  for (DType xt : {DType::kF32, DType::kBF16}) {
    // Values over the whole FP8 range and beyond, subnormals, signed zeros.
    Tensor xs(xt, {n + 1});
    for (int64_t i = 0; i < n + 1; ++i) {
      const uint32_t r = uint32_t(rng());
      float v = std::ldexp(float(r % 4096) / 2048.0f, int((r >> 12) % 48) - 30);
      if (r >> 31) v = -v;
      if (i == 5000001) v = std::numeric_limits<float>::quiet_NaN();
      if (i == 7) v = INFINITY;
      xs.set(i, v);
    }
    for (DType fmt : kFormats) {
      for (const std::string& impl : Impls("quantize")) {
        if (impl == kReference) continue;  // the vector paths are the subject
        SCOPED_TRACE(fmt::format("{} {} -> {}", impl, Name(xt), Name(fmt)));
        // Views one element in: x from element 1, q from byte 3 of a larger buffer.
        Tensor qbuf = Output(fmt, {n + 8}), sc = Scalar(3.0f), amax = Output(DType::kF32, {1}),
               sinv = Output(DType::kF32, {1});
        int64_t shape[1] = {n};
        DLTensor xv = *xs.ptr(), qv = *qbuf.ptr();
        xv.shape = shape;
        qv.shape = shape;
        xv.byte_offset += xt == DType::kF32 ? 4 : 2;
        qv.byte_offset += 3;
        const Status s = RunImplDL("quantize", impl, {&xv, sc.ptr()}, {&qv, amax.ptr(), sinv.ptr()}, nullptr);
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          const uint8_t want = FloatToFp8(float(xs.at(i + 1)) * 3.0f, FormatOf(fmt));
          if (Code(qbuf, i + 3) != want && bad++ < 5)
            ADD_FAILURE() << "x[" << i << "] = " << xs.at(i + 1) << ": code 0x" << std::hex << int(Code(qbuf, i + 3))
                          << ", want 0x" << int(want);
        }
        EXPECT_EQ(bad, 0);
        EXPECT_TRUE(std::isnan(F(amax, 0)));
      }
    }
  }
  // Dequantize: random codes into fp32 / bf16 outputs one element in.
  std::vector<uint8_t> codes(static_cast<size_t>(n));
  for (uint8_t& c : codes) c = uint8_t(rng());
  for (DType fmt : kFormats) {
    Tensor q(fmt, {n});
    std::memcpy(q.bytes(), codes.data(), codes.size());
    for (DType xt : {DType::kF32, DType::kBF16}) {
      for (const std::string& impl : Impls("dequantize")) {
        if (impl == kReference) continue;
        SCOPED_TRACE(fmt::format("{} {} -> {}", impl, Name(fmt), Name(xt)));
        Tensor xbuf = Output(xt, {n + 1}), si = Scalar(0.37f);
        int64_t shape[1] = {n};
        DLTensor xv = *xbuf.ptr();
        xv.shape = shape;
        xv.byte_offset += xt == DType::kF32 ? 4 : 2;
        const Status s = RunImplDL("dequantize", impl, {q.ptr(), si.ptr()}, {&xv}, nullptr);
        ASSERT_TRUE(s.ok()) << s.ToString();
        int64_t bad = 0;
        for (int64_t i = 0; i < n; ++i) {
          const float w = Fp8ToFloat(codes[size_t(i)], FormatOf(fmt)) * 0.37f;
          const double got = xbuf.at(i + 1);
          const double want = xt == DType::kF32 ? double(w) : double(tefl::BF16ToFloat(tefl::FloatToBF16(w)));
          if (!(got == want || (std::isnan(got) && std::isnan(want))) && bad++ < 5)
            ADD_FAILURE() << "q[" << i << "]: " << got << ", want " << want;
        }
        EXPECT_EQ(bad, 0);
      }
    }
  }
}

// Literal expectations: ties to even, saturation, NaN, below the smallest
// subnormal (hand-computed codes).
TEST(Fp8Vector, HandComputedCodes) {
  struct Row {
    float x;
    uint8_t e4m3, e5m2;
  };
  const Row rows[] = {
      {1.0f, 0x38, 0x3C},       {1.0625f, 0x38, 0x3C},  // tie between 1 and 1.125 (E4M3): even -> 1
      {1.1875f, 0x3A, 0x3D},  // E4M3: tie between 1.125 and 1.25, even -> 1.25 (0x3A); E5M2: nearest 1.25
      {448.0f, 0x7E, 0x5F},     {480.0f, 0x7E, 0x60},    {1e9f, 0x7E, 0x7B},        {-1e9f, 0xFE, 0xFB},
      {INFINITY, 0x7E, 0x7B},   {-INFINITY, 0xFE, 0xFB}, {0x1p-9f, 0x01, 0x18},     {0x1p-10f, 0x00, 0x14},
      {0x1.8p-10f, 0x01, 0x16}, {0x1p-17f, 0x00, 0x00},  {0x1.01p-17f, 0x00, 0x01}, {-0.0f, 0x80, 0x80},
      {57344.0f, 0x7E, 0x7B},   {61440.0f, 0x7E, 0x7B},
  };
  // 480 in E5M2: tie between 448 (0x5F, odd) and 512 (0x60): even.
  // 0x1.8p-10 = 1.5 * 2^-10 = 0.75 * 2^-9: E4M3 nearest subnormal is 1 * 2^-9 (0x01).
  // 0x1p-10 = half the smallest E4M3 subnormal: tie -> even (0x00).
  // 0x1p-17 = half the smallest E5M2 subnormal (2^-16): tie -> 0; just above -> 0x01.
  std::vector<float> v;
  for (const Row& r : rows) v.push_back(r.x);
  v.push_back(std::numeric_limits<float>::quiet_NaN());
  v.push_back(-std::numeric_limits<float>::quiet_NaN());
  for (DType fmt : kFormats) {
    for (const std::string& impl : Impls("quantize")) {
      SCOPED_TRACE(impl + " " + Name(fmt));
      // Padded to 64 elements so the vector body covers the rows too.
      Tensor x(DType::kF32, {64}), sc = Scalar(1.0f), q = Output(fmt, {64}), amax = Output(DType::kF32, {1}),
                                   sinv = Output(DType::kF32, {1});
      x.Fill(0.0);
      for (size_t i = 0; i < v.size(); ++i) static_cast<float*>(x.bytes())[i] = v[i];
      ASSERT_TRUE(RunImpl("quantize", impl, {&x, &sc}, {&q, &amax, &sinv}, nullptr).ok());
      for (size_t i = 0; i < std::size(rows); ++i)
        EXPECT_EQ(int(Code(q, int64_t(i))), int(fmt == DType::kE4M3 ? rows[i].e4m3 : rows[i].e5m2))
            << "x = " << rows[i].x;
      EXPECT_EQ(int(Code(q, int64_t(std::size(rows)))), 0x7F);
      EXPECT_EQ(int(Code(q, int64_t(std::size(rows)) + 1)), 0xFF);
      EXPECT_TRUE(std::isnan(F(amax, 0))) << "amax propagates NaN";
    }
  }
}

// ---- Scaling recipes: hand-computed tables ---------------------------------------------
struct ScaleCase {
  int32_t format;
  float eps;
  int32_t pow2;
  std::vector<float> amax, scale, scale_inv;
};

TEST(QuantizationRecipes, ComputeScaleFromAmaxHandTable) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const ScaleCase cases[] = {
      // E4M3, no epsilon: 448/amax; 0, inf, NaN -> 1; 448/1e-40 overflows -> FLT_MAX.
      {TEFL_FP8_E4M3,
       0.0f,
       0,
       {1.0f, 0.0f, INFINITY, nan, 448.0f, 3.5f, 1e-40f, 0.875f},
       {448.0f, 1.0f, 1.0f, 1.0f, 1.0f, 128.0f, FLT_MAX, 512.0f},
       {0.002232142857f, 1.0f, 1.0f, 1.0f, 1.0f, 0.0078125f, 2.938736e-39f, 0.001953125f}},
      // E5M2: 57344/amax.
      {TEFL_FP8_E5M2, 0.0f, 0, {3.5f, 57344.0f, 0.0f}, {16384.0f, 1.0f, 1.0f}, {6.103515625e-05f, 1.0f, 1.0f}},
      // epsilon 0.5: amax 0.25 and 0 are raised to 0.5 -> 896; 2 stays.
      {TEFL_FP8_E4M3,
       0.5f,
       0,
       {0.25f, 0.0f, 2.0f},
       {896.0f, 896.0f, 224.0f},
       {0.001116071429f, 0.001116071429f, 0.004464285714f}},
      // power-of-two: 448/3.5 = 128; 448/3 = 149.33 -> 128; 448/5 = 89.6 -> 64; 448/0.001 = 448000 -> 2^18;
      // 0 -> 1; overflow -> FLT_MAX -> 2^127.
      {TEFL_FP8_E4M3,
       0.0f,
       1,
       {3.5f, 3.0f, 5.0f, 0.001f, 0.0f, 1e-40f},
       {128.0f, 128.0f, 64.0f, 262144.0f, 1.0f, 0x1p127f},
       {0.0078125f, 0.0078125f, 0.015625f, 3.814697265625e-06f, 1.0f, 0x1p-127f}},
  };
  for (const std::string& impl : Impls("compute_scale_from_amax")) {
    for (const ScaleCase& c : cases) {
      SCOPED_TRACE(fmt::format("{} format {} eps {} pow2 {}", impl, c.format, c.eps, c.pow2));
      const int64_t n = int64_t(c.amax.size());
      Tensor amax(DType::kF32, {n});
      std::memcpy(amax.bytes(), c.amax.data(), size_t(n) * 4);
      Tensor scale = Output(DType::kF32, {n}), sinv = Output(DType::kF32, {n});
      tefl_compute_scale_attrs attrs{TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE, c.format, c.eps, c.pow2};
      const Status s = RunImpl("compute_scale_from_amax", impl, {&amax}, {&scale, &sinv}, &attrs);
      ASSERT_TRUE(s.ok()) << s.ToString();
      for (int64_t i = 0; i < n; ++i) {
        EXPECT_EQ(F(scale, i), c.scale[size_t(i)]) << "amax " << c.amax[size_t(i)];
        EXPECT_FLOAT_EQ(F(sinv, i), c.scale_inv[size_t(i)]) << "amax " << c.amax[size_t(i)];
      }
    }
  }
}

// History [3, 6] (rows: most recent first), previous scales [5, 6, 7, 8, 9, 10].
//   col0 [2, 4, 1]: max 4, most recent 2     col1 [0, 0, 0]: 0 -> keep
//   col2 [1, 8, 0.5]: max 8, recent 1        col3 [inf, 1, 1]: inf -> keep
//   col4 [1e-40, 0, 0]: 448/1e-40 -> FLT_MAX col5 [NaN, 2, 2]: NaN -> keep
// New history: row0 = 0, row1 = old row2, row2 = old row0.
TEST(QuantizationRecipes, DelayedScalingHandTable) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> hist = {2.0f, 0.0f, 1.0f, INFINITY, 1e-40f, nan,   //
                                   4.0f, 0.0f, 8.0f, 1.0f,     0.0f,   2.0f,  //
                                   1.0f, 0.0f, 0.5f, 1.0f,     0.0f,   2.0f};
  const std::vector<float> prev = {5.0f, 6.0f, 7.0f, 8.0f, 9.0f, 10.0f};
  struct Case {
    int32_t algo, format;
    float margin;
    std::vector<float> scale;
  };
  const Case cases[] = {
      {TEFL_AMAX_ALGO_MAX, TEFL_FP8_E4M3, 0.0f, {112.0f, 6.0f, 56.0f, 8.0f, FLT_MAX, 10.0f}},
      {TEFL_AMAX_ALGO_MAX, TEFL_FP8_E4M3, 1.0f, {56.0f, 6.0f, 28.0f, 8.0f, FLT_MAX, 10.0f}},
      {TEFL_AMAX_ALGO_MOST_RECENT, TEFL_FP8_E4M3, 0.0f, {224.0f, 6.0f, 448.0f, 8.0f, FLT_MAX, 10.0f}},
      {TEFL_AMAX_ALGO_MAX, TEFL_FP8_E5M2, 1.0f, {7168.0f, 6.0f, 3584.0f, 8.0f, FLT_MAX, 10.0f}},
      {TEFL_AMAX_ALGO_MOST_RECENT, TEFL_FP8_E5M2, -2.0f, {114688.0f, 6.0f, 229376.0f, 8.0f, FLT_MAX, 10.0f}},
  };
  const std::vector<float> want_hist = {0.0f, 0.0f, 0.0f, 0.0f,     0.0f,   0.0f,  //
                                        1.0f, 0.0f, 0.5f, 1.0f,     0.0f,   2.0f,  //
                                        2.0f, 0.0f, 1.0f, INFINITY, 1e-40f, nan};
  auto check_hist = [&](const Tensor& h) {
    for (size_t i = 0; i < want_hist.size(); ++i) {
      if (std::isnan(want_hist[i])) {
        EXPECT_TRUE(std::isnan(F(h, int64_t(i)))) << i;
      } else {
        EXPECT_EQ(F(h, int64_t(i)), want_hist[i]) << i;
      }
    }
  };
  for (const std::string& impl : Impls("fused_amax_and_scale_update_after_reduction")) {
    for (const Case& c : cases) {
      SCOPED_TRACE(fmt::format("{} algo {} format {} margin {}", impl, c.algo, c.format, c.margin));
      tefl_delayed_scaling_attrs attrs{TEFL_DELAYED_SCALING_ATTRS_STRUCT_SIZE, c.algo, c.format, c.margin};
      Tensor h(DType::kF32, {3, 6}), s(DType::kF32, {6});
      std::memcpy(h.bytes(), hist.data(), hist.size() * 4);
      std::memcpy(s.bytes(), prev.data(), prev.size() * 4);
      Tensor nh = Output(DType::kF32, {3, 6}), ns = Output(DType::kF32, {6});
      const Status st = RunImpl("fused_amax_and_scale_update_after_reduction", impl, {&h, &s}, {&nh, &ns}, &attrs);
      ASSERT_TRUE(st.ok()) << st.ToString();
      for (int j = 0; j < 6; ++j) EXPECT_EQ(F(ns, j), c.scale[size_t(j)]) << "column " << j;
      check_hist(nh);
      // In place: the history output is the history input.
      Tensor ns2 = Output(DType::kF32, {6});
      const Status st2 = RunImplDL("fused_amax_and_scale_update_after_reduction", impl, {h.ptr(), s.ptr()},
                                   {h.ptr(), ns2.ptr()}, &attrs);
      ASSERT_TRUE(st2.ok()) << st2.ToString();
      for (int j = 0; j < 6; ++j) EXPECT_EQ(F(ns2, j), c.scale[size_t(j)]) << "in place, column " << j;
      check_hist(h);
    }
  }
}

// ---- Every implementation vs the reference over a grid ---------------------------
struct Problem {
  std::string op;
  std::vector<NamedTensor> in, out;
  const void* attrs = nullptr;
};

// exact: FP8 outputs must match the reference bit for bit; otherwise a
// neighbouring code is forgiven (the fused ops' fp32 maths vs the double
// reference), amax by fp32 rules.
void CheckAll(Problem& p, bool exact) {
  Problem ref = p;
  {
    const Status s = RunImpl(p.op, kReference, Ptrs(ref.in), Ptrs(ref.out), ref.attrs);
    ASSERT_TRUE(s.ok()) << "reference: " << s.ToString();
  }
  for (const std::string& impl : Impls(p.op)) {
    SCOPED_TRACE("impl " + impl);
    Problem run = p;
    const Status s = RunImpl(p.op, impl, Ptrs(run.in), Ptrs(run.out), run.attrs);
    if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) continue;
    ASSERT_TRUE(s.ok()) << s.ToString();
    for (size_t i = 0; i < run.in.size(); ++i)
      EXPECT_TRUE(run.in[i].t.SameBytes(p.in[i].t)) << "input '" << run.in[i].name << "' was modified";
    for (size_t i = 0; i < run.out.size(); ++i) {
      const Tensor& got = run.out[i].t;
      const Tensor& want = ref.out[i].t;
      EXPECT_TRUE(got.GuardsIntact()) << "wrote outside '" << run.out[i].name << "'";
      const bool fp8 = got.dtype() == DType::kE4M3 || got.dtype() == DType::kE5M2;
      if (fp8 && exact) {
        int64_t bad = 0;
        for (int64_t k = 0; k < got.numel(); ++k)
          if (Code(got, k) != Code(want, k) && bad++ < 3)
            ADD_FAILURE() << "'" << run.out[i].name << "'[" << k << "]: 0x" << std::hex << int(Code(got, k))
                          << " want 0x" << int(Code(want, k)) << std::dec;
        EXPECT_EQ(bad, 0) << "'" << run.out[i].name << "' must match the reference bit for bit";
        continue;
      }
      auto tol = ToleranceFor(got.dtype());
      if (run.out[i].name == "mu" || run.out[i].name == "rsigma") tol = {1e-6, 5e-5};
      const CompareResult r = Compare(got, want, tol);
      EXPECT_EQ(r.mismatches, 0) << "'" << run.out[i].name << "' (" << Name(got.dtype()) << "): " << r.ToString()
                                 << (r.first_bad >= 0
                                         ? fmt::format(" got {} want {}", got.at(r.first_bad), want.at(r.first_bad))
                                         : std::string());
      if (fp8) {  // at most a neighbouring code, and nearly always the same one
        int64_t differ = 0;
        for (int64_t k = 0; k < got.numel(); ++k) differ += Code(got, k) != Code(want, k);
        EXPECT_LE(differ * 100, std::max<int64_t>(got.numel(), 100)) << "codes differing from the reference";
      }
    }
  }
}

const std::vector<std::vector<int64_t>> kShapes = {{0}, {1}, {7}, {3, 5}, {33, 67}, {4, 1000}, {257, 1031}};

TEST(QuantizationConformance, QuantizeDequantizeAmaxTransposeGrid) {
  for (const auto& shape : kShapes) {
    for (DType xt : kFloats) {
      for (DType fmt : kFormats) {
        for (float scale : {1.0f, 3.0f, 300.0f}) {
          SCOPED_TRACE(fmt::format("shape {} x {} q {} scale {}", fmt::join(shape, "x"), Name(xt), Name(fmt), scale));
          Problem q{"quantize", {}, {}};
          Tensor x(xt, shape);
          x.Uniform(fmt::format("x/{}", shape.back()));
          q.in = {{"x", x}, {"scale", Scalar(scale)}};
          q.out = {
              {"q", Output(fmt, shape)}, {"amax", Output(DType::kF32, {1})}, {"scale_inv", Output(DType::kF32, {1})}};
          CheckAll(q, true);
          // amax of an empty tensor is 0.
          if (x.numel() == 0) {
            Problem r = q;
            ASSERT_TRUE(RunImpl("quantize", "default.portable", Ptrs(r.in), Ptrs(r.out), nullptr).ok());
            EXPECT_EQ(F(Named(r.out, "amax", "output"), 0), 0.0f);
          }

          // dequantize of codes from the reference quantize.
          Problem ref = q;
          ASSERT_TRUE(RunImpl("quantize", kReference, Ptrs(ref.in), Ptrs(ref.out), nullptr).ok());
          Problem d{"dequantize", {}, {}};
          d.in = {{"q", Named(ref.out, "q", "output")}, {"scale_inv", Scalar(1.0f / scale)}};
          d.out = {{"x", Output(xt, shape)}};
          CheckAll(d, true);
        }
      }
      Problem a{"compute_amax", {}, {}};
      Tensor x(xt, shape);
      x.Uniform(fmt::format("amax/{}", shape.size()));
      a.in = {{"x", x}};
      a.out = {{"amax", Output(DType::kF32, {1})}};
      CheckAll(a, true);
    }
  }
  for (const auto& mn :
       std::vector<std::vector<int64_t>>{{0, 5}, {5, 0}, {1, 1}, {3, 7}, {64, 64}, {67, 131}, {513, 1030}}) {
    for (DType fmt : kFormats) {
      SCOPED_TRACE(fmt::format("transpose {}x{} {}", mn[0], mn[1], Name(fmt)));
      Problem t{"fp8_transpose", {}, {}};
      Tensor q(fmt, mn);
      auto* p = static_cast<uint8_t*>(q.bytes());
      for (int64_t i = 0; i < q.numel(); ++i) p[i] = uint8_t((i * 131 + 7) % 251);
      t.in = {{"q", q}};
      t.out = {{"qT", Output(fmt, {mn[1], mn[0]})}};
      CheckAll(t, true);
      // And against the definition.
      Problem r = t;
      ASSERT_TRUE(RunImpl("fp8_transpose", "default.portable", Ptrs(r.in), Ptrs(r.out), nullptr).ok());
      const Tensor& qt = r.out[0].t;
      for (int64_t i = 0; i < mn[0]; ++i)
        for (int64_t j = 0; j < mn[1]; ++j) ASSERT_EQ(Code(qt, j * mn[0] + i), p[i * mn[1] + j]);
    }
  }
}

// Inputs with inf/NaN: quantize saturates inf, keeps NaN, amax NaN; amax of
// inf without NaN is inf.
TEST(QuantizationConformance, SpecialValuesPropagate) {
  for (DType xt : kFloats) {
    Tensor x(xt, {100});
    x.Uniform("special");
    x.set(3, INFINITY);
    x.set(50, -INFINITY);
    Problem a{"compute_amax", {{"x", x}}, {{"amax", Output(DType::kF32, {1})}}};
    CheckAll(a, true);
    Problem r = a;
    ASSERT_TRUE(RunImpl("compute_amax", "default.portable", Ptrs(r.in), Ptrs(r.out), nullptr).ok());
    EXPECT_EQ(F(r.out[0].t, 0), INFINITY);
    x.set(77, std::numeric_limits<double>::quiet_NaN());
    for (DType fmt : kFormats) {
      Problem q{
          "quantize",
          {{"x", x}, {"scale", Scalar(2.0f)}},
          {{"q", Output(fmt, {100})}, {"amax", Output(DType::kF32, {1})}, {"scale_inv", Output(DType::kF32, {1})}}};
      CheckAll(q, true);
      Problem rq = q;
      ASSERT_TRUE(RunImpl("quantize", "default.portable", Ptrs(rq.in), Ptrs(rq.out), nullptr).ok());
      EXPECT_EQ(int(Code(rq.out[0].t, 3)), fmt == DType::kE4M3 ? 0x7E : 0x7B);
      EXPECT_EQ(int(Code(rq.out[0].t, 50)), fmt == DType::kE4M3 ? 0xFE : 0xFB);
      EXPECT_EQ(int(Code(rq.out[0].t, 77)) & 0x7F, 0x7F);
      EXPECT_TRUE(std::isnan(F(rq.out[1].t, 0)));
      EXPECT_EQ(F(rq.out[2].t, 0), 0.5f);
    }
  }
}

// ---- Fused FP8 outputs ------------------------------------------------------------------
TEST(QuantizationConformance, FusedNormFp8Grid) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 1}, {3, 17}, {2, 3, 64}, {16, 1000}, {0, 8}, {64, 2048}};
  for (const char* op : {"rmsnorm_fwd_fp8", "layernorm_fwd_fp8"}) {
    const bool ln = std::string(op) == "layernorm_fwd_fp8";
    for (const auto& shape : shapes) {
      for (DType xt : kFloats) {
        for (DType fmt : kFormats) {
          for (int zcg : {0, 1}) {
            SCOPED_TRACE(
                fmt::format("{} shape {} x {} z {} zcg {}", op, fmt::join(shape, "x"), Name(xt), Name(fmt), zcg));
            const int64_t h = shape.back();
            int64_t rows = 1;
            for (size_t d = 0; d + 1 < shape.size(); ++d) rows *= shape[d];
            Tensor x(xt, shape), g(xt, {h}), b(xt, {h});
            x.Uniform(fmt::format("x/{}", h));
            g.Uniform("gamma");
            b.Uniform("beta");
            tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, zcg, 0};
            Problem p{op, {}, {}, &attrs};
            p.in = {{"x", x}, {"gamma", g}};
            if (ln) p.in.push_back({"beta", b});
            p.in.push_back({"scale", Scalar(fmt == DType::kE4M3 ? 40.0f : 2000.0f)});
            p.out = {{"z", Output(fmt, shape)}};
            if (ln) p.out.push_back({"mu", Output(DType::kF32, {rows})});
            p.out.push_back({"rsigma", Output(DType::kF32, {rows})});
            p.out.push_back({"amax", Output(DType::kF32, {1})});
            p.out.push_back({"scale_inv", Output(DType::kF32, {1})});
            CheckAll(p, false);
          }
        }
      }
    }
  }
}

TEST(QuantizationConformance, FusedGatedFp8Grid) {
  const std::vector<std::vector<int64_t>> shapes = {{1, 2}, {3, 34}, {2, 3, 130}, {7, 1030}, {0, 4}, {64, 4096}};
  const char* const ops[] = {"glu_fp8",    "geglu_fp8",  "qgeglu_fp8",        "reglu_fp8",
                             "sreglu_fp8", "swiglu_fp8", "clamped_swiglu_fp8"};
  for (const char* op : ops) {
    for (const auto& shape : shapes) {
      for (DType xt : kFloats) {
        for (DType fmt : kFormats) {
          SCOPED_TRACE(fmt::format("{} shape {} x {} out {}", op, fmt::join(shape, "x"), Name(xt), Name(fmt)));
          std::vector<int64_t> out_shape = shape;
          out_shape.back() /= 2;
          Tensor x(xt, shape);
          x.Uniform(fmt::format("in/{}", shape.back()), -3.0, 3.0);
          tefl_clamped_swiglu_attrs clamped{TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 1.5f, 1.702f};
          Problem p{op, {}, {}, std::string(op) == "clamped_swiglu_fp8" ? &clamped : nullptr};
          p.in = {{"input", x}, {"scale", Scalar(fmt == DType::kE4M3 ? 50.0f : 3000.0f)}};
          p.out = {{"output", Output(fmt, out_shape)},
                   {"amax", Output(DType::kF32, {1})},
                   {"scale_inv", Output(DType::kF32, {1})}};
          CheckAll(p, false);
        }
      }
    }
  }
}

// The fused op equals its base op followed by quantize (same implementation,
// up to a neighbouring code: the base op rounds z to its dtype first).
TEST(QuantizationConformance, FusedEqualsBaseThenQuantize) {
  Tensor x(DType::kF32, {8, 512});
  x.Uniform("fused-vs-base", -3.0, 3.0);
  for (const std::string& impl : {std::string(kReference), std::string("default.portable")}) {
    Tensor y = Output(DType::kF32, {8, 256});
    ASSERT_TRUE(RunImpl("swiglu", impl, {&x}, {&y}, nullptr).ok());
    Tensor sc = Scalar(64.0f), q = Output(DType::kE4M3, {8, 256}), amax = Output(DType::kF32, {1}),
           sinv = Output(DType::kF32, {1});
    ASSERT_TRUE(RunImpl("quantize", impl, {&y, &sc}, {&q, &amax, &sinv}, nullptr).ok());
    Tensor fq = Output(DType::kE4M3, {8, 256}), famax = Output(DType::kF32, {1}), fsinv = Output(DType::kF32, {1});
    ASSERT_TRUE(RunImpl("swiglu_fp8", impl, {&x, &sc}, {&fq, &famax, &fsinv}, nullptr).ok());
    int64_t differ = 0;
    for (int64_t i = 0; i < q.numel(); ++i) differ += Code(q, i) != Code(fq, i);
    EXPECT_LE(differ, q.numel() / 100) << impl;
    EXPECT_EQ(Compare(fq, q, ToleranceFor(DType::kE4M3)).mismatches, 0) << impl;
    EXPECT_NEAR(F(famax, 0), F(amax, 0), 1e-5 * F(amax, 0)) << impl;
    EXPECT_EQ(F(fsinv, 0), 1.0f / 64.0f);
  }
}

// Fused FP8 outputs of at least 32 MiB with 64-byte aligned rows are stored
// with non-temporal stores (AVX-512 and AVX2): every code, amax and
// scale_inv equal those of the same rows in four smaller calls, which store
// normally.
TEST(QuantizationConformance, FusedFp8LargeStreamedCallsMatchSmallerCalls) {
  const int64_t rows = 4096, h = 8192, chunks = 4, chunk_rows = rows / chunks;
  for (const char* op : {"swiglu_fp8", "rmsnorm_fwd_fp8"}) {
    const bool gated = std::string(op) == "swiglu_fp8";
    const int64_t w = gated ? 2 * h : h;
    Tensor x(DType::kBF16, {rows, w}), g(DType::kBF16, {h});
    x.Uniform(std::string(op) + "/large", -3.0, 3.0);
    g.Uniform("gamma/large");
    tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};
    const void* at = gated ? nullptr : &attrs;
    Tensor scale = Scalar(40.0f);
    for (const std::string& impl : Impls(op)) {
      if (impl == kReference) continue;
      SCOPED_TRACE(std::string(op) + " on " + impl);
      // z: a view into a larger buffer, moved to the next 64-byte boundary.
      Tensor buf(DType::kE4M3, {rows * h + 64});
      const uint64_t offset = (64 - reinterpret_cast<uintptr_t>(buf.bytes()) % 64) % 64;
      DLTensor zv = buf.dl();
      std::vector<int64_t> zshape = {rows, h};
      zv.shape = zshape.data();
      zv.ndim = 2;
      zv.byte_offset = offset;
      Tensor rs = Output(DType::kF32, {rows}), amax = Output(DType::kF32, {1}), sinv = Output(DType::kF32, {1});
      std::vector<const DLTensor*> in = {x.ptr()};
      if (!gated) in.push_back(g.ptr());
      in.push_back(scale.ptr());
      std::vector<DLTensor*> out = {&zv};
      if (!gated) out.push_back(rs.ptr());
      out.push_back(amax.ptr());
      out.push_back(sinv.ptr());
      const Status s = RunImplDL(op, impl, in, out, at);
      if (!s.ok() && !MustServe(impl) && s.code() == TEFL_FAILED_PRECONDITION) continue;
      ASSERT_TRUE(s.ok()) << s.ToString();
      const uint8_t* z = static_cast<const uint8_t*>(buf.bytes()) + offset;
      float chunk_amax = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) {
        Tensor xc(DType::kBF16, {chunk_rows, w});
        std::memcpy(xc.bytes(), static_cast<const char*>(x.bytes()) + c * chunk_rows * w * 2,
                    size_t(chunk_rows * w * 2));
        Tensor zc = Output(DType::kE4M3, {chunk_rows, h}), rsc = Output(DType::kF32, {chunk_rows}),
               ac = Output(DType::kF32, {1}), sc = Output(DType::kF32, {1});
        std::vector<Tensor*> cin = {&xc};
        if (!gated) cin.push_back(&g);
        cin.push_back(&scale);
        std::vector<Tensor*> cout = {&zc};
        if (!gated) cout.push_back(&rsc);
        cout.push_back(&ac);
        cout.push_back(&sc);
        ASSERT_TRUE(RunImpl(op, impl, cin, cout, at).ok());
        EXPECT_EQ(std::memcmp(zc.bytes(), z + c * chunk_rows * h, size_t(chunk_rows * h)), 0) << "rows of chunk " << c;
        if (!gated) {
          EXPECT_EQ(
              std::memcmp(rsc.bytes(), static_cast<const float*>(rs.bytes()) + c * chunk_rows, size_t(chunk_rows * 4)),
              0);
        }
        EXPECT_EQ(F(sc, 0), F(sinv, 0));
        chunk_amax = std::max(chunk_amax, F(ac, 0));
      }
      EXPECT_EQ(F(amax, 0), chunk_amax);
      EXPECT_GT(chunk_amax, 0.0f);
    }
  }
}

// ---- Bad input: a clear error, nothing written ------------------------------------
void ExpectRejected(const std::string& op, std::vector<Tensor*> in, std::vector<Tensor*> out,
                    const std::vector<std::string>& needles, const void* attrs = nullptr) {
  std::vector<Tensor> before;
  for (Tensor* t : out) before.push_back(*t);
  for (const std::string& impl : Impls(op)) {
    SCOPED_TRACE(op + " on " + impl);
    const Status s = RunImpl(op, impl, in, out, attrs);
    ASSERT_FALSE(s.ok());
    for (const std::string& n : needles) EXPECT_NE(s.message().find(n), std::string::npos) << s.message();
    for (size_t i = 0; i < out.size(); ++i) EXPECT_TRUE(out[i]->SameBytes(before[i])) << "output " << i << " written";
  }
}

TEST(QuantizationErrors, BadInputIsRejectedBeforeAnyWrite) {
  Tensor x(DType::kF32, {4, 8});
  x.Uniform("bad");
  Tensor s1 = Scalar(1.0f), s2(DType::kF32, {2}), s_bf(DType::kBF16, {1});
  Tensor q = Output(DType::kE4M3, {4, 8}), qf = Output(DType::kF32, {4, 8}), q_wrong = Output(DType::kE4M3, {4, 9});
  Tensor amax = Output(DType::kF32, {1}), sinv = Output(DType::kF32, {1});
  ExpectRejected("quantize", {&x, &s2}, {&q, &amax, &sinv}, {"quantize", "scale", "[1]"});
  ExpectRejected("quantize", {&x, &s_bf}, {&q, &amax, &sinv}, {"quantize", "scale"});
  ExpectRejected("quantize", {&x, &s1}, {&qf, &amax, &sinv}, {"quantize", "q"});
  ExpectRejected("quantize", {&x, &s1}, {&q_wrong, &amax, &sinv}, {"quantize", "q", "[4, 8]"});
  Tensor xo = Output(DType::kF32, {4, 8});
  ExpectRejected("dequantize", {&x, &s1}, {&xo}, {"dequantize", "q"});  // q not FP8
  Tensor qq(DType::kE5M2, {4, 8});
  ExpectRejected("dequantize", {&qq, &s2}, {&xo}, {"dequantize", "scale_inv", "[1]"});

  Tensor hist(DType::kF32, {4, 3}), sc3(DType::kF32, {3}), sc4(DType::kF32, {4});
  hist.Fill(1.0);
  sc3.Fill(1.0);
  sc4.Fill(1.0);
  Tensor nh = Output(DType::kF32, {4, 3}), ns3 = Output(DType::kF32, {3}), ns4 = Output(DType::kF32, {4});
  ExpectRejected("fused_amax_and_scale_update_after_reduction", {&hist, &sc4}, {&nh, &ns4},
                 {"fused_amax_and_scale_update_after_reduction", "scale", "[3]"});
  Tensor hist1(DType::kF32, {12});
  ExpectRejected("fused_amax_and_scale_update_after_reduction", {&hist1, &sc3}, {&nh, &ns3},
                 {"amax_history", "rank 2"});
  Tensor q3(DType::kE4M3, {2, 3, 4}), qt = Output(DType::kE4M3, {4, 6});
  ExpectRejected("fp8_transpose", {&q3, &q3}, {&qt}, {"fp8_transpose"});  // arity
  ExpectRejected("fp8_transpose", {&q3}, {&qt}, {"fp8_transpose", "q", "rank 2"});
  Tensor q2(DType::kE4M3, {2, 3}), qt_bad = Output(DType::kE5M2, {3, 2}), qt_shape = Output(DType::kE4M3, {2, 3});
  ExpectRejected("fp8_transpose", {&q2}, {&qt_bad}, {"fp8_transpose", "qT", "float8_e4m3fn"});
  ExpectRejected("fp8_transpose", {&q2}, {&qt_shape}, {"fp8_transpose", "qT", "[3, 2]"});

  Tensor amax_n(DType::kF32, {2, 2}), scn = Output(DType::kF32, {2, 2}), sin = Output(DType::kF32, {2, 2});
  ExpectRejected("compute_scale_from_amax", {&amax_n}, {&scn, &sin}, {"compute_scale_from_amax", "amax", "rank 1"});
  tefl_compute_scale_attrs bad_attrs{TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE, 7, 0.0f, 0};
  Tensor a1(DType::kF32, {2}), sc_o = Output(DType::kF32, {2}), si_o = Output(DType::kF32, {2});
  a1.Fill(1.0);
  ExpectRejected("compute_scale_from_amax", {&a1}, {&sc_o, &si_o}, {"compute_scale_from_amax", "fp8_format"},
                 &bad_attrs);

  // Fused: scale shape, z not FP8, odd gated width.
  Tensor g(DType::kF32, {8});
  g.Fill(1.0);
  Tensor z = Output(DType::kE4M3, {4, 8}), zf = Output(DType::kF32, {4, 8}), rs = Output(DType::kF32, {4});
  ExpectRejected("rmsnorm_fwd_fp8", {&x, &g, &s2}, {&z, &rs, &amax, &sinv}, {"rmsnorm_fwd_fp8", "scale", "[1]"});
  ExpectRejected("rmsnorm_fwd_fp8", {&x, &g, &s1}, {&zf, &rs, &amax, &sinv}, {"rmsnorm_fwd_fp8", "z"});
  Tensor xo7(DType::kF32, {4, 7}), y = Output(DType::kE4M3, {4, 3});
  xo7.Fill(1.0);
  ExpectRejected("swiglu_fp8", {&xo7, &s1}, {&y, &amax, &sinv}, {"swiglu_fp8", "input", "even"});
}

}  // namespace
