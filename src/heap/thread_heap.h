// Per-thread heap: one shuffle vector per size class, holding the free slots of the (up to
// kMaxSpansPerVector) spans attached to this thread. malloc pops a slot and a free of a slot
// of an attached span pushes it back, with no atomics and no locks; everything else goes to
// the global heap. Drawing from several spans keeps refills rare when the fullest partial
// spans have only a few free slots each.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/config.h"
#include "heap/operation_guard.h"
#include "heap/shuffle_vector.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "support/rng.h"

namespace meshalloc {

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
// A free that applies the oldest recycled block prefetches the span record of the one this many
// applications later: far enough ahead for the lines to arrive, near enough to stay in cache.
constexpr uint32_t kRecycledPrefetchDistance = 4;

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
  // Where the vectors' entries and the scratch begin in that block: the first page boundary
  // after the ThreadHeap object.
  static size_t entriesOffset();
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
  // attachIndex `span`, with its start in the span table, within the vector's bounds.
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
  // Class c's vector lies (c + 1) strides into the heap (after unconfigured_).
 public:
  static constexpr size_t kVectorStride = 1024;

 private:
  static_assert(sizeof(ShuffleVector) <= kVectorStride);
  struct PaddedVector {
    ShuffleVector vector;
    char padding[kVectorStride - sizeof(ShuffleVector)] = {};
  };
  // Never configured and never written: the vector of the compact page-map entry's class byte 0
  // (no small span there), one stride below class 0's. The inline free indexes the vectors by
  // that byte, the class plus one, so it needs neither the byte's zero test nor the
  // subtraction (3 instructions): such a pointer fails this vector's slot check (its bounds are
  // 0) and goes to the slow path. First, so that class c's vector lies c + 1 strides into the
  // heap, the offset malloc adds (kVectorOffsets).
  PaddedVector unconfigured_;
  PaddedVector vectors_[kNumSizeClasses];
  // Zeros until create() seeds it and sets the level: a ThreadHeap constant-initialises to
  // zeros, so gEmptyThreadHeap (42 KiB) lies in .bss, where the fast paths' reads of it cost no
  // memory; with one non-zero byte it was in .data, whose pages every process mapped in full.
  Rng rng_{Rng::Unseeded{}};
  uintptr_t* reorderScratch_ = nullptr;  // as many entries as the largest vector holds
  Randomization randomization_ = Randomization::kNone;
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

// Each small size's vector, as its offset in a ThreadHeap (class c's: (c + 1) strides), indexed
// as kClassBySize is: malloc adds the offset to the heap, where the class took a shift more (its
// multiply by the stride). Built at compile time from kClassBySize, the table classOf reads
// (ThreadHeapTest.VectorOffsetsAgreeWithClassOf compares them at every size).
struct VectorOffsets {
  uint16_t bySize[ClassBySize::kCount];
};
inline constexpr VectorOffsets kVectorOffsets = [] {
  static_assert((kNumSizeClasses + 1) * ThreadHeap::kVectorStride <= UINT16_MAX);
  VectorOffsets offsets{};
  for (size_t i = 0; i < ClassBySize::kCount; i++) {
    offsets.bySize[i] =
        static_cast<uint16_t>((kClassBySize.classes[i] + 1u) * ThreadHeap::kVectorStride);
  }
  return offsets;
}();

// The vector of a small size, its address computed once, into a register, for the fast path:
// left to itself GCC addressed each field from the heap and the offset and computed the
// address again for the next (malloc: 2 instructions).
__attribute__((always_inline)) inline ShuffleVector& vectorForSize(ThreadHeap* heap, size_t size) {
  char* vector = reinterpret_cast<char*>(heap) +
                 kVectorOffsets.bySize[(size + kMinAlignment - 1) / kMinAlignment];
  asm("" : "+r"(vector));
  return *reinterpret_cast<ShuffleVector*>(vector);
}
// The same for a compact page-map entry's class byte (PageClassEntry: the class plus one, 0 where
// there is no small span), for the inline free: byte 0 names the unconfigured vector, whose
// slot check no pointer passes.
__attribute__((always_inline)) inline ShuffleVector& vectorOfClassByte(ThreadHeap* heap,
                                                                       unsigned classByte) {
  char* base = reinterpret_cast<char*>(heap) + size_t{classByte} * ThreadHeap::kVectorStride;
  asm("" : "+r"(base));
  return *reinterpret_cast<ShuffleVector*>(base);
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
