// reference.cpp — softmax: the scaled, masked, upper-triangular and aligned
// causal softmax forward ops and their backward (spec/ops.md, "Softmax").
//
// The oracle the other implementations are tested against: plain scalar
// loops, sums in double, each output rounded once to its dtype.
//
// Per row of sk scores:
//  - the score is scale * x rounded to fp32 (TransformerEngine multiplies in
//    fp32), or -10000 where the explicit mask is 1 (TE's value);
//  - causal variants keep columns [0, kept) of the row and write 0 after them
//    (upper-triangular: kept = i + 1; aligned causal: kept = min(sk, i + sk -
//    sq + 1), which may be <= 0);
//  - a row with no kept column (fully masked, or an aligned-causal row above
//    the diagonal) is all 0;
//  - y = exp(s - max) / sum(exp(s - max)) in double. IEEE semantics: a NaN
//    score makes the row NaN; a +inf score gives exp(inf - inf) = NaN, so the
//    row is NaN; a row whose kept scores are all -inf is NaN too (-inf - -inf);
//    -inf among finite scores gives 0.
// Backward: dx = scale * y * (dy - sum(dy * y)), the sum in double; dx may be
// output_grads itself (each dy is read before dx at the same index is
// written, and the sum is taken before any dx is written).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

enum class Kind { kPlain, kMasked, kUpperTriang, kAlignedCausal };

float Scale(const tefl_call_frame* f) { return static_cast<const tefl_softmax_attrs*>(f->attrs)->scale; }

tefl_status* Forward(const tefl_call_frame* f, Kind kind) {
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt);
  const Matrix y = View(f->outputs[0]);
  const float scale = Scale(f);
  const int nd = xt->ndim;
  const int64_t sk = xt->shape[nd - 1];
  const int64_t sq = xt->shape[nd - 2];
  const int64_t rows = LeadingRows(xt);  // 0 when sk is 0
  // Masked: input [b, h, sq, sk], mask [b or 1, 1, sq, sk].
  const DLTensor* mt = kind == Kind::kMasked ? f->inputs[1] : nullptr;
  const auto* mask = mt ? static_cast<const uint8_t*>(DataPtr(mt)) : nullptr;
  const int64_t heads = nd == 4 ? xt->shape[1] : 1;
  const bool mask_broadcast = mt && mt->shape[0] == 1;

  std::vector<double> s(static_cast<size_t>(sk));
  const double nan = std::numeric_limits<double>::quiet_NaN();
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t i = r % sq;  // query position
    const int64_t base = r * sk;
    int64_t kept = sk;
    if (kind == Kind::kUpperTriang) kept = std::min(sk, i + 1);
    if (kind == Kind::kAlignedCausal) kept = std::clamp<int64_t>(i + sk - sq + 1, 0, sk);
    const uint8_t* mrow = nullptr;
    if (mask) {
      const int64_t b = r / (heads * sq);
      mrow = mask + ((mask_broadcast ? 0 : b) * sq + i) * sk;
    }
    bool any_kept = false, any_nan = false;
    double mx = -std::numeric_limits<double>::infinity();
    for (int64_t j = 0; j < kept; ++j) {
      if (mrow && mrow[j] != 0) {
        s[size_t(j)] = -10000.0;
      } else {
        s[size_t(j)] = double(scale * float(x.at(base + j)));  // the fp32 product
        any_kept = true;
      }
      if (std::isnan(s[size_t(j)])) any_nan = true;
      mx = std::max(mx, s[size_t(j)]);
    }
    if (!any_kept) {  // fully masked or above the aligned diagonal
      for (int64_t j = 0; j < sk; ++j) y.set(base + j, 0.0);
      continue;
    }
    if (any_nan) mx = nan;
    double sum = 0.0;
    for (int64_t j = 0; j < kept; ++j) {
      s[size_t(j)] = std::exp(s[size_t(j)] - mx);
      sum += s[size_t(j)];
    }
    for (int64_t j = 0; j < kept; ++j) y.set(base + j, s[size_t(j)] / sum);
    for (int64_t j = kept; j < sk; ++j) y.set(base + j, 0.0);
  }
  return nullptr;
}

tefl_status* Backward(const tefl_call_frame* f) {
  const DLTensor* dyt = f->inputs[0];
  const Matrix dy = View(dyt), y = View(f->inputs[1]), dx = View(f->outputs[0]);
  const double scale = Scale(f);
  const int64_t sk = dyt->shape[dyt->ndim - 1];
  const int64_t rows = LeadingRows(dyt);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t base = r * sk;
    double dot = 0.0;
    for (int64_t j = 0; j < sk; ++j) dot += dy.at(base + j) * y.at(base + j);
    for (int64_t j = 0; j < sk; ++j) {
      const double yj = y.at(base + j);
      dx.set(base + j, scale * yj * (dy.at(base + j) - dot));
    }
  }
  return nullptr;
}

tefl_status* PlainFwd(const tefl_call_frame* f, void*) { return Forward(f, Kind::kPlain); }
tefl_status* MaskedFwd(const tefl_call_frame* f, void*) { return Forward(f, Kind::kMasked); }
tefl_status* TriangFwd(const tefl_call_frame* f, void*) { return Forward(f, Kind::kUpperTriang); }
tefl_status* CausalFwd(const tefl_call_frame* f, void*) { return Forward(f, Kind::kAlignedCausal); }
tefl_status* AnyBwd(const tefl_call_frame* f, void*) { return Backward(f); }

}  // namespace

tefl_status* RegisterReferenceSoftmax(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"scaled_softmax_forward", PlainFwd},
      {"scaled_softmax_backward", AnyBwd},
      {"scaled_masked_softmax_forward", MaskedFwd},
      {"scaled_masked_softmax_backward", AnyBwd},
      {"scaled_upper_triang_masked_softmax_forward", TriangFwd},
      {"scaled_upper_triang_masked_softmax_backward", AnyBwd},
      {"scaled_aligned_causal_masked_softmax_forward", CausalFwd},
      {"scaled_aligned_causal_masked_softmax_backward", AnyBwd},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
