// prodcons: producer/consumer, the pattern of xmalloc-test. Threads come in pairs: a producer
// mallocs blocks (16 - 256 bytes, log-uniform), writes them and hands them over a lock-free
// single-producer/single-consumer ring to its consumer, which reads and frees them. Every free
// is a remote free of memory another thread allocated, and the producer keeps allocating while
// its old blocks come back through the other thread - the case where per-thread caches must
// return memory to its owner (or lose it). By default a block's first word, its last byte and
// a byte per page are written and checked (bench::touch); with --light=1 only its first word
// is (prodcons-64 in `meshalloc bench speed`: one pair, 64-byte blocks), so that little but
// the allocator's malloc and remote free is left in the loop.
#include <pthread.h>

#include <iterator>
#include <new>

#include "common.h"

namespace {

uint64_t gThreads = 2, gIterations = 4000000, gMin = 16, gMax = 256, gRing = 1024, gLight = 0,
         gSeed = 1;

// One cache line per index: the producer and the consumer write different lines.
struct alignas(64) Index {
  std::atomic<uint64_t> value{0};
};

struct Handoff {
  void* block;
  size_t size;
  uint64_t tag;
};

struct Pair {
  uint64_t index;
  Handoff* ring;  // gRing entries, gRing a power of two
  Index head;     // next slot the producer writes
  Index tail;     // next slot the consumer reads
  uint64_t checksum;
};

void* produce(void* argument) {
  Pair* pair = static_cast<Pair*>(argument);
  bench::Rng rng(gSeed, pair->index);
  uint64_t id = pair->index << 40, head = 0, tailSeen = 0;
  const uint64_t mask = gRing - 1;
  for (uint64_t i = 0; i < gIterations; i++) {
    size_t size = rng.logUniform(gMin, gMax);
    Handoff handoff{bench::mustMalloc(size), size, bench::tagFor(++id, size)};
    bench::touch(handoff.block, size, handoff.tag, gLight);
    unsigned spins = 0;
    while (head - tailSeen == gRing) {
      tailSeen = pair->tail.value.load(std::memory_order_acquire);
      if (head - tailSeen == gRing) bench::relax(&spins);
    }
    pair->ring[head & mask] = handoff;
    pair->head.value.store(++head, std::memory_order_release);
  }
  return nullptr;
}

void* consume(void* argument) {
  Pair* pair = static_cast<Pair*>(argument);
  uint64_t tail = 0, headSeen = 0, checksum = 0;
  const uint64_t mask = gRing - 1;
  while (tail < gIterations) {
    unsigned spins = 0;
    while (tail == headSeen) {
      headSeen = pair->head.value.load(std::memory_order_acquire);
      if (tail == headSeen) bench::relax(&spins);
    }
    // Drain everything available, publishing progress in batches.
    while (tail < headSeen) {
      Handoff handoff = pair->ring[tail & mask];
      checksum += bench::check(handoff.block, handoff.size, handoff.tag, gLight);
      free(handoff.block);
      tail++;
      if ((tail & 31) == 0) pair->tail.value.store(tail, std::memory_order_release);
    }
    pair->tail.value.store(tail, std::memory_order_release);
  }
  pair->checksum = checksum;
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"threads", &gThreads, "threads: producer/consumer pairs x 2"},
      {"iterations", &gIterations, "blocks each producer hands over"},
      {"min", &gMin, "smallest block size"},
      {"max", &gMax, "largest block size"},
      {"ring", &gRing, "hand-over ring entries (power of two)"},
      {"light", &gLight, "1: write and check only the first word of a block"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "prodcons", options);
  if (gThreads < 2 || gThreads % 2 || gMin < 1 || gMin > gMax || gRing < 2 ||
      (gRing & (gRing - 1)) || gLight > 1)
    bench::usage(argv[0], "prodcons", options, std::size(options),
                 "threads must be even and >= 2, ring a power of two, light 0 or 1");

  const uint64_t pairs = gThreads / 2;
  Pair* pairList = static_cast<Pair*>(aligned_alloc(64, pairs * sizeof(Pair)));
  pthread_t* ids = static_cast<pthread_t*>(bench::mustMalloc(gThreads * sizeof(pthread_t)));
  if (!pairList) return 1;
  for (uint64_t p = 0; p < pairs; p++) {
    Pair* pair = new (&pairList[p]) Pair{};
    pair->index = p;
    pair->ring = static_cast<Handoff*>(bench::mustMalloc(gRing * sizeof(Handoff)));
  }

  double start = bench::now();
  for (uint64_t p = 0; p < pairs; p++) {
    pthread_create(&ids[2 * p], nullptr, consume, &pairList[p]);
    pthread_create(&ids[2 * p + 1], nullptr, produce, &pairList[p]);
  }
  for (uint64_t t = 0; t < gThreads; t++) pthread_join(ids[t], nullptr);
  double seconds = bench::now() - start;

  uint64_t checksum = 0;
  for (uint64_t p = 0; p < pairs; p++) {
    checksum += pairList[p].checksum;
    free(pairList[p].ring);
  }
  bench::report("prodcons", gThreads, seconds, pairs * gIterations, checksum);
  free(ids);
  free(pairList);
  return 0;
}
