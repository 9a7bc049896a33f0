// Slow-path operations that resolve a pointer to its span record (remote free, realloc,
// malloc_usable_size) run inside an OperationGuard. The mesher rewrites the page map and
// retires the span records it meshed away; before it does, it pauses new guarded operations and
// waits for those in flight, so none of them can hold a span record that is about to vanish. The
// owner-local free fast path is not guarded: it validates its span against the thread's own
// shuffle vector instead (see heap.h).
//
// The same per-thread record publishes the user buffer of a system call in progress, so the
// mesher never write-protects memory the kernel is about to write into (see api/io_exports.cc).
#pragma once

#include <atomic>
#include <cstdint>

namespace meshalloc {

class ThreadHeap;

struct ThreadActivity {
  std::atomic<uint32_t> operationsInFlight{0};
  std::atomic<uintptr_t> ioBufferStart{0};
  std::atomic<uintptr_t> ioBufferEnd{0};
};

class OperationGuard {
 public:
  OperationGuard();
  ~OperationGuard();
  OperationGuard(const OperationGuard&) = delete;
  OperationGuard& operator=(const OperationGuard&) = delete;

  // Chooses the fence protocol (once, at heap start-up). With membarrier(2), the guard's
  // fast side needs no fence instruction at all: the mesher makes every running thread
  // execute one instead (an asymmetric Dekker handshake).
  static void init();
  // For the mesher: returns once no guarded operation is in flight; new ones wait in their
  // constructor until resume(). Returns how long it waited for those in flight, in ns.
  static uint64_t pause();
  static void resume();
  static bool paused() { return paused_.load(std::memory_order_seq_cst) != 0; }
  // Whether guards use the asymmetric protocol (membarrier registered and never failed).
  static bool asymmetric() { return asymmetric_.load(std::memory_order_relaxed); }
  // False once membarrier failed where no other barrier can stand in for it: the mesher then
  // stops meshing (see pause()).
  static bool barrierAvailable() { return !barrierLost_.load(std::memory_order_relaxed); }
  // Blocks while paused (for callers that hold no guard).
  static void waitWhilePaused();
  // In a forked child: only the forking thread exists, and it is in no guarded operation.
  static void resetAfterFork() {
    paused_.store(0, std::memory_order_relaxed);
    unregisteredInFlight_.store(0, std::memory_order_relaxed);
  }

 private:
  std::atomic<uint32_t>* slot_;
  bool shared_;
  static inline std::atomic<bool> asymmetric_{false};
  // membarrier failed once: guards use the shared protocol from then on, and every pause ends
  // with os::interruptRunningThreads() for any guard begun under the asymmetric one.
  static inline std::atomic<bool> membarrierLost_{false};
  static inline std::atomic<bool> barrierLost_{false};
  static inline std::atomic<uint32_t> paused_{0};
  static inline std::atomic<uint32_t> unregisteredInFlight_{0};
};

}  // namespace meshalloc
