// Which pages of a span hold (part of) a live object, from its allocation bitmap. Meshing copies
// only those pages into the shared file (mesh/span_backing.cc), and the mesher gives the others
// back to the kernel in spans it cannot pair (mesh/mesher.cc, trimFreePages).
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/size_class.h"
#include "heap/span.h"

namespace meshalloc {

// One bit per page of a span.
struct PageMask {
  uint64_t words[(kMaxSpanPages + 63) / 64];
  bool has(size_t page) const { return (words[page / 64] >> (page % 64)) & 1; }
  void add(size_t page) { words[page / 64] |= uint64_t{1} << (page % 64); }
};

// The pages that hold part of a live slot. Read from the bitmap as it is now: the caller makes
// sure no slot can be handed out meanwhile (the span is detached and held).
inline PageMask livePages(Span* span, size_t pageSize) {
  PageMask mask = {};
  AtomicBitmap bitmap = span->bitmap();
  size_t objectSize = span->objectSize;
  for (size_t w = 0; w < bitmap.words(); w++) {
    uint64_t bits = bitmap.loadWord(w);
    while (bits) {
      size_t slot = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      bits &= bits - 1;
      size_t last = (slot * objectSize + objectSize - 1) / pageSize;
      for (size_t page = slot * objectSize / pageSize; page <= last; page++) mask.add(page);
    }
  }
  return mask;
}

// Calls fn(firstPage, pageCount) for each run of consecutive pages of the first `pages` whose
// bit is `value`.
template <typename Fn>
void forEachRun(const PageMask& mask, size_t pages, bool value, Fn fn) {
  size_t page = 0;
  while (page < pages) {
    if (mask.has(page) != value) {
      page++;
      continue;
    }
    size_t first = page;
    while (page < pages && mask.has(page) == value) page++;
    fn(first, page - first);
  }
}

}  // namespace meshalloc
