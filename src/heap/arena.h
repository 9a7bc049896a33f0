// The arena hands out runs of pages for spans and large objects. Address space is reserved in
// segments on demand (no fixed cap); a two-level table maps any address to its page's entry in
// the owning segment's page map, so pointer -> span record lookup is two dependent loads however
// large the heap grows. Empty runs are coalesced, and recently freed runs are kept committed in
// a small dirty cache that decays back to the OS.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"
#include "platform/os.h"
#include "support/list.h"
#include "support/lock.h"

namespace meshalloc {

struct Span;

// Page-map entry encoding. A span record pointer (64-byte aligned, so its low bits are clear)
// in bits 0..47; the page's index inside its virtual span in bits 48..55, so that any virtual
// span (including meshed aliases) can locate its own start; and the span's size class in bits
// 56..63 (kLargeClass for large objects), so that malloc_usable_size and pointer checks need
// not touch the span record (a cache miss in big heaps). A free run is marked on its first and
// last page with the run's bookkeeping pointer and a tag in the low bits. Every other page
// reads as zero.
struct PageEntry {
  static constexpr uint64_t kFreeRunTag = 1;
  // A run of freed pages still committed (the dirty cache), marked like a free run.
  static constexpr uint64_t kDirtyRunTag = 2;
  static constexpr uint64_t kTagMask = kFreeRunTag | kDirtyRunTag;
  static constexpr unsigned kPageIndexShift = 48;
  static constexpr unsigned kClassShift = 56;
  static constexpr uint64_t kPointerMask = (1ull << kPageIndexShift) - 1;
  static constexpr size_t kMaxPageIndex = (1u << (kClassShift - kPageIndexShift)) - 1;

  static bool isSpan(uint64_t entry) { return entry != 0 && !(entry & kTagMask); }
  static Span* span(uint64_t entry) { return reinterpret_cast<Span*>(entry & kPointerMask); }
  static size_t pageIndex(uint64_t entry) { return (entry >> kPageIndexShift) & kMaxPageIndex; }
  static unsigned sizeClass(uint64_t entry) { return static_cast<unsigned>(entry >> kClassShift); }
  static uint64_t make(Span* heap, size_t pageIndex, unsigned sizeClass) {
    return reinterpret_cast<uintptr_t>(heap) |
           (static_cast<uint64_t>(pageIndex) << kPageIndexShift) |
           (static_cast<uint64_t>(sizeClass) << kClassShift);
  }
};

// The compact page map: two bytes per page, for the fast paths that need only an address's size
// class and span start (malloc_usable_size, the first half of free). The full entries above are
// 8 bytes per page, so in a large heap whose lines keep getting evicted (Redis frees a random old
// key on every eviction) each of those calls missed; four times denser, this map mostly stays
// in cache. Bits 0..7 hold a small span's size class plus one (0 on every page that is not in a
// small span: free, cached, large), bits 8..15 the page's index in its virtual span. Meshing
// changes neither, so only assign and release write it.
struct PageClassEntry {
  static constexpr unsigned kPageIndexShift = 8;
  static constexpr uint16_t kClassMask = (1u << kPageIndexShift) - 1;

