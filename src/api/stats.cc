#include "api/stats.h"

#include "handle/handles.h"
#include "handle/store.h"
#include "handle/table.h"
#include "heap/arena.h"
#include "heap/config.h"
#include "heap/cpu_budget.h"
#include "heap/heap.h"
#include "heap/internal_heap.h"
#include "heap/thread_heap.h"
#include "mesh/mesher.h"
#include "mesh/retired_spans.h"
#include "mesh/span_backing.h"
#include "mesh/write_barrier.h"
#include "platform/os.h"
#include "support/lock.h"
#include "support/text_writer.h"

namespace meshalloc::api {

const BreakdownComponent kBreakdownComponents[] = {
#define MESHALLOC_BREAKDOWN_LINE(field, name, group, inHeap, basis, description) \
  {name, group, inHeap != 0, basis, description, &MemoryBreakdown::field},
    MESHALLOC_BREAKDOWN_COMPONENTS(MESHALLOC_BREAKDOWN_LINE)
#undef MESHALLOC_BREAKDOWN_LINE
};
const size_t kBreakdownComponentCount =
    sizeof(kBreakdownComponents) / sizeof(kBreakdownComponents[0]);

const HeapStatistic kHeapStatistics[] = {
#define MESHALLOC_HEAP_STATISTIC_LINE(field, ctlName, reportName, description) \
  {ctlName, reportName, description, &HeapStats::field},
    MESHALLOC_HEAP_STATISTICS(MESHALLOC_HEAP_STATISTIC_LINE)
#undef MESHALLOC_HEAP_STATISTIC_LINE
};
const size_t kHeapStatisticCount = sizeof(kHeapStatistics) / sizeof(kHeapStatistics[0]);

namespace {
constexpr size_t kReportCapacity = 32 << 10;
constexpr size_t kReportNameColumn = 24;
constexpr char kVersion[] = "0.1.0";

// The detached-free components, one per occupancy bin, in bin order.
constexpr int64_t MemoryBreakdown::*kDetachedFree[] = {
    &MemoryBreakdown::detachedFree0, &MemoryBreakdown::detachedFree1,
    &MemoryBreakdown::detachedFree2, &MemoryBreakdown::detachedFree3};
static_assert(sizeof(kDetachedFree) / sizeof(kDetachedFree[0]) == GlobalHeap::kOccupancyBins,
              "MESHALLOC_BREAKDOWN_COMPONENTS needs one detached_free line per occupancy bin");

size_t roundUp(size_t value, size_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

int64_t bytes(uint64_t value) {
  return static_cast<int64_t>(value);
}

// The spans attached in another thread's vector `v`, read without its owner's cooperation
// (single-copy-atomic loads; the registry lock keeps the heap itself in place).
template <typename Visit>
void forEachAttachedSpan(ShuffleVector& v, Visit visit) {
  unsigned count = v.attached.countSeenByPeers();
  for (unsigned span = 0; span < count && span < kMaxSpansPerVector; span++) {
    if (Span* record = v.attached.recordSeenByPeers(span)) visit(record);
  }
}

// What the internal heap gives a block of `size` bytes (see InternalHeap::allocate).
size_t internalBlockBytes(size_t size) {
  return size > InternalHeap::kMaxPooledSize ? roundUp(size, Arena::pageSize())
                                             : roundUp(size, InternalHeap::kGranule);
}

}  // namespace

MemoryBreakdown collectBreakdown() {
  MemoryBreakdown b = {};
  if (!heap::ensureInitialized()) return b;
  // The caller's own frees count as done (other threads' recycled blocks count as free below).
  heap::flushRecycledBlocks();
  size_t pageSize = Arena::pageSize();

  // Attached spans, through their threads. A slot in a shuffle vector counts as owned in its
  // span's liveCount, and so does a block in a recycled ring (whichever span it is in): both
  // are free memory held by a thread.
  struct Attached {
    uint64_t spans, slots, live, held;
  };
  Attached attached[kNumSizeClasses] = {};
  size_t threadHeapResident = 0, threadHeapBlocks = 0;
  size_t storage = ThreadHeap::storageBytes();
  ThreadHeap::lockRegistry();
  for (ThreadHeap* heap = ThreadHeap::registryHead(); heap; heap = heap->nextInRegistry()) {
    threadHeapBlocks += internalBlockBytes(storage);
    threadHeapResident += os::residentBytes(heap, roundUp(storage, pageSize));
    // A pooled heap holds nothing, and its vectors' pages went back (ThreadHeap::retire):
    // reading them would map the zero page, which mincore counts as resident.
    if (!heap->inUse()) continue;
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      ShuffleVector& v = heap->vector(c);
      forEachAttachedSpan(v, [&](Span* record) {
        uint32_t live = record->liveCount.load(std::memory_order_relaxed);
        attached[c].spans++;
        attached[c].slots += record->objectCount;
        attached[c].live += live < record->objectCount ? live : record->objectCount;
      });
      attached[c].held += v.slots.lengthSeenByPeers() + v.recycled.countSeenByPeers();
    }
  }
  ThreadHeap::unlockRegistry();

