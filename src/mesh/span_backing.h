// Where a span's physical memory lives. A span starts in private anonymous memory (cheap
// faults, copy-on-write across fork). When it is first meshed its pages move into one shared
// in-memory file (memfd), so that other virtual spans can map the same physical pages. Only
// meshed spans ever live in the file, so fork has to copy only those (see docs/meshing.md).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>

#include "heap/fork.h"
#include "heap/span.h"
#include "support/list.h"
#include "support/lock.h"

namespace meshalloc {

// A physical span can be mapped by at most this many virtual spans (itself included): each
// alias costs a mapping, and long chains make a single free's span more fragile to restore.
constexpr uint32_t kMaxVirtualSpans = 16;

// The record of a span in the file, followed by the starts of its aliases. Most meshed spans
// have one or two aliases, so the record starts with room for kInitialAliases (one cache line
// with the header: 64 bytes) and moves to a record with room for the most only when it needs
// to; a record sized for kMaxVirtualSpans from the start took 192 bytes per meshed span.
struct MeshInfo : ListNode {
  Span* owner;
  size_t fileOffset;
  uint32_t aliasCount;         // virtual spans besides owner->spanStart
  uint8_t aliasCapacity;       // starts the record has room for
  bool pagesReleased = false;  // dead: its file range is already punched out

  static constexpr uint32_t kInitialAliases = 3;
  static constexpr uint32_t kMaxAliases = kMaxVirtualSpans - 1;
  static constexpr size_t bytesFor(uint32_t capacity) {
    return sizeof(MeshInfo) + capacity * sizeof(uintptr_t);
  }
  uintptr_t* aliases() { return reinterpret_cast<uintptr_t*>(this + 1); }
  const uintptr_t* aliases() const { return reinterpret_cast<const uintptr_t*>(this + 1); }
};
// The small record must fit the internal heap's smallest block, and neither may round to the
// size of a span record (128 bytes with 4 KiB pages): stale Span pointers rely on that pool
// holding Span records only (docs/heap.md, "Internal heap").
static_assert(MeshInfo::bytesFor(MeshInfo::kInitialAliases) <= 64);
static_assert(MeshInfo::bytesFor(MeshInfo::kMaxAliases) > 128);

struct SpanBackingStats {
  size_t meshedSpans;    // physical spans in the file
  size_t aliasSpans;     // virtual spans mapping another span's pages
  size_t fileBytes;      // bytes of live file ranges
  size_t releasedBytes;  // physical bytes meshing currently saves (aliases x span size)
  size_t releasedBytesPeak;
};

class SpanBacking {
 public:
  // Moves `span`'s pages into the shared file, mapped at its own virtual address. The caller
  // has write-protected the span (the content is copied, then the mapping replaced). False,
  // with nothing changed, if the file or the mapping cannot be had.
  static bool share(Span* span);
  // Maps `span`'s physical pages at `alias` too (replacing whatever `alias` held) and records
  // it. False, with `alias` untouched, on failure.
  static bool addAlias(Span* span, uintptr_t alias);
  // Moves every virtual span of the shared span `source` (its own and its aliases), which the
  // caller has write-protected, onto `span`'s pages, read-only, and gives source's file range
  // back. Once the page map points them at `span`, forgetAbsorbed(source) frees the record.
  // False if `span` has no room for them or a mapping call fails: then every virtual span is
  // back on source's pages, still read-only, unless putting one back failed too, which sets
  // *stranded: that span shows `span`'s pages (holding copies of all of source's objects) and
  // the caller must keep `span` from handing out source's slots.
  static bool absorb(Span* span, Span* source, bool* stranded);
  static void forgetAbsorbed(Span* source);
  // Virtual spans that show `span`'s pages: its own and its aliases.
  static uint32_t virtualSpans(const Span* span) {
    return 1 + (span->mesh ? span->mesh->aliasCount : 0);
  }
  // Calls fn(start) for each of them, its own first.
  template <typename Fn>
  static void forEachVirtualSpan(const Span* span, Fn fn) {
    fn(span->spanStart);
    if (span->mesh) {
      for (uint32_t i = 0; i < span->mesh->aliasCount; i++) fn(span->mesh->aliases()[i]);
    }
  }
  // Called for a shared span that died (after releasePages, on the background thread, see
  // RetiredSpans::restore): every virtual span, its own included, becomes plain
  // private memory again and goes back to the arena; the file range is freed (punched out
  // unless releasePages did). A virtual span that cannot be made private again is leaked,
  // never handed out twice.
  static void restore(Span* span);
  // A shared span that died: its pages go back to the kernel now (one call), while its
  // virtual spans keep showing the file range, now empty, until restore() remaps them.
  static void releasePages(Span* span);

  static SpanBackingStats stats();
  // Testing: after `after` more mapping calls of share()/addAlias()/absorb(), the next `count`
  // fail as if the kernel had refused them (e.g. vm.max_map_count reached), to exercise the
  // undo paths.
  static void injectMapFailures(int count, int after = 0) {
    injectedSuccesses_.store(after, std::memory_order_relaxed);
    injectedFailures_.store(count, std::memory_order_relaxed);
  }
  static bool anyShared();

  // fork support: in the child, every shared span is copied into a fresh file of its own so
  // parent and child stop sharing pages. The parent keeps shared spans write-protected
  // around the copy (see mesh/policy.cc).
  static void protectAllForFork();
  static void unprotectAllAfterFork();
  static void copyToPrivateFileInChild();
  // Its lock, for fork (registered by MeshPolicy::init).
  static const heap::ForkParticipant& forkParticipant();

 private:
  static bool ensureFile();
  // With lock_ held: makes room in `span`'s record for `aliases` starts in all, moving it to a
  // larger record if need be (span->mesh then changes). False if no record could be had.
  static bool reserveAliasesLocked(Span* span, uint32_t aliases);
  static void setProtectionOfAll(bool (*protect)(void*, size_t));
  static bool allocateFileRange(size_t bytes, size_t* offset);
  static void freeFileRangeLocked(size_t offset, size_t bytes, bool punch = true);

  struct FreeRange : ListNode {
    size_t offset;
    size_t bytes;
  };

  static inline Mutex lock_{LockRank::kSpanBacking};
  static inline int fd_ = -1;
  static inline size_t fileSize_ = 0;
  static inline size_t fileEnd_ = 0;  // bump pointer
  static constinit inline IntrusiveList<FreeRange> freeRanges_;
  static constinit inline IntrusiveList<MeshInfo> shared_;
  static inline SpanBackingStats stats_ = {};
  static inline std::atomic<int> injectedFailures_{0};
  static inline std::atomic<int> injectedSuccesses_{0};
  static bool injectedFailure() {
    if (injectedFailures_.load(std::memory_order_relaxed) == 0) return false;
    int pass = injectedSuccesses_.load(std::memory_order_relaxed);
    while (pass > 0 && !injectedSuccesses_.compare_exchange_weak(pass, pass - 1)) {
    }
    if (pass > 0) return false;
    int left = injectedFailures_.load(std::memory_order_relaxed);
    while (left > 0 && !injectedFailures_.compare_exchange_weak(left, left - 1)) {
    }
    return left > 0;
  }
};

}  // namespace meshalloc
