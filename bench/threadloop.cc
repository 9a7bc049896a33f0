// thread-loop: several threads each running its own malloc/free loop, the pattern of glibc's
// multi-threaded malloc benchmark. Every thread keeps a private working set of --slots blocks
// of 16 - 256 bytes (log-uniform) and replaces a random one per step, touching only its first
// word; nothing is shared and no block changes threads. So each thread runs the allocator's
// fast path, and any time beyond what one thread alone would take is the allocator's own
// cross-thread cost: a shared arena or lock, atomic operations on the fast path, counters or
// free lists that several threads write to the same cache line. A small working set keeps the
// blocks in the caches, so that cost is not hidden behind cache misses. --iterations counts
// replacements per thread.
#include <iterator>
#include <thread>
#include <vector>

#include "common.h"

namespace {

uint64_t gThreads = 2, gIterations = 40000000, gSlots = 1024, gMin = 16, gMax = 256, gSeed = 1;

struct Worker {
  bench::WorkingSet* blocks;  // drawn by the main thread, before the timer starts
  uint64_t index;
  uint64_t checksum;
};

void loop(Worker* worker) {
  worker->checksum = worker->blocks->run(gIterations, 0, worker->index << 40);
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"threads", &gThreads, "threads, each with its own working set"},
      {"iterations", &gIterations, "free+malloc replacements per thread"},
      {"slots", &gSlots, "live blocks per thread (a power of two, at most 65536)"},
      {"min", &gMin, "smallest block size, at least 8"},
      {"max", &gMax, "largest block size, below 64 KiB"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "thread-loop", options);
  if (gThreads < 1 || !bench::WorkingSet::fits(gSlots, gMin, gMax, gSlots))
    bench::usage(argv[0], "thread-loop", options, std::size(options), "bad values");

  Worker* workers = static_cast<Worker*>(bench::mustMalloc(gThreads * sizeof(Worker)));
  for (uint64_t t = 0; t < gThreads; t++) {
    bench::Rng rng(gSeed, t);
    workers[t] = {new bench::WorkingSet(rng, gSlots, gMin, gMax, gSlots), t, 0};
  }
  std::vector<std::thread> threads;
  threads.reserve(gThreads);

  double start = bench::now();
  for (uint64_t t = 0; t < gThreads; t++) threads.emplace_back(loop, &workers[t]);
  for (std::thread& thread : threads) thread.join();
  double seconds = bench::now() - start;

  uint64_t checksum = 0;
  for (uint64_t t = 0; t < gThreads; t++) {
    checksum += workers[t].checksum;
    delete workers[t].blocks;
  }
  bench::report("thread-loop", gThreads, seconds, gThreads * (gSlots + gIterations), checksum);
  free(workers);
  return 0;
}
