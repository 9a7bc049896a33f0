#include "handle/store.h"

#include <errno.h>
#include <string.h>

#include "handle/handles.h"
#include "handle/thread_cache.h"
#include "heap/arena.h"
#include "platform/os.h"
#include "support/assert.h"

namespace meshalloc::handles {

constinit Store::ClassStore Store::classes_[kNumSizeClasses] = {};

namespace {

// A chunk holds at least this many slots (of 16 KiB objects: 256 KiB chunks), so that the tail a
// chunk cannot use stays small; and it is at least kMinChunkBytes, so that the bookkeeping at
// its start is a small share.
constexpr size_t kMinSlotsPerChunk = 16;
constexpr size_t kMinChunkBytes = size_t{64} << 10;
constexpr size_t kSlotAlignment = 64;
// A thread polls a class lock another thread holds this many times, then this many times
// yielding the CPU in between, then sleeping in between; one the defragmenter holds, at most
// kMoverPolls times (a few microseconds) before it goes around it.
constexpr unsigned kLockSpins = 200;
constexpr unsigned kMoverPolls = 64;
constexpr unsigned kLockYields = 50;
constexpr uint64_t kLockSleepNs = 20000;

size_t alignUp(size_t value, size_t alignment) {
  return (value + alignment - 1) & ~(alignment - 1);
}

size_t headerBytes(size_t slots) {
  return alignUp(sizeof(Chunk) + (slots + 63) / 64 * sizeof(uint64_t) + slots * sizeof(uint32_t),
                 kSlotAlignment);
}

}  // namespace

void Store::init() {
  if (planned_.load(std::memory_order_acquire)) return;
  size_t pageSize = Arena::pageSize();
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    ClassLayout& l = layouts_[c];
    l.slotSize = kSizeClassSizes[c];
    size_t chunkBytes = kMinChunkBytes < pageSize ? pageSize : kMinChunkBytes;
    while (chunkBytes < kMinSlotsPerChunk * l.slotSize) chunkBytes *= 2;
    size_t slots = chunkBytes / l.slotSize;
    while (headerBytes(slots) + slots * l.slotSize > chunkBytes) slots--;
    l.chunkBytes = chunkBytes;
    l.chunkMask = ~(chunkBytes - 1);
    l.reciprocal = SizeClasses::plan(c).reciprocal;
    l.slotCount = static_cast<uint32_t>(slots);
    l.bitmapWords = static_cast<uint32_t>((slots + 63) / 64);
    l.ownersOffset = static_cast<uint32_t>(sizeof(Chunk) + l.bitmapWords * sizeof(uint64_t));
    l.firstSlot = static_cast<uint32_t>(headerBytes(slots));
  }
  planned_.store(true, std::memory_order_release);
}

unsigned Store::binFor(const Chunk* chunk) {
  uint32_t slots = layouts_[chunk->sizeClass].slotCount;
  if (chunk->liveCount == slots) return kFullBin;
  return static_cast<unsigned>(uint64_t{chunk->liveCount} * kOccupancyBins / slots);
}

void Store::link(ClassStore& c, Chunk* chunk, unsigned bin) {
  chunk->bin = bin;
  chunk->prev = nullptr;
  chunk->next = c.bins[bin];
  if (chunk->next) chunk->next->prev = chunk;
  c.bins[bin] = chunk;
  c.freeSlots += layouts_[chunk->sizeClass].slotCount - chunk->liveCount;
}

void Store::unlink(ClassStore& c, Chunk* chunk) {
  if (chunk->prev) {
    chunk->prev->next = chunk->next;
  } else {
    c.bins[chunk->bin] = chunk->next;
  }
  if (chunk->next) chunk->next->prev = chunk->prev;
  chunk->prev = chunk->next = nullptr;
  c.freeSlots -= layouts_[chunk->sizeClass].slotCount - chunk->liveCount;
}

