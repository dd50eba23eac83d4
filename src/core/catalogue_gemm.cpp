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
    {"pre_gelu_out", kF, true, "[M, N], only with gelu (an input, required, with gelu and grad)"},
    {"bias_grad", kF, true, "[M], only with grad ([N]: column sums of D with gelu and grad)"},
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

// One fp32 value: [1], or a scalar [] (as the quantization ops take and
// return it: a 0-d scale_inv from quantize feeds generic_gemm as is).
tefl_status* CheckOneValue(const OpSchema& op, const CallArgs& args, int i, const char* why) {
  const DLTensor* t = TensorAt(args, i);
  if (t->ndim == 0 || (t->ndim == 1 && t->shape[0] == 1)) return nullptr;
  return ArgError(op, i, fmt::format("expected shape [1] or [] ({}), got {}", why, ShapeString(t)));
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
      if (tefl_status* e = CheckOneValue(op, args, s.index, "one fp32 scale")) return e;
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
  const bool dgelu = at->gelu && at->grad;  // TE's DGELU epilogue: pre_gelu_out is an input
  if (TensorAt(args, kBias) != nullptr) {
    if (at->grad) return ArgError(op, kBias, "expected NULL with grad (the bias gradient is the output 'bias_grad')");
    if (tefl_status* e = CheckShape1(op, args, kBias, n, "N = columns of D")) return e;
  }
  if (TensorAt(args, kPreGelu) != nullptr) {
    if (!at->gelu) return ArgError(op, kPreGelu, "expected NULL without the 'gelu' attribute");
    if (tefl_status* e = CheckShape2(
            op, args, kPreGelu, m, n,
            dgelu ? "[M, N]: the forward's pre-GELU values, an input with gelu and grad" : "[M, N], like D"))
      return e;
  } else if (dgelu) {
    return ArgError(op, kPreGelu,
                    fmt::format("is required with 'gelu' and 'grad' (TE's DGELU epilogue reads the forward's "
                                "pre-GELU values): expected [{}, {}], got NULL",
                                m, n));
  }
  if (TensorAt(args, kBiasGrad) != nullptr) {
    if (!at->grad) return ArgError(op, kBiasGrad, "expected NULL without the 'grad' attribute");
    if (dgelu) {
      if (tefl_status* e = CheckShape1(op, args, kBiasGrad, n, "N = columns of D: column sums of D (gelu with grad)"))
        return e;
    } else if (tefl_status* e = CheckShape1(op, args, kBiasGrad, m, "M = rows of D: sum over k of op(A)")) {
      return e;
    }
  }
  if (TensorAt(args, kDAmax) != nullptr) {
    if (tefl_status* e = CheckOneValue(op, args, kDAmax, "one fp32 amax")) return e;
  }
  return nullptr;
}

// ---- te_general_grouped_gemm --------------------------------------------------
// in: A0 B1 m_splits2 bias3 a_scale_inv4 b_scale_inv5 d_scale6;
// out: D7 pre_gelu_out8 bias_grad9 d_amax10
// Two packings (G = groups, S = sum(m_splits)):
//  - no transa (TE fprop/dgrad): m_splits splits the rows M of A [S, K] and
//    D [S, N]; B [G, K, N] ([G, N, K] with transb) holds one matrix per group.
//  - transa (TE wgrad): m_splits splits K: A [S, M] and B [S, N] (no transb)
//    hold the groups' rows one after another; D [G, M, N], one per group.
enum GroupedArg { kGA, kGB, kGSplits, kGBias, kGAScaleInv, kGBScaleInv, kGDScale, kGD, kGPreGelu, kGBiasGrad, kGDAmax };

constexpr ArgSchema kGroupedIn[] = {
    {"A", kF | kFp8, false, "[sum(m_splits), K] ([sum(m_splits), M] with transa): the groups' rows"},
    {"B", kF | kFp8, false, "[G, K, N] ([G, N, K] with transb; [sum(m_splits), N] with transa)"},
    {"m_splits", Bit(DType::kI64), false, "[G] int64 >= 0, host memory"},
    {"bias", kF, true, "[G, N] (not with grad)"},
    {"a_scale_inv", kF32Only, true, "[G] (one per group) or [1], required iff A is FP8"},
    {"b_scale_inv", kF32Only, true, "[G] (one per group) or [1], required iff B is FP8"},
    {"d_scale", kF32Only, true, "[G] or [1], required iff D is FP8"},
};
constexpr ArgSchema kGroupedOut[] = {
    {"D", kF | kFp8, false, "[sum(m_splits), N] ([G, M, N] with transa)"},
    {"pre_gelu_out", kF, true, "like D, only with gelu (an input, required, with gelu and grad)"},
    {"bias_grad", kF, true,
     "with grad: [sum(m_splits)] ([G, M] with transa); [G, N] (column sums of each D_g) with gelu and grad"},
    {"d_amax", kF32Only, true, "[G]: max |D_g| before scaling, per group"},
};

