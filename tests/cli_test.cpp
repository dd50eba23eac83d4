// The `tefl` command, run as a process: each subcommand's output (golden
// text where it is stable, parsed JSON otherwise), exit statuses, and the
// one-line errors for bad arguments.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "tefl/tefl.h"

namespace {

struct Result {
  int code = -1;
  std::string out, err;
  nlohmann::json Json() const {
    try {
      return nlohmann::json::parse(out);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not JSON: " << e.what() << "\n" << out.substr(0, 400);
      return nlohmann::json();
    }
  }
};

std::string ReadFile(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// The shell command running `tefl ARGS` with extra environment assignments
// ("A=b C=d") in a clean policy environment (only what the test sets), after
// `prefix` (e.g. "ulimit -v 1000000; ").
std::string TeflCommand(const std::string& args, const std::string& env, const std::string& prefix,
                        const std::string& out, const std::string& err) {
  return fmt::format(
      "{}env -u TE_FL_PREFER -u TE_FL_PREFER_VENDOR -u TE_FL_STRICT -u TE_FL_PER_OP -u TE_FL_ALLOW_VENDORS "
      "-u TE_FL_DENY_VENDORS -u TE_FL_PLUGIN_MODULES -u TEFL_LOG_LEVEL -u TE_FL_VERBOSE -u TEFL_NUM_THREADS {} '{}' "
      "{} >'{}' 2>'{}'",
      prefix, env, TEFL_CLI_PATH, args, out, err);
}

// Runs `tefl ARGS` (see TeflCommand).
Result Tefl(const std::string& args, const std::string& env = "", const std::string& prefix = "") {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/tefl_cli_out." + std::to_string(getpid());
  const std::string err = dir + "/tefl_cli_err." + std::to_string(getpid());
  const std::string cmd = TeflCommand(args, env, prefix, out, err);
  const int status = std::system(cmd.c_str());
  Result r;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = ReadFile(out);
  r.err = ReadFile(err);
  std::remove(out.c_str());
  std::remove(err.c_str());
  return r;
}

std::string Plugin(const char* name) { return fmt::format("{}/libtefl_plugin_{}.so", TEFL_TEST_PLUGIN_DIR, name); }

// The peak resident memory (KiB) of `tefl ARGS` and the status it exited with.
std::pair<long, int> PeakRssKiB(const std::string& args) {
  const std::string cmd = TeflCommand(args, "", "", "/dev/null", "/dev/null");
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  struct rusage ru {};
  if (pid < 0 || wait4(pid, &status, 0, &ru) != pid) return {-1, -1};
  // The child's maxrss covers the descendants it waited for (tefl under sh).
  return {ru.ru_maxrss, WIFEXITED(status) ? WEXITSTATUS(status) : -1};
}

// One line on stderr, starting "tefl: error: ", and a failing status (`code`:
// that one).
void ExpectOneErrorLine(const Result& r, const std::string& needle, int code = -1) {
  EXPECT_NE(r.code, 0);
  if (code >= 0) {
    EXPECT_EQ(r.code, code) << r.err;
  }
  EXPECT_EQ(r.err.rfind("tefl: error: ", 0), 0u) << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_NE(r.err.find(needle), std::string::npos) << "expected '" << needle << "' in: " << r.err;
}

TEST(Cli, HelpOnEveryCommand) {
  for (const char* cmd : {"", "ops", "impls", "explain", "check", "bench", "demo"}) {
    const Result r = Tefl(std::string(cmd) + " --help");
    EXPECT_EQ(r.code, 0) << cmd;
    EXPECT_NE(r.out.find("Usage"), std::string::npos) << cmd << ": " << r.out;
  }
}

// --version: tefl's version and the plugin C ABI version (it said "A
// subcommand is required").
TEST(Cli, VersionFlag) {
  const Result r = Tefl("--version");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const std::string abi = fmt::format(" (plugin C ABI {}.{})\n", TEFL_ABI_MAJOR, TEFL_ABI_MINOR);
  ASSERT_EQ(r.out.rfind("tefl ", 0), 0u) << r.out;
  ASSERT_GT(r.out.size(), abi.size() + 5) << r.out;
  EXPECT_EQ(r.out.substr(r.out.size() - abi.size()), abi) << r.out;
  const std::string version = r.out.substr(5, r.out.size() - abi.size() - 5);  // e.g. 0.1.0
  EXPECT_FALSE(version.empty());
  EXPECT_EQ(version.find_first_not_of("0123456789."), std::string::npos) << version;
  EXPECT_EQ(std::count(version.begin(), version.end(), '.'), 2) << version;
}

TEST(Cli, OpsDetailGolden) {
  const Result r = Tefl("ops rmsnorm_fwd");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(
      r.out,
      "rmsnorm_fwd  (family normalization, id 2)\n"
      "  RMSNorm forward: z = x * rsigma * g, rsigma = 1/sqrt(mean(x^2) + eps)\n"
      "        name                 dtypes                    shape\n"
      "  in    x                    float32|float16|bfloat16  [N..., H]\n"
      "  in    gamma                float32|float16|bfloat16  [H]\n"
      "  out   z                    float32|float16|bfloat16  like x\n"
      "  out   rsigma               float32                   [N] or x.shape[:-1]\n"
      "  attr  eps                  f32                       default 1e-05, [0, 3.4028235e+38]  added to the "
      "variance before the square root (finite: inf would turn every output into 0)\n"
      "  attr  zero_centered_gamma  bool                      default false                      apply gamma + 1\n"
      "  attr  sm_margin            i32                       default 0, [0, 1048576]            SMs left free "
      "by CUDA kernels; ignored on the CPU\n"
      "  contiguous only: every tensor compact row-major\n");
  // and an op that takes strides says so
  const Result rope = Tefl("ops fused_rope_forward");
  ASSERT_EQ(rope.code, 0) << rope.err;
  EXPECT_NE(rope.out.find("\n  strided tensors accepted (DLPack strides)\n"), std::string::npos) << rope.out;
}

// --family: any case, an unknown one lists the families, and one that
// contradicts the op named is an error (it was ignored).
TEST(Cli, OpsFamilyFilter) {
  Result r = Tefl("ops --family NORMALIZATION");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, Tefl("ops --family normalization").out);
  EXPECT_NE(r.out.find("\nrmsnorm_fwd "), std::string::npos) << r.out;
  ExpectOneErrorLine(Tefl("ops --family bogus"),
                     "no op of family 'bogus' (the families are normalization, rope, activation, softmax, dropout, "
                     "attention, quantization, gemm)",
                     2);
  r = Tefl("ops rmsnorm_fwd --family softmax");
  ExpectOneErrorLine(r, "op rmsnorm_fwd is of family normalization, not softmax", 2);
  EXPECT_EQ(r.out, "");
  r = Tefl("ops rmsnorm_fwd --family Normalization");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out, Tefl("ops rmsnorm_fwd").out);
}

