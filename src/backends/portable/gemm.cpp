// default.portable — GEMM: generic_gemm and te_general_grouped_gemm.
//
// The fp32 core is tefl's own AVX-512 tiles (see "fp32 on AVX-512" below)
// where the CPU has AVX-512 and the product is large enough, else OpenBLAS's
// cblas_sgemm (Debian libopenblas 0.3.21, the pthread build). Around it:
//  - Operands that are not fp32 (bf16, fp16, FP8) are converted whole to
//    compact fp32 copies first, rows spread over the host pool (bf16/fp16
//    exactly; FP8 through the 256-entry decode table of core/fp8.h). The
//    FP8 scale_inv factors are folded into alpha (alpha * sa * sb).
//  - D is computed in fp32: directly in D when D is fp32, else in an fp32
//    scratch [M, N]. C (or D's prior content with accumulate) is copied in
//    first and sgemm's beta applies to it; BLAS conventions hold: alpha = 0
//    skips the product, beta = 0 skips C (the reference does the same).
//  - bf16 x bf16 on a CPU with avx512_bf16: packed panels and a vdpbf16ps
//    micro-kernel instead (see "bf16 x bf16" below), no fp32 copies.
//  - One fused epilogue pass over D, rows spread over the host pool: bias,
//    GELU (pre_gelu_out; Highway's Tanh, dispatched per ISA), amax (NaN
//    ignored, as TE), output conversion (bf16/fp16 round to nearest even;
//    FP8 fp8(D * d_scale), saturating). A plain fp32 GEMM has no epilogue
//    pass at all.
//  - bias_grad (grad): row sums of op(A) in double.
//
// Threads: the own tiles run on the host pool. OpenBLAS keeps its own
// pthread pool. Every OpenBLAS sgemm runs under one
// process-wide mutex that also sets OpenBLAS's thread count to the host
// pool's num_threads() when it differs from the last call's, so tefl and
// OpenBLAS agree on the thread budget and openblas_set_num_threads never
// races a running GEMM. Concurrent GEMM calls from several threads are
// therefore safe (and serialised in their sgemm part; the conversions and
// epilogues run concurrently).
#include <cblas.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <new>
#include <thread>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "backends/portable/amx_tiles.h"
#include "backends/portable/cpu_paths.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"

// ---- GELU over a row: Highway, compiled per target (foreach_target.h) ----------
#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/gemm.cpp"
// clang-format off
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>
#include "backends/portable/simd_io-inl.h"
// clang-format on

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

using D = hn::ScalableTag<float>;
using V = hn::Vec<D>;

// gelu_tanh(x) = x * (0.5 + 0.5 tanh(y)), y = x (0.79788456 + 0.03567741 x^2),
// computed as x / (1 + exp(-2 y)) (the same function) with Highway's Exp and
// a reciprocal estimate refined by one Newton step: Highway's Tanh divides,
// and vdivps held ~18 % of the fused GELU epilogue's samples (bench_gemm
// fprop_bias_gelu; docs/perf-gemm.md, session 32). A few ulp of fp32. -2y
// is clamped to [-80, 80] so that no step meets an fp32 subnormal (each
// costs a microcode assist: unclamped, fprop_bias_gelu ran 2x slower);
// where -2y > 80 (x below ~-9.7, and -inf) the factor is 0 (Tanh's formula
// gives 0 from x ~ -5.2, where tanh(y) rounds to -1; this form gives values
// below 2^-22 in between): -0 for finite x, NaN for -inf (as the formula);
// +inf gives +inf, NaN stays NaN.
HWY_INLINE V Gelu(D d, V x) {
  const V m2y = hn::Mul(x, hn::MulAdd(hn::Set(d, -2.0f * 0.03567741f), hn::Mul(x, x), hn::Set(d, -2.0f * 0.79788456f)));
  const V lim = hn::Set(d, 80.0f);
  const V den = hn::Add(hn::Exp(d, hn::Max(hn::Min(m2y, lim), hn::Neg(lim))), hn::Set(d, 1.0f));
  V r = hn::ApproximateReciprocal(den);
  r = hn::Mul(r, hn::NegMulAdd(den, r, hn::Set(d, 2.0f)));
  return hn::Mul(x, hn::IfThenZeroElse(hn::Gt(m2y, lim), r));
}

// gelu_tanh'(x) (spec/ops.md): t = tanh(x (0.79788456 + 0.03567741 x^2));
// 0.5 x (1 - t^2)(0.79788456 + 0.1070322243 x^2) + 0.5 (1 + t).
HWY_INLINE V DGelu(D d, V x) {
  const V half = hn::Set(d, 0.5f);
  const V x2 = hn::Mul(x, x);
  const V t = hn::Tanh(d, hn::Mul(x, hn::MulAdd(hn::Set(d, 0.03567741f), x2, hn::Set(d, 0.79788456f))));
  const V slope = hn::MulAdd(hn::Set(d, 0.1070322243f), x2, hn::Set(d, 0.79788456f));
  const V left = hn::Mul(hn::Mul(hn::Mul(half, x), hn::NegMulAdd(t, t, hn::Set(d, 1.0f))), slope);
  return hn::MulAdd(half, t, hn::Add(left, half));
}
// The scalar tails' GELU (the formula itself, with std::tanh).
HWY_INLINE float GeluScalar(float x) { return x * (0.5f + 0.5f * std::tanh(x * (0.79788456f + 0.03567741f * x * x))); }
HWY_INLINE float DGeluScalar(float x) {
  const float t = std::tanh(x * (0.79788456f + 0.03567741f * x * x));
  return 0.5f * x * (1.0f - t * t) * (0.79788456f + 0.1070322243f * x * x) + 0.5f * (1.0f + t);
}

HWY_INLINE V LoadAny(D d, const void* base, DType t, size_t j) {
  if (t == DType::kBF16) return LoadF(d, static_cast<const bfloat16_t*>(base) + j);
  if (t == DType::kF16) return LoadF(d, static_cast<const float16_t*>(base) + j);
  return hn::LoadU(d, static_cast<const float*>(base) + j);
}

HWY_INLINE void StoreAny(V v, D d, void* base, DType t, size_t j) {
  if (t == DType::kBF16) {
    StoreF(v, d, static_cast<bfloat16_t*>(base) + j);
  } else if (t == DType::kF16) {
    StoreF(v, d, static_cast<float16_t*>(base) + j);
  } else {
    hn::StoreU(v, d, static_cast<float*>(base) + j);
  }
}

// One row of the epilogue, in one pass: v = row + bias; pre_gelu_out = v;
// v = gelu(v); amax = max(amax, |v|) (NaN when any v is NaN); out = v rounded to td
// (FP8 D: the row keeps v, converted by the caller). dgelu (gelu with grad):
// v = row * gelu'(pre), pre read, and the row keeps v (for bias_grad).
HWY_NOINLINE void EpilogueRow(float* HWY_RESTRICT row, size_t n, const float* HWY_RESTRICT bias, bool gelu, bool dgelu,
                              void* pre, DType tpre, float* amax, void* out, DType td) {
  const D d;
  const size_t lanes = hn::Lanes(d);
  const bool fp8 = td == DType::kE4M3 || td == DType::kE5M2;
  V vmax = hn::Zero(d);
  size_t j = 0;
  for (; j + lanes <= n; j += lanes) {
    V v = hn::LoadU(d, row + j);
    if (bias) v = hn::Add(v, hn::LoadU(d, bias + j));
    if (dgelu) {
      v = hn::Mul(v, DGelu(d, LoadAny(d, pre, tpre, j)));
      if (!fp8) hn::StoreU(v, d, row + j);
    } else if (gelu) {
      if (pre) StoreAny(v, d, pre, tpre, j);
      v = Gelu(d, v);
    }
    if (amax) {
      const V av = hn::Abs(v);
      vmax = hn::IfThenElse(hn::Or(hn::Gt(av, vmax), hn::IsNaN(av)), av, vmax);  // a NaN lane stays NaN
    }
    StoreAny(v, d, fp8 ? static_cast<void*>(row) : out, fp8 ? DType::kF32 : td, j);
  }
  float m = !amax                              ? 0.0f
            : hn::AllFalse(d, hn::IsNaN(vmax)) ? hn::GetLane(hn::MaxOfLanes(d, vmax))
                                               : std::numeric_limits<float>::quiet_NaN();
  for (; j < n; ++j) {
    float v = row[j];
    if (bias) v += bias[j];
    if (dgelu) {
      v *= DGeluScalar(LoadAsFloat(pre, int64_t(j), tpre));
      row[j] = v;
    } else if (gelu) {
      if (pre) StoreFromFloat(pre, int64_t(j), tpre, v);
      v = GeluScalar(v);
    }
    if (!std::isnan(m) && (std::isnan(v) || std::fabs(v) > m)) m = std::fabs(v);
    if (fp8)
      row[j] = v;
    else
      StoreFromFloat(out, int64_t(j), td, v);
  }
  if (amax) *amax = m;
}

// The GELU epilogue of a bf16 D fused into the bf16 tiles' stores (AMX and
// vdpbf16ps; no fp32 pass over D): one tile of fp32 sums acc [rows][acc_ld]
// holding columns [col0, col0 + cols) of an n-column D; v = alpha * acc +
// bias (bias from col0), pre (if not NULL) = bf16(v), out = bf16(gelu(v));
// pre and out point at the tile's first element, rows ld apart. stream (a
// large D on AMX): full, aligned 64-byte lines of out and pre by
// non-temporal stores (the caller fences; fprop 4096 x 4096 x 1024 ~3 %
// faster), else plain stores.
// Vectors cover the columns below n rounded down to the lanes and the rest is
// scalar, as in EpilogueRow, so each element takes the same formulas as on
// the unfused path (here the product and the bias add may be contracted into
// one FMA: the last bit of v can differ).
HWY_NOINLINE void GeluTileBf16(const float* HWY_RESTRICT acc, size_t acc_ld, size_t rows, size_t col0, size_t cols,
                               size_t n, float alpha, const float* HWY_RESTRICT bias, bfloat16_t* pre, bfloat16_t* out,
                               size_t ld, bool native, bool stream) {
  const D d;
  const size_t lanes = hn::Lanes(d);
  const size_t vec_cols = std::min(cols, n / lanes * lanes > col0 ? n / lanes * lanes - col0 : 0);
  const V va = hn::Set(d, alpha);
#if TEFL_BF16_NATIVE
  // native (AVX512-BF16, TEFL_PORTABLE_BF16_CVT): two vectors at a time
  // rounded by vcvtne2ps2bf16, bit for bit the emulated rounding
  // (simd_io-inl.h), which held ~35 % of this function's samples.
  const hn::ScalableTag<uint16_t> du16;
  const size_t pair_cols = native ? vec_cols / (2 * lanes) * (2 * lanes) : 0;
#else
  (void)native;
#endif
  for (size_t r = 0; r < rows; ++r) {
    const float* a = acc + r * acc_ld;
    bfloat16_t* pre_row = pre ? pre + r * ld : nullptr;
    bfloat16_t* out_row = out + r * ld;
    size_t j = 0;
#if TEFL_BF16_NATIVE
    for (; j < pair_cols; j += 2 * lanes) {
      V v0 = hn::Mul(hn::LoadU(d, a + j), va), v1 = hn::Mul(hn::LoadU(d, a + j + lanes), va);
      if (bias) {
        v0 = hn::Add(v0, hn::LoadU(d, bias + j));
        v1 = hn::Add(v1, hn::LoadU(d, bias + j + lanes));
      }
      auto* po = reinterpret_cast<uint16_t*>(pre_row + j);
      auto* oo = reinterpret_cast<uint16_t*>(out_row + j);
      // A full, aligned 64-byte line of a large D: non-temporal (no read
      // for ownership; the caller fences).
      const bool nt = stream && 2 * lanes * sizeof(uint16_t) == 64 && reinterpret_cast<uintptr_t>(oo) % 64 == 0 &&
                      (pre_row == nullptr || reinterpret_cast<uintptr_t>(po) % 64 == 0);
      if (pre_row) {
        const auto h = RoundToBF16Bits2Native(v0, v1);
        nt ? hn::Stream(h, du16, po) : hn::StoreU(h, du16, po);
      }
      const auto h = RoundToBF16Bits2Native(Gelu(d, v0), Gelu(d, v1));
      nt ? hn::Stream(h, du16, oo) : hn::StoreU(h, du16, oo);
    }
#endif
    for (; j < vec_cols; j += lanes) {
      V v = hn::Mul(hn::LoadU(d, a + j), va);
      if (bias) v = hn::Add(v, hn::LoadU(d, bias + j));
      if (pre_row) StoreF(v, d, pre_row + j);
      StoreF(Gelu(d, v), d, out_row + j);
    }
    for (; j < cols; ++j) {
      float v = a[j] * alpha;
      if (bias) v += bias[j];
      if (pre_row) StoreFromFloat(pre_row, int64_t(j), DType::kBF16, v);
      v = GeluScalar(v);
      StoreFromFloat(out_row, int64_t(j), DType::kBF16, v);
    }
  }
}

// sums[j] += rows [0, rows) of column j (fp32 rows ld apart, double sums),
// for the columns [j0, j1): each column's rows are added in row order, as a
// scalar loop would, so the sums do not depend on how columns are split.
HWY_NOINLINE void AddColumnSums(const float* HWY_RESTRICT rows_f32, size_t rows, size_t ld, size_t j0, size_t j1,
                                double* HWY_RESTRICT sums) {
  const hn::ScalableTag<double> dd;
  const hn::Rebind<float, decltype(dd)> df;
  const size_t lanes = hn::Lanes(dd);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = rows_f32 + r * ld;
    size_t j = j0;
    for (; j + lanes <= j1; j += lanes)
      hn::StoreU(hn::Add(hn::LoadU(dd, sums + j), hn::PromoteTo(dd, hn::LoadU(df, row + j))), dd, sums + j);
    for (; j < j1; ++j) sums[j] += double(row[j]);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tefl::backends {
HWY_EXPORT(EpilogueRow);
HWY_EXPORT(GeluTileBf16);
HWY_EXPORT(AddColumnSums);
namespace {

constexpr const char* kImpl = "default.portable";

bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
bool IsGemmType(DType t) { return IsFloatType(t) || IsFp8(t); }
size_t ElemSize(DType t) { return IsFp8(t) ? 1 : FloatElemSize(t); }
Fp8Format FormatOf(DType t) { return t == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2; }

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, kImpl, "gemm", code, what);
}

// ---- per-thread workspace ---------------------------------------------------------
// fp32 copies of the operands, the fp32 result of a non-fp32 D and the bf16
// path's packed panels live in buffers kept by the calling thread between
// calls (a fresh 64 MiB buffer costs its page faults on every call). They
// only grow (no re-initialisation); a call that leaves more than
// kKeptBufferBytes (kernel_support.h) in them frees them on return.
// The counters of one column group in FusedSchedule.
struct alignas(64) FusedGroup {
  std::atomic<int64_t> next_super{0};  // the group's next unclaimed row task
  std::atomic<bool> b_claimed{false};  // its B panels are being / have been packed
};
struct Workspace {
  std::vector<float> a, b, bias, scratch, packed32;
  std::vector<uint32_t> packed;
  std::vector<double> sums;  // bias_grad accumulators
  std::unique_ptr<FusedGroup[]> groups;
  size_t groups_cap = 0;
  size_t Bytes() const {
    return (a.capacity() + b.capacity() + bias.capacity() + scratch.capacity() + packed32.capacity() +
            packed.capacity()) *
               4 +
           sums.capacity() * 8 + groups_cap * sizeof(FusedGroup);
  }
};
// At least n group counters in ws (FusedSchedule has at most one group per
// 32-column panel).
void GrowGroups(Workspace& ws, int64_t n_cols) {
  const size_t n = size_t((n_cols + 31) / 32);
  if (ws.groups_cap >= n) return;
  ws.groups = std::make_unique<FusedGroup[]>(n);
  ws.groups_cap = n;
}
template <class T>
void Grow(std::vector<T>& v, size_t n) {
  if (v.size() < n) v.resize(n);
}

// ---- conversions ----------------------------------------------------------------
// n elements of any GEMM dtype to fp32 (exact).
void ToF32(const void* src, DType t, float* dst, int64_t n) {
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = BitsFloat(uint32_t(p[i]) << 16);
      return;
    }
    case DType::kF16: {
      const auto* p = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = F16ToFloat(p[i]);
      return;
    }
    default: {  // FP8: every value is exact in fp32
      const float* table = Fp8DecodeTable(FormatOf(t));
      const auto* p = static_cast<const uint8_t*>(src);
      for (int64_t i = 0; i < n; ++i) dst[i] = table[p[i]];
      return;
    }
  }
}

