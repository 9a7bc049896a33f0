#include "mesh/split_mesher.h"

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
// virtual-span counts) are copied once into this dense scratch instead. Passes are serialised,
// so one static buffer serves them all.
constexpr size_t kScratchWords = 16384;
uint64_t gBits[kScratchWords];
uint8_t gViews[kScratchWords];
bool gUsed[kScratchWords];
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
    MeshGroup& group = groups[found];
    group.destination = candidates[i];
    group.sourceCount = 0;
    size_t limit = probes < rightCount ? probes : rightCount;
    for (size_t p = 0; p < limit && room > 0; p++) {
      size_t r = half + (i + p) % rightCount;
      // A span already meshed brings all its virtual spans along (see Mesher::meshGroup).
      uint32_t views = gViews[r];
      if (gUsed[r] || views > room) continue;
      const uint64_t* bits = gBits + r * words;
      bool fits = true;
      for (size_t w = 0; w < words && fits; w++) fits = (merged[w] & bits[w]) == 0;
      if (!fits) continue;
      for (size_t w = 0; w < words; w++) merged[w] |= bits[w];
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
