#include "heap/thread_heap.h"

#include <errno.h>
#include <string.h>

#include <cstddef>
#include <new>
#include <type_traits>

#include "heap/arena.h"
#include "heap/errors.h"
#include "heap/global_heap.h"
#include "heap/heap.h"
#include "heap/internal_heap.h"
#include "platform/os.h"
#include "support/assert.h"
#include "support/lock.h"

namespace meshalloc {

constinit thread_local ThreadHeap* tlsThreadHeap __attribute__((tls_model("initial-exec"))) =
    nullptr;
constinit ThreadHeap gEmptyThreadHeap{};
constinit thread_local ThreadHeap* tlsFastPathHeap __attribute__((tls_model("initial-exec"))) =
    &gEmptyThreadHeap;
constinit thread_local ThreadHeap* tlsParkedHeap __attribute__((tls_model("initial-exec"))) =
    nullptr;

namespace {
Mutex gRegistryLock(LockRank::kThreadRegistry);
ThreadHeap* gRegistry = nullptr;
ThreadHeap* gPool = nullptr;  // heaps of finished threads, reused before allocating new ones
unsigned gHeapsInUse = 0;     // under gRegistryLock
// Held for a whole reclaim pass, and by fork's prepare handler: a child never inherits a heap
// half reclaimed.
Mutex gReclaimLock(LockRank::kIdleReclaim);
std::atomic<uint64_t> gIdleReclaims{0};

uint32_t vectorCapacity(unsigned sizeClass) {
  uint32_t perSpan = SizeClasses::plan(sizeClass).objectCount;
  uint32_t all = kVectorSpansWorth * perSpan;
  uint32_t budget = perSpan > kVectorEntryBudget ? perSpan : kVectorEntryBudget;
  return all < budget ? all : budget;
}
size_t entryBytes(unsigned sizeClass) {
  return vectorCapacity(sizeClass) * sizeof(uintptr_t);
}

// Which attached span holds `block`, one of the vector's own free slots.
int attachedIndexOf(const ShuffleVector& v, uintptr_t block) {
  uintptr_t spanStart = Arena::spanStartOfClassEntry(block, Arena::classEntryFor(block));
  int span = v.attached.indexAt(spanStart);
  return span >= 0 ? span : v.attached.indexByScan(spanStart);
}

size_t roundUpToPage(size_t bytes) {
  size_t pageSize = Arena::pageSize();
  return (bytes + pageSize - 1) & ~(pageSize - 1);
}

size_t maxEntryBytes() {
  size_t most = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) most = entryBytes(c) > most ? entryBytes(c) : most;
  return most;
}
}  // namespace

// The entries (and the scratch) start on the page after the ThreadHeap object and end on a page
// boundary, so that releaseEntryPages gives back all of them: with the entries packed behind the
// object, the page they shared with its end and their last page stayed resident in every heap
// (48 pooled heaps after thread-scaling's exit: 0.2 MB of zeros and stale entries).
size_t ThreadHeap::entriesOffset() {
  return roundUpToPage(sizeof(ThreadHeap));
}

size_t ThreadHeap::storageBytes() {
  size_t bytes = maxEntryBytes();
  for (unsigned c = 0; c < kNumSizeClasses; c++) bytes += entryBytes(c);
  return entriesOffset() + roundUpToPage(bytes);
}

void ThreadHeap::initialize() {
  // The fast paths' vectorForSize and vectorOfClassByte (thread_heap.h).
  static_assert(std::is_standard_layout_v<ThreadHeap>);
  static_assert(offsetof(ThreadHeap, unconfigured_) == 0);
  static_assert(offsetof(ThreadHeap, vectors_) == kVectorStride);
  char* cursor = reinterpret_cast<char*>(this) + entriesOffset();
  reorderScratch_ = reinterpret_cast<uintptr_t*>(cursor);
  cursor += maxEntryBytes();
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    ShuffleVector& v = vector(c);
    v.check.configure(SizeClasses::plan(c));
    v.slots.configure(reinterpret_cast<uintptr_t*>(cursor), vectorCapacity(c));
    cursor += entryBytes(c);
    size_t recycled = kRecycledBytes / kSizeClassSizes[c];
    v.recycled.configure(static_cast<uint32_t>(recycled > kMaxRecycled   ? kMaxRecycled
                                               : recycled < kMinRecycled ? kMinRecycled
                                                                         : recycled));
  }
}

