#include "handle/thread_cache.h"

#include <new>

#include "handle/store.h"
#include "handle/table.h"
#include "heap/heap.h"
#include "heap/internal_heap.h"
#include "platform/os.h"
#include "support/assert.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {

// A class's cache holds at most this many bytes of slots (and between 4 and kMaxSlots slots).
constexpr size_t kCacheBytesPerClass = 64 << 10;
constexpr uint32_t kMinSlots = 4;

// The mover waiting for a free in flight: a few instructions, so spin; a thread preempted in the
// middle of one is waited for yielding, then asleep.
constexpr unsigned kSpinsBeforeYielding = 256;
constexpr unsigned kYieldsBeforeSleeping = 16;
constexpr uint64_t kSleepNanos = 20000;

// Every cache ever made, pushed under the lock (which also guards inUse_); caches are never
// freed and next_ never changes once pushed, so cachedSlots walks the list without the lock (the
// defragmenter calls it, and must not hold up threads starting or exiting).
Mutex gRegistryLock{LockRank::kHandleCaches};
std::atomic<ThreadCache*> gRegistry{nullptr};

}  // namespace

constinit ThreadCache gEmptyThreadCache{ThreadCache::Empty{}};
constinit thread_local ThreadCache* tlsFastPathCache __attribute__((tls_model("initial-exec"))) =
    &gEmptyThreadCache;

void ThreadCache::init() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    size_t slots = kCacheBytesPerClass / Store::layout(c).slotSize;
    MESHALLOC_ASSERT_MSG(Store::layout(c).chunkBytes >= uintptr_t{1} << kHotBlockShift,
                         "a hot block must lie within one chunk");
    chunkMask_[c] = ~(Store::layout(c).chunkBytes - 1);
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
    for (ThreadCache* c = gRegistry.load(std::memory_order_relaxed); c; c = c->next_) {
      if (!c->inUse_) {
        cache = c;
        cache->inUse_ = true;
        cache->asymmetricFree_.store(asymmetricFrees(), std::memory_order_relaxed);
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
    cache->asymmetricFree_.store(asymmetricFrees(), std::memory_order_relaxed);
    cache->next_ = gRegistry.load(std::memory_order_relaxed);
    gRegistry.store(cache, std::memory_order_release);
  }
  // The real pointer first, the fast paths' last: a signal handler running in between finds
  // the cache through current() and the empty one through fast() (as setThreadHeap).
  tls_ = cache;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tlsFastPathCache = cache;
  return cache;
}

