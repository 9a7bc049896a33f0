// mixlife: long-lived and short-lived objects interleaved, the pattern of a server or an
// interpreter handling requests. Each "request" allocates a handful of short-lived temporaries
// (freed at the end of the request) and now and then a long-lived object that replaces a random
// older one in a large retained pool (a cache, a session table, interned strings). The
// survivors end up scattered across spans that are otherwise full of freed temporaries: the
// fragmentation pattern that meshing targets. Single-threaded.
#include "common.h"

namespace {

uint64_t gIterations = 1000000, gPool = 20000, gTemps = 8, gLongPermille = 700, gTempMax = 4096,
         gLongMax = 1024, gSeed = 1;

struct Slot {
  void* block;
  size_t size;
  uint64_t tag;
};

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "requests"},
      {"pool", &gPool, "long-lived pool slots"},
      {"temps", &gTemps, "most temporaries per request"},
      {"long", &gLongPermille, "long-lived allocations per 1000 requests"},
      {"tempmax", &gTempMax, "largest temporary"},
      {"longmax", &gLongMax, "largest long-lived object"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "mixlife", options);
  if (gPool < 1 || gTemps < 1 || gTempMax < 8 || gLongMax < 16)
    bench::usage(argv[0], "mixlife", options, 7, "bad values");

  bench::Rng rng(gSeed);
  Slot* pool = static_cast<Slot*>(bench::mustMalloc(gPool * sizeof(Slot)));
  Slot* temps = static_cast<Slot*>(bench::mustMalloc(gTemps * sizeof(Slot)));
  for (uint64_t i = 0; i < gPool; i++) pool[i] = {nullptr, 0, 0};
  uint64_t checksum = 0, id = 0, allocations = 0;

  double start = bench::now();
  for (uint64_t request = 0; request < gIterations; request++) {
    uint64_t count = rng.between(1, gTemps);
    for (uint64_t i = 0; i < count; i++) {
      size_t size = rng.logUniform(8, gTempMax);
      temps[i] = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
      bench::touch(temps[i].block, size, temps[i].tag);
    }
    if (rng.chance(gLongPermille)) {
      Slot& slot = pool[rng.below(gPool)];
      if (slot.block) {
        checksum += bench::check(slot.block, slot.size, slot.tag);
        free(slot.block);
      }
      size_t size = rng.logUniform(16, gLongMax);
      slot = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
      bench::touch(slot.block, size, slot.tag);
      allocations++;
    }
    // Temporaries die in an order that is mostly, but not exactly, last-in first-out.
    for (uint64_t i = count; i-- > 0;) {
      uint64_t victim = rng.chance(250) ? rng.below(i + 1) : i;
      Slot dead = temps[victim];
      temps[victim] = temps[i];
      checksum += bench::check(dead.block, dead.size, dead.tag);
      free(dead.block);
    }
    allocations += count;
  }
  for (uint64_t i = 0; i < gPool; i++) {
    if (!pool[i].block) continue;
    checksum += bench::check(pool[i].block, pool[i].size, pool[i].tag);
    free(pool[i].block);
  }
  double seconds = bench::now() - start;

  bench::report("mixlife", 1, seconds, allocations, checksum);
  free(temps);
  free(pool);
  return 0;
}
