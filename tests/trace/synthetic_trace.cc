// Writes traces whose every event is chosen here, for the replay and analysis tests
// (python/tests/test_trace_replay.py): nothing about them depends on a program's libc or timing.
//
//   trace_synthetic cross-thread FILE   every call kind, blocks freed and realloc'd on threads
//                                       other than the allocating one, addresses reused
//   trace_synthetic lifetimes FILE      one thread, blocks with lifetimes and sizes known exactly
//                                       (the expected figures are in the Python test)
//
// The file has no footer (the decoder rebuilds the index from the chunks, as for a process that
// ended in _exit), and ticks are nanoseconds (calibration 1:1).
#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "format.h"

namespace {

using namespace meshtrace;

struct PlannedEvent {
  uint64_t tick;
  uint32_t thread;
  Kind kind;
  uint8_t flags;
  std::vector<uint64_t> values;  // the kind's present fields, in format order
};

class Writer {
 public:
  explicit Writer(std::vector<PlannedEvent> events) : events_(std::move(events)) {
    std::stable_sort(events_.begin(), events_.end(),
                     [](const PlannedEvent& a, const PlannedEvent& b) { return a.tick < b.tick; });
    lastTick_ = events_.empty() ? 1 : events_.back().tick + 1;
  }

  bool save(const char* path) {
    FileHeader header{};
    memcpy(header.magic, kFileMagic, sizeof(header.magic));
    header.version = kFormatVersion;
    header.headerSize = sizeof(FileHeader);
    header.pid = 1;
    append(&header, sizeof(header));
    for (const PlannedEvent& event : events_) encode(event);
    for (auto& [thread, state] : threads_) flush(thread, state);
    FILE* out = fopen(path, "wb");
    if (!out) return false;
    bool ok = fwrite(file_.data(), 1, file_.size(), out) == file_.size();
    return fclose(out) == 0 && ok;
  }

 private:
  struct ThreadState {
    std::vector<uint8_t> payload;
    uint32_t events = 0;
    uint32_t sequence = 0;
    uint64_t baseTick = 0;
    uint64_t previousTick = 0;
    uint64_t previousAddress = 0;
  };

  void append(const void* data, size_t bytes) {
    const auto* from = static_cast<const uint8_t*>(data);
    file_.insert(file_.end(), from, from + bytes);
  }

  void encode(const PlannedEvent& event) {
    ThreadState& state = threads_[event.thread];
    if (state.events == 0) {
      state.baseTick = state.previousTick = event.tick;
      state.previousAddress = 0;
    }
    uint8_t buffer[kMaxEventBytes];
    uint8_t* cursor = buffer;
    *cursor++ = static_cast<uint8_t>(static_cast<uint8_t>(event.kind) | event.flags);
    cursor = putVarint(cursor, zigzag(static_cast<int64_t>(event.tick - state.previousTick)));
    state.previousTick = event.tick;
    size_t next = 0;
    for (Field field : kKinds[static_cast<size_t>(event.kind)].fields) {
      if (field == Field::kNone) break;
      if (!fieldPresent(event.kind, event.flags, field)) continue;
      uint64_t value = event.values.at(next++);
      bool address =
          field == Field::kAddress || field == Field::kOldAddress || field == Field::kResult;
      cursor =
          address ? putAddress(cursor, value, &state.previousAddress) : putVarint(cursor, value);
    }
    state.payload.insert(state.payload.end(), buffer, cursor);
    ++state.events;
    if (state.payload.size() > kMaxChunkPayload - kMaxEventBytes) flush(event.thread, state);
  }

  void flush(uint32_t thread, ThreadState& state) {
    if (state.events == 0) return;
    ChunkHeader chunk{};
    chunk.magic = kChunkMagic;
    chunk.payloadBytes = static_cast<uint32_t>(state.payload.size());
    chunk.thread = thread;
    chunk.sequence = state.sequence++;
    chunk.events = state.events;
    chunk.checksum = payloadChecksum(state.payload.data(), state.payload.size());
    chunk.baseTick = state.baseTick;
    chunk.written = Calibration{lastTick_, lastTick_};
    append(&chunk, sizeof(chunk));
    append(state.payload.data(), state.payload.size());
    state.payload.clear();
    state.events = 0;
  }

