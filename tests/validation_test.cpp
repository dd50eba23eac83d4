// Schema validation of the normalization ops: a call that breaks one rule of
// the catalogue gets TEFL_INVALID_ARGUMENT with a message naming the op, the
// argument and what was expected, no kernel runs, and no tensor (output or
// input) changes by a single byte.
//
// Every test starts from a valid call (checked to succeed in
// BaselineCallsSucceed), breaks exactly one thing and calls through a fresh
// OpManager. The manager's registry holds a "spy" implementation of every op
// that counts its calls and declines (so valid calls fall back to the
// built-ins): a rejected call must leave the spy count at 0.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <deque>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/catalogue.h"
#include "core/validate.h"
#include "test_support.h"

namespace {

using tefl::DType;
using tefl::OpManager;
using tefl::Status;
using tefl::testing::Tensor;

// ---- The five ops, as the tests see them ---------------------------------
enum class Role { kLikeX, kCols, kStats };  // [N, H], [H], [N] f32

struct ArgSpec {
  const char* name;
  Role role;
};

struct OpSpec {
  const char* op;
  int32_t id;
  bool fwd;
  std::vector<ArgSpec> in, out;
};

const std::vector<OpSpec>& Ops() {
  static const std::vector<OpSpec> ops = {
      {"layernorm_fwd",
       TEFL_OP_LAYERNORM_FWD,
       true,
       {{"x", Role::kLikeX}, {"gamma", Role::kCols}, {"beta", Role::kCols}},
       {{"z", Role::kLikeX}, {"mu", Role::kStats}, {"rsigma", Role::kStats}}},
      {"rmsnorm_fwd",
       TEFL_OP_RMSNORM_FWD,
       true,
       {{"x", Role::kLikeX}, {"gamma", Role::kCols}},
       {{"z", Role::kLikeX}, {"rsigma", Role::kStats}}},
      {"layernorm_bwd",
       TEFL_OP_LAYERNORM_BWD,
       false,
       {{"dz", Role::kLikeX},
        {"x", Role::kLikeX},
        {"mu", Role::kStats},
        {"rsigma", Role::kStats},
        {"gamma", Role::kCols}},
       {{"dx", Role::kLikeX}, {"dgamma", Role::kCols}, {"dbeta", Role::kCols}}},
      {"rmsnorm_bwd",
       TEFL_OP_RMSNORM_BWD,
       false,
       {{"dz", Role::kLikeX}, {"x", Role::kLikeX}, {"rsigma", Role::kStats}, {"gamma", Role::kCols}},
       {{"dx", Role::kLikeX}, {"dgamma", Role::kCols}}},
      {"rmsnorm_bwd_add",
       TEFL_OP_RMSNORM_BWD_ADD,
       false,
       {{"dz", Role::kLikeX},
        {"x", Role::kLikeX},
        {"add", Role::kLikeX},
        {"rsigma", Role::kStats},
        {"gamma", Role::kCols}},
       {{"dx", Role::kLikeX}, {"dgamma", Role::kCols}}},
  };
  return ops;
}

constexpr double kSentinel = -1234.5;  // outputs are filled with this first

// A valid call of one op (N rows of H, x dtype `dt`, stats fp32) that a test
// then breaks. Tensors live behind unique_ptr so the DLTensor pointers in
// `in` / `out` stay valid.
class OpCall {
 public:
  explicit OpCall(const OpSpec& spec, int64_t n = 4, int64_t h = 8, DType dt = DType::kF32)
      : spec_(spec), n_(n), h_(h) {
    fwd_attrs = {TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 1e-5f, 0, 0};
    bwd_attrs = {TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, 0, 0};
    auto add = [&](const ArgSpec& a, bool is_input) {
      const DType t = a.role == Role::kStats ? DType::kF32 : dt;
      std::vector<int64_t> shape = a.role == Role::kLikeX  ? std::vector<int64_t>{n, h}
                                   : a.role == Role::kCols ? std::vector<int64_t>{h}
                                                           : std::vector<int64_t>{n};
      auto tensor = std::make_unique<Tensor>(t, shape);
      if (!is_input) {
        tensor->Fill(kSentinel);
      } else if (std::string(a.name) == "rsigma") {
        tensor->Uniform(a.name, 0.5, 2.0);
      } else {
        tensor->Uniform(a.name);
      }
      names_.push_back(a.name);
      tensors_.push_back(std::move(tensor));
    };
    for (const ArgSpec& a : spec.in) add(a, true);
    for (const ArgSpec& a : spec.out) add(a, false);
    RebuildPointers();
  }

  const OpSpec& spec() const { return spec_; }
  int64_t n() const { return n_; }
  int64_t h() const { return h_; }
  size_t num_args() const { return tensors_.size(); }
  const std::string& name(size_t i) const { return names_[i]; }
  bool is_output(size_t i) const { return i >= spec_.in.size(); }

  size_t Index(const std::string& name) const {
    for (size_t i = 0; i < names_.size(); ++i)
      if (names_[i] == name) return i;
    ADD_FAILURE() << spec_.op << " has no argument " << name;
    return 0;
  }
  Tensor& T(const std::string& name) { return *tensors_[Index(name)]; }
  Tensor& T(size_t i) { return *tensors_[i]; }
  DLTensor& D(const std::string& name) { return T(name).dl(); }
  DLTensor& D(size_t i) { return T(i).dl(); }

  // Replaces argument `name` by a new tensor (e.g. of another dtype).
  Tensor& Replace(const std::string& name, DType t, std::vector<int64_t> shape) {
    const size_t i = Index(name);
    tensors_[i] = std::make_unique<Tensor>(t, std::move(shape));
    if (is_output(i)) {
      tensors_[i]->Fill(kSentinel);
    } else {
      tensors_[i]->Uniform(name);
    }
    RebuildPointers();
    return *tensors_[i];
  }
  // Gives the DLTensor of argument i another shape (its storage is unchanged).
  void SetShape(size_t i, std::vector<int64_t> shape) {
    shapes_.push_back(std::move(shape));
    D(i).shape = shapes_.back().data();
    D(i).ndim = int(shapes_.back().size());
  }
  void SetShape(const std::string& name, std::vector<int64_t> shape) { SetShape(Index(name), std::move(shape)); }
  void SetStrides(const std::string& name, std::vector<int64_t> strides) {
    shapes_.push_back(std::move(strides));
    D(name).strides = shapes_.back().data();
  }
  void SetStrides(size_t i, std::vector<int64_t> strides) {
    shapes_.push_back(std::move(strides));
    D(i).strides = shapes_.back().data();
  }
  // The DLTensor passed for argument i (NULL allowed).
  void SetArg(size_t i, DLTensor* t) {
    if (is_output(i)) {
      out[i - spec_.in.size()] = t;
    } else {
      in[i] = t;
    }
  }
  // A DLTensor the call uses instead of argument `name`'s own (a view into
  // another tensor's storage); the argument's own tensor stays untouched.
  DLTensor& View(const std::string& name) {
    views_.push_back(D(name));
    SetArg(Index(name), &views_.back());
    return views_.back();
  }

