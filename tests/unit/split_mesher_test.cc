// SplitMesher::find on crafted bitmaps: spans that exist only as span records (no pages), so the
// search alone is under test.
#include "mesh/split_mesher.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <new>
#include <set>
#include <vector>

#include "heap/arena.h"
#include "heap/size_class.h"
#include "heap/span.h"
#include "mesh/page_mask.h"
#include "mesh/span_backing.h"
#include "support/rng.h"

namespace meshalloc {
namespace {

constexpr uint32_t kObjects = 64;  // one bitmap word

// A span record with its one-word bitmap behind it.
struct alignas(kCacheLine) FakeSpan {
  alignas(kCacheLine) unsigned char storage[sizeof(Span) + sizeof(uint64_t)];
  Span* heap() { return reinterpret_cast<Span*>(storage); }
};

class SplitMesherSearch : public ::testing::Test {
 protected:
  // Spans whose bitmaps are `bits`, in that order.
  std::vector<Span*> makeSpans(const std::vector<uint64_t>& bits) {
    spans_ = std::vector<FakeSpan>(bits.size());
    std::vector<Span*> heaps;
    for (size_t i = 0; i < bits.size(); i++) {
      Span* heap = new (spans_[i].storage) Span();
      heap->objectCount = kObjects;
      heap->state = SpanState::kMeshing;
      heap->bitmap().storeWord(0, bits[i]);
      heaps.push_back(heap);
    }
    return heaps;
  }
  static uint64_t bitsOf(Span* heap) { return heap->bitmap().loadWord(0); }

