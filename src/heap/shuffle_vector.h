// A thread's cache of one size class (ThreadHeap holds one per class), in four parts, each a type
// with its own state:
//   SlotStack      the free slots of the spans attached to the thread: malloc pops, a local free
//                  pushes, with no atomics and no locks;
//   SlotCheck      the class's slot geometry, copied next to the stack so that the inline free
//                  checks a pointer from the cache line it reads anyway;
//   RecycledRing   the thread's latest frees into spans it does not hold, handed out again;
//   AttachedSpans  the attached spans and a table of their starts, by which a free tells whether
//                  its span is attached here without reading the span's record.
// ShuffleVector composes them and keeps the one rule that couples two of them: the stack pops
// only above a floor that the ring sets while its blocks are to be served first.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "heap/cache_tag.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "support/assert.h"
#include "support/rng.h"

namespace meshalloc {

// How many spans of one class a thread may hold attached. Full attached spans cost nothing (no
// free slot sits idle in them), and while a span is attached its owner's frees are local
// pushes; once a thread's live objects of a class outgrow its table, most of its own frees
// become remote frees and its refills swap spans through the global heap's lock. With 8 spans
// that kept larson at 2-3x mimalloc's time. Idle free slots are bounded separately (refill
// hands back spans whose free slots exceed a vector's capacity).
constexpr unsigned kMaxSpansPerVector = 32;
// Blocks freed into spans this thread does not hold are kept for reuse (RecycledRing): at most
// this many per class, and at most kRecycledBytes of them.
constexpr uint32_t kMaxRecycled = 16;
constexpr uint32_t kMinRecycled = 2;
constexpr size_t kRecycledBytes = 32 * 1024;
static_assert((kMaxRecycled & (kMaxRecycled - 1)) == 0);

// The free slots, by address, popped from the end. An entry's low bit says the block carries
// the vector tag (a local free put it here; a refill's slots are left untouched, so that a
// detach need not write to pages the program never used). The owner alone changes it; other
// threads read the length and entries to report a double free or count slots (best effort).
// The stack's top, its pop floor and its push limit are kept as addresses, not counts: malloc's
// pop and the local free's push then use the top directly, without the entries' base (one load
// and 1-2 instructions fewer on each path); the length is derived from the top.
class SlotStack {
 public:
  static constexpr uintptr_t kTaggedEntry = 1;
  static uintptr_t blockOf(uintptr_t entry) { return entry & ~kTaggedEntry; }

  // Before the heap is published, or while it is pooled: single-copy atomic all the same, as
  // other threads' statistics read the top.
  void configure(uintptr_t* entries, uint32_t capacity) {
    entries_ = entries;
    capacity_ = capacity;
    __atomic_store_n(&top_, entries, __ATOMIC_RELAXED);
    setPopFloor(0);
  }
  // Whether the inline local free may push: at Randomization::kOnRefillAndFree every local free
  // must be shuffled in (done out of line), so the limit is nullptr (no top is below it) and the
  // fast path tests one bound instead of also reading the randomisation level.
  void setShufflesEveryPush(bool shuffles) {
    inlinePushLimit_ = shuffles ? nullptr : entries_ + capacity_;
  }
  // Read as its own load (the same instruction for the owner): GCC otherwise kept the limit the
  // inline push compared with in a register for the free's way out, one load more on every free.
  bool shufflesEveryPush() const {
    return __atomic_load_n(&inlinePushLimit_, __ATOMIC_RELAXED) == nullptr;
  }
  bool takesInlinePush() const { return top_ < inlinePushLimit_; }

  uint32_t length() const { return static_cast<uint32_t>(top_ - entries_); }
  uint32_t capacity() const { return capacity_; }
  bool empty() const { return top_ == entries_; }
  bool full() const { return length() >= capacity_; }
  uintptr_t entry(uint32_t i) const { return entries_[i]; }
  // The length as another thread sees it (the top read once, single-copy atomic; the base never
  // changes while the heap is in use).
  uint32_t lengthSeenByPeers() const {
    return static_cast<uint32_t>(__atomic_load_n(&top_, __ATOMIC_RELAXED) - entries_);
  }

