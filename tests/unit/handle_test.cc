// The handle layer in-process: the table's encoding and checks, the store, moves and passes,
// and the randomised pattern test of the thesis's style (every object filled with a pattern
// derived from its handle, checked after every pass and before every free).
#include "handle/handles.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <vector>

#include "handle/controller.h"
#include "handle/defrag.h"
#include "handle/store.h"
#include "handle_patterns.h"
#include "heap/config.h"
#include "heap/cpu_budget.h"

namespace meshalloc::handles {
namespace {

using patterns::fill;
using patterns::mismatches;

class HandleTest : public ::testing::Test {
 protected:
  // No controller thread here: the tests run passes themselves and measure what they did.
  void SetUp() override {
    gHeapConfig.handlesDefrag = false;
    ASSERT_TRUE(ensureInitialized());
  }
  void TearDown() override { Defragmenter::corruptMovesForTesting(false); }
};

TEST_F(HandleTest, HandlesAreTaggedAndNeverPointers) {
  uint64_t h = allocate(24);
  ASSERT_NE(h, 0u);
  EXPECT_TRUE(h & kHandleTag);
  EXPECT_GE(usableSize(h), 24u);
  void* p = pin(h);
  EXPECT_NE(reinterpret_cast<uintptr_t>(p) & kHandleTag, kHandleTag);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % 16, 0u);
  unpin(h);
  free(h);
}

TEST_F(HandleTest, EveryChunkLayoutFitsAndMapsSlotsBothWays) {
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const ClassLayout& l = Store::layout(c);
    EXPECT_LE(size_t{l.firstSlot} + size_t{l.slotCount} * l.slotSize, l.chunkBytes) << c;
    EXPECT_GE(l.slotCount, 15u) << c;
    uint64_t h = allocate(l.slotSize);
    auto address = reinterpret_cast<uintptr_t>(pin(h));
    unpin(h);
    Chunk* chunk = Store::chunkOf(address, c);
    EXPECT_EQ(chunk->sizeClass, c);
    for (uint32_t slot = 0; slot < l.slotCount; slot++)
      ASSERT_EQ(Store::slotOf(chunk, Store::slotAddress(chunk, slot)), slot) << c;
    free(h);
  }
}

TEST_F(HandleTest, CallocZeroesAndChecksOverflow) {
  uint64_t dirty = allocate(400);
  memset(pin(dirty), 0xab, 400);
  unpin(dirty);
  free(dirty);
  uint64_t h = allocateZeroed(50, 8);
  auto* p = static_cast<const uint8_t*>(pin(h));
  EXPECT_TRUE(std::all_of(p, p + 400, [](uint8_t b) { return b == 0; }));
  unpin(h);
  free(h);
  errno = 0;
  EXPECT_EQ(allocateZeroed(SIZE_MAX / 2, 3), 0u);
  EXPECT_EQ(errno, ENOMEM);
  errno = 0;
  EXPECT_EQ(allocate(SIZE_MAX), 0u);
  EXPECT_EQ(errno, ENOMEM);
}

TEST_F(HandleTest, ReallocKeepsTheHandleAndTheContents) {
  uint64_t h = allocate(100);
  fill(h, 100);
  for (size_t size : {size_t{100}, size_t{3000}, size_t{70000}, size_t{200000}, size_t{50}}) {
    size_t kept = std::min<size_t>(size, 50);
    ASSERT_EQ(reallocate(h, size), h);
    EXPECT_GE(usableSize(h), size);
    EXPECT_EQ(mismatches(h, kept), 0u) << size;
  }
  free(h);
  EXPECT_NE(reallocate(0, 10), 0u);
}

TEST_F(HandleTest, PinsNestAndLargeObjectsWork) {
  uint64_t h = allocate(1 << 20);
  fill(h, 1 << 20);
  void* a = pin(h);
  void* b = pin(h);
  EXPECT_EQ(a, b);
  unpin(h);
  unpin(h);
  EXPECT_EQ(mismatches(h, 1 << 20), 0u);
  free(h);
}

