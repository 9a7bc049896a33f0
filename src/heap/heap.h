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

// Pushes the free of `slot` (of the span at `spanStart`, whose MiniHeap is `mini`) onto `v`, the
// vector of `heap`'s thread, if that thread holds the span and the free is plainly valid; false
// sends it to the slow path. The caller has decoded the page-map entry once, so nothing here
// repeats that work (a free is about a third of Redis's allocator time).
__attribute__((always_inline)) inline bool pushLocalFree(ThreadHeap* heap, ShuffleVector& v,
                                                         MiniHeap* mini, uintptr_t spanStart,
                                                         uint32_t slot, uintptr_t address) {
  // Only the MiniHeap's second cache line is read (owner, attachIndex, remoteFrees, bitmap).
  if (__builtin_expect(mini->owner.load(std::memory_order_relaxed) != heap, 0)) return false;
  unsigned span = mini->attachIndex;
  // This path takes no guard, so it trusts the entry only if the span really is one this thread
  // holds at that address (a MiniHeap retired by meshing may have been reused; a free through a
  // meshed alias resolves to another start and takes the slow path).
  // A full vector (its spans can have more slots out than it holds) sends the slot back through
  // the bitmap instead; the span stays attached and reclaims it on refill. The bitmap bit is
  // clear if another thread already freed this slot (a double free); if other threads' frees
  // wait on the span's stack, the slow path drains them first so that check sees them
  // (remoteFrees shares the bitmap's cache line: no extra miss). A block with the recycled tag
  // may sit in another thread's recycled blocks (its bit still set): the slow path looks.
  if (__builtin_expect(
          v.spanStarts[span] != spanStart || v.contains(span, slot) || v.length >= v.capacity ||
              mini->remoteFrees.load(std::memory_order_relaxed) != MiniHeap::kRemoteFreesEmpty ||
              !mini->bitmap().isSet(slot) || ShuffleVector::isTaggedRecycled(address),
          0)) {
    return false;
  }
  if (heap->randomization() == Randomization::kOnRefillAndFree) {
    v.pushRandomly(span, slot, heap->rng());
  } else {
    v.push(span, slot);
  }
  return true;
}

// Called for a free of a block that carries the recycled tag: reports a double free if some
// thread holds it among its recycled blocks (else the tag was stale or program data).
void checkRecycledFree(unsigned sizeClass, uintptr_t address);
// A recycled block's free, applied to its span: its page-map entry is read again (meshing may
// have changed it).
void applyRecycledFree(ThreadHeap* heap, uintptr_t address);

inline void deallocate(void* pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint64_t entry = Arena::entryFor(address);
  ThreadHeap* heap = tlsThreadHeap;
  if (__builtin_expect(heap != nullptr && PageEntry::isMiniHeap(entry), 1)) {
    unsigned sizeClass = PageEntry::sizeClass(entry);
    uintptr_t spanStart = Arena::spanStartOf(address, entry);
    int64_t slot;
    if (__builtin_expect(sizeClass < kNumSizeClasses &&
                             (slot = SizeClasses::slotOf(sizeClass, address - spanStart)) >= 0,
                         1)) {
      // A span this thread may hold: free now (its MiniHeap is usually in cache). Frees into
      // other spans are recycled (ShuffleVector), after every other kind of misuse has been
      // checked. A second free of a recycled block is caught by the tag: here for one in a span
      // this thread does not hold (this thread's own recycled blocks are all such), and by
      // pushLocalFree's last check for one another thread recycled from a span since attached
      // here. (Read at the top of every free, before the filter, the tag cost larson about 10 %.)
      ShuffleVector& v = heap->vector(sizeClass);
      MiniHeap* mini = PageEntry::miniHeap(entry);
      if (__builtin_expect(v.mayHoldSpanAt(spanStart), 1)) {
        if (__builtin_expect(
                !pushLocalFree(heap, v, mini, spanStart, static_cast<uint32_t>(slot), address),
                0)) {
          deallocateSlow(pointer);
        }
        return;
      }
      if (__builtin_expect(ShuffleVector::isTaggedRecycled(address), 0))
        checkRecycledFree(sizeClass, address);
      // Both lines, for when this block is applied: a free reads the second, and the first
      // free into a full span (or the last out of any) moves it between its size class's lists
      // through the first. (Only here: a prefetch on every free cost larson about 5 %, its
      // spans' lines bouncing between threads.)
      __builtin_prefetch(mini, 1);
      __builtin_prefetch(reinterpret_cast<const char*>(mini) + kCacheLine, 1);
      uintptr_t due = v.pushRecycled(address);
      if (due) applyRecycledFree(heap, due);
      return;
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
  // Small objects: the page-map entry alone says the class, and the slot check needs only the
  // class's plan. Meshing never changes an address's class, so no guard is needed either.
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  uint64_t entry = Arena::entryFor(address);
  if (__builtin_expect(smallSlotOf(address, entry) >= 0, 1))
    return kSizeClassSizes[PageEntry::sizeClass(entry)];
  return usableSizeSlow(pointer);
}

// Returns the calling thread's attached spans to the global heap.
void flushThreadCache();
// Returns cached empty pages to the OS; returns bytes released.
size_t releaseFreeMemory();

}  // namespace meshalloc::heap
