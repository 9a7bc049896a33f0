// realloc: buffers grown with realloc, the two ways real programs grow them.
//  - append: a string builder or log line growing by 1 - 128 bytes per realloc up to a target
//    of 64 B - 64 KiB (cheap only if the allocator grows in place inside size-class slack);
//  - double: a dynamic array doubling its capacity up to a target of 1 KiB - 4 MiB (large
//    copies, or mremap-style growth for big blocks).
// A buffer that reaches its target is freed and starts again small. The contents written so far
// are checked after every realloc, so a realloc that loses data is caught. Single-threaded.
#include "common.h"

namespace {

uint64_t gIterations = 2000000, gBuffers = 64, gDoublePermille = 100, gSeed = 1;

struct Buffer {
  unsigned char* data;
  size_t size;
  size_t target;
  bool doubling;
  unsigned char fill;
};

void restart(Buffer& buffer, bench::Rng& rng) {
  buffer.doubling = rng.chance(gDoublePermille);
  buffer.target = buffer.doubling ? rng.logUniform(1 << 10, 4 << 20) : rng.logUniform(64, 64 << 10);
  buffer.size = rng.between(8, 32);
  buffer.fill = static_cast<unsigned char>(rng.next());
  buffer.data = static_cast<unsigned char*>(bench::mustMalloc(buffer.size));
  memset(buffer.data, buffer.fill, buffer.size);
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "realloc calls"},
      {"buffers", &gBuffers, "buffers growing at the same time"},
      {"double", &gDoublePermille, "buffers per 1000 that double instead of appending"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "realloc", options);
  if (gBuffers < 1) bench::usage(argv[0], "realloc", options, 4, "bad values");

  bench::Rng rng(gSeed);
  Buffer* buffers = static_cast<Buffer*>(bench::mustMalloc(gBuffers * sizeof(Buffer)));
  const size_t page = bench::pageSize();
  uint64_t checksum = 0, allocations = 0;

  double start = bench::now();
  for (uint64_t i = 0; i < gBuffers; i++) restart(buffers[i], rng);
  for (uint64_t i = 0; i < gIterations; i++) {
    Buffer& buffer = buffers[rng.below(gBuffers)];
    size_t oldSize = buffer.size;
    size_t newSize = buffer.doubling ? oldSize * 2 : oldSize + rng.between(1, 128);
    unsigned char* grown = static_cast<unsigned char*>(realloc(buffer.data, newSize));
    if (!grown) {
      fprintf(stderr, "bench: realloc(%zu) failed\n", newSize);
      abort();
    }
    // The old contents must have survived: check the ends and one byte per page.
    if (grown[0] != buffer.fill || grown[oldSize - 1] != buffer.fill ||
        grown[oldSize / 2] != buffer.fill)
      bench::corrupted(grown, oldSize);
    // Write the new part like a program would: appended text completely, a doubled array's
    // new half one byte per page (it is filled later, if ever).
    if (buffer.doubling) {
      for (size_t offset = oldSize; offset < newSize; offset += page) grown[offset] = buffer.fill;
      grown[newSize / 2] = buffer.fill;
      grown[newSize - 1] = buffer.fill;
    } else {
      memset(grown + oldSize, buffer.fill, newSize - oldSize);
    }
    buffer.data = grown;
    buffer.size = newSize;
    allocations++;
    if (newSize >= buffer.target) {
      checksum += newSize ^ buffer.fill;
      free(buffer.data);
      restart(buffer, rng);
      allocations++;
    }
  }
  for (uint64_t i = 0; i < gBuffers; i++) {
    checksum += buffers[i].size;
    free(buffers[i].data);
  }
  double seconds = bench::now() - start;

  bench::report("realloc", 1, seconds, allocations, checksum);
  free(buffers);
  return 0;
}
