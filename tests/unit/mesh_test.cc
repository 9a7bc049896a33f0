// Meshing, in-process: spans whose live objects sit at disjoint offsets are meshed onto one
// physical span; every object stays readable and writable through its own address and through
// every alias; frees through any alias land in the one bitmap; a fully freed meshed span
// becomes plain memory again; mapping failures undo the mesh; fork snapshots meshed pages.
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "heap/arena.h"
#include "heap/config.h"
#include "heap/global_heap.h"
#include "heap/heap.h"
#include "heap/operation_guard.h"
#include "mesh/mesher.h"
#include "mesh/policy.h"
#include "mesh/retired_spans.h"
#include "mesh/span_backing.h"
#include "mesh/split_mesher.h"
#include "mesh/write_barrier.h"
#include "platform/os.h"

namespace meshalloc {
namespace {

uint64_t patternFor(uintptr_t address, uint64_t generation) {
  return (address * 0x9e3779b97f4a7c15ull) ^ (generation << 1) ^ 0x5bd1e995u;
}

void fill(void* p, size_t size, uint64_t generation) {
  uint64_t* words = static_cast<uint64_t*>(p);
  for (size_t i = 0; i < size / sizeof(uint64_t); i++) {
    words[i] = patternFor(reinterpret_cast<uintptr_t>(p) + i, generation);
  }
}

bool holds(const void* p, size_t size, uint64_t generation, uintptr_t identity) {
  const uint64_t* words = static_cast<const uint64_t*>(p);
  for (size_t i = 0; i < size / sizeof(uint64_t); i++) {
    if (words[i] != patternFor(identity + i, generation)) return false;
  }
  return true;
}

uintptr_t spanStartOf(const void* p) {
  uintptr_t address = reinterpret_cast<uintptr_t>(p);
  return Arena::spanStartOf(address, Arena::entryFor(address));
}

Span* ownerOf(uintptr_t address) {
  return PageEntry::span(Arena::entryFor(address));
}

struct Survivor {
  void* pointer;
  uintptr_t spanStart;
  size_t slot;
};

// Fills `spanCount` fresh spans of `size` on a short-lived thread, in address order, and keeps
// in span k (0 to spanCount - 1) the slots for which keep(k, slot) holds, filled with generation
// 1; the rest is freed. The thread exits, so its spans are detached (mesh candidates).
template <typename Keep>
std::vector<Survivor> keepInFullSpans(size_t size, size_t spanCount, Keep keep) {
  const SpanPlan& plan = SizeClasses::plan(SizeClasses::classOf(size));
  std::vector<Survivor> survivors;
  HeapConfig saved = gHeapConfig;
  gHeapConfig.randomization = Randomization::kNone;
  std::thread([&] {
    std::map<uintptr_t, std::vector<void*>> bySpan;
    // Until spanCount spans were filled entirely here: partial spans left by earlier tests in
    // the same process are handed out first, and never fill up.
    constexpr size_t kMaxSpansTried = 4096;
    size_t filled = 0;
    while (filled < spanCount && bySpan.size() < kMaxSpansTried) {
      void* p = heap::allocate(size);
      std::vector<void*>& objects = bySpan[spanStartOf(p)];
      objects.push_back(p);
      if (objects.size() == plan.objectCount) filled++;
    }
    size_t k = 0;
    std::vector<void*> release;
    for (auto& [start, objects] : bySpan) {
      bool chosen = k < spanCount && objects.size() == plan.objectCount;
      for (void* p : objects) {
        size_t slot = (reinterpret_cast<uintptr_t>(p) - start) / plan.objectSize;
        if (chosen && keep(k, slot)) {
          fill(p, size, 1);
          survivors.push_back({p, start, slot});
        } else {
          release.push_back(p);
        }
      }
      if (chosen) k++;
    }
    for (void* p : release) heap::deallocate(p);
  }).join();
  gHeapConfig = saved;
  return survivors;
}

// Keeps in span k only the slots with slot % spanCount == k, so the survivors of different spans
// never share an offset.
std::vector<Survivor> makeDisjointSpans(size_t size, size_t spanCount) {
  return keepInFullSpans(size, spanCount,
                         [&](size_t k, size_t slot) { return slot % spanCount == k; });
}

// Allocates `count` blocks of `size`, writes and checks each, and frees them, on a thread of its
// own: a thread heap on the test's main thread would defer its later frees (the recycling ring)
// and change what other tests mesh.
void useOnAThread(size_t size, size_t count, uint64_t generation) {
  std::thread([&] {
    std::vector<void*> blocks;
    for (size_t i = 0; i < count; i++) {
      blocks.push_back(heap::allocate(size));
      fill(blocks.back(), size, generation);
    }
    for (void* p : blocks) {
      EXPECT_TRUE(holds(p, size, generation, reinterpret_cast<uintptr_t>(p)));
      heap::deallocate(p);
    }
  }).join();
}

class MeshTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(heap::ensureInitialized());
    MeshPolicy::init();
    saved_ = gHeapConfig;
    gHeapConfig.meshBackgroundThread = false;
    gHeapConfig.meshing = true;
  }
  void TearDown() override {
    SpanBacking::injectMapFailures(0);
    gHeapConfig = saved_;
  }
  HeapConfig saved_;
};

