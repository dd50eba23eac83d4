"""TransformerEngine's conventions on tefl's GEMM, FP8 and attention ops:
generic_gemm's column-major statement (fprop TN, dgrad NN, wgrad NT with the
bias gradient), FP8 operands and outputs, get_attention_backend and the
FlashAttention module (forward and autograd backward) against torch."""
import math

import pytest
import torch

import tefl


def gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(0.7978845608 * (x + 0.044715 * x ** 3)))


def close(a, b, tol=1e-4):
    torch.testing.assert_close(a.to(torch.float64), b.to(torch.float64), rtol=tol, atol=tol)


# ---- generic_gemm -------------------------------------------------------------------

def test_fprop_tn_with_bias_and_gelu():
    g = torch.Generator().manual_seed(0)
    x, w, b = torch.randn(9, 16, generator=g), torch.randn(12, 16, generator=g), torch.randn(12, generator=g)
    out, bias_grad, pre, extra = tefl.generic_gemm(w, True, x, False, None, None, None, b, None, True)
    assert bias_grad is None and extra is None and out.shape == (9, 12)
    close(pre, x @ w.T + b)
    close(out, gelu_tanh(x @ w.T + b))


def test_dgrad_nn_and_wgrad_nt_with_bias_gradient():
    g = torch.Generator().manual_seed(1)
    x, w, dy = torch.randn(9, 16, generator=g), torch.randn(12, 16, generator=g), torch.randn(9, 12, generator=g)
    dx, *_ = tefl.generic_gemm(w, False, dy, False)
    close(dx, dy @ w)
    dw, bias_grad, _, _ = tefl.generic_gemm(x, False, dy, True, grad=True, bias=torch.empty(12))
    close(dw, dy.T @ x)
    close(bias_grad, dy.sum(0))


def dgelu_tanh(x):
    t = torch.tanh(0.79788456 * x * (1 + 0.044715 * x * x))
    return 0.5 * x * (1 - t * t) * (0.79788456 + 0.1070322243 * x * x) + 0.5 * (1 + t)


def test_dgelu_epilogue_gelu_with_grad():
    # TE's LayerNormMLP backward: fc2 dgrad "NN" with gelu=True, grad=True, gelu_in = fc1's pre-GELU output
    g = torch.Generator().manual_seed(5)
    dy, w2, h = torch.randn(9, 12, generator=g), torch.randn(12, 16, generator=g), torch.randn(9, 16, generator=g)
    out, bias_grad, pre, _ = tefl.generic_gemm(w2, False, dy, False, gelu=True, gelu_in=h, grad=True,
                                               bias=torch.empty(16))
    want = (dy @ w2) * dgelu_tanh(h)
    assert pre is h and out.shape == (9, 16) and bias_grad.shape == (16,)
    close(out, want)
    close(bias_grad, want.sum(0))
    with pytest.raises(ValueError, match="gelu_in"):
        tefl.generic_gemm(w2, False, dy, False, gelu=True, grad=True)
    # the row-major op checks the pre-GELU input's shape before writing anything
    d = torch.full((9, 16), 7.0)
    with pytest.raises(Exception, match="pre_gelu_out"):
        tefl.call("generic_gemm", dy, w2, gelu=True, grad=True, beta=0.0, out=(d, torch.empty(16, 9), None, None))
    assert bool((d == 7.0).all())


