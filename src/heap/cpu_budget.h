// The one CPU budget of the work that gives memory back in the background: meshing
// (mesh/policy.cc) and the handle defragmenter (handle/controller.cc). Here, below both, because
// neither layer may use the other. It is a virtual clock (the generic cell rate algorithm): a
// pass that took `cpu` ns of CPU time at a budget of `permille` of one core advances it by
// cpu x 1000 / permille, and neither starts a pass before the wall clock has caught up with it.
// So over any interval of length T, each spender's CPU time divided by its own budget, summed
// over both, stays under T plus the credit it was allowed (a spender with no credit keeps the
// clock at or past the wall clock): their passes together use one budget's worth of time, and
// one's passes delay the other's. docs/handles.md, "The defragmenter and its controller".
#pragma once

#include <atomic>
#include <cstdint>

namespace meshalloc {

class CpuBudget {
 public:
  enum Spender : unsigned { kMeshing, kHandles, kSpenders };

  // Charges `cpuNs` of CPU time spent at a budget of `permille` (1..1000) of one core, at wall
  // time `nowNs`, allowing the clock to lag the wall clock by up to `creditNs` of unspent
  // budget. Returns the clock: the earliest wall time at which either may start its next pass.
  // Called by one pass at a time of each spender; the two may race (a compare-and-swap loop).
  static uint64_t charge(Spender who, uint64_t cpuNs, uint64_t permille, uint64_t nowNs,
                         uint64_t creditNs) {
    spentNs_[who].fetch_add(cpuNs, std::memory_order_relaxed);
    uint64_t earliest = nowNs > creditNs ? nowNs - creditNs : 0;
    uint64_t step = cpuNs * kPermille / (permille ? permille : 1);
    uint64_t clock = clock_.load(std::memory_order_relaxed);
    uint64_t next;
    do {
      next = (clock > earliest ? clock : earliest) + step;
    } while (!clock_.compare_exchange_weak(clock, next, std::memory_order_relaxed));
    return next;
  }
  // The earliest wall time at which the next pass may start.
  static uint64_t clock() { return clock_.load(std::memory_order_relaxed); }
  // Starts the clock `creditNs` behind `nowNs` (a full bucket), unless it has started.
  static void start(uint64_t nowNs, uint64_t creditNs) {
    uint64_t zero = 0;
    clock_.compare_exchange_strong(zero, nowNs > creditNs ? nowNs - creditNs : 1,
                                   std::memory_order_relaxed);
  }
  // Tests only: puts the clock back where it was.
  static void setClockForTesting(uint64_t clock) { clock_.store(clock); }
  // The CPU time charged by `who` so far.
  static uint64_t spentNs(Spender who) { return spentNs_[who].load(std::memory_order_relaxed); }

 private:
  static constexpr uint64_t kPermille = 1000;
  static inline std::atomic<uint64_t> clock_{0};
  static inline std::atomic<uint64_t> spentNs_[kSpenders] = {};
};

}  // namespace meshalloc
