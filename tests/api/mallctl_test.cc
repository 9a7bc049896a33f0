// The control interface: meshalloc_mallctl, the exported jemalloc-compatible mallctl,
// meshalloc_compact and meshalloc_print_stats.
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

// jemalloc's name for the control call; meshalloc exports it so that jemalloc-aware programs
// keep working under LD_PRELOAD.
extern "C" int mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);

namespace {

using Ctl = int (*)(const char*, void*, size_t*, void*, size_t);

void refresh(Ctl ctl = meshalloc_mallctl) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  ASSERT_EQ(ctl("epoch", &epoch, &len, &epoch, sizeof epoch), 0);
}

template <typename T>
T readCtl(const char* name, Ctl ctl = meshalloc_mallctl) {
  T value{};
  size_t len = sizeof value;
  int rc = ctl(name, &value, &len, nullptr, 0);
  EXPECT_EQ(rc, 0) << "mallctl(\"" << name << "\") returned " << rc;
  EXPECT_EQ(len, sizeof value) << name;
  return value;
}

std::vector<void*> allocateTouched(size_t count, size_t size) {
  std::vector<void*> ptrs;
  ptrs.reserve(count);
  for (size_t i = 0; i < count; ++i) {
    void* p = malloc(size);
    EXPECT_NE(p, nullptr);
    memset(p, 0x6D, size);
    ptrs.push_back(p);
  }
  return ptrs;
}

void freeAll(std::vector<void*>& ptrs) {
  for (void* p : ptrs) free(p);
  ptrs.clear();
}

TEST(Mallctl, EpochRefreshesAllocatedBytes) {
  for (Ctl ctl : {Ctl{meshalloc_mallctl}, Ctl{mallctl}}) {
    refresh(ctl);
    const size_t before = readCtl<size_t>("stats.allocated", ctl);
    auto small = allocateTouched(40000, 100);  // 4 MB in small objects
    auto large = allocateTouched(8, 1 << 20);  // 8 MiB in large objects
    refresh(ctl);
    const size_t during = readCtl<size_t>("stats.allocated", ctl);
    const size_t expected = 40000 * 100 + 8 * (1 << 20);
    EXPECT_GE(during, before + expected * 9 / 10) << before << " -> " << during;
    EXPECT_LE(during, before + expected * 3 / 2 + (size_t{1} << 20)) << before << " -> " << during;
    freeAll(small);
    freeAll(large);
    refresh(ctl);
    const size_t after = readCtl<size_t>("stats.allocated", ctl);
    EXPECT_LT(after, during - expected * 9 / 10) << "allocated did not fall after freeing";
  }
}

// Memory freed by another thread, and by threads that have exited, is accounted for.
TEST(Mallctl, AllocatedFallsAfterRemoteFreesAndThreadExit) {
  refresh();
  const size_t before = readCtl<size_t>("stats.allocated");
  std::vector<void*> ptrs;
  std::thread producer([&] { ptrs = allocateTouched(30000, 200); });
  producer.join();
  refresh();
  const size_t during = readCtl<size_t>("stats.allocated");
  EXPECT_GE(during, before + 30000 * 200 * 9 / 10);
  std::thread consumer([&] { freeAll(ptrs); });
  consumer.join();
  refresh();
  const size_t after = readCtl<size_t>("stats.allocated");
  EXPECT_LT(after, before + 30000 * 200 / 10) << before << " -> " << during << " -> " << after;
}

