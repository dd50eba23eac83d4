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

#include <hwy/cache_control.h>
#include <hwy/highway.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
  static constexpr int kShift = 23 - kMbits;
  static constexpr float kMaxValue = kF == Fp8Format::kE4M3 ? 448.0f : 57344.0f;
  // fp32 biased exponent of the smallest normal 2^(1 - bias).
  static constexpr uint32_t kBmin = uint32_t(127 + 1 - kBias);
  // Encode: the magic's bits are eb + (eb >> kShift) + kMagicK for eb = max(exponent bits, kBmin << 23).
  static constexpr uint32_t kMagicK = (uint32_t(kShift) << 23) - (kBmin << kMbits);
  // Decode: the magnitude bits shifted to the fp32 mantissa's top read as a float times 2^(127 - bias).
  static constexpr float kDecodeScale = kF == Fp8Format::kE4M3 ? 0x1p120f : 0x1p112f;
  static constexpr uint32_t kDecodeMask = 0x80000000u | (0x7Fu << kShift);
};

// |y| saturated (af = min(|y|, max) as a non-negative float, not NaN) ->
// bits whose low 7 bits are the FP8 magnitude code, rounded to nearest even.
// One rounding path for normals and subnormals: with B = max(fp32 exponent
// of af, that of the smallest normal), the magic c = 2^(B - 127 + 23 - mbits)
// * (1 + ((B - Bmin) << mbits) * 2^-23) has an ulp equal to the FP8 spacing
// in af's binade (normal or subnormal), so the float add af + c rounds af
// there (ties to even: c's mantissa is even) and leaves
// ((B - Bmin) << mbits) + round(af / ulp) = the code in the low mantissa
// bits (a carry into the next binade gives the next exponent's code).
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> EncodeMagnitude(DF df, hn::Vec<DF> af) {
  using C = Fp8C<kF>;
  const hn::RebindToUnsigned<DF> du;
  const auto eb = hn::Max(hn::And(hn::BitCast(du, af), hn::Set(du, 0x7F800000u)), hn::Set(du, C::kBmin << 23));
  const auto c = hn::Add(hn::Add(eb, hn::ShiftRight<C::kShift>(eb)), hn::Set(du, C::kMagicK));
  return hn::BitCast(du, hn::Add(af, hn::BitCast(df, c)));
}

// The low 7 bits of t (a magnitude code) with bit 7 = the sign bit of `bits`
// (a float's bits): a clean code in 0..255.
// (Highway's IfVecThenElse wants all-ones/all-zero lanes; this is a bitwise
// select with a constant mask, one vpternlogd on AVX-512.)
template <class V>
HWY_INLINE V BitSelect(V mask, V yes, V no) {
  return hn::Or(hn::And(mask, yes), hn::AndNot(mask, no));
}
template <class DU>
HWY_INLINE hn::Vec<DU> WithSign(DU du, hn::Vec<DU> t, hn::Vec<DU> bits) {
  return BitSelect(hn::Set(du, 0x7Fu), t, hn::ShiftRight<24>(bits));
}

// fp32 lanes -> codes (0..255) in 32-bit lanes: saturating (finite overflow
// and inf -> max), NaN -> 0x7F, the sign ORed back (-0 -> 0x80).
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> EncodeFp8(DF df, hn::Vec<DF> v) {
  using C = Fp8C<kF>;
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  // A NaN lane's magnitude is garbage (x86's min returns the second operand,
  // max, for a NaN; other targets may keep the NaN) and gets all 7 bits set.
  const auto af = hn::Min(hn::BitCast(df, hn::And(bits, hn::Set(du, 0x7FFFFFFFu))), hn::Set(df, C::kMaxValue));
  auto t = EncodeMagnitude<kF>(df, af);
  t = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), hn::Or(t, hn::Set(du, 0x7Fu)), t);
  return WithSign(du, t, bits);
}

// ---- Narrowing codes to bytes ------------------------------------------------
#undef TEFL_FP8_AVX3
#undef TEFL_FP8_STORE4
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
#define TEFL_FP8_AVX3 1
#else
#define TEFL_FP8_AVX3 0
#endif
// StoreCodes4 is one vector store (which may stream) on AVX-512 and AVX2.
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TEFL_FP8_STORE4 1
#else
#define TEFL_FP8_STORE4 0
#endif

