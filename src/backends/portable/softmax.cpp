// default.portable softmax kernels: the scaled, masked, upper-triangular and
// aligned causal softmax forward ops and their backward (maths in
// spec/ops.md, "Softmax"; semantics of masks, empty rows and non-finite
// scores as in the reference, src/backends/reference/softmax.cpp).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); rows are
// spread over the host thread pool.
//
// Forward, per row (one read of x from memory, the rest in L1):
//  1. s = scale * x (or -10000 where the mask is 1) into an fp32 scratch row,
//     with the running max; columns [kept, round_up(kept, lanes)) are padded
//     with -inf;
//  2. s = exp(s - max) in place (ExpTaylor below: <= ~2 ulp, 0 for -inf, NaN
//     for NaN; for bf16 outputs under TEFL_PORTABLE_BF16_FAST_ACT, on by
//     default, fast_exp-inl.h's degree-3 ExpNonPositive: 7.5e-5 relative),
//     summed in fp32 over two accumulators, while the
//     next row is prefetched;
//  3. y = s * (1 / sum) for j < kept, 0 after; stored, or streamed with
//     non-temporal stores for large aligned outputs.
// bf16 outputs with the degree-3 exp (the fast path) fuse differently: pass
// 1 takes only the max, pass 2 recomputes each score from x ((x * scale)
// - max, the score rounded first) and stores its exp into s: one scratch round trip less per
// element, which set the pace (bf16 [4, 16, 2048, 2048]: 41-46 -> 33-34 ms).
// On AVX-512 that path's scores are in log2 units (scale and -10000 times
// log2(e)) and the exp is fast_exp-inl.h's Exp2Reduced.
// Non-finite scores need no special case: a NaN score, a +inf score (inf -
// inf) or a row of only -inf (-inf - -inf) puts a NaN into the sum, so the
// kept columns are NaN, as in the reference. A row with no kept column
// (fully masked; aligned causal with sq > sk) is 0.
//
// Backward: dx = scale * y * (dy - sum(dy * y)), the sum in fp32 over four
// accumulators; rows where dy, y and dx share one dtype run templated on it,
// mixed dtypes go through fp32 copies of the row. dx may be exactly dy (in
// place): the sum is taken before dx is written, and each vector of dy is
// loaded before dx at the same index is stored.
//
// Host contract (validated before the call): CPU tensors, compact row-major,
// element-aligned data, fp32/fp16/bf16 (each tensor on its own), shapes as
// the schema says, no aliasing except input_grads exactly over output_grads.
#include <hwy/cache_control.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <new>
#include <type_traits>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_SOFTMAX_SHARED_
#define TEFL_BACKENDS_PORTABLE_SOFTMAX_SHARED_
namespace tefl::backends {
namespace {

enum SoftmaxKind : int { kPlain = 0, kMasked = 1, kUpperTriang = 2, kAlignedCausal = 3 };

struct SmFwdArgs {
  int kind;
  DType tx, ty;
  int64_t sq, sk, heads;
  float scale;
  const void* x;
  void* y;
  const uint8_t* mask;  // kMasked only
  bool mask_broadcast;  // mask [1, 1, sq, sk]
  bool stream;          // non-temporal y stores (large outputs, aligned rows)
  bool native;          // bf16 y rounded by vcvtne2ps2bf16 (simd_io-inl.h)
  bool fast;            // bf16 y: the degree-3 exp (PortablePath::kBf16FastAct)
};

struct SmBwdArgs {
  DType tdy, ty, tdx;
  int64_t sk;
  float scale;
  const void* dy;
  const void* y;
  void* dx;  // may be dy
  bool stream;
  bool native;  // bf16 dx rounded by vcvtne2ps2bf16 (simd_io-inl.h)
};

// Columns [0, kept) of row r are scored; the rest of the row is 0.
inline int64_t KeptColumns(const SmFwdArgs& a, int64_t r) {
  const int64_t i = r % a.sq;
  switch (a.kind) {
    case kUpperTriang:
      return std::min(a.sk, i + 1);
    case kAlignedCausal:
      return std::clamp<int64_t>(i + a.sk - a.sq + 1, 0, a.sk);
    default:
      return a.sk;
  }
}

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_SOFTMAX_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/softmax.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/fast_exp-inl.h"
#include "backends/portable/simd_io-inl.h"

// ---- Per-target kernels ------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- Forward pass 1: scores and their max ----------------------------------
// No NaN bookkeeping: a NaN score (or inf - inf below) reaches ExpTaylor,
// which propagates it into the sum, and so into every kept column.

// v where the mask byte at m + at is 0, masked where it is not.
template <bool kHasMask>
HWY_INLINE auto MaskSelect(const uint8_t* HWY_RESTRICT m, size_t at, hn::Vec<hn::ScalableTag<float>> masked,
                           hn::Vec<hn::ScalableTag<float>> v) {
  if constexpr (kHasMask) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    // vptestmb: the 16 mask bytes straight into a lane mask.
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(m + at));
    return decltype(v){_mm512_mask_blend_ps(_mm_test_epi8_mask(b, b), v.raw, masked.raw)};
#endif
    const hn::ScalableTag<float> df;
    const hn::Rebind<uint8_t, decltype(df)> d8;
    const hn::Rebind<uint32_t, decltype(df)> du;
    const auto mk = hn::Ne(hn::PromoteTo(du, hn::LoadU(d8, m + at)), hn::Zero(du));
    return hn::IfThenElse(hn::RebindMask(df, mk), masked, v);
  } else {
    (void)m;
    (void)at;
    (void)masked;
    return v;
  }
}

