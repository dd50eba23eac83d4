/* A test plugin (some variants omit the entry that uses the kernels, hence
 * "unused"), built in several variants (one compile definition each) to
 * exercise the loader: a good one and one per way a plugin can be broken. */
#ifdef CALLS_IN_REGISTER
#define _GNU_SOURCE /* RTLD_DEFAULT; before any system header */
#include <dlfcn.h>
#include <string.h>
#endif
#include <math.h>
#include <stdio.h>

#include "tefl/ops.h"
#include "tefl/tefl.h"

#define EXPORT TEFL_PLUGIN_EXPORT

#ifndef PLUGIN_NAME
#define PLUGIN_NAME "testgood"
#endif
#ifndef IMPL_VENDOR
#define IMPL_VENDOR PLUGIN_NAME
#endif
#ifndef ABI_MAJOR_DELTA
#define ABI_MAJOR_DELTA 0
#endif
#ifndef ABI_MINOR_DELTA
#define ABI_MINOR_DELTA 0
#endif

/* fp32 RMSNorm over compact tensors. */
__attribute__((unused)) static tefl_status* RmsNorm(const tefl_call_frame* f, void* user_data) {
  (void)user_data;
  const DLTensor* x = f->inputs[0];
  const DLTensor* g = f->inputs[1];
  const tefl_norm_fwd_attrs* a = (const tefl_norm_fwd_attrs*)f->attrs;
  const int64_t h = x->shape[x->ndim - 1];
  int64_t rows = 1;
  for (int d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
  const float* xp = (const float*)((const char*)x->data + x->byte_offset);
  const float* gp = (const float*)((const char*)g->data + g->byte_offset);
  float* zp = (float*)((char*)f->outputs[0]->data + f->outputs[0]->byte_offset);
  float* rp = (float*)((char*)f->outputs[1]->data + f->outputs[1]->byte_offset);
#ifdef KERNEL_FAILS
  /* Fails every call before writing (for `tefl check`'s test). */
  return f->host->status_new(TEFL_RUNTIME_ERROR, PLUGIN_NAME ": device lost");
#endif
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < h; ++j) ss += (double)xp[r * h + j] * xp[r * h + j];
    double inv = 1.0 / sqrt(ss / (double)h + a->eps);
#ifdef WRONG_RESULT
    /* Deliberately wrong (for `tefl check`'s test): the last row is 0.1% off. */
    if (r == rows - 1) inv *= 1.001;
#endif
    for (int64_t j = 0; j < h; ++j)
      zp[r * h + j] = (float)(xp[r * h + j] * inv * (gp[j] + (a->zero_centered_gamma ? 1.0 : 0.0)));
    rp[r] = (float)inv;
  }
  return NULL;
}

__attribute__((unused)) static int32_t Fp32Only(const tefl_call_frame* f, void* user_data, char* why, size_t len) {
  (void)user_data;
  for (int i = 0; i < 2; ++i) {
    if (f->inputs[i]->dtype.code != kDLFloat || f->inputs[i]->dtype.bits != 32) {
      snprintf(why, len, PLUGIN_NAME " handles float32 only");
      return 0;
    }
  }
  if (f->outputs[0]->dtype.code != kDLFloat || f->outputs[0]->dtype.bits != 32) {
    snprintf(why, len, PLUGIN_NAME " handles float32 only");
    return 0;
  }
  return 1;
}

#ifndef OMIT_INFO
EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) {
  static tefl_plugin_metadata info = {
      TEFL_PLUGIN_METADATA_STRUCT_SIZE, PLUGIN_NAME, "0.1.0", "testvendor", TEFL_ABI_MAJOR + ABI_MAJOR_DELTA,
      TEFL_ABI_MINOR + ABI_MINOR_DELTA};
  return &info;
}
#endif

#ifndef OMIT_REGISTER
EXPORT tefl_status* tefl_plugin_register(const tefl_host_services* host, const tefl_registrar* registrar) {
  (void)host;
  tefl_impl_desc desc = {TEFL_IMPL_DESC_STRUCT_SIZE,
                         "rmsnorm_fwd",
                         "vendor." PLUGIN_NAME,
                         TEFL_KIND_VENDOR,
                         300,
                         IMPL_VENDOR,
                         TEFL_DEVICE_BIT(kDLCPU),
                         RmsNorm,
                         Fp32Only,
                         NULL};
#ifdef CALLS_IN_REGISTER
  {
    /* what the guide forbids: dispatching an op while registering. It waited
     * forever on the initialisation loading this plugin; now it fails. */
    typedef tefl_status* (*call_fn)(int32_t, const DLTensor* const*, int32_t, DLTensor* const*, int32_t, const void*,
                                    void*);
    typedef int32_t (*op_id_fn)(const char*);
    call_fn call = NULL;
    op_id_fn op_id = NULL;
    void* sym = dlsym(RTLD_DEFAULT, "tefl_call"); /* POSIX: a function's address as void* */
    memcpy(&call, &sym, sizeof(call));
    sym = dlsym(RTLD_DEFAULT, "tefl_op_id");
    memcpy(&op_id, &sym, sizeof(op_id));
    if (call == NULL || op_id == NULL) return host->status_new(TEFL_INTERNAL, "tefl_call not found");
    tefl_status* r = call(op_id("rmsnorm_fwd"), NULL, 0, NULL, 0, NULL, NULL);
    if (r != NULL) return r;
  }
#endif
#ifdef SMALL_DESC
  desc.struct_size = 8; /* a descriptor tefl cannot read: refused with both sizes named */
#endif
  tefl_status* s = registrar->register_impl(registrar->ctx, &desc);
  if (s != NULL) return s;
#ifdef INCOMPLETE_RUNTIME
  {
    /* a device runtime without its functions: refused at registration, never called through NULL */
    tefl_device_runtime rt = {TEFL_DEVICE_RUNTIME_STRUCT_SIZE, kDLExtDev, "incomplete", NULL, NULL, NULL, NULL, NULL,
                              NULL, NULL};
    s = registrar->register_device_runtime(registrar->ctx, &rt);
    if (s != NULL) return s;
  }
#endif
#ifdef SECOND_IMPL
  desc.impl_id = "vendor." PLUGIN_NAME "_second";
  s = registrar->register_impl(registrar->ctx, &desc);
  if (s != NULL) return s;
#endif
#ifdef DUPLICATE_BUILTIN
  /* reference.cpp already serves rmsnorm_fwd: the whole plugin must go. */
  desc.impl_id = "reference.cpp";
  desc.kind = TEFL_KIND_REFERENCE;
  desc.vendor = NULL;
  s = registrar->register_impl(registrar->ctx, &desc);
  if (s != NULL) return s;
#endif
#ifdef RETURN_ERROR
  return host->status_new(TEFL_RUNTIME_ERROR, "no device found");
#endif
  return NULL;
}
#endif
