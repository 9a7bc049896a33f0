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
  uint64_t idleReclaims;  // heaps taken back from threads parked in a wait (docs/heap.md)
  size_t segments;
  uint64_t purgedTotal;
  // Meshing (see docs/meshing.md).
  uint64_t meshCount;   // virtual spans meshed away since start
  size_t meshReleased;  // physical bytes meshing saves right now
  size_t meshReleasedPeak;
  size_t meshedSpans;   // physical spans backing more than one virtual span
  size_t meshAliases;   // virtual spans mapping another span's memory
  size_t meshRetired;   // meshed spans that died, memory returned, not yet remapped private
  size_t mappings;      // lines of /proc/self/maps now (bounded by vm.max_map_count)
  size_t mappingLimit;  // what meshing stays under
  uint64_t meshPasses;
  uint64_t meshFailed;
  uint64_t meshStranded;
  uint64_t meshSkippedForIo;
  uint64_t pauseCount;
  uint64_t pauseTotalNs;
  uint64_t pauseMaxNs;      // guarded operations (remote frees, realloc, ...) held up
  uint64_t pauseWaitMaxNs;  // of that pause, waiting for guarded operations in flight
  uint64_t barrierMaxNs;    // a write into a span being meshed held up (longest batch)
  uint64_t meshCpuNs;
  uint64_t meshRestoreCpuNs;  // the background thread remapping meshed spans that died
  uint64_t barrierFaults;     // writes that waited on the write barrier
  size_t pinnedSpans;         // spans never meshed: they hold buffers glibc has the kernel fill
  SizeClassStats classes[kNumSizeClasses];
};

HeapStats collectStats();
// Writes the report (text or JSON) to a file descriptor; never allocates.
void writeStats(int fd, bool json);
// The report's file name for this process: `pattern` with "%p" replaced by `pid` and "%%" by
// "%", so that every process of a preloaded tree (a shell, its children) writes its own file.
// False if the result does not fit in `capacity` bytes.
bool expandStatsPath(const char* pattern, long pid, char* out, size_t capacity);

}  // namespace meshalloc::api
