// churn: random malloc/free replacement over a fixed number of live slots, sizes 8 B - 16 KiB
// (log-uniform). Single-threaded by default; with --threads=N every thread churns its own slots
// independently (threadtest-style scaling: no sharing, only the allocator's own contention).
#include <pthread.h>

#include "common.h"

namespace {

uint64_t gThreads = 1, gIterations = 4000000, gSlots = 4096, gMin = 8, gMax = 16384, gSeed = 1;

struct Slot {
  void* block;
  size_t size;
  uint64_t tag;
};

struct Worker {
  uint64_t index;
  uint64_t checksum;
};

void* churn(void* argument) {
  Worker* worker = static_cast<Worker*>(argument);
  bench::Rng rng(gSeed, worker->index);
  Slot* slots = static_cast<Slot*>(bench::mustMalloc(gSlots * sizeof(Slot)));
  uint64_t checksum = 0, id = worker->index << 40;
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
  free(slots);
  worker->checksum = checksum;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"threads", &gThreads, "threads, each churning its own slots"},
      {"iterations", &gIterations, "free+malloc replacements per thread"},
      {"slots", &gSlots, "live blocks per thread"},
      {"min", &gMin, "smallest block size"},
      {"max", &gMax, "largest block size"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "churn", options);
  if (gThreads < 1 || gSlots < 1 || gMin < 1 || gMin > gMax)
    bench::usage(argv[0], "churn", options, 6, "bad values");

  Worker* workers = static_cast<Worker*>(bench::mustMalloc(gThreads * sizeof(Worker)));
  pthread_t* ids = static_cast<pthread_t*>(bench::mustMalloc(gThreads * sizeof(pthread_t)));
  for (uint64_t t = 0; t < gThreads; t++) workers[t] = {t, 0};

  double start = bench::now();
  if (gThreads == 1) {
    churn(&workers[0]);  // the main thread itself: allocators keep single-threaded fast paths
  } else {
    for (uint64_t t = 0; t < gThreads; t++) pthread_create(&ids[t], nullptr, churn, &workers[t]);
    for (uint64_t t = 0; t < gThreads; t++) pthread_join(ids[t], nullptr);
  }
  double seconds = bench::now() - start;

  uint64_t checksum = 0;
  for (uint64_t t = 0; t < gThreads; t++) checksum += workers[t].checksum;
  bench::report("churn", gThreads, seconds, gThreads * (gSlots + gIterations), checksum);
  free(ids);
  free(workers);
  return 0;
}