TEST(Mallctl, JemallocStatisticNames) {
  for (Ctl ctl : {Ctl{meshalloc_mallctl}, Ctl{mallctl}}) {
    auto keep = allocateTouched(1000, 1000);
    refresh(ctl);
    EXPECT_EQ(readCtl<unsigned>("arenas.narenas", ctl), 1u);
    const size_t allocated = readCtl<size_t>("stats.allocated", ctl);
    const size_t active = readCtl<size_t>("stats.active", ctl);
    const size_t resident = readCtl<size_t>("stats.resident", ctl);
    const size_t mapped = readCtl<size_t>("stats.mapped", ctl);
    const size_t metadata = readCtl<size_t>("stats.metadata", ctl);
    EXPECT_GE(allocated, 1000u * 1000u);
    EXPECT_GE(active, allocated) << "active spans hold every live object";
    EXPECT_GE(mapped, active) << "active spans are mapped";
    EXPECT_GT(resident, 0u);
    EXPECT_GT(metadata, 0u);
    freeAll(keep);
  }
}

TEST(Mallctl, UnknownNamesAndBadSizes) {
  size_t value = 0, len = sizeof value;
  EXPECT_EQ(meshalloc_mallctl("no.such.name", &value, &len, nullptr, 0), ENOENT);
  EXPECT_EQ(mallctl("no.such.name", &value, &len, nullptr, 0), ENOENT);
  EXPECT_EQ(mallctl("stats", &value, &len, nullptr, 0), ENOENT);
  EXPECT_EQ(mallctl("stats.allocated.extra", &value, &len, nullptr, 0), ENOENT);
  EXPECT_EQ(mallctl("", &value, &len, nullptr, 0), ENOENT);

  uint32_t small = 0;
  len = sizeof small;
  EXPECT_EQ(mallctl("stats.allocated", &small, &len, nullptr, 0), EINVAL)
      << "reading a size_t into 4 bytes";

  value = 1;
  EXPECT_EQ(mallctl("stats.allocated", nullptr, nullptr, &value, sizeof value), EPERM)
      << "statistics are read-only";
}

TEST(Mallctl, VersionAndSizeClasses) {
  const char* version = readCtl<const char*>("version");
  ASSERT_NE(version, nullptr);
  EXPECT_GT(strlen(version), 0u);

  const unsigned nbins = readCtl<unsigned>("arenas.nbins");
  ASSERT_GE(nbins, 8u);
  size_t previous = 0;
  for (unsigned j = 0; j < nbins; ++j) {
    std::string name = "arenas.bin." + std::to_string(j) + ".size";
    size_t size = readCtl<size_t>(name.c_str());
    EXPECT_GT(size, previous) << name << ": classes must grow";
    previous = size;
  }
  EXPECT_GE(previous, 16384u) << "small classes reach at least 16 KiB";
}

// An index that does not fit 64 bits names nothing: it must not wrap around to a real class
// (2^64 + 3 read as class 3).
TEST(Mallctl, AnIndexPastSixtyFourBitsNamesNothing) {
  size_t size = 0, length = sizeof size;
  ASSERT_EQ(meshalloc_mallctl("arenas.bin.3.size", &size, &length, nullptr, 0), 0);
  EXPECT_EQ(meshalloc_mallctl("arenas.bin.18446744073709551619.size", &size, &length, nullptr, 0),
            ENOENT);
  EXPECT_EQ(
      meshalloc_mallctl("stats.classes.18446744073709551619.size", &size, &length, nullptr, 0),
      ENOENT);
}

// Per-class counters follow allocations of that class.
TEST(Mallctl, PerClassObjectCounts) {
  const unsigned nbins = readCtl<unsigned>("arenas.nbins");
  unsigned bin = nbins;
  size_t classSize = 0;
  for (unsigned j = 0; j < nbins; ++j) {
    std::string name = "arenas.bin." + std::to_string(j) + ".size";
    classSize = readCtl<size_t>(name.c_str());
    if (classSize >= 200) {
      bin = j;
      break;
    }
  }
  ASSERT_LT(bin, nbins);
  const std::string regs = "stats.arenas.0.bins." + std::to_string(bin) + ".curregs";
  const std::string slabs = "stats.arenas.0.bins." + std::to_string(bin) + ".curslabs";
  const std::string objects = "stats.classes." + std::to_string(bin) + ".objects";

  refresh();
  const size_t regsBefore = readCtl<size_t>(regs.c_str());
  const size_t objectsBefore = readCtl<size_t>(objects.c_str());
  auto ptrs = allocateTouched(5000, classSize);
  refresh();
  EXPECT_GE(readCtl<size_t>(regs.c_str()), regsBefore + 4900) << regs;
  EXPECT_GE(readCtl<size_t>(objects.c_str()), objectsBefore + 4900) << objects;
  EXPECT_GT(readCtl<size_t>(slabs.c_str()), 0u) << slabs;
  freeAll(ptrs);
  refresh();
  EXPECT_LT(readCtl<size_t>(regs.c_str()), regsBefore + 1000) << regs << " after freeing";
}

