// Built-in cases of the attention ops (spec/ops.md, "Attention"): the grid's
// shape is q's bshd shape [b, s, h_q, d] (sq = sk = s), run as bshd and as
// thd (b sequences of unequal lengths), no_mask and causal, with h_kv = h_q /
// 2 when h_q is even (GQA), the learnable softmax on one case. Tolerances:
// attention 1e-3 (fp32/fp16) and 1.5e-2 (bf16), atol and rtol; stats 1e-3.
// Backward cases take o and stats from reference.cpp's forward.
#include "check/cases.h"
#include "tefl/ops.h"

namespace tefl::check::cases_internal {
namespace {

std::vector<std::vector<int64_t>> Shapes(const GridOptions& o) {
  if (o.shape) return {*o.shape};
  return {{1, 1, 1, 8}, {2, 17, 4, 32}, {1, 70, 2, 64}};
}

std::vector<DType> DTypes(const GridOptions& o) {
  if (o.dtype) return {*o.dtype};
  return {DType::kF32, DType::kBF16, DType::kF16};
}

Tolerance AttnTolerance(DType t) { return t == DType::kBF16 ? Tolerance{1.5e-2, 1.5e-2} : Tolerance{1e-3, 1e-3}; }

Tensor CuSeqlens(const std::vector<int32_t>& lens) {
  Tensor t(DType::kI32, {int64_t(lens.size()) + 1});
  int32_t c = 0;
  t.set(0, 0);
  for (size_t i = 0; i < lens.size(); ++i) t.set(int64_t(i) + 1, c += lens[i]);
  return t;
}

}  // namespace

std::vector<Case> AttentionCases(const std::string& op, const GridOptions& o) {
  std::vector<Case> out;
  const bool fwd = op == "fused_attn_fwd";
  if (!fwd && op != "fused_attn_bwd") return out;
  for (const std::vector<int64_t>& g : Shapes(o)) {
    if (g.size() != 4 || g[3] < 1 || g[3] > 256) continue;
    const int64_t b = g[0], s = g[1], hq = g[2], d = g[3];
    const int64_t hkv = hq % 2 == 0 ? hq / 2 : hq;
    for (DType t : DTypes(o)) {
      for (int32_t format : {TEFL_QKV_BSHD, TEFL_QKV_THD}) {
        for (int32_t mask : {TEFL_ATTN_MASK_NO_MASK, TEFL_ATTN_MASK_CAUSAL}) {
          const bool thd = format == TEFL_QKV_THD;
          const bool learnable = thd && mask == TEFL_ATTN_MASK_CAUSAL;
          Case c;
          c.op = op;
          c.dtype = DTypeName(t);
          c.shape = ShapeString(g);
          c.note = std::string(thd ? "thd" : "bshd") + (mask ? " causal" : "") + " h_kv " + std::to_string(hkv) +
                   (learnable ? " learnable softmax" : "");
          const std::string seed = op + c.dtype + c.shape + c.note;
          tefl_attention_attrs a{};
          a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
          a.qkv_format = format;
          a.mask_type = mask;
          a.window_left = -1;
          a.window_right = -1;
          a.softmax_type = learnable ? TEFL_ATTN_SOFTMAX_LEARNABLE : TEFL_ATTN_SOFTMAX_VANILLA;
          c.attrs = AttrBytes(a);
          // thd: b sequences of unequal lengths summing to b * s tokens.
          std::vector<int32_t> lens(static_cast<size_t>(b), static_cast<int32_t>(s));
          if (thd && b > 1 && s > 1) lens[0] += 1, lens[size_t(b) - 1] -= 1;
          auto lay = [&](int64_t heads) {
            return thd ? std::vector<int64_t>{b * s, heads, d} : std::vector<int64_t>{b, s, heads, d};
          };
          const std::vector<int64_t> stats_shape =
              thd ? std::vector<int64_t>{hq, b * s} : std::vector<int64_t>{b, hq, s};
          Tensor q = Input(t, lay(hq), "q" + seed), k = Input(t, lay(hkv), "k" + seed),
                 v = Input(t, lay(hkv), "v" + seed);
          std::optional<Tensor> cu, alpha;
          if (thd) cu = CuSeqlens(lens);
          if (learnable) alpha = Input(DType::kF32, {hq}, "alpha" + seed, -1.0, 2.0);
          if (fwd) {
            c.inputs = {q, k, v, cu, cu, alpha};
            c.outputs = {Output(t, lay(hq)), Output(DType::kF32, stats_shape)};
            c.tolerances = {AttnTolerance(t), {1e-3, 1e-3}};
            c.exact = {false, false};
          } else {
            Tensor y = Output(t, lay(hq)), stats = Output(DType::kF32, stats_shape);
            const DLTensor* cu_dl = cu ? &cu->dl() : nullptr;
            if (!DescribingOnly() &&
                !RunPinned("fused_attn_fwd", "reference.cpp",
                           {&q.dl(), &k.dl(), &v.dl(), cu_dl, cu_dl, alpha ? &alpha->dl() : nullptr},
                           {y.ptr(), stats.ptr()}, &a)
                     .ok())
              continue;
            c.inputs = {q, k, v, y, Input(t, lay(hq), "do" + seed), stats, cu, cu, alpha};
            c.outputs = {Output(t, lay(hq)), Output(t, lay(hkv)), Output(t, lay(hkv)), Output(DType::kF32, {hq})};
            c.tolerances.assign(3, AttnTolerance(t));
            c.tolerances.push_back({2e-3, 2e-3});
            c.exact.assign(c.outputs.size(), false);
          }
          out.push_back(std::move(c));
          if (o.first_only) return out;
        }
      }
    }
  }
  return out;
}

}  // namespace tefl::check::cases_internal
