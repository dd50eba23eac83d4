#!/usr/bin/env python3
"""PyTorch CPU timings of the FP8 quantization ops, at bench_quantization's sizes.

Same cases as bench/bench_quantization.cpp, torch.set_num_threads(2) (or
--threads), values a ramp in [-2, 1). torch has no fused FP8 quantize on the
CPU, so each case is the composition of the same maths in torch's own ops:
  quantize     q = (x * scale).to(float8_*) (torch's cast: RNE; it does not
               saturate, so the clamp to +-fp8_max is added as TE's satfinite
               cast does), amax = x.abs().amax(), scale_inv = scale.reciprocal()
  dequantize   q.to(dtype) * scale_inv, rounded to dtype (fp32 math)
  compute_amax x.abs().amax()
  fp8_transpose q.t().contiguous()
  rmsnorm_fwd_fp8 / swiglu_fp8: torch's rms_norm / silu(a) * b in the input
               dtype, then the quantize composition (the base op alone too).

Prints ms per call (median of --reps timed batches) per case; --json prints
one JSON object {"threads": n, "cases": {"<op>/<label>": ms, ...}}.

    python3 bench/torch_quantization.py [--json] [--threads 2] [--reps 5]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

FP8 = {"e4m3": (torch.float8_e4m3fn, 448.0), "e5m2": (torch.float8_e5m2, 57344.0)}
DT = {"fp32": torch.float32, "bf16": torch.bfloat16}


def ramp(n, dtype):
    return ((torch.arange(n) % 97).float() * 0.03 - 2.0).to(dtype)


def quantize(x, scale, fmt):
    dt, mx = FP8[fmt]
    q = (x.float() * scale).clamp_(-mx, mx).to(dt)
    return q, x.abs().amax().float(), scale.reciprocal()


def cases():
    out = {}
    scale = torch.tensor([64.0])
    for n, size in ((1 << 24, "16M"), (1 << 17, "128K")):
        for dname, dt in DT.items():
            x = ramp(n, dt)
            for fmt in FP8:
                out[f"quantize/{dname}->{fmt}/{size}"] = (lambda x=x, fmt=fmt: quantize(x, scale, fmt))
            q = torch.full((n,), 1.5).to(torch.float8_e4m3fn)
            sinv = torch.tensor([1.0])
            out[f"dequantize/e4m3->{dname}/{size}"] = lambda q=q, dt=dt: (q.float() * sinv).to(dt)
            out[f"compute_amax/{dname}/{size}"] = lambda x=x: x.abs().amax()
    q = torch.full((4096, 4096), 1.5).to(torch.float8_e4m3fn)
    out["fp8_transpose/e4m3/4096x4096"] = lambda: q.t().contiguous()
    rows, h = 8192, 4096
    x = ramp(rows * h, torch.bfloat16).reshape(rows, h)
    g = torch.ones(h, dtype=torch.bfloat16)
    out["rmsnorm_fwd/bf16->bf16/8192x4096"] = lambda: F.rms_norm(x, (h,), g, 1e-5)
    out["rmsnorm_fwd_fp8/bf16->e4m3/8192x4096"] = lambda: quantize(F.rms_norm(x, (h,), g, 1e-5), scale, "e4m3")
    x2 = ramp(rows * 2 * h, torch.bfloat16).reshape(rows, 2 * h)
    a, b = x2.chunk(2, dim=-1)
    out["swiglu/bf16->bf16/8192x8192"] = lambda: F.silu(a) * b
    out["swiglu_fp8/bf16->e4m3/8192x8192"] = lambda: quantize(F.silu(a) * b, scale, "e4m3")
    return out


def time_ms(fn, reps):
    fn()
    t0 = time.perf_counter()
    fn()
    one = time.perf_counter() - t0
    iters = max(1, int(0.2 / max(one, 1e-6)))
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        samples.append((time.perf_counter() - t0) / iters * 1e3)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    res = {name: time_ms(fn, args.reps) for name, fn in cases().items()}
    if args.json:
        print(json.dumps({"threads": args.threads, "cases": res}))
    else:
        for name, ms in res.items():
            print(f"{name:45s} {ms:9.3f} ms")


if __name__ == "__main__":
    main()
