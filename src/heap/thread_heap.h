// Per-thread heap: one shuffle vector per size class, holding the free slots of the (up to
// kMaxSpansPerVector) spans attached to this thread. malloc pops a slot and a free of a slot
// of an attached span pushes it back, with no atomics and no locks; everything else goes to
// the global heap. Drawing from several spans keeps refills rare when the fullest partial
// spans have only a few free slots each.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/cache_tag.h"
#include "heap/config.h"
#include "heap/operation_guard.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "support/rng.h"

namespace meshalloc {

// How many spans of one class a thread may hold attached. Full attached spans cost nothing (no
// free slot sits idle in them), and while a span is attached its owner's frees are local
// pushes; once a thread's live objects of a class outgrow its table, most of its own frees
// become remote frees and its refills swap spans through the global heap's lock. With 8 spans
// that kept larson at 2-3x mimalloc's time. Idle free slots are bounded separately (refill
// hands back spans whose free slots exceed a vector's capacity).
constexpr unsigned kMaxSpansPerVector = 32;
// A vector holds at most this many spans' worth of slots, and at most max(objects per span,
// kVectorEntryBudget).
constexpr unsigned kVectorSpansWorth = 8;
// A refill that must fetch spans first releases full attached spans until this many entries of
// the span table are free: enough for exchangeSpans to cover a vector's worth of slots from
// partial spans, while the other full spans stay attached for the local frees to come.
constexpr unsigned kRefillMinRoom = 16;
// A vector holds at most max(objects per span, this) entries, so a thread's idle free slots
// (memory other threads cannot use) stay bounded for every class.
constexpr uint32_t kVectorEntryBudget = 512;
// Blocks freed into spans this thread does not hold are kept for reuse (see ShuffleVector's
// recycled blocks): at most this many per class, and at most kRecycledBytes of them.
constexpr uint32_t kMaxRecycled = 16;
constexpr uint32_t kMinRecycled = 2;
constexpr size_t kRecycledBytes = 32 * 1024;
static_assert((kMaxRecycled & (kMaxRecycled - 1)) == 0);
// A free that applies the oldest recycled block prefetches the span record of the one this many
// applications later: far enough ahead for the lines to arrive, near enough to stay in cache.
constexpr uint32_t kRecycledPrefetchDistance = 4;
struct ShuffleVector {
  // The free slots, by address, popped from the end. An entry's low bit says the block carries
  // the vector tag (a local free put it here; a refill's slots are left untouched, so that a
  // detach need not write to pages the program never used).
  static constexpr uintptr_t kTaggedEntry = 1;

  // The fast paths' fields share the first cache line.
  uint32_t length = 0;  // free slots available, popped from the end
  // malloc pops only while length is above this: 0, or kRecycledFirstFloor while this vector's
  // ring holds blocks to serve first (a recycled push sets it to recycledFloor; the pop that
  // empties the ring clears it). So malloc's one test covers both an empty vector and a ring to
  // serve first; testing the ring's order, then the length, cost it 3 instructions. Another
  // thread may set it when the order changes (setRecycledFirst), hence the relaxed atomics (plain
  // loads and stores); a floor left set over an empty ring only sends one malloc to
  // allocateSlow, which clears it.
  uint32_t popFloor = 0;
  uintptr_t* entries = nullptr;  // `capacity` entries
  uint32_t recycledCount = 0;
  uint32_t capacity = 0;  // entries
  uint32_t objectSize = 0;
  uint32_t attachedCount = 0;
  // The inline local free pushes only below this: `capacity`, or 0 where every local free must
  // be shuffled in (Randomization::kOnRefillAndFree, done out of line), so that the fast path
  // tests one bound instead of also reading the randomisation level. (In the line's padding:
  // moving `entries` cost malloc two instructions.)
  uint32_t inlinePushLimit = 0;
  uint32_t recycledCapacity = 0;  // read by the recycling push (deallocateRecycled)
  // What a recycled push sets popFloor to: kRecycledFirstFloor while this is the process's
  // only thread heap in use (malloc serves the ring first), else 0 (ThreadHeap::create and
  // retire set it; see setRecycledFirst). A vector of zeros never serves the ring first.
  uint32_t recycledFloor = 0;
  static constexpr uint32_t kRecycledFirstFloor = UINT32_MAX;
  // The class's SpanPlan::slotLimit and slotMultiplier, copied here so that the inline free
  // checks that a pointer is a slot's start from the line it reads anyway (from the class's plan
  // it took 4 instructions more: the plan's address). Zero in an unconfigured vector (the empty
  // heap's): no pointer passes, so such a free goes to the slow path.
  uint32_t slotLimit = 0;
  uint64_t slotMultiplier = 0;
  // The attached spans' starts, then two entries that stay 0 (no span starts there), for the
  // span table's kSeveralSpans and kNoSpan cells: a free compares the start a cell names without
  // testing the cell first.
  uintptr_t spanStarts[kMaxSpansPerVector + 2] = {};
  Span* spans[kMaxSpansPerVector] = {};

