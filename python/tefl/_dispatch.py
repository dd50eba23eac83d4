"""Hooks libtefl calls back into: running a Python implementation, min_arch."""
from __future__ import annotations

import sys

from . import _core
from ._ops import SIG_BY_ID


class Unsupported(Exception):
    """Raise from a Python implementation to decline a call before writing any
    output (libtefl's TEFL_UNSUPPORTED): the manager tries the next candidate,
    even in-place ops. NotImplementedError means the same."""


def run_python_impl(fn, op_id, inputs, outputs, attrs):
    SIG_BY_ID[op_id].impl_call(fn, inputs, outputs, attrs)


def parse_arch(min_arch):
    """(major, minor) from 80, "sm80", "sm_80", "8.0" or (8, 0)."""
    if min_arch is None:
        return None
    if isinstance(min_arch, (tuple, list)) and len(min_arch) == 2:
        return int(min_arch[0]), int(min_arch[1])
    text = str(min_arch).lower().replace("sm_", "").replace("sm", "").strip()
    if "." in text:
        a, b = text.split(".", 1)
        return int(a), int(b)
    n = int(text)
    return n // 10, n % 10


def device_capabilities():
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F401
        except ImportError:
            return []
        torch = sys.modules["torch"]
    try:
        if not torch.cuda.is_available():
            return []
        return [tuple(torch.cuda.get_device_capability(i)) for i in range(torch.cuda.device_count())]
    except Exception:  # noqa: BLE001 - a broken CUDA setup means no capable device
        return []


_DEVICE_NAMES = {1: "cpu", 2: "cuda", 3: "cuda_host", 4: "opencl", 7: "vulkan", 8: "metal", 10: "rocm"}


def arch_ok(min_arch, device_type, device_id):
    need = parse_arch(min_arch)
    if device_type != 2:  # kDLCUDA
        return False, (f"min_arch sm_{need[0]}{need[1]} needs a CUDA device; the call is on "
                       f"{_DEVICE_NAMES.get(device_type, device_type)}")
    caps = device_capabilities()
    if device_id >= len(caps):
        return False, f"min_arch sm_{need[0]}{need[1]}: CUDA device {device_id} not visible to torch"
    have = caps[device_id]
    if tuple(have) < need:
        return False, f"min_arch sm_{need[0]}{need[1]}: device {device_id} is sm_{have[0]}{have[1]}"
    return True, ""


_core._set_hooks(run_python_impl, arch_ok, Unsupported)
