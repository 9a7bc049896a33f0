#include "mesh/commit_thread.h"

#include <pthread.h>

#include <atomic>
#include <cstdint>

#include "platform/os.h"

namespace meshalloc::CommitThread {

namespace {

// The handoff: the caller publishes the job and moves kIdle -> kRequested; the helper runs it
// and moves kRequested -> kDone; the caller moves kDone -> kIdle. Both sides sleep on gState.
constexpr uint32_t kIdle = 0;
constexpr uint32_t kRequested = 1;
constexpr uint32_t kDone = 2;

std::atomic<uint32_t> gState{kIdle};
void (*gJob)(void*) = nullptr;
void* gJobArgument = nullptr;
std::atomic<bool> gRunning{false};

void* helperMain(void*) {
  pthread_setname_np(pthread_self(), "meshalloc-commit");
  for (;;) {
    uint32_t state = gState.load(std::memory_order_acquire);
    if (state != kRequested) {
      os::futexWait(&gState, state);
      continue;
    }
    gJob(gJobArgument);
    gState.store(kDone, std::memory_order_release);
    os::futexWakeAll(&gState);
  }
  return nullptr;
}

}  // namespace

bool start() {
  if (gRunning.load(std::memory_order_acquire)) return true;
  bool started = os::startDetachedThread(helperMain);
  if (started) gRunning.store(true, std::memory_order_release);
  return started;
}

bool run(void (*job)(void*), void* arg) {
  if (!gRunning.load(std::memory_order_acquire)) {
    job(arg);
    return false;
  }
  gJob = job;
  gJobArgument = arg;
  gState.store(kRequested, std::memory_order_release);
  os::futexWakeAll(&gState);
  for (uint32_t state; (state = gState.load(std::memory_order_acquire)) != kDone;)
    os::futexWait(&gState, state);
  gState.store(kIdle, std::memory_order_relaxed);
  return true;
}

void forgetAfterFork() {
  gRunning.store(false, std::memory_order_relaxed);
  gState.store(kIdle, std::memory_order_relaxed);
}

}  // namespace meshalloc::CommitThread
