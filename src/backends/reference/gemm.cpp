// reference.cpp — GEMM: generic_gemm and te_general_grouped_gemm.
//
// The oracle: a naive triple loop, every sum in double, each output rounded
// once to its dtype. Maths (row-major, docs/ops-gemm.md):
//   acc[m, n] = sum_k op(A)[m, k] * op(B)[k, n]    (FP8: q * scale_inv, in fp32)
//   pre       = alpha * acc + beta * Cterm + bias[n]
//   D         = gelu_tanh(pre) with gelu (pre -> pre_gelu_out), else pre
// Cterm = C, or D's prior content with accumulate. BLAS conventions, which
// the fast implementations inherit from sgemm: alpha = 0 skips the product
// and beta = 0 skips Cterm (NaN there does not propagate). FP8 D stores
// fp8(D * d_scale); d_amax = max |D| before scaling (NaN ignored, as TE's
// amax reduction). grad: bias_grad[m] = sum_k op(A)[m, k].
#include <cmath>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

bool IsFp8(DType t) { return t == DType::kE4M3 || t == DType::kE5M2; }

double GeluTanh(double x) { return x * (0.5 + 0.5 * std::tanh(x * (0.79788456 + 0.03567741 * x * x))); }

// One GEMM of the row-major statement; every pointer-like member may be
// absent (data NULL).
struct Gemm {
  int64_t m, n, k;
  bool transa, transb;
  Matrix a, b;              // compact [M, K] / [K, M] and [K, N] / [N, K]
  double a_scale, b_scale;  // scale_inv of FP8 operands, else 1
  double alpha, beta;
  Matrix c;         // [M, N] or none
  bool accumulate;  // Cterm = D's prior content
  Matrix bias;      // [N] or none
  bool gelu;
  Matrix pre_gelu;   // [M, N] or none
  Matrix d;          // [M, N]
  double d_scale;    // FP8 D: 1 otherwise
  Matrix bias_grad;  // [M] or none
  double* amax;      // running max |D| or NULL

  // Dequantized elements (one fp32 rounding, as TE's dequantize).
  double A(int64_t i, int64_t kk) const {
    const double v = a.at(transa ? kk * m + i : i * k + kk);
    return a_scale == 1.0 ? v : double(float(v) * float(a_scale));
  }
  double B(int64_t kk, int64_t j) const {
    const double v = b.at(transb ? j * k + kk : kk * n + j);
    return b_scale == 1.0 ? v : double(float(v) * float(b_scale));
  }
};

void Run(const Gemm& g) {
  for (int64_t i = 0; i < g.m; ++i) {
    for (int64_t j = 0; j < g.n; ++j) {
      double pre = 0.0;
      if (g.alpha != 0.0) {
        double acc = 0.0;
        for (int64_t kk = 0; kk < g.k; ++kk) acc += g.A(i, kk) * g.B(kk, j);
        pre = g.alpha * acc;
      }
      const int64_t e = i * g.n + j;
      if (g.beta != 0.0) {
        if (g.c.data) pre += g.beta * g.c.at(e);
        if (g.accumulate) pre += g.beta * g.d.at(e);
      }
      if (g.bias.data) pre += g.bias.at(j);
      double out = pre;
      if (g.gelu) {
        if (g.pre_gelu.data) g.pre_gelu.set(e, pre);
        out = GeluTanh(pre);
      }
      if (g.amax && std::fabs(out) > *g.amax) *g.amax = std::fabs(out);  // false for NaN
      g.d.set(e, IsFp8(g.d.dtype) ? double(float(out) * float(g.d_scale)) : out);
    }
  }
  if (g.bias_grad.data) {
    for (int64_t i = 0; i < g.m; ++i) {
      double s = 0.0;
      for (int64_t kk = 0; kk < g.k; ++kk) s += g.A(i, kk);
      g.bias_grad.set(i, s);
    }
  }
}

Matrix ViewOrNone(const DLTensor* t) { return t ? View(t) : Matrix{nullptr, DType::kF32}; }
double Scalar(const DLTensor* t) { return t ? double(LoadAsFloat(DataPtr(t), 0, DType::kF32)) : 1.0; }

