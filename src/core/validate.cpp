#include "core/validate.h"

#include <cstddef>
#include <cstring>

#include "core/device.h"

namespace tefl {

static std::string ArgLabel(const OpSchema& op, int i) {
  const int nin = int(op.inputs.size());
  return i < nin ? fmt::format("'{}' (input {})", op.inputs[size_t(i)].name, i)
                 : fmt::format("'{}' (output {})", op.outputs[size_t(i - nin)].name, i - nin);
}

tefl_status* ArgError(const OpSchema& op, int arg_index, const std::string& what) {
  return tefl_status_new(TEFL_INVALID_ARGUMENT,
                         fmt::format("{}: argument {}: {}", op.name, ArgLabel(op, arg_index), what).c_str());
}

std::string ShapeString(const DLTensor* t) {
  std::string s = "[";
  for (int d = 0; d < t->ndim; ++d) s += (d ? ", " : "") + std::to_string(t->shape[d]);
  return s + "]";
}

static std::string DTypeSetString(DTypeSet set) {
  std::string s;
  for (int i = 0; i < 16; ++i)
    if (set & (1u << i)) s += (s.empty() ? "" : ", ") + std::string(DTypeName(DType(i)));
  return "{" + s + "}";
}

static std::string DLTypeString(DLDataType t) {
  DType d = DTypeOf(t);
  if (d != DType::kUnknown) return DTypeName(d);
  return fmt::format("(code={}, bits={}, lanes={})", t.code, t.bits, t.lanes);
}

const void* NormalizeAttrsSlow(const OpSchema& op, const void* attrs, void* buffer, tefl_status** error) {
  *error = nullptr;
  if (op.attrs_size == 0) {
    if (attrs != nullptr)  // an attrs struct meant for another op: the call is not what the caller thinks
      *error = tefl_status_new(TEFL_INVALID_ARGUMENT,
                               fmt::format("{}: the op has no attributes, expected attrs NULL", op.name).c_str());
    return nullptr;
  }
  if (attrs == nullptr) return op.attrs_defaults;
  size_t given;
  std::memcpy(&given, attrs, sizeof(size_t));
  if (given >= op.attrs_size) return attrs;  // same or newer struct: read our prefix
  // An older caller's struct ends where one of its fields ends: a size inside
  // a field would piece that field together from two sources.
  const AttrSchema* cut = nullptr;
  size_t cut_end = 0;
  for (const AttrSchema& a : op.attrs) {
    const size_t end = a.offset + (a.type == AttrType::kU64 ? 8 : 4);
    if (given > a.offset && given < end) cut = &a, cut_end = end;
  }
  if (given < sizeof(size_t) || cut != nullptr) {
    *error = tefl_status_new(
        TEFL_INVALID_ARGUMENT,
        fmt::format(
            "{}: attrs.struct_size is {}{}, expected {} (the TEFL_*_ATTRS_STRUCT_SIZE of the header the caller "
            "was built with; an older header's size also works)",
            op.name, given,
            cut ? fmt::format(", which ends inside attribute '{}' (bytes {} to {})", cut->name, cut->offset, cut_end)
                : "",
            op.attrs_size)
            .c_str());
    return nullptr;
  }
  // Older caller: defaults for the fields it does not know.
  std::memcpy(buffer, op.attrs_defaults, op.attrs_size);
  std::memcpy(static_cast<char*>(buffer) + sizeof(size_t), static_cast<const char*>(attrs) + sizeof(size_t),
              given - sizeof(size_t));
  std::memcpy(buffer, &op.attrs_size, sizeof(size_t));
  return buffer;
}

namespace {

// A DLDevice's type as the caller wrote it: an int, not yet known to be one
// of DLDeviceType's values (reading it as the enum would be undefined).
int32_t RawDeviceType(const DLDevice& d) {
  int32_t v;
  std::memcpy(&v, &d.device_type, sizeof(v));
  return v;
}

bool ExactAlias(const DLTensor* a, const DLTensor* b) {
  if (a->data != b->data || a->byte_offset != b->byte_offset || a->ndim != b->ndim) return false;
  if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits || a->dtype.lanes != b->dtype.lanes)
    return false;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return false;
    const int64_t sa = a->strides ? a->strides[d] : -1, sb = b->strides ? b->strides[d] : -1;
    if (sa != sb) return false;
  }
  return true;
}