  size_t spanRecordBytes = 0;
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    const SpanPlan& plan = SizeClasses::plan(c);
    size_t spanBytes = static_cast<size_t>(plan.pages) * pageSize;
    size_t tail = spanBytes - static_cast<size_t>(plan.objectCount) * plan.objectSize;
    GlobalHeap::DetachedUsage detached = GlobalHeap::detachedUsage(c);
    uint64_t live = detached.partialLive + detached.fullSpans * plan.objectCount + attached[c].live;
    uint64_t held = attached[c].held < live ? attached[c].held : live;
    b.smallLive += bytes((live - held) * plan.objectSize);
    b.attachedFree += bytes((attached[c].slots - attached[c].live + held) * plan.objectSize);
    for (size_t bin = 0; bin < GlobalHeap::kOccupancyBins; bin++)
      b.*kDetachedFree[bin] +=
          bytes(detached.freeSlots[bin] * plan.objectSize - detached.trimmedBytes[bin]);
    for (uint64_t trimmed : detached.trimmedBytes) b.meshTrimmed += bytes(trimmed);
    // The thread walk and this one are not one snapshot: a span that changed hands in between
    // is missed (in transit) or seen twice (then nothing is in transit).
    uint64_t seen = detached.fullSpans + detached.partialSpans + attached[c].spans;
    b.spanTail += bytes(seen * tail);
    if (detached.spans > seen) b.inTransit += bytes((detached.spans - seen) * spanBytes);
    spanRecordBytes += detached.spans * internalBlockBytes(Span::bytesFor(plan.objectCount));
  }

  GlobalHeap::LargeUsage large = GlobalHeap::largeUsage();
  b.largeLive = bytes(large.requestedBytes);
  b.largeSlack = bytes(large.spanBytes - large.requestedBytes);
  spanRecordBytes += large.count * internalBlockBytes(Span::bytesFor(1));
  RetiredSpans::Usage retired = RetiredSpans::usage();
  b.retiredMeshed = bytes(retired.virtualBytes);
  spanRecordBytes += retired.metadataBytes;
  b.dirtyCache = bytes(Arena::stats().dirtyBytes);
  size_t handleCommitted = handles::Store::committedBytes();
  size_t handleLive = handles::Store::liveBytes();
  b.handlesLive = bytes(handleLive);
  b.handlesFree = bytes(handleCommitted > handleLive ? handleCommitted - handleLive : 0);
  b.handlesTable = bytes(handles::Table::touchedBytes());
  b.meshSaving = bytes(SpanBacking::stats().releasedBytes);

  b.pageMaps = bytes(Arena::mapResidentBytes());
  b.spanRecords = bytes(spanRecordBytes);
  b.threadHeaps = bytes(threadHeapResident);
  // The internal heap's touched bytes hold the span records and the thread heaps' blocks too.
  int64_t internal = bytes(InternalHeap::bytesTouched());
  internal -= bytes(spanRecordBytes + threadHeapBlocks);
  b.internalOther = internal > 0 ? internal : 0;

  for (size_t i = 0; i < kBreakdownComponentCount; i++) {
    if (kBreakdownComponents[i].inHeap) b.heapTotal += b.*kBreakdownComponents[i].field;
  }
  long long pageTables = os::readProcKibField("/proc/self/status", "VmPTE:");
  long long pss = os::readProcKibField("/proc/self/smaps_rollup", "Pss:");
  b.pageTables = pageTables > 0 ? pageTables : 0;
  if (pss > 0) {
    b.pss = pss;
    b.outsideHeap = pss - b.heapTotal;
    b.charged = pss + b.pageTables;
  }
  return b;
}