  // malloc pops only while the length is above the floor: 0, or RecycledRing::kFirstFloor while
  // the ring holds blocks to serve first. So malloc's one test covers both an empty stack and a
  // ring to serve first (testing the ring's order, then the length, cost it 3 instructions).
  // Another thread may set it when the order changes (ShuffleVector::setRecycledFirst), hence
  // the relaxed atomics (plain loads and stores); a floor left set over an empty ring only sends
  // one malloc to allocateSlow, which clears it. Kept as an address the top must be above: the
  // base for 0, all ones for kFirstFloor (the floor sign-extended and or-ed with the base, no
  // branch: popRecycled stores it on every recycled malloc). All zeros in the empty heap, where
  // the top is 0 too.
  bool canPop() const {
#if defined(__x86_64__)
    // The floor as the compare's memory operand (an aligned 8-byte load, single-copy atomic):
    // GCC never folds an atomic load into another instruction, and loaded it apart (one
    // instruction more on every malloc).
    bool above;
    asm("cmp %2, %1" : "=@cca"(above) : "r"(top_), "m"(popFloor_));
    return above;
#else
    return reinterpret_cast<uintptr_t>(top_) > __atomic_load_n(&popFloor_, __ATOMIC_RELAXED);
#endif
  }
  void setPopFloor(uint32_t floor) {
    uintptr_t above = static_cast<uintptr_t>(static_cast<int64_t>(static_cast<int32_t>(floor)));
    __atomic_store_n(&popFloor_, reinterpret_cast<uintptr_t>(entries_) | above, __ATOMIC_RELAXED);
  }

  // The tag goes with the block: the program's data takes its place.
  void* pop() {
    uintptr_t* top = top_ - 1;
    top_ = top;
    uintptr_t block = blockOf(*top);
    setCacheTag(block, 0);
    return reinterpret_cast<void*>(block);
  }
  // A local free. The tag lets the next free of the block notice that it is already here. The
  // top is read before the tag's store, which might alias it.
  void push(uintptr_t block) {
    uintptr_t* top = top_;
    setCacheTag(block, vectorTag());
    *top = block | kTaggedEntry;
    top_ = top + 1;
  }
  // Pushes, then swaps the new entry with a random one: the stack stays a uniform shuffle.
  void pushRandomly(uintptr_t block, Rng& rng) {
    setCacheTag(block, vectorTag());
    uint32_t length = this->length();
    uint32_t position = rng.below(length + 1);
    entries_[length] = entries_[position];
    entries_[position] = block | kTaggedEntry;
    top_ = entries_ + length + 1;
  }
  // A slot a refill claimed from its span's bitmap.
  void pushClaimed(uintptr_t block) {
    *top_++ = block;
  }

  // Whether `block` is among the free slots: a scan, for the slow paths only (a block that
  // carries the vector tag). Other threads peek too, to report a double free (best effort: the
  // owner's top and entries change under them), so each is read once, single-copy atomic:
  // the same code as plain loads for the owner.
  bool holds(uintptr_t block) const {
    uint32_t count = static_cast<uint32_t>(__atomic_load_n(&top_, __ATOMIC_ACQUIRE) - entries_);
    if (count > capacity_) return false;
    for (uint32_t i = 0; i < count; i++) {
      if (blockOf(__atomic_load_n(&entries_[i], __ATOMIC_RELAXED)) == block) return true;
    }
    return false;
  }

  // The `count` oldest entries (the bottom ones) leave; the rest move down.
  void dropOldest(uint32_t count) {
    MESHALLOC_ASSERT(count <= length());
    memmove(entries_, entries_ + count, (length() - count) * sizeof(uintptr_t));
    top_ -= count;
  }
  void clear() {
    top_ = entries_;
  }

  // The orders a refill leaves the stack in (ThreadHeap::shuffle): entries [first, end)
  // reversed; all of them in uniformly random order; runs of entries reordered, run `order[k]`
  // (entries [runStarts[order[k]], runStarts[order[k] + 1])) going k-th, through `scratch`
  // (room for the whole stack).
  void reverse(uint32_t first, uint32_t end) {
    for (; first + 1 < end; first++, end--) {
      uintptr_t t = entries_[first];
      entries_[first] = entries_[end - 1];
      entries_[end - 1] = t;
    }
  }
  void shuffle(Rng& rng) {
    rng.shuffle(entries_, length());
  }
  void reorderRuns(const uint32_t* runStarts, const unsigned* order, unsigned runs,
                   uintptr_t* scratch) {
    uint32_t length = this->length();
    memcpy(scratch, entries_, length * sizeof(uintptr_t));
    uint32_t out = 0;
    for (unsigned k = 0; k < runs; k++) {
      uint32_t first = runStarts[order[k]];
      uint32_t count = runStarts[order[k] + 1] - first;
      memcpy(entries_ + out, scratch + first, count * sizeof(uintptr_t));
      out += count;
    }
    MESHALLOC_ASSERT(out == length);
  }

