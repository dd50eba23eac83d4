// Schemas of the dropout family: dropout_fwd / dropout_bwd with a
// counter-based keep mask (Philox-4x32-10 of (seed, offset, element index),
// include/tefl/ops.h), so that the backward and any implementation or thread
// count reproduce the same mask.
#include <cmath>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kU8Only = Bit(DType::kU8);

constexpr ArgSchema kFwdIn[] = {{"input", kF, false, "any shape"}};
constexpr ArgSchema kFwdOut[] = {{"output", kF, false, "like input"},
                                 {"mask", kU8Only, false, "like input, uint8, 1 = kept"}};
constexpr ArgSchema kBwdIn[] = {{"grad_output", kF, false, "any shape"},
                                {"mask", kU8Only, false, "like grad_output, uint8, nonzero = kept"}};
constexpr ArgSchema kBwdOut[] = {{"grad_input", kF, false, "like grad_output"}};

// p's upper bound: the largest float below 1 (the range is inclusive).
constexpr double kMaxP = 1.0 - 1.0 / 16777216.0;  // 1 - 2^-24

constexpr AttrSchema kAttrs[] = {
    {"seed", AttrType::kU64, offsetof(tefl_dropout_attrs, seed), 0, 0, 0, 0, "Philox key (lo, hi 32 bits)"},
    {"offset", AttrType::kU64, offsetof(tefl_dropout_attrs, offset), 0, 0, 0, 0,
     "Philox counter words 2-3 (lo, hi 32 bits)"},
    {"p", AttrType::kF32, offsetof(tefl_dropout_attrs, p), 0.1, 0.0, kMaxP, 0,
     "drop probability, in [0, 1) (1 is rejected: nothing would be kept and 1/(1-p) is infinite)"},
};
// dropout_bwd reads the same struct but only p: its mask is an input, so seed
// and offset mean nothing there (and Python's dropout_bwd has TE's signature,
// without them).
constexpr AttrSchema kBwdAttrs[] = {kAttrs[2]};
constexpr tefl_dropout_attrs kDefaults = {TEFL_DROPOUT_ATTRS_STRUCT_SIZE, 0, 0, 0.1f};

bool SameShape(const DLTensor* a, const DLTensor* b) {
  if (a->ndim != b->ndim) return false;
  for (int d = 0; d < a->ndim; ++d)
    if (a->shape[d] != b->shape[d]) return false;
  return true;
}

// Every argument has the shape of argument 0.
tefl_status* CheckSameShapes(const OpSchema& op, const CallArgs& a) {
  const DLTensor* x = TensorAt(a, 0);
  const int n = a.num_inputs + a.num_outputs;
  for (int i = 1; i < n; ++i) {
    const DLTensor* t = TensorAt(a, i);
    if (!SameShape(t, x))
      return ArgError(
          op, i,
          fmt::format("expected shape {} (that of '{}'), got {}", ShapeString(x), ArgAt(op, 0).name, ShapeString(t)));
  }
  return nullptr;
}

constexpr uint32_t kFlags = kOpNoAlias | kOpContiguous;

const OpSchema kSchemas[] = {
    {TEFL_OP_DROPOUT_FWD,
     "dropout_fwd",
     "dropout",
     "output = input * mask / (1 - p), mask[i] = (u16 half i % 8 of Philox4x32-10(seed, offset, i / 8)) >= "
     "ceil(p * 2^16)",
     kFwdIn,
     kFwdOut,
     kAttrs,
     TEFL_DROPOUT_ATTRS_STRUCT_SIZE,
     &kDefaults,
     kFlags,
     CheckSameShapes,
     {}},
    {TEFL_OP_DROPOUT_BWD,
     "dropout_bwd",
     "dropout",
     "grad_input = grad_output * mask / (1 - p)",
     kBwdIn,
     kBwdOut,
     kBwdAttrs,
     TEFL_DROPOUT_ATTRS_STRUCT_SIZE,
     &kDefaults,
     kFlags,
     CheckSameShapes,
     {}},
};

}  // namespace

std::span<const OpSchema> DropoutSchemas() { return kSchemas; }

}  // namespace tefl
