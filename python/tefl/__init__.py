"""tefl: TE-FL's Python API on tefl's C++ operator-dispatch core.

Switching from TE-FL is one import: ``from tefl import OpRegistry, OpManager,
OpImpl, BackendImplKind``. Every catalogue op is a function here
(``tefl.rmsnorm_fwd(x, w, 1e-5, None, None, None, 0, False)``) with
TransformerEngine's call signature, calling through the default manager;
torch tensors and numpy arrays go in and come out without copies (DLPack).
"""
from __future__ import annotations

from . import _core  # noqa: F401 - loads libtefl first
from ._ops import SCHEMAS as _SCHEMAS
from ._ops import BY_NAME as _BY_NAME
from ._types import (DType, NVTE_Bias_Type, NVTE_Fused_Attn_Backend, NVTE_Mask_Type, NVTE_QKV_Format,
                     NVTE_Softmax_Type, BackendImplKind)
from .core import (PLUGIN_GROUP, PLUGIN_MODULES_ENV, PREFER_DEFAULT, PREFER_REFERENCE, PREFER_VENDOR,
                   VALID_PREFER_VALUES, OpImpl, OpManager, OpRegistry, PolicyManager, SelectionPolicy, TeflError,
                   Unsupported, bump_policy_epoch, call, clear_discovered_plugin, discover_from_entry_points,
                   discover_from_env_modules, discover_plugin, get_default_manager, get_discovered_plugin,
                   get_policy, get_policy_epoch, match_token, op_function, policy_context, policy_from_env,
                   reset_default_manager, reset_global_policy, set_global_policy, with_allowed_vendors,
                   with_denied_vendors, with_preference, with_strict_mode)
from ._te import install_stub, load_plugins
from ._te_api import (FlashAttention, Float8Quantizer, Float8Tensor, attention_backend, flash_attention,
                      generic_gemm, get_attention_backend, get_flash_attention_class)

__version__ = "0.1.0"

__all__ = [
    "BackendImplKind", "OpImpl", "match_token", "OpRegistry", "SelectionPolicy", "PolicyManager", "get_policy",
    "set_global_policy", "reset_global_policy", "policy_context", "policy_from_env", "get_policy_epoch",
    "bump_policy_epoch", "with_strict_mode", "with_preference", "with_allowed_vendors", "with_denied_vendors",
    "PREFER_DEFAULT", "PREFER_VENDOR", "PREFER_REFERENCE", "VALID_PREFER_VALUES", "OpManager",
    "get_default_manager", "reset_default_manager", "discover_plugin", "discover_from_entry_points",
    "discover_from_env_modules", "get_discovered_plugin", "clear_discovered_plugin", "PLUGIN_GROUP",
    "PLUGIN_MODULES_ENV", "install_stub", "load_plugins", "DType", "NVTE_Mask_Type", "NVTE_QKV_Format",
    "NVTE_Bias_Type", "NVTE_Softmax_Type", "NVTE_Fused_Attn_Backend", "TeflError", "Unsupported", "call",
    "ops", "generic_gemm", "get_attention_backend", "attention_backend", "flash_attention",
    "get_flash_attention_class", "FlashAttention", "Float8Tensor", "Float8Quantizer",
]


def ops():
    """Names of every catalogue op (each is a function of this package)."""
    return sorted(s["name"] for s in _SCHEMAS)


def __getattr__(name: str):
    # Every catalogue op (and alias) is tefl.<op>, generated from its schema.
    if name in _BY_NAME:
        f = op_function(name)
        globals()[name] = f
        return f
    raise AttributeError(f"module 'tefl' has no attribute '{name}'")


def __dir__():
    return sorted(set(globals()) | set(_BY_NAME))
