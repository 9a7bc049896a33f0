// Where handle objects live: pages of the heap's arena, apart from malloc's spans. Objects up
// to kMaxSmallSize go into chunks of one size class (malloc's classes), each chunk aligned to
// its size with its bookkeeping at its start: a bitmap of free slots and, per slot, the index
// of the handle that owns it, which is what lets the defragmenter find the entry to update for
// every object of a sparse chunk. New objects go into the fullest chunk of their class that has
// room, so sparse chunks are not refilled and become the defragmenter's sources. Larger objects
// get a run of pages of their own and are never moved (moving them would give no page back).
// Every chunk list of a class is guarded by the class's lock.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"

#include "handle/table.h"
#include "heap/size_class.h"
#include "support/lock.h"

namespace meshalloc::handles {

// The object word's class for objects in page runs of their own.
constexpr unsigned kLargeStoreClass = kNumSizeClasses;

struct Chunk {
  Chunk* prev;
  Chunk* next;
  uint32_t sizeClass;
  uint32_t liveCount;
  uint32_t bin;         // the list it is on (ClassStore::bins_ index, kEvacuating, kUnlinked)
  uint32_t hintWord;    // the first bitmap word that may have a free slot
  uint64_t freeBits[];  // then owners[], then the slots (see ClassLayout)
};

// One cache line per class, so that the allocation path's owner store reads one line.
struct alignas(64) ClassLayout {
  uint32_t slotSize;
  uint32_t slotCount;
  uint32_t firstSlot;     // offset of slot 0 from the chunk's start
  uint32_t ownersOffset;  // offset of the uint32_t owner array
  uint32_t bitmapWords;
  uint32_t reciprocal;  // the class's (SpanPlan): (delta * reciprocal) >> 32 == delta / slotSize
  size_t chunkBytes;    // also the chunk's alignment
  uintptr_t chunkMask;  // ~(chunkBytes - 1): an address's chunk is address & chunkMask
};

class Store {
 public:
  // Occupancy bins of partly used chunks (by eighths), then the full chunks' list.
  static constexpr unsigned kOccupancyBins = 8;
  static constexpr unsigned kFullBin = kOccupancyBins;
  static constexpr unsigned kBinLists = kOccupancyBins + 1;
  static constexpr uint32_t kEvacuating = kBinLists;  // a defragmenter's source, on no list
  // A chunk a thread made while the defragmenter held the class's lock, on no list until the
  // next holder links it (ClassStore::newChunks).
  static constexpr uint32_t kUnlinked = kBinLists + 1;
  static constexpr unsigned kMaxSourceProbes = 16;

  // Plans the chunk layouts (after SizeClasses::init). Idempotent.
  static void init();
  static const ClassLayout& layout(unsigned sizeClass) { return layouts_[sizeClass]; }

  // Storage for `size` bytes owned by handle index `owner`, zeroed if `zero`: the object word,
  // or 0 if memory is exhausted.
  static uint64_t allocate(size_t size, uint32_t owner, bool zero);
  static void free(uint64_t object);
  static size_t usableSize(uint64_t object);

  // The chunk holding a small object's address, its slot, and the reverse.
  static Chunk* chunkOf(uintptr_t address, unsigned sizeClass) {
    return reinterpret_cast<Chunk*>(address & layouts_[sizeClass].chunkMask);
  }
  static uint32_t slotOf(const Chunk* chunk, uintptr_t address) {
    return slotOf(chunk, address, chunk->sizeClass);
  }
  // The same without reading the chunk's header (a cache miss on the allocation path).
  static uint32_t slotOf(const Chunk* chunk, uintptr_t address, unsigned sizeClass) {
    const ClassLayout& l = layouts_[sizeClass];
    uint64_t delta = address - reinterpret_cast<uintptr_t>(chunk) - l.firstSlot;
    // A multiply by the class's reciprocal, exact for multiples of the size (SpanPlan).
    return static_cast<uint32_t>((delta * l.reciprocal) >> 32);
  }
  static uintptr_t slotAddress(const Chunk* chunk, uint32_t slot) {
    const ClassLayout& l = layouts_[chunk->sizeClass];
    return reinterpret_cast<uintptr_t>(chunk) + l.firstSlot + size_t{slot} * l.slotSize;
  }
  static uint32_t* owners(Chunk* chunk) {
    return reinterpret_cast<uint32_t*>(reinterpret_cast<char*>(chunk) +
                                       layouts_[chunk->sizeClass].ownersOffset);
  }
  static bool slotIsFree(const Chunk* chunk, uint32_t slot) {
    return (chunk->freeBits[slot / 64] >> (slot % 64)) & 1;
  }

