// reference.cpp — activations: gelu, qgelu, relu, srelu, silu, their
// backward, the gated (GLU) variants, clamped SwiGLU and dbias + backward.
//
// The oracle every other implementation is tested against: plain scalar
// loops, every value in double, each output rounded once to its dtype, dbias
// summed in double. Formulas: TransformerEngine's (common/util/math.h),
// evaluated in double; spec/ops.md. One kernel per kind, the activation a
// functor with Act (the forward) and DAct (its derivative).
//
// Special values (the contract default.portable matches element by element):
//  - The formulas are TE's as written, so their IEEE results are kept:
//    gelu(-inf) = -inf * 0 = NaN, silu(-inf) = qgelu(-inf) = NaN, and every
//    sigmoid/tanh derivative at +-inf is inf * 0 = NaN.
//  - NaN in -> NaN out. TE's relu/srelu/drelu/dsrelu (fmaxf, x > 0) and its
//    clamps (fminf/fmaxf) map NaN to a number; here they propagate it.
//  - Clamps match TE at the boundary: a == limit passes gradient to a, and b
//    passes gradient iff -limit <= b <= limit.
#include <cmath>
#include <vector>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

// ---- Activations ---------------------------------------------------------------
double Sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The gate half of a gated op passes through unchanged and always takes the
// gradient; clamped SwiGLU overrides both.
struct PlainGate {
  double Gate(double b) const { return b; }
  bool GatePasses(double) const { return true; }
};

struct Gelu : PlainGate {
  double Act(double x) const { return x * (0.5 + 0.5 * std::tanh(x * (0.79788456 + 0.03567741 * x * x))); }
  double DAct(double x) const {
    const double t = std::tanh(0.79788456 * x * (1.0 + 0.044715 * x * x));
    return 0.5 * x * ((1.0 - t * t) * (0.79788456 + 0.1070322243 * x * x)) + 0.5 * (1.0 + t);
  }
};

// x * sigmoid(alpha x); TE's alpha is the float 1.702f.
struct QGelu : PlainGate {
  double alpha = double(1.702f);
  double Act(double x) const { return x * Sigmoid(alpha * x); }
  double DAct(double x) const {
    const double s = Sigmoid(alpha * x);
    return alpha * x * s * (1.0 - s) + s;
  }
};

struct Silu : PlainGate {
  double Act(double x) const { return x * Sigmoid(x); }
  double DAct(double x) const {
    const double s = Sigmoid(x);
    return x * s * (1.0 - s) + s;
  }
};

// NaN fails every comparison: written so that it falls through to x.
struct Relu : PlainGate {
  double Act(double x) const { return x < 0.0 ? 0.0 : x; }
  double DAct(double x) const { return x > 0.0 ? 1.0 : x <= 0.0 ? 0.0 : x; }
};

struct Srelu : PlainGate {
  double Act(double x) const { return x <= 0.0 ? 0.0 : x * x; }
  double DAct(double x) const { return x <= 0.0 ? 0.0 : 2.0 * x; }
};

// glu's activation is the sigmoid itself (TE's nvte_glu).
struct Glu : PlainGate {
  double Act(double x) const { return Sigmoid(x); }
  double DAct(double x) const {
    const double s = Sigmoid(x);
    return s * (1.0 - s);
  }
};

// Clamped SwiGLU (GPT-OSS): a' = min(a, limit), act = a' sigmoid(alpha a');
// b' = clamp(b, -limit, limit) + 1. No gradient where a clamp is active.
struct ClampedSilu {
  double limit, alpha;
  double Clamp(double a) const { return a > limit ? limit : a; }
  double Act(double a) const {
    const double c = Clamp(a);
    return c * Sigmoid(alpha * c);
  }
  double DAct(double a) const {
    if (a > limit) return 0.0;
    const double s = Sigmoid(alpha * a);
    return alpha * a * s * (1.0 - s) + s;
  }
  double Gate(double b) const { return (b < -limit ? -limit : b > limit ? limit : b) + 1.0; }
  bool GatePasses(double b) const { return !(b < -limit || b > limit); }
};

// Rows = product of all dims but the last; cols = the last dim.
void RowsCols(const DLTensor* x, int64_t* rows, int64_t* cols) {
  *cols = x->shape[x->ndim - 1];
  *rows = LeadingRows(x);  // 0 when cols is 0
}

// ---- One kernel per kind -----------------------------------------------------------
enum class Kind { kFwd, kBwd, kGatedFwd, kGatedBwd, kDbias };

template <class F>
F MakeFn(const tefl_call_frame*) {
  return F{};
}
template <>
ClampedSilu MakeFn<ClampedSilu>(const tefl_call_frame* f) {
  const auto* a = static_cast<const tefl_clamped_swiglu_attrs*>(f->attrs);
  return ClampedSilu{double(a->limit), double(a->alpha)};
}

// in (input) -> out (output): output = act(input).
template <class F>
void Forward(const F& fn, const tefl_call_frame* f) {
  const Matrix x = View(f->inputs[0]), y = View(f->outputs[0]);
  const int64_t n = NumElements(f->inputs[0]);
  for (int64_t i = 0; i < n; ++i) y.set(i, fn.Act(x.at(i)));
}