TEST(Cli, OpsJsonListsTheCatalogue) {
  const nlohmann::json j = Tefl("ops --json").Json();
  ASSERT_TRUE(j.is_array());
  bool saw_rope = false;
  for (const auto& op : j) {
    EXPECT_FALSE(op["name"].get<std::string>().empty());
    EXPECT_TRUE(op["inputs"].is_array());
    if (op["name"] == "fused_rope_forward") {
      saw_rope = true;
      EXPECT_EQ(op["aliases"][0], "rope_fwd");
      EXPECT_EQ(op["inputs"][2]["optional"], true);
      EXPECT_EQ(op["attrs"][2]["name"], "cp_size");
      EXPECT_EQ(op["attrs"][2]["default"], 1);
    }
    // Attribute values are JSON values of their type; the range as text too.
    if (op["name"] == "dropout_fwd") {
      const auto& p = op["attrs"][2];
      EXPECT_EQ(p["name"], "p");
      EXPECT_EQ(p["default"].dump(), "0.1") << "float32's shortest form";
      EXPECT_EQ(float(p["default"].get<double>()), 0.1f);
      EXPECT_EQ(p["min"], 0.0);
      EXPECT_EQ(float(p["max"].get<double>()), std::nextafter(1.0f, 0.0f));
      EXPECT_EQ(p["range"], "[0, 1)");
      EXPECT_EQ(op["attrs"][0]["range"], "any");
      EXPECT_FALSE(op["attrs"][0].contains("max"));
    }
    if (op["name"] == "generic_gemm") {
      EXPECT_EQ(op["attrs"][2]["name"], "alpha");
      EXPECT_EQ(op["attrs"][2]["range"], "[-inf, inf]");
      EXPECT_FALSE(op["attrs"][2].contains("max")) << "JSON has no infinity";
    }
    if (op["name"] == "rmsnorm_fwd") {
      EXPECT_EQ(op["attrs"][0]["range"], "[0, 3.4028235e+38]");
      EXPECT_EQ(op["attrs"][1]["default"], false);
      EXPECT_EQ(op["attrs"][2]["max"], 1048576);
    }
  }
  EXPECT_TRUE(saw_rope);
  // An alias resolves to its op.
  EXPECT_EQ(Tefl("ops rope_bwd --json").Json()["name"], "fused_rope_backward");
}

TEST(Cli, ImplsShowsThePolicysPick) {
  nlohmann::json j = Tefl("impls rmsnorm_fwd --json").Json();
  EXPECT_EQ(j["op"], "rmsnorm_fwd");
  EXPECT_EQ(j["picked"], "default.portable");
  std::set<std::string> ids;
  for (const auto& impl : j["implementations"]) ids.insert(impl["impl_id"]);
  EXPECT_TRUE(ids.count("reference.cpp") && ids.count("default.portable"));
  j = Tefl("impls rmsnorm_fwd --json", "TE_FL_PREFER=reference").Json();
  EXPECT_EQ(j["picked"], "reference.cpp");
  j = Tefl("impls rmsnorm_fwd --json --plugin " + Plugin("testgood"), "TE_FL_PREFER=vendor").Json();
  EXPECT_EQ(j["picked"], "vendor.testgood");
  bool found = false;
  for (const auto& impl : j["implementations"])
    if (impl["impl_id"] == "vendor.testgood") {
      found = true;
      EXPECT_EQ(impl["origin"], Plugin("testgood"));
      EXPECT_EQ(impl["vendor"], "testgood");
      EXPECT_EQ(impl["devices"], "cpu");
    }
  EXPECT_TRUE(found);
}

