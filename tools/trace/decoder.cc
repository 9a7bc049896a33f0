#include "decoder.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdarg>
#include <cstdio>
#include <cstring>

namespace meshtrace {

namespace {

bool fail(Error* error, uint64_t offset, std::string message) {
  error->offset = offset;
  error->message = std::move(message);
  return false;
}

std::string format(const char* pattern, ...) __attribute__((format(printf, 1, 2)));
std::string format(const char* pattern, ...) {
  char text[512];
  va_list arguments;
  va_start(arguments, pattern);
  vsnprintf(text, sizeof(text), pattern, arguments);
  va_end(arguments);
  return text;
}

template <typename Record>
Record load(const uint8_t* data, uint64_t offset) {
  Record record;
  memcpy(&record, data + offset, sizeof(Record));
  return record;
}

bool isAllocationKind(Kind kind) {
  switch (kind) {
    case Kind::kMalloc:
    case Kind::kCalloc:
    case Kind::kRealloc:
    case Kind::kReallocArray:
    case Kind::kMemalign:
    case Kind::kPosixMemalign:
    case Kind::kAlignedAlloc:
    case Kind::kValloc:
    case Kind::kPvalloc:
    case Kind::kNew:
    case Kind::kNewArray:
      return true;
    default:
      return false;
  }
}

bool isReallocKind(Kind kind) {
  return kind == Kind::kRealloc || kind == Kind::kReallocArray;
}

}  // namespace

bool allocates(const Event& event) {
  return isAllocationKind(event.kind) && event.result != 0;
}

uint64_t requestedBytes(const Event& event) {
  if (event.kind == Kind::kCalloc || event.kind == Kind::kReallocArray) {
    uint64_t total;
    return __builtin_mul_overflow(event.count, event.size, &total) ? UINT64_MAX : total;
  }
  return event.size;
}

uint64_t releasedAddress(const Event& event) {
  if (event.kind == Kind::kFree || isDeleteKind(event.kind)) return event.address;
  // realloc releases its block when it returns another one, or frees it (a request of 0
  // bytes answered with NULL, glibc's rule); a NULL for a nonzero request leaves it alone.
  if (isReallocKind(event.kind) && (event.result != 0 || requestedBytes(event) == 0))
    return event.oldAddress;
  return 0;
}

bool releases(const Event& event) {
  return releasedAddress(event) != 0;
}

// ---------------------------------------------------------------------------------- Trace

Trace::~Trace() {
  if (mapping_) munmap(mapping_, size_);
}

bool Trace::open(const std::string& path, Error* error) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return fail(error, 0, format("cannot open: %s", strerror(errno)));
  struct stat status;
  if (fstat(fd, &status) != 0 || !S_ISREG(status.st_mode)) {
    ::close(fd);
    return fail(error, 0, "not a regular file");
  }
  size_t size = static_cast<size_t>(status.st_size);
  if (size == 0) {
    ::close(fd);
    return fail(error, 0, "empty file, not a meshalloc trace");
  }
  void* mapping = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) return fail(error, 0, format("cannot map: %s", strerror(errno)));
  madvise(mapping, size, MADV_SEQUENTIAL);
  mapping_ = mapping;
  return openBytes(static_cast<const uint8_t*>(mapping), size, error);
}

bool Trace::openBytes(const uint8_t* data, size_t size, Error* error) {
  data_ = data;
  size_ = size;
  if (size < sizeof(FileHeader) || memcmp(data, kFileMagic, sizeof(kFileMagic)) != 0) {
    if (size >= sizeof(kFileMagic) && memcmp(data, kFileMagic, sizeof(kFileMagic)) != 0) {
      return fail(error, 0, "not a meshalloc trace (bad magic)");
    }
    return fail(error, size, "truncated: the file ends inside the 64-byte header");
  }
  header_ = load<FileHeader>(data, 0);
  if (header_.version != kFormatVersion) {
    return fail(error, offsetof(FileHeader, version),
                format("unsupported trace format version %u (this reader knows %u)",
                       header_.version, kFormatVersion));
  }
  if (header_.headerSize < sizeof(FileHeader) || header_.headerSize > size) {
    return fail(error, offsetof(FileHeader, headerSize),
                format("corrupt header size %u", header_.headerSize));
  }
  if (header_.flags & ~kFileDeflated)
    return fail(error, offsetof(FileHeader, flags),
                format("unknown header flags 0x%x", header_.flags));
  last_ = header_.start;
  bool ok = readFooter(error);
  if (!ok && error->failed()) return false;
  if (!ok && !scanChunks(error)) return false;
  return finish(error);
}

