// Helpers shared by the API tests: glibc's own allocator entry points (the reference the
// tests compare with at run time), compiler barriers, byte patterns and child processes.
#pragma once

#include <dlfcn.h>
#include <malloc.h>
#include <signal.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>

#include <gtest/gtest.h>

#include "meshalloc.h"

// glibc exports its allocator under these names as well, so the test can ask glibc itself how
// an edge case behaves and hold meshalloc to the same answer.
extern "C" {
void* __libc_malloc(size_t size);
void __libc_free(void* ptr);
void* __libc_calloc(size_t nmemb, size_t size);
void* __libc_realloc(void* ptr, size_t size);
void* __libc_memalign(size_t alignment, size_t size);
void* __libc_valloc(size_t size);
void* __libc_pvalloc(size_t size);
int __libc_mallopt(int param, int value);
}

namespace meshtest {

// Entry points without a __libc_ alias, looked up inside libc.so.6 itself (not through the
// global scope, where meshalloc's definitions come first).
struct GlibcReference {
  int (*posix_memalign)(void**, size_t, size_t) = nullptr;
  void* (*aligned_alloc)(size_t, size_t) = nullptr;
  void* (*reallocarray)(void*, size_t, size_t) = nullptr;
  size_t (*malloc_usable_size)(void*) = nullptr;
  int (*malloc_info)(int, FILE*) = nullptr;

  static const GlibcReference& get() {
    static const GlibcReference ref = load();
    return ref;
  }

 private:
  template <typename F>
  static void lookup(void* handle, const char* name, F*& out) {
    out = reinterpret_cast<F*>(dlsym(handle, name));
    if (out == nullptr) {
      fprintf(stderr, "glibc reference: %s not found in libc.so.6\n", name);
      abort();
    }
  }
  static GlibcReference load() {
    void* libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    if (libc == nullptr) {
      fprintf(stderr, "glibc reference: libc.so.6 is not loaded: %s\n", dlerror());
      abort();
    }
    GlibcReference r;
    lookup(libc, "posix_memalign", r.posix_memalign);
    lookup(libc, "aligned_alloc", r.aligned_alloc);
    lookup(libc, "reallocarray", r.reallocarray);
    lookup(libc, "malloc_usable_size", r.malloc_usable_size);
    lookup(libc, "malloc_info", r.malloc_info);
    return r;
  }
};

// Hides a pointer's provenance from the optimiser so that calls it could prove redundant or
// invalid (free of a stack address, new/delete pairs) are really made.
template <typename T>
inline T* launder(T* p) {
  asm volatile("" : "+r"(p) : : "memory");
  return p;
}
inline void escape(const void* p) {
  asm volatile("" : : "r"(p) : "memory");
}

// A byte statistic (e.g. "stats.retained") through meshalloc's control interface, after
// refreshing the snapshot with "epoch".
inline size_t statBytes(const char* name) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  EXPECT_EQ(meshalloc_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch), 0);
  size_t value = 0;
  len = sizeof value;
  EXPECT_EQ(meshalloc_mallctl(name, &value, &len, nullptr, 0), 0) << name;
  return value;
}

// The live-bytes statistic.
inline size_t allocatedBytes() {
  return statBytes("stats.allocated");
}

inline bool isAligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// A byte pattern that depends on the object's address, its size and a tag, so that a byte
// written into the wrong object (or a stale copy) is very unlikely to match. Byte i is byte
// (i % 8) of patternWord(..., i / 8).
inline uint64_t patternWord(const void* base, size_t size, uint64_t tag, size_t word) {
  uint64_t x = reinterpret_cast<uintptr_t>(base) * 0x9E3779B97F4A7C15ull;
  x ^= size * 0xC2B2AE3D27D4EB4Full + tag * 0x165667B19E3779F9ull + word;
  x ^= x >> 31;
  x *= 0xBF58476D1CE4E5B9ull;
  x ^= x >> 29;
  return x;
}

inline uint8_t patternByte(const void* base, size_t size, uint64_t tag, size_t offset) {
  return static_cast<uint8_t>(patternWord(base, size, tag, offset / 8) >> (8 * (offset % 8)));
}

inline void fillPattern(void* p, size_t size, uint64_t tag) {
  auto* bytes = static_cast<uint8_t*>(p);
  size_t words = size / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t x = patternWord(p, size, tag, w);
    memcpy(bytes + 8 * w, &x, 8);
  }
  for (size_t i = 8 * words; i < size; ++i) bytes[i] = patternByte(p, size, tag, i);
}