  std::vector<PlannedEvent> events_;
  std::map<uint32_t, ThreadState> threads_;
  std::vector<uint8_t> file_;
  uint64_t lastTick_ = 1;
};

constexpr uint64_t kBase = 0x10000000;
constexpr uint64_t kMiB = 1 << 20;

// Blocks allocated on threads 0 and 3, freed on threads 1 and 2 (some realloc'd, larger or
// smaller, first on the other one), each address reused by a later block: replaying it needs the
// cross-thread order.
std::vector<PlannedEvent> crossThread() {
  std::vector<PlannedEvent> events;
  for (uint32_t thread = 0; thread < 4; ++thread)
    events.push_back({thread, thread, Kind::kThreadStart, 0, {1000 + thread}});
  events.push_back({3, 0, Kind::kMalloc, 0, {uint64_t{1} << 62, 0}});    // failed: NULL
  events.push_back({5, 1, Kind::kFree, 0, {0}});                         // free(NULL)
  events.push_back({7, 2, Kind::kFree, 0, {0xdead0000}});                // never allocated
  events.push_back({9, 1, Kind::kRealloc, 0, {0, 100, 0x30000000, 1}});  // realloc(NULL), kept
  constexpr uint64_t kBlocks = 3000;
  for (uint64_t b = 0; b < kBlocks; ++b) {
    uint64_t size = 1 + (b * 7919) % (b % 50 == 0 ? 70000 : 600);
    uint64_t address = kBase + (b % 8) * kMiB;
    uint64_t tick = 100 * b + 20;
    uint32_t allocator = b % 2 == 0 ? 0 : 3;
    uint32_t freer = 1 + b % 2;
    uint64_t freeTick = 100 * b + 70 + 100 * (b % 5);
    switch (b % 8) {
      case 0:
        events.push_back({tick, allocator, Kind::kMalloc, 0, {size, address}});
        events.push_back({tick + 40, freer, Kind::kUsableSize, 0, {address, size}});
        events.push_back({freeTick, freer, Kind::kFree, 0, {address}});
        break;
      case 1:
      case 5: {
        if (b % 8 == 1) {
          events.push_back({tick, allocator, Kind::kCalloc, 0, {3, size, address}});
          size *= 3;
        } else {
          events.push_back({tick, allocator, Kind::kAlignedAlloc, 0, {256, size, address}});
        }
        uint64_t moved = address + kMiB / 2;
        uint64_t resized = b % 8 == 1 ? 2 * size + 1 : size / 3 + 1;  // grown, or shrunk
        events.push_back({tick + 30, 3 - freer, Kind::kRealloc, 0, {address, resized, moved, 10}});
        events.push_back({freeTick, freer, Kind::kFree, 0, {moved}});
        break;
      }
      case 2:
        events.push_back({tick, allocator, Kind::kMemalign, 0, {64, size, address}});
        events.push_back({freeTick, freer, Kind::kFree, 0, {address}});
        break;
      case 3:
        events.push_back({tick, allocator, Kind::kNew, 0, {size, address}});
        events.push_back({freeTick, freer, Kind::kDelete, kFlagSized, {address, size}});
        break;
      case 4:
        events.push_back({tick, allocator, Kind::kPosixMemalign, 0, {4096, size, address, 0}});
        events.push_back({freeTick, freer, Kind::kFree, 0, {address}});
        break;
      case 6:
        events.push_back(
            {tick, allocator, Kind::kNewArray, kFlagAligned | kFlagNothrow, {size, 32, address}});
        events.push_back({freeTick, freer, Kind::kDeleteArray, kFlagAligned, {address, 32}});
        break;
      default:
        events.push_back({tick, allocator, Kind::kValloc, 0, {size, address}});
        events.push_back({freeTick, freer, Kind::kFree, 0, {address}});
        break;
    }
  }
  for (uint32_t thread = 1; thread < 4; ++thread)
    events.push_back({100 * kBlocks + 1000, thread, Kind::kThreadExit, 0, {}});
  return events;
}

// One thread, one event every microsecond: 100 blocks of 16 bytes each freed by the next
// operation; 10 blocks of 4096 bytes allocated in a row, then freed in the same order; one block
// of 1 MiB never freed.
std::vector<PlannedEvent> lifetimes() {
  std::vector<PlannedEvent> events;
  uint64_t tick = 0;
  events.push_back({tick, 0, Kind::kThreadStart, 0, {1000}});
  for (int i = 0; i < 100; ++i) {
    events.push_back({tick += 1000, 0, Kind::kMalloc, 0, {16, kBase}});
    events.push_back({tick += 1000, 0, Kind::kFree, 0, {kBase}});
  }
  for (uint64_t j = 0; j < 10; ++j)
    events.push_back({tick += 1000, 0, Kind::kMalloc, 0, {4096, kBase + 2 * kMiB + j * 8192}});
  for (uint64_t j = 0; j < 10; ++j)
    events.push_back({tick += 1000, 0, Kind::kFree, 0, {kBase + 2 * kMiB + j * 8192}});
  events.push_back({tick += 1000, 0, Kind::kMalloc, 0, {kMiB, kBase + 64 * kMiB}});
  return events;
}

}  // namespace

int main(int argc, char** argv) {
  std::string scenario = argc == 3 ? argv[1] : "";
  if (scenario != "cross-thread" && scenario != "lifetimes") {
    fprintf(stderr, "usage: trace_synthetic cross-thread|lifetimes FILE\n");
    return 2;
  }
  Writer writer(scenario == "cross-thread" ? crossThread() : lifetimes());
  if (!writer.save(argv[2])) {
    perror(argv[2]);
    return 1;
  }
  return 0;
}
