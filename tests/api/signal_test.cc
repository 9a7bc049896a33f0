// SIGSEGV and the write barrier, seen from the application.
//
// meshalloc installs a SIGSEGV handler (its write barrier, src/mesh/write_barrier.h) the first
// time meshing runs, and exports sigaction()/signal()/bsd_signal()/sysv_signal() so that it
// stays first in line. The application must not notice: its own handler, installed before or
// after ours, gets every genuine fault with the right siginfo; the default action still kills
// with SIGSEGV; SIG_IGN cannot swallow a real fault; SA_RESETHAND fires once; an alternate
// signal stack still works (stack overflow); and no heap write is lost while spans are meshed.
//
// Every scenario runs in a fresh process: the test forks, and the child re-executes this binary
// with MESHALLOC_SIGNAL_SCENARIO=<name>, which a constructor below picks up before GoogleTest
// starts. So "before the barrier is installed" really is before: neither this process's earlier
// tests nor its background mesher can have installed it. A scenario exits 0 when all is well,
// or writes "signal_test: ..." to stderr and exits 1; scenarios that must die say on stderr
// how far they got, and the test checks both the marker and the signal.
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <ctime>
#include <iostream>
#include <new>
#include <string>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

// glibc declares bsd_signal() only for old X/Open modes; it is exported all the same.
extern "C" sighandler_t bsd_signal(int signal, sighandler_t handler);

namespace {

using meshtest::ChildResult;

constexpr char kScenarioVariable[] = "MESHALLOC_SIGNAL_SCENARIO";

// ---------------------------------------------------------------------------------------------
// Scenario plumbing (runs in the child, before main: no GoogleTest assertions here).

[[noreturn]] void fail(const char* format, ...) {
  char buffer[512];
  va_list args;
  va_start(args, format);
  int n = vsnprintf(buffer, sizeof(buffer), format, args);
  va_end(args);
  if (n < 0) n = 0;
  size_t length =
      static_cast<size_t>(n) < sizeof(buffer) ? static_cast<size_t>(n) : sizeof(buffer) - 1;
  (void)!write(STDERR_FILENO, "signal_test: ", 13);
  (void)!write(STDERR_FILENO, buffer, length);
  (void)!write(STDERR_FILENO, "\n", 1);
  _exit(1);
}

#define CHECK(condition, ...)            \
  do {                                   \
    if (!(condition)) fail(__VA_ARGS__); \
  } while (0)

// Progress markers for the scenarios that end in a crash.
void marker(const char* text) {
  (void)!write(STDERR_FILENO, text, strlen(text));
  (void)!write(STDERR_FILENO, "\n", 1);
}

// The SIGSEGV action the kernel really has (under the exported sigaction(), which reports the
// application's view). The kernel's struct, not glibc's.
struct KernelSigaction {
  void* handler;
  unsigned long flags;
  void* restorer;
  uint64_t mask;
};
void* kernelHandler() {
  KernelSigaction k{};
  if (syscall(SYS_rt_sigaction, SIGSEGV, nullptr, &k, sizeof(k.mask)) != 0)
    fail("rt_sigaction failed");
  return k.handler;
}
bool barrierInstalled() {
  return kernelHandler() != reinterpret_cast<void*>(SIG_DFL);
}

// Runs meshing once (installing the write barrier) and checks that it is in place.
void compactAndExpectBarrier() {
  meshalloc_compact();
  CHECK(barrierInstalled(),
        "meshalloc_compact() did not install a SIGSEGV handler (kernel has SIG_DFL)");
}

// ---------------------------------------------------------------------------------------------
// Handlers. They record what they saw and jump back to the faulting scenario.

sigjmp_buf gJump;
volatile sig_atomic_t gHandled = 0;
volatile sig_atomic_t gSignal = 0;
volatile int gCode = 0;
void* volatile gAddress = nullptr;
void* volatile gHandlerLocal = nullptr;

void resetRecord() {
  gHandled = 0;
  gSignal = 0;
  gCode = 0;
  gAddress = nullptr;
  gHandlerLocal = nullptr;
}

void infoHandler(int signal, siginfo_t* info, void*) {
  volatile char local = 0;
  gHandlerLocal = const_cast<char*>(&local);
  gHandled = gHandled + 1;
  gSignal = signal;
  gCode = info->si_code;
  gAddress = info->si_addr;
  siglongjmp(gJump, 1);
}

// A second, distinguishable handler.
volatile sig_atomic_t gOtherHandled = 0;
void otherInfoHandler(int, siginfo_t* info, void*) {
  gOtherHandled = gOtherHandled + 1;
  gAddress = info->si_addr;
  siglongjmp(gJump, 1);
}

void plainHandler(int signal) {
  gHandled = gHandled + 1;
  gSignal = signal;
  siglongjmp(gJump, 1);
}

void installInfoHandler(void (*handler)(int, siginfo_t*, void*), int extraFlags,
                        struct sigaction* previous = nullptr) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = handler;
  action.sa_flags = SA_SIGINFO | extraFlags;
  sigemptyset(&action.sa_mask);
  CHECK(sigaction(SIGSEGV, &action, previous) == 0, "sigaction(SIGSEGV) failed: %s",
        strerror(errno));
}

struct sigaction currentAction() {
  struct sigaction current;
  memset(&current, 0x5a, sizeof(current));
  CHECK(sigaction(SIGSEGV, nullptr, &current) == 0, "sigaction(SIGSEGV, NULL, &old) failed");
  return current;
}

