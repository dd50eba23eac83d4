// tefl — the command-line face of the library: what ops exist, which
// implementations are registered and which one a call gets, a conformance
// check a vendor runs on a plugin, benchmarks, and a transformer-layer demo.
// Exit status 0 on success; otherwise one line "tefl: error: <reason>" on
// stderr and a non-zero status (1: the command failed, 2: bad usage).
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <new>
#include <string>

#include "cli_support.h"
#include "core/logging.h"
#include "tefl/tefl.h"

int main(int argc, char** argv) {
  // A command prints its own report: the library's INFO lines (which impl
  // ran, what registered) only when asked for with TEFL_LOG_LEVEL.
  // (A malformed value counts as unset: the library warns about it.)
  if (!tefl::cli::LogLevelRequested()) tefl::SetLogLevel(TEFL_LOG_WARNING);
  CLI::App app{"tefl: a pluggable operator layer for transformer training; inspect, check and benchmark it"};
  app.name("tefl");
  app.require_subcommand(1, 1);
  // tefl's version and the plugin C ABI it serves (tefl/tefl.h).
  app.set_version_flag("--version",
                       std::string("tefl ") + TEFL_CLI_VERSION + " (plugin C ABI " + std::to_string(TEFL_ABI_MAJOR) +
                           "." + std::to_string(TEFL_ABI_MINOR) + ")",
                       "Print tefl's version and the plugin C ABI version it serves, and exit");
  app.failure_message(
      [](const CLI::App*, const CLI::Error& e) { return "tefl: error: " + std::string(e.what()) + "\n"; });
  tefl::cli::AddOpsCommand(app);
  tefl::cli::AddImplsCommand(app);
  tefl::cli::AddExplainCommand(app);
  tefl::cli::AddCheckCommand(app);
  tefl::cli::AddBenchCommand(app);
  tefl::cli::AddDemoCommand(app);
  std::string names;
  bool known = false;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) {
    names += (names.empty() ? "" : ", ") + sub->get_name();
    known = known || (argc > 1 && sub->get_name() == argv[1]);
  }
  if (argc > 1 && argv[1][0] != '-' && !known) {
    std::fprintf(stderr, "tefl: error: unknown command '%s' (expected one of %s; see tefl --help)\n", argv[1],
                 names.c_str());
    return 2;
  }
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  } catch (const tefl::cli::UsageError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tefl: error: %s\n", e.what());
    return 2;
  } catch (const tefl::cli::CliError& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tefl: error: %s\n", e.what());
    return 1;
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr, "tefl: error: out of memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "tefl: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
