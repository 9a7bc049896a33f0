// cachescratch: allocator-induced false sharing, after Hoard's cache-scratch and cache-thrash.
//  - scratch (default, "passive" false sharing): the main thread allocates one small object
//    per thread back to back - so they likely share a cache line - and hands one to each
//    thread. Each thread frees it, then repeatedly mallocs an object of the same size, writes it
//    --repetitions times and frees it. An allocator that gives a thread's new objects back the
//    memory freed by it (memory the main thread carved from a shared line) makes the threads
//    fight over that line.
//  - thrash (--thrash=1, "active" false sharing): no hand-over; the threads allocate
//    concurrently from the start, so an allocator that serves several threads from one span
//    (or one arena) packs their objects into shared lines.
// The run time is dominated by the writes: it is short when every thread's object has a cache
// line to itself and many times longer when lines bounce between cores.
#include <pthread.h>

#include "common.h"

namespace {

uint64_t gThreads = 2, gIterations = 1000, gRepetitions = 20000, gSize = 8, gThrash = 0, gSeed = 1;

struct Worker {
  uint64_t index;
  void* handed;  // scratch mode: the object the main thread allocated for this thread
  uint64_t checksum;
};

bench::Barrier* gStart;

void* work(void* argument) {
  Worker* worker = static_cast<Worker*>(argument);
  gStart->wait();
  if (worker->handed) free(worker->handed);
  uint64_t checksum = 0;
  for (uint64_t i = 0; i < gIterations; i++) {
    volatile unsigned char* object = static_cast<volatile unsigned char*>(bench::mustMalloc(gSize));
    for (uint64_t b = 0; b < gSize; b++) object[b] = 0;
    for (uint64_t r = 0; r < gRepetitions; r++) {
      for (uint64_t b = 0; b < gSize; b++) object[b] = static_cast<unsigned char>(object[b] + 1);
    }
    checksum += object[0] + gSeed;
    free(const_cast<unsigned char*>(object));
  }
  worker->checksum = checksum;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"threads", &gThreads, "threads"},
      {"iterations", &gIterations, "malloc/write/free cycles per thread"},
      {"repetitions", &gRepetitions, "times each object is written"},
      {"size", &gSize, "object size in bytes"},
      {"thrash", &gThrash, "1: active false sharing (cache-thrash), 0: passive (cache-scratch)"},
      {"seed", &gSeed, "seed (the work itself is not random)"},
  };
  bench::parseOptions(argc, argv, "cachescratch", options);
  if (gThreads < 1 || gSize < 1) bench::usage(argv[0], "cachescratch", options, 6, "bad values");

  Worker* workers = static_cast<Worker*>(bench::mustMalloc(gThreads * sizeof(Worker)));
  pthread_t* ids = static_cast<pthread_t*>(bench::mustMalloc(gThreads * sizeof(pthread_t)));
  bench::Barrier start(static_cast<unsigned>(gThreads + 1));
  gStart = &start;
  // The handed-over objects are allocated back to back before any thread exists.
  for (uint64_t t = 0; t < gThreads; t++) {
    void* handed = nullptr;
    if (!gThrash) {
      handed = bench::mustMalloc(gSize);
      memset(handed, 0, gSize);
    }
    workers[t] = {t, handed, 0};
  }
  for (uint64_t t = 0; t < gThreads; t++) pthread_create(&ids[t], nullptr, work, &workers[t]);

  double begin = bench::now();
  start.wait();
  for (uint64_t t = 0; t < gThreads; t++) pthread_join(ids[t], nullptr);
  double seconds = bench::now() - begin;

  uint64_t checksum = 0;
  for (uint64_t t = 0; t < gThreads; t++) checksum += workers[t].checksum;
  bench::report(gThrash ? "cache-thrash" : "cache-scratch", gThreads, seconds,
                gThreads * gIterations * gRepetitions * gSize, checksum);
  free(ids);
  free(workers);
  return 0;
}
