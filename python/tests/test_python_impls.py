"""Python functions as implementations: selection, priority, fallback,
strict mode, per-signature demotion, in-place safety, dtype/arch checks,
calls from C (numpy views) and from many threads (GIL)."""
import ctypes
import threading

import numpy as np
import pytest
import torch

import tefl
from tefl import OpImpl, SelectionPolicy


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def good_rmsnorm(input, weight, eps=1e-5, **kwargs):
    return rms(input, weight, eps), torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + eps)


def register(manager, fn, impl_id="vendor.py", priority=100, **kw):
    impl = OpImpl("rmsnorm_fwd", impl_id, "vendor", fn, vendor=impl_id.split(".")[1], priority=priority, **kw)
    manager.registry.register_impl(impl)
    return impl


def test_python_impl_selected_with_the_callers_objects(manager):
    seen = {}

    def mine(input, weight, eps=1e-5, **kwargs):
        seen.update(input=input, weight=weight, eps=eps, kwargs=kwargs)
        return good_rmsnorm(input, weight, eps)

    register(manager, mine)
    x, w = torch.randn(3, 16), torch.randn(16)
    with tefl.with_preference("vendor"):
        y, none, rs = manager.call("rmsnorm_fwd", x, w, 1e-3)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.py"
    assert seen["input"] is x and seen["weight"] is w  # no copies, no re-wrapping
    assert seen["eps"] == pytest.approx(1e-3)
    assert seen["kwargs"]["zero_centered_gamma"] is False and seen["kwargs"]["quantizer"] is None
    torch.testing.assert_close(y, rms(x, w, 1e-3))
    assert rs.shape == (3,) and none is None  # a [N, 1] result is stored into the [N] output


def test_te_layout_result_accepted(manager):
    register(manager, lambda input, weight, eps=1e-5, **k: (rms(input, weight, eps), None,
                                                             torch.rsqrt(input.pow(2).mean(-1) + eps)))
    with tefl.with_preference("vendor"):
        y, _, _ = manager.call("rmsnorm_fwd", torch.ones(2, 4), torch.ones(4))
    torch.testing.assert_close(y, torch.ones(2, 4), rtol=1e-4, atol=1e-4)


def test_wrong_result_shape_is_an_error_that_falls_back(manager, capfd):
    register(manager, lambda input, weight, **k: (torch.zeros(5, 5), torch.zeros(5)))
    x, w = torch.randn(2, 4), torch.randn(4)
    with tefl.with_preference("vendor"):
        y, _, _ = manager.call("rmsnorm_fwd", x, w)
    torch.testing.assert_close(y, rms(x, w))
    err = capfd.readouterr().err
    assert "'vendor.py'" in err and "returned shape [5, 5] for output 'z', expected [2, 4]" in err


def test_raising_impl_falls_back_when_not_strict(manager, capfd):
    calls = []

    def broken(input, weight, **kw):
        calls.append(1)
        raise RuntimeError("kernel exploded")

    register(manager, broken)
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        y, _, _ = manager.call("rmsnorm_fwd", x, w)
        torch.testing.assert_close(y, rms(x, w))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        manager.call("rmsnorm_fwd", x, w)  # demoted for this signature: not tried first again
    assert len(calls) == 1
    err = capfd.readouterr().err
    assert "WARNING" in err and "kernel exploded" in err and "demoted for this signature" in err


def test_none_result_without_the_outputs_handed_over_is_an_error_that_falls_back(manager, capfd):
    # rmsnorm_fwd hands its implementation ln_out (output 'z') but not rsigma:
    # returning None cannot have written rsigma, so the result is refused.
    register(manager, lambda input, weight, **k: None)
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        y, _, rs = manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
    torch.testing.assert_close(y, rms(x, w))
    torch.testing.assert_close(rs, torch.rsqrt(x.pow(2).mean(-1) + 1e-5))
    err = capfd.readouterr().err
    assert "returned None, but output(s) 'rsigma' were not handed to it" in err


