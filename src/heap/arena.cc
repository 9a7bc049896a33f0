#include "heap/arena.h"

#include <cstring>

#include "heap/config.h"
#include "heap/internal_heap.h"
#include "heap/span.h"
#include "support/assert.h"

namespace meshalloc {

namespace {
size_t roundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}
size_t log2Floor(size_t value) {
  return 63 - static_cast<size_t>(__builtin_clzl(value));
}
}  // namespace

bool Arena::init() {
  pageSize_ = os::pageSize();
  pageShift_ = os::pageShift();
  if (fastPageShift() != pageShift_) return false;
  // Both top-level tables are reserved lazily: only the entries of granules in use are touched.
  pageMaps_ = static_cast<std::atomic<uintptr_t>*>(
      os::reserveAligned(kTopEntries * sizeof(uintptr_t), pageSize_));
  classMaps_ = static_cast<std::atomic<uintptr_t>*>(
      os::reserveAligned(kTopEntries * sizeof(uintptr_t), pageSize_));
  segments_ = static_cast<std::atomic<Segment*>*>(
      os::reserveAligned(kTopEntries * sizeof(Segment*), pageSize_));
  return pageMaps_ && classMaps_ && segments_;
}

size_t Arena::binFor(size_t pages) {
  if (pages <= kExactBins) return pages - 1;
  size_t bin = kExactBins + log2Floor(pages) - log2Floor(kExactBins);
  return bin < kBins ? bin : kBins - 1;
}

Arena::Segment* Arena::createSegment(size_t bytes, size_t alignment, bool dedicated) {
  size_t segmentBytes = roundUp(bytes, kGranule);
  size_t segmentAlignment = alignment > kGranule ? alignment : kGranule;
  if (segmentBytes < bytes) return nullptr;
  void* base = os::reserveAligned(segmentBytes, segmentAlignment);
  if (!base) return nullptr;
  uintptr_t start = reinterpret_cast<uintptr_t>(base);
  if (((start + segmentBytes - 1) >> kGranuleShift) >= kTopEntries) {
    os::unmap(base, segmentBytes);
    return nullptr;
  }
  Segment* segment = static_cast<Segment*>(InternalHeap::allocate(sizeof(Segment)));
  size_t pages = segmentBytes >> pageShift_;
  size_t fullMapBytes = roundUp(pages * sizeof(uint64_t), pageSize_);
  size_t mapBytes = fullMapBytes + roundUp(pages * sizeof(uint16_t), pageSize_);
  void* map = segment ? os::reserveAligned(mapBytes, pageSize_) : nullptr;
  if (!map) {
    if (segment) InternalHeap::free(segment, sizeof(Segment));
    os::unmap(base, segmentBytes);
    return nullptr;
  }
  segment->base = start;
  segment->pages = pages;
  segment->dedicated = dedicated;
  segment->pageMap = static_cast<std::atomic<uint64_t>*>(map);
  segment->pageMapBytes = mapBytes;
  segment->classMap =
      reinterpret_cast<std::atomic<uint16_t>*>(static_cast<char*>(map) + fullMapBytes);
  uintptr_t biased = reinterpret_cast<uintptr_t>(map) - (start >> pageShift_) * sizeof(uint64_t);
  uintptr_t classBiased =
      reinterpret_cast<uintptr_t>(segment->classMap) - (start >> pageShift_) * sizeof(uint16_t);
  for (size_t g = start >> kGranuleShift; g < (start + segmentBytes) >> kGranuleShift; g++) {
    segments_[g].store(segment, std::memory_order_relaxed);
    pageMaps_[g].store(biased, std::memory_order_release);
    classMaps_[g].store(classBiased, std::memory_order_release);
  }
  stats_.reservedBytes += segmentBytes;
  stats_.segmentCount++;
  if (dedicated) stats_.dedicatedCount++;
  return segment;
}

void Arena::destroySegment(Segment* segment) {
  size_t bytes = segment->pages << pageShift_;
  for (size_t g = segment->base >> kGranuleShift; g < (segment->base + bytes) >> kGranuleShift;
       g++) {
    pageMaps_[g].store(0, std::memory_order_release);
    classMaps_[g].store(0, std::memory_order_release);
    segments_[g].store(nullptr, std::memory_order_relaxed);
  }
  os::unmap(reinterpret_cast<void*>(segment->base), bytes);
  os::unmap(segment->pageMap, segment->pageMapBytes);
  stats_.reservedBytes -= bytes;
  stats_.segmentCount--;
  if (segment->dedicated) stats_.dedicatedCount--;
  InternalHeap::free(segment, sizeof(Segment));
}

