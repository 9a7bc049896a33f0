// The defragmenter: moves the objects of a class's sparsest chunks into free slots of its
// fullest ones, then gives the emptied chunks back to the OS. A move runs concurrently with
// the program: it takes the object's entry with the moving bit only while no pin is held,
// copies, and commits with one compare-and-swap that fails if a pin arrived meanwhile: such a
// pin does not wait for the copy, it cancels the move and uses the object where it is (the
// copy is dropped). A free does not wait either: it takes the entry, and the commit fails.
// Only a pin or free that arrives in the few instructions between the commit and the new
// address's publication finds the copy in the mover's record instead of waiting. Pinned objects
// are never moved. The class's lock is held to choose the slots and to free one, for one object
// at a time, never during a copy.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"

#include "support/lock.h"

namespace meshalloc::handles {

struct Chunk;
struct Entry;

struct PassResult {
  size_t movedBytes = 0;
  size_t releasedBytes = 0;  // chunks emptied by moves, and spare chunks, given back
  bool budgetExhausted = false;
};

class Defragmenter {
 public:
  // One pass over every class, until `deadlineNs` (monotonic; 0: none) or until `maxMovedBytes`
  // (0: no limit) have moved. Passes run one at a time. The pass's CPU time is counted in
  // gCounters.cpuNs.
  static PassResult pass(uint64_t deadlineNs, size_t maxMovedBytes);

  // For fork (registered by handles::initialize): no class is half evacuated while the process
  // is copied; the child, where no pass runs, resets the pass lock too.
  static const heap::ForkParticipant& forkParticipant();

  // Tests only: every move copies one byte wrong (the randomised tests must then fail).
  static void corruptMovesForTesting(bool on) { corruptMoves_ = on; }
  // Tests only: every copy takes at least this long, so that pins land in the middle of moves.
  static void delayCopiesForTesting(uint64_t ns) { copyDelayNs_.store(ns); }
  // Tests only: every committed move waits this long before publishing its copy, as a mover
  // preempted there would.
  static void delayPublicationsForTesting(uint64_t ns) { publishDelayNs_.store(ns); }
  // Tests only: the mover waits this long while holding a class's lock to begin a move, as a
  // mover preempted there would.
  static void delayLockHoldsForTesting(uint64_t ns) { holdDelayNs_.store(ns); }

 private:
  // A move under way: the entry held with the moving bit, a destination slot taken.
  struct Move {
    Entry* entry;
    uint64_t state;  // the entry's state before the move (live, no pin)
    uintptr_t from;
    uintptr_t to;
    unsigned sizeClass;
  };
  enum class Begin {
    kBegan,
    kBusy,      // pinned, held by another operation, or no place to go
    kNoObject,  // taken but no live entry names it: a thread cache's, or being allocated or freed
  };
  // At most this many moves, and this many bytes, per batch: one barrier for all of them.
  static constexpr unsigned kBatchMoves = 64;
  static constexpr size_t kBatchBytes = 64 << 10;
  // Starts moving the object in `slot` of `source` (its class's lock held).
  static Begin beginMoveLocked(Chunk* source, uint32_t slot, Move& move);
  static void copy(const Move& move);
  // Commits a copied move and publishes the copy; false if a pin cancelled it or a free took the
  // entry.
  static bool commit(const Move& move);
  // Copies, fences and commits a batch of begun moves, and frees for each the slot the object no
  // longer needs. How many moves committed.
  static unsigned moveBatch(const Move* moves, unsigned count, PassResult& result);
  // The mover's side of the asymmetric free, between a batch's moving bits and its commits:
  // false if no barrier could be had (nothing may commit then).
  static bool fenceFrees(const Move* moves, unsigned count);
  // Moves the objects of one source chunk; false if one could not move (slots with no live
  // object are skipped, and thread caches asked to give them back) or the budget ran out.
  static bool evacuate(Chunk* source, uint64_t deadlineNs, size_t maxMovedBytes,
                       PassResult& result);

  static inline Mutex passLock_{
      LockRank::kHandlePass};  // one pass at a time (mh_compact and the controller)
  static inline Mutex stepLock_{LockRank::kHandleStep};  // held while one class is evacuated
  static inline bool corruptMoves_ = false;
  static inline std::atomic<uint64_t> copyDelayNs_{0};
  static inline std::atomic<uint64_t> publishDelayNs_{0};
  static inline std::atomic<uint64_t> holdDelayNs_{0};
  // membarrier(2) failed after start-up (a seccomp filter installed since, say): frees use
  // the compare-and-swap from then on, and batches use os::interruptRunningThreads for the
  // frees begun before; where that cannot stand in either, no move commits any more.
  static inline bool membarrierLost_ = false;
  static inline bool barrierLost_ = false;
};

}  // namespace meshalloc::handles
