#include "backends/portable/cpu_paths.h"

#include <atomic>
#include <cstdlib>

namespace tefl::backends {
namespace {

enum class Needs { kNothing, kAvx512Bf16, kAvx512Bmi2 };
struct PathInfo {
  const char* env;
  Needs needs;
};
constexpr PathInfo kPaths[] = {
    {"TEFL_PORTABLE_BF16_CVT", Needs::kAvx512Bf16},
    {"TEFL_PORTABLE_BF16_FAST_ACT", Needs::kNothing},
    {"TEFL_PORTABLE_ATTN_BF16DOT", Needs::kAvx512Bf16},
    {"TEFL_PORTABLE_DROPOUT_AVX512", Needs::kAvx512Bmi2},
};
static_assert(sizeof(kPaths) / sizeof(kPaths[0]) == size_t(PortablePath::kCount));

// Per path: -1 not read yet, else 0/1.
std::atomic<int> g_state[size_t(PortablePath::kCount)] = {-1, -1, -1, -1};

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

bool CpuHasAvx512Bmi2() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
                          __builtin_cpu_supports("bmi2");
  return has;
#else
  return false;
#endif
}

static bool CpuHas(Needs needs) {
  switch (needs) {
    case Needs::kAvx512Bf16:
      return CpuHasAvx512Bf16();
    case Needs::kAvx512Bmi2:
      return CpuHasAvx512Bmi2();
    default:
      return true;
  }
}

bool PortablePathOn(PortablePath path) {
  std::atomic<int>& state = g_state[size_t(path)];
  int on = state.load(std::memory_order_relaxed);
  if (on < 0) {
    const PathInfo& info = kPaths[size_t(path)];
    const char* env = std::getenv(info.env);
    on = CpuHas(info.needs) && !(env != nullptr && env[0] == '0');
    state.store(on, std::memory_order_relaxed);
  }
  return on != 0;
}

void ReloadPortableSwitches() {
  for (std::atomic<int>& s : g_state) s.store(-1, std::memory_order_relaxed);
}

}  // namespace tefl::backends
