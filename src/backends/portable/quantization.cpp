// default.portable FP8 quantization kernels: quantize, dequantize,
// compute_amax, compute_scale_from_amax, fused_amax_and_scale_update_after_
// reduction, fp8_transpose (maths: spec/ops.md "FP8 and scaling recipes").
// The fused norm / gated-activation FP8 outputs live next to their base ops
// (portable/normalization.cpp, portable/activation.cpp).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); FP8 encode and
// decode from fp8_io-inl.h (bit-identical to core/fp8.h). Elementwise ops run
// in blocks of kBlock elements over the host thread pool; each block's amax
// (max of |bits|, NaN sorting above inf) is folded into one atomic word with
// a compare-and-swap max, so the result does not depend on the thread count.
// The recipes work on n scale entries (one per tensor): scalar loops.
// fp8_transpose moves 64x256-byte tiles as 16x16 blocks transposed in
// registers (four rounds of byte interleaves), rows of tiles spread over the
// pool.
//
// Host contract (validated before the call): CPU tensors, compact row-major,
// dtypes as in the catalogue, outputs do not overlap inputs (except the
// delayed-scaling history exactly in place).
#include <algorithm>
#include <atomic>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

// ---- State shared by every target (defined once) ---------------------------
#ifndef TEFL_BACKENDS_PORTABLE_QUANTIZATION_SHARED_
#define TEFL_BACKENDS_PORTABLE_QUANTIZATION_SHARED_
namespace tefl::backends {
namespace {

enum class QKind : uint8_t { kQuantize, kDequantize, kAmax };

// One elementwise call over n elements.
struct QJob {
  QKind kind;
  DType tx;  // the float side (x)
  Fp8Format fmt;
  const void* src;
  void* dst;
  int64_t n;
  float scale;  // quantize: scale; dequantize: scale_inv
  std::atomic<uint32_t>* amax_bits;
  bool stream;  // write the output with non-temporal stores
};

// Elements per work item.
constexpr int64_t kBlock = 32768;
// Calls with an fp32 side moving at least this many bytes (read + written)
// store their output with non-temporal stores: far beyond L3 the output is
// evicted before it is read back anyway, and streaming saves each line's read
// for ownership. Measured with tefl bench at 8192 x 8192 (Zen 4, 2 threads):
// dequantize e4m3 -> fp32 16-17 -> 11-13 ms, quantize fp32 mostly faster;
// with bf16 it was slower (dequantize -> bf16 13-16 -> 17-19 ms, quantize
// bf16 11.2-11.8 -> 12.0-12.4 ms; not understood), so 16-bit sides do not
// stream.
constexpr int64_t kStreamMinBytes = int64_t(32) << 20;
bool StreamOutput(DType tx, int64_t n) { return tx == DType::kF32 && n * 5 >= kStreamMinBytes; }
// fp8_transpose: source rows per work item, columns per tile. A 256 x 256
// tile (64 KiB each way, in L2) touches 512 pages: with power-of-two row
// strides every row is its own page (and L1 set), so big tiles keep TLB
// misses per byte low; inside a tile the 16x16 blocks go down a column
// block first, filling each destination line before moving on.
constexpr int64_t kTileRows = 256, kTileCols = 256;

inline void AtomicMaxBits(std::atomic<uint32_t>* a, uint32_t v) {
  uint32_t cur = a->load(std::memory_order_relaxed);
  while (v > cur && !a->compare_exchange_weak(cur, v, std::memory_order_relaxed)) {
  }
}

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_QUANTIZATION_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/quantization.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/fp8_io-inl.h"
#include "backends/portable/simd_io-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

template <Fp8Format kF, class T>
HWY_INLINE void ItemsT(const QJob& j, int64_t begin, int64_t end) {
  const int64_t lo = begin * kBlock, hi = std::min(j.n, end * kBlock);
  const size_t n = size_t(hi - lo);
  switch (j.kind) {
    case QKind::kQuantize: {
      const uint32_t m = QuantizeSpan<kF>(static_cast<const T*>(j.src) + lo, static_cast<uint8_t*>(j.dst) + lo, n,
                                          j.scale, 0u, j.stream);
      AtomicMaxBits(j.amax_bits, m);
      break;
    }
    case QKind::kDequantize:
      DequantizeSpan<kF>(static_cast<const uint8_t*>(j.src) + lo, static_cast<T*>(j.dst) + lo, n, j.scale, j.stream);
      break;
    case QKind::kAmax:
      AtomicMaxBits(j.amax_bits, AmaxSpan(static_cast<const T*>(j.src) + lo, n, 0u));
      break;
  }
}

template <Fp8Format kF>
HWY_INLINE void ItemsF(const QJob& j, int64_t begin, int64_t end) {
  switch (j.tx) {
    case DType::kF32:
      return ItemsT<kF, float>(j, begin, end);
    case DType::kBF16:
      return ItemsT<kF, bfloat16_t>(j, begin, end);
    default:
      return ItemsT<kF, float16_t>(j, begin, end);
  }
}

// ---- fp8_transpose ----------------------------------------------------------------
// 16x16 bytes through 16 128-bit registers: four rounds of byte interleaves
// of row k with row k + 8 (out[2k] = lo(in[k], in[k+8]), out[2k+1] = hi(...))
// rotate the 8-bit (row, col) index left by one bit each, so four rounds
// are the transpose.
#if HWY_TARGET != HWY_SCALAR
HWY_INLINE void Transpose16x16(const uint8_t* HWY_RESTRICT src, int64_t src_stride, uint8_t* HWY_RESTRICT dst,
                               int64_t dst_stride) {
  const hn::Full128<uint8_t> d;
  hn::Vec<decltype(d)> a[16], b[16];
  for (int k = 0; k < 16; ++k) a[k] = hn::LoadU(d, src + k * src_stride);
  for (int round = 0; round < 4; ++round) {
    hn::Vec<decltype(d)>* in = round % 2 == 0 ? a : b;
    hn::Vec<decltype(d)>* out = round % 2 == 0 ? b : a;
    for (int k = 0; k < 8; ++k) {
      out[2 * k] = hn::InterleaveLower(d, in[k], in[k + 8]);
      out[2 * k + 1] = hn::InterleaveUpper(d, in[k], in[k + 8]);
    }
  }
  for (int k = 0; k < 16; ++k) hn::StoreU(a[k], d, dst + k * dst_stride);
}
#endif

// Exported: tile rows [begin, end) (kTileRows source rows each) of q [m, n]
// into t [n, m]: 16x16 blocks in registers, the ragged edges scalar.
void TransposeRows(const uint8_t* q, uint8_t* t, int64_t m, int64_t n, int64_t begin, int64_t end) {
  for (int64_t tr = begin; tr < end; ++tr) {
    const int64_t i0 = tr * kTileRows, i1 = std::min(m, i0 + kTileRows);
    for (int64_t j0 = 0; j0 < n; j0 += kTileCols) {
      const int64_t j1 = std::min(n, j0 + kTileCols);
      int64_t i = i0;
#if HWY_TARGET != HWY_SCALAR
      const int64_t i16 = i0 + (i1 - i0) / 16 * 16;
      int64_t c = j0;
      for (; c + 16 <= j1; c += 16)
        for (int64_t b = i0; b < i16; b += 16) Transpose16x16(q + b * n + c, n, t + c * m + b, m);
      for (; c < j1; ++c)
        for (int64_t k = i0; k < i16; ++k) t[c * m + k] = q[k * n + c];
      i = i16;
#endif
      for (; i < i1; ++i)
        for (int64_t c = j0; c < j1; ++c) t[c * m + i] = q[i * n + c];
    }
  }
}

// Exported: work items [begin, end) of an elementwise call.
void QuantItems(const QJob& j, int64_t begin, int64_t end) {
  if (j.fmt == Fp8Format::kE4M3) {
    ItemsF<Fp8Format::kE4M3>(j, begin, end);
  } else {
    ItemsF<Fp8Format::kE5M2>(j, begin, end);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

// ---- Dispatch, threading and registration (compiled once) ------------------
#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(QuantItems);
HWY_EXPORT(TransposeRows);

namespace {

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "quantization", code, what);
}

Fp8Format FormatOf(const DLTensor* t) {
  return DTypeOf(t->dtype) == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}
bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
float* F32(const DLTensor* t) { return static_cast<float*>(DataPtr(t)); }
float FormatMax(int32_t fp8_format) { return fp8_format == TEFL_FP8_E5M2 ? 57344.0f : 448.0f; }
float BitsToAmax(uint32_t bits) {
  return bits > 0x7F800000u ? std::bit_cast<float>(0x7FC00000u) : std::bit_cast<float>(bits);
}

void QBody(void* ctx, int64_t begin, int64_t end) {
  HWY_DYNAMIC_DISPATCH(QuantItems)(*static_cast<const QJob*>(ctx), begin, end);
}

void RunJob(const tefl_call_frame* f, QJob& j) {
  if (j.n == 0) return;
  const int64_t items = (j.n + kBlock - 1) / kBlock;
  f->host->parallel_for(items, 1, QBody, &j);
}

// in (x, scale) -> out (q, amax, scale_inv)
tefl_status* QuantizeKernel(const tefl_call_frame* f, void*) {
  try {
    const DLTensor* x = f->inputs[0];
    const DLTensor* q = f->outputs[0];
    const DType tx = DTypeOf(x->dtype);
    if (!IsFloatType(tx) || !IsFp8(DTypeOf(q->dtype)))
      return Status(f, TEFL_UNSUPPORTED, "x must be fp32/fp16/bf16 and q E4M3/E5M2");
    std::atomic<uint32_t> amax{0};
    const float scale = *F32(f->inputs[1]);
    const int64_t n = NumElements(x);
    QJob j{QKind::kQuantize, tx, FormatOf(q), DataPtr(x), DataPtr(q), n, scale, &amax, StreamOutput(tx, n)};
    RunJob(f, j);
    *F32(f->outputs[1]) = BitsToAmax(amax.load());
    *F32(f->outputs[2]) = 1.0f / scale;
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// in (q, scale_inv) -> out (x)
tefl_status* DequantizeKernel(const tefl_call_frame* f, void*) {
  try {
    const DLTensor* q = f->inputs[0];
    const DLTensor* x = f->outputs[0];
    const DType tx = DTypeOf(x->dtype);
    if (!IsFloatType(tx) || !IsFp8(DTypeOf(q->dtype)))
      return Status(f, TEFL_UNSUPPORTED, "q must be E4M3/E5M2 and x fp32/fp16/bf16");
    const int64_t n = NumElements(q);
    QJob j{QKind::kDequantize, tx,      FormatOf(q),        DataPtr(q), DataPtr(x), n,
           *F32(f->inputs[1]), nullptr, StreamOutput(tx, n)};
    RunJob(f, j);
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// in (x) -> out (amax)
tefl_status* AmaxKernel(const tefl_call_frame* f, void*) {
  try {
    const DLTensor* x = f->inputs[0];
    const DType tx = DTypeOf(x->dtype);
    if (!IsFloatType(tx)) return Status(f, TEFL_UNSUPPORTED, "x must be fp32/fp16/bf16");
    std::atomic<uint32_t> amax{0};
    QJob j{QKind::kAmax, tx, Fp8Format::kE4M3, DataPtr(x), nullptr, NumElements(x), 1.0f, &amax, false};
    RunJob(f, j);
    *F32(f->outputs[0]) = BitsToAmax(amax.load());
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// Current scaling: in (amax[n]) -> out (scale[n], scale_inv[n]).
tefl_status* ScaleFromAmaxKernel(const tefl_call_frame* f, void*) {
  const auto* attrs = static_cast<const tefl_compute_scale_attrs*>(f->attrs);
  const float fp8_max = FormatMax(attrs->fp8_format);
  const float eps = attrs->epsilon;
  const bool pow2 = attrs->force_pow_2_scales != 0;
  const float* amax = F32(f->inputs[0]);
  float* scale = F32(f->outputs[0]);
  float* scale_inv = F32(f->outputs[1]);
  const int64_t n = NumElements(f->inputs[0]);
  for (int64_t i = 0; i < n; ++i) {
    const float a = amax[i] < eps ? eps : amax[i];  // NaN stays NaN
    float s = 1.0f;
    if (a != 0.0f && std::isfinite(a)) {
      s = fp8_max / a;
      if (std::isinf(s)) s = FLT_MAX;
    }
    if (pow2) s = std::bit_cast<float>(std::bit_cast<uint32_t>(s) & 0xFF800000u);
    scale[i] = s;
    scale_inv[i] = 1.0f / s;
  }
  return nullptr;
}

// Delayed scaling: in (amax_history[len, n], scale[n]) -> out (new history,
// new scale). Works row-wise (contiguous), so the history is read once for
// the amax (into a per-column buffer) before the in-place roll.
tefl_status* DelayedKernel(const tefl_call_frame* f, void*) {
  try {
    const auto* attrs = static_cast<const tefl_delayed_scaling_attrs*>(f->attrs);
    const float sf = FormatMax(attrs->fp8_format) * std::exp2(-attrs->margin);
    const DLTensor* ht = f->inputs[0];
    const size_t len = size_t(ht->shape[0]), n = size_t(ht->shape[1]);
    const float* hist = F32(ht);
    const float* scale = F32(f->inputs[1]);
    float* out = F32(f->outputs[0]);
    float* new_scale = F32(f->outputs[1]);
    if (n == 0) return nullptr;
    // amax per column (max: NaN sorts highest through the bit order of |x|
    // for non-negative values; negative entries never win over row 0 unless
    // all are negative, handled by the float compare).
    std::vector<float> amax(hist, hist + n);
    std::vector<float> row0(hist, hist + n);
    if (attrs->amax_compute_algo != TEFL_AMAX_ALGO_MOST_RECENT) {
      std::vector<uint8_t> nan(n, 0);
      for (size_t j = 0; j < n; ++j) nan[j] = std::isnan(amax[j]);
      for (size_t i = 1; i < len; ++i) {
        const float* r = hist + i * n;
        for (size_t j = 0; j < n; ++j) {
          amax[j] = r[j] > amax[j] ? r[j] : amax[j];
          nan[j] |= std::isnan(r[j]);
        }
      }
      for (size_t j = 0; j < n; ++j)
        if (nan[j]) amax[j] = std::bit_cast<float>(0x7FC00000u);
    }
    for (size_t j = 0; j < n; ++j) {
      float s = scale[j];
      if (std::isfinite(amax[j]) && amax[j] > 0.0f) {
        s = sf / amax[j];
        if (std::isinf(s)) s = FLT_MAX;
      }
      new_scale[j] = s;
    }
    // Roll by -1 (memmove handles the in-place overlap), last row = old row 0,
    // then row 0 = 0.
    if (len > 1) std::memmove(out, hist + n, (len - 1) * n * sizeof(float));
    std::memcpy(out + (len - 1) * n, row0.data(), n * sizeof(float));
    std::fill(out, out + n, 0.0f);
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// ---- fp8_transpose --------------------------------------------------------------
struct TJob {
  const uint8_t* q;
  uint8_t* t;
  int64_t m, n;
};

void TBody(void* ctx, int64_t begin, int64_t end) {
  const TJob& j = *static_cast<const TJob*>(ctx);
  HWY_DYNAMIC_DISPATCH(TransposeRows)(j.q, j.t, j.m, j.n, begin, end);
}

tefl_status* TransposeKernel(const tefl_call_frame* f, void*) {
  const DLTensor* q = f->inputs[0];
  TJob j{static_cast<const uint8_t*>(DataPtr(q)), static_cast<uint8_t*>(DataPtr(f->outputs[0])), q->shape[0],
         q->shape[1]};
  if (j.m == 0 || j.n == 0) return nullptr;
  f->host->parallel_for((j.m + kTileRows - 1) / kTileRows, 1, TBody, &j);
  return nullptr;
}

}  // namespace

tefl_status* RegisterPortableQuantization(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"quantize", QuantizeKernel},
      {"dequantize", DequantizeKernel},
      {"compute_amax", AmaxKernel},
      {"compute_scale_from_amax", ScaleFromAmaxKernel},
      {"fused_amax_and_scale_update_after_reduction", DelayedKernel},
      {"fp8_transpose", TransposeKernel},
  };
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
