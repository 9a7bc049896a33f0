// The defragmenter: moves the objects of a class's sparsest chunks into free slots of its
// fullest ones, then gives the emptied chunks back to the OS. A move runs concurrently with
// the program: it takes the object's entry with the moving bit only while no pin is held,
// copies, and publishes the new address with one compare-and-swap that fails if a pin arrived
// meanwhile (the copy is then dropped and the pinner, which waited for that entry only, gets
// the old address). Pinned objects are never moved. Each object moves under its class's lock
// alone, so allocation and freeing in that class wait at most one copy.
#pragma once

#include <cstddef>
#include <cstdint>

#include "support/lock.h"

namespace meshalloc::handles {

struct Chunk;

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

  // Fork: no class is half evacuated while the process is copied.
  static void lockForFork() { stepLock_.lock(); }
  static void unlockAfterFork() { stepLock_.unlock(); }
  static void resetAfterFork() {
    stepLock_.resetAfterFork();
    passLock_.resetAfterFork();
  }

  // Tests only: every move copies one byte wrong (the randomised tests must then fail).
  static void corruptMovesForTesting(bool on) { corruptMoves_ = on; }

 private:
  // Moves the object in `slot` of `source` (its class's lock held); false if it is pinned, held
  // by another operation, or has no place to go.
  static bool moveLocked(Chunk* source, uint32_t slot);
  // Moves the objects of one source chunk; false if one could not move or the budget ran out.
  static bool evacuate(Chunk* source, uint64_t deadlineNs, size_t maxMovedBytes,
                       PassResult& result);

  static inline Mutex passLock_;  // one pass at a time (mh_compact and the controller)
  static inline Mutex stepLock_;  // held while one class is evacuated
  static inline bool corruptMoves_ = false;
};

}  // namespace meshalloc::handles
