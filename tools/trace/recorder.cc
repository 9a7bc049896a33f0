// libmeshalloc-trace.so: records every malloc-family call and C++ operator new/delete of the
// program it is preloaded into, and forwards each to the allocator underneath (the next
// definition, dlsym(RTLD_NEXT)). The design (buffers, fork, signals, exit) is in docs/trace.md.
// Built like the core: no exceptions, no RTTI, no libstdc++ at run time, and it never calls the
// allocator it wraps for its own memory (mmap only).
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <cpuid.h>
#include <x86intrin.h>
#endif

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "format.h"

#define TRACE_EXPORT __attribute__((visibility("default")))

using namespace meshtrace;

namespace {

// ------------------------------------------------------------------------------------ clock

uint64_t monotonicNs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000000000u + static_cast<uint64_t>(now.tv_nsec);
}

// The time-stamp counter is only a clock when it ticks at a constant rate in every power state
// ("invariant TSC", CPUID 0x80000007 EDX bit 8; Linux's constant_tsc + nonstop_tsc); then it
// costs a few nanoseconds where clock_gettime costs about twenty. Decided once, at start.
bool gUseTsc = false;
constexpr uint32_t kTscShift = 4;  // 16 cycles: about 5 ns, and 1-byte deltas are common

bool invariantTsc() {
#if defined(__x86_64__)
  unsigned a, b, c, d;
  return __get_cpuid(0x80000007, &a, &b, &c, &d) && (d & (1u << 8)) != 0;
#else
  return false;
#endif
}

uint64_t ticks() {
#if defined(__x86_64__)
  if (gUseTsc) return __rdtsc() >> kTscShift;
#endif
  return monotonicNs();
}

Calibration calibrate() {
  uint64_t ns = monotonicNs();
  return {ticks(), ns};
}

void writeStderr(const char* message) {
  ssize_t ignored = write(STDERR_FILENO, message, strlen(message));
  (void)ignored;
}

// ------------------------------------------------------------------ the functions underneath

using MallocFn = void* (*)(size_t);
using CallocFn = void* (*)(size_t, size_t);
using ReallocFn = void* (*)(void*, size_t);
using FreeFn = void (*)(void*);
using AlignedFn = void* (*)(size_t, size_t);
using PosixMemalignFn = int (*)(void**, size_t, size_t);
using UsableSizeFn = size_t (*)(void*);
using ForkFn = pid_t (*)();
using ExecveFn = int (*)(const char*, char* const[], char* const[]);
using ExecvFn = int (*)(const char*, char* const[]);
using FexecveFn = int (*)(int, char* const[], char* const[]);
using NewFn = void* (*)(size_t);
using NewNothrowFn = void* (*)(size_t, const std::nothrow_t&);
using NewAlignedFn = void* (*)(size_t, std::align_val_t);
using NewAlignedNothrowFn = void* (*)(size_t, std::align_val_t, const std::nothrow_t&);
using DeleteFn = void (*)(void*);
using DeleteSizedFn = void (*)(void*, size_t);
using DeleteAlignedFn = void (*)(void*, std::align_val_t);
using DeleteSizedAlignedFn = void (*)(void*, size_t, std::align_val_t);

struct Next {
  MallocFn malloc;
  CallocFn calloc;
  ReallocFn realloc;
  FreeFn free;
  AlignedFn memalign;
  PosixMemalignFn posixMemalign;
  AlignedFn alignedAlloc;
  MallocFn valloc;
  MallocFn pvalloc;
  UsableSizeFn usableSize;
  ForkFn fork;
  ExecveFn execve;
  ExecvFn execv;
  ExecvFn execvp;
  ExecveFn execvpe;
  FexecveFn fexecve;
  // C++ operators: [0] scalar, [1] array. May be null (a C program has no libstdc++).
  NewFn newPlain[2];
  NewNothrowFn newNothrow[2];
  NewAlignedFn newAligned[2];
  NewAlignedNothrowFn newAlignedNothrow[2];
  DeleteFn deletePlain[2];
  DeleteSizedFn deleteSized[2];
  DeleteAlignedFn deleteAligned[2];
  DeleteSizedAlignedFn deleteSizedAligned[2];
};
Next gNext;
std::atomic<bool> gResolved{false};

// Thread-local state. initial-exec TLS (-ftls-model): reading it never allocates.
struct Block;
thread_local bool tlsInside = false;     // the recorder itself is running on this thread
thread_local bool tlsResolving = false;  // this thread is inside dlsym
thread_local Block* tlsBlock = nullptr;
// After the thread-exit destructor handed this thread's block back, a late call (another key's
// destructor freeing memory) continues the same thread index and chunk sequence in a new block.
thread_local uint32_t tlsExitedThread = UINT32_MAX;
thread_local uint32_t tlsNextSequence = 0;
thread_local uint64_t tlsThreadEvents = 0;

// dlsym may allocate (its error buffer); while this thread resolves, such calls are served
// from here. Each block has a 16-byte prefix holding its size (for realloc/usable_size).
alignas(64) uint8_t gBootstrap[64 * 1024];
std::atomic<size_t> gBootstrapUsed{0};

bool isBootstrap(const void* pointer) {
  auto p = static_cast<const uint8_t*>(pointer);
  return p >= gBootstrap && p < gBootstrap + sizeof(gBootstrap);
}

void* bootstrapAllocate(size_t size) {
  size_t rounded = (size + 15) & ~size_t{15};
  if (rounded < size) return nullptr;
  size_t start = gBootstrapUsed.fetch_add(rounded + 16);
  if (start + rounded + 16 > sizeof(gBootstrap) || start + rounded + 16 < start) return nullptr;
  memcpy(gBootstrap + start, &size, sizeof(size));
  return gBootstrap + start + 16;  // static storage: already zero, as calloc needs
}

size_t bootstrapSize(const void* pointer) {
  size_t size;
  memcpy(&size, static_cast<const uint8_t*>(pointer) - 16, sizeof(size));
  return size;
}