void Arena::markRunEnds(Segment* segment, uintptr_t start, size_t pages, uint64_t value) {
  entryRef(segment, start).store(value, std::memory_order_release);
  entryRef(segment, start + ((pages - 1) << pageShift_)).store(value, std::memory_order_release);
}

uintptr_t Arena::taggedRunBefore(Segment* segment, uintptr_t start, uint64_t tag) {
  if (start <= segment->base) return 0;
  uint64_t entry = entryRef(segment, start - pageSize_).load(std::memory_order_relaxed);
  return (entry & PageEntry::kTagMask) == tag ? entry & ~PageEntry::kTagMask : 0;
}

uintptr_t Arena::taggedRunAt(Segment* segment, uintptr_t address, uint64_t tag) {
  if (address >= segment->base + (segment->pages << pageShift_)) return 0;
  uint64_t entry = entryRef(segment, address).load(std::memory_order_relaxed);
  return (entry & PageEntry::kTagMask) == tag ? entry & ~PageEntry::kTagMask : 0;
}

void Arena::markFreeRun(FreeRun* run) {
  markRunEnds(run->segment, run->start, run->pages,
              reinterpret_cast<uintptr_t>(run) | PageEntry::kFreeRunTag);
}

void Arena::removeFreeRun(FreeRun* run) {
  freeBins_[binFor(run->pages)].remove(run);
  markRunEnds(run->segment, run->start, run->pages, 0);
}

// Inserts a clean run, merging it with free neighbours in the same segment.
void Arena::insertFreeRun(Segment* segment, uintptr_t start, size_t pages) {
  uintptr_t end = start + (pages << pageShift_);
  if (auto* left =
          reinterpret_cast<FreeRun*>(taggedRunBefore(segment, start, PageEntry::kFreeRunTag))) {
    removeFreeRun(left);
    start = left->start;
    pages += left->pages;
    InternalHeap::free(left, sizeof(FreeRun));
  }
  if (auto* right = reinterpret_cast<FreeRun*>(taggedRunAt(segment, end, PageEntry::kFreeRunTag))) {
    removeFreeRun(right);
    pages += right->pages;
    InternalHeap::free(right, sizeof(FreeRun));
  }
  FreeRun* run = static_cast<FreeRun*>(InternalHeap::allocate(sizeof(FreeRun)));
  if (!run) return;  // metadata exhausted: the pages are leaked rather than corrupted
  run->start = start;
  run->pages = pages;
  run->segment = segment;
  freeBins_[binFor(pages)].pushFront(run);
  markFreeRun(run);
}

// Takes [start, start+pages) out of `run` (which must contain it) and re-inserts the remainders.
void Arena::splitAndTake(FreeRun* run, uintptr_t start, size_t pages) {
  Segment* segment = run->segment;
  uintptr_t runStart = run->start;
  uintptr_t runEnd = run->start + (run->pages << pageShift_);
  uintptr_t end = start + (pages << pageShift_);
  removeFreeRun(run);
  InternalHeap::free(run, sizeof(FreeRun));
  if (start > runStart) insertFreeRun(segment, runStart, (start - runStart) >> pageShift_);
  if (runEnd > end) insertFreeRun(segment, end, (runEnd - end) >> pageShift_);
}

uintptr_t Arena::takeFromFreeRuns(size_t pages, size_t alignment) {
  size_t slack = alignment > pageSize_ ? (alignment >> pageShift_) - 1 : 0;
  size_t needed = pages + slack;
  for (size_t bin = binFor(needed); bin < kBins; bin++) {
    for (FreeRun* run = freeBins_[bin].front(); run; run = freeBins_[bin].next(run)) {
      if (run->pages < needed) continue;  // only the logarithmic bins hold mixed sizes
      uintptr_t start = run->start;
      if (alignment > pageSize_) start = (start + alignment - 1) & ~(alignment - 1);
      splitAndTake(run, start, pages);
      return start;
    }
  }
  return 0;
}

void Arena::markDirty(DirtyRun* run) {
  markRunEnds(run->segment, run->start, run->pages,
              reinterpret_cast<uintptr_t>(run) | PageEntry::kDirtyRunTag);
}