def test_grouped_gemm_wgrad_fp8_and_dgelu():
    g = torch.Generator().manual_seed(6)
    splits = [3, 0, 5]
    x, dy = torch.randn(8, 6, generator=g), torch.randn(8, 4, generator=g)
    m_splits = torch.tensor(splits, dtype=torch.int64)
    # wgrad "NT" per expert: dW_g = dy_g^T x_g, grad_bias_g = dy_g.sum(0): transa, m_splits splits K
    dw = torch.full((3, 4, 6), 5.0)
    bgrad = torch.full((3, 4), 5.0)
    tefl.call("te_general_grouped_gemm", dy, x, m_splits, transa=True, grad=True, beta=0.0,
              out=(dw, None, bgrad, None))
    for i, (dyg, xg) in enumerate(zip(dy.split(splits), x.split(splits))):
        close(dw[i], dyg.T @ xg)
        close(bgrad[i], dyg.sum(0))
    # fprop with FP8 operands, one scale_inv per expert
    w = torch.randn(3, 4, 6, generator=g)
    qx, _, sx = tefl.quantize(x, torch.tensor([32.0]))
    qws = [tefl.quantize(w[i], torch.tensor([16.0 * (i + 1)])) for i in range(3)]
    qw = torch.stack([q for q, _, _ in qws])
    sw = torch.cat([s for _, _, s in qws])
    y = torch.full((8, 4), 5.0)
    tefl.call("te_general_grouped_gemm", qx, qw, m_splits, a_scale_inv=sx, b_scale_inv=sw, transb=True, beta=0.0,
              out=(y, None, None, None))
    want = torch.cat([(qx.float() * sx).split(splits)[i] @ (qw[i].float() * sw[i]).T for i in range(3)])
    close(y, want)
    # DGELU per group: D_g = (A_g B_g) * gelu'(pre_g), bias_grad [G, N]
    h = torch.randn(8, 4, generator=g)
    d = torch.empty(8, 4)
    bg = torch.empty(3, 4)
    a = torch.randn(8, 6, generator=g)
    tefl.call("te_general_grouped_gemm", a, w, m_splits, transb=True, gelu=True, grad=True, beta=0.0,
              out=(d, h, bg, None))
    for i, (ag, hg, dg) in enumerate(zip(a.split(splits), h.split(splits), d.split(splits))):
        close(dg, (ag @ w[i].T) * dgelu_tanh(hg))
        close(bg[i], ((ag @ w[i].T) * dgelu_tanh(hg)).sum(0))


def test_accumulate_adds_into_d_and_bf16_output_dtype():
    g = torch.Generator().manual_seed(2)
    x, w = torch.randn(5, 8, generator=g), torch.randn(6, 8, generator=g)
    d = torch.ones(5, 6)
    out, *_ = tefl.generic_gemm(w, True, x, False, d, accumulate=True)
    assert out is d
    close(d, x @ w.T + 1)
    with pytest.raises(ValueError, match="accumulate"):
        tefl.generic_gemm(w, True, x, False, None, accumulate=True)
    y, *_ = tefl.generic_gemm(w.bfloat16(), True, x.bfloat16(), False, output_dtype=tefl.DType.kFloat32)
    assert y.dtype == torch.float32
    close(y, x.bfloat16().float() @ w.bfloat16().float().T, 1e-3)
    # a D whose dtype contradicts output_dtype is refused, not silently preferred; D untouched
    with pytest.raises(ValueError, match=r"^generic_gemm: argument 'output_dtype' is bfloat16 but D holds float32: "
                                         r"pass a D of bfloat16, or output_dtype=None to take D's dtype$"):
        tefl.generic_gemm(w, True, x, False, d, None, tefl.DType.kBFloat16)
    close(d, x @ w.T + 1)
    out, *_ = tefl.generic_gemm(w, True, x, False, d, None, tefl.DType.kFloat32)  # agreeing: fine
    assert out is d
    close(d, x @ w.T)


def test_row_major_op_and_te_call_agree():
    # tefl's row-major op: D = op(A) op(B); TE's call swaps the operands
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(4, 7, generator=g), torch.randn(5, 7, generator=g)
    d_row, *_ = tefl.call("generic_gemm", a, b, transb=True, beta=0.0)
    d_te, *_ = tefl.generic_gemm(b, True, a, False)
    close(d_row, a @ b.T)
    close(d_te, d_row)


