#include "heap/arena.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "heap/config.h"
#include "heap/heap.h"
#include "heap/span.h"

namespace meshalloc {
namespace {

class ArenaTest : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_TRUE(heap::ensureInitialized()); }
  size_t page() const { return Arena::pageSize(); }
};

TEST_F(ArenaTest, FreshRunsAreZeroedAndReleasedRunsCoalesce) {
  bool zeroed = false;
  // Allocate three neighbours from a fresh segment region, give them back, and expect one run
  // covering all three to be available at the first one's address.
  constexpr size_t kPages = 200;  // beyond the dirty cache's exact bins, so released clean
  uintptr_t a = Arena::allocate(kPages, 0, &zeroed);
  ASSERT_NE(a, 0u);
  EXPECT_TRUE(zeroed);
  uintptr_t b = Arena::allocate(kPages, 0, &zeroed);
  uintptr_t c = Arena::allocate(kPages, 0, &zeroed);
  ASSERT_TRUE(b && c);
  memset(reinterpret_cast<void*>(a), 0xab, kPages * page());
  Arena::release(a, kPages, false);
  Arena::release(b, kPages, false);
  Arena::release(c, kPages, false);
  uintptr_t merged = Arena::allocate(3 * kPages, 0, &zeroed);
  EXPECT_TRUE(zeroed);
  EXPECT_EQ(*reinterpret_cast<unsigned char*>(merged), 0) << "released pages must read as zero";
  Arena::release(merged, 3 * kPages, false);
}

TEST_F(ArenaTest, AlignedRunsAreAligned) {
  for (size_t alignment : {page() * 2, page() * 16, size_t{1} << 21}) {
    bool zeroed;
    uintptr_t run = Arena::allocate(3, alignment, &zeroed);
    ASSERT_NE(run, 0u);
    EXPECT_EQ(run % alignment, 0u);
    Arena::release(run, 3, false);
  }
}

TEST_F(ArenaTest, GrowsInPlaceIntoAFreeNeighbour) {
  bool zeroed;
  uintptr_t run = Arena::allocate(300, 0, &zeroed);
  Arena::shrink(run, 300, 100);
  EXPECT_TRUE(Arena::tryGrow(run, 100, 250));
  Arena::release(run, 250, false);
}

TEST_F(ArenaTest, AddressSpaceGrowsBeyondOneSegmentAndLookupsScale) {
  // Several granules' worth of runs: the arena must reserve more segments on demand, and every
  // page of every run must resolve through the two-level table.
  size_t pagesPerRun = (Arena::kGranule / page()) / 4;
  std::vector<uintptr_t> runs;
  size_t segmentsBefore = Arena::stats().segmentCount;
  for (int i = 0; i < 12; i++) {
    bool zeroed;
    uintptr_t run = Arena::allocate(pagesPerRun, 0, &zeroed);
    ASSERT_NE(run, 0u);
    runs.push_back(run);
  }
  EXPECT_GE(Arena::stats().segmentCount, segmentsBefore + 2);
  alignas(64) static char fakeOwner[64];  // stands in for a span record: only its address is used
  for (uintptr_t run : runs) {
    Arena::assign(run, 4, reinterpret_cast<Span*>(fakeOwner), true);
    for (size_t p = 0; p < 4; p++) {
      uint64_t entry = Arena::entryFor(run + p * page() + 17);
      ASSERT_TRUE(PageEntry::isSpan(entry));
      EXPECT_EQ(PageEntry::span(entry), reinterpret_cast<Span*>(fakeOwner));
      EXPECT_EQ(PageEntry::pageIndex(entry), p);
    }
    Arena::release(run, pagesPerRun, false);
    EXPECT_FALSE(PageEntry::isSpan(Arena::entryFor(run))) << "a released run has no owner";
  }
}

