#!/usr/bin/env python3
"""Markdown table of bench/attention_vs_torch.sh's results: per case tefl's
default.portable median ms, GFLOP/s, % of the sgemm rate measured around it,
torch SDPA ms and the time ratio torch / tefl (> 1: tefl faster).

Usage: python3 bench/attention_table.py [out dir, default /tmp/attn_results]
"""
import glob
import json
import os
import sys


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/attn_results"
    tefl = {}
    for path in sorted(glob.glob(os.path.join(out, "tefl_s*.json"))):
        for b in json.load(open(path))["benchmarks"]:
            if b.get("aggregate_name") != "median":
                continue
            parts = b["run_name"].split("/")  # BM_AttnFwd/fp32/s2048/d64/full/impl/...
            kind = "fwd" if parts[0] == "BM_AttnFwd" else "bwd"
            key = ("/".join(parts[1:5]), kind)
            tefl[key] = (b["real_time"], b["GFLOPS"] / 1e9 if b["GFLOPS"] > 1e6 else b["GFLOPS"], b.get("pct_of_gemm"),
                         b.get("gemm_GFLOPS"))
    torch = {}
    for path in sorted(glob.glob(os.path.join(out, "torch_s*.json"))):
        try:
            rows = json.load(open(path))
        except ValueError:  # still being written
            continue
        for row in rows:
            torch[(row["case"], "fwd")] = row["fwd_ms"]
            torch[(row["case"], "bwd")] = row["bwd_ms"]
    print("| case | pass | tefl ms | GFLOP/s | sgemm GFLOP/s | % of sgemm | torch ms | torch / tefl |")
    print("|---|---|---|---|---|---|---|---|")
    for (case, kind), (ms, gf, pct, gemm) in sorted(tefl.items(), key=lambda kv: (kv[0][1] != "fwd", kv[0][0])):
        t = torch.get((case, kind))
        pct_s = f"{pct:.0f}" if pct is not None else "-"
        gemm_s = f"{gemm:.1f}" if gemm is not None else "-"
        ratio = f"{t / ms:.2f}" if t else "-"
        t_s = f"{t:.1f}" if t else "-"
        print(f"| {case} | {kind} | {ms:.1f} | {gf:.1f} | {gemm_s} | {pct_s} | {t_s} | {ratio} |")
    for name in ("rss_tefl", "rss_torch_sdpa", "rss_torch_composition"):
        path = os.path.join(out, name + ".json")
        if os.path.exists(path):
            r = json.loads(open(path).read().strip().splitlines()[-1])
            print(f"\n{name}: before {r['rss_before_mib']:.0f} MiB, peak {r['rss_peak_mib']:.0f} MiB "
                  f"(+{r['rss_peak_mib'] - r['rss_before_mib']:.0f} MiB)", end="")
    print()


if __name__ == "__main__":
    main()
