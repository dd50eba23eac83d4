// Prepared calls (OpManager::Prepare / PreparedCall::Run and the C API
// tefl_prepare_call / tefl_prepared_call_run): a run on new data pointers
// gives what OpManager::Call gives on tensors with those pointers, and every
// error Call reports for those pointers, before any output is written.
// Resolution, fallback and demotion of prepared calls: resolution_test.cpp.
#include <gtest/gtest.h>

#include <cstring>

#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

// Tensors of an fp32 rmsnorm_fwd [rows, 32] call.
struct RmsTensors {
  Tensor x, g, z, rs;
  explicit RmsTensors(const std::string& seed, DType dt = DType::kF32, int64_t rows = 6)
      : x(dt, {rows, 32}), g(dt, {32}), z(dt, {rows, 32}), rs(DType::kF32, {rows}) {
    x.Uniform(seed + "x");
    g.Uniform(seed + "g");
    z.Fill(-9.0);
    rs.Fill(-9.0);
  }
  std::vector<const DLTensor*> In() { return {x.ptr(), g.ptr()}; }
  std::vector<DLTensor*> Out() { return {z.ptr(), rs.ptr()}; }
  std::vector<void*> InData() { return {x.bytes(), g.bytes()}; }
  std::vector<void*> OutData() { return {z.bytes(), rs.bytes()}; }
};

TEST(PreparedCall, RunsOnNewBuffersLikeCall) {
  for (DType dt : {DType::kF32, DType::kBF16}) {
    OpManager m;
    RmsTensors prep("p", dt), a("a", dt), b("b", dt), ref_a("a", dt), ref_b("b", dt);
    PreparedCall call;
    ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, prep.In(), prep.Out(), nullptr, &call).ok());
    EXPECT_EQ(call.op_name(), "rmsnorm_fwd");
    EXPECT_EQ(prep.z.at(0), -9.0);  // preparing runs nothing
    ASSERT_TRUE(call.Run(a.InData(), a.OutData()).ok());
    ASSERT_TRUE(call.Run(b.InData(), b.OutData()).ok());
    ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, ref_a.In(), ref_a.Out()).ok());
    ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, ref_b.In(), ref_b.Out()).ok());
    EXPECT_TRUE(a.z.SameBytes(ref_a.z));
    EXPECT_TRUE(a.rs.SameBytes(ref_a.rs));
    EXPECT_TRUE(b.z.SameBytes(ref_b.z));
    EXPECT_FALSE(a.z.SameBytes(b.z));
    EXPECT_EQ(m.GetSelectedImplId("rmsnorm_fwd"), "default.portable");
  }
}

TEST(PreparedCall, KeepsItsOwnCopyOfMetadataAndAttributes) {
  OpManager m;
  RmsTensors prep("p"), run("r"), ref("r");
  tefl_norm_fwd_attrs attrs{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 0.5f, 1, 0};
  PreparedCall call;
  {
    DLTensor x = prep.x.dl(), g = prep.g.dl(), z = prep.z.dl(), rs = prep.rs.dl();
    std::vector<int64_t> x_shape(prep.x.shape());
    x.shape = x_shape.data();
    const DLTensor* in[] = {&x, &g};
    DLTensor* out[] = {&z, &rs};
    ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, in, out, &attrs, &call).ok());
    x_shape[0] = 1000;  // the caller's shape array and attributes change after Prepare
    attrs.eps = 123.0f;
  }
  ASSERT_TRUE(call.Run(run.InData(), run.OutData()).ok());
  tefl_norm_fwd_attrs same{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, 0.5f, 1, 0};
  ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, ref.In(), ref.Out(), &same).ok());
  EXPECT_TRUE(run.z.SameBytes(ref.z));
  EXPECT_TRUE(run.rs.SameBytes(ref.rs));
}

