// The handle layer's per-thread caches of entries and slots (handle/thread_cache.h): a slot a
// cache holds is never handed out twice nor chosen as a move's destination, counts as free in
// the statistics, and goes back to the store when its thread exits or when the defragmenter
// asks for it.
#include "handle/thread_cache.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <thread>
#include <vector>

#include "handle/defrag.h"
#include "handle/handles.h"
#include "handle/store.h"
#include "handle_patterns.h"
#include "heap/config.h"

namespace meshalloc::handles {
namespace {

using patterns::fill;
using patterns::mismatches;

uintptr_t addressOfHandle(uint64_t handle) {
  auto address = reinterpret_cast<uintptr_t>(pin(handle));
  unpin(handle);
  return address;
}

class HandleThreadCacheTest : public ::testing::Test {
 protected:
  // No controller thread: the tests run the passes. Each starts with this thread's cache empty.
  void SetUp() override {
    gHeapConfig.handlesDefrag = false;
    ASSERT_TRUE(ensureInitialized());
    ThreadCache::flushCurrent();
  }
};

TEST_F(HandleThreadCacheTest, ACachedSlotIsNeverHandedOutTwiceNorMovedInto) {
  constexpr size_t kSize = 64;
  constexpr size_t kCached = 32;  // well under the class's capacity: all stay in the cache
  unsigned c = SizeClasses::classOf(kSize);
  size_t perChunk = Store::layout(c).slotCount;
  std::vector<uint64_t> all(perChunk * 8);
  for (uint64_t& h : all) {
    h = allocate(kSize);
    ASSERT_NE(h, 0u);
    fill(h, kSize);
  }
  // This thread frees a few objects of a chunk it allocated from lately (one its cache keeps
  // freed slots of): their slots go to its cache, and that chunk stays the fullest, where moves
  // go.
  Chunk* target = Store::chunkOf(addressOfHandle(all[all.size() - 100]), c);
  std::vector<uint64_t> live;
  std::vector<uintptr_t> cached;
  for (uint64_t h : all) {
    uintptr_t address = addressOfHandle(h);
    if (cached.size() < kCached && Store::chunkOf(address, c) == target) {
      free(h);
      cached.push_back(address);
    } else {
      live.push_back(h);
    }
  }
  ASSERT_EQ(cached.size(), kCached);
  ASSERT_GE(ThreadCache::cachedSlots(c), kCached);
  // Another thread frees one in sixteen of that chunk's other objects and seven in eight of the
  // rest, and exits: that chunk is the fullest with free slots besides the cached ones, the
  // others go sparse, and a pass moves their objects into the free slots of that one.
  std::vector<uint64_t> kept;
  std::thread freer([&] {
    for (size_t i = 0; i < live.size(); i++) {
      bool inTarget = Store::chunkOf(addressOfHandle(live[i]), c) == target;
      if (inTarget ? i % 16 == 1 : i % 8 != 0) {
        free(live[i]);
      } else {
        kept.push_back(live[i]);
      }
    }
  });
  freer.join();
  uint64_t movedBefore = gCounters.movedObjects.load();
  Defragmenter::pass(0, 0);
  ASSERT_GT(gCounters.movedObjects.load(), movedBefore);
  size_t movedIntoCached = 0;
  for (uint64_t h : kept)
    movedIntoCached += std::count(cached.begin(), cached.end(), addressOfHandle(h));
  EXPECT_EQ(movedIntoCached, 0u);
  // Allocations take the cached slots (or, if the pass asked for them, slots from the store):
  // never one a live object is in.
  for (size_t i = 0; i < kCached; i++) {
    uint64_t h = allocate(kSize);
    ASSERT_NE(h, 0u);
    fill(h, kSize);
    kept.push_back(h);
  }
  std::vector<uintptr_t> addresses;
  size_t wrong = 0;
  for (uint64_t h : kept) {
    addresses.push_back(addressOfHandle(h));
    wrong += mismatches(h, kSize);
  }
  std::sort(addresses.begin(), addresses.end());
  EXPECT_EQ(std::adjacent_find(addresses.begin(), addresses.end()), addresses.end())
      << "two live objects share a slot";
  EXPECT_EQ(wrong, 0u);
  for (uint64_t h : kept) free(h);
}

TEST_F(HandleThreadCacheTest, SlotsFreedInOlderChunksGoBackAtOnce) {
  constexpr size_t kSize = 96;
  unsigned c = SizeClasses::classOf(kSize);
  std::vector<uint64_t> all(Store::layout(c).slotCount * 6);
  for (uint64_t& h : all) h = allocate(kSize);
  // The first chunk is no longer one the cache refills from: a cache keeping its freed slots
  // would keep a sparse chunk alive that no pass could empty.
  size_t cachedBefore = ThreadCache::cachedSlots(c);
  Chunk* oldest = Store::chunkOf(addressOfHandle(all[0]), c);
  std::vector<uint64_t> rest;
  for (uint64_t h : all) {
    if (Store::chunkOf(addressOfHandle(h), c) == oldest) {
      free(h);
    } else {
      rest.push_back(h);
    }
  }
  EXPECT_EQ(ThreadCache::cachedSlots(c), cachedBefore);
  for (uint64_t h : rest) free(h);
}

// mh_compact (and the defragmenter's return requests) make a cache forget its run chunks, the
// fast path's block among them: frees of objects allocated before go back to their chunks, which
// the pass may then release, instead of refilling the cache.
TEST_F(HandleThreadCacheTest, AFlushedCacheKeepsNoSlotFreedAfterwards) {
  constexpr size_t kSize = 80;
  unsigned c = SizeClasses::classOf(kSize);
  std::vector<uint64_t> handles(16);
  for (uint64_t& h : handles) h = allocate(kSize);
  ThreadCache::flushCurrent();
  size_t cachedBefore = ThreadCache::cachedSlots(c);
  for (uint64_t h : handles) free(h);
  EXPECT_EQ(ThreadCache::cachedSlots(c), cachedBefore);
}

TEST_F(HandleThreadCacheTest, CachedSlotsCountAsFree) {
  constexpr size_t kSize = 48;
  unsigned c = SizeClasses::classOf(kSize);
  size_t liveBefore = Store::classLiveBytes(c);
  std::vector<uint64_t> handles(100);
  for (uint64_t& h : handles) h = allocate(kSize);
  EXPECT_EQ(Store::classLiveBytes(c), liveBefore + 100 * Store::layout(c).slotSize);
  for (uint64_t h : handles) free(h);
  ASSERT_GT(ThreadCache::cachedSlots(c), 0u);
  EXPECT_EQ(Store::classLiveBytes(c), liveBefore);
}

TEST_F(HandleThreadCacheTest, AnExitingThreadGivesItsSlotsBack) {
  constexpr size_t kSize = 112;
  unsigned c = SizeClasses::classOf(kSize);
  size_t cachedBefore = ThreadCache::cachedSlots(c);
  size_t cachedInThread = 0;
  std::thread worker([&] {
    std::vector<uint64_t> handles(100);
    for (uint64_t& h : handles) h = allocate(kSize);
    for (uint64_t h : handles) free(h);
    cachedInThread = ThreadCache::cachedSlots(c) - cachedBefore;
  });
  worker.join();
  ASSERT_GT(cachedInThread, 0u);
  EXPECT_EQ(ThreadCache::cachedSlots(c), cachedBefore);
}

TEST_F(HandleThreadCacheTest, TheDefragmenterGetsCachedSlotsBack) {
  constexpr size_t kSize = 160;
  unsigned c = SizeClasses::classOf(kSize);
  size_t perChunk = Store::layout(c).slotCount;
  std::vector<uint64_t> all(perChunk * 6), kept;
  for (uint64_t& h : all) h = allocate(kSize);
  // Seven in eight freed; the last ones freed stay in this thread's cache, in some chunk.
  for (size_t i = 0; i < all.size(); i++) {
    if (i % 8 == 0) {
      kept.push_back(all[i]);
    } else {
      free(all[i]);
    }
  }
  ASSERT_GT(ThreadCache::cachedSlots(c), 0u);
  Defragmenter::pass(0, 0);
  size_t committed = Store::classCommittedBytes(c);
  // The pass asked for the slots back: the next free in the class gives them.
  free(allocate(kSize));
  Defragmenter::pass(0, 0);
  EXPECT_LT(Store::classCommittedBytes(c), committed);
  for (uint64_t h : kept) free(h);
}

}  // namespace
}  // namespace meshalloc::handles
