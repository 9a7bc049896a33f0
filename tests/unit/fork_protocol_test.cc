// The fork protocol (heap/fork.h): one list of participants in lock order; prepare runs in
// that order, parent and child in the reverse one. Checked on a list of the test's own, on the
// process's list (the documented lock order), and through a real fork().
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "handle/handles.h"
#include "heap/fork.h"
#include "heap/heap.h"
#include "mesh/policy.h"

namespace meshalloc::heap {
namespace {

// The calls made, as "<step><participant>" tokens ("pA" = prepare of A), in a buffer that
// needs no allocation (a fork handler fills it).
char gLog[256];
size_t gLogLength = 0;

void clearLog() {
  gLogLength = 0;
  gLog[0] = '\0';
}

void record(char step, char who) {
  if (gLogLength + 4 > sizeof(gLog)) return;
  if (gLogLength) gLog[gLogLength++] = ' ';
  gLog[gLogLength++] = step;
  gLog[gLogLength++] = who;
  gLog[gLogLength] = '\0';
}

template <char kWho>
void recordPrepare() {
  record('p', kWho);
}
template <char kWho>
void recordParent() {
  record('u', kWho);
}
template <char kWho>
void recordChild() {
  record('c', kWho);
}

template <char kWho>
constexpr ForkParticipant recorder(ForkRank rank) {
  return {"recorder", rank, recordPrepare<kWho>, recordParent<kWho>, recordChild<kWho>};
}

constexpr ForkParticipant kA = recorder<'A'>(ForkRank::kAfterHeapLocks);
constexpr ForkParticipant kB = recorder<'B'>(ForkRank::kOperationGuard);
constexpr ForkParticipant kC = recorder<'C'>(ForkRank::kArena);
constexpr ForkParticipant kD = recorder<'D'>(ForkRank::kBeforeHeapLocks);
constexpr ForkParticipant kE = recorder<'E'>(ForkRank::kArena);  // same rank as C, added later
constexpr ForkParticipant kNothing = {"nothing", ForkRank::kGlobalHeap, nullptr, nullptr, nullptr};

std::vector<std::string> namesOf(const ForkParticipants& list) {
  std::vector<std::string> names;
  for (unsigned i = 0; i < list.count(); i++) names.push_back(list[i].name);
  return names;
}

TEST(ForkProtocol, PrepareRunsInLockOrderParentAndChildInReverse) {
  ForkParticipants list;
  for (const ForkParticipant* p : {&kA, &kB, &kC, &kNothing, &kD, &kE}) ASSERT_TRUE(list.add(*p));
  ASSERT_EQ(list.count(), 6u);
  for (unsigned i = 1; i < list.count(); i++) EXPECT_LE(list[i - 1].rank, list[i].rank);

  clearLog();
  list.prepare();
  EXPECT_STREQ(gLog, "pB pD pC pE pA");
  clearLog();
  list.parent();
  EXPECT_STREQ(gLog, "uA uE uC uD uB");
  clearLog();
  list.child();
  EXPECT_STREQ(gLog, "cA cE cC cD cB");
}

TEST(ForkProtocol, AddIsIdempotentRemoveForgetsAndTheCapacityIsFixed) {
  ForkParticipants list;
  ASSERT_TRUE(list.add(kA));
  ASSERT_TRUE(list.add(kA));
  EXPECT_EQ(list.count(), 1u);
  ASSERT_TRUE(list.add(kB));
  list.remove(kA);
  ASSERT_EQ(list.count(), 1u);
  EXPECT_EQ(&list[0], &kB);
  list.remove(kA);  // absent: no change
  EXPECT_EQ(list.count(), 1u);

  static ForkParticipant many[ForkParticipants::kCapacity];
  for (ForkParticipant& p : many) p = kNothing;
  ForkParticipants full;
  for (const ForkParticipant& p : many) ASSERT_TRUE(full.add(p));
  EXPECT_FALSE(full.add(kA));
  EXPECT_EQ(full.count(), ForkParticipants::kCapacity);
}

// The lock order that docs/architecture.md ("Fork") describes, with the mesh layer's two
// participants registered around the heap's own.
TEST(ForkProtocol, TheProcessListIsTheDocumentedLockOrder) {
  ASSERT_TRUE(ensureInitialized());
  MeshPolicy::init();
  const std::vector<std::string> expected = {
      "operation guard", "mesher", "idle reclaim",  "thread registry", "global heap",
      "span backing",    "arena",  "internal heap", "retired spans",   "meshed-span snapshot",
  };
  EXPECT_EQ(namesOf(forkParticipants()), expected);
  for (unsigned i = 1; i < forkParticipants().count(); i++)
    EXPECT_LE(forkParticipants()[i - 1].rank, forkParticipants()[i].rank);
}

// The handle layer's components are participants of their own, after the mesher's and before
// every heap lock, in the layer's order: the controller (which only forgets its thread in the
// child), the defragmenter's step lock, the store's class locks, then the thread caches' and
// the table's locks, which a class lock holder takes.
TEST(ForkProtocol, TheHandleLayerJoinsTheListInItsOwnOrder) {
  ASSERT_TRUE(ensureInitialized());
  MeshPolicy::init();
  ASSERT_TRUE(handles::initialize());
  const std::vector<std::string> expected = {
      "operation guard",     "mesher",        "handle controller",
      "handle defragmenter", "handle store",  "handle thread caches",
      "handle table",        "idle reclaim",  "thread registry",
      "global heap",         "span backing",  "arena",
      "internal heap",       "retired spans", "meshed-span snapshot",
  };
  EXPECT_EQ(namesOf(forkParticipants()), expected);
}

// fork() runs the process's list through the pthread_atfork handlers: a participant before
// the heap's locks (D) and one after them (A) see prepare in order, then parent (in the
// parent) or child (in the child) in reverse.
TEST(ForkProtocol, ForkRunsTheListInOrderThenInReverse) {
  ASSERT_TRUE(ensureInitialized());
  MeshPolicy::init();
  ASSERT_TRUE(forkParticipants().add(kD));
  ASSERT_TRUE(forkParticipants().add(kA));
  clearLog();
  pid_t pid = fork();
  if (pid == 0) _exit(strcmp(gLog, "pD pA cA cD") == 0 ? 0 : 1);
  forkParticipants().remove(kD);
  forkParticipants().remove(kA);
  ASSERT_GT(pid, 0);
  EXPECT_STREQ(gLog, "pD pA uA uD");
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "the child's log was not \"pD pA cA cD\"";
}

}  // namespace
}  // namespace meshalloc::heap
