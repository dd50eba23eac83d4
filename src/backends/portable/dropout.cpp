// default.portable dropout kernels: dropout_fwd / dropout_bwd (keep rule in
// include/tefl/ops.h and backends/philox.h; semantics as the reference).
//
// Google Highway with runtime ISA dispatch (foreach_target.h); element
// ranges (whole Philox groups of 4 elements) are spread over the host thread
// pool, so the mask is the same for any thread count.
//
// dropout_fwd, per block of kBlock elements:
//  1. the keep mask, vectorised Philox-4x32-10: each u64 lane runs one
//     counter (one group of 4 elements) in its low half, so one MulEven is
//     a lane's full 32x32 -> 64 product (hi = product >> 32, lo = the low
//     half as is); 2 x Lanes(u64) groups per step, their words gathered into
//     u32 lanes (ConcatEven), compared, and the four keep bits of a group
//     packed into one u32 (little-endian: byte k is element 4g + k) stored
//     straight into the mask tensor;
//  2. output = x * (mask ? 1 / (1 - p) : 0) in fp32, reading the mask back
//     from L1 (x * 0 keeps IEEE: a dropped NaN or inf gives NaN).
// dropout_bwd is step 2 alone with the given mask (nonzero = kept).
// A vector whose groups would carry into the counter's high word (g crossing
// a multiple of 2^32) and the last partial group use the scalar Philox.
//
// Host contract (validated before the call): CPU tensors, compact, float
// dtypes for the data (each on its own), uint8 masks, same shapes, no
// aliasing, p in [0, 1).
#include <hwy/cache_control.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <type_traits>

#include "backends/backends.h"
#include "backends/kernel_support.h"
#include "backends/philox.h"
#include "core/dtype.h"
#include "tefl/ops.h"
#include "tefl/tefl.h"

#ifndef TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_
#define TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_
namespace tefl::backends {
namespace {

struct DropArgs {
  bool generate;  // dropout_fwd: write the mask first
  DType tx, ty;
  int64_t n;
  uint64_t seed, offset;
  uint32_t threshold;
  float scale;  // 1 / (1 - p)
  const void* x;
  void* y;
  uint8_t* mask;  // written (fwd) or read (bwd)
};

// Elements per block: the mask block and its x / y rows stay in L1.
constexpr int64_t kBlock = 4096;

}  // namespace
}  // namespace tefl::backends
#endif  // TEFL_BACKENDS_PORTABLE_DROPOUT_SHARED_

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "backends/portable/dropout.cpp"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "backends/portable/simd_io-inl.h"

HWY_BEFORE_NAMESPACE();
namespace tefl::backends::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// Scalar: mask bytes of elements [4g, min(4g + 4, n)).
HWY_INLINE void MaskGroupScalar(const DropArgs& a, uint64_t g, uint8_t* out, int64_t count) {
  const Philox4 w = DropoutWords(a.seed, a.offset, g);
  for (int64_t k = 0; k < count; ++k) out[k] = w.v[k] >= a.threshold ? 1 : 0;
}

#if HWY_TARGET != HWY_SCALAR
// The broadcast round keys and constants of one call (hoisted out of the
// per-vector loop). Counters live in u64 lanes, one per lane in the low half:
// MulEven reads only those halves, so the high halves may hold garbage.
struct PhiloxConsts {
  hn::Vec<hn::ScalableTag<uint64_t>> k0[10], k1[10], m0, m1, c2, c3;
  hn::Vec<hn::ScalableTag<uint32_t>> thr, bias, one;
};

HWY_INLINE void InitConsts(const DropArgs& a, PhiloxConsts& c) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::ScalableTag<uint32_t> du;
  uint32_t k0 = uint32_t(a.seed), k1 = uint32_t(a.seed >> 32);
  for (int r = 0; r < 10; ++r) {
    c.k0[r] = hn::Set(d64, k0);
    c.k1[r] = hn::Set(d64, k1);
    k0 += kPhiloxW0;
    k1 += kPhiloxW1;
  }
  c.m0 = hn::Set(d64, kPhiloxM0);
  c.m1 = hn::Set(d64, kPhiloxM1);
  c.c2 = hn::Set(d64, uint32_t(a.offset));
  c.c3 = hn::Set(d64, uint32_t(a.offset >> 32));
  // kept = word >= threshold, as a signed compare of both biased by 2^31.
  c.bias = hn::Set(du, 0x80000000u);
  c.thr = hn::Xor(hn::Set(du, a.threshold), c.bias);
  c.one = hn::Set(du, 1u);
}

