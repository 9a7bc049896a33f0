// bigmix: churn over a mix that reaches well past the small-object range: mostly small blocks,
// a fair share of medium ones (up to 256 KiB) and a few large ones (up to 2 MiB), so the
// allocator's small, medium and large paths all run in one working set and large frees must
// not stall small allocations. Single-threaded.
#include "common.h"

namespace {

uint64_t gIterations = 600000, gSlots = 2000, gSeed = 1;

struct Slot {
  void* block;
  size_t size;
  uint64_t tag;
};

size_t drawSize(bench::Rng& rng) {
  uint64_t bucket = rng.below(1000);
  if (bucket < 600) return rng.logUniform(8, 256);                     // 60 %: small
  if (bucket < 900) return rng.logUniform(257, 16 << 10);              // 30 %: up to 16 KiB
  if (bucket < 990) return rng.logUniform((16 << 10) + 1, 256 << 10);  //  9 %: up to 256 KiB
  return rng.logUniform((256 << 10) + 1, 2 << 20);                     //  1 %: up to 2 MiB
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "free+malloc replacements"},
      {"slots", &gSlots, "live blocks"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "bigmix", options);
  if (gSlots < 1) bench::usage(argv[0], "bigmix", options, 3, "bad values");

  bench::Rng rng(gSeed);
  Slot* slots = static_cast<Slot*>(bench::mustMalloc(gSlots * sizeof(Slot)));
  uint64_t checksum = 0, id = 0;

  double start = bench::now();
  for (uint64_t i = 0; i < gSlots; i++) {
    size_t size = drawSize(rng);
    slots[i] = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(slots[i].block, size, slots[i].tag);
  }
  for (uint64_t i = 0; i < gIterations; i++) {
    Slot& slot = slots[rng.below(gSlots)];
    checksum += bench::check(slot.block, slot.size, slot.tag);
    free(slot.block);
    size_t size = drawSize(rng);
    slot = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(slot.block, size, slot.tag);
  }
  for (uint64_t i = 0; i < gSlots; i++) {
    checksum += bench::check(slots[i].block, slots[i].size, slots[i].tag);
    free(slots[i].block);
  }
  double seconds = bench::now() - start;

  bench::report("bigmix", 1, seconds, gSlots + gIterations, checksum);
  free(slots);
  return 0;
}