  // The entry widened to 32 bits: decoded in 16-bit arithmetic, each field cost the free
  // fast path a zero extension.
  static bool isSmall(uint32_t entry) { return (entry & kClassMask) != 0; }
  static unsigned sizeClass(uint32_t entry) { return (entry & kClassMask) - 1u; }
  // The class plus one, 0 where there is no small span (the inline free's vector index).
  static unsigned classByte(uint32_t entry) { return entry & kClassMask; }
  static size_t pageIndex(uint32_t entry) { return entry >> kPageIndexShift; }
  static uint16_t make(unsigned sizeClass, size_t pageIndex) {
    return static_cast<uint16_t>((sizeClass + 1u) | (pageIndex << kPageIndexShift));
  }
};

struct ArenaStats {
  size_t reservedBytes;  // address space held in segments
  size_t activeBytes;    // pages handed out to spans and large objects
  size_t dirtyBytes;     // freed pages still committed in the cache
  size_t segmentCount;
  size_t dedicatedCount;
  uint64_t purgedBytesTotal;
};

class Arena {
 public:
  static constexpr unsigned kGranuleShift = 26;  // segments are multiples of 64 MiB
  static constexpr size_t kGranule = size_t{1} << kGranuleShift;
  static constexpr unsigned kAddressBits = 47;  // user address space without 5-level hints
  static constexpr size_t kTopEntries = size_t{1} << (kAddressBits - kGranuleShift);
  // Objects at least this large get a segment of their own, unmapped when they are freed.
  static constexpr size_t kDedicatedThreshold = kGranule / 2;
  // Alignments this large are cheaper to satisfy with a segment of their own.
  static constexpr size_t kAlignedDedicatedDivisor = 4;
  static constexpr size_t kExactBins = 64;
  static constexpr size_t kBins = kExactBins + 48;
  // How often (at most) arena calls look for dirty runs that have outlived the decay time.
  static constexpr uint64_t kDecayCheckIntervalNs = 10'000'000;
  // Over the cache limit, runs younger than this are still kept: a program churning large
  // objects reuses them within microseconds, and decommitting them only to fault them in again
  // costs more than the memory is worth for that long.
  static constexpr uint64_t kMinPurgeAgeNs = 10'000'000;
  // The proportional dirty-cache limit (dirty_cache_percent) never goes below this: a tiny heap
  // still keeps a few spans' worth of freed pages for its next refill.
  static constexpr size_t kMinDirtyCacheBytes = size_t{1} << 20;
  // While the cache served more than this many bytes of requests per byte that it could not
  // serve (both counts halved every kDecayCheckIntervalNs), it may hold as many bytes as it
  // served (up to dirty_cache) whatever the heap's size.
  static constexpr uint64_t kChurningHitsPerMiss = 4;
  static constexpr uint64_t kNanosPerMilli = 1000000;

  static bool init();
  static size_t pageSize() { return pageSize_; }
  static size_t pageShift() { return pageShift_; }
#if defined(__x86_64__)
  // Base pages are 4 KiB on every x86-64 Linux: as constants, the free path's page arithmetic
  // loads nothing (init checks the kernel agrees).
  static constexpr size_t kFixedPageShift = 12;
  static constexpr size_t fastPageShift() {
    return kFixedPageShift;
  }
#else
  static size_t fastPageShift() {
    return pageShift_;
  }
#endif

  // Returns the start of `pages` contiguous pages aligned to `alignment` bytes (0 or a power
  // of two), or 0 if address space is exhausted. *zeroed tells whether they are fresh zeros.
  static uintptr_t allocate(size_t pages, size_t alignment, bool* zeroed);
  // Returns a run to the arena. `mayCache` lets it sit in the dirty cache for quick reuse.
  static void release(uintptr_t start, size_t pages, bool mayCache);
  // Returns a run whose pages were just replaced by a fresh private mapping (a meshed span
  // made private again): it holds no pages, so it goes straight to the clean runs, without a
  // decommit call or a stay in the dirty cache.
  static void releaseRemapped(uintptr_t start, size_t pages);
  // A run that could not be made private again (its mapping call failed): its owner entries
  // are cleared, so a stale free finds nothing, and its pages are never handed out again.
  static void abandon(uintptr_t start, size_t pages);
  // Clears the owner entries of a run that stays out of use for now (a retired meshed span):
  // a stale free through it finds nothing. It is released later.
  static void forgetOwners(uintptr_t start, size_t pages);
  // Extends [start, start+pages) in place to newPages if the following pages are free or cached.
  static bool tryGrow(uintptr_t start, size_t pages, size_t newPages);
  // Returns the tail of a run beyond newPages to the arena; false (run unchanged) if the run
  // is a dedicated segment, which is only ever released whole.
  static bool shrink(uintptr_t start, size_t pages, size_t newPages);