// Byte range [lo, hi) a non-empty tensor's elements occupy. False when the
// strides put an element beyond what int64 byte offsets can address.
bool ByteRange(const DLTensor* t, int64_t numel, uintptr_t* lo, uintptr_t* hi) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  const int64_t bits = t->dtype.bits * int64_t(t->dtype.lanes);
  if (t->strides == nullptr) {
    *lo = base;
    *hi = base + (uintptr_t(numel * bits + 7) >> 3);
    return true;
  }
  int64_t min_off = 0, max_off = 0;
  bool overflow = false;
  for (int d = 0; d < t->ndim; ++d) {
    int64_t span;
    overflow |= __builtin_mul_overflow(t->shape[d] - 1, t->strides[d], &span);
    overflow |= __builtin_add_overflow(span < 0 ? min_off : max_off, span, span < 0 ? &min_off : &max_off);
  }
  int64_t lo_bits, hi_bits, end_off;
  overflow |= __builtin_add_overflow(max_off, int64_t(1), &end_off);
  overflow |= __builtin_mul_overflow(min_off, bits, &lo_bits);
  overflow |= __builtin_mul_overflow(end_off, bits, &hi_bits);
  if (overflow || hi_bits > (int64_t(1) << 62)) return false;
  *lo = base + uintptr_t(lo_bits / 8);
  *hi = base + (uintptr_t(hi_bits + 7) >> 3);
  return true;
}

}  // namespace

