// Schemas of the GEMM family: generic_gemm and te_general_grouped_gemm
// (spec/ops.md "GEMM", docs/ops-gemm.md). tefl states GEMM in row-major
// terms: D[M, N] = alpha * op(A) op(B) + beta * C (+ bias), op = optional
// transpose. TransformerEngine's column-major calls map onto it by swapping
// the operands (docs/ops-gemm.md has the table).
//
// Flags, and why:
//  - kOpContiguous: the kernels hand compact row-major operands to BLAS with
//    leading dimension = the row length; strided operands are not needed by
//    any TE caller.
//  - kOpNoAlias: D is written while A, B, C and bias are still read.
//  - kOpInPlace: with accumulate the output D is read (its prior content is
//    C), so a failed call is never retried on another implementation.
//  - kOpChecksData (grouped only): the check reads m_splits' contents.
#include <fmt/format.h>

#include <limits>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kFp8 = Bit(DType::kE4M3) | Bit(DType::kE5M2);
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr double kInf = std::numeric_limits<double>::infinity();

bool IsFp8(const DLTensor* t) { return t && (DTypeOf(t->dtype) == DType::kE4M3 || DTypeOf(t->dtype) == DType::kE5M2); }

// ---- generic_gemm -------------------------------------------------------------
// in: A0 B1 C2 bias3 a_scale_inv4 b_scale_inv5 d_scale6; out: D7 pre_gelu_out8 bias_grad9 d_amax10
enum GemmArg { kA, kB, kC, kBias, kAScaleInv, kBScaleInv, kDScale, kD, kPreGelu, kBiasGrad, kDAmax };

constexpr ArgSchema kGemmIn[] = {
    {"A", kF | kFp8, false, "[M, K] ([K, M] with transa)"},
    {"B", kF | kFp8, false, "[K, N] ([N, K] with transb)"},
    {"C", kF, true, "[M, N] (not with accumulate)"},
    {"bias", kF, true, "[N] (not with grad)"},
    {"a_scale_inv", kF32Only, true, "[1], required iff A is FP8"},
    {"b_scale_inv", kF32Only, true, "[1], required iff B is FP8"},
    {"d_scale", kF32Only, true, "[1], required iff D is FP8"},
};
constexpr ArgSchema kGemmOut[] = {
    {"D", kF | kFp8, false, "[M, N]"},
    {"pre_gelu_out", kF, true, "[M, N], only with gelu"},
    {"bias_grad", kF, true, "[M], only with grad"},
    {"d_amax", kF32Only, true, "[1]: max |D| before scaling and conversion"},
};

constexpr AttrSchema kGemmAttrs[] = {
    {"transa", AttrType::kBool, offsetof(tefl_gemm_attrs, transa), 0, 0, 1, 1, "op(A) = A^T (A is [K, M])"},
    {"transb", AttrType::kBool, offsetof(tefl_gemm_attrs, transb), 0, 0, 1, 1, "op(B) = B^T (B is [N, K])"},
    {"alpha", AttrType::kF32, offsetof(tefl_gemm_attrs, alpha), 1.0, -kInf, kInf, 0, "scales op(A) op(B)"},
    {"beta", AttrType::kF32, offsetof(tefl_gemm_attrs, beta), 1.0, -kInf, kInf, 0,
     "scales C (or D's prior content with accumulate)"},
    {"accumulate", AttrType::kBool, offsetof(tefl_gemm_attrs, accumulate), 0, 0, 1, 1,
     "D's prior content takes C's place: D = alpha * op(A) op(B) + beta * D"},
    {"gelu", AttrType::kBool, offsetof(tefl_gemm_attrs, gelu), 0, 0, 1, 1,
     "D = gelu_tanh(pre), pre = alpha * op(A) op(B) + beta * C + bias (to pre_gelu_out)"},
    {"grad", AttrType::kBool, offsetof(tefl_gemm_attrs, grad), 0, 0, 1, 1,
     "bias_grad[M] = sum over k of op(A)[m, k] (TE wgrad: grad_bias = dy.sum(0))"},
    {"use_split_accumulator", AttrType::kBool, offsetof(tefl_gemm_attrs, use_split_accumulator), 0, 0, 1, 0,
     "cuBLAS FP8 hint: accepted, no effect on the CPU (fp32 or wider accumulation)"},
};
constexpr tefl_gemm_attrs kGemmDefaults = {TEFL_GEMM_ATTRS_STRUCT_SIZE, 0, 0, 1.0f, 1.0f, 0, 0, 0, 0};

const char* Name(const DLTensor* t) { return DTypeName(DTypeOf(t->dtype)); }

tefl_status* AttrError(const OpSchema& op, const std::string& what) {
  return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: {}", op.name, what).c_str());
}

