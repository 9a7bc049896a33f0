// Mutator threads pin, check, write, unpin, resize and free handle objects while a thread runs
// defragmentation passes back to back (run under TSan too: `ctest --preset tsan -L unit`).
// Every object holds words derived from its handle and a version; a lost or torn write, or a
// pin that returned a stale copy, shows as a word of another version.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "handle/defrag.h"
#include "handle/handles.h"
#include "heap/config.h"

namespace meshalloc::handles {
namespace {

uint64_t word(uint64_t handle, uint64_t version, size_t i) {
  return (handle * 0x9E3779B97F4A7C15ull) ^ (version << 20) ^ i;
}

struct Object {
  uint64_t handle;
  size_t words;
  uint64_t version;
};

// Pins, checks every word against `expected`, writes version `next` (if not 0), unpins.
// Returns the number of wrong words.
size_t checkAndWrite(const Object& o, uint64_t next) {
  auto* p = static_cast<uint64_t*>(pin(o.handle));
  size_t wrong = 0;
  for (size_t i = 0; i < o.words; i++) wrong += p[i] != word(o.handle, o.version, i);
  if (next)
    for (size_t i = 0; i < o.words; i++) p[i] = word(o.handle, next, i);
  unpin(o.handle);
  return wrong;
}

// Each phase allocates another range of sizes, so the classes of the last phase go sparse.
Object make(std::mt19937_64& rng, unsigned phase = 0) {
  Object o{0, 2 + (phase % 4) * 16 + rng() % 14, 1};
  o.handle = allocate(o.words * 8);
  auto* p = static_cast<uint64_t*>(pin(o.handle));
  for (size_t i = 0; i < o.words; i++) p[i] = word(o.handle, 1, i);
  unpin(o.handle);
  return o;
}

struct Totals {
  std::atomic<uint64_t> checked{0};
  std::atomic<uint64_t> wrong{0};
};

void mutator(uint64_t seed, size_t operations, const std::vector<Object>& shared, Totals& totals) {
  std::mt19937_64 rng(seed);
  std::vector<Object> own;
  unsigned phase = 0;
  for (int i = 0; i < 6000; i++) own.push_back(make(rng));
  size_t wrong = 0;
  for (size_t op = 0; op < operations; op++) {
    unsigned kind = rng() % 1000;
    if (kind < 300) {
      // Objects every thread pins at once, never written: moves race with many pins.
      wrong += checkAndWrite(shared[rng() % shared.size()], 0);
    } else if (kind < 900) {
      Object& o = own[rng() % own.size()];
      wrong += checkAndWrite(o, o.version + 1);
      o.version++;
    } else if (kind < 930) {
      Object& o = own[rng() % own.size()];
      size_t words = 2 + rng() % 30;
      Object kept = o;
      kept.words = words < o.words ? words : o.words;
      reallocate(o.handle, words * 8);
      wrong += checkAndWrite(kept, 0);
      o.words = words;
      auto* p = static_cast<uint64_t*>(pin(o.handle));
      for (size_t i = 0; i < o.words; i++) p[i] = word(o.handle, o.version, i);
      unpin(o.handle);
    } else if (kind < 998) {
      Object& o = own[rng() % own.size()];
      wrong += checkAndWrite(o, 0);
      free(o.handle);
      o = make(rng, phase);
    } else {
      // Replace most objects by ones of the next phase: sparse chunks for the mover.
      phase++;
      for (size_t i = 0; i < own.size(); i++) {
        if (rng() % 5 == 0) continue;
        wrong += checkAndWrite(own[i], 0);
        free(own[i].handle);
        own[i] = make(rng, phase);
      }
    }
  }
  for (Object& o : own) {
    wrong += checkAndWrite(o, 0);
    free(o.handle);
  }
  totals.checked.fetch_add(operations, std::memory_order_relaxed);
  totals.wrong.fetch_add(wrong, std::memory_order_relaxed);
}

TEST(HandleConcurrencyTest, MutatorsAndAMoverLoseNoWrite) {
  gHeapConfig.handlesDefrag = false;
  ASSERT_TRUE(ensureInitialized());
  std::mt19937_64 rng(7);
  // Shared objects between freed ones: they sit in sparse chunks, so they move.
  std::vector<Object> shared;
  for (int i = 0; i < 4000; i++) {
    Object o = make(rng);
    if (i % 4 == 0) {
      shared.push_back(o);
    } else {
      free(o.handle);
    }
  }
  uint64_t movedBefore = gCounters.movedObjects.load();
  std::atomic<bool> stop{false};
  std::thread mover([&] {
    while (!stop.load(std::memory_order_relaxed)) Defragmenter::pass(0, 0);
  });
  Totals totals;
  constexpr size_t kOperations = 150000;
  std::vector<std::thread> threads;
  for (uint64_t t = 0; t < 3; t++)
    threads.emplace_back(mutator, 100 + t, kOperations, std::cref(shared), std::ref(totals));
  for (std::thread& t : threads) t.join();
  stop.store(true);
  mover.join();
  for (const Object& o : shared) {
    EXPECT_EQ(checkAndWrite(o, 0), 0u);
    free(o.handle);
  }
  EXPECT_EQ(totals.wrong.load(), 0u);
  EXPECT_EQ(totals.checked.load(), 3 * kOperations);
  EXPECT_GT(gCounters.movedObjects.load(), movedBefore);
}

}  // namespace
}  // namespace meshalloc::handles
