// Shared declarations of the nanobind extension tefl._core.
//
// The extension is a thin layer over libtefl: the registry, the policy, the
// manager and its cache are libtefl's; this layer converts tensors (DLPack /
// buffer protocol through nb::ndarray, zero-copy), attribute tuples into the
// op's attribute struct, and wraps Python callables as kernels.
#ifndef TEFL_PYTHON_SRC_BINDINGS_H_
#define TEFL_PYTHON_SRC_BINDINGS_H_

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <array>
#include <cstdint>
#include <string>

#include "core/catalogue.h"
#include "core/policy_state.h"
#include "core/validate.h"
#include "tefl/tefl.hpp"

namespace tefl::python {

namespace nb = nanobind;

// The tensors of one call, converted from Python objects (None = absent).
// Owns the nb::ndarray handles (which keep the producers' memory alive) for
// the duration of the call.
struct CallTensors {
  int32_t num_inputs = 0, num_outputs = 0;
  std::array<nb::ndarray<nb::ro>, kMaxOpArgs> in_arrays;
  std::array<nb::ndarray<>, kMaxOpArgs> out_arrays;
  std::array<DLTensor, kMaxOpArgs> tensors;
  std::array<const DLTensor*, kMaxOpArgs> inputs;
  std::array<DLTensor*, kMaxOpArgs> outputs;
};
// Converts `inputs` and `outputs` (tuples or lists) for `op`. Raises
// TypeError / ValueError naming the op and argument on a bad object or count.
void ConvertTensors(const OpSchema& op, nb::handle inputs, nb::handle outputs, CallTensors* out);

// Writes the op's attribute struct into `buffer` (kMaxAttrsSize bytes) from a
// tuple of values in schema order (None = default); returns NULL for an op
// without attributes. Raises TypeError / ValueError naming the attribute.
const void* PackAttrs(const OpSchema& op, nb::handle values, void* buffer);
// The attribute struct as a tuple in schema order.
nb::tuple UnpackAttrs(const OpSchema& op, const void* attrs);

// A read/write numpy view of a DLTensor (for Python kernels called from C).
nb::object NumpyView(const DLTensor* t);

// The op by id or name (aliases too); raises KeyError when unknown.
const OpSchema& OpById(int32_t op_id);
const OpSchema& OpByName(const std::string& name);

// Raises the Python exception for a failed status: ValueError for invalid
// arguments, KeyError-like TeflError otherwise (see module.cpp).
[[noreturn]] void RaiseStatus(const Status& status);

// The Python objects of the call in progress on this thread, so that a
// Python implementation receives the caller's own tensors (torch in, torch
// out) instead of numpy views. Nests (a Python kernel may call the manager).
struct PyCallState {
  const DLTensor* const* frame_inputs = nullptr;
  DLTensor* const* frame_outputs = nullptr;
  PyObject* py_inputs = nullptr;   // tuple/list, borrowed
  PyObject* py_outputs = nullptr;  // tuple/list, borrowed
  PyObject* py_attrs = nullptr;    // tuple, borrowed
  PyCallState* previous = nullptr;
  // The exception a Python kernel raised during this call (owned), so that
  // the error reported to the caller chains it.
  PyObject* kernel_error = nullptr;
};
PyCallState*& CurrentCallState();
// Installs `state` for the current thread (restored by the destructor).
class ScopedCallState {
 public:
  explicit ScopedCallState(PyCallState* state) : state_(state) {
    state->previous = CurrentCallState();
    CurrentCallState() = state;
  }
  ~ScopedCallState() {
    CurrentCallState() = state_->previous;
    Py_XDECREF(state_->kernel_error);
  }
  ScopedCallState(const ScopedCallState&) = delete;
  ScopedCallState& operator=(const ScopedCallState&) = delete;

 private:
  PyCallState* state_;
};

// Python implementations (py_impl.cpp).
void BindPythonImpls(nb::module_& m);
// Builds the C++ OpImpl of a Python implementation.
OpImpl MakePythonImpl(const std::string& op_name, const std::string& impl_id, int32_t kind, const std::string& vendor,
                      int32_t priority, nb::object fn, nb::object py_impl, nb::object dtypes, uint64_t device_mask,
                      nb::object min_arch);
// The Python OpImpl object behind a record registered by MakePythonImpl, or
// None.
nb::object PythonImplObject(const OpImpl& impl);

// Schemas (schemas.cpp).
void BindSchemas(nb::module_& m);

}  // namespace tefl::python

#endif  // TEFL_PYTHON_SRC_BINDINGS_H_
