// meshalloc-replay-prepare: turns a trace into the replayer's input (replay_ops.h) and the
// tables `meshalloc trace analyze` reads. Runs in a process of its own, under the default
// allocator, so that none of its maps end up in a replay's heap (docs/trace.md, Replay).
//
//   meshalloc-replay-prepare TRACE --ops FILE [--blocks FILE] [--timeline FILE]
//
// Prints one JSON line (counts) on stdout. Errors: one line on stderr, exit 1 for a corrupt or
// unreadable trace, 2 for a bad invocation.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <unordered_map>
#include <vector>

#include "decoder.h"
#include "replay_ops.h"

namespace {

using namespace meshtrace;

constexpr int kExitCorrupt = 1;
constexpr int kExitUsage = 2;
// The timeline keeps about this many points whatever the trace's length, each with the peak
// of the window it closes, so a short spike is not lost between two points.
constexpr uint64_t kTimelinePoints = 20000;

int usage(const char* message) {
  fprintf(stderr,
          "meshalloc-replay-prepare: %s (usage: meshalloc-replay-prepare TRACE --ops FILE "
          "[--blocks FILE] [--timeline FILE])\n",
          message);
  return kExitUsage;
}

bool isRealloc(Kind kind) {
  return kind == Kind::kRealloc || kind == Kind::kReallocArray;
}

uint8_t patternOf(uint64_t id) {
  return static_cast<uint8_t>(id * 0x9d % 255 + 1);
}

struct Live {
  uint32_t slot;
  BlockRecord record;  // freeNs, freeOp, freeBytes, freeThread filled in when it ends
};

class Preparer {
 public:
  explicit Preparer(const Trace& trace) : trace_(trace) {
    for (const ThreadInfo& info : trace.threads()) {
      threadSlot_[info.thread] = threads_.size();
      threads_.push_back(ThreadOps{info.thread, info.osThreadId, kNever, {}});
    }
  }

  bool run(FILE* blocks, FILE* timeline, Error* error) {
    blocks_ = blocks;
    timeline_ = timeline;
    MergedCursor cursor(trace_);
    uint64_t window = std::max<uint64_t>(1, trace_.events() / kTimelinePoints);
    if (timeline_) fprintf(timeline_, "ns\top\tlive_bytes\tlive_blocks\twindow_peak_bytes\n");
    Event event;
    uint64_t seen = 0;
    while (cursor.next(&event, error)) {
      uint64_t ns = trace_.nanoseconds(event.tick);
      if (seen++ == 0) firstNs_ = ns;
      ns = ns > firstNs_ ? ns - firstNs_ : 0;
      lastNs_ = std::max(lastNs_, ns);
      ThreadOps& thread = threads_[threadSlot_[event.thread]];
      thread.startNs = std::min(thread.startNs, ns);
      add(event, ns, thread);
      windowPeak_ = std::max(windowPeak_, liveBytes_);
      if (timeline_ && seen % window == 0) point(ns);
    }
    if (error->failed()) return false;
    if (timeline_) point(lastNs_);
    for (auto& [address, live] : live_) writeBlock(live.record);
    return true;
  }

  bool writeOps(const char* path, Error* error) {
    FILE* out = fopen(path, "wb");
    if (!out) {
      error->message = std::string("cannot write ") + path + ": " + strerror(errno);
      return false;
    }
    std::vector<ThreadOps*> order;
    for (ThreadOps& thread : threads_)
      if (!thread.ops.empty()) order.push_back(&thread);
    // Threads are started in the order the trace saw them start.
    std::stable_sort(order.begin(), order.end(), [](const ThreadOps* a, const ThreadOps* b) {
      return a->startNs < b->startNs;
    });
    OpsHeader header{};
    memcpy(header.magic, kOpsMagic, sizeof(header.magic));
    header.version = kOpsVersion;
    header.threads = static_cast<uint32_t>(order.size());
    header.slots = nextSlot_;
    header.ops = ops_;
    header.durationNs = lastNs_;
    header.skipped = skipped_;
    uint64_t offset = sizeof(OpsHeader) + order.size() * sizeof(OpsThread);
    bool ok = fwrite(&header, sizeof(header), 1, out) == 1;
    for (const ThreadOps* thread : order) {
      OpsThread entry{thread->thread, thread->osThreadId, offset, thread->ops.size(),
                      thread->startNs};
      ok = ok && fwrite(&entry, sizeof(entry), 1, out) == 1;
      offset += thread->ops.size() * sizeof(Op);
    }
    for (const ThreadOps* thread : order)
      ok = ok &&
           fwrite(thread->ops.data(), sizeof(Op), thread->ops.size(), out) == thread->ops.size();
    ok = (fclose(out) == 0) && ok;
    if (!ok) error->message = std::string("cannot write ") + path + ": " + strerror(errno);
    return ok;
  }

