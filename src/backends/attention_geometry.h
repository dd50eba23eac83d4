// The geometry of one fused_attn_fwd / fused_attn_bwd call, shared by every
// attention implementation (reference and portable) and by the C++ API:
// where a (batch, token, head) row lives in q/k/v/o, which keys a query row
// attends (always one contiguous range), where its statistic lives, and the
// dropout element index. Validation (catalogue_attention.cpp) has checked
// every shape, cu_seqlens' contents and the attribute rules before a kernel
// runs; tensors are compact row-major.
#ifndef TEFL_SRC_BACKENDS_ATTENTION_GEOMETRY_H_
#define TEFL_SRC_BACKENDS_ATTENTION_GEOMETRY_H_

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "backends/philox.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {

struct AttnGeometry {
  int32_t format;  // tefl_qkv_format
  int32_t mask;    // tefl_attn_mask_type
  int32_t window_left, window_right;
  int32_t softmax;  // tefl_attn_softmax_type
  int64_t b;        // batch (thd: number of sequences)
  int64_t sq, sk;   // padded sequence dims (thd: t_q, t_kv, the token counts)
  int64_t hq, hkv;  // heads; hq % hkv == 0
  int64_t dqk, dv;  // head dims
  double scale;     // the effective scale (0 resolved to 1/sqrt(dqk))
  bool dropout;     // is_training && p > 0
  float p;
  uint64_t seed, offset;
  const int32_t* cu_q;   // [b + 1] or NULL
  const int32_t* cu_kv;  // [b + 1] or NULL

  bool thd() const { return format == TEFL_QKV_THD; }
  bool causal_top_left() const { return mask == TEFL_ATTN_MASK_CAUSAL || mask == TEFL_ATTN_MASK_PADDING_CAUSAL; }
  bool causal_bottom_right() const {
    return mask == TEFL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT || mask == TEFL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
  }
  // Actual lengths of sequence `bi` (padding masks and thd read cu_seqlens).
  int64_t len_q(int64_t bi) const { return cu_q ? int64_t(cu_q[bi + 1]) - cu_q[bi] : sq; }
  int64_t len_kv(int64_t bi) const { return cu_kv ? int64_t(cu_kv[bi + 1]) - cu_kv[bi] : sk; }
  // Rows of the layout that belong to sequence bi (padded rows included).
  int64_t rows_q(int64_t bi) const { return thd() ? len_q(bi) : sq; }
  int64_t rows_kv(int64_t bi) const { return thd() ? len_kv(bi) : sk; }
  // The token row (a row of h * d elements) of position i of sequence bi.
  int64_t token_q(int64_t bi, int64_t i) const {
    return format == TEFL_QKV_SBHD ? i * b + bi : format == TEFL_QKV_BSHD ? bi * sq + i : cu_q[bi] + i;
  }
  int64_t token_kv(int64_t bi, int64_t j) const {
    return format == TEFL_QKV_SBHD ? j * b + bi : format == TEFL_QKV_BSHD ? bi * sk + j : cu_kv[bi] + j;
  }
  // Element offset of (token row, head, channel 0) in a tensor of h heads of d.
  static int64_t At(int64_t token, int64_t h, int64_t heads, int64_t d) { return (token * heads + h) * d; }
  // The statistic of query (bi, h, i): [b, h_q, sq] or thd [h_q, t_q].
  int64_t stat_index(int64_t bi, int64_t h, int64_t i) const {
    return thd() ? h * sq + cu_q[bi] + i : (bi * hq + h) * sq + i;
  }
  // The kv head of query head h (GQA/MQA).
  int64_t kv_head(int64_t h) const { return h / (hq / hkv); }

  // Keys [*lo, *hi) that query i of sequence bi attends (empty when lo >= hi).
  void KeyRange(int64_t bi, int64_t i, int64_t* lo, int64_t* hi) const {
    const int64_t lq = len_q(bi), lk = len_kv(bi);
    int64_t a = 0, e = lk;  // [a, e)
    if (i >= lq) {
      *lo = *hi = 0;
      return;
    }
    const int64_t diag = i + lk - lq;
    if (window_left >= 0) a = std::max(a, diag - window_left);
    if (window_right >= 0) e = std::min(e, diag + window_right + 1);
    if (causal_top_left()) e = std::min(e, i + 1);
    if (causal_bottom_right()) e = std::min(e, diag + 1);
    *lo = a;
    *hi = std::max(a, e);
  }

  // Dropout: element index of score (bi, h, i, j) and whether it is kept.
  uint64_t DropRow(int64_t bi, int64_t h, int64_t i) const {
    return thd() ? uint64_t(h * sq + cu_q[bi] + i) : uint64_t((bi * hq + h) * sq + i);
  }
  uint64_t DropCols() const { return uint64_t(sk); }
  uint64_t DropCol(int64_t bi, int64_t j) const { return thd() ? uint64_t(cu_kv[bi] + j) : uint64_t(j); }
  bool Kept(uint64_t e, uint32_t threshold16) const { return DropoutKeptAt(seed, offset, e, threshold16); }
};

// The geometry of a call from its q, k, v tensors, cu_seqlens (may be NULL)
// and attributes.
inline AttnGeometry MakeAttnGeometry(const DLTensor* q, const DLTensor* k, const DLTensor* v, const DLTensor* cu_q,
                                     const DLTensor* cu_kv, const tefl_attention_attrs& a) {
  AttnGeometry g{};
  g.format = a.qkv_format;
  g.mask = a.mask_type;
  g.window_left = a.window_left;
  g.window_right = a.window_right;
  g.softmax = a.softmax_type;
  if (a.qkv_format == TEFL_QKV_THD) {
    g.b = cu_q->shape[0] - 1;
    g.sq = q->shape[0];
    g.sk = k->shape[0];
  } else {
    const int sdim = a.qkv_format == TEFL_QKV_SBHD ? 0 : 1;
    g.b = q->shape[1 - sdim];
    g.sq = q->shape[sdim];
    g.sk = k->shape[sdim];
  }
  g.hq = q->shape[q->ndim - 2];
  g.hkv = k->shape[k->ndim - 2];
  g.dqk = q->shape[q->ndim - 1];
  g.dv = v->shape[v->ndim - 1];
  g.scale = a.scale != 0.0f ? double(a.scale) : 1.0 / std::sqrt(double(g.dqk));
  g.dropout = a.is_training != 0 && a.dropout > 0.0f;
  g.p = a.dropout;
  g.seed = a.seed;
  g.offset = a.offset;
  g.cu_q = cu_q ? static_cast<const int32_t*>(DataPtr(cu_q)) : nullptr;
  g.cu_kv = cu_kv ? static_cast<const int32_t*>(DataPtr(cu_kv)) : nullptr;
  return g;
}

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_ATTENTION_GEOMETRY_H_