// The compact map (malloc_usable_size's and free's first look) says a small span's class and
// each page's index in it, and nothing for large objects, released pages or foreign addresses.
TEST_F(ArenaTest, CompactEntriesFollowAssignAndRelease) {
  constexpr size_t kPages = 6;
  constexpr unsigned kSmallClass = 5;
  bool zeroed;
  uintptr_t run = Arena::allocate(kPages, 0, &zeroed);
  ASSERT_NE(run, 0u);
  Span small;
  small.sizeClass = kSmallClass;
  Arena::assign(run, kPages, &small, true);
  for (size_t p = 0; p < kPages; p++) {
    uintptr_t address = run + p * page() + 48;
    uint16_t entry = Arena::classEntryFor(address);
    ASSERT_TRUE(PageClassEntry::isSmall(entry));
    EXPECT_EQ(PageClassEntry::sizeClass(entry), kSmallClass);
    EXPECT_EQ(PageClassEntry::pageIndex(entry), p);
    EXPECT_EQ(Arena::spanStartOfClassEntry(address, entry), run);
    EXPECT_EQ(Arena::entryAddressFor(address), Arena::entryAddressFor(run + p * page()));
  }
  Arena::release(run, kPages, false);
  for (size_t p = 0; p < kPages; p++) EXPECT_EQ(Arena::classEntryFor(run + p * page()), 0u);

  run = Arena::allocate(kPages, 0, &zeroed);
  ASSERT_NE(run, 0u);
  Span large;
  large.sizeClass = kLargeClass;
  Arena::assign(run, kPages, &large, false);
  EXPECT_TRUE(PageEntry::isSpan(Arena::entryFor(run)));
  for (size_t p = 0; p < kPages; p++) EXPECT_EQ(Arena::classEntryFor(run + p * page()), 0u);
  Arena::release(run, kPages, false);

  int onStack = 0;
  EXPECT_EQ(Arena::classEntryFor(reinterpret_cast<uintptr_t>(&onStack)), 0u);
  EXPECT_EQ(Arena::classEntryFor(0), 0u);
  EXPECT_EQ(Arena::classEntryFor(~uintptr_t{0}), 0u);
  EXPECT_EQ(Arena::entryAddressFor(~uintptr_t{0}), nullptr);
}

TEST_F(ArenaTest, HugeObjectsGetADedicatedSegmentThatIsUnmappedOnRelease) {
  size_t pages = (Arena::kDedicatedThreshold * 2) / page();
  size_t reservedBefore = Arena::stats().reservedBytes;
  bool zeroed;
  uintptr_t run = Arena::allocate(pages, 0, &zeroed);
  ASSERT_NE(run, 0u);
  EXPECT_GE(Arena::stats().reservedBytes, reservedBefore + pages * page());
  EXPECT_EQ(Arena::stats().dedicatedCount, 1u);
  Arena::release(run, pages, true);
  EXPECT_EQ(Arena::stats().reservedBytes, reservedBefore);
  EXPECT_FALSE(Arena::contains(run));
}

// A run grows into a cached (dirty) neighbour as well as a clean one, and the rest of the cached
// run stays cached.
TEST_F(ArenaTest, GrowsInPlaceIntoACachedNeighbour) {
  const HeapConfig saved = gHeapConfig;
  gHeapConfig.decayMs = 3'600'000;
  Arena::purge(true);
  bool zeroed;
  uintptr_t run = Arena::allocate(30, 0, &zeroed);
  ASSERT_NE(run, 0u);
  Arena::release(run + 10 * page(), 20, true);
  ASSERT_EQ(Arena::stats().dirtyBytes, 20 * page());
  size_t active = Arena::stats().activeBytes;
  EXPECT_TRUE(Arena::tryGrow(run, 10, 25));
  EXPECT_EQ(Arena::stats().dirtyBytes, 5 * page()) << "the cached run's tail stays cached";
  EXPECT_EQ(Arena::stats().activeBytes, active + 15 * page());
  EXPECT_FALSE(Arena::tryGrow(run, 25, 40)) << "5 cached pages cannot hold 15 more";
  gHeapConfig = saved;
  Arena::release(run, 25, true);
  Arena::purge(true);
}

TEST_F(ArenaTest, ForeignAddressesHaveNoEntry) {
  int onStack = 0;
  static int inData = 0;
  EXPECT_EQ(Arena::entryFor(reinterpret_cast<uintptr_t>(&onStack)), 0u);
  EXPECT_EQ(Arena::entryFor(reinterpret_cast<uintptr_t>(&inData)), 0u);
  EXPECT_EQ(Arena::entryFor(0), 0u);
  EXPECT_EQ(Arena::entryFor(~uintptr_t{0}), 0u);
}

