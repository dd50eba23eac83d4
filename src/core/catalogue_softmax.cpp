// Schemas of the softmax family (TransformerEngine's fused softmax ops,
// spec/ops.md "Softmax"): y = softmax(scale * x) over the last dim, with an
// explicit uint8 mask, an upper-triangular (causal) mask or a bottom-right
// aligned causal mask; every backward is dx = scale * y * (dy - sum(dy * y))
// and may run in place (input_grads exactly over output_grads, as TE does).
#include <cfloat>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kU8Only = Bit(DType::kU8);

constexpr ArgSchema kFwdIn[] = {{"input", kF, false, "[b, h, sq, sk]"}};
constexpr ArgSchema kMaskedFwdIn[] = {{"input", kF, false, "[b, h, sq, sk]"},
                                      {"mask", kU8Only, false, "[b or 1, 1, sq, sk], 1 = masked"}};
constexpr ArgSchema kTriangFwdIn[] = {{"input", kF, false, "[attn_batches, sq, sq]"}};
constexpr ArgSchema kFwdOut[] = {{"softmax_results", kF, false, "like input"}};
constexpr ArgSchema kBwdIn[] = {{"output_grads", kF, false, "[b, h, sq, sk]"},
                                {"softmax_results", kF, false, "like output_grads"}};
constexpr ArgSchema kTriangBwdIn[] = {{"output_grads", kF, false, "[attn_batches, sq, sq]"},
                                      {"softmax_results", kF, false, "like output_grads"}};
constexpr ArgSchema kBwdOut[] = {{"input_grads", kF, false, "like output_grads (may be output_grads itself)"}};

constexpr AttrSchema kAttrs[] = {
    {"scale", AttrType::kF32, offsetof(tefl_softmax_attrs, scale), 1.0, -double(FLT_MAX), double(FLT_MAX), 0,
     "multiplies the input before the softmax (finite)"},
};
constexpr tefl_softmax_attrs kDefaults = {TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, 1.0f};

