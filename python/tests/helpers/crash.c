/* Allocates and touches MIB mebibytes, holds for HOLD_MS, then dies of SIGNAL -- for the
 * test that a killed command is reported and its partial samples are kept. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

enum { kBytesPerMib = 1 << 20, kMillisPerSecond = 1000, kNanosPerMilli = 1000000 };

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: crash MIB HOLD_MS SIGNAL\n");
    return 2;
  }
  size_t bytes = (size_t)strtoul(argv[1], NULL, 10) * kBytesPerMib;
  long millis = strtol(argv[2], NULL, 10);
  volatile char* block = malloc(bytes);
  if (!block) return 1;
  for (size_t offset = 0; offset < bytes; offset += (size_t)sysconf(_SC_PAGESIZE))
    block[offset] = 1;
  struct timespec pause = {millis / kMillisPerSecond, (millis % kMillisPerSecond) * kNanosPerMilli};
  nanosleep(&pause, NULL);
  /* No core file: the test is about the signal, and a core dump would only slow it. */
  struct rlimit no_core = {0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  signal(atoi(argv[3]), SIG_DFL);
  raise(atoi(argv[3]));
  return 1;
}
