// The write barrier: while meshing copies a span (or fork snapshots meshed spans) the span is
// write-protected, and a thread that writes to it takes a SIGSEGV. Our handler recognises
// such a fault, waits until the barrier is lifted and returns, so the write is retried on the
// new mapping and never lost. Every other SIGSEGV goes to the application's own handler (or
// the default action), whether the application installed it before or after we did: the
// exported sigaction()/signal() keep us first in line and record the application's choice.
#pragma once

#include <signal.h>

#include <atomic>
#include <cstdint>

namespace meshalloc {

class WriteBarrier {
 public:
  // Installs the SIGSEGV handler (idempotent). False if the kernel refused.
  static bool install();
  static bool installed() { return installed_.load(std::memory_order_acquire); }

  // Between begin() and end(), write faults inside the arena wait instead of crashing.
  static void begin();
  static void end();
  static bool active() { return sequence_.load(std::memory_order_seq_cst) & 1; }
  static uint32_t sequence() { return sequence_.load(std::memory_order_seq_cst); }
  // Blocks until the barrier whose sequence number is `seen` (odd) has ended.
  static void waitForEnd(uint32_t seen);

  // For the exported sigaction(): true if it handled the call (the signal is ours to
  // multiplex), with the result in *result.
  static bool interceptSigaction(int signal, const struct sigaction* action,
                                 struct sigaction* previous, int* result);

  // Counts of faults that waited on the barrier, for statistics.
  static uint64_t faultsWaited() { return faultsWaited_.load(std::memory_order_relaxed); }

 private:
  static void onFault(int signal, siginfo_t* info, void* context);
  static void chain(int signal, siginfo_t* info, void* context);

  static inline std::atomic<bool> installed_{false};
  static inline std::atomic<uint32_t> sequence_{0};
  static inline std::atomic<uint64_t> faultsWaited_{0};
};

}  // namespace meshalloc
