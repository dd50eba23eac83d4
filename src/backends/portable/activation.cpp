// default.portable activation kernels: gelu, qgelu, relu, srelu, silu, their
// backward, the gated variants (glu, geglu, qgeglu, reglu, sreglu, swiglu,
// clamped_swiglu and backward) and dbias + backward (maths: spec/ops.md,
// "Activations"; TransformerEngine's formulas).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); work spread
// over the host thread pool. One templated loop per kind (forward, backward,
// gated forward, gated backward, dbias), the activation a functor with Act
// and DAct on fp32 vectors.
//
// Numerics (fp32 compute, one rounding per output):
//  - Every sigmoid and tanh goes through e = exp(-|u|) in [0, 1] (our own
//    11-operation exp, 3 ulp) and r = 1 / (1 + e) (hardware reciprocal
//    estimate + one Newton step): s = r and 1 - s = e r for u >= 0, swapped
//    for u < 0, neither side cancelling. tanh(y) never appears:
//    0.5 + 0.5 tanh(y) = sigmoid(2y) and 1 - tanh(y)^2 = 4 s (1 - s), which
//    avoid the cancellation of 1 + tanh(y) near y << 0. Against the double
//    reference every fp32 output is within TE's fp32 rule (atol 1e-6, rtol
//    5e-6) with a margin above 10x (ActivationSpecial.DenseSweep).
//  - Products are ordered as x * (alpha s (1 - s)), and dgelu's polynomial
//    takes x^2 capped at FLT_MAX, so large finite inputs give the limits the
//    reference gives; +-inf give TE's formula's IEEE result (NaN where it is
//    inf * 0). An output whose fp32 evaluation overflows an intermediate is
//    +-inf where the double reference may be finite (srelu(3e19) * 0.1), as
//    TE's fp32 kernels. NaN in -> NaN out.
//  - dbias sums the fp32 dinput values before rounding (as TE): per thread
//    block of rows, an fp32 row accumulator flushed into double every 32
//    rows; the blocks (fixed by the row count and the thread count) are added
//    in order, so the result is deterministic for a given thread count.
//  - fp32 and bf16 calls with one dtype throughout run directly on the data;
//    any other combination converts 512-element tiles to fp32 and back.
//    Outputs of 32 MiB and more with 64-byte aligned rows are streamed.
//
// Host contract (validated before the call): CPU tensors, compact row-major,
// element-aligned, fp32/fp16/bf16 each, outputs do not overlap inputs,
// shapes as in the catalogue.
#include <hwy/cache_control.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <mutex>
#include <type_traits>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "backends/portable/act_pieces.h"
#include "backends/portable/cpu_paths.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_ACTIVATION_SHARED_
#define TEFL_BACKENDS_PORTABLE_ACTIVATION_SHARED_
namespace tefl::backends {
namespace {

enum class Kind : uint8_t { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };
enum class Act : uint8_t { kGelu, kQGelu, kRelu, kSrelu, kSilu, kGlu, kClamped };

// Elements per work item of the elementwise kinds (a multiple of 64 bytes
// for every dtype, so streamed blocks stay aligned).
constexpr int64_t kBlock = 8192;
// Elements converted per step of the mixed-dtype path.
constexpr size_t kTile = 512;
// dbias: rows summed in fp32 before they are added to the double partials.
constexpr int64_t kFlushRows = 32;

// One call. Non-gated: x, g, y are [rows, h]. Gated: x and (backward) y are
// [rows, 2h], g and (forward) y [rows, h].
struct Job {
  Kind kind;
  Act act;
  DType tx, tg, ty;
  bool fast;  // every tensor has dtype `fast_t` (f32 or bf16): no staging
  DType fast_t;
  bool stream;    // non-temporal stores (large outputs, 64-byte aligned rows)
  bool native;    // bf16 fast path: round with vcvtne2ps2bf16 (simd_io-inl.h)
  bool fast_act;  // bf16 fast path (and bf16 dbias): the cheaper sigmoids
  bool table;     // bf16 fast path: gelu, geglu, dgelu/dqgelu/dsilu and dbias_ by table lookups (AVX2, SSE4)
  const void* x;
  const void* g;
  void* y;
  int64_t rows, h, n;
  float limit, alpha;
  // dbias: blocks of rows, each with an fp32 accumulator [h] and a double
  // partial [h].
  int64_t blocks;
  float* acc;
  double* partial;
  // Gated FP8 outputs (glu_fp8 ... clamped_swiglu_fp8): y is FP8 of format
  // fmt, y = fp8(act(a) gate(b) * scale); max |act(a) gate(b)| is folded into
  // *amax_bits (max of |bits|).
  Fp8Format fmt;
  float scale;
  std::atomic<uint32_t>* amax_bits;
};

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_ACTIVATION_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/activation.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/fast_exp-inl.h"
#include "backends/portable/fp8_io-inl.h"
#include "backends/portable/simd_io-inl.h"

// ---- Per-target kernels ------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// ---- exp(v) for v <= 0: ExpNonPositive<kDeg> in fast_exp-inl.h --------------

// ---- Sigmoid -----------------------------------------------------------------
// 1 / v for v in [1, 2] with one Newton step from the estimate on every
// target (relative error ~1e-7 below AVX-512): the bf16 derivatives, which
// need no exact 1/1.
HWY_INLINE V RecipOneStep(D d, V v) {
  const V r0 = hn::ApproximateReciprocal(v);
  return hn::Mul(r0, hn::NegMulAdd(v, r0, hn::Set(d, 2.0f)));
}

// s = sigmoid(u) and 1 - s from e = exp(-|u|) in [0, 1]: with r = 1 / (1 + e)
// and q = e r, s = r and 1 - s = q for u >= 0, swapped for u < 0. Neither
// side cancels, exp never overflows, and the reciprocal of 1 + e in [1, 2] is
// a hardware estimate refined by one Newton step (~1 ulp). u = +-inf gives
// exactly 1 and 0; a NaN u gives NaN.
// kFast: the estimate alone (AVX-512 rcp14: relative error < 2^-14; the
// other targets' estimates are 2^-12 or better), for bf16 outputs.
template <bool kFast = false>
HWY_INLINE V Recip12(D d, V v) {  // 1 / v for finite v >= 1
  if constexpr (kFast) return hn::ApproximateReciprocal(v);
  const V r1 = RecipOneStep(d, v);
#if HWY_TARGET > HWY_AVX3
  // Below AVX-512 the estimate has 12 bits (rcpps: 1/1 is 0.99976), one step
  // leaves ~1 ulp and sigmoid(large u) just under 1 (gelu(1e30) != 1e30); a
  // second step in the form r + r (1 - v r), whose residual the FMA keeps
  // exact, makes 1/1 exactly 1 (r (2 - v r) cannot: 2 - v r rounds to 1).
  // vrcp14ps needs one step.
  return hn::MulAdd(r1, hn::NegMulAdd(v, r1, hn::Set(d, 1.0f)), r1);
#else
  return r1;
#endif
}

template <bool kFast = false>
HWY_INLINE void SigmoidParts(D d, V u, V& r, V& q) {
  const V e = ExpNonPositive < kFast ? 3 : 5 > (d, hn::Or(u, hn::SignBit(d)));  // exp(-|u|)
  r = Recip12<kFast>(d, hn::Add(hn::Set(d, 1.0f), e));
  q = hn::Mul(e, r);
}

template <bool kFast = false>
HWY_INLINE V Sigmoid(D d, V u) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // kFast on AVX-512: s = 1 / (1 + 2^w), w = -u log2(e), straight, no
  // select, no clamp: Exp2Reduced's 2^w is +inf for w > 128 (s = 0; u =
  // -inf: s = 0, so gelu(-inf) = -inf * 0 = NaN as TE's formula) and 0 for
  // w < -150 (s = the estimate of 1), NaN for NaN. In between s has the
  // relative error of the degree-3 2^f plus the estimate's.
  if constexpr (kFast) {
    const V e = Exp2Reduced<3>(d, hn::Mul(u, hn::Set(d, -1.44269504088896341f)));
    return hn::ApproximateReciprocal(hn::Add(hn::Set(d, 1.0f), e));
  }
#else
  // kFast below AVX-512: the same straight 1 / (1 + e^(-u)), with
  // ExpNegClamped's e^(-u) (+inf for u <= -88.38: s = 0; NaN u: s ~ 1).
  if constexpr (kFast) return hn::ApproximateReciprocal(hn::Add(hn::Set(d, 1.0f), ExpNegClamped<3>(d, u)));
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
  // Otherwise (fp32/fp16 outputs) the same straight form with the degree-5
  // exp and the two Newton steps: five operations fewer than the select
  // form below (no |u|, no q = e r, no compare and blend), and as accurate.
  // For u >= 0 it is that form's r; for u < 0, 1 / (1 + e^(-u)) has the
  // relative error of e^(-u) plus the reciprocal's, as q = e r has. e^(-u)
  // stays finite (u clamped at -88), whose reciprocal's estimate is 0
  // (rcpps flushes), so s is 0 below u ~ -87.3 where the select form
  // flushed e^(-|u|) to 0 too. u = -inf: 0; +inf: 1; NaN: ~1 (callers keep
  // x's NaN: x * s, or KeepNaN).
  // x86 only: the emulated targets' estimate is an exact division, whose
  // denormal 1 / (1 + e) would make gelu(-inf) = -inf instead of NaN.
  if constexpr (!kFast) return Recip12(d, hn::Add(hn::Set(d, 1.0f), ExpNegClamped<5, true>(d, u)));
#endif
#endif
  V r, q;
  SigmoidParts<kFast>(d, u, r, q);
  return hn::IfThenElse(hn::Lt(u, hn::Zero(d)), q, r);
}

// s = sigmoid(u) and sp = s (1 - s) = r q whatever the sign of u (no second
// select). kBf16: the degree-4 exp and one Newton step (bf16 outputs of
// derivatives).
template <bool kBf16 = false>
HWY_INLINE void SigmoidAndSlope(D d, V u, V& s, V& sp) {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
  // exp(-|u|) = 2^(-|u| log2(e)): Exp2Reduced, two operations fewer.
  const V e = kBf16 ? Exp2Reduced<4>(d, hn::Mul(hn::Or(u, hn::SignBit(d)), hn::Set(d, 1.44269504088896341f)))
                    : ExpNonPositive<5>(d, hn::Or(u, hn::SignBit(d)));
#else
  const V e = ExpNonPositive < kBf16 ? 4 : 5 > (d, hn::Or(u, hn::SignBit(d)));  // exp(-|u|)
#endif
  const V r = kBf16 ? RecipOneStep(d, hn::Add(hn::Set(d, 1.0f), e)) : Recip12(d, hn::Add(hn::Set(d, 1.0f), e));
  const V q = hn::Mul(e, r);
  s = hn::IfThenElse(hn::Lt(u, hn::Zero(d)), q, r);
  sp = hn::Mul(r, q);
}

// ---- Activation functors -------------------------------------------------------
// Act(x) = the forward, DAct(x) = its derivative, ActDAct both (gated
// backward). Gate(b) maps the gate half and GateGrad(b, v) masks the
// gradient through it; both identities except for clamped SwiGLU.
struct PlainGate {
  HWY_INLINE V Gate(V b) const { return b; }
  HWY_INLINE V GateGrad(V, V v) const { return v; }
};

#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
// ---- Piecewise derivatives (bf16 fast path, AVX-512) ----------------------------
// f(x) with f(-x) = 1 - f(x) (dgelu, dsilu) from a table of act_pieces.h
// (scripts/fit-act-pieces.py): |x| is clamped at `end`, the piece's index
// is round(|x| scale), read from the low bits of |x| scale + 1.5 * 2^23
// (vpermps uses 4 bits), and its degree-5 coefficients come from six 16-lane
// tables. 20 operations, 7 of them multiplies or FMAs, against ~18 in the
// sigmoid path (the bf16 loops' bottleneck). x < 0 takes 1 - p: absolute
// error is what TE's atol governs at the derivatives' roots. NaN passes the
// clamp (min returns its second operand) and the polynomial; x - x adds NaN
// at +-inf, TE's formulas' inf * 0.
HWY_INLINE V SymmetricPieces(D d, V x, V end, V scale, const float (&c)[6][16]) {
  const V xc = hn::Min(end, hn::Abs(x));
  const V magic = hn::Set(d, 12582912.0f);  // 1.5 * 2^23
  const V k = hn::MulAdd(xc, scale, magic);
  const V t = hn::MulSub(xc, scale, hn::Sub(k, magic));  // in [-0.5, 0.5]
  const __m512i idx = _mm512_castps_si512(k.raw);
  const auto coef = [&](int j) { return V{_mm512_permutexvar_ps(idx, _mm512_load_ps(c[j]))}; };
  V p = coef(5);
  p = hn::MulAdd(p, t, coef(4));
  p = hn::MulAdd(p, t, coef(3));
  p = hn::MulAdd(p, t, coef(2));
  p = hn::MulAdd(p, t, coef(1));
  p = hn::MulAdd(p, t, coef(0));
  const __mmask16 neg = _mm512_cmp_ps_mask(x.raw, _mm512_setzero_ps(), _CMP_LT_OQ);
  p = V{_mm512_mask_sub_ps(p.raw, neg, _mm512_set1_ps(1.0f), p.raw)};
  return hn::Add(p, hn::Sub(x, x));
}
#endif

// x * (0.5 + 0.5 tanh(x (k0 + k1 x^2))) = x * sigmoid(2 x (k0 + k1 x^2)).
// dgelu: t = tanh(k0 x (1 + 0.044715 x^2)) = 2 s - 1 with s = sigmoid(2 k0 x
// (1 + 0.044715 x^2)): 0.5 x (1 - t^2) p + 0.5 (1 + t) = x (2 s (1 - s) p) + s,
// p = k0 + 0.1070322243 x^2, evaluated as x (s (1 - s) 2p) + s. ActDAct
// shares DAct's sigmoid: act = x s (the same u up to one ulp of k1).
//
// kFast (bf16 fast path): Act with the degree-3 exp and the bare reciprocal
// estimate, ActDAct (and DAct below AVX-512) with the degree-4 exp
// (ExpNonPositive); DAct on AVX-512 a piecewise polynomial (SymmetricPieces).
template <bool kFast = false>
struct GeluFnT : PlainGate {
  HWY_INLINE V Act(V x) const {
    const D d;
    const V c0 = hn::Set(d, 2.0f * 0.79788456f), c1 = hn::Set(d, 2.0f * 0.03567741f);
    const V u = hn::Mul(x, hn::MulAdd(c1, hn::Mul(x, x), c0));
    return hn::Mul(x, Sigmoid<kFast>(d, u));
  }
  // The derivative, and s in sig.
  HWY_INLINE V DActSig(V x, V& sig) const {
    const D d;
    const V e0 = hn::Set(d, float(2.0 * 0.79788456)), e1 = hn::Set(d, float(2.0 * 0.79788456 * 0.044715));
    const V p0 = hn::Set(d, 2.0f * 0.79788456f), p1 = hn::Set(d, 2.0f * 0.1070322243f);  // 2p
    const V x2 = hn::Min(hn::Mul(x, x), hn::Set(d, FLT_MAX));                            // keeps p finite for finite x
    V s, sp;
    SigmoidAndSlope<kFast>(d, hn::Mul(x, hn::MulAdd(e1, x2, e0)), s, sp);
    const V p2 = hn::MulAdd(p1, x2, p0);
    sig = s;
    return hn::MulAdd(x, hn::Mul(sp, p2), s);
  }
  HWY_INLINE V DAct(V x) const {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (kFast) {  // |error| <= 1.3e-7 (scripts/fit-act-pieces.py)
      const D d;
      return SymmetricPieces(d, x, hn::Set(d, kDgeluPieceEnd), hn::Set(d, kDgeluPieceScale), kDgeluPieces);
    }
#endif
    V s;
    return DActSig(x, s);
  }
  HWY_INLINE void ActDAct(V x, V& act, V& dact) const {
    V s;
    dact = DActSig(x, s);
    act = hn::Mul(x, s);
  }
};

// x * sigmoid(alpha x): qgelu (alpha 1.702), silu (alpha 1) and clamped
// SwiGLU's activation. Derivative x (alpha s (1 - s)) + s.
template <bool kFast = false>
struct SigmoidLinearFnT : PlainGate {
  float alpha;
  HWY_INLINE V Act(V x) const {
    const D d;
    return hn::Mul(x, Sigmoid<kFast>(d, hn::Mul(hn::Set(d, alpha), x)));
  }
  HWY_INLINE V DAct(V x) const {
#if HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL
    if constexpr (kFast) {  // dsilu(alpha x) (alpha 1 or 1.702), |error| <= 1.2e-6 (scripts/fit-act-pieces.py)
      const D d;
      return SymmetricPieces(d, x, hn::Set(d, kDsiluPieceEnd / alpha), hn::Set(d, kDsiluPieceScale * alpha),
                             kDsiluPieces);
    }
#endif
    V act, dact;
    ActDAct(x, act, dact);
    return dact;
  }
  HWY_INLINE void ActDAct(V x, V& act, V& dact) const {
    const D d;
    const V va = hn::Set(d, alpha);
    V s, sp;
    SigmoidAndSlope<kFast>(d, hn::Mul(va, x), s, sp);
    act = hn::Mul(x, s);
    dact = hn::MulAdd(x, hn::Mul(va, sp), s);
  }
};

// relu = x < 0 ? 0 : x; drelu = x > 0 ? 1 : x <= 0 ? 0 : NaN.
// kExact (here and in SreluFn): with bf16 data every result (times the
// gradient or the gate too) is exact in fp32, so its bf16 rounding can tie,
// and keeps ties to even (StoreStep).
struct ReluFn : PlainGate {
  static constexpr bool kExact = true;
  HWY_INLINE V Act(V x) const { return hn::IfThenZeroElse(hn::Lt(x, hn::Zero(D())), x); }
  HWY_INLINE V DAct(V x) const {
    const D d;
    const V zero = hn::Zero(d);
    return hn::IfThenZeroElse(hn::Le(x, zero), hn::IfThenElse(hn::Gt(x, zero), hn::Set(d, 1.0f), x));
  }
  HWY_INLINE void ActDAct(V x, V& act, V& dact) const {
    act = Act(x);
    dact = DAct(x);
  }
};

// srelu = x <= 0 ? 0 : x^2; dsrelu = x <= 0 ? 0 : 2x.
struct SreluFn : PlainGate {
  static constexpr bool kExact = true;
  HWY_INLINE V Act(V x) const { return hn::IfThenZeroElse(hn::Le(x, hn::Zero(D())), hn::Mul(x, x)); }
  HWY_INLINE V DAct(V x) const { return hn::IfThenZeroElse(hn::Le(x, hn::Zero(D())), hn::Add(x, x)); }
  HWY_INLINE void ActDAct(V x, V& act, V& dact) const {
    act = Act(x);
    dact = DAct(x);
  }
};

// glu: act = sigmoid(x), dact = s (1 - s); a NaN x is put back.
template <bool kFast = false>
struct GluFnT : PlainGate {
  HWY_INLINE static V KeepNaN(V x, V v) { return hn::IfThenElse(hn::IsNaN(x), x, v); }
  HWY_INLINE V Act(V x) const { return KeepNaN(x, Sigmoid<kFast>(D(), x)); }
  HWY_INLINE V DAct(V x) const {
    V act, dact;
    ActDAct(x, act, dact);
    return dact;
  }
  HWY_INLINE void ActDAct(V x, V& act, V& dact) const {
    V s, sp;
    SigmoidAndSlope<kFast>(D(), x, s, sp);
    act = KeepNaN(x, s);
    dact = KeepNaN(x, sp);
  }
};

// Clamped SwiGLU: a' = a > limit ? limit : a (NaN stays), act = a' sigmoid(
// alpha a'), no gradient where a > limit; b' = clamp(b, -limit, limit) + 1,
// no gradient where b < -limit or b > limit (TE: a == limit and |b| == limit
// pass gradient).
template <bool kFast = false>
struct ClampedFnT {
  float limit, alpha;
  // x86's minps/maxps return the second operand when either is NaN, so
  // Min(limit, a) keeps a NaN a; elsewhere an explicit select does.
  HWY_INLINE V Clamp(V a) const {
    const V vl = hn::Set(D(), limit);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
    return hn::Min(vl, a);
#else
    return hn::IfThenElse(hn::Gt(a, vl), vl, a);
#endif
  }
  HWY_INLINE V Act(V a) const { return SigmoidLinearFnT<kFast>{{}, alpha}.Act(Clamp(a)); }
  HWY_INLINE V DAct(V a) const {
    V act, dact;
    ActDAct(a, act, dact);
    return dact;
  }
  HWY_INLINE void ActDAct(V a, V& act, V& dact) const {
    SigmoidLinearFnT<kFast>{{}, alpha}.ActDAct(Clamp(a), act, dact);
    dact = hn::IfThenZeroElse(hn::Gt(a, hn::Set(D(), limit)), dact);
  }
  HWY_INLINE V Gate(V b) const {
    const D d;
    const V vl = hn::Set(d, limit), nl = hn::Set(d, -limit);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
    const V c = hn::Max(nl, hn::Min(vl, b));  // NaN b stays (see Clamp)
#else
    const V c = hn::IfThenElse(hn::Lt(b, nl), nl, hn::IfThenElse(hn::Gt(b, vl), vl, b));
#endif
    return hn::Add(c, hn::Set(d, 1.0f));
  }
  HWY_INLINE V GateGrad(V b, V v) const {
    const D d;
    return hn::IfThenZeroElse(hn::Or(hn::Lt(b, hn::Set(d, -limit)), hn::Gt(b, hn::Set(d, limit))), v);
  }
};

using GeluFn = GeluFnT<false>;
using SigmoidLinearFn = SigmoidLinearFnT<false>;
using GluFn = GluFnT<false>;
using ClampedFn = ClampedFnT<false>;

// ---- Element access ------------------------------------------------------------
// Up to Lanes(d) elements through an aligned buffer (tails).
template <class T>
HWY_INLINE V LoadPartial(D d, const T* HWY_RESTRICT p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(D())] = {};
  for (size_t i = 0; i < n; ++i) buf[i] = ScalarLoad(p + i);
  return hn::Load(d, buf);
}
template <class T>
HWY_INLINE void StorePartial(D d, V v, T* HWY_RESTRICT p, size_t n) {
  HWY_ALIGN float buf[hn::MaxLanes(D())];
  hn::Store(v, d, buf);
  for (size_t i = 0; i < n; ++i) ScalarStore(buf[i], p + i);
}