// Four vectors of clean codes (0..255 in 32-bit lanes) -> 4 * Lanes bytes in
// order at p. AVX-512 and AVX2: two packs and one dword permutation into one
// 64- or 32-byte store (streamed if kStream: p then must be 64-byte aligned);
// elsewhere four narrowing stores (kStream ignored).
template <bool kStream, class DU>
HWY_INLINE void StoreCodes4(DU du, hn::Vec<DU> c0, hn::Vec<DU> c1, hn::Vec<DU> c2, hn::Vec<DU> c3,
                            uint8_t* HWY_RESTRICT p) {
#if TEFL_FP8_AVX3
  (void)du;
  const __m512i w01 = _mm512_packus_epi32(c0.raw, c1.raw);  // per 128-bit block: 4 of c0, 4 of c1 (u16)
  const __m512i w23 = _mm512_packus_epi32(c2.raw, c3.raw);
  const __m512i b = _mm512_packus_epi16(w01, w23);  // per block l: dword k = c_k[4l .. 4l + 3]
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  const __m512i out = _mm512_permutexvar_epi32(idx, b);
  if constexpr (kStream) {
    _mm512_stream_si512(reinterpret_cast<__m512i*>(p), out);
  } else {
    _mm512_storeu_si512(p, out);
  }
#elif HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  // The same with 8 lanes: two packs leave dword k of block l = c_k[4l .. 4l + 3].
  (void)du;
  const __m256i w01 = _mm256_packus_epi32(c0.raw, c1.raw);
  const __m256i w23 = _mm256_packus_epi32(c2.raw, c3.raw);
  const __m256i b = _mm256_packus_epi16(w01, w23);
  const __m256i out = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), out);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), out);
  }
#else
  const hn::RebindToSigned<DU> di;
  const hn::Rebind<uint8_t, DU> d8;
  const size_t nl = hn::Lanes(du);
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, c0)), d8, p);
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, c1)), d8, p + nl);
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, c2)), d8, p + 2 * nl);
  hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, c3)), d8, p + 3 * nl);
#endif
}

// Four fp32 vectors times scale encoded (EncodeFp8: NaN kept) into 4 * Lanes
// codes at q, one 64-byte store on AVX-512 (streamed if kStream: q 64-byte
// aligned).
template <Fp8Format kF, bool kStream, class DF>
HWY_INLINE void StoreFp8x4(DF df, hn::Vec<DF> z0, hn::Vec<DF> z1, hn::Vec<DF> z2, hn::Vec<DF> z3, hn::Vec<DF> vscale,
                           uint8_t* HWY_RESTRICT q) {
  const hn::RebindToUnsigned<DF> du;
  StoreCodes4<kStream>(du, EncodeFp8<kF>(df, hn::Mul(z0, vscale)), EncodeFp8<kF>(df, hn::Mul(z1, vscale)),
                       EncodeFp8<kF>(df, hn::Mul(z2, vscale)), EncodeFp8<kF>(df, hn::Mul(z3, vscale)), q);
}

// ---- Decode ------------------------------------------------------------------
// Lanes(df) codes from p -> floats whose value times Fp8C::kDecodeScale is the
// code's value (exactly: normal codes are tiny normal floats, subnormal codes
// fp32 subnormals whose mantissa is the code's, so one exact multiply by
// 2^(127 - bias) decodes both; assumes the default MXCSR, denormals not
// treated as zero). NaN codes give sign | 0x7FC00000 and E5M2 inf gives inf,
// which the multiply keeps: the values and NaN bits of Fp8DecodeTable.
template <Fp8Format kF, class DF>
HWY_INLINE hn::Vec<DF> LoadFp8Unscaled(DF df, const uint8_t* HWY_RESTRICT p) {
  using C = Fp8C<kF>;
  const hn::RebindToUnsigned<DF> du;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint8_t, DF> du8;
  const hn::Rebind<int8_t, DF> di8;
  const auto raw = hn::LoadU(du8, p);
  // Sign-extended: shifting the byte to the mantissa's top leaves ones above
  // it for negative codes, and the mask keeps only bit 31 of them.
  auto bits = hn::And(hn::BitCast(du, hn::ShiftLeft<C::kShift>(hn::PromoteTo(di, hn::BitCast(di8, raw)))),
                      hn::Set(du, C::kDecodeMask));
#if TEFL_FP8_AVX3
  // Special codes found on the 16 bytes: the byte mask is the dword mask.
  const auto mag8 = hn::BitCast(di8, hn::And(raw, hn::Set(du8, 0x7F)));
  using M = hn::Mask<decltype(du)>;
  if constexpr (kF == Fp8Format::kE4M3) {
    const M nan{hn::Eq(mag8, hn::Set(di8, 0x7F)).raw};
    bits = hn::IfThenElse(nan, hn::Xor(bits, hn::Set(du, 0x07F00000u ^ 0x7FC00000u)), bits);
  } else {
    const M inf{hn::Eq(mag8, hn::Set(di8, 0x7C)).raw};
    const M nan{hn::Gt(mag8, hn::Set(di8, 0x7C)).raw};
    bits = hn::IfThenElse(inf, hn::Xor(bits, hn::Set(du, 0x0F800000u ^ 0x7F800000u)), bits);
    bits = hn::IfThenElse(nan, BitSelect(hn::Set(du, 0x80000000u), bits, hn::Set(du, 0x7FC00000u)), bits);
  }
#else
  const auto mag = hn::And(hn::PromoteTo(du, raw), hn::Set(du, 0x7Fu));
  if constexpr (kF == Fp8Format::kE4M3) {
    bits = hn::IfThenElse(hn::Eq(mag, hn::Set(du, 0x7Fu)), hn::Xor(bits, hn::Set(du, 0x07F00000u ^ 0x7FC00000u)), bits);
  } else {
    bits = hn::IfThenElse(hn::Eq(mag, hn::Set(du, 0x7Cu)), hn::Xor(bits, hn::Set(du, 0x0F800000u ^ 0x7F800000u)), bits);
    bits = hn::IfThenElse(hn::RebindMask(du, hn::Gt(hn::BitCast(di, mag), hn::Set(di, 0x7C))),
                          BitSelect(hn::Set(du, 0x80000000u), bits, hn::Set(du, 0x7FC00000u)), bits);
  }
#endif
  return hn::BitCast(df, bits);
}

