#include "heap/heap.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "api/entry_points.h"
#include "api/stats.h"
#include "heap/config.h"
#include "heap/global_heap.h"
#include "heap/internal_heap.h"

namespace meshalloc {
namespace {

// Runs `body` on a fresh thread, so it gets a fresh thread heap with the current configuration.
template <typename Body>
void onNewThread(Body body) {
  std::thread thread(body);
  thread.join();
}

class HeapTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(heap::ensureInitialized());
    saved_ = gHeapConfig;
  }
  void TearDown() override { gHeapConfig = saved_; }
  HeapConfig saved_;
};

// malloc finds a size's vector by kVectorOffsets, built from the table SizeClasses::classOf reads
// (kClassBySize): the offset must name the same class at every small size (else malloc pops
// blocks of another size).
TEST(ThreadHeapTest, VectorOffsetsAgreeWithClassOf) {
  ASSERT_TRUE(heap::ensureInitialized());
  for (size_t size = 0; size <= kMaxSmallSize; size++) {
    size_t offset = kVectorOffsets.bySize[(size + kMinAlignment - 1) / kMinAlignment];
    ASSERT_EQ(offset, (SizeClasses::classOf(size) + 1) * ThreadHeap::kVectorStride)
        << "size " << size;
  }
}

TEST_F(HeapTest, ASpanHandsOutEverySlotExactlyOnce) {
  constexpr size_t kSize = 10240;
  unsigned c = SizeClasses::classOf(kSize);
  size_t perSpan = SizeClasses::plan(c).objectCount;
  onNewThread([&] {
    std::set<uintptr_t> seen;
    std::vector<void*> blocks;
    for (size_t i = 0; i < perSpan * 3; i++) {
      void* p = heap::allocate(kSize);
      ASSERT_NE(p, nullptr);
      ASSERT_TRUE(seen.insert(reinterpret_cast<uintptr_t>(p)).second) << "slot handed out twice";
      EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % kMinAlignment, 0u);
      memset(p, 0x5a, kSize);
      blocks.push_back(p);
    }
    for (void* p : blocks) heap::deallocate(p);
  });
}

std::vector<uintptr_t> firstAddresses(Randomization level, size_t size, size_t count) {
  gHeapConfig.randomization = level;
  std::vector<uintptr_t> addresses;
  onNewThread([&] {
    std::vector<void*> blocks;
    for (size_t i = 0; i < count; i++) blocks.push_back(heap::allocate(size));
    for (void* p : blocks) addresses.push_back(reinterpret_cast<uintptr_t>(p));
    for (void* p : blocks) heap::deallocate(p);
  });
  return addresses;
}

TEST_F(HeapTest, RandomizationZeroAllocatesInAddressOrder) {
  // A class no other test uses, so the thread starts from a fresh span.
  auto addresses = firstAddresses(Randomization::kNone, 7000, 20);
  for (size_t i = 1; i < addresses.size(); i++) EXPECT_EQ(addresses[i] - addresses[i - 1], 7168u);
}

TEST_F(HeapTest, RandomizationShufflesAllocationOrder) {
  for (Randomization level : {Randomization::kOnRefill, Randomization::kOnRefillAndFree}) {
    auto addresses = firstAddresses(level, 200, 64);
    EXPECT_FALSE(std::is_sorted(addresses.begin(), addresses.end()));
    EXPECT_FALSE(std::is_sorted(addresses.rbegin(), addresses.rend()));
    std::set<uintptr_t> distinct(addresses.begin(), addresses.end());
    EXPECT_EQ(distinct.size(), addresses.size());
  }
}

// At level 2 a local free is swapped into the vector at a random place (out of line,
// heap::deallocateShuffled): blocks freed in one order do not come back in the reverse order,
// as a push on top would hand them out, and each comes back once.
TEST_F(HeapTest, RandomizationTwoShufflesLocalFreesIn) {
  gHeapConfig.randomization = Randomization::kOnRefillAndFree;
  constexpr size_t kSize = 96;
  constexpr size_t kCount = 32;
  onNewThread([&] {
    std::vector<void*> blocks;
    for (size_t i = 0; i < kCount; i++) blocks.push_back(heap::allocate(kSize));
    for (void* p : blocks) heap::deallocate(p);
    std::vector<void*> again;
    for (size_t i = 0; i < kCount; i++) again.push_back(heap::allocate(kSize));
    std::vector<void*> reversed(blocks.rbegin(), blocks.rend());
    EXPECT_NE(again, reversed) << "level 2 pushed the frees on top";
    std::set<void*> distinct(again.begin(), again.end());
    EXPECT_EQ(distinct.size(), kCount);
    for (void* p : again) heap::deallocate(p);
  });
}

// Slot index of `address` within its virtual span.
size_t slotInSpan(uintptr_t address, size_t objectSize) {
  return (address - Arena::spanStartOf(address, Arena::entryFor(address))) / objectSize;
}

TEST_F(HeapTest, RotatedRunsHandOutEachSpanFromARandomSlotUpwards) {
  // A class no other test uses (2560 B: a few slots per span), so each thread starts from
  // fresh spans: a whole span's slots come out as one run, ascending from a random slot and
  // wrapping once to the span's first slot.
  gHeapConfig.randomization = Randomization::kRotatedRuns;
  constexpr size_t kSize = 2500;
  constexpr size_t kObjectSize = 2560;
  unsigned sizeClass = SizeClasses::classOf(kSize);
  ASSERT_EQ(SizeClasses::plan(sizeClass).objectSize, kObjectSize);
  size_t perSpan = SizeClasses::plan(sizeClass).objectCount;
  ASSERT_GE(perSpan, 4u);
  std::set<size_t> firstSlots;
  for (int trial = 0; trial < 40; trial++) {
    onNewThread([&] {
      std::vector<void*> blocks;
      for (size_t i = 0; i < perSpan; i++) blocks.push_back(heap::allocate(kSize));
      size_t first = slotInSpan(reinterpret_cast<uintptr_t>(blocks[0]), kObjectSize);
      firstSlots.insert(first);
      for (size_t i = 0; i < perSpan; i++) {
        uintptr_t address = reinterpret_cast<uintptr_t>(blocks[i]);
        EXPECT_EQ(slotInSpan(address, kObjectSize), (first + i) % perSpan) << "block " << i;
        // All from one span: the same span start.
        EXPECT_EQ(address - slotInSpan(address, kObjectSize) * kObjectSize,
                  reinterpret_cast<uintptr_t>(blocks[0]) - first * kObjectSize);
      }
      // A local free is handed out again next (no free-time shuffle at this level).
      void* reused = blocks[perSpan / 2];
      heap::deallocate(reused);
      EXPECT_EQ(heap::allocate(kSize), reused);
      for (void* p : blocks) heap::deallocate(p);
    });
  }
  // The start is random: 40 fresh spans start at more than one slot.
  EXPECT_GE(firstSlots.size(), std::min<size_t>(3, perSpan));
}

