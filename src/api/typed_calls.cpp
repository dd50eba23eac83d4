// Typed C++ calls per op: build the attribute struct and the argument arrays
// on the stack, then one OpManager::Call.
#include "tefl/tefl.hpp"

namespace tefl {
namespace {
OpManager& ManagerOf(const CallOptions& opts) { return opts.manager ? *opts.manager : GetDefaultManager(); }
tefl_norm_bwd_attrs BwdAttrs(const CallOptions& opts) {
  return tefl_norm_bwd_attrs{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, opts.zero_centered_gamma ? 1 : 0, opts.sm_margin};
}
}  // namespace

Status layernorm_fwd(const DLTensor& x, const DLTensor& gamma, const DLTensor& beta, float eps, DLTensor& z,
                     DLTensor& mu, DLTensor& rsigma, const CallOptions& opts) {
  const tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, eps, opts.zero_centered_gamma ? 1 : 0,
                                  opts.sm_margin};
  const DLTensor* in[] = {&x, &gamma, &beta};
  DLTensor* out[] = {&z, &mu, &rsigma};
  return ManagerOf(opts).Call(TEFL_OP_LAYERNORM_FWD, in, out, &attrs, opts.stream);
}

Status layernorm_bwd(const DLTensor& dz, const DLTensor& x, const DLTensor& mu, const DLTensor& rsigma,
                     const DLTensor& gamma, DLTensor& dx, DLTensor& dgamma, DLTensor& dbeta, const CallOptions& opts) {
  const tefl_norm_bwd_attrs attrs = BwdAttrs(opts);
  const DLTensor* in[] = {&dz, &x, &mu, &rsigma, &gamma};
  DLTensor* out[] = {&dx, &dgamma, &dbeta};
  return ManagerOf(opts).Call(TEFL_OP_LAYERNORM_BWD, in, out, &attrs, opts.stream);
}

Status rmsnorm_fwd(const DLTensor& x, const DLTensor& gamma, float eps, DLTensor& z, DLTensor& rsigma,
                   const CallOptions& opts) {
  const tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, eps, opts.zero_centered_gamma ? 1 : 0,
                                  opts.sm_margin};
  const DLTensor* in[] = {&x, &gamma};
  DLTensor* out[] = {&z, &rsigma};
  return ManagerOf(opts).Call(TEFL_OP_RMSNORM_FWD, in, out, &attrs, opts.stream);
}

Status rmsnorm_bwd(const DLTensor& dz, const DLTensor& x, const DLTensor& rsigma, const DLTensor& gamma, DLTensor& dx,
                   DLTensor& dgamma, const CallOptions& opts) {
  const tefl_norm_bwd_attrs attrs = BwdAttrs(opts);
  const DLTensor* in[] = {&dz, &x, &rsigma, &gamma};
  DLTensor* out[] = {&dx, &dgamma};
  return ManagerOf(opts).Call(TEFL_OP_RMSNORM_BWD, in, out, &attrs, opts.stream);
}

Status rmsnorm_bwd_add(const DLTensor& dz, const DLTensor& x, const DLTensor& add, const DLTensor& rsigma,
                       const DLTensor& gamma, DLTensor& dx, DLTensor& dgamma, const CallOptions& opts) {
  const tefl_norm_bwd_attrs attrs = BwdAttrs(opts);
  const DLTensor* in[] = {&dz, &x, &add, &rsigma, &gamma};
  DLTensor* out[] = {&dx, &dgamma};
  return ManagerOf(opts).Call(TEFL_OP_RMSNORM_BWD_ADD, in, out, &attrs, opts.stream);
}

}  // namespace tefl
