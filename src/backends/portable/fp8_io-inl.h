// default.portable: vectorised FP8 (E4M3 "fn" / E5M2) conversions, bit-identical
// to core/fp8.h's scalar FloatToFp8 / Fp8ToFloat (Highway's per-target "-inl.h"
// pattern: include it after <hwy/highway.h> in a foreach_target.h translation
// unit; it includes simd_io-inl.h and re-expands once per target).
//
// Encode (fp32 lanes -> codes), per lane, all in 32-bit integer lanes:
//   normal:    (|bits| + (2^(s-1) - 1) + lsb) >> s, rebiased (s = 23 - mbits;
//              ties to even, a carry bumps the exponent), as the scalar code;
//   subnormal: |x| * 2^(mbits + bias - 1) + 2^23 (exact scale, one rounding
//              to an integer, nearest even like the scalar rint), minus 2^23;
//   then min(code, max_code) saturates finite overflow and inf, NaN -> 0x7F,
//   and the sign is ORed back (-0 -> 0x80, like the scalar code).
// Decode (codes -> fp32): normal codes by shifting the exponent/mantissa into
// place and rebiasing, subnormals as float(mantissa) * 2^(1 - bias - mbits),
// NaN (E4M3 0x7F, E5M2 exp 31 with a mantissa) -> 0x7FC00000 | sign, E5M2
// inf -> inf: the exact values (and NaN bits) of Fp8DecodeTable.
// Amax: max over |bits| as unsigned integers: for non-negative floats the
// integer order is the float order and every NaN sorts above inf, so a NaN
// anywhere gives a NaN amax (AmaxBitsToFloat canonicalises it).
#if defined(TEFL_BACKENDS_PORTABLE_FP8_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TEFL_BACKENDS_PORTABLE_FP8_IO_INL_H_
#undef TEFL_BACKENDS_PORTABLE_FP8_IO_INL_H_
#else
#define TEFL_BACKENDS_PORTABLE_FP8_IO_INL_H_
#endif

#include <hwy/highway.h>

#include <bit>
#include <cstdint>
#include <cstring>

#include "backends/portable/simd_io-inl.h"
#include "core/fp8.h"

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Compile-time constants of a format.
template <Fp8Format kF>
struct Fp8C {
  static constexpr int kMbits = kF == Fp8Format::kE4M3 ? 3 : 2;
  static constexpr int kBias = kF == Fp8Format::kE4M3 ? 7 : 15;
  static constexpr uint32_t kMaxCode = kF == Fp8Format::kE4M3 ? 0x7E : 0x7B;
  static constexpr int kShift = 23 - kMbits;
  // 2^(1 - bias): the smallest normal; 2^(mbits + bias - 1): subnormal scale;
  // 2^(1 - bias - mbits): the smallest subnormal.
  static constexpr float kMinNormal = kF == Fp8Format::kE4M3 ? 0x1p-6f : 0x1p-14f;
  static constexpr float kSubScale = kF == Fp8Format::kE4M3 ? 0x1p9f : 0x1p16f;
  static constexpr float kSubUnit = kF == Fp8Format::kE4M3 ? 0x1p-9f : 0x1p-16f;
};