// ---- Decode through F16C (AVX2) ---------------------------------------------------
// A code widened to fp16 bits is exact: E5M2 is the top byte of an fp16 (same
// bias, inf and NaN included), and E4M3's magnitude shifted left by 7 is an
// fp16 whose value is the code's times 2^-8 (biases 15 and 7), subnormals
// included. vcvtph2ps then widens to fp32 with no fp32 subnormal on the way:
// LoadFp8Unscaled's subnormal fp32 lanes make the multiply that follows ~2x
// slower on Zen 3 (a microbenchmark on the codes of `tefl bench`, 6 % of them
// subnormal: bf16 output 0.47 -> 0.20 ns per element, fp32 0.23 -> 0.10).
// On AVX-512 too (session 26): Intel cores take a microcode assist for each
// multiply with a subnormal operand, and bf16 dequantize of [8192, 4096] ran
// at 10 % of the copy bandwidth on Sapphire Rapids with the decode above.
// SSE4 has no F16C.
#undef TEFL_FP8_F16C
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define TEFL_FP8_F16C 1
#else
#define TEFL_FP8_F16C 0
#endif

// The factor that DequantizeBody's decode leaves out of a code's value.
template <Fp8Format kF>
constexpr float DequantDecodeScale() {
  if (TEFL_FP8_F16C) return kF == Fp8Format::kE4M3 ? 0x1p8f : 1.0f;
  return Fp8C<kF>::kDecodeScale;
}

#if TEFL_FP8_F16C
// 2 * Lanes(df) codes from p -> two fp32 vectors (codes in order) whose values
// times DequantDecodeScale are the codes' (exactly); NaN codes give sign |
// 0x7FC00000 (fp16 sign | 0x7E00 widened) and E5M2 inf gives inf: the values
// and NaN bits of Fp8DecodeTable.
template <Fp8Format kF, class DF>
HWY_INLINE void LoadFp8Pair(DF df, const uint8_t* HWY_RESTRICT p, hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
  const hn::Repartition<uint16_t, DF> du16;
  const hn::RebindToSigned<decltype(du16)> di16;
  const hn::Rebind<int8_t, decltype(di16)> di8;
  const auto w = hn::BitCast(du16, hn::PromoteTo(di16, hn::LoadU(di8, reinterpret_cast<const int8_t*>(p))));
  hn::Vec<decltype(du16)> h;
  if constexpr (kF == Fp8Format::kE4M3) {
    // The sign-extended byte shifted left by 7: the sign in bits 15 and 14
    // (cleared), the magnitude in bits 13..7.
    h = hn::And(hn::ShiftLeft<7>(w), hn::Set(du16, uint16_t(0xBF80)));
    const auto nan = hn::Eq(hn::And(h, hn::Set(du16, uint16_t(0x3F80))), hn::Set(du16, uint16_t(0x3F80)));
    h = hn::IfThenElse(nan, hn::Xor(h, hn::Set(du16, uint16_t(0x3F80 ^ 0x7E00))), h);
  } else {
    h = hn::ShiftLeft<8>(w);
    const auto mag = hn::BitCast(di16, hn::And(h, hn::Set(du16, uint16_t(0x7FFF))));
    const auto nan = hn::RebindMask(du16, hn::Gt(mag, hn::Set(di16, int16_t(0x7C00))));
    h = hn::IfThenElse(nan, hn::Or(hn::And(h, hn::Set(du16, uint16_t(0x8000))), hn::Set(du16, uint16_t(0x7E00))), h);
  }
  const hn::Half<decltype(du16)> dh;
  const hn::Rebind<hwy::float16_t, DF> df16;
  lo = hn::PromoteTo(df, hn::BitCast(df16, hn::LowerHalf(dh, h)));
  hi = hn::PromoteTo(df, hn::BitCast(df16, hn::UpperHalf(dh, h)));
}
#endif

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
// Spans of at least this many elements may stream (non-temporal stores)
// their output when the caller asks; the head up to the output's first
// 64-byte boundary is stored normally.
inline size_t HeadTo64(const void* p, size_t n) {
  const size_t mis = size_t(reinterpret_cast<uintptr_t>(p) % 64);
  return mis == 0 ? 0 : std::min(n, size_t(64) - mis);
}

