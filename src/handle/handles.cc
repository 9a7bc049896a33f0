#include "handle/handles.h"

#include <errno.h>
#include <string.h>

#include "handle/controller.h"
#include "handle/defrag.h"
#include "handle/store.h"
#include "handle/thread_cache.h"
#include "heap/errors.h"
#include "heap/fork.h"
#include "heap/heap.h"
#include "platform/os.h"
#include "support/assert.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {

// Only a resize holds an entry for long (it may copy a large object, and its thread may be
// preempted): spin a while, then sleep in short steps.
constexpr int kSpinsBeforeSleeping = 2000;
constexpr uint64_t kWaitSleepNs = 20000;

// Returns the state once no resize holds the entry (acquire: the object word is then current).
// A resize is another thread's mh_realloc of the same handle; moves are never waited for.
__attribute__((noinline)) uint64_t waitForResize(Entry& entry) {
  uint64_t state;
  uint64_t start = os::monotonicNanos();
  for (int spins = 0; (state = entry.state.load(std::memory_order_acquire)) & kResizeBit; spins++) {
    if (spins < kSpinsBeforeSleeping) {
      cpuRelax();
    } else {
      os::sleepNanos(kWaitSleepNs);
    }
  }
  gCounters.otherWaits.record(os::monotonicNanos() - start);
  return state;
}

// The object word of an entry the caller holds a pin on, given its state read after the pin
// was taken (acquire). While the pin is held no move can begin or commit (both need a pin count
// of 0) and no resize can start, so the only change left is a committed move's publication:
// with kCommitBit set the copy is in gPublishing (written before the commit, and overwritten
// only after the entry's kCommitBit is cleared, with release stores), else in the entry.
// `state` is updated to the state the answer was checked against.
uint64_t objectUnderPin(Entry& entry, uint32_t index, uint64_t& state) {
  for (;;) {
    if ((state & (kCommitBit | kResizeBit)) != kCommitBit)
      return entry.object.load(std::memory_order_relaxed);
    // Acquire: a record written after this entry's publication ended (release stores) makes
    // that end visible to the load of the state below.
    uint32_t published = gPublishing.index.load(std::memory_order_acquire);
    uint64_t object = gPublishing.object.load(std::memory_order_acquire);
    uint64_t again = entry.state.load(std::memory_order_acquire);
    if (again == state && published == index) return object;
    state = again;
  }
}

Entry& entryOf(uint64_t handle, const char* operation) {
  Entry* entry = Table::find(handle);
  if (!entry) reportInvalid(handle, operation);
  return *entry;
}

// Takes the entry exclusively for a resize (kResizeBit with kMovingBit and kCommitBit: pins
// wait, moves cannot begin); it must be live and unpinned. A move still copying is cancelled
// (its commit expects the state it set); a move that has committed is taken over: its copy
// becomes the object, stored in the entry here if the mover has not yet. Returns the object word.
uint64_t takeExclusive(Entry& entry, uint64_t handle, const char* operation) {
  constexpr uint64_t kExclusive = kMovingBit | kCommitBit | kResizeBit;
  for (;;) {
    uint64_t state = entry.state.load(std::memory_order_acquire);
    if (state & kResizeBit) state = waitForResize(entry);
    if (!Table::matches(state, handle))
      reportHeapError(HeapError::kStaleHandle, operation, reinterpret_cast<void*>(handle));
    if (state & kPinMask)
      reportHeapError(HeapError::kPinnedHandle, operation, reinterpret_cast<void*>(handle));
    if (!(state & kCommitBit)) {
      if (entry.state.compare_exchange_weak(state, (state & ~kHeldBits) | kExclusive,
                                            std::memory_order_acquire))
        return entry.object.load(std::memory_order_relaxed);
      continue;
    }
    // A committed move is publishing: under a pin, find its copy, then turn the pin into the
    // exclusive hold.
    uint64_t pinned = entry.state.fetch_add(1, std::memory_order_acquire) + 1;
    if (Table::matches(pinned, handle) && (pinned & kPinMask) == 1 && !(pinned & kResizeBit)) {
      uint64_t object = objectUnderPin(entry, indexOf(handle), pinned);
      if (entry.state.compare_exchange_strong(
              pinned, (pinned & ~kHeldBits & ~kPinMask) | kExclusive, std::memory_order_acquire)) {
        entry.object.store(object, std::memory_order_relaxed);
        return object;
      }
    }
    entry.state.fetch_sub(1, std::memory_order_relaxed);
  }
}

}  // namespace