  const void* attrs() const {
    return spec_.fwd ? static_cast<const void*>(&fwd_attrs) : static_cast<const void*>(&bwd_attrs);
  }
  Status Call(OpManager& mgr) const { return mgr.Call(spec_.op, in, out, attrs()); }

  // Snapshot of every tensor's storage (for "nothing changed" checks).
  std::vector<Tensor> Snapshot() const {
    std::vector<Tensor> s;
    for (const auto& t : tensors_) s.push_back(*t);
    return s;
  }

  std::vector<const DLTensor*> in;
  std::vector<DLTensor*> out;
  tefl_norm_fwd_attrs fwd_attrs;
  tefl_norm_bwd_attrs bwd_attrs;

 private:
  void RebuildPointers() {
    in.clear();
    out.clear();
    for (size_t i = 0; i < tensors_.size(); ++i) {
      if (is_output(i)) {
        out.push_back(tensors_[i]->ptr());
      } else {
        in.push_back(tensors_[i]->ptr());
      }
    }
  }

  const OpSpec& spec_;
  int64_t n_, h_;
  std::vector<std::string> names_;
  std::vector<std::unique_ptr<Tensor>> tensors_;
  std::deque<std::vector<int64_t>> shapes_;
  std::deque<DLTensor> views_;
};

class Validation : public ::testing::Test {
 protected:
  void SetUp() override {
    // A spy per op that counts calls and declines: it runs first (flagos,
    // priority 1000) whenever a call gets past validation.
    for (const OpSpec& op : Ops()) {
      Status s = mgr_.registry().RegisterImpl(tefl::OpImpl::FromFunction(
          op.op, "default.spy", tefl::BackendImplKind::DEFAULT, "", 1000, [this](const tefl_call_frame&) {
            spy_calls_.fetch_add(1);
            return Status(TEFL_UNSUPPORTED, "spy declines");
          }));
      ASSERT_TRUE(s.ok()) << s.ToString();
    }
  }

  // Calls `c`, expects `code` with every needle in the message (the op name
  // always), no kernel call, and every tensor byte-for-byte unchanged with
  // guards intact.
  void ExpectRejected(OpCall& c, const std::vector<std::string>& needles, int32_t code = TEFL_INVALID_ARGUMENT) {
    const std::vector<Tensor> before = c.Snapshot();
    const int spy_before = spy_calls_.load();
    log_.Clear();
    const Status s = c.Call(mgr_);
    EXPECT_EQ(s.code(), code) << s.ToString();
    // A rejected call is the caller's error, returned, not logged (no
    // warning, no demotion of any implementation).
    EXPECT_TRUE(log_.Lines().empty()) << "a rejected call logged: " << log_.Lines().front();
    EXPECT_NE(s.message().find(std::string(c.spec().op) + ": "), std::string::npos)
        << "message does not start with the op name: " << s.message();
    for (const std::string& needle : needles)
      EXPECT_NE(s.message().find(needle), std::string::npos) << "message lacks \"" << needle << "\": " << s.message();
    EXPECT_EQ(spy_calls_.load(), spy_before) << "a kernel ran for a rejected call: " << s.ToString();
    for (size_t i = 0; i < before.size(); ++i) {
      EXPECT_TRUE(c.T(i).SameBytes(before[i])) << "'" << c.name(i) << "' changed";
      EXPECT_TRUE(c.T(i).GuardsIntact()) << "'" << c.name(i) << "' guard bytes overwritten";
    }
  }

  // Expects success through the fresh manager (spy declined, a built-in ran).
  void ExpectAccepted(const OpCall& c) {
    const int spy_before = spy_calls_.load();
    const Status s = c.Call(mgr_);
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_EQ(spy_calls_.load(), spy_before + 1);
  }

  // Captures WARNING and above (and keeps the output of valid calls quiet).
  tefl::testing::LogCapture log_{TEFL_LOG_WARNING};
  OpManager mgr_;
  std::atomic<int> spy_calls_{0};
};

// ---- The starting points -------------------------------------------------
TEST_F(Validation, TestTableMatchesCatalogue) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    const tefl::OpSchema* schema = tefl::FindOp(spec.op);
    ASSERT_NE(schema, nullptr);
    EXPECT_EQ(schema->id, spec.id);
    ASSERT_EQ(schema->inputs.size(), spec.in.size());
    ASSERT_EQ(schema->outputs.size(), spec.out.size());
    for (size_t i = 0; i < spec.in.size(); ++i) EXPECT_STREQ(schema->inputs[i].name, spec.in[i].name);
    for (size_t i = 0; i < spec.out.size(); ++i) EXPECT_STREQ(schema->outputs[i].name, spec.out[i].name);
    EXPECT_EQ(tefl_op_id(spec.op), spec.id);
  }
}

TEST_F(Validation, BaselineCallsSucceed) {
  for (const OpSpec& spec : Ops()) {
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16}) {
      SCOPED_TRACE(fmt::format("{} {}", spec.op, tefl::DTypeName(dt)));
      OpCall c(spec, 4, 8, dt);
      ExpectAccepted(c);
      // Every output was written (it no longer holds the sentinel).
      for (size_t i = spec.in.size(); i < c.num_args(); ++i) {
        EXPECT_TRUE(c.T(i).GuardsIntact()) << c.name(i);
        Tensor sentinel(c.T(i).dtype(), c.T(i).shape());
        sentinel.Fill(kSentinel);
        EXPECT_FALSE(c.T(i).SameBytes(sentinel)) << c.name(i) << " not written";
      }
    }
  }
}

// ---- Arity -----------------------------------------------------------------
TEST_F(Validation, WrongArity) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    const size_t nin = spec.in.size(), nout = spec.out.size();
    {
      OpCall c(spec);
      c.in.pop_back();
      ExpectRejected(c, {fmt::format("expected {} inputs and {} outputs, got {} and {}", nin, nout, nin - 1, nout)});
    }
    {
      OpCall c(spec);
      Tensor extra(DType::kF32, {4});
      c.in.push_back(extra.ptr());
      ExpectRejected(c, {fmt::format("expected {} inputs and {} outputs, got {} and {}", nin, nout, nin + 1, nout)});
    }
    {
      OpCall c(spec);
      c.out.pop_back();
      ExpectRejected(c, {fmt::format("expected {} inputs and {} outputs, got {} and {}", nin, nout, nin, nout - 1)});
    }
    {
      OpCall c(spec);
      Tensor extra(DType::kF32, {4});
      extra.Fill(kSentinel);
      c.out.push_back(extra.ptr());
      ExpectRejected(c, {fmt::format("expected {} inputs and {} outputs, got {} and {}", nin, nout, nin, nout + 1)});
      Tensor fresh(DType::kF32, {4});
      fresh.Fill(kSentinel);
      EXPECT_TRUE(extra.SameBytes(fresh));
    }
    {
      OpCall c(spec);
      c.in.clear();
      c.out.clear();
      ExpectRejected(c, {fmt::format("expected {} inputs and {} outputs, got 0 and 0", nin, nout)});
    }
  }
}