bool isInfoHandler(const struct sigaction& a, void (*handler)(int, siginfo_t*, void*)) {
  return (a.sa_flags & SA_SIGINFO) && a.sa_sigaction == handler;
}
bool isDefault(const struct sigaction& a) {
  return !(a.sa_flags & SA_SIGINFO) && a.sa_handler == SIG_DFL;
}

// ---------------------------------------------------------------------------------------------
// Genuine faults, all outside the heap unless said otherwise.

char* mapPage(int protection) {
  void* p = mmap(nullptr, static_cast<size_t>(getpagesize()), protection,
                 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap failed");
  return static_cast<char*>(p);
}

// Writes to `target`; true if a handler jumped back instead of the write completing.
__attribute__((noinline)) bool faultingWrite(char* target) {
  volatile char* p = meshtest::launder(target);
  if (sigsetjmp(gJump, 1) == 0) {
    *p = 1;
    return false;
  }
  return true;
}

__attribute__((noinline)) bool faultingRead(const char* target) {
  const volatile char* p = meshtest::launder(target);
  if (sigsetjmp(gJump, 1) == 0) {
    (void)*p;
    return false;
  }
  return true;
}

__attribute__((noinline)) bool raiseSegv() {
  if (sigsetjmp(gJump, 1) == 0) {
    raise(SIGSEGV);
    return false;
  }
  return true;
}

// A write through a null pointer the compiler cannot see is null.
[[noreturn]] __attribute__((noinline)) void nullWrite() {
  volatile int* p = meshtest::launder(static_cast<int*>(nullptr));
  *p = 42;
  fail("the write through a null pointer did not fault");
}

// Checks that a fault at `target` reached infoHandler with the right siginfo.
void expectDelivered(bool jumped, const void* target, int code, const char* what) {
  CHECK(jumped, "%s: no handler ran (the access completed)", what);
  CHECK(gHandled == 1, "%s: handler ran %d times, expected once", what, static_cast<int>(gHandled));
  CHECK(gSignal == SIGSEGV, "%s: handler got signal %d", what, static_cast<int>(gSignal));
  CHECK(gAddress == target, "%s: si_addr %p, expected %p", what, gAddress, target);
  CHECK(gCode == code, "%s: si_code %d, expected %d", what, gCode, code);
}

// The three genuine faults every handler scenario checks: a write to a PROT_NONE page, a write
// to a read-only page, a read through a null pointer.
void expectGenuineFaultsDelivered(const char* when) {
  char* none = mapPage(PROT_NONE);
  char* readOnly = mapPage(PROT_READ);
  char what[96];

  resetRecord();
  snprintf(what, sizeof(what), "%s, write to PROT_NONE page", when);
  expectDelivered(faultingWrite(none), none, SEGV_ACCERR, what);

  resetRecord();
  snprintf(what, sizeof(what), "%s, write to read-only page", when);
  expectDelivered(faultingWrite(readOnly), readOnly, SEGV_ACCERR, what);

  resetRecord();
  snprintf(what, sizeof(what), "%s, read through null pointer", when);
  expectDelivered(faultingRead(nullptr), nullptr, SEGV_MAPERR, what);

  munmap(none, static_cast<size_t>(getpagesize()));
  munmap(readOnly, static_cast<size_t>(getpagesize()));
}

// ---------------------------------------------------------------------------------------------
// The scenarios.

// 1. Handler installed with sigaction() before the barrier exists.
void scenarioHandlerBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  installInfoHandler(infoHandler, 0);
  compactAndExpectBarrier();
  CHECK(kernelHandler() != reinterpret_cast<void*>(infoHandler),
        "the barrier did not take the kernel's SIGSEGV slot (nothing is being chained)");
  CHECK(isInfoHandler(currentAction(), infoHandler),
        "sigaction(SIGSEGV, NULL, &old) does not report the application's handler");
  expectGenuineFaultsDelivered("handler installed before the barrier");
  // A SIGSEGV sent by raise() (si_code SI_TKILL) is the application's too.
  resetRecord();
  CHECK(raiseSegv() && gHandled == 1 && gCode == SI_TKILL,
        "raise(SIGSEGV): handled %d times, si_code %d", static_cast<int>(gHandled), gCode);
}

// 2. Handler installed with sigaction() after the barrier; the query reports it, not ours.
void scenarioHandlerAfterBarrier() {
  compactAndExpectBarrier();
  struct sigaction before = currentAction();
  CHECK(isDefault(before),
        "before the application sets one, sigaction() reports a handler "
        "(%p, flags 0x%x) instead of SIG_DFL",
        reinterpret_cast<void*>(before.sa_handler), before.sa_flags);
  struct sigaction previous;
  memset(&previous, 0x5a, sizeof(previous));
  installInfoHandler(infoHandler, 0, &previous);
  CHECK(isDefault(previous), "installing a handler reported a previous action other than SIG_DFL");
  CHECK(isInfoHandler(currentAction(), infoHandler),
        "sigaction(SIGSEGV, NULL, &old) does not report the application's handler");
  CHECK(kernelHandler() != reinterpret_cast<void*>(infoHandler),
        "the application's handler replaced the write barrier in the kernel");
  expectGenuineFaultsDelivered("handler installed after the barrier");
  resetRecord();
  CHECK(raiseSegv() && gHandled == 1 && gCode == SI_TKILL,
        "raise(SIGSEGV): handled %d times, si_code %d", static_cast<int>(gHandled), gCode);

  // Replacing the handler: the old one is reported, the new one gets the next fault.
  installInfoHandler(otherInfoHandler, 0, &previous);
  CHECK(isInfoHandler(previous, infoHandler), "replacing the handler did not report the old one");
  char* none = mapPage(PROT_NONE);
  resetRecord();
  gOtherHandled = 0;
  CHECK(faultingWrite(none) && gOtherHandled == 1 && gHandled == 0 && gAddress == none,
        "after replacing the handler: new handler ran %d times, old %d times, si_addr %p",
        static_cast<int>(gOtherHandled), static_cast<int>(gHandled), gAddress);
  // More meshing passes do not disturb the application's choice.
  meshalloc_compact();
  CHECK(isInfoHandler(currentAction(), otherInfoHandler),
        "a later compaction changed the reported handler");
}