// A new handle and object; the entry is published live only once its object word is set, so
// that a defragmenter pass finding the slot's owner meanwhile leaves it alone.
uint64_t allocateSlow(size_t size, bool zero) {
  if (size > heap::kMaxRequest || !ensureInitialized()) {
    errno = ENOMEM;
    return 0;
  }
  ThreadCache* cache = ThreadCache::current();
  uint32_t index = ThreadCache::kNoEntry;
  uint64_t object = 0;
  if (cache && size <= kMaxSmallSize) {
    unsigned sizeClass = SizeClasses::classOf(size);
    if (!cache->take(sizeClass, index, object)) {
      errno = ENOMEM;
      return 0;
    }
    if (zero)
      memset(reinterpret_cast<void*>(addressOf(object)), 0, Store::layout(sizeClass).slotSize);
  } else {
    if (cache) {
      index = cache->takeEntry();
    } else if (!Table::acquireBatch(&index, 1)) {
      index = ThreadCache::kNoEntry;
    }
    if (index == ThreadCache::kNoEntry) {
      errno = ENOMEM;
      return 0;
    }
    object = Store::allocate(size, index, zero);
    if (!object) {
      if (cache) {
        cache->giveEntry(index);
      } else {
        Table::releaseBatch(&index, 1);
      }
      return 0;
    }
  }
  uint64_t handle = Table::renew(index);
  Entry& entry = Table::at(index);
  entry.object.store(object, std::memory_order_relaxed);
  entry.state.store((handle & kGenerationMask) | kLiveBit, std::memory_order_release);
  // Here rather than on the fast path: every thread's first allocation, and one in every
  // cache refill, comes here (a fork child's first ones too).
  Controller::noteAllocation();
  return handle;
}

void WaitRecord::record(uint64_t ns) {
  count.fetch_add(1, std::memory_order_relaxed);
  totalNs.fetch_add(ns, std::memory_order_relaxed);
  raiseMaximum(maxNs, ns);
  unsigned bucket = 63 - static_cast<unsigned>(__builtin_clzll(ns | 1));
  buckets[bucket < kBuckets ? bucket : kBuckets - 1].fetch_add(1, std::memory_order_relaxed);
}

uint64_t WaitRecord::quantileNs(uint64_t permyriad) const {
  uint64_t total = 0;
  for (const auto& b : buckets) total += b.load(std::memory_order_relaxed);
  if (total == 0) return 0;
  uint64_t seen = 0;
  for (unsigned i = 0; i < kBuckets; i++) {
    seen += buckets[i].load(std::memory_order_relaxed);
    if (seen * 10000 >= permyriad * total) return uint64_t{2} << i;
  }
  return maxNs.load(std::memory_order_relaxed);
}

bool initialize() {
  if (!heap::ensureInitialized()) return false;
  // Published only once everything is planned: other threads then skip this.
  static constinit Mutex initLock;
  LockGuard guard(initLock);
  if (gInitialized.load(std::memory_order_relaxed)) return true;
  Store::init();
  ThreadCache::init();
  // Registering again is harmless (the heap's OperationGuard may have). Before any handle
  // exists, so no free has yet run under the other protocol.
  bool asymmetric = os::registerMembarrier();
  gFencedFrees.store(asymmetric, std::memory_order_relaxed);
  ThreadCache::setAsymmetricFrees(asymmetric);
  // In the layer's lock order (prepare in this order, the child's resets in reverse), all before
  // every heap lock: a chunk is made or released under a class lock, with the arena's lock
  // inside it.
  for (const heap::ForkParticipant* participant :
       {&Controller::forkParticipant(), &Defragmenter::forkParticipant(), &Store::forkParticipant(),
        &ThreadCache::forkParticipant(), &Table::forkParticipant()}) {
    [[maybe_unused]] bool added = heap::forkParticipants().add(*participant);
    MESHALLOC_ASSERT_MSG(added, "the fork participant list is full");
  }
  gInitialized.store(true, std::memory_order_release);
  return true;
}

