#include "heap/operation_guard.h"

#include <sched.h>

#include "heap/thread_heap.h"
#include "platform/os.h"

namespace meshalloc {

namespace {
// Waiting for operations in flight: they are short (a few atomics, at most a class lock that
// the mesher does not hold while pausing), so spinning with yields is enough.
void relax() { sched_yield(); }
}  // namespace

OperationGuard::OperationGuard() {
  ThreadHeap* heap = tlsThreadHeap;
  slot_ = heap ? &heap->activity().operationsInFlight : &unregisteredInFlight_;
  for (;;) {
    uint32_t before = slot_->fetch_add(1, std::memory_order_seq_cst);
    // A nested guard on this thread must not wait: the mesher is waiting for the outer one.
    if (heap && before > 0) return;
    if (!paused_.load(std::memory_order_seq_cst)) return;
    slot_->fetch_sub(1, std::memory_order_seq_cst);
    waitWhilePaused();
  }
}

OperationGuard::~OperationGuard() { slot_->fetch_sub(1, std::memory_order_release); }

void OperationGuard::waitWhilePaused() {
  while (paused_.load(std::memory_order_acquire)) os::futexWait(&paused_, 1);
}

void OperationGuard::pause() {
  paused_.store(1, std::memory_order_seq_cst);
  ThreadHeap::lockRegistry();
  for (ThreadHeap* heap = ThreadHeap::registryHead(); heap; heap = heap->nextInRegistry()) {
    while (heap->activity().operationsInFlight.load(std::memory_order_seq_cst) != 0) relax();
  }
  ThreadHeap::unlockRegistry();
  while (unregisteredInFlight_.load(std::memory_order_seq_cst) != 0) relax();
}

void OperationGuard::resume() {
  paused_.store(0, std::memory_order_seq_cst);
  os::futexWakeAll(&paused_);
}

}  // namespace meshalloc
