/* A program whose memory use is known: allocates MIB mebibytes, writes every page (so
 * each one is resident and private), prints "touched", holds, frees, prints "freed",
 * holds again, exits.
 *
 *   memhog MIB HOLD
 *
 * HOLD is either a number of milliseconds to sleep, or the path of a file to wait for
 * (the test creates it when it has looked), which makes a test independent of timing. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum {
  kBytesPerMib = 1 << 20,
  kFilePollMicroseconds = 1000,
  kMillisPerSecond = 1000,
  kNanosPerMilli = 1000000
};

static void hold(const char* how) {
  char* end = NULL;
  long millis = strtol(how, &end, 10);
  if (end && *end == '\0') {
    struct timespec pause = {millis / kMillisPerSecond,
                             (millis % kMillisPerSecond) * kNanosPerMilli};
    while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
    }
    return;
  }
  while (access(how, F_OK) != 0) usleep(kFilePollMicroseconds);
}

int main(int argc, char** argv) {
  if (argc != 3) {
    fprintf(stderr, "usage: memhog MIB HOLD_MS_OR_FILE\n");
    return 2;
  }
  size_t bytes = (size_t)strtoul(argv[1], NULL, 10) * kBytesPerMib;
  long page = sysconf(_SC_PAGESIZE);
  volatile char* block = malloc(bytes);
  if (!block) return 1;
  for (size_t offset = 0; offset < bytes; offset += (size_t)page) block[offset] = 1;
  printf("touched\n");
  fflush(stdout);
  hold(argv[2]);
  free((void*)block);
  printf("freed\n");
  fflush(stdout);
  hold(argv[2]);
  return 0;
}
