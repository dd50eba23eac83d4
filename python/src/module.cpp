// tefl._core: libtefl's registry, policy and manager for the tefl package.
//
// One registry, one policy, one cache: every object here wraps libtefl's own
// (the default registry and manager are libtefl's GetDefaultRegistry /
// GetDefaultManager). A Python policy context is applied around each call as
// libtefl's thread-local policy override, so the manager's per-signature
// cache and epochs are the C++ ones.
#include <dirent.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/set.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <type_traits>

#include "bindings.h"
#include "core/logging.h"
#include "core/registry.h"
#include "tefl/attention.hpp"

namespace tefl::python {

namespace {

PyObject* g_tefl_error = nullptr;  // tefl._core.TeflError (RuntimeError)

[[noreturn]] void RaiseStatusWithCause(const Status& s, PyObject* cause) {
  PyObject* type = s.code() == TEFL_INVALID_ARGUMENT ? PyExc_ValueError : g_tefl_error;
  PyObject* exc = PyObject_CallFunction(type, "s", s.message().c_str());
  if (exc != nullptr) {
    PyObject* code = PyUnicode_FromString(StatusCodeName(s.code()));
    if (code != nullptr) {
      PyObject_SetAttrString(exc, "code", code);
      Py_DECREF(code);
    }
    PyErr_Clear();
    if (cause != nullptr) {
      Py_INCREF(cause);
      PyException_SetCause(exc, cause);  // steals
    }
    PyErr_SetObject(type, exc);
    Py_DECREF(exc);
  }
  throw nb::python_error();
}

// ---- wrappers ----------------------------------------------------------------
struct PyRegistry {
  OpRegistry* reg = nullptr;
  std::unique_ptr<OpRegistry> owned;
};

struct PyManager {
  OpManager* mgr = nullptr;
  std::unique_ptr<OpManager> owned;
};

struct PyPolicy {
  SelectionPolicy policy;
  const PolicyRecord* record = nullptr;
  explicit PyPolicy(SelectionPolicy p) : policy(std::move(p)), record(InternPolicy(policy)) {}
};

// A registered implementation, for calling it alone (OpImpl.fn of native
// implementations). Records are immutable and live as long as the registry.
struct ImplRef {
  const ImplRecord* rec = nullptr;
};

// Applies a Python policy context as this thread's libtefl override for the
// duration of one call (no-op for None: an outer C++ override stays).
class ScopedOverride {
 public:
  explicit ScopedOverride(const PyPolicy* p) : active_(p != nullptr) {
    if (active_) {
      previous_ = t_thread_state.override_policy;
      t_thread_state.override_policy = p->record;
    }
  }
  ~ScopedOverride() {
    if (active_) t_thread_state.override_policy = previous_;
  }
  ScopedOverride(const ScopedOverride&) = delete;
  ScopedOverride& operator=(const ScopedOverride&) = delete;