// True with the index read; false with `error` untouched when there is no trailer (walk the
// chunks instead); false with `error` set when a trailer is there but wrong.
bool Trace::readFooter(Error* error) {
  if (size_ < header_.headerSize + sizeof(Trailer)) return false;
  uint64_t trailerOffset = size_ - sizeof(Trailer);
  Trailer trailer = load<Trailer>(data_, trailerOffset);
  if (memcmp(trailer.magic, kTrailerMagic, sizeof(kTrailerMagic)) != 0) return false;
  uint64_t tables = uint64_t{trailer.indexEntries} * sizeof(IndexEntry) +
                    uint64_t{trailer.threadEntries} * sizeof(ThreadEntry);
  if (trailer.indexOffset < header_.headerSize || trailer.indexOffset > trailerOffset ||
      trailerOffset - trailer.indexOffset != tables) {
    return fail(error, trailerOffset,
                "corrupt footer: its tables do not fit between the chunks and the trailer");
  }
  for (uint32_t i = 0; i < trailer.indexEntries; ++i) {
    uint64_t at = trailer.indexOffset + uint64_t{i} * sizeof(IndexEntry);
    IndexEntry entry = load<IndexEntry>(data_, at);
    if (entry.offset < header_.headerSize ||
        entry.offset > trailer.indexOffset - sizeof(ChunkHeader)) {
      return fail(
          error, at,
          format("corrupt footer: index entry %u points at offset %" PRIu64 ", outside the chunks",
                 i, entry.offset));
    }
    if (!addChunk(entry, error)) return false;
    ChunkHeader chunk = load<ChunkHeader>(data_, entry.offset);
    if (entry.offset + sizeof(ChunkHeader) + chunk.payloadBytes > trailer.indexOffset) {
      return fail(error, entry.offset, "corrupt chunk: its payload runs into the footer");
    }
    if (chunk.thread != entry.thread || chunk.sequence != entry.sequence ||
        chunk.events != entry.events) {
      return fail(
          error, at,
          format("corrupt footer: index entry %u does not match the chunk at offset %" PRIu64, i,
                 entry.offset));
    }
  }
  uint64_t counted = 0;
  for (const ThreadInfo& info : threads_) counted += info.events;
  if (counted != trailer.events) {
    return fail(error, trailerOffset,
                format("corrupt footer: it counts %" PRIu64 " events, the chunks hold %" PRIu64,
                       trailer.events, counted));
  }
  for (uint32_t i = 0; i < trailer.threadEntries; ++i) {
    ThreadEntry entry = load<ThreadEntry>(
        data_, trailer.indexOffset + uint64_t{trailer.indexEntries} * sizeof(IndexEntry) +
                   uint64_t{i} * sizeof(ThreadEntry));
    auto slot = threadSlot_.find(entry.thread);
    if (slot != threadSlot_.end()) threads_[slot->second].osThreadId = entry.osThreadId;
  }
  if (trailer.end.ticks > last_.ticks) last_ = trailer.end;
  dropped_ = trailer.dropped;
  complete_ = true;
  return true;
}

bool Trace::scanChunks(Error* error) {
  uint64_t offset = header_.headerSize;
  while (offset < size_) {
    if (size_ - offset < sizeof(ChunkHeader)) {
      return fail(
          error, offset,
          format("truncated: the file ends inside a chunk header (%" PRIu64 " of %zu bytes)",
                 size_ - offset, sizeof(ChunkHeader)));
    }
    IndexEntry entry{};
    entry.offset = offset;
    ChunkHeader chunk = load<ChunkHeader>(data_, offset);
    entry.thread = chunk.thread;
    entry.sequence = chunk.sequence;
    entry.events = chunk.events;
    if (!addChunk(entry, error)) return false;
    uint64_t end = offset + sizeof(ChunkHeader) + chunk.payloadBytes;
    if (end > size_) {
      return fail(error, size_,
                  format("truncated: the chunk at offset %" PRIu64
                         " needs %u payload bytes, the file ends %" PRIu64 " bytes into it",
                         offset, chunk.payloadBytes, size_ - offset - sizeof(ChunkHeader)));
    }
    offset = end;
  }
  return true;
}

