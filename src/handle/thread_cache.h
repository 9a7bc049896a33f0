// Per-thread caches of handle entries and of free slots, so that mh_alloc and mh_free take no
// lock and make no atomic read-modify-write of shared data on their common path (mh_free keeps
// the one on the entry's state word that orders it against a move). Entries come from and go
// back to the table's free stack in batches (one lock each); slots are taken from
// the fullest chunks of their class in batches under the class's lock, and given back in
// batches. A slot a cache holds stays taken in its chunk, with no owner: a move never chooses
// it as a destination (it is not free) and never moves out of it (no live entry names it), and
// the statistics count it as free (Store::liveBytes subtracts what the caches hold). The
// defragmenter asks for a class's slots back when one of them keeps a chunk from emptying
// (requestReturn): each thread gives them back at its next allocation or free in that class.
// Everything goes back when the thread exits (the heap's thread-exit hook) and when it calls
// mh_compact. docs/handles.md, "Thread caches".
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"

#include "heap/size_class.h"

namespace meshalloc::handles {

class ThreadCache {
 public:
  // Capacities: a thread allocating or freeing a few hundred small objects in a row does not
  // go to the shared structures (up to 64 KiB of free slots per class, each with an entry: 256
  // slots of up to 256 bytes, 4 of 16 KiB; malloc's shuffle vectors hold up to 512; and 2 KiB
  // of entry indices apart, for large objects and to pair with refills).
  static constexpr unsigned kEntryCapacity = 512;
  static constexpr unsigned kEntryBatch = kEntryCapacity / 2;
  static constexpr unsigned kMaxSlots = 256;  // per class; fewer for large classes (capacity_)
  static constexpr uint32_t kNoEntry = ~uint32_t{0};
  static constexpr unsigned kRunChunks = 4;

  // A cache made in the internal heap's zero-filled memory is left untouched: default
  // initialisation. The empty cache (gEmptyThreadCache) has every member initialised, which a
  // constinit object needs.
  ThreadCache() = default;
  struct Empty {};
  constexpr explicit ThreadCache(Empty)
      : next_(nullptr),
        freeing_(0),
        asymmetricFree_(false),
        inUse_(false),
        entryCount_(0),
        magazines_{},
        pairedObjects_{},
        pairedEntries_{},
        entries_{} {}

  // Plans the per-class capacities (after Store::init) and registers the thread-exit hook.
  static void init();

  // The calling thread's cache, made on first use; nullptr if it has none (memory exhausted,
  // or the thread is exiting): the caller then uses the table and the store directly.
  static ThreadCache* current() {
    ThreadCache* cache = tls_;
    if (__builtin_expect(reinterpret_cast<uintptr_t>(cache) > kExited, 1)) return cache;
    return currentSlow();
  }

  // What the fast paths read instead of current(): the calling thread's cache, or
  // gEmptyThreadCache when it has none in use, so that they need no test for a missing cache
  // (as malloc's gEmptyThreadHeap). Every magazine of the empty cache is empty and matches no
  // slot, and it does not free asymmetrically: takeFast and the free's protocol test fail on it
  // and the slow paths, which read current(), take over. Nothing ever writes to it.
  static ThreadCache* fast();

  // Whether mh_free's common path may take this cache's thread's frees from live to free with
  // a plain load and store (the asymmetric protocol, docs/handles.md): a copy, in the line the
  // free writes anyway, of asymmetricFrees(), false in the empty cache.
  bool freesAsymmetrically() const { return asymmetricFree_.load(std::memory_order_relaxed); }
  // The protocol of every free (every cache's copy with it): chosen at start-up, cleared by
  // the mover if membarrier(2) fails later (and by tests).
  static bool asymmetricFrees() { return asymmetricFrees_.load(std::memory_order_relaxed); }
  static void setAsymmetricFrees(bool asymmetric);

