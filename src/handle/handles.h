// The handle operations behind include/meshalloc_handle.h: allocation, resizing and freeing
// through the handle table and the store, and pinning. Pinning is inline: one atomic add on
// the entry's state word, whose previous value says at once whether the handle is live with
// this generation and whether a move holds the entry (then pinSlow waits for that entry alone).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "handle/table.h"

namespace meshalloc::handles {

// Counters shared by the operations, the defragmenter and the statistics.
struct Counters {
  std::atomic<uint64_t> movedObjects{0};
  std::atomic<uint64_t> movedBytes{0};
  std::atomic<uint64_t> abandonedMoves{0};  // a pin arrived during the copy
  std::atomic<uint64_t> passes{0};
  std::atomic<uint64_t> releasedBytes{0};  // given back to the OS by passes
  std::atomic<uint64_t> cpuNs{0};          // CPU time of passes
  std::atomic<uint64_t> waits{0};          // a pin, free or realloc waited for a move
  std::atomic<uint64_t> waitMaxNs{0};
  std::atomic<uint64_t> waitTotalNs{0};
  // The longest a move held its class's lock (allocation and freeing in the class wait that
  // long at most, unless the mover is preempted meanwhile, which this includes).
  std::atomic<uint64_t> moveHoldMaxNs{0};
};

// Raises `maximum` to `value`.
inline void raiseMaximum(std::atomic<uint64_t>& maximum, uint64_t value) {
  uint64_t seen = maximum.load(std::memory_order_relaxed);
  while (value > seen && !maximum.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}
inline Counters gCounters;

// Registers the fork participant and plans the store; idempotent. False if the heap could not
// be initialised.
bool initialize();
inline std::atomic<bool> gInitialized{false};
inline bool ensureInitialized() {
  if (__builtin_expect(gInitialized.load(std::memory_order_acquire), 1)) return true;
  return initialize();
}

// MH_NULL (0) with errno ENOMEM on failure.
uint64_t allocate(size_t size);
uint64_t allocateZeroed(size_t count, size_t size);
uint64_t reallocate(uint64_t handle, size_t size);
void free(uint64_t handle);
size_t usableSize(uint64_t handle);
// One defragmentation pass until `deadlineNs` (monotonic; 0: until done), after the calling
// thread gave back what its cache holds (mh_compact, handles.compact): the bytes given back.
size_t compact(uint64_t deadlineNs);
// Handles whose objects are pinned now (a walk of the table).
size_t pinnedCount();

[[noreturn]] void reportInvalid(uint64_t handle, const char* operation);
void* pinSlow(uint64_t handle, Entry* entry, uint64_t previous);
[[noreturn]] void unpinFailed(uint64_t handle, uint64_t previous);

inline void* pin(uint64_t handle) {
  Entry* entry = Table::find(handle);
  if (__builtin_expect(entry == nullptr, 0)) reportInvalid(handle, "mh_pin");
  uint64_t previous = entry->state.fetch_add(1, std::memory_order_acquire);
  // Live, this generation, not moving, and the count not about to overflow.
  if (__builtin_expect((previous & (kGenerationMask | kLiveBit | kMovingBit)) !=
                               ((handle & kGenerationMask) | kLiveBit) ||
                           (previous & kPinMask) == kPinMask - 1,
                       0))
    return pinSlow(handle, entry, previous);
  return reinterpret_cast<void*>(addressOf(entry->object.load(std::memory_order_relaxed)));
}

inline void unpin(uint64_t handle) {
  Entry* entry = Table::find(handle);
  if (__builtin_expect(entry == nullptr, 0)) reportInvalid(handle, "mh_unpin");
  // Release: the writes made through the pointer come before any move that sees no pin.
  uint64_t previous = entry->state.fetch_sub(1, std::memory_order_release);
  if (__builtin_expect(!Table::matches(previous, handle) || (previous & kPinMask) == 0, 0))
    unpinFailed(handle, previous);
}

}  // namespace meshalloc::handles
