// default.portable — GEMM: generic_gemm and te_general_grouped_gemm.
//
// The fp32 core is OpenBLAS's cblas_sgemm (Debian libopenblas 0.3.21, the
// pthread build). Around it:
//  - Operands that are not fp32 (bf16, fp16, FP8) are converted whole to
//    compact fp32 copies first, rows spread over the host pool (bf16/fp16
//    exactly; FP8 through the 256-entry decode table of core/fp8.h). The
//    FP8 scale_inv factors are folded into alpha (alpha * sa * sb).
//  - D is computed in fp32: directly in D when D is fp32, else in an fp32
//    scratch [M, N]. C (or D's prior content with accumulate) is copied in
//    first and sgemm's beta applies to it; BLAS conventions hold: alpha = 0
//    skips the product, beta = 0 skips C (the reference does the same).
//  - One fused epilogue pass over D, rows spread over the host pool: bias,
//    GELU (pre_gelu_out), amax (NaN ignored, as TE), output conversion
//    (bf16/fp16 round to nearest even; FP8 fp8(D * d_scale), saturating).
//    A plain fp32 GEMM has no epilogue pass at all.
//  - bias_grad (grad): row sums of op(A) in double.
//
// Threads: OpenBLAS keeps its own pthread pool. Every sgemm runs under one
// process-wide mutex that also sets OpenBLAS's thread count to the host
// pool's num_threads() when it differs from the last call's, so tefl and
// OpenBLAS agree on the thread budget and openblas_set_num_threads never
// races a running GEMM. Concurrent GEMM calls from several threads are
// therefore safe (and serialised in their sgemm part; the conversions and
// epilogues run concurrently).
#include <cblas.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <exception>
#include <mutex>
#include <new>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

constexpr const char* kImpl = "default.portable";

bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }
bool IsGemmType(DType t) { return IsFloatType(t) || IsFp8(t); }
size_t ElemSize(DType t) { return IsFp8(t) ? 1 : FloatElemSize(t); }
Fp8Format FormatOf(DType t) { return t == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2; }

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, kImpl, "gemm", code, what);
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
  buf.resize(size_t(n));
  ConvertCtx c{src, t, buf.data(), n};
  f->host->parallel_for((n + kConvertChunk - 1) / kConvertChunk, 1, ConvertBody, &c);
  return buf.data();
}

// ---- OpenBLAS under one lock, with tefl's thread count ------------------------
std::mutex& BlasMutex() {
  static std::mutex mu;
  return mu;
}

void Sgemm(const tefl_call_frame* f, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
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

// ---- one GEMM: fp32 operands, any epilogue ---------------------------------------
struct Gemm {
  int64_t m, n, k;
  bool transa, transb;
  const float* a;  // compact fp32
  const float* b;
  float alpha, beta;  // alpha with the FP8 scale_inv factors folded in
  const void* c;      // Cterm source: C, or D's prior content (accumulate), or NULL
  DType tc;
  const float* bias;  // [N] fp32 or NULL
  bool gelu;
  void* pre;  // pre_gelu_out or NULL
  DType tpre;
  void* d;
  DType td;
  float d_scale;
  std::atomic<uint32_t>* amax;  // bits of the running max |D| (non-negative floats order as integers)
};

float GeluTanh(float x) { return x * (0.5f + 0.5f * std::tanh(x * (0.79788456f + 0.03567741f * x * x))); }

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
  float amax = 0.0f;
  for (int64_t r = begin; r < end; ++r) {
    float* row = e.acc + size_t(r) * n;
    if (g.bias)
      for (size_t j = 0; j < n; ++j) row[j] += g.bias[j];
    if (g.gelu) {
      if (g.pre) FromF32(row, g.tpre, static_cast<char*>(g.pre) + size_t(r) * n * ElemSize(g.tpre), int64_t(n), 1.0f);
      for (size_t j = 0; j < n; ++j) row[j] = GeluTanh(row[j]);
    }
    if (g.amax)
      for (size_t j = 0; j < n; ++j) amax = std::fabs(row[j]) > amax ? std::fabs(row[j]) : amax;  // NaN ignored
    if (g.td != DType::kF32)
      FromF32(row, g.td, static_cast<char*>(g.d) + size_t(r) * n * ElemSize(g.td), int64_t(n), g.d_scale);
  }
  if (g.amax) AtomicMax(g.amax, amax);
}

