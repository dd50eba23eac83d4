#!/usr/bin/env bash
# The main job: builds tefl and the `tefl` command, then runs `tefl demo`:
# one GPT-style transformer layer forward and backward, every op tefl has
# through the manager, with a per-op table (implementation that ran, calls,
# time, error against the same layer on reference.cpp) and tokens per second.
# Extra arguments go to `tefl demo` (e.g. --seq 256 --dtype bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target tefl_cli
./build/release/tools/tefl/tefl demo "$@"