// n fp32 values rounded once to t (FP8: after multiplying by scale).
void FromF32(const float* src, DType t, void* dst, int64_t n, float scale) {
  switch (t) {
    case DType::kF32:
      if (src != dst) std::memcpy(dst, src, size_t(n) * 4);
      return;
    case DType::kBF16: {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToBF16(src[i]);
      return;
    }
    case DType::kF16: {
      auto* p = static_cast<uint16_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToF16(src[i]);
      return;
    }
    default: {
      const Fp8Format fmt = FormatOf(t);
      auto* p = static_cast<uint8_t*>(dst);
      for (int64_t i = 0; i < n; ++i) p[i] = FloatToFp8(src[i] * scale, fmt);
      return;
    }
  }
}

// A compact tensor of `n` elements as fp32: the data itself when fp32, else a
// converted copy in `buf` (chunks spread over the host pool).
struct ConvertCtx {
  const void* src;
  DType t;
  float* dst;
  int64_t n;
};
constexpr int64_t kConvertChunk = int64_t(1) << 14;
void ConvertBody(void* ctx, int64_t begin, int64_t end) {
  const auto& c = *static_cast<const ConvertCtx*>(ctx);
  const size_t es = ElemSize(c.t);
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t i0 = blk * kConvertChunk, i1 = std::min(c.n, i0 + kConvertChunk);
    ToF32(static_cast<const char*>(c.src) + size_t(i0) * es, c.t, c.dst + i0, i1 - i0);
  }
}
const float* AsF32(const tefl_call_frame* f, const void* src, DType t, int64_t n, std::vector<float>& buf) {
  if (t == DType::kF32) return static_cast<const float*>(src);
  Grow(buf, size_t(n));
  ConvertCtx c{src, t, buf.data(), n};
  f->host->parallel_for((n + kConvertChunk - 1) / kConvertChunk, 1, ConvertBody, &c);
  return buf.data();
}
void ScaleInPlace(float* x, int64_t n, float scale) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

// ---- OpenBLAS under one lock, with tefl's thread count ------------------------
std::mutex& BlasMutex() {
  static std::mutex mu;
  return mu;
}

void BlasSgemm(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
               const float* b, float beta, float* c) {
  static int threads_set = 0;  // guarded by BlasMutex
  const std::lock_guard<std::mutex> lock(BlasMutex());
  const int want = std::max(1, int(f->host->num_threads()));
  if (want != threads_set) {
    openblas_set_num_threads(want);
    threads_set = want;
  }
  cblas_sgemm(CblasRowMajor, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, blasint(m), blasint(n),
              blasint(k), alpha, a, blasint(ta ? m : k), b, blasint(tb ? k : n), beta, c, blasint(n));
}

// ---- bf16 x bf16 on AVX512-BF16 (vdpbf16ps) ---------------------------------------
// torch's CPU bf16 matmul (oneDNN) runs on vdpbf16ps, twice the fp32 FMA rate;
// converting to fp32 for sgemm cannot match it. This path packs op(A) and
// op(B) into K-pair-interleaved panels and runs an 8 x 32 register-tile
// micro-kernel: each vdpbf16ps lane adds a[k] b[k] + a[k+1] b[k+1] (products
// exact in fp32, sums rounded to nearest even: the error bound of any fp32
// summation order). vdpbf16ps treats subnormal inputs as zero, so A and B
// are checked while they are packed (the grouped GEMM: scanned first) and a
// call with a subnormal bf16 value takes the exact sgemm path before D is
// written. It also flushes subnormal fp32 results (|x| < 2^-126) to zero:
// an absolute error below K * 2^-126, far under every tolerance. A bf16 D
// with no C, GELU or amax is written from the tiles (Bf16FusedDirect: one
// fork-join for packing and tiles; an untransposed A with even K is read in
// place, only scanned). Used when the CPU has avx512_bf16 and the GEMM has
// at least kBf16MinWork multiply-adds.
constexpr int kMR = 8, kNR = 32;     // register tile: 8 rows x 32 columns (2 zmm)
constexpr int64_t kGroupPanels = 4;  // column panels per task (B slice stays in L2)
constexpr int64_t kSuperRows = 64;   // rows per task (8 tiles)
constexpr int64_t kBf16MinWork = 32 * 32 * 32;
constexpr uintptr_t kAPrefetch = 16;  // K pairs ahead (512 bytes of packed A)
// AMX (tdpbf16ps on 16 x 16 fp32 tiles): a block of D is kAmxRows x kNR, four
// accumulator tiles; K runs in steps of kAmxPairs pairs (one A tile row is
// 64 bytes).
constexpr int kAmxRows = 32, kAmxPairs = 16;
constexpr int64_t kAmxGroupBytes = int64_t(1) << 20;

// Lane masks of the first `cols` (0-32) columns of a 32-column row: the low
// and the high 16 lanes.
struct ColumnMasks {
  __mmask16 lo, hi;
};
inline ColumnMasks MasksOf32(int cols) {
  return {cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1), cols >= 32 ? __mmask16(0xFFFF)
                                                                        : cols <= 16
                                                                            ? __mmask16(0)
                                                                            : __mmask16((1u << (cols - 16)) - 1)};
}

bool CpuHasBf16Dot() { return CpuHasAvx512Bf16(); }

// The bf16 tiles (vdpbf16ps, AMX's tdpbf16ps) read subnormal inputs as 0
// and flush subnormal products and sums to 0. Packing and the scans record
// the smallest nonzero magnitude (bits h & 0x7FFF; kNoMagnitude when every
// value is +-0) of op(A) and of op(B); Bf16TilesExact decides from the two
// whether the tiles may run. A nonzero product of magnitudes >= 2^(ea-127)
// and >= 2^(eb-127) (biased exponents ea, eb >= 1) is >= 2^(ea+eb-254), an
// fp32 normal when ea + eb >= 128: then only a sum that cancels to below
// 2^-126 is flushed (an absolute error < 2^-126).
constexpr uint16_t kNoMagnitude = 0xFFFF;
inline uint16_t NonzeroMagnitude(uint16_t h) {
  const uint16_t mag = h & 0x7FFFu;
  return mag != 0 ? mag : kNoMagnitude;
}
bool Bf16TilesExact(uint16_t min_a, uint16_t min_b) {
  const int ea = min_a >> 7, eb = min_b >> 7;  // kNoMagnitude: 511
  return ea != 0 && eb != 0 && ea + eb >= 128;
}
void AtomicMinU16(std::atomic<uint16_t>& a, uint16_t v) {
  for (uint16_t cur = a.load(std::memory_order_relaxed);
       v < cur && !a.compare_exchange_weak(cur, v, std::memory_order_relaxed);) {
  }
}

struct Bf16Job {
  int64_t m, n, k, kp;        // kp = K pairs (K rounded up to even / 2)
  int64_t kpa;                // pairs per packed panel: kp, or with amx kp rounded up to kAmxPairs
  bool amx = false;           // AMX tiles (packed A per kAmxRows block: see PackAAmxBody)
  int mr = kMR;               // rows per A block: kMR, or kAmxRows with amx
  int64_t gp = kGroupPanels;  // column panels per task
  bool transa, transb;
  const uint16_t* a;
  const uint16_t* b;
  uint32_t* ap;  // [ceil(M / kMR)][kp][kMR] pairs (amx: [ceil(M / kAmxRows)][kpa / kAmxPairs][kAmxRows][kAmxPairs])
  uint32_t* bp;  // [ceil(N / kNR)][kpa][kNR] pairs
  float alpha, beta;
  float* c;                   // [M, N] fp32; beta != 0: holds Cterm
  uint16_t* out16;            // direct bf16 output [M, N] (then c is unused), or NULL
  const float* bias;          // [N] fp32 added before the bf16 rounding, or NULL
  bool gelu = false;          // out16 = bf16(gelu(alpha * sum + bias)) (GeluTileBf16)
  uint16_t* pre16 = nullptr;  // with gelu: bf16(alpha * sum + bias) [M, N], or NULL
  bool native_bf16 = false;   // with gelu: UseBf16NativeStore() (GeluTileBf16's rounding)
  int64_t m_blocks, n_panels, m_supers, n_groups;
  bool row_a = false;  // the tiles read row-major A in place, A scanned instead of packed: with amx (set by
                       // Bf16Setup) all but a partial last row block (AmxA); else the direct path's
                       // vdpbf16ps tiles (set by Bf16FusedDirect)
  // The smallest nonzero magnitudes packing or scanning saw (Bf16TilesExact).
  std::atomic<uint16_t> min_a{kNoMagnitude}, min_b{kNoMagnitude};
  void NoteA(uint16_t mag) { AtomicMinU16(min_a, mag); }
  void NoteB(uint16_t mag) { AtomicMinU16(min_b, mag); }
  // FusedSchedule's interface: the tiles must not run (D stays untouched).
  bool Stopped() const {
    return !Bf16TilesExact(min_a.load(std::memory_order_relaxed), min_b.load(std::memory_order_relaxed));
  }
};

// GCC 12 reports the undefined pass-through operands of the shuffle and
// extract intrinsics as uninitialized (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
// Per lane: a bf16's magnitude bits minus 1, wrapping, so that +-0 becomes
// 0xFFFF and an unsigned min over lanes skips zeros without a compare (two
// operations per vector: packing runs these on every value it moves). The
// lanes start at 0xFFFF; MinLane turns the min back into a magnitude.
__attribute__((target("avx512f,avx512bw"))) inline __m512i MagnitudeLess1(__m512i v) {
  return _mm512_sub_epi16(_mm512_and_si512(v, _mm512_set1_epi16(0x7FFF)), _mm512_set1_epi16(1));
}
__attribute__((target("avx2"))) inline __m256i MagnitudeLess1(__m256i v) {
  return _mm256_sub_epi16(_mm256_and_si256(v, _mm256_set1_epi16(0x7FFF)), _mm256_set1_epi16(1));
}
// The smallest nonzero magnitude of lanes of MagnitudeLess1 values
// (kNoMagnitude = 0xFFFF when every lane is 0xFFFF: no nonzero value).
__attribute__((target("avx2"))) inline uint16_t MinLane(__m256i v) {
  const __m128i m = _mm_min_epu16(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  const auto less1 = uint16_t(_mm_cvtsi128_si32(_mm_minpos_epu16(m)));
  return less1 == kNoMagnitude ? kNoMagnitude : uint16_t(less1 + 1);
}
__attribute__((target("avx512f,avx512bw"))) inline uint16_t MinLane(__m512i v) {
  return MinLane(_mm256_min_epu16(_mm512_castsi512_si256(v), _mm512_extracti64x4_epi64(v, 1)));
}

// The smallest nonzero magnitude among n bf16 values (kNoMagnitude: none).
// Only called where CpuHasBf16Dot() (so AVX512-BW) holds. 32 values per
// step; exits at the first 4 KiB block holding a subnormal (magnitude below
// 0x80: the tiles cannot take the call whatever the other operand holds).
__attribute__((target("avx512f,avx512bw"))) uint16_t MinMagnitudeBf16(const void* p, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(p);
  __m512i lo = _mm512_set1_epi16(-1);
  int64_t i = 0;
  constexpr int64_t kBlock = 2048;  // values per early-exit check
  for (; i + kBlock <= n; i += kBlock) {
    for (int64_t j = i; j < i + kBlock; j += 32) lo = _mm512_min_epu16(lo, MagnitudeLess1(_mm512_loadu_si512(h + j)));
    if (_mm512_cmplt_epu16_mask(lo, _mm512_set1_epi16(0x7F))) return MinLane(lo);  // magnitude 1 .. 0x7F
  }
  uint16_t m = MinLane(lo);
  for (; i < n; ++i) m = std::min(m, NonzeroMagnitude(h[i]));
  return m;
}
#pragma GCC diagnostic pop

// Element (i, kk) of op(A) and (kk, j) of op(B) as bf16 bits; 0 outside.
uint16_t ElemA(const Bf16Job& g, int64_t i, int64_t kk) {
  if (i >= g.m || kk >= g.k) return 0;
  return g.transa ? g.a[kk * g.m + i] : g.a[i * g.k + kk];
}
uint16_t ElemB(const Bf16Job& g, int64_t kk, int64_t j) {
  if (j >= g.n || kk >= g.k) return 0;
  return g.transb ? g.b[j * g.k + kk] : g.b[kk * g.n + j];
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// In place: r[q] becomes column q of the 8 x 8 block of 32-bit values whose
// row i is r[i] (AVX2 unpacks and lane permutes).
__attribute__((target("avx2"))) inline void Transpose8x8Epi32(__m256i r[8]) {
  __m256i u[8];
  for (int h = 0; h < 8; h += 4) {
    const __m256i t0 = _mm256_unpacklo_epi32(r[h], r[h + 1]), t1 = _mm256_unpackhi_epi32(r[h], r[h + 1]);
    const __m256i t2 = _mm256_unpacklo_epi32(r[h + 2], r[h + 3]), t3 = _mm256_unpackhi_epi32(r[h + 2], r[h + 3]);
    u[h] = _mm256_unpacklo_epi64(t0, t2);      // columns 0 | 4 of rows h..h+3
    u[h + 1] = _mm256_unpackhi_epi64(t0, t2);  // 1 | 5
    u[h + 2] = _mm256_unpacklo_epi64(t1, t3);  // 2 | 6
    u[h + 3] = _mm256_unpackhi_epi64(t1, t3);  // 3 | 7
  }
  for (int q = 0; q < 4; ++q) {
    r[q] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x20);
    r[q + 4] = _mm256_permute2x128_si256(u[q], u[q + 4], 0x31);
  }
}

// Eight rows of K-contiguous bf16 (row i at a + i * k), pairs [0, full_p):
// 8 rows x 8 pairs at a time, an 8 x 8 transpose of 32-bit pairs (AVX2);
// pair p of row i goes to dst[p * ld + i]. The smallest nonzero magnitude of
// the loaded rows is folded into *min_mag on the way. Returns the first pair
// not packed. Packs a full 8-row block of A (no transa, ld = kMR) and 8
// columns of a B panel (transb, ld = kNR).
__attribute__((target("avx2,avx512f,avx512bw,avx512vl"))) int64_t PackRows8(const uint16_t* a, int64_t k,
                                                                            int64_t full_p, uint32_t* dst, int64_t ld,
                                                                            uint16_t* min_mag) {
  __m256i lo = _mm256_set1_epi16(-1);
  int64_t p = 0;
  for (; p + 8 <= full_p; p += 8) {
    __m256i r[8];
    for (int i = 0; i < 8; ++i) {
      r[i] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + i * k + 2 * p));
      lo = _mm256_min_epu16(lo, MagnitudeLess1(r[i]));
    }
    Transpose8x8Epi32(r);
    for (int q = 0; q < 8; ++q) _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (p + q) * ld), r[q]);
  }
  *min_mag = std::min(*min_mag, MinLane(lo));
  return p;
}

// Two rows of B (no transb), 32 columns, interleaved into 32 pairs; the
// rows' magnitudes are min-folded into `mags` (MagnitudeLess1 lanes).
__attribute__((target("avx512f,avx512bw"))) inline void PackBPair32(const uint16_t* r0, const uint16_t* r1,
                                                                    uint32_t* dst, __m512i& mags) {
  const __m512i x0 = _mm512_loadu_si512(r0), x1 = _mm512_loadu_si512(r1);
  const __m512i lo = _mm512_unpacklo_epi16(x0, x1), hi = _mm512_unpackhi_epi16(x0, x1);
  _mm512_storeu_si512(dst, _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(0, 1, 8, 9, 2, 3, 10, 11), hi));
  _mm512_storeu_si512(dst + 16, _mm512_permutex2var_epi64(lo, _mm512_setr_epi64(4, 5, 12, 13, 6, 7, 14, 15), hi));
  mags = _mm512_min_epu16(mags, _mm512_min_epu16(MagnitudeLess1(x0), MagnitudeLess1(x1)));
}
#pragma GCC diagnostic pop

