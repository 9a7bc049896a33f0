#include "mesh/mesher.h"

#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "heap/arena.h"
#include "heap/config.h"
#include "heap/global_heap.h"
#include "heap/operation_guard.h"
#include "heap/thread_heap.h"
#include "mesh/commit_thread.h"
#include "mesh/page_mask.h"
#include "mesh/retired_spans.h"
#include "mesh/write_barrier.h"
#include "platform/os.h"
#include "support/assert.h"
#include "support/lock.h"
#include "support/range.h"

namespace meshalloc {

namespace {

Mutex gPassLock(LockRank::kMeshPass);  // one pass at a time (background thread, meshalloc_compact)
Mutex gBatchLock(LockRank::kMeshBatch);  // held across each batch; fork takes it first
std::atomic<bool> gForkPending{false};
// Written by the mesh thread, the commit thread and meshalloc_compact's caller (restores run
// outside the pass lock), read by statistics from any thread: every access under gStatsLock, a
// leaf lock held for a few stores or one copy.
MeshStats gStats = {};
Mutex gStatsLock(LockRank::kMeshStats);
template <typename Update>
void updateStats(Update update) {
  LockGuard guard(gStatsLock);
  update(gStats);
}
Rng gRng;
bool gRngSeeded = false;

// Scratch for one class at a time (passes are serialised): no allocation during a pass.
Span* gCandidates[Mesher::kMaxCandidatesPerClass];
Span* gSearchOrder[Mesher::kMaxCandidatesPerClass];
MeshGroup gGroups[Mesher::kMaxCandidatesPerClass / 2];
// Groups cut into batch-sized pieces: at most one piece per source, and a group has at least
// one source for every piece, so the candidates bound both arrays.
MeshGroup gPieces[Mesher::kMaxCandidatesPerClass / 2];
bool gMerged[Mesher::kMaxCandidatesPerClass / 2][kMaxVirtualSpans];

// True if a system call in progress on some thread writes into [start, start+bytes). Called
// with the barrier raised, so a call that starts later sees the barrier and waits instead.
bool busyWithIo(uintptr_t start, size_t bytes) {
  bool busy = false;
  ThreadHeap::lockRegistry();
  for (ThreadHeap* heap = ThreadHeap::registryHead(); heap && !busy;
       heap = heap->nextInRegistry()) {
    uintptr_t ioStart = heap->activity().ioBufferStart.load(std::memory_order_seq_cst);
    uintptr_t ioEnd = heap->activity().ioBufferEnd.load(std::memory_order_seq_cst);
    busy = ioEnd != 0 && rangesOverlap(start, bytes, ioStart, ioEnd);
  }
  ThreadHeap::unlockRegistry();
  return busy;
}

bool spanBusyWithIo(Span* span, size_t bytes) {
  bool busy = false;
  SpanBacking::forEachVirtualSpan(
      span, [&](uintptr_t start) { busy = busy || busyWithIo(start, bytes); });
  return busy;
}

// Reading /proc/self/maps costs milliseconds once meshing has made thousands of mappings,
// so it is read every kRecountIntervalNs; in between, the count is estimated from the last
// reading plus kMappingsPerMesh for every virtual span (alias or shared span) added since.
constexpr uint64_t kRecountIntervalNs = 5'000'000'000ull;
// Within this many mappings of the limit a pass counts them afresh, and it leaves this reserve
// for the mappings a pass's restores may add.
constexpr long kMappingRecountDistance = 2048;
constexpr long kMappingReserve = 64;
long gCountedMappings = -1;
size_t gVirtualSpansAtCount = 0;
uint64_t gCountedAtNs = 0;

// `fresh`: read /proc/self/maps whatever the interval.
long mappingCount(bool fresh = false) {
  SpanBackingStats backing = SpanBacking::stats();
  size_t virtualSpans = backing.aliasSpans + backing.meshedSpans;
  uint64_t now = os::monotonicNanos();
  if (fresh || gCountedMappings < 0 || now - gCountedAtNs > kRecountIntervalNs) {
    gCountedMappings = os::countMappings();
    gVirtualSpansAtCount = virtualSpans;
    gCountedAtNs = now;
    return gCountedMappings;
  }
  long added = virtualSpans > gVirtualSpansAtCount
                   ? static_cast<long>(virtualSpans - gVirtualSpansAtCount)
                   : 0;
  return gCountedMappings + added * Mesher::kMappingsPerMesh;
}

// A span this batch write-protected at `since` is writable for good: writes and system calls
// waiting on it go on without waiting for the rest of the batch, so the window is what such a
// write can wait (mesh.barrier_max_ns).
void endProtection(uintptr_t start, uint64_t since) {
  WriteBarrier::release(start);
  uint64_t window = os::monotonicNanos() - since;
  updateStats([&](MeshStats& s) {
    if (window > s.barrierMaxNs) s.barrierMaxNs = window;
  });
}

}  // namespace

void Mesher::copyLiveObjects(Span* destination, Span* source) {
  size_t objectSize = destination->objectSize;
  AtomicBitmap src = source->bitmap();
  for (size_t w = 0; w < src.words(); w++) {
    uint64_t bits = src.loadWord(w);
    while (bits) {
      size_t slot = w * 64 + static_cast<size_t>(__builtin_ctzll(bits));
      bits &= bits - 1;
      memcpy(reinterpret_cast<char*>(destination->spanStart) + slot * objectSize,
             reinterpret_cast<char*>(source->spanStart) + slot * objectSize, objectSize);
    }
  }
}

uint32_t Mesher::claimSourceSlots(Span* destination, Span* source) {
  AtomicBitmap src = source->bitmap();
  AtomicBitmap dst = destination->bitmap();
  uint32_t claimed = 0;
  for (size_t w = 0; w < src.words(); w++) {
    uint64_t bits = src.loadWord(w);
    // Source and destination were checked disjoint, and neither gains a bit while meshed
    // (both are detached; frees only clear bits): no slot is live in both.
    if (bits) {
      uint64_t newlyClaimed = dst.claimMask(w, bits);
      MESHALLOC_ASSERT_MSG(newlyClaimed == bits, "a slot is live in both meshed spans");
      (void)newlyClaimed;
    }
    claimed += static_cast<uint32_t>(__builtin_popcountll(bits));
  }
  return claimed;
}

// A source that is itself meshed: all its virtual spans are write-protected while its
// objects are copied, then all move onto the destination's pages (SpanBacking::absorb), so
// chains keep merging as their spans empty out. Without this, two meshed spans could never
// mesh, and a sparse heap stopped shrinking once most of its spans were meshed (Redis LRU:
// 256-byte spans at 15 % occupancy, all meshed once).
bool Mesher::absorbMeshedSource(Span* destination, Span* source) {
  size_t bytes = destination->spanBytes(Arena::pageSize());
  uintptr_t protectedStarts[kMaxVirtualSpans];
  uint32_t protectedCount = 0;
  bool ok = true;
  uint64_t since = os::monotonicNanos();
  SpanBacking::forEachVirtualSpan(source, [&](uintptr_t start) {
    if (ok && os::protectReadOnly(reinterpret_cast<void*>(start), bytes))
      protectedStarts[protectedCount++] = start;
    else
      ok = false;
  });
  bool stranded = false;
  if (ok) {
    copyLiveObjects(destination, source);
    ok = SpanBacking::absorb(destination, source, &stranded);
  }
  if (stranded) {
    // A virtual span could be moved neither onto the destination nor back: it shows the
    // copies in the destination's pages. The destination keeps those slots for good (a leak
    // of at most one span's slots), so it never hands them out while that span's objects live
    // there.
    // The bits claimed, not source's live count: this runs without the pause, so the two can
    // differ.
    destination->liveCount.fetch_add(claimSourceSlots(destination, source),
                                     std::memory_order_acq_rel);
    // Neither may ever be meshed again: copying source's pages would miss the writes made
    // through the stranded span, and giving the destination's file range back would leave that
    // span showing whatever reuses it. And source hands out no more slots: if the stranded
    // span is its own, a new block there would be one of the destination's live objects.
    GlobalHeap::pin(destination);
    GlobalHeap::pin(source);
    source->allocationClosed = true;
    updateStats([](MeshStats& s) { s.strandedSpans++; });
  }
  // Writable again: on the destination's pages if the move succeeded, else on its own.
  for (uint32_t i = 0; i < protectedCount; i++) {
    restoreWritable(reinterpret_cast<void*>(protectedStarts[i]), bytes, destination, source);
    endProtection(protectedStarts[i], since);
  }
  if (!ok) updateStats([](MeshStats& s) { s.failedMeshes++; });
  return ok;
}

void Mesher::restoreWritable(void* start, size_t bytes, Span* span, Span* other) {
  // mprotect merges back the very mapping protectReadOnly split off, so the kernel has no reason
  // to refuse; if it does all the same, the range must not stay read-only (the program's next
  // write there would fault with no barrier up: a crash). A private copy of it is writable but
  // shares no pages with its file any more, so neither span may be meshed again: a later mesh
  // would copy objects into the file pages this range no longer shows.
  if (os::protectReadWrite(start, bytes)) return;
  for (unsigned attempt = 0; attempt < kRestoreAttempts; attempt++) {
    if (os::replaceWithWritableCopy(start, bytes) || os::protectReadWrite(start, bytes)) {
      GlobalHeap::pin(span);
      if (other) GlobalHeap::pin(other);
      updateStats([](MeshStats& s) { s.unprotectCopies++; });
      return;
    }
    os::sleepNanos(kRestoreRetryNs);
  }
  static constexpr char kMessage[] =
      "meshalloc: a write-protected span cannot be made writable again (mprotect and mremap "
      "fail); aborting before a write there faults\n";
  os::writeStderr(kMessage, sizeof(kMessage) - 1);
  abort();
}

size_t Mesher::trimFreePages(Span* span) {
  // A span in the shared file keeps only its live pages there already (SpanBacking::share), and
  // punching its file would need the backing's lock; a pinned one is left alone entirely.
  if (span->state != SpanState::kMeshing || span->mesh ||
      span->pinned.load(std::memory_order_relaxed))
    return 0;
  size_t pageSize = Arena::pageSize();
  size_t slotBytes = static_cast<size_t>(span->objectCount) * span->objectSize;
  // Nothing can be handed out of a candidate and frees only clear bits, so a page with no live
  // slot now stays that way until the span is attached again (which clears trimmedBytes).
  PageMask live = livePages(span, pageSize);
  // The bytes of slots on a run of pages (the last page may hold the span's tail).
  auto slotBytesOn = [&](size_t first, size_t count) {
    size_t end = (first + count) * pageSize;
    return (end < slotBytes ? end : slotBytes) - first * pageSize;
  };
  size_t freeBytes = 0;
  forEachRun(live, span->spanPages, false,
             [&](size_t first, size_t count) { freeBytes += slotBytesOn(first, count); });
  // Unchanged since this span was last trimmed: those pages are gone already.
  if (freeBytes <= span->trimmedBytes) return 0;
  size_t trimmed = 0, calls = 0;
  forEachRun(live, span->spanPages, false, [&](size_t first, size_t count) {
    calls++;
    if (!os::dropPages(reinterpret_cast<void*>(span->spanStart + first * pageSize),
                       count * pageSize))
      return;
    trimmed += slotBytesOn(first, count);
  });
  size_t gained = trimmed > span->trimmedBytes ? trimmed - span->trimmedBytes : 0;
  span->trimmedBytes = static_cast<uint32_t>(trimmed);
  updateStats([&](MeshStats& s) {
    s.trimmedBytes += gained;
    s.trimCalls += calls;
  });
  return gained;
}

void Mesher::returnCandidates(unsigned sizeClass, Span** spans, size_t count) {
  for (size_t i = 0; i < count; i++) trimFreePages(spans[i]);
  GlobalHeap::returnMeshCandidates(sizeClass, spans, count);
}

bool Mesher::meshGroup(MeshGroup& group, bool* merged) {
  Span* destination = group.destination;
  size_t pageSize = Arena::pageSize();
  size_t bytes = destination->spanBytes(pageSize);
  for (uint32_t i = 0; i < group.sourceCount; i++) merged[i] = false;
  if (spanBusyWithIo(destination, bytes)) {
    updateStats([](MeshStats& s) { s.skippedForIo++; });
    return false;
  }
  if (!destination->mesh) {
    void* start = reinterpret_cast<void*>(destination->spanStart);
    uint64_t since = os::monotonicNanos();
    if (!os::protectReadOnly(start, bytes)) {
      updateStats([](MeshStats& s) { s.failedMeshes++; });
      return false;
    }
    bool shared = SpanBacking::share(destination);
    if (!shared) restoreWritable(start, bytes, destination);
    endProtection(destination->spanStart, since);
    if (!shared) {
      updateStats([](MeshStats& s) { s.failedMeshes++; });
      return false;
    }
  }
  bool any = false;
  for (uint32_t i = 0; i < group.sourceCount; i++) {
    Span* source = group.sources[i];
    // Frees only ever clear bits, so the groups found before the batch are still disjoint;
    // checked again because a mistake here would overwrite live objects.
    if (!SplitMesher::disjoint(destination, source)) continue;
    if (spanBusyWithIo(source, bytes)) {
      updateStats([](MeshStats& s) { s.skippedForIo++; });
      continue;
    }
    if (source->mesh) {
      merged[i] = absorbMeshedSource(destination, source);
      any |= merged[i];
      continue;
    }
    void* sourceStart = reinterpret_cast<void*>(source->spanStart);
    uint64_t since = os::monotonicNanos();
    if (!os::protectReadOnly(sourceStart, bytes)) {
      updateStats([](MeshStats& s) { s.failedMeshes++; });
      continue;
    }
    // Objects freed from here on are copied for nothing; commitSource transfers only the slots
    // still live once guarded operations are paused.
    copyLiveObjects(destination, source);
    bool aliased = SpanBacking::addAlias(destination, source->spanStart);
    // Undo on failure: the source keeps its own pages and objects; what was copied lands in
    // slots the destination does not own, so it is never seen.
    if (!aliased) restoreWritable(sourceStart, bytes, source);
    // Either way the source is writable for good now. Its writes land in the copies from here
    // on (the page map still resolves it to the source until the commit, which only frees
    // need), so they need not wait for the batch's commit.
    endProtection(source->spanStart, since);
    if (!aliased) {
      updateStats([](MeshStats& s) { s.failedMeshes++; });
      continue;
    }
    // The source's virtual span now shows the destination's pages, holding the copies, but the
    // page map still resolves it to the source: frees still land in the source's bitmap.
    merged[i] = true;
    any = true;
  }
  return any;
}

void Mesher::commitSource(Span* destination, Span* source) {
  // Both were taken out of the lists for this pass (GlobalHeap::takeMeshCandidates).
  MESHALLOC_ASSERT(destination->state == SpanState::kMeshing);
  MESHALLOC_ASSERT(source->state == SpanState::kMeshing);
  MESHALLOC_ASSERT(destination->sizeClass == source->sizeClass);
  claimSourceSlots(destination, source);
  destination->liveCount.fetch_add(source->liveCount.load(std::memory_order_relaxed),
                                   std::memory_order_acq_rel);
  // From here on every address in the source's virtual spans resolves to the destination.
  SpanBacking::forEachVirtualSpan(
      source, [&](uintptr_t start) { Arena::assign(start, source->spanPages, destination, true); });
  source->state = SpanState::kMeshedAway;
  updateStats([](MeshStats& s) { s.meshedSpans++; });
}

void Mesher::commitBatch(void* argument) {
  CommitJob& job = *static_cast<CommitJob*>(argument);
  uint64_t pauseStart = os::monotonicNanos();
  uint64_t waited = OperationGuard::pause();
  for (size_t g = 0; g < job.count; g++) {
    bool* merged = job.mergedFlags + g * kMaxVirtualSpans;
    for (uint32_t i = 0; i < job.groups[g].sourceCount; i++) {
      if (!merged[i]) continue;
      commitSource(job.groups[g].destination, job.groups[g].sources[i]);
      job.released += job.spanBytes;
    }
  }
  // Measured before the wake-up: a woken thread may preempt this one, but it is running.
  uint64_t pause = os::monotonicNanos() - pauseStart;
  OperationGuard::resume();
  updateStats([&](MeshStats& s) {
    s.pauseCount++;
    s.pauseTotalNs += pause;
    if (pause > s.pauseMaxNs) {
      s.pauseMaxNs = pause;
      s.pauseWaitMaxNs = waited;
    }
  });
}

static_assert(WriteBarrier::kMaxSpans >= 2 * Mesher::kSourcesPerBatch * kMaxVirtualSpans,
              "a batch's destinations and sources, with all their virtual spans");

size_t Mesher::meshBatch(unsigned sizeClass, MeshGroup* groups, size_t count, bool* mergedFlags) {
  (void)sizeClass;
  LockGuard batch(gBatchLock);
  // The batch runs on the commit thread, at the program's priority: while it runs, a write into
  // one of its spans waits, and a nice-19 mesher preempted mid-batch on a busy machine kept such
  // writes waiting for hundreds of milliseconds (Redis LRU under load: 379 ms). Its CPU counts
  // against meshing's budget all the same (batchCpuNs).
  BatchJob job{groups, count, mergedFlags, 0, 0};
  bool elsewhere = CommitThread::run(runBatch, &job);
  if (elsewhere) updateStats([&](MeshStats& s) { s.batchCpuNs += job.cpuNs; });
  return job.released;
}

void Mesher::runBatch(void* argument) {
  BatchJob& job = *static_cast<BatchJob*>(argument);
  uint64_t cpuStart = os::threadCpuNanos();
  job.released = meshBatchHere(job.groups, job.count, job.mergedFlags);
  job.cpuNs = os::threadCpuNanos() - cpuStart;
}

size_t Mesher::meshBatchHere(MeshGroup* groups, size_t count, bool* mergedFlags) {
  size_t released = 0;
  size_t bytes = groups[0].destination->spanBytes(Arena::pageSize());
  // The write barrier is up for the whole batch, but a thread writing into one of its spans
  // while that span is write-protected waits only until that span is released (endProtection):
  // one copy and one mapping call. Other threads, and every other span, are not held up.
  // Every virtual span the batch may write-protect: destinations (their own span when first
  // shared) and sources (all of a meshed source's spans).
  uintptr_t protectable[WriteBarrier::kMaxSpans] = {};
  uint32_t protectableCount = 0;
  auto note = [&](Span* span) {
    SpanBacking::forEachVirtualSpan(span, [&](uintptr_t start) {
      if (protectableCount < WriteBarrier::kMaxSpans) protectable[protectableCount] = start;
      protectableCount++;
    });
  };
  for (size_t g = 0; g < count; g++) {
    note(groups[g].destination);
    for (uint32_t i = 0; i < groups[g].sourceCount; i++) note(groups[g].sources[i]);
  }
  // More than the table holds: beginSpans falls back to a barrier over everything.
  WriteBarrier::beginSpans(protectable, protectableCount, bytes);
  bool anyMerged = false;
  for (size_t g = 0; g < count; g++)
    anyMerged |= meshGroup(groups[g], mergedFlags + g * kMaxVirtualSpans);
  if (anyMerged) {
    // Only the switch of the page map needs guarded operations (remote frees, realloc,
    // malloc_usable_size) paused: none may hold a source's span record across it, and the slots
    // transferred must be the final ones. It is a few atomics per source, so the pause does
    // not include the mapping calls, which can wait long for the mm lock or the CPU. It runs
    // on the commit thread, at the program's priority (mesh/commit_thread.h).
    CommitJob job{groups, count, mergedFlags, bytes, 0};
    commitBatch(&job);
    released = job.released;
  }
  WriteBarrier::end();
  return released;
}

size_t Mesher::compactClassRound(unsigned sizeClass, long* mappingBudget, size_t* meshed) {
  const SpanPlan& plan = SizeClasses::plan(sizeClass);
  uint32_t maxLive =
      static_cast<uint32_t>(plan.objectCount * gHeapConfig.meshOccupancyPercent / 100);
  if (maxLive == 0) return 0;
  size_t count =
      GlobalHeap::takeMeshCandidates(sizeClass, maxLive, gCandidates, kMaxCandidatesPerClass);
  if (count < 2) {
    returnCandidates(sizeClass, gCandidates, count);
    return 0;
  }
  memcpy(gSearchOrder, gCandidates, count * sizeof(Span*));
  size_t maxGroups = static_cast<size_t>(*mappingBudget / (kMappingsPerMesh * kMaxVirtualSpans));
  if (maxGroups == 0) maxGroups = *mappingBudget >= kMappingsPerMesh * 2 ? 1 : 0;
  if (maxGroups > count / 2) maxGroups = count / 2;
  size_t groupCount =
      SplitMesher::find(gSearchOrder, count, gHeapConfig.meshProbes, gRng, gGroups, maxGroups);
  // A long chain is meshed over several batches (its destination stays shared in between), so
  // that no batch covers more than kSourcesPerBatch sources.
  size_t pieces = 0;
  for (size_t g = 0; g < groupCount; g++) {
    for (uint32_t first = 0; first < gGroups[g].sourceCount; first += kSourcesPerBatch) {
      MeshGroup& piece = gPieces[pieces++];
      piece.destination = gGroups[g].destination;
      piece.sourceCount = 0;
      for (uint32_t i = first; i < gGroups[g].sourceCount && piece.sourceCount < kSourcesPerBatch;
           i++) {
        piece.sources[piece.sourceCount++] = gGroups[g].sources[i];
      }
    }
  }
  size_t released = 0;
  for (size_t g = 0; g < pieces && !gForkPending.load(std::memory_order_relaxed);) {
    size_t n = 0, sources = 0;
    while (g + n < pieces && (n == 0 || sources + gPieces[g + n].sourceCount <= kSourcesPerBatch)) {
      sources += gPieces[g + n].sourceCount;
      n++;
    }
    released += meshBatch(sizeClass, gPieces + g, n, &gMerged[g][0]);
    g += n;
    // A long pass must not leave spans that died meanwhile to the freeing threads, which
    // restore them themselves once RetiredSpans::kMax wait.
    restoreRetiredSpans();
  }
  // Sources meshed away are forgotten; everything else goes back to the lists.
  size_t returned = 0;
  for (size_t c = 0; c < count; c++) {
    Span* span = gCandidates[c];
    if (span->state == SpanState::kMeshedAway) {
      *mappingBudget -= kMappingsPerMesh * SpanBacking::virtualSpans(span);
      SpanBacking::forgetAbsorbed(span);
      GlobalHeap::retireMeshedSource(sizeClass, span);
      (*meshed)++;
    } else {
      gCandidates[returned++] = span;
    }
  }
  returnCandidates(sizeClass, gCandidates, returned);
  return released;
}

void Mesher::trimFullerSpans(unsigned sizeClass) {
  const SpanPlan& plan = SizeClasses::plan(sizeClass);
  // Below a quarter of a page, a page is empty only when four or more neighbours all are.
  if (static_cast<size_t>(plan.objectSize) * kTrimObjectsPerPage < Arena::pageSize()) return;
  uint32_t maxLive =
      static_cast<uint32_t>(plan.objectCount * gHeapConfig.meshOccupancyPercent / 100);
  if (maxLive + 1 >= plan.objectCount) return;
  trimSpans(sizeClass, maxLive + 1);
}

void Mesher::trimSpans(unsigned sizeClass, uint32_t minLive) {
  const SpanPlan& plan = SizeClasses::plan(sizeClass);
  size_t count = GlobalHeap::takeMeshCandidates(sizeClass, plan.objectCount - 1, gCandidates,
                                                kMaxCandidatesPerClass, minLive);
  returnCandidates(sizeClass, gCandidates, count);
}

size_t Mesher::compactClass(unsigned sizeClass, long* mappingBudget) {
  // Objects of whole pages never share a page, so trimming a span gives back every page its
  // free slots hold, and pairing two spans (the merged one trimmed) would give back exactly the
  // pages trimming both does, for a copy and a remapping per span. Such classes are trimmed,
  // never meshed: in thread-scaling they hold most of the bytes, and meshing them had taken the
  // pass past the 300 ms a server's idle threads were given.
  if (SizeClasses::plan(sizeClass).objectSize % Arena::pageSize() == 0) {
    trimSpans(sizeClass, 1);
    return 0;
  }
  trimFullerSpans(sizeClass);
  size_t released = 0;
  for (unsigned round = 0; round < kMaxRoundsPerClass; round++) {
    if (*mappingBudget < kMappingsPerMesh * 2 || gForkPending.load(std::memory_order_relaxed))
      break;
    size_t meshed = 0;
    released += compactClassRound(sizeClass, mappingBudget, &meshed);
    if (meshed == 0) break;
  }
  return released;
}

void Mesher::waitForPass() {
  LockGuard pass(gPassLock);
}

void Mesher::restoreRetiredSpans() {
  if (RetiredSpans::count() == 0) return;
  uint64_t start = os::threadCpuNanos();
  RetiredSpans::restore();
  uint64_t spent = os::threadCpuNanos() - start;
  updateStats([&](MeshStats& s) { s.restoreCpuNs += spent; });
}

size_t Mesher::compact(size_t minGainBytes) {
  // A span this pass meshes may die later: the global heap must know where to hand it.
  RetiredSpans::install();
  // Spans that died since the last pass are plain memory again before this one looks at the
  // heap (and before meshalloc_compact() returns).
  restoreRetiredSpans();
  // Without a barrier a pause cannot tell which guarded operations are in flight.
  if (!OperationGuard::barrierAvailable()) return 0;
  LockGuard pass(gPassLock);
  uint64_t cpuStart = os::threadCpuNanos();
  uint64_t restoreStart = stats().restoreCpuNs;
  uint64_t batchStart = stats().batchCpuNs;
  // Classes with the most free memory in sparse spans first: the CPU budget and the mapping
  // budget go where they release the most. A class with less than one span's worth of free
  // slots cannot release a span. The same walk tells whether the pass is worth it at all.
  unsigned order[kNumSizeClasses];
  size_t gain[kNumSizeClasses];
  unsigned classes = 0;
  size_t totalGain = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    size_t spans, freeSlots;
    GlobalHeap::partialOccupancy(c, &spans, &freeSlots);
    if (spans < 2) continue;
    gain[c] = freeSlots * kSizeClassSizes[c];
    totalGain += gain[c];
    if (freeSlots < static_cast<size_t>(SizeClasses::plan(c).objectCount)) continue;
    size_t at = classes++;
    while (at > 0 && gain[order[at - 1]] < gain[c]) {
      order[at] = order[at - 1];
      at--;
    }
    order[at] = c;
  }
  updateStats([&](MeshStats& s) { s.lastGainBytes = totalGain; });
  if (totalGain < minGainBytes) return 0;
  if (!gRngSeeded) {
    gRng.reseed(os::entropy64());
    gRngSeeded = true;
  }
  if (!WriteBarrier::install()) return 0;
  long limit = os::maxMapCount();
  long margin = limit / kMappingMarginDivisor > kMappingMarginMin ? limit / kMappingMarginDivisor
                                                                  : kMappingMarginMin;
  long mappings = mappingCount();
  // Near the limit the estimate is not good enough: spans restored between batches map fresh
  // memory that may not merge with its neighbours, which the estimate does not count (a 2 GiB
  // sparse heap ended 12 mappings past the limit). Count again, and keep a reserve for them.
  if (mappings >= 0 && limit - margin - mappings < kMappingRecountDistance)
    mappings = mappingCount(true);
  updateStats([&](MeshStats& s) {
    s.lastMappingCount = mappings > 0 ? static_cast<uint64_t>(mappings) : 0;
    s.mappingLimit = static_cast<uint64_t>(limit - margin > 0 ? limit - margin : 0);
  });
  long budget = mappings < 0 ? 0 : limit - margin - mappings - kMappingReserve;
  size_t released = 0;
  for (unsigned i = 0; i < classes && !gForkPending.load(std::memory_order_relaxed); i++) {
    if (budget < kMappingsPerMesh * 2) {
      updateStats([](MeshStats& s) { s.vmaLimitedPasses++; });
      break;
    }
    released += compactClass(order[i], &budget);
    // A long pass must not hold back the dirty cache's decay (the background thread purges
    // only between passes).
    Arena::purge(false);
  }
  uint64_t cpu = os::threadCpuNanos() - cpuStart - (stats().restoreCpuNs - restoreStart) +
                 (stats().batchCpuNs - batchStart);
  updateStats([&](MeshStats& s) {
    s.passes++;
    s.cpuNs += cpu;
  });
  return released;
}

MeshStats Mesher::stats() {
  LockGuard guard(gStatsLock);
  return gStats;
}

// A pass in progress stops at its next batch boundary (handing its candidates back) instead
// of making fork wait for the whole pass.
void Mesher::lockForFork() {
  gForkPending.store(true, std::memory_order_relaxed);
  gPassLock.lock();
  gBatchLock.lock();
}
void Mesher::unlockAfterFork() {
  gForkPending.store(false, std::memory_order_relaxed);
  gBatchLock.unlock();
  gPassLock.unlock();
}
void Mesher::resetAfterFork() {
  gForkPending.store(false, std::memory_order_relaxed);
  gStatsLock.resetAfterFork();
  gCountedMappings = -1;
  gBatchLock.resetAfterFork();
  gPassLock.resetAfterFork();
}

}  // namespace meshalloc
