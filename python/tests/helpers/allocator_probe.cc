// C++ twin of allocator_probe.c: the allocation comes from operator new, which jemalloc,
// mimalloc and tcmalloc all define, so this checks the shim takes over `new` as well.
#include <malloc.h>

#include <cstdio>
#include <new>

int main() {
  char* volatile one = new char[1];
  std::printf("usable=%zu\n", malloc_usable_size(one));
  delete[] one;
  return 0;
}