// A policy that leaves an op nothing to pick: impls says so and why (as
// explain does, with the "did you mean"), status 1; it printed the table
// with no row picked and exited 0.
TEST(Cli, ImplsSaysWhenNothingCanBePicked) {
  const std::string env = "TE_FL_PER_OP='rmsnorm_fwd=impl:default.protable'";
  Result r = Tefl("impls rmsnorm_fwd", env);
  ExpectOneErrorLine(r,
                     "nothing can be picked for 1 op under the policy in force: rmsnorm_fwd: no implementation can "
                     "serve this call",
                     1);
  EXPECT_NE(r.err.find("(did you mean 'impl:default.portable'?)"), std::string::npos) << r.err;
  EXPECT_EQ(r.out.find("<- picked"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("\nnothing picked: rmsnorm_fwd: no implementation can serve this call; "), std::string::npos)
      << r.out;
  r = Tefl("impls rmsnorm_fwd --json", env);
  EXPECT_EQ(r.code, 1);
  const nlohmann::json j = r.Json();
  EXPECT_EQ(j["picked"], "");
  EXPECT_NE(j.value("error", std::string()).find("did you mean 'impl:default.portable'?"), std::string::npos) << j;
  // Over every op: the listing, then the failure naming the first op.
  r = Tefl("impls", env);
  ExpectOneErrorLine(r, "nothing can be picked for 1 op under the policy in force: rmsnorm_fwd: ", 1);
  EXPECT_NE(r.out.find("gelu  "), std::string::npos) << r.out;
  // The other ops are unaffected.
  EXPECT_EQ(Tefl("impls gelu", env).code, 0);
}

TEST(Cli, PluginLogLinesShowWhenTheLogLevelIsAskedFor) {
  // By default a --plugin's load is reported by the command itself (no loader
  // lines); with TEFL_LOG_LEVEL set, the loader's and plugin's lines show.
  Result quiet = Tefl("impls rmsnorm_fwd --plugin " + Plugin("testgood"));
  EXPECT_EQ(quiet.code, 0) << quiet.err;
  EXPECT_EQ(quiet.err.find("Loaded plugin"), std::string::npos) << quiet.err;
  Result loud = Tefl("impls rmsnorm_fwd --plugin " + Plugin("testgood"), "TEFL_LOG_LEVEL=INFO");
  EXPECT_EQ(loud.code, 0) << loud.err;
  EXPECT_NE(loud.err.find("INFO] Loaded plugin 'testgood'"), std::string::npos) << loud.err;
}

TEST(Cli, ExplainGivesEveryRejectionReason) {
  const Result r = Tefl("explain rmsnorm_fwd --dtype bf16 --json --plugin " + Plugin("testgood"),
                        "TE_FL_PER_OP='rmsnorm_fwd=vendor|flagos'");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = r.Json();
  EXPECT_EQ(j["policy_sources"]["per_op"], "TE_FL_PER_OP");
  EXPECT_EQ(j["order"], nlohmann::json::array({"vendor", "flagos"}));
  std::map<std::string, std::string> reason;
  for (const auto& c : j["candidates"]) reason[c["impl_id"]] = c["accepted"] ? "accepted" : c["reason"];
  EXPECT_NE(reason["reference.cpp"].find("matches no token"), std::string::npos) << reason["reference.cpp"];
  EXPECT_NE(reason["vendor.testgood"].find("float32 only"), std::string::npos) << reason["vendor.testgood"];
  EXPECT_EQ(reason["default.portable"], "accepted");
  EXPECT_EQ(j["chain"], nlohmann::json::array({"default.portable"}));
  // The text form names the variable and its value.
  const Result t = Tefl("explain rmsnorm_fwd", "TE_FL_PREFER=reference");
  EXPECT_NE(t.out.find("prefer from TE_FL_PREFER=reference"), std::string::npos) << t.out;
  EXPECT_NE(t.out.find("chain      reference.cpp -> default.portable"), std::string::npos) << t.out;
}

TEST(Cli, BadArgumentsGiveOneLine) {
  // Bad usage (an argument value that cannot be used): status 2.
  ExpectOneErrorLine(Tefl("explain nope_op"), "unknown op 'nope_op'", 2);
  ExpectOneErrorLine(Tefl("explain rmsnrm_fwd"), "did you mean 'rmsnorm_fwd'", 2);
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --dtype int7"), "unknown dtype 'int7'", 2);
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --shape 3,,4"), "malformed shape '3,,4'", 2);
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --device quantum"), "unknown device 'quantum'", 2);
  ExpectOneErrorLine(Tefl("check --op nope_op"), "unknown op 'nope_op'", 2);
  ExpectOneErrorLine(Tefl("bench --op relu --dtype int7"), "unknown dtype 'int7'", 2);
  ExpectOneErrorLine(Tefl("ops --family nope"), "no op of family 'nope'", 2);
  ExpectOneErrorLine(Tefl("frobnicate"), "frobnicate", 2);
  ExpectOneErrorLine(Tefl("demo --heads 3"), "--heads 3 must divide --hidden 256", 2);
  // Not a number is said so (it was "Value abc not in range 1 to 65536").
  ExpectOneErrorLine(Tefl("demo --seq abc"), "--seq: 'abc' is not an integer", 2);
  ExpectOneErrorLine(Tefl("demo --batch 2.5"), "--batch: '2.5' is not an integer", 2);
  ExpectOneErrorLine(Tefl("demo --seq 0"), "--seq: 0 is out of range 1..65536", 2);
  ExpectOneErrorLine(Tefl("demo --ffn 99999999999999999999"), "--ffn: 99999999999999999999 is out of range 1..262144",
                     2);
  // A failure of the command itself: status 1.
  ExpectOneErrorLine(Tefl("check --plugin /nonexistent/libtefl_plugin_x.so"), "cannot load plugin", 1);
  ExpectOneErrorLine(Tefl("check --plugin no_such_plugin_name"), "cannot load plugin 'no_such_plugin_name'", 1);
}

// Status 2 for every bad argument value: a shape or dtype the op cannot
// take, an implementation id nobody registered (they gave 1).
TEST(Cli, ValuesTheCommandCannotUseAreBadUsage) {
  ExpectOneErrorLine(Tefl("explain fused_rope_forward --shape 4,2"),
                     "no call of fused_rope_forward with dtype fp32 and shape 4,2 can be built (rope ops take --shape "
                     "s,b,h,d (4 sizes))",
                     2);
  ExpectOneErrorLine(Tefl("explain fp8_transpose --dtype bf16"),
                     "no call of fp8_transpose with dtype bf16 can be built (the op has no built-in call for it)", 2);
  Result r = Tefl("bench --op gelu --impl banana --size 8 --min-time 0.01");
  ExpectOneErrorLine(r, "unknown implementation 'banana' (registered: default.portable, reference.cpp", 2);
  EXPECT_EQ(r.out, "") << "nothing is measured";
  r = Tefl("check --impl banana");
  ExpectOneErrorLine(r, "unknown implementation 'banana' (registered: default.portable, reference.cpp", 2);
  EXPECT_EQ(r.out, "");
  ExpectOneErrorLine(Tefl("check --impl default.portabel --op gelu"),
                     "unknown implementation 'default.portabel'; did you mean 'default.portable'? (registered: ", 2);
  // A plugin's ids count once it is loaded.
  r = Tefl("check --impl vendor.testgod --plugin " + Plugin("testgood"));
  ExpectOneErrorLine(r, "did you mean 'vendor.testgood'?", 2);
  EXPECT_NE(r.err.find("vendor.testgood)"), std::string::npos) << r.err;
  // Registered, but not for the ops selected: nothing to check (status 1).
  ExpectOneErrorLine(Tefl("check --op gelu --impl vendor.testgood --plugin " + Plugin("testgood")),
                     "no implementation 'vendor.testgood' is registered for the selected ops", 1);
}

TEST(Cli, ShapesAreParsedStrictly) {
  for (const char* bad :
       {"'8192 4096'", "8192,", "8192x", "+5,4", "-1,2", "5,4abc", "0y10", "' , '", "'[8,4'", "1e3", "''"}) {
    const Result r = Tefl(fmt::format("explain gelu --shape {}", bad));
    ExpectOneErrorLine(r, "malformed shape", 2);
    EXPECT_NE(r.err.find("expected non-negative decimal sizes separated by commas"), std::string::npos) << r.err;
  }
  ExpectOneErrorLine(Tefl("explain gelu --shape 99999999999999999999,1"),
                     "size 99999999999999999999 is larger than the largest size, 2^63 - 1 = 9223372036854775807", 2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 18446744073709551615"), "is larger than the largest size", 2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 3,x"), "an empty size at character 3 (',' and 'x' both separate sizes)",
                     2);
  // Forms that read two ways: "0x10" is hexadecimal as much as [0, 10]; a
  // shape mixing both separators (it was read as [0, 10, 4]).
  ExpectOneErrorLine(Tefl("explain gelu --shape 0x10,4"),
                     "malformed shape '0x10,4': '0x' at character 1 reads as a hexadecimal prefix; sizes are decimal",
                     2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 8,0X10"), "'0X' at character 3 reads as a hexadecimal prefix", 2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 2x8,16"),
                     "malformed shape '2x8,16': it mixes ',' and 'x' as separators (use one of them)", 2);
  EXPECT_EQ(Tefl("explain gelu --shape 10x0").code, 0) << "a size 0 after 'x' is no prefix";
  EXPECT_EQ(Tefl("explain gelu --shape 0,10").code, 0);
  // The forms that are meant: commas, x, brackets, spaces around separators.
  for (const char* good : {"8,16", "8x16", "'[8, 16]'", "' 8 , 16 '"}) {
    const Result r = Tefl(fmt::format("explain gelu --shape {}", good));
    EXPECT_EQ(r.code, 0) << good << ": " << r.err;
    EXPECT_NE(r.out.find("call       float32 [8, 16] on cpu"), std::string::npos) << good << ": " << r.out;
  }
}

