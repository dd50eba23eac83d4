"""The spec's package-level names and object behaviours, one by one."""
import asyncio
import dataclasses
import threading

import numpy as np
import pytest
import torch

import tefl
from tefl import BackendImplKind, OpImpl, OpRegistry, SelectionPolicy

SPEC_NAMES = """BackendImplKind OpImpl match_token OpRegistry SelectionPolicy PolicyManager get_policy
set_global_policy reset_global_policy policy_context policy_from_env get_policy_epoch bump_policy_epoch
with_strict_mode with_preference with_allowed_vendors with_denied_vendors PREFER_DEFAULT PREFER_VENDOR
PREFER_REFERENCE VALID_PREFER_VALUES OpManager get_default_manager reset_default_manager discover_plugin
discover_from_entry_points discover_from_env_modules get_discovered_plugin clear_discovered_plugin PLUGIN_GROUP
PLUGIN_MODULES_ENV install_stub load_plugins DType NVTE_Mask_Type NVTE_QKV_Format NVTE_Bias_Type
NVTE_Softmax_Type NVTE_Fused_Attn_Backend""".split()


def rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def fn_a(input, weight, eps=1e-5, **kw):
    return rms(input, weight, eps), torch.rsqrt(input.pow(2).mean(-1) + eps)


@pytest.mark.parametrize("name", SPEC_NAMES)
def test_every_spec_name_exists(name):
    assert hasattr(tefl, name), name
    assert name in tefl.__all__


def test_constants():
    assert BackendImplKind.DEFAULT == "flagos" and BackendImplKind.VENDOR == "vendor"
    assert BackendImplKind.REFERENCE.value == "reference"
    assert (tefl.PREFER_DEFAULT, tefl.PREFER_VENDOR, tefl.PREFER_REFERENCE) == ("flagos", "vendor", "reference")
    assert tefl.VALID_PREFER_VALUES == {"flagos", "vendor", "reference"}
    assert tefl.PLUGIN_GROUP == "te_fl.plugin" and tefl.PLUGIN_MODULES_ENV == "TE_FL_PLUGIN_MODULES"


def test_te_enums_have_transformer_engine_values():
    D = tefl.DType
    assert [D.kByte, D.kInt16, D.kInt32, D.kInt64, D.kFloat32, D.kFloat16, D.kBFloat16, D.kFloat8E4M3,
            D.kFloat8E5M2, D.kFloat8E8M0, D.kFloat4E2M1] == list(range(11))
    assert tefl.NVTE_Mask_Type.NVTE_CAUSAL_MASK == 2 and tefl.NVTE_Mask_Type.NVTE_PADDING_CAUSAL_BOTTOM_RIGHT_MASK == 5
    assert (tefl.NVTE_QKV_Format.NVTE_SBHD, tefl.NVTE_QKV_Format.NVTE_BSHD, tefl.NVTE_QKV_Format.NVTE_THD) == (0, 1, 2)
    assert tefl.NVTE_Bias_Type.NVTE_ALIBI == 3 and tefl.NVTE_Softmax_Type.NVTE_LEARNABLE_SOFTMAX == 2
    assert tefl.NVTE_Fused_Attn_Backend.NVTE_No_Backend == -1 and tefl.NVTE_Fused_Attn_Backend.NVTE_FP8 == 2


def test_opimpl_is_frozen():
    impl = OpImpl("rmsnorm_fwd", "vendor.a", BackendImplKind.VENDOR, fn_a, vendor="a")
    with pytest.raises(dataclasses.FrozenInstanceError):
        impl.priority = 5
    assert impl.is_available()


def test_vendor_impl_without_vendor_raises_value_error():
    with pytest.raises(ValueError, match="VENDOR requires vendor"):
        OpImpl("rmsnorm_fwd", "vendor.a", BackendImplKind.VENDOR, fn_a)


def test_opimpl_kind_from_string_and_bad_kind():
    assert OpImpl("rmsnorm_fwd", "x.y", "reference", fn_a).kind is BackendImplKind.REFERENCE
    with pytest.raises(ValueError, match="kind must be one of"):
        OpImpl("rmsnorm_fwd", "x.y", "fastest", fn_a)


def test_min_arch_without_cuda_is_not_available():
    impl = OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a", min_arch=80)
    assert impl.is_available() == any(torch.cuda.get_device_capability(i) >= (8, 0)
                                      for i in range(torch.cuda.device_count()))