// Packing records the smallest nonzero magnitude of what it packs
// (g.NoteA / NoteB, for Bf16TilesExact): the vector paths on the loaded
// rows, the others on the packed block while it is in cache. One pass over
// A and B instead of a scan and a pack.
void PackABody(void* ctx, int64_t begin, int64_t end) {
  auto& g = *static_cast<Bf16Job*>(ctx);
  const int64_t full_p = g.k / 2;  // pairs inside K
  uint16_t mag = kNoMagnitude;
  for (int64_t blk = begin; blk < end; ++blk) {
    uint32_t* dst = g.ap + size_t(blk) * size_t(g.kp) * kMR;
    int64_t p0 = 0;
    bool checked = false;
    if ((blk + 1) * kMR <= g.m) {  // a full block
      if (!g.transa) {
        const uint16_t* a0 = g.a + blk * kMR * g.k;
        const int64_t pv = PackRows8(a0, g.k, full_p, dst, kMR, &mag);
        for (int r = 0; r < kMR; ++r) {
          const uint16_t* row = a0 + r * g.k;
          for (int64_t p = pv; p < full_p; ++p) std::memcpy(&dst[p * kMR + r], row + 2 * p, 4);
          if (pv < full_p) mag = std::min(mag, MinMagnitudeBf16(row + 2 * pv, 2 * (full_p - pv)));
        }
        checked = g.kp == full_p;  // an odd K: the tail below is checked with the block
      } else {
        for (int64_t p = 0; p < full_p; ++p) {
          const uint16_t* r0 = g.a + 2 * p * g.m + blk * kMR;
          const uint16_t* r1 = r0 + g.m;
          for (int r = 0; r < kMR; ++r) dst[p * kMR + r] = uint32_t(r0[r]) | (uint32_t(r1[r]) << 16);
        }
      }
      p0 = full_p;
    }
    for (int64_t p = p0; p < g.kp; ++p)
      for (int r = 0; r < kMR; ++r)
        dst[p * kMR + r] =
            uint32_t(ElemA(g, blk * kMR + r, 2 * p)) | (uint32_t(ElemA(g, blk * kMR + r, 2 * p + 1)) << 16);
    if (!checked) mag = std::min(mag, MinMagnitudeBf16(dst, g.kp * kMR * 2));
  }
  g.NoteA(mag);
}

// PackBBody packs an untransposed B in blocks of kBPackPairs row pairs: per
// block, panel by panel, the block's pairs (each panel's part of the packed
// B is then written in 1 KiB runs; pair by pair across all panels, each
// 128-byte store went to a panel 64 KiB or more away). The lines of the pair
// kBPackPairs ahead are prefetched (the hardware prefetcher does not follow
// the 2-row strides). B packing alone (bench_gemm, tiles skipped), 4096 x
// 4096 x 1024: 0.36-0.41 -> 0.31-0.32 ms on two threads, 0.82 -> 0.69-0.70 on
// one; bf16 512^3 0.156-0.160 -> 0.146-0.148 ms (docs/perf-gemm.md, session 32).
constexpr int64_t kBPackPairs = 8;
// The full panels [begin, full_end) of an untransposed B, kBPackPairs row
// pairs at a time across all of them: each row's part is read in one
// contiguous run (panel by panel over the whole of K, each 64-byte piece of
// a row was a separate page visit: row strides are often 4 KiB). Returns the
// smallest nonzero magnitude packed.
__attribute__((target("avx512f,avx512bw"))) uint16_t PackBFullPanels(const Bf16Job& g, int64_t begin,
                                                                     int64_t full_end) {
  const int64_t full_p = g.k / 2;
  __m512i mags = _mm512_set1_epi16(-1);
  for (int64_t p0 = 0; p0 < full_p && begin < full_end; p0 += kBPackPairs) {
    const int64_t p1 = std::min(full_p, p0 + kBPackPairs);
    for (int64_t pan = begin; pan < full_end; ++pan) {
      for (int64_t p = p0; p < p1; ++p) {
        const uint16_t* r0 = g.b + 2 * p * g.n + pan * kNR;
        const uint16_t* ahead = r0 + (p + kBPackPairs < full_p ? 2 * kBPackPairs * g.n : 0);
        _mm_prefetch(reinterpret_cast<const char*>(ahead), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(ahead + g.n), _MM_HINT_T0);
        PackBPair32(r0, r0 + g.n, g.bp + (size_t(pan) * size_t(g.kpa) + size_t(p)) * kNR, mags);
      }
    }
  }
  return MinLane(mags);
}
void PackBBody(void* ctx, int64_t begin, int64_t end) {
  auto& g = *static_cast<Bf16Job*>(ctx);
  const int64_t full_p = g.k / 2;
  uint16_t mag = kNoMagnitude;
  if (!g.transb) mag = PackBFullPanels(g, begin, std::min(end, g.n / kNR));
  for (int64_t pan = begin; pan < end; ++pan) {
    uint32_t* dst = g.bp + size_t(pan) * size_t(g.kpa) * kNR;
    int64_t p0 = 0;
    bool checked = false;
    if ((pan + 1) * kNR <= g.n) {  // a full panel
      if (!g.transb) {             // packed above
        checked = g.kp == full_p;
      } else {  // B is [N, K]: column j of op(B) is row j, K contiguous
        for (int j0 = 0; j0 < kNR; j0 += 8) {
          const uint16_t* b0 = g.b + (pan * kNR + j0) * g.k;
          const int64_t pv = PackRows8(b0, g.k, full_p, dst + j0, kNR, &mag);
          for (int j = 0; j < 8; ++j) {
            const uint16_t* col = b0 + j * g.k;
            for (int64_t p = pv; p < full_p; ++p) std::memcpy(&dst[p * kNR + j0 + j], col + 2 * p, 4);
            if (pv < full_p) mag = std::min(mag, MinMagnitudeBf16(col + 2 * pv, 2 * (full_p - pv)));
          }
        }
        checked = g.kp == full_p;
      }
      p0 = full_p;
    }
    // the odd-K pair and (amx) the zero pairs up to kpa
    for (int64_t p = p0; p < g.kpa; ++p)
      for (int j = 0; j < kNR; ++j)
        dst[p * kNR + j] =
            uint32_t(ElemB(g, 2 * p, pan * kNR + j)) | (uint32_t(ElemB(g, 2 * p + 1, pan * kNR + j)) << 16);
    if (!checked) mag = std::min(mag, MinMagnitudeBf16(dst, g.kpa * kNR * 2));
  }
  g.NoteB(mag);
}

// AMX packing of op(A): per block of kAmxRows rows and per K step of
// kAmxPairs pairs, one [kAmxRows][kAmxPairs] array of pairs (row r holds
// op(A)[r, 32 c .. 32 c + 31]: two 16 x 64-byte tiles, contiguous); rows past
// M and K past its end are zeros (0 * 0 adds nothing to D).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
__attribute__((target("avx512f,avx512bw"))) void PackAAmxBody(void* ctx, int64_t begin, int64_t end) {
  auto& g = *static_cast<Bf16Job*>(ctx);
  const int64_t chunks = g.kpa / kAmxPairs;
  constexpr int64_t kChunkWords = int64_t(kAmxRows) * kAmxPairs;
  uint16_t mag = kNoMagnitude;
  for (int64_t blk = begin; blk < end; ++blk) {
    uint32_t* dst = g.ap + size_t(blk) * size_t(g.kpa) * kAmxRows;
    const int64_t i0 = blk * kAmxRows;
    const int rows = int(std::min<int64_t>(kAmxRows, g.m - i0));
    if (!g.transa) {
      __m512i mags = _mm512_set1_epi16(-1);
      for (int r = 0; r < kAmxRows; ++r) {
        const uint16_t* row = g.a + (i0 + r) * g.k;
        for (int64_t c = 0; c < chunks; ++c) {
          __m512i v = _mm512_setzero_si512();
          if (r < rows) {  // every step holds at least one element of K (kpa < kp + kAmxPairs)
            const int64_t left = g.k - 2 * kAmxPairs * c;
            const __mmask32 m = left >= 32 ? __mmask32(~0u) : __mmask32((1u << left) - 1);
            const uint16_t* src = row + 2 * kAmxPairs * c;
            // 8 lines ahead in A's row-major stream (into the next row at a
            // row's end; a prefetch past A's end is harmless).
            _mm_prefetch(reinterpret_cast<const char*>(src) + 512, _MM_HINT_T0);
            v = _mm512_maskz_loadu_epi16(m, src);
            mags = _mm512_min_epu16(mags, MagnitudeLess1(v));
          }
          _mm512_storeu_si512(dst + c * kChunkWords + r * kAmxPairs, v);
        }
      }
      mag = std::min(mag, MinLane(mags));
    } else {  // A is [K, M]: row i of op(A) is column i of A
      // Full blocks, whole steps: each K pair of the block's 32 columns
      // interleaved into 32 words (PackBPair32, which checks them), then the
      // step's [pair][row] words transposed to [row][pair] by 8 x 8 blocks.
      int64_t steps_done = 0;
      if (rows == kAmxRows) {
        alignas(64) uint32_t w[kAmxPairs * kAmxRows];
        __m512i mags = _mm512_set1_epi16(-1);
        for (; 2 * kAmxPairs * (steps_done + 1) <= g.k; ++steps_done) {
          for (int p = 0; p < kAmxPairs; ++p) {
            const uint16_t* r0 = g.a + 2 * (steps_done * kAmxPairs + p) * g.m + i0;
            PackBPair32(r0, r0 + g.m, w + p * kAmxRows, mags);
          }
          for (int p0 = 0; p0 < kAmxPairs; p0 += 8)
            PackRows8(reinterpret_cast<const uint16_t*>(w + p0 * kAmxRows), 2 * kAmxRows, kAmxRows,
                      dst + steps_done * kChunkWords + p0, kAmxPairs, &mag);
        }
        mag = std::min(mag, MinLane(mags));
      }
      // The rest (a partial block, the last partial step): zeros, then
      // element by element, checked after.
      uint32_t* rest = dst + steps_done * kChunkWords;
      const int64_t rest_words = g.kpa * kAmxRows - steps_done * kChunkWords;
      if (rest_words > 0) {
        std::memset(rest, 0, size_t(rest_words) * 4);
        auto* d16 = reinterpret_cast<uint16_t*>(dst);
        for (int64_t kk = steps_done * 2 * kAmxPairs; kk < g.k; ++kk) {
          const uint16_t* src = g.a + kk * g.m + i0;
          uint16_t* out = d16 + (kk / (2 * kAmxPairs)) * kChunkWords * 2 + kk % (2 * kAmxPairs);
          for (int r = 0; r < rows; ++r) out[r * 2 * kAmxPairs] = src[r];
        }
        mag = std::min(mag, MinMagnitudeBf16(rest, rest_words * 2));
      }
    }
  }
  g.NoteA(mag);
}
#pragma GCC diagnostic pop

// GCC 12 reports its own _mm512_undefined_*() placeholders inside the
// shift/narrowing intrinsics as "maybe uninitialized" (a false positive).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// The rows of a finished tile, acc [rows][kNR] fp32 sums (64-byte aligned):
// C[rows, cols] (ld ldc) = alpha * acc + beta * C; with out16, instead
// out16[rows, cols] (ld ldc) = bf16(alpha * acc + bias) and C is not touched;
// stream: full 64-byte-aligned out16 rows by non-temporal stores (the caller
// fences).
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void StoreAccRows(const float* acc, int rows, int cols,
                                                                                  float alpha, float beta, float* c,
                                                                                  int64_t ldc, uint16_t* out16,
                                                                                  const float* bias,
                                                                                  bool stream = false) {
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const auto [m0, m1] = MasksOf32(cols);
  if (out16 != nullptr) {
    const __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
    const __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
    const __mmask32 m32 = __mmask32(m0) | (__mmask32(m1) << 16);
    for (int r = 0; r < rows; ++r) {
      uint16_t* row = out16 + r * ldc;
      __m512 v0 = _mm512_mul_ps(_mm512_load_ps(acc + r * kNR), va);
      __m512 v1 = _mm512_mul_ps(_mm512_load_ps(acc + r * kNR + 16), va);
      if (bias) {
        v0 = _mm512_add_ps(v0, bias0);
        v1 = _mm512_add_ps(v1, bias1);
      }
      // vcvtne2ps2bf16: round to nearest even, NaN quieted with its payload
      // kept (as FloatToBF16); an fp32 subnormal (|v| < 2^-126, only from
      // alpha or bias: the dot products already flush them) becomes 0.
      const __m512i h = (__m512i)_mm512_cvtne2ps_pbh(v1, v0);
      if (stream && cols == kNR && reinterpret_cast<uintptr_t>(row) % 64 == 0) {
        _mm512_stream_si512(reinterpret_cast<__m512i*>(row), h);
      } else {
        _mm512_mask_storeu_epi16(row, m32, h);
      }
    }
    return;
  }
  for (int r = 0; r < rows; ++r) {
    float* row = c + r * ldc;
    __m512 v0 = _mm512_mul_ps(_mm512_load_ps(acc + r * kNR), va);
    __m512 v1 = _mm512_mul_ps(_mm512_load_ps(acc + r * kNR + 16), va);
    if (beta != 0.0f) {
      v0 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m0, row), vb, v0);
      v1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m1, row + 16), vb, v1);
    }
    _mm512_mask_storeu_ps(row, m0, v0);
    _mm512_mask_storeu_ps(row + 16, m1, v1);
  }
}

// n 64-byte rows src[0..n) to dst, dst + ld, ... by non-temporal stores.
__attribute__((target("avx512f"))) void StreamRows(const __m512i* src, char* dst, int64_t ld, int64_t n) {
  for (int64_t i = 0; i < n; ++i) _mm512_stream_si512(reinterpret_cast<__m512i*>(dst + i * ld), src[i]);
}

// GeluTileBf16 on bf16 bits (see there): acc [rows][kNR], columns [col0,
// col0 + cols) of an n-column D; pre16 / out16 at the tile's first element.
void GeluTile(const float* acc, int rows, int cols, int64_t col0, int64_t n, float alpha, const float* bias,
              uint16_t* pre16, uint16_t* out16, int64_t ld, bool native, bool stream) {
  HWY_DYNAMIC_DISPATCH(GeluTileBf16)
  (acc, kNR, size_t(rows), size_t(col0), size_t(cols), size_t(n), alpha, bias,
   reinterpret_cast<hwy::bfloat16_t*>(pre16), reinterpret_cast<hwy::bfloat16_t*>(out16), size_t(ld), native, stream);
}
// Where a tile's GELU epilogue goes (GeluTile): the tile's first column in
// D, D's columns, and pre_gelu_out at the tile's first element or NULL.
struct GeluStore {
  int64_t col0, n;
  uint16_t* pre16;
  bool native;  // UseBf16NativeStore()
};
// One 8 x 32 tile of D by vdpbf16ps over kp pairs, stored by StoreAccRows
// (with `gelu`, by GeluTileBf16 into out16).
// kRowA: ap is row-major A itself (no transa, even K, 4-byte aligned: the
// K pair (2p, 2p + 1) of row r is the word ap[r * lda_w + p]); rows past
// `rows` re-read the last valid row (never past A), their sums discarded.
template <bool kRowA>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void Bf16Tile(
    const uint32_t* ap, const uint32_t* bp, int64_t kp, float* c, int64_t ldc, int rows, int cols, float alpha,
    float beta, uint16_t* out16, const float* bias, int64_t lda_w = 0, const GeluStore* gelu = nullptr) {
  // 16 named accumulators: an array indexed in a loop would live on the stack.
  __m512 c00 = _mm512_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00;
  __m512 c40 = c00, c41 = c00, c50 = c00, c51 = c00, c60 = c00, c61 = c00, c70 = c00, c71 = c00;
  const uint32_t* ar[kMR];
  if constexpr (kRowA)
    for (int r = 0; r < kMR; ++r) ar[r] = ap + std::min(r, rows - 1) * lda_w;
  for (int64_t p = 0; p < kp; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(bp + p * kNR);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(bp + p * kNR + 16);
    const uint32_t* a = ap + p * kMR;
    // A's block streams from L3 on its first use (B's panel group stays in
    // L2): fetch it kAPrefetch pairs ahead (measured +2-4 %). An address
    // past the block is harmless for a prefetch (no fault, no access).
    if constexpr (kRowA) {
      // one of the 8 rows per step: each row's line is fetched twice ahead
      __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(ar[p & 7] + p) + 2 * kAPrefetch * 4),
                         0, 3);
    } else {
      __builtin_prefetch(reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(a) + kAPrefetch * kMR * 4), 0, 3);
    }
