#!/usr/bin/env bash
# Instructions per call of the dispatch path (repeatable: callgrind counts
# instructions, not time). Usage: bench/callgrind_dispatch.sh [build dir]
set -euo pipefail
build=${1:-build/release}
exe=$build/bench/dispatch_instructions
out=$(mktemp -d)
calls=10000
for loop in LoopValidate LoopValidateMemo LoopManagerCall LoopPreparedRun LoopPreparedRunNewPointers LoopKernelDirect; do
  TEFL_LOG_LEVEL=ERROR valgrind --tool=callgrind --callgrind-out-file="$out/$loop" \
    --toggle-collect="*${loop}(*" "$exe" >/dev/null 2>&1
  total=$(callgrind_annotate "$out/$loop" | awk '/PROGRAM TOTALS/ {gsub(",", "", $1); print $1}')
  printf '%-27s %8.1f instructions per call\n' "$loop" "$(echo "$total / $calls" | bc -l)"
done
rm -rf "$out"
