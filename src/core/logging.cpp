#include "core/logging.h"

#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "core/strings.h"

namespace tefl {
namespace logging_internal {
std::atomic<int> g_level{TEFL_LOG_INFO};
std::atomic<int> g_verbose{0};
std::atomic<bool> g_initialized{false};
namespace {
std::once_flag g_init_once;
std::mutex g_sink_mu;
LogSink& Sink() {
  static LogSink* sink = new LogSink();  // leaked: usable during exit
  return *sink;
}
void Emit(int level, const std::string& line) {
  std::lock_guard<std::mutex> lock(g_sink_mu);
  LogSink& sink = Sink();
  if (sink) {
    sink(level, line);
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}
}  // namespace

// Sets level and verbosity from the environment; returns the warnings to log
// (logged by the caller once initialisation is complete).
std::vector<std::string> LoadFromEnv() {
  std::string warn_level, warn_verbose;
  if (const char* v = std::getenv("TEFL_LOG_LEVEL"); v && *v) {
    int level = ParseLogLevel(v);
    if (level < 0) {
      warn_level = fmt::format("Ignoring TEFL_LOG_LEVEL='{}': expected DEBUG, INFO, WARNING or ERROR", v);
    } else {
      g_level.store(level);
    }
  }
  if (const char* v = std::getenv("TE_FL_VERBOSE"); v && *v) {
    int flags = ParseVerbose(v);
    if (flags < 0) {
      warn_verbose = fmt::format("Ignoring TE_FL_VERBOSE='{}': expected dispatch, exec, or 0/none", v);
    } else {
      g_verbose.store(flags);
    }
  }
  std::vector<std::string> warnings;
  if (!warn_level.empty()) warnings.push_back(warn_level);
  if (!warn_verbose.empty()) warnings.push_back(warn_verbose);
  return warnings;
}

void InitFromEnvOnce() {
  std::vector<std::string> warnings;
  std::call_once(g_init_once, [&] {
    warnings = LoadFromEnv();
    g_initialized.store(true, std::memory_order_release);
  });
  for (const auto& w : warnings) LogLine(TEFL_LOG_WARNING, __FILE__, __LINE__, w);
}
}  // namespace logging_internal

LogSink SetLogSink(LogSink sink) {
  std::lock_guard<std::mutex> lock(logging_internal::g_sink_mu);
  LogSink previous = std::move(logging_internal::Sink());
  logging_internal::Sink() = std::move(sink);
  return previous;
}

void SetLogLevel(int level) {
  logging_internal::EnsureInit();
  logging_internal::g_level.store(level);
}
int GetLogLevel() {
  logging_internal::EnsureInit();
  return logging_internal::g_level.load();
}
void SetVerbose(int flags) {
  logging_internal::EnsureInit();
  logging_internal::g_verbose.store(flags);
}

void ReloadLoggingFromEnv() {
  logging_internal::EnsureInit();
  logging_internal::g_level.store(TEFL_LOG_INFO);
  logging_internal::g_verbose.store(0);
  for (const auto& w : logging_internal::LoadFromEnv()) LogLine(TEFL_LOG_WARNING, __FILE__, __LINE__, w);
}

static const char* LevelName(int level) {
  if (level >= TEFL_LOG_ERROR) return "ERROR";
  if (level >= TEFL_LOG_WARNING) return "WARNING";
  if (level >= TEFL_LOG_INFO) return "INFO";
  return "DEBUG";
}

void LogLine(int level, const char* file, int line, std::string_view message) {
  if (!LogEnabled(level)) return;
  std::string_view base = file ? file : "?";
  if (auto slash = base.find_last_of('/'); slash != std::string_view::npos) {
    base = base.substr(slash + 1);
  }
  logging_internal::Emit(level, fmt::format("[TE-FL {}:{} {}] {}", base, line, LevelName(level), message));
}

void VerboseLine(std::string_view message) {
  logging_internal::Emit(TEFL_LOG_INFO, fmt::format("tefl_verbose,{}", message));
}

int ParseLogLevel(std::string_view text) {
  std::string v = ToLower(Trim(text));
  if (v == "debug") return TEFL_LOG_DEBUG;
  if (v == "info") return TEFL_LOG_INFO;
  if (v == "warning" || v == "warn") return TEFL_LOG_WARNING;
  if (v == "error") return TEFL_LOG_ERROR;
  return -1;
}

int ParseVerbose(std::string_view text) {
  std::string v = ToLower(Trim(text));
  if (v.empty() || v == "0" || v == "none" || v == "off") return 0;
  if (v == "dispatch" || v == "1") return kVerboseDispatch;
  if (v == "exec" || v == "all" || v == "2") return kVerboseDispatch | kVerboseExec;
  return -1;
}

}  // namespace tefl