  // --- For the thread caches (handle/thread_cache.h) ---
  // Takes up to `count` slots for a thread cache, from the fullest chunks with room (a new chunk
  // if none has), with no owner (the cache then names the entry it pairs each with): they stay
  // taken (never a move's destination, never freed) until returnSlots. How many were taken
  // (fewer only when memory is exhausted).
  static unsigned takeSlots(unsigned sizeClass, uintptr_t* slots, unsigned count);
  // Frees slots a thread cache held, under one lock.
  static void returnSlots(unsigned sizeClass, const uintptr_t* slots, unsigned count);
  // Owner of a slot just taken for a thread cache: past every index, so no move starts from it.
  static constexpr uint32_t kNoOwner = ~uint32_t{0};
  // Records the owner of a slot a thread cache holds: the entry it is paired with, not live
  // until the pair is handed out. Atomic: a move may read it meanwhile (under the class lock,
  // which the cache does not take); the move then validates the owner against its entry
  // (Defragmenter::beginMoveLocked), which names this slot only once the pair is handed out.
  static void setOwner(uintptr_t address, unsigned sizeClass, uint32_t owner) {
    const ClassLayout& l = layouts_[sizeClass];
    uintptr_t chunk = address & l.chunkMask;
    uint64_t slot = ((address - chunk - l.firstSlot) * uint64_t{l.reciprocal}) >> 32;
    auto* owners = reinterpret_cast<uint32_t*>(chunk + l.ownersOffset);
    __atomic_store_n(&owners[slot], owner, __ATOMIC_RELAXED);
  }
  static uint32_t ownerOf(Chunk* chunk, uint32_t slot) {
    return __atomic_load_n(&owners(chunk)[slot], __ATOMIC_RELAXED);
  }

  // Who takes a class's lock. The defragmenter's holds are timed and marked, so that a mutator
  // that finds the lock held by one goes around it; the time it polled before noticing is
  // counted as a wait caused by a move (gCounters.moverWaits), any other wait for the lock in
  // gCounters.otherWaits.
  // A mutator never waits for a lock the defragmenter holds: the guard is then not held, and
  // the caller goes around the lock (deferSlots, takeSlotsAround).
  enum class Holder { kMutator, kMover };
  // A class's lock for the guard's scope. Whoever takes it first applies what threads did around
  // it while the defragmenter held it (deferred frees, new chunks to link). Chunks emptied
  // meanwhile go back to the arena after it is released: no system call is made under a class
  // lock, only under a guard's lifetime.
  class ClassGuard {
   public:
    ClassGuard(unsigned sizeClass, Holder holder);
    ~ClassGuard();
    ClassGuard(const ClassGuard&) = delete;
    ClassGuard& operator=(const ClassGuard&) = delete;
    bool held() const { return held_; }

   private:
    static bool lockUnlessMover(unsigned sizeClass);

    unsigned sizeClass_;
    Holder holder_;
    bool held_ = true;
    uint64_t lockedAtNs_ = 0;
  };

  // --- For the defragmenter, with the class's lock held (a ClassGuard) ---
  // Takes a free slot in the fullest chunk with room other than evacuating ones, for `owner`;
  // 0 if no chunk has room (a move never makes a new chunk).
  static uintptr_t takeSlotInUsedChunkLocked(unsigned sizeClass, uint32_t owner);
  // Frees a slot; an emptied chunk is released unless it is being evacuated.
  static void freeSlotLocked(Chunk* chunk, uint32_t slot);
  // The sparsest chunk whose live objects fit in the free slots of the class's other chunks,
  // taken off its list for evacuation; nullptr if none. Only chunks in bins below
  // `maxSourceBin` qualify, and only the first kMaxSourceProbes of them are looked at (the lock
  // is held for a bounded time, however many chunks the class has).
  static Chunk* takeSourceLocked(unsigned sizeClass, unsigned maxSourceBin);
  // Ends an evacuation: an empty source is released to the OS at once, anything else goes back
  // on its list.
  static void endEvacuationLocked(Chunk* chunk);
  // Returns spare chunks to the OS: every one if `all`, else those that were already spare at
  // the previous call (a class churning around a chunk boundary keeps its spare). The bytes
  // released.
  static size_t releaseSpares(bool all);

