// Idle threads: a thread blocked with its heap parked gives its spans back when the reclaimer
// runs, and finds every object it kept intact when it wakes. The unit binary does not interpose
// pthread_cond_wait, so the workers park and unpark around their waits themselves, as the
// wrapper in api/wait_exports.cc does. Run under TSan too: the reclaimer works on another
// thread's heap, and only the park state orders the two.
#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "heap/arena.h"
#include "heap/heap.h"
#include "heap/thread_heap.h"
#include "platform/os.h"

namespace meshalloc {
namespace {

constexpr size_t kSizes[] = {24, 64, 200, 1000, 3000};

unsigned char patternByte(const void* block, size_t i) {
  return static_cast<unsigned char>((reinterpret_cast<uintptr_t>(block) >> 4) * 31 + i);
}
void fill(void* block, size_t size) {
  for (size_t i = 0; i < size; i++) static_cast<unsigned char*>(block)[i] = patternByte(block, i);
}
bool intact(const void* block, size_t size) {
  for (size_t i = 0; i < size; i++) {
    if (static_cast<const unsigned char*>(block)[i] != patternByte(block, i)) return false;
  }
  return true;
}

struct Kept {
  void* block;
  size_t size;
};

// Allocates `rounds` objects of every size, keeps one in ten and frees the rest: the spans
// attached to the calling thread hold free slots only it can use.
std::vector<Kept> allocateAndKeepATenth(int rounds) {
  std::vector<Kept> kept;
  for (int i = 0; i < rounds; i++) {
    for (size_t size : kSizes) {
      void* block = heap::allocate(size);
      fill(block, size);
      if (i % 10 == 0) {
        kept.push_back({block, size});
      } else {
        heap::deallocate(block);
      }
    }
  }
  return kept;
}

size_t attachedSpans(ThreadHeap* heap) {
  size_t spans = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) spans += heap->vector(c).attached.count();
  return spans;
}
size_t heldSlots(ThreadHeap* heap) {
  size_t slots = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++)
    slots += heap->vector(c).slots.length() + heap->vector(c).recycled.count();
  return slots;
}

// Reclaims every parked heap, however briefly parked.
size_t reclaimAllParked() {
  return ThreadHeap::reclaimIdle(os::monotonicNanos(), 0);
}

struct Gate {
  std::mutex lock;
  std::condition_variable changed;
  int waiting = 0;
  bool open = false;
};

// Resident bytes of the heap's vector pages (ThreadHeap::entryPages).
size_t residentEntryBytes(ThreadHeap* heap) {
  ThreadHeap::PageRange pages = heap->entryPages();
  return pages.bytes ? os::residentBytes(reinterpret_cast<void*>(pages.start), pages.bytes) : 0;
}

