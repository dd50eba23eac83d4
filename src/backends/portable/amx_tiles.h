// The AMX tile state of default.portable's bf16 kernels (gemm.cpp,
// attention.cpp). Every kernel that runs tdpbf16ps uses one configuration:
// palette 1, eight tiles of 16 rows x 64 bytes. A thread loads it before its
// tile work (AmxBegin) and releases the tiles after (AmxEnd): a released
// state costs nothing on context switches. Call only where CpuHasAmxBf16()
// (cpu_paths.h) is true: without the kernel's permission a tile instruction
// raises SIGILL.
//
// tdpbf16ps, like vdpbf16ps, reads subnormal bf16 inputs as zero and flushes
// subnormal fp32 results, so its callers guard it with the same checks.
#ifndef TEFL_SRC_BACKENDS_PORTABLE_AMX_TILES_H_
#define TEFL_SRC_BACKENDS_PORTABLE_AMX_TILES_H_

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define TEFL_HAVE_AMX_TILES 1
#include <immintrin.h>

#include <cstdint>

namespace tefl::backends {

struct alignas(64) AmxTileConfig {
  uint8_t palette, start_row;
  uint8_t reserved[14];
  uint16_t colsb[16];
  uint8_t rows[16];
};

__attribute__((target("amx-tile"))) inline void AmxBegin() {
  AmxTileConfig cfg{};
  cfg.palette = 1;
  for (int t = 0; t < 8; ++t) {
    cfg.colsb[t] = 64;
    cfg.rows[t] = 16;
  }
  // GCC 12's _tile_loadconfig tells the compiler it reads 8 bytes of cfg:
  // without this fence the stores above may be dropped.
  asm volatile("" : : "r"(&cfg) : "memory");
  _tile_loadconfig(&cfg);
}
__attribute__((target("amx-tile"))) inline void AmxEnd() { _tile_release(); }

// AmxBegin() now (when `on`), AmxEnd() when the scope ends, exceptions
// included.
class AmxTileScope {
 public:
  explicit AmxTileScope(bool on) : on_(on) {
    if (on_) AmxBegin();
  }
  ~AmxTileScope() {
    if (on_) AmxEnd();
  }
  AmxTileScope(const AmxTileScope&) = delete;
  AmxTileScope& operator=(const AmxTileScope&) = delete;

 private:
  bool on_;
};

}  // namespace tefl::backends
#else
#define TEFL_HAVE_AMX_TILES 0
#endif

#endif  // TEFL_SRC_BACKENDS_PORTABLE_AMX_TILES_H_
