#include "heap/operation_guard.h"

#include "heap/thread_heap.h"
#include "platform/os.h"
#include "support/lock.h"

namespace meshalloc {

namespace {
// Waiting for operations in flight: they are short (a few atomics, at most a class lock that
// the mesher does not hold while pausing), so yield first; a thread preempted inside one
// (many threads on few cores) is waited for without burning the core.
constexpr unsigned kYieldsBeforeSleeping = 16;
constexpr uint64_t kSleepNanos = 20000;
// A guarded operation that meets a pause spins for kPauseSpinNanos, then yields until
// kPauseAwakeNanos, then sleeps; it reads the clock every kSpinsPerClockRead spins.
constexpr uint64_t kPauseSpinNanos = 5000;
constexpr uint64_t kPauseAwakeNanos = 50000;
constexpr unsigned kSpinsPerClockRead = 16;
void waitUntilZero(const std::atomic<uint32_t>& counter) {
  for (unsigned i = 0; counter.load(std::memory_order_seq_cst) != 0; i++) {
    if (i < kYieldsBeforeSleeping) {
      os::yieldThread();
    } else {
      os::sleepNanos(kSleepNanos);
    }
  }
}
}  // namespace

void OperationGuard::init() {
#if defined(__SANITIZE_THREAD__)
  // ThreadSanitizer cannot see the barrier membarrier(2) executes on our behalf.
  asymmetric_.store(false, std::memory_order_relaxed);
#else
  asymmetric_.store(os::registerMembarrier(), std::memory_order_relaxed);
#endif
}

OperationGuard::OperationGuard() {
  ThreadHeap* heap = tlsThreadHeap;
  shared_ = heap == nullptr || !asymmetric_.load(std::memory_order_relaxed);
  if (shared_) {
    // Threads without a heap share one counter; without membarrier every thread pays for
    // the fence itself. Both use atomic read-modify-writes (full fences).
    slot_ = heap ? &heap->activity().operationsInFlight : &unregisteredInFlight_;
    for (;;) {
      uint32_t before = slot_->fetch_add(1, std::memory_order_seq_cst);
      if (heap && before > 0) return;  // nested on this thread: the outer guard is counted
      if (!paused_.load(std::memory_order_seq_cst)) return;
      slot_->fetch_sub(1, std::memory_order_seq_cst);
      waitWhilePaused();
    }
  }
  slot_ = &heap->activity().operationsInFlight;
  for (;;) {
    // Only this thread writes its own slot, so a plain load and store suffice.
    uint32_t before = slot_->load(std::memory_order_relaxed);
    slot_->store(before + 1, std::memory_order_relaxed);
    // A nested guard on this thread must not wait: the mesher is waiting for the outer one.
    if (before > 0) return;
    std::atomic_signal_fence(std::memory_order_seq_cst);  // the mesher's membarrier is the fence
    if (!paused_.load(std::memory_order_relaxed)) return;
    slot_->store(before, std::memory_order_release);
    waitWhilePaused();
  }
}

OperationGuard::~OperationGuard() {
  if (shared_) {
    slot_->fetch_sub(1, std::memory_order_release);
  } else {
    slot_->store(slot_->load(std::memory_order_relaxed) - 1, std::memory_order_release);
  }
}

void OperationGuard::waitWhilePaused() {
  // A pause is a few atomics per meshed span, microseconds: wait it out awake. Sleeping costs
  // the waiter a context switch and a wake-up, more than the pause itself (an event loop such
  // as Redis's met a pause about 200 times in one LRU insertion). Spinning first, then
  // yielding, so that a pauser waiting for this CPU gets it; a pause that outlasts both (its
  // commit thread preempted) is waited for asleep.
  uint64_t start = 0;
  for (unsigned i = 0; paused_.load(std::memory_order_acquire); i++) {
    if (i % kSpinsPerClockRead != 0) {
      cpuRelax();
      continue;
    }
    uint64_t now = os::monotonicNanos();
    if (start == 0) start = now;
    if (now - start >= kPauseAwakeNanos) break;
    if (now - start >= kPauseSpinNanos) os::yieldThread();
  }
  while (paused_.load(std::memory_order_acquire)) os::futexWait(&paused_, 1);
}

uint64_t OperationGuard::pause() {
  paused_.store(1, std::memory_order_seq_cst);
  // Every thread now runs a full barrier: its slot increment is visible to the loop below, or
  // its check of paused_ comes after this point and sees 1.
  if (asymmetric_.load(std::memory_order_relaxed) && !os::membarrierAllThreads()) {
    // A seccomp filter installed after start-up, say. New guards pay for their own fence from
    // now on; one begun under the old protocol may be anywhere, this pause included.
    asymmetric_.store(false, std::memory_order_seq_cst);
    membarrierLost_.store(true, std::memory_order_relaxed);
    static constexpr char kMessage[] =
        "meshalloc: membarrier(2) failed after it was registered; slower guarded operations from "
        "now on\n";
    os::writeStderr(kMessage, sizeof(kMessage) - 1);
  }
  if (membarrierLost_.load(std::memory_order_relaxed) && !os::interruptRunningThreads() &&
      !barrierLost_.exchange(true, std::memory_order_relaxed)) {
    static constexpr char kMessage[] =
        "meshalloc: no barrier can replace membarrier(2) here; meshing stops\n";
    os::writeStderr(kMessage, sizeof(kMessage) - 1);
  }
  uint64_t waitStart = os::monotonicNanos();
  ThreadHeap::lockRegistry();
  for (ThreadHeap* heap = ThreadHeap::registryHead(); heap; heap = heap->nextInRegistry()) {
    waitUntilZero(heap->activity().operationsInFlight);
  }
  ThreadHeap::unlockRegistry();
  waitUntilZero(unregisteredInFlight_);
  return os::monotonicNanos() - waitStart;
}

void OperationGuard::resume() {
  paused_.store(0, std::memory_order_seq_cst);
  os::futexWakeAll(&paused_);
}

}  // namespace meshalloc
