// Philox-4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2,
// 3", SC'11; Random123's philox4x32_10) and the dropout keep rule shared by
// every dropout implementation (include/tefl/ops.h, tefl_dropout_attrs).
#ifndef TEFL_SRC_BACKENDS_PHILOX_H_
#define TEFL_SRC_BACKENDS_PHILOX_H_

#include <cmath>
#include <cstdint>

namespace tefl::backends {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u, kPhiloxM1 = 0xCD9E8D57u;
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u, kPhiloxW1 = 0xBB67AE85u;

struct Philox4 {
  uint32_t v[4];
};

// Ten rounds; the key is bumped by (W0, W1) between rounds.
inline Philox4 Philox4x32_10(Philox4 c, uint32_t k0, uint32_t k1) {
  for (int r = 0; r < 10; ++r) {
    const uint64_t p0 = uint64_t(kPhiloxM0) * c.v[0];
    const uint64_t p1 = uint64_t(kPhiloxM1) * c.v[2];
    c = Philox4{{uint32_t(p1 >> 32) ^ c.v[1] ^ k0, uint32_t(p1), uint32_t(p0 >> 32) ^ c.v[3] ^ k1, uint32_t(p0)}};
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  return c;
}

// The four words for elements 8g .. 8g + 7: key (lo32(seed), hi32(seed)),
// counter (lo32(g), hi32(g), lo32(offset), hi32(offset)).
inline Philox4 DropoutWords(uint64_t seed, uint64_t offset, uint64_t g) {
  return Philox4x32_10(Philox4{{uint32_t(g), uint32_t(g >> 32), uint32_t(offset), uint32_t(offset >> 32)}},
                       uint32_t(seed), uint32_t(seed >> 32));
}

// The keep rule: element i takes the 16-bit half h = i % 8 of its group's
// words (word h / 2; its low half if h is even, high if odd) and is kept iff
// half >= threshold16 = ceil(p * 2^16). p is a float in [0, 1), so p * 2^16
// is exact in double and threshold16 is in [0, 2^16]: 0 (p = 0) keeps
// everything, 2^16 (p > 1 - 2^-16) nothing. P(kept) = 1 - threshold16 / 2^16,
// which is 1 - p whenever p * 2^16 is an integer.
inline uint32_t DropoutThreshold16(float p) {
  if (!(p > 0.0f)) return 0;
  return uint32_t(std::ceil(double(p) * 65536.0));
}

// Half h (0..7) of a group's words, in element order.
inline uint32_t DropoutHalf(const Philox4& w, uint64_t h) { return (w.v[h / 2] >> (16 * (h % 2))) & 0xFFFFu; }

// Whether element i of the group with words w is kept (h = i % 8).
inline bool DropoutKept(const Philox4& w, uint64_t h, uint32_t threshold16) { return DropoutHalf(w, h) >= threshold16; }

// Whether element i is kept, from scratch (one Philox call).
inline bool DropoutKeptAt(uint64_t seed, uint64_t offset, uint64_t i, uint32_t threshold16) {
  return DropoutKept(DropoutWords(seed, offset, i / 8), i % 8, threshold16);
}

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_PHILOX_H_
