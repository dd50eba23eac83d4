"""TE-FL's public API (transformer_engine.plugin.core) on libtefl.

One registry, one policy, one cache: OpRegistry wraps a libtefl registry,
SelectionPolicy a libtefl policy, OpManager a libtefl manager. The package's
default manager is libtefl's default manager over libtefl's default registry
(the ones C and C++ callers use).
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import importlib
import importlib.util
import inspect
import numbers
import os
import sys
import threading
from typing import Any, Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from . import _core, _dispatch
from ._ops import BY_NAME, schema_of, signature_of
from ._types import INT_TO_KIND, KIND_TO_INT, BackendImplKind, dtype_name

TeflError = _core.TeflError
Unsupported = _dispatch.Unsupported

PREFER_DEFAULT = "flagos"
PREFER_VENDOR = "vendor"
PREFER_REFERENCE = "reference"
VALID_PREFER_VALUES = frozenset({PREFER_DEFAULT, PREFER_VENDOR, PREFER_REFERENCE})

PLUGIN_GROUP = "te_fl.plugin"
PLUGIN_MODULES_ENV = "TE_FL_PLUGIN_MODULES"

_DEBUG, _INFO, _WARNING, _ERROR = 10, 20, 30, 40


def _log(level: int, message: str) -> None:
    """One line through libtefl's logger: [TE-FL core.py:LINE LEVEL] ..."""
    if _core.log_enabled(level):
        frame = sys._getframe(1)
        _core.log(level, os.path.basename(frame.f_code.co_filename), frame.f_lineno, message)


# ---- implementations ----------------------------------------------------------------

_DEVICE_BITS = {"cpu": 1 << 1, "cuda": 1 << 2, "cuda_host": 1 << 3, "rocm": 1 << 10}


@dataclasses.dataclass(frozen=True)
class OpImpl:
    """One implementation of an op (frozen).

    ``fn`` is called with the op's Python call signature (tensors in, outputs
    returned; see the op's docstring, e.g. ``tefl.rmsnorm_fwd``).
    ``supported_dtypes`` (dtype names, torch or numpy dtypes) and ``min_arch``
    (CUDA compute capability, e.g. 80 or "sm80") are checked per call
    signature; a call they exclude skips this implementation, with the reason
    in ``OpManager.explain``. ``devices`` (tefl's addition: e.g. {"cuda"})
    limits the device types served; None serves every device.
    """

    op_name: str
    impl_id: str
    kind: BackendImplKind
    fn: Callable[..., Any]
    vendor: Optional[str] = None
    priority: int = 0
    supported_dtypes: Optional[FrozenSet[str]] = None
    min_arch: Optional[Any] = None
    devices: Optional[FrozenSet[str]] = None
    origin: str = dataclasses.field(default="python", compare=False)

    def __post_init__(self):
        try:
            kind = BackendImplKind(self.kind)
        except ValueError:
            raise ValueError(f"OpImpl '{self.impl_id}': kind must be one of "
                             f"{[k.value for k in BackendImplKind]}, got {self.kind!r}") from None
        object.__setattr__(self, "kind", kind)
        if not isinstance(self.op_name, str) or not self.op_name:
            raise ValueError("OpImpl: op_name must be a non-empty string")
        if not isinstance(self.impl_id, str) or not self.impl_id:
            raise ValueError(f"OpImpl for '{self.op_name}': impl_id must be a non-empty string")
        if kind is BackendImplKind.VENDOR and not self.vendor:
            raise ValueError(f"OpImpl '{self.impl_id}' for '{self.op_name}': kind VENDOR requires vendor=")
        if not callable(self.fn):
            raise ValueError(f"OpImpl '{self.impl_id}' for '{self.op_name}': fn must be callable")
        if self.supported_dtypes is not None:
            object.__setattr__(self, "supported_dtypes", frozenset(dtype_name(d) for d in self.supported_dtypes))
        if self.min_arch is not None:
            try:
                _dispatch.parse_arch(self.min_arch)
            except (TypeError, ValueError):
                raise ValueError(f"OpImpl '{self.impl_id}': min_arch must be like 80, 'sm80' or (8, 0), "
                                 f"got {self.min_arch!r}") from None
        if self.devices is not None:
            devs = frozenset(str(d).lower() for d in self.devices)
            bad = devs - set(_DEVICE_BITS)
            if bad:
                raise ValueError(f"OpImpl '{self.impl_id}': unknown devices {sorted(bad)}; "
                                 f"known: {sorted(_DEVICE_BITS)}")
            object.__setattr__(self, "devices", devs)

    def is_available(self) -> bool:
        """False when min_arch needs a CUDA device this process does not have,
        or when fn has an ``is_available()`` that says False."""
        if self.min_arch is not None:
            need = _dispatch.parse_arch(self.min_arch)
            if not any(tuple(c) >= need for c in _dispatch.device_capabilities()):
                return False
        check = getattr(self.fn, "is_available", None)
        if callable(check):
            return bool(check())
        return True

    def _device_mask(self) -> int:
        if self.devices is None:
            return _core.DEVICE_ALL
        mask = 0
        for d in self.devices:
            mask |= _DEVICE_BITS[d]
        return mask


