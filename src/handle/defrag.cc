#include "handle/defrag.h"

#include <string.h>

#include "handle/handles.h"
#include "handle/store.h"
#include "handle/table.h"
#include "handle/thread_cache.h"
#include "platform/os.h"

namespace meshalloc::handles {

namespace {

// Chunks fuller than this are not evacuated: the copies would cost more than the chunk gives.
constexpr unsigned kMaxSourceBin = Store::kOccupancyBins - 1;

// Tests' fault points: the mover stops there, as if it were preempted.
void pauseFor(uint64_t ns) {
  if (ns) os::sleepNanos(ns);
}

bool outOfBudget(const PassResult& result, uint64_t deadlineNs, size_t maxMovedBytes) {
  if (maxMovedBytes && result.movedBytes >= maxMovedBytes) return true;
  return deadlineNs && os::monotonicNanos() >= deadlineNs;
}

// The first slot at or after `slot` that holds an object; slotCount if none.
uint32_t nextUsedSlot(const Chunk* chunk, uint32_t slot) {
  const ClassLayout& l = Store::layout(chunk->sizeClass);
  while (slot < l.slotCount) {
    uint64_t used = ~chunk->freeBits[slot / 64] >> (slot % 64);
    if (used) {
      slot += static_cast<uint32_t>(__builtin_ctzll(used));
      return slot < l.slotCount ? slot : l.slotCount;
    }
    slot = (slot / 64 + 1) * 64;
  }
  return l.slotCount;
}

// A pin that cancels a move may write the object while it is being copied: the copy is then
// never published, but the race is real, so ThreadSanitizer is told to leave this copy alone
// (and the volatile reads keep the compiler from turning it into a memcpy call, which it would
// check anyway). Objects are 16-byte multiples, 16-byte aligned.
__attribute__((no_sanitize("thread"))) void copyObject(uintptr_t to, uintptr_t from, size_t bytes) {
  auto* source = reinterpret_cast<const volatile uint64_t*>(from);
  auto* destination = reinterpret_cast<uint64_t*>(to);
  for (size_t i = 0; i < bytes / sizeof(uint64_t); i++) destination[i] = source[i];
}

// Ends a hold that did not commit: clears the held bits, unless the entry was freed meanwhile
// (a free does not wait for a copy) and possibly reused, when the bits, if any, are another
// operation's, or a resize has taken the entry over (it clears them when done).
void releaseHeld(Entry& entry, uint64_t heldState) {
  uint64_t state = entry.state.load(std::memory_order_relaxed);
  while (!((state ^ heldState) & kGenerationMask) && (state & kLiveBit) && (state & kHeldBits) &&
         !(state & kResizeBit) &&
         !entry.state.compare_exchange_weak(state, state & ~kHeldBits, std::memory_order_release)) {
  }
}

// Ends a committed move's publication: clears the held bits, unless a free or a resize took the
// entry over meanwhile (they do not wait for the mover: handles.cc, objectUnderPin).
void endPublication(Entry& entry, uint64_t heldState) {
  uint64_t state = entry.state.load(std::memory_order_relaxed);
  while (!((state ^ heldState) & kGenerationMask) && (state & kLiveBit) &&
         (state & (kCommitBit | kResizeBit)) == kCommitBit &&
         !entry.state.compare_exchange_weak(state, state & ~kHeldBits, std::memory_order_release)) {
  }
}

}  // namespace

Defragmenter::Begin Defragmenter::beginMoveLocked(Chunk* source, uint32_t slot, Move& move) {
  uint32_t index = Store::ownerOf(source, slot);
  if (index >= Table::highWater()) return Begin::kNoObject;
  Entry& entry = Table::at(index);
  uint64_t state = entry.state.load(std::memory_order_acquire);
  if (!(state & kLiveBit)) return Begin::kNoObject;
  if (state & (kPinMask | kHeldBits)) return Begin::kBusy;
  if (!entry.state.compare_exchange_strong(state, state | kMovingBit, std::memory_order_acquire))
    return Begin::kBusy;
  uintptr_t from = Store::slotAddress(source, slot);
  uint64_t object = entry.object.load(std::memory_order_relaxed);
  // The entry may have been freed and reused, or resized, since the owner was read: then it
  // names another object, which this slot no longer is.
  unsigned sizeClass = source->sizeClass;
  if (addressOf(object) != from || classOfObject(object) != sizeClass) {
    releaseHeld(entry, state);
    return Begin::kNoObject;
  }
  uintptr_t to = Store::takeSlotInUsedChunkLocked(sizeClass, index);
  if (!to) {
    releaseHeld(entry, state);
    return Begin::kBusy;
  }
  move = {&entry, state, from, to, sizeClass};
  return Begin::kBegan;
}

void Defragmenter::copy(const Move& move) {
  size_t bytes = Store::layout(move.sizeClass).slotSize;
  copyObject(move.to, move.from, bytes);
  if (corruptMoves_) reinterpret_cast<unsigned char*>(move.to)[bytes / 2] ^= 1;
  pauseFor(copyDelayNs_.load(std::memory_order_relaxed));
}

bool Defragmenter::commit(const Move& move) {
  Entry& entry = *move.entry;
  uint64_t held = move.state | kMovingBit;
  uint64_t from = makeObject(move.from, move.sizeClass);
  uint64_t to = makeObject(move.to, move.sizeClass);
  // The copy's address, for whoever finds the entry committed before it is published. Release:
  // whoever reads these sees the previous move's end of publication (objectUnderPin).
  gPublishing.index.store(static_cast<uint32_t>(move.entry - &Table::at(0)),
                          std::memory_order_release);
  gPublishing.object.store(to, std::memory_order_release);
  // Commit only if no pin arrived (a pin holds the count up, a cancelled one left its bit) and
  // no free or resize took the entry (then it is not live, or holds other bits).
  if (entry.state.compare_exchange_strong(held, held | kCommitBit, std::memory_order_acq_rel)) {
    pauseFor(publishDelayNs_.load(std::memory_order_relaxed));
    // A resize that took the entry over may have stored the copy already, and replaced it since.
    entry.object.compare_exchange_strong(from, to, std::memory_order_relaxed);
    endPublication(entry, move.state);
    return true;
  }
  // A pin came (it holds the count up, or left the cancel bit), or a free took the entry.
  releaseHeld(entry, move.state);
  return false;
}

bool Defragmenter::fenceFrees(const Move* moves, unsigned count) {
  // Without the asymmetric free ever in use, every free is a compare-and-swap, which the
  // commit's orders by itself.
  if (!gFencedFrees.load(std::memory_order_relaxed)) return true;
  if (barrierLost_) return false;
  // The moving bits were set with locked compare-and-swaps, before this. Every thread now runs
  // a full barrier: a free whose announcement came before it is seen below; one whose
  // announcement came after it then loads the state and sees kMovingBit.
  if (!membarrierLost_ && !os::membarrierAllThreads()) {
    membarrierLost_ = true;
    ThreadCache::setAsymmetricFrees(false);
    static constexpr char kMessage[] =
        "meshalloc: membarrier(2) failed after it was registered; mh_free uses a "
        "compare-and-swap from now on\n";
    os::writeStderr(kMessage, sizeof(kMessage) - 1);
  }
  if (membarrierLost_ && !os::interruptRunningThreads()) {
    barrierLost_ = true;
    static constexpr char kMessage[] =
        "meshalloc: no barrier can replace membarrier(2) here; handle objects stop moving\n";
    os::writeStderr(kMessage, sizeof(kMessage) - 1);
    return false;
  }
  uint64_t handles[kBatchMoves];
  for (unsigned i = 0; i < count; i++)
    handles[i] = makeHandle(static_cast<uint32_t>(moves[i].entry - &Table::at(0)), moves[i].state);
  ThreadCache::waitForFrees(handles, count);
  return true;
}

unsigned Defragmenter::moveBatch(const Move* moves, unsigned count, PassResult& result) {
  if (count == 0) return 0;
  size_t slotSize = Store::layout(moves[0].sizeClass).slotSize;
  // Copying first gives the frees in flight time to end before the barrier's wait.
  for (unsigned i = 0; i < count; i++) copy(moves[i]);
  bool fenced = fenceFrees(moves, count);
  unsigned committed = 0;
  for (unsigned i = 0; i < count; i++) {
    const Move& move = moves[i];
    bool published = fenced && commit(move);
    if (!fenced) releaseHeld(*move.entry, move.state);
    {
      Store::ClassGuard guard(move.sizeClass, Store::Holder::kMover);
      // The slot the object no longer needs: the destination if a pin came first (it keeps the
      // object where it was), else the source.
      uintptr_t freed = published ? move.from : move.to;
      Chunk* chunk = Store::chunkOf(freed, move.sizeClass);
      Store::freeSlotLocked(chunk, Store::slotOf(chunk, freed));
    }
    if (!published) {
      gCounters.abandonedMoves.fetch_add(1, std::memory_order_relaxed);
      continue;
    }
    committed++;
    gCounters.movedObjects.fetch_add(1, std::memory_order_relaxed);
    gCounters.movedBytes.fetch_add(slotSize, std::memory_order_relaxed);
    result.movedBytes += slotSize;
  }
  return committed;
}

bool Defragmenter::evacuate(Chunk* source, uint64_t deadlineNs, size_t maxMovedBytes,
                            PassResult& result) {
  unsigned sizeClass = source->sizeClass;
  size_t slotSize = Store::layout(sizeClass).slotSize;
  uint32_t slotCount = Store::layout(sizeClass).slotCount;
  size_t batchMoves = kBatchBytes / slotSize;
  if (batchMoves > kBatchMoves) batchMoves = kBatchMoves;
  if (batchMoves == 0) batchMoves = 1;
  bool skipped = false;
  uint32_t slot = 0;
  for (;;) {
    Move moves[kBatchMoves];
    unsigned count = 0;
    bool stuck = false;  // an object that cannot move, or the budget ran out
    while (count < batchMoves) {
      PassResult pending = result;
      pending.movedBytes += count * slotSize;
      if (outOfBudget(pending, deadlineNs, maxMovedBytes)) {
        result.budgetExhausted = true;
        stuck = true;
        break;
      }
      // The class's lock is held to pick the slots of one object, not for the copy: each hold
      // is a bounded amount of work for one object.
      Begin began;
      {
        Store::ClassGuard guard(sizeClass, Store::Holder::kMover);
        slot = nextUsedSlot(source, slot);
        began = slot < slotCount ? beginMoveLocked(source, slot, moves[count]) : Begin::kBusy;
        pauseFor(holdDelayNs_.load(std::memory_order_relaxed));
      }
      if (slot == slotCount) break;
      slot++;
      if (began == Begin::kBusy) {
        stuck = true;
        break;
      }
      if (began == Begin::kNoObject) {
        // Most likely a thread cache's slot: ask for it back (the chunk empties once it comes
        // back, if the rest has moved) and go on with the other objects.
        if (!skipped) ThreadCache::requestReturn(sizeClass);
        skipped = true;
        continue;
      }
      count++;
    }
    // A pin that came first keeps its object here: the chunk cannot empty.
    if (moveBatch(moves, count, result) < count || stuck) return false;
    if (slot >= slotCount) return !skipped;
  }
}

PassResult Defragmenter::pass(uint64_t deadlineNs, size_t maxMovedBytes) {
  PassResult result;
  LockGuard passGuard(passLock_);
  uint64_t cpuStart = os::threadCpuNanos();
  for (unsigned sizeClass = 0; sizeClass < kNumSizeClasses && !result.budgetExhausted;
       sizeClass++) {
    size_t chunkBytes = Store::layout(sizeClass).chunkBytes;
    LockGuard stepGuard(stepLock_);
    // Sources a pinned object kept from emptying stay off the lists (linked through `next`)
    // until the class is done, so that the next sparsest chunk is tried instead.
    Chunk* blocked = nullptr;
    // With less than a chunk's worth of free slots, no chunk can be emptied.
    while (!result.budgetExhausted &&
           Store::classCommittedBytes(sizeClass) >= Store::classLiveBytes(sizeClass) + chunkBytes) {
      Chunk* source;
      {
        Store::ClassGuard guard(sizeClass, Store::Holder::kMover);
        source = Store::takeSourceLocked(sizeClass, kMaxSourceBin);
      }
      if (!source) break;
      evacuate(source, deadlineNs, maxMovedBytes, result);
      Store::ClassGuard guard(sizeClass, Store::Holder::kMover);
      if (source->liveCount == 0) {
        result.releasedBytes += chunkBytes;
        Store::endEvacuationLocked(source);
      } else if (result.budgetExhausted) {
        Store::endEvacuationLocked(source);
      } else {
        source->next = blocked;
        blocked = source;
      }
    }
    // One chunk per hold.
    while (blocked) {
      Store::ClassGuard guard(sizeClass, Store::Holder::kMover);
      Chunk* next = blocked->next;
      Store::endEvacuationLocked(blocked);
      blocked = next;
    }
  }
  // A full pass (mh_compact(0)) leaves no spare; others only those unused since the last pass.
  if (!result.budgetExhausted)
    result.releasedBytes += Store::releaseSpares(deadlineNs == 0 && maxMovedBytes == 0);
  gCounters.passes.fetch_add(1, std::memory_order_relaxed);
  gCounters.releasedBytes.fetch_add(result.releasedBytes, std::memory_order_relaxed);
  gCounters.cpuNs.fetch_add(os::threadCpuNanos() - cpuStart, std::memory_order_relaxed);
  return result;
}

const heap::ForkParticipant& Defragmenter::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant = {
      "handle defragmenter", heap::ForkRank::kHandles, [] { stepLock_.lock(); },
      [] { stepLock_.unlock(); },
      [] {
        stepLock_.resetAfterFork();
        passLock_.resetAfterFork();
      }};
  return kParticipant;
}

}  // namespace meshalloc::handles