  // Records the owner of every page of a span (every page for small spans so interior
  // addresses resolve; the first page only for large objects).
  static void assign(uintptr_t start, size_t pages, Span* owner, bool everyPage);

  static uint64_t entryFor(uintptr_t address) {
    const std::atomic<uint64_t>* entry = slotIn<uint64_t>(pageMaps_, address);
    return entry ? entry->load(std::memory_order_acquire) : 0;
  }
  // The compact entry of `address`'s page (0 outside the arena).
  static uint16_t classEntryFor(uintptr_t address) {
    uintptr_t biased = classMapFor(address);
    return biased ? classEntryIn(biased, address) : 0;
  }
  // The same in two steps, for the inline free, which leaves at once outside the arena: the
  // biased base of the compact map that covers `address` (0 outside the arena), then the entry.
  static uintptr_t classMapFor(uintptr_t address) {
    size_t granule = address >> kGranuleShift;
    if (granule >= kTopEntries) return 0;
    return classMaps_[granule].load(std::memory_order_acquire);
  }
  static uint16_t classEntryIn(uintptr_t biased, uintptr_t address) {
    return reinterpret_cast<const std::atomic<uint16_t>*>(biased + (address >> fastPageShift()) *
                                                                       sizeof(uint16_t))
        ->load(std::memory_order_acquire);
  }
  // Where `address`'s full entry lives (for a prefetch); nullptr outside the arena.
  static const void* entryAddressFor(uintptr_t address) {
    return slotIn<uint64_t>(pageMaps_, address);
  }
  static uintptr_t spanStartOfClassEntry(uintptr_t address, uint32_t entry) {
    size_t shift = fastPageShift();
    return ((address >> shift) - PageClassEntry::pageIndex(entry)) << shift;
  }
  // Start of the virtual span holding `address`, from its page-map entry (each virtual span,
  // meshed aliases included, records its pages' indices, so this finds the alias's own start).
  static uintptr_t spanStartOf(uintptr_t address, uint64_t entry) {
    return (address & ~(pageSize_ - 1)) - (PageEntry::pageIndex(entry) << pageShift_);
  }
  // False before the arena exists (the exported system-call wrappers may run that early).
  static bool contains(uintptr_t address) {
    size_t granule = address >> kGranuleShift;
    std::atomic<uintptr_t>* maps = pageMaps_;
    return maps && granule < kTopEntries && maps[granule].load(std::memory_order_relaxed) != 0;
  }

  // For error reports only: the owner of the nearest owned page at or below `address` in the
  // same segment (large objects record their owner on their first page only).
  static uint64_t entryAtOrBelow(uintptr_t address);

  // Gives back dirty runs older than the decay time (all of them if `everything`), and any in
  // excess of the cache limit. Returns the bytes decommitted.
  static size_t purge(bool everything);
  static ArenaStats stats();
  // Resident bytes of the page maps, compact maps and the three top-level tables (mincore: they
  // are reserved whole but only the pages written are backed). For statistics; slow.
  static size_t mapResidentBytes();

  // Its lock, for fork (heap/fork.cc).
  static const heap::ForkParticipant& forkParticipant();

 private:
  struct Segment {
    uintptr_t base;
    size_t pages;
    bool dedicated;
    std::atomic<uint64_t>* pageMap;
    size_t pageMapBytes;
    std::atomic<uint16_t>* classMap;  // the compact map, in the same reservation after pageMap
  };
  struct FreeRun : ListNode {
    uintptr_t start;
    size_t pages;
    Segment* segment;
  };
  struct DirtyRun : ListNode {
    uintptr_t start;
    size_t pages;
    uint64_t freedAtNs;
    Segment* segment;
  };

