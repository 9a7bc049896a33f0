// The free path: every decision about where a freed block goes, top-down from where the inline
// fast path (heap::deallocate, heap/free.h) declines. The steps are named by where the block
// goes:
//   freeToVector       the thread's shuffle vector of the class (a slot of a span it holds);
//   freeToRecycled     the thread's recycled ring (ShuffleVector::pushRecycled), for a block of
//                      a span it does not hold; applied to its span later (freeRecycledToSpan);
//   freeToRemoteStack  the span's remote-free stack (a span attached to another thread), or,
//                      the stack being closed (detached span), freeToBitmap;
//   freeToBitmap       the span's bitmap (GlobalHeap, which files the span under its lists'
//                      locks);
//   freeLarge          a large block's pages back to the arena (GlobalHeap);
//   freeToLibc         glibc, for a pointer in its brk heap (allocated before we were in place).
//
// The cases, in the order a free meets them:
//  1. deallocate (inline): a valid small block of a span in this thread's span table ->
//     freeToVector (at Randomization::kOnRefillAndFree, deallocateShuffled). Double free: a
//     block with a cache tag (heap/cache_tag.h) is declined.
//  2. deallocateOther, for a valid small block the fast path did not take:
//     a. its span is attached here but the push declined: a tagged block -> deallocateSlow;
//        else a full vector first spills its oldest half to the spans' bitmaps
//        (ThreadHeap::spill; double free: a bit found clear), then freeToVector's push (at
//        Randomization::kOnRefillAndFree, every local free: pushRandomly);
//     b. its span-table cell is shared by several spans -> the full page-map entry's span record,
//        freeToVectorIfHeld, else deallocateSlow;
//     c. its span is not attached here -> checkTaggedFree if tagged (double free: the block is
//        in some thread's ring or vector), then freeToRecycled (an untagged block with room in
//        the ring never reaches deallocateOther: deallocateRecycled pushes it); the ring's oldest
//        block, when due, goes through freeRecycledToSpan (freeToVectorIfHeld, else, for a span
//        this thread does not hold, freeToRemoteStack under a guard, else deallocateSlow).
//  3. deallocateSlow: nullptr does nothing. A tagged small block -> checkTaggedFree (before the
//     guard). Then under an OperationGuard, with the page-map entry read again:
//     a. a small block of a span this thread does not hold -> freeToRemoteStack. Double free:
//        the block is already on top of the stack; or, through the bitmap, its bit is clear
//        (freeToBitmap); a block pushed twice deeper down is caught when the owner drains it
//        (ThreadHeap::drainRemoteFrees, thread_heap.cc, which refills share);
//     b. otherwise resolve: not our pointer and not glibc's -> invalid pointer; inside a large
//        block or between slots -> interior pointer; in our arena but in no live span -> stale
//        pointer (a double free of a span already destroyed) — each reported, fatal;
//        glibc's -> freeToLibc;
//     c. a large block -> freeLarge. Double free: its live count was not 1;
//     d. a small block of a span this thread holds -> freeToHeldSpan: drains the span's
//        remote-free stack (drainRemoteFrees' double-free checks), then double free if the
//        block sits in the vector or its bit is clear; then freeToVector's push, or
//        freeToBitmap (tagged as released) when the vector is full;
//     e. a small block of a span another thread took meanwhile -> freeToRemoteStack.
// Double-free reports are made by reportHeapError (fatal), in checkTaggedFree,
// freeToRemoteStack, freeToHeldSpan, GlobalHeap::freeToBitmap, GlobalHeap::freeLarge and
// ThreadHeap::drainRemoteFrees; misuse reports by resolve.
#include "heap/free.h"

#include <atomic>

#include "heap/errors.h"
#include "heap/global_heap.h"
#include "heap/operation_guard.h"
#include "platform/os.h"

extern "C" {
// glibc's own allocator, still exported under this name: a pointer that glibc handed out
// before we were in place must be given back to glibc.
void __libc_free(void* pointer);
}