void Arena::removeDirty(DirtyRun* run) {
  dirtyBins_[binFor(run->pages)].remove(run);
  markRunEnds(run->segment, run->start, run->pages, 0);
  stats_.dirtyBytes -= run->pages << pageShift_;
}

void Arena::takeDirtyHead(DirtyRun* run, size_t pages) {
  removeDirty(run);
  size_t rest = run->pages - pages;
  if (rest == 0) {
    InternalHeap::free(run, sizeof(DirtyRun));
    return;
  }
  // Reuse the record for the tail, which keeps its age.
  run->start += pages << pageShift_;
  run->pages = rest;
  dirtyBins_[binFor(rest)].pushFront(run);
  markDirty(run);
  stats_.dirtyBytes += rest << pageShift_;
}

// Best fit among cached dirty runs: the smallest bin that can hold `pages`, splitting a larger
// run (its tail stays cached) so that large objects of varying sizes reuse committed memory
// instead of faulting fresh pages in.
uintptr_t Arena::takeDirty(size_t pages) {
  for (size_t bin = binFor(pages); bin < kBins; bin++) {
    for (DirtyRun* run = dirtyBins_[bin].front(); run; run = dirtyBins_[bin].next(run)) {
      if (run->pages < pages) continue;  // only the logarithmic bins hold mixed sizes
      uintptr_t start = run->start;
      takeDirtyHead(run, pages);
      return start;
    }
  }
  return 0;
}

// Caches a freed run, merged with cached neighbours so that runs freed piecemeal can serve a
// larger request later.
void Arena::insertDirty(uintptr_t start, size_t pages, uint64_t freedAtNs) {
  Segment* segment = segmentOf(start);
  uintptr_t end = start + (pages << pageShift_);
  if (auto* left =
          reinterpret_cast<DirtyRun*>(taggedRunBefore(segment, start, PageEntry::kDirtyRunTag))) {
    removeDirty(left);
    start = left->start;
    pages += left->pages;
    InternalHeap::free(left, sizeof(DirtyRun));
  }
  if (auto* right =
          reinterpret_cast<DirtyRun*>(taggedRunAt(segment, end, PageEntry::kDirtyRunTag))) {
    removeDirty(right);
    pages += right->pages;
    InternalHeap::free(right, sizeof(DirtyRun));
  }
  DirtyRun* run = static_cast<DirtyRun*>(InternalHeap::allocate(sizeof(DirtyRun)));
  if (!run) {
    os::decommit(reinterpret_cast<void*>(start), pages << pageShift_);
    stats_.purgedBytesTotal += pages << pageShift_;
    releaseClean(start, pages);
    return;
  }
  run->start = start;
  run->pages = pages;
  run->freedAtNs = freedAtNs;
  run->segment = segment;
  dirtyBins_[binFor(pages)].pushFront(run);
  markDirty(run);
  stats_.dirtyBytes += pages << pageShift_;
}

uintptr_t Arena::allocate(size_t pages, size_t alignment, bool* zeroed) {
  if (pages == 0) pages = 1;
  if (pages > (size_t{1} << (kAddressBits - pageShift_))) return 0;
  size_t bytes = pages << pageShift_;
  LockGuard guard(lock_);
  uintptr_t start = 0;
  *zeroed = false;
  if (alignment <= pageSize_) {
    start = takeDirty(pages);
    if (start) {
      recentHitBytes_ += bytes;
    } else if (stats_.dirtyBytes > 0) {
      recentMissBytes_ += bytes;
    }
  }
  if (!start) {
    *zeroed = true;
    if (bytes >= kDedicatedThreshold || alignment >= kGranule / kAlignedDedicatedDivisor) {
      Segment* segment = createSegment(bytes, alignment, true);
      start = segment ? segment->base : 0;
    } else {
      start = takeFromFreeRuns(pages, alignment);
      if (!start) {
        Segment* segment = createSegment(kGranule, alignment, false);
        if (!segment) return 0;
        insertFreeRun(segment, segment->base, segment->pages);
        start = takeFromFreeRuns(pages, alignment);
      }
    }
  }
  if (start) stats_.activeBytes += bytes;
  return start;
}

