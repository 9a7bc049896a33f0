// The free path's inline part: `deallocate`, which the exported free (api/exports.cc) calls,
// and the pushes it and the recycled ring share. Everything else of the decision (where a
// block the fast path declines goes, the misuse reports and the double-free checks) is in
// heap/free.cc, whose header comment lists every case. The steps are named by where the block
// goes: freeToVector, freeToRecycled (ShuffleVector::pushRecycled), freeToRemoteStack,
// freeToBitmap (GlobalHeap), freeLarge (GlobalHeap), freeToLibc.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/arena.h"
#include "heap/cache_tag.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "heap/thread_heap.h"

namespace meshalloc::heap {

// Every free the fast path below does not finish: nullptr, large blocks, misuse, glibc's
// blocks, threads without a heap (heap/free.cc).
void deallocateSlow(void* pointer);
// Every free of a valid small block that freeToVector did not take: its span (starting at
// `spanStart`) is attached but the push declined, shares a span-table cell, or is not attached
// here (the block goes to the recycled ring). `v` is heap's vector of the block's class; the class
// and the span-table cell are derived again here, so that the inline free keeps no copy of either
// for its tail calls (one instruction on every free).
void deallocateOther(uintptr_t address, ShuffleVector& v, uintptr_t spanStart, ThreadHeap* heap);

// A free of a valid small block whose span-table cell does not name its span: onto the recycled
// ring of `v` (heap's vector of the block's class, whose address the inline free has computed
// already: passing it in place of the class saved 6 instructions, and a sixth argument made the
// inline free save a register) if the cell is not shared, the block carries no cache tag and the
// ring has room (a leaf function, entered by a tail call, so the local push saves no register);
// anything else goes on to deallocateOther. The span start and the cell come third and fourth,
// the argument registers the inline free computed them into (2 instructions on the jump).
void deallocateRecycled(uintptr_t address, ShuffleVector& v, uintptr_t spanStart, ThreadHeap* heap,
                        unsigned cell);

// A local free at Randomization::kOnRefillAndFree (whose inline push limit is 0): swapped
// into the vector at a random place (pushRandomly), with freeToVector's checks; anything else
// goes on to deallocateOther.
void deallocateShuffled(uintptr_t address, ShuffleVector& v, uintptr_t spanStart, ThreadHeap* heap);

// Pushes the free of `address`, a slot of a span attached to the calling thread, onto `v`, its
// vector of the class, if the free is plainly valid; false sends it to the slow path.
// Nothing but the block and the vector is read: the span's record (a cache miss in a large
// heap) is not.
__attribute__((always_inline)) inline bool freeToVector(ShuffleVector& v, uintptr_t address) {
  // A block with a cache tag may be free already: in this vector, in some thread's recycled
  // blocks, on the span's remote-free stack or in its bitmap (heap/cache_tag.h); the slow path
  // looks. A full vector (its spans can have more slots out than it holds) sends the slot back
  // through the bitmap instead; the span stays attached and reclaims it on refill. At
  // Randomization::kOnRefillAndFree the limit is 0: deallocateOther shuffles the block in.
  if (__builtin_expect(isCacheTagged(address) || !v.slots.takesInlinePush(), 0)) return false;
  v.slots.push(address);
  return true;
}

// freeToVector for a free whose span is known only by its span record `record` (from the full
// page-map entry), if `heap`'s thread holds that span at `spanStart`. This path takes no guard,
// so it trusts the entry only if the span really is one this thread holds at that address (a
// span record retired by meshing may have been reused; a free through a meshed alias resolves to
// another start and takes the slow path).
__attribute__((always_inline)) inline bool freeToVectorIfHeld(ThreadHeap* heap, ShuffleVector& v,
                                                              Span* record, uintptr_t spanStart,
                                                              uintptr_t address) {
  if (__builtin_expect(record->owner.load(std::memory_order_relaxed) != heap, 0)) return false;
  unsigned span = record->attachIndex;
  if (__builtin_expect(!v.attached.startsAt(span, spanStart), 0)) return false;
  return freeToVector(v, address);
}

// Inlined into each exported free (1 instruction: the jump to it).
__attribute__((always_inline)) inline void deallocate(void* pointer) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  // The compact entry says the class and the span start; the full one (the span record) is read
  // only for a span this thread may hold, whose entry is usually in cache.
  uintptr_t classMap = Arena::classMapFor(address);
  if (__builtin_expect(classMap != 0, 1)) {
    uint32_t classEntry = Arena::classEntryIn(classMap, address);
    // Hidden from GCC: knowing that the entry has 16 bits, it took the high byte with a shift
    // and a mask (one instruction more).
    asm("" : "+r"(classEntry));
    unsigned classByte = PageClassEntry::classByte(classEntry);
    uintptr_t spanStart = Arena::spanStartOfClassEntry(address, classEntry);
    // Never nullptr: a thread without a heap reads the empty heap, whose unconfigured vectors
    // fail the slot check below, so its frees go to deallocateSlow. So does a page without a
    // small span (class byte 0, ThreadHeap::unconfigured_), so the byte needs no test.
    ThreadHeap* heap = tlsFastPathHeap;
    ShuffleVector& v = vectorOfClassByte(heap, classByte);
    if (__builtin_expect(v.check.isSlotStart(address - spanStart), 1)) {
      // A span this thread may hold: free now (its span record is usually in cache). Frees into
      // other spans are recycled (ShuffleVector), after every other kind of misuse has been
      // checked. A second free of a block some thread caches is caught by the cache tag: here
      // for one in a span this thread does not hold (this thread's own recycled blocks are all
      // such, and other threads' vectors hold only their own spans' blocks), and by
      // freeToVector's first check for one in a span attached here. (Read at the top of every
      // free, before the span table, the tag cost larson about 10 %.)
      // The span table's cell names a span attached here, or an entry that matches no start
      // (AttachedSpans::indexAt without its tests of the cell).
      unsigned cell = v.attached.cellFor(spanStart);
      if (__builtin_expect(v.attached.startsAt(cell, spanStart), 1)) {
        if (__builtin_expect(freeToVector(v, address), 1)) return;
        // Randomization::kOnRefillAndFree: a small function of its own, without
        // deallocateOther's frame.
        if (v.slots.shufflesEveryPush()) return deallocateShuffled(address, v, spanStart, heap);
      } else {
        return deallocateRecycled(address, v, spanStart, heap, cell);
      }
      // Out of line, and entered by a tail call, like every other way out: the push above then
      // needs no register saved.
      return deallocateOther(address, v, spanStart, heap);
    }
  }
  deallocateSlow(pointer);
}