  // A class's magazine holds slots paired with entries: a slot freed with its handle keeps that
  // handle's entry, whose index its owner word in the chunk already holds, so that handing the
  // pair out again writes no owner (refills pair new slots with entries and write theirs). The
  // slots are held as the entries' object words (the address and the class, makeObject), which
  // the fast paths store and load as they are.
  //
  // The fast paths of mh_alloc and mh_free: a pair of the class, or a pair back, when it fits
  // without going to the shared structures; false (nothing taken or kept) when the slow path
  // (take, give) is needed. Only the free checks for the defragmenter's return requests: a
  // thread that only allocates meets them at its next refill.
  bool takeFast(unsigned sizeClass, uint32_t& index, uint64_t& object) {
    Magazine& m = magazineInRegister(sizeClass);
    uint32_t count = m.count;
    if (__builtin_expect(count == 0, 0)) return false;
    m.setCount(count - 1);
    size_t at = size_t{sizeClass} * kMaxSlots + count - 1;
    object = pairedObjects_[at];
    index = pairedEntries_[at];
    return true;
  }
  // `object` is the freed entry's object word; `storeClass` its class, which may be the large
  // objects' (whose magazine is never used: its hot block matches no object).
  bool giveFast(unsigned storeClass, uint32_t index, uint64_t object) {
    Magazine& m = magazineInRegister(storeClass);
    uint32_t count = m.count;
    if (__builtin_expect(
            (object >> kHotBlockShift) != m.hotBlock || count == m.capacity ||
                m.seenRequests != returnRequests_[storeClass].load(std::memory_order_relaxed),
            0))
      return false;
    size_t at = size_t{storeClass} * kMaxSlots + count;
    pairedObjects_[at] = object;
    pairedEntries_[at] = index;
    m.setCount(count + 1);
    return true;
  }

  // A pair of the class (the slot taken in its chunk, its owner word naming the entry, the
  // entry not live); false if memory or the table is exhausted.
  bool take(unsigned sizeClass, uint32_t& index, uint64_t& object) {
    if (__builtin_expect(magazines_[sizeClass].count == 0, 0) && !refill(sizeClass)) return false;
    return takeFast(sizeClass, index, object);
  }
  // A slot whose object was freed, with the entry that owned it (no longer live). The slot is
  // kept only if it is in one of the chunks the last refills took slots from (dense ones, the
  // fullest when taken); any other goes back to its chunk at once, so that a cache never keeps
  // sparse chunks alive, and its entry to the entries kept apart.
  void give(unsigned sizeClass, uint32_t index, uint64_t object) {
    if (!giveFast(sizeClass, index, object)) giveSlow(sizeClass, index, object);
  }

  // A free entry (not live) for an object outside the magazines, or kNoEntry when the table is
  // full.
  uint32_t takeEntry() {
    if (__builtin_expect(entryCount_ == 0, 0)) return refillEntries();
    return entries_[--entryCount_];
  }
  // An entry that is not live any more.
  void giveEntry(uint32_t index) {
    if (__builtin_expect(entryCount_ == kEntryCapacity, 0)) flushEntries(kEntryBatch);
    entries_[entryCount_++] = index;
  }

  // The asymmetric free's mutator side: `handle` is being taken from live to free by this
  // thread, with a plain load and store of its state word. No fence instruction: the mover's
  // membarrier(2) stands in for one, so that either the mover sees this store, or the load of
  // the state that follows it sees the mover's kMovingBit (docs/handles.md).
  // Release (a plain store on x86-64): a mover that reads this announcement instead of the end
  // of the previous one then sees the previous free's store of its state as well.
  void announceFree(uint64_t handle) {
    freeing_.store(handle, std::memory_order_release);
    std::atomic_signal_fence(std::memory_order_seq_cst);
  }
  // Release: the state's store comes before, for the mover that sees the announcement end.
  void endFree() { freeing_.store(0, std::memory_order_release); }
  // The mover's side, after its barrier: returns once no thread announces one of `handles`
  // (a free is a few instructions, unless its thread is preempted there).
  static void waitForFrees(const uint64_t* handles, unsigned count);

  // The calling thread gives back every entry and slot it holds (mh_compact).
  static void flushCurrent();
  // For the defragmenter: every thread gives back its slots of the class at its next
  // allocation or free in it.
  static void requestReturn(unsigned sizeClass) {
    returnRequests_[sizeClass].fetch_add(1, std::memory_order_relaxed);
  }
  // Slots of the class that thread caches hold now (a walk of the caches).
  static size_t cachedSlots(unsigned sizeClass);

  // Fork: no cache is being made or retired while the process is copied. In the child the
  // other threads' caches stay as they were, their slots taken (docs/handles.md, "Fork").
  // Its registry lock, for fork (registered by handles::initialize).
  static const heap::ForkParticipant& forkParticipant();

