// The defragmenter's controller (Anchorage's, ASPLOS 2024 section 4.3), a thread of its own
// started by the first handle allocation: it wakes every handles_period_ms and measures the
// fragmentation of the handle store (committed bytes over live bytes). Above the high bound it
// runs passes, each moving at most handles_move_permille of the committed bytes, and sleeps
// after each so that its CPU time stays within handles_budget_permille of the wall time; it
// stops below the low bound, or when a pass gains nothing (until the store changes).
#pragma once

#include <atomic>
#include <cstdint>

#include "heap/fork.h"

namespace meshalloc::handles {

class Controller {
 public:
  // Called by every allocation: starts the thread the first time (a load, then nothing).
  static void noteAllocation() {
    if (__builtin_expect(!started_.load(std::memory_order_relaxed), 0)) start();
  }
  static bool running() { return started_.load(std::memory_order_relaxed) && !failed_; }
  // For fork (registered by handles::initialize): the thread does not survive it, so the
  // child's next allocation starts its own.
  static const heap::ForkParticipant& forkParticipant();

  // The controller's decision for one wake-up, given the store's committed and live bytes and
  // whether it was active: true to run a pass. Public for tests.
  static bool shouldRun(size_t committedBytes, size_t liveBytes, bool active);

 private:
  static void start();
  static void* main(void*);

  static inline std::atomic<bool> started_{false};
  static inline bool failed_ = false;
};

}  // namespace meshalloc::handles