bool SameShape(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

const char* RankShape(int rank) { return rank == 3 ? "[attn_batches, sq, sq]" : "[b, h, sq, sk]"; }

// Argument 0 has rank `rank` (square last two dims when `square`); every
// other argument listed in `like` has its shape.
tefl_status* CheckMain(const OpSchema& op, const CallArgs& a, int rank, bool square, std::initializer_list<int> like) {
  const DLTensor* x = TensorAt(a, 0);
  if (x->ndim != rank)
    return ArgError(op, 0, fmt::format("expected rank {} {}, got shape {}", rank, RankShape(rank), ShapeString(x)));
  if (square && x->shape[1] != x->shape[2])
    return ArgError(op, 0,
                    fmt::format("expected square last two dims [attn_batches, sq, sq], got shape {}", ShapeString(x)));
  for (int i : like) {
    const DLTensor* t = TensorAt(a, i);
    if (!SameShape(t, x))
      return ArgError(
          op, i,
          fmt::format("expected shape {} (that of '{}'), got {}", ShapeString(x), ArgAt(op, 0).name, ShapeString(t)));
  }
  return nullptr;
}

// in: input0; out: softmax_results1
tefl_status* CheckFwd(const OpSchema& op, const CallArgs& a) { return CheckMain(op, a, 4, false, {1}); }
tefl_status* CheckTriangFwd(const OpSchema& op, const CallArgs& a) { return CheckMain(op, a, 3, true, {1}); }
// in: input0 mask1; out: softmax_results2. The mask broadcasts over batch
// when its first dim is 1, never over heads (its second dim is 1).
tefl_status* CheckMaskedFwd(const OpSchema& op, const CallArgs& a) {
  if (tefl_status* e = CheckMain(op, a, 4, false, {2})) return e;
  const DLTensor* x = TensorAt(a, 0);
  const DLTensor* m = TensorAt(a, 1);
  const bool ok = m->ndim == 4 && (m->shape[0] == x->shape[0] || m->shape[0] == 1) && m->shape[1] == 1 &&
                  m->shape[2] == x->shape[2] && m->shape[3] == x->shape[3];
  if (!ok) {
    const std::string batch = x->shape[0] == 1 ? "1" : fmt::format("{} or 1", x->shape[0]);
    return ArgError(op, 1,
                    fmt::format("expected shape [{}, 1, {}, {}] (broadcast over the heads of input {}), got {}", batch,
                                x->shape[2], x->shape[3], ShapeString(x), ShapeString(m)));
  }
  return nullptr;
}
// in: output_grads0 softmax_results1; out: input_grads2
tefl_status* CheckBwd(const OpSchema& op, const CallArgs& a) { return CheckMain(op, a, 4, false, {1, 2}); }
tefl_status* CheckTriangBwd(const OpSchema& op, const CallArgs& a) { return CheckMain(op, a, 3, true, {1, 2}); }

constexpr uint32_t kFlags = kOpNoAlias | kOpContiguous;

#define TEFL_SOFTMAX_FWD(id, name, doc, in, check)                                                               \
  OpSchema {                                                                                                     \
    id, name, "softmax", doc, in, kFwdOut, kAttrs, TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, &kDefaults, kFlags, check, {} \
  }
#define TEFL_SOFTMAX_BWD(id, name, doc, in, check)                                                                \
  OpSchema {                                                                                                      \
    id, name, "softmax", doc, in, kBwdOut, kAttrs, TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, &kDefaults, kFlags, check, {}, \
        /*inplace_output=*/0, /*inplace_input=*/0                                                                 \
  }

const OpSchema kSchemas[] = {
    TEFL_SOFTMAX_FWD(TEFL_OP_SCALED_SOFTMAX_FORWARD, "scaled_softmax_forward",
                     "y = softmax(scale * x) over the last dim", kFwdIn, CheckFwd),
    TEFL_SOFTMAX_BWD(TEFL_OP_SCALED_SOFTMAX_BACKWARD, "scaled_softmax_backward",
                     "dx = scale * y * (dy - sum(dy * y)); input_grads may be output_grads (in place)", kBwdIn,
                     CheckBwd),
    TEFL_SOFTMAX_FWD(TEFL_OP_SCALED_MASKED_SOFTMAX_FORWARD, "scaled_masked_softmax_forward",
                     "softmax(scale * x) with masked scores (mask 1) replaced by -10000; a fully masked row is 0",
                     kMaskedFwdIn, CheckMaskedFwd),
    TEFL_SOFTMAX_BWD(TEFL_OP_SCALED_MASKED_SOFTMAX_BACKWARD, "scaled_masked_softmax_backward",
                     "dx = scale * y * (dy - sum(dy * y)); input_grads may be output_grads (in place)", kBwdIn,
                     CheckBwd),
    TEFL_SOFTMAX_FWD(TEFL_OP_SCALED_UPPER_TRIANG_MASKED_SOFTMAX_FORWARD, "scaled_upper_triang_masked_softmax_forward",
                     "causal softmax(scale * x): column j kept iff j <= i, masked entries 0", kTriangFwdIn,
                     CheckTriangFwd),
    TEFL_SOFTMAX_BWD(TEFL_OP_SCALED_UPPER_TRIANG_MASKED_SOFTMAX_BACKWARD, "scaled_upper_triang_masked_softmax_backward",
                     "dx = scale * y * (dy - sum(dy * y)); input_grads may be output_grads (in place)", kTriangBwdIn,
                     CheckTriangBwd),
    TEFL_SOFTMAX_FWD(TEFL_OP_SCALED_ALIGNED_CAUSAL_MASKED_SOFTMAX_FORWARD,
                     "scaled_aligned_causal_masked_softmax_forward",
                     "bottom-right causal softmax(scale * x): j kept iff j < i + sk - sq + 1; a row with none is 0",
                     kFwdIn, CheckFwd),
    TEFL_SOFTMAX_BWD(
        TEFL_OP_SCALED_ALIGNED_CAUSAL_MASKED_SOFTMAX_BACKWARD, "scaled_aligned_causal_masked_softmax_backward",
        "dx = scale * y * (dy - sum(dy * y)); input_grads may be output_grads (in place)", kBwdIn, CheckBwd),
};

#undef TEFL_SOFTMAX_FWD
#undef TEFL_SOFTMAX_BWD

}  // namespace

std::span<const OpSchema> SoftmaxSchemas() { return kSchemas; }

}  // namespace tefl