 private:
  // A class's magazine apart from its pairs (pairedObjects_, pairedEntries_): one cache line,
  // which the fast paths find by a shift of the class, as they find the pairs. No initialisers:
  // a new cache is zero-filled memory, and only the magazines a thread uses get touched.
  struct alignas(64) Magazine {
    uint32_t count;         // written by the owner only, read by cachedSlots (atomic_ref)
    uint32_t capacity;      // capacity_ of the class, set by the first refill or give (0 before)
    uint32_t seenRequests;  // returnRequests_ when the magazine was last refilled
    uint32_t nextRunChunk;  // the next runChunks entry to replace
    // The 64 KiB block (an object word >> kHotBlockShift, the class in its top bits) of a slot
    // in one of the run chunks, the last one refilled from or freed into (0: none): the free's
    // fast path keeps a slot of that block, one comparison instead of the four of inRunChunk,
    // which giveSlow makes.
    uint64_t hotBlock;
    // The chunks the last refills took slots from (0: none).
    uintptr_t runChunks[kRunChunks];
    void setCount(uint32_t value) {
      std::atomic_ref<uint32_t>(count).store(value, std::memory_order_relaxed);
    }
    uint32_t countFromAnotherThread() const {
      return std::atomic_ref<uint32_t>(const_cast<uint32_t&>(count))
          .load(std::memory_order_relaxed);
    }
  };
  static_assert(sizeof(Magazine) == 64);

  // Every chunk is at least this large and aligned to its size, so a block of this many bytes
  // lies within one chunk (checked by init).
  static constexpr unsigned kHotBlockShift = 16;
  static constexpr uintptr_t kExited = 1;  // tls_ of a thread whose cache was retired

  static bool inRunChunk(const Magazine& m, unsigned sizeClass, uintptr_t slot) {
    uintptr_t chunk = slot & chunkMask_[sizeClass];
    return m.runChunks[0] == chunk || m.runChunks[1] == chunk || m.runChunks[2] == chunk ||
           m.runChunks[3] == chunk;
  }
  // The magazine's address, computed once: without this GCC computes it again for the store of
  // the count (as the heap's vectorOfClassByte does for a shuffle vector).
  __attribute__((always_inline)) Magazine& magazineInRegister(unsigned sizeClass) {
    Magazine* m = &magazines_[sizeClass];
    asm("" : "+r"(m));
    return *m;
  }
  uint64_t* pairedObjectsOf(unsigned sizeClass) { return &pairedObjects_[sizeClass * kMaxSlots]; }
  uint32_t* pairedEntriesOf(unsigned sizeClass) { return &pairedEntries_[sizeClass * kMaxSlots]; }

  static ThreadCache* currentSlow();
  static void onThreadExit();
  uint32_t refillEntries();
  void flushEntries(unsigned count);
  bool refill(unsigned sizeClass);
  void giveSlow(unsigned sizeClass, uint32_t index, uint64_t object);
  void answerReturnRequest(unsigned sizeClass, uint32_t requests);
  void returnSlots(unsigned sizeClass, unsigned count);
  void forgetRunChunks(unsigned sizeClass);
  void flushAll();

  ThreadCache* next_;              // every cache ever made (the registry), in use or not
  std::atomic<uint64_t> freeing_;  // announceFree's handle, 0 outside a free
  // asymmetricFrees_ when the cache was taken into use, and cleared with it (under the
  // registry lock both times): beside freeing_, which the same free writes.
  std::atomic<bool> asymmetricFree_;
  bool inUse_;
  uint32_t entryCount_;
  // One more than the classes: the large objects' store class (kLargeStoreClass, the class in
  // their object words), whose magazine stays empty and never matches, so that the free's fast
  // path needs no test for it.
  Magazine magazines_[kNumSizeClasses + 1];
  // The magazines' pairs, kMaxSlots per class: class c's i-th at c * kMaxSlots + i.
  uint64_t pairedObjects_[kNumSizeClasses * kMaxSlots];  // the slots, as object words
  uint32_t pairedEntries_[kNumSizeClasses * kMaxSlots];  // the entry paired with each
  uint32_t entries_[kEntryCapacity];

  static inline constinit thread_local ThreadCache* tls_
      __attribute__((tls_model("initial-exec"))) = nullptr;
  static inline uint32_t capacity_[kNumSizeClasses] = {};
  static inline uintptr_t chunkMask_[kNumSizeClasses] = {};  // a slot's chunk: slot & mask
  static inline std::atomic<bool> asymmetricFrees_{false};
  // Bumped by requestReturn, read by every cached allocation and free: on lines of their own,
  // away from data written often. One for the large store class too, never bumped (giveFast).
  struct alignas(64) Requests {
    std::atomic<uint32_t> values[kNumSizeClasses + 1];
    std::atomic<uint32_t>& operator[](unsigned i) { return values[i]; }
  };
  static inline constinit Requests returnRequests_ = {};
};

// The empty cache and each thread's fast-path pointer (ThreadCache::fast).
extern constinit ThreadCache gEmptyThreadCache;
extern constinit thread_local ThreadCache* tlsFastPathCache
    __attribute__((tls_model("initial-exec")));
inline ThreadCache* ThreadCache::fast() {
  return tlsFastPathCache;
}

}  // namespace meshalloc::handles