tefl_status* ValidateCall(const OpSchema& op, const CallArgs& args, SigKey* key, ByteRanges* ranges) {
  const int nin = int(op.inputs.size());
  const int nout = int(op.outputs.size());
  if (args.num_inputs != nin || args.num_outputs != nout) {
    const std::string first = op.first_inputs < 0 ? std::string()
                                                  : fmt::format(" (or {} and {}, the op's first form)",
                                                                int(op.first_inputs), int(op.first_outputs));
    return tefl_status_new(TEFL_INVALID_ARGUMENT,
                           fmt::format("{}: expected {} inputs and {} outputs{}, got {} and {}", op.name, nin, nout,
                                       first, args.num_inputs, args.num_outputs)
                               .c_str());
  }
  if ((nin > 0 && args.inputs == nullptr) || (nout > 0 && args.outputs == nullptr)) {
    const bool in = nin > 0 && args.inputs == nullptr;
    return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: the {} array is NULL, expected {} tensors", op.name,
                                                              in ? "inputs" : "outputs", in ? nin : nout)
                                                      .c_str());
  }
  const int n = nin + nout;
  uint64_t tw[3] = {0, 0, 0};
  int tw_word = 0, tw_shift = 0;
  const DLTensor* first = nullptr;
  int first_index = -1;
  ByteRanges local_ranges;
  ByteRanges& r = ranges ? *ranges : local_ranges;
  uintptr_t* lo = r.lo;  // byte range of each tensor (empty: lo == hi == 0)
  uintptr_t* hi = r.hi;
  uint64_t device_bits = 0;  // DLDevice of the first tensor, as one word
  for (int i = 0; i < n; ++i) {
    // Inputs then outputs (no copy into a flat array: this loop is the hot path).
    const bool is_input = i < nin;
    const DLTensor* t = is_input ? args.inputs[i] : args.outputs[i - nin];
    const ArgSchema& schema = is_input ? op.inputs.data()[i] : op.outputs.data()[i - nin];
    lo[i] = hi[i] = 0;  // an empty range never overlaps
    if (t == nullptr) {
      if (!schema.optional) return ArgError(op, i, "is required, got NULL");
      tw_shift += 12;  // absent: all code bits 0
      if (tw_shift == 60) tw_shift = 0, ++tw_word;
      continue;
    }
    const DType dt = DTypeOf(t->dtype);
    if (!((schema.dtypes >> unsigned(dt)) & 1u)) {
      return ArgError(
          op, i, fmt::format("expected dtype in {}, got {}", DTypeSetString(schema.dtypes), DLTypeString(t->dtype)));
    }
    const int ndim = t->ndim;
    if (unsigned(ndim) > 31u) return ArgError(op, i, fmt::format("expected rank 0..31, got {}", ndim));
    const int64_t* shape = t->shape;
    if (ndim > 0 && shape == nullptr) return ArgError(op, i, "shape is NULL");
    int64_t numel = 1, any_negative = 0;
    bool compact = true, overflow = false;
    if (t->strides == nullptr) {
      for (int d = 0; d < ndim; ++d) {
        overflow |= __builtin_mul_overflow(numel, shape[d], &numel);
        any_negative |= shape[d];
      }
    } else {
      int64_t expected_stride = 1;
      for (int d = ndim - 1; d >= 0; --d) {
        if (shape[d] != 1 && t->strides[d] != expected_stride) compact = false;
        overflow |= __builtin_mul_overflow(expected_stride, shape[d], &expected_stride);
        any_negative |= shape[d];
      }
      numel = expected_stride;
      // An empty tensor has no element to address: any strides describe it
      // (torch gives [3, 0, 4] the strides [4, 4, 1]), so it counts as compact.
      if (numel == 0) compact = true;
    }
    if (any_negative < 0) {
      for (int d = 0; d < ndim; ++d)
        if (shape[d] < 0) return ArgError(op, i, fmt::format("dimension {} is negative ({})", d, shape[d]));
    }
    if (overflow) {
      // The product overflowed before it reached a zero dimension: a tensor
      // with a zero dimension has no elements whatever its others are
      // ([2^62, 4, 0] is valid, and empty).
      for (int d = 0; d < ndim; ++d)
        if (shape[d] == 0) overflow = false, numel = 0, compact = true;
    }
    // Element count (and its bytes, below) must fit: a shape from a corrupt
    // caller must not turn into wrapped arithmetic.
    if (overflow || numel > (int64_t(1) << 56)) {
      return ArgError(op, i, fmt::format("shape {} has too many elements", ShapeString(t)));
    }
    if (numel > 0) {
      if (t->data == nullptr) return ArgError(op, i, fmt::format("data is NULL for a tensor of {} elements", numel));
      // Kernels may load whole elements: the first element must be aligned to its size.
      const uintptr_t first_byte = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
      const unsigned elem_bytes = t->dtype.bits >= 8 ? t->dtype.bits / 8u : 1u;
      if (first_byte & (elem_bytes - 1)) {
        return ArgError(op, i,
                        fmt::format("data + byte_offset is not aligned to the element size ({} bytes)", elem_bytes));
      }
      if (!ByteRange(t, numel, &lo[i], &hi[i]))
        return ArgError(op, i, fmt::format("strides of shape {} address beyond 2^62 bytes", ShapeString(t)));
    }
    if (const int32_t type = RawDeviceType(t->device); uint32_t(type) >= uint32_t(kMaxDeviceTypes)) {
      return ArgError(op, i, fmt::format("device type {} is out of range (0..{})", type, kMaxDeviceTypes - 1));
    }
    uint64_t dev;
    static_assert(sizeof(DLDevice) == sizeof(dev));
    std::memcpy(&dev, &t->device, sizeof(dev));
    if (first == nullptr) {
      first = t;
      first_index = i;
      device_bits = dev;
    } else if (dev != device_bits) {
      return ArgError(
          op, i,
          fmt::format("expected device {}:{} (that of {}), got {}:{}", DeviceTypeName(RawDeviceType(first->device)),
                      first->device.device_id, ArgLabel(op, first_index), DeviceTypeName(RawDeviceType(t->device)),
                      t->device.device_id));
    }
    if (!compact && (op.flags & kOpContiguous)) {
      std::string strides;
      for (int d = 0; d < ndim; ++d) strides += (d ? ", " : "") + std::to_string(t->strides[d]);
      return ArgError(op, i,
                      fmt::format("expected a contiguous row-major tensor, got shape {} with strides [{}]",
                                  ShapeString(t), strides));
    }
    const uint64_t code = uint64_t(dt) | uint64_t(ndim) << 4 | uint64_t(compact) << 9 | uint64_t(1) << 10;
    tw[tw_word] |= code << tw_shift;
    tw_shift += 12;
    if (tw_shift == 60) tw_shift = 0, ++tw_word;
  }
  // Attributes: ranges, and the bits that enter the signature.
  uint64_t attr_bits = 0;
  int shift = 0;
  for (const AttrSchema& at : op.attrs) {
    const char* p = static_cast<const char*>(args.attrs) + at.offset;
    if (at.type == AttrType::kU64) continue;  // every value is valid
    double v;
    int64_t iv = 0;
    if (at.type == AttrType::kF32) {
      float f;
      std::memcpy(&f, p, 4);
      v = f;
    } else {
      int32_t x;
      std::memcpy(&x, p, 4);
      v = x;
      iv = x;
    }
    if (!(v >= at.min_value && v <= at.max_value)) {  // also rejects NaN
      return tefl_status_new(TEFL_INVALID_ARGUMENT,
                             fmt::format("{}: attribute '{}' must be {}{}, got {}", op.name, at.name,
                                         at.type == AttrType::kBool ? "" : "in ", AttrRangeString(at),
                                         at.type == AttrType::kF32 ? fmt::format("{}", float(v)) : fmt::format("{}", v))
                                 .c_str());
    }
    if (at.signature_bits) {
      attr_bits |= (uint64_t(iv) & ((uint64_t(1) << at.signature_bits) - 1)) << shift;
      shift += at.signature_bits;
    }
  }
  if (op.check_shapes) {
    if (tefl_status* e = op.check_shapes(op, args)) return e;
  }
  bool in_place = false;
  if (op.flags & kOpNoAlias) {
    // A quick screen first (empty ranges are [0, 0) and never overlap); the
    // loop that names the pair runs only when something overlaps.
    const bool any_overlap = !NoOverlap(nin, n, lo, hi);
    for (int o = nin; any_overlap && o < n; ++o) {
      for (int i = 0; i < n; ++i) {  // every output against every other argument
        if (i == o || !(lo[i] < hi[o] && lo[o] < hi[i])) continue;
        if (o - nin == op.inplace_output && i == op.inplace_input && ExactAlias(TensorAt(args, o), TensorAt(args, i))) {
          in_place = true;
          continue;
        }
        // Two outputs overlapping is never in place; an output over an input is
        // in place only where the op allows it (exactly that pair, exactly aliased).
        const std::string why = i >= nin                 ? "outputs must not share memory"
                                : op.inplace_output >= 0 ? fmt::format("only '{}' may be exactly '{}' (in place)",
                                                                       op.outputs[size_t(op.inplace_output)].name,
                                                                       op.inputs[size_t(op.inplace_input)].name)
                                                         : fmt::format("{} does not work in place", op.name);
        return ArgError(op, o, fmt::format("overlaps {} in memory; {}", ArgLabel(op, i), why));
      }
    }
  }
  const int32_t device_type = first ? RawDeviceType(first->device) : kDLCPU;
  key->w[0] = uint64_t(uint32_t(op.id)) | uint64_t(uint32_t(device_type) & 0xFF) << 32 | uint64_t(n) << 40 |
              (in_place ? kSigInPlaceBit : 0);
  key->w[1] = attr_bits;
  key->w[2] = tw[0];
  key->w[3] = tw[1];
  key->w[4] = tw[2];
  return nullptr;
}

