/* The public headers compile as plain C11 and the C entry points link. */
#include <stdio.h>
#include <string.h>

#include "tefl/ops.h"
#include "tefl/tefl.h"

int main(void) {
  const tefl_host_services* host = tefl_host();
  if (host == NULL || host->abi_major != TEFL_ABI_MAJOR || host->struct_size != TEFL_HOST_SERVICES_STRUCT_SIZE) {
    fprintf(stderr, "host services table wrong\n");
    return 1;
  }
  /* The built-in CPU runtime is in the host table from the start: nothing
   * has called an op (or initialised a manager) yet. */
  const tefl_device_runtime* cpu = host->device_runtime(kDLCPU);
  if (cpu == NULL || cpu->device_type != kDLCPU || cpu->name == NULL || strcmp(cpu->name, "cpu") != 0 ||
      cpu->device_count(cpu->ctx) != 1) {
    fprintf(stderr, "the CPU device runtime is missing before the first call\n");
    return 1;
  }
  if (tefl_op_id("rmsnorm_fwd") != TEFL_OP_RMSNORM_FWD || tefl_op_id("no_such_op") != -1) {
    fprintf(stderr, "tefl_op_id wrong\n");
    return 1;
  }
  /* A call from C: rmsnorm over one row of 4. */
  float x[4] = {1, 2, 3, 4}, g[4] = {1, 1, 1, 1}, z[4] = {0}, rs[1] = {0};
  int64_t xs[2] = {1, 4}, gs[1] = {4}, rss[1] = {1};
  DLTensor tx = {x, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
  DLTensor tg = {g, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, gs, NULL, 0};
  DLTensor tz = {z, {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, NULL, 0};
  DLTensor trs = {rs, {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, rss, NULL, 0};
  const DLTensor* in[2] = {&tx, &tg};
  DLTensor* out[2] = {&tz, &trs};
  tefl_norm_fwd_attrs attrs = {TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 0.0f, 0, 0};
  tefl_status* s = tefl_call(TEFL_OP_RMSNORM_FWD, in, 2, out, 2, &attrs, NULL);
  if (s != NULL) {
    fprintf(stderr, "tefl_call failed: %s\n", tefl_status_message(s));
    tefl_status_free(s);
    return 1;
  }
  /* rsigma = 1/sqrt(30/4) */
  if (rs[0] < 0.36514f || rs[0] > 0.36515f || z[3] < 1.460590f || z[3] > 1.460597f) {
    fprintf(stderr, "wrong result %f %f\n", (double)rs[0], (double)z[3]);
    return 1;
  }
  /* An error from C carries its code and message. */
  s = tefl_call(TEFL_OP_RMSNORM_FWD, in, 1, out, 2, NULL, NULL);
  if (tefl_status_code_of(s) != TEFL_INVALID_ARGUMENT || strstr(tefl_status_message(s), "rmsnorm_fwd") == NULL) {
    fprintf(stderr, "expected an arity error, got %s\n", tefl_status_message(s));
    return 1;
  }
  tefl_status_free(s);
  /* The same call prepared once and run on another row's buffers. */
  tefl_prepared_call* prepared = NULL;
  s = tefl_prepare_call(TEFL_OP_RMSNORM_FWD, in, 2, out, 2, &attrs, &prepared);
  if (s != NULL || prepared == NULL) {
    fprintf(stderr, "tefl_prepare_call failed\n");
    return 1;
  }
  float x2[4] = {2, 4, 6, 8}, z2[4] = {0}, rs2[1] = {0};
  void* in_data[2] = {x2, g};
  void* out_data[2] = {z2, rs2};
  s = tefl_prepared_call_run(prepared, in_data, 2, out_data, 2, NULL);
  tefl_prepared_call_free(prepared);
  /* rsigma halves when x doubles; z is the same. */
  if (s != NULL || rs2[0] < 0.18257f || rs2[0] > 0.182575f || z2[3] != z[3]) {
    fprintf(stderr, "prepared run wrong %f %f\n", (double)rs2[0], (double)z2[3]);
    return 1;
  }
  printf("1 passed, 0 failed\n");
  return 0;
}
