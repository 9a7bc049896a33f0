// Heap-wide statistics, gathered on demand (never maintained on the fast path).
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/global_heap.h"
#include "heap/size_class.h"

namespace meshalloc::api {

struct HeapStats {
  size_t allocated;       // bytes in live objects, at their size class
  size_t active;          // bytes of spans and large objects handed out
  size_t resident;        // active + retained + metadata: an upper bound on what the heap holds
  size_t mapped;          // address space committed to the heap (same terms as resident)
  size_t reserved;        // address space reserved in segments
  size_t metadata;        // the allocator's own bookkeeping
  size_t retained;        // empty spans kept committed in the dirty cache
  size_t largeAllocated;  // bytes in large objects
  size_t largeCount;
  size_t threadHeaps;
  size_t segments;
  uint64_t purgedTotal;
  SizeClassStats classes[kNumSizeClasses];
};

HeapStats collectStats();
// Writes the report (text or JSON) to a file descriptor; never allocates.
void writeStats(int fd, bool json);

}  // namespace meshalloc::api