template <typename Function>
void lookUp(Function* slot, const char* name) {
  *slot = reinterpret_cast<Function>(dlsym(RTLD_NEXT, name));
}

void resolve() {
  if (tlsResolving) return;
  tlsResolving = true;
  Next next{};
  lookUp(&next.malloc, "malloc");
  lookUp(&next.calloc, "calloc");
  lookUp(&next.realloc, "realloc");
  lookUp(&next.free, "free");
  lookUp(&next.memalign, "memalign");
  lookUp(&next.posixMemalign, "posix_memalign");
  lookUp(&next.alignedAlloc, "aligned_alloc");
  lookUp(&next.valloc, "valloc");
  lookUp(&next.pvalloc, "pvalloc");
  lookUp(&next.usableSize, "malloc_usable_size");
  lookUp(&next.fork, "fork");
  lookUp(&next.execve, "execve");
  lookUp(&next.execv, "execv");
  lookUp(&next.execvp, "execvp");
  lookUp(&next.execvpe, "execvpe");
  lookUp(&next.fexecve, "fexecve");
  lookUp(&next.newPlain[0], "_Znwm");
  lookUp(&next.newPlain[1], "_Znam");
  lookUp(&next.newNothrow[0], "_ZnwmRKSt9nothrow_t");
  lookUp(&next.newNothrow[1], "_ZnamRKSt9nothrow_t");
  lookUp(&next.newAligned[0], "_ZnwmSt11align_val_t");
  lookUp(&next.newAligned[1], "_ZnamSt11align_val_t");
  lookUp(&next.newAlignedNothrow[0], "_ZnwmSt11align_val_tRKSt9nothrow_t");
  lookUp(&next.newAlignedNothrow[1], "_ZnamSt11align_val_tRKSt9nothrow_t");
  lookUp(&next.deletePlain[0], "_ZdlPv");
  lookUp(&next.deletePlain[1], "_ZdaPv");
  lookUp(&next.deleteSized[0], "_ZdlPvm");
  lookUp(&next.deleteSized[1], "_ZdaPvm");
  lookUp(&next.deleteAligned[0], "_ZdlPvSt11align_val_t");
  lookUp(&next.deleteAligned[1], "_ZdaPvSt11align_val_t");
  lookUp(&next.deleteSizedAligned[0], "_ZdlPvmSt11align_val_t");
  lookUp(&next.deleteSizedAligned[1], "_ZdaPvmSt11align_val_t");
  if (!next.malloc || !next.calloc || !next.realloc || !next.free || !next.fork) {
    writeStderr("meshalloc-trace: cannot find the allocator underneath (dlsym RTLD_NEXT)\n");
    abort();
  }
  gNext = next;
  gResolved.store(true, std::memory_order_release);
  tlsResolving = false;
}

inline void ensureResolved() {
  if (__builtin_expect(!gResolved.load(std::memory_order_acquire), 0)) resolve();
}

// ---------------------------------------------------------------------------- the trace file

enum : int { kUninitialized, kInitializing, kRecording, kOff };
std::atomic<int> gState{kUninitialized};
int gFd = -1;
uint32_t gPid = 0;  // the process the open trace file belongs to
char gPath[4096];
std::atomic<uint64_t> gFileEnd{0};
uint32_t gCallsiteEvery = 0;
pthread_key_t gThreadKey;
std::atomic<uint64_t> gDropped{0};
std::atomic<bool> gWriteFailed{false};

// The footer's tables, filled as chunks are written and threads end. Reserved address space
// (MAP_NORESERVE): pages are only committed as entries are written.
constexpr size_t kMaxIndexEntries = size_t{1} << 22;  // 4 Mi chunks of up to 64 KiB: 256 GiB
constexpr size_t kMaxThreads = size_t{1} << 20;
IndexEntry* gIndex = nullptr;
std::atomic<uint64_t> gIndexCount{0};
ThreadEntry* gThreads = nullptr;
std::atomic<uint32_t> gThreadCount{0};

void* mapMemory(size_t bytes, bool noReserve) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | (noReserve ? MAP_NORESERVE : 0), -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

bool writeAll(const void* data, size_t size, uint64_t offset) {
  auto p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    ssize_t written = pwrite(gFd, p, size, static_cast<off_t>(offset));
    if (written < 0 && errno == EINTR) continue;
    if (written <= 0) {
      if (!gWriteFailed.exchange(true))
        writeStderr("meshalloc-trace: cannot write the trace file; recording stops\n");
      return false;
    }
    p += written;
    size -= static_cast<size_t>(written);
    offset += static_cast<uint64_t>(written);
  }
  return true;
}

// Writes `value` in decimal at `out`; returns the end.
char* putDecimal(char* out, uint64_t value) {
  char digits[24];
  int n = 0;
  do {
    digits[n++] = static_cast<char>('0' + value % 10);
    value /= 10;
  } while (value != 0);
  while (n > 0) *out++ = digits[--n];
  return out;
}

// Opens gPath, or gPath.<pid>, or gPath.<pid>.<n>: the process `trace record` started gets the
// plain name (the command removes any old file first), forked children and programs they exec
// get their own (docs/trace.md).
bool openTraceFile(bool forkedChild) {
  size_t length = strlen(gPath);
  char name[sizeof(gPath) + 64];
  memcpy(name, gPath, length + 1);
  for (int attempt = forkedChild ? 1 : 0; attempt < 100; ++attempt) {
    char* end = name + length;
    if (attempt >= 1) {
      *end++ = '.';
      end = putDecimal(end, static_cast<uint64_t>(getpid()));
    }
    if (attempt >= 2) {
      *end++ = '.';
      end = putDecimal(end, static_cast<uint64_t>(attempt - 1));
    }
    *end = '\0';
    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (forkedChild && attempt == 1 ? O_TRUNC : O_EXCL);
    gFd = open(name, flags, 0644);
    if (gFd >= 0) return true;
    if (errno != EEXIST) break;
  }
  writeStderr("meshalloc-trace: cannot create the trace file; not recording\n");
  return false;
}