// After liveCount changed by one: freeSlots is kept by the caller, the list here.
void Store::rebin(ClassStore& c, Chunk* chunk) {
  unsigned bin = binFor(chunk);
  if (bin == chunk->bin) return;
  if (chunk->prev) {
    chunk->prev->next = chunk->next;
  } else {
    c.bins[chunk->bin] = chunk->next;
  }
  if (chunk->next) chunk->next->prev = chunk->prev;
  chunk->bin = bin;
  chunk->prev = nullptr;
  chunk->next = c.bins[bin];
  if (chunk->next) chunk->next->prev = chunk;
  c.bins[bin] = chunk;
}

// A chunk from the arena with every slot free, on no list; nullptr if memory is exhausted.
Chunk* Store::makeChunk(unsigned sizeClass) {
  const ClassLayout& l = layouts_[sizeClass];
  bool zeroed = false;
  uintptr_t start = Arena::allocate(l.chunkBytes >> Arena::pageShift(), l.chunkBytes, &zeroed);
  if (!start) return nullptr;
  Chunk* chunk = reinterpret_cast<Chunk*>(start);
  chunk->sizeClass = sizeClass;
  // Every slot free; the bits past the last slot stay clear.
  memset(chunk->freeBits, 0, l.bitmapWords * sizeof(uint64_t));
  for (uint32_t w = 0; w < l.bitmapWords; w++) {
    uint32_t bits = l.slotCount - w * 64 >= 64 ? 64 : l.slotCount - w * 64;
    chunk->freeBits[w] = bits == 64 ? ~uint64_t{0} : (uint64_t{1} << bits) - 1;
  }
  chunk->liveCount = 0;
  chunk->hintWord = 0;
  classes_[sizeClass].chunks.fetch_add(1, std::memory_order_relaxed);
  return chunk;
}

Chunk* Store::newChunkLocked(ClassStore& c, unsigned sizeClass) {
  Chunk* chunk = c.spare;
  if (chunk) {
    c.spare = nullptr;
  } else if (!(chunk = makeChunk(sizeClass))) {
    return nullptr;
  }
  link(c, chunk, 0);
  return chunk;
}

void Store::releaseChunkLocked(ClassStore& c, Chunk* chunk, bool keepAsSpare) {
  MESHALLOC_ASSERT(chunk->liveCount == 0);
  if (keepAsSpare && !c.spare) {
    chunk->hintWord = 0;
    c.spare = chunk;
    return;
  }
  c.chunks.fetch_sub(1, std::memory_order_relaxed);
  chunk->next = c.toRelease;
  c.toRelease = chunk;
}

Store::ClassGuard::ClassGuard(unsigned sizeClass, Holder holder)
    : sizeClass_(sizeClass), holder_(holder) {
  ClassStore& c = classes_[sizeClass];
  if (holder == Holder::kMover) {
    // Marked before it is taken: from now on, threads go around it.
    moverHolds_.store(sizeClass + 1, std::memory_order_seq_cst);
    c.lock.lock();
    lockedAtNs_ = os::monotonicNanos();
  } else if (!c.lock.tryLock() && !lockUnlessMover(sizeClass)) {
    held_ = false;
    return;
  }
  applyDeferredLocked(c);
}

// Polled rather than queued for, so that a defragmenter that holds the lock, or is about to
// take it, is noticed: it is then given kMoverPolls short polls (its holds are one object's
// bookkeeping), after which it is taken to be preempted and gone around. Another thread's hold
// is waited for (polls spin, then yield the CPU, then sleep). False if gone around. The wait
// put down to the mover is the CPU time of those polls: the machine preempting the polling
// thread is not the mover's doing (the callers' latency, which includes it, is measured apart).
bool Store::ClassGuard::lockUnlessMover(unsigned sizeClass) {
  ClassStore& c = classes_[sizeClass];
  uint64_t start = os::monotonicNanos();
  uint64_t moverSeenCpuNs = 0;  // the thread's CPU time when the mover was first seen
  unsigned moverPolls = 0;
  for (unsigned tries = 0;; tries++) {
    bool taken = c.lock.tryLock();
    if (taken || moverPolls > kMoverPolls) {
      if (moverPolls) {
        gCounters.moverWaits.record(os::threadCpuNanos() - moverSeenCpuNs);
      } else {
        gCounters.otherWaits.record(os::monotonicNanos() - start);
      }
      return taken;
    }
    if (moverHolds_.load(std::memory_order_relaxed) == sizeClass + 1) {
      if (moverPolls++ == 0) moverSeenCpuNs = os::threadCpuNanos();
      cpuRelax();
    } else if (tries < kLockSpins) {
      cpuRelax();
    } else if (tries < kLockSpins + kLockYields) {
      os::yieldThread();
    } else {
      os::sleepNanos(kLockSleepNs);
    }
  }
}