HeapStats collectStats() {
  HeapStats stats = {};
  if (!heap::ensureInitialized()) return stats;
  // The caller's own frees count as done (other threads' last few may still be recycled).
  heap::flushRecycledBlocks();
  size_t pageSize = Arena::pageSize();
  for (unsigned c = 0; c < kNumSizeClasses; c++) stats.classes[c] = GlobalHeap::classStats(c);
  // Attached spans are counted through their threads; slots waiting in a shuffle vector are free.
  ThreadHeap::lockRegistry();
  for (ThreadHeap* heap = ThreadHeap::registryHead(); heap; heap = heap->nextInRegistry()) {
    if (!heap->inUse()) continue;  // pooled: nothing attached (and see collectBreakdown)
    stats.threadHeaps++;
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      ShuffleVector& v = heap->vector(c);
      uint64_t live = 0;
      forEachAttachedSpan(
          v, [&](Span* record) { live += record->liveCount.load(std::memory_order_relaxed); });
      uint32_t waiting = v.slots.lengthSeenByPeers();
      stats.classes[c].liveObjects += live > waiting ? live - waiting : 0;
    }
  }
  ThreadHeap::unlockRegistry();
  stats.idleReclaims = ThreadHeap::idleReclaims();
  for (unsigned c = 0; c < kNumSizeClasses; c++) {
    stats.allocated += stats.classes[c].liveObjects * stats.classes[c].objectSize;
  }
  stats.largeAllocated = GlobalHeap::largeBytes();
  stats.largeCount = GlobalHeap::largeCount();
  stats.allocated += stats.largeAllocated;
  ArenaStats arena = Arena::stats();
  stats.active = arena.activeBytes;
  stats.retained = arena.dirtyBytes;
  stats.reserved = arena.reservedBytes;
  stats.segments = arena.segmentCount;
  stats.purgedTotal = arena.purgedBytesTotal;
  stats.metadata = InternalHeap::bytesMapped();
  SpanBackingStats backing = SpanBacking::stats();
  MeshStats mesh = Mesher::stats();
  stats.meshCount = mesh.meshedSpans;
  stats.meshReleased = backing.releasedBytes;
  stats.meshReleasedPeak = backing.releasedBytesPeak;
  stats.meshedSpans = backing.meshedSpans;
  stats.meshAliases = backing.aliasSpans;
  stats.meshRetired = RetiredSpans::count();
  long mappings = os::countMappings();
  stats.mappings = mappings > 0 ? static_cast<size_t>(mappings) : 0;
  stats.mappingLimit = mesh.mappingLimit;
  stats.meshPasses = mesh.passes;
  stats.meshMappingLimitedPasses = mesh.vmaLimitedPasses;
  stats.meshFailed = mesh.failedMeshes;
  stats.meshStranded = mesh.strandedSpans;
  stats.meshUnprotectCopies = mesh.unprotectCopies;
  stats.meshSkippedForIo = mesh.skippedForIo;
  stats.meshTrimmedTotal = mesh.trimmedBytes;
  stats.meshTrimCalls = mesh.trimCalls;
  stats.pinnedSpans = GlobalHeap::pinnedSpans();
  stats.pauseCount = mesh.pauseCount;
  stats.pauseTotalNs = mesh.pauseTotalNs;
  stats.pauseMaxNs = mesh.pauseMaxNs;
  stats.pauseWaitMaxNs = mesh.pauseWaitMaxNs;
  stats.barrierMaxNs = mesh.barrierMaxNs;
  stats.meshCpuNs = mesh.cpuNs;
  stats.meshRestoreCpuNs = mesh.restoreCpuNs;
  stats.barrierFaults = WriteBarrier::faultsWaited();
  // Aliases are address space, not memory: active counts physical span bytes.
  stats.active -= stats.meshReleased < stats.active ? stats.meshReleased : stats.active;
  stats.resident = stats.active + stats.retained + stats.metadata;
  stats.mapped = stats.resident;
  (void)pageSize;
  return stats;
}