TEST(Mallctl, Actions) {
  auto ptrs = allocateTouched(2000, 3000);
  freeAll(ptrs);
  EXPECT_EQ(mallctl("thread.tcache.flush", nullptr, nullptr, nullptr, 0), 0);
  EXPECT_EQ(mallctl("arena.0.purge", nullptr, nullptr, nullptr, 0), 0);
  EXPECT_EQ(mallctl("arena.0.decay", nullptr, nullptr, nullptr, 0), 0);
  EXPECT_EQ(meshalloc_mallctl("mesh.compact", nullptr, nullptr, nullptr, 0), 0);
  (void)meshalloc_compact();
  refresh();
  EXPECT_LE(readCtl<uint64_t>("mesh.pause_wait_max_ns"), readCtl<uint64_t>("mesh.pause_max_ns"));
  // The heap is intact afterwards.
  ptrs = allocateTouched(2000, 3000);
  freeAll(ptrs);
}

TEST(Mallctl, ClassDumpListsTheSpansOfAClass) {
  auto ptrs = allocateTouched(2000, 256);
  unsigned sizeClass = 0;
  size_t classSize = 0;
  for (;; sizeClass++) {
    std::string name = "stats.classes." + std::to_string(sizeClass) + ".size";
    classSize = readCtl<size_t>(name.c_str());
    if (classSize >= 256) break;
  }
  // Its report goes to stderr: catch it in a file (a pipe could fill up before it is read).
  FILE* capture = tmpfile();
  ASSERT_NE(capture, nullptr);
  int savedStderr = dup(STDERR_FILENO);
  dup2(fileno(capture), STDERR_FILENO);
  int status = mallctl("debug.class_dump", nullptr, nullptr, &sizeClass, sizeof(sizeClass));
  dup2(savedStderr, STDERR_FILENO);
  close(savedStderr);
  std::string report;
  char buffer[4096];
  lseek(fileno(capture), 0, SEEK_SET);
  for (ssize_t n; (n = read(fileno(capture), buffer, sizeof(buffer))) > 0;)
    report.append(buffer, n);
  fclose(capture);
  EXPECT_EQ(status, 0);
  EXPECT_NE(report.find("meshalloc: class " + std::to_string(classSize) + ": spans"),
            std::string::npos)
      << report;
  // This thread holds spans of the class: they are listed with their live counts.
  EXPECT_NE(report.find("attached "), std::string::npos) << report;
  EXPECT_NE(report.find(" live "), std::string::npos) << report;
  unsigned tooLarge = 1000;
  EXPECT_EQ(mallctl("debug.class_dump", nullptr, nullptr, &tooLarge, sizeof(tooLarge)), ENOENT);
  EXPECT_EQ(mallctl("debug.class_dump", nullptr, nullptr, &sizeClass, 1), EINVAL);
  freeAll(ptrs);
}