Store::ClassGuard::~ClassGuard() {
  if (!held_) return;
  ClassStore& c = classes_[sizeClass_];
  if (holder_ == Holder::kMover)
    raiseMaximum(gCounters.moveHoldMaxNs, os::monotonicNanos() - lockedAtNs_);
  Chunk* chunk = c.toRelease;
  c.toRelease = nullptr;
  c.lock.unlock();
  if (holder_ == Holder::kMover) moverHolds_.store(0, std::memory_order_relaxed);
  size_t pages = layouts_[sizeClass_].chunkBytes >> Arena::pageShift();
  while (chunk) {
    Chunk* next = chunk->next;
    // Not into the dirty cache: the point of emptying a chunk is to give its pages back, and
    // aligned requests are never served from the cache anyway.
    Arena::release(reinterpret_cast<uintptr_t>(chunk), pages, false);
    chunk = next;
  }
}

uintptr_t Store::takeSlot(Chunk* chunk, uint32_t owner) {
  const ClassLayout& l = layouts_[chunk->sizeClass];
  for (uint32_t w = chunk->hintWord; w < l.bitmapWords; w++) {
    uint64_t bits = chunk->freeBits[w];
    if (!bits) continue;
    uint32_t slot = w * 64 + static_cast<uint32_t>(__builtin_ctzll(bits));
    chunk->freeBits[w] = bits & (bits - 1);
    chunk->hintWord = w;
    chunk->liveCount++;
    __atomic_store_n(&owners(chunk)[slot], owner, __ATOMIC_RELAXED);
    return slotAddress(chunk, slot);
  }
  MESHALLOC_ASSERT(false);
  return 0;
}

uintptr_t Store::takeSlotInUsedChunkLocked(unsigned sizeClass, uint32_t owner) {
  ClassStore& c = classes_[sizeClass];
  for (unsigned bin = kOccupancyBins; bin-- > 0;) {
    Chunk* chunk = c.bins[bin];
    if (!chunk) continue;
    uintptr_t address = takeSlot(chunk, owner);
    c.freeSlots--;
    c.takenSlots.fetch_add(1, std::memory_order_relaxed);
    rebin(c, chunk);
    return address;
  }
  return 0;
}

// A slot in the fullest chunk with room, in a new chunk if none has; 0 if memory is exhausted.
uintptr_t Store::takeSlotLocked(ClassStore& c, unsigned sizeClass, uint32_t owner) {
  uintptr_t address = takeSlotInUsedChunkLocked(sizeClass, owner);
  if (address || !newChunkLocked(c, sizeClass)) return address;
  return takeSlotInUsedChunkLocked(sizeClass, owner);
}

uint64_t Store::allocate(size_t size, uint32_t owner, bool zero) {
  if (size > kMaxSmallSize) return allocateLarge(size, owner, zero);
  unsigned sizeClass = SizeClasses::classOf(size);
  ClassStore& c = classes_[sizeClass];
  uintptr_t address;
  {
    ClassGuard guard(sizeClass, Holder::kMutator);
    if (guard.held()) {
      address = takeSlotLocked(c, sizeClass, owner);
    } else if (takeSlotsAround(c, sizeClass, &address, 1)) {
      setOwner(address, sizeClass, owner);
    } else {
      address = 0;
    }
  }
  if (!address) {
    errno = ENOMEM;
    return 0;
  }
  if (zero) memset(reinterpret_cast<void*>(address), 0, layouts_[sizeClass].slotSize);
  return makeObject(address, sizeClass);
}

