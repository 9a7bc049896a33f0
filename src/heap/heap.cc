#include "heap/heap.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <atomic>

#include "heap/config.h"
#include "heap/errors.h"
#include "heap/global_heap.h"
#include "heap/internal_heap.h"
#include "heap/operation_guard.h"
#include "heap/span_backing.h"
#include "platform/os.h"

extern "C" {
// glibc's own allocator, still exported under these names: a pointer that glibc handed out
// before we were in place must be given back to glibc.
void __libc_free(void* pointer);
size_t __libc_malloc_usable_size(void* pointer) __attribute__((weak));
}

namespace meshalloc::heap {

namespace {

enum InitState : int { kUninitialized = 0, kInitializing = 1, kReady = 2, kFailed = 3 };
std::atomic<int> gInitState{kUninitialized};
pthread_key_t gThreadExitKey;

ForkHooks gForkHooks = {};
void (*gRefillHook)() = nullptr;
void (*gThreadExitHook)() = nullptr;

void onThreadExit(void* value) {
  ThreadHeap* heap = static_cast<ThreadHeap*>(value);
  // A thread cancelled in a parked wait never unparked: a reclaim may be under way.
  if (tlsParkedHeap == heap) ThreadHeap::resumeParked();
  if (tlsThreadHeap == heap) {
    flushRecycledBlocks();
    tlsThreadHeap = nullptr;
  }
  heap->retire();
  if (gThreadExitHook) gThreadExitHook();
}

void prepareFork() {
  if (gForkHooks.prepareFirst) gForkHooks.prepareFirst();
  ThreadHeap::lockReclaimForFork();
  ThreadHeap::lockRegistry();
  GlobalHeap::lockForFork();
  SpanBacking::lock();
  Arena::lockForFork();
  InternalHeap::lockForFork();
  if (gForkHooks.prepare) gForkHooks.prepare();
}

void parentAfterFork() {
  if (gForkHooks.parent) gForkHooks.parent();
  InternalHeap::unlockAfterFork();
  Arena::unlockAfterFork();
  SpanBacking::unlock();
  GlobalHeap::unlockAfterFork();
  ThreadHeap::unlockRegistry();
  ThreadHeap::unlockReclaimAfterFork();
}

void childAfterFork() {
  // The child has only the forking thread. Other threads' heaps stay attached to their spans
  // (their slots are simply never reused in the child): touching them could race with a
  // half-finished fast-path operation captured by the fork.
  if (gForkHooks.child) gForkHooks.child();
  InternalHeap::resetAfterFork();
  Arena::resetAfterFork();
  SpanBacking::resetLockAfterFork();
  GlobalHeap::resetAfterFork();
  ThreadHeap::resetRegistryAfterFork();
  ThreadHeap::resetReclaimAfterFork();
  OperationGuard::resetAfterFork();
}

bool initializeOnce() {
  os::initPlatform();
  loadConfigFromEnvironment();
  SizeClasses::init(os::pageSize());
  // Odd, so never an aligned pointer a program would store in a freed block; bit 1 is the
  // vector tag's.
  gCacheTag = (os::entropy64() | 1) & ~(kVectorTagBit | kReleasedTagBit);
  if (!Arena::init()) return false;
  OperationGuard::init();
  if (pthread_key_create(&gThreadExitKey, onThreadExit) != 0) return false;
  if (gHeapConfig.showOptions) printConfig(2);
  return true;
}

ThreadHeap* threadHeap() {
  ThreadHeap* heap = tlsThreadHeap;
  if (heap) return heap;
  // A signal handler allocating during a parked wait (or a thread that left the wait by
  // longjmp): the heap is the thread's again, once any reclaim of it is over.
  if ((heap = ThreadHeap::resumeParked())) return heap;
  if (!ensureInitialized()) return nullptr;
  heap = ThreadHeap::create();
  if (!heap) return nullptr;
  tlsThreadHeap = heap;
  pthread_setspecific(gThreadExitKey, heap);
  return heap;
}

// Resolves a pointer the program passed back to us, reporting every kind of misuse. Returns
// nullptr for a pointer glibc owns.
MiniHeap* resolve(const void* pointer, uint64_t entry, const char* operation, int64_t* slot) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (!PageEntry::isMiniHeap(entry)) {
    if (Arena::contains(address)) {
      uint64_t below = Arena::entryAtOrBelow(address);
      if (PageEntry::isMiniHeap(below)) {
        MiniHeap* owner = PageEntry::miniHeap(below);
        if (owner->isLarge() && address < owner->spanStart + owner->spanBytes(Arena::pageSize())) {
          reportHeapError(HeapError::kInteriorPointer, operation, pointer,
                          reinterpret_cast<void*>(owner->largeStart()));
        }
      }
      reportHeapError(HeapError::kStalePointer, operation, pointer);
    }
    if (os::isInBrkHeap(address)) return nullptr;
    reportHeapError(HeapError::kInvalidPointer, operation, pointer);
  }
  MiniHeap* mini = PageEntry::miniHeap(entry);
  if (mini->isLarge()) {
    if (address != mini->largeStart()) {
      reportHeapError(HeapError::kInteriorPointer, operation, pointer,
                      reinterpret_cast<void*>(mini->largeStart()));
    }
    *slot = 0;
    return mini;
  }
  uintptr_t spanStart = Arena::spanStartOf(address, entry);
  *slot = mini->slotOf(address - spanStart);
  if (*slot < 0) {
    uintptr_t objectStart = spanStart + (address - spanStart) / mini->objectSize * mini->objectSize;
    reportHeapError(HeapError::kInteriorPointer, operation, pointer,
                    reinterpret_cast<void*>(objectStart));
  }
  return mini;
}

void freeResolved(void* pointer, MiniHeap* mini, int64_t slot) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (mini->isLarge()) {
    GlobalHeap::freeLarge(mini, address);
    return;
  }
  ThreadHeap* heap = tlsThreadHeap;
  if (heap && mini->owner.load(std::memory_order_relaxed) == heap) {
    ShuffleVector& v = heap->vector(mini->sizeClass);
    heap->drainRemoteFrees(v, mini->attachIndex, MiniHeap::kRemoteFreesEmpty);
    // The vector holds the span's own addresses; `pointer` may be a meshed alias of the slot
    // (a span meshed before this thread attached it).
    uintptr_t canonical = mini->spanStart + static_cast<uintptr_t>(slot) * mini->objectSize;
    if ((isCacheTagged(canonical) && v.holds(canonical)) ||
        !mini->bitmap().isSet(static_cast<size_t>(slot))) {
      reportHeapError(HeapError::kDoubleFree, "free", pointer);
    }
    if (v.length < v.capacity) {
      v.push(canonical);
      return;
    }
    // The span stays attached and reclaims the slot from its bitmap on the next refill; the tag
    // lets the local fast path notice a second free meanwhile.
    setCacheTag(canonical, releasedTag());
    GlobalHeap::freeToBitmap(mini, mini->sizeClass, static_cast<size_t>(slot), address);
    return;
  }
  GlobalHeap::freeRemote(mini, mini->sizeClass, static_cast<size_t>(slot), address);
}

