// MESHALLOC_ASSERT (src/support/assert.h): compiled into the checked builds (Debug, ASan/UBSan,
// TSan), where a failed check reports itself and aborts, and out of release, where the
// condition is never evaluated.
#include "support/assert.h"

#include <gtest/gtest.h>

#include <new>

#include "heap/global_heap.h"
#include "heap/span.h"

namespace meshalloc {
namespace {

TEST(Assert, ConditionIsEvaluatedExactlyWhenChecksAreCompiledIn) {
  int evaluations = 0;
  MESHALLOC_ASSERT(++evaluations == 1);
  MESHALLOC_ASSERT_MSG(++evaluations == 2, "counted");
  EXPECT_EQ(evaluations, kChecksEnabled ? 2 : 0);
}

// Keeps the compiler from proving the condition false at compile time.
[[gnu::noinline]] int three() {
  return 3;
}

void failPlainAssertion() {
  MESHALLOC_ASSERT(three() == 4);
}

void failAssertionWithMessage() {
  MESHALLOC_ASSERT_MSG(three() < 0, "three is not negative");
}

TEST(AssertDeathTest, FailureNamesTheExpressionFileAndLine) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(failPlainAssertion(),
               "meshalloc: assertion failed: three\\(\\) == 4 \\(.*assert_test\\.cc:[0-9]+\\)");
  EXPECT_DEATH(failAssertionWithMessage(),
               "meshalloc: assertion failed: three\\(\\) < 0: three is not negative "
               "\\(.*assert_test\\.cc:[0-9]+\\)");
}

// A real invariant of the library: only an attached span can be handed back by its owner
// (GlobalHeap::detachLocked). Releasing a detached one must trip the check, not corrupt the
// lists it would otherwise be filed into twice.
TEST(AssertDeathTest, ReleasingASpanThatIsNotAttachedFires) {
  if (!kChecksEnabled) GTEST_SKIP() << "checks are compiled out of this build";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  alignas(kCacheLine) static char storage[sizeof(Span) + sizeof(uint64_t)];
  Span* span = new (storage) Span();
  span->objectCount = 64;
  span->state = SpanState::kPartial;
  EXPECT_DEATH(GlobalHeap::releaseSpan(span),
               "meshalloc: assertion failed: heap->state == SpanState::kAttached "
               "\\(.*global_heap\\.cc:[0-9]+\\)");
}

}  // namespace
}  // namespace meshalloc