#define TEFL_BF16_ROW(r)                                                           \
  {                                                                                \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(int(kRowA ? ar[r][p] : a[r])); \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, av, b0);                                   \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, av, b1);                                   \
  }
    TEFL_BF16_ROW(0)
    TEFL_BF16_ROW(1)
    TEFL_BF16_ROW(2)
    TEFL_BF16_ROW(3)
    TEFL_BF16_ROW(4)
    TEFL_BF16_ROW(5)
    TEFL_BF16_ROW(6)
    TEFL_BF16_ROW(7)
#undef TEFL_BF16_ROW
  }
  alignas(64) float acc[kMR * kNR];
#define TEFL_BF16_SAVE(r)                  \
  _mm512_store_ps(acc + r * kNR, c##r##0); \
  _mm512_store_ps(acc + r * kNR + 16, c##r##1);
  TEFL_BF16_SAVE(0)
  TEFL_BF16_SAVE(1)
  TEFL_BF16_SAVE(2)
  TEFL_BF16_SAVE(3)
  TEFL_BF16_SAVE(4)
  TEFL_BF16_SAVE(5)
  TEFL_BF16_SAVE(6)
  TEFL_BF16_SAVE(7)
#undef TEFL_BF16_SAVE
  if (gelu)
    return GeluTile(acc, rows, cols, gelu->col0, gelu->n, alpha, bias, gelu->pre16, out16, ldc, gelu->native, false);
  StoreAccRows(acc, rows, cols, alpha, beta, c, ldc, out16, bias);
}

#pragma GCC diagnostic pop

// ---- AMX tiles (tdpbf16ps) ---------------------------------------------------------
// Eight 16 x 64-byte tiles: 0-3 accumulate a kAmxRows x kNR block of D in
// fp32, 4-5 hold two 16-row A tiles, 6-7 two 16-column B tiles of the packed
// B panel (its rows of kNR pairs are exactly the B tile layout tdpbf16ps
// reads: one K pair per 4-byte element). tdpbf16ps, like vdpbf16ps, reads
// subnormal bf16 inputs as zero and flushes subnormal results, so the same
// subnormal checks guard it. Each thread loads the tile configuration
// (amx_tiles.h) before its tasks and releases the tiles after.
// Where the AMX tiles read a row block of A from a K step on: its two
// 16-row tiles at p and p + hi (words), rows ld bytes apart, the next
// step's step words further: A itself (g.row_a, a full block: rows K bf16
// apart, a step 16 words along them) or the packed block (contiguous).
struct AmxASource {
  const uint32_t* p;
  int64_t ld, hi, step;
};
// Tiles 0-3 = the 32 x 32 fp32 sums at acc ([kAmxRows][kNR]), or zero when
// `first`.
__attribute__((target("amx-tile"), always_inline)) inline void AmxLoadSums(const float* acc, bool first) {
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, acc, kNR * 4);
    _tile_loadd(1, acc + 16, kNR * 4);
    _tile_loadd(2, acc + 16 * kNR, kNR * 4);
    _tile_loadd(3, acc + 16 * kNR + 16, kNR * 4);
  }
}
// For each of the nblk row blocks a[0..nblk) in turn, acc + j * kAmxRows *
// kNR ([kAmxRows][kNR] fp32) (+)= block j . B panel over `steps` K steps of
// kAmxPairs pairs (bp: the chunk's first step): `first` starts from zero,
// else from acc. Between two blocks the next block's A and B tiles are
// loaded while the finished sums are stored, before the next sums are
// loaded (a call per block, packed A: 512^3 and 4096^2 x 512 ~2 % slower;
// docs/perf-gemm.md, session 30). Not inlined, and fenced: GCC's tile
// intrinsics are asm statements that do not tell the compiler which memory
// they read or write. A's tiles are loaded by tileloaddt1
// (_tile_stream_loadd: a hint not to keep them in L1): a call reads each of
// its A steps once and the next read of them is a panel later, from L2, so
// in L1 they would only evict the B chunk that the task's row blocks share
// (docs/perf-gemm.md, session 38). pf: pf_per_step cache lines per step are
// prefetched into L2 from there on (AmxBody), interleaved with the tiles (a
// burst of prefetches stalls on the fill buffers). dsrc: d_per_step staged
// 64-byte rows of D per step are written by non-temporal stores to ddst,
// ddst + dld, ... (AmxBody's spread D stores).
__attribute__((target("amx-tile,amx-bf16,avx512f"), noinline)) void AmxBlocks(
    const AmxASource* a, int64_t nblk, const uint32_t* bp, int64_t steps, float* acc, bool first, const char* pf,
    int64_t pf_per_step, const __m512i* dsrc, char* ddst, int64_t dld, int64_t d_per_step) {
  asm volatile("" ::: "memory");
  AmxLoadSums(acc, first);
  // Software-pipelined: tiles are not renamed, so each load is issued as
  // soon as the tile it overwrites has been read by its last product, a
  // step ahead of its own products (steps >= 1).
  _tile_stream_loadd(4, a[0].p, a[0].ld);
  _tile_loadd(6, bp, kNR * 4);
  _tile_loadd(7, bp + 16, kNR * 4);
  _tile_stream_loadd(5, a[0].p + a[0].hi, a[0].ld);
  for (int64_t j = 0; j < nblk; ++j) {
    const uint32_t* ap = a[j].p;
    const int64_t a_ld = a[j].ld, a_hi = a[j].hi, a_step = a[j].step;
    const uint32_t* b = bp;
    for (int64_t st = 1; st < steps; ++st) {
      ap += a_step;
      b += kAmxPairs * kNR;
      for (int64_t i = 0; i < pf_per_step; ++i, pf += 64) _mm_prefetch(pf, _MM_HINT_T1);
      for (int64_t i = 0; i < d_per_step; ++i, ++dsrc, ddst += dld)
        _mm512_stream_si512(reinterpret_cast<__m512i*>(ddst), _mm512_load_si512(dsrc));
      _tile_dpbf16ps(0, 4, 6);
      _tile_dpbf16ps(1, 4, 7);
      _tile_stream_loadd(4, ap, a_ld);
      _tile_dpbf16ps(2, 5, 6);
      _tile_loadd(6, b, kNR * 4);
      _tile_dpbf16ps(3, 5, 7);
      _tile_stream_loadd(5, ap + a_hi, a_ld);
      _tile_loadd(7, b + 16, kNR * 4);
    }
    float* c = acc + j * (kAmxRows * kNR);
    const bool more = j + 1 < nblk;
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if (more) _tile_stream_loadd(4, a[j + 1].p, a[j + 1].ld);
    _tile_dpbf16ps(2, 5, 6);
    _tile_dpbf16ps(3, 5, 7);
    _tile_stored(0, c, kNR * 4);
    _tile_stored(1, c + 16, kNR * 4);
    if (more) {
      _tile_loadd(6, bp, kNR * 4);
      _tile_stream_loadd(5, a[j + 1].p + a[j + 1].hi, a[j + 1].ld);
      _tile_loadd(7, bp + 16, kNR * 4);
    }
    _tile_stored(2, c + 16 * kNR, kNR * 4);
    _tile_stored(3, c + 16 * kNR + 16, kNR * 4);
    if (more) AmxLoadSums(c + kAmxRows * kNR, first);
  }
  asm volatile("" ::: "memory");
}

// Tasks of kSuperRows rows x g.gp panels (as Bf16DirectBody); D is written
// once per block, as bf16 (out16, bias added) or fp32 (c, beta applied).
// Blocking (measured on Sapphire Rapids, docs/perf-gemm.md): per panel, K
// runs in chunks of AmxChunkSteps steps over the task's row blocks, whose
// sums wait in acc (L1) between chunks, so one chunk of the B panel (16 or
// 32 KiB) serves every row block from L1; the task's A rows and the group's
// B panels stay in L2 across the task.
constexpr int64_t kAmxChunkSteps = 8, kAmxLongChunkSteps = 16, kAmxLongChunkMaxK = 2048;
// A bf16 D of at least this many bytes is written with non-temporal stores
// (each full 32-column row of a block is one 64-byte line): it would not
// stay in L2 anyway, and plain stores first read every line of D and push
// the task's B panels out of L2. bench_gemm, alternated: 4096 x 4096 x 1024
// ~10 % faster, 2048^3 (D 8 MiB) 5-7 % (docs/perf-gemm.md, session 27).
constexpr int64_t kAmxStreamBytes = int64_t(8) << 20;
// Packed A of at least this many bytes: the next task's rows are prefetched
// (AmxBody). 4096 x 4096 x 1024 4-5 % faster, 2048^3 level (bench_gemm,
// alternated, session 27).
constexpr int64_t kAmxPrefetchABytes = int64_t(2) << 20;
// The AMX tiles read an untransposed, 64-byte-aligned A in place (tile
// rows K bf16 apart; A only scanned for subnormals, not packed) when K is a
// multiple of 32 and at least this. With A's tiles loaded by tileloaddt1
// (session 38, alternated in one process against a packed A): 1024^3 10 %,
// 2048^3 1 % faster, 4096^2 x 1024 level; at K = 512 4096^2 x 512 8 % slower
// (512^3 7 % faster). A partial last row block is still packed (its rows
// past M are zeros).
constexpr int64_t kAmxInPlaceMinK = 1024;
// Steps per K chunk: kAmxLongChunkSteps (a 32 KiB B chunk; each block's sums
// stored and reloaded half as often) for an A read in place with K below
// kAmxLongChunkMaxK and no GELU fused into the tiles' stores (g.gelu: a
// bf16 D through GeluTile), else kAmxChunkSteps. Alternated in one process
// (docs/perf-gemm.md, session 38), 16 against 8 steps: 4096^2 x 1024 4-6 %,
// 2048^2 x 1024 5 % and 4096^2 x 1536 5 % faster; 4096^2 x 512 (packed A)
// 6 %, 2048^3 (rows 4 KiB apart) 2 % and the fused GELU 3 % slower.
int64_t AmxChunkSteps(const Bf16Job& g) {
  return g.row_a && g.k < kAmxLongChunkMaxK && !g.gelu ? kAmxLongChunkSteps : kAmxChunkSteps;
}
// Where AmxBlocks reads row block blk of op(A) from K step s0 on.
AmxASource AmxA(const Bf16Job& g, int64_t blk, int64_t s0) {
  if (g.row_a && (blk + 1) * kAmxRows <= g.m)
    return {reinterpret_cast<const uint32_t*>(g.a + size_t(blk) * kAmxRows * size_t(g.k)) + s0 * kAmxPairs, g.k * 2,
            16 * (g.k / 2), kAmxPairs};
  return {g.ap + size_t(blk) * size_t(g.kpa) * kAmxRows + size_t(s0) * (kAmxRows * kAmxPairs), kAmxPairs * 4,
          16 * kAmxPairs, kAmxRows * kAmxPairs};
}
// Packed B panel pan from K step s0 on.
const uint32_t* AmxB(const Bf16Job& g, int64_t pan, int64_t s0) {
  return g.bp + size_t(pan) * size_t(g.kpa) * kNR + size_t(s0) * (kAmxPairs * kNR);
}
void AmxBody(void* ctx, int64_t begin, int64_t end) {
  const auto& g = *static_cast<const Bf16Job*>(ctx);
  constexpr int64_t blocks_per_super = kSuperRows / kAmxRows;
  const int64_t steps = g.kpa / kAmxPairs, chunk = AmxChunkSteps(g);
  alignas(64) float acc[kSuperRows / kAmxRows][kAmxRows * kNR];
  const bool stream = g.out16 != nullptr && g.m * g.n * 2 >= kAmxStreamBytes;
  const bool prefetch_a = g.m_blocks * g.kpa * kAmxRows * 4 >= kAmxPrefetchABytes;
  // A streamed bf16 D with every row 64-byte aligned: at the end of a panel
  // of a task of full row blocks, its rows are converted into `stage` and
  // written out by AmxBlocks one per tile step during the next panel (what
  // is left, at the end of that panel or of the range). All of a panel's 64
  // non-temporal stores at once held the fill buffers that the tile loads
  // from L2 need: bench_gemm 4096 x 4096 x 1024 12.2-12.3 -> 11.6-11.8 ms on
  // two threads, 24.1-24.7 -> 23.1-23.3 on one (docs/perf-gemm.md, session
  // 31). One row per step rather than the rows spread evenly over the
  // panel's steps (two per step at K = 1024, three at K = 512): 1-2 % faster
  // (session 38).
  alignas(64) __m512i stage[kSuperRows];
  const bool spread = stream && !g.gelu && g.n % kNR == 0 && reinterpret_cast<uintptr_t>(g.out16) % 64 == 0;
  int64_t staged = 0, drained = 0;
  char* stage_dst = nullptr;
  const int64_t dld = g.n * 2;
  auto drain_all = [&] {
    if (drained < staged) StreamRows(stage + drained, stage_dst + drained * dld, dld, staged - drained);
    drained = staged;
  };
  AmxBegin();
  for (int64_t t = begin; t < end; ++t) {
    const int64_t grp = t / g.m_supers, sup = t % g.m_supers;
    const int64_t p0 = grp * g.gp, p1 = std::min(g.n_panels, p0 + g.gp);
    const int64_t b0 = sup * blocks_per_super, b1 = std::min(g.m_blocks, b0 + blocks_per_super);
    // One AmxBlocks call covers the task's nblk row blocks (session 38: level
    // with a call per block, which an L1 prefetch of each call's first step
    // needed before A was loaded by tileloaddt1).
    const int64_t nblk = b1 - b0;
    const bool spread_task = spread && nblk * kAmxRows <= g.m - b0 * kAmxRows;
    // The packed A rows of the group's next task (sup + 1, which this thread
    // most likely runs next) are prefetched into L2 a few lines before each
    // block's chunk: they were packed by either thread, so its first panel
    // would otherwise wait on L3 for them tile by tile. Only for a packed A
    // larger than an L2 (smaller ones stay cached: 512^3 was 5 % slower).
    const char* pf = nullptr;
    const char* pf_end = nullptr;
    int64_t pf_lines = 0;
    if (sup + 1 < g.m_supers && prefetch_a) {
      const int64_t nb0 = b1, nb1 = std::min(g.m_blocks, nb0 + blocks_per_super);
      if (g.row_a) {  // A's rows themselves (to its end)
        pf = reinterpret_cast<const char*>(g.a + size_t(nb0) * kAmxRows * size_t(g.k));
        pf_end = reinterpret_cast<const char*>(g.a + size_t(std::min(g.m, nb1 * kAmxRows)) * size_t(g.k));
      } else {
        pf = reinterpret_cast<const char*>(g.ap + size_t(nb0) * size_t(g.kpa) * kAmxRows);
        pf_end = pf + size_t(nb1 - nb0) * size_t(g.kpa) * kAmxRows * 4;
      }
      const int64_t calls = (p1 - p0) * nblk * ((steps + chunk - 1) / chunk);
      pf_lines = ((pf_end - pf) / 64 + calls - 1) / calls;
    }
    // Lines per step of AmxBlocks's loops, for a full chunk and for a
    // shorter last one (divisions out of the call loop: they delayed each call).
    const int64_t last_ns = steps - (steps - 1) / chunk * chunk;
    const int64_t pf_full = (pf_lines + chunk - 2) / (chunk - 1);
    const int64_t pf_last = last_ns > 1 ? (pf_lines + last_ns - 2) / (last_ns - 1) : 0;
    for (int64_t pan = p0; pan < p1; ++pan) {
      for (int64_t s0 = 0; s0 < steps; s0 += chunk) {
        const int64_t ns = std::min(chunk, steps - s0);
        // Lines per step of AmxBlocks's loops.
        const int64_t per_step = pf < pf_end && ns > 1 ? (ns == chunk ? pf_full : pf_last) : 0;
        AmxASource a[blocks_per_super];
        for (int64_t j = 0; j < nblk; ++j) a[j] = AmxA(g, b0 + j, s0);
        // One staged row per step while they last for the whole call; the rest: at the panel's end.
        const int64_t d_per_step = ns > 1 && staged - drained >= (ns - 1) * nblk ? 1 : 0;
        AmxBlocks(a, nblk, AmxB(g, pan, s0), ns, acc[0], s0 == 0, pf, per_step, stage + drained,
                  d_per_step > 0 ? stage_dst + drained * dld : nullptr, dld, d_per_step);
        drained += d_per_step * (ns - 1) * nblk;
        pf += per_step * (ns - 1) * 64 * nblk;
      }
      const int cols = int(std::min<int64_t>(kNR, g.n - pan * kNR));
      if (spread_task) {
        drain_all();
        for (int64_t blk = b0; blk < b1; ++blk)  // each row of the stage is one 64-byte line (kNR bf16)
          StoreAccRows(acc[blk - b0], kAmxRows, kNR, g.alpha, 0.0f, nullptr, kNR,
                       reinterpret_cast<uint16_t*>(stage + (blk - b0) * kAmxRows),
                       g.bias ? g.bias + pan * kNR : nullptr);
        staged = nblk * kAmxRows;
        drained = 0;
        stage_dst = reinterpret_cast<char*>(g.out16 + b0 * kAmxRows * g.n + pan * kNR);
        continue;
      }
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int rows = int(std::min<int64_t>(kAmxRows, g.m - blk * kAmxRows));
        const int64_t at = blk * kAmxRows * g.n + pan * kNR;
        if (g.gelu) {
          GeluTile(acc[blk - b0], rows, cols, pan * kNR, g.n, g.alpha, g.bias ? g.bias + pan * kNR : nullptr,
                   g.pre16 ? g.pre16 + at : nullptr, g.out16 + at, g.n, g.native_bf16, stream);
          continue;
        }
        StoreAccRows(acc[blk - b0], rows, cols, g.alpha, g.beta, g.out16 ? nullptr : g.c + at, g.n,
                     g.out16 ? g.out16 + at : nullptr, g.bias ? g.bias + pan * kNR : nullptr, stream);
      }
    }
  }
  drain_all();
  if (stream) _mm_sfence();
  AmxEnd();
}