  void printSummary() const {
    printf("{\"ops\": %" PRIu64 ", \"threads\": %zu, \"slots\": %u, \"skipped\": %" PRIu64
           ", \"unmatched_releases\": %" PRIu64 ", \"duration_ns\": %" PRIu64
           ", \"peak_live_bytes\": %" PRIu64 ", \"peak_live_blocks\": %" PRIu64 "}\n",
           ops_, threads_.size(), nextSlot_, skipped_, unmatched_, lastNs_, peakLiveBytes_,
           peakLiveBlocks_);
  }

 private:
  struct ThreadOps {
    uint32_t thread;
    uint32_t osThreadId;
    uint64_t startNs;
    std::vector<Op> ops;
  };

  uint32_t takeSlot() {
    if (freeSlots_.empty()) {
      slotVersions_.push_back(0);
      return nextSlot_++;
    }
    uint32_t slot = freeSlots_.front();  // FIFO: the slot freed longest ago
    freeSlots_.pop_front();
    return slot;
  }

  void point(uint64_t ns) {
    fprintf(timeline_, "%" PRIu64 "\t%" PRIu64 "\t%" PRIu64 "\t%zu\t%" PRIu64 "\n", ns, ops_,
            liveBytes_, live_.size(), windowPeak_);
    windowPeak_ = liveBytes_;
  }

  void writeBlock(const BlockRecord& record) {
    if (blocks_) fwrite(&record, sizeof(record), 1, blocks_);
  }

  // Ends the block at `address`; false when it is not live (a block from before the recorder).
  bool end(uint64_t address, uint64_t ns, uint32_t thread, Live* ended) {
    auto found = live_.find(address);
    if (found == live_.end()) return false;
    *ended = found->second;
    live_.erase(found);
    liveBytes_ -= ended->record.bytes;
    ended->record.freeNs = ns;
    ended->record.freeOp = ops_;
    ended->record.freeBytes = allocatedBytes_;
    ended->record.freeThread = thread;
    writeBlock(ended->record);
    return true;
  }

  void begin(const Event& event, uint64_t ns, const Op& op, bool fromRealloc) {
    uint64_t bytes = requestedBytes(event);
    // allocBytes: the clock after this allocation, so a block freed before any other allocation
    // has lived 0 bytes.
    BlockRecord record{event.id,
                       bytes,
                       ns,
                       kNever,
                       ops_,
                       kNever,
                       allocatedBytes_ + bytes,
                       kNever,
                       event.thread,
                       UINT32_MAX,
                       static_cast<uint8_t>(event.kind),
                       static_cast<uint8_t>(fromRealloc ? 1 : 0),
                       {}};
    allocatedBytes_ += bytes;
    liveBytes_ += bytes;
    auto [entry, inserted] = live_.try_emplace(event.result, Live{op.slot, record});
    if (!inserted) {
      // Only a lost free makes an address live twice: the old block is leaked in the replay
      // too (its slot is never reused), as it was for the recorder.
      liveBytes_ -= entry->second.record.bytes;
      entry->second = Live{op.slot, record};
    }
    peakLiveBytes_ = std::max(peakLiveBytes_, liveBytes_);
    peakLiveBlocks_ = std::max<uint64_t>(peakLiveBlocks_, live_.size());
  }

  void add(const Event& event, uint64_t ns, ThreadOps& thread) {
    Op op{static_cast<uint8_t>(event.kind),
          static_cast<uint8_t>(event.flags & kOpTraceFlags),
          0,
          0,
          kNoSlot,
          event.size,
          event.kind == Kind::kCalloc || event.kind == Kind::kReallocArray ? event.count
                                                                           : event.align,
          0,
          ns,
          0,
          0};
    Live ended{};
    if (event.kind == Kind::kFree || isDeleteKind(event.kind)) {
      if (event.address != 0) {
        if (!end(event.address, ns, event.thread, &ended)) {
          ++unmatched_;
          ++skipped_;
          return;
        }
        op.slot = ended.slot;
        op.flags |= kOpReleases;
        op.oldBytes = ended.record.bytes;
        op.pattern = patternOf(ended.record.id);
        freeSlots_.push_back(ended.slot);
      }
    } else if (event.kind == Kind::kUsableSize) {
      auto found = live_.find(event.address);
      if (found == live_.end()) {
        ++skipped_;
        return;
      }
      op.slot = found->second.slot;
      op.oldBytes = found->second.record.bytes;
    } else if (isRealloc(event.kind)) {
      if (event.result == 0) op.flags |= kOpRecordedNull;
      bool freesOld = event.result != 0 || requestedBytes(event) == 0;
      auto found = event.oldAddress != 0 ? live_.find(event.oldAddress) : live_.end();
      if (found != live_.end()) {
        op.slot = found->second.slot;
        op.oldBytes = found->second.record.bytes;
        op.pattern = patternOf(found->second.record.id);
        op.flags |= kOpReleases;
        if (freesOld) {
          end(event.oldAddress, ns, event.thread, &ended);
          if (event.result != 0) {
            op.flags |= kOpAllocates;  // the same slot: the object keeps its identity
            begin(event, ns, op, true);
          } else {
            freeSlots_.push_back(op.slot);
          }
        } else {
          op.flags |= kOpAllocates;  // a failed realloc: the block stays where it was
        }
      } else {
        // realloc(NULL, n), or of a block the trace never saw allocated: replayed as
        // realloc(NULL, n), a fresh block.
        if (event.oldAddress != 0) ++unmatched_;
        if (event.result != 0) {
          op.slot = takeSlot();
          op.flags |= kOpAllocates;
          op.pattern = patternOf(event.id);
          begin(event, ns, op, false);
        }
      }
    } else if (event.kind == Kind::kThreadStart || event.kind == Kind::kThreadExit ||
               event.kind == Kind::kFork) {
      ++skipped_;  // threads are the replayer's own; a forked child's trace is a file of its own
      return;
    } else {
      // The allocating calls: malloc, calloc, the aligned ones, valloc, pvalloc, new, new[].
      if (event.result == 0 || (event.kind == Kind::kPosixMemalign && event.value != 0)) {
        op.flags |= kOpRecordedNull;
      } else {
        op.slot = takeSlot();
        op.flags |= kOpAllocates;
        op.pattern = patternOf(event.id);
        begin(event, ns, op, false);
      }
    }
    if (op.slot != kNoSlot) op.version = slotVersions_[op.slot]++;
    thread.ops.push_back(op);
    ++ops_;
  }