bool expandStatsPath(const char* pattern, long pid, char* out, size_t capacity) {
  if (capacity == 0) return false;
  size_t length = 0;
  auto put = [&](char c) {
    if (length + 1 >= capacity) return false;
    out[length++] = c;
    return true;
  };
  for (const char* p = pattern; *p; p++) {
    if (p[0] == '%' && p[1] == 'p') {
      char digits[24];
      size_t count = 0;
      unsigned long value = pid < 0 ? 0 : static_cast<unsigned long>(pid);
      do {
        digits[count++] = static_cast<char>('0' + value % 10);
        value /= 10;
      } while (value);
      while (count)
        if (!put(digits[--count])) return false;
      p++;
    } else if (p[0] == '%' && p[1] == '%') {
      if (!put('%')) return false;
      p++;
    } else if (!put(*p)) {
      return false;
    }
  }
  out[length] = '\0';
  return true;
}

void collectHandleStatistics(HandleStatistic (&out)[kHandleStatisticCount]) {
  using handles::gCounters;
  size_t committed = handles::Store::committedBytes();
  size_t live = handles::Store::liveBytes();
  uint64_t budgetAhead = CpuBudget::clock();
  uint64_t now = os::monotonicNanos();
  const HandleStatistic statistics[] = {
      {"live", handles::Store::liveObjects()},
      {"live_bytes", live},
      {"committed", committed},
      {"table_bytes", handles::Table::touchedBytes()},
      {"fragmentation_permille", live ? committed * 1000 / live : 0},
      {"pinned", handles::pinnedCount()},
      {"moved", gCounters.movedObjects.load(std::memory_order_relaxed)},
      {"moved_bytes", gCounters.movedBytes.load(std::memory_order_relaxed)},
      {"moves_abandoned", gCounters.abandonedMoves.load(std::memory_order_relaxed)},
      {"passes", gCounters.passes.load(std::memory_order_relaxed)},
      {"released", gCounters.releasedBytes.load(std::memory_order_relaxed)},
      {"cpu_ns", gCounters.cpuNs.load(std::memory_order_relaxed)},
      {"pauses", gCounters.moverWaits.count.load(std::memory_order_relaxed)},
      {"pause_total_ns", gCounters.moverWaits.totalNs.load(std::memory_order_relaxed)},
      {"pause_max_ns", gCounters.moverWaits.maxNs.load(std::memory_order_relaxed)},
      {"pause_p9999_ns", gCounters.moverWaits.quantileNs(9999)},
      {"lock_waits", gCounters.otherWaits.count.load(std::memory_order_relaxed)},
      {"lock_wait_max_ns", gCounters.otherWaits.maxNs.load(std::memory_order_relaxed)},
      {"lock_wait_p9999_ns", gCounters.otherWaits.quantileNs(9999)},
      {"move_hold_max_ns", gCounters.moveHoldMaxNs.load(std::memory_order_relaxed)},
      {"budget_meshing_ns", CpuBudget::spentNs(CpuBudget::kMeshing)},
      {"budget_handles_ns", CpuBudget::spentNs(CpuBudget::kHandles)},
      {"budget_ahead_ns", budgetAhead > now ? budgetAhead - now : 0},
  };
  static_assert(sizeof(statistics) / sizeof(statistics[0]) == kHandleStatisticCount);
  for (size_t i = 0; i < kHandleStatisticCount; i++) out[i] = statistics[i];
}

