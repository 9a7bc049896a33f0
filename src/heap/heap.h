// The heap's front door: allocation and deallocation with their inline fast paths, used by the
// exported entry points in api/. Sizes are already validated by the caller unless noted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/arena.h"
#include "heap/errors.h"
#include "heap/global_heap.h"
#include "heap/mini_heap.h"
#include "heap/size_class.h"
#include "heap/thread_heap.h"

namespace meshalloc::heap {

// Requests larger than this fail with ENOMEM, as glibc's do (objects must fit ptrdiff_t).
constexpr size_t kMaxRequest = PTRDIFF_MAX;

bool ensureInitialized();
// The calling thread's heap, created on first use; nullptr only if memory is exhausted.
ThreadHeap* currentThreadHeap();

// Layers above the heap (meshing) hook into fork here: `prepareFirst` runs before any heap
// lock is taken, `prepare` after all are, `parent`/`child` before they are released or reset.
struct ForkHooks {
  void (*prepareFirst)();
  void (*prepare)();
  void (*parent)();
  void (*child)();
};
void setForkHooks(const ForkHooks& hooks);
// Called (with no lock held) after a refill had to go to the global heap: the heap grew or
// churned, a moment for the meshing policy to look at it.
void setRefillHook(void (*hook)());
// Called (with no lock held) after an exiting thread handed its spans back to the global heap.
void setThreadExitHook(void (*hook)());
void* allocateSlow(size_t size);
void deallocateSlow(void* pointer);

inline void* allocate(size_t size) {
  if (__builtin_expect(size <= kMaxSmallSize, 1)) {
    ThreadHeap* heap = tlsThreadHeap;
    if (__builtin_expect(heap != nullptr, 1)) {
      ShuffleVector& v = heap->vector(SizeClasses::classOf(size));
      if (__builtin_expect(v.length != 0, 1)) return v.pop();
      // Recycled blocks only once the vector is empty, in place of a refill: served first, they
      // kept a thread that frees other threads' blocks (larson) on them, so its frees stayed
      // on the recycling path instead of becoming local pushes into its own spans.
      if (v.recycledCount != 0) return v.popRecycled();
    }
  }
  return allocateSlow(size);
}

// The slot `address` starts in a small-object span, from its page-map entry alone (no MiniHeap
// field is read); -1 if the entry is not a small span's or `address` is not a slot's start.
inline int64_t smallSlotOf(uintptr_t address, uint64_t entry) {
  if (!PageEntry::isMiniHeap(entry)) return -1;
  unsigned sizeClass = PageEntry::sizeClass(entry);
  if (sizeClass >= kNumSizeClasses) return -1;
  return SizeClasses::slotOf(sizeClass, address - Arena::spanStartOf(address, entry));
}

// Pushes the free of `address`, a slot of a span attached to `heap`'s thread, onto `v`, that
// thread's vector of its class, if the free is plainly valid; false sends it to the slow path.
// Nothing but the block and the vector is read: the span's MiniHeap (a cache miss in a large
// heap) is not.
__attribute__((always_inline)) inline bool pushHeldFree(ThreadHeap* heap, ShuffleVector& v,
                                                        uintptr_t address) {
  // A block with a cache tag may be free already: in this vector, in some thread's recycled
  // blocks, on the span's remote-free stack or in its bitmap (heap/cache_tag.h); the slow path
  // looks. A full vector (its spans can have more slots out than it holds) sends the slot back
  // through the bitmap instead; the span stays attached and reclaims it on refill.
  if (__builtin_expect(isCacheTagged(address) || v.length >= v.capacity, 0)) return false;
  if (heap->randomization() == Randomization::kOnRefillAndFree) {
    v.pushRandomly(address, heap->rng());
  } else {
    v.push(address);
  }
  return true;
}

// pushHeldFree for a free whose span is known only by its MiniHeap `mini` (from the full
// page-map entry), if `heap`'s thread holds that span at `spanStart`. This path takes no guard,
// so it trusts the entry only if the span really is one this thread holds at that address (a
// MiniHeap retired by meshing may have been reused; a free through a meshed alias resolves to
// another start and takes the slow path).
__attribute__((always_inline)) inline bool pushLocalFree(ThreadHeap* heap, ShuffleVector& v,
                                                         MiniHeap* mini, uintptr_t spanStart,
                                                         uintptr_t address) {
  if (__builtin_expect(mini->owner.load(std::memory_order_relaxed) != heap, 0)) return false;
  unsigned span = mini->attachIndex;
  if (__builtin_expect(v.spanStarts[span] != spanStart, 0)) return false;
  return pushHeldFree(heap, v, address);
}

// Called for a free of a block that carries a cache tag: reports a double free if some thread
// holds it among its recycled blocks or in its vector (else the tag was program data).
void checkTaggedFree(unsigned sizeClass, uintptr_t address);
// A recycled block's free, applied to its span: its page-map entry is read again (meshing may
// have changed it).
void applyRecycledFree(ThreadHeap* heap, uintptr_t address);
// Both lines of `block`'s MiniHeap (0: none): a free reads the second, and the first free into
// a full span (or the last out of any) moves it between its size class's lists through the
// first.
inline void prefetchRecycledSpan(uintptr_t block) {
  if (!block) return;
  uint64_t entry = Arena::entryFor(block);
  if (!PageEntry::isMiniHeap(entry)) return;
  MiniHeap* mini = PageEntry::miniHeap(entry);
  __builtin_prefetch(mini, 1);
  __builtin_prefetch(reinterpret_cast<const char*>(mini) + kCacheLine, 1);
}

// Every free of a valid small block that the local push did not take: span `span` (an
// attachedSpanAt answer) is attached but the push declined, shares a span-table cell, or is
// not attached here (the block is recycled).
void deallocateOther(ThreadHeap* heap, unsigned sizeClass, int span, uintptr_t spanStart,
                     uintptr_t address);

inline void deallocate(void* pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  // The compact entry says the class and the span start; the full one (the MiniHeap) is read
  // only for a span this thread may hold, whose entry is usually in cache.
  uint16_t classEntry = Arena::classEntryFor(address);
  ThreadHeap* heap = tlsThreadHeap;
  if (__builtin_expect(heap != nullptr && PageClassEntry::isSmall(classEntry), 1)) {
    unsigned sizeClass = PageClassEntry::sizeClass(classEntry);
    uintptr_t spanStart = Arena::spanStartOfClassEntry(address, classEntry);
    int64_t slot;
    if (__builtin_expect((slot = SizeClasses::slotOf(sizeClass, address - spanStart)) >= 0, 1)) {
      // A span this thread may hold: free now (its MiniHeap is usually in cache). Frees into
      // other spans are recycled (ShuffleVector), after every other kind of misuse has been
      // checked. A second free of a block some thread caches is caught by the cache tag: here
      // for one in a span this thread does not hold (this thread's own recycled blocks are all
      // such, and other threads' vectors hold only their own spans' blocks), and by
      // pushHeldFree's first check for one in a span attached here. (Read at the top of every
      // free, before the span table, the tag cost larson about 10 %.)
      ShuffleVector& v = heap->vector(sizeClass);
      int span = v.attachedSpanAt(spanStart);
      // Attached spans are never meshed, so the span table's MiniHeap is this address's.
      if (__builtin_expect(span >= 0 && pushHeldFree(heap, v, address), 1)) {
        return;
      }
      // Out of line, and entered by a tail call, like every other way out: the push above then
      // needs no register saved.
      return deallocateOther(heap, sizeClass, span, spanStart, address);
    }
  }
  deallocateSlow(pointer);
}

// allocate(size) from a span that is never meshed, for buffers the kernel may fill from inside
// glibc (stdio's buffers, which glibc's internal read() fills: a wrapper cannot publish them,
// and a write-protected span would make the read fail with EFAULT). The block comes from a span
// this thread holds, which no mesh pass can be working on; pinning affects only its span.
void* allocatePinned(size_t size);

// Applies the calling thread's recycled blocks to their spans (before its slots are counted
// or handed back).
void flushRecycledBlocks();
// The same for `heap`, whose thread is the caller or blocked with it parked (the idle reclaimer).
void flushRecycledBlocks(ThreadHeap* heap);

// A block of at least `size` bytes aligned to `alignment` (a power of two); nullptr + ENOMEM.
void* allocateAligned(size_t size, size_t alignment);
// calloc's core: `size` zeroed bytes, skipping the memset for pages fresh from the OS.
void* allocateZeroed(size_t size);
void* reallocate(void* pointer, size_t size);
// Everything but a valid small block: large blocks, nullptr, misuse, glibc's blocks.
size_t usableSizeSlow(const void* pointer);
// Usable bytes of a live block (0 for nullptr); reports misuse like free does. Inline because
// programs that count their memory (Redis) call it after every malloc and before every free.
inline size_t usableSize(const void* pointer) {
  // Small objects: the compact entry alone says the class and the span start, and the slot
  // check needs only the class's plan. Meshing never changes an address's class, so no guard
  // is needed either.
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint16_t classEntry = Arena::classEntryFor(address);
  if (__builtin_expect(PageClassEntry::isSmall(classEntry), 1)) {
    unsigned sizeClass = PageClassEntry::sizeClass(classEntry);
    uintptr_t delta = address - Arena::spanStartOfClassEntry(address, classEntry);
    if (__builtin_expect(SizeClasses::slotOf(sizeClass, delta) >= 0, 1))
      return kSizeClassSizes[sizeClass];
  }
  return usableSizeSlow(pointer);
}

// Returns the calling thread's attached spans to the global heap.
void flushThreadCache();
// The same for `heap`, whose thread is the caller or blocked with it parked (the idle reclaimer).
void flushThreadCache(ThreadHeap* heap);
// Returns cached empty pages to the OS; returns bytes released.
size_t releaseFreeMemory();

}  // namespace meshalloc::heap