void reportInvalid(uint64_t handle, const char* operation) {
  reportHeapError(HeapError::kInvalidHandle, operation, reinterpret_cast<void*>(handle));
}

uint64_t allocateZeroed(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return 0;
  }
  return allocateSlow(bytes, true);
}

uint64_t reallocate(uint64_t handle, size_t size) {
  if (handle == 0) return allocate(size);
  Entry& entry = entryOf(handle, "mh_realloc");
  uint64_t object = takeExclusive(entry, handle, "mh_realloc");
  unsigned storeClass = classOfObject(object);
  size_t usable = Store::usableSize(object);
  // Same small class, or a large run that fits and is not more than twice too big: in place.
  bool fits = size <= kMaxSmallSize
                  ? storeClass != kLargeStoreClass && SizeClasses::classOf(size) == storeClass
                  : storeClass == kLargeStoreClass && size <= usable && size >= usable / 2;
  uint64_t result = handle;
  if (size > heap::kMaxRequest) {
    errno = ENOMEM;
    result = 0;
  } else if (!fits) {
    uint64_t replacement = Store::allocate(size, indexOf(handle), false);
    if (replacement) {
      memcpy(reinterpret_cast<void*>(addressOf(replacement)),
             reinterpret_cast<const void*>(addressOf(object)), usable < size ? usable : size);
      entry.object.store(replacement, std::memory_order_relaxed);
      // Freed while the entry is still held, so that no defragmenter pass can take it meanwhile
      // with the old object word in mind.
      Store::free(object);
    } else {
      result = 0;
    }
  }
  // Pins that arrived meanwhile are kept (they wait for the bits to clear).
  entry.state.fetch_and(~kHeldBits, std::memory_order_release);
  return result;
}

// Frees an entry that a committed move is publishing (kCommitBit without kResizeBit in
// `state`): under a pin (so that no other move or resize can start), its object is the copy,
// and the entry goes from that one pin to not live. The mover then finds it dead and frees only
// the source. Returns false if the entry changed before the pin (the caller starts again).
bool freePublishing(Entry& entry, uint64_t handle, uint64_t* object) {
  uint64_t pinned = entry.state.fetch_add(1, std::memory_order_acquire) + 1;
  for (;;) {
    if (!Table::matches(pinned, handle) || (pinned & kPinMask) != 1 || (pinned & kResizeBit)) {
      entry.state.fetch_sub(1, std::memory_order_relaxed);
      return false;
    }
    *object = objectUnderPin(entry, indexOf(handle), pinned);
    if (entry.state.compare_exchange_weak(pinned, pinned & kGenerationMask,
                                          std::memory_order_acquire))
      return true;
  }
}

void freeSlow(uint64_t handle) {
  if (handle == 0) return;
  Entry& entry = entryOf(handle, "mh_free");
  uint64_t state = entry.state.load(std::memory_order_acquire);
  uint64_t object;
  for (;;) {
    if (__builtin_expect(state & kCommitBit, 0)) {
      // A resize holds the entry (the program's own call): wait. A move that has committed is
      // publishing: not waited for, its copy is freed. A move still copying is not waited for
      // either: the free takes the entry from under it, its commit then fails, and it frees its
      // copy (Defragmenter::copyAndPublish).
      if (state & kResizeBit) state = waitForResize(entry);
      if ((state & (kCommitBit | kResizeBit)) == kCommitBit && !(state & kPinMask) &&
          Table::matches(state, handle)) {
        if (freePublishing(entry, handle, &object)) break;
        state = entry.state.load(std::memory_order_acquire);
        continue;
      }
    }
    if (!Table::matches(state, handle))
      reportHeapError(HeapError::kStaleHandle, "mh_free", reinterpret_cast<void*>(handle));
    if (state & kPinMask)
      reportHeapError(HeapError::kPinnedHandle, "mh_free", reinterpret_cast<void*>(handle));
    if (state & kCommitBit) {  // held again since: look again
      state = entry.state.load(std::memory_order_acquire);
      continue;
    }
    // Not live, the generation kept: a later use of the handle finds it stale.
    if (entry.state.compare_exchange_weak(state, state & kGenerationMask,
                                          std::memory_order_acquire)) {
      object = entry.object.load(std::memory_order_relaxed);
      break;
    }
  }
  releaseObject(object, indexOf(handle));
}

