#!/usr/bin/env bash
# Builds and runs every test: the release build (unit, conformance, the
# `tefl` command, the in-tree example), the Python package (pytest), then
# AddressSanitizer + UndefinedBehaviorSanitizer over every test, then
# ThreadSanitizer over the concurrency tests.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh

jobs=$(nproc)
# ccache, when installed (install-deps.sh installs it), lets the Python
# package's build reuse the release build's objects: same sources, same flags
# (pyproject.toml), paths made relative to the repository root, the build
# directory's name left out of the hash. Only on a first configure of a build
# directory does CMake take the launcher from the environment.
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1
  export CMAKE_C_COMPILER_LAUNCHER=ccache CMAKE_CXX_COMPILER_LAUNCHER=ccache
  # One compiler name for every build (ccache hashes it): CMake alone picks
  # c++, the build under pip g++, the same binary on Debian.
  export CC="${CC:-gcc}" CXX="${CXX:-g++}"
fi
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