  // `address`'s entry in the map whose biased bases `top` holds per granule; nullptr outside the
  // arena.
  template <typename Entry>
  static const std::atomic<Entry>* slotIn(const std::atomic<uintptr_t>* top, uintptr_t address) {
    size_t granule = address >> kGranuleShift;
    if (granule >= kTopEntries) return nullptr;
    uintptr_t biased = top[granule].load(std::memory_order_acquire);
    if (!biased) return nullptr;
    return reinterpret_cast<const std::atomic<Entry>*>(biased +
                                                       (address >> pageShift_) * sizeof(Entry));
  }
  static size_t binFor(size_t pages);
  static Segment* segmentOf(uintptr_t address) {
    return segments_[address >> kGranuleShift].load(std::memory_order_relaxed);
  }
  static std::atomic<uint64_t>& entryRef(Segment* segment, uintptr_t address) {
    return segment->pageMap[(address - segment->base) >> pageShift_];
  }
  static std::atomic<uint16_t>& classEntryRef(Segment* segment, uintptr_t address) {
    return segment->classMap[(address - segment->base) >> pageShift_];
  }
  static Segment* createSegment(size_t bytes, size_t alignment, bool dedicated);
  static void destroySegment(Segment* segment);
  static uintptr_t takeFromFreeRuns(size_t pages, size_t alignment);
  static void insertFreeRun(Segment* segment, uintptr_t start, size_t pages);
  static void removeFreeRun(FreeRun* run);
  // Free and dirty runs are marked on their first and last page, so a run being inserted
  // finds its neighbours in constant time.
  static void markRunEnds(Segment* segment, uintptr_t start, size_t pages, uint64_t value);
  // The record of the run just below `start` / starting at `address`, if that page carries
  // `tag`; 0 otherwise (also at the segment's edges).
  static uintptr_t taggedRunBefore(Segment* segment, uintptr_t start, uint64_t tag);
  static uintptr_t taggedRunAt(Segment* segment, uintptr_t address, uint64_t tag);
  static void markFreeRun(FreeRun* run);
  static void releaseClean(uintptr_t start, size_t pages);
  // With lock_ held: forgets the run's owner entries and active bytes; true if the run was a
  // dedicated segment, which is then destroyed whole.
  static bool forgetRunLocked(uintptr_t start, size_t pages);
  static void clearOwnersLocked(Segment* segment, uintptr_t start, size_t pages);
  static uintptr_t takeDirty(size_t pages);
  // Takes the first `pages` pages of a cached run out of the cache; the rest stays cached.
  static void takeDirtyHead(DirtyRun* run, size_t pages);
  static void insertDirty(uintptr_t start, size_t pages, uint64_t freedAtNs);
  static void markDirty(DirtyRun* run);
  static void removeDirty(DirtyRun* run);
  static size_t purgeLocked(bool everything, uint64_t nowNs);
  // Most dirty bytes kept: dirty_cache_percent of the active bytes (at least
  // kMinDirtyCacheBytes), at most the dirty_cache option.
  static size_t dirtyLimitLocked();
  // Halves the reuse counters once per kDecayCheckIntervalNs elapsed.
  static void ageReuseCountersLocked(uint64_t nowNs);
  static void splitAndTake(FreeRun* run, uintptr_t start, size_t pages);

  static inline Mutex lock_{LockRank::kArena};
  static inline std::atomic<uintptr_t>* pageMaps_ = nullptr;   // biased page-map base per granule
  static inline std::atomic<uintptr_t>* classMaps_ = nullptr;  // biased compact-map base
  static inline std::atomic<Segment*>* segments_ = nullptr;
  static inline size_t pageShift_ = 12;
  static inline size_t pageSize_ = 4096;
  static constinit inline IntrusiveList<FreeRun> freeBins_[kBins];
  static constinit inline IntrusiveList<DirtyRun> dirtyBins_[kBins];
  static inline ArenaStats stats_ = {};
  static inline uint64_t lastDecayCheckNs_ = 0;
  // Bytes of requests the dirty cache served, and bytes it could not serve while it held
  // something: how much of the cache is feeding churn (see dirtyLimitLocked).
  static inline uint64_t recentHitBytes_ = 0;
  static inline uint64_t recentMissBytes_ = 0;
  static inline uint64_t reuseCountersAgedNs_ = 0;
};

}  // namespace meshalloc
