// OpManager: validate → resolve (cached per call signature) → call → fallback.
//
// Hot path (a signature seen before under the same policy and epoch): the
// schema check, the signature key, one probe of this thread's direct-mapped
// cache and an indirect call. No lock, no allocation, no string work, no
// getenv. Chains and implementation records are immutable and never freed
// while the manager lives (chains are interned by content, so their number is
// bounded by the distinct orders actually produced).
#include <algorithm>
#include <chrono>
#include <map>
#include <unordered_map>
#include <unordered_set>

#include "backends/backends.h"
#include "core/catalogue.h"
#include "core/device.h"
#include "core/logging.h"
#include "core/policy_state.h"
#include "core/registry.h"
#include "core/strings.h"
#include "core/validate.h"

namespace tefl {

// An ordered candidate chain, or the reason there is none.
struct Chain {
  std::vector<const ImplRecord*> impls;
  bool strict = false;
  std::string strict_label;  // "strict mode (TE_FL_STRICT=1)": where strict came from, for errors
  int32_t error_code = TEFL_OK;
  std::string error;
  // impls[0] when there is no error and a candidate; else NULL (the hot
  // path's one test for both).
  const ImplRecord* first = nullptr;
};

struct CacheEntry {
  SigKey key;
  uint64_t manager_serial;
  uint64_t epoch;
  uint32_t policy_id;
  const Chain* chain;
};
constexpr size_t kCacheSlots = 256;
struct DispatchCache {
  CacheEntry entries[kCacheSlots];
  ValidationMemo validation;
};

namespace {

std::atomic<uint64_t> g_manager_serial{1};

// Frees this thread's cache at thread exit. Only touched when a cache is
// created, so the hot path never runs its TLS guard.
struct CacheOwner {
  ~CacheOwner() {
    delete t_thread_state.cache;
    t_thread_state.cache = nullptr;
  }
};

__attribute__((noinline)) DispatchCache* NewThreadCache(ThreadState& ts) {
  static thread_local CacheOwner owner;
  (void)owner;
  ts.cache = new DispatchCache();  // value-initialised: all chains NULL
  return ts.cache;
}

inline DispatchCache* ThreadCache(ThreadState& ts) { return ts.cache ? ts.cache : NewThreadCache(ts); }

// The frame every kernel of this call receives.
tefl_call_frame MakeFrame(const OpSchema& op, const CallArgs& args, void* stream) {
  return tefl_call_frame{TEFL_CALL_FRAME_STRUCT_SIZE,
                         op.name,
                         op.id,
                         args.num_inputs,
                         args.inputs,
                         args.num_outputs,
                         args.outputs,
                         args.attrs,
                         stream,
                         tefl_host()};
}

// The arguments of a frame (the inverse of MakeFrame).
CallArgs ArgsOf(const tefl_call_frame& f) {
  return CallArgs{f.inputs, f.num_inputs, f.outputs, f.num_outputs, f.attrs};
}

// The arguments of a call as every entry point (Call, Explain, Prepare) hands
// them on: attributes normalised (into attr_buffer when needed), arrays padded
// to the op's full arity (into padded_* for a call in the op's first form).
// Lives on the caller's stack; `args` may point into it.
struct NormalizedCall {
  alignas(16) char attr_buffer[kMaxAttrsSize];
  const DLTensor* padded_in[kMaxOpArgs];
  DLTensor* padded_out[kMaxOpArgs];
  CallArgs args;
};
// NULL, or the attributes' error.
inline tefl_status* NormalizeCall(const OpSchema& op, std::span<const DLTensor* const> inputs,
                                  std::span<DLTensor* const> outputs, const void* attrs_in, NormalizedCall* c) {
  tefl_status* error = nullptr;
  const void* attrs = NormalizeAttrs(op, attrs_in, c->attr_buffer, &error);
  if (error) return error;
  c->args = CallArgs{inputs.data(), int32_t(inputs.size()), outputs.data(), int32_t(outputs.size()), attrs};
  PadToFullArity(op, &c->args, c->padded_in, c->padded_out);
  return nullptr;
}

// The DLPack device type recorded in a signature.
int32_t DeviceTypeOf(const SigKey& key) { return int32_t((key.w[0] >> 32) & 0xFF); }

// How an error names strict mode: by the variable when TE_FL_STRICT set it,
// else as the policy's own setting (SelectionPolicy::WithStrict, Python's
// policy contexts, `tefl check` / `tefl bench` pinning one implementation).
std::string StrictLabel(const SelectionPolicy& policy) {
  const auto it = policy.sources().find("strict");
  return it != policy.sources().end() && it->second == "TE_FL_STRICT" ? "strict mode (TE_FL_STRICT=1)"
                                                                      : "strict mode (policy set in code)";
}

std::string UnknownOpId(int32_t op_id) {
  return fmt::format("unknown op id {} (op ids are the TEFL_OP_* constants of tefl/ops.h, 0 to {})", op_id,
                     int(TEFL_OP_COUNT_) - 1);
}

std::string ImplLabel(const OpImpl& impl) {
  return fmt::format("'{}' (kind={}, vendor={})", impl.impl_id, KindName(impl.kind),
                     impl.vendor.empty() ? "None" : impl.vendor);
}

std::string OrderString(const std::vector<PolicyToken>& order) {
  std::string s;
  for (size_t i = 0; i < order.size(); ++i) s += (i ? "|" : "") + order[i].ToString();
  return s;
}

// A token of an op's order naming an implementation (impl:ID) or a vendor
// (vendor:NAME) the op has none of: a typo in TE_FL_PER_OP, or a plugin that
// is not loaded. typo: a registered name is within 3 edits of it.
struct DanglingToken {
  std::string token;
  std::string text;  // "token 'impl:x' of the order names no ... (did you mean 'impl:y'?)"
  bool typo;
};

std::vector<DanglingToken> DanglingTokens(const OpSchema& op, const std::vector<PolicyToken>& order,
                                          const std::vector<const ImplRecord*>& impls) {
  std::vector<DanglingToken> out;
  for (const PolicyToken& t : order) {
    if (t.type != PolicyToken::kImplId && t.type != PolicyToken::kVendorName) continue;
    const bool by_id = t.type == PolicyToken::kImplId;
    bool found = false;
    std::string best;
    size_t best_d = ~size_t(0);
    for (const ImplRecord* r : impls) {
      if (!by_id && r->impl.kind != BackendImplKind::VENDOR) continue;
      const std::string name = by_id ? r->impl.impl_id : ToLower(r->impl.vendor);
      if (name == t.arg) {
        found = true;
        break;
      }
      const size_t d = EditDistance(t.arg, name);
      if (d < best_d) best_d = d, best = name;
    }
    if (found) continue;
    const bool typo = !best.empty() && best_d <= 3;
    out.push_back({t.ToString(),
                   fmt::format("token '{}' of the order names no registered {} of {}{}", t.ToString(),
                               by_id ? "implementation" : "vendor", op.name,
                               typo ? fmt::format(" (did you mean '{}:{}'?)", by_id ? "impl" : "vendor", best) : ""),
                   typo});
  }
  return out;
}

struct ResolvedCandidates {
  std::vector<CandidateReport> reports;      // every registered impl
  std::vector<DanglingToken> dangling;       // tokens naming nothing registered
  std::vector<const ImplRecord*> chain;      // ordered, accepted
  const ImplRecord* strict_first = nullptr;  // first in policy order (strict)
  std::string strict_reason;                 // why strict_first declined
  std::string error;
};

}  // namespace

struct OpManager::Rep {
  OpRegistry* registry = nullptr;
  std::unique_ptr<OpRegistry> owned;
  const uint64_t serial = g_manager_serial.fetch_add(1);
  std::once_flag init_once;
  std::atomic<bool> initialized{false};