namespace meshalloc::heap {

namespace {

bool freeToRemoteStackIfUnheld(uintptr_t address, uint64_t entry);
void freeToRemoteStack(Span* record, unsigned sizeClass, size_t slot, uintptr_t address);
void freeToHeldSpan(ThreadHeap* heap, void* pointer, Span* record, int64_t slot);
bool vectorHoldsFreeBlock(ThreadHeap* owner, unsigned sizeClass, uintptr_t block);

// The slot `address` starts in a small-object span, from its page-map entry alone (no span record
// field is read); -1 if the entry is not a small span's or `address` is not a slot's start.
inline int64_t smallSlotOf(uintptr_t address, uint64_t entry) {
  if (!PageEntry::isSpan(entry)) return -1;
  unsigned sizeClass = PageEntry::sizeClass(entry);
  if (sizeClass >= kNumSizeClasses) return -1;
  return SizeClasses::slotOf(sizeClass, address - Arena::spanStartOf(address, entry));
}

// Both lines of `block`'s span record (0: none): a free reads the second, and the first free into
// a full span (or the last out of any) moves it between its size class's lists through the
// first.
inline void prefetchRecycledSpan(uintptr_t block) {
  if (!block) return;
  uint64_t entry = Arena::entryFor(block);
  if (!PageEntry::isSpan(entry)) return;
  Span* record = PageEntry::span(entry);
  __builtin_prefetch(record, 1);
  __builtin_prefetch(reinterpret_cast<const char*>(record) + kCacheLine, 1);
}

}  // namespace

// Case 2.
void deallocateOther(uintptr_t address, ShuffleVector& v, uintptr_t spanStart, ThreadHeap* heap) {
  int span = v.attached.indexAt(spanStart);
  if (span >= 0) {
    // Case 2a: a tagged block may be free already (the slow path looks). Else the vector is full,
    // or (Randomization::kOnRefillAndFree, whose inline push limit is 0) the block is to be
    // shuffled in.
    if (isCacheTagged(address)) return deallocateSlow(reinterpret_cast<void*>(address));
    if (v.slots.full()) heap->spill(v);
    if (heap->randomization() == Randomization::kOnRefillAndFree) {
      v.slots.pushRandomly(address, heap->rng());
    } else {
      v.slots.push(address);
    }
    return;
  }
  if (__builtin_expect(span == AttachedSpans::kMaybeAttached, 0)) {
    uint64_t entry = Arena::entryFor(address);
    if (!PageEntry::isSpan(entry) ||
        !freeToVectorIfHeld(heap, v, PageEntry::span(entry), spanStart, address)) {
      deallocateSlow(reinterpret_cast<void*>(address));
    }
    return;
  }
  if (__builtin_expect(isCacheTagged(address), 0)) checkTaggedFree(heap->sizeClassOf(v), address);
  // freeToRecycled. The block's full entry now, and the span record of a block
  // kRecycledPrefetchDistance applications ahead (its entry fetched long since), so that
  // applying it later misses on neither. (Only here: a prefetch on every free cost larson about
  // 5 %, its spans' lines bouncing between threads.)
  __builtin_prefetch(Arena::entryAddressFor(address));
  uintptr_t due = v.pushRecycled(address);
  if (due) {
    prefetchRecycledSpan(v.recycled.afterOldest(kRecycledPrefetchDistance));
    freeRecycledToSpan(heap, due);
  }
}

// Case 2c's common case, without deallocateOther's frame.
void deallocateRecycled(uintptr_t address, ShuffleVector& v, uintptr_t spanStart, ThreadHeap* heap,
                        unsigned cell) {
  if (__builtin_expect(
          cell != AttachedSpans::kSeveralSpans && !isCacheTagged(address) && v.recycled.hasRoom(),
          1)) {
    // The block's full page-map entry, for when it is applied to its span (deallocateOther):
    // only where malloc serves the ring last, which leaves it to fill up (a thread alone
    // reuses its recycled blocks first, and the prefetch cost old-free 14 instructions a step).
    // The floor is read once, for the test and for the push.
    uint32_t floor = v.recycled.floor();
    if (floor != RecycledRing::kFirstFloor) __builtin_prefetch(Arena::entryAddressFor(address));
    v.pushRecycledWithRoom(address, floor);
    return;
  }
  deallocateOther(address, v, spanStart, heap);
}

// Case 1 at Randomization::kOnRefillAndFree.
void deallocateShuffled(uintptr_t address, ShuffleVector& v, uintptr_t spanStart,
                        ThreadHeap* heap) {
  if (__builtin_expect(!isCacheTagged(address) && !v.slots.full(), 1)) {
    v.slots.pushRandomly(address, heap->rng());
    return;
  }
  deallocateOther(address, v, spanStart, heap);
}

// Case 3.
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
  if (__builtin_expect(freeToRemoteStackIfUnheld(address, entry), 1)) return;
  int64_t slot;
  Span* record = resolve(pointer, entry, "free", &slot);
  if (!record) {
    freeToLibc(pointer);
    return;
  }
  if (record->isLarge()) {
    GlobalHeap::freeLarge(record, address);
    return;
  }
  ThreadHeap* heap = tlsThreadHeap;
  if (heap && record->owner.load(std::memory_order_relaxed) == heap) {
    freeToHeldSpan(heap, pointer, record, slot);
    return;
  }
  freeToRemoteStack(record, record->sizeClass, static_cast<size_t>(slot), address);
}