 private:
  // The fast paths' fields, first in ShuffleVector's first cache line.
  uintptr_t* top_ = nullptr;  // past the newest entry
  uintptr_t popFloor_ = 0;    // see canPop
  // entries_ + capacity_, or nullptr: see setShufflesEveryPush.
  uintptr_t* inlinePushLimit_ = nullptr;
  uintptr_t* entries_ = nullptr;  // `capacity_` entries
  uint32_t capacity_ = 0;
};

// The class's SpanPlan::slotLimit and slotMultiplier, copied beside the stack so that the inline
// free checks that a pointer is a slot's start from the line it reads anyway (from the class's
// plan it took 4 instructions more: the plan's address). The limit is widened to 64 bits, so
// that the compare takes it as its memory operand (a 32-bit field took a load of its own). All
// zero in an unconfigured vector (the empty heap's): no pointer passes, so such a free goes to
// the slow path.
class SlotCheck {
 public:
  void configure(const SpanPlan& plan) {
    slotLimit_ = plan.slotLimit;
    slotMultiplier_ = plan.slotMultiplier;
  }
  // SizeClasses::isSlotStart for this class.
  bool isSlotStart(uintptr_t delta) const {
    return SpanPlan::isSlotStart(slotLimit_, slotMultiplier_, delta);
  }

 private:
  uint64_t slotLimit_ = 0;
  uint64_t slotMultiplier_ = 0;
};

// Recycled blocks: this thread's latest frees into spans it does not hold, handed out again
// (newest first) before the stack's slots by a thread alone in the process, else once the stack
// is empty, in place of a refill. Such a free would otherwise miss on the span's record, and the
// slot come back only when a refill attaches its span; reused here, the block's memory and
// page-map entry are still in cache. A block stays live in its span's bitmap while it is here
// (statistics count it, meshing copies it). The oldest is applied to its span when the ring is
// full, and all of them whenever the thread's caches are flushed. A refill never attaches the
// span of a block held here: it only happens with the ring empty, so a second free of a held
// block is caught by its tag. Other threads read the blocks to report a double free
// (ThreadHeap::recycledAnywhere): the slots are single-copy atomic, with the same code as plain
// accesses.
class RecycledRing {
 public:
  // The stack's pop floor while the ring's blocks are served first (SlotStack::canPop).
  static constexpr uint32_t kFirstFloor = UINT32_MAX;

  void configure(uint32_t capacity) {
    MESHALLOC_ASSERT(capacity >= 1 && capacity <= kMaxRecycled);
    capacity_ = capacity;
  }
  uint32_t count() const { return count_; }
  uint32_t capacity() const { return capacity_; }
  bool empty() const { return count_ == 0; }
  bool hasRoom() const { return count_ < capacity_; }
  uint32_t countSeenByPeers() const { return __atomic_load_n(&count_, __ATOMIC_RELAXED); }

  // What a push sets the stack's pop floor to: kFirstFloor while this is the process's only
  // thread heap in use (malloc serves the ring first), else 0 (ThreadHeap::create and retire set
  // it, through ShuffleVector::setRecycledFirst). Whether malloc takes a recycled block before
  // the stack's slots: reused first, a block freed into a span this thread does not hold is never
  // applied to its span and no cold slot is taken in its place (old-free: 0.58x the time). Only
  // for a thread alone in the process: where other threads hold spans, a recycled block may
  // share its cache lines with another thread's live blocks, and a thread that frees blocks
  // other threads allocated (larson) kept reusing those instead of moving to its own spans:
  // 1.37x the time. Another thread writes it, hence the relaxed atomics.
  uint32_t floor() const { return __atomic_load_n(&floor_, __ATOMIC_RELAXED); }
  void setFloor(uint32_t floor) { __atomic_store_n(&floor_, floor, __ATOMIC_RELAXED); }
  bool servesLast() const { return floor() != kFirstFloor; }

