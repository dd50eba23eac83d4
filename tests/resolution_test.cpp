// Resolution and execution: prefer × per-op × allow/deny × priority × device
// × supports() give the expected chain; fallback, strict mode, in-place calls,
// per-signature demotion and cache invalidation behave as DESIGN §3 says.
#include <gtest/gtest.h>

#include <atomic>
#include <map>

#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

// A fake implementation that records how often it ran and answers with a
// programmable status. Outputs are written (z = 1) on success only.
struct Fake {
  std::string id;
  BackendImplKind kind;
  std::string vendor;
  int32_t priority;
  uint64_t devices = TEFL_DEVICE_BIT(kDLCPU);
  bool fp32_only = false;          // supports() declines other dtypes
  int32_t runtime_code = TEFL_OK;  // what the kernel returns
  std::atomic<int> calls{0};
};

int32_t FakeSupports(const tefl_call_frame* f, void* user, char* why, size_t len) {
  auto* fake = static_cast<Fake*>(user);
  if (fake->fp32_only && f->inputs[0]->dtype.bits != 32) {
    std::snprintf(why, len, "%s handles fp32 only", fake->id.c_str());
    return 0;
  }
  return 1;
}

tefl_status* FakeKernel(const tefl_call_frame* f, void* user) {
  auto* fake = static_cast<Fake*>(user);
  fake->calls++;
  if (fake->runtime_code != TEFL_OK) {
    return tefl_status_new(fake->runtime_code, (fake->id + " says no").c_str());
  }
  // Mark the first output so a test can see a write happened.
  DLTensor* out = f->outputs[0];
  if (out->dtype.bits == 32 && out->shape[0] > 0) static_cast<float*>(out->data)[0] = 1.0f;
  return nullptr;
}

class ResolutionTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ResetGlobalPolicy();
    Add("vendor.acme", BackendImplKind::VENDOR, "acme", 100);
    Add("vendor.zeta", BackendImplKind::VENDOR, "Zeta", 200);
    Add("vendor.gpuonly", BackendImplKind::VENDOR, "acme", 500)->devices = TEFL_DEVICE_BIT(kDLCUDA);
    Add("vendor.picky", BackendImplKind::VENDOR, "picky", 0)->fp32_only = true;
    Add("default.extra", BackendImplKind::DEFAULT, "", 50);
    manager_.EnsureInitialized();  // adds default.portable and reference.cpp
  }
  void TearDown() override { ResetGlobalPolicy(); }

  Fake* Add(const std::string& id, BackendImplKind kind, const std::string& vendor, int32_t priority,
            const std::string& op = "rmsnorm_fwd") {
    auto fake = std::make_unique<Fake>();
    fake->id = id;
    fake->kind = kind;
    fake->vendor = vendor;
    fake->priority = priority;
    Fake* raw = fake.get();
    fakes_[op + "/" + id] = std::move(fake);
    pending_.push_back({op, raw});
    return raw;
  }
  // Registers the fakes added since the last call (after devices/flags were set).
  void Flush() {
    for (auto& [op, raw] : pending_) {
      OpImpl impl;
      impl.op_name = op;
      impl.impl_id = raw->id;
      impl.kind = raw->kind;
      impl.vendor = raw->vendor;
      impl.priority = raw->priority;
      impl.device_mask = raw->devices;
      impl.kernel = FakeKernel;
      impl.supports = FakeSupports;
      impl.user_data = raw;
      ASSERT_TRUE(registry_.RegisterImpl(impl).ok());
    }
    pending_.clear();
  }
  Fake& F(const std::string& id, const std::string& op = "rmsnorm_fwd") { return *fakes_.at(op + "/" + id); }

  Resolution ExplainRms(DType dt) {
    Flush();
    Tensor x(dt, {2, 8}), g(dt, {8}), z(dt, {2, 8}), rs(DType::kF32, {2});
    x.Uniform("x");
    g.Uniform("g");
    const DLTensor* in[] = {x.ptr(), g.ptr()};
    DLTensor* out[] = {z.ptr(), rs.ptr()};
    return manager_.Explain(TEFL_OP_RMSNORM_FWD, in, out);
  }
  Status CallRms(DType dt, int64_t rows = 2) {
    Flush();
    Tensor x(dt, {rows, 8}), g(dt, {8}), z(dt, {rows, 8}), rs(DType::kF32, {rows});
    x.Uniform("x");
    g.Uniform("g");
    return testing::CallOp(manager_, "rmsnorm_fwd", {&x, &g}, {&z, &rs});
  }
  std::string ChainOf(const Resolution& r) {
    if (!r.error.empty()) return "error: " + r.error;
    std::string s;
    for (const auto& id : r.chain) s += (s.empty() ? "" : ",") + id;
    return s;
  }

  OpRegistry registry_;
  OpManager manager_{&registry_};
  std::map<std::string, std::unique_ptr<Fake>> fakes_;
  std::vector<std::pair<std::string, Fake*>> pending_;
};