// 3. Default disposition: a null write kills the process with SIGSEGV.
void scenarioNullBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  marker("about to fault");
  nullWrite();
}

void scenarioNullAfterBarrier() {
  compactAndExpectBarrier();
  marker("about to fault");
  nullWrite();
}

// ...also after a handler came and went (sigaction back to SIG_DFL).
void scenarioNullAfterHandlerRemoved() {
  compactAndExpectBarrier();
  installInfoHandler(infoHandler, 0);
  expectGenuineFaultsDelivered("handler before removal");
  struct sigaction defaults;
  memset(&defaults, 0, sizeof(defaults));
  defaults.sa_handler = SIG_DFL;
  sigemptyset(&defaults.sa_mask);
  CHECK(sigaction(SIGSEGV, &defaults, nullptr) == 0, "sigaction(SIG_DFL) failed");
  CHECK(isDefault(currentAction()), "after restoring SIG_DFL, sigaction() reports something else");
  marker("about to fault");
  nullWrite();
}

// ...and a SIGSEGV sent with kill() (not a fault) takes the default action too.
void scenarioKillAfterBarrier() {
  compactAndExpectBarrier();
  marker("about to kill");
  kill(getpid(), SIGSEGV);
  fail("kill(getpid(), SIGSEGV) returned with the default disposition");
}

// 4a. signal() (BSD semantics: the handler stays) after the barrier.
void scenarioSignalAfterBarrier() {
  compactAndExpectBarrier();
  sighandler_t previous = signal(SIGSEGV, plainHandler);
  CHECK(previous == SIG_DFL, "signal() returned %p as the previous handler, expected SIG_DFL",
        reinterpret_cast<void*>(previous));
  struct sigaction now = currentAction();
  CHECK(!(now.sa_flags & SA_SIGINFO) && now.sa_handler == plainHandler,
        "sigaction() does not report the handler set with signal()");
  char* none = mapPage(PROT_NONE);
  for (int round = 1; round <= 3; round++) {  // BSD semantics: still installed each time
    resetRecord();
    CHECK(faultingWrite(none) && gHandled == 1 && gSignal == SIGSEGV,
          "signal() handler, fault %d: handled %d times", round, static_cast<int>(gHandled));
  }
  resetRecord();
  CHECK(faultingRead(nullptr) && gHandled == 1, "signal() handler: null read not handled");
  CHECK(signal(SIGSEGV, SIG_DFL) == plainHandler, "signal(SIG_DFL) did not return the handler");
  // bsd_signal is the same API under another name.
  CHECK(bsd_signal(SIGSEGV, plainHandler) == SIG_DFL, "bsd_signal() did not return SIG_DFL");
  resetRecord();
  CHECK(faultingWrite(none) && gHandled == 1, "bsd_signal() handler: fault not handled");
}

// 4b. SA_RESETHAND: one delivery, then the default action.
void expectResetHandOnce(const char* when) {
  char* none = mapPage(PROT_NONE);
  resetRecord();
  expectDelivered(faultingWrite(none), none, SEGV_ACCERR, when);
  CHECK(isDefault(currentAction()), "%s: after one delivery sigaction() does not report SIG_DFL",
        when);
  marker("first fault handled");
  nullWrite();
}

void scenarioResetHandAfterBarrier() {
  compactAndExpectBarrier();
  installInfoHandler(infoHandler, SA_RESETHAND);
  expectResetHandOnce("SA_RESETHAND installed after the barrier");
}

void scenarioResetHandBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  installInfoHandler(infoHandler, SA_RESETHAND);
  compactAndExpectBarrier();
  expectResetHandOnce("SA_RESETHAND installed before the barrier");
}

// sysv_signal(): System V semantics, reset to SIG_DFL on delivery.
void scenarioSysvSignalAfterBarrier() {
  compactAndExpectBarrier();
  CHECK(sysv_signal(SIGSEGV, plainHandler) == SIG_DFL, "sysv_signal() did not return SIG_DFL");
  char* none = mapPage(PROT_NONE);
  resetRecord();
  CHECK(faultingWrite(none) && gHandled == 1, "sysv_signal() handler: fault not handled");
  CHECK(isDefault(currentAction()), "sysv_signal() handler still installed after one delivery");
  marker("first fault handled");
  nullWrite();
}