void Arena::assign(uintptr_t start, size_t pages, Span* owner, bool everyPage) {
  Segment* segment = segmentOf(start);
  size_t count = everyPage ? pages : 1;
  bool small = owner->sizeClass < kNumSizeClasses;
  // The run lies inside one segment, and the owner's address fits the entry's pointer bits
  // without touching the tag bits.
  MESHALLOC_ASSERT(segment != nullptr);
  MESHALLOC_ASSERT((start & (pageSize_ - 1)) == 0);
  MESHALLOC_ASSERT(start >= segment->base &&
                   pages <= segment->pages - ((start - segment->base) >> pageShift_));
  MESHALLOC_ASSERT((reinterpret_cast<uintptr_t>(owner) & ~PageEntry::kPointerMask) == 0);
  MESHALLOC_ASSERT((reinterpret_cast<uintptr_t>(owner) & PageEntry::kTagMask) == 0);
  MESHALLOC_ASSERT(small || !everyPage);
  for (size_t i = 0; i < count; i++) {
    size_t index = i <= PageEntry::kMaxPageIndex ? i : PageEntry::kMaxPageIndex;
    uintptr_t page = start + (i << pageShift_);
    // A page being assigned is not part of a free or cached run (those are marked on their
    // ends), and is either unowned or (meshing) re-pointed from another span at the same
    // position in its virtual span; meshing never changes a page's compact entry.
    if constexpr (kChecksEnabled) {
      uint64_t old = entryRef(segment, page).load(std::memory_order_relaxed);
      MESHALLOC_ASSERT(old == 0 || (PageEntry::isSpan(old) && PageEntry::pageIndex(old) == index &&
                                    PageEntry::sizeClass(old) == owner->sizeClass));
      uint16_t oldClass = classEntryRef(segment, page).load(std::memory_order_relaxed);
      MESHALLOC_ASSERT(oldClass == 0 ||
                       (small && oldClass == PageClassEntry::make(owner->sizeClass, index)));
    }
    entryRef(segment, page)
        .store(PageEntry::make(owner, index, owner->sizeClass), std::memory_order_release);
    // A large object's pages keep 0 (release cleared them): its frees take the full entry.
    if (small)
      classEntryRef(segment, page)
          .store(PageClassEntry::make(owner->sizeClass, index), std::memory_order_release);
  }
}

void Arena::releaseClean(uintptr_t start, size_t pages) {
  Segment* segment = segmentOf(start);
  insertFreeRun(segment, start, pages);
}

void Arena::clearOwnersLocked(Segment* segment, uintptr_t start, size_t pages) {
  MESHALLOC_ASSERT(segment != nullptr);
  MESHALLOC_ASSERT(start >= segment->base &&
                   pages <= segment->pages - ((start - segment->base) >> pageShift_));
  for (size_t i = 0; i < pages; i++) {
    uintptr_t page = start + (i << pageShift_);
    // A run given back is in use, not already free or cached (a double release would find
    // its own free-run marks), and each owned page records its position in this run.
    if constexpr (kChecksEnabled) {
      size_t index = i <= PageEntry::kMaxPageIndex ? i : PageEntry::kMaxPageIndex;
      uint64_t old = entryRef(segment, page).load(std::memory_order_relaxed);
      MESHALLOC_ASSERT(old == 0 || (PageEntry::isSpan(old) && PageEntry::pageIndex(old) == index));
      uint16_t oldClass = classEntryRef(segment, page).load(std::memory_order_relaxed);
      MESHALLOC_ASSERT(oldClass == 0 || PageClassEntry::pageIndex(oldClass) == index);
    }
    std::atomic<uint16_t>& classEntry = classEntryRef(segment, page);
    if (classEntry.load(std::memory_order_relaxed)) classEntry.store(0, std::memory_order_release);
    std::atomic<uint64_t>& entry = entryRef(segment, page);
    if (entry.load(std::memory_order_relaxed)) entry.store(0, std::memory_order_release);
  }
}

void Arena::forgetOwners(uintptr_t start, size_t pages) {
  LockGuard guard(lock_);
  clearOwnersLocked(segmentOf(start), start, pages);
}

bool Arena::forgetRunLocked(uintptr_t start, size_t pages) {
  Segment* segment = segmentOf(start);
  stats_.activeBytes -= pages << pageShift_;
  // Owner entries go first, so a later free of a stale pointer finds nothing.
  clearOwnersLocked(segment, start, pages);
  if (!segment->dedicated) return false;
  destroySegment(segment);
  return true;
}

