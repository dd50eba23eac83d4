// tefl — the C++ API over the C ABI. Names follow TE-FL (OpRegistry, OpImpl,
// BackendImplKind, SelectionPolicy, OpManager) so that users of the Python
// package meet the same concepts.
//
// Threading: every function here is thread-safe. A call through OpManager
// after its first call with the same signature takes no lock, allocates
// nothing and reads no environment variable.
#ifndef TEFL_TEFL_HPP_
#define TEFL_TEFL_HPP_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tefl/ops.h"
#include "tefl/tefl.h"

namespace tefl {

// ---- Status (LevelDB style: cheap when OK) ---------------------------------
// [[nodiscard]]: a call whose Status is dropped is a compiler warning, since
// an unchecked error would be a silently skipped op.
class [[nodiscard]] Status {
 public:
  Status() = default;  // OK
  Status(int32_t code, std::string message);
  static Status OK() { return Status(); }
  // Takes ownership of a C status (NULL = OK) and frees it.
  static Status FromC(tefl_status* status);
  // A new C status carrying this one (NULL when OK); the caller owns it.
  tefl_status* ToC() const;

  bool ok() const { return state_ == nullptr; }
  int32_t code() const;
  bool IsUnsupported() const { return code() == TEFL_UNSUPPORTED; }
  const std::string& message() const;
  std::string ToString() const;  // "OK" or "<CODE>: message"

 private:
  struct State {
    int32_t code;
    std::string message;
  };
  std::shared_ptr<const State> state_;
};
const char* StatusCodeName(int32_t code);

// ---- Kinds and implementations --------------------------------------------
enum class BackendImplKind : int32_t {
  DEFAULT = TEFL_KIND_DEFAULT,      // token "flagos"
  VENDOR = TEFL_KIND_VENDOR,        // token "vendor"
  REFERENCE = TEFL_KIND_REFERENCE,  // token "reference"
};
// "flagos", "vendor" or "reference" (TE-FL's BackendImplKind values).
const char* KindName(BackendImplKind kind);

// A C++ kernel; receives the validated frame. Return Status(TEFL_UNSUPPORTED,
// why) to decline before writing any output.
using KernelFunction = std::function<Status(const tefl_call_frame& frame)>;

struct OpImpl {
  std::string op_name;  // catalogue name; aliases are mapped to it
  std::string impl_id;  // "kind.name", unique per op
  BackendImplKind kind = BackendImplKind::DEFAULT;
  std::string vendor;  // required for VENDOR
  int32_t priority = 0;
  uint64_t device_mask = TEFL_DEVICE_BIT(kDLCPU);
  tefl_kernel_fn kernel = nullptr;
  tefl_supports_fn supports = nullptr;
  void* user_data = nullptr;
  std::string origin = "user";  // "builtin", a plugin path, "python", ...
  // Keeps user_data alive as long as the implementation may be called.
  std::shared_ptr<void> keepalive;

  // Wraps a C++ callable as an implementation.
  static OpImpl FromFunction(std::string op_name, std::string impl_id, BackendImplKind kind, std::string vendor,
                             int32_t priority, KernelFunction fn);
  // Copies a C descriptor (fields beyond its struct_size take defaults).
  static OpImpl FromDesc(const tefl_impl_desc& desc, std::string origin = "c-api");
  // OK when `desc` can be read (not NULL, struct_size through `kernel` at
  // least: later fields of a smaller struct take their defaults); else an
  // INVALID_ARGUMENT naming the size found and the one expected.
  static Status CheckDesc(const tefl_impl_desc* desc);
};

// ---- Selection policy -------------------------------------------------------
// One entry of an order: flagos | vendor | reference | vendor:NAME | impl:ID.
struct PolicyToken {
  enum Type { kFlagos, kVendor, kReference, kVendorName, kImplId } type = kFlagos;
  std::string arg;  // vendor name (lower case) or impl id
  std::string ToString() const;
  bool operator==(const PolicyToken&) const = default;
  // Parses one token (case-insensitive keywords, trimmed). nullopt if malformed.
  static std::optional<PolicyToken> Parse(std::string_view text);
};
// True when `impl` matches `token` (TE-FL's match_token).
bool MatchToken(const OpImpl& impl, const PolicyToken& token);

class SelectionPolicy {
 public:
  static constexpr const char* kPreferDefault = "flagos";
  static constexpr const char* kPreferVendor = "vendor";
  static constexpr const char* kPreferReference = "reference";