def test_fp8_operands_and_fp8_output():
    g = torch.Generator().manual_seed(4)
    x, w = torch.randn(16, 32, generator=g), torch.randn(24, 32, generator=g)
    scale = torch.tensor([64.0])
    qx, _, sx = tefl.quantize(x, scale)
    qw, _, sw = tefl.quantize(w, scale)
    assert qx.dtype == torch.float8_e4m3fn
    out, *_ = tefl.generic_gemm(tefl.Float8Tensor(qw, sw), True, tefl.Float8Tensor(qx, sx), False,
                                output_dtype=tefl.DType.kFloat32)
    ref = (qx.float() / 64.0) @ (qw.float() / 64.0).T  # dequantize then fp32
    close(out, ref, 1e-4)
    # float8 tensors need their scale_inv
    with pytest.raises(ValueError, match="scale_inv"):
        tefl.generic_gemm(qw, True, qx, False)
    q = tefl.Float8Quantizer(scale=torch.tensor([2.0]), amax=torch.zeros(1))
    f8, *_ = tefl.generic_gemm(tefl.Float8Tensor(qw, sw), True, tefl.Float8Tensor(qx, sx), False, quantizer=q)
    assert isinstance(f8, tefl.Float8Tensor) and f8._data.dtype == torch.float8_e4m3fn
    close(q.amax, ref.abs().max().reshape(1), 1e-4)
    close(f8.dequantize(), ref, 0.07)  # E4M3 keeps 3 mantissa bits: relative error <= 2^-4
    # A scalar (0-d) scale: quantize returns a 0-d scale_inv, which generic_gemm takes as is (and a 0-d d_amax).
    qx0, _, sx0 = tefl.quantize(x, torch.tensor(64.0))
    qw0, _, sw0 = tefl.quantize(w, torch.tensor(64.0))
    assert sx0.shape == () and torch.equal(qx0, qx)
    out0, *_ = tefl.generic_gemm(tefl.Float8Tensor(qw0, sw0), True, tefl.Float8Tensor(qx0, sx0), False,
                                 output_dtype=tefl.DType.kFloat32)
    assert torch.equal(out0, out)
    q0 = tefl.Float8Quantizer(scale=torch.tensor(2.0), amax=torch.zeros(()))
    f80, *_ = tefl.generic_gemm(tefl.Float8Tensor(qw0, sw0), True, tefl.Float8Tensor(qx0, sx0), False, quantizer=q0)
    assert torch.equal(f80._data.view(torch.uint8), f8._data.view(torch.uint8)) and q0.amax.item() == q.amax.item()
    with pytest.raises(ValueError, match=r"argument 'A_scale_inv': expected shape \[1\] or \[\] \(one fp32 scale\), "
                                         r"got \[1, 1\]"):
        tefl.generic_gemm(tefl.Float8Tensor(qw, sw.reshape(1, 1)), True, tefl.Float8Tensor(qx, sx), False)


def test_generic_gemm_takes_te_keywords_alpha_and_beta():
    # TE's general_gemm always passes comm_overlap / comm_type / extra_output / bulk_overlap by keyword.
    g = torch.Generator().manual_seed(9)
    w, x, ws = torch.randn(3, 5, generator=g), torch.randn(7, 5, generator=g), torch.empty(32)
    args = (w, True, x, False, None, None, None, None, tefl.DType.kBFloat16, False, None, False, ws, 32, False, False)
    extra = torch.zeros(2)
    out, bias_grad, pre, extra_out = tefl.generic_gemm(*args, comm_overlap=None, comm_type=None, extra_output=extra,
                                                       bulk_overlap=False)
    close(out, x @ w.T, 1e-5)
    assert bias_grad is None and pre is None and extra_out is extra
    # alpha, and beta with accumulate (D = alpha * x w^T + beta * D); beta defaults to 1 with accumulate
    d = torch.full((7, 3), 2.0)
    tefl.generic_gemm(w, True, x, False, d, None, None, None, None, False, None, False, ws, 32, True, False,
                      alpha=2.0, beta=0.5)
    close(d, 2 * (x @ w.T) + 1.0, 1e-5)
    d2 = torch.full((7, 3), 2.0)
    tefl.generic_gemm(w, True, x, False, d2, accumulate=True, alpha=-1.0)
    close(d2, 2.0 - x @ w.T, 1e-5)
    with pytest.raises(ValueError, match=r"generic_gemm: beta=0.5 without accumulate=True"):
        tefl.generic_gemm(*args, alpha=2.0, beta=0.5)
    out0, *_ = tefl.generic_gemm(*args, beta=0.0)
    close(out0, x @ w.T, 1e-5)
    with pytest.raises(NotImplementedError, match=r"generic_gemm: comm_overlap .* pass comm_overlap=None"):
        tefl.generic_gemm(*args, comm_overlap=object(), comm_type=0)


