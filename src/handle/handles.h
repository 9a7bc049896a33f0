// The handle operations behind include/meshalloc_handle.h: allocation, resizing and freeing
// through the handle table and the store, and pinning. Pinning is inline: one atomic add on
// the entry's state word, whose previous value says at once whether the handle is live with
// this generation and whether a move holds the entry (then pinSlow waits for that entry alone).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "handle/store.h"
#include "handle/table.h"
#include "handle/thread_cache.h"

namespace meshalloc::handles {

// Waits of mutator threads, by powers of two of nanoseconds, for the statistics' maximum and
// 99.99th percentile.
struct WaitRecord {
  static constexpr unsigned kBuckets = 48;
  std::atomic<uint64_t> count{0};
  std::atomic<uint64_t> totalNs{0};
  std::atomic<uint64_t> maxNs{0};
  std::atomic<uint64_t> buckets[kBuckets] = {};

  void record(uint64_t ns);
  // The upper bound of the bucket that holds the `permyriad` / 10,000 quantile of the waits
  // recorded (0 if none).
  uint64_t quantileNs(uint64_t permyriad) const;
};

// Counters shared by the operations, the defragmenter and the statistics.
struct Counters {
  std::atomic<uint64_t> movedObjects{0};
  std::atomic<uint64_t> movedBytes{0};
  std::atomic<uint64_t> abandonedMoves{0};  // a pin arrived during the copy
  std::atomic<uint64_t> passes{0};
  std::atomic<uint64_t> releasedBytes{0};  // given back to the OS by passes
  std::atomic<uint64_t> cpuNs{0};          // CPU time of passes
  // Mutators that waited because of the defragmenter: for a class lock a move held when they
  // asked for it (no operation waits for an entry a move holds: docs/handles.md, "Pinning and
  // moving").
  WaitRecord moverWaits;
  // Every other wait of a mutator in the handle layer: class locks other mutators held, and
  // entries another thread was resizing.
  WaitRecord otherWaits;
  // The longest a move held its class's lock (allocation and freeing in the class wait that
  // long at most, unless the mover is preempted meanwhile, which this includes).
  std::atomic<uint64_t> moveHoldMaxNs{0};
};

// The move that has committed and is publishing its copy (passes run one at a time, so there is
// at most one): an operation that finds an entry with kCommitBit and without kResizeBit, while
// it holds a pin on it, finds the copy's object word here instead of waiting for the mover to
// store it in the entry (committedObject, handles.cc). Written before the commit.
struct PublishingMove {
  std::atomic<uint32_t> index{~uint32_t{0}};
  std::atomic<uint64_t> object{0};
};
inline PublishingMove gPublishing;

// Raises `maximum` to `value`.
inline void raiseMaximum(std::atomic<uint64_t>& maximum, uint64_t value) {
  uint64_t seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
inline Counters gCounters;

// Registers the fork participant and plans the store; idempotent. False if the heap could not
// be initialised.
bool initialize();
inline std::atomic<bool> gInitialized{false};
inline bool ensureInitialized() {
  if (__builtin_expect(gInitialized.load(std::memory_order_acquire), 1)) return true;
  return initialize();
}

// The slow paths of allocate and free: no thread cache, or one that must go to the shared
// structures, and every case of a free but the common one.
uint64_t allocateSlow(size_t size, bool zero);
void freeSlow(uint64_t handle);
// Gives back the object and the entry of a handle just freed.
void releaseObject(uint64_t object, uint32_t index);

// The free's fast path gives large objects to their class's magazine, which never takes them.
static_assert(kLargeStoreClass == kNumSizeClasses, "ThreadCache has a magazine for large objects");

// MH_NULL (0) with errno ENOMEM on failure. The common case, inline: a small object and its
// entry from the thread's cache, with no lock and no atomic read-modify-write; the entry is
// published live (release) only once its object word is set, so that a defragmenter pass
// finding the slot's owner meanwhile leaves it alone.
__attribute__((always_inline)) inline uint64_t allocate(size_t size) {
  if (__builtin_expect(size <= kMaxSmallSize, 1)) {
    uint32_t index;
    uint64_t object;
    // Without a cache in use, the empty one: nothing to take.
    if (__builtin_expect(ThreadCache::fast()->takeFast(SizeClasses::classOf(size), index, object),
                         1)) {
      Entry& entry = Table::at(index);
      uint64_t generation = Table::nextGeneration(entry.state.load(std::memory_order_relaxed));
      // The slot's owner word names the entry already (ThreadCache, "paired").
      entry.object.store(object, std::memory_order_relaxed);
      entry.state.store(generation | kLiveBit, std::memory_order_release);
      return makeHandle(index, generation);
    }
  }
  return allocateSlow(size, false);
}
uint64_t allocateZeroed(size_t count, size_t size);
uint64_t reallocate(uint64_t handle, size_t size);
// How mh_free's common path is ordered against a move's commit (docs/handles.md, "Freeing
// without a read-modify-write"). The asymmetric free (plain loads and stores, announced to the
// mover, which runs a barrier on every thread and waits for the frees in flight before it
// commits) is ThreadCache::asymmetricFrees(), each cache's copy of which the free reads. Set
// when that is first: every batch of moves fences from then on (a free that read its cache's
// copy before it was cleared may still be in flight).
inline std::atomic<bool> gFencedFrees{false};

// Where tests stop an operation, as a preemption would; nothing in the library's own calls.
struct NoStops {
  // mh_free's common path, between its check of the state and its store of it.
  static void inFree(Entry&, uint64_t /*object*/) {}
};

// The common case, inline: a live entry that no pin, move or resize holds goes to not live
// (the generation kept: a later use of the handle finds it stale), and the slot and entry to
// the thread's cache, with the asymmetric protocol's plain load and plain store, announced to
// the mover. Everything else, and every free of a thread without a cache or of a process
// without that protocol (one compare-and-swap), is freeSlow's.
template <typename Stops = NoStops>
__attribute__((always_inline)) inline void free(uint64_t handle) {
  ThreadCache* cache = ThreadCache::fast();
  if (__builtin_expect(Table::names(handle) && cache->freesAsymmetrically(), 1)) {
    Entry* entry = &Table::at(indexOf(handle));
    cache->announceFree(handle);
    // Acquire: the object word a finished move stored (its publication ends with a release).
    if (__builtin_expect(
            entry->state.load(std::memory_order_acquire) != ((handle & kGenerationMask) | kLiveBit),
            0)) {
      cache->endFree();
      freeSlow(handle);
      return;
    }
    // No move can commit before endFree: one that began after the load above waits for it.
    uint64_t object = entry->object.load(std::memory_order_relaxed);
    Stops::inFree(*entry, object);
    entry->state.store(handle & kGenerationMask, std::memory_order_relaxed);
    cache->endFree();
    // A large object's class has a magazine that never takes it.
    if (__builtin_expect(cache->giveFast(classOfObject(object), indexOf(handle), object), 1))
      return;
    releaseObject(object, indexOf(handle));
    return;
  }
  freeSlow(handle);
}
size_t usableSize(uint64_t handle);
// One defragmentation pass until `deadlineNs` (monotonic; 0: until done), after the calling
// thread gave back what its cache holds (mh_compact, handles.compact): the bytes given back.
size_t compact(uint64_t deadlineNs);
// Handles whose objects are pinned now (a walk of the table).
size_t pinnedCount();

[[noreturn]] void reportInvalid(uint64_t handle, const char* operation);
void* pinSlow(uint64_t handle, Entry* entry, uint64_t previous);
[[noreturn]] void unpinFailed(uint64_t handle, uint64_t previous);

inline void* pin(uint64_t handle) {
  Entry* entry = Table::find(handle);
  if (__builtin_expect(entry == nullptr, 0)) reportInvalid(handle, "mh_pin");
  uint64_t previous = entry->state.fetch_add(1, std::memory_order_acquire);
  // Live, this generation, not moving, and the count not about to overflow.
  if (__builtin_expect((previous & (kGenerationMask | kLiveBit | kMovingBit)) !=
                               ((handle & kGenerationMask) | kLiveBit) ||
                           (previous & kPinMask) == kPinMask - 1,
                       0))
    return pinSlow(handle, entry, previous);
  return reinterpret_cast<void*>(addressOf(entry->object.load(std::memory_order_relaxed)));
}

inline void unpin(uint64_t handle) {
  Entry* entry = Table::find(handle);
  if (__builtin_expect(entry == nullptr, 0)) reportInvalid(handle, "mh_unpin");
  // Release: the writes made through the pointer come before any move that sees no pin.
  uint64_t previous = entry->state.fetch_sub(1, std::memory_order_release);
  if (__builtin_expect(!Table::matches(previous, handle) || (previous & kPinMask) == 0, 0))
    unpinFailed(handle, previous);
}

}  // namespace meshalloc::handles
