// default.portable normalization kernels: layernorm_fwd/bwd, rmsnorm_fwd/bwd,
// rmsnorm_bwd_add (maths in spec/ops.md, "Normalization").
//
// Google Highway with runtime ISA dispatch (foreach_target.h): this file is
// compiled once per x86 target Highway knows, and HWY_DYNAMIC_DISPATCH picks
// the best one the CPU supports. Rows are spread over the host thread pool.
//
// Numerics:
//  - Row statistics (sum, sum of squares, mdy, mdyy) are fp32 vector sums
//    over short chunks added into double (at most 16 terms per lane before a
//    chunk is added): relative error ~1e-7, far inside the tolerances, at
//    memory speed (an f32 -> f64 conversion per element bounded these loops).
//    Forward rows whose fp32 sums are not finite or whose var + eps is below
//    2^-100 are summed again all in double, so rows of huge (|x| ~ 1e30, x^2
//    overflows fp32) or tiny (1e-30) magnitude still match a double-precision
//    reference. LayerNorm sums x - m for a shift m near the mean: in one pass
//    with m = the mean of the row's head when that is within a standard
//    deviation of the mean, else in two (see RowMeanVar).
//  - bf16 x and z: one u32 lane holds a pair of elements, no shuffles
//    (FwdRowBf16Pairs); bf16 gamma/beta are read in place, other dtypes
//    converted once per call (vectorised). The backward keeps its working
//    memory per calling thread (BwdBuffers).
//  - Elementwise outputs are computed in fp32 and rounded once to the output
//    dtype (round to nearest even, NaN stays NaN). z = (x - mu_f) *
//    (rsigma_f * g) + beta with fp32 mu_f, as TE does: rows with
//    |mean| >> stddev (~1e2 and up) lose the low bits of x - mu in z.
//  - dgamma/dbeta: rows are split into num_threads() fixed blocks, each block
//    sums its rows into a private double [H] buffer, and the buffers are added
//    in block order: deterministic for a given thread count.
//
// Host contract (validated before the call): CPU tensors, compact row-major,
// element-aligned data, float dtypes (fp32/fp16/bf16, each tensor on its own;
// mu and rsigma fp32), outputs do not alias inputs except rmsnorm_bwd_add's dx
// exactly over add, H = last dim of x >= 1.
#include <hwy/cache_control.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <type_traits>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_NORMALIZATION_SHARED_
#define TEFL_BACKENDS_PORTABLE_NORMALIZATION_SHARED_
namespace tefl::backends {
namespace {

// One forward call. g is gamma (+1 with zero_centered_gamma) and b is beta,
// both converted to fp32 once per call; b is NULL for RMSNorm.
struct FwdArgs {
  bool layernorm;
  DType tx, tz;
  int64_t h;
  double eps;
  const void* x;
  void* z;
  const float* g;
  const float* b;
  // bf16 x and z (the pair loop, FwdRowBf16Pairs): bf16 gamma/beta are read
  // in place (g16/b16, plus 1 when plus_one) and g/b are NULL; gamma/beta of
  // other dtypes also come split into even and odd elements, h / 2 each
  // (g_pairs = [g0 g2 g4 ... | g1 g3 g5 ...]), the lane order of a u32 load
  // of bf16 pairs.
  const uint16_t* g16;
  const uint16_t* b16;
  bool plus_one;
  const float* g_pairs;
  const float* b_pairs;
  float* mu;  // NULL for RMSNorm
  float* rsigma;
  bool stream;  // non-temporal z stores (large outputs, aligned rows)
  // rmsnorm_fwd_fp8 / layernorm_fwd_fp8: z is FP8 (fp8 set): z = fp8(z32 *
  // scale), amax = max |z32| folded into *amax_bits (max of |bits|).
  bool fp8;
  Fp8Format fmt;
  float scale;
  std::atomic<uint32_t>* amax_bits;
};

// Backward scratch per block, in rows of h floats (dz, x, add, dx as fp32;
// the fp32 column sums of dgamma and dbeta), and the spans of its fp32 sums.
constexpr size_t kBwdScratchRows = 6;
constexpr size_t kBwdChunk = 256;
constexpr int64_t kBwdFoldRows = 16;

// One backward call. add is NULL except for rmsnorm_bwd_add; mu is NULL for
// RMSNorm; dgamma/dbeta go to per-block double partials, not to tensors.
struct BwdArgs {
  bool layernorm;
  DType tdz, tx, tadd, tdx;
  int64_t h;
  const void* dz;
  const void* x;
  const void* add;
  const float* mu;
  const float* rsigma;
  const float* g;
  void* dx;
  bool same;    // dz, x, dx (and add) share one dtype: rows are read and written in it
  bool stream;  // non-temporal dx stores (large outputs, aligned rows; dx written in place by BwdRow)
};

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_NORMALIZATION_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/normalization.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/fp8_io-inl.h"
#include "backends/portable/simd_io-inl.h"

// ---- Per-target kernels ------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// ---- Row statistics ----------------------------------------------------------

// 2 * Lanes(df) elements from p as two fp32 vectors, in an unspecified lane
// order (sums do not care). For bf16 a u32 lane holds two values:
// `bits << 16` and `bits & 0xFFFF0000` are both of them, with no shuffle.
template <class DF, class T>
HWY_INLINE void Load2(DF df, const T* HWY_RESTRICT p, hn::Vec<DF>& a, hn::Vec<DF>& b) {
  a = LoadF(df, p);
  b = LoadF(df, p + hn::Lanes(df));
}
template <class DF>
HWY_INLINE void Load2(DF df, const bfloat16_t* HWY_RESTRICT p, hn::Vec<DF>& a, hn::Vec<DF>& b) {
  const hn::RebindToUnsigned<DF> du;
  const auto w = hn::LoadU(du, reinterpret_cast<const uint32_t*>(p));
  a = hn::BitCast(df, hn::ShiftLeft<16>(w));
  b = hn::BitCast(df, hn::And(w, hn::Set(du, 0xFFFF0000u)));
}

// The double statistics promote half-width fp32 vectors (as many lanes as a
// double vector); four accumulators hide the add latency.

// sum(x) in double.
template <class T>
HWY_INLINE double RowSum(const T* HWY_RESTRICT x, size_t h) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t n = hn::Lanes(dd);
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd), s2 = hn::Zero(dd), s3 = hn::Zero(dd);
  hn::Vec<decltype(dfh)> f0, f1, f2, f3;
  size_t i = 0;
  for (; i + 4 * n <= h; i += 4 * n) {
    Load2(dfh, x + i, f0, f1);
    Load2(dfh, x + i + 2 * n, f2, f3);
    s0 = hn::Add(s0, hn::PromoteTo(dd, f0));
    s1 = hn::Add(s1, hn::PromoteTo(dd, f1));
    s2 = hn::Add(s2, hn::PromoteTo(dd, f2));
    s3 = hn::Add(s3, hn::PromoteTo(dd, f3));
  }
  double s = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < h; ++i) s += double(ScalarLoad(x + i));
  return s;
}

// sum(x^2) in double (RMSNorm).
template <class T>
HWY_INLINE double RowSumSq(const T* HWY_RESTRICT x, size_t h) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t n = hn::Lanes(dd);
  auto s0 = hn::Zero(dd), s1 = hn::Zero(dd), s2 = hn::Zero(dd), s3 = hn::Zero(dd);
  hn::Vec<decltype(dfh)> f0, f1, f2, f3;
  size_t i = 0;
  for (; i + 4 * n <= h; i += 4 * n) {
    Load2(dfh, x + i, f0, f1);
    Load2(dfh, x + i + 2 * n, f2, f3);
    const auto d0 = hn::PromoteTo(dd, f0), d1 = hn::PromoteTo(dd, f1);
    const auto d2 = hn::PromoteTo(dd, f2), d3 = hn::PromoteTo(dd, f3);
    s0 = hn::MulAdd(d0, d0, s0);
    s1 = hn::MulAdd(d1, d1, s1);
    s2 = hn::MulAdd(d2, d2, s2);
    s3 = hn::MulAdd(d3, d3, s3);
  }
  double s = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < h; ++i) {
    const double d = double(ScalarLoad(x + i));
    s += d * d;
  }
  return s;
}