// fp32 lanes -> codes in the low byte of 32-bit lanes.
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> EncodeFp8(DF df, hn::Vec<DF> v) {
  using C = Fp8C<kF>;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto bits = hn::BitCast(du, v);
  const auto sign = hn::And(hn::ShiftRight<24>(bits), hn::Set(du, 0x80u));
  const auto abs = hn::And(bits, hn::Set(du, 0x7FFFFFFFu));
  const auto x = hn::BitCast(df, abs);
  const auto lsb = hn::And(hn::ShiftRight<C::kShift>(abs), hn::Set(du, 1u));
  const auto rounded = hn::ShiftRight<C::kShift>(hn::Add(abs, hn::Add(hn::Set(du, (1u << (C::kShift - 1)) - 1u), lsb)));
  const auto normal = hn::Sub(rounded, hn::Set(du, uint32_t(127 - C::kBias) << C::kMbits));
  // Below the normal range |x| * 2^(mbits + bias - 1) < 2^mbits is exact and adding 2^23 rounds it to an
  // integer (ties to even) in the low mantissa bits: cheaper than NearestInt's overflow fix-up. Lanes of
  // the normal range get garbage here and take `normal`.
  const auto magic = hn::Set(df, 8388608.0f);  // 2^23
  const auto sub = hn::Sub(hn::BitCast(du, hn::MulAdd(x, hn::Set(df, C::kSubScale), magic)), hn::BitCast(du, magic));
  auto code = hn::IfThenElse(hn::RebindMask(du, hn::Lt(x, hn::Set(df, C::kMinNormal))), sub, normal);
  code = hn::Min(code, hn::Set(du, C::kMaxCode));
  // NaN: |bits| > inf's bits (as signed: both are below 2^31).
  const auto is_nan = hn::RebindMask(du, hn::Gt(hn::BitCast(di, abs), hn::Set(di, 0x7F800000)));
  code = hn::IfThenElse(is_nan, hn::Set(du, uint32_t(kFp8NaN)), code);
  return hn::Or(code, sign);
}

// Codes (0..255 in 32-bit lanes) -> fp32 lanes.
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<DF> DecodeFp8(DF df, hn::Vec<hn::RebindToUnsigned<DF>> code) {
  using C = Fp8C<kF>;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const auto abs = hn::And(code, hn::Set(du, 0x7Fu));
  const auto sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80u)));
  const auto exp = hn::ShiftRight<C::kMbits>(abs);
  const auto man = hn::And(abs, hn::Set(du, (1u << C::kMbits) - 1u));
  const auto normal = hn::Add(hn::ShiftLeft<C::kShift>(abs), hn::Set(du, uint32_t(127 - C::kBias) << 23));
  const auto sub = hn::BitCast(du, hn::Mul(hn::ConvertTo(df, hn::BitCast(di, man)), hn::Set(df, C::kSubUnit)));
  auto r = hn::IfThenElse(hn::Eq(exp, hn::Zero(du)), sub, normal);
  if constexpr (kF == Fp8Format::kE4M3) {
    r = hn::IfThenElse(hn::Eq(abs, hn::Set(du, 0x7Fu)), hn::Set(du, 0x7FC00000u), r);
  } else {
    const auto special = hn::IfThenElse(hn::Eq(man, hn::Zero(du)), hn::Set(du, 0x7F800000u), hn::Set(du, 0x7FC00000u));
    r = hn::IfThenElse(hn::Eq(exp, hn::Set(du, 31u)), special, r);
  }
  return hn::BitCast(df, hn::Or(r, sign));
}

// Lanes(df) codes from p as fp32.
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<DF> LoadFp8(DF df, const uint8_t* HWY_RESTRICT p) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Rebind<uint8_t, DF> d8;
  return DecodeFp8<kF>(df, hn::PromoteTo(du, hn::LoadU(d8, p)));
}

// Lanes(df) fp32 values encoded to p.
template <Fp8Format kF, class DF>
HWY_INLINE void StoreFp8(DF df, hn::Vec<DF> v, uint8_t* HWY_RESTRICT p) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> d8;
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, EncodeFp8<kF>(df, v))), d8, p);
}

// ---- amax as the maximum of |bits| ------------------------------------------
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> AbsBits(DF df, hn::Vec<DF> v) {
  const hn::RebindToUnsigned<DF> du;
  return hn::And(hn::BitCast(du, v), hn::Set(du, 0x7FFFFFFFu));
}
inline uint32_t ScalarAbsBits(float v) { return std::bit_cast<uint32_t>(v) & 0x7FFFFFFFu; }
template <class DU>
HWY_INLINE uint32_t ReduceAmaxBits(DU du, hn::Vec<DU> acc) {
  return hn::GetLane(hn::MaxOfLanes(du, acc));
}
inline float AmaxBitsToFloat(uint32_t bits) {
  return bits > 0x7F800000u ? std::bit_cast<float>(0x7FC00000u) : std::bit_cast<float>(bits);
}