 private:
  bool active_;
  const PolicyRecord* previous_ = nullptr;
};

const PyPolicy* PolicyOrNull(nb::handle h) {
  if (h.is_none()) return nullptr;
  return nb::inst_ptr<PyPolicy>(h);
}

nb::tuple ImplTuple(const ImplRecord& r) {
  const OpImpl& i = r.impl;
  const OpSchema* op = FindOp(r.op_id);
  return nb::make_tuple(op ? op->name : i.op_name, i.impl_id, int32_t(i.kind), i.vendor, i.priority, i.origin,
                        i.device_mask, PythonImplObject(i), ImplRef{&r});
}

Status MakePolicy(const std::string& prefer, bool strict, const std::map<std::string, std::vector<std::string>>& per_op,
                  const std::set<std::string>& deny, const std::optional<std::set<std::string>>& allow,
                  SelectionPolicy* out) {
  return SelectionPolicy::Make(prefer, strict, per_op, deny, allow, out);
}

std::vector<std::string> Tokens(const std::vector<PolicyToken>& order) {
  std::vector<std::string> out;
  for (const PolicyToken& t : order) out.push_back(t.ToString());
  return out;
}

// Runs one call through `manager` (or one implementation alone when `ref`).
void RunCall(OpManager* manager, const ImplRef* ref, int32_t op_id, nb::handle inputs, nb::handle outputs,
             nb::handle attrs, nb::handle policy) {
  const OpSchema& op = OpById(op_id);
  CallTensors ct;
  ConvertTensors(op, inputs, outputs, &ct);
  alignas(16) char buffer[kMaxAttrsSize];
  const void* packed = PackAttrs(op, attrs, buffer);
  PyCallState state;
  state.frame_inputs = ct.inputs.data();
  state.frame_outputs = ct.outputs.data();
  state.py_inputs = inputs.ptr();
  state.py_outputs = outputs.ptr();
  state.py_attrs = attrs.ptr();
  ScopedCallState scoped(&state);
  const std::span<const DLTensor* const> in(ct.inputs.data(), size_t(ct.num_inputs));
  const std::span<DLTensor* const> out(ct.outputs.data(), size_t(ct.num_outputs));
  Status s;
  if (manager != nullptr) {
    ScopedOverride override_policy(PolicyOrNull(policy));
    nb::gil_scoped_release release;
    s = manager->Call(op.id, in, out, packed);
  } else {
    const OpImpl& impl = ref->rec->impl;
    if (ref->rec->op_id != op.id)
      throw nb::value_error(fmt::format("implementation '{}' is not one of '{}'", impl.impl_id, op.name).c_str());
    const CallArgs args{in.data(), int32_t(in.size()), out.data(), int32_t(out.size()), packed};
    SigKey key;
    if (tefl_status* e = ValidateCall(op, args, &key)) RaiseStatusWithCause(Status::FromC(e), nullptr);
    int32_t device_type = kDLCPU;
    for (int32_t i = 0; i < args.num_inputs + args.num_outputs; ++i)
      if (const DLTensor* t = TensorAt(args, i)) {
        device_type = t->device.device_type;
        break;
      }
    if (!(device_type >= 0 && device_type < 64 && ((impl.device_mask >> device_type) & 1)))
      RaiseStatusWithCause(Status(TEFL_UNSUPPORTED, fmt::format("{}: '{}' does not serve device type {}", op.name,
                                                                impl.impl_id, device_type)),
                           nullptr);
    const tefl_call_frame frame{TEFL_CALL_FRAME_STRUCT_SIZE,
                                op.name,
                                op.id,
                                args.num_inputs,
                                args.inputs,
                                args.num_outputs,
                                args.outputs,
                                packed,
                                nullptr,
                                tefl_host()};
    if (impl.supports) {
      char why[512] = {0};
      if (!impl.supports(&frame, impl.user_data, why, sizeof(why))) {
        why[sizeof(why) - 1] = '\0';
        RaiseStatusWithCause(Status(TEFL_UNSUPPORTED, fmt::format("{}: '{}' declined: {}", op.name, impl.impl_id, why)),
                             nullptr);
      }
    }
    nb::gil_scoped_release release;
    s = Status::FromC(impl.kernel(&frame, impl.user_data));
    if (!s.ok()) s = Status(s.code(), fmt::format("{}: '{}' failed: {}", op.name, impl.impl_id, s.message()));
  }
  if (!s.ok()) RaiseStatusWithCause(s, state.kernel_error);
}

nb::dict ExplainCall(OpManager* manager, int32_t op_id, nb::handle inputs, nb::handle outputs, nb::handle attrs,
                     nb::handle policy) {
  const OpSchema& op = OpById(op_id);
  CallTensors ct;
  ConvertTensors(op, inputs, outputs, &ct);
  alignas(16) char buffer[kMaxAttrsSize];
  const void* packed = PackAttrs(op, attrs, buffer);
  Resolution r;
  {
    ScopedOverride override_policy(PolicyOrNull(policy));
    r = manager->Explain(op.id, std::span<const DLTensor* const>(ct.inputs.data(), size_t(ct.num_inputs)),
                         std::span<DLTensor* const>(ct.outputs.data(), size_t(ct.num_outputs)), packed);
  }
  nb::dict d;
  d["op"] = r.op_name;
  d["signature"] = r.signature;
  d["policy"] = r.policy;
  d["order"] = r.order;
  d["chain"] = r.chain;
  nb::list cands;
  for (const CandidateReport& c : r.candidates) {
    nb::dict cd;
    cd["impl_id"] = c.impl_id;
    cd["kind"] = KindName(c.kind);
    cd["vendor"] = c.vendor;
    cd["priority"] = c.priority;
    cd["accepted"] = c.accepted;
    cd["demoted"] = c.demoted;
    cd["reason"] = c.reason;
    cands.append(cd);
  }
  d["candidates"] = cands;
  d["error"] = r.error;
  return d;
}

// GetAttentionBackend (include/tefl/attention.hpp) for a dict of parameters
// (keys as AttentionParams' fields; absent keys keep their defaults).
nb::dict AttentionBackendCall(OpManager* manager, nb::dict p, nb::handle policy) {
  AttentionParams params;
  auto get = [&](const char* key, auto* field) {
    if (p.contains(key) && !p[key].is_none()) *field = nb::cast<std::remove_pointer_t<decltype(field)>>(p[key]);
  };
  if (p.contains("dtype") && !p["dtype"].is_none()) {
    const std::string name = nb::cast<std::string>(p["dtype"]);
    DType t = DType::kUnknown;
    for (int v = 0; v < 16; ++v)
      if (DType(v) != DType::kUnknown && name == DTypeName(DType(v))) t = DType(v);
    if (t == DType::kUnknown)
      RaiseStatus(Status(TEFL_INVALID_ARGUMENT, "get_attention_backend: unknown dtype '" + name + "'"));
    params.dtype = DLTypeOf(t);
  }
  if (p.contains("device_type") && !p["device_type"].is_none())
    params.device.device_type = DLDeviceType(nb::cast<int32_t>(p["device_type"]));
  get("qkv_format", &params.qkv_format);
  get("batch", &params.batch);
  get("seqlen_q", &params.seqlen_q);
  get("seqlen_kv", &params.seqlen_kv);
  get("num_heads_q", &params.num_heads_q);
  get("num_heads_kv", &params.num_heads_kv);
  get("head_dim_qk", &params.head_dim_qk);
  get("head_dim_v", &params.head_dim_v);
  get("mask_type", &params.mask_type);
  get("window_left", &params.window_left);
  get("window_right", &params.window_right);
  get("softmax_type", &params.softmax_type);
  get("scale", &params.scale);
  get("dropout", &params.dropout);
  get("is_training", &params.is_training);
  get("backward", &params.backward);
  get("cu_seqlens_q", &params.cu_seqlens_q);
  get("cu_seqlens_kv", &params.cu_seqlens_kv);
  AttentionBackend b;
  {
    ScopedOverride override_policy(PolicyOrNull(policy));
    b = GetAttentionBackend(params, *manager);
  }
  nb::dict d;
  d["available"] = b.available;
  d["impl_id"] = b.impl_id;
  d["fallbacks"] = b.fallbacks;
  d["error"] = b.error;
  d["op"] = b.resolution.op_name;
  d["signature"] = b.resolution.signature;
  d["policy"] = b.resolution.policy;
  d["chain"] = b.resolution.chain;
  nb::list cands;
  for (const CandidateReport& c : b.resolution.candidates) {
    nb::dict cd;
    cd["impl_id"] = c.impl_id;
    cd["kind"] = KindName(c.kind);
    cd["vendor"] = c.vendor;
    cd["accepted"] = c.accepted;
    cd["reason"] = c.reason;
    cands.append(cd);
  }
  d["candidates"] = cands;
  d["text"] = b.ToString();
  return d;
}

}  // namespace

[[noreturn]] void RaiseStatus(const Status& status) { RaiseStatusWithCause(status, nullptr); }

}  // namespace tefl::python

