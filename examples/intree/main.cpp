// The in-tree example of TE-FL's README, in C++: (1) define an operator
// implementation, (2) register it as vendor.mybackend with priority 200,
// (3) call through the manager — and see in the log which implementation ran.
#include <cmath>
#include <cstdio>
#include <vector>

#include "tefl/tefl.hpp"

namespace {

// A DLTensor view of a std::vector<float> (compact row-major, CPU).
DLTensor View(std::vector<float>& data, std::vector<int64_t>& shape) {
  DLTensor t{};
  t.data = data.data();
  t.device = {kDLCPU, 0};
  t.ndim = int(shape.size());
  t.dtype = {kDLFloat, 32, 1};
  t.shape = shape.data();
  return t;
}

// 1. Define your operator implementation: fp32 RMSNorm, declining anything
//    else so the manager falls back to another implementation.
tefl::Status MyRmsNorm(const tefl_call_frame& frame) {
  const DLTensor* x = frame.inputs[0];
  const DLTensor* w = frame.inputs[1];
  const DLTensor* y = frame.outputs[0];
  const DLTensor* rs = frame.outputs[1];
  for (const DLTensor* t : {x, w, y}) {
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32) return {TEFL_UNSUPPORTED, "mybackend does fp32 only"};
  }
  const auto* attrs = static_cast<const tefl_rmsnorm_fwd_attrs*>(frame.attrs);
  const int64_t hidden = x->shape[x->ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
  const float* in = static_cast<const float*>(x->data);
  const float* weight = static_cast<const float*>(w->data);
  float* out = static_cast<float*>(y->data);
  float* rsigma = static_cast<float*>(rs->data);
  for (int64_t r = 0; r < rows; ++r) {
    float sum = 0.f;
    for (int64_t j = 0; j < hidden; ++j) sum += in[r * hidden + j] * in[r * hidden + j];
    const float inv = 1.f / std::sqrt(sum / float(hidden) + attrs->eps);
    const float shift = attrs->zero_centered_gamma ? 1.f : 0.f;
    for (int64_t j = 0; j < hidden; ++j) out[r * hidden + j] = in[r * hidden + j] * inv * (weight[j] + shift);
    rsigma[r] = inv;
  }
  return tefl::Status::OK();
}

}  // namespace

int main() {
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // keep our lines in order with the log on stderr
  // 2. Register to a registry.
  tefl::OpRegistry registry;
  tefl::Status s = registry.RegisterImpl(tefl::OpImpl::FromFunction(
      "rmsnorm_fwd", "vendor.mybackend", tefl::BackendImplKind::VENDOR, "mybackend", 200, MyRmsNorm));
  if (!s.ok()) {
    std::fprintf(stderr, "register failed: %s\n", s.ToString().c_str());
    return 1;
  }

  // 3. Call via the manager (it adds the built-in backends to the registry).
  tefl::OpManager manager(&registry);
  std::vector<int64_t> x_shape = {4, 1024}, w_shape = {1024}, rs_shape = {4};
  std::vector<float> x(4 * 1024), w(1024, 1.0f), y(x.size()), rsigma(4);
  for (size_t i = 0; i < x.size(); ++i) x[i] = std::sin(float(i) * 0.01f) * 2.0f - 0.5f;
  DLTensor xt = View(x, x_shape), wt = View(w, w_shape), yt = View(y, x_shape), rst = View(rsigma, rs_shape);

  // Vendor first, so mybackend (priority 200) serves the call.
  const tefl::PolicyContext prefer_vendor(tefl::GetPolicy().WithPrefer("vendor"));
  s = tefl::rmsnorm_fwd(xt, wt, 1e-5f, yt, rst, {.manager = &manager});
  if (!s.ok()) {
    std::fprintf(stderr, "rmsnorm_fwd failed: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("rmsnorm_fwd ran on '%s': y[0] = %.6f, rsigma[0] = %.6f\n",
              manager.GetSelectedImplId("rmsnorm_fwd").c_str(), double(y[0]), double(rsigma[0]));

  // The same call on the reference backend, to compare.
  std::vector<float> y_ref(y.size()), rs_ref(4);
  DLTensor yrt = View(y_ref, x_shape), rsrt = View(rs_ref, rs_shape);
  {
    const tefl::PolicyContext reference(tefl::GetPolicy().WithPrefer("reference"));
    s = tefl::rmsnorm_fwd(xt, wt, 1e-5f, yrt, rsrt, {.manager = &manager});
  }
  double max_err = 0;
  for (size_t i = 0; i < y.size(); ++i) max_err = std::fmax(max_err, std::fabs(double(y[i]) - double(y_ref[i])));
  std::printf("max |mybackend - %s| = %.3g\n", manager.GetSelectedImplId("rmsnorm_fwd").c_str(), max_err);
  return s.ok() && max_err < 1e-4 ? 0 : 1;
}