// Checks the chunk header at entry.offset (which the caller bounded) and files the chunk under
// its thread.
bool Trace::addChunk(const IndexEntry& entry, Error* error) {
  ChunkHeader chunk = load<ChunkHeader>(data_, entry.offset);
  if (chunk.magic != kChunkMagic)
    return fail(error, entry.offset, "corrupt: no chunk starts here (bad chunk magic)");
  if (chunk.payloadBytes > kMaxChunkPayload) {
    return fail(error, entry.offset + offsetof(ChunkHeader, payloadBytes),
                format("corrupt chunk: payload of %u bytes (at most %u)", chunk.payloadBytes,
                       kMaxChunkPayload));
  }
  // Every event takes at least two bytes, of the payload as it decodes (a deflated one grows
  // to at most kMaxChunkPayload; loadChunk checks against what it inflated to).
  uint32_t decodedBytes = deflated() ? kMaxChunkPayload : chunk.payloadBytes;
  if (chunk.events == 0 || chunk.events > decodedBytes / 2) {
    return fail(error, entry.offset + offsetof(ChunkHeader, events),
                format("corrupt chunk: %u events in %u bytes", chunk.events, chunk.payloadBytes));
  }
  if (chunk.written.ticks > last_.ticks) last_ = chunk.written;
  auto slot = threadSlot_.find(chunk.thread);
  if (slot == threadSlot_.end()) {
    slot = threadSlot_.emplace(chunk.thread, threads_.size()).first;
    threads_.emplace_back();
    threads_.back().thread = chunk.thread;
  }
  ThreadInfo& info = threads_[slot->second];
  IndexEntry filed = entry;
  filed.sequence = chunk.sequence;
  filed.events = chunk.events;
  info.chunks.push_back(filed);
  info.events += chunk.events;
  events_ += chunk.events;
  return true;
}

bool Trace::finish(Error* error) {
  std::sort(threads_.begin(), threads_.end(),
            [](const ThreadInfo& a, const ThreadInfo& b) { return a.thread < b.thread; });
  threadSlot_.clear();
  for (size_t i = 0; i < threads_.size(); ++i) {
    ThreadInfo& info = threads_[i];
    threadSlot_[info.thread] = i;
    std::sort(info.chunks.begin(), info.chunks.end(),
              [](const IndexEntry& a, const IndexEntry& b) { return a.sequence < b.sequence; });
    for (size_t n = 0; n < info.chunks.size(); ++n) {
      if (info.chunks[n].sequence != n) {
        return fail(
            error, info.chunks[n].offset,
            format("corrupt: thread %u's chunk %zu is missing or repeated (found sequence %u here)",
                   info.thread, n, info.chunks[n].sequence));
      }
    }
  }
  if (last_.ticks > header_.start.ticks && last_.ns > header_.start.ns) {
    nsPerTick_ = static_cast<double>(last_.ns - header_.start.ns) /
                 static_cast<double>(last_.ticks - header_.start.ticks);
  }
  // Without the footer's thread table, a thread's OS id is in its thread_start event.
  for (ThreadInfo& info : threads_) {
    if (info.osThreadId != 0) continue;
    ThreadCursor cursor(*this, info.thread);
    const Event* first = cursor.peek();
    if (first && first->kind == Kind::kThreadStart)
      info.osThreadId = static_cast<uint32_t>(first->value);
  }
  return true;
}

const ThreadInfo* Trace::thread(uint32_t index) const {
  auto slot = threadSlot_.find(index);
  return slot == threadSlot_.end() ? nullptr : &threads_[slot->second];
}

uint64_t Trace::nanoseconds(uint64_t tick) const {
  if (tick <= header_.start.ticks) return 0;
  double ns = static_cast<double>(tick - header_.start.ticks) * nsPerTick_;
  // Damaged calibration points can make this absurd; the conversion must stay defined.
  return ns >= 1.8e19 ? UINT64_MAX : static_cast<uint64_t>(ns);
}

// --------------------------------------------------------------------------- ThreadCursor

ThreadCursor::ThreadCursor(const Trace& trace, uint32_t thread)
    : trace_(trace), info_(trace.thread(thread)) {}