// Approximate sum(x) in fp32: LayerNorm's first pass only needs a shift m
// near the mean (see RowMeanVar), and fp32 adds avoid the conversions.
// Non-finite when x has inf/NaN or the fp32 sum overflows.
template <class T>
HWY_INLINE float RowSumF32(const T* HWY_RESTRICT x, size_t h) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
  hn::Vec<decltype(df)> f0, f1, f2, f3;
  size_t i = 0;
  for (; i + 4 * n <= h; i += 4 * n) {
    Load2(df, x + i, f0, f1);
    Load2(df, x + i + 2 * n, f2, f3);
    s0 = hn::Add(s0, f0);
    s1 = hn::Add(s1, f1);
    s2 = hn::Add(s2, f2);
    s3 = hn::Add(s3, f3);
  }
  float s = hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3))));
  for (; i < h; ++i) s += ScalarLoad(x + i);
  return s;
}

// One step of the shifted sums (fp32 or double lanes): q_k += d_k^2, e0 +=
// d0 + d1, e1 += d2 + d3.
template <class V>
HWY_INLINE void AddShifted(V d0, V d1, V d2, V d3, V& q0, V& q1, V& q2, V& q3, V& e0, V& e1) {
  q0 = hn::MulAdd(d0, d0, q0);
  q1 = hn::MulAdd(d1, d1, q1);
  q2 = hn::MulAdd(d2, d2, q2);
  q3 = hn::MulAdd(d3, d3, q3);
  e0 = hn::Add(e0, hn::Add(d0, d1));
  e1 = hn::Add(e1, hn::Add(d2, d3));
}

// Elements [i, h) of the shifted sums, one at a time in double (the rows'
// tails past the last full vector step).
template <class T>
HWY_INLINE void ShiftedSumsTail(const T* HWY_RESTRICT x, size_t i, size_t h, double m, double& sum_d, double& sum_dd) {
  for (; i < h; ++i) {
    const double d = double(ScalarLoad(x + i)) - m;
    sum_d += d;
    sum_dd += d * d;
  }
}

// sum(x - m) and sum((x - m)^2) in double. For fp32 x and m, x - m is exact
// in double (barring exponent gaps over 29 bits: then rounded once). It is
// computed as x * 1 + (-m): an FMA rounds exactly like the subtraction but
// issues on the FMA pipes, which the conversions leave idle.
template <class T>
HWY_INLINE void RowShiftedSums(const T* HWY_RESTRICT x, size_t h, double m, double& sum_d, double& sum_dd) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;
  const size_t n = hn::Lanes(dd);
  const auto one = hn::Set(dd, 1.0);
  const auto neg_m = hn::Set(dd, -m);
  auto q0 = hn::Zero(dd), q1 = hn::Zero(dd), q2 = hn::Zero(dd), q3 = hn::Zero(dd);
  auto e0 = hn::Zero(dd), e1 = hn::Zero(dd);
  hn::Vec<decltype(dfh)> f0, f1, f2, f3;
  size_t i = 0;
  for (; i + 4 * n <= h; i += 4 * n) {
    Load2(dfh, x + i, f0, f1);
    Load2(dfh, x + i + 2 * n, f2, f3);
    const auto d0 = hn::MulAdd(hn::PromoteTo(dd, f0), one, neg_m);
    const auto d1 = hn::MulAdd(hn::PromoteTo(dd, f1), one, neg_m);
    const auto d2 = hn::MulAdd(hn::PromoteTo(dd, f2), one, neg_m);
    const auto d3 = hn::MulAdd(hn::PromoteTo(dd, f3), one, neg_m);
    AddShifted(d0, d1, d2, d3, q0, q1, q2, q3, e0, e1);
  }
  sum_d = hn::GetLane(hn::SumOfLanes(dd, hn::Add(e0, e1)));
  sum_dd = hn::GetLane(hn::SumOfLanes(dd, hn::Add(hn::Add(q0, q1), hn::Add(q2, q3))));
  ShiftedSumsTail(x, i, h, m, sum_d, sum_dd);
}

// ---- fp32 statistics with double partials (the common case) ------------------
// Each fp32 lane accumulates at most kStatAddsPerLane terms before its chunk's
// sum is added into a double, so a partial carries a relative rounding error
// of a few 1e-7 (bound: kStatAddsPerLane * 2^-24 ~ 1e-6), a fraction of the
// statistics' rtol (5e-5) and of what fp32 z needs (5e-6): without the
// f32 -> f64 conversion of every element, the loops run at memory speed on
// AVX2 (bf16 [64, 4096], one thread: RMSNorm statistics took 35 % of the
// call's time in double; docs/performance.md, session 22). The callers fall
// back to the all-double loops above when a sum is not finite (inf/NaN in x,
// or an fp32 partial overflowed) or var + eps is so small that fp32 underflow
// in the squares could matter (below 2^-100; with eps >= 1e-30 never).
constexpr size_t kStatAddsPerLane = 16;
constexpr double kStatFloor = 0x1p-100;

// Lanes of v summed (in fp32: a few more roundings per chunk), as a double.
template <class DF>
HWY_INLINE double SumLanesToDouble(DF df, hn::Vec<DF> v) {
  return double(hn::GetLane(hn::SumOfLanes(df, v)));
}

// sum(x^2), fp32 chunks.
template <class T>
HWY_INLINE double RowSumSqChunked(const T* HWY_RESTRICT x, size_t h) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  const size_t full = h - h % (4 * n);
  double total = 0.0;
  hn::Vec<decltype(df)> f0, f1, f2, f3;
  size_t i = 0;
  while (i < full) {
    const size_t end = std::min(full, i + kStatAddsPerLane * 4 * n);
    auto s0 = hn::Zero(df), s1 = hn::Zero(df), s2 = hn::Zero(df), s3 = hn::Zero(df);
    for (; i < end; i += 4 * n) {
      Load2(df, x + i, f0, f1);
      Load2(df, x + i + 2 * n, f2, f3);
      s0 = hn::MulAdd(f0, f0, s0);
      s1 = hn::MulAdd(f1, f1, s1);
      s2 = hn::MulAdd(f2, f2, s2);
      s3 = hn::MulAdd(f3, f3, s3);
    }
    total += SumLanesToDouble(df, hn::Add(hn::Add(s0, s1), hn::Add(s2, s3)));
  }
  for (; i < h; ++i) {
    const double d = double(ScalarLoad(x + i));
    total += d * d;
  }
  return total;
}

// sum(x - m) and sum((x - m)^2) with d = x - m in fp32, fp32 chunks. m is
// within fp32 rounding of the mean, so x - m is exact wherever x is within a
// factor 2 of m (Sterbenz) and rounded once elsewhere, where |x - m| >= |m| / 2.
template <class T>
HWY_INLINE void RowShiftedSumsChunked(const T* HWY_RESTRICT x, size_t h, float m, double& sum_d, double& sum_dd) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  const size_t full = h - h % (4 * n);
  const auto vm = hn::Set(df, m);
  double s1 = 0.0, s2 = 0.0;
  hn::Vec<decltype(df)> f0, f1, f2, f3;
  size_t i = 0;
  while (i < full) {
    const size_t end = std::min(full, i + kStatAddsPerLane * 4 * n);
    auto q0 = hn::Zero(df), q1 = hn::Zero(df), q2 = hn::Zero(df), q3 = hn::Zero(df);
    auto e0 = hn::Zero(df), e1 = hn::Zero(df);
    for (; i < end; i += 4 * n) {
      Load2(df, x + i, f0, f1);
      Load2(df, x + i + 2 * n, f2, f3);
      const auto d0 = hn::Sub(f0, vm), d1 = hn::Sub(f1, vm), d2 = hn::Sub(f2, vm), d3 = hn::Sub(f3, vm);
      AddShifted(d0, d1, d2, d3, q0, q1, q2, q3, e0, e1);
    }
    s1 += SumLanesToDouble(df, hn::Add(e0, e1));
    s2 += SumLanesToDouble(df, hn::Add(hn::Add(q0, q1), hn::Add(q2, q3)));
  }
  ShiftedSumsTail(x, i, h, double(m), s1, s2);
  sum_d = s1;
  sum_dd = s2;
}

