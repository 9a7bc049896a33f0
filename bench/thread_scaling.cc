// thread-scaling: how much memory an allocator holds at the end of a workload whose threads
// each retain a fraction of what they allocated, as the number of threads grows (the mimalloc
// thread-scaling study's question, asked of a plain malloc workload).
//
// T threads start together on a barrier. In each of `rounds` rounds every thread allocates
// `objects` objects of a random size in [min, max] (uniform, or with --log-sizes log-uniform:
// every doubling equally likely, so a range such as 16 B..16 KiB puts objects in every small
// size class, as the thread-scaling study's workload did), writes a pattern into every byte,
// keeps a random `keep-percent` of them (exactly that many, chosen by selection sampling) until
// the end of the run and frees the rest. Threads stay alive until every thread has finished,
// then wait, alive and idle, on a condition variable, as a server's thread pool does between
// requests. The main thread sleeps --settle-ms and reads PSS with the threads alive
// (alive_pss_bytes), then wakes them: each checks that every object it kept is intact and
// exits. Once they are joined, the main thread adds up the live bytes (requested sizes of the
// retained objects), optionally calls meshalloc_compact() (--compact, only if the symbol
// exists), sleeps --settle-ms again so background work (meshing, decay) can act, reads its own
// PSS (/proc/self/smaps_rollup), page-table bytes (VmPTE) and mapping count, verifies every
// retained object's pattern and prints one line:
//
//   threads=T live_bytes=... pss_bytes=... pte_bytes=... ratio=pss/live seconds=...
//     base_pss_bytes=... mappings=... retained=... checksum=...
//     alive_pss_bytes=... alive_pte_bytes=... alive_ratio=alive_pss/live
//
// base_pss_bytes is the PSS measured before any thread started (program, libraries, stack):
// the part of pss_bytes no allocator can avoid. `seconds` is the wall time of the threaded
// part. The bookkeeping (the retained objects' addresses) lives in private mmap()ed memory and
// is subtracted from the measured PSS; it never passes through the allocator under test.
//
// --time-limit S ends the process with SIGALRM after S seconds, so a harness that runs it under
// an allocator that deadlocks gets a failed run instead of a hang.
//
// Only plain malloc/free are called, so any allocator can be put underneath with LD_PRELOAD.
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cinttypes>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <mutex>
#include <thread>
#include <vector>

#include "common.h"

