// Recorded by TraceSignals.* (trace_test.cc): a signal handler that calls the malloc family while
// the main thread is in the middle of its own calls (and of the recorder's encoding of them).
// The handler only makes calls that are async-signal-safe in glibc (free(NULL),
// malloc_usable_size of a live block), so the program itself is correct; every one of them must
// be in the trace, or counted as dropped. Prints "<main pairs> <handler runs>".
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

namespace {

constexpr size_t kMainSize = 4001;  // marks the main loop's mallocs
constexpr long kMaxPairs = 3000000;
constexpr long kWantedSignals = 3000;
void* gLive;
volatile sig_atomic_t gHandled = 0;

void onAlarm(int) {
  free(nullptr);
  malloc_usable_size(gLive);
  gHandled = gHandled + 1;
}

}  // namespace

int main() {
  gLive = malloc(64);
  struct sigaction action = {};
  action.sa_handler = onAlarm;
  sigaction(SIGALRM, &action, nullptr);
  struct itimerval timer = {{0, 20}, {0, 20}};  // as often as the kernel will
  setitimer(ITIMER_REAL, &timer, nullptr);
  long pairs = 0;
  while (pairs < kMaxPairs && gHandled < kWantedSignals) {
    free(malloc(kMainSize));
    ++pairs;
  }
  struct itimerval off = {};
  setitimer(ITIMER_REAL, &off, nullptr);
  printf("%ld %ld\n", pairs, static_cast<long>(gHandled));
  return 0;
}
