// Schemas of the RoPE family: fused_rope_forward / fused_rope_backward
// (aliases rope_fwd / rope_bwd) and fused_qkv_rope_forward /
// fused_qkv_rope_backward. Semantics: TransformerEngine's fused_rope.cu and
// pytorch/csrc/extensions/apply_rope.cpp (docs/ops-rope.md).
//
// Tensors may be strided (no kOpContiguous): a bshd input is typically a
// slice of a packed qkv tensor. Outputs may be strided too, but no two of an
// output's elements may share memory.
//
// The checks read cu_seqlens and start_positions (int32, host memory on the
// CPU) so that a bad sequence table or an out-of-range position is a
// validation error naming the argument, before any output is written: the
// schemas carry kOpChecksData, so the check runs on every call.
#include <algorithm>
#include <cstring>
#include <limits>
#include <span>
#include <utility>
#include <vector>

#include "core/catalogue.h"
#include "core/rope_positions.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr DTypeSet kI32Only = Bit(DType::kI32);

// ---- fused_rope_forward / backward ---------------------------------------------------
// Argument indices: 0 input/output_grads, 1 freqs, 2 start_positions,
// 3 cu_seqlens, 4 output/input_grads.
constexpr ArgSchema kFwdIn[] = {
    {"input", kF, false, "sbhd [s, b, h, d] | bshd [b, s, h, d] | thd [t, h, d]; any strides"},
    {"freqs", kF32Only, false, "[s_max, 1, 1, d2] angles, d2 even, d2 <= d"},
    {"start_positions", kI32Only, true, "[b], >= 0: position offset of each sequence"},
    {"cu_seqlens", kI32Only, true, "[b + 1] (thd only): 0, non-decreasing, last / cp_size == t"}};
constexpr ArgSchema kFwdOut[] = {{"output", kF, false, "like input (same shape and dtype)"}};
constexpr ArgSchema kBwdIn[] = {
    {"output_grads", kF, false, "sbhd | bshd | thd, like the forward input; any strides"},
    {"freqs", kF32Only, false, "[s_max, 1, 1, d2] angles, d2 even, d2 <= d"},
    {"start_positions", kI32Only, true, "[b], >= 0: position offset of each sequence"},
    {"cu_seqlens", kI32Only, true, "[b + 1] (thd only): 0, non-decreasing, last / cp_size == t"}};
constexpr ArgSchema kBwdOut[] = {{"input_grads", kF, false, "like output_grads (same shape and dtype)"}};

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

// ---- fused_qkv_rope_forward / backward -----------------------------------------------
// Forward: 0 qkv, 1 q_freqs, 2 k_freqs, 3 start_positions, 4 q, 5 k, 6 v.
// Backward: 0 q_grads, 1 k_grads, 2 v_grads, 3 q_freqs, 4 k_freqs,
// 5 start_positions, 6 qkv_grads.
constexpr ArgSchema kQkvFwdIn[] = {
    {"qkv", kF, false, "sbhd [s, b, h, q_split + k_split + v_split] | bshd [b, s, h, ...]; any strides"},
    {"q_freqs", kF32Only, false, "[s_max, 1, 1, d2] angles for q, d2 even, d2 <= d"},
    {"k_freqs", kF32Only, false, "[s_max, 1, 1, d2] angles for k (same d2)"},
    {"start_positions", kI32Only, true, "[b], >= 0: position offset of each sequence"}};
constexpr ArgSchema kQkvFwdOut[] = {{"q", kF, false, "[s, b, h * q_split / d, d] (bshd: [b, s, ...]), dtype of qkv"},
                                    {"k", kF, false, "[s, b, h * k_split / d, d]"},
                                    {"v", kF, false, "[s, b, h * v_split / d, d]"}};
