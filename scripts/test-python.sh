#!/usr/bin/env bash
# Builds and installs the tefl Python package (pip install . through
# scikit-build-core, incremental in build/python-<tag>), then runs its pytest
# suite (python/tests) against the installed package. Installs what is
# missing first: nanobind, scikit-build-core, pytest, numpy, and torch 2.13
# (CPU) when torch is absent.
#
#   scripts/test-python.sh [pytest args...]      PYTHON=python3.11 to choose the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
start=$(date +%s)

# A root pip on Debian 12's system Python refuses to install without
# --break-system-packages (PEP 668: an EXTERNALLY-MANAGED marker next to the
# standard library); a virtualenv or pyenv interpreter has no marker.
PIP_FLAGS=(--quiet --disable-pip-version-check)
if "$PY" -c 'import os, sys, sysconfig; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
  PIP_FLAGS+=(--break-system-packages)
fi
pip_install() { "$PY" -m pip install "${PIP_FLAGS[@]}" "$@"; }

need=()
"$PY" -c "import nanobind" 2>/dev/null || need+=(nanobind)
"$PY" -c "import scikit_build_core" 2>/dev/null || need+=(scikit-build-core)
"$PY" -c "import pytest" 2>/dev/null || need+=(pytest)
"$PY" -c "import numpy" 2>/dev/null || need+=(numpy)
if [ ${#need[@]} -gt 0 ]; then
  echo "== installing ${need[*]}"
  pip_install "${need[@]}"
fi
if ! "$PY" -c "import torch" 2>/dev/null; then
  echo "== installing torch==2.13.0"
  pip_install torch==2.13.0
fi

echo "== building and installing the tefl package (pip install .)"
# No build isolation: the build tools are installed above, and the build tree
# build/python-<tag> is reused between runs (incremental).
# Warnings are errors here, as in the release preset (whose compile commands
# this build then matches: see scripts/test.sh on ccache).
pip_install --no-build-isolation -Ccmake.define.TEFL_WERROR=ON .

echo "== pytest python/tests"
# From the repository root the installed package is the one imported (python/
# is not on sys.path), so this tests what `pip install .` produced.
"$PY" -m pytest -q -p no:cacheprovider python/tests "$@"
echo "== test-python.sh: $(( $(date +%s) - start )) s"