TEST(Cli, DeviceNumbersAreRangeChecked) {
  ExpectOneErrorLine(Tefl("explain gelu --device 99999999999"), "device number '99999999999' is out of range", 2);
  ExpectOneErrorLine(Tefl("check --op gelu --device 99999999999"), "device number '99999999999' is out of range", 2);
  ExpectOneErrorLine(Tefl("explain gelu --device 64"), "out of range", 2);
  EXPECT_EQ(Tefl("explain gelu --device 1").code, 0);  // kDLCPU
}

TEST(Cli, ExplainGemmSkipsAbsentOutputs) {
  // The GEMM calls leave optional outputs (pre_gelu_out, bias_grad, d_amax)
  // NULL; explain used to dereference them.
  for (const char* op : {"generic_gemm", "te_general_grouped_gemm"}) {
    const Result r = Tefl(std::string("explain ") + op);
    EXPECT_EQ(r.code, 0) << op << ": " << r.err;
    EXPECT_NE(r.out.find("chain      default.portable"), std::string::npos) << op << ": " << r.out;
    EXPECT_EQ(Tefl(std::string("explain --json ") + op).Json()["op"], op);
  }
  EXPECT_EQ(Tefl("explain generic_gemm --shape 64,32").code, 0);
}

TEST(Cli, HugeShapesAreRejectedBeforeAllocating) {
  // Element counts that overflow 64 bits: bad usage, named.
  ExpectOneErrorLine(Tefl("explain gelu --shape 9223372036854775807,2"), "has too many elements", 2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 4294967296,4294967296"),
                     "shape '4294967296,4294967296' has too many elements", 2);
  ExpectOneErrorLine(Tefl("bench --op gelu --size 9223372036854775807,2 --min-time 0.01"), "has too many elements", 2);
  // Bytes beyond any address space.
  ExpectOneErrorLine(Tefl("explain gelu --shape 99999999999999,1"),
                     "--shape 99999999999999,1 is too big for explain here: cannot allocate a float32 tensor of shape "
                     "[99999999999999, 1]",
                     2);
  // Too many bytes and too many elements are the same mistake: status 2 both
  // (they gave 1 and 2).
  ExpectOneErrorLine(Tefl("explain gelu --shape 99999999999999"), "is too big for explain here", 2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 99999999999999,99999999999"), "has too many elements", 2);
  const Result b = Tefl("bench --op gelu --size 2305843009213693951,2 --min-time 0.01");
  ExpectOneErrorLine(b, "could not be run", 1);
  EXPECT_NE(b.out.find("not run: cannot allocate a float32 tensor of shape [2305843009213693951, 2]"),
            std::string::npos)
      << b.out;
}

TEST(Cli, AllocationFailureIsNamed) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "sanitizers reserve more address space than the limit below";
#else
  // 400 GB under a 4 GiB address-space limit: std::bad_alloc, reported with
  // the bytes and the tensor, and as a --shape explain cannot take (status
  // 2; docs/cli.md: the tensors are never written, but they are allocated).
  ExpectOneErrorLine(Tefl("explain gelu --shape 99999999999,1", "", "ulimit -v 4194304; "),
                     "--shape 99999999999,1 is too big for explain here: cannot allocate 400000000124 bytes for a "
                     "float32 tensor of shape [99999999999, 1] (explain reserves address space for the call's tensors, "
                     "though it never writes them)",
                     2);
  ExpectOneErrorLine(Tefl("explain gelu --shape 131072,65536", "", "ulimit -v 4194304; "),
                     "cannot allocate 34359738496 bytes for a float32 tensor of shape [131072, 65536]", 2);
#endif
}

// Large tensors of a described-only call are address space reserved without
// memory (MAP_NORESERVE): 2 x 64 GiB, far beyond this machine's memory,
// explained at a small peak RSS. Where the kernel commits every mapping
// (vm.overcommit_memory = 2) or an address-space limit is set, that cannot
// work, and the test says so.
TEST(Cli, ExplainDescribesCallsLargerThanMemory) {
  std::ifstream overcommit("/proc/sys/vm/overcommit_memory");
  int mode = 0;
  overcommit >> mode;
  rlimit as{};
  getrlimit(RLIMIT_AS, &as);
  if (mode == 2 || as.rlim_cur != RLIM_INFINITY)
    GTEST_SKIP() << "strict overcommit or an address-space limit: large reservations fail";
  const auto [kib, code] = PeakRssKiB("explain gelu --shape 131072,131072");
  EXPECT_EQ(code, 0);
  EXPECT_GT(kib, 0);
  EXPECT_LT(kib, 200 * 1024) << "peak RSS " << kib << " KiB";
}