struct ChainCase {
  const char* name;
  std::vector<std::pair<std::string, std::string>> env;
  DType dtype;
  const char* expected;  // comma-separated chain, or "error: ..." prefix
};

const ChainCase kChainCases[] = {
    // Within a token: priority high first, then impl_id. gpuonly never serves the CPU.
    {"default_order",
     {},
     DType::kF32,
     "default.extra,default.portable,vendor.zeta,vendor.acme,vendor.picky,reference.cpp"},
    {"prefer_vendor",
     {{"TE_FL_PREFER", "vendor"}},
     DType::kF32,
     "vendor.zeta,vendor.acme,vendor.picky,default.extra,default.portable,reference.cpp"},
    {"prefer_reference",
     {{"TE_FL_PREFER", "reference"}},
     DType::kF32,
     "reference.cpp,default.extra,default.portable,vendor.zeta,vendor.acme,vendor.picky"},
    {"legacy_prefer_vendor",
     {{"TE_FL_PREFER_VENDOR", "1"}},
     DType::kF32,
     "vendor.zeta,vendor.acme,vendor.picky,default.extra,default.portable,reference.cpp"},
    {"per_op_vendor_name_then_flagos",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor:acme|flagos"}},
     DType::kF32,
     "vendor.acme,default.extra,default.portable"},
    {"per_op_impl_then_vendor_name_case",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=impl:reference.cpp|vendor:ZETA"}},
     DType::kF32,
     "reference.cpp,vendor.zeta"},
    {"per_op_other_op_only",
     {{"TE_FL_PER_OP", "layernorm_fwd=reference"}, {"TE_FL_PREFER", "reference"}},
     DType::kF32,
     "reference.cpp,default.extra,default.portable,vendor.zeta,vendor.acme,vendor.picky"},
    {"per_op_beats_prefer",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=reference|vendor"}, {"TE_FL_PREFER", "flagos"}},
     DType::kF32,
     "reference.cpp,vendor.zeta,vendor.acme,vendor.picky"},
    {"deny_case_insensitive",
     {{"TE_FL_DENY_VENDORS", "ZETA"}, {"TE_FL_PREFER", "vendor"}},
     DType::kF32,
     "vendor.acme,vendor.picky,default.extra,default.portable,reference.cpp"},
    {"allow_one",
     {{"TE_FL_ALLOW_VENDORS", "acme"}, {"TE_FL_PREFER", "vendor"}},
     DType::kF32,
     "vendor.acme,default.extra,default.portable,reference.cpp"},
    {"deny_beats_allow",
     {{"TE_FL_ALLOW_VENDORS", "acme"}, {"TE_FL_DENY_VENDORS", "acme"}},
     DType::kF32,
     "default.extra,default.portable,reference.cpp"},
    {"supports_declines_bf16",
     {{"TE_FL_PREFER", "vendor"}},
     DType::kBF16,
     "vendor.zeta,vendor.acme,default.extra,default.portable,reference.cpp"},
    {"nothing_matches",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor:nobody"}},
     DType::kF32,
     "error: rmsnorm_fwd: no implementation can serve this call"},
    {"strict_first_declines",
     {{"TE_FL_STRICT", "1"}, {"TE_FL_PER_OP", "rmsnorm_fwd=vendor:picky|flagos"}},
     DType::kBF16,
     "error: rmsnorm_fwd: strict mode (TE_FL_STRICT=1): the first candidate 'vendor.picky'"},
    {"strict_keeps_first_only", {{"TE_FL_STRICT", "1"}, {"TE_FL_PREFER", "vendor"}}, DType::kF32, "vendor.zeta"},
};

