#include "heap/size_class.h"

#include <gtest/gtest.h>

namespace meshalloc {
namespace {

class SizeClassesForPage : public ::testing::TestWithParam<size_t> {
 protected:
  void SetUp() override { SizeClasses::init(GetParam()); }
  void TearDown() override { SizeClasses::init(4096); }
};

TEST_P(SizeClassesForPage, EverySizeMapsToTheSmallestClassThatFits) {
  for (size_t size = 0; size <= kMaxSmallSize; size++) {
    unsigned c = SizeClasses::classOf(size);
    ASSERT_LT(c, kNumSizeClasses) << size;
    ASSERT_GE(kSizeClassSizes[c], size) << size;
    if (c > 0) {
      ASSERT_LT(kSizeClassSizes[c - 1], size) << size;
    }
  }
}

TEST_P(SizeClassesForPage, SpansHoldEnoughObjectsWithSmallTailWaste) {
  size_t page = GetParam();
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const SpanPlan& plan = SizeClasses::plan(c);
    size_t bytes = plan.pages * page;
    EXPECT_GE(plan.objectCount, kMinObjectsPerSpan) << plan.objectSize;
    EXPECT_GE(bytes, kMinSpanBytes);
    EXPECT_EQ(plan.objectCount, bytes / plan.objectSize);
    // Tail waste: within 1/32 of the span, except where no span up to 4x the minimum does better.
    EXPECT_LE((bytes % plan.objectSize) * 8, bytes)
        << "class " << plan.objectSize << " page " << page;
    EXPECT_LE(plan.objectCount, 65535u) << "slots must fit the 16-bit slot field";
  }
}

TEST_P(SizeClassesForPage, ReciprocalDividesEveryValidOffsetExactly) {
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const SpanPlan& plan = SizeClasses::plan(c);
    for (uint64_t slot = 0; slot < plan.objectCount; slot++) {
      uint64_t delta = slot * plan.objectSize;
      ASSERT_EQ((delta * plan.reciprocal) >> 32, slot) << plan.objectSize;
    }
  }
}

// The free fast path's one-multiply test must agree with slotOf on every offset a span can
// produce: slot starts, interior pointers, the unused tail and past the end.
TEST_P(SizeClassesForPage, SlotStartTestAgreesWithSlotOfEverywhere) {
  size_t page = GetParam();
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const SpanPlan& plan = SizeClasses::plan(c);
    uint64_t end = static_cast<uint64_t>(plan.pages) * page + 2 * plan.objectSize;
    for (uint64_t delta = 0; delta < end; delta++) {
      ASSERT_EQ(SizeClasses::isSlotStart(c, delta), SizeClasses::slotOf(c, delta) >= 0)
          << "class " << plan.objectSize << " page " << page << " offset " << delta;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(PageSizes, SizeClassesForPage, ::testing::Values(4096, 16384, 65536));

TEST(SizeClasses, ClassesGrowByAtMostAQuarterAbove128Bytes) {
  for (size_t c = 1; c < kNumSizeClasses; c++) {
    if (kSizeClassSizes[c - 1] < 128) continue;
    EXPECT_LE(kSizeClassSizes[c] * 4, kSizeClassSizes[c - 1] * 5) << kSizeClassSizes[c];
  }
}

// A power of two plus a small header (sqlite adds 8 bytes to every request) must not waste a
// quarter of its slot: from 512 B to 8 KiB such sizes waste at most 1/8.
TEST(SizeClasses, PowersOfTwoPlusAHeaderWasteAtMostAnEighth) {
  SizeClasses::init(4096);
  for (size_t power = 512; power <= 8192; power *= 2) {
    for (size_t header : {8u, 16u, 32u, 48u, 64u}) {
      size_t size = power + header;
      size_t slot = kSizeClassSizes[SizeClasses::classOf(size)];
      EXPECT_LE((slot - size) * 8, slot) << size << " bytes in a " << slot << "-byte slot";
    }
  }
}

TEST(SizeClasses, AlignmentClassesAreMultiplesOfTheAlignment) {
  SizeClasses::init(4096);
  for (size_t alignment = 32; alignment <= 4096; alignment *= 2) {
    for (size_t size : {1ul, 17ul, 100ul, 1000ul, 4096ul, 10000ul}) {
      unsigned c = SizeClasses::classForAlignment(size, alignment);
      ASSERT_NE(c, kLargeClass);
      EXPECT_EQ(kSizeClassSizes[c] % alignment, 0u);
      EXPECT_GE(kSizeClassSizes[c], size);
    }
  }
  EXPECT_EQ(SizeClasses::classForAlignment(kMaxSmallSize + 1, 64), kLargeClass);
}

}  // namespace
}  // namespace meshalloc
