#include "platform/os.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/auxv.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <fcntl.h>
#include <linux/falloc.h>

extern "C" int __sigaction(int signal, const struct sigaction* action, struct sigaction* previous);
#include <string.h>

#include <atomic>

namespace meshalloc::os {
namespace {

constexpr size_t kFallbackPageSize = 4096;
constexpr long kDefaultMaxMapCount = 65530;

size_t gPageSize = 0;
size_t gPageShift = 0;

void computePageSize() {
  long size = sysconf(_SC_PAGESIZE);
  gPageSize = size > 0 ? static_cast<size_t>(size) : kFallbackPageSize;
  gPageShift = static_cast<size_t>(__builtin_ctzl(gPageSize));
}

// Fault injection (os.h). Armed only by tests; gFaultsArmed is the one load a wrapper pays
// when nothing is armed.
constinit std::atomic<bool> gFaultsArmed{false};
struct FaultState {
  std::atomic<uint8_t> mode{0};
  std::atomic<uint32_t> perMillion{0};
  std::atomic<uint64_t> n{0};
  std::atomic<uint64_t> calls{0};
  std::atomic<uint64_t> injected{0};
};
constexpr size_t kFaultPoints = static_cast<size_t>(FaultPoint::kCount);
constinit FaultState gFaults[kFaultPoints];
constinit std::atomic<uint64_t> gFaultRandom{0x853c49e6748fea9bull};
constexpr uint64_t kMillion = 1000000;

constexpr const char* kFaultPointNames[kFaultPoints] = {
    "reserve", "metadata", "unmap", "decommit", "remap",  "protect", "unprotect",
    "memfd",   "resize",   "punch", "write",    "thread", "copy"};
constexpr int kFaultErrnos[kFaultPoints] = {ENOMEM, ENOMEM, ENOMEM, ENOMEM, ENOMEM, ENOMEM, ENOMEM,
                                            EMFILE, ENOSPC, ENOMEM, ENOSPC, EAGAIN, ENOMEM};

uint64_t nextFaultRandom() {
  // splitmix64 over a shared counter: the same seed gives the same sequence of draws.
  uint64_t z = gFaultRandom.fetch_add(0x9e3779b97f4a7c15ull, std::memory_order_relaxed) +
               0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

[[gnu::noinline]] bool faultFires(FaultPoint point) {
  FaultState& state = gFaults[static_cast<size_t>(point)];
  uint64_t call = state.calls.fetch_add(1, std::memory_order_relaxed) + 1;
  uint64_t n = state.n.load(std::memory_order_relaxed);
  bool fire = false;
  switch (static_cast<FaultMode>(state.mode.load(std::memory_order_relaxed))) {
    case FaultMode::kOff:
      break;
    case FaultMode::kNth:
      fire = call == n;
      break;
    case FaultMode::kEvery:
      fire = n != 0 && call % n == 0;
      break;
    case FaultMode::kProbability:
      fire = nextFaultRandom() % kMillion < state.perMillion.load(std::memory_order_relaxed);
      break;
  }
  if (!fire) return false;
  state.injected.fetch_add(1, std::memory_order_relaxed);
  errno = kFaultErrnos[static_cast<size_t>(point)];
  return true;
}

// True (errno set) if this call of `point` is to fail without reaching the kernel.
inline bool injected(FaultPoint point) {
  if (__builtin_expect(!gFaultsArmed.load(std::memory_order_relaxed), 1)) return false;
  return faultFires(point);
}

void configureFaultsFromEnvironment() {
  // A test switch, honoured in every build, but never in a set-user-ID or otherwise privileged
  // program (glibc's secure mode): there it would let a user steer a privileged process into
  // its error paths.
  if (getauxval(AT_SECURE)) return;
  const char* spec = getenv("MESHALLOC_FAULTS");
  if (!spec || !*spec) return;
  if (!configureFaults(spec)) {
    static const char kMessage[] = "meshalloc: MESHALLOC_FAULTS: cannot parse; no fault armed\n";
    writeStderr(kMessage, sizeof(kMessage) - 1);
  }
}

}  // namespace

void initPlatform() {
  if (gPageSize == 0) computePageSize();
  static bool faultsRead = false;
  if (!faultsRead) {
    faultsRead = true;
    configureFaultsFromEnvironment();
  }
}

const char* faultPointName(FaultPoint point) {
  size_t index = static_cast<size_t>(point);
  return index < kFaultPoints ? kFaultPointNames[index] : "?";
}

int faultErrno(FaultPoint point) {
  size_t index = static_cast<size_t>(point);
  return index < kFaultPoints ? kFaultErrnos[index] : ENOMEM;
}

void setFault(FaultPoint point, FaultRule rule) {
  FaultState& state = gFaults[static_cast<size_t>(point)];
  state.mode.store(static_cast<uint8_t>(FaultMode::kOff), std::memory_order_relaxed);
  state.n.store(rule.n, std::memory_order_relaxed);
  state.perMillion.store(rule.perMillion, std::memory_order_relaxed);
  state.calls.store(0, std::memory_order_relaxed);
  state.injected.store(0, std::memory_order_relaxed);
  state.mode.store(static_cast<uint8_t>(rule.mode), std::memory_order_release);
  bool armed = false;
  for (const FaultState& each : gFaults)
    armed |= each.mode.load(std::memory_order_relaxed) != static_cast<uint8_t>(FaultMode::kOff);
  gFaultsArmed.store(armed, std::memory_order_release);
}

void clearFaults() {
  gFaultsArmed.store(false, std::memory_order_release);
  for (FaultState& each : gFaults)
    each.mode.store(static_cast<uint8_t>(FaultMode::kOff), std::memory_order_relaxed);
}

void seedFaults(uint64_t seed) {
  gFaultRandom.store(seed, std::memory_order_relaxed);
}

uint64_t faultCalls(FaultPoint point) {
  return gFaults[static_cast<size_t>(point)].calls.load(std::memory_order_relaxed);
}

uint64_t faultsInjected(FaultPoint point) {
  return gFaults[static_cast<size_t>(point)].injected.load(std::memory_order_relaxed);
}

namespace {
bool parseUnsigned(const char*& cursor, uint64_t* value) {
  if (*cursor < '0' || *cursor > '9') return false;
  uint64_t result = 0;
  for (; *cursor >= '0' && *cursor <= '9'; cursor++) {
    uint64_t digit = static_cast<uint64_t>(*cursor - '0');
    if (result > (UINT64_MAX - digit) / 10) return false;
    result = result * 10 + digit;
  }
  *value = result;
  return true;
}

// "0.25", "1", ".5" -> parts per million (at most a million).
bool parseProbability(const char*& cursor, uint32_t* perMillion) {
  uint64_t whole = 0;
  if (*cursor >= '0' && *cursor <= '9' && !parseUnsigned(cursor, &whole)) return false;
  uint64_t fraction = 0;
  uint64_t scale = kMillion;
  if (*cursor == '.') {
    cursor++;
    if (*cursor < '0' || *cursor > '9') return false;
    for (; *cursor >= '0' && *cursor <= '9'; cursor++) {
      scale /= 10;
      fraction += static_cast<uint64_t>(*cursor - '0') * scale;
    }
  }
  if (whole > 1 || (whole == 1 && fraction > 0)) return false;
  *perMillion = static_cast<uint32_t>(whole * kMillion + fraction);
  return true;
}

bool matchWord(const char*& cursor, const char* word) {
  size_t length = strlen(word);
  if (strncmp(cursor, word, length) != 0) return false;
  cursor += length;
  return true;
}
}  // namespace

bool configureFaults(const char* spec) {
  FaultRule rules[kFaultPoints] = {};
  bool given[kFaultPoints] = {};
  uint64_t seed = 0;
  bool seeded = false;
  const char* cursor = spec;
  while (*cursor) {
    if (matchWord(cursor, "seed=")) {
      if (!parseUnsigned(cursor, &seed)) return false;
      seeded = true;
    } else {
      // point:mode=value
      size_t first = 0, last = 0;
      if (matchWord(cursor, "all:")) {
        last = kFaultPoints;
      } else {
        size_t index = 0;
        for (; index < kFaultPoints; index++) {
          size_t length = strlen(kFaultPointNames[index]);
          if (strncmp(cursor, kFaultPointNames[index], length) == 0 && cursor[length] == ':') break;
        }
        if (index == kFaultPoints) return false;
        cursor += strlen(kFaultPointNames[index]) + 1;
        first = index;
        last = index + 1;
      }
      FaultRule rule;
      if (matchWord(cursor, "nth=")) {
        rule.mode = FaultMode::kNth;
        if (!parseUnsigned(cursor, &rule.n) || rule.n == 0) return false;
      } else if (matchWord(cursor, "every=")) {
        rule.mode = FaultMode::kEvery;
        if (!parseUnsigned(cursor, &rule.n) || rule.n == 0) return false;
      } else if (matchWord(cursor, "p=")) {
        rule.mode = FaultMode::kProbability;
        if (!parseProbability(cursor, &rule.perMillion)) return false;
      } else {
        return false;
      }
      for (size_t i = first; i < last; i++) {
        rules[i] = rule;
        given[i] = true;
      }
    }
    if (*cursor == ',') {
      if (!*++cursor) return false;
    } else if (*cursor) {
      return false;
    }
  }
  if (seeded) seedFaults(seed);
  for (size_t i = 0; i < kFaultPoints; i++) {
    if (given[i]) setFault(static_cast<FaultPoint>(i), rules[i]);
  }
  return true;
}

size_t pageSize() {
  if (__builtin_expect(gPageSize == 0, 0)) computePageSize();
  return gPageSize;
}

size_t pageShift() {
  if (__builtin_expect(gPageSize == 0, 0)) computePageSize();
  return gPageShift;
}

void* reserveAligned(size_t bytes, size_t alignment) {
  // Over-reserve and trim so that the result is aligned without relying on mmap hints.
  size_t padded = bytes + alignment;
  if (padded < bytes) return nullptr;
  if (injected(FaultPoint::kReserve)) return nullptr;
  void* raw = mmap(nullptr, padded, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(raw);
  uintptr_t aligned = (start + alignment - 1) & ~(alignment - 1);
  if (aligned > start) munmap(raw, aligned - start);
  uintptr_t end = aligned + bytes;
  uintptr_t rawEnd = start + padded;
  if (rawEnd > end) munmap(reinterpret_cast<void*>(end), rawEnd - end);
  return reinterpret_cast<void*>(aligned);
}

void unmap(void* addr, size_t bytes) {
  if (injected(FaultPoint::kUnmap)) return;  // as munmap refused: the range stays mapped
  munmap(addr, bytes);
}

void decommit(void* addr, size_t bytes) {
  // MADV_DONTNEED drops the pages at once (unlike MADV_FREE), so PSS and the cgroup charge
  // fall immediately, which is what users measuring us will see.
  if (!injected(FaultPoint::kDecommit) && madvise(addr, bytes, MADV_DONTNEED) == 0) return;
  // The range must read as zeros all the same: the arena hands it out again as fresh pages
  // (calloc skips its memset for them). Fresh pages mapped over it drop the old ones too;
  // failing that, the pages stay and are cleared.
  if (mapAnonymousFixed(addr, bytes)) return;
  memset(addr, 0, bytes);
}

bool dropPages(void* addr, size_t bytes) {
  return !injected(FaultPoint::kDecommit) && madvise(addr, bytes, MADV_DONTNEED) == 0;
}

void* mapMetadata(size_t bytes) {
  if (injected(FaultPoint::kMetadata)) return nullptr;
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int createSharedFile(const char* name) {
  if (injected(FaultPoint::kMemfd)) return -1;
  return static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC));
}

bool resizeFile(int fd, size_t bytes) {
  if (injected(FaultPoint::kResize)) return false;
  return ftruncate(fd, static_cast<off_t>(bytes)) == 0;
}

bool punchHole(int fd, size_t offset, size_t bytes) {
  if (injected(FaultPoint::kPunchHole)) return false;
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                   static_cast<off_t>(bytes)) == 0;
}

bool writeToFile(int fd, size_t offset, const void* source, size_t bytes) {
  if (injected(FaultPoint::kWrite)) return false;
  const char* cursor = static_cast<const char*>(source);
  while (bytes > 0) {
    ssize_t n = pwrite(fd, cursor, bytes, static_cast<off_t>(offset));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    cursor += n;
    offset += static_cast<size_t>(n);
    bytes -= static_cast<size_t>(n);
  }
  return true;
}

bool mapFileFixed(void* addr, size_t bytes, int fd, size_t offset, bool writable) {
  // No MAP_POPULATE: on a shared memory file it would allocate a page for every hole.
  if (injected(FaultPoint::kRemap)) return false;
  void* p = mmap(addr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_FIXED,
                 fd, static_cast<off_t>(offset));
  return p == addr;
}

bool mapAnonymousFixed(void* addr, size_t bytes) {
  if (injected(FaultPoint::kRemap)) return false;
  void* p = mmap(addr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == addr;
}

bool protectReadOnly(void* addr, size_t bytes) {
  if (injected(FaultPoint::kProtect)) return false;
  return mprotect(addr, bytes, PROT_READ) == 0;
}
bool protectReadWrite(void* addr, size_t bytes) {
  if (injected(FaultPoint::kUnprotect)) return false;
  return mprotect(addr, bytes, PROT_READ | PROT_WRITE) == 0;
}

bool replaceWithWritableCopy(void* addr, size_t bytes) {
  if (injected(FaultPoint::kCopy)) return false;
  void* copy = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (copy == MAP_FAILED) return false;
  memcpy(copy, addr, bytes);
  if (mremap(copy, bytes, bytes, MREMAP_MAYMOVE | MREMAP_FIXED, addr) != addr) {
    munmap(copy, bytes);
    return false;
  }
  return true;
}

void closeFd(int fd) {
  close(fd);
}

int createFile(const char* path, FileCreation how) {
  if (how == FileCreation::kExclusivePrivate)
    return open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  return open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
}

bool renameFile(const char* from, const char* to) {
  return rename(from, to) == 0;
}

void removeFile(const char* path) {
  unlink(path);
}

int duplicateFd(int fd, int lowest) {
  return fcntl(fd, F_DUPFD_CLOEXEC, lowest);
}

long processId() {
  return getpid();
}

uint64_t realtimeMillis() {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000 + static_cast<uint64_t>(now.tv_nsec) / 1000000;
}

long countMappings() {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  char buffer[4096];
  long lines = 0;
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; i++) lines += buffer[i] == '\n';
  }
  close(fd);
  return lines;
}

