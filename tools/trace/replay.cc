// meshalloc-replay: replays a prepared trace (replay_ops.h) against whatever allocator is
// preloaded, timing every call (docs/trace.md, Replay).
//
//   meshalloc-replay OPS [--timing fast|recorded] [--speed X] [--warp R:P,...]
//                        [--touch none|page|block] [--stats FILE|-]
//   meshalloc-replay --size-classes     (the preloaded allocator's small size classes, through
//                                        jemalloc's mallctl names, which meshalloc also answers)
//
// One replay thread per recorded thread, started in the order the trace saw them start. A call
// that needs a block another thread allocates (a free, a realloc) waits until that allocation has
// been replayed, and an allocation waits until its slot's previous block has been freed; both
// wait only for calls that came earlier in the trace, so the replay cannot deadlock. The
// replayer's own memory (the slot table, the per-thread op buffers and histograms) is mmap'd,
// and the ops are read with pread into those buffers: a mapped ops file would count in the PSS.
//
// Exit status: 0; 1 for an unreadable or malformed ops file; 2 for a bad invocation; 3 when a
// block lost its contents or came back misaligned (the address is printed on stderr).
#include <dlfcn.h>
#include <fcntl.h>
#include <malloc.h>
#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>

#if defined(__x86_64__)
#include <x86intrin.h>
#endif

#include "format.h"
#include "replay_ops.h"

extern "C" void* reallocarray(void*, size_t, size_t) noexcept;

namespace {

using namespace meshtrace;

constexpr int kExitInput = 1;
constexpr int kExitUsage = 2;
constexpr int kExitContents = 3;

constexpr size_t kBufferOps = 1024;  // ops read per pread
constexpr size_t kBuckets = 256;     // log2 buckets split in four (HDR-like, +19 % per step)
constexpr size_t kKindCount = static_cast<size_t>(Kind::kLast) + 1;
constexpr uintptr_t kFailedBlock = 1;           // in a slot: the replayed allocation returned NULL
constexpr uint64_t kSleepThresholdNs = 50'000;  // shorter gaps are not worth a sleep
constexpr size_t kThreadStack = 1 << 20;
constexpr size_t kMaxWarpPoints = 32;

enum class Touch { kNone, kPage, kBlock };

// --warp: the recorded clock mapped piecewise linearly onto the replay's, through points
// (recorded ns, replay ns) that follow an implicit (0, 0); past the last point the gaps are kept
// as recorded. So a phase the recorder (or a loaded machine) slowed can be replayed at the pace
// the live runs had (docs/trace.md, Timing modes).
struct Warp {
  size_t points = 0;
  double recorded[kMaxWarpPoints];
  double replayed[kMaxWarpPoints];

  double map(double ns) const {
    double fromRecorded = 0, fromReplayed = 0;
    for (size_t i = 0; i < points; ++i) {
      if (ns <= recorded[i])
        return fromReplayed +
               (ns - fromRecorded) * (replayed[i] - fromReplayed) / (recorded[i] - fromRecorded);
      fromRecorded = recorded[i];
      fromReplayed = replayed[i];
    }
    return fromReplayed + (ns - fromRecorded);
  }
};

struct Options {
  bool timed = false;
  double speed = 1.0;
  Warp warp;
  Touch touch = Touch::kPage;
  const char* stats = nullptr;
  const char* ops = nullptr;
};

// The cheapest clock there is: the time-stamp counter, converted to nanoseconds once, at the end,
// with the rate measured over the whole replay.
inline uint64_t ticks() {
#if defined(__x86_64__)
  return __rdtsc();
#else
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(now.tv_nsec);
#endif
}

uint64_t monotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1'000'000'000u + static_cast<uint64_t>(now.tv_nsec);
}

size_t bucketOf(uint64_t value) {
  if (value < 4) return value;
  unsigned top = 63 - static_cast<unsigned>(__builtin_clzll(value));
  return (top - 1) * 4 + ((value >> (top - 2)) & 3);
}

