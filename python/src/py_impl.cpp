// Python callables as tefl kernels: a C kernel function that takes the GIL,
// hands the call to tefl._dispatch (which binds the op's Python call
// signature and stores the results into the outputs), and turns a Python
// exception into a tefl status — NotImplementedError (or tefl.Unsupported)
// means "declined before writing", anything else is a runtime error, so the
// manager's fallback, strict mode and in-place rules apply unchanged.
#include <Python.h>

#include <memory>

#include "bindings.h"

namespace tefl::python {

namespace {

struct PyImpl {
  nb::object fn;
  nb::object py_impl;     // the Python OpImpl (returned by get_implementations)
  DTypeSet dtypes = 0;    // 0: any
  nb::object min_arch;    // None: any device
  std::string dtype_doc;  // for the decline reason
};

// Set by tefl._dispatch at import: runner(fn, op_id, inputs, outputs, attrs)
// and arch_ok(min_arch, device_type, device_id) -> (bool, reason).
nb::object& Runner() {
  static nb::object* runner = new nb::object();  // leaked: never decref'd at exit
  return *runner;
}
nb::object& ArchCheck() {
  static nb::object* check = new nb::object();
  return *check;
}
nb::object& UnsupportedType() {
  static nb::object* type = new nb::object();
  return *type;
}

bool InterpreterAlive() {
#if PY_VERSION_HEX >= 0x030D0000
  return Py_IsInitialized() && !Py_IsFinalizing();
#else
  return Py_IsInitialized() && !_Py_IsFinalizing();
#endif
}

tefl_status* StatusFromPythonError(nb::python_error& e) {
  const bool declined =
      e.matches(PyExc_NotImplementedError) || (UnsupportedType().is_valid() && e.matches(UnsupportedType()));
  std::string message = fmt::format("{}: {}", nb::type_name(e.type()).c_str(), nb::str(e.value()).c_str());
  if (PyCallState* st = CurrentCallState(); st != nullptr) {
    Py_XDECREF(st->kernel_error);
    st->kernel_error = e.value().inc_ref().ptr();
  }
  return tefl_status_new(declined ? TEFL_UNSUPPORTED : TEFL_RUNTIME_ERROR, message.c_str());
}

tefl_status* PyKernel(const tefl_call_frame* frame, void* user_data) {
  auto* impl = static_cast<PyImpl*>(user_data);
  if (!InterpreterAlive()) return tefl_status_new(TEFL_RUNTIME_ERROR, "the Python interpreter is not running");
  nb::gil_scoped_acquire gil;
  try {
    const OpSchema& op = OpById(frame->op_id);
    PyCallState* st = CurrentCallState();
    nb::object ins, outs, attrs;
    if (st != nullptr && st->frame_inputs == frame->inputs && st->frame_outputs == frame->outputs) {
      ins = nb::borrow(st->py_inputs);
      outs = nb::borrow(st->py_outputs);
      attrs = (st->py_attrs != nullptr && st->py_attrs != Py_None)
                  ? nb::borrow(st->py_attrs)
                  : (frame->attrs ? nb::object(UnpackAttrs(op, frame->attrs)) : nb::object(nb::tuple()));
    } else {  // called from C or C++: numpy views of the caller's buffers
      nb::list li, lo;
      for (int32_t i = 0; i < frame->num_inputs; ++i) li.append(NumpyView(frame->inputs[i]));
      for (int32_t i = 0; i < frame->num_outputs; ++i) lo.append(NumpyView(frame->outputs[i]));
      ins = nb::tuple(li);
      outs = nb::tuple(lo);
      attrs = frame->attrs ? nb::object(UnpackAttrs(op, frame->attrs)) : nb::object(nb::tuple());
    }
    Runner()(impl->fn, frame->op_id, ins, outs, attrs);
    return nullptr;
  } catch (nb::python_error& e) {
    return StatusFromPythonError(e);
  } catch (const std::exception& e) {
    return tefl_status_new(TEFL_RUNTIME_ERROR, e.what());
  }
}

void WriteWhy(char* why, size_t len, const std::string& s) {
  if (len == 0) return;
  const size_t n = std::min(len - 1, s.size());
  std::memcpy(why, s.data(), n);
  why[n] = '\0';
}

int32_t PySupports(const tefl_call_frame* frame, void* user_data, char* why, size_t why_len) {
  auto* impl = static_cast<PyImpl*>(user_data);
  const OpSchema* op = FindOp(frame->op_id);
  if (op == nullptr) return 0;
  if (impl->dtypes != 0) {
    for (int32_t i = 0; i < frame->num_inputs; ++i) {
      const DLTensor* t = frame->inputs[i];
      const ArgSchema& a = op->inputs[size_t(i)];
      if (t == nullptr || __builtin_popcount(a.dtypes) < 2) continue;  // fixed-dtype arguments say nothing
      const DType dt = DTypeOf(t->dtype);
      if (!(impl->dtypes & Bit(dt))) {
        WriteWhy(why, why_len,
                 fmt::format("supported_dtypes {} does not include {} (input '{}')", impl->dtype_doc, DTypeName(dt),
                             a.name));
        return 0;
      }
    }
  }
  if (!impl->min_arch.is_none()) {
    if (!InterpreterAlive()) return 0;
    int32_t device_type = kDLCPU, device_id = 0;
    for (int32_t i = 0; i < frame->num_inputs; ++i)
      if (frame->inputs[i] != nullptr) {
        device_type = frame->inputs[i]->device.device_type;
        device_id = frame->inputs[i]->device.device_id;
        break;
      }
    nb::gil_scoped_acquire gil;
    try {
      nb::tuple r = nb::cast<nb::tuple>(ArchCheck()(impl->min_arch, device_type, device_id));
      if (!nb::cast<bool>(r[0])) {
        WriteWhy(why, why_len, nb::cast<std::string>(r[1]));
        return 0;
      }
    } catch (nb::python_error& e) {
      WriteWhy(why, why_len, fmt::format("min_arch check failed: {}", e.what()));
      return 0;
    }
  }
  return 1;
}

}  // namespace

OpImpl MakePythonImpl(const std::string& op_name, const std::string& impl_id, int32_t kind, const std::string& vendor,
                      int32_t priority, nb::object fn, nb::object py_impl, nb::object dtypes, uint64_t device_mask,
                      nb::object min_arch) {
  if (!PyCallable_Check(fn.ptr()))
    throw nb::type_error(fmt::format("OpImpl '{}' for '{}': fn must be callable", impl_id, op_name).c_str());
  auto* raw = new PyImpl();
  // Python references die with the implementation; at interpreter exit (the
  // default registry lives until the process ends) they are leaked instead.
  std::shared_ptr<PyImpl> holder(raw, [](PyImpl* p) {
    if (InterpreterAlive()) {
      nb::gil_scoped_acquire gil;
      delete p;
    } else {
      p->fn.release();
      p->py_impl.release();
      p->min_arch.release();
      delete p;
    }
  });
  raw->fn = std::move(fn);
  raw->py_impl = std::move(py_impl);
  raw->min_arch = std::move(min_arch);
  if (!dtypes.is_none()) {
    std::string doc;
    for (nb::handle d : dtypes) {
      const std::string name = nb::cast<std::string>(d);
      DType found = DType::kUnknown;
      for (int v = 0; v < 16; ++v)
        if (DType(v) != DType::kUnknown && name == DTypeName(DType(v))) found = DType(v);
      if (found == DType::kUnknown)
        throw nb::value_error(
            fmt::format("OpImpl '{}' for '{}': unknown dtype '{}' in supported_dtypes", impl_id, op_name, name)
                .c_str());
      raw->dtypes |= Bit(found);
      doc += (doc.empty() ? "" : ", ") + name;
    }
    raw->dtype_doc = "{" + doc + "}";
  }
  OpImpl impl;
  impl.op_name = op_name;
  impl.impl_id = impl_id;
  impl.kind = BackendImplKind(kind);
  impl.vendor = vendor;
  impl.priority = priority;
  impl.device_mask = device_mask;
  impl.kernel = PyKernel;
  impl.supports = (raw->dtypes != 0 || !raw->min_arch.is_none()) ? PySupports : nullptr;
  impl.user_data = raw;
  impl.origin = "python";
  impl.keepalive = holder;
  return impl;
}

nb::object PythonImplObject(const OpImpl& impl) {
  if (impl.kernel != PyKernel) return nb::none();
  return static_cast<PyImpl*>(impl.user_data)->py_impl;
}

PyCallState*& CurrentCallState() {
  static thread_local PyCallState* state = nullptr;
  return state;
}

void BindPythonImpls(nb::module_& m) {
  m.def(
      "_set_hooks",
      [](nb::object runner, nb::object arch_check, nb::object unsupported) {
        Runner() = std::move(runner);
        ArchCheck() = std::move(arch_check);
        UnsupportedType() = std::move(unsupported);
      },
      "Installs tefl._dispatch's hooks (called once at import).");
}

}  // namespace tefl::python
