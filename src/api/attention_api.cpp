// The attention entry points of include/tefl/attention.hpp: GetAttentionBackend
// (OpManager::Explain over data-less descriptors) and FlashAttention /
// FlashAttentionBackward (one op call, outputs allocated when not given).
#include <fmt/format.h>

#include <climits>
#include <cstring>
#include <deque>
#include <new>
#include <stdexcept>
#include <string>
#include <tuple>
#include <utility>

#include "tefl/attention.hpp"

namespace tefl {
namespace {

constexpr DLDataType kF32{kDLFloat, 32, 1};
constexpr DLDataType kI32{kDLInt, 32, 1};

int64_t Bytes(DLDataType t, const std::vector<int64_t>& shape) {
  int64_t n = (t.bits * t.lanes + 7) / 8;
  for (int64_t d : shape) n *= d;
  return n;
}

// Descriptors without data for Explain: each tensor gets a distinct fake,
// page-aligned address range that is never dereferenced (validation only
// compares addresses); cu_seqlens get real host data (the shape check reads
// them).
class Descriptors {
 public:
  const DLTensor* Add(DLDataType dtype, DLDevice device, std::vector<int64_t> shape) {
    Slot& s = slots_.emplace_back();
    s.shape = std::move(shape);
    s.t.data = reinterpret_cast<void*>(cursor_);
    cursor_ += uintptr_t((Bytes(dtype, s.shape) + 4095) / 4096 * 4096 + 4096);
    s.t.device = device;
    s.t.ndim = int32_t(s.shape.size());
    s.t.dtype = dtype;
    return &s.t;
  }
  const DLTensor* AddI32(const std::vector<int32_t>& values) {
    Slot& s = slots_.emplace_back();
    s.shape = {int64_t(values.size())};
    s.i32 = values;
    s.t.data = s.i32.data();
    s.t.device = DLDevice{kDLCPU, 0};
    s.t.ndim = 1;
    s.t.dtype = kI32;
    return &s.t;
  }
  // Binds shape pointers once every slot is in place.
  void Finish() {
    for (Slot& s : slots_) s.t.shape = s.shape.data();
  }