// ---- Presence ------------------------------------------------------------------
TEST_F(Validation, MissingRequiredTensor) {
  for (const OpSpec& spec : Ops()) {
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      OpCall c(spec);
      SCOPED_TRACE(fmt::format("{} without '{}'", spec.op, c.name(i)));
      c.SetArg(i, nullptr);
      ExpectRejected(c, {fmt::format("argument '{}' ({} ", c.name(i), c.is_output(i) ? "output" : "input"),
                         "is required, got NULL"});
    }
  }
}

// ---- DTypes ---------------------------------------------------------------------
TEST_F(Validation, WrongDType) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);
      c.Replace("x", DType::kI32, {c.n(), c.h()});
      ExpectRejected(c, {"'x'", "expected dtype in {float32, float16, bfloat16}", "got int32"});
    }
    {
      OpCall c(spec);
      c.Replace("gamma", DType::kF64, {c.h()});
      ExpectRejected(c, {"'gamma'", "expected dtype in {float32, float16, bfloat16}", "got float64"});
    }
    {
      OpCall c(spec);
      const size_t first_out = spec.in.size();
      c.Replace(c.name(first_out), DType::kI32, {c.n(), c.h()});
      ExpectRejected(c, {fmt::format("'{}'", c.name(first_out)), "got int32"});
    }
    // Statistics (mu, rsigma; inputs of the backward ops, outputs of the
    // forward ones) are fp32 only.
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
      if (a.role != Role::kStats) continue;
      for (DType bad : {DType::kF16, DType::kBF16}) {
        OpCall c(spec);
        SCOPED_TRACE(fmt::format("{} {}", a.name, tefl::DTypeName(bad)));
        c.Replace(a.name, bad, {c.n()});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected dtype in {float32}",
                           fmt::format("got {}", tefl::DTypeName(bad))});
      }
    }
  }
}

TEST_F(Validation, VectorLanesRejected) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);
      c.D("x").dtype.lanes = 2;
      ExpectRejected(c, {"'x'", "expected dtype in {float32, float16, bfloat16}", "lanes=2"});
    }
    {
      OpCall c(spec);
      c.D("gamma").dtype.lanes = 4;
      ExpectRejected(c, {"'gamma'", "lanes=4"});
    }
    {
      OpCall c(spec);
      c.D("rsigma").dtype.lanes = 2;
      ExpectRejected(c, {"'rsigma'", "expected dtype in {float32}", "lanes=2"});
    }
  }
}

// ---- Devices -------------------------------------------------------------------
TEST_F(Validation, DeviceMix) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    const std::string first = fmt::format("'{}' (input 0)", spec.in[0].name);
    {
      OpCall c(spec);
      c.D("gamma").device = {kDLCUDA, 0};
      ExpectRejected(c, {"'gamma'", "expected device cpu:0", first, "got cuda:0"});
    }
    {
      OpCall c(spec);
      const size_t o = spec.in.size();
      c.D(o).device = {kDLCUDA, 0};
      ExpectRejected(c, {fmt::format("'{}' (output 0)", c.name(o)), "expected device cpu:0", "got cuda:0"});
    }
    {
      OpCall c(spec);
      c.D("rsigma").device = {kDLCPU, 1};
      ExpectRejected(c, {"'rsigma'", "expected device cpu:0", "got cpu:1"});
    }
  }
}

// ---- Shapes ------------------------------------------------------------------------
TEST_F(Validation, ColumnVectorOfWrongLength) {
  for (const OpSpec& spec : Ops()) {
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
      if (a.role != Role::kCols) continue;
      SCOPED_TRACE(fmt::format("{} {}", spec.op, a.name));
      {
        OpCall c(spec);  // H = 8
        c.SetShape(i, {c.h() - 1});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [8] (H = last dim of 'x')", "got [7]"});
      }
      {
        OpCall c(spec);
        c.SetShape(i, {1, c.h()});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [8]", "got [1, 8]"});
      }
    }
  }
}

TEST_F(Validation, TensorShapedLikeXDiffers) {
  for (const OpSpec& spec : Ops()) {
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
      if (a.role != Role::kLikeX || std::string(a.name) == "x") continue;
      SCOPED_TRACE(fmt::format("{} {}", spec.op, a.name));
      {
        OpCall c(spec);  // same element count, other shape
        c.SetShape(i, {c.h(), c.n()});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4, 8] (that of 'x')", "got [8, 4]"});
      }
      {
        OpCall c(spec);
        c.SetShape(i, {c.n() - 1, c.h()});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4, 8]", "got [3, 8]"});
      }
      {
        OpCall c(spec);  // same numbers, another rank
        c.SetShape(i, {1, c.n(), c.h()});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4, 8]", "got [1, 4, 8]"});
      }
    }
  }
}

TEST_F(Validation, StatisticsOfWrongLength) {
  for (const OpSpec& spec : Ops()) {
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
      if (a.role != Role::kStats) continue;
      SCOPED_TRACE(fmt::format("{} {}", spec.op, a.name));
      {
        OpCall c(spec);
        c.SetShape(i, {c.n() - 1});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4] (N = rows of 'x' [4, 8])", "got [3]"});
      }
      {
        OpCall c(spec);
        c.SetShape(i, {c.n(), 1});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4]", "got [4, 1]"});
      }
      {
        OpCall c(spec);  // a scalar statistic
        c.SetShape(i, {});
        ExpectRejected(c, {fmt::format("'{}'", a.name), "expected shape [4]", "got []"});
      }
    }
  }
}

TEST_F(Validation, StatisticsMayTakeTheLeadingShapeOfX) {
  // x [2, 2, 8]: statistics may be [4] or [2, 2], but not [2] or [4, 1].
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    for (int variant = 0; variant < 4; ++variant) {
      OpCall c(spec);
      for (size_t i = 0; i < c.num_args(); ++i) {
        const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
        if (a.role == Role::kLikeX) c.SetShape(i, {2, 2, c.h()});
        if (a.role == Role::kStats && variant == 1) c.SetShape(i, {2, 2});
        if (a.role == Role::kStats && variant == 2) c.SetShape(i, {2});
        if (a.role == Role::kStats && variant == 3) c.SetShape(i, {2, 2, 1});
      }
      if (variant <= 1) {
        ExpectAccepted(c);
      } else {
        ExpectRejected(c,
                       {"expected shape [4] (N = rows of 'x' [2, 2, 8])", variant == 2 ? "got [2]" : "got [2, 2, 1]"});
      }
    }
  }
}