bool startFile(uint32_t parentPid) {
  FileHeader header{};
  memcpy(header.magic, kFileMagic, sizeof(kFileMagic));
  header.version = kFormatVersion;
  header.headerSize = sizeof(FileHeader);
  gPid = static_cast<uint32_t>(getpid());
  header.pid = gPid;
  header.parentPid = parentPid;
  header.tickShift = gUseTsc ? kTscShift : 0;
  header.start = calibrate();
  gFileEnd.store(sizeof(FileHeader));
  gIndexCount.store(0);
  gThreadCount.store(0);
  return writeAll(&header, sizeof(header), 0);
}

// -------------------------------------------------------------------------- thread buffers

enum : uint32_t { kIdle, kBusy, kClosed };
constexpr uint32_t kDeferredCapacity = 64;

// An event as the wrappers hand it over, before encoding: the kind byte and the fields in the
// order of kKinds[kind].fields.
struct RawEvent {
  uint8_t kindByte;
  uint64_t tick;
  uint64_t fields[6];
  const void* caller;
};

// One thread's recording state and buffer, mmap'd. Blocks are never unmapped (except in a
// forked child, for the parent's other threads): a block is listed on gAllBlocks for the exit
// flush and reused through the pool when its thread ends.
struct Block {
  std::atomic<uint32_t> state;
  uint32_t thread;
  uint32_t sequence;
  uint32_t events;
  uint32_t used;
  uint32_t sinceCallsite;
  uint64_t baseTick;
  uint64_t lastTick;
  uint64_t firstTick;
  uint64_t previousAddress;
  uint64_t threadEvents;
  std::atomic<uint32_t> deferredCount;
  RawEvent deferred[kDeferredCapacity];
  Block* nextAll;
  Block* nextFree;
  // Two buffers: while a full one is written (outside the busy state, so that a signal handler
  // can record meanwhile), events go into the other. inFlight: the other one is being written.
  uint32_t active;
  std::atomic<uint32_t> inFlight;
  std::atomic<bool> hasPending;  // `pending` is sealed and waits to be written
  struct Sealed {
    const uint8_t* data;
    size_t size;
    uint64_t offset;
    IndexEntry entry;
  } pending;
  alignas(64) uint8_t chunk[2][sizeof(ChunkHeader) + kMaxChunkPayload];

  uint8_t* payload() { return chunk[active] + sizeof(ChunkHeader); }
};

std::atomic<Block*> gAllBlocks{nullptr};
std::atomic<Block*> gPool{nullptr};
std::atomic<bool> gPoolLock{false};

// Turns the active buffer into a chunk: its header, its place in the file and its sequence
// number are fixed now (the caller owns the block: busy or closed), so chunks stay in order even
// when they are written later.
Block::Sealed seal(Block* block) {
  ChunkHeader header{};
  header.magic = kChunkMagic;
  header.payloadBytes = block->used;
  header.thread = block->thread;
  header.sequence = block->sequence;
  header.events = block->events;
  header.baseTick = block->baseTick;
  header.checksum = payloadChecksum(block->payload(), block->used);
  header.written = calibrate();
  memcpy(block->chunk[block->active], &header, sizeof(header));
  Block::Sealed sealed{};
  sealed.data = block->chunk[block->active];
  sealed.size = sizeof(ChunkHeader) + block->used;
  sealed.offset = gFileEnd.fetch_add(sealed.size);
  sealed.entry.offset = sealed.offset;
  sealed.entry.thread = block->thread;
  sealed.entry.sequence = block->sequence;
  sealed.entry.events = block->events;
  sealed.entry.firstTick = block->firstTick;
  sealed.entry.lastTick = block->lastTick;
  block->sequence++;
  block->used = 0;
  block->events = 0;
  block->baseTick = block->lastTick;
  block->previousAddress = 0;
  return sealed;
}

void writeChunk(const Block::Sealed& sealed) {
  int savedErrno = errno;
  if (!gWriteFailed.load(std::memory_order_relaxed) &&
      writeAll(sealed.data, sealed.size, sealed.offset)) {
    uint64_t slot = gIndexCount.fetch_add(1);
    if (slot < kMaxIndexEntries) {
      gIndex[slot] = sealed.entry;
      // Published last: the footer only lists entries whose chunk is completely written.
      __atomic_store_n(&gIndex[slot].reserved, 1u, __ATOMIC_RELEASE);
    }
  }
  errno = savedErrno;
}

// Writes the active buffer now (the caller owns the block).
void flush(Block* block) {
  if (block->events != 0) writeChunk(seal(block));
}

// Writes the chunk sealed by the last switch of buffers, if nobody has yet (the owner after
// leaving the busy state, or a signal handler that interrupted it before).
void writePending(Block* block) {
  if (!block->hasPending.exchange(false, std::memory_order_acquire)) return;
  writeChunk(block->pending);
  block->inFlight.store(0, std::memory_order_release);
}

// The active buffer is full: switch to the other one and leave this one to writePending; if
// the other is still being written (a handler interrupted that write), write this one now.
void rotate(Block* block) {
  if (block->inFlight.load(std::memory_order_acquire) != 0) {
    flush(block);
    return;
  }
  block->pending = seal(block);
  block->inFlight.store(1, std::memory_order_relaxed);
  block->hasPending.store(true, std::memory_order_release);
  block->active ^= 1;
}

