#include "handle/defrag.h"

#include <string.h>

#include "handle/handles.h"
#include "handle/store.h"
#include "handle/table.h"
#include "platform/os.h"

namespace meshalloc::handles {

namespace {

// Chunks fuller than this are not evacuated: the copies would cost more than the chunk gives.
constexpr unsigned kMaxSourceBin = Store::kOccupancyBins - 1;

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

}  // namespace

bool Defragmenter::moveLocked(Chunk* source, uint32_t slot) {
  uint32_t index = Store::owners(source)[slot];
  if (index >= Table::highWater()) return false;
  Entry& entry = Table::at(index);
  uint64_t state = entry.state.load(std::memory_order_acquire);
  if (!(state & kLiveBit) || (state & (kPinMask | kMovingBit))) return false;
  if (!entry.state.compare_exchange_strong(state, state | kMovingBit, std::memory_order_acquire))
    return false;
  uintptr_t from = Store::slotAddress(source, slot);
  uint64_t object = entry.object.load(std::memory_order_relaxed);
  // The entry may have been freed and reused, or resized, since the owner was read: then it
  // names another object, which this slot no longer is.
  unsigned sizeClass = source->sizeClass;
  uintptr_t to = 0;
  if (addressOf(object) == from && classOfObject(object) == sizeClass)
    to = Store::takeSlotInUsedChunkLocked(sizeClass, index);
  if (!to) {
    entry.state.fetch_and(~kMovingBit, std::memory_order_release);
    return false;
  }
  size_t bytes = Store::layout(sizeClass).slotSize;
  memcpy(reinterpret_cast<void*>(to), reinterpret_cast<const void*>(from), bytes);
  if (corruptMoves_) reinterpret_cast<unsigned char*>(to)[bytes / 2] ^= 1;
  entry.object.store(makeObject(to, sizeClass), std::memory_order_relaxed);
  uint64_t held = state | kMovingBit;
  // Publish, only if no pin arrived during the copy (state has no pin).
  if (entry.state.compare_exchange_strong(held, state, std::memory_order_acq_rel)) {
    Store::freeSlotLocked(source, slot);
    gCounters.movedObjects.fetch_add(1, std::memory_order_relaxed);
    gCounters.movedBytes.fetch_add(bytes, std::memory_order_relaxed);
    return true;
  }
  // A pin came first: it keeps the object where it was.
  entry.object.store(object, std::memory_order_relaxed);
  entry.state.fetch_and(~kMovingBit, std::memory_order_release);
  Chunk* destination = Store::chunkOf(to, sizeClass);
  Store::freeSlotLocked(destination, Store::slotOf(destination, to));
  gCounters.abandonedMoves.fetch_add(1, std::memory_order_relaxed);
  return false;
}

bool Defragmenter::evacuate(Chunk* source, uint64_t deadlineNs, size_t maxMovedBytes,
                            PassResult& result) {
  unsigned sizeClass = source->sizeClass;
  size_t slotSize = Store::layout(sizeClass).slotSize;
  uint32_t slot = 0;
  for (;;) {
    if (outOfBudget(result, deadlineNs, maxMovedBytes)) {
      result.budgetExhausted = true;
      return false;
    }
    // The lock is taken per object: the class's allocations and frees wait for one copy only.
    LockGuard guard(Store::classLock(sizeClass));
    slot = nextUsedSlot(source, slot);
    if (slot == Store::layout(sizeClass).slotCount) return true;
    if (!moveLocked(source, slot)) return false;
    result.movedBytes += slotSize;
    slot++;
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
        LockGuard guard(Store::classLock(sizeClass));
        source = Store::takeSourceLocked(sizeClass, kMaxSourceBin);
      }
      if (!source) break;
      evacuate(source, deadlineNs, maxMovedBytes, result);
      LockGuard guard(Store::classLock(sizeClass));
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
    LockGuard guard(Store::classLock(sizeClass));
    while (blocked) {
      Chunk* next = blocked->next;
      Store::endEvacuationLocked(blocked);
      blocked = next;
    }
  }
  if (!result.budgetExhausted) result.releasedBytes += Store::releaseSpares();
  gCounters.passes.fetch_add(1, std::memory_order_relaxed);
  gCounters.releasedBytes.fetch_add(result.releasedBytes, std::memory_order_relaxed);
  gCounters.cpuNs.fetch_add(os::threadCpuNanos() - cpuStart, std::memory_order_relaxed);
  return result;
}

}  // namespace meshalloc::handles
