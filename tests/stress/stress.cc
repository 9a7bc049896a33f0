// Multi-threaded data-integrity stress test for any malloc implementation.
//
// Every object is filled with a pattern derived from its address and size, and checked before
// it is freed, whenever another thread picks it up, and after every realloc (the surviving
// prefix must still hold the pattern of the old address and size). Objects move between
// threads through shared slots, so most frees are remote; threads are created and joined
// repeatedly (rounds), and objects outlive the threads that allocated them. Sizes cover every
// small class from 1 B to 16 KiB (log-uniform) plus occasional large objects (64 KiB-4 MiB).
//
// Uses only malloc/calloc/realloc/free and operator new/delete, so it runs under
// LD_PRELOAD=libmeshalloc.so or linked with any allocator. If the process exports
// meshalloc_compact (found with dlsym), a background thread also calls it now and then so
// that meshing runs concurrently with the writers.
//
// Any mismatch prints the object, the offset, expected and found bytes, and aborts.
#include <dlfcn.h>
#include <pthread.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <new>
#include <random>
#include <string>
#include <thread>
#include <vector>

namespace {

struct Options {
  unsigned threads = 4;
  unsigned rounds = 8;
  uint64_t opsPerThread = 100000;
  size_t slots = 4096;
  size_t localObjects = 512;
  unsigned largePerMillion = 1500;  // share of allocations that are 64 KiB-4 MiB
  uint64_t seed = 1;
  bool compact = true;
  bool verbose = false;
};

enum class Kind : uint8_t { kMalloc, kCalloc, kNewArray, kOperatorNew };

struct Object {
  unsigned char* p = nullptr;
  size_t size = 0;
  Kind kind = Kind::kMalloc;
};

struct Slot {
  std::mutex lock;
  Object obj;
};

struct Counters {
  std::atomic<uint64_t> allocations{0}, frees{0}, remoteHandoffs{0}, reallocs{0}, checks{0},
      bytesChecked{0}, large{0}, compactions{0};
};

Options gOptions;
Counters gCounters;
std::mutex gReportLock;

// --- the pattern -------------------------------------------------------------------------------

// The pattern's address is kept as an integer: after realloc it names memory that is gone.
inline uint64_t patternSeed(uintptr_t address, size_t size) {
  uint64_t x = address ^ (size * 0x9E3779B97F4A7C15ull);
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x | 1;  // never all-zero, so a zeroed object never matches
}

inline uint64_t patternWord(uint64_t seed, size_t index) {
  uint64_t x = seed + index * 0xD6E8FEB86659FD93ull;
  return x ^ (x >> 29);
}

inline uint8_t patternByte(uint64_t seed, size_t offset) {
  return static_cast<uint8_t>(patternWord(seed, offset / 8) >> (8 * (offset % 8)));
}

void fill(unsigned char* p, size_t size) {
  const uint64_t seed = patternSeed(reinterpret_cast<uintptr_t>(p), size);
  const size_t words = size / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t x = patternWord(seed, w);
    memcpy(p + 8 * w, &x, 8);
  }
  for (size_t i = 8 * words; i < size; ++i) p[i] = patternByte(seed, i);
}

[[noreturn]] void reportMismatch(const char* when, const unsigned char* p, size_t size,
                                 uintptr_t patternAddress, size_t patternSize, size_t offset,
                                 size_t limit) {
  std::lock_guard<std::mutex> guard(gReportLock);
  const uint64_t seed = patternSeed(patternAddress, patternSize);
  size_t bad = 0;
  size_t last = offset;
  for (size_t i = offset; i < limit; ++i) {
    if (p[i] != patternByte(seed, i)) {
      ++bad;
      last = i;
    }
  }
  fprintf(stderr,
          "\nstress: DATA CORRUPTION %s\n"
          "  object %p, %zu bytes (pattern of 0x%lx/%zu bytes), thread %lu\n"
          "  first bad byte at offset %zu, last at %zu, %zu of %zu checked bytes differ\n"
          "  offset     expected  found\n",
          when, static_cast<const void*>(p), size, static_cast<unsigned long>(patternAddress),
          patternSize, static_cast<unsigned long>(pthread_self()), offset, last, bad, limit);
  size_t from = offset >= 16 ? offset - 16 : 0;
  for (size_t i = from; i < limit && i < offset + 32; ++i) {
    fprintf(stderr, "  %-10zu 0x%02x      0x%02x%s\n", i, patternByte(seed, i), p[i],
            p[i] != patternByte(seed, i) ? "  <--" : "");
  }
  fflush(stderr);
  abort();
}