TEST(IdleThreads, ParkedHeapsGiveTheirSpansBackAndKeepTheirObjects) {
  ASSERT_TRUE(heap::ensureInitialized());
  constexpr int kThreads = 4;
  Gate gate;
  std::vector<ThreadHeap*> heaps(kThreads, nullptr);
  std::atomic<int> damaged{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      std::vector<Kept> kept = allocateAndKeepATenth(3000);
      ThreadHeap* parked = ThreadHeap::park();
      {
        std::unique_lock<std::mutex> guard(gate.lock);
        heaps[t] = parked;
        gate.waiting++;
        gate.changed.notify_all();
        gate.changed.wait(guard, [&] { return gate.open; });
      }
      ThreadHeap::unpark(parked);
      for (const Kept& k : kept) {
        if (!intact(k.block, k.size)) damaged++;
        heap::deallocate(k.block);
      }
      // The heap works as before: it refills from the spans it gave back.
      for (const Kept& k : allocateAndKeepATenth(200)) heap::deallocate(k.block);
    });
  }
  {
    std::unique_lock<std::mutex> guard(gate.lock);
    gate.changed.wait(guard, [&] { return gate.waiting == kThreads; });
  }
  // The main thread's own heap is busy (not parked): the reclaimer must leave it alone.
  std::vector<Kept> mine = allocateAndKeepATenth(500);
  ThreadHeap* own = tlsThreadHeap;
  ASSERT_NE(own, nullptr);
  size_t ownSpans = attachedSpans(own);
  size_t ownSlots = heldSlots(own);
  for (ThreadHeap* heap : heaps) {
    ASSERT_NE(heap, nullptr);
    EXPECT_GT(attachedSpans(heap), 0u);
    EXPECT_GT(heldSlots(heap), 0u);
    EXPECT_GT(residentEntryBytes(heap), 0u);
  }
  uint64_t before = ThreadHeap::idleReclaims();
  EXPECT_EQ(reclaimAllParked(), static_cast<size_t>(kThreads));
  EXPECT_EQ(ThreadHeap::idleReclaims(), before + kThreads);
  for (ThreadHeap* heap : heaps) {
    EXPECT_EQ(attachedSpans(heap), 0u);
    EXPECT_EQ(heldSlots(heap), 0u);
    // The vectors' pages went back with the slots (ThreadHeap::releaseEntryPages).
    EXPECT_EQ(residentEntryBytes(heap), 0u);
  }
  EXPECT_EQ(attachedSpans(own), ownSpans);
  EXPECT_EQ(heldSlots(own), ownSlots);
  // Nothing left to take: a second pass reclaims nothing.
  EXPECT_EQ(reclaimAllParked(), 0u);
  {
    std::lock_guard<std::mutex> guard(gate.lock);
    gate.open = true;
  }
  gate.changed.notify_all();
  for (std::thread& thread : threads) thread.join();
  EXPECT_EQ(damaged.load(), 0);
  for (const Kept& k : mine) {
    EXPECT_TRUE(intact(k.block, k.size));
    heap::deallocate(k.block);
  }
}

TEST(IdleThreads, AnAllocationWhileParkedResumesTheHeap) {
  ASSERT_TRUE(heap::ensureInitialized());
  std::thread([] {
    std::vector<Kept> kept = allocateAndKeepATenth(100);
    ThreadHeap* heap = tlsThreadHeap;
    ThreadHeap* parked = ThreadHeap::park();
    ASSERT_EQ(parked, heap);
    EXPECT_EQ(tlsThreadHeap, nullptr);
    // What a signal handler would do during the wait: the heap is this thread's again.
    void* block = heap::allocate(64);
    EXPECT_EQ(tlsThreadHeap, heap);
    size_t spans = attachedSpans(heap);
    EXPECT_EQ(reclaimAllParked(), 0u);
    EXPECT_EQ(attachedSpans(heap), spans);
    heap::deallocate(block);
    ThreadHeap::unpark(parked);
    EXPECT_EQ(tlsThreadHeap, heap);
    // A wait inside the handler's wait parks nothing: the heap is not this wait's to park.
    ThreadHeap* outer = ThreadHeap::park();
    EXPECT_EQ(ThreadHeap::park(), nullptr);
    ThreadHeap::unpark(outer);
    for (const Kept& k : kept) {
      EXPECT_TRUE(intact(k.block, k.size));
      heap::deallocate(k.block);
    }
  }).join();
}