namespace {

// Remembers a validated call in *e; false when it is too big to remember.
bool MemoStore(const OpSchema& op, const CallArgs& args, const SigKey& key, const ByteRanges& ranges,
               ValidationMemo::Entry* e) {
  const int n = args.num_inputs + args.num_outputs;
  if (op.attrs_size > ValidationMemo::kMaxAttrBytes || op.attrs_size % 4 != 0) return false;
  int dims_used = 0;
  for (int i = 0; i < n; ++i) {
    const DLTensor* t = TensorAt(args, i);
    if (t != nullptr) dims_used += t->ndim * (t->strides ? 2 : 1);
  }
  if (dims_used > ValidationMemo::kMaxDims) return false;  // too big to remember: validate every time
  e->op_id = -1;                                           // invalid while being written
  e->resolution = ValidationMemo::Resolution{};
  dims_used = 0;
  for (int i = 0; i < n; ++i) {
    const DLTensor* t = TensorAt(args, i);
    ValidationMemo::Tensor& m = e->t[i];
    if (t == nullptr) {
      m = ValidationMemo::Tensor{0, 0, -1, 0, 0, 0, 0, 0};
      continue;
    }
    std::memcpy(&m.device, &t->device, 8);
    std::memcpy(&m.ndim_dtype, &t->ndim, 8);
    m.ndim = t->ndim;
    m.dims_at = dims_used;
    m.strided = t->strides != nullptr ? 1 : 0;
    m.align_mask = uint64_t(t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1) - 1;
    for (int d = 0; d < t->ndim; ++d) e->dims[dims_used++] = t->shape[d];
    if (m.strided)
      for (int d = 0; d < t->ndim; ++d) e->dims[dims_used++] = t->strides[d];
    const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    const bool empty = ranges.lo[i] == ranges.hi[i];
    m.lo_off = empty ? 0 : int64_t(ranges.lo[i] - base);
    m.hi_off = empty ? 0 : int64_t(ranges.hi[i] - base);
  }
  if (op.attrs_size) std::memcpy(e->attrs, args.attrs, op.attrs_size);
  e->n = n;
  e->key = key;
  e->key.w[0] &= ~kSigInPlaceBit;
  e->op_id = op.id;
  return true;
}

// Byte equality of the remembered attributes (size a multiple of 4), without
// a library call: 8-byte words, then a 4-byte tail.
inline bool AttrsEqual(const unsigned char* remembered, const void* given, size_t size) {
  const auto* g = static_cast<const unsigned char*>(given);
  uint64_t diff = 0;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, remembered + i, 8);
    std::memcpy(&y, g + i, 8);
    diff |= x ^ y;
  }
  if (i < size) {
    uint32_t x, y;
    std::memcpy(&x, remembered + i, 4);
    std::memcpy(&y, g + i, 4);
    diff |= x ^ y;
  }
  return diff == 0;
}

