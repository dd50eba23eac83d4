#include "check/tensor.h"

#include <fmt/format.h>
#include <sys/mman.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <random>

namespace tefl::check {

namespace {

thread_local bool t_describe_only = false;

// The most bytes a tensor may take: 2^47 (128 TiB), a whole x86-64 user
// address space; a shape beyond it is a mistake, not a big call, refused
// before anything is allocated.
constexpr size_t kMaxTensorBytes = size_t(1) << 47;

std::string DescribeTensor(DType dtype, const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return fmt::format("{} tensor of shape {}]", DTypeName(dtype), s);
}

}  // namespace

DescribeOnly::DescribeOnly() : previous_(t_describe_only) { t_describe_only = true; }
DescribeOnly::~DescribeOnly() { t_describe_only = previous_; }
bool DescribingOnly() { return t_describe_only; }

void Tensor::StorageDelete::operator()(uint8_t* p) const {
  if (mapped != 0) {
    munmap(p, mapped);
  } else {
    ::operator delete[](p, std::align_val_t(64));
  }
}

void Tensor::Allocate(size_t n) {
  if (described_only_ && n >= kReserveOnlyBytes) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    storage_ = std::unique_ptr<uint8_t[], StorageDelete>(static_cast<uint8_t*>(p), StorageDelete{n});
  } else {
    storage_ = std::unique_ptr<uint8_t[], StorageDelete>(
        static_cast<uint8_t*>(::operator new[](n, std::align_val_t(64))), StorageDelete{});
  }
  storage_size_ = n;
}

Tensor::Tensor(DType dtype, std::vector<int64_t> shape) : dtype_(dtype), shape_(std::move(shape)) {
  // The element count and bytes are checked before anything is allocated: a
  // product that wraps around would allocate a few bytes and write past them.
  int64_t numel = 1;
  bool overflow = false;
  for (int64_t d : shape_) {
    if (d < 0)
      throw TensorAllocError(fmt::format("cannot allocate a {}: negative size", DescribeTensor(dtype_, shape_)));
    overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  }
  if (std::find(shape_.begin(), shape_.end(), 0) != shape_.end()) numel = 0, overflow = false;
  const size_t elem = size_t(DLTypeOf(dtype).bits / 8);
  size_t data_bytes = 0;
  if (overflow || __builtin_mul_overflow(size_t(numel), elem, &data_bytes) || data_bytes > kMaxTensorBytes)
    throw TensorAllocError(fmt::format(
        "cannot allocate a {}: {} (the most for one tensor is 2^47 bytes, 128 TiB)", DescribeTensor(dtype_, shape_),
        overflow ? std::string("its element count overflows 64 bits") : std::to_string(data_bytes) + " bytes"));
  numel_ = numel;
  described_only_ = DescribingOnly();
  try {
    Allocate(data_bytes + 2 * kGuard);
  } catch (const std::bad_alloc&) {
    throw TensorAllocError(
        fmt::format("cannot allocate {} bytes for a {}", data_bytes + 2 * kGuard, DescribeTensor(dtype_, shape_)));
  }
  Bind();
  if (described_only_) return;
  std::memset(storage_.get(), 0xA5, storage_size_);
  std::memset(bytes(), 0, data_bytes);
}

Tensor::Tensor(const Tensor& other)
    : dtype_(other.dtype_), shape_(other.shape_), numel_(other.numel_), described_only_(other.described_only_) {
  if (other.storage_) {
    Allocate(other.storage_size_);
    if (!described_only_ || storage_size_ <= kDescribedCopyLimit)
      std::memcpy(storage_.get(), other.storage_.get(), storage_size_);
  }
  Bind();
}

Tensor& Tensor::operator=(const Tensor& other) {
  if (this != &other) *this = Tensor(other);
  return *this;
}

Tensor::Tensor(Tensor&& other) noexcept
    : dtype_(other.dtype_),
      shape_(std::move(other.shape_)),
      numel_(other.numel_),
      described_only_(other.described_only_),
      storage_(std::move(other.storage_)),
      storage_size_(other.storage_size_) {
  Bind();
  other.numel_ = 0;
  other.storage_size_ = 0;
  other.Bind();
}