TEST_F(HeapTest, RotatedRunsVisitSpansInRandomOrder) {
  // A refill from several partly used spans hands each span's free slots out as one run, the
  // runs in random order: across trials, the first run is sometimes the higher span's.
  gHeapConfig.randomization = Randomization::kRotatedRuns;
  constexpr size_t kSize = 1500;  // 1536-byte class
  size_t perSpan = SizeClasses::plan(SizeClasses::classOf(kSize)).objectCount;
  ASSERT_GE(perSpan, 4u);
  int ascendingFirst = 0, descendingFirst = 0;
  for (int trial = 0; trial < 20; trial++) {
    onNewThread([&] {
      // Fill several spans, keep every other block, and hand the spans back: the next
      // allocation refills from partly used spans.
      std::vector<void*> blocks;
      for (size_t i = 0; i < perSpan * 4; i++) blocks.push_back(heap::allocate(kSize));
      std::vector<void*> kept;
      for (size_t i = 0; i < blocks.size(); i++) {
        if (i % 2) {
          heap::deallocate(blocks[i]);
        } else {
          kept.push_back(blocks[i]);
        }
      }
      heap::flushThreadCache();
      // The spans of the first refill's blocks, in the order they were served.
      std::vector<uintptr_t> spanOrder;
      std::vector<void*> refilled;
      for (size_t i = 0; i < perSpan; i++) {
        void* p = heap::allocate(kSize);
        refilled.push_back(p);
        uintptr_t address = reinterpret_cast<uintptr_t>(p);
        uintptr_t span = Arena::spanStartOf(address, Arena::entryFor(address));
        if (spanOrder.empty() || spanOrder.back() != span) {
          // A span's run is contiguous in allocation order: it never comes back.
          EXPECT_EQ(std::count(spanOrder.begin(), spanOrder.end(), span), 0);
          spanOrder.push_back(span);
        }
      }
      if (spanOrder.size() >= 2) (spanOrder[0] < spanOrder[1] ? ascendingFirst : descendingFirst)++;
      for (void* p : refilled) heap::deallocate(p);
      for (void* p : kept) heap::deallocate(p);
    });
  }
  EXPECT_GT(ascendingFirst, 0);
  EXPECT_GT(descendingFirst, 0);
}

TEST_F(HeapTest, ShuffleIsRoughlyUniform) {
  // Which slot of its span does a thread's first allocation get? Over many fresh threads the
  // answer should cover most of the span's slots (nearly all of up to 64 slots for 200
  // draws), which a biased or missing shuffle would not.
  gHeapConfig.randomization = Randomization::kOnRefill;
  constexpr size_t kSize = 256;
  constexpr int kTrials = 200;
  std::set<uintptr_t> firstSlots;
  for (int t = 0; t < kTrials; t++) {
    onNewThread([&] {
      void* p = heap::allocate(kSize);
      firstSlots.insert(slotInSpan(reinterpret_cast<uintptr_t>(p), kSize));
      heap::deallocate(p);
    });
  }
  size_t slots = SizeClasses::plan(SizeClasses::classOf(kSize)).objectCount;
  EXPECT_GE(firstSlots.size(), std::min<size_t>(40, slots * 3 / 4)) << slots << " slots per span";
}

TEST_F(HeapTest, FreedMemoryGoesBackToTheOs) {
  constexpr size_t kSize = 256;
  constexpr size_t kCount = 40000;  // ~10 MiB
  ArenaStats before = Arena::stats();
  onNewThread([&] {
    std::vector<void*> blocks;
    for (size_t i = 0; i < kCount; i++) {
      blocks.push_back(heap::allocate(kSize));
      memset(blocks.back(), 1, kSize);
    }
    EXPECT_GE(Arena::stats().activeBytes, before.activeBytes + kCount * kSize);
    for (void* p : blocks) heap::deallocate(p);
  });
  heap::releaseFreeMemory();
  ArenaStats after = Arena::stats();
  EXPECT_LE(after.activeBytes, before.activeBytes + (1 << 20)) << "empty spans must leave the heap";
  EXPECT_EQ(after.dirtyBytes, 0u);
}

TEST_F(HeapTest, RemoteFreesEmptyAndReleaseSpans) {
  constexpr size_t kSize = 3000;
  constexpr size_t kCount = 5000;
  std::vector<void*> blocks;
  onNewThread([&] {
    for (size_t i = 0; i < kCount; i++) {
      blocks.push_back(heap::allocate(kSize));
      memset(blocks.back(), 7, kSize);
    }
  });  // the allocating thread is gone: its spans were detached on exit
  size_t activeWithObjects = Arena::stats().activeBytes;
  onNewThread([&] {
    for (void* p : blocks) heap::deallocate(p);
  });
  EXPECT_LT(Arena::stats().activeBytes + kCount * kSize / 2, activeWithObjects);
}

