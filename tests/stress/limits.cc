// The heap against the limits a user's machine imposes, with meshing on:
//
//   --address-space MIB  `ulimit -v`: RLIMIT_AS is set to the process's size plus MIB. Blocks of
//                        every kind (small classes, large, dedicated segments) are allocated
//                        until a whole round of them fails. Every failure must be NULL with
//                        ENOMEM, never an abort; every block keeps its contents through meshing;
//                        memory freed under the limit is reused under it; once everything is
//                        freed the accounting is back where it started, and with the limit
//                        lifted the heap grows again.
//   --max-map-count N    vm.max_map_count lowered to N (root only; restored afterwards, even if
//                        the workload dies). A heap of sparse spans is meshed again and again:
//                        the mesher must stay under the limit (every mesh adds mappings), lose
//                        no write, and the program's own mmap calls must keep working.
//   --phases MIB         no limit of its own: run in a memory cgroup limited well below the sum of
//                        its phases (python/tests/test_memory_cgroup.py sets the limit). Six
//                        phases each allocate MIB of blocks of one size (a different size class
//                        each), keep one in ten at random, free the rest and mesh. The program
//                        lives only if what it freed and what meshing released stop being
//                        charged to the cgroup (a page kept in the arena file, or a hole never
//                        punched, stays charged until the kernel kills the process).
//
// Linked with libmeshalloc. Exit status 0 when every check holds, 1 with a message otherwise,
// 77 (skipped) when the machine does not let the limit be set.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>

#include "heap_counters.h"
#include "meshalloc.h"

namespace {

constexpr int kSkipped = 77;
constexpr size_t kMiB = size_t{1} << 20;

[[noreturn]] void failWith(const char* what, const void* block = nullptr) {
  fprintf(stderr, "limits: %s", what);
  if (block) fprintf(stderr, " (block %p)", block);
  fprintf(stderr, "\n");
  exit(1);
}

struct Block {
  unsigned char* address;
  size_t size;
  unsigned char pattern;
};

// The block table lives outside the heap under test, so that it cannot be what fails.
struct Blocks {
  Block* items = nullptr;
  size_t count = 0;
  size_t capacity = 0;

