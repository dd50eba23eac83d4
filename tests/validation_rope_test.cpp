// The RoPE schemas (fused_rope_forward/backward, aliases rope_fwd/rope_bwd):
// calls are validated like every op, and the aliases work everywhere a name
// is taken. Kernels arrive with the RoPE op family; until then a valid call
// reports that no implementation is registered.
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

TEST(RopeSchema, ValidCallsReachResolution) {
  OpManager m;
  RopeCall sbhd({8, 2, 4, 64}, 8, 32);
  Status s = sbhd.Run(m, "rope_fwd");
  // Valid: it gets past validation to resolution, which has nothing yet.
  EXPECT_EQ(s.code(), TEFL_UNSUPPORTED) << s.ToString();
  EXPECT_NE(s.message().find("fused_rope_forward: no implementation is registered"), std::string::npos);
  RopeCall thd({10, 4, 64}, 16, 64);
  thd.attrs.qkv_format = TEFL_QKV_THD;
  thd.with_cu = true;
  EXPECT_EQ(thd.Run(m, "rope_bwd").code(), TEFL_UNSUPPORTED);
  // bshd may be strided (a view of a packed qkv tensor).
  RopeCall bshd({2, 8, 4, 64}, 8, 64);
  bshd.attrs.qkv_format = TEFL_QKV_BSHD;
  Tensor packed(DType::kBF16, {2, 8, 12, 64});  // q, k, v heads side by side
  int64_t strides[] = {8 * 12 * 64, 12 * 64, 64, 1};
  bshd.x.dl().data = packed.bytes();
  bshd.x.dl().strides = strides;
  s = bshd.Run(m);
  EXPECT_EQ(s.code(), TEFL_UNSUPPORTED) << s.ToString();
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

}  // namespace
}  // namespace tefl
