#include "api/live_stats.h"

#include <errno.h>

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

void publish(uint64_t nowNs) {
  uint64_t interval = gHeapConfig.liveStatsMs;
  if (!interval || nowNs < gNextNs || gStopped.load()) return;
  gNextNs = nowNs + interval * kNanosPerMilli;
  long pid = os::processId();
  char temporary[64], path[64];
  if (!liveStatsPath(pid, true, temporary, sizeof(temporary)) ||
      !liveStatsPath(pid, false, path, sizeof(path)))
    return;
  // O_EXCL | O_NOFOLLOW: never write through a name someone else put in the shared directory.
  int fd = os::createFile(temporary, os::FileCreation::kExclusivePrivate);
  if (fd < 0 && errno == EEXIST) {  // left by a write this process did not finish
    os::removeFile(temporary);
    fd = os::createFile(temporary, os::FileCreation::kExclusivePrivate);
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
      .unsignedValue(os::realtimeMillis())
      .text(",\"report\":");
  os::writeFd(fd, out.data(), out.length());
  writeStats(fd, true);
  os::writeFd(fd, "}\n", 2);
  os::closeFd(fd);
  if (!os::renameFile(temporary, path)) {
    os::removeFile(temporary);
    return;
  }
  // stopLiveStats sets the flag before it removes the file: either it removes this one, or
  // this sees the flag and does.
  if (gStopped.load()) os::removeFile(path);
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
  if (liveStatsPath(os::processId(), true, path, sizeof(path))) os::removeFile(path);
  if (liveStatsPath(os::processId(), false, path, sizeof(path))) os::removeFile(path);
}

}  // namespace meshalloc::api
