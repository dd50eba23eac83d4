// Internal dtype helpers: a compact dtype index for DLDataType, names, sizes,
// and exact scalar conversions between float and fp16 / bf16 (round to
// nearest even, NaN preserved). Used by validation, the reference backend and
// the scalar tails of vector kernels.
#ifndef TEFL_SRC_CORE_DTYPE_H_
#define TEFL_SRC_CORE_DTYPE_H_

#include <array>
#include <cstdint>
#include <cstring>

#include "core/fp8.h"
#include "tefl/tefl.h"

namespace tefl {

// Compact dtype index used in signatures and dtype sets (bit i = DType i).
enum class DType : uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kF64 = 3,
  kE4M3 = 4,
  kE5M2 = 5,
  kE8M0 = 6,
  kE2M1 = 7,
  kI8 = 8,
  kU8 = 9,
  kI16 = 10,
  kI32 = 11,
  kI64 = 12,
  kBool = 13,
  kUnknown = 15,
};
using DTypeSet = uint16_t;
constexpr DTypeSet Bit(DType t) { return DTypeSet(1u << unsigned(t)); }
constexpr DTypeSet kFloatTypes = Bit(DType::kF32) | Bit(DType::kF16) | Bit(DType::kBF16);

namespace dtype_internal {
constexpr int kMaxCode = 18, kMaxBits = 64;
// (code, bits) -> DType; everything not listed is kUnknown. A table, not a
// switch: this runs for every tensor of every call.
constexpr auto kTable = [] {
  std::array<std::array<DType, kMaxBits + 1>, kMaxCode> t{};
  for (auto& row : t) row.fill(DType::kUnknown);
  t[kDLFloat][32] = DType::kF32;
  t[kDLFloat][16] = DType::kF16;
  t[kDLFloat][64] = DType::kF64;
  t[kDLBfloat][16] = DType::kBF16;
  t[kDLInt][8] = DType::kI8;
  t[kDLInt][16] = DType::kI16;
  t[kDLInt][32] = DType::kI32;
  t[kDLInt][64] = DType::kI64;
  t[kDLUInt][8] = DType::kU8;
  t[TEFL_DL_BOOL][8] = DType::kBool;
  t[TEFL_DL_FLOAT8_E4M3FN][8] = DType::kE4M3;
  t[TEFL_DL_FLOAT8_E5M2][8] = DType::kE5M2;
  t[TEFL_DL_FLOAT8_E8M0FNU][8] = DType::kE8M0;
  t[TEFL_DL_FLOAT4_E2M1FN][4] = DType::kE2M1;
  return t;
}();
}  // namespace dtype_internal

inline DType DTypeOf(DLDataType t) {
  if (t.lanes != 1 || t.code >= dtype_internal::kMaxCode || t.bits > dtype_internal::kMaxBits) return DType::kUnknown;
  return dtype_internal::kTable[t.code][t.bits];
}

inline DLDataType DLTypeOf(DType t) {
  switch (t) {
    case DType::kF32:
      return {kDLFloat, 32, 1};
    case DType::kF16:
      return {kDLFloat, 16, 1};
    case DType::kBF16:
      return {kDLBfloat, 16, 1};
    case DType::kF64:
      return {kDLFloat, 64, 1};
    case DType::kE4M3:
      return {TEFL_DL_FLOAT8_E4M3FN, 8, 1};
    case DType::kE5M2:
      return {TEFL_DL_FLOAT8_E5M2, 8, 1};
    case DType::kE8M0:
      return {TEFL_DL_FLOAT8_E8M0FNU, 8, 1};
    case DType::kE2M1:
      return {TEFL_DL_FLOAT4_E2M1FN, 4, 1};
    case DType::kI8:
      return {kDLInt, 8, 1};
    case DType::kU8:
      return {kDLUInt, 8, 1};
    case DType::kI16:
      return {kDLInt, 16, 1};
    case DType::kI32:
      return {kDLInt, 32, 1};
    case DType::kI64:
      return {kDLInt, 64, 1};
    case DType::kBool:
      return {TEFL_DL_BOOL, 8, 1};
    default:
      return {0, 0, 0};
  }
}

// Short names as TE-FL / torch users know them.
inline const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "float32";
    case DType::kF16:
      return "float16";
    case DType::kBF16:
      return "bfloat16";
    case DType::kF64:
      return "float64";
    case DType::kE4M3:
      return "float8_e4m3fn";
    case DType::kE5M2:
      return "float8_e5m2";
    case DType::kE8M0:
      return "float8_e8m0fnu";
    case DType::kE2M1:
      return "float4_e2m1fn";
    case DType::kI8:
      return "int8";
    case DType::kU8:
      return "uint8";
    case DType::kI16:
      return "int16";
    case DType::kI32:
      return "int32";
    case DType::kI64:
      return "int64";
    case DType::kBool:
      return "bool";
    default:
      return "unknown";
  }
}