  SelectionPolicy() = default;  // prefer flagos, fallback on, no filters

  // Validating constructor: prefer must be flagos/vendor/reference (any case);
  // per-op orders use the token syntax; ops may be aliases (rope_fwd).
  static Status Make(std::string_view prefer, bool strict,
                     const std::map<std::string, std::vector<std::string>>& per_op_order,
                     const std::set<std::string>& deny_vendors,
                     const std::optional<std::set<std::string>>& allow_vendors, SelectionPolicy* out);

  // From TE_FL_* variables through `getenv` (std::getenv by default).
  // Malformed values are reported in `warnings` and ignored, never fatal.
  using EnvLookup = std::function<const char*(const char*)>;
  static SelectionPolicy FromEnv(std::vector<std::string>* warnings = nullptr, const EnvLookup& getenv = nullptr);

  const std::string& prefer() const { return prefer_; }
  bool strict() const { return strict_; }
  const std::map<std::string, std::vector<PolicyToken>>& per_op_order() const { return per_op_; }
  const std::set<std::string>& deny_vendors() const { return deny_; }
  const std::optional<std::set<std::string>>& allow_vendors() const { return allow_; }

  std::vector<PolicyToken> DefaultOrder() const;
  // The op's per-op order if set, else the default order.
  std::vector<PolicyToken> OrderFor(std::string_view op_name) const;
  // Deny beats allow; names compare case-insensitively.
  bool IsVendorAllowed(std::string_view vendor) const;
  // Canonical text; equal policies have equal fingerprints.
  std::string Fingerprint() const;
  // Where each setting came from ("TE_FL_PREFER", "default", "code", ...).
  const std::map<std::string, std::string>& sources() const { return sources_; }

  SelectionPolicy WithStrict(bool strict) const;
  SelectionPolicy WithPrefer(std::string_view prefer) const;  // invalid → unchanged
  SelectionPolicy WithAllowedVendors(const std::set<std::string>& vendors) const;
  SelectionPolicy WithDeniedVendors(const std::set<std::string>& vendors) const;

 private:
  std::string prefer_ = kPreferDefault;
  bool strict_ = false;
  std::map<std::string, std::vector<PolicyToken>> per_op_;
  std::set<std::string> deny_;
  std::optional<std::set<std::string>> allow_;
  std::map<std::string, std::string> sources_;
};

// Process-wide policy. The global policy starts from the environment (read
// once, at first use) and is replaced by SetGlobalPolicy; each change bumps
// the policy epoch, which invalidates every cached resolution.
SelectionPolicy GetPolicy();  // the effective policy of this thread
void SetGlobalPolicy(const SelectionPolicy& policy);
void ResetGlobalPolicy();  // re-reads the environment
uint64_t GetPolicyEpoch();
uint64_t BumpPolicyEpoch();
// Re-reads TEFL_LOG_LEVEL and TE_FL_VERBOSE (read once at first use).
void ReloadLoggingFromEnv();

// Scoped, thread-local override (TE-FL's policy_context). Nests; restores the
// previous policy of this thread when destroyed. Only the creating thread
// sees it. Not movable.
class PolicyContext {
 public:
  explicit PolicyContext(const SelectionPolicy& policy);
  ~PolicyContext();
  PolicyContext(const PolicyContext&) = delete;
  PolicyContext& operator=(const PolicyContext&) = delete;

 private:
  const void* previous_;
};

// ---- Registry ---------------------------------------------------------------
class OpRegistry {
 public:
  OpRegistry();
  ~OpRegistry();
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  // Errors: unknown op, empty or duplicate impl_id (per op), VENDOR without
  // vendor, no kernel.
  Status RegisterImpl(const OpImpl& impl);
  // All or nothing.
  Status RegisterMany(const std::vector<OpImpl>& impls);
  std::vector<OpImpl> GetImplementations(std::string_view op_name) const;
  std::optional<OpImpl> GetImplementation(std::string_view op_name, std::string_view impl_id) const;
  std::vector<std::string> ListOperators() const;  // ops with at least one impl
  std::vector<OpImpl> Snapshot() const;
  // Sorted unique impl ids over all ops.
  std::vector<std::string> ImplIds() const;
  void Clear();
  // Whether RegisterImpl(impl) would succeed now (nothing is registered).
  Status CheckImpl(const OpImpl& impl) const;
  // A registrar writing into this registry (ctx = this registry). Each
  // register_impl call commits on its own.
  tefl_registrar Registrar();