// An fp32-chunked result is used when finite and var + eps is not tiny.
HWY_INLINE bool ChunkedSumUsable(double sum_sq, double inv_h, double eps) {
  return sum_sq < HUGE_VAL && sum_sq * inv_h + eps >= kStatFloor;  // false for NaN
}

// The mean of the row's first 4 vectors (fewer: all of it) in fp32: the shift
// of LayerNorm's one-pass sums (RowMeanVar).
template <class T>
HWY_INLINE float RowHeadMean(const T* HWY_RESTRICT x, size_t h) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  if (h < 4 * n) return RowSumF32(x, h) / float(h);
  hn::Vec<decltype(df)> f0, f1, f2, f3;
  Load2(df, x, f0, f1);
  Load2(df, x + 2 * n, f2, f3);
  return hn::GetLane(hn::SumOfLanes(df, hn::Add(hn::Add(f0, f1), hn::Add(f2, f3)))) / float(4 * n);
}

// LayerNorm mean and population variance. With d = x - m for a shift m,
// mean = m + sum(d)/h and var = sum(d^2)/h - (sum(d)/h)^2, from fp32 chunk
// sums (RowShiftedSumsChunked):
//  - One pass, m = the mean of the row's head (RowHeadMean), when m is within
//    one standard deviation of the mean: the subtraction then cancels at most
//    half of sum(d^2)/h. Rows whose head is far off (a constant row, an
//    outlier at the start) take the two passes below.
//  - Two passes: m = the mean estimated in fp32 (the double sum when that is
//    not finite), off the mean by fp32 rounding only. When the chunk sums are
//    not usable, they are summed again in double with d exact (relative error
//    ~ h * 2^-53 * (1 + (mean - m)^2 / var)): the result matches the two-pass
//    double reference.
// inf/NaN in x give a non-finite mean and a NaN variance, as the reference.
template <class T>
HWY_INLINE void RowMeanVar(const T* HWY_RESTRICT x, size_t h, double eps, double& mean, double& var) {
  const double inv_h = 1.0 / double(h);
  double sum_d, sum_dd;
  const float head = RowHeadMean(x, h);
  if (std::isfinite(head)) {
    RowShiftedSumsChunked(x, h, head, sum_d, sum_dd);
    const double dm = sum_d * inv_h;
    if (ChunkedSumUsable(sum_dd, inv_h, eps) && dm * dm <= 0.5 * (sum_dd * inv_h)) {
      mean = double(head) + dm;
      var = std::max(sum_dd * inv_h - dm * dm, 0.0);
      return;
    }
  }
  double m = double(RowSumF32(x, h)) * inv_h;
  if (!std::isfinite(m)) {
    m = RowSum(x, h) * inv_h;  // overflow in fp32, or inf/NaN in x
    if (!std::isfinite(m)) {
      mean = m;
      var = std::numeric_limits<double>::quiet_NaN();
      return;
    }
  }
  const float mf = float(m);
  m = double(mf);  // keeps x - m exact in double
  RowShiftedSumsChunked(x, h, mf, sum_d, sum_dd);
  if (!ChunkedSumUsable(sum_dd, inv_h, eps)) RowShiftedSums(x, h, m, sum_d, sum_dd);
  const double dm = sum_d * inv_h;
  mean = m + dm;
  var = std::max(sum_dd * inv_h - dm * dm, 0.0);
}

// One row's mu (LayerNorm; 0 for RMSNorm) and rsigma = 1/sqrt(var + eps),
// computed in double from the sums and rounded to float once (the kernels
// store these).
template <bool kLayerNorm, class T>
HWY_INLINE void RowStats(const T* HWY_RESTRICT x, size_t h, double eps, float& mu, float& rsigma) {
  double mean = 0.0, var;
  if (kLayerNorm) {
    RowMeanVar(x, h, eps, mean, var);
  } else {
    const double inv_h = 1.0 / double(h);
    double sum_sq = RowSumSqChunked(x, h);
    if (!ChunkedSumUsable(sum_sq, inv_h, eps)) sum_sq = RowSumSq(x, h);
    var = sum_sq * inv_h;
  }
  mu = float(mean);
  rsigma = float(1.0 / std::sqrt(var + eps));
}

// ---- Forward -----------------------------------------------------------------
// x - m when kCenter (LayerNorm), else x (RMSNorm).
template <bool kCenter, class V>
HWY_INLINE V Center(V v, V m) {
  return kCenter ? hn::Sub(v, m) : v;
}

// z for one row of bf16 x into bf16 z. A u32 lane holds the pair (x[2k],
// x[2k + 1]): bits << 16 and bits & 0xFFFF0000 are both as fp32 with no
// shuffle, gamma and beta come in the same order (bf16 read the same way,
// kRaw; else FwdArgs::g_pairs), and the rounded pair goes back into one u32
// lane. The arithmetic is FwdRowsT's, so z is bit for bit what that loop
// gives. Every NaN here has a zero low half (bf16 data, g_pairs' NaNs
// canonicalised by SplitPairs, default NaNs), so the rounding needs no NaN
// select (RoundBF16HiFromBF16Data).
template <bool kLayerNorm, bool kRaw, bool kPlusOne>
HWY_INLINE void FwdRowBf16Pairs(const FwdArgs& a, const bfloat16_t* HWY_RESTRICT x, bfloat16_t* HWY_RESTRICT z,
                                const bfloat16_t* HWY_RESTRICT next, float mu_f, float rs_f) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nf = hn::Lanes(df);
  const size_t h = size_t(a.h);
  const size_t hp = h / 2;
  const auto vmu = hn::Set(df, mu_f);
  const auto vrs = hn::Set(df, rs_f);
  const auto hi_mask = hn::Set(du, 0xFFFF0000u);
  const auto one = hn::Set(df, 1.0f);
  const uint32_t* HWY_RESTRICT xu = reinterpret_cast<const uint32_t*>(x);
  uint32_t* HWY_RESTRICT zu = reinterpret_cast<uint32_t*>(z);
  const uint32_t* HWY_RESTRICT gu = reinterpret_cast<const uint32_t*>(a.g16);
  const uint32_t* HWY_RESTRICT bu = reinterpret_cast<const uint32_t*>(a.b16);
  const bool stream = a.stream;
  size_t i = 0;
  for (; i + 2 * nf <= h; i += 2 * nf) {
    __builtin_prefetch(next + i, 0, 2);
    const size_t j = i / 2;
    const auto w = hn::LoadU(du, xu + j);
    const auto xe = Center<kLayerNorm>(hn::BitCast(df, hn::ShiftLeft<16>(w)), vmu);
    const auto xo = Center<kLayerNorm>(hn::BitCast(df, hn::And(w, hi_mask)), vmu);
    hn::Vec<decltype(df)> ge, go, be, bo;
    if constexpr (kRaw) {
      const auto gw = hn::LoadU(du, gu + j);
      ge = hn::BitCast(df, hn::ShiftLeft<16>(gw));
      go = hn::BitCast(df, hn::And(gw, hi_mask));
      if constexpr (kPlusOne) {
        ge = hn::Add(ge, one);
        go = hn::Add(go, one);
      }
      if constexpr (kLayerNorm) {
        const auto bw = hn::LoadU(du, bu + j);
        be = hn::BitCast(df, hn::ShiftLeft<16>(bw));
        bo = hn::BitCast(df, hn::And(bw, hi_mask));
      }
    } else {
      ge = hn::LoadU(df, a.g_pairs + j);
      go = hn::LoadU(df, a.g_pairs + hp + j);
      if constexpr (kLayerNorm) {
        be = hn::LoadU(df, a.b_pairs + j);
        bo = hn::LoadU(df, a.b_pairs + hp + j);
      }
    }
    const auto gse = hn::Mul(vrs, ge), gso = hn::Mul(vrs, go);
    const auto ze = kLayerNorm ? hn::MulAdd(xe, gse, be) : hn::Mul(xe, gse);
    const auto zo = kLayerNorm ? hn::MulAdd(xo, gso, bo) : hn::Mul(xo, gso);
    const auto out =
        hn::Or(hn::ShiftRight<16>(RoundBF16HiFromBF16Data(ze, df)), hn::And(RoundBF16HiFromBF16Data(zo, df), hi_mask));
    if (stream) {  // chosen only when rows are aligned and h % (2 * nf) == 0
      hn::Stream(out, du, zu + j);
    } else {
      hn::StoreU(out, du, zu + j);
    }
  }
  for (; i < h; ++i) {
    float g, b = 0.0f;
    if constexpr (kRaw) {
      g = ScalarLoad(reinterpret_cast<const bfloat16_t*>(a.g16) + i);
      if constexpr (kPlusOne) g += 1.0f;
      if constexpr (kLayerNorm) b = ScalarLoad(reinterpret_cast<const bfloat16_t*>(a.b16) + i);
    } else {
      g = a.g[i];
      if constexpr (kLayerNorm) b = a.b[i];
    }
    float zv = (kLayerNorm ? ScalarLoad(x + i) - mu_f : ScalarLoad(x + i)) * (rs_f * g);
    if (kLayerNorm) zv += b;
    ScalarStore(zv, z + i);
  }
}