def test_strict_mode_after_a_demotion_still_runs_the_first_candidate(manager):
    def broken(input, weight, **kw):
        raise ZeroDivisionError("no luck")

    register(manager, broken)
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", x, w)  # fails, demoted for this signature, default.portable serves
    with tefl.policy_context(SelectionPolicy(prefer="vendor", strict=True)):
        assert manager.explain("rmsnorm_fwd", x, w)["chain"] == ["vendor.py"]
        with pytest.raises(tefl.TeflError, match=r"strict mode.*'vendor.py'.*ZeroDivisionError"):
            manager.call("rmsnorm_fwd", x, w)


def test_raising_impl_fails_in_strict_mode_with_its_exception_chained(manager):
    def broken(input, weight, **kw):
        raise ZeroDivisionError("no luck")

    register(manager, broken)
    with tefl.policy_context(SelectionPolicy(prefer="vendor", strict=True)):
        with pytest.raises(tefl.TeflError, match=r"strict mode.*'vendor.py'.*ZeroDivisionError: no luck") as info:
            manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
    assert isinstance(info.value.__cause__, ZeroDivisionError)
    assert info.value.code == "RUNTIME_ERROR"


@pytest.mark.parametrize("exc", [NotImplementedError("not for this shape"), tefl.Unsupported("declined")])
def test_declining_impl_is_skipped_but_strict_fails(manager, capfd, exc):
    def declines(input, weight, **kw):
        raise exc

    register(manager, declines)
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", x, w)
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
    assert "demoted" not in capfd.readouterr().err  # declining is not a failure
    with tefl.policy_context(SelectionPolicy(prefer="vendor", strict=True)):
        with pytest.raises(tefl.TeflError, match="declined"):
            manager.call("rmsnorm_fwd", x, w)


def test_fallback_is_per_call_signature_not_per_op(manager):
    calls = []

    def only_2d(input, weight, eps=1e-5, **kw):
        calls.append(input.dim())
        if input.dim() != 2:
            raise RuntimeError("only 2-D")
        return good_rmsnorm(input, weight, eps)

    register(manager, only_2d)
    w = torch.randn(8)
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", torch.randn(2, 3, 8), w)  # fails, falls back, demoted for 3-D
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        manager.call("rmsnorm_fwd", torch.randn(2, 8), w)  # 2-D still goes to the Python impl
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.py"
        manager.call("rmsnorm_fwd", torch.randn(4, 2, 8), w)  # 3-D: demoted impl not tried first
    assert calls == [3, 2]


def test_failing_in_place_impl_is_not_retried(manager):
    calls = []

    def writes_then_fails(dz, x, add, rsigma, gamma, **kw):
        calls.append(1)
        add.zero_()  # dx aliases add: the input is gone
        raise RuntimeError("half way")

    manager.registry.register_impl(OpImpl("rmsnorm_bwd_add", "vendor.py", "vendor", writes_then_fails, vendor="py"))
    x, g = torch.randn(3, 8), torch.randn(8)
    _, _, rs = manager.call("rmsnorm_fwd", x, g)
    dz, add = torch.randn(3, 8), torch.randn(3, 8)
    with tefl.with_preference("vendor"):
        with pytest.raises(tefl.TeflError, match="in-place op: not retried"):
            manager.call("rmsnorm_bwd_add", dz, x, add, rs, g, out=(add, None))
        assert calls == [1]
        # Out of place the same failure falls back.
        dx, dg = manager.call("rmsnorm_bwd_add", dz, x, torch.randn(3, 8), rs, g)
    assert calls == [1, 1] and manager.get_selected_impl_id("rmsnorm_bwd_add") == "default.portable"


def test_supported_dtypes_are_checked(manager):
    calls = []

    def bf16_only(input, weight, eps=1e-5, **kw):
        calls.append(input.dtype)
        return good_rmsnorm(input.float(), weight.float(), eps)

    register(manager, bf16_only, supported_dtypes={torch.bfloat16})
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        manager.call("rmsnorm_fwd", torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(8, dtype=torch.bfloat16))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.py"
    assert calls == [torch.bfloat16]


