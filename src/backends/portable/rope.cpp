// default.portable RoPE kernels: fused_rope_forward/backward and
// fused_qkv_rope_forward/backward (maths in spec/ops.md, "RoPE";
// TransformerEngine's fused_rope.cu).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); rows (tokens:
// (s, b) pairs or thd tokens) are split into fixed blocks spread over the
// host thread pool.
//
// Per block and per position, the angles' cos and sin are computed once into
// an fp32 table of d2 entries (Highway's vector Sin/Cos, 3 ULP, on |angle| <=
// 39000; std::sin/cos in double beyond that or for inf/NaN), folded with the
// rotation's signs:  y[i] = x[i] * cs[i] + x[partner(i)] * sn[i], where
//   forward   cs = cos f, sn[i] = -sin f[i] (i < d2/2, or even i when
//             interleaved), +sin f[i] otherwise;
//   backward  cs = cos f, sn[i] = +sin f[partner(i)] (i < d2/2 / even i),
//             -sin f[partner(i)] otherwise (the transpose);
// partner(i) = i +- d2/2 (rotate-half) or i ^ 1 (interleaved). Consecutive
// rows with the same position (sbhd: the b rows of one s) reuse the table.
// Channels [d2, d) are copied bit for bit.
//
// Numerics: loads widen exactly, the two products and the sum are fp32 (one
// FMA), one rounding to the output dtype (round to nearest even, NaN stays
// NaN). Head vectors whose channel stride is 1 in both tensors take the
// vector path; any other strides take a scalar path with the same maths.
//
// Host contract (validated before the call, catalogue_rope.cpp): CPU
// tensors, element-aligned, any strides, output dtype == input dtype,
// outputs without self-overlap and not overlapping inputs, cu_seqlens well
// formed, every position a row of freqs.
#include <hwy/cache_control.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <type_traits>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "core/rope_positions.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_ROPE_SHARED_
#define TEFL_BACKENDS_PORTABLE_ROPE_SHARED_
namespace tefl::backends {
namespace {

// One strided head set read from `in` and written to `out`: per row,
// groups x heads head vectors of d channels.
struct RopeJob {
  const char* in;  // element 0 (bytes)
  char* out;
  int64_t in_ss, in_sb, out_ss, out_sb;  // element strides of the s (thd: t) and b dims
  int64_t groups, heads;                 // head groups x heads per group
  int64_t in_sg, in_sj, out_sg, out_sj;  // element strides of a group and of a head in it
  int64_t in_sd, out_sd;                 // element strides of a channel
  int table;                             // cos/sin table 0 or 1; -1: copy
};

struct RopePlan {
  DType dt;
  bool thd, b_major, interleaved, backward, stream;
  int64_t s, b, rows, d, d2;
  int32_t cp_size, cp_rank;
  const int64_t* start;      // [b] offsets, NULL: none
  const int64_t* seq_begin;  // thd: [nseq + 1] first local token of each sequence
  int64_t nseq;
  const float* freqs[2];
  int64_t f_row[2], f_col[2];  // element strides of freqs rows and channels
  RopeJob jobs[3];
  int njobs;
  int ntables;
};

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_ROPE_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/rope.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/simd_io-inl.h"
#include "hwy/contrib/math/math-inl.h"

// ---- Per-target kernels ------------------------------------------------------
HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Where Highway's Sin/Cos are specified (3 ULP).
constexpr float kMaxVectorAngle = 39000.0f;

// cos and sin of ang[0, m) into c and s: Highway's Sin/Cos on vectors whose
// angles are all within kMaxVectorAngle, double std::cos/sin otherwise
// (and for inf/NaN and the tail).
HWY_INLINE void CosSin(const float* HWY_RESTRICT ang, size_t m, float* HWY_RESTRICT c, float* HWY_RESTRICT s) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  const auto limit = hn::Set(df, kMaxVectorAngle);
  size_t i = 0;
  for (; i + n <= m; i += n) {
    const auto a = hn::LoadU(df, ang + i);
    if (hn::AllTrue(df, hn::Le(hn::Abs(a), limit))) {
      hn::StoreU(hn::Cos(df, a), df, c + i);
      hn::StoreU(hn::Sin(df, a), df, s + i);
    } else {
      for (size_t j = i; j < i + n; ++j) {
        c[j] = float(std::cos(double(ang[j])));
        s[j] = float(std::sin(double(ang[j])));
      }
    }
  }
  for (; i < m; ++i) {
    c[i] = float(std::cos(double(ang[i])));
    s[i] = float(std::sin(double(ang[i])));
  }
}

// cs = cos f, sn = the signed, partnered sin (see the file comment) for the
// angles of one position.
HWY_INLINE void FillTable(const RopePlan& p, int k, int64_t pos, float* HWY_RESTRICT ang, float* HWY_RESTRICT cs,
                          float* HWY_RESTRICT sn) {
  const size_t d2 = size_t(p.d2), half = d2 / 2;
  const float* row = p.freqs[k] + pos * p.f_row[k];
  const int64_t col = p.f_col[k];
  if (col == 1) {
    std::memcpy(ang, row, d2 * sizeof(float));
  } else {
    for (size_t i = 0; i < d2; ++i) ang[i] = row[int64_t(i) * col];
  }
  if (p.interleaved) {
    CosSin(ang, d2, cs, sn);
    for (size_t j = 0; j < d2; j += 2) {
      const float s0 = sn[j], s1 = sn[j + 1];
      if (p.backward) {
        sn[j] = s1;
        sn[j + 1] = -s0;
      } else {
        sn[j] = -s0;
      }
    }
    return;
  }
  // Rotate-half. TE's angles are cat(freqs, freqs): when the halves are
  // bitwise equal their cos/sin are too, computed once.
  const bool dup = std::memcmp(ang, ang + half, half * sizeof(float)) == 0;
  if (dup) {
    CosSin(ang, half, cs, sn);
    std::memcpy(cs + half, cs, half * sizeof(float));
    std::memcpy(sn + half, sn, half * sizeof(float));
  } else {
    CosSin(ang, d2, cs, sn);
  }
  // forward: sn[j] = -sin f[j] (j < half); backward: (sn[j], sn[j + half]) =
  // (sin f[j + half], -sin f[j]).
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  size_t j = 0;
  if (p.backward) {
    for (; j + n <= half; j += n) {
      const auto lo = hn::LoadU(df, sn + j), hi = hn::LoadU(df, sn + half + j);
      hn::StoreU(hi, df, sn + j);
      hn::StoreU(hn::Neg(lo), df, sn + half + j);
    }
    for (; j < half; ++j) {
      const float lo = sn[j];
      sn[j] = sn[j + half];
      sn[j + half] = -lo;
    }
  } else {
    for (; j + n <= half; j += n) hn::StoreU(hn::Neg(hn::LoadU(df, sn + j)), df, sn + j);
    for (; j < half; ++j) sn[j] = -sn[j];
  }
}

// ---- One head vector ------------------------------------------------------------
// Scalar, any strides.
template <class T>
HWY_INLINE void HeadStrided(const T* x, int64_t xs, T* y, int64_t ys, const float* cs, const float* sn, int64_t d,
                            int64_t d2, bool interleaved) {
  const int64_t half = d2 / 2;
  for (int64_t i = 0; i < d2; ++i) {
    const int64_t j = interleaved ? (i ^ 1) : (i < half ? i + half : i - half);
    const float v = std::fma(ScalarLoad(x + j * xs), sn[i], ScalarLoad(x + i * xs) * cs[i]);
    ScalarStore(v, y + i * ys);
  }
  for (int64_t i = d2; i < d; ++i) std::memcpy(y + i * ys, x + i * xs, sizeof(T));
}

// Rotate-half on channels [0, d2): y[i] = x[i] cs[i] + x[i + half] sn[i]
// and y[i + half] = x[i + half] cs[i + half] + x[i] sn[i + half], both
// halves from one load of each (channel stride 1).
template <class T, class Store>
HWY_INLINE void RotateHalf(const T* HWY_RESTRICT x, T* HWY_RESTRICT y, const float* HWY_RESTRICT cs,
                           const float* HWY_RESTRICT sn, size_t half, Store store) {
  const hn::ScalableTag<float> df;
  const size_t n = hn::Lanes(df);
  const T* HWY_RESTRICT xh = x + half;
  T* HWY_RESTRICT yh = y + half;
  const float* HWY_RESTRICT csh = cs + half;
  const float* HWY_RESTRICT snh = sn + half;
  size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<T, bfloat16_t>) {  // two fp32 vectors -> one full vector of bf16
    const hn::Repartition<uint16_t, decltype(df)> du16;
    for (; i + 2 * n <= half; i += 2 * n) {
      const auto a0 = LoadF(df, x + i), a1 = LoadF(df, x + i + n);
      const auto b0 = LoadF(df, xh + i), b1 = LoadF(df, xh + i + n);
      const auto lo0 = hn::MulAdd(b0, hn::LoadU(df, sn + i), hn::Mul(a0, hn::LoadU(df, cs + i)));
      const auto lo1 = hn::MulAdd(b1, hn::LoadU(df, sn + i + n), hn::Mul(a1, hn::LoadU(df, cs + i + n)));
      const auto hi0 = hn::MulAdd(a0, hn::LoadU(df, snh + i), hn::Mul(b0, hn::LoadU(df, csh + i)));
      const auto hi1 = hn::MulAdd(a1, hn::LoadU(df, snh + i + n), hn::Mul(b1, hn::LoadU(df, csh + i + n)));
      store(RoundToBF16Bits2(lo0, lo1, df), du16, reinterpret_cast<uint16_t*>(y + i));
      store(RoundToBF16Bits2(hi0, hi1, df), du16, reinterpret_cast<uint16_t*>(yh + i));
    }
  }
#endif
  for (; i + n <= half; i += n) {
    const auto a = LoadF(df, x + i), b = LoadF(df, xh + i);
    store(hn::MulAdd(b, hn::LoadU(df, sn + i), hn::Mul(a, hn::LoadU(df, cs + i))), df, y + i);
    store(hn::MulAdd(a, hn::LoadU(df, snh + i), hn::Mul(b, hn::LoadU(df, csh + i))), df, yh + i);
  }
  for (; i < half; ++i) {
    const float a = ScalarLoad(x + i), b = ScalarLoad(xh + i);
    ScalarStore(std::fma(b, sn[i], a * cs[i]), y + i);
    ScalarStore(std::fma(a, snh[i], b * csh[i]), yh + i);
  }
}

