/* A broken allocator for the replay tests: realloc hands out a fresh block without copying the
 * old contents. `meshalloc trace replay` must notice the lost bytes and name the block. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

void* realloc(void* old, size_t size) {
  static void* (*next_malloc)(size_t);
  static void (*next_free)(void*);
  if (!next_malloc) {
    next_malloc = (void* (*)(size_t))dlsym(RTLD_NEXT, "malloc");
    next_free = (void (*)(void*))dlsym(RTLD_NEXT, "free");
  }
  void* block = next_malloc(size ? size : 1);
  if (block && old) next_free(old);
  return block;
}