TEST_F(Validation, ScalarX) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    OpCall c(spec);
    c.SetShape("x", {});
    ExpectRejected(c, {"'x'", "expected rank >= 1 ([N..., H]), got a scalar"});
  }
}

TEST_F(Validation, HiddenSizeZero) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);  // only x changed
      c.SetShape("x", {c.n(), 0});
      ExpectRejected(c, {"'x'", "expected hidden size (last dim) >= 1", "got shape [4, 0]"});
    }
    {
      OpCall c(spec);  // every tensor consistent with H = 0
      for (size_t i = 0; i < c.num_args(); ++i) {
        const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
        if (a.role == Role::kLikeX) c.SetShape(i, {c.n(), 0});
        if (a.role == Role::kCols) c.SetShape(i, {0});
      }
      ExpectRejected(c, {"'x'", "expected hidden size (last dim) >= 1", "got shape [4, 0]"});
    }
  }
}

// ---- Pointers and extents ------------------------------------------------------
TEST_F(Validation, NullDataWithElements) {
  for (const OpSpec& spec : Ops()) {
    for (size_t i = 0; i < spec.in.size() + spec.out.size(); ++i) {
      OpCall c(spec);
      SCOPED_TRACE(fmt::format("{} {}", spec.op, c.name(i)));
      const int64_t numel = c.T(i).numel();
      c.D(i).data = nullptr;
      ExpectRejected(c,
                     {fmt::format("'{}'", c.name(i)), fmt::format("data is NULL for a tensor of {} elements", numel)});
    }
  }
}

TEST_F(Validation, NegativeDimension) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);
      c.SetShape("x", {-4, 8});
      ExpectRejected(c, {"'x'", "dimension 0 is negative (-4)"});
    }
    {
      OpCall c(spec);
      c.SetShape("gamma", {-8});
      ExpectRejected(c, {"'gamma'", "dimension 0 is negative (-8)"});
    }
    {
      OpCall c(spec);  // numel = 0 does not hide a negative extent
      c.SetShape("x", {0, -8});
      ExpectRejected(c, {"'x'", "dimension 1 is negative (-8)"});
    }
    {
      OpCall c(spec);
      const size_t o = spec.in.size();
      c.SetShape(o, {4, -8});
      ExpectRejected(c, {fmt::format("'{}'", c.name(o)), "dimension 1 is negative (-8)"});
    }
  }
}

TEST_F(Validation, NonContiguousStrides) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);  // x: rows of 8 inside rows of 16
      c.Replace("x", DType::kF32, {c.n(), 2 * c.h()});
      c.SetShape("x", {c.n(), c.h()});
      c.SetStrides("x", {2 * c.h(), 1});
      ExpectRejected(c, {"'x'", "expected a contiguous row-major tensor, got shape [4, 8] with strides [16, 1]"});
    }
    {
      OpCall c(spec);  // x transposed (column-major)
      c.SetStrides("x", {1, c.n()});
      ExpectRejected(c, {"'x'", "expected a contiguous row-major tensor", "strides [1, 4]"});
    }
    {
      OpCall c(spec);  // gamma with stride 2
      c.Replace("gamma", DType::kF32, {2 * c.h()});
      c.SetShape("gamma", {c.h()});
      c.SetStrides("gamma", {2});
      ExpectRejected(c, {"'gamma'", "expected a contiguous row-major tensor", "strides [2]"});
    }
    {
      OpCall c(spec);  // the first output (z / dx) padded: the padding must stay untouched
      const std::string o = c.name(spec.in.size());
      c.Replace(o, DType::kF32, {c.n(), 2 * c.h()});
      c.SetShape(o, {c.n(), c.h()});
      c.SetStrides(o, {2 * c.h(), 1});
      ExpectRejected(c,
                     {fmt::format("'{}' (output 0)", o), "expected a contiguous row-major tensor", "strides [16, 1]"});
    }
  }
}

TEST_F(Validation, CompactStridesAreAccepted) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);  // explicit row-major strides equal strides == NULL
      c.SetStrides("x", {c.h(), 1});
      c.SetStrides("gamma", {1});
      ExpectAccepted(c);
    }
    {
      OpCall c(spec, 1, 8);  // the stride of an extent-1 dimension does not matter
      c.SetStrides("x", {12345, 1});
      ExpectAccepted(c);
    }
  }
}

// ---- Aliasing ---------------------------------------------------------------------
TEST_F(Validation, OutputAliasesInput) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    const size_t o = spec.in.size();
    {
      OpCall c(spec);  // z / dx is x (in place)
      const std::string out = c.name(o);
      c.View(out).data = c.D("x").data;
      // An op with an in-place pair names it; the others say they have none.
      const tefl::OpSchema* schema = tefl::FindOp(std::string_view(spec.op));
      ASSERT_NE(schema, nullptr);
      ExpectRejected(c, {fmt::format("'{}' (output 0)", out), "overlaps 'x'",
                         schema->inplace_output >= 0 ? fmt::format("only '{}' may be exactly '{}' (in place)",
                                                                   schema->outputs[size_t(schema->inplace_output)].name,
                                                                   schema->inputs[size_t(schema->inplace_input)].name)
                                                     : "does not work in place"});
    }
    {
      OpCall c(spec);  // the last output written over the last input (gamma / beta)
      const std::string out = c.name(c.num_args() - 1), input = c.name(o - 1);
      c.View(out).data = c.D(input).data;
      ExpectRejected(c, {fmt::format("'{}'", out), fmt::format("overlaps '{}'", input)});
    }
    if (!spec.fwd) {
      OpCall c(spec);  // dx is dz
      c.View("dx").data = c.D("dz").data;
      ExpectRejected(c, {"'dx' (output 0)", "overlaps 'dz' (input 0)"});
    }
  }
}

