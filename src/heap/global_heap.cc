#include "heap/global_heap.h"

#include "heap/arena.h"
#include "heap/errors.h"
#include "heap/internal_heap.h"
#include "heap/thread_heap.h"
#include "platform/os.h"
#include "support/assert.h"
#include "support/text_writer.h"

namespace meshalloc {

constinit GlobalHeap::ClassState GlobalHeap::classes_[kNumSizeClasses];

namespace {
// Large objects at least this big are not coloured: the buffers whose copies collided were
// small (Redis's 16 KiB query buffer), and a program sweeping big blocks page by page ran up to
// 20 % slower with them coloured (the `large` benchmark's 64 KiB-4 MiB blocks).
constexpr size_t kMaxColouredBytes = size_t{32} << 10;
// Fibonacci hashing: spreads consecutive page numbers over the offsets.
constexpr uint64_t kColourHashMultiplier = 0x9e3779b97f4a7c15ull;

// A cache-line multiple below a page and at most `slack`, varying with the span's address (the
// same run reused keeps its colour; any two runs rarely share one).
size_t colourOffset(uintptr_t start, size_t slack) {
  size_t limit = slack < os::pageSize() - kCacheLine ? slack : os::pageSize() - kCacheLine;
  size_t colours = limit / kCacheLine + 1;
  uint64_t hash = (static_cast<uint64_t>(start) >> os::pageShift()) * kColourHashMultiplier;
  return static_cast<size_t>((hash >> 32) % colours) * kCacheLine;
}
}  // namespace

size_t GlobalHeap::binFor(const Span* heap, uint32_t live) {
  size_t bin = static_cast<size_t>(live) * kOccupancyBins / heap->objectCount;
  return bin < kOccupancyBins ? bin : kOccupancyBins - 1;
}

void GlobalHeap::unlink(ClassState& state, Span* heap) {
  if (heap->state == SpanState::kPartial)
    state.partial[heap->occupancyBin].remove(heap);
  else if (heap->state == SpanState::kFull) {
    MESHALLOC_ASSERT(state.fullSpans > 0);
    state.fullSpans--;
  }
}

Span* GlobalHeap::createSpan(unsigned sizeClass) {
  const SpanPlan& plan = SizeClasses::plan(sizeClass);
  Span* heap = static_cast<Span*>(InternalHeap::allocate(Span::bytesFor(plan.objectCount)));
  if (!heap) return nullptr;
  bool zeroed = false;
  uintptr_t start = Arena::allocate(plan.pages, 0, &zeroed);
  if (!start) {
    InternalHeap::free(heap, Span::bytesFor(plan.objectCount));
    return nullptr;
  }
  new (heap) Span();
  heap->objectSize = plan.objectSize;
  heap->reciprocal = plan.reciprocal;
  heap->objectCount = plan.objectCount;
  heap->spanPages = plan.pages;
  heap->sizeClass = static_cast<uint8_t>(sizeClass);
  heap->spanStart = start;
  heap->zeroed = zeroed;
  heap->bitmap().clearAll();
  Arena::assign(start, plan.pages, heap, true);
  return heap;
}

void GlobalHeap::pin(Span* heap) {
  if (!heap->pinned.exchange(true, std::memory_order_relaxed))
    pinnedSpans_.fetch_add(1, std::memory_order_relaxed);
}

void GlobalHeap::destroySpan(ClassState& state, Span* heap) {
  // Only a detached span (or one being detached) dies here: never one still attached to a
  // thread, taken by the mesher, retired, large or already freed.
  MESHALLOC_ASSERT(heap->state == SpanState::kAttached || heap->state == SpanState::kUnlisted ||
                   heap->state == SpanState::kPartial || heap->state == SpanState::kFull);
  MESHALLOC_ASSERT(heap->owner.load(std::memory_order_relaxed) == nullptr);
  MESHALLOC_ASSERT(state.spans > 0);
  if (heap->pinned.load(std::memory_order_relaxed))
    pinnedSpans_.fetch_sub(1, std::memory_order_relaxed);
  unlink(state, heap);
  heap->state = SpanState::kFreed;
  state.spans--;
  if (heap->mesh) {
    // Its pages are in meshing's shared file: meshing takes it from here.
    void (*died)(Span*) = meshedSpanDiedHook_.load(std::memory_order_acquire);
    MESHALLOC_ASSERT(died != nullptr);
    died(heap);
    return;
  }
  Arena::release(heap->spanStart, heap->spanPages, !tlsBypassDirtyCache_);
  InternalHeap::free(heap, Span::bytesFor(heap->objectCount));
}

unsigned GlobalHeap::exchangeSpans(unsigned sizeClass, ThreadHeap* owner, Span* const* release,
                                   unsigned releaseCount, Span** acquired, unsigned maxAcquire,
                                   uint32_t wantSlots) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  for (unsigned i = 0; i < releaseCount; i++) {
    MESHALLOC_ASSERT(release[i]->owner.load(std::memory_order_relaxed) == owner);
    MESHALLOC_ASSERT(release[i]->sizeClass == sizeClass);
    detachLocked(state, release[i]);
  }
  unsigned count = 0;
  uint32_t covered = 0;
  for (size_t bin = kOccupancyBins; bin-- > 0 && count < maxAcquire && covered < wantSlots;) {
    while (count < maxAcquire && covered < wantSlots) {
      Span* heap = state.partial[bin].popFront();
      if (!heap) break;
      MESHALLOC_ASSERT(heap->state == SpanState::kPartial && heap->occupancyBin == bin);
      covered += heap->freeSlots();
      acquired[count++] = heap;
    }
  }
  if (count == 0 && maxAcquire > 0) {
    Span* heap = createSpan(sizeClass);
    if (!heap) return 0;
    state.spans++;
    acquired[count++] = heap;
  }
  MESHALLOC_ASSERT(count <= maxAcquire);
  for (unsigned i = 0; i < count; i++) {
    // A partial span from a bin or a fresh one: detached, its remote-free stack closed.
    MESHALLOC_ASSERT(acquired[i]->state == SpanState::kPartial ||
                     acquired[i]->state == SpanState::kFreed);
    MESHALLOC_ASSERT(acquired[i]->owner.load(std::memory_order_relaxed) == nullptr);
    MESHALLOC_ASSERT(Span::isClosed(acquired[i]->remoteFrees.load(std::memory_order_relaxed)));
    acquired[i]->state = SpanState::kAttached;
    // Its new owner may hand out and write any slot: trimmed pages come back as they are touched.
    acquired[i]->trimmedBytes = 0;
    acquired[i]->owner.store(owner, std::memory_order_seq_cst);
    uintptr_t closed =
        acquired[i]->remoteFrees.exchange(Span::kRemoteFreesEmpty, std::memory_order_acq_rel);
    acquired[i]->claimsNeedTags = closed == Span::kRemoteFreesClosedAfterFree;
  }
  return count;
}

