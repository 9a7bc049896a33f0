#include "heap/heap.h"

#include <errno.h>
#include <pthread.h>
#include <string.h>

#include <atomic>

#include "heap/config.h"
#include "heap/errors.h"
#include "heap/fork.h"
#include "heap/global_heap.h"
#include "heap/operation_guard.h"
#include "platform/os.h"

extern "C" {
// glibc's own allocator, still exported under this name: a pointer that glibc handed out
// before we were in place reports its size through it (heap/free.cc frees it).
size_t __libc_malloc_usable_size(void* pointer) __attribute__((weak));
}

namespace meshalloc::heap {

namespace {

enum InitState : int { kUninitialized = 0, kInitializing = 1, kReady = 2, kFailed = 3 };
std::atomic<int> gInitState{kUninitialized};
pthread_key_t gThreadExitKey;

void (*gRefillHook)() = nullptr;
// Meshing's and the handle layer's.
constexpr unsigned kMaxThreadExitHooks = 4;
std::atomic<void (*)()> gThreadExitHooks[kMaxThreadExitHooks] = {};

void onThreadExit(void* value) {
  ThreadHeap* heap = static_cast<ThreadHeap*>(value);
  // A thread cancelled in a parked wait never unparked: a reclaim may be under way.
  if (tlsParkedHeap == heap) ThreadHeap::resumeParked();
  if (tlsThreadHeap == heap) {
    flushRecycledBlocks();
    setThreadHeap(nullptr);
  }
  heap->retire();
  for (auto& hook : gThreadExitHooks) {
    if (void (*call)() = hook.load(std::memory_order_acquire)) call();
  }
}

// The fork protocol is the list of participants in heap/fork.h.
void prepareFork() {
  forkParticipants().prepare();
}

void parentAfterFork() {
  forkParticipants().parent();
}

void childAfterFork() {
  // The child has only the forking thread. Other threads' heaps stay attached to their spans
  // (their slots are simply never reused in the child): touching them could race with a
  // half-finished fast-path operation captured by the fork.
  forkParticipants().child();
}

bool initializeOnce() {
  os::initPlatform();
  loadConfigFromEnvironment();
  SizeClasses::init(os::pageSize());
  setCacheTags(os::entropy64());
  if (!Arena::init()) return false;
  OperationGuard::init();
  if (pthread_key_create(&gThreadExitKey, onThreadExit) != 0) return false;
  registerHeapForkParticipants();
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
  setThreadHeap(heap);
  pthread_setspecific(gThreadExitKey, heap);
  return heap;
}

size_t usableSizeOf(const Span* record) {
  return record->isLarge() ? record->largeBytes(Arena::pageSize()) : record->objectSize;
}

void* failNoMemory() {
  errno = ENOMEM;
  return nullptr;
}

}  // namespace

ThreadHeap* currentThreadHeap() {
  return threadHeap();
}
void setRefillHook(void (*hook)()) {
  gRefillHook = hook;
}
bool addThreadExitHook(void (*hook)()) {
  for (auto& slot : gThreadExitHooks) {
    void (*expected)() = nullptr;
    if (slot.load(std::memory_order_relaxed) == hook ||
        slot.compare_exchange_strong(expected, hook, std::memory_order_acq_rel))
      return true;
  }
  return false;
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
  if (!v.recycled.empty()) return v.popRecycled();
  // A floor set over an empty ring (ShuffleVector::setRecycledFirst) sent us here: the vector's
  // slots, if it has any, are next.
  v.slots.setPopFloor(0);
  if (!heap->refill(sizeClass)) return failNoMemory();
  void* block = v.slots.pop();
  if (gRefillHook) gRefillHook();
  return block;
}

void* allocateRecycled(ShuffleVector& v) {
  return v.popRecycled();
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
    Span* record = PageEntry::span(Arena::entryFor(reinterpret_cast<uintptr_t>(block)));
    if (record->owner.load(std::memory_order_relaxed) == tlsThreadHeap ||
        setAsideCount == kMaxRecycled) {
      GlobalHeap::pin(record);
      break;
    }
    setAside[setAsideCount++] = block;
  }
  for (unsigned i = 0; i < setAsideCount; i++) deallocate(setAside[i]);
  return block;
}

void pinSpansUnder(const void* start, size_t bytes) {
  if (!start || bytes == 0) return;
  uintptr_t first = reinterpret_cast<uintptr_t>(start);
  uintptr_t last = first + bytes - 1 < first ? UINTPTR_MAX : first + bytes - 1;
  // Under the guard: a mesh batch rewriting the page map cannot retire the span meanwhile.
  OperationGuard guard;
  for (uintptr_t page = first & ~(Arena::pageSize() - 1);; page += Arena::pageSize()) {
    uint64_t entry = Arena::entryFor(page < first ? first : page);
    if (PageEntry::isSpan(entry)) {
      Span* span = PageEntry::span(entry);
      if (!span->isLarge()) GlobalHeap::pin(span);
    }
    if (last - page < Arena::pageSize()) break;
  }
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
    Span* record = resolve(pointer, entry, "realloc", &slot);
    if (size > kMaxRequest) return failNoMemory();
    glibcOwned = record == nullptr;
    if (glibcOwned) {
      oldSize = __libc_malloc_usable_size ? __libc_malloc_usable_size(pointer) : 0;
    } else {
      oldSize = usableSizeOf(record);
      if (!record->isLarge()) {
        // Stay put while the new size still maps to this object's class (shrinking by more
        // than that moves, so the memory is not held by a much larger slot).
        if (size <= oldSize &&
            (size > kMaxSmallSize || SizeClasses::classOf(size) == record->sizeClass)) {
          return pointer;
        }
      } else if (size > kMaxSmallSize && size > oldSize / 2) {
        if (GlobalHeap::resizeLargeInPlace(record, size)) return pointer;
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
    freeToLibc(pointer);
  else
    deallocate(pointer);
  return moved;
}

size_t usableSizeSlow(const void* pointer) {
  if (!pointer) return 0;
  // Resolves the span record, so the entry is read again under the guard.
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  OperationGuard guard;
  uint64_t entry = Arena::entryFor(address);
  int64_t slot;
  Span* record = resolve(pointer, entry, "malloc_usable_size", &slot);
  if (!record)
    return __libc_malloc_usable_size ? __libc_malloc_usable_size(const_cast<void*>(pointer)) : 0;
  return usableSizeOf(record);
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