// Rows [r0, r1): the statistics read the row (LayerNorm twice), z reads it
// again from L1/L2.
template <bool kLayerNorm, class TX, class TZ>
HWY_NOINLINE void FwdRowsT(const FwdArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const size_t h = size_t(a.h);
  const bool stream = a.stream;
  const float* HWY_RESTRICT g = a.g;
  const float* HWY_RESTRICT b = a.b;
  for (int64_t r = r0; r < r1; ++r) {
    const TX* HWY_RESTRICT x = static_cast<const TX*>(a.x) + size_t(r) * h;
    TZ* HWY_RESTRICT z = static_cast<TZ*>(a.z) + size_t(r) * h;

    float mu_f, rs_f;
    RowStats<kLayerNorm>(x, h, a.eps, mu_f, rs_f);
    if (kLayerNorm) a.mu[r] = mu_f;
    a.rsigma[r] = rs_f;

    // The z loops touch the next row (this row again for the chunk's last
    // row) at least once per 64 bytes: all of it is prefetched into L2 while
    // this row is computed, so its memory traffic overlaps the arithmetic.
    const TX* HWY_RESTRICT next = r + 1 < r1 ? x + h : x;
    if constexpr (std::is_same_v<TX, bfloat16_t> && std::is_same_v<TZ, bfloat16_t>) {
      if (a.g16 == nullptr) {
        FwdRowBf16Pairs<kLayerNorm, false, false>(a, x, z, next, mu_f, rs_f);
      } else if (a.plus_one) {
        FwdRowBf16Pairs<kLayerNorm, true, true>(a, x, z, next, mu_f, rs_f);
      } else {
        FwdRowBf16Pairs<kLayerNorm, true, false>(a, x, z, next, mu_f, rs_f);
      }
      continue;
    }

    const auto vmu = hn::Set(df, mu_f);
    const auto vrs = hn::Set(df, rs_f);
    const auto zvec = [&](size_t j) HWY_ATTR {
      const auto xc = Center<kLayerNorm>(LoadF(df, x + j), vmu);
      const auto gs = hn::Mul(vrs, hn::LoadU(df, g + j));
      return kLayerNorm ? hn::MulAdd(xc, gs, hn::LoadU(df, b + j)) : hn::Mul(xc, gs);
    };
    // One copy of the loops per store kind (plain or streaming).
    const auto write_row = [&](auto store) HWY_ATTR {
      size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
      if constexpr (std::is_same_v<TZ, bfloat16_t>) {
        // Two fp32 vectors -> one full vector of bf16.
        const hn::Repartition<uint16_t, decltype(df)> du16;
        uint16_t* HWY_RESTRICT zu = reinterpret_cast<uint16_t*>(z);
        for (; i + 2 * nf <= h; i += 2 * nf) {
          __builtin_prefetch(next + i, 0, 2);
          if constexpr (sizeof(TX) == 4) __builtin_prefetch(next + i + nf, 0, 2);
          store(RoundToBF16Bits2(zvec(i), zvec(i + nf), df), du16, zu + i);
        }
      }
#endif
      for (; i + nf <= h; i += nf) {
        __builtin_prefetch(next + i, 0, 2);
        store(zvec(i), df, z + i);
      }
      for (; i < h; ++i) {
        float zv = (kLayerNorm ? ScalarLoad(x + i) - mu_f : ScalarLoad(x + i)) * (rs_f * g[i]);
        if (kLayerNorm) zv += b[i];
        ScalarStore(zv, z + i);
      }
    };
    if (stream) {  // chosen only when rows are aligned and h % nf == 0
      write_row([](auto v, auto d, auto* p) HWY_ATTR { StreamF(v, d, p); });
    } else {
      write_row([](auto v, auto d, auto* p) HWY_ATTR { StoreF(v, d, p); });
    }
  }
  if (stream) hwy::FlushStream();  // order this thread's streamed stores
}

template <bool kLayerNorm, class TX>
HWY_INLINE void FwdRowsZ(const FwdArgs& a, int64_t r0, int64_t r1) {
  switch (a.tz) {
    case DType::kF32:
      return FwdRowsT<kLayerNorm, TX, float>(a, r0, r1);
    case DType::kBF16:
      return FwdRowsT<kLayerNorm, TX, bfloat16_t>(a, r0, r1);
    default:
      return FwdRowsT<kLayerNorm, TX, float16_t>(a, r0, r1);
  }
}

template <bool kLayerNorm>
HWY_INLINE void FwdRowsX(const FwdArgs& a, int64_t r0, int64_t r1) {
  switch (a.tx) {
    case DType::kF32:
      return FwdRowsZ<kLayerNorm, float>(a, r0, r1);
    case DType::kBF16:
      return FwdRowsZ<kLayerNorm, bfloat16_t>(a, r0, r1);
    default:
      return FwdRowsZ<kLayerNorm, float16_t>(a, r0, r1);
  }
}