  bool holds(uintptr_t block) const {
    bool held = false;
    for (uint32_t i = 0; i < kMaxRecycled; i++) held |= at(i) == block;
    return held;
  }
  // Adds `block` to a ring that has room.
  void push(uintptr_t block) {
    setCacheTag(block, recycledTag());
    uint32_t head = head_;  // read once: the atomic store below would make the compiler read again
    setAt(head, block);
    head_ = (head + 1) & (kMaxRecycled - 1);
    count_++;
  }
  // Takes the newest block (the ring is not empty); `*left` is the count after it.
  uintptr_t popNewest(uint32_t* left) {
    uint32_t newest = (head_ - 1) & (kMaxRecycled - 1);
    head_ = newest;
    *left = --count_;
    uintptr_t block = at(newest);
    setAt(newest, 0);
    return untag(block);
  }
  // Takes the oldest block, if any; `*emptied` says whether it was the last.
  bool takeOldest(uintptr_t* block, bool* emptied) {
    if (count_ == 0) return false;
    uint32_t oldest = (head_ - count_) & (kMaxRecycled - 1);
    *emptied = --count_ == 0;
    *block = untag(at(oldest));
    setAt(oldest, 0);
    return true;
  }
  // The block `distance` places after the oldest (the newest if there are fewer), or 0.
  uintptr_t afterOldest(uint32_t distance) const {
    if (count_ == 0) return 0;
    uint32_t ahead = distance < count_ ? distance : count_ - 1;
    return at((head_ - count_ + ahead) & (kMaxRecycled - 1));
  }

 private:
  uintptr_t at(uint32_t i) const { return __atomic_load_n(&blocks_[i], __ATOMIC_RELAXED); }
  void setAt(uint32_t i, uintptr_t block) {
    __atomic_store_n(&blocks_[i], block, __ATOMIC_RELAXED);
  }
  // The block leaves the ring: its tag goes first, while the block is still this thread's.
  static uintptr_t untag(uintptr_t block) {
    setCacheTag(block, 0);
    return block;
  }

  uint32_t count_ = 0;
  uint32_t capacity_ = 0;
  uint32_t floor_ = 0;
  uint32_t head_ = 0;  // next position written; the newest is just before it
  uintptr_t blocks_[kMaxRecycled] = {};
};

// SlotStack::setPopFloor sign-extends the floor: kFirstFloor must become all ones.
static_assert(static_cast<int32_t>(RecycledRing::kFirstFloor) == -1);

// The spans attached to the thread, by index (a span's Span::attachIndex), and a table of their
// starts by hash, so that a free can tell without touching the span's record (which misses in a
// large heap) whether its span is attached here, and which one it is: a cell holds the span's
// index, kNoSpan, or kSeveralSpans where starts collide. The span is attached exactly when
// startsAt(cell, its start). (A bit filter still had to read the span record to confirm; its
// false positives, one in eight frees with a full table, then also went the slow way.) A table
// never rebuilt is all zeros, which names span 0: the start comparison still decides. The
// owner alone changes it; statistics read the records from other threads.
class AttachedSpans {
 public:
  static constexpr unsigned kCells = 256;
  static constexpr uint8_t kSeveralSpans = kMaxSpansPerVector;
  static constexpr uint8_t kNoSpan = kMaxSpansPerVector + 1;
  // indexAt's answers besides an index.
  static constexpr int kNotAttached = -1;
  static constexpr int kMaybeAttached = -2;

  // Fibonacci hashing of the start's low 32 bits (its page number's low 20 with 4 KiB pages):
  // a 32-bit multiply takes its constant inline, where the 64-bit one first loaded it into a
  // register (one instruction per free). Starts 4 GiB apart share a cell, which costs only the
  // shared cell's slower path.
  static unsigned cellOf(uintptr_t spanStart) {
    constexpr uint32_t kFibonacciMultiplier = 0x9E3779B1u;
    constexpr unsigned kCellShift = 32 - __builtin_ctz(kCells);
    return (static_cast<uint32_t>(spanStart) * kFibonacciMultiplier) >> kCellShift;
  }
  // The cell of `spanStart`: an index, kSeveralSpans or kNoSpan.
  uint8_t cellFor(uintptr_t spanStart) const { return cells_[cellOf(spanStart)]; }
  // Whether `index` (an index or a cell's value) names the span that starts at `spanStart`: the
  // two entries past the last index stay 0 (no span starts there), so that the inline free
  // compares the start a cell names without testing the cell first.
  bool startsAt(unsigned index, uintptr_t spanStart) const { return starts_[index] == spanStart; }
  // The index of the attached span that starts at `spanStart`, kNotAttached, or kMaybeAttached
  // (a shared cell: the caller asks the span record).
  int indexAt(uintptr_t spanStart) const { return indexIn(cellFor(spanStart), spanStart); }
  // The same for the cell of `spanStart`, read already.
  int indexIn(uint8_t cell, uintptr_t spanStart) const {
    if (starts_[cell] == spanStart) return cell;
    return cell == kSeveralSpans ? kMaybeAttached : kNotAttached;
  }
  // The same by a scan of the starts, where the table says kMaybeAttached: the index or -1.
  int indexByScan(uintptr_t spanStart) const {
    for (unsigned i = 0; i < count_; i++) {
      if (starts_[i] == spanStart) return static_cast<int>(i);
    }
    return -1;
  }

