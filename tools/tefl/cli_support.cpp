#include "cli_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <string_view>

#include "core/logging.h"

namespace tefl::cli {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

struct DeviceNameEntry {
  int32_t type;
  const char* name;
};
constexpr DeviceNameEntry kDevices[] = {{kDLCPU, "cpu"},       {kDLCUDA, "cuda"},      {kDLCUDAHost, "cuda_host"},
                                        {kDLOpenCL, "opencl"}, {kDLVulkan, "vulkan"},  {kDLMetal, "metal"},
                                        {kDLROCM, "rocm"},     {kDLExtDev, "ext_dev"}, {14, "oneapi"},
                                        {15, "webgpu"},        {16, "hexagon"}};  // DLPack >= 0.8 numbers

}  // namespace

DType ParseDType(const std::string& text) {
  const std::string t = Lower(text);
  if (t == "fp32" || t == "f32" || t == "float32" || t == "float") return DType::kF32;
  if (t == "bf16" || t == "bfloat16") return DType::kBF16;
  if (t == "fp16" || t == "f16" || t == "float16" || t == "half") return DType::kF16;
  throw UsageError(fmt::format("unknown dtype '{}' (expected fp32, bf16 or fp16)", text));
}

std::vector<int64_t> ParseShape(const std::string& text) {
  constexpr const char* kForm = "expected non-negative decimal sizes separated by commas, e.g. 8192,4096";
  auto fail = [&](const std::string& why) {
    throw UsageError(fmt::format("malformed shape '{}': {} ({})", text, why, kForm));
  };
  std::string_view body = text;
  if (!body.empty() && body.front() == '[') {
    if (body.back() != ']') fail("'[' without a closing ']'");
    body = body.substr(1, body.size() - 2);
  } else if (!body.empty() && body.back() == ']') {
    fail("']' without an opening '['");
  }
  // "0x10" reads as a hexadecimal number as much as the shape [0, 10].
  for (size_t i = 0; i + 1 < body.size(); ++i) {
    const bool field_start = i == 0 || !std::isdigit(static_cast<unsigned char>(body[i - 1]));
    if (field_start && body[i] == '0' && (body[i + 1] == 'x' || body[i + 1] == 'X'))
      fail(
          fmt::format("'{}' at character {} reads as a hexadecimal prefix; sizes are decimal (a size 0 "
                      "followed by another is written with a comma: 0,10)",
                      body.substr(i, 2), i + 1));
  }
  std::vector<int64_t> shape;
  int64_t elements = 1;
  bool comma = false, times = false;  // which separators the shape uses
  bool overflow = false;
  size_t pos = 0;
  while (true) {
    size_t end = pos;
    while (end < body.size() && body[end] != ',' && body[end] != 'x' && body[end] != 'X') ++end;
    std::string_view field = body.substr(pos, end - pos);
    while (!field.empty() && field.front() == ' ') field.remove_prefix(1);
    while (!field.empty() && field.back() == ' ') field.remove_suffix(1);
    if (field.empty())
      fail(body.find_first_not_of(' ') == std::string_view::npos
               ? "no sizes"
               : fmt::format("an empty size at character {} (',' and 'x' both separate sizes)", pos + 1));
    if (!std::all_of(field.begin(), field.end(), [](char c) { return c >= '0' && c <= '9'; }))
      fail(fmt::format("'{}' is not a non-negative decimal integer", field));
    int64_t v = 0;
    const auto [ptr, ec] = std::from_chars(field.data(), field.data() + field.size(), v);
    if (ec != std::errc() || ptr != field.data() + field.size())
      fail(fmt::format("size {} is larger than the largest size, 2^63 - 1 = {}", field,
                       std::numeric_limits<int64_t>::max()));
    shape.push_back(v);
    if (!overflow && __builtin_mul_overflow(elements, v, &elements)) overflow = true;
    if (end == body.size()) break;
    (body[end] == ',' ? comma : times) = true;
    pos = end + 1;
  }
  if (comma && times) fail("it mixes ',' and 'x' as separators (use one of them)");
  if (overflow && std::find(shape.begin(), shape.end(), 0) == shape.end())
    throw UsageError(fmt::format("shape '{}' has too many elements: their number does not fit in 64 bits", text));
  return shape;
}

