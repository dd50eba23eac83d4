/* tefl — operator ids and attribute structs (C11, part of the stable ABI).
 *
 * Op ids are append-only: a released id never changes meaning. Each op's
 * positional inputs and outputs are listed next to its id; the catalogue
 * (`tefl ops`, docs/ops.md) has the dtypes and shapes.
 *
 * Attribute structs start with struct_size and only ever grow at the end.
 * A caller sets struct_size to the struct's TEFL_*_STRUCT_SIZE as it was
 * built (or passes NULL attrs for all defaults); kernels always receive the
 * host's full struct. */
#ifndef TEFL_OPS_H_
#define TEFL_OPS_H_

#include <tefl/tefl.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum tefl_op_id_value {
  /* in (x[N..,H], gamma[H], beta[H]) -> out (z[N..,H], mu[N] f32, rsigma[N] f32) */
  TEFL_OP_LAYERNORM_FWD = 0,
  /* in (dz, x, mu, rsigma, gamma) -> out (dx, dgamma, dbeta) */
  TEFL_OP_LAYERNORM_BWD = 1,
  /* in (x[N..,H], gamma[H]) -> out (z[N..,H], rsigma[N] f32) */
  TEFL_OP_RMSNORM_FWD = 2,
  /* in (dz, x, rsigma, gamma) -> out (dx, dgamma) */
  TEFL_OP_RMSNORM_BWD = 3,
  /* in (dz, x, add, rsigma, gamma) -> out (dx = rmsnorm_bwd dx + add, dgamma);
   * dx may be exactly the tensor add (in place: never retried after an error) */
  TEFL_OP_RMSNORM_BWD_ADD = 4,
  /* RoPE (alias rope_fwd): in (input, freqs[s,1,1,d2] f32, start_positions[b]
   * int32 optional, cu_seqlens[b+1] int32 for thd) -> out (output like input) */
  TEFL_OP_FUSED_ROPE_FORWARD = 5,
  /* alias rope_bwd: in (output_grads, freqs, start_positions?, cu_seqlens?)
   * -> out (input_grads) */
  TEFL_OP_FUSED_ROPE_BACKWARD = 6,

  /* Activations (x: [N.., H]). Forward: in (input) -> out (output like input). */
  TEFL_OP_GELU = 7,
  TEFL_OP_QGELU = 8,
  TEFL_OP_RELU = 9,
  TEFL_OP_SRELU = 10,
  TEFL_OP_SILU = 11,
  /* Backward: in (grad like input, input) -> out (dinput like input). */
  TEFL_OP_DGELU = 12,
  TEFL_OP_DQGELU = 13,
  TEFL_OP_DRELU = 14,
  TEFL_OP_DSRELU = 15,
  TEFL_OP_DSILU = 16,
  /* Gated forward: in (input[N.., 2H]) -> out (output[N.., H]),
   * output = act(input[.., :H]) * input[.., H:]. */
  TEFL_OP_GLU = 17,
  TEFL_OP_GEGLU = 18,
  TEFL_OP_QGEGLU = 19,
  TEFL_OP_REGLU = 20,
  TEFL_OP_SREGLU = 21,
  TEFL_OP_SWIGLU = 22,
  TEFL_OP_CLAMPED_SWIGLU = 23, /* attrs tefl_clamped_swiglu_attrs */
  /* Gated backward: in (grad[N.., H], input[N.., 2H]) -> out (dinput[N.., 2H]). */
  TEFL_OP_DGLU = 24,
  TEFL_OP_DGEGLU = 25,
  TEFL_OP_DQGEGLU = 26,
  TEFL_OP_DREGLU = 27,
  TEFL_OP_DSREGLU = 28,
  TEFL_OP_DSWIGLU = 29,
  TEFL_OP_CLAMPED_DSWIGLU = 30, /* attrs tefl_clamped_swiglu_attrs */
  /* in (grad, input) -> out (dinput, dbias[H] = column sums of dinput). */
  TEFL_OP_DBIAS_DGELU = 31,
  TEFL_OP_DBIAS_DSILU = 32,
  TEFL_OP_DBIAS_DRELU = 33,
  TEFL_OP_DBIAS_DQGELU = 34,
  TEFL_OP_DBIAS_DSRELU = 35,

  /* Softmax over the last dim of scale * input; attrs tefl_softmax_attrs.
   * Forward: in (input[b, h, sq, sk]) -> out (softmax_results). */
  TEFL_OP_SCALED_SOFTMAX_FORWARD = 36,
  /* Every backward: in (output_grads, softmax_results) -> out (input_grads). */
  TEFL_OP_SCALED_SOFTMAX_BACKWARD = 37,
  /* in (input[b, h, sq, sk], mask uint8 [b or 1, 1, sq, sk], 1 = masked) */
  TEFL_OP_SCALED_MASKED_SOFTMAX_FORWARD = 38,
  TEFL_OP_SCALED_MASKED_SOFTMAX_BACKWARD = 39,
  /* in (input[attn_batches, sq, sq]); column j kept iff j <= i */
  TEFL_OP_SCALED_UPPER_TRIANG_MASKED_SOFTMAX_FORWARD = 40,
  TEFL_OP_SCALED_UPPER_TRIANG_MASKED_SOFTMAX_BACKWARD = 41,
  /* in (input[b, h, sq, sk]); bottom-right causal: j kept iff j < i + sk - sq + 1 */
  TEFL_OP_SCALED_ALIGNED_CAUSAL_MASKED_SOFTMAX_FORWARD = 42,
  TEFL_OP_SCALED_ALIGNED_CAUSAL_MASKED_SOFTMAX_BACKWARD = 43,

  /* RoPE on the q and k parts of a combined qkv tensor; attrs
   * tefl_qkv_rope_attrs. in (qkv, q_freqs, k_freqs, start_positions?)
   * -> out (q, k, v) */
  TEFL_OP_FUSED_QKV_ROPE_FORWARD = 44,
  /* in (q_grads, k_grads, v_grads, q_freqs, k_freqs, start_positions?)
   * -> out (qkv_grads) */
  TEFL_OP_FUSED_QKV_ROPE_BACKWARD = 45,

  /* Dropout; attrs tefl_dropout_attrs. in (input) -> out (output, mask
   * uint8 like input, 1 = kept); output = input * mask / (1 - p). */
  TEFL_OP_DROPOUT_FWD = 46,
  /* in (grad_output, mask) -> out (grad_input = grad_output * mask / (1 - p)) */
  TEFL_OP_DROPOUT_BWD = 47,

  /* ---- attention (docs/ops-attention.md); attrs tefl_attention_attrs ---- */
  /* ("?": optional, pass NULL) in (q, k, v, cu_seqlens_q?, cu_seqlens_kv?,
   * softmax_offset?) -> out (o, stats) */
  TEFL_OP_FUSED_ATTN_FWD = 48,
  /* in (q, k, v, o, d_o, stats, cu_seqlens_q?, cu_seqlens_kv?,
   * softmax_offset?) -> out (dq, dk, dv, d_softmax_offset?) */
  TEFL_OP_FUSED_ATTN_BWD = 49,
  /* ---- end attention ---- */

  /* ---- FP8 quantization and scaling recipes (docs/ops-quantization.md) ---- */
  TEFL_OP_QUANTIZE = 50,                /* in (x, scale) -> out (q, amax, scale_inv) */
  TEFL_OP_DEQUANTIZE = 51,              /* in (q, scale_inv) -> out (x) */
  TEFL_OP_COMPUTE_AMAX = 52,            /* in (x) -> out (amax) */
  TEFL_OP_COMPUTE_SCALE_FROM_AMAX = 53, /* in (amax) -> out (scale, scale_inv) */
  /* in (amax_history, scale) -> out (new_amax_history, new_scale) */
  TEFL_OP_FUSED_AMAX_AND_SCALE_UPDATE_AFTER_REDUCTION = 54,
  TEFL_OP_FP8_TRANSPOSE = 55, /* in (q) -> out (qT) */
  /* ---- end quantization ---- */

  /* ---- GEMM (docs/ops-gemm.md); attrs tefl_gemm_attrs ---- */
  /* ("?": optional, pass NULL) in (A, B, C?, bias?, a_scale_inv?,
   * b_scale_inv?, d_scale?) -> out (D, pre_gelu_out?, bias_grad?, d_amax?) */
  TEFL_OP_GENERIC_GEMM = 56,
  /* in (A, B, m_splits, bias?, a_scale_inv?, b_scale_inv?, d_scale?) -> out
   * (D, pre_gelu_out?, bias_grad?, d_amax?) */
  TEFL_OP_TE_GENERAL_GROUPED_GEMM = 57,
  /* ---- end GEMM ---- */

  /* ---- fused FP8 outputs: the op, then quantize (scale in, amax and
   * scale_inv out), in one pass ---- */
  TEFL_OP_RMSNORM_FWD_FP8 = 58, /* in (x, gamma, scale) -> out (z, rsigma, amax, scale_inv) */
  /* in (x, gamma, beta, scale) -> out (z, mu, rsigma, amax, scale_inv) */
  TEFL_OP_LAYERNORM_FWD_FP8 = 59,
  /* the gated ones: in (input, scale) -> out (output, amax, scale_inv) */
  TEFL_OP_GLU_FP8 = 60,
  TEFL_OP_GEGLU_FP8 = 61,
  TEFL_OP_QGEGLU_FP8 = 62,
  TEFL_OP_REGLU_FP8 = 63,
  TEFL_OP_SREGLU_FP8 = 64,
  TEFL_OP_SWIGLU_FP8 = 65,
  TEFL_OP_CLAMPED_SWIGLU_FP8 = 66,
  /* ---- end fused FP8 outputs ---- */

  TEFL_OP_COUNT_ = 67 /* grows as op families land; not part of the ABI */
} tefl_op_id_value;