def test_min_arch_is_checked_per_device(manager):
    register(manager, good_rmsnorm, min_arch="sm80")
    with tefl.with_preference("vendor"):
        r = manager.explain("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
    reason = {c["impl_id"]: c["reason"] for c in r["candidates"]}["vendor.py"]
    assert "min_arch sm_80 needs a CUDA device; the call is on cpu" in reason
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"


def test_devices_limit_the_device_types_served(manager):
    register(manager, good_rmsnorm, devices={"cuda"})
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"


def test_numpy_caller_gets_numpy_in_python_impl(manager):
    seen = []

    def mine(input, weight, eps=1e-5, **kw):
        seen.append(type(input))
        v = (input.astype(np.float64) ** 2).mean(-1, keepdims=True) + eps
        return input / np.sqrt(v) * weight, 1 / np.sqrt(v)

    register(manager, mine)
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    with tefl.with_preference("vendor"):
        y, _, rs = manager.call("rmsnorm_fwd", x, np.ones(8, np.float32))
    assert seen == [np.ndarray] and isinstance(y, np.ndarray) and y.dtype == np.float32
    np.testing.assert_allclose(y, x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + 1e-5),
                               rtol=1e-6)


def test_python_impl_from_many_threads(manager):
    register(manager, good_rmsnorm)
    x, w = torch.randn(4, 32), torch.randn(32)
    errors = []

    def work():
        try:
            with tefl.with_preference("vendor"):
                for _ in range(50):
                    y, _, _ = manager.call("rmsnorm_fwd", x, w)
                    torch.testing.assert_close(y, rms(x, w))
        except Exception as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []


# ---- a C caller reaching a Python implementation -------------------------------------

class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


def _libtefl():
    with open("/proc/self/maps") as f:
        for line in f:
            if "libtefl.so" in line:
                return ctypes.CDLL(line.split()[-1])
    raise RuntimeError("libtefl not mapped")


def _dl(a, keep):
    shape = (ctypes.c_int64 * a.ndim)(*a.shape)
    keep.append(shape)
    return DLTensor(a.ctypes.data, DLDevice(1, 0), a.ndim, DLDataType(2, 32, 1), shape, None, 0)


_C_ENABLED = {"on": False}


def _c_side_impl(input, weight, eps=1e-5, **kw):
    if not _C_ENABLED["on"]:
        raise NotImplementedError("only for the C-caller test")
    _C_ENABLED["seen"] = (type(input), type(weight), eps)
    v = (input ** 2).mean(-1, keepdims=True) + eps
    return input / np.sqrt(v) * weight * 2, 1 / np.sqrt(v)


def test_c_caller_reaches_python_impl_with_numpy_views():
    lib = _libtefl()
    lib.tefl_call.restype = ctypes.c_void_p
    lib.tefl_status_message.restype = ctypes.c_char_p
    lib.tefl_op_id.restype = ctypes.c_int32
    reg = tefl.get_default_manager().registry
    if reg.get_implementation("rmsnorm_fwd", "vendor.cside") is None:
        reg.register_impl(OpImpl("rmsnorm_fwd", "vendor.cside", "vendor", _c_side_impl, vendor="cside",
                                 priority=10_000))
    tefl.get_default_manager().ensure_initialized()
    x = np.random.default_rng(2).standard_normal((3, 8)).astype(np.float32)
    w = np.ones(8, np.float32)
    z = np.zeros_like(x)
    rs = np.zeros(3, np.float32)
    keep = []
    ins = (ctypes.POINTER(DLTensor) * 2)(*(ctypes.pointer(_dl(a, keep)) for a in (x, w)))
    outs = (ctypes.POINTER(DLTensor) * 2)(*(ctypes.pointer(_dl(a, keep)) for a in (z, rs)))
    tefl.set_global_policy(SelectionPolicy(prefer="vendor"))  # C callers see the global policy
    _C_ENABLED["on"] = True
    try:
        st = lib.tefl_call(lib.tefl_op_id(b"rmsnorm_fwd"), ins, 2, outs, 2, None, None)
    finally:
        _C_ENABLED["on"] = False
    assert st is None, lib.tefl_status_message(ctypes.c_void_p(st))
    assert _C_ENABLED["seen"][:2] == (np.ndarray, np.ndarray)
    np.testing.assert_allclose(z, 2 * x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5), rtol=1e-5)