ThreadHeap* ThreadHeap::create() {
  ThreadHeap* heap = nullptr;
  {
    LockGuard guard(gRegistryLock);
    if (gPool) {
      heap = gPool;
      gPool = heap->poolNext_;
    }
  }
  if (heap) {
    // retire() gave back the vectors' pages: configure them again.
    heap->initialize();
  } else {
    char* storage = static_cast<char*>(InternalHeap::allocate(storageBytes()));
    if (!storage) return nullptr;
    heap = new (storage) ThreadHeap();
    heap->initialize();
    LockGuard guard(gRegistryLock);
    heap->registryNext_ = gRegistry;
    gRegistry = heap;
  }
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const ShuffleVector& v = heap->vector(c);
    MESHALLOC_ASSERT(v.slots.empty() && v.attached.count() == 0 && v.recycled.empty());
  }
  heap->rng_.reseed(os::entropy64() ^ reinterpret_cast<uintptr_t>(heap));
  heap->randomization_ = gHeapConfig.randomization;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    heap->vector(c).slots.setShufflesEveryPush(heap->randomization_ ==
                                               Randomization::kOnRefillAndFree);
  }
  heap->parkWord_.store(heap->parkWord_.load(std::memory_order_relaxed) & ~kStateMask,
                        std::memory_order_relaxed);
  LockGuard guard(gRegistryLock);
  heap->inUse_ = true;
  heap->updateRecycledOrder(true);
  return heap;
}

void ThreadHeap::setRecycledFirst(bool first) {
  for (unsigned c = 0; c < kNumSizeClasses; c++) vector(c).setRecycledFirst(first);
}

void ThreadHeap::updateRecycledOrder(bool joined) {
  gHeapsInUse += joined ? 1 : -1u;
  if (joined) setRecycledFirst(gHeapsInUse == 1);
  // The count crossed between one and two: every heap in use changes order.
  if (gHeapsInUse == (joined ? 2u : 1u)) {
    for (ThreadHeap* heap = gRegistry; heap; heap = heap->registryNext_) {
      if (heap->inUse_) heap->setRecycledFirst(gHeapsInUse == 1);
    }
  }
}

namespace {
// The whole pages within [start, end).
ThreadHeap::PageRange wholePagesIn(uintptr_t start, uintptr_t end) {
  uintptr_t first = roundUpToPage(start);
  uintptr_t last = end & ~(uintptr_t{Arena::pageSize()} - 1);
  return {first, last > first ? last - first : 0};
}
}  // namespace

ThreadHeap::PageRange ThreadHeap::entryPages() const {
  uintptr_t base = reinterpret_cast<uintptr_t>(this);
  return wholePagesIn(base + entriesOffset(), base + storageBytes());
}

ThreadHeap::PageRange ThreadHeap::vectorPages() const {
  // From the unconfigured vector, which is zeros too.
  return wholePagesIn(reinterpret_cast<uintptr_t>(&unconfigured_),
                      reinterpret_cast<uintptr_t>(vectors_ + kNumSizeClasses));
}

void ThreadHeap::releaseEntryPages() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) MESHALLOC_ASSERT(vector(c).slots.empty());
  PageRange pages = entryPages();
  // A refusal only leaves the pages resident.
  if (pages.bytes) (void)os::dropPages(reinterpret_cast<void*>(pages.start), pages.bytes);
}

