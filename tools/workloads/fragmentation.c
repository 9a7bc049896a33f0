/* fragmentation: a workload that leaves the heap fragmented the way long-running programs
 * do -- a cache or a server that loads a batch of records, evicts most of them in no
 * particular order, keeps the rest for good, and then loads records of another shape.
 *
 * Each phase allocates --phase-mib MiB of objects whose sizes are drawn from that phase's
 * range (many size classes at once), frees a random --free-min..--free-max per cent of
 * them, and holds for --hold-ms while doing nothing (an idle server; a background
 * compactor has time to act). The survivors stay live until the end, so every phase adds
 * a sprinkling of long-lived objects over spans that are otherwise empty: a size-class
 * allocator cannot return those spans to the OS nor reuse them for the next phase's
 * sizes, which is what meshing is for.
 *
 * Every object is filled with a pattern derived from its address and size and checked
 * before it is freed and again after every hold; a mismatch is reported and the program
 * exits with status 3. It uses only malloc and free, so any allocator can be put under
 * it with LD_PRELOAD. At the end it prints the live bytes it holds (what an ideal
 * allocator would need), frees the survivors (unless --keep: then they are still allocated
 * when the process exits, so that an allocator's statistics at exit show the fragmented heap)
 * and exits 0.
 *
 *   fragmentation [--phases N] [--phase-mib MIB] [--free-min PCT] [--free-max PCT]
 *                 [--hold-ms MS] [--final-hold-ms MS] [--seed S] [--keep] [--quiet]
 */
#define _POSIX_C_SOURCE 200809L /* nanosleep */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

enum {
  kExitUsage = 2,
  kExitCorrupt = 3,
  kExitNoMemory = 4,
  kMillisPerSecond = 1000,
  kNanosPerMilli = 1000000,
  kPercent = 100,
};

static const size_t kBytesPerMib = (size_t)1 << 20;

/* Object sizes of each phase, in bytes (inclusive). Consecutive phases use different
 * shapes -- mixed small records, larger ones, tiny ones, page-sized buffers -- so that
 * what one phase freed is of no use to the next in a size-segregated heap. Phases past
 * the end of the table wrap around. */
static const struct {
  size_t min;
  size_t max;
} kPhaseSizes[] = {
    {48, 512},    /* small records of many size classes */
    {640, 2048},  /* larger records */
    {16, 128},    /* tiny nodes */
    {96, 384},    /* small records again, other classes in the mix */
    {1024, 4096}, /* buffers */
};
#define PHASE_SHAPES (sizeof(kPhaseSizes) / sizeof(kPhaseSizes[0]))

struct options {
  unsigned phases;
  size_t phase_mib;
  unsigned free_min;
  unsigned free_max;
  unsigned hold_ms;
  unsigned final_hold_ms;
  uint64_t seed;
  int keep;
  int quiet;
};

struct object {
  unsigned char* data;
  size_t size;
};

/* The live (surviving) objects of every phase so far. */
struct pool {
  struct object* items;
  size_t count;
  size_t capacity;
  size_t bytes;
};

/* xorshift64*: small, fast, and the same sequence on every machine for a given seed. */
static uint64_t rng_state;

static uint64_t next_random(void) {
  rng_state ^= rng_state >> 12;
  rng_state ^= rng_state << 25;
  rng_state ^= rng_state >> 27;
  return rng_state * UINT64_C(0x2545F4914F6CDD1D);
}

static size_t random_between(size_t low, size_t high) {
  return low + (size_t)(next_random() % (uint64_t)(high - low + 1));
}

/* The pattern of byte i of an object: derived from the object's address and size, so a
 * byte written to the wrong object, a stale copy or a lost write all show up. */
static uint64_t pattern_seed(const unsigned char* data, size_t size) {
  return ((uint64_t)(uintptr_t)data * UINT64_C(0x9E3779B97F4A7C15)) ^ ((uint64_t)size << 1) ^ 1;
}

