// tefl impls [OP] [--json]: registered implementations, and which one the
// current environment's policy picks for a default call of each op. Exit
// status 1 when it leaves an op nothing to pick (the reason is printed).
#include <fmt/format.h>

#include <cstdio>

#include "cli_support.h"

namespace tefl::cli {
namespace {

// What the policy in force picks first for the op's default call (float32,
// a mid-grid shape): the implementation, or why nothing can be picked (the
// resolution's error, as `tefl explain` shows it). Both "" when the op has
// no built-in call.
struct Pick {
  std::string call, picked, error;
};
Pick PickedFor(const OpSchema& op) {
  check::GridOptions o;
  o.describe_only = true;  // never run: allocated, not filled
  std::optional<check::Case> c = DefaultCase(op.name, o);
  if (!c) return {};
  Pick p;
  p.call = c->dtype + " " + c->shape;
  const Resolution r = GetDefaultManager().Explain(op.id, c->InputPtrs(), c->OutputPtrs(), c->attrs_ptr());
  if (!r.chain.empty()) {
    p.picked = r.chain.front();
  } else {
    p.error = !r.error.empty() ? r.error : r.op_name + ": no candidate accepts the call";
  }
  return p;
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
    std::vector<std::string> unpicked;  // "op: why", for each op nothing can be picked for
    for (const OpSchema* op : ops) {
      const std::vector<OpImpl> impls = GetDefaultRegistry().GetImplementations(op->name);
      const Pick pick = impls.empty() ? Pick{} : PickedFor(*op);
      const std::string& picked = pick.picked;
      nlohmann::json oj = {{"op", op->name}, {"default_call", pick.call}, {"picked", picked}};
      if (!pick.error.empty()) {
        oj["error"] = pick.error;
        unpicked.push_back(pick.error);
      }
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
    // An op the policy in force leaves nothing to pick for is this command's
    // failure (status 1, as `tefl explain` of that call), after the listing.
    auto fail_if_unpicked = [&] {
      if (unpicked.empty()) return;
      throw CliError(fmt::format("nothing can be picked for {} under the policy in force{}: {}",
                                 Plural(unpicked.size(), "op"), unpicked.size() > 1 ? "; first" : "",
                                 unpicked.front()));
    };
    if (args->json) {
      std::printf("%s\n", (args->op.empty() ? arr : arr[0]).dump(2).c_str());
      fail_if_unpicked();
      return;
    }
    std::printf("%s", t.ToString().c_str());
    std::printf(
        "%s of %s; policy %s\n'picked': the first candidate for a default float32 call "
        "(`tefl explain OP` shows why)\n",
        Plural(count, "implementation").c_str(), Plural(ops.size(), "op").c_str(), PolicySummary(GetPolicy()).c_str());
    for (const std::string& why : unpicked) std::printf("nothing picked: %s\n", why.c_str());
    fail_if_unpicked();
  });
}

}  // namespace tefl::cli