// Channel stride 1 in x and y.
template <class T, class Store>
HWY_INLINE void HeadContig(const T* HWY_RESTRICT x, T* HWY_RESTRICT y, const float* HWY_RESTRICT cs,
                           const float* HWY_RESTRICT sn, size_t d, size_t d2, bool interleaved, Store store) {
  const size_t half = d2 / 2;
  if (!interleaved) {
    RotateHalf(x, y, cs, sn, half, store);
  } else {
    size_t i = 0;
#if HWY_TARGET != HWY_SCALAR
    const hn::ScalableTag<float> df;
    const size_t n = hn::Lanes(df);  // even: pairs never straddle vectors
    const auto rotate = [&](size_t k) HWY_ATTR {
      const auto v = LoadF(df, x + k);
      const auto w = hn::Reverse2(df, v);  // lanes (1, 0, 3, 2, ...): the partners
      return hn::MulAdd(w, hn::LoadU(df, sn + k), hn::Mul(v, hn::LoadU(df, cs + k)));
    };
    if constexpr (std::is_same_v<T, bfloat16_t>) {
      const hn::Repartition<uint16_t, decltype(df)> du16;
      for (; i + 2 * n <= d2; i += 2 * n)
        store(RoundToBF16Bits2(rotate(i), rotate(i + n), df), du16, reinterpret_cast<uint16_t*>(y + i));
    }
    for (; i + n <= d2; i += n) store(rotate(i), df, y + i);
#endif
    for (; i < d2; ++i) ScalarStore(std::fma(ScalarLoad(x + (i ^ 1)), sn[i], ScalarLoad(x + i) * cs[i]), y + i);
  }
  if (d > d2) std::memcpy(y + d2, x + d2, (d - d2) * sizeof(T));
}

