// meshalloc-trace: the native half of `meshalloc trace dump`, `stats` and `compress`
// (docs/trace.md). A trace of many GB is decoded here, in one pass over a mapped file; the
// Python command only finds this program and passes its output on.
//
//   meshalloc-trace dump [--head N] [--thread T] TRACE
//   meshalloc-trace stats [--json] TRACE
//   meshalloc-trace compress TRACE OUT     (OUT: the same trace, every payload deflated)
//
// Errors: one line on stderr ("meshalloc-trace: TRACE: offset N: what"), exit status 1; a bad
// invocation exits with 2.
#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <zlib.h>

#include "decoder.h"

namespace {

using namespace meshtrace;

constexpr int kExitCorrupt = 1;
constexpr int kExitUsage = 2;

int usage(const char* message) {
  fprintf(stderr,
          "meshalloc-trace: %s (usage: meshalloc-trace dump [--head N] [--thread T] TRACE | stats "
          "[--json] TRACE | compress TRACE OUT)\n",
          message);
  return kExitUsage;
}

int corrupt(const std::string& path, const Error& error) {
  fprintf(stderr, "meshalloc-trace: %s: offset %" PRIu64 ": %s\n", path.c_str(), error.offset,
          error.message.c_str());
  return kExitCorrupt;
}

bool parseCount(const char* text, uint64_t* value) {
  if (!text || !*text) return false;
  char* end;
  errno = 0;
  unsigned long long parsed = strtoull(text, &end, 10);
  if (*end != '\0' || errno != 0 || text[0] == '-') return false;
  *value = parsed;
  return true;
}

int dump(const std::string& path, uint64_t head, bool oneThread, uint32_t thread) {
  Trace trace;
  Error error;
  if (!trace.open(path, &error)) return corrupt(path, error);
  if (oneThread && !trace.thread(thread)) {
    fprintf(stderr, "meshalloc-trace: %s: no thread %u in this trace (it has %zu)\n", path.c_str(),
            thread, trace.threads().size());
    return kExitUsage;
  }
  Event event;
  uint64_t printed = 0;
  auto print = [&](const Event& e) {
    std::string line = formatEvent(trace, e);
    line += '\n';
    fwrite(line.data(), 1, line.size(), stdout);
    ++printed;
  };
  if (oneThread) {
    ThreadCursor cursor(trace, thread);
    while (printed < head && cursor.next(&event, &error)) print(event);
  } else {
    MergedCursor cursor(trace);
    while (printed < head && cursor.next(&event, &error)) print(event);
  }
  fflush(stdout);
  if (error.failed()) return corrupt(path, error);
  return 0;
}

std::string withThousands(uint64_t value) {
  std::string digits = std::to_string(value);
  std::string grouped;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i != 0 && (digits.size() - i) % 3 == 0) grouped += ',';
    grouped += digits[i];
  }
  return grouped;
}