// Frees by another thread into spans still attached to their owner wait on the spans' stacks;
// the owner's next refill must drain them and hand the same slots out again (no new spans),
// and an owner that exits with blocks still on its stacks must return them too.
TEST_F(HeapTest, RemoteFreesIntoAttachedSpansAreReusedAndReturned) {
  constexpr size_t kSize = 256;
  constexpr size_t kSpans = 4;  // few enough that all stay attached to the owner
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  // Whole spans, so that the owner's vector is empty once the first batch is out and the
  // second batch can only come from the freed slots or from new spans.
  const size_t kCount = kSpans * SizeClasses::plan(sizeClass).objectCount;
  auto liveObjects = [&] { return api::collectStats().classes[sizeClass].liveObjects; };
  const size_t liveBefore = liveObjects();
  std::atomic<int> step{0};
  std::vector<void*> first(kCount), second(kCount);
  auto waitFor = [&](int value) {
    while (step.load() != value) std::this_thread::yield();
  };
  std::thread owner([&] {
    for (auto& p : first) p = heap::allocate(kSize);
    step = 1;
    waitFor(2);  // the other thread has freed them all
    for (auto& p : second) p = heap::allocate(kSize);
    step = 3;
    waitFor(4);  // ...and the second batch too, which the owner never drains before exiting
  });
  std::thread other([&] {
    waitFor(1);
    for (void* p : first) heap::deallocate(p);
    step = 2;
    waitFor(3);
    for (void* p : second) heap::deallocate(p);
    step = 4;
  });
  owner.join();
  other.join();
  std::set<void*> firstSet(first.begin(), first.end());
  size_t reused = 0;
  for (void* p : second) reused += firstSet.count(p);
  EXPECT_GE(reused, kCount * 9 / 10) << "the owner took new memory instead of its freed slots";
  EXPECT_EQ(liveObjects(), liveBefore) << "blocks left on an exiting owner's stacks leaked";
}

// A free into a span its thread does not hold is recycled (heap/shuffle_vector.h): the block is
// handed out again by the next allocations of its class, newest first; when the class's ring
// is full the oldest is applied to its span, and all of them when the thread's caches are
// flushed (statistics, malloc_trim, thread exit). None is ever lost.
TEST_F(HeapTest, FreesIntoOtherSpansAreRecycled) {
  constexpr size_t kSize = 256;
  constexpr size_t kCount = 200;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  auto liveObjects = [&] { return GlobalHeap::classStats(sizeClass).liveObjects; };
  const size_t before = liveObjects();
  onNewThread([&] {
    ShuffleVector& v = heap::currentThreadHeap()->vector(sizeClass);
    const size_t capacity = v.recycled.capacity();
    ASSERT_GE(capacity, kMinRecycled);
    ASSERT_LE(capacity, kMaxRecycled);
    std::vector<void*> blocks;
    for (size_t i = 0; i < kCount; i++) blocks.push_back(heap::allocate(kSize));
    heap::flushThreadCache();  // every span detached: each free below is recycled
    const size_t live = liveObjects();
    for (size_t i = 0; i < capacity; i++) heap::deallocate(blocks[i]);
    EXPECT_EQ(liveObjects(), live) << "a free into a detached span was not recycled";
    EXPECT_EQ(v.recycled.count(), capacity);
    heap::deallocate(blocks[capacity]);
    EXPECT_EQ(liveObjects(), live - 1) << "the oldest recycled block must be applied";
    // Reused newest first, with the tag gone.
    void* again = heap::allocate(kSize);
    EXPECT_EQ(again, blocks[capacity]);
    EXPECT_FALSE(isCacheTagged(reinterpret_cast<uintptr_t>(again)));
    EXPECT_EQ(heap::allocate(kSize), blocks[capacity - 1]);
    heap::deallocate(blocks[capacity - 1]);
    heap::deallocate(again);
    heap::flushRecycledBlocks();
    EXPECT_EQ(v.recycled.count(), 0u);
    EXPECT_EQ(liveObjects(), live - capacity - 1);
    for (size_t i = capacity + 1; i < kCount; i++) heap::deallocate(blocks[i]);
  });  // the thread's exit applies the rest
  EXPECT_EQ(liveObjects(), before) << "recycled blocks were lost at thread exit";
}

// With other threads about, the vector comes first, the recycled blocks only once it is empty:
// a thread that frees blocks of spans it does not hold (larson's, inherited from the thread
// before it) would otherwise keep getting those blocks back, and its frees of them would never
// become local.
TEST_F(HeapTest, RecycledBlocksServeOnlyAnEmptyVector) {
  constexpr size_t kSize = 256;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  ASSERT_NE(heap::currentThreadHeap(), nullptr);  // the test's thread has a heap in use too
  onNewThread([&] {
    ShuffleVector& v = heap::currentThreadHeap()->vector(sizeClass);
    // Another thread's blocks, in a span it filled: once that thread has exited the span is
    // detached and full, so no refill here attaches it.
    std::vector<void*> theirs(SizeClasses::plan(sizeClass).objectCount + 1);
    std::thread([&] {
      for (void*& block : theirs) block = heap::allocate(kSize);
    }).join();
    void* foreign = theirs.front();
    void* mine = heap::allocate(kSize);
    ASSERT_GT(v.slots.length(), 0u) << "the refill left slots in the vector";
    heap::deallocate(foreign);
    ASSERT_EQ(v.recycled.count(), 1u) << "a free into a span not held here is recycled";
    std::vector<void*> taken;
    while (v.slots.length() > 0) {
      void* block = heap::allocate(kSize);
      EXPECT_NE(block, foreign) << "a recycled block was handed out before the vector's slots";
      taken.push_back(block);
    }
    EXPECT_EQ(heap::allocate(kSize), foreign) << "with the vector empty, the recycled block";
    EXPECT_EQ(v.recycled.count(), 0u);
    heap::deallocate(mine);
    for (void* block : taken) heap::deallocate(block);
    for (void* block : theirs) heap::deallocate(block);
  });
}

