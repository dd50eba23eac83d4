"""Every catalogue op from Python against the C++ reference (reference.cpp,
run alone through its OpImpl.fn), on torch and numpy inputs; independent
torch oracles for the normalization family; outputs of the caller's kind."""
import inspect

import numpy as np
import pytest
import torch

import tefl
from tefl._ops import SCHEMAS, SIGNATURES
from opgen import as_np, has_fp8, make_call

TOL = {"float32": 2e-4, "float16": 4e-3, "bfloat16": 3e-2}
OPS = sorted(s["name"] for s in SCHEMAS)


def _outputs(r):
    return [o for o in (r if isinstance(r, tuple) else (r,))]


def _compare(a, b, dtype, what):
    assert len(a) == len(b), what
    for x, y in zip(a, b):
        assert (x is None) == (y is None), what
        if x is None:
            continue
        if "float8" in str(x.dtype):  # neighbouring FP8 codes (the fused maths round differently)
            np.testing.assert_allclose(as_np(x), as_np(y), rtol=0.26, atol=1e-2, err_msg=what)
            continue
        np.testing.assert_allclose(as_np(x), as_np(y), rtol=TOL[dtype], atol=TOL[dtype], err_msg=what)


@pytest.mark.parametrize("lib", ["torch", "numpy"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("op", OPS)
def test_op_matches_reference(manager, op, dtype, lib):
    schema = tefl._ops.BY_NAME[op]
    if lib == "numpy" and dtype == "bfloat16":
        pytest.skip("numpy has no bfloat16")
    if lib == "numpy" and has_fp8(schema):
        pytest.skip("numpy has no float8 dtypes")
    impls = {i.impl_id: i for i in manager.registry.get_implementations(op)}
    if "reference.cpp" not in impls:
        pytest.skip(f"{op}: no reference.cpp implementation registered in this build")
    if not any(dtype in a["dtypes"] for a in schema["inputs"]):
        pytest.skip(f"{op} takes no {dtype} input")
    kw, _ = make_call(schema, dtype, lib)
    ref = _outputs(impls["reference.cpp"].fn(**kw))
    kind = np.ndarray if lib == "numpy" else torch.Tensor
    assert all(o is None or isinstance(o, kind) for o in ref)
    for impl_id, impl in impls.items():
        if impl_id != "reference.cpp":
            _compare(_outputs(impl.fn(**kw)), ref, dtype, f"{op} {impl_id} vs reference.cpp ({dtype}, {lib})")
    got = _outputs(manager.call(op, **kw))
    assert all(o is None or isinstance(o, kind) for o in got)
    _compare(got, ref, dtype, f"{op} via manager ({manager.get_selected_impl_id(op)}) vs reference.cpp")
    with tefl.policy_context(tefl.SelectionPolicy(prefer="reference")):
        _compare(_outputs(manager.call(op, **kw)), ref, dtype, f"{op} prefer=reference")
        assert manager.get_selected_impl_id(op) == "reference.cpp"


def test_every_op_has_a_python_function_and_a_generated_signature():
    for op in OPS:
        f = getattr(tefl, op)
        assert callable(f) and f.__doc__.startswith(op)
        assert SIGNATURES[op].params


# ---- independent oracles (torch) ----------------------------------------------------

def test_rmsnorm_fwd_vs_torch_and_zero_centered_gamma(manager):
    x, w = torch.randn(4, 3, 64), torch.randn(64)
    y, none, rs = manager.call("rmsnorm_fwd", x, w, 1e-5, None, None, None, 0, False)
    ref_rs = torch.rsqrt(x.pow(2).mean(-1) + 1e-5)
    torch.testing.assert_close(y, x * ref_rs[..., None] * w, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(rs, ref_rs.reshape(-1))
    assert none is None and rs.dtype == torch.float32
    y1, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, None, None, None, 0, True)
    torch.testing.assert_close(y1, x * ref_rs[..., None] * (w + 1), rtol=1e-5, atol=1e-5)


def test_layernorm_fwd_bwd_vs_torch_autograd(manager):
    x = torch.randn(6, 48, requires_grad=True)
    g = torch.randn(48, requires_grad=True)
    b = torch.randn(48, requires_grad=True)
    ref = torch.nn.functional.layer_norm(x, (48,), g, b, 1e-5)
    dz = torch.randn(6, 48)
    ref.backward(dz)
    with torch.no_grad():
        y, mu, rs = manager.call("layernorm_fwd", x, g, b, 1e-5, None, None, None, 0, False)
        torch.testing.assert_close(y, ref.detach(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(mu, x.mean(-1))
        dx, dg, db = manager.call("layernorm_bwd", dz, x, mu, rs, g, 0, False)
    torch.testing.assert_close(dx, x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dg, g.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(db, b.grad, rtol=1e-4, atol=1e-4)


def test_rmsnorm_bwd_vs_torch_autograd(manager):
    x = torch.randn(5, 40, requires_grad=True)
    g = torch.randn(40, requires_grad=True)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * g
    dz = torch.randn(5, 40)
    ref.backward(dz)
    with torch.no_grad():
        _, _, rs = manager.call("rmsnorm_fwd", x, g)
        dx, dg = manager.call("rmsnorm_bwd", dz, x, rs, g)
    torch.testing.assert_close(dx, x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(dg, g.grad, rtol=1e-4, atol=1e-4)


def test_otype_and_ln_out(manager):
    x, w = torch.randn(4, 32), torch.randn(32)
    y, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, None, None, tefl.DType.kBFloat16, 0, False)
    assert y.dtype == torch.bfloat16
    y2, _, _ = manager.call("rmsnorm_fwd", x, w, otype=torch.float16)
    assert y2.dtype == torch.float16

    class DType:  # stands for TransformerEngine's pybind11 enum (int-convertible, not an int)
        def __init__(self, v):
            self.v = v

        def __int__(self):
            return self.v

    y4, _, _ = manager.call("rmsnorm_fwd", x, w, otype=DType(6))
    assert y4.dtype == torch.bfloat16
    buf = torch.empty(4, 32)
    y3, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, buf)
    assert y3 is buf  # written in place: zero-copy output
    torch.testing.assert_close(buf, y.float(), rtol=2e-2, atol=2e-2)


def test_quantizer_runs_the_fused_fp8_variant(manager):
    x, w = torch.randn(6, 32), torch.rand(32) + 0.5
    q = tefl.Float8Quantizer(scale=torch.tensor([8.0]), amax=torch.zeros(1))
    y, none, rsigma = manager.call("rmsnorm_fwd", x, w, 1e-5, None, q)
    plain, _, rsigma_ref = manager.call("rmsnorm_fwd", x, w, 1e-5)
    assert isinstance(y, tefl.Float8Tensor) and y._data.dtype == torch.float8_e4m3fn and none is None
    assert manager.get_selected_impl_id("rmsnorm_fwd_fp8")
    torch.testing.assert_close(rsigma, rsigma_ref)
    torch.testing.assert_close(q.amax, plain.abs().max().reshape(1))
    torch.testing.assert_close(y._scale_inv, torch.tensor([0.125]))
    torch.testing.assert_close(y._data.float(), (plain * 8).to(torch.float8_e4m3fn).float(), rtol=0.13, atol=0)
    # E5M2 through the quantizer's dtype, a gated activation
    q5 = tefl.Float8Quantizer(torch.tensor([1.0]), torch.zeros(1), tefl.DType.kFloat8E5M2)
    u = torch.randn(4, 16)
    out = manager.call("swiglu", u, q5)
    assert out._data.dtype == torch.float8_e5m2
    torch.testing.assert_close(out._data.float(), manager.call("swiglu", u).to(torch.float8_e5m2).float(),
                               rtol=0.26, atol=0)


def test_quantizer_writes_the_callers_ln_out(manager):
    # ln_out= with a quantizer was ignored (the codes went to a fresh tensor): it now receives them, as a
    # Float8Tensor (scale_inv too) or a tensor of the quantizer's FP8 dtype, and anything else is an error.
    x, w = torch.randn(6, 32), torch.rand(32) + 0.5
    q = tefl.Float8Quantizer(scale=torch.tensor([8.0]), amax=torch.zeros(1))
    fresh, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, None, q)
    codes = torch.zeros(6, 32, dtype=torch.float8_e4m3fn)
    y, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, codes, q)
    assert y._data is codes and torch.equal(codes.view(torch.uint8), fresh._data.view(torch.uint8))
    f8 = tefl.Float8Tensor(torch.zeros(6, 32, dtype=torch.float8_e4m3fn), torch.zeros(1))
    y2, _, _ = manager.call("rmsnorm_fwd", x, w, 1e-5, f8, q)
    assert y2 is f8 and torch.equal(f8._data.view(torch.uint8), fresh._data.view(torch.uint8))
    torch.testing.assert_close(f8._scale_inv, torch.tensor([0.125]))
    for bad in (torch.empty(6, 32), torch.empty(6, 32, dtype=torch.float8_e5m2)):
        with pytest.raises(ValueError, match=r"rmsnorm_fwd: argument 'ln_out': with a quantizer the output holds "
                                             r"float8_e4m3fn codes"):
            manager.call("rmsnorm_fwd", x, w, 1e-5, bad, q)
    with pytest.raises(ValueError, match=r"argument 'ln_out' \(output 0\): expected shape \[6, 32\]"):
        manager.call("rmsnorm_fwd", x, w, 1e-5, torch.empty(5, 32, dtype=torch.float8_e4m3fn), q)
    # layernorm_fwd alike; the caller's plain output without a quantizer is still written as before
    lq = tefl.Float8Quantizer(scale=torch.tensor([4.0]), amax=torch.zeros(1))
    codes = torch.zeros(6, 32, dtype=torch.float8_e4m3fn)
    z, mu, rs = manager.call("layernorm_fwd", x, w, torch.zeros(32), 1e-5, codes, lq)
    assert z._data is codes and mu.shape == (6,) and bool(codes.view(torch.uint8).any())
    plain = torch.empty(6, 32)
    assert manager.call("rmsnorm_fwd", x, w, 1e-5, plain)[0] is plain


def test_quantizer_is_rejected_clearly(manager):
    with pytest.raises(NotImplementedError, match="gelu: 'quantizer' must be None .*no fused FP8 variant"):
        manager.call("gelu", torch.randn(2, 8), object())
    with pytest.raises(TypeError, match="rmsnorm_fwd: a quantizer needs 'scale' and 'amax'"):
        manager.call("rmsnorm_fwd", torch.randn(2, 8), torch.ones(8), 1e-5, None, object())


def test_validation_errors_name_op_argument_and_expectation(manager):
    # The Python parameters' names (TE's), not the schema's ('x', 'gamma', 'z').
    with pytest.raises(ValueError, match=r"rmsnorm_fwd: argument 'weight' \(input 1\): expected shape \[16\] "
                                         r"\(H = last dim of 'input'\), got \[8\]"):
        manager.call("rmsnorm_fwd", torch.randn(2, 16), torch.ones(8))
    with pytest.raises(TypeError, match=r"rmsnorm_fwd: argument 'input' \(input 0\): expected a tensor"):
        manager.call("rmsnorm_fwd", [[1.0]], torch.ones(1))
    with pytest.raises(ValueError, match=r"rmsnorm_fwd: argument 'weight' \(input 1\): is required, got None"):
        manager.call("rmsnorm_fwd", torch.randn(2, 16), None)
    with pytest.raises(ValueError, match=r"dropout_fwd: attribute 'dropout_probability' must be in \[0, 1\), got 1.5"):
        tefl.dropout_fwd(torch.randn(4), 1.5)
    with pytest.raises(ValueError, match="eps"):
        manager.call("rmsnorm_fwd", torch.randn(2, 16), torch.ones(16), -1.0)
    with pytest.raises(TypeError, match="attribute 'sm_margin' expects an integer"):
        manager.call("rmsnorm_fwd", torch.randn(2, 16), torch.ones(16), sm_margin="x")
    with pytest.raises(KeyError, match="unknown op 'nope'"):
        manager.call("nope", torch.randn(2))
    # an op whose Python names are the schema's says None too (libtefl's message says NULL)
    x = torch.randn(10, 2, 8)
    with pytest.raises(ValueError, match=r"^fused_rope_forward: argument 'cu_seqlens' \(input 3\): is required for "
                                         r"qkv_format thd, got None$"):
        tefl.fused_rope_forward(x, torch.randn(10, 1, 1, 8), None, tefl.NVTE_QKV_Format.NVTE_THD)


def test_none_for_an_attribute_is_a_type_error(manager):
    # TE raises TypeError for None where a number is expected; a silent default
    # (scale 1.0) would hide the caller's bug. Leaving the argument out is the default.
    x = torch.randn(2, 2, 4, 8)
    with pytest.raises(TypeError, match=r"scaled_softmax_forward: argument 'scale' expects a number, got None "
                                        r"\(leave it out for the default, 1.0\)"):
        tefl.scaled_softmax_forward(x, None)
    with pytest.raises(TypeError, match=r"dropout_fwd: argument 'dropout_probability' expects a number, got None"):
        tefl.dropout_fwd(torch.randn(4), None)
    with pytest.raises(TypeError, match=r"rmsnorm_fwd: argument 'zero_centered_gamma' expects a bool, got None"):
        manager.call("rmsnorm_fwd", torch.randn(2, 16), torch.ones(16), zero_centered_gamma=None)
    torch.testing.assert_close(tefl.scaled_softmax_forward(x), torch.softmax(x, -1))
    # Dropout's seed and offset keep None = the next value of the generator.
    y, mask = tefl.dropout_fwd(torch.ones(64), 0.5, seed=None, offset=None)
    assert y.shape == (64,) and mask.shape == (64,)


def test_numpy_in_numpy_out_zero_copy(manager):
    x = np.random.default_rng(0).standard_normal((3, 16)).astype(np.float32)
    w = np.ones(16, np.float32)
    z = np.empty_like(x)
    y, _, rs = manager.call("rmsnorm_fwd", x, w, 1e-5, z)
    assert y is z and isinstance(rs, np.ndarray) and rs.dtype == np.float32
    np.testing.assert_allclose(y, x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5), rtol=1e-5, atol=1e-5)


def test_torch_subclasses_and_grad_tensors_go_through_dlpack(manager):
    x = torch.randn(3, 16, requires_grad=True)
    w = torch.nn.Parameter(torch.randn(16))
    y, _, rs = manager.call("rmsnorm_fwd", x, w)  # no copy: TE passes such tensors under no_grad
    ref = x.detach() * torch.rsqrt(x.detach().pow(2).mean(-1, keepdim=True) + 1e-5) * w.detach()
    torch.testing.assert_close(y, ref)
    assert not y.requires_grad
    view = torch.randn(6, 16)[::2]  # rows strided: not compact, rejected with the strides named
    with pytest.raises(ValueError, match=r"strides \[32, 1\]"):
        manager.call("rmsnorm_fwd", view, w)


def test_dropout_seed_and_offset_must_fit_uint64(manager):
    if not manager.registry.get_implementations("dropout_fwd"):
        pytest.skip("no dropout_fwd implementation in this build")
    x = torch.ones(256)
    # Wrapping modulo 2^64 would alias seeds: 2^64 gave seed 0's mask, -1 gave 2^64 - 1's.
    for kw, bad in (({"seed": 2**64}, "seed"), ({"seed": -1}, "seed"), ({"seed": 2**200}, "seed"),
                    ({"seed": 1, "offset": 2**64}, "offset"), ({"seed": 1, "offset": -3}, "offset")):
        with pytest.raises(ValueError, match=rf"dropout_fwd: attribute '{bad}' = -?\d+ is out of the uint64 range"):
            manager.call("dropout_fwd", x, 0.5, **kw)
    with pytest.raises(TypeError, match=r"dropout_fwd: attribute 'seed' expects an integer, got float"):
        manager.call("dropout_fwd", x, 0.5, seed=1.5)
    # The whole range, and integers of other types (__index__), are accepted.
    top = manager.call("dropout_fwd", x, 0.5, seed=2**64 - 1, offset=2**64 - 1)[1]
    assert not torch.equal(top, manager.call("dropout_fwd", x, 0.5, seed=0, offset=0)[1])
    m = manager.call("dropout_fwd", x, 0.5, seed=np.uint64(2**63 + 5), offset=np.int64(3))[1]
    assert torch.equal(m, manager.call("dropout_fwd", x, 0.5, seed=2**63 + 5, offset=3)[1])


def test_qkv_rope_forward_allocates_te_shapes(manager):
    if not manager.registry.get_implementations("fused_qkv_rope_forward"):
        pytest.skip("no fused_qkv_rope_forward implementation in this build")
    # Head dim d = k_split = 8 (TE: qkv_split_arg_list[1]); a rotary dim of 4 rotates half of each head.
    gen = torch.Generator().manual_seed(3)
    qkv = torch.randn(6, 2, 3, 32, generator=gen)
    f = torch.rand(6, 1, 1, 4, generator=gen) * 6.28
    q, k, v = manager.call("fused_qkv_rope_forward", qkv, f, f, None, [16, 8, 8])
    assert (q.shape, k.shape, v.shape) == ((6, 2, 6, 8), (6, 2, 3, 8), (6, 2, 3, 8))
    outs = [torch.empty(6, 2, 6, 8), torch.empty(6, 2, 3, 8), torch.empty(6, 2, 3, 8)]
    manager.call("fused_qkv_rope_forward", qkv, f, f, None, [16, 8, 8], out=tuple(outs))
    for got, want in zip((q, k, v), outs):
        assert torch.equal(got, want)
    # q head j of group g is qkv[..., g, 8 j: 8 j + 8]: its first 4 rotated (non-interleaved halves), the rest copied.
    x = qkv[:, :, :, :16].reshape(6, 2, 6, 8)
    cos, sin = f.cos(), f.sin()
    rot = torch.cat([-x[..., 2:4], x[..., 0:2]], dim=-1)
    torch.testing.assert_close(q[..., :4], x[..., :4] * cos + rot * sin)
    assert torch.equal(q[..., 4:], x[..., 4:])
    assert torch.equal(v, qkv[:, :, :, 24:].reshape(6, 2, 3, 8))


def test_qkv_rope_forward_bad_split_named_before_allocation(manager):
    if not manager.registry.get_implementations("fused_qkv_rope_forward"):
        pytest.skip("no fused_qkv_rope_forward implementation in this build")
    qkv = torch.randn(6, 2, 3, 32)
    f = torch.randn(6, 1, 1, 8)
    cases = [([-8, 24, 16], r"attribute 'q_split' must be in \[1, 2147483647\], got -8"),
             ([2**40, 8, 8], r"attribute 'q_split' must be in \[1, 2147483647\], got 1099511627776"),
             ([8, 8, 8], r"argument 'qkv_input' \(input 0\): expected last dim q_split \+ k_split \+ v_split = 24"),
             ([12, 8, 12], r"attribute 'q_split' = 12 must be a multiple of the head dim d = k_split = 8")]
    for split, msg in cases:
        with pytest.raises(ValueError, match=r"fused_qkv_rope_forward: " + msg):
            manager.call("fused_qkv_rope_forward", qkv, f, f, None, split)


def test_out_tuple_of_the_wrong_length_names_the_op_and_order(manager):
    x = torch.randn(3, 6)
    with pytest.raises(ValueError, match=r"^dbias_dgelu: out= expects a tuple of 2 tensors \(or None entries\) in "
                                         r"the order \(dinput, dbias\), got 1 entries$"):
        manager.call("dbias_dgelu", x, x, out=(torch.empty(3, 6),))
    with pytest.raises(ValueError, match=r"^rmsnorm_fwd: out= expects a tuple of 2 tensors .* got Tensor$"):
        manager.call("rmsnorm_fwd", x, torch.ones(6), out=torch.empty(3, 6))


def test_wrong_rank_named_when_outputs_cannot_be_allocated(manager):
    # The outputs' shapes come from amax_history [len, n]: a 1-D history is named, not an IndexError.
    with pytest.raises(ValueError, match=r"^fused_amax_and_scale_update_after_reduction: argument 'amax_history' "
                                         r"\(input 0\): expected rank 2 \[len, n\], got shape \[3\]$"):
        manager.call("fused_amax_and_scale_update_after_reduction", torch.ones(3), torch.ones(3))


def test_bad_otype_names_the_op_and_argument(manager):
    x, w = torch.randn(4, 32), torch.ones(32)
    for bad in (99, "nope"):
        with pytest.raises(ValueError, match=r"^rmsnorm_fwd: argument 'otype' expects a tefl.DType, a torch/numpy "
                                             r"dtype or a dtype name \(.*\), got " + repr(bad) + "$"):
            tefl.rmsnorm_fwd(x, w, 1e-5, otype=bad)
    y = tefl.rmsnorm_fwd(x, w, 1e-5, otype=torch.bfloat16)[0]  # the valid forms still work
    assert y.dtype == torch.bfloat16


def test_an_otype_the_output_cannot_take_is_otypes_error(manager):
    """The caller passed otype, not the output: the error names otype and
    the output's dtypes (an FP8 otype: the quantizer makes FP8 outputs)."""
    x, w = torch.randn(4, 32), torch.ones(32)
    with pytest.raises(ValueError, match=r"^rmsnorm_fwd: argument 'otype' expects one of float32, float16, "
                                         r"bfloat16, got int32$"):
        tefl.rmsnorm_fwd(x, w, 1e-5, None, None, tefl.DType.kInt32, 0, False)
    with pytest.raises(ValueError, match=r"^layernorm_fwd: argument 'otype' expects one of float32, float16, "
                                         r"bfloat16, got float8_e4m3fn \(an FP8 output comes from a Float8Quantizer "
                                         r"passed as 'quantizer'\)$"):
        tefl.layernorm_fwd(x, w, torch.zeros(32), 1e-5, None, None, tefl.DType.kFloat8E4M3, 0, False)
    # with a quantizer, otype is the FP8 tensor's nominal dtype (as in TE) and not checked against the codes
    q = tefl.Float8Quantizer(torch.ones(1), torch.zeros(1), tefl.DType.kFloat8E4M3)
    assert isinstance(tefl.rmsnorm_fwd(x, w, 1e-5, None, q, tefl.DType.kBFloat16, 0, False)[0], tefl.Float8Tensor)


def test_dropout_default_generator(manager):
    if "dropout_fwd" not in tefl.ops() or not manager.registry.get_implementations("dropout_fwd"):
        pytest.skip("no dropout_fwd implementation in this build")
    x = torch.ones(64, 64)
    torch.manual_seed(5)
    y1, m1 = manager.call("dropout_fwd", x, 0.5)
    y2, m2 = manager.call("dropout_fwd", x, 0.5)
    assert not torch.equal(m1, m2)  # the offset advances between calls
    torch.manual_seed(5)
    y3, m3 = manager.call("dropout_fwd", x, 0.5)
    assert torch.equal(m1, m3) and torch.equal(y1, y3)  # torch.manual_seed makes it reproducible
    assert 0.4 < m1.float().mean().item() < 0.6
    torch.testing.assert_close(y1, m1.float() * 2)
    y4, m4 = manager.call("dropout_fwd", x, 0.5, seed=11, offset=3)
    y5, m5 = manager.call("dropout_fwd", x, 0.5, seed=11, offset=3)
    assert torch.equal(m4, m5)
    (dx,) = (manager.call("dropout_bwd", torch.ones(64, 64), m1, 0.5),)
    torch.testing.assert_close(dx, m1.float() * 2)
    # TE's signature: the backward reads the mask, so it has no seed or offset.
    assert list(inspect.signature(tefl.dropout_bwd).parameters) == [
        "grad_output", "mask", "dropout_probability", "grad_input"]
