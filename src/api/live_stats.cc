#include "api/live_stats.h"

#include <errno.h>
#include <fcntl.h>
#include <time.h>
#include <unistd.h>

#include <atomic>

#include "api/stats.h"
#include "heap/config.h"
#include "mesh/policy.h"
#include "platform/os.h"
#include "support/text_writer.h"

namespace meshalloc::api {

namespace {

constexpr char kPrefix[] = "/dev/shm/meshalloc-live.";
constexpr uint64_t kNanosPerMilli = 1000000;
constexpr int kFormatVersion = 1;

std::atomic<bool> gStopped{false};
// Touched only by the background thread.
uint64_t gNextNs = 0;
uint64_t gSequence = 0;

uint64_t realtimeMillis() {
  struct timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<uint64_t>(now.tv_sec) * 1000 +
         static_cast<uint64_t>(now.tv_nsec) / kNanosPerMilli;
}

void publish(uint64_t nowNs) {
  uint64_t interval = gHeapConfig.liveStatsMs;
  if (!interval || nowNs < gNextNs || gStopped.load()) return;
  gNextNs = nowNs + interval * kNanosPerMilli;
  long pid = getpid();
  char temporary[64], path[64];
  if (!liveStatsPath(pid, true, temporary, sizeof(temporary)) ||
      !liveStatsPath(pid, false, path, sizeof(path)))
    return;
  // O_EXCL | O_NOFOLLOW: never write through a name someone else put in the shared directory.
  int fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EEXIST) {  // left by a write this process did not finish
    unlink(temporary);
    fd = open(temporary, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  }
  if (fd < 0) return;
  char header[256];
  TextWriter out(header, sizeof(header));
  out.text("{\"format\":\"meshalloc-live\",\"version\":")
      .unsignedValue(kFormatVersion)
      .text(",\"pid\":")
      .unsignedValue(static_cast<uint64_t>(pid))
      .text(",\"sequence\":")
      .unsignedValue(++gSequence)
      .text(",\"interval_ms\":")
      .unsignedValue(interval)
      .text(",\"unix_ms\":")
      .unsignedValue(realtimeMillis())
      .text(",\"report\":");
  os::writeFd(fd, out.data(), out.length());
  writeStats(fd, true);
  os::writeFd(fd, "}\n", 2);
  close(fd);
  if (rename(temporary, path) != 0) {
    unlink(temporary);
    return;
  }
  // stopLiveStats sets the flag before it removes the file: either it removes this one, or
  // this sees the flag and does.
  if (gStopped.load()) unlink(path);
}

}  // namespace

bool liveStatsPath(long pid, bool temporary, char* out, size_t capacity) {
  TextWriter name(out, capacity);
  name.text(kPrefix).unsignedValue(static_cast<uint64_t>(pid)).text(temporary ? ".tmp" : ".json");
  name.cString();
  return !name.truncated();
}

void startLiveStats() {
  if (gHeapConfig.liveStatsMs) MeshPolicy::setTickHook(publish);
}

void stopLiveStats() {
  if (!gHeapConfig.liveStatsMs) return;
  gStopped.store(true);
  // The temporary file too: exit_group may stop the background thread in the middle of a write.
  char path[64];
  if (liveStatsPath(getpid(), true, path, sizeof(path))) unlink(path);
  if (liveStatsPath(getpid(), false, path, sizeof(path))) unlink(path);
}

}  // namespace meshalloc::api
