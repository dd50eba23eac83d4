#include "core/validate.h"

#include <cmath>
#include <cstring>

#include "core/device.h"

namespace tefl {

const ArgSchema& ArgAt(const OpSchema& op, int i) {
  const int nin = int(op.inputs.size());
  return i < nin ? op.inputs[size_t(i)] : op.outputs[size_t(i - nin)];
}

const DLTensor* TensorAt(const CallArgs& args, int i) {
  return i < args.num_inputs ? args.inputs[i] : args.outputs[i - args.num_inputs];
}

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

const void* NormalizeAttrs(const OpSchema& op, const void* attrs, void* buffer, tefl_status** error) {
  *error = nullptr;
  if (op.attrs_size == 0) return nullptr;
  if (attrs == nullptr) return op.attrs_defaults;
  size_t given;
  std::memcpy(&given, attrs, sizeof(size_t));
  if (given >= op.attrs_size) return attrs;  // same or newer struct: read our prefix
  if (given < sizeof(size_t)) {
    *error = tefl_status_new(
        TEFL_INVALID_ARGUMENT,
        fmt::format("{}: attrs.struct_size is {}, expected >= {} (set it to sizeof the attrs struct)",
                    op.name, given, sizeof(size_t))
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

bool ExactAlias(const DLTensor* a, const DLTensor* b) {
  if (a->data != b->data || a->byte_offset != b->byte_offset || a->ndim != b->ndim) return false;
  if (a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits || a->dtype.lanes != b->dtype.lanes) return false;
  for (int d = 0; d < a->ndim; ++d) {
    if (a->shape[d] != b->shape[d]) return false;
    const int64_t sa = a->strides ? a->strides[d] : -1, sb = b->strides ? b->strides[d] : -1;
    if (sa != sb) return false;
  }
  return true;
}

// Byte range [lo, hi) a tensor's elements occupy.
void ByteRange(const DLTensor* t, int64_t numel, uintptr_t* lo, uintptr_t* hi) {
  const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
  if (numel == 0) {
    *lo = *hi = base;
    return;
  }
  const int64_t bits = t->dtype.bits * int64_t(t->dtype.lanes);
  if (t->strides == nullptr) {
    *lo = base;
    *hi = base + uintptr_t((numel * bits + 7) / 8);
    return;
  }
  int64_t min_off = 0, max_off = 0;
  for (int d = 0; d < t->ndim; ++d) {
    const int64_t span = (t->shape[d] - 1) * t->strides[d];
    (span < 0 ? min_off : max_off) += span;
  }
  *lo = base + uintptr_t(min_off * bits / 8);
  *hi = base + uintptr_t(((max_off + 1) * bits + 7) / 8);
}

}  // namespace

tefl_status* ValidateCall(const OpSchema& op, const CallArgs& args, SigKey* key) {
  const int nin = int(op.inputs.size());
  const int nout = int(op.outputs.size());
  if (args.num_inputs != nin || args.num_outputs != nout) {
    return tefl_status_new(TEFL_INVALID_ARGUMENT,
                           fmt::format("{}: expected {} inputs and {} outputs, got {} and {}", op.name, nin,
                                       nout, args.num_inputs, args.num_outputs)
                               .c_str());
  }
  if ((nin > 0 && args.inputs == nullptr) || (nout > 0 && args.outputs == nullptr)) {
    return tefl_status_new(TEFL_INVALID_ARGUMENT,
                           fmt::format("{}: the inputs/outputs array is NULL", op.name).c_str());
  }
  const int n = nin + nout;
  uint64_t tw[3] = {0, 0, 0};
  const DLTensor* first = nullptr;
  int first_index = -1;
  int64_t numels[kMaxOpArgs];
  for (int i = 0; i < n; ++i) {
    const DLTensor* t = TensorAt(args, i);
    const ArgSchema& a = ArgAt(op, i);
    numels[i] = 0;
    if (t == nullptr) {
      if (!a.optional) return ArgError(op, i, "is required, got NULL");
      continue;
    }
    const DType dt = DTypeOf(t->dtype);
    if (!(Bit(dt) & a.dtypes)) {
      return ArgError(op, i,
                      fmt::format("expected dtype in {}, got {}", DTypeSetString(a.dtypes), DLTypeString(t->dtype)));
    }
    if (t->ndim < 0 || t->ndim > 31) return ArgError(op, i, fmt::format("expected rank 0..31, got {}", t->ndim));
    if (t->ndim > 0 && t->shape == nullptr) return ArgError(op, i, "shape is NULL");
    int64_t numel = 1;
    bool compact = true;
    int64_t expected_stride = 1;
    for (int d = t->ndim - 1; d >= 0; --d) {
      const int64_t extent = t->shape[d];
      if (extent < 0) return ArgError(op, i, fmt::format("dimension {} is negative ({})", d, extent));
      if (t->strides && extent != 1 && t->strides[d] != expected_stride) compact = false;
      expected_stride *= extent;
      numel *= extent;
    }
    numels[i] = numel;
    if (numel > 0 && t->data == nullptr) {
      return ArgError(op, i, fmt::format("data is NULL for a tensor of {} elements", numel));
    }
    if (first == nullptr) {
      first = t;
      first_index = i;
    } else if (t->device.device_type != first->device.device_type || t->device.device_id != first->device.device_id) {
      return ArgError(op, i,
                      fmt::format("expected device {}:{} (that of {}), got {}:{}",
                                  DeviceTypeName(first->device.device_type), first->device.device_id,
                                  ArgLabel(op, first_index), DeviceTypeName(t->device.device_type),
                                  t->device.device_id));
    }
    if ((op.flags & kOpContiguous) && !compact) {
      std::string strides;
      for (int d = 0; d < t->ndim; ++d) strides += (d ? ", " : "") + std::to_string(t->strides[d]);
      return ArgError(op, i, fmt::format("expected a contiguous row-major tensor, got shape {} with strides [{}]",
                                         ShapeString(t), strides));
    }
    const uint64_t code = uint64_t(dt) | uint64_t(t->ndim) << 4 | uint64_t(compact) << 9 | uint64_t(1) << 10;
    tw[i / 5] |= code << (12 * (i % 5));
  }
  // Attributes: ranges, and the bits that enter the signature.
  uint64_t attr_bits = 0;
  int shift = 0;
  for (const AttrSchema& at : op.attrs) {
    const char* p = static_cast<const char*>(args.attrs) + at.offset;
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
                             fmt::format("{}: attribute '{}' must be in [{}, {}], got {}", op.name, at.name,
                                         at.min_value, at.max_value, v)
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
    for (int o = nin; o < n; ++o) {
      const DLTensor* out = TensorAt(args, o);
      if (out == nullptr || numels[o] == 0) continue;
      uintptr_t olo, ohi;
      ByteRange(out, numels[o], &olo, &ohi);
      for (int i = 0; i < n; ++i) {
        if (i == o) continue;
        const DLTensor* other = TensorAt(args, i);
        if (other == nullptr || numels[i] == 0) continue;
        uintptr_t lo, hi;
        ByteRange(other, numels[i], &lo, &hi);
        if (lo < ohi && olo < hi) {
          if (o - nin == op.inplace_output && i == op.inplace_input && ExactAlias(out, other)) {
            in_place = true;
            continue;
          }
          return ArgError(op, o, fmt::format("overlaps {} in memory; {} does not work in place", ArgLabel(op, i),
                                             op.name));
        }
      }
    }
  }
  const int32_t device_type = first ? first->device.device_type : kDLCPU;
  key->w[0] = uint64_t(uint32_t(op.id)) | uint64_t(uint32_t(device_type) & 0xFF) << 32 | uint64_t(n) << 40 |
              (in_place ? kSigInPlaceBit : 0);
  key->w[1] = attr_bits;
  key->w[2] = tw[0];
  key->w[3] = tw[1];
  key->w[4] = tw[2];
  return nullptr;
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