// Empty tensors whose other dims are huge ([2^60, 0], [2^60, 1, 2, 0],
// [2^62, 4, 0]: valid, zero elements): every op's implementations run them
// without visiting 2^60 empty rows (each check is bounded by `timeout`: such
// a loop does not end), without a row count overflowing (UBSan, in the
// sanitizer build) and without a mismatch against reference.cpp. A shape an
// op cannot take is refused (status 2), as is one whose other tensors the
// built-in grid cannot allocate (a GEMM's [2^60] bias).
TEST(Cli, EmptyTensorsWithHugeDims) {
  std::vector<std::string> ops;
  for (const auto& op : Tefl("ops --json").Json()) ops.push_back(op["name"].get<std::string>());
  ASSERT_GT(ops.size(), 60u);
  for (const char* shape : {"1152921504606846976,0", "1152921504606846976,1,2,0", "4611686018427387904,4,0"})
    for (const std::string& op : ops) {
      SCOPED_TRACE(op + " --shape " + shape);
      const Result r = Tefl(fmt::format("check --op {} --shape {}", op, shape), "", "timeout 120 ");
      ASSERT_NE(r.code, 124) << "timed out";
      if (r.code == 0) {
        EXPECT_NE(r.out.find(" 0 failed"), std::string::npos) << r.out;
      } else {
        EXPECT_TRUE(r.err.find("can be built") != std::string::npos ||
                    r.err.find("cannot allocate") != std::string::npos ||
                    r.err.find("out of memory") != std::string::npos)
            << "status " << r.code << ": " << r.err << r.out.substr(0, 2000);
      }
    }
}

TEST(Cli, ExplainDoesNotFillTheTensors) {
  // 8192 x 8192 float32: 256 MiB in, 256 MiB out. Explain only describes the
  // call: the pages are never touched, so the peak stays far below.
  const auto [kib, code] = PeakRssKiB("explain gelu --shape 8192,8192");
  EXPECT_EQ(code, 0);
  EXPECT_GT(kib, 0);
  EXPECT_LT(kib, 200 * 1024) << "peak RSS " << kib << " KiB";
}

TEST(Cli, ExplainFailsWhenTheCallCannotBeResolved) {
  // No candidate: the report is printed, then status 1.
  Result r = Tefl("explain gelu", "TE_FL_PER_OP='gelu=impl:nosuch'");
  ExpectOneErrorLine(r, "cannot resolve the call: gelu: no implementation can serve this call", 1);
  EXPECT_NE(r.out.find("chain      (empty)"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("per_op=[gelu=impl:nosuch]"), std::string::npos) << r.out;
  r = Tefl("explain gelu --json", "TE_FL_PER_OP='gelu=impl:nosuch'");
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.Json()["chain"], nlohmann::json::array());
  // Strict mode: the first candidate declines, so the call fails.
  r = Tefl("explain rmsnorm_fwd --dtype bf16 --plugin " + Plugin("testgood"), "TE_FL_PREFER=vendor TE_FL_STRICT=1");
  ExpectOneErrorLine(r, "cannot resolve the call: rmsnorm_fwd: strict mode", 1);
  EXPECT_NE(r.out.find("error      "), std::string::npos) << r.out;
}

TEST(Cli, PolicyIsShownInWords) {
  Result r = Tefl("impls gelu", "TE_FL_DENY_VENDORS=acme,foo TE_FL_PER_OP='gelu=reference'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("2 implementations of 1 op; policy prefer=flagos strict=0 deny=acme,foo "
                       "per_op=[gelu=reference]\n"),
            std::string::npos)
      << r.out;
  // A variable set but ignored is named, not reported as "no variable set".
  r = Tefl("explain gelu", "TE_FL_STRICT=maybe");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out.find("no TE_FL_* policy variable is set"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("ignored: TE_FL_STRICT=maybe"), std::string::npos) << r.out;
  r = Tefl("explain gelu");
  EXPECT_NE(r.out.find("(defaults: no TE_FL_* policy variable is set)"), std::string::npos) << r.out;
  // Singular counts.
  r = Tefl("check --impl default.portable --op rmsnorm_fwd --dtype bf16 --shape 3,17");
  EXPECT_NE(r.out.find("(2 cases, 1 implementation)"), std::string::npos) << r.out;
  r = Tefl("bench --op relu --size 8 --min-time 0.01 --impl default.portable", "TEFL_NUM_THREADS=1");
  EXPECT_NE(r.out.find("256 MiB, 1 thread)"), std::string::npos) << r.out;
}

// Each variable explain lists as ignored comes with its reason; it said
// "see the WARNING" where none was printed (an overridden variable, a
// TE_FL_PER_OP naming no entry).
TEST(Cli, ExplainSaysWhyAVariableIsIgnored) {
  Result r = Tefl("explain rmsnorm_fwd", "TE_FL_PER_OP=';;;'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n           ignored: TE_FL_PER_OP=;;; (it names no op=token|token entry)\n"),
            std::string::npos)
      << r.out;
  r = Tefl("explain gelu", "TE_FL_PREFER_VENDOR=1 TE_FL_PREFER=reference");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("\n           ignored: TE_FL_PREFER_VENDOR=1 (overridden by TE_FL_PREFER)\n"), std::string::npos)
      << r.out;
  // Malformed: the parser's own words (its WARNING is on stderr too).
  r = Tefl("explain gelu", "TE_FL_STRICT=maybe TE_FL_PER_OP='nope=x'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("ignored: TE_FL_STRICT=maybe (expected 1, true, yes, on or 0, false, no, off)\n"),
            std::string::npos)
      << r.out;
  EXPECT_NE(r.out.find("ignored: TE_FL_PER_OP=nope=x (entry 'nope=x': unknown op 'nope')\n"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("see the WARNING"), std::string::npos) << r.out;
  const nlohmann::json j = Tefl("explain gelu --json", "TE_FL_PREFER_VENDOR=1 TE_FL_PREFER=reference").Json();
  EXPECT_EQ(j["ignored_reasons"]["TE_FL_PREFER_VENDOR"], "overridden by TE_FL_PREFER") << j.dump();
}

// docs/env.md: a bad TE_FL_PER_OP token gives a warning; an empty one
// between two ('flagos||reference') was skipped in silence.
TEST(Cli, EmptyPerOpTokenWarns) {
  const Result r = Tefl("explain rmsnorm_fwd", "TE_FL_PER_OP='rmsnorm_fwd=flagos||reference'");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("WARNING] Ignoring TE_FL_PER_OP token '' (between '|' and '|') for op 'rmsnorm_fwd'"),
            std::string::npos)
      << r.err;
  EXPECT_NE(r.out.find("order      flagos > reference\n"), std::string::npos) << r.out;
  // A trailing '|' is skipped like a trailing ';'.
  const Result t = Tefl("explain rmsnorm_fwd", "TE_FL_PER_OP='rmsnorm_fwd=flagos|;'");
  EXPECT_EQ(t.code, 0) << t.err;
  EXPECT_EQ(t.err, "");
}