  static uintptr_t blockOf(uintptr_t entry) { return entry & ~kTaggedEntry; }
  // SizeClasses::isSlotStart for this vector's class.
  bool isSlotStart(uintptr_t delta) const {
    return SpanPlan::isSlotStart(slotLimit, slotMultiplier, delta);
  }
  // Whether `block` is among the free slots: a scan, for the slow paths only (a block that
  // carries the vector tag). Other threads peek too, to report a double free (best effort: the
  // owner's length and entries change under them), so each is read once, single-copy atomic:
  // the same code as plain loads for the owner.
  bool holds(uintptr_t block) const {
    uint32_t count = __atomic_load_n(&length, __ATOMIC_ACQUIRE);
    if (count > capacity) return false;
    for (uint32_t i = 0; i < count; i++) {
      if (blockOf(__atomic_load_n(&entries[i], __ATOMIC_RELAXED)) == block) return true;
    }
    return false;
  }

  // The attached spans by a hash of their starts, so a free can tell without touching the span's
  // span record (which misses in a large heap) whether its span is attached here, and which one it
  // is: a cell holds the span's index, kNoSpan, or kSeveralSpans where starts collide. The
  // span is attached exactly when spanStarts[cell] is its start. (A bit filter still had to read
  // the span record to confirm; its false positives, one in eight frees with a full table, then
  // also went the slow way.) A table never rebuilt is all zeros, which names span 0: the start
  // comparison still decides.
  static constexpr unsigned kSpanTableCells = 256;
  static constexpr uint8_t kSeveralSpans = kMaxSpansPerVector;
  static constexpr uint8_t kNoSpan = kMaxSpansPerVector + 1;
  // attachedSpanAt's answers besides an index.
  static constexpr int kNotAttached = -1;
  static constexpr int kMaybeAttached = -2;
  uint8_t spanTable[kSpanTableCells] = {};

  // Fibonacci hashing of the start's low 32 bits (its page number's low 20 with 4 KiB pages):
  // a 32-bit multiply takes its constant inline, where the 64-bit one first loaded it into a
  // register (one instruction per free). Starts 4 GiB apart share a cell, which costs only the
  // shared cell's slower path.
  static unsigned spanCell(uintptr_t spanStart) {
    constexpr uint32_t kFibonacciMultiplier = 0x9E3779B1u;
    constexpr unsigned kCellShift = 32 - __builtin_ctz(kSpanTableCells);
    return (static_cast<uint32_t>(spanStart) * kFibonacciMultiplier) >> kCellShift;
  }
  // The index of the attached span that starts at `spanStart`, kNotAttached, or kMaybeAttached
  // (a shared cell: the caller asks the span record).
  int attachedSpanAt(uintptr_t spanStart) const {
    return attachedSpanIn(spanTable[spanCell(spanStart)], spanStart);
  }
  // The same for the span table's cell of `spanStart`, read already.
  int attachedSpanIn(uint8_t cell, uintptr_t spanStart) const {
    if (spanStarts[cell] == spanStart) return cell;
    return cell == kSeveralSpans ? kMaybeAttached : kNotAttached;
  }
  void rebuildSpanTable() {
    for (uint8_t& cell : spanTable) cell = kNoSpan;
    for (uint32_t i = 0; i < attachedCount; i++) {
      uint8_t& cell = spanTable[spanCell(spanStarts[i])];
      cell = cell == kNoSpan ? static_cast<uint8_t>(i) : kSeveralSpans;
    }
  }