TEST_F(Validation, OutputPartlyOverlapsInput) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    const std::string out = spec.out[0].name;  // z or dx, shaped like x
    const int64_t n = 4, h = 8, numel = n * h;
    {
      // x is the first half of a [2N, H] buffer; z starts on x's last element.
      OpCall c(spec);
      c.Replace("x", DType::kF32, {2 * n, h}).Uniform("x");
      c.SetShape("x", {n, h});
      DLTensor& v = c.View(out);
      v.data = c.D("x").data;
      v.byte_offset = uint64_t(numel - 1) * 4;
      ExpectRejected(c, {fmt::format("'{}'", out), "overlaps 'x'"});
    }
    {
      // x starts half-way into a [2N, H] buffer; z covers the buffer's first
      // half, so its tail overlaps x's head.
      OpCall c(spec);
      Tensor& buf = c.Replace("x", DType::kF32, {2 * n, h});
      buf.Uniform("x");
      c.SetShape("x", {n, h});
      c.D("x").byte_offset = uint64_t(numel / 2) * 4;
      DLTensor& v = c.View(out);
      v.data = c.D("x").data;
      v.byte_offset = 0;
      ExpectRejected(c, {fmt::format("'{}'", out), "overlaps 'x'"});
    }
    {
      // Adjacent, not overlapping: x the first half, z the second: valid,
      // and only the second half is written.
      OpCall c(spec);
      c.Replace("x", DType::kF32, {2 * n, h}).Uniform("x");
      c.SetShape("x", {n, h});
      const Tensor before = c.T("x");
      DLTensor& v = c.View(out);
      v.data = c.D("x").data;
      v.byte_offset = uint64_t(numel) * 4;
      ExpectAccepted(c);
      EXPECT_EQ(std::memcmp(c.T("x").bytes(), before.bytes(), size_t(numel) * 4), 0) << "x was modified";
      EXPECT_NE(std::memcmp(static_cast<char*>(c.T("x").bytes()) + numel * 4,
                            static_cast<char*>(before.bytes()) + numel * 4, size_t(numel) * 4),
                0)
          << "the output half was not written";
      EXPECT_TRUE(c.T("x").GuardsIntact());
    }
  }
}

TEST_F(Validation, OutputsOverlapEachOther) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    // The last output is placed inside the one before it (both fp32 here):
    // layernorm_fwd rsigma = mu, rmsnorm_fwd rsigma inside z, layernorm_bwd
    // dbeta = dgamma, rmsnorm_bwd(_add) dgamma inside dx.
    const size_t k = spec.out.size();
    const std::string earlier = spec.out[k - 2].name, later = spec.out[k - 1].name;
    {
      OpCall c(spec);
      c.View(later).data = c.D(earlier).data;
      ExpectRejected(
          c, {fmt::format("'{}' (output {})", earlier, k - 2), fmt::format("overlaps '{}' (output {})", later, k - 1)});
    }
    {
      OpCall c(spec);  // one shared element at the end of the earlier output
      DLTensor& v = c.View(later);
      v.data = c.D(earlier).data;
      v.byte_offset = uint64_t(c.T(earlier).numel() - 1) * 4;
      // The view runs past the earlier tensor's data into its guard region
      // only if the call were (wrongly) accepted; guards are checked too.
      ExpectRejected(c, {fmt::format("'{}'", earlier), fmt::format("overlaps '{}'", later)});
    }
  }
}

// ---- Attributes ---------------------------------------------------------------------
TEST_F(Validation, AttributeOutOfRange) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    if (spec.fwd) {
      for (float eps :
           {-1.0f, -1e-30f, nan, -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::infinity()}) {
        SCOPED_TRACE(fmt::format("eps {}", eps));
        OpCall c(spec);
        c.fwd_attrs.eps = eps;
        ExpectRejected(c, {"attribute 'eps' must be in [0, 3.4028235e+38]",
                           std::isnan(eps) ? std::string("got nan") : fmt::format("got {}", eps)});
      }
      for (int32_t zcg : {2, -1}) {
        OpCall c(spec);
        c.fwd_attrs.zero_centered_gamma = zcg;
        ExpectRejected(c, {"attribute 'zero_centered_gamma' must be 0 or 1", fmt::format("got {}", zcg)});
      }
      {
        OpCall c(spec);
        c.fwd_attrs.sm_margin = -1;
        ExpectRejected(c, {"attribute 'sm_margin'", "got -1"});
      }
    } else {
      for (int32_t zcg : {2, -1, 1 << 30}) {
        OpCall c(spec);
        c.bwd_attrs.zero_centered_gamma = zcg;
        ExpectRejected(c, {"attribute 'zero_centered_gamma' must be 0 or 1", fmt::format("got {}", zcg)});
      }
      {
        OpCall c(spec);
        c.bwd_attrs.sm_margin = -1;
        ExpectRejected(c, {"attribute 'sm_margin'", "got -1"});
      }
    }
  }
}

TEST_F(Validation, AttributeBoundsAreInclusive) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    OpCall c(spec);
    if (spec.fwd) {
      c.fwd_attrs.eps = 0.0f;  // the lower bound (x is random: no zero row)
      c.fwd_attrs.zero_centered_gamma = 1;
    } else {
      c.bwd_attrs.zero_centered_gamma = 1;
    }
    ExpectAccepted(c);
  }
}

TEST_F(Validation, AttrsStructSizeTooSmall) {
  for (const OpSpec& spec : Ops()) {
    for (size_t size : {size_t(0), size_t(4), size_t(7)}) {
      SCOPED_TRACE(fmt::format("{} struct_size {}", spec.op, size));
      OpCall c(spec);
      c.fwd_attrs.struct_size = size;
      c.bwd_attrs.struct_size = size;
      ExpectRejected(c, {fmt::format("attrs.struct_size is {}, expected ", size), "TEFL_*_ATTRS_STRUCT_SIZE"});
    }
  }
}

// An older caller's struct ends where one of its fields ends; a struct_size
// inside a field would piece it together from the caller's bytes and the
// default's. Attributes given to an op that has none are a caller's mistake.
TEST_F(Validation, AttrsStructSizeInsideAFieldAndAttrsForAnOpWithout) {
  Tensor x(DType::kF32, {64}), y(DType::kF32, {64}), m(DType::kU8, {64});
  x.Uniform("x");
  tefl_dropout_attrs a{TEFL_DROPOUT_ATTRS_STRUCT_SIZE, 0x100000007ull, 0x100000003ull, 0.5f};
  for (size_t size : {size_t(12), size_t(20), size_t(26)}) {
    a.struct_size = size;
    y.Fill(7.0f);
    const Status s = tefl::testing::CallOp(mgr_, "dropout_fwd", {&x}, {&y, &m}, &a);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << size << ": " << s.ToString();
    const char* field = size == 12 ? "'seed'" : size == 20 ? "'offset'" : "'p'";
    EXPECT_NE(s.message().find(
                  fmt::format("dropout_fwd: attrs.struct_size is {}, which ends inside attribute {}", size, field)),
              std::string::npos)
        << s.message();
    EXPECT_EQ(y.at(0), 7.0f) << "no output written";
  }
  // Sizes at a field's end are an older caller's struct: accepted, the rest defaults.
  for (size_t size : {size_t(8), size_t(16), size_t(24)}) {
    a.struct_size = size;
    EXPECT_TRUE(tefl::testing::CallOp(mgr_, "dropout_fwd", {&x}, {&y, &m}, &a).ok()) << size;
  }
  tefl_softmax_attrs sa{TEFL_SOFTMAX_ATTRS_STRUCT_SIZE, 2.0f};
  y.Fill(7.0f);
  const Status s = tefl::testing::CallOp(mgr_, "gelu", {&x}, {&y}, &sa);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find("gelu: the op has no attributes, expected attrs NULL"), std::string::npos) << s.message();
  EXPECT_EQ(y.at(0), 7.0f);
}

