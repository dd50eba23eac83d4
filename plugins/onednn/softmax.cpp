// onednn plugin — softmax: scaled_softmax_forward / scaled_softmax_backward
// through oneDNN 2.6's softmax_v2 (accurate algorithm) over the last dim of a
// [rows, sk] view.
//   forward   scale == 1: softmax_v2 from input to softmax_results (dtypes may
//             differ). scale != 1: a reorder with output scale `scale` writes
//             scale * input into a float32 softmax_results, then softmax_v2
//             runs in place on it. oneDNN 2.6 softmax has no input scale, so
//             scale != 1 with a bfloat16 softmax_results is declined (the
//             scores would be rounded to bfloat16 before the exponential).
//   backward  softmax_v2_backward gives y * (dy - sum(dy * y)); for scale != 1
//             an eltwise_linear multiplies input_grads by scale in place.
// Declined (supports()): float16 tensors, strided tensors; the masked and
// causal variants are not offered. Declined from the kernel: a forward input
// holding a NaN or an infinity (oneDNN zeroes such rows).
#include <limits>

#include "common.h"

namespace onednn_plugin {
namespace {

float ScaleOf(const tefl_call_frame* f) {
  const auto* a = static_cast<const tefl_softmax_attrs*>(f->attrs);
  if (a == nullptr || a->struct_size < TEFL_STRUCT_SIZE(tefl_softmax_attrs, scale)) return 1.0f;
  return a->scale;
}

dnnl::softmax_v2_forward::primitive_desc FwdPd(const dnnl::engine& eng, DT src, DT dst, int64_t n, int64_t h) {
  const dnnl::softmax_v2_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm::softmax_accurate,
                                         DataDesc(src, n, h), DataDesc(dst, n, h), 1);
  return dnnl::softmax_v2_forward::primitive_desc(d, eng);
}

dnnl::primitive MakeFwd(const dnnl::engine& eng, const PrimKey& k) {
  return dnnl::softmax_v2_forward(FwdPd(eng, k.dt_a, k.dt_b, k.n, k.h));
}

// dt_a: the gradients' dtype (dy and dx), dt_b: y's.
dnnl::primitive MakeBwd(const dnnl::engine& eng, const PrimKey& k) {
  const dnnl::softmax_v2_backward::desc d(dnnl::algorithm::softmax_accurate, DataDesc(k.dt_a, k.n, k.h),
                                          DataDesc(k.dt_a, k.n, k.h), DataDesc(k.dt_b, k.n, k.h), 1);
  return dnnl::softmax_v2_backward(
      dnnl::softmax_v2_backward::primitive_desc(d, eng, FwdPd(eng, k.dt_b, k.dt_b, k.n, k.h)));
}

// x (dt_a) -> y (f32) with y = scale * x.
dnnl::primitive MakeScaledReorder(const dnnl::engine& eng, const PrimKey& k) {
  dnnl::primitive_attr attr;
  attr.set_output_scales(0, {FloatOfBits(k.param)});
  return dnnl::reorder(
      dnnl::reorder::primitive_desc(eng, DataDesc(k.dt_a, k.n, k.h), eng, DataDesc(DT::kF32, k.n, k.h), attr));
}

// In place: v = scale * v.
dnnl::primitive MakeLinear(const dnnl::engine& eng, const PrimKey& k) {
  const dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_linear,
                                      VecDesc(k.h, k.dt_a), FloatOfBits(k.param), 0.0f);
  return dnnl::eltwise_forward(dnnl::eltwise_forward::primitive_desc(d, eng));
}

int32_t FloatNot16(const DLTensor* t, const char* name, char* why, size_t len) {
  const DT d = DtOf(t);
  if (d == DT::kF32 || d == DT::kBF16) return 1;
  Why(why, len,
      std::string("onednn (oneDNN 2.6 softmax on the CPU) handles float32 and bfloat16 only, got ") +
          DtypeName(t->dtype) + " " + name);
  return 0;
}

int32_t FwdSupports(const tefl_call_frame* f, void*, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"input"};
    static const char* const kOut[] = {"softmax_results"};
    return SupportsPresentCompact(f, kIn, 1, kOut, 1, why, len) && FloatNot16(f->inputs[0], kIn[0], why, len) &&
           FloatNot16(f->outputs[0], kOut[0], why, len);
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

int32_t BwdSupports(const tefl_call_frame* f, void*, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"output_grads", "softmax_results"};
    static const char* const kOut[] = {"input_grads"};
    if (!SupportsPresentCompact(f, kIn, 2, kOut, 1, why, len)) return 0;
    if (!FloatNot16(f->inputs[0], kIn[0], why, len) || !FloatNot16(f->inputs[1], kIn[1], why, len) ||
        !FloatNot16(f->outputs[0], kOut[0], why, len))
      return 0;
    if (DtOf(f->inputs[0]) != DtOf(f->outputs[0])) {
      Why(why, len,
          "onednn needs output_grads and input_grads of one dtype (oneDNN 2.6 softmax backward), got " +
              DtypeName(f->inputs[0]->dtype) + " and " + DtypeName(f->outputs[0]->dtype));
      return 0;
    }
    return 1;
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