// Scores x * scale (masked where the mask is set) and their max. kStore:
// into s, padded to whole vectors with -inf (exp gives 0 there); without it
// (FastRow's pass 1) only the max.
template <bool kHasMask, bool kStore, class TX>
HWY_INLINE float ScoreRow(const TX* HWY_RESTRICT x, const uint8_t* HWY_RESTRICT m, size_t kept, float scale,
                          float masked, float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const auto vscale = hn::Set(df, scale);
  const auto vmasked = hn::Set(df, masked);
  auto vmax = hn::Set(df, -std::numeric_limits<float>::infinity());
  auto vmax2 = vmax;
  size_t j = 0;
  const auto score = [&](size_t at) HWY_ATTR {
    const auto v = hn::Mul(LoadF(df, x + at), vscale);
    return MaskSelect<kHasMask>(m, at, vmasked, v);
  };
  for (; j + 2 * nf <= kept; j += 2 * nf) {
    const auto v0 = score(j), v1 = score(j + nf);
    if constexpr (kStore) {
      hn::StoreU(v0, df, s + j);
      hn::StoreU(v1, df, s + j + nf);
    }
    vmax = hn::Max(vmax, v0);
    vmax2 = hn::Max(vmax2, v1);
  }
  for (; j + nf <= kept; j += nf) {
    const auto v0 = score(j);
    if constexpr (kStore) hn::StoreU(v0, df, s + j);
    vmax = hn::Max(vmax, v0);
  }
  float mx = hn::GetLane(hn::MaxOfLanes(df, hn::Max(vmax, vmax2)));
  for (; j < kept; ++j) {
    const float v = kHasMask && m[j] != 0 ? masked : scale * ScalarLoad(x + j);
    if constexpr (kStore) s[j] = v;
    mx = std::max(mx, v);
  }
  if constexpr (kStore) {
    const size_t padded = (kept + nf - 1) / nf * nf;
    for (; j < padded; ++j) s[j] = -std::numeric_limits<float>::infinity();
  }
  return mx;
}

// e^x for x <= 0 or NaN (x = s - max): NaN for NaN, 0 below about -87.7
// (including -inf). x = n ln2 + r with n = round(x / ln2) by the 1.5 * 2^23
// trick (n is then also the low bits of t) and one fp32 ln2 (its error, n *
// 2e-9, is far below the tolerance where e^x matters); e^r by its Taylor
// polynomial of degree kDeg (Horner) on |r| <= ln2 / 2, truncation error
// 0.347^(kDeg+1) / (kDeg+1)!: 1.3e-7 relative for kDeg 6 (fp32 outputs),
// 2.4e-6 for 5 (fp16: 0.5% of its ulp), 4.2e-5 for 4 (bf16: 1% of its ulp);
// then times 2^n built from the bits. x is first clamped to >= -88, where n
// = -127 and the 2^n bits are 0: e^x = 0 there, no compare needed. On x86
// Max(c, x) returns x when x is NaN (maxps returns its second operand), so
// NaN passes through; elsewhere (and on x86's scalar and EMU128 targets) an
// explicit select keeps it.
// Cheaper than hn::Exp (one 2^n instead of two, no float -> int conversion
// with overflow fix-ups), and NaN stays NaN (hn::Exp maps NaN to 0).
// AVX-512 targets clamp at -105 instead and scale with vscalefps, zero-masked
// below -87.3 (a NaN x is computed): e^x is 0 there as on the other targets.
// Without the mask vscalefps produced subnormal or underflowing results,
// each of which costs a microcode assist on Intel cores: fp32
// scaled_masked_softmax_forward (masked scores -10000) ran at 12 % of the
// copy bandwidth on Sapphire Rapids.
template <int kDeg, class DF, class V>
HWY_INLINE V ExpTaylor(DF df, V x) {
  const hn::RebindToSigned<DF> di;
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  const auto kLow = hn::Set(df, -105.0f);
#else
  const auto kLow = hn::Set(df, -88.0f);
#endif
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  x = hn::Max(kLow, x);  // maxps/vmaxps: x when x is NaN
#else                    // the emulated targets' Max need not keep NaN
  x = hn::IfThenElse(hn::Lt(x, kLow), kLow, x);
#endif
  const auto kMagic = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  const auto t = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), kMagic);
  const auto n = hn::Sub(t, kMagic);
  const auto r = hn::NegMulAdd(n, hn::Set(df, 0.693147180559945309f), x);
  auto p = hn::Set(df, 1.0f / 720);
  if constexpr (kDeg >= 6) p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 120));
  if constexpr (kDeg == 5) p = hn::Set(df, 1.0f / 120);
  if constexpr (kDeg >= 5) p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 24));
  if constexpr (kDeg == 4) p = hn::Set(df, 1.0f / 24);
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)di;
  const __mmask16 normal = _mm512_cmp_ps_mask(x.raw, _mm512_set1_ps(-87.3f), _CMP_NLT_UQ);  // x >= -87.3 or NaN
  return V{_mm512_maskz_scalef_ps(normal, p.raw, n.raw)};
#endif
  // t's bits are those of kMagic plus n: (n + 127) << 23 is 2^n (0 for n = -127).
  const int32_t magic_bits = 0x4B400000;
  const auto pow2n = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127 - magic_bits))));
  return hn::Mul(p, pow2n);
}

// ---- Forward pass 2: s = exp(s - max), returns the sum ---------------------
// kDeg 3 (bf16 outputs, fast path): fast_exp-inl.h's near-minimax
// ExpNonPositive<3>, relative error 7.5e-5, so each y = e_j / sum is within
// ~1.5e-4 (the sum is fp32) against bf16's half step 2^-9 = 2e-3. Its range
// handling matches ExpTaylor's: -inf (padding, masked -10000 - max far below)
// gives 0, NaN stays NaN. Other degrees: ExpTaylor.
// On AVX-512 the scores of the kDeg 3 path (FastRow) are in log2 units
// (Log2Unit) and e^(s - max) is Exp2Reduced's 2^(s - max): three operations
// fewer.
constexpr bool kExp2Scores = HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL;
template <int kDeg, class DF, class V>
HWY_INLINE V ExpRowElem(DF df, V x) {
  if constexpr (kDeg == 3) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    return Exp2Reduced<3>(df, x);
#else
    return ExpNonPositive<3>(df, x);
#endif
  } else {
    return ExpTaylor<kDeg>(df, x);
  }
}