TEST(PrintStats, TextAndJson) {
  auto keep = allocateTouched(100, 500);
  std::string text = meshtest::statsReport(0);
  EXPECT_GT(text.size(), 40u) << text;

  std::string json = meshtest::statsReport(1);
  size_t first = json.find_first_not_of(" \t\r\n");
  size_t last = json.find_last_not_of(" \t\r\n");
  ASSERT_NE(first, std::string::npos) << "empty JSON report";
  EXPECT_EQ(json[first], '{') << json;
  EXPECT_EQ(json[last], '}') << json;
  // Brackets balance outside strings.
  int depth = 0;
  bool inString = false, escaped = false, negative = false;
  for (char c : json) {
    if (inString) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        inString = false;
      }
      continue;
    }
    if (c == '"') inString = true;
    if (c == '{' || c == '[') ++depth;
    if (c == '}' || c == ']') --depth;
    if (depth < 0) negative = true;
  }
  EXPECT_FALSE(inString) << "unterminated string in JSON report";
  EXPECT_FALSE(negative) << json;
  EXPECT_EQ(depth, 0) << json;
  EXPECT_NE(json.find("allocated"), std::string::npos) << json;
  freeAll(keep);
}

// The nice value of this process's thread named `name`, or kNoThread while there is none.
constexpr int kNoThread = -100;
int niceOfThread(const char* name) {
  DIR* tasks = opendir("/proc/self/task");
  if (!tasks) return kNoThread;
  int nice = kNoThread;
  while (dirent* entry = readdir(tasks)) {
    if (entry->d_name[0] == '.') continue;
    std::string dir = std::string("/proc/self/task/") + entry->d_name;
    char comm[64] = {};
    FILE* file = fopen((dir + "/comm").c_str(), "r");
    if (!file) continue;
    bool match = fgets(comm, sizeof(comm), file) && strncmp(comm, name, strlen(name)) == 0;
    fclose(file);
    if (!match) continue;
    // Field 19 of stat; the fields after the command name, which is in parentheses, are
    // space-separated, and the first of them is field 3.
    char stat[1024] = {};
    file = fopen((dir + "/stat").c_str(), "r");
    if (!file) continue;
    size_t n = fread(stat, 1, sizeof(stat) - 1, file);
    fclose(file);
    const char* cursor = strrchr(stat, ')');
    if (!cursor || n == 0) continue;
    constexpr int kNiceField = 19;
    int field = 2;
    for (; *cursor && field < kNiceField; cursor++) field += *cursor == ' ';
    nice = atoi(cursor);
    break;
  }
  closedir(tasks);
  return nice;
}

bool readBool(const char* name) {
  bool value = false;
  size_t len = sizeof(value);
  EXPECT_EQ(mallctl(name, &value, &len, nullptr, 0), 0) << name;
  return value;
}

constexpr int kThreadPolls = 200;
constexpr useconds_t kThreadPollMicros = 10000;

// The background thread starts after a few refills: allocates through many spans of many
// classes, then waits for it. Returns its nice value, or kNoThread if it never appears.
int startMeshThread() {
  constexpr int kBlocks = 200000;
  constexpr int kClasses = 64;
  std::vector<void*> blocks;
  for (int i = 0; i < kBlocks; i++) blocks.push_back(malloc(16 + (i % kClasses) * 16));
  freeAll(blocks);
  int nice = kNoThread;
  for (int poll = 0; poll < kThreadPolls && nice == kNoThread; poll++) {
    nice = niceOfThread("meshalloc-mesh");
    if (nice == kNoThread) usleep(kThreadPollMicros);
  }
  return nice;
}

// The background mesher yields to the program's threads: it runs at the nice value of
// mesh_thread_nice (19 unless configured), which Linux keeps per thread.
TEST(MeshThread, RunsAtTheConfiguredNiceValue) {
  uint64_t wanted = 0;
  size_t len = sizeof(wanted);
  ASSERT_EQ(mallctl("opt.mesh_thread_nice", &wanted, &len, nullptr, 0), 0);
  if (!readBool("opt.mesh_background")) GTEST_SKIP() << "mesh_background is off";
  int nice = startMeshThread();
  ASSERT_NE(nice, kNoThread) << "no meshalloc-mesh thread";
  EXPECT_EQ(nice, static_cast<int>(wanted > 19 ? 19 : wanted));
}