uint64_t bucketLow(size_t bucket) {
  if (bucket < 4) return bucket;
  return (4 + bucket % 4) << (bucket / 4 - 1);
}

struct Histogram {
  uint64_t counts[kBuckets];
  uint64_t calls;
  uint64_t sum;
  uint64_t max;
  void add(uint64_t value) {
    ++counts[bucketOf(value)];
    ++calls;
    sum += value;
    if (value > max) max = value;
  }
};

void* mapZeroed(size_t bytes) {
  if (bytes == 0) bytes = 1;
  void* memory = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (memory == MAP_FAILED) {
    fprintf(stderr, "meshalloc-replay: cannot map %zu bytes: %s\n", bytes, strerror(errno));
    _exit(kExitInput);
  }
  return memory;
}

struct Replay {
  Options options;
  int fd = -1;
  OpsHeader header{};
  OpsThread* threads = nullptr;
  std::atomic<uint64_t>* slots = nullptr;  // one per slot: version and block (publish())
  size_t pageSize = 4096;
  uint64_t startNs = 0;
};

Replay replay;

struct ThreadState {
  const OpsThread* info;
  Op* buffer;
  Histogram* histograms;  // one per Kind
  uint64_t waits;
  uint64_t failed;  // allocations that failed in the replay but not in the trace
  uint64_t done;
};

[[noreturn]] void fail(const void* block, const ThreadState& state, const char* what,
                       const char* detail) {
  fprintf(stderr, "meshalloc-replay: block %p %s%s (op %" PRIu64 " of recorded thread %u)\n", block,
          what, detail, state.done, state.info->thread);
  _exit(kExitContents);
}

// Calls `visit(offset)` for the bytes the touch mode writes and checks: all, or the first byte,
// one byte per page and the last byte.
template <typename Visit>
inline bool touchOffsets(uint64_t bytes, Visit visit) {
  if (bytes == 0) return true;
  for (uint64_t offset = 0; offset < bytes; offset += replay.pageSize)
    if (!visit(offset)) return false;
  return visit(bytes - 1);
}

void fill(void* block, uint64_t bytes, uint8_t pattern) {
  auto* bytesOf = static_cast<uint8_t*>(block);
  if (replay.options.touch == Touch::kBlock) {
    memset(block, pattern, bytes);
  } else if (replay.options.touch == Touch::kPage) {
    touchOffsets(bytes, [&](uint64_t offset) {
      bytesOf[offset] = pattern;
      return true;
    });
  }
}

// The first offset below `bytes` that does not hold `pattern`, or UINT64_MAX.
// The first offset that fill(block, bytes, pattern) wrote and that no longer holds the pattern,
// among the offsets below `limit` (what a shrinking realloc keeps), or UINT64_MAX.
uint64_t firstMismatch(const void* block, uint64_t bytes, uint8_t pattern, uint64_t limit) {
  const auto* bytesOf = static_cast<const uint8_t*>(block);
  uint64_t bad = UINT64_MAX;
  if (replay.options.touch == Touch::kBlock) {
    for (uint64_t offset = 0; offset < bytes && offset < limit; ++offset)
      if (bytesOf[offset] != pattern) return offset;
  } else if (replay.options.touch == Touch::kPage) {
    touchOffsets(bytes, [&](uint64_t offset) {
      if (offset >= limit || bytesOf[offset] == pattern) return true;
      bad = offset;
      return false;
    });
  }
  return bad;
}

// Checks the bytes fill(block, bytes, pattern) wrote, below `limit`.
void check(const void* block, uint64_t bytes, uint8_t pattern, const ThreadState& state,
           const char* what, uint64_t limit = UINT64_MAX) {
  uint64_t bad = firstMismatch(block, bytes, pattern, limit);
  if (bad == UINT64_MAX) return;
  char detail[96];
  snprintf(detail, sizeof(detail), ": byte %" PRIu64 " of %" PRIu64 " holds 0x%02x, not 0x%02x",
           bad, bytes, static_cast<const uint8_t*>(block)[bad], pattern);
  fail(block, state, what, detail);
}