// FP8 output: the statistics and z as FwdRowsT (fp32 z), then z * scale
// encoded with fp8_io-inl.h and |z| folded into the amax; one atomic max per
// chunk of rows.
template <bool kLayerNorm, Fp8Format kF, class TX>
HWY_NOINLINE void FwdRowsFp8T(const FwdArgs& a, int64_t r0, int64_t r1) {
  const hn::ScalableTag<float> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const size_t nf = hn::Lanes(df);
  const size_t h = size_t(a.h);
  const float* HWY_RESTRICT g = a.g;
  const float* HWY_RESTRICT b = a.b;
  const auto vscale = hn::Set(df, a.scale);
  auto vmax = hn::Zero(du);
  uint32_t smax = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const TX* HWY_RESTRICT x = static_cast<const TX*>(a.x) + size_t(r) * h;
    uint8_t* HWY_RESTRICT z = static_cast<uint8_t*>(a.z) + size_t(r) * h;
    float mu_f, rs_f;
    RowStats<kLayerNorm>(x, h, a.eps, mu_f, rs_f);
    if (kLayerNorm) a.mu[r] = mu_f;
    a.rsigma[r] = rs_f;
    const TX* HWY_RESTRICT next = r + 1 < r1 ? x + h : x;
    const auto vmu = hn::Set(df, mu_f);
    const auto vrs = hn::Set(df, rs_f);
    const auto zvec = [&](size_t j) HWY_ATTR {
      const auto xc = Center<kLayerNorm>(LoadF(df, x + j), vmu);
      const auto gs = hn::Mul(vrs, hn::LoadU(df, g + j));
      return kLayerNorm ? hn::MulAdd(xc, gs, hn::LoadU(df, b + j)) : hn::Mul(xc, gs);
    };
    // Four vectors per 64-byte code store (streamed when a.stream).
    const auto body4 = [&](auto stream) HWY_ATTR {
      size_t j = 0;
      for (; j + 4 * nf <= h; j += 4 * nf) {
        for (size_t k = 0; k < 4; ++k) __builtin_prefetch(next + j + k * nf, 0, 2);
        const auto z0 = zvec(j), z1 = zvec(j + nf), z2 = zvec(j + 2 * nf), z3 = zvec(j + 3 * nf);
        vmax = hn::Max(vmax,
                       hn::Max(hn::Max(AbsBits(df, z0), AbsBits(df, z1)), hn::Max(AbsBits(df, z2), AbsBits(df, z3))));
        StoreFp8x4<kF, decltype(stream)::value>(df, z0, z1, z2, z3, vscale, z + j);
      }
      return j;
    };
    size_t i = a.stream ? body4(std::true_type()) : body4(std::false_type());
    for (; i + nf <= h; i += nf) {
      __builtin_prefetch(next + i, 0, 2);
      const auto zv = zvec(i);
      vmax = hn::Max(vmax, AbsBits(df, zv));
      StoreFp8<kF>(df, hn::Mul(zv, vscale), z + i);
    }
    for (; i < h; ++i) {
      float zv = (kLayerNorm ? ScalarLoad(x + i) - mu_f : ScalarLoad(x + i)) * (rs_f * g[i]);
      if (kLayerNorm) zv += b[i];
      const uint32_t ab = ScalarAbsBits(zv);
      smax = ab > smax ? ab : smax;
      z[i] = FloatToFp8(zv * a.scale, kF);
    }
  }
  if (a.stream) hwy::FlushStream();  // order this thread's streamed stores
  uint32_t m = ReduceAmaxBits(du, vmax);
  m = smax > m ? smax : m;
  uint32_t cur = a.amax_bits->load(std::memory_order_relaxed);
  while (m > cur && !a.amax_bits->compare_exchange_weak(cur, m, std::memory_order_relaxed)) {
  }
}

template <bool kLayerNorm, Fp8Format kF>
HWY_INLINE void FwdRowsFp8X(const FwdArgs& a, int64_t r0, int64_t r1) {
  switch (a.tx) {
    case DType::kF32:
      return FwdRowsFp8T<kLayerNorm, kF, float>(a, r0, r1);
    case DType::kBF16:
      return FwdRowsFp8T<kLayerNorm, kF, bfloat16_t>(a, r0, r1);
    default:
      return FwdRowsFp8T<kLayerNorm, kF, float16_t>(a, r0, r1);
  }
}

template <bool kLayerNorm>
HWY_INLINE void FwdRowsFp8(const FwdArgs& a, int64_t r0, int64_t r1) {
  if (a.fmt == Fp8Format::kE4M3) {
    FwdRowsFp8X<kLayerNorm, Fp8Format::kE4M3>(a, r0, r1);
  } else {
    FwdRowsFp8X<kLayerNorm, Fp8Format::kE5M2>(a, r0, r1);
  }
}

// Exported: forward rows [r0, r1).
void NormFwdRows(const FwdArgs& a, int64_t r0, int64_t r1) {
  if (a.fp8) {
    if (a.layernorm) {
      FwdRowsFp8<true>(a, r0, r1);
    } else {
      FwdRowsFp8<false>(a, r0, r1);
    }
    return;
  }
  if (a.layernorm) {
    FwdRowsX<true>(a, r0, r1);
  } else {
    FwdRowsX<false>(a, r0, r1);
  }
}

// ---- Row conversion (backward works on fp32 copies of its rows) ------------
template <class T>
HWY_INLINE void RowToF32T(const T* HWY_RESTRICT src, float* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  size_t i = 0;
  for (; i + nf <= n; i += nf) hn::StoreU(LoadF(df, src + i), df, dst + i);
  for (; i < n; ++i) dst[i] = ScalarLoad(src + i);
}

template <class T>
HWY_INLINE void RowFromF32T(const float* HWY_RESTRICT src, T* HWY_RESTRICT dst, size_t n) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  size_t i = 0;
  for (; i + nf <= n; i += nf) StoreF(hn::LoadU(df, src + i), df, dst + i);
  for (; i < n; ++i) ScalarStore(src[i], dst + i);
}

// Row r of a [N, h] tensor as fp32: the tensor itself when fp32, else
// converted into `buf`.
HWY_INLINE const float* RowAsF32(const void* base, DType t, int64_t r, size_t h, float* buf) {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(base) + size_t(r) * h;
    case DType::kBF16:
      RowToF32T(static_cast<const bfloat16_t*>(base) + size_t(r) * h, buf, h);
      return buf;
    default:
      RowToF32T(static_cast<const float16_t*>(base) + size_t(r) * h, buf, h);
      return buf;
  }
}

// Exported: dgamma or dbeta from the blocks' partials (SumBlocksToDtype).
void NormReduceColumn(const double* partial, int64_t blocks, size_t stride, size_t hs, void* out, DType t) {
  SumBlocksToDtype(partial, blocks, stride, hs, out, t);
}

// Exported: a gamma/beta vector of n elements of dtype t as fp32, plus one
// when plus_one (the same float(g) + 1.0f as the scalar form).
void VectorToF32Simd(const void* src, DType t, int64_t n, bool plus_one, float* HWY_RESTRICT dst) {
  switch (t) {
    case DType::kF32:
      RowToF32T(static_cast<const float*>(src), dst, size_t(n));
      break;
    case DType::kBF16:
      RowToF32T(static_cast<const bfloat16_t*>(src), dst, size_t(n));
      break;
    default:
      RowToF32T(static_cast<const float16_t*>(src), dst, size_t(n));
      break;
  }
  if (!plus_one) return;
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f);
  size_t i = 0;
  for (; i + nf <= size_t(n); i += nf) hn::StoreU(hn::Add(hn::LoadU(df, dst + i), one), df, dst + i);
  for (; i < size_t(n); ++i) dst[i] += 1.0f;
}

HWY_INLINE void RowFromF32(const float* src, DType t, void* base, int64_t r, size_t h) {
  if (t == DType::kBF16) {
    RowFromF32T(src, static_cast<bfloat16_t*>(base) + size_t(r) * h, h);
  } else {
    RowFromF32T(src, static_cast<float16_t*>(base) + size_t(r) * h, h);
  }
}

// ---- Backward ----------------------------------------------------------------
// One row: dz, x, add (NULL but for rmsnorm_bwd_add) and dx of type T (the
// tensors themselves when every one has the same dtype, else fp32 row copies);
// nx: the next row's tensor bytes and their bytes per vector of floats,
// prefetched during pass 2. cg/cb: the fp32 column sums; the tail
// past the last whole vector goes to dg/db directly.
struct BwdNext {
  const char* dz;
  const char* x;
  const char* add;  // NULL: none
  size_t step_dz, step_x, step_add;
};