// Spans about half full do not mesh (two of them almost never have disjoint slots), so once the
// program stops allocating the background mesher's passes release nothing. They back off
// instead of running every period: an idle program does not keep paying for them.
TEST(MeshThread, BacksOffWhileIdlePassesReleaseNothing) {
  if (!readBool("opt.mesh") || !readBool("opt.mesh_background"))
    GTEST_SKIP() << "meshing or its background thread is off";
  uint64_t periodMs = 0;
  size_t len = sizeof(periodMs);
  ASSERT_EQ(mallctl("opt.mesh_period_ms", &periodMs, &len, nullptr, 0), 0);
  // Far more free bytes than mesh_min_gain, in spans that keep half their blocks.
  constexpr size_t kBlocks = 200000;
  constexpr size_t kSize = 64;
  std::vector<void*> blocks = allocateTouched(kBlocks, kSize);
  for (size_t i = 0; i < kBlocks; i += 2) {
    free(blocks[i]);
    blocks[i] = nullptr;
  }
  meshalloc_compact();  // the spans are detached candidates now; nothing meshes
  constexpr unsigned kIdleSeconds = 3;
  refresh();
  uint64_t before = readCtl<uint64_t>("mesh.passes");
  sleep(kIdleSeconds);
  refresh();
  uint64_t passes = readCtl<uint64_t>("mesh.passes") - before;
  // Every period would be 30 passes at the default 100 ms; doubling waits, about 5.
  uint64_t everyPeriod = kIdleSeconds * 1000 / (periodMs ? periodMs : 1);
  EXPECT_LE(passes, everyPeriod / 3) << "passes while idle, period " << periodMs << " ms";
  for (void* p : blocks) free(p);
}

// A meshed span whose objects all die is retired by the freeing thread and remapped by the
// background thread: none stays retired, and the meshed spans are gone once it has run.
TEST(MeshThread, RemapsMeshedSpansThatDie) {
  if (!readBool("opt.mesh") || !readBool("opt.mesh_background"))
    GTEST_SKIP() << "meshing or its background thread is off";
  ASSERT_NE(startMeshThread(), kNoThread) << "no meshalloc-mesh thread";

  // One block in eight survives, on a thread that then exits: sparse detached spans that mesh.
  constexpr size_t kBlocks = 100000;
  constexpr size_t kSize = 64;
  constexpr size_t kKeepEvery = 8;
  // The pass may also mesh a span holding a few of the test's own live blocks (gtest's, a
  // vector's buffer), which stays meshed.
  constexpr size_t kUnrelatedMeshes = 4;
  std::vector<void*> survivors;
  std::thread([&] {
    std::vector<void*> blocks = allocateTouched(kBlocks, kSize);
    for (size_t i = 0; i < kBlocks; i++) {
      if (i % kKeepEvery == 0)
        survivors.push_back(blocks[i]);
      else
        free(blocks[i]);
    }
  }).join();
  refresh();
  uint64_t meshesBefore = readCtl<uint64_t>("mesh.count");
  size_t meshedBefore = readCtl<size_t>("mesh.meshed_spans");
  meshalloc_compact();
  refresh();
  ASSERT_GT(readCtl<uint64_t>("mesh.count"), meshesBefore) << "nothing was meshed";
  size_t meshedAfter = readCtl<size_t>("mesh.meshed_spans");
  ASSERT_GT(meshedAfter, meshedBefore);
  for (void* p : survivors) {
    for (size_t b = 0; b < kSize; b++) ASSERT_EQ(static_cast<unsigned char*>(p)[b], 0x6D);
  }
  freeAll(survivors);
  size_t retired = 0, meshed = 0;
  for (int poll = 0; poll < kThreadPolls; poll++) {
    refresh();
    retired = readCtl<size_t>("mesh.retired");
    meshed = readCtl<size_t>("mesh.meshed_spans");
    if (retired == 0 && meshed <= meshedBefore + kUnrelatedMeshes) break;
    usleep(kThreadPollMicros);
  }
  EXPECT_EQ(retired, 0u) << "meshed spans that died were never remapped";
  EXPECT_LE(meshed, meshedBefore + kUnrelatedMeshes) << "of " << meshedAfter << " after meshing";
}