// in (grad, fwd_input) -> out (dinput[, dbias]): dinput = grad * act'(x);
// dbias[j] = sum over rows of dinput[:, j] (the unrounded values, as TE).
template <class F>
void Backward(const F& fn, const tefl_call_frame* f, bool with_dbias) {
  const Matrix g = View(f->inputs[0]), x = View(f->inputs[1]), dx = View(f->outputs[0]);
  int64_t rows, cols;
  RowsCols(f->inputs[1], &rows, &cols);
  std::vector<double> dbias(with_dbias ? size_t(cols) : 0, 0.0);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < cols; ++j) {
      const int64_t i = r * cols + j;
      const double v = g.at(i) * fn.DAct(x.at(i));
      dx.set(i, v);
      if (with_dbias) dbias[size_t(j)] += v;
    }
  }
  if (with_dbias) {
    const Matrix db = View(f->outputs[1]);
    for (int64_t j = 0; j < cols; ++j) db.set(j, dbias[size_t(j)]);
  }
}

// in (input[N, 2H]) -> out (output[N, H]): output = act(a) * gate(b),
// a = input[:, :H], b = input[:, H:].
template <class F>
void GatedForward(const F& fn, const tefl_call_frame* f) {
  const Matrix x = View(f->inputs[0]), y = View(f->outputs[0]);
  int64_t rows, h;
  RowsCols(f->outputs[0], &rows, &h);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const double a = x.at(r * 2 * h + j), b = x.at(r * 2 * h + h + j);
      y.set(r * h + j, fn.Act(a) * fn.Gate(b));
    }
  }
}

// in (grad[N, H], fwd_input[N, 2H]) -> out (dinput[N, 2H]):
// dinput[:, :H] = grad * act'(a) * gate(b); dinput[:, H:] = grad * act(a)
// where the gate passes gradient, else 0.
template <class F>
void GatedBackward(const F& fn, const tefl_call_frame* f) {
  const Matrix g = View(f->inputs[0]), x = View(f->inputs[1]), dx = View(f->outputs[0]);
  int64_t rows, h;
  RowsCols(f->inputs[0], &rows, &h);
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t j = 0; j < h; ++j) {
      const int64_t ia = r * 2 * h + j, ib = ia + h;
      const double gv = g.at(r * h + j), a = x.at(ia), b = x.at(ib);
      dx.set(ia, gv * fn.DAct(a) * fn.Gate(b));
      dx.set(ib, fn.GatePasses(b) ? gv * fn.Act(a) : 0.0);
    }
  }
}

template <Kind kKind, class F>
tefl_status* Kernel(const tefl_call_frame* f, void*) {
  try {  // nothing escapes a kernel (dbias allocates)
    const F fn = MakeFn<F>(f);
    switch (kKind) {
      case Kind::kFwd:
        Forward(fn, f);
        break;
      case Kind::kBwd:
        Backward(fn, f, false);
        break;
      case Kind::kGatedFwd:
        GatedForward(fn, f);
        break;
      case Kind::kGatedBwd:
        GatedBackward(fn, f);
        break;
      case Kind::kDbias:
        Backward(fn, f, true);
        break;
    }
    return nullptr;
  } catch (...) {
    return f->host->status_new(TEFL_INTERNAL, "activation (reference.cpp): out of memory");
  }
}

}  // namespace

tefl_status* RegisterReferenceActivation(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"gelu", Kernel<Kind::kFwd, Gelu>},
      {"qgelu", Kernel<Kind::kFwd, QGelu>},
      {"relu", Kernel<Kind::kFwd, Relu>},
      {"srelu", Kernel<Kind::kFwd, Srelu>},
      {"silu", Kernel<Kind::kFwd, Silu>},
      {"dgelu", Kernel<Kind::kBwd, Gelu>},
      {"dqgelu", Kernel<Kind::kBwd, QGelu>},
      {"drelu", Kernel<Kind::kBwd, Relu>},
      {"dsrelu", Kernel<Kind::kBwd, Srelu>},
      {"dsilu", Kernel<Kind::kBwd, Silu>},
      {"glu", Kernel<Kind::kGatedFwd, Glu>},
      {"geglu", Kernel<Kind::kGatedFwd, Gelu>},
      {"qgeglu", Kernel<Kind::kGatedFwd, QGelu>},
      {"reglu", Kernel<Kind::kGatedFwd, Relu>},
      {"sreglu", Kernel<Kind::kGatedFwd, Srelu>},
      {"swiglu", Kernel<Kind::kGatedFwd, Silu>},
      {"clamped_swiglu", Kernel<Kind::kGatedFwd, ClampedSilu>},
      {"dglu", Kernel<Kind::kGatedBwd, Glu>},
      {"dgeglu", Kernel<Kind::kGatedBwd, Gelu>},
      {"dqgeglu", Kernel<Kind::kGatedBwd, QGelu>},
      {"dreglu", Kernel<Kind::kGatedBwd, Relu>},
      {"dsreglu", Kernel<Kind::kGatedBwd, Srelu>},
      {"dswiglu", Kernel<Kind::kGatedBwd, Silu>},
      {"clamped_dswiglu", Kernel<Kind::kGatedBwd, ClampedSilu>},
      {"dbias_dgelu", Kernel<Kind::kDbias, Gelu>},
      {"dbias_dsilu", Kernel<Kind::kDbias, Silu>},
      {"dbias_drelu", Kernel<Kind::kDbias, Relu>},
      {"dbias_dqgelu", Kernel<Kind::kDbias, QGelu>},
      {"dbias_dsrelu", Kernel<Kind::kDbias, Srelu>},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