def match_token(impl: OpImpl, token: str) -> bool:
    """True when impl matches a policy token (flagos, vendor, reference,
    vendor:NAME — case-insensitive — or impl:ID)."""
    return _core.match_token(KIND_TO_INT[BackendImplKind(impl.kind)], impl.vendor or "", impl.impl_id, token)


def _impl_from_tuple(t, registry: "OpRegistry") -> OpImpl:
    """The OpImpl of a registry record: a Python implementation's own object,
    or (native) one whose fn runs that implementation alone, cached per
    registry so that repeated lookups return the same object."""
    op, impl_id, kind, vendor, priority, origin, mask, py_impl, ref = t
    if py_impl is not None:
        return py_impl
    key = ref.address
    cached = registry._native.get(key)
    if cached is not None:
        return cached
    fn = signature_of(op).make("impl", _core.call_impl, ref=ref)
    fn._tefl_registry = registry  # the record lives as long as its registry
    devices = frozenset(n for n, b in _DEVICE_BITS.items() if mask & b) if mask != _core.DEVICE_ALL else None
    impl = OpImpl(op, impl_id, INT_TO_KIND[kind], fn, vendor or None, priority, devices=devices, origin=origin)
    return registry._native.setdefault(key, impl)


# ---- registry ----------------------------------------------------------------------

class OpRegistry:
    """Implementations per op (libtefl's registry)."""

    def __init__(self, _core_registry=None):
        self._r = _core_registry if _core_registry is not None else _core.Registry()
        self._native: Dict[int, OpImpl] = {}

    @staticmethod
    def _spec(impl: OpImpl):
        if not isinstance(impl, OpImpl):
            raise TypeError(f"register_impl expects an OpImpl, got {type(impl).__name__}")
        dtypes = sorted(impl.supported_dtypes) if impl.supported_dtypes is not None else None
        return (impl.op_name, impl.impl_id, KIND_TO_INT[impl.kind], impl.vendor or "", int(impl.priority), impl.fn,
                impl, dtypes, impl._device_mask(), impl.min_arch)

    def register_impl(self, impl: OpImpl) -> None:
        """Registers impl; ValueError on a duplicate impl_id for the op, an
        unknown op, ..."""
        self._r.register_python(*self._spec(impl))

    def register_many(self, impls: Iterable[OpImpl]) -> None:
        """Registers all of impls, or none of them (ValueError)."""
        self._r.register_python_many([self._spec(i) for i in impls])

    def get_implementations(self, op_name: str) -> List[OpImpl]:
        return [_impl_from_tuple(t, self) for t in self._r.impls(schema_of(op_name)["name"])]

    def get_implementation(self, op_name: str, impl_id: str) -> Optional[OpImpl]:
        for impl in self.get_implementations(op_name):
            if impl.impl_id == impl_id:
                return impl
        return None

    def list_operators(self) -> List[str]:
        return list(self._r.list_operators())

    def snapshot(self) -> Dict[str, Tuple[OpImpl, ...]]:
        out: Dict[str, List[OpImpl]] = {}
        for t in self._r.impls(None):
            out.setdefault(t[0], []).append(_impl_from_tuple(t, self))
        return {k: tuple(v) for k, v in out.items()}

    def clear(self) -> None:
        """Removes every implementation (a later OpManager initialisation does
        not re-add the built-ins of an already initialised registry)."""
        self._r.clear()

    def __repr__(self):
        return f"OpRegistry({sum(len(v) for v in self.snapshot().values())} implementations)"


