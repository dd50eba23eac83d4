// Schemas of the normalization family: layernorm_fwd/bwd, rmsnorm_fwd/bwd,
// rmsnorm_bwd_add (TransformerEngine's maths, spec/ops.md).
#include <limits>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr double kMaxFinite = std::numeric_limits<float>::max();

constexpr ArgSchema kLnFwdIn[] = {
    {"x", kF, false, "[N..., H]"}, {"gamma", kF, false, "[H]"}, {"beta", kF, false, "[H]"}};
constexpr ArgSchema kLnFwdOut[] = {{"z", kF, false, "like x"},
                                   {"mu", kF32Only, false, "[N] or x.shape[:-1]"},
                                   {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"}};
constexpr ArgSchema kRmsFwdIn[] = {{"x", kF, false, "[N..., H]"}, {"gamma", kF, false, "[H]"}};
constexpr ArgSchema kRmsFwdOut[] = {{"z", kF, false, "like x"}, {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"}};
constexpr ArgSchema kLnBwdIn[] = {{"dz", kF, false, "like x"},
                                  {"x", kF, false, "[N..., H]"},
                                  {"mu", kF32Only, false, "[N] or x.shape[:-1]"},
                                  {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"},
                                  {"gamma", kF, false, "[H]"}};
constexpr ArgSchema kLnBwdOut[] = {
    {"dx", kF, false, "like x"}, {"dgamma", kF, false, "[H]"}, {"dbeta", kF, false, "[H]"}};
constexpr ArgSchema kRmsBwdIn[] = {{"dz", kF, false, "like x"},
                                   {"x", kF, false, "[N..., H]"},
                                   {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"},
                                   {"gamma", kF, false, "[H]"}};
constexpr ArgSchema kRmsBwdAddIn[] = {{"dz", kF, false, "like x"},
                                      {"x", kF, false, "[N..., H]"},
                                      {"add", kF, false, "like x"},
                                      {"rsigma", kF32Only, false, "[N] or x.shape[:-1]"},
                                      {"gamma", kF, false, "[H]"}};
constexpr ArgSchema kRmsBwdOut[] = {{"dx", kF, false, "like x"}, {"dgamma", kF, false, "[H]"}};

constexpr AttrSchema kFwdAttrs[] = {
    {"eps", AttrType::kF32, offsetof(tefl_norm_fwd_attrs, eps), 1e-5, 0.0, kMaxFinite, 0,
     "added to the variance before the square root (finite: inf would turn every output into 0)"},
    {"zero_centered_gamma", AttrType::kBool, offsetof(tefl_norm_fwd_attrs, zero_centered_gamma), 0, 0, 1, 1,
     "apply gamma + 1"},
    {"sm_margin", AttrType::kI32, offsetof(tefl_norm_fwd_attrs, sm_margin), 0, 0, 1 << 20, 0,
     "SMs left free by CUDA kernels; ignored on the CPU"},
};
constexpr AttrSchema kBwdAttrs[] = {
    {"zero_centered_gamma", AttrType::kBool, offsetof(tefl_norm_bwd_attrs, zero_centered_gamma), 0, 0, 1, 1,
     "apply gamma + 1"},
    {"sm_margin", AttrType::kI32, offsetof(tefl_norm_bwd_attrs, sm_margin), 0, 0, 1 << 20, 0,
     "SMs left free by CUDA kernels; ignored on the CPU"},
};
constexpr tefl_norm_fwd_attrs kFwdDefaults = {TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};
constexpr tefl_norm_bwd_attrs kBwdDefaults = {TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};

// ---- shape relations --------------------------------------------------------
bool SameShape(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

// Each norm call is described by the index of x, of tensors shaped like x,
// of per-row statistics and of per-column vectors (counts, then indices).
struct NormLayout {
  int x;
  int n_like_x, like_x[3];
  int n_stats, stats[2];
  int n_cols, cols[3];
};

tefl_status* CheckNorm(const OpSchema& op, const CallArgs& args, const NormLayout& l) {
  const DLTensor* x = TensorAt(args, l.x);
  if (x->ndim < 1) return ArgError(op, l.x, "expected rank >= 1 ([N..., H]), got a scalar");
  const int64_t h = x->shape[x->ndim - 1];
  if (h < 1)
    return ArgError(op, l.x, fmt::format("expected hidden size (last dim) >= 1, got shape {}", ShapeString(x)));
  int64_t rows = 1;
  for (int d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
  for (int k = 0; k < l.n_like_x; ++k) {
    const DLTensor* t = TensorAt(args, l.like_x[k]);
    if (!SameShape(t, x))
      return ArgError(op, l.like_x[k],
                      fmt::format("expected shape {} (that of 'x'), got {}", ShapeString(x), ShapeString(t)));
  }
  for (int k = 0; k < l.n_stats; ++k) {
    const DLTensor* t = TensorAt(args, l.stats[k]);
    bool ok = t->ndim == 1 && t->shape[0] == rows;
    if (!ok && t->ndim == x->ndim - 1) {  // x.shape[:-1] is accepted too
      ok = true;
      for (int d = 0; d < t->ndim; ++d) ok = ok && t->shape[d] == x->shape[d];
    }
    if (!ok)
      return ArgError(
          op, l.stats[k],
          fmt::format("expected shape [{}] (N = rows of 'x' {}), got {}", rows, ShapeString(x), ShapeString(t)));
  }
  for (int k = 0; k < l.n_cols; ++k) {
    const DLTensor* t = TensorAt(args, l.cols[k]);
    if (t->ndim != 1 || t->shape[0] != h)
      return ArgError(op, l.cols[k],
                      fmt::format("expected shape [{}] (H = last dim of 'x'), got {}", h, ShapeString(t)));
  }
  return nullptr;
}

// Argument indices: inputs first, then outputs.
template <const NormLayout& kLayout>
tefl_status* CheckNormOf(const OpSchema& op, const CallArgs& a) {
  return CheckNorm(op, a, kLayout);
}
// in: x0 gamma1 beta2; out: z3 mu4 rsigma5
constexpr NormLayout kLayerNormFwd = {0, 1, {3}, 2, {4, 5}, 2, {1, 2}};
// in: x0 gamma1; out: z2 rsigma3
constexpr NormLayout kRmsNormFwd = {0, 1, {2}, 1, {3}, 1, {1}};
// in: dz0 x1 mu2 rsigma3 gamma4; out: dx5 dgamma6 dbeta7
constexpr NormLayout kLayerNormBwd = {1, 2, {0, 5}, 2, {2, 3}, 3, {4, 6, 7}};
// in: dz0 x1 rsigma2 gamma3; out: dx4 dgamma5
constexpr NormLayout kRmsNormBwd = {1, 2, {0, 4}, 1, {2}, 2, {3, 5}};
// in: dz0 x1 add2 rsigma3 gamma4; out: dx5 dgamma6
constexpr NormLayout kRmsNormBwdAdd = {1, 3, {0, 2, 5}, 1, {3}, 2, {4, 6}};
constexpr ShapeCheckFn CheckLayerNormFwd = CheckNormOf<kLayerNormFwd>;
constexpr ShapeCheckFn CheckRmsNormFwd = CheckNormOf<kRmsNormFwd>;
constexpr ShapeCheckFn CheckLayerNormBwd = CheckNormOf<kLayerNormBwd>;
constexpr ShapeCheckFn CheckRmsNormBwd = CheckNormOf<kRmsNormBwd>;
constexpr ShapeCheckFn CheckRmsNormBwdAdd = CheckNormOf<kRmsNormBwdAdd>;

constexpr uint32_t kNormFlags = kOpNoAlias | kOpContiguous;

const OpSchema kSchemas[] = {
    {TEFL_OP_LAYERNORM_FWD,
     "layernorm_fwd",
     "normalization",
     "LayerNorm forward: z = (x - mean) * rsigma * g + beta, g = gamma (+1 if zero_centered_gamma)",
     kLnFwdIn,
     kLnFwdOut,
     kFwdAttrs,
     TEFL_NORM_FWD_ATTRS_STRUCT_SIZE,
     &kFwdDefaults,
     kNormFlags,
     CheckLayerNormFwd,
     {}},
    {TEFL_OP_LAYERNORM_BWD,
     "layernorm_bwd",
     "normalization",
     "LayerNorm backward: dx, dgamma, dbeta",
     kLnBwdIn,
     kLnBwdOut,
     kBwdAttrs,
     TEFL_NORM_BWD_ATTRS_STRUCT_SIZE,
     &kBwdDefaults,
     kNormFlags,
     CheckLayerNormBwd,
     {}},
    {TEFL_OP_RMSNORM_FWD,
     "rmsnorm_fwd",
     "normalization",
     "RMSNorm forward: z = x * rsigma * g, rsigma = 1/sqrt(mean(x^2) + eps)",
     kRmsFwdIn,
     kRmsFwdOut,
     kFwdAttrs,
     TEFL_NORM_FWD_ATTRS_STRUCT_SIZE,
     &kFwdDefaults,
     kNormFlags,
     CheckRmsNormFwd,
     {}},
    {TEFL_OP_RMSNORM_BWD,
     "rmsnorm_bwd",
     "normalization",
     "RMSNorm backward: dx, dgamma",
     kRmsBwdIn,
     kRmsBwdOut,
     kBwdAttrs,
     TEFL_NORM_BWD_ATTRS_STRUCT_SIZE,
     &kBwdDefaults,
     kNormFlags,
     CheckRmsNormBwd,
     {}},
    {TEFL_OP_RMSNORM_BWD_ADD,
     "rmsnorm_bwd_add",
     "normalization",
     "RMSNorm backward with a residual gradient added to dx; dx may alias add (in place)",
     kRmsBwdAddIn,
     kRmsBwdOut,
     kBwdAttrs,
     TEFL_NORM_BWD_ATTRS_STRUCT_SIZE,
     &kBwdDefaults,
     kNormFlags,
     CheckRmsNormBwdAdd,
     {},
     /*inplace_output=*/0,
     /*inplace_input=*/2},
};

}  // namespace

std::span<const OpSchema> NormalizationSchemas() { return kSchemas; }

}  // namespace tefl