long long readProcKibField(const char* path, const char* field) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  size_t fieldLength = strlen(field);
  // Lines are short ("Pss:   123456 kB"); one longer than the buffer cannot be a match and is
  // skipped piece by piece.
  char line[256];
  size_t used = 0;
  long long result = -1;
  bool atLineStart = true;
  for (;;) {
    ssize_t n = read(fd, line + used, sizeof(line) - 1 - used);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    used += static_cast<size_t>(n);
    char* newline;
    while ((newline = static_cast<char*>(memchr(line, '\n', used))) != nullptr) {
      size_t length = static_cast<size_t>(newline - line);
      if (atLineStart && length >= fieldLength && memcmp(line, field, fieldLength) == 0) {
        long long value = 0;
        size_t i = fieldLength;
        while (i < length && (line[i] == ' ' || line[i] == '\t')) i++;
        while (i < length && line[i] >= '0' && line[i] <= '9')
          value = value * 10 + (line[i++] - '0');
        result = value * 1024;
      }
      atLineStart = true;
      used -= length + 1;
      memmove(line, newline + 1, used);
    }
    if (used == sizeof(line) - 1) {
      used = 0;
      atLineStart = false;
    }
    if (result >= 0) break;
  }
  close(fd);
  return result;
}

size_t residentBytes(const void* addr, size_t bytes) {
  constexpr size_t kChunkPages = 512;
  unsigned char vector[kChunkPages];
  size_t page = pageSize();
  size_t pages = (bytes + page - 1) / page;
  uintptr_t start = reinterpret_cast<uintptr_t>(addr);
  size_t resident = 0;
  for (size_t done = 0; done < pages;) {
    size_t count = pages - done < kChunkPages ? pages - done : kChunkPages;
    if (mincore(reinterpret_cast<void*>(start + done * page), count * page, vector) != 0) return 0;
    for (size_t i = 0; i < count; i++) resident += vector[i] & 1;
    done += count;
  }
  return resident * page;
}