class _StagingRegistry:
    """What a plugin's register() receives: registrations are collected and
    committed together only if register() returns normally."""

    def __init__(self, target: OpRegistry):
        self._target = target
        self.impls: List[OpImpl] = []

    def register_impl(self, impl: OpImpl) -> None:
        if not isinstance(impl, OpImpl):
            raise TypeError(f"register_impl expects an OpImpl, got {type(impl).__name__}")
        self.impls.append(impl)

    def register_many(self, impls: Iterable[OpImpl]) -> None:
        for i in impls:
            self.register_impl(i)

    def __getattr__(self, name):  # read-only queries go to the real registry
        if name in ("get_implementations", "get_implementation", "list_operators", "snapshot"):
            return getattr(self._target, name)
        raise AttributeError(name)


# ---- policy ------------------------------------------------------------------------

def _norm_per_op(per_op_order) -> Tuple[Tuple[str, Tuple[str, ...]], ...]:
    if not per_op_order:
        return ()
    items = per_op_order.items() if isinstance(per_op_order, Mapping) else per_op_order
    out = []
    for op, order in items:
        if isinstance(order, str):
            order = [t for t in order.split("|")]
        out.append((str(op), tuple(str(t).strip() for t in order)))
    return tuple(sorted(out))


def _policy_bool(value, what: str) -> bool:
    """A bool (or 0 / 1): a string such as "false" would be truthy, so it is refused."""
    if (isinstance(value, (bool, numbers.Integral)) or type(value).__name__ == "bool_") and value in (0, 1):
        return bool(value)
    raise TypeError(f"SelectionPolicy: {what} expects a bool, got {value!r} ({type(value).__name__})")


def _vendor_set(values, what: str) -> FrozenSet[str]:
    """Vendor names, lower-cased. A bare string would be iterated letter by
    letter, so it is refused (TE_FL_DENY_VENDORS's comma-separated form is the
    environment's)."""
    if isinstance(values, (str, bytes)):
        raise TypeError(f"SelectionPolicy: {what} expects a collection of vendor names, got the string "
                        f"{values!r} (write {{{values!r}}} for one vendor)")
    try:
        names = list(values)
    except TypeError:
        raise TypeError(f"SelectionPolicy: {what} expects a collection of vendor names, got "
                        f"{type(values).__name__}") from None
    for v in names:
        if not isinstance(v, str):
            raise TypeError(f"SelectionPolicy: {what} expects vendor names (str), got {v!r} ({type(v).__name__})")
    return frozenset(v.strip().lower() for v in names)