// A worker parks and wakes over and over, holding objects across its waits and allocating the
// moment it wakes, while the reclaimer takes its heap as soon as it is parked. A wake that did
// not wait for a reclaim in progress would race with it on the heap (TSan) and get slots the
// reclaimer handed back, which the next allocations hand out a second time (damaged objects).
TEST(IdleThreads, WakingDuringAReclaimWaitsForIt) {
  ASSERT_TRUE(heap::ensureInitialized());
  constexpr int kWaits = 300;
  std::atomic<int> parkedWait{-1};
  std::atomic<int> reclaiming{-1};  // the wait the reclaimer is about to reclaim
  std::atomic<bool> done{false};
  std::atomic<int> damaged{0};
  std::atomic<size_t> reclaims{0};
  std::thread reclaimer([&] {
    for (int seen = -1; !done.load(std::memory_order_acquire);) {
      int wait = parkedWait.load(std::memory_order_acquire);
      if (wait == seen) continue;
      seen = wait;
      reclaiming.store(wait, std::memory_order_release);
      reclaims += reclaimAllParked();
    }
  });
  std::thread worker([&] {
    std::vector<Kept> kept;
    uint64_t spins = 1;
    for (int wait = 0; wait < kWaits; wait++) {
      for (Kept& k : allocateAndKeepATenth(20)) kept.push_back(k);
      ThreadHeap* parked = ThreadHeap::park();
      parkedWait.store(wait, std::memory_order_release);
      spins = spins * 6364136223846793005ull + 1442695040888963407ull;
      // Woken 0-50 us after the reclaimer set out: before, during or after its reclaim.
      while (reclaiming.load(std::memory_order_acquire) != wait) {
      }
      uint64_t until = os::monotonicNanos() + (spins >> 33) % 50000;
      while (os::monotonicNanos() < until) {
      }
      ThreadHeap::unpark(parked);
      for (Kept& k : allocateAndKeepATenth(10)) kept.push_back(k);
      for (const Kept& k : kept) {
        if (!intact(k.block, k.size)) damaged++;
      }
      if (kept.size() > 600) {
        for (size_t i = 0; i < kept.size() / 2; i++) heap::deallocate(kept[i].block);
        kept.erase(kept.begin(), kept.begin() + static_cast<long>(kept.size() / 2));
      }
    }
    for (const Kept& k : kept) {
      if (!intact(k.block, k.size)) damaged++;
      heap::deallocate(k.block);
    }
  });
  worker.join();
  done.store(true, std::memory_order_release);
  reclaimer.join();
  EXPECT_EQ(damaged.load(), 0);
  // The test means something only if reclaims really met the worker's waits.
  EXPECT_GT(reclaims.load(), static_cast<size_t>(kWaits / 20));
}

// Spans a reclaim leaves empty go back to the OS at once, not into the dirty cache: a sleeping
// thread's empty pages are not the churn the cache is for.
TEST(IdleThreads, SpansTheReclaimEmptiesSkipTheDirtyCache) {
  ASSERT_TRUE(heap::ensureInitialized());
  Gate gate;
  ThreadHeap* parked = nullptr;
  std::thread worker([&] {
    // Everything freed locally: the slots wait in the vector, the spans stay attached and
    // count them as owned until the reclaim hands them back.
    std::vector<void*> blocks;
    for (int i = 0; i < 2000; i++) blocks.push_back(heap::allocate(1000));
    for (void* block : blocks) heap::deallocate(block);
    ThreadHeap* mine = ThreadHeap::park();
    {
      std::unique_lock<std::mutex> guard(gate.lock);
      parked = mine;
      gate.waiting++;
      gate.changed.notify_all();
      gate.changed.wait(guard, [&] { return gate.open; });
    }
    ThreadHeap::unpark(mine);
  });
  {
    std::unique_lock<std::mutex> guard(gate.lock);
    gate.changed.wait(guard, [&] { return gate.waiting == 1; });
  }
  ASSERT_NE(parked, nullptr);
  ArenaStats before = Arena::stats();
  EXPECT_EQ(reclaimAllParked(), 1u);
  ArenaStats after = Arena::stats();
  // The spans still attached (most filled up and were handed back while the worker allocated)
  // were emptied by the reclaim: decommitted, none of it cached.
  EXPECT_GE(after.purgedBytesTotal - before.purgedBytesTotal, size_t{64} << 10);
  EXPECT_LE(after.dirtyBytes, before.dirtyBytes);
  {
    std::lock_guard<std::mutex> guard(gate.lock);
    gate.open = true;
  }
  gate.changed.notify_all();
  worker.join();
}

}  // namespace
}  // namespace meshalloc
