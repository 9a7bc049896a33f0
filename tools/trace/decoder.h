// The trace reader (docs/trace.md): maps a trace file, validates its structure, and decodes it
// either one thread at a time (ThreadCursor) or all threads merged in time order with object ids
// assigned (MergedCursor, what a replayer wants). Never throws: every failure is an Error that
// names the file offset where the data stopped making sense.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "format.h"

namespace meshtrace {

struct Error {
  uint64_t offset = 0;
  std::string message;  // empty: no error
  bool failed() const { return !message.empty(); }
};

// One decoded event. Fields the kind does not have are 0 (format.h, kKinds).
struct Event {
  Kind kind = Kind::kMalloc;
  uint8_t flags = 0;    // kFlagNothrow / kFlagSized / kFlagAligned / kFlagCallsite
  uint32_t thread = 0;  // process-local thread index
  uint64_t index = 0;   // position in its thread's event sequence (0, 1, ...)
  uint64_t tick = 0;
  uint64_t size = 0;
  uint64_t count = 0;  // calloc, reallocarray
  uint64_t align = 0;
  uint64_t address = 0;     // free, delete, malloc_usable_size
  uint64_t oldAddress = 0;  // realloc, reallocarray
  uint64_t result = 0;      // the block an allocation returned (0: NULL)
  uint64_t value = 0;       // posix_memalign's return code, malloc_usable_size's result, the OS
                            // thread id (thread_start), the child's pid (fork)
  uint64_t duration = 0;    // realloc, reallocarray: ticks spent in the call
  uint32_t callsite = 0;    // valid with kFlagCallsite
  // Set by MergedCursor only: the object an allocation created or a free/realloc ended (0:
  // none, or a free of an address that was not live), and for realloc the object it replaced.
  uint64_t id = 0;
  uint64_t oldId = 0;
};

// Whether the event creates a block (result != 0 then) or releases one (address/oldAddress).
bool allocates(const Event& event);
bool releases(const Event& event);
// The address the event releases (free/delete: address; realloc: oldAddress), or 0.
uint64_t releasedAddress(const Event& event);
// The bytes the event asked for (count × size for calloc and reallocarray, saturated).
uint64_t requestedBytes(const Event& event);

struct ThreadInfo {
  uint32_t thread = 0;
  uint32_t osThreadId = 0;  // from the footer, else from the thread's thread_start event
  uint64_t events = 0;
  std::vector<IndexEntry> chunks;  // in sequence order
};

class Trace {
 public:
  Trace() = default;
  ~Trace();
  Trace(const Trace&) = delete;
  Trace& operator=(const Trace&) = delete;

  // Maps `path`, checks the header, then reads the footer's index (checking every entry against
  // its chunk header) or, without a footer, walks the chunk headers. Event payloads are checked
  // as they are decoded.
  bool open(const std::string& path, Error* error);
  // The same on bytes in memory (the caller keeps them alive): tests and the fuzzer.
  bool openBytes(const uint8_t* data, size_t size, Error* error);

  const FileHeader& header() const { return header_; }
  bool deflated() const { return (header_.flags & kFileDeflated) != 0; }
  bool complete() const { return complete_; }  // the footer is present
  uint64_t dropped() const { return dropped_; }
  uint64_t events() const { return events_; }
  uint64_t fileSize() const { return size_; }
  const std::vector<ThreadInfo>& threads() const { return threads_; }
  const ThreadInfo* thread(uint32_t index) const;
  // Nanoseconds since the header's calibration point.
  uint64_t nanoseconds(uint64_t tick) const;
  const uint8_t* data() const { return data_; }

 private:
  bool readFooter(Error* error);
  bool scanChunks(Error* error);
  bool addChunk(const IndexEntry& entry, Error* error);
  bool finish(Error* error);

  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  void* mapping_ = nullptr;
  FileHeader header_{};
  bool complete_ = false;
  uint64_t dropped_ = 0;
  uint64_t events_ = 0;
  Calibration last_{};
  std::vector<ThreadInfo> threads_;
  std::unordered_map<uint32_t, size_t> threadSlot_;
  double nsPerTick_ = 1.0;
};

// One thread's events in program order.
class ThreadCursor {
 public:
  ThreadCursor(const Trace& trace, uint32_t thread);
  // The next event: true; the end: false with `error` untouched; corrupt data: false with
  // `error` set.
  bool next(Event* event, Error* error);
  // The event next() would return, without consuming it; null at the end or on an error
  // (which next() then reports).
  const Event* peek() { return peekAhead(0); }
  // The event `ahead` (< kLookahead) places after that one, or null: lets MergedCursor fetch
  // the map slots of events it will resolve soon.
  const Event* peekAhead(size_t ahead);
  static constexpr size_t kLookahead = 16;