// Two outputs over the same bytes: never in place, and said so.
TEST_F(Validation, OutputsSharingMemoryAreNamedAsSuch) {
  Tensor x(DType::kF32, {64}), y(DType::kF32, {64});
  x.Uniform("x");
  y.Fill(7.0f);
  DLTensor mask = y.dl();  // the mask written over the output's bytes
  mask.dtype = DLDataType{kDLUInt, 8, 1};
  const DLTensor* in[] = {x.ptr()};
  DLTensor* out[] = {y.ptr(), &mask};
  const Status s = mgr_.Call("dropout_fwd", in, out, nullptr);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find("dropout_fwd: argument 'output' (output 0): overlaps 'mask' (output 1) in memory; outputs "
                             "must not share memory"),
            std::string::npos)
      << s.message();
  EXPECT_EQ(y.at(0), 7.0f);
}

TEST_F(Validation, OlderAndNewerAttrsStructsAreAccepted) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      // An older caller's struct holds only the first field: the fields it
      // lacks take their defaults, whatever lies in memory after it.
      OpCall c(spec);
      if (spec.fwd) {
        c.fwd_attrs.struct_size = offsetof(tefl_norm_fwd_attrs, zero_centered_gamma);
        c.fwd_attrs.zero_centered_gamma = 77;
        c.fwd_attrs.sm_margin = -5;
      } else {
        c.bwd_attrs.struct_size = offsetof(tefl_norm_bwd_attrs, zero_centered_gamma);
        c.bwd_attrs.zero_centered_gamma = 77;
        c.bwd_attrs.sm_margin = -5;
      }
      ExpectAccepted(c);
    }
    {
      // A newer caller's larger struct (unknown trailing fields): the known
      // prefix is read.
      OpCall c(spec);
      alignas(8) unsigned char buffer[128];
      std::memset(buffer, 0xFF, sizeof(buffer));
      if (spec.fwd) {
        const tefl_norm_fwd_attrs a = {sizeof(buffer), 1e-5f, 0, 0};
        std::memcpy(buffer, &a, sizeof(a));
      } else {
        const tefl_norm_bwd_attrs a = {sizeof(buffer), 0, 0};
        std::memcpy(buffer, &a, sizeof(a));
      }
      const Status s = mgr_.Call(spec.op, c.in, c.out, buffer);
      EXPECT_TRUE(s.ok()) << s.ToString();
    }
    {
      OpCall c(spec);  // NULL attrs: all defaults
      EXPECT_TRUE(mgr_.Call(spec.op, c.in, c.out, nullptr).ok());
    }
  }
}

// ---- Unknown ops ------------------------------------------------------------------------
TEST_F(Validation, UnknownOpNameAndId) {
  // An op the catalogue lacks is TEFL_NOT_FOUND (not INVALID_ARGUMENT): the
  // op, not an argument, is what is missing.
  OpCall c(Ops()[1]);  // rmsnorm_fwd tensors
  const std::vector<Tensor> before = c.Snapshot();
  {
    const Status s = mgr_.Call("no_such_op", c.in, c.out, nullptr);
    EXPECT_EQ(s.code(), TEFL_NOT_FOUND) << s.ToString();
    EXPECT_NE(s.message().find("unknown op 'no_such_op'"), std::string::npos) << s.message();
  }
  {
    const Status s = mgr_.Call("", c.in, c.out, nullptr);
    EXPECT_EQ(s.code(), TEFL_NOT_FOUND) << s.ToString();
  }
  for (int32_t id : {-1, 9999, int32_t(TEFL_OP_COUNT_) + 1000}) {
    const Status s = mgr_.Call(id, c.in, c.out, nullptr);
    EXPECT_EQ(s.code(), TEFL_NOT_FOUND) << s.ToString();
    EXPECT_NE(s.message().find(fmt::format("unknown op id {}", id)), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("op ids are the TEFL_OP_* constants of tefl/ops.h, 0 to"), std::string::npos)
        << s.message();
  }
  EXPECT_EQ(tefl_op_id("no_such_op"), -1);
  EXPECT_EQ(tefl_op_id(nullptr), -1);
  EXPECT_EQ(spy_calls_.load(), 0);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(c.T(i).SameBytes(before[i])) << c.name(i);
    EXPECT_TRUE(c.T(i).GuardsIntact()) << c.name(i);
  }
  {
    tefl_status* st =
        tefl_call(9999, c.in.data(), int32_t(c.in.size()), c.out.data(), int32_t(c.out.size()), nullptr, nullptr);
    EXPECT_EQ(tefl_status_code_of(st), TEFL_NOT_FOUND);
    tefl_status_free(st);
  }
}

// ---- Empty tensors are valid -----------------------------------------------------------
TEST_F(Validation, EmptyRowsAreValid) {
  for (const OpSpec& spec : Ops()) {
    for (bool null_data : {false, true}) {
      for (bool three_d : {false, true}) {
        SCOPED_TRACE(fmt::format("{} null_data={} 3-D={}", spec.op, null_data, three_d));
        OpCall c(spec, 0, 8);
        for (size_t i = 0; i < c.num_args(); ++i) {
          const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
          if (three_d && a.role == Role::kLikeX) c.SetShape(i, {2, 0, 8});
          if (three_d && a.role == Role::kStats) c.SetShape(i, {2, 0});
          // NULL data is fine for a tensor of no elements.
          if (null_data && a.role != Role::kCols) c.D(i).data = nullptr;
        }
        ExpectAccepted(c);
        // The backward column sums over no rows are zeros.
        for (const char* col : {"dgamma", "dbeta"}) {
          bool has = false;
          for (const ArgSpec& a : spec.out) has = has || std::string(a.name) == col;
          if (!has) continue;
          for (int64_t j = 0; j < c.T(col).numel(); ++j) EXPECT_EQ(c.T(col).at(j), 0.0) << col << "[" << j << "]";
          EXPECT_TRUE(c.T(col).GuardsIntact());
        }
      }
    }
  }
}

TEST_F(Validation, EmptyTensorsTakeAnyStrides) {
  // torch gives an empty [2, 0, 8] the strides [8, 8, 1]: no element is
  // addressed, so the tensor is as good as a compact one.
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    OpCall c(spec, 0, 8);
    for (size_t i = 0; i < c.num_args(); ++i) {
      const ArgSpec& a = i < spec.in.size() ? spec.in[i] : spec.out[i - spec.in.size()];
      if (a.role == Role::kLikeX) {
        c.SetShape(i, {2, 0, 8});
        c.SetStrides(i, {8, 8, 1});
      }
      if (a.role == Role::kStats) {
        c.SetShape(i, {2, 0});
        c.SetStrides(i, {1, 1});
      }
    }
    ExpectAccepted(c);
  }
}