bool makePipe(int fds[2]) {
  // The raw call: pipe2 is one of the wrapped functions (api/io_exports.cc).
  return syscall(SYS_pipe2, fds, O_CLOEXEC) == 0;
}

void signalByte(int fd) {
  char byte = 1;
  while (write(fd, &byte, 1) < 0 && errno == EINTR) {
  }
}

bool awaitByte(int fd) {
  char byte;
  for (;;) {
    ssize_t n = read(fd, &byte, 1);
    if (n < 0 && errno == EINTR) continue;
    return n == 1;
  }
}

bool registerMembarrier() {
  long supported = syscall(SYS_membarrier, MEMBARRIER_CMD_QUERY, 0, 0);
  if (supported < 0 || !(supported & MEMBARRIER_CMD_PRIVATE_EXPEDITED)) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_REGISTER_PRIVATE_EXPEDITED, 0, 0) == 0;
}

namespace {
std::atomic<bool> gMembarrierFailsForTesting{false};
std::atomic<char*> gShootdownPage{nullptr};
}  // namespace

bool membarrierAllThreads() {
  if (gMembarrierFailsForTesting.load(std::memory_order_relaxed)) return false;
  return syscall(SYS_membarrier, MEMBARRIER_CMD_PRIVATE_EXPEDITED, 0, 0) == 0;
}

