// handle_ops: the handle API's basic operations timed against their malloc counterparts, in
// one process, with the repetitions interleaved (meshalloc bench handles, docs/handles-bench.md).
//
//   malloc_free     N x malloc(size), then N x free, per allocation+free pair
//   mh_alloc_free   the same with mh_alloc / mh_free
//   pointer_read    read the first byte of one object through its pointer
//   pin_unpin       mh_pin, read the first byte, mh_unpin of one handle (uncontended)
//   pointer_random  read the first byte of a random one of M objects through its pointer
//   translate       mh_pin, read, mh_unpin of a random one of M handles: the handle table's
//                   cache misses on top of the object's
//
// Without the handle API in the process (no LD_PRELOAD of a libmeshalloc that has it), only the
// malloc and pointer rows run, so the same program shows glibc's or jemalloc's malloc.
//
// Output: one line per repetition and operation, "rep=R op=NAME ns=X", then "handles=yes|no".
// Usage: handle_ops [--reps R] [--batch N] [--size BYTES] [--max-size BYTES] [--objects M]
//                   [--ops K]
// With --max-size, the allocation rows draw each position of the batch a size between --size
// and --max-size (the same sizes every round), so that the pairs spread over size classes.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <string_view>

#include "storage.h"
#include "store.h"

namespace {

using handle_cache::HandleStorage;
using handle_cache::MallocStorage;
using handle_cache::Ref;

struct Parameters {
  long reps = 11;
  long batch = 1024;
  long size = 64;
  long maxSize = 0;  // 0: every allocation of `size` bytes
  long objects = 1 << 18;
  long ops = 1 << 22;
};

volatile uint64_t sink;  // keeps the reads from being optimised away

double nowNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) * 1e9 + static_cast<double>(now.tv_nsec);
}

uint64_t nextRandom(uint64_t& state) {
  return handle_cache::mix64(state += 0x9e3779b97f4a7c15ULL);
}

// ns per allocation+free pair: `ops` pairs in batches of `batch`, of sizes[i] bytes.
template <typename Storage>
double allocFree(const Parameters& p, Ref* refs, const size_t* sizes) {
  long rounds = p.ops / p.batch;
  double start = nowNs();
  for (long r = 0; r < rounds; r++) {
    for (long i = 0; i < p.batch; i++) refs[i] = Storage::allocate(sizes[i]);
    for (long i = 0; i < p.batch; i++) Storage::release(refs[i]);
  }
  return (nowNs() - start) / static_cast<double>(rounds * p.batch);
}

// ns per pin + read + unpin of one object.
template <typename Storage>
double pinOne(const Parameters& p, Ref ref) {
  uint64_t total = 0;
  double start = nowNs();
  for (long i = 0; i < p.ops; i++) {
    auto* object = static_cast<const volatile unsigned char*>(Storage::pin(ref));
    total += *object;
    Storage::unpin(ref);
  }
  sink = total;
  return (nowNs() - start) / static_cast<double>(p.ops);
}

// ns per pin + read + unpin of a random one of `objects`.
template <typename Storage>
double pinRandom(const Parameters& p, const Ref* refs, const uint32_t* order) {
  uint64_t total = 0;
  double start = nowNs();
  for (long i = 0; i < p.ops; i++) {
    Ref ref = refs[order[i % p.objects]];
    auto* object = static_cast<const volatile unsigned char*>(Storage::pin(ref));
    total += *object;
    Storage::unpin(ref);
  }
  sink = total;
  return (nowNs() - start) / static_cast<double>(p.ops);
}

long parseOption(const char* name, const char* text, long min, long max) {
  char* end;
  long value = strtol(text, &end, 10);
  if (*text == '\0' || *end != '\0' || value < min || value > max) {
    fprintf(stderr, "handle_ops: bad value for %s: '%s' (%ld..%ld)\n", name, text, min, max);
    exit(1);
  }
  return value;
}

Parameters parse(int argc, char** argv) {
  Parameters p;
  for (int i = 1; i < argc; i += 2) {
    std::string_view name = argv[i];
    if (i + 1 >= argc) {
      fprintf(stderr, "handle_ops: missing value after %s\n", argv[i]);
      exit(1);
    }
    if (name == "--reps") {
      p.reps = parseOption(argv[i], argv[i + 1], 1, 1000);
    } else if (name == "--batch") {
      p.batch = parseOption(argv[i], argv[i + 1], 1, 1 << 20);
    } else if (name == "--size") {
      p.size = parseOption(argv[i], argv[i + 1], 1, 1 << 20);
    } else if (name == "--max-size") {
      p.maxSize = parseOption(argv[i], argv[i + 1], 1, 1 << 20);
    } else if (name == "--objects") {
      p.objects = parseOption(argv[i], argv[i + 1], 1, 1 << 26);
    } else if (name == "--ops") {
      p.ops = parseOption(argv[i], argv[i + 1], 1, 1L << 34);
    } else {
      fprintf(stderr, "handle_ops: unknown option '%s'\n", argv[i]);
      exit(1);
    }
  }
  if (p.ops < p.batch) p.ops = p.batch;
  if (p.maxSize != 0 && p.maxSize < p.size) {
    fprintf(stderr, "handle_ops: --max-size %ld is below --size %ld\n", p.maxSize, p.size);
    exit(1);
  }
  return p;
}

}  // namespace

