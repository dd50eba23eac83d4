// default.portable dropout kernels: dropout_fwd / dropout_bwd (keep rule in
// include/tefl/ops.h and backends/philox.h; semantics as the reference).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); element
// ranges (whole Philox groups of 8 elements) are spread over the host thread
// pool, so the mask is the same for any thread count.
//
// dropout_fwd, per block of kBlock elements:
//  1. the keep mask, vectorised Philox-4x32-10: each u64 lane runs one
//     counter (one group of 8 elements, a 16-bit half of its words each) in
//     its low half, so one MulEven is a lane's full 32x32 -> 64 product (hi =
//     product >> 32, lo = the low half as is); 4 x Lanes(u64) groups per
//     step (then 2), four ten-round chains interleaved to hide their
//     latency, their words gathered into u32 lanes (ConcatEven), both halves of
//     each compared, the keep bytes of halves 0-3 and 4-7 of a group packed
//     into two u32 (little-endian: byte k is element 8g + k) and stored
//     interleaved straight into the mask tensor (on AVX2: each counter's
//     words side by side, their u16 halves compared and packed to bytes,
//     MaskGroupsVector); two chains on AVX2 and SSE4 (16 registers);
//  2. output = x * (mask ? 1 / (1 - p) : 0) in fp32, reading the mask back
//     from L1 (x * 0 keeps IEEE: a dropped NaN or inf gives NaN); bf16 in
//     and out in activation.cpp's pair order (ApplyT).
// dropout_bwd is step 2 alone with the given mask (nonzero = kept).
// A vector whose groups would carry into the counter's high word (g crossing
// a multiple of 2^32) and the last partial group use the scalar Philox.
//
// Where the CPU has AVX512-F/BW/DQ/VL and BMI2 (PortablePath::kDropoutAvx512,
// TEFL_PORTABLE_DROPOUT_AVX512=0 turns it off) dropout_fwd instead runs one
// fused pass of 128 elements a step (DropoutFwdAvx512 below): Philox, the
// keep bits as two 64-bit masks, the mask bytes and the output from them;
// same bytes as the path above. Outputs of >= 32 MiB are stored
// non-temporally there; bf16 outputs are rounded by vcvtne2ps2bf16 where the
// CPU has AVX512-BF16 (PortablePath::kBf16Cvt, TEFL_PORTABLE_BF16_CVT=0 off).
//
// Host contract (validated before the call): CPU tensors, compact, float
// dtypes for the data (each on its own), uint8 masks, same shapes, no
// aliasing, p in [0, 1).
#include <hwy/cache_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <type_traits>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "backends/philox.h"
#include "backends/portable/cpu_paths.h"
#include "backends/portable/dropout_hooks.h"
#include "core/dtype.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