void ThreadHeap::retire() {
  detachAll();
  releaseEntryPages();
  // Every vector is empty: what the pages held is zeros and the configuration initialize()
  // writes again when create() takes the heap from the pool. Readers of other heaps' vectors
  // (statistics, double-free reports) see an empty vector either way.
  PageRange vectors = vectorPages();
  if (vectors.bytes) (void)os::dropPages(reinterpret_cast<void*>(vectors.start), vectors.bytes);
  // A thread cancelled inside a wrapped system call (poll, accept, read: cancellation points)
  // never took its buffer back: the mesher would skip that range for good, and the next
  // thread to reuse this heap would take its own calls for nested ones and publish nothing.
  activity_.ioBufferStart.store(0, std::memory_order_relaxed);
  activity_.ioBufferEnd.store(0, std::memory_order_release);
  LockGuard guard(gRegistryLock);
  inUse_ = false;
  updateRecycledOrder(false);
  poolNext_ = gPool;
  gPool = this;
}

void ThreadHeap::checkAttached(const ShuffleVector& v, unsigned span) const {
  MESHALLOC_ASSERT(v.attached.count() <= kMaxSpansPerVector);
  MESHALLOC_ASSERT(v.slots.length() <= v.slots.capacity());
  MESHALLOC_ASSERT(span < v.attached.count());
  const Span* heap = v.attached.record(span);
  // An attached span is owned by this heap, knows its position, and the table's copy of its
  // start (which frees read instead of the span record) is its start.
  MESHALLOC_ASSERT(heap != nullptr);
  MESHALLOC_ASSERT(heap->state == SpanState::kAttached);
  MESHALLOC_ASSERT(heap->owner.load(std::memory_order_relaxed) == this);
  MESHALLOC_ASSERT(heap->attachIndex == span);
  MESHALLOC_ASSERT(v.attached.start(span) == heap->spanStart);
}

ThreadHeap* ThreadHeap::park() {
  ThreadHeap* heap = tlsThreadHeap;
  if (!heap) return nullptr;  // no heap, or a wait nested in a signal handler of a parked one
  uint32_t running = heap->parkWord_.load(std::memory_order_relaxed);
  // From here on, an allocation by a signal handler finds no heap and resumes it first.
  tlsParkedHeap = heap;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  setThreadHeap(nullptr);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  heap->parkedSinceNs_.store(os::monotonicNanos(), std::memory_order_relaxed);
  // Release: everything this thread did to its heap is visible to the reclaimer. Fails only if
  // a signal handler resumed the heap in between (and restored the thread-local pointers).
  if (!heap->parkWord_.compare_exchange_strong(
          running, running | kParked, std::memory_order_release, std::memory_order_relaxed)) {
    return nullptr;
  }
  return heap;
}

void ThreadHeap::takeRunning() {
  uint32_t word = parkWord_.load(std::memory_order_acquire);
  for (;;) {
    if ((word & kStateMask) == kReclaiming) {
      int savedErrno = errno;
      os::futexWait(&parkWord_, word);
      errno = savedErrno;
      word = parkWord_.load(std::memory_order_acquire);
      continue;
    }
    // Acquire: the reclaimer's changes to this heap happen before the owner uses it again.
    uint32_t next = (word & ~kStateMask) + kGeneration + kRunning;
    if (parkWord_.compare_exchange_weak(word, next, std::memory_order_acquire,
                                        std::memory_order_acquire)) {
      return;
    }
  }
}

void ThreadHeap::unpark(ThreadHeap* heap) {
  if (!heap) return;
  heap->takeRunning();
  setThreadHeap(heap);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  tlsParkedHeap = nullptr;
}

ThreadHeap* ThreadHeap::resumeParked() {
  ThreadHeap* heap = tlsParkedHeap;
  if (!heap) return nullptr;
  unpark(heap);
  return heap;
}