inline void pause() {
#if defined(__x86_64__)
  _mm_pause();
#endif
}

// A slot is one word: the version (replay_ops.h) in the top 16 bits, the block below. 16 bits are
// enough: a slot cannot pass the version an op waits for until that op has run, so a waiter never
// sees the counter wrap around to its value.
constexpr unsigned kVersionShift = 48;
constexpr uint64_t kBlockMask = (uint64_t{1} << kVersionShift) - 1;

uint64_t versionBits(uint32_t version) {
  return static_cast<uint64_t>(version & 0xffff) << kVersionShift;
}

// Waits until the op's turn on its slot has come (the op before it on the slot, from whichever
// thread, is done) and returns the block the slot holds.
uintptr_t waitTurn(const Op& op, ThreadState& state) {
  std::atomic<uint64_t>& slot = replay.slots[op.slot];
  uint64_t want = versionBits(op.version);
  uint64_t value = slot.load(std::memory_order_acquire);
  if ((value & ~kBlockMask) != want) {
    ++state.waits;
    for (unsigned spin = 0; ((value = slot.load(std::memory_order_acquire)) & ~kBlockMask) != want;
         ++spin) {
      if (spin < 64)
        pause();
      else
        sched_yield();
    }
  }
  return value & kBlockMask;
}

// Ends the op's turn: the slot now holds `block` (0: none), for the next op on it.
void publish(const Op& op, uintptr_t block, const ThreadState& state) {
  if ((block & ~kBlockMask) != 0)
    fail(reinterpret_cast<void*>(block), state, "lies above the 48-bit address space", "");
  replay.slots[op.slot].store(versionBits(op.version + 1) | block, std::memory_order_release);
}

uint64_t requested(const Op& op) {
  if (op.kind == static_cast<uint8_t>(Kind::kCalloc) ||
      op.kind == static_cast<uint8_t>(Kind::kReallocArray)) {
    uint64_t total;
    return __builtin_mul_overflow(op.arg, op.size, &total) ? UINT64_MAX : total;
  }
  return op.size;
}

// The C++ forms are replayed through the C++ operators (an allocator may give them a path of
// their own, sized delete in particular), with the recorded variant: nothrow, aligned, sized.
void* callNew(const Op& op) {
  bool array = op.kind == static_cast<uint8_t>(Kind::kNewArray);
  bool aligned = (op.flags & kFlagAligned) != 0;
  std::align_val_t align{static_cast<size_t>(op.arg)};
  if ((op.flags & kFlagNothrow) != 0) {
    if (aligned)
      return array ? ::operator new[](op.size, align, std::nothrow)
                   : ::operator new(op.size, align, std::nothrow);
    return array ? ::operator new[](op.size, std::nothrow) : ::operator new(op.size, std::nothrow);
  }
  try {
    if (aligned) return array ? ::operator new[](op.size, align) : ::operator new(op.size, align);
    return array ? ::operator new[](op.size) : ::operator new(op.size);
  } catch (const std::bad_alloc&) {
    return nullptr;
  }
}

void callDelete(const Op& op, void* block) {
  bool array = op.kind == static_cast<uint8_t>(Kind::kDeleteArray) ||
               op.kind == static_cast<uint8_t>(Kind::kNewArray);
  bool sized = op.kind != static_cast<uint8_t>(Kind::kNew) &&
               op.kind != static_cast<uint8_t>(Kind::kNewArray) && (op.flags & kFlagSized) != 0;
  bool aligned = (op.flags & kFlagAligned) != 0;
  std::align_val_t align{static_cast<size_t>(op.arg)};
  if (array) {
    if (sized && aligned) return ::operator delete[](block, op.size, align);
    if (sized) return ::operator delete[](block, op.size);
    if (aligned) return ::operator delete[](block, align);
    return ::operator delete[](block);
  }
  if (sized && aligned) return ::operator delete(block, op.size, align);
  if (sized) return ::operator delete(block, op.size);
  if (aligned) return ::operator delete(block, align);
  ::operator delete(block);
}

