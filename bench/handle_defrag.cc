// The defragmenter's costs and gains, in one process linked with libmeshalloc (docs/handles.md,
// "Measurements"). The per-operation costs (mh_alloc+mh_free against malloc+free, pins) are
// bench/handle_cache/handle_ops's.
//   defrag   mutator threads pinning and writing, and replacing most of their objects by ones
//            of another size range every few milliseconds, under the default controller: its
//            CPU share of wall time, the waits of mutators caused by moves (class locks a move
//            held) and the others (class locks other mutators held), as the library times
//            them, and the longest call of any handle operation (which includes those waits
//            and the machine's preemptions)
//   compact  a heap of handles of 16-512 bytes fragmented ten to one, then one full
//            mh_compact: committed against live bytes (run it with MESHALLOC_HANDLES_DEFRAG=0,
//            or the controller compacts while the heap is being fragmented)
// Usage: handle_defrag defrag|compact [seconds | objects]
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <cstdint>
#include <random>
#include <thread>
#include <vector>

#include "meshalloc.h"
#include "meshalloc_handle.h"

namespace {

uint64_t nowNs() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return uint64_t(ts.tv_sec) * 1000000000 + uint64_t(ts.tv_nsec);
}

uint64_t stat(const char* name) {
  uint64_t value = 0;
  size_t length = sizeof(value);
  if (meshalloc_mallctl(name, &value, &length, nullptr, 0) != 0) {
    fprintf(stderr, "handle_defrag: mallctl %s failed\n", name);
    exit(1);
  }
  return value;
}

struct Object {
  mh_t handle;
  size_t size;
};

std::atomic<uint64_t> gMaxOpNs{0};
std::atomic<uint64_t> gOps{0};
// Latencies of handle calls by power of two of nanoseconds.
constexpr int kBuckets = 48;
std::atomic<uint64_t> gLatency[kBuckets];

void noteOp(uint64_t ns) {
  gLatency[63 - __builtin_clzll(ns | 1)].fetch_add(1, std::memory_order_relaxed);
  uint64_t max = gMaxOpNs.load(std::memory_order_relaxed);
  while (ns > max && !gMaxOpNs.compare_exchange_weak(max, ns)) {
  }
}

// The upper bound of the bucket holding the `fraction` quantile of the calls.
double quantileUs(double fraction) {
  uint64_t total = 0;
  for (auto& b : gLatency) total += b.load();
  uint64_t seen = 0;
  for (int i = 0; i < kBuckets; i++) {
    seen += gLatency[i].load();
    if (double(seen) >= fraction * double(total)) return double(uint64_t{2} << i) / 1e3;
  }
  return 0;
}

void mutator(unsigned seed, std::atomic<bool>& stop) {
  std::mt19937_64 rng(seed);
  std::vector<Object> objects(50000);
  unsigned phase = 0;
  auto make = [&](Object& o) {
    o.size = 16 + (phase % 4) * 128 + rng() % 112;
    uint64_t t = nowNs();
    o.handle = mh_alloc(o.size);
    noteOp(nowNs() - t);
  };
  for (Object& o : objects) make(o);
  uint64_t ops = 0;
  uint64_t nextPhase = nowNs() + 20000000;
  while (!stop.load(std::memory_order_relaxed)) {
    Object& o = objects[rng() % objects.size()];
    uint64_t t = nowNs();
    auto* p = static_cast<unsigned char*>(mh_pin(o.handle));
    noteOp(nowNs() - t);
    memset(p, int(ops), o.size);
    mh_unpin(o.handle);
    ops++;
    if (nowNs() > nextPhase) {
      // Most objects replaced by ones of the next size range: the old classes go sparse.
      phase++;
      for (Object& x : objects) {
        if (rng() % 10 == 0) continue;
        t = nowNs();
        mh_free(x.handle);
        noteOp(nowNs() - t);
        make(x);
      }
      nextPhase = nowNs() + 200000000;
    }
  }
  for (Object& x : objects) mh_free(x.handle);
  gOps.fetch_add(ops);
}