// ---- spans ------------------------------------------------------------------------
// q[i] = fp8(x[i] * scale) for i < n; returns max(amax_bits, max |bits(x)|).
template <Fp8Format kF, class T>
HWY_INLINE uint32_t QuantizeSpan(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                 uint32_t amax_bits) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nl = hn::Lanes(df);
  const auto vs = hn::Set(df, scale);
  auto m0 = hn::Set(du, amax_bits), m1 = hn::Zero(du);
  size_t i = 0;
  for (; i + 2 * nl <= n; i += 2 * nl) {
    const auto v0 = LoadF(df, x + i);
    const auto v1 = LoadF(df, x + i + nl);
    m0 = hn::Max(m0, AbsBits(df, v0));
    m1 = hn::Max(m1, AbsBits(df, v1));
    StoreFp8<kF>(df, hn::Mul(v0, vs), q + i);
    StoreFp8<kF>(df, hn::Mul(v1, vs), q + i + nl);
  }
  uint32_t m = ReduceAmaxBits(du, hn::Max(m0, m1));
  for (; i < n; ++i) {
    const float v = ScalarLoad(x + i);
    const uint32_t a = ScalarAbsBits(v);
    m = a > m ? a : m;
    q[i] = FloatToFp8(v * scale, kF);
  }
  return m;
}

// x[i] = q[i] * scale_inv, rounded once to T.
template <Fp8Format kF, class T>
HWY_INLINE void DequantizeSpan(const uint8_t* HWY_RESTRICT q, T* HWY_RESTRICT x, size_t n, float scale_inv) {
  const hn::ScalableTag<float> df;
  const size_t nl = hn::Lanes(df);
  const auto vs = hn::Set(df, scale_inv);
  size_t i = 0;
  for (; i + nl <= n; i += nl) StoreF(hn::Mul(LoadFp8<kF>(df, q + i), vs), df, x + i);
  for (; i < n; ++i) ScalarStore(Fp8ToFloat(q[i], kF) * scale_inv, x + i);
}

// max(amax_bits, max |bits(x)|).
template <class T>
HWY_INLINE uint32_t AmaxSpan(const T* HWY_RESTRICT x, size_t n, uint32_t amax_bits) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nl = hn::Lanes(df);
  auto m0 = hn::Set(du, amax_bits), m1 = hn::Zero(du), m2 = hn::Zero(du), m3 = hn::Zero(du);
  size_t i = 0;
  for (; i + 4 * nl <= n; i += 4 * nl) {
    m0 = hn::Max(m0, AbsBits(df, LoadF(df, x + i)));
    m1 = hn::Max(m1, AbsBits(df, LoadF(df, x + i + nl)));
    m2 = hn::Max(m2, AbsBits(df, LoadF(df, x + i + 2 * nl)));
    m3 = hn::Max(m3, AbsBits(df, LoadF(df, x + i + 3 * nl)));
  }
  uint32_t m = ReduceAmaxBits(du, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3)));
  for (; i < n; ++i) {
    const uint32_t a = ScalarAbsBits(ScalarLoad(x + i));
    m = a > m ? a : m;
  }
  return m;
}

// An fp32 span (a row computed in registers or a buffer) quantized; returns
// max(amax_bits, max |bits(z)|).
template <Fp8Format kF>
HWY_INLINE uint32_t QuantizeF32Span(const float* HWY_RESTRICT z, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                    uint32_t amax_bits) {
  return QuantizeSpan<kF, float>(z, q, n, scale, amax_bits);
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TEFL_BACKENDS_PORTABLE_FP8_IO_INL_H_
