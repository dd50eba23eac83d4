/* myvendor — an out-of-tree tefl plugin in plain C11.
 *
 * TE-FL's out-of-tree example as a shared library: one implementation of
 * rmsnorm_fwd, impl_id "vendor.myvendor" (kind vendor, vendor "myvendor",
 * priority 200), on the CPU, for float32 x, gamma and z.
 *
 *   in (x[N.., H], gamma[H]) -> out (z[N.., H], rsigma[N] f32)
 *   rsigma = 1 / sqrt(mean(x^2) + eps)
 *   z      = x * rsigma * (gamma + (zero_centered_gamma ? 1 : 0))
 *
 * The sum of squares accumulates in double; everything else is float32.
 * The plugin exports exactly two symbols (tefl_plugin_info and
 * tefl_plugin_register); everything else is static or hidden. It reaches the
 * host only through the services table it is given, so it does not link
 * libtefl. */
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <tefl/ops.h>
#include <tefl/tefl.h>

/* ---- Helpers ------------------------------------------------------------ */

static int is_f32(const DLTensor* t) {
  return t != NULL && t->dtype.code == kDLFloat && t->dtype.bits == 32 && t->dtype.lanes == 1;
}

static const char* dtype_name(DLDataType d, char* buf, size_t len) {
  if (d.lanes == 1) {
    if (d.code == kDLFloat && d.bits == 16) return "float16";
    if (d.code == kDLFloat && d.bits == 32) return "float32";
    if (d.code == kDLFloat && d.bits == 64) return "float64";
    if (d.code == kDLBfloat && d.bits == 16) return "bfloat16";
    if (d.code == TEFL_DL_FLOAT8_E4M3FN && d.bits == 8) return "float8_e4m3fn";
    if (d.code == TEFL_DL_FLOAT8_E5M2 && d.bits == 8) return "float8_e5m2";
    if (d.code == kDLInt) {
      snprintf(buf, len, "int%u", (unsigned)d.bits);
      return buf;
    }
    if (d.code == kDLUInt) {
      snprintf(buf, len, "uint%u", (unsigned)d.bits);
      return buf;
    }
  }
  snprintf(buf, len, "dtype(code=%u, bits=%u, lanes=%u)", (unsigned)d.code, (unsigned)d.bits, (unsigned)d.lanes);
  return buf;
}

/* Compact row-major: no strides, or strides equal to the compact ones. */
static int is_compact(const DLTensor* t) {
  if (t->strides == NULL) return 1;
  int64_t expected = 1;
  for (int32_t d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != expected) return 0;
    expected *= t->shape[d];
  }
  return 1;
}

static void* data_of(const DLTensor* t) { return (char*)t->data + t->byte_offset; }

/* ---- supports(): which calls this implementation serves ----------------- */

static int32_t myvendor_rmsnorm_supports(const tefl_call_frame* frame, void* user_data, char* why, size_t why_len) {
  (void)user_data;
  if (frame->num_inputs < 2 || frame->num_outputs < 2 || frame->inputs[0] == NULL || frame->inputs[1] == NULL ||
      frame->outputs[0] == NULL || frame->outputs[1] == NULL) {
    if (why_len > 0) snprintf(why, why_len, "myvendor needs x, gamma, z and rsigma");
    return 0;
  }
  const struct {
    const DLTensor* t;
    const char* role;
  } tensors[3] = {{frame->inputs[0], "x"}, {frame->inputs[1], "gamma"}, {frame->outputs[0], "z"}};
  for (int i = 0; i < 3; ++i) {
    if (!is_f32(tensors[i].t)) {
      char buf[64];
      if (why_len > 0)
        snprintf(why, why_len, "myvendor handles float32 x, gamma and z only, got %s %s",
                 dtype_name(tensors[i].t->dtype, buf, sizeof buf), tensors[i].role);
      return 0;
    }
  }
  const DLTensor* all[4] = {frame->inputs[0], frame->inputs[1], frame->outputs[0], frame->outputs[1]};
  static const char* const names[4] = {"x", "gamma", "z", "rsigma"};
  for (int i = 0; i < 4; ++i) {
    if (!is_compact(all[i])) {
      if (why_len > 0)
        snprintf(why, why_len, "myvendor handles compact row-major tensors only, %s is strided", names[i]);
      return 0;
    }
  }
  return 1;
}

/* ---- The kernel ---------------------------------------------------------- */

typedef struct rmsnorm_job {
  const float* x;
  const float* gamma;
  float* z;
  float* rsigma;
  int64_t cols;
  float eps;
  float gamma_offset; /* 1 with zero_centered_gamma, else 0 */
} rmsnorm_job;

