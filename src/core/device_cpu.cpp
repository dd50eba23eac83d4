// The built-in CPU device runtime: aligned host allocation, memcpy, no-op sync.
#include <cstddef>
#include <cstdlib>
#include <cstring>

#include "core/device.h"

namespace tefl {
namespace {

int32_t CpuCount(void*) { return 1; }

tefl_status* CpuAlloc(void*, int32_t device_id, size_t bytes, size_t alignment, void** out) {
  if (device_id != 0) return tefl_status_new(TEFL_INVALID_ARGUMENT, "cpu: device_id must be 0");
  if (alignment < alignof(std::max_align_t)) alignment = alignof(std::max_align_t);
  if ((alignment & (alignment - 1)) != 0)
    return tefl_status_new(TEFL_INVALID_ARGUMENT, "cpu: alignment must be a power of two");
  const size_t rounded = (bytes + alignment - 1) / alignment * alignment;
  void* p = std::aligned_alloc(alignment, rounded ? rounded : alignment);
  if (p == nullptr) return tefl_status_new(TEFL_RUNTIME_ERROR, "cpu: out of memory");
  *out = p;
  return nullptr;
}

void CpuFree(void*, int32_t, void* ptr) { std::free(ptr); }

tefl_status* CpuCopy(void*, int32_t, void* dst, const void* src, size_t bytes, void*) {
  if (bytes) std::memcpy(dst, src, bytes);
  return nullptr;
}

tefl_status* CpuSync(void*, int32_t, void*) { return nullptr; }

const tefl_device_runtime kCpuRuntime = {
    TEFL_DEVICE_RUNTIME_STRUCT_SIZE, kDLCPU, "cpu", nullptr, CpuCount, CpuAlloc, CpuFree, CpuCopy, CpuCopy, CpuSync};

}  // namespace

const tefl_device_runtime& CpuDeviceRuntime() { return kCpuRuntime; }

}  // namespace tefl