tefl_status* CheckShape2(const OpSchema& op, const CallArgs& args, int i, int64_t rows, int64_t cols, const char* why) {
  const DLTensor* t = TensorAt(args, i);
  if (t->ndim != 2 || t->shape[0] != rows || t->shape[1] != cols)
    return ArgError(op, i, fmt::format("expected shape [{}, {}] ({}), got {}", rows, cols, why, ShapeString(t)));
  return nullptr;
}
tefl_status* CheckShape1(const OpSchema& op, const CallArgs& args, int i, int64_t n, const char* why) {
  const DLTensor* t = TensorAt(args, i);
  if (t->ndim != 1 || t->shape[0] != n)
    return ArgError(op, i, fmt::format("expected shape [{}] ({}), got {}", n, why, ShapeString(t)));
  return nullptr;
}

tefl_status* CheckGemm(const OpSchema& op, const CallArgs& args) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(args.attrs);
  const DLTensor* a = TensorAt(args, kA);
  const DLTensor* b = TensorAt(args, kB);
  if (a->ndim != 2) return ArgError(op, kA, fmt::format("expected a matrix (rank 2), got shape {}", ShapeString(a)));
  if (b->ndim != 2) return ArgError(op, kB, fmt::format("expected a matrix (rank 2), got shape {}", ShapeString(b)));
  const int64_t m = at->transa ? a->shape[1] : a->shape[0];
  const int64_t k = at->transa ? a->shape[0] : a->shape[1];
  const int64_t kb = at->transb ? b->shape[1] : b->shape[0];
  const int64_t n = at->transb ? b->shape[0] : b->shape[1];
  if (kb != k)
    return ArgError(op, kB,
                    fmt::format("expected K = {} (from A {}{}) along dim {}{}, got shape {}", k, ShapeString(a),
                                at->transa ? " with transa" : "", at->transb ? 1 : 0,
                                at->transb ? " (transb: B is [N, K])" : " (B is [K, N])", ShapeString(b)));
  // dtypes: FP8 with FP8 (E4M3/E5M2 in any mix), otherwise A and B alike.
  if (IsFp8(a) != IsFp8(b) || (!IsFp8(a) && a->dtype.code != b->dtype.code) ||
      (!IsFp8(a) && a->dtype.bits != b->dtype.bits))
    return ArgError(op, kB,
                    fmt::format("expected {} (A is {}; supported: A and B of one dtype among float32, float16, "
                                "bfloat16, or both FP8 (float8_e4m3fn/float8_e5m2 in any mix)), got {}",
                                IsFp8(a) ? "an FP8 dtype" : Name(a), Name(a), Name(b)));
  const DLTensor* a_si = TensorAt(args, kAScaleInv);
  const DLTensor* b_si = TensorAt(args, kBScaleInv);
  const DLTensor* d_scale = TensorAt(args, kDScale);
  const DLTensor* d = TensorAt(args, kD);
  const struct {
    const DLTensor* scale;
    int index;
    bool needed;
    const char* owner;
    int owner_index;
  } scales[] = {{a_si, kAScaleInv, IsFp8(a), "A", kA},
                {b_si, kBScaleInv, IsFp8(b), "B", kB},
                {d_scale, kDScale, IsFp8(d), "D", kD}};
  for (const auto& s : scales) {
    if (s.needed && s.scale == nullptr)
      return ArgError(op, s.index,
                      fmt::format("is required ([1] fp32): {} is {}", s.owner, Name(TensorAt(args, s.owner_index))));
    if (!s.needed && s.scale != nullptr)
      return ArgError(op, s.index,
                      fmt::format("expected NULL: {} is {}, not FP8", s.owner, Name(TensorAt(args, s.owner_index))));
    if (s.scale) {
      if (tefl_status* e = CheckShape1(op, args, s.index, 1, "one fp32 scale")) return e;
    }
  }
  if (tefl_status* e = CheckShape2(op, args, kD, m, n, "[M, N] of op(A) op(B)")) return e;
  if (at->accumulate && IsFp8(d))
    return ArgError(op, kD, fmt::format("accumulate needs a D of float32, float16 or bfloat16, got {}", Name(d)));
  const DLTensor* c = TensorAt(args, kC);
  if (c != nullptr) {
    if (at->accumulate) return ArgError(op, kC, "expected NULL with accumulate (D's prior content is C)");
    if (tefl_status* e = CheckShape2(op, args, kC, m, n, "[M, N], like D")) return e;
  }
  if (at->gelu && at->grad)
    return AttrError(op,
                     "attributes 'gelu' and 'grad' together (TE's DGELU epilogue) are not supported: run the GEMM "
                     "with grad, then dgelu");
  if (TensorAt(args, kBias) != nullptr) {
    if (at->grad) return ArgError(op, kBias, "expected NULL with grad (the bias gradient is the output 'bias_grad')");
    if (tefl_status* e = CheckShape1(op, args, kBias, n, "N = columns of D")) return e;
  }
  if (TensorAt(args, kPreGelu) != nullptr) {
    if (!at->gelu) return ArgError(op, kPreGelu, "expected NULL without the 'gelu' attribute");
    if (tefl_status* e = CheckShape2(op, args, kPreGelu, m, n, "[M, N], like D")) return e;
  }
  if (TensorAt(args, kBiasGrad) != nullptr) {
    if (!at->grad) return ArgError(op, kBiasGrad, "expected NULL without the 'grad' attribute");
    if (tefl_status* e = CheckShape1(op, args, kBiasGrad, m, "M = rows of D: sum over k of op(A)")) return e;
  }
  if (TensorAt(args, kDAmax) != nullptr) {
    if (tefl_status* e = CheckShape1(op, args, kDAmax, 1, "one fp32 amax")) return e;
  }
  return nullptr;
}

