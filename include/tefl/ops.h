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
  TEFL_OP_COUNT_ = 7 /* grows as op families land; not part of the ABI */
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

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TEFL_OPS_H_ */
