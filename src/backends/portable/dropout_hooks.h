// Test hook of default.portable's dropout_fwd (src/backends/portable/dropout.cpp).
#ifndef TEFL_SRC_BACKENDS_PORTABLE_DROPOUT_HOOKS_H_
#define TEFL_SRC_BACKENDS_PORTABLE_DROPOUT_HOOKS_H_

#include <cstdint>

#include "core/dtype.h"

namespace tefl::backends {

// The AVX-512 dropout_fwd path (PortablePath::kDropoutAvx512) on compact CPU
// buffers of n elements, single-threaded, with the element index shifted:
// element i of x / y / mask is element 8 * first_group + i of the op's index
// space (its Philox group is first_group + i / 8), so tests can reach groups
// near multiples of 2^32 without 32 GiB tensors. Returns false (nothing
// written) where the path is off or not built.
bool PortableDropoutFwdAtGroup(DType tx, DType ty, int64_t n, uint64_t first_group, uint64_t seed, uint64_t offset,
                               float p, const void* x, void* y, uint8_t* mask);

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_PORTABLE_DROPOUT_HOOKS_H_
