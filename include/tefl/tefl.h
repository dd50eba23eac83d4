/* tefl — the stable C ABI (C11).
 *
 * Everything a kernel, a plugin or a C caller sees is declared here and in
 * <tefl/ops.h>. Contracts:
 *  - Tensors are DLPack DLTensors (<dlpack/dlpack.h> from libdlpack-dev).
 *    strides == NULL means compact row-major.
 *  - Every ABI struct starts with `size_t struct_size`. Fields are only ever
 *    appended (layout pinned by static asserts below); a reader accepts a
 *    larger struct and fills defaults for fields a smaller one lacks.
 *    Writers set struct_size with the TEFL_*_STRUCT_SIZE constants (offset of
 *    the last field + its size), never sizeof: sizeof counts tail padding,
 *    which a later version would read as an appended field.
 *  - Errors cross the boundary as opaque `tefl_status*`: NULL means success.
 *    A non-NULL status is owned by whoever receives it and is released with
 *    tefl_status_free() (or host->status_free inside a plugin).
 *  - ABI version: a different TEFL_ABI_MAJOR is incompatible; a host with a
 *    newer TEFL_ABI_MINOR than a plugin serves it unchanged.
 */
#ifndef TEFL_TEFL_H_
#define TEFL_TEFL_H_

#include <dlpack/dlpack.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#define TEFL_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define TEFL_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#if defined(_WIN32)
#define TEFL_API __declspec(dllexport)
#else
#define TEFL_API __attribute__((visibility("default")))
#endif

#define TEFL_ABI_MAJOR 1
#define TEFL_ABI_MINOR 0

/* The struct layouts below (pinned by offset asserts) are those of a 64-bit
 * LP64 target. */
TEFL_STATIC_ASSERT(sizeof(void*) == 8 && sizeof(size_t) == 8, "tefl's C ABI requires a 64-bit (LP64) target");

/* Bytes of `type` up to and including `last_field` (PJRT's rule). */
#define TEFL_STRUCT_SIZE(type, last_field) (offsetof(type, last_field) + sizeof(((type*)0)->last_field))

/* ---- Data types --------------------------------------------------------
 * DLPack 1.1 standardised these codes; the Debian header (DLPack 0.6)
 * predates them, so tefl defines exactly those numeric values. */
#define TEFL_DL_FLOAT8_E4M3FN 10  /* bits 8, max 448, no inf */
#define TEFL_DL_FLOAT8_E5M2 12    /* bits 8, max 57344 */
#define TEFL_DL_FLOAT8_E8M0FNU 14 /* bits 8, scale exponent */
#define TEFL_DL_FLOAT4_E2M1FN 17  /* bits 4 */
#define TEFL_DL_BOOL 6            /* DLPack >= 0.8 kDLBool, bits 8 */

/* ---- Status ---------------------------------------------------------- */
typedef enum tefl_status_code {
  TEFL_OK = 0,
  /* Declined before touching any output: always safe to try another
   * implementation. */
  TEFL_UNSUPPORTED = 1,
  TEFL_INVALID_ARGUMENT = 2,
  TEFL_NOT_FOUND = 3,
  TEFL_ALREADY_EXISTS = 4,
  TEFL_FAILED_PRECONDITION = 5,
  TEFL_RUNTIME_ERROR = 6,
  TEFL_INTERNAL = 7,
  TEFL_ABI_MISMATCH = 8
} tefl_status_code;

typedef struct tefl_status tefl_status; /* opaque; NULL == success */

/* A new status the caller owns (free it, or return it to tefl, which then
 * owns it). TEFL_OK gives NULL: success has no status object, so a kernel
 * returning status_new(TEFL_OK, ...) has succeeded. message may be NULL.
 * A code outside tefl_status_code gives TEFL_RUNTIME_ERROR with the message
 * "(unknown status code N) message". */
TEFL_API tefl_status* tefl_status_new(int32_t code, const char* message);
TEFL_API int32_t tefl_status_code_of(const tefl_status* status);
/* Never NULL; "" for a NULL status. Valid until the status is freed. */
TEFL_API const char* tefl_status_message(const tefl_status* status);
TEFL_API void tefl_status_free(tefl_status* status);

