// OpRegistry: TE-FL's registry behaviours (duplicate ids, vendor names,
// snapshot, clear) and the C registrar.
#include <gtest/gtest.h>

#include "test_support.h"

namespace tefl {
namespace {

Status Ok(const tefl_call_frame&) { return Status::OK(); }

OpImpl Impl(const char* op, const char* id, BackendImplKind kind = BackendImplKind::DEFAULT, const char* vendor = "") {
  return OpImpl::FromFunction(op, id, kind, vendor, 0, Ok);
}

TEST(Registry, RegisterAndQuery) {
  OpRegistry r;
  ASSERT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "default.a")).ok());
  ASSERT_TRUE(r.RegisterImpl(Impl("layernorm_fwd", "default.a")).ok());  // same id, other op: fine
  ASSERT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "vendor.v", BackendImplKind::VENDOR, "v")).ok());
  EXPECT_EQ(r.GetImplementations("rmsnorm_fwd").size(), 2u);
  EXPECT_TRUE(r.GetImplementation("rmsnorm_fwd", "vendor.v").has_value());
  EXPECT_FALSE(r.GetImplementation("rmsnorm_fwd", "vendor.none").has_value());
  EXPECT_EQ(r.ListOperators(), (std::vector<std::string>{"layernorm_fwd", "rmsnorm_fwd"}));
  EXPECT_EQ(r.ImplIds(), (std::vector<std::string>{"default.a", "vendor.v"}));
  EXPECT_EQ(r.Snapshot().size(), 3u);
  r.Clear();
  EXPECT_TRUE(r.Snapshot().empty());
  EXPECT_TRUE(r.ListOperators().empty());
}

TEST(Registry, Rejections) {
  OpRegistry r;
  ASSERT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "default.a")).ok());
  Status s = r.RegisterImpl(Impl("rmsnorm_fwd", "default.a"));
  EXPECT_EQ(s.code(), TEFL_ALREADY_EXISTS);
  EXPECT_NE(s.message().find("already has impl_id 'default.a'"), std::string::npos);
  s = r.RegisterImpl(Impl("rmsnorm_fwd", "vendor.x", BackendImplKind::VENDOR, ""));
  EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT);
  EXPECT_NE(s.message().find("needs a vendor name"), std::string::npos);
  EXPECT_EQ(r.RegisterImpl(Impl("no_such_op", "default.a")).code(), TEFL_NOT_FOUND);
  EXPECT_EQ(r.RegisterImpl(Impl("gelu_fwd", "default.a")).message(),
            "register_impl(default.a): unknown op 'gelu_fwd'; did you mean 'gelu'?");
  EXPECT_EQ(r.RegisterImpl(Impl("", "default.a")).message(), "register_impl(default.a): op_name is empty (or NULL)");
  EXPECT_EQ(r.RegisterImpl(Impl("rmsnorm_fwd", "")).code(), TEFL_INVALID_ARGUMENT);
  OpImpl no_kernel = Impl("rmsnorm_fwd", "default.nok");
  no_kernel.kernel = nullptr;
  EXPECT_EQ(r.RegisterImpl(no_kernel).code(), TEFL_INVALID_ARGUMENT);
  OpImpl no_device = Impl("rmsnorm_fwd", "default.nod");
  no_device.device_mask = 0;
  EXPECT_EQ(r.RegisterImpl(no_device).code(), TEFL_INVALID_ARGUMENT);
  EXPECT_EQ(r.GetImplementations("rmsnorm_fwd").size(), 1u);
}

// impl_id is "kind.name": the prefix matches the kind, the name is not empty
// and can be written in a TE_FL_PER_OP token.
TEST(Registry, ImplIdIsKindDotName) {
  OpRegistry r;
  EXPECT_EQ(r.RegisterImpl(Impl("rmsnorm_fwd", "vendor.fast")).message(),
            "register_impl(vendor.fast): impl_id must be 'default.NAME' for kind flagos, NAME made of letters, digits, "
            "'_', '-' and '.'");
  EXPECT_EQ(r.RegisterImpl(Impl("rmsnorm_fwd", "default.fast", BackendImplKind::VENDOR, "v")).message(),
            "register_impl(default.fast): impl_id must be 'vendor.NAME' for kind vendor, NAME made of letters, digits, "
            "'_', '-' and '.'");
  for (const char* bad : {"reference", "reference.", "reference.a|b", "reference.a b", "reference.a;b", "ref.a"}) {
    const Status s = r.RegisterImpl(Impl("rmsnorm_fwd", bad, BackendImplKind::REFERENCE));
    EXPECT_EQ(s.code(), TEFL_INVALID_ARGUMENT) << bad;
    EXPECT_NE(s.message().find("impl_id must be 'reference.NAME' for kind reference"), std::string::npos) << bad;
  }
  EXPECT_TRUE(r.GetImplementations("rmsnorm_fwd").empty());
  EXPECT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "reference.my-ref_2.v1", BackendImplKind::REFERENCE)).ok());
  EXPECT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "vendor.sm90", BackendImplKind::VENDOR, "acme")).ok());
}