  std::mutex mu;  // guards everything below
  std::map<std::tuple<std::vector<const ImplRecord*>, bool, std::string, int32_t, std::string>, std::unique_ptr<Chain>>
      chains;
  struct Resolved {
    uint64_t epoch;
    const Chain* chain;
  };
  struct FullKey {
    SigKey key;
    uint32_t policy_id;
    bool operator==(const FullKey& o) const { return key == o.key && policy_id == o.policy_id; }
  };
  struct FullKeyHash {
    size_t operator()(const FullKey& k) const { return size_t(k.key.Hash() ^ (uint64_t(k.policy_id) << 17)); }
  };
  std::unordered_map<FullKey, Resolved, FullKeyHash> resolved;
  Status Dispatch(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key,
                  ValidationMemo::Resolution* remembered, DispatchCache* cache);
  // Dispatch's chain when `remembered` does not hold it: from the per-thread
  // cache or Resolve; remembers it.
  const Chain* LookUpChain(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key,
                           ValidationMemo::Resolution* remembered, DispatchCache* cache, const PolicyRecord* policy,
                           uint64_t epoch);
  // The slow part of a call: the chain after its first candidate declined or
  // failed, or with TE_FL_VERBOSE exec timing.
  Status RunChain(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key, const Chain& chain,
                  tefl_status* first);
  // Logs "Op '...' using ..." when an op's implementation changes.
  void NoteUsed(const OpSchema& op, const ImplRecord* r);
  std::unordered_map<SigKey, std::vector<const ImplRecord*>, SigKeyHash> demoted;
  struct SigImplHash {
    size_t operator()(const std::pair<SigKey, const ImplRecord*>& k) const {
      return size_t(k.first.Hash() ^ (reinterpret_cast<uintptr_t>(k.second) * 0x9E3779B97F4A7C15ull));
    }
  };
  // (signature, implementation) pairs whose fallback was already logged at INFO.
  std::unordered_set<std::pair<SigKey, const ImplRecord*>, SigImplHash> fallback_logged;
  // (op, token) pairs of dangling tokens already logged.
  std::unordered_set<std::string> dangling_logged;

  // Last implementation that ran each op (announced at INFO when it changes).
  std::array<std::atomic<const ImplRecord*>, TEFL_OP_COUNT_> last_used{};

  const Chain* InternChain(Chain c) {
    auto k = std::make_tuple(c.impls, c.strict, c.strict_label, c.error_code, c.error);
    auto it = chains.find(k);
    if (it != chains.end()) return it->second.get();
    c.first = c.error.empty() && !c.impls.empty() ? c.impls[0] : nullptr;
    auto owned_chain = std::make_unique<Chain>(std::move(c));
    const Chain* out = owned_chain.get();
    chains.emplace(std::move(k), std::move(owned_chain));
    return out;
  }