class ChainTable : public ResolutionTest, public ::testing::WithParamInterface<ChainCase> {};

TEST_P(ChainTable, ExpectedChain) {
  const ChainCase& c = GetParam();
  SetGlobalPolicy(SelectionPolicy::FromEnv(nullptr, testing::EnvFrom(c.env)));
  const std::string chain = ChainOf(ExplainRms(c.dtype));
  if (std::string(c.expected).rfind("error: ", 0) == 0) {
    EXPECT_EQ(chain.rfind(c.expected, 0), 0u) << chain;
  } else {
    EXPECT_EQ(chain, c.expected);
  }
}

INSTANTIATE_TEST_SUITE_P(PolicyMatrix, ChainTable, ::testing::ValuesIn(kChainCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST_F(ResolutionTest, ExplainGivesEveryRejectionReason) {
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor").WithDeniedVendors({"zeta"}));
  Resolution r = ExplainRms(DType::kBF16);
  std::map<std::string, CandidateReport> by_id;
  for (const auto& c : r.candidates) by_id[c.impl_id] = c;
  ASSERT_EQ(by_id.size(), 7u);
  EXPECT_NE(by_id["vendor.zeta"].reason.find("TE_FL_DENY_VENDORS"), std::string::npos);
  EXPECT_NE(by_id["vendor.gpuonly"].reason.find("does not serve device type cpu"), std::string::npos);
  EXPECT_NE(by_id["vendor.picky"].reason.find("vendor.picky handles fp32 only"), std::string::npos);
  EXPECT_TRUE(by_id["vendor.acme"].accepted);
  EXPECT_EQ(r.order, (std::vector<std::string>{"vendor", "flagos", "reference"}));
  EXPECT_NE(r.signature.find("x:bfloat16[2d]"), std::string::npos);
  SetGlobalPolicy(SelectionPolicy().WithAllowedVendors({"acme"}));
  r = ExplainRms(DType::kF32);
  for (const auto& c : r.candidates) {
    if (c.impl_id == "vendor.picky") {
      EXPECT_NE(c.reason.find("TE_FL_ALLOW_VENDORS"), std::string::npos);
    }
  }
  SetGlobalPolicy(SelectionPolicy::FromEnv(nullptr, testing::EnvFrom({{"TE_FL_PER_OP", "rmsnorm_fwd=vendor"}})));
  r = ExplainRms(DType::kF32);
  for (const auto& c : r.candidates) {
    if (c.impl_id == "reference.cpp") {
      EXPECT_NE(c.reason.find("matches no token of the order vendor"), std::string::npos);
    }
  }
}

TEST_F(ResolutionTest, RunsFirstCandidate) {
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  EXPECT_EQ(F("vendor.acme").calls, 0);
  EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "vendor.zeta");
}

TEST_F(ResolutionTest, UnsupportedAtRuntimeFallsBackEveryTimeWithoutDemotion) {
  F("vendor.zeta").runtime_code = TEFL_UNSUPPORTED;
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  testing::LogCapture logs(TEFL_LOG_DEBUG);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 3);  // tried each time: declining is not failing
  EXPECT_EQ(F("vendor.acme").calls, 3);
  EXPECT_EQ(logs.Count("WARNING"), 0);
  EXPECT_EQ(logs.Count("DEBUG] Op 'rmsnorm_fwd' implementation 'vendor.zeta' declined: vendor.zeta says no"), 3);
  // The fallback is visible at INFO the first time for this signature only.
  int info_fallbacks = 0;
  for (const auto& l : logs.Lines())
    info_fallbacks += l.find("INFO] Op 'rmsnorm_fwd' fell back to 'vendor.acme'") != std::string::npos;
  EXPECT_EQ(info_fallbacks, 1);
}

