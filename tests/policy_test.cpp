// Policy parsing: every TE_FL_* variable, well-formed, mixed-case and
// malformed values (malformed ones warn and are ignored, never fatal).
#include <gtest/gtest.h>

#include <thread>

#include "core/catalogue.h"
#include "core/logging.h"
#include "test_support.h"

namespace tefl {
namespace {

using testing::EnvFrom;
using Vars = std::vector<std::pair<std::string, std::string>>;

struct Case {
  const char* name;
  Vars env;
  std::string prefer;
  bool strict;
  std::set<std::string> deny;
  std::optional<std::set<std::string>> allow;
  std::map<std::string, std::string> per_op;     // op -> "tok|tok"
  std::vector<std::string> warnings_containing;  // one entry per expected warning
};

std::string Join(const std::vector<PolicyToken>& tokens) {
  std::string s;
  for (size_t i = 0; i < tokens.size(); ++i) s += (i ? "|" : "") + tokens[i].ToString();
  return s;
}

const Case kCases[] = {
    {"defaults", {}, "flagos", false, {}, std::nullopt, {}, {}},
    {"prefer_vendor", {{"TE_FL_PREFER", "vendor"}}, "vendor", false, {}, std::nullopt, {}, {}},
    {"prefer_mixed_case_spaces", {{"TE_FL_PREFER", "  RefErence "}}, "reference", false, {}, std::nullopt, {}, {}},
    {"prefer_bad", {{"TE_FL_PREFER", "cuda"}}, "flagos", false, {}, std::nullopt, {}, {"TE_FL_PREFER='cuda'"}},
    {"prefer_empty_is_unset", {{"TE_FL_PREFER", ""}}, "flagos", false, {}, std::nullopt, {}, {}},
    {"legacy_prefer_vendor", {{"TE_FL_PREFER_VENDOR", "1"}}, "vendor", false, {}, std::nullopt, {}, {}},
    {"legacy_prefer_vendor_0", {{"TE_FL_PREFER_VENDOR", "0"}}, "flagos", false, {}, std::nullopt, {}, {}},
    {"legacy_ignored_when_prefer_set",
     {{"TE_FL_PREFER", "reference"}, {"TE_FL_PREFER_VENDOR", "1"}},
     "reference",
     false,
     {},
     std::nullopt,
     {},
     {}},
    {"legacy_used_when_prefer_malformed",
     {{"TE_FL_PREFER", "gpu"}, {"TE_FL_PREFER_VENDOR", "1"}},
     "vendor",
     false,
     {},
     std::nullopt,
     {},
     {"TE_FL_PREFER='gpu'"}},
    {"legacy_bad", {{"TE_FL_PREFER_VENDOR", "maybe"}}, "flagos", false, {}, std::nullopt, {}, {"TE_FL_PREFER_VENDOR"}},
    // TE_FL_SKIP_CUDA changes nothing yet (no CUDA backend), but is read like the other switches.
    {"skip_cuda_1", {{"TE_FL_SKIP_CUDA", "1"}}, "flagos", false, {}, std::nullopt, {}, {}},
    {"skip_cuda_bad", {{"TE_FL_SKIP_CUDA", "banana"}}, "flagos", false, {}, std::nullopt, {}, {"TE_FL_SKIP_CUDA='banana'"}},
    // TE-FL's documented meaning (its code inverted it): 1 = strict, default 0.
    {"strict_1", {{"TE_FL_STRICT", "1"}}, "flagos", true, {}, std::nullopt, {}, {}},
    {"strict_true_mixed_case", {{"TE_FL_STRICT", "TRUE"}}, "flagos", true, {}, std::nullopt, {}, {}},
    {"strict_0", {{"TE_FL_STRICT", "0"}}, "flagos", false, {}, std::nullopt, {}, {}},
    {"strict_bad", {{"TE_FL_STRICT", "2"}}, "flagos", false, {}, std::nullopt, {}, {"TE_FL_STRICT='2'"}},
    {"deny_list_trimmed_lowercased",
     {{"TE_FL_DENY_VENDORS", " Vendor_A, vendor_b ,,"}},
     "flagos",
     false,
     {"vendor_a", "vendor_b"},
     std::nullopt,
     {},
     {}},
    {"allow_list",
     {{"TE_FL_ALLOW_VENDORS", "NVIDIA,acme"}},
     "flagos",
     false,
     {},
     std::set<std::string>{"acme", "nvidia"},
     {},
     {}},
    {"allow_names_nothing",
     {{"TE_FL_ALLOW_VENDORS", " , "}},
     "flagos",
     false,
     {},
     std::nullopt,
     {},
     {"TE_FL_ALLOW_VENDORS"}},
    {"deny_names_nothing",
     {{"TE_FL_DENY_VENDORS", " , "}},
     "flagos",
     false,
     {},
     std::nullopt,
     {},
     {"TE_FL_DENY_VENDORS"}},
    {"per_op_readme_example",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor:acme|flagos"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "vendor:acme|flagos"}},
     {}},
    {"per_op_two_ops_mixed_case",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=Vendor:ACME|FLAGOS; layernorm_bwd = reference"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "vendor:acme|flagos"}, {"layernorm_bwd", "reference"}},
     {}},
    {"per_op_impl_token",
     {{"TE_FL_PER_OP", "rmsnorm_bwd=impl:vendor.X|reference"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_bwd", "impl:vendor.X|reference"}},
     {}},
    {"per_op_bad_token_dropped",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor|cuda|reference"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "vendor|reference"}},
     {"token 'cuda'"}},
    {"per_op_unknown_op",
     {{"TE_FL_PER_OP", "nope_op=vendor;rmsnorm_fwd=reference"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "reference"}},
     {"unknown op 'nope_op'"}},
    {"per_op_missing_equals",
     {{"TE_FL_PER_OP", "rmsnorm_fwd:vendor"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {},
     {"expected op=token"}},
    {"per_op_no_valid_token",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=gpu|"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {},
     {"token 'gpu'", "no valid token"}},
    {"per_op_empty_vendor_name",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor:|flagos"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "flagos"}},
     {"token 'vendor:'"}},
    {"per_op_duplicate_last_wins",
     {{"TE_FL_PER_OP", "rmsnorm_fwd=vendor;rmsnorm_fwd=reference"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "reference"}},
     {"more than once"}},
    {"per_op_trailing_semicolons",
     {{"TE_FL_PER_OP", ";;rmsnorm_fwd=flagos;;"}},
     "flagos",
     false,
     {},
     std::nullopt,
     {{"rmsnorm_fwd", "flagos"}},
     {}},
    {"everything",
     {{"TE_FL_PREFER", "VENDOR"},
      {"TE_FL_STRICT", "yes"},
      {"TE_FL_DENY_VENDORS", "bad"},
      {"TE_FL_ALLOW_VENDORS", "good,bad"},
      {"TE_FL_PER_OP", "layernorm_fwd=reference|flagos"}},
     "vendor",
     true,
     {"bad"},
     std::set<std::string>{"bad", "good"},
     {{"layernorm_fwd", "reference|flagos"}},
     {}},
};

class PolicyEnvTest : public ::testing::TestWithParam<Case> {};

TEST_P(PolicyEnvTest, Parses) {
  const Case& c = GetParam();
  std::vector<std::string> warnings;
  SelectionPolicy p = SelectionPolicy::FromEnv(&warnings, EnvFrom(c.env));
  EXPECT_EQ(p.prefer(), c.prefer);
  EXPECT_EQ(p.strict(), c.strict);
  EXPECT_EQ(p.deny_vendors(), c.deny);
  EXPECT_EQ(p.allow_vendors(), c.allow);
  std::map<std::string, std::string> per_op;
  for (const auto& [op, tokens] : p.per_op_order()) per_op[op] = Join(tokens);
  EXPECT_EQ(per_op, c.per_op);
  ASSERT_EQ(warnings.size(), c.warnings_containing.size()) << ::testing::PrintToString(warnings);
  for (size_t i = 0; i < warnings.size(); ++i) {
    EXPECT_NE(warnings[i].find(c.warnings_containing[i]), std::string::npos) << warnings[i];
  }
}

INSTANTIATE_TEST_SUITE_P(AllVariables, PolicyEnvTest, ::testing::ValuesIn(kCases),
                         [](const auto& param_info) { return std::string(param_info.param.name); });

TEST(Policy, RopeAliasesResolveToCanonicalOps) {
  std::vector<std::string> warnings;
  SelectionPolicy p = SelectionPolicy::FromEnv(&warnings, EnvFrom({{"TE_FL_PER_OP", "rope_fwd=flagos|reference"}}));
  EXPECT_TRUE(warnings.empty());
  EXPECT_EQ(p.per_op_order().count("fused_rope_forward"), 1u);
  EXPECT_EQ(p.per_op_order().count("rope_fwd"), 0u);
  EXPECT_EQ(Join(p.OrderFor("rope_fwd")), "flagos|reference");
}

TEST(Policy, DefaultOrders) {
  auto order = [](const char* prefer) {
    SelectionPolicy p = SelectionPolicy().WithPrefer(prefer);
    return Join(p.DefaultOrder());
  };
  EXPECT_EQ(order("flagos"), "flagos|vendor|reference");
  EXPECT_EQ(order("vendor"), "vendor|flagos|reference");
  EXPECT_EQ(order("reference"), "reference|flagos|vendor");
}

TEST(Policy, VendorFiltersAreCaseInsensitiveAndDenyBeatsAllow) {
  SelectionPolicy p = SelectionPolicy().WithAllowedVendors({"Acme", "Other"}).WithDeniedVendors({"OTHER"});
  EXPECT_TRUE(p.IsVendorAllowed("acme"));
  EXPECT_TRUE(p.IsVendorAllowed("ACME"));
  EXPECT_FALSE(p.IsVendorAllowed("other"));  // denied although allowed
  EXPECT_FALSE(p.IsVendorAllowed("third"));  // not in the allow list
  EXPECT_TRUE(SelectionPolicy().IsVendorAllowed("anyone"));
}

TEST(Policy, MakeValidates) {
  SelectionPolicy p;
  Status s = SelectionPolicy::Make("gpu", false, {}, {}, std::nullopt, &p);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("invalid prefer 'gpu'"), std::string::npos);
  s = SelectionPolicy::Make("flagos", false, {{"rmsnorm_fwd", {"bogus"}}}, {}, std::nullopt, &p);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("invalid token 'bogus'"), std::string::npos);
  s = SelectionPolicy::Make("flagos", false, {{"not_an_op", {"vendor"}}}, {}, std::nullopt, &p);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  s = SelectionPolicy::Make("flagos", false, {{"rmsnrom_fwd", {"vendor"}}}, {}, std::nullopt, &p);
  EXPECT_NE(s.message().find("unknown op 'rmsnrom_fwd' in per_op_order; did you mean 'rmsnorm_fwd'?"),
            std::string::npos)
      << s.message();
  s = SelectionPolicy::Make("flagos", false, {}, {}, std::nullopt, nullptr);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "SelectionPolicy::Make: out is NULL");
  ASSERT_TRUE(SelectionPolicy::Make("Vendor", true, {{"rmsnorm_fwd", {"impl:reference.cpp"}}}, {"X"},
                                    std::set<std::string>{"Y"}, &p)
                  .ok());
  EXPECT_EQ(p.prefer(), "vendor");
  EXPECT_EQ(Join(p.OrderFor("rmsnorm_fwd")), "impl:reference.cpp");
  EXPECT_EQ(Join(p.OrderFor("layernorm_fwd")), "vendor|flagos|reference");
}

TEST(Policy, FingerprintIdentifiesContent) {
  SelectionPolicy a = SelectionPolicy().WithPrefer("vendor").WithDeniedVendors({"B", "a"});
  SelectionPolicy b = SelectionPolicy().WithDeniedVendors({"a", "b"}).WithPrefer("VENDOR");
  EXPECT_EQ(a.Fingerprint(), b.Fingerprint());
  EXPECT_NE(a.Fingerprint(), a.WithStrict(true).Fingerprint());
  EXPECT_NE(a.Fingerprint(), a.WithAllowedVendors({}).Fingerprint());  // allow nothing != allow all
}

// Names holding the fingerprint's separators cannot make two policies equal.
TEST(Policy, FingerprintsOfSeparatorLadenNamesDiffer) {
  SelectionPolicy one, two;
  ASSERT_TRUE(
      SelectionPolicy::Make("flagos", false, {{"rmsnorm_fwd", {"impl:a|impl:b"}}}, {}, std::nullopt, &one).ok());
  ASSERT_TRUE(
      SelectionPolicy::Make("flagos", false, {{"rmsnorm_fwd", {"impl:a", "impl:b"}}}, {}, std::nullopt, &two).ok());
  EXPECT_NE(one.Fingerprint(), two.Fingerprint());
  EXPECT_NE(SelectionPolicy().WithDeniedVendors({"a,b"}).Fingerprint(),
            SelectionPolicy().WithDeniedVendors({"a", "b"}).Fingerprint());
}

TEST(Policy, SourcesSayWhichVariable) {
  SelectionPolicy p = SelectionPolicy::FromEnv(nullptr, EnvFrom({{"TE_FL_PREFER_VENDOR", "1"}, {"TE_FL_STRICT", "1"}}));
  EXPECT_EQ(p.sources().at("prefer"), "TE_FL_PREFER_VENDOR");
  EXPECT_EQ(p.sources().at("strict"), "TE_FL_STRICT");
  EXPECT_EQ(p.sources().at("per_op"), "default");
}

TEST(Policy, TokensMatchLikeTeFl) {
  OpImpl v;
  v.impl_id = "vendor.acme";
  v.kind = BackendImplKind::VENDOR;
  v.vendor = "Acme";
  OpImpl d;
  d.impl_id = "default.portable";
  auto tok = [](const char* t) { return *PolicyToken::Parse(t); };
  EXPECT_TRUE(MatchToken(v, tok("vendor")));
  EXPECT_TRUE(MatchToken(v, tok("vendor:ACME")));
  EXPECT_FALSE(MatchToken(v, tok("vendor:other")));
  EXPECT_FALSE(MatchToken(v, tok("flagos")));
  EXPECT_TRUE(MatchToken(d, tok("flagos")));
  EXPECT_TRUE(MatchToken(d, tok("impl:default.portable")));
  EXPECT_FALSE(MatchToken(d, tok("impl:Default.Portable")));  // ids are exact
  EXPECT_FALSE(PolicyToken::Parse("impl:").has_value());
  EXPECT_FALSE(PolicyToken::Parse("").has_value());
}

TEST(Policy, GlobalAndScopedOverridesWithEpoch) {
  const uint64_t e0 = GetPolicyEpoch();
  SetGlobalPolicy(SelectionPolicy().WithPrefer("reference"));
  EXPECT_GT(GetPolicyEpoch(), e0);
  EXPECT_EQ(GetPolicy().prefer(), "reference");
  {
    PolicyContext outer(GetPolicy().WithPrefer("vendor"));
    EXPECT_EQ(GetPolicy().prefer(), "vendor");
    {
      PolicyContext inner(GetPolicy().WithStrict(true));
      EXPECT_EQ(GetPolicy().prefer(), "vendor");
      EXPECT_TRUE(GetPolicy().strict());
      // Another thread does not see this thread's override.
      std::string other;
      std::thread([&] { other = GetPolicy().prefer(); }).join();
      EXPECT_EQ(other, "reference");
    }
    EXPECT_FALSE(GetPolicy().strict());
  }
  EXPECT_EQ(GetPolicy().prefer(), "reference");
  const uint64_t e1 = GetPolicyEpoch();
  EXPECT_EQ(BumpPolicyEpoch(), e1 + 1);
  ResetGlobalPolicy();
  EXPECT_EQ(GetPolicy().prefer(), "flagos");
}

TEST(Logging, LevelAndVerboseParsing) {
  EXPECT_EQ(ParseLogLevel("debug"), TEFL_LOG_DEBUG);
  EXPECT_EQ(ParseLogLevel(" INFO "), TEFL_LOG_INFO);
  EXPECT_EQ(ParseLogLevel("Warning"), TEFL_LOG_WARNING);
  EXPECT_EQ(ParseLogLevel("WARN"), TEFL_LOG_WARNING);
  EXPECT_EQ(ParseLogLevel("error"), TEFL_LOG_ERROR);
  EXPECT_EQ(ParseLogLevel("loud"), -1);
  EXPECT_EQ(ParseVerbose("dispatch"), kVerboseDispatch);
  EXPECT_EQ(ParseVerbose("EXEC"), kVerboseDispatch | kVerboseExec);
  EXPECT_EQ(ParseVerbose("0"), 0);
  EXPECT_EQ(ParseVerbose("none"), 0);
  EXPECT_EQ(ParseVerbose("everything"), -1);
}

}  // namespace
}  // namespace tefl
