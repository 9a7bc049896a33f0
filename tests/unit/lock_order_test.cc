// The lock order (support/lock.h, LockRank): in the checked builds a thread that takes a lock
// inside one of the same or a later rank aborts, naming the order, before it can deadlock.
#include "support/lock.h"

#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

namespace meshalloc {
namespace {

#if MESHALLOC_CHECKS_ENABLED
unsigned held() {
  return HeldLocks::count();
}
#endif

void takeInOrder(Mutex& outer, Mutex& inner) {
  LockGuard first(outer);
  LockGuard second(inner);
}

TEST(LockOrderDeathTest, AnInnerRankTakenFirstAborts) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Mutex sizeClass(LockRank::kSizeClass);
  Mutex arena(LockRank::kArena);
  EXPECT_DEATH(takeInOrder(arena, sizeClass), "meshalloc: assertion failed: .*lock order");
}

TEST(LockOrderDeathTest, TwoLocksOfOneRankAbortUnlessTheyAreSizeClasses) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Mutex arena(LockRank::kArena);
  Mutex secondArena(LockRank::kArena);
  EXPECT_DEATH(takeInOrder(arena, secondArena), "lock order");
  // Fork holds every size class at once, in index order.
  Mutex classA(LockRank::kSizeClass);
  Mutex classB(LockRank::kSizeClass);
  takeInOrder(classA, classB);
}

TEST(LockOrder, TheHeapsOrderIsAccepted) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
  Mutex pass(LockRank::kMeshPass);
  Mutex sizeClass(LockRank::kSizeClass);
  Mutex arena(LockRank::kArena);
  Mutex stats(LockRank::kMeshStats);
  {
    LockGuard a(pass);
    LockGuard b(sizeClass);
    LockGuard c(arena);
    LockGuard d(stats);
#if MESHALLOC_CHECKS_ENABLED
    EXPECT_EQ(held(), 4u);
#endif
  }
#if MESHALLOC_CHECKS_ENABLED
  EXPECT_EQ(held(), 0u);
#endif
  // Unranked locks (tests' own) are never checked, in any order.
  Mutex mine;
  takeInOrder(arena, mine);
  takeInOrder(mine, pass);
}

// Released out of order, or reset in a fork child, a lock is forgotten wherever it sits: what
// is still held keeps being checked against.
TEST(LockOrder, ReleaseAndForkResetForgetTheLock) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
#if MESHALLOC_CHECKS_ENABLED
  Mutex sizeClass(LockRank::kSizeClass);
  Mutex arena(LockRank::kArena);
  sizeClass.lock();
  arena.lock();
  sizeClass.unlock();
  EXPECT_EQ(held(), 1u);
  arena.unlock();
  EXPECT_EQ(held(), 0u);

  sizeClass.lock();
  arena.lock();
  fflush(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    arena.resetAfterFork();
    sizeClass.resetAfterFork();
    _exit(held() == 0 ? 0 : 1);
  }
  arena.unlock();
  sizeClass.unlock();
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
#endif
}

}  // namespace
}  // namespace meshalloc