int defrag(int seconds) {
  std::atomic<bool> stop{false};
  uint64_t cpu0 = stat("handles.cpu_ns");
  uint64_t start = nowNs();
  std::vector<std::thread> threads;
  for (unsigned t = 0; t < 2; t++) threads.emplace_back(mutator, t + 1, std::ref(stop));
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  uint64_t committed = stat("handles.committed"), live = stat("handles.live_bytes");
  stop = true;
  for (std::thread& t : threads) t.join();
  double wall = double(nowNs() - start);
  double cpu = double(stat("handles.cpu_ns") - cpu0);
  printf("defrag CPU %.2f %% of wall time (%.0f ms of %.0f ms), %llu passes, %llu MiB moved\n",
         100 * cpu / wall, cpu / 1e6, wall / 1e6, (unsigned long long)stat("handles.passes"),
         (unsigned long long)(stat("handles.moved_bytes") >> 20));
  printf(
      "waits caused by a move: %llu, 99.99th percentile under %.1f us, longest %.1f us; longest "
      "class-lock hold by a move %.1f us\n",
      (unsigned long long)stat("handles.pauses"), double(stat("handles.pause_p9999_ns")) / 1e3,
      double(stat("handles.pause_max_ns")) / 1e3, double(stat("handles.move_hold_max_ns")) / 1e3);
  printf(
      "other waits (class locks of other threads): %llu, 99.99th percentile under %.1f us, "
      "longest %.1f us\n",
      (unsigned long long)stat("handles.lock_waits"),
      double(stat("handles.lock_wait_p9999_ns")) / 1e3,
      double(stat("handles.lock_wait_max_ns")) / 1e3);
  printf("CPU budget shared with meshing: meshing charged %.0f ms, the defragmenter %.0f ms\n",
         double(stat("handles.budget_meshing_ns")) / 1e6,
         double(stat("handles.budget_handles_ns")) / 1e6);
  printf("handle calls: %llu pins; 99.99th percentile under %.1f us, longest %.1f us\n",
         (unsigned long long)gOps.load(), quantileUs(0.9999), double(gMaxOpNs.load()) / 1e3);
  printf("at the end: committed %.1f MiB, live %.1f MiB (%.2fx)\n", double(committed) / 1048576,
         double(live) / 1048576, double(committed) / double(live));
  return 0;
}

int compact(size_t objects) {
  std::mt19937_64 rng(3);
  std::vector<mh_t> all(objects), kept;
  for (size_t i = 0; i < all.size(); i++) all[i] = mh_alloc(16 + rng() % 496);
  for (size_t i = 0; i < all.size(); i++) {
    if (i % 10 == 0) {
      kept.push_back(all[i]);
    } else {
      mh_free(all[i]);
    }
  }
  uint64_t before = stat("handles.committed"), live = stat("handles.live_bytes");
  uint64_t start = nowNs();
  size_t released = mh_compact(0);
  double ms = double(nowNs() - start) / 1e6;
  uint64_t after = stat("handles.committed");
  uint64_t table = stat("handles.table_bytes");
  printf(
      "live %.2f MiB; committed %.2f MiB before (%.2fx), %.2f MiB after a full pass (%.3fx); "
      "table %.2f MiB; pass %.1f ms, released %.2f MiB\n",
      double(live) / 1048576, double(before) / 1048576, double(before) / double(live),
      double(after) / 1048576, double(after) / double(live), double(table) / 1048576, ms,
      double(released) / 1048576);
  for (mh_t h : kept) mh_free(h);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    fprintf(stderr, "usage: handle_defrag defrag|compact [seconds or objects]\n");
    return 2;
  }
  int n = argc > 2 ? atoi(argv[2]) : 0;
  if (!strcmp(argv[1], "defrag")) return defrag(n > 0 ? n : 10);
  if (!strcmp(argv[1], "compact")) return compact(n > 0 ? size_t(n) : 400000);
  fprintf(stderr, "handle_defrag: unknown mode %s\n", argv[1]);
  return 2;
}
