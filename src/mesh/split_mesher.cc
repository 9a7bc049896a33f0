#include "mesh/split_mesher.h"

namespace meshalloc {

bool SplitMesher::disjoint(MiniHeap* a, MiniHeap* b) {
  AtomicBitmap x = a->bitmap();
  AtomicBitmap y = b->bitmap();
  for (size_t w = 0; w < x.words(); w++) {
    if (x.loadWord(w) & y.loadWord(w)) return false;
  }
  return true;
}

size_t SplitMesher::find(MiniHeap** candidates, size_t count, size_t probes, Rng& rng,
                         MeshGroup* groups, size_t maxGroups) {
  if (count < 2 || maxGroups == 0) return 0;
  size_t words = candidates[0]->bitmap().words();
  if (words > kMaxBitmapWords) return 0;
  for (size_t i = count; i > 1; i--) {  // Fisher-Yates: the split is random
    size_t j = rng.below(static_cast<uint32_t>(i));
    MiniHeap* t = candidates[i - 1];
    candidates[i - 1] = candidates[j];
    candidates[j] = t;
  }
  size_t half = count / 2;
  MiniHeap** left = candidates;
  MiniHeap** right = candidates + half;
  size_t rightCount = count - half;
  // A used right-hand span is replaced by nullptr so later probes skip it.
  size_t found = 0;
  uint64_t merged[kMaxBitmapWords];
  for (size_t i = 0; i < half && found < maxGroups; i++) {
    MiniHeap* destination = left[i];
    uint32_t room = kMaxVirtualSpans - SpanBacking::virtualSpans(destination);
    if (room == 0) continue;
    AtomicBitmap dst = destination->bitmap();
    for (size_t w = 0; w < words; w++) merged[w] = dst.loadWord(w);
    MeshGroup& group = groups[found];
    group.destination = destination;
    group.sourceCount = 0;
    size_t limit = probes < rightCount ? probes : rightCount;
    for (size_t p = 0; p < limit && room > 0; p++) {
      size_t r = (i + p) % rightCount;
      MiniHeap* source = right[r];
      // A span already meshed brings all its virtual spans along (see Mesher::meshGroup).
      if (!source) continue;
      uint32_t views = SpanBacking::virtualSpans(source);
      if (views > room) continue;
      AtomicBitmap src = source->bitmap();
      bool fits = true;
      for (size_t w = 0; w < words && fits; w++) fits = (merged[w] & src.loadWord(w)) == 0;
      if (!fits) continue;
      for (size_t w = 0; w < words; w++) merged[w] |= src.loadWord(w);
      right[r] = nullptr;
      uint32_t destinationViews = SpanBacking::virtualSpans(group.destination);
      if (group.sourceCount == 0 && views > destinationViews) {
        // Every virtual span of a source costs mapping calls to move, so the pair's larger
        // chain stays put and the smaller one moves onto it.
        group.sources[group.sourceCount++] = group.destination;
        group.destination = source;
        room = kMaxVirtualSpans - views - destinationViews;
        continue;
      }
      group.sources[group.sourceCount++] = source;
      room -= views;
    }
    if (group.sourceCount > 0) found++;
  }
  return found;
}

}  // namespace meshalloc
