"""TransformerEngine's NVTE_PLUGIN entry point: the transformer_engine_torch module.

With NVTE_PLUGIN=tefl, TE's load_framework_extension("torch") registers its
native extension as sys.modules["transformer_engine_torch_nv"], imports tefl
and calls tefl.load_plugins(). That installs a module object as
sys.modules["transformer_engine_torch"] whose op functions dispatch through
tefl's default manager; the native functions stay reachable through `_nv`
and are registered as the `vendor.cuda` implementation of the catalogue ops
they provide (CUDA tensors only). Attributes that are not catalogue ops are
the native module's, so the rest of TE keeps working.

Only the ops whose Python call signature is TransformerEngine's own
(TE_SIGNATURE_OPS: the normalization, RoPE, activation, softmax and
dropout families, and generic_gemm and the attention entry points through
tefl._te_api) are served by tefl on this module and take the native
functions as their vendor.cuda backend. The others (quantize, dequantize,
compute_amax, the scaling recipes, fp8_transpose, te_general_grouped_gemm,
fused_attn_fwd/bwd, the fused FP8 forms) have tefl's own signatures, which
TE's code would call wrongly: the native module's function of that name is
served when it has one, and tefl's op (with tefl's signature) otherwise.
"""
from __future__ import annotations

import sys
import types
from typing import List, Optional

from ._ops import BY_NAME, SCHEMAS
from ._types import TE_ENUMS

STUB_NAME = "transformer_engine_torch"
NV_NAME = "transformer_engine_torch_nv"
# TE reads these only "if present"; tefl provides them when its catalogue has
# an attention op family, so they are never forwarded from the native module.
ATTENTION_NAMES = ("flash_attention", "get_attention_backend", "get_flash_attention_class")
# Served by tefl._te_api with TransformerEngine's call conventions.
TE_API = {"generic_gemm": "generic_gemm", "flash_attention": "FlashAttention",
          "get_attention_backend": "get_attention_backend", "get_flash_attention_class": "get_flash_attention_class"}


# Families whose catalogue ops take TransformerEngine's pybind arguments in
# TE's order (docs/python.md); their FP8-output forms (*_fp8) are tefl's.
TE_SIGNATURE_FAMILIES = ("normalization", "rope", "activation", "softmax", "dropout")


TE_SIGNATURE_OPS = frozenset(s["name"] for s in SCHEMAS
                             if s["family"] in TE_SIGNATURE_FAMILIES and not s["name"].endswith("_fp8"))


class TeflTexModule(types.ModuleType):
    """transformer_engine_torch served by tefl. An op appears as soon as the
    default registry has an implementation of it, including ops registered
    after the module was installed."""

    def __getattr__(self, name: str):
        from .core import get_default_manager, op_function

        if name.startswith("__"):
            raise AttributeError(name)
        if name in TE_API:  # TE's conventions, not the catalogue op's generated signature
            from . import _te_api

            f = getattr(_te_api, TE_API[name])
            setattr(self, name, f)
            return f
        nv = self.__dict__.get("_nv")
        schema = BY_NAME.get(name)
        if schema is not None and schema["name"] not in TE_SIGNATURE_OPS and nv is not None and hasattr(nv, name):
            return getattr(nv, name)  # tefl's op of that name takes other arguments than TE's
        if schema is not None:
            mgr = get_default_manager()
            mgr.ensure_initialized()
            if mgr.registry._r.impls(schema["name"]):
                f = op_function(name)
                setattr(self, name, f)  # cached: implementations are never unregistered one by one
                return f
        if nv is not None and name not in ATTENTION_NAMES and hasattr(nv, name):
            return getattr(nv, name)
        raise AttributeError(f"module '{STUB_NAME}' (tefl) has no attribute '{name}'")

    def __dir__(self) -> List[str]:
        from .core import get_default_manager

        names = set(self.__dict__)
        names.update(get_default_manager().registry.list_operators())
        names.update(TE_API)
        nv = self.__dict__.get("_nv")
        if nv is not None:
            names.update(n for n in dir(nv) if n not in ATTENTION_NAMES)
        return sorted(names)


def install_stub(name: str = STUB_NAME, nv: Optional[types.ModuleType] = None) -> TeflTexModule:
    """Installs (or returns the installed) tefl transformer_engine_torch module."""
    existing = sys.modules.get(name)
    if isinstance(existing, TeflTexModule):
        if nv is not None:
            existing._nv = nv
        return existing
    mod = TeflTexModule(name, __doc__)
    mod.__file__ = __file__
    for enum_type in TE_ENUMS:
        setattr(mod, enum_type.__name__, enum_type)
        for member in enum_type:  # TE's pybind enums export their values too
            setattr(mod, member.name, member)
    mod._nv = nv
    sys.modules[name] = mod
    return mod


def _register_native(nv: types.ModuleType) -> int:
    """The native module's functions as vendor.cuda implementations of the
    ops whose tefl signature is TE's (TE_SIGNATURE_OPS)."""
    from ._types import BackendImplKind
    from .core import OpImpl, get_default_manager

    reg = get_default_manager().registry
    impls = []
    for schema in SCHEMAS:
        if schema["name"] not in TE_SIGNATURE_OPS:
            continue
        fn = getattr(nv, schema["name"], None)
        if not callable(fn) or reg.get_implementation(schema["name"], "vendor.cuda") is not None:
            continue
        impls.append(OpImpl(schema["name"], "vendor.cuda", BackendImplKind.VENDOR, fn, vendor="cuda", priority=100,
                            devices=frozenset({"cuda"}), origin=NV_NAME))
    reg.register_many(impls)
    return len(impls)


def load_plugins() -> TeflTexModule:
    """TransformerEngine's NVTE_PLUGIN hook (see the module docstring). Raises
    on failure, leaving sys.modules as it was, so that TE's rollback applies."""
    from .core import get_default_manager

    before = sys.modules.get(STUB_NAME)
    nv = sys.modules.get(NV_NAME)
    try:
        get_default_manager().ensure_initialized()
        if nv is not None:
            _register_native(nv)
        return install_stub(STUB_NAME, nv)
    except BaseException:
        if before is None:
            sys.modules.pop(STUB_NAME, None)
        else:
            sys.modules[STUB_NAME] = before
        raise