/* ---- Implementation kinds (TE-FL's BackendImplKind) -------------------- */
typedef enum tefl_impl_kind {
  TEFL_KIND_DEFAULT = 0,  /* "flagos": the portable implementation */
  TEFL_KIND_VENDOR = 1,   /* "vendor": needs a vendor name */
  TEFL_KIND_REFERENCE = 2 /* "reference": the oracle */
} tefl_impl_kind;

/* ---- Logging levels (TEFL_LOG_LEVEL) ----------------------------------- */
typedef enum tefl_log_level {
  TEFL_LOG_DEBUG = 10,
  TEFL_LOG_INFO = 20,
  TEFL_LOG_WARNING = 30,
  TEFL_LOG_ERROR = 40
} tefl_log_level;

struct tefl_host_services;

/* ---- The call frame: what every kernel receives ------------------------ */
typedef struct tefl_call_frame {
  size_t struct_size;
  const char* op_name; /* catalogue name, e.g. "rmsnorm_fwd" */
  int32_t op_id;       /* TEFL_OP_* from <tefl/ops.h> */
  int32_t num_inputs;
  /* Positional inputs; an absent optional input is NULL. */
  const DLTensor* const* inputs;
  int32_t num_outputs;
  /* Caller-allocated outputs; an absent optional output is NULL. */
  DLTensor* const* outputs;
  /* The op's attribute struct (tefl_<op>_attrs), always at the host's full
   * size with defaults filled in; never NULL for an op that has attributes. */
  const void* attrs;
  void* stream; /* device stream; NULL on CPU */
  const struct tefl_host_services* host;
} tefl_call_frame;
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, op_name) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, op_id) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, inputs) == 24, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, outputs) == 40, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, attrs) == 48, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, stream) == 56, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_call_frame, host) == 64, "append-only");
#define TEFL_CALL_FRAME_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_call_frame, host)

/* A kernel returns NULL on success, a TEFL_UNSUPPORTED status when it
 * declines (before writing any output), or an error status. The frame has
 * already been validated against the op's schema; it and everything it
 * points to live for the duration of the call only. Kernels (and supports
 * functions) are called from many threads at once, with different frames. */
typedef tefl_status* (*tefl_kernel_fn)(const tefl_call_frame* frame, void* user_data);

/* Optional. Returns nonzero (1) when the implementation serves calls like
 * `frame`, else 0 with a human-readable, NUL-terminated reason in
 * why[0..why_len) (why_len is 512 today; a longer reason is cut). The answer is
 * cached per call signature (op, device type, each tensor's dtype, rank,
 * contiguity and presence, and the op's signature attributes), so it must
 * depend on nothing else; shape-dependent refusals belong in the kernel
 * (return TEFL_UNSUPPORTED). */
typedef int32_t (*tefl_supports_fn)(const tefl_call_frame* frame, void* user_data, char* why, size_t why_len);

/* Bit for a DLPack device type in tefl_impl_desc.device_mask. */
#define TEFL_DEVICE_BIT(dl_device_type) (UINT64_C(1) << (dl_device_type))

typedef struct tefl_impl_desc {
  size_t struct_size;
  const char* op_name; /* catalogue op name (or an alias such as rope_fwd) */
  /* "default.NAME", "vendor.NAME" or "reference.NAME" as kind says, NAME of
   * [A-Za-z0-9_.-], e.g. "vendor.onednn"; unique per op */
  const char* impl_id;
  int32_t kind;         /* tefl_impl_kind */
  int32_t priority;     /* higher first within one policy token */
  const char* vendor;   /* required for TEFL_KIND_VENDOR, else may be NULL */
  uint64_t device_mask; /* TEFL_DEVICE_BIT(kDLCPU) | ... */
  tefl_kernel_fn kernel;
  tefl_supports_fn supports; /* may be NULL: serves every call */
  void* user_data;           /* passed back to kernel and supports */
} tefl_impl_desc;
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, op_name) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, impl_id) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, kind) == 24, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, priority) == 28, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, vendor) == 32, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, device_mask) == 40, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, kernel) == 48, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, supports) == 56, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_impl_desc, user_data) == 64, "append-only");
#define TEFL_IMPL_DESC_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_impl_desc, user_data)