bool ThreadCursor::loadChunk(Error* error) {
  const IndexEntry& entry = info_->chunks[chunk_];
  ChunkHeader chunk = load<ChunkHeader>(trace_.data(), entry.offset);
  chunkOffset_ = entry.offset;
  cursor_ = trace_.data() + entry.offset + sizeof(ChunkHeader);
  end_ = cursor_ + chunk.payloadBytes;
  if (payloadChecksum(cursor_, chunk.payloadBytes) != chunk.checksum) {
    return fail(
        error, entry.offset,
        format("corrupt chunk: checksum mismatch (thread %u, chunk %zu)", info_->thread, chunk_));
  }
  if (trace_.deflated()) {
    inflated_.resize(kMaxChunkPayload);
    uLongf length = kMaxChunkPayload;
    int status = uncompress(inflated_.data(), &length, cursor_, chunk.payloadBytes);
    if (status != Z_OK) {
      return fail(error, entry.offset,
                  format("corrupt chunk: its compressed payload does not inflate (%s; thread %u, "
                         "chunk %zu)",
                         status == Z_BUF_ERROR ? "larger than the largest chunk" : zError(status),
                         info_->thread, chunk_));
    }
    if (chunk.events > length / 2) {
      return fail(error, entry.offset + offsetof(ChunkHeader, events),
                  format("corrupt chunk: %u events in %lu bytes", chunk.events, length));
    }
    cursor_ = inflated_.data();
    end_ = cursor_ + length;
  }
  payload_ = cursor_;
  left_ = chunk.events;
  tick_ = chunk.baseTick;
  previousAddress_ = 0;
  return true;
}

uint64_t ThreadCursor::offsetOf(const uint8_t* at) const {
  return chunkOffset_ + sizeof(ChunkHeader) + static_cast<uint64_t>(at - payload_);
}

bool ThreadCursor::decode(Event* event, Error* error) {
  const uint8_t* start = cursor_;
  auto corrupt = [&](const char* what) {
    return fail(error, offsetOf(cursor_),
                format("corrupt event (%s) in thread %u's chunk %zu, event at offset %" PRIu64 "%s",
                       what, info_->thread, chunk_, offsetOf(start),
                       trace_.deflated() ? " of the inflated payload" : ""));
  };
  if (cursor_ == end_) return corrupt("the chunk ends before its event count");
  uint8_t kindByte = *cursor_++;
  uint8_t code = kindByte & kKindMask;
  if (code == 0 || code > static_cast<uint8_t>(Kind::kLast))
    return corrupt(format("unknown kind %u", code).c_str());
  Kind kind = static_cast<Kind>(code);
  uint8_t flags = kindByte & static_cast<uint8_t>(~kKindMask);
  uint8_t allowed =
      kFlagCallsite | (isNewKind(kind) || isDeleteKind(kind) ? (kFlagNothrow | kFlagAligned) : 0);
  if (flags & ~allowed) return corrupt("flags this kind does not have");
  *event = Event{};
  event->kind = kind;
  event->flags = flags;
  event->thread = info_->thread;
  event->index = index_;
  uint64_t delta;
  if (!getVarint(&cursor_, end_, &delta)) return corrupt("bad timestamp");
  tick_ += static_cast<uint64_t>(unzigzag(delta));
  event->tick = tick_;
  const KindInfo& info = kKinds[code];
  for (int i = 0; i < 6 && info.fields[i] != Field::kNone; ++i) {
    Field field = info.fields[i];
    if (!fieldPresent(kind, flags, field)) continue;
    uint64_t value;
    if (field == Field::kAddress || field == Field::kOldAddress || field == Field::kResult) {
      if (!getAddress(&cursor_, end_, &previousAddress_, &value)) return corrupt("bad address");
    } else if (!getVarint(&cursor_, end_, &value)) {
      return corrupt("bad integer field");
    }
    switch (field) {
      case Field::kSize:
        event->size = value;
        break;
      case Field::kCount:
        event->count = value;
        break;
      case Field::kAlign:
        event->align = value;
        break;
      case Field::kAddress:
        event->address = value;
        break;
      case Field::kOldAddress:
        event->oldAddress = value;
        break;
      case Field::kResult:
        event->result = value;
        break;
      case Field::kValue:
        event->value = value;
        break;
      case Field::kDuration:
        event->duration = value;
        break;
      case Field::kNone:
        break;
    }
  }
  if (flags & kFlagCallsite) {
    uint64_t hash;
    if (!getVarint(&cursor_, end_, &hash) || hash > UINT32_MAX)
      return corrupt("bad call-site hash");
    event->callsite = static_cast<uint32_t>(hash);
  }
  ++index_;
  --left_;
  return true;
}

