// After fork() the child keeps a consistent registry (nothing registered
// twice) and a working thread pool (the parent's workers do not exist there).
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>

#include "test_support.h"

namespace tefl {
namespace {

using testing::Tensor;

int RowsCorrect(OpManager& m) {
  Tensor x(DType::kF32, {256, 512}), g(DType::kF32, {512}), z(DType::kF32, {256, 512}), rs(DType::kF32, {256});
  Tensor z_ref = z, rs_ref = rs;
  x.Uniform("x");
  g.Uniform("g");
  if (!testing::CallOp(m, "rmsnorm_fwd", {&x, &g}, {&z, &rs}).ok()) return 0;
  PolicyContext ref(GetPolicy().WithPrefer("reference"));
  if (!testing::CallOp(m, "rmsnorm_fwd", {&x, &g}, {&z_ref, &rs_ref}).ok()) return 0;
  return testing::Compare(z, z_ref, testing::ToleranceFor(DType::kF32)).mismatches == 0 ? 1 : 0;
}

TEST(Fork, ChildDispatchesWithItsOwnPoolAndSameRegistry) {
  testing::LogCapture quiet(TEFL_LOG_ERROR);
  OpManager& m = GetDefaultManager();
  ASSERT_EQ(RowsCorrect(m), 1);  // the parent's pool now has running workers
  std::atomic<int> hits{0};
  auto body = [](void* ctx, int64_t b, int64_t e) { static_cast<std::atomic<int>*>(ctx)->fetch_add(int(e - b)); };
  tefl_host()->parallel_for(1000, 1, body, &hits);
  ASSERT_EQ(hits.load(), 1000);
  const size_t impls_before = m.registry().Snapshot().size();

  const pid_t pid = fork();
  ASSERT_NE(pid, -1);
  if (pid == 0) {
    alarm(30);  // a child waiting on workers that do not exist dies instead of hanging
    std::atomic<int> child_hits{0};
    tefl_host()->parallel_for(1000, 1, body, &child_hits);
    const bool ok = child_hits.load() == 1000 && RowsCorrect(m) == 1 && m.registry().Snapshot().size() == impls_before;
    _exit(ok ? 0 : 1);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  // The parent is unaffected.
  EXPECT_EQ(RowsCorrect(m), 1);
  EXPECT_EQ(m.registry().Snapshot().size(), impls_before);
}

}  // namespace
}  // namespace tefl