@dataclasses.dataclass(frozen=True)
class SelectionPolicy:
    """Which implementation runs (frozen): libtefl's SelectionPolicy."""

    prefer: str = PREFER_DEFAULT
    strict: bool = False
    per_op_order: Tuple[Tuple[str, Tuple[str, ...]], ...] = ()
    deny_vendors: FrozenSet[str] = frozenset()
    allow_vendors: Optional[FrozenSet[str]] = None

    def __post_init__(self):
        prefer = self.prefer.value if isinstance(self.prefer, BackendImplKind) else str(self.prefer).strip().lower()
        if prefer not in VALID_PREFER_VALUES:
            raise ValueError(f"SelectionPolicy: prefer must be one of {sorted(VALID_PREFER_VALUES)}, "
                             f"got {self.prefer!r}")
        object.__setattr__(self, "prefer", prefer)
        object.__setattr__(self, "strict", _policy_bool(self.strict, "strict"))
        object.__setattr__(self, "per_op_order", _norm_per_op(self.per_op_order))
        object.__setattr__(self, "deny_vendors", _vendor_set(self.deny_vendors or (), "deny_vendors"))
        if self.allow_vendors is not None:
            object.__setattr__(self, "allow_vendors", _vendor_set(self.allow_vendors, "allow_vendors"))
        h = _core.Policy.make(prefer, self.strict, {op: list(o) for op, o in self.per_op_order},
                              set(self.deny_vendors), set(self.allow_vendors) if self.allow_vendors is not None
                              else None)
        object.__setattr__(self, "_core", h)
        # libtefl's canonical form (tokens lower-cased, aliases resolved), so
        # that equal policies compare equal.
        object.__setattr__(self, "per_op_order", _norm_per_op(h.per_op_order))

    @classmethod
    def from_dict(cls, prefer: str = PREFER_DEFAULT, strict: bool = False, per_op_order=None, deny_vendors=None,
                  allow_vendors=None) -> "SelectionPolicy":
        return cls(prefer, strict, _norm_per_op(per_op_order or ()), deny_vendors or frozenset(), allow_vendors)

    @classmethod
    def _from_core(cls, h) -> "SelectionPolicy":
        p = cls(h.prefer, h.strict, _norm_per_op(h.per_op_order), frozenset(h.deny_vendors),
                frozenset(h.allow_vendors) if h.allow_vendors is not None else None)
        return p

    def get_default_order(self) -> List[str]:
        return list(self._core.default_order())

    def get_per_op_order(self, op_name: str) -> Optional[List[str]]:
        canonical = BY_NAME[op_name]["name"] if op_name in BY_NAME else op_name
        for op, order in self.per_op_order:
            if op == op_name or (op in BY_NAME and BY_NAME[op]["name"] == canonical):
                return list(self._core.order_for(canonical))
        return None

    def is_vendor_allowed(self, vendor_name: str) -> bool:
        return self._core.is_vendor_allowed(vendor_name)

    def fingerprint(self) -> str:
        return self._core.fingerprint()


# The policy of the current thread / task: (Python policy, libtefl handle).
_policy_var: contextvars.ContextVar = contextvars.ContextVar("tefl_policy_core", default=None)
_policy_obj_var: contextvars.ContextVar = contextvars.ContextVar("tefl_policy", default=None)


def get_policy() -> SelectionPolicy:
    """The policy in force here: the innermost policy_context of this thread /
    task, else the global policy."""
    p = _policy_obj_var.get()
    if p is not None:
        return p
    return SelectionPolicy._from_core(_core.Policy.current())


def set_global_policy(policy: SelectionPolicy) -> SelectionPolicy:
    """Replaces the global policy (bumps the epoch); returns the previous one."""
    if not isinstance(policy, SelectionPolicy):
        raise TypeError(f"set_global_policy expects a SelectionPolicy, got {type(policy).__name__}")
    previous = SelectionPolicy._from_core(_core.Policy.current())
    _core.set_global_policy(policy._core)
    return previous


def reset_global_policy() -> None:
    """Back to the policy of the TE_FL_* environment variables (re-read now)."""
    _core.reset_global_policy()


def policy_from_env() -> SelectionPolicy:
    """The policy the TE_FL_* variables describe now; malformed values are
    logged as warnings and ignored."""
    h, warnings = _core.Policy.from_env()
    for w in warnings:
        _log(_WARNING, w)
    return SelectionPolicy._from_core(h)


def get_policy_epoch() -> int:
    return _core.get_policy_epoch()


def bump_policy_epoch() -> int:
    """Invalidates every cached resolution; returns the new epoch."""
    return _core.bump_policy_epoch()


