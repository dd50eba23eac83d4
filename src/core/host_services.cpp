// The tefl_host_services table handed to every kernel and plugin.
#include "core/device.h"
#include "core/logging.h"
#include "core/thread_pool.h"

namespace tefl {
namespace {

void HostLog(int32_t level, const char* file, int32_t line, const char* message) {
  LogLine(level, file ? file : "plugin", line, message ? message : "");
}
int32_t HostNumThreads() { return ThreadPoolSize(); }
const tefl_device_runtime* HostDeviceRuntime(int32_t device_type) { return DeviceRuntime(device_type); }
void HostParallelFor(int64_t n, int64_t grain, tefl_parallel_body_fn body, void* ctx) {
  ParallelFor(n, grain, body, ctx);
}

const tefl_host_services kHost = {TEFL_HOST_SERVICES_STRUCT_SIZE,
                                  TEFL_ABI_MAJOR,
                                  TEFL_ABI_MINOR,
                                  tefl_status_new,
                                  tefl_status_free,
                                  tefl_status_code_of,
                                  tefl_status_message,
                                  HostLog,
                                  HostParallelFor,
                                  HostNumThreads,
                                  HostDeviceRuntime};

}  // namespace
}  // namespace tefl

extern "C" const tefl_host_services* tefl_host(void) { return &tefl::kHost; }