TEST_F(ResolutionTest, ErrorDemotesOnlyThatSignature) {
  F("vendor.zeta").runtime_code = TEFL_RUNTIME_ERROR;
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  testing::LogCapture logs(TEFL_LOG_INFO);
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  EXPECT_EQ(F("vendor.acme").calls, 1);
  ASSERT_TRUE(CallRms(DType::kF32).ok());  // same signature: zeta is now last, acme serves
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  EXPECT_EQ(F("vendor.acme").calls, 2);
  EXPECT_EQ(logs.Count("WARNING] Op 'rmsnorm_fwd' implementation 'vendor.zeta'"), 1);
  // Another signature (bf16) still tries zeta first.
  ASSERT_TRUE(CallRms(DType::kBF16).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  // Explain shows the demotion for the fp32 signature.
  Resolution r = ExplainRms(DType::kF32);
  EXPECT_EQ(r.chain.back(), "vendor.zeta");
  for (const auto& c : r.candidates)
    if (c.impl_id == "vendor.zeta") {
      EXPECT_TRUE(c.demoted);
    }
}

// A kernel returning a status code the host does not know (a newer
// plugin's) has failed: the call falls back as for a runtime error, and the
// warning keeps the number.
TEST_F(ResolutionTest, UnknownStatusCodeIsAFailure) {
  F("vendor.zeta").runtime_code = 99;
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  testing::LogCapture logs(TEFL_LOG_INFO);
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  EXPECT_EQ(F("vendor.acme").calls, 1);
  EXPECT_EQ(logs.Count("WARNING] Op 'rmsnorm_fwd' implementation 'vendor.zeta' (kind=vendor, vendor=Zeta) failed for "
                       "(x:float32[2d] gamma:float32[1d] -> z:float32[2d] rsigma:float32[1d]): (unknown status code "
                       "99) vendor.zeta says no; demoted for this signature, falling back"),
            1);
  // Strict: the caller gets RUNTIME_ERROR, not 99.
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor").WithStrict(true));
  F("vendor.zeta").calls = 0;
  const Status st = CallRms(DType::kBF16);
  EXPECT_EQ(st.code(), TEFL_RUNTIME_ERROR);
  EXPECT_NE(st.message().find("(unknown status code 99) vendor.zeta says no"), std::string::npos) << st.message();
}

// A per-op token naming no registered implementation or vendor of the op is
// said once per op and token: WARNING with the close name when it looks like
// a typo, INFO otherwise (a plugin not loaded here); an unresolvable call's
// error names it too.
TEST_F(ResolutionTest, PolicyTokensNamingNothingAreReported) {
  SetGlobalPolicy(SelectionPolicy::FromEnv(
      nullptr,
      testing::EnvFrom({{"TE_FL_PER_OP", "rmsnorm_fwd=impl:vendor.acmee|vendor:zetta|vendor:nobody|reference"}})));
  testing::LogCapture logs(TEFL_LOG_INFO);
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  ASSERT_TRUE(CallRms(DType::kBF16).ok());  // a second signature: nothing logged again
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(logs.Count("WARNING] Policy for op 'rmsnorm_fwd': token 'impl:vendor.acmee' of the order names no "
                       "registered implementation of rmsnorm_fwd (did you mean 'impl:vendor.acme'?)"),
            1);
  EXPECT_EQ(logs.Count("WARNING] Policy for op 'rmsnorm_fwd': token 'vendor:zetta' of the order names no registered "
                       "vendor of rmsnorm_fwd (did you mean 'vendor:zeta'?)"),
            1);
  EXPECT_EQ(logs.Count("INFO] Policy for op 'rmsnorm_fwd': token 'vendor:nobody' of the order names no registered "
                       "vendor of rmsnorm_fwd"),
            1);
  EXPECT_EQ(logs.Count("Policy for op"), 3);
  // Tokens that match something are not reported.
  SetGlobalPolicy(SelectionPolicy::FromEnv(
      nullptr, testing::EnvFrom({{"TE_FL_PER_OP", "rmsnorm_fwd=impl:vendor.acme|vendor:ZETA"}})));
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(logs.Count("Policy for op"), 3);
  // With nothing left to run, the error says why.
  SetGlobalPolicy(
      SelectionPolicy::FromEnv(nullptr, testing::EnvFrom({{"TE_FL_PER_OP", "rmsnorm_fwd=impl:default.protable"}})));
  const std::string chain = ChainOf(ExplainRms(DType::kF32));
  EXPECT_NE(chain.find("token 'impl:default.protable' of the order names no registered implementation of rmsnorm_fwd "
                       "(did you mean 'impl:default.portable'?)"),
            std::string::npos)
      << chain;
}

TEST_F(ResolutionTest, ExplainListsCandidatesInTheOrderConsidered) {
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  const Resolution r = ExplainRms(DType::kF32);
  std::vector<std::string> ids;
  for (const auto& c : r.candidates) ids.push_back(c.impl_id);
  // Policy order (token, then priority), then those left out (the CUDA-only one).
  const std::vector<std::string> want = {"vendor.zeta",      "vendor.acme",   "vendor.picky",  "default.extra",
                                         "default.portable", "reference.cpp", "vendor.gpuonly"};
  EXPECT_EQ(ids, want);
}

TEST_F(ResolutionTest, StrictModeIgnoresAnEarlierDemotion) {
  F("vendor.zeta").runtime_code = TEFL_RUNTIME_ERROR;
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  ASSERT_TRUE(CallRms(DType::kF32).ok());  // zeta fails and is demoted, acme serves
  ASSERT_EQ(F("vendor.acme").calls, 1);
  // Strict mode: zeta is still the policy's first candidate; it runs and its
  // failure is the call's error, with no fallback to acme.
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor").WithStrict(true));
  Resolution r = ExplainRms(DType::kF32);
  ASSERT_EQ(r.chain.size(), 1u);
  EXPECT_EQ(r.chain[0], "vendor.zeta");
  Status s = CallRms(DType::kF32);
  EXPECT_EQ(s.code(), TEFL_RUNTIME_ERROR);
  EXPECT_NE(s.message().find("strict mode (policy set in code): 'vendor.zeta'"), std::string::npos) << s.message();
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  EXPECT_EQ(F("vendor.acme").calls, 1);
  // Back to non-strict: the demotion still holds (acme first, zeta not run).
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  EXPECT_EQ(F("vendor.acme").calls, 2);
}

TEST_F(ResolutionTest, StrictModeFailsNamingTheFirstCandidate) {
  F("vendor.zeta").runtime_code = TEFL_RUNTIME_ERROR;
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor").WithStrict(true));
  Status s = CallRms(DType::kF32);
  EXPECT_EQ(s.code(), TEFL_RUNTIME_ERROR);
  // The policy was made strict in code: the error does not blame TE_FL_STRICT.
  EXPECT_NE(s.message().find("strict mode (policy set in code): 'vendor.zeta'"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("vendor.zeta says no"), std::string::npos);
  EXPECT_EQ(F("vendor.acme").calls, 0);
  // From the environment it names the variable.
  SetGlobalPolicy(
      SelectionPolicy::FromEnv(nullptr, testing::EnvFrom({{"TE_FL_STRICT", "1"}, {"TE_FL_PREFER", "vendor"}})));
  s = CallRms(DType::kF32);
  EXPECT_NE(s.message().find("rmsnorm_fwd: strict mode (TE_FL_STRICT=1): 'vendor.zeta'"), std::string::npos)
      << s.message();
  // A runtime decline is an error too in strict mode.
  F("vendor.zeta").runtime_code = TEFL_UNSUPPORTED;
  s = CallRms(DType::kF32);
  EXPECT_EQ(s.code(), TEFL_FAILED_PRECONDITION);
  EXPECT_NE(s.message().find("declined"), std::string::npos);
  EXPECT_EQ(F("vendor.acme").calls, 0);
  // Without strict the same failure falls back.
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  EXPECT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.acme").calls, 1);
}

TEST_F(ResolutionTest, InPlaceCallIsNeverRetriedAfterAnError) {
  Fake* failing = Add("vendor.inplace", BackendImplKind::VENDOR, "acme", 900, "rmsnorm_bwd_add");
  failing->runtime_code = TEFL_RUNTIME_ERROR;
  Flush();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  Tensor dz(DType::kF32, {2, 8}), x(DType::kF32, {2, 8}), add(DType::kF32, {2, 8}), rs(DType::kF32, {2}),
      g(DType::kF32, {8}), dx(DType::kF32, {2, 8}), dg(DType::kF32, {8});
  dz.Uniform("dz");
  x.Uniform("x");
  add.Uniform("add");
  rs.Fill(1.0);
  g.Uniform("g");
  // Out of place: the failure falls back to the next candidate.
  ASSERT_TRUE(testing::CallOp(manager_, "rmsnorm_bwd_add", {&dz, &x, &add, &rs, &g}, {&dx, &dg}).ok());
  EXPECT_EQ(failing->calls, 1);
  // In place (dx is add): the failure is final.
  Status s = testing::CallOp(manager_, "rmsnorm_bwd_add", {&dz, &x, &add, &rs, &g}, {&add, &dg});
  EXPECT_EQ(s.code(), TEFL_RUNTIME_ERROR);
  EXPECT_NE(s.message().find("in-place"), std::string::npos) << s.message();
  EXPECT_EQ(failing->calls, 2);
  // A partial overlap is still refused by validation.
  Tensor big(DType::kF32, {3, 8});
  DLTensor shifted = big.dl();
  shifted.shape = add.dl().shape;
  shifted.byte_offset = 4;
  DLTensor add_view = big.dl();
  add_view.shape = add.dl().shape;
  const DLTensor* in[] = {dz.ptr(), x.ptr(), &add_view, rs.ptr(), g.ptr()};
  DLTensor* out[] = {&shifted, dg.ptr()};
  s = manager_.Call(TEFL_OP_RMSNORM_BWD_ADD, in, out);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
}

TEST_F(ResolutionTest, CacheFollowsPolicyChangesAndScopedOverrides) {
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("default.extra").calls, 1);
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  {
    PolicyContext scoped(GetPolicy().WithDeniedVendors({"zeta"}));
    ASSERT_TRUE(CallRms(DType::kF32).ok());
    EXPECT_EQ(F("vendor.acme").calls, 1);
  }
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  // A new registration invalidates cached chains too.
  Add("vendor.newcomer", BackendImplKind::VENDOR, "new", 1000);
  ASSERT_TRUE(CallRms(DType::kF32).ok());
  EXPECT_EQ(F("vendor.newcomer").calls, 1);
  // Clearing the registry leaves nothing to run.
  registry_.Clear();
  Status s = CallRms(DType::kF32);
  EXPECT_EQ(s.code(), TEFL_UNSUPPORTED);
  EXPECT_NE(s.message().find("no implementation is registered"), std::string::npos) << s.message();
}

TEST_F(ResolutionTest, AllCandidatesFailing) {
  for (const char* id : {"vendor.zeta", "vendor.acme", "vendor.picky"}) F(id).runtime_code = TEFL_UNSUPPORTED;
  SetGlobalPolicy(SelectionPolicy::FromEnv(nullptr, testing::EnvFrom({{"TE_FL_PER_OP", "rmsnorm_fwd=vendor"}})));
  Status s = CallRms(DType::kF32);
  EXPECT_EQ(s.code(), TEFL_UNSUPPORTED);
  EXPECT_NE(s.message().find("no implementation accepted the call; 'vendor.zeta' declined"), std::string::npos)
      << s.message();
}

// ---- Prepared calls: the same resolution, fallback and demotion as Call ------

// A prepared fp32 rmsnorm_fwd [2, 8] call and the buffers it runs on.
struct PreparedRms {
  Tensor x{DType::kF32, {2, 8}}, g{DType::kF32, {8}}, z{DType::kF32, {2, 8}}, rs{DType::kF32, {2}};
  PreparedCall call;
  Status Prepare(OpManager& m) {
    x.Uniform("x");
    g.Uniform("g");
    const DLTensor* in[] = {x.ptr(), g.ptr()};
    DLTensor* out[] = {z.ptr(), rs.ptr()};
    return m.Prepare(TEFL_OP_RMSNORM_FWD, in, out, nullptr, &call);
  }
  Status Run() {
    void* in[] = {x.bytes(), g.bytes()};
    void* out[] = {z.bytes(), rs.bytes()};
    return call.Run(in, out);
  }
};

TEST_F(ResolutionTest, PreparedCallFollowsThePolicyInForceAtEachRun) {
  Flush();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  PreparedRms p;
  ASSERT_TRUE(p.Prepare(manager_).ok());
  ASSERT_TRUE(p.Run().ok());
  ASSERT_TRUE(p.Run().ok());
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  SetGlobalPolicy(SelectionPolicy().WithPrefer("reference"));
  ASSERT_TRUE(p.Run().ok());
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "reference.cpp");
  {  // a thread's scoped policy applies to the runs inside it only
    PolicyContext scoped(SelectionPolicy().WithPrefer("vendor").WithDeniedVendors({"zeta"}));
    ASSERT_TRUE(p.Run().ok());
    EXPECT_EQ(F("vendor.acme").calls, 1);
  }
  ASSERT_TRUE(p.Run().ok());
  EXPECT_EQ(manager_.GetSelectedImplId("rmsnorm_fwd"), "reference.cpp");
}