// Checks the first `limit` bytes of `p` against the pattern of (patternAddress, patternSize).
void check(const char* when, const unsigned char* p, size_t size, uintptr_t patternAddress,
           size_t patternSize, size_t limit) {
  const uint64_t seed = patternSeed(patternAddress, patternSize);
  const size_t words = limit / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t x = patternWord(seed, w);
    if (memcmp(p + 8 * w, &x, 8) != 0) {
      size_t i = 8 * w;
      while (p[i] == patternByte(seed, i)) ++i;
      reportMismatch(when, p, size, patternAddress, patternSize, i, limit);
    }
  }
  for (size_t i = 8 * words; i < limit; ++i) {
    if (p[i] != patternByte(seed, i)) {
      reportMismatch(when, p, size, patternAddress, patternSize, i, limit);
    }
  }
  gCounters.checks.fetch_add(1, std::memory_order_relaxed);
  gCounters.bytesChecked.fetch_add(limit, std::memory_order_relaxed);
}

void checkObject(const char* when, const Object& o) {
  check(when, o.p, o.size, reinterpret_cast<uintptr_t>(o.p), o.size, o.size);
}

[[noreturn]] void fatal(const char* what, size_t size) {
  std::lock_guard<std::mutex> guard(gReportLock);
  fprintf(stderr, "\nstress: %s failed for %zu bytes (errno %d: %s)\n", what, size, errno,
          strerror(errno));
  abort();
}

// --- allocation ---------------------------------------------------------------------------------