@contextlib.contextmanager
def policy_context(policy: SelectionPolicy):
    """Uses `policy` in this thread / asyncio task until the block ends
    (nests; other threads and tasks are not affected)."""
    if not isinstance(policy, SelectionPolicy):
        raise TypeError(f"policy_context expects a SelectionPolicy, got {type(policy).__name__}")
    t1 = _policy_var.set(policy._core)
    t2 = _policy_obj_var.set(policy)
    try:
        yield policy
    finally:
        _policy_obj_var.reset(t2)
        _policy_var.reset(t1)


def with_strict_mode(strict: bool = True):
    return policy_context(dataclasses.replace(get_policy(), strict=strict))


def with_preference(prefer: str):
    return policy_context(dataclasses.replace(get_policy(), prefer=prefer))


def _vendor_args(vendors) -> FrozenSet[str]:
    out = []
    for v in vendors:
        if isinstance(v, str):
            out.extend(x for x in v.split(",") if x.strip())
        else:
            out.extend(v)
    return frozenset(x.strip().lower() for x in out)


def with_allowed_vendors(*vendors):
    """Only these vendors (comma-separated strings or iterables) in this scope."""
    return policy_context(dataclasses.replace(get_policy(), allow_vendors=_vendor_args(vendors)))


def with_denied_vendors(*vendors):
    """These vendors denied, in addition to those already denied."""
    p = get_policy()
    return policy_context(dataclasses.replace(p, deny_vendors=p.deny_vendors | _vendor_args(vendors)))


class PolicyManager:
    """TE-FL's policy holder; every method is the module-level function."""

    _instance: Optional["PolicyManager"] = None

    @classmethod
    def get_instance(cls) -> "PolicyManager":
        if cls._instance is None:
            cls._instance = cls()
        return cls._instance

    get_policy = staticmethod(get_policy)
    set_global_policy = staticmethod(set_global_policy)
    reset_global_policy = staticmethod(reset_global_policy)
    policy_context = staticmethod(policy_context)
    get_policy_epoch = staticmethod(get_policy_epoch)
    bump_policy_epoch = staticmethod(bump_policy_epoch)
    policy_from_env = staticmethod(policy_from_env)


# ---- plugins -----------------------------------------------------------------------

_discovered: List[Dict[str, Any]] = []
_discovered_lock = threading.Lock()


def _register_plugin(obj, registry: OpRegistry, name: str, source: str) -> bool:
    """Runs a plugin's register function transactionally."""
    record = {"name": name, "source": source, "loaded": False, "implementations": 0, "error": ""}
    staging = _StagingRegistry(registry)
    try:
        if hasattr(obj, "register") and callable(obj.register):
            obj.register(staging)
        elif hasattr(obj, "te_fl_register") and callable(obj.te_fl_register):
            obj.te_fl_register(staging)
        elif callable(obj):
            obj(staging)
        else:
            raise TypeError("exposes neither register(registry), te_fl_register(registry) nor is callable")
        registry.register_many(staging.impls)
    except Exception as e:  # noqa: BLE001 - a broken plugin must not break the library
        record["error"] = f"{type(e).__name__}: {e}"
        _log(_WARNING, f"Plugin '{name}' ({source}) failed, nothing of it was registered: {record['error']}")
    else:
        record["loaded"] = True
        record["implementations"] = len(staging.impls)
        ids = ", ".join(f"{i.op_name}:{i.impl_id}" for i in staging.impls)
        _log(_INFO, f"Plugin '{name}' ({source}) registered {len(staging.impls)} implementation(s): [{ids}]")
    with _discovered_lock:
        _discovered.append(record)
    return record["loaded"]


def _target(registry: Optional[OpRegistry]) -> OpRegistry:
    return registry if registry is not None else get_default_manager().registry