TEST_F(MeshTest, TwoSpansShareOnePhysicalSpan) {
  constexpr size_t kSize = 112;
  auto survivors = makeDisjointSpans(kSize, 2);
  ASSERT_FALSE(survivors.empty());
  uint64_t meshedBefore = Mesher::stats().meshedSpans;
  MeshPolicy::compactNow();
  EXPECT_GT(Mesher::stats().meshedSpans, meshedBefore);
  // The longest pause and, within it, the wait for guarded operations in flight.
  EXPECT_GT(Mesher::stats().pauseMaxNs, 0u);
  EXPECT_LE(Mesher::stats().pauseWaitMaxNs, Mesher::stats().pauseMaxNs);
  uintptr_t first = survivors.front().spanStart;
  uintptr_t second = survivors.back().spanStart;
  ASSERT_NE(first, second);
  Span* owner = ownerOf(first);
  ASSERT_EQ(owner, ownerOf(second)) << "both virtual spans resolve to one Span";
  ASSERT_NE(owner->mesh, nullptr);
  size_t objectSize = owner->objectSize;
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    // The same object is visible at the same offset of the other virtual span.
    uintptr_t other = (s.spanStart == first ? second : first) + s.slot * objectSize;
    EXPECT_TRUE(
        holds(reinterpret_cast<void*>(other), kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
  }
  // The compact map is the same through both virtual spans: each resolves to its own start, and
  // malloc_usable_size answers through either (meshing rewrote only the full entries).
  for (const Survivor& s : survivors) {
    uintptr_t other = (s.spanStart == first ? second : first) + s.slot * objectSize;
    uint16_t entry = Arena::classEntryFor(other);
    ASSERT_TRUE(PageClassEntry::isSmall(entry));
    EXPECT_EQ(PageClassEntry::sizeClass(entry), owner->sizeClass);
    EXPECT_EQ(Arena::spanStartOfClassEntry(other, entry), s.spanStart == first ? second : first);
    EXPECT_EQ(heap::usableSize(reinterpret_cast<void*>(other)), objectSize);
    EXPECT_EQ(heap::usableSize(s.pointer), objectSize);
  }
  // Writes through an object's own address are seen through the alias.
  const Survivor& s = survivors.front();
  fill(s.pointer, kSize, 2);
  uintptr_t alias = second + s.slot * objectSize;
  EXPECT_TRUE(
      holds(reinterpret_cast<void*>(alias), kSize, 2, reinterpret_cast<uintptr_t>(s.pointer)));
  fill(s.pointer, kSize, 1);

  // Free through both virtual spans; the last free restores plain memory.
  SpanBackingStats backingBefore = SpanBacking::stats();
  ArenaStats arenaBefore = Arena::stats();
  size_t spanBytes = owner->spanBytes(Arena::pageSize());  // owner dies with the last free
  for (const Survivor& x : survivors) heap::deallocate(x.pointer);
  SpanBackingStats backingAfter = SpanBacking::stats();
  ArenaStats arenaAfter = Arena::stats();
  EXPECT_LT(backingAfter.meshedSpans, backingBefore.meshedSpans);
  EXPECT_LT(backingAfter.aliasSpans, backingBefore.aliasSpans);
  // Both virtual spans were just mapped afresh, so they hold no pages: they go back as clean
  // runs, with no decommit call and no stay in the dirty cache.
  EXPECT_EQ(arenaAfter.activeBytes, arenaBefore.activeBytes - 2 * spanBytes);
  EXPECT_EQ(arenaAfter.dirtyBytes, arenaBefore.dirtyBytes);
  EXPECT_EQ(arenaAfter.purgedBytesTotal, arenaBefore.purgedBytesTotal);
  // The restored memory is ordinary again: allocate over it and use it.
  useOnAThread(kSize, 200, 3);
}

// With a background thread, the thread that frees a meshed span's last object only retires
// it: no mapping call on the program's thread. Its owner entries are cleared at once, so a
// stale free finds nothing; the restore happens when the background thread (here the test)
// calls restoreRetiredSpans.
std::vector<bool> gRetiredHookCalls;
bool backgroundRestores(bool wake) {
  gRetiredHookCalls.push_back(wake);
  return true;
}

TEST_F(MeshTest, ADeadMeshedSpanIsRetiredThenRestoredByTheBackgroundThread) {
  constexpr size_t kSize = 112;
  RetiredSpans::restore();
  auto survivors = makeDisjointSpans(kSize, 2);
  ASSERT_FALSE(survivors.empty());
  MeshPolicy::compactNow();
  uintptr_t first = survivors.front().spanStart;
  uintptr_t second = survivors.back().spanStart;
  ASSERT_NE(first, second);
  Span* owner = ownerOf(first);
  ASSERT_EQ(owner, ownerOf(second));
  ASSERT_NE(owner->mesh, nullptr);
  size_t spanBytes = owner->spanBytes(Arena::pageSize());

  gRetiredHookCalls.clear();
  RetiredSpans::setHook(backgroundRestores);
  SpanBackingStats backingBefore = SpanBacking::stats();
  ArenaStats arenaBefore = Arena::stats();
  for (const Survivor& x : survivors) heap::deallocate(x.pointer);
  EXPECT_EQ(RetiredSpans::count(), 1u);
  ASSERT_EQ(gRetiredHookCalls.size(), 1u);
  EXPECT_FALSE(gRetiredHookCalls[0]) << "one retired span is below the wake-up threshold";
  EXPECT_EQ(SpanBacking::stats().meshedSpans, backingBefore.meshedSpans) << "not restored yet";
  EXPECT_EQ(Arena::entryFor(first), 0u);
  EXPECT_EQ(Arena::entryFor(second), 0u);
  EXPECT_EQ(Arena::classEntryFor(second), 0u);

  RetiredSpans::restore();
  RetiredSpans::setHook(MeshPolicy::onRetiredSpans);
  EXPECT_EQ(RetiredSpans::count(), 0u);
  SpanBackingStats backingAfter = SpanBacking::stats();
  EXPECT_EQ(backingAfter.meshedSpans, backingBefore.meshedSpans - 1);
  EXPECT_LT(backingAfter.aliasSpans, backingBefore.aliasSpans);
  ArenaStats arenaAfter = Arena::stats();
  EXPECT_EQ(arenaAfter.activeBytes, arenaBefore.activeBytes - 2 * spanBytes);
  EXPECT_EQ(arenaAfter.dirtyBytes, arenaBefore.dirtyBytes);
}

// Threads free the last objects of meshed spans (retiring them) while another thread restores
// retired spans in a loop, as the background thread does: every span ends restored, the memory
// is usable again, and (under TSan) nothing races.
std::atomic<uint64_t> gConcurrentHookCalls{0};
bool concurrentBackgroundRestores(bool) {
  gConcurrentHookCalls.fetch_add(1, std::memory_order_relaxed);
  return true;
}

TEST_F(MeshTest, RetiringAndRestoringRunConcurrently) {
  constexpr size_t kSize = 144;
  constexpr int kPairs = 8;
  constexpr int kFreeingThreads = 2;
  RetiredSpans::restore();
  size_t meshedBefore = SpanBacking::stats().meshedSpans;
  std::vector<Survivor> survivors;
  for (int pair = 0; pair < kPairs; pair++) {
    auto made = makeDisjointSpans(kSize, 2);
    MeshPolicy::compactNow();
    survivors.insert(survivors.end(), made.begin(), made.end());
  }
  ASSERT_GT(SpanBacking::stats().meshedSpans, meshedBefore) << "nothing was meshed";
  for (const Survivor& x : survivors)
    ASSERT_TRUE(holds(x.pointer, kSize, 1, reinterpret_cast<uintptr_t>(x.pointer)));

  gConcurrentHookCalls.store(0);
  RetiredSpans::setHook(concurrentBackgroundRestores);
  std::atomic<bool> stop{false};
  std::thread restorer([&] {
    while (!stop.load(std::memory_order_relaxed)) RetiredSpans::restore();
  });
  std::vector<std::thread> freeing;
  for (int t = 0; t < kFreeingThreads; t++) {
    freeing.emplace_back([&, t] {
      for (size_t i = t; i < survivors.size(); i += kFreeingThreads)
        heap::deallocate(survivors[i].pointer);
    });
  }
  for (std::thread& thread : freeing) thread.join();
  stop.store(true, std::memory_order_relaxed);
  restorer.join();
  RetiredSpans::restore();
  RetiredSpans::setHook(MeshPolicy::onRetiredSpans);
  EXPECT_GT(gConcurrentHookCalls.load(), 0u) << "no meshed span was retired";
  EXPECT_EQ(RetiredSpans::count(), 0u);
  EXPECT_EQ(SpanBacking::stats().meshedSpans, meshedBefore);
  // The restored memory is ordinary again.
  useOnAThread(kSize, survivors.size() * 4, 4);
}

TEST_F(MeshTest, SeveralSpansMeshOntoOne) {
  constexpr size_t kSize = 96;
  constexpr size_t kSpans = 6;
  auto survivors = makeDisjointSpans(kSize, kSpans);
  MeshPolicy::compactNow();
  MeshPolicy::compactNow();
  std::map<Span*, std::set<uintptr_t>> physical;
  for (const Survivor& s : survivors) physical[ownerOf(s.spanStart)].insert(s.spanStart);
  size_t largest = 0;
  for (auto& [owner, starts] : physical) largest = std::max(largest, starts.size());
  EXPECT_GE(largest, 3u) << "a chain of more than two virtual spans on one physical span";
  EXPECT_LT(physical.size(), kSpans);
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
  }
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
}