void GlobalHeap::placeDetached(ClassState& state, Span* heap) {
  // Called for a span leaving its owner (detachLocked) or taken out of its list (refile).
  MESHALLOC_ASSERT(heap->state == SpanState::kAttached || heap->state == SpanState::kUnlisted);
  MESHALLOC_ASSERT(heap->owner.load(std::memory_order_relaxed) == nullptr);
  uint32_t live = heap->liveCount.load(std::memory_order_seq_cst);
  if (live == 0) {
    destroySpan(state, heap);
  } else if (live >= heap->objectCount || heap->allocationClosed) {
    heap->state = SpanState::kFull;
    state.fullSpans++;
  } else {
    heap->state = SpanState::kPartial;
    heap->occupancyBin = static_cast<uint8_t>(binFor(heap, live));
    // Refills take from the front: oldest first. A span's bin is fixed when it is placed, and
    // frees keep landing in it afterwards, so the longest-placed spans have the most free slots
    // (newest first, an LRU cache's refills each got the span that had just lost its first
    // object: one slot per span, a refill every few allocations).
    state.partial[heap->occupancyBin].pushBack(heap);
  }
}

void GlobalHeap::refile(ClassState& state, Span* heap) {
  MESHALLOC_ASSERT(heap->state == SpanState::kPartial || heap->state == SpanState::kFull ||
                   heap->state == SpanState::kMeshing);
  unlink(state, heap);
  heap->state = SpanState::kUnlisted;
  placeDetached(state, heap);
}

