#!/usr/bin/env python3
"""Draws `tefl bench` results as a roofline-style chart.

usage: plot_bench.py DATA.json OUT.png

Each point is one op x implementation: achieved bandwidth (GB/s, bytes of
every input and output per second) against bytes moved per call; the
horizontal line is the copy bandwidth measured in the same run, the roof a
memory-bound kernel can reach. One colour per implementation.
"""
import json
import sys


def main() -> int:
    if len(sys.argv) != 3:
        print(__doc__.strip().splitlines()[2], file=sys.stderr)
        return 2
    with open(sys.argv[1]) as f:
        data = json.load(f)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plot_bench.py: matplotlib is not installed (apt-get install python3-matplotlib)", file=sys.stderr)
        return 1
    rows = [r for r in data["results"] if "gbps" in r]
    if not rows:
        print("plot_bench.py: no measured result to plot", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(10, 6))
    impls = sorted({r["impl"] for r in rows})
    markers = "osD^v<>p*"
    for k, impl in enumerate(impls):
        pts = [r for r in rows if r["impl"] == impl]
        ax.scatter([r["bytes"] for r in pts], [r["gbps"] for r in pts], label=impl, marker=markers[k % len(markers)],
                   s=40)
        for r in pts:
            ax.annotate(r["op"], (r["bytes"], r["gbps"]), fontsize=6, xytext=(3, 2), textcoords="offset points")
    x0 = min(r["bytes"] for r in rows)
    copy = data["copy_gbps"]
    ax.axhline(copy, color="black", linestyle=":", linewidth=1)
    ax.text(x0, copy * 1.02, f"memcpy bandwidth {copy:.1f} GB/s", fontsize=8)
    # The memory roof: the copy with non-temporal stores where it was measured.
    roof = data.get("stream_copy_gbps", copy)
    if "stream_copy_gbps" in data:
        ax.axhline(roof, color="black", linestyle="--", linewidth=1)
        ax.text(x0, roof * 1.02, f"copy with non-temporal stores {roof:.1f} GB/s (memory roof)", fontsize=8)
    ax.set_xscale("log")
    ax.set_xlabel("bytes moved per call (inputs + outputs)")
    ax.set_ylabel("achieved GB/s")
    dtype = rows[0]["dtype"]
    ax.set_title(f"tefl bench: {len(rows)} op x implementation results, {dtype}, {data['threads']} threads")
    ax.set_ylim(0, max(roof, max(r["gbps"] for r in rows)) * 1.15)
    ax.legend(fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    fig.savefig(sys.argv[2], dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
