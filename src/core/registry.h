// Registry internals shared with the manager: immutable implementation
// records that live as long as their registry (Clear() keeps them, so a call
// in flight or a cached chain never sees a dangling record).
#ifndef TEFL_SRC_CORE_REGISTRY_H_
#define TEFL_SRC_CORE_REGISTRY_H_

#include <array>
#include <memory>
#include <mutex>
#include <string_view>
#include <vector>

#include "tefl/tefl.hpp"

namespace tefl {

struct ImplRecord {
  OpImpl impl;
  int32_t op_id;
};

// A number no other registry of this process has or had (a destroyed
// registry's address is reused by the next one: never key state by it).
uint64_t NextRegistryId();

struct OpRegistry::Rep {
  const uint64_t id = NextRegistryId();
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

// True on a thread that is inside a plugin's tefl_plugin_register (the
// loader sets it around the call): dispatching an op from there would wait
// on the manager's initialisation that is loading the plugin.
bool InPluginRegister();
// The error every dispatch entry point returns there (FAILED_PRECONDITION).
Status PluginRegisterDispatchError(std::string_view op_name);

}  // namespace tefl

#endif  // TEFL_SRC_CORE_REGISTRY_H_