namespace {

// Case 3a. Under a guard: frees `address` onto its span's remote-free stack (or through its
// bitmap) if it is a valid small block in a span the calling thread does not hold (the
// page-map entry gives the class, so the slot check needs no span record field); false leaves it
// to the caller.
bool freeToRemoteStackIfUnheld(uintptr_t address, uint64_t entry) {
  int64_t slot = smallSlotOf(address, entry);
  if (slot < 0) return false;
  Span* record = PageEntry::span(entry);
  ThreadHeap* heap = tlsThreadHeap;
  if (heap != nullptr && record->owner.load(std::memory_order_relaxed) == heap) return false;
  freeToRemoteStack(record, PageEntry::sizeClass(entry), static_cast<size_t>(slot), address);
  return true;
}

// Slot `slot` of a span that is not attached to the calling thread: onto the span's remote-free
// stack while it is attached to another thread, else (the stack is closed) through the bitmap.
// `sizeClass` is the span's (from the page-map entry: reading it from the span record would cost
// a second cache miss).
void freeToRemoteStack(Span* record, unsigned sizeClass, size_t slot, uintptr_t address) {
  switch (record->pushRemoteFree(address)) {
    case Span::RemotePush::kPushed:
      return;
    case Span::RemotePush::kAlreadyOnTop:
      reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(address));
    case Span::RemotePush::kClosed:
      GlobalHeap::freeToBitmap(record, sizeClass, slot, address);
      return;
  }
}

// Case 3d: slot `slot` of `record`, a span attached to `heap`'s (the calling) thread.
void freeToHeldSpan(ThreadHeap* heap, void* pointer, Span* record, int64_t slot) {
  ShuffleVector& v = heap->vector(record->sizeClass);
  heap->drainRemoteFrees(v, record->attachIndex, Span::kRemoteFreesEmpty);
  // The vector holds the span's own addresses; `pointer` may be a meshed alias of the slot
  // (a span meshed before this thread attached it).
  uintptr_t canonical = record->spanStart + static_cast<uintptr_t>(slot) * record->objectSize;
  if ((isCacheTagged(canonical) && v.slots.holds(canonical)) ||
      !record->bitmap().isSet(static_cast<size_t>(slot))) {
    reportHeapError(HeapError::kDoubleFree, "free", pointer);
  }
  if (!v.slots.full()) {
    if (heap->randomization() == Randomization::kOnRefillAndFree) {
      v.slots.pushRandomly(canonical, heap->rng());
    } else {
      v.slots.push(canonical);
    }
    return;
  }
  // The span stays attached and reclaims the slot from its bitmap on the next refill; the tag
  // lets the local fast path notice a second free meanwhile.
  setCacheTag(canonical, releasedTag());
  GlobalHeap::freeToBitmap(record, record->sizeClass, static_cast<size_t>(slot),
                           reinterpret_cast<uintptr_t>(pointer));
}

}  // namespace