// Run's pointer errors are Call's errors for the same pointers, and nothing
// is written.
TEST(PreparedCall, PointerErrorsAreCallsErrorsAndWriteNothing) {
  OpManager m;
  RmsTensors t("t");
  PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, t.In(), t.Out(), nullptr, &call).ok());
  struct Case {
    const char* what;
    std::vector<void*> in, out;
    const char* expected;
  };
  char* zb = static_cast<char*>(t.z.bytes());
  const Case cases[] = {
      {"NULL input", {nullptr, t.g.bytes()}, t.OutData(), "argument 'x' (input 0)"},
      {"misaligned output", t.InData(), {zb + 1, t.rs.bytes()}, "argument 'z' (output 0)"},
      {"output overlapping input", t.InData(), {t.x.bytes(), t.rs.bytes()}, "overlaps"},
      {"two outputs overlapping", t.InData(), {zb, zb + 4}, "overlaps"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    Tensor x_before = t.x, z_before = t.z;
    Status s = call.Run(c.in, c.out);
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
    EXPECT_NE(s.message().find(c.expected), std::string::npos) << s.message();
    // Call on tensors with the same pointers says the same.
    DLTensor x = t.x.dl(), g = t.g.dl(), z = t.z.dl(), rs = t.rs.dl();
    x.data = c.in[0];
    g.data = c.in[1];
    z.data = c.out[0];
    rs.data = c.out[1];
    const DLTensor* in[] = {&x, &g};
    DLTensor* out[] = {&z, &rs};
    Status direct = m.Call(TEFL_OP_RMSNORM_FWD, in, out);
    EXPECT_EQ(s.ToString(), direct.ToString());
    EXPECT_TRUE(t.z.SameBytes(z_before));
    EXPECT_TRUE(t.x.SameBytes(x_before));
  }
  std::vector<void*> one = {t.x.bytes()};
  Status s = call.Run(one, t.OutData());
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("rmsnorm_fwd: PreparedCall::Run: expected 2 input and 2 output data pointers"),
            std::string::npos)
      << s.message();
  // After the errors, good pointers run.
  EXPECT_TRUE(call.Run(t.InData(), t.OutData()).ok());
  EXPECT_NE(t.z.at(0), -9.0);
}

// A run on the same pointers as the last run that passed its pointer checks
// skips those checks (they depend on nothing else); a run that failed them
// never counts as checked, so repeating bad pointers repeats the error.
TEST(PreparedCall, SamePointersAsTheLastCheckedRun) {
  OpManager m;
  RmsTensors t("t"), ref("t");
  PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, t.In(), t.Out(), nullptr, &call).ok());
  ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, ref.In(), ref.Out()).ok());
  for (int i = 0; i < 3; ++i) {
    t.z.Fill(-9.0);
    ASSERT_TRUE(call.Run(t.InData(), t.OutData()).ok());
    EXPECT_TRUE(t.z.SameBytes(ref.z)) << "run " << i;
  }
  char* zb = static_cast<char*>(t.z.bytes());
  const std::vector<std::vector<void*>> bad_outs = {
      {zb + 1, t.rs.bytes()},       // misaligned
      {t.x.bytes(), t.rs.bytes()},  // overlaps x
      {nullptr, t.rs.bytes()},      // NULL
  };
  for (const std::vector<void*>& bad : bad_outs) {
    Tensor x_before = t.x;
    t.z.Fill(-9.0);
    Tensor z_before = t.z;
    for (int repeat = 0; repeat < 2; ++repeat) {
      Status s = call.Run(t.InData(), bad);
      EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << "repeat " << repeat << ": " << s.ToString();
      EXPECT_TRUE(t.z.SameBytes(z_before));
      EXPECT_TRUE(t.x.SameBytes(x_before));
    }
    // The good pointers again: checked afresh, then run.
    ASSERT_TRUE(call.Run(t.InData(), t.OutData()).ok());
    EXPECT_TRUE(t.z.SameBytes(ref.z));
  }
  // One pointer differs from the last run: that run is checked in full.
  RmsTensors other("t");
  std::vector<void*> mixed_in = {other.x.bytes(), t.g.bytes()};
  ASSERT_TRUE(call.Run(mixed_in, t.OutData()).ok());
  EXPECT_TRUE(t.z.SameBytes(ref.z));  // other.x holds the same values as t.x
  std::vector<void*> bad_in = {zb + 2, t.g.bytes()};
  EXPECT_EQ(call.Run(bad_in, t.OutData()).code(), TEFL_INVALID_ARGUMENT);
}

TEST(PreparedCall, EmptyAndInvalidPreparations) {
  PreparedCall empty;
  EXPECT_FALSE(empty.prepared());
  EXPECT_EQ(empty.op_name(), "");
  Status s = empty.Run({}, {});
  EXPECT_EQ(s.code(), TEFL_FAILED_PRECONDITION);
  OpManager m;
  RmsTensors t("t");
  Tensor bad_g(DType::kF32, {31});
  PreparedCall call;
  std::vector<const DLTensor*> in = {t.x.ptr(), bad_g.ptr()};
  s = m.Prepare(TEFL_OP_RMSNORM_FWD, in, t.Out(), nullptr, &call);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("argument 'gamma'"), std::string::npos) << s.message();
  EXPECT_FALSE(call.prepared());
  EXPECT_EQ(m.Prepare(9999, t.In(), t.Out(), nullptr, &call).code(), TEFL_NOT_FOUND);
  // A prepared call is movable.
  ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, t.In(), t.Out(), nullptr, &call).ok());
  PreparedCall moved = std::move(call);
  EXPECT_TRUE(moved.prepared());
  EXPECT_TRUE(moved.Run(t.InData(), t.OutData()).ok());
}

