// reference.cpp — FP8 quantization and scaling recipes, and the fused FP8
// outputs of rmsnorm/layernorm forward and the gated activations.
//
// The oracle: plain scalar loops, core/fp8.h's exact scalar conversions.
// Formulas: spec/ops.md "FP8 and scaling recipes" (TransformerEngine's).
//  - quantize: q = FloatToFp8(x * scale) with the product in fp32 (as TE);
//    the format is q's dtype. amax = max|x| over the unscaled input.
//  - amax: NaN when any element is NaN (TE's fmaxf-based reduction skips
//    NaN; here it propagates, so a NaN input is visible and the recipes then
//    keep the previous scale / use 1), 0 for an empty tensor.
//  - scale_inv = 1 / scale in fp32.
//  - The fused variants compute the base op in double (as the base op's
//    reference does), round it to fp32 once, then quantize FloatToFp8(z *
//    scale); amax = max|z| of the fp32 z.
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "core/fp8.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

Fp8Format FormatOf(const DLTensor* t) {
  return DTypeOf(t->dtype) == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2;
}
float FormatMax(int32_t fp8_format) { return fp8_format == TEFL_FP8_E5M2 ? 57344.0f : 448.0f; }

float* F32(const DLTensor* t) { return static_cast<float*>(DataPtr(t)); }

// max(amax, |v|) with NaN propagating.
float AmaxStep(float amax, float v) {
  const float a = std::fabs(v);
  if (std::isnan(amax) || std::isnan(a)) return std::numeric_limits<float>::quiet_NaN();
  return a > amax ? a : amax;
}

// Writes the shared tail of every FP8-output op: amax and scale_inv.
void WriteAmaxScaleInv(const DLTensor* amax_t, const DLTensor* scale_inv_t, float amax, float scale) {
  *F32(amax_t) = amax;
  *F32(scale_inv_t) = 1.0f / scale;
}

// ---- quantize / dequantize / compute_amax ---------------------------------------
// in (x, scale) -> out (q, amax, scale_inv)
tefl_status* Quantize(const tefl_call_frame* f, void*) {
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt);
  const float scale = *F32(f->inputs[1]);
  auto* q = static_cast<uint8_t*>(DataPtr(f->outputs[0]));
  const Fp8Format fmt = FormatOf(f->outputs[0]);
  const int64_t n = NumElements(xt);
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    const float v = float(x.at(i));
    amax = AmaxStep(amax, v);
    q[i] = FloatToFp8(v * scale, fmt);
  }
  WriteAmaxScaleInv(f->outputs[1], f->outputs[2], amax, scale);
  return nullptr;
}

// in (q, scale_inv) -> out (x)
tefl_status* Dequantize(const tefl_call_frame* f, void*) {
  const DLTensor* qt = f->inputs[0];
  const auto* q = static_cast<const uint8_t*>(DataPtr(qt));
  const Fp8Format fmt = FormatOf(qt);
  const float scale_inv = *F32(f->inputs[1]);
  const Matrix x = View(f->outputs[0]);
  const int64_t n = NumElements(qt);
  for (int64_t i = 0; i < n; ++i) x.set(i, double(Fp8ToFloat(q[i], fmt) * scale_inv));
  return nullptr;
}

// in (x) -> out (amax)
tefl_status* ComputeAmax(const tefl_call_frame* f, void*) {
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt);
  const int64_t n = NumElements(xt);
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = AmaxStep(amax, float(x.at(i)));
  *F32(f->outputs[0]) = amax;
  return nullptr;
}

// ---- scaling recipes ----------------------------------------------------------------
// Current scaling. in (amax[n]) -> out (scale[n], scale_inv[n])
tefl_status* ComputeScaleFromAmax(const tefl_call_frame* f, void*) {
  const auto* attrs = static_cast<const tefl_compute_scale_attrs*>(f->attrs);
  const float fp8_max = FormatMax(attrs->fp8_format);
  const float* amax = F32(f->inputs[0]);
  float* scale = F32(f->outputs[0]);
  float* scale_inv = F32(f->outputs[1]);
  const int64_t n = NumElements(f->inputs[0]);
  for (int64_t i = 0; i < n; ++i) {
    float a = amax[i];
    if (a < attrs->epsilon) a = attrs->epsilon;  // NaN stays NaN
    float s;
    if (a == 0.0f || std::isinf(a) || std::isnan(a)) {
      s = 1.0f;
    } else {
      s = fp8_max / a;
      if (std::isinf(s)) s = FLT_MAX;
    }
    if (attrs->force_pow_2_scales) s = std::bit_cast<float>(std::bit_cast<uint32_t>(s) & 0xFF800000u);
    scale[i] = s;
    scale_inv[i] = 1.0f / s;
  }
  return nullptr;
}