#ifndef TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_
#define TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_
namespace tefl::backends {
namespace {

struct DropArgs {
  bool generate;  // dropout_fwd: write the mask first
  DType tx, ty;
  int64_t n;
  uint64_t seed, offset;
  uint32_t threshold16;  // DropoutThreshold16(p)
  float scale;           // 1 / (1 - p)
  const void* x;
  void* y;
  uint8_t* mask;    // written (fwd) or read (bwd)
  bool avx512;      // dropout_fwd by DropoutFwdAvx512 (PortablePath::kDropoutAvx512)
  bool native;      // DropoutFwdAvx512: bf16 y rounded by vcvtne2ps2bf16 (PortablePath::kBf16Cvt)
  uint64_t group0;  // DropoutFwdAvx512: element i is in Philox group group0 + i / 8 (0 but in tests)
};

// Elements per block: the mask block and its x / y rows stay in L1.
constexpr int64_t kBlock = 4096;

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/dropout.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/simd_io-inl.h"

#if HWY_ONCE && defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Scalar: mask bytes of elements [8g, 8g + count), count <= 8.
HWY_INLINE void MaskGroupScalar(const DropArgs& a, uint64_t g, uint8_t* out, int64_t count) {
  const Philox4 w = DropoutWords(a.seed, a.offset, g);
  for (int64_t k = 0; k < count; ++k) out[k] = DropoutKept(w, uint64_t(k), a.threshold16) ? 1 : 0;
}

#if HWY_TARGET != HWY_SCALAR
// The broadcast round keys and constants of one call (hoisted out of the
// per-vector loop). Counters live in u64 lanes, one per lane in the low half:
// MulEven reads only those halves, so the high halves may hold garbage.
struct PhiloxConsts {
  hn::Vec<hn::ScalableTag<uint64_t>> k0[10], k1[10], m0, m1, c2, c3;
  hn::Vec<hn::ScalableTag<uint32_t>> thr, half, one;
  // MaskGroupsVector's AVX2 branch: threshold16 ^ 0x8000 in every u16 lane,
  // usable when threshold16 < 2^16 (`packed16`).
  hn::Vec<hn::ScalableTag<uint16_t>> thr16;
  bool packed16;
};

HWY_INLINE void InitConsts(const DropArgs& a, PhiloxConsts& c) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::ScalableTag<uint32_t> du;
  uint32_t k0 = uint32_t(a.seed), k1 = uint32_t(a.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    c.k0[r] = hn::Set(d64, k0);
    c.k1[r] = hn::Set(d64, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  c.m0 = hn::Set(d64, kPhiloxM0);
  c.m1 = hn::Set(d64, kPhiloxM1);
  c.c2 = hn::Set(d64, uint32_t(a.offset));
  c.c3 = hn::Set(d64, uint32_t(a.offset >> 32));
  // kept = half >= threshold16, a signed compare (both below 2^31).
  c.thr = hn::Set(du, a.threshold16);
  c.half = hn::Set(du, 0xFFFFu);
  c.one = hn::Set(du, 1u);
  c.packed16 = a.threshold16 <= 0xFFFFu;
  c.thr16 = hn::Set(hn::ScalableTag<uint16_t>(), uint16_t(a.threshold16 ^ 0x8000u));
}

// Ten rounds on kN vectors of Lanes(u64) counters each (c0[i] = lo32(g) per
// lane, c1 = hi32(g), shared); the low halves of w[i][0..3] are the four
// words. The kN chains are independent and interleaved round by round: one
// chain is a 10-round dependency (~60 cycles of vpmuludq + shift + xor
// latency on AVX2), so two or more hide each other's latency.
template <int kN>
HWY_INLINE void PhiloxRounds(const PhiloxConsts& k, const hn::Vec<hn::ScalableTag<uint64_t>>* c0in,
                             hn::Vec<hn::ScalableTag<uint64_t>> c1in, hn::Vec<hn::ScalableTag<uint64_t>> (*w)[4]) {
  const hn::ScalableTag<uint32_t> du;
  hn::Vec<hn::ScalableTag<uint64_t>> c0[kN], c1[kN], c2[kN], c3[kN];
  _Pragma("GCC unroll 4") for (int i = 0; i < kN; ++i) {
    c0[i] = c0in[i];
    c1[i] = c1in;
    c2[i] = k.c2;
    c3[i] = k.c3;
  }
  // Unrolled: the keys are memory operands and no register copies remain.
  _Pragma("GCC unroll 10") for (int r = 0; r < 10; ++r) {
    _Pragma("GCC unroll 4") for (int i = 0; i < kN; ++i) {
      const auto p0 = hn::MulEven(hn::BitCast(du, c0[i]), hn::BitCast(du, k.m0));
      const auto p1 = hn::MulEven(hn::BitCast(du, c2[i]), hn::BitCast(du, k.m1));
      c0[i] = hn::Xor3(hn::ShiftRight<32>(p1), c1[i], k.k0[r]);
      c1[i] = p1;
      c2[i] = hn::Xor3(hn::ShiftRight<32>(p0), c3[i], k.k1[r]);
      c3[i] = p0;
    }
  }
  _Pragma("GCC unroll 4") for (int i = 0; i < kN; ++i) {
    w[i][0] = c0[i];
    w[i][1] = c1[i];
    w[i][2] = c2[i];
    w[i][3] = c3[i];
  }
}

// Mask bytes of groups [g, g + kPairs Lanes(u32)) (8 bytes each) into out:
// per pair two u64 vectors of counters, their words gathered into u32
// vectors.
template <int kPairs>
HWY_INLINE void MaskGroupsVector(const PhiloxConsts& k, uint64_t g, uint8_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const size_t n64 = hn::Lanes(d64);
  const auto hi = hn::Set(d64, g >> 32);
  const auto lo = hn::Add(hn::Set(d64, uint32_t(g)), hn::Iota(d64, 0));  // no carry (checked by the caller)
  hn::Vec<decltype(d64)> c0[2 * kPairs], w[2 * kPairs][4];
  _Pragma("GCC unroll 4") for (int i = 0; i < 2 * kPairs; ++i) c0[i] = hn::Add(lo, hn::Set(d64, uint64_t(i) * n64));
  PhiloxRounds<2 * kPairs>(k, c0, hi, w);
#if HWY_TARGET == HWY_AVX2
  if (k.packed16) {
    // Per chain (4 counters, 32 elements): each counter's four words side by
    // side in memory order, so its eight 16-bit halves are elements 8g + 0..7
    // in order; the halves compared as u16 (signed compare after ^ 0x8000)
    // and packed to bytes, 12 operations per 32 mask bytes.
    const __m256i thr16 = k.thr16.raw, sign16 = _mm256_set1_epi16(int16_t(0x8000)), one8 = _mm256_set1_epi8(1);
    _Pragma("GCC unroll 4") for (int i = 0; i < 2 * kPairs; ++i) {
      const __m256i t01 = _mm256_blend_epi32(w[i][0].raw, _mm256_slli_epi64(w[i][1].raw, 32), 0xAA);
      const __m256i t23 = _mm256_blend_epi32(w[i][2].raw, _mm256_slli_epi64(w[i][3].raw, 32), 0xAA);
      const __m256i c02 = _mm256_unpacklo_epi64(t01, t23);  // counters 0 | 2, words 0-3 each
      const __m256i c13 = _mm256_unpackhi_epi64(t01, t23);  // counters 1 | 3
      // dropped: half < threshold16, i.e. -1 in that lane; kept 0.
      const __m256i d02 = _mm256_cmpgt_epi16(thr16, _mm256_xor_si256(c02, sign16));
      const __m256i d13 = _mm256_cmpgt_epi16(thr16, _mm256_xor_si256(c13, sign16));
      // packs per 128-bit half: counters 0, 1 | 2, 3, i.e. memory order; -1 + 1 = 0, 0 + 1 = 1.
      const __m256i keep = _mm256_add_epi8(_mm256_packs_epi16(d02, d13), one8);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + size_t(i) * 32), keep);
    }
    return;
  }
#endif
  const auto thr = hn::BitCast(di, k.thr);
  const auto kept = [&](hn::Vec<decltype(du)> half) HWY_ATTR {
    return hn::IfThenZeroElse(hn::RebindMask(du, hn::Lt(hn::BitCast(di, half), thr)), k.one);
  };
  _Pragma("GCC unroll 2") for (int j = 0; j < kPairs; ++j) {
    // Keep bytes of halves 2i (low) and 2i + 1 (high) of word i, as bytes 0, 1 of a u32 lane.
    const auto pair = [&](int i) HWY_ATTR {
      const auto v = hn::ConcatEven(du, hn::BitCast(du, w[2 * j + 1][i]), hn::BitCast(du, w[2 * j][i]));
      return hn::Or(kept(hn::And(v, k.half)), hn::ShiftLeft<8>(kept(hn::ShiftRight<16>(v))));
    };
    const auto bytes03 = hn::Or(pair(0), hn::ShiftLeft<16>(pair(1)));  // elements 8g + 0..3
    const auto bytes47 = hn::Or(pair(2), hn::ShiftLeft<16>(pair(3)));  // elements 8g + 4..7
    hn::StoreInterleaved2(bytes03, bytes47, du, reinterpret_cast<uint32_t*>(out + size_t(j) * hn::Lanes(du) * 8));
  }
}
#endif

// Two pairs of chains a step (four chains) where 32 vector registers hold
// them; AVX2 and SSE4 have 16, and four chains' 16 words spill there.
constexpr bool kTwoPairs = HWY_TARGET != HWY_AVX2 && HWY_TARGET != HWY_SSE4;

// Mask bytes of elements [e0, e1); e0 is a multiple of 8.
HWY_INLINE void MaskRange(const DropArgs& a, int64_t e0, int64_t e1) {
  uint64_t g = uint64_t(e0) / 8;
  const uint64_t full_end = uint64_t(e1) / 8;  // groups wholly inside
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<uint32_t> du;
  const size_t lanes = hn::Lanes(du);
  if (g + lanes <= full_end) {
    PhiloxConsts k;
    InitConsts(a, k);
    // Two pairs of chains a step (MaskGroupsVector<2>), then one.
    while (kTwoPairs && g + 2 * lanes <= full_end && uint32_t(g) <= UINT32_MAX - uint32_t(2 * lanes - 1)) {
      MaskGroupsVector<2>(k, g, a.mask + g * 8);
      g += 2 * lanes;
    }
    while (g + lanes <= full_end) {
      if (uint32_t(g) > UINT32_MAX - uint32_t(lanes - 1)) break;  // lo32 would wrap: scalar
      MaskGroupsVector<1>(k, g, a.mask + g * 8);
      g += lanes;
    }
  }
#endif
  for (; g < full_end; ++g) MaskGroupScalar(a, g, a.mask + g * 8, 8);
  if (int64_t(g * 8) < e1) MaskGroupScalar(a, g, a.mask + g * 8, e1 - int64_t(g * 8));
}

// y = x * (mask ? scale : 0) on [e0, e1).
template <class TX, class TY>
HWY_INLINE void ApplyT(const DropArgs& a, int64_t e0, int64_t e1) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const hn::Rebind<uint32_t, decltype(df)> du;
  const size_t nf = hn::Lanes(df);
  const TX* HWY_RESTRICT x = static_cast<const TX*>(a.x);
  TY* HWY_RESTRICT y = static_cast<TY*>(a.y);
  const uint8_t* HWY_RESTRICT m = a.mask;
  const auto vscale = hn::Set(df, a.scale);
  const auto mult = [&](size_t i) HWY_ATTR {
    return hn::IfThenElseZero(hn::RebindMask(df, hn::Ne(hn::PromoteTo(du, hn::LoadU(d8, m + i)), hn::Zero(du))),
                              vscale);
  };
  size_t i = size_t(e0);
  const size_t end = size_t(e1);
  // x and the mask ahead (simd_io-inl.h; docs/perf-softmax.md, session 26).
  const auto prefetch = [&](size_t at) HWY_ATTR {
    PrefetchAhead(x + at);
    PrefetchAhead(m + at);
  };
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<TX, bfloat16_t> && std::is_same_v<TY, bfloat16_t>) {
    // bf16 in and out in pair order (activation.cpp's): one u32 load of 2 nf
    // values gives the even elements (bits << 16) and the odd ones (bits &
    // 0xFFFF0000) as fp32 with no widening shuffle; the mask's 2 nf bytes,
    // widened as u16 pairs, give the even (low byte) and odd (high byte)
    // lanes' keep; the rounded upper halves are packed back by shift, and, or.
    // Rounded to nearest even; every NaN here comes from bf16 data or is the
    // default NaN (x * 0 of inf), so RoundBF16HiFromBF16Data needs no select.
    const hn::RebindToUnsigned<decltype(df)> du32;
    const hn::Rebind<uint16_t, decltype(df)> dh;
    const hn::Repartition<uint8_t, decltype(dh)> d8p;
    const auto hi16 = hn::Set(du32, 0xFFFF0000u);
    const auto* HWY_RESTRICT x32 = reinterpret_cast<const uint32_t*>(x);
    auto* HWY_RESTRICT y32 = reinterpret_cast<uint32_t*>(y);
    for (; i + 2 * nf <= end; i += 2 * nf) {
      prefetch(i);
      const auto w = hn::LoadU(du32, x32 + i / 2);
      const auto mw = hn::PromoteTo(du32, hn::BitCast(dh, hn::LoadU(d8p, m + i)));
      const auto ke = hn::RebindMask(df, hn::Ne(hn::And(mw, hn::Set(du32, 0xFFu)), hn::Zero(du32)));
      const auto ko = hn::RebindMask(df, hn::Ne(hn::And(mw, hn::Set(du32, 0xFF00u)), hn::Zero(du32)));
      const auto ev = hn::Mul(hn::BitCast(df, hn::ShiftLeft<16>(w)), hn::IfThenElseZero(ke, vscale));
      const auto od = hn::Mul(hn::BitCast(df, hn::And(w, hi16)), hn::IfThenElseZero(ko, vscale));
      hn::StoreU(
          hn::Or(hn::ShiftRight<16>(RoundBF16HiFromBF16Data(ev, df)), hn::And(RoundBF16HiFromBF16Data(od, df), hi16)),
          du32, y32 + i / 2);
    }
  }
  if constexpr (std::is_same_v<TY, bfloat16_t>) {
    const hn::Repartition<uint16_t, decltype(df)> du16;
    uint16_t* HWY_RESTRICT yu = reinterpret_cast<uint16_t*>(y);
    for (; i + 2 * nf <= end; i += 2 * nf) {
      prefetch(i);
      const auto v0 = hn::Mul(LoadF(df, x + i), mult(i));
      const auto v1 = hn::Mul(LoadF(df, x + i + nf), mult(i + nf));
      StoreF(RoundToBF16Bits2(v0, v1, df), du16, yu + i);
    }
  }
