#include "mesh/write_barrier.h"

#include <errno.h>
#include <signal.h>
#include <string.h>
#include <ucontext.h>

#include "heap/arena.h"
#include "platform/os.h"
#include "support/lock.h"
#include "support/range.h"

namespace meshalloc {

namespace {

// The application's SIGSEGV action, double-buffered so the handler always reads a whole one
// while sigaction() replaces it.
struct sigaction gApplicationActions[2];
std::atomic<unsigned> gCurrentAction{0};
Mutex gActionLock(LockRank::kWriteBarrier);

// A fault in the arena seen when no barrier is active may still be a barrier fault whose
// barrier ended just before we looked: retry it once. A second fault at the same address
// with no barrier in between is genuine.
thread_local uintptr_t tlsLastFaultAddress __attribute__((tls_model("initial-exec"))) = 0;
thread_local uint32_t tlsLastFaultSequence __attribute__((tls_model("initial-exec"))) = 0;

bool isDefaultOrIgnore(const struct sigaction& action) {
  return !(action.sa_flags & SA_SIGINFO) &&
         (action.sa_handler == SIG_DFL || action.sa_handler == SIG_IGN);
}

}  // namespace

bool WriteBarrier::install() {
  if (installed()) return true;
  LockGuard guard(gActionLock);
  if (installed()) return true;
  struct sigaction ours;
  memset(&ours, 0, sizeof(ours));
  ours.sa_sigaction = onFault;
  // SA_ONSTACK: a thread that overflows its stack still reaches the application's handler on
  // its alternate stack. No SA_NODEFER: a fault inside the handler is a genuine crash.
  ours.sa_flags = SA_SIGINFO | SA_ONSTACK | SA_RESTART;
  sigemptyset(&ours.sa_mask);
  struct sigaction previous;
  if (os::rawSigaction(SIGSEGV, &ours, &previous) != 0) return false;
  gApplicationActions[0] = previous;
  gCurrentAction.store(0, std::memory_order_release);
  installed_.store(true, std::memory_order_release);
  return true;
}

// The description of a barrier is stored with release and read with acquire: a reader that sees
// the next barrier's description also sees the end of the one it asked about (mayProtect).
void WriteBarrier::begin() {
  everything_.store(true, std::memory_order_release);
  raiseSequence();
}

void WriteBarrier::beginSpans(const uintptr_t* starts, uint32_t count, size_t bytes) {
  if (count > kMaxSpans) {
    begin();
    return;
  }
  for (uint32_t i = 0; i < count; i++) spans_[i].store(starts[i], std::memory_order_release);
  spanCount_.store(count, std::memory_order_release);
  spanBytes_.store(bytes, std::memory_order_release);
  everything_.store(false, std::memory_order_release);
  raiseSequence();
}

void WriteBarrier::raiseSequence() {
  uint32_t seq = sequence_.load(std::memory_order_relaxed);
  sequence_.store(seq | 1, std::memory_order_seq_cst);
}

bool WriteBarrier::mayProtect(uint32_t seen, uintptr_t start, uintptr_t end) {
  // A seqlock read: the description is only trusted if barrier `seen` is still up after it was
  // read (the next barrier rewrites it, but only after this one ended).
  bool overlap = everything_.load(std::memory_order_acquire);
  uint32_t count = spanCount_.load(std::memory_order_acquire);
  size_t bytes = spanBytes_.load(std::memory_order_acquire);
  for (uint32_t i = 0; i < count && i < kMaxSpans && !overlap; i++) {
    uintptr_t span = spans_[i].load(std::memory_order_acquire);
    overlap = rangesOverlap(span, bytes, start, end);
  }
  return overlap || sequence_.load(std::memory_order_acquire) != seen;
}

void WriteBarrier::release(uintptr_t spanStart) {
  // Only the batch's own thread writes the description while the barrier is up; a reader that
  // still sees the span waits for the next release for nothing, never the other way round.
  uint32_t count = spanCount_.load(std::memory_order_relaxed);
  for (uint32_t i = 0; i < count && i < kMaxSpans; i++) {
    if (spans_[i].load(std::memory_order_relaxed) == spanStart)
      spans_[i].store(0, std::memory_order_release);
  }
  wakeReleaseWaiters();
}

void WriteBarrier::end() {
  uint32_t seq = sequence_.load(std::memory_order_relaxed);
  sequence_.store((seq | 1) + 1, std::memory_order_seq_cst);
  wakeReleaseWaiters();
}

void WriteBarrier::wakeReleaseWaiters() {
  // A Dekker pair with waitForRelease: the waiter counts itself before it sleeps on the
  // value it read, so either we see it here and wake it, or its futex sees the new value.
  releases_.fetch_add(1, std::memory_order_seq_cst);
  if (waiters_.load(std::memory_order_seq_cst) != 0) os::futexWakeAll(&releases_);
}

void WriteBarrier::waitForEnd(uint32_t seen) {
  // end() is a release too (the last), so one futex word serves both waits.
  while (sequence_.load(std::memory_order_acquire) == seen) waitForRelease(seen);
}

void WriteBarrier::waitForRelease(uint32_t seen) {
  uint32_t releases = releases_.load(std::memory_order_seq_cst);
  waiters_.fetch_add(1, std::memory_order_seq_cst);
  if (sequence_.load(std::memory_order_seq_cst) == seen) os::futexWait(&releases_, releases);
  waiters_.fetch_sub(1, std::memory_order_relaxed);
}

void WriteBarrier::onFault(int signal, siginfo_t* info, void* context) {
  int savedErrno = errno;
  uintptr_t address = reinterpret_cast<uintptr_t>(info->si_addr);
  if (info->si_code == SEGV_ACCERR && Arena::contains(address)) {
    uint32_t seq = sequence_.load(std::memory_order_acquire);
    if (seq & 1) {
      // The write waits for its own span only: once that span is released the write is
      // retried (a span released since the fault is retried at once), so it does not wait for
      // the batch's other meshes and its commit.
      if (mayProtect(seq, address, address + 1)) {
        faultsWaited_.fetch_add(1, std::memory_order_relaxed);
        waitForRelease(seq);
      }
      errno = savedErrno;
      return;
    }
    if (tlsLastFaultAddress != address || tlsLastFaultSequence != seq) {
      tlsLastFaultAddress = address;
      tlsLastFaultSequence = seq;
      errno = savedErrno;
      return;
    }
  }
  tlsLastFaultAddress = 0;
  errno = savedErrno;
  chain(signal, info, context);
}

void WriteBarrier::chain(int signal, siginfo_t* info, void* context) {
  struct sigaction application =
      gApplicationActions[gCurrentAction.load(std::memory_order_acquire)];
  if (isDefaultOrIgnore(application)) {
    // Hand the signal to the kernel's default action (a core dump) with the real fault
    // context: restore SIG_DFL and return, and the faulting instruction faults again. A
    // SIGSEGV sent by kill() is not re-raised by returning, so raise it (it stays blocked,
    // hence pending, until we return). Ignoring SIGSEGV is not possible for real faults, so
    // SIG_IGN gets the default action too, as the kernel would give it.
    struct sigaction defaults;
    memset(&defaults, 0, sizeof(defaults));
    defaults.sa_handler = SIG_DFL;
    sigemptyset(&defaults.sa_mask);
    os::rawSigaction(signal, &defaults, nullptr);
    if (info->si_code <= 0 && application.sa_handler != SIG_IGN) raise(signal);
    return;
  }
  if (application.sa_flags & SA_RESETHAND) {
    unsigned next = gCurrentAction.load(std::memory_order_relaxed) ^ 1;
    memset(&gApplicationActions[next], 0, sizeof(gApplicationActions[next]));
    gApplicationActions[next].sa_handler = SIG_DFL;
    gCurrentAction.store(next, std::memory_order_release);
  }
  // The application's handler runs with the mask the kernel would have given it: the
  // interrupted context's mask, its sa_mask, and the signal itself unless SA_NODEFER (a
  // handler that leaves with _longjmp relies on that to take the next fault).
  sigset_t saved, mask;
  mask = static_cast<ucontext_t*>(context)->uc_sigmask;
  for (int s = 1; s < NSIG; s++) {
    if (sigismember(&application.sa_mask, s) == 1) sigaddset(&mask, s);
  }
  if (application.sa_flags & SA_NODEFER) {
    sigdelset(&mask, signal);
  } else {
    sigaddset(&mask, signal);
  }
  pthread_sigmask(SIG_SETMASK, &mask, &saved);
  if (application.sa_flags & SA_SIGINFO) {
    application.sa_sigaction(signal, info, context);
  } else {
    application.sa_handler(signal);
  }
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
}

bool WriteBarrier::interceptSigaction(int signal, const struct sigaction* action,
                                      struct sigaction* previous, int* result) {
  if (signal != SIGSEGV || !installed()) return false;
  LockGuard guard(gActionLock);
  unsigned current = gCurrentAction.load(std::memory_order_relaxed);
  if (previous) *previous = gApplicationActions[current];
  if (action) {
    unsigned next = current ^ 1;
    gApplicationActions[next] = *action;
    gCurrentAction.store(next, std::memory_order_release);
  }
  *result = 0;
  return true;
}

}  // namespace meshalloc