void encode(Block* block, const RawEvent& event) {
  if (block->used + kMaxEventBytes > kMaxChunkPayload) rotate(block);
  uint8_t* start = block->payload() + block->used;
  uint8_t* out = start;
  uint8_t kindByte = event.kindByte;
  bool withCallsite = false;
  if (gCallsiteEvery != 0 && ++block->sinceCallsite >= gCallsiteEvery) {
    block->sinceCallsite = 0;
    withCallsite = true;
    kindByte |= kFlagCallsite;
  }
  *out++ = kindByte;
  if (block->events == 0) block->firstTick = event.tick;
  out = putVarint(out, zigzag(static_cast<int64_t>(event.tick - block->lastTick)));
  block->lastTick = event.tick;
  Kind kind = static_cast<Kind>(kindByte & kKindMask);
  const KindInfo& info = kKinds[static_cast<uint8_t>(kind)];
  for (int i = 0; i < 6 && info.fields[i] != Field::kNone; ++i) {
    Field field = info.fields[i];
    if (!fieldPresent(kind, kindByte, field)) continue;
    uint64_t value = event.fields[i];
    if (field == Field::kAddress || field == Field::kOldAddress || field == Field::kResult) {
      out = putAddress(out, value, &block->previousAddress);
    } else {
      out = putVarint(out, value);
    }
  }
  if (withCallsite) {
    uint64_t mixed = reinterpret_cast<uintptr_t>(event.caller) * 0x9e3779b97f4a7c15ull;
    out = putVarint(out, mixed >> 32);
  }
  block->used += static_cast<uint32_t>(out - start);
  block->events++;
  block->threadEvents++;
}

void drainDeferred(Block* block) {
  for (uint32_t done = 0;;) {
    uint32_t count = block->deferredCount.load(std::memory_order_acquire);
    if (done == count) {
      if (block->deferredCount.compare_exchange_strong(count, 0)) return;
      continue;
    }
    std::atomic_signal_fence(std::memory_order_acquire);
    encode(block, block->deferred[done++]);
  }
}

// The hot path: encode into this thread's buffer. A signal handler that interrupts it (state
// busy) leaves its event in the deferred array, which the interrupted call appends afterwards.
void record(Block* block, const RawEvent& event) {
  for (;;) {
    uint32_t prior = block->state.exchange(kBusy, std::memory_order_acquire);
    if (prior == kBusy) {
      uint32_t slot = block->deferredCount.load(std::memory_order_relaxed);
      if (slot >= kDeferredCapacity) {
        gDropped.fetch_add(1, std::memory_order_relaxed);
        return;
      }
      block->deferred[slot] = event;
      std::atomic_signal_fence(std::memory_order_release);
      block->deferredCount.store(slot + 1, std::memory_order_release);
      return;
    }
    if (prior == kClosed) {  // the program is exiting: the footer is written
      block->state.store(kClosed, std::memory_order_relaxed);
      return;
    }
    encode(block, event);
    drainDeferred(block);
    block->state.store(kIdle, std::memory_order_release);
    // A handler that ran between the drain and the store deferred its event: append it now.
    if (block->deferredCount.load(std::memory_order_acquire) != 0 &&
        block->state.exchange(kBusy, std::memory_order_acquire) == kIdle) {
      drainDeferred(block);
      block->state.store(kIdle, std::memory_order_release);
    }
    writePending(block);
    return;
  }
}

// A new thread index and its row in the thread table.
uint32_t newThreadIndex(uint32_t osThreadId) {
  uint32_t index = gThreadCount.fetch_add(1);
  if (index < kMaxThreads) {
    gThreads[index].thread = index;
    gThreads[index].osThreadId = osThreadId;
    gThreads[index].events = 0;
  }
  return index;
}

void resetBlock(Block* block, uint32_t thread) {
  block->thread = thread;
  block->sequence = 0;
  block->events = 0;
  block->used = 0;
  block->sinceCallsite = 0;
  block->baseTick = ticks();
  block->lastTick = block->baseTick;
  block->firstTick = block->baseTick;
  block->previousAddress = 0;
  block->threadEvents = 0;
  block->deferredCount.store(0);
  block->active = 0;
  block->inFlight.store(0);
  block->hasPending.store(false);
  block->state.store(kIdle);
}

Block* takeBlock() {
  Block* block = nullptr;
  bool unlocked = false;
  if (gPoolLock.compare_exchange_strong(unlocked, true, std::memory_order_acquire)) {
    block = gPool.load(std::memory_order_relaxed);
    if (block) gPool.store(block->nextFree, std::memory_order_relaxed);
    gPoolLock.store(false, std::memory_order_release);
  }
  if (block) return block;
  block = static_cast<Block*>(mapMemory(sizeof(Block), false));
  if (!block) return nullptr;
  Block* head = gAllBlocks.load(std::memory_order_relaxed);
  do {
    block->nextAll = head;
  } while (!gAllBlocks.compare_exchange_weak(head, block, std::memory_order_release,
                                             std::memory_order_relaxed));
  return block;
}

// Without the lock (another thread holds it for an instant) the block is simply not reused.
void returnBlock(Block* block) {
  bool unlocked = false;
  if (!gPoolLock.compare_exchange_strong(unlocked, true, std::memory_order_acquire)) return;
  block->nextFree = gPool.load(std::memory_order_relaxed);
  gPool.store(block, std::memory_order_relaxed);
  gPoolLock.store(false, std::memory_order_release);
}

RawEvent makeEvent(Kind kind, uint8_t flags, uint64_t tick, const void* caller, uint64_t a = 0,
                   uint64_t b = 0, uint64_t c = 0, uint64_t d = 0, uint64_t e = 0) {
  return RawEvent{
      static_cast<uint8_t>(static_cast<uint8_t>(kind) | flags), tick, {a, b, c, d, e, 0}, caller};
}

uint32_t osThreadId() {
  return static_cast<uint32_t>(syscall(SYS_gettid));
}

// This thread's block, created on its first event (tlsInside is set by the caller).
Block* attachThread() {
  Block* block = takeBlock();
  if (!block) return nullptr;
  tlsBlock = block;
  pthread_setspecific(gThreadKey, block);
  if (tlsExitedThread != UINT32_MAX) {
    resetBlock(block, tlsExitedThread);
    block->sequence = tlsNextSequence;
    block->threadEvents = tlsThreadEvents;
    return block;
  }
  uint32_t tid = osThreadId();
  resetBlock(block, newThreadIndex(tid));
  record(block, makeEvent(Kind::kThreadStart, 0, ticks(), nullptr, tid));
  return block;
}

