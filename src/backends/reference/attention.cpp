// reference.cpp — attention: fused_attn_fwd / fused_attn_bwd.
//
// The oracle, written to be read: for every (sequence, head, query row) the
// scores of the keys the row attends are materialised in double, the softmax
// and the products accumulate in double, and each output is rounded once to
// its dtype. Semantics (spec/ops.md "Attention", docs/ops-attention.md):
//   s_j   = scale * q_i . k_j             for keys j in KeyRange(i)
//   lse_i = log(sum_j exp(s_j) + extra)    extra = 0 (vanilla), 1 (off-by-one),
//                                          exp(alpha[h]) (learnable)
//   P_j   = exp(s_j - lse_i);  P'_j = P_j * keep_j / (1 - p) with dropout
//   o_i   = sum_j P'_j v_j;    stats_i = lse_i (fp32)
// Backward (from the saved o and stats, as flash attention does):
//   D_i  = d_o_i . o_i;  dP'_j = keep_j / (1 - p) * d_o_i . v_j
//   dS_j = P_j (dP'_j - D_i);  dq_i = scale sum_j dS_j k_j;
//   dk_j = scale sum_i dS_j q_i;  dv_j = sum_i P'_j d_o_i
//   d_alpha[h] = -sum_i exp(alpha[h] - lse_i) D_i
// A query row that attends no key has o = 0, lse = log(extra) (-inf for the
// vanilla softmax) and zero gradients; a padded row (beyond its sequence's
// length with a padding mask) has o = 0, stats = 0, dq = 0, and padded keys
// get dk = dv = 0.
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "backends/attention_geometry.h"
#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// The extra denominator term of the softmax variants as a logit: exp(logit)
// is added to the denominator; has_extra is false for vanilla.
void ExtraLogit(const AttnGeometry& g, const DLTensor* alpha, int64_t h, bool* has_extra, double* logit) {
  *has_extra = g.softmax != TEFL_ATTN_SOFTMAX_VANILLA;
  *logit = g.softmax == TEFL_ATTN_SOFTMAX_LEARNABLE ? double(static_cast<const float*>(DataPtr(alpha))[h]) : 0.0;
}

// The scores of query (bi, h, i) for keys [lo, hi).
std::vector<double> Scores(const AttnGeometry& g, const Matrix& q, const Matrix& k, int64_t bi, int64_t h, int64_t i,
                           int64_t lo, int64_t hi) {
  std::vector<double> s(size_t(hi - lo));
  const int64_t qo = AttnGeometry::At(g.token_q(bi, i), h, g.hq, g.dqk);
  for (int64_t j = lo; j < hi; ++j) {
    const int64_t ko = AttnGeometry::At(g.token_kv(bi, j), g.kv_head(h), g.hkv, g.dqk);
    double dot = 0.0;
    for (int64_t c = 0; c < g.dqk; ++c) dot += q.at(qo + c) * k.at(ko + c);
    s[size_t(j - lo)] = g.scale * dot;
  }
  return s;
}

// log(sum exp(s) + exp(extra logit)), shifted by the maximum.
double LogSumExp(const std::vector<double>& s, bool has_extra, double extra_logit) {
  double m = has_extra ? extra_logit : kNegInf;
  for (double x : s) m = std::isnan(x) || x > m ? x : m;
  if (m == kNegInf) return kNegInf;  // nothing attended, vanilla
  double sum = has_extra ? std::exp(extra_logit - m) : 0.0;
  for (double x : s) sum += std::exp(x - m);
  return m + std::log(sum);
}

// The dropout factor of score (bi, h, i, j): keep / (1 - p), or 1.
double DropFactor(const AttnGeometry& g, int64_t bi, int64_t h, int64_t i, int64_t j) {
  if (!g.dropout) return 1.0;
  const uint64_t e = g.DropRow(bi, h, i) * g.DropCols() + g.DropCol(bi, j);
  return g.Kept(e, DropoutThreshold16(g.p)) ? 1.0 / (1.0 - double(g.p)) : 0.0;
}

// in (q, k, v, cu_seqlens_q?, cu_seqlens_kv?, softmax_offset?) -> out (o, stats)
tefl_status* AttnFwd(const tefl_call_frame* f, void*) {
  const auto& attrs = *static_cast<const tefl_attention_attrs*>(f->attrs);
  const DLTensor* const* in = f->inputs;
  const AttnGeometry g = MakeAttnGeometry(in[0], in[1], in[2], in[3], in[4], attrs);
  const Matrix q = View(in[0]), k = View(in[1]), v = View(in[2]), o = View(f->outputs[0]);
  float* stats = static_cast<float*>(DataPtr(f->outputs[1]));

  for (int64_t bi = 0; bi < g.b; ++bi) {
    for (int64_t h = 0; h < g.hq; ++h) {
      bool has_extra;
      double extra_logit;
      ExtraLogit(g, in[5], h, &has_extra, &extra_logit);
      for (int64_t i = 0; i < g.rows_q(bi); ++i) {
        const int64_t oo = AttnGeometry::At(g.token_q(bi, i), h, g.hq, g.dv);
        if (i >= g.len_q(bi)) {  // padded row
          for (int64_t c = 0; c < g.dv; ++c) o.set(oo + c, 0.0);
          stats[g.stat_index(bi, h, i)] = 0.0f;
          continue;
        }
        int64_t lo, hi;
        g.KeyRange(bi, i, &lo, &hi);
        const std::vector<double> s = Scores(g, q, k, bi, h, i, lo, hi);
        const double lse = LogSumExp(s, has_extra, extra_logit);
        std::vector<double> acc(size_t(g.dv), 0.0);
        for (int64_t j = lo; j < hi; ++j) {
          const double p = std::exp(s[size_t(j - lo)] - lse) * DropFactor(g, bi, h, i, j);
          const int64_t vo = AttnGeometry::At(g.token_kv(bi, j), g.kv_head(h), g.hkv, g.dv);
          for (int64_t c = 0; c < g.dv; ++c) acc[size_t(c)] += p * v.at(vo + c);
        }
        for (int64_t c = 0; c < g.dv; ++c) o.set(oo + c, acc[size_t(c)]);
        stats[g.stat_index(bi, h, i)] = float(lse);
      }
    }
  }
  return nullptr;
}

