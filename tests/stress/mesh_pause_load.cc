// The background mesher's pauses while every CPU is busy with the program's own threads.
//
// The mesher searches and copies at nice 19, but while it commits a batch every thread's guarded
// operations (remote frees, realloc, applied recycled frees) wait. Committed on the nice-19
// thread, a pause preempted by busy program threads lasted until the scheduler gave that thread
// a turn again: 280 ms here, with 2 CPUs and 2 spinning threads. The commit thread keeps the
// program's priority (mesh/commit_thread.h). This program keeps one spinning thread per CPU,
// churns a heap whose frees come from another thread (so meshing has spans to merge), and then
// checks the longest pause: the part of it not spent waiting for a guarded operation in flight
// (that is a program thread preempted inside one, which no priority of ours can help) must stay
// under --max-own-ms.
//
// Usage: meshalloc_mesh_pause_load [--seconds S] [--max-own-ms MS]
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "heap_counters.h"

namespace {

constexpr size_t kObjectsPerRound = 200000;
constexpr size_t kKeepOneIn = 5;
constexpr size_t kSizeSteps = 4;
constexpr size_t kSizeStep = 64;
constexpr auto kRoundGap = std::chrono::milliseconds(50);

struct Options {
  double seconds = 4.0;
  double maxOwnMs = 20.0;
};

Options parse(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i++) {
    if (i + 1 < argc && !strcmp(argv[i], "--seconds")) {
      options.seconds = atof(argv[++i]);
    } else if (i + 1 < argc && !strcmp(argv[i], "--max-own-ms")) {
      options.maxOwnMs = atof(argv[++i]);
    } else {
      fprintf(stderr, "mesh_pause_load: unknown option '%s'\n", argv[i]);
      exit(2);
    }
  }
  return options;
}

}  // namespace

int main(int argc, char** argv) {
  Options options = parse(argc, argv);
  unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  std::atomic<bool> stop{false};
  std::vector<std::thread> spinners;
  for (unsigned i = 0; i < cpus; i++) {
    spinners.emplace_back([&stop] {
      volatile uint64_t work = 0;
      while (!stop.load(std::memory_order_relaxed)) work = work + 1;
    });
  }
  std::mt19937_64 rng(1);
  std::vector<unsigned char*> live;
  auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(options.seconds);
  unsigned rounds = 0;
  while (std::chrono::steady_clock::now() < end) {
    for (size_t i = 0; i < kObjectsPerRound; i++) {
      size_t size = kSizeStep * (1 + rng() % kSizeSteps);
      auto* block = static_cast<unsigned char*>(malloc(size));
      memset(block, static_cast<int>(i & 0xff), kSizeStep);
      live.push_back(block);
    }
    std::shuffle(live.begin(), live.end(), rng);
    size_t keep = live.size() / kKeepOneIn;
    std::thread freer([&live, keep] {
      for (size_t i = keep; i < live.size(); i++) free(live[i]);
    });
    freer.join();
    live.resize(keep);
    rounds++;
    std::this_thread::sleep_for(kRoundGap);
  }
  stop.store(true);
  for (std::thread& spinner : spinners) spinner.join();
  for (unsigned char* block : live) free(block);

  uint64_t meshes = stress::readCounter("mesh.count");
  uint64_t pauseMaxNs = stress::readCounter("mesh.pause_max_ns");
  uint64_t waitNs = stress::readCounter("mesh.pause_wait_max_ns");
  double ownMs = static_cast<double>(pauseMaxNs - std::min(waitNs, pauseMaxNs)) / 1e6;
  printf(
      "mesh_pause_load: %u rounds, %u spinning threads, %lu meshes, longest pause %.3f ms "
      "(%.3f ms waiting for operations in flight, %.3f ms its own)\n",
      rounds, cpus, static_cast<unsigned long>(meshes), static_cast<double>(pauseMaxNs) / 1e6,
      static_cast<double>(waitNs) / 1e6, ownMs);
  if (meshes == 0) {
    fprintf(stderr, "mesh_pause_load: FAILED: nothing was meshed\n");
    return 1;
  }
  if (ownMs > options.maxOwnMs) {
    fprintf(stderr,
            "mesh_pause_load: FAILED: the longest pause took %.3f ms of its own (limit %.1f)\n",
            ownMs, options.maxOwnMs);
    return 1;
  }
  return 0;
}
