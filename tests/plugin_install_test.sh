#!/usr/bin/env bash
# plugin_install_test.sh BINARY_DIR SOURCE_DIR [SANITIZERS]
#
# The installed package end to end: install the built tree into a temporary
# prefix, build the out-of-tree example plugin (plugins/example) against that
# prefix alone, check the plugin's exported symbols, the pkg-config file and a
# C11 consumer of the installed headers and library, then load the plugin with
# tests/plugin_load_check (vendor routing and agreement with the reference).
set -euo pipefail

# shellcheck source=plugin_test_lib.sh
source "$(dirname "$0")/plugin_test_lib.sh"
plugin_test_setup plugin-install "$@"
# A sanitized libtefl needs its sanitizer runtime first in the consumer program.
san_flags=""
if [[ -n "$sanitizers" ]]; then san_flags="-fsanitize=$sanitizers"; fi

install_tefl
find "$prefix" | sort
for f in "$prefix/include/tefl/ops.h" "$libdir/cmake/tefl/teflConfig.cmake" \
  "$libdir/cmake/tefl/teflConfigVersion.cmake" "$libdir/cmake/tefl/teflTargets.cmake" "$libdir/pkgconfig/tefl.pc"; do
  [[ -f "$f" ]] || fail "not installed: $f"
done
[[ -d "$libdir/tefl/plugins" ]] || fail "plugin directory not installed: $libdir/tefl/plugins"

build_plugin example libtefl_plugin_myvendor.so

step "install the plugin into a staging prefix"
cmake --install "$plugin_build" --prefix "$tmp/plugin-prefix"
installed_so=$(find "$tmp/plugin-prefix" -name libtefl_plugin_myvendor.so)
[[ "$installed_so" == "$tmp/plugin-prefix/${libdir#"$prefix"/}/tefl/plugins/libtefl_plugin_myvendor.so" ]] ||
  fail "plugin installed at '$installed_so', expected <prefix>/${libdir#"$prefix"/}/tefl/plugins"

step "pkg-config"
export PKG_CONFIG_PATH="$libdir/pkgconfig"
pc_flags=$(pkg-config --cflags --libs tefl)
plugindir=$(pkg-config --variable=plugindir tefl)
echo "cflags/libs: $pc_flags"
echo "plugindir:   $plugindir"
[[ "$pc_flags" == *"-I$prefix/include"* ]] || fail "pkg-config --cflags lacks -I$prefix/include"
[[ "$pc_flags" == *"-L$libdir"* && "$pc_flags" == *"-ltefl"* ]] || fail "pkg-config --libs lacks -L$libdir -ltefl"
[[ "$plugindir" == "$libdir/tefl/plugins" ]] || fail "plugindir is '$plugindir', expected $libdir/tefl/plugins"
[[ "$(pkg-config --modversion tefl)" == "$(sed -n 's/^set(PACKAGE_VERSION "\(.*\)")$/\1/p' \
  "$libdir/cmake/tefl/teflConfigVersion.cmake")" ]] || fail "pkg-config and CMake package versions differ"

step "C11 consumer built with pkg-config flags"
cat >"$tmp/consumer.c" <<'EOF'
#include <stdio.h>
#include <tefl/ops.h>
#include <tefl/tefl.h>

int main(void) {
  const tefl_host_services* host = tefl_host();
  if (host == NULL || host->abi_major != TEFL_ABI_MAJOR) return 1;
  if (tefl_op_id("rmsnorm_fwd") != TEFL_OP_RMSNORM_FWD) return 2;
  float x[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, z[4] = {0}, rs[1] = {0};
  int64_t xs[2] = {1, 4}, gs[1] = {4}, rss[1] = {1};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
  DLTensor tg = {g, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, gs, NULL, 0};
  DLTensor tz = {z, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
  DLTensor trs = {rs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, rss, NULL, 0};
  const DLTensor* in[2] = {&tx, &tg};
  DLTensor* out[2] = {&tz, &trs};
  tefl_status* s = tefl_call(TEFL_OP_RMSNORM_FWD, in, 2, out, 2, NULL, NULL);
  if (s != NULL) {
    fprintf(stderr, "tefl_call: %s\n", tefl_status_message(s));
    tefl_status_free(s);
    return 3;
  }
  printf("consumer ok: rsigma %.6f z[3] %.6f\n", rs[0], z[3]);
  return 0;
}
EOF
# shellcheck disable=SC2086 # pkg-config output and san_flags are lists of flags
"${CC:-cc}" -std=c11 -Wall -Wextra -Wpedantic -Werror $san_flags -o "$tmp/consumer" "$tmp/consumer.c" $pc_flags
LD_LIBRARY_PATH="$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$tmp/consumer"

step "load the plugin: tests/plugin_load_check"
checker="$bin_dir/tests/plugin_load_check"
[[ -x "$checker" ]] ||
  fail "$checker is missing: build the plugin_load_check target (tests/CMakeLists.txt) before running this test"
TE_FL_PLUGIN_MODULES="$so" TE_FL_PREFER=vendor "$checker" "$so"

step "the installed tefl: runs without LD_LIBRARY_PATH, finds plugins in <libdir>/tefl/plugins"
# The prefix is not the configured one (cmake --install --prefix): the
# command's RPATH and libtefl's plugin directory are both relative to where
# they were installed.
tefl_cmd="$prefix/bin/tefl"
[[ -x "$tefl_cmd" ]] || fail "the tefl command is not installed at $tefl_cmd"
cp "$so" "$libdir/tefl/plugins/"
listed=$(env -u LD_LIBRARY_PATH -u TE_FL_PLUGIN_MODULES -u TE_FL_PLUGIN_PATH "$tefl_cmd" impls rmsnorm_fwd) ||
  fail "the installed tefl did not run: $listed"
echo "$listed"
[[ "$listed" == *"vendor.myvendor"*"$libdir/tefl/plugins/libtefl_plugin_myvendor.so"* ]] ||
  fail "the installed tefl did not discover the plugin copied into $libdir/tefl/plugins"
rm "$libdir/tefl/plugins/libtefl_plugin_myvendor.so"

step "PASS"