TEST_F(Validation, EmptyRowsAreValidForEveryImplementation) {
  mgr_.EnsureInitialized();
  for (const OpSpec& spec : Ops()) {
    for (const tefl::OpImpl& impl : mgr_.registry().GetImplementations(spec.op)) {
      if (impl.impl_id == "default.spy") continue;
      SCOPED_TRACE(fmt::format("{} {}", spec.op, impl.impl_id));
      tefl::SelectionPolicy policy;
      ASSERT_TRUE(
          tefl::SelectionPolicy::Make("flagos", true, {{spec.op, {"impl:" + impl.impl_id}}}, {}, std::nullopt, &policy)
              .ok());
      tefl::PolicyContext ctx(policy);
      OpCall c(spec, 0, 8);
      for (size_t i = 0; i < c.num_args(); ++i)
        if (c.T(i).numel() == 0) c.D(i).data = nullptr;
      const Status s = c.Call(mgr_);
      EXPECT_TRUE(s.ok()) << s.ToString();
      EXPECT_EQ(mgr_.GetSelectedImplId(spec.op), impl.impl_id);
      for (size_t i = spec.in.size(); i < c.num_args(); ++i) {
        EXPECT_TRUE(c.T(i).GuardsIntact()) << c.name(i);
        for (int64_t j = 0; j < c.T(i).numel(); ++j) EXPECT_EQ(c.T(i).at(j), 0.0) << c.name(i) << "[" << j << "]";
      }
    }
  }
}

// ---- The other entry points report the same errors ------------------------------------
TEST_F(Validation, CEntryPointGivesTheSameError) {
  OpCall c(Ops()[1]);  // rmsnorm_fwd with gamma of length H - 1
  c.SetShape("gamma", {c.h() - 1});
  const Status cpp = c.Call(tefl::GetDefaultManager());
  ASSERT_EQ(cpp.code(), TEFL_INVALID_ARGUMENT) << cpp.ToString();
  const std::vector<Tensor> before = c.Snapshot();
  tefl_status* st = tefl_call(TEFL_OP_RMSNORM_FWD, c.in.data(), int32_t(c.in.size()), c.out.data(),
                              int32_t(c.out.size()), c.attrs(), nullptr);
  ASSERT_NE(st, nullptr);
  EXPECT_EQ(tefl_status_code_of(st), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(std::string(tefl_status_message(st)), cpp.message());
  tefl_status_free(st);
  for (size_t i = 0; i < before.size(); ++i) {
    EXPECT_TRUE(c.T(i).SameBytes(before[i])) << c.name(i);
    EXPECT_TRUE(c.T(i).GuardsIntact()) << c.name(i);
  }
  // Wrong arity through C, and a negative count.
  st = tefl_call(TEFL_OP_RMSNORM_FWD, c.in.data(), 1, c.out.data(), 2, nullptr, nullptr);
  EXPECT_EQ(tefl_status_code_of(st), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(std::string(tefl_status_message(st)).find("expected 2 inputs and 2 outputs, got 1 and 2"),
            std::string::npos)
      << tefl_status_message(st);
  tefl_status_free(st);
  st = tefl_call(TEFL_OP_RMSNORM_FWD, c.in.data(), -1, c.out.data(), 2, nullptr, nullptr);
  EXPECT_EQ(tefl_status_code_of(st), TEFL_INVALID_ARGUMENT);
  tefl_status_free(st);
  // A NULL inputs array with a non-zero count.
  st = tefl_call(TEFL_OP_RMSNORM_FWD, nullptr, 2, c.out.data(), 2, nullptr, nullptr);
  EXPECT_EQ(tefl_status_code_of(st), TEFL_INVALID_ARGUMENT);
  tefl_status_free(st);
}

TEST_F(Validation, ExplainReportsTheValidationError) {
  for (const OpSpec& spec : Ops()) {
    SCOPED_TRACE(spec.op);
    {
      OpCall c(spec);  // valid: a chain and no error
      const tefl::Resolution r = mgr_.Explain(spec.id, c.in, c.out, c.attrs());
      EXPECT_TRUE(r.error.empty()) << r.error;
      EXPECT_FALSE(r.chain.empty());
      EXPECT_EQ(r.op_name, spec.op);
    }
    {
      OpCall c(spec);  // gamma of length H - 1
      c.SetShape("gamma", {c.h() - 1});
      const Status s = c.Call(mgr_);
      const tefl::Resolution r = mgr_.Explain(spec.id, c.in, c.out, c.attrs());
      EXPECT_EQ(r.error, s.message());
      EXPECT_NE(r.error.find("'gamma'"), std::string::npos) << r.error;
      EXPECT_NE(r.error.find("expected shape [8]"), std::string::npos) << r.error;
      EXPECT_TRUE(r.chain.empty());
    }
    {
      OpCall c(spec);  // attrs too small
      c.fwd_attrs.struct_size = 4;
      c.bwd_attrs.struct_size = 4;
      const tefl::Resolution r = mgr_.Explain(spec.id, c.in, c.out, c.attrs());
      EXPECT_NE(r.error.find("attrs.struct_size is 4"), std::string::npos) << r.error;
    }
  }
  const tefl::Resolution r = mgr_.Explain(9999, {}, {}, nullptr);
  EXPECT_NE(r.error.find("unknown op id 9999"), std::string::npos) << r.error;
  EXPECT_EQ(spy_calls_.load(), 0);
}

TEST_F(Validation, TypedCallsReportTheSameErrors) {
  tefl::CallOptions opts;
  opts.manager = &mgr_;
  {
    OpCall c(Ops()[1]);  // rmsnorm_fwd, eps < 0
    const std::vector<Tensor> before = c.Snapshot();
    const Status s = tefl::rmsnorm_fwd(c.D("x"), c.D("gamma"), -1.0f, c.D("z"), c.D("rsigma"), opts);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find("rmsnorm_fwd: attribute 'eps' must be in [0, 3.4028235e+38], got -1"), std::string::npos)
        << s.message();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(c.T(i).SameBytes(before[i])) << c.name(i);
  }
  {
    OpCall c(Ops()[0]);  // layernorm_fwd, beta of length H - 1
    c.SetShape("beta", {c.h() - 1});
    const std::vector<Tensor> before = c.Snapshot();
    const Status s =
        tefl::layernorm_fwd(c.D("x"), c.D("gamma"), c.D("beta"), 1e-5f, c.D("z"), c.D("mu"), c.D("rsigma"), opts);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find("layernorm_fwd: argument 'beta' (input 2): expected shape [8]"), std::string::npos)
        << s.message();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(c.T(i).SameBytes(before[i])) << c.name(i);
  }
  {
    OpCall c(Ops()[2]);  // layernorm_bwd, mu of fp16
    c.Replace("mu", DType::kF16, {c.n()});
    const std::vector<Tensor> before = c.Snapshot();
    const Status s = tefl::layernorm_bwd(c.D("dz"), c.D("x"), c.D("mu"), c.D("rsigma"), c.D("gamma"), c.D("dx"),
                                         c.D("dgamma"), c.D("dbeta"), opts);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find("layernorm_bwd: argument 'mu' (input 2): expected dtype in {float32}, got float16"),
              std::string::npos)
        << s.message();
    for (size_t i = 0; i < before.size(); ++i) EXPECT_TRUE(c.T(i).SameBytes(before[i])) << c.name(i);
  }
  {
    OpCall c(Ops()[4]);  // rmsnorm_bwd_add, add shaped [H, N]
    c.SetShape("add", {c.h(), c.n()});
    const Status s = tefl::rmsnorm_bwd_add(c.D("dz"), c.D("x"), c.D("add"), c.D("rsigma"), c.D("gamma"), c.D("dx"),
                                           c.D("dgamma"), opts);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find("'add' (input 2): expected shape [4, 8] (that of 'x'), got [8, 4]"), std::string::npos)
        << s.message();
  }
  EXPECT_EQ(spy_calls_.load(), 0);
}

}  // namespace

