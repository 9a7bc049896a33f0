// The handle table: one 16-byte entry per handle in a region reserved once at a fixed address
// and never moved, so a handle reaches its entry by indexing alone, without a lock. An entry
// holds an atomic state word (pin count, the moving bit, the live bit, the generation) and an
// atomic object word (the object's address and size class). Pinning is one atomic add on the
// state word; the defragmenter and mh_realloc take an entry exclusively by setting the moving
// bit when no pin is held (docs/handles.md, "Pinning and moving").
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"

namespace meshalloc::handles {

// A handle: bit 63 set (user-space pointers never have it on x86-64 and AArch64 Linux, so a
// handle cannot be taken for a pointer, nor MH_NULL for a handle), the generation in bits
// 32..62 (the same bits as in the entry's state word), the table index in bits 0..31.
constexpr uint64_t kHandleTag = uint64_t{1} << 63;
constexpr unsigned kGenerationShift = 32;
constexpr uint64_t kGenerationMask = ((uint64_t{1} << 31) - 1) << kGenerationShift;
constexpr uint64_t kIndexMask = (uint64_t{1} << 32) - 1;

// The state word: the pin count in bits 0..23, then the flags, the generation in bits 32..62.
constexpr uint64_t kPinMask = (uint64_t{1} << 24) - 1;
// Set while a move or a resize holds the entry. A move can be cancelled until it commits: a pin
// that finds kMovingBit without kCommitBit sets kCancelBit and uses the object where it is (the
// mover publishes nothing then). kCommitBit is set by a move that has committed and is
// publishing its copy: nobody waits for it, the copy's address is in the mover's record
// (handles::gPublishing). kResizeBit (with the other two) is held by a resize from start to
// end: a pin that finds it waits, for that entry only (a resize is the program's own call).
constexpr uint64_t kMovingBit = uint64_t{1} << 24;
constexpr uint64_t kLiveBit = uint64_t{1} << 25;
constexpr uint64_t kCommitBit = uint64_t{1} << 26;
constexpr uint64_t kCancelBit = uint64_t{1} << 27;
constexpr uint64_t kResizeBit = uint64_t{1} << 28;
constexpr uint64_t kHeldBits = kMovingBit | kCommitBit | kCancelBit | kResizeBit;

// The object word: the address in bits 0..55, the store's size class in bits 56..63.
constexpr unsigned kObjectClassShift = 56;
constexpr uint64_t kObjectAddressMask = (uint64_t{1} << kObjectClassShift) - 1;

struct alignas(16) Entry {
  std::atomic<uint64_t> state;
  // A free entry keeps the index of the next free entry here.
  std::atomic<uint64_t> object;
};

inline uint32_t indexOf(uint64_t handle) {
  return static_cast<uint32_t>(handle & kIndexMask);
}
inline uint64_t makeHandle(uint32_t index, uint64_t state) {
  return kHandleTag | (state & kGenerationMask) | index;
}
inline uintptr_t addressOf(uint64_t object) {
  return static_cast<uintptr_t>(object & kObjectAddressMask);
}
inline unsigned classOfObject(uint64_t object) {
  return static_cast<unsigned>(object >> kObjectClassShift);
}
inline uint64_t makeObject(uintptr_t address, unsigned storeClass) {
  return static_cast<uint64_t>(address) | (static_cast<uint64_t>(storeClass) << kObjectClassShift);
}

class Table {
 public:
  // Handles that can be live at once: 2^28 entries reserve 4 GiB of address space, of which
  // only the pages of entries ever used are touched.
  static constexpr uint32_t kCapacity = uint32_t{1} << 28;

  // Reserves the region; false if the address space cannot be had. Idempotent, thread-safe.
  static bool init();
  // Up to `count` free entries (not live) into `indices`: from the free stack, or else new ones
  // past the high-water mark; how many (0 when the table is full or cannot be reserved).
  // Thread caches take and give back entries in batches, one lock for the whole batch.
  static unsigned acquireBatch(uint32_t* indices, unsigned count);
  // Puts back `count` entries that are not live (freed, or never published).
  static void releaseBatch(const uint32_t* indices, unsigned count);
  // Gives a free entry its next generation (not live yet) and returns its handle. The caller
  // sets the object word, then the live bit.
  static uint64_t renew(uint32_t index) {
    Entry& entry = entries_[index];
    uint64_t generation = nextGeneration(entry.state.load(std::memory_order_relaxed));
    entry.state.store(generation, std::memory_order_relaxed);
    return makeHandle(index, generation);
  }
  // The generation after the one in `state` (in place, bits 32..62), never 0, so that no
  // handle of a never-used entry is valid.
  static uint64_t nextGeneration(uint64_t state) {
    // Nothing below bit 32 carries into the generation, and bit 63 is never set in a state.
    uint64_t generation = (state + (uint64_t{1} << kGenerationShift)) & kGenerationMask;
    return generation ? generation : uint64_t{1} << kGenerationShift;
  }

  // Whether `handle` names an entry ever handed out (its tag, and an index below the
  // high-water mark); its generation is not checked here.
  static bool names(uint64_t handle) {
    return (handle & kHandleTag) && indexOf(handle) < highWater_.load(std::memory_order_acquire);
  }
  // The entry of `handle`, or nullptr if it does not name one.
  static Entry* find(uint64_t handle) {
    if (__builtin_expect(!names(handle), 0)) return nullptr;
    return &entries_[indexOf(handle)];
  }
  static Entry& at(uint32_t index) { return entries_[index]; }
  // Entries ever handed out: live ones, free ones, never more than kCapacity.
  static uint32_t highWater() { return highWater_.load(std::memory_order_acquire); }
  // The entries ever used and at most as many places on the free stack.
  static size_t touchedBytes() { return size_t{highWater()} * (sizeof(Entry) + sizeof(uint32_t)); }

  // Fork: the free stack is not half updated while the process is copied.
  // Its free-list lock, for fork (registered by handles::initialize).
  static const heap::ForkParticipant& forkParticipant();

  // True if the state word of `entry` names the live object of `handle`.
  static bool matches(uint64_t state, uint64_t handle) {
    return (state & kLiveBit) && !((state ^ handle) & kGenerationMask);
  }

 private:
  static inline Entry* entries_ = nullptr;
  static inline std::atomic<uint32_t> highWater_{0};
  // The indices of free entries, a stack in a region reserved beside the table (4 bytes per
  // entry, touched only as deep as it has been), under its lock (in table.cc). An array rather
  // than a list through the entries: a batch is one copy, not a walk of cache misses.
  static inline uint32_t* freeStack_ = nullptr;
  static inline uint32_t freeCount_ = 0;
  static inline std::atomic<bool> initialized_{false};
};

}  // namespace meshalloc::handles