// Under the registry lock, which caches taken into use copy the flag under: a cache is either
// in the registry when this walks it, or copies the new value.
void ThreadCache::setAsymmetricFrees(bool asymmetric) {
  LockGuard guard(gRegistryLock);
  asymmetricFrees_.store(asymmetric, std::memory_order_relaxed);
  for (ThreadCache* c = gRegistry.load(std::memory_order_relaxed); c; c = c->next_)
    c->asymmetricFree_.store(asymmetric, std::memory_order_relaxed);
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

// The oldest `count` pairs of the class go back: the slots to their chunks, the entries to the
// entries kept apart.
void ThreadCache::returnSlots(unsigned sizeClass, unsigned count) {
  Magazine& m = magazines_[sizeClass];
  uint64_t* objects = pairedObjectsOf(sizeClass);
  uint32_t* entries = pairedEntriesOf(sizeClass);
  uint32_t held = m.count;
  // The store takes addresses: the leaving object words lose their class in place.
  for (unsigned i = 0; i < count; i++) objects[i] = addressOf(objects[i]);
  Store::returnSlots(sizeClass, objects, count);
  for (unsigned i = 0; i < count; i++) giveEntry(entries[i]);
  for (unsigned i = count; i < held; i++) {
    objects[i - count] = objects[i];
    entries[i - count] = entries[i];
  }
  m.setCount(held - count);
}

void ThreadCache::forgetRunChunks(unsigned sizeClass) {
  Magazine& m = magazines_[sizeClass];
  for (uintptr_t& chunk : m.runChunks) chunk = 0;
  m.hotBlock = 0;
}

// Gives back every slot of the class and forgets its run chunks: the defragmenter asked, and
// any of them may be a chunk it is emptying.
void ThreadCache::answerReturnRequest(unsigned sizeClass, uint32_t requests) {
  Magazine& m = magazines_[sizeClass];
  returnSlots(sizeClass, m.count);
  forgetRunChunks(sizeClass);
  m.seenRequests = requests;
}

bool ThreadCache::refill(unsigned sizeClass) {
  Magazine& m = magazines_[sizeClass];
  m.capacity = capacity_[sizeClass];
  uint32_t requests = returnRequests_[sizeClass].load(std::memory_order_relaxed);
  if (m.seenRequests != requests) answerReturnRequest(sizeClass, requests);
  // Addresses from the store, object words once paired.
  uint64_t* objects = pairedObjectsOf(sizeClass);
  uint32_t taken = Store::takeSlots(sizeClass, objects, m.capacity / 2);
  // Each slot with an entry, which its owner word names from now on (a move reads it under the
  // class lock and checks it against the entry, which is not live yet). Their chunks become the
  // run chunks whose freed slots this cache keeps.
  uint32_t paired = 0;
  for (; paired < taken; paired++) {
    uint32_t index = takeEntry();
    if (index == kNoEntry) break;
    uintptr_t slot = objects[paired];
    pairedEntriesOf(sizeClass)[paired] = index;
    Store::setOwner(slot, sizeClass, index);
    objects[paired] = makeObject(slot, sizeClass);
    uintptr_t chunk = slot & chunkMask_[sizeClass];
    bool known = false;
    for (uintptr_t run : m.runChunks) known |= run == chunk;
    if (!known) m.runChunks[m.nextRunChunk++ % kRunChunks] = chunk;
  }
  if (paired < taken) Store::returnSlots(sizeClass, objects + paired, taken - paired);
  // The top of the stack, handed out first, and its chunk a run chunk (the last one added).
  if (paired != 0) m.hotBlock = objects[paired - 1] >> kHotBlockShift;
  m.setCount(paired);
  return paired != 0;
}

void ThreadCache::giveSlow(unsigned sizeClass, uint32_t index, uint64_t object) {
  uintptr_t slot = addressOf(object);
  Magazine& m = magazines_[sizeClass];
  m.capacity = capacity_[sizeClass];
  uint32_t requests = returnRequests_[sizeClass].load(std::memory_order_relaxed);
  if (m.seenRequests != requests) answerReturnRequest(sizeClass, requests);
  if (!inRunChunk(m, sizeClass, slot)) {
    Store::returnSlots(sizeClass, &slot, 1);
    giveEntry(index);
    return;
  }
  if (m.count == m.capacity) returnSlots(sizeClass, m.capacity / 2);
  // Its block becomes the one the fast path keeps slots of.
  m.hotBlock = object >> kHotBlockShift;
  uint32_t count = m.count;
  pairedObjectsOf(sizeClass)[count] = object;
  pairedEntriesOf(sizeClass)[count] = index;
  m.setCount(count + 1);
}

void ThreadCache::flushAll() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    returnSlots(c, magazines_[c].count);
    forgetRunChunks(c);
  }
  flushEntries(entryCount_);
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
  // store directly. The fast paths' pointer first (setThreadHeap's order).
  tlsFastPathCache = &gEmptyThreadCache;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tls_ = reinterpret_cast<ThreadCache*>(kExited);
  LockGuard guard(gRegistryLock);
  cache->inUse_ = false;
}

size_t ThreadCache::cachedSlots(unsigned sizeClass) {
  size_t total = 0;
  for (ThreadCache* c = gRegistry.load(std::memory_order_acquire); c; c = c->next_)
    total += c->magazines_[sizeClass].countFromAnotherThread();
  return total;
}

void ThreadCache::waitForFrees(const uint64_t* handles, unsigned count) {
  for (ThreadCache* c = gRegistry.load(std::memory_order_acquire); c; c = c->next_) {
    // Acquire: once the announcement has ended, so has the free's store of the state.
    uint64_t freeing = c->freeing_.load(std::memory_order_acquire);
    if (freeing == 0) continue;
    bool named = false;
    for (unsigned i = 0; i < count && !named; i++) named = handles[i] == freeing;
    if (!named) continue;
    // Until it ends: a new announcement names another handle (no handle is freed twice).
    for (unsigned i = 0; c->freeing_.load(std::memory_order_acquire) == freeing; i++) {
      if (i < kSpinsBeforeYielding) {
        cpuRelax();
      } else if (i < kSpinsBeforeYielding + kYieldsBeforeSleeping) {
        os::yieldThread();
      } else {
        os::sleepNanos(kSleepNanos);
      }
    }
  }
}

const heap::ForkParticipant& ThreadCache::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant = {
      "handle thread caches", heap::ForkRank::kHandles, [] { gRegistryLock.lock(); },
      [] { gRegistryLock.unlock(); },
      [] {
        gRegistryLock.resetAfterFork();
        // A thread that was in the middle of a free at the fork does not exist here: its free
        // never ends, and the mover must not wait for it (the entry stays live in the child).
        for (ThreadCache* c = gRegistry.load(std::memory_order_relaxed); c; c = c->next_)
          c->freeing_.store(0, std::memory_order_relaxed);
      }};
  return kParticipant;
}

}  // namespace meshalloc::handles
