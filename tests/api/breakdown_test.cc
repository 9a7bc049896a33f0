// The memory breakdown ("where every byte goes", docs/memory.md): each component follows a
// known pattern of allocations, and the heap's components plus what lies outside the heap
// add up to the process's PSS.
#include <stdlib.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <map>
#include <mutex>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"
#include "test_support.h"

namespace {

constexpr int64_t kKiB = 1024;
constexpr int64_t kMiB = 1024 * kKiB;

// The components the exit report lists, in its order (read from the report itself, so the
// test follows the library's one list instead of keeping a copy of it).
std::vector<std::string> componentNames() {
  std::string json = meshtest::statsReport(1);
  std::vector<std::string> names;
  size_t begin = json.find("\"breakdown_components\":[");
  size_t end = json.find(']', begin);
  EXPECT_NE(begin, std::string::npos) << json;
  if (begin == std::string::npos) return names;
  std::string list = json.substr(begin, end - begin);
  std::regex name("\"name\":\"([a-z0-9_]+)\"");
  for (std::sregex_iterator it(list.begin(), list.end(), name), done; it != done; ++it)
    names.push_back((*it)[1]);
  return names;
}

using Breakdown = std::map<std::string, int64_t>;

// Every component through mallctl, after a new epoch.
Breakdown readBreakdown(const std::vector<std::string>& names) {
  uint64_t epoch = 1;
  size_t len = sizeof epoch;
  EXPECT_EQ(meshalloc_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch), 0);
  Breakdown b;
  for (const std::string& name : names) {
    int64_t value = 0;
    len = sizeof value;
    std::string key = "stats.breakdown." + name;
    EXPECT_EQ(meshalloc_mallctl(key.c_str(), &value, &len, nullptr, 0), 0) << key;
    b[name] = value;
  }
  return b;
}

int64_t detachedFree(Breakdown& b) {
  return b["detached_free_0"] + b["detached_free_1"] + b["detached_free_2"] + b["detached_free_3"];
}

std::string describe(Breakdown& before, Breakdown& after) {
  std::string text;
  for (auto& [name, value] : after) {
    text += "  " + name + ": " + std::to_string(before[name]) + " -> " + std::to_string(value) +
            " (" + std::to_string(value - before[name]) + ")\n";
  }
  return text;
}

TEST(Breakdown, EveryComponentHasAMallctlNameAndAReportLine) {
  std::vector<std::string> names = componentNames();
  ASSERT_GE(names.size(), 15u);
  for (const char* expected :
       {"small_live", "attached_free", "detached_free_0", "dirty_cache", "large_live",
        "large_slack", "page_maps", "span_records", "thread_heaps", "heap_total", "mesh_saving",
        "page_tables", "pss", "outside_heap"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), expected), names.end()) << expected;
  }
  Breakdown b = readBreakdown(names);
  EXPECT_GT(b["pss"], 0);
  EXPECT_GT(b["page_tables"], 0);
  EXPECT_GT(b["page_maps"], 0);
  EXPECT_GT(b["span_records"], 0);
  EXPECT_GT(b["thread_heaps"], 0);
  EXPECT_EQ(b["charged"], b["pss"] + b["page_tables"]);
  EXPECT_EQ(b["outside_heap"], b["pss"] - b["heap_total"]);
  int64_t value = 0;
  size_t len = sizeof value;
  EXPECT_EQ(meshalloc_mallctl("stats.breakdown.no_such_part", &value, &len, nullptr, 0), ENOENT);
  value = 1;
  EXPECT_EQ(meshalloc_mallctl("stats.breakdown.pss", nullptr, nullptr, &value, sizeof value),
            EPERM);

  std::string text = meshtest::statsReport(0);
  ASSERT_FALSE(text.empty());
  for (const std::string& name : names) {
    EXPECT_NE(text.find("\n    " + name + " "), std::string::npos) << name << " in\n" << text;
  }
}