size_t ThreadHeap::reclaimIdle(uint64_t nowNs, uint64_t idleNs, uint64_t* nextDueNs) {
  uint64_t nextDue = UINT64_MAX;
  LockGuard reclaimGuard(gReclaimLock);
  ThreadHeap* head;
  {
    LockGuard guard(gRegistryLock);
    head = gRegistry;
  }
  // Heaps are never freed and join the registry at its head: the list from `head` on is stable.
  size_t reclaimed = 0;
  for (ThreadHeap* heap = head; heap; heap = heap->registryNext_) {
    uint32_t word = heap->parkWord_.load(std::memory_order_acquire);
    if ((word & kStateMask) != kParked) continue;
    uint64_t since = heap->parkedSinceNs_.load(std::memory_order_relaxed);
    if (since == 0) continue;
    if (since > nowNs || nowNs - since < idleNs) {
      if (since + idleNs < nextDue) nextDue = since + idleNs;
      continue;
    }
    uint32_t reclaiming = (word & ~kStateMask) | kReclaiming;
    if (!heap->parkWord_.compare_exchange_strong(word, reclaiming, std::memory_order_acquire,
                                                 std::memory_order_relaxed)) {
      continue;  // its thread woke up
    }
    GlobalHeap::setBypassDirtyCache(true);
    heap::flushThreadCache(heap);
    heap->releaseEntryPages();
    GlobalHeap::setBypassDirtyCache(false);
    heap->parkedSinceNs_.store(0, std::memory_order_relaxed);
    heap->parkWord_.store(word, std::memory_order_release);
    os::futexWakeAll(&heap->parkWord_);
    reclaimed++;
  }
  gIdleReclaims.fetch_add(reclaimed, std::memory_order_relaxed);
  if (nextDueNs) *nextDueNs = nextDue;
  return reclaimed;
}

uint64_t ThreadHeap::idleReclaims() {
  return gIdleReclaims.load(std::memory_order_relaxed);
}
void ThreadHeap::lockReclaimForFork() {
  gReclaimLock.lock();
}
void ThreadHeap::unlockReclaimAfterFork() {
  gReclaimLock.unlock();
}
void ThreadHeap::resetReclaimAfterFork() {
  gReclaimLock.resetAfterFork();
}

void ThreadHeap::drainRemoteFrees(ShuffleVector& v, unsigned span, uintptr_t leaveAs) {
  checkAttached(v, span);
  MESHALLOC_ASSERT(leaveAs == Span::kRemoteFreesEmpty || leaveAs == Span::kRemoteFreesClosed);
  Span* heap = v.attached.record(span);
  uintptr_t block = heap->remoteFrees.load(std::memory_order_relaxed);
  if (block == leaveAs) return;
  block = heap->remoteFrees.exchange(leaveAs, std::memory_order_acquire);
  AtomicBitmap bitmap = heap->bitmap();
  size_t spanBytes = heap->spanBytes(Arena::pageSize());
  uint32_t drained = 0;
  while (block != Span::kRemoteFreesEmpty && !Span::isClosed(block)) {
    uintptr_t next = *reinterpret_cast<const uintptr_t*>(block);
    // A block freed through a meshed alias lies in another virtual span of the same pages.
    uintptr_t start = heap->spanStart;
    if (block - start >= spanBytes) start = Arena::spanStartOf(block, Arena::entryFor(block));
    int64_t slot = heap->slotOf(block - start);
    // Pushed twice (the second push made the block its own successor), freed here too (it sits
    // in the vector), or freed through the bitmap already: each is a double free.
    if (slot < 0 || (cacheTagOf(block) == vectorTag() && v.slots.holds(block)) ||
        !bitmap.tryUnset(static_cast<size_t>(slot))) {
      reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(block));
    }
    drained++;
    block = next;
  }
  if (drained) {
    uint32_t before = heap->liveCount.fetch_sub(drained, std::memory_order_acq_rel);
    // Every drained block was owned (its bit was set): the count cannot go below zero.
    MESHALLOC_ASSERT(before >= drained);
    (void)before;
  }
}

