// default.portable: fp32/bf16/fp16 element access shared by every Highway
// kernel file (Highway's per-target "-inl.h" pattern: include it after
// <hwy/highway.h> inside a foreach_target.h translation unit; it re-expands
// once per target).
//
// Contract: loads widen exactly; stores round once to nearest even (NaN
// stays NaN, with its quiet bit set); Stream* need addresses aligned to the
// stored vector's size.
// ---- Shared by every target (defined once) ----------------------------------
#ifndef TEFL_BACKENDS_PORTABLE_SIMD_IO_SHARED_
#define TEFL_BACKENDS_PORTABLE_SIMD_IO_SHARED_
#include <hwy/base.h>
#include <hwy/cache_control.h>

#include <cstdint>
#include <cstring>

#include "backends/portable/cpu_paths.h"
#include "core/dtype.h"
namespace tefl::backends {
// The AVX512-BF16 store path (TEFL_BF16_NATIVE targets): the CPU has it and
// TEFL_PORTABLE_BF16_CVT=0 is not set (cpu_paths.h).
inline bool UseBf16NativeStore() { return PortablePathOn(PortablePath::kBf16Cvt); }

// The streaming loops (activations, RoPE, dropout, FP8 quantize and
// dequantize) prefetch each input this many bytes ahead. The hardware
// prefetcher alone left the large-shape loops waiting on memory: on Zen 3 the
// bf16 dbias loop (single thread, [8192, 4096]: 21-26 ms without, 20-22 ms
// with, at 2 KiB); on a Sapphire Rapids VM every compute-heavy loop (bf16
// gelu 25.3 -> 9.2 ms, dgelu 35.7 -> 13.0 ms at 4 KiB; docs/performance.md,
// session 26).
constexpr uintptr_t kInputPrefetchBytes = 4096;
// The 64-byte lines of [p, p + bytes), kInputPrefetchBytes ahead (into L1).
// An address past the end is harmless for a prefetch (no fault, no access).
// Always inlined, with hwy::Prefetch's target: GCC does not inline a plain
// function into the targets' code, and then drops the call as free of side
// effects (the prefetches vanished from the AVX-512 loops).
HWY_INLINE HWY_ATTR_CACHE void PrefetchAhead(const void* p, size_t bytes = 1) {
  for (size_t l = 0; l < bytes; l += 64)
    hwy::Prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + kInputPrefetchBytes + l));
}

// ---- Scalar element access (tails; fp16 on targets without F16C; code
// outside Highway's targets) ---------------------------------------------------
inline float ScalarLoad(const float* p) { return *p; }
inline float ScalarLoad(const hwy::bfloat16_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return BF16ToFloat(b);
}
inline float ScalarLoad(const hwy::float16_t* p) {
  uint16_t b;
  std::memcpy(&b, p, 2);
  return F16ToFloat(b);
}
inline void ScalarStore(float v, float* p) { *p = v; }
inline void ScalarStore(float v, hwy::bfloat16_t* p) {
  const uint16_t b = FloatToBF16(v);
  std::memcpy(p, &b, 2);
}
inline void ScalarStore(float v, hwy::float16_t* p) {
  const uint16_t b = FloatToF16(v);
  std::memcpy(p, &b, 2);
}
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_SIMD_IO_SHARED_

#if defined(TEFL_BACKENDS_PORTABLE_SIMD_IO_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TEFL_BACKENDS_PORTABLE_SIMD_IO_INL_H_
#undef TEFL_BACKENDS_PORTABLE_SIMD_IO_INL_H_
#else
#define TEFL_BACKENDS_PORTABLE_SIMD_IO_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <cstring>

#include "core/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Highway 1.0.3 converts fp16 <-> fp32 exactly only with F16C (x86 AVX2 and
// up). Its software fallback truncates and maps inf/NaN to finite values, so
// the other targets go through dtype.h's scalar conversions.
#undef TEFL_NATIVE_F16
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2 && !defined(HWY_DISABLE_F16C)
#define TEFL_NATIVE_F16 1
#else
#define TEFL_NATIVE_F16 0
#endif

using hwy::bfloat16_t;
using hwy::float16_t;