// Known amounts in known places, each checked against its component, and the whole against
// PSS. Tolerances are stated where they are used; each is well under the amount it guards.
TEST(Breakdown, ComponentsFollowKnownPatternsAndAddUpToPss) {
  const std::vector<std::string> names = componentNames();
  const int64_t page = sysconf(_SC_PAGESIZE);
  constexpr size_t kLive = 40000, kLiveSize = 512;            // 20 MB kept live
  constexpr size_t kSparse = 40000, kSparseSize = 256;        // 10 MB, 3/4 freed remotely
  constexpr size_t kLarge = 8, kLargeSize = (1 << 20) + 100;  // large, 100 B into a page
  constexpr size_t kHeld = 128, kHeldSize = 16384;            // 16 spans, half freed locally
  // Every container is sized before the first snapshot: growing one would be a large
  // allocation of its own in between.
  std::vector<void*> live(kLive), sparse(kSparse), large(kLarge);
  std::mutex lock;
  std::condition_variable changed;
  bool held = false;
  std::atomic<bool> releaseHolder{false};

  Breakdown before = readBreakdown(names);

  for (void*& p : live) {
    p = malloc(kLiveSize);
    memset(p, 1, kLiveSize);
  }
  std::thread([&] {
    for (void*& p : sparse) {
      p = malloc(kSparseSize);
      memset(p, 2, kSparseSize);
    }
  }).join();  // its spans are detached when it exits
  for (size_t i = 0; i < kSparse; i++) {
    if (i % 4) free(sparse[i]);
  }
  for (void*& p : large) {
    p = malloc(kLargeSize);
    memset(p, 3, kLargeSize);
  }
  std::thread holder([&] {
    std::vector<void*> mine(kHeld);
    for (void*& p : mine) {
      p = malloc(kHeldSize);
      memset(p, 4, kHeldSize);
    }
    for (size_t i = 0; i < kHeld; i += 2) free(mine[i]);
    {
      std::unique_lock<std::mutex> guard(lock);
      held = true;
      changed.notify_all();
    }
    // Not a condition wait: that would park the heap, and the idle reclaim would detach the
    // spans this test counts as attached.
    while (!releaseHolder.load(std::memory_order_acquire))
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    for (size_t i = 1; i < kHeld; i += 2) free(mine[i]);
  });
  {
    std::unique_lock<std::mutex> guard(lock);
    changed.wait(guard, [&] { return held; });
  }

  // A mesh pass holds the spans it looks at out of every list ("in_transit"), their live and
  // free slots unknown until it hands them back: wait for a moment without one.
  Breakdown after = readBreakdown(names);
  for (int tries = 0; after["in_transit"] != 0 && tries < 500; tries++) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    after = readBreakdown(names);
  }
  SCOPED_TRACE(describe(before, after));
  auto delta = [&](const char* name) { return after[name] - before[name]; };

  // Live small objects: 40000 x 512 kept, a quarter of the sparse ones, half of the holder's.
  // The slack covers what the test framework and the threads allocate on the way (well under
  // 1 MiB).
  const int64_t expectLive = kLive * kLiveSize + kSparse / 4 * kSparseSize + kHeld / 2 * kHeldSize;
  EXPECT_NEAR(delta("small_live"), expectLive, 1 * kMiB);

  // Three quarters of the sparse objects were freed into detached spans, a quarter full each,
  // so their free slots sit in the low occupancy bins. Meshing may merge some of those spans
  // meanwhile: a mesh turns a span's worth of free slots into a saving, so the free slots
  // plus the saving stay what was freed. Slack: the exiting thread's last span's unused
  // slots (at most 512 of 256 B) and the main thread's (under 1 MiB).
  const int64_t expectSparseFree = kSparse * 3 / 4 * kSparseSize;
  EXPECT_NEAR(detachedFree(after) - detachedFree(before) + delta("mesh_saving"), expectSparseFree,
              1 * kMiB);
  EXPECT_LT(delta("detached_free_3"), 512 * kKiB) << "spans a quarter full counted as full";

  // Large objects: exact but for whatever else the process allocates large in between.
  const int64_t largePages = (kLargeSize + page - 1) / page;
  EXPECT_NEAR(delta("large_live"), kLarge * kLargeSize, 64 * kKiB);
  EXPECT_NEAR(delta("large_slack"), kLarge * (largePages * page - kLargeSize), 16 * kKiB);

  // The holder keeps its spans of 16 KiB objects attached, half of their slots freed locally.
  // Slack: the main thread's own attached spans change too (at most a vector's worth of 512 B
  // slots, 128 KiB, and a few more of other classes).
  const int64_t expectHeldFree = kHeld / 2 * kHeldSize;
  EXPECT_GE(delta("attached_free"), expectHeldFree - 64 * kKiB);
  EXPECT_LE(delta("attached_free"), expectHeldFree + 512 * kKiB);

  // The heap's total is the sum of its components, and the metadata grew with the heap.
  int64_t sum = 0;
  for (const char* part :
       {"small_live", "attached_free", "detached_free_0", "detached_free_1", "detached_free_2",
        "detached_free_3", "span_tail", "in_transit", "dirty_cache", "large_live", "large_slack",
        "handles_live", "handles_free", "handles_table", "page_maps", "span_records",
        "thread_heaps", "internal_other"}) {
    sum += after[part];
  }
  EXPECT_EQ(after["heap_total"], sum);
  EXPECT_GT(delta("span_records"), 0);
  EXPECT_GT(delta("page_tables"), 0);

  // Against the kernel: the heap grew by about 41 MB less what meshing saved, and what lies
  // outside the heap (text, libraries, stacks) barely changed, so PSS must match the heap's
  // components plus the outside measured before, within 2 MiB (two new thread stacks, counted
  // pages of spans never touched, pages of the framework's own data).
  EXPECT_GT(delta("heap_total") + delta("mesh_saving"), 35 * kMiB);
  EXPECT_NEAR(after["pss"], after["heap_total"] + before["outside_heap"], 2 * kMiB);

  releaseHolder.store(true, std::memory_order_release);
  holder.join();
  for (void* p : live) free(p);
  for (size_t i = 0; i < kSparse; i += 4) free(sparse[i]);
  for (void* p : large) free(p);
}

}  // namespace
