// Run-time options of the allocator, read once at start-up from MESHALLOC_* environment
// variables (one per option, mimalloc style) and from MESHALLOC_CONF="name:value,..." (jemalloc
// style; the individual variables win). See docs/options.md.
#pragma once

#include <cstddef>
#include <cstdint>

namespace meshalloc {

enum class Randomization : uint8_t {
  kNone = 0,             // slots handed out in address order
  kOnRefill = 1,         // shuffle vector shuffled whenever it is refilled
  kOnRefillAndFree = 2,  // ... and every local free lands at a random position
  // Not one of the paper's levels: each refill hands out every span's free slots in address
  // order from a random one (wrapping), the spans in random order, and a local free is the
  // next slot handed out (LIFO). Offsets are random per span rather than per object, so
  // objects allocated together stay neighbours (see docs/heap.md, "Rotated runs").
  kRotatedRuns = 3,
};

enum class StatsFormat : uint8_t { kNone = 0, kText = 1, kJson = 2 };

struct HeapConfig {
  bool meshing = true;
  Randomization randomization = Randomization::kRotatedRuns;
  // The most the dirty cache holds, whatever the heap's size.
  size_t dirtyCacheBytes = size_t{32} << 20;
  // ... and at most this percentage of the pages in use (never less than
  // Arena::kMinDirtyCacheBytes), so that the cache scales with the heap: a fixed 32 MiB cache
  // can be larger than a small program's whole heap, whose churn needs far less of it. A cache
  // that serves nearly every request may still grow to dirty_cache (see Arena::dirtyLimitLocked).
  // 0 turns the proportional limit off.
  uint64_t dirtyCachePercent = 25;
  // A run unused this long goes back to the OS. Programs churning memory reuse runs within
  // milliseconds; a longer decay only keeps memory a program that went idle (or whose threads
  // exited) will not touch again: at 1000 ms, 32 MiB of cache was a quarter of the live bytes
  // of the thread-scaling benchmark 300 ms after its threads exited.
  uint64_t decayMs = 250;
  // Large objects under 32 KiB made by malloc/calloc start at a varying cache-line offset into
  // their first page, within their tail slack (jemalloc's cache_oblivious; see
  // GlobalHeap::allocateLarge for what is not coloured). Page-aligned buffers all share their
  // low 12 address bits, so copies between them (a socket read into a page-aligned buffer,
  // memcpy between two of them) collide in the cache's sets and in the CPU's 4 KiB
  // store-to-load alias check: Redis's reads into its 16 KiB query buffer took 5x as long.
  bool largeColouring = true;
  // Runs larger than this are decommitted at once instead of cached.
  size_t maxCachedRunBytes = size_t{8} << 20;
  // Meshing (see mesh/): background period, CPU budget, SplitMesher probe limit.
  uint64_t meshPeriodMs = 100;
  uint64_t meshBudgetPermille = 20;
  // The budget grows up to this while a large share of the heap is free slots in detached spans
  // (MeshPolicy::budgetPermille: the gain at stake sets the price worth paying).
  uint64_t meshBudgetMaxPermille = 100;
  uint64_t meshProbes = 256;
  bool meshBackgroundThread = true;
  // The background thread's nice value (0-19). At 19 it runs on CPU time the program leaves
  // idle; on a CPU the program keeps busy, the scheduler gives it about 1.5 % of that CPU, near
  // the budget. At 0 it competed with the program's own threads (Redis LRU on 2 CPUs: its
  // insertion took about 3 % longer, medians of 8 paired runs, for the same memory).
  uint64_t meshThreadNice = 19;
  // A thread blocked this long in a condition-variable wait has its spans and free slots taken
  // back by the background thread (ThreadHeap::reclaimIdle): a server's idle pool thread would
  // otherwise hold them until it exits. 0 turns reclaiming off.
  uint64_t idleReclaimMs = 10;
  // Detached spans at most this full are mesh candidates.
  uint64_t meshOccupancyPercent = 75;
  // A pass is skipped while partial spans hold less free memory than this: little to gain.
  size_t meshMinGainBytes = size_t{1} << 20;
  // Handles (docs/handles.md): the defragmenter's controller (Anchorage's, ASPLOS 2024 section
  // 4.3) wakes every handles_period_ms; it starts moving objects when the handle store's
  // committed bytes exceed its live bytes by the high ratio (F_ub, per mille) and stops below
  // the low one (F_lb), or when a pass makes no progress; a pass moves at most
  // handles_move_permille of the committed bytes (alpha), and it sleeps so that its CPU time
  // stays under handles_budget_permille of the wall time (O_ub). Less than handles_min_gain of
  // difference is left alone. F_ub is 1.1, not Anchorage's 1.4: an LRU cache's eviction phase
  // left 40 % of its handle store empty before the first pass (docs/handles-bench.md), and
  // the CPU budget, not the band, is what bounds the defragmenter's cost.
  bool handlesDefrag = true;
  uint64_t handlesPeriodMs = 10;
  uint64_t handlesFragHighPermille = 1100;
  uint64_t handlesFragLowPermille = 1050;
  uint64_t handlesBudgetPermille = 50;
  uint64_t handlesMovePermille = 100;
  size_t handlesMinGainBytes = size_t{1} << 20;
  StatsFormat statsAtExit = StatsFormat::kNone;
  const char* statsFile = nullptr;  // a copy of the variable's value
  // Publish the statistics for `meshalloc top` every this many milliseconds (0: never), from
  // the background thread (api/live_stats.h).
  uint64_t liveStatsMs = 0;
  bool showOptions = false;
};

// Read by refills and the mesher on every thread, written at start-up: on a line of its own, not
// beside a lock the linker happens to place next to it (the internal heap's was).
alignas(64) inline HeapConfig gHeapConfig;

// Fills gHeapConfig from the environment; warns on stderr about values it cannot parse.
void loadConfigFromEnvironment();
// Writes every option's name and value to `fd` (MESHALLOC_SHOW_OPTIONS).
void printConfig(int fd);

// Visits every option as (name, value rendered as text); used by mallctl "opt.*" and printing.
struct OptionView {
  const char* name;
  enum Kind : uint8_t { kBool, kUnsigned, kSize, kRandomization, kStatsFormat, kString } kind;
  void* field;
};
const OptionView* findOption(const char* name);
const OptionView* optionsBegin();
const OptionView* optionsEnd();

class TextWriter;
// An option's value as text (JSON-quoted where `json`), for the options printout and reports.
void writeOptionValue(TextWriter& out, const OptionView& option, bool json);

}  // namespace meshalloc