// Delayed scaling. in (amax_history[len, n], scale[n]) -> out
// (new_amax_history[len, n], new_scale[n]); the history may be updated in
// place (each column is read whole before it is written).
tefl_status* DelayedScaleUpdate(const tefl_call_frame* f, void*) {
  const auto* attrs = static_cast<const tefl_delayed_scaling_attrs*>(f->attrs);
  const float sf = FormatMax(attrs->fp8_format) * std::exp2(-attrs->margin);
  const DLTensor* ht = f->inputs[0];
  const int64_t len = ht->shape[0], n = ht->shape[1];
  const float* hist = F32(ht);
  const float* scale = F32(f->inputs[1]);
  float* new_hist = F32(f->outputs[0]);
  float* new_scale = F32(f->outputs[1]);
  if (n == 0) return nullptr;  // no column (len may be anything: [2^60, 0])
  std::vector<float> column(static_cast<size_t>(len));
  for (int64_t j = 0; j < n; ++j) {
    for (int64_t i = 0; i < len; ++i) column[size_t(i)] = hist[i * n + j];
    float amax;
    if (attrs->amax_compute_algo == TEFL_AMAX_ALGO_MOST_RECENT) {
      amax = column[0];
    } else {
      amax = column[0];
      for (int64_t i = 1; i < len; ++i) amax = column[size_t(i)] > amax ? column[size_t(i)] : amax;
      for (int64_t i = 0; i < len; ++i)
        if (std::isnan(column[size_t(i)])) amax = column[size_t(i)];
    }
    float s = scale[j];
    if (std::isfinite(amax) && amax > 0.0f) {
      s = sf / amax;
      if (std::isinf(s)) s = FLT_MAX;
    }
    // Roll by -1, then zero the new row 0.
    for (int64_t i = 0; i + 1 < len; ++i) new_hist[i * n + j] = column[size_t(i + 1)];
    new_hist[(len - 1) * n + j] = column[0];
    new_hist[j] = 0.0f;
    new_scale[j] = s;
  }
  return nullptr;
}

// ---- fp8_transpose --------------------------------------------------------------
tefl_status* Fp8Transpose(const tefl_call_frame* f, void*) {
  const DLTensor* qt = f->inputs[0];
  const int64_t m = qt->shape[0], n = qt->shape[1];
  const auto* q = static_cast<const uint8_t*>(DataPtr(qt));
  auto* t = static_cast<uint8_t*>(DataPtr(f->outputs[0]));
  if (n == 0) return nullptr;  // [M, 0]: nothing to write, for any M
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) t[j * m + i] = q[i * n + j];
  return nullptr;
}

// ---- fused FP8 outputs -----------------------------------------------------------
// Quantizes z (double, rounded once to fp32) into q[i]; updates amax.
struct Fp8Sink {
  uint8_t* q;
  Fp8Format fmt;
  float scale;
  float amax = 0.0f;
  void Put(int64_t i, double z) {
    const float zf = float(z);
    amax = AmaxStep(amax, zf);
    q[i] = FloatToFp8(zf * scale, fmt);
  }
};

