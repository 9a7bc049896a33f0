#include "heap/fork.h"

#include "heap/arena.h"
#include "heap/global_heap.h"
#include "heap/internal_heap.h"
#include "heap/operation_guard.h"
#include "heap/thread_heap.h"
#include "support/assert.h"

namespace meshalloc::heap {

namespace {

// The heap's participants. Layers above add theirs at kBeforeHeapLocks and kAfterHeapLocks.
constexpr ForkParticipant kHeapParticipants[] = {
    // Threads that were inside a guarded operation at fork do not exist in the child.
    {"operation guard", ForkRank::kOperationGuard, nullptr, nullptr,
     OperationGuard::resetAfterFork},
    {"idle reclaim", ForkRank::kIdleReclaim, ThreadHeap::lockReclaimForFork,
     ThreadHeap::unlockReclaimAfterFork, ThreadHeap::resetReclaimAfterFork},
    {"thread registry", ForkRank::kThreadRegistry, ThreadHeap::lockRegistry,
     ThreadHeap::unlockRegistry, ThreadHeap::resetRegistryAfterFork},
    {"global heap", ForkRank::kGlobalHeap, GlobalHeap::lockForFork, GlobalHeap::unlockAfterFork,
     GlobalHeap::resetAfterFork},
};

constinit ForkParticipants gForkParticipants;

}  // namespace

bool ForkParticipants::add(const ForkParticipant& participant) {
  for (unsigned i = 0; i < count_; i++)
    if (entries_[i] == &participant) return true;
  if (count_ == kCapacity) return false;
  unsigned at = count_;
  while (at > 0 && entries_[at - 1]->rank > participant.rank) {
    entries_[at] = entries_[at - 1];
    at--;
  }
  entries_[at] = &participant;
  count_++;
  return true;
}

void ForkParticipants::remove(const ForkParticipant& participant) {
  unsigned kept = 0;
  for (unsigned i = 0; i < count_; i++)
    if (entries_[i] != &participant) entries_[kept++] = entries_[i];
  for (unsigned i = kept; i < count_; i++) entries_[i] = nullptr;
  count_ = kept;
}

void ForkParticipants::prepare() const {
  for (unsigned i = 0; i < count_; i++) {
    MESHALLOC_ASSERT(i == 0 || entries_[i - 1]->rank <= entries_[i]->rank);
    if (entries_[i]->prepare) entries_[i]->prepare();
  }
}

void ForkParticipants::parent() const {
  for (unsigned i = count_; i-- > 0;)
    if (entries_[i]->parent) entries_[i]->parent();
}

void ForkParticipants::child() const {
  for (unsigned i = count_; i-- > 0;)
    if (entries_[i]->child) entries_[i]->child();
}

ForkParticipants& forkParticipants() {
  return gForkParticipants;
}

void registerHeapForkParticipants() {
  for (const ForkParticipant& participant : kHeapParticipants) {
    bool added = gForkParticipants.add(participant);
    MESHALLOC_ASSERT(added);
  }
  // Components whose fork protocol is their one lock declare it themselves.
  for (const ForkParticipant* participant :
       {&Arena::forkParticipant(), &InternalHeap::forkParticipant()}) {
    bool added = gForkParticipants.add(*participant);
    MESHALLOC_ASSERT(added);
  }
}

}  // namespace meshalloc::heap
