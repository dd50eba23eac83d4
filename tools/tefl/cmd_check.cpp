// tefl check [--plugin P] [--op OP] [--impl ID] [--device TYPE] [--json]:
// the conformance suite a vendor runs on its plugin. Every (implementation,
// op, dtype, shape) of the built-in grid runs on the implementation's device
// through the device runtime and is compared with reference.cpp under
// spec/ops.md's tolerances. Exit status 1 on any FAIL, and when the filters leave
// nothing to check.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>

#include "check/runner.h"
#include "cli_support.h"

namespace tefl::cli {

void AddCheckCommand(CLI::App& app) {
  struct Args {
    std::vector<std::string> plugins, ops;
    std::string impl, device, dtype, shape;
    bool json = false, quiet = false;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand(
      "check",
      "Run implementations on the built-in conformance grid against reference.cpp (TE tolerances). With --plugin, "
      "only that plugin's implementations are checked (unless --impl names another); reference.cpp is the oracle "
      "and is not checked against itself");
  AddPluginOption(cmd, &args->plugins);
  cmd->add_option("--op", args->ops, "Only this op (repeatable)");
  cmd->add_option("--impl", args->impl, "Only this implementation id");
  cmd->add_option("--device", args->device,
                  "Only implementations serving this device type (cpu, cuda, ...); default: each on its first device");
  cmd->add_option("--dtype", args->dtype, "Only this data dtype (fp32, bf16, fp16)");
  CLI::Option* shape = cmd->add_option("--shape", args->shape, "Only this main-input shape instead of the grid's");
  cmd->add_flag("--json", args->json, "Print JSON (every result and the summary)");
  cmd->add_flag("--quiet", args->quiet, "Print only FAIL lines and the summary");
  cmd->callback([args, shape] {
    // The arguments first: bad usage is reported before any plugin loads.
    check::GridOptions o;
    if (!args->dtype.empty()) o.dtype = ParseDType(args->dtype);
    if (shape->count() > 0) o.shape = ParseShape(args->shape);  // given empty: an error
    std::optional<DLDeviceType> device;
    if (!args->device.empty()) device = ParseDevice(args->device);
    std::vector<const OpSchema*> ops = RequireOps(args->ops);
    GetDefaultManager().EnsureInitialized();
    const std::vector<std::string> plugin_paths = LoadPluginsOrThrow(args->plugins);
    if (!args->impl.empty()) RequireImplIds({args->impl});
    if (ops.empty())
      for (const OpSchema& op : AllOps())
        if (op.name) ops.push_back(&op);

    // The work list: (op, impl, device).
    struct Item {
      const OpSchema* op;
      OpImpl impl;
      DLDeviceType device;
    };
    std::vector<Item> items;
    bool impl_seen = args->impl.empty();
    for (const OpSchema* op : ops) {
      for (const OpImpl& impl : GetDefaultRegistry().GetImplementations(op->name)) {
        if (!args->impl.empty() && impl.impl_id != args->impl) continue;
        impl_seen = true;
        if (args->impl.empty() && impl.impl_id == "reference.cpp") continue;
        if (args->impl.empty() && !plugin_paths.empty() &&
            std::find(plugin_paths.begin(), plugin_paths.end(), impl.origin) == plugin_paths.end())
          continue;
        if (device) {
          if (!(impl.device_mask & TEFL_DEVICE_BIT(*device))) continue;
          items.push_back({op, impl, *device});
        } else {
          int32_t first = 0;
          while (first < 64 && !(impl.device_mask & (uint64_t(1) << first))) ++first;
          items.push_back({op, impl, DLDeviceType(first)});
        }
      }
    }
    if (!impl_seen)
      throw CliError(fmt::format("no implementation '{}' is registered for the selected ops", args->impl));
    if (items.empty()) throw CliError("nothing to check: no implementation matches the filters");

    std::vector<check::CheckResult> results;
    size_t pass = 0, fail = 0, declined = 0, no_grid = 0;
    const bool progress = StderrIsTerminal() && !args->json;
    Table t({"impl", "op", "dtype", "shape", "case", "max_abs", "max_rel", "mismatch", "result", "reason"});
    for (size_t k = 0; k < items.size(); ++k) {
      const Item& it = items[k];
      if (progress) {
        std::fprintf(stderr, "\r\033[K[%zu/%zu] %s on %s", k + 1, items.size(), it.op->name, it.impl.impl_id.c_str());
        std::fflush(stderr);
      }
      const std::vector<check::Case> cases = check::BuiltinCases(it.op->name, o);
      if (cases.empty()) {
        // A shape the op cannot take is the caller's mistake when the op was
        // named (over every op, each one that cannot take it is skipped).
        if (o.shape && !args->ops.empty())
          throw UsageError(fmt::format("no call of {} with shape {} can be built ({} ops take --shape {})", it.op->name,
                                       args->shape, it.op->family, ShapeForm(it.op->family)));
        ++no_grid;
        continue;
      }
      for (const check::Case& c : cases) {
        std::vector<Tensor> expected;
        const Status rs = check::RunReference(c, &expected);
        check::CheckResult r;
        if (!rs.ok()) {
          r = check::CheckResult{it.impl.impl_id, c.op, c.dtype, c.shape, c.note, check::Verdict::kFail};
          r.reason = "reference.cpp failed: " + rs.ToString();
        } else {
          r = check::RunCheck(c, it.impl.impl_id, it.device, expected);
        }
        switch (r.verdict) {
          case check::Verdict::kPass:
            ++pass;
            break;
          case check::Verdict::kFail:
            ++fail;
            break;
          case check::Verdict::kDeclined:
            ++declined;
            break;
        }
        if (!args->quiet || r.verdict == check::Verdict::kFail)
          t.Add({r.impl_id, r.op, r.dtype, r.shape, r.note.empty() ? "-" : r.note,
                 r.compared ? fmt::format("{:.3g}", r.max_abs) : "-",
                 r.compared ? fmt::format("{:.3g}", r.max_rel) : "-", r.compared ? std::to_string(r.mismatches) : "-",
                 check::VerdictName(r.verdict), r.reason});
        results.push_back(std::move(r));
      }
    }
    if (progress) std::fprintf(stderr, "\r\033[K");
    if (o.shape && results.empty()) {
      std::string forms;  // each selected family's --shape form, once
      for (const Item& it : items) {
        const std::string form = fmt::format("{} ops take {}", it.op->family, ShapeForm(it.op->family));
        if (forms.find(form) == std::string::npos) forms += (forms.empty() ? "" : "; ") + form;
      }
      throw UsageError(fmt::format("no call with shape {} can be built for any selected op ({})", args->shape, forms));
    }
    // Filters that leave no case are an error like filters that leave no
    // implementation: a CI run with a bad filter must not pass.
    if (results.empty()) {
      std::string names;
      for (const Item& it : items)
        if (names.find(fmt::format("'{}'", it.op->name)) == std::string::npos)
          names += (names.empty() ? "" : ", ") + fmt::format("'{}'", it.op->name);
      throw CliError(fmt::format("nothing to check: the built-in grid has no case{} of {}",
                                 o.dtype ? fmt::format(" with dtype {}", DTypeName(*o.dtype)) : std::string(), names));
    }
    if (args->json) {
      nlohmann::json j;
      j["results"] = nlohmann::json::array();
      for (const check::CheckResult& r : results)
        j["results"].push_back({{"impl", r.impl_id},
                                {"op", r.op},
                                {"dtype", r.dtype},
                                {"shape", r.shape},
                                {"case", r.note},
                                {"max_abs", r.compared ? nlohmann::json(r.max_abs) : nlohmann::json()},
                                {"max_rel", r.compared ? nlohmann::json(r.max_rel) : nlohmann::json()},
                                {"mismatches", r.compared ? nlohmann::json(r.mismatches) : nlohmann::json()},
                                {"result", check::VerdictName(r.verdict)},
                                {"reason", r.reason}});
      j["summary"] = {{"pass", pass}, {"fail", fail}, {"declined", declined}, {"ops_without_grid", no_grid}};
      std::printf("%s\n", j.dump(2).c_str());
    } else {
      std::printf("%s", t.ToString().c_str());
      std::printf("summary: %zu passed, %zu failed, %zu declined (%s, %s%s)\n", pass, fail, declined,
                  Plural(results.size(), "case").c_str(), Plural(items.size(), "implementation").c_str(),
                  no_grid ? fmt::format("; {} without a built-in grid", no_grid).c_str() : "");
    }
    if (fail > 0) {
      const check::CheckResult* first = nullptr;
      for (const check::CheckResult& r : results)
        if (r.verdict == check::Verdict::kFail && !first) first = &r;
      throw CliError(fmt::format("{} case(s) failed; first: {} {} {} {}{}: {}", fail, first->impl_id, first->op,
                                 first->dtype, first->shape, first->note.empty() ? "" : " (" + first->note + ")",
                                 first->reason));
    }
  });
}

}  // namespace tefl::cli
