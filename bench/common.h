// Shared helpers of the allocator microbenchmarks: command-line options, a deterministic RNG,
// size distributions, memory touching with corruption checks, the working-set loop of the
// fast-path benchmarks, timing and the one result line.
//
// The benchmarks only call the plain C allocation functions (malloc, free, realloc), so any
// allocator can be put underneath with LD_PRELOAD; they never link meshalloc.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

namespace bench {

// ---------------------------------------------------------------------------------------------
// Command line: every option is `--name=value` or `--name value`; sizes accept K/M/G suffixes.

struct Option {
  const char* name;
  uint64_t* value;
  const char* help;
};

[[noreturn]] inline void usage(const char* program, const char* workload, const Option* options,
                               size_t count, const char* why) {
  if (why) fprintf(stderr, "%s: %s\n", program, why);
  fprintf(stderr, "usage: %s [--option=value ...]   (workload %s)\n", program, workload);
  for (size_t i = 0; i < count; i++) {
    fprintf(stderr, "  --%-12s %s (default %llu)\n", options[i].name, options[i].help,
            static_cast<unsigned long long>(*options[i].value));
  }
  exit(2);
}

inline bool parseNumber(const char* text, uint64_t* out) {
  char* end = nullptr;
  unsigned long long value = strtoull(text, &end, 10);
  if (end == text) return false;
  unsigned shift = 0;
  switch (*end) {
    case 'k':
    case 'K':
      shift = 10;
      end++;
      break;
    case 'm':
    case 'M':
      shift = 20;
      end++;
      break;
    case 'g':
    case 'G':
      shift = 30;
      end++;
      break;
    default:
      break;
  }
  if (shift && (*end == 'i' || *end == 'I')) end++;
  if (shift && (*end == 'b' || *end == 'B')) end++;
  if (*end != '\0') return false;
  *out = static_cast<uint64_t>(value) << shift;
  return true;
}

template <size_t N>
void parseOptions(int argc, char** argv, const char* workload, const Option (&options)[N]) {
  for (int i = 1; i < argc; i++) {
    const char* arg = argv[i];
    if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0)
      usage(argv[0], workload, options, N, nullptr);
    if (strncmp(arg, "--", 2) != 0) usage(argv[0], workload, options, N, "options start with --");
    arg += 2;
    const char* equals = strchr(arg, '=');
    size_t nameLength = equals ? static_cast<size_t>(equals - arg) : strlen(arg);
    const char* value = equals ? equals + 1 : (i + 1 < argc ? argv[++i] : nullptr);
    const Option* match = nullptr;
    for (const Option& option : options) {
      if (strlen(option.name) == nameLength && strncmp(option.name, arg, nameLength) == 0)
        match = &option;
    }
    if (!match) usage(argv[0], workload, options, N, "unknown option");
    if (!value || !parseNumber(value, match->value))
      usage(argv[0], workload, options, N, "bad or missing value");
  }
}

// ---------------------------------------------------------------------------------------------
// Deterministic random numbers: splitmix64 seeding a xoshiro256** generator.