  std::vector<FakeSpan> spans_;
};

TEST_F(SplitMesherSearch, FindsTheOnlyMeshablePair) {
  // a and b are disjoint; every other pair overlaps.
  constexpr uint64_t kA = 0x0f0f, kB = 0xf0f0, kFull = 0xffff;
  unsigned splitApart = 0, splitTogether = 0;
  for (uint64_t seed = 1; seed <= 32; seed++) {
    std::vector<Span*> candidates = makeSpans({kA, kFull, kB, kFull, kFull, kFull});
    Rng rng(seed);
    MeshGroup groups[3];
    size_t found = SplitMesher::find(candidates.data(), candidates.size(), 64, rng, groups, 3);
    // find shuffles the candidates in place and splits them in halves: the pair can only be
    // found if a and b ended up on different sides, and then it must be.
    size_t half = candidates.size() / 2;
    bool aLeft = false, bLeft = false;
    for (size_t i = 0; i < half; i++) {
      aLeft |= bitsOf(candidates[i]) == kA;
      bLeft |= bitsOf(candidates[i]) == kB;
    }
    if (aLeft == bLeft) {
      splitTogether++;
      EXPECT_EQ(found, 0u) << "seed " << seed;
      continue;
    }
    splitApart++;
    ASSERT_EQ(found, 1u) << "seed " << seed;
    ASSERT_EQ(groups[0].sourceCount, 1u);
    std::set<uint64_t> pair = {bitsOf(groups[0].destination), bitsOf(groups[0].sources[0])};
    EXPECT_EQ(pair, (std::set<uint64_t>{kA, kB})) << "seed " << seed;
  }
  EXPECT_GT(splitApart, 0u);
  EXPECT_GT(splitTogether, 0u);
}

TEST_F(SplitMesherSearch, NeverPairsOverlappingSpans) {
  for (uint64_t seed = 1; seed <= 64; seed++) {
    Rng bitsRng(seed * 7919);
    std::vector<uint64_t> bits;
    for (int i = 0; i < 64; i++) {
      // About one slot in eight live: many spans mesh, many pairs still overlap.
      uint64_t word = bitsRng.next() & bitsRng.next() & bitsRng.next();
      bits.push_back(word ? word : 1);
    }
    std::vector<Span*> candidates = makeSpans(bits);
    Rng rng(seed);
    MeshGroup groups[32];
    size_t found = SplitMesher::find(candidates.data(), candidates.size(), 16, rng, groups, 32);
    ASSERT_LE(found, 32u);
    std::set<Span*> seen;
    for (size_t g = 0; g < found; g++) {
      ASSERT_GE(groups[g].sourceCount, 1u);
      ASSERT_LE(groups[g].sourceCount, kMaxVirtualSpans - 1);
      uint64_t merged = bitsOf(groups[g].destination);
      EXPECT_TRUE(seen.insert(groups[g].destination).second) << "a span in two groups";
      for (uint32_t s = 0; s < groups[g].sourceCount; s++) {
        Span* source = groups[g].sources[s];
        EXPECT_EQ(merged & bitsOf(source), 0u)
            << "seed " << seed << ": group " << g << " source " << s << " overlaps";
        merged |= bitsOf(source);
        EXPECT_TRUE(seen.insert(source).second) << "a span in two groups";
      }
    }
  }
}

TEST_F(SplitMesherSearch, RespectsTheProbeLimit) {
  // 32 spans with one distinct slot each: every pair is meshable, so only the probe limit (and
  // the virtual-span table) bounds how many sources a destination takes.
  std::vector<uint64_t> bits;
  for (unsigned i = 0; i < 32; i++) bits.push_back(uint64_t{1} << i);
  for (size_t probes : {size_t{0}, size_t{1}, size_t{2}, size_t{5}}) {
    std::vector<Span*> candidates = makeSpans(bits);
    Rng rng(probes + 1);
    MeshGroup groups[16];
    size_t found = SplitMesher::find(candidates.data(), candidates.size(), probes, rng, groups, 16);
    if (probes == 0) {
      EXPECT_EQ(found, 0u);
      continue;
    }
    ASSERT_GE(found, 1u);
    for (size_t g = 0; g < found; g++)
      EXPECT_LE(groups[g].sourceCount, probes) << "probes " << probes << ", group " << g;
  }
  // Unlimited, the first destination takes sources until its table is full.
  std::vector<Span*> candidates = makeSpans(bits);
  Rng rng(99);
  MeshGroup groups[16];
  size_t found = SplitMesher::find(candidates.data(), candidates.size(), 1000, rng, groups, 16);
  ASSERT_GE(found, 1u);
  EXPECT_EQ(groups[0].sourceCount, kMaxVirtualSpans - 1);
}

// Spans of 4 pages, 16 slots a page (one bitmap word), as the live-page masks see them.
class SplitMesherPages : public SplitMesherSearch {
 protected:
  std::vector<Span*> makePagedSpans(const std::vector<uint64_t>& bits) {
    std::vector<Span*> spans = makeSpans(bits);
    for (Span* span : spans) {
      span->objectSize = static_cast<uint32_t>(Arena::pageSize() / 16);
      span->spanPages = 4;
    }
    return spans;
  }
  static uint64_t slot(unsigned page, unsigned index) { return uint64_t{1} << (page * 16 + index); }
  // Searches spans with `bits` (one group) under 64 seeds and expects each to pair exactly the
  // spans `pair`, except where `skipLeft` went left (the search's halves are random: a span on
  // the left that can only take one partner says nothing). Expects more than 8 seeds checked.
  void expectPairUnlessLeft(const std::vector<uint64_t>& bits, uint64_t skipLeft,
                            const std::set<uint64_t>& pair) {
    unsigned checked = 0;
    for (uint64_t seed = 1; seed <= 64; seed++) {
      std::vector<Span*> candidates = makePagedSpans(bits);
      Rng rng(seed);
      MeshGroup groups[1];
      size_t found = SplitMesher::find(candidates.data(), candidates.size(), 64, rng, groups, 1);
      if (bitsOf(candidates[0]) == skipLeft) continue;
      checked++;
      ASSERT_EQ(found, 1u) << "seed " << seed;
      ASSERT_EQ(groups[0].sourceCount, 1u);
      std::set<uint64_t> got = {bitsOf(groups[0].destination), bitsOf(groups[0].sources[0])};
      EXPECT_EQ(got, pair) << "seed " << seed;
    }
    EXPECT_GT(checked, 8u);
  }
};

TEST_F(SplitMesherPages, PrefersAPartnerSharingPagesToOneSharingNone) {
  // b's objects lie on page 2 only, c's on pages 0 and 2, and b and c overlap: a (page 0) meshes
  // with c, which shares page 0, not with b, which shares none.
  const uint64_t kA = slot(0, 0), kB = slot(2, 5), kC = slot(0, 4) | slot(2, 5);
  expectPairUnlessLeft({kA, kB, kC}, kB, {kA, kC});  // b on the left can only take a
}

TEST_F(SplitMesherPages, MeshesSpansSharingNoPageWhenNothingElseFits) {
  // Disjoint, with a's objects on page 0 and b's on page 2: no page comes back now, but b's free
  // slots leave the heap, so later allocations fill fewer pages.
  for (uint64_t seed = 1; seed <= 16; seed++) {
    std::vector<Span*> candidates = makePagedSpans({slot(0, 3), slot(2, 5)});
    Rng rng(seed);
    MeshGroup groups[1];
    EXPECT_EQ(SplitMesher::find(candidates.data(), candidates.size(), 64, rng, groups, 1), 1u)
        << "seed " << seed;
  }
}

TEST_F(SplitMesherPages, ASpanInTheFileSharesEveryPage) {
  // a is meshed already: its file keeps every page that held a live object since, so b (pages 1
  // and 2) shares pages with it as much as c (pages 0 and 1) does, though only c shares a's live
  // page. b and c overlap, so a takes one of them: b for the seeds that probe it first.
  MeshInfo info{};
  info.aliasCount = 1;
  const uint64_t kA = slot(0, 0), kB = slot(1, 9) | slot(2, 5), kC = slot(0, 4) | slot(1, 9);
  unsigned tookB = 0, tookC = 0;
  for (uint64_t seed = 1; seed <= 64; seed++) {
    std::vector<Span*> candidates = makePagedSpans({kA, kB, kC});
    candidates[0]->mesh = &info;
    Rng rng(seed);
    MeshGroup groups[1];
    size_t found = SplitMesher::find(candidates.data(), candidates.size(), 64, rng, groups, 1);
    if (candidates[0]->mesh != &info) continue;  // a is not on the left
    ASSERT_EQ(found, 1u) << "seed " << seed;
    ASSERT_EQ(groups[0].sourceCount, 1u);
    // The chain stays put: the unmeshed span moves onto it.
    EXPECT_EQ(groups[0].destination->mesh, &info) << "seed " << seed;
    tookB += bitsOf(groups[0].sources[0]) == kB;
    tookC += bitsOf(groups[0].sources[0]) == kC;
  }
  EXPECT_GT(tookB, 0u);
  EXPECT_GT(tookC, 0u);
}

TEST_F(SplitMesherPages, TakesThePartnerSharingTheMostPages) {
  // a (pages 0 and 1) meshes with d, whose objects lie on the same two pages, rather than with e
  // (pages 0 and 2), which also fits a but shares one page and overlaps d.
  const uint64_t kA = slot(0, 0) | slot(1, 0), kD = slot(0, 1) | slot(1, 2),
                 kE = slot(0, 1) | slot(2, 0);
  expectPairUnlessLeft({kA, kE, kD}, kE, {kA, kD});  // e on the left can only take a
}

// The search's one-word page mask (livePageWord) says what livePages says, in every class whose
// spans have at most 64 pages, for random bitmaps from sparse to full.
TEST(LivePageWord, AgreesWithLivePagesInEveryClass) {
  const size_t pageSize = Arena::pageSize();
  SizeClasses::init(pageSize);
  Rng rng(11);
  unsigned compared = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const SpanPlan& plan = SizeClasses::plan(c);
    if (plan.pages > 64) continue;
    std::vector<uint64_t> storage((Span::bytesFor(plan.objectCount) + 7) / 8 + 8);
    uintptr_t aligned = (reinterpret_cast<uintptr_t>(storage.data()) + 63) & ~uintptr_t{63};
    Span* span = new (reinterpret_cast<void*>(aligned)) Span();
    span->objectSize = plan.objectSize;
    span->objectCount = plan.objectCount;
    span->spanPages = plan.pages;
    size_t words = span->bitmap().words();
    for (int trial = 0; trial < 64; trial++) {
      std::vector<uint64_t> bits(words);
      for (size_t w = 0; w < words; w++) {
        uint64_t word = rng.next();
        for (int thin = 0; thin < trial % 6; thin++) word &= rng.next();
        if (w == words - 1 && plan.objectCount % 64)
          word &= (uint64_t{1} << plan.objectCount % 64) - 1;
        bits[w] = word;
        span->bitmap().storeWord(w, word);
      }
      ASSERT_EQ(livePageWord(span, bits.data(), pageSize), livePages(span, pageSize).words[0])
          << "class " << plan.objectSize << ", trial " << trial;
      compared++;
    }
  }
  EXPECT_GT(compared, 0u);
}

TEST_F(SplitMesherSearch, RespectsMaxGroups) {
  std::vector<uint64_t> bits;
  for (unsigned i = 0; i < 32; i++) bits.push_back(uint64_t{1} << i);
  std::vector<Span*> candidates = makeSpans(bits);
  Rng rng(5);
  MeshGroup groups[3];
  EXPECT_EQ(SplitMesher::find(candidates.data(), candidates.size(), 1, rng, groups, 3), 3u);
}

}  // namespace
}  // namespace meshalloc
