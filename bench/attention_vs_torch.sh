#!/bin/sh
# Side-by-side attention figures (docs/perf-attention.md): tefl's
# default.portable (bench_attention, 3 repetitions, medians) and torch 2.13
# CPU SDPA (torch_attention.py, 2 threads, median of 3), back to back per
# sequence length, then peak RSS of one fp32 forward at s = 8192.
# Usage: bench/attention_vs_torch.sh [build dir, default build/release] [out dir, default /tmp/attn_results]
set -e
B=${1:-build/release}
OUT=${2:-/tmp/attn_results}
mkdir -p "$OUT"
for S in 2048 512; do
  uptime > "$OUT/load_s$S.txt"
  "$B/bench/bench_attention" --benchmark_filter="BM_Attn.*/s$S/" --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_out="$OUT/tefl_s$S.json" --benchmark_out_format=json >/dev/null 2>&1
  python3 bench/torch_attention.py --json --repeats 3 --filter "/s$S/" > "$OUT/torch_s$S.json"
  uptime >> "$OUT/load_s$S.txt"
done
"$B/bench/bench_attention" --attn_rss=8192 2>/dev/null | grep '^{' > "$OUT/rss_tefl.json"
python3 bench/torch_attention.py --rss 8192 > "$OUT/rss_torch_sdpa.json"
python3 bench/torch_attention.py --rss 8192 --composition > "$OUT/rss_torch_composition.json"
echo "results in $OUT"