// ---- Vector loads: Lanes(df) elements of any float dtype as fp32 ----------
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF(DF df, const float* HWY_RESTRICT p) {
  return hn::LoadU(df, p);
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF(DF df, const bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<bfloat16_t, DF> dbf;
  return hn::PromoteTo(df, hn::LoadU(dbf, p));  // exact: a shift
}
template <class DF>
HWY_INLINE hn::Vec<DF> LoadF(DF df, const float16_t* HWY_RESTRICT p) {
#if TEFL_NATIVE_F16
  const hn::Rebind<float16_t, DF> dh;
  return hn::PromoteTo(df, hn::LoadU(dh, p));
#else
  HWY_ALIGN float buf[hn::MaxLanes(df)];
  for (size_t i = 0; i < hn::Lanes(df); ++i) buf[i] = ScalarLoad(p + i);
  return hn::Load(df, buf);
#endif
}

// ---- Vector stores: fp32 lanes rounded once to the destination dtype ------
template <class DF>
HWY_INLINE void StoreF(hn::Vec<DF> v, DF df, float* HWY_RESTRICT p) {
  hn::StoreU(v, df, p);
}

// bf16 round to nearest even by hand (Highway 1.0.3's DemoteTo truncates):
// fp32 bits + 0x7FFF + lsb have the rounded bf16 in the upper half, for
// every non-NaN (the bias could carry a NaN's payload into the exponent or
// the sign bit).
template <class DU>
HWY_INLINE hn::Vec<DU> AddBF16RoundingBias(DU du, hn::Vec<DU> bits) {
  const auto lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
  return hn::Add(bits, hn::Add(hn::Set(du, 0x7FFFu), lsb));
}
// The fp32 bits with the rounded bf16 in the upper half; a NaN keeps its
// payload with the quiet bit set.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundBF16Hi(hn::Vec<DF> v, DF df) {
  const hn::RebindToUnsigned<DF> du;
  const auto bits = hn::BitCast(du, v);
  const auto quiet_nan = hn::Or(bits, hn::Set(du, 0x00400000u));
  return hn::IfThenElse(hn::RebindMask(du, hn::Ne(v, v)), quiet_nan, AddBF16RoundingBias(du, bits));
}
// RoundBF16Hi without its NaN select, for values whose NaNs all have zero low
// 16 bits: then bits + 0x7FFF + lsb cannot carry out of the low half, and
// the upper half is the NaN as it was. That holds on x86 for results computed
// from bf16 data (widened NaNs have zero low halves, arithmetic keeps an
// operand's payload, only quieting it, and invalid operations give the
// default NaN 0xFFC00000); other architectures may not keep payloads, so
// there this is RoundBF16Hi.
template <class DF>
HWY_INLINE hn::Vec<hn::RebindToUnsigned<DF>> RoundBF16HiFromBF16Data(hn::Vec<DF> v, DF df) {
#if HWY_ARCH_X86
  (void)df;
  const hn::RebindToUnsigned<DF> du;
  return AddBF16RoundingBias(du, hn::BitCast(du, v));
#else
  return RoundBF16Hi(v, df);
#endif
}
// One vector's bf16 bits, narrowed: the upper halves fit in [0, 65535], so
// the saturating int32 -> uint16 demotion is exact.
template <class DF>
HWY_INLINE hn::Vec<hn::Rebind<uint16_t, DF>> RoundToBF16Bits(hn::Vec<DF> v, DF df) {
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<uint16_t, DF> du16;
  return hn::DemoteTo(du16, hn::BitCast(di, hn::ShiftRight<16>(RoundBF16Hi(v, df))));
}
#if HWY_TARGET != HWY_SCALAR
// Two vectors' bf16 bits as one full vector: the odd u16 lanes are the upper
// halves, so one ConcatOdd replaces two shifts and demotions.
template <class DF>
HWY_INLINE hn::Vec<hn::Repartition<uint16_t, DF>> RoundToBF16Bits2(hn::Vec<DF> v0, hn::Vec<DF> v1, DF df) {
  const hn::Repartition<uint16_t, DF> du16;
  return hn::ConcatOdd(du16, hn::BitCast(du16, RoundBF16Hi(v1, df)), hn::BitCast(du16, RoundBF16Hi(v0, df)));
}
#endif