unsigned Store::takeSlots(unsigned sizeClass, uintptr_t* slots, unsigned count) {
  ClassStore& c = classes_[sizeClass];
  ClassGuard guard(sizeClass, Holder::kMutator);
  if (!guard.held()) return takeSlotsAround(c, sizeClass, slots, count);
  unsigned taken = 0;
  while (taken < count && (slots[taken] = takeSlotLocked(c, sizeClass, kNoOwner))) taken++;
  return taken;
}

void Store::returnSlots(unsigned sizeClass, const uintptr_t* slots, unsigned count) {
  if (count == 0) return;
  ClassGuard guard(sizeClass, Holder::kMutator);
  if (!guard.held()) {
    deferSlots(classes_[sizeClass], slots, count);
    return;
  }
  for (unsigned i = 0; i < count; i++) {
    Chunk* chunk = chunkOf(slots[i], sizeClass);
    freeSlotLocked(chunk, slotOf(chunk, slots[i]));
  }
}

// Slots given back stay taken in their chunks until the next holder frees them; the list is
// linked through the slots' first words (nobody else uses a slot given back: a move still
// copying out of it discards its copy).
void Store::deferSlots(ClassStore& c, const uintptr_t* slots, unsigned count) {
  for (unsigned i = 1; i < count; i++) *reinterpret_cast<uintptr_t*>(slots[i - 1]) = slots[i];
  pushDeferred(c, slots[0], slots[count - 1]);
}

// Pushes the list first..last (linked through first words) onto the class's deferred slots.
void Store::pushDeferred(ClassStore& c, uintptr_t first, uintptr_t last) {
  uintptr_t head = c.deferredSlots.load(std::memory_order_relaxed);
  do {
    *reinterpret_cast<uintptr_t*>(last) = head;
  } while (!c.deferredSlots.compare_exchange_weak(head, first, std::memory_order_release,
                                                  std::memory_order_relaxed));
}

// A refill while the defragmenter holds the class's lock: slots other threads gave back around
// it (they are still taken, as a cache's slots are), or else a chunk of its own, which the next
// holder of the lock links.
unsigned Store::takeSlotsAround(ClassStore& c, unsigned sizeClass, uintptr_t* slots,
                                unsigned count) {
  // The whole list (no pop races), what is not needed pushed back.
  uintptr_t slot = c.deferredSlots.exchange(0, std::memory_order_acquire);
  unsigned taken = 0;
  for (; slot && taken < count; taken++) {
    slots[taken] = slot;
    slot = *reinterpret_cast<uintptr_t*>(slot);
  }
  if (slot) {
    uintptr_t last = slot;
    for (uintptr_t next; (next = *reinterpret_cast<uintptr_t*>(last)) != 0;) last = next;
    pushDeferred(c, slot, last);
  }
  if (taken) return taken;
  Chunk* chunk = makeChunk(sizeClass);
  if (!chunk) return 0;
  chunk->bin = kUnlinked;
  for (; taken < count && taken < layouts_[sizeClass].slotCount; taken++)
    slots[taken] = takeSlot(chunk, kNoOwner);
  c.takenSlots.fetch_add(taken, std::memory_order_relaxed);
  Chunk* head = c.newChunks.load(std::memory_order_relaxed);
  do {
    chunk->next = head;
  } while (!c.newChunks.compare_exchange_weak(head, chunk, std::memory_order_release,
                                              std::memory_order_relaxed));
  return taken;
}