// q[i] = fp8(x[i] * scale) for i < n, any scale; returns max(amax_bits, max |bits(x)|).
template <Fp8Format kF, class T>
HWY_INLINE uint32_t QuantizeSpanGeneral(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                        uint32_t amax_bits) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nl = hn::Lanes(df);
  const auto vs = hn::Set(df, scale);
  auto m0 = hn::Set(du, amax_bits), m1 = hn::Zero(du);
  size_t i = 0;
  for (; i + 4 * nl <= n; i += 4 * nl) {
    const auto v0 = LoadF(df, x + i), v1 = LoadF(df, x + i + nl);
    const auto v2 = LoadF(df, x + i + 2 * nl), v3 = LoadF(df, x + i + 3 * nl);
    m0 = hn::Max(m0, hn::Max(AbsBits(df, v0), AbsBits(df, v1)));
    m1 = hn::Max(m1, hn::Max(AbsBits(df, v2), AbsBits(df, v3)));
    StoreCodes4<false>(du, EncodeFp8<kF>(df, hn::Mul(v0, vs)), EncodeFp8<kF>(df, hn::Mul(v1, vs)),
                       EncodeFp8<kF>(df, hn::Mul(v2, vs)), EncodeFp8<kF>(df, hn::Mul(v3, vs)), q + i);
  }
  for (; i + nl <= n; i += nl) {
    const auto v = LoadF(df, x + i);
    m0 = hn::Max(m0, AbsBits(df, v));
    StoreFp8<kF>(df, hn::Mul(v, vs), q + i);
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

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// QuantizeSpanFast's body for 16-bit input (bf16; fp16 with F16C) on AVX2,
// 32 elements (64 bytes in, one 32-byte code store) per step; returns the
// elements done and folds max |bits(x)| into amax_bits. The generic body
// keeps four fp32 vectors and their raw bits live for the sign and the amax
// and spills (bf16: 86 instructions per step, 21 of them stack moves). Here
// the amax runs on the raw 16-bit |bits| (they sort like the values, NaN
// above inf, in both formats), Widen16 gives the fp32 |x| of each block's
// elements 0-3 and 4-7, two vpackusdw put each block's codes back in order,
// the sign bytes take the same per-block route through vpackuswb as the
// codes, and one vpermq orders both (bf16: 57 instructions, no spills). Same
// codes as the generic body: EncodeMagnitude of min(|x| scale, max), the
// sign of x.
//
// |x| (16-bit lanes, 16 elements) -> fp32 bits w0 = elements (0-3 | 8-11),
// w1 = (4-7 | 12-15), per 128-bit block; exact.
HWY_INLINE void Widen16(const bfloat16_t*, __m256i a, __m256i& w0, __m256i& w1) {
  w0 = _mm256_unpacklo_epi16(_mm256_setzero_si256(), a);  // bits << 16
  w1 = _mm256_unpackhi_epi16(_mm256_setzero_si256(), a);
}
#if TEFL_NATIVE_F16
HWY_INLINE void Widen16(const float16_t*, __m256i a, __m256i& w0, __m256i& w1) {
  const __m256i p = _mm256_permute4x64_epi64(a, 0xD8);  // (0-3, 8-11 | 4-7, 12-15)
  w0 = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_castsi256_si128(p)));
  w1 = _mm256_castps_si256(_mm256_cvtph_ps(_mm256_extracti128_si256(p, 1)));
}
#endif
// fp16 by integers (kF16Int below): |x| bits << 13 read as fp32 are |x| 2^-112
// exactly (normal or subnormal; inf's pattern reads 2^-96 and is fixed after
// encoding), with 2^112 folded into the scale (exact for scale <= 2^15), so
// min(|x| scale, max) is rounded once as in the generic body. Two shifts
// instead of vcvtph2ps, which costs Zen 3 ~9 cycles per 32 elements more.
HWY_INLINE void Widen16Int(__m256i a, __m256i& w0, __m256i& w1) {
  w0 = _mm256_slli_epi32(_mm256_unpacklo_epi16(a, _mm256_setzero_si256()), 13);
  w1 = _mm256_slli_epi32(_mm256_unpackhi_epi16(a, _mm256_setzero_si256()), 13);
}
// The fp32 bits of a 16-bit |bits| maximum.
HWY_INLINE uint32_t Abs16ToF32Bits(const bfloat16_t*, uint32_t m) { return m << 16; }
#if TEFL_NATIVE_F16
HWY_INLINE uint32_t Abs16ToF32Bits(const float16_t*, uint32_t m) {
  return uint32_t(_mm_cvtsi128_si32(_mm_castps_si128(_mm_cvtph_ps(_mm_cvtsi32_si128(int(m))))));  // NaN stays NaN
}
#endif
template <Fp8Format kF, bool kStream, bool kF16Int, class T>
HWY_INLINE size_t Quantize16Avx2(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                 uint32_t& amax_bits) {
  using C = Fp8C<kF>;
  const hn::Full256<float> df;
  using VF = hn::Vec<decltype(df)>;
  const VF vs = hn::Set(df, kF16Int ? scale * 0x1p112f : scale), vmax = hn::Set(df, C::kMaxValue);
  const __m256i inf16 = _mm256_set1_epi16(0x7C00), max_code16 = _mm256_set1_epi16(FloatToFp8(C::kMaxValue, kF));
  const __m256i abs16 = _mm256_set1_epi16(0x7FFF);
  const __m256i mag7 = _mm256_set1_epi32(0x7F), sign8 = _mm256_set1_epi16(0x80);
  // |x| as fp32 bits -> the magnitude code, clean (0..127).
  const auto code = [&](__m256i ab) HWY_ATTR {
    const VF af = hn::Min(hn::Mul(VF{_mm256_castsi256_ps(ab)}, vs), vmax);
    return _mm256_and_si256(EncodeMagnitude<kF>(df, af).raw, mag7);
  };
  // Codes of 16 elements as 16-bit lanes, in order.
  const auto codes16 = [&](__m256i a) HWY_ATTR {
    __m256i w0, w1;
    if constexpr (kF16Int) {
      Widen16Int(a, w0, w1);
      return _mm256_blendv_epi8(_mm256_packus_epi32(code(w0), code(w1)), max_code16, _mm256_cmpeq_epi16(a, inf16));
    } else {
      Widen16(x, a, w0, w1);
      return _mm256_packus_epi32(code(w0), code(w1));
    }
  };
  __m256i m0 = _mm256_setzero_si256(), m1 = _mm256_setzero_si256();
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    PrefetchAhead(x + i, 64);
    const __m256i r0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i));
    const __m256i r1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x + i + 16));
    const __m256i a0 = _mm256_and_si256(r0, abs16), a1 = _mm256_and_si256(r1, abs16);
    m0 = _mm256_max_epu16(m0, a0);
    m1 = _mm256_max_epu16(m1, a1);
    const __m256i c01 = codes16(a0), c23 = codes16(a1);
    const __m256i s0 = _mm256_and_si256(_mm256_srli_epi16(r0, 8), sign8);
    const __m256i s1 = _mm256_and_si256(_mm256_srli_epi16(r1, 8), sign8);
    // Both packs leave qwords (0-7, 16-23, 8-15, 24-31).
    const __m256i b = _mm256_or_si256(_mm256_packus_epi16(c01, c23), _mm256_packus_epi16(s0, s1));
    const __m256i out = _mm256_permute4x64_epi64(b, 0xD8);
    if constexpr (kStream) {
      _mm256_stream_si256(reinterpret_cast<__m256i*>(q + i), out);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), out);
    }
  }
  const hn::Full256<uint16_t> d16;
  using V16 = hn::Vec<decltype(d16)>;
  const uint32_t m = Abs16ToF32Bits(x, hn::GetLane(hn::MaxOfLanes(d16, hn::Max(V16{m0}, V16{m1}))));
  amax_bits = m > amax_bits ? m : amax_bits;
  return i;
}
#endif

