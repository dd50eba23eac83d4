// The RoPE schemas (fused_rope_forward/backward, aliases rope_fwd/rope_bwd;
// fused_qkv_rope_forward/backward): calls are validated like every op, the
// aliases work everywhere a name is taken, and the contents of cu_seqlens and
// start_positions are checked on every call (validation-memo hits too).
#include <gtest/gtest.h>

#include "core/catalogue.h"
#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

struct RopeCall {
  Tensor x, freqs, start, cu, out;
  tefl_rope_attrs attrs{TEFL_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0};
  bool with_start = false, with_cu = false;
  RopeCall(std::vector<int64_t> shape, int64_t s_max, int64_t d2)
      : x(DType::kBF16, shape),
        freqs(DType::kF32, {s_max, 1, 1, d2}),
        start(DType::kI32, {2}),
        cu(DType::kI32, {3}),
        out(DType::kBF16, shape) {}
  Status Run(OpManager& m, const char* op = "fused_rope_forward") {
    const DLTensor* in[] = {x.ptr(), freqs.ptr(), with_start ? start.ptr() : nullptr, with_cu ? cu.ptr() : nullptr};
    DLTensor* o[] = {out.ptr()};
    return m.Call(op, in, o, &attrs);
  }
};

TEST(RopeSchema, AliasesNameTheCanonicalOps) {
  EXPECT_EQ(FindOp("rope_fwd"), FindOp("fused_rope_forward"));
  EXPECT_EQ(FindOp("rope_bwd"), FindOp("fused_rope_backward"));
  EXPECT_EQ(tefl_op_id("rope_fwd"), TEFL_OP_FUSED_ROPE_FORWARD);
  std::vector<std::string> warnings;
  SelectionPolicy p = SelectionPolicy::FromEnv(
      &warnings, testing::EnvFrom({{"TE_FL_PER_OP", "rope_fwd=flagos|reference;rope_bwd=vendor:acme"}}));
  EXPECT_TRUE(warnings.empty()) << ::testing::PrintToString(warnings);
  ASSERT_EQ(p.per_op_order().count("fused_rope_forward"), 1u);
  EXPECT_EQ(p.OrderFor("rope_fwd").size(), 2u);
  EXPECT_EQ(p.OrderFor("fused_rope_backward").front().ToString(), "vendor:acme");
}

TEST(RopeSchema, ValidCallsRun) {
  OpManager m;
  RopeCall sbhd({8, 2, 4, 64}, 8, 32);
  sbhd.x.Uniform("x");
  Status s = sbhd.Run(m, "rope_fwd");
  EXPECT_TRUE(s.ok()) << s.ToString();
  RopeCall thd({10, 4, 64}, 16, 64);
  thd.attrs.qkv_format = TEFL_QKV_THD;
  thd.with_cu = true;
  thd.cu.set(0, 0);
  thd.cu.set(1, 4);
  thd.cu.set(2, 10);
  s = thd.Run(m, "rope_bwd");
  EXPECT_TRUE(s.ok()) << s.ToString();
  // bshd may be strided (a view of a packed qkv tensor).
  RopeCall bshd({2, 8, 4, 64}, 8, 64);
  bshd.attrs.qkv_format = TEFL_QKV_BSHD;
  Tensor packed(DType::kBF16, {2, 8, 12, 64});  // q, k, v heads side by side
  int64_t strides[] = {8 * 12 * 64, 12 * 64, 64, 1};
  bshd.x.dl().data = packed.bytes();
  bshd.x.dl().strides = strides;
  s = bshd.Run(m);
  EXPECT_TRUE(s.ok()) << s.ToString();
}

// cu_seqlens contents are not part of the validation memo: the same shapes
// with bad contents are rejected after a good call was remembered.
TEST(RopeSchema, ContentChecksRunOnEveryCall) {
  OpManager m;
  RopeCall thd({10, 4, 64}, 16, 64);
  thd.attrs.qkv_format = TEFL_QKV_THD;
  thd.with_cu = true;
  thd.cu.set(0, 0);
  thd.cu.set(1, 4);
  thd.cu.set(2, 10);
  ASSERT_TRUE(thd.Run(m).ok());
  ASSERT_TRUE(thd.Run(m).ok());  // a memo hit
  thd.cu.set(1, 11);             // past the end: not non-decreasing
  Tensor before = thd.out;
  Status s = thd.Run(m);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find("argument 'cu_seqlens' (input 3): expected non-decreasing values"), std::string::npos)
      << s.message();
  EXPECT_TRUE(thd.out.SameBytes(before));
  // start_positions past freqs on a remembered sbhd call.
  RopeCall sbhd({8, 2, 4, 64}, 12, 64);
  sbhd.with_start = true;
  sbhd.start.set(0, 0);
  sbhd.start.set(1, 4);
  ASSERT_TRUE(sbhd.Run(m).ok());
  sbhd.start.set(1, 5);
  s = sbhd.Run(m);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find("start_positions[1] = 5 puts sequence 1 at positions up to 12, past the 12 rows"),
            std::string::npos)
      << s.message();
}