template <int kDeg, class TX>
HWY_INLINE float ExpRow(float* HWY_RESTRICT s, size_t padded, float mx, const TX* next, size_t next_len) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const auto vmx = hn::Set(df, mx);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  size_t j = 0;
  for (; j + 2 * nf <= padded; j += 2 * nf) {
    if (j < next_len) __builtin_prefetch(next + j, 0, 2);
    if (sizeof(TX) == 4 && j + nf < next_len) __builtin_prefetch(next + j + nf, 0, 2);
    const auto e0 = ExpRowElem<kDeg>(df, hn::Sub(hn::LoadU(df, s + j), vmx));
    const auto e1 = ExpRowElem<kDeg>(df, hn::Sub(hn::LoadU(df, s + j + nf), vmx));
    hn::StoreU(e0, df, s + j);
    hn::StoreU(e1, df, s + j + nf);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  for (; j < padded; j += nf) {
    const auto e0 = ExpRowElem<kDeg>(df, hn::Sub(hn::LoadU(df, s + j), vmx));
    hn::StoreU(e0, df, s + j);
    sum0 = hn::Add(sum0, e0);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
}

// ---- Forward pass 2 of the kDeg 3 path (bf16 outputs) ----------------------
// The row of x is read twice instead of going through the scratch row twice:
// pass 1 is ScoreRow without its stores (the max only); this pass recomputes
// each score from x (in L1: just read) as (x * scale) - max, and
// stores the exp into s (fewer loads and stores per element: the scratch
// traffic, not the exp, set the pace). Masked scores and the -inf padding are
// as in ScoreRow.
template <bool kHasMask, class TX>
HWY_INLINE float ExpScores(const TX* HWY_RESTRICT x, const uint8_t* HWY_RESTRICT m, size_t kept, float scale,
                           float masked, float mx, float* HWY_RESTRICT s, const TX* next, size_t next_len) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const auto vscale = hn::Set(df, scale), vnegmx = hn::Set(df, -mx);
  const auto vmasked = hn::Set(df, masked - mx);  // masked - max, as ScoreRow's s - max
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  // The score rounded first, then minus the max (pass 1's max of the same
  // rounded scores): <= 0 exactly, 0 at the max, as ScoreRow's path and TE.
  // One FMA (x * scale - max unrounded) can exceed 0 by half an ulp of the
  // max, which overflows the exp once scores pass ~1.5e9 (NaN rows).
  const auto w = [&](size_t at) HWY_ATTR {
    return MaskSelect<kHasMask>(m, at, vmasked, hn::Add(hn::Mul(LoadF(df, x + at), vscale), vnegmx));
  };
  size_t j = 0;
  for (; j + 2 * nf <= kept; j += 2 * nf) {
    if (j < next_len) __builtin_prefetch(next + j, 0, 2);
    if (sizeof(TX) == 4 && j + nf < next_len) __builtin_prefetch(next + j + nf, 0, 2);
    const auto e0 = ExpRowElem<3>(df, w(j));
    const auto e1 = ExpRowElem<3>(df, w(j + nf));
    hn::StoreU(e0, df, s + j);
    hn::StoreU(e1, df, s + j + nf);
    sum0 = hn::Add(sum0, e0);
    sum1 = hn::Add(sum1, e1);
  }
  for (; j + nf <= kept; j += nf) {
    const auto e0 = ExpRowElem<3>(df, w(j));
    hn::StoreU(e0, df, s + j);
    sum0 = hn::Add(sum0, e0);
  }
  if (j < kept) {  // the last partial vector: scores into s, -inf padding, one vector exp
    for (size_t i = j; i < j + nf; ++i) {
      s[i] = i >= kept ? -std::numeric_limits<float>::infinity()
                       : (kHasMask && m[i] != 0 ? masked : scale * ScalarLoad(x + i)) - mx;
    }
    const auto e0 = ExpRowElem<3>(df, hn::LoadU(df, s + j));
    hn::StoreU(e0, df, s + j);
    sum0 = hn::Add(sum0, e0);
  }
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
}

// ---- Forward pass 3: y = s * inv for j < kept, 0 after ----------------------
template <bool kStream, class TY>
HWY_INLINE void WriteRow(const float* HWY_RESTRICT s, size_t kept, size_t sk, float inv, TY* HWY_RESTRICT y,
                         bool native) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const size_t padded = (kept + nf - 1) / nf * nf;  // s is exp'd (0 in the padding) below this
  const auto vinv = hn::Set(df, inv);
  // Columns >= kept are 0 even in a NaN row (inv NaN): the vector across kept
  // is masked (causal rows; kept == sk otherwise).
  const auto out = [&](size_t j) HWY_ATTR {
    if (j + nf <= kept) return hn::Mul(hn::LoadU(df, s + j), vinv);
    if (j < padded) return hn::IfThenElseZero(hn::FirstN(df, kept - j), hn::Mul(hn::LoadU(df, s + j), vinv));
    return hn::Zero(df);
  };
  size_t j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<TY, bfloat16_t>) {
    const hn::Repartition<uint16_t, decltype(df)> du16;
    uint16_t* HWY_RESTRICT yu = reinterpret_cast<uint16_t*>(y);
    // A row with a finite 1 / sum holds no NaN: round without the NaN care.
    const bool finite = std::isfinite(inv);
#if TEFL_BF16_NATIVE
    if (native) {
      for (; j + 2 * nf <= sk; j += 2 * nf) {
        const auto bits = RoundToBF16Bits2Native(out(j), out(j + nf));
        if constexpr (kStream) {
          StreamF(bits, du16, yu + j);
        } else {
          StoreF(bits, du16, yu + j);
        }
      }
    }
#endif
    const hn::RebindToUnsigned<decltype(df)> du;
    const auto round_finite = [&](auto v) HWY_ATTR {
      const auto b = hn::BitCast(du, v);
      return hn::BitCast(du16, AddBF16RoundingBias(du, b));
    };
    for (; j + 2 * nf <= sk; j += 2 * nf) {
      const auto bits = finite ? hn::ConcatOdd(du16, round_finite(out(j + nf)), round_finite(out(j)))
                               : RoundToBF16Bits2(out(j), out(j + nf), df);
      if constexpr (kStream) {
        StreamF(bits, du16, yu + j);
      } else {
        StoreF(bits, du16, yu + j);
      }
    }
  }