/* layernorm_fwd and rmsnorm_fwd. Defaults: eps 1e-5, zero_centered_gamma 0,
 * sm_margin 0 (a CUDA launch hint; ignored on the CPU). With
 * zero_centered_gamma the weight applied is gamma + 1. */
typedef struct tefl_norm_fwd_attrs {
  size_t struct_size;
  float eps;
  int32_t zero_centered_gamma;
  int32_t sm_margin;
} tefl_norm_fwd_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_norm_fwd_attrs, eps) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_norm_fwd_attrs, zero_centered_gamma) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_norm_fwd_attrs, sm_margin) == 16, "append-only");
#define TEFL_NORM_FWD_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_norm_fwd_attrs, sm_margin)
typedef tefl_norm_fwd_attrs tefl_layernorm_fwd_attrs;
typedef tefl_norm_fwd_attrs tefl_rmsnorm_fwd_attrs;

/* layernorm_bwd, rmsnorm_bwd, rmsnorm_bwd_add. Defaults 0. */
typedef struct tefl_norm_bwd_attrs {
  size_t struct_size;
  int32_t zero_centered_gamma;
  int32_t sm_margin;
} tefl_norm_bwd_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_norm_bwd_attrs, zero_centered_gamma) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_norm_bwd_attrs, sm_margin) == 12, "append-only");
#define TEFL_NORM_BWD_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_norm_bwd_attrs, sm_margin)
typedef tefl_norm_bwd_attrs tefl_layernorm_bwd_attrs;
typedef tefl_norm_bwd_attrs tefl_rmsnorm_bwd_attrs;
typedef tefl_norm_bwd_attrs tefl_rmsnorm_bwd_add_attrs;

