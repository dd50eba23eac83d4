#!/usr/bin/env python3
"""torch.matmul on the sizes of bench/bench_gemm.cpp (torch CPU, 2 threads).

Prints ms per call and GFLOP/s per case; --json for machine-readable output.
Cases: fp32 and bf16 D = A @ B at 512^3, 2048^3, 4096x4096x1024 (M x N x K);
the fprop epilogue case gelu(x @ W^T + bias) (torch's composition:
torch.addmm then torch.nn.functional.gelu(approximate="tanh")); the grouped
case (8 experts, 512 rows, K = N = 1024) as a loop of torch.matmul over
torch.split, as TE's CPU fallback would do.

    python3 bench/torch_gemm.py [--json] [--repeats 3] [--threads 2] [--cpu-time] [--filter bf16/]
"""
import argparse
import json
import statistics
import time

import torch


def time_ms(fn, min_time=1.0, clock=time.perf_counter):
    fn()  # warm up
    fn()
    n, start = 0, clock()
    while True:
        fn()
        n += 1
        el = clock() - start
        if el >= min_time and n >= 3:
            return 1e3 * el / n


def cases():
    for dname, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        for m, n, k in ((512, 512, 512), (2048, 2048, 2048), (4096, 4096, 1024)):
            a = torch.rand(m, k).to(dt) - 0.5
            b = torch.rand(k, n).to(dt) - 0.5
            out = torch.empty(m, n, dtype=dt)
            yield (f"{dname}/{m}x{n}x{k}", 2.0 * m * n * k, lambda a=a, b=b, out=out: torch.matmul(a, b, out=out))
        m = n = k = 2048
        x = torch.rand(m, k).to(dt) - 0.5
        w = torch.rand(n, k).to(dt) - 0.5
        bias = torch.rand(n).to(dt)
        yield (
            f"{dname}/fprop_bias_gelu_2048x2048x2048",
            2.0 * m * n * k,
            lambda x=x, w=w, bias=bias: torch.nn.functional.gelu(torch.addmm(bias, x, w.t()), approximate="tanh"),
        )
        groups, rows, k, n = 8, 512, 1024, 1024
        a = torch.rand(groups * rows, k).to(dt) - 0.5
        ws = torch.rand(groups, n, k).to(dt) - 0.5
        out = torch.empty(groups * rows, n, dtype=dt)

        def grouped(a=a, ws=ws, out=out):
            for g, (xa, xo) in enumerate(zip(torch.split(a, rows), torch.split(out, rows))):
                torch.matmul(xa, ws[g].t(), out=xo)

        yield (f"{dname}/grouped_8x512x1024x1024", 2.0 * groups * rows * n * k, grouped)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--cpu-time", action="store_true", help="CPU time of the process (time.process_time) per call")
    ap.add_argument("--filter", default="", help="only cases whose name contains this")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = []
    clock = time.process_time if args.cpu_time else time.perf_counter
    for name, flops, fn in cases():
        if args.filter not in name:
            continue
        runs = [time_ms(fn, clock=clock) for _ in range(args.repeats)]
        ms = statistics.median(runs)
        results.append({"case": name, "ms": ms, "gflops": flops / (ms * 1e6), "runs_ms": runs})
    if args.json:
        print(json.dumps({"torch": torch.__version__, "threads": args.threads, "results": results}, indent=1))
    else:
        print(f"torch {torch.__version__}, {args.threads} threads, median of {args.repeats}")
        for r in results:
            print(f"{r['case']:44s} {r['ms']:10.3f} ms {r['gflops']:9.1f} GFLOP/s")


if __name__ == "__main__":
    main()
