"""Each TE-FL defect of the spec, shown fixed (some are shown in detail in
test_python_impls.py / test_nvte_plugin.py; each has its own test here)."""
import ast
import os
import re
import subprocess
import tempfile
import sys

import pytest
import torch

import tefl
from tefl import OpImpl

HERE = os.path.dirname(os.path.abspath(__file__))


def broken(input, weight, **kw):
    raise RuntimeError("broken vendor kernel")


def _rms(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w


@pytest.mark.parametrize("value,strict", [(None, False), ("0", False), ("1", True)])
def test_te_fl_strict_follows_the_documentation(manager, monkeypatch, value, strict):
    """TE-FL: fallback was on unless TE_FL_STRICT was set to 0 (inverted)."""
    monkeypatch.setenv("TE_FL_PREFER", "vendor")
    if value is None:
        monkeypatch.delenv("TE_FL_STRICT", raising=False)
    else:
        monkeypatch.setenv("TE_FL_STRICT", value)
    assert tefl.policy_from_env().strict is strict
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.broken", "vendor", broken, vendor="broken"))
    tefl.reset_global_policy()  # re-reads the environment
    x, w = torch.randn(2, 8), torch.randn(8)
    if strict:
        with pytest.raises(tefl.TeflError, match="strict mode"):
            manager.call("rmsnorm_fwd", x, w)
    else:
        torch.testing.assert_close(manager.call("rmsnorm_fwd", x, w)[0], _rms(x, w))


def test_vendor_names_match_case_insensitively(manager, monkeypatch):
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.acme", "vendor",
                                          lambda input, weight, eps=1e-5, **k: (_rms(input, weight), None,
                                                                                 torch.ones(input.shape[0])),
                                          vendor="Acme"))
    x, w = torch.randn(2, 8), torch.randn(8)
    monkeypatch.setenv("TE_FL_PREFER", "vendor")
    monkeypatch.setenv("TE_FL_ALLOW_VENDORS", " ACME ,nvidia")
    tefl.reset_global_policy()
    manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.acme"
    monkeypatch.setenv("TE_FL_DENY_VENDORS", "acme")
    tefl.reset_global_policy()
    manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
    monkeypatch.setenv("TE_FL_PER_OP", "rmsnorm_fwd=vendor:ACME|flagos")
    monkeypatch.delenv("TE_FL_DENY_VENDORS")
    tefl.reset_global_policy()
    manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.acme"


def test_fallback_is_cached_per_signature_not_per_op(manager):
    def f16_broken(input, weight, eps=1e-5, **kw):
        if input.dtype == torch.float16:
            raise RuntimeError("no fp16 kernel")
        return _rms(input, weight), torch.rsqrt(input.pow(2).mean(-1) + eps)

    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.v", "vendor", f16_broken, vendor="v"))
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", torch.randn(2, 8, dtype=torch.float16), torch.randn(8, dtype=torch.float16))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.v"


def test_failing_in_place_op_is_not_retried_after_it_wrote(manager):
    def clobber(dz, x, add, rsigma, gamma, **kw):
        add.fill_(float("nan"))
        raise RuntimeError("failed after writing")

    manager.registry.register_impl(OpImpl("rmsnorm_bwd_add", "vendor.v", "vendor", clobber, vendor="v"))
    x, g = torch.randn(2, 8), torch.randn(8)
    _, _, rs = manager.call("rmsnorm_fwd", x, g)
    add = torch.randn(2, 8)
    with tefl.with_preference("vendor"), pytest.raises(tefl.TeflError, match="not retried"):
        manager.call("rmsnorm_bwd_add", torch.randn(2, 8), x, add, rs, g, out=(add, None))
    assert torch.isnan(add).all()  # what it wrote is reported, never silently recomputed on top


