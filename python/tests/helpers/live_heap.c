/* A long-running program for `meshalloc top`'s tests: it follows commands on stdin, one per
 * line, and answers each with one line on stdout.
 *
 *   alloc COUNT SIZE   keeps COUNT more objects of SIZE bytes, every byte written (at most
 *                      2^20 objects in all)
 *   free               frees every object kept
 *   allocated          meshalloc's own stats.allocated, read through mallctl (-1 without it)
 *
 * Every answer ends with the value of `allocated`. End of input: exit. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*mallctl_fn)(const char*, void*, size_t*, void*, size_t);

static long long allocated(void) {
  mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "mallctl");
  size_t value = 0, length = sizeof(value);
  uint64_t epoch = 1;
  /* Like jemalloc, the statistics are a snapshot refreshed by writing "epoch". */
  if (!mallctl || mallctl("epoch", NULL, NULL, &epoch, sizeof(epoch)) != 0 ||
      mallctl("stats.allocated", &value, &length, NULL, 0) != 0)
    return -1;
  return (long long)value;
}

int main(void) {
  char line[256];
  /* Allocated once, so that an `alloc` adds only its objects to the heap. */
  enum { kCapacity = 1 << 20 };
  void** kept = malloc(kCapacity * sizeof(*kept));
  size_t count = 0;
  if (!kept) return 1;
  setvbuf(stdout, NULL, _IOLBF, 0);
  while (fgets(line, sizeof(line), stdin)) {
    size_t more = 0, size = 0;
    if (sscanf(line, "alloc %zu %zu", &more, &size) == 2) {
      if (count + more > kCapacity) {
        fprintf(stderr, "live_heap: at most %d objects\n", kCapacity);
        return 2;
      }
      for (size_t i = 0; i < more; i++) {
        kept[count] = malloc(size);
        if (!kept[count]) return 1;
        memset(kept[count++], 0x5a, size);
      }
    } else if (strncmp(line, "free", 4) == 0) {
      for (size_t i = 0; i < count; i++) free(kept[i]);
      count = 0;
    } else if (strncmp(line, "allocated", 9) != 0) {
      fprintf(stderr, "live_heap: unknown command %s", line);
      return 2;
    }
    printf("%lld\n", allocated());
  }
  return 0;
}
