// default.portable attention kernels: fused_attn_fwd / fused_attn_bwd as
// flash attention (spec/ops.md "Attention", docs/ops-attention.md).
//
// Google Highway with runtime ISA dispatch (foreach_target.h), threads from
// the host pool. No [sq, sk] matrix is ever in memory: queries are processed
// in blocks of kBq rows against key tiles of kBk keys with an online softmax
// (running max m and denominator l per row), in fp32.
//
//  - Every tile product is one register-blocked micro-kernel (Gemm below):
//    C[M x N] (+)= A[M x K] B[K x N], 4 rows of A x 4 vectors of B columns
//    (4 x 64 floats with AVX-512), K loop of broadcast-FMAs. Operands are
//    packed to fp32 once per tile: q block (pre-multiplied by the scale), k
//    tile transposed, v tile; bf16/fp16 are widened exactly while packing.
//  - Forward, per (sequence, head, query block): S = Qs Kt, mask outside each
//    row's key range (one contiguous range, attention_geometry.h), online
//    softmax with exp from hwy/contrib/math, dropout on P (not on l), O +=
//    P V; at the end O /= l and lse = m + log(l). The softmax variants start
//    each row at m = extra logit (0 off-by-one, alpha[h] learnable), l = 1.
//  - Backward (flash-attention-2): D_i = d_o_i . o_i first; then one pass
//    over (sequence, kv head, key block) items, looping over the group's q
//    heads and query blocks: P = exp(S - lse) recomputed from the saved
//    statistics, dS = P (dP' - D), dV += P'^T dO, dK += dS^T Qs (in
//    registers-blocked tiles, written once per key block), and dQ += dS K
//    into a per-chunk fp32 partial (one chunk per pool thread, items
//    interleaved across chunks). dq = scale * (sum of the partials in chunk
//    order). No atomics; results depend on the thread count only through
//    that fixed-order sum. Extra memory: threads x |q| fp32 for the partials
//    plus per-thread tiles, O(s) (no [sq, sk] buffer).
//  - bf16 on a CPU with avx512_bf16: the tile products (forward 2,
//    backward 5) run on vdpbf16ps from K-pair-interleaved bf16 operands (q,
//    k, v, d_o exact; P, P' and dS rounded to bf16), fp32 accumulation, the
//    softmax in fp32 as above ("bf16 dot products"); with AMX-BF16 too, on
//    AMX tiles from the same operands ("AMX tiles"). The forward on this
//    path takes key tiles of kBkDot.
//
// Host contract (validated before the call): CPU tensors, compact row-major,
// q/k/v/o/d_o/dq/dk/dv of one float dtype, stats/alpha fp32, cu_seqlens
// consistent with the tensors, causal masks with window_right -1 or 0.
#include <hwy/aligned_allocator.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <initializer_list>
#include <limits>
#include <vector>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#endif

#include "backends/attention_geometry.h"
#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "backends/philox.h"
#include "backends/portable/amx_tiles.h"
#include "backends/portable/cpu_paths.h"
#include "core/dtype.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_ATTENTION_SHARED_
#define TEFL_BACKENDS_PORTABLE_ATTENTION_SHARED_
namespace tefl::backends {
namespace {

constexpr int64_t kBq = 64;  // query rows per block
constexpr int64_t kBk = 64;  // keys per tile (a multiple of every target's 4 vectors)
// Keys per tile of the forward on the bf16 dot path: twice the products per
// load and store of an AMX accumulator tile and per row of softmax
// bookkeeping (bench_attention: 8-14 % faster forwards than 64; the fp32
// forward's d = 128 cases were ~8 % slower with 128, so they keep kBk).
constexpr int64_t kBkDot = 128;
constexpr int64_t kBkMax = kBkDot > kBk ? kBkDot : kBk;
constexpr float kInf = std::numeric_limits<float>::infinity();

// One unit of work: (sequence, head, first row of the block).
struct Item {
  int64_t b, h, start;
};

struct AttnCtx {
  AttnGeometry g;
  DType t;
  const void *q, *k, *v, *o, *d_o;
  void *out, *dq, *dk, *dv;
  float* stats;      // forward output
  const float* lse;  // backward input
  float* drow;       // backward: D per query row, indexed like stats
  const float* alpha;
  uint32_t threshold16;  // dropout keep threshold (philox.h)
  float keep_scale;      // 1 / (1 - p)
  int64_t dqkp, dvp;     // head dims padded to the micro-kernel's column group
  const Item* items;
  // Forward: k and v packed once per call, per (sequence, kv head, key
  // tile): k^T [dqk x kBk] then v [kBk x dvp], fp32, keys past the sequence 0.
  float* kv_pack;
  const int64_t* first_tile;  // [b + 1] prefix sums of key tiles per sequence
  int64_t tile_floats;
  // Backward: q (times scale) and d_o packed once per call, one row of dqkp /
  // dvp floats per query row at its stats index.
  float* qs_all;
  float* do_all;

  // bf16 inputs on a CPU with avx512_bf16 (see "bf16 dot products" below):
  // the backward's tile products run on vdpbf16ps. q16: one slot of
  // slot_words per query item (Items order), first_qblk: [b] the first
  // query item of each sequence.
  bool bf16dot = false;
  bool amx = false;  // bf16dot's products on AMX tiles where their sizes allow ("AMX tiles" below)
  uint32_t* q16 = nullptr;
  const int64_t* first_qblk = nullptr;
  int64_t slot_words = 0;
  int64_t bk = kBk;  // the forward's keys per tile: kBkDot on the bf16 dot path