#endif
  for (; j + nf <= sk; j += nf) {
    if constexpr (kStream) {
      StreamF(out(j), df, y + j);
    } else {
      StoreF(out(j), df, y + j);
    }
  }
  for (; j < sk; ++j) ScalarStore(j < kept ? s[j] * inv : 0.0f, y + j);
}

template <bool kHasMask, class TX>
HWY_INLINE float ScoreRowX(const SmFwdArgs& a, int64_t r, const uint8_t* m, size_t kept, float* s) {
  return ScoreRow<kHasMask, true>(static_cast<const TX*>(a.x) + size_t(r) * size_t(a.sk), m, kept, a.scale, -10000.0f,
                                  s);
}

template <bool kHasMask>
HWY_INLINE float ScoreAny(const SmFwdArgs& a, int64_t r, const uint8_t* m, size_t kept, float* s) {
  switch (a.tx) {
    case DType::kF32:
      return ScoreRowX<kHasMask, float>(a, r, m, kept, s);
    case DType::kBF16:
      return ScoreRowX<kHasMask, bfloat16_t>(a, r, m, kept, s);
    default:
      return ScoreRowX<kHasMask, float16_t>(a, r, m, kept, s);
  }
}

template <int kDeg>
HWY_INLINE float ExpRowX(const SmFwdArgs& a, float* s, size_t padded, float mx, size_t off, size_t next_len) {
  switch (a.tx) {
    case DType::kF32:
      return ExpRow<kDeg>(s, padded, mx, static_cast<const float*>(a.x) + off, next_len);
    case DType::kBF16:
      return ExpRow<kDeg>(s, padded, mx, static_cast<const bfloat16_t*>(a.x) + off, next_len);
    default:
      return ExpRow<kDeg>(s, padded, mx, static_cast<const float16_t*>(a.x) + off, next_len);
  }
}

// The three-pass path: kDeg 6 / 5 / 4 for fp32 / fp16 / bf16 outputs (the
// degree-3 path is FastRow).
HWY_INLINE float ExpAny(const SmFwdArgs& a, int64_t r, int64_t r1, float* s, size_t padded, float mx) {
  // The next row of this chunk (this row again for the last) is prefetched.
  const int64_t nr = r + 1 < r1 ? r + 1 : r;
  const size_t next_len = size_t(KeptColumns(a, nr));
  const size_t off = size_t(nr) * size_t(a.sk);
  switch (a.ty) {  // the polynomial degree follows the output's precision
    case DType::kF32:
      return ExpRowX<6>(a, s, padded, mx, off, next_len);
    case DType::kF16:
      return ExpRowX<5>(a, s, padded, mx, off, next_len);
    default:
      return ExpRowX<4>(a, s, padded, mx, off, next_len);
  }
}

template <bool kStream>
HWY_INLINE void WriteAny(const SmFwdArgs& a, int64_t r, const float* s, size_t kept, float inv) {
  const size_t sk = size_t(a.sk), off = size_t(r) * sk;
  switch (a.ty) {
    case DType::kF32:
      return WriteRow<kStream>(s, kept, sk, inv, static_cast<float*>(a.y) + off, false);
    case DType::kBF16:
      return WriteRow<kStream>(s, kept, sk, inv, static_cast<bfloat16_t*>(a.y) + off, a.native);
    default:
      return WriteRow<kStream>(s, kept, sk, inv, static_cast<float16_t*>(a.y) + off, false);
  }
}

// Scores in log2 units (scale and the masked -10000 times log2(e), one
// rounding each) when pass 2 is Exp2Reduced: the kDeg 3 path on AVX-512, if
// scale * log2(e) stays finite where scale is.
HWY_INLINE float Log2Unit(const SmFwdArgs& a) {
  constexpr float kLog2e = 1.44269504088896341f;
  const bool deg3 = a.ty == DType::kBF16 && a.fast;
  return kExp2Scores && deg3 && std::isfinite(a.scale * kLog2e) == std::isfinite(a.scale) ? kLog2e : 1.0f;
}

