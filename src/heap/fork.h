// The fork protocol, as one ordered list of participants. Each participant is declared once,
// with its place in the lock order and its three steps; pthread_atfork (registered in
// heap.cc) runs every participant's `prepare` in lock order, then in the parent every
// `parent` and in the child every `child` in the reverse order. The heap registers its own
// participants; layers above it (meshing) register theirs at start-up, so heap/ never names
// them.
#pragma once

#include <cstdint>

#include "support/lock.h"

namespace meshalloc::heap {

// The lock order: `prepare` runs from the first rank to the last. Participants of one rank
// run in the order they were registered (and in reverse after fork).
enum class ForkRank : uint8_t {
  kOperationGuard,   // the heap's OperationGuard: nothing to lock, reset last in the child
  kBeforeHeapLocks,  // layers above, before any heap lock (the mesher's pass and batch locks)
  kHandles,          // the handle layer's pass, step and store locks (after the mesher's)
  kIdleReclaim,      // the idle-reclaim lock: no heap is half reclaimed
  kThreadRegistry,   // the thread-heap registry lock
  kGlobalHeap,       // every size-class lock and the large lock
  kSpanBacking,      // meshing's shared file (mesh/span_backing.h), between the heap's locks
  kArena,            // the arena lock
  kInternalHeap,     // the internal (metadata) heap's lock
  kAfterHeapLocks,   // layers above, with every heap lock held (retired spans, meshed snapshot)
};

struct ForkParticipant {
  const char* name;
  ForkRank rank;
  void (*prepare)();  // before fork: take the locks (nullptr: nothing to take)
  void (*parent)();   // in the parent after fork: release them (nullptr: nothing)
  void (*child)();    // in the child, where only the forking thread exists: reset them
};

// The participant of a component whose whole fork protocol is one mutex: taken before fork,
// released in the parent, reset in the child (where its holder may not exist).
template <Mutex& kLock>
constexpr ForkParticipant mutexForkParticipant(const char* name, ForkRank rank) {
  return {name, rank, [] { kLock.lock(); }, [] { kLock.unlock(); }, [] { kLock.resetAfterFork(); }};
}

// A fixed-capacity list of participants kept in lock order; it never allocates. Changed only
// at start-up (or by tests on a list of their own): not safe against a concurrent fork.
class ForkParticipants {
 public:
  static constexpr unsigned kCapacity = 24;

  constexpr ForkParticipants() = default;
  ForkParticipants(const ForkParticipants&) = delete;
  ForkParticipants& operator=(const ForkParticipants&) = delete;

  // Inserts after every participant of the same or a lower rank. Registering one participant
  // twice is a no-op; false only if the list is full. `participant` must outlive the list.
  bool add(const ForkParticipant& participant);
  // Removes it if present (for tests).
  void remove(const ForkParticipant& participant);

  unsigned count() const { return count_; }
  const ForkParticipant& operator[](unsigned i) const { return *entries_[i]; }

  void prepare() const;  // lock order
  void parent() const;   // reverse lock order
  void child() const;    // reverse lock order

 private:
  const ForkParticipant* entries_[kCapacity] = {};
  unsigned count_ = 0;
};

// The process's list, which the pthread_atfork handlers run. The heap's own participants are
// on it once the heap is initialised.
ForkParticipants& forkParticipants();
// Adds the heap's participants to forkParticipants() (heap.cc, at initialisation).
void registerHeapForkParticipants();

}  // namespace meshalloc::heap