// ---- AVX512-BF16 rounding (x86 AVX3 targets; CPU checked by the caller) ---
// vcvtne2ps2bf16 rounds 2 x 16 fp32 lanes to bf16 in one instruction: nearest
// even, NaN -> its upper half with the quiet bit set, as RoundBF16Hi. It reads
// subnormal inputs as 0 (DAZ) where RoundBF16Hi keeps them, so
// PackBF16Native checks both inputs for subnormals (vfpclassps) and rounds
// those rare steps by hand: the result is bit for bit the same either way.
// Inline asm rather than the intrinsic: Highway's AVX3 code is not compiled
// with -mavx512bf16, and a target("avx512bf16") function could not inline the
// kernels' functors. Callers run it only where CpuHasAvx512Bf16() is true.
#undef TEFL_BF16_NATIVE
#if HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL) && (defined(__GNUC__) || defined(__clang__))
#define TEFL_BF16_NATIVE 1
// bf16 bits of lo in u16 lanes [0, 16), of hi in lanes [16, 32).
HWY_INLINE __m512i Cvtne2ps2bf16(__m512 hi, __m512 lo) {
  __m512i r;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
  return r;
}
// bf16 bits of v0 in the even u16 lanes, of v1 in the odd ones (the u32
// lane k holds v0[k] low, v1[k] high): RoundBF16Hi's packing, one
// instruction plus a word permute.
HWY_INLINE hn::Vec<hn::ScalableTag<uint32_t>> PackBF16Native(hn::Vec<hn::ScalableTag<float>> v0,
                                                             hn::Vec<hn::ScalableTag<float>> v1) {
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<uint32_t> du;
  const __mmask16 sub = static_cast<__mmask16>(_mm512_fpclass_ps_mask(v0.raw, 0x20) |
                                               _mm512_fpclass_ps_mask(v1.raw, 0x20));  // 0x20: subnormal
  if (HWY_UNLIKELY(sub != 0)) {
    return hn::Or(hn::ShiftRight<16>(RoundBF16Hi(v0, df)), hn::And(RoundBF16Hi(v1, df), hn::Set(du, 0xFFFF0000u)));
  }
  const __m512i idx = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21,
                                       5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  return hn::Vec<hn::ScalableTag<uint32_t>>{_mm512_permutexvar_epi16(idx, Cvtne2ps2bf16(v1.raw, v0.raw))};
}
// Consecutive order: bf16 bits of v0 then v1 (2 x 16 elements in memory
// order), as RoundToBF16Bits2.
HWY_INLINE hn::Vec<hn::ScalableTag<uint16_t>> RoundToBF16Bits2Native(hn::Vec<hn::ScalableTag<float>> v0,
                                                                     hn::Vec<hn::ScalableTag<float>> v1) {
  const hn::ScalableTag<float> df;
  const __mmask16 sub =
      static_cast<__mmask16>(_mm512_fpclass_ps_mask(v0.raw, 0x20) | _mm512_fpclass_ps_mask(v1.raw, 0x20));
  if (HWY_UNLIKELY(sub != 0)) return RoundToBF16Bits2(v0, v1, df);
  return hn::Vec<hn::ScalableTag<uint16_t>>{Cvtne2ps2bf16(v1.raw, v0.raw)};
}
#else
#define TEFL_BF16_NATIVE 0
#endif

template <class DF>
HWY_INLINE void StoreF(hn::Vec<DF> v, DF df, bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, DF> du16;
  hn::StoreU(RoundToBF16Bits(v, df), du16, reinterpret_cast<uint16_t*>(p));
}
template <class DF>
HWY_INLINE void StoreF(hn::Vec<DF> v, DF df, float16_t* HWY_RESTRICT p) {
#if TEFL_NATIVE_F16
  const hn::Rebind<float16_t, DF> dh;  // F16C vcvtps2ph: nearest even
  hn::StoreU(hn::DemoteTo(dh, v), dh, p);
#else
  HWY_ALIGN float buf[hn::MaxLanes(df)];
  hn::Store(v, df, buf);
  for (size_t i = 0; i < hn::Lanes(df); ++i) ScalarStore(buf[i], p + i);
#endif
}