  const float* Tile(int64_t bi, int64_t hk, int64_t j0) const {
    const int64_t nt = first_tile[bi + 1] - first_tile[bi];
    return kv_pack + ((first_tile[bi] * g.hkv + hk * nt) + j0 / bk) * tile_floats;
  }
  std::atomic<int> failed{0};
};

// n elements of a tensor from element offset `off`, widened to fp32.
inline void LoadRow(const void* base, DType t, int64_t off, int64_t n, float* dst) {
  if (t == DType::kF32) {
    std::memcpy(dst, static_cast<const float*>(base) + off, size_t(n) * sizeof(float));
    return;
  }
  const uint16_t* p = static_cast<const uint16_t*>(base) + off;
  if (t == DType::kBF16) {
    for (int64_t c = 0; c < n; ++c) dst[c] = BF16ToFloat(p[c]);
  } else {
    for (int64_t c = 0; c < n; ++c) dst[c] = F16ToFloat(p[c]);
  }
}
// n fp32 values times `mul`, rounded once to the tensor's dtype.
inline void StoreRow(const float* src, float mul, DType t, void* base, int64_t off, int64_t n) {
  if (t == DType::kF32) {
    float* p = static_cast<float*>(base) + off;
    for (int64_t c = 0; c < n; ++c) p[c] = src[c] * mul;
    return;
  }
  uint16_t* p = static_cast<uint16_t*>(base) + off;
  if (t == DType::kBF16) {
    for (int64_t c = 0; c < n; ++c) p[c] = FloatToBF16(src[c] * mul);
  } else {
    for (int64_t c = 0; c < n; ++c) p[c] = FloatToF16(src[c] * mul);
  }
}
inline void ZeroRow(DType t, void* base, int64_t off, int64_t n) {
  std::memset(static_cast<char*>(base) + size_t(off) * FloatElemSize(t), 0, size_t(n) * FloatElemSize(t));
}

// The dropout factors of row (bi, h, i) for keys [j0, j0 + n): keep_scale or 0.
inline void DropFactors(const AttnCtx& c, int64_t bi, int64_t h, int64_t i, int64_t j0, int64_t n, float* z) {
  const AttnGeometry& g = c.g;
  const uint64_t base = g.DropRow(bi, h, i) * g.DropCols() + g.DropCol(bi, j0);
  uint64_t group = ~uint64_t(0);
  Philox4 w{};
  for (int64_t jj = 0; jj < n; ++jj) {
    const uint64_t e = base + uint64_t(jj);
    if (e / 8 != group) {
      group = e / 8;
      w = DropoutWords(g.seed, g.offset, group);
    }
    z[jj] = DropoutKept(w, e % 8, c.threshold16) ? c.keep_scale : 0.0f;
  }
}

// The extra softmax term as a logit (see reference.cpp).
inline bool ExtraLogit(const AttnCtx& c, int64_t h, float* logit) {
  *logit = c.g.softmax == TEFL_ATTN_SOFTMAX_LEARNABLE ? c.alpha[h] : 0.0f;
  return c.g.softmax != TEFL_ATTN_SOFTMAX_VANILLA;
}

// ---- bf16 dot products (AVX512-BF16) ------------------------------------------
// As gemm.cpp's bf16 path: torch's CPU bf16 attention runs its tile products
// on vdpbf16ps (twice the fp32 FMA rate). With bf16 inputs, a CPU with
// avx512_bf16 and no subnormal in q/k/v(/d_o) (vdpbf16ps reads subnormal
// inputs as 0), the forward's two and the backward's five tile products take
// K-pair-interleaved bf16 operands: each 32-bit word holds elements k (low
// half) and k + 1 (high half) of the reduction, each vdpbf16ps lane adds
// a[k] b[k] + a[k+1] b[k+1] into fp32 (products exact, sums rounded: the
// error bound of any fp32 summation order). q, k, v and d_o are used
// exactly; P (forward), P' and dS are rounded once to bf16 (round to nearest
// even) before the products that take them, as oneDNN and GPU flash
// attention do; the softmax statistics stay fp32. vdpbf16ps also flushes
// subnormal fp32 results (|x| < 2^-126) to 0, far under every tolerance.
// TEFL_PORTABLE_ATTN_BF16DOT=0 in the environment forces the fp32 path.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TEFL_ATTN_BF16DOT 1
#define TEFL_BF16_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16")))

inline bool CpuHasBf16Dot() { return CpuHasAvx512Bf16(); }
// Whether any of n bf16 values is subnormal (exponent 0, mantissa not 0).
// Only where CpuHasBf16Dot().
TEFL_BF16_TARGET inline bool AnySubnormalBf16(const void* p, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(p);
  const __m512i exponent = _mm512_set1_epi16(0x7F80), mantissa = _mm512_set1_epi16(0x7F);
  __mmask32 any = 0;
  for (int64_t i = 0; i < n; i += 32) {
    const __mmask32 m = n - i >= 32 ? ~__mmask32(0) : __mmask32((1u << (n - i)) - 1u);
    const __m512i v = _mm512_maskz_loadu_epi16(m, h + i);  // zeros past the end: not subnormal
    any |= _mm512_testn_epi16_mask(v, exponent) & _mm512_test_epi16_mask(v, mantissa);
  }
  return any != 0;
}

constexpr size_t kDotCols = 64;  // columns per micro-kernel step (4 zmm)

// GCC 12 reports its own _mm512_undefined_*() placeholders inside the
// conversion intrinsics as "maybe uninitialized" (a false positive, as in
// gemm.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// C[M x N] (+)= alpha * A B over Kp reduction pairs. A(i, p) at A[i * lda +
// p], B(p, j) at B[p * ldb + j]; M % 4 == 0, N % 64 == 0. A 4 x 64 block of
// C stays in registers over the whole K loop.
template <bool kAccumulate>
TEFL_BF16_TARGET void DotGemm(const uint32_t* __restrict A, size_t lda, const uint32_t* __restrict B, size_t ldb,
                              float* __restrict C, size_t ldc, size_t M, size_t N, size_t Kp, float alpha) {
  const __m512 va = _mm512_set1_ps(alpha);
  for (size_t i = 0; i < M; i += 4) {
    const uint32_t* a0 = A + i * lda;
    const uint32_t* a1 = a0 + lda;
    const uint32_t* a2 = a1 + lda;
    const uint32_t* a3 = a2 + lda;
    for (size_t j = 0; j < N; j += kDotCols) {
      __m512 c00 = _mm512_setzero_ps(), c01 = c00, c02 = c00, c03 = c00, c10 = c00, c11 = c00, c12 = c00, c13 = c00;
      __m512 c20 = c00, c21 = c00, c22 = c00, c23 = c00, c30 = c00, c31 = c00, c32 = c00, c33 = c00;
      const uint32_t* b = B + j;
      for (size_t p = 0; p < Kp; ++p, b += ldb) {
        const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b), b1 = (__m512bh)_mm512_loadu_si512(b + 16);
        const __m512bh b2 = (__m512bh)_mm512_loadu_si512(b + 32), b3 = (__m512bh)_mm512_loadu_si512(b + 48);
#define TEFL_DOT_ROW(r)                                                 \
  {                                                                     \
    const __m512bh av = (__m512bh)_mm512_set1_epi32(int(a##r[p]));      \
    c##r##0 = _mm512_dpbf16_ps(c##r##0, av, b0);                        \
    c##r##1 = _mm512_dpbf16_ps(c##r##1, av, b1);                        \
    c##r##2 = _mm512_dpbf16_ps(c##r##2, av, b2);                        \
    c##r##3 = _mm512_dpbf16_ps(c##r##3, av, b3);                        \
  }
        TEFL_DOT_ROW(0)
        TEFL_DOT_ROW(1)
        TEFL_DOT_ROW(2)
        TEFL_DOT_ROW(3)
#undef TEFL_DOT_ROW
      }
#define TEFL_DOT_STORE(r, q)                                     \
  {                                                              \
    float* dst = C + (i + r) * ldc + j + 16 * q;                 \
    __m512 v = _mm512_mul_ps(c##r##q, va);                       \
    if (kAccumulate) v = _mm512_add_ps(v, _mm512_loadu_ps(dst)); \
    _mm512_storeu_ps(dst, v);                                    \
  }
      TEFL_DOT_STORE(0, 0)
      TEFL_DOT_STORE(0, 1)
      TEFL_DOT_STORE(0, 2) TEFL_DOT_STORE(0, 3) TEFL_DOT_STORE(1, 0) TEFL_DOT_STORE(1, 1) TEFL_DOT_STORE(1, 2)
          TEFL_DOT_STORE(1, 3) TEFL_DOT_STORE(2, 0) TEFL_DOT_STORE(2, 1) TEFL_DOT_STORE(2, 2) TEFL_DOT_STORE(2, 3)
              TEFL_DOT_STORE(3, 0) TEFL_DOT_STORE(3, 1) TEFL_DOT_STORE(3, 2) TEFL_DOT_STORE(3, 3)
#undef TEFL_DOT_STORE
    }
  }
}

// ---- AMX tiles (tdpbf16ps) ----
// Where the CPU has AMX-BF16 (and TEFL_PORTABLE_ATTN_AMX is not 0), the same
// products run on AMX tiles: DotGemm's A rows are exactly tdpbf16ps's A tile
// rows (16 K pairs of 4 bytes) and its B rows its B tile rows (16 columns of
// one K pair), so the operands are shared by both paths. Tiles 0-3 hold a
// 32 x 32 block of C in fp32, 4-5 two 16-row A tiles, 6-7 two 16-column B
// tiles (amx_tiles.h's configuration, loaded by the thread: FwdRange and
// BwdKvChunk). Each C element sums its K pairs in order, as vdpbf16ps does;
// the two units may round their sums differently. Subnormal inputs are ruled
// out by the bf16dot checks; subnormal results are flushed, as by vdpbf16ps.
#if TEFL_HAVE_AMX_TILES
#define TEFL_AMX_TARGET __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

// One block of C of kRi x 2 16 x 16 tiles (C tile (ri, rj) in tile 2 ri +
// rj) over Kp pairs (Kp % 16 == 0).
template <bool kAccumulate, int kRi>
TEFL_AMX_TARGET inline void AmxDotBlock(const uint32_t* A, size_t lda, const uint32_t* B, size_t ldb, float* C,
                                        size_t ldc, size_t Kp) {
  const size_t sa = lda * 4, sb = ldb * 4, sc = ldc * 4;
  float* c1 = C + 16;
  float* c2 = C + 16 * ldc;
  float* c3 = c2 + 16;
  if constexpr (kAccumulate) {
    _tile_loadd(0, C, sc);
    _tile_loadd(1, c1, sc);
    if constexpr (kRi == 2) {
      _tile_loadd(2, c2, sc);
      _tile_loadd(3, c3, sc);
    }
  } else {
    _tile_zero(0);
    _tile_zero(1);
    if constexpr (kRi == 2) {
      _tile_zero(2);
      _tile_zero(3);
    }
  }
  for (size_t p = 0; p < Kp; p += 16) {
    _tile_loadd(4, A + p, sa);
    _tile_loadd(6, B + p * ldb, sb);
    if constexpr (kRi == 2) _tile_loadd(5, A + 16 * lda + p, sa);
    _tile_loadd(7, B + p * ldb + 16, sb);
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    if constexpr (kRi == 2) {
      _tile_dpbf16ps(2, 5, 6);
      _tile_dpbf16ps(3, 5, 7);
    }
  }
  _tile_stored(0, C, sc);
  _tile_stored(1, c1, sc);
  if constexpr (kRi == 2) {
    _tile_stored(2, c2, sc);
    _tile_stored(3, c3, sc);
  }
}

// DotGemm's product on AMX tiles: M and Kp multiples of 16, N of 32; alpha
// == 1 when kAccumulate.
template <bool kAccumulate>
TEFL_AMX_TARGET void AmxDotGemm(const uint32_t* A, size_t lda, const uint32_t* B, size_t ldb, float* C, size_t ldc,
                                size_t M, size_t N, size_t Kp, float alpha) {
  for (size_t i = 0; i < M; i += 32) {
    const uint32_t* a = A + i * lda;
    for (size_t j = 0; j < N; j += 32) {
      const uint32_t* b = B + j;
      float* c = C + i * ldc + j;
      if (i + 32 <= M)
        AmxDotBlock<kAccumulate, 2>(a, lda, b, ldb, c, ldc, Kp);
      else
        AmxDotBlock<kAccumulate, 1>(a, lda, b, ldb, c, ldc, Kp);
    }
  }
  if (!kAccumulate && alpha != 1.0f) {
    const __m512 va = _mm512_set1_ps(alpha);
    for (size_t i = 0; i < M; ++i) {
      float* row = C + i * ldc;
      for (size_t j = 0; j < N; j += 16) _mm512_storeu_ps(row + j, _mm512_mul_ps(_mm512_loadu_ps(row + j), va));
    }
  }
}
#endif

// C[M x N] (+)= alpha * A B (DotGemm's operands and bounds) on AMX tiles when
// the call may use them and the sizes are whole tiles, else on vdpbf16ps.
template <bool kAccumulate>
TEFL_BF16_TARGET inline void Dot(const AttnCtx& c, const uint32_t* A, size_t lda, const uint32_t* B, size_t ldb,
                                 float* C, size_t ldc, size_t M, size_t N, size_t Kp, float alpha) {
#if TEFL_HAVE_AMX_TILES
  if (c.amx && M % 16 == 0 && N % 32 == 0 && Kp % 16 == 0 && (!kAccumulate || alpha == 1.0f))
    return AmxDotGemm<kAccumulate>(A, lda, B, ldb, C, ldc, M, N, Kp, alpha);
#else
  (void)c;
#endif
  DotGemm<kAccumulate>(A, lda, B, ldb, C, ldc, M, N, Kp, alpha);
}

// From the fp32 P' (s) and dS (dp) tiles [M x kBk] (M even, np % 16 == 0):
// pp[(r / 2) * kBk + j] = the bf16 pair (P'[r][j], P'[r + 1][j]), dsp the
// same of dS, and dsr = dS rows as bf16 (row r: words [r * kBk / 2, ...)).
TEFL_BF16_TARGET inline void TileToBf16(const float* s, const float* dp, int64_t M, int64_t np, uint32_t* pp,
                                        uint32_t* dsp, uint32_t* dsr) {
  for (int64_t r = 0; r < M; r += 2) {
    for (int64_t j = 0; j < np; j += 16) {
      const __m256i p0 = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + r * kBk + j));
      const __m256i p1 = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + (r + 1) * kBk + j));
      const __m256i d0 = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(dp + r * kBk + j));
      const __m256i d1 = (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(dp + (r + 1) * kBk + j));
      _mm512_storeu_si512(pp + (r / 2) * kBk + j,
                          _mm512_or_si512(_mm512_cvtepu16_epi32(p0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(p1), 16)));
      _mm512_storeu_si512(dsp + (r / 2) * kBk + j,
                          _mm512_or_si512(_mm512_cvtepu16_epi32(d0), _mm512_slli_epi32(_mm512_cvtepu16_epi32(d1), 16)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsr + r * (kBk / 2) + j / 2), d0);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dsr + (r + 1) * (kBk / 2) + j / 2), d1);
    }
  }
}

// dst row r (words [r * ld / 2, ...)) = the first np floats of s row r as
// bf16 (M rows ld floats apart, ld even, np % 16 == 0).
TEFL_BF16_TARGET inline void RowsToBf16(const float* s, int64_t ld, int64_t M, int64_t np, uint32_t* dst) {
  for (int64_t r = 0; r < M; ++r)
    for (int64_t j = 0; j < np; j += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + r * (ld / 2) + j / 2),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(s + r * ld + j)));
}
#pragma GCC diagnostic pop
#else
#define TEFL_ATTN_BF16DOT 0
#endif

// Words of one query item's bf16 slot: q rows [kBq x dqkp / 2] as words of
// consecutive channels, q pairs [dqkp x kBq / 2] (word (x, p) = channel x
// of rows 2p, 2p + 1: row x of q^T as the A operand of dK^T += Q^T dS),
// then the same two of d_o with dvp.
inline int64_t SlotWords(int64_t dqkp, int64_t dvp) { return kBq * (dqkp + dvp); }

