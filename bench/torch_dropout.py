#!/usr/bin/env python3
"""PyTorch CPU side of bench_dropout: torch.nn.functional.dropout (fused; its
mask stays internal, so it writes less than dropout_fwd, which also returns the
uint8 mask), torch.native_dropout (returns the bool mask too, like
dropout_fwd) and the fused backward aten.native_dropout_backward(grad, mask,
1 / (1 - p)), at [8192, 4096],
p = 0.1, 2 threads. Prints ms per call per case (median of --reps after one
warm-up); --json prints a JSON list instead. For information: tefl's mask is
Philox-4x32-10 (reproducible from seed and offset), torch's is its own CPU RNG.
"""
import argparse
import json
import time

import torch


def timeit(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    times.sort()
    return 1e3 * times[len(times) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = 0.1
    results = []
    for dname, dt in (("bf16", torch.bfloat16), ("fp32", torch.float32)):
        x = (torch.rand(8192, 4096) * 3 - 2).to(dt)
        mask = torch.rand(8192, 4096) >= p
        scale = 1.0 / (1.0 - p)
        cases = [
            ("dropout_fwd", lambda: torch.nn.functional.dropout(x, p, training=True)),
            ("dropout_fwd(native_dropout)", lambda: torch.native_dropout(x, p, True)),
            ("dropout_bwd", lambda: torch.ops.aten.native_dropout_backward(x, mask, scale)),
        ]
        for name, fn in cases:
            ms = timeit(fn, args.reps)
            results.append({"op": name, "dtype": dname, "shape": [8192, 4096], "ms": ms})
            if not args.json:
                print(f"torch/{name}/{dname}: {ms:.2f} ms", flush=True)
    if args.json:
        print(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