bool ThreadCursor::read(Event* event, Error* error) {
  if (!info_) return false;
  while (left_ == 0) {
    if (cursor_ != end_) {
      return fail(error, offsetOf(cursor_),
                  format("corrupt chunk: %zu bytes left after its last event",
                         static_cast<size_t>(end_ - cursor_)));
    }
    if (cursor_ != nullptr) ++chunk_;
    if (chunk_ >= info_->chunks.size()) return false;
    if (!loadChunk(error)) return false;
  }
  return decode(event, error);
}

void ThreadCursor::fill() {
  while (count_ < kLookahead && !ended_) {
    if (!read(&ring_[(head_ + count_) % kLookahead], &pendingError_)) {
      ended_ = true;
      return;
    }
    ++count_;
  }
}

bool ThreadCursor::next(Event* event, Error* error) {
  if (count_ == 0) fill();
  if (count_ == 0) {
    if (pendingError_.failed()) *error = pendingError_;
    return false;
  }
  *event = ring_[head_];
  head_ = (head_ + 1) % kLookahead;
  --count_;
  return true;
}

const Event* ThreadCursor::peekAhead(size_t ahead) {
  if (count_ <= ahead) fill();
  return ahead < count_ ? &ring_[(head_ + ahead) % kLookahead] : nullptr;
}

// --------------------------------------------------------------------------- MergedCursor

constexpr size_t kPrefetchDistance = 8;

bool MergedCursor::Head::operator>(const Head& other) const {
  if (tick != other.tick) return tick > other.tick;
  if (rank != other.rank) return rank > other.rank;
  return thread > other.thread;
}

MergedCursor::MergedCursor(const Trace& trace) {
  cursors_.reserve(trace.threads().size());
  for (const ThreadInfo& info : trace.threads()) cursors_.emplace_back(trace, info.thread);
  for (size_t i = 0; i < cursors_.size() && !startError_.failed(); ++i) push(i, &startError_);
}

// Puts cursor `index` back on the heap keyed by its next event; false at its end or error.
bool MergedCursor::push(size_t index, Error* error) {
  const Event* head = cursors_[index].peek();
  if (!head) {
    Event ignored;
    cursors_[index].next(&ignored, error);  // reports the error, if any
    return false;
  }
  heap_.push_back(Head{head->tick, releases(*head) ? 0u : 1u, head->thread, index});
  std::push_heap(heap_.begin(), heap_.end(), std::greater<Head>());
  return true;
}

bool MergedCursor::next(Event* event, Error* error) {
  if (startError_.failed()) {
    *error = startError_;
    return false;
  }
  if (heap_.empty()) return false;
  std::pop_heap(heap_.begin(), heap_.end(), std::greater<Head>());
  size_t index = heap_.back().cursor;
  heap_.pop_back();
  if (!cursors_[index].next(event, error)) return false;
  if (!push(index, error) && error->failed()) return false;
  // Events of this thread a few places on are decoded already: fetch their map slots now, so
  // that they are in the cache when their turn comes (with one thread, every step hits).
  if (const Event* later = cursors_[index].peekAhead(kPrefetchDistance)) {
    live_.prefetch(releases(*later) ? releasedAddress(*later) : later->result);
  }
  assignIds(event);
  return true;
}

void MergedCursor::assignIds(Event* event) {
  uint64_t released = releasedAddress(*event);
  uint64_t previousId = 0;
  if (released != 0) {
    LiveMap::Entry* found = live_.find(released);
    if (found == nullptr) {
      ++counts_.unmatchedReleases;
    } else {
      previousId = found->id;
      counts_.liveBytes -= found->bytes;
      --counts_.live;
      live_.erase(found);
    }
    if (isReallocKind(event->kind)) {
      event->oldId = previousId;
    } else {
      event->id = previousId;
    }
  }
  if (!allocates(*event)) return;
  // A realloc keeps its object's id wherever the block went.
  uint64_t id = isReallocKind(event->kind) && previousId != 0 ? previousId : counts_.nextId++;
  event->id = id;
  uint64_t bytes = requestedBytes(*event);
  bool inserted;
  LiveMap::Entry* slot = live_.insert(event->result, &inserted);
  if (!inserted) {
    ++counts_.reusedLive;
    counts_.liveBytes -= slot->bytes;
    --counts_.live;
  }
  slot->id = id;
  slot->bytes = bytes;
  ++counts_.live;
  counts_.liveBytes += bytes;
  counts_.peakLive = std::max(counts_.peakLive, counts_.live);
  counts_.peakLiveBytes = std::max(counts_.peakLiveBytes, counts_.liveBytes);
}