size_t usableSizeOf(const MiniHeap* mini) {
  return mini->isLarge() ? mini->largeBytes(Arena::pageSize()) : mini->objectSize;
}

// Under a guard: frees `address` through its span's bitmap if it is a valid small block in a
// span the calling thread does not hold (the page-map entry gives the class, so the slot check
// needs no MiniHeap field); false leaves it to the caller.
bool freeIntoUnheldSpan(uintptr_t address, uint64_t entry) {
  int64_t slot = smallSlotOf(address, entry);
  if (slot < 0) return false;
  MiniHeap* mini = PageEntry::miniHeap(entry);
  ThreadHeap* heap = tlsThreadHeap;
  if (heap != nullptr && mini->owner.load(std::memory_order_relaxed) == heap) return false;
  GlobalHeap::freeRemote(mini, PageEntry::sizeClass(entry), static_cast<size_t>(slot), address);
  return true;
}

void* failNoMemory() {
  errno = ENOMEM;
  return nullptr;
}

}  // namespace

void setForkHooks(const ForkHooks& hooks) {
  gForkHooks = hooks;
}
ThreadHeap* currentThreadHeap() {
  return threadHeap();
}
void setRefillHook(void (*hook)()) {
  gRefillHook = hook;
}
void setThreadExitHook(void (*hook)()) {
  gThreadExitHook = hook;
}

