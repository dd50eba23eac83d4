#!/usr/bin/env bash
# Instructions per element of one op's kernel on bf16 data, one thread
# (repeatable: callgrind counts instructions, not time). The program runs
# the op 1 and 5 times; (I5 - I1) / 4 / elements is one warm call.
# Usage: bench/callgrind_kernel.sh OP [ROWS COLS [build dir]]
#   e.g. bench/callgrind_kernel.sh scaled_softmax_forward 128 2048
# LD_LIBRARY_PATH may point at another libtefl.so.0 to compare builds.
set -euo pipefail
op=$1
rows=${2:-64}
cols=${3:-4096}
build=${4:-build/release}
exe=$build/bench/kernel_instructions
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
count() {
  TEFL_NUM_THREADS=1 TEFL_LOG_LEVEL=ERROR valgrind --tool=callgrind --callgrind-out-file="$out/cg.$1" \
    "$exe" "$op" "$rows" "$cols" "$1" >"$out/stdout.$1" 2>"$out/stderr.$1" || { cat "$out/stderr.$1" >&2; exit 1; }
  callgrind_annotate "$out/cg.$1" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}'
}
i1=$(count 1)
i5=$(count 5)
printf '%-45s [%s, %s] %6.3f instructions per element (%s)\n' "$op" "$rows" "$cols" \
  "$(echo "($i5 - $i1) / 4 / ($rows * $cols)" | bc -l)" "$(tail -c 17 "$out/stdout.5" | tr -d '\n')"