// Packing of op(A) blocks [begin, end) in the job's format; with A read in
// place (g.row_a), only the scan of its rows for subnormals, and with the
// AMX tiles the packing of a partial last block (AmxA; the vdpbf16ps tiles
// read every row in place).
void PackABlocks(Bf16Job& g, int64_t begin, int64_t end) {
  if (g.row_a) {
    const int64_t in_place_end = g.amx ? std::min(end, g.m / kAmxRows) : end;
    const int64_t r0 = begin * g.mr, r1 = std::min(g.m, in_place_end * g.mr);
    if (r0 < r1) g.NoteA(MinMagnitudeBf16(g.a + r0 * g.k, (r1 - r0) * g.k));
    if (end > in_place_end) PackAAmxBody(&g, std::max(begin, in_place_end), end);
  } else if (g.amx) {
    PackAAmxBody(&g, begin, end);
  } else {
    PackABody(&g, begin, end);
  }
}
void PackAAnyBody(void* ctx, int64_t begin, int64_t end) { PackABlocks(*static_cast<Bf16Job*>(ctx), begin, end); }

// One task: kSuperRows rows x kGroupPanels panels; tasks of one column group
// are consecutive, so a thread's range shares its B slice. K is walked in
// chunks of kKcPairs pairs: a chunk of one B panel (16 KiB) stays in L1
// while the task's row tiles pass over it; the first chunk applies beta,
// later ones add to the fp32 result.
constexpr int64_t kKcPairs = 128;
void Bf16ComputeBody(void* ctx, int64_t begin, int64_t end) {
  const auto& g = *static_cast<const Bf16Job*>(ctx);
  const int64_t blocks_per_super = kSuperRows / kMR;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t grp = t / g.m_supers, sup = t % g.m_supers;
    const int64_t p0 = grp * g.gp, p1 = std::min(g.n_panels, p0 + g.gp);
    const int64_t b0 = sup * blocks_per_super, b1 = std::min(g.m_blocks, b0 + blocks_per_super);
    for (int64_t k0 = 0; k0 < g.kp; k0 += kKcPairs) {
      const int64_t kc = std::min(kKcPairs, g.kp - k0);
      const float beta = k0 == 0 ? g.beta : 1.0f;
      for (int64_t pan = p0; pan < p1; ++pan) {
        const uint32_t* bp = g.bp + size_t(pan) * size_t(g.kp) * kNR + size_t(k0) * kNR;
        const int cols = int(std::min<int64_t>(kNR, g.n - pan * kNR));
        for (int64_t blk = b0; blk < b1; ++blk) {
          const uint32_t* ap = g.ap + size_t(blk) * size_t(g.kp) * kMR + size_t(k0) * kMR;
          const int rows = int(std::min<int64_t>(kMR, g.m - blk * kMR));
          Bf16Tile<false>(ap, bp, kc, g.c + blk * kMR * g.n + pan * kNR, g.n, rows, cols, g.alpha, beta, nullptr,
                          nullptr);
        }
      }
    }
  }
}

// Direct bf16 output: each tile runs the whole of K in registers and is
// rounded once into D (no fp32 pass over D at all).
void Bf16DirectBody(void* ctx, int64_t begin, int64_t end) {
  const auto& g = *static_cast<const Bf16Job*>(ctx);
  const int64_t blocks_per_super = kSuperRows / kMR;
  for (int64_t t = begin; t < end; ++t) {
    const int64_t grp = t / g.m_supers, sup = t % g.m_supers;
    const int64_t p0 = grp * g.gp, p1 = std::min(g.n_panels, p0 + g.gp);
    const int64_t b0 = sup * blocks_per_super, b1 = std::min(g.m_blocks, b0 + blocks_per_super);
    for (int64_t blk = b0; blk < b1; ++blk) {
      const int rows = int(std::min<int64_t>(kMR, g.m - blk * kMR));
      for (int64_t pan = p0; pan < p1; ++pan) {
        const int cols = int(std::min<int64_t>(kNR, g.n - pan * kNR));
        const uint32_t* bp = g.bp + size_t(pan) * size_t(g.kp) * kNR;
        const int64_t at = blk * kMR * g.n + pan * kNR;
        uint16_t* out = g.out16 + at;
        const float* bias = g.bias ? g.bias + pan * kNR : nullptr;
        const GeluStore gs{pan * kNR, g.n, g.pre16 ? g.pre16 + at : nullptr, g.native_bf16};
        const GeluStore* gelu = g.gelu ? &gs : nullptr;
        if (g.row_a) {
          Bf16Tile<true>(reinterpret_cast<const uint32_t*>(g.a + blk * kMR * g.k), bp, g.kp, nullptr, g.n, rows, cols,
                         g.alpha, 0.0f, out, bias, g.kp, gelu);
        } else {
          Bf16Tile<false>(g.ap + size_t(blk) * size_t(g.kp) * kMR, bp, g.kp, nullptr, g.n, rows, cols, g.alpha, 0.0f,
                          out, bias, 0, gelu);
        }
      }
    }
  }
}

// The scan of A and B over the host pool: chunks of kScanChunk values, each
// folding its smallest nonzero magnitude into min_a or min_b (once the
// tiles are ruled out, later chunks skip their work).
constexpr int64_t kScanChunk = int64_t(1) << 18;
struct ScanCtx {
  const uint16_t* a;
  int64_t na;
  const uint16_t* b;
  int64_t nb;
  std::atomic<uint16_t> min_a{kNoMagnitude}, min_b{kNoMagnitude};
  bool Exact() const {
    return Bf16TilesExact(min_a.load(std::memory_order_relaxed), min_b.load(std::memory_order_relaxed));
  }
};
void ScanBody(void* ctx, int64_t begin, int64_t end) {
  auto& s = *static_cast<ScanCtx*>(ctx);
  const int64_t a_chunks = (s.na + kScanChunk - 1) / kScanChunk;
  for (int64_t c = begin; c < end && s.Exact(); ++c) {
    const bool in_a = c < a_chunks;
    const uint16_t* p = in_a ? s.a : s.b;
    const int64_t n = in_a ? s.na : s.nb, i0 = (in_a ? c : c - a_chunks) * kScanChunk;
    AtomicMinU16(in_a ? s.min_a : s.min_b, MinMagnitudeBf16(p + i0, std::min(kScanChunk, n - i0)));
  }
}

// K pairs per packed panel, and rows per packed A block.
int64_t PanelPairs(int64_t k, bool amx) {
  const int64_t kp = (k + 1) / 2;
  return amx ? (kp + kAmxPairs - 1) / kAmxPairs * kAmxPairs : kp;
}
int BlockRows(bool amx) { return amx ? kAmxRows : kMR; }

// Words of packed operands for an M x N x K bf16 GEMM (amx: the AMX layout),
// with the slack that puts their start on a 64-byte boundary: a tile row
// or zmm load that straddles two cache lines costs two L1 accesses (an
// unaligned packed buffer halved the AMX kernel's rate).
constexpr size_t kPackAlignWords = 64 / sizeof(uint32_t);
size_t Bf16PackedWords(int64_t m, int64_t n, int64_t k, bool amx) {
  const size_t kpa = size_t(PanelPairs(k, amx));
  const int64_t mr = BlockRows(amx);
  return size_t((m + mr - 1) / mr) * kpa * size_t(mr) + size_t((n + kNR - 1) / kNR) * kpa * kNR + kPackAlignWords;
}

// Shapes and panel pointers of an M x N x K bf16 job over `packed` (which
// must have Bf16PackedWords(m, n, k, amx) words: no allocation here).
void Bf16Setup(Bf16Job& g, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
               std::vector<uint32_t>& packed, bool amx) {
  g.m = m;
  g.n = n;
  g.k = k;
  g.kp = (k + 1) / 2;
  g.kpa = PanelPairs(k, amx);
  g.amx = amx;
  g.mr = BlockRows(amx);
  // AMX: a task's panel group is ~1 MiB of packed B (half of a Sapphire
  // Rapids core's L2; 512 KiB and 1.5 MiB measured slower), so the task's A
  // rows are reused over more columns.
  if (amx) g.gp = std::max<int64_t>(1, kAmxGroupBytes / (g.kpa * kNR * 4));
  g.transa = ta;
  g.transb = tb;
  g.a = static_cast<const uint16_t*>(a);
  g.b = static_cast<const uint16_t*>(b);
  // AMX: a long untransposed A read in place (kAmxInPlaceMinK; with K % 32 ==
  // 0 and A on a 64-byte boundary every tile row is one cache line).
  g.row_a = amx && !ta && k % 32 == 0 && k >= kAmxInPlaceMinK && reinterpret_cast<uintptr_t>(a) % 64 == 0;
  g.m_blocks = (m + g.mr - 1) / g.mr;
  g.n_panels = (n + kNR - 1) / kNR;
  g.m_supers = (m + kSuperRows - 1) / kSuperRows;
  g.n_groups = (g.n_panels + g.gp - 1) / g.gp;
  const size_t a_words = size_t(g.m_blocks) * size_t(g.kpa) * size_t(g.mr);
  const uintptr_t base = reinterpret_cast<uintptr_t>(packed.data());
  g.ap = packed.data() + ((64 - base % 64) % 64) / sizeof(uint32_t);  // vector data is 4-byte aligned at least
  g.bp = g.ap + a_words;
}

// The tiles' direct bf16 output (out16 NULL: none; the fp32 c is written).
void SetDirectOutput(Bf16Job& g, uint16_t* out16, const float* bias, bool gelu, uint16_t* pre16) {
  g.out16 = out16;
  g.bias = bias;
  g.gelu = gelu;
  g.pre16 = pre16;
  g.native_bf16 = gelu && UseBf16NativeStore();
}

// Packs op(A) and op(B) into `packed`; true when the bf16 tiles cannot take
// them (Bf16TilesExact: a subnormal input, or products that could be).
bool Bf16Pack(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const void* a, const void* b,
              std::vector<uint32_t>& packed, bool amx) {
  Bf16Job g;
  Bf16Setup(g, ta, tb, m, n, k, a, b, packed, amx);
  f->host->parallel_for(g.m_blocks, 1, PackAAnyBody, &g);
  f->host->parallel_for(g.n_panels, 1, PackBBody, &g);
  return g.Stopped();
}

// c = alpha * op(A) op(B) + beta * c with bf16 A, B (no subnormals); packed
// must have Bf16PackedWords(m, n, k, amx) words of capacity (no allocation
// here). prepacked: Bf16Pack already filled `packed` for these operands.
void Bf16Gemm(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const void* a,
              const void* b, float beta, float* c, std::vector<uint32_t>& packed, bool prepacked, bool amx,
              uint16_t* out16 = nullptr, const float* bias = nullptr, bool gelu = false, uint16_t* pre16 = nullptr) {
  Bf16Job g;
  Bf16Setup(g, ta, tb, m, n, k, a, b, packed, amx);
  g.alpha = alpha;
  g.beta = beta;
  g.c = c;
  SetDirectOutput(g, out16, bias, gelu, pre16);
  if (!prepacked) {
    f->host->parallel_for(g.m_blocks, 1, PackAAnyBody, &g);
    f->host->parallel_for(g.n_panels, 1, PackBBody, &g);
  }
  if (amx) CountPortablePathRun(PortablePath::kGemmAmx);
  f->host->parallel_for(g.n_groups * g.m_supers, 1, amx ? AmxBody : out16 ? Bf16DirectBody : Bf16ComputeBody, &g);
}

// The direct bf16 path in one fork-join (a pool wake-up costs tens of
// microseconds: at 512^3 three of them were ~15 % of the call). Participant
// t (of P) owns the column groups g with g % P == t: it first packs its own
// groups' B panels (so they land in its own L2), then claims A units
// (kSuperRows rows: packed, or only scanned when A is read in place) and any
// B group still unclaimed, then waits until every unit is packed (only for
// units another participant is packing right now, so a caller that runs
// every participant inline never waits) and stops there when a unit saw a
// subnormal (D untouched). Tiles: it runs its own groups, one kSuperRows
// task at a time from each group's counter, then helps with the other
// groups' remaining tasks. A thread that starts late or is preempted (2
// vCPUs shared with other processes) thus costs at most one 64-row task of
// imbalance, not a whole column group. A tile's sums do not depend on which
// thread computes it (K is summed in registers in one fixed order), so D is
// the same for any schedule and thread count.
// A Job for FusedSchedule has n_groups, m_supers and Stopped() (true after
// packing when the tiles must not run), and the overloads
// FusedPackB(job, group), FusedPackA(job, super) and FusedRun(job, group, super).
template <class Job>
struct FusedCtx {
  Job* g;
  int64_t parts;
  FusedGroup* groups;  // [g->n_groups]
  alignas(64) std::atomic<int64_t> next_a{0};
  alignas(64) std::atomic<int64_t> packed_units{0};
};
template <class Job>
void FusedScheduleBody(void* ctx, int64_t begin, int64_t end) {
  auto& x = *static_cast<FusedCtx<Job>*>(ctx);
  Job& g = *x.g;
  const int64_t ng = g.n_groups, units = g.m_supers + ng;
  auto pack_b = [&](int64_t v) {
    if (x.groups[v].b_claimed.exchange(true, std::memory_order_relaxed)) return;
    FusedPackB(g, v);
    x.packed_units.fetch_add(1, std::memory_order_release);
  };
  auto run_group = [&](int64_t v) {
    for (int64_t s; (s = x.groups[v].next_super.fetch_add(1, std::memory_order_relaxed)) < g.m_supers;)
      FusedRun(g, v, s);
  };
  for (int64_t t = begin; t < end; ++t) {  // one participant (several when run inline)
    for (int64_t v = t; v < ng; v += x.parts) pack_b(v);
    for (int64_t u; (u = x.next_a.fetch_add(1, std::memory_order_relaxed)) < g.m_supers;) {
      FusedPackA(g, u);
      x.packed_units.fetch_add(1, std::memory_order_release);
    }
    for (int64_t v = 0; v < ng; ++v) pack_b(v);
    for (int spins = 0; x.packed_units.load(std::memory_order_acquire) < units; ++spins) {
      if (spins < 4096) {
        _mm_pause();
      } else {
        std::this_thread::yield();  // the packer was preempted (a loaded machine)
      }
    }
    if (g.Stopped()) return;
    for (int64_t v = t; v < ng; v += x.parts) run_group(v);
    for (int64_t i = 1; i <= ng; ++i) run_group((t + i) % ng);
  }
}
// groups: g.n_groups counters from the workspace (reset here; no allocation).
template <class Job>
void FusedSchedule(const tefl_call_frame* f, Job& g, FusedGroup* groups) {
  for (int64_t v = 0; v < g.n_groups; ++v) {
    groups[v].next_super.store(0, std::memory_order_relaxed);
    groups[v].b_claimed.store(false, std::memory_order_relaxed);
  }
  FusedCtx<Job> x;
  x.g = &g;
  x.parts = std::max<int64_t>(1, f->host->num_threads());
  x.groups = groups;
  f->host->parallel_for(x.parts, 1, FusedScheduleBody<Job>, &x);
}