TEST(Cli, CheckPassesTheBuiltins) {
  const Result r = Tefl("check --impl default.portable --op rmsnorm_fwd --op layernorm_bwd --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = r.Json();
  EXPECT_GT(j["summary"]["pass"].get<int>(), 20);
  EXPECT_EQ(j["summary"]["fail"], 0);
  for (const auto& res : j["results"]) EXPECT_EQ(res["result"], "PASS") << res.dump();
}

// A --shape that a named op cannot take is bad usage (it printed "0 cases"
// and exited 0), as in explain; over every op, the ops that cannot take it
// are skipped, and none at all is an error naming each family's form.
TEST(Cli, CheckRejectsAShapeTheOpCannotTake) {
  Result r = Tefl("check --impl default.portable --op scaled_softmax_forward --shape 4,4");
  ExpectOneErrorLine(r,
                     "no call of scaled_softmax_forward with shape 4,4 can be built (softmax ops take --shape "
                     "b,h,sq,sk (4 sizes))",
                     2);
  EXPECT_EQ(r.out, "");
  r = Tefl("check --impl default.portable --op generic_gemm --op scaled_softmax_forward --shape 2,2,2");
  ExpectOneErrorLine(r, "no call of generic_gemm with shape 2,2,2 can be built (gemm ops take --shape M,K", 2);
  r = Tefl("check --impl default.portable --op scaled_softmax_forward --op rmsnorm_fwd --shape 3,17 --json");
  ASSERT_EQ(r.code, 2) << r.err;  // softmax named: an error even though rmsnorm_fwd could run
  r = Tefl("check --impl default.portable --shape 2,2,4,4 --quiet");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("without a built-in grid"), std::string::npos) << r.out;
}

// Filters that leave no case to check fail (status 1) as filters that leave
// no implementation do; they printed "0 passed, 0 failed" and exited 0.
TEST(Cli, CheckFailsWhenTheFiltersLeaveNothing) {
  Result r = Tefl("check --op compute_scale_from_amax --dtype bf16");
  ExpectOneErrorLine(
      r, "nothing to check: the built-in grid has no case with dtype bfloat16 of 'compute_scale_from_amax'", 1);
  EXPECT_EQ(r.out, "");
  r = Tefl("check --op compute_scale_from_amax --dtype bf16 --json");
  ExpectOneErrorLine(r, "nothing to check", 1);
  EXPECT_EQ(r.out, "");
  ExpectOneErrorLine(Tefl("check --op gelu --device cuda"), "nothing to check: no implementation matches the filters",
                     1);
}

TEST(Cli, CheckFailsAWrongImplementationAndNamesTheCase) {
  const Result r = Tefl("check --quiet --plugin " + Plugin("wrong"));
  EXPECT_EQ(r.code, 1);
  ExpectOneErrorLine(r, "vendor.wrong rmsnorm_fwd float32 [1, 1]: 'z'");
  EXPECT_NE(r.out.find("FAIL"), std::string::npos);
  EXPECT_EQ(r.out.find("DECLINED"), std::string::npos) << "--quiet prints only FAIL lines";
  // The same plugin's float16 calls are declined with its supports() reason.
  const nlohmann::json j = Tefl("check --json --dtype fp16 --plugin " + Plugin("wrong")).Json();
  ASSERT_FALSE(j["results"].empty());
  for (const auto& res : j["results"]) {
    EXPECT_EQ(res["result"], "DECLINED");
    EXPECT_EQ(res["reason"], "supports() declined: wrong handles float32 only");
  }
  // A correct plugin passes (its fp32 cases) and exits 0.
  const Result good = Tefl("check --plugin " + Plugin("testgood"));
  EXPECT_EQ(good.code, 0) << good.err;
  EXPECT_NE(good.out.find("summary: 10 passed, 0 failed, 20 declined"), std::string::npos) << good.out;
}

// A kernel that fails (not a decline) is a FAIL with its own message; check
// pins each implementation itself, so the reason does not blame a strict
// policy (TE_FL_STRICT) the user never set.
TEST(Cli, CheckReportsAFailingKernelInItsOwnWords) {
  const nlohmann::json j = Tefl("check --json --dtype fp32 --op rmsnorm_fwd --plugin " + Plugin("failing")).Json();
  int failed = 0;
  for (const auto& res : j["results"]) {
    if (res["impl"] != "vendor.failing") continue;
    ++failed;
    EXPECT_EQ(res["result"], "FAIL") << res.dump();
    EXPECT_EQ(res["reason"], "RUNTIME_ERROR: failing: device lost") << res.dump();
    EXPECT_TRUE(res["max_abs"].is_null()) << "nothing was compared: " << res.dump();
  }
  EXPECT_GT(failed, 0) << j.dump();
  const Result r = Tefl("check --quiet --dtype fp32 --op rmsnorm_fwd --plugin " + Plugin("failing"));
  EXPECT_EQ(r.code, 1);
  EXPECT_EQ(r.out.find("TE_FL_STRICT"), std::string::npos) << r.out;
}