// A thread alone in the process (the test's main thread, once the other tests' threads have
// exited) reuses its recycled blocks before the vector's slots: an LRU cache's evictions then
// never reach their spans. While another thread has a heap, the vector comes first again (the
// test above), and once that thread has exited the recycled blocks are first again.
TEST_F(HeapTest, AThreadAloneReusesRecycledBlocksFirst) {
  constexpr size_t kSize = 256;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  ShuffleVector& v = heap::currentThreadHeap()->vector(sizeClass);
  ASSERT_FALSE(v.recycled.servesLast()) << "no other thread of this test has a heap";
  // A full span, detached: no refill attaches it, so frees into it are recycled.
  std::vector<void*> full(SizeClasses::plan(sizeClass).objectCount + 1);
  for (void*& block : full) block = heap::allocate(kSize);
  heap::flushThreadCache();
  void* mine = heap::allocate(kSize);
  ASSERT_GT(v.slots.length(), 0u) << "the refill left slots in the vector";
  heap::deallocate(full[0]);
  ASSERT_EQ(v.recycled.count(), 1u) << "a free into a span not held here is recycled";
  EXPECT_EQ(heap::allocate(kSize), full[0]) << "the recycled block, before the vector's slots";
  EXPECT_EQ(v.recycled.count(), 0u);

  std::atomic<int> step{0};
  std::thread other([&] {
    heap::deallocate(heap::allocate(kSize));  // a heap in use
    step = 1;
    while (step.load() != 2) std::this_thread::yield();
  });
  while (step.load() != 1) std::this_thread::yield();
  EXPECT_TRUE(v.recycled.servesLast()) << "another thread has a heap: the vector comes first";
  heap::deallocate(full[0]);
  ASSERT_EQ(v.recycled.count(), 1u);
  ASSERT_GT(v.slots.length(), 0u);
  void* fromVector = heap::allocate(kSize);
  EXPECT_NE(fromVector, full[0]) << "with another thread running, the vector's slot first";
  heap::deallocate(fromVector);
  step = 2;
  other.join();
  EXPECT_FALSE(v.recycled.servesLast()) << "alone again once the other thread exited";
  EXPECT_EQ(heap::allocate(kSize), full[0]);

  heap::deallocate(mine);
  for (void* block : full) heap::deallocate(block);
  heap::flushThreadCache();
}

// Recycled blocks of the large classes are few: what a thread holds back stays bounded.
TEST_F(HeapTest, RecycledBlocksAreBoundedInBytes) {
  onNewThread([&] {
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      const ShuffleVector& v = heap::currentThreadHeap()->vector(c);
      EXPECT_LE(v.recycled.capacity() * static_cast<size_t>(kSizeClassSizes[c]),
                std::max(kRecycledBytes, kMinRecycled * static_cast<size_t>(kSizeClassSizes[c])));
    }
  });
}

TEST_F(HeapTest, ThreadExitReturnsAttachedSpans) {
  api::HeapStats before = api::collectStats();
  ThreadHeap* exited = nullptr;
  // Resident bytes of the heap's vector pages (ThreadHeap::entryPages).
  auto resident = [](ThreadHeap::PageRange pages) {
    return pages.bytes ? os::residentBytes(reinterpret_cast<void*>(pages.start), pages.bytes) : 0;
  };
  auto residentEntryBytes = [&](ThreadHeap* heap) { return resident(heap->entryPages()); };
  onNewThread([&] {
    // Every class's vector is filled once, so its entries are written.
    for (size_t size : kSizeClassSizes) heap::deallocate(heap::allocate(size));
    EXPECT_EQ(api::collectStats().threadHeaps, before.threadHeaps + 1);
    exited = heap::currentThreadHeap();
    EXPECT_GT(residentEntryBytes(exited), 0u);
    EXPECT_GT(resident(exited->vectorPages()), 0u);
  });
  EXPECT_EQ(api::collectStats().threadHeaps, before.threadHeaps);
  // A heap waiting in the pool keeps neither its vectors' entries nor the vectors themselves
  // (ThreadHeap::releaseEntryPages, ThreadHeap::retire).
  ASSERT_NE(exited, nullptr);
  EXPECT_FALSE(exited->inUse());
  EXPECT_EQ(residentEntryBytes(exited), 0u);
  EXPECT_GT(exited->vectorPages().bytes, 0u);
  EXPECT_EQ(resident(exited->vectorPages()), 0u);
  // Of its whole storage block only the page holding the ThreadHeap's own fields stays: the
  // entries begin and end on page boundaries, so no page of them shares one with the object.
  EXPECT_EQ(ThreadHeap::storageBytes() % Arena::pageSize(), 0u);
  EXPECT_LE(resident({reinterpret_cast<uintptr_t>(exited), ThreadHeap::storageBytes()}),
            Arena::pageSize());
  // The next thread takes that heap from the pool, configured again: every class serves and
  // takes back blocks, and its vector has the capacity and size a new heap's has.
  onNewThread([&] {
    for (size_t size : kSizeClassSizes) {
      void* block = heap::allocate(size);
      ASSERT_NE(block, nullptr);
      memset(block, 0x5a, size);
      heap::deallocate(block);
    }
    ASSERT_EQ(heap::currentThreadHeap(), exited);
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      const ShuffleVector& v = exited->vector(c);
      EXPECT_TRUE(v.check.isSlotStart(kSizeClassSizes[c]));
      EXPECT_FALSE(v.check.isSlotStart(kSizeClassSizes[c] / 2));
      EXPECT_GT(v.slots.capacity(), 0u);
      EXPECT_GT(v.recycled.capacity(), 0u);
      EXPECT_GT(v.slots.capacity(), 0u);
    }
  });
}