int main(int argc, char** argv) {
  Parameters p = parse(argc, argv);
  bool handles = HandleStorage::available();
  size_t table = static_cast<size_t>(p.objects > p.batch ? p.objects : p.batch);
  Ref* pointers = static_cast<Ref*>(calloc(table, sizeof(Ref)));
  Ref* handleRefs = static_cast<Ref*>(calloc(table, sizeof(Ref)));
  uint32_t* order =
      static_cast<uint32_t*>(calloc(static_cast<size_t>(p.objects), sizeof(uint32_t)));
  if (pointers == nullptr || handleRefs == nullptr || order == nullptr) {
    fprintf(stderr, "handle_ops: out of memory\n");
    return 1;
  }
  // A random permutation of the objects: the random-access rows touch each once per pass.
  uint64_t state = 1;
  for (long i = 0; i < p.objects; i++) order[i] = static_cast<uint32_t>(i);
  for (long i = p.objects - 1; i > 0; i--) {
    long j = static_cast<long>(nextRandom(state) % static_cast<uint64_t>(i + 1));
    uint32_t swap = order[i];
    order[i] = order[j];
    order[j] = swap;
  }
  for (long i = 0; i < p.objects; i++) {
    pointers[i] = MallocStorage::allocate(static_cast<size_t>(p.size));
    memset(reinterpret_cast<void*>(pointers[i]), static_cast<int>(i), static_cast<size_t>(p.size));
    if (handles) {
      handleRefs[i] = HandleStorage::allocate(static_cast<size_t>(p.size));
      memset(HandleStorage::pin(handleRefs[i]), static_cast<int>(i), static_cast<size_t>(p.size));
      HandleStorage::unpin(handleRefs[i]);
    }
  }

  struct Operation {
    const char* name;
    bool needsHandles;
  };
  static const Operation kOperations[] = {{"malloc_free", false},    {"mh_alloc_free", true},
                                          {"pointer_read", false},   {"pin_unpin", true},
                                          {"pointer_random", false}, {"translate", true}};
  constexpr long kCount = sizeof kOperations / sizeof kOperations[0];
  Ref* scratch = static_cast<Ref*>(calloc(static_cast<size_t>(p.batch), sizeof(Ref)));
  size_t* sizes = static_cast<size_t*>(calloc(static_cast<size_t>(p.batch), sizeof(size_t)));
  if (scratch == nullptr || sizes == nullptr) {
    fprintf(stderr, "handle_ops: out of memory\n");
    return 1;
  }
  for (long i = 0; i < p.batch; i++) {
    long span = p.maxSize ? p.maxSize - p.size + 1 : 1;
    sizes[i] = static_cast<size_t>(
        p.size + static_cast<long>(nextRandom(state) % static_cast<uint64_t>(span)));
  }
  for (long rep = 1; rep <= p.reps; rep++) {
    // Each repetition starts at another operation, so none always runs first (a cold cache)
    // or right after the same neighbour.
    for (long k = 0; k < kCount; k++) {
      const Operation& op = kOperations[(k + rep - 1) % kCount];
      if (op.needsHandles && !handles) continue;
      std::string_view name = op.name;
      double ns = 0;
      if (name == "malloc_free") ns = allocFree<MallocStorage>(p, scratch, sizes);
      if (name == "mh_alloc_free") ns = allocFree<HandleStorage>(p, scratch, sizes);
      if (name == "pointer_read") ns = pinOne<MallocStorage>(p, pointers[0]);
      if (name == "pin_unpin") ns = pinOne<HandleStorage>(p, handleRefs[0]);
      if (name == "pointer_random") ns = pinRandom<MallocStorage>(p, pointers, order);
      if (name == "translate") ns = pinRandom<HandleStorage>(p, handleRefs, order);
      printf("rep=%ld op=%s ns=%.3f\n", rep, op.name, ns);
    }
  }
  printf("handles=%s size=%ld max_size=%ld batch=%ld objects=%ld ops=%ld\n", handles ? "yes" : "no",
         p.size, p.maxSize, p.batch, p.objects, p.ops);
  return 0;
}