// A meshed span's record has room for a few aliases (64 bytes: most meshed spans have one or
// two) and moves to a larger one when its chain outgrows it; every virtual span of the chain
// stays recorded and resolves to the one physical span.
TEST_F(MeshTest, AMeshRecordStartsSmallAndGrowsWithItsChain) {
  constexpr size_t kSize = 96;
  // A pair's record is the small one.
  auto pair = makeDisjointSpans(kSize, 2);
  ASSERT_FALSE(pair.empty());
  MeshPolicy::compactNow();
  Span* pairOwner = ownerOf(pair.front().spanStart);
  ASSERT_EQ(ownerOf(pair.back().spanStart), pairOwner) << "the pair meshed";
  ASSERT_NE(pairOwner->mesh, nullptr);
  EXPECT_EQ(pairOwner->mesh->aliasCount, 1u);
  EXPECT_LE(MeshInfo::bytesFor(pairOwner->mesh->aliasCapacity), 64u);
  for (const Survivor& s : pair) heap::deallocate(s.pointer);
  heap::flushThreadCache();

  constexpr size_t kSpans = 8;
  auto survivors = makeDisjointSpans(kSize, kSpans);
  ASSERT_FALSE(survivors.empty());
  for (int pass = 0; pass < 3; pass++) MeshPolicy::compactNow();
  std::map<Span*, std::set<uintptr_t>> physical;
  for (const Survivor& s : survivors) physical[ownerOf(s.spanStart)].insert(s.spanStart);
  size_t largest = 0;
  for (auto& [owner, starts] : physical) {
    largest = std::max(largest, starts.size());
    if (starts.size() < 2) continue;
    ASSERT_NE(owner->mesh, nullptr);
    // The record lists exactly the chain's virtual spans besides the owner's own.
    std::set<uintptr_t> recorded = {owner->spanStart};
    for (uint32_t i = 0; i < owner->mesh->aliasCount; i++) {
      recorded.insert(owner->mesh->aliases()[i]);
      EXPECT_EQ(ownerOf(owner->mesh->aliases()[i]), owner);
    }
    EXPECT_EQ(recorded.size(), owner->mesh->aliasCount + 1u) << "no start recorded twice";
    for (uintptr_t start : starts) EXPECT_EQ(recorded.count(start), 1u) << "a virtual span lost";
  }
  EXPECT_GT(largest, MeshInfo::kInitialAliases + 1) << "a chain outgrew the small record";
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
  }
  SpanBackingStats before = SpanBacking::stats();
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
  heap::flushThreadCache();
  // Every chain died and was restored through its (moved) record.
  RetiredSpans::restore();
  EXPECT_LT(SpanBacking::stats().aliasSpans, before.aliasSpans);
  useOnAThread(kSize, survivors.size() * 4, 3);
}

// Two pairs of spans of `size`, each pair meshed onto one physical span, with survivors in
// slots 0-1 (first pair) and 2-3 (second pair) mod 4: the two pairs can mesh with each other.
struct TwoMeshedPairs {
  std::vector<Survivor> survivors;
  uintptr_t a, b, c, d;  // the first pair's virtual spans, then the second's
};

TwoMeshedPairs makeTwoMeshedPairs(size_t size) {
  // Keeps the survivors in slots congruent to `first` or `first + 1` mod 4 (one per span).
  auto thin = [](const std::vector<Survivor>& survivors, size_t first) {
    std::vector<Survivor> kept;
    for (const Survivor& s : survivors) {
      if (s.slot % 4 == first + s.slot % 2)
        kept.push_back(s);
      else
        heap::deallocate(s.pointer);
    }
    heap::flushThreadCache();  // frees into spans this thread does not hold are deferred
    return kept;
  };
  TwoMeshedPairs pairs;
  // The first pair meshes full (even and odd slots), so it is no candidate while the second
  // pair meshes on its own; only then is it thinned out to slots 0 and 1 mod 4.
  auto firstPair = makeDisjointSpans(size, 2);
  MeshPolicy::compactNow();
  auto secondPair = thin(makeDisjointSpans(size, 2), 2);
  MeshPolicy::compactNow();
  firstPair = thin(firstPair, 0);
  pairs.a = firstPair.front().spanStart;
  pairs.b = firstPair.back().spanStart;
  pairs.c = secondPair.front().spanStart;
  pairs.d = secondPair.back().spanStart;
  pairs.survivors = firstPair;
  pairs.survivors.insert(pairs.survivors.end(), secondPair.begin(), secondPair.end());
  return pairs;
}

void expectTwoSeparateMeshedPairs(const TwoMeshedPairs& p) {
  ASSERT_NE(p.a, p.b);
  ASSERT_EQ(ownerOf(p.a), ownerOf(p.b)) << "the first pair is meshed";
  ASSERT_EQ(ownerOf(p.c), ownerOf(p.d)) << "the second pair is meshed";
  ASSERT_NE(ownerOf(p.a), ownerOf(p.c));
  ASSERT_NE(ownerOf(p.a)->mesh, nullptr);
  ASSERT_NE(ownerOf(p.c)->mesh, nullptr);
}