inline uint64_t splitmix64(uint64_t* state) {
  uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

class Rng {
  __extension__ typedef unsigned __int128 Wide;

 public:
  // Each (seed, stream) pair gives an independent, reproducible sequence; threads use their
  // index as the stream.
  explicit Rng(uint64_t seed, uint64_t stream = 0) {
    uint64_t mix = seed ^ (stream * 0xd1b54a32d192ed03ULL);
    for (uint64_t& word : state_) word = splitmix64(&mix);
  }

  uint64_t next() {
    const uint64_t result = rotl(state_[1] * 5, 7) * 9;
    const uint64_t t = state_[1] << 17;
    state_[2] ^= state_[0];
    state_[3] ^= state_[1];
    state_[1] ^= state_[2];
    state_[0] ^= state_[3];
    state_[2] ^= t;
    state_[3] = rotl(state_[3], 45);
    return result;
  }

  // Uniform in [0, bound), bound > 0 (multiply-shift; the bias is negligible here).
  uint64_t below(uint64_t bound) {
    return static_cast<uint64_t>((static_cast<Wide>(next()) * bound) >> 64);
  }
  // Uniform in [lo, hi].
  uint64_t between(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
  // True with probability permille / 1000.
  bool chance(uint64_t permille) { return below(1000) < permille; }

  // Log-uniform in [lo, hi]: every doubling is equally likely, uniform inside a doubling, the
  // usual shape of real programs' small-object sizes (many small, few large).
  size_t logUniform(size_t lo, size_t hi) {
    if (lo >= hi) return lo;
    unsigned loBits = 63 - static_cast<unsigned>(__builtin_clzll(lo));
    unsigned hiBits = 63 - static_cast<unsigned>(__builtin_clzll(hi));
    for (;;) {
      unsigned bits = loBits + static_cast<unsigned>(below(hiBits - loBits + 1));
      size_t base = size_t{1} << bits;
      size_t size = base + below(base);
      if (size >= lo && size <= hi) return size;
    }
  }

 private:
  static uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
  uint64_t state_[4];
};

// ---------------------------------------------------------------------------------------------
// Touching memory. Every block gets a tag in its first word, its last byte, and one byte in
// every page in between (so fresh pages really fault in); the tag is checked before the block
// is freed, so a benchmark also notices an allocator that hands out overlapping blocks.

inline size_t pageSize() {
  static const size_t size = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return size;
}

inline uint64_t tagFor(uint64_t id, size_t size) {
  return (id * 0x9e3779b97f4a7c15ULL) ^ size;
}

inline void touch(void* block, size_t size, uint64_t tag) {
  unsigned char* bytes = static_cast<unsigned char*>(block);
  if (size >= sizeof(tag)) {
    memcpy(bytes, &tag, sizeof(tag));
  } else if (size) {
    bytes[0] = static_cast<unsigned char>(tag);
  }
  const size_t page = pageSize();
  for (size_t offset = page; offset < size; offset += page)
    bytes[offset] = static_cast<unsigned char>(tag >> 8);
  if (size > sizeof(tag)) bytes[size - 1] = static_cast<unsigned char>(tag >> 16);
}

[[noreturn]] inline void corrupted(const void* block, size_t size) {
  fprintf(stderr, "bench: block %p (size %zu) lost its contents: the allocator corrupted it\n",
          block, size);
  abort();
}

// Checks the tag written by touch(); returns a value to fold into the run's checksum.
inline uint64_t check(const void* block, size_t size, uint64_t tag) {
  const unsigned char* bytes = static_cast<const unsigned char*>(block);
  if (size >= sizeof(tag)) {
    uint64_t seen;
    memcpy(&seen, bytes, sizeof(seen));
    if (seen != tag) corrupted(block, size);
  } else if (size && bytes[0] != static_cast<unsigned char>(tag)) {
    corrupted(block, size);
  }
  if (size > sizeof(tag) && bytes[size - 1] != static_cast<unsigned char>(tag >> 16))
    corrupted(block, size);
  return tag;
}

// The light touch of the fast-path benchmarks: the tag in the first word only, checked before
// the free. Writing every byte of a small block costs as much as the malloc and free around it
// and hides the allocator's own cost; one word still catches blocks handed out twice and free
// lists written into live memory.
inline void touchWord(void* block, uint64_t tag) {
  memcpy(block, &tag, sizeof(tag));
}

inline uint64_t checkWord(const void* block, uint64_t tag) {
  uint64_t seen;
  memcpy(&seen, block, sizeof(seen));
  if (seen != tag) corrupted(block, sizeof(tag));
  return tag;
}

// touch() and check(), or with `light` only the first word (blocks smaller than a word get the
// full touch, which for them is no more).
inline void touch(void* block, size_t size, uint64_t tag, bool light) {
  if (light && size >= sizeof(tag)) {
    touchWord(block, tag);
  } else {
    touch(block, size, tag);
  }
}

inline uint64_t check(const void* block, size_t size, uint64_t tag, bool light) {
  return light && size >= sizeof(tag) ? checkWord(block, tag) : check(block, size, tag);
}

inline void* mustMalloc(size_t size) {
  void* block = malloc(size);
  if (!block) {
    fprintf(stderr, "bench: malloc(%zu) failed\n", size);
    abort();
  }
  return block;
}

// `count` values drawn before the timer starts, for the loop to cycle through: the fast-path
// benchmarks spend a few nanoseconds per malloc and free, and drawing from the generator in
// the loop would add nanoseconds of its own, the same under every allocator, diluting the
// ratios between them.
template <typename Draw>
uint32_t* precompute(size_t count, Draw draw) {
  uint32_t* values = static_cast<uint32_t*>(mustMalloc(count * sizeof(uint32_t)));
  for (size_t i = 0; i < count; i++) values[i] = static_cast<uint32_t>(draw());
  return values;
}

// The loop of turnover and thread-loop: a working set of lightly touched blocks turned over
// by a precomputed cycle of steps.
class WorkingSet {
 public:
  // Steps cycled through: 16384 (64 KiB) stay in the L2 cache beside the blocks.
  static constexpr size_t kCycle = 16384;

  // `slots` live blocks (a power of two, at most 65536) of `minSize` - `maxSize` bytes
  // (log-uniform, below 64 KiB), a step choosing among `choices` slots (at most `slots`).
  WorkingSet(Rng& rng, uint64_t slots, size_t minSize, size_t maxSize, uint64_t choices)
      : slots_(slots), steps_(precompute(kCycle, [&] {
          const uint64_t size = rng.logUniform(minSize, maxSize);  // drawn first, in sequence
          return size << 16 | rng.below(choices);
        })) {}
  ~WorkingSet() { free(steps_); }
  WorkingSet(const WorkingSet&) = delete;
  WorkingSet& operator=(const WorkingSet&) = delete;

  // Fills the slots, makes `iterations` replacements and frees every block, the ids of the
  // tags counting from `id`. Step i frees the block in slot (i * drift + choice) mod slots and
  // mallocs one of the step's size in its place: with drift 1 the choices fall in a window
  // moving on one slot per step, with drift 0 anywhere. Returns the checksum of the tags.
  uint64_t run(uint64_t iterations, uint64_t drift, uint64_t id) const {
    Tagged* blocks = static_cast<Tagged*>(mustMalloc(slots_ * sizeof(Tagged)));
    const uint64_t mask = slots_ - 1;
    uint64_t checksum = 0;
    for (uint64_t i = 0; i < slots_; i++) {
      const size_t size = steps_[i % kCycle] >> 16;
      blocks[i] = fresh(size, tagFor(++id, size));
    }
    for (uint64_t i = 0; i < iterations; i++) {
      const uint32_t step = steps_[i % kCycle];
      const size_t size = step >> 16;
      Tagged* slot = &blocks[(i * drift + (step & 0xffff)) & mask];
      checksum += checkWord(slot->block, slot->tag);
      free(slot->block);
      *slot = fresh(size, tagFor(++id, size));
    }
    for (uint64_t i = 0; i < slots_; i++) {
      checksum += checkWord(blocks[i].block, blocks[i].tag);
      free(blocks[i].block);
    }
    free(blocks);
    return checksum;
  }

  // Whether the constructor's arguments fit: a step holds a size and a choice in 16 bits each.
  static bool fits(uint64_t slots, size_t minSize, size_t maxSize, uint64_t choices) {
    return slots >= 1 && slots <= 0x10000 && !(slots & (slots - 1)) && choices >= 1 &&
           choices <= slots && minSize >= sizeof(uint64_t) && minSize <= maxSize &&
           maxSize <= 0xffff;
  }

 private:
  struct Tagged {
    void* block;
    uint64_t tag;
  };

  static Tagged fresh(size_t size, uint64_t tag) {
    Tagged made = {mustMalloc(size), tag};
    touchWord(made.block, tag);
    return made;
  }

  const uint64_t slots_;
  uint32_t* const steps_;  // the size in the high half, the choice in the low half
};

// ---------------------------------------------------------------------------------------------
// /proc readers that do not allocate (no stdio), so reading cannot change what is measured.

inline ssize_t readWhole(const char* path, char* buffer, size_t capacity) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t used = 0;
  while (used + 1 < capacity) {
    ssize_t n = read(fd, buffer + used, capacity - 1 - used);
    if (n < 0) {
      close(fd);
      return -1;
    }
    if (n == 0) break;
    used += static_cast<size_t>(n);
  }
  close(fd);
  buffer[used] = '\0';
  return static_cast<ssize_t>(used);
}

// The value in kB of the first line starting with `key` (e.g. "Pss:"), in bytes; -1 if absent.
inline long long procField(const char* path, const char* key) {
  static char buffer[1 << 16];
  if (readWhole(path, buffer, sizeof(buffer)) < 0) return -1;
  size_t keyLength = strlen(key);
  for (const char* line = buffer; *line;) {
    if (!strncmp(line, key, keyLength)) return strtoll(line + keyLength, nullptr, 10) * 1024;
    const char* next = strchr(line, '\n');
    if (!next) break;
    line = next + 1;
  }
  return -1;
}

inline long long mappingCount() {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buffer[1 << 16];
  long long lines = 0;
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; i++) lines += buffer[i] == '\n';
  }
  close(fd);
  return lines;
}

