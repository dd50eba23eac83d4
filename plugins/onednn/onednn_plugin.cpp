// onednn — tefl's vendor plugin backed by Intel oneDNN (2.6 API).
//
// Implementations (impl_id "vendor.onednn", kind vendor, vendor "onednn",
// priority 100, CPU only):
//   layernorm_fwd  oneDNN layer_normalization_forward (forward_training, so
//                  the mean and variance come out); rsigma = 1/sqrt(var + eps)
//   layernorm_bwd  oneDNN layer_normalization_backward (backward, use_scale |
//                  use_shift); the variance is rebuilt from rsigma
//
// RMSNorm is not offered: oneDNN 2.6 has no RMS-normalization flag.
//
// Only tefl_plugin_info and tefl_plugin_register are exported (extern "C");
// everything else has hidden visibility. No C++ exception crosses the ABI:
// every entry point and kernel catches and turns it into a tefl status.
#include <tefl/ops.h>
#include <tefl/tefl.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <new>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <tuple>
#include <vector>

#define ONEDNN_PLUGIN_EXPORT extern "C" __attribute__((visibility("default")))

namespace {

// ---- dtypes -----------------------------------------------------------------
enum class DT { kF32, kBF16, kF16, kOther };

DT DtOf(const DLTensor* t) {
  if (t == nullptr || t->dtype.lanes != 1) return DT::kOther;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) return DT::kF32;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16) return DT::kF16;
  if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) return DT::kBF16;
  return DT::kOther;
}

std::string DtypeName(DLDataType d) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 16) return "float16";
    if (d.code == kDLFloat && d.bits == 32) return "float32";
    if (d.code == kDLFloat && d.bits == 64) return "float64";
    if (d.code == kDLBfloat && d.bits == 16) return "bfloat16";
    if (d.code == TEFL_DL_FLOAT8_E4M3FN && d.bits == 8) return "float8_e4m3fn";
    if (d.code == TEFL_DL_FLOAT8_E5M2 && d.bits == 8) return "float8_e5m2";
    if (d.code == kDLInt) return "int" + std::to_string(d.bits);
    if (d.code == kDLUInt) return "uint" + std::to_string(d.bits);
  }
  return "dtype(code=" + std::to_string(d.code) + ", bits=" + std::to_string(d.bits) +
         ", lanes=" + std::to_string(d.lanes) + ")";
}

