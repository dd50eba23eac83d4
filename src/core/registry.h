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
  // Claimed (under mu) by the initialisation that registers the built-ins /
  // loads the configured plugins; set before that work is done, so a reader
  // that must see it finished takes init_mu.
  bool builtins_registered = false;
  bool plugins_loaded = false;  // LoadConfiguredPlugins ran (or runs) for this registry
  // Held by OpManager::EnsureInitialized for the whole of the registry's
  // initialisation (built-ins, then configured plugins): every manager of
  // this registry takes it before it is initialised, so none dispatches
  // before the registry's built-ins and plugins are in place. Lock order:
  // init_mu, then the plugin loader's lock, then mu.
  std::mutex init_mu;

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
