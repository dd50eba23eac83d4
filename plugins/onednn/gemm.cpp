// onednn plugin — GEMM: generic_gemm through oneDNN 2.6's matmul primitive.
// Row-major D[M, N] = epilogue(alpha * op(A) op(B) + beta * Cterm + bias[N]):
//   op(A), op(B)  memory descriptors with strides (A [K, M] with transa is the
//                 [M, K] matrix with strides {1, M}; B [N, K] with transb is
//                 [K, N] with strides {1, K}): no transposed copy.
//   alpha         output scale (set only when alpha != 1).
//   accumulate    sum post-op with scale beta over D's prior content.
//   C             binary-add post-op of an fp32 [M, N] operand: C itself
//                 (fp32 C, beta 1), else an fp32 copy of beta * C.
//   bias[N]       alpha == 1: the matmul bias (fp32; a non-fp32 bias is
//                 converted). alpha != 1: a binary-add post-op of fp32 [1, N]
//                 (oneDNN 2.x adds the matmul bias before the output scale,
//                 which would give alpha * (AB + bias)).
//   gelu          eltwise_gelu_tanh post-op (TE's tanh form), last.
// bf16 x bf16 accumulates in fp32 (avx512_bf16 vdpbf16ps where the CPU has
// it); D is fp32 or bf16, rounded once.
//
// Declined (supports(), from the call signature): float16 A/B/D (oneDNN 2.6
// has no f16 matmul on these CPUs), FP8 A/B/D (scale_inv/d_scale, d_amax),
// gelu with grad (TE's DGELU epilogue: no oneDNN post-op multiplies by the
// GELU derivative of a second tensor), grad (bias_grad: no oneDNN epilogue
// sums op(A)'s rows), pre_gelu_out (a
// post-op chain cannot also store the pre-activation), d_amax, C with
// accumulate, strided tensors.
// Declined from the kernel (TEFL_UNSUPPORTED, before writing): K = 0 (oneDNN
// rejects zero dimensions), alpha = 0 (BLAS convention: the product is
// skipped, a NaN in A or B must not propagate; an output scale of 0 would
// multiply it), bf16 A or B holding a subnormal (vdpbf16ps reads it as 0),
// GELU whose pre-activation may leave |x| <= 1e4 or be non-finite (bounded
// from max |A|, |B|, |C|, |D|, |bias|: oneDNN's eltwise is not IEEE-exact
// there, see activation.cpp), a case oneDNN has no primitive for.
// M = 0 or N = 0: nothing to write, success.
//
// Primitives are cached per (dtypes, M, N, K, transposes, epilogue, alpha,
// beta) in this file's mutex-protected map, like the other families' cache.
#include <algorithm>
#include <limits>
#include <tuple>
#include <unordered_map>

#include "common.h"