 private:
  struct Slot {
    std::vector<int64_t> shape;
    std::vector<int32_t> i32;
    DLTensor t{};
  };
  std::deque<Slot> slots_;  // stable addresses
  uintptr_t cursor_ = uintptr_t(1) << 40;
};

std::vector<int64_t> Layout(int32_t format, int64_t b, int64_t s, int64_t h, int64_t d) {
  if (format == TEFL_QKV_THD) return {s, h, d};
  if (format == TEFL_QKV_SBHD) return {s, b, h, d};
  return {b, s, h, d};
}

// Full-length cumulative lengths when the caller gave none.
std::vector<int32_t> CuOrEven(const std::vector<int32_t>& given, int64_t b, int64_t per) {
  if (!given.empty()) return given;
  std::vector<int32_t> cu(size_t(b) + 1);
  for (int64_t i = 0; i <= b; ++i) cu[size_t(i)] = int32_t(i * per);
  return cu;
}

bool IsPaddingMask(int32_t m) {
  return m == TEFL_ATTN_MASK_PADDING || m == TEFL_ATTN_MASK_PADDING_CAUSAL ||
         m == TEFL_ATTN_MASK_PADDING_CAUSAL_BOTTOM_RIGHT;
}

// The shape of the layout `like` with head dim d (q -> o, etc.).
std::vector<int64_t> WithLastDim(const DLTensor* like, int64_t d) {
  std::vector<int64_t> s(like->shape, like->shape + like->ndim);
  if (!s.empty()) s.back() = d;
  return s;
}

// `slot` if given, else a host tensor allocated into `storage`.
Status Ensure(DLTensor** slot, HostTensor* storage, const DLTensor* like, DLDataType dtype, std::vector<int64_t> shape,
              const char* name) {
  if (*slot != nullptr) return Status::OK();
  int32_t device_type;
  std::memcpy(&device_type, &like->device.device_type, sizeof(device_type));
  if (device_type != kDLCPU) {
    return Status(TEFL_INVALID_ARGUMENT,
                  fmt::format("flash_attention: output '{}' must be provided for tensors off the CPU (outputs are "
                              "allocated in host memory only)",
                              name));
  }
  if (Status s = HostTensor::Create(dtype, std::move(shape), storage); !s.ok())
    return Status(s.code(), fmt::format("flash_attention: output '{}': {}", name, s.message()));
  *slot = storage->dl();
  return Status::OK();
}

}  // namespace

tefl_attention_attrs AttentionParams::Attrs() const {
  tefl_attention_attrs a{};
  a.struct_size = TEFL_ATTENTION_ATTRS_STRUCT_SIZE;
  a.qkv_format = qkv_format;
  a.mask_type = mask_type;
  a.window_left = window_left;
  a.window_right = window_right;
  a.softmax_type = softmax_type;
  a.scale = scale;
  a.dropout = dropout;
  a.is_training = is_training ? 1 : 0;
  return a;
}

std::string AttentionBackend::ToString() const {
  std::string s = available ? fmt::format("{} serves {}", impl_id, resolution.op_name)
                            : fmt::format("no implementation serves {}: {}", resolution.op_name, error);
  for (const CandidateReport& c : resolution.candidates) {
    if (c.accepted) continue;
    s += fmt::format("\n  rejected {}: {}", c.impl_id, c.reason);
  }
  return s;
}

AttentionBackend GetAttentionBackend(const AttentionParams& p, OpManager& manager) {
  AttentionBackend r;
  const bool thd = p.qkv_format == TEFL_QKV_THD;
  Descriptors d;
  const int64_t b = p.batch;
  const DLTensor* q = d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_q, p.num_heads_q, p.head_dim_qk));
  const DLTensor* k = d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_kv, p.num_heads_kv, p.head_dim_qk));
  const DLTensor* v = d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_kv, p.num_heads_kv, p.head_dim_v));
  const DLTensor* cu_q = nullptr;
  const DLTensor* cu_kv = nullptr;
  if (thd || IsPaddingMask(p.mask_type)) {
    const int64_t per_q = thd ? (b > 0 ? p.seqlen_q / b : 0) : p.seqlen_q;
    const int64_t per_kv = thd ? (b > 0 ? p.seqlen_kv / b : 0) : p.seqlen_kv;
    // Synthesized cumulative lengths are int32, as the op's: totals past
    // INT32_MAX would wrap into values the caller never passed.
    for (const auto& [given, per, side] :
         {std::tuple{&p.cu_seqlens_q, per_q, "q"}, std::tuple{&p.cu_seqlens_kv, per_kv, "kv"}}) {
      if (given->empty() && b > 0 && per > INT32_MAX / b) {
        r.resolution.op_name = p.backward ? "fused_attn_bwd" : "fused_attn_fwd";
        r.error = fmt::format(
            "{} sequences of {} {} tokens ({} in all) exceed what int32 cu_seqlens can hold (2147483647 tokens)", b,
            per, side, b * per);
        return r;
      }
    }
    cu_q = d.AddI32(CuOrEven(p.cu_seqlens_q, b, per_q));
    cu_kv = d.AddI32(CuOrEven(p.cu_seqlens_kv, b, per_kv));
  }
  const DLTensor* alpha =
      p.softmax_type == TEFL_ATTN_SOFTMAX_LEARNABLE ? d.Add(kF32, p.device, {p.num_heads_q}) : nullptr;
  const std::vector<int64_t> stats_shape =
      thd ? std::vector<int64_t>{p.num_heads_q, p.seqlen_q} : std::vector<int64_t>{b, p.num_heads_q, p.seqlen_q};
  const std::vector<int64_t> o_shape = Layout(p.qkv_format, b, p.seqlen_q, p.num_heads_q, p.head_dim_v);
  const tefl_attention_attrs attrs = p.Attrs();
  if (!p.backward) {
    DLTensor* o = const_cast<DLTensor*>(d.Add(p.dtype, p.device, o_shape));
    DLTensor* stats = const_cast<DLTensor*>(d.Add(kF32, p.device, stats_shape));
    d.Finish();
    const DLTensor* ins[] = {q, k, v, cu_q, cu_kv, alpha};
    DLTensor* outs[] = {o, stats};
    r.resolution = manager.Explain(TEFL_OP_FUSED_ATTN_FWD, ins, outs, &attrs);
  } else {
    const DLTensor* o = d.Add(p.dtype, p.device, o_shape);
    const DLTensor* d_o = d.Add(p.dtype, p.device, o_shape);
    const DLTensor* stats = d.Add(kF32, p.device, stats_shape);
    DLTensor* dq = const_cast<DLTensor*>(
        d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_q, p.num_heads_q, p.head_dim_qk)));
    DLTensor* dk = const_cast<DLTensor*>(
        d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_kv, p.num_heads_kv, p.head_dim_qk)));
    DLTensor* dv = const_cast<DLTensor*>(
        d.Add(p.dtype, p.device, Layout(p.qkv_format, b, p.seqlen_kv, p.num_heads_kv, p.head_dim_v)));
    DLTensor* dalpha = alpha ? const_cast<DLTensor*>(d.Add(kF32, p.device, {p.num_heads_q})) : nullptr;
    d.Finish();
    const DLTensor* ins[] = {q, k, v, o, d_o, stats, cu_q, cu_kv, alpha};
    DLTensor* outs[] = {dq, dk, dv, dalpha};
    r.resolution = manager.Explain(TEFL_OP_FUSED_ATTN_BWD, ins, outs, &attrs);
  }
  r.error = r.resolution.error;
  r.available = r.error.empty() && !r.resolution.chain.empty();
  if (r.available) {
    r.impl_id = r.resolution.chain.front();
    r.fallbacks.assign(r.resolution.chain.begin() + 1, r.resolution.chain.end());
  } else if (r.error.empty()) {
    r.error = "no implementation accepted the call";
  }
  return r;
}

