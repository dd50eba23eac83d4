// reference.cpp — RoPE: fused_rope_forward/backward and
// fused_qkv_rope_forward/backward.
//
// The oracle: plain scalar loops over (token, head, channel) following every
// tensor's strides, cos/sin in double of the fp32 angle, each output rounded
// once to its dtype. Semantics (TransformerEngine's fused_rope.cu):
//   forward   out[i] = x[i] cos f[i] + rot[i] sin f[i]  (i < d2), x[i] copied (i >= d2)
//             rotate-half: rot[i] = -x[i + d2/2] (i < d2/2), x[i - d2/2] (else)
//             interleaved: rot[i] = -x[i + 1] (i even), x[i - 1] (i odd)
//   backward  the transpose: dx[i] = dy[i] cos f[i] + dy[j] sin f[j] * sign,
//             j the partner of i, sign + for i < d2/2 (even i), - otherwise.
// Positions: local token t of a sequence of local length L, plus
// start_positions[b]; with cp_size > 1 the two halves of L sit at chunks
// cp_rank and 2 cp_size - 1 - cp_rank of the global sequence.
// Validation (catalogue_rope.cpp) has checked shapes, cu_seqlens and that
// every position is a row of freqs.
#include <cmath>
#include <cstdint>

#include "backends/backends.h"
#include "core/dtype.h"
#include "tefl/ops.h"