void ExpectInvalid(RopeCall& c, const std::string& needle) {
  OpManager m;
  Tensor before = c.out;
  Status s = c.Run(m);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  EXPECT_TRUE(c.out.SameBytes(before));
}

TEST(RopeSchema, BadInputsNameArgumentAndExpectation) {
  {
    RopeCall c({8, 2, 4, 64}, 8, 30 + 1);  // odd d2
    ExpectInvalid(c, "argument 'freqs' (input 1): expected an even last dim d2 <= d = 64");
  }
  {
    RopeCall c({8, 2, 4, 64}, 8, 66);  // d2 > d
    ExpectInvalid(c, "expected an even last dim d2 <= d = 64");
  }
  {
    RopeCall c({8, 2, 4, 64}, 4, 64);  // too few frequency rows
    ExpectInvalid(c, "expected at least 8 rows");
  }
  {
    RopeCall c({8, 2, 64}, 8, 64);  // rank 3 with sbhd
    ExpectInvalid(c, "argument 'input' (input 0): expected rank 4 for qkv_format sbhd");
  }
  {
    RopeCall c({10, 4, 64}, 16, 64);
    c.attrs.qkv_format = TEFL_QKV_THD;  // thd without cu_seqlens
    ExpectInvalid(c, "argument 'cu_seqlens' (input 3): is required for qkv_format thd");
  }
  {
    RopeCall c({8, 2, 4, 64}, 8, 64);
    c.with_cu = true;  // cu_seqlens with sbhd
    ExpectInvalid(c, "must be NULL for qkv_format sbhd");
  }
  {
    RopeCall c({8, 3, 4, 64}, 8, 64);
    c.with_start = true;  // start_positions of length 2 for batch 3
    ExpectInvalid(c, "argument 'start_positions' (input 2): expected shape [3]");
  }
  {
    RopeCall c({8, 2, 4, 64}, 16, 64);
    c.attrs.cp_size = 2;
    c.attrs.cp_rank = 2;
    ExpectInvalid(c, "attribute 'cp_rank' must be < cp_size (2), got 2");
  }
  {
    RopeCall c({8, 2, 4, 64}, 8, 64);
    c.attrs.qkv_format = 3;
    ExpectInvalid(c, "attribute 'qkv_format' must be in [0, 2], got 3");
  }
  {
    RopeCall c({8, 2, 4, 64}, 8, 64);
    c.out = Tensor(DType::kBF16, {8, 2, 4, 32});
    ExpectInvalid(c, "argument 'output' (output 0): expected shape [8, 2, 4, 64]");
  }
}

struct QkvCall {
  Tensor qkv, qf, kf, start, q, k, v;
  tefl_qkv_rope_attrs attrs{TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0, 4 * 64, 64, 64};
  bool with_start = false;
  // sbhd [s, b, h, (4 + 1 + 1) * 64]: 4 q heads, 1 k and 1 v head per group.
  QkvCall(int64_t s, int64_t b, int64_t h, int64_t rows)
      : qkv(DType::kBF16, {s, b, h, 6 * 64}),
        qf(DType::kF32, {rows, 1, 1, 64}),
        kf(DType::kF32, {rows, 1, 1, 64}),
        start(DType::kI32, {b}),
        q(DType::kBF16, {s, b, 4 * h, 64}),
        k(DType::kBF16, {s, b, h, 64}),
        v(DType::kBF16, {s, b, h, 64}) {}
  Status Fwd(OpManager& m) {
    const DLTensor* in[] = {qkv.ptr(), qf.ptr(), kf.ptr(), with_start ? start.ptr() : nullptr};
    DLTensor* o[] = {q.ptr(), k.ptr(), v.ptr()};
    return m.Call("fused_qkv_rope_forward", in, o, &attrs);
  }
  Status Bwd(OpManager& m) {
    const DLTensor* in[] = {q.ptr(), k.ptr(), v.ptr(), qf.ptr(), kf.ptr(), with_start ? start.ptr() : nullptr};
    DLTensor* o[] = {qkv.ptr()};
    return m.Call("fused_qkv_rope_backward", in, o, &attrs);
  }
};