  explicit Blocks(size_t entries) : capacity(entries) {
    void* memory = mmap(nullptr, entries * sizeof(Block), PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) failWith("cannot map the block table");
    items = static_cast<Block*>(memory);
  }
};

// Small blocks are filled whole; large ones at both ends of every 64 KiB, so that the address
// space runs out long before the machine's memory does.
constexpr size_t kFillWholeBelow = 16384;
constexpr size_t kLargeStride = 65536;

void fill(const Block& b) {
  if (b.size < kFillWholeBelow) {
    memset(b.address, b.pattern, b.size);
    return;
  }
  for (size_t at = 0; at < b.size; at += kLargeStride) b.address[at] = b.pattern;
  b.address[b.size - 1] = b.pattern;
}

void check(const Block& b, const char* when) {
  bool ok = true;
  if (b.size < kFillWholeBelow) {
    for (size_t i = 0; i < b.size && ok; i++) ok = b.address[i] == b.pattern;
  } else {
    for (size_t at = 0; at < b.size && ok; at += kLargeStride) ok = b.address[at] == b.pattern;
    ok = ok && b.address[b.size - 1] == b.pattern;
  }
  if (!ok) {
    char message[128];
    snprintf(message, sizeof message, "lost write: a block of %zu bytes changed %s", b.size, when);
    failWith(message, b.address);
  }
}

void checkAll(const Blocks& blocks, const char* when) {
  for (size_t i = 0; i < blocks.count; i++) check(blocks.items[i], when);
}

// One size of each kind: small classes (several spans per class), a large object, and one
// big enough for a dedicated segment.
constexpr size_t kSizes[] = {24, 200, 1500, 12000, 300000, 5 * kMiB, 40 * kMiB};
constexpr size_t kKinds = sizeof(kSizes) / sizeof(kSizes[0]);

// Allocates rounds of every size until a whole round fails; returns the blocks allocated.
// Every failure must be a NULL with ENOMEM.
size_t allocateUntilFull(Blocks& blocks, uint64_t* failures) {
  size_t allocated = 0;
  for (unsigned round = 0;; round++) {
    size_t failedThisRound = 0;
    for (size_t kind = 0; kind < kKinds; kind++) {
      // Small blocks many times per round: they exhaust a span long before a large block
      // exhausts the address space.
      size_t repeat = kSizes[kind] < kFillWholeBelow ? 64 : 1;
      for (size_t r = 0; r < repeat; r++) {
        if (blocks.count == blocks.capacity) failWith("the block table is full: no limit hit");
        errno = 0;
        void* p = malloc(kSizes[kind]);
        if (!p) {
          if (errno != ENOMEM) failWith("malloc returned NULL without ENOMEM");
          (*failures)++;
          failedThisRound++;
          break;
        }
        Block b = {static_cast<unsigned char*>(p), kSizes[kind],
                   static_cast<unsigned char>(blocks.count * 131 + 7)};
        fill(b);
        blocks.items[blocks.count++] = b;
        allocated++;
      }
    }
    if (failedThisRound == kKinds) return allocated;
  }
}

// Frees every other block (by position), keeping the rest compact in the table.
size_t freeEveryOther(Blocks& blocks) {
  size_t kept = 0;
  size_t freed = 0;
  for (size_t i = 0; i < blocks.count; i++) {
    if (i % 2 == 0) {
      check(blocks.items[i], "before its free");
      free(blocks.items[i].address);
      freed++;
    } else {
      blocks.items[kept++] = blocks.items[i];
    }
  }
  blocks.count = kept;
  return freed;
}

void freeAll(Blocks& blocks) {
  for (size_t i = 0; i < blocks.count; i++) {
    check(blocks.items[i], "before its free");
    free(blocks.items[i].address);
  }
  blocks.count = 0;
}

// A fixed xorshift stream: the same blocks kept in every run.
struct Random {
  uint64_t state;
  uint64_t next() {
    state ^= state << 13;
    state ^= state >> 7;
    state ^= state << 17;
    return state;
  }
};

// Allocates blocks of `size`, each filled with a pattern, until the table holds `untilCount`.
void allocateBlocks(Blocks& blocks, size_t size, size_t untilCount, Random& random,
                    const char* where) {
  while (blocks.count < untilCount) {
    void* p = malloc(size);
    if (!p) failWith(where);
    Block b = {static_cast<unsigned char*>(p), size, static_cast<unsigned char>(random.next())};
    fill(b);
    blocks.items[blocks.count++] = b;
  }
}

// Frees the blocks from `from` on at random, keeping one in `keepOneIn` (checked before each
// free); the kept ones stay compact in the table, after the first `from`.
void keepOneIn(Blocks& blocks, size_t from, unsigned keepOneIn, Random& random) {
  size_t kept = from;
  for (size_t i = from; i < blocks.count; i++) {
    if (random.next() % keepOneIn != 0) {
      check(blocks.items[i], "before its free");
      free(blocks.items[i].address);
    } else {
      blocks.items[kept++] = blocks.items[i];
    }
  }
  blocks.count = kept;
}

size_t processBytes() {
  FILE* f = fopen("/proc/self/statm", "r");
  if (!f) failWith("cannot read /proc/self/statm");
  unsigned long pages = 0;
  int read = fscanf(f, "%lu", &pages);
  fclose(f);
  if (read != 1) failWith("cannot parse /proc/self/statm");
  return pages * static_cast<size_t>(sysconf(_SC_PAGESIZE));
}

// The threads of this process (entries of /proc/self/task).
size_t taskCount() {
  size_t count = 0;
  if (DIR* tasks = opendir("/proc/self/task")) {
    while (const dirent* entry = readdir(tasks)) count += entry->d_name[0] != '.';
    closedir(tasks);
  }
  return count;
}

// meshalloc starts its background threads after a number of refills, and glibc allocates each
// new thread's TLS vector with malloc (320 bytes here), live for as long as the thread. Refills
// until they run (or a bound: the threads may be off), so that the accounting baseline includes
// them whenever the test's own refills would have started them.
void startAllocatorThreads() {
  constexpr size_t kBlocks = 4096;
  constexpr size_t kSize = 16384;  // few objects per span: a refill every few allocations
  static void* blocks[kBlocks];
  size_t before = taskCount();
  for (int round = 0; round < 16 && taskCount() == before; round++) {
    for (void*& block : blocks) block = malloc(kSize);
    for (void* block : blocks) free(block);
  }
}

int addressSpace(size_t headroomMiB) {
  Blocks blocks(1 << 20);
  startAllocatorThreads();
  uint64_t allocatedBefore = stress::readCounter("stats.allocated");
  uint64_t largeBefore = stress::readCounter("stats.large.allocated");
  struct rlimit previous;
  getrlimit(RLIMIT_AS, &previous);
  struct rlimit limited = previous;
  limited.rlim_cur = processBytes() + headroomMiB * kMiB;
  if (previous.rlim_cur != RLIM_INFINITY && previous.rlim_cur < limited.rlim_cur) {
    printf("limits: RLIMIT_AS is already below the test's limit; skipped\n");
    return kSkipped;
  }
  if (setrlimit(RLIMIT_AS, &limited) != 0) failWith("setrlimit(RLIMIT_AS)");

  uint64_t failures = 0;
  size_t first = allocateUntilFull(blocks, &failures);
  checkAll(blocks, "after the heap filled the address space");
  meshalloc_compact();
  checkAll(blocks, "after meshing at the limit");

  // Freed memory is reused under the same limit.
  size_t freed = freeEveryOther(blocks);
  meshalloc_compact();
  checkAll(blocks, "after the frees and a mesh");
  size_t second = allocateUntilFull(blocks, &failures);
  if (second < freed / 4) {
    char message[160];
    snprintf(message, sizeof message,
             "freed memory is not reused under the limit: %zu blocks freed, %zu allocated again",
             freed, second);
    failWith(message);
  }
  checkAll(blocks, "after the second fill");
  freeAll(blocks);
  meshalloc_compact();
  uint64_t allocatedAfter = stress::readCounter("stats.allocated");
  uint64_t largeAfter = stress::readCounter("stats.large.allocated");
  if (allocatedAfter != allocatedBefore || largeAfter != largeBefore) {
    fprintf(stderr, "limits: stats.allocated %llu -> %llu, stats.large.allocated %llu -> %llu\n",
            static_cast<unsigned long long>(allocatedBefore),
            static_cast<unsigned long long>(allocatedAfter),
            static_cast<unsigned long long>(largeBefore),
            static_cast<unsigned long long>(largeAfter));
    failWith("accounting leak after everything under the limit was freed");
  }

  // The limit lifted: the heap grows past where it stopped.
  if (setrlimit(RLIMIT_AS, &previous) != 0) failWith("setrlimit(RLIMIT_AS) back");
  size_t beyond = (headroomMiB + 64) * kMiB;
  void* big = malloc(beyond);
  if (!big) failWith("the heap does not grow again once the limit is lifted");
  Block b = {static_cast<unsigned char*>(big), beyond, 0x5a};
  fill(b);
  check(b, "after the limit was lifted");
  free(big);
  printf(
      "limits: address space +%zu MiB: %zu blocks, then %zu freed and %zu allocated again; "
      "%llu NULLs, all with ENOMEM\n",
      headroomMiB, first, freed, second, static_cast<unsigned long long>(failures));
  return 0;
}

// --- vm.max_map_count ---

constexpr char kMaxMapCountPath[] = "/proc/sys/vm/max_map_count";

long readMaxMapCount() {
  FILE* f = fopen(kMaxMapCountPath, "r");
  if (!f) return -1;
  long value = -1;
  if (fscanf(f, "%ld", &value) != 1) value = -1;
  fclose(f);
  return value;
}

bool writeMaxMapCount(long value) {
  int fd = open(kMaxMapCountPath, O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char text[32];
  int length = snprintf(text, sizeof text, "%ld\n", value);
  bool ok = write(fd, text, static_cast<size_t>(length)) == length;
  close(fd);
  return ok;
}

long processMappings() {
  FILE* f = fopen("/proc/self/maps", "r");
  if (!f) failWith("cannot read /proc/self/maps");
  long lines = 0;
  int c;
  while ((c = fgetc(f)) != EOF) lines += c == '\n';
  fclose(f);
  return lines;
}

// In the child, under the lowered limit: rounds of sparse spans meshed, with every survivor
// checked after each pass.
int sparseHeapUnderMapLimit(long limit) {
  constexpr size_t kObjects = 200000;
  constexpr size_t kSize = 256;
  Blocks blocks(kObjects);
  Random random{88172645463325252ull};
  long peakMappings = 0;
  for (unsigned round = 0; round < 6; round++) {
    allocateBlocks(blocks, kSize, kObjects, random, "malloc failed under the mapping limit");
    // Three quarters freed at random: sparse spans whose meshing needs many mappings.
    keepOneIn(blocks, 0, 4, random);
    meshalloc_compact();
    checkAll(blocks, "after meshing under the mapping limit");
    long mappings = processMappings();
    if (mappings > peakMappings) peakMappings = mappings;
    // The program's own mappings still work.
    void* own = mmap(nullptr, 1 << 16, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (own == MAP_FAILED) failWith("the program's own mmap fails: the mesher used up the limit");
    munmap(own, 1 << 16);
  }
  uint64_t meshes = stress::readCounter("mesh.count");
  if (meshes == 0) failWith("nothing was meshed: the test did not exercise the mesher");
  freeAll(blocks);
  printf("limits: vm.max_map_count %ld: %llu meshes, at most %ld mappings\n", limit,
         static_cast<unsigned long long>(meshes), peakMappings);
  return 0;
}

int maxMapCount(long limit) {
  long previous = readMaxMapCount();
  if (previous < 0 || !writeMaxMapCount(previous)) {
    printf("limits: %s cannot be written here (not root?); skipped\n", kMaxMapCountPath);
    return kSkipped;
  }
  if (limit <= processMappings() + 64) failWith("--max-map-count is below what the process uses");
  // Lowered before the fork so that the child's every mesh pass sees it; the parent does
  // nothing but wait before restoring it, whatever the child does.
  if (!writeMaxMapCount(limit)) failWith("could not lower vm.max_map_count");
  fflush(nullptr);
  pid_t child = fork();
  if (child == 0) {
    int status = sparseHeapUnderMapLimit(limit);
    fflush(nullptr);
    _exit(status);
  }
  if (child < 0) {
    writeMaxMapCount(previous);
    failWith("fork");
  }
  int status = 0;
  while (waitpid(child, &status, 0) < 0 && errno == EINTR) {
  }
  if (!writeMaxMapCount(previous))
    fprintf(stderr, "limits: could not restore vm.max_map_count to %ld\n", previous);
  if (WIFSIGNALED(status)) {
    fprintf(stderr, "limits: the workload died of signal %d\n", WTERMSIG(status));
    return 1;
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}

// --- a memory cgroup limit ---

int phases(size_t mib) {
  constexpr size_t kPhaseSizes[] = {48, 160, 400, 1000, 2500, 6000};
  constexpr unsigned kKeepOneIn = 10;
  Blocks blocks(mib * kMiB / kPhaseSizes[0] + (mib * kMiB / kPhaseSizes[0]) / kKeepOneIn * 6);
  Random random{0x9e3779b97f4a7c15ull};
  for (size_t size : kPhaseSizes) {
    size_t kept = blocks.count;  // blocks of earlier phases, at the front of the table
    allocateBlocks(blocks, size, kept + mib * kMiB / size, random,
                   "malloc failed under the cgroup limit");
    keepOneIn(blocks, kept, kKeepOneIn, random);
    meshalloc_compact();
    checkAll(blocks, "after a phase's frees and a mesh");
  }
  uint64_t meshes = stress::readCounter("mesh.count");
  size_t kept = blocks.count;
  size_t live = 0;
  for (size_t i = 0; i < blocks.count; i++) live += blocks.items[i].size;
  freeAll(blocks);
  printf("limits: %zu phases of %zu MiB each: %zu blocks (%zu KiB) kept, %llu meshes\n",
         sizeof(kPhaseSizes) / sizeof(kPhaseSizes[0]), mib, kept, live >> 10,
         static_cast<unsigned long long>(meshes));
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && !strcmp(argv[1], "--address-space")) {
    return addressSpace(strtoul(argv[2], nullptr, 10));
  }
  if (argc == 3 && !strcmp(argv[1], "--max-map-count")) {
    return maxMapCount(strtol(argv[2], nullptr, 10));
  }
  if (argc == 3 && !strcmp(argv[1], "--phases")) return phases(strtoul(argv[2], nullptr, 10));
  fprintf(stderr, "usage: %s --address-space MIB | --max-map-count N | --phases MIB\n", argv[0]);
  return 2;
}