namespace tefl::backends {
namespace {

// Element stride of dim `d` (compact row-major when strides is NULL).
int64_t StrideOf(const DLTensor* t, int d) {
  if (t->strides) return t->strides[d];
  int64_t s = 1;
  for (int k = d + 1; k < t->ndim; ++k) s *= t->shape[k];
  return s;
}

// A float tensor addressed by element offsets.
struct Elems {
  void* data;
  DType dtype;
  double at(int64_t off) const { return LoadAsFloat(data, off, dtype); }
  void set(int64_t off, double v) const { StoreFromDouble(data, off, dtype, v); }
};
Elems ElemsOf(const DLTensor* t) { return Elems{DataPtr(t), DTypeOf(t->dtype)}; }

int64_t IntAt(const DLTensor* t, int64_t i) {
  return static_cast<const int32_t*>(DataPtr(t))[i * (t->strides ? t->strides[0] : 1)];
}

// The frequency row of local token t (sequence of local length len).
int64_t Position(int64_t t, int64_t len, int64_t start, int32_t cp_size, int32_t cp_rank) {
  if (cp_size == 1) return start + t;
  const int64_t half = len / 2;
  if (t < half) return start + int64_t(cp_rank) * half + t;
  return start + (2 * int64_t(cp_size) - cp_rank - 1) * half + (t - half);
}

// The angles of one position: f(i) = freqs[pos, 0, 0, i].
struct FreqRow {
  const float* base;
  int64_t stride;  // along d2
  double operator()(int64_t i) const { return double(base[i * stride]); }
};
FreqRow RowOf(const DLTensor* freqs, int64_t pos) {
  const float* p = static_cast<const float*>(DataPtr(freqs)) + pos * StrideOf(freqs, 0);
  return FreqRow{p, StrideOf(freqs, 3)};
}

// One head vector of d channels: in at in_off (step in_sd), out at out_off.
// d2 == 0 (or no freqs) copies.
void RotateHead(const Elems& in, int64_t in_off, int64_t in_sd, const Elems& out, int64_t out_off, int64_t out_sd,
                const FreqRow* f, int64_t d, int64_t d2, bool interleaved, bool backward) {
  auto x = [&](int64_t i) { return in.at(in_off + i * in_sd); };
  const int64_t half = d2 / 2;
  for (int64_t i = 0; i < d2; ++i) {
    const double fi = (*f)(i);
    double v;
    if (!backward) {
      double rot;
      if (interleaved) {
        rot = i % 2 == 0 ? -x(i + 1) : x(i - 1);
      } else {
        rot = i < half ? -x(i + half) : x(i - half);
      }
      v = x(i) * std::cos(fi) + rot * std::sin(fi);
    } else {
      // Transpose: row i of the forward matrix touches x[i] (cos f[i]) and
      // x[partner] (sign * sin f[i]); column i collects both.
      if (interleaved) {
        v = i % 2 == 0 ? x(i) * std::cos(fi) + x(i + 1) * std::sin((*f)(i + 1))
                       : x(i) * std::cos(fi) - x(i - 1) * std::sin((*f)(i - 1));
      } else {
        v = i < half ? x(i) * std::cos(fi) + x(i + half) * std::sin((*f)(i + half))
                     : x(i) * std::cos(fi) - x(i - half) * std::sin((*f)(i - half));
      }
    }
    out.set(out_off + i * out_sd, v);
  }
  for (int64_t i = d2; i < d; ++i) out.set(out_off + i * out_sd, x(i));
}

// ---- fused_rope_forward / backward ----------------------------------------------------
// in (x, freqs, start_positions?, cu_seqlens?) -> out (y)
tefl_status* Rope(const tefl_call_frame* f, bool backward) {
  const auto* attrs = static_cast<const tefl_rope_attrs*>(f->attrs);
  const DLTensor* x = f->inputs[0];
  const DLTensor* freqs = f->inputs[1];
  const DLTensor* start = f->inputs[2];
  const DLTensor* cu = f->inputs[3];
  const DLTensor* y = f->outputs[0];
  if (NumElements(y) == 0) return nullptr;  // d = 0 or no token: nothing to write (and [2^60, 1, 2, 0] has no rows)
  const Elems in = ElemsOf(x), out = ElemsOf(y);
  const bool interleaved = attrs->interleaved != 0;
  const int64_t d2 = freqs->shape[3];
  const int32_t cp = attrs->cp_size, rank = attrs->cp_rank;

  if (attrs->qkv_format == TEFL_QKV_THD) {  // [t, h, d]
    const int64_t h = x->shape[1], d = x->shape[2];
    const int64_t batches = cu->shape[0] - 1;
    for (int64_t b = 0; b < batches; ++b) {
      const int64_t first = IntAt(cu, b) / cp, end = IntAt(cu, b + 1) / cp;
      const int64_t len = end - first;
      for (int64_t t = 0; t < len; ++t) {
        const int64_t token = first + t;
        const FreqRow fr = RowOf(freqs, Position(t, len, start ? IntAt(start, b) : 0, cp, rank));
        for (int64_t hh = 0; hh < h; ++hh) {
          RotateHead(in, token * StrideOf(x, 0) + hh * StrideOf(x, 1), StrideOf(x, 2), out,
                     token * StrideOf(y, 0) + hh * StrideOf(y, 1), StrideOf(y, 2), &fr, d, d2, interleaved, backward);
        }
      }
    }
    return nullptr;
  }
  // sbhd [s, b, h, d] or bshd [b, s, h, d].
  const int sdim = attrs->qkv_format == TEFL_QKV_SBHD ? 0 : 1, bdim = 1 - sdim;
  const int64_t s = x->shape[sdim], batches = x->shape[bdim], h = x->shape[2], d = x->shape[3];
  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      const FreqRow fr = RowOf(freqs, Position(t, s, start ? IntAt(start, b) : 0, cp, rank));
      for (int64_t hh = 0; hh < h; ++hh) {
        const int64_t in_off = t * StrideOf(x, sdim) + b * StrideOf(x, bdim) + hh * StrideOf(x, 2);
        const int64_t out_off = t * StrideOf(y, sdim) + b * StrideOf(y, bdim) + hh * StrideOf(y, 2);
        RotateHead(in, in_off, StrideOf(x, 3), out, out_off, StrideOf(y, 3), &fr, d, d2, interleaved, backward);
      }
    }
  }
  return nullptr;
}

