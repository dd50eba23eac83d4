// Exact scalar FP8 conversions (OCP 8-bit floats, as TransformerEngine uses them):
//   E4M3 "fn": 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity; NaN = S.1111.111; max 448.
//   E5M2:      1 sign, 5 exponent (bias 15), 2 mantissa bits; IEEE-like; max finite 57344.
// Encoding rounds to nearest, ties to even, saturates finite and infinite values beyond the largest
// finite value to +-max (TransformerEngine's "satfinite" casts) and keeps NaN a NaN (0x7F | sign).
// Decoding is exact (every FP8 value is a float). The scalar reference for vector kernels, the
// reference backend and the conformance tests.
#ifndef TEFL_SRC_CORE_FP8_H_
#define TEFL_SRC_CORE_FP8_H_

#include <array>
#include <bit>
#include <cmath>
#include <cstdint>

namespace tefl {

enum class Fp8Format : uint8_t { kE4M3, kE5M2 };

// The format's constants. `max_code` is the largest finite magnitude's bit pattern.
struct Fp8Traits {
  int mantissa_bits;
  int bias;
  uint8_t max_code;
  float max_value;
};
constexpr Fp8Traits kE4M3Traits{3, 7, 0x7E, 448.0f};
constexpr Fp8Traits kE5M2Traits{2, 15, 0x7B, 57344.0f};
constexpr const Fp8Traits& TraitsOf(Fp8Format f) { return f == Fp8Format::kE4M3 ? kE4M3Traits : kE5M2Traits; }
constexpr uint8_t kFp8NaN = 0x7F;  // with the sign bit of the input

namespace fp8_internal {
// Decodes by bit manipulation; used once to build the tables.
constexpr float Decode(uint8_t code, Fp8Format format) {
  const Fp8Traits& t = TraitsOf(format);
  const int mbits = t.mantissa_bits;
  const uint32_t sign = uint32_t(code >> 7) << 31;
  const uint32_t exp = (code & 0x7F) >> mbits;
  const uint32_t man = code & ((1u << mbits) - 1);
  const uint32_t exp_all_ones = (1u << (7 - mbits)) - 1;
  if (format == Fp8Format::kE4M3 && exp == exp_all_ones && man == (1u << mbits) - 1)
    return std::bit_cast<float>(sign | 0x7FC00000u);  // NaN
  if (format == Fp8Format::kE5M2 && exp == exp_all_ones)
    return std::bit_cast<float>(sign | (man == 0 ? 0x7F800000u : 0x7FC00000u));  // inf or NaN
  if (exp == 0) {  // subnormal: man * 2^(1 - bias - mbits), exact in float
    float v = float(man);
    for (int i = 0; i < t.bias - 1 + mbits; ++i) v *= 0.5f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  const uint32_t fexp = exp - uint32_t(t.bias) + 127u;
  return std::bit_cast<float>(sign | (fexp << 23) | (man << (23 - mbits)));
}
constexpr std::array<float, 256> BuildTable(Fp8Format format) {
  std::array<float, 256> table{};
  for (int c = 0; c < 256; ++c) table[size_t(c)] = Decode(uint8_t(c), format);
  return table;
}
inline constexpr std::array<float, 256> kE4M3ToFloat = BuildTable(Fp8Format::kE4M3);
inline constexpr std::array<float, 256> kE5M2ToFloat = BuildTable(Fp8Format::kE5M2);
}  // namespace fp8_internal

// The 256 values of a format, indexed by code (lookup tables for vector gathers).
inline const float* Fp8DecodeTable(Fp8Format format) {
  return format == Fp8Format::kE4M3 ? fp8_internal::kE4M3ToFloat.data() : fp8_internal::kE5M2ToFloat.data();
}

inline float Fp8ToFloat(uint8_t code, Fp8Format format) {
  return format == Fp8Format::kE4M3 ? fp8_internal::kE4M3ToFloat[code] : fp8_internal::kE5M2ToFloat[code];
}

// Round to nearest even, saturating; NaN -> 0x7F with the input's sign.
inline uint8_t FloatToFp8(float value, Fp8Format format) {
  const Fp8Traits& t = TraitsOf(format);
  const uint32_t bits = std::bit_cast<uint32_t>(value);
  const uint8_t sign = uint8_t((bits >> 31) << 7);
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;
  if (abs_bits > 0x7F800000u) return sign | kFp8NaN;
  const float x = std::bit_cast<float>(abs_bits);
  if (!(x < t.max_value)) return sign | t.max_code;  // >= max, inf: saturate
  const int mbits = t.mantissa_bits;
  const int min_normal_exp = 1 - t.bias;
  // Below the smallest normal: a multiple of the smallest subnormal 2^(min_normal_exp - mbits).
  // x * 2^(mbits - min_normal_exp) is exact (a power-of-two scale of a small value) and rint
  // rounds it to even in the default rounding mode; q == 2^mbits is the smallest normal's code.
  if (x < std::ldexp(1.0f, min_normal_exp)) {
    const float q = std::rint(std::ldexp(x, mbits - min_normal_exp));
    return sign | uint8_t(q);
  }
  // Normal: round the float's mantissa to mbits (ties to even; a carry bumps the exponent), rebias.
  const int shift = 23 - mbits;
  const uint32_t rounded = (abs_bits + ((1u << (shift - 1)) - 1) + ((abs_bits >> shift) & 1)) >> shift;
  const uint32_t code = rounded - (uint32_t(127 - t.bias) << mbits);
  return sign | uint8_t(code > t.max_code ? t.max_code : code);
}

}  // namespace tefl

#endif  // TEFL_SRC_CORE_FP8_H_