// out[x] = lo[x] | hi[x] << 16 for x < n (a null row reads as zeros).
#if TEFL_ATTN_BF16DOT
#pragma GCC diagnostic push  // GCC 12's intrinsic placeholders, as for DotGemm above
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
TEFL_BF16_TARGET inline void InterleaveHalves(const uint16_t* lo, const uint16_t* hi, int64_t n, uint32_t* out) {
  for (int64_t x = 0; x < n; x += 16) {
    const __mmask16 m = n - x >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << (n - x)) - 1u);
    const __m512i a = lo ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, lo + x)) : _mm512_setzero_si512();
    const __m512i b = hi ? _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, hi + x)) : _mm512_setzero_si512();
    _mm512_mask_storeu_epi32(out + x, m, _mm512_or_si512(a, _mm512_slli_epi32(b, 16)));
  }
}
#pragma GCC diagnostic pop
#else
inline void InterleaveHalves(const uint16_t* lo, const uint16_t* hi, int64_t n, uint32_t* out) {
  for (int64_t x = 0; x < n; ++x) out[x] = (lo ? lo[x] : 0u) | (hi ? uint32_t(hi[x]) << 16 : 0u);
}
#endif

// Rows of one head of a bf16 tensor: row r (r < n) at base + off[r], d
// elements; everything outside [n) x [d) reads as 0. The packers below write
// every word of their destination ranges (padding included).
struct Bf16Rows {
  const uint16_t* base;
  int64_t off[kBq > kBkMax ? kBq : kBkMax];
  int64_t n, d;
  const uint16_t* Row(int64_t r) const { return r < n ? base + off[r] : nullptr; }
  // dst[r * ld + p] = elements 2p, 2p + 1 of row r, for r < rows, p < pairs.
  void PairRows(int64_t rows, int64_t pairs, uint32_t* dst, int64_t ld) const {
    const int64_t full = std::min(d / 2, pairs);
    for (int64_t r = 0; r < rows; ++r) {
      uint32_t* out = dst + r * ld;
      const uint16_t* row = Row(r);
      int64_t p = 0;
      if (row) {
        std::memcpy(out, row, size_t(full) * 4);
        p = full;
        if (d % 2 && p < pairs) out[p++] = row[d - 1];
      }
      for (; p < pairs; ++p) out[p] = 0;
    }
  }
  // dst[p * ld + r] = elements 2p, 2p + 1 of row r: PairRows transposed.
  void PairColumns(int64_t rows, int64_t pairs, uint32_t* dst, int64_t ld) const {
    const int64_t full = std::min(d / 2, pairs);
    for (int64_t r = 0; r < rows; ++r) {
      const uint16_t* row = Row(r);
      int64_t p = 0;
      if (row) {
        for (; p < full; ++p) {
          uint32_t w;
          std::memcpy(&w, row + 2 * p, 4);
          dst[p * ld + r] = w;
        }
        if (d % 2 && p < pairs) dst[p++ * ld + r] = row[d - 1];
      }
      for (; p < pairs; ++p) dst[p * ld + r] = 0;
    }
  }
  // dst[p * ld + x] = element x of rows 2p (low half) and 2p + 1, for p <
  // rows / 2 (rows even), x < width.
  void RowPairs(int64_t rows, int64_t width, uint32_t* dst, int64_t ld) const {
    const int64_t nx = std::min(d, width);
    for (int64_t p = 0; p < rows / 2; ++p) {
      uint32_t* out = dst + p * ld;
      InterleaveHalves(Row(2 * p), Row(2 * p + 1), nx, out);
      for (int64_t x = nx; x < width; ++x) out[x] = 0;
    }
  }
  // dst[x * ld + p] = element x of rows 2p and 2p + 1: RowPairs transposed.
  void RowPairColumns(int64_t rows, int64_t width, uint32_t* dst, int64_t ld) const {
    for (int64_t p = 0; p < rows / 2; ++p) {
      const uint16_t* lo = Row(2 * p);
      const uint16_t* hi = Row(2 * p + 1);
      const int64_t nx = lo ? std::min(d, width) : 0;
      for (int64_t x = 0; x < nx; ++x) dst[x * ld + p] = lo[x] | (hi ? uint32_t(hi[x]) << 16 : 0u);
      for (int64_t x = nx; x < width; ++x) dst[x * ld + p] = 0;
    }
  }
};

// Fills the slot of query block (bi, h, rows [i0, i0 + n)).
inline void PackQSlotBf16(const AttnCtx& c, int64_t bi, int64_t h, int64_t i0, int64_t n, uint32_t* slot) {
  const AttnGeometry& g = c.g;
  const int64_t dqkp = c.dqkp, dvp = c.dvp;
  Bf16Rows q{static_cast<const uint16_t*>(c.q), {}, n, g.dqk};
  Bf16Rows o{static_cast<const uint16_t*>(c.d_o), {}, n, g.dv};
  for (int64_t r = 0; r < n; ++r) {
    const int64_t t = g.token_q(bi, i0 + r);
    q.off[r] = AttnGeometry::At(t, h, g.hq, g.dqk);
    o.off[r] = AttnGeometry::At(t, h, g.hq, g.dv);
  }
  uint32_t* qrow = slot;
  uint32_t* qpair = qrow + kBq * dqkp / 2;
  uint32_t* orow = qpair + kBq / 2 * dqkp;
  uint32_t* opair = orow + kBq * dvp / 2;
  q.PairRows(kBq, dqkp / 2, qrow, dqkp / 2);
  q.RowPairColumns(kBq, dqkp, qpair, kBq / 2);
  o.PairRows(kBq, dvp / 2, orow, dvp / 2);
  o.RowPairColumns(kBq, dvp, opair, kBq / 2);
}

// The key block (bi, hk, keys [j0, j0 + nk)): ktp [dqkp / 2 x kBk] (word
// (p, j) = channels 2p, 2p + 1 of key j), vtp [dvp / 2 x kBk] the same of v,
// kpair [kBk / 2 x dqkp] (word (p, x) = channel x of keys 2p, 2p + 1).
inline void PackKBlockBf16(const AttnCtx& c, int64_t bi, int64_t hk, int64_t j0, int64_t nk, uint32_t* ktp,
                           uint32_t* vtp, uint32_t* kpair) {
  const AttnGeometry& g = c.g;
  Bf16Rows k{static_cast<const uint16_t*>(c.k), {}, nk, g.dqk};
  Bf16Rows v{static_cast<const uint16_t*>(c.v), {}, nk, g.dv};
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t t = g.token_kv(bi, j0 + r);
    k.off[r] = AttnGeometry::At(t, hk, g.hkv, g.dqk);
    v.off[r] = AttnGeometry::At(t, hk, g.hkv, g.dv);
  }
  k.PairColumns(kBk, c.dqkp / 2, ktp, kBk);
  v.PairColumns(kBk, c.dvp / 2, vtp, kBk);
  k.RowPairs(kBk, c.dqkp, kpair, c.dqkp);
}

// The forward's key tile of c.bk keys: ktp [dqkp / 2 x bk] as above, then
// vpair [bk / 2 x dvp] (word (p, x) = channel x of values 2p, 2p + 1).
inline void PackKvTileBf16(const AttnCtx& c, int64_t bi, int64_t hk, int64_t j0, int64_t nk, uint32_t* ktp,
                           uint32_t* vpair) {
  const AttnGeometry& g = c.g;
  Bf16Rows k{static_cast<const uint16_t*>(c.k), {}, nk, g.dqk};
  Bf16Rows v{static_cast<const uint16_t*>(c.v), {}, nk, g.dv};
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t t = g.token_kv(bi, j0 + r);
    k.off[r] = AttnGeometry::At(t, hk, g.hkv, g.dqk);
    v.off[r] = AttnGeometry::At(t, hk, g.hkv, g.dv);
  }
  k.PairColumns(c.bk, c.dqkp / 2, ktp, c.bk);
  v.RowPairs(c.bk, c.dvp, vpair, c.dvp);
}

// q rows [i0, i0 + n) of (bi, h) as words of channel pairs [rows x dqkp / 2]
// (rows [n, rows) zero).
inline void PackQRowsBf16(const AttnCtx& c, int64_t bi, int64_t h, int64_t i0, int64_t n, int64_t rows, uint32_t* dst) {
  const AttnGeometry& g = c.g;
  Bf16Rows q{static_cast<const uint16_t*>(c.q), {}, n, g.dqk};
  for (int64_t r = 0; r < n; ++r) q.off[r] = AttnGeometry::At(g.token_q(bi, i0 + r), h, g.hq, g.dqk);
  q.PairRows(rows, c.dqkp / 2, dst, c.dqkp / 2);
}

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_ATTENTION_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/attention.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/simd_io-inl.h"

