// exp(v) for v <= 0 with a near-minimax polynomial of a chosen degree, shared
// by the default.portable kernels whose outputs need less than fp32 accuracy
// (activation.cpp; softmax.cpp for bf16 outputs). Include it after
// <hwy/foreach_target.h> (Highway's per-target "-inl.h" pattern).
//
// 2^n e^r with n = round(v / ln 2) and r = v - n ln 2 (one FMA: fp32 ln 2 is
// off by 1.9e-9, which adds |n| * 1.9e-9 relative error, 2e-8 for v >= -7 and
// 2.4e-7 at the bottom of the range), e^r on |r| <= ln 2 / 2 by a degree-5
// near-minimax polynomial (relative error 1.1e-7; 1.8e-7 = 3 ulp evaluated
// in fp32). n is read from the bits of v / ln 2 + (1.5 * 2^23 + 127), which
// also holds n + 127: shifted into the exponent field it is 2^n. Below -87
// (2^n no longer normal) the result is 0 (the true value is < 2e-38). -inf
// gives 0; NaN gives NaN. 11 operations where Highway's contrib Exp, valid on the whole
// line, takes ~26: the transcendental ops are compute-bound for bf16 data.
//
// Lower degrees for bf16 outputs, whose 8-bit mantissa needs no more (near-
// minimax, same range handling): kDeg 3, relative error 7.5e-5 (forward ops:
// vs bf16's half ulp 2^-9 = 2e-3 and TE's bf16 rtol 1e-2); kDeg 4, 2.6e-6
// (derivatives, which cancel near their roots where only atol 1e-5 holds:
// s and x s (1 - s) p of ~0.2 there give an absolute error ~1e-6).
//
// AVX-512 targets clamp v at -105 first (max(-105, v): a NaN v stays) and
// scale by 2^n with vscalefps, which underflows gradually and exactly (e^-105
// is 0 in fp32): two operations fewer; below -87 the result is then the
// subnormal e^v (or 0) instead of 0, identical above.
#if defined(TEFL_BACKENDS_PORTABLE_FAST_EXP_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef TEFL_BACKENDS_PORTABLE_FAST_EXP_INL_H_
#undef TEFL_BACKENDS_PORTABLE_FAST_EXP_INL_H_
#else
#define TEFL_BACKENDS_PORTABLE_FAST_EXP_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// e^r on |r| <= ln 2 / 2, near-minimax of degree kDeg (3, 4 or 5).
template <int kDeg, class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpReducedPoly(DF d, V r) {
  V p;
  if constexpr (kDeg == 3) {
    p = hn::Set(d, 0.16566842252380337f);
    p = hn::MulAdd(p, r, hn::Set(d, 0.5049633176500491f));
    p = hn::MulAdd(p, r, hn::Set(d, 1.0001641890817925f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.9999280720300502f));
  } else if constexpr (kDeg == 4) {
    p = hn::Set(d, 0.04145860806239317f);
    p = hn::MulAdd(p, r, hn::Set(d, 0.16790908276062141f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.5000435872713622f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.9999634042348399f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.9999992614265667f));
  } else {
    static_assert(kDeg == 5);
    p = hn::Set(d, 0.008312475867569447f);
    p = hn::MulAdd(p, r, hn::Set(d, 0.041890550404787064f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.16667115688323975f));
    p = hn::MulAdd(p, r, hn::Set(d, 0.4999922811985016f));
    p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
    p = hn::MulAdd(p, r, hn::Set(d, 1.0f));
  }
  return p;
}

// d is a full float tag (the AVX-512 path uses the whole 512-bit register).
// kClampLow (x86 below AVX-512): v is clamped at -88 first instead of the
// final select (one operation fewer): n = -127 there, whose 2^n bits are 0,
// so e^v is 0 for v <= -88 (and -inf), 2^-126 p for v in (-87.68, -87],
// identical above; max(-88, v) keeps a NaN v (maxps: the second operand).
template <int kDeg = 5, bool kClampLow = false, class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpNonPositive(DF d, V v) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  v = hn::Max(hn::Set(d, -105.0f), v);  // _mm512_max_ps: the second operand when either is NaN
#elif HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  if constexpr (kClampLow) v = hn::Max(hn::Set(d, -88.0f), v);
#else
  static_assert(!kClampLow, "kClampLow relies on x86 max keeping a NaN");