void publishThreadEvents(const Block* block) {
  if (block->thread < kMaxThreads) gThreads[block->thread].events = block->threadEvents;
}

void onThreadExit(void* value) {
  auto* block = static_cast<Block*>(value);
  tlsInside = true;
  if (tlsExitedThread == UINT32_MAX)
    record(block, makeEvent(Kind::kThreadExit, 0, ticks(), nullptr));
  uint32_t idle = kIdle;
  if (block->state.compare_exchange_strong(idle, kBusy, std::memory_order_acquire)) {
    flush(block);
    publishThreadEvents(block);
    tlsExitedThread = block->thread;
    tlsNextSequence = block->sequence;
    tlsThreadEvents = block->threadEvents;
    resetBlock(block, UINT32_MAX);
    tlsBlock = nullptr;
    returnBlock(block);
  }
  tlsInside = false;
}

bool initialize() {
  int expected = kUninitialized;
  if (!gState.compare_exchange_strong(expected, kInitializing)) return gState.load() == kRecording;
  const char* path = getenv(kEnvFile);
  if (!path || !*path || strlen(path) >= sizeof(gPath)) {
    gState.store(kOff);
    return false;
  }
  memcpy(gPath, path, strlen(path) + 1);
  gUseTsc = invariantTsc();
  if (const char* every = getenv(kEnvCallsites)) {
    uint32_t value = 0;
    for (const char* p = every; *p >= '0' && *p <= '9' && value < 100000000; ++p)
      value = value * 10 + static_cast<uint32_t>(*p - '0');
    gCallsiteEvery = value;
  }
  gIndex = static_cast<IndexEntry*>(mapMemory(kMaxIndexEntries * sizeof(IndexEntry), true));
  gThreads = static_cast<ThreadEntry*>(mapMemory(kMaxThreads * sizeof(ThreadEntry), true));
  if (!gIndex || !gThreads || pthread_key_create(&gThreadKey, onThreadExit) != 0 ||
      !openTraceFile(false) || !startFile(0)) {
    gState.store(kOff);
    return false;
  }
  gState.store(kRecording, std::memory_order_release);
  return true;
}

// The block to record into, or null: recording is off, not ready, or the recorder itself is
// the caller.
inline Block* enter() {
  if (tlsInside) return nullptr;
  int state = gState.load(std::memory_order_acquire);
  if (__builtin_expect(state != kRecording, 0)) {
    if (state != kUninitialized) return nullptr;
    tlsInside = true;
    bool on = initialize();
    tlsInside = false;
    if (!on) return nullptr;
  }
  Block* block = tlsBlock;
  if (__builtin_expect(block == nullptr, 0)) {
    tlsInside = true;
    block = attachThread();
    tlsInside = false;
  }
  return block;
}

// Program exit: claim every block, flush it, write the footer.
// Whether this is the process the trace file belongs to, not a vfork child sharing its memory
// (which must not close the parent's buffers when it execs or exits).
bool inOwnProcess() {
  return static_cast<uint32_t>(getpid()) == gPid;
}

// Claims every block, flushes it and writes the footer; false if the trace was not recording.
// At exit the file is closed; before an exec it stays open (close-on-exec), so that a failed
// exec can resume (resumeAfterFailedExec).
bool finishTrace(bool closeFile) {
  if (gState.load() != kRecording || !inOwnProcess()) return false;
  tlsInside = true;
  for (Block* block = gAllBlocks.load(std::memory_order_acquire); block; block = block->nextAll) {
    for (int attempt = 0;; ++attempt) {
      uint32_t idle = kIdle;
      if (block->state.compare_exchange_strong(idle, kClosed, std::memory_order_acquire)) break;
      if (idle == kClosed || attempt == 1000) break;  // its owner is stuck mid-event: skip it
      sched_yield();
    }
    if (block->state.load() != kClosed) continue;
    writePending(block);  // sealed by its owner, which has not written it yet
    for (int attempt = 0; block->inFlight.load(std::memory_order_acquire) != 0 && attempt < 1000;
         ++attempt) {
      sched_yield();  // its owner is writing the other buffer: let it finish and index it
    }
    flush(block);
    if (block->thread != UINT32_MAX) publishThreadEvents(block);
  }
  gState.store(kOff);
  uint64_t chunks = gIndexCount.load();
  uint32_t threads = gThreadCount.load();
  if (chunks > kMaxIndexEntries || threads > kMaxThreads || gWriteFailed.load()) {
    tlsInside = false;
    return true;  // no footer: the decoder walks the chunks (docs/trace.md)
  }
  // Keep only entries whose chunk is completely written; count the events.
  uint32_t kept = 0;
  uint64_t events = 0;
  for (uint64_t i = 0; i < chunks; ++i) {
    if (__atomic_load_n(&gIndex[i].reserved, __ATOMIC_ACQUIRE) != 1) continue;
    gIndex[kept] = gIndex[i];  // still marked written, should recording resume
    events += gIndex[kept].events;
    ++kept;
  }
  gIndexCount.store(kept);
  uint64_t offset = gFileEnd.load();
  Trailer trailer{};
  memcpy(trailer.magic, kTrailerMagic, sizeof(kTrailerMagic));
  trailer.indexOffset = offset;
  trailer.indexEntries = kept;
  trailer.threadEntries = threads;
  trailer.events = events;
  trailer.dropped = gDropped.load();
  trailer.end = calibrate();
  size_t indexBytes = kept * sizeof(IndexEntry);
  size_t threadBytes = threads * sizeof(ThreadEntry);
  if (writeAll(gIndex, indexBytes, offset) &&
      writeAll(gThreads, threadBytes, offset + indexBytes)) {
    writeAll(&trailer, sizeof(trailer), offset + indexBytes + threadBytes);
  }
  if (closeFile) close(gFd);
  tlsInside = false;
  return true;
}

