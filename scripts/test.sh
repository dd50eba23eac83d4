#!/usr/bin/env bash
# Builds and runs every test: the release build (unit, conformance, the
# `tefl` command, the in-tree example), the Python package (pytest), then
# AddressSanitizer + UndefinedBehaviorSanitizer over every test, then
# ThreadSanitizer over the concurrency tests.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

jobs=$(nproc)
run_preset() {
  local preset=$1
  echo "== [$preset] configure + build"
  cmake --preset "$preset" >/dev/null
  cmake --build --preset "$preset" -j "$jobs"
  echo "== [$preset] test"
  ctest --preset "$preset" -j "$jobs"
}

run_preset release
echo "== [release] in-tree example"
./build/release/examples/intree/example_intree
echo "== [python] build the package, pytest"
./scripts/test-python.sh
run_preset asan
run_preset tsan
echo "== all test runs passed"