  unsigned count() const { return count_; }
  bool full() const { return count_ == kMaxSpansPerVector; }
  Span* record(unsigned i) const { return records_[i]; }
  uintptr_t start(unsigned i) const { return starts_[i]; }
  // The count and records as another thread sees them (single-copy atomic; a record may be
  // nullptr while its slot is being emptied).
  unsigned countSeenByPeers() const { return __atomic_load_n(&count_, __ATOMIC_RELAXED); }
  Span* recordSeenByPeers(unsigned i) const {
    return __atomic_load_n(&records_[i], __ATOMIC_RELAXED);
  }

  // Appends `record` (its attachIndex becomes its index). The table is stale until rebuild().
  unsigned add(Span* record) {
    MESHALLOC_ASSERT(count_ < kMaxSpansPerVector);
    unsigned i = count_++;
    record->attachIndex = static_cast<uint8_t>(i);
    records_[i] = record;
    starts_[i] = record->spanStart;
    return i;
  }
  // Drops span `i`; the last takes its index. The caller makes sure nothing refers to the last
  // by index (the stack is empty). The table is stale until rebuild(): until then it may name a
  // removed span, whose start no longer matches, or miss the moved one, whose free then takes
  // the slow path.
  void remove(unsigned i) {
    MESHALLOC_ASSERT(i < count_);
    unsigned last = --count_;
    if (i != last) {
      records_[i] = records_[last];
      starts_[i] = starts_[last];
      records_[i]->attachIndex = static_cast<uint8_t>(i);
    }
    records_[last] = nullptr;
    starts_[last] = 0;
  }
  void rebuild() {
    for (uint8_t& cell : cells_) cell = kNoSpan;
    for (uint32_t i = 0; i < count_; i++) {
      uint8_t& cell = cells_[cellOf(starts_[i])];
      cell = cell == kNoSpan ? static_cast<uint8_t>(i) : kSeveralSpans;
    }
  }

 private:
  uint32_t count_ = 0;
  uintptr_t starts_[kMaxSpansPerVector + 2] = {};
  Span* records_[kMaxSpansPerVector] = {};
  uint8_t cells_[kCells] = {};
};

// One size class's cache. The stack and the slot check fill the first cache line with the
// ring's counters, which the inline malloc reads when the stack is empty.
struct ShuffleVector {
  SlotStack slots;
  SlotCheck check;
  RecycledRing recycled;
  AttachedSpans attached;

  // The recycled ring's operations that change the pop floor (see SlotStack::canPop).
  // Adds `block`; returns the oldest block if that made room for it (to be applied), else 0.
  uintptr_t pushRecycled(uintptr_t block) {
    uintptr_t evicted = 0;
    if (!recycled.hasRoom()) takeOldestRecycled(&evicted);
    pushRecycledWithRoom(block);
    return evicted;
  }
  void pushRecycledWithRoom(uintptr_t block) { pushRecycledWithRoom(block, recycled.floor()); }
  // The same with the ring's floor read already (deallocateRecycled tests it too).
  void pushRecycledWithRoom(uintptr_t block, uint32_t floor) {
    slots.setPopFloor(floor);
    recycled.push(block);
  }
  // The floor is stored whether or not the ring emptied, as a mask rather than a branch: where
  // frees land in held and unheld spans at random (an LRU cache), whether this pop takes the
  // last block is random too, and the branch was mispredicted on 37 % of old-free's pops.
  void* popRecycled() {
    uint32_t left;
    uintptr_t block = recycled.popNewest(&left);
    slots.setPopFloor(recycled.floor() & -static_cast<uint32_t>(left != 0));
    return reinterpret_cast<void*>(block);
  }
  bool takeOldestRecycled(uintptr_t* block) {
    bool emptied = false;
    if (!recycled.takeOldest(block, &emptied)) return false;
    if (emptied) slots.setPopFloor(0);
    return true;
  }
  // Sets the order for this vector (RecycledRing::floor), and the stack's floor whether or not
  // the ring holds blocks (its owner's count is not read here): over an empty ring, the next
  // malloc of the class goes to allocateSlow, which clears it.
  void setRecycledFirst(bool first) {
    uint32_t floor = first ? RecycledRing::kFirstFloor : 0u;
    recycled.setFloor(floor);
    slots.setPopFloor(floor);
  }
};

}  // namespace meshalloc
