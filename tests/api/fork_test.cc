// fork(), posix_spawn and fork+exec while other threads are inside the allocator: children
// see a private snapshot of the parent's heap, can allocate at once, and nothing deadlocks.
#include <pthread.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

extern char** environ;

namespace {

using meshtest::DeadlockGuard;

struct Object {
  unsigned char* p;
  size_t size;
};

// Exit codes of the children, so the parent can say what went wrong.
enum ChildExit : int {
  kChildOk = 0,
  kChildSnapshotWrong = 10,
  kChildOwnDataWrong = 11,
  kChildAllocFailed = 12,
  kChildThreadFailed = 13,
  kChildPipeFailed = 14,
  kChildGrandchildFailed = 15,
};

// Keeps one thread allocating and freeing objects of every kind until stopped, so that fork()
// often happens while it holds allocator locks.
class Spinner {
 public:
  Spinner() : thread_([this] { run(); }) {}
  ~Spinner() {
    stop_.store(true);
    thread_.join();
  }
  Spinner(const Spinner&) = delete;
  Spinner& operator=(const Spinner&) = delete;
  uint64_t iterations() const { return iterations_.load(); }

 private:
  void run() {
    std::mt19937_64 rng(42);
    void* ring[64] = {};
    size_t i = 0;
    while (!stop_.load(std::memory_order_relaxed)) {
      size_t slot = i++ % 64;
      free(ring[slot]);
      uint64_t r = rng();
      size_t size = (r % 100 == 0) ? (64 << 10) + r % (1 << 20) : 1 + r % 16384;
      ring[slot] = malloc(size);
      if (ring[slot]) static_cast<unsigned char*>(ring[slot])[size - 1] = 1;
      if (r % 7 == 0) {
        void* q = realloc(ring[slot], size / 2 + 1);
        if (q) ring[slot] = q;
      }
      iterations_.fetch_add(1, std::memory_order_relaxed);
    }
    for (void* p : ring) free(p);
  }

  std::atomic<bool> stop_{false};
  std::atomic<uint64_t> iterations_{0};
  std::thread thread_;
};

// Sizes spread over every small class (log-uniform up to 16 KiB), one in `largeEvery` large.
size_t pickSize(std::mt19937_64& rng, size_t i, size_t largeEvery) {
  uint64_t r = rng();
  if (i % largeEvery == largeEvery - 1) return (64 << 10) + r % (1 << 20);
  size_t shift = (r >> 32) % 14;
  return (size_t{1} << shift) + r % (size_t{1} << shift);
}

std::vector<Object> makeObjects(size_t count, uint64_t version) {
  std::vector<Object> objs;
  std::mt19937_64 rng(7);
  for (size_t i = 0; i < count; ++i) {
    size_t size = pickSize(rng, i, 200);
    auto* p = static_cast<unsigned char*>(malloc(size));
    if (!p) abort();
    meshtest::fillPattern(p, size, version);
    objs.push_back({p, size});
  }
  return objs;
}

void rewrite(std::vector<Object>& objs, uint64_t version) {
  for (auto& o : objs) meshtest::fillPattern(o.p, o.size, version);
}

size_t countWrong(const std::vector<Object>& objs, uint64_t version) {
  size_t wrong = 0;
  for (const auto& o : objs) {
    if (meshtest::firstMismatch(o.p, o.p, o.size, version, o.size) != SIZE_MAX) ++wrong;
  }
  return wrong;
}

// Allocates, checks and frees a batch of objects; returns false if any came back damaged.
bool churn(size_t count, uint64_t seed) {
  std::vector<Object> mine;
  std::mt19937_64 rng(seed);
  for (size_t i = 0; i < count; ++i) {
    size_t size = pickSize(rng, i, 100);
    auto* p = static_cast<unsigned char*>(malloc(size));
    if (!p) _exit(kChildAllocFailed);
    meshtest::fillPattern(p, size, seed);
    mine.push_back({p, size});
  }
  bool ok = countWrong(mine, seed) == 0;
  for (auto& o : mine) free(o.p);
  return ok;
}

// The child side of one fork: wait until the parent has overwritten its objects, check that
// the child still sees the values from the moment of fork, then use the heap heavily.
[[noreturn]] void childBody(std::vector<Object>& objs, uint64_t version, int goFd, bool nested) {
  alarm(60);
  char go;
  if (read(goFd, &go, 1) != 1) _exit(kChildPipeFailed);
  if (size_t wrong = countWrong(objs, version)) {
    fprintf(stderr, "child: %zu of %zu objects differ from the snapshot at fork\n", wrong,
            objs.size());
    _exit(kChildSnapshotWrong);
  }
  // Scribble over the parent's objects (must stay private to the child), free half of them.
  rewrite(objs, 999);
  for (size_t i = 0; i < objs.size(); i += 2) free(objs[i].p);
  if (!churn(3000, version)) _exit(kChildOwnDataWrong);
  bool threadOk = false;
  std::thread t([&] { threadOk = churn(2000, version + 1); });
  t.join();
  if (!threadOk) _exit(kChildThreadFailed);
  if (nested) {
    pid_t grandchild = fork();
    if (grandchild == 0) {
      alarm(60);
      _exit(churn(1000, version + 2) ? 0 : 1);
    }
    int status = 0;
    if (grandchild < 0 || waitpid(grandchild, &status, 0) != grandchild || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      _exit(kChildGrandchildFailed);
    }
  }
  for (size_t i = 1; i < objs.size(); i += 2) free(objs[i].p);
  _exit(kChildOk);
}

TEST(Fork, ChildrenSeeASnapshotWhileAnotherThreadAllocates) {
  DeadlockGuard guard(300);
  uint64_t version = 1;
  std::vector<Object> objs = makeObjects(3000, version);
  Spinner spinner;

  for (int i = 0; i < 50; ++i) {
    int go[2];
    ASSERT_EQ(pipe(go), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) {
      close(go[1]);
      childBody(objs, version, go[0], i % 10 == 0);
    }
    close(go[0]);
    // Change every object after the fork; the child must not see this.
    rewrite(objs, version + 1);
    ASSERT_EQ(write(go[1], "g", 1), 1);
    close(go[1]);

    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status))
        << "fork #" << i << ": child killed by signal "
        << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << " (SIGALRM = deadlock)";
    ASSERT_EQ(WEXITSTATUS(status), kChildOk)
        << "fork #" << i << ": 10 = stale snapshot, 11/13/15 = corrupt child heap";
    ++version;
    // The child's scribbles and frees must not have reached the parent.
    ASSERT_EQ(countWrong(objs, version), 0u) << "fork #" << i << ": child wrote into the parent";
  }
  EXPECT_GT(spinner.iterations(), 0u);
  for (auto& o : objs) free(o.p);
}