// Two meshed spans mesh with each other: every virtual span of the source moves onto the
// destination's pages. Without this a heap whose spans had all been meshed once could not
// shrink further as they emptied out.
TEST_F(MeshTest, MeshedSpansMeshWithEachOther) {
  constexpr size_t kSize = 300;
  TwoMeshedPairs p = makeTwoMeshedPairs(kSize);
  ASSERT_NO_FATAL_FAILURE(expectTwoSeparateMeshedPairs(p));
  size_t bytes = ownerOf(p.a)->spanBytes(Arena::pageSize());
  SpanBackingStats before = SpanBacking::stats();
  uint64_t meshedBefore = Mesher::stats().meshedSpans;
  MeshPolicy::compactNow();
  Span* owner = ownerOf(p.a);
  for (uintptr_t start : {p.b, p.c, p.d}) EXPECT_EQ(ownerOf(start), owner) << "one physical span";
  EXPECT_EQ(owner->mesh->aliasCount, 3u);
  SpanBackingStats after = SpanBacking::stats();
  EXPECT_EQ(after.meshedSpans, before.meshedSpans - 1);
  EXPECT_EQ(after.aliasSpans, before.aliasSpans + 1);
  EXPECT_EQ(after.releasedBytes, before.releasedBytes + bytes);
  EXPECT_EQ(Mesher::stats().meshedSpans, meshedBefore + 1);

  // Every object reads back through its own address and through all four virtual spans, and
  // writes through one are seen through the others.
  for (const Survivor& s : p.survivors) {
    uintptr_t identity = reinterpret_cast<uintptr_t>(s.pointer);
    for (uintptr_t start : {p.a, p.b, p.c, p.d}) {
      void* view = reinterpret_cast<void*>(start + s.slot * owner->objectSize);
      ASSERT_TRUE(holds(view, kSize, 1, identity)) << "slot " << s.slot;
    }
    fill(s.pointer, kSize, 2);
    uintptr_t other = (s.spanStart == p.a ? p.d : p.a) + s.slot * owner->objectSize;
    ASSERT_TRUE(holds(reinterpret_cast<void*>(other), kSize, 2, identity));
  }
  // Frees through every virtual span land in the one bitmap; the last restores plain memory.
  for (const Survivor& s : p.survivors) heap::deallocate(s.pointer);
  heap::flushThreadCache();
  SpanBackingStats restored = SpanBacking::stats();
  EXPECT_EQ(restored.meshedSpans, after.meshedSpans - 1);
  EXPECT_EQ(restored.aliasSpans, after.aliasSpans - 3);
}

// Moving a virtual span costs mapping calls, so when a meshed span meshes with a private one,
// the meshed span stays the destination whichever half of the split it lands in.
TEST_F(MeshTest, TheLongerChainStaysPut) {
  constexpr size_t kSize = 300;
  for (int trial = 0; trial < 4; trial++) {
    // A full meshed pair (even and odd slots), then a private span with slots 2 mod 4; the
    // pair is thinned to slots 0 and 1 mod 4, so the two fit.
    auto pair = makeDisjointSpans(kSize, 2);
    MeshPolicy::compactNow();
    std::vector<Survivor> kept, single;
    for (const Survivor& s : makeDisjointSpans(kSize, 2)) {
      if (s.slot % 4 == 2)
        single.push_back(s);
      else
        heap::deallocate(s.pointer);
    }
    for (const Survivor& s : pair) {
      if (s.slot % 4 < 2)
        kept.push_back(s);
      else
        heap::deallocate(s.pointer);
    }
    heap::flushThreadCache();
    ASSERT_FALSE(single.empty());
    uintptr_t a = kept.front().spanStart, b = kept.back().spanStart;
    uintptr_t e = single.front().spanStart;
    Span* chain = ownerOf(a);
    ASSERT_EQ(ownerOf(b), chain);
    ASSERT_EQ(SpanBacking::virtualSpans(chain), 2u);
    ASSERT_EQ(SpanBacking::virtualSpans(ownerOf(e)), 1u);
    MeshPolicy::compactNow();
    EXPECT_EQ(ownerOf(e), chain) << "the single span moved onto the pair (trial " << trial << ")";
    EXPECT_EQ(ownerOf(a), chain);
    EXPECT_EQ(chain->mesh->aliasCount, 2u);
    kept.insert(kept.end(), single.begin(), single.end());
    for (const Survivor& s : kept)
      EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    for (const Survivor& s : kept) heap::deallocate(s.pointer);
    heap::flushThreadCache();
  }
}

// A meshed source whose second virtual span cannot be moved: the first goes back, and every
// object stays in place, readable and writable, until a later pass succeeds.
TEST_F(MeshTest, MeshedSourceMappingFailureUndoesTheMove) {
  constexpr size_t kSize = 300;
  TwoMeshedPairs p = makeTwoMeshedPairs(kSize);
  ASSERT_NO_FATAL_FAILURE(expectTwoSeparateMeshedPairs(p));
  SpanBackingStats before = SpanBacking::stats();
  uint64_t failedBefore = Mesher::stats().failedMeshes;
  SpanBacking::injectMapFailures(1 << 20, 1);  // one mapping call succeeds, then all fail
  MeshPolicy::compactNow();
  SpanBacking::injectMapFailures(0);
  EXPECT_GT(Mesher::stats().failedMeshes, failedBefore);
  EXPECT_EQ(Mesher::stats().strandedSpans, 0u);
  EXPECT_EQ(SpanBacking::stats().meshedSpans, before.meshedSpans);
  EXPECT_EQ(SpanBacking::stats().aliasSpans, before.aliasSpans);
  ASSERT_NO_FATAL_FAILURE(expectTwoSeparateMeshedPairs(p));
  for (const Survivor& s : p.survivors) {
    uintptr_t identity = reinterpret_cast<uintptr_t>(s.pointer);
    ASSERT_TRUE(holds(s.pointer, kSize, 1, identity));
    fill(s.pointer, kSize, 3);  // writable: the protection was lifted
    // Its pair's other virtual span shows the same pages, so the write is seen there.
    uintptr_t pairOther = s.spanStart == p.a   ? p.b
                          : s.spanStart == p.b ? p.a
                          : s.spanStart == p.c ? p.d
                                               : p.c;
    void* view = reinterpret_cast<void*>(pairOther + s.slot * ownerOf(p.a)->objectSize);
    ASSERT_TRUE(holds(view, kSize, 3, identity));
  }
  MeshPolicy::compactNow();
  EXPECT_EQ(ownerOf(p.a), ownerOf(p.c)) << "the next pass meshes them";
  for (const Survivor& s : p.survivors)
    EXPECT_TRUE(holds(s.pointer, kSize, 3, reinterpret_cast<uintptr_t>(s.pointer)));
  for (const Survivor& s : p.survivors) heap::deallocate(s.pointer);
  heap::flushThreadCache();
}