def _entry_points():
    from importlib import metadata

    eps = metadata.entry_points()
    if hasattr(eps, "select"):
        return list(eps.select(group=PLUGIN_GROUP))
    return list(eps.get(PLUGIN_GROUP, []))  # Python < 3.10


def discover_from_entry_points(registry: Optional[OpRegistry] = None) -> int:
    """Loads the plugins of the `te_fl.plugin` entry-point group; returns how
    many registered successfully."""
    reg = _target(registry)
    n = 0
    for ep in _entry_points():
        try:
            obj = ep.load()
        except Exception as e:  # noqa: BLE001
            _log(_WARNING, f"Plugin entry point '{ep.name}' ({ep.value}) failed to load: {type(e).__name__}: {e}")
            with _discovered_lock:
                _discovered.append({"name": ep.name, "source": "entry_point", "loaded": False, "implementations": 0,
                                    "error": f"{type(e).__name__}: {e}"})
            continue
        n += _register_plugin(obj, reg, ep.name, "entry_point")
    return n


def _is_native(entry: str) -> bool:
    return "/" in entry or entry.endswith(".so")


def discover_from_env_modules(registry: Optional[OpRegistry] = None) -> int:
    """Loads TE_FL_PLUGIN_MODULES (comma-separated): importable Python modules
    are Python plugins; paths, .so names and names that are not Python
    modules are native plugins (libtefl's loader: plugin directories only)."""
    reg = _target(registry)
    n = 0
    for entry in (x.strip() for x in os.environ.get(PLUGIN_MODULES_ENV, "").split(",")):
        if not entry:
            continue
        spec = None
        if not _is_native(entry):
            try:
                # a module already in sys.modules (also one made at run time,
                # whose __spec__ is None) is Python, whatever find_spec says
                spec = True if entry in sys.modules else importlib.util.find_spec(entry)
            except (ImportError, ValueError):
                spec = None
        if spec is None:
            ok, err = reg._r.load_plugin(entry)
            with _discovered_lock:
                _discovered.append({"name": entry, "source": "native", "loaded": ok, "implementations": 0,
                                    "error": err})
            n += ok
            continue
        try:
            module = importlib.import_module(entry)
        except Exception as e:  # noqa: BLE001
            _log(_WARNING, f"Plugin module '{entry}' failed to import: {type(e).__name__}: {e}")
            with _discovered_lock:
                _discovered.append({"name": entry, "source": "env", "loaded": False, "implementations": 0,
                                    "error": f"{type(e).__name__}: {e}"})
            continue
        n += _register_plugin(module, reg, entry, "env")
    return n


def discover_plugin(registry: Optional[OpRegistry] = None) -> int:
    """Entry points, then TE_FL_PLUGIN_MODULES, then the native plugins
    installed in libtefl's plugin directory; returns the plugins loaded."""
    reg = _target(registry)
    n = discover_from_entry_points(reg) + discover_from_env_modules(reg)
    reg._r.load_installed_plugins()
    return n


def get_discovered_plugin() -> List[Dict[str, Any]]:
    """Every plugin discovery attempt: name, source, loaded, implementations, error."""
    with _discovered_lock:
        return [dict(r) for r in _discovered]


def clear_discovered_plugin() -> None:
    with _discovered_lock:
        _discovered.clear()


# ---- manager -----------------------------------------------------------------------

_init_lock = threading.RLock()