class Rng {
 public:
  explicit Rng(uint64_t seed) : state_(seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull) {}
  uint64_t next() {
    // splitmix64
    uint64_t z = (state_ += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint64_t below(uint64_t n) { return next() % n; }

 private:
  uint64_t state_;
};

// Log-uniform over 1 B-16 KiB so every small size class is hit often; sometimes large.
size_t pickSize(Rng& rng) {
  if (rng.below(1000000) < gOptions.largePerMillion) {
    unsigned shift = 16 + static_cast<unsigned>(rng.below(6));  // 64 KiB .. 2 MiB, x1-2
    size_t base = size_t{1} << shift;
    return base + rng.below(base);
  }
  unsigned shift = static_cast<unsigned>(rng.below(14));  // 1 .. 8 KiB, x1-2 => up to 16 KiB
  size_t base = size_t{1} << shift;
  return base + rng.below(base);
}

Object allocate(Rng& rng) {
  Object o;
  o.size = pickSize(rng);
  uint64_t how = rng.below(10);
  if (how < 5) {
    o.kind = Kind::kMalloc;
    o.p = static_cast<unsigned char*>(malloc(o.size));
    if (!o.p) fatal("malloc", o.size);
  } else if (how < 7) {
    o.kind = Kind::kCalloc;
    size_t n = o.size, each = 1;
    if (o.size % 8 == 0 && rng.below(2)) {
      n = o.size / 8;
      each = 8;
    }
    o.p = static_cast<unsigned char*>(calloc(n, each));
    if (!o.p) fatal("calloc", o.size);
    for (size_t i = 0; i < o.size; ++i) {
      if (o.p[i] != 0) {
        std::lock_guard<std::mutex> guard(gReportLock);
        fprintf(stderr, "\nstress: calloc(%zu, %zu) = %p: byte %zu is 0x%02x, not zero\n", n, each,
                static_cast<void*>(o.p), i, o.p[i]);
        abort();
      }
    }
  } else if (how < 9) {
    o.kind = Kind::kNewArray;
    o.p = new unsigned char[o.size];
  } else {
    o.kind = Kind::kOperatorNew;
    o.p = static_cast<unsigned char*>(::operator new(o.size));
  }
  if (o.size >= (64 << 10)) gCounters.large.fetch_add(1, std::memory_order_relaxed);
  fill(o.p, o.size);
  gCounters.allocations.fetch_add(1, std::memory_order_relaxed);
  return o;
}

void release(Object& o) {
  checkObject("before free", o);
  switch (o.kind) {
    case Kind::kMalloc:
    case Kind::kCalloc:
      free(o.p);
      break;
    case Kind::kNewArray:
      delete[] o.p;
      break;
    case Kind::kOperatorNew:
      ::operator delete(o.p, o.size);  // sized delete
      break;
  }
  o = Object{};
  gCounters.frees.fetch_add(1, std::memory_order_relaxed);
}

// Resizes a malloc/calloc object; the common prefix must survive with the old pattern.
void resize(Object& o, Rng& rng) {
  checkObject("before realloc", o);
  size_t newSize = rng.below(4) == 0 ? o.size / 2 + 1 : pickSize(rng);
  const uintptr_t oldAddress = reinterpret_cast<uintptr_t>(o.p);
  const size_t oldSize = o.size;
  auto* q = static_cast<unsigned char*>(realloc(o.p, newSize));
  if (!q) fatal("realloc", newSize);
  check("after realloc (surviving prefix)", q, newSize, oldAddress, oldSize,
        oldSize < newSize ? oldSize : newSize);
  o.p = q;
  o.size = newSize;
  fill(o.p, o.size);
  gCounters.reallocs.fetch_add(1, std::memory_order_relaxed);
}

// --- the workers --------------------------------------------------------------------------------

std::vector<Slot>* gSlots;

std::atomic<uint64_t> gShortLivedThreads{0};

// `ops` operations on a private set of objects and on the shared slots. A top-level worker
// also starts short-lived helper threads (thread churn inside a round).
void worker(unsigned round, unsigned index, uint64_t ops, bool spawnHelpers) {
  Rng rng(gOptions.seed * 1000003 + round * 7919 + index);
  std::vector<Object> local(spawnHelpers ? gOptions.localObjects : gOptions.localObjects / 8 + 1);
  const uint64_t helperEvery = ops / 4 + 1;
  for (uint64_t op = 0; op < ops; ++op) {
    if (spawnHelpers && op % helperEvery == helperEvery / 2) {
      std::thread helper(worker, round, index + 1000 * static_cast<unsigned>(op / helperEvery + 1),
                         ops / 50 + 1, false);
      helper.join();
      gShortLivedThreads.fetch_add(1, std::memory_order_relaxed);
    }
    uint64_t r = rng.below(100);
    if (r < 30) {
      // Shared slot: whatever another thread left here is checked and usually freed or
      // taken over by this thread.
      Slot& slot = (*gSlots)[rng.below(gSlots->size())];
      std::lock_guard<std::mutex> guard(slot.lock);
      if (!slot.obj.p) {
        slot.obj = allocate(rng);
        continue;
      }
      checkObject("picked up from a shared slot", slot.obj);
      uint64_t action = rng.below(10);
      if (action < 5) {
        release(slot.obj);
      } else if (action < 7 && (slot.obj.kind == Kind::kMalloc || slot.obj.kind == Kind::kCalloc)) {
        resize(slot.obj, rng);
      } else {
        // Swap with a local object: hands this thread's allocation to the others.
        Object& mine = local[rng.below(local.size())];
        std::swap(mine, slot.obj);
        gCounters.remoteHandoffs.fetch_add(1, std::memory_order_relaxed);
      }
    } else {
      Object& o = local[rng.below(local.size())];
      if (!o.p) {
        o = allocate(rng);
      } else if (r < 70) {
        release(o);
      } else if (r < 85 && (o.kind == Kind::kMalloc || o.kind == Kind::kCalloc)) {
        resize(o, rng);
      } else {
        checkObject("periodic check", o);
      }
    }
  }
  // Leave about half of the local objects behind for the next round's threads.
  for (Object& o : local) {
    if (!o.p) continue;
    if (rng.below(2)) {
      Slot& slot = (*gSlots)[rng.below(gSlots->size())];
      std::lock_guard<std::mutex> guard(slot.lock);
      if (!slot.obj.p) {
        slot.obj = o;
        o = Object{};
        continue;
      }
    }
    release(o);
  }
}

using CompactFn = size_t (*)();

void usage(const char* argv0) {
  fprintf(stderr,
          "usage: %s [--threads N] [--rounds N] [--ops N] [--slots N] [--local N]\n"
          "          [--large-per-million N] [--seed N] [--no-compact] [--verbose]\n",
          argv0);
  exit(2);
}

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> uint64_t {
      if (i + 1 >= argc) usage(argv[0]);
      char* end = nullptr;
      uint64_t v = strtoull(argv[++i], &end, 10);
      if (*end != '\0') usage(argv[0]);
      return v;
    };
    if (a == "--threads") {
      o.threads = static_cast<unsigned>(value());
    } else if (a == "--rounds") {
      o.rounds = static_cast<unsigned>(value());
    } else if (a == "--ops") {
      o.opsPerThread = value();
    } else if (a == "--slots") {
      o.slots = value();
    } else if (a == "--local") {
      o.localObjects = value();
    } else if (a == "--large-per-million") {
      o.largePerMillion = static_cast<unsigned>(value());
    } else if (a == "--seed") {
      o.seed = value();
    } else if (a == "--no-compact") {
      o.compact = false;
    } else if (a == "--verbose") {
      o.verbose = true;
    } else {
      usage(argv[0]);
    }
  }
  if (o.threads == 0 || o.slots == 0 || o.localObjects == 0) usage(argv[0]);
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  gOptions = parse(argc, argv);
  std::vector<Slot> slots(gOptions.slots);
  gSlots = &slots;

