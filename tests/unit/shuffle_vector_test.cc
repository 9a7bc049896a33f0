// The shuffle vector's parts on their own, on blocks of a local array: the order the recycled
// ring hands blocks out in, the pop floor it sets on the slot stack, and the stack's
// reordering operations.
#include "heap/shuffle_vector.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <vector>

namespace meshalloc {
namespace {

// Blocks of two words (the cache tag lives in the second).
struct Block {
  uintptr_t words[2];
};

class ShuffleVectorParts : public ::testing::Test {
 protected:
  uintptr_t block(unsigned i) { return reinterpret_cast<uintptr_t>(&blocks_[i]); }
  Block blocks_[16] = {};
  uintptr_t entries_[8] = {};
};

TEST_F(ShuffleVectorParts, TheRingServesNewestFirstAndHoldsTheStackBelowItsFloorUntilEmpty) {
  ShuffleVector v;
  v.slots.configure(entries_, 8);
  v.recycled.configure(2);
  v.slots.pushClaimed(block(0));
  v.slots.pushClaimed(block(1));
  ASSERT_TRUE(v.slots.canPop());

  // A thread alone: the ring's blocks come first, so a push raises the stack's floor.
  v.setRecycledFirst(true);
  EXPECT_FALSE(v.slots.canPop()) << "the floor is set even over an empty ring";
  EXPECT_EQ(v.pushRecycled(block(4)), 0u);
  EXPECT_EQ(v.pushRecycled(block(5)), 0u);
  EXPECT_FALSE(v.recycled.hasRoom());
  EXPECT_EQ(cacheTagOf(block(5)), recycledTag());
  EXPECT_TRUE(v.recycled.holds(block(4)));
  // A full ring gives up its oldest block, untagged, for the caller to apply.
  EXPECT_EQ(v.pushRecycled(block(6)), block(4));
  EXPECT_EQ(cacheTagOf(block(4)), 0u);
  EXPECT_FALSE(v.recycled.holds(block(4)));
  EXPECT_EQ(v.recycled.afterOldest(0), block(5));
  EXPECT_EQ(v.recycled.afterOldest(7), block(6)) << "past the newest: the newest";
  EXPECT_FALSE(v.slots.canPop());

  EXPECT_EQ(v.popRecycled(), reinterpret_cast<void*>(block(6)));
  EXPECT_FALSE(v.slots.canPop()) << "one block is left in the ring";
  EXPECT_EQ(v.popRecycled(), reinterpret_cast<void*>(block(5)));
  EXPECT_EQ(cacheTagOf(block(5)), 0u) << "a block handed out carries no tag";
  EXPECT_TRUE(v.recycled.empty());
  EXPECT_TRUE(v.slots.canPop()) << "the last recycled block's pop lowers the floor";

  // Other threads have heaps: the stack comes first, whatever the ring holds.
  v.setRecycledFirst(false);
  EXPECT_EQ(v.pushRecycled(block(7)), 0u);
  EXPECT_TRUE(v.slots.canPop());
  EXPECT_TRUE(v.recycled.servesLast());
  uintptr_t taken = 0;
  EXPECT_TRUE(v.takeOldestRecycled(&taken));
  EXPECT_EQ(taken, block(7));
  EXPECT_FALSE(v.takeOldestRecycled(&taken));
}

TEST_F(ShuffleVectorParts, TheStackPopsLastInAndSpillsItsOldest) {
  SlotStack stack;
  stack.configure(entries_, 8);
  stack.setShufflesEveryPush(false);
  for (unsigned i = 0; i < 4; i++) stack.pushClaimed(block(i));
  stack.push(block(4));  // a local free: tagged, so a second free notices
  EXPECT_EQ(cacheTagOf(block(4)), vectorTag());
  EXPECT_TRUE(stack.holds(block(4)));
  EXPECT_EQ(stack.entry(4) & SlotStack::kTaggedEntry, SlotStack::kTaggedEntry);
  EXPECT_EQ(stack.entry(3) & SlotStack::kTaggedEntry, 0u) << "a claimed slot is left untagged";
  EXPECT_EQ(stack.pop(), reinterpret_cast<void*>(block(4)));
  EXPECT_EQ(cacheTagOf(block(4)), 0u);
  EXPECT_FALSE(stack.holds(block(4)));

  stack.dropOldest(2);  // a spill: blocks 0 and 1 went back to their bitmaps
  ASSERT_EQ(stack.length(), 2u);
  EXPECT_EQ(stack.entry(0), block(2));
  EXPECT_EQ(stack.pop(), reinterpret_cast<void*>(block(3)));
  EXPECT_EQ(stack.lengthSeenByPeers(), 1u);
  EXPECT_TRUE(stack.canPop());
  EXPECT_EQ(stack.pop(), reinterpret_cast<void*>(block(2)));
  EXPECT_TRUE(stack.empty());
  EXPECT_FALSE(stack.canPop()) << "an empty stack: the floor at 0 is its base";
  EXPECT_FALSE(SlotStack{}.canPop()) << "an unconfigured stack (the empty heap's)";
  EXPECT_FALSE(SlotStack{}.takesInlinePush());

  // The inline push stops at the limit: the capacity, or 0 where every push is shuffled in.
  stack.clear();
  for (unsigned i = 0; i < 7; i++) stack.pushClaimed(block(i));
  EXPECT_TRUE(stack.takesInlinePush());
  stack.pushClaimed(block(7));
  EXPECT_FALSE(stack.takesInlinePush());
  EXPECT_TRUE(stack.full());
  stack.clear();
  stack.setShufflesEveryPush(true);
  EXPECT_FALSE(stack.takesInlinePush());
  EXPECT_TRUE(stack.shufflesEveryPush());
}

TEST_F(ShuffleVectorParts, ReorderingKeepsEveryEntryAndMovesWholeRuns) {
  SlotStack stack;
  stack.configure(entries_, 8);
  for (unsigned i = 0; i < 7; i++) stack.pushClaimed(block(i));
  stack.reverse(0, 3);
  EXPECT_EQ(stack.entry(0), block(2));
  EXPECT_EQ(stack.entry(2), block(0));
  EXPECT_EQ(stack.entry(3), block(3));
  stack.reverse(0, 3);
  // Runs [0,3) [3,5) [5,7) in the order 2, 0, 1.
  const uint32_t runStarts[] = {0, 3, 5, 7};
  const unsigned order[] = {2, 0, 1};
  uintptr_t scratch[8];
  stack.reorderRuns(runStarts, order, 3, scratch);
  const unsigned expected[] = {5, 6, 0, 1, 2, 3, 4};
  for (unsigned i = 0; i < 7; i++) EXPECT_EQ(stack.entry(i), block(expected[i])) << i;
  Rng rng;
  rng.reseed(42);
  stack.shuffle(rng);
  std::vector<uintptr_t> seen;
  for (unsigned i = 0; i < stack.length(); i++) seen.push_back(stack.entry(i));
  std::sort(seen.begin(), seen.end());
  for (unsigned i = 0; i < 7; i++) EXPECT_EQ(seen[i], block(i));
}

}  // namespace
}  // namespace meshalloc