// Ten rounds on Lanes(u64) counters (c0 = lo32(g), c1 = hi32(g) per lane);
// the low halves of w[0..3] are the four words.
HWY_INLINE void PhiloxRounds(const PhiloxConsts& k, hn::Vec<hn::ScalableTag<uint64_t>> c0,
                             hn::Vec<hn::ScalableTag<uint64_t>> c1, hn::Vec<hn::ScalableTag<uint64_t>>* w) {
  const hn::ScalableTag<uint32_t> du;
  auto c2 = k.c2, c3 = k.c3;
  for (int r = 0; r < 10; ++r) {
    const auto p0 = hn::MulEven(hn::BitCast(du, c0), hn::BitCast(du, k.m0));
    const auto p1 = hn::MulEven(hn::BitCast(du, c2), hn::BitCast(du, k.m1));
    c0 = hn::Xor3(hn::ShiftRight<32>(p1), c1, k.k0[r]);
    c1 = p1;
    c2 = hn::Xor3(hn::ShiftRight<32>(p0), c3, k.k1[r]);
    c3 = p0;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
}

// Mask bytes of groups [g, g + Lanes(u32)) (4 bytes each) into out: two u64
// vectors of counters, their words gathered into u32 vectors.
HWY_INLINE void MaskGroupsVector(const PhiloxConsts& k, uint64_t g, uint8_t* out) {
  const hn::ScalableTag<uint64_t> d64;
  const hn::ScalableTag<uint32_t> du;
  const hn::RebindToSigned<decltype(du)> di;
  const size_t n64 = hn::Lanes(d64);
  const auto hi = hn::Set(d64, g >> 32);
  const auto lo = hn::Add(hn::Set(d64, uint32_t(g)), hn::Iota(d64, 0));  // no carry (checked by the caller)
  hn::Vec<decltype(d64)> wa[4], wb[4];
  PhiloxRounds(k, lo, hi, wa);
  PhiloxRounds(k, hn::Add(lo, hn::Set(d64, n64)), hi, wb);
  const auto thr = hn::BitCast(di, k.thr);
  const auto kept = [&](int i) HWY_ATTR {
    const auto w = hn::ConcatEven(du, hn::BitCast(du, wb[i]), hn::BitCast(du, wa[i]));
    return hn::IfThenZeroElse(hn::RebindMask(du, hn::Lt(hn::BitCast(di, hn::Xor(w, k.bias)), thr)), k.one);
  };
  const auto packed = hn::Or(hn::Or(kept(0), hn::ShiftLeft<8>(kept(1))),
                             hn::Or(hn::ShiftLeft<16>(kept(2)), hn::ShiftLeft<24>(kept(3))));
  hn::StoreU(packed, du, reinterpret_cast<uint32_t*>(out));
}
#endif

// Mask bytes of elements [e0, e1); e0 is a multiple of 4.
HWY_INLINE void MaskRange(const DropArgs& a, int64_t e0, int64_t e1) {
  uint64_t g = uint64_t(e0) / 4;
  const uint64_t full_end = uint64_t(e1) / 4;  // groups wholly inside
#if HWY_TARGET != HWY_SCALAR
  const hn::ScalableTag<uint32_t> du;
  const size_t lanes = hn::Lanes(du);
  if (g + lanes <= full_end) {
    PhiloxConsts k;
    InitConsts(a, k);
    while (g + lanes <= full_end) {
      if (uint32_t(g) > UINT32_MAX - uint32_t(lanes - 1)) break;  // lo32 would wrap: scalar
      MaskGroupsVector(k, g, a.mask + g * 4);
      g += lanes;
    }
  }
#endif
  for (; g < full_end; ++g) MaskGroupScalar(a, g, a.mask + g * 4, 4);
  if (int64_t(g * 4) < e1) MaskGroupScalar(a, g, a.mask + g * 4, e1 - int64_t(g * 4));
}

// y = x * (mask ? scale : 0) on [e0, e1).
template <class TX, class TY>
HWY_INLINE void ApplyT(const DropArgs& a, int64_t e0, int64_t e1) {
  const hn::ScalableTag<float> df;
  const hn::Rebind<uint8_t, decltype(df)> d8;
  const hn::Rebind<uint32_t, decltype(df)> du;
  const size_t nf = hn::Lanes(df);
  const TX* HWY_RESTRICT x = static_cast<const TX*>(a.x);
  TY* HWY_RESTRICT y = static_cast<TY*>(a.y);
  const uint8_t* HWY_RESTRICT m = a.mask;
  const auto vscale = hn::Set(df, a.scale);
  const auto mult = [&](size_t i) HWY_ATTR {
    return hn::IfThenElseZero(hn::RebindMask(df, hn::Ne(hn::PromoteTo(du, hn::LoadU(d8, m + i)), hn::Zero(du))),
                              vscale);
  };
  size_t i = size_t(e0);
  const size_t end = size_t(e1);
#if HWY_TARGET != HWY_SCALAR
  if constexpr (std::is_same_v<TY, bfloat16_t>) {
    const hn::Repartition<uint16_t, decltype(df)> du16;
    uint16_t* HWY_RESTRICT yu = reinterpret_cast<uint16_t*>(y);
    for (; i + 2 * nf <= end; i += 2 * nf) {
      const auto v0 = hn::Mul(LoadF(df, x + i), mult(i));
      const auto v1 = hn::Mul(LoadF(df, x + i + nf), mult(i + nf));
      StoreF(RoundToBF16Bits2(v0, v1, df), du16, yu + i);
    }
  }
#endif
  for (; i + nf <= end; i += nf) StoreF(hn::Mul(LoadF(df, x + i), mult(i)), df, y + i);
  for (; i < end; ++i) ScalarStore(ScalarLoad(x + i) * (m[i] != 0 ? a.scale : 0.0f), y + i);
}

template <class TX>
HWY_INLINE void ApplyX(const DropArgs& a, int64_t e0, int64_t e1) {
  switch (a.ty) {
    case DType::kF32:
      return ApplyT<TX, float>(a, e0, e1);
    case DType::kBF16:
      return ApplyT<TX, bfloat16_t>(a, e0, e1);
    default:
      return ApplyT<TX, float16_t>(a, e0, e1);
  }
}

HWY_INLINE void Apply(const DropArgs& a, int64_t e0, int64_t e1) {
  switch (a.tx) {
    case DType::kF32:
      return ApplyX<float>(a, e0, e1);
    case DType::kBF16:
      return ApplyX<bfloat16_t>(a, e0, e1);
    default:
      return ApplyX<float16_t>(a, e0, e1);
  }
}

// Exported: elements [e0, e1), e0 a multiple of 4.
void DropoutRange(const DropArgs& a, int64_t e0, int64_t e1) {
  for (int64_t b = e0; b < e1; b += kBlock) {
    const int64_t be = std::min(e1, b + kBlock);
    if (a.generate) MaskRange(a, b, be);
    Apply(a, b, be);
  }
}

}  // namespace tefl::backends::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace tefl::backends {