// 4c. SIG_IGN cannot ignore a genuine fault: the kernel kills with SIGSEGV, and so must we.
void scenarioIgnoreAfterBarrier() {
  compactAndExpectBarrier();
  CHECK(signal(SIGSEGV, SIG_IGN) == SIG_DFL, "signal(SIG_IGN) did not return SIG_DFL");
  struct sigaction now = currentAction();
  CHECK(!(now.sa_flags & SA_SIGINFO) && now.sa_handler == SIG_IGN,
        "sigaction() does not report SIG_IGN");
  marker("about to fault");
  nullWrite();
}

void scenarioIgnoreBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  CHECK(signal(SIGSEGV, SIG_IGN) == SIG_DFL, "signal(SIG_IGN) did not return SIG_DFL");
  compactAndExpectBarrier();
  CHECK(currentAction().sa_handler == SIG_IGN,
        "sigaction() does not report SIG_IGN after compaction");
  marker("about to fault");
  char* readOnly = mapPage(PROT_READ);
  *meshtest::launder(readOnly) = 1;
  fail("the write to a read-only page did not fault");
}

// 4d. The handler runs with the signal mask the kernel would give it: its sa_mask added, and
// SIGSEGV itself left unblocked under SA_NODEFER. Programs rely on the latter to leave such a
// handler with a plain _longjmp (which restores no mask) and take the next fault as well
// (memory probing, conservative GCs finding their stack or data limits).
jmp_buf gPlainJump;
volatile sig_atomic_t gSegvBlockedInHandler = -1;
volatile sig_atomic_t gUsr1BlockedInHandler = -1;
void maskRecordingHandler(int, siginfo_t* info, void*) {
  sigset_t now;
  pthread_sigmask(SIG_BLOCK, nullptr, &now);
  gSegvBlockedInHandler = sigismember(&now, SIGSEGV);
  gUsr1BlockedInHandler = sigismember(&now, SIGUSR1);
  gAddress = info->si_addr;
  gHandled = gHandled + 1;
  _longjmp(gPlainJump, 1);
}

__attribute__((noinline)) bool faultingWritePlainJump(char* target) {
  volatile char* p = meshtest::launder(target);
  if (_setjmp(gPlainJump) == 0) {
    *p = 1;
    return false;
  }
  return true;
}

void expectNoDeferSemantics(const char* when) {
  struct sigaction action;
  memset(&action, 0, sizeof(action));
  action.sa_sigaction = maskRecordingHandler;
  action.sa_flags = SA_SIGINFO | SA_NODEFER;
  sigemptyset(&action.sa_mask);
  sigaddset(&action.sa_mask, SIGUSR1);
  CHECK(sigaction(SIGSEGV, &action, nullptr) == 0, "sigaction failed");
  char* none = mapPage(PROT_NONE);
  bool blockedInside = false, blockedAfter = false;
  for (int round = 1; round <= 3; round++) {
    resetRecord();
    gSegvBlockedInHandler = -1;
    gUsr1BlockedInHandler = -1;
    bool jumped = faultingWritePlainJump(none);
    sigset_t after;
    pthread_sigmask(SIG_BLOCK, nullptr, &after);
    CHECK(jumped && gHandled == 1 && gAddress == none, "%s, fault %d: handled %d times, si_addr %p",
          when, round, static_cast<int>(gHandled), gAddress);
    CHECK(gUsr1BlockedInHandler == 1, "%s, fault %d: sa_mask (SIGUSR1) not blocked in the handler",
          when, round);
    char line[256];
    snprintf(line, sizeof(line),
             "%s, fault %d handled: SIGSEGV blocked inside the handler: %s, after _longjmp: %s",
             when, round, gSegvBlockedInHandler ? "yes" : "no",
             sigismember(&after, SIGSEGV) ? "yes" : "no");
    marker(line);
    blockedInside |= gSegvBlockedInHandler != 0;
    blockedAfter |= sigismember(&after, SIGSEGV) != 0;
    // _longjmp restored no mask: undo what the handler's sa_mask added, as such programs do.
    sigset_t usr1;
    sigemptyset(&usr1);
    sigaddset(&usr1, SIGUSR1);
    pthread_sigmask(SIG_UNBLOCK, &usr1, nullptr);
  }
  CHECK(!blockedInside,
        "%s: SIGSEGV was blocked inside an SA_NODEFER handler (the kernel leaves it unblocked)",
        when);
  CHECK(!blockedAfter,
        "%s: SIGSEGV stayed blocked after leaving the SA_NODEFER handler with _longjmp", when);
}

void scenarioNoDeferBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  expectNoDeferSemantics("without the barrier (the kernel's own semantics)");
}

void scenarioNoDeferHandlerBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  expectNoDeferSemantics("SA_NODEFER handler, before compaction");
  compactAndExpectBarrier();
  expectNoDeferSemantics("SA_NODEFER handler installed before the barrier");
}

void scenarioNoDeferAfterBarrier() {
  compactAndExpectBarrier();
  expectNoDeferSemantics("SA_NODEFER handler installed after the barrier");
}

// 5. Alternate signal stacks.
struct AltStack {
  char* base = nullptr;
  size_t size = 0;
  bool contains(const void* p) const {
    auto a = reinterpret_cast<uintptr_t>(p), b = reinterpret_cast<uintptr_t>(base);
    return a >= b && a < b + size;
  }
};

