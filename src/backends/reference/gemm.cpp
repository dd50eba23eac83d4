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
// fp8(D * d_scale); d_amax = max |D| before scaling (NaN when any D is NaN,
// as quantize's amax: TE's reduction skips NaN). grad: bias_grad[m] = sum_k op(A)[m, k]. gelu with grad
// (TE's DGELU epilogue): pre_gelu_out is an input P and
//   D = pre * dgelu(P),   bias_grad[n] = sum_m D[m, n] (before FP8 scaling)
// with dgelu the derivative of gelu_tanh (spec/ops.md, Activations).
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
double DGeluTanh(double x) {
  const double t = std::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x));
  return 0.5 * x * (1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x) + 0.5 * (1.0 + t);
}

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
  bool grad;
  Matrix pre_gelu;   // [M, N] or none (an input with gelu and grad)
  Matrix d;          // [M, N]
  double d_scale;    // FP8 D: 1 otherwise
  Matrix bias_grad;  // [M] ([N] with gelu and grad) or none
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
  const bool dgelu = g.gelu && g.grad;
  std::vector<double> col_sums(dgelu && g.bias_grad.data ? size_t(g.n) : 0, 0.0);
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
      if (dgelu) {
        out = pre * DGeluTanh(g.pre_gelu.at(e));
        if (!col_sums.empty()) col_sums[size_t(j)] += out;
      } else if (g.gelu) {
        if (g.pre_gelu.data) g.pre_gelu.set(e, pre);
        out = GeluTanh(pre);
      }
      if (g.amax && !std::isnan(*g.amax) && (std::isnan(out) || std::fabs(out) > *g.amax))
        *g.amax = std::fabs(out);  // a NaN stays
      g.d.set(e, IsFp8(g.d.dtype) ? double(float(out) * float(g.d_scale)) : out);
    }
  }
  if (dgelu) {
    for (int64_t j = 0; j < int64_t(col_sums.size()); ++j) g.bias_grad.set(j, col_sums[size_t(j)]);
  } else if (g.bias_grad.data) {
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
  g.grad = at->grad != 0;
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

// A view `elems` elements further on (none stays none).
Matrix At(const Matrix& x, int64_t elems) {
  if (x.data == nullptr) return x;
  const size_t es = IsFp8(x.dtype) ? 1 : FloatElemSize(x.dtype);
  return Matrix{static_cast<char*>(x.data) + size_t(elems) * es, x.dtype};
}
// Element g of a per-group scale vector ([G] or [1]); 1 when absent.
double GroupScalar(const DLTensor* t, int64_t g) {
  if (t == nullptr) return 1.0;
  return double(LoadAsFloat(DataPtr(t), t->shape[0] == 1 ? 0 : g, DType::kF32));
}

// in: A B m_splits bias a_scale_inv b_scale_inv d_scale; out: D pre_gelu_out bias_grad d_amax.
// No transa: A [S, K] and D [S, N] split by rows, B [G, K, N] / [G, N, K].
// transa: A [S, M] and B [S, N] split by rows (K of each group), D [G, M, N].
tefl_status* GroupedGemm(const tefl_call_frame* f, void*) {
  const auto* at = static_cast<const tefl_gemm_attrs*>(f->attrs);
  const DLTensor* a = f->inputs[0];
  const DLTensor* b = f->inputs[1];
  const DLTensor* s = f->inputs[2];
  const auto* splits = static_cast<const int64_t*>(DataPtr(s));
  const int64_t groups = s->shape[0];
  const bool transa = at->transa != 0, transb = at->transb != 0;
  const bool dgelu = at->gelu && at->grad;
  const Matrix va = View(a), vb = View(b), vbias = ViewOrNone(f->inputs[3]), vd = View(f->outputs[0]);
  const Matrix vpre = ViewOrNone(f->outputs[1]), vgrad = ViewOrNone(f->outputs[2]);
  const DLTensor* amax_t = f->outputs[3];
  const int64_t cols_a = a->shape[1];
  const int64_t n = transa ? b->shape[1] : transb ? b->shape[1] : b->shape[2];
  int64_t row = 0;  // first row of the group in A (and D without transa)
  for (int64_t grp = 0; grp < groups; ++grp) {
    Gemm g{};
    g.transa = transa;
    g.transb = transb;
    g.n = n;
    if (transa) {
      g.m = cols_a;
      g.k = splits[grp];
      g.a = At(va, row * g.m);
      g.b = At(vb, row * n);
      g.d = At(vd, grp * g.m * n);
      g.pre_gelu = At(vpre, grp * g.m * n);
      g.bias_grad = At(vgrad, grp * (dgelu ? n : g.m));
    } else {
      g.m = splits[grp];
      g.k = cols_a;
      g.a = At(va, row * g.k);
      g.b = At(vb, grp * g.k * n);
      g.d = At(vd, row * n);
      g.pre_gelu = At(vpre, row * n);
      g.bias_grad = At(vgrad, dgelu ? grp * n : row);
    }
    g.a_scale = IsFp8(va.dtype) ? GroupScalar(f->inputs[4], grp) : 1.0;
    g.b_scale = IsFp8(vb.dtype) ? GroupScalar(f->inputs[5], grp) : 1.0;
    g.d_scale = IsFp8(vd.dtype) ? GroupScalar(f->inputs[6], grp) : 1.0;
    g.alpha = at->alpha;
    g.beta = at->beta;
    g.c = Matrix{nullptr, DType::kF32};
    g.accumulate = at->accumulate != 0;
    g.bias = At(vbias, grp * n);
    g.gelu = at->gelu != 0;
    g.grad = at->grad != 0;
    double amax = 0.0;
    g.amax = amax_t ? &amax : nullptr;
    Run(g);
    if (amax_t) View(amax_t).set(grp, amax);
    row += splits[grp];
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