// Already-encoded 16-bit lanes (the bf16 pair path).
template <class D16>
HWY_INLINE void StoreF(hn::Vec<D16> bits, D16 d16, uint16_t* HWY_RESTRICT p) {
  hn::StoreU(bits, d16, p);
}

// Non-temporal variants; p must be aligned to the stored vector's size.
template <class D16>
HWY_INLINE void StreamF(hn::Vec<D16> bits, D16 d16, uint16_t* HWY_RESTRICT p) {
  hn::Stream(bits, d16, p);
}
template <class DF>
HWY_INLINE void StreamF(hn::Vec<DF> v, DF df, float* HWY_RESTRICT p) {
  hn::Stream(v, df, p);
}
// A 16-bit result of one fp32 vector is half a register: below 16 bytes
// (SSE4's 8-byte halves) there is no non-temporal store of it, so those
// targets store it plainly.
template <class DF>
HWY_INLINE void StreamF(hn::Vec<DF> v, DF df, bfloat16_t* HWY_RESTRICT p) {
  const hn::Rebind<uint16_t, DF> du16;
  if (hn::Lanes(du16) * sizeof(uint16_t) < 16) return StoreF(v, df, p);
  hn::Stream(RoundToBF16Bits(v, df), du16, reinterpret_cast<uint16_t*>(p));
}
template <class DF>
HWY_INLINE void StreamF(hn::Vec<DF> v, DF df, float16_t* HWY_RESTRICT p) {
#if TEFL_NATIVE_F16
  const hn::Rebind<uint16_t, DF> du16;
  const hn::Rebind<float16_t, DF> dh;
  if (hn::Lanes(du16) * sizeof(uint16_t) < 16) return StoreF(v, df, p);
  hn::Stream(hn::BitCast(du16, hn::DemoteTo(dh, v)), du16, reinterpret_cast<uint16_t*>(p));
#else
  StoreF(v, df, p);
#endif
}

// ---- Column sums of per-block partials -------------------------------------
// out[i] = sum over blk < blocks of partial[blk * stride + i], added in block
// order in double and rounded once to dtype t (double -> float -> t, as
// StoreFromDouble): the deterministic reduction of dbias / dgamma / dbeta.
template <class T>
HWY_INLINE void SumBlocksT(const double* HWY_RESTRICT partial, int64_t blocks, size_t stride, size_t n,
                           T* HWY_RESTRICT out) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t nd = hn::Lanes(dd);
  size_t i = 0;
  // The emulated targets' DemoteTo clamps to +-FLT_MAX; the C++ conversion
  // (and every hardware one) rounds a sum beyond it to +-inf, as the
  // reference does.
  constexpr bool kHardwareDemote = HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128;
  for (; kHardwareDemote && i + nd <= n; i += nd) {
    auto s = hn::Zero(dd);
    for (int64_t blk = 0; blk < blocks; ++blk) s = hn::Add(s, hn::LoadU(dd, partial + size_t(blk) * stride + i));
    StoreF(hn::DemoteTo(dfh, s), dfh, out + i);
  }
  for (; i < n; ++i) {
    double s = 0.0;
    for (int64_t blk = 0; blk < blocks; ++blk) s += partial[size_t(blk) * stride + i];
    ScalarStore(float(s), out + i);
  }
}
// out has dtype t: fp32, bf16 or fp16.
HWY_INLINE void SumBlocksToDtype(const double* partial, int64_t blocks, size_t stride, size_t n, void* out, DType t) {
  switch (t) {
    case DType::kF32:
      return SumBlocksT(partial, blocks, stride, n, static_cast<float*>(out));
    case DType::kBF16:
      return SumBlocksT(partial, blocks, stride, n, static_cast<bfloat16_t*>(out));
    default:
      return SumBlocksT(partial, blocks, stride, n, static_cast<float16_t*>(out));
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TEFL_BACKENDS_PORTABLE_SIMD_IO_INL_H_