void ThreadHeap::claimFreeSlots(ShuffleVector& v, unsigned span) {
  checkAttached(v, span);
  Span* heap = v.attached.record(span);
  AtomicBitmap bitmap = heap->bitmap();
  uint32_t claimed = 0;
  // Slots freed while the span was attached carry their tag already, and slots never handed
  // out need none: left untouched, pages the program never used stay unfaulted. Only blocks
  // freed into the bitmap while the span was detached must be tagged here.
  bool tag = heap->claimsNeedTags;
  heap->claimsNeedTags = false;
  for (size_t w = 0; w < bitmap.words() && !v.slots.full(); w++) {
    // Read first: most words of a busy span are full, and a failed claim still costs an atomic.
    uint64_t free = ~bitmap.loadWord(w) & bitmap.validMask(w);
    if (!free) continue;
    uint32_t room = v.slots.capacity() - v.slots.length();
    while (static_cast<uint32_t>(__builtin_popcountll(free)) > room)
      free &= free - 1;  // keep the top `room`
    uint64_t bits = bitmap.claimMask(w, free);
    while (bits) {
      unsigned bit = static_cast<unsigned>(__builtin_ctzll(bits));
      bits &= bits - 1;
      uintptr_t block = heap->spanStart + (w * 64 + bit) * heap->objectSize;
      if (tag) {
        v.slots.push(block);
      } else {
        v.slots.pushClaimed(block);
      }
      claimed++;
    }
  }
  MESHALLOC_ASSERT(v.slots.length() <= v.slots.capacity());
  if (claimed) heap->liveCount.fetch_add(claimed, std::memory_order_acq_rel);
}

void ThreadHeap::spill(ShuffleVector& v) {
  uint32_t count = v.slots.length() / 2;
  uint32_t returned[kMaxSpansPerVector] = {};
  size_t spanBytes = SizeClasses::plan(v.attached.record(0)->sizeClass).pages * Arena::pageSize();
  // Consecutive entries mostly share a span and a bitmap word (a refill claims them span by
  // span, in address order): their bits are cleared together.
  int runSpan = -1;
  size_t runWord = 0;
  uint64_t runMask = 0;
  auto flush = [&] {
    if (!runMask) return;
    Span* heap = v.attached.record(static_cast<unsigned>(runSpan));
    uint64_t wasSet = heap->bitmap().unsetMask(runWord, runMask);
    if (wasSet != runMask) {
      unsigned bit = static_cast<unsigned>(__builtin_ctzll(runMask & ~wasSet));
      uintptr_t block = heap->spanStart + (runWord * 64 + bit) * heap->objectSize;
      reportHeapError(HeapError::kDoubleFree, "free", reinterpret_cast<void*>(block));
    }
    runMask = 0;
  };
  for (uint32_t i = 0; i < count; i++) {
    uintptr_t entry = v.slots.entry(i);
    uintptr_t block = SlotStack::blockOf(entry);
    int span = runSpan >= 0 && block - v.attached.start(static_cast<unsigned>(runSpan)) < spanBytes
                   ? runSpan
                   : attachedIndexOf(v, block);
    MESHALLOC_ASSERT(span >= 0);
    Span* heap = v.attached.record(static_cast<unsigned>(span));
    int64_t slot = heap->slotOf(block - heap->spanStart);
    MESHALLOC_ASSERT(slot >= 0);
    // A block the program freed here carries the vector tag: it now says released, so that a
    // second free takes the slow path, which finds the bit clear. A slot claimed and never
    // handed out carries none and gets none (its page may never have been touched).
    if (entry & SlotStack::kTaggedEntry) setCacheTag(block, releasedTag());
    size_t word = static_cast<size_t>(slot) / 64;
    if (span != runSpan || word != runWord) {
      flush();
      runSpan = span;
      runWord = word;
    }
    runMask |= 1ull << (static_cast<size_t>(slot) % 64);
    returned[span]++;
  }
  flush();
  for (unsigned span = 0; span < v.attached.count(); span++) {
    if (returned[span])
      v.attached.record(span)->liveCount.fetch_sub(returned[span], std::memory_order_acq_rel);
  }
  v.slots.dropOldest(count);
}

void ThreadHeap::removeSpan(ShuffleVector& v, unsigned span) {
  // Only legal while the vector is empty, if another span takes its index: no entry refers
  // to the last by index.
  MESHALLOC_ASSERT(span + 1 == v.attached.count() || v.slots.empty());
  v.attached.remove(span);
}