TEST_F(HeapTest, LargeObjectsAreZeroedAndResizeInPlace) {
  constexpr size_t kSize = 1 << 20;
  char* p = static_cast<char*>(api::callocImpl(1, kSize));
  ASSERT_NE(p, nullptr);
  for (size_t i = 0; i < kSize; i += 512) ASSERT_EQ(p[i], 0);
  memset(p, 'x', kSize);
  api::freeImpl(p);
  p = static_cast<char*>(api::callocImpl(kSize, 1));  // likely the same, now dirty, pages
  for (size_t i = 0; i < kSize; i += 512) ASSERT_EQ(p[i], 0);
  memset(p, 'y', kSize);
  char* grown = static_cast<char*>(api::reallocImpl(p, 3 * kSize));
  ASSERT_NE(grown, nullptr);
  for (size_t i = 0; i < kSize; i += 4096) ASSERT_EQ(grown[i], 'y');
  EXPECT_GE(heap::usableSize(grown), 3 * kSize);
  api::freeImpl(grown);
}

// Large objects start at varying cache-line offsets (HeapConfig::largeColouring), never
// overlap, keep the whole usable size writable, and still resize in place and free cleanly.
TEST_F(HeapTest, LargeObjectsStartAtVaryingCacheLineOffsets) {
  constexpr size_t kCount = 64;
  std::set<size_t> offsets;
  std::vector<std::pair<char*, size_t>> blocks;
  for (size_t i = 0; i < kCount; i++) {
    // Sizes with some tail slack, below the colouring limit (kMaxColouredBytes, 32 KiB).
    size_t size = kMaxSmallSize + 1 + (i % 7) * 2000;
    char* p = static_cast<char*>(api::mallocImpl(size));
    ASSERT_NE(p, nullptr);
    uintptr_t address = reinterpret_cast<uintptr_t>(p);
    EXPECT_EQ(address % kCacheLine, 0u);
    offsets.insert(address % Arena::pageSize());
    size_t usable = heap::usableSize(p);
    EXPECT_GE(usable, size);
    memset(p, static_cast<int>(i), usable);
    blocks.emplace_back(p, usable);
  }
  EXPECT_GE(offsets.size(), kCount / 4) << "large objects should not all share a page offset";
  for (size_t i = 0; i < kCount; i++) {
    auto [p, usable] = blocks[i];
    for (size_t at = 0; at < usable; at += 512) ASSERT_EQ(p[at], static_cast<char>(i));
    ASSERT_EQ(p[usable - 1], static_cast<char>(i));
  }
  // Growing in place keeps the offset and the contents; so does shrinking.
  auto [first, firstUsable] = blocks[0];
  char* grown = static_cast<char*>(api::reallocImpl(first, 4 * firstUsable));
  ASSERT_NE(grown, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(grown) % kCacheLine, 0u);
  for (size_t at = 0; at < firstUsable; at += 512) ASSERT_EQ(grown[at], 0);
  EXPECT_GE(heap::usableSize(grown), 4 * firstUsable);
  memset(grown, 1, heap::usableSize(grown));
  blocks[0].first = grown;
  for (auto [p, usable] : blocks) api::freeImpl(p);
  // Page-aligned requests, whole pages and big blocks stay page-aligned.
  void* aligned = api::alignedAllocImpl(Arena::pageSize(), kMaxSmallSize + 1000);
  ASSERT_NE(aligned, nullptr);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(aligned) % Arena::pageSize(), 0u);
  api::freeImpl(aligned);
  for (size_t size : {5 * Arena::pageSize(), size_t{1} << 20}) {
    void* p = api::mallocImpl(size);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Arena::pageSize(), 0u) << size;
    api::freeImpl(p);
  }
}

TEST_F(HeapTest, LargeColouringOffLeavesLargeObjectsPageAligned) {
  gHeapConfig.largeColouring = false;
  for (size_t pages : {5ul, 6ul, 7ul}) {
    void* p = api::mallocImpl(pages * Arena::pageSize() - 100);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % Arena::pageSize(), 0u);
    EXPECT_EQ(heap::usableSize(p), pages * Arena::pageSize());
    api::freeImpl(p);
  }
}

// Freed large objects are reused page by page by large objects of other sizes (a cached run is
// split), and a large block grows in place over a freed neighbour instead of moving.
TEST_F(HeapTest, FreedLargeRangesServeOtherSizesAndGrowth) {
  gHeapConfig.decayMs = 3'600'000;
  heap::releaseFreeMemory();
  const size_t page = Arena::pageSize();
  char* big = static_cast<char*>(api::mallocImpl(50 * page));
  ASSERT_NE(big, nullptr);
  memset(big, 1, 50 * page);
  api::freeImpl(big);
  char* smaller = static_cast<char*>(api::mallocImpl(30 * page + 100));
  EXPECT_EQ(smaller, big) << "a 31-page object reuses the head of the freed 50 pages";
  char* rest = static_cast<char*>(api::mallocImpl(19 * page));
  EXPECT_EQ(rest, big + 31 * page) << "and the 19 pages after it serve the next one";
  api::freeImpl(rest);
  memset(smaller, 2, 30 * page + 100);
  char* grown = static_cast<char*>(api::reallocImpl(smaller, 45 * page));
  EXPECT_EQ(grown, big) << "growing over the freed neighbour keeps the block in place";
  for (size_t at = 0; at < 30 * page + 100; at += 512) ASSERT_EQ(grown[at], 2);
  memset(grown, 3, 45 * page);
  api::freeImpl(grown);
  heap::releaseFreeMemory();
}

TEST_F(HeapTest, ReallocKeepsContentsAcrossClasses) {
  char* p = static_cast<char*>(api::mallocImpl(10));
  memcpy(p, "0123456789", 10);
  for (size_t size : {20ul, 100ul, 5000ul, 20000ul, 100000ul, 50ul, 10ul}) {
    p = static_cast<char*>(api::reallocImpl(p, size));
    ASSERT_NE(p, nullptr);
    ASSERT_EQ(memcmp(p, "0123456789", 10), 0) << size;
    EXPECT_GE(heap::usableSize(p), size);
  }
  api::freeImpl(p);
}