// Whether a virtual page is mapped in this process (/proc/self/pagemap's present bit).
bool pageMapped(uintptr_t address) {
  int fd = open("/proc/self/pagemap", O_RDONLY);
  if (fd < 0) return false;
  uint64_t entry = 0;
  off_t offset = static_cast<off_t>(address / Arena::pageSize() * sizeof(entry));
  bool read = pread(fd, &entry, sizeof(entry), offset) == static_cast<ssize_t>(sizeof(entry));
  close(fd);
  return read && (entry >> 63) & 1;
}

TEST_F(MeshTest, OnlyPagesWithLiveObjectsMoveIntoTheFile) {
  // Two objects per page, and 4 spans of which span k keeps the slots k, k + 4, ...; the spans
  // of k = 0 and 1 survive. Meshed, they have live objects in slots 0, 1, 4, 5, ...: every
  // other page, so half the pages should be holes in the file. (Spans of page-sized objects
  // are trimmed rather than meshed: Mesher::trimsAsWellAsMeshing.)
  const size_t kSize = Arena::pageSize() / 2;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  ASSERT_EQ(SizeClasses::plan(sizeClass).objectSize, kSize);
  auto survivors = makeDisjointSpans(kSize, 4);
  ASSERT_FALSE(survivors.empty());
  std::set<uintptr_t> spans;
  for (const Survivor& s : survivors) spans.insert(s.spanStart);
  ASSERT_EQ(spans.size(), 4u);
  uintptr_t first = 0, second = 0;
  std::vector<Survivor> kept;
  for (const Survivor& s : survivors) {
    if (s.slot % 4 < 2) {
      kept.push_back(s);
      (s.slot % 4 == 0 ? first : second) = s.spanStart;
    } else {
      heap::deallocate(s.pointer);
    }
  }
  MeshPolicy::compactNow();
  Span* owner = ownerOf(first);
  ASSERT_EQ(owner, ownerOf(second));
  ASSERT_NE(owner->mesh, nullptr);
  std::set<size_t> livePages;
  for (const Survivor& s : kept) livePages.insert(s.slot * kSize / Arena::pageSize());
  ASSERT_EQ(livePages.size(), owner->spanPages / 2);
  std::vector<unsigned char> resident(owner->spanPages);
  ASSERT_EQ(mincore(reinterpret_cast<void*>(owner->spanStart), owner->spanBytes(Arena::pageSize()),
                    resident.data()),
            0);
  for (size_t page = 0; page < owner->spanPages; page++) {
    bool live = livePages.count(page) != 0;
    // mincore on a file mapping reports the file's page: present only if it holds data.
    EXPECT_EQ(resident[page] & 1, live ? 1 : 0) << "page " << page;
    // And every page of the file is mapped by the destination itself, so PSS counts it.
    if (live) {
      EXPECT_TRUE(pageMapped(owner->spanStart + page * Arena::pageSize())) << "page " << page;
    }
  }
  for (const Survivor& s : kept) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    heap::deallocate(s.pointer);
  }
}

// A candidate that finds no partner keeps its objects where they are, but the pages on which no
// live object lies go back to the kernel in the pass (Mesher::trimFreePages): for objects of a
// page or more, that is every freed object at once, with no mesh needed.
TEST_F(MeshTest, UnpairedCandidatesGiveBackTheirFreePages) {
  const size_t kSize = Arena::pageSize();
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  const SpanPlan& plan = SizeClasses::plan(sizeClass);
  ASSERT_EQ(plan.objectSize, kSize);
  ASSERT_GE(plan.objectCount, 4u);
  const size_t perSpan = plan.objectCount;
  // Two spans whose survivors sit at the same slots (the first and the last), so they cannot
  // mesh.
  std::vector<Survivor> survivors = keepInFullSpans(
      kSize, 2, [&](size_t, size_t slot) { return slot == 0 || slot == perSpan - 1; });
  ASSERT_EQ(survivors.size(), 4u);

  uint64_t trimmedBefore = Mesher::stats().trimmedBytes;
  MeshPolicy::compactNow();
  for (size_t i = 0; i < survivors.size(); i += 2) {
    Span* span = ownerOf(survivors[i].spanStart);
    ASSERT_EQ(span->spanStart, survivors[i].spanStart) << "the spans were meshed";
    EXPECT_EQ(span->mesh, nullptr);
    EXPECT_EQ(span->trimmedBytes, (perSpan - 2) * kSize);
    std::vector<unsigned char> resident(span->spanPages);
    ASSERT_EQ(
        mincore(reinterpret_cast<void*>(span->spanStart), span->spanBytes(kSize), resident.data()),
        0);
    for (size_t page = 0; page < span->spanPages; page++) {
      bool live = page == 0 || page == perSpan - 1;
      EXPECT_EQ(resident[page] & 1, live ? 1 : 0) << "page " << page;
    }
  }
  EXPECT_GE(Mesher::stats().trimmedBytes - trimmedBefore, 2 * (perSpan - 2) * kSize);
  GlobalHeap::DetachedUsage usage = GlobalHeap::detachedUsage(sizeClass);
  uint64_t counted = 0;
  for (uint64_t bytes : usage.trimmedBytes) counted += bytes;
  EXPECT_GE(counted, 2 * (perSpan - 2) * kSize);
  for (const Survivor& s : survivors)
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
  // Handed out again, the trimmed pages are fresh memory: every block is written and read back,
  // and a span a thread attaches no longer counts its pages as given back.
  useOnAThread(kSize, 4 * perSpan, 2);
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    heap::deallocate(s.pointer);
  }
}

// Spans of whole-page objects are trimmed, never paired: two spans of page-sized objects with a
// survivor each at different slots could mesh, but trimming gives back every free page of both
// (meshing would give back one span's pages, at the cost of a copy and a remapping).
TEST_F(MeshTest, SpansOfWholePageObjectsAreTrimmedNotMeshed) {
  const size_t kSize = Arena::pageSize();
  const SpanPlan& plan = SizeClasses::plan(SizeClasses::classOf(kSize));
  ASSERT_EQ(plan.objectSize, kSize);
  const size_t perSpan = plan.objectCount;
  ASSERT_GE(perSpan, 4u);
  std::vector<Survivor> survivors = keepInFullSpans(
      kSize, 2, [&](size_t span, size_t slot) { return slot == (span == 0 ? 0 : perSpan - 1); });
  ASSERT_EQ(survivors.size(), 2u);
  uint64_t meshedBefore = Mesher::stats().meshedSpans;
  MeshPolicy::compactNow();
  EXPECT_EQ(Mesher::stats().meshedSpans, meshedBefore);
  for (const Survivor& s : survivors) {
    Span* span = ownerOf(s.spanStart);
    ASSERT_EQ(span->spanStart, s.spanStart) << "the spans were meshed";
    EXPECT_EQ(span->mesh, nullptr);
    EXPECT_EQ(span->trimmedBytes, (perSpan - 1) * kSize);
    EXPECT_EQ(os::residentBytes(reinterpret_cast<void*>(span->spanStart), span->spanBytes(kSize)),
              kSize);
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    heap::deallocate(s.pointer);
  }
}

