// SelectionPolicy: TE-FL's environment contract (with its defects fixed),
// token parsing, interning and the global / scoped policy.
#include <cstdlib>
#include <memory>
#include <mutex>
#include <unordered_map>

#include "core/catalogue.h"
#include "core/logging.h"
#include "core/policy_state.h"
#include "core/strings.h"

namespace tefl {

// ---- tokens -------------------------------------------------------------------
std::string PolicyToken::ToString() const {
  switch (type) {
    case kFlagos:
      return "flagos";
    case kVendor:
      return "vendor";
    case kReference:
      return "reference";
    case kVendorName:
      return "vendor:" + arg;
    case kImplId:
      return "impl:" + arg;
  }
  return "?";
}

std::optional<PolicyToken> PolicyToken::Parse(std::string_view text) {
  const std::string_view t = Trim(text);
  const std::string lower = ToLower(t);
  if (lower == "flagos" || lower == "default") return PolicyToken{kFlagos, ""};
  if (lower == "vendor") return PolicyToken{kVendor, ""};
  if (lower == "reference") return PolicyToken{kReference, ""};
  if (lower.rfind("vendor:", 0) == 0) {
    std::string name = ToLower(Trim(t.substr(7)));
    if (name.empty()) return std::nullopt;
    return PolicyToken{kVendorName, name};
  }
  if (lower.rfind("impl:", 0) == 0) {
    std::string id(Trim(t.substr(5)));
    if (id.empty()) return std::nullopt;
    return PolicyToken{kImplId, id};
  }
  return std::nullopt;
}

bool MatchToken(const OpImpl& impl, const PolicyToken& token) {
  switch (token.type) {
    case PolicyToken::kFlagos:
      return impl.kind == BackendImplKind::DEFAULT;
    case PolicyToken::kVendor:
      return impl.kind == BackendImplKind::VENDOR;
    case PolicyToken::kReference:
      return impl.kind == BackendImplKind::REFERENCE;
    case PolicyToken::kVendorName:
      return impl.kind == BackendImplKind::VENDOR && ToLower(impl.vendor) == token.arg;
    case PolicyToken::kImplId:
      return impl.impl_id == token.arg;
  }
  return false;
}

// ---- SelectionPolicy ------------------------------------------------------------
namespace {

std::optional<std::string> CanonicalPrefer(std::string_view prefer) {
  std::string p = ToLower(Trim(prefer));
  if (p == "flagos" || p == "vendor" || p == "reference") return p;
  return std::nullopt;
}

std::set<std::string> LowerSet(const std::set<std::string>& in) {
  std::set<std::string> out;
  for (const auto& s : in) {
    std::string v = ToLower(Trim(s));
    if (!v.empty()) out.insert(v);
  }
  return out;
}

// "1/true/yes/on" and "0/false/no/off" (any case); nullopt otherwise.
std::optional<bool> ParseBool(std::string_view text) {
  const std::string v = ToLower(Trim(text));
  if (v == "1" || v == "true" || v == "yes" || v == "on") return true;
  if (v == "0" || v == "false" || v == "no" || v == "off") return false;
  return std::nullopt;
}

std::set<std::string> ParseVendorList(std::string_view text) {
  std::set<std::string> out;
  for (std::string_view piece : Split(text, ',')) {
    std::string v = ToLower(Trim(piece));
    if (!v.empty()) out.insert(v);
  }
  return out;
}

}  // namespace

Status SelectionPolicy::Make(std::string_view prefer, bool strict,
                             const std::map<std::string, std::vector<std::string>>& per_op_order,
                             const std::set<std::string>& deny_vendors,
                             const std::optional<std::set<std::string>>& allow_vendors, SelectionPolicy* out) {
  if (out == nullptr) return Status(TEFL_INVALID_ARGUMENT, "SelectionPolicy::Make: out is NULL");
  SelectionPolicy p;
  auto pref = CanonicalPrefer(prefer);
  if (!pref) {
    return Status(TEFL_INVALID_ARGUMENT, "SelectionPolicy: invalid prefer '" + std::string(prefer) +
                                             "': expected flagos, vendor or reference");
  }
  p.prefer_ = *pref;
  p.strict_ = strict;
  for (const auto& [op, tokens] : per_op_order) {
    const OpSchema* schema = FindOp(Trim(op));
    if (schema == nullptr)
      return Status(TEFL_INVALID_ARGUMENT,
                    "SelectionPolicy: unknown op '" + op + "' in per_op_order" + DidYouMeanOp(Trim(op)));
    std::vector<PolicyToken> parsed;
    for (const std::string& tok : tokens) {
      auto t = PolicyToken::Parse(tok);
      if (!t) {
        return Status(TEFL_INVALID_ARGUMENT, "SelectionPolicy: invalid token '" + tok + "' for op '" + op +
                                                 "': expected flagos, vendor, reference, vendor:NAME or impl:ID");
      }
      parsed.push_back(*t);
    }
    if (parsed.empty()) return Status(TEFL_INVALID_ARGUMENT, "SelectionPolicy: empty order for op '" + op + "'");
    p.per_op_[schema->name] = std::move(parsed);
  }
  p.deny_ = LowerSet(deny_vendors);
  if (allow_vendors) p.allow_ = LowerSet(*allow_vendors);
  p.sources_ = {
      {"prefer", "code"}, {"strict", "code"}, {"per_op", "code"}, {"deny_vendors", "code"}, {"allow_vendors", "code"}};
  *out = std::move(p);
  return Status::OK();
}

SelectionPolicy SelectionPolicy::FromEnv(std::vector<std::string>* warnings, const EnvLookup& lookup) {
  auto get = [&](const char* name) -> const char* { return lookup ? lookup(name) : std::getenv(name); };
  auto warn = [&](std::string w) {
    if (warnings) warnings->push_back(std::move(w));
  };
  SelectionPolicy p;
  p.sources_ = {{"prefer", "default"},
                {"strict", "default"},
                {"per_op", "default"},
                {"deny_vendors", "default"},
                {"allow_vendors", "default"}};

  bool prefer_set = false;
  if (const char* v = get("TE_FL_PREFER"); v && !Trim(v).empty()) {
    if (auto pref = CanonicalPrefer(v)) {
      p.prefer_ = *pref;
      p.sources_["prefer"] = "TE_FL_PREFER";
      prefer_set = true;
    } else {
      warn(std::string("Ignoring TE_FL_PREFER='") + v + "': expected flagos, vendor or reference");
    }
  }
  if (!prefer_set) {
    if (const char* v = get("TE_FL_PREFER_VENDOR"); v && !Trim(v).empty()) {
      if (auto b = ParseBool(v)) {
        p.prefer_ = *b ? kPreferVendor : kPreferDefault;
        p.sources_["prefer"] = "TE_FL_PREFER_VENDOR";
      } else {
        warn(std::string("Ignoring TE_FL_PREFER_VENDOR='") + v + "': expected 1, true, yes, on or 0, false, no, off");
      }
    }
  }
  if (const char* v = get("TE_FL_STRICT"); v && !Trim(v).empty()) {
    if (auto b = ParseBool(v)) {
      p.strict_ = *b;
      p.sources_["strict"] = "TE_FL_STRICT";
    } else {
      warn(std::string("Ignoring TE_FL_STRICT='") + v + "': expected 1, true, yes, on or 0, false, no, off");
    }
  }
  // TE-FL's switch for its CUDA backend: tefl has none yet, so a valid value
  // changes nothing, but a malformed one is said like any other.
  if (const char* v = get("TE_FL_SKIP_CUDA"); v && !Trim(v).empty() && !ParseBool(v))
    warn(std::string("Ignoring TE_FL_SKIP_CUDA='") + v + "': expected 1, true, yes, on or 0, false, no, off");
  if (const char* v = get("TE_FL_DENY_VENDORS"); v && !Trim(v).empty()) {
    auto deny = ParseVendorList(v);
    if (deny.empty()) {  // separators only, e.g. ' , ': as ALLOW, said rather than silent
      warn(std::string("Ignoring TE_FL_DENY_VENDORS='") + v + "': it names no vendor");
    } else {
      p.deny_ = std::move(deny);
      p.sources_["deny_vendors"] = "TE_FL_DENY_VENDORS";
    }
  }
  if (const char* v = get("TE_FL_ALLOW_VENDORS"); v) {
    auto allow = ParseVendorList(v);
    if (allow.empty()) {
      if (!Trim(v).empty()) warn(std::string("Ignoring TE_FL_ALLOW_VENDORS='") + v + "': it names no vendor");
    } else {
      p.allow_ = std::move(allow);
      p.sources_["allow_vendors"] = "TE_FL_ALLOW_VENDORS";
    }
  }
  if (const char* v = get("TE_FL_PER_OP"); v && !Trim(v).empty()) {
    for (std::string_view entry : Split(v, ';')) {
      entry = Trim(entry);
      if (entry.empty()) continue;
      const size_t eq = entry.find('=');
      if (eq == std::string_view::npos) {
        warn("Ignoring TE_FL_PER_OP entry '" + std::string(entry) + "': expected op=token|token");
        continue;
      }
      const std::string_view op = Trim(entry.substr(0, eq));
      const OpSchema* schema = FindOp(op);
      if (schema == nullptr) {
        warn("Ignoring TE_FL_PER_OP entry '" + std::string(entry) + "': unknown op '" + std::string(op) + "'");
        continue;
      }
      std::vector<PolicyToken> tokens;
      const std::vector<std::string_view> pieces = Split(entry.substr(eq + 1), '|');
      for (size_t i = 0; i < pieces.size(); ++i) {
        const std::string_view tok = pieces[i];
        if (Trim(tok).empty()) {
          // Between two tokens ('a||b'), an empty one is a typo as much as a
          // bad token; a leading or trailing '|' is skipped like a ';'.
          if (i > 0 && i + 1 < pieces.size())
            warn("Ignoring TE_FL_PER_OP token '' (between '|' and '|') for op '" + std::string(op) +
                 "': expected flagos, vendor, reference, vendor:NAME or impl:ID");
          continue;
        }
        if (auto t = PolicyToken::Parse(tok)) {
          tokens.push_back(*t);
        } else {
          warn("Ignoring TE_FL_PER_OP token '" + std::string(Trim(tok)) + "' for op '" + std::string(op) +
               "': expected flagos, vendor, reference, vendor:NAME or impl:ID");
        }
      }
      if (tokens.empty()) {
        warn("Ignoring TE_FL_PER_OP entry '" + std::string(entry) + "': no valid token");
        continue;
      }
      if (p.per_op_.count(schema->name)) {
        warn("TE_FL_PER_OP names op '" + std::string(schema->name) + "' more than once; the last entry wins");
      }
      p.per_op_[schema->name] = std::move(tokens);
      p.sources_["per_op"] = "TE_FL_PER_OP";
    }
  }
  return p;
}

std::vector<PolicyToken> SelectionPolicy::DefaultOrder() const {
  using T = PolicyToken;
  if (prefer_ == kPreferVendor) return {T{T::kVendor, ""}, T{T::kFlagos, ""}, T{T::kReference, ""}};
  if (prefer_ == kPreferReference) return {T{T::kReference, ""}, T{T::kFlagos, ""}, T{T::kVendor, ""}};
  return {T{T::kFlagos, ""}, T{T::kVendor, ""}, T{T::kReference, ""}};
}

std::vector<PolicyToken> SelectionPolicy::OrderFor(std::string_view op_name) const {
  const OpSchema* schema = FindOp(op_name);
  if (schema) {
    auto it = per_op_.find(schema->name);
    if (it != per_op_.end()) return it->second;
  }
  return DefaultOrder();
}

bool SelectionPolicy::IsVendorAllowed(std::string_view vendor) const {
  const std::string v = ToLower(Trim(vendor));
  if (deny_.count(v)) return false;
  if (allow_ && !allow_->count(v)) return false;
  return true;
}

std::string SelectionPolicy::Fingerprint() const {
  // Every name is length-prefixed ("5:acme"), so names holding the separators
  // cannot make two different policies print the same.
  auto item = [](const std::string& v) { return std::to_string(v.size()) + ":" + v; };
  std::string s = "prefer=" + prefer_ + ";strict=" + (strict_ ? "1" : "0") + ";deny=";
  for (const auto& d : deny_) s += item(d) + ",";
  s += ";allow=";
  if (!allow_) {
    s += "*";
  } else {
    for (const auto& a : *allow_) s += item(a) + ",";
  }
  s += ";per_op=";
  for (const auto& [op, tokens] : per_op_) {
    s += item(op) + "=";
    for (const PolicyToken& t : tokens) s += item(t.ToString()) + "|";
    s += ";";
  }
  return s;
}

SelectionPolicy SelectionPolicy::WithStrict(bool strict) const {
  SelectionPolicy p = *this;
  p.strict_ = strict;
  p.sources_["strict"] = "code";
  return p;
}
SelectionPolicy SelectionPolicy::WithPrefer(std::string_view prefer) const {
  SelectionPolicy p = *this;
  if (auto pref = CanonicalPrefer(prefer)) {
    p.prefer_ = *pref;
    p.sources_["prefer"] = "code";
  }
  return p;
}
SelectionPolicy SelectionPolicy::WithAllowedVendors(const std::set<std::string>& vendors) const {
  SelectionPolicy p = *this;
  p.allow_ = LowerSet(vendors);
  p.sources_["allow_vendors"] = "code";
  return p;
}
SelectionPolicy SelectionPolicy::WithDeniedVendors(const std::set<std::string>& vendors) const {
  SelectionPolicy p = *this;
  p.deny_ = LowerSet(vendors);
  p.sources_["deny_vendors"] = "code";
  return p;
}

// ---- interning, global, scoped ----------------------------------------------------
std::atomic<uint64_t> g_policy_epoch{1};
constinit thread_local ThreadState t_thread_state __attribute__((tls_model("initial-exec"))) = {nullptr, nullptr};
std::atomic<const PolicyRecord*> g_global_policy{nullptr};

namespace {
std::mutex g_intern_mu;
std::unordered_map<std::string, std::unique_ptr<PolicyRecord>>& InternTable() {
  static auto* table = new std::unordered_map<std::string, std::unique_ptr<PolicyRecord>>();  // never freed
  return *table;
}
std::once_flag g_global_once;

const PolicyRecord* PolicyFromEnvLogged() {
  std::vector<std::string> warnings;
  SelectionPolicy p = SelectionPolicy::FromEnv(&warnings);
  for (const auto& w : warnings) TEFL_LOG(WARNING, "{}", w);
  return InternPolicy(p);
}
}  // namespace

const PolicyRecord* InternPolicy(const SelectionPolicy& policy) {
  // Same content, same record; except that strict mode set by TE_FL_STRICT
  // and strict mode set in code get records of their own, because errors name
  // where strict came from (the record keeps the first policy's sources).
  std::string fp = policy.Fingerprint();
  const auto strict_source = policy.sources().find("strict");
  if (policy.strict() && strict_source != policy.sources().end() && strict_source->second == "TE_FL_STRICT")
    fp += "|strict from TE_FL_STRICT";
  std::lock_guard<std::mutex> lock(g_intern_mu);
  auto& table = InternTable();
  auto it = table.find(fp);
  if (it != table.end()) return it->second.get();
  auto rec = std::make_unique<PolicyRecord>();
  rec->id = uint32_t(table.size() + 1);
  rec->policy = policy;
  rec->default_order = policy.DefaultOrder();
  for (const OpSchema& op : AllOps()) {
    if (op.name) rec->order_by_op[size_t(op.id)] = policy.OrderFor(op.name);
  }
  const PolicyRecord* out = rec.get();
  table.emplace(std::move(fp), std::move(rec));
  return out;
}

const PolicyRecord* GlobalPolicyRecordFirstUse() {
  std::call_once(g_global_once, [] {
    const PolicyRecord* expected = nullptr;
    g_global_policy.compare_exchange_strong(expected, PolicyFromEnvLogged());
  });
  return g_global_policy.load(std::memory_order_acquire);
}

SelectionPolicy GetPolicy() { return EffectivePolicy()->policy; }

void SetGlobalPolicy(const SelectionPolicy& policy) {
  GlobalPolicyRecord();  // the env is read once, before any override
  g_global_policy.store(InternPolicy(policy), std::memory_order_release);
  BumpPolicyEpoch();
}

void ResetGlobalPolicy() {
  GlobalPolicyRecord();
  g_global_policy.store(PolicyFromEnvLogged(), std::memory_order_release);
  BumpPolicyEpoch();
}

uint64_t GetPolicyEpoch() { return g_policy_epoch.load(std::memory_order_acquire); }
uint64_t BumpPolicyEpoch() { return g_policy_epoch.fetch_add(1, std::memory_order_acq_rel) + 1; }

PolicyContext::PolicyContext(const SelectionPolicy& policy) : previous_(t_thread_state.override_policy) {
  t_thread_state.override_policy = InternPolicy(policy);
}
PolicyContext::~PolicyContext() { t_thread_state.override_policy = static_cast<const PolicyRecord*>(previous_); }

}  // namespace tefl