void FusedPackB(Bf16Job& g, int64_t v) { PackBBody(&g, v * g.gp, std::min(g.n_panels, (v + 1) * g.gp)); }
void FusedPackA(Bf16Job& g, int64_t u) {
  const int64_t blocks_per_super = kSuperRows / g.mr;
  PackABlocks(g, u * blocks_per_super, std::min(g.m_blocks, (u + 1) * blocks_per_super));
}
void FusedRun(Bf16Job& g, int64_t v, int64_t s) {
  (g.amx ? AmxBody : Bf16DirectBody)(&g, v * g.m_supers + s, v * g.m_supers + s + 1);
}

// out16 = bf16(alpha * op(A) op(B) + bias) in one fork-join, packing
// included; false (out16 not written) when A or B holds a subnormal bf16
// value. packed: Bf16PackedWords(m, n, k, amx) words, groups: GrowGroups(n)
// counters (no allocation here).
bool Bf16FusedDirect(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                     const void* a, const void* b, std::vector<uint32_t>& packed, FusedGroup* groups, bool amx,
                     uint16_t* out16, const float* bias, bool gelu, uint16_t* pre16) {
  Bf16Job g;
  Bf16Setup(g, ta, tb, m, n, k, a, b, packed, amx);
  g.alpha = alpha;
  g.beta = 0.0f;
  g.c = nullptr;
  SetDirectOutput(g, out16, bias, gelu, pre16);
  if (!amx) g.row_a = !ta && k % 2 == 0 && reinterpret_cast<uintptr_t>(a) % 4 == 0;  // amx: Bf16Setup
  FusedSchedule(f, g, groups);
  const bool ran = !g.Stopped();
  if (ran && amx) CountPortablePathRun(PortablePath::kGemmAmx);
  return ran;
}

// ---- fp32 on AVX-512: own packing and 14 x 32 register tiles -----------------------
// On the Sapphire Rapids machine of sessions 26-28, OpenBLAS 0.3.21's
// SkylakeX sgemm was 6-10 % slower than torch's MKL on one core, too slow
// for issue #6's goal; this 14 x 32 register tile (28 zmm sums, B's two
// vectors loaded, A's fourteen values broadcast: 31 of the 32 registers)
// runs at 80-90 % of the FMA peak with its operands in L2; it loads B's
// vectors from L2 for 28 FMAs where a 12 x 32 tile did for 24, and measured
// 2-5 % faster than that tile (docs/perf-gemm.md, session 39). op(A) is packed per
// K chunk into blocks of kF32MR rows (see F32AChunk), op(B) into panels of
// kF32NR columns ([K][kF32NR]); the pads past M and N are zeros (never
// stored). A tile runs a whole K chunk of kF32Kc with both operands read
// from L2 (measured as fast as a B chunk kept in L1, and D is then loaded
// and stored once per chunk instead of once per 256 steps): the first chunk
// applies C = alpha * sum + beta * C (beta = 0: C not read, as BLAS), later
// ones C += alpha * sum. Every element of D is summed in the same order
// whatever the thread count or schedule. Tasks and packing run in one fork-join
// (FusedSchedule, as the bf16 path). Used when PortablePathOn(kGemmF32Avx512)
// and the GEMM is at least kF32MinRows x kF32MinCols with kF32MinWork
// multiply-adds; else OpenBLAS.
constexpr int kF32MR = 14, kF32NR = 32;
// The packing's two 8 x 8 transposes and one 16-lane mask per k, and the
// in-place tile's five row pointers, hold 8 to 15 rows.
static_assert(kF32MR >= 8 && kF32MR <= 15);
constexpr int64_t kF32Kc = 2048;
// Row blocks per task: a task's packed A chunk of ~kF32SuperABytes, within
// [kF32MinSuper, kF32MaxSuper] blocks (measured with 12-row blocks: 6 at
// K = 512, 3 at K = 1024 and 2048; with 14 rows that is 5 at K = 512).
constexpr int64_t kF32SuperABytes = int64_t(150) << 10, kF32MinSuper = 3, kF32MaxSuper = 6;
constexpr int64_t kF32GroupBytes = int64_t(1024) << 10;  // packed B per task's column group
constexpr int64_t kF32MinRows = 2 * kF32MR, kF32MinCols = 128, kF32MinWork = int64_t(1) << 23;
// A D of at least this many bytes that the tiles store once (one K chunk,
// beta = 0) and nothing reads after the GEMM is written by non-temporal
// stores: it would not stay in L2, and plain stores first read every line
// of D from memory and push the group's B panels out of L2 (as the AMX
// path's kAmxStreamBytes; figures in docs/perf-gemm.md, session 29).
constexpr int64_t kF32StreamBytes = int64_t(8) << 20;
// An untransposed A is read in place by the tiles (fourteen rows lda apart,
// each k's values broadcast from them; a partial last block is still packed)
// when K <= kF32InPlaceMaxK (one chunk) and N <= kF32InPlaceMaxN, or
// K <= kF32InPlaceAnyNMaxK, with two or more threads. The tile runs ~4 %
// slower that way, so it pays only where packing A is a large share (its
// cost is per A element, the tiles' per A element times N) and where packing
// costs twice as much per byte as on one thread: each thread's tiles read
// every packed row block, so the packer's stores first take the lines back
// from the other core (docs/perf-gemm.md, session 31). Beyond K = 512 the
// rows' stride maps a block's fourteen lines into one or two L1 sets.
constexpr int64_t kF32InPlaceMaxK = 512, kF32InPlaceMaxN = 1024, kF32InPlaceAnyNMaxK = 64;

// Floats of packed operands for an M x N x K fp32 GEMM, with the slack that
// puts packed A and packed B each on a 64-byte boundary (B's panels are read
// by aligned loads).
size_t F32PackedFloats(int64_t m, int64_t n, int64_t k) {
  const size_t rows = size_t((m + kF32MR - 1) / kF32MR) * kF32MR, cols = size_t((n + kF32NR - 1) / kF32NR) * kF32NR;
  return (rows + cols) * size_t(k) + 32;
}

// Packed operands beyond the workspace that is kept between calls
// (kKeptBufferBytes) would be allocated and faulted in on every call, a
// copy as large as A and B together: such products take OpenBLAS, which
// packs in fixed-size blocks (and is level with the own tiles at that size).
bool UseOwnF32(int64_t m, int64_t n, int64_t k) {
  return m >= kF32MinRows && n >= kF32MinCols && m * n * k >= kF32MinWork &&
         F32PackedFloats(m, n, k) * sizeof(float) <= kKeptBufferBytes &&
         PortablePathOn(PortablePath::kGemmF32Avx512);
}

struct F32Job {
  int64_t m, n, k;
  bool transa, transb;
  const float* a;  // [M, K] ([K, M] with transa)
  const float* b;  // [K, N] ([N, K] with transb)
  float* ap;       // [m_blocks][K][kF32MR]
  float* bp;       // [n_panels][K][kF32NR]
  float alpha, beta;
  float* c;  // [M, N]
  int64_t m_blocks, n_panels, m_supers, n_groups;
  int64_t gp, sb;                         // panels per column group, row blocks per row super
  bool stream = false;                    // D by non-temporal stores (kF32StreamBytes)
  bool a_in_place = false;                // the tiles read full row blocks of A where it is (kF32InPlaceMaxK)
  bool Stopped() const { return false; }  // FusedSchedule's interface; packing fp32 never fails
};

// dst[q * ldd + i] = src[i * lds + q] for an 8 x 8 block (AVX).
__attribute__((target("avx2"))) inline void Transpose8x8F32(const float* src, int64_t lds, float* dst, int64_t ldd) {
  __m256i r[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_castps_si256(_mm256_loadu_ps(src + i * lds));
  Transpose8x8Epi32(r);
  for (int q = 0; q < 8; ++q) _mm256_storeu_ps(dst + q * ldd, _mm256_castsi256_ps(r[q]));
}

// Packed A of row block blk, K chunk k0 (a multiple of kF32Kc): each
// block's chunk is [kc][kF32MR] (the tile's fourteen broadcasts of one k are
// one 56-byte run); chunks are stored one after another, each holding every
// block in order, so a task's row blocks of one chunk are one contiguous run.
float* F32AChunk(const F32Job& g, int64_t k0, int64_t blk) {
  const int64_t kc = std::min(kF32Kc, g.k - k0);
  return g.ap + size_t(k0) * size_t(g.m_blocks) * kF32MR + size_t(blk) * size_t(kc) * kF32MR;
}

// Packs op(A) row blocks [b0, b1).
__attribute__((target("avx2,avx512f"))) void F32PackA(const F32Job& g, int64_t b0, int64_t b1) {
  const int64_t k = g.k;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t i0 = blk * kF32MR;
    const int rows = int(std::min<int64_t>(kF32MR, g.m - i0));
    for (int64_t k0 = 0; k0 < k; k0 += kF32Kc) {
      const int64_t k1 = std::min(k, k0 + kF32Kc);
      float* dst = F32AChunk(g, k0, blk) - k0 * kF32MR;  // indexed by the absolute kk
      if (g.transa) {                                    // A is [K, M]: the block's values of one k are contiguous
        const __mmask16 mask = __mmask16((1u << rows) - 1);
        for (int64_t kk = k0; kk < k1; ++kk)
          _mm512_mask_storeu_ps(dst + kk * kF32MR, __mmask16((1u << kF32MR) - 1),
                                _mm512_maskz_loadu_ps(mask, g.a + kk * g.m + i0));
        continue;
      }
      const float* src = g.a + i0 * k;
      int64_t kk = k0;
      if (rows == kF32MR) {
        for (; kk + 8 <= k1; kk += 8) {
          // Rows 0-7, then rows 6-13 (rows 6 and 7 are stored twice, the same values).
          Transpose8x8F32(src + kk, k, dst + kk * kF32MR, kF32MR);
          Transpose8x8F32(src + (kF32MR - 8) * k + kk, k, dst + kk * kF32MR + kF32MR - 8, kF32MR);
        }
      }
      for (; kk < k1; ++kk)
        for (int i = 0; i < kF32MR; ++i) dst[kk * kF32MR + i] = i < rows ? src[i * k + kk] : 0.0f;
    }
  }
}

// Packs op(B) column panels [p0, p1).
__attribute__((target("avx2,avx512f"))) void F32PackB(const F32Job& g, int64_t p0, int64_t p1) {
  const int64_t k = g.k;
  for (int64_t pan = p0; pan < p1; ++pan) {
    float* dst = g.bp + size_t(pan) * size_t(k) * kF32NR;
    const int64_t j0 = pan * kF32NR;
    const int cols = int(std::min<int64_t>(kF32NR, g.n - j0));
    if (!g.transb) {  // B is [K, N]: a panel row is 32 contiguous values
      const auto [m0, m1] = MasksOf32(cols);
      for (int64_t kk = 0; kk < k; ++kk) {
        const float* s = g.b + kk * g.n + j0;
        _mm512_store_ps(dst + kk * kF32NR, _mm512_maskz_loadu_ps(m0, s));
        _mm512_store_ps(dst + kk * kF32NR + 16, _mm512_maskz_loadu_ps(m1, s + 16));
      }
      continue;
    }
    const float* src = g.b + j0 * k;  // B is [N, K]: the panel's columns are rows of K
    int64_t kk = 0;
    if (cols == kF32NR) {
      for (; kk + 8 <= k; kk += 8)
        for (int jb = 0; jb < kF32NR; jb += 8) Transpose8x8F32(src + jb * k + kk, k, dst + kk * kF32NR + jb, kF32NR);
    }
    for (; kk < k; ++kk)
      for (int j = 0; j < kF32NR; ++j) dst[kk * kF32NR + j] = j < cols ? src[j * k + kk] : 0.0f;
  }
}

// A run of cache lines to prefetch into L2 while a tile runs: `lines`
// lines from `p`, one per k step (a tile's operands are L2 reads; what
// comes from L3 while it runs is the next tiles' data, fetched here so
// that they do not wait on L3 latency: streamed from L3 the tile ran at
// ~75 % of its rate with L2 operands).
struct F32Prefetch {
  const char* p = nullptr;
  int64_t lines = 0;
};