float Bf16ToF32(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToBf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

float F16ToF32(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
  if (exp == 0) {
    if (mant == 0) {
      u = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      u = sign | (exp << 23) | ((mant & 0x3ffu) << 13);
    }
  } else if (exp == 31) {
    u = sign | 0x7f800000u | (mant << 13);
  } else {
    u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t F32ToF16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  const uint16_t sign = uint16_t((u >> 16) & 0x8000u);
  const uint32_t au = u & 0x7fffffffu;
  if (au > 0x7f800000u) return uint16_t(sign | 0x7e00u);
  if (au >= 0x477ff000u) return uint16_t(sign | 0x7c00u);  // rounds to >= 65520: inf
  if (au < 0x38800000u) {                                  // below the smallest normal half
    if (au < 0x33000000u) return sign;                     // < 2^-25: zero
    const uint32_t e = au >> 23;
    const uint32_t m = (au & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return uint16_t(sign | r);
  }
  uint32_t r = ((au >> 13) - ((127 - 15) << 10));
  const uint32_t rem = au & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return uint16_t(sign | r);
}

float LoadF(const void* base, DT dt, int64_t i) {
  switch (dt) {
    case DT::kF32:
      return static_cast<const float*>(base)[i];
    case DT::kBF16:
      return Bf16ToF32(static_cast<const uint16_t*>(base)[i]);
    case DT::kF16:
      return F16ToF32(static_cast<const uint16_t*>(base)[i]);
    default:
      return 0.0f;
  }
}

void StoreF(void* base, DT dt, int64_t i, float v) {
  switch (dt) {
    case DT::kF32:
      static_cast<float*>(base)[i] = v;
      break;
    case DT::kBF16:
      static_cast<uint16_t*>(base)[i] = F32ToBf16(v);
      break;
    case DT::kF16:
      static_cast<uint16_t*>(base)[i] = F32ToF16(v);
      break;
    default:
      break;
  }
}

bool IsCompact(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return false;
    expected *= t->shape[d];
  }
  return true;
}

void* DataOf(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

void Why(char* why, size_t len, const std::string& msg) {
  if (why != nullptr && len > 0) std::snprintf(why, len, "%s", msg.c_str());
}

tefl_status* Status(const tefl_host_services* host, int32_t code, const std::string& msg) {
  return host->status_new(code, ("onednn: " + msg).c_str());
}

// ---- oneDNN state: one engine, a primitive cache ------------------------------
enum class Op { kFwd, kBwd };

struct Key {
  Op op;
  DT dt;
  int64_t n, h;
  uint32_t eps_bits;
  bool operator<(const Key& o) const {
    return std::tie(op, dt, n, h, eps_bits) < std::tie(o.op, o.dt, o.n, o.h, o.eps_bits);
  }
};

struct Entry {
  dnnl::primitive prim;
};

struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<Key, std::shared_ptr<const Entry>> cache;
};

State& GetState() {
  static State* state = new State();  // never destroyed: kernels may run until exit
  return *state;
}

// Thrown when a primitive descriptor cannot be created for the shape/dtype.
struct Unsupported {
  std::string msg;
};

dnnl::memory::data_type DnnlType(DT dt) {
  return dt == DT::kBF16  ? dnnl::memory::data_type::bf16
         : dt == DT::kF16 ? dnnl::memory::data_type::f16
                          : dnnl::memory::data_type::f32;
}

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

// The cached primitive for `key`, created on first use. A dnnl::error while
// creating the descriptors means oneDNN does not implement the case.
std::shared_ptr<const Entry> GetPrimitive(const Key& key) {
  State& st = GetState();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.cache.find(key);
    if (it != st.cache.end()) return it->second;
  }
  float eps;
  std::memcpy(&eps, &key.eps_bits, 4);
  auto entry = std::make_shared<Entry>();
  try {
    const auto fwd_pd = MakeFwdPd(st.engine, key.dt, key.n, key.h, eps);
    if (key.op == Op::kFwd) {
      entry->prim = dnnl::layer_normalization_forward(fwd_pd);
    } else {
      const dnnl::memory::desc data({key.n, key.h}, DnnlType(key.dt), dnnl::memory::format_tag::ab);
      const dnnl::memory::desc stat({key.n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
      const dnnl::layer_normalization_backward::desc d(dnnl::prop_kind::backward, data, data, stat, eps, Flags());
      const dnnl::layer_normalization_backward::primitive_desc pd(d, st.engine, fwd_pd);
      entry->prim = dnnl::layer_normalization_backward(pd);
    }
  } catch (const dnnl::error& e) {
    throw Unsupported{std::string("no oneDNN layer normalization ") + (key.op == Op::kFwd ? "forward" : "backward") +
                      " primitive for this case: " + e.what()};
  }
  std::lock_guard<std::mutex> lock(st.mu);
  auto ins = st.cache.emplace(key, entry);
  return ins.first->second;
}

struct Dims {
  int64_t n = 1, h = 0;
};

Dims RowsCols(const DLTensor* x) {
  Dims d;
  d.h = x->shape[x->ndim - 1];
  for (int32_t i = 0; i + 1 < x->ndim; ++i) d.n *= x->shape[i];
  return d;
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

// ---- supports() -------------------------------------------------------------------
// Depends only on the call signature: dtypes, contiguity, presence.
int32_t Supports(const tefl_call_frame* frame, const char* const* in_names, int n_in, const char* const* out_names,
                 int n_out, char* why, size_t len) {
  if (frame->num_inputs < n_in || frame->num_outputs < n_out) {
    Why(why, len, "onednn needs all of the op's inputs and outputs");
    return 0;
  }
  for (int i = 0; i < n_in; ++i)
    if (frame->inputs[i] == nullptr) {
      Why(why, len, std::string("onednn needs input '") + in_names[i] + "'");
      return 0;
    }
  for (int i = 0; i < n_out; ++i)
    if (frame->outputs[i] == nullptr) {
      Why(why, len, std::string("onednn needs output '") + out_names[i] + "'");
      return 0;
    }
  for (int i = 0; i < n_in; ++i)
    if (!IsCompact(frame->inputs[i])) {
      Why(why, len, std::string("onednn handles compact row-major tensors only, '") + in_names[i] + "' is strided");
      return 0;
    }
  for (int i = 0; i < n_out; ++i)
    if (!IsCompact(frame->outputs[i])) {
      Why(why, len, std::string("onednn handles compact row-major tensors only, '") + out_names[i] + "' is strided");
      return 0;
    }
  return 1;
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
    if (!Supports(frame, kIn, 3, kOut, 3, why, len)) return 0;
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
    if (!Supports(frame, kIn, 5, kOut, 3, why, len)) return 0;
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

// ---- Kernels ---------------------------------------------------------------------------
dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(GetState().engine);
  return stream;
}

dnnl::memory::desc DataDesc(DT dt, int64_t n, int64_t h) {
  return dnnl::memory::desc({n, h}, DnnlType(dt), dnnl::memory::format_tag::ab);
}
dnnl::memory::desc VecDesc(int64_t n) {
  return dnnl::memory::desc({n}, dnnl::memory::data_type::f32, dnnl::memory::format_tag::a);
}

template <typename Body>
tefl_status* Guarded(const tefl_call_frame* frame, const char* op, Body&& body) noexcept {
  const tefl_host_services* host = frame->host;
  try {
    return body();
  } catch (const Unsupported& u) {
    return Status(host, TEFL_UNSUPPORTED, std::string(op) + ": " + u.msg);
  } catch (const dnnl::error& e) {
    return Status(host, TEFL_RUNTIME_ERROR, std::string(op) + ": oneDNN error: " + e.what());
  } catch (const std::bad_alloc&) {
    return Status(host, TEFL_RUNTIME_ERROR, std::string(op) + ": out of memory");
  } catch (const std::exception& e) {
    return Status(host, TEFL_RUNTIME_ERROR, std::string(op) + ": " + e.what());
  } catch (...) {
    return Status(host, TEFL_RUNTIME_ERROR, std::string(op) + ": unknown exception");
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
    const auto entry = GetPrimitive(Key{Op::kFwd, dt, d.n, d.h, eps_bits});  // may throw Unsupported

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
    entry->prim.execute(s, {{DNNL_ARG_SRC, src},
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
    const auto entry = GetPrimitive(Key{Op::kBwd, dt, d.n, d.h, 0u});  // may throw Unsupported

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
    entry->prim.execute(s, {{DNNL_ARG_DIFF_DST, diff_dst},
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

// ---- Entry points -------------------------------------------------------------------------
ONEDNN_PLUGIN_EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) noexcept {
  static const tefl_plugin_metadata info = {
      TEFL_PLUGIN_METADATA_STRUCT_SIZE, "onednn", "1.0.0", "onednn", TEFL_ABI_MAJOR, TEFL_ABI_MINOR,
  };
  return &info;
}

ONEDNN_PLUGIN_EXPORT tefl_status* tefl_plugin_register(const tefl_host_services* host,
                                                       const tefl_registrar* registrar) noexcept {
  try {
    if (registrar == nullptr || registrar->struct_size < TEFL_STRUCT_SIZE(tefl_registrar, register_impl))
      return host->status_new(TEFL_INVALID_ARGUMENT, "onednn: the registrar has no register_impl");
    // Creating the engine here surfaces a oneDNN without a CPU engine at load
    // time rather than on the first call.
    (void)GetState();
    // LayerNorm only: oneDNN 2.6 has no RMS-normalization flag, so rmsnorm_*
    // are not offered.
    const tefl_impl_desc descs[] = {
        {TEFL_IMPL_DESC_STRUCT_SIZE, "layernorm_fwd", "vendor.onednn", TEFL_KIND_VENDOR, 100, "onednn",
         TEFL_DEVICE_BIT(kDLCPU), LayerNormFwd, LayerNormFwdSupports, nullptr},
        {TEFL_IMPL_DESC_STRUCT_SIZE, "layernorm_bwd", "vendor.onednn", TEFL_KIND_VENDOR, 100, "onednn",
         TEFL_DEVICE_BIT(kDLCPU), LayerNormBwd, LayerNormBwdSupports, nullptr},
    };
    for (const tefl_impl_desc& d : descs) {
      tefl_status* s = registrar->register_impl(registrar->ctx, &d);
      if (s != nullptr) return s;  // registration is transactional: nothing stays
    }
    return nullptr;
  } catch (const std::exception& e) {
    return host->status_new(TEFL_RUNTIME_ERROR, (std::string("onednn: registration failed: ") + e.what()).c_str());
  } catch (...) {
    return host->status_new(TEFL_RUNTIME_ERROR, "onednn: registration failed");
  }
}