TEST_F(HandleTest, StaleForgedAndMisusedHandlesAbortWithTheHandle) {
  uint64_t h = allocate(32);
  free(h);
  EXPECT_DEATH(pin(h), "stale handle 0x[0-9a-f]+ .*mh_pin");
  EXPECT_DEATH(free(h), "stale handle .*mh_free");
  EXPECT_DEATH(pin(0x1234), "invalid handle 0x1234");
  EXPECT_DEATH(pin(kHandleTag | (uint64_t{Table::kCapacity} - 1)), "invalid handle");
  uint64_t live = allocate(32);
  EXPECT_DEATH(unpin(live), "is not pinned.*mh_unpin");
  // A forged generation of a live entry.
  EXPECT_DEATH(pin(live ^ (uint64_t{1} << kGenerationShift)), "stale handle");
  pin(live);
  EXPECT_DEATH(free(live), "is pinned.*mh_free");
  EXPECT_DEATH(reallocate(live, 4000), "is pinned.*mh_realloc");
  unpin(live);
  free(live);
}

// A store made sparse: `count` objects of `size`, all but every `keep`-th freed.
std::vector<uint64_t> makeSparse(size_t count, size_t size, size_t keep) {
  std::vector<uint64_t> all(count), kept;
  for (uint64_t& h : all) {
    h = allocate(size);
    fill(h, size);
  }
  for (size_t i = 0; i < count; i++) {
    if (i % keep == 0) {
      kept.push_back(all[i]);
    } else {
      EXPECT_EQ(mismatches(all[i], size), 0u);
      free(all[i]);
    }
  }
  return kept;
}

TEST_F(HandleTest, APassMovesObjectsAndGivesChunksBack) {
  constexpr size_t kSize = 200;
  unsigned c = SizeClasses::classOf(kSize);
  std::vector<uint64_t> kept = makeSparse(40000, kSize, 8);
  std::vector<uintptr_t> before;
  for (uint64_t h : kept) {
    before.push_back(reinterpret_cast<uintptr_t>(pin(h)));
    unpin(h);
  }
  size_t committedBefore = Store::classCommittedBytes(c);
  uint64_t movedBefore = gCounters.movedObjects.load();
  PassResult result = Defragmenter::pass(0, 0);
  EXPECT_GT(result.releasedBytes, 0u);
  EXPECT_GT(gCounters.movedObjects.load(), movedBefore);
  size_t committed = Store::classCommittedBytes(c);
  size_t live = Store::classLiveBytes(c);
  EXPECT_LT(committed, committedBefore / 4);
  // Full chunks but at most one partly used one (plus its bookkeeping and tail).
  EXPECT_LE(committed, live * 110 / 100 + 2 * Store::layout(c).chunkBytes);
  size_t movedHere = 0;
  for (size_t i = 0; i < kept.size(); i++) {
    EXPECT_EQ(mismatches(kept[i], kSize), 0u);
    movedHere += reinterpret_cast<uintptr_t>(pin(kept[i])) != before[i];
    unpin(kept[i]);
  }
  EXPECT_GT(movedHere, kept.size() / 2);
  for (uint64_t h : kept) free(h);
}

TEST_F(HandleTest, PinnedObjectsNeverMove) {
  constexpr size_t kSize = 96;
  std::vector<uint64_t> kept = makeSparse(20000, kSize, 10);
  std::vector<std::pair<uint64_t, void*>> pinned;
  for (size_t i = 0; i < kept.size(); i += 7) pinned.push_back({kept[i], pin(kept[i])});
  uint64_t moved = gCounters.movedObjects.load();
  for (int pass = 0; pass < 3; pass++) {
    Defragmenter::pass(0, 0);
    for (auto& [h, p] : pinned) {
      EXPECT_EQ(pin(h), p);
      unpin(h);
    }
  }
  EXPECT_GT(gCounters.movedObjects.load(), moved);  // the others did move
  EXPECT_GE(pinnedCount(), pinned.size());
  for (auto& [h, p] : pinned) unpin(h);
  for (uint64_t h : kept) {
    EXPECT_EQ(mismatches(h, kSize), 0u);
    free(h);
  }
}