constexpr ArgSchema kQkvBwdIn[] = {
    {"q_grads", kF, false, "[s, b, h * q_split / d, d] (bshd: [b, s, ...]); any strides"},
    {"k_grads", kF, false, "[s, b, h * k_split / d, d]"},
    {"v_grads", kF, false, "[s, b, h * v_split / d, d]"},
    {"q_freqs", kF32Only, false, "[s_max, 1, 1, d2] angles for q, d2 even, d2 <= d"},
    {"k_freqs", kF32Only, false, "[s_max, 1, 1, d2] angles for k (same d2)"},
    {"start_positions", kI32Only, true, "[b], >= 0: position offset of each sequence"}};
constexpr ArgSchema kQkvBwdOut[] = {
    {"qkv_grads", kF, false, "[s, b, h, q_split + k_split + v_split] (bshd: [b, s, ...]), dtype of q_grads"}};

constexpr AttrSchema kQkvAttrs[] = {
    {"qkv_format", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, qkv_format), TEFL_QKV_SBHD, 0, 1, 2,
     "0 sbhd, 1 bshd (thd is not supported, as in TE)"},
    {"interleaved", AttrType::kBool, offsetof(tefl_qkv_rope_attrs, interleaved), 0, 0, 1, 1,
     "rotate adjacent pairs instead of halves"},
    {"cp_size", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, cp_size), 1, 1, 1 << 20, 0,
     "context-parallel group size"},
    {"cp_rank", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, cp_rank), 0, 0, (1 << 20) - 1, 0,
     "this rank in the context-parallel group"},
    {"q_split", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, q_split), 0, 1, std::numeric_limits<int32_t>::max(), 0,
     "channels of q per head group (qkv_split_arg_list[0]), a multiple of d"},
    {"k_split", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, k_split), 0, 1, std::numeric_limits<int32_t>::max(), 0,
     "channels of k per head group (qkv_split_arg_list[1]), a multiple of d"},
    {"v_split", AttrType::kI32, offsetof(tefl_qkv_rope_attrs, v_split), 0, 1, std::numeric_limits<int32_t>::max(), 0,
     "channels of v per head group (qkv_split_arg_list[2]), a multiple of d"},
};
constexpr tefl_qkv_rope_attrs kQkvDefaults = {TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0, 0, 0, 0};

// ---- Helpers ----------------------------------------------------------------------------
const char* FormatName(int32_t f) { return f == TEFL_QKV_SBHD ? "sbhd" : f == TEFL_QKV_BSHD ? "bshd" : "thd"; }

bool SameShape(const DLTensor* t, std::initializer_list<int64_t> want) {
  return t->ndim == int(want.size()) && std::equal(want.begin(), want.end(), t->shape);
}
std::string ShapeOf(std::initializer_list<int64_t> s) {
  std::string r = "[";
  for (auto it = s.begin(); it != s.end(); ++it) r += (it == s.begin() ? "" : ", ") + std::to_string(*it);
  return r + "]";
}

tefl_status* AttrError(const OpSchema& op, const std::string& what) {
  return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: {}", op.name, what).c_str());
}

// Output `i` must have the dtype of argument `like`.
tefl_status* CheckSameDtype(const OpSchema& op, const CallArgs& a, int like, int i) {
  const DType want = DTypeOf(TensorAt(a, like)->dtype), got = DTypeOf(TensorAt(a, i)->dtype);
  if (want == got) return nullptr;
  return ArgError(
      op, i,
      fmt::format("expected dtype {} (that of '{}'), got {}", DTypeName(want), ArgAt(op, like).name, DTypeName(got)));
}