// ---- Per-target kernels ------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// Columns per micro-kernel step: 4 vectors.
HWY_INLINE size_t Group() { return 4 * hn::Lanes(DF()); }
HWY_INLINE int64_t RoundUp(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// C[M x N] (+)= A[M x K] B[K x N]; M % 4 == 0, N % Group() == 0. Each step
// keeps a 4 x 4-vector block of C in registers over the whole K loop.
// kTransA: A is stored transposed, element (i, k) at A[k * lda + i].
template <bool kAccumulate, bool kTransA = false>
HWY_NOINLINE void Gemm(const float* HWY_RESTRICT A, size_t lda, const float* HWY_RESTRICT B, size_t ldb,
                       float* HWY_RESTRICT C, size_t ldc, size_t M, size_t N, size_t K) {
  const DF df;
  const size_t L = hn::Lanes(df);
  const size_t row_step = kTransA ? 1 : lda, k_step = kTransA ? lda : 1;
  for (size_t i = 0; i < M; i += 4) {
    const float* HWY_RESTRICT a0 = A + i * row_step;
    const float* HWY_RESTRICT a1 = a0 + row_step;
    const float* HWY_RESTRICT a2 = a1 + row_step;
    const float* HWY_RESTRICT a3 = a2 + row_step;
    for (size_t j = 0; j < N; j += 4 * L) {
      float* HWY_RESTRICT c0 = C + i * ldc + j;
      float* HWY_RESTRICT c1 = c0 + ldc;
      float* HWY_RESTRICT c2 = c1 + ldc;
      float* HWY_RESTRICT c3 = c2 + ldc;
      auto c00 = hn::Zero(df), c01 = hn::Zero(df), c02 = hn::Zero(df), c03 = hn::Zero(df);
      auto c10 = hn::Zero(df), c11 = hn::Zero(df), c12 = hn::Zero(df), c13 = hn::Zero(df);
      auto c20 = hn::Zero(df), c21 = hn::Zero(df), c22 = hn::Zero(df), c23 = hn::Zero(df);
      auto c30 = hn::Zero(df), c31 = hn::Zero(df), c32 = hn::Zero(df), c33 = hn::Zero(df);
      if (kAccumulate) {
        c00 = hn::LoadU(df, c0), c01 = hn::LoadU(df, c0 + L), c02 = hn::LoadU(df, c0 + 2 * L);
        c03 = hn::LoadU(df, c0 + 3 * L);
        c10 = hn::LoadU(df, c1), c11 = hn::LoadU(df, c1 + L), c12 = hn::LoadU(df, c1 + 2 * L);
        c13 = hn::LoadU(df, c1 + 3 * L);
        c20 = hn::LoadU(df, c2), c21 = hn::LoadU(df, c2 + L), c22 = hn::LoadU(df, c2 + 2 * L);
        c23 = hn::LoadU(df, c2 + 3 * L);
        c30 = hn::LoadU(df, c3), c31 = hn::LoadU(df, c3 + L), c32 = hn::LoadU(df, c3 + 2 * L);
        c33 = hn::LoadU(df, c3 + 3 * L);
      }
      const float* HWY_RESTRICT b = B + j;
      for (size_t k = 0; k < K; ++k, b += ldb) {
        const auto b0 = hn::LoadU(df, b), b1 = hn::LoadU(df, b + L), b2 = hn::LoadU(df, b + 2 * L),
                   b3 = hn::LoadU(df, b + 3 * L);
        auto a = hn::Set(df, a0[k * k_step]);
        c00 = hn::MulAdd(a, b0, c00), c01 = hn::MulAdd(a, b1, c01), c02 = hn::MulAdd(a, b2, c02);
        c03 = hn::MulAdd(a, b3, c03);
        a = hn::Set(df, a1[k * k_step]);
        c10 = hn::MulAdd(a, b0, c10), c11 = hn::MulAdd(a, b1, c11), c12 = hn::MulAdd(a, b2, c12);
        c13 = hn::MulAdd(a, b3, c13);
        a = hn::Set(df, a2[k * k_step]);
        c20 = hn::MulAdd(a, b0, c20), c21 = hn::MulAdd(a, b1, c21), c22 = hn::MulAdd(a, b2, c22);
        c23 = hn::MulAdd(a, b3, c23);
        a = hn::Set(df, a3[k * k_step]);
        c30 = hn::MulAdd(a, b0, c30), c31 = hn::MulAdd(a, b1, c31), c32 = hn::MulAdd(a, b2, c32);
        c33 = hn::MulAdd(a, b3, c33);
      }
      hn::StoreU(c00, df, c0), hn::StoreU(c01, df, c0 + L), hn::StoreU(c02, df, c0 + 2 * L);
      hn::StoreU(c03, df, c0 + 3 * L);
      hn::StoreU(c10, df, c1), hn::StoreU(c11, df, c1 + L), hn::StoreU(c12, df, c1 + 2 * L);
      hn::StoreU(c13, df, c1 + 3 * L);
      hn::StoreU(c20, df, c2), hn::StoreU(c21, df, c2 + L), hn::StoreU(c22, df, c2 + 2 * L);
      hn::StoreU(c23, df, c2 + 3 * L);
      hn::StoreU(c30, df, c3), hn::StoreU(c31, df, c3 + L), hn::StoreU(c32, df, c3 + 2 * L);
      hn::StoreU(c33, df, c3 + 3 * L);
    }
  }
}

// e^x for x <= 88 (the arguments here are <= 0 up to rounding), as
// softmax.cpp's ExpNonPositive with a degree-6 polynomial (relative error
// ~2e-7): x clamped to >= -88 (e^x = 0 there, so -inf gives 0), reduced to
// r = x - n ln 2, then times 2^n built from the bits. On x86 Max(c, x)
// returns x when x is NaN, so NaN passes through (hn::Exp maps NaN to 0);
// elsewhere (and on x86's scalar and EMU128 targets) an explicit select keeps it.
HWY_INLINE hn::Vec<DF> ExpNaN(DF df, hn::Vec<DF> x) {
  const hn::RebindToSigned<DF> di;
  const auto kLow = hn::Set(df, -88.0f);
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && HWY_TARGET != HWY_EMU128
  x = hn::Max(kLow, x);  // maxps/vmaxps: x when x is NaN
#else                    // the emulated targets' Max need not keep NaN
  x = hn::IfThenElse(hn::Lt(x, kLow), kLow, x);
#endif
  const auto kMagic = hn::Set(df, 12582912.0f);  // 1.5 * 2^23
  const auto t = hn::MulAdd(x, hn::Set(df, 1.44269504088896341f), kMagic);
  const auto r = hn::NegMulAdd(hn::Sub(t, kMagic), hn::Set(df, 0.693147180559945309f), x);
  auto p = hn::Set(df, 1.0f / 720);
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 120));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 24));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f / 6));
  p = hn::MulAdd(p, r, hn::Set(df, 0.5f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  p = hn::MulAdd(p, r, hn::Set(df, 1.0f));
  const int32_t magic_bits = 0x4B400000;
  const auto pow2n = hn::BitCast(df, hn::ShiftLeft<23>(hn::Add(hn::BitCast(di, t), hn::Set(di, 127 - magic_bits))));
  return hn::Mul(p, pow2n);
}

// Scratch of one thread's chunk of work, 64-byte aligned.
struct Scratch {
  hwy::AlignedFreeUniquePtr<float[]> mem;
  // l: the forward's running denominators as one vector of partial sums per
  // row (kBq x Lanes floats, summed across lanes at the end); corr: each
  // row's rescaling factor for the current key tile.
  float *qs, *dos, *kt, *vt, *vrow, *krow, *s, *dp, *acc, *acc2, *acc3, *tmp, *m, *l, *z, *lse, *drow, *corr;
  int64_t lo[kBq], hi[kBq];
  bool active[kBq];  // forward: the row adds terms from the current key tile
  // The bf16 path's key block and tile operands (words of 2 bf16).
  hwy::AlignedFreeUniquePtr<uint32_t[]> words;
  uint32_t *ktp = nullptr, *vtp = nullptr, *kpair = nullptr, *pp = nullptr, *dsp = nullptr, *dsr = nullptr;
  uint32_t* qw = nullptr;  // forward: the q block's words [kBq x dqkp / 2]
  explicit Scratch(const AttnCtx& c) {
    if (c.bf16dot) {
      const size_t ws[] = {size_t(c.dqkp / 2 * kBk), size_t(c.dvp / 2 * kBk), size_t(kBk / 2 * c.dqkp),
                           size_t(kBq / 2 * kBk),    size_t(kBq / 2 * kBk),   size_t(kBq * kBkMax / 2),
                           size_t(kBq * c.dqkp / 2)};
      size_t wt = 0;
      for (size_t s_ : ws) wt += (s_ + 15) / 16 * 16;
      words = hwy::AllocateAligned<uint32_t>(wt);
      if (!words) throw std::bad_alloc();
      uint32_t** wp[] = {&ktp, &vtp, &kpair, &pp, &dsp, &dsr, &qw};
      uint32_t* q = words.get();
      for (size_t i = 0; i < 7; ++i) {
        *wp[i] = q;
        q += (ws[i] + 15) / 16 * 16;
      }
    }
    const int64_t dmax = std::max(c.g.dqk, c.g.dv), pmax = std::max(c.dqkp, c.dvp);
    const size_t sizes[] = {size_t(kBq * c.dqkp), size_t(kBq * c.dvp),  size_t(dmax * kBk), size_t(dmax * kBk),
                            size_t(kBk * c.dvp),  size_t(kBk * c.dqkp), size_t(kBq * kBkMax), size_t(kBq * kBk),
                            size_t(kBk * pmax),   size_t(kBk * pmax),   size_t(kBq * pmax), size_t(kBk * kBq + pmax),
                            size_t(kBq),          size_t(kBq) * hn::Lanes(DF()), size_t(kBkMax), size_t(kBq),
                            size_t(kBq),          size_t(kBq)};
    size_t total = 0;
    for (size_t s_ : sizes) total += (s_ + 15) / 16 * 16;
    mem = hwy::AllocateAligned<float>(total);
    if (!mem) throw std::bad_alloc();
    std::memset(mem.get(), 0, total * sizeof(float));
    float** ptrs[] = {&qs,  &dos,  &kt, &vt, &vrow, &krow, &s,   &dp,   &acc,
                      &acc2, &acc3, &tmp, &m, &l,    &z,    &lse, &drow, &corr};
    float* p = mem.get();
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); ++i) {
      *ptrs[i] = p;
      p += (sizes[i] + 15) / 16 * 16;
    }
  }
};

// Packs n rows of `heads` x d elements (head h) at the token rows of
// `token(r)` into dst [rows x ld] fp32 times mul; rows [n, rows) are zeroed.
template <class TokenFn>
HWY_INLINE void PackRows(const AttnCtx& c, const void* base, TokenFn token, int64_t h, int64_t heads, int64_t d,
                         int64_t n, int64_t rows, float mul, float* dst, int64_t ld) {
  for (int64_t r = 0; r < n; ++r) {
    float* row = dst + r * ld;
    LoadRow(base, c.t, AttnGeometry::At(token(r), h, heads, d), d, row);
    if (mul != 1.0f)
      for (int64_t x = 0; x < d; ++x) row[x] *= mul;
  }
  for (int64_t r = n; r < rows; ++r) std::memset(dst + r * ld, 0, size_t(d) * sizeof(float));
}
// Packs n key rows transposed: dst[x * kBk + r] = elem(r, x); columns [n, cols) zeroed.
template <class TokenFn>
HWY_INLINE void PackTransposed(const AttnCtx& c, const void* base, TokenFn token, int64_t h, int64_t heads, int64_t d,
                               int64_t n, int64_t cols, float* tmp, float* dst) {
  for (int64_t r = 0; r < n; ++r) {
    LoadRow(base, c.t, AttnGeometry::At(token(r), h, heads, d), d, tmp);
    for (int64_t x = 0; x < d; ++x) dst[x * kBk + r] = tmp[x];
  }
  for (int64_t x = 0; x < d; ++x)
    for (int64_t r = n; r < cols; ++r) dst[x * kBk + r] = 0.0f;
}

// Row max over [0, n) (n a multiple of the lanes).
HWY_INLINE float RowMax(const float* HWY_RESTRICT row, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  auto mx = hn::Set(df, -kInf);
  for (int64_t j = 0; j < n; j += L) mx = hn::Max(mx, hn::LoadU(df, row + j));
  return hn::GetLane(hn::MaxOfLanes(df, mx));
}

// Sets row[j] = -inf outside [a, e) for j in [0, n).
HWY_INLINE void MaskOutside(float* row, int64_t a, int64_t e, int64_t n) {
  for (int64_t j = 0; j < std::min(a, n); ++j) row[j] = -kInf;
  for (int64_t j = std::max(e, int64_t(0)); j < n; ++j) row[j] = -kInf;
}