bool ensureInitialized() {
  int state = gInitState.load(std::memory_order_acquire);
  if (__builtin_expect(state == kReady, 1)) return true;
  if (state == kUninitialized) {
    int expected = kUninitialized;
    if (gInitState.compare_exchange_strong(expected, kInitializing, std::memory_order_acq_rel)) {
      bool ok = initializeOnce();
      gInitState.store(ok ? kReady : kFailed, std::memory_order_release);
      // Registered only once ready: pthread_atfork may itself allocate.
      if (ok) pthread_atfork(prepareFork, parentAfterFork, childAfterFork);
      return ok;
    }
  }
  while ((state = gInitState.load(std::memory_order_acquire)) == kInitializing) {
    // Another thread is initialising (it never allocates while doing so); wait for it.
  }
  return state == kReady;
}

void* allocateSlow(size_t size) {
  if (size > kMaxSmallSize) {
    if (size > kMaxRequest || !ensureInitialized()) return failNoMemory();
    bool zeroed;
    void* block = GlobalHeap::allocateLarge(size, 0, &zeroed);
    return block ? block : failNoMemory();
  }
  ThreadHeap* heap = threadHeap();
  if (!heap) return failNoMemory();
  unsigned sizeClass = SizeClasses::classOf(size);
  // The fast path gets here only with none left, so this only upholds refill's precondition
  // (the class's recycled blocks are all gone; see ThreadHeap::refill).
  ShuffleVector& v = heap->vector(sizeClass);
  if (v.recycledCount != 0) return v.popRecycled();
  if (!heap->refill(sizeClass)) return failNoMemory();
  void* block = v.pop();
  if (gRefillHook) gRefillHook();
  return block;
}

void deallocateSlow(void* pointer) {
  if (!pointer) return;
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  // A second free of a block a thread caches (the fast path checks the tag too, but a thread
  // without a heap comes straight here). Before the guard: the check may take the registry
  // lock, which a mesh pause holds while it waits for guarded operations.
  uint64_t peek = Arena::entryFor(address);
  if (smallSlotOf(address, peek) >= 0 && isCacheTagged(address))
    checkTaggedFree(PageEntry::sizeClass(peek), address);
  OperationGuard guard;
  uint64_t entry = Arena::entryFor(address);
  // The common case first: a valid small object in a span this thread does not hold.
  if (__builtin_expect(freeIntoUnheldSpan(address, entry), 1)) return;
  int64_t slot;
  MiniHeap* mini = resolve(pointer, entry, "free", &slot);
  if (!mini) {
    __libc_free(pointer);
    return;
  }
  freeResolved(pointer, mini, slot);
}

void deallocateOther(ThreadHeap* heap, unsigned sizeClass, int span, uintptr_t spanStart,
                     uintptr_t address) {
  if (span >= 0) return deallocateSlow(reinterpret_cast<void*>(address));
  ShuffleVector& v = heap->vector(sizeClass);
  if (__builtin_expect(span == ShuffleVector::kMaybeAttached, 0)) {
    uint64_t entry = Arena::entryFor(address);
    if (!PageEntry::isMiniHeap(entry) ||
        !pushLocalFree(heap, v, PageEntry::miniHeap(entry), spanStart, address)) {
      deallocateSlow(reinterpret_cast<void*>(address));
    }
    return;
  }
  if (__builtin_expect(isCacheTagged(address), 0)) checkTaggedFree(sizeClass, address);
  // The block's full entry now, and the MiniHeap of a block kRecycledPrefetchDistance
  // applications ahead (its entry fetched long since), so that applying it later misses on
  // neither. (Only here: a prefetch on every free cost larson about 5 %, its spans' lines
  // bouncing between threads.)
  __builtin_prefetch(Arena::entryAddressFor(address));
  uintptr_t due = v.pushRecycled(address);
  if (due) {
    prefetchRecycledSpan(v.recycledToApplyAfter(kRecycledPrefetchDistance));
    applyRecycledFree(heap, due);
  }
}

