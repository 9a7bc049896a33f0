// The prepared replay (docs/trace.md, Replay): what `meshalloc-replay-prepare` writes from a
// trace and `meshalloc-replay` executes, plus the per-block table `trace analyze` reads.
//
// A trace names blocks by raw address, and resolving addresses needs a hash map as large as the
// peak live set; doing that in the replay process would put the map in the heap of the allocator
// under test and in its PSS. So the resolution is done once, ahead of time, in a process of its
// own: every event becomes an Op that names its block by a *slot* (an index into a table of
// pointers the replayer mmaps). Slots are reused first-in first-out, so the table holds as many
// entries as the trace's peak live block count, and a freed slot is reused as late as possible.
// Each op also names the slot's *version* it expects: every op on a slot (allocation, realloc,
// malloc_usable_size, free) finds version n and leaves n + 1, so an op waits for exactly the op
// before it on that slot, whichever thread replays it: a thread that runs ahead can never take a
// later block of the slot for the one it needs, and every wait is for an earlier call of the
// trace (no deadlock).
// Freestanding (no STL): the replayer includes it too.
#pragma once

#include <cstdint>

namespace meshtrace {

inline constexpr char kOpsMagic[8] = {'M', 'T', 'R', 'C', 'O', 'P', 'S', '\0'};
inline constexpr uint32_t kOpsVersion = 2;
inline constexpr uint32_t kNoSlot = UINT32_MAX;  // free(NULL), delete nullptr

struct OpsHeader {
  char magic[8];
  uint32_t version;
  uint32_t threads;  // OpsThread entries follow the header
  uint64_t slots;    // the slot table's length (peak live blocks)
  uint64_t ops;
  uint64_t durationNs;  // first to last event of the trace
  uint64_t skipped;     // events not replayed: unmatched frees, fork, thread start/exit
};
static_assert(sizeof(OpsHeader) == 48);

struct OpsThread {
  uint32_t thread;      // the trace's thread index
  uint32_t osThreadId;  // as recorded
  uint64_t offset;      // file offset of the thread's first Op
  uint64_t ops;
  uint64_t startNs;  // the thread's first event, from the trace's first event
};
static_assert(sizeof(OpsThread) == 32);

// Op::flags, besides the trace's own flag bits (format.h: kFlagNothrow, kFlagSized,
// kFlagAligned) which keep their meaning.
inline constexpr uint8_t kOpRecordedNull = 0x01;  // the recorded call returned NULL / failed
inline constexpr uint8_t kOpReleases = 0x02;      // the op ends the block in `slot`
inline constexpr uint8_t kOpAllocates = 0x04;     // the op puts a block into `slot`
inline constexpr uint8_t kOpTraceFlags = 0x60;    // format.h's nothrow/sized/aligned bits

// One call to replay. `kind` is a format.h Kind. Sizes are as recorded.
struct Op {
  uint8_t kind;
  uint8_t flags;
  uint8_t pattern;  // the byte the block is filled with (from the object id), never 0
  uint8_t reserved;
  uint32_t slot;      // kNoSlot when the call names no block
  uint64_t size;      // malloc/new/realloc size, calloc/reallocarray element size, delete size
  uint64_t arg;       // alignment, or calloc/reallocarray count
  uint64_t oldBytes;  // realloc: the bytes the block held; free/delete: its requested bytes
  uint64_t ns;        // since the trace's first event
  uint32_t version;   // the slot's version before this op (see above)
  uint32_t reserved2;
};
static_assert(sizeof(Op) == 48);

// `meshalloc-replay-prepare --blocks FILE`: one record per block (a realloc ends one block and
// begins the next, which keeps the object id), written when the block ends, then the blocks
// still live at the end (freeNs = kNever). Clocks: nanoseconds since the trace's first event,
// the merged operation count, and the bytes requested by all allocations so far (the thesis's
// three lifetime measures).
inline constexpr uint64_t kNever = UINT64_MAX;

struct BlockRecord {
  uint64_t id;  // the decoder's object id
  uint64_t bytes;
  uint64_t allocNs;
  uint64_t freeNs;
  uint64_t allocOp;
  uint64_t freeOp;
  uint64_t allocBytes;  // bytes requested before this block's allocation
  uint64_t freeBytes;
  uint32_t allocThread;
  uint32_t freeThread;
  uint8_t kind;     // the allocating call
  uint8_t realloc;  // 1: began with a realloc of a live block
  uint8_t reserved[6];
};
static_assert(sizeof(BlockRecord) == 80);

}  // namespace meshtrace
