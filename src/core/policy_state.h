// Process-wide policy state behind the public policy functions: interned
// policy records (never freed, so the hot path can hold raw pointers), the
// global policy, the epoch, and the per-thread state (scoped override and the
// dispatch cache).
#ifndef TEFL_SRC_CORE_POLICY_STATE_H_
#define TEFL_SRC_CORE_POLICY_STATE_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <vector>

#include "tefl/tefl.hpp"

namespace tefl {

struct PolicyRecord {
  uint32_t id;  // unique per distinct fingerprint
  SelectionPolicy policy;
  std::vector<PolicyToken> default_order;
  std::array<std::vector<PolicyToken>, TEFL_OP_COUNT_> order_by_op;  // per-op or default
};

// Interns a policy (same fingerprint → same record).
const PolicyRecord* InternPolicy(const SelectionPolicy& policy);

// The process-wide policy (NULL until first use: then read from the
// environment, once, by GlobalPolicyRecordFirstUse).
extern std::atomic<const PolicyRecord*> g_global_policy;
const PolicyRecord* GlobalPolicyRecordFirstUse();
inline const PolicyRecord* GlobalPolicyRecord() {
  const PolicyRecord* p = g_global_policy.load(std::memory_order_acquire);
  return p ? p : GlobalPolicyRecordFirstUse();
}

extern std::atomic<uint64_t> g_policy_epoch;

struct DispatchCache;  // manager.cpp
// Plain-old-data so the thread_local needs no guard on access; 16 bytes of
// initial-exec TLS (no __tls_get_addr call on the hot path; glibc keeps
// static TLS room for this much even when libtefl is dlopen'ed).
struct ThreadState {
  const PolicyRecord* override_policy;
  DispatchCache* cache;
};
extern constinit thread_local ThreadState t_thread_state __attribute__((tls_model("initial-exec")));

inline const PolicyRecord* EffectivePolicy(const ThreadState& ts) {
  const PolicyRecord* p = ts.override_policy;
  return p ? p : GlobalPolicyRecord();
}
inline const PolicyRecord* EffectivePolicy() { return EffectivePolicy(t_thread_state); }

}  // namespace tefl

#endif  // TEFL_SRC_CORE_POLICY_STATE_H_