// The loops move kVecs<T> vectors per step. bf16 takes two: one u32 load
// holds 2 Lanes(d) values, the even ones (bits << 16) and the odd ones (bits
// & 0xFFFF0000) are both fp32 vectors with no shuffle, and the store packs
// them back the same way. Elementwise maths does not care about the lane
// order; dbias's accumulator keeps it (FlushAcc undoes it).
template <class T>
constexpr size_t kVecs = std::is_same_v<T, bfloat16_t> ? 2 : 1;
// Fully unrolled, the per-step vector arrays live in registers (a rolled
// loop over them goes through the stack: ~30% slower for bf16).
#define TEFL_UNROLL_K _Pragma("GCC unroll 2")

HWY_INLINE void LoadStep(D d, const float* HWY_RESTRICT p, V* v) { v[0] = hn::LoadU(d, p); }
HWY_INLINE void LoadStep(D d, const bfloat16_t* HWY_RESTRICT p, V* v) {
  const hn::RebindToUnsigned<D> du;
  const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  v[0] = hn::BitCast(d, hn::ShiftLeft<16>(w));
  v[1] = hn::BitCast(d, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}
template <bool kNative = false, bool kTiesAway = false>
HWY_INLINE void StoreStep(D d, const V* v, float* HWY_RESTRICT p, bool stream) {
  if (stream) {
    hn::Stream(v[0], d, p);
  } else {
    hn::StoreU(v[0], d, p);
  }
}
// kNative: vcvtne2ps2bf16 (TEFL_BF16_NATIVE targets, Job::native), bit for
// bit the same as the integer rounding.
// kTiesAway (AVX2 and SSE4, kBf16TiesAway below): round to nearest with ties
// away from zero, bits + 0x8000: one integer add per vector instead of four.
// For the sigmoid-based ops only, whose fp32 value is itself an
// approximation (relative error 1e-7 to 5e-4, far more than the 2^-24 that
// separates a tie from its neighbours), so either tie rule gives one of the
// two bf16 neighbours of a value that is not known to lie on the tie. The
// NaN argument is RoundBF16HiFromBF16Data's: low halves are zero, no carry.
template <bool kNative = false, bool kTiesAway = false>
HWY_INLINE void StoreStep(D d, const V* v, bfloat16_t* HWY_RESTRICT p, bool stream) {
  const hn::RebindToUnsigned<D> du;
  hn::Vec<decltype(du)> w;
#if TEFL_BF16_NATIVE
  if constexpr (kNative) {
    w = PackBF16Native(v[0], v[1]);
  } else  // NOLINT(readability/braces)
#endif
      if constexpr (kTiesAway) {
    const auto half = hn::Set(du, 0x8000u);
    const auto lo = hn::ShiftRight<16>(hn::Add(hn::BitCast(du, v[0]), half));
    const auto hi = hn::And(hn::Add(hn::BitCast(du, v[1]), half), hn::Set(du, 0xFFFF0000u));
    w = hn::Or(lo, hi);
  } else {
    // Rounded to nearest even; the fast path's inputs are all bf16, so its
    // NaNs have zero low halves (RoundBF16HiFromBF16Data).
    const auto lo = hn::ShiftRight<16>(RoundBF16HiFromBF16Data(v[0], d));
    const auto hi = hn::And(RoundBF16HiFromBF16Data(v[1], d), hn::Set(du, 0xFFFF0000u));
    w = hn::Or(lo, hi);
  }
  uint32_t* q = reinterpret_cast<uint32_t*>(p);
  if (stream) {
    hn::Stream(w, du, q);
  } else {
    hn::StoreU(w, du, q);
  }
}

// Whether Fn's bf16 outputs round ties away from zero in full steps
// (StoreStep; the scalar tails keep ties to even): the AVX2 and SSE4
// targets, where the bf16 ops are compute-bound (4 operations of ~23 per
// vector saved, 1.14-1.17x on gelu, silu, swiglu), and not the exact
// functors (ReluFn, SreluFn). AVX-512 keeps ties to even, as its
// vcvtne2ps2bf16 stores do; so do the emulated targets.
template <class Fn>
concept ExactMaths = Fn::kExact;
template <class Fn>
constexpr bool kBf16TiesAway = (HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4) && !ExactMaths<Fn>;

// ---- bf16 tables (AVX2 and SSE4) ------------------------------------------------
// A bf16 input has 65536 values, so an elementwise function of it is a
// table. On AVX2 and SSE4 a lookup (scalar loads gathered into a vector;
// vpgatherdd is slower on Zen 3) costs less than a sigmoid: single thread,
// [64, 4096], dgelu ~2.4x, gelu ~1.2x; not silu and qgelu forward, whose
// computed form is as fast (docs/perf-activation.md, session 24). The tables
// hold the fp32 path's values (the accurate functors, this target's code):
// gelu(x) rounded to bf16 (nearest even) for gelu; gelu(x) in fp32 for
// geglu and dact(x) in fp32 for the derivatives, which the loops multiply by
// the gate and the gradient. So an all-bf16 gelu is its fp32 result rounded,
// and geglu, dgelu, dqgelu, dsilu (and dbias_) are the fp32 path's products,
// rounded as StoreStep rounds. The gated backward ops stay computed (two
// lookups per element were no faster than ActDAct). Each table is filled
// on its first use (65536 values; 0.3-0.6 ms on Zen 3, mostly the first
// touch of its fresh pages) and kept for the process.
// AVX-512 keeps the computed paths, faster there.
enum class Table : uint8_t { kFwdBf16, kAct, kDAct };

// The functor of the table loops: act and dact read from tables (either
// may be NULL where the loop does not read it).
struct FromTables : PlainGate {
  const float* act;
  const float* dact;
};
template <class Fn>
constexpr bool kFromTables = std::is_same_v<Fn, FromTables>;

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
// The fp32 functor whose values the tables of kAct hold.
template <Act kAct>
HWY_INLINE auto AccurateFn() {
  if constexpr (kAct == Act::kGelu) {
    return GeluFnT<false>();
  } else {
    static_assert(kAct == Act::kQGelu || kAct == Act::kSilu);
    return SigmoidLinearFnT<false>{{}, kAct == Act::kQGelu ? 1.702f : 1.0f};
  }
}

// Table kTable of kAct (kFwdBf16: uint16_t bf16 bits, else float), indexed
// by the input's bf16 bits; filled once per process and target.
template <Act kAct, Table kTable>
HWY_NOINLINE const std::conditional_t<kTable == Table::kFwdBf16, uint16_t, float>* ActTable() {
  using Entry = std::conditional_t<kTable == Table::kFwdBf16, uint16_t, float>;
  alignas(64) static Entry table[65536];
  static std::once_flag filled;
  std::call_once(filled, []() HWY_ATTR {
    const D d;
    const hn::RebindToUnsigned<D> du;
    const size_t nl = hn::Lanes(d);
    const auto fn = AccurateFn<kAct>();
    HWY_ALIGN float buf[hn::MaxLanes(D())];
    for (uint32_t i = 0; i < 65536u; i += uint32_t(nl)) {
      const V x = hn::BitCast(d, hn::ShiftLeft<16>(hn::Iota(du, i)));
      if constexpr (kTable == Table::kDAct) {
        hn::StoreU(fn.DAct(x), d, table + i);
      } else if constexpr (kTable == Table::kAct) {
        hn::StoreU(fn.Act(x), d, table + i);
      } else {
        hn::Store(fn.Act(x), d, buf);
        for (size_t k = 0; k < nl; ++k) table[i + k] = FloatToBF16(buf[k]);
      }
    }
  });
  return table;
}

// y = table[x], 8 elements per 16-byte store (streamed when `stream`: y
// 16-byte aligned then, as every streamed span starts 64-byte aligned).
HWY_INLINE void SpanFwdTable(const uint16_t* HWY_RESTRICT tab, const bfloat16_t* HWY_RESTRICT x,
                             bfloat16_t* HWY_RESTRICT y, size_t n, bool stream) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const bfloat16_t* HWY_RESTRICT xi = x + i;
    if (i % 32 == 0) PrefetchAhead(xi);  // once per 64-byte line
    __m128i v = _mm_cvtsi32_si128(tab[xi[0].bits]);
    v = _mm_insert_epi16(v, tab[xi[1].bits], 1);
    v = _mm_insert_epi16(v, tab[xi[2].bits], 2);
    v = _mm_insert_epi16(v, tab[xi[3].bits], 3);
    v = _mm_insert_epi16(v, tab[xi[4].bits], 4);
    v = _mm_insert_epi16(v, tab[xi[5].bits], 5);
    v = _mm_insert_epi16(v, tab[xi[6].bits], 6);
    v = _mm_insert_epi16(v, tab[xi[7].bits], 7);
    if (stream) {
      _mm_stream_si128(reinterpret_cast<__m128i*>(y + i), v);
    } else {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), v);
    }
  }
  for (; i < n; ++i) y[i].bits = tab[x[i].bits];
}

