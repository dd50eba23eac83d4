// tefl explain OP [--dtype] [--shape] [--device] [--json]: the full
// resolution of one call under the policy in force. Exit status 1 when the
// call cannot be resolved (an error, or no candidate accepts it); 2 when no
// call can be built from --dtype/--shape (or its tensors cannot be allocated).
#include <fmt/format.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>
#include <vector>

#include "cli_support.h"

namespace tefl::cli {
namespace {

const char* kPolicyVars[] = {"TE_FL_PREFER",        "TE_FL_PREFER_VENDOR", "TE_FL_STRICT",
                             "TE_FL_ALLOW_VENDORS", "TE_FL_DENY_VENDORS",  "TE_FL_PER_OP"};

}  // namespace

void AddExplainCommand(CLI::App& app) {
  struct Args {
    std::string op, dtype = "fp32", shape, device = "cpu";
    std::vector<std::string> plugins;
    bool json = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "explain", "Show how a call would be resolved: the policy and where it came from, every candidate, and why");
  cmd->add_option("op", args->op, "The op (a name or alias)")->required();
  cmd->add_option("--dtype", args->dtype, "Data dtype of the call: fp32, bf16, fp16")->capture_default_str();
  CLI::Option* shape = cmd->add_option("--shape", args->shape,
                                       "Shape of the op's main input, e.g. 8192,4096 (default: a mid-grid shape)");
  cmd->add_option("--device", args->device, "Device of the call's tensors: cpu, cuda, ...")->capture_default_str();
  AddPluginOption(cmd, &args->plugins);
  cmd->add_flag("--json", args->json, "Print JSON");
  cmd->callback([args, shape] {
    const OpSchema& op = RequireOp(args->op);
    check::GridOptions o;
    o.dtype = ParseDType(args->dtype);
    if (shape->count() > 0) o.shape = ParseShape(args->shape);  // given empty: an error
    const DLDeviceType device = ParseDevice(args->device);
    // Explain never runs a kernel: the tensors only describe the call, so
    // they are allocated but never written (a big shape costs no time and
    // no resident memory, though the allocation itself must succeed), and
    // only the one case shown is built.
    o.describe_only = true;
    o.first_only = o.shape.has_value();
    GetDefaultManager().EnsureInitialized();
    LoadPluginsOrThrow(args->plugins);
    std::optional<check::Case> c;
    try {
      c = DefaultCase(op.name, o);
    } catch (const check::TensorAllocError& e) {
      // Too big to allocate here, or for any address space: either way a
      // --shape this command cannot take.
      throw UsageError(
          fmt::format("--shape {} is too big for explain here: {} (explain reserves address space for the "
                      "call's tensors, though it never writes them)",
                      args->shape, e.what()));
    }
    if (!c)
      throw UsageError(fmt::format("no call of {} with dtype {}{} can be built ({})", op.name, args->dtype,
                                   !o.shape ? "" : " and shape " + args->shape,
                                   !o.shape ? "the op has no built-in call for it"
                                            : fmt::format("{} ops take --shape {}", op.family, ShapeForm(op.family))));
    std::vector<const DLTensor*> in = c->InputPtrs();
    std::vector<DLTensor*> out = c->OutputPtrs();
    std::vector<DLTensor> din, dout;
    din.reserve(in.size());
    dout.reserve(out.size());
    for (const DLTensor*& t : in) {
      if (!t) continue;
      din.push_back(*t);
      din.back().device = DLDevice{device, 0};
      t = &din.back();
    }
    for (DLTensor*& t : out) {
      if (!t) continue;  // an optional output this call does not pass
      dout.push_back(*t);
      dout.back().device = DLDevice{device, 0};
      t = &dout.back();
    }
    const Resolution r = GetDefaultManager().Explain(op.id, in, out, c->attrs_ptr());
    const SelectionPolicy policy = GetPolicy();
    nlohmann::json env = nlohmann::json::object();
    for (const char* v : kPolicyVars)
      if (const char* val = std::getenv(v)) env[v] = val;
    // Where each part of the policy came from (a variable, or "code"); parts
    // left at their defaults are not listed.
    nlohmann::json sources = nlohmann::json::object();
    std::set<std::string> used;
    for (const auto& [k, v] : policy.sources())
      if (v != "default") sources[k] = v, used.insert(v);
    // Variables set (not empty) that the policy took nothing from, each with
    // why: malformed (the parser's own words, as its WARNING has them; read
    // again here, since the policy in force was read before this command),
    // overridden (TE_FL_PREFER_VENDOR under TE_FL_PREFER), or naming nothing
    // (TE_FL_PER_OP=';;').
    std::vector<std::string> warnings;
    (void)SelectionPolicy::FromEnv(&warnings);
    std::vector<std::string> ignored;
    nlohmann::json ignored_reasons = nlohmann::json::object();
    for (const char* v : kPolicyVars) {
      const char* val = std::getenv(v);
      if (!val || !*val || used.count(v)) continue;
      ignored.push_back(fmt::format("{}={}", v, val));
      // "Ignoring VAR='value': why" and "Ignoring VAR entry/token ...: why".
      const std::string whole = fmt::format("Ignoring {}='{}': ", v, val), part = fmt::format("Ignoring {} ", v);
      std::string why;
      for (const std::string& w : warnings) {
        std::string reason;
        if (w.rfind(whole, 0) == 0) {
          reason = w.substr(whole.size());
        } else if (w.rfind(part, 0) == 0) {
          reason = w.substr(part.size());
        } else {
          continue;
        }
        why += (why.empty() ? "" : "; ") + reason;
      }
      if (why.empty()) {
        const auto prefer = policy.sources().find("prefer");
        if (std::string(v) == "TE_FL_PREFER_VENDOR" && prefer != policy.sources().end() &&
            prefer->second == "TE_FL_PREFER")
          why = "overridden by TE_FL_PREFER";
        else if (std::string(v) == "TE_FL_PER_OP")
          why = "it names no op=token|token entry";
        else
          why = "not used by the policy in force";
      }
      ignored_reasons[v] = why;
    }
    // A call that cannot be resolved is this command's failure (exit 1),
    // reported after the resolution that shows why.
    const std::string failure =
        !r.error.empty() ? r.error : (r.chain.empty() ? r.op_name + ": no candidate accepts the call" : std::string());
    auto fail_if_unresolved = [&] {
      if (!failure.empty()) throw CliError("cannot resolve the call: " + failure);
    };
    if (args->json) {
      nlohmann::json j = {{"op", r.op_name},
                          {"call", c->dtype + " " + c->shape},
                          {"device", DeviceName(device)},
                          {"signature", r.signature},
                          {"policy", r.policy},
                          {"policy_sources", sources},
                          {"environment", env},
                          {"ignored_variables", ignored},
                          {"ignored_reasons", ignored_reasons},
                          {"order", r.order},
                          {"chain", r.chain},
                          {"error", r.error}};
      j["candidates"] = nlohmann::json::array();
      for (const CandidateReport& cr : r.candidates)
        j["candidates"].push_back({{"impl_id", cr.impl_id},
                                   {"kind", KindName(cr.kind)},
                                   {"vendor", cr.vendor},
                                   {"priority", cr.priority},
                                   {"accepted", cr.accepted},
                                   {"demoted", cr.demoted},
                                   {"reason", cr.reason}});
      std::printf("%s\n", j.dump(2).c_str());
      fail_if_unresolved();
      return;
    }
    std::printf("op         %s (%s)\n", r.op_name.c_str(), op.family);
    std::printf("call       %s %s on %s%s\n", c->dtype.c_str(), c->shape.c_str(), DeviceName(device).c_str(),
                c->note.empty() ? "" : (" (" + c->note + ")").c_str());
    std::printf("signature  %s\n", r.signature.c_str());
    std::printf("policy     %s\n", PolicySummary(policy).c_str());
    if (sources.empty() && ignored.empty())
      std::printf("           (defaults: no TE_FL_* policy variable is set)\n");
    else if (sources.empty())
      std::printf("           (defaults: every TE_FL_* policy variable set was ignored)\n");
    for (const auto& [k, v] : policy.sources()) {
      if (v == "default") continue;
      const char* val = std::getenv(v.c_str());
      std::printf("           %s from %s%s\n", k.c_str(), v.c_str(), val ? (std::string("=") + val).c_str() : "");
    }
    for (const std::string& var : ignored)
      std::printf("           ignored: %s (%s)\n", var.c_str(),
                  ignored_reasons[var.substr(0, var.find('='))].get<std::string>().c_str());
    std::string order;
    for (const std::string& tok : r.order) order += (order.empty() ? "" : " > ") + tok;
    std::printf("order      %s\n", order.c_str());
    std::printf("candidates\n");
    Table t({"  #", "impl_id", "kind", "vendor", "priority", "verdict"});
    int i = 0;
    for (const CandidateReport& cr : r.candidates) {
      std::string verdict = cr.accepted ? "accepted" : "rejected: " + cr.reason;
      if (cr.demoted) verdict += " (demoted after a failure)";
      t.Add({"  " + std::to_string(++i), cr.impl_id, KindName(cr.kind), cr.vendor.empty() ? "-" : cr.vendor,
             std::to_string(cr.priority), verdict});
    }
    std::printf("%s", t.ToString().c_str());
    std::string chain;
    for (const std::string& id : r.chain) chain += (chain.empty() ? "" : " -> ") + id;
    std::printf("chain      %s\n", chain.empty() ? "(empty)" : chain.c_str());
    if (!r.error.empty()) std::printf("error      %s\n", r.error.c_str());
    fail_if_unresolved();
  });
}

}  // namespace tefl::cli