DLDeviceType ParseDevice(const std::string& text) {
  const std::string t = Lower(text);
  for (const DeviceNameEntry& d : kDevices)
    if (t == d.name) return DLDeviceType(d.type);
  if (!t.empty() &&
      std::all_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); })) {
    int v = 0;
    const auto [ptr, ec] = std::from_chars(t.data(), t.data() + t.size(), v);
    if (ec != std::errc() || ptr != t.data() + t.size() || v < 1 || v > 63)
      throw UsageError(fmt::format("device number '{}' is out of range (DLDeviceType numbers are 1..63)", text));
    return DLDeviceType(v);
  }
  throw UsageError(
      fmt::format("unknown device '{}' (expected cpu, cuda, rocm, ... or a DLDeviceType number 1..63)", text));
}

double ValidateMinTime(double seconds) {
  if (!std::isfinite(seconds) || seconds <= 0 || seconds > 3600)
    throw UsageError(fmt::format("--min-time {} is out of range (expected seconds: a finite number > 0 and <= 3600)",
                                 FormatDouble(seconds)));
  return seconds;
}

std::string ShapeForm(const std::string& family) {
  if (family == "gemm") return "M,K (2 sizes; N = K)";
  if (family == "softmax") return "b,h,sq,sk (4 sizes)";
  if (family == "rope") return "s,b,h,d (4 sizes)";
  if (family == "attention") return "b,s,h,d (4 sizes)";
  return "the main input's sizes, e.g. 8192,4096";
}

std::string PolicySummary(const SelectionPolicy& policy) {
  std::string out = fmt::format("prefer={} strict={}", policy.prefer(), policy.strict() ? 1 : 0);
  if (policy.allow_vendors()) {
    std::string allow;
    for (const std::string& v : *policy.allow_vendors()) allow += (allow.empty() ? "" : ",") + v;
    out += " allow=" + (allow.empty() ? std::string("(none)") : allow);
  }
  if (!policy.deny_vendors().empty()) {
    std::string deny;
    for (const std::string& v : policy.deny_vendors()) deny += (deny.empty() ? "" : ",") + v;
    out += " deny=" + deny;
  }
  std::string per_op;
  for (const auto& [op, order] : policy.per_op_order()) {
    std::string toks;
    for (const PolicyToken& tok : order) toks += (toks.empty() ? "" : "|") + tok.ToString();
    per_op += (per_op.empty() ? "" : "; ") + op + "=" + toks;
  }
  if (!per_op.empty()) out += " per_op=[" + per_op + "]";
  return out;
}

bool LogLevelRequested() {
  const char* v = std::getenv("TEFL_LOG_LEVEL");
  return v != nullptr && *v != '\0' && ParseLogLevel(v) >= 0;
}

std::string Plural(size_t n, const std::string& noun) { return fmt::format("{} {}{}", n, noun, n == 1 ? "" : "s"); }

std::string DeviceName(int32_t device_type) {
  for (const DeviceNameEntry& d : kDevices)
    if (d.type == device_type) return d.name;
  return "device" + std::to_string(device_type);
}

std::string DeviceList(uint64_t mask) {
  std::string out;
  for (int32_t t = 0; t < 64; ++t)
    if (mask & (uint64_t(1) << t)) out += (out.empty() ? "" : ",") + DeviceName(t);
  return out;
}

const OpSchema& RequireOp(const std::string& name) {
  if (const OpSchema* op = FindOp(name)) return *op;
  throw UsageError(fmt::format("unknown op '{}'{} (`tefl ops` lists them)", name, DidYouMeanOp(name)));
}