AltStack installAltStack() {
  AltStack s;
  s.size = 64 * 1024;
  void* p = mmap(nullptr, s.size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(p != MAP_FAILED, "mmap of the alternate stack failed");
  s.base = static_cast<char*>(p);
  stack_t ss;
  memset(&ss, 0, sizeof(ss));
  ss.ss_sp = s.base;
  ss.ss_size = s.size;
  CHECK(sigaltstack(&ss, nullptr) == 0, "sigaltstack failed: %s", strerror(errno));
  return s;
}

void expectOnAltStack(const AltStack& s, const char* when) {
  char* none = mapPage(PROT_NONE);
  resetRecord();
  expectDelivered(faultingWrite(none), none, SEGV_ACCERR, when);
  CHECK(s.contains(gHandlerLocal),
        "%s: the handler ran at %p, outside the alternate stack [%p, %p)", when, gHandlerLocal,
        static_cast<void*>(s.base), static_cast<void*>(s.base + s.size));
}

void scenarioAltStackAfterBarrier() {
  compactAndExpectBarrier();
  AltStack s = installAltStack();
  installInfoHandler(infoHandler, SA_ONSTACK);
  expectOnAltStack(s, "SA_ONSTACK handler installed after the barrier");
}

void scenarioAltStackBeforeBarrier() {
  CHECK(!barrierInstalled(), "precondition: the write barrier is already installed at start-up");
  AltStack s = installAltStack();
  installInfoHandler(infoHandler, SA_ONSTACK);
  compactAndExpectBarrier();
  expectOnAltStack(s, "SA_ONSTACK handler installed before the barrier");
}

// A real stack overflow in a thread with a small stack: only a handler on the alternate stack
// can run at all, ours included.
struct OverflowResult {
  bool jumped = false;
  bool onAltStack = false;
  uintptr_t stackLow = 0;
  uintptr_t faultAddress = 0;
  uint64_t depth = 0;
};
sigjmp_buf gOverflowJump;
std::atomic<uint64_t> gDepth{0};

void overflowHandler(int, siginfo_t* info, void*) {
  volatile char local = 0;
  gHandlerLocal = const_cast<char*>(&local);
  gAddress = info->si_addr;
  gHandled = gHandled + 1;
  siglongjmp(gOverflowJump, 1);
}

__attribute__((noinline)) uint64_t recurse(uint64_t depth) {
  volatile char frame[512];
  frame[0] = static_cast<char>(depth);
  frame[511] = static_cast<char>(depth);
  gDepth.store(depth, std::memory_order_relaxed);
  if (depth > (uint64_t{1} << 40)) return frame[0];  // never: keeps the recursion finite on paper
  return recurse(depth + 1) + frame[511];
}

void* overflowThread(void* arg) {
  auto* result = static_cast<OverflowResult*>(arg);
  AltStack s = installAltStack();
  pthread_attr_t attr;
  pthread_getattr_np(pthread_self(), &attr);
  void* low;
  size_t size;
  pthread_attr_getstack(&attr, &low, &size);
  pthread_attr_destroy(&attr);
  result->stackLow = reinterpret_cast<uintptr_t>(low);
  if (sigsetjmp(gOverflowJump, 1) == 0) {
    recurse(0);
  } else {
    result->jumped = true;
    result->onAltStack = s.contains(gHandlerLocal);
    result->faultAddress = reinterpret_cast<uintptr_t>(gAddress);
    result->depth = gDepth.load();
  }
  stack_t disable;
  memset(&disable, 0, sizeof(disable));
  disable.ss_flags = SS_DISABLE;
  sigaltstack(&disable, nullptr);
  munmap(s.base, s.size);
  return nullptr;
}

void scenarioStackOverflowAfterBarrier() {
  compactAndExpectBarrier();
  installInfoHandler(overflowHandler, SA_ONSTACK);
  resetRecord();
  OverflowResult result;
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setstacksize(&attr, 256 * 1024);
  pthread_t thread;
  CHECK(pthread_create(&thread, &attr, overflowThread, &result) == 0, "pthread_create failed");
  pthread_attr_destroy(&attr);
  pthread_join(thread, nullptr);
  CHECK(result.jumped && gHandled == 1, "stack overflow: handler ran %d times",
        static_cast<int>(gHandled));
  CHECK(result.onAltStack, "stack overflow: the handler did not run on the alternate stack");
  // The fault is in the guard area just below the thread's stack.
  CHECK(result.faultAddress < result.stackLow + 4096 &&
            result.faultAddress + 256 * 1024 > result.stackLow,
        "stack overflow: si_addr 0x%lx is not near the stack's low end 0x%lx (depth %lu)",
        static_cast<unsigned long>(result.faultAddress),
        static_cast<unsigned long>(result.stackLow), static_cast<unsigned long>(result.depth));
}

// A genuine fault inside the heap: the application write-protects one page of its own
// page-aligned allocation (as incremental GCs and dirty-page trackers do) and its handler
// unprotects it and returns, so the write is retried and lands. The barrier must hand the
// fault over (it is not one of its own) and the write must happen exactly once.
char* gProtectedPage = nullptr;
volatile sig_atomic_t gUnprotects = 0;
void unprotectHandler(int, siginfo_t* info, void*) {
  gAddress = info->si_addr;
  gCode = info->si_code;
  gUnprotects = gUnprotects + 1;
  mprotect(gProtectedPage, static_cast<size_t>(getpagesize()), PROT_READ | PROT_WRITE);
}

void scenarioHeapPageProtectedByApplication() {
  compactAndExpectBarrier();
  const size_t page = static_cast<size_t>(getpagesize());
  void* block = nullptr;
  CHECK(posix_memalign(&block, page, 16 * page) == 0, "posix_memalign failed");
  memset(block, 0x11, 16 * page);
  gProtectedPage = static_cast<char*>(block) + 4 * page;
  installInfoHandler(unprotectHandler, 0);
  CHECK(mprotect(gProtectedPage, page, PROT_READ) == 0, "mprotect of a heap page failed");
  gAddress = nullptr;
  volatile char* target = meshtest::launder(gProtectedPage + 100);
  *target = 0x22;
  CHECK(gUnprotects == 1, "the application's handler ran %d times, expected once",
        static_cast<int>(gUnprotects));
  CHECK(gAddress == gProtectedPage + 100 && gCode == SEGV_ACCERR,
        "si_addr %p (expected %p), si_code %d", gAddress, static_cast<void*>(gProtectedPage + 100),
        gCode);
  CHECK(*target == 0x22, "the retried write did not land");
  meshalloc_compact();
  CHECK(*target == 0x22 && static_cast<char*>(block)[0] == 0x11, "heap contents changed");
  free(block);
}

// ...and with the default disposition the same fault kills.
void scenarioHeapPageProtectedDefault() {
  compactAndExpectBarrier();
  const size_t page = static_cast<size_t>(getpagesize());
  void* block = nullptr;
  CHECK(posix_memalign(&block, page, 16 * page) == 0, "posix_memalign failed");
  memset(block, 0x11, 16 * page);
  char* protectedPage = static_cast<char*>(block) + 4 * page;
  CHECK(mprotect(protectedPage, page, PROT_READ) == 0, "mprotect of a heap page failed");
  marker("about to fault");
  *meshtest::launder(protectedPage) = 1;
  fail("the write to a write-protected heap page did not fault");
}

// 6. No heap write is lost while meshing copies and remaps the spans being written.
//
// Each cycle, a short-lived thread allocates objects and fills them (its spans are detached
// when it exits), another thread frees three quarters of them (remote frees, leaving sparse
// spans: mesh candidates), and the survivors join the writer's set. One writer thread keeps
// checking every survivor against the value it last wrote and writing a new one, while the
// main thread calls meshalloc_compact() over and over.
constexpr size_t kMeshCycles = 3;
constexpr size_t kMeshObjectsPerCycle = 16000;
constexpr size_t kMeshObjects = kMeshCycles * kMeshObjectsPerCycle;
constexpr size_t kMeshSizes[] = {256, 512};

struct Tracked {
  uint64_t* object;
  uint32_t words;
  uint32_t version;
};

uint64_t trackedValue(const uint64_t* object, uint32_t version, size_t word) {
  return (reinterpret_cast<uintptr_t>(object) * 0x9e3779b97f4a7c15ull) ^ (uint64_t{version} << 32) ^
         word;
}

struct MeshShared {  // lives in its own mapping, not in the heap under test
  Tracked survivors[kMeshObjects];
  uint64_t* fresh[kMeshObjectsPerCycle];
  size_t total = 0;                  // survivors written so far (by the sparsifier)
  std::atomic<size_t> published{0};  // survivors the writer may use
  uint64_t sparsifyState = 0x243f6a8885a308d3ull;
  std::atomic<bool> stop{false};
  std::atomic<uint64_t> passes{0};
  std::atomic<uint64_t> lost{0};
  uint64_t* firstLost = nullptr;
};

uint64_t monotonicMillis() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000 + static_cast<uint64_t>(ts.tv_nsec) / 1000000;
}