// One 14 x 32 tile over kc steps of A and packed B (bp, [kc][32], 64-byte
// aligned), stored into the first `rows` x `cols` of c. A: packed (ap,
// [kc][14]), or kAInPlace: fourteen rows of A itself, ap[i * lda + kk] (the
// same products summed in the same order: the same D either way).
// first: c = alpha * sum + beta * c (c not read when beta = 0); else
// c += alpha * sum. pa, pb: prefetched on the way (pa.lines, pb.lines <= kc).
// stream (first, beta = 0): full 64-byte-aligned rows by non-temporal stores.
template <bool kAInPlace>
__attribute__((target("avx512f"))) void F32Tile(const float* ap, int64_t lda, const float* bp, int64_t kc, float* c,
                                                int64_t ldc, int rows, int cols, float alpha, float beta, bool first,
                                                F32Prefetch pa, F32Prefetch pb, bool stream) {
  __m512 acc[kF32MR][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  // In place: five row pointers, three rows each (row + 0, lda, 2 lda: the
  // index register scaled by 4 and 8; the last pointer's two), so the
  // fourteen addresses need six registers.
  const float* q0 = ap;
  const float* q1 = ap + 3 * lda;
  const float* q2 = ap + 6 * lda;
  const float* q3 = ap + 9 * lda;
  const float* q4 = ap + 12 * lda;
  for (int64_t kk = 0; kk < kc; ++kk) {
    if (kk < pa.lines) _mm_prefetch(pa.p + kk * 64, _MM_HINT_T1);
    if (kk < pb.lines) _mm_prefetch(pb.p + kk * 64, _MM_HINT_T1);
    const __m512 b0 = _mm512_load_ps(bp), b1 = _mm512_load_ps(bp + 16);
#pragma GCC unroll kF32MR
    for (int i = 0; i < kF32MR; ++i) {
      const float* q = i < 3 ? q0 : i < 6 ? q1 : i < 9 ? q2 : i < 12 ? q3 : q4;
      const __m512 ai = _mm512_set1_ps(kAInPlace ? q[(i % 3) * lda] : ap[i]);
      acc[i][0] = _mm512_fmadd_ps(ai, b0, acc[i][0]);
      acc[i][1] = _mm512_fmadd_ps(ai, b1, acc[i][1]);
    }
    if (kAInPlace) {
      ++q0, ++q1, ++q2, ++q3, ++q4;
    } else {
      ap += kF32MR;
    }
    bp += kF32NR;
  }
  const auto [m0, m1] = MasksOf32(cols);
  const __m512 va = _mm512_set1_ps(alpha), vb = _mm512_set1_ps(beta);
  const bool read_c = !first || beta != 0.0f;
#pragma GCC unroll kF32MR
  for (int i = 0; i < kF32MR; ++i) {
    if (i >= rows) break;
    float* p = c + i * ldc;
    __m512 r0 = _mm512_mul_ps(va, acc[i][0]), r1 = _mm512_mul_ps(va, acc[i][1]);
    if (read_c) {
      const __m512 c0 = _mm512_maskz_loadu_ps(m0, p), c1 = _mm512_maskz_loadu_ps(m1, p + 16);
      r0 = first ? _mm512_fmadd_ps(vb, c0, r0) : _mm512_add_ps(c0, r0);
      r1 = first ? _mm512_fmadd_ps(vb, c1, r1) : _mm512_add_ps(c1, r1);
    }
    if (stream && cols == kF32NR && reinterpret_cast<uintptr_t>(p) % 64 == 0) {
      _mm512_stream_ps(p, r0);
      _mm512_stream_ps(p + 16, r1);
    } else {
      _mm512_mask_storeu_ps(p, m0, r0);
      _mm512_mask_storeu_ps(p + 16, m1, r1);
    }
  }
}

// Task (column group v, row super s) of F32Job g: K chunk by chunk; in a
// chunk, panel by panel (the group's packed B stays in L2 over the group's
// tasks), the super's row blocks (their A chunk in L2, reused by every
// panel). While a chunk runs, the next A run (the super's next chunk, or
// after the last chunk the next super's first) and each panel's successor B
// chunk are prefetched into L2, spread over the tiles.
void F32Task(const F32Job& g, int64_t v, int64_t s) {
  const int64_t p0 = v * g.gp, p1 = std::min(g.n_panels, p0 + g.gp);
  const int64_t b0 = s * g.sb, b1 = std::min(g.m_blocks, b0 + g.sb);
  const int64_t tiles = (p1 - p0) * (b1 - b0);
  for (int64_t k0 = 0; k0 < g.k; k0 += kF32Kc) {
    const int64_t kc = std::min(kF32Kc, g.k - k0);
    // The A run to prefetch during this chunk.
    const char* a_next = nullptr;
    int64_t a_lines = 0;
    if (k0 + kF32Kc < g.k) {
      const int64_t nk = std::min(kF32Kc, g.k - k0 - kF32Kc);
      a_next = reinterpret_cast<const char*>(F32AChunk(g, k0 + kF32Kc, b0));
      a_lines = (b1 - b0) * nk * kF32MR * 4 / 64;
    } else if (b1 < g.m_blocks) {
      const int64_t nb1 = std::min(g.m_blocks, b1 + g.sb);
      if (g.a_in_place) {  // one chunk: the next super's rows of A are one run
        a_next = reinterpret_cast<const char*>(g.a + b1 * kF32MR * g.k);
        a_lines = (std::min(g.m, nb1 * kF32MR) - b1 * kF32MR) * g.k * 4 / 64;
      } else {
        a_next = reinterpret_cast<const char*>(F32AChunk(g, 0, b1));
        a_lines = (nb1 - b1) * std::min(kF32Kc, g.k) * kF32MR * 4 / 64;
      }
    }
    const int64_t a_per_tile = std::min(kc, (a_lines + tiles - 1) / tiles);
    int64_t t = 0;
    for (int64_t pan = p0; pan < p1; ++pan) {
      const float* bp = g.bp + size_t(pan) * size_t(g.k) * kF32NR + size_t(k0) * kF32NR;
      const int cols = int(std::min<int64_t>(kF32NR, g.n - pan * kF32NR));
      // This panel's successor: the next panel's chunk, or the first panel's next chunk.
      const float* b_next = pan + 1 < p1 ? bp + size_t(g.k) * kF32NR
                            : k0 + kF32Kc < g.k
                                ? g.bp + size_t(p0) * size_t(g.k) * kF32NR + size_t(k0 + kF32Kc) * kF32NR
                                : nullptr;
      const int64_t b_lines = !b_next ? 0 : (pan + 1 < p1 ? kc : std::min(kF32Kc, g.k - k0 - kF32Kc)) * kF32NR * 4 / 64;
      const int64_t b_per_tile = std::min(kc, (b_lines + (b1 - b0) - 1) / (b1 - b0));
      for (int64_t blk = b0; blk < b1; ++blk, ++t) {
        const int rows = int(std::min<int64_t>(kF32MR, g.m - blk * kF32MR));
        F32Prefetch pa, pb;
        if (t * a_per_tile < a_lines)
          pa = {a_next + t * a_per_tile * 64, std::min(a_per_tile, a_lines - t * a_per_tile)};
        const int64_t bt = (blk - b0) * b_per_tile;
        if (bt < b_lines) pb = {reinterpret_cast<const char*>(b_next) + bt * 64, std::min(b_per_tile, b_lines - bt)};
        float* c = g.c + blk * kF32MR * g.n + pan * kF32NR;
        if (g.a_in_place && rows == kF32MR)
          F32Tile<true>(g.a + blk * kF32MR * g.k + k0, g.k, bp, kc, c, g.n, rows, cols, g.alpha, g.beta, k0 == 0, pa,
                        pb, g.stream);
        else
          F32Tile<false>(F32AChunk(g, k0, blk), 0, bp, kc, c, g.n, rows, cols, g.alpha, g.beta, k0 == 0, pa, pb,
                         g.stream);
      }
    }
  }
  if (g.stream) _mm_sfence();  // the streamed rows are visible before the task counts as done
}

void FusedPackB(F32Job& g, int64_t v) { F32PackB(g, v * g.gp, std::min(g.n_panels, (v + 1) * g.gp)); }
void FusedPackA(F32Job& g, int64_t u) {
  const int64_t b0 = u * g.sb, b1 = std::min(g.m_blocks, (u + 1) * g.sb);
  if (!g.a_in_place) {
    F32PackA(g, b0, b1);
  } else if (b1 == g.m_blocks && g.m % kF32MR != 0) {
    F32PackA(g, b1 - 1, b1);  // a partial last block is packed
  }
}
void FusedRun(F32Job& g, int64_t v, int64_t s) { F32Task(g, v, s); }

// c = alpha * op(A) op(B) + beta * c by the own kernel; packed holds
// F32PackedFloats(m, n, k) floats, groups GrowGroups(n) counters (no
// allocation here). c_final: nothing reads c after the call (it may be
// streamed, kF32StreamBytes).
void OwnSgemm(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
              const float* b, float beta, float* c, bool c_final, float* packed, FusedGroup* groups) {
  F32Job g;
  g.m = m;
  g.n = n;
  g.k = k;
  g.transa = ta;
  g.transb = tb;
  g.a = a;
  g.b = b;
  g.alpha = alpha;
  g.beta = beta;
  g.c = c;
  g.stream = c_final && beta == 0.0f && k <= kF32Kc && m * n * int64_t(sizeof(float)) >= kF32StreamBytes;
  g.m_blocks = (m + kF32MR - 1) / kF32MR;
  g.n_panels = (n + kF32NR - 1) / kF32NR;
  const int64_t parts = std::max<int64_t>(1, f->host->num_threads());
  g.a_in_place = !ta && parts >= 2 && k <= kF32InPlaceMaxK && (n <= kF32InPlaceMaxN || k <= kF32InPlaceAnyNMaxK) &&
                 PortablePathOn(PortablePath::kGemmF32AInPlace);
  g.sb = std::clamp<int64_t>(kF32SuperABytes / (kF32MR * 4 * std::min(k, kF32Kc)), kF32MinSuper, kF32MaxSuper);
  g.m_supers = (g.m_blocks + g.sb - 1) / g.sb;
  g.gp = std::max<int64_t>(1, kF32GroupBytes / (k * kF32NR * 4));
  // At least two column groups per thread: each thread packs its own groups' B first.
  while (g.gp > 1 && (g.n_panels + g.gp - 1) / g.gp < 2 * parts) g.gp = (g.gp + 1) / 2;
  g.n_groups = (g.n_panels + g.gp - 1) / g.gp;
  const uintptr_t base = reinterpret_cast<uintptr_t>(packed);
  g.ap = packed + ((64 - base % 64) % 64) / sizeof(float);
  g.bp = g.ap + (size_t(g.m_blocks) * size_t(k) * kF32MR + 15) / 16 * 16;
  CountPortablePathRun(PortablePath::kGemmF32Avx512);
  if (g.a_in_place) CountPortablePathRun(PortablePath::kGemmF32AInPlace);
  FusedSchedule(f, g, groups);
}

// Grows ws for OwnSgemm when an M x N x K fp32 GEMM takes it.
void ReserveOwnF32(Workspace& ws, int64_t m, int64_t n, int64_t k) {
  if (k == 0 || !UseOwnF32(m, n, k)) return;
  Grow(ws.packed32, F32PackedFloats(m, n, k));
  GrowGroups(ws, n);
}

// c = alpha * op(A) op(B) + beta * c (BLAS semantics; k > 0, alpha != 0).
// The own kernel runs only with the buffers ReserveOwnF32 grew (the choice
// is made twice; a test that flips the switch in between gets OpenBLAS).
// c_final: c is the call's output and no epilogue reads it.
void Sgemm(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           const float* b, float beta, float* c, bool c_final, Workspace& ws) {
  if (UseOwnF32(m, n, k) && ws.packed32.size() >= F32PackedFloats(m, n, k) && ws.groups_cap >= size_t((n + 31) / 32)) {
    OwnSgemm(f, ta, tb, m, n, k, alpha, a, b, beta, c, c_final, ws.packed32.data(), ws.groups.get());
  } else {
    BlasSgemm(f, ta, tb, m, n, k, alpha, a, b, beta, c);
  }
}

// ---- one GEMM: fp32 operands, any epilogue ---------------------------------------
struct Gemm {
  int64_t m, n, k;
  bool transa, transb;
  const float* a;  // compact fp32 (NULL on the bf16 path)
  const float* b;
  const void* a16;  // bf16 A and B for the vdpbf16ps path, else NULL
  const void* b16;
  std::vector<uint32_t>* packed;  // the bf16 path's packed operands (capacity reserved)
  Workspace* ws;                  // the own fp32 kernel's packed operands and counters (capacity reserved)
  bool prepacked;                 // Bf16Pack already filled *packed
  bool amx;                       // the bf16 path runs on AMX tiles (packed in that layout)
  float alpha, beta;              // alpha with the FP8 scale_inv factors folded in
  const void* c;                  // Cterm source: C, or D's prior content (accumulate), or NULL
  DType tc;
  const float* bias;  // [N] fp32 or NULL
  bool gelu;
  bool dgelu;        // gelu with grad: D = pre * gelu'(pre_gelu_out), pre_gelu_out read
  double* col_sums;  // dgelu: [N] column sums of D (before FP8 scaling) or NULL
  void* pre;         // pre_gelu_out or NULL
  DType tpre;
  void* d;
  DType td;
  float d_scale;
  std::atomic<uint32_t>* amax;  // bits of the running max |D| (non-negative floats order as integers)
};

struct EpilogueCtx {
  const Gemm* g;
  float* acc;  // [M, N] fp32: D itself when D is fp32
};

void AtomicMax(std::atomic<uint32_t>* a, float v) {
  const uint32_t bits = FloatBits(v);
  uint32_t cur = a->load(std::memory_order_relaxed);
  while (bits > cur && !a->compare_exchange_weak(cur, bits, std::memory_order_relaxed)) {
  }
}

void EpilogueBody(void* ctx, int64_t begin, int64_t end) {
  const auto& e = *static_cast<const EpilogueCtx*>(ctx);
  const Gemm& g = *e.g;
  const size_t n = size_t(g.n);
  const bool fp8 = IsFp8(g.td);
  float amax = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    float* row = e.acc + size_t(r) * n;
    float row_amax = 0.0f;
    HWY_DYNAMIC_DISPATCH(EpilogueRow)
    (row, n, g.bias, g.gelu, g.dgelu, g.pre ? static_cast<char*>(g.pre) + size_t(r) * n * ElemSize(g.tpre) : nullptr,
     g.tpre, g.amax ? &row_amax : nullptr, static_cast<char*>(g.d) + size_t(r) * n * ElemSize(g.td), g.td);
    if (!std::isnan(amax) && (std::isnan(row_amax) || row_amax > amax)) amax = row_amax;
    if (fp8) FromF32(row, g.td, static_cast<char*>(g.d) + size_t(r) * n, int64_t(n), g.d_scale);
  }
  if (g.amax) AtomicMax(g.amax, amax);
}

// DGELU's bias_grad: column sums of the fp32 rows, chunks of columns over
// the host pool (each column summed over all rows in row order by one
// thread: the same doubles for any split; was one thread's scalar loop,
// docs/perf-gemm.md, session 32).
constexpr int64_t kColumnSumsChunk = 512;
struct ColumnSumsCtx {
  const float* rows;
  int64_t m, n;
  double* sums;
};
void ColumnSumsBody(void* ctx, int64_t begin, int64_t end) {
  const auto& c = *static_cast<const ColumnSumsCtx*>(ctx);
  const int64_t j0 = begin * kColumnSumsChunk, j1 = std::min(c.n, end * kColumnSumsChunk);
  HWY_DYNAMIC_DISPATCH(AddColumnSums)(c.rows, size_t(c.m), size_t(c.n), size_t(j0), size_t(j1), c.sums);
}

// Runs g; `scratch` holds the fp32 result when D is not fp32.
// Whether g takes the bf16 path straight into a bf16 D: no Cterm, no amax,
// not DGELU, GELU only with a bf16 or absent pre_gelu_out (bias, and GELU by
// GeluTileBf16, are applied in the tile's store).
// A GELU epilogue the tiles can apply (GeluTile): not DGELU, pre_gelu_out
// bf16 or absent.
bool TileGelu(bool dgelu, const void* pre, DType tpre) { return !dgelu && (pre == nullptr || tpre == DType::kBF16); }
bool DirectBf16(const Gemm& g) {
  return g.a16 != nullptr && g.td == DType::kBF16 && !(g.c != nullptr && g.beta != 0.0f) &&
         (!g.gelu || TileGelu(g.dgelu, g.pre, g.tpre)) && !g.dgelu && g.amax == nullptr && g.k > 0 && g.alpha != 0.0f;
}

void Run(const tefl_call_frame* f, const Gemm& g, std::vector<float>& scratch) {
  if (g.m == 0 || g.n == 0) return;
  if (DirectBf16(g)) {
    Bf16Gemm(f, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a16, g.b16, 0.0f, nullptr, *g.packed, g.prepacked, g.amx,
             static_cast<uint16_t*>(g.d), g.bias, g.gelu, static_cast<uint16_t*>(g.pre));
    return;
  }
  const int64_t mn = g.m * g.n;
  const bool epilogue = g.bias || g.gelu || g.dgelu || g.amax || g.td != DType::kF32;
  float* acc = g.td == DType::kF32 ? static_cast<float*>(g.d) : nullptr;
  if (acc == nullptr) {
    Grow(scratch, size_t(mn));
    acc = scratch.data();
  }
  // Cterm into acc (beta = 0: not read, as BLAS).
  const bool has_c = g.c != nullptr && g.beta != 0.0f;
  if (has_c && g.c != acc) {
    ConvertCtx c{g.c, g.tc, acc, mn};
    f->host->parallel_for((mn + kConvertChunk - 1) / kConvertChunk, 1, ConvertBody, &c);
  }
  const float beta = has_c ? g.beta : 0.0f;
  if (g.k == 0 || g.alpha == 0.0f) {  // no product: acc = beta * Cterm
    for (int64_t i = 0; i < mn; ++i) acc[i] = beta == 0.0f ? 0.0f : beta * acc[i];
  } else if (g.a16 != nullptr) {
    Bf16Gemm(f, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a16, g.b16, beta, acc, *g.packed, g.prepacked, g.amx);
  } else {
    Sgemm(f, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.b, beta, acc, !epilogue && !g.col_sums, *g.ws);
  }
  if (epilogue) {
    EpilogueCtx e{&g, acc};
    const int64_t grain = std::max<int64_t>(1, (int64_t(16) << 10) / g.n);
    f->host->parallel_for(g.m, grain, EpilogueBody, &e);
  }
  if (g.col_sums) {  // the rows keep D before rounding / FP8 scaling
    ColumnSumsCtx cs{acc, g.m, g.n, g.col_sums};
    f->host->parallel_for((g.n + kColumnSumsChunk - 1) / kColumnSumsChunk, 1, ColumnSumsBody, &cs);
  }
}

// The vdpbf16ps path: bf16 A and B, a CPU with avx512_bf16, enough work, and
// no subnormal input (the scan costs one read of A and B). `groups`: B holds
// that many [K, N] matrices, A has rows = m_total (grouped GEMM).
bool UseBf16Path(const tefl_call_frame* f, DType ta, DType tb, int64_t m, int64_t n, int64_t k, const void* a,
                 const void* b, int64_t groups = 1, int64_t a_rows = -1, bool scan = true) {
  if (ta != DType::kBF16 || tb != DType::kBF16 || !CpuHasBf16Dot()) return false;
  if (m * n * k < kBf16MinWork) return false;
  if (!scan) return true;
  const int64_t rows = a_rows >= 0 ? a_rows : m;
  ScanCtx sc;
  sc.a = static_cast<const uint16_t*>(a);
  sc.na = rows * k;
  sc.b = static_cast<const uint16_t*>(b);
  sc.nb = groups * k * n;
  f->host->parallel_for((sc.na + kScanChunk - 1) / kScanChunk + (sc.nb + kScanChunk - 1) / kScanChunk, 1, ScanBody,
                        &sc);
  return sc.Exact();
}