HWY_EXPORT(DropoutRange);

namespace {

tefl_status* Status(const tefl_call_frame* f, int32_t code, const char* what) noexcept {
  return KernelStatus(f, "default.portable", "dropout", code, what);
}

void Body(void* ctx, int64_t begin, int64_t end) {
  const DropArgs& a = *static_cast<const DropArgs*>(ctx);
  // Work items are groups of 4 elements.
  HWY_DYNAMIC_DISPATCH(DropoutRange)(a, begin * 4, std::min(a.n, end * 4));
}

tefl_status* Run(const tefl_call_frame* f, bool fwd) {
  try {
    const auto& attrs = *static_cast<const tefl_dropout_attrs*>(f->attrs);
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    const DLTensor* m = fwd ? f->outputs[1] : f->inputs[1];
    DropArgs a{};
    a.generate = fwd;
    a.tx = DTypeOf(x->dtype);
    a.ty = DTypeOf(y->dtype);
    if (!IsFloatType(a.tx) || !IsFloatType(a.ty) || DTypeOf(m->dtype) != DType::kU8)
      return Status(f, TEFL_UNSUPPORTED, "dtypes other than fp32/fp16/bf16 data and a uint8 mask");
    if (!(attrs.p >= 0.0f && attrs.p < 1.0f)) return Status(f, TEFL_INVALID_ARGUMENT, "p must be in [0, 1)");
    a.n = NumElements(x);
    if (a.n == 0) return nullptr;
    a.seed = attrs.seed;
    a.offset = attrs.offset;
    a.threshold = DropoutThreshold(attrs.p);
    a.scale = float(1.0 / (1.0 - double(attrs.p)));
    a.x = DataPtr(x);
    a.y = DataPtr(y);
    a.mask = static_cast<uint8_t*>(DataPtr(m));
    const int64_t groups = (a.n + 3) / 4;
    f->host->parallel_for(groups, kBlock / 4, Body, &a);
    return nullptr;
  } catch (const std::exception& e) {
    return Status(f, TEFL_INTERNAL, e.what());
  } catch (...) {
    return Status(f, TEFL_INTERNAL, "unknown exception");
  }
}

tefl_status* FwdKernel(const tefl_call_frame* f, void*) { return Run(f, true); }
tefl_status* BwdKernel(const tefl_call_frame* f, void*) { return Run(f, false); }

}  // namespace

tefl_status* RegisterPortableDropout(const tefl_registrar& registrar) {
  static constexpr KernelEntry kEntries[] = {{"dropout_fwd", FwdKernel}, {"dropout_bwd", BwdKernel}};
  return RegisterCpuKernels(registrar, "default.portable", TEFL_KIND_DEFAULT, kEntries);
}

}  // namespace tefl::backends
#endif  // HWY_ONCE