#endif
  const hn::RebindToUnsigned<DF> du;
  const V magic = hn::Set(d, 12583039.0f);  // 1.5 * 2^23 + 127
  const V t = hn::MulAdd(v, hn::Set(d, 1.44269504088896341f), magic);
  const V n = hn::Sub(t, magic);
  const V r = hn::MulAdd(n, hn::Set(d, -0.693147180559945309f), v);
  const V p = ExpReducedPoly<kDeg>(d, r);
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  (void)du;
  return V{_mm512_scalef_ps(p.raw, n.raw)};
#else
  const V scale = hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(du, t)));
  if constexpr (kClampLow) return hn::Mul(p, scale);
  return hn::IfThenZeroElse(hn::Lt(v, hn::Set(d, -87.0f)), hn::Mul(p, scale));
#endif
}

// e^(-u) for any u, for the bf16 sigmoid 1 / (1 + e^(-u)) below AVX-512
// (activation.cpp): no select on the sign of u is needed when the result may
// be huge. u is clamped to [-88.73, 87.33] first (min(u, c) returns c for a
// NaN u on x86: the sigmoid is then ~1 and the caller's x * s keeps the NaN),
// so n = round(-u / ln 2) is in [-126, 128] and 2^n comes from the exponent
// field as in ExpNonPositive; n = 128 gives exponent field 255, i.e. +inf, so
// e^(-u) is +inf for u <= -88.38 and the sigmoid exactly 0 there (TE's
// gelu(-inf) = -inf * 0 = NaN holds). Above u = 87.33 the result stays
// 2^-126 p (1 + e is 1). Same polynomial and relative error as
// ExpNonPositive<kDeg> in between. 10 operations.
// kFinite: u is clamped at -88.0 instead, so n <= 127 and e^(-u) stays
// finite (at most 2^127 * 1.42): for a caller whose Newton step on 1 + e
// would turn the estimate 0 of 1 / inf into NaN (0 * inf).
template <int kDeg, bool kFinite = false, class DF, class V = hn::Vec<DF>>
HWY_INLINE V ExpNegClamped(DF d, V u) {
  const hn::RebindToUnsigned<DF> du;
  u = hn::Max(hn::Min(u, hn::Set(d, 87.33f)), hn::Set(d, kFinite ? -88.0f : -88.73f));
  const V magic = hn::Set(d, 12583039.0f);  // 1.5 * 2^23 + 127
  const V t = hn::MulAdd(u, hn::Set(d, -1.44269504088896341f), magic);
  const V n = hn::Sub(t, magic);
  const V r = hn::NegMulSub(n, hn::Set(d, 0.693147180559945309f), u);  // -u - n ln 2
  return hn::Mul(ExpReducedPoly<kDeg>(d, r), hn::BitCast(d, hn::ShiftLeft<23>(hn::BitCast(du, t))));
}

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// 2^w for any w, AVX-512 only, for callers that can fold log2(e) into an
// earlier multiply: f = w - floor(w) in [0, 1] (vreduceps; exactly 0 for
// +-inf, NaN for NaN), a near-minimax polynomial for 2^f on [0, 1] (same
// relative errors as ExpNonPositive's: kDeg 3, 7.5e-5; kDeg 4, 2.6e-6), and
// vscalefps, which multiplies by 2^floor(w) with gradual, exact underflow:
// -inf gives 0, +inf gives +inf, NaN stays NaN, and no clamp is needed. Three
// operations fewer than ExpNonPositive (no clamp, no rounding of w / ln 2, no
// r = v - n ln 2).
template <int kDeg, class DF, class V = hn::Vec<DF>>
HWY_INLINE V Exp2Reduced(DF d, V w) {
  const V f = V{_mm512_reduce_ps(w.raw, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC)};
  V p;
  if constexpr (kDeg == 3) {
    p = hn::Set(d, 0.07802452332442093f);
    p = hn::MulAdd(p, f, hn::Set(d, 0.22606715899100627f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.6958335366901094f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.9999252192155593f));
  } else {
    static_assert(kDeg == 4);
    p = hn::Set(d, 0.01353416799595593f);
    p = hn::MulAdd(p, f, hn::Set(d, 0.05201146107608897f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.24144275610772936f));
    p = hn::MulAdd(p, f, hn::Set(d, 0.6930038347882838f));
    p = hn::MulAdd(p, f, hn::Set(d, 1.0000025933415337f));
  }
  return V{_mm512_scalef_ps(p.raw, w.raw)};
}
#endif

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // TEFL_BACKENDS_PORTABLE_FAST_EXP_INL_H_