// As QuantizeSpanGeneral for 0 < scale < inf, without the NaN fix-up: then
// x * scale has the sign of x and is NaN exactly where x is, so the amax
// (|bits| > inf's) tells whether a NaN was seen and the caller re-runs the
// span with the general path. Per vector: |x| (also the amax), times scale,
// min(., max) saturates, EncodeMagnitude, the sign from x. kStream: the
// 4-vector body uses non-temporal 64-byte stores (q + 0 must be 64-byte
// aligned on AVX-512 and AVX2 targets).
template <Fp8Format kF, bool kStream, class T>
HWY_INLINE uint32_t QuantizeSpanFast(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                     uint32_t amax_bits) {
  using C = Fp8C<kF>;
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nl = hn::Lanes(df);
  const auto vs = hn::Set(df, scale);
  const auto vmax = hn::Set(df, C::kMaxValue);
  const auto kAbs = hn::Set(du, 0x7FFFFFFFu);
  size_t i = 0;
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    i = Quantize16Avx2<kF, kStream, false>(x, q, n, scale, amax_bits);
  } else if constexpr (TEFL_NATIVE_F16 && std::is_same_v<T, float16_t>) {
    i = scale <= 0x1p15f ? Quantize16Avx2<kF, kStream, true>(x, q, n, scale, amax_bits)
                         : Quantize16Avx2<kF, kStream, false>(x, q, n, scale, amax_bits);
  }