  // Recycled blocks: this thread's latest frees into spans it does not hold, handed out again
  // (newest first) before the vector's slots by a thread alone in the process, else once the
  // vector is empty, in place of a refill (recycledFirst). Such a free would
  // otherwise miss on the span's record, and the slot come back only when a refill attaches
  // its span; reused here, the block's memory and page-map entry are still in cache. A block
  // stays live in its span's bitmap while it is here (statistics count it, meshing copies it).
  // The oldest is applied to its span when the ring is full, and all of them whenever the
  // thread's caches are flushed. A refill never attaches the span of a block held here: it
  // only happens with the ring empty, so a second free of a held block is caught below.
  uint32_t recycledHead = 0;  // next position written; the newest is just before it
  uintptr_t recycled[kMaxRecycled] = {};

  // Other threads read the ring to report a double free (ThreadHeap::recycledAnywhere): the
  // slots are single-copy atomic, with the same code as plain accesses.
  uintptr_t recycledAt(uint32_t i) const { return __atomic_load_n(&recycled[i], __ATOMIC_RELAXED); }
  void setRecycledAt(uint32_t i, uintptr_t block) {
    __atomic_store_n(&recycled[i], block, __ATOMIC_RELAXED);
  }
  bool holdsRecycled(uintptr_t block) const {
    bool held = false;
    for (uint32_t i = 0; i < kMaxRecycled; i++) held |= recycledAt(i) == block;
    return held;
  }
  // The block leaves the ring: its tag goes first, while the block is still this thread's.
  static uintptr_t untag(uintptr_t block) {
    setCacheTag(block, 0);
    return block;
  }
  // (The ring's head is kept in a local: after the atomic accesses to the slots, reading the
  // field again was one more load per push and per pop.)
  void* popRecycled() {
    uint32_t head = (recycledHead - 1) & (kMaxRecycled - 1);
    recycledHead = head;
    if (--recycledCount == 0) setPopFloor(0);
    uintptr_t block = recycledAt(head);
    setRecycledAt(head, 0);
    return reinterpret_cast<void*>(untag(block));
  }
  // Adds `block`; returns the oldest block if that made room for it (to be applied), else 0.
  uintptr_t pushRecycled(uintptr_t block) {
    uintptr_t evicted = 0;
    if (recycledCount == recycledCapacity) takeOldestRecycled(&evicted);
    pushRecycledWithRoom(block);
    return evicted;
  }
  // Adds `block` to a ring that is not full.
  void pushRecycledWithRoom(uintptr_t block) { pushRecycledWithRoom(block, recycledPopFloor()); }
  // The same, with recycledPopFloor() read already by the caller.
  void pushRecycledWithRoom(uintptr_t block, uint32_t floor) {
    uint32_t head = recycledHead;
    setPopFloor(floor);
    setCacheTag(block, recycledTag());
    setRecycledAt(head, block);
    recycledHead = (head + 1) & (kMaxRecycled - 1);
    recycledCount++;
  }
  // What a recycled push sets popFloor to (recycledFloor).
  uint32_t recycledPopFloor() const { return __atomic_load_n(&recycledFloor, __ATOMIC_RELAXED); }
  // Whether malloc takes a recycled block before the vector's slots. Reused first, a block
  // freed into a span this thread does not hold is never applied to its span and no cold slot
  // is taken in its place (old-free: 0.58x the time). Only for a thread alone in the process:
  // where other threads hold spans, a recycled block may share its cache lines with another
  // thread's live blocks, and a thread that frees blocks other threads allocated (larson) kept
  // reusing those instead of moving to its own spans: 1.37x the time. Another thread writes
  // the field (ThreadHeap::create), hence the relaxed atomics (plain loads and stores).
  // The vector's slots are to be popped (its ring, if any, is served after them).
  bool popsVector() const { return length > __atomic_load_n(&popFloor, __ATOMIC_RELAXED); }
  void setPopFloor(uint32_t floor) { __atomic_store_n(&popFloor, floor, __ATOMIC_RELAXED); }
  bool servesRecycledLast() const { return recycledPopFloor() != kRecycledFirstFloor; }
  // Also sets popFloor, whether or not the ring holds blocks (the owner's count is not read
  // here): over an empty ring, the next malloc of the class goes to allocateSlow, which clears it.
  void setRecycledFirst(bool first) {
    uint32_t floor = first ? kRecycledFirstFloor : 0u;
    __atomic_store_n(&recycledFloor, floor, __ATOMIC_RELAXED);
    setPopFloor(floor);
  }
  // The block `distance` places after the oldest (the newest if there are fewer), or 0.
  uintptr_t recycledToApplyAfter(uint32_t distance) const {
    if (recycledCount == 0) return 0;
    uint32_t ahead = distance < recycledCount ? distance : recycledCount - 1;
    return recycledAt((recycledHead - recycledCount + ahead) & (kMaxRecycled - 1));
  }
  // Takes the oldest block (for applying them all); false once empty.
  bool takeOldestRecycled(uintptr_t* block) {
    if (recycledCount == 0) return false;
    uint32_t oldest = (recycledHead - recycledCount) & (kMaxRecycled - 1);
    *block = untag(recycledAt(oldest));
    setRecycledAt(oldest, 0);
    if (--recycledCount == 0) setPopFloor(0);
    return true;
  }

