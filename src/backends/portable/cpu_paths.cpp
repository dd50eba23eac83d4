#include "backends/portable/cpu_paths.h"

#include <hwy/targets.h>

#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
#include <cpuid.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <mutex>
#include <string>

#include "core/logging.h"

namespace tefl::backends {
namespace {

enum class Needs { kNothing, kAvx512, kAvx512Bf16, kAvx512Bmi2, kAmxBf16 };
struct PathInfo {
  const char* env;
  Needs needs;
};
constexpr PathInfo kPaths[] = {
    // In PortablePath's order, one per line.
    {"TEFL_PORTABLE_BF16_CVT", Needs::kAvx512Bf16},         // kBf16Cvt
    {"TEFL_PORTABLE_BF16_FAST_ACT", Needs::kNothing},       // kBf16FastAct
    {"TEFL_PORTABLE_ATTN_BF16DOT", Needs::kAvx512Bf16},     // kAttnBf16Dot
    {"TEFL_PORTABLE_DROPOUT_AVX512", Needs::kAvx512Bmi2},   // kDropoutAvx512
    {"TEFL_PORTABLE_BF16_ACT_TABLE", Needs::kNothing},      // kBf16ActTable
    {"TEFL_PORTABLE_GEMM_AMX", Needs::kAmxBf16},            // kGemmAmx
    {"TEFL_PORTABLE_GEMM_F32_AVX512", Needs::kAvx512},      // kGemmF32Avx512
    {"TEFL_PORTABLE_GEMM_F32_A_IN_PLACE", Needs::kAvx512},  // kGemmF32AInPlace
    {"TEFL_PORTABLE_ATTN_AMX", Needs::kAmxBf16},            // kAttnAmx
};
static_assert(sizeof(kPaths) / sizeof(kPaths[0]) == size_t(PortablePath::kCount));

// Per path: -1 not read yet, else 0/1.
std::atomic<int> g_state[size_t(PortablePath::kCount)] = {-1, -1, -1, -1, -1, -1, -1, -1, -1};

}  // namespace

namespace {
struct IsaChoice {
  CpuIsaCap cap;
  const char* target;  // the Highway target dynamic dispatch picks
};
const IsaChoice& ChooseIsa() {
  static const IsaChoice choice = [] {
    CpuIsaCap c = CpuIsaCap::kAvx512;
    const char* env = std::getenv("TEFL_MAX_CPU_ISA");
    std::string v = env ? env : "";
    for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    if (v.empty() || v == "avx512") {
      c = CpuIsaCap::kAvx512;
    } else if (v == "avx2") {
      c = CpuIsaCap::kAvx2;
    } else if (v == "sse4") {
      c = CpuIsaCap::kSse4;
    } else if (v == "baseline") {
      c = CpuIsaCap::kBaseline;
    } else {
      TEFL_LOG(WARNING, "TEFL_MAX_CPU_ISA='{}' is not one of avx512, avx2, sse4, baseline; ignored", env);
    }
#if HWY_ARCH_X86
    // Highway orders targets best first by bit value: disable the bits below
    // the cap (the baseline target itself cannot be disabled).
    int64_t disabled = 0;
    if (c == CpuIsaCap::kAvx2) disabled = HWY_AVX2 - 1;
    if (c == CpuIsaCap::kSse4) disabled = HWY_SSE4 - 1;
    if (c == CpuIsaCap::kBaseline) disabled = HWY_STATIC_TARGET - 1;
    if (disabled != 0) hwy::DisableTargets(disabled);
#endif
    // Highway 1.0.3's SupportedTargets() re-chooses the dispatch target from
    // every target the CPU has, ignoring DisableTargets (later versions mask
    // first): dispatch ran AVX-512 code under TEFL_MAX_CPU_ISA=avx2 once
    // anything had asked for the target list. So it is asked once, here,
    // before any kernel runs, and the capped set is chosen right after.
    const int64_t supported = hwy::SupportedTargets();
    hwy::GetChosenTarget().Update(supported);
    const int64_t targets = supported & HWY_TARGETS;
    return IsaChoice{c, hwy::TargetName(targets & -targets)};  // the best one: the lowest bit
  }();
  return choice;
}
}  // namespace

CpuIsaCap ApplyMaxCpuIsa() { return ChooseIsa().cap; }

const char* PortableTargetName() { return ChooseIsa().target; }

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TEFL_CPU_SUPPORTS(feature) __builtin_cpu_supports(feature)
#else
#define TEFL_CPU_SUPPORTS(feature) false
#endif

bool CpuHasAvx512() {
  static const bool has = ApplyMaxCpuIsa() == CpuIsaCap::kAvx512 && TEFL_CPU_SUPPORTS("avx512f") &&
                          TEFL_CPU_SUPPORTS("avx512bw") && TEFL_CPU_SUPPORTS("avx512vl") &&
                          TEFL_CPU_SUPPORTS("avx512dq");
  return has;
}

bool CpuHasAvx512Bf16() {
  static const bool has = CpuHasAvx512() && TEFL_CPU_SUPPORTS("avx512bf16");
  return has;
}

bool CpuHasAvx512Bmi2() {
  static const bool has = CpuHasAvx512() && TEFL_CPU_SUPPORTS("bmi2");
  return has;
}

bool CpuHasAmxBf16() {
  static const bool has = [] {
    if (!CpuHasAvx512Bf16()) return false;
#if defined(__x86_64__) && defined(__linux__) && (defined(__GNUC__) || defined(__clang__))
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
    const bool amx_bf16 = (edx >> 22) & 1u, amx_tile = (edx >> 24) & 1u;
    if (!amx_bf16 || !amx_tile) return false;
    // The tile data state (XFEATURE_XTILEDATA, 18) is off for a process until
    // it asks; a kernel or hypervisor that does not offer it refuses.
    constexpr long kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;
    return syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
#else
    return false;
#endif
  }();
  return has;
}

static bool CpuHas(Needs needs) {
  switch (needs) {
    case Needs::kAvx512:
      return CpuHasAvx512();
    case Needs::kAvx512Bf16:
      return CpuHasAvx512Bf16();
    case Needs::kAvx512Bmi2:
      return CpuHasAvx512Bmi2();
    case Needs::kAmxBf16:
      return CpuHasAmxBf16();
    default:
      return true;
  }
}

namespace {
// A switch's value: 0/off/false/no turn the path off, 1/on/true/yes (or
// unset, or empty) leave it on; anything else is named in a warning and
// leaves it on (a typo must not silently pass for either).
bool SwitchValue(const char* name, const char* env) {
  if (env == nullptr) return true;
  std::string v = env;
  for (char& ch : v) ch = char(std::tolower(static_cast<unsigned char>(ch)));
  if (v == "0" || v == "off" || v == "false" || v == "no") return false;
  if (v.empty() || v == "1" || v == "on" || v == "true" || v == "yes") return true;
  TEFL_LOG(WARNING, "{}='{}' is not one of 0/off/false/no or 1/on/true/yes; the path stays on", name, env);
  return true;
}
}  // namespace

bool PortablePathOn(PortablePath path) {
  std::atomic<int>& state = g_state[size_t(path)];
  int on = state.load(std::memory_order_relaxed);
  if (on < 0) {
    const PathInfo& info = kPaths[size_t(path)];
    on = CpuHas(info.needs) && SwitchValue(info.env, std::getenv(info.env));
    state.store(on, std::memory_order_relaxed);
  }
  return on != 0;
}

void ReloadPortableSwitches() {
  for (std::atomic<int>& s : g_state) s.store(-1, std::memory_order_relaxed);
}

namespace {
std::atomic<unsigned long long> g_runs[size_t(PortablePath::kCount)];  // zero-initialised (constant init)
}  // namespace
void CountPortablePathRun(PortablePath path) { g_runs[size_t(path)].fetch_add(1, std::memory_order_relaxed); }
unsigned long long PortablePathRuns(PortablePath path) { return g_runs[size_t(path)].load(std::memory_order_relaxed); }

}  // namespace tefl::backends
