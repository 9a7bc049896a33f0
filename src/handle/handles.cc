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
#include "support/lock.h"

namespace meshalloc::handles {

namespace {

// A move holds an entry for a copy of at most 16 KiB (a few microseconds) and publishes in a
// few instructions: spin that long, then sleep in short steps (a resize holding the entry may
// copy a large object, and the holder may be preempted).
constexpr int kSpinsBeforeSleeping = 2000;
constexpr uint64_t kWaitSleepNs = 20000;

void forkPrepare() {
  Defragmenter::lockForFork();
  Store::lockAll();
  ThreadCache::lockForFork();
  Table::lockForFork();
}
void forkParent() {
  Table::unlockAfterFork();
  ThreadCache::unlockAfterFork();
  Store::unlockAll();
  Defragmenter::unlockAfterFork();
}
void forkChild() {
  Table::resetAfterFork();
  ThreadCache::resetAfterFork();
  Store::resetAfterFork();
  Defragmenter::resetAfterFork();
  Controller::forgetAfterFork();
}

// Before every heap lock: a chunk is made or released under a class lock, with the arena's
// lock inside it.
constexpr heap::ForkParticipant kForkHandles = {"handles", heap::ForkRank::kHandles, forkPrepare,
                                                forkParent, forkChild};

void recordWait(uint64_t startNs) {
  uint64_t waited = os::monotonicNanos() - startNs;
  gCounters.waits.fetch_add(1, std::memory_order_relaxed);
  gCounters.waitTotalNs.fetch_add(waited, std::memory_order_relaxed);
  raiseMaximum(gCounters.waitMaxNs, waited);
}

// Returns the state once the moving bit is clear (acquire: the object word is then current).
__attribute__((noinline)) uint64_t waitForMove(Entry& entry) {
  uint64_t state;
  uint64_t start = os::monotonicNanos();
  for (int spins = 0; (state = entry.state.load(std::memory_order_acquire)) & kMovingBit; spins++) {
    if (spins < kSpinsBeforeSleeping) {
      cpuRelax();
    } else {
      os::sleepNanos(kWaitSleepNs);
    }
  }
  recordWait(start);
  return state;
}
inline uint64_t waitWhileMoving(Entry& entry) {
  uint64_t state = entry.state.load(std::memory_order_acquire);
  if (__builtin_expect(!(state & kMovingBit), 1)) return state;
  return waitForMove(entry);
}

Entry& entryOf(uint64_t handle, const char* operation) {
  Entry* entry = Table::find(handle);
  if (!entry) reportInvalid(handle, operation);
  return *entry;
}

// Takes the entry exclusively (moving and commit bits: pins wait) for a resize; it must be live
// and unpinned.
uint64_t takeExclusive(Entry& entry, uint64_t handle, const char* operation) {
  for (;;) {
    uint64_t state = waitWhileMoving(entry);
    if (!Table::matches(state, handle))
      reportHeapError(HeapError::kStaleHandle, operation, reinterpret_cast<void*>(handle));
    if (state & kPinMask)
      reportHeapError(HeapError::kPinnedHandle, operation, reinterpret_cast<void*>(handle));
    if (entry.state.compare_exchange_weak(state, state | kMovingBit | kCommitBit,
                                          std::memory_order_acquire))
      return state;
  }
}

// A new handle and object; the entry is published live only once its object word is set, so
// that a defragmenter pass finding the slot's owner meanwhile leaves it alone. With a thread
// cache, a small object takes no lock and no atomic read-modify-write.
uint64_t allocateBytes(size_t size, bool zero) {
  if (size > heap::kMaxRequest || !ensureInitialized()) {
    errno = ENOMEM;
    return 0;
  }
  ThreadCache* cache = ThreadCache::current();
  uint32_t index = ThreadCache::kNoEntry;
  if (cache) {
    index = cache->takeEntry();
  } else if (!Table::acquireBatch(&index, 1)) {
    index = ThreadCache::kNoEntry;
  }
  if (index == ThreadCache::kNoEntry) {
    errno = ENOMEM;
    return 0;
  }
  uint64_t handle = Table::renew(index);
  uint64_t object;
  if (cache && size <= kMaxSmallSize) {
    unsigned sizeClass = SizeClasses::classOf(size);
    uintptr_t address = cache->takeSlot(sizeClass);
    if (address) {
      Store::setOwner(address, sizeClass, index);
      if (zero) memset(reinterpret_cast<void*>(address), 0, Store::layout(sizeClass).slotSize);
    } else {
      errno = ENOMEM;
    }
    object = address ? makeObject(address, sizeClass) : 0;
  } else {
    object = Store::allocate(size, index, zero);
  }
  if (!object) {
    if (cache) {
      cache->giveEntry(index);
    } else {
      Table::releaseBatch(&index, 1);
    }
    return 0;
  }
  Entry& entry = Table::at(index);
  entry.object.store(object, std::memory_order_relaxed);
  entry.state.store((handle & kGenerationMask) | kLiveBit, std::memory_order_release);
  Controller::noteAllocation();
  return handle;
}

}  // namespace

bool initialize() {
  if (!heap::ensureInitialized()) return false;
  // Published only once everything is planned: other threads then skip this.
  static constinit Mutex initLock;
  LockGuard guard(initLock);
  if (gInitialized.load(std::memory_order_relaxed)) return true;
  Store::init();
  ThreadCache::init();
  heap::forkParticipants().add(kForkHandles);
  gInitialized.store(true, std::memory_order_release);
  return true;
}

void reportInvalid(uint64_t handle, const char* operation) {
  reportHeapError(HeapError::kInvalidHandle, operation, reinterpret_cast<void*>(handle));
}

uint64_t allocate(size_t size) {
  return allocateBytes(size, false);
}

uint64_t allocateZeroed(size_t count, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(count, size, &bytes)) {
    errno = ENOMEM;
    return 0;
  }
  return allocateBytes(bytes, true);
}

