#include "api/ctl.h"

#include <errno.h>
#include <string.h>

#include <cstdint>

#include "api/entry_points.h"
#include "api/stats.h"
#include "handle/handles.h"
#include "heap/arena.h"
#include "heap/config.h"
#include "heap/heap.h"
#include "support/decimal.h"
#include "support/lock.h"

namespace meshalloc::api {

namespace {

constexpr char kVersionString[] = "0.1.0";

Mutex gSnapshotLock(LockRank::kStatsSnapshot);
HeapStats gSnapshot;
bool gHaveSnapshot = false;
uint64_t gEpoch = 0;
// The breakdown reads /proc and walks every span: computed when first asked for after an
// epoch, so that refreshing the other statistics stays cheap.
MemoryBreakdown gBreakdown;
bool gHaveBreakdown = false;

const HeapStats& snapshot() {
  if (!gHaveSnapshot) {
    gSnapshot = collectStats();
    gHaveSnapshot = true;
  }
  return gSnapshot;
}

template <typename T>
int readValue(void* oldp, size_t* oldlenp, T value) {
  if (!oldp || !oldlenp) return 0;
  if (*oldlenp != sizeof(T)) {
    // jemalloc copies what fits and reports EINVAL; do the same.
    size_t n = *oldlenp < sizeof(T) ? *oldlenp : sizeof(T);
    memcpy(oldp, &value, n);
    *oldlenp = n;
    return EINVAL;
  }
  memcpy(oldp, &value, sizeof(T));
  return 0;
}

bool readOnly(void* newp, size_t newlen) {
  return newp == nullptr && newlen == 0;
}

int breakdownValue(const char* component, void* oldp, size_t* oldlenp) {
  for (size_t i = 0; i < kBreakdownComponentCount; i++) {
    if (strcmp(component, kBreakdownComponents[i].name) != 0) continue;
    if (!gHaveBreakdown) {
      gBreakdown = collectBreakdown();
      gHaveBreakdown = true;
    }
    return readValue<int64_t>(oldp, oldlenp, gBreakdown.*kBreakdownComponents[i].field);
  }
  return ENOENT;
}

// Parses "<digits>." at *cursor, advancing past it.
bool parseIndex(const char*& cursor, size_t* index) {
  uint64_t value;
  if (!parseDecimal(cursor, nullptr, &value)) return false;
  *index = static_cast<size_t>(value);
  return true;
}

bool startsWith(const char*& cursor, const char* prefix) {
  size_t n = strlen(prefix);
  if (strncmp(cursor, prefix, n) != 0) return false;
  cursor += n;
  return true;
}

int classValue(size_t sizeClass, const char* field, void* oldp, size_t* oldlenp) {
  if (sizeClass >= kNumSizeClasses) return ENOENT;
  const SizeClassStats& s = snapshot().classes[sizeClass];
  if (!strcmp(field, "size")) return readValue<size_t>(oldp, oldlenp, s.objectSize);
  if (!strcmp(field, "spans") || !strcmp(field, "curslabs"))
    return readValue<size_t>(oldp, oldlenp, s.spans);
  if (!strcmp(field, "objects") || !strcmp(field, "curregs"))
    return readValue<size_t>(oldp, oldlenp, s.liveObjects);
  if (!strcmp(field, "nregs"))
    return readValue<uint32_t>(oldp, oldlenp,
                               SizeClasses::plan(static_cast<unsigned>(sizeClass)).objectCount);
  return ENOENT;
}

int optionValue(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  const OptionView* option = findOption(name);
  if (!option) return ENOENT;
  if (!readOnly(newp, newlen)) return EPERM;
  switch (option->kind) {
    case OptionView::kBool:
      return readValue<bool>(oldp, oldlenp, *static_cast<bool*>(option->field));
    case OptionView::kUnsigned:
      return readValue<uint64_t>(oldp, oldlenp, *static_cast<uint64_t*>(option->field));
    case OptionView::kSize:
      return readValue<size_t>(oldp, oldlenp, *static_cast<size_t*>(option->field));
    case OptionView::kRandomization:
      return readValue<unsigned>(
          oldp, oldlenp, static_cast<unsigned>(*static_cast<Randomization*>(option->field)));
    case OptionView::kStatsFormat: {
      StatsFormat format = *static_cast<StatsFormat*>(option->field);
      const char* text = format == StatsFormat::kJson   ? "json"
                         : format == StatsFormat::kText ? "text"
                                                        : "off";
      return readValue<const char*>(oldp, oldlenp, text);
    }
    case OptionView::kString:
      return readValue<const char*>(oldp, oldlenp, *static_cast<const char**>(option->field));
  }
  return ENOENT;
}

int statValue(const char* name, void* oldp, size_t* oldlenp) {
  const HeapStats& s = snapshot();
  for (size_t i = 0; i < kHeapStatisticCount; i++) {
    if (!strcmp(name, kHeapStatistics[i].ctlName))
      return readValue<size_t>(oldp, oldlenp, static_cast<size_t>(s.*kHeapStatistics[i].field));
  }
  // jemalloc's names for two of them, in pages.
  if (!strcmp(name, "stats.arenas.0.pactive"))
    return readValue<size_t>(oldp, oldlenp, s.active / Arena::pageSize());
  if (!strcmp(name, "stats.arenas.0.pdirty"))
    return readValue<size_t>(oldp, oldlenp, s.retained / Arena::pageSize());
  return ENOENT;
}

int handleValue(const char* name, void* oldp, size_t* oldlenp) {
  HandleStatistic statistics[kHandleStatisticCount];
  collectHandleStatistics(statistics);
  for (const HandleStatistic& s : statistics) {
    if (!strcmp(name, s.name)) return readValue<uint64_t>(oldp, oldlenp, s.value);
  }
  return ENOENT;
}

}  // namespace

int control(const char* name, void* oldp, size_t* oldlenp, void* newp, size_t newlen) {
  if (!name) return EINVAL;
  if (!heap::ensureInitialized()) return EAGAIN;
  if (oldp && !oldlenp) return EINVAL;
  const char* cursor = name;
  size_t index = 0;

  // Actions.
  if (startsWith(cursor, "arena.") && parseIndex(cursor, &index)) {
    if (!strcmp(cursor, ".purge") || !strcmp(cursor, ".decay")) {
      heap::releaseFreeMemory();
      return 0;
    }
    return ENOENT;
  }
  cursor = name;
  if (!strcmp(name, "thread.tcache.flush")) {
    heap::flushThreadCache();
    return 0;
  }
  if (!strcmp(name, "debug.class_dump")) {
    if (!newp || newlen != sizeof(unsigned)) return EINVAL;
    unsigned sizeClass = *static_cast<const unsigned*>(newp);
    if (sizeClass >= kNumSizeClasses) return ENOENT;
    GlobalHeap::debugDump(sizeClass);
    return 0;
  }
  if (!strcmp(name, "handles.compact")) {
    if (!handles::ensureInitialized()) return EAGAIN;
    size_t released = handles::compact(0);
    return oldp ? readValue<size_t>(oldp, oldlenp, released) : 0;
  }
  if (startsWith(cursor, "handles.")) {
    if (!readOnly(newp, newlen)) return EPERM;
    return handleValue(cursor, oldp, oldlenp);
  }
  cursor = name;
  if (!strcmp(name, "mesh.compact")) {
    size_t released = compactImpl();
    return oldp ? readValue<size_t>(oldp, oldlenp, released) : 0;
  }

  LockGuard guard(gSnapshotLock);
  if (!strcmp(name, "epoch")) {
    if (newp) {
      if (newlen != sizeof(uint64_t)) return EINVAL;
      gEpoch++;
    }
    gSnapshot = collectStats();
    gHaveSnapshot = true;
    gHaveBreakdown = false;
    return readValue<uint64_t>(oldp, oldlenp, gEpoch);
  }
  if (!strcmp(name, "version"))
    return readOnly(newp, newlen) ? readValue<const char*>(oldp, oldlenp, kVersionString) : EPERM;
  if (!readOnly(newp, newlen) && strncmp(name, "opt.", 4) != 0) return EPERM;
  if (!strcmp(name, "arenas.narenas")) return readValue<unsigned>(oldp, oldlenp, 1u);
  if (!strcmp(name, "arenas.nbins"))
    return readValue<unsigned>(oldp, oldlenp, static_cast<unsigned>(kNumSizeClasses));
  if (!strcmp(name, "arenas.page")) return readValue<size_t>(oldp, oldlenp, Arena::pageSize());
  if (!strcmp(name, "arenas.quantum")) return readValue<size_t>(oldp, oldlenp, kMinAlignment);
  if (startsWith(cursor, "opt.")) return optionValue(cursor, oldp, oldlenp, newp, newlen);
  cursor = name;
  if (startsWith(cursor, "arenas.bin.") && parseIndex(cursor, &index) && *cursor == '.') {
    return classValue(index, cursor + 1, oldp, oldlenp);
  }
  cursor = name;
  if (startsWith(cursor, "stats.arenas.") && parseIndex(cursor, &index) &&
      startsWith(cursor, ".bins.") && parseIndex(cursor, &index) && *cursor == '.') {
    return classValue(index, cursor + 1, oldp, oldlenp);
  }
  cursor = name;
  if (startsWith(cursor, "stats.classes.") && parseIndex(cursor, &index) && *cursor == '.') {
    return classValue(index, cursor + 1, oldp, oldlenp);
  }
  cursor = name;
  if (startsWith(cursor, "stats.breakdown.")) return breakdownValue(cursor, oldp, oldlenp);
  return statValue(name, oldp, oldlenp);
}

}  // namespace meshalloc::api