void* allocatePinned(size_t size) {
  if (size > kMaxSmallSize) return allocate(size);  // large objects are never meshed
  // A recycled block may lie in a span a mesh pass holds right now; such blocks are set aside
  // until the class's vector serves one (after at most the ring's worth), then freed again.
  void* setAside[kMaxRecycled];
  unsigned setAsideCount = 0;
  void* block;
  for (;;) {
    block = allocate(size);
    if (!block) break;
    MiniHeap* mini = PageEntry::miniHeap(Arena::entryFor(reinterpret_cast<uintptr_t>(block)));
    if (mini->owner.load(std::memory_order_relaxed) == tlsThreadHeap ||
        setAsideCount == kMaxRecycled) {
      GlobalHeap::pin(mini);
      break;
    }
    setAside[setAsideCount++] = block;
  }
  for (unsigned i = 0; i < setAsideCount; i++) deallocate(setAside[i]);
  return block;
}

void* allocateAligned(size_t size, size_t alignment) {
  if (alignment <= kMinAlignment) return allocate(size);
  if (size > kMaxRequest || alignment > kMaxRequest) return failNoMemory();
  if (!ensureInitialized()) return failNoMemory();
  if (alignment <= Arena::pageSize()) {
    unsigned sizeClass = SizeClasses::classForAlignment(size ? size : 1, alignment);
    if (sizeClass != kLargeClass) return allocate(kSizeClassSizes[sizeClass]);
  }
  bool zeroed;
  void* block = GlobalHeap::allocateLarge(size, alignment, &zeroed);
  return block ? block : failNoMemory();
}

void* allocateZeroed(size_t size) {
  if (size > kMaxSmallSize) {
    if (size > kMaxRequest || !ensureInitialized()) return failNoMemory();
    bool zeroed;
    void* block = GlobalHeap::allocateLarge(size, 0, &zeroed);
    if (!block) return failNoMemory();
    if (!zeroed) memset(block, 0, size);
    return block;
  }
  void* block = allocate(size);
  if (block) memset(block, 0, size);
  return block;
}

void* reallocate(void* pointer, size_t size) {
  size_t oldSize;
  bool glibcOwned;
  {
    OperationGuard guard;
    uint64_t entry = Arena::entryFor(reinterpret_cast<uintptr_t>(pointer));
    int64_t slot;
    MiniHeap* mini = resolve(pointer, entry, "realloc", &slot);
    if (size > kMaxRequest) return failNoMemory();
    glibcOwned = mini == nullptr;
    if (glibcOwned) {
      oldSize = __libc_malloc_usable_size ? __libc_malloc_usable_size(pointer) : 0;
    } else {
      oldSize = usableSizeOf(mini);
      if (!mini->isLarge()) {
        // Stay put while the new size still maps to this object's class (shrinking by more
        // than that moves, so the memory is not held by a much larger slot).
        if (size <= oldSize &&
            (size > kMaxSmallSize || SizeClasses::classOf(size) == mini->sizeClass)) {
          return pointer;
        }
      } else if (size > kMaxSmallSize && size > oldSize / 2) {
        if (GlobalHeap::resizeLargeInPlace(mini, size)) return pointer;
      }
    }
  }
  // The guard is not held across allocation (a refill may wait for a mesh batch); the old
  // object stays valid and readable meanwhile, wherever meshing moves its span's pages.
  // A large block that realloc moves keeps page alignment: colouring it (large_colouring) made
  // growing buffers (the `realloc` benchmark) about 20 % slower, and the buffers whose copies
  // collide are made by malloc.
  bool zeroed;
  void* moved = size > kMaxSmallSize ? GlobalHeap::allocateLarge(size, Arena::pageSize(), &zeroed)
                                     : allocate(size);
  if (!moved) return failNoMemory();
  memcpy(moved, pointer, oldSize < size ? oldSize : size);
  if (glibcOwned)
    __libc_free(pointer);
  else
    deallocate(pointer);
  return moved;
}

