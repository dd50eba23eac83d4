#!/usr/bin/env python3
"""Alternate `tefl bench` between two builds of libtefl and report per-op medians.

A before/after comparison on a shared machine: the machine's speed drifts over
minutes, so the two libraries are run in turn (A B, then B A, ...) with the same
`tefl bench` binary and arguments, each round one invocation per side. The
binary picks the library from LD_LIBRARY_PATH (the build tree's RUNPATH comes
after it), so A and B are directories holding a `libtefl.so.0`, e.g. copies of
build/release/libtefl.so.0 taken before and after a change.

Per op x implementation x dtype x shape: each side's median ms and range, and the median of the
per-round speed-ups (A ms / B ms; > 1: B faster).

    python3 bench/ab_rounds.py --a /tmp/before --b /tmp/after [--rounds 5]
        [--tefl build/release/tools/tefl/tefl] [--markdown] -- <tefl bench options>
"""
import argparse
import os
import statistics

from bench_table import add_round_args, parse_round_args, print_table, run_bench, timed_rows


def run_once(tefl, libdir, bench_args):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    return run_bench(tefl, bench_args, env=env, what=libdir)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="directory with the 'before' libtefl.so.0")
    ap.add_argument("--b", required=True, help="directory with the 'after' libtefl.so.0")
    add_round_args(ap, rounds=5)
    args, bench_args = parse_round_args(ap)
    for d in (args.a, args.b):
        if not os.path.isfile(os.path.join(d, "libtefl.so.0")):
            ap.error(f"{d} holds no libtefl.so.0")

    times = {}  # key -> {"a": [ms], "b": [ms]}
    order = []
    for r in range(args.rounds):
        sides = ("a", "b") if r % 2 == 0 else ("b", "a")
        for side in sides:
            res = run_once(args.tefl, getattr(args, side), bench_args)
            for k, row in timed_rows(res):
                if k not in times:
                    times[k] = {"a": [], "b": []}
                    order.append(k)
                times[k][side].append(1e3 * row["seconds"])

    head = ["op", "impl", "dtype", "shape", "A ms median (range)", "B ms median (range)", "A/B median (range)"]
    rows = []
    for k in order:
        a, b = times[k]["a"], times[k]["b"]
        ratios = [x / y for x, y in zip(a, b)]
        fmt = lambda v: f"{statistics.median(v):.4g} ({min(v):.4g}-{max(v):.4g})"
        rows.append([*k, fmt(a), fmt(b), f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})"])
    print_table(head, rows, args.markdown)
    print(f"({args.rounds} rounds, A = {args.a}, B = {args.b})")


if __name__ == "__main__":
    main()
