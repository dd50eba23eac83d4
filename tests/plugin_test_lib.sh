# Shared by the tests that build an out-of-tree plugin against an installed
# tefl (plugin_install_test.sh, plugin_onednn_test.sh). Source it, then:
#   plugin_test_setup NAME "$@"     parse BINARY_DIR SOURCE_DIR [SANITIZERS], make $tmp
#   install_tefl [quiet]            install the build tree into $prefix; sets $libdir
#   build_plugin SUBDIR SONAME      configure + build plugins/SUBDIR from $prefix alone;
#                                   sets $plugin_build and $so; checks its exports

step() { printf '\n==== %s\n' "$*"; }
fail() {
  echo "FAIL: $*" >&2
  exit 1
}

plugin_test_setup() {
  local name=$1
  shift
  if [[ $# -lt 2 || $# -gt 3 ]]; then
    echo "usage: $0 BINARY_DIR SOURCE_DIR [SANITIZERS]" >&2
    exit 2
  fi
  bin_dir=$(cd "$1" && pwd)
  src_dir=$(cd "$2" && pwd)
  sanitizers="${3:-}"
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/tefl-$name.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  prefix="$tmp/prefix"
  plugin_build="$tmp/plugin-build"
  start=$SECONDS
}

install_tefl() {
  step "install $bin_dir into $prefix"
  if [[ "${1:-}" == quiet ]]; then
    cmake --install "$bin_dir" --prefix "$prefix" >/dev/null
  else
    cmake --install "$bin_dir" --prefix "$prefix"
  fi
  # The library directory (lib, or lib/<multiarch> for a /usr-like layout).
  local libtefl
  libtefl=$(find "$prefix" -name 'libtefl.so' | head -n 1)
  [[ -n "$libtefl" ]] || fail "no libtefl.so under $prefix"
  libdir=$(dirname "$libtefl")
  [[ -f "$prefix/include/tefl/tefl.h" ]] || fail "tefl headers not installed under $prefix"
}

build_plugin() {
  local subdir=$1 soname=$2
  step "configure plugins/$subdir against $prefix"
  # Only the prefix: no package registry, so the build tree cannot be found.
  cmake -S "$src_dir/plugins/$subdir" -B "$plugin_build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF ||
    fail "configuring plugins/$subdir failed (are its dependencies installed? scripts/install-deps.sh)"
  local tefl_dir
  tefl_dir=$(sed -n 's/^tefl_DIR:[A-Z]*=//p' "$plugin_build/CMakeCache.txt")
  [[ "$tefl_dir" == "$prefix"/* ]] || fail "plugin build found tefl at '$tefl_dir', not in $prefix"
  echo "tefl_DIR=$tefl_dir"

  step "build plugins/$subdir"
  cmake --build "$plugin_build" || fail "building plugins/$subdir failed"
  so="$plugin_build/$soname"
  [[ -f "$so" ]] || fail "plugin not built: $so"

  step "exported symbols of $soname"
  # Absolute (A) symbols are linker bookkeeping (_end, __bss_start...) on old binutils.
  local exported
  exported=$(nm -D --defined-only "$so" | awk '$2 != "A" { print $3 }' | sort | tr '\n' ' ')
  echo "$exported"
  [[ "$exported" == "tefl_plugin_info tefl_plugin_register " ]] ||
    fail "the plugin must export exactly tefl_plugin_info and tefl_plugin_register, got: $exported"
  if nm -D --undefined-only "$so" | grep -q ' tefl_'; then
    fail "the plugin needs libtefl symbols; it should reach the host through the services table only"
  fi
}