/* ---- Device runtime: what makes the layer device-agnostic -------------- */
typedef struct tefl_device_runtime {
  size_t struct_size;
  int32_t device_type; /* DLDeviceType served */
  const char* name;    /* "cpu", "cuda", ... */
  void* ctx;           /* passed to every function below */
  int32_t (*device_count)(void* ctx);
  tefl_status* (*alloc)(void* ctx, int32_t device_id, size_t bytes, size_t alignment, void** out);
  void (*free)(void* ctx, int32_t device_id, void* ptr);
  tefl_status* (*copy_to_device)(void* ctx, int32_t device_id, void* dst, const void* host_src, size_t bytes,
                                 void* stream);
  tefl_status* (*copy_to_host)(void* ctx, int32_t device_id, void* host_dst, const void* src, size_t bytes,
                               void* stream);
  tefl_status* (*stream_sync)(void* ctx, int32_t device_id, void* stream);
} tefl_device_runtime;
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, device_type) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, name) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, ctx) == 24, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, device_count) == 32, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, alloc) == 40, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, free) == 48, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, copy_to_device) == 56, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, copy_to_host) == 64, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_device_runtime, stream_sync) == 72, "append-only");
#define TEFL_DEVICE_RUNTIME_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_device_runtime, stream_sync)

/* ---- Host services: what the host offers kernels and plugins ----------- */
typedef void (*tefl_parallel_body_fn)(void* ctx, int64_t begin, int64_t end);

typedef struct tefl_host_services {
  size_t struct_size;
  uint32_t abi_major;
  uint32_t abi_minor;
  tefl_status* (*status_new)(int32_t code, const char* message);
  void (*status_free)(tefl_status* status);
  int32_t (*status_code)(const tefl_status* status);
  const char* (*status_message)(const tefl_status* status);
  /* Logs through tefl's logger (TEFL_LOG_LEVEL applies); `file` may be NULL
   * (the line then names "plugin"), `message` too (an empty line). */
  void (*log)(int32_t level, const char* file, int32_t line, const char* message);
  /* Runs body over [0, n) split into chunks of at least `grain` on the host's
   * thread pool; returns when all chunks are done. Chunks never overlap. */
  void (*parallel_for)(int64_t n, int64_t grain, tefl_parallel_body_fn body, void* ctx);
  /* Number of threads parallel_for may use (>= 1). */
  int32_t (*num_threads)(void);
  /* The runtime registered for a device type, or NULL. The built-in CPU
   * runtime (kDLCPU, "cpu") is always there, from the first use of tefl_host(). */
  const tefl_device_runtime* (*device_runtime)(int32_t device_type);
} tefl_host_services;
TEFL_STATIC_ASSERT(offsetof(tefl_host_services, abi_major) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_host_services, status_new) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_host_services, log) == 48, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_host_services, parallel_for) == 56, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_host_services, device_runtime) == 72, "append-only");
#define TEFL_HOST_SERVICES_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_host_services, device_runtime)

/* The host's services table (static storage, never NULL). */
TEFL_API const tefl_host_services* tefl_host(void);

/* ---- Registrar: how a backend or plugin adds implementations ----------- */
typedef struct tefl_registrar {
  size_t struct_size;
  void* ctx;
  /* Copies everything it needs from desc (strings included). Errors:
   * unknown op, impl_id not "kind.NAME", duplicate impl_id, vendor kind
   * without vendor, no kernel. */
  tefl_status* (*register_impl)(void* ctx, const tefl_impl_desc* desc);
  tefl_status* (*register_device_runtime)(void* ctx, const tefl_device_runtime* runtime);
} tefl_registrar;
TEFL_STATIC_ASSERT(offsetof(tefl_registrar, ctx) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_registrar, register_impl) == 16, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_registrar, register_device_runtime) == 24, "append-only");
#define TEFL_REGISTRAR_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_registrar, register_device_runtime)

/* ---- Plugin entry points ----------------------------------------------
 * A plugin shared library exports both symbols, declared below (so that a
 * plugin's definitions are checked against them) and marked
 * TEFL_PLUGIN_EXPORT, which exports them even from a plugin built with
 * hidden visibility (-fvisibility=hidden, as a plugin should be):
 *   TEFL_PLUGIN_EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) { ... }
 *   TEFL_PLUGIN_EXPORT tefl_status* tefl_plugin_register(
 *       const tefl_host_services* host, const tefl_registrar* registrar) { ... }
 * In C++ they are noexcept: nothing may be thrown across this C boundary.
 * libtefl itself defines neither. Registration is transactional: if the
 * register function returns an error (or any registration it made fails)
 * nothing of the plugin remains. */