#endif
  for (; i + nf <= end; i += nf) {
    prefetch(i);
    StoreF(hn::Mul(LoadF(df, x + i), mult(i)), df, y + i);
  }
  for (; i < end; ++i) ScalarStore(ScalarLoad(x + i) * (m[i] != 0 ? a.scale : 0.0f), y + i);
}

template <class TX>
HWY_INLINE void ApplyX(const DropArgs& a, int64_t e0, int64_t e1) {
  switch (a.ty) {
    case DType::kF32:
      return ApplyT<TX, float>(a, e0, e1);
    case DType::kBF16:
      return ApplyT<TX, bfloat16_t>(a, e0, e1);
    default:
      return ApplyT<TX, float16_t>(a, e0, e1);
  }
}

HWY_INLINE void Apply(const DropArgs& a, int64_t e0, int64_t e1) {
  switch (a.tx) {
    case DType::kF32:
      return ApplyX<float>(a, e0, e1);
    case DType::kBF16:
      return ApplyX<bfloat16_t>(a, e0, e1);
    default:
      return ApplyX<float16_t>(a, e0, e1);
  }
}

// Exported: elements [e0, e1), e0 a multiple of 8.
void DropoutRange(const DropArgs& a, int64_t e0, int64_t e1) {
  for (int64_t b = e0; b < e1; b += kBlock) {
    const int64_t be = std::min(e1, b + kBlock);
    if (a.generate) MaskRange(a, b, be);
    Apply(a, b, be);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(DropoutRange);

namespace {

// ---- dropout_fwd on AVX-512 (PortablePath::kDropoutAvx512) -----------------
// One fused pass per 128 elements (16 Philox counters, 8 elements each): the
// four words of 8 counters per zmm (u64 lanes, counter in the low half, so
// one vpmuludq is a full 32x32 -> 64 product); rounds 0-2 skip the products
// and xors that do not depend on lo32(g) (precomputed per hi32(g)); the last
// round leaves words (0, 1) and (2, 3) of a counter side by side in its u64
// lane (a rotate and a masked xor); one vpermt2q per 4 counters puts their
// words in order w0..w3, so the u16 lanes are the 16-bit halves in element
// order and one vpcmpuw gives the keep bits of 32 elements directly (no
// pdep). The mask bytes are each 64-bit mask expanded (vmovdqu8 {z}); the
// output is x * (kept ? scale : 0) with the same mask (no re-read), in fp32,
// rounded to nearest even once. Without AVX512-BF16, same-dtype bf16 splits
// a 32-element load into even / odd elements (a shift and an and) and joins
// the two rounded halves with one vpternlogd.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TEFL_DROPOUT_AVX512 1
#define TEFL_DROPOUT_TARGET __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,bmi,bmi2")))
#define TEFL_DROPOUT_INLINE TEFL_DROPOUT_TARGET inline __attribute__((always_inline))

using hwy::bfloat16_t;
using hwy::float16_t;

struct PhiloxZmm {
  __m512i m0, m1, k0[10], k1[10];  // u64 lanes, value in the low half
  uint64_t hi = ~uint64_t(0);      // hi32(g) the constants below are for
  // Rounds 0-2 with c1 = hi32(g), c2, c3 = offset and c0 = lo32(g) the only
  // varying input: c0 after round 0 (a), xor terms of rounds 0-2.
  __m512i a, x0_c2, x1_c0, x1_c2, x2_c2;
};

TEFL_DROPOUT_TARGET void InitPhiloxZmm(const DropArgs& args, PhiloxZmm& z) {
  uint32_t k0[10], k1[10];
  k0[0] = uint32_t(args.seed);
  k1[0] = uint32_t(args.seed >> 32);
  for (int r = 1; r < 10; ++r) {
    k0[r] = k0[r - 1] + kPhiloxW0;
    k1[r] = k1[r - 1] + kPhiloxW1;
  }
  for (int r = 0; r < 10; ++r) {
    z.k0[r] = _mm512_set1_epi64(int64_t(k0[r]));
    z.k1[r] = _mm512_set1_epi64(int64_t(k1[r]));
  }
  z.m0 = _mm512_set1_epi64(int64_t(kPhiloxM0));
  z.m1 = _mm512_set1_epi64(int64_t(kPhiloxM1));
}

// The constants of rounds 0-2 for counters with hi32(g) = hi.
TEFL_DROPOUT_TARGET void SetPhiloxHi(const DropArgs& args, PhiloxZmm& z, uint64_t hi) {
  const uint32_t olo = uint32_t(args.offset), ohi = uint32_t(args.offset >> 32);
  uint32_t k0 = uint32_t(args.seed), k1 = uint32_t(args.seed >> 32);
  // Round 0: p1 = M1 * olo; c0 = hi(p1) ^ hi ^ k0; c1 = p1; c2 = hi(p0) ^ ohi ^ k1; c3 = p0.
  const uint64_t p1 = uint64_t(kPhiloxM1) * olo;
  const uint32_t a = uint32_t(p1 >> 32) ^ uint32_t(hi) ^ k0;
  const uint32_t x0_c2 = ohi ^ k1;
  k0 += kPhiloxW0;
  k1 += kPhiloxW1;
  // Round 1: p0 = M0 * a; c0 = hi(p1') ^ lo(p1) ^ k0; c2 = hi(p0) ^ c3 ^ k1; c3 = p0.
  const uint64_t q0 = uint64_t(kPhiloxM0) * a;
  const uint32_t x1_c0 = uint32_t(p1) ^ k0;
  const uint32_t x1_c2 = uint32_t(q0 >> 32) ^ k1;
  k1 += kPhiloxW1;
  // Round 2: c2 = hi(p0'') ^ lo(q0) ^ k1.
  const uint32_t x2_c2 = uint32_t(q0) ^ k1;
  z.a = _mm512_set1_epi64(int64_t(a));
  z.x0_c2 = _mm512_set1_epi64(int64_t(x0_c2));
  z.x1_c0 = _mm512_set1_epi64(int64_t(x1_c0));
  z.x1_c2 = _mm512_set1_epi64(int64_t(x1_c2));
  z.x2_c2 = _mm512_set1_epi64(int64_t(x2_c2));
  z.hi = hi;
}

// The high half of each u64 lane's product moved to the low half, the low
// half to the high half (vpshufd, the shuffle port, where a vpsrlq would take
// the multiplier's port 0). The round state keeps such a stray high half in
// every lane: vpmuludq reads the low halves only, and round 9 merges the low
// halves alone (masked xor), so no stray bit reaches the words.
TEFL_DROPOUT_INLINE __m512i Hi32(__m512i p) { return _mm512_shuffle_epi32(p, _MM_PERM_CDAB); }

// Ten rounds on 2 x 8 counters (lo32(g) in the u64 lanes' low halves, all
// with hi32(g) = z.hi), interleaved for the multiplier's latency; w01 / w23:
// per u64 lane, words 0 and 2 low, 1 and 3 high.
TEFL_DROPOUT_INLINE void PhiloxZmm16(const PhiloxZmm& z, const __m512i lo[2], __m512i w01[2], __m512i w23[2]) {
  __m512i c0[2], c1[2], c2[2], c3[2], p0[2], p1[2];
#pragma GCC unroll 2
  for (int v = 0; v < 2; ++v) {
    // Round 0 (c0 after it is the constant a).
    p0[v] = _mm512_mul_epu32(lo[v], z.m0);
    c2[v] = _mm512_xor_si512(Hi32(p0[v]), z.x0_c2);
    c3[v] = p0[v];
    // Round 1 (c1 is round 0's constant p1, folded into x1_c0; p0 the constant q0).
    p1[v] = _mm512_mul_epu32(c2[v], z.m1);
    c0[v] = _mm512_xor_si512(Hi32(p1[v]), z.x1_c0);
    c1[v] = p1[v];
    c2[v] = _mm512_xor_si512(c3[v], z.x1_c2);
    // Round 2 (c3 is q0, folded into x2_c2).
    p0[v] = _mm512_mul_epu32(c0[v], z.m0);
    p1[v] = _mm512_mul_epu32(c2[v], z.m1);
    c0[v] = _mm512_ternarylogic_epi64(Hi32(p1[v]), c1[v], z.k0[2], 0x96);
    c1[v] = p1[v];
    c2[v] = _mm512_xor_si512(Hi32(p0[v]), z.x2_c2);
    c3[v] = p0[v];
  }
#pragma GCC unroll 6
  for (int r = 3; r < 9; ++r) {
#pragma GCC unroll 2
    for (int v = 0; v < 2; ++v) {
      p0[v] = _mm512_mul_epu32(c0[v], z.m0);
      p1[v] = _mm512_mul_epu32(c2[v], z.m1);
      c0[v] = _mm512_ternarylogic_epi64(Hi32(p1[v]), c1[v], z.k0[r], 0x96);
      c1[v] = p1[v];
      c2[v] = _mm512_ternarylogic_epi64(Hi32(p0[v]), c3[v], z.k1[r], 0x96);
      c3[v] = p0[v];
    }
  }
  // Round 9: word 1 = lo(p1), word 0 = hi(p1) ^ c1 ^ k0 (Hi32 swaps the
  // halves, the masked xor touches the low halves only); 3 / 2 alike.
#pragma GCC unroll 2
  for (int v = 0; v < 2; ++v) {
    p0[v] = _mm512_mul_epu32(c0[v], z.m0);
    p1[v] = _mm512_mul_epu32(c2[v], z.m1);
    w01[v] = _mm512_mask_ternarylogic_epi32(Hi32(p1[v]), 0x5555, c1[v], z.k0[9], 0x96);
    w23[v] = _mm512_mask_ternarylogic_epi32(Hi32(p0[v]), 0x5555, c3[v], z.k1[9], 0x96);
  }
}

// Keep bits of elements [8g, 8g + 128): bit b of keep[v] = element 8g + 64v
// + b. lo holds lo32(g) + 0..7 in its u64 lanes; no lane may carry into
// hi32 (g + 15 has the same hi32 as g). thr: min(threshold16, 0xFFFF) in
// every u16 lane; allow: 0 where threshold16 = 2^16 (nothing kept), else ~0.
TEFL_DROPOUT_INLINE void KeepBits128(const PhiloxZmm& z, __m512i lo, __m512i thr, uint64_t allow, uint64_t keep[2]) {
  const __m512i los[2] = {lo, _mm512_add_epi64(lo, _mm512_set1_epi64(8))};
  __m512i w01[2], w23[2];
  PhiloxZmm16(z, los, w01, w23);
  // u64 lanes (w01[j], w23[j]) of counters 0-3 / 4-7: words w0..w3 of each in order.
  const __m512i first = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i second = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
#pragma GCC unroll 2
  for (int v = 0; v < 2; ++v) {
    const uint64_t k0 = _mm512_cmpge_epu16_mask(_mm512_permutex2var_epi64(w01[v], first, w23[v]), thr);
    const uint64_t k1 = _mm512_cmpge_epu16_mask(_mm512_permutex2var_epi64(w01[v], second, w23[v]), thr);
    keep[v] = (k0 | k1 << 32) & allow;
  }
}

// Keep bits of elements [e, e + count) (count <= 64, e a multiple of 8) by
// the scalar Philox.
inline uint64_t KeepBitsScalar(const DropArgs& args, int64_t e, int64_t count) {
  uint64_t bits = 0;
  for (int64_t i = 0; i < count; i += 8) {
    const Philox4 w = DropoutWords(args.seed, args.offset, args.group0 + uint64_t(e + i) / 8);
    for (int64_t k = 0; k < 8 && i + k < count; ++k)
      bits |= uint64_t(DropoutKept(w, uint64_t(k), args.threshold16)) << (i + k);
  }
  return bits;
}

// 16 elements as fp32 / from fp32 (bf16 and fp16 exact widening; stores round
// to nearest even, NaN quieted, as simd_io-inl.h).
TEFL_DROPOUT_INLINE __m512 Load16(const float* p) { return _mm512_loadu_ps(p); }
TEFL_DROPOUT_INLINE __m512 Load16(const bfloat16_t* p) {
  return _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}
TEFL_DROPOUT_INLINE __m512 Load16(const float16_t* p) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}
// fp32 bits with the bf16 rounded to nearest even in the upper half.
TEFL_DROPOUT_INLINE __m512i RoundBf16Hi(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_or_epi32(rounded, nan, u, _mm512_set1_epi32(0x00400000));
}

// bf16 of y = x * 0 or x * scale for a bf16 x, rounded to nearest even, in
// the upper half: RoundBf16Hi without its NaN case, as a NaN y here is a
// bf16 x's NaN (quieted by the multiply) or inf * 0 (the default NaN), both
// with zero low 16 bits, which the bias cannot carry out of.
TEFL_DROPOUT_INLINE __m512i RoundBf16HiFromBf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  return _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
}

// 32 bf16 of lo then hi, rounded to nearest even (NaN quieted), by
// vcvtne2ps2bf16 where neither has a subnormal lane: that instruction reads
// subnormals as 0, so those rare steps round by hand (RoundBf16Hi), bit for
// bit the same. Inline asm as simd_io-inl.h's Cvtne2ps2bf16: no avx512bf16
// target needed. Only where CpuHasAvx512Bf16() (DropArgs::native).
TEFL_DROPOUT_INLINE __m512i PackBf16Native(__m512 lo, __m512 hi) {
  // 0x20: subnormal; kortest: no mask moved to a general register.
  if (HWY_UNLIKELY(!_kortestz_mask16_u8(_mm512_fpclass_ps_mask(lo, 0x20), _mm512_fpclass_ps_mask(hi, 0x20)))) {
    const __m256i l = _mm512_cvtepi32_epi16(_mm512_srli_epi32(RoundBf16Hi(lo), 16));
    const __m256i h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(RoundBf16Hi(hi), 16));
    return _mm512_inserti64x4(_mm512_castsi256_si512(l), h, 1);
  }
  __m512i r;
  asm("vcvtne2ps2bf16 %2, %1, %0" : "=v"(r) : "v"(hi), "v"(lo));
  return r;
}

