// Built-in conformance cases of the FP8 quantization family (spec/ops.md "FP8
// and scaling recipes") and of the fused FP8-output variants, whose family is
// normalization / activation (NormalizationCases and ActivationCases route
// every "*_fp8" op here). The main input's shape comes from the grid (or
// GridOptions::shape); FP8 outputs of quantize, dequantize's inputs, and
// fp8_transpose must match bit for bit; the fused variants' FP8 outputs may
// differ by a neighbouring code (fp32 maths vs the double reference).
#include <cmath>
#include <cstring>

#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o, bool gated) {
  if (o.shape) return {*o.shape};
  if (gated) return {{1, 2}, {3, 34}, {33, 258}, {64, 2048}};
  return {{1, 1}, {3, 17}, {33, 129}, {64, 1024}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

Tensor Scalar(float v) {
  Tensor t(DType::kF32, {1});
  t.set(0, v);
  return t;
}

bool IsGatedFp8(const std::string& op) {
  return op == "glu_fp8" || op == "geglu_fp8" || op == "qgeglu_fp8" || op == "reglu_fp8" || op == "sreglu_fp8" ||
         op == "swiglu_fp8" || op == "clamped_swiglu_fp8";
}

// The outputs' tolerances: FP8 by its dtype (neighbouring codes forgiven)
// unless exact; fp32 statistics and amax by fp32 rules.
void Tolerances(Case& c, bool fp8_exact) {
  for (const Tensor& t : c.outputs) {
    const bool fp8 = t.dtype() == DType::kE4M3 || t.dtype() == DType::kE5M2;
    c.tolerances.push_back(ToleranceFor(t.dtype()));
    c.exact.push_back(fp8 && fp8_exact);
  }
}

}  // namespace