// StoreRow (the scalar one above) with whole vectors by simd_io's stores
// (the same roundings).
HWY_INLINE void StoreRowV(const float* HWY_RESTRICT src, float mul, DType t, void* base, int64_t off, int64_t n) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df));
  const auto vm = hn::Set(df, mul);
  int64_t x = 0;
  if (t == DType::kF32) {
    for (; x + L <= n; x += L) StoreF(hn::Mul(hn::LoadU(df, src + x), vm), df, static_cast<float*>(base) + off + x);
  } else if (t == DType::kBF16) {
    auto* dst = static_cast<hwy::bfloat16_t*>(base) + off;
    for (; x + L <= n; x += L) StoreF(hn::Mul(hn::LoadU(df, src + x), vm), df, dst + x);
  } else {
    auto* dst = static_cast<hwy::float16_t*>(base) + off;
    for (; x + L <= n; x += L) StoreF(hn::Mul(hn::LoadU(df, src + x), vm), df, dst + x);
  }
  if (x < n) StoreRow(src + x, mul, t, base, off + x, n - x);
}

// ---- Forward ----------------------------------------------------------------------------
void FwdItem(const AttnCtx& c, const Item& it, Scratch& w) {
  const DF df;
  const int64_t L = int64_t(hn::Lanes(df)), G = int64_t(Group());
  const AttnGeometry& g = c.g;
  const int64_t bk = c.bk;
  const int64_t bi = it.b, h = it.h, i0 = it.start, hk = g.kv_head(h);
  const int64_t i1 = std::min(i0 + kBq, g.rows_q(bi));
  const int64_t n = std::clamp(g.len_q(bi) - i0, int64_t(0), i1 - i0);
  for (int64_t i = i0 + n; i < i1; ++i) {  // padded rows
    ZeroRow(c.t, c.out, AttnGeometry::At(g.token_q(bi, i), h, g.hq, g.dv), g.dv);
    c.stats[g.stat_index(bi, h, i)] = 0.0f;
  }
  if (n == 0) return;
  const int64_t M = RoundUp(n, 4);
  int64_t klo = std::numeric_limits<int64_t>::max(), khi = 0;
  for (int64_t r = 0; r < n; ++r) {
    g.KeyRange(bi, i0 + r, &w.lo[r], &w.hi[r]);
    if (w.lo[r] < w.hi[r]) klo = std::min(klo, w.lo[r]), khi = std::max(khi, w.hi[r]);
  }
  const float scale = float(g.scale);
  // score_mul: the factor the softmax still applies to the tile of scores.
  // On the bf16 dot path with a positive scale (fold_scale) the tile holds
  // the raw products: scale * max is then the max of the scaled scores, and
  // exp takes scale * s - m in one FMA (no pass over the tile to scale it).
  // Else 1: the fp32 path's q is scaled, and a non-positive scale is applied
  // by the product.
  float score_mul = 1.0f;
#if TEFL_ATTN_BF16DOT
  const bool fold_scale = c.bf16dot && scale > 0.0f;
  if (fold_scale) score_mul = scale;
  if (c.bf16dot)
    PackQRowsBf16(c, bi, h, i0, n, M, w.qw);
  else
#endif
    PackRows(
        c, c.q, [&](int64_t r) { return g.token_q(bi, i0 + r); }, h, g.hq, g.dqk, n, M, scale, w.qs, c.dqkp);
  float extra;
  const bool has_extra = ExtraLogit(c, h, &extra);
  for (int64_t r = 0; r < M; ++r) {
    w.m[r] = has_extra ? extra : -kInf;
    hn::Store(hn::Zero(df), df, w.l + r * L);
    w.l[r * L] = has_extra ? 1.0f : 0.0f;
  }
  std::memset(w.acc, 0, size_t(M * c.dvp) * sizeof(float));

  for (int64_t j0 = klo / bk * bk; j0 < khi; j0 += bk) {
    const int64_t nk = std::min(bk, khi - j0);
    const float* kt = c.Tile(bi, hk, j0);
    const float* vrow = kt + g.dqk * bk;
#if TEFL_ATTN_BF16DOT
    // bf16 dot path: the tile holds words (ktp, then vpair; PackKvItem).
    const int64_t np = c.bf16dot ? RoundUp(nk, int64_t(kDotCols)) : RoundUp(nk, G);
    const uint32_t* ktp = reinterpret_cast<const uint32_t*>(kt);
    if (c.bf16dot)
      Dot<false>(c, w.qw, size_t(c.dqkp / 2), ktp, bk, w.s, bk, size_t(M), size_t(np), size_t(c.dqkp / 2),
                 fold_scale ? 1.0f : scale);
    else
#else
    const int64_t np = RoundUp(nk, G);
#endif
      Gemm<false>(w.qs, size_t(c.dqkp), kt, bk, w.s, bk, size_t(M), size_t(np), size_t(g.dqk));
    // Two passes over the rows, each row's work independent of the others':
    // the new running maxima, then the exponentials (no horizontal sum per
    // tile: l keeps a vector of partial sums per row).
    for (int64_t r = 0; r < M; ++r) {
      float* HWY_RESTRICT row = w.s + r * bk;
      const int64_t a = r < n ? w.lo[r] - j0 : 0, e = r < n ? w.hi[r] - j0 : 0;
      w.active[r] = false;
      if (a >= e || a >= np || e <= 0) {
        std::memset(row, 0, size_t(np) * sizeof(float));
        continue;
      }
      MaskOutside(row, a, e, np);
      const float m_old = w.m[r];
      // With NaN scores the max is NaN or some value (the NaN then reaches
      // exp), or -inf when every other score is -inf: rescanned below.
      const float mx = RowMax(row, np) * score_mul;
      float m_new = std::isnan(mx) ? mx : std::max(m_old, mx);
      if (m_new == -kInf) {
        for (int64_t j = 0; j < np; ++j)
          if (std::isnan(row[j])) m_new = row[j];
      }
      if (m_new == -kInf) {  // only -inf scores (inf inputs): nothing to add
        std::memset(row, 0, size_t(np) * sizeof(float));
        continue;
      }
      w.corr[r] = m_old == m_new ? 1.0f : std::exp(m_old - m_new);
      w.m[r] = m_new;
      w.active[r] = true;
    }
    for (int64_t r = 0; r < M; ++r) {
      if (!w.active[r]) continue;
      float* HWY_RESTRICT row = w.s + r * bk;
      const float corr = w.corr[r];
      const auto vm = hn::Set(df, w.m[r]), vs = hn::Set(df, score_mul);
      auto sum = hn::Zero(df);
      for (int64_t j = 0; j < np; j += L) {
        const auto p = ExpNaN(df, hn::MulSub(hn::LoadU(df, row + j), vs, vm));
        sum = hn::Add(sum, p);
        hn::StoreU(p, df, row + j);
      }
      float* HWY_RESTRICT lv = w.l + r * L;
      hn::Store(hn::MulAdd(hn::Load(df, lv), hn::Set(df, corr), sum), df, lv);
      if (g.dropout) {
        const int64_t a = w.lo[r] - j0, e = w.hi[r] - j0;
        const int64_t a0 = std::max(a, int64_t(0)), e0 = std::min(e, nk);
        DropFactors(c, bi, h, i0 + r, j0 + a0, e0 - a0, w.z);
        for (int64_t j = a0; j < e0; ++j) row[j] *= w.z[j - a0];
      }
      if (corr != 1.0f) {
        float* HWY_RESTRICT o = w.acc + r * c.dvp;
        const auto vc = hn::Set(df, corr);
        for (int64_t x = 0; x < c.dvp; x += L) hn::StoreU(hn::Mul(hn::LoadU(df, o + x), vc), df, o + x);
      }
    }
#if TEFL_ATTN_BF16DOT
    if (c.bf16dot) {  // O += P V with P rounded to bf16
      RowsToBf16(w.s, bk, M, np, w.dsr);
      Dot<true>(c, w.dsr, bk / 2, ktp + c.dqkp / 2 * bk, size_t(c.dvp), w.acc, size_t(c.dvp), size_t(M),
                size_t(c.dvp), size_t(np / 2), 1.0f);
      continue;
    }
#endif
    Gemm<true>(w.s, bk, vrow, size_t(c.dvp), w.acc, size_t(c.dvp), size_t(M), size_t(c.dvp), size_t(np));
  }
  for (int64_t r = 0; r < n; ++r) {
    const int64_t i = i0 + r;
    const int64_t off = AttnGeometry::At(g.token_q(bi, i), h, g.hq, g.dv);
    const float l = hn::GetLane(hn::SumOfLanes(df, hn::Load(df, w.l + r * L)));
    if (l == 0.0f) {  // attends nothing (vanilla): o = 0, lse = -inf
      ZeroRow(c.t, c.out, off, g.dv);
      c.stats[g.stat_index(bi, h, i)] = -kInf;
      continue;
    }
    StoreRowV(w.acc + r * c.dvp, 1.0f / l, c.t, c.out, off, g.dv);
    c.stats[g.stat_index(bi, h, i)] = w.m[r] + std::log(l);
  }
}

// Packs the key tile (sequence, kv head, first key) of item `it` into kv_pack.
void PackKvItem(const AttnCtx& c, const Item& it, Scratch& w) {
  const AttnGeometry& g = c.g;
  const int64_t bi = it.b, hk = it.h, j0 = it.start;
  float* kt = const_cast<float*>(c.Tile(bi, hk, j0));
  float* vrow = kt + g.dqk * c.bk;
  const int64_t n = std::clamp(g.len_kv(bi) - j0, int64_t(0), c.bk);
#if TEFL_ATTN_BF16DOT
  if (c.bf16dot) {
    uint32_t* ktp = reinterpret_cast<uint32_t*>(kt);
    PackKvTileBf16(c, bi, hk, j0, n, ktp, ktp + c.dqkp / 2 * c.bk);
    return;
  }
#endif
  std::memset(kt, 0, size_t(c.tile_floats) * sizeof(float));
  auto tok = [&](int64_t r) { return g.token_kv(bi, j0 + r); };
  PackTransposed(c, c.k, tok, hk, g.hkv, g.dqk, n, kBk, w.tmp, kt);
  PackRows(c, c.v, tok, hk, g.hkv, g.dv, n, kBk, 1.0f, vrow, c.dvp);
}

void PackKvRange(const AttnCtx* c, int64_t begin, int64_t end) {
  Scratch w(*c);
  for (int64_t i = begin; i < end; ++i) PackKvItem(*c, c->items[i], w);
}

void FwdRange(const AttnCtx* c, int64_t begin, int64_t end) {
  Scratch w(*c);
#if TEFL_HAVE_AMX_TILES
  const AmxTileScope tiles(c->amx);
#endif
  for (int64_t i = begin; i < end; ++i) FwdItem(*c, c->items[i], w);
}