void Arena::release(uintptr_t start, size_t pages, bool mayCache) {
  size_t bytes = pages << pageShift_;
  LockGuard guard(lock_);
  if (forgetRunLocked(start, pages)) return;
  uint64_t now = os::monotonicNanos();
  if (mayCache && bytes <= gHeapConfig.maxCachedRunBytes && gHeapConfig.dirtyCacheBytes > 0) {
    insertDirty(start, pages, now);
    if (stats_.dirtyBytes > dirtyLimitLocked() || now - lastDecayCheckNs_ > kDecayCheckIntervalNs) {
      purgeLocked(false, now);
    }
    return;
  }
  os::decommit(reinterpret_cast<void*>(start), bytes);
  stats_.purgedBytesTotal += bytes;
  releaseClean(start, pages);
}

void Arena::abandon(uintptr_t start, size_t pages) {
  LockGuard guard(lock_);
  forgetRunLocked(start, pages);
}

void Arena::releaseRemapped(uintptr_t start, size_t pages) {
  LockGuard guard(lock_);
  if (forgetRunLocked(start, pages)) return;
  releaseClean(start, pages);
}

size_t Arena::dirtyLimitLocked() {
  size_t cap = gHeapConfig.dirtyCacheBytes;
  if (gHeapConfig.dirtyCachePercent == 0) return cap;
  size_t limit = stats_.activeBytes / 100 * gHeapConfig.dirtyCachePercent;
  if (limit < kMinDirtyCacheBytes) limit = kMinDirtyCacheBytes;
  // A cache that serves nearly every request is feeding churn (large objects of many sizes
  // replaced at random reuse their runs within microseconds): holding it to a share of the
  // heap would only decommit pages to fault them in again. It may hold what it recently served,
  // which falls back to the share within tens of milliseconds once the churn stops.
  if (recentHitBytes_ > kChurningHitsPerMiss * recentMissBytes_ && recentHitBytes_ > limit)
    limit = recentHitBytes_;
  return limit < cap ? limit : cap;
}

void Arena::ageReuseCountersLocked(uint64_t nowNs) {
  uint64_t intervals = (nowNs - reuseCountersAgedNs_) / kDecayCheckIntervalNs;
  if (intervals == 0) return;
  reuseCountersAgedNs_ += intervals * kDecayCheckIntervalNs;
  unsigned shift = intervals < 63 ? static_cast<unsigned>(intervals) : 63;
  recentHitBytes_ >>= shift;
  recentMissBytes_ >>= shift;
}

size_t Arena::purgeLocked(bool everything, uint64_t nowNs) {
  lastDecayCheckNs_ = nowNs;
  ageReuseCountersLocked(nowNs);
  const size_t limit = dirtyLimitLocked();  // purging changes the dirty bytes, not the active
  size_t purged = 0;
  for (;;) {
    // The oldest run of each bin is at its back; purge the globally oldest first.
    DirtyRun* oldest = nullptr;
    for (size_t bin = 0; bin < kBins; bin++) {
      DirtyRun* candidate = dirtyBins_[bin].back();
      if (candidate && (!oldest || candidate->freedAtNs < oldest->freedAtNs)) oldest = candidate;
    }
    if (!oldest) break;
    uint64_t age = nowNs - oldest->freedAtNs;
    bool expired = age >= gHeapConfig.decayMs * kNanosPerMilli;
    bool overLimit = stats_.dirtyBytes > limit && age >= kMinPurgeAgeNs;
    if (!everything && !expired && !overLimit) break;
    removeDirty(oldest);
    size_t pages = oldest->pages;
    if (!everything && !expired) {
      // Only over the limit: give back the excess and keep the rest of the run cached. Runs
      // coalesce, so a burst of frees is often one run, and dropping it whole would leave a
      // small heap no cache at all.
      size_t excess =
          (stats_.dirtyBytes + (pages << pageShift_) - limit + pageSize_ - 1) >> pageShift_;
      if (excess < pages) {
        size_t kept = pages - excess;
        oldest->pages = kept;
        dirtyBins_[binFor(kept)].pushBack(oldest);  // still the oldest: purged first next time
        markDirty(oldest);
        stats_.dirtyBytes += kept << pageShift_;
        uintptr_t tail = oldest->start + (kept << pageShift_);
        os::decommit(reinterpret_cast<void*>(tail), excess << pageShift_);
        releaseClean(tail, excess);
        purged += excess << pageShift_;
        break;
      }
    }
    size_t bytes = pages << pageShift_;
    os::decommit(reinterpret_cast<void*>(oldest->start), bytes);
    releaseClean(oldest->start, pages);
    InternalHeap::free(oldest, sizeof(DirtyRun));
    purged += bytes;
  }
  stats_.purgedBytesTotal += purged;
  return purged;
}

