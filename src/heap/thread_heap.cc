#include "heap/thread_heap.h"

#include <new>

#include "heap/global_heap.h"
#include "heap/internal_heap.h"
#include "platform/os.h"
#include "support/lock.h"

namespace meshalloc {

thread_local ThreadHeap* tlsThreadHeap __attribute__((tls_model("initial-exec"))) = nullptr;

namespace {
Mutex gRegistryLock;
ThreadHeap* gRegistry = nullptr;
ThreadHeap* gPool = nullptr;  // heaps of finished threads, reused before allocating new ones

size_t slotWords(unsigned sizeClass) { return (SizeClasses::plan(sizeClass).objectCount + 63) / 64; }
}  // namespace

size_t ThreadHeap::storageBytes() {
  size_t bytes = sizeof(ThreadHeap);
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    bytes += slotWords(c) * sizeof(uint64_t);
    bytes += (SizeClasses::plan(c).objectCount * sizeof(uint16_t) + 7) & ~size_t{7};
  }
  return bytes;
}

void ThreadHeap::initialize(char* storage) {
  char* cursor = storage + sizeof(ThreadHeap);
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    ShuffleVector& v = vectors_[c];
    v.objectSize = SizeClasses::plan(c).objectSize;
    v.inVector = reinterpret_cast<uint64_t*>(cursor);
    cursor += slotWords(c) * sizeof(uint64_t);
    v.slots = reinterpret_cast<uint16_t*>(cursor);
    cursor += (SizeClasses::plan(c).objectCount * sizeof(uint16_t) + 7) & ~size_t{7};
  }
}

ThreadHeap* ThreadHeap::create() {
  ThreadHeap* heap = nullptr;
  {
    LockGuard guard(gRegistryLock);
    if (gPool) {
      heap = gPool;
      gPool = heap->poolNext_;
    }
  }
  if (!heap) {
    char* storage = static_cast<char*>(InternalHeap::allocate(storageBytes()));
    if (!storage) return nullptr;
    heap = new (storage) ThreadHeap();
    heap->initialize(storage);
    LockGuard guard(gRegistryLock);
    heap->registryNext_ = gRegistry;
    gRegistry = heap;
  }
  heap->rng_.reseed(os::entropy64() ^ reinterpret_cast<uintptr_t>(heap));
  heap->randomization_ = gHeapConfig.randomization;
  heap->inUse_ = true;
  return heap;
}

void ThreadHeap::retire() {
  detachAll();
  LockGuard guard(gRegistryLock);
  inUse_ = false;
  poolNext_ = gPool;
  gPool = this;
}

void ThreadHeap::fill(ShuffleVector& v, MiniHeap* heap) {
  AtomicBitmap bitmap = heap->bitmap();
  uint32_t claimed = 0;
  for (size_t w = 0; w < bitmap.words(); w++) {
    uint64_t bits = bitmap.claimWord(w);
    while (bits) {
      unsigned bit = static_cast<unsigned>(__builtin_ctzll(bits));
      bits &= bits - 1;
      v.push(static_cast<uint32_t>(w * 64 + bit));
      claimed++;
    }
  }
  if (claimed) heap->liveCount.fetch_add(claimed, std::memory_order_acq_rel);
  if (randomization_ == Randomization::kNone) {
    // Pop from the end must yield ascending addresses: reverse the ascending fill.
    for (uint32_t i = 0, j = v.length; i + 1 < j; i++, j--) {
      uint16_t t = v.slots[i];
      v.slots[i] = v.slots[j - 1];
      v.slots[j - 1] = t;
    }
  } else {
    for (uint32_t i = v.length; i > 1; i--) {  // Fisher-Yates
      uint32_t j = rng_.below(i);
      uint16_t t = v.slots[i - 1];
      v.slots[i - 1] = v.slots[j];
      v.slots[j] = t;
    }
  }
}

bool ThreadHeap::refill(unsigned sizeClass) {
  ShuffleVector& v = vectors_[sizeClass];
  if (v.length) return true;
  if (MiniHeap* current = v.attached) {
    // Other threads may have freed slots of our span meanwhile; reclaim them before moving on.
    if (current->liveCount.load(std::memory_order_acquire) < current->objectCount) {
      fill(v, current);
      if (v.length) return true;
    }
    detach(sizeClass);
  }
  for (;;) {
    MiniHeap* heap = GlobalHeap::acquireSpan(sizeClass, this);
    if (!heap) return false;
    v.attached = heap;
    v.spanStart = heap->spanStart;
    fill(v, heap);
    if (v.length) return true;
    detach(sizeClass);  // a partial span that filled up before we claimed it: try another
  }
}


void ThreadHeap::detach(unsigned sizeClass) {
  ShuffleVector& v = vectors_[sizeClass];
  MiniHeap* heap = v.attached;
  if (!heap) return;
  if (v.length) {
    AtomicBitmap bitmap = heap->bitmap();
    for (size_t w = 0; w < bitmap.words(); w++) {
      if (v.inVector[w]) bitmap.clearMask(w, v.inVector[w]);
      v.inVector[w] = 0;
    }
    heap->liveCount.fetch_sub(v.length, std::memory_order_acq_rel);
    v.length = 0;
  }
  v.attached = nullptr;
  v.spanStart = 0;
  GlobalHeap::releaseSpan(heap);
}

void ThreadHeap::detachAll() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) detach(c);
}

ThreadHeap* ThreadHeap::registryHead() { return gRegistry; }
void ThreadHeap::lockRegistry() { gRegistryLock.lock(); }
void ThreadHeap::unlockRegistry() { gRegistryLock.unlock(); }
void ThreadHeap::resetRegistryAfterFork() { gRegistryLock.resetAfterFork(); }

}  // namespace meshalloc