// tab[x] for one bf16 step (2 Lanes(d) elements) in LoadStep's lane order:
// v[0] the even elements, v[1] the odd ones.
HWY_INLINE void TableStep(const float* HWY_RESTRICT tab, const bfloat16_t* HWY_RESTRICT x, V* v) {
  const auto t = [&](int k) HWY_ATTR { return tab[x[k].bits]; };
#if HWY_TARGET == HWY_AVX2
  v[0] = V{_mm256_set_ps(t(14), t(12), t(10), t(8), t(6), t(4), t(2), t(0))};
  v[1] = V{_mm256_set_ps(t(15), t(13), t(11), t(9), t(7), t(5), t(3), t(1))};
#else
  v[0] = V{_mm_set_ps(t(6), t(4), t(2), t(0))};
  v[1] = V{_mm_set_ps(t(7), t(5), t(3), t(1))};
#endif
}
#endif  // HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4

// tab[x] for m < Lanes(d) elements of a tail (the rest of the vector 0).
HWY_INLINE V TablePartial(D d, const float* HWY_RESTRICT tab, const bfloat16_t* HWY_RESTRICT x, size_t m) {
  HWY_ALIGN float buf[hn::MaxLanes(D())] = {};
  for (size_t k = 0; k < m; ++k) buf[k] = tab[x[k].bits];
  return hn::Load(d, buf);
}

