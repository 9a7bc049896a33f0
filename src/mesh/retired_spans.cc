#include "mesh/retired_spans.h"

#include "heap/arena.h"
#include "heap/global_heap.h"
#include "heap/internal_heap.h"
#include "mesh/span_backing.h"
#include "platform/os.h"
#include "support/list.h"
#include "support/lock.h"

namespace meshalloc {

namespace {
// A leaf lock: taken under a class lock, never the other way round.
Mutex gLock(LockRank::kRetired);
constinit IntrusiveList<Span> gRetired;
size_t gCount = 0;
bool gRestoreRequested = false;
bool (*gHook)(bool wake) = nullptr;
}  // namespace

void RetiredSpans::install() {
  GlobalHeap::setMeshedSpanDiedHook(retire);
}

void RetiredSpans::retire(Span* span) {
  // From here on a stale free through any of its virtual spans finds no owner.
  SpanBacking::forEachVirtualSpan(
      span, [&](uintptr_t start) { Arena::forgetOwners(start, span->spanPages); });
  // The memory goes back now; only the remapping of its virtual spans waits.
  SpanBacking::releasePages(span);
  bool restoreNow, wake = false;
  {
    LockGuard guard(gLock);
    gRetired.pushBack(span);
    gCount++;
    restoreNow = gCount >= kMax;
    if (!restoreNow && !gRestoreRequested && gCount >= kBeforeWake) {
      gRestoreRequested = true;
      wake = true;
    }
  }
  if (!gHook || !gHook(wake)) {
    restore();
  } else if (restoreNow) {
    // The background thread is behind: one span per free, as many as it adds, rather than
    // a stall of hundreds of mapping calls for the one free that crossed the limit.
    restore(1);
  }
}

void RetiredSpans::restore(size_t limit) {
  for (size_t restored = 0; restored < limit; restored++) {
    Span* span;
    {
      LockGuard guard(gLock);
      span = gRetired.popFront();
      if (!span) {
        gRestoreRequested = false;
        return;
      }
      gCount--;
    }
    // Every virtual span becomes plain private memory again and goes back to the arena, empty.
    SpanBacking::restore(span);
    InternalHeap::free(span, Span::bytesFor(span->objectCount));
  }
}

size_t RetiredSpans::count() {
  LockGuard guard(gLock);
  return gCount;
}

RetiredSpans::Usage RetiredSpans::usage() {
  Usage usage = {};
  size_t pageSize = os::pageSize();
  LockGuard guard(gLock);
  for (Span* span = gRetired.front(); span; span = gRetired.next(span)) {
    usage.spans++;
    usage.virtualBytes += span->spanBytes(pageSize) * SpanBacking::virtualSpans(span);
    usage.metadataBytes += (Span::bytesFor(span->objectCount) + InternalHeap::kGranule - 1) /
                           InternalHeap::kGranule * InternalHeap::kGranule;
  }
  return usage;
}

void RetiredSpans::setHook(bool (*hook)(bool wake)) {
  gHook = hook;
}

const heap::ForkParticipant& RetiredSpans::forkParticipant() {
  // After every heap lock: retire() takes it under a class lock.
  static constexpr heap::ForkParticipant kParticipant =
      heap::mutexForkParticipant<gLock>("retired spans", heap::ForkRank::kAfterHeapLocks);
  return kParticipant;
}

}  // namespace meshalloc