TEST_F(ArenaTest, DirtyCacheDecaysToTheOs) {
  bool zeroed;
  uintptr_t run = Arena::allocate(4, 0, &zeroed);
  Arena::release(run, 4, true);
  EXPECT_GE(Arena::stats().dirtyBytes, 4 * page());
  EXPECT_GT(Arena::purge(true), 0u);
  EXPECT_EQ(Arena::stats().dirtyBytes, 0u);
}

// The cache holds at most dirty_cache_percent of the active pages (never less than
// kMinDirtyCacheBytes) and never more than dirty_cache: a small heap that frees a burst of
// pages keeps only a fraction of them committed instead of up to 32 MiB.
TEST_F(ArenaTest, DirtyCacheLimitScalesWithTheActivePages) {
  const HeapConfig saved = gHeapConfig;
  Arena::purge(true);
  gHeapConfig.dirtyCacheBytes = size_t{32} << 20;
  gHeapConfig.decayMs = 3'600'000;  // only the limit purges in this test
  constexpr size_t kRuns = 8;
  const size_t runPages = (size_t{512} << 10) / page();
  auto burst = [&] {
    uintptr_t runs[kRuns];
    bool zeroed;
    // One cached page the runs do not fit in: they are the cache's misses, so the cache is not
    // taken for one that feeds churn (see AChurningCacheMayExceedItsShareOfTheHeap).
    uintptr_t page = Arena::allocate(1, 0, &zeroed);
    Arena::release(page, 1, true);
    for (uintptr_t& run : runs) {
      run = Arena::allocate(runPages, 0, &zeroed);
      ASSERT_NE(run, 0u);
    }
    for (uintptr_t run : runs) Arena::release(run, runPages, true);
    std::this_thread::sleep_for(std::chrono::nanoseconds(2 * Arena::kMinPurgeAgeNs));
    Arena::purge(false);
  };
  const size_t freed = kRuns * runPages * page();
  gHeapConfig.dirtyCachePercent = 0;
  burst();
  EXPECT_GE(Arena::stats().dirtyBytes, freed) << "without the percentage, dirty_cache rules";
  Arena::purge(true);
  gHeapConfig.dirtyCachePercent = 25;
  burst();
  ArenaStats stats = Arena::stats();
  size_t limit = stats.activeBytes / 100 * 25;
  if (limit < Arena::kMinDirtyCacheBytes) limit = Arena::kMinDirtyCacheBytes;
  ASSERT_LT(limit, freed) << "the test heap must be small for this test";
  EXPECT_LE(stats.dirtyBytes, limit) << "a small heap keeps a fraction of what it freed";
  EXPECT_GE(stats.dirtyBytes, Arena::kMinDirtyCacheBytes / 2) << "but not nothing";
  gHeapConfig = saved;
  Arena::purge(true);
  EXPECT_EQ(Arena::stats().dirtyBytes, 0u);
}

// A cache that serves nearly every request feeds churn: it may keep up to dirty_cache, whatever
// its share of the heap, as long as it keeps serving.
TEST_F(ArenaTest, AChurningCacheMayExceedItsShareOfTheHeap) {
  const HeapConfig saved = gHeapConfig;
  Arena::purge(true);
  gHeapConfig.dirtyCacheBytes = size_t{32} << 20;
  gHeapConfig.dirtyCachePercent = 25;
  gHeapConfig.decayMs = 3'600'000;
  const size_t runPages = (size_t{512} << 10) / page();
  bool zeroed;
  for (int i = 0; i < 64; i++) {  // 63 of these 64 requests are served by the cache
    uintptr_t run = Arena::allocate(runPages, 0, &zeroed);
    ASSERT_NE(run, 0u);
    Arena::release(run, runPages, true);
  }
  constexpr size_t kRuns = 8;
  uintptr_t runs[kRuns];
  for (uintptr_t& run : runs) run = Arena::allocate(runPages, 0, &zeroed);
  for (uintptr_t run : runs) Arena::release(run, runPages, true);
  std::this_thread::sleep_for(std::chrono::nanoseconds(2 * Arena::kMinPurgeAgeNs));
  Arena::purge(false);
  ArenaStats stats = Arena::stats();
  ASSERT_LT(std::max(stats.activeBytes / 4, Arena::kMinDirtyCacheBytes), kRuns * runPages * page());
  EXPECT_GE(stats.dirtyBytes, kRuns * runPages * page()) << "a churning cache keeps its runs";
  gHeapConfig = saved;
  Arena::purge(true);
}

}  // namespace
}  // namespace meshalloc