class OpManager:
    """Resolves and calls ops (libtefl's manager: per-signature cache, policy
    order, fallback, strict mode)."""

    def __init__(self, registry: Optional[OpRegistry] = None, *, _core_manager=None):
        self._registry = registry if registry is not None else OpRegistry()
        self._m = _core_manager if _core_manager is not None else _core.Manager(self._registry._r)
        self._fns: Dict[str, Callable] = {}
        self._initialized = False

    @property
    def registry(self) -> OpRegistry:
        return self._registry

    def ensure_initialized(self) -> None:
        """Discovers plugins (once per registry), registers the built-in
        backends and logs the registered impl_ids."""
        if self._initialized:
            return
        with _init_lock:
            if self._initialized:
                return
            reg = self._registry
            if reg._r.claim_plugin_loading():
                discover_plugin(reg)
            self._m.ensure_initialized()
            self._initialized = True

    def _function(self, op: str) -> Callable:
        f = self._fns.get(op)
        if f is None:
            sig = signature_of(op)
            f = sig.make("manager", self._m.call, pget=_policy_var.get)
            self._fns[op] = f
            self._fns[sig.name] = f
        return f

    def call(self, op: str, *args, **kwargs):
        """Calls `op` with its Python signature (see tefl.<op>.__doc__)."""
        f = self._fns.get(op)  # filled only once initialised
        if f is None:
            self.ensure_initialized()
            f = self._function(op)
        return f(*args, **kwargs)

    def function(self, op: str) -> Callable:
        """The op as a function bound to this manager (skips the name lookup)."""
        self.ensure_initialized()
        return self._function(op)

    def resolve_candidates(self, op: str) -> List[OpImpl]:
        """The op's implementations in policy order (vendor filters and order
        tokens applied; per-call checks — device, supported_dtypes, min_arch,
        supports() — happen at call time, see explain())."""
        self.ensure_initialized()
        return [_impl_from_tuple(t, self._registry)
                for t in self._registry._r.ordered(schema_of(op)["name"], _policy_var.get())]

    def resolve(self, op: str) -> Callable:
        """The fn of the first candidate in policy order."""
        cands = self.resolve_candidates(op)
        if not cands:
            raise RuntimeError(f"{op}: no implementation matches the policy {get_policy().fingerprint()}")
        return cands[0].fn

    def explain(self, op: str, *args, **kwargs) -> Dict[str, Any]:
        """How a call with these arguments resolves: the chain, and every
        candidate with why it was rejected. Runs nothing."""
        self.ensure_initialized()
        box = {}

        def capture(op_id, ins, outs, attrs, policy):
            box["r"] = self._m.explain(op_id, ins, outs, attrs, policy)

        signature_of(op).make("manager", capture, pget=_policy_var.get)(*args, **kwargs)
        return box["r"]

    def get_selected_impl_id(self, op: str) -> Optional[str]:
        """The impl_id that last ran `op` through this manager (None if none)."""
        return self._m.selected_impl_id(schema_of(op)["name"]) or None

    def bump_policy_epoch(self) -> int:
        return bump_policy_epoch()

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in BY_NAME:
            raise AttributeError(name)
        return self.function(name)


_default_manager: Optional[OpManager] = None
_default_is_core = True


def get_default_manager() -> OpManager:
    """The process's manager: libtefl's default manager and registry, or a
    fresh pair after reset_default_manager()."""
    global _default_manager
    m = _default_manager
    if m is None:
        with _init_lock:
            if _default_manager is None:
                if _default_is_core:
                    reg = OpRegistry(_core.Registry.default())
                    _default_manager = OpManager(reg, _core_manager=_core.Manager.default())
                else:
                    _default_manager = OpManager(OpRegistry())
            m = _default_manager
    return m


def reset_default_manager() -> None:
    """Drops the default manager: the next get_default_manager() builds a new
    one over a new registry (built-ins and plugins registered again)."""
    global _default_manager, _default_is_core
    with _init_lock:
        _default_manager = None
        _default_is_core = False


def call(op: str, *args, **kwargs):
    """tefl.call(op, ...): the default manager's call."""
    return get_default_manager().call(op, *args, **kwargs)


def op_function(op: str) -> Callable:
    """tefl.<op>: calls through the current default manager."""
    sig = signature_of(op)
    template = sig.make("manager", _core.Manager.call, pget=_policy_var.get)

    def f(*args, **kwargs):
        return get_default_manager().call(sig.name, *args, **kwargs)

    f.__name__ = f.__qualname__ = op
    f.__doc__ = sig.doc()
    f.__signature__ = inspect.signature(template)
    f.__module__ = "tefl"
    return f
