// large-heap: the case meshing was invented for. One thread fills --bytes of --size objects
// (256 B by default), frees a random --free-percent of them (exactly that many, each subset
// equally likely), then stays idle for --idle-ms while the main thread samples its own memory
// every --sample-ms. Nothing is allocated after the frees: whatever the allocator gives back
// during the idle time, it gives back on its own (decay, meshing). At the end every surviving
// object's tag is checked and all are freed.
//
// The allocating thread stays alive, blocked on a condition variable, through the idle time (a
// server's worker between bursts); --exit-thread 1 lets it exit instead.
//
// Each sample is one line on stdout:
//   sample t_s=... pss_bytes=... pte_bytes=... mappings=... mesh_cpu_ns=...
// and the last line sums the run up:
//   workload=large_heap live_bytes=... objects=... fill_s=... free_s=... pss_after_free=...
//     pss_end=... ratio_end=... seconds_to_2x=... pte_end=... mappings_end=... mesh_cpu_ns=...
//     checksum=...
// PSS excludes the benchmark's own bookkeeping (the object table, in private mmap()ed memory).
// seconds_to_2x is the first sample at which PSS was at most twice the live bytes (-1: never).
// mesh_cpu_ns is meshalloc's `mesh.cpu_ns` (through mallctl, if the allocator has it; else -1).
#include <dlfcn.h>

#include <cinttypes>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common.h"

namespace {

uint64_t gBytes = uint64_t{2} << 30;
uint64_t gSize = 256;
uint64_t gFreePercent = 75;
uint64_t gIdleMs = 60000;
uint64_t gSampleMs = 1000;
uint64_t gSeed = 1;
uint64_t gExitThread = 0;
uint64_t gTimeLimitS = 0;

const bench::Option kOptions[] = {
    {"bytes", &gBytes, "bytes of objects allocated"},
    {"size", &gSize, "object size"},
    {"free-percent", &gFreePercent, "share of the objects freed at random"},
    {"idle-ms", &gIdleMs, "how long the heap is watched after the frees"},
    {"sample-ms", &gSampleMs, "sampling period"},
    {"seed", &gSeed, "random seed"},
    {"exit-thread", &gExitThread, "1: the allocating thread exits before the idle time"},
    {"time-limit", &gTimeLimitS, "end the process with SIGALRM after this many s (0: never)"},
};

using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);

long long meshCpuNs(Mallctl mallctl) {
  if (!mallctl) return -1;
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  uint64_t value = 0;
  length = sizeof(value);
  if (mallctl("mesh.cpu_ns", &value, &length, nullptr, 0) != 0) return -1;
  return static_cast<long long>(value);
}

}  // namespace

int main(int argc, char** argv) {
  bench::parseOptions(argc, argv, "large_heap", kOptions);
  if (gSize < 8 || gFreePercent > 100 || gSampleMs == 0 || gBytes < gSize) {
    fprintf(stderr, "large_heap: need --size >= 8, --free-percent <= 100, --sample-ms > 0\n");
    return 2;
  }
  if (gTimeLimitS) alarm(static_cast<unsigned>(gTimeLimitS));
  auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  const size_t count = gBytes / gSize;
  const size_t tableBytes = count * sizeof(void*);
  auto** table = static_cast<void**>(bench::mapPrivate(tableBytes, "large_heap"));
  const long long page = static_cast<long long>(bench::pageSize());
  size_t kept = 0;
  double fillSeconds = 0, freeSeconds = 0;

  std::mutex lock;
  std::condition_variable changed;
  bool filled = false, finished = false;
  std::thread worker([&] {
    bench::Rng rng(gSeed);
    double start = bench::now();
    for (size_t i = 0; i < count; i++) {
      table[i] = bench::mustMalloc(gSize);
      bench::touch(table[i], gSize, bench::tagFor(i, gSize));
    }
    fillSeconds = bench::now() - start;
    start = bench::now();
    // Selection sampling: exactly count * free-percent / 100 objects, each subset equally likely.
    size_t toFree = count * gFreePercent / 100;
    for (size_t i = 0; i < count; i++) {
      if (toFree > 0 && rng.below(count - i) < toFree) {
        free(table[i]);
        table[i] = nullptr;
        toFree--;
      } else {
        kept++;
      }
    }
    freeSeconds = bench::now() - start;
    std::unique_lock<std::mutex> guard(lock);
    filled = true;
    changed.notify_all();
    if (!gExitThread) changed.wait(guard, [&] { return finished; });
  });
  {
    std::unique_lock<std::mutex> guard(lock);
    changed.wait(guard, [&] { return filled; });
  }
  if (gExitThread) worker.join();

  const uint64_t liveBytes = kept * gSize;
  // The table's pages are all touched: they are taken out of every PSS reading.
  const long long bookkeeping = (static_cast<long long>(tableBytes) + page - 1) / page * page;
  auto pssNow = [&] { return bench::procField("/proc/self/smaps_rollup", "Pss:") - bookkeeping; };
  const long long pssAfterFree = pssNow();
  const double idleStart = bench::now();
  double secondsTo2x = -1;
  long long pss = pssAfterFree, pte = -1, mappings = -1;
  for (uint64_t elapsed = 0;; elapsed += gSampleMs) {
    double t = bench::now() - idleStart;
    pss = pssNow();
    pte = bench::procField("/proc/self/status", "VmPTE:");
    mappings = bench::mappingCount();
    if (secondsTo2x < 0 && pss >= 0 && static_cast<uint64_t>(pss) <= 2 * liveBytes) secondsTo2x = t;
    printf("sample t_s=%.3f pss_bytes=%lld pte_bytes=%lld mappings=%lld mesh_cpu_ns=%lld\n", t, pss,
           pte, mappings, meshCpuNs(mallctl));
    fflush(stdout);
    if (elapsed >= gIdleMs) break;
    bench::sleepMilliseconds(gSampleMs);
  }

  {
    std::lock_guard<std::mutex> guard(lock);
    finished = true;
  }
  changed.notify_all();
  if (!gExitThread) worker.join();
  uint64_t checksum = 0;
  for (size_t i = 0; i < count; i++) {
    if (!table[i]) continue;
    checksum ^= bench::check(table[i], gSize, bench::tagFor(i, gSize));
    free(table[i]);
  }
  munmap(table, tableBytes);
  printf("workload=large_heap live_bytes=%" PRIu64
         " objects=%zu fill_s=%.3f free_s=%.3f pss_after_free=%lld pss_end=%lld ratio_end=%.3f "
         "seconds_to_2x=%.3f pte_end=%lld mappings_end=%lld mesh_cpu_ns=%lld checksum=%016" PRIx64
         "\n",
         liveBytes, count, fillSeconds, freeSeconds, pssAfterFree, pss,
         liveBytes ? static_cast<double>(pss) / static_cast<double>(liveBytes) : 0.0, secondsTo2x,
         pte, mappings, meshCpuNs(mallctl), checksum);
  return 0;
}
