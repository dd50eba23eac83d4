// The op catalogue: one schema per op, as data. Validation, `tefl ops`,
// explain, the conformance checks and the docs read these schemas; nothing
// else describes an op's arguments.
#ifndef TEFL_SRC_CORE_CATALOGUE_H_
#define TEFL_SRC_CORE_CATALOGUE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl {

struct ArgSchema {
  const char* name;
  DTypeSet dtypes;    // allowed dtypes
  bool optional;      // may be NULL
  const char* shape;  // documentation, e.g. "[N..., H]"
};

// kU64: any value (seeds, offsets); no range check, never in the signature.
enum class AttrType : uint8_t { kF32, kI32, kBool, kU64 };

struct AttrSchema {
  const char* name;
  AttrType type;
  uint32_t offset;  // in the op's attribute struct
  double default_value;
  double min_value, max_value;  // inclusive; checked on every call
  // Bits of the value that enter the call signature (0: not part of it).
  // supports() may depend on exactly these attributes.
  uint8_t signature_bits;
  const char* doc;
};

enum OpFlags : uint32_t {
  kOpInPlace = 1u << 0,     // writes an input: never retried after an error
  kOpNoAlias = 1u << 1,     // outputs may not overlap inputs or each other
  kOpContiguous = 1u << 2,  // every tensor must be compact row-major
  // check_shapes also reads small host-memory inputs (e.g. RoPE's
  // cu_seqlens): it runs on every call, validation-memo hits included.
  kOpChecksData = 1u << 3,
};

struct CallArgs {
  const DLTensor* const* inputs;
  int32_t num_inputs;
  DLTensor* const* outputs;
  int32_t num_outputs;
  const void* attrs;  // normalised: full size, defaults filled
};

struct OpSchema;
// Checks relations between shapes (generic checks already passed). Returns an
// error status naming op, argument and expectation, or NULL.
using ShapeCheckFn = tefl_status* (*)(const OpSchema& op, const CallArgs& args);

struct OpSchema {
  int32_t id;
  const char* name;
  const char* family;
  const char* doc;
  std::span<const ArgSchema> inputs;
  std::span<const ArgSchema> outputs;
  std::span<const AttrSchema> attrs;
  size_t attrs_size;           // the host's full struct size
  const void* attrs_defaults;  // a full struct with defaults
  uint32_t flags;
  ShapeCheckFn check_shapes;
  std::span<const char* const> aliases;
  // One output that may exactly alias one input (same data, offset, dtype,
  // shape and strides), e.g. rmsnorm_bwd_add's dx over add. Such a call is
  // in place: its signature says so and it is never retried after an error.
  int8_t inplace_output = -1;  // output index, -1: none
  int8_t inplace_input = -1;   // input index
  // The argument counts of the op's first release, when it has grown since
  // (arguments are only ever appended, each new one optional): a call with
  // those counts sees the later arguments as absent. -1: never grew.
  int8_t first_inputs = -1;
  int8_t first_outputs = -1;
};

constexpr int kMaxOpArgs = 15;
// SigKey word 0 bit set when the call writes an input (in place).
constexpr uint64_t kSigInPlaceBit = uint64_t(1) << 48;  // signature key capacity (inputs + outputs)

std::span<const OpSchema> AllOps();

namespace catalogue_internal {
extern std::atomic<const OpSchema*> g_ops;  // TEFL_OP_COUNT_ schemas by id, once built
const OpSchema* BuildTable();
}  // namespace catalogue_internal

// By id; NULL if out of range. Inline: every call looks its schema up.
inline const OpSchema* FindOp(int32_t op_id) {
  if (uint32_t(op_id) >= uint32_t(TEFL_OP_COUNT_)) return nullptr;
  const OpSchema* ops = catalogue_internal::g_ops.load(std::memory_order_acquire);
  if (ops == nullptr) ops = catalogue_internal::BuildTable();
  return ops[op_id].name ? &ops[op_id] : nullptr;
}
// By name or alias (rope_fwd -> fused_rope_forward); NULL if unknown.
const OpSchema* FindOp(std::string_view name);
// For an unknown name: "; did you mean 'gelu'?" naming the closest op by
// edit distance (at most 4 edits), else "".
std::string DidYouMeanOp(std::string_view name);
// Levenshtein distance (edits to turn a into b); for "did you mean" hints.
size_t EditDistance(std::string_view a, std::string_view b);
// An attribute value as a user writes it: f32 in float32's shortest form
// (0.1, not 0.10000000149011612), integers as integers, bool as false/true.
std::string AttrValueString(AttrType type, double v);
// The accepted range of an attribute as text: "[0, 1048576]"; f32 bounds as
// float32, open where the inclusive limit is the float just inside an integer
// ("[0, 1)" for a max of 0.99999994); "(0, inf]"; "0 or 1" (bool); "any" (u64).
std::string AttrRangeString(const AttrSchema& at);

// Per family (one file each).
std::span<const OpSchema> NormalizationSchemas();
std::span<const OpSchema> RopeSchemas();
std::span<const OpSchema> ActivationSchemas();
std::span<const OpSchema> SoftmaxSchemas();
std::span<const OpSchema> DropoutSchemas();
std::span<const OpSchema> AttentionSchemas();
std::span<const OpSchema> QuantizationSchemas();
std::span<const OpSchema> GemmSchemas();

}  // namespace tefl

#endif  // TEFL_SRC_CORE_CATALOGUE_H_
