// larson: the server pattern of Larson & Krishnan's benchmark. Each of --threads lineages owns
// an array of live blocks (8 - 1000 bytes, uniform, as in the original) that the main thread
// allocated. A thread replaces random blocks --iterations times, then starts a successor
// thread that inherits the array and exits; --generations successors per lineage. So blocks
// are routinely freed by a different thread than the one that allocated them, and threads
// come and go while their blocks live on (abandoned heaps must be reclaimed).
// Unlike the original (fixed time, count operations) the work is fixed and the time measured.
// By default a block's first word, its last byte and a byte per page are written and checked
// (bench::touch); with --light=1 only its first word is (larson-small in `meshalloc bench
// speed`): a block of 8 - 1000 bytes then costs one cache line instead of two, and more of the
// time is the allocator's remote frees and reclaiming.
#include <pthread.h>

#include <iterator>
#include <new>

#include "common.h"

namespace {

uint64_t gThreads = 2, gIterations = 30000, gGenerations = 100, gSlots = 1000, gMin = 8,
         gMax = 1000, gLight = 0, gSeed = 1;

struct Slot {
  void* block;
  size_t size;
  uint64_t tag;
};

struct Lineage {
  uint64_t index;
  uint64_t generation;
  Slot* slots;
  uint64_t checksum;
  std::atomic<bool> done;
};

void* generation(void* argument) {
  Lineage* lineage = static_cast<Lineage*>(argument);
  // A new stream per (lineage, generation): the work is the same whatever the scheduling.
  bench::Rng rng(gSeed, (lineage->index << 32) | lineage->generation);
  uint64_t id = (lineage->index << 48) | (lineage->generation << 28);
  Slot* slots = lineage->slots;
  uint64_t checksum = 0;
  for (uint64_t i = 0; i < gIterations; i++) {
    Slot& slot = slots[rng.below(gSlots)];
    checksum += bench::check(slot.block, slot.size, slot.tag, gLight);
    free(slot.block);
    size_t size = rng.between(gMin, gMax);
    slot = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(slot.block, size, slot.tag, gLight);
  }
  lineage->checksum += checksum;
  if (++lineage->generation < gGenerations) {
    pthread_attr_t attributes;
    pthread_attr_init(&attributes);
    pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
    pthread_t successor;
    if (pthread_create(&successor, &attributes, generation, lineage) != 0) {
      fprintf(stderr, "bench: pthread_create failed\n");
      abort();
    }
    pthread_attr_destroy(&attributes);
  } else {
    lineage->done.store(true, std::memory_order_release);
  }
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"threads", &gThreads, "concurrent threads (lineages)"},
      {"iterations", &gIterations, "free+malloc replacements per thread generation"},
      {"generations", &gGenerations, "threads started one after the other per lineage"},
      {"slots", &gSlots, "live blocks per lineage"},
      {"min", &gMin, "smallest block size"},
      {"max", &gMax, "largest block size"},
      {"light", &gLight, "1: write and check only the first word of a block"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "larson", options);
  if (gThreads < 1 || gGenerations < 1 || gSlots < 1 || gMin < 1 || gMin > gMax || gLight > 1)
    bench::usage(argv[0], "larson", options, std::size(options), "bad values");

  Lineage* lineages = static_cast<Lineage*>(bench::mustMalloc(gThreads * sizeof(Lineage)));
  bench::Rng rng(gSeed, ~uint64_t{0});
  uint64_t id = 0;
  double start = bench::now();
  for (uint64_t t = 0; t < gThreads; t++) {
    Lineage* lineage = new (&lineages[t]) Lineage{};
    lineage->index = t;
    lineage->slots = static_cast<Slot*>(bench::mustMalloc(gSlots * sizeof(Slot)));
    for (uint64_t i = 0; i < gSlots; i++) {
      size_t size = rng.between(gMin, gMax);
      lineage->slots[i] = {bench::mustMalloc(size), size, bench::tagFor(++id, size)};
      bench::touch(lineage->slots[i].block, size, lineage->slots[i].tag, gLight);
    }
  }
  for (uint64_t t = 0; t < gThreads; t++) {
    pthread_t first;
    if (pthread_create(&first, nullptr, generation, &lineages[t]) != 0) return 1;
    pthread_detach(first);
  }
  unsigned spins = 0;
  for (uint64_t t = 0; t < gThreads; t++) {
    while (!lineages[t].done.load(std::memory_order_acquire)) {
      if (spins < 64) {
        bench::relax(&spins);
      } else {
        usleep(100);
      }
    }
  }
  uint64_t checksum = 0;
  for (uint64_t t = 0; t < gThreads; t++) {
    for (uint64_t i = 0; i < gSlots; i++) {
      checksum += bench::check(lineages[t].slots[i].block, lineages[t].slots[i].size,
                               lineages[t].slots[i].tag, gLight);
      free(lineages[t].slots[i].block);
    }
    free(lineages[t].slots);
    checksum += lineages[t].checksum;
  }
  double seconds = bench::now() - start;

  bench::report("larson", gThreads, seconds, gThreads * (gSlots + gIterations * gGenerations),
                checksum);
  free(lineages);
  return 0;
}