// Passes 1 and 2 of the kDeg 3 path for row r; returns the sum.
template <bool kHasMask, class TX>
HWY_INLINE float FastRowX(const SmFwdArgs& a, int64_t r, int64_t r1, const uint8_t* m, size_t kept, float unit,
                          float* s) {
  const size_t sk = size_t(a.sk);
  const TX* x = static_cast<const TX*>(a.x) + size_t(r) * sk;
  const float scale = a.scale * unit, masked = -10000.0f * unit;
  const float mx = ScoreRow<kHasMask, false>(x, m, kept, scale, masked, nullptr);
  const int64_t nr = r + 1 < r1 ? r + 1 : r;  // the next row of the chunk is prefetched
  return ExpScores<kHasMask>(x, m, kept, scale, masked, mx, s, static_cast<const TX*>(a.x) + size_t(nr) * sk,
                             size_t(KeptColumns(a, nr)));
}
template <bool kHasMask>
HWY_INLINE float FastRow(const SmFwdArgs& a, int64_t r, int64_t r1, const uint8_t* m, size_t kept, float unit,
                         float* s) {
  switch (a.tx) {
    case DType::kF32:
      return FastRowX<kHasMask, float>(a, r, r1, m, kept, unit, s);
    case DType::kBF16:
      return FastRowX<kHasMask, bfloat16_t>(a, r, r1, m, kept, unit, s);
    default:
      return FastRowX<kHasMask, float16_t>(a, r, r1, m, kept, unit, s);
  }
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
// ---- The fast path, bf16 in and out, on AVX2 and SSE4: pair order ------------
// FastRow + WriteRow in activation.cpp's bf16 lane order: one u32 load of a
// step (2 Lanes(df) values) gives the even elements (bits << 16) and the odd
// ones (bits & 0xFFFF0000) as two fp32 vectors with no widening shuffle; s
// keeps each step's exps in that order (even, then odd) and pass 3 packs
// them back with a shift, an and and an or (instead of a widening load per
// vector and a rounding plus ConcatOdd per pair). Same passes, scores and
// exp as FastRow (ExpNonPositive<3> clamped at -88 rather than selected:
// 0 below, as before); columns after the last whole step in [0, kept) go through
// s in memory order (one vector at a time, -inf padded, scalar stores).
// Rounding to bf16 is to nearest with ties away from zero (bits + 0x8000, one
// add per vector instead of four): the exp's 7.5e-5 relative error dwarfs
// the 2^-24 that separates a tie from its neighbours, so either tie rule
// gives one of the two bf16 neighbours of a value not known to lie on the
// tie (as activation.cpp's kBf16TiesAway). A NaN here comes from bf16 data
// or is the default NaN: its low half is zero, so the add cannot carry into
// the exponent or the sign.
constexpr bool kPairRows = true;

template <bool kHasMask, bool kStream>
HWY_INLINE void PairRow(const SmFwdArgs& a, int64_t r, int64_t r1, const uint8_t* HWY_RESTRICT m, size_t kept,
                        float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const hn::Rebind<uint16_t, decltype(df)> dh;      // a step's mask bytes as u16 pairs
  const hn::Repartition<uint8_t, decltype(dh)> d8;  // the same bytes
  using VF = hn::Vec<decltype(df)>;
  const size_t nf = hn::Lanes(df), step = 2 * nf, full = kept / step * step;
  const size_t sk = size_t(a.sk);
  const bfloat16_t* HWY_RESTRICT x = static_cast<const bfloat16_t*>(a.x) + size_t(r) * sk;
  bfloat16_t* HWY_RESTRICT y = static_cast<bfloat16_t*>(a.y) + size_t(r) * sk;
  const float scale = a.scale, masked = -10000.0f;
  const auto vscale = hn::Set(df, scale);
  const auto hi16 = hn::Set(du, 0xFFFF0000u);
  const auto load = [&](size_t j, VF& ev, VF& od) HWY_ATTR {
    const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(x + j));
    ev = hn::BitCast(df, hn::ShiftLeft<16>(w));
    od = hn::BitCast(df, hn::And(w, hi16));
  };
  // v where the mask byte is 0, `with` where it is not (even and odd elements).
  const auto mask = [&](size_t j, VF with, VF& ev, VF& od) HWY_ATTR {
    if constexpr (kHasMask) {
      const auto mw = hn::PromoteTo(du, hn::BitCast(dh, hn::LoadU(d8, m + j)));
      ev = hn::IfThenElse(hn::RebindMask(df, hn::Ne(hn::And(mw, hn::Set(du, 0xFFu)), hn::Zero(du))), with, ev);
      od = hn::IfThenElse(hn::RebindMask(df, hn::Ne(hn::And(mw, hn::Set(du, 0xFF00u)), hn::Zero(du))), with, od);
    } else {
      (void)j;
      (void)with;
      (void)ev;
      (void)od;
    }
  };
  const auto score = [&](size_t i) { return kHasMask && m[i] != 0 ? masked : scale * ScalarLoad(x + i); };

  // Pass 1: the max of the scores.
  VF max0 = hn::Set(df, -std::numeric_limits<float>::infinity()), max1 = max0;
  const VF vmasked = hn::Set(df, masked);
  for (size_t j = 0; j < full; j += step) {
    VF ev, od;
    load(j, ev, od);
    ev = hn::Mul(ev, vscale);
    od = hn::Mul(od, vscale);
    mask(j, vmasked, ev, od);
    max0 = hn::Max(max0, ev);
    max1 = hn::Max(max1, od);
  }
  float mx = hn::GetLane(hn::MaxOfLanes(df, hn::Max(max0, max1)));
  for (size_t i = full; i < kept; ++i) mx = std::max(mx, score(i));

  // Pass 2: s = exp(x * scale - max) (FastRow's ExpScores), summed.
  const int64_t nr = r + 1 < r1 ? r + 1 : r;  // the next row of the chunk is prefetched
  const bfloat16_t* next = static_cast<const bfloat16_t*>(a.x) + size_t(nr) * sk;
  const size_t next_len = size_t(KeptColumns(a, nr));
  const VF vnegmx = hn::Set(df, -mx), vmaskedmx = hn::Set(df, masked - mx);
  VF sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  for (size_t j = 0; j < full; j += step) {
    if (j < next_len) __builtin_prefetch(next + j, 0, 2);
    VF ev, od;
    load(j, ev, od);
    ev = hn::Add(hn::Mul(ev, vscale), vnegmx);  // rounded score minus max: <= 0 (ExpScores)
    od = hn::Add(hn::Mul(od, vscale), vnegmx);
    mask(j, vmaskedmx, ev, od);
    ev = ExpNonPositive<3, true>(df, ev);
    od = ExpNonPositive<3, true>(df, od);
    hn::StoreU(ev, df, s + j);
    hn::StoreU(od, df, s + j + nf);
    sum0 = hn::Add(sum0, ev);
    sum1 = hn::Add(sum1, od);
  }
  for (size_t t = full; t < kept; t += nf) {  // the rest in memory order, one vector at a time
    for (size_t i = t; i < t + nf; ++i) s[i] = i < kept ? score(i) - mx : -std::numeric_limits<float>::infinity();
    const VF e = ExpNonPositive<3, true>(df, hn::LoadU(df, s + t));
    hn::StoreU(e, df, s + t);
    sum0 = hn::Add(sum0, e);
  }
  const float inv = 1.0f / hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));

  // Pass 3: y = s / sum, 0 from kept on.
  const VF vinv = hn::Set(df, inv);
  const auto half = hn::Set(du, 0x8000u);
  uint32_t* HWY_RESTRICT y32 = reinterpret_cast<uint32_t*>(y);
  for (size_t j = 0; j < full; j += step) {
    const auto ev = hn::BitCast(du, hn::Mul(hn::LoadU(df, s + j), vinv));
    const auto od = hn::BitCast(du, hn::Mul(hn::LoadU(df, s + j + nf), vinv));
    const auto w = hn::Or(hn::ShiftRight<16>(hn::Add(ev, half)), hn::And(hn::Add(od, half), hi16));
    if constexpr (kStream) {
      hn::Stream(w, du, y32 + j / 2);
    } else {
      hn::StoreU(w, du, y32 + j / 2);
    }
  }
  for (size_t i = full; i < kept; ++i) ScalarStore(s[i] * inv, y + i);
  if (kept < sk) std::memset(static_cast<void*>(y + kept), 0, (sk - kept) * sizeof(bfloat16_t));
}
#else
constexpr bool kPairRows = false;
template <bool kHasMask, bool kStream>
HWY_INLINE void PairRow(const SmFwdArgs&, int64_t, int64_t, const uint8_t*, size_t, float*) {}
#endif

