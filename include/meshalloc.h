/* meshalloc public interface.
 *
 * The allocator itself is used through the standard C and C++ entry points (malloc, free,
 * operator new, ...), either by linking with -lmeshalloc or with LD_PRELOAD=libmeshalloc.so.
 * This header adds introspection and control in the style of jemalloc's mallctl.
 */
#ifndef MESHALLOC_H
#define MESHALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Reads and/or writes the value called `name` (dotted, jemalloc style).
 *   oldp/oldlenp: where to store the current value and its size (both NULL to skip reading);
 *   newp/newlen:  the value to write (NULL/0 to skip writing, and for actions).
 * Returns 0 on success or an errno value: ENOENT for an unknown name, EINVAL for a size
 * mismatch, EPERM for writing a read-only value.
 *
 * Statistics are snapshots refreshed by writing (or reading) "epoch", as in jemalloc:
 *   "epoch"                       uint64_t  refresh the statistics snapshot
 *   "version"                     const char*
 *   "stats.allocated"             size_t    bytes in live objects (rounded to their size class)
 *   "stats.active"                size_t    bytes in spans holding at least one object
 *   "stats.resident"              size_t    bytes of physical memory the heap holds
 *   "stats.mapped"                size_t    bytes of address space committed to the heap
 *   "stats.metadata"              size_t    bytes used by the allocator's own bookkeeping
 *   "stats.retained"              size_t    bytes of empty spans kept for reuse (dirty cache)
 *   "stats.large.allocated"       size_t    bytes in objects larger than the biggest size class
 *   "arenas.narenas"              unsigned  always 1
 *   "arenas.nbins"                unsigned  number of small size classes
 *   "arenas.bin.<j>.size"         size_t    object size of class j
 *   "stats.arenas.<i>.bins.<j>.curslabs"  size_t  spans of class j
 *   "stats.arenas.<i>.bins.<j>.curregs"   size_t  live objects of class j
 *   "stats.classes.<j>.size|spans|objects" size_t same, under meshalloc's own names
 *   "mesh.count"                  uint64_t  successful meshes since start
 *   "mesh.released"               size_t    bytes currently released by meshing
 *   "mesh.released_peak"          size_t    high-water mark of the above
 *   "mesh.mappings"               size_t    memory mappings the heap currently uses
 *   "mesh.pauses" / "mesh.pause_total_ns" / "mesh.pause_max_ns"  uint64_t  the pauses of
 *                                 remote frees, realloc and malloc_usable_size while meshing
 *   "mesh.pause_wait_max_ns"      uint64_t  of the longest pause, the time spent waiting for
 *                                 guarded operations already in flight
 *   "mesh.barrier_max_ns"         uint64_t  the longest a write into a span being meshed
 *                                 could wait
 *   "mesh.pinned_spans"           size_t    spans never meshed: they hold buffers glibc's
 *                                 internal reads fill (stdio's), or a failed mesh left them
 *   "mesh.passes", "mesh.mapping_limited_passes", "mesh.failed", "mesh.stranded",
 *   "mesh.unprotect_copies", "mesh.skipped_for_io", "mesh.cpu_ns", "mesh.restore_cpu_ns",
 *   "mesh.barrier_faults",
 *   "stats.reserved", "stats.segments", "stats.purged_total", "stats.thread_heaps",
 *   "stats.idle_reclaims", "stats.large.count"   size_t  see docs/api.md
 *   "opt.<name>"                  the value of an option (see docs/options.md)
 * Handles (meshalloc_handle.h, docs/handles.md), uint64_t, read when asked (not at the epoch):
 *   "handles.live" / "handles.live_bytes"  live handle objects and their bytes (slot sizes)
 *   "handles.committed"           bytes of the arena the handle store holds
 *   "handles.table_bytes"         bytes of the handle table touched
 *   "handles.fragmentation_permille"  committed over live bytes, x 1000 (0 with nothing live)
 *   "handles.pinned"              handles pinned now
 *   "handles.moved" / "handles.moved_bytes"  objects and bytes the defragmenter moved
 *   "handles.moves_abandoned"     moves dropped because a pin arrived during the copy
 *   "handles.passes" / "handles.released" / "handles.cpu_ns"  defragmentation passes, the
 *                                 bytes they gave back to the OS, their CPU time
 *   "handles.pauses" / "handles.pause_total_ns" / "handles.pause_max_ns" /
 *   "handles.pause_p9999_ns"      waits of handle calls caused by the defragmenter (for a class
 *                                 lock a move held; no call waits for an entry a move holds),
 *                                 and their 99.99th percentile (a power of two of ns)
 *   "handles.lock_waits" / "handles.lock_wait_max_ns" / "handles.lock_wait_p9999_ns"  every
 *                                 other wait of a handle call (class locks other threads held,
 *                                 another thread's mh_realloc of the same handle)
 *   "handles.move_hold_max_ns"    the longest the defragmenter held a size class's lock
 *   "handles.budget_meshing_ns" / "handles.budget_handles_ns" / "handles.budget_ahead_ns"  the
 *                                 CPU budget meshing and the defragmenter share: the CPU time
 *                                 each charged to it, and how far its clock is ahead of the wall
 *                                 clock now (neither starts a pass before it has caught up)
 * Actions (no value): "arena.<i>.purge", "arena.<i>.decay", "thread.tcache.flush",
 *   "mesh.compact", "handles.compact" (a full pass; reads the bytes released as size_t).
 * Diagnostics: "debug.class_dump" (write an unsigned class index j) prints every span of
 *   class j on stderr: detached partial spans and each thread's attached spans, with live
 *   count, set bitmap bits, virtual spans, remote-free state and pinning.
 */
int meshalloc_mallctl(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen);

/* Meshes every size class now and returns empty memory to the OS. Returns the number of
 * bytes released. */
size_t meshalloc_compact(void);

/* Writes the statistics report to file descriptor `fd`, as text or (json != 0) JSON. */
void meshalloc_print_stats(int fd, int json);

#ifdef __cplusplus
}
#endif

#endif /* MESHALLOC_H */