// Called for a free of a block that carries a cache tag: reports a double free if some thread
// holds it among its recycled blocks or in its vector (else the tag was program data).
void checkTaggedFree(unsigned sizeClass, uintptr_t address);
// A recycled block's free, applied to its span (freeToVectorIfHeld, else freeToRemoteStack or
// freeToBitmap): its page-map entry is read again (meshing may have changed it).
void freeRecycledToSpan(ThreadHeap* heap, uintptr_t address);
// Applies the calling thread's recycled blocks to their spans (before its slots are counted
// or handed back).
void flushRecycledBlocks();
// The same for `heap`, whose thread is the caller or blocked with it parked (the idle reclaimer).
void flushRecycledBlocks(ThreadHeap* heap);

// Resolves a pointer the program passed back to us (free, realloc, malloc_usable_size: named by
// `operation` in reports), reporting every kind of misuse: invalid, interior or stale. Returns
// nullptr for a pointer glibc owns; else its span record, with its slot in `*slot` (0 if large).
// Call under an OperationGuard with `entry` read under it.
Span* resolve(const void* pointer, uint64_t entry, const char* operation, int64_t* slot);
// Hands a pointer glibc allocated (before meshalloc was in place) back to glibc.
void freeToLibc(void* pointer);

}  // namespace meshalloc::heap