static void fill(const struct object* object) {
  uint64_t word = pattern_seed(object->data, object->size);
  size_t words = object->size / sizeof(word);
  for (size_t i = 0; i < words; i++) {
    uint64_t value = word + i;
    memcpy(object->data + i * sizeof(value), &value, sizeof(value));
  }
  for (size_t i = words * sizeof(word); i < object->size; i++)
    object->data[i] = (unsigned char)(word >> (i % 8 * 8));
}

static void check(const struct object* object, const char* when) {
  uint64_t word = pattern_seed(object->data, object->size);
  size_t words = object->size / sizeof(word);
  size_t bad = object->size;
  for (size_t i = 0; i < words && bad == object->size; i++) {
    uint64_t value;
    memcpy(&value, object->data + i * sizeof(value), sizeof(value));
    if (value != word + i) bad = i * sizeof(value);
  }
  for (size_t i = words * sizeof(word); i < object->size && bad == object->size; i++) {
    if (object->data[i] != (unsigned char)(word >> (i % 8 * 8))) bad = i;
  }
  if (bad != object->size) {
    fprintf(stderr, "fragmentation: CORRUPTION %s: object %p of %zu bytes differs at offset %zu\n",
            when, (void*)object->data, object->size, bad);
    exit(kExitCorrupt);
  }
}

static void out_of_memory(size_t bytes) {
  fprintf(stderr, "fragmentation: malloc(%zu) failed\n", bytes);
  exit(kExitNoMemory);
}

static void pool_add(struct pool* pool, struct object object) {
  if (pool->count == pool->capacity) {
    size_t capacity = pool->capacity ? pool->capacity * 2 : 1024;
    struct object* items = realloc(pool->items, capacity * sizeof(*items));
    if (!items) out_of_memory(capacity * sizeof(*items));
    pool->items = items;
    pool->capacity = capacity;
  }
  pool->items[pool->count++] = object;
  pool->bytes += object.size;
}

static void hold(unsigned millis) {
  struct timespec pause = {millis / kMillisPerSecond,
                           (long)(millis % kMillisPerSecond) * kNanosPerMilli};
  while (nanosleep(&pause, &pause) != 0 && errno == EINTR) {
  }
}

static void check_pool(const struct pool* pool, const char* when) {
  for (size_t i = 0; i < pool->count; i++) check(&pool->items[i], when);
}

static double mib(size_t bytes) {
  return (double)bytes / (double)kBytesPerMib;
}

/* One phase: allocate, evict most, keep the rest in `live`, hold. */
static void run_phase(unsigned phase, const struct options* options, struct pool* live) {
  size_t min = kPhaseSizes[phase % PHASE_SHAPES].min;
  size_t max = kPhaseSizes[phase % PHASE_SHAPES].max;
  size_t target = options->phase_mib * kBytesPerMib;
  struct pool batch = {0};
  while (batch.bytes < target) {
    struct object object;
    object.size = random_between(min, max);
    object.data = malloc(object.size);
    if (!object.data) out_of_memory(object.size);
    fill(&object);
    pool_add(&batch, object);
  }
  unsigned free_percent = (unsigned)random_between(options->free_min, options->free_max);
  size_t freed = 0;
  size_t freed_bytes = 0;
  for (size_t i = 0; i < batch.count; i++) {
    struct object* object = &batch.items[i];
    if (next_random() % kPercent < free_percent) {
      check(object, "before free");
      freed_bytes += object->size;
      free(object->data);
      freed++;
    } else {
      pool_add(live, *object);
    }
  }
  free(batch.items);
  if (!options->quiet) {
    printf(
        "phase %u: %zu objects of %zu-%zu B (%.1f MiB), freed %u%% (%zu objects, %.1f MiB); live "
        "%.1f MiB\n",
        phase + 1, batch.count, min, max, mib(batch.bytes), free_percent, freed, mib(freed_bytes),
        mib(live->bytes));
    fflush(stdout);
  }
  hold(options->hold_ms);
  check_pool(live, "after a hold");
}

