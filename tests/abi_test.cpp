// The ABI's promises: append-only layouts, struct_size handling for older
// callers, the catalogue's completeness and the host services table.
#include <gtest/gtest.h>

#include "core/catalogue.h"
#include "core/validate.h"
#include "test_support.h"

namespace tefl {
namespace {

TEST(Abi, VersionAndHostServices) {
  const tefl_host_services* host = tefl_host();
  EXPECT_EQ(host->abi_major, uint32_t(TEFL_ABI_MAJOR));
  EXPECT_EQ(host->abi_minor, uint32_t(TEFL_ABI_MINOR));
  EXPECT_EQ(host->struct_size, TEFL_HOST_SERVICES_STRUCT_SIZE);
  tefl_status* s = host->status_new(TEFL_RUNTIME_ERROR, "boom");
  EXPECT_EQ(host->status_code(s), TEFL_RUNTIME_ERROR);
  EXPECT_STREQ(host->status_message(s), "boom");
  host->status_free(s);
  EXPECT_EQ(host->status_new(TEFL_OK, "ignored"), nullptr);  // OK is NULL
  // A code the host does not know stays a failure, with a known code.
  for (int32_t unknown : {-1, int32_t(TEFL_ABI_MISMATCH) + 1, 1000}) {
    s = host->status_new(unknown, "from a newer plugin");
    ASSERT_NE(s, nullptr);
    EXPECT_EQ(host->status_code(s), TEFL_RUNTIME_ERROR);
    EXPECT_EQ(std::string(host->status_message(s)),
              "(unknown status code " + std::to_string(unknown) + ") from a newer plugin");
    host->status_free(s);
  }
  s = host->status_new(TEFL_ABI_MISMATCH, nullptr);  // the last known code is kept; NULL message is ""
  EXPECT_EQ(host->status_code(s), TEFL_ABI_MISMATCH);
  EXPECT_STREQ(host->status_message(s), "");
  host->status_free(s);
  EXPECT_GE(host->num_threads(), 1);
  ASSERT_NE(host->device_runtime, nullptr);
}

TEST(Abi, ParallelForCoversEveryIndexOnce) {
  std::vector<int> hits(1000, 0);
  auto body = [](void* ctx, int64_t b, int64_t e) {
    auto* h = static_cast<std::vector<int>*>(ctx);
    for (int64_t i = b; i < e; ++i) (*h)[size_t(i)]++;
  };
  tefl_host()->parallel_for(1000, 7, body, &hits);
  for (int h : hits) ASSERT_EQ(h, 1);
  tefl_host()->parallel_for(0, 1, body, &hits);  // nothing to do
}

TEST(Abi, CatalogueHasEveryIdAndFitsTheSignatureKey) {
  for (int32_t id = 0; id < TEFL_OP_COUNT_; ++id) {
    const OpSchema* op = FindOp(id);
    ASSERT_NE(op, nullptr) << "op id " << id << " has no schema";
    EXPECT_EQ(op->id, id);
    EXPECT_EQ(FindOp(op->name), op);
    EXPECT_LE(op->inputs.size() + op->outputs.size(), size_t(kMaxOpArgs)) << op->name;
    EXPECT_LE(op->attrs_size, kMaxAttrsSize) << op->name;
    int bits = 0;
    for (const AttrSchema& a : op->attrs) {
      bits += a.signature_bits;
      EXPECT_LE(a.offset + 4, op->attrs_size) << op->name << "." << a.name;
    }
    EXPECT_LE(bits, 64) << op->name;
    // Defaults struct has the full size in struct_size (ops without attrs:
    // size 0, no defaults, no attribute schema).
    if (op->attrs_size == 0) {
      EXPECT_EQ(op->attrs_defaults, nullptr) << op->name;
      EXPECT_TRUE(op->attrs.empty()) << op->name;
      continue;
    }
    size_t size;
    std::memcpy(&size, op->attrs_defaults, sizeof(size));
    EXPECT_EQ(size, op->attrs_size) << op->name;
  }
  EXPECT_EQ(tefl_op_id("layernorm_bwd"), TEFL_OP_LAYERNORM_BWD);
  EXPECT_EQ(tefl_op_id(nullptr), -1);
}

// An older caller passes a shorter attrs struct: the missing fields take
// their defaults; a newer caller's longer struct is read by prefix.
TEST(Abi, AttrsOfAnyStructSize) {
  const OpSchema& op = *FindOp(TEFL_OP_RMSNORM_FWD);
  alignas(16) char buffer[kMaxAttrsSize];
  tefl_status* err = nullptr;
  struct Old {
    size_t struct_size;
    float eps;
  } old{TEFL_STRUCT_SIZE(Old, eps), 0.5f};
  static_assert(TEFL_STRUCT_SIZE(Old, eps) < TEFL_NORM_FWD_ATTRS_STRUCT_SIZE);
  const auto* a = static_cast<const tefl_norm_fwd_attrs*>(NormalizeAttrs(op, &old, buffer, &err));
  ASSERT_EQ(err, nullptr);
  EXPECT_EQ(a->struct_size, TEFL_NORM_FWD_ATTRS_STRUCT_SIZE);
  EXPECT_FLOAT_EQ(a->eps, 0.5f);
  EXPECT_EQ(a->zero_centered_gamma, 0);
  struct Newer {
    tefl_norm_fwd_attrs base;
    int64_t future_field;
  } newer{{TEFL_STRUCT_SIZE(Newer, future_field), 0.25f, 1, 0}, 42};
  a = static_cast<const tefl_norm_fwd_attrs*>(NormalizeAttrs(op, &newer, buffer, &err));
  ASSERT_EQ(err, nullptr);
  EXPECT_FLOAT_EQ(a->eps, 0.25f);
  EXPECT_EQ(a->zero_centered_gamma, 1);
  a = static_cast<const tefl_norm_fwd_attrs*>(NormalizeAttrs(op, nullptr, buffer, &err));
  EXPECT_FLOAT_EQ(a->eps, 1e-5f);
  size_t bad = 3;
  EXPECT_EQ(NormalizeAttrs(op, &bad, buffer, &err), nullptr);
  ASSERT_NE(err, nullptr);
  EXPECT_NE(std::string(tefl_status_message(err)).find("struct_size"), std::string::npos);
  tefl_status_free(err);
}

TEST(Abi, CpuDeviceRuntime) {
  GetDefaultManager().EnsureInitialized();
  const tefl_device_runtime* rt = tefl_host()->device_runtime(kDLCPU);
  ASSERT_NE(rt, nullptr);
  EXPECT_STREQ(rt->name, "cpu");
  EXPECT_EQ(rt->device_count(rt->ctx), 1);
  void* p = nullptr;
  ASSERT_EQ(rt->alloc(rt->ctx, 0, 100, 64, &p), nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 64, 0u);
  const char src[4] = {1, 2, 3, 4};
  char back[4] = {0};
  ASSERT_EQ(rt->copy_to_device(rt->ctx, 0, p, src, 4, nullptr), nullptr);
  ASSERT_EQ(rt->copy_to_host(rt->ctx, 0, back, p, 4, nullptr), nullptr);
  EXPECT_EQ(std::memcmp(src, back, 4), 0);
  EXPECT_EQ(rt->stream_sync(rt->ctx, 0, nullptr), nullptr);
  rt->free(rt->ctx, 0, p);
  tefl_status* s = rt->alloc(rt->ctx, 1, 8, 8, &p);
  EXPECT_EQ(tefl_status_code_of(s), TEFL_INVALID_ARGUMENT);
  tefl_status_free(s);
}

TEST(Abi, HalfConversionsRoundToNearestEven) {
  EXPECT_EQ(FloatToBF16(1.0f), 0x3F80);
  // 1 + 2^-8 is halfway between bf16 1.0 and 1.0078125: ties to even (1.0).
  EXPECT_EQ(FloatToBF16(1.00390625f), 0x3F80);
  EXPECT_EQ(FloatToBF16(1.01171875f), 0x3F82);  // halfway, rounds up to even
  EXPECT_TRUE(std::isnan(BF16ToFloat(FloatToBF16(std::nanf("")))));
  EXPECT_EQ(FloatToF16(1.0f), 0x3C00);
  EXPECT_EQ(FloatToF16(65504.0f), 0x7BFF);
  EXPECT_EQ(FloatToF16(65520.0f), 0x7C00);        // overflow to inf
  EXPECT_EQ(FloatToF16(5.9604645e-8f), 0x0001);   // smallest subnormal
  EXPECT_EQ(FloatToF16(2.98023224e-8f), 0x0000);  // half of it: ties to even (0)
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const uint16_t v = uint16_t(h);
    if (const float f = F16ToFloat(v); !std::isnan(f)) {
      ASSERT_EQ(FloatToF16(f), v) << "fp16 round trip of " << h;
    }
    if (const float b = BF16ToFloat(v); !std::isnan(b)) {
      ASSERT_EQ(FloatToBF16(b), v) << "bf16 round trip of " << h;
    }
  }
}

}  // namespace
}  // namespace tefl
