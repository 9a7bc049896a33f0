#include "handle/table.h"

#include <string.h>

#include "platform/os.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {
Mutex gInitLock;
Mutex gFreeLock{LockRank::kHandleTable};
}  // namespace

bool Table::init() {
  if (initialized_.load(std::memory_order_acquire)) return true;
  LockGuard guard(gInitLock);
  if (initialized_.load(std::memory_order_relaxed)) return true;
  // Lazily backed zero pages: an entry costs memory only once its page is touched.
  void* region = os::reserveAligned(size_t{kCapacity} * sizeof(Entry), os::pageSize());
  if (!region) return false;
  void* stack = os::reserveAligned(size_t{kCapacity} * sizeof(uint32_t), os::pageSize());
  if (!stack) return false;
  entries_ = static_cast<Entry*>(region);
  freeStack_ = static_cast<uint32_t*>(stack);
  initialized_.store(true, std::memory_order_release);
  return true;
}

unsigned Table::acquireBatch(uint32_t* indices, unsigned count) {
  if (!init()) return 0;
  LockGuard guard(gFreeLock);
  if (freeCount_) {
    unsigned taken = freeCount_ < count ? freeCount_ : count;
    freeCount_ -= taken;
    memcpy(indices, freeStack_ + freeCount_, taken * sizeof(uint32_t));
    return taken;
  }
  // The stack is empty: new entries.
  uint32_t first = highWater_.load(std::memory_order_relaxed);
  uint32_t taken = kCapacity - first < count ? kCapacity - first : count;
  for (uint32_t i = 0; i < taken; i++) indices[i] = first + i;
  highWater_.store(first + taken, std::memory_order_release);
  return taken;
}

void Table::releaseBatch(const uint32_t* indices, unsigned count) {
  LockGuard guard(gFreeLock);
  memcpy(freeStack_ + freeCount_, indices, count * sizeof(uint32_t));
  freeCount_ += count;
}

const heap::ForkParticipant& Table::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant =
      heap::mutexForkParticipant<gFreeLock>("handle table", heap::ForkRank::kHandles);
  return kParticipant;
}

}  // namespace meshalloc::handles