using namespace tefl;
using namespace tefl::python;

NB_MODULE(_core, m) {
  m.doc() = "tefl's C++ core (registry, policy, manager) for the tefl package";
  // The default registry and the Python implementations in it live until the
  // process exits (by design: C callers may still dispatch during exit), so
  // nanobind's shutdown leak report would list them every time.
  nb::set_leak_warnings(false);
  g_tefl_error = PyErr_NewExceptionWithDoc("tefl._core.TeflError",
                                           "A tefl call failed; .code is the status code name (e.g. UNSUPPORTED).",
                                           PyExc_RuntimeError, nullptr);
  m.attr("TeflError") = nb::handle(g_tefl_error);

  BindSchemas(m);
  BindPythonImpls(m);

  m.attr("KIND_DEFAULT") = int32_t(TEFL_KIND_DEFAULT);
  m.attr("KIND_VENDOR") = int32_t(TEFL_KIND_VENDOR);
  m.attr("KIND_REFERENCE") = int32_t(TEFL_KIND_REFERENCE);
  m.attr("ABI_MAJOR") = TEFL_ABI_MAJOR;
  m.attr("ABI_MINOR") = TEFL_ABI_MINOR;
  m.attr("DEVICE_ALL") = ~uint64_t(0);
  m.attr("DEVICE_CPU") = uint64_t(TEFL_DEVICE_BIT(kDLCPU));
  m.attr("DEVICE_CUDA") = uint64_t(TEFL_DEVICE_BIT(kDLCUDA));

  nb::class_<ImplRef>(m, "ImplRef", "A registered implementation (for calling it alone)")
      .def_prop_ro("address", [](const ImplRef& r) { return reinterpret_cast<uintptr_t>(r.rec); });

  // ---- registry ----------------------------------------------------------
  nb::class_<PyRegistry>(m, "Registry")
      .def("__init__",
           [](PyRegistry* self) {
             new (self) PyRegistry();
             self->owned = std::make_unique<OpRegistry>();
             self->reg = self->owned.get();
           })
      .def_static(
          "default",
          [] {
            auto* r = new PyRegistry();
            r->reg = &GetDefaultRegistry();
            return r;
          },
          nb::rv_policy::take_ownership, "libtefl's default registry (the one C callers use)")
      .def("same", [](const PyRegistry& a, const PyRegistry& b) { return a.reg == b.reg; })
      .def(
          "register_python",
          [](PyRegistry& self, const std::string& op, const std::string& impl_id, int32_t kind,
             const std::string& vendor, int32_t priority, nb::object fn, nb::object py_impl, nb::object dtypes,
             uint64_t device_mask, nb::object min_arch) {
            OpImpl impl = MakePythonImpl(op, impl_id, kind, vendor, priority, std::move(fn), std::move(py_impl),
                                         std::move(dtypes), device_mask, std::move(min_arch));
            Status s = self.reg->RegisterImpl(impl);
            if (!s.ok()) throw nb::value_error(s.message().c_str());
          },
          nb::arg("op"), nb::arg("impl_id"), nb::arg("kind"), nb::arg("vendor"), nb::arg("priority"), nb::arg("fn"),
          nb::arg("py_impl"), nb::arg("dtypes").none(), nb::arg("device_mask"), nb::arg("min_arch").none(),
          "Registers a Python callable as an implementation; ValueError on a duplicate id, an unknown op, ...")
      .def(
          "register_python_many",
          [](PyRegistry& self, nb::list specs) {
            std::vector<OpImpl> impls;
            for (nb::handle h : specs) {
              nb::tuple t = nb::cast<nb::tuple>(h);
              impls.push_back(MakePythonImpl(nb::cast<std::string>(t[0]), nb::cast<std::string>(t[1]),
                                             nb::cast<int32_t>(t[2]), nb::cast<std::string>(t[3]),
                                             nb::cast<int32_t>(t[4]), nb::borrow(t[5]), nb::borrow(t[6]),
                                             nb::borrow(t[7]), nb::cast<uint64_t>(t[8]), nb::borrow(t[9])));
            }
            Status s = self.reg->RegisterMany(impls);
            if (!s.ok()) throw nb::value_error(s.message().c_str());
          },
          "All or nothing.")
      .def(
          "impls",
          [](PyRegistry& self, std::optional<std::string> op) {
            nb::list out;
            std::vector<int32_t> ids;
            if (op) {
              ids.push_back(OpByName(*op).id);
            } else {
              for (const OpSchema& s : AllOps())
                if (s.name) ids.push_back(s.id);
            }
            for (int32_t id : ids)
              for (const ImplRecord* r : self.reg->rep()->ImplsOf(id)) out.append(ImplTuple(*r));
            return out;
          },
          nb::arg("op").none() = nb::none(),
          "(op, impl_id, kind, vendor, priority, origin, device_mask, python OpImpl or None, ref) per implementation")
      .def("list_operators", [](PyRegistry& self) { return self.reg->ListOperators(); })
      .def("impl_ids", [](PyRegistry& self) { return self.reg->ImplIds(); })
      .def("clear", [](PyRegistry& self) { self.reg->Clear(); })
      .def(
          "load_plugin",
          [](PyRegistry& self, const std::string& name) {
            Status s = LoadPlugin(name, *self.reg);
            return nb::make_tuple(s.ok(), s.ok() ? std::string() : s.message());
          },
          "Loads a native plugin (absolute path or name in the plugin directories): (ok, error)")
      .def(
          "load_installed_plugins",
          [](PyRegistry& self) {
            (void)PluginSearchDirs();  // says a malformed TE_FL_PLUGIN_PATH, as LoadConfiguredPlugins does
            const std::string dir = InstalledPluginDir();
            if (dir.empty()) return;
            std::vector<std::string> files;
            if (DIR* d = ::opendir(dir.c_str())) {
              while (dirent* e = ::readdir(d)) {
                const std::string f = e->d_name;
                if (f.size() > 3 && f.compare(f.size() - 3, 3, ".so") == 0) files.push_back(dir + "/" + f);
              }
              ::closedir(d);
            }
            std::sort(files.begin(), files.end());
            for (const std::string& f : files) (void)LoadPlugin(f, *self.reg);
          },
          "Loads every plugin of the installed plugin directory (as LoadConfiguredPlugins does)")
      .def(
          "claim_plugin_loading",
          [](PyRegistry& self) {
            std::lock_guard<std::mutex> lock(self.reg->rep()->mu);
            const bool was = self.reg->rep()->plugins_loaded;
            self.reg->rep()->plugins_loaded = true;
            return !was;
          },
          "Marks configured plugins as loaded for this registry (the Python layer loads them: Python modules and "
          "native plugins from TE_FL_PLUGIN_MODULES); True if they were not loaded yet")
      .def(
          "ordered",
          [](PyRegistry& self, const std::string& op_name, nb::handle policy) {
            const OpSchema& op = OpByName(op_name);
            const PyPolicy* p = PolicyOrNull(policy);
            const PolicyRecord* rec = p ? p->record : EffectivePolicy();
            const std::vector<PolicyToken>& order = rec->order_by_op[size_t(op.id)];
            struct Ranked {
              const ImplRecord* r;
              size_t token;
            };
            std::vector<Ranked> ranked;
            for (const ImplRecord* r : self.reg->rep()->ImplsOf(op.id)) {
              if (r->impl.kind == BackendImplKind::VENDOR && !rec->policy.IsVendorAllowed(r->impl.vendor)) continue;
              size_t t = 0;
              while (t < order.size() && !MatchToken(r->impl, order[t])) ++t;
              if (t < order.size()) ranked.push_back({r, t});
            }
            std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
              if (a.token != b.token) return a.token < b.token;
              if (a.r->impl.priority != b.r->impl.priority) return a.r->impl.priority > b.r->impl.priority;
              return a.r->impl.impl_id < b.r->impl.impl_id;
            });
            nb::list out;
            for (const Ranked& x : ranked) out.append(ImplTuple(*x.r));
            return out;
          },
          nb::arg("op"), nb::arg("policy").none(),
          "The op's implementations in policy order (vendor filters and tokens applied; no tensors, so supports() "
          "and device filters are not)");

  // ---- manager -----------------------------------------------------------
  nb::class_<PyManager>(m, "Manager")
      .def(
          "__init__",
          [](PyManager* self, PyRegistry& registry) {
            new (self) PyManager();
            self->owned = std::make_unique<OpManager>(registry.reg);
            self->mgr = self->owned.get();
          },
          nb::keep_alive<1, 2>())
      .def_static(
          "default",
          [] {
            auto* manager = new PyManager();
            manager->mgr = &GetDefaultManager();
            return manager;
          },
          nb::rv_policy::take_ownership, "libtefl's default manager (over the default registry)")
      .def("ensure_initialized", [](PyManager& self) { self.mgr->EnsureInitialized(); })
      .def(
          "call",
          [](PyManager& self, int32_t op_id, nb::handle inputs, nb::handle outputs, nb::handle attrs,
             nb::handle policy) { RunCall(self.mgr, nullptr, op_id, inputs, outputs, attrs, policy); },
          nb::arg("op_id"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("attrs").none(), nb::arg("policy").none(),
          "Validates, resolves (cached per signature) and runs with fallback; outputs are written in place")
      .def(
          "explain",
          [](PyManager& self, int32_t op_id, nb::handle inputs, nb::handle outputs, nb::handle attrs,
             nb::handle policy) { return ExplainCall(self.mgr, op_id, inputs, outputs, attrs, policy); },
          nb::arg("op_id"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("attrs").none(), nb::arg("policy").none())
      .def(
          "attention_backend",
          [](PyManager& self, nb::dict params, nb::handle policy) {
            return AttentionBackendCall(self.mgr, params, policy);
          },
          nb::arg("params"), nb::arg("policy").none(),
          "Which fused_attn implementation would serve a call with these parameters, and why not the others")
      .def("selected_impl_id", [](PyManager& self, const std::string& op) { return self.mgr->GetSelectedImplId(op); });

  m.def(
      "call_impl",
      [](const ImplRef& ref, int32_t op_id, nb::handle inputs, nb::handle outputs, nb::handle attrs) {
        RunCall(nullptr, &ref, op_id, inputs, outputs, attrs, nb::none());
      },
      nb::arg("ref"), nb::arg("op_id"), nb::arg("inputs"), nb::arg("outputs"), nb::arg("attrs").none(),
      "Runs one implementation alone (validation, device and supports() checks, no fallback)");

  // ---- policy ------------------------------------------------------------
  nb::class_<PyPolicy>(m, "Policy")
      .def_static(
          "make",
          [](const std::string& prefer, bool strict, const std::map<std::string, std::vector<std::string>>& per_op,
             const std::set<std::string>& deny, const std::optional<std::set<std::string>>& allow) {
            SelectionPolicy p;
            Status s = MakePolicy(prefer, strict, per_op, deny, allow, &p);
            if (!s.ok()) throw nb::value_error(s.message().c_str());
            return new PyPolicy(std::move(p));
          },
          nb::arg("prefer"), nb::arg("strict"), nb::arg("per_op"), nb::arg("deny"), nb::arg("allow").none(),
          nb::rv_policy::take_ownership)
      .def_static(
          "from_env",
          [] {
            std::vector<std::string> warnings;
            SelectionPolicy p = SelectionPolicy::FromEnv(&warnings);
            return nb::make_tuple(nb::cast(new PyPolicy(std::move(p)), nb::rv_policy::take_ownership), warnings);
          },
          "The policy of the TE_FL_* variables now, and the warnings about malformed values")
      .def_static(
          "current", [] { return new PyPolicy(GetPolicy()); }, nb::rv_policy::take_ownership,
          "The policy in force on this thread (libtefl's global policy unless a C++ override is active)")
      .def_prop_ro("prefer", [](const PyPolicy& p) { return p.policy.prefer(); })
      .def_prop_ro("strict", [](const PyPolicy& p) { return p.policy.strict(); })
      .def_prop_ro("per_op_order",
                   [](const PyPolicy& p) {
                     std::map<std::string, std::vector<std::string>> out;
                     for (const auto& [op, order] : p.policy.per_op_order()) out[op] = Tokens(order);
                     return out;
                   })
      .def_prop_ro("deny_vendors", [](const PyPolicy& p) { return p.policy.deny_vendors(); })
      .def_prop_ro("allow_vendors", [](const PyPolicy& p) { return p.policy.allow_vendors(); })
      .def_prop_ro("sources", [](const PyPolicy& p) { return p.policy.sources(); })
      .def("default_order", [](const PyPolicy& p) { return Tokens(p.policy.DefaultOrder()); })
      .def("order_for", [](const PyPolicy& p, const std::string& op) { return Tokens(p.policy.OrderFor(op)); })
      .def("is_vendor_allowed", [](const PyPolicy& p, const std::string& v) { return p.policy.IsVendorAllowed(v); })
      .def("fingerprint", [](const PyPolicy& p) { return p.policy.Fingerprint(); });

  m.def("set_global_policy", [](const PyPolicy& p) { SetGlobalPolicy(p.policy); });
  m.def("reset_global_policy", [] { ResetGlobalPolicy(); });
  m.def("get_policy_epoch", [] { return GetPolicyEpoch(); });
  m.def("bump_policy_epoch", [] { return BumpPolicyEpoch(); });
  m.def(
      "match_token",
      [](int32_t kind, const std::string& vendor, const std::string& impl_id, const std::string& token) {
        std::optional<PolicyToken> t = PolicyToken::Parse(token);
        if (!t)
          throw nb::value_error(fmt::format("invalid policy token '{}': expected flagos, vendor, reference, "
                                            "vendor:NAME or impl:ID",
                                            token)
                                    .c_str());
        OpImpl impl;
        impl.kind = BackendImplKind(kind);
        impl.vendor = vendor;
        impl.impl_id = impl_id;
        return MatchToken(impl, *t);
      },
      "TE-FL's match_token on libtefl's token rules");

  // ---- logging and plugins -----------------------------------------------
  m.def(
      "log",
      [](int level, const std::string& file, int line, const std::string& message) {
        if (LogEnabled(level)) LogLine(level, file.c_str(), line, message);
      },
      "Logs through libtefl's logger (TEFL_LOG_LEVEL, TE-FL's line format)");
  m.def("log_enabled", [](int level) { return LogEnabled(level); });
  m.def("reload_logging_from_env", [] { ReloadLoggingFromEnv(); });
  m.def("installed_plugin_dir", [] { return InstalledPluginDir(); });
  m.def("plugin_reports", [] {
    nb::list out;
    for (const PluginReport& r : PluginReports()) {
      nb::dict d;
      d["requested"] = r.requested;
      d["path"] = r.path;
      d["name"] = r.name;
      d["version"] = r.version;
      d["vendor"] = r.vendor;
      d["implementations"] = r.implementations;
      d["loaded"] = r.loaded;
      d["already_loaded"] = r.already_loaded;
      d["error"] = r.error;
      out.append(d);
    }
    return out;
  });
}