template <bool kStream>
TEFL_DROPOUT_INLINE void Put64(void* p, __m512i v) {
  if constexpr (kStream) {
    _mm512_stream_si512(static_cast<__m512i*>(p), v);
  } else {
    _mm512_storeu_si512(p, v);
  }
}
template <bool kStream>
TEFL_DROPOUT_INLINE void Store16(__m512 v, float* p) {
  Put64<kStream>(p, _mm512_castps_si512(v));
}
template <bool kStream, class T>
TEFL_DROPOUT_INLINE void Store16(__m512 v, T* p) {
  __m256i h;
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    h = _mm512_cvtepi32_epi16(_mm512_srli_epi32(RoundBf16Hi(v), 16));
  } else {
    h = _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  }
  if constexpr (kStream) {
    _mm256_stream_si256(reinterpret_cast<__m256i*>(p), h);
  } else {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), h);
  }
}

// Mask bytes and outputs of elements [e, e + 64) from their keep bits.
// kStream: non-temporal stores of y (y + e 64-byte aligned), 2: also of the
// mask (mask + e aligned too). kNative (bf16 y only): PackBf16Native.
// x, y and mask point at element e (the caller keeps them in registers: a
// store through the uint8_t mask could alias DropArgs, so its fields would be
// reloaded after every store).
template <class TX, class TY, int kStream, bool kNative>
TEFL_DROPOUT_INLINE void Apply64(const TX* x, TY* y, uint8_t* mask, uint64_t keep, __m512 scale) {
  Put64<kStream == 2>(mask, _mm512_maskz_mov_epi8(keep, _mm512_set1_epi8(1)));
  if constexpr (kNative) {
    static_assert(std::is_same_v<TY, bfloat16_t>);
    for (int h = 0; h < 2; ++h) {
      // x * 0 rather than a zeroing multiply: a dropped NaN stays NaN, as in
      // the other paths.
      const __m512 y0 = _mm512_mul_ps(Load16(x + 32 * h), _mm512_maskz_mov_ps(__mmask16(keep >> (32 * h)), scale));
      const __m512 y1 =
          _mm512_mul_ps(Load16(x + 32 * h + 16), _mm512_maskz_mov_ps(__mmask16(keep >> (32 * h + 16)), scale));
      Put64<(kStream > 0)>(y + 32 * h, PackBf16Native(y0, y1));
    }
  } else if constexpr (std::is_same_v<TX, bfloat16_t> && std::is_same_v<TY, bfloat16_t>) {
    const __m512i hi16 = _mm512_set1_epi32(int32_t(0xFFFF0000u));
    for (int h = 0; h < 2; ++h) {
      const __m512i v = _mm512_loadu_si512(x + 32 * h);
      const uint64_t k = keep >> (32 * h);
      const __m512 ev = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));   // elements 0, 2, ..
      const __m512 od = _mm512_castsi512_ps(_mm512_and_si512(v, hi16));  // elements 1, 3, ..
      const __m512 ye = _mm512_mul_ps(ev, _mm512_maskz_mov_ps(__mmask16(_pext_u64(k, 0x55555555ull)), scale));
      const __m512 yo = _mm512_mul_ps(od, _mm512_maskz_mov_ps(__mmask16(_pext_u64(k, 0xAAAAAAAAull)), scale));
      // even bf16 in the low halves, odd in the high halves: A | (B & C).
      Put64<(kStream > 0)>(y + 32 * h, _mm512_ternarylogic_epi32(_mm512_srli_epi32(RoundBf16HiFromBf16(ye), 16),
                                                                 RoundBf16HiFromBf16(yo), hi16, 0xF8));
    }
  } else {
    for (int q = 0; q < 4; ++q) {
      const __m512 mult = _mm512_maskz_mov_ps(__mmask16(keep >> (16 * q)), scale);
      Store16<(kStream > 0)>(_mm512_mul_ps(Load16(x + 16 * q), mult), y + 16 * q);
    }
  }
}