namespace onednn_plugin {
namespace {

// generic_gemm argument positions (src/core/catalogue_gemm.cpp).
enum { kA, kB, kC, kBias, kAScaleInv, kBScaleInv, kDScale };
enum { kD, kPreGelu, kBiasGrad, kDAmax };
constexpr int kNumIn = 7, kNumOut = 4;
constexpr const char* kInNames[kNumIn] = {"A", "B", "C", "bias", "a_scale_inv", "b_scale_inv", "d_scale"};
constexpr const char* kOutNames[kNumOut] = {"D", "pre_gelu_out", "bias_grad", "d_amax"};

// Largest |pre-activation| the GELU post-op is trusted with (activation.cpp).
constexpr double kMaxGeluInput = 1e4;

enum class BiasMode : int8_t { kNone, kMatmul, kPostOp };

struct GemmKey {
  DT ab, d;
  int64_t m, n, k;
  bool ta, tb;
  bool c;    // binary add of an fp32 [M, N] operand
  bool sum;  // accumulate: sum post-op, scale beta
  BiasMode bias;
  bool gelu;
  uint32_t alpha;  // bits; 1.0f when no output scale
  uint32_t beta;   // bits, only meaningful with sum
  bool operator<(const GemmKey& o) const {
    return std::tie(ab, d, m, n, k, ta, tb, c, sum, bias, gelu, alpha, beta) <
           std::tie(o.ab, o.d, o.m, o.n, o.k, o.ta, o.tb, o.c, o.sum, o.bias, o.gelu, o.alpha, o.beta);
  }
};

struct GemmCache {
  std::mutex mu;
  std::map<GemmKey, std::shared_ptr<const dnnl::matmul>> prims;
};
GemmCache& Cache() {
  static GemmCache* cache = new GemmCache();  // never destroyed: kernels may run until exit
  return *cache;
}

dnnl::memory::desc ADesc(const GemmKey& k) {
  return dnnl::memory::desc({k.m, k.k}, DnnlType(k.ab), k.ta ? dnnl::memory::dims{1, k.m} : dnnl::memory::dims{k.k, 1});
}
dnnl::memory::desc BDesc(const GemmKey& k) {
  return dnnl::memory::desc({k.k, k.n}, DnnlType(k.ab), k.tb ? dnnl::memory::dims{1, k.k} : dnnl::memory::dims{k.n, 1});
}
dnnl::memory::desc RowVecDesc(int64_t n) {
  return dnnl::memory::desc({1, n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::ab);
}

// Post-op indices, in chain order: sum, C, bias, gelu.
int CPostOpIndex(const GemmKey& k) { return k.sum ? 1 : 0; }
int BiasPostOpIndex(const GemmKey& k) { return CPostOpIndex(k) + (k.c ? 1 : 0); }

std::shared_ptr<const dnnl::matmul> Primitive(const GemmKey& key) {
  GemmCache& cache = Cache();
  {
    std::lock_guard<std::mutex> lock(cache.mu);
    auto it = cache.prims.find(key);
    if (it != cache.prims.end()) return it->second;
  }
  std::shared_ptr<const dnnl::matmul> prim;
  try {
    dnnl::primitive_attr attr;
    if (FloatOfBits(key.alpha) != 1.0f) attr.set_output_scales(0, {FloatOfBits(key.alpha)});
    dnnl::post_ops ops;
    if (key.sum) ops.append_sum(FloatOfBits(key.beta));
    if (key.c) ops.append_binary(dnnl::algorithm::binary_add, DataDesc(DT::kF32, key.m, key.n));
    if (key.bias == BiasMode::kPostOp) ops.append_binary(dnnl::algorithm::binary_add, RowVecDesc(key.n));
    if (key.gelu) ops.append_eltwise(1.0f, dnnl::algorithm::eltwise_gelu_tanh, 0.0f, 0.0f);
    attr.set_post_ops(ops);
    const dnnl::memory::desc dst = DataDesc(key.d, key.m, key.n);
    const dnnl::matmul::desc d = key.bias == BiasMode::kMatmul
                                     ? dnnl::matmul::desc(ADesc(key), BDesc(key), RowVecDesc(key.n), dst)
                                     : dnnl::matmul::desc(ADesc(key), BDesc(key), dst);
    const dnnl::engine& eng = GetState().engine;
    prim = std::make_shared<const dnnl::matmul>(dnnl::matmul::primitive_desc(d, attr, eng));
  } catch (const dnnl::error& e) {
    throw Unsupported{std::string("no oneDNN matmul primitive for this case: ") + e.what()};
  }
  std::lock_guard<std::mutex> lock(cache.mu);
  return cache.prims.emplace(key, prim).first->second;
}

const tefl_gemm_attrs& Attrs(const tefl_call_frame* f) {
  static const tefl_gemm_attrs kDefaults = {TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 0, 1.0f, 1.0f, 0, 0, 0, 0};
  const auto* a = static_cast<const tefl_gemm_attrs*>(f->attrs);
  if (a == nullptr || a->struct_size < TEFL_GEMM_ATTRS_STRUCT_SIZE) return kDefaults;
  return *a;
}

const DLTensor* In(const tefl_call_frame* f, int i) { return i < f->num_inputs ? f->inputs[i] : nullptr; }
DLTensor* Out(const tefl_call_frame* f, int i) { return i < f->num_outputs ? f->outputs[i] : nullptr; }

// ---- supports(): the call signature only --------------------------------------
int32_t Decline(char* why, size_t len, const std::string& msg) {
  Why(why, len, msg);
  return 0;
}

int32_t Supports(const tefl_call_frame* f, void*, char* why, size_t len) noexcept {
  try {
    const tefl_gemm_attrs& at = Attrs(f);
    const DLTensor* a = In(f, kA);
    const DLTensor* b = In(f, kB);
    const DLTensor* d = Out(f, kD);
    if (a == nullptr || b == nullptr || d == nullptr) return Decline(why, len, "onednn needs A, B and D");
    for (const DLTensor* t : {a, b, d}) {
      const DT dt = DtOf(t);
      if (dt == DT::kF32 || dt == DT::kBF16) continue;
      if (dt == DT::kF16)
        return Decline(why, len, "onednn declines float16 GEMMs: oneDNN 2.6 has no float16 matmul on these CPUs");
      return Decline(
          why, len,
          "onednn serves float32 and bfloat16 A/B/D only (no FP8 matmul in oneDNN 2.6), got " + DtypeName(t->dtype));
    }
    if (DtOf(a) != DtOf(b)) return Decline(why, len, "onednn needs A and B of one dtype");
    if (at.gelu && at.grad)
      return Decline(why, len,
                     "onednn declines gelu with grad (TE's DGELU epilogue: D * gelu'(pre_gelu_out)): oneDNN 2.6 has no "
                     "post-op that multiplies by the GELU derivative of a second tensor");
    if (at.grad || Out(f, kBiasGrad) != nullptr)
      return Decline(why, len, "onednn declines grad (bias_grad): no oneDNN matmul epilogue sums op(A)'s rows");
    if (Out(f, kPreGelu) != nullptr)
      return Decline(why, len,
                     "onednn declines pre_gelu_out: a oneDNN post-op chain cannot also store the pre-GELU value");
    if (Out(f, kDAmax) != nullptr) return Decline(why, len, "onednn declines d_amax (no amax output in oneDNN 2.6)");
    for (int i : {kAScaleInv, kBScaleInv, kDScale})
      if (In(f, i) != nullptr)
        return Decline(why, len, std::string("onednn declines FP8 scaling ('") + kInNames[i] + "' given)");
    if (at.accumulate && In(f, kC) != nullptr) return Decline(why, len, "onednn declines C with accumulate");
    for (int i : {kC, kBias}) {
      const DLTensor* t = In(f, i);
      if (t == nullptr) continue;
      const DT dt = DtOf(t);
      if (dt != DT::kF32 && dt != DT::kBF16 && dt != DT::kF16)
        return Decline(why, len,
                       std::string("onednn: '") + kInNames[i] + "' must be float32, bfloat16 or float16, got " +
                           DtypeName(t->dtype));
    }
    for (int i = 0; i < kNumIn; ++i)
      if (In(f, i) != nullptr && !IsCompact(In(f, i)))
        return Decline(why, len,
                       std::string("onednn handles compact row-major tensors only, '") + kInNames[i] + "' is strided");
    for (int i = 0; i < kNumOut; ++i)
      if (Out(f, i) != nullptr && !IsCompact(Out(f, i)))
        return Decline(why, len,
                       std::string("onednn handles compact row-major tensors only, '") + kOutNames[i] + "' is strided");
    return 1;
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

// ---- value scans (parallel over the host's threads) ------------------------------
// max |x| (a NaN counts as infinity) and whether a bfloat16 tensor holds a
// subnormal.
struct ValueScan {
  const void* data;
  DT dt;
  int64_t n;
  std::mutex mu;
  double max_abs = 0;
  bool subnormal = false;
};
constexpr int64_t kScanBlock = 4096;

void ScanBody(void* ctx, int64_t begin, int64_t end) {
  auto* s = static_cast<ValueScan*>(ctx);
  float mx = 0;
  bool nan = false, sub = false;
  const int64_t lo = begin * kScanBlock, hi = std::min(s->n, end * kScanBlock);
  if (s->dt == DT::kBF16) {
    const uint16_t* p = static_cast<const uint16_t*>(s->data);
    for (int64_t i = lo; i < hi; ++i) {
      const uint16_t v = p[i];
      sub |= (v & 0x7f80u) == 0 && (v & 0x7fu) != 0;
      const float x = std::fabs(Bf16ToF32(v));
      nan |= x != x;
      mx = x > mx ? x : mx;
    }
  } else {
    for (int64_t i = lo; i < hi; ++i) {
      const float x = std::fabs(LoadF(s->data, s->dt, i));
      nan |= x != x;
      mx = x > mx ? x : mx;
    }
  }
  const double m = nan ? std::numeric_limits<double>::infinity() : double(mx);
  std::lock_guard<std::mutex> lock(s->mu);
  s->max_abs = std::max(s->max_abs, m);
  s->subnormal |= sub;
}

struct ScanResult {
  double max_abs;
  bool subnormal;
};
ScanResult Scan(const tefl_host_services* host, const void* data, DT dt, int64_t n) {
  ValueScan s{data, dt, n, {}, 0.0, false};
  const int64_t blocks = (n + kScanBlock - 1) / kScanBlock;
  if (blocks > 0) host->parallel_for(blocks, 8, ScanBody, &s);
  return {s.max_abs, s.subnormal};
}

// Per-thread fp32 scratch (beta * C, a converted bias); grows only.
std::vector<float>& Scratch(int which) {
  thread_local std::vector<float> buffers[2];
  return buffers[which];
}

struct ScaleCopy {
  const void* src;
  DT dt;
  float scale;
  float* dst;
  int64_t n;
};
void ScaleCopyBody(void* ctx, int64_t begin, int64_t end) {
  auto* c = static_cast<ScaleCopy*>(ctx);
  const int64_t hi = std::min(c->n, end * kScanBlock);
  for (int64_t i = begin * kScanBlock; i < hi; ++i) c->dst[i] = c->scale * LoadF(c->src, c->dt, i);
}
// dst[0..n) = scale * src (converted to fp32).
float* ScaledF32(const tefl_host_services* host, int which, const DLTensor* t, float scale) {
  const int64_t n = NumElements(t);
  std::vector<float>& buf = Scratch(which);
  if (buf.size() < size_t(n)) buf.resize(size_t(n));
  ScaleCopy c{DataOf(t), DtOf(t), scale, buf.data(), n};
  const int64_t blocks = (n + kScanBlock - 1) / kScanBlock;
  if (blocks > 0) host->parallel_for(blocks, 8, ScaleCopyBody, &c);
  return buf.data();
}

tefl_status* Kernel(const tefl_call_frame* f, void*) noexcept {
  return Guarded(f, "generic_gemm", [&]() -> tefl_status* {
    const tefl_gemm_attrs& at = Attrs(f);
    const DLTensor* a = In(f, kA);
    const DLTensor* b = In(f, kB);
    const DLTensor* c = In(f, kC);
    const DLTensor* bias = In(f, kBias);
    DLTensor* d = Out(f, kD);
    const bool ta = at.transa != 0, tb = at.transb != 0;
    const int64_t m = ta ? a->shape[1] : a->shape[0];
    const int64_t k = ta ? a->shape[0] : a->shape[1];
    const int64_t n = tb ? b->shape[0] : b->shape[1];
    if (m == 0 || n == 0) return nullptr;  // nothing to write
    if (k == 0) throw Unsupported{"K = 0 (D = beta * C + bias): oneDNN's matmul rejects zero dimensions"};
    if (at.alpha == 0.0f)
      throw Unsupported{
          "alpha = 0: the BLAS convention skips the product (a NaN or infinity in A or B must not propagate), "
          "which oneDNN's output scale does not"};
    const DT tab = DtOf(a), td = DtOf(d);
    const bool gelu = at.gelu != 0;
    const bool use_c = c != nullptr && at.beta != 0.0f;
    const bool sum = at.accumulate != 0 && at.beta != 0.0f;

    // Value checks, before anything is written.
    if (tab == DT::kBF16 || gelu) {
      const ScanResult sa = Scan(f->host, DataOf(a), tab, m * k);
      const ScanResult sb = Scan(f->host, DataOf(b), tab, k * n);
      if (sa.subnormal || sb.subnormal)
        throw Unsupported{"a bfloat16 subnormal in A or B (oneDNN's avx512_bf16 kernels read it as zero)"};
      if (gelu) {
        double bound = std::fabs(double(at.alpha)) * double(k) * sa.max_abs * sb.max_abs;
        if (use_c) bound += std::fabs(double(at.beta)) * Scan(f->host, DataOf(c), DtOf(c), m * n).max_abs;
        if (sum) bound += std::fabs(double(at.beta)) * Scan(f->host, DataOf(d), td, m * n).max_abs;
        if (bias) bound += Scan(f->host, DataOf(bias), DtOf(bias), n).max_abs;
        if (!(bound <= kMaxGeluInput))
          throw Unsupported{
              "GELU whose pre-activation may be non-finite or exceed 1e4 in magnitude (bounded from the "
              "inputs), where oneDNN's gelu_tanh is not IEEE-exact"};
      }
    }

    GemmKey key{tab, td, m, n, k, ta, tb, use_c, sum, BiasMode::kNone, gelu, BitsOfFloat(1.0f), 0u};
    if (at.alpha != 1.0f) key.alpha = BitsOfFloat(at.alpha);
    if (sum) key.beta = BitsOfFloat(at.beta);
    if (bias) key.bias = at.alpha == 1.0f ? BiasMode::kMatmul : BiasMode::kPostOp;
    const auto prim = Primitive(key);

    const dnnl::engine& eng = GetState().engine;
    std::unordered_map<int, dnnl::memory> args;
    args.emplace(DNNL_ARG_SRC, dnnl::memory(ADesc(key), eng, DataOf(a)));
    args.emplace(DNNL_ARG_WEIGHTS, dnnl::memory(BDesc(key), eng, DataOf(b)));
    args.emplace(DNNL_ARG_DST, dnnl::memory(DataDesc(td, m, n), eng, DataOf(d)));
    if (use_c) {
      void* cdata = DtOf(c) == DT::kF32 && at.beta == 1.0f ? DataOf(c) : ScaledF32(f->host, 0, c, at.beta);
      args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(CPostOpIndex(key)) | DNNL_ARG_SRC_1,
                   dnnl::memory(DataDesc(DT::kF32, m, n), eng, cdata));
    }
    if (bias) {
      void* bdata = DtOf(bias) == DT::kF32 ? DataOf(bias) : ScaledF32(f->host, 1, bias, 1.0f);
      dnnl::memory bm(RowVecDesc(n), eng, bdata);
      if (key.bias == BiasMode::kMatmul)
        args.emplace(DNNL_ARG_BIAS, bm);
      else
        args.emplace(DNNL_ARG_ATTR_MULTIPLE_POST_OP(BiasPostOpIndex(key)) | DNNL_ARG_SRC_1, bm);
    }
    dnnl::stream& s = ThreadStream();
    prim->execute(s, args);
    s.wait();
    return nullptr;
  });
}

}  // namespace

tefl_status* RegisterGemm(const tefl_registrar* registrar) {
  const tefl_impl_desc desc = VendorDesc("generic_gemm", Kernel, Supports);
  return registrar->register_impl(registrar->ctx, &desc);
}

}  // namespace onednn_plugin