// The exec failed: reopen every block. The footer just written is overwritten by the next
// chunks (they start where it starts), and the program's exit writes a longer one.
void resumeAfterFailedExec() {
  for (Block* block = gAllBlocks.load(std::memory_order_acquire); block; block = block->nextAll) {
    uint32_t closed = kClosed;
    block->state.compare_exchange_strong(closed, kIdle, std::memory_order_release);
  }
  gState.store(kRecording, std::memory_order_release);
}

// In a forked child: a file of its own, the parent's buffers dropped, only this thread left.
void startChild(uint32_t parentPid) {
  if (gState.load() != kRecording) return;
  tlsInside = true;
  Block* mine = tlsBlock;
  Block* other = gAllBlocks.load();
  while (other) {
    Block* nextBlock = other->nextAll;
    if (other != mine) munmap(other, sizeof(Block));
    other = nextBlock;
  }
  if (mine) mine->nextAll = nullptr;
  gAllBlocks.store(mine);
  gPool.store(nullptr);
  gPoolLock.store(false);
  gDropped.store(0);
  close(gFd);
  if (!openTraceFile(true) || !startFile(parentPid)) {
    gState.store(kOff);
    tlsInside = false;
    return;
  }
  if (mine) {
    uint32_t tid = osThreadId();
    resetBlock(mine, newThreadIndex(tid));
    record(mine, makeEvent(Kind::kThreadStart, 0, ticks(), nullptr, tid));
  }
  tlsInside = false;
}

__attribute__((destructor)) void atProgramExit() {
  finishTrace(true);
}

// Runs an exec function with the trace completed first (an exec'd process never returns to
// write it); if it returns, it failed, and recording goes on.
template <typename Exec>
int execWithTrace(Exec exec) {
  ensureResolved();
  int savedErrno = errno;
  bool finished = finishTrace(false);
  errno = savedErrno;
  int rc = exec();
  if (finished) {
    savedErrno = errno;
    resumeAfterFailedExec();
    errno = savedErrno;
  }
  return rc;
}

// execl and friends: their arguments as an argv array on the stack (4096 at most), then the
// environment for execle, handed to the argv form.
constexpr int kMaxExecArguments = 4096;
template <typename Exec>
int execList(const char* first, va_list arguments, bool withEnvironment, Exec exec) {
  const char* argv[kMaxExecArguments];
  int n = 0;
  argv[n++] = first;
  while (argv[n - 1] != nullptr) {
    if (n == kMaxExecArguments) {
      errno = E2BIG;
      return -1;
    }
    argv[n++] = va_arg(arguments, const char*);
  }
  char* const* envp = withEnvironment ? va_arg(arguments, char* const*) : nullptr;
  return exec(const_cast<char* const*>(argv), envp);
}

#define CALLER __builtin_return_address(0)

template <typename Allocate>
void* recordAllocation(Kind kind, uint8_t flags, const void* caller, uint64_t a, uint64_t b,
                       uint64_t c, Allocate allocate) {
  Block* block = enter();
  void* result = allocate();
  if (block) {
    uint64_t fields[3] = {a, b, c};
    // The fields before the result, as the kind lists them; the result goes in its slot.
    RawEvent event = makeEvent(kind, flags, ticks(), caller);
    const KindInfo& info = kKinds[static_cast<uint8_t>(kind)];
    int next = 0;
    for (int i = 0; i < 6 && info.fields[i] != Field::kNone; ++i) {
      event.fields[i] =
          info.fields[i] == Field::kResult ? reinterpret_cast<uintptr_t>(result) : fields[next++];
    }
    record(block, event);
  }
  return result;
}

void recordRelease(Kind kind, uint8_t flags, const void* caller, void* pointer, uint64_t size,
                   uint64_t align) {
  Block* block = enter();
  if (block)
    record(block, makeEvent(kind, flags, ticks(), caller, reinterpret_cast<uintptr_t>(pointer),
                            size, align));
}

[[noreturn]] void throwBadAlloc() {
  using Thrower = void (*)();
  auto thrower = reinterpret_cast<Thrower>(dlsym(RTLD_DEFAULT, "_ZSt17__throw_bad_allocv"));
  if (thrower) thrower();
  writeStderr("meshalloc-trace: operator new: out of memory and std::bad_alloc unavailable\n");
  abort();
}

// Our own instance: std::nothrow lives in libstdc++, which the recorder does not link.
const std::nothrow_t kNothrow{};

// The next operator new, asked in its nothrow form (so that no exception passes through the
// recorder while tlsInside is set); without one, the C functions underneath.
void* nextNewNothrow(int array, size_t size, size_t align, bool aligned) {
  const Next& n = gNext;
  if (aligned) {
    if (n.newAlignedNothrow[array])
      return n.newAlignedNothrow[array](size, std::align_val_t(align), kNothrow);
    void* block = nullptr;
    return n.posixMemalign(&block, align < sizeof(void*) ? sizeof(void*) : align,
                           size ? size : 1) == 0
               ? block
               : nullptr;
  }
  if (n.newNothrow[array]) return n.newNothrow[array](size, kNothrow);
  return n.malloc(size ? size : 1);
}

// After the nothrow form failed: the throwing form runs the new-handler loop and throws
// std::bad_alloc. (If a handler makes it succeed, a glibc-backed new's inner malloc is
// recorded too; docs/trace.md.)
void* nextNewThrowing(int array, size_t size, size_t align, bool aligned) {
  const Next& n = gNext;
  if (aligned && n.newAligned[array]) return n.newAligned[array](size, std::align_val_t(align));
  if (!aligned && n.newPlain[array]) return n.newPlain[array](size);
  void* result = nextNewNothrow(array, size, align, aligned);
  if (!result) throwBadAlloc();
  return result;
}