#endif
  auto m0 = hn::Set(du, amax_bits), m1 = hn::Zero(du);
  const auto code = [&](hn::Vec<decltype(du)> bits, hn::Vec<decltype(du)> ab) {
    const auto af = hn::Min(hn::Mul(hn::BitCast(df, ab), vs), vmax);
    return WithSign(du, EncodeMagnitude<kF>(df, af), bits);
  };
  for (; i + 4 * nl <= n; i += 4 * nl) {
    PrefetchAhead(x + i, 4 * nl * sizeof(T));
    const auto b0 = hn::BitCast(du, LoadF(df, x + i)), b1 = hn::BitCast(du, LoadF(df, x + i + nl));
    const auto b2 = hn::BitCast(du, LoadF(df, x + i + 2 * nl)), b3 = hn::BitCast(du, LoadF(df, x + i + 3 * nl));
    const auto a0 = hn::And(b0, kAbs), a1 = hn::And(b1, kAbs), a2 = hn::And(b2, kAbs), a3 = hn::And(b3, kAbs);
    m0 = hn::Max(m0, hn::Max(a0, a1));
    m1 = hn::Max(m1, hn::Max(a2, a3));
    StoreCodes4<kStream>(du, code(b0, a0), code(b1, a1), code(b2, a2), code(b3, a3), q + i);
  }
  const hn::RebindToSigned<decltype(df)> di;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  for (; i + nl <= n; i += nl) {
    const auto b = hn::BitCast(du, LoadF(df, x + i));
    const auto a = hn::And(b, kAbs);
    m0 = hn::Max(m0, a);
    hn::StoreU(hn::DemoteTo(d8, hn::BitCast(di, code(b, a))), d8, q + i);
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

// q[i] = fp8(x[i] * scale) for i < n; returns max(amax_bits, max |bits(x)|).
// stream: store q with non-temporal stores (for outputs far beyond the
// caches; ends with a store fence).
template <Fp8Format kF, class T>
HWY_INLINE uint32_t QuantizeSpan(const T* HWY_RESTRICT x, uint8_t* HWY_RESTRICT q, size_t n, float scale,
                                 uint32_t amax_bits, bool stream = false) {
  if (!(scale > 0.0f && scale <= FLT_MAX)) return QuantizeSpanGeneral<kF>(x, q, n, scale, amax_bits);
  uint32_t m;
  if (TEFL_FP8_STORE4 && stream) {
    const size_t head = HeadTo64(q, n);
    m = QuantizeSpanFast<kF, false>(x, q, head, scale, amax_bits);
    m = QuantizeSpanFast<kF, true>(x + head, q + head, n - head, scale, m);
    hwy::FlushStream();
  } else {
    m = QuantizeSpanFast<kF, false>(x, q, n, scale, amax_bits);
  }
  if (m > 0x7F800000u) return QuantizeSpanGeneral<kF>(x, q, n, scale, amax_bits);  // a NaN: redo
  return m;
}

#if HWY_TARGET != HWY_SCALAR
// bf16 bits of two fp32 vectors, rounded to nearest even, for values whose
// NaNs (if any) carry no payload below bit 22 (sign | 0x7FC00000: decoded FP8
// NaNs, the default NaN): then the rounding bias cannot reach the exponent and
// no NaN fix-up is needed.
template <class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF>> Bf16BitsNoPayload2(DF df, hn::Vec<DF> v0, hn::Vec<DF> v1) {
  const hn::RebindToUnsigned<DF> du;
  const hn::Repartition<uint16_t, DF> du16;
  const auto round = [&](hn::Vec<DF> v) { return hn::BitCast(du16, AddBF16RoundingBias(du, hn::BitCast(du, v))); };
  return hn::ConcatOdd(du16, round(v1), round(v0));
}

#endif

// x[i] = q[i] * scale_inv (the exact decoded value times scale_inv, rounded to
// fp32, then once more to T), for i in [i, n) from `i`; kStream: x + i must be
// 64-byte aligned on entry. Returns the first index not done (< one vector
// pair from n). c1, c2: see DequantizeSpan.
template <Fp8Format kF, bool kStream, class T, class DF>
HWY_INLINE size_t DequantizeBody(DF df, const uint8_t* HWY_RESTRICT q, T* HWY_RESTRICT x, size_t i, size_t n,
                                 hn::Vec<DF> c1, hn::Vec<DF> c2, bool two_muls, bool s_nan) {
  using V = hn::Vec<DF>;
  const size_t nl = hn::Lanes(df);
  const auto scale = [&](V u) { return two_muls ? hn::Mul(hn::Mul(u, c1), c2) : hn::Mul(u, c1); };
#if HWY_TARGET != HWY_SCALAR
  // Two vectors per step: bf16 stores them as one vector, and the F16C
  // decode produces two.
  const auto load2 = [&](size_t k, V& v0, V& v1) {
#if TEFL_FP8_F16C
    LoadFp8Pair<kF>(df, q + k, v0, v1);
#else
    v0 = LoadFp8Unscaled<kF>(df, q + k);
    v1 = LoadFp8Unscaled<kF>(df, q + k + nl);
#endif
    v0 = scale(v0);
    v1 = scale(v1);
  };
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    const hn::Repartition<uint16_t, DF> du16;
    auto* HWY_RESTRICT p = reinterpret_cast<uint16_t*>(x);
    for (; i + 2 * nl <= n; i += 2 * nl) {
      V v0, v1;
      if (i % 64 == 0) PrefetchAhead(q + i, 64);
      load2(i, v0, v1);
      const auto b = s_nan ? RoundToBF16Bits2(v0, v1, df) : Bf16BitsNoPayload2(df, v0, v1);
      if constexpr (kStream) {
        hn::Stream(b, du16, p + i);
      } else {
        hn::StoreU(b, du16, p + i);
      }
    }
  } else if (TEFL_FP8_F16C) {
    for (; i + 2 * nl <= n; i += 2 * nl) {
      V v0, v1;
      if (i % 64 == 0) PrefetchAhead(q + i, 64);
      load2(i, v0, v1);
      if constexpr (kStream) {
        StreamF(v0, df, x + i);
        StreamF(v1, df, x + i + nl);
      } else {
        StoreF(v0, df, x + i);
        StoreF(v1, df, x + i + nl);
      }
    }
  }
#endif
#if !TEFL_FP8_F16C  // one vector at a time (F16C: the caller's scalar tail)
  for (; i + nl <= n; i += nl) {
    const V v = scale(LoadFp8Unscaled<kF>(df, q + i));
    if constexpr (kStream && !std::is_same_v<T, bfloat16_t>) {
      StreamF(v, df, x + i);
    } else {
      StoreF(v, df, x + i);
    }
  }
#endif
  return i;
}