void failMembarrierForTesting() {
  gMembarrierFailsForTesting.store(true, std::memory_order_relaxed);
}

bool interruptRunningThreads() {
#if defined(__x86_64__)
  char* page = gShootdownPage.load(std::memory_order_acquire);
  if (!page) {
    char* fresh = static_cast<char*>(mapMetadata(pageSize()));
    if (!fresh) return false;
    page = nullptr;
    if (gShootdownPage.compare_exchange_strong(page, fresh)) {
      page = fresh;
    } else {
      unmap(fresh, pageSize());  // another thread's page won; `page` holds it
    }
  }
  // Dirty and present in this CPU's TLB, so the downgrade cannot skip the flush.
  __atomic_fetch_add(page, 1, __ATOMIC_SEQ_CST);
  return protectReadOnly(page, pageSize()) && protectReadWrite(page, pageSize());
#else
  return false;
#endif
}

uint64_t threadCpuNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

void yieldThread() {
  sched_yield();
}

void sleepNanos(uint64_t nanos) {
  struct timespec ts = {static_cast<time_t>(nanos / 1000000000ull),
                        static_cast<long>(nanos % 1000000000ull)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

int rawSigaction(int signal, const struct sigaction* action, struct sigaction* previous) {
  return __sigaction(signal, action, previous);
}

uint64_t monotonicNanos() {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

uint64_t entropy64() {
  uint64_t value = 0;
  // The raw system call: the library exports a getrandom of its own (api/io_exports.cc), which
  // the dynamic linker would bind this call to, before the heap it consults exists.
  if (syscall(SYS_getrandom, &value, sizeof(value), GRND_NONBLOCK) !=
      static_cast<long>(sizeof(value))) {
    // Early in boot getrandom may not be ready; time and address bits are enough for shuffling.
    value = monotonicNanos() ^ (reinterpret_cast<uintptr_t>(&value) << 16);
  }
  return value;
}

long maxMapCount() {
  int fd = open("/proc/sys/vm/max_map_count", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return kDefaultMaxMapCount;
  char buffer[32];
  ssize_t n = read(fd, buffer, sizeof(buffer) - 1);
  close(fd);
  if (n <= 0) return kDefaultMaxMapCount;
  long value = 0;
  for (ssize_t i = 0; i < n && buffer[i] >= '0' && buffer[i] <= '9'; i++)
    value = value * 10 + (buffer[i] - '0');
  return value > 0 ? value : kDefaultMaxMapCount;
}

int currentThreadId() {
  return static_cast<int>(syscall(SYS_gettid));
}

bool setCurrentThreadNice(int nice) {
  return setpriority(PRIO_PROCESS, static_cast<id_t>(currentThreadId()), nice) == 0;
}

bool startDetachedThread(void* (*main)(void*)) {
  if (injected(FaultPoint::kThread)) return false;
  sigset_t all, saved;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &saved);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t thread;
  bool started = pthread_create(&thread, &attr, main, nullptr) == 0;
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &saved, nullptr);
  return started;
}

void futexWait(const void* addr, uint32_t expected) {
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, nullptr, nullptr, 0);
}

void futexWakeAll(const void* addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, INT32_MAX, nullptr, nullptr, 0);
}

