// The plugin loader: a good plugin loads, routes and matches the reference;
// every broken plugin is rejected whole with one WARNING and the registry
// exactly as before; unsafe files and paths are refused; names resolve in
// TE_FL_PLUGIN_PATH; TE_FL_PLUGIN_MODULES loads at initialisation.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "core/device.h"
#include "test_support.h"

namespace tefl {
namespace {

namespace fs = std::filesystem;
using testing::LogCapture;
using testing::Tensor;

std::string PluginPath(const std::string& name) {
  return std::string(TEFL_TEST_PLUGIN_DIR) + "/libtefl_plugin_" + name + ".so";
}

std::vector<std::string> Ids(const OpRegistry& r) {
  std::vector<std::string> ids;
  for (const OpImpl& i : r.Snapshot()) ids.push_back(i.op_name + "/" + i.impl_id);
  return ids;
}

// A private directory (mode 0700) holding a copy of a plugin file.
struct TempPluginDir {
  fs::path dir;
  TempPluginDir() {
    char tmpl[] = "/tmp/tefl-plugin-test-XXXXXX";
    dir = ::mkdtemp(tmpl);
  }
  ~TempPluginDir() { fs::remove_all(dir); }
  std::string Copy(const std::string& from, const std::string& file_name) {
    const fs::path to = dir / file_name;
    fs::copy_file(from, to, fs::copy_options::overwrite_existing);
    ::chmod(to.c_str(), 0644);
    return to.string();
  }
};

class PluginTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ResetGlobalPolicy();
    manager_.EnsureInitialized();  // built-ins in; no plugin configured
  }
  void TearDown() override {
    unsetenv("TE_FL_PLUGIN_PATH");
    unsetenv("TE_FL_PLUGIN_MODULES");
    ResetGlobalPolicy();
  }
  // Loads `path` expecting a rejection that mentions `reason`: one WARNING,
  // nothing registered.
  void ExpectRejected(const std::string& path, const std::string& reason, int32_t code = TEFL_FAILED_PRECONDITION) {
    const auto before = Ids(registry_);
    LogCapture logs(TEFL_LOG_DEBUG);
    Status s = LoadPlugin(path, registry_);
    EXPECT_EQ(s.code(), code);
    EXPECT_NE(s.message().find(reason), std::string::npos) << s.message();
    EXPECT_EQ(Ids(registry_), before) << "the registry changed";
    EXPECT_EQ(logs.Count("WARNING]"), 1) << ::testing::PrintToString(logs.Lines());
    EXPECT_EQ(logs.Count("nothing of it was registered"), 1);
    ASSERT_FALSE(PluginReports().empty());
    EXPECT_FALSE(PluginReports().back().loaded);
    EXPECT_NE(PluginReports().back().error.find(reason), std::string::npos);
    ExpectCorrectDispatch();
  }
  // rmsnorm_fwd through this manager (vendor first) matches the reference.
  void ExpectCorrectDispatch() {
    Tensor x(DType::kF32, {3, 24}), g(DType::kF32, {24}), z(DType::kF32, {3, 24}), rs(DType::kF32, {3});
    x.Uniform("x");
    g.Uniform("g");
    Tensor z_ref = z, rs_ref = rs;
    {
      PolicyContext vendor(GetPolicy().WithPrefer("vendor"));
      ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());
    }
    {
      PolicyContext reference(GetPolicy().WithPrefer("reference"));
      ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z_ref, &rs_ref}).ok());
    }
    EXPECT_EQ(testing::Compare(z, z_ref, testing::ToleranceFor(DType::kF32)).mismatches, 0);
  }

  OpRegistry registry_;
  OpManager manager_{&registry_};
};