// act(x) (kA) and/or dact(x) (kD) of a full step (LoadStep's lane order)
// and of a tail of m < Lanes(d) elements: Fn's Act/DAct/ActDAct on the
// loaded x, or FromTables' lookups (bf16 data on AVX2 and SSE4 only).
template <bool kA, bool kD, class Fn, class T>
HWY_INLINE void ActStep(const Fn& fn, D d, const T* HWY_RESTRICT x, V* act, V* dact) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
  if constexpr (kFromTables<Fn>) {
    if constexpr (kA) TableStep(fn.act, x, act);
    if constexpr (kD) TableStep(fn.dact, x, dact);
    return;
  }
#endif
  if constexpr (!kFromTables<Fn>) {
    V v[kVecs<T>];
    LoadStep(d, x, v);
    TEFL_UNROLL_K
    for (size_t k = 0; k < kVecs<T>; ++k) {
      if constexpr (kA && kD) {
        fn.ActDAct(v[k], act[k], dact[k]);
      } else if constexpr (kA) {
        act[k] = fn.Act(v[k]);
      } else {
        dact[k] = fn.DAct(v[k]);
      }
    }
  }
}
template <bool kA, bool kD, class Fn, class T>
HWY_INLINE void ActPartial(const Fn& fn, D d, const T* HWY_RESTRICT x, size_t m, V* act, V* dact) {
  if constexpr (kFromTables<Fn>) {
    if constexpr (kA) *act = TablePartial(d, fn.act, x, m);
    if constexpr (kD) *dact = TablePartial(d, fn.dact, x, m);
  } else {
    const V v = LoadPartial(d, x, m);
    if constexpr (kA && kD) {
      fn.ActDAct(v, *act, *dact);
    } else if constexpr (kA) {
      *act = fn.Act(v);
    } else {
      *dact = fn.DAct(v);
    }
  }
}

// ---- One loop per kind over a span of n elements (one dtype T) -----------------
// `stream` needs every output span to start at a vector-aligned address.
// Full steps, then the rest Lanes(d) (or fewer) elements at a time.

// y = act(x)
template <class Fn, class T, bool kNative = false>
HWY_INLINE void SpanFwd(const Fn& fn, const T* HWY_RESTRICT x, T* HWY_RESTRICT y, size_t n, bool stream) {
  const D d;
  const size_t nl = hn::Lanes(d);
  constexpr size_t K = kVecs<T>;
  size_t i = 0;
  for (; i + K * nl <= n; i += K * nl) {
    V v[K];
    PrefetchAhead(x + i);
    LoadStep(d, x + i, v);
    TEFL_UNROLL_K
    for (size_t k = 0; k < K; ++k) v[k] = fn.Act(v[k]);
    StoreStep<kNative, kBf16TiesAway<Fn>>(d, v, y + i, stream);
  }
  for (; i < n; i += nl) {
    const size_t m = std::min(nl, n - i);
    StorePartial(d, fn.Act(LoadPartial(d, x + i, m)), y + i, m);
  }
}

// y = g * dact(x); acc += y (fp32, before rounding) when acc is not NULL, in
// the steps' lane order (see kVecs).
template <class Fn, class T, bool kNative = false>
HWY_INLINE void SpanBwd(const Fn& fn, const T* HWY_RESTRICT g, const T* HWY_RESTRICT x, T* HWY_RESTRICT y,
                        float* HWY_RESTRICT acc, size_t n, bool stream) {
  const D d;
  const size_t nl = hn::Lanes(d);
  constexpr size_t K = kVecs<T>;
  size_t i = 0;
  for (; i + K * nl <= n; i += K * nl) {
    V gv[K], v[K];
    PrefetchAhead(g + i);
    PrefetchAhead(x + i);
    LoadStep(d, g + i, gv);
    ActStep<false, true>(fn, d, x + i, nullptr, v);
    TEFL_UNROLL_K
    for (size_t k = 0; k < K; ++k) {
      v[k] = hn::Mul(gv[k], v[k]);
      if (acc) hn::StoreU(hn::Add(hn::LoadU(d, acc + i + k * nl), v[k]), d, acc + i + k * nl);
    }
    StoreStep<kNative, kBf16TiesAway<Fn>>(d, v, y + i, stream);
  }
  for (; i < n; i += nl) {
    const size_t m = std::min(nl, n - i);
    V v;
    ActPartial<false, true>(fn, d, x + i, m, nullptr, &v);
    v = hn::Mul(LoadPartial(d, g + i, m), v);
    StorePartial(d, v, y + i, m);
    if (acc) {
      HWY_ALIGN float buf[hn::MaxLanes(D())];
      hn::Store(v, d, buf);
      for (size_t k = 0; k < m; ++k) acc[i + k] += buf[k];
    }
  }
}

