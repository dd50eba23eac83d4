// Schemas of the attention family: fused_attn_fwd / fused_attn_bwd (flash
// attention; maths in spec/ops.md "Attention", contract in
// docs/ops-attention.md and include/tefl/ops.h, tefl_attention_attrs).
//
// Tensors are compact row-major (kOpContiguous). The check reads
// cu_seqlens_q/kv (int32, host memory) so that a bad sequence table is a
// validation error naming the argument before any output is written: the
// schemas carry kOpChecksData.
#include <cstring>
#include <string>

#include "core/catalogue.h"
#include "core/validate.h"

namespace tefl {
namespace {

constexpr DTypeSet kF = kFloatTypes;
constexpr DTypeSet kF32Only = Bit(DType::kF32);
constexpr DTypeSet kI32Only = Bit(DType::kI32);

// Forward: 0 q, 1 k, 2 v, 3 cu_seqlens_q, 4 cu_seqlens_kv, 5 softmax_offset,
// 6 o, 7 stats.
constexpr ArgSchema kFwdIn[] = {
    {"q", kF, false, "sbhd [sq, b, h_q, d_qk] | bshd [b, sq, h_q, d_qk] | thd [t_q, h_q, d_qk]"},
    {"k", kF, false, "sbhd [sk, b, h_kv, d_qk] | bshd [b, sk, h_kv, d_qk] | thd [t_kv, h_kv, d_qk]; h_kv divides h_q"},
    {"v", kF, false, "like k with head dim d_v"},
    {"cu_seqlens_q", kI32Only, true, "[b + 1] cumulative query lengths (thd and padding masks; NULL otherwise)"},
    {"cu_seqlens_kv", kI32Only, true, "[b + 1] cumulative key lengths (thd and padding masks; NULL otherwise)"},
    {"softmax_offset", kF32Only, true, "[h_q] alpha of the learnable softmax (NULL otherwise)"}};
constexpr ArgSchema kFwdOut[] = {
    {"o", kF, false, "like q with head dim d_v, dtype of q"},
    {"stats", kF32Only, false, "log-sum-exp per query row: [b, h_q, sq] (thd: [h_q, t_q])"}};

// Backward: 0 q, 1 k, 2 v, 3 o, 4 d_o, 5 stats, 6 cu_seqlens_q,
// 7 cu_seqlens_kv, 8 softmax_offset, 9 dq, 10 dk, 11 dv, 12 d_softmax_offset.
constexpr ArgSchema kBwdIn[] = {{"q", kF, false, "as in fused_attn_fwd"},
                                {"k", kF, false, "as in fused_attn_fwd"},
                                {"v", kF, false, "as in fused_attn_fwd"},
                                {"o", kF, false, "the forward output"},
                                {"d_o", kF, false, "gradient of o, like o"},
                                {"stats", kF32Only, false, "the forward's log-sum-exp statistics"},
                                {"cu_seqlens_q", kI32Only, true, "as in fused_attn_fwd"},
                                {"cu_seqlens_kv", kI32Only, true, "as in fused_attn_fwd"},
                                {"softmax_offset", kF32Only, true, "[h_q] alpha of the learnable softmax"}};
constexpr ArgSchema kBwdOut[] = {
    {"dq", kF, false, "like q"},
    {"dk", kF, false, "like k"},
    {"dv", kF, false, "like v"},
    {"d_softmax_offset", kF32Only, true, "[h_q] gradient of alpha (zeros unless softmax_type is learnable)"}};

constexpr double kMaxP = 1.0 - 1.0 / 16777216.0;  // the largest float below 1
constexpr double kIntMax = 2147483647.0;

constexpr AttrSchema kAttrs[] = {
    {"qkv_format", AttrType::kI32, offsetof(tefl_attention_attrs, qkv_format), TEFL_QKV_SBHD, 0, 2, 2,
     "0 sbhd, 1 bshd, 2 thd (NVTE_QKV_Format)"},
    {"mask_type", AttrType::kI32, offsetof(tefl_attention_attrs, mask_type), TEFL_ATTN_MASK_NO_MASK, 0, 5, 3,
     "0 no_mask, 1 padding, 2 causal, 3 padding_causal, 4 causal_bottom_right, 5 padding_causal_bottom_right"},
    {"window_left", AttrType::kI32, offsetof(tefl_attention_attrs, window_left), -1, -1, kIntMax, 0,
     "sliding window: keys at most this far left of the (bottom-right) diagonal; -1 unbounded"},
    {"window_right", AttrType::kI32, offsetof(tefl_attention_attrs, window_right), -1, -1, kIntMax, 0,
     "sliding window: keys at most this far right of the diagonal; -1 unbounded (causal masks: -1 or 0)"},
    {"softmax_type", AttrType::kI32, offsetof(tefl_attention_attrs, softmax_type), TEFL_ATTN_SOFTMAX_VANILLA, 0, 2, 2,
     "0 vanilla, 1 off_by_one (+1 in the denominator), 2 learnable (+exp(alpha[h]))"},
    {"scale", AttrType::kF32, offsetof(tefl_attention_attrs, scale), 0.0, 0.0, 3.0e38, 0,
     "score scale; 0 means 1/sqrt(d_qk)"},
    {"dropout", AttrType::kF32, offsetof(tefl_attention_attrs, dropout), 0.0, 0.0, kMaxP, 0,
     "drop probability of attention weights, in [0, 1) (only when is_training)"},
    {"is_training", AttrType::kBool, offsetof(tefl_attention_attrs, is_training), 0, 0, 1, 1,
     "apply dropout (forward and backward)"},
    {"seed", AttrType::kU64, offsetof(tefl_attention_attrs, seed), 0, 0, 0, 0, "dropout Philox key"},
    {"offset", AttrType::kU64, offsetof(tefl_attention_attrs, offset), 0, 0, 0, 0, "dropout Philox counter words 2-3"},
};
constexpr tefl_attention_attrs kDefaults = {TEFL_ATTENTION_ATTRS_STRUCT_SIZE,
                                            TEFL_QKV_SBHD,
                                            TEFL_ATTN_MASK_NO_MASK,
                                            -1,
                                            -1,
                                            TEFL_ATTN_SOFTMAX_VANILLA,
                                            0.0f,
                                            0.0f,
                                            0,
                                            0,
                                            0};

constexpr int64_t kMaxHeadDim = 256;

const char* FormatName(int32_t f) { return f == TEFL_QKV_SBHD ? "sbhd" : f == TEFL_QKV_BSHD ? "bshd" : "thd"; }
const char* MaskName(int32_t m) {
  static constexpr const char* kNames[] = {
      "no_mask", "padding", "causal", "padding_causal", "causal_bottom_right", "padding_causal_bottom_right"};
  return kNames[m];
}
bool IsPadding(int32_t m) {
  return m == TEFL_ATTN_MASK_PADDING || m == TEFL_ATTN_MASK_PADDING_CAUSAL ||
         m == TEFL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}
bool IsCausal(int32_t m) { return m >= TEFL_ATTN_MASK_CAUSAL; }

std::string Shape(std::initializer_list<int64_t> s) {
  std::string r = "[";
  for (auto it = s.begin(); it != s.end(); ++it) r += (it == s.begin() ? "" : ", ") + std::to_string(*it);
  return r + "]";
}
bool HasShape(const DLTensor* t, std::initializer_list<int64_t> want) {
  if (t->ndim != int(want.size())) return false;
  int d = 0;
  for (int64_t w : want)
    if (t->shape[d++] != w) return false;
  return true;
}

tefl_status* OpError(const OpSchema& op, const std::string& what) {
  return tefl_status_new(TEFL_INVALID_ARGUMENT, fmt::format("{}: {}", op.name, what).c_str());
}

bool OnHost(const DLTensor* t) {
  int32_t type;
  std::memcpy(&type, &t->device.device_type, sizeof(type));
  return type == kDLCPU || type == kDLCUDAHost || type == kDLROCMHost;
}

// Argument indices of one op.
struct Idx {
  int q, k, v, o, d_o, stats, cu_q, cu_kv, alpha, dq, dk, dv, d_alpha;  // -1: absent from the op
};
constexpr Idx kFwdIdx = {0, 1, 2, 6, -1, 7, 3, 4, 5, -1, -1, -1, -1};
constexpr Idx kBwdIdx = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};

// The dims of a call, from q, k, v.
struct Dims {
  int64_t b, sq, sk, hq, hkv, dqk, dv;
};

// One row-major layout of `heads` heads of `d` channels for `tokens` (seq or
// total tokens) in the call's format.
void Layout(int32_t format, const Dims& m, int64_t seq, int64_t heads, int64_t d, int64_t (&buf)[4], int* rank) {
  if (format == TEFL_QKV_THD) {
    buf[0] = seq, buf[1] = heads, buf[2] = d;
    *rank = 3;
  } else if (format == TEFL_QKV_SBHD) {
    buf[0] = seq, buf[1] = m.b, buf[2] = heads, buf[3] = d;
    *rank = 4;
  } else {
    buf[0] = m.b, buf[1] = seq, buf[2] = heads, buf[3] = d;
    *rank = 4;
  }
}

// Whether t has the given layout; otherwise an error naming argument i.
tefl_status* ExpectLayout(const OpSchema& op, const CallArgs& a, int i, int32_t format, const Dims& m, int64_t seq,
                          int64_t heads, int64_t d, const char* why) {
  int64_t buf[4];
  int rank = 0;
  Layout(format, m, seq, heads, d, buf, &rank);
  const DLTensor* t = TensorAt(a, i);
  bool ok = t->ndim == rank;
  for (int r = 0; ok && r < rank; ++r) ok = t->shape[r] == buf[r];
  if (ok) return nullptr;
  std::string want = "[";
  for (int r = 0; r < rank; ++r) want += (r ? ", " : "") + std::to_string(buf[r]);
  want += "]";
  return ArgError(op, i, fmt::format("expected shape {} ({}), got {}", want, why, ShapeString(t)));
}

tefl_status* CheckSameDtype(const OpSchema& op, const CallArgs& a, int like, int i) {
  const DType want = DTypeOf(TensorAt(a, like)->dtype), got = DTypeOf(TensorAt(a, i)->dtype);
  if (want == got) return nullptr;
  return ArgError(
      op, i,
      fmt::format("expected dtype {} (that of '{}'), got {}", DTypeName(want), ArgAt(op, like).name, DTypeName(got)));
}

// cu_seqlens argument i: [b + 1], starts at 0, non-decreasing; each length <=
// max_len (bshd/sbhd) or the last value == total (thd).
tefl_status* CheckCuSeqlens(const OpSchema& op, const CallArgs& a, int i, int64_t b, bool thd, int64_t extent,
                            const char* extent_name) {
  const DLTensor* cu = TensorAt(a, i);
  if (thd) {
    if (cu->ndim != 1 || cu->shape[0] < 1)
      return ArgError(op, i, fmt::format("expected shape [b + 1] with b >= 0, got {}", ShapeString(cu)));
  } else if (!HasShape(cu, {b + 1})) {
    return ArgError(op, i, fmt::format("expected shape [{}] (batch {} + 1), got {}", b + 1, b, ShapeString(cu)));
  }
  if (!OnHost(cu)) return nullptr;
  const auto* p = static_cast<const int32_t*>(DataPtr(cu));
  const int64_t n = cu->shape[0] - 1;
  if (p[0] != 0) return ArgError(op, i, fmt::format("expected {}[0] == 0, got {}", ArgAt(op, i).name, p[0]));
  for (int64_t j = 0; j < n; ++j) {
    if (p[j + 1] < p[j]) {
      return ArgError(op, i,
                      fmt::format("expected non-decreasing values, got {}[{}] = {} < {}[{}] = {}", ArgAt(op, i).name,
                                  j + 1, p[j + 1], ArgAt(op, i).name, j, p[j]));
    }
    if (!thd && p[j + 1] - p[j] > extent) {
      return ArgError(op, i,
                      fmt::format("sequence {} has length {} > {} = {} (the padded length)", j, p[j + 1] - p[j],
                                  extent_name, extent));
    }
  }
  if (thd && p[n] != extent) {
    return ArgError(op, i,
                    fmt::format("expected {}[{}] = {} to equal {} = {} (tokens of the tensor)", ArgAt(op, i).name, n,
                                p[n], extent_name, extent));
  }
  return nullptr;
}

tefl_status* CheckAttention(const OpSchema& op, const CallArgs& a, const Idx& x) {
  const auto* attrs = static_cast<const tefl_attention_attrs*>(a.attrs);
  const int32_t format = attrs->qkv_format, mask = attrs->mask_type;
  const bool thd = format == TEFL_QKV_THD;
  if (IsCausal(mask) && attrs->window_right > 0) {
    return OpError(op, fmt::format("attribute 'window_right' must be -1 or 0 with mask_type {} (a causal mask implies "
                                   "window_right 0), got {}",
                                   MaskName(mask), attrs->window_right));
  }
  const DLTensor* q = TensorAt(a, x.q);
  const DLTensor* k = TensorAt(a, x.k);
  const DLTensor* v = TensorAt(a, x.v);
  const int rank = thd ? 3 : 4;
  for (int i : {x.q, x.k, x.v}) {
    const DLTensor* t = TensorAt(a, i);
    if (t->ndim != rank) {
      return ArgError(
          op, i,
          fmt::format("expected rank {} for qkv_format {}, got shape {}", rank, FormatName(format), ShapeString(t)));
    }
  }
  Dims m{};
  const int sdim = format == TEFL_QKV_SBHD ? 0 : 1;
  m.b = thd ? -1 : q->shape[1 - sdim];
  m.sq = thd ? q->shape[0] : q->shape[sdim];
  m.sk = thd ? k->shape[0] : k->shape[sdim];
  m.hq = q->shape[rank - 2];
  m.hkv = k->shape[rank - 2];
  m.dqk = q->shape[rank - 1];
  m.dv = v->shape[rank - 1];
  if (m.dqk < 1 || m.dqk > kMaxHeadDim)
    return ArgError(op, x.q,
                    fmt::format("expected head dim d_qk in [1, {}], got shape {}", kMaxHeadDim, ShapeString(q)));
  if (m.dv < 1 || m.dv > kMaxHeadDim)
    return ArgError(op, x.v,
                    fmt::format("expected head dim d_v in [1, {}], got shape {}", kMaxHeadDim, ShapeString(v)));
  if (m.hq < 1 || m.hkv < 1 || m.hq % m.hkv != 0) {
    return ArgError(op, x.k,
                    fmt::format("expected h_kv >= 1 dividing h_q = {} (GQA/MQA), got shape {}", m.hq, ShapeString(k)));
  }
  if (!thd && k->shape[1 - sdim] != m.b)
    return ArgError(op, x.k, fmt::format("expected batch {} (that of 'q'), got shape {}", m.b, ShapeString(k)));
  if (tefl_status* e = ExpectLayout(op, a, x.k, format, m, m.sk, m.hkv, m.dqk, "h_kv heads of d_qk = that of 'q'"))
    return e;
  if (tefl_status* e = ExpectLayout(op, a, x.v, format, m, m.sk, m.hkv, m.dv, "the tokens and heads of 'k'")) return e;

  // cu_seqlens: thd and padding masks need both; others take none.
  const DLTensor* cu_q = TensorAt(a, x.cu_q);
  const DLTensor* cu_kv = TensorAt(a, x.cu_kv);
  const bool need_cu = thd || IsPadding(mask);
  for (int i : {x.cu_q, x.cu_kv}) {
    const DLTensor* cu = TensorAt(a, i);
    if (need_cu && cu == nullptr) {
      return ArgError(
          op, i,
          fmt::format("is required for qkv_format {} with mask_type {}, got NULL", FormatName(format), MaskName(mask)));
    }
    if (!need_cu && cu != nullptr) {
      return ArgError(op, i,
                      fmt::format("must be NULL for qkv_format {} with mask_type {} (no padding)", FormatName(format),
                                  MaskName(mask)));
    }
  }
  if (need_cu) {
    if (tefl_status* e = CheckCuSeqlens(op, a, x.cu_q, m.b, thd, m.sq, thd ? "t_q" : "sq")) return e;
    if (thd) m.b = cu_q->shape[0] - 1;
    if (!HasShape(cu_kv, {m.b + 1})) {
      return ArgError(op, x.cu_kv,
                      fmt::format("expected shape [{}] (that of 'cu_seqlens_q'), got {}", m.b + 1, ShapeString(cu_kv)));
    }
    if (tefl_status* e = CheckCuSeqlens(op, a, x.cu_kv, m.b, thd, m.sk, thd ? "t_kv" : "sk")) return e;
  }

  // softmax_offset: [h_q] f32 for the learnable softmax, NULL otherwise.
  const DLTensor* alpha = TensorAt(a, x.alpha);
  const bool learnable = attrs->softmax_type == TEFL_ATTN_SOFTMAX_LEARNABLE;
  if (learnable && alpha == nullptr)
    return ArgError(op, x.alpha, "is required for softmax_type learnable (2), got NULL");
  if (!learnable && alpha != nullptr) return ArgError(op, x.alpha, "must be NULL unless softmax_type is learnable (2)");
  if (alpha != nullptr && !HasShape(alpha, {m.hq}))
    return ArgError(op, x.alpha, fmt::format("expected shape [{}] (h_q), got {}", m.hq, ShapeString(alpha)));

  // Outputs and the other inputs.
  for (int i : {x.k, x.v}) {
    if (tefl_status* e = CheckSameDtype(op, a, x.q, i)) return e;
  }
  if (tefl_status* e = ExpectLayout(op, a, x.o, format, m, m.sq, m.hq, m.dv, "the tokens and heads of 'q', d_v of 'v'"))
    return e;
  if (tefl_status* e = CheckSameDtype(op, a, x.q, x.o)) return e;
  const DLTensor* stats = TensorAt(a, x.stats);
  const bool stats_ok = thd ? HasShape(stats, {m.hq, m.sq}) : HasShape(stats, {m.b, m.hq, m.sq});
  if (!stats_ok) {
    return ArgError(op, x.stats,
                    fmt::format("expected shape {} ({}), got {}", thd ? Shape({m.hq, m.sq}) : Shape({m.b, m.hq, m.sq}),
                                thd ? "[h_q, t_q]" : "[b, h_q, sq]", ShapeString(stats)));
  }
  if (x.d_o >= 0) {
    if (tefl_status* e = ExpectLayout(op, a, x.d_o, format, m, m.sq, m.hq, m.dv, "that of 'o'")) return e;
    if (tefl_status* e = CheckSameDtype(op, a, x.q, x.d_o)) return e;
    if (tefl_status* e = ExpectLayout(op, a, x.dq, format, m, m.sq, m.hq, m.dqk, "that of 'q'")) return e;
    if (tefl_status* e = ExpectLayout(op, a, x.dk, format, m, m.sk, m.hkv, m.dqk, "that of 'k'")) return e;
    if (tefl_status* e = ExpectLayout(op, a, x.dv, format, m, m.sk, m.hkv, m.dv, "that of 'v'")) return e;
    for (int i : {x.dq, x.dk, x.dv}) {
      if (tefl_status* e = CheckSameDtype(op, a, x.q, i)) return e;
    }
    const DLTensor* d_alpha = TensorAt(a, x.d_alpha);
    if (d_alpha != nullptr && !HasShape(d_alpha, {m.hq}))
      return ArgError(op, x.d_alpha, fmt::format("expected shape [{}] (h_q), got {}", m.hq, ShapeString(d_alpha)));
  }
  return nullptr;
}

tefl_status* CheckFwd(const OpSchema& op, const CallArgs& a) { return CheckAttention(op, a, kFwdIdx); }
tefl_status* CheckBwd(const OpSchema& op, const CallArgs& a) { return CheckAttention(op, a, kBwdIdx); }

constexpr uint32_t kFlags = kOpNoAlias | kOpContiguous | kOpChecksData;

const OpSchema kSchemas[] = {
    {TEFL_OP_FUSED_ATTN_FWD,
     "fused_attn_fwd",
     "attention",
     "o = softmax(scale * q k^T + mask) v (flash attention, optional dropout), stats = log-sum-exp per query row",
     kFwdIn,
     kFwdOut,
     kAttrs,
     TEFL_ATTENTION_ATTRS_STRUCT_SIZE,
     &kDefaults,
     kFlags,
     CheckFwd,
     {}},
    {TEFL_OP_FUSED_ATTN_BWD,
     "fused_attn_bwd",
     "attention",
     "dq, dk, dv (and d_softmax_offset) of fused_attn_fwd from q, k, v, o, d_o and stats",
     kBwdIn,
     kBwdOut,
     kAttrs,
     TEFL_ATTENTION_ATTRS_STRUCT_SIZE,
     &kDefaults,
     kFlags,
     CheckBwd,
     {}},
};

}  // namespace

std::span<const OpSchema> AttentionSchemas() { return kSchemas; }

}  // namespace tefl