  ResolvedCandidates ResolveCandidates(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key,
                                       const PolicyRecord& policy, int32_t device_type);
  const Chain* Resolve(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key, const PolicyRecord& policy,
                       uint64_t epoch, int32_t device_type, const std::string& sig);
  void Demote(const OpSchema& op, const SigKey& key, const ImplRecord* impl, const std::string& why,
              const std::string& sig);
  void NoteFallback(const OpSchema& op, const SigKey& key, const ImplRecord* impl, const std::string& sig,
                    const std::string& reasons);
};

ResolvedCandidates OpManager::Rep::ResolveCandidates(const OpSchema& op, const tefl_call_frame& frame,
                                                     const SigKey& key, const PolicyRecord& policy,
                                                     int32_t device_type) {
  ResolvedCandidates out;
  const std::vector<PolicyToken>& order = policy.order_by_op[size_t(op.id)];
  const std::vector<const ImplRecord*> impls = registry->rep()->ImplsOf(op.id);
  std::vector<const ImplRecord*> demoted_here;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = demoted.find(key);
    if (it != demoted.end()) demoted_here = it->second;
  }
  struct Ranked {
    const ImplRecord* rec;
    size_t token;
    size_t report;
  };
  std::vector<Ranked> ranked;
  for (const ImplRecord* r : impls) {
    const OpImpl& impl = r->impl;
    CandidateReport rep{impl.impl_id, impl.kind, impl.vendor, impl.priority, false, false, ""};
    if (impl.kind == BackendImplKind::VENDOR && !policy.policy.IsVendorAllowed(impl.vendor)) {
      std::string v = impl.vendor;
      std::transform(v.begin(), v.end(), v.begin(), ::tolower);
      rep.reason = policy.policy.deny_vendors().count(v)
                       ? fmt::format("vendor '{}' is denied (TE_FL_DENY_VENDORS)", impl.vendor)
                       : fmt::format("vendor '{}' is not in the allowed vendors (TE_FL_ALLOW_VENDORS)", impl.vendor);
    } else if (!(device_type >= 0 && device_type < 64 && (impl.device_mask >> device_type) & 1)) {
      rep.reason = fmt::format("does not serve device type {}", DeviceTypeName(device_type));
    } else {
      size_t t = 0;
      while (t < order.size() && !MatchToken(impl, order[t])) ++t;
      if (t == order.size()) {
        rep.reason = fmt::format("matches no token of the order {}", OrderString(order));
      } else {
        ranked.push_back({r, t, out.reports.size()});
      }
    }
    out.reports.push_back(std::move(rep));
  }
  std::stable_sort(ranked.begin(), ranked.end(), [](const Ranked& a, const Ranked& b) {
    if (a.token != b.token) return a.token < b.token;
    if (a.rec->impl.priority != b.rec->impl.priority) return a.rec->impl.priority > b.rec->impl.priority;
    return a.rec->impl.impl_id < b.rec->impl.impl_id;
  });
  const bool strict = policy.policy.strict();
  // A demoted implementation goes last (in demotion order) for this signature.
  // Not in strict mode: strict means "the policy's first candidate, or an
  // error", and a demotion recorded by an earlier non-strict call must not
  // turn it into a silent fallback.
  if (!demoted_here.empty() && !strict) {
    std::vector<Ranked> reordered;
    for (const Ranked& r : ranked)
      if (std::find(demoted_here.begin(), demoted_here.end(), r.rec) == demoted_here.end()) reordered.push_back(r);
    for (const ImplRecord* d : demoted_here)
      for (const Ranked& r : ranked)
        if (r.rec == d) reordered.push_back(r);
    ranked = std::move(reordered);
  }
  for (const Ranked& r : ranked) {
    CandidateReport& rep = out.reports[r.report];
    rep.demoted = std::find(demoted_here.begin(), demoted_here.end(), r.rec) != demoted_here.end();
    const OpImpl& impl = r.rec->impl;
    if (strict && out.strict_first != nullptr) {
      rep.reason = "not tried: " + StrictLabel(policy.policy) + " uses only the first candidate";
      continue;
    }
    bool ok = true;
    if (impl.supports) {
      char why[512] = {0};
      ok = impl.supports(&frame, impl.user_data, why, sizeof(why)) != 0;
      why[sizeof(why) - 1] = '\0';
      if (!ok) rep.reason = fmt::format("supports() declined: {}", why[0] ? why : "(no reason given)");
    }
    if (strict) {
      out.strict_first = r.rec;
      if (!ok) out.strict_reason = rep.reason;
    }
    if (ok) {
      rep.accepted = true;
      out.chain.push_back(r.rec);
    }
  }
  // Reports in the order the candidates are considered (policy order, then
  // those the policy or the device left out, in registration order).
  {
    std::vector<CandidateReport> ordered;
    ordered.reserve(out.reports.size());
    std::vector<bool> taken(out.reports.size(), false);
    for (const Ranked& r : ranked) {
      ordered.push_back(std::move(out.reports[r.report]));
      taken[r.report] = true;
    }
    for (size_t i = 0; i < out.reports.size(); ++i)
      if (!taken[i]) ordered.push_back(std::move(out.reports[i]));
    out.reports = std::move(ordered);
  }
  out.dangling = DanglingTokens(op, order, impls);
  if (strict && out.strict_first && !out.strict_reason.empty()) {
    out.chain.clear();
    out.error = fmt::format("{}: {}: the first candidate {} cannot run: {}", op.name, StrictLabel(policy.policy),
                            ImplLabel(out.strict_first->impl), out.strict_reason);
  } else if (out.chain.empty()) {
    std::string reasons;
    for (const CandidateReport& rep : out.reports) reasons += fmt::format("; '{}': {}", rep.impl_id, rep.reason);
    out.error = impls.empty() ? fmt::format("{}: no implementation is registered", op.name)
                              : fmt::format("{}: no implementation can serve this call{}", op.name, reasons);
  }
  if (!out.error.empty())
    for (const DanglingToken& d : out.dangling) out.error += "; " + d.text;
  return out;
}