TEST(QkvRopeSchema, ValidCallsRun) {
  OpManager m;
  QkvCall c(8, 2, 2, 8);
  c.qkv.Uniform("qkv");
  Status s = c.Fwd(m);
  EXPECT_TRUE(s.ok()) << s.ToString();
  s = c.Bwd(m);
  EXPECT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(tefl_op_id("fused_qkv_rope_forward"), TEFL_OP_FUSED_QKV_ROPE_FORWARD);
  EXPECT_EQ(tefl_op_id("fused_qkv_rope_backward"), TEFL_OP_FUSED_QKV_ROPE_BACKWARD);
}

void ExpectQkvInvalid(QkvCall& c, bool backward, const std::string& needle) {
  OpManager m;
  Tensor q = c.q, k = c.k, v = c.v, qkv = c.qkv;
  Status s = backward ? c.Bwd(m) : c.Fwd(m);
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << s.ToString();
  EXPECT_NE(s.message().find(needle), std::string::npos) << s.message();
  if (backward) {
    EXPECT_TRUE(c.qkv.SameBytes(qkv));
  } else {
    EXPECT_TRUE(c.q.SameBytes(q) && c.k.SameBytes(k) && c.v.SameBytes(v));
  }
}

TEST(QkvRopeSchema, BadInputsNameArgumentAndExpectation) {
  {
    QkvCall c(8, 2, 2, 8);
    c.attrs = tefl_qkv_rope_attrs{TEFL_QKV_ROPE_ATTRS_STRUCT_SIZE, TEFL_QKV_SBHD, 0, 1, 0, 0, 0, 0};
    ExpectQkvInvalid(c, false, "fused_qkv_rope_forward: attribute 'q_split' must be in [1, 2147483647], got 0");
  }
  {
    QkvCall c(8, 2, 2, 8);
    c.attrs.v_split = 128;
    ExpectQkvInvalid(c, false, "argument 'qkv' (input 0): expected last dim q_split + k_split + v_split");
  }
  {
    QkvCall c(8, 2, 2, 8);
    c.q = Tensor(DType::kBF16, {8, 2, 4, 64});
    ExpectQkvInvalid(c, false, "argument 'q' (output 0): expected shape [8, 2, 8, 64]");
  }
  {
    QkvCall c(8, 2, 2, 8);
    c.q = Tensor(DType::kBF16, {8, 2, 8, 48});  // 48 does not divide 256
    ExpectQkvInvalid(c, true, "argument 'q_grads' (input 0): expected a head dim d (last dim) >= 1 dividing");
  }
  {
    QkvCall c(8, 2, 2, 4);  // freqs rows < s
    ExpectQkvInvalid(c, false, "argument 'q_freqs' (input 1): expected at least 8 rows");
  }
  {
    QkvCall c(8, 2, 2, 16);
    c.kf = Tensor(DType::kF32, {16, 1, 1, 32});
    ExpectQkvInvalid(c, true, "argument 'k_freqs' (input 4): expected d2 = 64 (that of 'q_freqs')");
  }
  {
    QkvCall c(7, 2, 2, 16);
    c.attrs.cp_size = 2;
    ExpectQkvInvalid(c, false, "argument 'qkv' (input 0): expected an even sequence length with cp_size 2");
  }
  {
    QkvCall c(8, 2, 2, 16);
    c.attrs.cp_size = 2;
    c.attrs.cp_rank = 3;
    ExpectQkvInvalid(c, true, "attribute 'cp_rank' must be < cp_size (2), got 3");
  }
  {
    QkvCall c(8, 2, 2, 16);
    c.with_start = true;
    c.start = Tensor(DType::kI32, {3});
    ExpectQkvInvalid(c, false, "argument 'start_positions' (input 3): expected shape [2] (the batch size), got [3]");
  }
  {
    QkvCall c(8, 2, 2, 16);
    c.v = Tensor(DType::kF32, {8, 2, 2, 64});
    ExpectQkvInvalid(c, false, "argument 'v' (output 2): expected dtype bfloat16 (that of 'qkv'), got float32");
  }
}

}  // namespace
}  // namespace tefl