// One allocating call of the malloc family or operator new; returns the block.
void* callAllocate(const Op& op) {
  switch (static_cast<Kind>(op.kind)) {
    case Kind::kMalloc:
      return malloc(op.size);
    case Kind::kCalloc:
      return calloc(op.arg, op.size);
    case Kind::kMemalign:
      return memalign(op.arg, op.size);
    case Kind::kAlignedAlloc:
      return aligned_alloc(op.arg, op.size);
    case Kind::kPosixMemalign: {
      void* block = nullptr;
      return posix_memalign(&block, op.arg, op.size) == 0 ? block : nullptr;
    }
    case Kind::kValloc:
      return valloc(op.size);
    case Kind::kPvalloc:
      return pvalloc(op.size);
    default:
      return callNew(op);
  }
}

void timed(ThreadState& state, const Op& op, uint64_t begin) {
  state.histograms[op.kind].add(ticks() - begin);
}

void replayRelease(ThreadState& state, const Op& op) {
  bool isFree = op.kind == static_cast<uint8_t>(Kind::kFree);
  if (op.slot == kNoSlot) {
    uint64_t begin = ticks();
    if (isFree)
      free(nullptr);
    else
      callDelete(op, nullptr);
    timed(state, op, begin);
    return;
  }
  uintptr_t value = waitTurn(op, state);
  if (value != kFailedBlock) {
    auto* block = reinterpret_cast<void*>(value);
    check(block, op.oldBytes, op.pattern, state, "lost its contents before its free");
    uint64_t begin = ticks();
    if (isFree)
      free(block);
    else
      callDelete(op, block);
    timed(state, op, begin);
  }
  publish(op, 0, state);
}

void replayAllocation(ThreadState& state, const Op& op) {
  if (op.flags & kOpAllocates) waitTurn(op, state);
  uint64_t begin = ticks();
  void* block = callAllocate(op);
  timed(state, op, begin);
  if (!block) {
    if (op.flags & kOpAllocates) {
      ++state.failed;
      publish(op, kFailedBlock, state);
    }
    return;
  }
  if (!(op.flags & kOpAllocates)) {
    // The recorded call failed and this one did not: give the block back at once.
    if (op.kind == static_cast<uint8_t>(Kind::kNew) ||
        op.kind == static_cast<uint8_t>(Kind::kNewArray)) {
      callDelete(op, block);
    } else {
      free(block);
    }
    return;
  }
  uint64_t align = op.kind == static_cast<uint8_t>(Kind::kMemalign) ||
                           op.kind == static_cast<uint8_t>(Kind::kAlignedAlloc) ||
                           op.kind == static_cast<uint8_t>(Kind::kPosixMemalign) ||
                           (op.flags & kFlagAligned)
                       ? op.arg
                       : 0;
  if (align > 1 && reinterpret_cast<uintptr_t>(block) % align != 0)
    fail(block, state, "is not aligned as asked", "");
  uint64_t bytes = requested(op);
  if (op.kind == static_cast<uint8_t>(Kind::kCalloc))
    check(block, bytes, 0, state, "from calloc is not zeroed");
  fill(block, bytes, op.pattern);
  publish(op, reinterpret_cast<uintptr_t>(block), state);
}