// Rows [r0, r1) of the plan. scratch: 5 * d2 floats (angles, 2 tables).
template <class T>
HWY_NOINLINE void RopeRowsT(const RopePlan& p, int64_t r0, int64_t r1, float* scratch) {
  const int64_t d = p.d, d2 = p.d2;
  float* ang = scratch;
  float* cs[2] = {scratch + d2, scratch + 3 * d2};
  float* sn[2] = {scratch + 2 * d2, scratch + 4 * d2};
  int64_t cached[2] = {-1, -1};
  const bool interleaved = p.interleaved;
  const auto plain = [](auto v, auto tag, auto* ptr) HWY_ATTR { StoreF(v, tag, ptr); };
  const auto streamed = [](auto v, auto tag, auto* ptr) HWY_ATTR { StreamF(v, tag, ptr); };

  // thd: the sequence holding row r0.
  int64_t seq = 0;
  if (p.thd) seq = int64_t(std::upper_bound(p.seq_begin, p.seq_begin + p.nseq + 1, r0) - p.seq_begin) - 1;

  for (int64_t r = r0; r < r1; ++r) {
    int64_t si, bi, t, len;
    if (p.thd) {
      while (p.seq_begin[seq + 1] <= r) ++seq;  // skips empty sequences
      si = r;
      bi = 0;
      t = r - p.seq_begin[seq];
      len = p.seq_begin[seq + 1] - p.seq_begin[seq];
    } else {
      si = p.b_major ? r % p.s : r / p.b;
      bi = p.b_major ? r / p.s : r % p.b;
      t = si;
      len = p.s;
    }
    const int64_t batch = p.thd ? seq : bi;
    const int64_t pos = (p.start ? p.start[batch] : 0) + RopeLocalPosition(t, len, p.cp_size, p.cp_rank);
    for (int k = 0; k < p.ntables; ++k) {
      if (cached[k] != pos && d2 > 0) {
        FillTable(p, k, pos, ang, cs[k], sn[k]);
        cached[k] = pos;
      }
    }
    // Head groups outermost: for the qkv ops one group's q, k and v heads
    // are adjacent in the packed tensor, so the packed side is walked in
    // memory order (the prefetchers see one stream, not three passes).
    const T* xrow[3];
    T* yrow[3];
    for (int jn = 0; jn < p.njobs; ++jn) {
      const RopeJob& job = p.jobs[jn];
      xrow[jn] = reinterpret_cast<const T*>(job.in) + (si * job.in_ss + bi * job.in_sb);
      yrow[jn] = reinterpret_cast<T*>(job.out) + (si * job.out_ss + bi * job.out_sb);
    }
    const int64_t groups = p.jobs[0].groups;  // the same for every job
    for (int64_t g = 0; g < groups; ++g) {
      for (int jn = 0; jn < p.njobs; ++jn) {
        const RopeJob& job = p.jobs[jn];
        const int64_t rot = job.table < 0 ? 0 : d2;
        const float* c = job.table < 0 ? nullptr : cs[job.table];
        const float* s = job.table < 0 ? nullptr : sn[job.table];
        const bool contig = job.in_sd == 1 && job.out_sd == 1;
        for (int64_t j = 0; j < job.heads; ++j) {
          const T* x = xrow[jn] + g * job.in_sg + j * job.in_sj;
          T* y = yrow[jn] + g * job.out_sg + j * job.out_sj;
          if (contig) PrefetchAhead(x, size_t(d) * sizeof(T));  // docs/perf-rope.md, session 26
          if (!contig) {
            HeadStrided(x, job.in_sd, y, job.out_sd, c, s, d, rot, interleaved);
          } else if (p.stream) {
            HeadContig(x, y, c, s, size_t(d), size_t(rot), interleaved, streamed);
          } else {
            HeadContig(x, y, c, s, size_t(d), size_t(rot), interleaved, plain);
          }
        }
      }
    }
  }
  if (p.stream) hwy::FlushStream();
}