void* newCommon(int array, size_t size, size_t align, bool aligned, bool nothrow,
                const void* caller) {
  ensureResolved();
  // Called from inside the next definition (libstdc++'s nothrow new calls the throwing one):
  // forward the very form that was called.
  if (tlsInside)
    return nothrow ? nextNewNothrow(array, size, align, aligned)
                   : nextNewThrowing(array, size, align, aligned);
  Block* block = enter();
  tlsInside = true;
  void* result = nextNewNothrow(array, size, align, aligned);
  tlsInside = false;
  if (!result && !nothrow) result = nextNewThrowing(array, size, align, aligned);
  if (block) {
    uint8_t flags =
        static_cast<uint8_t>((nothrow ? kFlagNothrow : 0) | (aligned ? kFlagAligned : 0));
    record(block, makeEvent(array ? Kind::kNewArray : Kind::kNew, flags, ticks(), caller, size,
                            align, reinterpret_cast<uintptr_t>(result)));
  }
  return result;
}

void deleteCommon(int array, void* pointer, size_t size, bool sized, size_t align, bool aligned,
                  const void* caller) {
  if (isBootstrap(pointer)) return;
  ensureResolved();
  uint8_t flags = static_cast<uint8_t>((sized ? kFlagSized : 0) | (aligned ? kFlagAligned : 0));
  recordRelease(array ? Kind::kDeleteArray : Kind::kDelete, flags, caller, pointer, size, align);
  const Next& n = gNext;
  bool outer = !tlsInside;
  tlsInside = true;
  if (aligned && sized && n.deleteSizedAligned[array]) {
    n.deleteSizedAligned[array](pointer, size, std::align_val_t(align));
  } else if (aligned && n.deleteAligned[array]) {
    n.deleteAligned[array](pointer, std::align_val_t(align));
  } else if (!aligned && sized && n.deleteSized[array]) {
    n.deleteSized[array](pointer, size);
  } else if (!aligned && n.deletePlain[array]) {
    n.deletePlain[array](pointer);
  } else {
    n.free(pointer);
  }
  if (outer) tlsInside = false;
}

}  // namespace

// ------------------------------------------------------------------------ the C entry points

