#!/usr/bin/env bash
# Regenerates docs/cli.md: the `tefl` command's reference with the real output
# of each example, run from the release build (and the test plugins it builds).
#   cmake --preset release && cmake --build --preset release && scripts/gen-cli-doc.sh
set -euo pipefail
cd "$(dirname "$0")/.."
tefl=build/release/tools/tefl/tefl
[[ -x $tefl ]] || { echo "build the release preset first" >&2; exit 1; }
# Every example is run exactly as shown (from the source tree, with the
# release build's tefl first on PATH), so the page never shows a command
# other than the one that produced the output.
PATH=$PWD/build/release/tools/tefl:$PATH
export PATH
out=docs/cli.md
unset TE_FL_PREFER TE_FL_PREFER_VENDOR TE_FL_STRICT TE_FL_PER_OP TE_FL_ALLOW_VENDORS TE_FL_DENY_VENDORS \
  TE_FL_PLUGIN_MODULES TEFL_LOG_LEVEL TE_FL_VERBOSE

# run 'command': prints a fenced block with the command as shown and the
# output of running that very text with bash (the source tree's absolute path
# removed from the output).
run() {
  local shown=$1
  echo '```console'
  echo "\$ $shown"
  local rc=0
  bash -c "set -o pipefail; $shown 2>&1 | sed 's|$PWD/||g'" || rc=$?
  ((rc == 0)) || echo "(exit status $rc)"
  echo '```'
}
# The test plugins as the examples name them: an absolute path (--plugin
# refuses a relative one), written with $PWD so that it works as shown.
plugins='"$PWD"/build/release/tests/plugins'
# Output quoted in the prose, from real runs too: the version line, and the
# error of an explain --shape too big to allocate (under a 16 GiB ulimit -v, so
# that it is refused on any machine), up to its parenthesis.
version=$(tefl --version)
rc=0
too_big=$(ulimit -v $((16 << 20)) && tefl explain gelu --shape 131072,65536 2>&1) || rc=$?
((rc == 2)) || { echo "tefl explain gelu --shape 131072,65536 under ulimit -v: status $rc, not 2" >&2; exit 1; }
too_big=${too_big#tefl: error: }
too_big=${too_big%% (*}


{
  cat <<'MD'
# The `tefl` command

`tefl` is what a person types first and what a vendor runs to prove a plugin.
Every command has `--help`; every command that prints a table has `--json`;
MD
  echo "\`tefl --version\` prints tefl's version and the plugin C ABI version it serves"
  echo "(\`$version\`)."
  cat <<'MD'
Exit status 0 on success; otherwise one line `tefl: error: <reason>` on stderr
and status 2 for bad usage (an unknown command, option, op, implementation id,
dtype or device, a malformed `--shape`/`--size`, an out-of-range value, a shape
or dtype of which `explain` or `check --op` can build no call) or 1 when the
command failed: a `--plugin` that does not load (one named in `TE_FL_PLUGIN_MODULES` is a
WARNING, as for any tefl program), a failing `check` case, an `explain` whose
call cannot be resolved (its report is printed first), an `impls` whose policy
leaves an op nothing to pick (likewise), a `bench` row that could
not be run (the table, with each reason, is printed first). The library's own
INFO log lines are off unless `TEFL_LOG_LEVEL` is set.

Commands take `--plugin NAME|PATH` (repeatable) to load a plugin first: a name
looked up in `TE_FL_PLUGIN_PATH` and the installed plugin directory, or an
absolute path (a relative path is refused); `TE_FL_PLUGIN_MODULES` and the
installed plugin directory work as for any tefl program. All output below is
real, produced by `scripts/gen-cli-doc.sh` on this machine (2 cores), which
runs each command exactly as shown, from the source tree after
`cmake --build --preset release`, with `build/release/tools/tefl` on `PATH`
(hence the test plugins' `"$PWD"/build/release/tests/plugins/...`).

A `--shape`/`--size` is non-negative decimal sizes separated by commas
(`8192,4096`), or by `x` (`8192x4096`) but not both in one shape, optionally in
brackets (`[8192, 4096]`); `0x10` is refused, as it reads as a hexadecimal
number as much as the sizes 0 and 10. An `--impl` must name a registered
implementation (a loaded `--plugin`'s count); the error lists them.

| command | what it does |
|---|---|
| `tefl ops [OP]` | the op catalogue from the schemas: inputs, outputs, attributes, dtypes, defaults |
| `tefl impls [OP]` | registered implementations and which one the policy in force picks |
| `tefl explain OP` | the full resolution of one call: policy and its sources, every candidate and why |
| `tefl check` | the conformance suite: every implementation on the built-in grid against reference.cpp |
| `tefl bench` | time, GB/s and % of this machine's copy bandwidth per op x implementation |
| `tefl demo` | one transformer layer forward and backward through tefl (the README's main command) |

## tefl ops
MD
  run "tefl ops --family normalization"
  run "tefl ops scaled_masked_softmax_forward"
  run "tefl ops generic_gemm"
  echo
  cat <<'MD'
`tefl ops` lists every op; `--family F` only those of a family (any case; an unknown family is an
error listing the families, as is a family that is not the named op's); `--json` gives the same data as objects (`inputs`, `outputs`, `attrs` with
`default` as a value of its type, `range` as text such as `[0, 1)`, and the inclusive `min` and `max` as numbers
where finite: JSON has no infinity).
MD
  echo
  echo "## tefl impls"
  run "tefl impls rmsnorm_fwd"
  run "TE_FL_PREFER=vendor tefl impls rmsnorm_fwd --plugin $plugins/libtefl_plugin_testgood.so"
  echo
  cat <<'MD'
A policy that leaves an op's default call nothing to pick is said, with the reason `tefl explain`
gives, and the command fails with status 1 after the listing:
MD
  run "TE_FL_PER_OP='rmsnorm_fwd=impl:default.protable' tefl impls rmsnorm_fwd"
  echo
  echo "## tefl explain"
  echo
  cat <<'MD'
The call is built from the op's built-in grid (`--dtype`, `--shape` of the main input, `--device`);
its tensors are never written, and a large one is only reserved address space (`mmap` with
`MAP_NORESERVE`), so a `--shape` far beyond this machine's memory costs no time and almost no
resident memory. A shape whose tensors do not fit the address space this process may take
(`ulimit -v`, strict overcommit, or 2^47 bytes for one tensor) is
MD
  echo "refused as bad usage, status 2 (\`$too_big ...\`). A" | fold -s -w 100 | sed 's/ $//'
  cat <<'MD'
call that cannot be resolved (an `error` line, or an empty chain: every candidate rejected, a
strict-mode decline) makes the command fail with status 1 after its report.
MD
  run "TE_FL_PER_OP='rmsnorm_fwd=vendor|flagos' tefl explain rmsnorm_fwd --dtype bf16 --plugin $plugins/libtefl_plugin_testgood.so"
  run "TE_FL_PREFER=reference tefl explain gelu --shape 8192,4096"
  echo
  cat <<'MD'
A policy variable that is set but ignored is listed with the reason: the parser's own words for a
malformed value (its WARNING is on stderr as well), or what overrides it:
MD
  run "TE_FL_PREFER_VENDOR=1 TE_FL_PREFER=reference TE_FL_STRICT=maybe tefl explain gelu"
  echo
  echo "## tefl check"
  echo
  cat <<'MD'
Each (implementation, op, dtype, shape) of the built-in grid runs on the
implementation's device through that device's runtime (`tefl_device_runtime`:
alloc, copies, sync) and is compared with reference.cpp under
TransformerEngine's tolerances (`spec/ops.md`). A decline (`supports()` or the
kernel's `TEFL_UNSUPPORTED`) is reported with its reason, and checked to have
left every output untouched. With `--plugin`, only that plugin's
implementations are checked. Progress is shown on a terminal. `--shape` replaces
the grid's shapes with one main-input shape; an op named by `--op` that cannot
take it is an error, as in `explain` (without `--op`, the ops that cannot take it
are skipped and counted as "without a built-in grid", and an error follows when
none can):
MD
  run "tefl check --impl default.portable --op scaled_softmax_forward --shape 4,4"
  echo
  cat <<'MD'
Filters that leave nothing to check (no implementation, or no built-in
case: `--op compute_scale_from_amax --dtype bf16`) fail with status 1, so a CI run
with a bad filter does not pass:
MD
  run "tefl check --op compute_scale_from_amax --dtype bf16"
  echo
  echo "The built-in grid of one op and dtype, then the whole suite (\`--quiet\`: only FAIL lines and the summary):"
  run "tefl check --impl default.portable --op rmsnorm_fwd --dtype bf16"
  run "tefl check --quiet"
  echo
  echo "A deliberately wrong plugin (its last row is 0.1% off) fails, with the op, dtype and shape named:"
  run "tefl check --quiet --plugin $plugins/libtefl_plugin_wrong.so"
  echo
  echo "## tefl bench"
  echo
  cat <<'MD'
Time per call on warm, preallocated outputs (median of the samples taken for
`--min-time` seconds), GB/s over the bytes of every input and output, and that
as a percentage of the copy bandwidth measured at the start of the same run
with the same threads. Default sizes per family: [4096, 4096]; softmax
[2, 16, 1024, 1024]; RoPE [2048, 2, 32, 128]; GEMM [1024, 1024] (M, K; N =
K); attention [2, 1024, 16, 64] (b, s, h, d; compute-bound: GB/s says little,
and their reference.cpp is timed only with `--impl reference.cpp`). A `--size` (alias `--shape`) is read per
family as above (GEMM: exactly M,K; the gated activations `glu` ... `clamped_dswiglu`: [N.., H], so their input
is [N.., 2H] and `--size 8192,4096` times an [8192, 8192] input); a row that cannot run (a size the op cannot take, a
declined call, an `--impl` that does not serve the op) is shown as `not run: <reason>` (a decline in
the implementation's own words) and the command exits 1. With `--impl` (repeatable) the rows of an
op come in the order the ids were given. `--min-time` is a number of seconds in (0, 3600]. `--plot FILE.png` (or `.pdf`, `.svg`, `.eps`, `.ps`) draws a
roofline-style chart (bytes moved vs achieved GB/s under the copy roof) with
`tools/tefl/plot_bench.py` (python3 + matplotlib; `TEFL_PLOT_SCRIPT` names another script). The
file's format and directory (status 2), the script and python3 with matplotlib (status 1) are
checked before anything is measured.
MD
  run "tefl bench --op rmsnorm_fwd --op gelu --op swiglu --op scaled_softmax_forward --op fused_rope_forward --dtype bf16 --impl default.portable"
  run "tefl bench --op quantize --op dequantize --op compute_amax --op generic_gemm --op fused_attn_fwd"
  echo
  echo "## tefl demo"
  echo
  cat <<'MD'
One GPT-style layer (rmsnorm -> QKV GEMM -> RoPE -> causal attention ->
output projection -> residual -> rmsnorm -> SwiGLU MLP -> residual), forward
and backward, on synthetic data; flags `--batch --seq --hidden --heads --ffn
--dtype`. The layer runs twice: pinned to reference.cpp, then under the policy
in force; each op's outputs are compared between the two runs (errors include
what earlier ops propagated). Every projection product (forward, dgrad,
wgrad) is `generic_gemm`, attention is `fused_attn_fwd`/`fused_attn_bwd`
(bshd, causal); only the residual adds are the demo's own plain code, marked
`demo code`. The headline's time (and tokens/s; JSON `seconds`, `tokens_per_second`) is the
layer's: the table's times summed, each the time of the op call alone. The demo's own
bookkeeping around the calls (converting tensors, copying outputs for the comparison, slicing
heads) is not the layer's; the headline gives the whole pass with it for comparison (JSON
`pass_seconds`).
MD
  run "tefl demo"
  run "TE_FL_PREFER=reference tefl demo --seq 64"
  echo
  echo "With a plugin loaded and \`TE_FL_PREFER=vendor\`, the vendor's implementations appear in the table"
  echo "(the test plugin serves float32 \`rmsnorm_fwd\`):"
  run "TE_FL_PREFER=vendor tefl demo --seq 64 --plugin $plugins/libtefl_plugin_testgood.so"
} >"$out"
echo "wrote $out"
