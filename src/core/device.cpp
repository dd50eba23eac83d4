#include "core/device.h"

#include <atomic>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

namespace tefl {
namespace {

struct RuntimeRecord {
  tefl_device_runtime table;
  std::string name;
};
std::atomic<const RuntimeRecord*> g_runtimes[kMaxDeviceTypes];
std::mutex g_mu;

tefl_status* Register(const tefl_device_runtime* runtime);

// The built-in runtimes (the CPU's) are in the table before anything reads
// or adds to it: registered once, by the first lookup or registration of
// the process, whichever thread makes it.
std::once_flag g_builtin_once;
std::atomic<bool> g_builtin_ready{false};
void EnsureBuiltinRuntimes() {
  if (g_builtin_ready.load(std::memory_order_acquire)) return;
  std::call_once(g_builtin_once, [] {
    tefl_status_free(Register(&CpuDeviceRuntime()));
    g_builtin_ready.store(true, std::memory_order_release);
  });
}

}  // namespace

const tefl_device_runtime* DeviceRuntime(int32_t device_type) {
  if (device_type < 0 || device_type >= kMaxDeviceTypes) return nullptr;
  EnsureBuiltinRuntimes();
  const RuntimeRecord* r = g_runtimes[device_type].load(std::memory_order_acquire);
  return r ? &r->table : nullptr;
}

tefl_status* CheckDeviceRuntime(const tefl_device_runtime* runtime) {
  auto error = [](const std::string& what) {
    return tefl_status_new(TEFL_INVALID_ARGUMENT, ("register_device_runtime: " + what).c_str());
  };
  if (runtime == nullptr) return error("runtime is NULL");
  if (runtime->struct_size < TEFL_DEVICE_RUNTIME_STRUCT_SIZE)
    return error("struct_size " + std::to_string(runtime->struct_size) + " is smaller than the ABI 1.0 table (" +
                 std::to_string(TEFL_DEVICE_RUNTIME_STRUCT_SIZE) +
                 " bytes, TEFL_DEVICE_RUNTIME_STRUCT_SIZE): every function of it is required");
  if (runtime->device_type < 0 || runtime->device_type >= kMaxDeviceTypes)
    return error("device_type " + std::to_string(runtime->device_type) + " is out of range [0, " +
                 std::to_string(kMaxDeviceTypes) + ")");
  if (runtime->name == nullptr || runtime->name[0] == '\0') return error("name is NULL or empty");
  const std::string who =
      std::string("runtime '") + runtime->name + "' (device_type " + std::to_string(runtime->device_type) + ")";
  const struct {
    bool present;
    const char* field;
  } fns[] = {{runtime->device_count != nullptr, "device_count"},
             {runtime->alloc != nullptr, "alloc"},
             {runtime->free != nullptr, "free"},
             {runtime->copy_to_device != nullptr, "copy_to_device"},
             {runtime->copy_to_host != nullptr, "copy_to_host"},
             {runtime->stream_sync != nullptr, "stream_sync"}};
  for (const auto& f : fns)
    if (!f.present) return error(who + " has no " + f.field + " (NULL): every function of the table is required");
  return nullptr;
}

void RegisterCpuRuntime() { EnsureBuiltinRuntimes(); }

tefl_status* RegisterDeviceRuntime(const tefl_device_runtime* runtime) {
  EnsureBuiltinRuntimes();
  return Register(runtime);
}

namespace {
tefl_status* Register(const tefl_device_runtime* runtime) {
  if (tefl_status* e = CheckDeviceRuntime(runtime)) return e;
  const int32_t type = runtime->device_type;
  std::lock_guard<std::mutex> lock(g_mu);
  if (const RuntimeRecord* existing = g_runtimes[type].load()) {
    const char* name = runtime->name ? runtime->name : "";
    if (existing->name == name) return nullptr;  // same runtime again: no-op
    return tefl_status_new(TEFL_ALREADY_EXISTS, ("device runtime for type " + std::to_string(type) +
                                                 " already registered as '" + existing->name + "'")
                                                    .c_str());
  }
  auto record = std::make_unique<RuntimeRecord>();
  std::memset(&record->table, 0, sizeof(record->table));
  std::memcpy(&record->table, runtime, std::min<size_t>(runtime->struct_size, TEFL_DEVICE_RUNTIME_STRUCT_SIZE));
  record->table.struct_size = TEFL_DEVICE_RUNTIME_STRUCT_SIZE;
  record->name = runtime->name ? runtime->name : "";
  record->table.name = record->name.c_str();
  g_runtimes[type].store(record.release(), std::memory_order_release);  // never freed
  return nullptr;
}
}  // namespace

const char* DeviceTypeName(int32_t device_type) {
  if (const tefl_device_runtime* rt = DeviceRuntime(device_type); rt && rt->name) return rt->name;
  switch (device_type) {
    case kDLCPU:
      return "cpu";
    case kDLCUDA:
      return "cuda";
    case kDLCUDAHost:
      return "cuda_host";
    case kDLOpenCL:
      return "opencl";
    case kDLVulkan:
      return "vulkan";
    case kDLMetal:
      return "metal";
    case kDLVPI:
      return "vpi";
    case kDLROCM:
      return "rocm";
    case kDLROCMHost:
      return "rocm_host";
    case kDLExtDev:
      return "ext_dev";
    case kDLCUDAManaged:
      return "cuda_managed";
    default:
      return "device";
  }
}

}  // namespace tefl