// Case 3b.
Span* resolve(const void* pointer, uint64_t entry, const char* operation, int64_t* slot) {
  uintptr_t address = reinterpret_cast<uintptr_t>(pointer);
  if (!PageEntry::isSpan(entry)) {
    if (Arena::contains(address)) {
      uint64_t below = Arena::entryAtOrBelow(address);
      if (PageEntry::isSpan(below)) {
        Span* owner = PageEntry::span(below);
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
  Span* record = PageEntry::span(entry);
  if (record->isLarge()) {
    if (address != record->largeStart()) {
      reportHeapError(HeapError::kInteriorPointer, operation, pointer,
                      reinterpret_cast<void*>(record->largeStart()));
    }
    *slot = 0;
    return record;
  }
  uintptr_t spanStart = Arena::spanStartOf(address, entry);
  *slot = record->slotOf(address - spanStart);
  if (*slot < 0) {
    uintptr_t objectStart =
        spanStart + (address - spanStart) / record->objectSize * record->objectSize;
    reportHeapError(HeapError::kInteriorPointer, operation, pointer,
                    reinterpret_cast<void*>(objectStart));
  }
  return record;
}

void freeToLibc(void* pointer) {
  __libc_free(pointer);
}

// The double-free check by tag (cases 2c and 3).
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
      Span* record = PageEntry::span(entry);
      ThreadHeap* owner = record->owner.load(std::memory_order_acquire);
      if (tag == vectorTag()) {
        freed = owner && (owner == tlsThreadHeap ? owner->vector(sizeClass).slots.holds(address)
                                                 : vectorHoldsFreeBlock(owner, sizeClass, address));
      } else {
        freed = owner && !record->bitmap().isSet(static_cast<size_t>(slot));
      }
    }
  }
  if (freed) reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(address));
}

namespace {

// Best effort, from another thread, for a block that carries the vector tag: true if `block`
// sits free in `owner`'s vector of `sizeClass`, i.e. freeing it again would be a double free.
// May miss while the owner is refilling; never claims a block the owner has handed out (the
// owner clears the tag before it does).
bool vectorHoldsFreeBlock(ThreadHeap* owner, unsigned sizeClass, uintptr_t block) {
#if defined(__SANITIZE_THREAD__)
  (void)owner;
  (void)sizeClass;
  (void)block;
  return false;  // a deliberate racy peek: ThreadSanitizer would flag it
#else
  // An entry the owner popped meanwhile names a block whose tag it cleared before handing it
  // out: the tag, read after the scan, must still say so.
  return owner->vector(sizeClass).slots.holds(block) && cacheTagOf(block) == vectorTag();
#endif
}

}  // namespace

// Case 2c's later half.
void freeRecycledToSpan(ThreadHeap* heap, uintptr_t address) {
  uint64_t entry = Arena::entryFor(address);
  if (int64_t slot = smallSlotOf(address, entry); __builtin_expect(slot >= 0, 1)) {
    unsigned sizeClass = PageEntry::sizeClass(entry);
    Span* record = PageEntry::span(entry);
    if (freeToVectorIfHeld(heap, heap->vector(sizeClass), record,
                           Arena::spanStartOf(address, entry), address))
      return;
    // Most recycled blocks lie in spans no thread holds (Redis's evictions, larson's blocks from
    // other threads). deallocateSlow would first look for the recycled tag, but this block's
    // was checked when it was recycled and cleared when it was taken out: straight to the
    // remote stack or bitmap, with the entry read again under the guard (meshing may have moved
    // the span).
    if (record->owner.load(std::memory_order_relaxed) != heap) {
      OperationGuard guard;
      if (freeToRemoteStackIfUnheld(address, Arena::entryFor(address))) return;
    }
  }
  deallocateSlow(reinterpret_cast<void*>(address));
}

void flushRecycledBlocks(ThreadHeap* heap) {
  if (!heap) return;
  uintptr_t block;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    while (heap->vector(c).takeOldestRecycled(&block)) freeRecycledToSpan(heap, block);
  }
}

void flushRecycledBlocks() {
  flushRecycledBlocks(tlsThreadHeap);
}

}  // namespace meshalloc::heap
