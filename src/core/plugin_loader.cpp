// Out-of-tree plugins: discovery (TE_FL_PLUGIN_MODULES, TE_FL_PLUGIN_PATH, the
// installed plugin directory), safety checks, dlopen, ABI negotiation and
// transactional registration (nothing of a plugin remains unless all of it
// registered).
#include <dirent.h>
#include <dlfcn.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <set>

#include "core/device.h"
#include "core/logging.h"
#include "core/registry.h"
#include "core/strings.h"
#include "tefl/tefl.hpp"

namespace tefl {
namespace {

std::mutex g_plugins_mu;
std::vector<PluginReport>& Reports() {
  static auto* reports = new std::vector<PluginReport>();  // process lifetime
  return *reports;
}
// (registry id, real path) -> its report, for plugins already loaded:
// loading one again is a no-op. Keyed by the registry's id, not its address,
// which a registry made after another's destruction may reuse (the plugin
// would then be skipped as "already loaded" into a registry that never had it).
std::map<std::pair<uint64_t, std::string>, PluginReport>& Loaded() {
  static auto* loaded = new std::map<std::pair<uint64_t, std::string>, PluginReport>();
  return *loaded;
}

bool IsFile(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode);
}

// Empty when `path` (a file) and its directory are safe to load from.
std::string UnsafeReason(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return "cannot stat the file: " + std::string(std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return "not a regular file";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) return "the file is writable by group or others";
  const std::string dir = path.substr(0, path.find_last_of('/'));
  if (::stat(dir.empty() ? "/" : dir.c_str(), &st) != 0) return "cannot stat its directory";
  if (st.st_mode & (S_IWGRP | S_IWOTH)) {
    // A sticky world-writable directory such as /tmp still lets others plant
    // files; refuse it too.
    return "its directory " + dir + " is writable by group or others";
  }
  return "";
}

std::vector<std::string> SearchDirs() {
  std::vector<std::string> dirs;
  if (const char* v = std::getenv("TE_FL_PLUGIN_PATH"); v && *v) {
    for (std::string_view d : Split(v, ':')) {
      d = Trim(d);
      if (d.empty()) continue;
      if (d.front() != '/') {
        TEFL_LOG(WARNING, "Ignoring TE_FL_PLUGIN_PATH entry '{}': plugin directories must be absolute", d);
        continue;
      }
      dirs.emplace_back(d);
    }
  }
  const std::string installed = InstalledPluginDir();
  if (!installed.empty()) dirs.push_back(installed);
  return dirs;
}

// A name resolved in the plugin directories; "" if none has it.
std::string ResolveName(std::string_view name, const std::vector<std::string>& dirs) {
  const std::string n(name);
  std::vector<std::string> files = {"libtefl_plugin_" + n + ".so", "lib" + n + ".so", n + ".so"};
  if (n.size() > 3 && n.compare(n.size() - 3, 3, ".so") == 0) files.insert(files.begin(), n);
  for (const std::string& dir : dirs)
    for (const std::string& f : files)
      if (IsFile(dir + "/" + f)) return dir + "/" + f;
  return "";
}

// Collects a plugin's registrations; nothing reaches the registry until the
// plugin's register function has returned success.
struct Staging {
  OpRegistry* registry;
  std::string origin;
  std::vector<OpImpl> impls;
  std::vector<tefl_device_runtime> runtimes;
  std::vector<std::string> runtime_names;
  std::string error;  // first failed registration
};

thread_local bool t_in_plugin_register = false;

tefl_status* StageImpl(void* ctx, const tefl_impl_desc* desc) {
  auto* s = static_cast<Staging*>(ctx);
  if (Status st = OpImpl::CheckDesc(desc); !st.ok()) {
    if (s->error.empty()) s->error = st.message();
    return st.ToC();
  }
  OpImpl impl = OpImpl::FromDesc(*desc, s->origin);
  Status st = s->registry->CheckImpl(impl);
  for (const OpImpl& other : s->impls) {
    if (st.ok() && other.impl_id == impl.impl_id && other.op_name == impl.op_name)
      st = Status(TEFL_ALREADY_EXISTS,
                  "register_impl: impl_id '" + impl.impl_id + "' given twice for op '" + impl.op_name + "'");
  }
  if (!st.ok()) {
    if (s->error.empty()) s->error = st.message();
    return st.ToC();
  }
  s->impls.push_back(std::move(impl));
  return nullptr;
}

tefl_status* StageRuntime(void* ctx, const tefl_device_runtime* runtime) {
  auto* s = static_cast<Staging*>(ctx);
  if (tefl_status* e = CheckDeviceRuntime(runtime)) {  // a table tefl would call through NULL: refused now
    if (s->error.empty()) s->error = tefl_status_message(e);
    return e;
  }
  tefl_device_runtime copy{};
  std::memcpy(&copy, runtime, std::min<size_t>(runtime->struct_size, TEFL_DEVICE_RUNTIME_STRUCT_SIZE));
  s->runtime_names.push_back(runtime->name ? runtime->name : "");
  s->runtimes.push_back(copy);
  return nullptr;
}

// Loads one resolved file; fills `report`. Caller holds g_plugins_mu.
void LoadFile(const std::string& path, OpRegistry& registry, PluginReport& report) {
  report.path = path;
  // Check where the path really leads (a symlink in a safe directory may
  // point into an unsafe one), and load exactly that file.
  char real[PATH_MAX];
  if (::realpath(path.c_str(), real) == nullptr) {
    report.error = std::string("cannot resolve the path: ") + std::strerror(errno);
    return;
  }
  const std::string canonical = real;
  if (std::string why = UnsafeReason(canonical); !why.empty()) {
    report.error = "refused: " + why + (canonical == path ? "" : " (it resolves to " + canonical + ")");
    return;
  }
  if (auto it = Loaded().find({registry.rep()->id, canonical}); it != Loaded().end()) {
    const std::string requested = report.requested;
    report = it->second;
    report.requested = requested;
    report.implementations = 0;
    report.already_loaded = true;
    return;
  }
  void* handle = ::dlopen(canonical.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (handle == nullptr) {
    const char* e = ::dlerror();
    report.error = std::string("dlopen failed: ") + (e ? e : "unknown error");
    return;
  }
  auto fail = [&](std::string why) {
    report.error = std::move(why);
    ::dlclose(handle);
  };
  auto info_fn = reinterpret_cast<tefl_plugin_info_fn>(::dlsym(handle, TEFL_PLUGIN_INFO_SYMBOL));
  auto register_fn = reinterpret_cast<tefl_plugin_register_fn>(::dlsym(handle, TEFL_PLUGIN_REGISTER_SYMBOL));
  if (info_fn == nullptr) return fail("missing entry symbol " TEFL_PLUGIN_INFO_SYMBOL);
  if (register_fn == nullptr) return fail("missing entry symbol " TEFL_PLUGIN_REGISTER_SYMBOL);
  const tefl_plugin_metadata* info = info_fn();
  // ABI 1.0's metadata ends at abi_minor: a plugin built against 1.0 must
  // keep loading when later minors append fields (read only when its
  // struct_size covers them), so the minimum is that, not this header's size.
  if (info == nullptr || info->struct_size < TEFL_STRUCT_SIZE(tefl_plugin_metadata, abi_minor) ||
      info->name == nullptr) {
    return fail("tefl_plugin_info() returned no usable info (NULL, struct_size too small or no name)");
  }
  report.name = info->name;
  report.version = info->version ? info->version : "";
  report.vendor = info->vendor ? info->vendor : "";
  report.abi_major = info->abi_major;
  report.abi_minor = info->abi_minor;
  if (info->abi_major != TEFL_ABI_MAJOR) {
    return fail(
        fmt::format("ABI mismatch: the plugin was built for tefl ABI {}.{}, this library is ABI {}.{} "
                    "(the major versions must be equal)",
                    info->abi_major, info->abi_minor, TEFL_ABI_MAJOR, TEFL_ABI_MINOR));
  }
  if (info->abi_minor > TEFL_ABI_MINOR) {
    return fail(fmt::format("ABI mismatch: the plugin was built for tefl ABI {}.{}, newer than this library's {}.{}",
                            info->abi_major, info->abi_minor, TEFL_ABI_MAJOR, TEFL_ABI_MINOR));
  }
  Staging staging{&registry, path, {}, {}, {}, ""};
  const tefl_registrar registrar{TEFL_REGISTRAR_STRUCT_SIZE, &staging, StageImpl, StageRuntime};
  tefl_status* st = nullptr;
  t_in_plugin_register = true;
  try {
    st = register_fn(tefl_host(), &registrar);
  } catch (...) {
    st = tefl_status_new(TEFL_INTERNAL, "the register function threw an exception");
  }
  t_in_plugin_register = false;
  if (st != nullptr) {
    Status s = Status::FromC(st);
    return fail("its register function failed: " + s.ToString());
  }
  if (!staging.error.empty()) return fail("a registration failed: " + staging.error);
  // Device runtimes are checked completely before anything is committed, so
  // their registration below cannot fail.
  for (size_t i = 0; i < staging.runtimes.size(); ++i) {
    const int32_t type = staging.runtimes[i].device_type;
    if (type < 0 || type >= kMaxDeviceTypes)
      return fail(fmt::format("device runtime '{}': device type {} is out of range", staging.runtime_names[i], type));
    for (size_t j = 0; j < i; ++j) {
      if (staging.runtimes[j].device_type == type && staging.runtime_names[j] != staging.runtime_names[i])
        return fail(fmt::format("two device runtimes for type {} ('{}', '{}')", type, staging.runtime_names[j],
                                staging.runtime_names[i]));
    }
    const tefl_device_runtime* existing = DeviceRuntime(type);
    if (existing && staging.runtime_names[i] != existing->name)
      return fail(fmt::format("device runtime for type {} is already registered as '{}'", type, existing->name));
  }
  Status committed = registry.RegisterMany(staging.impls);  // all or nothing
  if (!committed.ok()) return fail("committing its implementations failed: " + committed.message());
  for (size_t i = 0; i < staging.runtimes.size(); ++i) {
    staging.runtimes[i].name = staging.runtime_names[i].c_str();         // copied by RegisterDeviceRuntime
    if (tefl_status* e = RegisterDeviceRuntime(&staging.runtimes[i])) {  // not expected after the checks above
      TEFL_LOG(ERROR, "Plugin '{}': device runtime '{}' failed to register after its kernels: {}", report.name,
               staging.runtime_names[i], tefl_status_message(e));
      tefl_status_free(e);
    }
  }
  report.loaded = true;
  report.implementations = int32_t(staging.impls.size());
  Loaded()[{registry.rep()->id, canonical}] = report;
  // The handle stays open for the life of the process: kernels point into it.
}

PluginReport LoadOne(std::string_view requested, OpRegistry& registry, const std::vector<std::string>& dirs) {
  PluginReport report;
  report.requested = std::string(requested);
  std::string path;
  if (requested.find('/') != std::string_view::npos) {
    if (requested.front() != '/') {
      report.error = "refused: a relative path (only absolute paths or names found in the plugin directories)";
      return report;
    }
    path = std::string(requested);
    if (!IsFile(path)) {
      report.path = path;
      struct stat st;
      report.error = ::stat(path.c_str(), &st) != 0 ? "no such file"
                     : S_ISDIR(st.st_mode)          ? "a directory, not a plugin library (a .so file)"
                                                    : "not a regular file";
      return report;
    }
  } else {
    path = ResolveName(requested, dirs);
    if (path.empty()) {
      std::string searched;
      for (const auto& d : dirs) searched += (searched.empty() ? "" : ", ") + d;
      report.error = "not found in the plugin directories [" + searched + "]";
      return report;
    }
  }
  LoadFile(path, registry, report);
  return report;
}

void LogReport(const PluginReport& r) {
  if (r.already_loaded) {
    TEFL_LOG(DEBUG, "Plugin '{}' ({}) is already loaded: nothing to do", r.requested, r.path);
  } else if (r.loaded) {
    TEFL_LOG(INFO, "Loaded plugin '{}' {} (vendor {}, ABI {}.{}) from {}: {} implementation(s)", r.name, r.version,
             r.vendor, r.abi_major, r.abi_minor, r.path, r.implementations);
  } else {
    TEFL_LOG(WARNING, "Plugin '{}'{} rejected: {}; nothing of it was registered", r.requested,
             r.path.empty() || r.path == r.requested ? "" : " (" + r.path + ")", r.error);
  }
}

}  // namespace

std::string InstalledPluginDir() {
#if defined(TEFL_PLUGIN_DIR_BESIDE_LIBRARY)
  // The directory of the libtefl that holds this function (absolute).
  static const char kAnchor = 0;
  Dl_info info{};
  if (::dladdr(&kAnchor, &info) == 0 || info.dli_fname == nullptr) return "";
  const std::string lib = info.dli_fname;
  const size_t slash = lib.rfind('/');
  std::string dir = slash == std::string::npos ? "." : lib.substr(0, slash);
  // Canonical: the loader may have reached libtefl through an RPATH such as
  // $ORIGIN/../lib (dli_fname is then <prefix>/bin/../lib/libtefl.so).
  char buf[PATH_MAX];
  if (::realpath(dir.empty() ? "/" : dir.c_str(), buf) == nullptr) return "";
  dir = buf;
  return dir + (dir.back() == '/' ? "" : "/") + TEFL_PLUGIN_DIR_BESIDE_LIBRARY;
#else
  return "";
#endif
}

std::vector<std::string> PluginSearchDirs() { return SearchDirs(); }

bool InPluginRegister() { return t_in_plugin_register; }

Status PluginRegisterDispatchError(std::string_view op_name) {
  return Status(TEFL_FAILED_PRECONDITION,
                fmt::format("{}: called from a plugin's tefl_plugin_register; a plugin registers its kernels there, "
                            "and ops dispatch only once loading has finished (the manager's initialisation may be "
                            "what is loading the plugin: the call would wait for itself)",
                            op_name));
}

Status LoadPlugin(std::string_view name_or_path, OpRegistry& registry) {
  if (t_in_plugin_register)  // the loader's lock is held by the load that is running this plugin's register
    return Status(TEFL_FAILED_PRECONDITION, fmt::format("loading plugin '{}' from a plugin's tefl_plugin_register: "
                                                        "a register function only registers",
                                                        name_or_path));
  std::lock_guard<std::mutex> lock(g_plugins_mu);
  PluginReport r = LoadOne(Trim(name_or_path), registry, SearchDirs());
  LogReport(r);
  Reports().push_back(r);
  if (r.loaded) return Status::OK();
  const int32_t code = r.error.rfind("ABI mismatch", 0) == 0 ? TEFL_ABI_MISMATCH : TEFL_FAILED_PRECONDITION;
  return Status(code, "plugin '" + r.requested + "' rejected: " + r.error);
}

void LoadConfiguredPlugins(OpRegistry& registry) {
  std::lock_guard<std::mutex> lock(g_plugins_mu);
  const std::vector<std::string> dirs = SearchDirs();
  std::set<std::string> tried;
  if (const char* v = std::getenv("TE_FL_PLUGIN_MODULES"); v && *v) {
    for (std::string_view name : Split(v, ',')) {
      name = Trim(name);
      if (name.empty()) continue;
      PluginReport r = LoadOne(name, registry, dirs);
      LogReport(r);
      if (!r.path.empty()) tried.insert(r.path);
      Reports().push_back(std::move(r));
    }
  }
  // Every plugin installed in the library's own directory, without
  // configuration (the analogue of Python entry points).
  const std::string installed = InstalledPluginDir();
  if (installed.empty()) return;
  std::vector<std::string> files;
  if (DIR* d = ::opendir(installed.c_str())) {
    while (dirent* e = ::readdir(d)) {
      const std::string f = e->d_name;
      if (f.size() > 3 && f.compare(f.size() - 3, 3, ".so") == 0) files.push_back(installed + "/" + f);
    }
    ::closedir(d);
  }
  std::sort(files.begin(), files.end());
  for (const std::string& path : files) {
    if (tried.count(path)) continue;
    PluginReport r;
    r.requested = path;
    LoadFile(path, registry, r);
    LogReport(r);
    Reports().push_back(std::move(r));
  }
}

std::vector<PluginReport> PluginReports() {
  std::lock_guard<std::mutex> lock(g_plugins_mu);
  return Reports();
}

}  // namespace tefl