#if defined(_WIN32)
#define TEFL_PLUGIN_EXPORT __declspec(dllexport)
#else
#define TEFL_PLUGIN_EXPORT __attribute__((visibility("default")))
#endif
#ifdef __cplusplus
#define TEFL_PLUGIN_NOEXCEPT noexcept
#else
#define TEFL_PLUGIN_NOEXCEPT
#endif
typedef struct tefl_plugin_metadata {
  size_t struct_size;
  const char* name;
  const char* version;
  const char* vendor;
  uint32_t abi_major; /* TEFL_ABI_MAJOR the plugin was built against */
  uint32_t abi_minor; /* TEFL_ABI_MINOR the plugin was built against */
} tefl_plugin_metadata;
TEFL_STATIC_ASSERT(offsetof(tefl_plugin_metadata, name) == 8, "append-only");
TEFL_STATIC_ASSERT(offsetof(tefl_plugin_metadata, abi_major) == 32, "append-only");
#define TEFL_PLUGIN_METADATA_STRUCT_SIZE TEFL_STRUCT_SIZE(tefl_plugin_metadata, abi_minor)

#define TEFL_PLUGIN_INFO_SYMBOL "tefl_plugin_info"
#define TEFL_PLUGIN_REGISTER_SYMBOL "tefl_plugin_register"
typedef const tefl_plugin_metadata* (*tefl_plugin_info_fn)(void);
typedef tefl_status* (*tefl_plugin_register_fn)(const tefl_host_services* host, const tefl_registrar* registrar);
TEFL_PLUGIN_EXPORT const tefl_plugin_metadata* tefl_plugin_info(void) TEFL_PLUGIN_NOEXCEPT;
TEFL_PLUGIN_EXPORT tefl_status* tefl_plugin_register(const tefl_host_services* host,
                                                     const tefl_registrar* registrar) TEFL_PLUGIN_NOEXCEPT;

/* ---- Calling ops from C ---------------------------------------------------
 * Validates the call against the op's schema, resolves the implementation
 * chain under the current policy (cached per call signature) and runs it with
 * fallback. `attrs` may be NULL (all defaults) or a tefl_<op>_attrs of any
 * struct_size. Returns NULL on success. Uses the default manager. */
TEFL_API tefl_status* tefl_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs,
                                DLTensor* const* outputs, int32_t num_outputs, const void* attrs, void* stream);
/* Prepared calls: one call validated once (tefl_prepare_call, full
 * validation, metadata and attributes copied) and run many times with new
 * data pointers only (tefl_prepared_call_run: one pointer per argument in the
 * op's order, NULL for an argument absent at preparation). A run re-checks
 * what depends on the pointers (NULL, alignment, overlap, contents the op's
 * validation reads; a run on the same pointers as the last run that passed
 * those checks skips the pointer part), resolves under the policy in force
 * (cached until it changes) and falls back like tefl_call, with tefl_call's
 * errors. One thread at a time per prepared call. Uses the default manager. */
typedef struct tefl_prepared_call tefl_prepared_call;
TEFL_API tefl_status* tefl_prepare_call(int32_t op_id, const DLTensor* const* inputs, int32_t num_inputs,
                                        DLTensor* const* outputs, int32_t num_outputs, const void* attrs,
                                        tefl_prepared_call** out);
TEFL_API tefl_status* tefl_prepared_call_run(tefl_prepared_call* call, void* const* input_data, int32_t num_inputs,
                                             void* const* output_data, int32_t num_outputs, void* stream);
TEFL_API void tefl_prepared_call_free(tefl_prepared_call* call); /* NULL is a no-op */
/* The TEFL_OP_* id for a name or alias ("rope_fwd"), or -1. */
TEFL_API int32_t tefl_op_id(const char* op_name);
/* Registers into the default registry (same contract as the registrar). */
TEFL_API tefl_status* tefl_register_impl(const tefl_impl_desc* desc);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* TEFL_TEFL_H_ */