template <bool kStream, class T>
HWY_INLINE void BwdRow(const BwdArgs& a, int64_t r, const T* dz, const T* x, const T* add, T* dx, const BwdNext& nx,
                       float* HWY_RESTRICT cg, float* HWY_RESTRICT cb, double* dg, double* db) {
  const hn::ScalableTag<float> df;
  const size_t nf = hn::Lanes(df);
  const size_t h = size_t(a.h);
  const size_t hv = h / nf * nf;
  const float* HWY_RESTRICT g = a.g;
  const float mu = a.mu ? a.mu[r] : 0.0f;
  const float rs = a.rsigma[r];
  const auto vmu = hn::Set(df, mu);
  const auto vrs = hn::Set(df, rs);
  const auto y_at = [&](size_t i) HWY_ATTR { return hn::Mul(hn::Sub(LoadF(df, x + i), vmu), vrs); };
  const auto dy_at = [&](size_t i) HWY_ATTR { return hn::Mul(hn::LoadU(df, g + i), LoadF(df, dz + i)); };

  // Pass 1: y = (x - mu) * rs, dy = g * dz; sum(dy) and sum(dy * y).
  double s_dy = 0.0, s_dyy = 0.0;
  for (size_t c0 = 0; c0 < hv; c0 += kBwdChunk) {
    const size_t c1 = std::min(hv, c0 + kBwdChunk);
    auto sdy0 = hn::Zero(df), sdy1 = hn::Zero(df), sdyy0 = hn::Zero(df), sdyy1 = hn::Zero(df);
    size_t i = c0;
    for (; i + 2 * nf <= c1; i += 2 * nf) {
      const auto dy0 = dy_at(i), dy1 = dy_at(i + nf);
      sdy0 = hn::Add(sdy0, dy0);
      sdy1 = hn::Add(sdy1, dy1);
      sdyy0 = hn::MulAdd(dy0, y_at(i), sdyy0);
      sdyy1 = hn::MulAdd(dy1, y_at(i + nf), sdyy1);
    }
    if (i < c1) {
      const auto dy0 = dy_at(i);
      sdy0 = hn::Add(sdy0, dy0);
      sdyy0 = hn::MulAdd(dy0, y_at(i), sdyy0);
    }
    s_dy += double(hn::GetLane(hn::SumOfLanes(df, hn::Add(sdy0, sdy1))));
    s_dyy += double(hn::GetLane(hn::SumOfLanes(df, hn::Add(sdyy0, sdyy1))));
  }
  for (size_t i = hv; i < h; ++i) {
    const float y = (ScalarLoad(x + i) - mu) * rs;
    const float dy = g[i] * ScalarLoad(dz + i);
    s_dy += double(dy);
    s_dyy += double(dy) * double(y);
  }
  const float mdy = a.layernorm ? float(s_dy / double(h)) : 0.0f;
  const float mdyy = float(s_dyy / double(h));

  // Pass 2: dx = rs * (dy - mdyy * y - mdy) (+ add); column sums. Pass 2
  // touches every 64 bytes of the next row's inputs (this row's again for the
  // block's last row), so they stream into L2 during this row's arithmetic
  // instead of stalling the next row's first loads.
  const auto vmdy = hn::Set(df, mdy);
  const auto vmdyy = hn::Set(df, mdyy);
  for (size_t i = 0, k = 0; i < hv; i += nf, ++k) {
    __builtin_prefetch(nx.dz + k * nx.step_dz, 0, 2);
    __builtin_prefetch(nx.x + k * nx.step_x, 0, 2);
    if (nx.add) __builtin_prefetch(nx.add + k * nx.step_add, 0, 2);
    const auto dzv = LoadF(df, dz + i);
    const auto y = y_at(i);
    const auto dy = hn::Mul(hn::LoadU(df, g + i), dzv);
    auto dxv = hn::Mul(vrs, hn::Sub(hn::NegMulAdd(vmdyy, y, dy), vmdy));
    // dx may be exactly add (rmsnorm_bwd_add in place): add is read first.
    if (add) dxv = hn::Add(dxv, LoadF(df, add + i));
    if constexpr (kStream) {
      StreamF(dxv, df, dx + i);
    } else {
      StoreF(dxv, df, dx + i);
    }
    hn::StoreU(hn::MulAdd(y, dzv, hn::LoadU(df, cg + i)), df, cg + i);
    if (db) hn::StoreU(hn::Add(hn::LoadU(df, cb + i), dzv), df, cb + i);
  }
  for (size_t i = hv; i < h; ++i) {
    const float dzi = ScalarLoad(dz + i);
    const float y = (ScalarLoad(x + i) - mu) * rs;
    const float dy = g[i] * dzi;
    float dxv = rs * ((dy - mdyy * y) - mdy);
    if (add) dxv += ScalarLoad(add + i);
    ScalarStore(dxv, dx + i);
    dg[i] += double(y) * double(dzi);
    if (db) db[i] += double(dzi);
  }
}

// Exported: rows [r0, r1) of one block (r1 > r0). scratch holds
// kBwdScratchRows * h floats; dg/db (db NULL for RMSNorm) are this block's
// double partials, written whole (their prior content is not read). The sums
// run in fp32 over short spans and are then added in double: a row's two sums
// over chunks of kBwdChunk elements, the column sums (dgamma, dbeta) over
// kBwdFoldRows rows at a time, in fp32 row buffers that are then folded into
// dg/db. That keeps every fp32 sum to at most 256 terms (error far inside the
// 5e-4 tolerance) and the loops at full vector width; the order is fixed, so
// results depend only on (rows, num_threads).
void NormBwdBlock(const BwdArgs& a, int64_t r0, int64_t r1, float* scratch, double* dg, double* db) {
  const hn::ScalableTag<float> df;
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> dfh;  // fp32, as many lanes as dd
  const size_t nf = hn::Lanes(df);
  const size_t nd = hn::Lanes(dd);
  const size_t h = size_t(a.h);
  const size_t hv = h / nf * nf;
  float* buf_dz = scratch;
  float* buf_x = scratch + h;
  float* buf_add = scratch + 2 * h;
  float* buf_dx = scratch + 3 * h;
  float* HWY_RESTRICT cg = scratch + 4 * h;  // fp32 column sums of y * dz since the last fold
  float* HWY_RESTRICT cb = scratch + 5 * h;  // and of dz (LayerNorm)
  std::fill(cg, cg + hv, 0.0f);
  if (db) std::fill(cb, cb + hv, 0.0f);
  // dg/db come uninitialised: the first fold stores, the later ones add; the
  // columns past hv are summed into them directly by BwdRow.
  std::fill(dg + hv, dg + h, 0.0);
  if (db) std::fill(db + hv, db + h, 0.0);
  bool folded = false;
  const auto fold = [&](float* HWY_RESTRICT c, double* HWY_RESTRICT d) HWY_ATTR {
    for (size_t i = 0; i < hv; i += nd) {
      const auto v = hn::PromoteTo(dd, hn::LoadU(dfh, c + i));
      hn::StoreU(folded ? hn::Add(hn::LoadU(dd, d + i), v) : v, dd, d + i);
      hn::StoreU(hn::Zero(dfh), dfh, c + i);
    }
  };
  const size_t ez = FloatElemSize(a.tdz), ex = FloatElemSize(a.tx), ea = FloatElemSize(a.tadd);

  int64_t since_fold = 0;
  for (int64_t r = r0; r < r1; ++r) {
    const size_t rn = size_t(r + 1 < r1 ? r + 1 : r);
    const BwdNext nx{static_cast<const char*>(a.dz) + rn * h * ez,
                     static_cast<const char*>(a.x) + rn * h * ex,
                     a.add ? static_cast<const char*>(a.add) + rn * h * ea : nullptr,
                     nf * ez,
                     nf * ex,
                     nf * ea};
    const size_t off = size_t(r) * h;
    // The whole-vector part of a row is streamed when a.stream (then every
    // row starts 64-byte aligned and h is a multiple of the vector).
    const auto row = [&](auto* dz, auto* x, auto* add, auto* dx) HWY_ATTR {
      if (a.stream) {
        BwdRow<true>(a, r, dz, x, add, dx, nx, cg, cb, dg, db);
      } else {
        BwdRow<false>(a, r, dz, x, add, dx, nx, cg, cb, dg, db);
      }
    };
    if (a.same && a.tx == DType::kBF16) {
      row(static_cast<const bfloat16_t*>(a.dz) + off, static_cast<const bfloat16_t*>(a.x) + off,
          a.add ? static_cast<const bfloat16_t*>(a.add) + off : nullptr, static_cast<bfloat16_t*>(a.dx) + off);
    } else if (a.same && a.tx == DType::kF16) {
      row(static_cast<const float16_t*>(a.dz) + off, static_cast<const float16_t*>(a.x) + off,
          a.add ? static_cast<const float16_t*>(a.add) + off : nullptr, static_cast<float16_t*>(a.dx) + off);
    } else {
      // fp32, or mixed dtypes: fp32 rows (the tensors themselves when fp32).
      const float* dz = RowAsF32(a.dz, a.tdz, r, h, buf_dz);
      const float* x = RowAsF32(a.x, a.tx, r, h, buf_x);
      const float* add = a.add ? RowAsF32(a.add, a.tadd, r, h, buf_add) : nullptr;
      if (a.tdx == DType::kF32) {
        row(dz, x, add, static_cast<float*>(a.dx) + off);
      } else {
        BwdRow<false>(a, r, dz, x, add, buf_dx, nx, cg, cb, dg, db);
        RowFromF32(buf_dx, a.tdx, a.dx, r, h);
      }
    }
    if (++since_fold == kBwdFoldRows || r + 1 == r1) {
      fold(cg, dg);
      if (db) fold(cb, db);
      folded = true;
      since_fold = 0;
    }
  }
  if (a.stream) hwy::FlushStream();  // order this thread's streamed stores
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- Dispatch, threading and registration (compiled once) ------------------
#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(NormFwdRows);
HWY_EXPORT(NormBwdBlock);
HWY_EXPORT(VectorToF32Simd);
HWY_EXPORT(NormReduceColumn);

namespace {

// Output bytes above which z is written with non-temporal stores: an output
// larger than a typical L3 is evicted before it is read back anyway, and
// streaming saves the read-for-ownership of every line (fp32 [8192, 4096]:
// ~1.6x faster on Zen 4).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;

// A gamma/beta vector of n elements as fp32, plus one when plus_one
// (vectorised per target: fp16 without F16C in scalar code took ~4 ns an
// element, most of a [1, 4096] call).
void VectorToF32(const DLTensor* t, int64_t n, bool plus_one, float* dst) {
  HWY_DYNAMIC_DISPATCH(VectorToF32Simd)(DataPtr(t), DTypeOf(t->dtype), n, plus_one, dst);
}

// gamma (+1) or beta as fp32: an fp32 vector used as is is read in place, any
// other is converted into buf (n floats).
const float* VectorAsF32(const DLTensor* t, int64_t n, bool plus_one, float* buf) {
  if (DTypeOf(t->dtype) == DType::kF32 && !plus_one) return static_cast<const float*>(DataPtr(t));
  VectorToF32(t, n, plus_one, buf);
  return buf;
}

// Below this many rows a bf16 forward reads bf16 gamma/beta in place; from
// it on, their per-call conversion to fp32 pairs costs less than widening
// them in every row.
constexpr int64_t kGammaInPlaceMaxRows = 16;

// v's even elements, then its odd ones (h / 2 each: FwdArgs::g_pairs). A NaN
// becomes a quiet NaN with the same sign and upper payload bits and a zero
// low half, as every other NaN of the bf16 pair loop (see FwdRowsT).
void SplitPairs(const float* v, int64_t h, float* dst) {
  const int64_t hp = h / 2;
  const auto canonical = [](float f) {
    if (!std::isnan(f)) return f;
    return std::bit_cast<float>((std::bit_cast<uint32_t>(f) & 0xFFFF0000u) | 0x00400000u);
  };
  for (int64_t j = 0; j < hp; ++j) {
    dst[j] = canonical(v[2 * j]);
    dst[hp + j] = canonical(v[2 * j + 1]);
  }
}

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "norm", code, what);
}