void Store::applyDeferredLocked(ClassStore& c) {
  if (__builtin_expect(!c.deferredSlots.load(std::memory_order_relaxed) &&
                           !c.newChunks.load(std::memory_order_relaxed),
                       1))
    return;
  for (Chunk* chunk = c.newChunks.exchange(nullptr, std::memory_order_acquire); chunk;) {
    Chunk* next = chunk->next;
    if (chunk->liveCount == 0) {
      releaseChunkLocked(c, chunk, true);
    } else {
      link(c, chunk, binFor(chunk));
    }
    chunk = next;
  }
  for (uintptr_t slot = c.deferredSlots.exchange(0, std::memory_order_acquire); slot;) {
    uintptr_t next = *reinterpret_cast<uintptr_t*>(slot);
    unsigned sizeClass = static_cast<unsigned>(&c - classes_);
    Chunk* chunk = chunkOf(slot, sizeClass);
    freeSlotLocked(chunk, slotOf(chunk, slot, sizeClass));
    slot = next;
  }
}

uint64_t Store::allocateLarge(size_t size, uint32_t owner, bool zero) {
  size_t pageSize = Arena::pageSize();
  if (size > (size_t{1} << Arena::kAddressBits) - kLargeHeaderBytes - pageSize) {
    errno = ENOMEM;
    return 0;
  }
  size_t pages = (size + kLargeHeaderBytes + pageSize - 1) >> Arena::pageShift();
  bool zeroed = false;
  uintptr_t start = Arena::allocate(pages, 0, &zeroed);
  if (!start) {
    errno = ENOMEM;
    return 0;
  }
  LargeHeader* header = reinterpret_cast<LargeHeader*>(start);
  header->pages = pages;
  header->owner = owner;
  size_t usable = (pages << Arena::pageShift()) - kLargeHeaderBytes;
  if (zero && !zeroed) memset(reinterpret_cast<void*>(start + kLargeHeaderBytes), 0, usable);
  largeObjects_.fetch_add(1, std::memory_order_relaxed);
  largeBytes_.fetch_add(pages << Arena::pageShift(), std::memory_order_relaxed);
  largeLiveBytes_.fetch_add(usable, std::memory_order_relaxed);
  return makeObject(start + kLargeHeaderBytes, kLargeStoreClass);
}

void Store::freeSlotLocked(Chunk* chunk, uint32_t slot) {
  ClassStore& c = classes_[chunk->sizeClass];
  MESHALLOC_ASSERT(!slotIsFree(chunk, slot));
  chunk->freeBits[slot / 64] |= uint64_t{1} << (slot % 64);
  if (slot / 64 < chunk->hintWord) chunk->hintWord = slot / 64;
  chunk->liveCount--;
  c.takenSlots.fetch_sub(1, std::memory_order_relaxed);
  if (chunk->bin >= kEvacuating) return;  // its evacuation, or its linking, releases it
  c.freeSlots++;
  if (chunk->liveCount == 0) {
    unlink(c, chunk);
    releaseChunkLocked(c, chunk, true);
    return;
  }
  rebin(c, chunk);
}

void Store::free(uint64_t object) {
  unsigned sizeClass = classOfObject(object);
  uintptr_t address = addressOf(object);
  if (sizeClass == kLargeStoreClass) {
    uintptr_t start = address - kLargeHeaderBytes;
    size_t pages = reinterpret_cast<LargeHeader*>(start)->pages;
    largeObjects_.fetch_sub(1, std::memory_order_relaxed);
    largeBytes_.fetch_sub(pages << Arena::pageShift(), std::memory_order_relaxed);
    largeLiveBytes_.fetch_sub((pages << Arena::pageShift()) - kLargeHeaderBytes,
                              std::memory_order_relaxed);
    Arena::release(start, pages, true);
    return;
  }
  Chunk* chunk = chunkOf(address, sizeClass);
  ClassGuard guard(sizeClass, Holder::kMutator);
  if (!guard.held()) {
    deferSlots(classes_[sizeClass], &address, 1);
    return;
  }
  freeSlotLocked(chunk, slotOf(chunk, address));
}

size_t Store::usableSize(uint64_t object) {
  unsigned sizeClass = classOfObject(object);
  if (sizeClass != kLargeStoreClass) return layouts_[sizeClass].slotSize;
  auto* header = reinterpret_cast<const LargeHeader*>(addressOf(object) - kLargeHeaderBytes);
  return (header->pages << Arena::pageShift()) - kLargeHeaderBytes;
}

