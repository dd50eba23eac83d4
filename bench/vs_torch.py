#!/usr/bin/env python3
"""tefl's default.portable against PyTorch on the CPU, same machine, same run.

usage: bench/vs_torch.py [--tefl build/release/tools/tefl/tefl] [--family F ...]
                         [--op OP ...] [--dtype D ...] [--repeats N] [--quick] [--markdown]

For each case: tefl's time per call on warm, preallocated outputs (measured
by `tefl bench`, which also measures this machine's copy bandwidth at the
start of its run), and torch's time for the same maths at the same size and
thread count: its own fused op where one exists, otherwise its composition of
the same maths (as TransformerEngine's unfused paths write it). torch is timed
both as called (it allocates its outputs: large allocations are fresh mmap'd
pages every call) and, where aten has `.out` overloads, into preallocated
outputs; the ratio is against the faster of the two. With --repeats N each
case is measured N times, tefl and torch alternating, and the table gives the
medians and the range of the ratio (memory-bound rows at parity need this:
one sample on a shared machine decides little).

Needs torch 2.13 CPU (`pip install torch==2.13.0`).
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time
from statistics import median

import torch
import torch.nn.functional as F

A = torch.ops.aten


def median_ms(fn, min_time=0.5, min_iters=3):
    fn()  # warm-up
    samples = []
    start = time.perf_counter()
    while len(samples) < min_iters or time.perf_counter() - start < min_time:
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
        if len(samples) >= 200:
            break
    samples.sort()
    return samples[len(samples) // 2] * 1e3


TORCH_DTYPE = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def rand(shape, dt, lo=-2.0, hi=1.0):
    return (torch.rand(shape, dtype=torch.float32) * (hi - lo) + lo).to(dt)


# ---- cases: (family, tefl op, main shape, torch kind, builder) ----------------
# A builder gets (shape, dtype) and returns (as_called, preallocated or None).


def norm_cases():
    def rms(shape, dt):
        x, w = rand(shape, dt), rand(shape[-1:], dt)
        return (lambda: F.rms_norm(x, shape[-1:], w, 1e-5)), None

    def ln(shape, dt):
        x, w, b = rand(shape, dt), rand(shape[-1:], dt), rand(shape[-1:], dt)
        return (lambda: F.layer_norm(x, shape[-1:], w, b, 1e-5)), None

    return [("normalization", "rmsnorm_fwd", [8192, 4096], "fused F.rms_norm", rms),
            ("normalization", "layernorm_fwd", [8192, 4096], "fused F.layer_norm", ln)]


def act_cases():
    def unary(fn, outfn):
        def build(shape, dt):
            x = rand(shape, dt, -4, 4)
            y = torch.empty_like(x)
            return (lambda: fn(x)), (lambda: outfn(x, y))
        return build

    def gated(act, outact):
        def build(shape, dt):
            x = rand([shape[0], 2 * shape[1]], dt, -4, 4)
            a, b = x[:, : shape[1]], x[:, shape[1]:]
            t = torch.empty(shape, dtype=dt)
            y = torch.empty(shape, dtype=dt)

            def pre():
                outact(a, t)
                A.mul.out(t, b, out=y)
            return (lambda: act(a) * b), pre
        return build

    def dgelu(shape, dt):
        g, x = rand(shape, dt), rand(shape, dt, -4, 4)
        y = torch.empty_like(x)
        return (lambda: A.gelu_backward(g, x, approximate="tanh")), \
            (lambda: A.gelu_backward.grad_input(g, x, approximate="tanh", grad_input=y))

    def dswiglu(shape, dt):
        g = rand(shape, dt)
        x = rand([shape[0], 2 * shape[1]], dt, -4, 4)
        a, b = x[:, : shape[1]], x[:, shape[1]:]

        def call():
            s = torch.sigmoid(a)
            silu = a * s
            da = g * b * (s * (1 + a * (1 - s)))
            return torch.cat([da, g * silu], dim=1)
        return call, None

    def dbias_dgelu(shape, dt):
        g, x = rand(shape, dt), rand(shape, dt, -4, 4)

        def call():
            dx = A.gelu_backward(g, x, approximate="tanh")
            return dx, dx.sum(0)
        return call, None

    gelu = unary(lambda x: F.gelu(x, approximate="tanh"), lambda x, y: A.gelu.out(x, approximate="tanh", out=y))
    silu = unary(F.silu, lambda x, y: A.silu.out(x, out=y))
    relu = unary(F.relu, lambda x, y: torch.clamp_min(x, 0, out=y))
    swiglu = gated(F.silu, lambda a, t: A.silu.out(a, out=t))
    geglu = gated(lambda a: F.gelu(a, approximate="tanh"), lambda a, t: A.gelu.out(a, approximate="tanh", out=t))
    s = [8192, 4096]
    return [("activation", "gelu", s, "fused F.gelu(tanh)", gelu),
            ("activation", "silu", s, "fused F.silu", silu),
            ("activation", "relu", s, "fused F.relu", relu),
            ("activation", "swiglu", s, "composition silu(a)*b", swiglu),
            ("activation", "geglu", s, "composition gelu(a)*b", geglu),
            ("activation", "dgelu", s, "fused aten.gelu_backward", dgelu),
            ("activation", "dswiglu", s, "composition", dswiglu),
            ("activation", "dbias_dgelu", s, "composition gelu_backward + sum", dbias_dgelu)]


def softmax_cases(shape):
    scale = 0.125

    def plain(shape_, dt):
        x = rand(shape_, dt, -8, 8)
        y, t = torch.empty_like(x), torch.empty_like(x)

        def pre():
            A.mul.out(x, scale, out=t)
            A._softmax.out(t, -1, False, out=y)
        return (lambda: torch.softmax(x * scale, -1)), pre

    def masked(shape_, dt):
        x = rand(shape_, dt, -8, 8)
        mask = torch.rand([shape_[0], 1, shape_[2], shape_[3]]) < 0.33
        return (lambda: torch.softmax(x.masked_fill(mask, -10000.0) * scale, -1)), None

    def triang(shape_, dt):
        if len(shape_) == 4:  # tefl's grid shape [b, h, s, s] is run as [b * h, s, s]
            shape_ = [shape_[0] * shape_[1], shape_[2], shape_[3]]
        x = rand(shape_, dt, -8, 8)
        n = shape_[-1]
        mask = torch.triu(torch.ones(n, n, dtype=torch.bool), 1)
        return (lambda: torch.softmax((x * scale).masked_fill(mask, float("-inf")), -1)), None

    def bwd(shape_, dt):
        y = torch.softmax(rand(shape_, dt, -8, 8), -1)
        dy = rand(shape_, dt)
        out = torch.empty_like(y)
        return (lambda: A._softmax_backward_data(dy, y, -1, dt) * scale), \
            (lambda: A._softmax_backward_data.out(dy, y, -1, dt, grad_input=out))

    return [("softmax", "scaled_softmax_forward", shape, "softmax(x*scale) (fused softmax)", plain),
            ("softmax", "scaled_masked_softmax_forward", shape, "composition masked_fill+softmax", masked),
            ("softmax", "scaled_upper_triang_masked_softmax_forward", shape, "composition triu mask+softmax", triang),
            ("softmax", "scaled_aligned_causal_masked_softmax_forward", shape, "composition triu mask+softmax",
             triang),
            ("softmax", "scaled_softmax_backward", shape, "fused _softmax_backward_data", bwd)]


def rope_cases(shape):
    def build(shape_, dt):
        s, b, h, d = shape_
        x = rand(shape_, dt)
        inv = 1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        f = torch.outer(torch.arange(s, dtype=torch.float32), inv)
        emb = torch.cat([f, f], -1)[:, None, None, :]
        cos, sin = emb.cos().to(dt), emb.sin().to(dt)

        def rot(t):
            t1, t2 = t[..., : d // 2], t[..., d // 2:]
            return torch.cat([-t2, t1], -1)
        return (lambda: x * cos + rot(x) * sin), None

    return [("rope", "fused_rope_forward", shape, "composition x*cos+rotate_half(x)*sin", build),
            ("rope", "fused_rope_backward", shape, "composition (same cost)", build)]


def dropout_cases():
    def build(shape, dt):
        x = rand(shape, dt)
        return (lambda: F.dropout(x, 0.1, training=True)), None
    return [("dropout", "dropout_fwd", [8192, 4096], "fused F.dropout", build)]


def tefl_bench(tefl, op, shape, dtype, min_time):
    out = subprocess.run([tefl, "bench", "--op", op, "--impl", "default.portable", "--dtype", dtype, "--size",
                          ",".join(map(str, shape)), "--min-time", str(min_time), "--json"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return None, out.stderr.strip()
    j = json.loads(out.stdout)
    rows = [r for r in j["results"] if "seconds" in r]
    if not rows:
        return None, j["results"][0].get("error", "no result") if j["results"] else "no result"
    return (rows[0], j["copy_gbps"], j["threads"]), None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tefl", default="build/release/tools/tefl/tefl")
    ap.add_argument("--family", action="append")
    ap.add_argument("--dtype", action="append")
    ap.add_argument("--quick", action="store_true", help="smaller softmax and shorter sampling")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--op", action="append", help="only this tefl op (repeatable)")
    ap.add_argument("--repeats", type=int, default=1,
                    help="measure each case N times, tefl and torch alternating; report medians and the ratio range")
    args = ap.parse_args()
    dtypes = args.dtype or ["fp32", "bf16"]
    min_time = 0.2 if args.quick else 0.5
    sm_shape = [1, 16, 1024, 1024] if args.quick else [4, 16, 2048, 2048]
    cases = norm_cases() + act_cases() + softmax_cases(sm_shape) + rope_cases([4096, 2, 32, 128]) + dropout_cases()
    if args.family:
        cases = [c for c in cases if c[0] in args.family]
    if args.op:
        cases = [c for c in cases if c[1] in args.op]
    if args.repeats < 1:
        ap.error("--repeats must be at least 1")
    rows = []
    threads = None
    for family, op, shape, kind, build in cases:
        for dt in dtypes:
            # Repeats alternate tefl and torch, so a slow spell of the shared
            # machine hits both; the figures are medians over the repeats.
            tefl_ms, gbps, pct, pct_nt, copies, t_called, t_pre, ratios = [], [], [], [], [], [], [], []
            fns = None
            for _ in range(args.repeats):
                res, err = tefl_bench(args.tefl, op, shape, dt, min_time)
                if res is None:
                    print(f"{op} {dt}: tefl bench failed: {err}", file=sys.stderr)
                    break
                row, copy_gbps, threads = res
                torch.set_num_threads(threads)
                if fns is None:
                    fns = build(shape, TORCH_DTYPE[dt])
                called, pre = fns
                tefl_ms.append(row["seconds"] * 1e3)
                gbps.append(row["gbps"])
                pct.append(row["pct_of_copy"])
                pct_nt.append(row.get("pct_of_stream_copy", float("nan")))
                copies.append(copy_gbps)
                t_called.append(median_ms(called, min_time))
                t_pre.append(median_ms(pre, min_time) if pre else None)
                best = min(t_called[-1], t_pre[-1]) if pre else t_called[-1]
                ratios.append(best / tefl_ms[-1])
            fns = None
            if not ratios:
                continue
            has_pre = t_pre[0] is not None
            rows.append({"op": op, "dtype": dt, "shape": shape, "torch": kind, "tefl_ms": median(tefl_ms),
                         "gbps": median(gbps), "pct_of_copy": median(pct), "pct_of_nt_copy": median(pct_nt), "copy_gbps": median(copies),
                         "torch_called_ms": median(t_called), "torch_prealloc_ms": median(t_pre) if has_pre else None,
                         "speedup": median(ratios), "speedup_min": min(ratios), "speedup_max": max(ratios),
                         "repeats": len(ratios)})
            r = rows[-1]
            spread = f" (x{r['speedup_min']:.2f}-x{r['speedup_max']:.2f} over {len(ratios)})" if len(ratios) > 1 else ""
            print(f"{op:46s} {dt:4s} tefl {r['tefl_ms']:9.3f} ms {r['gbps']:6.1f} GB/s {r['pct_of_copy']:4.0f}% of copy "
                  f"{r['pct_of_nt_copy']:4.0f}% of NT copy | "
                  f"torch {r['torch_called_ms']:9.3f} ms" +
                  (f" ({r['torch_prealloc_ms']:.3f} prealloc)" if has_pre else "") +
                  f" | x{r['speedup']:.2f}{spread}", flush=True)
    if args.markdown:
        print(f"\n{threads} threads; copy bandwidth (memcpy, and with non-temporal stores: NT copy) measured by each "
              "`tefl bench` run.\n")
        print("| op | dtype | shape | tefl ms | GB/s | % of copy | % of NT copy | torch (what) | torch ms as called | torch ms "
              "preallocated | speed-up vs torch |" + (" range over repeats |" if args.repeats > 1 else ""))
        print("|---|---|---|---|---|---|---|---|---|---|---|" + ("---|" if args.repeats > 1 else ""))
        for r in rows:
            pre = f"{r['torch_prealloc_ms']:.3f}" if r["torch_prealloc_ms"] else "-"
            print(f"| {r['op']} | {r['dtype']} | {r['shape']} | {r['tefl_ms']:.3f} | {r['gbps']:.1f} | "
                  f"{r['pct_of_copy']:.0f}% | {r['pct_of_nt_copy']:.0f}% | {r['torch']} | {r['torch_called_ms']:.3f} | {pre} | "
                  f"{r['speedup']:.2f}x |" +
                  (f" {r['speedup_min']:.2f}-{r['speedup_max']:.2f}x |" if args.repeats > 1 else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
