// tefl attention — the entry points a framework calls (docs/ops-attention.md):
//
//  - GetAttentionBackend(params): which implementation of fused_attn_fwd (or
//    fused_attn_bwd) would serve a call with these parameters under the
//    current policy, and why each other candidate was rejected. Built on
//    OpManager::Explain with tensor descriptors that carry no data (TE's
//    get_attention_backend).
//  - FlashAttention / FlashAttentionBackward: one call of fused_attn_fwd /
//    fused_attn_bwd through a manager, with caller-provided outputs or host
//    outputs it allocates (TE's flash_attention entry).
//
// Both go through the op manager, so a plugin that registers a
// fused_attn_fwd implementation ranked above the built-ins by the policy
// serves (and is reported) instead: the NVTE_PLUGIN contract.
#ifndef TEFL_ATTENTION_HPP_
#define TEFL_ATTENTION_HPP_

#include <cstdint>
#include <string>
#include <vector>

#include "tefl/ops.h"
#include "tefl/tefl.h"
#include "tefl/tefl.hpp"

namespace tefl {

// The parameters of an attention call, without tensors.
struct AttentionParams {
  DLDataType dtype{kDLFloat, 32, 1};  // of q, k, v, o
  DLDevice device{kDLCPU, 0};
  int32_t qkv_format = TEFL_QKV_BSHD;
  int64_t batch = 1;     // thd: number of sequences (cu_seqlens size - 1)
  int64_t seqlen_q = 1;  // sbhd/bshd: padded lengths; thd: total tokens
  int64_t seqlen_kv = 1;
  int64_t num_heads_q = 1;
  int64_t num_heads_kv = 1;
  int64_t head_dim_qk = 64;
  int64_t head_dim_v = 64;
  int32_t mask_type = TEFL_ATTN_MASK_NO_MASK;
  int32_t window_left = -1;
  int32_t window_right = -1;
  int32_t softmax_type = TEFL_ATTN_SOFTMAX_VANILLA;
  float scale = 0.0f;  // 0: 1/sqrt(head_dim_qk)
  float dropout = 0.0f;
  bool is_training = false;
  // thd and padding masks: cumulative lengths [batch + 1]; empty: each
  // sequence is full length (thd: seqlen / batch each, which must divide).
  std::vector<int32_t> cu_seqlens_q, cu_seqlens_kv;
  bool backward = false;  // explain fused_attn_bwd instead of fused_attn_fwd

  tefl_attention_attrs Attrs() const;
};

struct AttentionBackend {
  bool available = false;              // some implementation serves the call
  std::string impl_id;                 // the one that would run first ("" if none)
  std::vector<std::string> fallbacks;  // the rest of the chain, in order
  std::string error;                   // why nothing serves (invalid parameters included)
  Resolution resolution;               // every candidate with its rejection reason
  std::string ToString() const;
};

// Which implementation would serve an attention call with `params`.
AttentionBackend GetAttentionBackend(const AttentionParams& params, OpManager& manager = GetDefaultManager());

// A compact host tensor owned by the API (allocated outputs), zero-filled.
// Movable, not copyable; dl() points into the object itself, so a move gives
// the new object a DLTensor of its own (at another address) and leaves the
// source empty (dl() NULL).
class HostTensor {
 public:
  HostTensor() = default;
  // Throws std::invalid_argument when the shape has a negative dimension or
  // its byte count does not fit in int64 (Create's INVALID_ARGUMENT, with the
  // same message), std::bad_alloc when the memory is not there. A shape with
  // a zero dimension is an empty tensor, whatever its other dimensions.
  HostTensor(DLDataType dtype, std::vector<int64_t> shape);
  // The same as a Status, as the rest of this API reports errors:
  // INVALID_ARGUMENT for such a shape, RUNTIME_ERROR when the memory is not
  // there (*out is then left as it was). FlashAttention and
  // FlashAttentionBackward allocate their outputs with it.
  static Status Create(DLDataType dtype, std::vector<int64_t> shape, HostTensor* out);
  HostTensor(const HostTensor&) = delete;
  HostTensor& operator=(const HostTensor&) = delete;
  HostTensor(HostTensor&& other) noexcept;
  HostTensor& operator=(HostTensor&& other) noexcept;
  DLTensor* dl() { return storage_.empty() && shape_.empty() ? nullptr : &dl_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  void* data() { return storage_.data(); }

 private:
  void Bind();
  std::vector<int64_t> shape_;
  std::vector<unsigned char> storage_;
  DLTensor dl_{};
};

// The tensors of one attention call (the optional ones NULL when absent).
struct AttentionInputs {
  const DLTensor* q = nullptr;
  const DLTensor* k = nullptr;
  const DLTensor* v = nullptr;
  const DLTensor* cu_seqlens_q = nullptr;
  const DLTensor* cu_seqlens_kv = nullptr;
  const DLTensor* softmax_offset = nullptr;  // learnable softmax alpha [h_q] f32
};

// The outputs structs own the outputs they allocate and are movable (a
// framework keeps one per layer in a container), not copyable. A move takes
// the storage along and re-points each output that pointed at the source's
// own storage at the new object's; a caller-provided output pointer is
// copied as it is. The moved-from struct is left without its allocated
// outputs (those pointers NULL), ready for another call.
struct FlashAttentionOutputs {
  // Caller-provided outputs, or NULL: then allocated (CPU only) into the
  // storage below and pointed at.
  DLTensor* o = nullptr;
  DLTensor* stats = nullptr;
  HostTensor o_storage, stats_storage;
  std::string impl_id;  // the implementation that ran

  FlashAttentionOutputs() = default;
  FlashAttentionOutputs(FlashAttentionOutputs&& other) noexcept;
  FlashAttentionOutputs& operator=(FlashAttentionOutputs&& other) noexcept;
  FlashAttentionOutputs(const FlashAttentionOutputs&) = delete;
  FlashAttentionOutputs& operator=(const FlashAttentionOutputs&) = delete;
  ~FlashAttentionOutputs() = default;
};

struct FlashAttentionGrads {
  DLTensor* dq = nullptr;  // NULL: allocated like q
  DLTensor* dk = nullptr;
  DLTensor* dv = nullptr;
  DLTensor* d_softmax_offset = nullptr;  // NULL: allocated only for the learnable softmax
  HostTensor dq_storage, dk_storage, dv_storage, d_softmax_offset_storage;
  std::string impl_id;

  FlashAttentionGrads() = default;
  FlashAttentionGrads(FlashAttentionGrads&& other) noexcept;  // as FlashAttentionOutputs
  FlashAttentionGrads& operator=(FlashAttentionGrads&& other) noexcept;
  FlashAttentionGrads(const FlashAttentionGrads&) = delete;
  FlashAttentionGrads& operator=(const FlashAttentionGrads&) = delete;
  ~FlashAttentionGrads() = default;
};

// o, stats = fused_attn_fwd(inputs; attrs).
Status FlashAttention(const AttentionInputs& in, const tefl_attention_attrs& attrs, FlashAttentionOutputs* out,
                      OpManager& manager = GetDefaultManager());
// dq, dk, dv (, d_softmax_offset) = fused_attn_bwd(inputs, o, d_o, stats; attrs).
Status FlashAttentionBackward(const AttentionInputs& in, const DLTensor* o, const DLTensor* d_o, const DLTensor* stats,
                              const tefl_attention_attrs& attrs, FlashAttentionGrads* grads,
                              OpManager& manager = GetDefaultManager());

}  // namespace tefl

#endif  // TEFL_ATTENTION_HPP_