uint64_t mallctlU64(const char* name) {
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  uint64_t value = 0;
  length = sizeof(value);
  int rc = meshalloc_mallctl(name, &value, &length, nullptr, 0);
  CHECK(rc == 0, "mallctl(\"%s\") failed: %d", name, rc);
  return value;
}

size_t meshSize(size_t i) {
  return kMeshSizes[i % (sizeof(kMeshSizes) / sizeof(kMeshSizes[0]))];
}

void* populate(void* arg) {
  auto* shared = static_cast<MeshShared*>(arg);
  for (size_t i = 0; i < kMeshObjectsPerCycle; i++) {
    size_t size = meshSize(i);
    auto* p = static_cast<uint64_t*>(malloc(size));
    if (!p) return nullptr;
    for (size_t w = 0; w < size / 8; w++) p[w] = trackedValue(p, 0, w);
    shared->fresh[i] = p;
  }
  return shared;
}

void* sparsify(void* arg) {
  auto* shared = static_cast<MeshShared*>(arg);
  for (size_t i = 0; i < kMeshObjectsPerCycle; i++) {
    uint64_t& state = shared->sparsifyState;
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    if ((state >> 33) % 4 == 0) {
      shared->survivors[shared->total++] = {shared->fresh[i],
                                            static_cast<uint32_t>(meshSize(i) / 8), 0};
    } else {
      free(shared->fresh[i]);
    }
  }
  return nullptr;
}