void replayRealloc(ThreadState& state, const Op& op) {
  void* old = nullptr;
  if (op.slot != kNoSlot) {
    uintptr_t value = waitTurn(op, state);
    if ((op.flags & kOpReleases) && value != kFailedBlock) old = reinterpret_cast<void*>(value);
  }
  if (old) check(old, op.oldBytes, op.pattern, state, "lost its contents before its realloc");
  uint64_t bytes = requested(op);
  uint64_t begin = ticks();
  void* block = op.kind == static_cast<uint8_t>(Kind::kRealloc)
                    ? realloc(old, op.size)
                    : reallocarray(old, op.arg, op.size);
  timed(state, op, begin);
  if (op.slot == kNoSlot) {
    if (block) free(block);  // the recorded call failed
    return;
  }
  if (!block) {
    if (old && bytes == 0) {
      publish(op, 0, state);  // realloc(p, 0) freed it
    } else if (!old) {
      ++state.failed;
      publish(op, kFailedBlock, state);
    } else {
      if (!(op.flags & kOpRecordedNull)) ++state.failed;
      publish(op, reinterpret_cast<uintptr_t>(old), state);  // the old block stays
    }
    return;
  }
  if (!(op.flags & kOpAllocates)) {
    // realloc(p, 0) freed p in the trace but returned a minimal block here (jemalloc's rule).
    free(block);
    publish(op, 0, state);
    return;
  }
  if (old) {
    // What the old block was written with, as far as the new one keeps it (a shrinking realloc
    // keeps the first `bytes`; in page mode the old last byte may be beyond them).
    check(block, op.oldBytes, op.pattern, state, "lost its contents in realloc", bytes);
  }
  fill(block, bytes, op.pattern);
  publish(op, reinterpret_cast<uintptr_t>(block), state);
}

void replayOne(ThreadState& state, const Op& op) {
  switch (static_cast<Kind>(op.kind)) {
    case Kind::kFree:
    case Kind::kDelete:
    case Kind::kDeleteArray:
      return replayRelease(state, op);
    case Kind::kRealloc:
    case Kind::kReallocArray:
      return replayRealloc(state, op);
    case Kind::kUsableSize: {
      uintptr_t value = waitTurn(op, state);
      if (value != kFailedBlock) {
        uint64_t begin = ticks();
        size_t usable = malloc_usable_size(reinterpret_cast<void*>(value));
        timed(state, op, begin);
        if (usable < op.oldBytes)
          fail(reinterpret_cast<void*>(value), state, "has a usable size below its request", "");
      }
      publish(op, value, state);
      return;
    }
    default:
      return replayAllocation(state, op);
  }
}

// When a call recorded `recordedNs` after the trace began is due, in the replay's clock.
uint64_t dueNs(uint64_t recordedNs) {
  double ns = replay.options.warp.map(static_cast<double>(recordedNs)) / replay.options.speed;
  return replay.startNs + static_cast<uint64_t>(ns);
}