void GlobalHeap::detachLocked(ClassState& state, Span* heap) {
  // Only an attached span is detached, and its owner has closed its remote-free stack first
  // (ThreadHeap::drainRemoteFrees with kRemoteFreesClosed), so no block is left on it.
  MESHALLOC_ASSERT(heap->state == SpanState::kAttached);
  MESHALLOC_ASSERT(heap->owner.load(std::memory_order_relaxed) != nullptr);
  MESHALLOC_ASSERT(Span::isClosed(heap->remoteFrees.load(std::memory_order_relaxed)));
  // seq_cst pairs with freeToBitmap: either this sees its decrement or it sees owner == nullptr.
  heap->owner.store(nullptr, std::memory_order_seq_cst);
  placeDetached(state, heap);
}

void GlobalHeap::releaseSpan(Span* heap) {
  ClassState& state = classes_[heap->sizeClass];
  LockGuard guard(state.lock);
  detachLocked(state, heap);
}

void GlobalHeap::freeToBitmap(Span* heap, unsigned sizeClass, size_t slot, uintptr_t address) {
  // Into a detached span, the block stays untagged: the span's next owner must tag what it
  // claims (marked before the bit is cleared, so a refill that claims the slot sees the mark).
  uintptr_t closed = Span::kRemoteFreesClosed;
  if (heap->remoteFrees.load(std::memory_order_relaxed) == closed) {
    heap->remoteFrees.compare_exchange_strong(closed, Span::kRemoteFreesClosedAfterFree,
                                              std::memory_order_release, std::memory_order_relaxed);
  }
  if (!heap->bitmap().tryUnset(slot))
    reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(address));
  uint32_t objectCount = SizeClasses::plan(sizeClass).objectCount;
  uint32_t before = heap->liveCount.fetch_sub(1, std::memory_order_seq_cst);
  // Attached spans are their owner's business. A detached span needs the lock twice in its
  // life as a full span: when its first slot comes free (out of the full count, into a bin refills
  // draw from; once per N objects, not per free) and when its last object goes (freed).
  // With 1 < before < objectCount the span keeps an object and stays where it is.
  if (before != objectCount && before != 1) return;
  if (heap->owner.load(std::memory_order_seq_cst) != nullptr) return;
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  // Re-check under the lock: another thread may have attached, moved or freed it meanwhile
  // (seq_cst pairs with detachLocked: it saw our decrement or we see its owner == nullptr).
  if (heap->sizeClass != sizeClass ||
      (heap->state != SpanState::kPartial && heap->state != SpanState::kFull))
    return;
  uint32_t live = heap->liveCount.load(std::memory_order_seq_cst);
  if (live == 0) {
    destroySpan(state, heap);
  } else if (heap->state == SpanState::kFull && live < heap->objectCount) {
    refile(state, heap);
    if (spanFreedIntoHook_) spanFreedIntoHook_(heap->spanBytes(os::pageSize()));
  }
}