// No two elements of a written tensor may share memory (kernels write them
// from several threads). Sufficient test: sorted by |stride|, each stride
// clears the span of the smaller ones.
tefl_status* CheckNoSelfOverlap(const OpSchema& op, const CallArgs& a, int i) {
  const DLTensor* t = TensorAt(a, i);
  if (t->strides == nullptr) return nullptr;
  std::vector<std::pair<int64_t, int64_t>> dims;  // (|stride|, extent)
  for (int d = 0; d < t->ndim; ++d) {
    if (t->shape[d] == 0) return nullptr;  // empty: nothing is written
    if (t->shape[d] > 1) dims.emplace_back(t->strides[d] < 0 ? -t->strides[d] : t->strides[d], t->shape[d]);
  }
  std::sort(dims.begin(), dims.end());
  int64_t span = 0;  // largest offset reachable with the dims so far
  for (const auto& [stride, extent] : dims) {
    if (stride <= span) {
      std::string strides;
      for (int d = 0; d < t->ndim; ++d) strides += (d ? ", " : "") + std::to_string(t->strides[d]);
      return ArgError(
          op, i, fmt::format("strides [{}] of shape {} make distinct elements share memory", strides, ShapeString(t)));
    }
    span += stride * (extent - 1);  // no overflow: validation bounded the byte range
  }
  return nullptr;
}

// freqs argument `i`: [s_max, 1, 1, d2], d2 even and <= d.
tefl_status* CheckFreqs(const OpSchema& op, const CallArgs& a, int i, int64_t d, const char* d_of) {
  const DLTensor* freqs = TensorAt(a, i);
  if (freqs->ndim != 4 || freqs->shape[1] != 1 || freqs->shape[2] != 1)
    return ArgError(op, i, fmt::format("expected shape [s, 1, 1, d2], got {}", ShapeString(freqs)));
  const int64_t d2 = freqs->shape[3];
  if (d2 > d || d2 % 2 != 0)
    return ArgError(op, i, fmt::format("expected an even last dim d2 <= d = {} (head dim of {}), got {}", d, d_of, d2));
  return nullptr;
}