// A pool of threads that allocated, kept a tenth and then block in a condition-variable wait
// (pthread_cond_wait, through std::condition_variable) is alive but idle: the background thread
// takes back every one of their heaps within idle_reclaim_ms plus one period, and each thread
// finds what it kept intact when it wakes.
TEST(MeshThread, ReclaimsTheHeapsOfThreadsBlockedInAConditionWait) {
  if (!readBool("opt.mesh_background")) GTEST_SKIP() << "the background thread is off";
  uint64_t idleMs = 0, periodMs = 0;
  size_t len = sizeof(idleMs);
  ASSERT_EQ(mallctl("opt.idle_reclaim_ms", &idleMs, &len, nullptr, 0), 0);
  ASSERT_EQ(mallctl("opt.mesh_period_ms", &periodMs, &len, nullptr, 0), 0);
  if (idleMs == 0) GTEST_SKIP() << "idle_reclaim_ms is 0";
  ASSERT_NE(startMeshThread(), kNoThread) << "no meshalloc-mesh thread";

  constexpr int kThreads = 4;
  constexpr size_t kBlocks = 20000;
  std::mutex lock;
  std::condition_variable changed;
  int waiting = 0;
  bool wake = false;
  std::atomic<int> damaged{0};
  refresh();
  const size_t before = readCtl<size_t>("stats.idle_reclaims");
  std::vector<std::thread> pool;
  for (int t = 0; t < kThreads; t++) {
    pool.emplace_back([&, t] {
      std::vector<void*> kept;
      for (size_t i = 0; i < kBlocks; i++) {
        size_t size = 16 + (i % 32) * 16;
        auto* block = static_cast<unsigned char*>(malloc(size));
        memset(block, 0x40 + t, size);
        if (i % 10 == 0) {
          kept.push_back(block);
        } else {
          free(block);
        }
      }
      std::unique_lock<std::mutex> guard(lock);
      waiting++;
      changed.notify_all();
      changed.wait(guard, [&] { return wake; });
      guard.unlock();
      for (size_t k = 0; k < kept.size(); k++) {
        size_t size = 16 + ((k * 10) % 32) * 16;
        for (size_t b = 0; b < size; b++)
          damaged += kept[k] && static_cast<unsigned char*>(kept[k])[b] != 0x40 + t;
      }
      freeAll(kept);
    });
  }
  {
    std::unique_lock<std::mutex> guard(lock);
    changed.wait(guard, [&] { return waiting == kThreads; });
  }
  // Bounded: parked idle_reclaim_ms, then at most one period until the next tick (with slack
  // for a loaded machine).
  size_t reclaimed = 0;
  const int polls = static_cast<int>(10 * (idleMs + periodMs) / (kThreadPollMicros / 1000)) + 1;
  for (int poll = 0; poll < polls && reclaimed < kThreads; poll++) {
    usleep(kThreadPollMicros);
    refresh();
    reclaimed = readCtl<size_t>("stats.idle_reclaims") - before;
  }
  EXPECT_GE(reclaimed, static_cast<size_t>(kThreads)) << "idle threads kept their heaps";
  {
    std::lock_guard<std::mutex> guard(lock);
    wake = true;
  }
  changed.notify_all();
  for (std::thread& thread : pool) thread.join();
  EXPECT_EQ(damaged.load(), 0) << "bytes of kept blocks changed while their threads slept";
}

}  // namespace
