// Stand-alone microbenchmark of the data movement around the bf16 AMX tile
// loop of default.portable's GEMM (AmxBlocks / AmxBody in
// src/backends/portable/gemm.cpp; figures in docs/perf-gemm.md, session 33).
// One thread, random bf16 operands (AMX's power draw depends on the data:
// --zero uses all-zero operands). Every configuration runs --rounds times,
// the configurations interleaved round by round (the machine is shared and
// its speed drifts); the table shows each one's median.
//
// The tile loop: a 32 x 32 fp32 block in tiles 0-3, per K step of 32 two A
// tiles (16 rows x 64 bytes) and two B tiles (rows of a packed 32-column B
// panel, 128 bytes apart), loaded a step ahead as AmxBlocks does.
//   products  tdpbf16ps alone (operand tiles loaded once): the units' rate
//   loop      calls of 8 steps (16 KiB of A, 16 KiB of B), the sums stored
//             and reloaded between calls, A and B cycling through buffers of
//             the sizes shown (16 KiB: L1, 256 KiB: L2)
//   task      AmxBody's blocking for K = 1024: per task of 64 rows, 16 B
//             panels (1 MiB of packed B, kept in L2), K in chunks of 8
//             steps over the task's two row blocks, their sums stored and
//             reloaded between chunks. "warm": the same task's A again and
//             again (A in L2); "stream": 64 tasks' A in turn (8 MiB, from
//             L3), with or without the next task's A prefetched into L2
//             (prefetcht1, spread over the task's steps as AmxBody does).
//             A packed (2 KiB per step, contiguous) or in place (rows of
//             K = 1024 bf16, 2 KiB apart). For "stream" the first panel of
//             a task and the others are timed apart (rdtsc). "D streamed":
//             also one 64-byte line of a 32 MiB D written per step by a
//             non-temporal store, about AmxBody's rate for a bf16 D.
//
// Usage: amx_tile_micro [--zero] [--rounds N]
// Prints one line per configuration: ns per tdpbf16ps (16 x 16 x 32
// multiply-adds), TFLOP/s, and for "stream" the TSC cycles of a task's
// first panel and of its other panels (mean).
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <x86intrin.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

namespace {

constexpr int64_t kSteps = 32;                            // K = 1024 (32 bf16 per step)
constexpr int64_t kStepBytes = 2048;                      // packed A or B: one step of a block / panel
constexpr int64_t kBlockBytes = kSteps * kStepBytes;      // one 32-row block of A or one B panel, whole K
constexpr int64_t kPanels = 16, kBlocks = 2, kChunk = 8;  // AmxBody at K = 1024
constexpr int64_t kTaskTdps = kPanels * kBlocks * kSteps * 4;
constexpr double kFlopPerTdp = 2.0 * 16 * 16 * 32;

bool CpuHasAmxBf16() {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) return false;
  return (d >> 22 & 1) && (d >> 24 & 1);  // AMX-BF16, AMX-TILE
}
bool RequestAmx() { return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0; }