extern "C" {

TRACE_EXPORT void* malloc(size_t size) {
  if (tlsResolving) return bootstrapAllocate(size);
  ensureResolved();
  return recordAllocation(Kind::kMalloc, 0, CALLER, size, 0, 0, [&] { return gNext.malloc(size); });
}

TRACE_EXPORT void* calloc(size_t count, size_t size) {
  if (tlsResolving) {
    size_t total;
    return __builtin_mul_overflow(count, size, &total) ? nullptr : bootstrapAllocate(total);
  }
  ensureResolved();
  return recordAllocation(Kind::kCalloc, 0, CALLER, count, size, 0,
                          [&] { return gNext.calloc(count, size); });
}

TRACE_EXPORT void free(void* pointer) {
  if (isBootstrap(pointer)) return;
  if (tlsResolving) return;  // nothing but bootstrap blocks can be freed before resolution
  ensureResolved();
  recordRelease(Kind::kFree, 0, CALLER, pointer, 0, 0);
  gNext.free(pointer);
}

// A bootstrap block is moved into a real one (recorded as a malloc: its old address was never
// recorded as allocated).
static void* moveOutOfBootstrap(void* pointer, size_t size) {
  void* moved = malloc(size);
  if (moved) {
    size_t old = bootstrapSize(pointer);
    memcpy(moved, pointer, old < size ? old : size);
  }
  return moved;
}

TRACE_EXPORT void* realloc(void* pointer, size_t size) {
  if (tlsResolving) {
    void* fresh = bootstrapAllocate(size);
    if (fresh && pointer)
      memcpy(fresh, pointer, bootstrapSize(pointer) < size ? bootstrapSize(pointer) : size);
    return fresh;
  }
  if (isBootstrap(pointer)) return moveOutOfBootstrap(pointer, size);
  ensureResolved();
  Block* block = enter();
  uint64_t start = block ? ticks() : 0;
  void* result = gNext.realloc(pointer, size);
  if (block) {
    record(block, makeEvent(Kind::kRealloc, 0, start, CALLER, reinterpret_cast<uintptr_t>(pointer),
                            size, reinterpret_cast<uintptr_t>(result), ticks() - start));
  }
  return result;
}

// Implemented on the realloc underneath: glibc's reallocarray calls realloc through its dynamic
// symbol, which would record the call twice.
TRACE_EXPORT void* reallocarray(void* pointer, size_t count, size_t size) {
  size_t total;
  bool overflow = __builtin_mul_overflow(count, size, &total);
  if (isBootstrap(pointer) && !tlsResolving) {
    if (overflow) {
      errno = ENOMEM;
      return nullptr;
    }
    return moveOutOfBootstrap(pointer, total);
  }
  ensureResolved();
  Block* block = enter();
  uint64_t start = block ? ticks() : 0;
  void* result = nullptr;
  if (overflow) {
    errno = ENOMEM;
  } else {
    result = gNext.realloc(pointer, total);
  }
  if (block) {
    record(block,
           makeEvent(Kind::kReallocArray, 0, start, CALLER, reinterpret_cast<uintptr_t>(pointer),
                     count, size, reinterpret_cast<uintptr_t>(result), ticks() - start));
  }
  return result;
}

TRACE_EXPORT void* memalign(size_t align, size_t size) {
  ensureResolved();
  return recordAllocation(Kind::kMemalign, 0, CALLER, align, size, 0,
                          [&] { return gNext.memalign(align, size); });
}

TRACE_EXPORT void* aligned_alloc(size_t align, size_t size) {
  ensureResolved();
  return recordAllocation(Kind::kAlignedAlloc, 0, CALLER, align, size, 0,
                          [&] { return gNext.alignedAlloc(align, size); });
}

TRACE_EXPORT void* valloc(size_t size) {
  ensureResolved();
  return recordAllocation(Kind::kValloc, 0, CALLER, size, 0, 0, [&] { return gNext.valloc(size); });
}

TRACE_EXPORT void* pvalloc(size_t size) {
  ensureResolved();
  return recordAllocation(Kind::kPvalloc, 0, CALLER, size, 0, 0,
                          [&] { return gNext.pvalloc(size); });
}

TRACE_EXPORT int posix_memalign(void** out, size_t align, size_t size) {
  ensureResolved();
  Block* block = enter();
  int rc = gNext.posixMemalign(out, align, size);
  if (block) {
    uint64_t result = rc == 0 ? reinterpret_cast<uintptr_t>(*out) : 0;
    record(block, makeEvent(Kind::kPosixMemalign, 0, ticks(), CALLER, align, size, result,
                            static_cast<uint64_t>(rc)));
  }
  return rc;
}

TRACE_EXPORT size_t malloc_usable_size(void* pointer) {
  if (isBootstrap(pointer)) return bootstrapSize(pointer);
  ensureResolved();
  Block* block = enter();
  size_t result = gNext.usableSize(pointer);
  if (block) {
    record(block, makeEvent(Kind::kUsableSize, 0, ticks(), CALLER,
                            reinterpret_cast<uintptr_t>(pointer), result));
  }
  return result;
}

// _exit skips the library destructor; many programs leave that way (dash's `exit`, forked
// children). Write the buffers and the footer first.
using ExitFn = void (*)(int);
TRACE_EXPORT __attribute__((noreturn)) void _exit(int status) {
  finishTrace(true);
  auto next = reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit"));
  if (next) next(status);
  syscall(SYS_exit_group, status);
  __builtin_unreachable();
}

TRACE_EXPORT __attribute__((noreturn)) void _Exit(int status) {
  _exit(status);
}

TRACE_EXPORT int execve(const char* path, char* const argv[], char* const envp[]) {
  return execWithTrace([&] { return gNext.execve(path, argv, envp); });
}

TRACE_EXPORT int execv(const char* path, char* const argv[]) {
  return execWithTrace([&] { return gNext.execv(path, argv); });
}

TRACE_EXPORT int execvp(const char* file, char* const argv[]) {
  return execWithTrace([&] { return gNext.execvp(file, argv); });
}

TRACE_EXPORT int execvpe(const char* file, char* const argv[], char* const envp[]) {
  return execWithTrace([&] { return gNext.execvpe(file, argv, envp); });
}

TRACE_EXPORT int fexecve(int fd, char* const argv[], char* const envp[]) {
  return execWithTrace([&] { return gNext.fexecve(fd, argv, envp); });
}

TRACE_EXPORT int execl(const char* path, const char* first, ...) {
  va_list arguments;
  va_start(arguments, first);
  int rc = execList(first, arguments, false,
                    [&](char* const* argv, char* const*) { return execv(path, argv); });
  va_end(arguments);
  return rc;
}

TRACE_EXPORT int execlp(const char* file, const char* first, ...) {
  va_list arguments;
  va_start(arguments, first);
  int rc = execList(first, arguments, false,
                    [&](char* const* argv, char* const*) { return execvp(file, argv); });
  va_end(arguments);
  return rc;
}

TRACE_EXPORT int execle(const char* path, const char* first, ...) {
  va_list arguments;
  va_start(arguments, first);
  int rc = execList(first, arguments, true,
                    [&](char* const* argv, char* const* envp) { return execve(path, argv, envp); });
  va_end(arguments);
  return rc;
}

TRACE_EXPORT pid_t fork() {
  ensureResolved();
  Block* block = enter();
  uint32_t parent = static_cast<uint32_t>(getpid());
  pid_t child = gNext.fork();
  if (child == 0) {
    startChild(parent);
  } else if (child > 0 && block) {
    record(block, makeEvent(Kind::kFork, 0, ticks(), CALLER, static_cast<uint64_t>(child)));
  }
  return child;
}

}  // extern "C"

// ------------------------------------------------------------------------ C++ operators

#define NEW_FORMS(array, suffix)                                                        \
  TRACE_EXPORT void* operator new suffix(size_t size) {                                 \
    return newCommon(array, size, 0, false, false, CALLER);                             \
  }                                                                                     \
  TRACE_EXPORT void* operator new suffix(size_t size, const std::nothrow_t&) noexcept { \
    return newCommon(array, size, 0, false, true, CALLER);                              \
  }                                                                                     \
  TRACE_EXPORT void* operator new suffix(size_t size, std::align_val_t align) {         \
    return newCommon(array, size, static_cast<size_t>(align), true, false, CALLER);     \
  }                                                                                     \
  TRACE_EXPORT void* operator new suffix(size_t size, std::align_val_t align,           \
                                         const std::nothrow_t&) noexcept {              \
    return newCommon(array, size, static_cast<size_t>(align), true, true, CALLER);      \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p) noexcept {                          \
    deleteCommon(array, p, 0, false, 0, false, CALLER);                                 \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p, const std::nothrow_t&) noexcept {   \
    deleteCommon(array, p, 0, false, 0, false, CALLER);                                 \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p, size_t size) noexcept {             \
    deleteCommon(array, p, size, true, 0, false, CALLER);                               \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p, std::align_val_t align) noexcept {  \
    deleteCommon(array, p, 0, false, static_cast<size_t>(align), true, CALLER);         \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p, std::align_val_t align,             \
                                           const std::nothrow_t&) noexcept {            \
    deleteCommon(array, p, 0, false, static_cast<size_t>(align), true, CALLER);         \
  }                                                                                     \
  TRACE_EXPORT void operator delete suffix(void* p, size_t size,                        \
                                           std::align_val_t align) noexcept {           \
    deleteCommon(array, p, size, true, static_cast<size_t>(align), true, CALLER);       \
  }

NEW_FORMS(0, )
NEW_FORMS(1, [])
