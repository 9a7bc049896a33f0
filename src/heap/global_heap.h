// The global heap owns every detached span, sorted per size class into occupancy bins so that
// refills take the fullest partial span first. It also serves large objects and the frees
// that do not land in the freeing thread's own attached span.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/size_class.h"
#include "heap/span.h"
#include "support/list.h"
#include "support/lock.h"

namespace meshalloc {

class ThreadHeap;

struct SizeClassStats {
  size_t objectSize;
  size_t spans;
  size_t liveObjects;  // owned slots: may include slots waiting in thread shuffle vectors
  size_t partialSpans;
  size_t fullSpans;
};

class GlobalHeap {
 public:
  static constexpr size_t kOccupancyBins = 4;

  // What the detached spans of one class hold (statistics, docs/memory.md).
  struct DetachedUsage {
    size_t spans;         // every span of the class, attached ones included
    size_t fullSpans;     // detached, no free slot
    size_t partialSpans;  // detached, in the occupancy bins
    uint64_t partialLive;
    // Free slots of the partial spans by their occupancy now (live * kOccupancyBins /
    // objects), which may be lower than the bin a span was filed in when it was placed.
    uint64_t freeSlots[kOccupancyBins];
    // Of those free slots' bytes, the ones on pages given back to the kernel (trimmed by the
    // mesher), by the same bins.
    uint64_t trimmedBytes[kOccupancyBins];
  };
  struct LargeUsage {
    size_t count;
    size_t spanBytes;       // their runs of pages
    size_t requestedBytes;  // what malloc, realloc & co. were asked for
  };

  // One trip to the global heap for a refill, under one lock: takes back `releaseCount` spans
  // from `owner`, then hands it up to `maxAcquire` spans, fullest first, until about
  // `wantSlots` free slots are covered (a fresh span if there is no partial one). Returns the
  // number of spans stored in `acquired`; 0 only when memory is exhausted.
  static unsigned exchangeSpans(unsigned sizeClass, ThreadHeap* owner, Span* const* release,
                                unsigned releaseCount, Span** acquired, unsigned maxAcquire,
                                uint32_t wantSlots);
  // Takes a span back from its owner; the owner has already returned its unused slots and
  // closed its remote-free stack.
  static void releaseSpan(Span* heap);
  // While set on the calling thread, spans it empties go back to the OS at once instead of into
  // the dirty cache: the idle-thread reclaimer sets it (ThreadHeap::reclaimIdle), because pages
  // a sleeping thread left empty are not the churn the cache is there to serve.
  static void setBypassDirtyCache(bool bypass) { tlsBypassDirtyCache_ = bypass; }
  // A free through the bitmap (the owner's own free when its vector is full, or any free of a
  // detached span, whose remote-free stack is closed): clears the slot's bit and places the span
  // if the free changed its list. The rest of the free path is heap/free.cc's.
  static void freeToBitmap(Span* heap, unsigned sizeClass, size_t slot, uintptr_t address);

  static void* allocateLarge(size_t bytes, size_t alignment, bool* zeroed);
  static void freeLarge(Span* heap, uintptr_t address);
  // Resizes a large object in place if the arena allows; returns false otherwise.
  static bool resizeLargeInPlace(Span* heap, size_t bytes);

  // --- for the mesher (mesh/) ---
  // Takes up to `max` detached partial spans of `sizeClass` holding at most `maxLive` objects
  // out of the lists (state kMeshing): nothing else attaches or frees them until they are
  // handed back. Returns how many were taken. Every span is offered once per sweep of the class
  // before any is offered again, sparsest bins first: a span's bin is fixed when it is placed,
  // so a heap freed down after filling sits in the fullest bin, and candidates that failed to
  // mesh (refiled by their true, lower occupancy) would otherwise be taken again every round
  // ahead of spans never tried.
  // With `minLive` above 1, only spans holding at least that many objects are taken (the mesher
  // trims spans too full to mesh, mesh/mesher.cc).
  static size_t takeMeshCandidates(unsigned sizeClass, uint32_t maxLive, Span** out, size_t max,
                                   uint32_t minLive = 1);
  // Hands spans taken above back to the lists (an empty one is freed).
  static void returnMeshCandidates(unsigned sizeClass, Span* const* spans, size_t count);
  // Forgets a span whose objects and virtual span now belong to another (meshed into it).
  static void retireMeshedSource(unsigned sizeClass, Span* source);
  // Detached spans with free slots in `sizeClass` (the partial bins) and those slots: what
  // meshing could gain.
  static void partialOccupancy(unsigned sizeClass, size_t* spans, size_t* freeSlots);