// ---- te_general_grouped_gemm --------------------------------------------------
// in: A0 B1 m_splits2 bias3; out: D4
enum GroupedArg { kGA, kGB, kGSplits, kGBias, kGD };

constexpr ArgSchema kGroupedIn[] = {
    {"A", kF, false, "[sum(m_splits), K]: the groups' rows, one after another"},
    {"B", kF, false, "[G, K, N] ([G, N, K] with transb)"},
    {"m_splits", Bit(DType::kI64), false, "[G] int64 >= 0, host memory"},
    {"bias", kF, true, "[G, N]"},
};
constexpr ArgSchema kGroupedOut[] = {
    {"D", kF, false, "[sum(m_splits), N]"},
};

tefl_status* CheckGrouped(const OpSchema& op, const CallArgs& args) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(args.attrs);
  if (at->transa)
    return AttrError(op, "attribute 'transa' is not supported: A holds the groups' rows one after another");
  if (at->grad) return AttrError(op, "attribute 'grad' is not supported by the grouped GEMM");
  const DLTensor* a = TensorAt(args, kGA);
  const DLTensor* b = TensorAt(args, kGB);
  const DLTensor* s = TensorAt(args, kGSplits);
  if (a->ndim != 2)
    return ArgError(op, kGA, fmt::format("expected rank 2 ([sum(m_splits), K]), got {}", ShapeString(a)));
  if (b->ndim != 3)
    return ArgError(
        op, kGB, fmt::format("expected rank 3 ({}), got {}", at->transb ? "[G, N, K]" : "[G, K, N]", ShapeString(b)));
  if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits)
    return ArgError(op, kGB, fmt::format("expected {} like A, got {}", Name(a), Name(b)));
  const int64_t g = b->shape[0];
  const int64_t k = a->shape[1];
  const int64_t kb = at->transb ? b->shape[2] : b->shape[1];
  const int64_t n = at->transb ? b->shape[1] : b->shape[2];
  if (kb != k)
    return ArgError(op, kGB,
                    fmt::format("expected K = {} (columns of A) along dim {}, got shape {}", k, at->transb ? 2 : 1,
                                ShapeString(b)));
  if (tefl_status* e = CheckShape1(op, args, kGSplits, g, "G = groups of B")) return e;
  const auto* splits = static_cast<const int64_t*>(DataPtr(s));
  int64_t total = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (splits[i] < 0 || splits[i] > a->shape[0])
      return ArgError(op, kGSplits, fmt::format("expected m_splits[{}] in [0, {}], got {}", i, a->shape[0], splits[i]));
    total += splits[i];
  }
  if (total != a->shape[0])
    return ArgError(op, kGSplits,
                    fmt::format("expected a sum of {} (rows of A {}), got {}", a->shape[0], ShapeString(a), total));
  if (TensorAt(args, kGBias) != nullptr) {
    if (tefl_status* e = CheckShape2(op, args, kGBias, g, n, "[G, N]")) return e;
  }
  return CheckShape2(op, args, kGD, a->shape[0], n, "[sum(m_splits), N]");
}

constexpr uint32_t kGemmFlags = kOpNoAlias | kOpContiguous | kOpInPlace;

const OpSchema kSchemas[] = {
    {TEFL_OP_GENERIC_GEMM,
     "generic_gemm",
     "gemm",
     "Row-major D[M, N] = epilogue(alpha * op(A) op(B) + beta * C + bias); FP8 inputs with scale_inv, FP8 D with "
     "d_scale and d_amax; GELU (pre_gelu_out), accumulate, grad (bias_grad)",
     kGemmIn,
     kGemmOut,
     kGemmAttrs,
     TEFL_GEMM_ATTRS_STRUCT_SIZE,
     &kGemmDefaults,
     kGemmFlags,
     CheckGemm,
     {}},
    {TEFL_OP_TE_GENERAL_GROUPED_GEMM,
     "te_general_grouped_gemm",
     "gemm",
     "G independent GEMMs (MoE experts): rows of A split by m_splits, D_g = epilogue(alpha * A_g op(B_g) + beta * "
     "D_g + bias_g)",
     kGroupedIn,
     kGroupedOut,
     kGemmAttrs,
     TEFL_GEMM_ATTRS_STRUCT_SIZE,
     &kGemmDefaults,
     kGemmFlags | kOpChecksData,
     CheckGrouped,
     {}},
};

}  // namespace

std::span<const OpSchema> GemmSchemas() { return kSchemas; }

}  // namespace tefl