  // The tag goes with the block: the program's data takes its place.
  void* pop() {
    uintptr_t block = blockOf(entries[--length]);
    setCacheTag(block, 0);
    return reinterpret_cast<void*>(block);
  }

  // A local free. The tag lets the next free of the block notice that it is already here.
  void push(uintptr_t block) {
    setCacheTag(block, vectorTag());
    entries[length++] = block | kTaggedEntry;
  }

  // Pushes, then swaps the new entry with a random one: the vector stays a uniform shuffle.
  void pushRandomly(uintptr_t block, Rng& rng) {
    setCacheTag(block, vectorTag());
    uint32_t position = rng.below(length + 1);
    entries[length++] = entries[position];
    entries[position] = block | kTaggedEntry;
  }

  // A slot a refill claimed from its span's bitmap.
  void pushClaimed(uintptr_t block) { entries[length++] = block; }
};

class ThreadHeap {
 public:
  // A heap for the calling thread (reusing one a finished thread left), or nullptr.
  static ThreadHeap* create();
  // Returns every attached span to the global heap and puts this heap up for reuse.
  void retire();

  // Moves the blocks other threads pushed onto attached span `span`'s remote-free stack into
  // its bitmap (clearing their bits), and leaves the stack empty, or closed for a span about
  // to be released. Reports a block freed twice.
  void drainRemoteFrees(ShuffleVector& v, unsigned span, uintptr_t leaveAs);

  // Makes room in the full vector `v` for local frees: its oldest half (the bottom entries) goes
  // back to the spans' bitmaps, one atomic per bitmap word and one per span rather than two per
  // block. The spans stay attached and reclaim those slots at the next refill. Reports a block
  // whose bit was clear already (freed twice).
  void spill(ShuffleVector& v);
  // Refills the (empty) vector of `sizeClass`; false when memory is exhausted. The class's
  // recycled blocks must all be handed out first (heap::allocateSlow sees to it): a refill may
  // attach the span of a block still held there, and a second free of that block would then take
  // the local path, which does not look there.
  bool refill(unsigned sizeClass);
  // Returns the vector's slots and spans to the global heap (e.g. "thread.tcache.flush").
  void detachAll(unsigned sizeClass);
  void detachAll();
  // With every vector empty (after detachAll): gives back the pages of the vectors' entries and
  // the scratch, whose contents no longer matter; the next refill touches them again. A heap in
  // the pool, or taken from a parked thread, otherwise kept them all (48 exited threads: 6 MiB).
  void releaseEntryPages();
  // The whole pages of this heap's storage past the ThreadHeap object (the vectors' entries and
  // the scratch): what releaseEntryPages gives back. Empty when there is no whole page.
  struct PageRange {
    uintptr_t start;
    size_t bytes;
  };
  PageRange entryPages() const;
  // The whole pages of the vectors themselves (inside the ThreadHeap object). An empty vector
  // is all zeros but for its configuration, so a heap put in the pool gives these back too and
  // create() configures its vectors again (49 pooled heaps kept 2.4 MB of them).
  PageRange vectorPages() const;