// y = act(a) * gate(b)
template <class Fn, class T, bool kNative = false>
HWY_INLINE void SpanGatedFwd(const Fn& fn, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b, T* HWY_RESTRICT y,
                             size_t n, bool stream) {
  const D d;
  const size_t nl = hn::Lanes(d);
  constexpr size_t K = kVecs<T>;
  size_t i = 0;
  for (; i + K * nl <= n; i += K * nl) {
    V av[K], bv[K];
    PrefetchAhead(a + i);
    PrefetchAhead(b + i);
    ActStep<true, false>(fn, d, a + i, av, nullptr);
    LoadStep(d, b + i, bv);
    TEFL_UNROLL_K
    for (size_t k = 0; k < K; ++k) av[k] = hn::Mul(av[k], fn.Gate(bv[k]));
    StoreStep<kNative, kBf16TiesAway<Fn>>(d, av, y + i, stream);
  }
  for (; i < n; i += nl) {
    const size_t m = std::min(nl, n - i);
    V act;
    ActPartial<true, false>(fn, d, a + i, m, &act, nullptr);
    StorePartial(d, hn::Mul(act, fn.Gate(LoadPartial(d, b + i, m))), y + i, m);
  }
}

// da = g * dact(a) * gate(b); db = gate_grad(b, g * act(a))
template <class Fn>
HWY_INLINE void GatedBwdVec(const Fn& fn, V g, V act, V dact, V b, V& da, V& db) {
  da = hn::Mul(hn::Mul(dact, g), fn.Gate(b));
  db = fn.GateGrad(b, hn::Mul(act, g));
}
template <class Fn, class T, bool kNative = false>
HWY_INLINE void SpanGatedBwd(const Fn& fn, const T* HWY_RESTRICT g, const T* HWY_RESTRICT a, const T* HWY_RESTRICT b,
                             T* HWY_RESTRICT da, T* HWY_RESTRICT db, size_t n, bool stream) {
  const D d;
  const size_t nl = hn::Lanes(d);
  constexpr size_t K = kVecs<T>;
  size_t i = 0;
  for (; i + K * nl <= n; i += K * nl) {
    V gv[K], av[K], dv[K], bv[K];
    PrefetchAhead(g + i);
    PrefetchAhead(a + i);
    PrefetchAhead(b + i);
    LoadStep(d, g + i, gv);
    ActStep<true, true>(fn, d, a + i, av, dv);
    LoadStep(d, b + i, bv);
    TEFL_UNROLL_K
    for (size_t k = 0; k < K; ++k) GatedBwdVec(fn, gv[k], av[k], dv[k], bv[k], av[k], bv[k]);
    StoreStep<kNative, kBf16TiesAway<Fn>>(d, av, da + i, stream);
    StoreStep<kNative, kBf16TiesAway<Fn>>(d, bv, db + i, stream);
  }
  for (; i < n; i += nl) {
    const size_t m = std::min(nl, n - i);
    V act, dact, va, vb;
    ActPartial<true, true>(fn, d, a + i, m, &act, &dact);
    GatedBwdVec(fn, LoadPartial(d, g + i, m), act, dact, LoadPartial(d, b + i, m), va, vb);
    StorePartial(d, va, da + i, m);
    StorePartial(d, vb, db + i, m);
  }
}

// ---- Mixed dtypes: fp32 copies of kTile elements at a time ----------------------
template <class T>
HWY_INLINE void ToF32T(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const D d;
  const size_t nl = hn::Lanes(d);
  size_t i = 0;
  for (; i + nl <= n; i += nl) hn::Store(LoadF(d, src + i), d, dst + i);
  for (; i < n; ++i) dst[i] = ScalarLoad(src + i);
}
template <class T>
HWY_INLINE void FromF32T(const float* HWY_RESTRICT src, T* HWY_RESTRICT dst, size_t n) {
  const D d;
  const size_t nl = hn::Lanes(d);
  size_t i = 0;
  for (; i + nl <= n; i += nl) StoreF(hn::Load(d, src + i), d, dst + i);
  for (; i < n; ++i) ScalarStore(src[i], dst + i);
}
// n elements from element `off` of a tensor of dtype t, as fp32 in dst.
HWY_INLINE void ToF32(const void* base, DType t, size_t off, float* dst, size_t n) {
  switch (t) {
    case DType::kF32:
      return ToF32T(static_cast<const float*>(base) + off, dst, n);
    case DType::kBF16:
      return ToF32T(static_cast<const bfloat16_t*>(base) + off, dst, n);
    default:
      return ToF32T(static_cast<const float16_t*>(base) + off, dst, n);
  }
}
HWY_INLINE void FromF32(const float* src, DType t, void* base, size_t off, size_t n) {
  switch (t) {
    case DType::kF32:
      return FromF32T(src, static_cast<float*>(base) + off, n);
    case DType::kBF16:
      return FromF32T(src, static_cast<bfloat16_t*>(base) + off, n);
    default:
      return FromF32T(src, static_cast<float16_t*>(base) + off, n);
  }
}

// ---- Work items per kind -----------------------------------------------------------
// Fwd/Bwd: items are blocks of kBlock elements. GatedFwd/GatedBwd: rows.
// Dbias: blocks of rows (Job::blocks of them).

template <Kind kKind, class Fn, class T, bool kNative = false>
HWY_INLINE void FlatItems(const Fn& fn, const Job& j, int64_t begin, int64_t end) {
  const size_t e0 = size_t(begin * kBlock), e1 = size_t(std::min(end * kBlock, j.n));
  const T* x = static_cast<const T*>(j.x) + e0;
  T* y = static_cast<T*>(j.y) + e0;
  if constexpr (kKind == Kind::kFwd) {
    SpanFwd<Fn, T, kNative>(fn, x, y, e1 - e0, j.stream);
  } else {
    SpanBwd<Fn, T, kNative>(fn, static_cast<const T*>(j.g) + e0, x, y, static_cast<float*>(nullptr), e1 - e0, j.stream);
  }
}

template <Kind kKind, class Fn>
HWY_INLINE void FlatItemsStaged(const Fn& fn, const Job& j, int64_t begin, int64_t end) {
  HWY_ALIGN float bx[kTile], bg[kTile], by[kTile];
  const size_t e1 = size_t(std::min(end * kBlock, j.n));
  for (size_t e = size_t(begin * kBlock); e < e1; e += kTile) {
    const size_t m = std::min(kTile, e1 - e);
    ToF32(j.x, j.tx, e, bx, m);
    if constexpr (kKind == Kind::kFwd) {
      SpanFwd(fn, bx, by, m, false);
    } else {
      ToF32(j.g, j.tg, e, bg, m);
      SpanBwd(fn, bg, bx, by, static_cast<float*>(nullptr), m, false);
    }
    FromF32(by, j.ty, j.y, e, m);
  }
}

template <Kind kKind, class Fn, class T, bool kNative = false>
HWY_INLINE void GatedRows(const Fn& fn, const Job& j, int64_t r0, int64_t r1) {
  const size_t h = size_t(j.h);
  for (int64_t r = r0; r < r1; ++r) {
    const T* a = static_cast<const T*>(j.x) + size_t(r) * 2 * h;
    if constexpr (kKind == Kind::kGatedFwd) {
      SpanGatedFwd<Fn, T, kNative>(fn, a, a + h, static_cast<T*>(j.y) + size_t(r) * h, h, j.stream);
    } else {
      T* da = static_cast<T*>(j.y) + size_t(r) * 2 * h;
      SpanGatedBwd<Fn, T, kNative>(fn, static_cast<const T*>(j.g) + size_t(r) * h, a, a + h, da, da + h, h, j.stream);
    }
  }
}

template <Kind kKind, class Fn>
HWY_INLINE void GatedRowsStaged(const Fn& fn, const Job& j, int64_t r0, int64_t r1) {
  HWY_ALIGN float ba[kTile], bb[kTile], bg[kTile], b0[kTile], b1[kTile];
  const size_t h = size_t(j.h);
  for (int64_t r = r0; r < r1; ++r) {
    const size_t xa = size_t(r) * 2 * h, xb = xa + h;
    for (size_t c = 0; c < h; c += kTile) {
      const size_t m = std::min(kTile, h - c);
      ToF32(j.x, j.tx, xa + c, ba, m);
      ToF32(j.x, j.tx, xb + c, bb, m);
      if constexpr (kKind == Kind::kGatedFwd) {
        SpanGatedFwd(fn, ba, bb, b0, m, false);
        FromF32(b0, j.ty, j.y, size_t(r) * h + c, m);
      } else {
        ToF32(j.g, j.tg, size_t(r) * h + c, bg, m);
        SpanGatedBwd(fn, bg, ba, bb, b0, b1, m, false);
        FromF32(b0, j.ty, j.y, xa + c, m);
        FromF32(b1, j.ty, j.y, xb + c, m);
      }
    }
  }
}