// in: A B C bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax
tefl_status* GenericGemm(const tefl_call_frame* f, void*) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
  const DLTensor* a = f->inputs[0];
  const DLTensor* b = f->inputs[1];
  Gemm g{};
  g.transa = at->transa != 0;
  g.transb = at->transb != 0;
  g.m = g.transa ? a->shape[1] : a->shape[0];
  g.k = g.transa ? a->shape[0] : a->shape[1];
  g.n = g.transb ? b->shape[0] : b->shape[1];
  g.a = View(a);
  g.b = View(b);
  g.a_scale = IsFp8(g.a.dtype) ? Scalar(f->inputs[4]) : 1.0;
  g.b_scale = IsFp8(g.b.dtype) ? Scalar(f->inputs[5]) : 1.0;
  g.alpha = at->alpha;
  g.beta = at->beta;
  g.c = ViewOrNone(f->inputs[2]);
  g.accumulate = at->accumulate != 0;
  g.bias = ViewOrNone(f->inputs[3]);
  g.gelu = at->gelu != 0;
  g.pre_gelu = ViewOrNone(f->outputs[1]);
  g.d = View(f->outputs[0]);
  g.d_scale = IsFp8(g.d.dtype) ? Scalar(f->inputs[6]) : 1.0;
  g.bias_grad = ViewOrNone(f->outputs[2]);
  double amax = 0.0;
  g.amax = f->outputs[3] ? &amax : nullptr;
  Run(g);
  if (f->outputs[3]) View(f->outputs[3]).set(0, amax);
  return nullptr;
}

// in: A[S, K] B[G, K, N] or [G, N, K] m_splits[G] bias[G, N]; out: D[S, N]
tefl_status* GroupedGemm(const tefl_call_frame* f, void*) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
  const DLTensor* a = f->inputs[0];
  const DLTensor* b = f->inputs[1];
  const auto* splits = static_cast<const int64_t*>(DataPtr(f->inputs[2]));
  const DLTensor* bias = f->inputs[3];
  DLTensor* d = f->outputs[0];
  const int64_t groups = b->shape[0];
  const int64_t k = a->shape[1];
  const int64_t n = at->transb ? b->shape[1] : b->shape[2];
  const DType ta = DTypeOf(a->dtype), tb = DTypeOf(b->dtype), td = DTypeOf(d->dtype);
  const DType tbias = bias ? DTypeOf(bias->dtype) : DType::kF32;
  const size_t ea = FloatElemSize(ta), eb = FloatElemSize(tb), ed = FloatElemSize(td), ebias = FloatElemSize(tbias);
  int64_t row = 0;
  for (int64_t grp = 0; grp < groups; ++grp) {
    Gemm g{};
    g.m = splits[grp];
    g.n = n;
    g.k = k;
    g.transb = at->transb != 0;
    g.a = Matrix{static_cast<char*>(DataPtr(a)) + size_t(row * k) * ea, ta};
    g.b = Matrix{static_cast<char*>(DataPtr(b)) + size_t(grp * k * n) * eb, tb};
    g.a_scale = g.b_scale = g.d_scale = 1.0;
    g.alpha = at->alpha;
    g.beta = at->beta;
    g.c = Matrix{nullptr, DType::kF32};
    g.accumulate = at->accumulate != 0;
    g.bias = bias ? Matrix{static_cast<char*>(DataPtr(bias)) + size_t(grp * n) * ebias, tbias}
                  : Matrix{nullptr, DType::kF32};
    g.gelu = at->gelu != 0;
    g.pre_gelu = Matrix{nullptr, DType::kF32};
    g.d = Matrix{static_cast<char*>(DataPtr(d)) + size_t(row * n) * ed, td};
    g.bias_grad = Matrix{nullptr, DType::kF32};
    g.amax = nullptr;
    Run(g);
    row += g.m;
  }
  return nullptr;
}

}  // namespace

tefl_status* RegisterReferenceGemm(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"generic_gemm", GenericGemm},
      {"te_general_grouped_gemm", GroupedGemm},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
