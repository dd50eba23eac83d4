"""TransformerEngine's NVTE_PLUGIN entry point, through a stand-in for TE's
load_framework_extension("torch") written from the contract:

  alias the native extension as transformer_engine_torch_nv, import the
  NVTE_PLUGIN module, call its load_plugins(); on failure remove the alias,
  restore the native module and emit a RuntimeWarning; then read
  tex.flash_attention / tex.get_attention_backend if present.
"""
import importlib
import os
import sys
import types
import warnings

import pytest
import torch

import tefl
import tefl._te

STUB, NV = "transformer_engine_torch", "transformer_engine_torch_nv"


def load_framework_extension(framework, native):
    sys.modules[STUB] = native
    plugin = os.environ.get("NVTE_PLUGIN")
    if framework == "torch" and plugin:
        sys.modules[NV] = native
        try:
            importlib.import_module(plugin).load_plugins()
        except Exception as e:  # noqa: BLE001 - TE's handler is deliberately broad
            sys.modules.pop(NV, None)
            sys.modules[STUB] = native
            warnings.warn(f"NVTE_PLUGIN '{plugin}' failed, using the native extension: {e}", RuntimeWarning)
    tex = sys.modules[STUB]
    overrides = {n: getattr(tex, n) for n in ("flash_attention", "get_attention_backend") if hasattr(tex, n)}
    return tex, overrides


def make_native():
    native = types.ModuleType(STUB)
    native.calls = []

    def rmsnorm_fwd(input, weight, eps, ln_out, quantizer, otype, sm_margin, zero_centered_gamma):
        native.calls.append("rmsnorm_fwd")
        raise RuntimeError("the native extension needs CUDA")

    native.rmsnorm_fwd = rmsnorm_fwd
    native.get_cublasLt_version = lambda: 120000
    native.flash_attention = object()
    native.get_attention_backend = lambda params=None: (True, None, False, None, False, [])
    return native


@pytest.fixture
def clean_modules(monkeypatch):
    saved = {k: sys.modules.get(k) for k in (STUB, NV)}
    yield
    for k, v in saved.items():
        if v is None:
            sys.modules.pop(k, None)
        else:
            sys.modules[k] = v


def test_success_path(clean_modules, monkeypatch):
    monkeypatch.setenv("NVTE_PLUGIN", "tefl")
    native = make_native()
    tex, overrides = load_framework_extension("torch", native)
    assert isinstance(tex, tefl._te.TeflTexModule) and tex is not native
    assert sys.modules[STUB] is tex and sys.modules[NV] is native and tex._nv is native
    # ops dispatch through the manager (CPU tensors: the native CUDA vendor is not a candidate)
    x, w = torch.randn(3, 16), torch.randn(16)
    y, none, rs = tex.rmsnorm_fwd(x, w, 1e-5, None, None, tefl.DType.kFloat32, 0, False)
    torch.testing.assert_close(y, x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w)
    assert none is None and native.calls == []
    # native functions are the vendor.cuda backend (CUDA tensors only)
    cuda = tefl.get_default_manager().registry.get_implementation("rmsnorm_fwd", "vendor.cuda")
    assert cuda is not None and cuda.fn is native.rmsnorm_fwd and cuda.devices == {"cuda"}
    # everything else of TE stays reachable
    assert tex.get_cublasLt_version() == 120000
    assert tex.DType.kBFloat16 == 6 and tex.NVTE_QKV_Format.NVTE_THD == 2 and tex.NVTE_CAUSAL_MASK == 2
    # tefl's attention overrides TE's (the NVTE_PLUGIN contract), with TE's conventions
    assert overrides == {"flash_attention": tefl.FlashAttention, "get_attention_backend": tefl.get_attention_backend}
    assert tex.generic_gemm is tefl.generic_gemm
    assert "rmsnorm_fwd" in dir(tex)


def empty_default_manager(monkeypatch):
    """A default manager whose registry starts empty (initialised, then
    cleared: the built-ins are not registered again)."""
    import tefl.core as core

    m = tefl.OpManager(tefl.OpRegistry())
    m.ensure_initialized()
    m.registry.clear()
    monkeypatch.setattr(core, "_default_manager", m)
    return m


def test_ops_registered_later_appear_on_the_module(clean_modules, monkeypatch):
    monkeypatch.setenv("NVTE_PLUGIN", "tefl")
    reg = empty_default_manager(monkeypatch).registry
    tex, _ = load_framework_extension("torch", make_native())
    assert not hasattr(tex, "fused_rope_forward")

    def my_rope(input, freqs, start_positions=None, **kw):
        return input * 2

    reg.register_impl(tefl.OpImpl("fused_rope_forward", "vendor.late", "vendor", my_rope, vendor="late"))
    x = torch.randn(4, 2, 3, 8)
    out = tex.fused_rope_forward(x, torch.zeros(4, 1, 1, 8), None, tefl.NVTE_QKV_Format.NVTE_SBHD, False, None, 1, 0)
    torch.testing.assert_close(out, x * 2)