// Exported: rows [r0, r1).
void RopeRows(const RopePlan& p, int64_t r0, int64_t r1, float* scratch) {
  switch (p.dt) {
    case DType::kF32:
      return RopeRowsT<float>(p, r0, r1, scratch);
    case DType::kBF16:
      return RopeRowsT<bfloat16_t>(p, r0, r1, scratch);
    default:
      return RopeRowsT<float16_t>(p, r0, r1, scratch);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- Dispatch, threading and registration (compiled once) ------------------
#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(RopeRows);

namespace {

// Output bytes above which vector stores are non-temporal (see
// normalization.cpp: an output this large is evicted before it is read).
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "rope", code, what);
}

int64_t StrideOf(const DLTensor* t, int d) {
  if (t->strides) return t->strides[d];
  int64_t s = 1;
  for (int k = d + 1; k < t->ndim; ++k) s *= t->shape[k];
  return s;
}

int64_t IntAt(const DLTensor* t, int64_t i) {
  return static_cast<const int32_t*>(DataPtr(t))[i * (t->strides ? t->strides[0] : 1)];
}

// Whether every vector store of `job` can be non-temporal: channel stride 1,
// every head start and both rotate-half segments 64-byte aligned.
bool StreamAligned(const RopePlan& p, const RopeJob& j) {
  const int64_t e = int64_t(FloatElemSize(p.dt));
  if (j.out_sd != 1 || reinterpret_cast<uintptr_t>(j.out) % 64 != 0) return false;
  for (int64_t s : {j.out_ss, j.out_sb, j.out_sg, j.out_sj})
    if ((s * e) % 64 != 0) return false;
  return ((p.interleaved ? p.d2 : p.d2 / 2) * e) % 64 == 0;
}

// Streaming for calls writing at least kStreamMinBytes, when every job can.
bool ShouldStream(const RopePlan& p, const DLTensor* written) {
  int64_t bytes = int64_t(FloatElemSize(p.dt));
  for (int k = 0; k < written->ndim; ++k) bytes *= written->shape[k];
  if (bytes < kStreamMinBytes) return false;
  for (int k = 0; k < p.njobs; ++k)
    if (!StreamAligned(p, p.jobs[k])) return false;
  return true;
}

struct BlockCtx {
  const RopePlan* plan;
  int64_t blocks;
  float* scratch;
  size_t scratch_per_block;
};

void BlockBody(void* ctx, int64_t begin, int64_t end) {
  const BlockCtx& c = *static_cast<const BlockCtx*>(ctx);
  const int64_t rows = c.plan->rows;
  for (int64_t blk = begin; blk < end; ++blk) {
    const int64_t r0 = rows * blk / c.blocks, r1 = rows * (blk + 1) / c.blocks;
    HWY_DYNAMIC_DISPATCH(RopeRows)(*c.plan, r0, r1, c.scratch + size_t(blk) * c.scratch_per_block);
  }
}

// Runs the plan: fixed blocks of rows (about 64 KiB of data each, at least
// 4 per thread when there is enough work).
void Run(const tefl_call_frame* f, const RopePlan& p) {
  if (p.rows == 0) return;
  int64_t row_elems = 0;
  for (int k = 0; k < p.njobs; ++k) row_elems += p.jobs[k].groups * p.jobs[k].heads * p.d;
  const int64_t row_bytes = std::max<int64_t>(1, row_elems * int64_t(FloatElemSize(p.dt)));
  const int64_t rows_per_block = std::max<int64_t>(1, (int64_t(64) << 10) / row_bytes);
  const int64_t threads = std::max<int64_t>(1, f->host->num_threads());
  const int64_t blocks =
      std::min(p.rows, std::max<int64_t>((p.rows + rows_per_block - 1) / rows_per_block / 4, 4 * threads));
  const size_t per_block = size_t(5 * std::max<int64_t>(p.d2, 1)) + 16;
  std::vector<float> scratch(size_t(blocks) * per_block);
  BlockCtx c{&p, blocks, scratch.data(), per_block};
  f->host->parallel_for(blocks, 1, BlockBody, &c);
}

RopePlan BasePlan(DType dt, bool interleaved, bool backward, int32_t cp_size, int32_t cp_rank) {
  RopePlan p{};
  p.dt = dt;
  p.interleaved = interleaved;
  p.backward = backward;
  p.cp_size = cp_size;
  p.cp_rank = cp_rank;
  return p;
}

void SetFreqs(RopePlan& p, int k, const DLTensor* freqs) {
  p.freqs[k] = static_cast<const float*>(DataPtr(freqs));
  p.f_row[k] = StrideOf(freqs, 0);
  p.f_col[k] = StrideOf(freqs, 3);
}

std::vector<int64_t> StartOffsets(const DLTensor* start) {
  std::vector<int64_t> v;
  if (start == nullptr) return v;
  v.resize(size_t(start->shape[0]));
  for (int64_t i = 0; i < start->shape[0]; ++i) v[size_t(i)] = IntAt(start, i);
  return v;
}

// in (x, freqs, start_positions?, cu_seqlens?) -> out (y)
tefl_status* RopeKernel(const tefl_call_frame* f, bool backward) {
  try {
    const auto* attrs = static_cast<const tefl_rope_attrs*>(f->attrs);
    const DLTensor* x = f->inputs[0];
    const DLTensor* freqs = f->inputs[1];
    const DLTensor* start = f->inputs[2];
    const DLTensor* cu = f->inputs[3];
    const DLTensor* y = f->outputs[0];
    if (NumElements(y) == 0) return nullptr;  // d = 0 or no token: nothing to write
    const DType dt = DTypeOf(x->dtype);
    if (!IsFloatType(dt) || DTypeOf(y->dtype) != dt)
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");

    RopePlan p = BasePlan(dt, attrs->interleaved != 0, backward, attrs->cp_size, attrs->cp_rank);
    p.thd = attrs->qkv_format == TEFL_QKV_THD;
    const int hd = p.thd ? 1 : 2;  // the h dim
    p.d = x->shape[hd + 1];
    p.d2 = freqs->shape[3];
    SetFreqs(p, 0, freqs);
    p.ntables = 1;
    const std::vector<int64_t> offsets = StartOffsets(start);
    p.start = start ? offsets.data() : nullptr;

    RopeJob& job = p.jobs[0];
    p.njobs = 1;
    job.in = static_cast<const char*>(DataPtr(x));
    job.out = static_cast<char*>(DataPtr(y));
    job.groups = x->shape[hd];
    job.heads = 1;
    job.in_sg = StrideOf(x, hd);
    job.out_sg = StrideOf(y, hd);
    job.in_sd = StrideOf(x, hd + 1);
    job.out_sd = StrideOf(y, hd + 1);
    job.table = 0;
    std::vector<int64_t> seq_begin;
    if (p.thd) {
      p.nseq = cu->shape[0] - 1;
      seq_begin.resize(size_t(p.nseq + 1));
      for (int64_t i = 0; i <= p.nseq; ++i) seq_begin[size_t(i)] = IntAt(cu, i) / attrs->cp_size;
      p.seq_begin = seq_begin.data();
      p.rows = x->shape[0];
      job.in_ss = StrideOf(x, 0);
      job.out_ss = StrideOf(y, 0);
    } else {
      const int sdim = attrs->qkv_format == TEFL_QKV_SBHD ? 0 : 1, bdim = 1 - sdim;
      p.s = x->shape[sdim];
      p.b = x->shape[bdim];
      p.rows = p.s * p.b;
      job.in_ss = StrideOf(x, sdim);
      job.in_sb = StrideOf(x, bdim);
      job.out_ss = StrideOf(y, sdim);
      job.out_sb = StrideOf(y, bdim);
      // Walk rows in the output's memory order.
      p.b_major = std::abs(job.out_sb) > std::abs(job.out_ss);
    }
    if (p.rows == 0 || job.groups == 0 || p.d == 0) return nullptr;
    p.stream = ShouldStream(p, y);
    Run(f, p);
    return nullptr;
  } catch (const std::exception& ex) {
    return Status(f, TEFL_INTERNAL, ex.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// Forward: in (qkv, q_freqs, k_freqs, start?) -> out (q, k, v).
// Backward: in (q_grads, k_grads, v_grads, q_freqs, k_freqs, start?) -> out (qkv_grads).
tefl_status* QkvKernel(const tefl_call_frame* f, bool backward) {
  try {
    const auto* attrs = static_cast<const tefl_qkv_rope_attrs*>(f->attrs);
    const DLTensor* packed = backward ? f->outputs[0] : f->inputs[0];
    const DLTensor* parts[3];
    for (int k = 0; k < 3; ++k) parts[k] = backward ? f->inputs[k] : f->outputs[k];
    const DLTensor* qf = f->inputs[backward ? 3 : 1];
    const DLTensor* kf = f->inputs[backward ? 4 : 2];
    const DLTensor* start = f->inputs[backward ? 5 : 3];
    const DType dt = DTypeOf(packed->dtype);
    for (const DLTensor* t : parts)
      if (!IsFloatType(dt) || DTypeOf(t->dtype) != dt)
        return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");

    RopePlan p = BasePlan(dt, attrs->interleaved != 0, backward, attrs->cp_size, attrs->cp_rank);
    const int sdim = attrs->qkv_format == TEFL_QKV_SBHD ? 0 : 1, bdim = 1 - sdim;
    p.s = packed->shape[sdim];
    p.b = packed->shape[bdim];
    p.rows = p.s * p.b;
    p.d = parts[0]->shape[3];
    p.d2 = qf->shape[3];
    SetFreqs(p, 0, qf);
    SetFreqs(p, 1, kf);
    p.ntables = 2;
    const std::vector<int64_t> offsets = StartOffsets(start);
    p.start = start ? offsets.data() : nullptr;
    const int64_t splits[3] = {attrs->q_split, attrs->k_split, attrs->v_split};
    const int64_t h = packed->shape[2];
    const int64_t e = int64_t(FloatElemSize(dt));
    int64_t channel0 = 0;
    for (int k = 0; k < 3; ++k) {
      const DLTensor* part = parts[k];
      RopeJob& job = p.jobs[k];
      const int64_t heads = splits[k] / p.d;
      // The packed side: group g, head j at channel channel0 + j * d.
      const char* pk = static_cast<const char*>(DataPtr(packed)) + channel0 * StrideOf(packed, 3) * e;
      const int64_t pk_ss = StrideOf(packed, sdim), pk_sb = StrideOf(packed, bdim), pk_sg = StrideOf(packed, 2),
                    pk_sj = p.d * StrideOf(packed, 3), pk_sd = StrideOf(packed, 3);
      const char* pt = static_cast<const char*>(DataPtr(part));
      const int64_t pt_ss = StrideOf(part, sdim), pt_sb = StrideOf(part, bdim), pt_sg = heads * StrideOf(part, 2),
                    pt_sj = StrideOf(part, 2), pt_sd = StrideOf(part, 3);
      const int table = k < 2 ? k : -1;  // v: copied
      // Outputs are never const: the one written (part or packed) is an output tensor.
      if (!backward) {
        job = RopeJob{
            pk,   const_cast<char*>(pt), pk_ss, pk_sb, pt_ss, pt_sb, h, heads, pk_sg, pk_sj, pt_sg, pt_sj, pk_sd, pt_sd,
            table};
      } else {
        job = RopeJob{
            pt,   const_cast<char*>(pk), pt_ss, pt_sb, pk_ss, pk_sb, h, heads, pt_sg, pt_sj, pk_sg, pk_sj, pt_sd, pk_sd,
            table};
      }
      channel0 += splits[k];
    }
    p.njobs = 3;
    p.b_major = std::abs(p.jobs[0].out_sb) > std::abs(p.jobs[0].out_ss);
    if (p.rows == 0 || h == 0) return nullptr;
    p.stream = ShouldStream(p, packed);  // q + k + v are as many bytes as qkv
    Run(f, p);
    return nullptr;
  } catch (const std::exception& ex) {
    return Status(f, TEFL_INTERNAL, ex.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* RopeFwdKernel(const tefl_call_frame* f, void*) { return RopeKernel(f, false); }
tefl_status* RopeBwdKernel(const tefl_call_frame* f, void*) { return RopeKernel(f, true); }
tefl_status* QkvFwdKernel(const tefl_call_frame* f, void*) { return QkvKernel(f, false); }
tefl_status* QkvBwdKernel(const tefl_call_frame* f, void*) { return QkvKernel(f, true); }

}  // namespace

tefl_status* RegisterPortableRope(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"fused_rope_forward", RopeFwdKernel},
      {"fused_rope_backward", RopeBwdKernel},
      {"fused_qkv_rope_forward", QkvFwdKernel},
      {"fused_qkv_rope_backward", QkvBwdKernel},
  };
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
