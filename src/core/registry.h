// Registry internals shared with the manager: immutable implementation
// records that live as long as their registry (Clear() keeps them, so a call
// in flight or a cached chain never sees a dangling record).
#ifndef TEFL_SRC_CORE_REGISTRY_H_
#define TEFL_SRC_CORE_REGISTRY_H_

#include <array>
#include <memory>
#include <mutex>
#include <vector>

#include "tefl/tefl.hpp"

namespace tefl {

struct ImplRecord {
  OpImpl impl;
  int32_t op_id;
};

struct OpRegistry::Rep {
  mutable std::mutex mu;
  std::array<std::vector<const ImplRecord*>, TEFL_OP_COUNT_> by_op;  // registration order
  std::vector<std::unique_ptr<ImplRecord>> records;                  // every record ever added
  bool builtins_registered = false;
  bool plugins_loaded = false;  // LoadConfiguredPlugins ran for this registry

  // Under mu.
  Status CheckLocked(const OpImpl& impl, int32_t* op_id) const;
  void AddLocked(const OpImpl& impl, int32_t op_id);
  std::vector<const ImplRecord*> ImplsOf(int32_t op_id) const;
};

}  // namespace tefl

#endif  // TEFL_SRC_CORE_REGISTRY_H_