  ShuffleVector& vector(unsigned sizeClass) { return vectors_[sizeClass].vector; }
  // The size class whose vector is `v` (one of this heap's).
  unsigned sizeClassOf(const ShuffleVector& v) const {
    return static_cast<unsigned>(reinterpret_cast<const PaddedVector*>(&v) - vectors_);
  }
  // Whether any thread holds `block` among its recycled blocks of `sizeClass` (best effort
  // across threads: for reporting a double free of a block that carries the tag).
  static bool recycledAnywhere(unsigned sizeClass, uintptr_t block);
  Rng& rng() { return rng_; }
  Randomization randomization() const { return randomization_; }
  ThreadHeap* nextInRegistry() const { return registryNext_; }
  bool inUse() const { return inUse_; }
  ThreadActivity& activity() { return activity_; }

  // Idle threads (docs/heap.md#idle-threads). A thread about to block in a wait that no signal
  // handler may call (pthread_cond_wait and its kin: not async-signal-safe, so the wait never
  // interrupts one of our operations) parks its heap: tlsThreadHeap is cleared, so anything the
  // thread allocates meanwhile (a signal handler) resumes the heap first, and the heap is marked
  // parked. The background thread reclaims a heap parked for longer than idle_reclaim_ms: it
  // applies its recycled blocks and detaches every span, as if the thread had called
  // thread.tcache.flush, while the owner is blocked. The owner's next use waits out a reclaim
  // in progress. Busy threads pay nothing: the fast paths never look at the park state.
  //
  // park() returns the heap it parked (nullptr if the thread has no heap or a handler resumed
  // it at once); the caller passes it to unpark() once the wait is over.
  static ThreadHeap* park();
  static void unpark(ThreadHeap* heap);
  // For an allocator entry that found tlsThreadHeap empty: the calling thread's parked heap,
  // running again, or nullptr if it has none.
  static ThreadHeap* resumeParked();
  // The background thread: reclaims every heap parked since before `nowNs - idleNs`. Returns
  // how many it reclaimed; `*nextDueNs` (if given) becomes the time the next heap parked now
  // is due, or UINT64_MAX.
  static size_t reclaimIdle(uint64_t nowNs, uint64_t idleNs, uint64_t* nextDueNs = nullptr);
  // Heaps reclaimed while their thread was parked, since start.
  static uint64_t idleReclaims();
  // fork: no reclaim may be half done in the child.
  static void lockReclaimForFork();
  static void unlockReclaimAfterFork();
  static void resetReclaimAfterFork();

  // The internal-heap block each thread heap lives at the start of (statistics).
  static size_t storageBytes();
  // Every heap ever created, for statistics and fork handling.
  static ThreadHeap* registryHead();
  static void lockRegistry();
  static void unlockRegistry();
  static void resetRegistryAfterFork();

 private:
  // Configures the vectors (object size, capacity, where their entries lie in the storage that
  // follows this object, the ring's size) and the scratch.
  void initialize();
  void setRecycledFirst(bool first);
  // Counts the calling thread's heap in (`joined`) or out of the heaps in use, and sets each
  // in-use heap's recycled-first order (ShuffleVector::recycledFirst). Under gRegistryLock.
  void updateRecycledOrder(bool joined);
  // Claims every free slot of attached span `span` into the vector.
  void claimFreeSlots(ShuffleVector& v, unsigned span);
  // Asserts (checked builds) that attached span `span` is consistent: owned by this heap, at
  // attachIndex `span`, with its start in spanStarts, within the vector's bounds.
  void checkAttached(const ShuffleVector& v, unsigned span) const;
  // Drops span `span` (which has no entries in the vector) from the table, compacting it.
  void removeSpan(ShuffleVector& v, unsigned span);
  // Puts the vector in the order of the randomisation level. The refill claimed the slots one
  // span after another, in ascending order: span k's run starts at entry runStarts[k] and
  // ends where the next starts (runStarts[runs] == v.length).
  void shuffle(ShuffleVector& v, const uint32_t* runStarts, unsigned runs);
  // Waits until this heap is running (a reclaim in progress finishes first) and makes it so,
  // with a new generation: a park() that this interrupted then fails to publish.
  void takeRunning();
  // Randomization::kRotatedRuns's order: each span's slots from a random one, spans shuffled.
  void shuffleRuns(ShuffleVector& v, const uint32_t* runStarts, unsigned runs);

