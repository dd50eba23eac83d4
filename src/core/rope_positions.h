// RoPE: the frequency row (position) of a token, shared by the catalogue's
// range checks and the default.portable kernels (reference.cpp spells the
// rule out on its own: it is the oracle).
#ifndef TEFL_SRC_CORE_ROPE_POSITIONS_H_
#define TEFL_SRC_CORE_ROPE_POSITIONS_H_

#include <cstdint>

namespace tefl {

// Position of local token t in a sequence of local length len on context-
// parallel rank cp_rank of cp_size (TransformerEngine's dual-chunk order:
// the global sequence is 2 * cp_size chunks of len / 2 tokens and this rank
// holds chunks cp_rank and 2 * cp_size - 1 - cp_rank). cp_size 1: t. len is
// even when cp_size > 1 (validated). Monotonic in t.
inline int64_t RopeLocalPosition(int64_t t, int64_t len, int32_t cp_size, int32_t cp_rank) {
  if (cp_size <= 1) return t;
  const int64_t half = len / 2;
  return t < half ? int64_t(cp_rank) * half + t : (2 * int64_t(cp_size) - cp_rank - 1) * half + (t - half);
}

}  // namespace tefl

#endif  // TEFL_SRC_CORE_ROPE_POSITIONS_H_
