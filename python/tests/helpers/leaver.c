/* A program that leaves known memory allocated at exit, for the allocator's statistics at exit
 * to account for: MIB mebibytes in 256-byte objects and one large object of LARGE bytes, every
 * byte written, nothing freed.
 *
 *   leaver MIB LARGE */
#include <stdlib.h>
#include <string.h>

enum { kBytesPerMib = 1 << 20, kObjectSize = 256 };

int main(int argc, char** argv) {
  if (argc != 3) return 2;
  long count = atol(argv[1]) * (kBytesPerMib / kObjectSize);
  for (long i = 0; i < count; i++) {
    char* object = malloc(kObjectSize);
    if (!object) return 4;
    memset(object, 1, kObjectSize);
  }
  size_t large = (size_t)atol(argv[2]);
  char* block = malloc(large);
  if (!block) return 4;
  memset(block, 2, large);
  return 0;
}