TEST_F(ResolutionTest, PreparedCallSeesImplementationsRegisteredAfterPrepare) {
  Flush();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  PreparedRms p;
  ASSERT_TRUE(p.Prepare(manager_).ok());
  ASSERT_TRUE(p.Run().ok());
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  Add("vendor.newest", BackendImplKind::VENDOR, "newest", 900);
  Flush();
  ASSERT_TRUE(p.Run().ok());
  EXPECT_EQ(F("vendor.newest").calls, 1);
  EXPECT_EQ(F("vendor.zeta").calls, 1);
}

TEST_F(ResolutionTest, PreparedCallFallsBackAndDemotesLikeCall) {
  F("vendor.zeta").runtime_code = TEFL_UNSUPPORTED;
  F("vendor.acme").runtime_code = TEFL_RUNTIME_ERROR;
  Flush();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor"));
  testing::LogCapture logs(TEFL_LOG_INFO);
  PreparedRms p;
  ASSERT_TRUE(p.Prepare(manager_).ok());
  ASSERT_TRUE(p.Run().ok());  // zeta declines, acme fails (demoted), picky serves
  EXPECT_EQ(F("vendor.zeta").calls, 1);
  EXPECT_EQ(F("vendor.acme").calls, 1);
  EXPECT_EQ(F("vendor.picky").calls, 1);
  ASSERT_TRUE(p.Run().ok());  // zeta still tried first (declining is not failing); acme now last
  EXPECT_EQ(F("vendor.zeta").calls, 2);
  EXPECT_EQ(F("vendor.acme").calls, 1);
  EXPECT_EQ(F("vendor.picky").calls, 2);
  EXPECT_EQ(logs.Count("WARNING] Op 'rmsnorm_fwd' implementation 'vendor.acme'"), 1);
}

TEST_F(ResolutionTest, PreparedCallInStrictModeFailsNamingTheFirstCandidate) {
  F("vendor.zeta").runtime_code = TEFL_UNSUPPORTED;
  Flush();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("vendor").WithStrict(true));
  PreparedRms p;
  ASSERT_TRUE(p.Prepare(manager_).ok());
  p.z.Fill(-7.0);
  Status s = p.Run();
  EXPECT_EQ(s.code(), TEFL_FAILED_PRECONDITION) << s.ToString();
  EXPECT_NE(s.message().find("strict mode"), std::string::npos) << s.message();
  EXPECT_EQ(F("vendor.acme").calls, 0);
  EXPECT_EQ(p.z.at(0), -7.0);
}

}  // namespace
}  // namespace tefl
