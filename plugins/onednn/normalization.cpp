// onednn plugin — normalization: layernorm_fwd / layernorm_bwd through
// oneDNN's layer normalization primitives.
//   layernorm_fwd  layer_normalization_forward (forward_training, so the mean
//                  and variance come out); rsigma = 1/sqrt(var + eps)
//   layernorm_bwd  layer_normalization_backward (backward, use_scale |
//                  use_shift); the variance is rebuilt from rsigma
// RMSNorm is not offered: oneDNN 2.6 has no RMS-normalization flag.
#include <atomic>

#include "common.h"

namespace onednn_plugin {
namespace {

dnnl::normalization_flags Flags() {
  return dnnl::normalization_flags::use_scale | dnnl::normalization_flags::use_shift;
}

dnnl::layer_normalization_forward::primitive_desc MakeFwdPd(const dnnl::engine& eng, DT dt, int64_t n, int64_t h,
                                                            float eps) {
  const dnnl::memory::desc data({n, h}, DnnlType(dt), dnnl::memory::format_tag::ab);
  const dnnl::memory::desc stat({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
  const dnnl::layer_normalization_forward::desc d(dnnl::prop_kind::forward_training, data, stat, eps, Flags());
  return dnnl::layer_normalization_forward::primitive_desc(d, eng);
}

dnnl::primitive MakeLayerNormFwd(const dnnl::engine& eng, const PrimKey& k) {
  return dnnl::layer_normalization_forward(MakeFwdPd(eng, k.dt_a, k.n, k.h, FloatOfBits(k.param)));
}

dnnl::primitive MakeLayerNormBwd(const dnnl::engine& eng, const PrimKey& k) {
  const float eps = FloatOfBits(k.param);
  const auto fwd_pd = MakeFwdPd(eng, k.dt_a, k.n, k.h, eps);
  const dnnl::memory::desc data = DataDesc(k.dt_a, k.n, k.h);
  const dnnl::memory::desc stat = VecDesc(k.n);
  const dnnl::layer_normalization_backward::desc d(dnnl::prop_kind::backward, data, data, stat, eps, Flags());
  return dnnl::layer_normalization_backward(dnnl::layer_normalization_backward::primitive_desc(d, eng, fwd_pd));
}

// oneDNN accumulates the statistics in fp32, tefl's reference in double: a row
// whose squared deviations overflow fp32 (|x| beyond ~1e15), or underflow it
// while eps cannot absorb that (|x| below ~1e-15 with eps ~ 0), would give
// different statistics, so such data is declined before anything is written.
// Largest |x| of row r, NaN ignored, inf kept (an inf row is declined too:
// the next implementation handles it). Branch-free so the loop vectorises.
float RowAbsMax(const void* x, DT dt, int64_t r, int64_t h) {
  float amax = 0.0f;
  if (dt == DT::kF32) {
    const float* p = static_cast<const float*>(x) + r * h;
    for (int64_t j = 0; j < h; ++j) {
      const float a = std::fabs(p[j]);
      amax = a > amax ? a : amax;
    }
  } else {
    for (int64_t j = 0; j < h; ++j) {
      const float a = std::fabs(LoadF(x, dt, r * h + j));
      amax = a > amax ? a : amax;
    }
  }
  return amax;
}

struct SafetyScan {
  const void* x;
  DT dt;
  int64_t h;
  float eps;
  std::atomic<int64_t> bad_row{-1};
  std::atomic<bool> too_large{false};
};

void ScanRows(void* ctx, int64_t begin, int64_t end) {
  auto* s = static_cast<SafetyScan*>(ctx);
  for (int64_t r = begin; r < end && s->bad_row.load(std::memory_order_relaxed) < 0; ++r) {
    const float amax = RowAbsMax(s->x, s->dt, r, s->h);
    const bool large = amax > 1e15f;
    const bool tiny = amax > 0.0f && amax < 1e-15f && s->eps < 1e-20f;
    if (large || tiny) {
      int64_t expected = -1;
      if (s->bad_row.compare_exchange_strong(expected, r)) s->too_large.store(large);
    }
  }
}

// oneDNN accumulates the statistics in fp32, tefl's reference in double: a row
// whose squared deviations overflow fp32 (|x| beyond ~1e15), or underflow it
// while eps cannot absorb that (|x| below ~1e-15 with eps ~ 0), would give
// different statistics, so such data is declined before anything is written.
// One read of x, split over the host's threads.
bool Fp32StatisticsSafe(const tefl_host_services* host, const void* x, DT dt, int64_t n, int64_t h, float eps,
                        std::string* why) {
  SafetyScan scan{x, dt, h, eps};
  host->parallel_for(n, 64, ScanRows, &scan);
  const int64_t r = scan.bad_row.load();
  if (r < 0) return true;
  *why = scan.too_large.load()
             ? "row " + std::to_string(r) +
                   " has |x| beyond 1e15 (or inf): its variance would overflow oneDNN's fp32 statistics"
             : "row " + std::to_string(r) +
                   " has |x| below 1e-15 with eps ~ 0: its variance would underflow oneDNN's fp32 "
                   "statistics";
  return false;
}

// Data tensors a (x or dz), b (z, x or dx): float32 or bfloat16, both the same.
int32_t SupportsDataDtypes(const DLTensor* const* t, const char* const* names, int n, char* why, size_t len) {
  const DT first = DtOf(t[0]);
  for (int i = 0; i < n; ++i) {
    const DT d = DtOf(t[i]);
    if (d != DT::kF32 && d != DT::kBF16) {
      Why(why, len,
          "onednn (oneDNN 2.6 layer normalization on the CPU) handles float32 and bfloat16 data only, got " +
              DtypeName(t[i]->dtype) + " " + names[i] + (d == DT::kF16 ? " (no float16 CPU implementation)" : ""));
      return 0;
    }
    if (d != first) {
      Why(why, len,
          std::string("onednn needs one dtype for all data tensors (oneDNN 2.6 uses one descriptor), got ") +
              DtypeName(t[0]->dtype) + " " + names[0] + " and " + DtypeName(t[i]->dtype) + " " + names[i]);
      return 0;
    }
  }
  return 1;
}

int32_t SupportsParamDtypes(const DLTensor* const* t, const char* const* names, int n, char* why, size_t len) {
  for (int i = 0; i < n; ++i) {
    const DT d = DtOf(t[i]);
    if (d == DT::kOther) {
      Why(why, len,
          "onednn handles float32, bfloat16 and float16 " + std::string(names[i]) + " only, got " +
              DtypeName(t[i]->dtype));
      return 0;
    }
  }
  return 1;
}

int32_t SupportsStats(const DLTensor* const* t, const char* const* names, int n, char* why, size_t len) {
  for (int i = 0; i < n; ++i)
    if (DtOf(t[i]) != DT::kF32) {
      Why(why, len, std::string("onednn needs float32 ") + names[i] + ", got " + DtypeName(t[i]->dtype));
      return 0;
    }
  return 1;
}

int32_t LayerNormFwdSupports(const tefl_call_frame* frame, void*, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"x", "gamma", "beta"};
    static const char* const kOut[] = {"z", "mu", "rsigma"};
    if (!SupportsPresentCompact(frame, kIn, 3, kOut, 3, why, len)) return 0;
    const DLTensor* data[] = {frame->inputs[0], frame->outputs[0]};
    static const char* const kData[] = {"x", "z"};
    const DLTensor* params[] = {frame->inputs[1], frame->inputs[2]};
    static const char* const kParams[] = {"gamma", "beta"};
    const DLTensor* stats[] = {frame->outputs[1], frame->outputs[2]};
    static const char* const kStats[] = {"mu", "rsigma"};
    return SupportsDataDtypes(data, kData, 2, why, len) && SupportsParamDtypes(params, kParams, 2, why, len) &&
           SupportsStats(stats, kStats, 2, why, len);
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

int32_t LayerNormBwdSupports(const tefl_call_frame* frame, void*, char* why, size_t len) noexcept {
  try {
    static const char* const kIn[] = {"dz", "x", "mu", "rsigma", "gamma"};
    static const char* const kOut[] = {"dx", "dgamma", "dbeta"};
    if (!SupportsPresentCompact(frame, kIn, 5, kOut, 3, why, len)) return 0;
    const DLTensor* data[] = {frame->inputs[1], frame->inputs[0], frame->outputs[0]};
    static const char* const kData[] = {"x", "dz", "dx"};
    const DLTensor* params[] = {frame->inputs[4], frame->outputs[1], frame->outputs[2]};
    static const char* const kParams[] = {"gamma", "dgamma", "dbeta"};
    const DLTensor* stats[] = {frame->inputs[2], frame->inputs[3]};
    static const char* const kStats[] = {"mu", "rsigma"};
    return SupportsDataDtypes(data, kData, 3, why, len) && SupportsParamDtypes(params, kParams, 3, why, len) &&
           SupportsStats(stats, kStats, 2, why, len);
  } catch (...) {
    Why(why, len, "onednn: internal error in supports()");
    return 0;
  }
}

tefl_status* LayerNormFwd(const tefl_call_frame* frame, void*) noexcept {
  return Guarded(frame, "layernorm_fwd", [&]() -> tefl_status* {
    const tefl_host_services* host = frame->host;
    const DLTensor* x = frame->inputs[0];
    const DLTensor* gamma = frame->inputs[1];
    const DLTensor* beta = frame->inputs[2];
    DLTensor* z = frame->outputs[0];
    DLTensor* mu = frame->outputs[1];
    DLTensor* rsigma = frame->outputs[2];
    if (x->ndim < 1) return Status(host, TEFL_UNSUPPORTED, "layernorm_fwd: x must have rank >= 1");
    float eps = 1e-5f;
    int32_t zcg = 0;
    const auto* attrs = static_cast<const tefl_norm_fwd_attrs*>(frame->attrs);
    if (attrs != nullptr) {
      if (attrs->struct_size >= TEFL_STRUCT_SIZE(tefl_norm_fwd_attrs, eps)) eps = attrs->eps;
      if (attrs->struct_size >= TEFL_STRUCT_SIZE(tefl_norm_fwd_attrs, zero_centered_gamma))
        zcg = attrs->zero_centered_gamma;
    }
    const Dims d = RowsCols(x);
    if (d.n == 0) return nullptr;
    if (d.h <= 0) return Status(host, TEFL_UNSUPPORTED, "layernorm_fwd: hidden size 0");
    const DT dt = DtOf(x);
    std::string why;
    if (!Fp32StatisticsSafe(host, DataOf(x), dt, d.n, d.h, eps, &why))
      return Status(host, TEFL_UNSUPPORTED, "layernorm_fwd: " + why);

    uint32_t eps_bits;
    std::memcpy(&eps_bits, &eps, 4);
    const auto prim = CachedPrimitive(PrimKey{PrimOp::kLayerNormFwd, 0, dt, dt, d.n, d.h, eps_bits}, MakeLayerNormFwd,
                                      "layer normalization forward");  // may throw Unsupported

    // Nothing has been written so far; from here on the call runs.
    const DT gdt = DtOf(gamma), bdt = DtOf(beta);
    std::vector<float> scale(size_t(d.h)), shift(size_t(d.h)), variance(size_t(d.n));
    for (int64_t j = 0; j < d.h; ++j) {
      scale[size_t(j)] = LoadF(DataOf(gamma), gdt, j) + (zcg ? 1.0f : 0.0f);
      shift[size_t(j)] = LoadF(DataOf(beta), bdt, j);
    }
    const dnnl::engine& eng = GetState().engine;
    const auto dd = DataDesc(dt, d.n, d.h);
    dnnl::memory src(dd, eng, DataOf(x));
    dnnl::memory dst(dd, eng, DataOf(z));
    dnnl::memory mean_m(VecDesc(d.n), eng, DataOf(mu));
    dnnl::memory var_m(VecDesc(d.n), eng, variance.data());
    dnnl::memory scale_m(VecDesc(d.h), eng, scale.data());
    dnnl::memory shift_m(VecDesc(d.h), eng, shift.data());
    dnnl::stream& s = ThreadStream();
    prim->execute(s, {{DNNL_ARG_SRC, src},
                      {DNNL_ARG_DST, dst},
                      {DNNL_ARG_MEAN, mean_m},
                      {DNNL_ARG_VARIANCE, var_m},
                      {DNNL_ARG_SCALE, scale_m},
                      {DNNL_ARG_SHIFT, shift_m}});
    s.wait();
    auto* rs = static_cast<float*>(DataOf(rsigma));
    for (int64_t r = 0; r < d.n; ++r) rs[r] = float(1.0 / std::sqrt(double(variance[size_t(r)]) + double(eps)));
    return nullptr;
  });
}

tefl_status* LayerNormBwd(const tefl_call_frame* frame, void*) noexcept {
  return Guarded(frame, "layernorm_bwd", [&]() -> tefl_status* {
    const tefl_host_services* host = frame->host;
    const DLTensor* dz = frame->inputs[0];
    const DLTensor* x = frame->inputs[1];
    const DLTensor* mu = frame->inputs[2];
    const DLTensor* rsigma = frame->inputs[3];
    const DLTensor* gamma = frame->inputs[4];
    DLTensor* dx = frame->outputs[0];
    DLTensor* dgamma = frame->outputs[1];
    DLTensor* dbeta = frame->outputs[2];
    if (x->ndim < 1) return Status(host, TEFL_UNSUPPORTED, "layernorm_bwd: x must have rank >= 1");
    int32_t zcg = 0;
    const auto* attrs = static_cast<const tefl_norm_bwd_attrs*>(frame->attrs);
    if (attrs != nullptr && attrs->struct_size >= TEFL_STRUCT_SIZE(tefl_norm_bwd_attrs, zero_centered_gamma))
      zcg = attrs->zero_centered_gamma;
    const Dims d = RowsCols(x);
    if (d.h <= 0) return Status(host, TEFL_UNSUPPORTED, "layernorm_bwd: hidden size 0");
    const DT dt = DtOf(x), gdt = DtOf(gamma);
    if (d.n == 0) {  // no rows: the parameter gradients are zero
      for (int64_t j = 0; j < d.h; ++j) {
        StoreF(DataOf(dgamma), DtOf(dgamma), j, 0.0f);
        StoreF(DataOf(dbeta), DtOf(dbeta), j, 0.0f);
      }
      return nullptr;
    }
    // The backward primitive is built with eps = 0 and given the variance
    // 1/rsigma^2 (the general rule variance = 1/rsigma^2 - eps with eps = 0),
    // so that oneDNN's 1/sqrt(variance + eps) gives back rsigma itself.
    const auto prim = CachedPrimitive(PrimKey{PrimOp::kLayerNormBwd, 0, dt, dt, d.n, d.h, 0u}, MakeLayerNormBwd,
                                      "layer normalization backward");  // may throw Unsupported

    std::vector<float> scale(size_t(d.h)), variance(size_t(d.n)), dscale(size_t(d.h)), dshift(size_t(d.h));
    std::vector<float> shift(size_t(d.h), 0.0f);
    for (int64_t j = 0; j < d.h; ++j) scale[size_t(j)] = LoadF(DataOf(gamma), gdt, j) + (zcg ? 1.0f : 0.0f);
    const auto* rs = static_cast<const float*>(DataOf(rsigma));
    for (int64_t r = 0; r < d.n; ++r) {
      const double v = double(rs[r]);
      variance[size_t(r)] = float(1.0 / (v * v));
    }
    const dnnl::engine& eng = GetState().engine;
    const auto dd = DataDesc(dt, d.n, d.h);
    dnnl::memory diff_dst(dd, eng, DataOf(dz));
    dnnl::memory src(dd, eng, DataOf(x));
    dnnl::memory diff_src(dd, eng, DataOf(dx));
    dnnl::memory mean_m(VecDesc(d.n), eng, DataOf(mu));
    dnnl::memory var_m(VecDesc(d.n), eng, variance.data());
    dnnl::memory scale_m(VecDesc(d.h), eng, scale.data());
    dnnl::memory shift_m(VecDesc(d.h), eng, shift.data());
    dnnl::memory dscale_m(VecDesc(d.h), eng, dscale.data());
    dnnl::memory dshift_m(VecDesc(d.h), eng, dshift.data());
    dnnl::stream& s = ThreadStream();
    prim->execute(s, {{DNNL_ARG_DIFF_DST, diff_dst},
                      {DNNL_ARG_SRC, src},
                      {DNNL_ARG_MEAN, mean_m},
                      {DNNL_ARG_VARIANCE, var_m},
                      {DNNL_ARG_SCALE, scale_m},
                      {DNNL_ARG_SHIFT, shift_m},
                      {DNNL_ARG_DIFF_SRC, diff_src},
                      {DNNL_ARG_DIFF_SCALE, dscale_m},
                      {DNNL_ARG_DIFF_SHIFT, dshift_m}});
    s.wait();
    const DT dgdt = DtOf(dgamma), dbdt = DtOf(dbeta);
    for (int64_t j = 0; j < d.h; ++j) {
      StoreF(DataOf(dgamma), dgdt, j, dscale[size_t(j)]);
      StoreF(DataOf(dbeta), dbdt, j, dshift[size_t(j)]);
    }
    return nullptr;
  });
}

}  // namespace

tefl_status* RegisterNormalization(const tefl_registrar* registrar) {
  const tefl_impl_desc descs[] = {
      VendorDesc("layernorm_fwd", LayerNormFwd, LayerNormFwdSupports),
      VendorDesc("layernorm_bwd", LayerNormBwd, LayerNormBwdSupports),
  };
  for (const tefl_impl_desc& d : descs)
    if (tefl_status* s = registrar->register_impl(registrar->ctx, &d)) return s;
  return nullptr;
}

}  // namespace onednn_plugin