def test_supported_dtypes_and_min_arch_are_checked(manager):
    calls = []

    def mine(input, weight, eps=1e-5, **kw):
        calls.append(1)
        return _rms(input, weight), None, torch.rsqrt(input.pow(2).mean(-1) + eps)

    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.f16", "vendor", mine, vendor="f16",
                                          supported_dtypes={"float16"}))
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.sm90", "vendor", mine, vendor="sm90",
                                          min_arch=90))
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
    assert calls == [] and manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")
def test_fork_child_keeps_a_consistent_registry(manager):
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.parent", "vendor",
                                          lambda input, weight, eps=1e-5, **k: (_rms(input, weight), None,
                                                                                 torch.ones(input.shape[0])),
                                          vendor="parent"))
    default = tefl.get_default_manager()
    default.ensure_initialized()
    before = sorted(i.impl_id for i in default.registry.get_implementations("rmsnorm_fwd"))
    x, w = torch.randn(2, 8), torch.randn(8)
    r, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: use everything again; nothing may be registered twice
        try:
            os.close(r)
            default.ensure_initialized()
            tefl.OpManager(tefl.OpRegistry()).ensure_initialized()
            after = sorted(i.impl_id for i in tefl.get_default_manager().registry.get_implementations("rmsnorm_fwd"))
            with tefl.with_preference("vendor"):
                y, _, _ = manager.call("rmsnorm_fwd", x, w)
            y2, _, _ = tefl.rmsnorm_fwd(x, w)
            ok = (after == before and manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.parent"
                  and torch.allclose(y, _rms(x, w)) and torch.allclose(y2, _rms(x, w), atol=1e-5))
            os.write(wfd, b"ok" if ok else f"bad {after} {before}".encode())
        except BaseException as e:  # noqa: BLE001
            os.write(wfd, f"error {type(e).__name__}: {e}".encode())
        finally:
            os._exit(0)
    os.close(wfd)
    with os.fdopen(r, "rb") as f:
        msg = f.read().decode()
    os.waitpid(pid, 0)
    assert msg == "ok"


def test_install_stub_shows_ops_registered_later(monkeypatch):
    saved = sys.modules.pop("transformer_engine_torch", None)
    try:
        import tefl.core as core

        empty = tefl.OpManager(tefl.OpRegistry())  # a default manager whose registry starts empty
        empty.ensure_initialized()
        empty.registry.clear()
        monkeypatch.setattr(core, "_default_manager", empty)
        mod = tefl.install_stub()
        reg = tefl.get_default_manager().registry
        assert "fused_rope_backward" not in dir(mod) and not hasattr(mod, "fused_rope_backward")
        reg.register_impl(OpImpl("fused_rope_backward", "vendor.later", "vendor",
                                 lambda output_grads, freqs, *a, **k: output_grads + 1, vendor="later"))
        g = torch.zeros(3, 2, 2, 4)
        out = mod.fused_rope_backward(g, torch.zeros(3, 1, 1, 4))
        torch.testing.assert_close(out, g + 1)
    finally:
        sys.modules.pop("transformer_engine_torch", None)
        if saved is not None:
            sys.modules["transformer_engine_torch"] = saved


def test_the_test_runner_collects_every_test():
    """TE-FL's runner collected almost none of its tests: every test function
    defined in python/tests must be collected by pytest."""
    defined = set()
    for name in os.listdir(HERE):
        if name.startswith("test_") and name.endswith(".py"):
            tree = ast.parse(open(os.path.join(HERE, name)).read())
            defined |= {(name, n.name) for n in tree.body if isinstance(n, ast.FunctionDef)
                        and n.name.startswith("test_")}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", HERE],
                         capture_output=True, text=True, cwd=tempfile.gettempdir(), timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    collected = set()
    for line in out.stdout.splitlines():
        m = re.match(r"^(?:.*/)?(test_\w+\.py)::(test_\w+)", line.strip())
        if m:
            collected.add((m.group(1), m.group(2)))
    assert defined and defined <= collected, sorted(defined - collected)