template <class TX, class TY, int kStream, bool kNative>
TEFL_DROPOUT_TARGET int64_t DropoutFwdAvx512Steps(const DropArgs& args, int64_t e, int64_t e1) {
  PhiloxZmm z;
  InitPhiloxZmm(args, z);
  const __m512i thr = _mm512_set1_epi16(int16_t(uint16_t(std::min<uint32_t>(args.threshold16, 0xFFFFu))));
  const uint64_t allow = args.threshold16 > 0xFFFFu ? 0 : ~uint64_t(0);
  const __m512 scale = _mm512_set1_ps(args.scale);
  const __m512i iota = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  const TX* const x = static_cast<const TX*>(args.x);
  TY* const y = static_cast<TY*>(args.y);
  uint8_t* const mask = args.mask;
  const uint64_t group0 = args.group0;
  for (; e + 128 <= e1; e += 128) {
    PrefetchAhead(x + e, 128 * sizeof(TX));  // simd_io-inl.h
    const uint64_t g = group0 + uint64_t(e) / 8;
    uint64_t keep[2];
    if (HWY_LIKELY(uint32_t(g) <= UINT32_MAX - 15)) {
      if (HWY_UNLIKELY((g >> 32) != z.hi)) SetPhiloxHi(args, z, g >> 32);
      KeepBits128(z, _mm512_add_epi64(_mm512_set1_epi64(int64_t(uint32_t(g))), iota), thr, allow, keep);
    } else {  // lo32(g) would wrap within the 16 counters
      keep[0] = KeepBitsScalar(args, e, 64);
      keep[1] = KeepBitsScalar(args, e + 64, 64);
    }
    Apply64<TX, TY, kStream, kNative>(x + e, y + e, mask + e, keep[0], scale);
    Apply64<TX, TY, kStream, kNative>(x + e + 64, y + e + 64, mask + e + 64, keep[1], scale);
  }
  if constexpr (kStream > 0) _mm_sfence();
  return e;
}

