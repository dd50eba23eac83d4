// tefl ops [OP] [--family F] [--json]: the catalogue, from the op schemas.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "cli_support.h"

namespace tefl::cli {
namespace {

bool EqualsIgnoreCase(const std::string& a, const char* b) {
  const std::string_view v = b;
  if (a.size() != v.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(v[i]))) return false;
  return true;
}

const char* AttrTypeName(AttrType t) {
  switch (t) {
    case AttrType::kF32:
      return "f32";
    case AttrType::kI32:
      return "i32";
    case AttrType::kBool:
      return "bool";
    default:
      return "u64";
  }
}

// An attribute value as a JSON value of its type (f32 in float32's shortest
// form: 0.1, not 0.10000000149011612).
nlohmann::json AttrJsonValue(AttrType t, double v) {
  if (t == AttrType::kF32) return std::strtod(AttrValueString(t, v).c_str(), nullptr);
  if (t == AttrType::kBool) return v != 0;
  if (t == AttrType::kU64) return uint64_t(v);
  return int64_t(v);
}

nlohmann::json OpJson(const OpSchema& op) {
  nlohmann::json j;
  j["id"] = op.id;
  j["name"] = op.name;
  j["family"] = op.family;
  j["doc"] = op.doc;
  j["aliases"] = nlohmann::json::array();
  for (const char* a : op.aliases) j["aliases"].push_back(a);
  auto args = [](std::span<const ArgSchema> list) {
    nlohmann::json arr = nlohmann::json::array();
    for (const ArgSchema& a : list)
      arr.push_back(
          {{"name", a.name}, {"dtypes", DTypeSetString(a.dtypes)}, {"optional", a.optional}, {"shape", a.shape}});
    return arr;
  };
  j["inputs"] = args(op.inputs);
  j["outputs"] = args(op.outputs);
  j["attrs"] = nlohmann::json::array();
  for (const AttrSchema& a : op.attrs) {
    nlohmann::json aj = {{"name", a.name},
                         {"type", AttrTypeName(a.type)},
                         {"default", AttrJsonValue(a.type, a.default_value)},
                         {"range", AttrRangeString(a)},
                         {"doc", a.doc}};
    // Inclusive limits as numbers; JSON has no infinity, so an unbounded side
    // has none (its "range" says inf).
    if (a.type != AttrType::kU64) {
      if (std::isfinite(a.min_value)) aj["min"] = AttrJsonValue(a.type, a.min_value);
      if (std::isfinite(a.max_value)) aj["max"] = AttrJsonValue(a.type, a.max_value);
    }
    j["attrs"].push_back(aj);
  }
  j["in_place"] = op.inplace_output >= 0 || (op.flags & kOpInPlace) != 0;
  j["contiguous_only"] = (op.flags & kOpContiguous) != 0;
  return j;
}

std::string ArgList(std::span<const ArgSchema> list) {
  std::string s;
  for (const ArgSchema& a : list) s += (s.empty() ? "" : ", ") + std::string(a.name) + (a.optional ? "?" : "");
  return s;
}

std::string AttrList(const OpSchema& op) {
  std::string s;
  for (const AttrSchema& a : op.attrs)
    s += (s.empty() ? "" : ", ") + std::string(a.name) + "=" + AttrValueString(a.type, a.default_value);
  return s.empty() ? "-" : s;
}

void PrintDetail(const OpSchema& op) {
  std::printf("%s  (family %s, id %d)\n  %s\n", op.name, op.family, op.id, op.doc);
  if (!op.aliases.empty()) {
    std::string a;
    for (const char* al : op.aliases) a += (a.empty() ? "" : ", ") + std::string(al);
    std::printf("  aliases: %s\n", a.c_str());
  }
  Table t({"", "name", "dtypes", "shape", ""});
  for (const ArgSchema& a : op.inputs)
    t.Add({"in", a.name, DTypeSetString(a.dtypes), a.shape, a.optional ? "optional" : ""});
  for (const ArgSchema& a : op.outputs) t.Add({"out", a.name, DTypeSetString(a.dtypes), a.shape, ""});
  for (const AttrSchema& a : op.attrs) {
    t.Add({"attr", a.name, AttrTypeName(a.type),
           "default " + AttrValueString(a.type, a.default_value) +
               (a.type == AttrType::kBool ? "" : ", " + AttrRangeString(a)),
           a.doc});
  }
  std::string body = t.ToString();
  // Indent the table under the op.
  std::string indented;
  for (size_t pos = 0; pos < body.size();) {
    const size_t nl = body.find('\n', pos);
    indented += "  " + body.substr(pos, nl - pos + 1);
    pos = nl + 1;
  }
  std::printf("%s", indented.c_str());
  if (op.inplace_output >= 0)
    std::printf("  output '%s' may be exactly input '%s' (in place)\n", op.outputs[size_t(op.inplace_output)].name,
                op.inputs[size_t(op.inplace_input)].name);
  // What a kernel can rely on about strides (validation refuses the rest first).
  std::printf("  %s\n", (op.flags & kOpContiguous) != 0 ? "contiguous only: every tensor compact row-major"
                                                        : "strided tensors accepted (DLPack strides)");
}

}  // namespace

void AddOpsCommand(CLI::App& app) {
  struct Args {
    std::string op, family;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd =
      app.add_subcommand("ops", "List the op catalogue: inputs, outputs and attributes with dtypes and defaults");
  cmd->add_option("op", args->op, "Show one op in detail (a name or alias)");
  cmd->add_option("--family", args->family, "Only ops of this family (normalization, activation, softmax, rope, ...)");
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] {
    // --family: a catalogue family, in any case (as other keywords are).
    std::string family;
    if (!args->family.empty()) {
      std::vector<std::string> families;  // each once, in catalogue order
      for (const OpSchema& op : AllOps()) {
        if (!op.name) continue;
        if (EqualsIgnoreCase(args->family, op.family)) family = op.family;
        if (std::find(families.begin(), families.end(), op.family) == families.end()) families.push_back(op.family);
      }
      if (family.empty())
        throw UsageError(
            fmt::format("no op of family '{}' (the families are {})", args->family, fmt::join(families, ", ")));
    }
    std::vector<const OpSchema*> ops;
    if (!args->op.empty()) {
      const OpSchema& op = RequireOp(args->op);
      if (!family.empty() && family != op.family)
        throw UsageError(fmt::format("op {} is of family {}, not {} (give the op or --family, or both agreeing)",
                                     op.name, op.family, family));
      ops.push_back(&op);
    } else {
      for (const OpSchema& op : AllOps())
        if (op.name && (family.empty() || family == op.family)) ops.push_back(&op);
    }
    if (args->json) {
      nlohmann::json arr = nlohmann::json::array();
      for (const OpSchema* op : ops) arr.push_back(OpJson(*op));
      std::printf("%s\n", (args->op.empty() ? arr : arr[0]).dump(2).c_str());
      return;
    }
    if (!args->op.empty()) {
      PrintDetail(*ops[0]);
      return;
    }
    Table t({"op", "family", "inputs", "outputs", "attributes (defaults)"});
    for (const OpSchema* op : ops)
      t.Add({op->name, op->family, ArgList(op->inputs), ArgList(op->outputs), AttrList(*op)});
    std::printf("%s%zu ops; `tefl ops OP` shows dtypes and shapes\n", t.ToString().c_str(), ops.size());
  });
}

}  // namespace tefl::cli