size_t Arena::purge(bool everything) {
  LockGuard guard(lock_);
  return purgeLocked(everything, os::monotonicNanos());
}

bool Arena::tryGrow(uintptr_t start, size_t pages, size_t newPages) {
  LockGuard guard(lock_);
  Segment* segment = segmentOf(start);
  if (!segment || segment->dedicated) return false;
  uintptr_t end = start + (pages << pageShift_);
  size_t extra = newPages - pages;
  if (auto* run = reinterpret_cast<FreeRun*>(taggedRunAt(segment, end, PageEntry::kFreeRunTag))) {
    if (run->start != end || run->pages < extra) return false;
    splitAndTake(run, end, extra);
  } else if (auto* dirty =
                 reinterpret_cast<DirtyRun*>(taggedRunAt(segment, end, PageEntry::kDirtyRunTag))) {
    // A cached neighbour serves too (its pages are even committed already): a buffer growing
    // by reallocs next to a block it freed earlier then grows in place instead of moving and
    // leaving another freed copy behind.
    if (dirty->start != end || dirty->pages < extra) return false;
    takeDirtyHead(dirty, extra);
  } else {
    return false;
  }
  stats_.activeBytes += extra << pageShift_;
  return true;
}

bool Arena::shrink(uintptr_t start, size_t pages, size_t newPages) {
  if (newPages >= pages) return true;
  uintptr_t tail = start + (newPages << pageShift_);
  {
    LockGuard guard(lock_);
    if (segmentOf(start)->dedicated) return false;
  }
  release(tail, pages - newPages, false);
  return true;
}

uint64_t Arena::entryAtOrBelow(uintptr_t address) {
  LockGuard guard(lock_);
  Segment* segment = segmentOf(address);
  if (!segment) return 0;
  for (uintptr_t page = address & ~(pageSize_ - 1);; page -= pageSize_) {
    uint64_t entry = entryRef(segment, page).load(std::memory_order_acquire);
    if (entry) return entry;
    if (page == segment->base) return 0;
  }
}

const heap::ForkParticipant& Arena::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant =
      heap::mutexForkParticipant<lock_>("arena", heap::ForkRank::kArena);
  return kParticipant;
}

size_t Arena::mapResidentBytes() {
  LockGuard guard(lock_);
  size_t tableBytes = kTopEntries * sizeof(uintptr_t);
  size_t resident = os::residentBytes(pageMaps_, tableBytes) +
                    os::residentBytes(classMaps_, tableBytes) +
                    os::residentBytes(segments_, tableBytes);
  // Only the resident pages of the segment table can hold a segment: the others were never
  // written, and reading them would fault zero pages in for nothing. Few of its pages are in
  // use, so whole stretches are skipped with one call each.
  size_t entriesPerPage = pageSize_ / sizeof(Segment*);
  constexpr size_t kStretchPages = 512;
  size_t entriesPerStretch = entriesPerPage * kStretchPages;
  Segment* previous = nullptr;
  for (size_t stretch = 0; stretch < kTopEntries; stretch += entriesPerStretch) {
    size_t stretchEntries =
        kTopEntries - stretch < entriesPerStretch ? kTopEntries - stretch : entriesPerStretch;
    if (!os::residentBytes(&segments_[stretch], stretchEntries * sizeof(Segment*))) continue;
    for (size_t first = stretch; first < stretch + stretchEntries; first += entriesPerPage) {
      if (!os::residentBytes(&segments_[first], pageSize_)) continue;
      for (size_t g = first; g < first + entriesPerPage; g++) {
        Segment* segment = segments_[g].load(std::memory_order_relaxed);
        // A segment of several granules fills consecutive entries.
        if (!segment || segment == previous) continue;
        previous = segment;
        resident += os::residentBytes(segment->pageMap, segment->pageMapBytes);
      }
    }
  }
  return resident;
}

ArenaStats Arena::stats() {
  LockGuard guard(lock_);
  return stats_;
}

}  // namespace meshalloc