// ---- HostTensor ----------------------------------------------------------------------------
namespace {
std::string ShapeText(const std::vector<int64_t>& shape) {
  std::string s;
  for (int64_t d : shape) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return "[" + s + "]";
}

// The bytes of a compact tensor of `shape` (whole bytes per element), or the
// reason there are none: a negative dimension, or a count beyond int64 (the
// + 1 byte HostTensor adds included).
std::string CheckedBytes(DLDataType t, const std::vector<int64_t>& shape, int64_t* bytes) {
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0)
      return fmt::format("HostTensor: dimension {} of shape {} is negative ({})", d, ShapeText(shape), shape[d]);
  }
  *bytes = 0;
  for (int64_t d : shape)
    if (d == 0) return "";  // no elements, whatever the other dimensions are
  const int64_t elem = (int64_t(t.bits) * t.lanes + 7) / 8;
  int64_t n = elem;
  bool overflow = false;
  for (int64_t d : shape) overflow |= __builtin_mul_overflow(n, d, &n);
  if (overflow || n == INT64_MAX) {
    return fmt::format("HostTensor: shape {} of {}-byte elements is too large (its byte count does not fit in int64)",
                       ShapeText(shape), elem);
  }
  *bytes = n;
  return "";
}
}  // namespace

HostTensor::HostTensor(DLDataType dtype, std::vector<int64_t> shape) {
  int64_t bytes = 0;
  if (std::string why = CheckedBytes(dtype, shape, &bytes); !why.empty()) throw std::invalid_argument(why);
  shape_ = std::move(shape);
  storage_.assign(size_t(bytes) + 1, 0);  // + 1: never empty (valid data pointer)
  dl_.dtype = dtype;
  Bind();
}

Status HostTensor::Create(DLDataType dtype, std::vector<int64_t> shape, HostTensor* out) {
  int64_t bytes = 0;
  if (std::string why = CheckedBytes(dtype, shape, &bytes); !why.empty())
    return Status(TEFL_INVALID_ARGUMENT, std::move(why));
  try {
    *out = HostTensor(dtype, std::move(shape));
  } catch (const std::bad_alloc&) {  // (bytes + 1 <= INT64_MAX: within what a vector can hold)
    return Status(TEFL_RUNTIME_ERROR, fmt::format("HostTensor: out of memory allocating {} bytes", bytes + 1));
  }
  return Status::OK();
}
HostTensor::HostTensor(HostTensor&& other) noexcept
    : shape_(std::move(other.shape_)), storage_(std::move(other.storage_)), dl_(other.dl_) {
  Bind();
  other.dl_ = DLTensor{};
}
HostTensor& HostTensor::operator=(HostTensor&& other) noexcept {
  if (this == &other) return *this;
  shape_ = std::move(other.shape_);
  storage_ = std::move(other.storage_);
  dl_ = other.dl_;
  Bind();
  other.dl_ = DLTensor{};
  return *this;
}
void HostTensor::Bind() {
  dl_.data = storage_.data();
  dl_.device = DLDevice{kDLCPU, 0};
  dl_.ndim = int32_t(shape_.size());
  dl_.shape = shape_.data();
  dl_.strides = nullptr;
  dl_.byte_offset = 0;
}

// ---- Outputs structs: moves re-point the outputs they allocated -------------------------------
namespace {
// Moves the storage `from` into `to` and the output pointer `from_ptr` into
// `to_ptr`: re-pointed at to's tensor when it pointed at from's own (an
// allocated output; the source's pointer is then cleared), copied as it is
// when the caller provided it.
void MoveOutput(DLTensor*& to_ptr, HostTensor& to, DLTensor*& from_ptr, HostTensor& from) noexcept {
  const bool owned = from_ptr != nullptr && from_ptr == from.dl();
  to = std::move(from);
  to_ptr = owned ? to.dl() : from_ptr;
  if (owned) from_ptr = nullptr;
}
}  // namespace

FlashAttentionOutputs::FlashAttentionOutputs(FlashAttentionOutputs&& other) noexcept { *this = std::move(other); }
FlashAttentionOutputs& FlashAttentionOutputs::operator=(FlashAttentionOutputs&& other) noexcept {
  if (this == &other) return *this;
  MoveOutput(o, o_storage, other.o, other.o_storage);
  MoveOutput(stats, stats_storage, other.stats, other.stats_storage);
  impl_id = std::move(other.impl_id);
  return *this;
}

