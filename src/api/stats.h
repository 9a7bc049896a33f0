// Heap-wide statistics, gathered on demand (never maintained on the fast path).
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/global_heap.h"
#include "heap/size_class.h"

namespace meshalloc::api {

// "Where every byte goes" (docs/memory.md): the process's memory split into components, in
// bytes. This list is the only place that names them: the struct below, the mallctl names
// (`stats.breakdown.<name>`), the exit report (text and JSON, whose "breakdown_components"
// carries the rest of each line for the `meshalloc` command) are all generated from it.
//
// X(field, name, group, inHeap, basis, description):
//   group   the column the `meshalloc` command adds it to (components of one kind share one);
//   inHeap  1 if it is part of heap_total, the heap's share of the process's memory;
//   basis   "counted": the heap's bookkeeping of memory it has committed (pages it handed out
//           or cached, whether or not they were ever touched, so an upper bound on what is
//           resident); "resident": pages the kernel reports present (mincore, /proc);
//           "derived": arithmetic on the others; "address": address space, not memory.
// The detached-free lines are GlobalHeap::kOccupancyBins of them (checked in stats.cc).
#define MESHALLOC_BREAKDOWN_COMPONENTS(X)                                                   \
  X(smallLive, "small_live", "live", 1, "counted",                                          \
    "live small objects at their size class (requested sizes of small objects are not "     \
    "recorded)")                                                                            \
  X(attachedFree, "attached_free", "attached_free", 1, "counted",                           \
    "free slots of spans attached to threads, slots in shuffle vectors and recycled rings " \
    "included")                                                                             \
  X(detachedFree0, "detached_free_0", "detached_free", 1, "counted",                        \
    "free slots of detached partial spans now under 25 % full")                             \
  X(detachedFree1, "detached_free_1", "detached_free", 1, "counted",                        \
    "free slots of detached partial spans now 25-50 % full")                                \
  X(detachedFree2, "detached_free_2", "detached_free", 1, "counted",                        \
    "free slots of detached partial spans now 50-75 % full")                                \
  X(detachedFree3, "detached_free_3", "detached_free", 1, "counted",                        \
    "free slots of detached partial spans now over 75 % full")                              \
  X(spanTail, "span_tail", "other", 1, "counted", "the ends of spans past their last slot") \
  X(inTransit, "in_transit", "other", 1, "counted",                                         \
    "spans in no list at the snapshot (taken by the mesher, or changing hands)")            \
  X(dirtyCache, "dirty_cache", "dirty", 1, "counted",                                       \
    "freed runs of pages kept committed for reuse (the dirty cache)")                       \
  X(largeLive, "large_live", "large", 1, "counted", "large objects: the bytes requested")   \
  X(largeSlack, "large_slack", "large", 1, "counted",                                       \
    "large objects: their pages beyond the bytes requested")                                \
  X(handlesLive, "handles_live", "handles", 1, "counted",                                   \
    "live handle objects at their size class, large ones at their usable bytes")            \
  X(handlesFree, "handles_free", "handles", 1, "counted",                                   \
    "the handle store beyond its live objects: free slots, bookkeeping, spare chunks")      \
  X(handlesTable, "handles_table", "handles", 1, "counted",                                 \
    "the handle table, 16 + 4 bytes per handle at the high-water mark")                     \
  X(pageMaps, "page_maps", "metadata", 1, "resident",                                       \
    "page maps, compact class maps and their top-level tables")                             \
  X(spanRecords, "span_records", "metadata", 1, "counted",                                  \
    "span records (Span) and their bitmaps")                                                \
  X(threadHeaps, "thread_heaps", "metadata", 1, "resident",                                 \
    "thread heaps (shuffle vectors, span tables)")                                          \
  X(internalOther, "internal_other", "metadata", 1, "counted",                              \
    "the rest of the internal heap: run, segment and mesh records, pooled free blocks")     \
  X(heapTotal, "heap_total", "heap_total", 0, "derived", "the sum of the components above") \
  X(meshSaving, "mesh_saving", "mesh_saving", 0, "counted",                                 \
    "memory meshing saves now: spans mapping another span's physical pages (not in the "    \
    "sum: no memory)")                                                                      \
  X(meshTrimmed, "mesh_trimmed", "mesh_trimmed", 0, "counted",                              \
    "free slots of detached spans on pages given back (not in detached_free)")              \
  X(retiredMeshed, "retired_meshed", "retired_meshed", 0, "address",                        \
    "meshed spans that died, memory returned, address space not yet remapped")              \
  X(pageTables, "page_tables", "page_tables", 0, "resident",                                \
    "the process's page tables (VmPTE): charged by the kernel, not part of PSS")            \
  X(pss, "pss", "pss", 0, "resident", "the process's proportional set size (smaps_rollup)") \
  X(outsideHeap, "outside_heap", "outside_heap", 0, "derived",                              \
    "PSS minus heap_total: program text and data, libraries, stacks, other mappings "       \
    "(negative when the heap's counted pages were never touched)")                          \
  X(charged, "charged", "charged", 0, "derived", "PSS plus page tables")

struct MemoryBreakdown {
#define MESHALLOC_BREAKDOWN_FIELD(field, name, group, inHeap, basis, description) int64_t field;
  MESHALLOC_BREAKDOWN_COMPONENTS(MESHALLOC_BREAKDOWN_FIELD)
#undef MESHALLOC_BREAKDOWN_FIELD
};

// One component's line of the list, for the writers and mallctl.
struct BreakdownComponent {
  const char* name;
  const char* group;
  bool inHeap;
  const char* basis;
  const char* description;
  int64_t MemoryBreakdown::*field;
};
extern const BreakdownComponent kBreakdownComponents[];
extern const size_t kBreakdownComponentCount;

// The handle layer's statistics (docs/handles.md#statistics), read when asked: one list for
// mallctl's "handles.<name>" and the report's "handles" section.
struct HandleStatistic {
  const char* name;
  uint64_t value;
};
constexpr size_t kHandleStatisticCount = 23;
void collectHandleStatistics(HandleStatistic (&out)[kHandleStatisticCount]);

// Computed on demand, never maintained on the fast path: walks the global heap's lists, every
// thread heap and the arena's maps, and reads /proc/self/status and /proc/self/smaps_rollup
// (the latter walks every mapping). Milliseconds, not microseconds. Never allocates.
MemoryBreakdown collectBreakdown();

// The heap's counters, in bytes unless named otherwise: the one place that declares them. The
// struct below, the mallctl names (`ctlName`) and the exit report's lines (`reportName`, text
// and JSON "stats", which the `meshalloc` command reads) are generated from it; collectStats()
// fills them in.
// X(field, ctlName, reportName, description)
#define MESHALLOC_HEAP_STATISTICS(X)                                                           \
  X(allocated, "stats.allocated", "allocated", "bytes in live objects, at their size class")   \
  X(active, "stats.active", "active", "bytes of spans and large objects handed out")           \
  X(resident, "stats.resident", "resident",                                                    \
    "active + retained + metadata: an upper bound on what the heap holds")                     \
  X(mapped, "stats.mapped", "mapped", "address space committed to the heap (as resident)")     \
  X(reserved, "stats.reserved", "reserved", "address space reserved in segments")              \
  X(metadata, "stats.metadata", "metadata", "the allocator's own bookkeeping")                 \
  X(retained, "stats.retained", "retained", "empty spans kept committed in the dirty cache")   \
  X(largeAllocated, "stats.large.allocated", "large_allocated", "bytes in large objects")      \
  X(largeCount, "stats.large.count", "large_count", "large objects")                           \
  X(threadHeaps, "stats.thread_heaps", "thread_heaps", "thread heaps in use")                  \
  X(idleReclaims, "stats.idle_reclaims", "idle_reclaims",                                      \
    "heaps taken back from threads parked in a wait (docs/heap.md)")                           \
  X(segments, "stats.segments", "segments", "arena segments")                                  \
  X(purgedTotal, "stats.purged_total", "purged_total", "bytes decommitted since start")        \
  X(meshCount, "mesh.count", "mesh_count", "virtual spans meshed away since start")            \
  X(meshReleased, "mesh.released", "mesh_released", "physical bytes meshing saves now")        \
  X(meshReleasedPeak, "mesh.released_peak", "mesh_released_peak", "the peak of the above")     \
  X(meshedSpans, "mesh.meshed_spans", "meshed_spans",                                          \
    "physical spans backing more than one virtual span")                                       \
  X(meshAliases, "mesh.aliases", "mesh_aliases", "virtual spans mapping another span's pages") \
  X(meshRetired, "mesh.retired", "mesh_retired",                                               \
    "meshed spans that died, memory returned, not yet remapped private")                       \
  X(mappings, "mesh.mappings", "mappings",                                                     \
    "lines of /proc/self/maps now (bounded by vm.max_map_count)")                              \
  X(mappingLimit, "mesh.mapping_limit", "mapping_limit", "the mappings meshing stays under")   \
  X(meshPasses, "mesh.passes", "mesh_passes", "mesh passes")                                   \
  X(meshMappingLimitedPasses, "mesh.mapping_limited_passes", "mesh_mapping_limited_passes",    \
    "passes cut short by the mapping budget")                                                  \
  X(meshFailed, "mesh.failed", "mesh_failed", "meshes that backed off (a system call failed)") \
  X(meshStranded, "mesh.stranded", "mesh_stranded",                                            \
    "virtual spans left on another span's pages by a failed undo (pinned for good)")           \
  X(meshUnprotectCopies, "mesh.unprotect_copies", "mesh_unprotect_copies",                     \
    "write protections mprotect refused to undo, replaced by a private copy (pinned)")         \
  X(meshSkippedForIo, "mesh.skipped_for_io", "mesh_skipped_for_io",                            \
    "meshes skipped: a span held a buffer of I/O in flight")                                   \
  X(meshTrimmedTotal, "mesh.trimmed_total", "mesh_trimmed_total",                              \
    "free slots' pages of unpaired mesh candidates given back since start")                    \
  X(meshTrimCalls, "mesh.trim_calls", "mesh_trim_calls", "the madvise calls that did it")      \
  X(pauseCount, "mesh.pauses", "mesh_pauses", "guarded operations held up by meshing")         \
  X(pauseTotalNs, "mesh.pause_total_ns", "mesh_pause_total_ns", "their total time")            \
  X(pauseMaxNs, "mesh.pause_max_ns", "mesh_pause_max_ns",                                      \
    "the longest (remote frees, realloc, malloc_usable_size)")                                 \
  X(pauseWaitMaxNs, "mesh.pause_wait_max_ns", "mesh_pause_wait_max_ns",                        \
    "of the longest, the time waiting for guarded operations in flight")                       \
  X(barrierMaxNs, "mesh.barrier_max_ns", "mesh_barrier_max_ns",                                \
    "the longest a write into a span being meshed could wait (its copy and remapping)")        \
  X(meshCpuNs, "mesh.cpu_ns", "mesh_cpu_ns", "CPU time spent meshing")                         \
  X(meshRestoreCpuNs, "mesh.restore_cpu_ns", "mesh_restore_cpu_ns",                            \
    "CPU time remapping meshed spans that died")                                               \
  X(barrierFaults, "mesh.barrier_faults", "barrier_faults",                                    \
    "writes that waited on the write barrier")                                                 \
  X(pinnedSpans, "mesh.pinned_spans", "pinned_spans",                                          \
    "spans never meshed (buffers glibc has the kernel fill; stranded spans)")

struct HeapStats {
#define MESHALLOC_HEAP_STATISTIC_FIELD(field, ctlName, reportName, description) uint64_t field;
  MESHALLOC_HEAP_STATISTICS(MESHALLOC_HEAP_STATISTIC_FIELD)
#undef MESHALLOC_HEAP_STATISTIC_FIELD
  SizeClassStats classes[kNumSizeClasses];
};

// One counter's line of the list, for the writers and mallctl.
struct HeapStatistic {
  const char* ctlName;
  const char* reportName;
  const char* description;
  uint64_t HeapStats::*field;
};
extern const HeapStatistic kHeapStatistics[];
extern const size_t kHeapStatisticCount;

HeapStats collectStats();
// Writes the report (text or JSON) to a file descriptor; never allocates.
void writeStats(int fd, bool json);
// The report's file name for this process: `pattern` with "%p" replaced by `pid` and "%%" by
// "%", so that every process of a preloaded tree (a shell, its children) writes its own file.
// False if the result does not fit in `capacity` bytes.
bool expandStatsPath(const char* pattern, long pid, char* out, size_t capacity);

}  // namespace meshalloc::api