// Runs g; `scratch` holds the fp32 result when D is not fp32.
void Run(const tefl_call_frame* f, const Gemm& g, std::vector<float>& scratch) {
  if (g.m == 0 || g.n == 0) return;
  const int64_t mn = g.m * g.n;
  float* acc = g.td == DType::kF32 ? static_cast<float*>(g.d) : nullptr;
  if (acc == nullptr) {
    scratch.resize(size_t(mn));
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
  } else {
    Sgemm(f, g.transa, g.transb, g.m, g.n, g.k, g.alpha, g.a, g.b, beta, acc);
  }
  if (g.bias || g.gelu || g.amax || g.td != DType::kF32) {
    EpilogueCtx e{&g, acc};
    const int64_t grain = std::max<int64_t>(1, (int64_t(16) << 10) / g.n);
    f->host->parallel_for(g.m, grain, EpilogueBody, &e);
  }
}

// ---- generic_gemm ------------------------------------------------------------------
// in: A B C bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
float ScalarOf(const DLTensor* t) { return t ? static_cast<const float*>(DataPtr(t))[0] : 1.0f; }

tefl_status* GenericGemm(const tefl_call_frame* f, void*) {
  try {
    const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
    const DLTensor* a = f->inputs[0];
    const DLTensor* b = f->inputs[1];
    const DLTensor* c = f->inputs[2];
    const DLTensor* bias = f->inputs[3];
    DLTensor* d = f->outputs[0];
    DLTensor* pre = f->outputs[1];
    DLTensor* bias_grad = f->outputs[2];
    DLTensor* d_amax = f->outputs[3];
    const DType ta = DTypeOf(a->dtype), tb = DTypeOf(b->dtype), td = DTypeOf(d->dtype);
    if (!IsGemmType(ta) || !IsGemmType(tb) || !IsGemmType(td) || (c && !IsFloatType(DTypeOf(c->dtype))) ||
        (bias && !IsFloatType(DTypeOf(bias->dtype))) || (pre && !IsFloatType(DTypeOf(pre->dtype))) ||
        (bias_grad && !IsFloatType(DTypeOf(bias_grad->dtype))))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16/FP8");
    const bool transa = at->transa != 0, transb = at->transb != 0;
    const int64_t m = transa ? a->shape[1] : a->shape[0];
    const int64_t k = transa ? a->shape[0] : a->shape[1];
    const int64_t n = transb ? b->shape[0] : b->shape[1];

    // Everything that can fail (allocation) happens before D is written.
    std::vector<float> abuf, bbuf, biasbuf, scratch;
    const float* a32 = AsF32(f, DataPtr(a), ta, m * k, abuf);
    const float* b32 = AsF32(f, DataPtr(b), tb, k * n, bbuf);
    const float* bias32 = bias ? AsF32(f, DataPtr(bias), DTypeOf(bias->dtype), n, biasbuf) : nullptr;
    if (td != DType::kF32) scratch.reserve(size_t(m * n));
    std::vector<double> bgrad(bias_grad ? size_t(m) : 0);

    const float sa = IsFp8(ta) ? ScalarOf(f->inputs[4]) : 1.0f;
    const float sb = IsFp8(tb) ? ScalarOf(f->inputs[5]) : 1.0f;
    std::atomic<uint32_t> amax{0};
    Gemm g{};
    g.m = m;
    g.n = n;
    g.k = k;
    g.transa = transa;
    g.transb = transb;
    g.a = a32;
    g.b = b32;
    g.alpha = at->alpha * sa * sb;
    g.beta = at->beta;
    g.c = c ? DataPtr(c) : at->accumulate ? DataPtr(d) : nullptr;
    g.tc = c ? DTypeOf(c->dtype) : td;
    g.bias = bias32;
    g.gelu = at->gelu != 0;
    g.pre = pre ? DataPtr(pre) : nullptr;
    g.tpre = pre ? DTypeOf(pre->dtype) : DType::kF32;
    g.d = DataPtr(d);
    g.td = td;
    g.d_scale = IsFp8(td) ? ScalarOf(f->inputs[6]) : 1.0f;
    g.amax = d_amax ? &amax : nullptr;
    // alpha = 0 means "no product" to BLAS; keep it so when the scales are 0 too.
    if (at->alpha == 0.0f) g.alpha = 0.0f;
    Run(f, g, scratch);

    if (bias_grad) {  // bias_grad[m] = sum_k op(A)[m, k], dequantized as TE (q * scale_inv in fp32)
      if (transa) {   // A is [K, M]: column sums
        for (int64_t kk = 0; kk < k; ++kk)
          for (int64_t i = 0; i < m; ++i) bgrad[size_t(i)] += double(a32[kk * m + i] * sa);
      } else {
        for (int64_t i = 0; i < m; ++i) {
          double s = 0.0;
          for (int64_t kk = 0; kk < k; ++kk) s += double(a32[i * k + kk] * sa);
          bgrad[size_t(i)] = s;
        }
      }
      const DType tg = DTypeOf(bias_grad->dtype);
      for (int64_t i = 0; i < m; ++i) StoreFromDouble(DataPtr(bias_grad), i, tg, bgrad[size_t(i)]);
    }
    if (d_amax) static_cast<float*>(DataPtr(d_amax))[0] = BitsFloat(amax.load());
    return nullptr;
  } catch (const std::bad_alloc&) {
    return Status(f, TEFL_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

// ---- te_general_grouped_gemm ---------------------------------------------------
// in: A[S, K] B[G, K, N] or [G, N, K] m_splits[G] bias[G, N]; out: D[S, N]
tefl_status* GroupedGemm(const tefl_call_frame* f, void*) {
  try {
    const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
    const DLTensor* a = f->inputs[0];
    const DLTensor* b = f->inputs[1];
    const auto* splits = static_cast<const int64_t*>(DataPtr(f->inputs[2]));
    const DLTensor* bias = f->inputs[3];
    DLTensor* d = f->outputs[0];
    const DType ta = DTypeOf(a->dtype), tb = DTypeOf(b->dtype), td = DTypeOf(d->dtype);
    if (!IsFloatType(ta) || !IsFloatType(tb) || !IsFloatType(td) || (bias && !IsFloatType(DTypeOf(bias->dtype))))
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16");
    const int64_t groups = b->shape[0];
    const int64_t rows = a->shape[0];
    const int64_t k = a->shape[1];
    const int64_t n = at->transb ? b->shape[1] : b->shape[2];

    std::vector<float> abuf, bbuf, biasbuf, scratch;
    const float* a32 = AsF32(f, DataPtr(a), ta, rows * k, abuf);
    const float* b32 = AsF32(f, DataPtr(b), tb, groups * k * n, bbuf);
    const float* bias32 = bias ? AsF32(f, DataPtr(bias), DTypeOf(bias->dtype), groups * n, biasbuf) : nullptr;
    if (td != DType::kF32) scratch.reserve(size_t(rows * n));  // the largest group fits

    const size_t ed = FloatElemSize(td);
    int64_t row = 0;
    for (int64_t grp = 0; grp < groups; ++grp) {
      Gemm g{};
      g.m = splits[grp];
      g.n = n;
      g.k = k;
      g.transb = at->transb != 0;
      g.a = a32 + row * k;
      g.b = b32 + grp * k * n;
      g.alpha = at->alpha;
      g.beta = at->beta;
      g.d = static_cast<char*>(DataPtr(d)) + size_t(row * n) * ed;
      g.td = td;
      g.c = at->accumulate ? g.d : nullptr;
      g.tc = td;
      g.bias = bias32 ? bias32 + grp * n : nullptr;
      g.gelu = at->gelu != 0;
      g.d_scale = 1.0f;
      Run(f, g, scratch);
      row += g.m;
    }
    return nullptr;
  } catch (const std::bad_alloc&) {
    return Status(f, TEFL_INTERNAL, "out of memory");
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
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
