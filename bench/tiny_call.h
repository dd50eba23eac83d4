// The tiny rmsnorm_fwd call both dispatch benchmarks use: x [1, 8] fp32,
// compact CPU tensors, default attributes, and its call frame.
#ifndef TEFL_BENCH_TINY_CALL_H_
#define TEFL_BENCH_TINY_CALL_H_

#include <vector>

#include "tefl/tefl.hpp"

struct TinyCall {
  std::vector<float> x = std::vector<float>(8, 0.5f), g = std::vector<float>(8, 1.0f), z = std::vector<float>(8),
                     rs = std::vector<float>(1);
  int64_t xs[2] = {1, 8}, gs[1] = {8}, rss[1] = {1};
  DLTensor tx{x.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, nullptr, 0};
  DLTensor tg{g.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, gs, nullptr, 0};
  DLTensor tz{z.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, nullptr, 0};
  DLTensor trs{rs.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, rss, nullptr, 0};
  const DLTensor* in[2] = {&tx, &tg};
  DLTensor* out[2] = {&tz, &trs};
  tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};
  tefl_call_frame frame{
      TEFL_CALL_FRAME_STRUCT_SIZE, "rmsnorm_fwd", TEFL_OP_RMSNORM_FWD, 2, in, 2, out, &attrs, nullptr, tefl_host()};
};

#endif  // TEFL_BENCH_TINY_CALL_H_
