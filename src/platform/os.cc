#include "platform/os.h"

#include <errno.h>
#include <linux/futex.h>
#include <linux/membarrier.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
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

}  // namespace

void initPlatform() {
  if (gPageSize == 0) computePageSize();
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
  munmap(addr, bytes);
}

void decommit(void* addr, size_t bytes) {
  // MADV_DONTNEED drops the pages at once (unlike MADV_FREE), so PSS and the cgroup charge
  // fall immediately, which is what users measuring us will see.
  madvise(addr, bytes, MADV_DONTNEED);
}

void* mapMetadata(size_t bytes) {
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

int createSharedFile(const char* name) {
  return static_cast<int>(syscall(SYS_memfd_create, name, MFD_CLOEXEC));
}

bool resizeFile(int fd, size_t bytes) {
  return ftruncate(fd, static_cast<off_t>(bytes)) == 0;
}

bool punchHole(int fd, size_t offset, size_t bytes) {
  return fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                   static_cast<off_t>(bytes)) == 0;
}

bool writeToFile(int fd, size_t offset, const void* source, size_t bytes) {
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
  void* p = mmap(addr, bytes, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_FIXED,
                 fd, static_cast<off_t>(offset));
  return p == addr;
}

bool mapAnonymousFixed(void* addr, size_t bytes) {
  void* p = mmap(addr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED | MAP_NORESERVE, -1, 0);
  return p == addr;
}

bool protectReadOnly(void* addr, size_t bytes) {
  return mprotect(addr, bytes, PROT_READ) == 0;
}
bool protectReadWrite(void* addr, size_t bytes) {
  return mprotect(addr, bytes, PROT_READ | PROT_WRITE) == 0;
}

void closeFd(int fd) {
  close(fd);
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
