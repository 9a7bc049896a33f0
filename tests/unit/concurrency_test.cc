// Many threads allocating, writing, handing objects to each other and freeing them: every
// object carries a pattern derived from its address and size, checked before it is freed.
// Under TSan this is also the race detector's workload.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "api/entry_points.h"
#include "heap/heap.h"
#include "support/rng.h"

namespace meshalloc {
namespace {

constexpr int kThreads = 4;
constexpr int kOperationsPerThread = 40000;
constexpr size_t kExchangeSlots = 1024;

unsigned char patternByte(const void* block, size_t size, size_t i) {
  uintptr_t seed = reinterpret_cast<uintptr_t>(block) ^ (size * 0x9e3779b97f4a7c15ull);
  return static_cast<unsigned char>((seed >> ((i % 8) * 8)) + i);
}

void fill(void* block, size_t size) {
  auto* bytes = static_cast<unsigned char*>(block);
  for (size_t i = 0; i < size; i++) bytes[i] = patternByte(block, size, i);
}

// `origin` is the address the pattern was written at (realloc may have moved it since).
bool intactFrom(const void* block, size_t size, const void* origin) {
  auto* bytes = static_cast<const unsigned char*>(block);
  for (size_t i = 0; i < size; i++) {
    if (bytes[i] != patternByte(origin, size, i)) return false;
  }
  return true;
}

bool intact(const void* block, size_t size) {
  return intactFrom(block, size, block);
}

// A handed-off block records its own size in its first word, so pointer and size travel
// together through one atomic exchange.
struct Handoff {
  std::atomic<void*> block{nullptr};
};

size_t sizeOf(void* block) {
  size_t size;
  memcpy(&size, block, sizeof(size));
  return size;
}

TEST(Concurrency, CrossThreadFreesKeepEveryObjectIntact) {
  ASSERT_TRUE(heap::ensureInitialized());
  static Handoff slots[kExchangeSlots];
  std::atomic<int> corrupted{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&, t] {
      Rng rng(1000 + t);
      std::vector<std::pair<void*, size_t>> mine;
      for (int op = 0; op < kOperationsPerThread; op++) {
        uint32_t roll = rng.below(100);
        size_t size = roll < 90   ? 8 + rng.below(512)
                      : roll < 99 ? 512 + rng.below(16000)
                                  : 20000 + rng.below(200000);
        void* block = api::mallocImpl(size);
        ASSERT_NE(block, nullptr);
        if (rng.below(2)) {
          fill(static_cast<char*>(block) + sizeof(size_t), size - sizeof(size_t));
          // Swap with a shared slot: whatever was there was allocated by some other thread.
          Handoff& slot = slots[rng.below(kExchangeSlots)];
          memcpy(block, &size, sizeof(size));
          if (void* old = slot.block.exchange(block)) {
            size_t oldSize = sizeOf(old);
            if (!intact(static_cast<char*>(old) + sizeof(size_t), oldSize - sizeof(size_t)))
              corrupted++;
            api::freeImpl(old);
          }
        } else {
          fill(block, size);
          mine.emplace_back(block, size);
          if (mine.size() > 256) {
            size_t victim = rng.below(static_cast<uint32_t>(mine.size()));
            if (!intact(mine[victim].first, mine[victim].second)) corrupted++;
            if (rng.below(4) == 0) {
              size_t grown = mine[victim].second * 2 + 1;
              void* moved = api::reallocImpl(mine[victim].first, grown);
              if (!intactFrom(moved, mine[victim].second, mine[victim].first)) corrupted++;
              api::freeImpl(moved);
            } else {
              api::freeImpl(mine[victim].first);
            }
            mine[victim] = mine.back();
            mine.pop_back();
          }
        }
      }
      for (auto& [block, size] : mine) {
        if (!intact(block, size)) corrupted++;
        api::freeImpl(block);
      }
    });
  }
  for (auto& thread : threads) thread.join();
  for (Handoff& slot : slots) {
    if (void* block = slot.block.exchange(nullptr)) {
      if (!intact(static_cast<char*>(block) + sizeof(size_t), sizeOf(block) - sizeof(size_t)))
        corrupted++;
      api::freeImpl(block);
    }
  }
  EXPECT_EQ(corrupted.load(), 0);
}

}  // namespace
}  // namespace meshalloc