#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
// DequantizeSpan's body for bf16 output on AVX2 with 2^-100 <= |scale_inv| <=
// 2^100, 32 codes per step, by table; returns the elements done (from i).
// In that range every product is a normal fp32 and bf16 number, so scaling
// by a power of two commutes with both roundings: the result for a code of
// exponent field e >= 1 and mantissa m is the one for (1, m) with e - 1 added
// to its exponent field (a carry of the rounding into the exponent included:
// the bits add). A 16-entry table per call holds, by the scalar code itself
// (ScalarStore of Fp8ToFloat(c) * scale_inv), the results for e = 1 less one
// exponent step, those of the subnormal codes (e = 0, nothing added) and, for
// E5M2, those of e = 31 (inf, NaN) less 31 steps; vpshufb looks up its low
// and high bytes. The code's sign flips the result's (scale_inv's sign is in
// the table). E4M3's NaN codes (S.1111.111) look up 0, get 0x780 added and
// 0x7FC0 ORed in: sign | 0x7FC0, as the generic body. ~39 instructions per
// 32 codes against ~60 for decode, multiply and round.
template <Fp8Format kF>
HWY_INLINE size_t DequantizeBf16Avx2(const uint8_t* HWY_RESTRICT q, bfloat16_t* HWY_RESTRICT x, size_t i, size_t n,
                                     float scale_inv) {
  constexpr int kM = Fp8C<kF>::kMbits;
  constexpr int kMMask = (1 << kM) - 1;   // mantissa field
  constexpr int kEMask = 0x7F & ~kMMask;  // exponent field
  constexpr bool kE4M3 = kF == Fp8Format::kE4M3;
  const auto bits = [&](int c) {
    bfloat16_t b;
    ScalarStore(Fp8ToFloat(uint8_t(c), kF) * scale_inv, &b);
    uint16_t u;
    std::memcpy(&u, &b, 2);
    return u;
  };
  // idx = m | (e == 0) << kM | (E5M2: e == 31) << 3
  uint16_t t[16] = {};
  for (int m = 0; m <= kMMask; ++m) {
    t[m] = uint16_t(bits((1 << kM) | m) - (1u << 7));
    t[(1 << kM) | m] = bits(m);
    if constexpr (!kE4M3) t[8 | m] = uint16_t(bits(kEMask | m) - (31u << 7));
  }
  alignas(16) uint8_t lo[16], hi[16];
  for (int k = 0; k < 16; ++k) {
    lo[k] = uint8_t(t[k]);
    hi[k] = uint8_t(t[k] >> 8);
  }
  const __m256i tlo = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(lo)));
  const __m256i thi = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(hi)));
  const __m256i zero = _mm256_setzero_si256();
  const __m256i mmask = _mm256_set1_epi8(char(kMMask)), emask = _mm256_set1_epi8(char(kEMask));
  const __m256i zero_e_bit = _mm256_set1_epi8(char(1 << kM));
  const __m256i emask16 = _mm256_set1_epi16(kEMask), sign16 = _mm256_set1_epi16(short(0x8000));
  const __m256i mag8 = _mm256_set1_epi8(0x7F), nan16 = _mm256_set1_epi16(0x7FC0);
  for (; i + 32 <= n; i += 32) {
    // Qwords (0-7, 16-23 | 8-15, 24-31): the byte -> 16-bit unpacks below
    // then give elements 0-15 and 16-31 in order.
    const __m256i c = _mm256_permute4x64_epi64(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + i)), 0xD8);
    const __m256i e = _mm256_and_si256(c, emask);
    __m256i idx = _mm256_or_si256(_mm256_and_si256(c, mmask), _mm256_and_si256(_mm256_cmpeq_epi8(e, zero), zero_e_bit));
    __m256i nan = zero;
    if constexpr (kE4M3) {
      nan = _mm256_cmpeq_epi8(_mm256_and_si256(c, mag8), mag8);
      idx = _mm256_or_si256(idx, nan);  // bit 7 set: vpshufb gives 0
    } else {
      idx = _mm256_or_si256(idx, _mm256_and_si256(_mm256_cmpeq_epi8(e, emask), _mm256_set1_epi8(8)));
    }
    const __m256i vlo = _mm256_shuffle_epi8(tlo, idx), vhi = _mm256_shuffle_epi8(thi, idx);
    const auto finish = [&](__m256i tv, __m256i c16, __m256i nan16m) HWY_ATTR {
      __m256i r = _mm256_add_epi16(tv, _mm256_slli_epi16(_mm256_and_si256(c16, emask16), 7 - kM));
      if constexpr (kE4M3) r = _mm256_or_si256(r, _mm256_and_si256(nan16m, nan16));
      return _mm256_xor_si256(r, _mm256_and_si256(_mm256_slli_epi16(c16, 8), sign16));
    };
    const __m256i r0 =
        finish(_mm256_unpacklo_epi8(vlo, vhi), _mm256_unpacklo_epi8(c, zero), _mm256_unpacklo_epi8(nan, nan));
    const __m256i r1 =
        finish(_mm256_unpackhi_epi8(vlo, vhi), _mm256_unpackhi_epi8(c, zero), _mm256_unpackhi_epi8(nan, nan));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i), r0);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(x + i + 16), r1);
  }
  return i;
}
#endif

