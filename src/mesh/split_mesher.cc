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
    uint32_t room = kMaxVirtualSpans - 1 - (destination->mesh ? destination->mesh->aliasCount : 0);
    if (room == 0) continue;
    AtomicBitmap dst = destination->bitmap();
    for (size_t w = 0; w < words; w++) merged[w] = dst.loadWord(w);
    MeshGroup& group = groups[found];
    group.destination = destination;
    group.sourceCount = 0;
    size_t limit = probes < rightCount ? probes : rightCount;
    for (size_t p = 0; p < limit && group.sourceCount < room; p++) {
      size_t r = (i + p) % rightCount;
      MiniHeap* source = right[r];
      // A span already backing others stays a destination: its aliases cannot follow it.
      if (!source || source->mesh) continue;
      AtomicBitmap src = source->bitmap();
      bool fits = true;
      for (size_t w = 0; w < words && fits; w++) fits = (merged[w] & src.loadWord(w)) == 0;
      if (!fits) continue;
      for (size_t w = 0; w < words; w++) merged[w] |= src.loadWord(w);
      group.sources[group.sourceCount++] = source;
      right[r] = nullptr;
    }
    if (group.sourceCount > 0) found++;
  }
  return found;
}

}  // namespace meshalloc