// Handlers registered by the application run around the allocator's own and may allocate.
std::atomic<int> gAtforkCalls{0};
void* gAtforkBlock = nullptr;
void atforkPrepare() {
  gAtforkBlock = malloc(777);
  gAtforkCalls.fetch_add(1);
}
void atforkParent() {
  free(gAtforkBlock);
  gAtforkBlock = nullptr;
}
void atforkChild() {
  free(gAtforkBlock);
  gAtforkBlock = malloc(4321);
  if (gAtforkBlock) memset(gAtforkBlock, 1, 4321);
}

TEST(Fork, ApplicationAtforkHandlersMayAllocate) {
  DeadlockGuard guard(120);
  static bool registered = false;
  if (!registered) {
    ASSERT_EQ(pthread_atfork(atforkPrepare, atforkParent, atforkChild), 0);
    registered = true;
  }
  Spinner spinner;
  for (int i = 0; i < 10; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(30);
      bool ok = gAtforkBlock != nullptr && churn(500, 5);
      _exit(ok ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "status " << status;
  }
  EXPECT_GE(gAtforkCalls.load(), 10);
}

TEST(Fork, PosixSpawnAndForkExecOfTrue) {
  DeadlockGuard guard(120);
  Spinner spinner;
  char arg0[] = "true";
  char* argv[] = {arg0, nullptr};
  for (int i = 0; i < 20; ++i) {
    pid_t pid = -1;
    ASSERT_EQ(posix_spawn(&pid, "/bin/true", nullptr, nullptr, argv, environ), 0);
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "posix_spawn #" << i;

    pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      execv("/bin/true", argv);
      _exit(127);
    }
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "fork+exec #" << i;
  }
  // popen/system allocate in the parent and spawn a shell.
  FILE* f = popen("echo meshalloc-popen", "r");
  ASSERT_NE(f, nullptr);
  char line[64] = {};
  ASSERT_NE(fgets(line, sizeof line, f), nullptr);
  EXPECT_STREQ(line, "meshalloc-popen\n");
  EXPECT_EQ(pclose(f), 0);
  EXPECT_EQ(system("exit 3"), 3 << 8);
}

}  // namespace

namespace {

// A thread keeps freeing remotely and freeing large objects (both guarded operations) while
// the main thread forks; each child must be able to mesh and free: no record of a thread
// that was mid-operation at fork may make the child wait for it.
TEST(Fork, ChildCanMeshWhileParentThreadWasMidFree) {
  DeadlockGuard guard(120);
  std::atomic<bool> stop{false};
  std::thread churner([&] {
    while (!stop.load(std::memory_order_relaxed)) {
      free(malloc(1 << 20));
      void* p = malloc(64);
      std::thread([p] { free(p); }).join();
    }
  });
  for (int i = 0; i < 20; ++i) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      alarm(20);
      std::vector<void*> blocks;
      for (int k = 0; k < 20000; ++k) blocks.push_back(malloc(48));
      for (size_t k = 0; k < blocks.size(); ++k) {
        if (k % 4) free(blocks[k]);
      }
      meshalloc_compact();
      for (size_t k = 0; k < blocks.size(); k += 4) free(blocks[k]);
      _exit(0);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status))
        << "fork #" << i << ": child killed by signal "
        << (WIFSIGNALED(status) ? WTERMSIG(status) : 0) << " (SIGALRM = hang)";
  }
  stop = true;
  churner.join();
}

}  // namespace