// x[i] = q[i] * scale_inv, for i < n: Fp8ToFloat(q[i]) * scale_inv rounded
// to fp32, then to T. stream: non-temporal stores for x (ends with a fence).
template <Fp8Format kF, class T>
HWY_INLINE void DequantizeSpan(const uint8_t* HWY_RESTRICT q, T* HWY_RESTRICT x, size_t n, float scale_inv,
                               bool stream = false) {
  constexpr float kDecode = DequantDecodeScale<kF>();
  const hn::ScalableTag<float> df;
  // One multiply by kDecode * scale_inv when that product is exact and
  // normal (then it rounds the exact value once, like the two multiplies).
  const float as = std::fabs(scale_inv);
  const bool two_muls = !(as >= 0x1p-100f && as <= 0x1p127f / kDecode);
  const auto c1 = hn::Set(df, two_muls ? kDecode : kDecode * scale_inv);
  const auto c2 = hn::Set(df, scale_inv);
  const bool s_nan = std::isnan(scale_inv);
  size_t i = 0;
  if (stream) {
    const size_t head = std::min(n, HeadTo64(x, n * sizeof(T)) / sizeof(T));
    for (; i < head; ++i) ScalarStore(Fp8ToFloat(q[i], kF) * scale_inv, x + i);
    if (reinterpret_cast<uintptr_t>(x + i) % 64 == 0)
      i = DequantizeBody<kF, true>(df, q, x, i, n, c1, c2, two_muls, s_nan);
  }
#if HWY_ARCH_X86 && HWY_TARGET == HWY_AVX2
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    if (as >= 0x1p-100f && as <= 0x1p100f) i = DequantizeBf16Avx2<kF>(q, x, i, n, scale_inv);
  }
#endif
  i = DequantizeBody<kF, false>(df, q, x, i, n, c1, c2, two_muls, s_nan);
  for (; i < n; ++i) ScalarStore(Fp8ToFloat(q[i], kF) * scale_inv, x + i);
  if (stream) hwy::FlushStream();
}

// max(amax_bits, max |bits(x)|).
template <class T>
HWY_INLINE uint32_t AmaxSpan(const T* HWY_RESTRICT x, size_t n, uint32_t amax_bits) {
  if constexpr (std::is_same_v<T, float>) {
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
      const uint32_t a = ScalarAbsBits(x[i]);
      m = a > m ? a : m;
    }
    return m;
  } else {
    // bf16 / fp16: |bits| as 16-bit integers sort like the values (NaN above
    // inf), so the max runs on the raw 16-bit lanes, converted once at the end.
    const hn::ScalableTag<uint16_t> d16;
    const size_t nl = hn::Lanes(d16);
    const auto* HWY_RESTRICT p = reinterpret_cast<const uint16_t*>(x);
    const auto kAbs = hn::Set(d16, uint16_t(0x7FFF));
    auto m0 = hn::Zero(d16), m1 = hn::Zero(d16), m2 = hn::Zero(d16), m3 = hn::Zero(d16);
    size_t i = 0;
    for (; i + 4 * nl <= n; i += 4 * nl) {
      m0 = hn::Max(m0, hn::And(hn::LoadU(d16, p + i), kAbs));
      m1 = hn::Max(m1, hn::And(hn::LoadU(d16, p + i + nl), kAbs));
      m2 = hn::Max(m2, hn::And(hn::LoadU(d16, p + i + 2 * nl), kAbs));
      m3 = hn::Max(m3, hn::And(hn::LoadU(d16, p + i + 3 * nl), kAbs));
    }
    uint16_t m16 = hn::GetLane(hn::MaxOfLanes(d16, hn::Max(hn::Max(m0, m1), hn::Max(m2, m3))));
    for (; i < n; ++i) m16 = std::max(m16, uint16_t(p[i] & 0x7FFF));
    const float mv = ScalarLoad(reinterpret_cast<const T*>(&m16));  // exact widening (NaN stays NaN)
    const uint32_t m = ScalarAbsBits(mv);
    return m > amax_bits ? m : amax_bits;
  }
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
