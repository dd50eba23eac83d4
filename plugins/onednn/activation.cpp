// onednn plugin — activations: the element-wise ones oneDNN 2.6 has.
//   gelu / dgelu    eltwise_gelu_tanh (TE's tanh form)
//   silu / dsilu    eltwise_swish, alpha 1       (x * sigmoid(x))
//   qgelu / dqgelu  eltwise_swish, alpha 1.702   (x * sigmoid(1.702 x))
//   relu / drelu    eltwise_relu, alpha 0
// Backward ops use eltwise_backward on the forward input (diff_src =
// diff_dst * act'(src)). Tensors are viewed as one flat vector: the ops are
// element-wise, so any compact shape maps to {numel}.
//
// Declined from the kernel (TEFL_UNSUPPORTED, before writing): an input with
// a NaN, an infinity or |x| > 1e4. oneDNN's eltwise kernels do not follow
// IEEE there (relu(NaN) = 0, drelu(NaN) passes the gradient, gelu' and
// swish' of +-inf are NaN where the limit is finite); the input is scanned
// once, in parallel, for this. Past 1e4 every one of these activations is in
// its linear or zero regime, which the next implementation serves exactly.
//
// Declined (supports()): float16 data (oneDNN 2.6 has no f16 CPU eltwise on
// this ISA family), mixed dtypes (one oneDNN data descriptor for src and
// dst), strided tensors. Not offered: srelu and the gated and dbias ops
// (no single oneDNN primitive computes them).
#include "common.h"

namespace onednn_plugin {
namespace {

// Largest |input| served (see the file comment).
constexpr float kMaxInput = 1e4f;

struct EltwiseOp {
  const char* fwd_name;
  const char* bwd_name;
  dnnl::algorithm alg;
  float alpha;
};
constexpr EltwiseOp kOps[] = {
    {"gelu", "dgelu", dnnl::algorithm::eltwise_gelu_tanh, 0.0f},
    {"silu", "dsilu", dnnl::algorithm::eltwise_swish, 1.0f},
    {"qgelu", "dqgelu", dnnl::algorithm::eltwise_swish, 1.702f},
    {"relu", "drelu", dnnl::algorithm::eltwise_relu, 0.0f},
};

dnnl::eltwise_forward::primitive_desc FwdPd(const dnnl::engine& eng, const PrimKey& k) {
  const dnnl::memory::desc md = VecDesc(k.h, k.dt_a);
  const dnnl::eltwise_forward::desc d(dnnl::prop_kind::forward_training, dnnl::algorithm(k.alg), md,
                                      FloatOfBits(k.param), 0.0f);
  return dnnl::eltwise_forward::primitive_desc(d, eng);
}

dnnl::primitive MakeFwd(const dnnl::engine& eng, const PrimKey& k) { return dnnl::eltwise_forward(FwdPd(eng, k)); }

dnnl::primitive MakeBwd(const dnnl::engine& eng, const PrimKey& k) {
  const dnnl::memory::desc md = VecDesc(k.h, k.dt_a);
  const dnnl::eltwise_backward::desc d(dnnl::algorithm(k.alg), md, md, FloatOfBits(k.param), 0.0f);
  return dnnl::eltwise_backward(dnnl::eltwise_backward::primitive_desc(d, eng, FwdPd(eng, k)));
}

// Every data tensor float32 or bfloat16, all the same.
int32_t SameFloatDtype(const tefl_call_frame* f, int n_in, char* why, size_t len) {
  const DT first = DtOf(f->inputs[0]);
  for (int i = 0; i < n_in + 1; ++i) {
    const DLTensor* t = i < n_in ? f->inputs[i] : f->outputs[0];
    const DT d = DtOf(t);
    if (d != DT::kF32 && d != DT::kBF16) {
      Why(why, len,
          "onednn (oneDNN 2.6 eltwise on the CPU) handles float32 and bfloat16 only, got " + DtypeName(t->dtype));
      return 0;
    }
    if (d != first) {
      Why(why, len,
          "onednn needs one dtype for all tensors (one oneDNN data descriptor), got " + DtypeName(f->inputs[0]->dtype) +
              " and " + DtypeName(t->dtype));
      return 0;
    }
  }
  return 1;
}

int32_t FwdSupports(const tefl_call_frame* f, void*, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"input"};
    static const char* const kOut[] = {"output"};
    return SupportsPresentCompact(f, kIn, 1, kOut, 1, why, len) && SameFloatDtype(f, 1, why, len);
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

int32_t BwdSupports(const tefl_call_frame* f, void* user_data, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"grad", "input"};
    static const char* const kOut[] = {"dinput"};
    if (!SupportsPresentCompact(f, kIn, 2, kOut, 1, why, len) || !SameFloatDtype(f, 2, why, len)) return 0;
    // oneDNN 2.6's gelu_tanh backward loses relative accuracy where the
    // derivative is small (measured: 1.2e-6 absolute, 0.13% relative near
    // gelu'(x) ~ 1e-3), beyond TransformerEngine's fp32 tolerance (atol 1e-6,
    // rtol 5e-6); bfloat16's tolerance covers it.
    const auto* op = static_cast<const EltwiseOp*>(user_data);
    if (op->alg == dnnl::algorithm::eltwise_gelu_tanh && DtOf(f->inputs[0]) == DT::kF32) {
      Why(why, len,
          "onednn declines float32 dgelu: oneDNN 2.6's gelu_tanh backward is off by up to ~1e-3 relative where "
          "gelu' is small, beyond TE's float32 tolerance");
      return 0;
    }
    return 1;
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

// user_data: the EltwiseOp.
tefl_status* FwdKernel(const tefl_call_frame* f, void* user_data) noexcept {
  const auto* op = static_cast<const EltwiseOp*>(user_data);
  return Guarded(f, op->fwd_name, [&]() -> tefl_status* {
    const DLTensor* x = f->inputs[0];
    DLTensor* y = f->outputs[0];
    const int64_t n = NumElements(x);
    if (n == 0) return nullptr;
    const DT dt = DtOf(x);
    if (!AllWithin(f->host, DataOf(x), dt, n, kMaxInput))
      throw Unsupported{"the input holds a NaN, an infinity or |x| > 1e4, where oneDNN's eltwise is not IEEE-exact"};
    const auto prim =
        CachedPrimitive(PrimKey{PrimOp::kEltwiseFwd, int32_t(op->alg), dt, dt, 1, n, BitsOfFloat(op->alpha)}, MakeFwd,
                        "eltwise forward");
    const dnnl::engine& eng = GetState().engine;
    const dnnl::memory::desc md = VecDesc(n, dt);
    dnnl::memory src(md, eng, DataOf(x)), dst(md, eng, DataOf(y));
    dnnl::stream& s = ThreadStream();
    prim->execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst}});
    s.wait();
    return nullptr;
  });
}

