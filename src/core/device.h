// Device runtimes, one per DLPack device type (process-wide). The CPU runtime
// is built in; vendor backends and plugins register theirs.
#ifndef TEFL_SRC_CORE_DEVICE_H_
#define TEFL_SRC_CORE_DEVICE_H_

#include "tefl/tefl.h"

namespace tefl {

constexpr int kMaxDeviceTypes = 64;  // device_mask has 64 bits

// The runtime for a device type, or NULL. Lock-free read. The built-in CPU
// runtime is always there: the first lookup or registration of the process
// registers it (once, thread-safely), no manager needed.
const tefl_device_runtime* DeviceRuntime(int32_t device_type);
// NULL when `runtime` is a complete table (ABI 1.0's struct_size at least,
// device_type in range, a name, every function set); else the error, which
// names the field.
tefl_status* CheckDeviceRuntime(const tefl_device_runtime* runtime);
// Copies the table (CheckDeviceRuntime first). Registering the same name
// for a type again is a no-op; another name for a registered type is
// ALREADY_EXISTS.
tefl_status* RegisterDeviceRuntime(const tefl_device_runtime* runtime);
// Registers the CPU runtime (idempotent; every lookup and registration
// does it first, so calling it is never needed for correctness).
void RegisterCpuRuntime();
// The built-in CPU runtime's table (device_cpu.cpp).
const tefl_device_runtime& CpuDeviceRuntime();
// "cpu", "cuda", ... ; the runtime's name when registered, else DLPack's.
const char* DeviceTypeName(int32_t device_type);

}  // namespace tefl

#endif  // TEFL_SRC_CORE_DEVICE_H_