FlashAttentionGrads::FlashAttentionGrads(FlashAttentionGrads&& other) noexcept { *this = std::move(other); }
FlashAttentionGrads& FlashAttentionGrads::operator=(FlashAttentionGrads&& other) noexcept {
  if (this == &other) return *this;
  MoveOutput(dq, dq_storage, other.dq, other.dq_storage);
  MoveOutput(dk, dk_storage, other.dk, other.dk_storage);
  MoveOutput(dv, dv_storage, other.dv, other.dv_storage);
  MoveOutput(d_softmax_offset, d_softmax_offset_storage, other.d_softmax_offset, other.d_softmax_offset_storage);
  impl_id = std::move(other.impl_id);
  return *this;
}

// ---- FlashAttention ---------------------------------------------------------------------------
Status FlashAttention(const AttentionInputs& in, const tefl_attention_attrs& attrs, FlashAttentionOutputs* out,
                      OpManager& manager) {
  if (in.q == nullptr || in.k == nullptr || in.v == nullptr || out == nullptr)
    return Status(TEFL_INVALID_ARGUMENT, "flash_attention: q, k, v and the outputs struct are required");
  const bool thd = attrs.qkv_format == TEFL_QKV_THD;
  if (Status s =
          Ensure(&out->o, &out->o_storage, in.q, in.q->dtype, WithLastDim(in.q, in.v->shape[in.v->ndim - 1]), "o");
      !s.ok())
    return s;
  std::vector<int64_t> stats_shape;
  const int64_t hq = in.q->shape[in.q->ndim - 2];
  if (thd) {
    stats_shape = {hq, in.q->shape[0]};
  } else if (in.q->ndim == 4) {
    const bool sbhd = attrs.qkv_format == TEFL_QKV_SBHD;
    stats_shape = {in.q->shape[sbhd ? 1 : 0], hq, in.q->shape[sbhd ? 0 : 1]};
  }
  if (Status s = Ensure(&out->stats, &out->stats_storage, in.q, kF32, stats_shape, "stats"); !s.ok()) return s;
  const DLTensor* ins[] = {in.q, in.k, in.v, in.cu_seqlens_q, in.cu_seqlens_kv, in.softmax_offset};
  DLTensor* outs[] = {out->o, out->stats};
  Status s = manager.Call(TEFL_OP_FUSED_ATTN_FWD, ins, outs, &attrs);
  if (s.ok()) out->impl_id = manager.GetSelectedImplId("fused_attn_fwd");
  return s;
}

Status FlashAttentionBackward(const AttentionInputs& in, const DLTensor* o, const DLTensor* d_o, const DLTensor* stats,
                              const tefl_attention_attrs& attrs, FlashAttentionGrads* g, OpManager& manager) {
  if (in.q == nullptr || in.k == nullptr || in.v == nullptr || o == nullptr || d_o == nullptr || stats == nullptr ||
      g == nullptr)
    return Status(TEFL_INVALID_ARGUMENT,
                  "flash_attention backward: q, k, v, o, d_o, stats and the grads struct are required");
  auto like = [](const DLTensor* t) { return std::vector<int64_t>(t->shape, t->shape + t->ndim); };
  if (Status s = Ensure(&g->dq, &g->dq_storage, in.q, in.q->dtype, like(in.q), "dq"); !s.ok()) return s;
  if (Status s = Ensure(&g->dk, &g->dk_storage, in.k, in.k->dtype, like(in.k), "dk"); !s.ok()) return s;
  if (Status s = Ensure(&g->dv, &g->dv_storage, in.v, in.v->dtype, like(in.v), "dv"); !s.ok()) return s;
  if (attrs.softmax_type == TEFL_ATTN_SOFTMAX_LEARNABLE && in.softmax_offset != nullptr) {
    if (Status s = Ensure(&g->d_softmax_offset, &g->d_softmax_offset_storage, in.q, kF32, like(in.softmax_offset),
                          "d_softmax_offset");
        !s.ok())
      return s;
  }
  const DLTensor* ins[] = {in.q, in.k, in.v, o, d_o, stats, in.cu_seqlens_q, in.cu_seqlens_kv, in.softmax_offset};
  DLTensor* outs[] = {g->dq, g->dk, g->dv, g->d_softmax_offset};
  Status s = manager.Call(TEFL_OP_FUSED_ATTN_BWD, ins, outs, &attrs);
  if (s.ok()) g->impl_id = manager.GetSelectedImplId("fused_attn_bwd");
  return s;
}

}  // namespace tefl
