"""What the repeated-`tefl bench` scripts (bench_rounds.py, ab_rounds.py) share: their command line, one
`tefl bench --json` run, its timed rows, and a table printed as aligned columns or as Markdown."""
import argparse
import json
import subprocess
import sys


def add_round_args(ap, rounds):
    """--rounds, --tefl, --markdown and the `tefl bench` options after --."""
    ap.add_argument("--rounds", type=int, default=rounds)
    ap.add_argument("--tefl", default="build/release/tools/tefl/tefl")
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("bench_args", nargs=argparse.REMAINDER, help="after --: options for `tefl bench`")


def parse_round_args(ap):
    """(args, the `tefl bench` options); --rounds below 1 is an argument error."""
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    return args, args.bench_args[1:] if args.bench_args[:1] == ["--"] else args.bench_args


def run_bench(tefl, bench_args, env=None, what=""):
    """One `tefl bench --json` run's parsed output; exits naming `what` when it fails."""
    out = subprocess.run([tefl, "bench", "--json", *bench_args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"tefl bench failed{' with ' + what if what else ''} ({out.returncode}): {out.stderr.strip()}")
    return json.loads(out.stdout)


def timed_rows(result):
    """(op, impl, dtype, shape) and the row, for every row of a run that was timed."""
    for r in result["results"]:
        if "seconds" in r:
            shape = r["shape"] if isinstance(r["shape"], str) else "x".join(map(str, r["shape"]))
            yield (r["op"], r["impl"], r["dtype"], shape), r


def print_table(head, rows, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for row in [head, *rows]:
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