// Spans too full to be mesh candidates are trimmed too when a freed object can leave a page
// empty: a span of page-sized objects with one object freed gives that page back.
TEST_F(MeshTest, SpansTooFullToMeshGiveBackTheirFreePages) {
  const size_t kSize = Arena::pageSize();
  const SpanPlan& plan = SizeClasses::plan(SizeClasses::classOf(kSize));
  const size_t perSpan = plan.objectCount;
  ASSERT_GT(perSpan * gHeapConfig.meshOccupancyPercent / 100 + 1, 1u);
  ASSERT_LT(perSpan * gHeapConfig.meshOccupancyPercent / 100 + 1, perSpan);
  // The first span keeps every object but slot 1, the second slot 0 only, so that the class has
  // two partial spans and a span's worth of free slots (what makes a pass visit it).
  std::vector<Survivor> survivors = keepInFullSpans(
      kSize, 2, [](size_t span, size_t slot) { return span == 0 ? slot != 1 : slot == 0; });
  ASSERT_EQ(survivors.size(), perSpan);
  MeshPolicy::compactNow();
  Span* full = ownerOf(survivors.front().spanStart);
  ASSERT_EQ(full->spanStart, survivors.front().spanStart);
  EXPECT_EQ(full->trimmedBytes, kSize);
  std::vector<unsigned char> resident(full->spanPages);
  ASSERT_EQ(
      mincore(reinterpret_cast<void*>(full->spanStart), full->spanBytes(kSize), resident.data()),
      0);
  for (size_t page = 0; page < perSpan; page++)
    EXPECT_EQ(resident[page] & 1, page == 1 ? 0 : 1) << "page " << page;
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    heap::deallocate(s.pointer);
  }
}

TEST_F(MeshTest, OverlappingSpansAreNotMeshable) {
  constexpr size_t kSize = 80;
  auto survivors = makeDisjointSpans(kSize, 2);
  Span* a = ownerOf(survivors.front().spanStart);
  Span* b = ownerOf(survivors.back().spanStart);
  ASSERT_NE(a, b);
  EXPECT_TRUE(SplitMesher::disjoint(a, b));
  EXPECT_TRUE(SplitMesher::disjoint(b, a));
  EXPECT_FALSE(SplitMesher::disjoint(a, a));
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
}

// A pinned span (one holding a buffer glibc has the kernel fill) is never a mesh candidate, so
// two spans that would mesh stay apart while one of them is pinned, and mesh once neither is.
TEST_F(MeshTest, PinnedSpansAreNeverMeshed) {
  constexpr size_t kSize = 160;
  auto survivors = makeDisjointSpans(kSize, 2);
  ASSERT_FALSE(survivors.empty());
  Span* a = ownerOf(survivors.front().spanStart);
  Span* b = ownerOf(survivors.back().spanStart);
  ASSERT_NE(a, b);
  size_t pinnedBefore = GlobalHeap::pinnedSpans();
  GlobalHeap::pin(a);
  GlobalHeap::pin(a);  // counted once
  EXPECT_EQ(GlobalHeap::pinnedSpans(), pinnedBefore + 1);
  MeshPolicy::compactNow();
  EXPECT_NE(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart))
      << "a pinned span was meshed";
  EXPECT_EQ(a->mesh, nullptr);
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    heap::deallocate(s.pointer);
  }
  EXPECT_EQ(GlobalHeap::pinnedSpans(), pinnedBefore) << "an emptied pinned span is still counted";
  // The same layout without the pin meshes: the test above could fail.
  auto unpinned = makeDisjointSpans(kSize, 2);
  MeshPolicy::compactNow();
  EXPECT_EQ(ownerOf(unpinned.front().spanStart), ownerOf(unpinned.back().spanStart));
  for (const Survivor& s : unpinned) heap::deallocate(s.pointer);
}

// allocatePinned pins the span of the block it returns, which the calling thread holds.
TEST_F(MeshTest, AllocatePinnedPinsAnAttachedSpan) {
  std::thread([] {
    constexpr size_t kSize = 4096;
    void* plain = heap::allocate(kSize);
    void* pinned = heap::allocatePinned(kSize);
    ASSERT_NE(pinned, nullptr);
    Span* span = ownerOf(reinterpret_cast<uintptr_t>(pinned));
    EXPECT_TRUE(span->pinned.load());
    EXPECT_EQ(span->owner.load(), tlsThreadHeap);
    memset(pinned, 7, kSize);
    heap::deallocate(pinned);
    heap::deallocate(plain);
    // Large blocks are never meshed: nothing to pin.
    void* large = heap::allocatePinned(kMaxSmallSize + 1);
    ASSERT_NE(large, nullptr);
    heap::deallocate(large);
  }).join();
}

// Refills on a fresh thread: each one runs the meshing policy's slow-path hook.
void churnRefills() {
  std::thread([] {
    std::vector<void*> blocks;
    for (int i = 0; i < 20000; i++) blocks.push_back(heap::allocate(16 + (i % 64) * 16));
    for (void* p : blocks) heap::deallocate(p);
  }).join();
}

TEST_F(MeshTest, PolicyMeshesFromTheSlowPathOnlyWhenMeshingIsOn) {
  constexpr size_t kSize = 144;
  auto survivors = makeDisjointSpans(kSize, 2);
  gHeapConfig.meshMinGainBytes = 0;
  gHeapConfig.meshPeriodMs = 0;
  gHeapConfig.meshing = false;
  churnRefills();
  EXPECT_NE(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart));
  gHeapConfig.meshing = true;
  // A pass scheduled by earlier tests may still be pending (the period was 100 ms then).
  for (int attempt = 0;
       attempt < 40 && ownerOf(survivors.front().spanStart) != ownerOf(survivors.back().spanStart);
       attempt++) {
    churnRefills();
    if (ownerOf(survivors.front().spanStart) != ownerOf(survivors.back().spanStart))
      os::sleepNanos(50000000);
  }
  EXPECT_EQ(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart))
      << "no background thread: a refill must run the pass";
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
}

