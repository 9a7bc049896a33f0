// Address ranges: the one overlap test that the mesher's I/O check and the write barrier's
// span list share.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

// Whether [start, start + bytes) and [otherStart, otherEnd) share a byte.
inline bool rangesOverlap(uintptr_t start, size_t bytes, uintptr_t otherStart, uintptr_t otherEnd) {
  return otherStart < start + bytes && start < otherEnd;
}

}  // namespace meshalloc