void FwdBody(void* ctx, int64_t begin, int64_t end) {
  HWY_DYNAMIC_DISPATCH(NormFwdRows)(*static_cast<const FwdArgs*>(ctx), begin, end);
}

// fp8: rmsnorm_fwd_fp8 / layernorm_fwd_fp8 (scale after the base inputs;
// amax and scale_inv after the base outputs).
tefl_status* NormFwd(const tefl_call_frame* f, bool layernorm, bool fp8 = false) {
  try {
    const DLTensor* x = f->inputs[0];
    const DLTensor* gamma = f->inputs[1];
    const DLTensor* beta = layernorm ? f->inputs[2] : nullptr;
    DLTensor* z = f->outputs[0];
    DLTensor* mu = layernorm ? f->outputs[1] : nullptr;
    DLTensor* rsigma = f->outputs[layernorm ? 2 : 1];
    const auto* attrs = static_cast<const tefl_norm_fwd_attrs*>(f->attrs);

    const DType tx = DTypeOf(x->dtype), tz = DTypeOf(z->dtype), tg = DTypeOf(gamma->dtype);
    const DType tb = beta ? DTypeOf(beta->dtype) : DType::kF32;
    const bool z_ok = fp8 ? (tz == DType::kE4M3 || tz == DType::kE5M2) : IsFloatType(tz);
    if (!IsFloatType(tx) || !z_ok || !IsFloatType(tg) || !IsFloatType(tb))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16 (z: E4M3/E5M2 for the FP8 variants)");

    std::atomic<uint32_t> amax_bits{0};
    float scale = 1.0f;
    if (fp8) {
      scale = *static_cast<const float*>(DataPtr(f->inputs[layernorm ? 3 : 2]));
      const int tail = layernorm ? 3 : 2;
      // Written last, after the rows (amax) or now (scale_inv: no row reads it).
      *static_cast<float*>(DataPtr(f->outputs[tail + 1])) = 1.0f / scale;
    }
    const auto write_amax = [&] {
      if (!fp8) return;
      const uint32_t bits = amax_bits.load();
      *static_cast<float*>(DataPtr(f->outputs[layernorm ? 3 : 2])) =
          bits > 0x7F800000u ? std::bit_cast<float>(0x7FC00000u) : std::bit_cast<float>(bits);
    };

    const int64_t h = x->shape[x->ndim - 1];
    const int64_t rows = LeadingRows(x);
    if (rows == 0) {
      write_amax();
      return nullptr;
    }

    FwdArgs a{};
    a.layernorm = layernorm;
    a.tx = tx;
    a.tz = tz;
    a.h = h;
    a.eps = double(attrs->eps);
    a.x = DataPtr(x);
    a.z = DataPtr(z);
    // gamma (+1) and beta: for bf16 x and z with bf16 gamma and beta and few
    // rows, read in place (no per-call work: a [1, 4096] call was mostly the
    // conversion); else as fp32 once per call, split into pairs as well for
    // bf16 x and z (fp32 pairs save the pair loop 4 widening operations per
    // 16 elements of LayerNorm, 2 of RMSNorm).
    std::vector<float> gb, pairs;
    const bool pair_loop = !fp8 && tx == DType::kBF16 && tz == DType::kBF16;
    if (pair_loop && rows < kGammaInPlaceMaxRows && tg == DType::kBF16 && (!beta || tb == DType::kBF16)) {
      a.g16 = static_cast<const uint16_t*>(DataPtr(gamma));
      a.b16 = beta ? static_cast<const uint16_t*>(DataPtr(beta)) : nullptr;
      a.plus_one = attrs->zero_centered_gamma != 0;
    } else {
      gb.resize(size_t(layernorm ? 2 : 1) * size_t(h));
      a.g = VectorAsF32(gamma, h, attrs->zero_centered_gamma != 0, gb.data());
      a.b = beta ? VectorAsF32(beta, h, false, gb.data() + h) : nullptr;
      if (pair_loop) {
        pairs.resize(gb.size());
        SplitPairs(a.g, h, pairs.data());
        a.g_pairs = pairs.data();
        if (beta) {
          SplitPairs(a.b, h, pairs.data() + h);
          a.b_pairs = pairs.data() + h;
        }
      }
    }
    a.mu = mu ? static_cast<float*>(DataPtr(mu)) : nullptr;
    a.rsigma = static_cast<float*>(DataPtr(rsigma));
    a.fp8 = fp8;
    a.fmt = tz == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
    a.scale = scale;
    a.amax_bits = &amax_bits;
    // Streaming needs every row start aligned to the widest vector (64 bytes
    // covers every x86 target), which also makes h a multiple of the lanes.
    const int64_t row_bytes = h * int64_t(fp8 ? 1 : FloatElemSize(tz));
    a.stream = rows * row_bytes >= kStreamMinBytes && row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(a.z) % 64 == 0;

    // Chunks of at least ~64 KiB of x keep the fork-join overhead small.
    const int64_t grain = std::max<int64_t>(1, (int64_t(16) << 10) / h);
    f->host->parallel_for(rows, grain, FwdBody, &a);
    write_amax();
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

struct BwdCtx {
  const BwdArgs* a;
  int64_t rows;
  int64_t blocks;
  size_t h;
  size_t ncols;  // 2 with dbeta, else 1
  float* scratch;
  double* partial;
};

void BwdBody(void* ctx, int64_t begin, int64_t end) {
  const BwdCtx& c = *static_cast<const BwdCtx*>(ctx);
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t r0 = c.rows * blk / c.blocks;
    const int64_t r1 = c.rows * (blk + 1) / c.blocks;
    double* dg = c.partial + size_t(blk) * c.ncols * c.h;
    double* db = c.ncols == 2 ? dg + c.h : nullptr;
    HWY_DYNAMIC_DISPATCH(NormBwdBlock)(*c.a, r0, r1, c.scratch + size_t(blk) * kBwdScratchRows * c.h, dg, db);
  }
}

// The backward's working memory: gamma as fp32, each block's fp32 rows
// (scratch) and double column partials. Calls that do not stream dx keep it
// per calling thread and reuse it, up to kBwdBuffersCacheBytes: allocated per
// call, a few hundred KiB were mapped afresh every time (glibc gives the
// freed top of the heap back), more than the arithmetic of small calls
// (layernorm_bwd bf16 [1, 4096]: 76 us before, 8 us after; docs/performance.md,
// session 22). Streaming calls (dx >= 32 MiB) allocate per call: with reused
// buffers they ran 20-30 % slower on the Zen 3 of session 22 (bf16 [4096,
// 4096] and [8192, 4096]; [3072, 4096], not streamed, did not move), for a
// reason not established; their page faults are far below 1 % of their work.
struct BwdBuffers {
  std::vector<float> gamma;
  std::vector<float> scratch;
  std::vector<double> partial;
};
constexpr size_t kBwdBuffersCacheBytes = size_t(4) << 20;
BwdBuffers& ThreadBwdBuffers() {
  thread_local BwdBuffers buffers;
  return buffers;
}

// kind: 0 layernorm_bwd, 1 rmsnorm_bwd, 2 rmsnorm_bwd_add.
tefl_status* NormBwd(const tefl_call_frame* f, int kind) {
  try {
    const bool layernorm = kind == 0;
    const DLTensor* const* in = f->inputs;
    const DLTensor* dz = in[0];
    const DLTensor* x = in[1];
    const DLTensor* add = kind == 2 ? in[2] : nullptr;
    const DLTensor* mu = layernorm ? in[2] : nullptr;
    const DLTensor* rsigma = in[kind == 1 ? 2 : 3];
    const DLTensor* gamma = in[kind == 1 ? 3 : 4];
    DLTensor* dx = f->outputs[0];
    DLTensor* dgamma = f->outputs[1];
    DLTensor* dbeta = layernorm ? f->outputs[2] : nullptr;
    const auto* attrs = static_cast<const tefl_norm_bwd_attrs*>(f->attrs);

    const DType tdz = DTypeOf(dz->dtype), tx = DTypeOf(x->dtype), tg = DTypeOf(gamma->dtype);
    const DType tdx = DTypeOf(dx->dtype), tdg = DTypeOf(dgamma->dtype);
    const DType tadd = add ? DTypeOf(add->dtype) : DType::kF32;
    const DType tdb = dbeta ? DTypeOf(dbeta->dtype) : DType::kF32;
    if (!IsFloatType(tdz) || !IsFloatType(tx) || !IsFloatType(tg) || !IsFloatType(tdx) || !IsFloatType(tdg) ||
        !IsFloatType(tadd) || !IsFloatType(tdb))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");

    const int64_t h = x->shape[x->ndim - 1];
    const int64_t rows = LeadingRows(x);
    const size_t hs = size_t(h);
    const size_t ncols = dbeta ? 2 : 1;
    // Fixed blocks: the partition depends only on (rows, num_threads).
    const int64_t blocks = rows == 0 ? 0 : std::min<int64_t>(std::max<int64_t>(1, f->host->num_threads()), rows);

    const bool same = tdz == tx && tx == tdx && (!add || tadd == tx);
    // Streamed only where BwdRow writes dx itself: same dtypes or dx fp32.
    const int64_t dx_row_bytes = h * int64_t(FloatElemSize(tdx));
    const bool stream = (same || tdx == DType::kF32) && rows * dx_row_bytes >= kStreamMinBytes &&
                        dx_row_bytes % 64 == 0 && reinterpret_cast<uintptr_t>(DataPtr(dx)) % 64 == 0;

    const size_t n_partial = size_t(blocks) * ncols * hs;
    const size_t n_scratch = size_t(blocks) * kBwdScratchRows * hs;
    BwdBuffers per_call;
    const size_t bytes = (hs + n_scratch) * sizeof(float) + n_partial * sizeof(double);
    BwdBuffers& buffers = !stream && bytes <= kBwdBuffersCacheBytes ? ThreadBwdBuffers() : per_call;
    // This order (partials, gamma, rows) is the one the streaming calls were
    // measured fastest with (session 22).
    if (buffers.partial.size() < n_partial) buffers.partial.resize(n_partial);
    if (buffers.gamma.size() < hs) buffers.gamma.resize(hs);
    if (buffers.scratch.size() < n_scratch) buffers.scratch.resize(n_scratch);
    double* partial = buffers.partial.data();  // written whole by NormBwdBlock
    if (blocks > 0) {
      BwdArgs a{};
      a.layernorm = layernorm;
      a.tdz = tdz;
      a.tx = tx;
      a.tadd = tadd;
      a.tdx = tdx;
      a.h = h;
      a.dz = DataPtr(dz);
      a.x = DataPtr(x);
      a.add = add ? DataPtr(add) : nullptr;
      a.mu = mu ? static_cast<const float*>(DataPtr(mu)) : nullptr;
      a.rsigma = static_cast<const float*>(DataPtr(rsigma));
      a.g = VectorAsF32(gamma, h, attrs->zero_centered_gamma != 0, buffers.gamma.data());
      a.dx = DataPtr(dx);
      a.same = same;
      a.stream = stream;

      float* scratch = buffers.scratch.data();
      BwdCtx c{&a, rows, blocks, hs, ncols, scratch, partial};
      f->host->parallel_for(blocks, 1, BwdBody, &c);
    }

    // Reduce the block partials in block order (zeros when rows == 0).
    HWY_DYNAMIC_DISPATCH(NormReduceColumn)(partial, blocks, ncols * hs, hs, DataPtr(dgamma), tdg);
    if (dbeta) HWY_DYNAMIC_DISPATCH(NormReduceColumn)(partial + hs, blocks, ncols * hs, hs, DataPtr(dbeta), tdb);
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* LayerNormFwdKernel(const tefl_call_frame* f, void*) { return NormFwd(f, true); }
tefl_status* RmsNormFwdKernel(const tefl_call_frame* f, void*) { return NormFwd(f, false); }
tefl_status* LayerNormFwdFp8Kernel(const tefl_call_frame* f, void*) { return NormFwd(f, true, true); }
tefl_status* RmsNormFwdFp8Kernel(const tefl_call_frame* f, void*) { return NormFwd(f, false, true); }
tefl_status* LayerNormBwdKernel(const tefl_call_frame* f, void*) { return NormBwd(f, 0); }
tefl_status* RmsNormBwdKernel(const tefl_call_frame* f, void*) { return NormBwd(f, 1); }
tefl_status* RmsNormBwdAddKernel(const tefl_call_frame* f, void*) { return NormBwd(f, 2); }

}  // namespace

tefl_status* RegisterPortableNormalization(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"layernorm_fwd", LayerNormFwdKernel},
      {"layernorm_bwd", LayerNormBwdKernel},
      {"rmsnorm_fwd", RmsNormFwdKernel},
      {"rmsnorm_bwd", RmsNormBwdKernel},
      {"rmsnorm_bwd_add", RmsNormBwdAddKernel},
      {"rmsnorm_fwd_fp8", RmsNormFwdFp8Kernel},
      {"layernorm_fwd_fp8", LayerNormFwdFp8Kernel},
  };
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