// -------------------------------------------------------------------------------- LiveMap

LiveMap::Entry* LiveMap::find(uint64_t address) {
  if (table_.empty()) return nullptr;
  size_t mask = table_.size() - 1;
  for (size_t i = home(address);; i = (i + 1) & mask) {
    if (table_[i].address == address) return &table_[i];
    if (table_[i].address == 0) return nullptr;
  }
}

LiveMap::Entry* LiveMap::insert(uint64_t address, bool* inserted) {
  if ((count_ + 1) * 2 > table_.size()) grow();
  size_t mask = table_.size() - 1;
  for (size_t i = home(address);; i = (i + 1) & mask) {
    if (table_[i].address == address) {
      *inserted = false;
      return &table_[i];
    }
    if (table_[i].address == 0) {
      table_[i] = Entry{address, 0, 0};
      ++count_;
      *inserted = true;
      return &table_[i];
    }
  }
}

void LiveMap::erase(Entry* entry) {
  size_t mask = table_.size() - 1;
  size_t hole = static_cast<size_t>(entry - table_.data());
  // Move back every later entry of the run whose home slot is not between the hole and it.
  for (size_t next = (hole + 1) & mask; table_[next].address != 0; next = (next + 1) & mask) {
    size_t want = home(table_[next].address);
    bool staysPut = hole <= next ? (hole < want && want <= next) : (hole < want || want <= next);
    if (!staysPut) {
      table_[hole] = table_[next];
      hole = next;
    }
  }
  table_[hole].address = 0;
  --count_;
}

void LiveMap::grow() {
  std::vector<Entry> old = std::move(table_);
  size_t capacity = old.empty() ? 1024 : old.size() * 2;
  table_.assign(capacity, Entry{0, 0, 0});
  shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(capacity));
  count_ = 0;
  for (const Entry& entry : old) {
    if (entry.address == 0) continue;
    bool inserted;
    *insert(entry.address, &inserted) = entry;
  }
}

// ----------------------------------------------------------------------------- formatting

std::string formatEvent(const Trace& trace, const Event& event) {
  uint64_t ns = trace.nanoseconds(event.tick);
  std::string line =
      format("%" PRIu64 ".%09" PRIu64 " t%u #%" PRIu64 " %s", ns / 1000000000u, ns % 1000000000u,
             event.thread, event.index, kKinds[static_cast<uint8_t>(event.kind)].name);
  const KindInfo& info = kKinds[static_cast<uint8_t>(event.kind)];
  std::string arguments;
  std::string result;
  for (int i = 0; i < 6 && info.fields[i] != Field::kNone; ++i) {
    Field field = info.fields[i];
    if (!fieldPresent(event.kind, event.flags, field)) continue;
    auto argument = [&](const std::string& text) {
      arguments += (arguments.empty() ? "" : ", ") + text;
    };
    switch (field) {
      case Field::kSize:
        argument(format("%" PRIu64, event.size));
        break;
      case Field::kCount:
        argument(format("%" PRIu64, event.count));
        break;
      case Field::kAlign:
        argument(format("align %" PRIu64, event.align));
        break;
      case Field::kAddress:
        argument(format("0x%" PRIx64, event.address));
        break;
      case Field::kOldAddress:
        argument(format("0x%" PRIx64, event.oldAddress));
        break;
      case Field::kResult:
        result += format(" = 0x%" PRIx64, event.result);
        break;
      case Field::kValue:
        if (event.kind == Kind::kPosixMemalign)
          result += format(" rc %" PRIu64, event.value);
        else if (event.kind == Kind::kUsableSize)
          result += format(" = %" PRIu64, event.value);
        else if (event.kind == Kind::kThreadStart)
          argument(format("tid %" PRIu64, event.value));
        else
          argument(format("child %" PRIu64, event.value));
        break;
      case Field::kDuration:
        result += format(" in %" PRIu64 " ns", trace.nanoseconds(event.tick + event.duration) -
                                                   trace.nanoseconds(event.tick));
        break;
      case Field::kNone:
        break;
    }
  }
  line += "(" + arguments + ")" + result;
  if (event.flags & kFlagNothrow && isNewKind(event.kind)) line += " nothrow";
  if (event.id != 0 || event.oldId != 0) {
    line += format(" id %" PRIu64, event.id != 0 ? event.id : event.oldId);
  }
  if (event.flags & kFlagCallsite) line += format(" site %08x", event.callsite);
  return line;
}

}  // namespace meshtrace