// ---- Backward -----------------------------------------------------------------------------
// D_i = d_o_i . o_i for the rows of one query block; packs their q (times
// scale) and d_o rows into qs_all / do_all.
void DRowsItem(const AttnCtx& c, const Item& it, Scratch& w) {
  const AttnGeometry& g = c.g;
  const int64_t bi = it.b, h = it.h, i0 = it.start;
  const int64_t n = std::clamp(g.len_q(bi) - i0, int64_t(0), kBq);
  const float scale = float(g.scale);
  for (int64_t r = 0; r < n; ++r) {
    const int64_t tok = g.token_q(bi, i0 + r), si = g.stat_index(bi, h, i0 + r);
    const int64_t off = AttnGeometry::At(tok, h, g.hq, g.dv);
    if (c.bf16dot) {  // D only (q / d_o go to the item's slot below)
      float* dos = w.tmp + kBk * kBq;
      LoadRow(c.o, c.t, off, g.dv, w.tmp);
      LoadRow(c.d_o, c.t, off, g.dv, dos);
      double d = 0.0;
      for (int64_t x = 0; x < g.dv; ++x) d += double(w.tmp[x]) * double(dos[x]);
      c.drow[si] = float(d);
      continue;
    }
    float* HWY_RESTRICT qs = c.qs_all + si * c.dqkp;
    float* HWY_RESTRICT dos = c.do_all + si * c.dvp;
    LoadRow(c.q, c.t, AttnGeometry::At(tok, h, g.hq, g.dqk), g.dqk, qs);
    for (int64_t x = 0; x < g.dqk; ++x) qs[x] *= scale;
    for (int64_t x = g.dqk; x < c.dqkp; ++x) qs[x] = 0.0f;
    LoadRow(c.o, c.t, off, g.dv, w.tmp);
    LoadRow(c.d_o, c.t, off, g.dv, dos);
    for (int64_t x = g.dv; x < c.dvp; ++x) dos[x] = 0.0f;
    double d = 0.0;
    for (int64_t x = 0; x < g.dv; ++x) d += double(w.tmp[x]) * double(dos[x]);
    c.drow[si] = float(d);
  }
}

void DRowsRange(const AttnCtx* c, int64_t begin, int64_t end) {
  Scratch w(*c);
  for (int64_t i = begin; i < end; ++i) {
    DRowsItem(*c, c->items[i], w);
    if (c->bf16dot) {
      const Item& it = c->items[i];
      const int64_t n = std::clamp(c->g.len_q(it.b) - it.start, int64_t(0), kBq);
      PackQSlotBf16(*c, it.b, it.h, it.start, n, c->q16 + i * c->slot_words);
    }
  }
}

// The elementwise step of a (query block, key tile) pair: from S (scores:
// score_mul times the tile in s, as in the forward) and dP (dO V^T) in
// place, P' = P z into s (when keep_p) and dS = P (dP z - D) into dp. Rows
// >= n and columns outside each row's range give 0.
HWY_INLINE void BwdElementwise(const AttnCtx& c, Scratch& w, int64_t bi, int64_t h, int64_t i0, int64_t n, int64_t M,
                               int64_t j0, int64_t nk, int64_t np, float score_mul) {
  const DF df;
  const auto vs = hn::Set(df, score_mul);
  const int64_t L = int64_t(hn::Lanes(df));
  for (int64_t r = 0; r < M; ++r) {
    float* HWY_RESTRICT s = w.s + r * kBk;
    float* HWY_RESTRICT dp = w.dp + r * kBk;
    const int64_t a = r < n ? std::max(w.lo[r] - j0, int64_t(0)) : 0;
    const int64_t e = r < n ? std::min(w.hi[r] - j0, nk) : 0;
    if (a >= e) {
      std::memset(s, 0, size_t(np) * sizeof(float));
      std::memset(dp, 0, size_t(np) * sizeof(float));
      continue;
    }
    MaskOutside(s, a, e, np);
    const auto vl = hn::Set(df, w.lse[r]), vd = hn::Set(df, w.drow[r]);
    if (c.g.dropout) {
      for (int64_t j = 0; j < np; ++j) w.z[j] = 0.0f;
      DropFactors(c, bi, h, i0 + r, j0 + a, e - a, w.z + a);
      for (int64_t j = 0; j < np; j += L) {
        const auto p = ExpNaN(df, hn::MulSub(hn::LoadU(df, s + j), vs, vl));
        const auto z = hn::LoadU(df, w.z + j);
        hn::StoreU(hn::Mul(p, hn::MulSub(hn::LoadU(df, dp + j), z, vd)), df, dp + j);
        hn::StoreU(hn::Mul(p, z), df, s + j);
      }
    } else {
      for (int64_t j = 0; j < np; j += L) {
        const auto p = ExpNaN(df, hn::MulSub(hn::LoadU(df, s + j), vs, vl));
        hn::StoreU(hn::Mul(p, hn::Sub(hn::LoadU(df, dp + j), vd)), df, dp + j);
        hn::StoreU(p, df, s + j);
      }
    }
  }
}

// Loads the key ranges, lse and D of query rows [i0, i0 + n); returns
// whether any row attends a key in [j0, j1).
HWY_INLINE bool LoadRowState(const AttnCtx& c, Scratch& w, int64_t bi, int64_t h, int64_t i0, int64_t n, int64_t j0,
                             int64_t j1) {
  const AttnGeometry& g = c.g;
  bool any = false;
  for (int64_t r = 0; r < n; ++r) {
    g.KeyRange(bi, i0 + r, &w.lo[r], &w.hi[r]);
    const int64_t si = g.stat_index(bi, h, i0 + r);
    w.lse[r] = c.lse[si];
    w.drow[r] = c.drow[si];
    any |= w.lo[r] < w.hi[r] && w.lo[r] < j1 && w.hi[r] > j0;
  }
  return any;
}

#if TEFL_ATTN_BF16DOT
// BwdKvItem on vdpbf16ps (bf16 inputs, see "bf16 dot products"): S = scale
// Q K^T and dP = dO V^T from the exact bf16 operands, the elementwise step
// in fp32, then P' and dS rounded to bf16 for dQ += dS K, dV^T += dO^T P'
// and dK^T += Q^T dS (the transposes accumulate [d x keys], so each product
// takes the row-pair words the elementwise step writes).
void BwdKvItemBf16(const AttnCtx& c, Scratch& w, int64_t bi, int64_t hk, int64_t j0, int64_t nk, float* dq_partial) {
  const AttnGeometry& g = c.g;
  const int64_t np = RoundUp(nk, int64_t(kDotCols)), dqkp = c.dqkp, dvp = c.dvp;
  PackKBlockBf16(c, bi, hk, j0, nk, w.ktp, w.vtp, w.kpair);
  float* dkt = w.acc;   // [dqkp x kBk]
  float* dvt = w.acc2;  // [dvp x kBk]
  std::memset(dkt, 0, size_t(dqkp * kBk) * sizeof(float));
  std::memset(dvt, 0, size_t(dvp * kBk) * sizeof(float));
  const float scale = float(g.scale);
  const int64_t group = g.hq / g.hkv, lq = g.len_q(bi), nblk = (g.rows_q(bi) + kBq - 1) / kBq;
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < lq; i0 += kBq) {
      const int64_t n = std::min(kBq, lq - i0), M = RoundUp(n, 4);
      if (!LoadRowState(c, w, bi, h, i0, n, j0, j0 + nk)) continue;
      const uint32_t* qrow = c.q16 + (c.first_qblk[bi] + h * nblk + i0 / kBq) * c.slot_words;
      const uint32_t* qpair = qrow + kBq * dqkp / 2;
      const uint32_t* orow = qpair + kBq / 2 * dqkp;
      const uint32_t* opair = orow + kBq * dvp / 2;
      float* dq_rows = dq_partial + g.stat_index(bi, h, i0) * dqkp;
      // The scale folded into exp's FMA, as in the forward (a positive scale).
      Dot<false>(c, qrow, size_t(dqkp / 2), w.ktp, kBk, w.s, kBk, size_t(M), size_t(np), size_t(dqkp / 2),
                 scale > 0.0f ? 1.0f : scale);
      Dot<false>(c, orow, size_t(dvp / 2), w.vtp, kBk, w.dp, kBk, size_t(M), size_t(np), size_t(dvp / 2), 1.0f);
      BwdElementwise(c, w, bi, h, i0, n, M, j0, nk, np, scale > 0.0f ? scale : 1.0f);
      TileToBf16(w.s, w.dp, M, np, w.pp, w.dsp, w.dsr);
      // dQ / scale += dS K for these rows (into the chunk's partial).
      if (n == M) {
        Dot<true>(c, w.dsr, kBk / 2, w.kpair, size_t(dqkp), dq_rows, size_t(dqkp), size_t(M), size_t(dqkp),
                  size_t(np / 2), 1.0f);
      } else {
        Dot<false>(c, w.dsr, kBk / 2, w.kpair, size_t(dqkp), w.acc3, size_t(dqkp), size_t(M), size_t(dqkp),
                   size_t(np / 2), 1.0f);
        for (int64_t x = 0; x < n * dqkp; ++x) dq_rows[x] += w.acc3[x];
      }
      Dot<true>(c, opair, size_t(kBq / 2), w.pp, kBk, dvt, kBk, size_t(dvp), size_t(np), size_t(M / 2), 1.0f);
      Dot<true>(c, qpair, size_t(kBq / 2), w.dsp, kBk, dkt, kBk, size_t(dqkp), size_t(np), size_t(M / 2), 1.0f);
    }
  }
  float* row = w.tmp;
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t t = g.token_kv(bi, j0 + r);
    for (int64_t x = 0; x < g.dqk; ++x) row[x] = dkt[x * kBk + r];
    StoreRow(row, scale, c.t, c.dk, AttnGeometry::At(t, hk, g.hkv, g.dqk), g.dqk);
    for (int64_t x = 0; x < g.dv; ++x) row[x] = dvt[x * kBk + r];
    StoreRow(row, 1.0f, c.t, c.dv, AttnGeometry::At(t, hk, g.hkv, g.dv), g.dv);
  }
}
#endif

