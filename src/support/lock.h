// A futex-based mutex that never allocates: the allocator cannot use pthread_mutex in places
// where it must also survive fork handlers and early start-up.
#pragma once

#include <atomic>
#include <cstdint>

#include "platform/os.h"
#include "support/assert.h"

namespace meshalloc {

// A spin-wait hint: lets the sibling hyperthread (or the hypervisor) run meanwhile.
inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

// The lock order, outermost first: a thread holding a lock of some rank takes only locks of a
// higher rank (several size-class locks at once only in index order, which fork does; the same
// for the handle store's). The one
// list of the core's locks; checked in the builds with MESHALLOC_CHECKS (lock_order_test.cc).
// The fork participants (heap/fork.h) take them in the same order.
enum class LockRank : uint8_t {
  kUnranked,        // not checked: tests' own locks
  kStatsReport,     // api/stats.cc: the exit report's buffer
  kStatsSnapshot,   // api/ctl.cc: the mallctl statistics snapshot
  kMeshPass,        // mesh/mesher.cc: one pass at a time
  kMeshBatch,       // mesh/mesher.cc: held across each batch of meshes
  kHandlePass,      // handle/defrag.h: one defragmentation pass at a time
  kHandleStep,      // handle/defrag.h: one class evacuated at a time
  kHandleClass,     // handle/store.h: one size class of the handle store (arena inside it)
  kHandleCaches,    // handle/thread_cache.cc: the list of handle thread caches
  kHandleTable,     // handle/table.cc: the stack of free handle entries
  kWriteBarrier,    // mesh/write_barrier.cc: installing the fault handler
  kIdleReclaim,     // heap/thread_heap.cc: one idle-heap reclaim at a time
  kThreadRegistry,  // heap/thread_heap.cc: the list of thread heaps
  kSizeClass,       // heap/global_heap.h: one size class's spans
  kLarge,           // heap/global_heap.h: large objects
  kSpanBacking,     // mesh/span_backing.h: the shared file and its ranges
  kArena,           // heap/arena.h: segments, free runs, the dirty cache
  kInternalHeap,    // heap/internal_heap.h: the metadata heap
  kRetired,    // mesh/retired_spans.cc: meshed spans that died (a leaf, taken under a class lock)
  kMeshStats,  // mesh/mesher.cc: the mesher's counters (a leaf)
};

#if MESHALLOC_CHECKS_ENABLED
// The ranked locks this thread holds, in the order taken.
class HeldLocks {
 public:
  static void acquiring(LockRank rank) {
    if (rank == LockRank::kUnranked || count_ == 0) return;
    LockRank innermost = ranks_[count_ - 1];
    MESHALLOC_ASSERT_MSG(rank > innermost || (rank == innermost && severalAtOnce(rank)),
                         "lock order: a lock taken inside one of the same or a later rank");
  }
  static void acquired(LockRank rank, const void* mutex) {
    if (rank == LockRank::kUnranked) return;
    MESHALLOC_ASSERT_MSG(count_ < kCapacity, "lock order: too many locks held at once");
    if (count_ < kCapacity) {
      ranks_[count_] = rank;
      mutexes_[count_++] = mutex;
    }
  }
  // Released, or reset in a fork child: forgotten wherever it is in the stack.
  static void released(LockRank rank, const void* mutex) {
    if (rank == LockRank::kUnranked) return;
    for (unsigned i = count_; i-- > 0;) {
      if (mutexes_[i] != mutex) continue;
      for (unsigned j = i + 1; j < count_; j++) {
        ranks_[j - 1] = ranks_[j];
        mutexes_[j - 1] = mutexes_[j];
      }
      count_--;
      return;
    }
  }
  static unsigned count() { return count_; }

 private:
  static bool severalAtOnce(LockRank rank) {
    return rank == LockRank::kSizeClass || rank == LockRank::kHandleClass;
  }
  // Fork holds every size-class lock at once.
  static constexpr unsigned kCapacity = 128;
  static inline thread_local unsigned count_ = 0;
  static inline thread_local LockRank ranks_[kCapacity];
  static inline thread_local const void* mutexes_[kCapacity];
};
#endif

class Mutex {
 public:
  constexpr Mutex() = default;
  constexpr explicit Mutex(LockRank rank) : rank_(rank) {}
  Mutex(const Mutex&) = delete;
  Mutex& operator=(const Mutex&) = delete;

  void lock() {
#if MESHALLOC_CHECKS_ENABLED
    HeldLocks::acquiring(rank_);
#endif
    uint32_t expected = kUnlocked;
    if (__builtin_expect(
            !state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire), 0)) {
      lockSlow();
    }
#if MESHALLOC_CHECKS_ENABLED
    HeldLocks::acquired(rank_, this);
#endif
  }

  bool tryLock() {
    uint32_t expected = kUnlocked;
    bool taken = state_.compare_exchange_strong(expected, kLocked, std::memory_order_acquire);
#if MESHALLOC_CHECKS_ENABLED
    // A try never waits, so it cannot deadlock whatever is held: recorded, not checked.
    if (taken) HeldLocks::acquired(rank_, this);
#endif
    return taken;
  }

  void unlock() {
#if MESHALLOC_CHECKS_ENABLED
    HeldLocks::released(rank_, this);
#endif
    if (state_.exchange(kUnlocked, std::memory_order_release) == kContended)
      os::futexWakeOne(&state_);
  }

  // After fork() only the forking thread exists; a lock it took in the prepare handler is
  // simply reset rather than unlocked, since no waiter can exist in the child.
  void resetAfterFork() {
#if MESHALLOC_CHECKS_ENABLED
    HeldLocks::released(rank_, this);
#endif
    state_.store(kUnlocked, std::memory_order_relaxed);
  }

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
  LockRank rank_ = LockRank::kUnranked;
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
