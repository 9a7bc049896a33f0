#include "handle/thread_cache.h"

#include <new>

#include "handle/store.h"
#include "handle/table.h"
#include "heap/heap.h"
#include "heap/internal_heap.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {

// A class's cache holds at most this many bytes of slots (and between 4 and kMaxSlots slots).
constexpr size_t kCacheBytesPerClass = 64 << 10;
constexpr uint32_t kMinSlots = 4;

Mutex gRegistryLock{LockRank::kHandleCaches};
ThreadCache* gRegistry = nullptr;  // guarded by gRegistryLock

}  // namespace

void ThreadCache::init() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    size_t slots = kCacheBytesPerClass / Store::layout(c).slotSize;
    capacity_[c] = static_cast<uint32_t>(slots < kMinSlots   ? kMinSlots
                                         : slots > kMaxSlots ? kMaxSlots
                                                             : slots);
  }
  heap::addThreadExitHook(onThreadExit);
}

ThreadCache* ThreadCache::currentSlow() {
  if (reinterpret_cast<uintptr_t>(tls_) == kExited) return nullptr;
  // The heap's thread-exit hook runs only for threads that have a heap.
  if (!heap::currentThreadHeap()) return nullptr;
  ThreadCache* cache = nullptr;
  {
    LockGuard guard(gRegistryLock);
    for (ThreadCache* c = gRegistry; c; c = c->next_) {
      if (!c->inUse_) {
        cache = c;
        cache->inUse_ = true;
        break;
      }
    }
  }
  if (!cache) {
    void* storage = InternalHeap::allocate(sizeof(ThreadCache));
    if (!storage) return nullptr;
    // Default-initialised: the zero-filled memory is an empty cache, left untouched.
    cache = new (storage) ThreadCache;
    cache->inUse_ = true;
    LockGuard guard(gRegistryLock);
    cache->next_ = gRegistry;
    gRegistry = cache;
  }
  tls_ = cache;
  return cache;
}

uint32_t ThreadCache::refillEntries() {
  entryCount_ = Table::acquireBatch(entries_, kEntryBatch);
  if (entryCount_ == 0) return kNoEntry;
  return entries_[--entryCount_];
}

// The oldest `count` entries go back (the newest, hot in the cache, stay).
void ThreadCache::flushEntries(unsigned count) {
  Table::releaseBatch(entries_, count);
  for (unsigned i = count; i < entryCount_; i++) entries_[i - count] = entries_[i];
  entryCount_ -= count;
}

void ThreadCache::returnSlots(unsigned sizeClass, unsigned count) {
  Magazine& m = magazines_[sizeClass];
  uint32_t held = m.count;
  Store::returnSlots(sizeClass, m.slots, count);
  for (unsigned i = count; i < held; i++) m.slots[i - count] = m.slots[i];
  m.setCount(held - count);
}

uintptr_t ThreadCache::refillSlots(unsigned sizeClass) {
  Magazine& m = magazines_[sizeClass];
  uint32_t requests = returnRequests_[sizeClass].load(std::memory_order_relaxed);
  // Asked to give the class back: whatever is held may keep a sparse chunk alive.
  if (m.seenRequests != requests) returnSlots(sizeClass, m.count);
  m.seenRequests = requests;
  uint32_t taken = Store::takeSlots(sizeClass, m.slots, capacity_[sizeClass] / 2);
  if (taken == 0) return 0;
  m.setCount(taken - 1);
  return m.slots[taken - 1];
}

void ThreadCache::giveSlotSlow(unsigned sizeClass, uintptr_t slot) {
  Magazine& m = magazines_[sizeClass];
  uint32_t requests = returnRequests_[sizeClass].load(std::memory_order_relaxed);
  if (m.seenRequests != requests) {
    returnSlots(sizeClass, m.count);
    m.seenRequests = requests;
  } else {
    returnSlots(sizeClass, capacity_[sizeClass] / 2);
  }
  uint32_t count = m.count;
  m.slots[count] = slot;
  m.setCount(count + 1);
}

void ThreadCache::flushAll() {
  flushEntries(entryCount_);
  for (unsigned c = 0; c < kNumSizeClasses; c++) returnSlots(c, magazines_[c].count);
}

void ThreadCache::flushCurrent() {
  ThreadCache* cache = tls_;
  if (reinterpret_cast<uintptr_t>(cache) > kExited) cache->flushAll();
}

void ThreadCache::onThreadExit() {
  ThreadCache* cache = tls_;
  if (reinterpret_cast<uintptr_t>(cache) <= kExited) return;
  cache->flushAll();
  // Later handle calls of this thread (other threads' destructors) go to the table and the
  // store directly.
  tls_ = reinterpret_cast<ThreadCache*>(kExited);
  LockGuard guard(gRegistryLock);
  cache->inUse_ = false;
}

size_t ThreadCache::cachedSlots(unsigned sizeClass) {
  size_t total = 0;
  LockGuard guard(gRegistryLock);
  for (ThreadCache* c = gRegistry; c; c = c->next_)
    total += c->magazines_[sizeClass].countFromAnotherThread();
  return total;
}

void ThreadCache::lockForFork() {
  gRegistryLock.lock();
}
void ThreadCache::unlockAfterFork() {
  gRegistryLock.unlock();
}
void ThreadCache::resetAfterFork() {
  gRegistryLock.resetAfterFork();
}

}  // namespace meshalloc::handles