void writeStats(int fd, bool json) {
  HeapStats stats = collectStats();
  MemoryBreakdown breakdown = collectBreakdown();
  HandleStatistic handleStatistics[kHandleStatisticCount];
  collectHandleStatistics(handleStatistics);
  static char buffer[kReportCapacity];  // static: a 32 KiB stack frame could overflow small stacks
  static Mutex bufferLock(LockRank::kStatsReport);
  LockGuard guard(bufferLock);
  TextWriter out(buffer, sizeof(buffer));
  if (json) {
    out.text("{\"version\":\"")
        .text(kVersion)
        .text("\",\"page_size\":")
        .unsignedValue(Arena::pageSize());
    out.text(",\"options\":{");
    bool first = true;
    for (const OptionView* o = optionsBegin(); o != optionsEnd(); o++) {
      if (!first) out.put(',');
      first = false;
      out.put('"').text(o->name).text("\":");
      writeOptionValue(out, *o, true);
    }
    out.text("},\"stats\":{");
    first = true;
    for (size_t i = 0; i < kHeapStatisticCount; i++) {
      const HeapStatistic& f = kHeapStatistics[i];
      if (!first) out.put(',');
      first = false;
      out.put('"').text(f.reportName).text("\":").unsignedValue(stats.*f.field);
    }
    out.text("},\"handles\":{");
    for (size_t i = 0; i < kHandleStatisticCount; i++) {
      if (i) out.put(',');
      out.put('"')
          .text(handleStatistics[i].name)
          .text("\":")
          .unsignedValue(handleStatistics[i].value);
    }
    out.text("},\"breakdown\":{");
    for (size_t i = 0; i < kBreakdownComponentCount; i++) {
      const BreakdownComponent& c = kBreakdownComponents[i];
      if (i) out.put(',');
      out.put('"').text(c.name).text("\":").signedValue(breakdown.*c.field);
    }
    out.text("},\"breakdown_components\":[");
    for (size_t i = 0; i < kBreakdownComponentCount; i++) {
      const BreakdownComponent& c = kBreakdownComponents[i];
      if (i) out.put(',');
      out.text("{\"name\":\"").text(c.name).text("\",\"group\":\"").text(c.group);
      out.text("\",\"in_heap_total\":").boolean(c.inHeap);
      out.text(",\"basis\":\"").text(c.basis).text("\",\"description\":\"").text(c.description);
      out.text("\"}");
    }
    out.text("],\"classes\":[");
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      const SizeClassStats& s = stats.classes[c];
      if (c) out.put(',');
      out.text("{\"size\":")
          .unsignedValue(s.objectSize)
          .text(",\"span_pages\":")
          .unsignedValue(SizeClasses::plan(c).pages);
      out.text(",\"spans\":")
          .unsignedValue(s.spans)
          .text(",\"objects\":")
          .unsignedValue(s.liveObjects);
      out.text(",\"partial_spans\":")
          .unsignedValue(s.partialSpans)
          .text(",\"full_spans\":")
          .unsignedValue(s.fullSpans);
      out.put('}');
    }
    out.text("]}\n");
  } else {
    out.text("meshalloc ").text(kVersion).text(" statistics\n");
    for (size_t i = 0; i < kHeapStatisticCount; i++) {
      const HeapStatistic& f = kHeapStatistics[i];
      out.text("  ").text(f.reportName);
      // At least one space: the longest names are wider than the column.
      size_t width = __builtin_strlen(f.reportName);
      for (size_t pad = 0; pad == 0 || pad + width < kReportNameColumn; pad++) out.put(' ');
      out.unsignedValue(stats.*f.field).text("\n");
    }
    out.text("  handles:");
    for (const HandleStatistic& h : handleStatistics)
      out.put(' ').text(h.name).put('=').unsignedValue(h.value);
    out.text(
        "\n  breakdown (bytes; counted: committed by the heap's books, resident: present now)\n");
    for (size_t i = 0; i < kBreakdownComponentCount; i++) {
      const BreakdownComponent& c = kBreakdownComponents[i];
      char number[24];
      TextWriter value(number, sizeof(number));
      value.signedValue(breakdown.*c.field);
      out.text("    ").text(c.name);
      for (size_t pad = __builtin_strlen(c.name); pad < 16; pad++) out.put(' ');
      for (size_t pad = value.length(); pad < 14; pad++) out.put(' ');
      out.text(value.cString()).text("  ").text(c.basis);
      for (size_t pad = __builtin_strlen(c.basis); pad < 10; pad++) out.put(' ');
      out.text(c.description).text("\n");
    }
    out.text("  options:");
    for (const OptionView* o = optionsBegin(); o != optionsEnd(); o++) {
      out.put(' ').text(o->name).put('=');
      writeOptionValue(out, *o, false);
    }
    out.text("\n  size class   spans  objects  partial   full  utilisation\n");
    for (unsigned c = 0; c < kNumSizeClasses; c++) {
      const SizeClassStats& s = stats.classes[c];
      if (!s.spans) continue;
      size_t capacity = s.spans * SizeClasses::plan(c).objectCount;
      out.text("  ")
          .unsignedValue(s.objectSize)
          .text("\t")
          .unsignedValue(s.spans)
          .text("\t")
          .unsignedValue(s.liveObjects);
      out.text("\t").unsignedValue(s.partialSpans).text("\t").unsignedValue(s.fullSpans).text("\t");
      out.fixed(capacity
                    ? 100.0 * static_cast<double>(s.liveObjects) / static_cast<double>(capacity)
                    : 0.0,
                1)
          .text("%\n");
    }
  }
  os::writeFd(fd, out.data(), out.length());
}

}  // namespace meshalloc::api