def test_duplicate_impl_id_raises_value_error():
    reg = OpRegistry()
    reg.register_impl(OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a"))
    with pytest.raises(ValueError, match="vendor.a"):
        reg.register_impl(OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a", priority=3))
    # the same id for another op is fine
    reg.register_impl(OpImpl("layernorm_fwd", "vendor.a", "vendor", fn_a, vendor="a"))


def test_unknown_op_raises_value_error():
    with pytest.raises(ValueError, match="no_such_op"):
        OpRegistry().register_impl(OpImpl("no_such_op", "vendor.a", "vendor", fn_a, vendor="a"))


def test_register_many_is_all_or_nothing():
    reg = OpRegistry()
    good = OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a")
    dup = OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a")
    with pytest.raises(ValueError):
        reg.register_many([good, dup])
    assert reg.get_implementations("rmsnorm_fwd") == []
    reg.register_many([good, OpImpl("rmsnorm_fwd", "reference.mine", "reference", fn_a)])
    assert [i.impl_id for i in reg.get_implementations("rmsnorm_fwd")] == ["vendor.a", "reference.mine"]


def test_registry_queries_and_clear():
    reg = OpRegistry()
    impl = OpImpl("rmsnorm_fwd", "vendor.a", "vendor", fn_a, vendor="a", priority=7)
    reg.register_impl(impl)
    assert reg.get_implementation("rmsnorm_fwd", "vendor.a") is impl  # the object registered
    assert reg.get_implementation("rmsnorm_fwd", "vendor.b") is None
    assert reg.list_operators() == ["rmsnorm_fwd"]
    snap = reg.snapshot()
    assert snap == {"rmsnorm_fwd": (impl,)}
    reg.clear()
    assert reg.list_operators() == [] and reg.snapshot() == {}
    assert snap == {"rmsnorm_fwd": (impl,)}  # a snapshot does not change


def test_native_impls_appear_as_opimpls_whose_fn_runs_them_alone(manager):
    impls = {i.impl_id: i for i in manager.registry.get_implementations("rmsnorm_fwd")}
    assert {"reference.cpp", "default.portable"} <= set(impls)
    ref = impls["reference.cpp"]
    assert ref.kind is BackendImplKind.REFERENCE and ref.origin == "builtin"
    assert manager.registry.get_implementation("rmsnorm_fwd", "reference.cpp") is ref  # stable objects
    x, w = torch.randn(5, 32), torch.randn(32)
    y, none, rsigma = ref.fn(x, w, 1e-5)
    assert none is None
    torch.testing.assert_close(y, rms(x, w), rtol=1e-5, atol=1e-5)
    assert manager.get_selected_impl_id("rmsnorm_fwd") is None  # fn bypasses the manager


def test_selection_policy_frozen_validated_and_helpers():
    p = SelectionPolicy(prefer="VENDOR", deny_vendors={"Acme "}, per_op_order={"rope_fwd": "vendor:ACME|flagos"})
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.strict = True
    assert p.prefer == "vendor"
    assert p.get_default_order() == ["vendor", "flagos", "reference"]
    assert SelectionPolicy(prefer="reference").get_default_order() == ["reference", "flagos", "vendor"]
    assert p.get_per_op_order("fused_rope_forward") == ["vendor:acme", "flagos"]
    assert p.get_per_op_order("rope_fwd") == ["vendor:acme", "flagos"]
    assert p.get_per_op_order("rmsnorm_fwd") is None
    assert not p.is_vendor_allowed("ACME") and p.is_vendor_allowed("nvidia")
    q = SelectionPolicy.from_dict("vendor", False, {"rope_fwd": ["vendor:acme", "flagos"]}, {"acme"}, None)
    assert q == p and q.fingerprint() == p.fingerprint()
    assert SelectionPolicy().fingerprint() != p.fingerprint()
    with pytest.raises(ValueError, match="prefer"):
        SelectionPolicy(prefer="fastest")
    with pytest.raises(ValueError):
        SelectionPolicy(per_op_order={"rmsnorm_fwd": "vendor:"})


def test_selection_policy_refuses_strings_for_bools_and_vendor_sets():
    # "false" is a truthy string, and a bare vendor string would be read letter by letter ({'a', 'c', 'm', 'e'}).
    for bad in ("false", "0", 2, None):
        with pytest.raises(TypeError, match=r"SelectionPolicy: strict expects a bool, got"):
            SelectionPolicy(strict=bad)
    assert SelectionPolicy(strict=1).strict is True and SelectionPolicy(strict=False).strict is False
    for field in ("deny_vendors", "allow_vendors"):
        with pytest.raises(TypeError, match=rf"SelectionPolicy: {field} expects a collection of vendor names, got "
                                            r"the string 'acme' \(write \{'acme'\} for one vendor\)"):
            SelectionPolicy(**{field: "acme"})
        with pytest.raises(TypeError, match=rf"SelectionPolicy: {field} expects vendor names \(str\), got 1"):
            SelectionPolicy(**{field: [1]})
    with pytest.raises(TypeError, match="deny_vendors expects a collection"):
        SelectionPolicy.from_dict(deny_vendors="acme")
    assert not SelectionPolicy(deny_vendors=["Acme"]).is_vendor_allowed("acme")
    assert SelectionPolicy(allow_vendors=("acme",)).is_vendor_allowed("acme")


def test_allow_and_deny_vendors_deny_beats_allow():
    p = SelectionPolicy(allow_vendors={"a", "B"}, deny_vendors={"b"})
    assert p.is_vendor_allowed("A") and not p.is_vendor_allowed("b") and not p.is_vendor_allowed("c")


def test_match_token():
    v = OpImpl("rmsnorm_fwd", "vendor.acme", "vendor", fn_a, vendor="Acme")
    d = OpImpl("rmsnorm_fwd", "default.x", "flagos", fn_a)
    assert tefl.match_token(v, "vendor") and tefl.match_token(v, "vendor:acme") and tefl.match_token(v, "VENDOR:ACME")
    assert tefl.match_token(v, "impl:vendor.acme") and not tefl.match_token(v, "flagos")
    assert tefl.match_token(d, "flagos") and not tefl.match_token(d, "vendor:acme")
    with pytest.raises(ValueError, match="invalid policy token"):
        tefl.match_token(v, "bogus")


def test_global_policy_and_epoch():
    e0 = tefl.get_policy_epoch()
    prev = tefl.set_global_policy(SelectionPolicy(prefer="reference"))
    assert prev.prefer == "flagos"
    assert tefl.get_policy().prefer == "reference"
    assert tefl.get_policy_epoch() > e0
    e1 = tefl.bump_policy_epoch()
    assert e1 == tefl.get_policy_epoch() and e1 > e0
    tefl.reset_global_policy()
    assert tefl.get_policy().prefer == "flagos"
    assert tefl.PolicyManager.get_instance().get_policy() == tefl.get_policy()


def test_global_policy_selects(manager):
    x, w = torch.randn(3, 16), torch.randn(16)
    tefl.set_global_policy(SelectionPolicy(prefer="reference"))
    manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "reference.cpp"
    tefl.reset_global_policy()
    manager.call("rmsnorm_fwd", x, w)
    assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"


def test_policy_context_nests_and_restores(manager):
    x, w = torch.randn(3, 16), torch.randn(16)
    with tefl.policy_context(SelectionPolicy(prefer="reference")) as p:
        assert tefl.get_policy() is p
        manager.call("rmsnorm_fwd", x, w)
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "reference.cpp"
        with tefl.with_preference("flagos"):
            manager.call("rmsnorm_fwd", x, w)
            assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        manager.call("rmsnorm_fwd", x, w)
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "reference.cpp"
    assert tefl.get_policy().prefer == "flagos"


def test_policy_context_is_per_thread(manager):
    x, w = torch.randn(3, 16), torch.randn(16)
    seen = {}
    inside, release = threading.Event(), threading.Event()

    def other():
        inside.wait()
        seen["policy"] = tefl.get_policy().prefer
        manager.call("rmsnorm_fwd", x, w)
        seen["impl"] = manager.get_selected_impl_id("rmsnorm_fwd")
        release.set()

    t = threading.Thread(target=other)
    t.start()
    with tefl.with_preference("reference"):
        inside.set()
        release.wait(10)
        assert tefl.get_policy().prefer == "reference"
    t.join()
    assert seen == {"policy": "flagos", "impl": "default.portable"}


def test_policy_context_is_per_asyncio_task(manager):
    x, w = torch.randn(3, 16), torch.randn(16)

    async def task(prefer, gate_in, gate_out):
        with tefl.with_preference(prefer):
            gate_in.set()
            await gate_out.wait()  # the other task runs inside its own context meanwhile
            y = manager.call("rmsnorm_fwd", x, w)
            return tefl.get_policy().prefer, manager.get_selected_impl_id("rmsnorm_fwd"), y

    async def main():
        a_in, b_in = asyncio.Event(), asyncio.Event()
        ta = asyncio.create_task(task("reference", a_in, b_in))
        tb = asyncio.create_task(task("flagos", b_in, a_in))
        return await ta, await tb

    (pa, ia, _), (pb, ib, _) = asyncio.run(main())
    assert (pa, ia) == ("reference", "reference.cpp")
    assert (pb, ib) == ("flagos", "default.portable")


def test_with_vendor_helpers(manager):
    calls = []

    def mine(input, weight, eps=1e-5, **kw):
        calls.append(1)
        return fn_a(input, weight, eps)

    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.acme", "vendor", mine, vendor="Acme"))
    x, w = torch.randn(2, 8), torch.randn(8)
    with tefl.with_preference("vendor"):
        manager.call("rmsnorm_fwd", x, w)
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.acme"
        with tefl.with_denied_vendors("ACME"):
            manager.call("rmsnorm_fwd", x, w)
            assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        with tefl.with_allowed_vendors("nvidia"):
            manager.call("rmsnorm_fwd", x, w)
            assert manager.get_selected_impl_id("rmsnorm_fwd") == "default.portable"
        with tefl.with_allowed_vendors("acme,nvidia"):
            manager.call("rmsnorm_fwd", x, w)
            assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.acme"
    assert len(calls) == 2


def test_with_strict_mode_sets_strict():
    with tefl.with_strict_mode():
        assert tefl.get_policy().strict
    assert not tefl.get_policy().strict


def test_policy_from_env(monkeypatch, capfd):
    monkeypatch.setenv("TE_FL_PREFER", "vendor")
    monkeypatch.setenv("TE_FL_DENY_VENDORS", "Acme, b")
    monkeypatch.setenv("TE_FL_PER_OP", "rmsnorm_fwd=vendor:acme|reference;bogus_op=flagos")
    p = tefl.policy_from_env()
    assert p.prefer == "vendor" and p.deny_vendors == {"acme", "b"}
    assert p.get_per_op_order("rmsnorm_fwd") == ["vendor:acme", "reference"]
    assert "bogus_op" in capfd.readouterr().err  # malformed entries are reported, not fatal


def test_resolve_and_resolve_candidates(manager):
    ids = [i.impl_id for i in manager.resolve_candidates("rmsnorm_fwd")]
    assert ids == ["default.portable", "reference.cpp"]
    with tefl.with_preference("reference"):
        assert [i.impl_id for i in manager.resolve_candidates("rmsnorm_fwd")][0] == "reference.cpp"
        x, w = torch.randn(2, 8), torch.randn(8)
        y, _, _ = manager.resolve("rmsnorm_fwd")(x, w)
        torch.testing.assert_close(y, rms(x, w))


def test_register_impl_id_must_be_kind_dot_name(manager):
    for impl_id, kind in (("mine.fast", "vendor"), ("default.fast", "vendor"), ("vendor.a b", "vendor"),
                          ("vendor.", "vendor"), ("vendor.x", "reference")):
        with pytest.raises(ValueError, match=f"impl_id must be '{kind}.NAME' for kind {kind}"):
            manager.registry.register_impl(OpImpl("rmsnorm_fwd", impl_id, kind, fn_a, vendor="mine"))
    assert [i.impl_id for i in manager.resolve_candidates("rmsnorm_fwd")] == ["default.portable", "reference.cpp"]
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.mine_v2", "vendor", fn_a, vendor="mine"))


def test_priority_orders_within_a_token(manager):
    for i, prio in enumerate((10, 300, 200)):
        manager.registry.register_impl(OpImpl("rmsnorm_fwd", f"vendor.v{i}", "vendor", fn_a, vendor=f"v{i}",
                                              priority=prio))
    with tefl.with_preference("vendor"):
        assert [i.impl_id for i in manager.resolve_candidates("rmsnorm_fwd")][:3] == ["vendor.v1", "vendor.v2",
                                                                                      "vendor.v0"]
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
        assert manager.get_selected_impl_id("rmsnorm_fwd") == "vendor.v1"


def test_explain_names_every_candidate_and_why(manager):
    manager.registry.register_impl(OpImpl("rmsnorm_fwd", "vendor.f16only", "vendor", fn_a, vendor="x",
                                          supported_dtypes={torch.float16}))
    with tefl.with_preference("vendor"):
        r = manager.explain("rmsnorm_fwd", torch.randn(2, 8), torch.randn(8))
    assert r["chain"] == ["default.portable", "reference.cpp"]
    reasons = {c["impl_id"]: c["reason"] for c in r["candidates"]}
    assert "supported_dtypes {float16} does not include float32" in reasons["vendor.f16only"]


def test_default_manager_is_libtefl_default_and_reset():
    m = tefl.get_default_manager()
    assert m is tefl.get_default_manager()
    y, _, _ = tefl.rmsnorm_fwd(torch.randn(2, 8), torch.ones(8))
    assert y.shape == (2, 8)
    assert tefl.call("rmsnorm_fwd", np.ones((2, 8), np.float32), np.ones(8, np.float32))[0].shape == (2, 8)


def test_ops_are_package_functions_with_te_signatures():
    import inspect

    params = list(inspect.signature(tefl.rmsnorm_fwd).parameters)
    assert params[:8] == ["input", "weight", "eps", "ln_out", "quantizer", "otype", "sm_margin",
                          "zero_centered_gamma"]
    params = list(inspect.signature(tefl.layernorm_bwd).parameters)
    assert params[:7] == ["dz", "x", "mu", "rsigma", "gamma", "sm_margin", "zero_centered_gamma"]
    for op in ("scaled_softmax_backward", "scaled_masked_softmax_backward",
               "scaled_upper_triang_masked_softmax_backward", "scaled_aligned_causal_masked_softmax_backward"):
        assert list(inspect.signature(getattr(tefl, op)).parameters)[:3] == [  # python-api.md's names
            "output_grad", "softmax_results", "scale_factor"], op
    assert set(tefl.ops()) <= set(dir(tefl))
    with pytest.raises(AttributeError):
        tefl.no_such_op


def test_reset_default_manager_builds_a_fresh_pair(monkeypatch):
    import tefl.core as core

    monkeypatch.setattr(core, "_default_manager", core._default_manager)  # restored after the test
    monkeypatch.setattr(core, "_default_is_core", core._default_is_core)
    first = tefl.get_default_manager()
    first.registry.register_impl(OpImpl("layernorm_bwd", "vendor.only_in_first", "vendor", fn_a, vendor="x")) \
        if first.registry.get_implementation("layernorm_bwd", "vendor.only_in_first") is None else None
    tefl.reset_default_manager()
    second = tefl.get_default_manager()
    assert second is not first and second is tefl.get_default_manager()
    second.ensure_initialized()  # built-ins are registered at initialisation (the first call)
    assert second.registry.get_implementation("layernorm_bwd", "vendor.only_in_first") is None
    assert {"reference.cpp", "default.portable"} <= {i.impl_id for i in
                                                     second.registry.get_implementations("layernorm_bwd")}
    y, _, _ = tefl.rmsnorm_fwd(torch.randn(2, 8), torch.ones(8))  # module functions follow the new default
    assert second.get_selected_impl_id("rmsnorm_fwd") == "default.portable"


def test_an_output_given_twice_must_be_one_tensor():
    x, w = torch.randn(2, 8), torch.randn(8)
    a, b, r = torch.empty(2, 8), torch.empty(2, 8), torch.empty(2)
    with pytest.raises(ValueError, match=r"rmsnorm_fwd: output 0 is given twice, as ln_out= and as out\[0\]"):
        tefl.rmsnorm_fwd(x, w, ln_out=a, out=(b, r))
    y, _, rs = tefl.rmsnorm_fwd(x, w, ln_out=a, out=(a, r))  # the same tensor twice is fine
    assert y is a and rs is r
    y, _, rs = tefl.rmsnorm_fwd(x, w, ln_out=a, out=(None, r))
    assert y is a and rs is r


def test_an_output_that_requires_grad_is_written_only_without_grad_mode():
    """tefl's writes are not recorded by autograd: a caller's output that
    requires grad is refused in grad mode (torch refuses in-place writes to
    such a leaf), before anything is written; under no_grad it is written."""
    x = torch.randn(4, 16)
    o = torch.zeros(4, 16, requires_grad=True)
    with pytest.raises(ValueError, match=r"^gelu: argument 'out' \(output 'output'\): a tensor that requires grad "
                                         r"cannot be written while grad mode is on"):
        tefl.gelu(x, None, out=o)
    assert torch.count_nonzero(o) == 0
    h = torch.zeros(4, 16, requires_grad=True) * 1  # a non-leaf: its graph would keep the zeros
    with pytest.raises(ValueError, match=r"^rmsnorm_fwd: argument 'ln_out': a tensor that requires grad"):
        tefl.rmsnorm_fwd(x, torch.ones(16), 1e-5, h, None, None, 0, False)
    with torch.no_grad():
        tefl.gelu(x, None, out=o)
    torch.testing.assert_close(o.detach(), torch.nn.functional.gelu(x, approximate="tanh"))


def test_a_tensor_without_data_is_refused_naming_the_op_and_argument():
    with pytest.raises(ValueError, match=r"gelu: argument 'input' \(input 0\): cannot read this torch.Tensor on "
                                         r"device 'meta' through DLPack: [^\n]*meta[^\n]*$"):
        tefl.gelu(torch.empty(2, 4, device="meta"), None)
