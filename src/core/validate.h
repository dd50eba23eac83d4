// Schema validation of a call and its signature key. Runs before any kernel;
// an error names the op, the argument and what was expected, and nothing has
// been written.
#ifndef TEFL_SRC_CORE_VALIDATE_H_
#define TEFL_SRC_CORE_VALIDATE_H_

#include <fmt/format.h>

#include <cstdint>
#include <cstring>
#include <string>

#include "core/catalogue.h"

namespace tefl {

// The call signature: what supports() may depend on. Word 0: op id, device
// type, argument count; word 1: signature attribute bits; words 2-4: per
// tensor 12 bits (dtype 4, rank 5, contiguous 1, present 1), 5 per word.
struct SigKey {
  uint64_t w[5];
  bool operator==(const SigKey& o) const {
    return w[0] == o.w[0] && w[1] == o.w[1] && w[2] == o.w[2] && w[3] == o.w[3] && w[4] == o.w[4];
  }
  uint64_t Hash() const {
    uint64_t h = w[0] * 0x9E3779B97F4A7C15ull;
    for (int i = 1; i < 5; ++i) h = (h ^ w[i]) * 0xBF58476D1CE4E5B9ull;
    return h ^ (h >> 31);
  }
};
struct SigKeyHash {
  size_t operator()(const SigKey& k) const { return size_t(k.Hash()); }
};

// Normalises `attrs` (NULL or any struct_size) into `buffer` when needed and
// returns the pointer kernels get; on error returns NULL and sets *error.
// `buffer` must hold kMaxAttrsSize bytes.
constexpr size_t kMaxAttrsSize = 256;
const void* NormalizeAttrsSlow(const OpSchema& op, const void* attrs, void* buffer, tefl_status** error);
inline const void* NormalizeAttrs(const OpSchema& op, const void* attrs, void* buffer, tefl_status** error) {
  if (attrs != nullptr && op.attrs_size != 0) {
    size_t given;
    std::memcpy(&given, attrs, sizeof(size_t));
    if (given >= op.attrs_size) {  // the common case: this struct or a newer one
      *error = nullptr;
      return attrs;
    }
  }
  return NormalizeAttrsSlow(op, attrs, buffer, error);
}

// A call with the argument counts of an op's first release (OpSchema::
// first_inputs/first_outputs): copies its arrays into in_buf/out_buf
// (kMaxOpArgs each) with the arguments added since as NULL, and points *args
// at them, so everything after sees the op's full arity. Other counts are left
// for validation to judge.
inline void PadToFullArity(const OpSchema& op, CallArgs* args, const DLTensor** in_buf, DLTensor** out_buf) {
  if (op.first_inputs < 0 || args->num_inputs != op.first_inputs || args->num_outputs != op.first_outputs) return;
  const int nin = int(op.inputs.size()), nout = int(op.outputs.size());
  for (int i = 0; i < nin; ++i) in_buf[i] = i < args->num_inputs ? args->inputs[i] : nullptr;
  for (int i = 0; i < nout; ++i) out_buf[i] = i < args->num_outputs ? args->outputs[i] : nullptr;
  args->inputs = in_buf;
  args->outputs = out_buf;
  args->num_inputs = nin;
  args->num_outputs = nout;
}

// Validates the call (arity, presence, dtypes, ranks, devices, NULL data,
// alignment, contiguity, attribute ranges, shape relations, aliasing) and
// fills *key. `ranges`, when given, receives each tensor's byte range
// ([0, 0) when absent or empty).
struct ByteRanges {
  uintptr_t lo[kMaxOpArgs], hi[kMaxOpArgs];
};
tefl_status* ValidateCall(const OpSchema& op, const CallArgs& args, SigKey* key, ByteRanges* ranges = nullptr);

// Overlap screen of the memo and prepared-call paths: false when some output overlaps
// another argument (the full validation then names the pair, or accepts the
// op's exact in-place alias).
inline bool NoOverlap(int nin, int n, const uintptr_t* lo, const uintptr_t* hi) {
  // Each output against every earlier argument covers every pair that
  // involves an output once.
  for (int o = nin; o < n; ++o) {
    const uintptr_t olo = lo[o], ohi = hi[o];
    for (int i = 0; i < o; ++i)
      if (lo[i] < ohi && olo < hi[i]) return false;
  }
  return true;
}

// A per-thread memo of validated calls, keyed by everything validation reads
// except data pointers: op, attributes, and each tensor's presence, dtype,
// rank, shape, strides and device. A call that matches an entry re-runs only
// the pointer checks (NULL data, alignment, aliasing) and, for kOpChecksData
// ops, check_shapes (it reads tensor contents), and reuses the key; any
// failure, and every miss, goes through ValidateCall, whose errors are the
// only ones reported. Not thread-safe: one per thread.
struct ValidationMemo {
  static constexpr int kSlots = 64;    // direct-mapped by op id
  static constexpr int kMaxDims = 48;  // shape + stride values per entry
  static constexpr size_t kMaxAttrBytes = 128;
  struct Tensor {
    uint64_t device;         // DLDevice as one word
    uint64_t ndim_dtype;     // DLTensor's adjacent ndim and dtype as one word
    int32_t ndim;            // -1: absent
    int32_t dims_at;         // first of this tensor's values in dims
    uint64_t strided;        // 0 or 1: strides given
    uint64_t align_mask;     // element bytes - 1: the data alignment check
    int64_t lo_off, hi_off;  // byte range relative to data + byte_offset; equal: empty
  };
  // What the caller resolved for this entry's calls (the manager's dispatch
  // chain and what it depends on); cleared whenever the entry is rewritten.
  struct Resolution {
    const void* chain = nullptr;
    uint64_t owner_serial = 0;
    uint64_t epoch = 0;
    uint32_t policy_id = 0;
  };
  struct Entry {
    int32_t op_id = -1;
    int32_t n = 0;
    SigKey key{};  // without the in-place bit
    Resolution resolution;
    alignas(8) unsigned char attrs[kMaxAttrBytes];
    Tensor t[kMaxOpArgs];
    int64_t dims[kMaxDims];
  };
  Entry entries[kSlots];
};
// On success, *entry (when given) is the memo entry that matches this call
// from now on, or NULL when the call is not remembered (too big to memo, or
// an in-place call, whose key differs from the entry's).
tefl_status* ValidateCallMemo(const OpSchema& op, const CallArgs& args, SigKey* key, ValidationMemo* memo,
                              ValidationMemo::Entry** entry = nullptr);

// Human-readable signature of a call, e.g. "x:bfloat16[8,4096] gamma:float32[4096]".
std::string DescribeCall(const OpSchema& op, const CallArgs& args, bool with_shapes);
// "[8, 4096]"
std::string ShapeString(const DLTensor* t);

// Positional argument i (inputs then outputs): its schema and its tensor.
inline const ArgSchema& ArgAt(const OpSchema& op, int i) {
  const int nin = int(op.inputs.size());
  return i < nin ? op.inputs[size_t(i)] : op.outputs[size_t(i - nin)];
}
inline const DLTensor* TensorAt(const CallArgs& args, int i) {
  return i < args.num_inputs ? args.inputs[i] : args.outputs[i - args.num_inputs];
}

// Error helpers for shape checks: "<op>: argument '<name>' (input 1): <what>".
tefl_status* ArgError(const OpSchema& op, int arg_index, const std::string& what);

}  // namespace tefl

#endif  // TEFL_SRC_CORE_VALIDATE_H_