TEST(Cli, BenchReportsBandwidthAgainstCopy) {
  const Result r = Tefl("bench --op rmsnorm_fwd --size 64,256 --min-time 0.02 --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = r.Json();
  EXPECT_GT(j["copy_gbps"].get<double>(), 0);
  std::set<std::string> impls;
  for (const auto& row : j["results"]) {
    impls.insert(row["impl"]);
    EXPECT_EQ(row["shape"], "[64, 256]");
    EXPECT_GT(row["gbps"].get<double>(), 0);
    EXPECT_NEAR(row["pct_of_copy"].get<double>(), 100.0 * row["gbps"].get<double>() / j["copy_gbps"].get<double>(),
                1e-6);
#if defined(__SSE2__)
    EXPECT_NEAR(row["pct_of_stream_copy"].get<double>(),
                100.0 * row["gbps"].get<double>() / j["stream_copy_gbps"].get<double>(), 1e-6);
#endif
  }
#if defined(__SSE2__)
  EXPECT_GT(j["stream_copy_gbps"].get<double>(), 0);
#endif
  EXPECT_TRUE(impls.count("default.portable") && impls.count("reference.cpp"));
}

// An op named twice (or by its alias and its name) runs once; bench takes
// --shape like explain and check (--size is the same option).
TEST(Cli, RepeatedOpsRunOnceAndBenchTakesShape) {
  const nlohmann::json j =
      Tefl("bench --op relu --op relu --shape 8,16 --min-time 0.01 --impl default.portable --json").Json();
  ASSERT_EQ(j["results"].size(), 1u) << j.dump();
  EXPECT_EQ(j["results"][0]["shape"], "[8, 16]");
  const nlohmann::json once = Tefl("check --json --impl default.portable --dtype fp32 --op rope_fwd").Json();
  const nlohmann::json twice =
      Tefl("check --json --impl default.portable --dtype fp32 --op rope_fwd --op fused_rope_forward").Json();
  ASSERT_FALSE(once["results"].empty());
  EXPECT_EQ(twice["results"].size(), once["results"].size());
}

TEST(Cli, BenchMinTimeIsValidated) {
  for (const char* bad : {"inf", "-1", "nan", "0", "3601"}) {
    const Result r = Tefl(fmt::format("bench --op relu --size 8 --min-time {}", bad));
    ExpectOneErrorLine(r, "--min-time", 2);
    EXPECT_TRUE(r.out.empty()) << bad << ": nothing is measured: " << r.out;
  }
}

TEST(Cli, BenchFailsWhenARequestedRowCannotRun) {
  // An implementation nobody registered: bad usage, as `check` says it.
  Result r = Tefl("bench --op relu --size 8 --min-time 0.01 --impl nosuch.impl");
  ExpectOneErrorLine(r, "unknown implementation 'nosuch.impl'", 2);
  // Shapes the op cannot take: a row with the reason, then status 1.
  r = Tefl("bench --op fused_attn_fwd --size 64,64 --min-time 0.01");
  ExpectOneErrorLine(r, "fused_attn_fwd -: no call with dtype float32 and shape [64, 64] can be built", 1);
  EXPECT_NE(r.out.find("not run: no call with dtype float32 and shape [64, 64] can be built (attention ops take "
                       "--size b,s,h,d"),
            std::string::npos)
      << r.out;
  r = Tefl("bench --op scaled_softmax_forward --op relu --size 7 --min-time 0.01");
  ExpectOneErrorLine(r, "1 requested row could not be run; first: scaled_softmax_forward", 1);
  EXPECT_NE(r.out.find("relu  "), std::string::npos) << "the other rows still run: " << r.out;
  // A declined call (testgood serves float32 only): the decline itself, not
  // the strict policy bench pins each implementation with.
  r = Tefl("bench --op rmsnorm_fwd --size 8,8 --dtype bf16 --min-time 0.01 --impl vendor.testgood --plugin " +
           Plugin("testgood"));
  ExpectOneErrorLine(r, "rmsnorm_fwd vendor.testgood: supports() declined: testgood handles float32 only", 1);
  EXPECT_NE(r.out.find("not run: supports() declined: testgood handles float32 only\n"), std::string::npos) << r.out;
  EXPECT_EQ(r.out.find("strict mode"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("strict mode"), std::string::npos) << r.err;
  // An implementation that does not serve the op asked for.
  r = Tefl("bench --op gelu --size 8,8 --min-time 0.01 --impl vendor.testgood --plugin " + Plugin("testgood"));
  ExpectOneErrorLine(r, "gelu -: not implemented on the CPU by vendor.testgood", 1);
}

// Rows come out in the order --impl gave the implementations.
TEST(Cli, BenchKeepsTheImplOrderGiven) {
  for (const auto& order : {std::vector<std::string>{"vendor.testgood", "default.portable", "reference.cpp"},
                            std::vector<std::string>{"reference.cpp", "vendor.testgood", "default.portable"}}) {
    std::string args = "bench --op rmsnorm_fwd --size 8,8 --min-time 0.01 --json --plugin " + Plugin("testgood");
    for (const std::string& id : order) args += " --impl " + id;
    const Result r = Tefl(args);
    ASSERT_EQ(r.code, 0) << r.err;
    const nlohmann::json j = r.Json();
    std::vector<std::string> rows;
    for (const auto& row : j["results"]) rows.push_back(row["impl"]);
    EXPECT_EQ(rows, order) << j.dump();
  }
}

TEST(Cli, BenchGemmSizeIsMK) {
  // GEMM sizes are M,K (N = K); anything else is refused, never replaced by
  // a grid shape.
  for (const char* bad : {"64", "100", "64,32,16"}) {
    const Result r = Tefl(fmt::format("bench --op generic_gemm --size {} --min-time 0.01 --json", bad));
    ExpectOneErrorLine(r, "gemm ops take --size M,K (2 sizes; N = K)", 1);
    const nlohmann::json j = r.Json();  // kept: a range-for over a temporary's member would dangle
    for (const auto& row : j["results"]) EXPECT_FALSE(row.contains("seconds")) << row.dump();
  }
  ExpectOneErrorLine(Tefl("explain generic_gemm --shape 64"), "gemm ops take --shape M,K", 2);
  const Result r = Tefl("bench --op generic_gemm --size 64,32 --min-time 0.01 --impl default.portable --json");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.Json()["results"][0]["shape"], "[64, 32]");
}

TEST(Cli, MalformedLogLevelWarnsAndKeepsInfoOff) {
  // A malformed TEFL_LOG_LEVEL counts as unset: the library's warning, and
  // none of its INFO lines.
  const Result r = Tefl("impls rmsnorm_fwd", "TEFL_LOG_LEVEL=banana");
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.err.find("Ignoring TEFL_LOG_LEVEL='banana'"), std::string::npos) << r.err;
  EXPECT_EQ(r.err.find(" INFO]"), std::string::npos) << r.err;
}

TEST(Cli, MalformedNumThreadsWarns) {
  for (const char* bad : {"0", "-3", "abc", "1025", "99999999999"}) {
    const Result r = Tefl("bench --op relu --size 8 --min-time 0.01 --impl default.portable --json",
                          fmt::format("TEFL_NUM_THREADS={}", bad));
    EXPECT_EQ(r.code, 0) << bad << ": " << r.err;
    EXPECT_NE(r.err.find(fmt::format("Ignoring TEFL_NUM_THREADS='{}': expected an integer 1..1024", bad)),
              std::string::npos)
        << bad << ": " << r.err;
  }
  const Result r =
      Tefl("bench --op relu --size 8 --min-time 0.01 --impl default.portable --json", "TEFL_NUM_THREADS=3");
  EXPECT_EQ(r.err.find("TEFL_NUM_THREADS"), std::string::npos) << r.err;
  EXPECT_EQ(r.Json()["threads"], 3);
}

