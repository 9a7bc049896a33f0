/* Built against an installed meshalloc (tests/install/install_test.sh), dynamically or
 * statically: checks through meshalloc_mallctl that the malloc this program calls is meshalloc's.
 */
#include <meshalloc.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { kBlocks = 1000, kBlockSize = 1000 };

static size_t read_size(const char* name) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  if (meshalloc_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch) != 0) {
    fprintf(stderr, "program.c: mallctl(\"epoch\") failed\n");
    exit(1);
  }
  size_t value = 0;
  len = sizeof value;
  int error = meshalloc_mallctl(name, &value, &len, NULL, 0);
  if (error != 0) {
    fprintf(stderr, "program.c: mallctl(\"%s\") failed: %d\n", name, error);
    exit(1);
  }
  return value;
}

int main(void) {
  const char* version = NULL;
  size_t len = sizeof version;
  if (meshalloc_mallctl("version", &version, &len, NULL, 0) != 0 || version == NULL) {
    fprintf(stderr, "program.c: mallctl(\"version\") failed\n");
    return 1;
  }
  size_t before = read_size("stats.allocated");
  static char* blocks[kBlocks];
  unsigned sum = 0;
  for (int i = 0; i < kBlocks; i++) {
    blocks[i] = malloc(kBlockSize);
    memset(blocks[i], i, kBlockSize);
  }
  size_t after = read_size("stats.allocated");
  for (int i = 0; i < kBlocks; i++) {
    sum += (unsigned char)blocks[i][kBlockSize - 1];
    free(blocks[i]);
  }
  if (after < before + (size_t)kBlocks * kBlockSize) {
    fprintf(
        stderr,
        "program.c: malloc is not meshalloc's: stats.allocated %zu -> %zu after %d x %d bytes\n",
        before, after, kBlocks, kBlockSize);
    return 1;
  }
  printf("C program: meshalloc %s, stats.allocated +%zu bytes (checksum %u)\n", version,
         after - before, sum);
  return 0;
}
