// Tensors and attributes between Python and the C ABI.
#include <cmath>
#include <cstring>
#include <limits>

#include "bindings.h"

namespace tefl::python {

namespace {

std::string ArgLabel(const OpSchema& op, bool input, int index) {
  const ArgSchema& a = input ? op.inputs[size_t(index)] : op.outputs[size_t(index)];
  return fmt::format("{}: argument '{}' ({} {})", op.name, a.name, input ? "input" : "output", index);
}

std::string TypeNameOf(nb::handle h) { return nb::type_name(h.type()).c_str(); }

bool PyArray_CheckLike(PyObject* obj);

// DLPack 1.3's C exchange API (`type(obj).__dlpack_c_exchange_api__`, a
// capsule "dlpack_exchange_api"; torch >= 2.10 provides it): fills a DLTensor
// for a borrowed object with no allocation and no Python-level __dlpack__
// call — about 50x cheaper than the capsule protocol for a torch tensor.
// Mirrors the layout of the standard's DLPackExchangeAPI (only read here).
struct DLPackVersionV1 {
  uint32_t major, minor;
};
struct DLPackExchangeAPIHeaderV1 {
  DLPackVersionV1 version;
  DLPackExchangeAPIHeaderV1* prev_api;
};
using DLTensorFromPyObjectFn = int (*)(void* py_object, DLTensor* out);
struct DLPackExchangeAPIV1 {
  DLPackExchangeAPIHeaderV1 header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  DLTensorFromPyObjectFn dltensor_from_py_object_no_sync;
  void* current_work_stream;
};

// Per Python type: the exchange function, or NULL (use nb::ndarray). A few
// types at most (torch.Tensor, nn.Parameter, ...); looked up under the GIL.
struct FastType {
  PyTypeObject* type;
  DLTensorFromPyObjectFn fn;
};
constexpr int kFastTypes = 8;
FastType g_fast_types[kFastTypes];
int g_num_fast_types = 0;

DLTensorFromPyObjectFn ExchangeFnOf(PyObject* obj) {
  PyTypeObject* type = Py_TYPE(obj);
  for (int i = 0; i < g_num_fast_types; ++i)
    if (g_fast_types[i].type == type) return g_fast_types[i].fn;
  DLTensorFromPyObjectFn fn = nullptr;
  if (type != nullptr && !PyArray_CheckLike(obj)) {
    PyObject* cap = PyObject_GetAttrString(reinterpret_cast<PyObject*>(type), "__dlpack_c_exchange_api__");
    if (cap != nullptr && PyCapsule_IsValid(cap, "dlpack_exchange_api")) {
      auto* api = static_cast<const DLPackExchangeAPIV1*>(PyCapsule_GetPointer(cap, "dlpack_exchange_api"));
      if (api != nullptr && api->header.version.major == 1 && api->header.version.minor >= 2)
        fn = api->dltensor_from_py_object_no_sync;
    }
    Py_XDECREF(cap);
    PyErr_Clear();
  }
  if (g_num_fast_types < kFastTypes) {
    Py_INCREF(type);  // cached types stay alive
    g_fast_types[g_num_fast_types++] = FastType{type, fn};
  }
  return fn;
}

// numpy arrays take nanobind's buffer / __dlpack__ path (already cheap).
bool PyArray_CheckLike(PyObject* obj) {
  const char* name = Py_TYPE(obj)->tp_name;
  return std::strcmp(name, "numpy.ndarray") == 0;
}

template <typename Array>
void FillTensor(const Array& arr, DLTensor* t) {
  const nb::dlpack::dtype dt = arr.dtype();
  t->data = const_cast<void*>(static_cast<const void*>(arr.data()));
  t->device = DLDevice{DLDeviceType(arr.device_type()), arr.device_id()};
  t->ndim = int32_t(arr.ndim());
  t->dtype = DLDataType{dt.code, dt.bits, dt.lanes};
  t->shape = const_cast<int64_t*>(arr.shape_ptr());
  t->strides = const_cast<int64_t*>(arr.stride_ptr());
  t->byte_offset = 0;  // data() already includes it
}

int32_t SequenceSize(nb::handle seq, const OpSchema& op, const char* what, size_t expected) {
  if (!PyTuple_Check(seq.ptr()) && !PyList_Check(seq.ptr())) {
    throw nb::type_error(fmt::format("{}: {} must be a tuple or list, got {}", op.name, what, TypeNameOf(seq)).c_str());
  }
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq.ptr());
  if (size_t(n) != expected) {
    throw nb::value_error(fmt::format("{}: expected {} {}, got {}", op.name, expected, what, n).c_str());
  }
  return int32_t(n);
}

// The tensor's own DLPack export failed (a meta tensor has no data; a
// sparse one no strides): the exporter's message, first line only (torch
// appends a C++ backtrace), under the op's and the argument's name.
[[noreturn]] void ThrowExportError(const OpSchema& op, bool input, int index, nb::handle h) {
  std::string why = "the exporter failed without a reason";
  if (PyErr_Occurred() != nullptr) {
    nb::python_error e;  // takes the pending Python error
    const char* text = e.what();
    if (text != nullptr) why = text;
  }
  why = why.substr(0, why.find('\n'));
  std::string device;
  if (PyObject* dev = PyObject_GetAttrString(h.ptr(), "device")) {
    PyObject* text = PyObject_Str(dev);
    const char* c = text != nullptr ? PyUnicode_AsUTF8(text) : nullptr;
    if (c != nullptr) device = fmt::format(" on device '{}'", c);
    Py_XDECREF(text);
    Py_DECREF(dev);
  }
  PyErr_Clear();  // no device attribute (or no str of it): the message goes without
  throw nb::value_error(fmt::format("{}: cannot read this {}{} through DLPack: {} (tefl needs a strided tensor "
                                    "with data, on the CPU or a device a plugin serves)",
                                    ArgLabel(op, input, index), TypeNameOf(h), device, why)
                            .c_str());
}

}  // namespace