// Outputs of at least this many bytes (y and mask) are written with
// non-temporal stores: they would evict the cache anyway. On Zen 4 at
// [8192, 4096] fp32 y was ~12 % faster, bf16 y ~5 % slower (compute-bound
// there); on the Sapphire Rapids of session 27, with vcvtne2ps2bf16 and the
// shuffle-port Philox, bf16 is 1.10-1.14x faster and fp16 level
// (docs/perf-softmax.md), so every output dtype streams.
constexpr int64_t kStreamBytes = int64_t(32) << 20;

// Elements [b, end) (b a multiple of 8) by the scalar Philox.
template <class TX, class TY>
void DropoutFwdScalar(const DropArgs& args, int64_t b, int64_t end) {
  const TX* x = static_cast<const TX*>(args.x);
  TY* y = static_cast<TY*>(args.y);
  for (int64_t e = b; e < end; e += 64) {
    const int64_t n = std::min<int64_t>(64, end - e);
    const uint64_t keep = KeepBitsScalar(args, e, n);
    for (int64_t i = e; i < e + n; ++i) {
      const bool kept = (keep >> (i - e)) & 1;
      args.mask[i] = kept ? 1 : 0;
      ScalarStore(ScalarLoad(x + i) * (kept ? args.scale : 0.0f), y + i);
    }
  }
}

