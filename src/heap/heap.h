// The heap's front door: allocation with its inline fast path, and deallocation (its inline
// fast path `deallocate` and the rest of the free path are in heap/free.h and heap/free.cc),
// used by the exported entry points in api/. Sizes are already validated by the caller unless
// noted.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/arena.h"
#include "heap/errors.h"
#include "heap/free.h"
#include "heap/global_heap.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "heap/thread_heap.h"

namespace meshalloc::heap {

// Requests larger than this fail with ENOMEM, as glibc's do (objects must fit ptrdiff_t).
constexpr size_t kMaxRequest = PTRDIFF_MAX;

bool ensureInitialized();
// The calling thread's heap, created on first use; nullptr only if memory is exhausted.
ThreadHeap* currentThreadHeap();

// Called (with no lock held) after a refill had to go to the global heap: the heap grew or
// churned, a moment for the meshing policy to look at it.
void setRefillHook(void (*hook)());
// Adds a function called (with no lock held, in the order added) after an exiting thread handed
// its spans back to the global heap. At start-up only; false if the list (a few) is full.
bool addThreadExitHook(void (*hook)());
void* allocateSlow(size_t size);
// v.popRecycled(), out of line: inlined, it cost the vector's pop two instructions.
void* allocateRecycled(ShuffleVector& v);

inline void* allocate(size_t size) {
  if (__builtin_expect(size <= kMaxSmallSize, 1)) {
    // Never nullptr: a thread without a heap reads the empty heap, whose vectors are empty.
    ShuffleVector& v = vectorForSize(tlsFastPathHeap, size);
    if (__builtin_expect(v.slots.canPop(), 1)) return v.slots.pop();
    // The recycled blocks: first for a thread alone (the stack's pop floor), else once the
    // stack is empty, in place of a refill.
    if (!v.recycled.empty()) return allocateRecycled(v);
  }
  return allocateSlow(size);
}

// allocate(size) from a span that is never meshed, for buffers the kernel may fill from inside
// glibc (stdio's buffers, which glibc's internal read() fills: a wrapper cannot publish them,
// and a write-protected span would make the read fail with EFAULT). The block comes from a span
// this thread holds, which no mesh pass can be working on; pinning affects only its span.
void* allocatePinned(size_t size);
// The spans under the program's bytes [start, start + bytes) are never meshed from now on: for
// a buffer the program gives glibc to fill with its internal read() (setvbuf). Anything else
// (the stack, static data, glibc's memory, large objects) is left alone. A mesh pass that holds
// one of those spans already may still mesh it: the caller waits for that pass to end.
void pinSpansUnder(const void* start, size_t bytes);

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
    if (__builtin_expect(SizeClasses::isSlotStart(sizeClass, delta), 1))
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
