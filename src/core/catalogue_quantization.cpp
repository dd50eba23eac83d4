// Schemas of the FP8 quantization family (spec/ops.md "FP8 and scaling
// recipes"): quantize, dequantize, compute_amax, compute_scale_from_amax,
// fused_amax_and_scale_update_after_reduction, fp8_transpose; and the fused
// FP8-output variants of rmsnorm/layernorm forward (family "normalization")
// and of the gated activations (family "activation"), which live here so that
// the FP8 contract (scale in; amax, scale_inv out) is written once.
#include <cfloat>
#include <limits>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr DTypeSet kFp8 = Bit(DType::kE4M3) | Bit(DType::kE5M2);
constexpr double kInf = std::numeric_limits<double>::infinity();

// ---- arguments ------------------------------------------------------------------
constexpr ArgSchema kQuantizeIn[] = {{"x", kF, false, "[any]"}, {"scale", kF32Only, false, "[1]"}};
constexpr ArgSchema kQuantizeOut[] = {{"q", kFp8, false, "like x (E4M3 or E5M2: the dtype picks the format)"},
                                      {"amax", kF32Only, false, "[1]"},
                                      {"scale_inv", kF32Only, false, "[1]"}};
constexpr ArgSchema kDequantizeIn[] = {{"q", kFp8, false, "[any]"}, {"scale_inv", kF32Only, false, "[1]"}};
constexpr ArgSchema kDequantizeOut[] = {{"x", kF, false, "like q"}};
constexpr ArgSchema kAmaxIn[] = {{"x", kF, false, "[any]"}};
constexpr ArgSchema kAmaxOut[] = {{"amax", kF32Only, false, "[1]"}};
constexpr ArgSchema kScaleIn[] = {{"amax", kF32Only, false, "[n]"}};
constexpr ArgSchema kScaleOut[] = {{"scale", kF32Only, false, "[n]"}, {"scale_inv", kF32Only, false, "[n]"}};
constexpr ArgSchema kDelayedIn[] = {{"amax_history", kF32Only, false, "[len, n]"}, {"scale", kF32Only, false, "[n]"}};
constexpr ArgSchema kDelayedOut[] = {{"new_amax_history", kF32Only, false, "[len, n]; may alias amax_history"},
                                     {"new_scale", kF32Only, false, "[n]"}};
constexpr ArgSchema kTransposeIn[] = {{"q", kFp8, false, "[M, N]"}};
constexpr ArgSchema kTransposeOut[] = {{"qT", kFp8, false, "[N, M], dtype of q"}};

constexpr ArgSchema kRmsFp8In[] = {
    {"x", kF, false, "[N..., H]"}, {"gamma", kF, false, "[H]"}, {"scale", kF32Only, false, "[1]"}};
