// Which pages of a span hold (part of) a live object, from its allocation bitmap. Meshing copies
// only those pages into the shared file (mesh/span_backing.cc), and the mesher gives the others
// back to the kernel in spans it cannot pair (mesh/mesher.cc, trimFreePages); the search prefers
// partners whose objects lie on the same pages (mesh/split_mesher.cc).
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

// livePages as one word, from a copy of the span's bitmap (`bits`), for the mesh search's scratch
// (mesh/split_mesher.cc): for each page, whether a slot overlapping it is live, a test of a range
// of bits, so the cost goes with the pages rather than the live objects. Spans of more than 64
// pages, and records without a layout, get every bit.
inline uint64_t livePageWord(const Span* span, const uint64_t* bits, size_t pageSize) {
  size_t pages = span->spanPages, objectSize = span->objectSize, objects = span->objectCount;
  if (objectSize == 0 || pages == 0 || pages > 64 || objects == 0) return ~uint64_t{0};
  uint64_t mask = 0;
  for (size_t page = 0; page < pages; page++) {
    size_t first = page * pageSize / objectSize;
    size_t last = ((page + 1) * pageSize - 1) / objectSize;
    if (first >= objects) break;  // the span's tail
    if (last >= objects) last = objects - 1;
    for (size_t w = first / 64; w <= last / 64; w++) {
      uint64_t word = bits[w];
      if (w == first / 64) word &= ~uint64_t{0} << (first % 64);
      if (w == last / 64 && last % 64 != 63) word &= (uint64_t{1} << (last % 64 + 1)) - 1;
      if (word) {
        mask |= uint64_t{1} << page;
        break;
      }
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