// The hit test of one tensor against its remembered metadata: accumulates
// any difference into *diff (0 = same) and sets its byte range. Metadata are
// compared before the shape is read, so a different rank never reads past
// the caller's shape array, and a NULL shape (or NULL strides where strides
// were remembered) is a miss: only ValidateCall reports such a tensor, and
// nothing here reads through it. (Remembered entries passed ValidateCall, so
// a remembered rank > 0 had a shape.)
inline bool MemoTensorMatches(const DLTensor* t, const ValidationMemo::Tensor& m, const int64_t* dims, uintptr_t* lo,
                              uintptr_t* hi) {
  if (t == nullptr) {
    *lo = *hi = 0;
    return m.ndim == -1;
  }
  uint64_t device, ndim_dtype;
  std::memcpy(&device, &t->device, 8);
  static_assert(offsetof(DLTensor, dtype) == offsetof(DLTensor, ndim) + 4, "ndim and dtype are one word");
  std::memcpy(&ndim_dtype, &t->ndim, 8);
  if (((device ^ m.device) | (ndim_dtype ^ m.ndim_dtype) | (uint64_t(t->strides != nullptr) ^ m.strided)) != 0 ||
      m.ndim < 0 || (m.ndim > 0 && t->shape == nullptr))
    return false;
  const int64_t* here = dims + m.dims_at;
  uint64_t diff = 0;
  for (int d = 0; d < m.ndim; ++d) diff |= uint64_t(t->shape[d] ^ here[d]);
  if (m.strided)
    for (int d = 0; d < m.ndim; ++d) diff |= uint64_t(t->strides[d] ^ here[m.ndim + d]);
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  const bool non_empty = m.lo_off != m.hi_off;
  // A non-empty tensor: the pointer checks of ValidateCall (data, alignment).
  if (non_empty) diff |= uint64_t(t->data == nullptr) | (base & m.align_mask);
  *lo = non_empty ? base + uintptr_t(m.lo_off) : 0;
  *hi = non_empty ? base + uintptr_t(m.hi_off) : 0;
  return diff == 0;
}

}  // namespace