std::vector<const OpSchema*> RequireOps(const std::vector<std::string>& names) {
  std::vector<const OpSchema*> ops;
  for (const std::string& name : names) {
    const OpSchema* op = &RequireOp(name);
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }
  return ops;
}

void RequireImplIds(const std::vector<std::string>& ids) {
  std::set<std::string> known;
  for (const OpSchema& op : AllOps())
    if (op.name)
      for (const OpImpl& impl : GetDefaultRegistry().GetImplementations(op.name)) known.insert(impl.impl_id);
  for (const std::string& id : ids) {
    if (known.count(id)) continue;
    std::string list, best;
    size_t best_d = ~size_t(0);
    for (const std::string& k : known) {
      list += (list.empty() ? "" : ", ") + k;
      const size_t d = EditDistance(Lower(id), Lower(k));
      if (d < best_d) best_d = d, best = k;
    }
    throw UsageError(fmt::format("unknown implementation '{}'{} (registered: {})", id,
                                 best_d <= 4 ? "; did you mean '" + best + "'?" : std::string(), list));
  }
}

std::vector<std::string> LoadPluginsOrThrow(const std::vector<std::string>& plugins) {
  OpRegistry& registry = GetDefaultRegistry();
  GetDefaultManager().EnsureInitialized();
  std::vector<std::string> paths;
  // A rejected plugin is this command's error, reported once as such: the
  // loader's WARNING line would repeat it. Unless TEFL_LOG_LEVEL asks for a
  // level: then every line shows, the plugin's own messages included.
  const int level = GetLogLevel();
  if (level < TEFL_LOG_ERROR && !LogLevelRequested()) SetLogLevel(TEFL_LOG_ERROR);
  struct Restore {
    int level;
    ~Restore() { SetLogLevel(level); }
  } restore{level};
  for (const std::string& p : plugins) {
    const Status s = LoadPlugin(p, registry);
    if (!s.ok()) throw CliError(fmt::format("cannot load plugin '{}': {}", p, s.message()));
    const std::vector<PluginReport> reports = PluginReports();
    paths.push_back(reports.empty() ? p : reports.back().path);
  }
  return paths;
}

void AddPluginOption(CLI::App* cmd, std::vector<std::string>* plugins) {
  cmd->add_option("--plugin", *plugins,
                  "Load this plugin first (a name looked up in TE_FL_PLUGIN_PATH and the installed plugin "
                  "directory, or an absolute path); repeatable")
      ->type_name("NAME|PATH");
}

std::string Table::ToString() const {
  std::vector<size_t> width;
  for (const auto& row : rows_) {
    if (width.size() < row.size()) width.resize(row.size(), 0);
    for (size_t i = 0; i < row.size(); ++i) width[i] = std::max(width[i], row[i].size());
  }
  std::string out;
  for (const auto& row : rows_) {
    std::string line;
    for (size_t i = 0; i < row.size(); ++i) {
      line += row[i];
      if (i + 1 < row.size()) line += std::string(width[i] - row[i].size() + 2, ' ');
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string DTypeSetString(DTypeSet set) {
  std::string out;
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kE4M3, DType::kE5M2, DType::kU8,
                  DType::kI32, DType::kI64, DType::kBool}) {
    if (!(set & Bit(t))) continue;
    out += (out.empty() ? "" : "|") + std::string(DTypeName(t));
  }
  return out;
}

std::string FormatDouble(double v) {
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  return fmt::format("{:g}", v);
}

std::optional<check::Case> DefaultCase(const std::string& op, const check::GridOptions& options) {
  check::GridOptions o = options;
  if (!o.dtype) o.dtype = DType::kF32;
  std::vector<check::Case> cases = check::BuiltinCases(op, o);
  if (cases.empty()) return std::nullopt;
  // The middle of the grid: a shape that is neither trivial nor the largest.
  return std::move(cases[options.shape ? 0 : cases.size() / 2]);
}

bool StderrIsTerminal() { return isatty(2) != 0; }

}  // namespace tefl::cli
