// Meshed spans that died. A meshed span whose last object is freed keeps its virtual spans on
// the shared file until they are made private again, a mapping call each. The global heap hands
// such a span over when it destroys it (its meshed-span hook, under the class's lock): retire()
// clears its owner entries and returns its memory at once, and queues the remapping, which the
// background thread does (restore), so that a program freeing meshed memory does not make the
// calls itself. Without a background thread, or when it falls too far behind, the freeing thread
// does.
#pragma once

#include <cstddef>
#include <cstdint>

#include "heap/fork.h"
#include "heap/span.h"

namespace meshalloc {

class RetiredSpans {
 public:
  // The background thread is woken once this many wait, and the freeing threads restore
  // themselves (one span per span they add) beyond the maximum.
  static constexpr size_t kBeforeWake = 16;
  static constexpr size_t kMax = 4096;

  struct Usage {
    size_t spans;
    size_t virtualBytes;   // every virtual span of them: address space, their memory is returned
    size_t metadataBytes;  // their span records
  };

  // Makes the global heap hand dying meshed spans to retire(); idempotent.
  static void install();
  // A shared span that died (called with its class's lock held: it only takes a leaf lock and
  // may signal, unless it must restore itself).
  static void retire(Span* span);
  // Restores up to `limit` retired spans, oldest first, and frees their span records. Takes no
  // class lock.
  static void restore(size_t limit = SIZE_MAX);
  static size_t count();
  static Usage usage();
  // `hook(wake)`: true if a background thread will restore retired spans (woken if `wake`),
  // false if the caller must. Called with a class lock held: it may only signal.
  static void setHook(bool (*hook)(bool wake));

  // Its lock, for fork (registered by MeshPolicy::init).
  static const heap::ForkParticipant& forkParticipant();
};

}  // namespace meshalloc
