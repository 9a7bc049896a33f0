// Slot accounting and data integrity while frees, thread exits and meshing race: mesh_writers'
// class check, pushed harder. Each round, two short-lived threads allocate objects of one class
// and keep a random quarter (sparse detached spans from two heaps). Then, while mesher threads
// call meshalloc_compact() in a loop, freer threads free the survivors one by one (their
// recycled blocks applied to spans being meshed), and short-lived "exiter" threads attach sparse
// spans of the class, free survivors, hand half of their own blocks to other threads and exit
// with those frees still to come. Every block is checked against its pattern before it is
// freed. Once everything is freed the class must hold exactly the objects it held before the
// round (no slot lost or counted twice), and meshing must have happened.
//
// Usage: meshalloc_mesh_accounting [--rounds N] [--objects N] [--size BYTES] [--freers N]
//                                  [--exiters N] [--meshers N]
// Exits 1 on a mismatch, a damaged block or a run without meshes; 2 on a bad option.
#include <sched.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "heap_counters.h"
#include "meshalloc.h"

namespace {

struct Options {
  unsigned rounds = 20;
  size_t objects = 40000;  // per round, over both populating threads
  size_t size = 256;
  unsigned freers = 3;
  unsigned exiters = 2;
  unsigned meshers = 2;
};

// Short threads each exiter starts, one after the other, and the blocks each allocates.
constexpr unsigned kThreadsPerExiter = 40;
constexpr unsigned kMaxBlocksPerShortThread = 24;
// Survivors each short thread frees before it hands its own blocks on.
constexpr unsigned kSurvivorsPerShortThread = 16;
// One block in kKeepOneIn survives its populating thread.
constexpr unsigned kKeepOneIn = 4;
constexpr unsigned kFreesPerYield = 7;
constexpr useconds_t kRecountDelayUs = 200000;

std::atomic<bool> gFailed{false};

uint64_t patternWord(const uint64_t* block, size_t word) {
  return reinterpret_cast<uintptr_t>(block) * 0x9E3779B97F4A7C15ull + word;
}

uint64_t* allocateBlock(size_t size) {
  auto* block = static_cast<uint64_t*>(malloc(size));
  if (!block) {
    fprintf(stderr, "mesh_accounting: malloc(%zu) failed\n", size);
    exit(1);
  }
  for (size_t w = 0; w < size / sizeof(uint64_t); w++) block[w] = patternWord(block, w);
  return block;
}

// Checks the block's pattern (a write lost or misplaced by meshing shows here), then frees it.
void checkAndFree(uint64_t* block, size_t size) {
  for (size_t w = 0; w < size / sizeof(uint64_t); w++) {
    if (block[w] != patternWord(block, w)) {
      fprintf(stderr,
              "mesh_accounting: block %p word %zu holds %#" PRIx64 ", expected %#" PRIx64 "\n",
              static_cast<void*>(block), w, block[w], patternWord(block, w));
      gFailed = true;
      break;
    }
  }
  free(block);
}

// The blocks not yet freed, which any thread may take.
class Pool {
 public:
  uint64_t* take(std::mt19937_64& rng) {
    std::lock_guard<std::mutex> guard(lock_);
    if (blocks_.empty()) return nullptr;
    size_t i = rng() % blocks_.size();
    uint64_t* block = blocks_[i];
    blocks_[i] = blocks_.back();
    blocks_.pop_back();
    return block;
  }
  void put(uint64_t* block) {
    std::lock_guard<std::mutex> guard(lock_);
    blocks_.push_back(block);
  }
  void putAll(const std::vector<uint64_t*>& blocks) {
    std::lock_guard<std::mutex> guard(lock_);
    blocks_.insert(blocks_.end(), blocks.begin(), blocks.end());
  }

 private:
  std::mutex lock_;
  std::vector<uint64_t*> blocks_;
};

bool parseOptions(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; i += 2) {
    if (i + 1 >= argc) {
      fprintf(stderr, "mesh_accounting: %s needs a value\n", argv[i]);
      return false;
    }
    char* end = nullptr;
    unsigned long long value = strtoull(argv[i + 1], &end, 10);
    if (*end != '\0' || end == argv[i + 1]) {
      fprintf(stderr, "mesh_accounting: %s wants a number, not %s\n", argv[i], argv[i + 1]);
      return false;
    }
    if (!strcmp(argv[i], "--rounds")) {
      options->rounds = static_cast<unsigned>(value);
    } else if (!strcmp(argv[i], "--objects")) {
      options->objects = value;
    } else if (!strcmp(argv[i], "--size")) {
      options->size = value;
    } else if (!strcmp(argv[i], "--freers")) {
      options->freers = static_cast<unsigned>(value);
    } else if (!strcmp(argv[i], "--exiters")) {
      options->exiters = static_cast<unsigned>(value);
    } else if (!strcmp(argv[i], "--meshers")) {
      options->meshers = static_cast<unsigned>(value);
    } else {
      fprintf(stderr, "mesh_accounting: unknown option %s\n", argv[i]);
      return false;
    }
  }
  if (options->size < sizeof(uint64_t) || options->meshers == 0) {
    fprintf(stderr, "mesh_accounting: --size must be at least 8 and --meshers at least 1\n");
    return false;
  }
  return true;
}