// Elements [e0, e1): full steps by DropoutFwdAvx512Steps, with non-temporal
// stores where `stream` and y (and then the mask) can be aligned.
template <class TX, class TY, bool kNative>
TEFL_DROPOUT_TARGET void DropoutFwdAvx512Run(const DropArgs& args, int64_t e0, int64_t e1, bool stream_large) {
  int64_t e = e0;
  int stream = 0;
  if (stream_large) {
    // Stream y from its first 64-byte boundary (the head, whole groups of 8,
    // by the scalar Philox); the mask too where it is then aligned as well.
    const int64_t head_bytes = int64_t(64 - reinterpret_cast<uintptr_t>(static_cast<TY*>(args.y) + e0) % 64) % 64;
    if (head_bytes % int64_t(8 * sizeof(TY)) == 0) {
      const int64_t head = std::min(head_bytes / int64_t(sizeof(TY)), e1 - e0);
      DropoutFwdScalar<TX, TY>(args, e0, e0 + head);
      e = e0 + head;
      stream = reinterpret_cast<uintptr_t>(args.mask + e) % 64 == 0 ? 2 : 1;
    }
  }
  switch (stream) {
    case 2:
      e = DropoutFwdAvx512Steps<TX, TY, 2, kNative>(args, e, e1);
      break;
    case 1:
      e = DropoutFwdAvx512Steps<TX, TY, 1, kNative>(args, e, e1);
      break;
    default:
      e = DropoutFwdAvx512Steps<TX, TY, 0, kNative>(args, e, e1);
  }
  DropoutFwdScalar<TX, TY>(args, e, e1);  // the last < 128 elements
}