tefl_status* BwdKernel(const tefl_call_frame* f, void* user_data) noexcept {
  const auto* op = static_cast<const EltwiseOp*>(user_data);
  return Guarded(f, op->bwd_name, [&]() -> tefl_status* {
    const DLTensor* grad = f->inputs[0];
    const DLTensor* x = f->inputs[1];
    DLTensor* dx = f->outputs[0];
    const int64_t n = NumElements(x);
    if (n == 0) return nullptr;
    const DT dt = DtOf(x);
    if (!AllWithin(f->host, DataOf(x), dt, n, kMaxInput))
      throw Unsupported{"the input holds a NaN, an infinity or |x| > 1e4, where oneDNN's eltwise is not IEEE-exact"};
    const auto prim =
        CachedPrimitive(PrimKey{PrimOp::kEltwiseBwd, int32_t(op->alg), dt, dt, 1, n, BitsOfFloat(op->alpha)}, MakeBwd,
                        "eltwise backward");
    const dnnl::engine& eng = GetState().engine;
    const dnnl::memory::desc md = VecDesc(n, dt);
    dnnl::memory src(md, eng, DataOf(x)), diff_dst(md, eng, DataOf(grad)), diff_src(md, eng, DataOf(dx));
    dnnl::stream& s = ThreadStream();
    prim->execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src}});
    s.wait();
    return nullptr;
  });
}

}  // namespace

tefl_status* RegisterActivation(const tefl_registrar* registrar) {
  for (const EltwiseOp& op : kOps) {
    tefl_impl_desc fwd = VendorDesc(op.fwd_name, FwdKernel, FwdSupports);
    tefl_impl_desc bwd = VendorDesc(op.bwd_name, BwdKernel, BwdSupports);
    fwd.user_data = const_cast<EltwiseOp*>(&op);  // kernels and supports() read it, never write
    bwd.user_data = const_cast<EltwiseOp*>(&op);
    if (tefl_status* s = registrar->register_impl(registrar->ctx, &fwd)) return s;
    if (tefl_status* s = registrar->register_impl(registrar->ctx, &bwd)) return s;
  }
  return nullptr;
}

}  // namespace onednn_plugin
