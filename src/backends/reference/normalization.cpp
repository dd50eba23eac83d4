// reference.cpp — normalization: LayerNorm and RMSNorm forward and backward.
//
// The oracle every other implementation is tested against: plain scalar
// loops, every sum in double, each output rounded once to its dtype. Written
// to be read, not to be fast. Formulas: spec/ops.md (TransformerEngine's).
#include <cmath>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

// H = last dim of x; N = product of the others.
void RowsCols(const DLTensor* x, int64_t* rows, int64_t* cols) {
  *cols = x->shape[x->ndim - 1];
  *rows = 1;
  for (int d = 0; d + 1 < x->ndim; ++d) *rows *= x->shape[d];
}

double Weight(const Matrix& gamma, int64_t j, bool zero_centered) { return gamma.at(j) + (zero_centered ? 1.0 : 0.0); }

// ---- forward ---------------------------------------------------------------
// in (x, gamma[, beta]) -> out (z[, mu], rsigma). `layernorm` selects the
// centred variant.
tefl_status* NormForward(const tefl_call_frame* f, bool layernorm) {
  const auto* attrs = static_cast<const tefl_norm_fwd_attrs*>(f->attrs);
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt), gamma = View(f->inputs[1]);
  const Matrix beta = layernorm ? View(f->inputs[2]) : Matrix{nullptr, DType::kF32};
  const Matrix z = View(f->outputs[0]);
  const Matrix mu_out = layernorm ? View(f->outputs[1]) : Matrix{nullptr, DType::kF32};
  const Matrix rsigma_out = View(f->outputs[layernorm ? 2 : 1]);
  const bool zc = attrs->zero_centered_gamma != 0;
  int64_t rows, cols;
  RowsCols(xt, &rows, &cols);

  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    double mean = 0.0;
    if (layernorm) {
      for (int64_t j = 0; j < cols; ++j) mean += x.at(base + j);
      mean /= double(cols);
    }
    double sum_sq = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double c = x.at(base + j) - mean;
      sum_sq += c * c;
    }
    const double rsigma = 1.0 / std::sqrt(sum_sq / double(cols) + double(attrs->eps));
    for (int64_t j = 0; j < cols; ++j) {
      double v = (x.at(base + j) - mean) * rsigma * Weight(gamma, j, zc);
      if (layernorm) v += beta.at(j);
      z.set(base + j, v);
    }
    if (layernorm) mu_out.set(r, mean);
    rsigma_out.set(r, rsigma);
  }
  return nullptr;
}

// ---- backward --------------------------------------------------------------
// y = (x - mu) * rsigma; dy = g * dz; dx = rsigma * (dy - mean(dy*y) * y - mean(dy));
// dgamma = sum_rows(y * dz); dbeta = sum_rows(dz). mu = 0 and no mean(dy)
// term for RMSNorm.
struct BackwardArgs {
  Matrix dz, x, mu, rsigma, gamma, add, dx, dgamma, dbeta;
  bool layernorm, has_add, zero_centered;
};

tefl_status* NormBackward(const tefl_call_frame* f, const BackwardArgs& a) {
  int64_t rows, cols;
  RowsCols(f->inputs[1], &rows, &cols);
  std::vector<double> dgamma(size_t(cols), 0.0), dbeta(size_t(cols), 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * cols;
    const double mu = a.layernorm ? a.mu.at(r) : 0.0;
    const double rsigma = a.rsigma.at(r);
    double mean_dy = 0.0, mean_dyy = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double y = (a.x.at(base + j) - mu) * rsigma;
      const double dy = Weight(a.gamma, j, a.zero_centered) * a.dz.at(base + j);
      mean_dy += dy;
      mean_dyy += dy * y;
    }
    mean_dy /= double(cols);
    mean_dyy /= double(cols);
    for (int64_t j = 0; j < cols; ++j) {
      const double y = (a.x.at(base + j) - mu) * rsigma;
      const double dzv = a.dz.at(base + j);
      const double dy = Weight(a.gamma, j, a.zero_centered) * dzv;
      double dx = rsigma * (dy - mean_dyy * y - (a.layernorm ? mean_dy : 0.0));
      if (a.has_add) dx += a.add.at(base + j);
      a.dx.set(base + j, dx);
      dgamma[size_t(j)] += y * dzv;
      dbeta[size_t(j)] += dzv;
    }
  }
  for (int64_t j = 0; j < cols; ++j) {
    a.dgamma.set(j, dgamma[size_t(j)]);
    if (a.layernorm) a.dbeta.set(j, dbeta[size_t(j)]);
  }
  return nullptr;
}

bool ZeroCentered(const tefl_call_frame* f) {
  return static_cast<const tefl_norm_bwd_attrs*>(f->attrs)->zero_centered_gamma != 0;
}

tefl_status* LayerNormFwd(const tefl_call_frame* f, void*) { return NormForward(f, true); }
tefl_status* RmsNormFwd(const tefl_call_frame* f, void*) { return NormForward(f, false); }

tefl_status* LayerNormBwd(const tefl_call_frame* f, void*) {
  // in: dz, x, mu, rsigma, gamma; out: dx, dgamma, dbeta
  const Matrix none{nullptr, DType::kF32};
  return NormBackward(
      f, {View(f->inputs[0]), View(f->inputs[1]), View(f->inputs[2]), View(f->inputs[3]), View(f->inputs[4]), none,
          View(f->outputs[0]), View(f->outputs[1]), View(f->outputs[2]), true, false, ZeroCentered(f)});
}

tefl_status* RmsNormBwd(const tefl_call_frame* f, void*) {
  // in: dz, x, rsigma, gamma; out: dx, dgamma
  const Matrix none{nullptr, DType::kF32};
  return NormBackward(f, {View(f->inputs[0]), View(f->inputs[1]), none, View(f->inputs[2]), View(f->inputs[3]), none,
                          View(f->outputs[0]), View(f->outputs[1]), none, false, false, ZeroCentered(f)});
}

tefl_status* RmsNormBwdAdd(const tefl_call_frame* f, void*) {
  // in: dz, x, add, rsigma, gamma; out: dx, dgamma
  const Matrix none{nullptr, DType::kF32};
  return NormBackward(
      f, {View(f->inputs[0]), View(f->inputs[1]), none, View(f->inputs[3]), View(f->inputs[4]), View(f->inputs[2]),
          View(f->outputs[0]), View(f->outputs[1]), none, false, true, ZeroCentered(f)});
}

}  // namespace

tefl_status* RegisterReferenceNormalization(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"layernorm_fwd", LayerNormFwd}, {"layernorm_bwd", LayerNormBwd},    {"rmsnorm_fwd", RmsNormFwd},
      {"rmsnorm_bwd", RmsNormBwd},     {"rmsnorm_bwd_add", RmsNormBwdAdd},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
