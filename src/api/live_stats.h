// Live statistics for another process (`meshalloc top`, docs/cli.md). With live_stats_ms > 0
// the background thread writes the JSON report (the one MESHALLOC_STATS=json writes at exit),
// wrapped with the process id, a sequence number and the time, to
// /dev/shm/meshalloc-live.<pid>.json at most once every live_stats_ms: written to a temporary
// file and renamed over the last one, so a reader sees a whole report or the previous one.
// Nothing runs on malloc/free, nothing in a signal handler; off (0) by default.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc::api {

// From the library's constructor: hands the background thread its periodic hook.
void startLiveStats();
// From its destructor: removes this process's file (a process killed by a signal leaves it;
// `meshalloc top` tells a stale file by its age).
void stopLiveStats();
// The file's name for process `pid`; false if it does not fit.
bool liveStatsPath(long pid, bool temporary, char* out, size_t capacity);

}  // namespace meshalloc::api
