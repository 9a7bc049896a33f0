// When meshing runs. A background thread, started once the program has shown real allocation
// activity, wakes every `mesh_period_ms`: it returns dirty pages past their decay time (with
// meshing on or off) and meshes when the detached spans hold enough free memory to be worth
// it, sleeping longer after expensive passes so that meshing never takes more than its budget
// of one core's time (between `mesh_budget_permille` and `mesh_budget_max_permille`, by how
// much of the heap is free in detached spans), and backing off while passes release nothing and
// the heap stands still; a thread exit wakes it early (its spans are candidates now), and so
// do mass frees (4 MiB of spans turned partial), within the same budget. With the thread
// disabled, the allocation slow path runs the same policy inline. meshalloc_compact() meshes at
// once.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

class MeshPolicy {
 public:
  // Refills seen before the background thread is started: short-lived programs never get one.
  static constexpr unsigned kRefillsBeforeThread = 256;

  // Hooks the policy into the heap (refill and fork); idempotent.
  static void init();
  // A full pass now, whatever the policy says. Returns the bytes released.
  static size_t compactNow();
  static bool backgroundThreadRunning();
  // The retired spans' hook (installed by init): the background thread restores them
  // (see RetiredSpans::restore), woken if `wake`; false when there is none.
  static bool onRetiredSpans(bool wake);
  // The CPU budget (per mille of one core) for meshing, given the free bytes in detached spans
  // and the bytes of spans and large objects in use: mesh_budget_permille below a fragmentation
  // band, mesh_budget_max_permille above it, linear in between (docs/meshing.md).
  static uint64_t budgetPermille(uint64_t gainBytes, uint64_t activeBytes);
  // Called by the background thread on every tick with the monotonic time (live statistics,
  // api/live_stats.h). Set once, before the thread starts. With live_stats_ms set the thread
  // starts at the first refill, so that a small program is observable too.
  using TickHook = void (*)(uint64_t nowNs);
  static void setTickHook(TickHook hook);

 private:
  static void onRefill();
  static void onThreadExit();
  // GlobalHeap's span-freed-into hook: wakes the thread for a pass after mass frees.
  static void onSpanFreedInto(size_t spanBytes);
  static void* backgroundMain(void*);
  static void startBackgroundThread();
  static void runPassWithinBudget();
  // The heap changed (a refill, a thread's exit): passes are due every period again.
  static void endIdleBackoff();
};

}  // namespace meshalloc
