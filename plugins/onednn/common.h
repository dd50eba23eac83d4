// Shared by the oneDNN plugin's op-family files: dtypes and conversions, the
// one engine and its primitive cache, per-thread streams, the exception
// guard every kernel runs in, and the generic supports() checks.
//
// Everything here has hidden visibility (the target's preset); only
// plugin.cpp exports the two entry points.
#ifndef TEFL_PLUGINS_ONEDNN_COMMON_H_
#define TEFL_PLUGINS_ONEDNN_COMMON_H_

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

namespace onednn_plugin {

// ---- dtypes -----------------------------------------------------------------
enum class DT { kF32, kBF16, kF16, kOther };

inline DT DtOf(const DLTensor* t) {
  if (t == nullptr || t->dtype.lanes != 1) return DT::kOther;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 32) return DT::kF32;
  if (t->dtype.code == kDLFloat && t->dtype.bits == 16) return DT::kF16;
  if (t->dtype.code == kDLBfloat && t->dtype.bits == 16) return DT::kBF16;
  return DT::kOther;
}

inline std::string DtypeName(DLDataType d) {
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

inline float Bf16ToF32(uint16_t v) {
  const uint32_t u = uint32_t(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t F32ToBf16(float f) {  // round to nearest even, NaN kept quiet
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}

inline float F16ToF32(uint16_t h) {
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

inline uint16_t F32ToF16(float f) {  // round to nearest even
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

inline float LoadF(const void* base, DT dt, int64_t i) {
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

inline void StoreF(void* base, DT dt, int64_t i, float v) {
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

inline bool IsCompact(const DLTensor* t) {
  if (t->strides == nullptr) return true;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return false;
    expected *= t->shape[d];
  }
  return true;
}

inline void* DataOf(const DLTensor* t) { return static_cast<char*>(t->data) + t->byte_offset; }

inline void Why(char* why, size_t len, const std::string& msg) {
  if (why != nullptr && len > 0) std::snprintf(why, len, "%s", msg.c_str());
}

inline tefl_status* Status(const tefl_host_services* host, int32_t code, const std::string& msg) {
  return host->status_new(code, ("onednn: " + msg).c_str());
}

// ---- oneDNN state: one engine, one primitive cache ------------------------------
// Creating a oneDNN primitive costs tens of microseconds to milliseconds
// (JIT), so each is created once per key and kept for the process.
enum class PrimOp : int32_t {
  kLayerNormFwd,
  kLayerNormBwd,
  kEltwiseFwd,
  kEltwiseBwd,
  kLinear,
  kSoftmaxFwd,
  kSoftmaxBwd
};

struct PrimKey {
  PrimOp op;
  int32_t alg;     // oneDNN algorithm where the op has several, else 0
  DT dt_a, dt_b;   // the data dtypes (src/dst or diff/dst)
  int64_t n, h;    // rows and columns (elementwise ops: n = 1, h = numel)
  uint32_t param;  // a float parameter's bits (eps, alpha), else 0
  bool operator<(const PrimKey& o) const {
    return std::tie(op, alg, dt_a, dt_b, n, h, param) < std::tie(o.op, o.alg, o.dt_a, o.dt_b, o.n, o.h, o.param);
  }
};

struct State {
  dnnl::engine engine{dnnl::engine::kind::cpu, 0};
  std::mutex mu;
  std::map<PrimKey, std::shared_ptr<const dnnl::primitive>> cache;
};

inline State& GetState() {
  static State* state = new State();  // never destroyed: kernels may run until exit
  return *state;
}

// Thrown when oneDNN cannot create a primitive for the case; the kernel turns
// it into TEFL_UNSUPPORTED (nothing has been written yet).
struct Unsupported {
  std::string msg;
};

inline dnnl::memory::data_type DnnlType(DT dt) {
  return dt == DT::kBF16  ? dnnl::memory::data_type::bf16
         : dt == DT::kF16 ? dnnl::memory::data_type::f16
                          : dnnl::memory::data_type::f32;
}

inline float FloatOfBits(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}
inline uint32_t BitsOfFloat(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

// The cached primitive for `key`, made by `make` on first use. A dnnl::error
// from `make` means oneDNN does not implement the case: Unsupported.
using PrimitiveMaker = dnnl::primitive (*)(const dnnl::engine& engine, const PrimKey& key);
inline std::shared_ptr<const dnnl::primitive> CachedPrimitive(const PrimKey& key, PrimitiveMaker make,
                                                              const char* what) {
  State& st = GetState();
  {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.cache.find(key);
    if (it != st.cache.end()) return it->second;
  }
  std::shared_ptr<const dnnl::primitive> prim;
  try {
    prim = std::make_shared<const dnnl::primitive>(make(st.engine, key));
  } catch (const dnnl::error& e) {
    throw Unsupported{std::string("no oneDNN ") + what + " primitive for this case: " + e.what()};
  }
  std::lock_guard<std::mutex> lock(st.mu);
  return st.cache.emplace(key, prim).first->second;
}

inline dnnl::stream& ThreadStream() {
  thread_local dnnl::stream stream(GetState().engine);
  return stream;
}

struct Dims {
  int64_t n = 1, h = 0;
};
inline Dims RowsCols(const DLTensor* x) {
  Dims d;
  d.h = x->shape[x->ndim - 1];
  for (int32_t i = 0; i + 1 < x->ndim; ++i) d.n *= x->shape[i];
  return d;
}
inline int64_t NumElements(const DLTensor* t) {
  int64_t n = 1;
  for (int32_t i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

inline dnnl::memory::desc DataDesc(DT dt, int64_t n, int64_t h) {
  return dnnl::memory::desc({n, h}, DnnlType(dt), dnnl::memory::format_tag::ab);
}
inline dnnl::memory::desc VecDesc(int64_t n, DT dt = DT::kF32) {
  return dnnl::memory::desc({n}, DnnlType(dt), dnnl::memory::format_tag::a);
}

// Runs a kernel body; no C++ exception crosses the C ABI.
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

// supports(): every named input and output present and compact row-major.
inline int32_t SupportsPresentCompact(const tefl_call_frame* frame, const char* const* in_names, int n_in,
                                      const char* const* out_names, int n_out, char* why, size_t len) {
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

// Whether every element of a float32/bfloat16 tensor of n elements has
// |x| <= limit (a NaN fails). One read, split over the host's threads; the
// inner loop has no early exit so that it vectorises.
struct MagnitudeScan {
  const void* data;
  DT dt;
  float limit;
  std::atomic<bool> ok{true};
};
inline void ScanChunk(void* ctx, int64_t begin, int64_t end) {
  auto* s = static_cast<MagnitudeScan*>(ctx);
  constexpr int64_t kBlock = 4096;
  for (int64_t b = begin * kBlock; b < end * kBlock && s->ok.load(std::memory_order_relaxed); b += kBlock) {
    bool ok = true;
    if (s->dt == DT::kF32) {
      const float* p = static_cast<const float*>(s->data);
      for (int64_t i = b; i < b + kBlock; ++i) ok &= std::fabs(p[i]) <= s->limit;
    } else {
      const uint16_t* p = static_cast<const uint16_t*>(s->data);
      for (int64_t i = b; i < b + kBlock; ++i) ok &= std::fabs(Bf16ToF32(p[i])) <= s->limit;
    }
    if (!ok) s->ok.store(false, std::memory_order_relaxed);
  }
}
inline bool AllWithin(const tefl_host_services* host, const void* data, DT dt, int64_t n, float limit) {
  MagnitudeScan scan{data, dt, limit};
  constexpr int64_t kBlock = 4096;
  const int64_t full = n / kBlock;
  if (full > 0) host->parallel_for(full, 16, ScanChunk, &scan);
  bool ok = scan.ok.load();
  for (int64_t i = full * kBlock; i < n && ok; ++i) ok = std::fabs(LoadF(data, dt, i)) <= limit;
  return ok;
}

// One registration entry of a family file.
inline tefl_impl_desc VendorDesc(const char* op, tefl_kernel_fn kernel, tefl_supports_fn supports) {
  return tefl_impl_desc{TEFL_IMPL_DESC_STRUCT_SIZE, op,     "vendor.onednn", TEFL_KIND_VENDOR, 100, "onednn",
                        TEFL_DEVICE_BIT(kDLCPU),    kernel, supports,        nullptr};
}

// Per family (one file each); each registers its ops and returns the first error.
tefl_status* RegisterNormalization(const tefl_registrar* registrar);
tefl_status* RegisterActivation(const tefl_registrar* registrar);
tefl_status* RegisterSoftmax(const tefl_registrar* registrar);
tefl_status* RegisterGemm(const tefl_registrar* registrar);

}  // namespace onednn_plugin

#endif  // TEFL_PLUGINS_ONEDNN_COMMON_H_