// dbias: rows [r0, r1) of one block into acc (fp32, flushed into the double
// partial every kFlushRows rows).
// acc holds a row in the lane order of SpanBwd<T>'s steps: with two vectors
// per step, element k of a step's first vector is column 2k of the step and
// element k of its second vector column 2k + 1; the tail is in order.
template <class T>
HWY_INLINE void FlushAcc(float* HWY_RESTRICT acc, double* HWY_RESTRICT partial, size_t h) {
  const size_t nl = hn::Lanes(D());
  constexpr size_t K = kVecs<T>;
  size_t c = 0;
  if (K == 2) {
    for (; c + 2 * nl <= h; c += 2 * nl) {
      for (size_t k = 0; k < nl; ++k) {
        partial[c + 2 * k] += double(acc[c + k]);
        partial[c + 2 * k + 1] += double(acc[c + nl + k]);
      }
    }
  }
  for (; c < h; ++c) partial[c] += double(acc[c]);
  std::fill(acc, acc + h, 0.0f);
}

template <class Fn, class T, bool kNative = false>
HWY_INLINE void DbiasRows(const Fn& fn, const Job& j, int64_t r0, int64_t r1, float* acc, double* partial) {
  const size_t h = size_t(j.h);
  for (int64_t r = r0; r < r1; ++r) {
    const size_t off = size_t(r) * h;
    SpanBwd<Fn, T, kNative>(fn, static_cast<const T*>(j.g) + off, static_cast<const T*>(j.x) + off,
                            static_cast<T*>(j.y) + off, acc, h, j.stream);
    if ((r - r0 + 1) % kFlushRows == 0) FlushAcc<T>(acc, partial, h);
  }
  FlushAcc<T>(acc, partial, h);
}

template <class Fn>
HWY_INLINE void DbiasRowsStaged(const Fn& fn, const Job& j, int64_t r0, int64_t r1, float* acc, double* partial) {
  HWY_ALIGN float bx[kTile], bg[kTile], by[kTile];
  const size_t h = size_t(j.h);
  for (int64_t r = r0; r < r1; ++r) {
    for (size_t c = 0; c < h; c += kTile) {
      const size_t m = std::min(kTile, h - c), off = size_t(r) * h + c;
      ToF32(j.x, j.tx, off, bx, m);
      ToF32(j.g, j.tg, off, bg, m);
      SpanBwd(fn, bg, bx, by, acc + c, m, false);
      FromF32(by, j.ty, j.y, off, m);
    }
    if ((r - r0 + 1) % kFlushRows == 0) FlushAcc<float>(acc, partial, h);
  }
  FlushAcc<float>(acc, partial, h);
}

// dbias: rows(r0, r1, acc, partial) for each block of rows in [begin, end).
template <class RowsFn>
HWY_INLINE void ForDbiasBlocks(const Job& j, int64_t begin, int64_t end, const RowsFn& rows) {
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t r0 = j.rows * blk / j.blocks, r1 = j.rows * (blk + 1) / j.blocks;
    rows(r0, r1, j.acc + size_t(blk) * size_t(j.h), j.partial + size_t(blk) * size_t(j.h));
  }
}

// Items [begin, end) of a call of kind kKind with activation functor fn.
template <Kind kKind, class Fn>
HWY_NOINLINE void RunItems(const Fn& fn, const Job& j, int64_t begin, int64_t end) {
  const bool f32 = j.fast && j.fast_t == DType::kF32;
  const bool bf16 = j.fast && j.fast_t == DType::kBF16;
  if constexpr (kKind == Kind::kFwd || kKind == Kind::kBwd) {
    if (f32) return FlatItems<kKind, Fn, float>(fn, j, begin, end);
#if TEFL_BF16_NATIVE
    if (bf16 && j.native) return FlatItems<kKind, Fn, bfloat16_t, true>(fn, j, begin, end);
#endif
    if (bf16) return FlatItems<kKind, Fn, bfloat16_t>(fn, j, begin, end);
    return FlatItemsStaged<kKind>(fn, j, begin, end);
  } else if constexpr (kKind == Kind::kGatedFwd || kKind == Kind::kGatedBwd) {
    if (f32) return GatedRows<kKind, Fn, float>(fn, j, begin, end);
#if TEFL_BF16_NATIVE
    if (bf16 && j.native) return GatedRows<kKind, Fn, bfloat16_t, true>(fn, j, begin, end);
#endif
    if (bf16) return GatedRows<kKind, Fn, bfloat16_t>(fn, j, begin, end);
    return GatedRowsStaged<kKind>(fn, j, begin, end);
  } else {
    ForDbiasBlocks(j, begin, end, [&](int64_t r0, int64_t r1, float* acc, double* partial) HWY_ATTR {
      if (f32) {
        DbiasRows<Fn, float>(fn, j, r0, r1, acc, partial);
#if TEFL_BF16_NATIVE
      } else if (bf16 && j.native) {
        DbiasRows<Fn, bfloat16_t, true>(fn, j, r0, r1, acc, partial);
#endif
      } else if (bf16) {
        DbiasRows<Fn, bfloat16_t>(fn, j, r0, r1, acc, partial);
      } else {
        DbiasRowsStaged(fn, j, r0, r1, acc, partial);
      }
    });
  }
}

#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
// Items [begin, end) of an all-bf16 call of kind kKind from kAct's tables
// (Job::table: gelu and geglu forward; the derivatives of gelu, qgelu and
// silu, dbias_ included).
template <Kind kKind, Act kAct>
HWY_NOINLINE void TableItemsOfAct(const Job& j, int64_t begin, int64_t end) {
  if constexpr (kKind == Kind::kFwd || kKind == Kind::kGatedFwd) static_assert(kAct == Act::kGelu);
  if constexpr (kKind == Kind::kFwd) {
    const size_t e0 = size_t(begin * kBlock), e1 = size_t(std::min(end * kBlock, j.n));
    SpanFwdTable(ActTable<kAct, Table::kFwdBf16>(), static_cast<const bfloat16_t*>(j.x) + e0,
                 static_cast<bfloat16_t*>(j.y) + e0, e1 - e0, j.stream);
  } else if constexpr (kKind == Kind::kBwd) {
    FlatItems<kKind, FromTables, bfloat16_t>(FromTables{{}, nullptr, ActTable<kAct, Table::kDAct>()}, j, begin, end);
  } else if constexpr (kKind == Kind::kGatedFwd) {
    GatedRows<kKind, FromTables, bfloat16_t>(FromTables{{}, ActTable<kAct, Table::kAct>(), nullptr}, j, begin, end);
  } else {
    static_assert(kKind == Kind::kDbias);
    const FromTables fn{{}, nullptr, ActTable<kAct, Table::kDAct>()};
    ForDbiasBlocks(j, begin, end, [&](int64_t r0, int64_t r1, float* acc, double* partial) HWY_ATTR {
      DbiasRows<FromTables, bfloat16_t>(fn, j, r0, r1, acc, partial);
    });
  }
}

template <Kind kKind>
HWY_INLINE void TableItems(const Job& j, int64_t begin, int64_t end) {
  if constexpr (kKind == Kind::kFwd || kKind == Kind::kGatedFwd) {
    return TableItemsOfAct<kKind, Act::kGelu>(j, begin, end);  // Kernel sets Job::table for gelu only
  } else {
    switch (j.act) {
      case Act::kGelu:
        return TableItemsOfAct<kKind, Act::kGelu>(j, begin, end);
      case Act::kQGelu:
        return TableItemsOfAct<kKind, Act::kQGelu>(j, begin, end);
      case Act::kSilu:
        return TableItemsOfAct<kKind, Act::kSilu>(j, begin, end);
      default:
        break;  // Kernel sets Job::table for these three only
    }
  }
}
#endif

// The activations of kind kKind (glu and clamped SwiGLU are gated only);
// kFast: the bf16-output exp and reciprocal (the functors' kFast).
template <Kind kKind, bool kFast>
HWY_INLINE void ItemsOfAct(const Job& j, int64_t begin, int64_t end) {
  constexpr bool kGated = kKind == Kind::kGatedFwd || kKind == Kind::kGatedBwd;
  switch (j.act) {
    case Act::kGelu:
      return RunItems<kKind>(GeluFnT<kFast>(), j, begin, end);
    case Act::kQGelu:
      return RunItems<kKind>(SigmoidLinearFnT<kFast>{{}, 1.702f}, j, begin, end);
    case Act::kRelu:
      return RunItems<kKind>(ReluFn(), j, begin, end);
    case Act::kSrelu:
      return RunItems<kKind>(SreluFn(), j, begin, end);
    case Act::kSilu:
      return RunItems<kKind>(SigmoidLinearFnT<kFast>{{}, 1.0f}, j, begin, end);
    case Act::kGlu:
      if constexpr (kGated) return RunItems<kKind>(GluFnT<kFast>(), j, begin, end);
      break;
    case Act::kClamped:
      if constexpr (kGated) return RunItems<kKind>(ClampedFnT<kFast>{j.limit, j.alpha}, j, begin, end);
      break;
  }
}