// A NULL shape is Prepare's error however warm this thread's call memo is
// (Prepare validates in full and copies the shape; runs read only the copy).
TEST(PreparedCall, NullShapeAfterACallOfTheSameOp) {
  OpManager m;
  RmsTensors t("t");
  ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, t.In(), t.Out()).ok());
  ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_FWD, t.In(), t.Out()).ok());  // remembered by this thread
  PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_FWD, t.In(), t.Out(), nullptr, &call).ok());
  DLTensor xv = t.x.dl();
  xv.shape = nullptr;
  std::vector<const DLTensor*> in = {&xv, t.g.ptr()};
  PreparedCall bad;
  Status s = m.Prepare(TEFL_OP_RMSNORM_FWD, in, t.Out(), nullptr, &bad);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "rmsnorm_fwd: argument 'x' (input 0): shape is NULL");
  EXPECT_FALSE(bad.prepared());
  // The earlier preparation is untouched and runs on its own copy of the shape.
  EXPECT_TRUE(call.Run(t.InData(), t.OutData()).ok());
  EXPECT_TRUE(call.Run(t.InData(), t.OutData()).ok());
}

// Absent optional arguments stay absent; contents the op's validation reads
// (cu_seqlens) are checked on every run.
TEST(PreparedCall, OptionalArgumentsAndContentChecks) {
  OpManager m;
  Tensor x(DType::kBF16, {10, 4, 64}), freqs(DType::kF32, {16, 1, 1, 64}), cu(DType::kI32, {3}),
      out(DType::kBF16, {10, 4, 64});
  x.Uniform("x");
  freqs.Uniform("f");
  cu.set(0, 0);
  cu.set(1, 4);
  cu.set(2, 10);
  tefl_rope_attrs attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_THD, 0, 1, 0};
  const DLTensor* in[] = {x.ptr(), freqs.ptr(), nullptr, cu.ptr()};
  DLTensor* o[] = {out.ptr()};
  PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_FUSED_ROPE_FORWARD, in, o, &attrs, &call).ok());
  std::vector<void*> in_data = {x.bytes(), freqs.bytes(), nullptr, cu.bytes()};
  std::vector<void*> out_data = {out.bytes()};
  ASSERT_TRUE(call.Run(in_data, out_data).ok());
  Tensor before = out;
  cu.set(1, 11);  // past the end
  Status s = call.Run(in_data, out_data);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("argument 'cu_seqlens' (input 3): expected non-decreasing values"), std::string::npos)
      << s.message();
  cu.set(1, 4);
  Tensor start(DType::kI32, {2});
  std::vector<void*> with_start = {x.bytes(), freqs.bytes(), start.bytes(), cu.bytes()};
  s = call.Run(with_start, out_data);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("argument 'start_positions' was absent when the call was prepared"), std::string::npos)
      << s.message();
  EXPECT_TRUE(out.SameBytes(before));
}

// An op that may run in place (rmsnorm_bwd_add: dx may alias add) runs in
// place and out of place from one preparation, like Call.
TEST(PreparedCall, InPlaceAndOutOfPlaceRunsOfOnePreparation) {
  OpManager m;
  auto make = [](const char* seed, std::vector<Tensor>& v) {
    v = {Tensor(DType::kF32, {4, 16}), Tensor(DType::kF32, {4, 16}), Tensor(DType::kF32, {4, 16}),
         Tensor(DType::kF32, {4}),     Tensor(DType::kF32, {16}),    Tensor(DType::kF32, {4, 16}),
         Tensor(DType::kF32, {16})};
    const char* names[] = {"dz", "x", "add", "rs", "g"};
    for (int i = 0; i < 5; ++i) v[size_t(i)].Uniform(std::string(seed) + names[i], 0.5, 1.5);
  };
  std::vector<Tensor> prep, a, ref;
  make("s", prep);
  make("s", a);
  make("s", ref);
  auto in_of = [](std::vector<Tensor>& v) {
    return std::vector<const DLTensor*>{v[0].ptr(), v[1].ptr(), v[2].ptr(), v[3].ptr(), v[4].ptr()};
  };
  // Prepared in place: dx is add's buffer.
  DLTensor dx_alias = prep[2].dl();
  std::vector<DLTensor*> prep_out = {&dx_alias, prep[6].ptr()};
  PreparedCall call;
  ASSERT_TRUE(m.Prepare(TEFL_OP_RMSNORM_BWD_ADD, in_of(prep), prep_out, nullptr, &call).ok());
  // Out of place on a's buffers, against Call.
  std::vector<void*> a_in = {a[0].bytes(), a[1].bytes(), a[2].bytes(), a[3].bytes(), a[4].bytes()};
  std::vector<void*> a_out = {a[5].bytes(), a[6].bytes()};
  ASSERT_TRUE(call.Run(a_in, a_out).ok());
  std::vector<DLTensor*> ref_out = {ref[5].ptr(), ref[6].ptr()};
  ASSERT_TRUE(m.Call(TEFL_OP_RMSNORM_BWD_ADD, in_of(ref), ref_out).ok());
  EXPECT_TRUE(a[5].SameBytes(ref[5]));
  // In place: dx written over add.
  std::vector<void*> in_place_out = {a[2].bytes(), a[6].bytes()};
  ASSERT_TRUE(call.Run(a_in, in_place_out).ok());
  EXPECT_TRUE(a[2].SameBytes(ref[5]));
}