// Tensor contents are read only from host memory (a CPU call).
bool OnHost(const DLTensor* t) {
  int32_t type;
  std::memcpy(&type, &t->device.device_type, sizeof(type));
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

int64_t I32At(const DLTensor* t, int64_t i) {
  const auto* p = static_cast<const int32_t*>(DataPtr(t));
  return p[i * (t->strides ? t->strides[0] : 1)];
}

// Every position a call uses must be a row of each freqs argument. Sequence
// j (of `batches`) has local length len(j); its positions are start[j] +
// RopeLocalPosition(0 .. len - 1), the largest at len - 1 (monotonic).
template <class LenFn>
tefl_status* CheckPositions(const OpSchema& op, const CallArgs& a, int start_index, std::span<const int> freqs_index,
                            int64_t batches, LenFn len, int32_t cp_size, int32_t cp_rank) {
  const DLTensor* start = TensorAt(a, start_index);
  for (int64_t j = 0; j < batches; ++j) {
    const int64_t n = len(j);
    if (n == 0) continue;
    const int64_t offset = start ? I32At(start, j) : 0;
    if (offset < 0) return ArgError(op, start_index, fmt::format("start_positions[{}] = {} is negative", j, offset));
    const int64_t last = offset + RopeLocalPosition(n - 1, n, cp_size, cp_rank);
    for (int fi : freqs_index) {
      const int64_t rows = TensorAt(a, fi)->shape[0];
      if (last < rows) continue;
      if (start) {
        return ArgError(op, start_index,
                        fmt::format("start_positions[{}] = {} puts sequence {} at positions up to {}, past the {} "
                                    "rows of '{}'",
                                    j, offset, j, last, rows, ArgAt(op, fi).name));
      }
      return ArgError(op, fi,
                      fmt::format("expected at least {} rows (sequence {} of {} tokens reaches position {}), got {}",
                                  last + 1, j, n, last, rows));
    }
  }
  return nullptr;
}

// ---- fused_rope_forward / backward -----------------------------------------------------
tefl_status* CheckRope(const OpSchema& op, const CallArgs& a) {
  const auto* attrs = static_cast<const tefl_rope_attrs*>(a.attrs);
  const int32_t cp_size = attrs->cp_size, cp_rank = attrs->cp_rank;
  if (cp_rank >= cp_size)
    return AttrError(op, fmt::format("attribute 'cp_rank' must be < cp_size ({}), got {}", cp_size, cp_rank));
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
  if (tefl_status* e = CheckFreqs(op, a, 1, d, ArgAt(op, 0).name)) return e;
  const DLTensor* freqs = TensorAt(a, 1);
  const DLTensor* start = TensorAt(a, 2);
  const DLTensor* cu = TensorAt(a, 3);
  if (thd) {
    if (cu == nullptr) return ArgError(op, 3, "is required for qkv_format thd, got NULL");
    if (cu->ndim != 1 || cu->shape[0] < 1)
      return ArgError(op, 3, fmt::format("expected shape [b + 1] with b >= 0, got {}", ShapeString(cu)));
  } else {
    if (cu != nullptr) return ArgError(op, 3, fmt::format("must be NULL for qkv_format {}", FormatName(format)));
    if (cp_size > 1 && seq % 2 != 0) {
      return ArgError(
          op, 0,
          fmt::format("expected an even sequence length with cp_size {} (two chunks per rank), got {}", cp_size, seq));
    }
    // Without start offsets every position must have a frequency row (TE's check).
    const int64_t positions = seq * cp_size;
    if (start == nullptr && freqs->shape[0] < positions) {
      return ArgError(op, 1,
                      fmt::format("expected at least {} rows (sequence length {} x cp_size {}), got {}", positions, seq,
                                  cp_size, freqs->shape[0]));
    }
  }
  const int64_t b = thd ? cu->shape[0] - 1 : batch;
  if (start != nullptr && (start->ndim != 1 || start->shape[0] != b))
    return ArgError(op, 2, fmt::format("expected shape [{}] (the batch size), got {}", b, ShapeString(start)));
  const DLTensor* out = TensorAt(a, 4);
  if (out->ndim != x->ndim || !std::equal(out->shape, out->shape + out->ndim, x->shape)) {
    return ArgError(
        op, 4,
        fmt::format("expected shape {} (that of '{}'), got {}", ShapeString(x), ArgAt(op, 0).name, ShapeString(out)));
  }
  if (tefl_status* e = CheckSameDtype(op, a, 0, 4)) return e;
  if (tefl_status* e = CheckNoSelfOverlap(op, a, 4)) return e;

  // Contents of cu_seqlens and start_positions (host memory only).
  if (!OnHost(x)) return nullptr;
  const int freqs_index[] = {1};
  if (!thd) {
    if (start == nullptr) return nullptr;  // covered by the row count above
    return CheckPositions(
        op, a, 2, freqs_index, b, [&](int64_t) { return seq; }, cp_size, cp_rank);
  }
  // thd: cu_seqlens holds the global cumulative lengths; this rank's tokens
  // of sequence j are [cu[j] / cp_size, cu[j + 1] / cp_size) (TE).
  if (const int64_t first = I32At(cu, 0); first != 0)
    return ArgError(op, 3, fmt::format("expected cu_seqlens[0] == 0, got {}", first));
  for (int64_t j = 0; j < b; ++j) {
    const int64_t lo = I32At(cu, j), hi = I32At(cu, j + 1);
    if (hi < lo) {
      return ArgError(op, 3,
                      fmt::format("expected non-decreasing values, got cu_seqlens[{}] = {} < cu_seqlens[{}] = {}",
                                  j + 1, hi, j, lo));
    }
    const int64_t local = hi / cp_size - lo / cp_size;
    if (cp_size > 1 && local % 2 != 0) {
      return ArgError(op, 3,
                      fmt::format("expected even local sequence lengths with cp_size {} (two chunks per rank), "
                                  "sequence {} has {} tokens on this rank",
                                  cp_size, j, local));
    }
  }
  if (const int64_t total = I32At(cu, b) / cp_size; total != seq) {
    return ArgError(op, 3,
                    cp_size > 1 ? fmt::format("expected cu_seqlens[{}] / cp_size = {} to equal t = {} (tokens of '{}')",
                                              b, total, seq, ArgAt(op, 0).name)
                                : fmt::format("expected cu_seqlens[{}] = {} to equal t = {} (tokens of '{}')", b, total,
                                              seq, ArgAt(op, 0).name));
  }
  return CheckPositions(
      op, a, 2, freqs_index, b, [&](int64_t j) { return I32At(cu, j + 1) / cp_size - I32At(cu, j) / cp_size; }, cp_size,
      cp_rank);
}

// ---- fused_qkv_rope_forward / backward --------------------------------------------------
// `packed` is the qkv (forward input / backward output) argument, `parts`
// the q, k, v arguments, freqs the q_freqs / k_freqs arguments.
tefl_status* CheckQkv(const OpSchema& op, const CallArgs& a, int packed, const int (&parts)[3], const int (&freqs)[2],
                      int start_index) {
  const auto* attrs = static_cast<const tefl_qkv_rope_attrs*>(a.attrs);
  const int32_t cp_size = attrs->cp_size, cp_rank = attrs->cp_rank;
  if (cp_rank >= cp_size)
    return AttrError(op, fmt::format("attribute 'cp_rank' must be < cp_size ({}), got {}", cp_size, cp_rank));
  const bool sbhd = attrs->qkv_format == TEFL_QKV_SBHD;
  const char* fmt_name = FormatName(attrs->qkv_format);
  const int64_t splits[3] = {attrs->q_split, attrs->k_split, attrs->v_split};
  const DLTensor* qkv = TensorAt(a, packed);
  if (qkv->ndim != 4) {
    return ArgError(op, packed,
                    fmt::format("expected rank 4 for qkv_format {}, got shape {}", fmt_name, ShapeString(qkv)));
  }
  const int64_t seq = qkv->shape[sbhd ? 0 : 1], batch = qkv->shape[sbhd ? 1 : 0], h = qkv->shape[2];
  const int64_t total = splits[0] + splits[1] + splits[2];
  if (qkv->shape[3] != total) {
    return ArgError(op, packed,
                    fmt::format("expected last dim q_split + k_split + v_split = {} + {} + {} = {}, got shape {}",
                                splits[0], splits[1], splits[2], total, ShapeString(qkv)));
  }
  // The head dim d: that of q (output or grads).
  const DLTensor* q = TensorAt(a, parts[0]);
  if (q->ndim != 4) return ArgError(op, parts[0], fmt::format("expected rank 4, got shape {}", ShapeString(q)));
  const int64_t d = q->shape[3];
  if (d < 1 || splits[0] % d != 0 || splits[1] % d != 0 || splits[2] % d != 0) {
    return ArgError(op, parts[0],
                    fmt::format("expected a head dim d (last dim) >= 1 dividing q_split {}, k_split {} and v_split {}, "
                                "got shape {}",
                                splits[0], splits[1], splits[2], ShapeString(q)));
  }
  for (int p = 0; p < 3; ++p) {
    const DLTensor* t = TensorAt(a, parts[p]);
    const int64_t heads = h * (splits[p] / d);
    const int64_t s0 = sbhd ? seq : batch, s1 = sbhd ? batch : seq;
    if (!SameShape(t, {s0, s1, heads, d})) {
      return ArgError(op, parts[p],
                      fmt::format("expected shape {} ({} heads of d = {} per group of '{}' {}), got {}",
                                  ShapeOf({s0, s1, heads, d}), splits[p] / d, d, ArgAt(op, packed).name,
                                  ShapeString(qkv), ShapeString(t)));
    }
  }
  for (int fi : freqs)
    if (tefl_status* e = CheckFreqs(op, a, fi, d, ArgAt(op, parts[0]).name)) return e;
  if (TensorAt(a, freqs[1])->shape[3] != TensorAt(a, freqs[0])->shape[3]) {
    return ArgError(op, freqs[1],
                    fmt::format("expected d2 = {} (that of '{}'), got shape {}", TensorAt(a, freqs[0])->shape[3],
                                ArgAt(op, freqs[0]).name, ShapeString(TensorAt(a, freqs[1]))));
  }
  if (cp_size > 1 && seq % 2 != 0) {
    return ArgError(
        op, packed,
        fmt::format("expected an even sequence length with cp_size {} (two chunks per rank), got {}", cp_size, seq));
  }
  const DLTensor* start = TensorAt(a, start_index);
  if (start != nullptr && (start->ndim != 1 || start->shape[0] != batch))
    return ArgError(op, start_index,
                    fmt::format("expected shape [{}] (the batch size), got {}", batch, ShapeString(start)));
  if (start == nullptr) {
    for (int fi : freqs) {
      const int64_t rows = TensorAt(a, fi)->shape[0];
      if (rows < seq * cp_size) {
        return ArgError(op, fi,
                        fmt::format("expected at least {} rows (sequence length {} x cp_size {}), got {}",
                                    seq * cp_size, seq, cp_size, rows));
      }
    }
  }
  // dtypes: all like the first tensor argument; outputs without self-overlap.
  const int like = std::min(packed, parts[0]);
  for (int i : {packed, parts[0], parts[1], parts[2]}) {
    if (i == like) continue;
    if (tefl_status* e = CheckSameDtype(op, a, like, i)) return e;
  }
  const int nin = int(op.inputs.size()), n = nin + int(op.outputs.size());
  for (int i = nin; i < n; ++i)
    if (tefl_status* e = CheckNoSelfOverlap(op, a, i)) return e;
  if (start == nullptr || !OnHost(qkv)) return nullptr;
  return CheckPositions(
      op, a, start_index, freqs, batch, [&](int64_t) { return seq; }, cp_size, cp_rank);
}

tefl_status* CheckQkvFwd(const OpSchema& op, const CallArgs& a) { return CheckQkv(op, a, 0, {4, 5, 6}, {1, 2}, 3); }
tefl_status* CheckQkvBwd(const OpSchema& op, const CallArgs& a) { return CheckQkv(op, a, 6, {0, 1, 2}, {3, 4}, 5); }

constexpr const char* kFwdAliases[] = {"rope_fwd"};
constexpr const char* kBwdAliases[] = {"rope_bwd"};
constexpr uint32_t kFlags = kOpNoAlias | kOpChecksData;

const OpSchema kSchemas[] = {
    {TEFL_OP_FUSED_ROPE_FORWARD, "fused_rope_forward", "rope",
     "Rotary position embedding: out = x cos f + rotate(x) sin f on the first d2 channels, the rest copied", kFwdIn,
     kFwdOut, kAttrs, TEFL_ROPE_ATTRS_STRUCT_SIZE, &kDefaults, kFlags, CheckRope, kFwdAliases},
    {TEFL_OP_FUSED_ROPE_BACKWARD, "fused_rope_backward", "rope", "The transpose of fused_rope_forward", kBwdIn, kBwdOut,
     kAttrs, TEFL_ROPE_ATTRS_STRUCT_SIZE, &kDefaults, kFlags, CheckRope, kBwdAliases},
    {TEFL_OP_FUSED_QKV_ROPE_FORWARD,
     "fused_qkv_rope_forward",
     "rope",
     "Splits a packed qkv tensor into q, k, v and applies RoPE to q (q_freqs) and k (k_freqs)",
     kQkvFwdIn,
     kQkvFwdOut,
     kQkvAttrs,
     TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE,
     &kQkvDefaults,
     kFlags,
     CheckQkvFwd,
     {}},
    {TEFL_OP_FUSED_QKV_ROPE_BACKWARD,
     "fused_qkv_rope_backward",
     "rope",
     "The transpose of fused_qkv_rope_forward: q, k, v gradients packed back into one qkv gradient",
     kQkvBwdIn,
     kQkvBwdOut,
     kQkvAttrs,
     TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE,
     &kQkvDefaults,
     kFlags,
     CheckQkvBwd,
     {}},
};

}  // namespace

std::span<const OpSchema> RopeSchemas() { return kSchemas; }

}  // namespace tefl