const Chain* OpManager::Rep::Resolve(const OpSchema& op, const tefl_call_frame& frame, const SigKey& key,
                                     const PolicyRecord& policy, uint64_t epoch, int32_t device_type,
                                     const std::string& sig) {
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = resolved.find(FullKey{key, policy.id});
    if (it != resolved.end() && it->second.epoch == epoch) return it->second.chain;
  }
  // supports() is vendor code: run it without holding the manager's lock.
  ResolvedCandidates rc = ResolveCandidates(op, frame, key, policy, device_type);
  // Once per op and token: a likely typo at WARNING, a vendor or impl that
  // is simply not there (a plugin not loaded here) at INFO.
  for (const DanglingToken& d : rc.dangling) {
    bool first;
    {
      std::lock_guard<std::mutex> lock(mu);
      first = dangling_logged.insert(std::string(op.name) + '\0' + d.token).second;
    }
    const int level = d.typo ? TEFL_LOG_WARNING : TEFL_LOG_INFO;
    if (first && LogEnabled(level))
      LogLine(level, __FILE__, __LINE__, fmt::format("Policy for op '{}': {}", op.name, d.text));
  }
  Chain chain;
  chain.impls = rc.chain;
  chain.strict = policy.policy.strict();
  if (chain.strict) chain.strict_label = StrictLabel(policy.policy);
  if (!rc.error.empty()) {
    chain.error_code = policy.policy.strict() ? TEFL_FAILED_PRECONDITION : TEFL_UNSUPPORTED;
    chain.error = rc.error;
  }
  if (VerboseFlagsNow() & kVerboseDispatch) {
    VerboseLine(fmt::format("dispatch,{},resolve,{},policy={},order={}", op.name, sig, policy.policy.Fingerprint(),
                            OrderString(policy.order_by_op[size_t(op.id)])));
    for (const CandidateReport& r : rc.reports) {
      VerboseLine(fmt::format("dispatch,{},candidate,{},{}{}{}", op.name, r.impl_id,
                              r.accepted ? "accepted" : "rejected", r.demoted ? ",demoted" : "",
                              r.reason.empty() ? "" : "," + r.reason));
    }
    std::string ids;
    for (const ImplRecord* r : chain.impls) ids += (ids.empty() ? "" : "|") + r->impl.impl_id;
    VerboseLine(fmt::format("dispatch,{},chain,{}", op.name, chain.error.empty() ? ids : "error: " + chain.error));
  }
  std::lock_guard<std::mutex> lock(mu);
  const Chain* interned = InternChain(std::move(chain));
  resolved[FullKey{key, policy.id}] = Resolved{epoch, interned};
  return interned;
}

void OpManager::Rep::Demote(const OpSchema& op, const SigKey& key, const ImplRecord* impl, const std::string& why,
                            const std::string& sig) {
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto& list = demoted[key];
    if (std::find(list.begin(), list.end(), impl) == list.end()) {
      list.push_back(impl);
      first = true;
    }
  }
  if (first) {
    TEFL_LOG(WARNING, "Op '{}' implementation {} failed for ({}): {}; demoted for this signature, falling back",
             op.name, ImplLabel(impl->impl), sig, why);
    BumpPolicyEpoch();  // every thread re-resolves this signature
  }
}

void OpManager::Rep::NoteFallback(const OpSchema& op, const SigKey& key, const ImplRecord* impl, const std::string& sig,
                                  const std::string& reasons) {
  bool first;
  {
    std::lock_guard<std::mutex> lock(mu);
    first = fallback_logged.insert({key, impl}).second;
  }
  const int level = first ? TEFL_LOG_INFO : TEFL_LOG_DEBUG;
  if (LogEnabled(level)) {
    LogLine(level, __FILE__, __LINE__,
            fmt::format("Op '{}' fell back to {} for ({}){}", op.name, ImplLabel(impl->impl), sig, reasons));
  }
}

OpManager::OpManager(OpRegistry* registry) : rep_(std::make_unique<Rep>()) {
  if (registry == nullptr) {
    rep_->owned = std::make_unique<OpRegistry>();
    registry = rep_->owned.get();
  }
  rep_->registry = registry;
}

OpManager::~OpManager() = default;

OpRegistry& OpManager::registry() { return *rep_->registry; }

namespace {
// Registers built-ins, keeping impl ids already present (a user may have
// registered an implementation with a built-in's id on purpose).
tefl_status* RegisterKeepingExisting(void* ctx, const tefl_impl_desc* desc) {
  OpRegistry* registry = static_cast<OpRegistry*>(ctx);
  Status s = registry->RegisterImpl(OpImpl::FromDesc(*desc, "builtin"));
  if (s.code() == TEFL_ALREADY_EXISTS) return nullptr;
  return s.ToC();
}
}  // namespace

void OpManager::EnsureInitialized() {
  // From a plugin's register function: the initialisation (this manager's, or
  // another's of the same registry) may be what is loading the plugin, on
  // this thread; waiting for it would wait for itself. Dispatch entry points
  // return FAILED_PRECONDITION there; this leaves the manager uninitialised.
  if (InPluginRegister()) return;
  std::call_once(rep_->init_once, [this] {
    OpRegistry* registry = rep_->registry;
    {
      // Every manager of the registry waits here until the built-ins and the
      // configured plugins are registered, whichever manager does the work:
      // the flags only say that someone has claimed it.
      std::lock_guard<std::mutex> init(registry->rep()->init_mu);
      bool need_builtins, need_plugins;
      {
        std::lock_guard<std::mutex> lock(registry->rep()->mu);
        need_builtins = !registry->rep()->builtins_registered;
        need_plugins = !registry->rep()->plugins_loaded;
        registry->rep()->builtins_registered = true;
        registry->rep()->plugins_loaded = true;
      }
      if (need_builtins) {
        tefl_registrar r = registry->Registrar();
        r.register_impl = RegisterKeepingExisting;
        Status s = Status::FromC(backends::RegisterBuiltinBackends(r));
        if (!s.ok()) TEFL_LOG(ERROR, "Registering the built-in backends failed: {}", s.ToString());
      }
      if (need_plugins) LoadConfiguredPlugins(*registry);
    }
    std::string ids;
    for (const std::string& id : registry->ImplIds()) ids += (ids.empty() ? "'" : ", '") + id + "'";
    TEFL_LOG(INFO, "Registered impl_ids: [{}]", ids);
    rep_->initialized.store(true, std::memory_order_release);
  });
}

