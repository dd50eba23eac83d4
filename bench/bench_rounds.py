#!/usr/bin/env python3
"""Run `tefl bench` several times and report per-op medians.

One `tefl bench` invocation times each op once (a median over --min-time) next to
the copy bandwidth it measured at its start. On a shared machine a whole
invocation can land in a disturbed stretch, and the copy baseline itself moves
between invocations (26-43 GB/s here). This script repeats the invocation and
reports, per op x implementation, the median time and the median of the rounds'
own "% of copy" (each round's op against that round's copy), with the range.

    python3 bench/bench_rounds.py [--rounds 3] [--tefl build/release/tools/tefl/tefl]
        [--markdown] -- <tefl bench options, e.g. --impl default.portable --dtype bf16 --op gelu>
"""
import argparse
import statistics

from bench_table import add_round_args, parse_round_args, print_table, run_bench, timed_rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_round_args(ap, rounds=3)
    args, bench_args = parse_round_args(ap)
    rows, copies, nt_copies = {}, [], []
    for _ in range(args.rounds):
        j = run_bench(args.tefl, bench_args)
        copies.append(j["copy_gbps"])
        if "stream_copy_gbps" in j:
            nt_copies.append(j["stream_copy_gbps"])
        for key, r in timed_rows(j):
            rows.setdefault(key, []).append((r["seconds"] * 1e3, r["gbps"], r["pct_of_copy"]))

    def span(v, fmt):
        return f"{fmt.format(statistics.median(v))} ({fmt.format(min(v))}-{fmt.format(max(v))})"

    head = ["op", "impl", "dtype", "shape", "ms median (range)", "GB/s median", "% of copy median (range)"]
    lines = []
    for (op, impl, dtype, shape), v in rows.items():
        ms, gbps, pct = zip(*v)
        lines.append([op, impl, dtype, shape, span(ms, "{:.3f}"), f"{statistics.median(gbps):.1f}",
                      span(pct, "{:.0f}")])
    copy_line = f"{args.rounds} rounds; copy {span(copies, '{:.1f}')} GB/s"
    if nt_copies:
        copy_line += f", NT copy {span(nt_copies, '{:.1f}')} GB/s"
    print(copy_line)
    print_table(head, lines, args.markdown)

if __name__ == "__main__":
    main()