  auto compactFn = reinterpret_cast<CompactFn>(dlsym(RTLD_DEFAULT, "meshalloc_compact"));
  std::atomic<bool> stopCompactor{false};
  std::thread compactor;
  if (gOptions.compact && compactFn) {
    compactor = std::thread([&] {
      while (!stopCompactor.load()) {
        compactFn();
        gCounters.compactions.fetch_add(1, std::memory_order_relaxed);
        usleep(20000);
      }
    });
  }

  for (unsigned round = 0; round < gOptions.rounds; ++round) {
    std::vector<std::thread> threads;
    for (unsigned t = 0; t < gOptions.threads; ++t) {
      threads.emplace_back(worker, round, t, gOptions.opsPerThread, true);
    }
    for (auto& t : threads) t.join();
    if (gOptions.verbose) {
      fprintf(stderr, "round %u: %" PRIu64 " allocations so far\n", round,
              gCounters.allocations.load());
    }
  }

  if (compactor.joinable()) {
    stopCompactor.store(true);
    compactor.join();
  }
  // Everything left in the slots is checked and freed by the main thread.
  for (Slot& s : slots) {
    if (s.obj.p) release(s.obj);
  }

  const uint64_t allocations = gCounters.allocations.load();
  const uint64_t frees = gCounters.frees.load();
  printf("stress: OK  threads=%u rounds=%u ops/thread=%" PRIu64 " allocations=%" PRIu64
         " frees=%" PRIu64 " reallocs=%" PRIu64 " handoffs=%" PRIu64 " large=%" PRIu64
         " checks=%" PRIu64 " checked=%" PRIu64 " MiB helpers=%" PRIu64 " compactions=%" PRIu64
         "%s\n",
         gOptions.threads, gOptions.rounds, gOptions.opsPerThread, allocations, frees,
         gCounters.reallocs.load(), gCounters.remoteHandoffs.load(), gCounters.large.load(),
         gCounters.checks.load(), gCounters.bytesChecked.load() >> 20, gShortLivedThreads.load(),
         gCounters.compactions.load(), compactFn ? "" : " (meshalloc_compact not found)");
  if (allocations != frees) {
    fprintf(stderr, "stress: %" PRIu64 " allocations but %" PRIu64 " frees\n", allocations, frees);
    return 1;
  }
  return 0;
}