TEST_F(PluginTest, GoodPluginLoadsRoutesAndMatchesTheReference) {
  LogCapture logs(TEFL_LOG_INFO);
  ASSERT_TRUE(LoadPlugin(PluginPath("testgood"), registry_).ok());
  EXPECT_EQ(logs.Count("INFO] Loaded plugin 'testgood' 0.1.0 (vendor testvendor, ABI 1.0) from"), 1)
      << ::testing::PrintToString(logs.Lines());
  const PluginReport r = PluginReports().back();
  EXPECT_TRUE(r.loaded);
  EXPECT_EQ(r.name, "testgood");
  EXPECT_EQ(r.version, "0.1.0");
  EXPECT_EQ(r.vendor, "testvendor");
  EXPECT_EQ(r.abi_major, uint32_t(TEFL_ABI_MAJOR));
  EXPECT_EQ(r.implementations, 1);
  auto impl = registry_.GetImplementation("rmsnorm_fwd", "vendor.testgood");
  ASSERT_TRUE(impl.has_value());
  EXPECT_EQ(impl->origin, PluginPath("testgood"));

  Tensor x(DType::kF32, {5, 40}), g(DType::kF32, {40}), z(DType::kF32, {5, 40}), rs(DType::kF32, {5});
  x.Uniform("x");
  g.Uniform("g");
  Tensor z_ref = z, rs_ref = rs;
  {
    PolicyContext vendor(GetPolicy().WithPrefer("vendor"));
    ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());
    EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "vendor.testgood");
    // Its supports() declines bf16: another implementation serves.
    Tensor xb(DType::kBF16, {5, 40}), zb(DType::kBF16, {5, 40});
    ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&xb, &g}, {&zb, &rs}).ok());
    EXPECT_NE(manager_.GetSelectedImplId("rmsnorm_fwd"), "vendor.testgood");
  }
  {
    PolicyContext reference(GetPolicy().WithPrefer("reference"));
    ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z_ref, &rs_ref}).ok());
  }
  EXPECT_EQ(testing::Compare(z, z_ref, testing::ToleranceFor(DType::kF32)).mismatches, 0);

  // Loading the same file again is a no-op.
  const auto before = Ids(registry_);
  ASSERT_TRUE(LoadPlugin(PluginPath("testgood"), registry_).ok());
  EXPECT_EQ(Ids(registry_), before);
  EXPECT_TRUE(PluginReports().back().already_loaded);
}

TEST_F(PluginTest, AbiMajorMismatchIsRefusedNamingBothVersions) {
  ExpectRejected(PluginPath("abimajor"), "ABI mismatch: the plugin was built for tefl ABI 2.0, this library is ABI 1.0",
                 TEFL_ABI_MISMATCH);
}

TEST_F(PluginTest, NewerMinorIsRefused) {
  ExpectRejected(PluginPath("abinewerminor"), "built for tefl ABI 1.1, newer than this library's 1.0",
                 TEFL_ABI_MISMATCH);
}

TEST_F(PluginTest, MissingEntrySymbols) {
  ExpectRejected(PluginPath("noregister"), "missing entry symbol tefl_plugin_register");
  ExpectRejected(PluginPath("noinfo"), "missing entry symbol tefl_plugin_info");
}

TEST_F(PluginTest, ErrorStatusRollsBackWhatItRegistered) {
  // It registered two implementations, then returned an error: both are gone.
  ExpectRejected(PluginPath("errorstatus"), "its register function failed: RUNTIME_ERROR: no device found");
  EXPECT_FALSE(registry_.GetImplementation("rmsnorm_fwd", "vendor.errorstatus").has_value());
  EXPECT_FALSE(registry_.GetImplementation("rmsnorm_fwd", "vendor.errorstatus_second").has_value());
}

TEST_F(PluginTest, DescriptorTooSmallNamesBothSizes) {
  ExpectRejected(PluginPath("smalldesc"),
                 "register_impl: descriptor struct_size 8 is smaller than 56 (through "
                 "'kernel'); set it to TEFL_IMPL_DESC_STRUCT_SIZE (72)");
  EXPECT_FALSE(registry_.GetImplementation("rmsnorm_fwd", "vendor.smalldesc").has_value());
}

TEST_F(PluginTest, IncompleteDeviceRuntimeIsRefusedNotCalled) {
  // Accepted before, it made `tefl check` call through a NULL alloc. Now the
  // plugin goes, with what it registered before the runtime.
  ExpectRejected(PluginPath("incompleteruntime"),
                 "register_device_runtime: runtime 'incomplete' (device_type 12) has no device_count (NULL): every "
                 "function of the table is required");
  EXPECT_FALSE(registry_.GetImplementation("rmsnorm_fwd", "vendor.incompleteruntime").has_value());
  EXPECT_EQ(tefl::DeviceRuntime(kDLExtDev), nullptr);
}

TEST(DeviceRuntimeCheck, NamesWhatIsMissing) {
  // The CPU's table: complete, and there from the start (this test may run
  // alone, before any manager initialises).
  ASSERT_NE(tefl::DeviceRuntime(kDLCPU), nullptr);
  tefl_device_runtime rt = *tefl::DeviceRuntime(kDLCPU);
  rt.device_type = kDLExtDev;
  rt.name = "probe";
  EXPECT_EQ(tefl::CheckDeviceRuntime(&rt), nullptr);
  auto message = [](tefl_status* s) {
    std::string m = s ? tefl_status_message(s) : "OK";
    tefl_status_free(s);
    return m;
  };
  tefl_device_runtime bad = rt;
  bad.stream_sync = nullptr;
  EXPECT_NE(message(tefl::CheckDeviceRuntime(&bad)).find("has no stream_sync (NULL)"), std::string::npos);
  bad = rt;
  bad.struct_size = TEFL_STRUCT_SIZE(tefl_device_runtime, name);
  EXPECT_NE(message(tefl::CheckDeviceRuntime(&bad)).find("struct_size 24 is smaller than the ABI 1.0 table (80"),
            std::string::npos);
  bad = rt;
  bad.name = "";
  EXPECT_NE(message(tefl::CheckDeviceRuntime(&bad)).find("name is NULL or empty"), std::string::npos);
  bad = rt;
  bad.device_type = 64;
  EXPECT_NE(message(tefl::CheckDeviceRuntime(&bad)).find("device_type 64 is out of range [0, 64)"), std::string::npos);
  EXPECT_EQ(message(tefl::CheckDeviceRuntime(nullptr)), "register_device_runtime: runtime is NULL");
}

