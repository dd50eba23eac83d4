#!/usr/bin/env python3
"""PyTorch CPU side of bench/bench_attention.cpp: ms per call of
torch.nn.functional.scaled_dot_product_attention on the same shapes (b = 2,
h = 16, d = 64 and 128, s = 512 and 2048, causal and not, fp32 and bf16),
torch.set_num_threads(2).

Forward: one SDPA call under torch.no_grad(). Backward: the time of
forward + backward (torch.autograd.grad of (o * do).sum()) minus the forward
time with grad enabled, i.e. what the backward adds. Median of --repeats
timed calls after one warm-up.

Usage: python3 bench/torch_attention.py [--json] [--repeats N] [--filter TEXT]
       [--rss S]   (peak RSS of one forward at s = S: see --help)
"""
import argparse
import json
import resource
import statistics
import sys
import time

import torch
import torch.nn.functional as F

B, H = 2, 16


def timed(fn, repeats):
    fn()  # warm-up
    ts = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e3


def case(dtype, s, d, causal, repeats):
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(B, H, s, d, generator=g, dtype=torch.float32).mul_(2).sub_(1).to(dtype) for _ in range(3))
    do = torch.rand(B, H, s, d, generator=g).mul_(2).sub_(1).to(dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q, k, v, is_causal=causal)

    qg, kg, vg = (t.clone().requires_grad_(True) for t in (q, k, v))

    def fwd_grad():
        F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)

    def fwd_bwd():
        o = F.scaled_dot_product_attention(qg, kg, vg, is_causal=causal)
        torch.autograd.grad(o, (qg, kg, vg), do)

    f = timed(fwd, repeats)
    fb = timed(fwd_bwd, repeats)
    fg = timed(fwd_grad, repeats)
    return f, max(fb - fg, 0.0)


def rss_case(s, composition):
    """Peak RSS (MiB) of one fp32 forward at b=1, h=16, d=64, seq s."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.rand(1, H, s, 64, generator=g) for _ in range(3))
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with torch.no_grad():
        if composition:  # matmul-softmax-matmul: materialises [s, s] per head
            p = torch.softmax(q @ k.transpose(-1, -2) / 8.0, dim=-1)
            o = p @ v
        else:
            o = F.scaled_dot_product_attention(q, k, v)
    del o
    return base / 1024.0, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--filter", default="")
    ap.add_argument("--rss", type=int, default=0,
                    help="instead: print peak RSS (MiB) before/after one fp32 forward at this seq length; "
                         "add --composition for matmul-softmax-matmul")
    ap.add_argument("--composition", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(2)
    if args.rss:
        before, after = rss_case(args.rss, args.composition)
        print(json.dumps({"seq": args.rss, "composition": args.composition, "rss_before_mib": before,
                          "rss_peak_mib": after}))
        return
    rows = []
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for s in (512, 2048):
            for d in (64, 128):
                for causal in (False, True):
                    name = f"{dname}/s{s}/d{d}/{'causal' if causal else 'full'}"
                    if args.filter and args.filter not in name:
                        continue
                    f, b = case(dtype, s, d, causal, args.repeats)
                    rows.append({"case": name, "fwd_ms": f, "bwd_ms": b})
                    if not args.json:
                        print(f"{name:28s} fwd {f:9.2f} ms   bwd {b:9.2f} ms", flush=True)
    if args.json:
        json.dump(rows, sys.stdout, indent=1)
        print()


if __name__ == "__main__":
    main()
