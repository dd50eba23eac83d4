// Schemas of the RoPE family: fused_rope_forward / fused_rope_backward
// (aliases rope_fwd / rope_bwd). Implementations arrive with the RoPE op
// family; until then a call validates and then reports that no
// implementation is registered.
#include <limits>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr DTypeSet kI32Only = Bit(DType::kI32);

constexpr ArgSchema kFwdIn[] = {{"input", kF, false, "sbhd [s, b, h, d] | bshd [b, s, h, d] | thd [t, h, d]"},
                                {"freqs", kF32Only, false, "[s_max, 1, 1, d2], d2 even, d2 <= d"},
                                {"start_positions", kI32Only, true, "[b]"},
                                {"cu_seqlens", kI32Only, true, "[b + 1] (thd only)"}};
constexpr ArgSchema kFwdOut[] = {{"output", kF, false, "like input"}};
constexpr ArgSchema kBwdIn[] = {{"output_grads", kF, false, "sbhd | bshd | thd, like the forward input"},
                                {"freqs", kF32Only, false, "[s_max, 1, 1, d2], d2 even, d2 <= d"},
                                {"start_positions", kI32Only, true, "[b]"},
                                {"cu_seqlens", kI32Only, true, "[b + 1] (thd only)"}};
constexpr ArgSchema kBwdOut[] = {{"input_grads", kF, false, "like output_grads"}};

constexpr AttrSchema kAttrs[] = {
    {"qkv_format", AttrType::kI32, offsetof(tefl_rope_attrs, qkv_format), TEFL_QKV_SBHD, 0, 2, 2,
     "0 sbhd, 1 bshd, 2 thd (NVTE_QKV_Format)"},
    {"interleaved", AttrType::kBool, offsetof(tefl_rope_attrs, interleaved), 0, 0, 1, 1,
     "rotate adjacent pairs instead of halves"},
    {"cp_size", AttrType::kI32, offsetof(tefl_rope_attrs, cp_size), 1, 1, 1 << 20, 0, "context-parallel group size"},
    {"cp_rank", AttrType::kI32, offsetof(tefl_rope_attrs, cp_rank), 0, 0, (1 << 20) - 1, 0,
     "this rank in the context-parallel group"},
};
constexpr tefl_rope_attrs kDefaults = {TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0};

const char* FormatName(int32_t f) { return f == TEFL_QKV_SBHD ? "sbhd" : f == TEFL_QKV_BSHD ? "bshd" : "thd"; }

// Argument indices: 0 input/output_grads, 1 freqs, 2 start_positions,
// 3 cu_seqlens, 4 output/input_grads.
tefl_status* CheckRope(const OpSchema& op, const CallArgs& a) {
  const auto* attrs = static_cast<const tefl_rope_attrs*>(a.attrs);
  if (attrs->cp_rank >= attrs->cp_size) {
    return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: attribute 'cp_rank' must be < cp_size ({}), got {}",
                                                              op.name, attrs->cp_size, attrs->cp_rank)
                                                      .c_str());
  }
  const int32_t format = attrs->qkv_format;
  const bool thd = format == TEFL_QKV_THD;
  const DLTensor* x = TensorAt(a, 0);
  const int rank = thd ? 3 : 4;
  if (x->ndim != rank) {
    return ArgError(
        op, 0,
        fmt::format("expected rank {} for qkv_format {}, got shape {}", rank, FormatName(format), ShapeString(x)));
  }
  const int64_t d = x->shape[rank - 1];
  const int64_t batch = thd ? -1 : x->shape[format == TEFL_QKV_SBHD ? 1 : 0];
  const int64_t seq = thd ? x->shape[0] : x->shape[format == TEFL_QKV_SBHD ? 0 : 1];
  const DLTensor* freqs = TensorAt(a, 1);
  if (freqs->ndim != 4 || freqs->shape[1] != 1 || freqs->shape[2] != 1) {
    return ArgError(op, 1, fmt::format("expected shape [s, 1, 1, d2], got {}", ShapeString(freqs)));
  }
  const int64_t d2 = freqs->shape[3];
  if (d2 > d || d2 % 2 != 0) {
    return ArgError(
        op, 1,
        fmt::format("expected an even last dim d2 <= d = {} (head dim of {}), got {}", d, ArgAt(op, 0).name, d2));
  }
  const DLTensor* start = TensorAt(a, 2);
  const DLTensor* cu = TensorAt(a, 3);
  if (thd) {
    if (cu == nullptr) return ArgError(op, 3, "is required for qkv_format thd, got NULL");
    if (cu->ndim != 1 || cu->shape[0] < 1)
      return ArgError(op, 3, fmt::format("expected shape [b + 1] with b >= 0, got {}", ShapeString(cu)));
  } else {
    if (cu != nullptr) return ArgError(op, 3, fmt::format("must be NULL for qkv_format {}", FormatName(format)));
    // Without start offsets every position must have a frequency row.
    const int64_t positions = seq * attrs->cp_size;
    if (start == nullptr && freqs->shape[0] < positions) {
      return ArgError(op, 1,
                      fmt::format("expected at least {} rows (sequence length {} x cp_size {}), got {}", positions, seq,
                                  attrs->cp_size, freqs->shape[0]));
    }
  }
  if (start != nullptr) {
    const int64_t b = thd ? cu->shape[0] - 1 : batch;
    if (start->ndim != 1 || start->shape[0] != b)
      return ArgError(op, 2, fmt::format("expected shape [{}] (the batch size), got {}", b, ShapeString(start)));
  }
  const DLTensor* out = TensorAt(a, 4);
  if (out->ndim != x->ndim || !std::equal(out->shape, out->shape + out->ndim, x->shape)) {
    return ArgError(
        op, 4,
        fmt::format("expected shape {} (that of '{}'), got {}", ShapeString(x), ArgAt(op, 0).name, ShapeString(out)));
  }
  return nullptr;
}

constexpr const char* kFwdAliases[] = {"rope_fwd"};
constexpr const char* kBwdAliases[] = {"rope_bwd"};

const OpSchema kSchemas[] = {
    {TEFL_OP_FUSED_ROPE_FORWARD, "fused_rope_forward", "rope",
     "Rotary position embedding: out = x cos f + rotate(x) sin f on the first d2 channels, the rest copied", kFwdIn,
     kFwdOut, kAttrs, TEFL_ROPE_ATTRS_STRUCT_SIZE, &kDefaults, kOpNoAlias, CheckRope, kFwdAliases},
    {TEFL_OP_FUSED_ROPE_BACKWARD, "fused_rope_backward", "rope", "The transpose of fused_rope_forward", kBwdIn, kBwdOut,
     kAttrs, TEFL_ROPE_ATTRS_STRUCT_SIZE, &kDefaults, kOpNoAlias, CheckRope, kBwdAliases},
};

}  // namespace

std::span<const OpSchema> RopeSchemas() { return kSchemas; }

}  // namespace tefl
