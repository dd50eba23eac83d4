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
import json
import os
import statistics
import subprocess
import sys

from bench_table import print_table


def run_once(tefl, libdir, bench_args):
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = libdir + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
    out = subprocess.run([tefl, "bench", "--json", *bench_args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tefl bench failed with {libdir}:\n{out.stderr}")
    return json.loads(out.stdout)


def key(row):
    return (row["op"], row["impl"], row["dtype"], row["shape"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--a", required=True, help="directory with the 'before' libtefl.so.0")
    ap.add_argument("--b", required=True, help="directory with the 'after' libtefl.so.0")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--tefl", default="build/release/tools/tefl/tefl")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: options for `tefl bench`")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    for d in (args.a, args.b):
        if not os.path.isfile(os.path.join(d, "libtefl.so.0")):
            ap.error(f"{d} holds no libtefl.so.0")
    bench_args = args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args

    times = {}  # key -> {"a": [ms], "b": [ms]}
    order = []
    for r in range(args.rounds):
        sides = ("a", "b") if r % 2 == 0 else ("b", "a")
        for side in sides:
            res = run_once(args.tefl, getattr(args, side), bench_args)
            for row in res["results"]:
                k = key(row)
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