def test_te_float8_tensor_with_uint8_data_and_fp8_dtype():
    # TE's Float8Tensor keeps its codes as uint8 in _data, the format in _fp8_dtype.
    g = torch.Generator().manual_seed(10)
    wq = torch.randn(3, 5, generator=g).to(torch.float8_e5m2)
    xq = torch.randn(7, 5, generator=g).to(torch.float8_e5m2)

    def te_f8(t, fmt=tefl.DType.kFloat8E5M2):
        return tefl.Float8Tensor(t.view(torch.uint8), torch.tensor([0.5]), fmt)

    out, *_ = tefl.generic_gemm(te_f8(wq), True, te_f8(xq), False)
    close(out, 0.25 * xq.float() @ wq.float().T, 1e-6)
    assert torch.equal(te_f8(wq).dequantize(), 0.5 * wq.float())
    with pytest.raises(ValueError, match=r"generic_gemm: argument 'A': a Float8Tensor with uint8 data needs "
                                         r"_fp8_dtype DType.kFloat8E4M3 or kFloat8E5M2"):
        tefl.generic_gemm(te_f8(wq, tefl.DType.kBFloat16), True, te_f8(xq), False)
    # as the output of a fused FP8 op: the codes land in the uint8 storage
    f8 = tefl.Float8Tensor(torch.zeros(2, 8, dtype=torch.uint8), torch.zeros(1), tefl.DType.kFloat8E4M3)
    q = tefl.Float8Quantizer(torch.ones(1), torch.zeros(1))
    y = tefl.swiglu(torch.full((2, 16), 2.0), q, out=f8)
    assert y is f8 and f8._data.dtype == torch.uint8 and torch.count_nonzero(f8._data) == 16
    assert torch.equal(f8._data.view(torch.float8_e4m3fn).float(), torch.full((2, 8), 2.0 * 2.0 / (1 + math.exp(-2.0))
                                                                              ).to(torch.float8_e4m3fn).float())


def test_quantizer_amax_is_a_running_max_as_in_te():
    # TE's kernels fold each cast's max |x| into the quantizer's amax; its recipe zeroes it at each history roll.
    hist = torch.zeros(3, 1)
    q = tefl.Float8Quantizer(torch.ones(1), hist[0])
    for v, want in ((3.0, 3.0), (1.0, 3.0), (4.0, 4.0)):
        x = torch.zeros(2, 8)
        x[0, 0] = v
        tefl.generic_gemm(torch.eye(8), True, x, False, None, q)
        assert hist[0].item() == want and hist[1].item() == 0.0
    hist.zero_()
    tefl.swiglu(torch.full((2, 16), 3.0), q)
    first = hist[0].item()
    tefl.swiglu(torch.full((2, 16), 0.5), q)
    assert first > 0 and hist[0].item() == first
    tefl.swiglu(torch.full((2, 16), 4.0), q)
    assert hist[0].item() > first


def test_te_quantizers_without_a_given_scale_are_refused():
    class Float8CurrentScalingQuantizer:  # TE's class name: its scale is computed from this tensor's amax
        scale, amax, dtype = torch.ones(1), torch.zeros(1), tefl.DType.kFloat8E4M3

    with pytest.raises(NotImplementedError, match=r"swiglu: a Float8CurrentScalingQuantizer is not supported: .* "
                                                  r"not current scaling"):
        tefl.swiglu(torch.ones(2, 16), Float8CurrentScalingQuantizer())
    with pytest.raises(NotImplementedError, match=r"generic_gemm: a Float8CurrentScalingQuantizer"):
        tefl.generic_gemm(torch.eye(4), True, torch.ones(2, 4), False, None, Float8CurrentScalingQuantizer())


