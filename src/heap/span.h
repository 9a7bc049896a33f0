// A span record owns one physical span: its size class, its allocation bitmap and the virtual
// span(s) that map it. It is either attached (its free slots are in one thread's shuffle vector)
// or detached (held by the global heap in an occupancy bin, the full list, or being freed).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/cache_tag.h"
#include "heap/size_class.h"
#include "support/bitmap.h"
#include "support/list.h"

namespace meshalloc {

class ThreadHeap;

// Where a span record sits in the global heap; changed only under its size class's lock.
// kMeshing: taken out of the lists by the mesher for one pass; kMeshedAway: a source whose
// objects and virtual span now belong to another span, about to be retired (mesh/mesher.cc).
enum class SpanState : uint8_t {
  kAttached,
  kPartial,
  kFull,
  kUnlisted,
  kLarge,
  kFreed,
  kMeshing,
  kMeshedAway
};

struct MeshInfo;

// span records start on a cache line (InternalHeap's granule).
constexpr size_t kCacheLine = 64;

struct Span : ListNode {
  // --- first cache line: what allocation, refills and the global heap's lists use. A free
  // reads none of it (the page-map entry gives the class and the span start). ---
  uint32_t objectSize = 0;
  uint32_t reciprocal = 0;
  uint32_t objectCount = 0;
  uint32_t spanPages = 0;
  uint8_t sizeClass = 0;
  SpanState state = SpanState::kFreed;
  uint8_t occupancyBin = 0;
  // Large objects: the pages were fresh from the OS. (Bit-fields: the first line is full. Both
  // are written only at creation or under the class's lock.)
  bool zeroed : 1 = false;
  // Blocks were freed into the bitmap while the span was detached (untagged: see
  // heap/cache_tag.h), so the owner's first claim after attaching tags the slots it takes.
  // Written by the attaching owner only.
  bool claimsNeedTags : 1 = false;
  // Never refilled again: a virtual span of it was stranded on another span's pages by a failed
  // mesh (Mesher::absorbMeshedSource), so a slot handed out through its own view could land on
  // that span's live objects. It stays listed as full until its last object is freed. Set by the
  // mesher while the span is a mesh candidate (no owner, no list), read under the class's lock.
  bool allocationClosed : 1 = false;
  union {
    // Large objects: the object starts this many bytes into its span (see largeColouring).
    uint32_t largeOffset = 0;
    // Small objects, detached: bytes of free slots on pages the mesher gave back to the kernel
    // (Mesher::trimFreePages; they read as zeros when next touched). Written by the mesher while
    // it holds the span as a candidate, cleared when a thread attaches it, read under the class's
    // lock (statistics). Pages of a span in the shared file are never trimmed this way.
    uint32_t trimmedBytes;
  };
  uintptr_t spanStart = 0;
  // Set once the span's physical memory lives in the shared file (it has been meshed): which
  // file range, and the other virtual spans that map it. See mesh/span_backing.h.
  MeshInfo* mesh = nullptr;
  size_t requestedBytes = 0;  // large objects only: the bytes asked for (statistics)
  // --- second cache line: everything a free that reaches the span reads or writes (remote
  // frees, frees into detached spans, drains), and the start of the bitmap: one cache miss per
  // such free (a program whose frees land in spans it allocated long ago, such as an LRU cache,
  // misses on every one). A local free into an attached span reads no span record field. ---
  // The thread heap this span is attached to, or nullptr. Only the owning thread sets it to
  // itself, so `owner == me` is a safe test for a local free without locks.
  std::atomic<ThreadHeap*> owner{nullptr};
  // Frees from other threads while the span is attached: a stack of freed blocks linked through
  // their first word, which the owner drains into the bitmap (see remoteFrees below). One CAS
  // per remote free.
  std::atomic<uintptr_t> remoteFrees{kRemoteFreesClosed};
  // Slots currently owned (allocated to the program or held in the owner's shuffle vector).
  // Blocks waiting in remoteFrees still count as owned until the owner drains them.
  std::atomic<uint32_t> liveCount{0};
  uint8_t attachIndex = 0;  // position in the owner's shuffle vector while attached
  // Never meshed (heap::allocatePinned): a block of it may be written by the kernel from inside
  // glibc, where no wrapper can publish it. Set by the owner while attached, read by the mesher
  // once the span is detached (under its class's lock); cleared only when the span is recreated.
  std::atomic<bool> pinned{false};
  // The mesher's sweep of this class in which the span was last offered as a candidate (under
  // the class's lock; see GlobalHeap::takeMeshCandidates). In the padding before the bitmap.
  uint16_t meshSweep = 0;
  // Trailing storage: AtomicBitmap words (objectCount bits), on the same line as liveCount.