  struct Rep;
  Rep* rep() const { return rep_.get(); }

 private:
  std::unique_ptr<Rep> rep_;
};

// ---- Manager ----------------------------------------------------------------
struct CandidateReport {
  std::string impl_id;
  BackendImplKind kind;
  std::string vendor;
  int32_t priority = 0;
  bool accepted = false;  // in the chain
  bool demoted = false;   // moved last for this signature after a failure
  std::string reason;     // why rejected ("" when accepted)
};
struct Resolution {
  std::string op_name;
  std::string signature;                    // e.g. "x:bfloat16[2d] gamma:float32[1d] ..."
  std::string policy;                       // the policy fingerprint in force
  std::vector<std::string> order;           // token order used for this op
  std::vector<std::string> chain;           // impl ids tried in order
  std::vector<CandidateReport> candidates;  // every registered impl of the op, in the order considered
  std::string error;                        // non-empty if the call cannot be served
};

class PreparedCall;

class OpManager {
 public:
  // Uses `registry` (not owned; must outlive the manager), or a registry of
  // its own when NULL.
  explicit OpManager(OpRegistry* registry = nullptr);
  ~OpManager();
  OpManager(const OpManager&) = delete;
  OpManager& operator=(const OpManager&) = delete;

  // Registers the built-in backends into the registry (once per registry;
  // ids already present are kept), loads the configured plugins (once per
  // registry: docs/plugin-guide.md) and logs the registered impl_ids. Called
  // by the first Call() (Prepare, Explain) when not called before. Managers
  // sharing a registry: each returns only once that registry's built-ins and
  // configured plugins are registered, whichever manager registers them (a
  // first call never dispatches on a registry still being filled). Called
  // from a plugin's tefl_plugin_register it does nothing (the initialisation
  // may be what is loading the plugin: it would wait for itself).
  void EnsureInitialized();

  // Validates, resolves (cached per call signature) and runs with fallback.
  // `attrs` may be NULL (defaults) or any struct_size of the op's attrs.
  Status Call(int32_t op_id, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
              const void* attrs = nullptr, void* stream = nullptr);
  Status Call(std::string_view op_name, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
              const void* attrs = nullptr, void* stream = nullptr);
  // The resolution a call like this one gets, with every candidate and why.
  // Validates first: an invalid call gives its error in Resolution::error.
  Resolution Explain(int32_t op_id, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
                     const void* attrs = nullptr);
  // The impl id that last ran `op_name` through this manager ("" if none).
  std::string GetSelectedImplId(std::string_view op_name) const;
  // Validates a call once and keeps it for PreparedCall::Run (see there). On
  // error *out is left as it was.
  Status Prepare(int32_t op_id, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
                 const void* attrs, PreparedCall* out);

  OpRegistry& registry();

  struct Rep;

 private:
  friend class PreparedCall;
  std::unique_ptr<Rep> rep_;
};

// ---- Prepared calls -------------------------------------------------------------
// One op call prepared once and run many times with new data pointers: a
// training step calls the same ops with the same shapes, dtypes and attributes
// every iteration. OpManager::Prepare runs the full validation and keeps a
// copy of every tensor's metadata (shape, strides, dtype, device, byte_offset)
// and of the attributes. Run() takes only the data pointers, one per argument
// in the op's order (NULL for an optional argument that was absent at
// Prepare), and then does what OpManager::Call does with them: it re-checks
// what depends on the pointers (NULL data, alignment, overlap; the contents of
// tensors the op reads during validation, such as cu_seqlens; a run on the
// same pointers as the last run that passed the pointer checks skips those,
// which depend on nothing else, but not the content checks), resolves under
// the policy in force at the time of the run (the chain is kept until the
// policy, the registry or a demotion changes), runs the chain with fallback,
// and reports the same errors, before any output is written. Not for
// concurrent use: one thread at a time per PreparedCall (different
// PreparedCalls may run on different threads at once). The manager that
// prepared it must outlive it. Run() also takes the counts of the op's first
// release for an op that has grown since (the later arguments absent).
class PreparedCall {
 public:
  PreparedCall();  // empty: Run() returns FAILED_PRECONDITION
  ~PreparedCall();
  PreparedCall(PreparedCall&&) noexcept;
  PreparedCall& operator=(PreparedCall&&) noexcept;