def test_quantize_matches_torch_cast_and_round_trips():
    x = torch.linspace(-3, 3, 101)
    q, amax, scale_inv = tefl.quantize(x, torch.tensor([100.0]))
    torch.testing.assert_close(q.float(), (x * 100).to(torch.float8_e4m3fn).float())
    assert amax.item() == 3.0 and scale_inv.item() == pytest.approx(0.01)
    back = tefl.dequantize(q, scale_inv)
    close(back, q.float() * scale_inv, 0)
    q5, _, _ = tefl.quantize(x, torch.tensor([100.0]), out=(torch.empty(101, dtype=torch.float8_e5m2), None, None))
    torch.testing.assert_close(q5.float(), (x * 100).to(torch.float8_e5m2).float())


# ---- attention ----------------------------------------------------------------------

def test_get_attention_backend_follows_the_policy_and_explains():
    params = dict(batch_size=2, num_heads=8, num_gqa_groups=2, max_seqlen_q=64, max_seqlen_kv=64, head_dim_qk=64,
                  qkv_format="bshd", attn_mask_type="causal", qkv_dtype=torch.bfloat16)
    use_flash, backend, use_fused, _, use_unfused, available = tefl.get_attention_backend(params)
    assert use_flash and backend == "default.portable" and not use_fused and not use_unfused
    with tefl.policy_context(tefl.SelectionPolicy(prefer="reference")):
        assert tefl.get_attention_backend(params)[1] == "reference.cpp"
    thd = dict(params, qkv_format="thd_thd_thd", attn_mask_type="padding_causal")  # max_seqlen per sequence
    assert tefl.get_attention_backend(thd)[:2] == (True, "default.portable")
    assert tefl.attention_backend(thd)["signature"].startswith("q:bfloat16[3d]")
    bad = dict(params, num_gqa_groups=3)  # 3 does not divide 8
    assert tefl.get_attention_backend(bad) == (False, None, False, None, True, [False, False, True])
    why = tefl.attention_backend(bad)
    assert not why["available"] and "dividing h_q" in why["error"]


