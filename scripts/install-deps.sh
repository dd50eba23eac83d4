#!/usr/bin/env bash
# Installs what building and testing tefl needs, when it is missing:
# Debian 12 packages through apt. Safe to run again: does nothing when all is there.
set -euo pipefail

missing=()
need() {  # need PACKAGE: queue it unless dpkg has it installed
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" || missing+=("$1")
}
for p in g++ pkg-config libdlpack-dev libhwy-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev libdnnl-dev \
  libcli11-dev nlohmann-json3-dev; do
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