  Status Run(std::span<void* const> input_data, std::span<void* const> output_data, void* stream = nullptr);
  bool prepared() const { return rep_ != nullptr; }
  std::string_view op_name() const;  // "" when empty

  struct Rep;

 private:
  friend class OpManager;
  Status RunChecked(void* stream);  // after the pointer checks passed
  Status RunFull(std::span<void* const> input_data, std::span<void* const> output_data, void* stream);
  std::unique_ptr<Rep> rep_;
};

// ---- Plugins ----------------------------------------------------------------
// What happened to one plugin the process tried to load.
struct PluginReport {
  std::string requested;              // as named (TE_FL_PLUGIN_MODULES entry, argument, or discovered file)
  std::string path;                   // the file it resolved to ("" if none)
  std::string name, version, vendor;  // from its tefl_plugin_info
  uint32_t abi_major = 0, abi_minor = 0;
  int32_t implementations = 0;  // registered by this load
  bool loaded = false;          // its registrations are in the registry
  bool already_loaded = false;  // the same file was loaded into this registry before: nothing done
  std::string error;            // why it was rejected
};
// Loads one plugin into `registry`: an absolute path, or a name looked up in
// TE_FL_PLUGIN_PATH then the installed plugin directory (files
// libtefl_plugin_NAME.so, libNAME.so, NAME.so). Never the working directory
// or the system search path. A file or directory writable by group or others
// is refused; a different ABI major (or a newer minor) is refused; the
// plugin's registrations are committed only if all of them and its register
// function succeed. Loading the same file again is a no-op. Logs one line.
Status LoadPlugin(std::string_view name_or_path, OpRegistry& registry);
// TE_FL_PLUGIN_MODULES, then every *.so in the installed plugin directory.
// OpManager::EnsureInitialized calls it once per registry.
void LoadConfiguredPlugins(OpRegistry& registry);
// The directories a plugin name is looked up in: TE_FL_PLUGIN_PATH's
// entries (a relative one is ignored with a WARNING), then
// InstalledPluginDir(). Read anew on each call.
std::vector<std::string> PluginSearchDirs();
// Every plugin this process tried, in order.
std::vector<PluginReport> PluginReports();
// Where installed plugins are discovered: tefl/plugins in the directory of
// the libtefl.so that is loaded (<prefix>/<libdir>/tefl/plugins once
// installed, wherever the tree was installed or moved to); for the Python
// package, `plugins` next to its libtefl (tefl/plugins in site-packages).
// "" if it cannot be determined.
std::string InstalledPluginDir();

// The process's default registry and manager (created on first use).
OpRegistry& GetDefaultRegistry();
OpManager& GetDefaultManager();

// ---- Typed calls (default manager unless opts.manager) -----------------------
struct CallOptions {
  bool zero_centered_gamma = false;
  int32_t sm_margin = 0;
  void* stream = nullptr;
  OpManager* manager = nullptr;
};
Status layernorm_fwd(const DLTensor& x, const DLTensor& gamma, const DLTensor& beta, float eps, DLTensor& z,
                     DLTensor& mu, DLTensor& rsigma, const CallOptions& opts = {});
Status layernorm_bwd(const DLTensor& dz, const DLTensor& x, const DLTensor& mu, const DLTensor& rsigma,
                     const DLTensor& gamma, DLTensor& dx, DLTensor& dgamma, DLTensor& dbeta,
                     const CallOptions& opts = {});
Status rmsnorm_fwd(const DLTensor& x, const DLTensor& gamma, float eps, DLTensor& z, DLTensor& rsigma,
                   const CallOptions& opts = {});
Status rmsnorm_bwd(const DLTensor& dz, const DLTensor& x, const DLTensor& rsigma, const DLTensor& gamma, DLTensor& dx,
                   DLTensor& dgamma, const CallOptions& opts = {});
Status rmsnorm_bwd_add(const DLTensor& dz, const DLTensor& x, const DLTensor& add, const DLTensor& rsigma,
                       const DLTensor& gamma, DLTensor& dx, DLTensor& dgamma, const CallOptions& opts = {});

}  // namespace tefl

#endif  // TEFL_TEFL_HPP_