tefl_status* FwdKernel(const tefl_call_frame* f, void*) noexcept {
  return Guarded(f, "scaled_softmax_forward", [&]() -> tefl_status* {
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    const Dims d = RowsCols(x);
    if (d.n == 0 || d.h == 0) return nullptr;
    const float scale = ScaleOf(f);
    const DT tx = DtOf(x), ty = DtOf(y);
    // oneDNN's softmax turns a row holding a NaN or +inf into zeros; IEEE
    // (and reference.cpp) make it NaN. One parallel scan declines such input.
    if (!AllWithin(f->host, DataOf(x), tx, d.n * d.h, std::numeric_limits<float>::max()))
      throw Unsupported{"the input holds a NaN or an infinity, which oneDNN's softmax does not propagate"};
    if (scale != 1.0f && ty != DT::kF32)
      throw Unsupported{
          "scale != 1 needs a float32 softmax_results: oneDNN 2.6 softmax has no input scale, and "
          "pre-scaling into a " +
          DtypeName(y->dtype) + " tensor would round the scores"};
    const dnnl::engine& eng = GetState().engine;
    dnnl::stream& s = ThreadStream();
    dnnl::memory dst(DataDesc(ty, d.n, d.h), eng, DataOf(y));
    if (scale == 1.0f) {
      const auto prim =
          CachedPrimitive(PrimKey{PrimOp::kSoftmaxFwd, 0, tx, ty, d.n, d.h, 0u}, MakeFwd, "softmax forward");
      dnnl::memory src(DataDesc(tx, d.n, d.h), eng, DataOf(x));
      prim->execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    } else {
      const auto scaled = CachedPrimitive(PrimKey{PrimOp::kLinear, 1, tx, DT::kF32, d.n, d.h, BitsOfFloat(scale)},
                                          MakeScaledReorder, "scaling reorder");
      const auto prim = CachedPrimitive(PrimKey{PrimOp::kSoftmaxFwd, 0, DT::kF32, DT::kF32, d.n, d.h, 0u}, MakeFwd,
                                        "softmax forward");
      dnnl::memory src(DataDesc(tx, d.n, d.h), eng, DataOf(x));
      scaled->execute(s, {{DNNL_ARG_FROM, src}, {DNNL_ARG_TO, dst}});
      prim->execute(s, {{DNNL_ARG_SRC, dst}, {DNNL_ARG_DST, dst}});
    }
    s.wait();
    return nullptr;
  });
}

tefl_status* BwdKernel(const tefl_call_frame* f, void*) noexcept {
  return Guarded(f, "scaled_softmax_backward", [&]() -> tefl_status* {
    const DLTensor* dy = f->inputs[0];
    const DLTensor* y = f->inputs[1];
    DLTensor* dx = f->outputs[0];
    const Dims d = RowsCols(y);
    if (d.n == 0 || d.h == 0) return nullptr;
    const float scale = ScaleOf(f);
    const DT tg = DtOf(dy), ty = DtOf(y);
    const auto prim =
        CachedPrimitive(PrimKey{PrimOp::kSoftmaxBwd, 0, tg, ty, d.n, d.h, 0u}, MakeBwd, "softmax backward");
    std::shared_ptr<const dnnl::primitive> linear;
    if (scale != 1.0f)
      linear = CachedPrimitive(PrimKey{PrimOp::kLinear, 0, tg, tg, 1, d.n * d.h, BitsOfFloat(scale)}, MakeLinear,
                               "eltwise linear");
    const dnnl::engine& eng = GetState().engine;
    dnnl::stream& s = ThreadStream();
    dnnl::memory diff_dst(DataDesc(tg, d.n, d.h), eng, DataOf(dy));
    dnnl::memory dst(DataDesc(ty, d.n, d.h), eng, DataOf(y));
    dnnl::memory diff_src(DataDesc(tg, d.n, d.h), eng, DataOf(dx));
    prim->execute(s, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DST, dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
    if (linear) {
      dnnl::memory flat(VecDesc(d.n * d.h, tg), eng, DataOf(dx));
      linear->execute(s, {{DNNL_ARG_SRC, flat}, {DNNL_ARG_DST, flat}});
    }
    s.wait();
    return nullptr;
  });
}

}  // namespace

tefl_status* RegisterSoftmax(const tefl_registrar* registrar) {
  const tefl_impl_desc descs[] = {
      VendorDesc("scaled_softmax_forward", FwdKernel, FwdSupports),
      VendorDesc("scaled_softmax_backward", BwdKernel, BwdSupports),
  };
  for (const tefl_impl_desc& d : descs)
    if (tefl_status* s = registrar->register_impl(registrar->ctx, &d)) return s;
  return nullptr;
}

}  // namespace onednn_plugin