// The inline malloc and free read tlsFastPathHeap, which is the empty heap while a thread has
// no heap of its own (before its first allocation, and while it is parked): there they must go
// to the slow paths, which do the real work, and never write to the empty heap, which every
// such thread shares.
bool emptyHeapIsUntouched() {
  // The empty heap is constant-initialised to zeros, padding included: any byte written since
  // shows.
  static const unsigned char zeros[sizeof(ShuffleVector)] = {};
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    if (memcmp(&gEmptyThreadHeap.vector(c), zeros, sizeof zeros) != 0) return false;
  }
  return true;
}

// The empty heap (42 KiB) is read by every thread's first malloc and free. In .bss those reads
// map the kernel's zero page, which no process is charged for; with a single non-zero initial
// byte it would be in .data, file-backed pages that every process maps and pays for in full.
extern "C" char __bss_start[], _end[];
TEST_F(HeapTest, TheEmptyHeapLiesInBss) {
  auto start = reinterpret_cast<uintptr_t>(&gEmptyThreadHeap);
  EXPECT_GE(start, reinterpret_cast<uintptr_t>(__bss_start));
  EXPECT_LE(start + sizeof(ThreadHeap), reinterpret_cast<uintptr_t>(_end));
}

TEST_F(HeapTest, AThreadWithoutAHeapGoesThroughTheEmptyHeapToTheSlowPaths) {
  // Blocks of the main thread's spans (attached here: frees from the other thread are remote).
  std::vector<void*> blocks;
  for (int i = 0; i < 64; i++) blocks.push_back(heap::allocate(48));
  onNewThread([&] {
    EXPECT_EQ(tlsThreadHeap, nullptr);
    EXPECT_EQ(tlsFastPathHeap, &gEmptyThreadHeap);
    // Frees before the thread's first allocation: remote frees, and still no heap.
    for (void* block : blocks) heap::deallocate(block);
    EXPECT_EQ(tlsThreadHeap, nullptr);
    EXPECT_EQ(tlsFastPathHeap, &gEmptyThreadHeap);
    EXPECT_TRUE(emptyHeapIsUntouched());
    // The first allocation creates the heap, and both pointers name it.
    void* own = heap::allocate(48);
    ASSERT_NE(own, nullptr);
    ThreadHeap* heap = tlsThreadHeap;
    ASSERT_NE(heap, nullptr);
    EXPECT_EQ(tlsFastPathHeap, heap);
    // Parked, the fast paths read the empty heap again; an allocation then resumes the heap.
    ThreadHeap* parked = ThreadHeap::park();
    ASSERT_EQ(parked, heap);
    EXPECT_EQ(tlsFastPathHeap, &gEmptyThreadHeap);
    // A free while parked goes to the slow path (onto its span's remote-free stack) and leaves
    // the heap parked.
    heap::deallocate(own);
    EXPECT_EQ(tlsThreadHeap, nullptr);
    EXPECT_EQ(tlsFastPathHeap, &gEmptyThreadHeap);
    ThreadHeap::unpark(parked);
    EXPECT_EQ(tlsFastPathHeap, heap);
    void* again = heap::allocate(48);  // a resumed allocation takes the fast path again
    ASSERT_NE(again, nullptr);
    heap::deallocate(again);
    EXPECT_TRUE(emptyHeapIsUntouched());
  });
  // The main thread gets the freed slots back from its spans' remote-free stacks.
  heap::flushThreadCache();
  EXPECT_TRUE(emptyHeapIsUntouched());
}

using HeapDeathTest = HeapTest;

