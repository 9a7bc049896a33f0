#include "mesh/split_mesher.h"

#include "heap/arena.h"
#include "mesh/page_mask.h"
#include "support/assert.h"

namespace meshalloc {

bool SplitMesher::disjoint(Span* a, Span* b) {
  AtomicBitmap x = a->bitmap();
  AtomicBitmap y = b->bitmap();
  for (size_t w = 0; w < x.words(); w++) {
    if (x.loadWord(w) & y.loadWord(w)) return false;
  }
  return true;
}

namespace {
// The search reads every candidate's bitmap once per probe; a cold span record is a cache miss,
// and 4096 candidates x 64 probes made the search a quarter of a pass's CPU. The bitmaps (and
// virtual-span counts, and live-page masks) are copied once into this dense scratch instead.
// Passes are serialised, so one static buffer serves them all.
constexpr size_t kScratchWords = 16384;
uint64_t gBits[kScratchWords];
uint64_t gPages[kScratchWords];
uint8_t gViews[kScratchWords];
bool gUsed[kScratchWords];

// The pages of `span` that hold part of a live object, one bit each, for spans of at most 64
// pages; every bit for a larger span (or a record without a layout, as in the unit tests), which
// makes every disjoint partner count as sharing every page.
uint64_t livePageBits(Span* span) {
  if (span->objectSize == 0 || span->spanPages == 0 || span->spanPages > 64) return ~uint64_t{0};
  return livePages(span, Arena::pageSize()).words[0];
}
}  // namespace

size_t SplitMesher::find(Span** candidates, size_t count, size_t probes, Rng& rng,
                         MeshGroup* groups, size_t maxGroups) {
  if (count < 2 || maxGroups == 0) return 0;
  size_t words = candidates[0]->bitmap().words();
  if (words > kMaxBitmapWords) return 0;
  rng.shuffle(candidates, count);  // the split is random
  // Beyond the scratch, a random subset (the shuffle's prefix) is searched; the rest wait for
  // the next round.
  if (count > kScratchWords / words) count = kScratchWords / words;
  for (size_t c = 0; c < count; c++) {
    AtomicBitmap bitmap = candidates[c]->bitmap();
    for (size_t w = 0; w < words; w++) gBits[c * words + w] = bitmap.loadWord(w);
    gPages[c] = livePageBits(candidates[c]);
    gViews[c] = static_cast<uint8_t>(SpanBacking::virtualSpans(candidates[c]));
    gUsed[c] = false;
  }
  size_t half = count / 2;
  size_t rightCount = count - half;
  size_t found = 0;
  uint64_t merged[kMaxBitmapWords];
  for (size_t i = 0; i < half && found < maxGroups; i++) {
    uint32_t destinationViews = gViews[i];
    uint32_t room = kMaxVirtualSpans - destinationViews;
    if (room == 0) continue;
    for (size_t w = 0; w < words; w++) merged[w] = gBits[i * words + w];
    uint64_t mergedPages = gPages[i];
    MeshGroup& group = groups[found];
    group.destination = candidates[i];
    group.sourceCount = 0;
    size_t limit = probes < rightCount ? probes : rightCount;
    while (room > 0) {
      // Of the disjoint spans among the probes, the one sharing the most live pages with the
      // group: a mesh gives back exactly the pages on which both sides hold live objects (the
      // others are trimmed or holes in the file either way, docs/meshing.md), so a partner whose
      // objects lie on other pages costs the mesh's system calls and mappings for nothing, and
      // takes itself away from a partner it would have shared pages with. A partner whose live
      // pages all lie on the group's is taken at once (with one-page spans, every partner).
      size_t best = 0;
      int bestGain = 0;
      for (size_t p = 0; p < limit; p++) {
        size_t r = half + (i + p) % rightCount;
        // A span already meshed brings all its virtual spans along (see Mesher::meshGroup).
        if (gUsed[r] || gViews[r] > room) continue;
        const uint64_t* bits = gBits + r * words;
        bool fits = true;
        for (size_t w = 0; w < words && fits; w++) fits = (merged[w] & bits[w]) == 0;
        if (!fits) continue;
        int gain = __builtin_popcountll(mergedPages & gPages[r]);
        if (gain > bestGain) {
          best = r;
          bestGain = gain;
          if (gain == __builtin_popcountll(gPages[r])) break;
        }
      }
      if (bestGain == 0) break;
      size_t r = best;
      uint32_t views = gViews[r];
      const uint64_t* bits = gBits + r * words;
      for (size_t w = 0; w < words; w++) merged[w] |= bits[w];
      mergedPages |= gPages[r];
      gUsed[r] = true;
      if (group.sourceCount == 0 && views > destinationViews) {
        // Every virtual span of a source costs mapping calls to move, so the pair's larger
        // chain stays put and the smaller one moves onto it.
        group.sources[group.sourceCount++] = group.destination;
        group.destination = candidates[r];
        room = kMaxVirtualSpans - views - destinationViews;
        destinationViews = views;
        continue;
      }
      MESHALLOC_ASSERT(group.sourceCount < kMaxVirtualSpans - 1);
      group.sources[group.sourceCount++] = candidates[r];
      room -= views;
    }
    // A group's virtual spans all fit one physical span's table (room never went below zero).
    MESHALLOC_ASSERT(room <= kMaxVirtualSpans);
    if (group.sourceCount > 0) found++;
  }
  return found;
}

}  // namespace meshalloc