def test_rollback_when_load_plugins_raises(clean_modules, monkeypatch, tmp_path):
    (tmp_path / "broken_te_plugin.py").write_text("def load_plugins():\n    raise RuntimeError('boom')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("NVTE_PLUGIN", "broken_te_plugin")
    native = make_native()
    with pytest.warns(RuntimeWarning, match="boom"):
        tex, overrides = load_framework_extension("torch", native)
    assert tex is native and sys.modules[STUB] is native and NV not in sys.modules
    assert set(overrides) == {"flash_attention", "get_attention_backend"}  # the native ones


def test_rollback_when_the_plugin_does_not_import(clean_modules, monkeypatch):
    monkeypatch.setenv("NVTE_PLUGIN", "no_such_te_plugin_module")
    native = make_native()
    with pytest.warns(RuntimeWarning, match="no_such_te_plugin_module"):
        tex, _ = load_framework_extension("torch", native)
    assert tex is native and NV not in sys.modules


def test_tefl_load_plugins_failure_leaves_sys_modules_untouched(clean_modules, monkeypatch):
    def fail(nv):
        raise RuntimeError("cannot register the native backend")

    monkeypatch.setattr(tefl._te, "_register_native", fail)
    monkeypatch.setenv("NVTE_PLUGIN", "tefl")
    sys.modules.pop(STUB, None)
    native = make_native()
    with pytest.warns(RuntimeWarning, match="cannot register the native backend"):
        tex, _ = load_framework_extension("torch", native)
    assert tex is native and sys.modules[STUB] is native and NV not in sys.modules


def test_install_stub_without_te(clean_modules):
    sys.modules.pop(STUB, None)
    sys.modules.pop(NV, None)
    mod = tefl.install_stub()
    assert sys.modules[STUB] is mod and tefl.install_stub() is mod
    y, _, _ = mod.rmsnorm_fwd(torch.randn(2, 8), torch.ones(8), 1e-5, None, None, None, 0, False)
    assert y.shape == (2, 8)
    with pytest.raises(AttributeError, match="has no attribute 'not_a_te_function'"):
        mod.not_a_te_function


def test_ops_with_tefl_signatures_leave_te_its_native_functions(clean_modules, monkeypatch):
    """quantize, the scaling recipes, fp8_transpose, the grouped GEMM and
    fused attention take other arguments in TE than in tefl: TE's code keeps
    its native functions for them, and they never become tefl's vendor.cuda
    backend; the ops with TE's signatures are still tefl's."""
    monkeypatch.setenv("NVTE_PLUGIN", "tefl")
    native = make_native()
    te_only = ("quantize", "dequantize", "compute_amax", "fused_amax_and_scale_update_after_reduction",
               "fp8_transpose", "te_general_grouped_gemm", "fused_attn_fwd", "fused_attn_bwd")
    for name in te_only:
        setattr(native, name, lambda *args, _n=name: ("native", _n, len(args)))
    native.gelu = lambda *args: ("native", "gelu")
    tex, _ = load_framework_extension("torch", native)
    reg = tefl.get_default_manager().registry
    for name in te_only:
        assert getattr(tex, name) is getattr(native, name), name
        assert reg.get_implementation(name, "vendor.cuda") is None, name
    # TE's own call of quantize (tensor, quantizer, output, noop) reaches the native function
    assert tex.quantize(torch.ones(2), object(), None, None) == ("native", "quantize", 4)
    # gelu has TE's signature in tefl: served by tefl, the native function is its CUDA backend
    torch.testing.assert_close(tex.gelu(torch.zeros(3), None), torch.zeros(3))
    assert reg.get_implementation("gelu", "vendor.cuda").fn is native.gelu
    assert tefl._te.TE_SIGNATURE_OPS.isdisjoint(te_only) and "rmsnorm_fwd" in tefl._te.TE_SIGNATURE_OPS


def test_ops_with_tefl_signatures_without_te_are_tefls(clean_modules):
    sys.modules.pop(STUB, None)
    sys.modules.pop(NV, None)
    mod = tefl.install_stub()
    q = mod.quantize(torch.tensor([1.0, -2.0]), torch.ones(1))  # tefl's quantize(x, scale)
    assert torch.equal(q[0].view(torch.uint8), torch.tensor([1.0, -2.0]).to(torch.float8_e4m3fn).view(torch.uint8))