// Memory outside the allocator under test, for a benchmark's own bookkeeping.
inline void* mapPrivate(size_t bytes, const char* program) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) {
    fprintf(stderr, "%s: mmap of %zu bytes failed\n", program, bytes);
    exit(1);
  }
  return p;
}

inline void sleepMilliseconds(uint64_t milliseconds) {
  timespec pause = {static_cast<time_t>(milliseconds / 1000),
                    static_cast<long>(milliseconds % 1000) * 1000000L};
  while (milliseconds && nanosleep(&pause, &pause) != 0) {
  }
}

// ---------------------------------------------------------------------------------------------
// Timing and the result line.

inline double now() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

inline long maxRssKb() {
  rusage usage;
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_maxrss;
}

// The single machine-readable line every benchmark prints on stdout: space-separated
// key=value pairs, always starting with workload, threads, seconds, ops. ops_per_s is the
// rate to every digit (mops_per_s rounds slow workloads to a few), so two allocators' rates
// divide to the exact ratio of their times.
inline void report(const char* workload, uint64_t threads, double seconds, uint64_t ops,
                   uint64_t checksum, const char* extra = "") {
  const double rate = seconds > 0 ? static_cast<double>(ops) / seconds : 0.0;
  printf(
      "workload=%s threads=%llu seconds=%.6f ops=%llu mops_per_s=%.3f ops_per_s=%.0f "
      "maxrss_kb=%ld checksum=%016llx%s%s\n",
      workload, static_cast<unsigned long long>(threads), seconds,
      static_cast<unsigned long long>(ops), rate * 1e-6, rate, maxRssKb(),
      static_cast<unsigned long long>(checksum), *extra ? " " : "", extra);
  fflush(stdout);
}

// Spin briefly, then give the CPU away: waiting loops stay cheap when threads outnumber cores.
inline void relax(unsigned* spins) {
  if (++*spins < 64) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
  } else {
    sched_yield();
  }
}

// A reusable barrier for a fixed number of threads (std::barrier would be fine too, but this
// keeps the waiting policy - spin then yield - identical across benchmarks).
class Barrier {
 public:
  explicit Barrier(unsigned count) : count_(count) {}
  void wait() {
    unsigned generation = generation_.load(std::memory_order_acquire);
    if (arrived_.fetch_add(1, std::memory_order_acq_rel) + 1 == count_) {
      arrived_.store(0, std::memory_order_relaxed);
      generation_.fetch_add(1, std::memory_order_release);
      return;
    }
    unsigned spins = 0;
    while (generation_.load(std::memory_order_acquire) == generation) relax(&spins);
  }

 private:
  const unsigned count_;
  std::atomic<unsigned> arrived_{0};
  std::atomic<unsigned> generation_{0};
};

}  // namespace bench
