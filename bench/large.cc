// large: blocks of 64 KiB - 4 MiB (log-uniform) allocated, written page by page and freed, with
// a small working set. Measures the large-object path: whether freed runs are cached or
// returned to the OS (and faulted in again), mmap/munmap churn, and page-fault cost.
// Single-threaded.
#include "common.h"

namespace {

uint64_t gIterations = 5000, gSlots = 8, gMin = 64 << 10, gMax = 4 << 20, gSeed = 1;

struct Slot {
  void* block;
  size_t size;
  uint64_t tag;
};

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "free+malloc replacements"},
      {"slots", &gSlots, "live blocks"},
      {"min", &gMin, "smallest block size"},
      {"max", &gMax, "largest block size"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "large", options);
  if (gSlots < 1 || gMin < 1 || gMin > gMax)
    bench::usage(argv[0], "large", options, 5, "bad values");

  bench::Rng rng(gSeed);
  Slot* slots = static_cast<Slot*>(bench::mustMalloc(gSlots * sizeof(Slot)));
  uint64_t checksum = 0, id = 0;

  double start = bench::now();
  for (uint64_t i = 0; i < gSlots; i++) {
    size_t size = rng.logUniform(gMin, gMax);
    slots[i] = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(slots[i].block, size, slots[i].tag);
  }
  for (uint64_t i = 0; i < gIterations; i++) {
    Slot& slot = slots[rng.below(gSlots)];
    checksum += bench::check(slot.block, slot.size, slot.tag);
    free(slot.block);
    size_t size = rng.logUniform(gMin, gMax);
    slot = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(slot.block, size, slot.tag);
  }
  for (uint64_t i = 0; i < gSlots; i++) {
    checksum += bench::check(slots[i].block, slots[i].size, slots[i].tag);
    free(slots[i].block);
  }
  double seconds = bench::now() - start;

  bench::report("large", 1, seconds, gSlots + gIterations, checksum);
  free(slots);
  return 0;
}