void* GlobalHeap::allocateLarge(size_t bytes, size_t alignment, bool* zeroed) {
  size_t pageSize = os::pageSize();
  size_t pages = (bytes + pageSize - 1) >> os::pageShift();
  if (pages == 0) pages = 1;
  // Colouring (see HeapConfig::largeColouring) uses the tail slack only (a whole extra page
  // cost more than it saved); aligned requests beyond a line keep their span's alignment.
  size_t slack = (pages << os::pageShift()) - bytes;
  bool colour = gHeapConfig.largeColouring && alignment <= kCacheLine &&
                bytes < kMaxColouredBytes && slack >= kCacheLine;
  Span* heap = static_cast<Span*>(InternalHeap::allocate(Span::bytesFor(1)));
  if (!heap) return nullptr;
  uintptr_t start = Arena::allocate(pages, alignment, zeroed);
  if (!start) {
    InternalHeap::free(heap, Span::bytesFor(1));
    return nullptr;
  }
  new (heap) Span();
  if (colour) heap->largeOffset = static_cast<uint32_t>(colourOffset(start, slack));
  heap->sizeClass = kLargeClass;
  heap->objectCount = 1;
  heap->objectSize = static_cast<uint32_t>(pages > UINT32_MAX ? UINT32_MAX : pages);
  heap->spanPages = static_cast<uint32_t>(pages);
  heap->spanStart = start;
  heap->zeroed = *zeroed;
  heap->requestedBytes = bytes;
  heap->state = SpanState::kLarge;
  heap->liveCount.store(1, std::memory_order_relaxed);
  if (pages > UINT32_MAX) {
    // spanPages is 32-bit: more than 16 TiB in one object is beyond any machine's memory.
    Arena::release(start, pages, false);
    InternalHeap::free(heap, Span::bytesFor(1));
    return nullptr;
  }
  Arena::assign(start, pages, heap, false);
  LockGuard guard(largeLock_);
  largeBytes_ += heap->spanBytes(pageSize);
  largeRequested_ += heap->requestedBytes;
  largeCount_++;
  return reinterpret_cast<void*>(heap->largeStart());
}

void GlobalHeap::freeLarge(Span* heap, uintptr_t address) {
  MESHALLOC_ASSERT(heap->state == SpanState::kLarge && heap->isLarge());
  if (heap->liveCount.exchange(0, std::memory_order_acq_rel) != 1) {
    reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(address));
  }
  {
    LockGuard guard(largeLock_);
    largeBytes_ -= heap->spanBytes(os::pageSize());
    largeRequested_ -= heap->requestedBytes;
    largeCount_--;
  }
  heap->state = SpanState::kFreed;
  Arena::release(heap->spanStart, heap->spanPages, true);
  InternalHeap::free(heap, Span::bytesFor(1));
}

bool GlobalHeap::noteRequestedBytes(Span* heap, size_t bytes) {
  LockGuard guard(largeLock_);
  largeRequested_ = largeRequested_ - heap->requestedBytes + bytes;
  heap->requestedBytes = bytes;
  return true;
}

bool GlobalHeap::resizeLargeInPlace(Span* heap, size_t bytes) {
  size_t pageSize = os::pageSize();
  if (bytes > SIZE_MAX - heap->largeOffset - pageSize) return false;
  size_t pages = (bytes + heap->largeOffset + pageSize - 1) >> os::pageShift();
  if (pages > UINT32_MAX) return false;
  if (pages == heap->spanPages) return noteRequestedBytes(heap, bytes);
  if (pages < heap->spanPages) {
    // A dedicated segment keeps its pages; the object still fits, so stay put unchanged.
    if (!Arena::shrink(heap->spanStart, heap->spanPages, pages))
      return noteRequestedBytes(heap, bytes);
  } else if (!Arena::tryGrow(heap->spanStart, heap->spanPages, pages)) {
    return false;
  }
  LockGuard guard(largeLock_);
  largeBytes_ = largeBytes_ - heap->spanBytes(pageSize) + pages * pageSize;
  largeRequested_ = largeRequested_ - heap->requestedBytes + bytes;
  heap->requestedBytes = bytes;
  heap->spanPages = static_cast<uint32_t>(pages);
  heap->zeroed = false;
  return true;
}

