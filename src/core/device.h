// Device runtimes, one per DLPack device type (process-wide). The CPU runtime
// is built in; vendor backends and plugins register theirs.
#ifndef TEFL_SRC_CORE_DEVICE_H_
#define TEFL_SRC_CORE_DEVICE_H_

#include "tefl/tefl.h"

namespace tefl {

constexpr int kMaxDeviceTypes = 64;  // device_mask has 64 bits

// The runtime for a device type, or NULL. Lock-free read.
const tefl_device_runtime* DeviceRuntime(int32_t device_type);
// Copies the table (struct_size may be smaller: missing functions are NULL).
// Errors: type out of range, already registered with another name.
tefl_status* RegisterDeviceRuntime(const tefl_device_runtime* runtime);
// Registers the CPU runtime (idempotent).
void RegisterCpuRuntime();
// "cpu", "cuda", ... ; the runtime's name when registered, else DLPack's.
const char* DeviceTypeName(int32_t device_type);

}  // namespace tefl

#endif  // TEFL_SRC_CORE_DEVICE_H_