TEST_F(PluginTest, ARegistryAtADestroyedOnesAddressStillLoadsThePlugin) {
  // "Already loaded" was keyed by the registry's address: a registry made
  // where a destroyed one had been skipped the plugin, so the test below,
  // after others, depended on where the allocator put its fixture.
  alignas(OpRegistry) unsigned char storage[sizeof(OpRegistry)];
  auto* first = new (storage) OpRegistry();
  ASSERT_TRUE(LoadPlugin(PluginPath("testgood"), *first).ok());
  ASSERT_TRUE(first->GetImplementation("rmsnorm_fwd", "vendor.testgood").has_value());
  first->~OpRegistry();
  auto* second = new (storage) OpRegistry();  // the same address
  EXPECT_TRUE(LoadPlugin(PluginPath("testgood"), *second).ok());
  EXPECT_TRUE(second->GetImplementation("rmsnorm_fwd", "vendor.testgood").has_value());
  EXPECT_FALSE(PluginReports().back().already_loaded);
  second->~OpRegistry();
}

TEST_F(PluginTest, NotASharedLibrary) {
  TempPluginDir tmp;
  const std::string path = (tmp.dir / "libtefl_plugin_text.so").string();
  std::ofstream(path) << "this is not an ELF file\n";
  ::chmod(path.c_str(), 0644);
  ExpectRejected(path, "dlopen failed");
}

TEST_F(PluginTest, TwoPluginsOfOneVendorWithDifferentIds) {
  ASSERT_TRUE(LoadPlugin(PluginPath("testgood"), registry_).ok());
  ASSERT_TRUE(LoadPlugin(PluginPath("samevendor"), registry_).ok());
  auto a = registry_.GetImplementation("rmsnorm_fwd", "vendor.testgood");
  auto b = registry_.GetImplementation("rmsnorm_fwd", "vendor.samevendor");
  ASSERT_TRUE(a.has_value() && b.has_value());
  EXPECT_EQ(a->vendor, "testgood");
  EXPECT_EQ(b->vendor, "testgood");
  Tensor x(DType::kF32, {2, 8}), g(DType::kF32, {8}), z(DType::kF32, {2, 8}), rs(DType::kF32, {2});
  x.Uniform("x");
  g.Uniform("g");
  {
    // Same priority: impl_id decides, and vendor:testgood selects both.
    SelectionPolicy p;
    ASSERT_TRUE(
        SelectionPolicy::Make("flagos", false, {{"rmsnorm_fwd", {"vendor:TestGood"}}}, {}, std::nullopt, &p).ok());
    PolicyContext ctx(p);
    ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());
    EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "vendor.samevendor");
    Resolution r = manager_.Explain(TEFL_OP_RMSNORM_FWD, std::vector<const DLTensor*>{x.ptr(), g.ptr()},
                                    std::vector<DLTensor*>{z.ptr(), rs.ptr()});
    EXPECT_EQ(r.chain, (std::vector<std::string>{"vendor.samevendor", "vendor.testgood"}));
  }
  {
    // Denying the vendor removes both.
    PolicyContext deny(GetPolicy().WithPrefer("vendor").WithDeniedVendors({"TESTGOOD"}));
    ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());
    EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "default.portable");
  }
  ExpectCorrectDispatch();
}

TEST_F(PluginTest, UnsafeFilesAndPathsAreRefused) {
  TempPluginDir tmp;
  const std::string copy = tmp.Copy(PluginPath("testgood"), "libtefl_plugin_writable.so");
  ::chmod(copy.c_str(), 0666);
  ExpectRejected(copy, "the file is writable by group or others");
  ::chmod(copy.c_str(), 0644);
  ::chmod(tmp.dir.c_str(), 0777);
  ExpectRejected(copy, "is writable by group or others");
  ::chmod(tmp.dir.c_str(), 0700);
  // A symlink in a safe directory to a file in a writable one is judged by its target.
  TempPluginDir open_dir;
  const std::string target = open_dir.Copy(PluginPath("testgood"), "libtefl_plugin_target.so");
  ::chmod(open_dir.dir.c_str(), 0777);
  const std::string link = (tmp.dir / "libtefl_plugin_link.so").string();
  ASSERT_EQ(::symlink(target.c_str(), link.c_str()), 0);
  ExpectRejected(link, "is writable by group or others (it resolves to " + target);
  ::chmod(open_dir.dir.c_str(), 0700);
  ExpectRejected("relative/libtefl_plugin_testgood.so", "refused: a relative path");
  ExpectRejected("/nonexistent/libtefl_plugin_x.so", "no such file");
  ExpectRejected(tmp.dir.string(), "a directory, not a plugin library (a .so file)");
  ExpectRejected("/dev/null", "not a regular file");
  ExpectRejected("nosuchplugin", "not found in the plugin directories");
}