TEST(PreparedCall, CApi) {
  RmsTensors t("c"), ref("c");
  const DLTensor* in[] = {t.x.ptr(), t.g.ptr()};
  DLTensor* out[] = {t.z.ptr(), t.rs.ptr()};
  tefl_prepared_call* call = nullptr;
  ASSERT_EQ(tefl_prepare_call(TEFL_OP_RMSNORM_FWD, in, 2, out, 2, nullptr, &call), nullptr);
  ASSERT_NE(call, nullptr);
  void* in_data[] = {t.x.bytes(), t.g.bytes()};
  void* out_data[] = {t.z.bytes(), t.rs.bytes()};
  ASSERT_EQ(tefl_prepared_call_run(call, in_data, 2, out_data, 2, nullptr), nullptr);
  ASSERT_TRUE(GetDefaultManager().Call(TEFL_OP_RMSNORM_FWD, ref.In(), ref.Out()).ok());
  EXPECT_TRUE(t.z.SameBytes(ref.z));
  tefl_status* e = tefl_prepared_call_run(call, in_data, 1, out_data, 2, nullptr);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(tefl_status_code_of(e), TEFL_INVALID_ARGUMENT);
  tefl_status_free(e);
  e = tefl_prepared_call_run(nullptr, in_data, 2, out_data, 2, nullptr);
  ASSERT_NE(e, nullptr);
  tefl_status_free(e);
  // NULL data arrays and negative counts: errors naming the op and what is wrong, nothing read or written.
  const struct {
    void* const* in;
    int32_t nin;
    void* const* out;
    int32_t nout;
    const char* says;
  } bad[] = {
      {nullptr, 2, out_data, 2, "tefl_prepared_call_run: rmsnorm_fwd: input_data is NULL, expected 2 data pointers"},
      {in_data, 2, nullptr, 2, "tefl_prepared_call_run: rmsnorm_fwd: output_data is NULL, expected 2 data pointers"},
      {in_data, -1, out_data, 2, "tefl_prepared_call_run: rmsnorm_fwd: num_inputs is -1, expected >= 0"},
      {in_data, 2, out_data, -3, "tefl_prepared_call_run: rmsnorm_fwd: num_outputs is -3, expected >= 0"},
  };
  for (const auto& b : bad) {
    e = tefl_prepared_call_run(call, b.in, b.nin, b.out, b.nout, nullptr);
    ASSERT_NE(e, nullptr) << b.says;
    EXPECT_EQ(tefl_status_code_of(e), TEFL_INVALID_ARGUMENT);
    EXPECT_STREQ(tefl_status_message(e), b.says);
    tefl_status_free(e);
  }
  e = tefl_call(TEFL_OP_RMSNORM_FWD, in, -2, out, 2, nullptr, nullptr);
  ASSERT_NE(e, nullptr);
  EXPECT_STREQ(tefl_status_message(e), "tefl_call: rmsnorm_fwd: num_inputs is -2, expected >= 0");
  tefl_status_free(e);
  tefl_prepared_call_free(call);
  tefl_prepared_call_free(nullptr);
  tefl_prepared_call* never = nullptr;
  Tensor bad_g(DType::kF32, {3});
  const DLTensor* bad_in[] = {t.x.ptr(), bad_g.ptr()};
  e = tefl_prepare_call(TEFL_OP_RMSNORM_FWD, bad_in, 2, out, 2, nullptr, &never);
  ASSERT_NE(e, nullptr);
  EXPECT_EQ(never, nullptr);
  tefl_status_free(e);
}

}  // namespace
}  // namespace tefl
