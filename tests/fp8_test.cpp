// The scalar FP8 conversions of core/fp8.h against the formats' definitions:
// every code round-trips, the encoder agrees with a brute-force nearest-value
// search (ties to the even code), saturation, NaN, subnormals.
#include "core/fp8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

namespace {

using tefl::FloatToFp8;
using tefl::Fp8Format;
using tefl::Fp8ToFloat;

constexpr Fp8Format kFormats[] = {Fp8Format::kE4M3, Fp8Format::kE5M2};
const char* Name(Fp8Format f) { return f == Fp8Format::kE4M3 ? "e4m3" : "e5m2"; }

// Brute force: the finite code nearest to x (ties: even code), saturating; x not NaN.
uint8_t NearestCode(float x, Fp8Format f) {
  const float max = tefl::TraitsOf(f).max_value;
  if (x >= max) return tefl::TraitsOf(f).max_code;
  if (x <= -max) return 0x80 | tefl::TraitsOf(f).max_code;
  int best = -1;
  double best_err = 0;
  for (int c = 0; c < 256; ++c) {
    const float v = Fp8ToFloat(uint8_t(c), f);
    if (!std::isfinite(v)) continue;
    if (v == 0 && std::signbit(v) != std::signbit(x)) continue;  // keep the sign of zero
    const double err = std::fabs(double(v) - double(x));
    if (best < 0 || err < best_err || (err == best_err && (c & 1) == 0 && (best & 1) == 1)) {
      best = c;
      best_err = err;
    }
  }
  return uint8_t(best);
}

TEST(Fp8, KnownValues) {
  EXPECT_EQ(Fp8ToFloat(0x7E, Fp8Format::kE4M3), 448.0f);
  EXPECT_EQ(Fp8ToFloat(0x01, Fp8Format::kE4M3), std::ldexp(1.0f, -9));
  EXPECT_EQ(Fp8ToFloat(0x08, Fp8Format::kE4M3), std::ldexp(1.0f, -6));
  EXPECT_EQ(Fp8ToFloat(0x38, Fp8Format::kE4M3), 1.0f);
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0x7F, Fp8Format::kE4M3)));
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0xFF, Fp8Format::kE4M3)));
  EXPECT_EQ(Fp8ToFloat(0x7B, Fp8Format::kE5M2), 57344.0f);
  EXPECT_EQ(Fp8ToFloat(0x01, Fp8Format::kE5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(Fp8ToFloat(0x3C, Fp8Format::kE5M2), 1.0f);
  EXPECT_EQ(Fp8ToFloat(0x7C, Fp8Format::kE5M2), std::numeric_limits<float>::infinity());
  EXPECT_EQ(Fp8ToFloat(0xFC, Fp8Format::kE5M2), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(Fp8ToFloat(0x7D, Fp8Format::kE5M2)));
}

TEST(Fp8, EveryCodeRoundTrips) {
  for (Fp8Format f : kFormats) {
    for (int c = 0; c < 256; ++c) {
      const float v = Fp8ToFloat(uint8_t(c), f);
      const uint8_t back = FloatToFp8(v, f);
      if (std::isnan(v)) {
        EXPECT_EQ(back & 0x7F, 0x7F) << Name(f) << " code " << c;
        EXPECT_EQ(back & 0x80, c & 0x80) << Name(f) << " code " << c;
      } else if (std::isinf(v)) {  // e5m2 infinity saturates to the largest finite value
        EXPECT_EQ(back, (c & 0x80) | tefl::kE5M2Traits.max_code) << Name(f) << " code " << c;
      } else {
        EXPECT_EQ(back, c) << Name(f) << " code " << c << " value " << v;
      }
    }
  }
}

TEST(Fp8, TiesRoundToEvenAndMidpointsAgreeWithBruteForce) {
  for (Fp8Format f : kFormats) {
    // Every midpoint between neighbouring finite positive codes, and just either side of it.
    for (int c = 0; c < 0x7F; ++c) {
      const float a = Fp8ToFloat(uint8_t(c), f), b = Fp8ToFloat(uint8_t(c + 1), f);
      if (!std::isfinite(b)) break;
      const float mid = float((double(a) + double(b)) / 2);  // exact: a, b have few bits
      const uint8_t want_mid = (c & 1) == 0 ? uint8_t(c) : uint8_t(c + 1);
      EXPECT_EQ(FloatToFp8(mid, f), want_mid) << Name(f) << " tie between codes " << c << " and " << c + 1;
      EXPECT_EQ(FloatToFp8(-mid, f), 0x80 | want_mid) << Name(f);
      EXPECT_EQ(FloatToFp8(std::nextafter(mid, 0.0f), f), c) << Name(f);
      EXPECT_EQ(FloatToFp8(std::nextafter(mid, 1e9f), f), c + 1) << Name(f);
    }
    std::mt19937 rng(7);
    std::uniform_real_distribution<float> exponent(-20.0f, 17.0f);
    for (int i = 0; i < 20000; ++i) {
      const float x = (i & 1 ? -1.0f : 1.0f) * std::exp2(exponent(rng));
      ASSERT_EQ(FloatToFp8(x, f), NearestCode(x, f)) << Name(f) << " x " << x;
    }
  }
}

TEST(Fp8, SaturatesNaNStaysNaNTinyGoesToZero) {
  const float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(FloatToFp8(448.0f, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(FloatToFp8(1e6f, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(FloatToFp8(-1e6f, Fp8Format::kE4M3), 0xFE);
  EXPECT_EQ(FloatToFp8(inf, Fp8Format::kE4M3), 0x7E);
  EXPECT_EQ(FloatToFp8(-inf, Fp8Format::kE4M3), 0xFE);
  EXPECT_EQ(FloatToFp8(inf, Fp8Format::kE5M2), 0x7B);
  EXPECT_EQ(FloatToFp8(60000.0f, Fp8Format::kE5M2), 0x7B);
  EXPECT_EQ(FloatToFp8(-1e30f, Fp8Format::kE5M2), 0xFB);
  for (Fp8Format f : kFormats) {
    EXPECT_TRUE(std::isnan(Fp8ToFloat(FloatToFp8(std::nanf(""), f), f))) << Name(f);
    EXPECT_TRUE(std::isnan(Fp8ToFloat(FloatToFp8(-std::nanf(""), f), f))) << Name(f);
    const float min_sub = Fp8ToFloat(1, f);
    EXPECT_EQ(FloatToFp8(min_sub / 2, f), 0) << Name(f);                        // tie -> even (0)
    EXPECT_EQ(FloatToFp8(std::nextafter(min_sub / 2, 1.0f), f), 1) << Name(f);  // just above: rounds up
    EXPECT_EQ(FloatToFp8(min_sub / 4, f), 0) << Name(f);
    EXPECT_EQ(FloatToFp8(-min_sub / 4, f), 0x80) << Name(f);  // -0
    EXPECT_EQ(FloatToFp8(1e-30f, f), 0) << Name(f);
    EXPECT_EQ(FloatToFp8(std::numeric_limits<float>::denorm_min(), f), 0) << Name(f);
  }
}

}  // namespace
