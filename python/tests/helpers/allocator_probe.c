/* Prints what only the allocator that really serves malloc can know:
 *   usable=N       malloc_usable_size(malloc(1)), which differs between allocators
 *   arena_delta=N  how much glibc's main arena (mallinfo2) grew while we allocated
 *                  kBlocks x kBlockSize bytes: the whole amount if glibc served them,
 *                  nothing if another allocator did.
 * Built once plainly (the glibc reference) and once linked against jemalloc, mimalloc
 * or tcmalloc; run under the shim, the linked build must answer like the reference. */
#include <malloc.h>
#include <stdio.h>
#include <stdlib.h>

enum { kBlocks = 1000, kBlockSize = 100 };

int main(void) {
  struct mallinfo2 before = mallinfo2();
  static void* blocks[kBlocks];
  for (int i = 0; i < kBlocks; i++) blocks[i] = malloc(kBlockSize);
  struct mallinfo2 after = mallinfo2();
  void* one = malloc(1);
  printf("usable=%zu arena_delta=%zu\n", malloc_usable_size(one), after.uordblks - before.uordblks);
  free(one);
  for (int i = 0; i < kBlocks; i++) free(blocks[i]);
  return 0;
}
