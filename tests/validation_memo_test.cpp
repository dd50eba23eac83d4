// The per-thread validation memo must be invisible: for any sequence of calls
// it accepts exactly what ValidateCall accepts, with the same key, and
// reports ValidateCall's errors.
#include <gtest/gtest.h>

#include <cstring>
#include <random>

#include "core/catalogue.h"
#include "core/validate.h"
#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

// An invalid call: the memo (holding a remembered entry) reports exactly
// the full validation's error, never a read through what it compares.
void ExpectMemoErrorIsFullError(const OpSchema& op, const CallArgs& args, ValidationMemo* memo) {
  SigKey key;
  tefl_status* full = ValidateCall(op, args, &key);
  tefl_status* memoed = ValidateCallMemo(op, args, &key, memo);
  ASSERT_NE(full, nullptr);
  ASSERT_NE(memoed, nullptr);
  EXPECT_STREQ(tefl_status_message(full), tefl_status_message(memoed));
  tefl_status_free(full);
  tefl_status_free(memoed);
}

// A pool of tensors the random calls draw from: two shapes, several dtypes,
// and views that alias each other, so that valid and invalid calls mix.
struct Pool {
  std::vector<Tensor> owned;
  std::vector<DLTensor> views;
  std::vector<std::vector<int64_t>> shapes, strides;
  Pool() {
    owned.reserve(32);
    shapes = {{4, 8}, {8}, {4}, {2, 2, 8}, {7}, {4, 7}};
    for (DType dt : {DType::kF32, DType::kBF16, DType::kF16, DType::kI32}) {
      owned.emplace_back(dt, std::vector<int64_t>{4, 8});
      owned.emplace_back(dt, std::vector<int64_t>{8});
    }
    owned.emplace_back(DType::kF32, std::vector<int64_t>{4});
    owned.emplace_back(DType::kF32, std::vector<int64_t>{4});
    strides = {{8, 1}, {16, 1}};
  }
  // A random view: a pooled buffer with a random shape from `shapes`, maybe
  // strided, maybe shifted, maybe NULL data.
  DLTensor Random(std::mt19937& rng) {
    Tensor& base = owned[rng() % owned.size()];
    DLTensor t = base.dl();
    const auto& shape = shapes[rng() % shapes.size()];
    t.shape = const_cast<int64_t*>(shape.data());
    t.ndim = int(shape.size());
    switch (rng() % 10) {
      case 0:
        t.data = nullptr;
        break;
      case 1:
        t.byte_offset = 2;
        break;  // misaligned for 4-byte types
      case 2:
        if (t.ndim == 2) t.strides = strides[rng() % 2].data();
        break;
      case 3:
        t.device.device_type = kDLCUDA;
        break;
      default:
        break;
    }
    return t;
  }
};

TEST(ValidationMemo, AgreesWithFullValidationOnRandomCalls) {
  std::mt19937 rng(1234);
  Pool pool;
  auto memo = std::make_unique<ValidationMemo>();
  int accepted = 0, rejected = 0;
  for (int iter = 0; iter < 20000; ++iter) {
    const OpSchema& op = *FindOp(iter % 3 == 0 ? TEFL_OP_LAYERNORM_BWD : TEFL_OP_RMSNORM_FWD);
    const int n = int(op.inputs.size() + op.outputs.size());
    // Mostly a fixed well-formed call, mutated in one or two places.
    std::vector<DLTensor> ts(static_cast<size_t>(n));
    const bool rms = op.id == TEFL_OP_RMSNORM_FWD;
    // rmsnorm_fwd: x0 g1 -> z2 rs3; layernorm_bwd: dz0 x1 mu2 rs3 g4 -> dx5 dg6 db7
    const int big[] = {0, 1, 5}, vec8[] = {4, 6, 7};
    for (int i = 0; i < n; ++i) ts[size_t(i)] = pool.owned[size_t(8 + (i % 2))].dl();  // [4] f32 default
    auto assign = [&](int i, size_t owned_index) { ts[size_t(i)] = pool.owned[owned_index].dl(); };
    if (rms) {
      assign(0, 0);  // x f32 [4, 8]
      assign(1, 1);  // gamma f32 [8]
      assign(2, 2);  // z bf16 [4, 8]
      assign(3, 8);  // rsigma f32 [4]
    } else {
      for (int i : big) assign(i, i == 1 ? 4 : (i == 0 ? 0 : 2));  // dz f32, x f16, dx bf16
      assign(2, 8);
      assign(3, 9);
      for (int i : vec8) assign(i, i == 4 ? 1 : (i == 6 ? 3 : 5));
    }
    const int mutations = int(rng() % 3);
    for (int k = 0; k < mutations; ++k) ts[size_t(rng() % size_t(n))] = pool.Random(rng);
    std::vector<const DLTensor*> in;
    std::vector<DLTensor*> out;
    for (int i = 0; i < n; ++i) {
      if (i < int(op.inputs.size())) {
        in.push_back(&ts[size_t(i)]);
      } else {
        out.push_back(&ts[size_t(i)]);
      }
    }
    tefl_norm_fwd_attrs fa{TEFL_NORM_FWD_ATTRS_STRUCT_SIZE, rng() % 7 == 0 ? -1.0f : 1e-5f, 0, 0};
    tefl_norm_bwd_attrs ba{TEFL_NORM_BWD_ATTRS_STRUCT_SIZE, int32_t(rng() % 5 == 0), 0};
    const CallArgs args{in.data(), int32_t(in.size()), out.data(), int32_t(out.size()),
                        rms ? static_cast<const void*>(&fa) : static_cast<const void*>(&ba)};
    SigKey k_full{}, k_memo{};
    tefl_status* e_full = ValidateCall(op, args, &k_full);
    tefl_status* e_memo = ValidateCallMemo(op, args, &k_memo, memo.get());
    ASSERT_EQ(e_full == nullptr, e_memo == nullptr)
        << "iteration " << iter << ": " << tefl_status_message(e_full ? e_full : e_memo);
    if (e_full) {
      ASSERT_STREQ(tefl_status_message(e_full), tefl_status_message(e_memo)) << "iteration " << iter;
      ++rejected;
    } else {
      ASSERT_TRUE(k_full == k_memo) << "iteration " << iter;
      ++accepted;
    }
    tefl_status_free(e_full);
    tefl_status_free(e_memo);
  }
  // Both outcomes must be well represented for the comparison to mean much.
  EXPECT_GT(accepted, 2000);
  EXPECT_GT(rejected, 2000);
}