// ---- fused_qkv_rope_forward / backward ------------------------------------------------
// Head group g of qkv holds q_split/d q heads, k_split/d k heads, v_split/d v
// heads (channels [0, q_split), [q_split, q_split + k_split), ...); q head
// (g, j) is head g * (q_split/d) + j of q. v is copied (no freqs).
// Forward: qkv -> q, k, v. Backward: q, k, v grads -> qkv grads.
tefl_status* QkvRope(const tefl_call_frame* f, bool backward) {
  const auto* attrs = static_cast<const tefl_qkv_rope_attrs*>(f->attrs);
  const DLTensor* packed = backward ? f->outputs[0] : f->inputs[0];
  const DLTensor* parts[3] = {backward ? f->inputs[0] : f->outputs[0], backward ? f->inputs[1] : f->outputs[1],
                              backward ? f->inputs[2] : f->outputs[2]};
  const DLTensor* freqs[3] = {f->inputs[backward ? 3 : 1], f->inputs[backward ? 4 : 2], nullptr};
  const DLTensor* start = f->inputs[backward ? 5 : 3];
  const int64_t splits[3] = {attrs->q_split, attrs->k_split, attrs->v_split};
  const bool interleaved = attrs->interleaved != 0;
  const int32_t cp = attrs->cp_size, rank = attrs->cp_rank;
  const int sdim = attrs->qkv_format == TEFL_QKV_SBHD ? 0 : 1, bdim = 1 - sdim;
  const int64_t s = packed->shape[sdim], batches = packed->shape[bdim], h = packed->shape[2];
  const int64_t d = parts[0]->shape[3];
  const int64_t d2 = freqs[0]->shape[3];
  const Elems pk = ElemsOf(packed);

  for (int64_t b = 0; b < batches; ++b) {
    for (int64_t t = 0; t < s; ++t) {
      const int64_t pos = Position(t, s, start ? IntAt(start, b) : 0, cp, rank);
      int64_t channel0 = 0;  // first channel of this part in a head group
      for (int p = 0; p < 3; ++p) {
        const DLTensor* part = parts[p];
        const Elems pe = ElemsOf(part);
        const int64_t heads = splits[p] / d;
        FreqRow fr{};
        if (freqs[p]) fr = RowOf(freqs[p], pos);
        for (int64_t g = 0; g < h; ++g) {
          for (int64_t j = 0; j < heads; ++j) {
            const int64_t pk_off = t * StrideOf(packed, sdim) + b * StrideOf(packed, bdim) + g * StrideOf(packed, 2) +
                                   (channel0 + j * d) * StrideOf(packed, 3);
            const int64_t part_off =
                t * StrideOf(part, sdim) + b * StrideOf(part, bdim) + (g * heads + j) * StrideOf(part, 2);
            const int64_t rot = freqs[p] ? d2 : 0;
            if (backward) {
              RotateHead(pe, part_off, StrideOf(part, 3), pk, pk_off, StrideOf(packed, 3), &fr, d, rot, interleaved,
                         true);
            } else {
              RotateHead(pk, pk_off, StrideOf(packed, 3), pe, part_off, StrideOf(part, 3), &fr, d, rot, interleaved,
                         false);
            }
          }
        }
        channel0 += splits[p];
      }
    }
  }
  return nullptr;
}

tefl_status* RopeFwd(const tefl_call_frame* f, void*) { return Rope(f, false); }
tefl_status* RopeBwd(const tefl_call_frame* f, void*) { return Rope(f, true); }
tefl_status* QkvRopeFwd(const tefl_call_frame* f, void*) { return QkvRope(f, false); }
tefl_status* QkvRopeBwd(const tefl_call_frame* f, void*) { return QkvRope(f, true); }

}  // namespace

tefl_status* RegisterReferenceRope(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {
      {"fused_rope_forward", RopeFwd},
      {"fused_rope_backward", RopeBwd},
      {"fused_qkv_rope_forward", QkvRopeFwd},
      {"fused_qkv_rope_backward", QkvRopeBwd},
  };
  return RegisterCpuKernels(registrar, "reference.cpp", TEFL_KIND_REFERENCE, kEntries);
}

}  // namespace tefl::backends