static void rmsnorm_rows(void* ctx, int64_t begin, int64_t end) {
  const rmsnorm_job* job = (const rmsnorm_job*)ctx;
  const int64_t cols = job->cols;
  for (int64_t r = begin; r < end; ++r) {
    const float* x = job->x + r * cols;
    float* z = job->z + r * cols;
    double sum_sq = 0.0;
    for (int64_t j = 0; j < cols; ++j) sum_sq += (double)x[j] * (double)x[j];
    const float rs = (float)(1.0 / sqrt(sum_sq / (double)cols + (double)job->eps));
    for (int64_t j = 0; j < cols; ++j) z[j] = x[j] * rs * (job->gamma[j] + job->gamma_offset);
    job->rsigma[r] = rs;
  }
}

static tefl_status* myvendor_rmsnorm_fwd(const tefl_call_frame* frame, void* user_data) {
  (void)user_data;
  const tefl_host_services* host = frame->host;
  const DLTensor* x = frame->inputs[0];
  const DLTensor* gamma = frame->inputs[1];
  DLTensor* z = frame->outputs[0];
  DLTensor* rsigma = frame->outputs[1];
  if (x->ndim < 1) return host->status_new(TEFL_INVALID_ARGUMENT, "myvendor rmsnorm_fwd: x must have rank >= 1");

  /* Defaults, then whatever the attribute struct carries. */
  float eps = 1e-5f;
  int32_t zero_centered = 0;
  const tefl_norm_fwd_attrs* attrs = (const tefl_norm_fwd_attrs*)frame->attrs;
  if (attrs != NULL) {
    if (attrs->struct_size >= TEFL_STRUCT_SIZE(tefl_norm_fwd_attrs, eps)) eps = attrs->eps;
    if (attrs->struct_size >= TEFL_STRUCT_SIZE(tefl_norm_fwd_attrs, zero_centered_gamma))
      zero_centered = attrs->zero_centered_gamma;
  }

  rmsnorm_job job;
  job.x = (const float*)data_of(x);
  job.gamma = (const float*)data_of(gamma);
  job.z = (float*)data_of(z);
  job.rsigma = (float*)data_of(rsigma);
  job.cols = x->shape[x->ndim - 1];
  job.eps = eps;
  job.gamma_offset = zero_centered ? 1.0f : 0.0f;
  int64_t rows = 1;
  for (int32_t d = 0; d + 1 < x->ndim; ++d) rows *= x->shape[d];
  if (rows == 0) return NULL;
  if (job.cols <= 0) return host->status_new(TEFL_INVALID_ARGUMENT, "myvendor rmsnorm_fwd: hidden size must be > 0");

  /* Rows in parallel on the host's pool when it offers one. */
  if (host->struct_size >= TEFL_STRUCT_SIZE(tefl_host_services, parallel_for) && host->parallel_for != NULL) {
    int64_t grain = 16384 / job.cols;
    if (grain < 1) grain = 1;
    host->parallel_for(rows, grain, rmsnorm_rows, &job);
  } else {
    rmsnorm_rows(&job, 0, rows);
  }
  return NULL;
}

/* ---- Entry points ----------------------------------------------------------- */

TEFL_PLUGIN_EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) {
  static const tefl_plugin_metadata info = {
      TEFL_PLUGIN_METADATA_STRUCT_SIZE, "myvendor", "1.0.0", "myvendor", TEFL_ABI_MAJOR, TEFL_ABI_MINOR,
  };
  return &info;
}

TEFL_PLUGIN_EXPORT tefl_status* tefl_plugin_register(const tefl_host_services* host, const tefl_registrar* registrar) {
  /* The host checked tefl_plugin_info's ABI version before calling. */
  if (registrar == NULL || registrar->struct_size < TEFL_STRUCT_SIZE(tefl_registrar, register_impl))
    return host->status_new(TEFL_INVALID_ARGUMENT, "myvendor: the registrar has no register_impl");
  const tefl_impl_desc desc = {
      TEFL_IMPL_DESC_STRUCT_SIZE,
      "rmsnorm_fwd",
      "vendor.myvendor",
      TEFL_KIND_VENDOR,
      200,
      "myvendor",
      TEFL_DEVICE_BIT(kDLCPU),
      myvendor_rmsnorm_fwd,
      myvendor_rmsnorm_supports,
      NULL,
  };
  return registrar->register_impl(registrar->ctx, &desc);
}
