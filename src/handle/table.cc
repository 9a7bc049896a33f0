#include "handle/table.h"

#include "platform/os.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {
Mutex gInitLock;
}  // namespace

bool Table::init() {
  if (initialized_.load(std::memory_order_acquire)) return true;
  LockGuard guard(gInitLock);
  if (initialized_.load(std::memory_order_relaxed)) return true;
  // Lazily backed zero pages: an entry costs memory only once its page is touched.
  void* region = os::reserveAligned(size_t{kCapacity} * sizeof(Entry), os::pageSize());
  if (!region) return false;
  entries_ = static_cast<Entry*>(region);
  initialized_.store(true, std::memory_order_release);
  return true;
}

uint64_t Table::acquire() {
  if (!init()) return 0;
  uint32_t index;
  uint64_t head = freeHead_.load(std::memory_order_acquire);
  for (;;) {
    index = static_cast<uint32_t>(head & kIndexMask);
    if (index == kNoEntry) {
      index = highWater_.load(std::memory_order_relaxed);
      do {
        if (index >= kCapacity) return 0;
      } while (!highWater_.compare_exchange_weak(index, index + 1, std::memory_order_acq_rel));
      break;
    }
    // The entry may be taken and reused meanwhile: then the count in `head` is stale and the
    // exchange fails, whatever `next` read.
    uint64_t next = entries_[index].object.load(std::memory_order_relaxed) & kIndexMask;
    uint64_t replacement = ((head & ~kIndexMask) + (uint64_t{1} << 32)) | next;
    if (freeHead_.compare_exchange_weak(head, replacement, std::memory_order_acq_rel)) break;
  }
  Entry& entry = entries_[index];
  // A new generation (never 0, so that no handle of a never-used entry is valid), not live yet:
  // the caller publishes it once the object word is set.
  uint64_t generation = (entry.state.load(std::memory_order_relaxed) & kGenerationMask) +
                        (uint64_t{1} << kGenerationShift);
  generation &= kGenerationMask;
  if (generation == 0) generation = uint64_t{1} << kGenerationShift;
  entry.object.store(0, std::memory_order_relaxed);
  entry.state.store(generation, std::memory_order_relaxed);
  return makeHandle(index, generation);
}

void Table::release(uint32_t index) {
  Entry& entry = entries_[index];
  uint64_t head = freeHead_.load(std::memory_order_relaxed);
  do {
    entry.object.store(head & kIndexMask, std::memory_order_relaxed);
  } while (!freeHead_.compare_exchange_weak(
      head, ((head & ~kIndexMask) + (uint64_t{1} << 32)) | index, std::memory_order_acq_rel));
}

}  // namespace meshalloc::handles