/* TransformerEngine's NVTE_QKV_Format values. */
typedef enum tefl_qkv_format { TEFL_QKV_SBHD = 0, TEFL_QKV_BSHD = 1, TEFL_QKV_THD = 2 } tefl_qkv_format;

/* fused_rope_forward / fused_rope_backward. Defaults: sbhd, not interleaved,
 * cp_size 1, cp_rank 0. With cp_size > 1 the sequence is split in 2*cp_size
 * chunks and this rank holds chunks cp_rank and 2*cp_size-1-cp_rank. */
typedef struct tefl_rope_attrs {
  size_t struct_size;
  int32_t qkv_format; /* tefl_qkv_format */
  int32_t interleaved;
  int32_t cp_size;
  int32_t cp_rank;
} tefl_rope_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_rope_attrs, qkv_format) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_rope_attrs, interleaved) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_rope_attrs, cp_size) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_rope_attrs, cp_rank) == 20, "append-only");
#define TEFL_ROPE_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_rope_attrs, cp_rank)

/* fused_qkv_rope_forward / fused_qkv_rope_backward. qkv is [s, b, h, q_split
 * + k_split + v_split] (sbhd; bshd: [b, s, h, ...]); along the last dim each
 * of the h groups holds q_split/d q heads, then k_split/d k heads, then
 * v_split/d v heads, d = the head dim (that of q, k and v outputs). Defaults:
 * as tefl_rope_attrs; the three splits must be set (> 0, multiples of d). */
typedef struct tefl_qkv_rope_attrs {
  size_t struct_size;
  int32_t qkv_format; /* sbhd or bshd (thd is not supported by TE either) */
  int32_t interleaved;
  int32_t cp_size;
  int32_t cp_rank;
  int32_t q_split;
  int32_t k_split;
  int32_t v_split;
} tefl_qkv_rope_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_qkv_rope_attrs, qkv_format) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_qkv_rope_attrs, cp_rank) == 20, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_qkv_rope_attrs, v_split) == 32, "append-only");
#define TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_qkv_rope_attrs, v_split)

/* clamped_swiglu / clamped_dswiglu. Defaults: limit 7.0, alpha 1.702.
 * a = min(x[.., :H], limit); b = clamp(x[.., H:], -limit, limit) + 1;
 * out = a * sigmoid(alpha * a) * b. */