  // --- Measurement ---
  // Bytes the store holds in the arena (chunks, including their bookkeeping, and large runs).
  static size_t committedBytes();
  // Bytes of live objects (slot sizes, or the usable part of large runs): slots taken less
  // those thread caches hold.
  static size_t liveBytes();
  static size_t liveObjects();
  static size_t classLiveBytes(unsigned sizeClass);
  static size_t classCommittedBytes(unsigned sizeClass);

  // Every class lock, for fork (registered by handles::initialize): no chunk is half made or
  // released while the process is copied.
  static const heap::ForkParticipant& forkParticipant();

 private:
  // Constant-initialised: no constructor runs at load time, where it would wipe what a handle
  // allocated by an earlier library's constructor had put here.
  struct alignas(64) ClassStore {
    Mutex lock{LockRank::kHandleClass};
    Chunk* bins[kBinLists] = {};
    Chunk* spare = nullptr;      // one empty chunk kept, so that 0 -> 1 -> 0 makes no syscalls
    Chunk* agedSpare = nullptr;  // the spare at the last releaseSpares
    // Chunks emptied under the lock, given back by the ClassGuard once it is released (linked
    // through `next`; empty whenever the lock is free).
    Chunk* toRelease = nullptr;
    // What threads did around the lock while the defragmenter held it, applied by the next
    // holder: slots given back (still taken in their chunks; linked through their first word,
    // and a refill going around the lock may take them again), and chunks made (kUnlinked,
    // linked through `next`).
    std::atomic<uintptr_t> deferredSlots{0};
    std::atomic<Chunk*> newChunks{nullptr};
    std::atomic<size_t> chunks{0};
    // Slots taken from the chunks: live objects and slots thread caches hold.
    std::atomic<size_t> takenSlots{0};
    size_t freeSlots = 0;  // in chunks on the lists (not evacuating, not the spare)
  };
  struct LargeHeader {
    size_t pages;
    uint32_t owner;
  };
  // The user's bytes start this far into a large run (a cache line: the header's own).
  static constexpr size_t kLargeHeaderBytes = 64;

  static unsigned binFor(const Chunk* chunk);
  static void link(ClassStore& c, Chunk* chunk, unsigned bin);
  static void unlink(ClassStore& c, Chunk* chunk);
  static void rebin(ClassStore& c, Chunk* chunk);
  static Chunk* makeChunk(unsigned sizeClass);
  static Chunk* newChunkLocked(ClassStore& c, unsigned sizeClass);
  static void releaseChunkLocked(ClassStore& c, Chunk* chunk, bool keepAsSpare);
  static uintptr_t takeSlot(Chunk* chunk, uint32_t owner);
  static uintptr_t takeSlotLocked(ClassStore& c, unsigned sizeClass, uint32_t owner);
  static size_t classLiveSlots(unsigned sizeClass);
  static uint64_t allocateLarge(size_t size, uint32_t owner, bool zero);
  static void applyDeferredLocked(ClassStore& c);
  static void deferSlots(ClassStore& c, const uintptr_t* slots, unsigned count);
  static void pushDeferred(ClassStore& c, uintptr_t first, uintptr_t last);
  static unsigned takeSlotsAround(ClassStore& c, unsigned sizeClass, uintptr_t* slots,
                                  unsigned count);

  static inline constinit ClassLayout layouts_[kNumSizeClasses] = {};
  static ClassStore classes_[kNumSizeClasses];  // defined in store.cc (constinit)
  static inline std::atomic<bool> planned_{false};
  static inline std::atomic<size_t> largeObjects_{0};
  static inline std::atomic<size_t> largeBytes_{0};      // pages held
  static inline std::atomic<size_t> largeLiveBytes_{0};  // usable bytes
  // The class whose lock the defragmenter holds or is taking, plus one (0: none).
  static inline std::atomic<unsigned> moverHolds_{0};
};

}  // namespace meshalloc::handles