TEST_F(HeapDeathTest, MisuseIsReportedWithTheAddress) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(
      {
        void* p = api::mallocImpl(64);
        api::freeImpl(p);
        api::freeImpl(p);
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  // A second free of a recycled block (its span was not attached), from the same thread and
  // from another one.
  EXPECT_DEATH(
      {
        void* p = api::mallocImpl(64);
        void* q = api::mallocImpl(64);
        heap::flushThreadCache();
        api::freeImpl(p);
        api::freeImpl(q);
        api::freeImpl(p);
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  EXPECT_DEATH(
      {
        void* p = api::mallocImpl(64);
        heap::flushThreadCache();
        api::freeImpl(p);
        std::thread([p] { api::freeImpl(p); }).join();
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  // ... and from a thread that has since attached the block's span: there the free would be a
  // local push but for the tag.
  EXPECT_DEATH(
      {
        void* p = api::mallocImpl(64);
        heap::flushThreadCache();
        api::freeImpl(p);
        std::thread([p] {
          const uintptr_t page = reinterpret_cast<uintptr_t>(p) & ~(Arena::pageSize() - 1);
          constexpr int kMaxTries = 100000;
          for (int i = 0; i < kMaxTries; i++) {
            void* mine = api::mallocImpl(64);
            if ((reinterpret_cast<uintptr_t>(mine) & ~(Arena::pageSize() - 1)) == page) {
              api::freeImpl(p);
              return;
            }
          }
          fprintf(stderr, "the span was never attached\n");
        }).join();
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  // ... and by the thread whose refill claimed the block back into its vector, still unused:
  // the block was freed into a detached span's bitmap (no tag: a mesh pass may be copying such
  // pages), so only the tag the refill writes into a reused span's slots shows it is free.
  EXPECT_DEATH(
      {
        gHeapConfig.randomization = Randomization::kNone;  // refills hand out ascending slots
        std::thread([] {
          constexpr size_t kSize = 7168;  // a class no other test uses: a span of its own
          std::vector<void*> blocks(SizeClasses::plan(SizeClasses::classOf(kSize)).objectCount);
          for (void*& b : blocks) b = api::mallocImpl(kSize);  // the span, full
          heap::flushThreadCache();                            // ... and detached
          std::thread([&] {  // two slots into the bitmap, untagged
            api::freeImpl(blocks[0]);
            api::freeImpl(blocks[1]);
          })
              .join();
          void* again = api::mallocImpl(kSize);  // a refill claims both, hands out the lower
          if (again != blocks[0]) fprintf(stderr, "the refill took another span\n");
          api::freeImpl(blocks[1]);
        }).join();
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  // ... and of a block a full vector spilled back to its span's bitmap (the first freed goes
  // first), from another thread, at the call: the spill marks the block released.
  EXPECT_DEATH(
      {
        std::vector<void*> blocks(1024);
        for (void*& b : blocks) b = api::mallocImpl(64);
        for (void* b : blocks) api::freeImpl(b);
        std::thread([&] { api::freeImpl(blocks[0]); }).join();
      },
      "meshalloc: double free of 0x[0-9a-f]+");
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(api::mallocImpl(64));
        api::freeImpl(p + 16);
      },
      "meshalloc: free of interior pointer 0x[0-9a-f]+ \\(the object starts at 0x[0-9a-f]+\\)");
  EXPECT_DEATH(
      {
        static char notOurs[64];
        api::freeImpl(notOurs);
      },
      "meshalloc: free of invalid pointer 0x[0-9a-f]+");
  EXPECT_DEATH(
      {
        char* p = static_cast<char*>(api::mallocImpl(1 << 20));
        api::freeImpl(p + 8192);
      },
      "meshalloc: free of interior pointer");
  // A coloured large object's page start is not the object either.
  EXPECT_DEATH(
      {
        char* p = nullptr;
        while (!p || reinterpret_cast<uintptr_t>(p) % Arena::pageSize() == 0)
          p = static_cast<char*>(api::mallocImpl(kMaxSmallSize + 1000));
        api::freeImpl(
            reinterpret_cast<void*>(reinterpret_cast<uintptr_t>(p) & ~(Arena::pageSize() - 1)));
      },
      "meshalloc: free of interior pointer 0x[0-9a-f]+ \\(the object starts at 0x[0-9a-f]+\\)");
}

// A free finds its span among the attached ones through the span table, without the span record:
// the exact index for a start that has a cell to itself, "not attached" for any other start,
// and "maybe" only where two attached starts share a cell.
TEST(SpanTable, FindsAttachedSpansExactlyAndFlagsSharedCells) {
  const uintptr_t page = Arena::pageSize();
  auto startOf = [&](size_t i) { return uintptr_t{0x7f0000000000} + i * page; };
  Span records[kMaxSpansPerVector];
  unsigned used = 0;
  AttachedSpans spans;
  auto attach = [&](uintptr_t start) {
    records[used].spanStart = start;
    EXPECT_EQ(spans.add(&records[used]), used);
    EXPECT_EQ(records[used].attachIndex, used) << "the record knows its index";
    used++;
  };
  // Two attached starts that share a cell, then ones that have a cell to themselves.
  size_t first = 0, partner = 1;
  while (AttachedSpans::cellOf(startOf(partner)) != AttachedSpans::cellOf(startOf(first)))
    partner++;
  std::set<unsigned> cells = {AttachedSpans::cellOf(startOf(first))};
  attach(startOf(first));
  attach(startOf(partner));
  for (size_t i = partner + 1; !spans.full(); i++) {
    if (cells.insert(AttachedSpans::cellOf(startOf(i))).second) attach(startOf(i));
  }
  spans.rebuild();
  EXPECT_EQ(spans.indexAt(startOf(first)), AttachedSpans::kMaybeAttached);
  EXPECT_EQ(spans.indexAt(startOf(partner)), AttachedSpans::kMaybeAttached);
  EXPECT_EQ(spans.indexByScan(startOf(partner)), 1);
  for (uint32_t i = 2; i < spans.count(); i++) EXPECT_EQ(spans.indexAt(spans.start(i)), int(i));
  // Starts that are not attached, whether or not their cell is taken.
  size_t notAttached = 0, inTakenCell = 0;
  for (size_t i = 0; i < 4096; i++) {
    uintptr_t start = startOf(i) + (size_t{1} << 32);
    unsigned cell = AttachedSpans::cellOf(start);
    if (cell == AttachedSpans::cellOf(startOf(first))) continue;
    EXPECT_EQ(spans.indexAt(start), AttachedSpans::kNotAttached);
    notAttached++;
    inTakenCell += cells.count(cell);
  }
  EXPECT_GT(inTakenCell, 0u) << "the table must compare the start, not just find a taken cell";
  EXPECT_GT(notAttached, inTakenCell);
  // Removing a span moves the last into its index (and tells its record); after the rebuild, a
  // start that is gone is no longer found.
  uintptr_t lastStart = spans.start(spans.count() - 1);
  spans.remove(2);
  EXPECT_EQ(spans.start(2), lastStart);
  EXPECT_EQ(spans.record(2)->attachIndex, 2u);
  while (spans.count() > 2) spans.remove(spans.count() - 1);
  spans.rebuild();
  EXPECT_EQ(spans.indexAt(startOf(partner + 1)), AttachedSpans::kNotAttached);
  EXPECT_EQ(spans.indexAt(lastStart), AttachedSpans::kNotAttached);
}

// The frees of a thread's own spans take the span table's exact answer; make sure the same
// blocks come back (pushed locally, not recycled) and a double free there is still caught.
TEST_F(HeapTest, FreesIntoAttachedSpansArePushedLocallyThroughTheSpanTable) {
  constexpr size_t kSize = 48;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  onNewThread([&] {
    ShuffleVector& v = heap::currentThreadHeap()->vector(sizeClass);
    std::vector<void*> blocks;
    for (int i = 0; i < 64; i++) blocks.push_back(heap::allocate(kSize));
    for (void* block : blocks) {
      uintptr_t address = reinterpret_cast<uintptr_t>(block);
      uint16_t classEntry = Arena::classEntryFor(address);
      ASSERT_TRUE(PageClassEntry::isSmall(classEntry));
      EXPECT_EQ(PageClassEntry::sizeClass(classEntry), sizeClass);
      uintptr_t spanStart = Arena::spanStartOfClassEntry(address, classEntry);
      EXPECT_EQ(spanStart, Arena::spanStartOf(address, Arena::entryFor(address)));
      int span = v.attached.indexAt(spanStart);
      if (span == AttachedSpans::kMaybeAttached) continue;
      ASSERT_GE(span, 0) << "a span this thread allocates from must be found attached";
      EXPECT_EQ(v.attached.record(span), PageEntry::span(Arena::entryFor(address)));
    }
    uint32_t lengthBefore = v.slots.length();
    uint32_t recycledBefore = v.recycled.count();
    for (void* block : blocks) heap::deallocate(block);
    EXPECT_EQ(v.recycled.count(), recycledBefore) << "frees into attached spans were recycled";
    EXPECT_EQ(v.slots.length(), lengthBefore + blocks.size());
  });
}

// A local free into a full vector spills the vector's oldest half back to the spans' bitmaps
// (which the spans, still attached, reclaim at the next refill) instead of sending each such free
// through the bitmap on its own. What the attached spans count as owned afterwards is exactly
// what the vector holds: every spilled slot was returned once.
TEST_F(HeapTest, AFullVectorSpillsItsOldestHalfToTheBitmaps) {
  constexpr size_t kSize = 64;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  onNewThread([&] {
    ShuffleVector& v = heap::currentThreadHeap()->vector(sizeClass);
    std::vector<void*> blocks(v.slots.capacity() + v.slots.capacity() / 2);
    for (void*& block : blocks) block = heap::allocate(kSize);
    ASSERT_LE(blocks.size(), v.attached.count() * SizeClasses::plan(sizeClass).objectCount);
    for (void* block : blocks) heap::deallocate(block);
    EXPECT_EQ(v.recycled.count(), 0u) << "frees into attached spans were recycled";
    EXPECT_LE(v.slots.length(), v.slots.capacity());
    uint64_t owned = 0;
    for (uint32_t span = 0; span < v.attached.count(); span++) {
      owned += v.attached.record(span)->liveCount.load();
      EXPECT_EQ(v.attached.record(span)->liveCount.load(),
                v.attached.record(span)->bitmap().popcount());
    }
    EXPECT_EQ(owned, v.slots.length()) << "a spilled slot is still counted as owned";
    // The spilled slots come back: allocating them all again needs no new span.
    uint32_t attached = v.attached.count();
    for (void*& block : blocks) block = heap::allocate(kSize);
    EXPECT_EQ(v.attached.count(), attached);
    std::set<void*> distinct(blocks.begin(), blocks.end());
    EXPECT_EQ(distinct.size(), blocks.size()) << "a slot was handed out twice";
    for (void* block : blocks) heap::deallocate(block);
  });
}

// Every free that reaches the span (remote, into a detached span, a drain) reads the owner and
// remoteFrees and then writes liveCount or the bitmap: those fields share the second cache
// line, so such a free costs one span record miss;
// the first line holds what refills and the lists use.
TEST(SpanLayout, FreePathFieldsShareTheSecondCacheLine) {
  Span record;
  auto offset = [&](const void* field) {
    return static_cast<size_t>(reinterpret_cast<const char*>(field) -
                               reinterpret_cast<const char*>(&record));
  };
  EXPECT_EQ(offset(&record.owner), kCacheLine);
  EXPECT_LT(offset(&record.remoteFrees), 2 * kCacheLine);
  EXPECT_LT(offset(&record.liveCount), 2 * kCacheLine);
  EXPECT_LT(offset(&record.attachIndex), 2 * kCacheLine);
  EXPECT_LT(offset(&record.mesh), kCacheLine);
  EXPECT_LT(offset(&record.spanStart), kCacheLine);
  EXPECT_LE(sizeof(Span), kCacheLine + 3 * sizeof(uint64_t));
  EXPECT_EQ(InternalHeap::kGranule % kCacheLine, 0u);
}

// A heap filled and then freed down keeps its spans in the fullest bin (a span's bin is fixed
// when it is placed); candidates that failed to mesh are refiled by their true occupancy, in a
// sparser bin. The mesher must still offer every span once before any is offered again, or a
// large sparse heap keeps retrying the same few thousand spans (bench/large_heap: PSS stayed at
// 3.95x the live bytes after 60 s, far from the mapping limit).
TEST_F(HeapTest, MeshCandidatesAreOfferedOncePerSweep) {
  constexpr size_t kSize = 256;
  constexpr size_t kBlocks = 64 * 64;  // 64 spans of 64 slots
  constexpr size_t kTake = 16;
  const unsigned sizeClass = SizeClasses::classOf(kSize);
  std::vector<void*> blocks;
  onNewThread([&] {
    for (size_t i = 0; i < kBlocks; i++) blocks.push_back(heap::allocate(kSize));
  });
  // Freed down to a quarter from this thread: the spans are detached, placed while full.
  for (size_t i = 0; i < blocks.size(); i++) {
    if (i % 4 != 0) {
      heap::deallocate(blocks[i]);
      blocks[i] = nullptr;
    }
  }
  heap::flushThreadCache();
  const uint32_t maxLive = SizeClasses::plan(sizeClass).objectCount * 3 / 4;
  std::set<Span*> offered;
  Span* taken[kTake];
  size_t rounds = 0;
  for (; rounds < 8; rounds++) {
    size_t count = GlobalHeap::takeMeshCandidates(sizeClass, maxLive, taken, kTake);
    ASSERT_EQ(count, kTake);
    size_t fresh = 0;
    for (size_t i = 0; i < count; i++) fresh += offered.insert(taken[i]).second;
    GlobalHeap::returnMeshCandidates(sizeClass, taken, count);
    if (fresh < count) break;  // a span came back before every span had been offered
  }
  // At least the test's 64 spans are there: four rounds of 16 offer each of them once.
  EXPECT_GE(rounds, 4u) << offered.size() << " spans offered before one came back";
  for (void* block : blocks) heap::deallocate(block);
}

}  // namespace
}  // namespace meshalloc