tefl_status* ValidateCallMemo(const OpSchema& op, const CallArgs& args, SigKey* key, ValidationMemo* memo,
                              ValidationMemo::Entry** entry) {
  const int nin = int(op.inputs.size());
  const int nout = int(op.outputs.size());
  ValidationMemo::Entry& e = memo->entries[size_t(op.id) % ValidationMemo::kSlots];
  ByteRanges ranges;
  bool hit = e.op_id == op.id && args.num_inputs == nin && args.num_outputs == nout && args.inputs != nullptr &&
             args.outputs != nullptr && (op.attrs_size == 0 || AttrsEqual(e.attrs, args.attrs, op.attrs_size));
  for (int i = 0; hit && i < nin; ++i)
    hit = MemoTensorMatches(args.inputs[i], e.t[i], e.dims, &ranges.lo[i], &ranges.hi[i]);
  for (int o = 0; hit && o < nout; ++o)
    hit = MemoTensorMatches(args.outputs[o], e.t[nin + o], e.dims, &ranges.lo[nin + o], &ranges.hi[nin + o]);
  if (hit && (!(op.flags & kOpNoAlias) || NoOverlap(nin, nin + nout, ranges.lo, ranges.hi))) {
    // Tensor contents are not part of the memo: an op that checks them
    // re-runs its check (its errors are the full validation's errors).
    if ((op.flags & kOpChecksData) && op.check_shapes != nullptr) {
      if (tefl_status* err = op.check_shapes(op, args)) return err;
    }
    *key = e.key;
    if (entry) *entry = &e;
    return nullptr;
  }
  tefl_status* error = ValidateCall(op, args, key, &ranges);
  if (error == nullptr) {
    const bool stored = MemoStore(op, args, *key, ranges, &e);
    if (entry) *entry = stored && !(key->w[0] & kSigInPlaceBit) ? &e : nullptr;
  }
  return error;
}

std::string DescribeCall(const OpSchema& op, const CallArgs& args, bool with_shapes) {
  std::string s;
  const int n = int(op.inputs.size() + op.outputs.size());
  for (int i = 0; i < n && i < args.num_inputs + args.num_outputs; ++i) {
    if (i == int(op.inputs.size())) s += " ->";
    const DLTensor* t = TensorAt(args, i);
    s += fmt::format("{}{}:", s.empty() ? "" : " ", ArgAt(op, i).name);
    if (t == nullptr) {
      s += "none";
      continue;
    }
    s += DLTypeString(t->dtype);
    if (with_shapes) {
      s += ShapeString(t);
    } else {
      s += fmt::format("[{}d]", t->ndim);
    }
  }
  return s;
}

}  // namespace tefl
