/* Linked with nothing of meshalloc's: run under LD_PRELOAD=<prefix>/lib/libmeshalloc.so
 * (tests/install/install_test.sh), finds meshalloc_mallctl with dlsym and checks that the
 * malloc in use is meshalloc's. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int (*mallctl_fn)(const char*, void*, size_t*, void*, size_t);

static size_t read_size(mallctl_fn mallctl, const char* name) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  size_t value = 0;
  if (mallctl("epoch", &epoch, &len, &epoch, sizeof epoch) != 0) exit(1);
  len = sizeof value;
  if (mallctl(name, &value, &len, NULL, 0) != 0) {
    fprintf(stderr, "preload_probe: mallctl(\"%s\") failed\n", name);
    exit(1);
  }
  return value;
}

int main(void) {
  mallctl_fn mallctl = (mallctl_fn)dlsym(RTLD_DEFAULT, "meshalloc_mallctl");
  if (mallctl == NULL) {
    fprintf(stderr,
            "preload_probe: meshalloc_mallctl not found: libmeshalloc.so is not preloaded\n");
    return 1;
  }
  size_t before = read_size(mallctl, "stats.allocated");
  void* block = malloc(1 << 20);
  memset(block, 1, 1 << 20);
  size_t after = read_size(mallctl, "stats.allocated");
  free(block);
  if (after < before + (1 << 20)) {
    fprintf(stderr, "preload_probe: malloc is not meshalloc's: stats.allocated %zu -> %zu\n",
            before, after);
    return 1;
  }
  printf("preloaded: stats.allocated +%zu bytes\n", after - before);
  return 0;
}