void sleepUntil(uint64_t targetNs) {
  uint64_t now = monotonicNs();
  if (targetNs <= now + kSleepThresholdNs) return;
  timespec until{static_cast<time_t>(targetNs / 1'000'000'000u),
                 static_cast<long>(targetNs % 1'000'000'000u)};
  while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &until, nullptr) == EINTR) {
  }
}

void* replayThread(void* argument) {
  auto* state = static_cast<ThreadState*>(argument);
  const OpsThread& info = *state->info;
  size_t loaded = 0, position = 0;
  for (uint64_t index = 0; index < info.ops; ++index) {
    if (position == loaded) {
      uint64_t left = info.ops - index;
      size_t want = (left < kBufferOps ? left : kBufferOps) * sizeof(Op);
      ssize_t got = pread(replay.fd, state->buffer, want,
                          static_cast<off_t>(info.offset + index * sizeof(Op)));
      if (got != static_cast<ssize_t>(want)) {
        fprintf(stderr, "meshalloc-replay: %s: offset %" PRIu64 ": the ops file is truncated\n",
                replay.options.ops, info.offset + index * sizeof(Op));
        _exit(kExitInput);
      }
      loaded = want / sizeof(Op);
      position = 0;
    }
    const Op& op = state->buffer[position++];
    if (op.kind == 0 || op.kind > static_cast<uint8_t>(Kind::kLast) ||
        (op.slot != kNoSlot && op.slot >= replay.header.slots)) {
      fprintf(stderr, "meshalloc-replay: %s: offset %" PRIu64 ": malformed op\n",
              replay.options.ops, info.offset + index * sizeof(Op));
      _exit(kExitInput);
    }
    if (replay.options.timed) sleepUntil(dueNs(op.ns));
    replayOne(*state, op);
    state->done = index + 1;
  }
  return nullptr;
}

bool readExactly(int fd, void* out, size_t bytes, uint64_t offset) {
  return pread(fd, out, bytes, static_cast<off_t>(offset)) == static_cast<ssize_t>(bytes);
}

int loadOps() {
  const char* path = replay.options.ops;
  replay.fd = open(path, O_RDONLY | O_CLOEXEC);
  if (replay.fd < 0) {
    fprintf(stderr, "meshalloc-replay: %s: %s\n", path, strerror(errno));
    return kExitInput;
  }
  struct stat info;
  fstat(replay.fd, &info);
  uint64_t size = static_cast<uint64_t>(info.st_size);
  OpsHeader& header = replay.header;
  if (!readExactly(replay.fd, &header, sizeof(header), 0) ||
      memcmp(header.magic, kOpsMagic, sizeof(header.magic)) != 0 || header.version != kOpsVersion) {
    fprintf(stderr, "meshalloc-replay: %s: offset 0: not a prepared replay (version %u)\n", path,
            kOpsVersion);
    return kExitInput;
  }
  size_t tableBytes = header.threads * sizeof(OpsThread);
  replay.threads = static_cast<OpsThread*>(mapZeroed(tableBytes));
  if (!readExactly(replay.fd, replay.threads, tableBytes, sizeof(header))) {
    fprintf(stderr, "meshalloc-replay: %s: offset %zu: the thread table is truncated\n", path,
            sizeof(header));
    return kExitInput;
  }
  for (uint32_t i = 0; i < header.threads; ++i) {
    const OpsThread& thread = replay.threads[i];
    if (thread.ops > size / sizeof(Op) || thread.offset > size - thread.ops * sizeof(Op)) {
      fprintf(stderr, "meshalloc-replay: %s: offset %zu: thread %u's ops lie outside the file\n",
              path, sizeof(header) + i * sizeof(OpsThread), thread.thread);
      return kExitInput;
    }
  }
  replay.slots =
      static_cast<std::atomic<uint64_t>*>(mapZeroed(header.slots * sizeof(std::atomic<uint64_t>)));
  return 0;
}

// What the replayer maps for itself (its part of a replay's PSS that the program did not have):
// the slot table, and per thread its op buffer, histograms, state and handle.
uint64_t ownBytes() {
  uint64_t perThread = kBufferOps * sizeof(Op) + kKindCount * sizeof(Histogram) +
                       sizeof(ThreadState) + sizeof(pthread_t) + sizeof(OpsThread);
  return replay.header.slots * sizeof(std::atomic<uint64_t>) + replay.header.threads * perThread;
}

// The line `meshalloc trace replay` looks for in a run's output when the stats go to stdout.
constexpr const char* kStatsPrefix = "meshalloc-replay-stats: ";

void writeStats(ThreadState* states, uint64_t wallNs, uint64_t tickSpan) {
  bool toStdout = strcmp(replay.options.stats, "-") == 0;
  FILE* out = toStdout ? stdout : fopen(replay.options.stats, "w");
  if (!out) {
    fprintf(stderr, "meshalloc-replay: cannot write %s: %s\n", replay.options.stats,
            strerror(errno));
    _exit(kExitInput);
  }
  double nsPerTick = tickSpan ? static_cast<double>(wallNs) / static_cast<double>(tickSpan) : 1.0;
  auto ns = [&](uint64_t value) { return static_cast<double>(value) * nsPerTick; };
  uint64_t waits = 0, failed = 0, ops = 0;
  for (uint32_t i = 0; i < replay.header.threads; ++i) {
    waits += states[i].waits;
    failed += states[i].failed;
    ops += states[i].done;
  }
  if (toStdout) fputs(kStatsPrefix, out);
  fprintf(out,
          "{\"wall_ns\": %" PRIu64 ", \"ops\": %" PRIu64 ", \"threads\": %u, \"waits\": %" PRIu64
          ", \"failed_allocations\": %" PRIu64 ", \"own_bytes\": %" PRIu64
          ", \"timing\": \"%s\", \"speed\": %g, \"touch\": \"%s\", \"kinds\": {",
          wallNs, ops, replay.header.threads, waits, failed, ownBytes(),
          replay.options.timed ? "recorded" : "fast", replay.options.speed,
          replay.options.touch == Touch::kNone   ? "none"
          : replay.options.touch == Touch::kPage ? "page"
                                                 : "block");
  const char* separator = "";
  for (size_t kind = 1; kind < kKindCount; ++kind) {
    Histogram total{};
    for (uint32_t i = 0; i < replay.header.threads; ++i) {
      const Histogram& mine = states[i].histograms[kind];
      for (size_t b = 0; b < kBuckets; ++b) total.counts[b] += mine.counts[b];
      total.calls += mine.calls;
      total.sum += mine.sum;
      if (mine.max > total.max) total.max = mine.max;
    }
    if (total.calls == 0) continue;
    fprintf(out,
            "%s\"%s\": {\"calls\": %" PRIu64 ", \"sum_ns\": %.0f, \"max_ns\": %.0f, \"buckets\": [",
            separator, meshtrace::kKinds[kind].name, total.calls, ns(total.sum), ns(total.max));
    const char* comma = "";
    for (size_t b = 0; b < kBuckets; ++b) {
      if (total.counts[b] == 0) continue;
      fprintf(out, "%s[%.1f, %.1f, %" PRIu64 "]", comma, ns(bucketLow(b)), ns(bucketLow(b + 1)),
              total.counts[b]);
      comma = ", ";
    }
    fprintf(out, "]}");
    separator = ", ";
  }
  fprintf(out, "}}\n");
  if ((toStdout ? fflush(out) : fclose(out)) != 0) _exit(kExitInput);
}

int usage(const char* message) {
  fprintf(stderr,
          "meshalloc-replay: %s (usage: meshalloc-replay OPS [--timing fast|recorded] [--speed X] "
          "[--warp RECORDED_S:REPLAY_S,...] [--touch none|page|block] [--stats FILE])\n",
          message);
  return kExitUsage;
}

// Prints arenas.bin.<i>.size for every bin of the preloaded allocator's mallctl.
int printSizeClasses() {
  using Mallctl = int (*)(const char*, void*, size_t*, void*, size_t);
  auto mallctl = reinterpret_cast<Mallctl>(dlsym(RTLD_DEFAULT, "mallctl"));
  unsigned bins = 0;
  size_t length = sizeof(bins);
  if (!mallctl || mallctl("arenas.nbins", &bins, &length, nullptr, 0) != 0) {
    fprintf(stderr, "meshalloc-replay: the preloaded allocator has no mallctl arenas.nbins\n");
    return kExitInput;
  }
  for (unsigned bin = 0; bin < bins; ++bin) {
    char name[64];
    snprintf(name, sizeof(name), "arenas.bin.%u.size", bin);
    size_t size = 0;
    length = sizeof(size);
    if (mallctl(name, &size, &length, nullptr, 0) != 0) return kExitInput;
    printf("%zu\n", size);
  }
  return 0;
}

// "R1:P1,R2:P2,...": seconds, each point after the last (and after (0, 0)) in both clocks.
bool parseWarp(const char* text, Warp* warp) {
  warp->points = 0;
  double lastRecorded = 0, lastReplayed = 0;
  while (*text != '\0') {
    if (warp->points == kMaxWarpPoints) return false;
    char* end;
    double recorded = strtod(text, &end);
    if (end == text || *end != ':') return false;
    text = end + 1;
    double replayed = strtod(text, &end);
    if (end == text || (*end != ',' && *end != '\0')) return false;
    if (!(recorded > lastRecorded) || !(replayed > lastReplayed)) return false;
    warp->recorded[warp->points] = recorded * 1e9;
    warp->replayed[warp->points] = replayed * 1e9;
    ++warp->points;
    lastRecorded = recorded;
    lastReplayed = replayed;
    text = *end == ',' ? end + 1 : end;
  }
  return warp->points > 0;
}

int parse(int argc, char** argv, Options* options) {
  for (int i = 1; i < argc; ++i) {
    std::string argument = argv[i];
    if (argument == "--size-classes")
      _exit(printSizeClasses() == 0 && fflush(stdout) == 0 ? 0 : kExitInput);
    const char* value = i + 1 < argc ? argv[i + 1] : nullptr;
    if (argument == "--timing" || argument == "--touch" || argument == "--speed" ||
        argument == "--warp" || argument == "--stats") {
      if (!value) return usage((argument + " needs a value").c_str());
      ++i;
      std::string text = value;
      if (argument == "--timing") {
        if (text != "fast" && text != "recorded") return usage("--timing is fast or recorded");
        options->timed = text == "recorded";
      } else if (argument == "--touch") {
        if (text == "none")
          options->touch = Touch::kNone;
        else if (text == "page")
          options->touch = Touch::kPage;
        else if (text == "block")
          options->touch = Touch::kBlock;
        else
          return usage("--touch is none, page or block");
      } else if (argument == "--speed") {
        char* end;
        options->speed = strtod(value, &end);
        if (*end != '\0' || !(options->speed > 0)) return usage("--speed needs a positive number");
      } else if (argument == "--warp") {
        if (!parseWarp(value, &options->warp))
          return usage("--warp needs up to 32 points RECORDED_S:REPLAY_S, both increasing");
      } else {
        options->stats = value;
      }
    } else if (!argument.empty() && argument[0] == '-') {
      return usage(("unknown option " + argument).c_str());
    } else if (!options->ops) {
      options->ops = argv[i];
    } else {
      return usage("more than one ops file");
    }
  }
  if (!options->ops) return usage("missing ops file");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (int status = parse(argc, argv, &replay.options)) return status;
  long page = sysconf(_SC_PAGESIZE);
  replay.pageSize = page > 0 ? static_cast<size_t>(page) : 4096;
  if (int status = loadOps()) return status;
  uint32_t count = replay.header.threads;
  auto* states = static_cast<ThreadState*>(mapZeroed(count * sizeof(ThreadState)));
  auto* handles = static_cast<pthread_t*>(mapZeroed(count * sizeof(pthread_t)));
  for (uint32_t i = 0; i < count; ++i) {
    states[i].info = &replay.threads[i];
    states[i].buffer = static_cast<Op*>(mapZeroed(kBufferOps * sizeof(Op)));
    states[i].histograms = static_cast<Histogram*>(mapZeroed(kKindCount * sizeof(Histogram)));
  }
  pthread_attr_t attributes;
  pthread_attr_init(&attributes);
  pthread_attr_setstacksize(&attributes, kThreadStack);
  uint64_t startTicks = ticks();
  replay.startNs = monotonicNs();
  for (uint32_t i = 0; i < count; ++i) {
    // Threads start in recorded order; with --timing recorded, at their recorded time.
    if (replay.options.timed) sleepUntil(dueNs(replay.threads[i].startNs));
    int error = pthread_create(&handles[i], &attributes, replayThread, &states[i]);
    if (error != 0) {
      fprintf(stderr, "meshalloc-replay: cannot create replay thread %u: %s\n", i, strerror(error));
      _exit(kExitInput);
    }
  }
  for (uint32_t i = 0; i < count; ++i) pthread_join(handles[i], nullptr);
  uint64_t wallNs = monotonicNs() - replay.startNs;
  uint64_t tickSpan = ticks() - startTicks;
  if (replay.options.stats) writeStats(states, wallNs, tickSpan);
  return 0;
}
