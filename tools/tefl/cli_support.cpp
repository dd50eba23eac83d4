#include "cli_support.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cmath>

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

// Levenshtein distance, for "did you mean".
size_t Distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1)});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace

DType ParseDType(const std::string& text) {
  const std::string t = Lower(text);
  if (t == "fp32" || t == "f32" || t == "float32" || t == "float") return DType::kF32;
  if (t == "bf16" || t == "bfloat16") return DType::kBF16;
  if (t == "fp16" || t == "f16" || t == "float16" || t == "half") return DType::kF16;
  throw CliError(fmt::format("unknown dtype '{}' (expected fp32, bf16 or fp16)", text));
}

std::vector<int64_t> ParseShape(const std::string& text) {
  std::vector<int64_t> shape;
  std::string cur;
  auto flush = [&](bool last) {
    if (cur.empty()) {
      if (last && !shape.empty()) return;
      throw CliError(
          fmt::format("malformed shape '{}' (expected sizes separated by commas or x, e.g. 8192,4096)", text));
    }
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(cur, &used);
    } catch (...) {
      used = 0;
    }
    if (used != cur.size() || v < 0)
      throw CliError(fmt::format("malformed shape '{}': '{}' is not a non-negative integer", text, cur));
    shape.push_back(v);
    cur.clear();
  };
  std::string body = text;
  if (!body.empty() && body.front() == '[') body.erase(0, 1);
  if (!body.empty() && body.back() == ']') body.pop_back();
  for (char c : body) {
    if (c == ' ') continue;
    if (c == ',' || c == 'x' || c == 'X') {
      flush(false);
    } else {
      cur += c;
    }
  }
  flush(true);
  if (shape.empty()) throw CliError(fmt::format("malformed shape '{}': no sizes", text));
  return shape;
}

DLDeviceType ParseDevice(const std::string& text) {
  const std::string t = Lower(text);
  for (const DeviceNameEntry& d : kDevices)
    if (t == d.name) return DLDeviceType(d.type);
  if (!t.empty() && std::all_of(t.begin(), t.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); }))
    return DLDeviceType(std::stoi(t));
  throw CliError(fmt::format("unknown device '{}' (expected cpu, cuda, rocm, ... or a DLDeviceType number)", text));
}

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
  std::string best;
  size_t best_d = ~size_t(0);
  for (const OpSchema& op : AllOps()) {
    if (op.name == nullptr) continue;
    const size_t d = Distance(name, op.name);
    if (d < best_d) best_d = d, best = op.name;
  }
  throw CliError(fmt::format("unknown op '{}'{} (`tefl ops` lists them)", name,
                             best.empty() || best_d > 4 ? "" : "; did you mean '" + best + "'?"));
}

std::vector<std::string> LoadPluginsOrThrow(const std::vector<std::string>& plugins) {
  OpRegistry& registry = GetDefaultRegistry();
  GetDefaultManager().EnsureInitialized();
  std::vector<std::string> paths;
  // A rejected plugin is this command's error, reported once as such: the
  // loader's WARNING line would repeat it.
  const int level = GetLogLevel();
  if (level < TEFL_LOG_ERROR) SetLogLevel(TEFL_LOG_ERROR);
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
  return cases[options.shape ? 0 : cases.size() / 2];
}

bool StderrIsTerminal() { return isatty(2) != 0; }

}  // namespace tefl::cli
