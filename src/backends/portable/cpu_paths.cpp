#include "backends/portable/cpu_paths.h"

#include <atomic>
#include <cstdlib>

namespace tefl::backends {
namespace {

struct PathInfo {
  const char* env;
  bool needs_avx512_bf16;
};
constexpr PathInfo kPaths[] = {
    {"TEFL_PORTABLE_BF16_CVT", true},
    {"TEFL_PORTABLE_BF16_FAST_ACT", false},
    {"TEFL_PORTABLE_ATTN_BF16DOT", true},
};
static_assert(sizeof(kPaths) / sizeof(kPaths[0]) == size_t(PortablePath::kCount));

// Per path: -1 not read yet, else 0/1.
std::atomic<int> g_state[size_t(PortablePath::kCount)] = {-1, -1, -1};

}  // namespace

bool CpuHasAvx512Bf16() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

bool PortablePathOn(PortablePath path) {
  std::atomic<int>& state = g_state[size_t(path)];
  int on = state.load(std::memory_order_relaxed);
  if (on < 0) {
    const PathInfo& info = kPaths[size_t(path)];
    const char* env = std::getenv(info.env);
    on = (!info.needs_avx512_bf16 || CpuHasAvx512Bf16()) && !(env != nullptr && env[0] == '0');
    state.store(on, std::memory_order_relaxed);
  }
  return on != 0;
}

void ReloadPortableSwitches() {
  for (std::atomic<int>& s : g_state) s.store(-1, std::memory_order_relaxed);
}

}  // namespace tefl::backends