// dK, dV of one (sequence, kv head), and this block's
// contribution to dQ / scale added into `dq_partial` (fp32, q's layout).
void BwdKvItem(const AttnCtx& c, const Item& it, Scratch& w, float* dq_partial) {
  const int64_t G = int64_t(Group());
  const AttnGeometry& g = c.g;
  const int64_t bi = it.b, hk = it.h, j0 = it.start;
  const int64_t j1 = std::min(j0 + kBk, g.rows_kv(bi));
  const int64_t nk = std::clamp(g.len_kv(bi) - j0, int64_t(0), j1 - j0);
  for (int64_t j = j0 + nk; j < j1; ++j) {  // padded keys
    ZeroRow(c.t, c.dk, AttnGeometry::At(g.token_kv(bi, j), hk, g.hkv, g.dqk), g.dqk);
    ZeroRow(c.t, c.dv, AttnGeometry::At(g.token_kv(bi, j), hk, g.hkv, g.dv), g.dv);
  }
  if (nk == 0) return;
#if TEFL_ATTN_BF16DOT
  if (c.bf16dot) return BwdKvItemBf16(c, w, bi, hk, j0, nk, dq_partial);
#endif
  const int64_t np = RoundUp(nk, G);
  auto tok = [&](int64_t r) { return g.token_kv(bi, j0 + r); };
  PackTransposed(c, c.k, tok, hk, g.hkv, g.dqk, nk, np, w.tmp, w.kt);
  PackTransposed(c, c.v, tok, hk, g.hkv, g.dv, nk, np, w.tmp, w.vt);
  PackRows(c, c.k, tok, hk, g.hkv, g.dqk, nk, np, 1.0f, w.krow, c.dqkp);
  float* dk_acc = w.acc;   // [np x dqkp]
  float* dv_acc = w.acc2;  // [np x dvp]
  std::memset(dk_acc, 0, size_t(np * c.dqkp) * sizeof(float));
  std::memset(dv_acc, 0, size_t(np * c.dvp) * sizeof(float));
  const int64_t group = g.hq / g.hkv, lq = g.len_q(bi);
  for (int64_t h = hk * group; h < (hk + 1) * group; ++h) {
    for (int64_t i0 = 0; i0 < lq; i0 += kBq) {
      const int64_t n = std::min(kBq, lq - i0), M = RoundUp(n, 4);
      if (!LoadRowState(c, w, bi, h, i0, n, j0, j0 + nk)) continue;
      // The packed q / d_o rows of this block; a block whose row count is
      // not a multiple of 4 is copied and zero-padded (the micro-kernel's
      // 4 rows must not read another head's rows).
      const int64_t si = g.stat_index(bi, h, i0);
      const float* qs = c.qs_all + si * c.dqkp;
      const float* dos = c.do_all + si * c.dvp;
      float* dq_rows = dq_partial + si * c.dqkp;
      if (n != M) {
        std::memcpy(w.qs, qs, size_t(n * c.dqkp) * sizeof(float));
        std::memset(w.qs + n * c.dqkp, 0, size_t((M - n) * c.dqkp) * sizeof(float));
        std::memcpy(w.dos, dos, size_t(n * c.dvp) * sizeof(float));
        std::memset(w.dos + n * c.dvp, 0, size_t((M - n) * c.dvp) * sizeof(float));
        qs = w.qs;
        dos = w.dos;
      }
      Gemm<false>(qs, size_t(c.dqkp), w.kt, kBk, w.s, kBk, size_t(M), size_t(np), size_t(g.dqk));
      Gemm<false>(dos, size_t(c.dvp), w.vt, kBk, w.dp, kBk, size_t(M), size_t(np), size_t(g.dv));
      BwdElementwise(c, w, bi, h, i0, n, M, j0, nk, np, 1.0f);
      // dQ / scale += dS K for these rows (into the chunk's partial).
      if (n == M) {
        Gemm<true>(w.dp, kBk, w.krow, size_t(c.dqkp), dq_rows, size_t(c.dqkp), size_t(M), size_t(c.dqkp), size_t(np));
      } else {
        Gemm<false>(w.dp, kBk, w.krow, size_t(c.dqkp), w.acc3, size_t(c.dqkp), size_t(M), size_t(c.dqkp), size_t(np));
        for (int64_t x = 0; x < n * c.dqkp; ++x) dq_rows[x] += w.acc3[x];
      }
      // dV += P'^T dO and dK += dS^T Qs (Qs carries the scale).
      Gemm<true, true>(w.s, kBk, dos, size_t(c.dvp), dv_acc, size_t(c.dvp), size_t(np), size_t(c.dvp), size_t(M));
      Gemm<true, true>(w.dp, kBk, qs, size_t(c.dqkp), dk_acc, size_t(c.dqkp), size_t(np), size_t(c.dqkp), size_t(M));
    }
  }
  for (int64_t r = 0; r < nk; ++r) {
    const int64_t t = g.token_kv(bi, j0 + r);
    StoreRow(dk_acc + r * c.dqkp, 1.0f, c.t, c.dk, AttnGeometry::At(t, hk, g.hkv, g.dqk), g.dqk);
    StoreRow(dv_acc + r * c.dvp, 1.0f, c.t, c.dv, AttnGeometry::At(t, hk, g.hkv, g.dv), g.dv);
  }
}

// Chunk `chunk` of `chunks`: items chunk, chunk + chunks, ... (interleaved,
// so causal work balances), dQ contributions into this chunk's partial.
void BwdKvChunk(const AttnCtx* c, int64_t chunk, int64_t chunks, int64_t items, float* dq_partial) {
  Scratch w(*c);
#if TEFL_HAVE_AMX_TILES
  const AmxTileScope tiles(c->amx);
#endif
  for (int64_t i = chunk; i < items; i += chunks) BwdKvItem(*c, c->items[i], w, dq_partial);
}

size_t ColumnGroup() { return Group(); }

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tefl::backends {
namespace {

HWY_EXPORT(FwdRange);
HWY_EXPORT(PackKvRange);
HWY_EXPORT(DRowsRange);
HWY_EXPORT(BwdKvChunk);
HWY_EXPORT(ColumnGroup);

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "attention", code, what);
}

// Runs kFn over the items; an exception in a worker marks the call failed.
template <void (*kFn)(const AttnCtx*, int64_t, int64_t)>
void Body(void* ctx, int64_t begin, int64_t end) {
  auto* c = static_cast<AttnCtx*>(ctx);
  try {
    kFn(c, begin, end);
  } catch (...) {
    c->failed.store(1);
  }
}

void FwdDispatch(const AttnCtx* c, int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(FwdRange)(c, b, e); }
void PackKvDispatch(const AttnCtx* c, int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(PackKvRange)(c, b, e); }
void DRowsDispatch(const AttnCtx* c, int64_t b, int64_t e) { HWY_DYNAMIC_DISPATCH(DRowsRange)(c, b, e); }

// Blocks of `block` rows of every (sequence, head): queries (kv = false) or
// keys, in (sequence, head, block) order, or with heads_inner in (sequence,
// block, head) order. The forward's k/v packing (every item the same work)
// takes the latter: a token's rows of all heads share one page in bshd/sbhd,
// so the items of one block reuse its pages instead of walking the whole
// sequence's pages once per head.
std::vector<Item> Items(const AttnGeometry& g, int64_t heads, bool kv, int64_t block, bool heads_inner = false) {
  std::vector<Item> items;
  for (int64_t bi = 0; bi < g.b; ++bi) {
    const int64_t rows = kv ? g.rows_kv(bi) : g.rows_q(bi);
    const int64_t blocks = (rows + block - 1) / block;
    for (int64_t u = 0; u < heads * blocks; ++u) {
      const int64_t h = heads_inner ? u % heads : u / blocks, blk = heads_inner ? u / heads : u % blocks;
      items.push_back(Item{bi, h, blk * block});
    }
  }
  return items;
}

#if TEFL_ATTN_BF16DOT
// Whether any value of the bf16 tensors is subnormal, scanned in pieces on
// the host pool (the scan of q/k/v(/d_o) was ~2-3 % of a bf16 forward on one
// thread).
struct SubnormalScan {
  static constexpr int64_t kPiece = int64_t(1) << 16;  // elements
  const uint16_t* p[4];
  int64_t n[4], first[5];  // first[t]: the first piece of tensor t
  std::atomic<bool> any{false};
};
void SubnormalScanBody(void* ctx, int64_t begin, int64_t end) {
  auto* s = static_cast<SubnormalScan*>(ctx);
  for (int64_t i = begin; i < end && !s->any.load(std::memory_order_relaxed); ++i) {
    int t = 0;
    while (i >= s->first[t + 1]) ++t;
    const int64_t off = (i - s->first[t]) * SubnormalScan::kPiece;
    if (AnySubnormalBf16(s->p[t] + off, std::min(SubnormalScan::kPiece, s->n[t] - off)))
      s->any.store(true, std::memory_order_relaxed);
  }
}
bool AnySubnormalBf16(const tefl_call_frame* f, std::initializer_list<const DLTensor*> tensors) {
  SubnormalScan s;
  int t = 0;
  s.first[0] = 0;
  for (const DLTensor* x : tensors) {
    s.p[t] = static_cast<const uint16_t*>(DataPtr(x));
    s.n[t] = NumElements(x);
    s.first[t + 1] = s.first[t] + (s.n[t] + SubnormalScan::kPiece - 1) / SubnormalScan::kPiece;
    ++t;
  }
  for (int u = t; u < 4; ++u) s.first[u + 1] = s.first[u];
  if (s.first[t] > 0) f->host->parallel_for(s.first[t], 1, SubnormalScanBody, &s);
  return s.any.load();
}

// Whether a call on the bf16 dot path runs its products on AMX tiles (and
// counts it: tests check that the path ran).
bool UseAmx(const AttnCtx& c) {
  const bool on = c.bf16dot && PortablePathOn(PortablePath::kAttnAmx);
  if (on) CountPortablePathRun(PortablePath::kAttnAmx);
  return on;
}
#endif

void InitCtx(AttnCtx& c, const AttnGeometry& g, DType t) {
  c.g = g;
  c.t = t;
  const int64_t grp = int64_t(HWY_DYNAMIC_DISPATCH(ColumnGroup)());
  c.dqkp = (g.dqk + grp - 1) / grp * grp;
  c.dvp = (g.dv + grp - 1) / grp * grp;
  c.threshold16 = DropoutThreshold16(g.p);
  c.keep_scale = g.dropout ? float(1.0 / (1.0 - double(g.p))) : 1.0f;
}

struct BwdCtx {
  AttnCtx* c;
  int64_t chunks, items, partial_floats;
  float* partials;  // chunks x partial_floats
};
void BwdChunkBody(void* ctx, int64_t begin, int64_t end) {
  auto* b = static_cast<BwdCtx*>(ctx);
  for (int64_t chunk = begin; chunk < end; ++chunk) {
    try {
      float* partial = b->partials + chunk * b->partial_floats;
      std::memset(partial, 0, size_t(b->partial_floats) * sizeof(float));
      HWY_DYNAMIC_DISPATCH(BwdKvChunk)(b->c, chunk, b->chunks, b->items, partial);
    } catch (...) {
      b->c->failed.store(1);
    }
  }
}

