// The meshalloc trace format (docs/trace.md): record layouts, event kinds and the integer codes.
// Shared by the recorder (which must not allocate, so this header uses no STL container and
// never allocates) and the decoder: every constant of the format is declared here only.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace meshtrace {

// Environment variables the recorder reads (set by `meshalloc trace record`).
inline constexpr const char* kEnvFile = "MESHALLOC_TRACE_FILE";
inline constexpr const char* kEnvCallsites = "MESHALLOC_TRACE_CALLSITES";

inline constexpr char kFileMagic[8] = {'M', 'E', 'S', 'H', 'T', 'R', 'C', '\0'};
inline constexpr char kTrailerMagic[8] = {'M', 'T', 'R', 'C', 'E', 'N', 'D', '\0'};
inline constexpr uint32_t kChunkMagic = 0x4b4e4843;  // "CHNK" read as little-endian
inline constexpr uint16_t kFormatVersion = 1;

// FileHeader.flags: every chunk's payload is stored as a zlib stream (`meshalloc trace
// compress`, after the recording: the recorder itself never compresses, so that its cost on the
// program stays an append). The chunk's payloadBytes and checksum are those of the stored
// bytes; the payload inflates to at most kMaxChunkPayload.
inline constexpr uint32_t kFileDeflated = 1;

// A chunk's payload never exceeds this (the recorder's per-thread buffer); a reader rejects
// larger lengths as corrupt instead of trusting them.
inline constexpr uint32_t kMaxChunkPayload = 64 * 1024;
// The longest encoded event: kind byte + 7 varints of at most 10 bytes + a call-site hash.
inline constexpr size_t kMaxEventBytes = 1 + 7 * 10 + 5;

// One (ticks, CLOCK_MONOTONIC ns) pair read together; two of them give the tick rate.
struct Calibration {
  uint64_t ticks;
  uint64_t ns;
};

struct FileHeader {
  char magic[8];
  uint16_t version;
  uint16_t headerSize;  // sizeof(FileHeader); a reader skips what it does not know
  uint32_t flags;       // kFile* bits
  uint32_t pid;
  uint32_t parentPid;  // the forking process when this file is a forked child's, else 0
  uint32_t tickShift;  // ticks = counter >> tickShift
  uint32_t reserved;
  Calibration start;
  uint8_t padding[16];
};
static_assert(sizeof(FileHeader) == 64);

struct ChunkHeader {
  uint32_t magic;  // kChunkMagic
  uint32_t payloadBytes;
  uint32_t thread;    // process-local thread index
  uint32_t sequence;  // 0, 1, 2... per thread
  uint32_t events;
  uint32_t checksum;    // payloadChecksum() of the payload
  uint64_t baseTick;    // the first event's timestamp delta is from this
  Calibration written;  // read when the chunk was written
};
static_assert(sizeof(ChunkHeader) == 48);

struct IndexEntry {
  uint64_t offset;  // of the ChunkHeader
  uint32_t thread;
  uint32_t sequence;
  uint32_t events;
  uint32_t reserved;
  uint64_t firstTick;
  uint64_t lastTick;
};
static_assert(sizeof(IndexEntry) == 40);

struct ThreadEntry {
  uint32_t thread;
  uint32_t osThreadId;
  uint64_t events;
};
static_assert(sizeof(ThreadEntry) == 16);

struct Trailer {
  char magic[8];         // kTrailerMagic
  uint64_t indexOffset;  // the first IndexEntry; the ThreadEntry table follows the index
  uint32_t indexEntries;
  uint32_t threadEntries;
  uint64_t events;
  uint64_t dropped;  // events a signal handler could not record (docs/trace.md, Signals)
  Calibration end;
};
static_assert(sizeof(Trailer) == 56);

// Event kinds: the low 5 bits of an event's first byte.
enum class Kind : uint8_t {
  kMalloc = 1,
  kCalloc,
  kRealloc,
  kFree,
  kReallocArray,
  kMemalign,
  kPosixMemalign,
  kAlignedAlloc,
  kValloc,
  kPvalloc,
  kUsableSize,
  kNew,
  kNewArray,
  kDelete,
  kDeleteArray,
  kThreadStart,
  kThreadExit,
  kFork,
  kLast = kFork,
};
inline constexpr uint8_t kKindMask = 0x1f;
inline constexpr uint8_t kFlagNothrow = 0x20;   // new: the nothrow_t form
inline constexpr uint8_t kFlagSized = 0x20;     // delete: the sized form (a size follows)
inline constexpr uint8_t kFlagAligned = 0x40;   // new/delete: the align_val_t form
inline constexpr uint8_t kFlagCallsite = 0x80;  // a call-site hash follows the fields

// The fields after the timestamp, in order, for each kind (docs/trace.md, Events).
enum class Field : uint8_t {
  kNone,
  kSize,
  kCount,
  kAlign,
  kAddress,
  kOldAddress,
  kResult,
  kValue,
  kDuration
};
struct KindInfo {
  const char* name;
  Field fields[6];
};