TEST(Cli, BenchPlotWritesAPng) {
  const std::string png = ::testing::TempDir() + "/tefl_bench_plot." + std::to_string(getpid()) + ".png";
  const Result r = Tefl("bench --op relu --op gelu --size 32,64 --min-time 0.01 --plot '" + png + "'");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("chart written to"), std::string::npos) << r.out;
  const std::string bytes = ReadFile(png);
  ASSERT_GT(bytes.size(), 1000u);
  EXPECT_EQ(bytes.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  std::remove(png.c_str());
  // A failing plot script is this command's error.
  const std::string broken = ::testing::TempDir() + "/tefl_bench_plot_broken." + std::to_string(getpid()) + ".py";
  std::FILE* f = std::fopen(broken.c_str(), "w");
  ASSERT_NE(f, nullptr);
  std::fputs("import sys\nprint('broken: no chart', file=sys.stderr)\nsys.exit(3)\n", f);
  std::fclose(f);
  ExpectOneErrorLine(
      Tefl("bench --op relu --size 8,8 --min-time 0.01 --plot '" + png + "'", "TEFL_PLOT_SCRIPT='" + broken + "'"),
      "the plot script failed (" + broken + "): broken: no chart", 1);
  std::remove(broken.c_str());
  std::remove(png.c_str());
}

// What --plot needs is checked before anything is measured (these failed
// only after the whole benchmark had run).
TEST(Cli, BenchPlotIsCheckedFirst) {
  const std::string args = "bench --op relu --size 8,8 --min-time 0.01 --plot ";
  Result r = Tefl(args + "/nonexistent-dir/x.png");
  ExpectOneErrorLine(r, "--plot /nonexistent-dir/x.png: the directory '/nonexistent-dir' does not exist", 2);
  EXPECT_EQ(r.out, "") << "nothing is measured";
  r = Tefl(args + "out.txt");
  ExpectOneErrorLine(r, "--plot out.txt: unsupported format '.txt' (expected a file name ending .png, .pdf, .svg", 2);
  EXPECT_EQ(r.out, "");
  ExpectOneErrorLine(Tefl(args + "chart"), "--plot chart: no format given", 2);
  const std::string png = ::testing::TempDir() + "/tefl_bench_plot_first." + std::to_string(getpid()) + ".png";
  r = Tefl(args + "'" + png + "'", "TEFL_PLOT_SCRIPT=/nonexistent.py");
  ExpectOneErrorLine(
      r, "--plot: the plot script '/nonexistent.py' (TEFL_PLOT_SCRIPT) cannot be read: No such file or directory", 1);
  EXPECT_EQ(r.out, "");
}

TEST(Cli, DemoHeadlineSaysWhatItTimes) {
  const Result r = Tefl("demo --batch 1 --seq 16 --hidden 64 --heads 2 --ffn 32");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find(" tokens/s (the table's times summed; the whole pass took "), std::string::npos) << r.out;
}

TEST(Cli, DemoReferenceHasZeroErrorDefaultWithinTolerance) {
  const std::string size = "demo --batch 1 --seq 16 --hidden 64 --heads 2 --ffn 32 --json";
  nlohmann::json j = Tefl(size, "TE_FL_PREFER=reference").Json();
  ASSERT_TRUE(j.contains("ops"));
  for (const auto& op : j["ops"]) {
    EXPECT_EQ(op["max_abs_error"].get<double>(), 0.0) << op.dump();
    if (!op["demo_code"].get<bool>()) {
      EXPECT_EQ(op["implementation"], "reference.cpp") << op.dump();
    }
  }
  j = Tefl(size).Json();
  std::set<std::string> ops;
  for (const auto& op : j["ops"]) {
    ops.insert(op["op"]);
    EXPECT_LE(op["max_abs_error"].get<double>(), 1e-3) << op.dump();
    if (!op["demo_code"].get<bool>()) {
      EXPECT_EQ(op["implementation"], "default.portable") << op.dump();
    }
  }
  for (const char* op :
       {"rmsnorm_fwd", "generic_gemm (qkv projection)", "fused_rope_forward", "fused_attn_fwd", "swiglu", "dswiglu",
        "generic_gemm (mlp up, wgrad)", "fused_attn_bwd", "fused_rope_backward", "rmsnorm_bwd_add"})
    EXPECT_TRUE(ops.count(op)) << op;
  // Only the residual adds are the demo's own code.
  for (const auto& op : j["ops"]) {
    if (op["demo_code"].get<bool>()) {
      EXPECT_EQ(op["op"].get<std::string>().rfind("residual add", 0), 0u) << op.dump();
    }
  }
  EXPECT_GT(j["tokens_per_second"].get<double>(), 0);
  // The headline times the layer's ops (the table's rows summed), not the
  // demo's bookkeeping (tensor conversions, copies for the comparison): it
  // timed the whole pass, 28.6 ms where the rows summed to 8.4 ms.
  double sum = 0;
  for (const auto& op : j["ops"]) sum += op["seconds"].get<double>();
  EXPECT_NEAR(j["seconds"].get<double>(), sum, 1e-9 * sum) << j.dump();
  EXPECT_NEAR(j["tokens_per_second"].get<double>(), 16.0 / sum, 1e-9 * 16.0 / sum);
  EXPECT_GT(j["pass_seconds"].get<double>(), j["seconds"].get<double>());
  // With a plugin loaded and TE_FL_PREFER=vendor the table shows the vendor's
  // implementation (testgood serves fp32 rmsnorm_fwd).
  j = Tefl(size + " --plugin " + Plugin("testgood"), "TE_FL_PREFER=vendor").Json();
  bool saw = false;
  for (const auto& op : j["ops"]) {
    if (op["op"] != "rmsnorm_fwd") continue;
    saw = true;
    EXPECT_EQ(op["implementation"], "vendor.testgood") << op.dump();
    EXPECT_LE(op["max_abs_error"].get<double>(), 1e-5) << op.dump();
  }
  EXPECT_TRUE(saw);
}

}  // namespace
