#!/usr/bin/env bash
# Installs what building and testing tefl needs, when it is missing:
# Debian 12 packages through apt. Safe to run again: does nothing when all is there.
set -euo pipefail

missing=()
need() {  # need PACKAGE: queue it unless dpkg has it installed
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing+=("$1")
}
# ocl-icd-opencl-dev: only a Recommends of libdnnl-dev, but Debian's
# dnnl-config.cmake finds OpenCL (library and headers) or fails, and the
# oneDNN plugin's build goes through it (--no-install-recommends below).
for p in g++ pkg-config libdlpack-dev libhwy-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev \
  ocl-icd-opencl-dev libopenblas-dev libcli11-dev ccache nlohmann-json3-dev python3 python3-pip python3-dev python3-matplotlib; do
  need "$p"
done
# A cmake (>= 3.25) or ninja already on PATH, e.g. from pip, serves as well as Debian's.
command -v cmake >/dev/null 2>&1 || need cmake
command -v ninja >/dev/null 2>&1 || need ninja-build

if ((${#missing[@]})); then
  echo "== installing: ${missing[*]}"
  sudo=""
  [ "$(id -u)" -eq 0 ] || sudo="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $sudo apt-get update -qq
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# `tefl bench --plot` runs python3 (the one on PATH) with matplotlib. When that
# python3 is not Debian's (pyenv, a virtualenv), give it matplotlib with pip.
if ! python3 -c "import matplotlib" 2>/dev/null; then
  echo "== installing matplotlib for $(command -v python3)"
  flags=(--quiet --disable-pip-version-check)
  if python3 -c 'import os, sys, sysconfig; sys.exit(0 if sys.prefix == sys.base_prefix and os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED")) else 1)'; then
    flags+=(--break-system-packages)
  fi
  python3 -m pip install "${flags[@]}" matplotlib
fi