void ThreadHeap::shuffle(ShuffleVector& v, const uint32_t* runStarts, unsigned runs) {
  if (randomization_ == Randomization::kNone) {
    // Pop from the end must yield ascending addresses: reverse the ascending fill.
    v.slots.reverse(0, v.slots.length());
    return;
  }
  if (randomization_ == Randomization::kRotatedRuns) {
    shuffleRuns(v, runStarts, runs);
    return;
  }
  v.slots.shuffle(rng_);
}

void ThreadHeap::shuffleRuns(ShuffleVector& v, const uint32_t* runStarts, unsigned runs) {
  // Popping from the end must yield each run from a random slot upwards, wrapping to its first
  // slot: reversing the run's two parts either side of that slot does it.
  for (unsigned r = 0; r < runs; r++) {
    uint32_t first = runStarts[r];
    uint32_t split = first + rng_.below(runStarts[r + 1] - first);
    v.slots.reverse(first, split);
    v.slots.reverse(split, runStarts[r + 1]);
  }
  if (runs < 2) return;
  // The runs in random order, through the scratch copy.
  unsigned order[kMaxSpansPerVector];
  for (unsigned r = 0; r < runs; r++) order[r] = r;
  rng_.shuffle(order, runs);
  v.slots.reorderRuns(runStarts, order, runs, reorderScratch_);
}

bool ThreadHeap::refill(unsigned sizeClass) {
  ShuffleVector& v = vector(sizeClass);
  if (!v.slots.empty()) return true;
  uint32_t objectsPerSpan = SizeClasses::plan(sizeClass).objectCount;
  uint32_t wanted = objectsPerSpan < v.slots.capacity() ? objectsPerSpan : v.slots.capacity();
  // A full span stays attached while the table has room: programs free most objects on the
  // thread that allocated them, and while the span is attached those frees are local pushes;
  // detached, each would be a remote free and the span a trip through the full list. Full
  // spans go back only when the attached spans' free slots fall short and the table needs
  // room for spans that have some. (The vector is empty: no entry refers to a span index.)
  uint32_t reclaimable = 0;
  for (unsigned span = 0; span < v.attached.count(); span++) {
    drainRemoteFrees(v, span, Span::kRemoteFreesEmpty);
    reclaimable += v.attached.record(span)->freeSlots();
  }
  Span* released[kMaxSpansPerVector];
  unsigned releasedCount = 0;
  auto release = [&](unsigned span) {
    drainRemoteFrees(v, span, Span::kRemoteFreesClosed);
    released[releasedCount++] = v.attached.record(span);
    removeSpan(v, span);
  };
  if (reclaimable < wanted) {
    for (unsigned span = v.attached.count();
         span-- > 0 && kMaxSpansPerVector - v.attached.count() < kRefillMinRoom;) {
      if (v.attached.record(span)->freeSlots() == 0) release(span);
    }
  } else if (reclaimable > v.slots.capacity()) {
    // Free slots of attached spans are memory only this thread can use: beyond what one vector
    // holds, hand spans with free slots back, where other threads and the mesher can use them.
    for (unsigned span = v.attached.count(); span-- > 0 && reclaimable > v.slots.capacity();) {
      uint32_t free = v.attached.record(span)->freeSlots();
      if (free == 0 || reclaimable - free < wanted) continue;
      reclaimable -= free;
      release(span);
    }
  }
  // Slots freed into attached spans through their bitmaps (by other threads, or by this one
  // while the vector was full) are reclaimed in place.
  uint32_t runStarts[kMaxSpansPerVector + 1];
  unsigned runs = 0;
  auto claim = [&](unsigned span) {
    uint32_t start = v.slots.length();
    claimFreeSlots(v, span);
    if (v.slots.length() != start) runStarts[runs++] = start;
  };
  for (unsigned span = 0; span < v.attached.count(); span++) claim(span);
  uint32_t length = v.slots.length();
  unsigned room = length < wanted ? kMaxSpansPerVector - v.attached.count() : 0;
  if (releasedCount || room) {
    // One trip (one lock) to the global heap per refill, however many spans change hands.
    Span* acquired[kMaxSpansPerVector];
    unsigned count = GlobalHeap::exchangeSpans(sizeClass, this, released, releasedCount, acquired,
                                               room, wanted - (length < wanted ? length : wanted));
    MESHALLOC_ASSERT(v.attached.count() + count <= kMaxSpansPerVector);
    for (unsigned i = 0; i < count; i++) claim(v.attached.add(acquired[i]));
  }
  MESHALLOC_ASSERT(runs <= kMaxSpansPerVector);
  MESHALLOC_ASSERT(v.slots.length() <= v.slots.capacity());
  v.attached.rebuild();
  runStarts[runs] = v.slots.length();
  shuffle(v, runStarts, runs);
  return !v.slots.empty();
}