namespace {

struct Options {
  uint64_t threads = 1;
  uint64_t rounds = 5;
  uint64_t objects = 10000;
  uint64_t keepPercent = 10;
  uint64_t minSize = 16;
  uint64_t maxSize = 1024;
  uint64_t seed = 1;
  uint64_t settleMs = 300;
  uint64_t timeLimitS = 0;  // 0: no limit
  bool compact = false;
  bool allocatorStats = false;
  bool logSizes = false;
  const char* pageAccount = nullptr;  // --page-account FILE
};

[[noreturn]] void usage(const char* program, const char* why) {
  if (why) fprintf(stderr, "%s: %s\n", program, why);
  fprintf(
      stderr,
      "usage: %s [--threads T] [--rounds 5] [--objects 10000] [--keep-percent 10] [--min 16]\n"
      "          [--max 1024] [--log-sizes] [--seed S] [--settle-ms 300] [--time-limit S]\n"
      "          [--compact] [--allocator-stats] [--page-account FILE]\n"
      "Options take `--name value` or `--name=value`. --log-sizes draws sizes log-uniformly\n"
      "(every doubling of [min, max] equally likely) instead of uniformly; --time-limit ends the\n"
      "run with SIGALRM after S seconds (0: never); --compact calls meshalloc_compact() (if the\n"
      "allocator exports it) after the threads are joined; --allocator-stats prints meshalloc's\n"
      "statistics (meshalloc_print_stats, with its memory breakdown) on stderr at both readings;\n"
      "--page-account writes every kept object and every present page with its physical frame\n"
      "(root only) to FILE after the reading after exit, for scripts/page_account.py.\n",
      program);
  exit(2);
}

Options parseArguments(int argc, char** argv) {
  Options o;
  struct Numeric {
    const char* name;
    uint64_t* value;
  } numeric[] = {{"threads", &o.threads},
                 {"rounds", &o.rounds},
                 {"objects", &o.objects},
                 {"keep-percent", &o.keepPercent},
                 {"min", &o.minSize},
                 {"max", &o.maxSize},
                 {"seed", &o.seed},
                 {"settle-ms", &o.settleMs},
                 {"time-limit", &o.timeLimitS}};
  struct Flag {
    const char* name;
    bool* value;
  } flags[] = {
      {"compact", &o.compact}, {"log-sizes", &o.logSizes}, {"allocator-stats", &o.allocatorStats}};
  for (int i = 1; i < argc; i++) {
    const char* arg = argv[i];
    if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) usage(argv[0], nullptr);
    if (strncmp(arg, "--", 2) != 0) usage(argv[0], "options start with --");
    arg += 2;
    const char* equals = strchr(arg, '=');
    size_t nameLength = equals ? static_cast<size_t>(equals - arg) : strlen(arg);
    // Flags; `--compact=0` / `--compact=1` are accepted too.
    bool isFlag = false;
    for (const Flag& f : flags) {
      if (strlen(f.name) == nameLength && !strncmp(f.name, arg, nameLength)) {
        *f.value = !equals || strcmp(equals + 1, "0") != 0;
        isFlag = true;
      }
    }
    if (isFlag) continue;
    if (nameLength == strlen("page-account") && !strncmp(arg, "page-account", nameLength)) {
      o.pageAccount = equals ? equals + 1 : (i + 1 < argc ? argv[++i] : nullptr);
      if (!o.pageAccount || !*o.pageAccount) usage(argv[0], "--page-account needs a file");
      continue;
    }
    uint64_t* target = nullptr;
    for (const Numeric& n : numeric) {
      if (strlen(n.name) == nameLength && !strncmp(n.name, arg, nameLength)) target = n.value;
    }
    if (!target) usage(argv[0], "unknown option");
    const char* value = equals ? equals + 1 : (i + 1 < argc ? argv[++i] : nullptr);
    if (!value || !bench::parseNumber(value, target)) usage(argv[0], "bad or missing value");
  }
  if (o.threads < 1 || o.threads > 4096) usage(argv[0], "--threads must be in 1..4096");
  if (o.rounds < 1 || o.objects < 1) usage(argv[0], "--rounds and --objects must be positive");
  if (o.keepPercent > 100) usage(argv[0], "--keep-percent must be in 0..100");
  // alarm() takes seconds as an unsigned int.
  if (o.timeLimitS > UINT32_MAX) usage(argv[0], "--time-limit is too large");
  if (o.minSize < 1 || o.minSize > o.maxSize || o.maxSize > (uint64_t{1} << 30)) {
    usage(argv[0], "need 1 <= --min <= --max <= 1G");
  }
  return o;
}

// ---------------------------------------------------------------------------------------------
// The pattern: every byte of an object is a function of its address, its size and the run's
// seed, so a stale or foreign copy is noticed.

inline uint64_t patternBase(const void* p, size_t size, uint64_t seed) {
  uint64_t x = reinterpret_cast<uintptr_t>(p) * 0x9e3779b97f4a7c15ULL ^ (size << 20) ^ seed;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  return x ^ (x >> 29);
}

inline uint64_t patternWord(uint64_t base, size_t word) {
  return base + word * 0xd1b54a32d192ed03ULL;
}