@pytest.mark.parametrize("causal", [False, True])
def test_flash_attention_forward_and_backward_vs_torch(causal):
    g = torch.Generator().manual_seed(5)
    s, b, h, d = 33, 2, 4, 16
    q, k, v = (torch.randn(s, b, h, d, generator=g, requires_grad=True) for _ in range(3))
    attn = tefl.flash_attention(1 / math.sqrt(d))
    out = attn(q, k, v, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal" if causal else "no_mask")
    assert out.shape == (s, b, h * d)
    qt, kt, vt = (t.detach().permute(1, 2, 0, 3).requires_grad_() for t in (q, k, v))  # [b, h, s, d]
    ref = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
    close(out, ref.permute(2, 0, 1, 3).reshape(s, b, h * d), 1e-4)
    dy = torch.randn(out.shape, generator=g)
    out.backward(dy)
    ref.permute(2, 0, 1, 3).reshape(s, b, h * d).backward(dy)
    for mine, theirs in ((q, qt), (k, kt), (v, vt)):
        close(mine.grad, theirs.grad.permute(2, 0, 1, 3), 1e-4)


@pytest.mark.parametrize("call,exc,message", [
    (lambda W, x: tefl.generic_gemm(W, True, x[:, :15].contiguous(), False), ValueError,
     r"A \[12, 16\] \(transA=True\) and B \[5, 15\] \(transB=False\) have different inner dimensions: "
     r"K = 16 from A, 15 from B"),
    (lambda W, x: tefl.generic_gemm(W, True, x.bfloat16(), False), ValueError,
     "A is float32 and B is bfloat16; expected the same dtype"),
    (lambda W, x: tefl.generic_gemm(W, True, x.t().contiguous().t(), False), ValueError,
     r"argument 'B' must be contiguous \(row-major\).*transB=True"),
    (lambda W, x: tefl.generic_gemm(None, True, x, False), TypeError, "argument 'A' is required, got None"),
    (lambda W, x: tefl.generic_gemm(W, True, x[None], False), ValueError,
     r"argument 'B' must be a 2-D tensor, got shape \[1, 5, 16\]"),
    (lambda W, x: tefl.generic_gemm(W.tolist(), True, x, False), TypeError, "argument 'A' must be a 2-D tensor"),
    # Errors raised by the row-major call itself are renamed: its a_scale_inv is TE's B_scale_inv, its
    # pre_gelu_out TE's gelu_in.
    (lambda W, x: tefl.generic_gemm(tefl.Float8Tensor(W.to(torch.float8_e4m3fn), torch.ones(2)), True,
                                    tefl.Float8Tensor(x.to(torch.float8_e4m3fn), torch.ones(1)), False), ValueError,
     r"argument 'A_scale_inv': expected shape \[1\] or \[\]"),
    (lambda W, x: tefl.generic_gemm(tefl.Float8Tensor(W.to(torch.float8_e4m3fn), torch.ones(1)), True,
                                    tefl.Float8Tensor(x.to(torch.float8_e4m3fn), torch.ones(3)), False), ValueError,
     r"argument 'B_scale_inv': expected shape \[1\] or \[\]"),
    (lambda W, x: tefl.generic_gemm(W, True, x, False, None, None, None, None, None, True, torch.empty(12, 5)),
     ValueError, r"argument 'gelu_in': expected shape \[5, 12\]"),
    (lambda W, x: tefl.generic_gemm(W, True, x, False, output_dtype=99), ValueError,
     r"argument 'output_dtype' expects a tefl.DType, a torch/numpy dtype or a dtype name, got 99"),
])
def test_generic_gemm_operand_errors_use_te_names(call, exc, message):
    """The row-major call swaps TE's A and B; errors still name the caller's."""
    W, x = torch.randn(12, 16), torch.randn(5, 16)
    with pytest.raises(exc, match="generic_gemm: .*" + message):
        call(W, x)


def test_flash_attention_scale_zero_or_not_a_number_is_rejected():
    # fused_attn_fwd's scale 0 means the default 1/sqrt(d): a requested 0 used to run with 1/sqrt(d) silently.
    for bad in (0.0, 0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=r"FlashAttention: softmax_scale must be finite and nonzero"):
            tefl.FlashAttention(bad)
    with pytest.raises(TypeError, match=r"FlashAttention: softmax_scale expects a number .* got 'x'"):
        tefl.FlashAttention("x")
    assert tefl.FlashAttention(None).softmax_scale == 0.0  # the default


def test_mixed_qkv_layouts_are_rejected():
    # k and v were read in q's format: with b == s the shapes passed and the result was wrong.
    q = torch.randn(4, 4, 2, 8)
    with pytest.raises(ValueError, match=r"FlashAttention: qkv_layout: mixed qkv layout 'sbhd_bshd_bshd' is not "
                                         r"supported"):
        tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_bshd_bshd", attn_mask_type="no_mask")
    with pytest.raises(ValueError, match=r"mixed qkv layout 'bshd_sb2hd'"):
        tefl.attention_backend({"qkv_layout": "bshd_sb2hd"})
    for same in ("sbhd_sbhd_sbhd", "bshd_bs2hd", "thd_t2hd", "sbh3d"):  # one format each
        tefl.attention_backend({"qkv_layout": same})


def test_attention_parameter_errors_name_the_function_and_field():
    with pytest.raises(TypeError, match="attention_backend: attention_params must be TE's AttentionParams"):
        tefl.get_attention_backend(42)
    with pytest.raises(ValueError, match=r"attention_backend: attention_params.attn_mask_type: unknown mask type "
                                         r"'bogus' \(known: no_mask, "):
        tefl.attention_backend({"attn_mask_type": "bogus"})
    with pytest.raises(ValueError, match="attention_backend: attention_params.qkv_format: unknown qkv layout 'xyz'"):
        tefl.attention_backend({"qkv_format": "xyz"})
    # a misspelled field answered for the call without it ("available" for an ALiBi-biased call)
    with pytest.raises(TypeError, match=r"^attention_backend: attention_params has no field\(s\) "
                                        r"'core_attention_bais_type' \(known: .*'?core_attention_bias_type"):
        tefl.get_attention_backend({"core_attention_bais_type": "alibi"})
    assert not tefl.get_attention_backend({"core_attention_bias_type": "alibi"})[0]
    q = torch.randn(4, 1, 2, 8)
    with pytest.raises(ValueError, match="FlashAttention: attn_mask_type: unknown mask type 'diagonal'"):
        tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="diagonal")


