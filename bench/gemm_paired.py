#!/usr/bin/env python3
"""Paired timing of tefl's generic_gemm (through the C ABI, ctypes, default
policy) and torch.matmul (torch 2.13 CPU) in ONE process, so that both see
the same machine: the machine is shared, its speed drifts over seconds, and
timing the two in separate processes minutes apart decided the 512^3 case
by that drift.

Each pair times one chunk of each side, back to back, in ABBA order (the
side that goes first alternates). A chunk: sleep --gap seconds (so the
other library's worker threads stop spinning: OpenBLAS's and OpenMP's spin
before they sleep, and would otherwise take a core from the side being
timed), three untimed calls, then calls for --chunk seconds; its figure is
the mean ms per call. Per case: both medians, and the median, quartiles and
range of the per-pair ratio torch ms / tefl ms (> 1: tefl faster).

Both sides compute D = A @ B, row-major A [M, K], B [K, N], D preallocated
and written every call; torch.set_num_threads(--threads), and tefl's pool
the same (TEFL_NUM_THREADS is set to --threads unless it is already set;
a different value is reported, since the comparison is then unequal).
A case DTYPE/fprop/MxNxK is TE's forward of a linear layer with GELU: W is
[N, K] (transb), pre = A @ W^T + bias and D = gelu_tanh(pre), both written;
tefl does it in one generic_gemm call (bias, gelu, pre_gelu_out), torch in
torch.addmm(bias, A, W.t(), out=pre) and aten::gelu.out(pre, 'tanh', out=D).

--base LIB adds a third side, another build of libtefl (e.g. the commit
before a change, built into another directory), timed in the same rounds:
each pair then runs tefl, base and torch (the order reversed every other
pair), and each case also reports the median and range of base ms / tefl
ms (> 1: the change is faster). Both builds are checked against torch.

Usage: python3 bench/gemm_paired.py [--lib build/release/libtefl.so] [--base OTHER/libtefl.so]
       [--cases fp32/512x512x512,bf16/fprop/2048x2048x2048,...] [--pairs 20] [--chunk 0.3] [--gap 0.2]
       [--threads 2] [--json]
"""
import argparse
import ctypes
import json
import os
import statistics
import sys
import time

import torch
from tefl_ctypes import bind, dl, load

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


class GemmAttrs(ctypes.Structure):  # tefl_gemm_attrs (include/tefl/ops.h)
    _fields_ = [("struct_size", ctypes.c_size_t), ("transa", ctypes.c_int32), ("transb", ctypes.c_int32),
                ("alpha", ctypes.c_float), ("beta", ctypes.c_float), ("accumulate", ctypes.c_int32),
                ("gelu", ctypes.c_int32), ("grad", ctypes.c_int32), ("use_split_accumulator", ctypes.c_int32)]


def chunk_ms(fn, seconds, gap):
    time.sleep(gap)
    for _ in range(3):
        fn()
    n, start = 0, time.perf_counter()
    while True:
        fn()
        n += 1
        elapsed = time.perf_counter() - start
        if elapsed >= seconds and n >= 3:
            return 1e3 * elapsed / n


