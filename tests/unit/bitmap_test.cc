#include "support/bitmap.h"

#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "support/rng.h"

namespace meshalloc {
namespace {

TEST(AtomicBitmap, SetAndUnsetReportTransitions) {
  std::atomic<uint64_t> words[3] = {};
  AtomicBitmap bitmap(words, 130);
  EXPECT_EQ(bitmap.words(), 3u);
  EXPECT_TRUE(bitmap.trySet(129));
  EXPECT_FALSE(bitmap.trySet(129));
  EXPECT_TRUE(bitmap.isSet(129));
  EXPECT_TRUE(bitmap.tryUnset(129));
  EXPECT_FALSE(bitmap.tryUnset(129)) << "a second clear is how double frees are caught";
  EXPECT_EQ(bitmap.popcount(), 0u);
}

TEST(AtomicBitmap, ClaimTakesOnlyClearValidBits) {
  std::atomic<uint64_t> words[2] = {};
  AtomicBitmap bitmap(words, 70);
  bitmap.trySet(3);
  bitmap.trySet(65);
  EXPECT_EQ(bitmap.claimWord(0), ~0ull & ~(1ull << 3));
  EXPECT_EQ(bitmap.claimWord(1), 0x3full & ~(1ull << 1)) << "bits past 70 are not slots";
  EXPECT_EQ(bitmap.popcount(), 70u);
  EXPECT_EQ(bitmap.claimWord(0), 0u);
}

TEST(AtomicBitmap, ConcurrentUnsetsEachSucceedExactlyOnce) {
  constexpr size_t kBits = 4096;
  constexpr int kThreads = 4;
  std::vector<std::atomic<uint64_t>> words(AtomicBitmap::wordsFor(kBits));
  AtomicBitmap bitmap(words.data(), kBits);
  for (size_t w = 0; w < bitmap.words(); w++) bitmap.claimWord(w);
  std::atomic<size_t> successes{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; t++) {
    threads.emplace_back([&] {
      for (size_t i = 0; i < kBits; i++) successes += bitmap.tryUnset(i);
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(successes.load(), kBits);
  EXPECT_EQ(bitmap.popcount(), 0u);
}

TEST(Rng, BelowStaysInRangeAndCoversIt) {
  Rng rng(42);
  constexpr uint32_t kBound = 10;
  int counts[kBound] = {};
  for (int i = 0; i < 100000; i++) {
    uint32_t v = rng.below(kBound);
    ASSERT_LT(v, kBound);
    counts[v]++;
  }
  for (int c : counts) EXPECT_NEAR(c, 10000, 600);
}

}  // namespace
}  // namespace meshalloc