// rmsnorm_fwd_fp8: in (x, gamma, scale) -> out (z, rsigma, amax, scale_inv)
// layernorm_fwd_fp8: in (x, gamma, beta, scale) -> out (z, mu, rsigma, amax, scale_inv)
tefl_status* NormFwdFp8(const tefl_call_frame* f, bool layernorm) {
  const auto* attrs = static_cast<const tefl_norm_fwd_attrs*>(f->attrs);
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt), gamma = View(f->inputs[1]);
  const Matrix beta = layernorm ? View(f->inputs[2]) : Matrix{nullptr, DType::kF32};
  const float scale = *F32(f->inputs[layernorm ? 3 : 2]);
  const DLTensor* zt = f->outputs[0];
  Fp8Sink sink{static_cast<uint8_t*>(DataPtr(zt)), FormatOf(zt), scale};
  const Matrix mu_out = layernorm ? View(f->outputs[1]) : Matrix{nullptr, DType::kF32};
  const Matrix rsigma_out = View(f->outputs[layernorm ? 2 : 1]);
  const bool zc = attrs->zero_centered_gamma != 0;
  const int64_t cols = xt->shape[xt->ndim - 1];
  const int64_t rows = LeadingRows(xt);
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
      double v = (x.at(base + j) - mean) * rsigma * (gamma.at(j) + (zc ? 1.0 : 0.0));
      if (layernorm) v += beta.at(j);
      sink.Put(base + j, v);
    }
    if (layernorm) mu_out.set(r, mean);
    rsigma_out.set(r, rsigma);
  }
  const int first_tail = layernorm ? 3 : 2;
  WriteAmaxScaleInv(f->outputs[first_tail], f->outputs[first_tail + 1], sink.amax, scale);
  return nullptr;
}
tefl_status* RmsNormFwdFp8(const tefl_call_frame* f, void*) { return NormFwdFp8(f, false); }
tefl_status* LayerNormFwdFp8(const tefl_call_frame* f, void*) { return NormFwdFp8(f, true); }

// The activations in double, as reference/activation.cpp (TE's formulas).
double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }
enum class Act { kGlu, kGelu, kQGelu, kRelu, kSrelu, kSilu, kClamped };

// in (input[N.., 2H], scale) -> out (output[N.., H], amax, scale_inv):
// output = act(a) * gate(b).
template <Act kAct>
tefl_status* GatedFp8(const tefl_call_frame* f, void*) {
  const DLTensor* xt = f->inputs[0];
  const Matrix x = View(xt);
  const float scale = *F32(f->inputs[1]);
  const DLTensor* yt = f->outputs[0];
  Fp8Sink sink{static_cast<uint8_t*>(DataPtr(yt)), FormatOf(yt), scale};
  double limit = 0.0, alpha = 0.0;
  if (kAct == Act::kClamped) {
    const auto* attrs = static_cast<const tefl_clamped_swiglu_attrs*>(f->attrs);
    limit = attrs->limit;
    alpha = attrs->alpha;
  }
  const int64_t h = xt->shape[xt->ndim - 1] / 2;
  const int64_t rows = LeadingRows(xt);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const double a = x.at(r * 2 * h + j);
      double b = x.at(r * 2 * h + h + j);
      double act = 0.0;
      switch (kAct) {
        case Act::kGlu:
          act = Sigmoid(a);
          break;
        case Act::kGelu:
          act = a * (0.5 + 0.5 * std::tanh(a * (0.79788456 + 0.03567741 * a * a)));
          break;
        case Act::kQGelu:
          act = a * Sigmoid(double(1.702f) * a);
          break;
        case Act::kRelu:
          act = a < 0.0 ? 0.0 : a;
          break;
        case Act::kSrelu:
          act = a <= 0.0 ? 0.0 : a * a;
          break;
        case Act::kSilu:
          act = a * Sigmoid(a);
          break;
        case Act::kClamped: {
          const double c = a > limit ? limit : a;
          act = c * Sigmoid(alpha * c);
          b = (b < -limit ? -limit : b > limit ? limit : b) + 1.0;
          break;
        }
      }
      sink.Put(r * h + j, act * b);
    }
  }
  WriteAmaxScaleInv(f->outputs[1], f->outputs[2], sink.amax, scale);
  return nullptr;
}

}  // namespace

tefl_status* RegisterReferenceQuantization(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"quantize", Quantize},
      {"dequantize", Dequantize},
      {"compute_amax", ComputeAmax},
      {"compute_scale_from_amax", ComputeScaleFromAmax},
      {"fused_amax_and_scale_update_after_reduction", DelayedScaleUpdate},
      {"fp8_transpose", Fp8Transpose},
      {"rmsnorm_fwd_fp8", RmsNormFwdFp8},
      {"layernorm_fwd_fp8", LayerNormFwdFp8},
      {"glu_fp8", GatedFp8<Act::kGlu>},
      {"geglu_fp8", GatedFp8<Act::kGelu>},
      {"qgeglu_fp8", GatedFp8<Act::kQGelu>},
      {"reglu_fp8", GatedFp8<Act::kRelu>},
      {"sreglu_fp8", GatedFp8<Act::kSrelu>},
      {"swiglu_fp8", GatedFp8<Act::kSilu>},
      {"clamped_swiglu_fp8", GatedFp8<Act::kClamped>},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