// A remembered call with new pointers is checked again for what pointers
// decide: NULL data, alignment, overlap.
TEST(ValidationMemo, PointerChecksRunOnEveryHit) {
  OpManager mgr;
  Tensor x(DType::kF32, {4, 8}), g(DType::kF32, {8}), z(DType::kF32, {4, 8}), rs(DType::kF32, {4});
  x.Uniform("x");
  g.Uniform("g");
  ASSERT_TRUE(testing::CallOp(mgr, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());
  ASSERT_TRUE(testing::CallOp(mgr, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok());  // remembered now
  DLTensor zv = z.dl();
  const DLTensor* in[] = {x.ptr(), g.ptr()};
  DLTensor* out[] = {&zv, rs.ptr()};
  zv.data = nullptr;
  EXPECT_NE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).message().find("data is NULL"), std::string::npos);
  zv.data = x.bytes();  // z over x
  EXPECT_NE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).message().find("overlaps 'x' (input 0)"), std::string::npos);
  zv.data = z.bytes();
  zv.byte_offset = 1;
  EXPECT_NE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).message().find("not aligned"), std::string::npos);
  zv.byte_offset = 0;
  // The same shape array with new values is a new call.
  int64_t shape[2] = {4, 8};
  zv.shape = shape;
  ASSERT_TRUE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).ok());
  shape[1] = 7;
  EXPECT_NE(mgr.Call(TEFL_OP_RMSNORM_FWD, in, out).message().find("expected shape [4, 8]"), std::string::npos);
}

}  // namespace
}  // namespace tefl