// Two short-lived threads allocate options.objects blocks and leave a random quarter in `pool`.
void populate(const Options& options, Pool& pool, std::mt19937_64& seeds) {
  for (unsigned p = 0; p < 2; p++) {
    uint64_t seed = seeds();
    std::thread([&options, &pool, seed] {
      std::mt19937_64 rng(seed);
      std::vector<uint64_t*> kept;
      for (size_t i = 0; i < options.objects / 2; i++) {
        uint64_t* block = allocateBlock(options.size);
        if (rng() % kKeepOneIn == 0) {
          kept.push_back(block);
        } else {
          checkAndFree(block, options.size);
        }
      }
      pool.putAll(kept);
    }).join();
  }
}

// One exiter: short threads one after the other, each attaching spans of the class, freeing
// survivors, freeing half of its own blocks and handing the other half to the pool as it exits.
void runExiter(const Options& options, Pool& pool, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for (unsigned k = 0; k < kThreadsPerExiter; k++) {
    uint64_t threadSeed = rng();
    std::thread([&options, &pool, threadSeed] {
      std::mt19937_64 local(threadSeed);
      std::vector<uint64_t*> mine;
      unsigned count = 1 + static_cast<unsigned>(local() % kMaxBlocksPerShortThread);
      for (unsigned i = 0; i < count; i++) mine.push_back(allocateBlock(options.size));
      for (unsigned i = 0; i < kSurvivorsPerShortThread; i++) {
        if (uint64_t* block = pool.take(local)) checkAndFree(block, options.size);
      }
      for (size_t i = 0; i < mine.size(); i++) {
        if (i % 2) {
          checkAndFree(mine[i], options.size);
        } else {
          pool.put(mine[i]);
        }
      }
    }).join();
  }
}

bool runRound(const Options& options, unsigned round, std::mt19937_64& seeds) {
  const uint64_t before = stress::liveObjectsOfClass(options.size);
  Pool pool;
  std::atomic<bool> stop{false};
  std::vector<std::thread> meshers;
  for (unsigned m = 0; m < options.meshers; m++) {
    meshers.emplace_back([&stop] {
      while (!stop) meshalloc_compact();
    });
  }
  populate(options, pool, seeds);
  std::vector<std::thread> threads;
  for (unsigned f = 0; f < options.freers; f++) {
    uint64_t seed = seeds();
    threads.emplace_back([&options, &pool, seed] {
      std::mt19937_64 rng(seed);
      unsigned freed = 0;
      while (uint64_t* block = pool.take(rng)) {
        checkAndFree(block, options.size);
        if (++freed % kFreesPerYield == 0) sched_yield();
      }
    });
  }
  for (unsigned e = 0; e < options.exiters; e++) {
    uint64_t seed = seeds();
    threads.emplace_back([&options, &pool, seed] { runExiter(options, pool, seed); });
  }
  for (std::thread& thread : threads) thread.join();
  stop = true;
  for (std::thread& thread : meshers) thread.join();
  std::mt19937_64 rest(seeds());
  while (uint64_t* block = pool.take(rest)) checkAndFree(block, options.size);
  const uint64_t after = stress::liveObjectsOfClass(options.size);
  if (after == before) return true;
  usleep(kRecountDelayUs);
  fprintf(stderr,
          "mesh_accounting: round %u: the %zu-byte class held %" PRIu64
          " objects before and %" PRIu64 " after everything was freed (%" PRIu64 " 200 ms later)\n",
          round, options.size, before, after, stress::liveObjectsOfClass(options.size));
  stress::dumpClassOf(options.size, STDERR_FILENO);
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  if (!parseOptions(argc, argv, &options)) return 2;
  std::mt19937_64 seeds(static_cast<uint64_t>(getpid()));
  const uint64_t meshesBefore = stress::readCounter("mesh.count");
  unsigned round = 0;
  for (; round < options.rounds && !gFailed; round++) {
    if (!runRound(options, round, seeds)) gFailed = true;
  }
  const uint64_t meshes = stress::readCounter("mesh.count") - meshesBefore;
  printf("mesh_accounting: %u rounds of %zu-byte blocks, %" PRIu64 " meshes: %s\n", round,
         options.size, meshes, gFailed ? "FAILED" : "ok");
  if (!gFailed && options.rounds > 0 && meshes == 0) {
    fprintf(stderr, "mesh_accounting: nothing was meshed, so nothing was tested\n");
    return 1;
  }
  return gFailed ? 1 : 0;
}
