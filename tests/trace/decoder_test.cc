// The trace decoder on damaged input (docs/trace.md): copies of a recorded trace
// (tests/trace/corpus/, written by the recorder from roundtrip_program.cc) truncated, bit-flipped
// and mutated must be rejected with an error naming an offset inside the file, never crash.
// Decoder only: built in every preset, so the sanitizer builds check it too.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "decode_all.h"
#include "decoder.h"

namespace meshtrace {
namespace {

std::vector<uint8_t> corpusFile(const std::string& name) {
  std::ifstream in(std::string(MESHALLOC_TRACE_CORPUS) + "/" + name, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Whether the bytes decode; a rejection must say something and name an offset inside them.
bool decodeAll(const std::vector<uint8_t>& bytes) {
  Error error;
  bool ok = test::decodeAll(bytes.data(), bytes.size(), &error);
  if (!ok) {
    EXPECT_FALSE(error.message.empty());
    EXPECT_LE(error.offset, bytes.size()) << error.message;
  }
  return ok;
}

// Inputs the fuzzer found (tests/trace/corpus/crash-*): handled cleanly, whatever the verdict.
TEST(TraceCorpus, FuzzerFindingsAreHandled) {
  for (const auto& entry : std::filesystem::directory_iterator(MESHALLOC_TRACE_CORPUS)) {
    if (entry.path().filename().string().rfind("crash-", 0) != 0) continue;
    decodeAll(corpusFile(entry.path().filename().string()));
  }
}

// The fuzzer's first finding: damaged calibration made tick -> ns overflow a double -> integer
// conversion (undefined). Times now saturate.
TEST(TraceCorpus, TimesSaturate) {
  std::vector<uint8_t> bytes = corpusFile("roundtrip.trace");
  Trace trace;
  Error error;
  ASSERT_TRUE(trace.openBytes(bytes.data(), bytes.size(), &error)) << error.message;
  EXPECT_EQ(trace.nanoseconds(UINT64_MAX), UINT64_MAX);
  EXPECT_EQ(trace.nanoseconds(0), 0u);
}

// Cut where the footer starts, the trace reads as incomplete, with the same events and threads.
TEST(TraceCorpus, WithoutItsFooterATraceReadsTheSame) {
  std::vector<uint8_t> whole = corpusFile("roundtrip.trace");
  Trace complete;
  Error error;
  ASSERT_TRUE(complete.openBytes(whole.data(), whole.size(), &error)) << error.message;
  Trailer trailer;
  memcpy(&trailer, whole.data() + whole.size() - sizeof(trailer), sizeof(trailer));
  std::vector<uint8_t> cut(whole.begin(),
                           whole.begin() + static_cast<ptrdiff_t>(trailer.indexOffset));
  Trace incomplete;
  ASSERT_TRUE(incomplete.openBytes(cut.data(), cut.size(), &error)) << error.message;
  EXPECT_TRUE(complete.complete());
  EXPECT_FALSE(incomplete.complete());
  EXPECT_EQ(incomplete.events(), complete.events());
  ASSERT_EQ(incomplete.threads().size(), complete.threads().size());
  for (size_t i = 0; i < complete.threads().size(); ++i) {
    EXPECT_EQ(incomplete.threads()[i].thread, complete.threads()[i].thread);
    EXPECT_NE(complete.threads()[i].osThreadId, 0u);
    EXPECT_EQ(incomplete.threads()[i].osThreadId,
              complete.threads()[i].osThreadId);  // from thread_start
    EXPECT_EQ(incomplete.threads()[i].events, complete.threads()[i].events);
  }
}

TEST(TraceCorpus, EveryFileDecodes) {
  for (const char* name : {"roundtrip.trace", "roundtrip-child.trace"}) {
    std::vector<uint8_t> bytes = corpusFile(name);
    ASSERT_FALSE(bytes.empty()) << name;
    Error error;
    EXPECT_TRUE(test::decodeAll(bytes.data(), bytes.size(), &error))
        << name << ": " << error.message;
  }
}

TEST(TraceMalformed, ForeignAndEmptyFilesAreRejectedAtOffsetZero) {
  const std::vector<uint8_t> foreign = {0x7f, 'E', 'L', 'F', 2, 1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0};
  Trace trace;
  Error error;
  EXPECT_FALSE(trace.openBytes(foreign.data(), foreign.size(), &error));
  EXPECT_EQ(error.offset, 0u);
  EXPECT_NE(error.message.find("not a meshalloc trace"), std::string::npos) << error.message;
  Trace missing;
  EXPECT_FALSE(missing.open(std::string(MESHALLOC_TRACE_CORPUS) + "/no-such-file", &error));
  EXPECT_NE(error.message.find("cannot open"), std::string::npos) << error.message;
}

TEST(TraceMalformed, EveryTruncationIsRejectedOrReadAsIncomplete) {
  const std::vector<uint8_t> whole = corpusFile("roundtrip.trace");
  ASSERT_GT(whole.size(), 1000u);
  size_t accepted = 0;
  for (size_t size = 0; size < whole.size(); ++size) {
    std::vector<uint8_t> cut(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(size));
    Trace trace;
    Error error;
    if (trace.openBytes(cut.data(), cut.size(), &error)) {
      // Only a cut at a chunk boundary reads, as a trace without footer.
      EXPECT_FALSE(trace.complete()) << "cut at " << size;
      ++accepted;
    } else {
      EXPECT_LE(error.offset, size);
    }
  }
  // The cuts that land on a chunk boundary: one per chunk, plus the header alone.
  EXPECT_LT(accepted, whole.size() / 100);
}

TEST(TraceMalformed, MutationsAreRejectedCleanly) {
  const std::vector<uint8_t> whole = corpusFile("roundtrip.trace");
  std::mt19937_64 random(26);
  int rejected = 0;
  constexpr int kRuns = 3000;
  for (int run = 0; run < kRuns; ++run) {
    std::vector<uint8_t> bytes = whole;
    int mutations = 1 + static_cast<int>(random() % 3);
    for (int m = 0; m < mutations; ++m) {
      size_t at = random() % bytes.size();
      switch (random() % 4) {
        case 0:
          bytes[at] ^= static_cast<uint8_t>(1u << (random() % 8));
          break;
        case 1:
          bytes[at] = static_cast<uint8_t>(random());
          break;
        case 2: {  // an integer field set to an extreme
          uint32_t extreme = (random() % 2) ? 0xffffffffu : 0x80000000u;
          if (at + 4 <= bytes.size()) memcpy(&bytes[at], &extreme, 4);
          break;
        }
        default: {  // a range copied over another
          size_t from = random() % bytes.size();
          size_t length =
              std::min<size_t>(random() % 64, std::min(bytes.size() - at, bytes.size() - from));
          memmove(&bytes[at], &bytes[from], length);
          break;
        }
      }
    }
    if (!decodeAll(bytes)) ++rejected;
  }
  // What may still be accepted: damage to fields the reader does not need (calibration, padding,
  // the ticks of index entries, thread ids) or a copy of bytes over identical bytes.
  EXPECT_GT(rejected, kRuns * 3 / 4);
  EXPECT_TRUE(decodeAll(whole));
}

// A flipped bit anywhere in an event payload must be caught (by the chunk checksum when the
// damaged bytes would still decode).
TEST(TraceMalformed, EveryPayloadBitFlipIsRejected) {
  const std::vector<uint8_t> whole = corpusFile("roundtrip.trace");
  Trace trace;
  Error error;
  ASSERT_TRUE(trace.openBytes(whole.data(), whole.size(), &error)) << error.message;
  size_t flips = 0;
  for (const ThreadInfo& info : trace.threads()) {
    for (const IndexEntry& chunk : info.chunks) {
      ChunkHeader header;
      memcpy(&header, whole.data() + chunk.offset, sizeof(header));
      for (uint32_t at = 0; at < header.payloadBytes; at += 7) {
        std::vector<uint8_t> bytes = whole;
        bytes[chunk.offset + sizeof(ChunkHeader) + at] ^= static_cast<uint8_t>(1u << (at % 8));
        EXPECT_FALSE(decodeAll(bytes))
            << "flip at payload byte " << at << " of the chunk at " << chunk.offset;
        ++flips;
      }
    }
  }
  EXPECT_GT(flips, 100u);
}

// The merged cursor's live-address map against std::map, through growth and many deletions
// in runs of colliding addresses (backward-shift deletion is easy to get wrong).
TEST(TraceLiveMap, AgreesWithAReferenceMap) {
  LiveMap live;
  std::map<uint64_t, uint64_t> reference;
  std::mt19937_64 random(7);
  for (int step = 0; step < 200000; ++step) {
    uint64_t address = 16 * (1 + random() % 5000);  // few distinct keys: long runs, many hits
    if (random() % 3 == 0) {
      LiveMap::Entry* entry = live.find(address);
      ASSERT_EQ(entry != nullptr, reference.count(address) == 1) << address;
      if (entry) {
        EXPECT_EQ(entry->id, reference[address]);
        live.erase(entry);
        reference.erase(address);
      }
    } else {
      bool inserted;
      LiveMap::Entry* entry = live.insert(address, &inserted);
      ASSERT_EQ(inserted, reference.count(address) == 0) << address;
      entry->id = static_cast<uint64_t>(step);
      reference[address] = static_cast<uint64_t>(step);
    }
    ASSERT_EQ(live.size(), reference.size());
  }
  for (const auto& [address, id] : reference) {
    LiveMap::Entry* entry = live.find(address);
    ASSERT_NE(entry, nullptr);
    EXPECT_EQ(entry->id, id);
  }
}

TEST(TraceFormat, AddressCodesRoundTrip) {
  const uint64_t addresses[] = {0x1000,
                                0x1010,
                                0x1008,
                                0,
                                0x7fffffffe000,
                                0x10,
                                0xffffffffffffffffull,
                                1,
                                0x8000000000000000ull,
                                0x7fffffffffffffffull,
                                0x55d2e9b402a0};
  uint8_t buffer[sizeof(addresses) / sizeof(addresses[0]) * 20];
  uint8_t* out = buffer;
  uint64_t previous = 0;
  for (uint64_t address : addresses) out = putAddress(out, address, &previous);
  const uint8_t* in = buffer;
  previous = 0;
  for (uint64_t address : addresses) {
    uint64_t decoded;
    ASSERT_TRUE(getAddress(&in, out, &previous, &decoded));
    EXPECT_EQ(decoded, address);
  }
  EXPECT_EQ(in, out);
  // The common case is short: the next 16-byte-aligned block nearby takes one byte.
  previous = 0x1000;
  EXPECT_EQ(putAddress(buffer, 0x1030, &previous) - buffer, 1);
}

}  // namespace
}  // namespace meshtrace