// in (q, k, v, o, d_o, stats, cu_seqlens_q?, cu_seqlens_kv?, softmax_offset?)
// -> out (dq, dk, dv, d_softmax_offset?); d_softmax_offset is 0 unless the
// softmax is learnable.
tefl_status* AttnBwd(const tefl_call_frame* f, void*) {
  const auto& attrs = *static_cast<const tefl_attention_attrs*>(f->attrs);
  const DLTensor* const* in = f->inputs;
  const AttnGeometry g = MakeAttnGeometry(in[0], in[1], in[2], in[6], in[7], attrs);
  const Matrix q = View(in[0]), k = View(in[1]), v = View(in[2]), o = View(in[3]), d_o = View(in[4]);
  const float* stats = static_cast<const float*>(DataPtr(in[5]));
  const DLTensor* alpha = in[8];
  DLTensor* const* out = f->outputs;

  // Gradients accumulate in double over every (query, key) pair, then are
  // rounded once.
  std::vector<double> dq(size_t(NumElements(out[0])), 0.0), dk(size_t(NumElements(out[1])), 0.0),
      dv(size_t(NumElements(out[2])), 0.0), dalpha(size_t(g.hq), 0.0);

  for (int64_t bi = 0; bi < g.b; ++bi) {
    for (int64_t h = 0; h < g.hq; ++h) {
      bool has_extra;
      double extra_logit;
      ExtraLogit(g, alpha, h, &has_extra, &extra_logit);
      const int64_t hk = g.kv_head(h);
      for (int64_t i = 0; i < g.len_q(bi); ++i) {
        int64_t lo, hi;
        g.KeyRange(bi, i, &lo, &hi);
        const double lse = double(stats[g.stat_index(bi, h, i)]);
        const int64_t tq = g.token_q(bi, i);
        const int64_t qo = AttnGeometry::At(tq, h, g.hq, g.dqk), oo = AttnGeometry::At(tq, h, g.hq, g.dv);
        double d_row = 0.0;  // D_i = d_o_i . o_i
        for (int64_t c = 0; c < g.dv; ++c) d_row += d_o.at(oo + c) * o.at(oo + c);
        if (g.softmax == TEFL_ATTN_SOFTMAX_LEARNABLE) dalpha[size_t(h)] -= std::exp(extra_logit - lse) * d_row;
        if (lo >= hi) continue;  // attends nothing: zero gradients
        const std::vector<double> s = Scores(g, q, k, bi, h, i, lo, hi);
        for (int64_t j = lo; j < hi; ++j) {
          const double p = std::exp(s[size_t(j - lo)] - lse);
          const double drop = DropFactor(g, bi, h, i, j);
          const int64_t tk = g.token_kv(bi, j);
          const int64_t ko = AttnGeometry::At(tk, hk, g.hkv, g.dqk), vo = AttnGeometry::At(tk, hk, g.hkv, g.dv);
          double dp = 0.0;
          for (int64_t c = 0; c < g.dv; ++c) {
            dp += d_o.at(oo + c) * v.at(vo + c);
            dv[size_t(vo + c)] += p * drop * d_o.at(oo + c);
          }
          const double ds = p * (drop * dp - d_row);
          for (int64_t c = 0; c < g.dqk; ++c) {
            dq[size_t(qo + c)] += g.scale * ds * k.at(ko + c);
            dk[size_t(ko + c)] += g.scale * ds * q.at(qo + c);
          }
        }
      }
    }
  }
  for (int r = 0; r < 3; ++r) {
    const std::vector<double>& src = r == 0 ? dq : r == 1 ? dk : dv;
    const Matrix dst = View(out[r]);
    for (size_t e = 0; e < src.size(); ++e) dst.set(int64_t(e), src[e]);
  }
  if (out[3] != nullptr) {
    float* da = static_cast<float*>(DataPtr(out[3]));
    for (int64_t h = 0; h < g.hq; ++h) da[h] = float(dalpha[size_t(h)]);
  }
  return nullptr;
}

}  // namespace

tefl_status* RegisterReferenceAttention(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {{"fused_attn_fwd", AttnFwd}, {"fused_attn_bwd", AttnBwd}};
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
