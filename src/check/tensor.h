// Host tensors for checking implementations: owning, any dtype, 64-byte
// aligned data with guard bytes around it, deterministic fill, and TransformerEngine's
// comparison rule (spec/ops.md, Tolerances). Used by `tefl check`, the demo
// and the test suites.
#ifndef TEFL_SRC_CHECK_TENSOR_H_
#define TEFL_SRC_CHECK_TENSOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace tefl::check {

// Thrown by Tensor's constructor when the shape's bytes cannot be allocated
// (more than fits in memory, or than a 64-bit size holds); the message names
// the dtype, the shape and the bytes.
struct TensorAllocError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// While a DescribeOnly is alive on this thread, Tensors are created for
// describing a call, never for running one (`tefl explain`): their storage
// is allocated but not written (no guard pattern, no zeroing), so pages never
// touched are never faulted in; Uniform and Fill do nothing on them, and a
// copy copies the bytes only of a small tensor (where set() wrote values that
// matter, e.g. group sizes). Nestable.
class DescribeOnly {
 public:
  DescribeOnly();
  ~DescribeOnly();
  DescribeOnly(const DescribeOnly&) = delete;
  DescribeOnly& operator=(const DescribeOnly&) = delete;

 private:
  bool previous_;
};
// Whether a DescribeOnly is alive on this thread.
bool DescribingOnly();

// 64-byte aligned storage: data starts a whole guard (64 bytes) in, so it is
// aligned as a framework's tensors are (torch's CPU allocator aligns to 64)
// and kernels take the paths they take there (streaming stores need it).
class Tensor {
 public:
  Tensor() = default;
  // Throws TensorAllocError when the bytes cannot be allocated.
  Tensor(DType dtype, std::vector<int64_t> shape);
  Tensor(const Tensor& other);
  Tensor& operator=(const Tensor& other);
  Tensor(Tensor&& other) noexcept;
  Tensor& operator=(Tensor&& other) noexcept;

  DLTensor& dl() { return dl_; }
  const DLTensor& dl() const { return dl_; }
  DLTensor* ptr() { return &dl_; }
  DType dtype() const { return dtype_; }
  int64_t numel() const { return numel_; }
  const std::vector<int64_t>& shape() const { return shape_; }
  double at(int64_t i) const { return LoadAsFloat(bytes(), i, dtype_); }
  void set(int64_t i, double v) { StoreFromDouble(bytes(), i, dtype_, v); }
  void* bytes() const { return storage_ ? storage_.get() + kGuard : nullptr; }
  size_t nbytes() const { return size_t(numel_) * size_t(dl_.dtype.bits / 8); }

  // Created under DescribeOnly: the data was never initialised.
  bool described_only() const { return described_only_; }

  // Uniform in [lo, hi) from a seed derived from `name` (deterministic).
  Tensor& Uniform(const std::string& name, double lo = -2.0, double hi = 1.0);
  Tensor& Fill(double v);
  // Whether the guard bytes around the data are intact (no out-of-bounds write).
  bool GuardsIntact() const;
  // Bytes of the data region equal to another tensor's.
  bool SameBytes(const Tensor& other) const;

 private:
  static constexpr size_t kGuard = 64;
  // A described-only tensor's copy copies its bytes only up to this size.
  static constexpr size_t kDescribedCopyLimit = size_t(1) << 16;
  // storage_ of n bytes, 64-byte aligned, uninitialised. For a described-only
  // tensor of at least kReserveOnlyBytes, address space reserved without
  // committing memory (mmap MAP_NORESERVE): explain's call is never run, so a
  // shape larger than this machine's memory can still be described.
  void Allocate(size_t n);
  static constexpr size_t kReserveOnlyBytes = size_t(1) << 20;
  void Bind();
  DType dtype_ = DType::kF32;
  std::vector<int64_t> shape_;
  int64_t numel_ = 0;
  bool described_only_ = false;
  // Copied with memcpy: a std::vector with an aligning allocator copies and
  // destroys byte by byte (allocator_traits::construct), which unoptimised
  // sanitizer builds run at a few ns per byte.
  struct StorageDelete {
    size_t mapped;  // bytes of an mmap'd reservation, else 0 (operator new[]); value-initialised: 0
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t[], StorageDelete> storage_;
  size_t storage_size_ = 0;
  DLTensor dl_{};
};

struct Tolerance {
  double atol, rtol;
};
// TE's element tolerances for an output dtype.
Tolerance ToleranceFor(DType dtype);

struct CompareResult {
  int64_t mismatches = 0;
  double max_abs = 0, max_rel = 0;
  int64_t first_bad = -1;
  std::string ToString() const;
};
// Mismatch when |t - r| > atol and (r == 0 or |t - r|/|r| > rtol), forgiven
// for non-fp32 outputs when t and r are neighbouring representable values.
// NaN must match NaN, inf must match the same inf.
CompareResult Compare(const Tensor& test, const Tensor& ref, Tolerance tol);

}  // namespace tefl::check

#endif  // TEFL_SRC_CHECK_TENSOR_H_