void releaseObject(uint64_t object, uint32_t index) {
  unsigned storeClass = classOfObject(object);
  ThreadCache* cache = ThreadCache::current();
  if (cache && storeClass != kLargeStoreClass) {
    cache->give(storeClass, index, object);
    return;
  }
  Store::free(object);
  if (cache) {
    cache->giveEntry(index);
  } else {
    Table::releaseBatch(&index, 1);
  }
}

size_t compact(uint64_t deadlineNs) {
  if (!ensureInitialized()) return 0;
  // What this thread holds would keep chunks from emptying.
  ThreadCache::flushCurrent();
  return Defragmenter::pass(deadlineNs, 0).releasedBytes;
}

size_t usableSize(uint64_t handle) {
  if (handle == 0) return 0;
  Entry& entry = entryOf(handle, "mh_usable_size");
  uint64_t state = entry.state.load(std::memory_order_acquire);
  if (state & kResizeBit) state = waitForResize(entry);
  if (!Table::matches(state, handle))
    reportHeapError(HeapError::kStaleHandle, "mh_usable_size", reinterpret_cast<void*>(handle));
  // A move keeps the class, so the size holds whichever copy the word names.
  return Store::usableSize(entry.object.load(std::memory_order_relaxed));
}

void* pinSlow(uint64_t handle, Entry* entry, uint64_t previous) {
  if (!Table::matches(previous, handle))
    reportHeapError(HeapError::kStaleHandle, "mh_pin", reinterpret_cast<void*>(handle));
  if ((previous & kPinMask) >= kPinMask - 1) {
    entry->state.fetch_sub(1, std::memory_order_relaxed);
    reportHeapError(HeapError::kPinnedHandle, "mh_pin (pinned too often)",
                    reinterpret_cast<void*>(handle));
  }
  // A move holds the entry. Until it commits, cancel it and use the object where it is: the
  // mover writes the object word only after committing, which our pin (and the cancel bit,
  // which outlives our unpin) makes impossible. Once it has committed, use its copy, whether or
  // not the mover has published it yet. Only a resize is waited for.
  uint64_t state = previous + 1;
  while ((state & (kMovingBit | kCommitBit)) == kMovingBit) {
    if (entry->state.compare_exchange_weak(state, state | kCancelBit, std::memory_order_acquire))
      return reinterpret_cast<void*>(addressOf(entry->object.load(std::memory_order_relaxed)));
  }
  if (state & kResizeBit) state = waitForResize(*entry);
  return reinterpret_cast<void*>(addressOf(objectUnderPin(*entry, indexOf(handle), state)));
}

void unpinFailed(uint64_t handle, uint64_t previous) {
  if (!Table::matches(previous, handle))
    reportHeapError(HeapError::kStaleHandle, "mh_unpin", reinterpret_cast<void*>(handle));
  reportHeapError(HeapError::kUnpinnedHandle, "mh_unpin", reinterpret_cast<void*>(handle));
}

size_t pinnedCount() {
  size_t pinned = 0;
  uint32_t entries = Table::highWater();
  for (uint32_t i = 0; i < entries; i++) {
    uint64_t state = Table::at(i).state.load(std::memory_order_relaxed);
    if ((state & kLiveBit) && (state & kPinMask)) pinned++;
  }
  return pinned;
}

}  // namespace meshalloc::handles