size_t GlobalHeap::takeMeshCandidates(unsigned sizeClass, uint32_t maxLive, Span** out, size_t max,
                                      uint32_t minLive) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  size_t count = 0;
  // Offered spans go back to the end of their bin: a bin's spans not yet offered in this sweep
  // come before its first span that was, and the walk stops there. When a sweep has no more to
  // offer, the next one begins (spans placed since are offered then too).
  for (int sweep = 0; sweep < 2 && count < max; sweep++) {
    if (sweep == 1) {
      // Skips 0, which new spans carry (the sum is taken in uint16_t so that it wraps there).
      uint16_t next = static_cast<uint16_t>(state.meshSweep + 1);
      state.meshSweep = next ? next : 1;
    }
    for (size_t bin = 0; bin < kOccupancyBins && count < max; bin++) {
      Span* heap = state.partial[bin].front();
      while (heap && count < max && heap->meshSweep != state.meshSweep) {
        Span* next = state.partial[bin].next(heap);
        uint32_t live = heap->liveCount.load(std::memory_order_acquire);
        MESHALLOC_ASSERT(heap->state == SpanState::kPartial && heap->occupancyBin == bin);
        if (live > 0 && live >= minLive && live <= maxLive &&
            !heap->pinned.load(std::memory_order_relaxed)) {
          state.partial[bin].remove(heap);
          heap->state = SpanState::kMeshing;
          heap->meshSweep = state.meshSweep;
          out[count++] = heap;
        }
        heap = next;
      }
    }
  }
  return count;
}

void GlobalHeap::returnMeshCandidates(unsigned sizeClass, Span* const* spans, size_t count) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  for (size_t i = 0; i < count; i++) {
    // Sources meshed away were retired (retireMeshedSource), not handed back.
    MESHALLOC_ASSERT(spans[i]->state != SpanState::kMeshedAway);
    if (spans[i]->state != SpanState::kMeshing) continue;
    refile(state, spans[i]);
  }
}

void GlobalHeap::retireMeshedSource(unsigned sizeClass, Span* source) {
  ClassState& state = classes_[sizeClass];
  {
    LockGuard guard(state.lock);
    MESHALLOC_ASSERT(source->state == SpanState::kMeshedAway);
    MESHALLOC_ASSERT(state.spans > 0);
    source->state = SpanState::kFreed;
    state.spans--;
  }
  InternalHeap::free(source, Span::bytesFor(source->objectCount));
}

void GlobalHeap::partialOccupancy(unsigned sizeClass, size_t* spans, size_t* freeSlots) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  *spans = 0;
  *freeSlots = 0;
  auto count = [&](IntrusiveList<Span>& list) {
    for (Span* heap = list.front(); heap; heap = list.next(heap)) {
      if (uint32_t free = heap->freeSlots()) {
        (*spans)++;
        *freeSlots += free;
      }
    }
  };
  for (auto& bin : state.partial) count(bin);
}

SizeClassStats GlobalHeap::classStats(unsigned sizeClass) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  SizeClassStats result = {kSizeClassSizes[sizeClass], state.spans, 0, 0, state.fullSpans};
  for (auto& bin : state.partial) {
    result.partialSpans += bin.size();
    for (Span* heap = bin.front(); heap; heap = bin.next(heap)) {
      result.liveObjects += heap->liveCount.load(std::memory_order_relaxed);
    }
  }
  // A full span holds every slot; a free into one decrements its count just before taking this
  // lock to move it, so for that moment its object is still counted here.
  result.liveObjects += state.fullSpans * SizeClasses::plan(sizeClass).objectCount;
  return result;
}

