// tefl impls [OP] [--json]: registered implementations, and which one the
// current environment's policy picks for a default call of each op.
#include <fmt/format.h>

#include <cstdio>

#include "cli_support.h"

namespace tefl::cli {
namespace {

// The implementation the policy in force picks first for the op's default
// call (float32, a mid-grid shape), or "" when the op has no built-in call.
std::string PickedFor(const OpSchema& op, std::string* call) {
  check::GridOptions o;
  o.describe_only = true;  // never run: allocated, not filled
  std::optional<check::Case> c = DefaultCase(op.name, o);
  if (!c) return "";
  *call = c->dtype + " " + c->shape;
  const Resolution r = GetDefaultManager().Explain(op.id, c->InputPtrs(), c->OutputPtrs(), c->attrs_ptr());
  return r.chain.empty() ? "(none)" : r.chain.front();
}

}  // namespace

void AddImplsCommand(CLI::App& app) {
  struct Args {
    std::string op;
    std::vector<std::string> plugins;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "impls", "List registered implementations and the one the current policy (TE_FL_* variables) picks per op");
  cmd->add_option("op", args->op, "Only this op (a name or alias)");
  AddPluginOption(cmd, &args->plugins);
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args] {
    GetDefaultManager().EnsureInitialized();
    LoadPluginsOrThrow(args->plugins);
    std::vector<const OpSchema*> ops;
    if (!args->op.empty()) {
      ops.push_back(&RequireOp(args->op));
    } else {
      for (const OpSchema& op : AllOps())
        if (op.name) ops.push_back(&op);
    }
    nlohmann::json arr = nlohmann::json::array();
    Table t({"op", "impl_id", "kind", "vendor", "priority", "devices", "origin", "picked"});
    size_t count = 0;
    for (const OpSchema* op : ops) {
      const std::vector<OpImpl> impls = GetDefaultRegistry().GetImplementations(op->name);
      std::string call;
      const std::string picked = impls.empty() ? "" : PickedFor(*op, &call);
      nlohmann::json oj = {{"op", op->name}, {"default_call", call}, {"picked", picked}};
      oj["implementations"] = nlohmann::json::array();
      for (const OpImpl& impl : impls) {
        ++count;
        const bool is_picked = impl.impl_id == picked;
        oj["implementations"].push_back({{"impl_id", impl.impl_id},
                                         {"kind", KindName(impl.kind)},
                                         {"vendor", impl.vendor},
                                         {"priority", impl.priority},
                                         {"devices", DeviceList(impl.device_mask)},
                                         {"origin", impl.origin},
                                         {"picked", is_picked}});
        t.Add({op->name, impl.impl_id, KindName(impl.kind), impl.vendor.empty() ? "-" : impl.vendor,
               std::to_string(impl.priority), DeviceList(impl.device_mask), impl.origin, is_picked ? "<- picked" : ""});
      }
      if (impls.empty()) t.Add({op->name, "(none registered)", "", "", "", "", "", ""});
      arr.push_back(oj);
    }
    if (args->json) {
      std::printf("%s\n", (args->op.empty() ? arr : arr[0]).dump(2).c_str());
      return;
    }
    std::printf("%s", t.ToString().c_str());
    std::printf(
        "%s of %s; policy %s\n'picked': the first candidate for a default float32 call "
        "(`tefl explain OP` shows why)\n",
        Plural(count, "implementation").c_str(), Plural(ops.size(), "op").c_str(), PolicySummary(GetPolicy()).c_str());
  });
}

}  // namespace tefl::cli
