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
  // begin() may protect anything (fork's snapshot); beginSpans() only the `count` virtual
  // spans of `bytes` each starting at `starts` (a mesh batch), so that system calls writing
  // elsewhere need not wait for it (mayProtect).
  static void begin();
  static void beginSpans(const uintptr_t* starts, uint32_t count, size_t bytes);
  // A span of the current beginSpans() barrier is writable for good (its new mapping is in
  // place, or its protection was lifted): it leaves the description, so that a write or a
  // system call into it no longer waits for the rest of the batch.
  static void release(uintptr_t spanStart);
  static void end();
  static bool active() { return sequence_.load(std::memory_order_seq_cst) & 1; }
  static uint32_t sequence() { return sequence_.load(std::memory_order_seq_cst); }
  // Blocks until the barrier whose sequence number is `seen` (odd) has ended.
  static void waitForEnd(uint32_t seen);
  // Blocks until that barrier releases a span or ends (then the caller looks again).
  static void waitForRelease(uint32_t seen);
  // Whether the barrier with sequence number `seen` (odd) may write-protect part of
  // [start, end): false only for a barrier limited to spans that all lie outside it. True as
  // well once that barrier is over (the caller then reads the sequence again).
  static bool mayProtect(uint32_t seen, uintptr_t start, uintptr_t end);
  // A mesh batch protects at most the virtual spans of its sources and destinations.
  static constexpr uint32_t kMaxSpans = 128;

  // For the exported sigaction(): true if it handled the call (the signal is ours to
  // multiplex), with the result in *result.
  static bool interceptSigaction(int signal, const struct sigaction* action,
                                 struct sigaction* previous, int* result);

  // Counts of faults that waited on the barrier, for statistics.
  static uint64_t faultsWaited() { return faultsWaited_.load(std::memory_order_relaxed); }

 private:
  // Makes the sequence number odd, publishing the description begin/beginSpans stored.
  static void raiseSequence();
  static void onFault(int signal, siginfo_t* info, void* context);
  static void chain(int signal, siginfo_t* info, void* context);

  static inline std::atomic<bool> installed_{false};
  static inline std::atomic<uint32_t> sequence_{0};
  // What the current barrier may protect: everything, or spans_ (written only while no barrier
  // is up, then published by the odd sequence number).
  static inline std::atomic<bool> everything_{true};
  static inline std::atomic<uint32_t> spanCount_{0};
  static inline std::atomic<size_t> spanBytes_{0};
  static inline std::atomic<uintptr_t> spans_[kMaxSpans] = {};
  static inline std::atomic<uint64_t> faultsWaited_{0};
  // Bumped by every release() and end(): the futex word waitForRelease and waitForEnd sleep
  // on, woken only when someone sleeps (waiters_), so that a batch's releases and its end cost
  // no system call.
  static inline std::atomic<uint32_t> releases_{0};
  static inline std::atomic<uint32_t> waiters_{0};
  static void wakeReleaseWaiters();
};

}  // namespace meshalloc
