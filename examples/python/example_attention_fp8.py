"""One attention block trained for a few steps with tefl's ops from PyTorch:
TransformerEngine's generic_gemm for the projections (fprop TN, dgrad NN,
wgrad NT with the bias gradient), tefl's FlashAttention (autograd through
fused_attn_bwd) and an FP8 (E4M3, current scaling) forward projection
checked against its bf16 counterpart. Prints what ran and the loss."""
import math

import torch

import tefl

torch.manual_seed(0)
torch.set_num_threads(2)
s, b, h, d = 64, 2, 4, 32
hidden = h * d
x = torch.randn(s * b, hidden)
w_qkv = (torch.randn(3 * hidden, hidden) / math.sqrt(hidden)).requires_grad_()
w_o = (torch.randn(hidden, hidden) / math.sqrt(hidden)).requires_grad_()
b_o = torch.zeros(hidden, requires_grad=True)
target = torch.randn(s * b, hidden)
attn = tefl.flash_attention(1 / math.sqrt(d))


class Linear(torch.autograd.Function):
    """y = x W^T + b through TE's generic_gemm calls (fprop, dgrad, wgrad)."""

    @staticmethod
    def forward(ctx, inp, weight, bias):
        ctx.save_for_backward(inp, weight)
        ctx.has_bias = bias is not None
        out, *_ = tefl.generic_gemm(weight, True, inp, False, bias=bias)  # TN: x W^T + b
        return out

    @staticmethod
    def backward(ctx, dy):
        inp, weight = ctx.saved_tensors
        dx, *_ = tefl.generic_gemm(weight, False, dy, False)  # NN: dy W
        dw, db, _, _ = tefl.generic_gemm(inp, False, dy, True, grad=True,
                                        bias=torch.empty(0) if ctx.has_bias else None)  # NT: dy^T x, dy.sum(0)
        return dx, dw, db


opt = torch.optim.SGD([w_qkv, w_o, b_o], lr=0.5)
for step in range(5):
    qkv = Linear.apply(x, w_qkv, None).view(s, b, 3, h, d)
    q, k, v = qkv.unbind(2)
    ctx = attn(q, k, v, qkv_layout="sbhd_sbhd_sbhd", attn_mask_type="causal")  # [s, b, h*d]
    y = Linear.apply(ctx.reshape(s * b, hidden), w_o, b_o)
    loss = torch.nn.functional.mse_loss(y, target)
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"step {step}: loss {loss.item():.4f}")

mgr = tefl.get_default_manager()
print("ran:", ", ".join(f"{op} -> {mgr.get_selected_impl_id(op)}"
                        for op in ("generic_gemm", "fused_attn_fwd", "fused_attn_bwd")))
params = dict(batch_size=b, num_heads=h, max_seqlen_q=s, max_seqlen_kv=s, head_dim_qk=d, qkv_format="sbhd",
              attn_mask_type="causal", qkv_dtype=torch.float32)
print("get_attention_backend:", tefl.get_attention_backend(params))

# FP8 forward projection: current scaling from each operand's amax.
with torch.no_grad():
    def to_fp8(t):
        amax = tefl.compute_amax(t)
        scale, _ = tefl.compute_scale_from_amax(amax)  # 448 / amax (E4M3)
        data, _, scale_inv = tefl.quantize(t, scale)
        return tefl.Float8Tensor(data, scale_inv)

    y8, *_ = tefl.generic_gemm(to_fp8(w_o), True, to_fp8(x), False, output_dtype=tefl.DType.kFloat32)
    ybf, *_ = tefl.generic_gemm(w_o.bfloat16(), True, x.bfloat16(), False, output_dtype=tefl.DType.kFloat32)
    yf = x @ w_o.T
    rel = lambda a: ((a - yf).norm() / yf.norm()).item()  # noqa: E731
    print(f"fp8 projection: relative error {rel(y8):.4f} (bf16: {rel(ybf):.4f}) vs fp32")