TEST_F(MeshTest, MappingFailureUndoesTheMesh) {
  constexpr size_t kSize = 176;
  auto survivors = makeDisjointSpans(kSize, 2);
  uint64_t meshedBefore = Mesher::stats().meshedSpans;
  uint64_t failedBefore = Mesher::stats().failedMeshes;
  SpanBacking::injectMapFailures(1 << 20);
  MeshPolicy::compactNow();
  SpanBacking::injectMapFailures(0);
  EXPECT_EQ(Mesher::stats().meshedSpans, meshedBefore);
  EXPECT_GT(Mesher::stats().failedMeshes, failedBefore);
  for (const Survivor& s : survivors) {
    ASSERT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
    fill(s.pointer, kSize, 1);  // still writable: the protection was lifted
  }
  EXPECT_NE(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart));
  // Failing only the alias (the destination is already shared) undoes that step alone.
  SpanBacking::injectMapFailures(0);
  MeshPolicy::compactNow();
  EXPECT_EQ(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart));
  for (const Survivor& s : survivors)
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)));
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
}

TEST_F(MeshTest, MappingsAreAccountedAndGivenBack) {
  constexpr size_t kSize = 208;
  auto survivors = makeDisjointSpans(kSize, 4);
  long before = os::countMappings();  // after the worker thread's stack is mapped
  size_t aliasesBefore = SpanBacking::stats().aliasSpans;
  MeshPolicy::compactNow();
  MeshPolicy::compactNow();
  size_t aliases = SpanBacking::stats().aliasSpans - aliasesBefore;
  long during = os::countMappings();
  EXPECT_GT(aliases, 0u);
  // Each alias (and the shared destination) splits at most one anonymous mapping in two.
  EXPECT_LE(during, before + 2 * static_cast<long>(aliases + 1) + 2);
  // The pass's count is read from /proc or estimated upwards from the last reading.
  EXPECT_GT(Mesher::stats().lastMappingCount, 0u);
  EXPECT_LE(static_cast<long>(Mesher::stats().lastMappingCount),
            during + 2 * static_cast<long>(aliases + 1) + 2);
  EXPECT_GT(Mesher::stats().mappingLimit, 0u);
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
  EXPECT_LE(os::countMappings(), before + 2);
}

TEST_F(MeshTest, ForkedChildGetsAPrivateSnapshotOfMeshedPages) {
  constexpr size_t kSize = 240;
  auto survivors = makeDisjointSpans(kSize, 2);
  MeshPolicy::compactNow();
  ASSERT_EQ(ownerOf(survivors.front().spanStart), ownerOf(survivors.back().spanStart));
  int toChild[2], toParent[2];
  ASSERT_EQ(pipe(toChild), 0);
  ASSERT_EQ(pipe(toParent), 0);
  pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    char byte;
    bool ok = true;
    for (const Survivor& s : survivors)
      ok &= holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer));
    for (const Survivor& s : survivors) fill(s.pointer, kSize, 7);  // the child's own values
    if (write(toParent[1], "c", 1) != 1) _exit(3);
    if (read(toChild[0], &byte, 1) != 1) _exit(3);  // the parent has written its values
    for (const Survivor& s : survivors)
      ok &= holds(s.pointer, kSize, 7, reinterpret_cast<uintptr_t>(s.pointer));
    // The child can still allocate and free, meshed spans included.
    for (const Survivor& s : survivors) heap::deallocate(s.pointer);
    void* p = heap::allocate(kSize);
    fill(p, kSize, 9);
    ok &= holds(p, kSize, 9, reinterpret_cast<uintptr_t>(p));
    _exit(ok ? 0 : 1);
  }
  char byte;
  ASSERT_EQ(read(toParent[0], &byte, 1), 1);
  for (const Survivor& s : survivors) {
    EXPECT_TRUE(holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer)))
        << "child's write seen by parent";
  }
  for (const Survivor& s : survivors) fill(s.pointer, kSize, 8);
  ASSERT_EQ(write(toChild[1], "p", 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "child saw the parent's writes or lost its own";
  for (const Survivor& s : survivors)
    EXPECT_TRUE(holds(s.pointer, kSize, 8, reinterpret_cast<uintptr_t>(s.pointer)));
  for (const Survivor& s : survivors) heap::deallocate(s.pointer);
  close(toChild[0]);
  close(toChild[1]);
  close(toParent[0]);
  close(toParent[1]);
}

// A seccomp filter installed after start-up can make membarrier(2) fail. The pause then falls
// back to a barrier of its own, guards pay for their own fences, and meshing goes on, every
// object intact; it says so once on stderr. (In a child process: the failure is for good.)
TEST_F(MeshTest, MeshingSurvivesMembarrierFailing) {
  if (!OperationGuard::asymmetric()) GTEST_SKIP() << "membarrier is not in use here";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        os::failMembarrierForTesting();
        constexpr size_t kSize = 112;
        auto survivors = makeDisjointSpans(kSize, 2);
        uint64_t meshedBefore = Mesher::stats().meshedSpans;
        MeshPolicy::compactNow();
        bool meshed = Mesher::stats().meshedSpans > meshedBefore;
        bool intact = !survivors.empty();
        for (const Survivor& s : survivors)
          intact &= holds(s.pointer, kSize, 1, reinterpret_cast<uintptr_t>(s.pointer));
        // A guarded operation (a free from a thread that does not hold the span) afterwards.
        std::thread([&] {
          for (const Survivor& s : survivors) heap::deallocate(s.pointer);
        }).join();
        bool fellBack = !OperationGuard::asymmetric() && OperationGuard::barrierAvailable();
        _exit(meshed && intact && fellBack ? 0 : 1);
      },
      ::testing::ExitedWithCode(0), "membarrier\\(2\\) failed after it was registered");
}

// A mesh batch's barrier names the spans it may write-protect, so a system call writing into
// any other heap memory need not wait for the batch (an event loop's epoll_wait or read would
// otherwise sleep through every batch); fork's barrier may protect anything.
TEST(WriteBarrierScope, ABatchBarrierCoversOnlyItsSpans) {
  constexpr size_t kBytes = 16384;
  const uintptr_t first = uintptr_t{0x7e0000000000};
  const uintptr_t second = first + 64 * kBytes;
  const uintptr_t spans[] = {first, second};
  WriteBarrier::beginSpans(spans, 2, kBytes);
  uint32_t batch = WriteBarrier::sequence();
  ASSERT_TRUE(batch & 1);
  EXPECT_TRUE(WriteBarrier::mayProtect(batch, first + 100, first + 200));
  EXPECT_TRUE(WriteBarrier::mayProtect(batch, second - 8, second + 8)) << "straddles the start";
  EXPECT_TRUE(WriteBarrier::mayProtect(batch, second + kBytes - 1, second + kBytes + 64));
  EXPECT_FALSE(WriteBarrier::mayProtect(batch, first + kBytes, first + 2 * kBytes))
      << "the neighbour of a protected span";
  EXPECT_FALSE(WriteBarrier::mayProtect(batch, second - kBytes, second));
  EXPECT_FALSE(WriteBarrier::mayProtect(batch, 0x1000, 0x2000));
  WriteBarrier::end();
  // An answer about a barrier that is over says "maybe": the caller reads the sequence again.
  EXPECT_TRUE(WriteBarrier::mayProtect(batch, 0x1000, 0x2000));

  WriteBarrier::begin();
  uint32_t everything = WriteBarrier::sequence();
  EXPECT_TRUE(WriteBarrier::mayProtect(everything, 0x1000, 0x2000));
  WriteBarrier::end();

  // More spans than the table holds: a barrier over everything.
  std::vector<uintptr_t> many(WriteBarrier::kMaxSpans + 1);
  for (size_t i = 0; i < many.size(); i++) many[i] = first + i * 2 * kBytes;
  WriteBarrier::beginSpans(many.data(), static_cast<uint32_t>(many.size()), kBytes);
  EXPECT_TRUE(WriteBarrier::mayProtect(WriteBarrier::sequence(), 0x1000, 0x2000));
  WriteBarrier::end();
}