 private:
  bool read(Event* event, Error* error);  // the next event from the chunks
  void fill();
  bool loadChunk(Error* error);
  bool decode(Event* event, Error* error);
  // Where `at` (in the payload being decoded) is in the file; in a deflated trace, where it
  // would be had the payload been stored as it decodes.
  uint64_t offsetOf(const uint8_t* at) const;

  const Trace& trace_;
  const ThreadInfo* info_;
  size_t chunk_ = 0;
  uint64_t chunkOffset_ = 0;
  std::vector<uint8_t> inflated_;  // the current chunk's payload, inflated (deflated traces)
  const uint8_t* payload_ = nullptr;
  const uint8_t* cursor_ = nullptr;
  const uint8_t* end_ = nullptr;
  uint32_t left_ = 0;  // events left in the current chunk
  uint64_t tick_ = 0;
  uint64_t previousAddress_ = 0;
  uint64_t index_ = 0;
  // Events decoded ahead: a ring of count_ events from head_; then the end, or pendingError_.
  Event ring_[kLookahead];
  size_t head_ = 0;
  size_t count_ = 0;
  bool ended_ = false;
  Error pendingError_;
};

// The live blocks by address, for MergedCursor: open addressing with linear probing and
// backward-shift deletion (no tombstones, however many frees). std::unordered_map's node per
// entry made the merged cursor 25 times slower than decoding itself.
class LiveMap {
 public:
  struct Entry {
    uint64_t address;  // 0: an empty slot
    uint64_t id;
    uint64_t bytes;
  };
  Entry* find(uint64_t address);
  // The entry for `address` (nonzero): a new one (`*inserted` true) or the one already there.
  Entry* insert(uint64_t address, bool* inserted);
  void erase(Entry* entry);
  size_t size() const { return count_; }
  // Starts loading the slot `address` hashes to: the table is far larger than the caches.
  void prefetch(uint64_t address) const {
    if (!table_.empty()) __builtin_prefetch(&table_[home(address)]);
  }

 private:
  size_t home(uint64_t address) const {
    return static_cast<size_t>((address * 0x9e3779b97f4a7c15ull) >> shift_);
  }
  void grow();

  std::vector<Entry> table_;
  size_t count_ = 0;
  unsigned shift_ = 64;
};

// Every thread merged: at each step the thread whose next event has the smallest tick (a
// release before an allocation on equal ticks, then the lower thread index), so a block freed on
// one thread comes before its reuse on another. Assigns object ids through a map of the live
// addresses only.
class MergedCursor {
 public:
  explicit MergedCursor(const Trace& trace);
  bool next(Event* event, Error* error);

  struct Counts {
    uint64_t unmatchedReleases = 0;  // a free of an address not live in the trace
    uint64_t reusedLive = 0;         // an allocation returned an address still live
    uint64_t live = 0;               // objects
    uint64_t peakLive = 0;
    uint64_t liveBytes = 0;  // requested bytes of the live objects
    uint64_t peakLiveBytes = 0;
    uint64_t nextId = 1;
  };
  const Counts& counts() const { return counts_; }

 private:
  void assignIds(Event* event);

  struct Head {
    uint64_t tick;
    uint32_t rank;  // 0: the event releases a block, 1: anything else
    uint32_t thread;
    size_t cursor;
    bool operator>(const Head& other) const;
  };
  bool push(size_t cursor, Error* error);

  std::vector<ThreadCursor> cursors_;
  std::vector<Head> heap_;  // min-heap on (tick, rank, thread)
  Error startError_;        // a thread whose first event does not decode
  LiveMap live_;
  Counts counts_;
};

// One event as one line of `meshalloc trace dump` (time in ns since the trace started).
std::string formatEvent(const Trace& trace, const Event& event);

}  // namespace meshtrace