std::vector<Case> QuantizationCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  const bool gated = IsGatedFp8(op);
  const bool norm = op == "rmsnorm_fwd_fp8" || op == "layernorm_fwd_fp8";
  for (const std::vector<int64_t>& xs : Shapes(o, gated)) {
    if (xs.empty()) continue;
    for (DType t : DTypes(o)) {
      for (DType f : {DType::kE4M3, DType::kE5M2}) {
        Case c;
        c.op = op;
        c.dtype = DTypeName(t);
        c.shape = ShapeString(xs);
        c.note = std::string(DTypeName(f));
        const std::string seed = op + c.dtype + c.shape + c.note;
        const float scale = f == DType::kE4M3 ? 40.0f : 2000.0f;
        int64_t rows = 1;
        bool rows_overflow = false;  // an empty x such as [2^62, 4, 0]: no [rows] output can be made
        for (size_t d = 0; d + 1 < xs.size(); ++d) rows_overflow |= __builtin_mul_overflow(rows, xs[d], &rows);
        const int64_t h = xs.back();
        if (op == "quantize") {
          c.inputs = {Input(t, xs, "x" + seed), Scalar(scale)};
          c.outputs = {Output(f, xs), Output(DType::kF32, {1}), Output(DType::kF32, {1})};
          Tolerances(c, true);
        } else if (op == "dequantize") {
          if (t == DType::kF16 && f == DType::kE5M2) continue;  // keeps the grid small
          Tensor q(f, xs);
          auto* p = static_cast<uint8_t*>(q.bytes());
          for (int64_t i = 0; !DescribingOnly() && i < q.numel(); ++i) p[i] = uint8_t((i * 37 + 11) % 256);
          c.inputs = {q, Scalar(1.0f / scale)};
          c.outputs = {Output(t, xs)};
          Tolerances(c, true);
        } else if (op == "compute_amax") {
          if (f == DType::kE5M2) continue;
          c.note = "";
          c.inputs = {Input(t, xs, "x" + seed)};
          c.outputs = {Output(DType::kF32, {1})};
          Tolerances(c, true);
        } else if (op == "fp8_transpose") {
          if (t != DType::kF32 || xs.size() != 2) continue;  // the dtype is the FP8 format
          c.dtype = DTypeName(f);
          c.note = "";
          Tensor q(f, xs);
          auto* p = static_cast<uint8_t*>(q.bytes());
          for (int64_t i = 0; !DescribingOnly() && i < q.numel(); ++i) p[i] = uint8_t((i * 131 + 7) % 251);
          c.inputs = {q};
          c.outputs = {Output(f, {xs[1], xs[0]})};
          Tolerances(c, true);
        } else if (op == "compute_scale_from_amax") {
          if (t != DType::kF32) continue;
          const int32_t fmt = f == DType::kE4M3 ? TEFL_FP8_E4M3 : TEFL_FP8_E5M2;
          for (int32_t pow2 : {0, 1}) {
            Case s = c;
            s.dtype = "float32";
            s.shape = ShapeString({h});
            s.note = c.note + (pow2 ? " pow2" : "");
            s.inputs = {Input(DType::kF32, {h}, "amax" + seed, 0.0, 4.0)};
            s.outputs = {Output(DType::kF32, {h}), Output(DType::kF32, {h})};
            s.attrs = AttrBytes(tefl_compute_scale_attrs{TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE, fmt, 1e-3f, pow2});
            Tolerances(s, true);
            out.push_back(std::move(s));
          }
          if (o.first_only && !out.empty()) return out;
          continue;
        } else if (op == "fused_amax_and_scale_update_after_reduction") {
          if (t != DType::kF32 || xs.size() != 2) continue;
          const int32_t fmt = f == DType::kE4M3 ? TEFL_FP8_E4M3 : TEFL_FP8_E5M2;
          for (int32_t algo : {TEFL_AMAX_ALGO_MAX, TEFL_AMAX_ALGO_MOST_RECENT}) {
            Case s = c;
            s.dtype = "float32";
            s.note = c.note + (algo == TEFL_AMAX_ALGO_MAX ? " max" : " most_recent") + " margin 1";
            s.inputs = {Input(DType::kF32, xs, "hist" + seed, 0.0, 4.0), Input(DType::kF32, {h}, "s" + seed, 1.0, 2.0)};
            s.outputs = {Output(DType::kF32, xs), Output(DType::kF32, {h})};
            s.attrs = AttrBytes(tefl_delayed_scaling_attrs{TEFL_DELAYED_SCALING_ATTRS_STRUCT_SIZE, algo, fmt, 1.0f});
            Tolerances(s, true);
            out.push_back(std::move(s));
          }
          if (o.first_only && !out.empty()) return out;
          continue;
        } else if (norm) {
          if (rows_overflow) continue;
          const bool ln = op == "layernorm_fwd_fp8";
          c.inputs = {Input(t, xs, "x" + seed), Input(t, {h}, "gamma" + seed)};
          if (ln) c.inputs.push_back(Input(t, {h}, "beta" + seed));
          c.inputs.push_back(Scalar(scale));
          c.outputs = {Output(f, xs)};
          if (ln) c.outputs.push_back(Output(DType::kF32, {rows}));
          c.outputs.push_back(Output(DType::kF32, {rows}));
          c.outputs.push_back(Output(DType::kF32, {1}));
          c.outputs.push_back(Output(DType::kF32, {1}));
          Tolerances(c, false);
          for (size_t k = 1; k + 2 < c.outputs.size(); ++k) c.tolerances[k] = {1e-6, 5e-5};  // mu, rsigma
        } else if (gated) {
          if (h % 2 != 0) continue;
          std::vector<int64_t> ys = xs;
          ys.back() /= 2;
          c.inputs = {Input(t, xs, "x" + seed, -3.0, 3.0), Scalar(scale)};
          c.outputs = {Output(f, ys), Output(DType::kF32, {1}), Output(DType::kF32, {1})};
          if (op == "clamped_swiglu_fp8")
            c.attrs = AttrBytes(tefl_clamped_swiglu_attrs{TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE, 1.5f, 1.702f});
          Tolerances(c, false);
          c.tolerances[1] = {1e-6, 5e-6};  // amax of fp32 values
        } else {
          return out;
        }
        out.push_back(std::move(c));
        if (o.first_only) return out;
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
