#!/usr/bin/env python3
"""Python dispatch overhead: OpManager.call versus calling the chosen
implementation directly, on small tensors, in the same run.

    python bench/python_overhead.py [--rows 4] [--hidden 64] [--repeat 15] [--number 20000] [--json]

Measures, per call (the fastest of --repeat interleaved rounds of --number calls):
  direct      the chosen implementation's OpImpl.fn (native: the same
              argument binding, output allocation and DLPack conversion as
              the manager, then that kernel alone)
  manager     OpManager.call("rmsnorm_fwd", ...) (name lookup, policy
              context, libtefl's validation, cached resolution, dispatch)
  function    manager.function("rmsnorm_fwd") (the bound op, no name lookup)
  tefl.<op>   the package function (default manager)
The overhead is manager - direct. The same for a Python implementation
(direct = the Python function itself; manager adds output allocation, the
C++ round trip and storing the results), and with preallocated outputs.
"""
import argparse
import json
import sys
import time

import numpy as np
import torch

import tefl
from tefl import OpImpl


def per_call(fn, number):
    t0 = time.perf_counter_ns()
    for _ in range(number):
        fn()
    return (time.perf_counter_ns() - t0) / number / 1000.0  # us


def bench(cases, repeat, number):
    """Interleaved rounds (each case once per round); the fastest round of
    each case (the least disturbed by other work on a shared machine)."""
    samples = {k: [] for k in cases}
    for fn in cases.values():  # warm up (resolution, caches)
        for _ in range(200):
            fn()
    for _ in range(repeat):
        for k, fn in cases.items():
            samples[k].append(per_call(fn, number))
    return {k: min(v) for k, v in samples.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=25)
    ap.add_argument("--number", type=int, default=5000)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    torch.set_num_threads(1)

    manager = tefl.OpManager(tefl.OpRegistry())
    manager.ensure_initialized()
    x, w = torch.randn(a.rows, a.hidden), torch.randn(a.hidden)
    xn, wn = x.numpy(), w.numpy()
    op = "rmsnorm_fwd"
    manager.call(op, x, w)
    chosen = manager.registry.get_implementation(op, manager.get_selected_impl_id(op))
    f = manager.function(op)
    z, rs = torch.empty_like(x), torch.empty(a.rows)
    results = {"chosen": chosen.impl_id, "shape": [a.rows, a.hidden]}

    native = bench({
        "direct": lambda: chosen.fn(x, w),
        "manager": lambda: manager.call(op, x, w),
        "function": lambda: f(x, w),
        "tefl.op": lambda: tefl.rmsnorm_fwd(x, w),
        "direct_out": lambda: chosen.fn(x, w, 1e-5, z, out=(None, rs)),
        "manager_out": lambda: manager.call(op, x, w, 1e-5, z, out=(None, rs)),
        "direct_numpy": lambda: chosen.fn(xn, wn),
        "manager_numpy": lambda: manager.call(op, xn, wn),
    }, a.repeat, a.number)
    results["native"] = native

    rs_const = torch.ones(a.rows)

    def my_rmsnorm(input, weight, eps=1e-5, **kwargs):
        return input, rs_const  # minimal body: measures dispatch, not maths

    manager.registry.register_impl(OpImpl(op, "vendor.py", "vendor", my_rmsnorm, vendor="py", priority=200))
    with tefl.with_preference("vendor"):
        manager.call(op, x, w)
        assert manager.get_selected_impl_id(op) == "vendor.py"
        py = bench({
            "direct": lambda: my_rmsnorm(x, w),
            "manager": lambda: manager.call(op, x, w),
            "manager_out": lambda: manager.call(op, x, w, 1e-5, z, out=(None, rs)),
        }, a.repeat, a.number // 4)
    results["python_impl"] = py

    if a.json:
        json.dump(results, sys.stdout, indent=2)
        print()
        return
    print(f"rmsnorm_fwd on torch float32 {a.rows}x{a.hidden}, chosen '{chosen.impl_id}' "
          f"(torch {torch.__version__}, numpy {np.__version__}); microseconds per call")
    print(f"  native  direct (impl.fn)         {native['direct']:7.3f}")
    print(f"  native  OpManager.call           {native['manager']:7.3f}   overhead "
          f"{native['manager'] - native['direct']:+.3f}")
    print(f"  native  manager.function(op)     {native['function']:7.3f}   overhead "
          f"{native['function'] - native['direct']:+.3f}")
    print(f"  native  tefl.rmsnorm_fwd         {native['tefl.op']:7.3f}   overhead "
          f"{native['tefl.op'] - native['direct']:+.3f}")
    print(f"  native  direct, outputs given    {native['direct_out']:7.3f}")
    print(f"  native  manager, outputs given   {native['manager_out']:7.3f}   overhead "
          f"{native['manager_out'] - native['direct_out']:+.3f}")
    print(f"  native  direct numpy             {native['direct_numpy']:7.3f}")
    print(f"  native  manager numpy            {native['manager_numpy']:7.3f}   overhead "
          f"{native['manager_numpy'] - native['direct_numpy']:+.3f}")
    print(f"  python  direct (the function)    {py['direct']:7.3f}")
    print(f"  python  OpManager.call           {py['manager']:7.3f}   overhead {py['manager'] - py['direct']:+.3f}")
    print(f"  python  manager, outputs given   {py['manager_out']:7.3f}   overhead "
          f"{py['manager_out'] - py['direct']:+.3f}")


if __name__ == "__main__":
    main()
