#include "handle/controller.h"

#include "handle/defrag.h"
#include "handle/store.h"
#include "heap/config.h"
#include "heap/cpu_budget.h"
#include "platform/os.h"
#include "support/lock.h"

namespace meshalloc::handles {

namespace {

constexpr uint64_t kNanosPerMilli = 1000000;
constexpr uint64_t kPermille = 1000;

Mutex gStartLock;

}  // namespace

bool Controller::shouldRun(size_t committedBytes, size_t liveBytes, bool active) {
  const HeapConfig& config = gHeapConfig;
  if (committedBytes < liveBytes + config.handlesMinGainBytes) return false;
  // committed / live against the bounds, in per mille, without dividing.
  unsigned __int128 committed = static_cast<unsigned __int128>(committedBytes) * kPermille;
  unsigned __int128 live = liveBytes;
  uint64_t bound = active ? config.handlesFragLowPermille : config.handlesFragHighPermille;
  return committed > live * bound;
}

void Controller::start() {
  if (!gHeapConfig.handlesDefrag) {
    started_.store(true, std::memory_order_relaxed);
    failed_ = true;
    return;
  }
  LockGuard guard(gStartLock);
  if (started_.load(std::memory_order_relaxed)) return;
  started_.store(true, std::memory_order_relaxed);
  failed_ = !os::startDetachedThread(main);
}

void* Controller::main(void*) {
  const HeapConfig& config = gHeapConfig;
  uint64_t budget = config.handlesBudgetPermille ? config.handlesBudgetPermille : 1;
  if (budget > kPermille) budget = kPermille;
  bool active = false;
  // After a pass that gained nothing, the store as it was then: no pass until it changes.
  size_t stuckCommitted = 0;
  size_t stuckLive = 0;
  for (;;) {
    os::sleepNanos(config.handlesPeriodMs * kNanosPerMilli);
    size_t committed = Store::committedBytes();
    size_t live = Store::liveBytes();
    if (committed == stuckCommitted && live == stuckLive) continue;
    active = shouldRun(committed, live, active);
    if (!active) continue;
    // Not before the budget shared with meshing allows.
    uint64_t due = CpuBudget::clock();
    uint64_t now = os::monotonicNanos();
    if (due > now) {
      os::sleepNanos(due - now);
      continue;
    }
    size_t maxMoved = committed / kPermille * config.handlesMovePermille;
    uint64_t cpuStart = os::threadCpuNanos();
    PassResult result = Defragmenter::pass(0, maxMoved ? maxMoved : 1);
    uint64_t cpu = os::threadCpuNanos() - cpuStart;
    // Charged from the pass's start with no credit: the clock goes at least as far as the wall
    // clock, so that the defragmenter's share stays under its budget over every interval.
    uint64_t clock = CpuBudget::charge(CpuBudget::kHandles, cpu, budget, now, 0);
    if (result.releasedBytes == 0) {
      active = false;
      stuckCommitted = Store::committedBytes();
      stuckLive = Store::liveBytes();
    } else {
      stuckCommitted = stuckLive = 0;
    }
    // CPU over wall time stays within the budget: the next pass waits for the clock, which
    // this pass moved cpu x 1000 / budget past its start (or past meshing's passes).
    uint64_t period = config.handlesPeriodMs * kNanosPerMilli;
    now = os::monotonicNanos();
    if (clock > now + period) os::sleepNanos(clock - now - period);
  }
  return nullptr;
}

const heap::ForkParticipant& Controller::forkParticipant() {
  static constexpr heap::ForkParticipant kParticipant = {
      "handle controller", heap::ForkRank::kHandles, nullptr, nullptr,
      [] { started_.store(false, std::memory_order_relaxed); }};
  return kParticipant;
}

}  // namespace meshalloc::handles