  static SizeClassStats classStats(unsigned sizeClass);
  static DetachedUsage detachedUsage(unsigned sizeClass);
  static LargeUsage largeUsage();
  // Diagnostics (mallctl "debug.class_dump"): every detached partial span of the class with its
  // live count and bitmap population, and every heap's attached spans, on stderr.
  static void debugDump(unsigned sizeClass);
  static size_t largeBytes();
  static size_t largeCount();
  // Pins `heap` against meshing, for good: a span attached to the calling thread, or a mesh
  // candidate the mesher holds. See Span::pinned.
  static void pin(Span* heap);
  // Spans that are pinned now.
  static size_t pinnedSpans() { return pinnedSpans_.load(std::memory_order_relaxed); }

  // `hook(span)`: a span whose pages are in meshing's shared file (Span::mesh) died; the
  // hook takes it over (mesh/retired_spans.h). Called with the class lock held.
  // Atomic: every mesh pass installs it again, while other threads may be reading it.
  static void setMeshedSpanDiedHook(void (*hook)(Span* span)) {
    meshedSpanDiedHook_.store(hook, std::memory_order_release);
  }
  // `hook(spanBytes)`: a detached full span just got its first free slot, i.e. it became a mesh
  // candidate (MeshPolicy wakes its thread early when a program frees a lot at once). Called
  // with the class lock held: it may only count and signal.
  static void setSpanFreedIntoHook(void (*hook)(size_t spanBytes)) { spanFreedIntoHook_ = hook; }

  static void lockForFork();
  static void unlockAfterFork();
  static void resetAfterFork();

 private:
  struct alignas(64) ClassState {
    Mutex lock{LockRank::kSizeClass};
    IntrusiveList<Span> partial[kOccupancyBins];
    // Full detached spans are only counted, not listed: nothing takes a span from them, and the
    // first free into one (which moves it to a bin) then touches no neighbours' lines.
    size_t fullSpans = 0;
    size_t spans = 0;
    // Candidates are offered once per sweep (takeMeshCandidates); never 0, which new spans carry.
    uint16_t meshSweep = 1;
  };

  static Span* createSpan(unsigned sizeClass);
  static void destroySpan(ClassState& state, Span* heap);
  static void placeDetached(ClassState& state, Span* heap);
  // Takes a detached span out of whatever list holds it and places it again by its live count.
  static void refile(ClassState& state, Span* heap);
  static void detachLocked(ClassState& state, Span* heap);
  static void unlink(ClassState& state, Span* heap);
  static size_t binFor(const Span* heap, uint32_t live);
  // A large object resized within its pages: only the bytes asked for change.
  static bool noteRequestedBytes(Span* heap, size_t bytes);

  static ClassState classes_[kNumSizeClasses];
  static inline constinit thread_local bool tlsBypassDirtyCache_ = false;
  static inline Mutex largeLock_{LockRank::kLarge};
  static inline size_t largeBytes_ = 0;
  static inline size_t largeCount_ = 0;
  static inline size_t largeRequested_ = 0;
  static inline std::atomic<size_t> pinnedSpans_{0};
  static inline std::atomic<void (*)(Span* span)> meshedSpanDiedHook_{nullptr};
  static inline void (*spanFreedIntoHook_)(size_t spanBytes) = nullptr;
};

}  // namespace meshalloc
