// The `tefl` command, run as a process: each subcommand's output (golden
// text where it is stable, parsed JSON otherwise), exit statuses, and the
// one-line errors for bad arguments.
#include <fmt/format.h>
#include <gtest/gtest.h>
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

// Runs `tefl ARGS` with extra environment assignments ("A=b C=d").
Result Tefl(const std::string& args, const std::string& env = "") {
  const std::string dir = ::testing::TempDir();
  const std::string out = dir + "/tefl_cli_out." + std::to_string(getpid());
  const std::string err = dir + "/tefl_cli_err." + std::to_string(getpid());
  // A clean policy environment: only what the test sets.
  const std::string cmd = fmt::format(
      "env -u TE_FL_PREFER -u TE_FL_PREFER_VENDOR -u TE_FL_STRICT -u TE_FL_PER_OP -u TE_FL_ALLOW_VENDORS "
      "-u TE_FL_DENY_VENDORS -u TE_FL_PLUGIN_MODULES -u TEFL_LOG_LEVEL -u TE_FL_VERBOSE {} '{}' {} >'{}' 2>'{}'",
      env, TEFL_CLI_PATH, args, out, err);
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

// One line on stderr, starting "tefl: error: ".
void ExpectOneErrorLine(const Result& r, const std::string& needle) {
  EXPECT_NE(r.code, 0);
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

TEST(Cli, OpsDetailGolden) {
  const Result r = Tefl("ops rmsnorm_fwd");
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_EQ(r.out,
            "rmsnorm_fwd  (family normalization, id 2)\n"
            "  RMSNorm forward: z = x * rsigma * g, rsigma = 1/sqrt(mean(x^2) + eps)\n"
            "        name                 dtypes                    shape\n"
            "  in    x                    float32|float16|bfloat16  [N..., H]\n"
            "  in    gamma                float32|float16|bfloat16  [H]\n"
            "  out   z                    float32|float16|bfloat16  like x\n"
            "  out   rsigma               float32                   [N] or x.shape[:-1]\n"
            "  attr  eps                  f32                       default 1e-05, [0, inf]      added to the "
            "variance before the square root\n"
            "  attr  zero_centered_gamma  bool                      default 0, [0, 1]            apply gamma + 1\n"
            "  attr  sm_margin            i32                       default 0, [0, 1.04858e+06]  SMs left free by "
            "CUDA kernels; ignored on the CPU\n");
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
  ExpectOneErrorLine(Tefl("explain nope_op"), "unknown op 'nope_op'");
  ExpectOneErrorLine(Tefl("explain rmsnrm_fwd"), "did you mean 'rmsnorm_fwd'");
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --dtype int7"), "unknown dtype 'int7'");
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --shape 3,,4"), "malformed shape '3,,4'");
  ExpectOneErrorLine(Tefl("explain rmsnorm_fwd --device quantum"), "unknown device 'quantum'");
  ExpectOneErrorLine(Tefl("check --plugin /nonexistent/libtefl_plugin_x.so"), "cannot load plugin");
  ExpectOneErrorLine(Tefl("check --plugin no_such_plugin_name"), "cannot load plugin 'no_such_plugin_name'");
  ExpectOneErrorLine(Tefl("ops --family nope"), "no op of family 'nope'");
  ExpectOneErrorLine(Tefl("frobnicate"), "frobnicate");
  ExpectOneErrorLine(Tefl("demo --heads 3"), "--heads 3 must divide --hidden 256");
}

TEST(Cli, CheckPassesTheBuiltins) {
  const Result r = Tefl("check --impl default.portable --op rmsnorm_fwd --op layernorm_bwd --json");
  ASSERT_EQ(r.code, 0) << r.err;
  const nlohmann::json j = r.Json();
  EXPECT_GT(j["summary"]["pass"].get<int>(), 20);
  EXPECT_EQ(j["summary"]["fail"], 0);
  for (const auto& res : j["results"]) EXPECT_EQ(res["result"], "PASS") << res.dump();
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
  ExpectOneErrorLine(Tefl("bench --op relu --size 8,8 --min-time 0.01 --plot /nonexistent-dir/x.png"),
                     "the plot script failed");
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