namespace tefl {
namespace {

// A slot remembered as absent (an optional input given as NULL) does not
// match a present tensor later, however zeroed that tensor is.
TEST(ValidationMemo, AbsentSlotDoesNotMatchAPresentTensor) {
  auto memo = std::make_unique<ValidationMemo>();
  const OpSchema& op = *FindOp(TEFL_OP_FUSED_ROPE_FORWARD);
  Tensor x(DType::kF32, {4, 1, 2, 8}), freqs(DType::kF32, {4, 1, 1, 8}), out(DType::kF32, {4, 1, 2, 8});
  tefl_rope_attrs attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0};
  const DLTensor* in[] = {x.ptr(), freqs.ptr(), nullptr, nullptr};
  DLTensor* outs[] = {out.ptr()};
  const CallArgs args{in, 4, outs, 1, &attrs};
  SigKey key;
  ASSERT_EQ(ValidateCallMemo(op, args, &key, memo.get()), nullptr);
  ASSERT_EQ(ValidateCallMemo(op, args, &key, memo.get()), nullptr);  // remembered
  DLTensor zeroed{};                                                 // present, but dtype (0, 0, 0) and rank 0
  const DLTensor* in2[] = {x.ptr(), freqs.ptr(), &zeroed, nullptr};
  ExpectMemoErrorIsFullError(op, CallArgs{in2, 4, outs, 1, &attrs}, memo.get());
}

// A NULL shape (rank > 0) after a remembered call with the same metadata is
// the full validation's error, not a read through NULL: the memo compares
// shapes, so it must not take a NULL shape for a remembered one.
TEST(ValidationMemo, NullShapeAfterARememberedCallIsAnError) {
  OpManager mgr;
  Tensor x(DType::kF32, {2, 8}), y(DType::kF32, {2, 8});
  x.Uniform("x");
  DLTensor xv = x.dl();
  const DLTensor* in[] = {&xv};
  DLTensor* out[] = {y.ptr()};
  ASSERT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());
  ASSERT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());  // remembered
  xv.shape = nullptr;
  Status s = mgr.Call(TEFL_OP_GELU, in, out);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(s.message(), "gelu: argument 'input' (input 0): shape is NULL");
  // The same through the C entry point (its own thread memo is the same one).
  tefl_status* c = tefl_call(TEFL_OP_GELU, in, 1, out, 1, nullptr, nullptr);
  EXPECT_EQ(tefl_status_code_of(c), TEFL_INVALID_ARGUMENT);
  EXPECT_STREQ(tefl_status_message(c), "gelu: argument 'input' (input 0): shape is NULL");
  tefl_status_free(c);
  // An output's NULL shape, and the memo directly against ValidateCall.
  xv.shape = x.dl().shape;
  ASSERT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());
  DLTensor yv = y.dl();
  yv.shape = nullptr;
  DLTensor* out_null[] = {&yv};
  EXPECT_EQ(mgr.Call(TEFL_OP_GELU, in, out_null).message(), "gelu: argument 'output' (output 0): shape is NULL");
  auto memo = std::make_unique<ValidationMemo>();
  const OpSchema& op = *FindOp(TEFL_OP_GELU);
  SigKey key;
  const CallArgs good{in, 1, out, 1, nullptr};
  ASSERT_EQ(ValidateCallMemo(op, good, &key, memo.get()), nullptr);
  ExpectMemoErrorIsFullError(op, CallArgs{in, 1, out_null, 1, nullptr}, memo.get());
}

// Strided calls remembered, then the same tensor without strides: a new
// call (compact, valid), never a read through the NULL strides.
TEST(ValidationMemo, NullStridesAfterARememberedStridedCall) {
  OpManager mgr;
  Tensor x(DType::kF32, {2, 8}), y(DType::kF32, {2, 8});
  x.Uniform("x");
  int64_t strides[2] = {8, 1};
  DLTensor xv = x.dl();
  xv.strides = strides;
  const DLTensor* in[] = {&xv};
  DLTensor* out[] = {y.ptr()};
  ASSERT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());
  ASSERT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());  // remembered
  xv.strides = nullptr;
  EXPECT_TRUE(mgr.Call(TEFL_OP_GELU, in, out).ok());
  xv.shape = nullptr;  // and both NULL
  EXPECT_EQ(mgr.Call(TEFL_OP_GELU, in, out).message(), "gelu: argument 'input' (input 0): shape is NULL");
}

// Strides whose last byte offset is INT64_MAX: an error, not signed overflow
// (UBSan runs this in CI).
TEST(ValidationLimits, StrideReachingInt64Max) {
  OpManager mgr;
  Tensor x(DType::kF32, {2, 1, 1, 2}), freqs(DType::kF32, {4, 1, 1, 2}), out(DType::kF32, {2, 1, 1, 2});
  int64_t strides[4] = {INT64_MAX, 2, 2, 1};
  DLTensor xv = x.dl();
  xv.strides = strides;
  tefl_rope_attrs attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0};
  const DLTensor* in[] = {&xv, freqs.ptr(), nullptr, nullptr};
  DLTensor* outs[] = {out.ptr()};
  Status s = mgr.Call(TEFL_OP_FUSED_ROPE_FORWARD, in, outs, &attrs);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("address beyond 2^62 bytes"), std::string::npos) << s.message();
}

TEST(ValidationLimits, DeviceTypeOutOfRange) {
  OpManager mgr;
  Tensor x(DType::kF32, {2, 8}), g(DType::kF32, {8}), z(DType::kF32, {2, 8}), rs(DType::kF32, {2});
  const int32_t bad_type = 257;  // written as a caller from C could (not a DLDeviceType value)
  for (Tensor* t : {&x, &g, &z, &rs}) std::memcpy(&t->dl().device.device_type, &bad_type, sizeof(bad_type));
  Status s = testing::CallOp(mgr, "rmsnorm_fwd", {&x, &g}, {&z, &rs});
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("device type 257 is out of range"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace tefl