template <class TX, class TY>
void DropoutFwdAvx512T(const DropArgs& args, int64_t e0, int64_t e1) {
  const bool large = args.n * int64_t(sizeof(TY) + 1) >= kStreamBytes;
  if constexpr (std::is_same_v<TY, bfloat16_t>) {
    if (args.native) return DropoutFwdAvx512Run<TX, TY, true>(args, e0, e1, large);
  }
  DropoutFwdAvx512Run<TX, TY, false>(args, e0, e1, large);
}

template <class TX>
void DropoutFwdAvx512X(const DropArgs& args, int64_t e0, int64_t e1) {
  switch (args.ty) {
    case DType::kF32:
      return DropoutFwdAvx512T<TX, float>(args, e0, e1);
    case DType::kBF16:
      return DropoutFwdAvx512T<TX, bfloat16_t>(args, e0, e1);
    default:
      return DropoutFwdAvx512T<TX, float16_t>(args, e0, e1);
  }
}

// dropout_fwd of elements [e0, e1), e0 a multiple of 8.
void DropoutFwdAvx512(const DropArgs& args, int64_t e0, int64_t e1) {
  switch (args.tx) {
    case DType::kF32:
      return DropoutFwdAvx512X<float>(args, e0, e1);
    case DType::kBF16:
      return DropoutFwdAvx512X<bfloat16_t>(args, e0, e1);
    default:
      return DropoutFwdAvx512X<float16_t>(args, e0, e1);
  }
}
#else
#define TEFL_DROPOUT_AVX512 0
#endif

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "dropout", code, what);
}

void Body(void* ctx, int64_t begin, int64_t end) {
  const DropArgs& a = *static_cast<const DropArgs*>(ctx);
  // Work items are groups of 8 elements.
#if TEFL_DROPOUT_AVX512
  if (a.avx512) return DropoutFwdAvx512(a, begin * 8, std::min(a.n, end * 8));
#endif
  HWY_DYNAMIC_DISPATCH(DropoutRange)(a, begin * 8, std::min(a.n, end * 8));
}

tefl_status* Run(const tefl_call_frame* f, bool fwd) {
  try {
    const auto& attrs = *static_cast<const tefl_dropout_attrs*>(f->attrs);
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    const DLTensor* m = fwd ? f->outputs[1] : f->inputs[1];
    DropArgs a{};
    a.generate = fwd;
    a.tx = DTypeOf(x->dtype);
    a.ty = DTypeOf(y->dtype);
    if (!IsFloatType(a.tx) || !IsFloatType(a.ty) || DTypeOf(m->dtype) != DType::kU8)
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16 data and a uint8 mask");
    if (!(attrs.p >= 0.0f && attrs.p < 1.0f)) return Status(f, TEFL_INVALID_ARGUMENT, "p must be in [0, 1)");
    a.n = NumElements(x);
    if (a.n == 0) return nullptr;
    a.seed = attrs.seed;
    a.offset = attrs.offset;
    a.threshold16 = DropoutThreshold16(attrs.p);
    a.scale = float(1.0 / (1.0 - double(attrs.p)));
    a.x = DataPtr(x);
    a.y = DataPtr(y);
    a.mask = static_cast<uint8_t*>(DataPtr(m));
    a.avx512 = fwd && TEFL_DROPOUT_AVX512 && PortablePathOn(PortablePath::kDropoutAvx512);
    a.native = a.avx512 && a.ty == DType::kBF16 && PortablePathOn(PortablePath::kBf16Cvt);
    const int64_t groups = (a.n + 7) / 8;
    f->host->parallel_for(groups, kBlock / 8, Body, &a);
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* FwdKernel(const tefl_call_frame* f, void*) { return Run(f, true); }
tefl_status* BwdKernel(const tefl_call_frame* f, void*) { return Run(f, false); }

}  // namespace

bool PortableDropoutFwdAtGroup(DType tx, DType ty, int64_t n, uint64_t first_group, uint64_t seed, uint64_t offset,
                               float p, const void* x, void* y, uint8_t* mask) {
#if TEFL_DROPOUT_AVX512
  if (!PortablePathOn(PortablePath::kDropoutAvx512)) return false;
  DropArgs a{};
  a.generate = true;
  a.tx = tx;
  a.ty = ty;
  a.n = n;
  a.seed = seed;
  a.offset = offset;
  a.threshold16 = DropoutThreshold16(p);
  a.scale = float(1.0 / (1.0 - double(p)));
  a.x = x;
  a.y = y;
  a.mask = mask;
  a.avx512 = true;
  a.native = ty == DType::kBF16 && PortablePathOn(PortablePath::kBf16Cvt);
  a.group0 = first_group;
  DropoutFwdAvx512(a, 0, n);
  return true;
#else
  (void)tx, (void)ty, (void)n, (void)first_group, (void)seed, (void)offset, (void)p, (void)x, (void)y, (void)mask;
  return false;
#endif
}

tefl_status* RegisterPortableDropout(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {{"dropout_fwd", FwdKernel}, {"dropout_bwd", BwdKernel}};
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