void ThreadHeap::detachAll(unsigned sizeClass) {
  ShuffleVector& v = vector(sizeClass);
  // Before the vector's slots go back: a block both in the vector and on the stack is a
  // double free, which draining detects only while the vector still says so.
  for (unsigned span = 0; span < v.attached.count(); span++)
    drainRemoteFrees(v, span, Span::kRemoteFreesClosed);
  uint32_t returned[kMaxSpansPerVector] = {};
  for (uint32_t i = 0; i < v.slots.length(); i++) {
    uintptr_t entry = v.slots.entry(i);
    uintptr_t block = SlotStack::blockOf(entry);
    if (entry & SlotStack::kTaggedEntry) setCacheTag(block, 0);
    int span = attachedIndexOf(v, block);
    // The vector holds free slots of its attached spans only, each still owned in its bitmap.
    MESHALLOC_ASSERT(span >= 0);
    Span* heap = v.attached.record(static_cast<unsigned>(span));
    int64_t slot = heap->slotOf(block - heap->spanStart);
    MESHALLOC_ASSERT(slot >= 0);
    bool wasOwned = heap->bitmap().tryUnset(static_cast<size_t>(slot));
    MESHALLOC_ASSERT(wasOwned);
    (void)wasOwned;
    returned[span]++;
  }
  for (unsigned span = 0; span < v.attached.count(); span++) {
    if (returned[span])
      v.attached.record(span)->liveCount.fetch_sub(returned[span], std::memory_order_acq_rel);
  }
  v.slots.clear();
  for (unsigned span = 0; span < v.attached.count(); span++) checkAttached(v, span);
  while (v.attached.count()) {
    unsigned last = v.attached.count() - 1;
    GlobalHeap::releaseSpan(v.attached.record(last));
    removeSpan(v, last);
  }
  v.attached.rebuild();
}

void ThreadHeap::detachAll() {
  for (unsigned c = 0; c < kNumSizeClasses; c++) detachAll(c);
}

bool ThreadHeap::recycledAnywhere(unsigned sizeClass, uintptr_t block) {
  bool held = false;
  lockRegistry();
  for (ThreadHeap* heap = gRegistry; heap && !held; heap = heap->nextInRegistry())
    held = heap->vector(sizeClass).recycled.holds(block);
  unlockRegistry();
  return held;
}

ThreadHeap* ThreadHeap::registryHead() {
  return gRegistry;
}
void ThreadHeap::lockRegistry() {
  gRegistryLock.lock();
}
void ThreadHeap::unlockRegistry() {
  gRegistryLock.unlock();
}
void ThreadHeap::resetRegistryAfterFork() {
  gRegistryLock.resetAfterFork();
  // Threads that were inside a guarded operation or a system call at fork do not exist in
  // the child; their records must not make the child's mesher wait for them forever.
  for (ThreadHeap* heap = gRegistry; heap; heap = heap->registryNext_) {
    if (heap == tlsThreadHeap) continue;
    heap->activity_.operationsInFlight.store(0, std::memory_order_relaxed);
    heap->activity_.ioBufferStart.store(0, std::memory_order_relaxed);
    heap->activity_.ioBufferEnd.store(0, std::memory_order_relaxed);
  }
}

}  // namespace meshalloc
