#include "mesh/policy.h"

#include <pthread.h>

#include <atomic>

#include "heap/arena.h"
#include "heap/config.h"
#include "heap/cpu_budget.h"
#include "heap/fork.h"
#include "heap/global_heap.h"
#include "heap/heap.h"
#include "mesh/commit_thread.h"
#include "mesh/mesher.h"
#include "mesh/retired_spans.h"
#include "mesh/span_backing.h"
#include "mesh/write_barrier.h"
#include "platform/os.h"

namespace meshalloc {

namespace {

constexpr uint64_t kNanosPerMilli = 1000000;
constexpr uint64_t kPermille = 1000;

std::atomic<bool> gInitialized{false};
std::atomic<bool> gThreadStarted{false};
// pthread_create failed (thread limits, seccomp): never retry, run the policy inline instead.
std::atomic<bool> gThreadFailed{false};
std::atomic<unsigned> gRefills{0};
std::atomic<uint64_t> gNextPassNs{0};
// The budget is kept as a virtual clock (the generic cell rate algorithm), the one the handle
// defragmenter charges too (heap/cpu_budget.h): each pass advances it by its CPU time divided by
// the budget share, and a pass may start once the wall clock has caught up with it. A program that
// has not meshed for a while keeps up to this much wall time of unspent budget, so the first pass
// after its heap turns sparse is not held back by its own cost: in Redis LRU the spans freed by the
// second phase's evictions were otherwise meshed a second after the insertion, 50 times a small
// early pass's cost later. Over any interval of length T meshing uses at most budget x (T + this),
// plus the pass in progress (a pass is not cut short: thread-scaling's exit pass needs more). The
// bucket starts full, as token buckets do: a program's first passes (thread-scaling's threads
// exiting 0.3 s after start) are not held back by the passes it made while it grew.
constexpr uint64_t kBudgetCreditNs = 5000 * kNanosPerMilli;
// Bumped (and futex-woken) to wake the background thread: to bring its next pass forward
// (gPassWakeups bumped too) or to restore retired meshed spans (gRestoreWakeup set).
std::atomic<uint32_t> gWakeups{0};
// Bumped by what brings a pass forward (a thread's exit, mass frees): the woken thread waits
// until these stop for kWakeupSettleNs.
std::atomic<uint32_t> gPassWakeups{0};
std::atomic<bool> gRestoreWakeup{false};
std::atomic<MeshPolicy::TickHook> gTickHook{nullptr};
// A woken thread waits until no thread has exited and no span has turned partial for this long
// (at most a period) before its pass, so that a burst of thread exits (a pool shutting down) or
// of frees (a cache evicting a batch) is meshed in one pass: a pass started after the first
// exit would order the classes by that thread's spans alone, and the budget then holds the next
// pass back for about 50 times the first one's CPU time.
constexpr uint64_t kWakeupSettleNs = 10 * kNanosPerMilli;
// Detached spans turned partial (their first free slot) since the last pass, in bytes of span,
// beyond which the thread is woken for a pass as soon as the frees stop, instead of at its
// next tick. In the fragmentation demo each phase frees about 40 MiB within 0.1 s and then
// idles 0.3 s: on the timer the pass began up to a period after the frees, and the phase's
// garbage stayed resident that long.
constexpr uint64_t kMassFreeWakeBytes = 4ull << 20;
// A pass that released at least mesh_min_gain is followed by the next after this gap (within
// the budget) rather than a period: there is likely more to mesh (candidates left for the next
// sweep, spans freed into meanwhile), and a phase's garbage was meshed over three or four
// periods.
constexpr uint64_t kProductiveGapNs = 10 * kNanosPerMilli;
// The largest nice value Linux accepts (the lowest priority short of SCHED_IDLE).
constexpr uint64_t kLowestPriorityNice = 19;
// A pass that released nothing, with no refill since the one before, doubles the wait before
// the next (up to 2^kMaxIdleBackoffShift periods: 6.4 s at the default 100 ms). A program gone
// idle with free slots that do not mesh (Redis after its insertion: 30 MB of them, in half-full
// spans) otherwise paid a fruitless pass every period, 2 % of a CPU for as long as it ran. A
// refill, a thread's exit or a pass that meshes ends the backoff.
constexpr unsigned kMaxIdleBackoffShift = 6;
// The fragmentation band of MeshPolicy::budgetPermille (share of the active bytes that are free
// slots in detached spans).
constexpr uint64_t kBudgetBandLowPermille = 50;
constexpr uint64_t kBudgetBandHighPermille = 290;
std::atomic<unsigned> gIdleBackoffShift{0};
// Set by refills (only if clear: the line is shared), cleared by each pass.
std::atomic<bool> gHeapChanged{false};
// What the span-freed-into hook counted since the last pass, and whether it has woken the
// thread for it.
std::atomic<uint64_t> gFreedIntoBytes{0};
std::atomic<bool> gFreeWakeSent{false};
std::atomic<uint64_t> gLastPassNs{0};
int gForkPipe[2] = {-1, -1};

// The mesher's participant, before any heap lock: no batch is half done while the process is
// copied (a pass in progress stops at its next batch boundary).
void forkMesherChild() {
  Mesher::resetAfterFork();
  // The background and commit threads did not survive the fork; the child starts its own when
  // it needs them.
  CommitThread::forgetAfterFork();
  gThreadStarted.store(false, std::memory_order_relaxed);
  gRefills.store(0, std::memory_order_relaxed);
}

// The snapshot's participant, with every heap lock held: meshed pages are shared memory, so
// the child copies them before the parent may change them.
void forkSnapshotPrepare() {
  gForkPipe[0] = gForkPipe[1] = -1;
  if (!SpanBacking::anyShared()) return;
  if (!os::makePipe(gForkPipe)) gForkPipe[0] = gForkPipe[1] = -1;
  WriteBarrier::begin();
  SpanBacking::protectAllForFork();
}

void forkSnapshotParent() {
  if (!SpanBacking::anyShared()) return;
  if (gForkPipe[1] >= 0) {
    os::closeFd(gForkPipe[1]);
    os::awaitByte(gForkPipe[0]);  // the child's copy is done (or the child is gone)
    os::closeFd(gForkPipe[0]);
  }
  SpanBacking::unprotectAllAfterFork();
  WriteBarrier::end();
}

void forkSnapshotChild() {
  if (!SpanBacking::anyShared()) return;
  SpanBacking::copyToPrivateFileInChild();
  if (gForkPipe[1] >= 0) {
    os::signalByte(gForkPipe[1]);
    os::closeFd(gForkPipe[1]);
    os::closeFd(gForkPipe[0]);
  }
  WriteBarrier::end();
}

constexpr heap::ForkParticipant kForkMesher = {"mesher", heap::ForkRank::kBeforeHeapLocks,
                                               Mesher::lockForFork, Mesher::unlockAfterFork,
                                               forkMesherChild};
constexpr heap::ForkParticipant kForkSnapshot = {
    "meshed-span snapshot", heap::ForkRank::kAfterHeapLocks, forkSnapshotPrepare,
    forkSnapshotParent, forkSnapshotChild};

}  // namespace

void MeshPolicy::init() {
  if (gInitialized.exchange(true)) return;
  CpuBudget::start(os::monotonicNanos(), kBudgetCreditNs);
  heap::forkParticipants().add(kForkMesher);
  heap::forkParticipants().add(SpanBacking::forkParticipant());
  heap::forkParticipants().add(RetiredSpans::forkParticipant());
  heap::forkParticipants().add(kForkSnapshot);
  RetiredSpans::install();
  heap::setRefillHook(onRefill);
  heap::addThreadExitHook(onThreadExit);
  RetiredSpans::setHook(onRetiredSpans);
  GlobalHeap::setSpanFreedIntoHook(onSpanFreedInto);
}

void MeshPolicy::onSpanFreedInto(size_t spanBytes) {
  if (!gHeapConfig.meshing || !backgroundThreadRunning()) return;
  uint64_t total = gFreedIntoBytes.fetch_add(spanBytes, std::memory_order_relaxed) + spanBytes;
  if (total < kMassFreeWakeBytes) return;
  // Keeps a woken thread settling while the frees go on.
  gPassWakeups.fetch_add(1, std::memory_order_release);
  if (gFreeWakeSent.exchange(true, std::memory_order_relaxed)) return;
  gWakeups.fetch_add(1, std::memory_order_release);
  os::futexWakeOne(&gWakeups);
}

bool MeshPolicy::onRetiredSpans(bool wake) {
  if (!backgroundThreadRunning()) return false;
  if (wake) {
    gRestoreWakeup.store(true, std::memory_order_relaxed);
    gWakeups.fetch_add(1, std::memory_order_release);
    os::futexWakeOne(&gWakeups);
  }
  return true;
}

size_t MeshPolicy::compactNow() {
  if (!heap::ensureInitialized()) return 0;
  return Mesher::compact();
}

bool MeshPolicy::backgroundThreadRunning() {
  return gThreadStarted.load(std::memory_order_relaxed) &&
         !gThreadFailed.load(std::memory_order_relaxed);
}

void MeshPolicy::runPassWithinBudget() {
  // The budget is CPU time: waiting for a preempted thread to leave a guarded section
  // (likely with many threads on few cores) costs the program nothing.
  uint64_t start = os::threadCpuNanos();
  uint64_t restoreStart = Mesher::stats().restoreCpuNs;
  uint64_t batchStart = Mesher::stats().batchCpuNs;
  bool changed = gHeapChanged.exchange(false, std::memory_order_relaxed);
  gFreedIntoBytes.store(0, std::memory_order_relaxed);
  gFreeWakeSent.store(false, std::memory_order_relaxed);
  size_t released = Mesher::compact(gHeapConfig.meshMinGainBytes);
  // Restoring spans that died is the freeing threads' work done for them, not meshing.
  // Batches run on the commit thread: their CPU is the pass's all the same.
  uint64_t spent = os::threadCpuNanos() - start - (Mesher::stats().restoreCpuNs - restoreStart) +
                   (Mesher::stats().batchCpuNs - batchStart);
  unsigned shift = gIdleBackoffShift.load(std::memory_order_relaxed);
  if (released > 0 || changed) {
    shift = 0;
  } else if (shift < kMaxIdleBackoffShift) {
    shift++;
  }
  gIdleBackoffShift.store(shift, std::memory_order_relaxed);
  uint64_t budget = budgetPermille(Mesher::stats().lastGainBytes, Arena::stats().activeBytes);
  uint64_t now = os::monotonicNanos();
  uint64_t clock = CpuBudget::charge(CpuBudget::kMeshing, spent, budget, now, kBudgetCreditNs);
  uint64_t period = (gHeapConfig.meshPeriodMs * kNanosPerMilli) << shift;
  if (released >= gHeapConfig.meshMinGainBytes && released > 0 && period > kProductiveGapNs)
    period = kProductiveGapNs;
  gLastPassNs.store(now, std::memory_order_relaxed);
  gNextPassNs.store(clock > now + period ? clock : now + period, std::memory_order_relaxed);
}

uint64_t MeshPolicy::budgetPermille(uint64_t gainBytes, uint64_t activeBytes) {
  uint64_t base = gHeapConfig.meshBudgetPermille ? gHeapConfig.meshBudgetPermille : 1;
  if (base > kPermille) base = kPermille;
  uint64_t most = gHeapConfig.meshBudgetMaxPermille;
  if (most > kPermille) most = kPermille;
  if (most <= base || activeBytes == 0) return base;
  // Anchorage's band, in the share of the heap a perfect compaction would give back: a heap
  // F = 1.05 times its live data has 1 - 1/F = 5 % to give, one at F = 1.4 has 29 %. Below
  // the band meshing gets the base budget, above it the most, linearly in between.
  uint64_t sharePermille =
      gainBytes >= activeBytes ? kPermille : gainBytes * kPermille / activeBytes;
  if (sharePermille <= kBudgetBandLowPermille) return base;
  if (sharePermille >= kBudgetBandHighPermille) return most;
  return base + (most - base) * (sharePermille - kBudgetBandLowPermille) /
                    (kBudgetBandHighPermille - kBudgetBandLowPermille);
}

void MeshPolicy::endIdleBackoff() {
  gHeapChanged.store(true, std::memory_order_relaxed);
  if (gIdleBackoffShift.exchange(0, std::memory_order_relaxed) == 0) return;
  // Back to one period after the last pass, unless the budget says later.
  uint64_t due =
      gLastPassNs.load(std::memory_order_relaxed) + gHeapConfig.meshPeriodMs * kNanosPerMilli;
  uint64_t clock = CpuBudget::clock();
  gNextPassNs.store(clock > due ? clock : due, std::memory_order_relaxed);
}

void* MeshPolicy::backgroundMain(void*) {
  pthread_setname_np(pthread_self(), "meshalloc-mesh");
  // Housekeeping yields to the program's threads; a refusal only leaves it at the default.
  uint64_t nice = gHeapConfig.meshThreadNice;
  os::setCurrentThreadNice(
      static_cast<int>(nice < kLowestPriorityNice ? nice : kLowestPriorityNice));
  uint64_t period = gHeapConfig.meshPeriodMs * kNanosPerMilli;
  uint64_t nextTick = os::monotonicNanos() + period;
  for (;;) {
    // Every period, whatever the mesh budget says: the dirty cache decays on this tick.
    uint32_t wakeups = gWakeups.load(std::memory_order_acquire);
    uint32_t passWakeups = gPassWakeups.load(std::memory_order_acquire);
    uint64_t now = os::monotonicNanos();
    if (now < nextTick) os::futexWaitFor(&gWakeups, wakeups, nextTick - now);
    // Whatever woke the thread, meshed spans that died are made private again first.
    Mesher::restoreRetiredSpans();
    bool restoreOnly = gRestoreWakeup.exchange(false, std::memory_order_relaxed) &&
                       passWakeups == gPassWakeups.load(std::memory_order_acquire);
    uint64_t settleStart = os::monotonicNanos();
    if (restoreOnly && settleStart < nextTick) continue;
    nextTick = settleStart + period;
    for (uint32_t seen = gPassWakeups.load(std::memory_order_acquire); seen != passWakeups;
         seen = gPassWakeups.load(std::memory_order_acquire)) {
      passWakeups = seen;
      os::sleepNanos(kWakeupSettleNs);
      if (os::monotonicNanos() - settleStart > period) break;
    }
    // Idle threads' spans first, so that this tick's pass can mesh them. A heap parked too
    // recently is due before the next tick: wake for it then, so that it is reclaimed about
    // idle_reclaim_ms after its thread blocked rather than up to a period later.
    if (gHeapConfig.idleReclaimMs) {
      uint64_t due = UINT64_MAX;
      if (ThreadHeap::reclaimIdle(os::monotonicNanos(), gHeapConfig.idleReclaimMs * kNanosPerMilli,
                                  &due))
        endIdleBackoff();
      if (due < nextTick) nextTick = due;
    }
    // Dirty pages past their decay time go back even if the program has stopped freeing.
    Arena::purge(false);
    // Not before the budget shared with the handle defragmenter allows either.
    if (gHeapConfig.meshing &&
        os::monotonicNanos() >= gNextPassNs.load(std::memory_order_relaxed) &&
        os::monotonicNanos() >= CpuBudget::clock()) {
      runPassWithinBudget();
      // A productive pass wants a follow-up sooner than the next tick.
      uint64_t next = gNextPassNs.load(std::memory_order_relaxed);
      if (next < nextTick) nextTick = next;
    }
    if (TickHook hook = gTickHook.load(std::memory_order_acquire)) hook(os::monotonicNanos());
  }
  return nullptr;
}

void MeshPolicy::setTickHook(TickHook hook) {
  gTickHook.store(hook, std::memory_order_release);
}

void MeshPolicy::startBackgroundThread() {
  if (gThreadStarted.exchange(true)) return;
  // The commit thread first, from this program thread, so that it keeps the program's priority
  // while the mesher lowers its own. Without it, commits run on the mesher.
  if (gHeapConfig.meshing && gHeapConfig.meshThreadNice > 0) CommitThread::start();
  if (!os::startDetachedThread(backgroundMain))
    gThreadFailed.store(true, std::memory_order_relaxed);
}

void MeshPolicy::onThreadExit() {
  // The exiting thread's spans are now detached, the mesher's candidates: a program whose
  // threads finish and leave it idle gets its pass now rather than at the end of the period.
  // Only when the budget would allow a pass anyway.
  if (!gHeapConfig.meshing || !backgroundThreadRunning()) return;
  endIdleBackoff();
  if (os::monotonicNanos() < gNextPassNs.load(std::memory_order_relaxed)) return;
  gPassWakeups.fetch_add(1, std::memory_order_release);
  gWakeups.fetch_add(1, std::memory_order_release);
  os::futexWakeOne(&gWakeups);
}

void MeshPolicy::onRefill() {
  // The background thread also decays the dirty cache, so it runs with meshing off too.
  if (!gHeapChanged.load(std::memory_order_relaxed)) endIdleBackoff();
  if (gHeapConfig.meshBackgroundThread && !gThreadFailed.load(std::memory_order_relaxed)) {
    if (gThreadStarted.load(std::memory_order_relaxed)) return;
    unsigned before = gHeapConfig.liveStatsMs ? 1 : kRefillsBeforeThread;
    if (gRefills.fetch_add(1, std::memory_order_relaxed) + 1 < before) return;
    startBackgroundThread();
    return;
  }
  // No background thread: the same policy, run by whichever thread refills when a pass is due.
  if (!gHeapConfig.meshing) return;
  uint64_t next = gNextPassNs.load(std::memory_order_relaxed);
  uint64_t now = os::monotonicNanos();
  if (now < next || now < CpuBudget::clock()) return;
  if (!gNextPassNs.compare_exchange_strong(next, UINT64_MAX)) return;  // one thread runs it
  runPassWithinBudget();
}

}  // namespace meshalloc