  // remoteFrees holds kRemoteFreesClosed while the span is detached (remote frees go straight
  // to the bitmap; zeroed metadata starts closed) and kRemoteFreesEmpty, or the top block of the
  // stack, while attached. Blocks are 16-byte aligned, so neither value is a block address.
  static constexpr uintptr_t kRemoteFreesClosed = 0;
  static constexpr uintptr_t kRemoteFreesEmpty = 1;
  // Closed, and a block has been freed into the bitmap since the span was detached: the next
  // owner tags what it claims (claimsNeedTags). Only frees into a detached span set it, once.
  static constexpr uintptr_t kRemoteFreesClosedAfterFree = 2;
  static bool isClosed(uintptr_t top) {
    return top == kRemoteFreesClosed || top == kRemoteFreesClosedAfterFree;
  }

  enum class RemotePush { kPushed, kClosed, kAlreadyOnTop };
  // Pushes a freed block of this span onto remoteFrees. kClosed: the span is not attached, the
  // caller frees through the bitmap. kAlreadyOnTop: the same block was just pushed (a double
  // free; other repeats are caught when the owner drains). Writes the block's first word and
  // its released tag (an attached span is never meshed).
  RemotePush pushRemoteFree(uintptr_t block) {
    uintptr_t top = remoteFrees.load(std::memory_order_relaxed);
    do {
      if (isClosed(top)) return RemotePush::kClosed;
      if (top == block) return RemotePush::kAlreadyOnTop;
      *reinterpret_cast<uintptr_t*>(block) = top;
      setCacheTag(block, releasedTag());
    } while (!remoteFrees.compare_exchange_weak(top, block, std::memory_order_release,
                                                std::memory_order_relaxed));
    return RemotePush::kPushed;
  }

  // Slots neither handed out nor held in the owner's vector (blocks still waiting in remoteFrees
  // count as held).
  uint32_t freeSlots() const {
    uint32_t live = liveCount.load(std::memory_order_acquire);
    return live < objectCount ? objectCount - live : 0;
  }

  static size_t bytesFor(size_t objectCount) {
    return sizeof(Span) + AtomicBitmap::wordsFor(objectCount) * sizeof(std::atomic<uint64_t>);
  }
  AtomicBitmap bitmap() {
    return AtomicBitmap(reinterpret_cast<std::atomic<uint64_t>*>(this + 1), objectCount);
  }
  bool isLarge() const { return sizeClass == kLargeClass; }
  size_t spanBytes(size_t pageSize) const { return static_cast<size_t>(spanPages) * pageSize; }
  // A large object's address and usable size.
  uintptr_t largeStart() const { return spanStart + largeOffset; }
  size_t largeBytes(size_t pageSize) const { return spanBytes(pageSize) - largeOffset; }

  // Slot index of `delta` bytes into a virtual span, or -1 if it is not the start of a slot.
  int64_t slotOf(uintptr_t delta) const {
    uint64_t slot = (static_cast<uint64_t>(delta) * reciprocal) >> 32;
    if (slot * objectSize != delta || slot >= objectCount) return -1;
    return static_cast<int64_t>(slot);
  }
};

static_assert(sizeof(Span) % alignof(std::atomic<uint64_t>) == 0);
// (heap_test.cc, SpanLayout.FreePathFieldsShareTheSecondCacheLine, checks the two lines.)

}  // namespace meshalloc