// bf16 outputs on the one-dtype path take the cheaper sigmoids
// (Job::fast_act); everything else the accurate ones.
template <Kind kKind>
HWY_INLINE void ItemsOfKind(const Job& j, int64_t begin, int64_t end) {
#if HWY_TARGET == HWY_AVX2 || HWY_TARGET == HWY_SSE4
  if constexpr (kKind != Kind::kGatedBwd) {
    if (j.table) return TableItems<kKind>(j, begin, end);
  }
#endif
  if (j.fast_act) return ItemsOfAct<kKind, true>(j, begin, end);
  return ItemsOfAct<kKind, false>(j, begin, end);
}

// ---- Gated FP8 outputs ----------------------------------------------------------
// Rows [r0, r1): a and b loaded as fp32 straight from the input (any float
// dtype), the gated product with the same functors as the non-FP8 op, |y|
// into a max of |bits|, y * scale encoded by fp8_io-inl.h, four vectors per
// 64-byte code store (non-temporal for outputs >= 32 MiB with aligned rows);
// the row tail (< Lanes) goes through LoadPartial and the scalar encoder. One
// atomic amax update per chunk.
template <Fp8Format kF, class Fn, class T>
HWY_NOINLINE void GatedFp8RowsT(const Fn& fn, const Job& j, int64_t r0, int64_t r1) {
  const D d;
  const hn::RebindToUnsigned<D> du;
  const size_t nl = hn::Lanes(d);
  const size_t h = size_t(j.h);
  const V vs = hn::Set(d, j.scale);
  auto m0 = hn::Zero(du), m1 = hn::Zero(du);
  uint32_t m = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const T* HWY_RESTRICT a = static_cast<const T*>(j.x) + size_t(r) * 2 * h;
    const T* HWY_RESTRICT b = a + h;
    uint8_t* HWY_RESTRICT q = static_cast<uint8_t*>(j.y) + size_t(r) * h;
    const auto yv = [&](size_t k) HWY_ATTR { return hn::Mul(fn.Act(LoadF(d, a + k)), fn.Gate(LoadF(d, b + k))); };
    // Four vectors per 64-byte code store (streamed when j.stream).
    const auto body4 = [&](auto stream) HWY_ATTR {
      size_t k = 0;
      for (; k + 4 * nl <= h; k += 4 * nl) {
        PrefetchAhead(a + k, 4 * nl * sizeof(T));
        PrefetchAhead(b + k, 4 * nl * sizeof(T));
        const V y0 = yv(k), y1 = yv(k + nl), y2 = yv(k + 2 * nl), y3 = yv(k + 3 * nl);
        m0 = hn::Max(m0, hn::Max(AbsBits(d, y0), AbsBits(d, y1)));
        m1 = hn::Max(m1, hn::Max(AbsBits(d, y2), AbsBits(d, y3)));
        StoreFp8x4<kF, decltype(stream)::value>(d, y0, y1, y2, y3, vs, q + k);
      }
      return k;
    };
    size_t i = j.stream ? body4(std::true_type()) : body4(std::false_type());
    for (; i + nl <= h; i += nl) {
      const V y0 = yv(i);
      m0 = hn::Max(m0, AbsBits(d, y0));
      StoreFp8<kF>(d, hn::Mul(y0, vs), q + i);
    }
    for (; i < h; i += nl) {
      const size_t mm = std::min(nl, h - i);
      HWY_ALIGN float buf[hn::MaxLanes(D())];
      hn::Store(hn::Mul(fn.Act(LoadPartial(d, a + i, mm)), fn.Gate(LoadPartial(d, b + i, mm))), d, buf);
      for (size_t k = 0; k < mm; ++k) {
        const uint32_t ab = ScalarAbsBits(buf[k]);
        m = ab > m ? ab : m;
        q[i + k] = FloatToFp8(buf[k] * j.scale, kF);
      }
    }
  }
  const uint32_t vm = ReduceAmaxBits(du, hn::Max(m0, m1));
  m = vm > m ? vm : m;
  uint32_t cur = j.amax_bits->load(std::memory_order_relaxed);
  while (m > cur && !j.amax_bits->compare_exchange_weak(cur, m, std::memory_order_relaxed)) {
  }
}

template <Fp8Format kF, class Fn>
HWY_INLINE void GatedFp8Rows(const Fn& fn, const Job& j, int64_t r0, int64_t r1) {
  switch (j.tx) {
    case DType::kF32:
      return GatedFp8RowsT<kF, Fn, float>(fn, j, r0, r1);
    case DType::kBF16:
      return GatedFp8RowsT<kF, Fn, bfloat16_t>(fn, j, r0, r1);
    default:
      return GatedFp8RowsT<kF, Fn, float16_t>(fn, j, r0, r1);
  }
}

template <class Fn>
HWY_INLINE void GatedFp8RowsOf(const Fn& fn, const Job& j, int64_t r0, int64_t r1) {
  if (j.fmt == Fp8Format::kE4M3) {
    GatedFp8Rows<Fp8Format::kE4M3>(fn, j, r0, r1);
  } else {
    GatedFp8Rows<Fp8Format::kE5M2>(fn, j, r0, r1);
  }
}

// Exported: rows [begin, end) of a gated FP8-output call.
void GatedFp8Items(const Job& j, int64_t begin, int64_t end) {
  switch (j.act) {
    case Act::kGelu:
      return GatedFp8RowsOf(GeluFn(), j, begin, end);
    case Act::kQGelu:
      return GatedFp8RowsOf(SigmoidLinearFn{{}, 1.702f}, j, begin, end);
    case Act::kRelu:
      return GatedFp8RowsOf(ReluFn(), j, begin, end);
    case Act::kSrelu:
      return GatedFp8RowsOf(SreluFn(), j, begin, end);
    case Act::kSilu:
      return GatedFp8RowsOf(SigmoidLinearFn{{}, 1.0f}, j, begin, end);
    case Act::kGlu:
      return GatedFp8RowsOf(GluFn(), j, begin, end);
    case Act::kClamped:
      return GatedFp8RowsOf(ClampedFn{j.limit, j.alpha}, j, begin, end);
  }
}

// Exported: work items [begin, end) of a call.
void ActivationItems(const Job& j, int64_t begin, int64_t end) {
  switch (j.kind) {
    case Kind::kFwd:
      return ItemsOfKind<Kind::kFwd>(j, begin, end);
    case Kind::kBwd:
      return ItemsOfKind<Kind::kBwd>(j, begin, end);
    case Kind::kGatedFwd:
      return ItemsOfKind<Kind::kGatedFwd>(j, begin, end);
    case Kind::kGatedBwd:
      return ItemsOfKind<Kind::kGatedBwd>(j, begin, end);
    case Kind::kDbias:
      return ItemsOfKind<Kind::kDbias>(j, begin, end);
  }
}

