// A futex-based mutex that never allocates: the allocator cannot use pthread_mutex in places
// where it must also survive fork handlers and early start-up.
#pragma once

#include <atomic>
#include <cstdint>

#include "platform/os.h"

namespace meshalloc {

// A spin-wait hint: lets the sibling hyperthread (or the hypervisor) run meanwhile.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

class Mutex {
 public:
  constexpr Mutex() = default;
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() {
    uint32_t expected = kUnlocked;
    if (__builtin_expect(
            state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire), 1)) {
      return;
    }
    lockSlow();
  }

  bool tryLock() {
    uint32_t expected = kUnlocked;
    return state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire);
  }

  void unlock() {
    if (state_.exchange(kUnlocked, std::memory_order_release) == kContended)
      os::futexWakeOne(&state_);
  }

  // After fork() only the forking thread exists; a lock it took in the prepare handler is
  // simply reset rather than unlocked, since no waiter can exist in the child.
  void resetAfterFork() { state_.store(kUnlocked, std::memory_order_relaxed); }

 private:
  static constexpr uint32_t kUnlocked = 0;
  static constexpr uint32_t kLocked = 1;
  static constexpr uint32_t kContended = 2;
  static constexpr int kSpinsBeforeSleeping = 100;

  void lockSlow() {
    for (int i = 0; i < kSpinsBeforeSleeping; i++) {
      uint32_t expected = kUnlocked;
      if (state_.load(std::memory_order_relaxed) == kUnlocked &&
          state_.compare_exchange_weak(expected, kLocked, std::memory_order_acquire)) {
        return;
      }
      cpuRelax();
    }
    while (state_.exchange(kContended, std::memory_order_acquire) != kUnlocked) {
      os::futexWait(&state_, kContended);
    }
  }

  std::atomic<uint32_t> state_{kUnlocked};
};

class LockGuard {
 public:
  explicit LockGuard(Mutex& mutex) : mutex_(mutex) { mutex_.lock(); }
  ~LockGuard() { mutex_.unlock(); }
  LockGuard(const LockGuard&) = delete;
  LockGuard& operator=(const LockGuard&) = delete;

 private:
  Mutex& mutex_;
};

}  // namespace meshalloc
