// The mesh operation and the pass that drives it: for each size class, take the sparsely
// occupied detached spans, find meshable groups (SplitMesher), and mesh them in small batches.
// A batch raises the write barrier for its own few spans' copy-and-remap, and pauses guarded
// heap operations only to switch the page map over, so pauses stay short; locks are never
// held across batches.
#pragma once

#include <cstddef>
#include <cstdint>

#include "mesh/split_mesher.h"

namespace meshalloc {

struct MeshStats {
  uint64_t passes;
  uint64_t meshedSpans;   // virtual spans meshed away (sources)
  uint64_t failedMeshes;  // a mapping call failed; the mesh was undone
  // A meshed source's virtual span could be moved neither on nor back; its slots are leaked in
  // the destination instead (see Mesher::absorbMeshedSource).
  uint64_t strandedSpans;
  // Write protections that mprotect could not undo, replaced by a private copy of the range
  // (Mesher::restoreWritable); the spans concerned are pinned.
  uint64_t unprotectCopies;
  uint64_t skippedForIo;  // spans left alone because a system call was writing into them
  // Bytes of free slots on pages given back to the kernel in candidates that stay (trimFreePages),
  // since start, and the madvise calls that did it.
  uint64_t trimmedBytes;
  uint64_t trimCalls;
  uint64_t vmaLimitedPasses;  // passes cut short by the mapping budget
  uint64_t pauseCount;
  uint64_t pauseTotalNs;
  uint64_t pauseMaxNs;
  // Of the longest pause, the part spent waiting for guarded operations already
  // in flight (a thread preempted inside one); the rest of a long pause is the mesher itself.
  uint64_t pauseWaitMaxNs;
  // The longest a span of a batch stayed write-protected: a thread writing into it may wait
  // this long (not for the whole batch: WriteBarrier::release).
  uint64_t barrierMaxNs;
  uint64_t cpuNs;  // time spent in passes, restores of retired spans excepted, batches included
  // Of it, batches run on the commit thread (Mesher::meshBatch) rather than the mesher's own.
  uint64_t batchCpuNs;
  // Remapping meshed spans that died, during passes: work the freeing threads would do
  // otherwise, so the CPU budget does not charge it to meshing.
  uint64_t restoreCpuNs;
  uint64_t lastMappingCount;  // /proc/self/maps lines at the last pass
  // Free bytes in detached partial spans (classes with two or more) when the last pass began:
  // what meshing could at best give back. The policy sets its CPU budget from it.
  uint64_t lastGainBytes;
  uint64_t mappingLimit;  // the budget meshing stays under
};

class Mesher {
 public:
  static constexpr size_t kMaxCandidatesPerClass = 4096;
  // Rounds per class and pass: each takes a fresh random split of the (remaining) candidates.
  static constexpr unsigned kMaxRoundsPerClass = 8;
  // Source spans meshed per batch (long chains are split across batches): bounds a pause to a
  // few copies and mapping calls.
  static constexpr size_t kSourcesPerBatch = 4;
  // Spans too full to mesh are trimmed only in classes with at most this many objects per page.
  static constexpr size_t kTrimObjectsPerPage = 4;
  // Mapping budget: stay this far under vm.max_map_count (the larger of the two).
  static constexpr long kMappingMarginMin = 1024;
  static constexpr long kMappingMarginDivisor = 8;
  // Worst case of new mappings one mesh can add (a remap splits its neighbour in two).
  static constexpr long kMappingsPerMesh = 2;
  // restoreWritable's retries before it gives up (1 ms apart): a refusal for lack of memory
  // may pass once other threads free some.
  static constexpr unsigned kRestoreAttempts = 100;
  static constexpr uint64_t kRestoreRetryNs = 1'000'000;

  // One full pass over every size class, unless the detached spans hold less than
  // `minGainBytes` of free slots (then nothing is done and 0 returned). Returns the physical
  // bytes released.
  static size_t compact(size_t minGainBytes = 0);
  static MeshStats stats();
  // RetiredSpans::restore, its CPU time recorded in restoreCpuNs (the background
  // thread's restores, between passes and inside them).
  static void restoreRetiredSpans();

  // fork: no batch may be half done while the process is copied.
  static void lockForFork();
  static void unlockAfterFork();
  static void resetAfterFork();

 private:
  static size_t compactClass(unsigned sizeClass, long* mappingBudget);
  static size_t compactClassRound(unsigned sizeClass, long* mappingBudget, size_t* meshed);
  // One batch, run on the commit thread (runBatch → meshBatchHere): write barrier up over its
  // spans, copies and mapping calls, then the commit under the pause.
  static size_t meshBatch(unsigned sizeClass, MeshGroup* groups, size_t count, bool* merged);
  struct BatchJob {
    MeshGroup* groups;
    size_t count;
    bool* mergedFlags;
    size_t released;  // out
    uint64_t cpuNs;   // out: CPU time of the thread that ran it
  };
  static void runBatch(void* job);
  static size_t meshBatchHere(MeshGroup* groups, size_t count, bool* merged);
  // Copies each source's objects into the destination and maps the destination's pages over
  // the source (merged[i] says which succeeded); the page map is not changed yet.
  static bool meshGroup(MeshGroup& group, bool* merged);
  static void copyLiveObjects(Span* destination, Span* source);
  // Sets the destination's bits for the source's live slots; returns how many it set.
  static uint32_t claimSourceSlots(Span* destination, Span* source);
  static bool absorbMeshedSource(Span* destination, Span* source);
  static void restoreWritable(void* start, size_t bytes, Span* span, Span* other = nullptr);
  // Gives back to the kernel every page of `span`, a candidate this pass holds, on which no live
  // object lies, and records their slot bytes in span->trimmedBytes. Returns the bytes newly
  // given back.
  static size_t trimFreePages(Span* span);
  // Trims the spans of `sizeClass` too full to be mesh candidates, in classes whose objects are
  // large enough for a freed one to leave a page empty.
  static void trimFullerSpans(unsigned sizeClass);
  // Trims every partial span of `sizeClass` with at least `minLive` live objects.
  static void trimSpans(unsigned sizeClass, uint32_t minLive);

 public:
  // Returns once no pass is in progress: a span pinned before the call is then never meshed
  // (a pass in progress may have taken it before the pin).
  static void waitForPass();

 private:
  // Hands the candidates of a round back to the lists, trimmed first.
  static void returnCandidates(unsigned sizeClass, Span** spans, size_t count);
  // With guarded operations paused: the source's live slots and virtual span go over to the
  // destination.
  static void commitSource(Span* destination, Span* source);
  // A batch's commit: its merged sources, under one pause.
  struct CommitJob {
    MeshGroup* groups;
    size_t count;
    bool* mergedFlags;
    size_t spanBytes;
    size_t released;  // out
  };
  static void commitBatch(void* job);
};

}  // namespace meshalloc