// ---- Scalar conversions ---------------------------------------------------
inline uint32_t FloatBits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
inline float BitsFloat(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline float BF16ToFloat(uint16_t h) { return BitsFloat(uint32_t(h) << 16); }

// Round to nearest even; NaN stays a (quiet) NaN.
inline uint16_t FloatToBF16(float f) {
  uint32_t u = FloatBits(f);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return uint16_t((u >> 16) | 0x0040u);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float F16ToFloat(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  const uint32_t man = h & 0x3FFu;
  if (exp == 0) {
    // zero or subnormal: man * 2^-24, exact in float
    float v = float(man) * 5.9604644775390625e-8f;
    return BitsFloat(FloatBits(v) | sign);
  }
  if (exp == 31) return BitsFloat(sign | 0x7F800000u | (man << 13) | (man ? 0x400000u : 0u));
  return BitsFloat(sign | ((exp + 112u) << 23) | (man << 13));
}

// Round to nearest even, overflow to inf, NaN preserved.
inline uint16_t FloatToF16(float f) {
  const uint32_t u = FloatBits(f);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t a = u & 0x7FFFFFFFu;
  if (a > 0x7F800000u) return uint16_t(sign | 0x7E00u | ((a >> 13) & 0x3FFu));
  if (a >= 0x477FF000u) return uint16_t(sign | 0x7C00u);  // rounds to >= 65520 -> inf
  if (a < 0x38800000u) {                                  // below 2^-14: subnormal or zero
    // value * 2^24 rounded to nearest even integer gives the subnormal mantissa.
    const float scaled = BitsFloat(a) * 16777216.0f;  // exact (power of two)
    // nearbyint with default rounding mode (to nearest even)
    const float r = __builtin_nearbyintf(scaled);
    return uint16_t(sign | uint16_t(r));
  }
  uint32_t rounded = a + 0xFFFu + ((a >> 13) & 1u);
  return uint16_t(sign | uint16_t((rounded - 0x38000000u) >> 13));
}

// Element loads/stores for the float dtypes (fp32, fp16, bf16, fp64, FP8
// E4M3/E5M2 (RNE, saturating)) and the small integer types tests use.
inline float LoadAsFloat(const void* base, int64_t i, DType t) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base)[i];
    case DType::kF16:
      return F16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kBF16:
      return BF16ToFloat(static_cast<const uint16_t*>(base)[i]);
    case DType::kF64:
      return float(static_cast<const double*>(base)[i]);
    case DType::kU8:
    case DType::kBool:
      return float(static_cast<const uint8_t*>(base)[i]);
    case DType::kI32:
      return float(static_cast<const int32_t*>(base)[i]);
    case DType::kI64:
      return float(static_cast<const int64_t*>(base)[i]);
    case DType::kE4M3:
      return Fp8ToFloat(static_cast<const uint8_t*>(base)[i], Fp8Format::kE4M3);
    case DType::kE5M2:
      return Fp8ToFloat(static_cast<const uint8_t*>(base)[i], Fp8Format::kE5M2);
    default:
      return __builtin_nanf("");
  }
}
inline void StoreFromFloat(void* base, int64_t i, DType t, float v) {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DType::kF16:
      static_cast<uint16_t*>(base)[i] = FloatToF16(v);
      break;
    case DType::kBF16:
      static_cast<uint16_t*>(base)[i] = FloatToBF16(v);
      break;
    case DType::kF64:
      static_cast<double*>(base)[i] = double(v);
      break;
    case DType::kU8:  // integer types: tests and masks; v must be in range
    case DType::kBool:
      static_cast<uint8_t*>(base)[i] = uint8_t(v);
      break;
    case DType::kI32:
      static_cast<int32_t*>(base)[i] = int32_t(v);
      break;
    case DType::kI64:
      static_cast<int64_t*>(base)[i] = int64_t(v);
      break;
    case DType::kE4M3:
      static_cast<uint8_t*>(base)[i] = FloatToFp8(v, Fp8Format::kE4M3);
      break;
    case DType::kE5M2:
      static_cast<uint8_t*>(base)[i] = FloatToFp8(v, Fp8Format::kE5M2);
      break;
    default:
      break;
  }
}
// Rounds a double once to the dtype (no double rounding through float for
// fp32; for fp16/bf16 the float step is exact enough for TE's tolerances).
inline void StoreFromDouble(void* base, int64_t i, DType t, double v) {
  if (t == DType::kF64) {
    static_cast<double*>(base)[i] = v;
    return;
  }
  if (t == DType::kI32) {
    static_cast<int32_t*>(base)[i] = int32_t(v);
    return;
  }
  StoreFromFloat(base, i, t, float(v));
}

// Pointer to element 0 of a tensor (data + byte_offset).
inline void* DataPtr(const DLTensor* t) { return t ? static_cast<char*>(t->data) + t->byte_offset : nullptr; }

// The product of shape[begin, end); 0 when it overflows int64, which
// validation allows only for an empty tensor (a zero dim outside the range,
// e.g. the leading dims of [2^62, 4, 0]): such a tensor has nothing to visit.
inline int64_t DimProduct(const int64_t* shape, int begin, int end) {
  int64_t n = 1;
  for (int d = begin; d < end; ++d)
    if (__builtin_mul_overflow(n, shape[d], &n)) return 0;
  return n;
}

// The element count; 0 when any dim is 0, even where the other dims'
// product overflows int64 (validation accepts such an empty tensor).
inline int64_t NumElements(const DLTensor* t) {
  for (int i = 0; i < t->ndim; ++i)
    if (t->shape[i] == 0) return 0;
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

}  // namespace tefl

#endif  // TEFL_SRC_CORE_DTYPE_H_