void* writer(void* arg) {
  auto* shared = static_cast<MeshShared*>(arg);
  while (!shared->stop.load(std::memory_order_relaxed)) {
    size_t count = shared->published.load(std::memory_order_acquire);
    for (size_t i = 0; i < count; i++) {
      Tracked& t = shared->survivors[i];
      for (size_t w = 0; w < t.words; w++) {
        if (t.object[w] != trackedValue(t.object, t.version, w)) {
          if (shared->lost.fetch_add(1) == 0) shared->firstLost = t.object + w;
        }
      }
      t.version++;
      for (size_t w = 0; w < t.words; w++) t.object[w] = trackedValue(t.object, t.version, w);
    }
    shared->passes.fetch_add(1, std::memory_order_relaxed);
  }
  return nullptr;
}

void runThread(void* (*body)(void*), void* arg, void** result = nullptr) {
  pthread_t thread;
  CHECK(pthread_create(&thread, nullptr, body, arg) == 0, "pthread_create failed");
  pthread_join(thread, result);
}

void scenarioMeshWithWriter() {
  void* mapping =
      mmap(nullptr, sizeof(MeshShared), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  CHECK(mapping != MAP_FAILED, "mmap failed");
  auto* shared = new (mapping) MeshShared();

  const uint64_t meshesAtStart = mallctlU64("mesh.count");
  uint64_t compactions = 0;
  bool writerStarted = false;
  pthread_t writerThread;
  for (size_t cycle = 0; cycle < kMeshCycles; cycle++) {
    void* populated = nullptr;
    runThread(populate, shared, &populated);
    CHECK(populated == shared, "malloc failed while populating");
    runThread(sparsify, shared);
    shared->published.store(shared->total, std::memory_order_release);
    if (!writerStarted) {
      CHECK(pthread_create(&writerThread, nullptr, writer, shared) == 0, "pthread_create failed");
      writerStarted = true;
    }
    // Meshing starts only once the writer is at work on this cycle's objects too.
    uint64_t passes = shared->passes.load();
    while (shared->passes.load() < passes + 1) sched_yield();
    // Compact repeatedly: at least 8 passes, and until something meshed (at most ~300 ms).
    const uint64_t meshesBefore = mallctlU64("mesh.count");
    const uint64_t start = monotonicMillis();
    for (unsigned n = 0;; n++) {
      meshalloc_compact();
      compactions++;
      if ((n >= 8 && mallctlU64("mesh.count") > meshesBefore) || monotonicMillis() > start + 300)
        break;
    }
  }
  shared->stop.store(true);
  pthread_join(writerThread, nullptr);
  const uint64_t meshes = mallctlU64("mesh.count") - meshesAtStart;

  // Every survivor still holds its last value, read from the main thread.
  uint64_t lostAtEnd = 0;
  for (size_t i = 0; i < shared->total; i++) {
    Tracked& t = shared->survivors[i];
    for (size_t w = 0; w < t.words; w++)
      lostAtEnd += t.object[w] != trackedValue(t.object, t.version, w);
  }
  char summary[256];
  snprintf(summary, sizeof(summary),
           "meshes=%lu compactions=%lu writer_passes=%lu survivors=%zu barrier_faults=%lu",
           static_cast<unsigned long>(meshes), static_cast<unsigned long>(compactions),
           static_cast<unsigned long>(shared->passes.load()), shared->total,
           static_cast<unsigned long>(mallctlU64("mesh.barrier_faults")));
  marker(summary);
  CHECK(shared->lost.load() == 0, "%lu lost writes seen by the writer (first at %p)",
        static_cast<unsigned long>(shared->lost.load()), static_cast<void*>(shared->firstLost));
  CHECK(lostAtEnd == 0, "%lu words wrong at the end", static_cast<unsigned long>(lostAtEnd));
  CHECK(meshes > 0, "no span was meshed, so the test proved nothing (%s)", summary);
  for (size_t i = 0; i < shared->total; i++) free(shared->survivors[i].object);
}

struct Scenario {
  const char* name;
  void (*run)();
};
const Scenario kScenarios[] = {
    {"handler_before_barrier", scenarioHandlerBeforeBarrier},
    {"handler_after_barrier", scenarioHandlerAfterBarrier},
    {"null_before_barrier", scenarioNullBeforeBarrier},
    {"null_after_barrier", scenarioNullAfterBarrier},
    {"null_after_handler_removed", scenarioNullAfterHandlerRemoved},
    {"kill_after_barrier", scenarioKillAfterBarrier},
    {"signal_after_barrier", scenarioSignalAfterBarrier},
    {"resethand_after_barrier", scenarioResetHandAfterBarrier},
    {"resethand_before_barrier", scenarioResetHandBeforeBarrier},
    {"sysv_signal_after_barrier", scenarioSysvSignalAfterBarrier},
    {"ignore_after_barrier", scenarioIgnoreAfterBarrier},
    {"ignore_before_barrier", scenarioIgnoreBeforeBarrier},
    {"nodefer_without_barrier", scenarioNoDeferBeforeBarrier},
    {"nodefer_handler_before_barrier", scenarioNoDeferHandlerBeforeBarrier},
    {"nodefer_after_barrier", scenarioNoDeferAfterBarrier},
    {"altstack_after_barrier", scenarioAltStackAfterBarrier},
    {"altstack_before_barrier", scenarioAltStackBeforeBarrier},
    {"stack_overflow_after_barrier", scenarioStackOverflowAfterBarrier},
    {"heap_page_protected_by_application", scenarioHeapPageProtectedByApplication},
    {"heap_page_protected_default", scenarioHeapPageProtectedDefault},
    {"mesh_with_writer", scenarioMeshWithWriter},
};

// In a process started by runScenario(): run the scenario and exit, before GoogleTest's main.
__attribute__((constructor)) void runScenarioIfAsked() {
  const char* name = getenv(kScenarioVariable);
  if (name == nullptr) return;
  for (const Scenario& s : kScenarios) {
    if (strcmp(s.name, name) == 0) {
      s.run();
      _exit(0);
    }
  }
  fail("unknown scenario %s", name);
}

// ---------------------------------------------------------------------------------------------
// The tests (in the parent).

ChildResult runScenario(const char* name) {
  return meshtest::runInChild(
      [name] {
        setenv(kScenarioVariable, name, 1);
        char self[] = "/proc/self/exe";
        char* argv[] = {self, nullptr};
        execv(self, argv);
        fail("execv(/proc/self/exe) failed: %s", strerror(errno));
      },
      10);
}

void expectSuccess(const char* name) {
  ChildResult r = runScenario(name);
  EXPECT_TRUE(r.exitedWith(0)) << "scenario " << name << ": child " << r.describe();
}

void expectKilledAfter(const char* name, const char* markerText) {
  ChildResult r = runScenario(name);
  EXPECT_TRUE(r.killedBy(SIGSEGV))
      << "scenario " << name << ": expected death by SIGSEGV; child " << r.describe();
  EXPECT_NE(r.stderrText.find(markerText), std::string::npos)
      << "scenario " << name << " did not reach '" << markerText << "'; child " << r.describe();
  EXPECT_EQ(r.stderrText.find("signal_test:"), std::string::npos) << "child " << r.describe();
}

TEST(SignalChaining, HandlerInstalledBeforeBarrierGetsGenuineFaults) {
  expectSuccess("handler_before_barrier");
}

TEST(SignalChaining, HandlerInstalledAfterBarrierGetsGenuineFaultsAndIsReported) {
  expectSuccess("handler_after_barrier");
}

TEST(SignalDefault, NullWriteKillsBeforeBarrier) {
  expectKilledAfter("null_before_barrier", "about to fault");
}
TEST(SignalDefault, NullWriteKillsAfterBarrier) {
  expectKilledAfter("null_after_barrier", "about to fault");
}
TEST(SignalDefault, NullWriteKillsAfterHandlerRemoved) {
  expectKilledAfter("null_after_handler_removed", "about to fault");
}
TEST(SignalDefault, KillSigsegvKillsAfterBarrier) {
  expectKilledAfter("kill_after_barrier", "about to kill");
}

TEST(SignalApi, SignalHandlerAfterBarrierStaysInstalled) {
  expectSuccess("signal_after_barrier");
}
TEST(SignalApi, ResetHandAfterBarrierFiresOnce) {
  expectKilledAfter("resethand_after_barrier", "first fault handled");
}
TEST(SignalApi, ResetHandBeforeBarrierFiresOnce) {
  expectKilledAfter("resethand_before_barrier", "first fault handled");
}
TEST(SignalApi, SysvSignalAfterBarrierFiresOnce) {
  expectKilledAfter("sysv_signal_after_barrier", "first fault handled");
}
TEST(SignalApi, IgnoredSigsegvStillKillsOnGenuineFaultAfterBarrier) {
  expectKilledAfter("ignore_after_barrier", "about to fault");
}
TEST(SignalApi, IgnoredSigsegvStillKillsOnGenuineFaultBeforeBarrier) {
  expectKilledAfter("ignore_before_barrier", "about to fault");
}

TEST(SignalMask, NoDeferHandlerWithoutBarrierControl) {
  expectSuccess("nodefer_without_barrier");
}
TEST(SignalMask, NoDeferHandlerInstalledBeforeBarrierCanLongjmpAndFaultAgain) {
  expectSuccess("nodefer_handler_before_barrier");
}
TEST(SignalMask, NoDeferHandlerInstalledAfterBarrierCanLongjmpAndFaultAgain) {
  expectSuccess("nodefer_after_barrier");
}

TEST(SignalAltStack, HandlerInstalledAfterBarrierRunsOnAltStack) {
  expectSuccess("altstack_after_barrier");
}
TEST(SignalAltStack, HandlerInstalledBeforeBarrierRunsOnAltStack) {
  expectSuccess("altstack_before_barrier");
}
TEST(SignalAltStack, StackOverflowReachesHandlerOnAltStack) {
  expectSuccess("stack_overflow_after_barrier");
}

TEST(SignalHeapFault, ApplicationProtectedHeapPageReachesItsHandler) {
  expectSuccess("heap_page_protected_by_application");
}
TEST(SignalHeapFault, ApplicationProtectedHeapPageKillsByDefault) {
  expectKilledAfter("heap_page_protected_default", "about to fault");
}

TEST(SignalMeshing, NoWriteLostWhileMeshing) {
  ChildResult r = runScenario("mesh_with_writer");
  EXPECT_TRUE(r.exitedWith(0)) << "child " << r.describe();
  // The child's summary line (meshes, passes, barrier faults), for the log.
  size_t at = r.stderrText.find("meshes=");
  if (at != std::string::npos) {
    std::cout << "[ mesh     ] " << r.stderrText.substr(at, r.stderrText.find('\n', at) - at)
              << "\n";
  }
}

}  // namespace