const OpSchema& OpById(int32_t op_id) {
  const OpSchema* op = FindOp(op_id);
  if (op == nullptr) throw nb::key_error(fmt::format("unknown op id {}", op_id).c_str());
  return *op;
}

const OpSchema& OpByName(const std::string& name) {
  const OpSchema* op = FindOp(std::string_view(name));
  if (op == nullptr) throw nb::key_error(fmt::format("unknown op '{}'", name).c_str());
  return *op;
}

void ConvertTensors(const OpSchema& op, nb::handle inputs, nb::handle outputs, CallTensors* out) {
  const int32_t nin = SequenceSize(inputs, op, "inputs", op.inputs.size());
  const int32_t nout = SequenceSize(outputs, op, "outputs", op.outputs.size());
  out->num_inputs = nin;
  out->num_outputs = nout;
  PyObject** in_items = PySequence_Fast_ITEMS(inputs.ptr());
  for (int32_t i = 0; i < nin; ++i) {
    nb::handle h(in_items[i]);
    if (h.is_none()) {
      out->inputs[size_t(i)] = nullptr;
      continue;
    }
    if (DLTensorFromPyObjectFn fn = ExchangeFnOf(h.ptr())) {
      DLTensor* t = &out->tensors[size_t(i)];
      if (fn(h.ptr(), t) != 0) ThrowExportError(op, true, i, h);
      out->inputs[size_t(i)] = t;  // valid while the caller's object is (it is borrowed for the call)
      continue;
    }
    nb::ndarray<nb::ro> arr;
    if (!nb::try_cast(h, arr, false)) {
      throw nb::type_error(fmt::format("{}: expected a tensor (torch.Tensor, numpy.ndarray or another "
                                       "DLPack-capable array) or None, got {}",
                                       ArgLabel(op, true, i), TypeNameOf(h))
                               .c_str());
    }
    DLTensor* t = &out->tensors[size_t(i)];
    FillTensor(arr, t);
    out->in_arrays[size_t(i)] = std::move(arr);  // keeps the producer alive
    out->inputs[size_t(i)] = t;
  }
  PyObject** out_items = PySequence_Fast_ITEMS(outputs.ptr());
  for (int32_t i = 0; i < nout; ++i) {
    nb::handle h(out_items[i]);
    if (h.is_none()) {
      out->outputs[size_t(i)] = nullptr;
      continue;
    }
    if (DLTensorFromPyObjectFn fn = ExchangeFnOf(h.ptr())) {
      DLTensor* t = &out->tensors[size_t(nin + i)];
      if (fn(h.ptr(), t) != 0) ThrowExportError(op, false, i, h);
      out->outputs[size_t(i)] = t;
      continue;
    }
    nb::ndarray<> arr;
    if (!nb::try_cast(h, arr, false)) {
      throw nb::type_error(fmt::format("{}: expected a writable tensor (torch.Tensor, numpy.ndarray or "
                                       "another DLPack-capable array) or None, got {}",
                                       ArgLabel(op, false, i), TypeNameOf(h))
                               .c_str());
    }
    DLTensor* t = &out->tensors[size_t(nin + i)];
    FillTensor(arr, t);
    out->out_arrays[size_t(i)] = std::move(arr);
    out->outputs[size_t(i)] = t;
  }
}