// Randomised, in the style of the JEFF thesis (section 3.4): random sizes and operations,
// passes in between, every object checked against its handle's pattern.
size_t randomisedRun(uint64_t seed, size_t operations) {
  std::mt19937_64 rng(seed);
  std::vector<std::pair<uint64_t, size_t>> live;
  size_t wrong = 0;
  for (size_t op = 0; op < operations; op++) {
    unsigned kind = rng() % 100;
    if (kind < 55 || live.size() < 100) {
      size_t size = rng() % 32 ? 1 + rng() % 1024 : 1 + rng() % 20000;
      uint64_t h = allocate(size);
      fill(h, size);
      live.push_back({h, size});
    } else if (kind < 90) {
      size_t i = rng() % live.size();
      wrong += mismatches(live[i].first, live[i].second);
      free(live[i].first);
      live[i] = live.back();
      live.pop_back();
    } else if (kind < 99 || rng() % 4) {
      size_t i = rng() % live.size();
      size_t size = 1 + rng() % 3000;
      wrong += mismatches(live[i].first, std::min(size, live[i].second));
      reallocate(live[i].first, size);
      live[i].second = size;
      fill(live[i].first, size);
    } else {
      Defragmenter::pass(0, 0);
      for (auto& [h, size] : live) wrong += mismatches(h, size);
    }
  }
  Defragmenter::pass(0, 0);
  for (auto& [h, size] : live) {
    wrong += mismatches(h, size);
    free(h);
  }
  return wrong;
}

#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
constexpr size_t kRandomOperations = 10000;  // each about 20 times slower
#else
constexpr size_t kRandomOperations = 30000;
#endif

TEST_F(HandleTest, RandomisedOperationsKeepEveryPattern) {
  uint64_t moved = gCounters.movedObjects.load();
  EXPECT_EQ(randomisedRun(1, kRandomOperations), 0u);
  EXPECT_GT(gCounters.movedObjects.load(), moved);
}

// The mutation check: with one byte of every move corrupted, the same test must see it.
TEST_F(HandleTest, RandomisedOperationsCatchACorruptedMove) {
  Defragmenter::corruptMovesForTesting(true);
  EXPECT_GT(randomisedRun(2, kRandomOperations), 0u);
}

TEST_F(HandleTest, ControllerRunsBetweenTheBounds) {
  constexpr size_t kMiB = size_t{1} << 20;
  // Below the minimum gain: never.
  EXPECT_FALSE(Controller::shouldRun(kMiB / 2, 1, false));
  // Starts above F_ub (1.1), keeps going down to F_lb (1.05).
  EXPECT_FALSE(Controller::shouldRun(108 * kMiB, 100 * kMiB, false));
  EXPECT_TRUE(Controller::shouldRun(112 * kMiB, 100 * kMiB, false));
  EXPECT_TRUE(Controller::shouldRun(108 * kMiB, 100 * kMiB, true));
  EXPECT_FALSE(Controller::shouldRun(100 * kMiB + kMiB, 100 * kMiB, true));
}

// Meshing and the defragmenter charge one clock: each one's CPU time, divided by its budget,
// moves it for both; a spender allowed credit finds it no further back than that.
TEST_F(HandleTest, MeshingAndTheDefragmenterShareOneCpuBudget) {
  constexpr uint64_t kMs = 1000000;
  uint64_t before = CpuBudget::clock();
  uint64_t now = before + 1000 * kMs;
  uint64_t meshing = CpuBudget::spentNs(CpuBudget::kMeshing);
  uint64_t handles = CpuBudget::spentNs(CpuBudget::kHandles);
  // 10 ms at 100 per mille: 100 ms of budget time, from now (no credit).
  EXPECT_EQ(CpuBudget::charge(CpuBudget::kMeshing, 10 * kMs, 100, now, 0), now + 100 * kMs);
  // 5 ms at 50 per mille after it: 100 ms more, for both.
  EXPECT_EQ(CpuBudget::charge(CpuBudget::kHandles, 5 * kMs, 50, now, 0), now + 200 * kMs);
  EXPECT_EQ(CpuBudget::clock(), now + 200 * kMs);
  // Ten seconds on, with five of credit: from five seconds back.
  uint64_t later = now + 10000 * kMs;
  EXPECT_EQ(CpuBudget::charge(CpuBudget::kMeshing, 1 * kMs, 100, later, 5000 * kMs),
            later - 5000 * kMs + 10 * kMs);
  EXPECT_EQ(CpuBudget::spentNs(CpuBudget::kMeshing), meshing + 11 * kMs);
  EXPECT_EQ(CpuBudget::spentNs(CpuBudget::kHandles), handles + 5 * kMs);
  CpuBudget::setClockForTesting(before);
}

}  // namespace
}  // namespace meshalloc::handles
