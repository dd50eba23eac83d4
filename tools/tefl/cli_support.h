// Shared by the `tefl` subcommands: errors, argument parsing (dtype, shape,
// device, op), plugin loading, tables and JSON output.
#ifndef TEFL_TOOLS_TEFL_CLI_SUPPORT_H_
#define TEFL_TOOLS_TEFL_CLI_SUPPORT_H_

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "check/cases.h"
#include "core/catalogue.h"
#include "tefl/tefl.hpp"

namespace tefl::cli {

using check::Tensor;

// A failure reported as one line "tefl: error: <what>" and exit status 1.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// Bad usage (an argument value that cannot be used: an unknown op, dtype or
// device, a malformed shape, ...): one line "tefl: error: <what>" and exit
// status 2.
struct UsageError : CliError {
  using CliError::CliError;
};

// Subcommands; each adds itself to the app.
void AddOpsCommand(CLI::App& app);
void AddImplsCommand(CLI::App& app);
void AddExplainCommand(CLI::App& app);
void AddCheckCommand(CLI::App& app);
void AddBenchCommand(CLI::App& app);
void AddDemoCommand(CLI::App& app);

// "bf16", "bfloat16", "fp32", "float32", "f16", ... Throws UsageError.
DType ParseDType(const std::string& text);
// Non-negative decimal sizes separated by commas: "8192,4096" (also
// "8192x4096" and "[8192, 4096]"; spaces only around a separator; one kind
// of separator; no "0x", which reads as hexadecimal). Every size fits int64
// and so does their product. Throws UsageError.
std::vector<int64_t> ParseShape(const std::string& text);
// "cpu", "cuda", "rocm", ... or a DLDeviceType number 1..63. Throws UsageError.
DLDeviceType ParseDevice(const std::string& text);
// A --min-time value: finite, > 0 and <= 3600 seconds. Throws UsageError.
double ValidateMinTime(double seconds);
// How the ops of a family read --shape/--size, e.g. "M,K (N = K)" for gemm.
std::string ShapeForm(const std::string& family);
// A policy for people, e.g. "prefer=flagos strict=0 deny=acme
// per_op=[gelu=impl:x]": allow, deny and per_op only when set. (Not the
// Fingerprint(), a length-prefixed key for interning.)
std::string PolicySummary(const SelectionPolicy& policy);
// Whether TEFL_LOG_LEVEL names a valid level (a malformed one counts as unset).
bool LogLevelRequested();
// "1 implementation", "3 implementations".
std::string Plural(size_t n, const std::string& noun);
std::string DeviceName(int32_t device_type);
// Every device type in a mask, e.g. "cpu,cuda".
std::string DeviceList(uint64_t mask);
// The catalogue schema of an op name or alias. Throws UsageError naming the
// closest known op.
const OpSchema& RequireOp(const std::string& name);
// Each named op once, in the order first named (an alias and its op are one
// op: `--op rope_fwd --op fused_rope_forward` runs it once); UsageError as
// RequireOp for an unknown name.
std::vector<const OpSchema*> RequireOps(const std::vector<std::string>& names);

// Each id an implementation registered in the default registry (for any
// op). Throws UsageError naming the closest registered id and listing them.
void RequireImplIds(const std::vector<std::string>& ids);

// Loads plugins (names or absolute paths) into the default registry after
// initialising it; throws CliError with the loader's reason on failure.
// Returns the resolved paths.
std::vector<std::string> LoadPluginsOrThrow(const std::vector<std::string>& plugins);
// Adds the repeatable --plugin option to a subcommand.
void AddPluginOption(CLI::App* cmd, std::vector<std::string>* plugins);

// A text table with left-aligned columns.
class Table {
 public:
  explicit Table(std::vector<std::string> header) : rows_{std::move(header)} {}
  void Add(std::vector<std::string> row) { rows_.push_back(std::move(row)); }
  std::string ToString() const;

 private:
  std::vector<std::vector<std::string>> rows_;
};

std::string DTypeSetString(DTypeSet set);
std::string FormatDouble(double v);
// The default call of an op for impls/explain: the first built-in case
// matching the options (nullopt if the op has no grid).
std::optional<check::Case> DefaultCase(const std::string& op, const check::GridOptions& options);
// True when stdout/stderr is a terminal.
bool StderrIsTerminal();

}  // namespace tefl::cli

#endif  // TEFL_TOOLS_TEFL_CLI_SUPPORT_H_