tefl_status* CheckShape3(const OpSchema& op, const CallArgs& args, int i, int64_t d0, int64_t d1, int64_t d2,
                         const char* why) {
  const DLTensor* t = TensorAt(args, i);
  if (t->ndim != 3 || t->shape[0] != d0 || t->shape[1] != d1 || t->shape[2] != d2)
    return ArgError(op, i, fmt::format("expected shape [{}, {}, {}] ({}), got {}", d0, d1, d2, why, ShapeString(t)));
  return nullptr;
}

// Shape of D, pre_gelu_out: [S, N] or [G, M, N] (transa).
tefl_status* CheckGroupedOut(const OpSchema& op, const CallArgs& args, int i, bool transa, int64_t g, int64_t s,
                             int64_t m, int64_t n, const char* why) {
  return transa ? CheckShape3(op, args, i, g, m, n, why) : CheckShape2(op, args, i, s, n, why);
}

tefl_status* CheckGrouped(const OpSchema& op, const CallArgs& args) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(args.attrs);
  const bool transa = at->transa != 0, transb = at->transb != 0;
  if (transa && transb)
    return AttrError(op,
                     "attributes 'transa' and 'transb' together are not supported (with transa, m_splits splits K: "
                     "B is [sum(m_splits), N]; TE's grouped layouts are TN, NN and NT)");
  const DLTensor* a = TensorAt(args, kGA);
  const DLTensor* b = TensorAt(args, kGB);
  const DLTensor* s = TensorAt(args, kGSplits);
  if (a->ndim != 2)
    return ArgError(op, kGA,
                    fmt::format("expected rank 2 ({}), got {}", transa ? "[sum(m_splits), M]" : "[sum(m_splits), K]",
                                ShapeString(a)));
  const int64_t rows = a->shape[0];
  int64_t g = 0, m = 0, n = 0;
  if (transa) {
    if (s->ndim != 1) return ArgError(op, kGSplits, fmt::format("expected rank 1 ([G]), got {}", ShapeString(s)));
    g = s->shape[0];
    if (b->ndim != 2 || b->shape[0] != rows)
      return ArgError(op, kGB,
                      fmt::format("expected [{}, N] with transa (the groups' rows, like A {}), got {}", rows,
                                  ShapeString(a), ShapeString(b)));
    m = a->shape[1];
    n = b->shape[1];
  } else {
    if (b->ndim != 3)
      return ArgError(op, kGB,
                      fmt::format("expected rank 3 ({}), got {}", transb ? "[G, N, K]" : "[G, K, N]", ShapeString(b)));
    const int64_t k = a->shape[1];
    const int64_t kb = transb ? b->shape[2] : b->shape[1];
    n = transb ? b->shape[1] : b->shape[2];
    if (kb != k)
      return ArgError(
          op, kGB,
          fmt::format("expected K = {} (columns of A) along dim {}, got shape {}", k, transb ? 2 : 1, ShapeString(b)));
    g = b->shape[0];
    if (tefl_status* e = CheckShape1(op, args, kGSplits, g, "G = groups of B")) return e;
  }
  // dtypes: FP8 with FP8 (E4M3/E5M2 in any mix), otherwise A and B alike.
  if (IsFp8(a) != IsFp8(b) || (!IsFp8(a) && (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits)))
    return ArgError(op, kGB,
                    fmt::format("expected {} (A is {}; supported: A and B of one dtype among float32, float16, "
                                "bfloat16, or both FP8 (float8_e4m3fn/float8_e5m2 in any mix)), got {}",
                                IsFp8(a) ? "an FP8 dtype" : Name(a), Name(a), Name(b)));
  const auto* splits = static_cast<const int64_t*>(DataPtr(s));
  int64_t total = 0;
  for (int64_t i = 0; i < g; ++i) {
    if (splits[i] < 0 || splits[i] > rows)
      return ArgError(op, kGSplits, fmt::format("expected m_splits[{}] in [0, {}], got {}", i, rows, splits[i]));
    total += splits[i];
  }
  if (total != rows)
    return ArgError(op, kGSplits,
                    fmt::format("expected a sum of {} (rows of A {}), got {}", rows, ShapeString(a), total));
  const DLTensor* d = TensorAt(args, kGD);
  const struct {
    int index;
    bool needed;
    const char* owner;
    int owner_index;
  } scales[] = {{kGAScaleInv, IsFp8(a), "A", kGA}, {kGBScaleInv, IsFp8(b), "B", kGB}, {kGDScale, IsFp8(d), "D", kGD}};
  for (const auto& sc : scales) {
    const DLTensor* t = TensorAt(args, sc.index);
    if (sc.needed && t == nullptr)
      return ArgError(
          op, sc.index,
          fmt::format("is required ([G] or [1] fp32): {} is {}", sc.owner, Name(TensorAt(args, sc.owner_index))));
    if (!sc.needed && t != nullptr)
      return ArgError(op, sc.index,
                      fmt::format("expected NULL: {} is {}, not FP8", sc.owner, Name(TensorAt(args, sc.owner_index))));
    if (t != nullptr && (t->ndim != 1 || (t->shape[0] != g && t->shape[0] != 1)))
      return ArgError(op, sc.index,
                      fmt::format("expected shape [{}] (one scale per group) or [1], got {}", g, ShapeString(t)));
  }
  if (tefl_status* e = CheckGroupedOut(op, args, kGD, transa, g, rows, m, n,
                                       transa ? "[G, M, N]: one D per group" : "[sum(m_splits), N]"))
    return e;
  if (at->accumulate && IsFp8(d))
    return ArgError(op, kGD, fmt::format("accumulate needs a D of float32, float16 or bfloat16, got {}", Name(d)));
  const bool dgelu = at->gelu && at->grad;
  if (TensorAt(args, kGBias) != nullptr) {
    if (at->grad) return ArgError(op, kGBias, "expected NULL with grad (the bias gradient is the output 'bias_grad')");
    if (tefl_status* e = CheckShape2(op, args, kGBias, g, n, "[G, N]")) return e;
  }
  if (TensorAt(args, kGPreGelu) != nullptr) {
    if (!at->gelu) return ArgError(op, kGPreGelu, "expected NULL without the 'gelu' attribute");
    if (tefl_status* e = CheckGroupedOut(op, args, kGPreGelu, transa, g, rows, m, n, "like D")) return e;
  } else if (dgelu) {
    return ArgError(op, kGPreGelu,
                    "is required with 'gelu' and 'grad' (TE's DGELU epilogue reads the forward's pre-GELU values, "
                    "shaped like D), got NULL");
  }
  if (TensorAt(args, kGBiasGrad) != nullptr) {
    if (!at->grad) return ArgError(op, kGBiasGrad, "expected NULL without the 'grad' attribute");
    tefl_status* e = nullptr;
    if (dgelu)
      e = CheckShape2(op, args, kGBiasGrad, g, n, "[G, N]: column sums of each D_g (gelu with grad)");
    else if (transa)
      e = CheckShape2(op, args, kGBiasGrad, g, m, "[G, M]: per group, sum over k of op(A_g)");
    else
      e = CheckShape1(op, args, kGBiasGrad, rows, "[sum(m_splits)]: per row of D, sum over k of A");
    if (e) return e;
  }
  if (TensorAt(args, kGDAmax) != nullptr) {
    if (tefl_status* e = CheckShape1(op, args, kGDAmax, g, "[G]: one fp32 amax per group")) return e;
  }
  return nullptr;
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
     "G independent GEMMs (MoE experts): A split by m_splits (rows M, or K with transa), D_g = epilogue(alpha * "
     "op(A_g) op(B_g) + beta * D_g + bias_g); per-group FP8 scale_inv, GELU/DGELU, grad (bias_grad)",
     kGroupedIn,
     kGroupedOut,
     kGemmAttrs,
     TEFL_GEMM_ATTRS_STRUCT_SIZE,
     &kGemmDefaults,
     kGemmFlags | kOpChecksData,
     CheckGrouped,
     {},
     /*inplace_output=*/-1,
     /*inplace_input=*/-1,
     // First released as (A, B, m_splits, bias) -> (D).
     /*first_inputs=*/4,
     /*first_outputs=*/1},
};

}  // namespace

std::span<const OpSchema> GemmSchemas() { return kSchemas; }

}  // namespace tefl