TEST(Registry, RegisterManyIsAllOrNothing) {
  OpRegistry r;
  Status s = r.RegisterMany(
      {Impl("rmsnorm_fwd", "default.a"), Impl("rmsnorm_fwd", "default.b"), Impl("rmsnorm_fwd", "default.a")});
  EXPECT_EQ(s.code(), TEFL_ALREADY_EXISTS);
  EXPECT_TRUE(r.Snapshot().empty());
  ASSERT_TRUE(r.RegisterMany({Impl("rmsnorm_fwd", "default.a"), Impl("rmsnorm_bwd", "default.a")}).ok());
  EXPECT_EQ(r.Snapshot().size(), 2u);
}

tefl_status* CKernel(const tefl_call_frame*, void*) { return nullptr; }

TEST(Registry, CRegistrarCopiesTheDescriptor) {
  OpRegistry r;
  tefl_registrar reg = r.Registrar();
  std::string op = "rmsnorm_fwd", id = "vendor.c", vendor = "cvendor";
  tefl_impl_desc d = {TEFL_IMPL_DESC_STRUCT_SIZE, op.c_str(), id.c_str(), TEFL_KIND_VENDOR, 7, vendor.c_str(),
                      TEFL_DEVICE_BIT(kDLCPU),    CKernel,    nullptr,    nullptr};
  ASSERT_EQ(reg.register_impl(reg.ctx, &d), nullptr);
  vendor = "overwritten";  // the registry must not keep the caller's pointers
  auto impl = r.GetImplementation("rmsnorm_fwd", "vendor.c");
  ASSERT_TRUE(impl.has_value());
  EXPECT_EQ(impl->vendor, "cvendor");
  EXPECT_EQ(impl->priority, 7);
  tefl_status* s = reg.register_impl(reg.ctx, &d);  // duplicate
  EXPECT_EQ(tefl_status_code_of(s), TEFL_ALREADY_EXISTS);
  tefl_status_free(s);
  // A descriptor from an older header without the later fields: defaults.
  tefl_impl_desc old = d;
  old.impl_id = "vendor.old";
  old.struct_size = offsetof(tefl_impl_desc, supports);
  old.supports = reinterpret_cast<tefl_supports_fn>(0x1);  // beyond struct_size: must be ignored
  ASSERT_EQ(reg.register_impl(reg.ctx, &old), nullptr);
  EXPECT_EQ(r.GetImplementation("rmsnorm_fwd", "vendor.old")->supports, nullptr);
  s = reg.register_impl(reg.ctx, nullptr);
  EXPECT_EQ(tefl_status_code_of(s), TEFL_INVALID_ARGUMENT);
  tefl_status_free(s);
}

TEST(Registry, ManagerAddsBuiltinsOnceAndKeepsUserIds) {
  OpRegistry r;
  ASSERT_TRUE(r.RegisterImpl(Impl("rmsnorm_fwd", "default.portable")).ok());  // user's, same id as a built-in
  OpManager m1(&r);
  m1.EnsureInitialized();
  OpManager m2(&r);
  m2.EnsureInitialized();
  auto impls = r.GetImplementations("rmsnorm_fwd");
  ASSERT_EQ(impls.size(), 2u);  // the user's default.portable + reference.cpp
  EXPECT_EQ(impls[0].origin, "user");
  EXPECT_EQ(impls[1].impl_id, "reference.cpp");
  EXPECT_EQ(impls[1].origin, "builtin");
  EXPECT_EQ(r.GetImplementations("layernorm_fwd").size(), 2u);
}

}  // namespace
}  // namespace tefl