// A write into a span of a batch waits for that span's release, not for the end of the batch
// (its other meshes and its commit): what a write can wait is one copy and one mapping call.
TEST(WriteBarrierScope, AWriteWaitsOnlyUntilItsSpanIsReleased) {
  ASSERT_TRUE(heap::ensureInitialized());
  ASSERT_TRUE(WriteBarrier::install());
  const size_t page = Arena::pageSize();
  // Two large blocks stand for two spans of a batch; one page of each is protected.
  void* blocks[] = {heap::allocate(16 * page), heap::allocate(16 * page)};
  ASSERT_NE(blocks[0], nullptr);
  ASSERT_NE(blocks[1], nullptr);
  uintptr_t spans[2];
  for (int i = 0; i < 2; i++)
    spans[i] = (reinterpret_cast<uintptr_t>(blocks[i]) + page - 1) & ~(page - 1);
  WriteBarrier::beginSpans(spans, 2, page);
  for (uintptr_t span : spans)
    ASSERT_TRUE(os::protectReadOnly(reinterpret_cast<void*>(span), page));
  uint64_t faultsBefore = WriteBarrier::faultsWaited();
  std::atomic<bool> wrote{false};
  std::thread writer([&] {
    *reinterpret_cast<volatile char*>(spans[0] + 8) = 42;
    wrote.store(true);
  });
  os::sleepNanos(50'000'000);
  EXPECT_FALSE(wrote.load()) << "a write went through a write-protected span";
  ASSERT_TRUE(os::protectReadWrite(reinterpret_cast<void*>(spans[0]), page));
  WriteBarrier::release(spans[0]);
  uint32_t sequence = WriteBarrier::sequence();
  EXPECT_FALSE(WriteBarrier::mayProtect(sequence, spans[0], spans[0] + page));
  EXPECT_TRUE(WriteBarrier::mayProtect(sequence, spans[1], spans[1] + page));
  for (int i = 0; i < 5000 && !wrote.load(); i++) os::sleepNanos(1'000'000);
  EXPECT_TRUE(wrote.load()) << "the write waited for the rest of the batch";
  EXPECT_TRUE(WriteBarrier::active());
  ASSERT_TRUE(os::protectReadWrite(reinterpret_cast<void*>(spans[1]), page));
  WriteBarrier::end();
  writer.join();
  EXPECT_EQ(*reinterpret_cast<volatile char*>(spans[0] + 8), 42);
  EXPECT_GE(WriteBarrier::faultsWaited(), faultsBefore + 1);
  for (void* block : blocks) heap::deallocate(block);
}

// A guarded operation that meets a short pause spins through it instead of sleeping (a sleep
// and wake-up cost more than the pause). Voluntary context switches tell the two apart; the
// bound leaves room for a loaded machine, where the waiter may lose its CPU to the pauser.
TEST(OperationGuardPause, AShortPauseIsWaitedThroughWithoutSleeping) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // A timing property: under a sanitizer the waiter's own path outlasts the awake wait.
  GTEST_SKIP() << "timing-dependent; checked in the release build";
#endif
  ASSERT_TRUE(heap::ensureInitialized());
  constexpr int kTrials = 40;
  int slept = 0;
  for (int trial = 0; trial < kTrials; trial++) {
    std::atomic<bool> waiting{false};
    std::atomic<bool> entered{false};
    long switches = 0;
    OperationGuard::pause();
    std::thread waiter([&] {
      ASSERT_NE(heap::currentThreadHeap(), nullptr);
      struct rusage before, after;
      getrusage(RUSAGE_THREAD, &before);
      waiting.store(true);
      {
        OperationGuard guard;
        entered.store(true);
      }
      getrusage(RUSAGE_THREAD, &after);
      switches = after.ru_nvcsw - before.ru_nvcsw;
    });
    while (!waiting.load()) std::this_thread::yield();
    uint64_t until = os::monotonicNanos() + 5000;  // the waiter reaches the guard meanwhile
    while (os::monotonicNanos() < until) {
    }
    EXPECT_FALSE(entered.load()) << "a guarded operation began during a pause";
    OperationGuard::resume();
    waiter.join();
    EXPECT_TRUE(entered.load());
    slept += switches > 0;
  }
  // Without the awake wait every trial sleeps (40 of 40).
  EXPECT_LE(slept, kTrials * 3 / 4) << "waiters slept through short pauses instead of spinning";
}

// The budget follows the gain at stake: the base budget below the fragmentation band (5 % of the
// heap free in detached spans), the maximum above it (29 %), linear in between, and never more
// than the maximum or less than the base.
TEST(MeshBudget, FollowsTheShareOfTheHeapFreeInDetachedSpans) {
  HeapConfig saved = gHeapConfig;
  gHeapConfig.meshBudgetPermille = 20;
  gHeapConfig.meshBudgetMaxPermille = 100;
  constexpr uint64_t kActive = 1000 << 20;
  EXPECT_EQ(MeshPolicy::budgetPermille(0, kActive), 20u);
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive / 20, kActive), 20u);         // 5 %
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive * 17 / 100, kActive), 60u);   // mid-band
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive * 29 / 100, kActive), 100u);  // 29 %
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive * 3, kActive), 100u);
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive, 0), 20u);
  // A maximum at or below the base turns the controller off.
  gHeapConfig.meshBudgetMaxPermille = 10;
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive, kActive), 20u);
  // Out-of-range options are clamped to one core.
  gHeapConfig.meshBudgetPermille = 5000;
  gHeapConfig.meshBudgetMaxPermille = 9000;
  EXPECT_EQ(MeshPolicy::budgetPermille(kActive, kActive), 1000u);
  gHeapConfig = saved;
}

}  // namespace
}  // namespace meshalloc
