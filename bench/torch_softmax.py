#!/usr/bin/env python3
"""PyTorch CPU side of bench_softmax: the same ops on the same sizes.

  scaled_softmax_forward         torch.softmax(x * scale, -1)                      (fused op)
  scaled_masked_softmax_forward  x.masked_fill(mask, -10000) then softmax          (composition)
  upper_triang / aligned causal  masked_fill with a triu mask (diagonal 1 /
                                 sk - sq + 1) then softmax                         (composition)
  scaled_softmax_backward        torch._softmax_backward_data(dy, y, -1, dtype) * scale  (fused)

Sizes as bench_softmax: [b, 16, 2048, 2048] (b = 4, or --b / TEFL_BENCH_SOFTMAX_B),
upper-triangular [b * 16, 2048, 2048], mask [b, 1, 2048, 2048]; 2 threads.
Prints ms per call per case (median of --reps timed calls after one warm-up);
--json prints a JSON list instead.
"""
import argparse
import json
import os
import time

import torch


def timeit(fn, reps):
    fn()  # warm-up: allocations, first-touch
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--b", type=int, default=int(os.environ.get("TEFL_BENCH_SOFTMAX_B", "4")))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--dtypes", default="bf16,fp32")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    b, h, s = args.b, 16, 2048
    scale = 0.125
    results = []
    for dname in args.dtypes.split(","):
        dt = {"bf16": torch.bfloat16, "fp32": torch.float32, "fp16": torch.float16}[dname]
        g = torch.Generator().manual_seed(0)
        x = (torch.rand(b, h, s, s, generator=g) * 3 - 2).to(dt)
        mask = torch.rand(b, 1, s, s, generator=g) < 0.2
        triu = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1)  # sq == sk: both causal forms
        x3 = x.view(b * h, s, s)
        y = torch.softmax(x * scale, -1)
        dy = (torch.rand(b, h, s, s, generator=g) - 0.5).to(dt)
        cases = [
            ("scaled_softmax_forward", lambda: torch.softmax(x * scale, -1)),
            ("scaled_masked_softmax_forward", lambda: torch.softmax((x * scale).masked_fill(mask, -10000.0), -1)),
            ("scaled_upper_triang_masked_softmax_forward",
             lambda: torch.softmax((x3 * scale).masked_fill(triu, float("-inf")), -1)),
            ("scaled_aligned_causal_masked_softmax_forward",
             lambda: torch.softmax((x * scale).masked_fill(triu, float("-inf")), -1)),
            ("scaled_softmax_backward", lambda: torch._softmax_backward_data(dy, y, -1, dt) * scale),
        ]
        for name, fn in cases:
            ms = timeit(fn, args.reps)
            results.append({"op": name, "dtype": dname, "shape": [b, h, s, s], "ms": ms})
            if not args.json:
                print(f"torch/{name}/{dname}: {ms:.1f} ms", flush=True)
        del x, y, dy, x3, mask
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