typedef struct tefl_clamped_swiglu_attrs {
  size_t struct_size;
  float limit;
  float alpha;
} tefl_clamped_swiglu_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_clamped_swiglu_attrs, limit) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_clamped_swiglu_attrs, alpha) == 12, "append-only");
#define TEFL_CLAMPED_SWIGLU_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_clamped_swiglu_attrs, alpha)

/* Every scaled_*softmax_forward/backward. Default scale 1.0. */
typedef struct tefl_softmax_attrs {
  size_t struct_size;
  float scale;
} tefl_softmax_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_softmax_attrs, scale) == 8, "append-only");
#define TEFL_SOFTMAX_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_softmax_attrs, scale)

/* dropout_fwd / dropout_bwd. Defaults: p 0.1, seed 0, offset 0. The keep mask
 * of element i (row-major index) is a pure function of (seed, offset, i):
 * Philox-4x32-10 (Random123's philox4x32_10: multipliers 0xD2511F53,
 * 0xCD9E8D57, key bumps 0x9E3779B9, 0xBB67AE85, 10 rounds) with
 *   key     = (lo32(seed), hi32(seed)),
 *   counter = (lo32(i / 8), hi32(i / 8), lo32(offset), hi32(offset)),
 * takes 16-bit half h = i % 8 of the result (word h / 2, its low half if h
 * is even, high if odd); element i is kept (mask 1) iff that half >=
 * threshold16 = ceil(p * 2^16) (exact: p is a float, so p * 2^16 is exact in
 * double; p = 0 keeps everything, p > 1 - 2^-16 gives 2^16: nothing kept).
 * P(kept) = 1 - threshold16 / 2^16. The same (seed, offset) gives the same
 * mask on any thread count and in any implementation. dropout_bwd reads any
 * nonzero mask byte as kept. */
typedef struct tefl_dropout_attrs {
  size_t struct_size;
  uint64_t seed;
  uint64_t offset;
  float p; /* drop probability, in [0, 1) */
} tefl_dropout_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_dropout_attrs, seed) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_dropout_attrs, offset) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_dropout_attrs, p) == 24, "append-only");
#define TEFL_DROPOUT_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_dropout_attrs, p)

/* ---- attention attribute structs ---- */

/* TransformerEngine's NVTE_Mask_Type values (fused_attn_fwd / fused_attn_bwd). */
typedef enum tefl_attn_mask_type {
  TEFL_ATTN_MASK_NO_MASK = 0,
  TEFL_ATTN_MASK_PADDING = 1,
  TEFL_ATTN_MASK_CAUSAL = 2,
  TEFL_ATTN_MASK_PADDING_CAUSAL = 3,
  TEFL_ATTN_MASK_CAUSAL_BOTTOM_RIGHT = 4,
  TEFL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT = 5
} tefl_attn_mask_type;

/* TransformerEngine's NVTE_Softmax_Type values. */
typedef enum tefl_attn_softmax_type {
  TEFL_ATTN_SOFTMAX_VANILLA = 0,
  TEFL_ATTN_SOFTMAX_OFF_BY_ONE = 1,
  TEFL_ATTN_SOFTMAX_LEARNABLE = 2
} tefl_attn_softmax_type;

/* fused_attn_fwd / fused_attn_bwd (docs/ops-attention.md). Defaults: sbhd,
 * no_mask, window (-1, -1) (unbounded), vanilla softmax, scale 0 (meaning
 * 1/sqrt(d_qk)), dropout 0, not training, seed 0, offset 0.
 * s = scale * q.k; query i of a sequence of sq queries and sk keys attends
 * keys j in [i + sk - sq - window_left, i + sk - sq + window_right] (-1:
 * unbounded side), and with causal masks also j <= i (top-left) or j <= i +
 * sk - sq (bottom-right); causal masks require window_right -1 or 0.
 * Dropout (only when is_training) keeps element e = ((b * h_q + h) * sq + i)
 * * sk + j (thd: (h * t_q + token_q) * t_kv + token_kv) by tefl_dropout_attrs'
 * Philox rule with (seed, offset, p = dropout). */