size_t usableSizeSlow(const void* pointer) {
  if (!pointer) return 0;
  // Resolves the MiniHeap, so the entry is read again under the guard.
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  OperationGuard guard;
  uint64_t entry = Arena::entryFor(address);
  int64_t slot;
  MiniHeap* mini = resolve(pointer, entry, "malloc_usable_size", &slot);
  if (!mini)
    return __libc_malloc_usable_size ? __libc_malloc_usable_size(const_cast<void*>(pointer)) : 0;
  return usableSizeOf(mini);
}

void checkTaggedFree(unsigned sizeClass, uintptr_t address) {
  uintptr_t tag = cacheTagOf(address);
  bool freed = false;
  if (tag == recycledTag()) {
    freed = ThreadHeap::recycledAnywhere(sizeClass, address);
  } else {
    // A vector holds only blocks of spans attached to its thread: ask the span's owner. A
    // released block's slot is clear in the bitmap once the owner has drained it (before, it
    // waits on the span's stack: not looked for).
    uint64_t entry = Arena::entryFor(address);
    int64_t slot = smallSlotOf(address, entry);
    if (slot >= 0) {
      MiniHeap* mini = PageEntry::miniHeap(entry);
      ThreadHeap* owner = mini->owner.load(std::memory_order_acquire);
      if (tag == vectorTag()) {
        freed = owner && (owner == tlsThreadHeap ? owner->vector(sizeClass).holds(address)
                                                 : owner->holdsFreeBlock(sizeClass, address));
      } else {
        freed = owner && !mini->bitmap().isSet(static_cast<size_t>(slot));
      }
    }
  }
  if (freed) reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(address));
}

void applyRecycledFree(ThreadHeap* heap, uintptr_t address) {
  uint64_t entry = Arena::entryFor(address);
  if (int64_t slot = smallSlotOf(address, entry); __builtin_expect(slot >= 0, 1)) {
    unsigned sizeClass = PageEntry::sizeClass(entry);
    MiniHeap* mini = PageEntry::miniHeap(entry);
    if (pushLocalFree(heap, heap->vector(sizeClass), mini, Arena::spanStartOf(address, entry),
                      address))
      return;
    // Most recycled blocks lie in spans no thread holds (Redis's evictions, larson's blocks from
    // other threads). deallocateSlow would first look for the recycled tag, but this block's
    // was checked when it was recycled and cleared when it was taken out: straight to the
    // bitmap, with the entry read again under the guard (meshing may have moved the span).
    if (mini->owner.load(std::memory_order_relaxed) != heap) {
      OperationGuard guard;
      if (freeIntoUnheldSpan(address, Arena::entryFor(address))) return;
    }
  }
  deallocateSlow(reinterpret_cast<void*>(address));
}

void flushRecycledBlocks(ThreadHeap* heap) {
  if (!heap) return;
  uintptr_t block;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    while (heap->vector(c).takeOldestRecycled(&block)) applyRecycledFree(heap, block);
  }
}

void flushRecycledBlocks() {
  flushRecycledBlocks(tlsThreadHeap);
}

void flushThreadCache(ThreadHeap* heap) {
  if (!heap) return;
  flushRecycledBlocks(heap);
  heap->detachAll();
}

void flushThreadCache() {
  flushThreadCache(tlsThreadHeap);
}

size_t releaseFreeMemory() {
  if (!ensureInitialized()) return 0;
  flushRecycledBlocks();
  return Arena::purge(true);
}

}  // namespace meshalloc::heap