// Returns the first offset below `limit` whose byte does not match the pattern written for
// (base, size, tag), or SIZE_MAX when all match.
inline size_t firstMismatch(const void* p, const void* base, size_t size, uint64_t tag,
                            size_t limit) {
  const auto* bytes = static_cast<const uint8_t*>(p);
  size_t words = limit / 8;
  for (size_t w = 0; w < words; ++w) {
    uint64_t expected = patternWord(base, size, tag, w);
    if (memcmp(bytes + 8 * w, &expected, 8) != 0) {
      for (size_t i = 8 * w;; ++i) {
        if (bytes[i] != patternByte(base, size, tag, i)) return i;
      }
    }
  }
  for (size_t i = 8 * words; i < limit; ++i) {
    if (bytes[i] != patternByte(base, size, tag, i)) return i;
  }
  return SIZE_MAX;
}

inline std::string hexAddress(const void* p) {
  char buf[32];
  snprintf(buf, sizeof buf, "0x%lx", static_cast<unsigned long>(reinterpret_cast<uintptr_t>(p)));
  return buf;
}

// Raises SIGALRM (which kills the test process) if a scope takes longer than `seconds`, so a
// deadlock fails the test instead of hanging it. Not a timing assertion: the bound is generous.
class DeadlockGuard {
 public:
  explicit DeadlockGuard(unsigned seconds) { alarm(seconds); }
  ~DeadlockGuard() { alarm(0); }
  DeadlockGuard(const DeadlockGuard&) = delete;
  DeadlockGuard& operator=(const DeadlockGuard&) = delete;
};

struct ChildResult {
  int status = 0;
  std::string stderrText;

  bool killedBy(int sig) const { return WIFSIGNALED(status) && WTERMSIG(status) == sig; }
  bool exitedWith(int code) const { return WIFEXITED(status) && WEXITSTATUS(status) == code; }
  std::string describe() const {
    char buf[64];
    if (WIFEXITED(status)) {
      snprintf(buf, sizeof buf, "exited with status %d", WEXITSTATUS(status));
    } else if (WIFSIGNALED(status)) {
      snprintf(buf, sizeof buf, "killed by signal %d (%s)", WTERMSIG(status),
               strsignal(WTERMSIG(status)));
    } else {
      snprintf(buf, sizeof buf, "wait status 0x%x", status);
    }
    return std::string(buf) + "; stderr:\n" + stderrText;
  }
};

// Runs `body` in a forked child whose stderr is captured; the child exits with 0 if `body`
// returns. Core dumps are disabled in the child and it is killed after `timeoutSeconds`.
inline ChildResult runInChild(const std::function<void()>& body, unsigned timeoutSeconds = 30) {
  fflush(nullptr);
  int fds[2];
  if (pipe(fds) != 0) {
    ADD_FAILURE() << "pipe: " << strerror(errno);
    return {};
  }
  pid_t pid = fork();
  if (pid < 0) {
    ADD_FAILURE() << "fork: " << strerror(errno);
    close(fds[0]);
    close(fds[1]);
    return {};
  }
  if (pid == 0) {
    close(fds[0]);
    dup2(fds[1], STDERR_FILENO);
    close(fds[1]);
    struct rlimit noCore = {0, 0};
    setrlimit(RLIMIT_CORE, &noCore);
    alarm(timeoutSeconds);
    body();
    _exit(0);
  }
  close(fds[1]);
  ChildResult result;
  char buf[4096];
  for (;;) {
    ssize_t n = read(fds[0], buf, sizeof buf);
    if (n > 0) {
      result.stderrText.append(buf, static_cast<size_t>(n));
    } else if (n == 0 || errno != EINTR) {
      break;
    }
  }
  close(fds[0]);
  while (waitpid(pid, &result.status, 0) < 0 && errno == EINTR) {
  }
  return result;
}

// What meshalloc_print_stats writes, as text (`json` 0) or JSON (1).
inline std::string statsReport(int json) {
  fflush(nullptr);
  FILE* tmp = tmpfile();
  EXPECT_NE(tmp, nullptr);
  if (!tmp) return {};
  meshalloc_print_stats(fileno(tmp), json);
  std::string text;
  lseek(fileno(tmp), 0, SEEK_SET);
  char buf[4096];
  ssize_t n;
  while ((n = read(fileno(tmp), buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
  fclose(tmp);
  return text;
}

}  // namespace meshtest