Status OpManager::Call(std::string_view op_name, std::span<const DLTensor* const> inputs,
                       std::span<DLTensor* const> outputs, const void* attrs, void* stream) {
  const OpSchema* op = FindOp(op_name);
  if (op == nullptr) return Status(TEFL_NOT_FOUND, "unknown op '" + std::string(op_name) + "'");
  return Call(op->id, inputs, outputs, attrs, stream);
}

Status OpManager::Call(int32_t op_id, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
                       const void* attrs_in, void* stream) {
  const OpSchema* op = FindOp(op_id);
  if (op == nullptr) return Status(TEFL_NOT_FOUND, UnknownOpId(op_id));
  if (InPluginRegister()) return PluginRegisterDispatchError(op->name);
  if (!rep_->initialized.load(std::memory_order_acquire)) EnsureInitialized();

  NormalizedCall call;
  if (tefl_status* error = NormalizeCall(*op, inputs, outputs, attrs_in, &call)) return Status::FromC(error);
  const CallArgs& args = call.args;
  ThreadState& ts = t_thread_state;
  DispatchCache* cache = ThreadCache(ts);
  SigKey key;
  ValidationMemo::Entry* memo_entry = nullptr;
  if (tefl_status* e = ValidateCallMemo(*op, args, &key, &cache->validation, &memo_entry)) return Status::FromC(e);

  return rep_->Dispatch(*op, MakeFrame(*op, args, stream), key, memo_entry ? &memo_entry->resolution : nullptr, cache);
}

// Resolves (from `remembered` when it was resolved under the same manager,
// policy and epoch: no hashing, no probe; else from the per-thread `cache` by
// signature when given; else Resolve) and runs a validated call.
__attribute__((always_inline)) inline Status OpManager::Rep::Dispatch(const OpSchema& op, const tefl_call_frame& frame,
                                                                      const SigKey& key,
                                                                      ValidationMemo::Resolution* remembered,
                                                                      DispatchCache* cache) {
  const PolicyRecord* policy = EffectivePolicy(t_thread_state);
  const uint64_t epoch = g_policy_epoch.load(std::memory_order_acquire);
  const Chain* chain;
  if (remembered != nullptr && remembered->chain != nullptr &&
      ((remembered->owner_serial ^ serial) | (remembered->epoch ^ epoch) | (remembered->policy_id ^ policy->id)) == 0) {
    chain = static_cast<const Chain*>(remembered->chain);
  } else {
    chain = LookUpChain(op, frame, key, remembered, cache, policy, epoch);
  }
  // The common case: not verbose, and the first candidate runs. (Logging
  // was initialised with the manager, so the flags are read directly.)
  const ImplRecord* r = chain->first;
  if (r != nullptr && (logging_internal::g_verbose.load(std::memory_order_relaxed) & kVerboseExec) == 0) {
    tefl_status* st = r->impl.kernel(&frame, r->impl.user_data);
    if (st == nullptr) {
      if (last_used[size_t(op.id)].load(std::memory_order_relaxed) != r) NoteUsed(op, r);
      return Status::OK();
    }
    return RunChain(op, frame, key, *chain, st);
  }
  if (!chain->error.empty()) return Status(chain->error_code, chain->error);
  return RunChain(op, frame, key, *chain, nullptr);
}

__attribute__((noinline)) const Chain* OpManager::Rep::LookUpChain(const OpSchema& op, const tefl_call_frame& frame,
                                                                   const SigKey& key,
                                                                   ValidationMemo::Resolution* remembered,
                                                                   DispatchCache* cache, const PolicyRecord* policy,
                                                                   uint64_t epoch) {
  const Chain* chain;
  CacheEntry* slot = cache ? &cache->entries[key.Hash() & (kCacheSlots - 1)] : nullptr;
  if (slot != nullptr && slot->chain != nullptr && slot->key == key && slot->manager_serial == serial &&
      slot->epoch == epoch && slot->policy_id == policy->id) {
    chain = slot->chain;
  } else {
    chain = Resolve(op, frame, key, *policy, epoch, DeviceTypeOf(key), DescribeCall(op, ArgsOf(frame), false));
    if (slot != nullptr) *slot = CacheEntry{key, serial, epoch, policy->id, chain};
  }
  if (remembered != nullptr) *remembered = ValidationMemo::Resolution{chain, serial, epoch, policy->id};
  return chain;
}

void OpManager::Rep::NoteUsed(const OpSchema& op, const ImplRecord* r) {
  last_used[size_t(op.id)].store(r, std::memory_order_relaxed);
  TEFL_LOG(INFO, "Op '{}' using {}", op.name, ImplLabel(r->impl));
}

