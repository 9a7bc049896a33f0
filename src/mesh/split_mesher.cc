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

// The pages of `span` a mesh can give back, as far as the search can tell. A span in the shared
// file keeps every page that held a live object since it was meshed (nothing punches them when
// those objects die), so all its pages count: taking it as a source frees its file pages whatever
// lies on them, and a partner's objects may land on pages resident there though free.
uint64_t pagesHeld(const Span* span, const uint64_t* bits) {
  if (span->mesh == nullptr) return livePageWord(span, bits, Arena::pageSize());
  size_t pages = span->spanPages;
  return pages == 0 || pages >= 64 ? ~uint64_t{0} : (uint64_t{1} << pages) - 1;
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
    gPages[c] = pagesHeld(candidates[c], gBits + c * words);
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
    auto fitsGroup = [&](size_t r) {
      // A span already meshed brings all its virtual spans along (see Mesher::meshGroup).
      if (gUsed[r] || gViews[r] > room) return false;
      const uint64_t* bits = gBits + r * words;
      for (size_t w = 0; w < words; w++) {
        if (merged[w] & bits[w]) return false;
      }
      return true;
    };
    auto take = [&](size_t r) {
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
        return;
      }
      MESHALLOC_ASSERT(group.sourceCount < kMaxVirtualSpans - 1);
      group.sources[group.sourceCount++] = candidates[r];
      room -= views;
    };
    // A mesh gives back at once exactly the pages on which both sides hold live objects (the
    // others are trimmed, or holes in the file, either way: docs/meshing.md), so the partners
    // sharing pages with the group come first. A disjoint span whose live pages all lie on the
    // group's is taken as the scan meets it (with one-page spans, every disjoint span: one scan,
    // a first fit). Of the others, the one sharing the most pages is taken after the scan, and
    // the group grown by it is scanned again. One sharing none is still taken when nothing
    // better fits: it gives back no page now, but its free slots are gone from the heap, so a
    // program that keeps allocating fills fewer pages (refusing those meshes left Redis LRU's
    // mean PSS 4-14 MiB higher, docs/meshing.md).
    for (bool rescan = true; rescan && room > 0;) {
      rescan = false;
      size_t best = 0;
      int bestGain = -1;
      for (size_t p = 0; p < limit && room > 0; p++) {
        size_t r = half + (i + p) % rightCount;
        if (!fitsGroup(r)) continue;
        int gain = __builtin_popcountll(mergedPages & gPages[r]);
        if (gain > 0 && gain == __builtin_popcountll(gPages[r])) {
          take(r);
        } else if (gain > bestGain) {
          best = r;
          bestGain = gain;
        }
      }
      // Spans taken after it may have made the best one overlap the group.
      if (bestGain >= 0 && room > 0 && fitsGroup(best)) {
        take(best);
        rescan = true;
      }
    }
    // A group's virtual spans all fit one physical span's table (room never went below zero).
    MESHALLOC_ASSERT(room <= kMaxVirtualSpans);
    if (group.sourceCount > 0) found++;
  }
  return found;
}

}  // namespace meshalloc