  // A power-of-two stride: the fast paths find a class's vector with a shift, not a multiply.
  static constexpr size_t kVectorStride = 1024;
  static_assert(sizeof(ShuffleVector) <= kVectorStride);
  struct PaddedVector {
    ShuffleVector vector;
    char padding[kVectorStride - sizeof(ShuffleVector)] = {};
  };
  PaddedVector vectors_[kNumSizeClasses];
  Rng rng_;
  uintptr_t* reorderScratch_ = nullptr;  // as many entries as the largest vector holds
  Randomization randomization_ = Randomization::kRotatedRuns;
  bool inUse_ = false;
  ThreadActivity activity_;
  // The park state in the low two bits, a generation above them: park() publishes kParked only
  // if no signal handler resumed the heap meanwhile (which raises the generation). Only the
  // owner moves it between kRunning and kParked; only the reclaimer out of kParked.
  static constexpr uint32_t kRunning = 0, kParked = 1, kReclaiming = 2, kStateMask = 3;
  static constexpr uint32_t kGeneration = 4;
  std::atomic<uint32_t> parkWord_{kRunning};
  std::atomic<uint64_t> parkedSinceNs_{0};  // 0 once reclaimed: nothing left to take
  ThreadHeap* registryNext_ = nullptr;
  ThreadHeap* poolNext_ = nullptr;
};

// heap->vector(sizeClass) with its address computed once, into a register, for the fast paths:
// left to itself GCC addressed each field from the heap and the class (heap + class * stride +
// offset) and computed the address again for the next (malloc: 2 instructions, free: 2).
__attribute__((always_inline)) inline ShuffleVector& vectorInRegister(ThreadHeap* heap,
                                                                      unsigned sizeClass) {
  ShuffleVector* v = &heap->vector(sizeClass);
  asm("" : "+r"(v));
  return *v;
}

// initial-exec TLS: one %fs-relative load on the fast path, valid even for LD_PRELOAD since
// glibc reserves static TLS surplus for preloaded libraries.
// constinit: no dynamic initialisation, so the fast paths read it without a TLS wrapper call.
// The calling thread's heap, or nullptr (no heap yet, parked, exited).
extern constinit thread_local ThreadHeap* tlsThreadHeap __attribute__((tls_model("initial-exec")));
// What the inline malloc and free read instead: tlsThreadHeap, or gEmptyThreadHeap where that is
// nullptr, so they need no test for a missing heap (2 instructions each). Every vector of the
// empty heap is empty and unconfigured: malloc finds nothing to pop and goes to allocateSlow,
// and free's slot check fails and it goes to deallocateSlow, both of which read tlsThreadHeap.
// Only setThreadHeap writes it; nothing ever writes to the empty heap.
extern constinit thread_local ThreadHeap* tlsFastPathHeap
    __attribute__((tls_model("initial-exec")));
extern constinit ThreadHeap gEmptyThreadHeap;
// Sets tlsThreadHeap (nullptr: none) and tlsFastPathHeap together. A signal handler that runs
// between the two stores sees either the heap in both or nullptr in tlsThreadHeap, which the
// slow paths handle (ThreadHeap::park's comment): the fast path's pointer is cleared first and
// set last.
inline void setThreadHeap(ThreadHeap* heap) {
  if (heap == nullptr) {
    tlsFastPathHeap = &gEmptyThreadHeap;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    tlsThreadHeap = nullptr;
  } else {
    tlsThreadHeap = heap;
    std::atomic_signal_fence(std::memory_order_seq_cst);
    tlsFastPathHeap = heap;
  }
}
// The heap of a thread that parked it (tlsThreadHeap is then nullptr), until it resumes.
extern constinit thread_local ThreadHeap* tlsParkedHeap __attribute__((tls_model("initial-exec")));

}  // namespace meshalloc
