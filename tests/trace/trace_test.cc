// The trace recorder and decoder (docs/trace.md): a program with a known sequence of calls on
// several threads (roundtrip_program.cc) is recorded with libmeshalloc-trace.so preloaded, and
// the decoded trace must hold exactly those events in per-thread order, with cross-thread frees
// resolved to the right objects. Damaged traces: decoder_test.cc.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "decoder.h"

namespace meshtrace {
namespace {

struct Recording {
  std::string directory;
  std::string trace;
};

// Removes the recordings when the tests are done.
class RemoveRecordings : public ::testing::Environment {
 public:
  void TearDown() override;
};

// Records the program once for the whole test binary.
const Recording& recording() {
  static Recording recorded = [] {
    Recording r;
    char pattern[] = "/tmp/meshalloc-trace-test.XXXXXX";
    r.directory = mkdtemp(pattern);
    r.trace = r.directory + "/t";
    pid_t child = fork();
    if (child == 0) {
      setenv("LD_PRELOAD", MESHALLOC_TRACE_RECORDER, 1);
      setenv("MESHALLOC_TRACE_FILE", r.trace.c_str(), 1);
      execl(MESHALLOC_TRACE_PROGRAM, MESHALLOC_TRACE_PROGRAM, static_cast<char*>(nullptr));
      _exit(127);
    }
    int status = -1;
    waitpid(child, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
        << "the recorded program failed: " << status;
    return r;
  }();
  return recorded;
}

std::vector<Event> threadEvents(const Trace& trace, uint32_t thread) {
  std::vector<Event> events;
  ThreadCursor cursor(trace, thread);
  Event event;
  Error error;
  while (cursor.next(&event, &error)) events.push_back(event);
  EXPECT_FALSE(error.failed()) << error.message << " at " << error.offset;
  return events;
}

bool isMainMarker(const Event& e) {
  return e.size >= 1001 && e.size <= 1999 ? true : e.size == 100003;
}

TEST(TraceRoundTrip, MainThreadHasEveryCallInOrder) {
  Trace trace;
  Error error;
  ASSERT_TRUE(trace.open(recording().trace, &error)) << error.message;
  EXPECT_TRUE(trace.complete());
  EXPECT_EQ(trace.dropped(), 0u);
  EXPECT_EQ(trace.header().parentPid, 0u);
  // Keep the marked calls, and releases / usable-size queries of the blocks they returned.
  std::set<uint64_t> marked;
  std::vector<Event> calls;
  for (const Event& e : threadEvents(trace, 0)) {
    uint64_t target = e.kind == Kind::kUsableSize ? e.address : releasedAddress(e);
    bool keep =
        isMainMarker(e) || (target != 0 && marked.count(target) != 0) || e.kind == Kind::kFork;
    if (!keep) continue;
    if (releases(e)) marked.erase(releasedAddress(e));
    if (allocates(e)) marked.insert(e.result);
    calls.push_back(e);
  }
  struct Expected {
    Kind kind;
    uint64_t size;
    uint64_t align;
    uint8_t flags;
  };
  const Expected expected[] = {
      {Kind::kMalloc, 1001, 0, 0},
      {Kind::kRealloc, 1002, 0, 0},
      {Kind::kRealloc, 100003, 0, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kCalloc, 1004, 0, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kMemalign, 1005, 64, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kPosixMemalign, 1006, 256, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kAlignedAlloc, 1280, 128, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kValloc, 1007, 0, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kPvalloc, 1008, 0, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kReallocArray, 1009, 0, 0},
      {Kind::kReallocArray, 1009, 0, 0},
      {Kind::kUsableSize, 0, 0, 0},
      {Kind::kFree, 0, 0, 0},
      {Kind::kNew, 1010, 0, 0},
      {Kind::kDelete, 1010, 0, kFlagSized},
      {Kind::kNewArray, 1011, 0, 0},
      {Kind::kDeleteArray, 0, 0, 0},
      {Kind::kNew, 1012, 64, kFlagAligned},
      {Kind::kDelete, 0, 64, kFlagAligned},
      {Kind::kNew, 1013, 0, kFlagNothrow},
      {Kind::kDelete, 0, 0, 0},
      {Kind::kFork, 0, 0, 0},
      {Kind::kMalloc, 3002, 0, 0},
      {Kind::kFree, 0, 0, 0},
  };
  // 3002 is not a main-thread marker size: add the last malloc/free pair by hand.
  for (const Event& e : threadEvents(trace, 0)) {
    if (e.kind == Kind::kMalloc && e.size == 3002) {
      calls.push_back(e);
      marked.insert(e.result);
    } else if (e.kind == Kind::kFree && marked.count(e.address) && calls.back().size == 3002) {
      calls.push_back(e);
    }
  }
  ASSERT_EQ(calls.size(), std::size(expected));
  uint64_t previous = 0;  // the block the previous call returned
  for (size_t i = 0; i < calls.size(); ++i) {
    const Event& e = calls[i];
    SCOPED_TRACE("call " + std::to_string(i) + ": " + formatEvent(trace, e));
    EXPECT_EQ(e.kind, expected[i].kind);
    EXPECT_EQ(e.size, expected[i].size);
    EXPECT_EQ(e.align, expected[i].align);
    EXPECT_EQ(e.flags & (kFlagSized | kFlagAligned | kFlagNothrow), expected[i].flags);
    if (e.kind == Kind::kFork) {
      EXPECT_GT(e.value, 0u);
      continue;
    }
    if (e.kind == Kind::kRealloc || e.kind == Kind::kReallocArray) {
      EXPECT_EQ(e.oldAddress,
                i == 16 ? 0 : previous);  // the chains: 1001 -> 1002 -> 100003, NULL -> 3x -> 5x
    }
    if (e.kind == Kind::kFree || isDeleteKind(e.kind) || e.kind == Kind::kUsableSize) {
      EXPECT_EQ(e.address, previous);
    }
    if (e.kind == Kind::kUsableSize) {
      EXPECT_GE(e.value, 5u * 1009);
    }
    if (allocates(e)) {
      previous = e.result;
      if (e.align != 0) {
        EXPECT_EQ(e.result % e.align, 0u);
      }
    }
    if (e.kind == Kind::kCalloc) {
      EXPECT_EQ(e.count, 7u);
    }
    if (e.kind == Kind::kReallocArray) {
      EXPECT_EQ(e.count, i == 16 ? 3u : 5u);
    }
    if (e.kind == Kind::kPosixMemalign) {
      EXPECT_EQ(e.value, 0u);
    }
  }
}

TEST(TraceRoundTrip, WorkersFreeEachOthersBlocks) {
  Trace trace;
  Error error;
  ASSERT_TRUE(trace.open(recording().trace, &error)) << error.message;
  // Which worker allocated each block, and each worker's frees.
  std::map<uint64_t, uint32_t> owner;
  std::map<uint32_t, std::vector<uint64_t>> allocated, freed;
  for (const ThreadInfo& info : trace.threads()) {
    if (info.thread == 0) continue;
    std::vector<Event> events = threadEvents(trace, info.thread);
    SCOPED_TRACE("thread " + std::to_string(info.thread));
    // thread_start, 50 mallocs, 50 frees, thread_exit, then only what glibc's thread teardown
    // calls through the malloc symbols after the recorder's key destructor (free(NULL)).
    ASSERT_GE(events.size(), 102u);
    EXPECT_EQ(events.front().kind, Kind::kThreadStart);
    EXPECT_EQ(events.front().value, info.osThreadId);
    EXPECT_EQ(events[101].kind, Kind::kThreadExit);
    for (size_t late = 102; late < events.size(); ++late) {
      EXPECT_TRUE(events[late].kind == Kind::kFree && events[late].address == 0)
          << formatEvent(trace, events[late]);
    }
    for (int i = 0; i < 50; ++i) {
      const Event& a = events[1 + static_cast<size_t>(i)];
      EXPECT_EQ(a.kind, Kind::kMalloc);
      EXPECT_EQ(a.size, 2000u + static_cast<uint64_t>(i));
      owner[a.result] = info.thread;
      allocated[info.thread].push_back(a.result);
      const Event& f = events[51 + static_cast<size_t>(i)];
      EXPECT_EQ(f.kind, Kind::kFree);
      freed[info.thread].push_back(f.address);
    }
  }
  ASSERT_EQ(allocated.size(), 3u);
  // Each worker freed, in order, exactly the blocks one other worker allocated.
  std::set<uint32_t> victims;
  for (auto& [thread, addresses] : freed) {
    uint32_t victim = owner.at(addresses.front());
    EXPECT_NE(victim, thread);
    EXPECT_EQ(addresses, allocated[victim]);
    victims.insert(victim);
  }
  EXPECT_EQ(victims.size(), 3u);
  // Merged, every free resolves to the object its malloc created.
  MergedCursor merged(trace);
  Event e;
  std::map<uint64_t, uint64_t> idOf;  // worker block -> id
  uint64_t resolved = 0;
  while (merged.next(&e, &error)) {
    if (e.thread == 0) continue;
    if (e.kind == Kind::kMalloc) idOf[e.result] = e.id;
    if (e.kind == Kind::kFree && e.address != 0) {
      ASSERT_EQ(idOf.count(e.address), 1u) << formatEvent(trace, e);
      EXPECT_EQ(e.id, idOf[e.address]);
      ++resolved;
    }
  }
  EXPECT_FALSE(error.failed()) << error.message;
  EXPECT_EQ(resolved, 150u);
  EXPECT_EQ(merged.counts().unmatchedReleases, 0u);
  EXPECT_EQ(merged.counts().reusedLive, 0u);
}

TEST(TraceRoundTrip, ForkedChildHasItsOwnTrace) {
  Trace parent;
  Error error;
  ASSERT_TRUE(parent.open(recording().trace, &error)) << error.message;
  uint64_t childPid = 0;
  for (const Event& e : threadEvents(parent, 0)) {
    if (e.kind == Kind::kFork) childPid = e.value;
  }
  ASSERT_NE(childPid, 0u);
  Trace child;
  ASSERT_TRUE(child.open(recording().trace + "." + std::to_string(childPid), &error))
      << error.message;
  EXPECT_TRUE(child.complete());
  EXPECT_EQ(child.header().pid, childPid);
  EXPECT_EQ(child.header().parentPid, parent.header().pid);
  ASSERT_EQ(child.threads().size(), 1u);
  std::vector<Event> events = threadEvents(child, 0);
  ASSERT_GE(events.size(), 3u);
  EXPECT_EQ(events[0].kind, Kind::kThreadStart);
  EXPECT_EQ(events[0].value, childPid);  // the child's only thread is its main thread
  // The parent's buffered events were dropped in the child: its first call is the marked one.
  EXPECT_EQ(events[1].kind, Kind::kMalloc);
  EXPECT_EQ(events[1].size, 3001u);
  EXPECT_EQ(events[2].kind, Kind::kFree);
  EXPECT_EQ(events[2].address, events[1].result);
}

// A handler's calls while the main thread is inside malloc/free or inside the recorder: all in
// the trace (or counted as dropped), and the main thread's own calls all there too.
TEST(TraceSignals, HandlerCallsAreRecordedWithoutCorruption) {
  std::string trace = recording().directory + "/signals";
  std::string command = std::string("LD_PRELOAD=") + MESHALLOC_TRACE_RECORDER +
                        " MESHALLOC_TRACE_FILE=" + trace + " " + MESHALLOC_TRACE_SIGNAL_PROGRAM;
  FILE* output = popen(command.c_str(), "r");
  ASSERT_NE(output, nullptr);
  long pairs = 0, handled = 0;
  ASSERT_EQ(fscanf(output, "%ld %ld", &pairs, &handled), 2);
  ASSERT_EQ(pclose(output), 0);
  ASSERT_GT(handled, 100) << "too few signals arrived to test anything";
  Trace decoded;
  Error error;
  ASSERT_TRUE(decoded.open(trace, &error)) << error.message;
  long mainMallocs = 0, mainFrees = 0, nullFrees = 0, queries = 0;
  std::set<uint64_t> live;
  for (const Event& e : threadEvents(decoded, 0)) {
    if (e.kind == Kind::kMalloc && e.size == 4001) {
      ++mainMallocs;
      live.insert(e.result);
    } else if (e.kind == Kind::kFree && e.address == 0) {
      ++nullFrees;
    } else if (e.kind == Kind::kFree && live.erase(e.address) == 1) {
      ++mainFrees;
    } else if (e.kind == Kind::kUsableSize) {
      ++queries;
    }
  }
  EXPECT_EQ(mainMallocs, pairs);
  EXPECT_EQ(mainFrees, pairs);
  // Two calls per signal: each one recorded or counted as dropped.
  EXPECT_EQ(nullFrees + queries + static_cast<long>(decoded.dropped()), 2 * handled);
  std::printf("%ld signals during %ld malloc/free pairs, %" PRIu64 " dropped\n", handled, pairs,
              decoded.dropped());
}

void RemoveRecordings::TearDown() {
  std::filesystem::remove_all(recording().directory);
}

const ::testing::Environment* const kCleanup =
    ::testing::AddGlobalTestEnvironment(new RemoveRecordings);

}  // namespace
}  // namespace meshtrace
