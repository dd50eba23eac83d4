// Small helpers every in-tree backend file shares (reference and portable):
// element views of float tensors, row counts, dtype tests, and the error
// status a kernel returns.
#ifndef TEFL_SRC_BACKENDS_KERNEL_SUPPORT_H_
#define TEFL_SRC_BACKENDS_KERNEL_SUPPORT_H_

#include <cstddef>
#include <cstdint>
#include <cstdio>

#include "core/dtype.h"
#include "tefl/tefl.h"

namespace tefl::backends {

// A flat element view of a tensor of any float dtype (reference kernels:
// every element read as double, each output rounded once).
struct Matrix {
  void* data;
  DType dtype;
  double at(int64_t i) const { return LoadAsFloat(data, i, dtype); }
  void set(int64_t i, double v) const { StoreFromDouble(data, i, dtype, v); }
};
inline Matrix View(const DLTensor* t) { return Matrix{DataPtr(t), DTypeOf(t->dtype)}; }

// N = the product of every dim but the last: the rows a kernel visits. 0
// when the last dim is 0: rows without elements need no visit, and there
// may be 2^60 of them ([2^60, 0]) or more than int64 counts ([2^62, 4, 0]);
// the ops with per-row outputs (the norms) require a last dim >= 1.
inline int64_t LeadingRows(const DLTensor* x) {
  return x->ndim == 0 || x->shape[x->ndim - 1] == 0 ? 0 : DimProduct(x->shape, 0, x->ndim - 1);
}

inline bool IsFloatType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }
// Bytes of one element of a float type (fp32 4, fp16/bf16 2).
inline size_t FloatElemSize(DType t) { return t == DType::kF32 ? 4 : 2; }

// Buffers a kernel keeps in the calling thread between calls (a fresh buffer
// costs its page faults, ~1-1.5 us per 4 KiB page, on every call) are freed
// on return when a call leaves more than this in them (gemm.cpp's workspace,
// attention.cpp's packed operands).
constexpr size_t kKeptBufferBytes = size_t(256) << 20;

// The calling thread's kept buffers of type W (default-constructible, with
// Bytes()) for the scope of one call: on scope exit they are freed when they
// hold more than kKeptBufferBytes, else kept for the thread's next call.
template <class W>
class ThreadKept {
 public:
  ThreadKept() : w_(Kept()) {}
  ~ThreadKept() {
    if (w_.Bytes() > kKeptBufferBytes) w_ = W();
  }
  ThreadKept(const ThreadKept&) = delete;
  ThreadKept& operator=(const ThreadKept&) = delete;
  W& operator*() { return w_; }
  W* operator->() { return &w_; }

 private:
  static W& Kept() {
    thread_local W w;
    return w;
  }
  W& w_;
};

// "<op> (<impl>): <what>" as a host status. No allocation: kernels call it
// from catch blocks too (nothing may escape a kernel).
inline tefl_status* KernelStatus(const tefl_call_frame* f, const char* impl, const char* family, int32_t code,
                                 const char* what) noexcept {
  char msg[256];
  std::snprintf(msg, sizeof(msg), "%s (%s): %s", f->op_name ? f->op_name : family, impl, what);
  return f->host->status_new(code, msg);
}

}  // namespace tefl::backends

#endif  // TEFL_SRC_BACKENDS_KERNEL_SUPPORT_H_
