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

unsigned Table::acquireBatch(uint32_t* indices, unsigned count) {
  if (!init() || count == 0) return 0;
  uint64_t head = freeHead_.load(std::memory_order_acquire);
  for (;;) {
    uint32_t index = static_cast<uint32_t>(head & kIndexMask);
    if (index == kNoEntry) break;
    // Walk up to `count` entries. They may be taken and reused meanwhile: then the change count
    // in `head` is stale and the exchange fails, whatever the walk read.
    unsigned taken = 0;
    uint64_t next = index;
    while (taken < count && next != kNoEntry) {
      indices[taken++] = static_cast<uint32_t>(next);
      next = entries_[next].object.load(std::memory_order_relaxed) & kIndexMask;
      if (next != kNoEntry && next >= highWater_.load(std::memory_order_relaxed)) break;
    }
    uint64_t replacement = ((head & ~kIndexMask) + (uint64_t{1} << 32)) | next;
    if (freeHead_.compare_exchange_weak(head, replacement, std::memory_order_acq_rel)) return taken;
  }
  // The free list is empty: new entries.
  uint32_t first = highWater_.load(std::memory_order_relaxed);
  uint32_t taken;
  do {
    if (first >= kCapacity) return 0;
    taken = kCapacity - first < count ? kCapacity - first : count;
  } while (!highWater_.compare_exchange_weak(first, first + taken, std::memory_order_acq_rel));
  for (uint32_t i = 0; i < taken; i++) indices[i] = first + i;
  return taken;
}

void Table::releaseBatch(const uint32_t* indices, unsigned count) {
  if (count == 0) return;
  // Chained through their object words, the last one onto the list's head.
  for (unsigned i = 0; i + 1 < count; i++)
    entries_[indices[i]].object.store(indices[i + 1], std::memory_order_relaxed);
  Entry& last = entries_[indices[count - 1]];
  uint64_t head = freeHead_.load(std::memory_order_relaxed);
  do {
    last.object.store(head & kIndexMask, std::memory_order_relaxed);
  } while (!freeHead_.compare_exchange_weak(
      head, ((head & ~kIndexMask) + (uint64_t{1} << 32)) | indices[0], std::memory_order_acq_rel));
}

}  // namespace meshalloc::handles