static int parse_unsigned(const char* text, unsigned long long max, unsigned long long* out) {
  char* end = NULL;
  errno = 0;
  if (!text || *text == '\0' || *text == '-') return 0;
  unsigned long long value = strtoull(text, &end, 10);
  if (errno || *end != '\0' || value > max) return 0;
  *out = value;
  return 1;
}

static void usage(const char* message) {
  fprintf(stderr,
          "fragmentation: %s\n"
          "usage: fragmentation [--phases N] [--phase-mib MIB] [--free-min PCT] [--free-max PCT]\n"
          "                     [--hold-ms MS] [--final-hold-ms MS] [--seed S] [--keep]\n"
          "                     [--quiet]\n",
          message);
  exit(kExitUsage);
}

static struct options parse_options(int argc, char** argv) {
  struct options options = {.phases = 4,
                            .phase_mib = 48,
                            .free_min = 75,
                            .free_max = 90,
                            .hold_ms = 300,
                            .final_hold_ms = 400,
                            .seed = 42,
                            .keep = 0,
                            .quiet = 0};
  for (int i = 1; i < argc; i++) {
    const char* name = argv[i];
    if (strcmp(name, "--quiet") == 0) {
      options.quiet = 1;
      continue;
    }
    if (strcmp(name, "--keep") == 0) {
      options.keep = 1;
      continue;
    }
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
      printf(
          "usage: fragmentation [--phases N] [--phase-mib MIB] [--free-min PCT] [--free-max PCT]\n"
          "                     [--hold-ms MS] [--final-hold-ms MS] [--seed S] [--keep]\n"
          "                     [--quiet]\n"
          "defaults: --phases 4 --phase-mib 48 --free-min 75 --free-max 90 --hold-ms 300 "
          "--final-hold-ms 400 --seed 42\n");
      exit(0);
    }
    if (i + 1 >= argc) usage("missing value after an option");
    const char* value = argv[++i];
    unsigned long long number = 0;
    if (strcmp(name, "--phases") == 0 && parse_unsigned(value, 1000, &number) && number > 0) {
      options.phases = (unsigned)number;
    } else if (strcmp(name, "--phase-mib") == 0 && parse_unsigned(value, 1 << 16, &number) &&
               number > 0) {
      options.phase_mib = (size_t)number;
    } else if (strcmp(name, "--free-min") == 0 && parse_unsigned(value, kPercent, &number)) {
      options.free_min = (unsigned)number;
    } else if (strcmp(name, "--free-max") == 0 && parse_unsigned(value, kPercent, &number)) {
      options.free_max = (unsigned)number;
    } else if (strcmp(name, "--hold-ms") == 0 &&
               parse_unsigned(value, 3600 * kMillisPerSecond, &number)) {
      options.hold_ms = (unsigned)number;
    } else if (strcmp(name, "--final-hold-ms") == 0 &&
               parse_unsigned(value, 3600 * kMillisPerSecond, &number)) {
      options.final_hold_ms = (unsigned)number;
    } else if (strcmp(name, "--seed") == 0 && parse_unsigned(value, UINT64_MAX, &number)) {
      options.seed = number;
    } else {
      char message[128];
      snprintf(message, sizeof(message), "bad option or value: %s %s", name, value);
      usage(message);
    }
  }
  if (options.free_min > options.free_max) usage("--free-min is larger than --free-max");
  return options;
}

int main(int argc, char** argv) {
  struct options options = parse_options(argc, argv);
  rng_state = options.seed ? options.seed : 1; /* xorshift must not start at 0 */
  struct pool live = {0};
  for (unsigned phase = 0; phase < options.phases; phase++) run_phase(phase, &options, &live);
  hold(options.final_hold_ms);
  check_pool(&live, "at the end");
  printf("live: %zu objects, %zu bytes (%.1f MiB)\n", live.count, live.bytes, mib(live.bytes));
  fflush(stdout);
  if (options.keep) return 0;
  for (size_t i = 0; i < live.count; i++) {
    check(&live.items[i], "before the final free");
    free(live.items[i].data);
  }
  free(live.items);
  return 0;
}