  const Trace& trace_;
  std::vector<ThreadOps> threads_;
  std::unordered_map<uint32_t, size_t> threadSlot_;
  std::unordered_map<uint64_t, Live> live_;
  std::deque<uint32_t> freeSlots_;
  std::vector<uint32_t> slotVersions_;  // per slot: the ops on it so far (replay_ops.h)
  uint32_t nextSlot_ = 0;
  uint64_t ops_ = 0;
  uint64_t skipped_ = 0;
  uint64_t unmatched_ = 0;
  uint64_t firstNs_ = 0;
  uint64_t lastNs_ = 0;
  uint64_t allocatedBytes_ = 0;
  uint64_t liveBytes_ = 0;
  uint64_t windowPeak_ = 0;
  uint64_t peakLiveBytes_ = 0;
  uint64_t peakLiveBlocks_ = 0;
  FILE* blocks_ = nullptr;
  FILE* timeline_ = nullptr;
};

FILE* openOutput(const char* path, const char* mode) {
  if (!path) return nullptr;
  FILE* file = fopen(path, mode);
  if (!file)
    fprintf(stderr, "meshalloc-replay-prepare: cannot write %s: %s\n", path, strerror(errno));
  return file;
}

}  // namespace

int main(int argc, char** argv) {
  const char* tracePath = nullptr;
  const char* opsPath = nullptr;
  const char* blocksPath = nullptr;
  const char* timelinePath = nullptr;
  for (int i = 1; i < argc; ++i) {
    std::string argument = argv[i];
    const char** target = argument == "--ops"        ? &opsPath
                          : argument == "--blocks"   ? &blocksPath
                          : argument == "--timeline" ? &timelinePath
                                                     : nullptr;
    if (target) {
      if (i + 1 >= argc) return usage((argument + " needs a file").c_str());
      *target = argv[++i];
    } else if (!argument.empty() && argument[0] == '-') {
      return usage(("unknown option " + argument).c_str());
    } else if (!tracePath) {
      tracePath = argv[i];
    } else {
      return usage("more than one trace file");
    }
  }
  if (!tracePath) return usage("missing trace file");
  if (!opsPath) return usage("missing --ops FILE");
  Trace trace;
  Error error;
  if (!trace.open(tracePath, &error)) {
    fprintf(stderr, "meshalloc-replay-prepare: %s: offset %" PRIu64 ": %s\n", tracePath,
            error.offset, error.message.c_str());
    return kExitCorrupt;
  }
  FILE* blocks = openOutput(blocksPath, "wb");
  FILE* timeline = openOutput(timelinePath, "w");
  if ((blocksPath && !blocks) || (timelinePath && !timeline)) return kExitCorrupt;
  Preparer preparer(trace);
  bool ok = preparer.run(blocks, timeline, &error);
  if (blocks && fclose(blocks) != 0) ok = false;
  if (timeline && fclose(timeline) != 0) ok = false;
  if (!ok && !error.failed()) error.message = "cannot write the block or timeline table";
  if (ok) ok = preparer.writeOps(opsPath, &error);
  if (!ok) {
    fprintf(stderr, "meshalloc-replay-prepare: %s: offset %" PRIu64 ": %s\n", tracePath,
            error.offset, error.message.c_str());
    return kExitCorrupt;
  }
  preparer.printSummary();
  return 0;
}