// Exported: forward rows [r0, r1); s holds round_up(sk, lanes) floats.
void SoftmaxFwdRows(const SmFwdArgs& a, int64_t r0, int64_t r1, float* s) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const float unit = Log2Unit(a);
  const bool deg3 = a.ty == DType::kBF16 && a.fast && (!kExp2Scores || unit != 1.0f);
  for (int64_t r = r0; r < r1; ++r) {
    const size_t kept = size_t(KeptColumns(a, r));
    const uint8_t* m = nullptr;
    if (a.kind == kMasked) {
      const int64_t i = r % a.sq, b = r / (a.heads * a.sq);
      m = a.mask + size_t(((a.mask_broadcast ? 0 : b) * a.sq + i) * a.sk);
    }
    // No kept column (causal above the diagonal, or every score masked): 0.
    const bool none = kept == 0 || (m != nullptr && std::memchr(m, 0, kept) == nullptr);
    float inv = 0.0f;
    size_t live = 0;  // columns whose s is valid
    // bf16 in and out on AVX2 and SSE4: all three passes in PairRow.
    if (!none && deg3 && kPairRows && a.tx == DType::kBF16) {
      if (a.stream) {
        m ? PairRow<true, true>(a, r, r1, m, kept, s) : PairRow<false, true>(a, r, r1, nullptr, kept, s);
      } else {
        m ? PairRow<true, false>(a, r, r1, m, kept, s) : PairRow<false, false>(a, r, r1, nullptr, kept, s);
      }
      continue;
    }
    if (!none && deg3) {
      live = kept;
      inv = 1.0f / (m ? FastRow<true>(a, r, r1, m, kept, unit, s) : FastRow<false>(a, r, r1, nullptr, kept, unit, s));
    } else if (!none) {
      const float mx = m ? ScoreAny<true>(a, r, m, kept, s) : ScoreAny<false>(a, r, nullptr, kept, s);
      live = kept;
      // NaN when the row holds a NaN, a +inf (inf - inf) or only -inf.
      inv = 1.0f / ExpAny(a, r, r1, s, (kept + nf - 1) / nf * nf, mx);
    }
    if (a.stream) {
      WriteAny<true>(a, r, s, live, inv);
    } else {
      WriteAny<false>(a, r, s, live, inv);
    }
  }
  if (a.stream) hwy::FlushStream();
}

// ---- Backward -----------------------------------------------------------------
// One dtype for dy, y and dx. dy and dx may be the same memory: no restrict.
template <bool kStream, class T>
HWY_INLINE void BwdRowT(const T* dy, const T* HWY_RESTRICT y, T* dx, size_t sk, float scale, const T* next_dy,
                        const T* next_y, bool native) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  size_t j = 0;
  for (; j + 4 * nf <= sk; j += 4 * nf) {
    a0 = hn::MulAdd(LoadF(df, dy + j), LoadF(df, y + j), a0);
    a1 = hn::MulAdd(LoadF(df, dy + j + nf), LoadF(df, y + j + nf), a1);
    a2 = hn::MulAdd(LoadF(df, dy + j + 2 * nf), LoadF(df, y + j + 2 * nf), a2);
    a3 = hn::MulAdd(LoadF(df, dy + j + 3 * nf), LoadF(df, y + j + 3 * nf), a3);
  }
  for (; j + nf <= sk; j += nf) a0 = hn::MulAdd(LoadF(df, dy + j), LoadF(df, y + j), a0);
  float dot = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(a0, a1), hn::Add(a2, a3))));
  for (; j < sk; ++j) dot += ScalarLoad(dy + j) * ScalarLoad(y + j);

  const auto vdot = hn::Set(df, dot);
  const auto vscale = hn::Set(df, scale);
  const auto grad = [&](size_t at) HWY_ATTR {
    return hn::Mul(hn::Mul(vscale, LoadF(df, y + at)), hn::Sub(LoadF(df, dy + at), vdot));
  };
  j = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bfloat16_t>) {
    const hn::Repartition<uint16_t, decltype(df)> du16;
    uint16_t* yu = reinterpret_cast<uint16_t*>(dx);
#if TEFL_BF16_NATIVE
    if (native) {
      for (; j + 2 * nf <= sk; j += 2 * nf) {
        __builtin_prefetch(next_dy + j, 0, 2);
        __builtin_prefetch(next_y + j, 0, 2);
        const auto bits = RoundToBF16Bits2Native(grad(j), grad(j + nf));
        if constexpr (kStream) {
          StreamF(bits, du16, yu + j);
        } else {
          StoreF(bits, du16, yu + j);
        }
      }
    }
#endif
    for (; j + 2 * nf <= sk; j += 2 * nf) {
      __builtin_prefetch(next_dy + j, 0, 2);
      __builtin_prefetch(next_y + j, 0, 2);
      const auto bits = RoundToBF16Bits2(grad(j), grad(j + nf), df);
      if constexpr (kStream) {
        StreamF(bits, du16, yu + j);
      } else {
        StoreF(bits, du16, yu + j);
      }
    }
  }