typedef struct tefl_attention_attrs {
  size_t struct_size;
  int32_t qkv_format;   /* tefl_qkv_format */
  int32_t mask_type;    /* tefl_attn_mask_type */
  int32_t window_left;  /* -1: unbounded */
  int32_t window_right; /* -1: unbounded */
  int32_t softmax_type; /* tefl_attn_softmax_type */
  float scale;          /* 0: 1/sqrt(d_qk) */
  float dropout;        /* drop probability in [0, 1) */
  int32_t is_training;  /* dropout applies only when nonzero */
  uint64_t seed;
  uint64_t offset;
} tefl_attention_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, qkv_format) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, mask_type) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, window_left) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, window_right) == 20, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, softmax_type) == 24, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, scale) == 28, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, dropout) == 32, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, is_training) == 36, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, seed) == 40, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_attention_attrs, offset) == 48, "append-only");
#define TEFL_ATTENTION_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_attention_attrs, offset)

/* ---- end attention attribute structs ---- */

/* ---- quantization attribute structs ---- */

/* FP8 formats (the recipes' fp8_format attribute; quantize and the fused
 * variants take the format from the output's dtype instead). */
typedef enum tefl_fp8_format { TEFL_FP8_E4M3 = 0, TEFL_FP8_E5M2 = 1 } tefl_fp8_format;

/* compute_scale_from_amax (current scaling). Defaults: E4M3, epsilon 0,
 * force_pow_2_scales 0. Per element: a = max(amax, epsilon); scale =
 * fp8_max / a, 1 when a is 0, inf or NaN, FLT_MAX when the quotient is inf;
 * with force_pow_2_scales the scale's float bits are masked with 0xFF800000
 * (rounded down to a power of two). scale_inv = 1 / scale. */
typedef struct tefl_compute_scale_attrs {
  size_t struct_size;
  int32_t fp8_format; /* tefl_fp8_format */
  float epsilon;
  int32_t force_pow_2_scales;
} tefl_compute_scale_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_compute_scale_attrs, fp8_format) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_compute_scale_attrs, epsilon) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_compute_scale_attrs, force_pow_2_scales) == 16, "append-only");
#define TEFL_COMPUTE_SCALE_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_compute_scale_attrs, force_pow_2_scales)

/* fused_amax_and_scale_update_after_reduction (delayed scaling).
 * amax_compute_algo: 0 = max over the history, 1 = most recent (row 0).
 * Defaults: max, E4M3, margin 0. */
typedef enum tefl_amax_compute_algo { TEFL_AMAX_ALGO_MAX = 0, TEFL_AMAX_ALGO_MOST_RECENT = 1 } tefl_amax_compute_algo;
typedef struct tefl_delayed_scaling_attrs {
  size_t struct_size;
  int32_t amax_compute_algo; /* tefl_amax_compute_algo */
  int32_t fp8_format;        /* tefl_fp8_format */
  float margin;
} tefl_delayed_scaling_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_delayed_scaling_attrs, amax_compute_algo) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_delayed_scaling_attrs, fp8_format) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_delayed_scaling_attrs, margin) == 16, "append-only");
#define TEFL_DELAYED_SCALING_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_delayed_scaling_attrs, margin)

/* ---- end quantization attribute structs ---- */

/* ---- GEMM attribute structs ---- */

/* generic_gemm and te_general_grouped_gemm (docs/ops-gemm.md). Row-major:
 *   D[M, N] = epilogue(alpha * op(A) op(B) + beta * C + bias[N]),
 * op(X) = X^T when trans* is set; with accumulate, D's prior content takes
 * C's place (D = alpha * op(A) op(B) + beta * D). gelu: D = gelu_tanh(.) and
 * the pre-GELU value goes to pre_gelu_out when given. grad: bias_grad[M] =
 * sum over k of op(A)[m, k] (TE's wgrad grad_bias = dy.sum(0) with A = dy^T).
 * gelu with grad (TE's DGELU epilogue): pre_gelu_out is an input P and
 * D = (alpha * op(A) op(B) + beta * C) * gelu'(P), bias_grad[N] = column sums
 * of D.
 * use_split_accumulator is a cuBLAS FP8 hint: accepted, no effect on the
 * CPU (every implementation accumulates in fp32 or wider). Defaults: no
 * transposes, alpha 1, beta 1, the flags 0. */
typedef struct tefl_gemm_attrs {
  size_t struct_size;
  int32_t transa;
  int32_t transb;
  float alpha;
  float beta;
  int32_t accumulate;
  int32_t gelu;
  int32_t grad;
  int32_t use_split_accumulator;
} tefl_gemm_attrs;
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, transa) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, transb) == 12, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, alpha) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, beta) == 20, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, accumulate) == 24, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, gelu) == 28, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, grad) == 32, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_gemm_attrs, use_split_accumulator) == 36, "append-only");
#define TEFL_GEMM_ATTRS_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_gemm_attrs, use_split_accumulator)

/* ---- end GEMM attribute structs ---- */

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TEFL_OPS_H_ */
