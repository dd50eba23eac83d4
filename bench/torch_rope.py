#!/usr/bin/env python3
"""PyTorch CPU side of bench/bench_rope.cpp: the same RoPE cases, timed with
torch's composition of the same maths (TransformerEngine's unfused
apply_rotary_pos_emb: x * cos + rotate_half(x) * sin, cos/sin precomputed
from freqs outside the timed region; thd: one slice per sequence, as TE's
unfused thd path). Backward is the same composition of the transpose,
dx = dy * cos + rotate_half^T(dy * sin) (what autograd runs).

Cases (8192 tokens x 32 heads x 128, d2 = 128, fp32 and bf16):
  fused_rope_forward|backward  sbhd [4096, 2, 32, 128], bshd [2, 4096, 32, 128],
                               thd [8192, 32, 128] with cu_seqlens {0, 3000, 8192}
  fused_qkv_rope_forward|backward  sbhd qkv [4096, 2, 8, 6 * 128] (4 q, 1 k,
                               1 v heads per group): split + RoPE on q and k

Usage: python3 bench/torch_rope.py [--json] [--threads 2] [--iters 20]
Prints ms per call per case (median of --iters timed calls after warm-up).
"""
import argparse
import json
import time

import torch

S, B, H, D, D2 = 4096, 2, 32, 128, 128
TOKENS = S * B
CU = [0, 3000, TOKENS]
GROUPS, QHEADS = 8, 4


def freqs_table(rows, d2):
    inv = 1.0 / (10000 ** (torch.arange(0, d2, 2, dtype=torch.float32) / d2))
    f = torch.outer(torch.arange(rows, dtype=torch.float32), inv)
    return torch.cat((f, f), dim=-1).view(rows, 1, 1, d2)


def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rotate_half_t(x):  # the transpose of rotate_half
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x2, -x1), dim=-1)


def rope(x, cos, sin, backward):
    if backward:
        return x * cos + rotate_half_t(x * sin)
    return x * cos + rotate_half(x) * sin


def time_ms(fn, iters):
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def cases(dtype):
    f = freqs_table(TOKENS, D2)
    cos_all, sin_all = torch.cos(f).to(dtype), torch.sin(f).to(dtype)
    cos_s, sin_s = cos_all[:S], sin_all[:S]  # [s, 1, 1, d2]
    out = {}
    for backward in (False, True):
        op = "fused_rope_backward" if backward else "fused_rope_forward"
        x = torch.rand(S, B, H, D, dtype=torch.float32).to(dtype)
        out[(op, "sbhd")] = lambda x=x, b=backward: rope(x, cos_s, sin_s, b)
        xb = torch.rand(B, S, H, D, dtype=torch.float32).to(dtype)
        cos_b, sin_b = cos_s.transpose(0, 1), sin_s.transpose(0, 1)  # [1, s, 1, d2]
        out[(op, "bshd")] = lambda x=xb, b=backward: rope(x, cos_b, sin_b, b)
        xt = torch.rand(TOKENS, H, D, dtype=torch.float32).to(dtype)
        cos_t, sin_t = cos_all.view(TOKENS, 1, D2), sin_all.view(TOKENS, 1, D2)

        def thd(x=xt, b=backward):
            parts = []
            for i in range(len(CU) - 1):
                n = CU[i + 1] - CU[i]
                parts.append(rope(x[CU[i]:CU[i + 1]], cos_t[:n], sin_t[:n], b))
            return torch.cat(parts)

        out[(op, "thd")] = thd
    per_group = (QHEADS + 2) * D
    qkv = torch.rand(S, B, GROUPS, per_group, dtype=torch.float32).to(dtype)

    def qkv_fwd():
        q, k, v = torch.split(qkv, [QHEADS * D, D, D], dim=3)
        q = q.reshape(S, B, GROUPS * QHEADS, D)
        return rope(q, cos_s, sin_s, False), rope(k, cos_s, sin_s, False), v.contiguous()

    gq = torch.rand(S, B, GROUPS * QHEADS, D, dtype=torch.float32).to(dtype)
    gk = torch.rand(S, B, GROUPS, D, dtype=torch.float32).to(dtype)
    gv = torch.rand(S, B, GROUPS, D, dtype=torch.float32).to(dtype)

    def qkv_bwd():
        dq = rope(gq, cos_s, sin_s, True).view(S, B, GROUPS, QHEADS * D)
        dk = rope(gk, cos_s, sin_s, True)
        return torch.cat((dq, dk, gv), dim=3)

    out[("fused_qkv_rope_forward", "sbhd")] = qkv_fwd
    out[("fused_qkv_rope_backward", "sbhd")] = qkv_bwd
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="machine-readable output")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    with torch.no_grad():
        for dtype, dname in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            for (op, fmt), fn in cases(dtype).items():
                ms = time_ms(fn, args.iters)
                results.append({"op": op, "format": fmt, "dtype": dname, "ms": round(ms, 3)})
                if not args.json:
                    print(f"torch/{op}/{fmt}/{dname}: {ms:.3f} ms", flush=True)
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": args.threads, "results": results}, indent=1))


if __name__ == "__main__":
    main()
