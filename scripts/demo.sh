#!/usr/bin/env bash
# The main job: builds tefl and runs the in-tree example (define an rmsnorm,
# register it as vendor.mybackend with priority 200, call it through the
# manager), with TE-FL's log lines.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/install-deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)" --target example_intree
./build/release/examples/intree/example_intree