// The chain's candidates in order, from the first, whose result is `first`
// when it already ran (NULL: not run yet, or verbose timing is on).
Status OpManager::Rep::RunChain(const OpSchema& opr, const tefl_call_frame& frame, const SigKey& key,
                                const Chain& chain_ref, tefl_status* first) {
  const CallArgs args = ArgsOf(frame);
  const OpSchema* op = &opr;
  const Chain* chain = &chain_ref;
  const bool exec_verbose = first == nullptr && (VerboseFlagsNow() & kVerboseExec) != 0;
  std::string failures;  // only built when an implementation declines or fails
  for (size_t i = 0; i < chain->impls.size(); ++i) {
    const ImplRecord* r = chain->impls[i];
    std::chrono::steady_clock::time_point t0;
    tefl_status* st;
    if (i == 0 && first != nullptr) {
      st = first;
    } else {
      if (exec_verbose) t0 = std::chrono::steady_clock::now();
      st = r->impl.kernel(&frame, r->impl.user_data);
    }
    if (st == nullptr) {
      if (exec_verbose) {
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        VerboseLine(
            fmt::format("exec,{},{},{},{:.4f} ms", op->name, r->impl.impl_id, DescribeCall(*op, args, true), ms));
      }
      if (last_used[size_t(op->id)].load(std::memory_order_relaxed) != r) NoteUsed(*op, r);
      if (i > 0) NoteFallback(*op, key, r, DescribeCall(*op, args, false), failures);
      return Status::OK();
    }
    const int32_t code = tefl_status_code_of(st);
    const std::string message = tefl_status_message(st);
    tefl_status_free(st);
    if (code == TEFL_UNSUPPORTED) {
      TEFL_LOG(DEBUG, "Op '{}' implementation '{}' declined: {}", op->name, r->impl.impl_id, message);
      failures += fmt::format("; '{}' declined: {}", r->impl.impl_id, message);
      if (chain->strict) {
        return Status(TEFL_FAILED_PRECONDITION, fmt::format("{}: {}: the first candidate {} declined: {}", op->name,
                                                            chain->strict_label, ImplLabel(r->impl), message));
      }
      continue;
    }
    if (chain->strict) {
      return Status(code,
                    fmt::format("{}: {}: {} failed: {}", op->name, chain->strict_label, ImplLabel(r->impl), message));
    }
    if ((op->flags & kOpInPlace) || (key.w[0] & kSigInPlaceBit)) {
      return Status(code, fmt::format("{}: {} failed: {} (in-place op: not retried, outputs may be modified)", op->name,
                                      ImplLabel(r->impl), message));
    }
    failures += fmt::format("; '{}' failed: {}", r->impl.impl_id, message);
    Demote(*op, key, r, message, DescribeCall(*op, args, false));
  }
  return Status(TEFL_UNSUPPORTED, fmt::format("{}: no implementation accepted the call{}", op->name, failures));
}

Resolution OpManager::Explain(int32_t op_id, std::span<const DLTensor* const> inputs,
                              std::span<DLTensor* const> outputs, const void* attrs_in) {
  Resolution res;
  const OpSchema* op = FindOp(op_id);
  if (op == nullptr) {
    res.error = UnknownOpId(op_id);
    return res;
  }
  if (InPluginRegister()) {
    res.error = PluginRegisterDispatchError(op->name).message();
    return res;
  }
  EnsureInitialized();
  res.op_name = op->name;
  const PolicyRecord* policy = EffectivePolicy();
  res.policy = policy->policy.Fingerprint();
  for (const PolicyToken& t : policy->order_by_op[size_t(op->id)]) res.order.push_back(t.ToString());
  NormalizedCall call;
  if (tefl_status* error = NormalizeCall(*op, inputs, outputs, attrs_in, &call)) {
    res.error = Status::FromC(error).message();
    return res;
  }
  const CallArgs& args = call.args;
  SigKey key;
  if (tefl_status* e = ValidateCall(*op, args, &key)) {
    res.error = Status::FromC(e).message();
    return res;
  }
  res.signature = DescribeCall(*op, args, false);
  const tefl_call_frame frame = MakeFrame(*op, args, nullptr);
  ResolvedCandidates rc = rep_->ResolveCandidates(*op, frame, key, *policy, DeviceTypeOf(key));
  res.candidates = std::move(rc.reports);
  for (const ImplRecord* r : rc.chain) res.chain.push_back(r->impl.impl_id);
  res.error = rc.error;
  return res;
}

std::string OpManager::GetSelectedImplId(std::string_view op_name) const {
  const OpSchema* op = FindOp(op_name);
  if (op == nullptr) return "";
  const ImplRecord* r = rep_->last_used[size_t(op->id)].load(std::memory_order_relaxed);
  return r ? r->impl.impl_id : "";
}

OpRegistry& GetDefaultRegistry() {
  static OpRegistry* registry = new OpRegistry();  // never destroyed: usable during exit
  return *registry;
}

OpManager& GetDefaultManager() {
  static OpManager* manager = new OpManager(&GetDefaultRegistry());
  return *manager;
}

}  // namespace tefl

