// SplitMesher (Mesh, PLDI'19 §4.2): randomly split the candidate spans of one size class into
// two halves and probe each span of the left half against at most `probes` spans of the right
// half, looking for allocation bitmaps that do not overlap. Unlike the paper's pairs, a
// destination keeps absorbing sources while the union of their bitmaps stays disjoint, so one
// physical span can back several virtual spans.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/span.h"
#include "mesh/span_backing.h"
#include "support/rng.h"

namespace meshalloc {

struct MeshGroup {
  Span* destination;
  uint32_t sourceCount;
  Span* sources[kMaxVirtualSpans - 1];
};

class SplitMesher {
 public:
  // The largest bitmap (in 64-bit words) the search handles; larger spans are not meshed.
  static constexpr size_t kMaxBitmapWords = 256;

  // Finds groups among `candidates` (reordered in place). Returns the number written to
  // `groups` (at most maxGroups). A span appears in at most one group.
  static size_t find(Span** candidates, size_t count, size_t probes, Rng& rng, MeshGroup* groups,
                     size_t maxGroups);

  // True if no slot is allocated in both.
  static bool disjoint(Span* a, Span* b);
};

}  // namespace meshalloc