GlobalHeap::DetachedUsage GlobalHeap::detachedUsage(unsigned sizeClass) {
  ClassState& state = classes_[sizeClass];
  LockGuard guard(state.lock);
  DetachedUsage usage = {};
  usage.spans = state.spans;
  usage.fullSpans = state.fullSpans;
  for (auto& bin : state.partial) {
    for (Span* heap = bin.front(); heap; heap = bin.next(heap)) {
      uint32_t live = heap->liveCount.load(std::memory_order_relaxed);
      if (live > heap->objectCount) live = heap->objectCount;
      usage.partialSpans++;
      usage.partialLive += live;
      usage.freeSlots[binFor(heap, live)] += heap->objectCount - live;
      if (!heap->mesh) usage.trimmedBytes[binFor(heap, live)] += heap->trimmedBytes;
    }
  }
  return usage;
}

GlobalHeap::LargeUsage GlobalHeap::largeUsage() {
  LockGuard guard(largeLock_);
  return {largeCount_, largeBytes_, largeRequested_};
}

void GlobalHeap::debugDump(unsigned sizeClass) {
  char line[256];
  // Diagnostics only: reads other threads' spans without their locks.
  auto printSpan = [&](const char* what, Span* heap) {
    TextWriter writer(line, sizeof(line));
    writer.text(what)
        .pointer(heap)
        .text(" start ")
        .pointer(reinterpret_cast<void*>(heap->spanStart))
        .text(" live ")
        .unsignedValue(heap->liveCount.load())
        .text(" bits ")
        .unsignedValue(heap->bitmap().popcount())
        .text(" meshed ")
        .unsignedValue(heap->mesh != nullptr)
        .text(" remote ")
        .unsignedValue(heap->remoteFrees.load())
        .text(" pinned ")
        .unsignedValue(heap->pinned.load())
        .text("\n");
    os::writeStderr(writer.data(), writer.length());
  };
  {
    ClassState& state = classes_[sizeClass];
    LockGuard guard(state.lock);
    TextWriter writer(line, sizeof(line));
    writer.text("meshalloc: class ")
        .unsignedValue(kSizeClassSizes[sizeClass])
        .text(": spans ")
        .unsignedValue(state.spans)
        .text(", full (unlisted) ")
        .unsignedValue(state.fullSpans)
        .text("\n");
    os::writeStderr(writer.data(), writer.length());
    for (auto& bin : state.partial)
      for (Span* heap = bin.front(); heap; heap = bin.next(heap)) printSpan("  partial ", heap);
  }
  ThreadHeap::lockRegistry();
  for (ThreadHeap* threadHeap = ThreadHeap::registryHead(); threadHeap;
       threadHeap = threadHeap->nextInRegistry()) {
    ShuffleVector& v = threadHeap->vector(sizeClass);
    if (!v.attached.count() && v.recycled.empty()) continue;
    TextWriter writer(line, sizeof(line));
    writer.text("  heap ")
        .pointer(threadHeap)
        .text(" in use ")
        .unsignedValue(threadHeap->inUse())
        .text(" attached ")
        .unsignedValue(v.attached.count())
        .text(" vector ")
        .unsignedValue(v.slots.length())
        .text(" recycled ")
        .unsignedValue(v.recycled.count())
        .text("\n");
    os::writeStderr(writer.data(), writer.length());
    for (unsigned i = 0; i < v.attached.count(); i++)
      printSpan("    attached ", v.attached.record(i));
  }
  ThreadHeap::unlockRegistry();
}

size_t GlobalHeap::largeBytes() {
  LockGuard guard(largeLock_);
  return largeBytes_;
}

size_t GlobalHeap::largeCount() {
  LockGuard guard(largeLock_);
  return largeCount_;
}

void GlobalHeap::lockForFork() {
  for (auto& state : classes_) state.lock.lock();
  largeLock_.lock();
}

void GlobalHeap::unlockAfterFork() {
  largeLock_.unlock();
  for (auto& state : classes_) state.lock.unlock();
}

void GlobalHeap::resetAfterFork() {
  largeLock_.resetAfterFork();
  for (auto& state : classes_) state.lock.resetAfterFork();
}

}  // namespace meshalloc