def parse_case(ap, case):
    """'fp32/512x512x512' -> (case, torch dtype, (M, N, K), fprop); 'bf16/fprop/MxNxK' sets fprop; a malformed
    case is an argument error."""
    parts = case.split("/")
    fprop = len(parts) == 3 and parts[1] == "fprop"
    dname, mnk = parts[0], parts[-1]
    dims = mnk.split("x")
    if (len(parts) != 2 and not fprop) or dname not in DTYPES or len(dims) != 3 or not all(
            v.isdigit() and int(v) > 0 for v in dims):
        ap.error(f"--cases: '{case}' is not DTYPE/MxNxK or DTYPE/fprop/MxNxK with DTYPE one of "
                 f"{', '.join(DTYPES)} and M, N, K positive integers (e.g. fp32/512x512x512)")
    return case, DTYPES[dname], tuple(int(v) for v in dims), fprop


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--lib", default="build/release/libtefl.so")
    ap.add_argument("--base", help="another build of libtefl, timed in the same rounds (base ms / tefl ms)")
    ap.add_argument("--cases", default="fp32/512x512x512,fp32/2048x2048x2048,fp32/4096x4096x1024,bf16/512x512x512")
    ap.add_argument("--pairs", type=int, default=20)
    ap.add_argument("--chunk", type=float, default=0.3, help="seconds of calls per chunk")
    ap.add_argument("--gap", type=float, default=0.2, help="seconds of sleep before each chunk")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.pairs < 1 or args.threads < 1 or args.chunk <= 0 or args.gap < 0:
        ap.error("--pairs and --threads must be >= 1, --chunk > 0 and --gap >= 0")
    cases = [parse_case(ap, c) for c in args.cases.split(",")]
    torch.set_num_threads(args.threads)
    tefl_threads = os.environ.setdefault("TEFL_NUM_THREADS", str(args.threads))  # read when the pool starts
    if tefl_threads != str(args.threads):
        print(f"note: TEFL_NUM_THREADS={tefl_threads} but torch runs {args.threads} threads", file=sys.stderr)
    if args.base and os.path.realpath(args.base) == os.path.realpath(args.lib):
        ap.error("--base names the same file as --lib")
    libs = [load(args.lib)] + ([load(args.base)] if args.base else [])
    if args.base and libs[0]._handle == libs[1]._handle:  # dlopen found one loaded copy for both
        ap.error("--base and --lib resolved to one loaded library")
    rows = []
    for case, dt, (m, n, k), fprop in cases:
        g = torch.Generator().manual_seed(0)
        a = (torch.rand(m, k, generator=g) - 0.5).to(dt)
        b = (torch.rand(n, k, generator=g) - 0.5).to(dt) if fprop else (torch.rand(k, n, generator=g) - 0.5).to(dt)
        bias = (torch.rand(n, generator=g) - 0.5).to(dt)
        d_torch, pre_torch = torch.empty(m, n, dtype=dt), torch.empty(m, n, dtype=dt)
        keep = []
        # in: A B C bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
        attrs = GemmAttrs(ctypes.sizeof(GemmAttrs), 0, int(fprop), 1.0, 1.0, 0, int(fprop), 0, 0)
        sides, d_sides = [], []  # tefl, then base
        for lib in libs:
            d, pre = torch.empty(m, n, dtype=dt), torch.empty(m, n, dtype=dt)
            keep += [d, pre]  # dl() keeps the DLTensor structs, not the tensors' memory
            ins = [dl(a, keep), dl(b, keep), None, dl(bias, keep) if fprop else None, None, None, None]
            sides.append(bind(lib, lib.tefl_op_id(b"generic_gemm"), ins,
                              [dl(d, keep), dl(pre, keep) if fprop else None, None, None], attrs))
            d_sides.append(d)

        if fprop:
            def torch_mm(a=a, b=b, bias=bias, pre=pre_torch, d=d_torch):
                torch.addmm(bias, a, b.t(), out=pre)
                torch.ops.aten.gelu.out(pre, approximate="tanh", out=d)
        else:
            def torch_mm(a=a, b=b, d=d_torch):
                torch.matmul(a, b, out=d)

        torch_mm()
        scale = d_torch.float().abs().max().item()
        for run, d, name in zip(sides, d_sides, ["tefl", "base"]):
            run()
            err = (d.float() - d_torch.float()).abs().max().item()
            if not err <= 1e-2 * max(scale, 1.0):  # the two must compute the same product
                raise SystemExit(f"{case}: {name} and torch differ by {err} (|D| max {scale})")
        t_ms, p_ms, b_ms, ratios, base_ratios = [], [], [], [], []
        for i in range(args.pairs):
            order = [*sides, torch_mm] if i % 2 == 0 else [torch_mm, *reversed(sides)]
            ms = {fn: chunk_ms(fn, args.chunk, args.gap) for fn in order}
            t_ms.append(ms[sides[0]])
            p_ms.append(ms[torch_mm])
            ratios.append(p_ms[-1] / t_ms[-1])
            if args.base:
                b_ms.append(ms[sides[1]])
                base_ratios.append(b_ms[-1] / t_ms[-1])
        q = statistics.quantiles(ratios, n=4) if len(ratios) >= 2 else ratios * 3
        row = {"case": case, "pairs": args.pairs, "tefl_ms": statistics.median(t_ms),
               "torch_ms": statistics.median(p_ms), "ratio_median": statistics.median(ratios),
               "ratio_q1": q[0], "ratio_q3": q[2], "ratio_min": min(ratios), "ratio_max": max(ratios),
               "gflops_tefl": 2e-6 * m * n * k / statistics.median(t_ms)}
        if args.base:
            row.update({"base_ms": statistics.median(b_ms), "base_ratio_median": statistics.median(base_ratios),
                        "base_ratio_min": min(base_ratios), "base_ratio_max": max(base_ratios)})
        rows.append(row)
        if not args.json:
            print(f"{case:22s} tefl {row['tefl_ms']:9.3f} ms ({row['gflops_tefl']:6.1f} GFLOP/s)  torch "
                  f"{row['torch_ms']:9.3f} ms  torch/tefl median {row['ratio_median']:.3f} "
                  f"(quartiles {q[0]:.3f}-{q[2]:.3f}, range {min(ratios):.3f}-{max(ratios):.3f}, "
                  f"{args.pairs} pairs)", flush=True)
            if args.base:
                print(f"{'':22s} base {row['base_ms']:9.3f} ms  base/tefl median {row['base_ratio_median']:.3f} "
                      f"(range {row['base_ratio_min']:.3f}-{row['base_ratio_max']:.3f})", flush=True)
    if args.json:
        print(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