uint64_t reallocate(uint64_t handle, size_t size) {
  if (handle == 0) return allocate(size);
  Entry& entry = entryOf(handle, "mh_realloc");
  uint64_t state = takeExclusive(entry, handle, "mh_realloc");
  uint64_t object = entry.object.load(std::memory_order_relaxed);
  unsigned storeClass = classOfObject(object);
  size_t usable = Store::usableSize(object);
  // Same small class, or a large run that fits and is not more than twice too big: in place.
  bool fits = size <= kMaxSmallSize
                  ? storeClass != kLargeStoreClass && SizeClasses::classOf(size) == storeClass
                  : storeClass == kLargeStoreClass && size <= usable && size >= usable / 2;
  if (size > heap::kMaxRequest) {
    entry.state.store(state, std::memory_order_release);
    errno = ENOMEM;
    return 0;
  }
  if (!fits) {
    uint64_t replacement = Store::allocate(size, indexOf(handle), false);
    if (!replacement) {
      entry.state.store(state, std::memory_order_release);
      return 0;
    }
    memcpy(reinterpret_cast<void*>(addressOf(replacement)),
           reinterpret_cast<const void*>(addressOf(object)), usable < size ? usable : size);
    entry.object.store(replacement, std::memory_order_relaxed);
    // Freed while the entry is still held, so that no defragmenter pass can take it meanwhile
    // with the old object word in mind.
    Store::free(object);
  }
  // Pins that arrived meanwhile are kept (they wait for the bits to clear).
  entry.state.fetch_and(~kHeldBits, std::memory_order_release);
  return handle;
}

void free(uint64_t handle) {
  if (handle == 0) return;
  Entry& entry = entryOf(handle, "mh_free");
  uint64_t state = entry.state.load(std::memory_order_acquire);
  for (;;) {
    // A move that has committed is publishing its copy (or a resize holds the entry): wait.
    // A move still copying is not waited for: the free takes the entry from under it, its
    // commit then fails, and it frees its copy (Defragmenter::copyAndPublish).
    if (state & kCommitBit) state = waitWhileMoving(entry);
    if (!Table::matches(state, handle))
      reportHeapError(HeapError::kStaleHandle, "mh_free", reinterpret_cast<void*>(handle));
    if (state & kPinMask)
      reportHeapError(HeapError::kPinnedHandle, "mh_free", reinterpret_cast<void*>(handle));
    // Not live, the generation kept: a later use of the handle finds it stale.
    if (entry.state.compare_exchange_weak(state, state & kGenerationMask,
                                          std::memory_order_acquire))
      break;
  }
  uint64_t object = entry.object.load(std::memory_order_relaxed);
  unsigned storeClass = classOfObject(object);
  ThreadCache* cache = ThreadCache::current();
  if (cache && storeClass != kLargeStoreClass) {
    cache->giveSlot(storeClass, addressOf(object));
  } else {
    Store::free(object);
  }
  uint32_t index = indexOf(handle);
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
  uint64_t state = waitWhileMoving(entry);
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
  // which outlives our unpin) makes impossible. Once it has committed, or for a resize, wait.
  uint64_t state = previous + 1;
  while ((state & (kMovingBit | kCommitBit)) == kMovingBit) {
    if (entry->state.compare_exchange_weak(state, state | kCancelBit, std::memory_order_acquire))
      return reinterpret_cast<void*>(addressOf(entry->object.load(std::memory_order_relaxed)));
  }
  waitWhileMoving(*entry);
  return reinterpret_cast<void*>(addressOf(entry->object.load(std::memory_order_relaxed)));
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