// Shapes and strides whose arithmetic would overflow are errors, not UB.
namespace tefl {
namespace {
TEST(ValidationLimits, OverflowingShapesAndStrides) {
  OpManager mgr;
  std::vector<float> data(64), gamma(8), z(64), rs(8);
  int64_t huge[2] = {int64_t(1) << 40, int64_t(1) << 40}, hs[1] = {int64_t(1) << 40}, ok_shape[2] = {8, 8}, gs[1] = {8},
          rss[1] = {8};
  DLTensor x{data.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, huge, nullptr, 0};
  DLTensor g{gamma.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, hs, nullptr, 0};
  DLTensor tz{z.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, ok_shape, nullptr, 0};
  DLTensor trs{rs.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, rss, nullptr, 0};
  const DLTensor* in[] = {&x, &g};
  DLTensor* out[] = {&tz, &trs};
  Status s = mgr.Call(TEFL_OP_RMSNORM_FWD, in, out);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("argument 'x' (input 0): shape [1099511627776, 1099511627776] has too many elements"),
            std::string::npos)
      << s.message();
  // A stride that puts the last element past 2^62 bytes.
  int64_t strides[2] = {int64_t(1) << 61, 1};
  x.shape = ok_shape;
  x.strides = strides;
  g.shape = gs;
  s = mgr.Call(TEFL_OP_RMSNORM_FWD, in, out);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("address beyond 2^62 bytes"), std::string::npos) << s.message();
  EXPECT_EQ(z, std::vector<float>(64));  // nothing written
}
}  // namespace
}  // namespace tefl

// A tensor with a zero dimension has no elements, whatever its other
// dimensions multiply to: [2^62, 4, 0] is valid (and empty) even though
// 2^62 * 4 overflows before the product reaches the 0. (Checked by
// validation and Explain: no kernel runs on these shapes here.)
namespace tefl {
namespace {
TEST(ValidationLimits, EmptyTensorWhoseOtherDimsOverflow) {
  const OpSchema& op = *FindOp(TEFL_OP_GELU);
  int64_t empty[3] = {int64_t(1) << 62, 4, 0}, full[3] = {int64_t(1) << 62, 4, 1};
  int64_t strides[3] = {0, 0, 1};
  DLTensor x{nullptr, {kDLCPU, 0}, 3, {kDLFloat, 32, 1}, empty, nullptr, 0};
  DLTensor y = x;
  const DLTensor* in[] = {&x};
  DLTensor* out[] = {&y};
  const CallArgs args{in, 1, out, 1, nullptr};
  SigKey key;
  auto message = [](tefl_status* st) {
    std::string m = st ? tefl_status_message(st) : "";
    tefl_status_free(st);
    return m;
  };
  EXPECT_EQ(message(ValidateCall(op, args, &key)), "");
  auto memo = std::make_unique<ValidationMemo>();
  EXPECT_EQ(message(ValidateCallMemo(op, args, &key, memo.get())), "");
  EXPECT_EQ(message(ValidateCallMemo(op, args, &key, memo.get())), "");  // remembered
  x.strides = strides;                                                   // strides (any: no element is addressed)
  EXPECT_EQ(message(ValidateCall(op, args, &key)), "");
  OpManager mgr;
  Resolution r = mgr.Explain(TEFL_OP_GELU, in, out, nullptr);
  EXPECT_EQ(r.error, "");
  EXPECT_FALSE(r.chain.empty());
  // The zero first was always fine; a non-zero last dim is too many elements.
  int64_t zero_first[3] = {0, int64_t(1) << 62, 4};
  x.strides = nullptr;
  x.shape = y.shape = zero_first;
  EXPECT_EQ(message(ValidateCall(op, args, &key)), "");
  std::vector<float> data(4);
  x.data = y.data = data.data();
  x.shape = y.shape = full;
  EXPECT_EQ(message(ValidateCall(op, args, &key)),
            "gelu: argument 'input' (input 0): shape [4611686018427387904, 4, 1] has too many elements");
  x.strides = strides;
  EXPECT_NE(message(ValidateCall(op, args, &key)).find("has too many elements"), std::string::npos);
}
}  // namespace
}  // namespace tefl

namespace tefl {
namespace {
// Kernels load whole elements: a misaligned first element is refused.
TEST(ValidationLimits, MisalignedData) {
  OpManager mgr;
  std::vector<float> data(65), gamma(8), z(64), rs(8);
  int64_t xs[2] = {8, 8}, gs[1] = {8}, rss[1] = {8};
  DLTensor x{data.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, nullptr, 2};  // 2 bytes into a float
  DLTensor g{gamma.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, gs, nullptr, 0};
  DLTensor tz{z.data(), {kDLCPU, 0}, 2, {kDLFloat, 32, 1}, xs, nullptr, 0};
  DLTensor trs{rs.data(), {kDLCPU, 0}, 1, {kDLFloat, 32, 1}, rss, nullptr, 0};
  const DLTensor* in[] = {&x, &g};
  DLTensor* out[] = {&tz, &trs};
  Status s = mgr.Call(TEFL_OP_RMSNORM_FWD, in, out);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("argument 'x' (input 0): data + byte_offset is not aligned to the element size (4 bytes)"),
            std::string::npos)
      << s.message();
  x.byte_offset = 4;  // one whole float in: fine
  EXPECT_TRUE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).ok());
}
}  // namespace
}  // namespace tefl