// dq rows of the query items: scale * the chunk partials summed in chunk
// order (padded rows: 0).
struct ReduceCtx {
  AttnCtx* c;
  int64_t chunks, partial_floats;
  const float* partials;
  const Item* items;
};
void ReduceBody(void* ctx, int64_t begin, int64_t end) {
  const auto* r = static_cast<const ReduceCtx*>(ctx);
  const AttnCtx& c = *r->c;
  const AttnGeometry& g = c.g;
  std::vector<float> buf(size_t(c.dqkp));
  for (int64_t it = begin; it < end; ++it) {
    const Item& item = r->items[it];
    const int64_t i1 = std::min(item.start + kBq, g.rows_q(item.b));
    for (int64_t i = item.start; i < i1; ++i) {
      const int64_t off = AttnGeometry::At(g.token_q(item.b, i), item.h, g.hq, g.dqk);
      if (i >= g.len_q(item.b)) {
        ZeroRow(c.t, c.dq, off, g.dqk);
        continue;
      }
      const int64_t row = g.stat_index(item.b, item.h, i) * c.dqkp;
      std::fill(buf.begin(), buf.end(), 0.0f);
      for (int64_t ch = 0; ch < r->chunks; ++ch) {
        const float* p = r->partials + ch * r->partial_floats + row;
        for (int64_t x = 0; x < g.dqk; ++x) buf[size_t(x)] += p[x];
      }
      StoreRow(buf.data(), float(g.scale), c.t, c.dq, off, g.dqk);
    }
  }
}

// ---- Call-level buffers kept between calls --------------------------------------------------
// The packed k/v tiles (forward), the packed q/d_o rows or slots and the dq
// partials (backward) live in buffers kept by the calling thread between
// calls, as gemm.cpp's workspace: a fresh buffer costs its page faults on
// every call (~1-1.5 us per 4 KiB page: ~5 ms for the 16 MiB of packed k/v
// at b 2, h 16, s 2048, d 128, ~5 % of that forward). They only grow, their
// contents are unspecified (every kernel writes what it reads); a call that
// leaves more than kKeptBufferBytes (kernel_support.h) in them frees them
// on return.
template <class T>
class KeptBuffer {
 public:
  // At least n elements, 64-byte aligned; nullptr when out of memory.
  T* Get(size_t n) {
    n = std::max<size_t>(n, 1);
    if (n > cap_) {
      p_.reset();  // the old buffer first: never both at once
      p_ = hwy::AllocateAligned<T>(n);
      cap_ = p_ ? n : 0;
    }
    return p_.get();
  }
  size_t Bytes() const { return cap_ * sizeof(T); }

 private:
  hwy::AlignedFreeUniquePtr<T[]> p_;
  size_t cap_ = 0;
};
struct AttnWorkspace {
  KeptBuffer<float> kv_pack, qs_all, do_all, partials;
  KeptBuffer<uint32_t> q16;
  size_t Bytes() const {
    return kv_pack.Bytes() + qs_all.Bytes() + do_all.Bytes() + partials.Bytes() + q16.Bytes();
  }
};

tefl_status* AttnFwd(const tefl_call_frame* f, void*) {
  try {
    const auto& attrs = *static_cast<const tefl_attention_attrs*>(f->attrs);
    const DLTensor* const* in = f->inputs;
    const DType t = DTypeOf(in[0]->dtype);
    if (!IsFloatType(t)) return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    AttnCtx c;
    InitCtx(c, MakeAttnGeometry(in[0], in[1], in[2], in[3], in[4], attrs), t);
    c.q = DataPtr(in[0]);
    c.k = DataPtr(in[1]);
    c.v = DataPtr(in[2]);
    c.alpha = in[5] ? static_cast<const float*>(DataPtr(in[5])) : nullptr;
    c.out = DataPtr(f->outputs[0]);
    c.stats = static_cast<float*>(DataPtr(f->outputs[1]));
#if TEFL_ATTN_BF16DOT
    if (t == DType::kBF16 && CpuHasBf16Dot() && c.dqkp % int64_t(kDotCols) == 0 && c.dvp % int64_t(kDotCols) == 0) {
      c.bf16dot = PortablePathOn(PortablePath::kAttnBf16Dot) && !AnySubnormalBf16(f, {in[0], in[1], in[2]});
      c.amx = UseAmx(c);
    }
#endif
    c.bk = c.bf16dot ? kBkDot : kBk;
    // k and v packed to tiles of bk keys once (O(sk) memory, shared by every
    // query block): fp32, or on the bf16 dot path words: ktp [dqkp / 2 x bk],
    // vpair [bk / 2 x dvp].
    std::vector<int64_t> first_tile(size_t(c.g.b) + 1, 0);
    for (int64_t bi = 0; bi < c.g.b; ++bi)
      first_tile[size_t(bi) + 1] = first_tile[size_t(bi)] + (c.g.rows_kv(bi) + c.bk - 1) / c.bk;
    c.first_tile = first_tile.data();
    c.tile_floats = c.bf16dot ? (c.dqkp / 2 * c.bk + c.bk / 2 * c.dvp + 15) / 16 * 16
                              : (c.g.dqk * c.bk + c.bk * c.dvp + 15) / 16 * 16;
    const int64_t tiles = first_tile.back() * c.g.hkv;
    ThreadKept<AttnWorkspace> ws;  // this thread's buffers (kernel_support.h)
    c.kv_pack = ws->kv_pack.Get(size_t(tiles * c.tile_floats));
    if (!c.kv_pack) return Status(f, TEFL_INTERNAL, "out of memory for the packed k/v tiles");
    const std::vector<Item> kv_items = Items(c.g, c.g.hkv, true, c.bk, /*heads_inner=*/true);
    if (!kv_items.empty()) {
      c.items = kv_items.data();
      f->host->parallel_for(int64_t(kv_items.size()), 1, Body<PackKvDispatch>, &c);
    }
    const std::vector<Item> items = Items(c.g, c.g.hq, false, kBq);
    c.items = items.data();
    if (!items.empty() && !c.failed.load()) f->host->parallel_for(int64_t(items.size()), 1, Body<FwdDispatch>, &c);
    if (c.failed.load()) return Status(f, TEFL_INTERNAL, "out of memory for the attention scratch");
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* AttnBwd(const tefl_call_frame* f, void*) {
  try {
    const auto& attrs = *static_cast<const tefl_attention_attrs*>(f->attrs);
    const DLTensor* const* in = f->inputs;
    DLTensor* const* out = f->outputs;
    const DType t = DTypeOf(in[0]->dtype);
    if (!IsFloatType(t)) return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    AttnCtx c;
    InitCtx(c, MakeAttnGeometry(in[0], in[1], in[2], in[6], in[7], attrs), t);
    c.q = DataPtr(in[0]);
    c.k = DataPtr(in[1]);
    c.v = DataPtr(in[2]);
    c.o = DataPtr(in[3]);
    c.d_o = DataPtr(in[4]);
    c.lse = static_cast<const float*>(DataPtr(in[5]));
    c.alpha = in[8] ? static_cast<const float*>(DataPtr(in[8])) : nullptr;
    c.dq = DataPtr(out[0]);
    c.dk = DataPtr(out[1]);
    c.dv = DataPtr(out[2]);
    const std::vector<Item> q_items = Items(c.g, c.g.hq, false, kBq);
    // Per query row (stats index): D, and q (times scale) and d_o packed to
    // fp32; on the bf16 dot path q / d_o packed to bf16 words per query item.
    const int64_t rows = NumElements(in[5]);
    std::vector<float> drow(size_t(rows), 0.0f);
    c.drow = drow.data();
    std::vector<int64_t> first_qblk(size_t(c.g.b) + 1, 0);
    ThreadKept<AttnWorkspace> ws;  // this thread's buffers (kernel_support.h)
#if TEFL_ATTN_BF16DOT
    if (t == DType::kBF16 && CpuHasBf16Dot() && c.dqkp % int64_t(kDotCols) == 0 && c.dvp % int64_t(kDotCols) == 0) {
      c.bf16dot = PortablePathOn(PortablePath::kAttnBf16Dot) && !AnySubnormalBf16(f, {in[0], in[1], in[2], in[4]});
      c.amx = UseAmx(c);
    }
#endif
    const int64_t rows_packed = c.bf16dot ? 1 : std::max<int64_t>(rows, 1);
    c.qs_all = ws->qs_all.Get(size_t(rows_packed * c.dqkp));
    c.do_all = ws->do_all.Get(size_t(rows_packed * c.dvp));
    if (!c.qs_all || !c.do_all) return Status(f, TEFL_INTERNAL, "out of memory for the packed q/d_o rows");
    if (c.bf16dot) {
      for (int64_t bi = 0; bi < c.g.b; ++bi)
        first_qblk[size_t(bi) + 1] = first_qblk[size_t(bi)] + c.g.hq * ((c.g.rows_q(bi) + kBq - 1) / kBq);
      c.first_qblk = first_qblk.data();
      c.slot_words = SlotWords(c.dqkp, c.dvp);
      c.q16 = ws->q16.Get(size_t(int64_t(q_items.size()) * c.slot_words));
      if (!c.q16) return Status(f, TEFL_INTERNAL, "out of memory for the packed q/d_o rows");
    }

    const std::vector<Item> kv_items = Items(c.g, c.g.hkv, true, kBk);
    if (!q_items.empty()) {
      c.items = q_items.data();
      f->host->parallel_for(int64_t(q_items.size()), 1, Body<DRowsDispatch>, &c);
    }
    // dK, dV and per-chunk dQ / scale partials (fp32, one row of dqkp per
    // stats index), then dq = scale * the partials summed in chunk order.
    const int64_t chunks =
        kv_items.empty() ? 0 : std::clamp<int64_t>(f->host->num_threads(), 1, int64_t(kv_items.size()));
    const int64_t partial_floats = rows * c.dqkp;
    float* partials = ws->partials.Get(size_t(chunks * partial_floats));
    if (!partials) return Status(f, TEFL_INTERNAL, "out of memory for the dq partials");
    BwdCtx bc{&c, chunks, int64_t(kv_items.size()), partial_floats, partials};
    if (chunks > 0 && !c.failed.load()) {
      c.items = kv_items.data();
      f->host->parallel_for(chunks, 1, BwdChunkBody, &bc);
    }
    ReduceCtx rc{&c, chunks, partial_floats, partials, q_items.data()};
    if (!q_items.empty()) f->host->parallel_for(int64_t(q_items.size()), 1, ReduceBody, &rc);
    if (c.failed.load()) return Status(f, TEFL_INTERNAL, "out of memory for the attention scratch");

    // d_alpha[h] = -sum_i exp(alpha[h] - lse_i) D_i, in double, in row order
    // (0 without a learnable alpha).
    if (out[3] != nullptr) {
      const AttnGeometry& g = c.g;
      float* da = static_cast<float*>(DataPtr(out[3]));
      for (int64_t h = 0; h < g.hq; ++h) {
        double sum = 0.0;
        for (int64_t bi = 0; bi < g.b; ++bi)
          for (int64_t i = 0; i < g.len_q(bi); ++i) {
            const int64_t si = g.stat_index(bi, h, i);
            if (c.alpha) sum -= std::exp(double(c.alpha[h]) - double(c.lse[si])) * double(drow[size_t(si)]);
          }
        da[h] = float(sum);
      }
    }
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

}  // namespace

tefl_status* RegisterPortableAttention(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {{"fused_attn_fwd", AttnFwd}, {"fused_attn_bwd", AttnBwd}};
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