int stats(const std::string& path, bool json) {
  Trace trace;
  Error error;
  if (!trace.open(path, &error)) return corrupt(path, error);
  uint64_t byKind[static_cast<size_t>(Kind::kLast) + 1] = {};
  uint64_t firstTick = UINT64_MAX, lastTick = 0, failedAllocations = 0, allocatedBytes = 0;
  MergedCursor cursor(trace);
  Event event;
  while (cursor.next(&event, &error)) {
    ++byKind[static_cast<size_t>(event.kind)];
    if (event.tick < firstTick) firstTick = event.tick;
    if (event.tick > lastTick) lastTick = event.tick;
    if (allocates(event)) {
      allocatedBytes += requestedBytes(event);
    } else if (event.kind != Kind::kFree && !isDeleteKind(event.kind) &&
               event.kind != Kind::kUsableSize && event.kind != Kind::kThreadStart &&
               event.kind != Kind::kThreadExit && event.kind != Kind::kFork &&
               !(event.kind == Kind::kRealloc && event.size == 0)) {
      ++failedAllocations;
    }
  }
  if (error.failed()) return corrupt(path, error);
  const MergedCursor::Counts& counts = cursor.counts();
  double seconds =
      trace.events() == 0
          ? 0.0
          : static_cast<double>(trace.nanoseconds(lastTick) - trace.nanoseconds(firstTick)) / 1e9;
  double bytesPerEvent = trace.events() == 0 ? 0.0
                                             : static_cast<double>(trace.fileSize()) /
                                                   static_cast<double>(trace.events());
  const FileHeader& header = trace.header();
  if (json) {
    printf("{\"file\": \"%s\", \"bytes\": %" PRIu64
           ", \"complete\": %s, \"compressed\": %s, \"pid\": %u, \"parent_pid\": %u, "
           "\"seconds\": %.6f, \"threads\": %zu, \"events\": %" PRIu64
           ", \"bytes_per_event\": %.3f, \"dropped\": %" PRIu64 ", \"objects\": %" PRIu64
           ", \"allocated_bytes\": %" PRIu64 ", \"failed_allocations\": %" PRIu64
           ", \"peak_live_objects\": %" PRIu64 ", \"peak_live_bytes\": %" PRIu64
           ", \"live_objects_at_end\": %" PRIu64 ", \"live_bytes_at_end\": %" PRIu64
           ", \"unmatched_releases\": %" PRIu64 ", \"reused_live_addresses\": %" PRIu64
           ", \"by_kind\": {",
           path.c_str(), trace.fileSize(), trace.complete() ? "true" : "false",
           trace.deflated() ? "true" : "false", header.pid, header.parentPid, seconds,
           trace.threads().size(), trace.events(), bytesPerEvent, trace.dropped(),
           counts.nextId - 1, allocatedBytes, failedAllocations, counts.peakLive,
           counts.peakLiveBytes, counts.live, counts.liveBytes, counts.unmatchedReleases,
           counts.reusedLive);
    const char* separator = "";
    for (size_t kind = 1; kind <= static_cast<size_t>(Kind::kLast); ++kind) {
      printf("%s\"%s\": %" PRIu64, separator, kKinds[kind].name, byKind[kind]);
      separator = ", ";
    }
    printf("}}\n");
    return 0;
  }
  printf("trace        %s: %s bytes%s, %s\n", path.c_str(), withThousands(trace.fileSize()).c_str(),
         trace.deflated() ? " (compressed)" : "",
         trace.complete()
             ? "complete (footer present)"
             : "no footer: the process ended without exit(), index rebuilt from the chunks");
  if (header.parentPid != 0) {
    printf("process      pid %u, forked from pid %u\n", header.pid, header.parentPid);
  } else {
    printf("process      pid %u\n", header.pid);
  }
  printf("duration     %.3f s (first to last event)\n", seconds);
  printf("threads      %zu\n", trace.threads().size());
  printf("events       %s, %.2f bytes/event (whole file)\n", withThousands(trace.events()).c_str(),
         bytesPerEvent);
  if (trace.dropped() != 0)
    printf("dropped      %s events (signal handlers nested too deep)\n",
           withThousands(trace.dropped()).c_str());
  printf("by kind     ");
  for (size_t kind = 1; kind <= static_cast<size_t>(Kind::kLast); ++kind) {
    if (byKind[kind] != 0) printf(" %s %s", kKinds[kind].name, withThousands(byKind[kind]).c_str());
  }
  printf("\n");
  printf("objects      %s allocated (%s bytes requested), %s failed requests\n",
         withThousands(counts.nextId - 1).c_str(), withThousands(allocatedBytes).c_str(),
         withThousands(failedAllocations).c_str());
  printf("live         peak %s objects / %s bytes; at the end %s objects / %s bytes\n",
         withThousands(counts.peakLive).c_str(), withThousands(counts.peakLiveBytes).c_str(),
         withThousands(counts.live).c_str(), withThousands(counts.liveBytes).c_str());
  printf(
      "unmatched    %s releases of addresses not allocated in the trace, %s allocations at a live "
      "address\n",
      withThousands(counts.unmatchedReleases).c_str(), withThousands(counts.reusedLive).c_str());
  return 0;
}

