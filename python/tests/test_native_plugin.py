"""A native (C ABI) plugin loads from Python as in C++: the repository's
plugins/example/myvendor.c, compiled here against include/ only."""
import os
import shutil
import subprocess

import numpy as np
import pytest
import torch

import tefl

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SOURCE = os.path.join(ROOT, "plugins", "example", "myvendor.c")


@pytest.fixture(scope="module")
def plugin_so(tmp_path_factory):
    if not os.path.exists(SOURCE) or shutil.which("cc") is None:
        pytest.skip("needs plugins/example/myvendor.c and a C compiler")
    d = tmp_path_factory.mktemp("native")
    os.chmod(d, 0o755)  # the loader refuses group/other-writable plugin directories
    so = d / "libtefl_plugin_myvendor.so"
    subprocess.run(["cc", "-std=c11", "-shared", "-fPIC", "-O1", "-I", os.path.join(ROOT, "include"), SOURCE, "-o",
                    str(so), "-lm"], check=True)
    return str(so)


def test_native_plugin_through_te_fl_plugin_modules(plugin_so, monkeypatch):
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", plugin_so)
    tefl.clear_discovered_plugin()
    m = tefl.OpManager(tefl.OpRegistry())
    m.ensure_initialized()
    impl = m.registry.get_implementation("rmsnorm_fwd", "vendor.myvendor")
    assert impl is not None and impl.origin == plugin_so and impl.kind is tefl.BackendImplKind.VENDOR
    x, w = torch.randn(4, 32), torch.randn(32)
    with tefl.with_preference("vendor"):
        y, _, rs = m.call("rmsnorm_fwd", x, w)
        assert m.get_selected_impl_id("rmsnorm_fwd") == "vendor.myvendor"
        # its supports() declines bf16: the next candidate serves it, the reason is explained
        xb, wb = x.bfloat16(), w.bfloat16()
        m.call("rmsnorm_fwd", xb, wb)
        assert m.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        reasons = {c["impl_id"]: c["reason"] for c in m.explain("rmsnorm_fwd", xb, wb)["candidates"]}
        assert "myvendor handles float32" in reasons["vendor.myvendor"]
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w, rtol=1e-5,
                               atol=1e-5)
    y2, _, _ = impl.fn(x.numpy(), w.numpy())  # the plugin's kernel alone, numpy in and out
    assert isinstance(y2, np.ndarray)
    np.testing.assert_allclose(y2, y.numpy(), rtol=1e-6, atol=1e-6)
    rec = [d for d in tefl.get_discovered_plugin() if d["name"] == plugin_so]
    assert rec and rec[0]["loaded"] and rec[0]["source"] == "native"


def test_group_writable_plugin_is_refused(plugin_so, tmp_path, monkeypatch, capfd):
    os.chmod(tmp_path, 0o755)
    bad = tmp_path / "libtefl_plugin_unsafe.so"
    shutil.copy(plugin_so, bad)
    os.chmod(bad, 0o775)
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", str(bad))
    m = tefl.OpManager(tefl.OpRegistry())
    m.ensure_initialized()
    assert m.registry.get_implementation("rmsnorm_fwd", "vendor.myvendor") is None
    assert "writable" in capfd.readouterr().err
