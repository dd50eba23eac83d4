"""Plugins: TE_FL_PLUGIN_MODULES (Python modules, native names), the
te_fl.plugin entry-point group, transactional registration."""
import sys
import textwrap

import pytest
import torch

import tefl

PLUGIN = """
import torch
from tefl import OpImpl, BackendImplKind

def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
    r = torch.rsqrt(input.pow(2).mean(-1, keepdim=True) + eps)
    return input * r * weight * {scale}, r

{body}
"""


def write_module(tmp_path, name, body, scale=1):
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(PLUGIN.format(scale=scale, body=textwrap.dedent(body))))


REGISTER = """
def register(registry):
    registry.register_impl(OpImpl(op_name="rmsnorm_fwd", impl_id="vendor.{v}", kind=BackendImplKind.VENDOR,
                                  vendor="{v}", fn=my_rmsnorm, priority=200))
"""


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    tefl.clear_discovered_plugin()
    yield tmp_path
    tefl.clear_discovered_plugin()


def fresh():
    m = tefl.OpManager(tefl.OpRegistry())
    m.ensure_initialized()
    return m


def ids(m, op="rmsnorm_fwd"):
    return sorted(i.impl_id for i in m.registry.get_implementations(op))


def test_env_module_plugin(plugin_dir, monkeypatch, capfd):
    write_module(plugin_dir, "plug_env_a", REGISTER.format(v="enva"), scale=2)
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", " plug_env_a ")
    m = fresh()
    assert ids(m) == ["default.portable", "reference.cpp", "vendor.enva"]
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        y, _, _ = m.call("rmsnorm_fwd", x, w)
    assert m.get_selected_impl_id("rmsnorm_fwd") == "vendor.enva"
    torch.testing.assert_close(y, 2 * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    err = capfd.readouterr().err
    assert "Plugin 'plug_env_a' (env) registered 1 implementation(s)" in err
    assert "Registered impl_ids: ['default.portable', 'reference.cpp', 'vendor.enva']" in err
    assert [(d["name"], d["source"], d["loaded"]) for d in tefl.get_discovered_plugin()] == [
        ("plug_env_a", "env", True)]
    tefl.clear_discovered_plugin()
    assert tefl.get_discovered_plugin() == []


def test_a_module_made_at_run_time_is_a_python_plugin(plugin_dir, monkeypatch):
    """A module only in sys.modules (no __spec__: find_spec raises) was taken
    for a native plugin name and reported missing from the plugin directories."""
    import types

    mod = types.ModuleType("plug_runtime_made")

    def register(registry):
        registry.register_impl(tefl.OpImpl("rmsnorm_fwd", "vendor.rt", "vendor", lambda *a, **k: None, vendor="rt"))

    mod.register = register
    monkeypatch.setitem(sys.modules, "plug_runtime_made", mod)
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_runtime_made")
    m = fresh()
    assert "vendor.rt" in ids(m)
    assert [(d["name"], d["source"], d["loaded"]) for d in tefl.get_discovered_plugin()] == [
        ("plug_runtime_made", "env", True)]


def test_te_fl_register_and_callable_module_attribute(plugin_dir, monkeypatch):
    write_module(plugin_dir, "plug_env_b", REGISTER.format(v="envb").replace("def register", "def te_fl_register"))
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_env_b")
    assert "vendor.envb" in ids(fresh())


def test_failing_plugin_leaves_nothing(plugin_dir, monkeypatch, capfd):
    write_module(plugin_dir, "plug_bad", REGISTER.format(v="bad") + """
_inner = register
def register(registry):
    _inner(registry)  # one registration made, then:
    raise RuntimeError("vendor library missing")
""")
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_bad")
    m = fresh()
    assert ids(m) == ["default.portable", "reference.cpp"]
    err = capfd.readouterr().err
    assert "WARNING" in err and "Plugin 'plug_bad' (env) failed, nothing of it was registered" in err
    assert tefl.get_discovered_plugin()[0]["error"] == "RuntimeError: vendor library missing"


def test_plugin_with_a_duplicate_id_is_rolled_back(plugin_dir, monkeypatch):
    write_module(plugin_dir, "plug_dup", """
def register(registry):
    registry.register_impl(OpImpl("layernorm_fwd", "vendor.dup", "vendor", my_rmsnorm, vendor="dup"))
    registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.dup", "vendor", my_rmsnorm, vendor="dup"))
    registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.dup", "vendor", my_rmsnorm, vendor="dup"))
""")
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_dup")
    m = fresh()
    assert "vendor.dup" not in ids(m) and "vendor.dup" not in ids(m, "layernorm_fwd")


def test_import_error_and_unknown_native_name(plugin_dir, monkeypatch, capfd):
    (plugin_dir / "plug_broken.py").write_text("import does_not_exist_anywhere\n")
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_broken,no_such_plugin_xyz")
    m = fresh()
    assert ids(m) == ["default.portable", "reference.cpp"]
    rec = {d["name"]: d for d in tefl.get_discovered_plugin()}
    assert not rec["plug_broken"]["loaded"] and "does_not_exist_anywhere" in rec["plug_broken"]["error"]
    assert rec["no_such_plugin_xyz"]["source"] == "native" and not rec["no_such_plugin_xyz"]["loaded"]
    assert rec["no_such_plugin_xyz"]["error"]


def test_a_relative_plugin_path_is_said_without_plugin_modules(plugin_dir, monkeypatch, capfd):
    """TE_FL_PLUGIN_PATH was read only to look a named module up: a relative
    entry went unsaid when TE_FL_PLUGIN_MODULES was unset."""
    monkeypatch.delenv("TE_FL_PLUGIN_MODULES", raising=False)
    monkeypatch.setenv("TE_FL_PLUGIN_PATH", "relative/dir")
    capfd.readouterr()
    fresh()
    assert ("Ignoring TE_FL_PLUGIN_PATH entry 'relative/dir': plugin directories must be absolute"
            in capfd.readouterr().err)


def test_entry_point_plugin(plugin_dir, monkeypatch):
    write_module(plugin_dir, "plug_ep", REGISTER.format(v="ep"))
    write_module(plugin_dir, "plug_ep_fn", """
def install(registry):
    registry.register_impl(OpImpl("layernorm_fwd", "vendor.epfn", "vendor", my_rmsnorm, vendor="epfn"))
""")
    dist = plugin_dir / "plug_ep-0.1.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: plug-ep\nVersion: 0.1\n")
    (dist / "entry_points.txt").write_text("[te_fl.plugin]\nep = plug_ep\nepfn = plug_ep_fn:install\n")
    monkeypatch.delenv("TE_FL_PLUGIN_MODULES", raising=False)
    m = fresh()
    assert "vendor.ep" in ids(m) and "vendor.epfn" in ids(m, "layernorm_fwd")
    assert {(d["name"], d["source"]) for d in tefl.get_discovered_plugin()} >= {("ep", "entry_point"),
                                                                               ("epfn", "entry_point")}


def test_explicit_discovery_into_a_registry(plugin_dir, monkeypatch):
    write_module(plugin_dir, "plug_env_c", REGISTER.format(v="envc"))
    monkeypatch.setenv("TE_FL_PLUGIN_MODULES", "plug_env_c")
    reg = tefl.OpRegistry()
    assert tefl.discover_from_env_modules(reg) == 1
    assert [i.impl_id for i in reg.get_implementations("rmsnorm_fwd")] == ["vendor.envc"]
    assert tefl.discover_from_entry_points(reg) == 0
    with pytest.raises(ValueError):  # loading twice: duplicate ids, rolled back, reported
        reg.register_impl(reg.get_implementations("rmsnorm_fwd")[0])


def test_installed_plugin_dir_is_plugins_next_to_the_package_library():
    # The wheel's libtefl sits in the package directory; its built-in plugin
    # directory is found at run time next to it (not the build's staging prefix).
    import os

    from tefl import _core

    pkg = os.path.dirname(os.path.realpath(tefl.__file__))
    assert any(f.startswith("libtefl.so") for f in os.listdir(pkg))
    assert os.path.realpath(_core.installed_plugin_dir()) == os.path.join(pkg, "plugins")