def test_attention_features_tefl_lacks_are_not_available_and_refused():
    # get_attention_backend said "available" for a bias, ALiBi, FP8, ...; FlashAttention.forward dropped a bias or
    # a misspelled keyword silently.
    base = dict(batch_size=1, num_heads=2, max_seqlen_q=4, max_seqlen_kv=4, head_dim_qk=8, qkv_format="sbhd",
                attn_mask_type="no_mask")
    assert tefl.get_attention_backend(base)[0]
    assert tefl.get_attention_backend(dict(base, core_attention_bias_type="no_bias", fp8=False))[0]
    for field, value, what in (("core_attention_bias_type", "post_scale_bias", "attention bias"),
                               ("alibi_slopes_shape", (2,), "ALiBi slopes"), ("fp8", True, "FP8 attention"),
                               ("pad_between_seqs", True, "padding between thd sequences"),
                               ("return_max_logit", True, "max-logit output")):
        params = dict(base, **{field: value})
        assert tefl.get_attention_backend(params) == (False, None, False, None, True, [False, False, True]), field
        why = tefl.attention_backend(params)
        assert not why["available"] and f"tefl's attention has no {what} (attention_params.{field}=" in why["error"]
    q = torch.randn(4, 1, 2, 8)
    attn = tefl.FlashAttention(0.35)
    with pytest.raises(TypeError, match=r"FlashAttention.forward: unexpected keyword argument\(s\) 'attn_mask_typ'"):
        attn(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_typ="no_mask")
    with pytest.raises(NotImplementedError, match=r"tefl's attention has no attention bias "
                                                  r"\(FlashAttention.forward.core_attention_bias\)"):
        attn(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask", core_attention_bias=torch.zeros(1))
    with pytest.raises(NotImplementedError, match=r"no ALiBi slopes"):
        attn(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask", alibi_slopes=torch.ones(2))
    # TE's keywords at their defaults (or with no meaning here) are accepted
    out = attn(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask", core_attention_bias_type="no_bias",
               alibi_slopes=None, fp8=False, cp_group=None, cp_comm_type="p2p", inference_params=None)
    assert torch.equal(out, attn(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask"))


def test_window_size_must_be_a_pair_of_ints():
    # A bare int gave "'int' object is not subscriptable", a string int()'s own message.
    for bad in (5, (1, 2, 3), "ab", (1.5, 0), (True, 0)):
        with pytest.raises(ValueError, match=r"attention_backend: attention_params.window_size must be None or a "
                                             r"pair \(left, right\) of ints"):
            tefl.get_attention_backend({"window_size": bad})
    q = torch.randn(4, 1, 2, 8)
    with pytest.raises(ValueError, match=r"FlashAttention: window_size must be None or a pair"):
        tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask", window_size=3)
    # None and -1 both mean unbounded; a left window of 2 over 4 positions masks the first one of the last row.
    full = tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask",
                                     window_size=(None, -1))
    assert torch.equal(full, tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask"))
    banded = tefl.FlashAttention(0.35)(q, q, q, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="no_mask",
                                       window_size=(2, 0))
    assert not torch.equal(full, banded)
    assert tefl.get_attention_backend({"window_size": (3, None)})[0]


def test_float8_quantizer_dtype_is_checked_when_made():
    # Float8Quantizer(dtype=99) used to fail later with "99 is not a valid DType" (no op, no argument).
    with pytest.raises(ValueError, match=r"Float8Quantizer: quantizer.dtype must be DType.kFloat8E4M3 or "
                                         r"DType.kFloat8E5M2 \(or the float8_e4m3fn / float8_e5m2 dtype\), got 99"):
        tefl.Float8Quantizer(torch.ones(1), torch.zeros(1), dtype=99)
    with pytest.raises(ValueError, match=r"Float8Quantizer: quantizer.dtype must be .*got torch.bfloat16"):
        tefl.Float8Quantizer(torch.ones(1), torch.zeros(1), dtype=torch.bfloat16)
    assert tefl.Float8Quantizer(torch.ones(1), torch.zeros(1), dtype=torch.float8_e5m2).dtype == torch.float8_e5m2
    assert tefl.Float8Quantizer(torch.ones(1), torch.zeros(1)).dtype == tefl.DType.kFloat8E4M3


def test_flash_attention_reads_a_padding_mask_as_sequence_lengths():
    """TE's FlashAttention derives cu_seqlens from attention_mask ([b, 1, 1, s]
    bool, True = padding); tefl's required cu_seqlens and never read the mask."""
    g = torch.Generator().manual_seed(5)
    fa = tefl.FlashAttention(None)
    q, k, v = (torch.randn(2, 5, 2, 8, generator=g) for _ in range(3))
    am = torch.zeros(2, 1, 1, 5, dtype=torch.bool)
    am[1, ..., 3:] = True  # batch row 1: 3 tokens, then padding
    o = fa(q, k, v, am, "bshd_bshd_bshd", None, None, 5, 5, "padding", None)
    cu = torch.tensor([0, 5, 8], dtype=torch.int32)
    assert torch.equal(o, fa(q, k, v, None, "bshd_bshd_bshd", cu, cu, 5, 5, "padding", None))
    sdpa = torch.nn.functional.scaled_dot_product_attention
    for row, n in ((0, 5), (1, 3)):
        ref = sdpa(*(t[row:row + 1, :n].transpose(1, 2) for t in (q, k, v))).transpose(1, 2).reshape(n, 16)
        close(o[row, :n], ref, 1e-5)
    assert torch.count_nonzero(o[1, 3:]) == 0
    # sbhd, and a pair of masks for queries and keys of different lengths
    kv_mask = torch.zeros(2, 1, 1, 4, dtype=torch.bool)
    kv_mask[0, ..., 2:] = True
    o2 = fa(q.transpose(0, 1), k[:, :4].transpose(0, 1), v[:, :4].transpose(0, 1), (am, kv_mask), "sbhd_sbhd_sbhd",
            attn_mask_type="padding")
    cu_kv = torch.tensor([0, 2, 6], dtype=torch.int32)
    assert torch.equal(o2, fa(q.transpose(0, 1), k[:, :4].transpose(0, 1), v[:, :4].transpose(0, 1), None,
                              "sbhd_sbhd_sbhd", cu, cu_kv, attn_mask_type="padding"))
    # what it cannot read is refused
    left = am.flip(-1)
    with pytest.raises(ValueError, match=r"attention_mask has padding before valid tokens \(batch rows \[1\]\)"):
        fa(q, k, v, left, "bshd_bshd_bshd", attn_mask_type="padding")
    with pytest.raises(TypeError, match=r"attention_mask expects a bool mask \(True = padding\), got torch.int64"):
        fa(q, k, v, am.long(), "bshd_bshd_bshd", attn_mask_type="padding")
    with pytest.raises(ValueError, match=r"attention_mask expects shape \[2, 1, 1, 5\]"):
        fa(q, k, v, am[:, 0], "bshd_bshd_bshd", attn_mask_type="padding")
    with pytest.raises(ValueError, match=r"attention_mask is read only with a padding mask type .* got "
                                         r"attn_mask_type 'causal' in bshd"):
        fa(q, k, v, am, "bshd_bshd_bshd", attn_mask_type="causal")
    with pytest.raises(ValueError, match=r"cu_seqlens_q \[0, 5, 10\] disagrees with attention_mask"):
        fa(q, k, v, am, "bshd_bshd_bshd", torch.tensor([0, 5, 10], dtype=torch.int32), attn_mask_type="padding")