// Writes `in` again with every chunk payload deflated (kFileDeflated), chunks in their order in
// `in`, and a footer indexing the new offsets. Every event is decoded first, so a trace that
// is corrupt anywhere is refused rather than compressed.
int compress(const std::string& in, const std::string& out) {
  Trace trace;
  Error error;
  if (!trace.open(in, &error)) return corrupt(in, error);
  if (trace.deflated()) {
    fprintf(stderr, "meshalloc-trace: %s: already compressed\n", in.c_str());
    return kExitCorrupt;
  }
  if (!trace.complete()) {
    fprintf(stderr,
            "meshalloc-trace: %s: no footer (the process ended without exit()); `dump` and "
            "`replay` read it as it is, `compress` needs a complete trace\n",
            in.c_str());
    return kExitCorrupt;
  }
  MergedCursor check(trace);
  Event event;
  while (check.next(&event, &error)) {
  }
  if (error.failed()) return corrupt(in, error);

  std::vector<IndexEntry> chunks;
  for (const ThreadInfo& info : trace.threads())
    chunks.insert(chunks.end(), info.chunks.begin(), info.chunks.end());
  std::sort(chunks.begin(), chunks.end(),
            [](const IndexEntry& a, const IndexEntry& b) { return a.offset < b.offset; });
  FILE* file = fopen(out.c_str(), "wbx");
  if (!file) {
    fprintf(stderr, "meshalloc-trace: %s: cannot create: %s\n", out.c_str(), strerror(errno));
    return kExitCorrupt;
  }
  bool written = true;
  auto put = [&](const void* data, size_t bytes) {
    written = written && fwrite(data, 1, bytes, file) == bytes;
  };
  FileHeader header = trace.header();
  header.flags |= kFileDeflated;
  put(&header, sizeof header);
  put(trace.data() + sizeof header, trace.header().headerSize - sizeof header);
  uint64_t offset = trace.header().headerSize;
  std::vector<uint8_t> deflated(compressBound(kMaxChunkPayload));
  for (IndexEntry& entry : chunks) {
    ChunkHeader chunk;
    memcpy(&chunk, trace.data() + entry.offset, sizeof chunk);
    uLongf length = deflated.size();
    if (compress2(deflated.data(), &length, trace.data() + entry.offset + sizeof chunk,
                  chunk.payloadBytes, Z_DEFAULT_COMPRESSION) != Z_OK) {
      fclose(file);
      remove(out.c_str());
      fprintf(stderr, "meshalloc-trace: %s: zlib could not compress a chunk\n", in.c_str());
      return kExitCorrupt;
    }
    chunk.payloadBytes = static_cast<uint32_t>(length);
    chunk.checksum = payloadChecksum(deflated.data(), length);
    entry.offset = offset;
    put(&chunk, sizeof chunk);
    put(deflated.data(), length);
    offset += sizeof chunk + length;
  }
  Trailer trailer;
  memcpy(&trailer, trace.data() + trace.fileSize() - sizeof trailer, sizeof trailer);
  trailer.indexOffset = offset;
  trailer.indexEntries = static_cast<uint32_t>(chunks.size());
  trailer.threadEntries = static_cast<uint32_t>(trace.threads().size());
  for (const IndexEntry& entry : chunks) put(&entry, sizeof entry);
  for (const ThreadInfo& info : trace.threads()) {
    ThreadEntry thread = {info.thread, info.osThreadId, info.events};
    put(&thread, sizeof thread);
  }
  put(&trailer, sizeof trailer);
  if (fclose(file) != 0 || !written) {
    remove(out.c_str());
    fprintf(stderr, "meshalloc-trace: %s: write failed\n", out.c_str());
    return kExitCorrupt;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage("missing command");
  std::string command = argv[1];
  if (command == "compress") {
    if (argc != 4 || argv[2][0] == '-' || argv[3][0] == '-')
      return usage("compress takes a trace and an output file");
    return compress(argv[2], argv[3]);
  }
  uint64_t head = UINT64_MAX;
  bool oneThread = false, json = false;
  uint64_t thread = 0;
  std::string path;
  for (int i = 2; i < argc; ++i) {
    std::string argument = argv[i];
    if (command == "dump" && argument == "--head") {
      if (!parseCount(i + 1 < argc ? argv[++i] : nullptr, &head))
        return usage("--head needs a number");
    } else if (command == "dump" && argument == "--thread") {
      if (!parseCount(i + 1 < argc ? argv[++i] : nullptr, &thread) || thread > UINT32_MAX)
        return usage("--thread needs a thread index");
      oneThread = true;
    } else if (command == "stats" && argument == "--json") {
      json = true;
    } else if (!argument.empty() && argument[0] == '-') {
      return usage(("unknown option " + argument).c_str());
    } else if (path.empty()) {
      path = argument;
    } else {
      return usage("more than one trace file");
    }
  }
  if (command != "dump" && command != "stats") return usage(("unknown command " + command).c_str());
  if (path.empty()) return usage("missing trace file");
  if (command == "dump") return dump(path, head, oneThread, static_cast<uint32_t>(thread));
  return stats(path, json);
}