inline constexpr KindInfo kKinds[] = {
    {"?", {}},
    {"malloc", {Field::kSize, Field::kResult}},
    {"calloc", {Field::kCount, Field::kSize, Field::kResult}},
    {"realloc", {Field::kOldAddress, Field::kSize, Field::kResult, Field::kDuration}},
    {"free", {Field::kAddress}},
    {"reallocarray",
     {Field::kOldAddress, Field::kCount, Field::kSize, Field::kResult, Field::kDuration}},
    {"memalign", {Field::kAlign, Field::kSize, Field::kResult}},
    {"posix_memalign", {Field::kAlign, Field::kSize, Field::kResult, Field::kValue}},
    {"aligned_alloc", {Field::kAlign, Field::kSize, Field::kResult}},
    {"valloc", {Field::kSize, Field::kResult}},
    {"pvalloc", {Field::kSize, Field::kResult}},
    {"malloc_usable_size", {Field::kAddress, Field::kValue}},
    // new/delete: the size of a sized delete and the alignment of the aligned forms are only
    // present with their flag (kFlagSized, kFlagAligned); fieldPresent() says which.
    {"new", {Field::kSize, Field::kAlign, Field::kResult}},
    {"new[]", {Field::kSize, Field::kAlign, Field::kResult}},
    {"delete", {Field::kAddress, Field::kSize, Field::kAlign}},
    {"delete[]", {Field::kAddress, Field::kSize, Field::kAlign}},
    {"thread_start", {Field::kValue}},
    {"thread_exit", {}},
    {"fork", {Field::kValue}},
};
static_assert(sizeof(kKinds) / sizeof(kKinds[0]) == static_cast<size_t>(Kind::kLast) + 1);

inline bool isNewKind(Kind kind) {
  return kind == Kind::kNew || kind == Kind::kNewArray;
}
inline bool isDeleteKind(Kind kind) {
  return kind == Kind::kDelete || kind == Kind::kDeleteArray;
}

// Whether a field of the kind's list is in this event (the optional new/delete fields).
inline bool fieldPresent(Kind kind, uint8_t flags, Field field) {
  if (isNewKind(kind) && field == Field::kAlign) return (flags & kFlagAligned) != 0;
  if (isDeleteKind(kind) && field == Field::kSize) return (flags & kFlagSized) != 0;
  if (isDeleteKind(kind) && field == Field::kAlign) return (flags & kFlagAligned) != 0;
  return true;
}

inline uint64_t zigzag(int64_t value) {
  return (static_cast<uint64_t>(value) << 1) ^ static_cast<uint64_t>(value >> 63);
}
inline int64_t unzigzag(uint64_t code) {
  return static_cast<int64_t>(code >> 1) ^ -static_cast<int64_t>(code & 1);
}

// LEB128. `out` must have room for 10 bytes.
inline uint8_t* putVarint(uint8_t* out, uint64_t value) {
  while (value >= 0x80) {
    *out++ = static_cast<uint8_t>(value | 0x80);
    value >>= 7;
  }
  *out++ = static_cast<uint8_t>(value);
  return out;
}

// Reads a varint from [*cursor, end); false (cursor unspecified) if it runs past `end` or is
// longer than 10 bytes / 64 bits.
inline bool getVarint(const uint8_t** cursor, const uint8_t* end, uint64_t* value) {
  uint64_t result = 0;
  const uint8_t* p = *cursor;
  for (unsigned shift = 0; shift < 64; shift += 7) {
    if (p == end) return false;
    uint8_t byte = *p++;
    if (shift == 63 && byte > 1) return false;
    result |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) {
      *cursor = p;
      *value = result;
      return true;
    }
  }
  return false;
}

// A chunk payload's checksum: catches a damaged payload that would still decode into wrong
// events. Eight bytes a step (a multiply and a shift), so a 64 KiB chunk costs microseconds.
inline uint32_t payloadChecksum(const uint8_t* data, size_t size) {
  uint64_t hash = 0x243f6a8885a308d3ull ^ size;
  size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    uint64_t word;
    memcpy(&word, data + i, 8);
    hash = (hash ^ word) * 0x9e3779b97f4a7c15ull;
    hash ^= hash >> 29;
  }
  for (; i < size; ++i) hash = (hash ^ data[i]) * 0x100000001b3ull;
  hash ^= hash >> 32;
  return static_cast<uint32_t>(hash);
}

// Address codes (docs/trace.md, Addresses): 0 is NULL; multiples of 16 away from the previous
// address cost four bits less than other distances; code 2 (no distance maps to it) escapes to
// the absolute address, for distances whose code would not fit in 64 bits.
inline constexpr uint64_t kAddressEscape = 2;

inline uint8_t* putAddress(uint8_t* out, uint64_t address, uint64_t* previous) {
  if (address == 0) return putVarint(out, 0);
  int64_t delta = static_cast<int64_t>(address - *previous);
  *previous = address;
  if ((delta & 15) == 0) return putVarint(out, 1 + (zigzag(delta / 16) << 1));
  uint64_t code = zigzag(delta);
  if (code >= (uint64_t{1} << 62)) return putVarint(putVarint(out, kAddressEscape), address);
  return putVarint(out, 2 + (code << 1));
}

inline bool getAddress(const uint8_t** cursor, const uint8_t* end, uint64_t* previous,
                       uint64_t* address) {
  uint64_t code;
  if (!getVarint(cursor, end, &code)) return false;
  if (code == 0) {
    *address = 0;
    return true;
  }
  if (code == kAddressEscape) {
    if (!getVarint(cursor, end, address) || *address == 0) return false;
    *previous = *address;
    return true;
  }
  uint64_t value = code - 1;
  uint64_t distance = (value & 1) == 0 ? static_cast<uint64_t>(unzigzag(value >> 1)) * 16
                                       : static_cast<uint64_t>(unzigzag(value >> 1));
  *previous += distance;
  *address = *previous;
  return true;
}

}  // namespace meshtrace