Chunk* Store::takeSourceLocked(unsigned sizeClass, unsigned maxSourceBin) {
  ClassStore& c = classes_[sizeClass];
  unsigned probes = 0;
  for (unsigned bin = 0; bin < maxSourceBin && bin < kOccupancyBins; bin++) {
    // The first chunk of the lowest bin is about the sparsest (within an eighth).
    for (Chunk* chunk = c.bins[bin]; chunk && probes < kMaxSourceProbes;
         chunk = chunk->next, probes++) {
      uint32_t free = layouts_[sizeClass].slotCount - chunk->liveCount;
      if (c.freeSlots - free < chunk->liveCount) continue;  // its objects would not fit elsewhere
      unlink(c, chunk);
      chunk->bin = kEvacuating;
      return chunk;
    }
  }
  return nullptr;
}

void Store::endEvacuationLocked(Chunk* chunk) {
  ClassStore& c = classes_[chunk->sizeClass];
  MESHALLOC_ASSERT(chunk->bin == kEvacuating);
  if (chunk->liveCount == 0) {
    releaseChunkLocked(c, chunk, false);
    return;
  }
  link(c, chunk, binFor(chunk));
}

size_t Store::releaseSpares(bool all) {
  size_t released = 0;
  for (unsigned sizeClass = 0; sizeClass < kNumSizeClasses; sizeClass++) {
    ClassStore& c = classes_[sizeClass];
    ClassGuard guard(sizeClass, Holder::kMover);
    Chunk* spare = c.spare;
    bool aged = spare == c.agedSpare;
    c.agedSpare = spare;
    if (!spare || (!all && !aged)) continue;
    c.agedSpare = nullptr;
    c.spare = nullptr;
    releaseChunkLocked(c, spare, false);
    released += layouts_[sizeClass].chunkBytes;
  }
  return released;
}

size_t Store::classCommittedBytes(unsigned sizeClass) {
  return classes_[sizeClass].chunks.load(std::memory_order_relaxed) *
         layouts_[sizeClass].chunkBytes;
}

size_t Store::classLiveSlots(unsigned sizeClass) {
  size_t taken = classes_[sizeClass].takenSlots.load(std::memory_order_relaxed);
  size_t cached = ThreadCache::cachedSlots(sizeClass);
  // The two are read at different moments: a cache refilled in between may make them cross.
  return taken > cached ? taken - cached : 0;
}

size_t Store::classLiveBytes(unsigned sizeClass) {
  return classLiveSlots(sizeClass) * layouts_[sizeClass].slotSize;
}

size_t Store::committedBytes() {
  size_t total = largeBytes_.load(std::memory_order_relaxed);
  for (unsigned c = 0; c < kNumSizeClasses; c++) total += classCommittedBytes(c);
  return total;
}

size_t Store::liveBytes() {
  size_t total = largeLiveBytes_.load(std::memory_order_relaxed);
  for (unsigned c = 0; c < kNumSizeClasses; c++) total += classLiveBytes(c);
  return total;
}

size_t Store::liveObjects() {
  size_t total = largeObjects_.load(std::memory_order_relaxed);
  for (unsigned c = 0; c < kNumSizeClasses; c++) total += classLiveSlots(c);
  return total;
}

const heap::ForkParticipant& Store::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant = {"handle store", heap::ForkRank::kHandles,
                                                         [] {
                                                           for (ClassStore& c : classes_)
                                                             c.lock.lock();
                                                         },
                                                         [] {
                                                           for (unsigned c = kNumSizeClasses;
                                                                c-- > 0;)
                                                             classes_[c].lock.unlock();
                                                         },
                                                         [] {
                                                           for (ClassStore& c : classes_)
                                                             c.lock.resetAfterFork();
                                                         }};
  return kParticipant;
}

}  // namespace meshalloc::handles