void futexWaitFor(const void* addr, uint32_t expected, uint64_t timeoutNanos) {
  struct timespec ts = {static_cast<time_t>(timeoutNanos / 1000000000ull),
                        static_cast<long>(timeoutNanos % 1000000000ull)};
  syscall(SYS_futex, addr, FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futexWakeOne(const void* addr) {
  syscall(SYS_futex, addr, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

void writeFd(int fd, const char* text, size_t length) {
  while (length > 0) {
    ssize_t n = write(fd, text, length);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;
    text += n;
    length -= static_cast<size_t>(n);
  }
}

void writeStderr(const char* text, size_t length) {
  writeFd(STDERR_FILENO, text, length);
}

void abortProcess() {
  // abort() raises SIGABRT, so the default action (a core dump) and any handler still apply.
  abort();
}

const char* getEnv(const char* name) {
  return getenv(name);
}

}  // namespace meshalloc::os

namespace meshalloc::os {

namespace {
uintptr_t parseHex(const char*& cursor) {
  uintptr_t value = 0;
  for (;; cursor++) {
    char c = *cursor;
    if (c >= '0' && c <= '9')
      value = value * 16 + static_cast<uintptr_t>(c - '0');
    else if (c >= 'a' && c <= 'f')
      value = value * 16 + static_cast<uintptr_t>(c - 'a' + 10);
    else
      return value;
  }
}
}  // namespace

bool isInBrkHeap(uintptr_t address) {
  int fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  constexpr size_t kLineCapacity = 512;
  char line[kLineCapacity];
  size_t used = 0;
  bool found = false;
  for (;;) {
    ssize_t n = read(fd, line + used, sizeof(line) - 1 - used);
    if (n <= 0) break;
    used += static_cast<size_t>(n);
    line[used] = '\0';
    char* newline;
    while ((newline = static_cast<char*>(memchr(line, '\n', used))) != nullptr) {
      *newline = '\0';
      size_t length = static_cast<size_t>(newline - line);
      if (length >= 6 && memcmp(newline - 6, "[heap]", 6) == 0) {
        const char* cursor = line;
        uintptr_t start = parseHex(cursor);
        cursor++;  // '-'
        uintptr_t end = parseHex(cursor);
        found = address >= start && address < end;
      }
      used -= length + 1;
      memmove(line, newline + 1, used);
    }
    if (used == sizeof(line) - 1) used = 0;  // a line longer than the buffer cannot be [heap]
  }
  close(fd);
  return found;
}

}  // namespace meshalloc::os
