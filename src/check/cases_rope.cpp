// Built-in cases of the RoPE ops (spec/ops.md, "RoPE"): the grid's shape is
// [s, b, h, d], run as sbhd, as bshd and packed as thd (b sequences of
// unequal lengths summing to s * b tokens), rotate-half and interleaved,
// with d2 = d and d2 = d / 2 (the tail copied).
#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1, 1, 2}, {5, 2, 3, 8}, {17, 3, 2, 64}, {64, 2, 4, 128}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

}  // namespace

std::vector<Case> RopeCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  if (op != "fused_rope_forward" && op != "fused_rope_backward") return out;  // qkv: no built-in grid yet
  for (const std::vector<int64_t>& g : Shapes(o)) {
    if (g.size() != 4) continue;
    const int64_t s = g[0], b = g[1], h = g[2], d = g[3];
    for (DType t : DTypes(o)) {
      for (int32_t format : {TEFL_QKV_SBHD, TEFL_QKV_BSHD, TEFL_QKV_THD}) {
        for (int32_t interleaved : {0, 1}) {
          for (int64_t d2 : {d, (d / 2) & ~int64_t(1)}) {
            if (d2 == 0 && d != 0) continue;
            Case c;
            c.op = op;
            c.dtype = DTypeName(t);
            std::vector<int64_t> xs = format == TEFL_QKV_SBHD   ? std::vector<int64_t>{s, b, h, d}
                                      : format == TEFL_QKV_BSHD ? std::vector<int64_t>{b, s, h, d}
                                                                : std::vector<int64_t>{s * b, h, d};
            c.shape = ShapeString(xs);
            const char* fname = format == TEFL_QKV_SBHD ? "sbhd" : format == TEFL_QKV_BSHD ? "bshd" : "thd";
            c.note = std::string(fname) + (interleaved ? " interleaved" : "") + " d2=" + std::to_string(d2);
            const std::string seed = op + c.dtype + c.shape + c.note;
            c.attrs = AttrBytes(tefl_rope_attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, format, interleaved, 1, 0});
            // Angles like inv_freq * position: up to ~s radians.
            Tensor freqs = Input(DType::kF32, {s * b, 1, 1, d2}, "f" + seed, 0.0, double(s));
            std::optional<Tensor> cu;
            if (format == TEFL_QKV_THD) {
              // b sequences of unequal lengths (the first possibly empty).
              Tensor cs(DType::kI32, {b + 1});
              const int64_t total = s * b;
              for (int64_t i = 0; i <= b; ++i) cs.set(i, double(i == b ? total : (total * i * i) / (b * b)));
              cu = cs;
            }
            c.inputs = {Input(t, xs, "x" + seed), freqs, std::nullopt, cu};
            c.outputs = {Output(t, xs)};
            c.tolerances = {ToleranceFor(t)};
            c.exact = {false};
            out.push_back(std::move(c));
            if (o.first_only) return out;
          }
        }
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
