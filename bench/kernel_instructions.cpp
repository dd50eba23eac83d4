// Repeatable instruction counts of one op's kernel, for
// `valgrind --tool=callgrind` (bench/callgrind_kernel.sh): runs the op
// `calls` times on bf16 data (deterministic values) through tefl_call;
// the script runs it with 1 and with 5 calls, so the difference / 4 is one
// call, free of start-up and of the first call's one-off work.
//
// Usage: kernel_instructions OP ROWS COLS CALLS
//   OP: scaled_softmax_forward, scaled_masked_softmax_forward (a quarter of
//   the mask set), scaled_aligned_causal_masked_softmax_forward (input
//   [1, 1, ROWS, COLS], scale 0.5), dropout_fwd (p 0.1), or a one-input
//   activation such as gelu ([ROWS, COLS]; gated ones read [ROWS, 2 COLS]).
#include <dlpack/dlpack.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tefl/ops.h"
#include "tefl/tefl.h"

namespace {

uint16_t Bf16Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return uint16_t(u >> 16);
}

DLTensor Tensor(void* data, int ndim, int64_t* shape, uint8_t code, uint8_t bits) {
  return DLTensor{data, {kDLCPU, 0}, ndim, {code, bits, 1}, shape, nullptr, 0};
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s OP ROWS COLS CALLS\n", argv[0]);
    return 2;
  }
  const std::string op = argv[1];
  const int64_t rows = std::atoll(argv[2]), cols = std::atoll(argv[3]);
  const int calls = std::atoi(argv[4]);
  const int32_t id = tefl_op_id(op.c_str());
  if (id < 0 || rows <= 0 || cols <= 0 || calls <= 0) {
    std::fprintf(stderr, "unknown op or bad sizes\n");
    return 2;
  }
  const bool softmax = op.find("softmax_forward") != std::string::npos;
  const bool masked = op == "scaled_masked_softmax_forward";
  const bool dropout = op == "dropout_fwd";
  const bool gated = !softmax && !dropout && op.find("glu") != std::string::npos;
  const int64_t in_cols = gated ? 2 * cols : cols;
  const size_t n_in = size_t(rows * in_cols), n_out = size_t(rows * cols);

  std::vector<uint16_t> x(n_in), y(n_out);
  std::vector<uint8_t> mask(n_out);
  uint32_t state = 12345;  // LCG: values in [-5, 5), a quarter of the mask bytes set
  for (size_t i = 0; i < n_in; ++i) {
    state = state * 1664525u + 1013904223u;
    x[i] = Bf16Bits(float(state >> 8) / float(1u << 24) * 10.0f - 5.0f);
  }
  for (size_t i = 0; i < n_out; ++i) {
    state = state * 1664525u + 1013904223u;
    mask[i] = (state >> 30) == 0;
  }
  int64_t shape4[4] = {1, 1, rows, cols}, shape_in[2] = {rows, in_cols}, shape_out[2] = {rows, cols};
  DLTensor tx = softmax ? Tensor(x.data(), 4, shape4, kDLBfloat, 16) : Tensor(x.data(), 2, shape_in, kDLBfloat, 16);
  DLTensor ty = softmax ? Tensor(y.data(), 4, shape4, kDLBfloat, 16) : Tensor(y.data(), 2, shape_out, kDLBfloat, 16);
  DLTensor tm = softmax ? Tensor(mask.data(), 4, shape4, kDLUInt, 8) : Tensor(mask.data(), 2, shape_out, kDLUInt, 8);
  const DLTensor* in[2] = {&tx, &tm};
  DLTensor* out[2] = {&ty, &tm};
  tefl_softmax_attrs sm{TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, 0.5f};
  tefl_dropout_attrs dr{};
  dr.struct_size = TEFL_DROPOUT_ATTRS_STRUCT_SIZE;
  dr.seed = 42;
  dr.offset = 7;
  dr.p = 0.1f;
  const void* attrs = softmax ? static_cast<const void*>(&sm) : dropout ? static_cast<const void*>(&dr) : nullptr;
  const int nin = masked ? 2 : 1, nout = dropout ? 2 : 1;
  for (int c = 0; c < calls; ++c) {
    if (tefl_status* s = tefl_call(id, in, nin, out, nout, attrs, nullptr)) {
      std::fprintf(stderr, "%s\n", tefl_status_message(s));
      tefl_status_free(s);
      return 1;
    }
  }
  uint64_t hash = 0;  // uses the output (and prints a checksum to compare builds)
  for (uint16_t v : y) hash = hash * 31 + v;
  std::printf("%s [%lld, %lld] x %d calls, output hash %016llx\n", op.c_str(), static_cast<long long>(rows),
              static_cast<long long>(cols), calls, static_cast<unsigned long long>(hash));
  return 0;
}