Tensor& Tensor::operator=(Tensor&& other) noexcept {
  if (this == &other) return *this;
  dtype_ = other.dtype_;
  shape_ = std::move(other.shape_);
  numel_ = other.numel_;
  described_only_ = other.described_only_;
  storage_ = std::move(other.storage_);
  storage_size_ = other.storage_size_;
  Bind();
  other.numel_ = 0;
  other.storage_size_ = 0;
  other.Bind();
  return *this;
}

void Tensor::Bind() {
  dl_ = DLTensor{};
  dl_.data = storage_ ? storage_.get() + kGuard : nullptr;
  dl_.device = {kDLCPU, 0};
  dl_.ndim = int(shape_.size());
  dl_.dtype = DLTypeOf(dtype_);
  dl_.shape = shape_.data();
  dl_.strides = nullptr;
}

Tensor& Tensor::Uniform(const std::string& name, double lo, double hi) {
  if (described_only_) return *this;
  std::mt19937_64 rng(std::hash<std::string>{}(name));
  std::uniform_real_distribution<double> dist(lo, hi);
  for (int64_t i = 0; i < numel_; ++i) set(i, dist(rng));
  return *this;
}

Tensor& Tensor::Fill(double v) {
  if (described_only_) return *this;
  for (int64_t i = 0; i < numel_; ++i) set(i, v);
  return *this;
}

bool Tensor::GuardsIntact() const {
  if (!storage_) return true;
  for (size_t i = 0; i < kGuard; ++i) {
    if (storage_[i] != 0xA5 || storage_[storage_size_ - 1 - i] != 0xA5) return false;
  }
  return true;
}

bool Tensor::SameBytes(const Tensor& other) const {
  return nbytes() == other.nbytes() && std::memcmp(bytes(), other.bytes(), nbytes()) == 0;
}

Tolerance ToleranceFor(DType dtype) {
  switch (dtype) {
    case DType::kF16:
      return {1e-5, 1e-3};
    case DType::kBF16:
      return {1e-5, 1e-2};
    case DType::kE4M3:
    case DType::kE5M2:
      return {1e-2, 1e-2};
    default:
      return {1e-6, 5e-6};
  }
}

namespace {
// Whether a and b are the same or adjacent values of `dtype`.
bool Neighbours(double a, double b, DType dtype) {
  auto bits = [&](double v) -> int64_t {
    if (dtype == DType::kBF16) return int64_t(FloatToBF16(float(v)));
    if (dtype == DType::kF16) return int64_t(FloatToF16(float(v)));
    if (dtype == DType::kE4M3 || dtype == DType::kE5M2) {  // sign-magnitude codes: make them ordered
      const uint8_t c = FloatToFp8(float(v), dtype == DType::kE4M3 ? Fp8Format::kE4M3 : Fp8Format::kE5M2);
      return (c & 0x80) ? -int64_t(c & 0x7F) : int64_t(c);
    }
    uint32_t u = FloatBits(float(v));
    return int64_t(u);
  };
  const int64_t ba = bits(a), bb = bits(b);
  // Same sign: adjacent encodings are adjacent values.
  return std::abs(ba - bb) <= 1;
}
}  // namespace

CompareResult Compare(const Tensor& test, const Tensor& ref, Tolerance tol) {
  CompareResult r;
  for (int64_t i = 0; i < ref.numel(); ++i) {
    const double t = test.at(i), e = ref.at(i);
    bool bad;
    if (std::isnan(e) || std::isnan(t)) {
      bad = std::isnan(e) != std::isnan(t);
    } else if (std::isinf(e) || std::isinf(t)) {
      bad = t != e;
    } else {
      const double diff = std::fabs(t - e);
      const double rel = e == 0 ? 0 : diff / std::fabs(e);
      r.max_abs = std::max(r.max_abs, diff);
      if (e != 0) r.max_rel = std::max(r.max_rel, rel);
      bad = diff > tol.atol && (e == 0 || rel > tol.rtol);
      if (bad && test.dtype() != DType::kF32 && Neighbours(t, e, test.dtype())) bad = false;
    }
    if (bad) {
      if (r.first_bad < 0) r.first_bad = i;
      ++r.mismatches;
    }
  }
  return r;
}

std::string CompareResult::ToString() const {
  return fmt::format("mismatches={} max_abs={:.3g} max_rel={:.3g} first_bad={}", mismatches, max_abs, max_rel,
                     first_bad);
}

}  // namespace tefl::check