void fill(void* p, size_t size, uint64_t seed) {
  auto* bytes = static_cast<unsigned char*>(p);
  const uint64_t base = patternBase(p, size, seed);
  size_t words = size / 8;
  for (size_t w = 0; w < words; w++) {
    uint64_t v = patternWord(base, w);
    memcpy(bytes + 8 * w, &v, 8);
  }
  uint64_t tail = patternWord(base, words);
  for (size_t i = 8 * words; i < size; i++)
    bytes[i] = static_cast<unsigned char>(tail >> (8 * (i - 8 * words)));
}

bool intact(const void* p, size_t size, uint64_t seed) {
  const auto* bytes = static_cast<const unsigned char*>(p);
  const uint64_t base = patternBase(p, size, seed);
  size_t words = size / 8;
  for (size_t w = 0; w < words; w++) {
    uint64_t v;
    memcpy(&v, bytes + 8 * w, 8);
    if (v != patternWord(base, w)) return false;
  }
  uint64_t tail = patternWord(base, words);
  for (size_t i = 8 * words; i < size; i++) {
    if (bytes[i] != static_cast<unsigned char>(tail >> (8 * (i - 8 * words)))) return false;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// One thread's work.

struct Retained {
  void* p;
  size_t size;
};

struct Worker {
  Retained* retained = nullptr;  // mmap()ed, capacity rounds * keep
  size_t count = 0;
  size_t capacity = 0;
  size_t damaged = 0;  // retained objects found altered after the idle wait
};

// Where the finished threads wait, alive and idle, until the main thread has read its PSS.
struct IdlePool {
  std::mutex lock;
  std::condition_variable changed;
  unsigned waiting = 0;
  bool released = false;
};

void work(const Options& o, unsigned index, Worker* worker, bench::Barrier* start,
          bench::Barrier* done, IdlePool* idle) {
  bench::Rng rng(o.seed, index + 1);
  const size_t perRound = o.objects;
  const size_t keepPerRound = perRound * o.keepPercent / 100;
  // The round's objects, outside the allocator; unmapped before the thread waits at the end.
  const size_t scratchBytes = perRound * sizeof(Retained);
  auto* round = static_cast<Retained*>(bench::mapPrivate(scratchBytes, "thread_scaling"));
  start->wait();
  for (uint64_t r = 0; r < o.rounds; r++) {
    for (size_t i = 0; i < perRound; i++) {
      size_t size =
          o.logSizes ? rng.logUniform(o.minSize, o.maxSize) : rng.between(o.minSize, o.maxSize);
      void* p = bench::mustMalloc(size);
      fill(p, size, o.seed);
      round[i] = {p, size};
    }
    // Selection sampling: exactly keepPerRound objects, each subset equally likely.
    size_t needed = keepPerRound;
    for (size_t i = 0; i < perRound; i++) {
      if (needed > 0 && rng.below(perRound - i) < needed) {
        worker->retained[worker->count++] = round[i];
        needed--;
      } else {
        free(round[i].p);
      }
    }
  }
  munmap(round, scratchBytes);
  done->wait();  // every thread stays alive until all have finished
  {
    std::unique_lock<std::mutex> guard(idle->lock);
    idle->waiting++;
    idle->changed.notify_all();
    idle->changed.wait(guard, [idle] { return idle->released; });
  }
  // Whatever the allocator did with this thread's memory while it slept, its objects are intact.
  for (size_t i = 0; i < worker->count; i++) {
    if (!intact(worker->retained[i].p, worker->retained[i].size, o.seed)) worker->damaged++;
  }
}

// Where the allocator's memory is at a reading, if it can say (meshalloc's breakdown).
void printAllocatorStats(const char* moment) {
  using PrintStats = void (*)(int, int);
  auto print = reinterpret_cast<PrintStats>(dlsym(RTLD_DEFAULT, "meshalloc_print_stats"));
  if (!print) return;
  fprintf(stderr, "thread_scaling: allocator statistics, %s\n", moment);
  print(STDERR_FILENO, 0);
}

// ---------------------------------------------------------------------------------------------
// The page account (--page-account): each kept object (address, requested and usable size) and
// each present page of the process with its physical frame and its mapping's name, so that
// scripts/page_account.py can count every physical page once (a meshed page is mapped at several
// addresses) and say what it holds. Written after both readings, so its allocations (stdio) and
// page-table walks change nothing measured. Frame numbers need root (else they read as 0).
bool writePageAccount(const char* path, const std::vector<Worker>& workers) {
  FILE* out = fopen(path, "w");
  if (!out) return false;
  const size_t page = bench::pageSize();
  volatile unsigned char sink = 0;
  for (const Worker& w : workers) {
    for (size_t i = 0; i < w.count; i++) {
      const Retained& r = w.retained[i];
      // Touching every page maps each alias a meshing allocator left lazy.
      const unsigned char* bytes = static_cast<const unsigned char*>(r.p);
      for (size_t offset = 0; offset < r.size; offset += page) sink = sink + bytes[offset];
      sink = sink + bytes[r.size - 1];
      fprintf(out, "object %" PRIxPTR " %zu %zu\n", reinterpret_cast<uintptr_t>(r.p), r.size,
              malloc_usable_size(r.p));
    }
  }
  FILE* maps = fopen("/proc/self/maps", "r");
  int pagemap = open("/proc/self/pagemap", O_RDONLY | O_CLOEXEC);
  bool ok = maps && pagemap >= 0;
  char line[4096];
  constexpr size_t kBatch = 512;
  uint64_t entries[kBatch];
  while (ok && fgets(line, sizeof(line), maps)) {
    uintptr_t low, high;
    int nameAt = 0;
    if (sscanf(line, "%" SCNxPTR "-%" SCNxPTR " %*s %*s %*s %*s %n", &low, &high, &nameAt) < 2)
      continue;
    char* name = line + nameAt;
    name[strcspn(name, "\n")] = '\0';
    if (!strcmp(name, "[vsyscall]")) continue;  // outside the page tables pagemap reads
    for (uintptr_t at = low; at < high; at += kBatch * page) {
      size_t count = (high - at) / page < kBatch ? (high - at) / page : kBatch;
      ssize_t got = pread(pagemap, entries, count * sizeof(uint64_t),
                          static_cast<off_t>(at / page * sizeof(uint64_t)));
      if (got < 0) break;
      for (size_t k = 0; k < static_cast<size_t>(got) / sizeof(uint64_t); k++) {
        if (!(entries[k] >> 63)) continue;  // not present
        fprintf(out, "page %" PRIxPTR " %" PRIu64 " %s\n", at + k * page,
                entries[k] & ((uint64_t{1} << 55) - 1), *name ? name : "[anon]");
      }
    }
  }
  if (maps) fclose(maps);
  if (pagemap >= 0) close(pagemap);
  return fclose(out) == 0 && ok;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parseArguments(argc, argv);
  // SIGALRM's default action ends the process: a deadlocked allocator cannot hang the caller.
  if (o.timeLimitS) alarm(static_cast<unsigned>(o.timeLimitS));
  const unsigned threads = static_cast<unsigned>(o.threads);
  const size_t capacity = static_cast<size_t>(o.rounds) * (o.objects * o.keepPercent / 100);

  std::vector<Worker> workers(threads);
  for (Worker& w : workers) {
    w.capacity = capacity;
    w.retained = capacity ? static_cast<Retained*>(
                                bench::mapPrivate(capacity * sizeof(Retained), "thread_scaling"))
                          : nullptr;
  }
  std::vector<std::thread> pool;
  pool.reserve(threads);
  const long long basePss = bench::procField("/proc/self/smaps_rollup", "Pss:");

  // The main thread joins the start barrier too, so the clock starts when everyone is ready.
  bench::Barrier start(threads + 1), done(threads);
  IdlePool idle;
  for (unsigned t = 0; t < threads; t++)
    pool.emplace_back(work, std::cref(o), t, &workers[t], &start, &done, &idle);
  start.wait();
  const double begin = bench::now();
  {
    std::unique_lock<std::mutex> guard(idle.lock);
    idle.changed.wait(guard, [&idle, threads] { return idle.waiting == threads; });
  }
  const double seconds = bench::now() - begin;
  // The threads are alive and idle: what a server's pool holds between bursts of work.
  bench::sleepMilliseconds(o.settleMs);
  long long alivePss = bench::procField("/proc/self/smaps_rollup", "Pss:");
  if (o.allocatorStats) printAllocatorStats("alive");
  const long long alivePte = bench::procField("/proc/self/status", "VmPTE:");
  {
    std::lock_guard<std::mutex> guard(idle.lock);
    idle.released = true;
  }
  idle.changed.notify_all();
  for (std::thread& t : pool) t.join();
  for (const Worker& w : workers) {
    if (w.damaged) {
      fprintf(stderr, "thread_scaling: %zu retained objects altered while their thread was idle\n",
              w.damaged);
      return 1;
    }
  }

  uint64_t liveBytes = 0, retained = 0;
  for (const Worker& w : workers) {
    retained += w.count;
    for (size_t i = 0; i < w.count; i++) liveBytes += w.retained[i].size;
  }

  if (o.compact) {
    using CompactFn = size_t (*)();
    if (auto compact = reinterpret_cast<CompactFn>(dlsym(RTLD_DEFAULT, "meshalloc_compact")))
      compact();
  }
  bench::sleepMilliseconds(o.settleMs);

  // The bookkeeping (the retained lists, fully written: selection sampling keeps exactly
  // `capacity` objects per thread) lives in private mappings that are not the allocator's:
  // their pages are taken out of the measured PSS.
  const long long page = static_cast<long long>(bench::pageSize());
  long long bookkeeping = 0;
  for (const Worker& w : workers) {
    bookkeeping += (static_cast<long long>(w.count * sizeof(Retained)) + page - 1) / page * page;
  }
  long long pss = bench::procField("/proc/self/smaps_rollup", "Pss:");
  if (o.allocatorStats) printAllocatorStats("after exit");
  if (alivePss >= 0) alivePss -= bookkeeping;
  const long long pte = bench::procField("/proc/self/status", "VmPTE:");
  const long long mappings = bench::mappingCount();
  if (pss >= 0) pss -= bookkeeping;
  if (o.pageAccount && !writePageAccount(o.pageAccount, workers)) {
    fprintf(stderr, "thread_scaling: cannot write the page account to %s\n", o.pageAccount);
    return 1;
  }

  uint64_t checksum = 0;
  for (Worker& w : workers) {
    for (size_t i = 0; i < w.count; i++) {
      if (!intact(w.retained[i].p, w.retained[i].size, o.seed))
        bench::corrupted(w.retained[i].p, w.retained[i].size);
      checksum = checksum * 0x100000001b3ULL ^ w.retained[i].size;
    }
    for (size_t i = 0; i < w.count; i++) free(w.retained[i].p);
    if (w.retained) munmap(w.retained, w.capacity * sizeof(Retained));
    w.retained = nullptr;
  }

  printf("threads=%u live_bytes=%" PRIu64
         " pss_bytes=%lld pte_bytes=%lld ratio=%.3f seconds=%.4f "
         "base_pss_bytes=%lld mappings=%lld retained=%" PRIu64 " checksum=%016" PRIx64
         " alive_pss_bytes=%lld alive_pte_bytes=%lld alive_ratio=%.3f\n",
         threads, liveBytes, pss, pte,
         liveBytes ? static_cast<double>(pss) / static_cast<double>(liveBytes) : 0.0, seconds,
         basePss, mappings, retained, checksum, alivePss, alivePte,
         liveBytes ? static_cast<double>(alivePss) / static_cast<double>(liveBytes) : 0.0);
  return 0;
}