#endif
  for (; j + nf <= sk; j += nf) {
    __builtin_prefetch(next_dy + j, 0, 2);
    __builtin_prefetch(next_y + j, 0, 2);
    if constexpr (kStream) {
      StreamF(grad(j), df, dx + j);
    } else {
      StoreF(grad(j), df, dx + j);
    }
  }
  for (; j < sk; ++j) ScalarStore(scale * ScalarLoad(y + j) * (ScalarLoad(dy + j) - dot), dx + j);
}

template <bool kStream, class T>
HWY_INLINE void BwdRowsSame(const SmBwdArgs& a, int64_t r0, int64_t r1) {
  const size_t sk = size_t(a.sk);
  const T* dy = static_cast<const T*>(a.dy);
  const T* y = static_cast<const T*>(a.y);
  T* dx = static_cast<T*>(a.dx);
  for (int64_t r = r0; r < r1; ++r) {
    const size_t off = size_t(r) * sk;
    const size_t noff = (r + 1 < r1 ? size_t(r + 1) : size_t(r)) * sk;
    BwdRowT<kStream>(dy + off, y + off, dx + off, sk, a.scale, dy + noff, y + noff, a.native);
  }
}

// Mixed dtypes: rows converted to fp32 (buf holds 3 * sk floats).
template <class T>
HWY_INLINE void ToF32(const void* base, size_t off, size_t n, float* dst) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const T* src = static_cast<const T*>(base) + off;
  size_t i = 0;
  for (; i + nf <= n; i += nf) hn::StoreU(LoadF(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = ScalarLoad(src + i);
}
HWY_INLINE void RowToF32(const void* base, DType t, size_t off, size_t n, float* dst) {
  if (t == DType::kF32) return ToF32<float>(base, off, n, dst);
  if (t == DType::kBF16) return ToF32<bfloat16_t>(base, off, n, dst);
  return ToF32<float16_t>(base, off, n, dst);
}
template <class T>
HWY_INLINE void FromF32(const float* src, size_t n, void* base, size_t off) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  T* dst = static_cast<T*>(base) + off;
  size_t i = 0;
  for (; i + nf <= n; i += nf) StoreF(hn::LoadU(df, src + i), df, dst + i);
  for (; i < n; ++i) ScalarStore(src[i], dst + i);
}
HWY_INLINE void RowFromF32(const float* src, size_t n, DType t, void* base, size_t off) {
  if (t == DType::kF32) return FromF32<float>(src, n, base, off);
  if (t == DType::kBF16) return FromF32<bfloat16_t>(src, n, base, off);
  return FromF32<float16_t>(src, n, base, off);
}

