#!/usr/bin/env python3
"""PyTorch CPU timings of the activation ops, at bench_activation's sizes.

Same cases as bench/bench_activation.cpp: [8192, 4096] (gated inputs [8192,
8192]) in fp32 and bf16, values in [-2, 1), torch.set_num_threads(2) (or
--threads). torch's fused op where one exists (F.gelu(approximate='tanh'),
F.silu, F.relu, aten.gelu_backward); otherwise the composition of the same
maths (swiglu = F.silu(a) * b, geglu = F.gelu(a, 'tanh') * b, dswiglu and
dbias_dgelu written out). Two timings per case: "alloc", the call as torch
code makes it (fresh outputs every call), and "out", the same kernels writing
into preallocated outputs through the aten out= overloads (what
bench_activation measures on the tefl side; the compositions dswiglu and
dbias_dgelu allocate their temporaries either way).

Prints ms per call (median of --reps timed batches) per case; --json prints
one JSON object {"threads": n, "cases": {"<op>/<dtype>": {"alloc": ms,
"out": ms}, ...}}.

    python3 bench/torch_activation.py [--json] [--threads 2] [--reps 5]
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F

ROWS, HIDDEN = 8192, 4096


def data(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g) * 3.0 - 2.0).to(dtype)


def dswiglu(grad, x):
    a, b = x.chunk(2, dim=-1)
    s = torch.sigmoid(a)
    act = a * s
    dact = s + act * (1 - s)  # silu'(a) = s + a s (1 - s)
    return torch.cat((grad * dact * b, grad * act), dim=-1)


def dbias_dgelu(grad, x):
    dx = torch.ops.aten.gelu_backward(grad, x, approximate="tanh")
    return dx, dx.sum(dim=0, dtype=torch.float32)


def cases(dtype):
    """{op: (allocating call, preallocated call)}"""
    aten = torch.ops.aten
    x = data((ROWS, HIDDEN), dtype, 1)
    x2 = data((ROWS, 2 * HIDDEN), dtype, 2)
    g = data((ROWS, HIDDEN), dtype, 3)
    a, b = x2.chunk(2, dim=-1)
    y = torch.empty((ROWS, HIDDEN), dtype=dtype)
    t = torch.empty((ROWS, HIDDEN), dtype=dtype)

    def gated(act):
        return lambda: act(a) * b

    def gated_out(act_out):
        def run():
            act_out(a, t)
            return torch.mul(t, b, out=y)

        return run

    return {
        "gelu": (lambda: F.gelu(x, approximate="tanh"), lambda: aten.gelu.out(x, approximate="tanh", out=y)),
        "silu": (lambda: F.silu(x), lambda: aten.silu.out(x, out=y)),
        "relu": (lambda: F.relu(x), lambda: torch.clamp_min(x, 0, out=y)),
        "swiglu": (gated(F.silu), gated_out(lambda v, o: aten.silu.out(v, out=o))),
        "geglu": (
            gated(lambda v: F.gelu(v, approximate="tanh")),
            gated_out(lambda v, o: aten.gelu.out(v, approximate="tanh", out=o)),
        ),
        "dgelu": (
            lambda: aten.gelu_backward(g, x, approximate="tanh"),
            lambda: aten.gelu_backward.grad_input(g, x, approximate="tanh", grad_input=y),
        ),
        "dswiglu": (lambda: dswiglu(g, x2),) * 2,
        "dbias_dgelu": (lambda: dbias_dgelu(g, x),) * 2,
    }


def time_ms(fn, reps, min_batch_s=0.2):
    fn()  # warm up (allocator, code paths)
    n = 1
    while True:  # calls per batch: enough for min_batch_s
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        dt = time.perf_counter() - t0
        if dt >= min_batch_s or n >= 1 << 12:
            break
        n *= 2
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        samples.append((time.perf_counter() - t0) / n * 1e3)
    return statistics.median(samples)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    results = {}
    with torch.no_grad():
        for dtype, name in ((torch.float32, "fp32"), (torch.bfloat16, "bf16")):
            for op, (alloc, out) in cases(dtype).items():
                r = {"alloc": time_ms(alloc, args.reps), "out": time_ms(out, args.reps)}
                results[f"{op}/{name}"] = r
                if not args.json:
                    print(f"{op:12s} {name:5s} alloc {r['alloc']:9.3f} ms/call   out {r['out']:9.3f} ms/call", flush=True)
    if args.json:
        print(json.dumps({"threads": args.threads, "torch": torch.__version__, "cases": results}))


if __name__ == "__main__":
    main()