TEST_F(PluginTest, NamesResolveInPluginPath) {
  TempPluginDir tmp;
  tmp.Copy(PluginPath("testgood"), "libtefl_plugin_testgood.so");
  setenv("TE_FL_PLUGIN_PATH", tmp.dir.c_str(), 1);
  ASSERT_TRUE(LoadPlugin("testgood", registry_).ok());
  EXPECT_EQ(PluginReports().back().path, (tmp.dir / "libtefl_plugin_testgood.so").string());
  EXPECT_TRUE(registry_.GetImplementation("rmsnorm_fwd", "vendor.testgood").has_value());
  // A name in the working directory is never loaded: only the plugin directories count.
  unsetenv("TE_FL_PLUGIN_PATH");
  OpRegistry other;
  const fs::path cwd = fs::current_path();
  fs::current_path(tmp.dir);
  Status s = LoadPlugin("testgood", other);
  fs::current_path(cwd);
  EXPECT_FALSE(s.ok());
}

TEST_F(PluginTest, PluginModulesLoadAtInitialisation) {
  // Listed twice: the second is a no-op. A bad one does not stop the others.
  setenv("TE_FL_PLUGIN_MODULES",
         (PluginPath("testgood") + ", " + PluginPath("abimajor") + "," + PluginPath("testgood")).c_str(), 1);
  OpRegistry fresh;
  OpManager m(&fresh);
  LogCapture logs(TEFL_LOG_INFO);
  m.EnsureInitialized();
  EXPECT_TRUE(fresh.GetImplementation("rmsnorm_fwd", "vendor.testgood").has_value());
  EXPECT_EQ(logs.Count("Loaded plugin 'testgood'"), 1);
  EXPECT_EQ(logs.Count("rejected: ABI mismatch"), 1);  // the bad one does not stop the good one
  EXPECT_EQ(logs.Count("Registered impl_ids: ['default.portable', 'reference.cpp', 'vendor.testgood']"), 1)
      << ::testing::PrintToString(logs.Lines());
  EXPECT_EQ(fresh.GetImplementations("rmsnorm_fwd").size(), 3u);  // portable, reference, testgood once
  EXPECT_TRUE(PluginReports().back().already_loaded);
}

// A register function that dispatches an op (the guide forbids it) waited
// forever on the initialisation that was loading it; now its call fails at
// once and the plugin is rejected with that reason. In a child with an
// alarm, so that a regression fails instead of hanging the suite.
TEST_F(PluginTest, DispatchInsideRegisterFailsInsteadOfWaitingForItself) {
  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    alarm(20);
    setenv("TE_FL_PLUGIN_MODULES", PluginPath("callsinregister").c_str(), 1);
    LogCapture logs(TEFL_LOG_INFO);
    GetDefaultManager().EnsureInitialized();  // the plugin's tefl_call goes to this manager too
    const bool ok = !GetDefaultRegistry().GetImplementation("rmsnorm_fwd", "vendor.callsinregister").has_value() &&
                    logs.Count(
                        "rejected: its register function failed: FAILED_PRECONDITION: rmsnorm_fwd: called "
                        "from a plugin's tefl_plugin_register") == 1;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status)) << "the child hung (killed by signal " << WTERMSIG(status) << ")";
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

// After fork() the child dispatches through the plugin's kernel with nothing
// registered twice.
TEST_F(PluginTest, ForkedChildKeepsPluginImplementationsOnce) {
  ASSERT_TRUE(LoadPlugin(PluginPath("testgood"), registry_).ok());
  const size_t before = registry_.Snapshot().size();
  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    alarm(30);
    Tensor x(DType::kF32, {2, 8}), g(DType::kF32, {8}), z(DType::kF32, {2, 8}), rs(DType::kF32, {2});
    x.Uniform("x");
    g.Uniform("g");
    PolicyContext vendor(GetPolicy().WithPrefer("vendor"));
    const bool ok = testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok() &&
                    manager_.GetSelectedImplId("rmsnorm_fwd") == "vendor.testgood" &&
                    registry_.Snapshot().size() == before && LoadPlugin(PluginPath("testgood"), registry_).ok() &&
                    registry_.Snapshot().size() == before;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
}

}  // namespace
}  // namespace tefl