// Exported: backward rows [r0, r1); buf holds 3 * sk floats (mixed dtypes).
void SoftmaxBwdRows(const SmBwdArgs& a, int64_t r0, int64_t r1, float* buf) {
  if (a.tdy == a.ty && a.ty == a.tdx) {
    switch (a.ty) {
      case DType::kF32:
        return a.stream ? BwdRowsSame<true, float>(a, r0, r1) : BwdRowsSame<false, float>(a, r0, r1);
      case DType::kBF16:
        return a.stream ? BwdRowsSame<true, bfloat16_t>(a, r0, r1) : BwdRowsSame<false, bfloat16_t>(a, r0, r1);
      default:
        return a.stream ? BwdRowsSame<true, float16_t>(a, r0, r1) : BwdRowsSame<false, float16_t>(a, r0, r1);
    }
  }
  const size_t sk = size_t(a.sk);
  float* dy = buf;
  float* y = buf + sk;
  float* dx = buf + 2 * sk;
  for (int64_t r = r0; r < r1; ++r) {
    const size_t off = size_t(r) * sk;
    RowToF32(a.dy, a.tdy, off, sk, dy);
    RowToF32(a.y, a.ty, off, sk, y);
    BwdRowT<false>(dy, y, dx, sk, a.scale, dy, y, false);
    RowFromF32(dx, sk, a.tdx, a.dx, off);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- Dispatch, threading and registration (compiled once) ------------------
#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(SoftmaxFwdRows);
HWY_EXPORT(SoftmaxBwdRows);

namespace {

// Output bytes above which results are written with non-temporal stores (an
// output larger than a typical L3 is evicted before it is read back anyway;
// streaming saves the read-for-ownership of every line).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;
// Scratch row: sk rounded up to the widest vector (16 floats) and then some.
size_t ScratchFloats(int64_t sk) { return (size_t(sk) + 15) / 16 * 16 + 16; }

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "softmax", code, what);
}

bool StreamOk(void* out, int64_t rows, int64_t sk, DType t) {
  const int64_t row_bytes = sk * int64_t(FloatElemSize(t));
  return rows * row_bytes >= kStreamMinBytes && row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(out) % 64 == 0;
}

// A chunk's scratch is allocated by the chunk (no exception may leave the
// pool's body); a failed allocation is reported after the loop.
struct FwdCtx {
  const SmFwdArgs* a;
  size_t scratch;
  std::atomic<bool> oom{false};
};
void FwdBody(void* ctx, int64_t begin, int64_t end) {
  auto& c = *static_cast<FwdCtx*>(ctx);
  std::unique_ptr<float[]> s(new (std::nothrow) float[c.scratch]());
  if (!s) {
    c.oom.store(true);
    return;
  }
  HWY_DYNAMIC_DISPATCH(SoftmaxFwdRows)(*c.a, begin, end, s.get());
}

struct BwdCtx {
  const SmBwdArgs* a;
  size_t scratch;  // 0: none needed
  std::atomic<bool> oom{false};
};
void BwdBody(void* ctx, int64_t begin, int64_t end) {
  auto& c = *static_cast<BwdCtx*>(ctx);
  std::unique_ptr<float[]> s;
  if (c.scratch) {
    s.reset(new (std::nothrow) float[c.scratch]());
    if (!s) {
      c.oom.store(true);
      return;
    }
  }
  HWY_DYNAMIC_DISPATCH(SoftmaxBwdRows)(*c.a, begin, end, s.get());
}

int64_t Grain(int64_t sk) { return std::max<int64_t>(1, (int64_t(16) << 10) / std::max<int64_t>(sk, 1)); }

tefl_status* Forward(const tefl_call_frame* f, int kind) {
  try {
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    const DType tx = DTypeOf(x->dtype), ty = DTypeOf(y->dtype);
    if (!IsFloatType(tx) || !IsFloatType(ty)) return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    const int nd = x->ndim;
    const int64_t rows = LeadingRows(x);
    const int64_t sk = x->shape[nd - 1];
    if (rows == 0 || sk == 0) return nullptr;
    SmFwdArgs a{};
    a.kind = kind;
    a.tx = tx;
    a.ty = ty;
    a.sq = x->shape[nd - 2];
    a.sk = sk;
    a.heads = nd == 4 ? x->shape[1] : 1;
    a.scale = static_cast<const tefl_softmax_attrs*>(f->attrs)->scale;
    a.x = DataPtr(x);
    a.y = DataPtr(y);
    if (kind == kMasked) {
      const DLTensor* m = f->inputs[1];
      if (DTypeOf(m->dtype) != DType::kU8) return Status(f, TEFL_UNSUPPORTED, "mask dtypes other than uint8");
      a.mask = static_cast<const uint8_t*>(DataPtr(m));
      a.mask_broadcast = m->shape[0] == 1;
    }
    a.stream = StreamOk(a.y, rows, sk, ty);
    a.native = ty == DType::kBF16 && UseBf16NativeStore();
    a.fast = ty == DType::kBF16 && PortablePathOn(PortablePath::kBf16FastAct);
    FwdCtx c{&a, ScratchFloats(sk)};
    f->host->parallel_for(rows, Grain(sk), FwdBody, &c);
    if (c.oom.load()) return Status(f, TEFL_RUNTIME_ERROR, "scratch row allocation failed");
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* Backward(const tefl_call_frame* f) {
  try {
    const DLTensor* dy = f->inputs[0];
    const DLTensor* y = f->inputs[1];
    DLTensor* dx = f->outputs[0];
    SmBwdArgs a{};
    a.tdy = DTypeOf(dy->dtype);
    a.ty = DTypeOf(y->dtype);
    a.tdx = DTypeOf(dx->dtype);
    if (!IsFloatType(a.tdy) || !IsFloatType(a.ty) || !IsFloatType(a.tdx))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    const int64_t rows = LeadingRows(dy);
    a.sk = dy->shape[dy->ndim - 1];
    if (rows == 0 || a.sk == 0) return nullptr;
    a.scale = static_cast<const tefl_softmax_attrs*>(f->attrs)->scale;
    a.dy = DataPtr(dy);
    a.y = DataPtr(y);
    a.dx = DataPtr(dx);
    const bool same = a.tdy == a.ty && a.ty == a.tdx;
    a.stream = same && StreamOk(a.dx, rows, a.sk, a.tdx);
    a.native = same && a.tdx == DType::kBF16 && UseBf16NativeStore();
    BwdCtx c{&a, same ? 0 : 3 * ScratchFloats(a.sk)};
    f->host->parallel_for(rows, Grain(a.sk), BwdBody, &c);
    if (c.oom.load()) return Status(f, TEFL_RUNTIME_ERROR, "scratch row allocation failed");
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* PlainFwd(const tefl_call_frame* f, void*) { return Forward(f, kPlain); }
tefl_status* MaskedFwd(const tefl_call_frame* f, void*) { return Forward(f, kMasked); }
tefl_status* TriangFwd(const tefl_call_frame* f, void*) { return Forward(f, kUpperTriang); }
tefl_status* CausalFwd(const tefl_call_frame* f, void*) { return Forward(f, kAlignedCausal); }
tefl_status* AnyBwd(const tefl_call_frame* f, void*) { return Backward(f); }

}  // namespace

tefl_status* RegisterPortableSoftmax(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"scaled_softmax_forward", PlainFwd},
      {"scaled_softmax_backward", AnyBwd},
      {"scaled_masked_softmax_forward", MaskedFwd},
      {"scaled_masked_softmax_backward", AnyBwd},
      {"scaled_upper_triang_masked_softmax_forward", TriangFwd},
      {"scaled_upper_triang_masked_softmax_backward", AnyBwd},
      {"scaled_aligned_causal_masked_softmax_forward", CausalFwd},
      {"scaled_aligned_causal_masked_softmax_backward", AnyBwd},
  };
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