const void* PackAttrs(const OpSchema& op, nb::handle values, void* buffer) {
  if (op.attrs_size == 0) return nullptr;
  std::memcpy(buffer, op.attrs_defaults, op.attrs_size);
  if (values.is_none()) return buffer;
  if (!PyTuple_Check(values.ptr()) && !PyList_Check(values.ptr()))
    throw nb::type_error(fmt::format("{}: attributes must be a tuple, got {}", op.name, TypeNameOf(values)).c_str());
  const Py_ssize_t n = PySequence_Fast_GET_SIZE(values.ptr());
  if (size_t(n) > op.attrs.size())
    throw nb::value_error(
        fmt::format("{}: expected at most {} attributes, got {}", op.name, op.attrs.size(), n).c_str());
  PyObject** items = PySequence_Fast_ITEMS(values.ptr());
  char* base = static_cast<char*>(buffer);
  for (Py_ssize_t i = 0; i < n; ++i) {
    PyObject* v = items[i];
    if (v == Py_None) continue;
    const AttrSchema& a = op.attrs[size_t(i)];
    char* field = base + a.offset;
    switch (a.type) {
      case AttrType::kF32: {
        const double d = PyFloat_AsDouble(v);
        if (d == -1.0 && PyErr_Occurred()) {
          PyErr_Clear();
          throw nb::type_error(
              fmt::format("{}: attribute '{}' expects a number, got {}", op.name, a.name, TypeNameOf(nb::handle(v)))
                  .c_str());
        }
        const float f = float(d);
        std::memcpy(field, &f, sizeof(f));
        break;
      }
      case AttrType::kI32:
      case AttrType::kBool: {
        if (PyFloat_Check(v))
          throw nb::type_error(
              fmt::format("{}: attribute '{}' expects an integer, got float {}", op.name, a.name, PyFloat_AsDouble(v))
                  .c_str());
        const long long x = PyLong_AsLongLong(v);
        if (x == -1 && PyErr_Occurred()) {
          PyErr_Clear();
          throw nb::type_error(fmt::format("{}: attribute '{}' expects an integer{}, got {}", op.name, a.name,
                                           a.type == AttrType::kBool ? " or bool" : "", TypeNameOf(nb::handle(v)))
                                   .c_str());
        }
        if (x < std::numeric_limits<int32_t>::min() || x > std::numeric_limits<int32_t>::max())
          throw nb::value_error(
              fmt::format("{}: attribute '{}' = {} is out of the int32 range", op.name, a.name, x).c_str());
        const int32_t x32 = int32_t(x);
        std::memcpy(field, &x32, sizeof(x32));
        break;
      }
      case AttrType::kU64: {
        // [0, 2^64): a negative or wider value would wrap modulo 2^64 and
        // silently alias another seed / offset.
        // __index__: Python and numpy integers.
        nb::object index = PyFloat_Check(v) ? nb::object() : nb::steal(PyNumber_Index(v));
        if (!index.is_valid()) {
          PyErr_Clear();
          throw nb::type_error(
              fmt::format("{}: attribute '{}' expects an integer, got {}", op.name, a.name, TypeNameOf(nb::handle(v)))
                  .c_str());
        }
        const unsigned long long x = PyLong_AsUnsignedLongLong(index.ptr());
        if (x == static_cast<unsigned long long>(-1) && PyErr_Occurred()) {
          PyErr_Clear();
          throw nb::value_error(fmt::format("{}: attribute '{}' = {} is out of the uint64 range [0, 2^64)", op.name,
                                            a.name, nb::cast<std::string>(nb::str(nb::handle(v))))
                                    .c_str());
        }
        const uint64_t x64 = uint64_t(x);
        std::memcpy(field, &x64, sizeof(x64));
        break;
      }
    }
  }
  return buffer;
}

nb::tuple UnpackAttrs(const OpSchema& op, const void* attrs) {
  nb::list out;
  const char* base = static_cast<const char*>(attrs);
  for (const AttrSchema& a : op.attrs) {
    const char* field = base + a.offset;
    switch (a.type) {
      case AttrType::kF32: {
        float f;
        std::memcpy(&f, field, sizeof(f));
        out.append(nb::float_(double(f)));
        break;
      }
      case AttrType::kI32: {
        int32_t x;
        std::memcpy(&x, field, sizeof(x));
        out.append(nb::int_(x));
        break;
      }
      case AttrType::kBool: {
        int32_t x;
        std::memcpy(&x, field, sizeof(x));
        out.append(nb::bool_(x != 0));
        break;
      }
      case AttrType::kU64: {
        uint64_t x;
        std::memcpy(&x, field, sizeof(x));
        out.append(nb::int_(x));
        break;
      }
    }
  }
  return nb::tuple(out);
}

nb::object NumpyView(const DLTensor* t) {
  if (t == nullptr) return nb::none();
  if (t->device.device_type != kDLCPU && t->device.device_type != kDLCUDAHost)
    throw nb::value_error("a Python implementation called from C/C++ receives numpy views, which need host memory");
  std::array<size_t, 32> shape{};
  if (t->ndim > 32) throw nb::value_error("tensor rank above 32");
  for (int d = 0; d < t->ndim; ++d) shape[size_t(d)] = size_t(t->shape[d]);
  nb::dlpack::dtype dt{uint8_t(t->dtype.code), uint8_t(t->dtype.bits), uint16_t(t->dtype.lanes)};
  void* data = static_cast<char*>(t->data) + t->byte_offset;
  nb::ndarray<nb::numpy> view(data, size_t(t->ndim), shape.data(), nb::handle(), t->strides, dt, t->device.device_type,
                              t->device.device_id);
  return view.cast(nb::rv_policy::reference);  // a view: valid for the duration of the call
}

}  // namespace tefl::python