// Exported: dbias from the blocks' double partials (SumBlocksToDtype).
void DbiasFromPartials(const double* partial, int64_t blocks, size_t h, void* out, DType t) {
  SumBlocksToDtype(partial, blocks, h, h, out, t);
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- Dispatch, threading and registration (compiled once) ------------------
#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(ActivationItems);
HWY_EXPORT(GatedFp8Items);
HWY_EXPORT(DbiasFromPartials);

namespace {

// Output bytes above which outputs are written with non-temporal stores (an
// output larger than a typical L3 is evicted before it is read back anyway,
// and streaming saves the read-for-ownership of every line).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "activation", code, what);
}

void Body(void* ctx, int64_t begin, int64_t end) {
  const Job& j = *static_cast<const Job*>(ctx);
  HWY_DYNAMIC_DISPATCH(ActivationItems)(j, begin, end);
  if (j.stream) hwy::FlushStream();  // order this thread's streamed stores
}

template <Kind kKind, Act kAct>
tefl_status* Kernel(const tefl_call_frame* f, void*) {
  try {
    constexpr bool kGated = kKind == Kind::kGatedFwd || kKind == Kind::kGatedBwd;
    constexpr bool kHasGrad = kKind != Kind::kFwd && kKind != Kind::kGatedFwd;
    const DLTensor* x = f->inputs[kHasGrad ? 1 : 0];
    const DLTensor* g = kHasGrad ? f->inputs[0] : nullptr;
    DLTensor* y = f->outputs[0];
    DLTensor* dbias = kKind == Kind::kDbias ? f->outputs[1] : nullptr;

    Job j{};
    j.kind = kKind;
    j.act = kAct;
    j.tx = DTypeOf(x->dtype);
    j.tg = g ? DTypeOf(g->dtype) : j.tx;
    j.ty = DTypeOf(y->dtype);
    const DType tdb = dbias ? DTypeOf(dbias->dtype) : DType::kF32;
    if (!IsFloatType(j.tx) || !IsFloatType(j.tg) || !IsFloatType(j.ty) || !IsFloatType(tdb))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    j.fast = j.tx == j.tg && j.tx == j.ty && j.tx != DType::kF16;
    j.fast_t = j.tx;
    j.native = j.fast && j.tx == DType::kBF16 && UseBf16NativeStore();
    j.fast_act = j.fast && j.tx == DType::kBF16 && (kKind != Kind::kDbias || tdb == DType::kBF16) &&
                 PortablePathOn(PortablePath::kBf16FastAct);
    // Forward: gelu and geglu only (computed silu and qgelu are as fast as
    // a lookup); no gated backward (two lookups per element were no faster
    // than ActDAct). The tables hold the fp32 path's values, so they serve
    // bf16 dbias of any dbias dtype (fast_act does not).
    constexpr bool kTableAct = kKind == Kind::kFwd || kKind == Kind::kGatedFwd
                                   ? kAct == Act::kGelu
                                   : (kKind == Kind::kBwd || kKind == Kind::kDbias) &&
                                         (kAct == Act::kGelu || kAct == Act::kQGelu || kAct == Act::kSilu);
    j.table = kTableAct && j.fast && j.tx == DType::kBF16 && PortablePathOn(PortablePath::kBf16ActTable);
    j.x = DataPtr(x);
    j.g = g ? DataPtr(g) : nullptr;
    j.y = DataPtr(y);
    const int64_t last = x->shape[x->ndim - 1];
    j.rows = LeadingRows(x);
    j.h = kGated ? last / 2 : last;
    j.n = j.rows * last;
    if (kAct == Act::kClamped) {
      const auto* attrs = static_cast<const tefl_clamped_swiglu_attrs*>(f->attrs);
      j.limit = attrs->limit;
      j.alpha = attrs->alpha;
    }

    // Streaming needs every output span (block, row or half row) to start
    // 64-byte aligned.
    const int64_t esz = int64_t(FloatElemSize(j.ty));
    const int64_t out_bytes = NumElements(y) * esz;
    const int64_t span_bytes = kGated || kKind == Kind::kDbias ? j.h * esz : kBlock * esz;
    j.stream =
        j.fast && out_bytes >= kStreamMinBytes && span_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(j.y) % 64 == 0;
    // Gated backward writes two streams, da and db, h elements apart. With
    // h * size a multiple of 4 KiB (every gated MLP's power-of-two hidden
    // size) and a transcendental activation, streamed stores made the AVX2
    // loop up to 1.9x slower on Zen 3 than regular stores at [8192, 4096]
    // (bf16 dgeglu 60 -> 32 ms; [8192, 4000], not aliased, streams well:
    // docs/perf-activation.md). The memory-bound relu/srelu loops keep
    // streaming (10-20 % faster with it), and so do the AVX-512 kernels,
    // where this was not measured.
    if (kKind == Kind::kGatedBwd && kAct != Act::kRelu && kAct != Act::kSrelu && span_bytes % 4096 == 0 &&
        !CpuHasAvx512Bmi2())
      j.stream = false;

    if (kKind == Kind::kDbias) {
      const size_t h = size_t(j.h);
      // Fixed blocks: the partition depends only on (rows, num_threads).
      j.blocks = j.rows == 0 ? 0 : std::min<int64_t>(std::max<int64_t>(1, f->host->num_threads()), j.rows);
      std::vector<double> partial(size_t(j.blocks) * h, 0.0);
      std::vector<float> acc(size_t(j.blocks) * h, 0.0f);
      j.partial = partial.data();
      j.acc = acc.data();
      if (j.blocks > 0 && h > 0) f->host->parallel_for(j.blocks, 1, Body, &j);
      HWY_DYNAMIC_DISPATCH(DbiasFromPartials)(partial.data(), j.blocks, h, DataPtr(dbias), tdb);
      return nullptr;
    }
    if (j.n == 0) return nullptr;
    if (kGated) {
      // Rows of at least ~32 KiB of input per chunk.
      const int64_t grain = std::max<int64_t>(1, (int64_t(8) << 10) / std::max<int64_t>(1, j.h));
      f->host->parallel_for(j.rows, grain, Body, &j);
    } else {
      const int64_t items = (j.n + kBlock - 1) / kBlock;
      f->host->parallel_for(items, 2, Body, &j);
    }
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

void Fp8Body(void* ctx, int64_t begin, int64_t end) {
  const Job& j = *static_cast<const Job*>(ctx);
  HWY_DYNAMIC_DISPATCH(GatedFp8Items)(j, begin, end);
  if (j.stream) hwy::FlushStream();  // order this thread's streamed stores
}

// glu_fp8 ... clamped_swiglu_fp8: in (input[N.., 2H], scale) -> out
// (output[N.., H] FP8, amax, scale_inv).
template <Act kAct>
tefl_status* GatedFp8Kernel(const tefl_call_frame* f, void*) {
  try {
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    Job j{};
    j.kind = Kind::kGatedFwd;
    j.act = kAct;
    j.tx = DTypeOf(x->dtype);
    j.tg = j.tx;
    j.ty = DTypeOf(y->dtype);
    if (!IsFloatType(j.tx) || (j.ty != DType::kE4M3 && j.ty != DType::kE5M2))
      return Status(f, TEFL_UNSUPPORTED, "input must be fp32/fp16/bf16 and output E4M3/E5M2");
    j.x = DataPtr(x);
    j.y = DataPtr(y);
    j.rows = LeadingRows(x);
    j.h = x->shape[x->ndim - 1] / 2;
    j.n = j.rows * j.h;
    if (kAct == Act::kClamped) {
      const auto* attrs = static_cast<const tefl_clamped_swiglu_attrs*>(f->attrs);
      j.limit = attrs->limit;
      j.alpha = attrs->alpha;
    }
    std::atomic<uint32_t> amax_bits{0};
    j.fmt = j.ty == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    j.scale = *static_cast<const float*>(DataPtr(f->inputs[1]));
    j.amax_bits = &amax_bits;
    // Streamed FP8 rows: each must start 64-byte aligned.
    j.stream = j.n >= kStreamMinBytes && j.h % 64 == 0 && reinterpret_cast<uintptr_t>(j.y) % 64 == 0;
    if (j.n > 0) {
      const int64_t grain = std::max<int64_t>(1, (int64_t(8) << 10) / std::max<int64_t>(1, j.h));
      f->host->parallel_for(j.rows, grain, Fp8Body, &j);
    }
    const uint32_t bits = amax_bits.load();
    *static_cast<float*>(DataPtr(f->outputs[1])) =
        bits > 0x7F800000u ? std::bit_cast<float>(0x7FC00000u) : std::bit_cast<float>(bits);
    *static_cast<float*>(DataPtr(f->outputs[2])) = 1.0f / j.scale;
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

}  // namespace

tefl_status* RegisterPortableActivation(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"gelu", Kernel<Kind::kFwd, Act::kGelu>},
      {"qgelu", Kernel<Kind::kFwd, Act::kQGelu>},
      {"relu", Kernel<Kind::kFwd, Act::kRelu>},
      {"srelu", Kernel<Kind::kFwd, Act::kSrelu>},
      {"silu", Kernel<Kind::kFwd, Act::kSilu>},
      {"dgelu", Kernel<Kind::kBwd, Act::kGelu>},
      {"dqgelu", Kernel<Kind::kBwd, Act::kQGelu>},
      {"drelu", Kernel<Kind::kBwd, Act::kRelu>},
      {"dsrelu", Kernel<Kind::kBwd, Act::kSrelu>},
      {"dsilu", Kernel<Kind::kBwd, Act::kSilu>},
      {"glu", Kernel<Kind::kGatedFwd, Act::kGlu>},
      {"geglu", Kernel<Kind::kGatedFwd, Act::kGelu>},
      {"qgeglu", Kernel<Kind::kGatedFwd, Act::kQGelu>},
      {"reglu", Kernel<Kind::kGatedFwd, Act::kRelu>},
      {"sreglu", Kernel<Kind::kGatedFwd, Act::kSrelu>},
      {"swiglu", Kernel<Kind::kGatedFwd, Act::kSilu>},
      {"clamped_swiglu", Kernel<Kind::kGatedFwd, Act::kClamped>},
      {"dglu", Kernel<Kind::kGatedBwd, Act::kGlu>},
      {"dgeglu", Kernel<Kind::kGatedBwd, Act::kGelu>},
      {"dqgeglu", Kernel<Kind::kGatedBwd, Act::kQGelu>},
      {"dreglu", Kernel<Kind::kGatedBwd, Act::kRelu>},
      {"dsreglu", Kernel<Kind::kGatedBwd, Act::kSrelu>},
      {"dswiglu", Kernel<Kind::kGatedBwd, Act::kSilu>},
      {"clamped_dswiglu", Kernel<Kind::kGatedBwd, Act::kClamped>},
      {"dbias_dgelu", Kernel<Kind::kDbias, Act::kGelu>},
      {"dbias_dsilu", Kernel<Kind::kDbias, Act::kSilu>},
      {"dbias_drelu", Kernel<Kind::kDbias, Act::kRelu>},
      {"dbias_dqgelu", Kernel<Kind::kDbias, Act::kQGelu>},
      {"dbias_dsrelu", Kernel<Kind::kDbias, Act::kSrelu>},
      {"glu_fp8", GatedFp8Kernel<Act::kGlu>},
      {"geglu_fp8", GatedFp8Kernel<Act::kGelu>},
      {"qgeglu_fp8", GatedFp8Kernel<Act::kQGelu>},
      {"reglu_fp8", GatedFp8Kernel<Act::kRelu>},
      {"sreglu_fp8", GatedFp8Kernel<Act::kSrelu>},
      {"swiglu_fp8", GatedFp8Kernel<Act::kSilu>},
      {"clamped_swiglu_fp8", GatedFp8Kernel<Act::kClamped>},
  };
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