// ---- Prepared calls -----------------------------------------------------------
namespace tefl {

struct PreparedCall::Rep {
  OpManager* manager = nullptr;
  const OpSchema* op = nullptr;
  int32_t num_inputs = 0, num_outputs = 0;
  bool prepared_in_place = false;  // the prepared pointers aliased in place: every run takes the full path
  // Per argument (inputs, then outputs): the tensor kernels see (NULL when
  // absent; its data replaced per run) and what the pointer checks need.
  // Branch-free per run: an absent argument writes its pointer into `unused`
  // and has absent_mask set; an empty one has range_mask 0.
  struct Arg {
    DLTensor* tensor;  // the copy in `tensors`, or &unused when absent
    uint64_t byte_offset;
    int64_t lo_off, hi_off;  // byte range relative to data + byte_offset
    uint64_t align_mask;     // element bytes - 1
    uint64_t range_mask;     // ~0 for a non-empty present tensor, else 0
    uint64_t absent_mask;    // ~0 for an absent argument, else 0
  };
  Arg args[kMaxOpArgs];
  DLTensor unused{};
  DLTensor tensors[kMaxOpArgs];  // the metadata copies
  const DLTensor* inputs[kMaxOpArgs];
  DLTensor* outputs[kMaxOpArgs];
  std::vector<int64_t> dims;  // shapes and strides of `tensors` (never resized after Prepare)
  alignas(16) unsigned char attrs[kMaxAttrsSize];
  tefl_call_frame frame;  // its stream is set per run
  SigKey key{};
  ValidationMemo::Resolution resolution;
  // The data pointers of the last run whose pointer checks all passed (full
  // arity form), valid while last_checked: those checks are a pure function
  // of the pointers and the prepared metadata, so a run on the same pointers
  // skips them. Content checks (kOpChecksData) still run every time.
  bool last_checked = false;
  void* last_data[kMaxOpArgs];
};

Status OpManager::Prepare(int32_t op_id, std::span<const DLTensor* const> inputs, std::span<DLTensor* const> outputs,
                          const void* attrs_in, PreparedCall* out) {
  const OpSchema* op = FindOp(op_id);
  if (op == nullptr) return Status(TEFL_NOT_FOUND, UnknownOpId(op_id));
  if (out == nullptr) return Status(TEFL_INVALID_ARGUMENT, fmt::format("{}: Prepare: out is NULL", op->name));
  if (InPluginRegister()) return PluginRegisterDispatchError(op->name);
  if (!rep_->initialized.load(std::memory_order_acquire)) EnsureInitialized();
  NormalizedCall call;
  if (tefl_status* error = NormalizeCall(*op, inputs, outputs, attrs_in, &call)) return Status::FromC(error);
  const CallArgs& args = call.args;
  SigKey key;
  ByteRanges ranges;
  if (tefl_status* e = ValidateCall(*op, args, &key, &ranges)) return Status::FromC(e);

  auto rep = std::make_unique<PreparedCall::Rep>();
  rep->manager = this;
  rep->op = op;
  rep->num_inputs = args.num_inputs;
  rep->num_outputs = args.num_outputs;
  rep->key = key;
  rep->prepared_in_place = (key.w[0] & kSigInPlaceBit) != 0;
  const void* attrs_ptr = nullptr;  // NULL for an op without attributes
  if (args.attrs != nullptr && op->attrs_size != 0) {
    // Our own copy of the host's struct (a newer caller's longer struct is
    // cut to the fields this library knows, and says so in struct_size).
    std::memcpy(rep->attrs, args.attrs, op->attrs_size);
    std::memcpy(rep->attrs, &op->attrs_size, sizeof(size_t));
    attrs_ptr = rep->attrs;
  }
  const int n = args.num_inputs + args.num_outputs;
  size_t dims_needed = 0;
  for (int i = 0; i < n; ++i)
    if (const DLTensor* t = TensorAt(args, i)) dims_needed += size_t(t->ndim) * (t->strides ? 2 : 1);
  rep->dims.reserve(dims_needed);
  for (int i = 0; i < n; ++i) {
    const DLTensor* t = TensorAt(args, i);
    DLTensor* copy = &rep->tensors[i];
    if (i < args.num_inputs)
      rep->inputs[i] = t ? copy : nullptr;
    else
      rep->outputs[i - args.num_inputs] = t ? copy : nullptr;
    if (t == nullptr) {
      rep->args[i] = PreparedCall::Rep::Arg{&rep->unused, 0, 0, 0, 0, 0, ~uint64_t(0)};
      continue;
    }
    *copy = *t;
    copy->shape = rep->dims.data() + rep->dims.size();
    rep->dims.insert(rep->dims.end(), t->shape, t->shape + t->ndim);
    if (t->strides != nullptr) {
      copy->strides = rep->dims.data() + rep->dims.size();
      rep->dims.insert(rep->dims.end(), t->strides, t->strides + t->ndim);
    }
    const uintptr_t base = reinterpret_cast<uintptr_t>(t->data) + t->byte_offset;
    const bool empty = ranges.lo[i] == ranges.hi[i];
    rep->args[i] = PreparedCall::Rep::Arg{copy,
                                          t->byte_offset,
                                          empty ? 0 : int64_t(ranges.lo[i] - base),
                                          empty ? 0 : int64_t(ranges.hi[i] - base),
                                          uint64_t(t->dtype.bits >= 8 ? t->dtype.bits / 8 : 1) - 1,
                                          empty ? 0 : ~uint64_t(0),
                                          0};
  }
  rep->frame = MakeFrame(*op, CallArgs{rep->inputs, rep->num_inputs, rep->outputs, rep->num_outputs, attrs_ptr},
                         /*stream=*/nullptr);
  out->rep_ = std::move(rep);
  return Status::OK();
}

PreparedCall::PreparedCall() = default;
PreparedCall::~PreparedCall() = default;
PreparedCall::PreparedCall(PreparedCall&&) noexcept = default;
PreparedCall& PreparedCall::operator=(PreparedCall&&) noexcept = default;

std::string_view PreparedCall::op_name() const { return rep_ ? std::string_view(rep_->op->name) : std::string_view(); }

namespace {
// One argument of a prepared run: its new data pointer (also kept in *last), the pointer checks
// (accumulated into *bad) and its byte range ([0, 0) when empty or absent).
// *absent_given collects the pointers given for absent arguments (must be 0).
inline void SetPreparedArg(const PreparedCall::Rep::Arg& a, void* data, void** last, uint64_t* bad,
                           uint64_t* absent_given, uintptr_t* lo, uintptr_t* hi) {
  const auto bits = reinterpret_cast<uintptr_t>(data);
  a.tensor->data = data;
  *last = data;
  *absent_given |= bits & a.absent_mask;
  const uintptr_t base = bits + a.byte_offset;
  *bad |= (uint64_t(bits == 0) | (base & a.align_mask)) & a.range_mask;
  *lo = (base + uintptr_t(a.lo_off)) & a.range_mask;
  *hi = (base + uintptr_t(a.hi_off)) & a.range_mask;
}

// Whether some output overlaps another argument (empty ranges are [0, 0)):
// the screen of NoOverlap, without early exits.
inline bool AnyOverlap(int nin, int n, const uintptr_t* lo, const uintptr_t* hi) {
  uint64_t any = 0;
  for (int o = nin; o < n; ++o)
    for (int i = 0; i < o; ++i) any |= uint64_t(lo[i] < hi[o]) & uint64_t(lo[o] < hi[i]);
  return any != 0;
}
}  // namespace

namespace {
// Whether now[i] == last[i] for every i.
__attribute__((always_inline)) inline bool SamePointers(std::span<void* const> now, void* const* last) {
  for (size_t i = 0; i < now.size(); ++i)
    if (now[i] != last[i]) return false;
  return true;
}
}  // namespace

// The rest of a run once the pointers passed their checks (just now, or on
// an earlier run with the same pointers): content checks, then dispatch.
__attribute__((always_inline)) inline Status PreparedCall::RunChecked(void* stream) {
  Rep& p = *rep_;
  const OpSchema& op = *p.op;
  if ((op.flags & kOpChecksData) && op.check_shapes != nullptr) {
    const CallArgs args{p.inputs, p.num_inputs, p.outputs, p.num_outputs, p.frame.attrs};
    if (tefl_status* err = op.check_shapes(op, args)) return Status::FromC(err);
  }
  p.frame.stream = stream;
  return p.manager->rep_->Dispatch(op, p.frame, p.key, &p.resolution, nullptr);
}

Status PreparedCall::Run(std::span<void* const> input_data, std::span<void* const> output_data, void* stream) {
  // The steady state of a training loop: the full argument form on the same
  // buffers as the last run, whose pointer checks passed.
  const Rep* r = rep_.get();
  if (r != nullptr && r->last_checked && input_data.size() == size_t(r->num_inputs) &&
      output_data.size() == size_t(r->num_outputs)) {
    if (SamePointers(input_data, r->last_data) && SamePointers(output_data, r->last_data + r->num_inputs))
      return RunChecked(stream);
  }
  return RunFull(input_data, output_data, stream);
}

// Every other run: the pointer checks, then RunChecked (or OpManager::Call
// for an error or an alias, which reports it exactly as a call would).
__attribute__((noinline)) Status PreparedCall::RunFull(std::span<void* const> input_data,
                                                       std::span<void* const> output_data, void* stream) {
  if (rep_ == nullptr) return Status(TEFL_FAILED_PRECONDITION, "PreparedCall::Run: the call was not prepared");
  Rep& p = *rep_;
  const OpSchema& op = *p.op;
  const int nin = p.num_inputs, n = nin + p.num_outputs;
  // The op's full arity, or its first release's (later arguments absent).
  const size_t gin = input_data.size(), gout = output_data.size();
  const bool first_form = op.first_inputs >= 0 && gin == size_t(op.first_inputs) && gout == size_t(op.first_outputs);
  if (!first_form && (gin != size_t(nin) || gout != size_t(p.num_outputs))) {
    return Status(TEFL_INVALID_ARGUMENT,
                  fmt::format("{}: PreparedCall::Run: expected {} input and {} output data pointers (as prepared), "
                              "got {} and {}",
                              op.name, nin, p.num_outputs, gin, gout));
  }
  p.last_checked = false;
  uintptr_t lo[kMaxOpArgs], hi[kMaxOpArgs];
  uint64_t bad = 0;  // any NULL or misaligned data of a non-empty tensor
  uint64_t absent_given = 0;
  auto data_at = [&](int i) -> void* {
    if (i < nin) return size_t(i) < gin ? input_data[size_t(i)] : nullptr;
    return size_t(i - nin) < gout ? output_data[size_t(i - nin)] : nullptr;
  };
  if (!first_form) {
    for (int i = 0; i < nin; ++i)
      SetPreparedArg(p.args[i], input_data[size_t(i)], &p.last_data[i], &bad, &absent_given, &lo[i], &hi[i]);
    for (int i = nin; i < n; ++i)
      SetPreparedArg(p.args[i], output_data[size_t(i - nin)], &p.last_data[i], &bad, &absent_given, &lo[i], &hi[i]);
  } else {
    for (int i = 0; i < n; ++i)
      SetPreparedArg(p.args[i], data_at(i), &p.last_data[i], &bad, &absent_given, &lo[i], &hi[i]);
  }
  if (absent_given != 0) {
    for (int i = 0; i < n; ++i) {
      if (p.args[i].absent_mask != 0 && data_at(i) != nullptr) {
        return Status(TEFL_INVALID_ARGUMENT,
                      fmt::format("{}: argument '{}' was absent when the call was prepared; its data pointer must "
                                  "be NULL",
                                  op.name, ArgAt(op, i).name));
      }
    }
  }
  if (bad != 0 || p.prepared_in_place || ((op.flags & kOpNoAlias) && AnyOverlap(nin, n, lo, hi))) {
    // A pointer error, or arguments that overlap: the full path names the
    // error exactly as OpManager::Call would, or accepts an in-place alias.
    return p.manager->Call(op.id, std::span<const DLTensor* const>(p.inputs, size_t(nin)),
                           std::span<DLTensor* const>(p.outputs, size_t(p.num_outputs)), p.frame.attrs, stream);
  }
  p.last_checked = !first_form;  // last_data holds this run's pointers
  return RunChecked(stream);
}

}  // namespace tefl