// ---- one generic GEMM of raw operands: generic_gemm, or one group ------------------
struct OneGemm {
  int64_t m, n, k;
  bool transa, transb;
  const void* a;  // compact [M, K] ([K, M] with transa)
  DType ta;
  const void* b;  // compact [K, N] ([N, K] with transb)
  DType tb;
  float sa, sb;  // scale_inv of FP8 operands, else 1
  float alpha, beta;
  const void* c;  // Cterm: C, D's prior content (accumulate), or NULL
  DType tc;
  const void* bias;  // [N] or NULL
  DType tbias;
  bool gelu, grad;
  void* pre;  // [M, N] or NULL: written with gelu, read with gelu and grad
  DType tpre;
  void* bias_grad;  // [M] ([N] with gelu and grad) or NULL
  DType tbg;
  void* d;  // [M, N]
  DType td;
  float d_scale;  // FP8 D, else 1
  float* d_amax;  // one fp32 or NULL
};

// Decided before anything is written. scan: the subnormal scan reads A and B
// now (the grouped GEMM: every group is decided before the first writes);
// otherwise (generic_gemm) the packing checks them (scan_in_pack) and a hit
// falls back to the exact path in Execute, still before D is written.
struct OnePlan {
  bool bf16;
  bool scan_in_pack;
  bool amx;  // the bf16 path on AMX tiles
};
OnePlan PlanOne(const tefl_call_frame* f, const OneGemm& o, bool scan) {
  const bool bf16 = o.m > 0 && o.n > 0 && UseBf16Path(f, o.ta, o.tb, o.m, o.n, o.k, o.a, o.b, 1, -1, scan);
  return OnePlan{bf16, bf16 && !scan, bf16 && PortablePathOn(PortablePath::kGemmAmx)};
}
bool OneDirect(const OneGemm& o, const OnePlan& p) {
  return p.bf16 && o.td == DType::kBF16 && !(o.c != nullptr && o.beta != 0.0f) &&
         (!o.gelu || TileGelu(o.grad, o.pre, o.tpre)) && o.d_amax == nullptr && o.k > 0 && o.alpha != 0.0f;
}
// Every buffer Execute needs (allocation may throw; nothing is written yet).
void Reserve(Workspace& ws, const OneGemm& o, const OnePlan& p) {
  if (p.bf16) Grow(ws.packed, Bf16PackedWords(o.m, o.n, o.k, p.amx));
  if (p.bf16) GrowGroups(ws, o.n);
  if (!p.bf16 && o.ta != DType::kF32) Grow(ws.a, size_t(o.m * o.k));
  if (!p.bf16 && o.tb != DType::kF32) Grow(ws.b, size_t(o.k * o.n));
  if (!p.bf16) ReserveOwnF32(ws, o.m, o.n, o.k);
  if (o.bias && o.tbias != DType::kF32) Grow(ws.bias, size_t(o.n));
  if (o.td != DType::kF32 && !OneDirect(o, p)) Grow(ws.scratch, size_t(o.m * o.n));
  if (o.bias_grad) Grow(ws.sums, size_t(o.gelu ? o.n : o.m));
}
// Runs o with the buffers Reserve grew (no allocation, except the fallback
// of a scan_in_pack plan, which happens before D is written).
void Execute(const tefl_call_frame* f, const OneGemm& o, OnePlan p, Workspace& ws) {
  const bool dgelu = o.gelu && o.grad;
  bool prepacked = false, done = false;
  if (p.bf16 && p.scan_in_pack && OneDirect(o, p)) {
    // Packing and the tiles in one fork-join; a subnormal leaves D untouched.
    const float* bias32 = o.bias ? AsF32(f, o.bias, o.tbias, o.n, ws.bias) : nullptr;
    done = Bf16FusedDirect(f, o.transa, o.transb, o.m, o.n, o.k, o.alpha * o.sa * o.sb, o.a, o.b, ws.packed,
                           ws.groups.get(), p.amx, static_cast<uint16_t*>(o.d), bias32, o.gelu,
                           static_cast<uint16_t*>(o.pre));
    if (!done) {
      p.bf16 = false;  // a subnormal: the exact sgemm path
      Reserve(ws, o, p);
    }
  } else if (p.bf16 && p.scan_in_pack) {
    if (Bf16Pack(f, o.transa, o.transb, o.m, o.n, o.k, o.a, o.b, ws.packed, p.amx)) {
      p.bf16 = false;  // a subnormal: the exact sgemm path
      Reserve(ws, o, p);
    } else {
      prepacked = true;
    }
  }
  const float* a32 = p.bf16 ? nullptr : AsF32(f, o.a, o.ta, o.m * o.k, ws.a);
  const float* b32 = p.bf16 ? nullptr : AsF32(f, o.b, o.tb, o.k * o.n, ws.b);
  // FP8 scale_inv: alpha * sa * sb is folded into alpha (one multiply per
  // element of D) when it is an fp32 normal or 0. Where it over- or
  // underflows fp32 and q * scale_inv per operand does not (scales far from
  // 1), each decoded operand is scaled instead, as the maths states (q *
  // scale_inv in fp32); FP8 operands are decoded into ws, so that is free to
  // write.
  const double fold = double(o.alpha) * o.sa * o.sb;
  const bool fold_ok = fold == 0.0 || (std::fabs(fold) >= double(FLT_MIN) && std::fabs(fold) <= double(FLT_MAX));
  const bool scale_operands = !p.bf16 && o.alpha != 0.0f && !fold_ok;
  if (scale_operands) {
    if (o.sa != 1.0f && IsFp8(o.ta)) ScaleInPlace(ws.a.data(), o.m * o.k, o.sa);
    if (o.sb != 1.0f && IsFp8(o.tb)) ScaleInPlace(ws.b.data(), o.k * o.n, o.sb);
  }
  const float* bias32 = o.bias ? AsF32(f, o.bias, o.tbias, o.n, ws.bias) : nullptr;
  double* sums = o.bias_grad ? ws.sums.data() : nullptr;
  if (sums) std::fill_n(sums, size_t(dgelu ? o.n : o.m), 0.0);
  std::atomic<uint32_t> amax{0};
  Gemm g{};
  g.m = o.m;
  g.n = o.n;
  g.k = o.k;
  g.transa = o.transa;
  g.transb = o.transb;
  g.a = a32;
  g.b = b32;
  g.a16 = p.bf16 ? o.a : nullptr;
  g.b16 = p.bf16 ? o.b : nullptr;
  g.packed = &ws.packed;
  g.ws = &ws;
  g.prepacked = prepacked;
  g.amx = p.amx;
  // alpha = 0 means "no product" to BLAS; keep it so when the scales are 0 too.
  g.alpha = o.alpha == 0.0f ? 0.0f : scale_operands ? o.alpha : float(fold);
  g.beta = o.beta;
  g.c = o.c;
  g.tc = o.tc;
  g.bias = bias32;
  g.gelu = o.gelu && !dgelu;
  g.dgelu = dgelu;
  g.col_sums = dgelu ? sums : nullptr;
  g.pre = o.pre;
  g.tpre = o.tpre;
  g.d = o.d;
  g.td = o.td;
  g.d_scale = o.d_scale;
  g.amax = o.d_amax ? &amax : nullptr;
  if (!done) Run(f, g, ws.scratch);
  if (sums && !dgelu) {  // bias_grad[m] = sum_k op(A)[m, k], dequantized as TE (q * scale_inv in fp32)
    if (o.transa) {      // A is [K, M]: column sums
      for (int64_t kk = 0; kk < o.k; ++kk)
        for (int64_t i = 0; i < o.m; ++i) sums[i] += double(LoadAsFloat(o.a, kk * o.m + i, o.ta) * o.sa);
    } else {
      for (int64_t i = 0; i < o.m; ++i) {
        double acc = 0.0;
        for (int64_t kk = 0; kk < o.k; ++kk) acc += double(LoadAsFloat(o.a, i * o.k + kk, o.ta) * o.sa);
        sums[i] = acc;
      }
    }
  }
  if (sums) {
    const int64_t len = dgelu ? o.n : o.m;
    for (int64_t i = 0; i < len; ++i) StoreFromDouble(o.bias_grad, i, o.tbg, sums[i]);
  }
  if (o.d_amax) *o.d_amax = BitsFloat(amax.load());
}

template <class Fn>
tefl_status* Guarded(const tefl_call_frame* f, Fn&& fn) {
  try {
    return fn();
  } catch (const std::bad_alloc&) {
    return Status(f, TEFL_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

bool AllGemmTypes(std::initializer_list<const DLTensor*> operands, std::initializer_list<const DLTensor*> floats) {
  for (const DLTensor* t : operands)
    if (!IsGemmType(DTypeOf(t->dtype))) return false;
  for (const DLTensor* t : floats)
    if (t && !IsFloatType(DTypeOf(t->dtype))) return false;
  return true;
}
DType TypeOr(const DLTensor* t, DType fallback) { return t ? DTypeOf(t->dtype) : fallback; }
void* PtrOr(const DLTensor* t) { return t ? DataPtr(t) : nullptr; }
float ScalarOf(const DLTensor* t, int64_t i = 0) {
  return t ? static_cast<const float*>(DataPtr(t))[t->shape[0] == 1 ? 0 : i] : 1.0f;
}

// ---- generic_gemm ------------------------------------------------------------------
// in: A B C bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
tefl_status* GenericGemm(const tefl_call_frame* f, void*) {
  return Guarded(f, [&]() -> tefl_status* {
    const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
    const DLTensor* a = f->inputs[0];
    const DLTensor* b = f->inputs[1];
    const DLTensor* c = f->inputs[2];
    const DLTensor* bias = f->inputs[3];
    DLTensor* d = f->outputs[0];
    DLTensor* pre = f->outputs[1];
    DLTensor* bias_grad = f->outputs[2];
    DLTensor* d_amax = f->outputs[3];
    if (!AllGemmTypes({a, b, d}, {c, bias, pre, bias_grad}))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16/FP8");
    OneGemm o{};
    o.transa = at->transa != 0;
    o.transb = at->transb != 0;
    o.m = o.transa ? a->shape[1] : a->shape[0];
    o.k = o.transa ? a->shape[0] : a->shape[1];
    o.n = o.transb ? b->shape[0] : b->shape[1];
    o.a = DataPtr(a);
    o.ta = DTypeOf(a->dtype);
    o.b = DataPtr(b);
    o.tb = DTypeOf(b->dtype);
    o.sa = IsFp8(o.ta) ? ScalarOf(f->inputs[4]) : 1.0f;
    o.sb = IsFp8(o.tb) ? ScalarOf(f->inputs[5]) : 1.0f;
    o.alpha = at->alpha;
    o.beta = at->beta;
    o.d = DataPtr(d);
    o.td = DTypeOf(d->dtype);
    o.c = c ? DataPtr(c) : at->accumulate ? o.d : nullptr;
    o.tc = c ? DTypeOf(c->dtype) : o.td;
    o.bias = PtrOr(bias);
    o.tbias = TypeOr(bias, DType::kF32);
    o.gelu = at->gelu != 0;
    o.grad = at->grad != 0;
    o.pre = PtrOr(pre);
    o.tpre = TypeOr(pre, DType::kF32);
    o.bias_grad = PtrOr(bias_grad);
    o.tbg = TypeOr(bias_grad, DType::kF32);
    o.d_scale = IsFp8(o.td) ? ScalarOf(f->inputs[6]) : 1.0f;
    o.d_amax = d_amax ? static_cast<float*>(DataPtr(d_amax)) : nullptr;

    // Everything that can fail (allocation) happens before D is written.
    ThreadKept<Workspace> kept;  // this thread's workspace (kernel_support.h)
    Workspace& ws = *kept;
    const OnePlan plan = PlanOne(f, o, /*scan=*/false);
    Reserve(ws, o, plan);
    Execute(f, o, plan, ws);
    return nullptr;
  });
}

// ---- te_general_grouped_gemm ---------------------------------------------------
// in: A B m_splits bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax.
// Each group is one generic GEMM on views into the packed tensors (no copies):
// no transa: A [S, K] and D [S, N] split by rows, B [G, K, N] / [G, N, K];
// transa: A [S, M] and B [S, N] split by rows (each group's K), D [G, M, N].
tefl_status* GroupedGemm(const tefl_call_frame* f, void*) {
  return Guarded(f, [&]() -> tefl_status* {
    const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
    const DLTensor* a = f->inputs[0];
    const DLTensor* b = f->inputs[1];
    const DLTensor* s = f->inputs[2];
    const DLTensor* bias = f->inputs[3];
    DLTensor* d = f->outputs[0];
    DLTensor* pre = f->outputs[1];
    DLTensor* bias_grad = f->outputs[2];
    DLTensor* d_amax = f->outputs[3];
    if (!AllGemmTypes({a, b, d}, {bias, pre, bias_grad}))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16/FP8");
    const auto* splits = static_cast<const int64_t*>(DataPtr(s));
    const int64_t groups = s->shape[0];
    const bool transa = at->transa != 0, transb = at->transb != 0;
    const bool dgelu = at->gelu && at->grad;
    const DType ta = DTypeOf(a->dtype), tb = DTypeOf(b->dtype), td = DTypeOf(d->dtype);
    const int64_t cols_a = a->shape[1];
    const int64_t n = transa ? b->shape[1] : transb ? b->shape[1] : b->shape[2];
    auto at_elem = [](const void* base, DType t, int64_t i) -> const void* {
      return base ? static_cast<const char*>(base) + size_t(i) * ElemSize(t) : nullptr;
    };
    auto at_mut = [](void* base, DType t, int64_t i) -> void* {
      return base ? static_cast<char*>(base) + size_t(i) * ElemSize(t) : nullptr;
    };
    std::vector<OneGemm> jobs(static_cast<size_t>(groups));
    int64_t row = 0;
    for (int64_t grp = 0; grp < groups; ++grp) {
      OneGemm& o = jobs[size_t(grp)];
      o.transa = transa;
      o.transb = transb;
      o.n = n;
      o.ta = ta;
      o.tb = tb;
      o.td = td;
      o.tpre = TypeOr(pre, DType::kF32);
      o.tbg = TypeOr(bias_grad, DType::kF32);
      if (transa) {
        o.m = cols_a;
        o.k = splits[grp];
        o.a = at_elem(DataPtr(a), ta, row * o.m);
        o.b = at_elem(DataPtr(b), tb, row * n);
        o.d = at_mut(DataPtr(d), td, grp * o.m * n);
        o.pre = at_mut(PtrOr(pre), o.tpre, grp * o.m * n);
        o.bias_grad = at_mut(PtrOr(bias_grad), o.tbg, grp * (dgelu ? n : o.m));
      } else {
        o.m = splits[grp];
        o.k = cols_a;
        o.a = at_elem(DataPtr(a), ta, row * o.k);
        o.b = at_elem(DataPtr(b), tb, grp * o.k * n);
        o.d = at_mut(DataPtr(d), td, row * n);
        o.pre = at_mut(PtrOr(pre), o.tpre, row * n);
        o.bias_grad = at_mut(PtrOr(bias_grad), o.tbg, dgelu ? grp * n : row);
      }
      o.sa = IsFp8(ta) ? ScalarOf(f->inputs[4], grp) : 1.0f;
      o.sb = IsFp8(tb) ? ScalarOf(f->inputs[5], grp) : 1.0f;
      o.d_scale = IsFp8(td) ? ScalarOf(f->inputs[6], grp) : 1.0f;
      o.alpha = at->alpha;
      o.beta = at->beta;
      o.c = at->accumulate ? o.d : nullptr;
      o.tc = td;
      o.tbias = TypeOr(bias, DType::kF32);
      o.bias = at_elem(PtrOr(bias), o.tbias, grp * n);
      o.gelu = at->gelu != 0;
      o.grad = at->grad != 0;
      o.d_amax = d_amax ? static_cast<float*>(DataPtr(d_amax)) + grp : nullptr;
      row += splits[grp];
    }
    // Plan and reserve every group before the first one writes.
    ThreadKept<Workspace> kept;  // this thread's workspace (kernel_support.h)
    Workspace& ws = *kept;
    std::vector<OnePlan> plans(static_cast<size_t>(groups));
    for (size_t i = 0; i < jobs.size(); ++i) {
      plans[i] = PlanOne(f, jobs[i], /*scan=*/true);
      Reserve(ws, jobs[i], plans[i]);
    }
    for (size_t i = 0; i < jobs.size(); ++i) Execute(f, jobs[i], plans[i], ws);
    return nullptr;
  });
}

}  // namespace

tefl_status* RegisterPortableGemm(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"generic_gemm", GenericGemm},
      {"te_general_grouped_gemm", GroupedGemm},
  };
  return RegisterCpuKernels(registrar, kImpl, TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