struct alignas(64) TileConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};
__attribute__((target("amx-tile"))) void ConfigureTiles() {
  TileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  asm volatile("" : : "r"(&cfg) : "memory");  // GCC 12: the stores above must not be dropped
  _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile"))) void ReleaseTiles() { _tile_release(); }

// One call of the tile loop: sums (+)= A block . B panel over `steps` steps.
// A's tiles at a and a + a_hi, rows a_ld bytes apart, a_step bytes per step;
// pf_per_step lines from *pf are prefetched into L2 per step.
// One step's four products: sums tiles 0-3 += A tiles 4-5 x B tiles 6-7.
__attribute__((target("amx-tile,amx-bf16"), always_inline)) inline void ProductStep() {
  _tile_dpbf16ps(0, 4, 6);
  _tile_dpbf16ps(1, 4, 7);
  _tile_dpbf16ps(2, 5, 6);
  _tile_dpbf16ps(3, 5, 7);
}
// Tiles 0-3 into the 32 x 32 fp32 block `sums`.
__attribute__((target("amx-tile"), always_inline)) inline void StoreSums(float* sums) {
  _tile_stored(0, sums, 128);
  _tile_stored(1, sums + 16, 128);
  _tile_stored(2, sums + 512, 128);
  _tile_stored(3, sums + 528, 128);
}

// d_per_step 64-byte lines are streamed (non-temporal stores) to *d, rows
// kDRowBytes apart, as AmxBody writes a bf16 D.
constexpr int64_t kDRowBytes = 8192, kDBytes = int64_t(32) << 20;  // D of 4096 x 4096 bf16
__attribute__((target("amx-tile,amx-bf16,avx512f"), noinline)) void TileLoop(
    const char* a, int64_t a_ld, int64_t a_hi, int64_t a_step, const char* b, int64_t steps, float* sums, bool first,
    const char** pf, int64_t pf_per_step, char* d_base, int64_t* d_at, int64_t d_per_step) {
  asm volatile("" ::: "memory");
  if (first) {
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
  } else {
    _tile_loadd(0, sums, 128);
    _tile_loadd(1, sums + 16, 128);
    _tile_loadd(2, sums + 512, 128);
    _tile_loadd(3, sums + 528, 128);
  }
  _tile_loadd(4, a, a_ld);
  _tile_loadd(6, b, 128);
  _tile_loadd(7, b + 64, 128);
  _tile_loadd(5, a + a_hi, a_ld);
  const char* p = *pf;
  for (int64_t s = 1; s < steps; ++s) {
    a += a_step;
    b += kStepBytes;
    for (int64_t i = 0; i < pf_per_step; ++i, p += 64) _mm_prefetch(p, _MM_HINT_T1);
    for (int64_t i = 0; i < d_per_step; ++i) {
      _mm512_stream_si512(reinterpret_cast<__m512i*>(d_base + *d_at), _mm512_setzero_si512());
      *d_at += kDRowBytes;  // down a column of rows, then the next 64 bytes
      if (*d_at >= kDBytes) *d_at = (*d_at + 64) % kDRowBytes;
    }
    _tile_dpbf16ps(0, 4, 6);
    _tile_dpbf16ps(1, 4, 7);
    _tile_loadd(4, a, a_ld);
    _tile_dpbf16ps(2, 5, 6);
    _tile_loadd(6, b, 128);
    _tile_dpbf16ps(3, 5, 7);
    _tile_loadd(5, a + a_hi, a_ld);
    _tile_loadd(7, b + 64, 128);
  }
  *pf = p;
  ProductStep();
  StoreSums(sums);
  asm volatile("" ::: "memory");
}
// tdpbf16ps alone: `steps` x 4 products on operand tiles loaded once.
__attribute__((target("amx-tile,amx-bf16"), noinline)) void ProductsOnly(const char* a, const char* b, int64_t steps,
                                                                         float* sums) {
  asm volatile("" ::: "memory");
  _tile_zero(0);
  _tile_zero(1);
  _tile_zero(2);
  _tile_zero(3);
  _tile_loadd(4, a, 64);
  _tile_loadd(5, a + 1024, 64);
  _tile_loadd(6, b, 128);
  _tile_loadd(7, b + 64, 128);
  for (int64_t s = 0; s < steps; ++s) ProductStep();
  StoreSums(sums);
  asm volatile("" ::: "memory");
}

struct Buffer {
  char* p = nullptr;
  explicit Buffer(size_t bytes, bool zero, std::mt19937& rng) {
    p = static_cast<char*>(std::aligned_alloc(4096, bytes));
    if (p == nullptr) {
      std::fprintf(stderr, "amx_tile_micro: out of memory\n");
      std::exit(1);
    }
    auto* h = reinterpret_cast<uint16_t*>(p);
    // bf16 in [1, 4) with random signs and mantissas: no subnormals, no overflow in the sums' range.
    for (size_t i = 0; i < bytes / 2; ++i)
      h[i] = zero ? 0 : uint16_t((rng() & 0x807Fu) | (0x3F80u + (rng() & 1) * 0x80));
  }
  ~Buffer() { std::free(p); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
};

struct Result {
  std::vector<double> ns_per_tdp, first, rest;  // per round
};

double Median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  bool zero = false;
  int rounds = 7;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--zero") {
      zero = true;
    } else if (arg == "--rounds" && i + 1 < argc) {
      rounds = std::atoi(argv[++i]);
    } else {
      std::fprintf(stderr, "usage: amx_tile_micro [--zero] [--rounds N]  (unknown argument '%s')\n", arg.c_str());
      return 2;
    }
  }
  if (rounds < 1) {
    std::fprintf(stderr, "amx_tile_micro: --rounds must be at least 1\n");
    return 2;
  }
  if (!CpuHasAmxBf16() || !RequestAmx()) {
    std::printf("amx_tile_micro: this CPU (or kernel) offers no AMX-BF16 tiles; nothing to measure\n");
    return 0;
  }
  std::mt19937 rng(1);
  constexpr int64_t kSupers = 64;  // "stream": 8 MiB of A
  Buffer a_big(size_t(kSupers) * kBlocks * kBlockBytes, zero, rng);
  Buffer b_group(size_t(kPanels) * kBlockBytes, zero, rng);
  Buffer d(size_t(kDBytes), true, rng);  // written by the D stores only
  int64_t d_at = 0;
  alignas(64) static float sums[kBlocks][32 * 32];
  ConfigureTiles();

  // "loop": A cycles through a_kib, B through b_kib; per call 32 steps.
  auto loop = [&](int64_t a_kib, int64_t b_kib) {
    return [&, a_kib, b_kib](Result& r) {
      const int64_t a_bytes = a_kib << 10, b_bytes = b_kib << 10, calls = 100000, chunk_bytes = kChunk * kStepBytes;
      const char* none = nullptr;
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t c = 0; c < calls; ++c) {
        const char* a = a_big.p + (c * chunk_bytes) % a_bytes;
        const char* b = b_group.p + (c * chunk_bytes) % b_bytes;
        TileLoop(a, 64, 1024, kStepBytes, b, kChunk, sums[0], c == 0, &none, 0, nullptr, nullptr, 0);
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.ns_per_tdp.push_back(s * 1e9 / (double(calls) * kChunk * 4));
    };
  };
  auto products = [&](Result& r) {
    const int64_t calls = 20000;
    const auto t0 = std::chrono::steady_clock::now();
    for (int64_t c = 0; c < calls; ++c) ProductsOnly(a_big.p, b_group.p, kSteps, sums[0]);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.ns_per_tdp.push_back(s * 1e9 / (double(calls) * kSteps * 4));
  };
  // "task": supers = 1 (warm) or kSupers (stream); in_place: A rows 2 KiB apart.
  auto task = [&](int64_t supers, bool in_place, bool prefetch, int64_t d_per_step = 0) {
    return [&, supers, in_place, prefetch, d_per_step](Result& r) {
      const int64_t a_ld = in_place ? kSteps * 64 : 64, a_hi = in_place ? 16 * a_ld : 1024;
      const int64_t a_step = in_place ? 64 : kStepBytes, block_bytes = kBlockBytes;
      const int64_t calls_per_task = kPanels * (kSteps / kChunk) * kBlocks;
      const int64_t super_lines = kBlocks * block_bytes / 64;
      const int64_t pf_per_step =
          prefetch ? (super_lines + calls_per_task * (kChunk - 1) - 1) / (calls_per_task * (kChunk - 1)) : 0;
      const int64_t tasks = 4 * kSupers;
      uint64_t first = 0, rest = 0;
      const auto t0 = std::chrono::steady_clock::now();
      for (int64_t t = 0; t < tasks; ++t) {
        const int64_t su = t % supers;
        const char* a_task = a_big.p + su * kBlocks * block_bytes;  // in place: 64 rows x 2 KiB, the same bytes
        const char* pf = a_big.p + ((su + 1) % supers) * kBlocks * block_bytes;
        const char* pf_end = pf + kBlocks * block_bytes;
        for (int64_t p = 0; p < kPanels; ++p) {
          const uint64_t c0 = __rdtsc();
          for (int64_t s0 = 0; s0 < kSteps; s0 += kChunk)
            for (int64_t j = 0; j < kBlocks; ++j) {
              const char* a = a_task + j * block_bytes + s0 * a_step;
              TileLoop(a, a_ld, a_hi, a_step, b_group.p + p * kBlockBytes + s0 * kStepBytes, kChunk, sums[j], s0 == 0,
                       &pf, pf < pf_end ? pf_per_step : 0, d.p, &d_at, d_per_step);
            }
          (p == 0 ? first : rest) += __rdtsc() - c0;
        }
      }
      const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      r.ns_per_tdp.push_back(s * 1e9 / (double(tasks) * kTaskTdps));
      r.first.push_back(double(first) / double(tasks));
      r.rest.push_back(double(rest) / double(tasks * (kPanels - 1)));
    };
  };
  struct Config {
    const char* name;
    std::function<void(Result&)> run;
    bool panels;
    Result result;
  };
  std::vector<Config> configs;
  configs.push_back({"products only (tiles loaded once)", products, false, {}});
  configs.push_back({"loop, A 16 KiB (L1), B 16 KiB (L1)", loop(16, 16), false, {}});
  configs.push_back({"loop, A 256 KiB (L2), B 16 KiB (L1)", loop(256, 16), false, {}});
  configs.push_back({"loop, A 256 KiB (L2), B 256 KiB (L2)", loop(256, 256), false, {}});
  configs.push_back({"task warm, A packed", task(1, false, false), false, {}});
  configs.push_back({"task warm, A in place", task(1, true, false), false, {}});
  configs.push_back({"task stream, A packed, next A prefetched", task(kSupers, false, true), true, {}});
  configs.push_back({"task stream, A packed, no prefetch", task(kSupers, false, false), true, {}});
  configs.push_back({"task stream, A in place, next A prefetched", task(kSupers, true, true), true, {}});
  configs.push_back({"task stream, A in place, no prefetch", task(kSupers, true, false), true, {}});
  configs.push_back({"task stream, A in place, prefetched, D streamed", task(kSupers, true, true, 1), true, {}});
  for (auto& c : configs) {  // warm-up round, not counted
    Result scratch;
    c.run(scratch);
  }
  for (int round = 0; round < rounds; ++round)
    for (auto& c : configs) c.run(c.result);
  ReleaseTiles();
  std::printf("amx_tile_micro: one thread, %s operands, median of %d rounds\n", zero ? "all-zero" : "random", rounds);
  std::printf("%-50s %10s %9s %14s %14s\n", "configuration", "ns/tdp", "TFLOP/s", "first panel", "other panels");
  for (const auto& c : configs) {
    const double ns = Median(c.result.ns_per_tdp);
    std::printf("%-50s %10.2f %9.2f", c.name, ns, kFlopPerTdp / ns * 1e-3);
    if (c.panels) std::printf(" %14.0f %14.0f", Median(c.result.first), Median(c.result.rest));
    std::printf("\n");
  }
  return 0;
}
