// tefl's logger: TE-FL's line format "[TE-FL file.cpp:LINE LEVEL] message"
// on stderr (or a sink installed by tests and front ends), filtered by
// TEFL_LOG_LEVEL. Verbose dispatch/exec lines (TE_FL_VERBOSE) go to the same
// sink regardless of the level.
#ifndef TEFL_SRC_CORE_LOGGING_H_
#define TEFL_SRC_CORE_LOGGING_H_

#include <fmt/format.h>

#include <atomic>
#include <functional>
#include <string>
#include <string_view>

#include "tefl/tefl.h"

namespace tefl {

// TE_FL_VERBOSE bits.
enum VerboseFlags : int { kVerboseDispatch = 1, kVerboseExec = 2 };

namespace logging_internal {
extern std::atomic<int> g_level;    // minimum tefl_log_level that is emitted
extern std::atomic<int> g_verbose;  // VerboseFlags
extern std::atomic<bool> g_initialized;
void InitFromEnvOnce();
// Reads TEFL_LOG_LEVEL / TE_FL_VERBOSE the first time; one relaxed-acquire
// load afterwards (this sits on the dispatch hot path).
inline void EnsureInit() {
  if (!g_initialized.load(std::memory_order_acquire)) InitFromEnvOnce();
}
}  // namespace logging_internal

// A sink receives each finished line (no trailing newline).
using LogSink = std::function<void(int level, const std::string& line)>;
// Installs a sink (empty = stderr). Returns the previous one.
LogSink SetLogSink(LogSink sink);

inline bool LogEnabled(int level) {
  logging_internal::EnsureInit();
  return level >= logging_internal::g_level.load(std::memory_order_relaxed);
}
inline int VerboseFlagsNow() {
  logging_internal::EnsureInit();
  return logging_internal::g_verbose.load(std::memory_order_relaxed);
}
void SetLogLevel(int level);
int GetLogLevel();
void SetVerbose(int flags);

// Emits one line if `level` is enabled. `file` may be a full path.
void LogLine(int level, const char* file, int line, std::string_view message);
// Emits a TE_FL_VERBOSE line ("tefl_verbose,<what>,...").
void VerboseLine(std::string_view message);

// Parses TEFL_LOG_LEVEL text (case-insensitive, WARN accepted); -1 if bad.
int ParseLogLevel(std::string_view text);
// Parses TE_FL_VERBOSE text; -1 if bad.
int ParseVerbose(std::string_view text);

}  // namespace tefl

#define TEFL_LOG(LEVEL, ...)                                                           \
  do {                                                                                 \
    if (::tefl::LogEnabled(TEFL_LOG_##LEVEL))                                          \
      ::tefl::LogLine(TEFL_LOG_##LEVEL, __FILE__, __LINE__, fmt::format(__VA_ARGS__)); \
  } while (0)

#endif  // TEFL_SRC_CORE_LOGGING_H_