constexpr ArgSchema kRmsFp8Out[] = {{"z", kFp8, false, "like x, E4M3 or E5M2"},
                                    {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"},
                                    {"amax", kF32Only, false, "[1]"},
                                    {"scale_inv", kF32Only, false, "[1]"}};
constexpr ArgSchema kLnFp8In[] = {{"x", kF, false, "[N..., H]"},
                                  {"gamma", kF, false, "[H]"},
                                  {"beta", kF, false, "[H]"},
                                  {"scale", kF32Only, false, "[1]"}};
constexpr ArgSchema kLnFp8Out[] = {{"z", kFp8, false, "like x, E4M3 or E5M2"},
                                   {"mu", kF32Only, false, "[N] or x.shape[:-1]"},
                                   {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"},
                                   {"amax", kF32Only, false, "[1]"},
                                   {"scale_inv", kF32Only, false, "[1]"}};
constexpr ArgSchema kGatedFp8In[] = {{"input", kF, false, "[N..., 2H]"}, {"scale", kF32Only, false, "[1]"}};
constexpr ArgSchema kGatedFp8Out[] = {{"output", kFp8, false, "[N..., H], E4M3 or E5M2"},
                                      {"amax", kF32Only, false, "[1]"},
                                      {"scale_inv", kF32Only, false, "[1]"}};

// ---- attributes -----------------------------------------------------------------
constexpr AttrSchema kScaleAttrs[] = {
    {"fp8_format", AttrType::kI32, offsetof(tefl_compute_scale_attrs, fp8_format), 0, 0, 1, 0,
     "0 = E4M3 (fp8_max 448), 1 = E5M2 (fp8_max 57344)"},
    {"epsilon", AttrType::kF32, offsetof(tefl_compute_scale_attrs, epsilon), 0.0, 0.0, kInf, 0,
     "amax is raised to at least epsilon"},
    {"force_pow_2_scales", AttrType::kBool, offsetof(tefl_compute_scale_attrs, force_pow_2_scales), 0, 0, 1, 0,
     "round scale down to a power of two (float bits & 0xFF800000)"},
};
constexpr tefl_compute_scale_attrs kScaleDefaults = {TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE, TEFL_FP8_E4M3, 0.0f, 0};

constexpr AttrSchema kDelayedAttrs[] = {
    {"amax_compute_algo", AttrType::kI32, offsetof(tefl_delayed_scaling_attrs, amax_compute_algo), 0, 0, 1, 0,
     "0 = max over the history, 1 = most recent (row 0)"},
    {"fp8_format", AttrType::kI32, offsetof(tefl_delayed_scaling_attrs, fp8_format), 0, 0, 1, 0,
     "0 = E4M3 (fp8_max 448), 1 = E5M2 (fp8_max 57344)"},
    {"margin", AttrType::kF32, offsetof(tefl_delayed_scaling_attrs, margin), 0.0, -double(FLT_MAX), double(FLT_MAX), 0,
     "scale = fp8_max * 2^-margin / amax"},
};
constexpr tefl_delayed_scaling_attrs kDelayedDefaults = {TEFL_DELAYED_SCALING_ATTRS_STRUCT_SIZE, TEFL_AMAX_ALGO_MAX,
                                                         TEFL_FP8_E4M3, 0.0f};

constexpr AttrSchema kNormAttrs[] = {
    {"eps", AttrType::kF32, offsetof(tefl_norm_fwd_attrs, eps), 1e-5, 0.0, kInf, 0,
     "added to the variance before the square root"},
    {"zero_centered_gamma", AttrType::kBool, offsetof(tefl_norm_fwd_attrs, zero_centered_gamma), 0, 0, 1, 1,
     "apply gamma + 1"},
    {"sm_margin", AttrType::kI32, offsetof(tefl_norm_fwd_attrs, sm_margin), 0, 0, 1 << 20, 0,
     "SMs left free by CUDA kernels; ignored on the CPU"},
};
constexpr tefl_norm_fwd_attrs kNormDefaults = {TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};

constexpr AttrSchema kClampedAttrs[] = {
    {"limit", AttrType::kF32, offsetof(tefl_clamped_swiglu_attrs, limit), 7.0,
     double(std::numeric_limits<float>::denorm_min()), kInf, 0,
     "clamp bound (> 0): a = min(a, limit), b = clamp(b, -limit, limit) + 1"},
    {"alpha", AttrType::kF32, offsetof(tefl_clamped_swiglu_attrs, alpha), double(1.702f), -double(FLT_MAX),
     double(FLT_MAX), 0, "sigmoid slope (finite): a * sigmoid(alpha * a)"},
};
constexpr tefl_clamped_swiglu_attrs kClampedDefaults = {TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 7.0f, 1.702f};

// ---- shape relations --------------------------------------------------------------
bool SameShape(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

// A one-element tensor: [1] (a scalar [] is accepted too).
tefl_status* ExpectOne(const OpSchema& op, const CallArgs& a, int i) {
  const DLTensor* t = TensorAt(a, i);
  if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) return nullptr;
  return ArgError(op, i, fmt::format("expected shape [1] (one fp32 value), got {}", ShapeString(t)));
}

tefl_status* ExpectSameShape(const OpSchema& op, const CallArgs& a, int i, int like) {
  const DLTensor* t = TensorAt(a, i);
  const DLTensor* x = TensorAt(a, like);
  if (SameShape(t, x)) return nullptr;
  return ArgError(
      op, i,
      fmt::format("expected shape {} (that of '{}'), got {}", ShapeString(x), ArgAt(op, like).name, ShapeString(t)));
}

// quantize: x0 scale1 -> q2 amax3 scale_inv4
tefl_status* CheckQuantize(const OpSchema& op, const CallArgs& a) {
  if (tefl_status* e = ExpectOne(op, a, 1)) return e;
  if (tefl_status* e = ExpectSameShape(op, a, 2, 0)) return e;
  if (tefl_status* e = ExpectOne(op, a, 3)) return e;
  return ExpectOne(op, a, 4);
}
// dequantize: q0 scale_inv1 -> x2
tefl_status* CheckDequantize(const OpSchema& op, const CallArgs& a) {
  if (tefl_status* e = ExpectOne(op, a, 1)) return e;
  return ExpectSameShape(op, a, 2, 0);
}
// compute_amax: x0 -> amax1
tefl_status* CheckAmax(const OpSchema& op, const CallArgs& a) { return ExpectOne(op, a, 1); }

// compute_scale_from_amax: amax0 [n] -> scale1 [n], scale_inv2 [n]
tefl_status* CheckScale(const OpSchema& op, const CallArgs& a) {
  const DLTensor* amax = TensorAt(a, 0);
  if (amax->ndim != 1) return ArgError(op, 0, fmt::format("expected rank 1 ([n]), got shape {}", ShapeString(amax)));
  if (tefl_status* e = ExpectSameShape(op, a, 1, 0)) return e;
  return ExpectSameShape(op, a, 2, 0);
}

// delayed: amax_history0 [len, n], scale1 [n] -> new_amax_history2, new_scale3
tefl_status* CheckDelayed(const OpSchema& op, const CallArgs& a) {
  const DLTensor* h = TensorAt(a, 0);
  if (h->ndim != 2) return ArgError(op, 0, fmt::format("expected rank 2 ([len, n]), got shape {}", ShapeString(h)));
  if (h->shape[0] < 1)
    return ArgError(op, 0, fmt::format("expected a history length (dim 0) >= 1, got shape {}", ShapeString(h)));
  const DLTensor* s = TensorAt(a, 1);
  if (s->ndim != 1 || s->shape[0] != h->shape[1])
    return ArgError(op, 1,
                    fmt::format("expected shape [{}] (n = dim 1 of 'amax_history' {}), got {}", h->shape[1],
                                ShapeString(h), ShapeString(s)));
  if (tefl_status* e = ExpectSameShape(op, a, 2, 0)) return e;
  return ExpectSameShape(op, a, 3, 1);
}

// fp8_transpose: q0 [M, N] -> qT1 [N, M], same dtype
tefl_status* CheckTranspose(const OpSchema& op, const CallArgs& a) {
  const DLTensor* q = TensorAt(a, 0);
  const DLTensor* t = TensorAt(a, 1);
  if (q->ndim != 2) return ArgError(op, 0, fmt::format("expected rank 2 ([M, N]), got shape {}", ShapeString(q)));
  if (t->ndim != 2 || t->shape[0] != q->shape[1] || t->shape[1] != q->shape[0])
    return ArgError(op, 1,
                    fmt::format("expected shape [{}, {}] (the transpose of 'q' {}), got {}", q->shape[1], q->shape[0],
                                ShapeString(q), ShapeString(t)));
  if (DTypeOf(t->dtype) != DTypeOf(q->dtype))
    return ArgError(op, 1,
                    fmt::format("expected dtype {} (that of 'q'), got {}", DTypeName(DTypeOf(q->dtype)),
                                DTypeName(DTypeOf(t->dtype))));
  return nullptr;
}

// Fused norms. rmsnorm_fwd_fp8: x0 gamma1 scale2 -> z3 rsigma4 amax5 scale_inv6;
// layernorm_fwd_fp8: x0 gamma1 beta2 scale3 -> z4 mu5 rsigma6 amax7 scale_inv8.
template <bool kLayerNorm>
tefl_status* CheckNormFp8(const OpSchema& op, const CallArgs& a) {
  const DLTensor* x = TensorAt(a, 0);
  if (x->ndim < 1) return ArgError(op, 0, "expected rank >= 1 ([N..., H]), got a scalar");
  const int64_t h = x->shape[x->ndim - 1];
  if (h < 1) return ArgError(op, 0, fmt::format("expected hidden size (last dim) >= 1, got shape {}", ShapeString(x)));
  int64_t rows = 1;
  for (int d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
  const int ncols = kLayerNorm ? 2 : 1;
  for (int i = 1; i <= ncols; ++i) {
    const DLTensor* t = TensorAt(a, i);
    if (t->ndim != 1 || t->shape[0] != h)
      return ArgError(op, i, fmt::format("expected shape [{}] (H = last dim of 'x'), got {}", h, ShapeString(t)));
  }
  const int scale = ncols + 1, z = scale + 1;
  if (tefl_status* e = ExpectOne(op, a, scale)) return e;
  if (tefl_status* e = ExpectSameShape(op, a, z, 0)) return e;
  const int nstats = kLayerNorm ? 2 : 1;
  for (int k = 0; k < nstats; ++k) {
    const int i = z + 1 + k;
    const DLTensor* t = TensorAt(a, i);
    bool ok = t->ndim == 1 && t->shape[0] == rows;
    if (!ok && t->ndim == x->ndim - 1) {  // x.shape[:-1] is accepted too
      ok = true;
      for (int d = 0; d < t->ndim; ++d) ok = ok && t->shape[d] == x->shape[d];
    }
    if (!ok)
      return ArgError(
          op, i, fmt::format("expected shape [{}] (N = rows of 'x' {}), got {}", rows, ShapeString(x), ShapeString(t)));
  }
  if (tefl_status* e = ExpectOne(op, a, z + 1 + nstats)) return e;
  return ExpectOne(op, a, z + 2 + nstats);
}

// Fused gated activations: input0 [N..., 2H] scale1 -> output2 [N..., H] amax3 scale_inv4
tefl_status* CheckGatedFp8(const OpSchema& op, const CallArgs& a) {
  const DLTensor* x = TensorAt(a, 0);
  if (x->ndim < 1) return ArgError(op, 0, "expected rank >= 1 ([N..., 2H]), got a scalar");
  const int64_t last = x->shape[x->ndim - 1];
  if (last % 2 != 0)
    return ArgError(op, 0,
                    fmt::format("expected an even last dim (2H: the activation half then the gate half), got shape {}",
                                ShapeString(x)));
  if (tefl_status* e = ExpectOne(op, a, 1)) return e;
  const DLTensor* y = TensorAt(a, 2);
  bool ok = y->ndim == x->ndim && y->shape[x->ndim - 1] == last / 2;
  for (int d = 0; ok && d + 1 < x->ndim; ++d) ok = y->shape[d] == x->shape[d];
  if (!ok) {
    std::string want = "[";
    for (int d = 0; d + 1 < x->ndim; ++d) want += std::to_string(x->shape[d]) + ", ";
    want += std::to_string(last / 2) + "]";
    return ArgError(op, 2,
                    fmt::format("expected shape {} (H = half the last dim of 'input' {}), got {}", want, ShapeString(x),
                                ShapeString(y)));
  }
  if (tefl_status* e = ExpectOne(op, a, 3)) return e;
  return ExpectOne(op, a, 4);
}

constexpr uint32_t kFlags = kOpNoAlias | kOpContiguous;

OpSchema Make(int32_t id, const char* name, const char* family, const char* doc, std::span<const ArgSchema> in,
              std::span<const ArgSchema> out, ShapeCheckFn check) {
  OpSchema s{};
  s.id = id;
  s.name = name;
  s.family = family;
  s.doc = doc;
  s.inputs = in;
  s.outputs = out;
  s.attrs = {};
  s.attrs_size = 0;
  s.attrs_defaults = nullptr;
  s.flags = kFlags;
  s.check_shapes = check;
  s.aliases = {};
  return s;
}
OpSchema WithAttrs(OpSchema s, std::span<const AttrSchema> attrs, size_t size, const void* defaults) {
  s.attrs = attrs;
  s.attrs_size = size;
  s.attrs_defaults = defaults;
  return s;
}
OpSchema Norm(int32_t id, const char* name, const char* doc, std::span<const ArgSchema> in,
              std::span<const ArgSchema> out, ShapeCheckFn check) {
  return WithAttrs(Make(id, name, "normalization", doc, in, out, check), kNormAttrs, TEFL_NORM_FWD_ATTRS_STRUCT_SIZE,
                   &kNormDefaults);
}
OpSchema Gated(int32_t id, const char* name, const char* doc) {
  return Make(id, name, "activation", doc, kGatedFp8In, kGatedFp8Out, CheckGatedFp8);
}

const OpSchema* Table() {
  static const OpSchema kSchemas[] = {
      Make(TEFL_OP_QUANTIZE, "quantize", "quantization",
           "q = fp8(x * scale) (RNE, saturating, NaN kept; format = q's dtype), amax = max|x|, scale_inv = 1/scale",
           kQuantizeIn, kQuantizeOut, CheckQuantize),
      Make(TEFL_OP_DEQUANTIZE, "dequantize", "quantization", "x = q * scale_inv, rounded once to x's dtype",
           kDequantizeIn, kDequantizeOut, CheckDequantize),
      Make(TEFL_OP_COMPUTE_AMAX, "compute_amax", "quantization", "amax = max|x| (NaN if x holds a NaN; 0 if empty)",
           kAmaxIn, kAmaxOut, CheckAmax),
      WithAttrs(Make(TEFL_OP_COMPUTE_SCALE_FROM_AMAX, "compute_scale_from_amax", "quantization",
                     "current scaling: scale = fp8_max / max(amax, epsilon) (1 if 0/inf/NaN, FLT_MAX if inf), "
                     "optionally a power of two; scale_inv = 1/scale",
                     kScaleIn, kScaleOut, CheckScale),
                kScaleAttrs, TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE, &kScaleDefaults),
      [] {
        OpSchema s = WithAttrs(Make(TEFL_OP_FUSED_AMAX_AND_SCALE_UPDATE_AFTER_REDUCTION,
                                    "fused_amax_and_scale_update_after_reduction", "quantization",
                                    "delayed scaling: roll the amax history by -1 and zero row 0; scale = fp8_max * "
                                    "2^-margin / amax (max or most recent); new_amax_history may alias amax_history",
                                    kDelayedIn, kDelayedOut, CheckDelayed),
                               kDelayedAttrs, TEFL_DELAYED_SCALING_ATTRS_STRUCT_SIZE, &kDelayedDefaults);
        s.inplace_output = 0;
        s.inplace_input = 0;
        return s;
      }(),
      Make(TEFL_OP_FP8_TRANSPOSE, "fp8_transpose", "quantization", "qT = transpose of the FP8 matrix q (bytes moved)",
           kTransposeIn, kTransposeOut, CheckTranspose),
      Norm(TEFL_OP_RMSNORM_FWD_FP8, "rmsnorm_fwd_fp8",
           "RMSNorm forward with FP8 output: z = fp8(x * rsigma * g * scale), amax = max|x * rsigma * g|", kRmsFp8In,
           kRmsFp8Out, CheckNormFp8<false>),
      Norm(TEFL_OP_LAYERNORM_FWD_FP8, "layernorm_fwd_fp8",
           "LayerNorm forward with FP8 output: z = fp8(((x - mu) * rsigma * g + beta) * scale), amax before scaling",
           kLnFp8In, kLnFp8Out, CheckNormFp8<true>),
      Gated(TEFL_OP_GLU_FP8, "glu_fp8", "GLU with FP8 output: fp8(sigmoid(a) * b * scale), amax before scaling"),
      Gated(TEFL_OP_GEGLU_FP8, "geglu_fp8", "GeGLU with FP8 output: fp8(gelu(a) * b * scale)"),
      Gated(TEFL_OP_QGEGLU_FP8, "qgeglu_fp8", "Quick GeGLU with FP8 output: fp8(qgelu(a) * b * scale)"),
      Gated(TEFL_OP_REGLU_FP8, "reglu_fp8", "ReGLU with FP8 output: fp8(relu(a) * b * scale)"),
      Gated(TEFL_OP_SREGLU_FP8, "sreglu_fp8", "Squared ReGLU with FP8 output: fp8(srelu(a) * b * scale)"),
      Gated(TEFL_OP_SWIGLU_FP8, "swiglu_fp8", "SwiGLU with FP8 output: fp8(silu(a) * b * scale)"),
      WithAttrs(Gated(TEFL_OP_CLAMPED_SWIGLU_FP8, "clamped_swiglu_fp8",
                      "Clamped SwiGLU with FP8 output: fp8(a' sigmoid(alpha a') b' * scale)"),
                kClampedAttrs, TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, &kClampedDefaults),
  };
  return kSchemas;
}
constexpr size_t kNumSchemas = 15;

}  // namespace

std::span<const OpSchema> QuantizationSchemas() { return {Table(), kNumSchemas}; }

}  // namespace tefl
