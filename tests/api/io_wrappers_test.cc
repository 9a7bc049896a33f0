// The system-call wrappers (src/api/io_exports.cc) read the descriptors a call is given (iovec
// arrays, message headers, an address length) to find the heap buffers to protect. Given bad
// pointers they must behave exactly like the plain system call, which fails with EFAULT:
// never crash where glibc would not.
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "meshalloc.h"

namespace {

// Addresses no program maps: the zero page and the top of the address space.
void* const kBadPointers[] = {reinterpret_cast<void*>(8), reinterpret_cast<void*>(-4096)};

struct Outcome {
  long result;
  int error;
};

template <typename Call>
Outcome outcomeOf(Call call) {
  errno = 0;
  long result = call();
  return {result, result < 0 ? errno : 0};
}

void expectSame(const Outcome& wrapped, const Outcome& raw, const char* what) {
  EXPECT_EQ(wrapped.result, raw.result) << what;
  EXPECT_EQ(wrapped.error, raw.error)
      << what << ": " << strerror(wrapped.error) << " against " << strerror(raw.error);
}

// A socket pair with a message waiting on fds[0].
struct Pair {
  int fds[2] = {-1, -1};
  Pair() {
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, fds), 0);
    EXPECT_EQ(write(fds[1], "message", 7), 7);
  }
  ~Pair() {
    close(fds[0]);
    close(fds[1]);
  }
};

TEST(IoWrappers, ReadvWithABadVectorFailsLikeTheSystemCall) {
  for (void* bad : kBadPointers) {
    Pair pair;
    auto* vector = static_cast<const struct iovec*>(bad);
    Outcome wrapped = outcomeOf([&] { return readv(pair.fds[0], vector, 2); });
    Outcome raw = outcomeOf([&] { return syscall(SYS_readv, pair.fds[0], vector, 2); });
    expectSame(wrapped, raw, "readv");
    EXPECT_EQ(wrapped.error, EFAULT);
  }
}

TEST(IoWrappers, ReadvIntoABadBufferFailsLikeTheSystemCall) {
  for (void* bad : kBadPointers) {
    Pair pair;
    struct iovec vector[1] = {{bad, 7}};
    Outcome wrapped = outcomeOf([&] { return readv(pair.fds[0], vector, 1); });
    Outcome raw = outcomeOf([&] { return syscall(SYS_readv, pair.fds[0], vector, 1); });
    expectSame(wrapped, raw, "readv");
  }
}

TEST(IoWrappers, RecvmsgAndRecvmmsgWithABadHeaderFailLikeTheSystemCall) {
  for (void* bad : kBadPointers) {
    Pair pair;
    auto* header = static_cast<struct msghdr*>(bad);
    expectSame(outcomeOf([&] { return recvmsg(pair.fds[0], header, MSG_DONTWAIT); }),
               outcomeOf([&] { return syscall(SYS_recvmsg, pair.fds[0], header, MSG_DONTWAIT); }),
               "recvmsg");
    auto* headers = static_cast<struct mmsghdr*>(bad);
    expectSame(outcomeOf([&] { return recvmmsg(pair.fds[0], headers, 2, MSG_DONTWAIT, nullptr); }),
               outcomeOf([&] {
                 return syscall(SYS_recvmmsg, pair.fds[0], headers, 2, MSG_DONTWAIT, nullptr);
               }),
               "recvmmsg");
  }
}

TEST(IoWrappers, PollAndEpollWithBadArraysFailLikeTheSystemCall) {
  for (void* bad : kBadPointers) {
    auto* fds = static_cast<struct pollfd*>(bad);
    expectSame(outcomeOf([&] { return poll(fds, 1, 0); }),
               outcomeOf([&] { return syscall(SYS_poll, fds, 1, 0); }), "poll");
    Pair pair;
    int epfd = epoll_create1(0);
    ASSERT_GE(epfd, 0);
    struct epoll_event event = {};
    event.events = EPOLLIN;
    ASSERT_EQ(epoll_ctl(epfd, EPOLL_CTL_ADD, pair.fds[0], &event), 0);
    auto* events = static_cast<struct epoll_event*>(bad);
    expectSame(outcomeOf([&] { return epoll_wait(epfd, events, 4, 0); }),
               outcomeOf([&] { return syscall(SYS_epoll_wait, epfd, events, 4, 0); }),
               "epoll_wait");
    close(epfd);
  }
}

TEST(IoWrappers, AcceptWithABadAddressLengthFailsLikeTheSystemCall) {
  int listener = socket(AF_UNIX, SOCK_STREAM, 0);
  ASSERT_GE(listener, 0);
  struct sockaddr_un address = {};
  address.sun_family = AF_UNIX;
  // An abstract address: nothing to clean up in the file system.
  snprintf(address.sun_path + 1, sizeof(address.sun_path) - 1, "meshalloc-accept-%d", getpid());
  socklen_t length = static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 +
                                            strlen(address.sun_path + 1));
  ASSERT_EQ(bind(listener, reinterpret_cast<struct sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 8), 0);
  for (void* bad : kBadPointers) {
    // One pending connection for each of the two calls.
    int clients[2];
    for (int& client : clients) {
      client = socket(AF_UNIX, SOCK_STREAM, 0);
      ASSERT_EQ(connect(client, reinterpret_cast<struct sockaddr*>(&address), length), 0);
    }
    struct sockaddr_un peer;
    auto* badLength = static_cast<socklen_t*>(bad);
    Outcome wrapped = outcomeOf(
        [&] { return accept(listener, reinterpret_cast<struct sockaddr*>(&peer), badLength); });
    Outcome raw = outcomeOf([&] {
      return syscall(SYS_accept, listener, reinterpret_cast<struct sockaddr*>(&peer), badLength);
    });
    expectSame(wrapped, raw, "accept");
    if (wrapped.result >= 0) close(static_cast<int>(wrapped.result));
    if (raw.result >= 0) close(static_cast<int>(raw.result));
    for (int client : clients) close(client);
  }
  close(listener);
}

TEST(IoWrappers, StatFamilyIntoHeapAndBadBuffers) {
  auto* status = static_cast<struct stat*>(malloc(sizeof(struct stat)));
  struct stat reference;
  ASSERT_EQ(syscall(SYS_stat, "/proc/self/exe", &reference), 0);
  ASSERT_EQ(stat("/proc/self/exe", status), 0);
  EXPECT_EQ(status->st_ino, reference.st_ino);
  ASSERT_EQ(fstatat(AT_FDCWD, "/proc/self/exe", status, 0), 0);
  EXPECT_EQ(status->st_ino, reference.st_ino);
  ASSERT_EQ(lstat("/proc/self/exe", status), 0);
  EXPECT_TRUE(S_ISLNK(status->st_mode));
  struct stat standardInput;
  ASSERT_EQ(fstat(0, status), syscall(SYS_fstat, 0, &standardInput));
  auto* extended = static_cast<struct statx*>(malloc(sizeof(struct statx)));
  ASSERT_EQ(statx(AT_FDCWD, "/proc/self/exe", 0, STATX_INO, extended), 0);
  EXPECT_EQ(extended->stx_ino, reference.st_ino);
  for (void* bad : kBadPointers) {
    auto* badStatus = static_cast<struct stat*>(bad);
    expectSame(outcomeOf([&] { return stat("/proc/self/exe", badStatus); }),
               outcomeOf([&] { return syscall(SYS_stat, "/proc/self/exe", badStatus); }), "stat");
    expectSame(outcomeOf([&] { return fstat(0, badStatus); }),
               outcomeOf([&] { return syscall(SYS_fstat, 0, badStatus); }), "fstat");
  }
  free(extended);
  free(status);
}

// The wrappers still work on good arguments, heap buffers included.
TEST(IoWrappers, ReceiveIntoHeapBuffers) {
  Pair pair;
  char* first = static_cast<char*>(malloc(4));
  char* second = static_cast<char*>(malloc(3));
  auto* vector = static_cast<struct iovec*>(malloc(2 * sizeof(struct iovec)));
  vector[0] = {first, 4};
  vector[1] = {second, 3};
  ASSERT_EQ(readv(pair.fds[0], vector, 2), 7);
  EXPECT_EQ(memcmp(first, "mess", 4), 0);
  EXPECT_EQ(memcmp(second, "age", 3), 0);
  ASSERT_EQ(write(pair.fds[1], "again", 5), 5);
  auto* header = static_cast<struct msghdr*>(calloc(1, sizeof(struct msghdr)));
  vector[0] = {first, 4};
  vector[1] = {second, 1};
  header->msg_iov = vector;
  header->msg_iovlen = 2;
  ASSERT_EQ(recvmsg(pair.fds[0], header, 0), 5);
  EXPECT_EQ(memcmp(first, "agai", 4), 0);
  EXPECT_EQ(second[0], 'n');
  free(header);
  free(vector);
  free(second);
  free(first);
}

}  // namespace

namespace {

uint64_t readCounter(const char* name) {
  uint64_t epoch = 1, value = 0;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  length = sizeof(value);
  EXPECT_EQ(meshalloc_mallctl(name, &value, &length, nullptr, 0), 0) << name;
  return value;
}

int gBlockedPipe[2];
void* blockInReadv(void* vectorPointer) {
  readv(gBlockedPipe[0], static_cast<struct iovec*>(vectorPointer), 2);  // never returns
  return nullptr;
}

}  // namespace

// A thread cancelled while blocked in a wrapped call (readv is a cancellation point) never
// unpublishes its buffer itself. Its range must not outlive it: here it covers a whole heap of
// sparse spans, which the mesher would otherwise skip for good.
TEST(IoWrappers, ACancelledCallLeavesNothingPublished) {
  bool meshing = false;
  size_t length = sizeof(meshing);
  ASSERT_EQ(meshalloc_mallctl("opt.mesh", &meshing, &length, nullptr, 0), 0);
  if (!meshing) GTEST_SKIP() << "meshing is off";
  constexpr size_t kObjects = 60000;
  constexpr size_t kSize = 64;
  std::vector<char*> objects(kObjects);
  for (char*& object : objects) {
    object = static_cast<char*>(malloc(kSize));
    memset(object, 1, kSize);
  }
  std::vector<char*> kept;
  for (size_t i = 0; i < kObjects; i++) {
    if (i % 4 == 0) {
      kept.push_back(objects[i]);
    } else {
      free(objects[i]);
    }
  }
  auto [lowest, highest] = std::minmax_element(kept.begin(), kept.end());
  // The two buffers are the lowest and the highest survivors: the published range is all of
  // them.
  // In the heap: the wrapper reads a vector only there or on its own thread's stack.
  auto* vector = static_cast<struct iovec*>(malloc(2 * sizeof(struct iovec)));
  vector[0] = {*lowest, kSize};
  vector[1] = {*highest, kSize};
  ASSERT_EQ(pipe(gBlockedPipe), 0);
  pthread_t thread;
  ASSERT_EQ(pthread_create(&thread, nullptr, blockInReadv, vector), 0);
  usleep(100000);  // into readv, blocked on the empty pipe
  ASSERT_EQ(pthread_cancel(thread), 0);
  ASSERT_EQ(pthread_join(thread, nullptr), 0);
  uint64_t skippedBefore = readCounter("mesh.skipped_for_io");
  uint64_t meshesBefore = readCounter("mesh.count");
  meshalloc_compact();
  EXPECT_EQ(readCounter("mesh.skipped_for_io"), skippedBefore)
      << "the cancelled thread's buffers still keep the mesher away";
  EXPECT_GT(readCounter("mesh.count"), meshesBefore) << "nothing was meshed";
  close(gBlockedPipe[0]);
  close(gBlockedPipe[1]);
  free(vector);
  for (char* object : kept) free(object);
}

// glibc fills a stream's buffer with its internal read(), which no wrapper sees: malloc pins the
// spans of the buffers glibc allocates (api/libc_buffers.h), and only for as long as they hold
// some.
TEST(IoWrappers, StdioBuffersLieInPinnedSpans) {
  constexpr int kStreams = 32;
  uint64_t before = readCounter("mesh.pinned_spans");
  uint64_t during = 0;
  std::thread([&] {
    FILE* streams[kStreams];
    int writeEnds[kStreams];
    for (int i = 0; i < kStreams; i++) {
      int fds[2];
      ASSERT_EQ(pipe(fds), 0);
      ASSERT_EQ(write(fds[1], "line\n", 5), 5);
      streams[i] = fdopen(fds[0], "r");
      ASSERT_NE(streams[i], nullptr);
      writeEnds[i] = fds[1];
      char line[8];
      ASSERT_NE(fgets(line, sizeof(line), streams[i]), nullptr);  // allocates the buffer
      EXPECT_STREQ(line, "line\n");
    }
    during = readCounter("mesh.pinned_spans");
    for (int i = 0; i < kStreams; i++) {
      fclose(streams[i]);
      close(writeEnds[i]);
    }
  }).join();
  EXPECT_GT(during, before) << "stdio's buffers are not pinned";
  EXPECT_EQ(readCounter("mesh.pinned_spans"), before) << "emptied spans are still pinned";
}

// A buffer the program hands a stream (setvbuf, setbuffer, setbuf) is filled by glibc's internal
// read() just the same: its span is pinned, whatever else lies in it, and freeing the span's
// blocks unpins it. Stack buffers and unbuffered streams pin nothing.
TEST(IoWrappers, StreamBuffersTheProgramGivesLieInPinnedSpans) {
  uint64_t before = readCounter("mesh.pinned_spans");
  uint64_t during = 0, afterStack = 0;
  std::thread([&] {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    FILE* stream = fdopen(fds[0], "r");
    ASSERT_NE(stream, nullptr);
    char onStack[256];
    ASSERT_EQ(setvbuf(stream, onStack, _IOFBF, sizeof(onStack)), 0);
    afterStack = readCounter("mesh.pinned_spans");
    // Three blocks of three classes, one per call, with the data read through each.
    constexpr size_t kSizes[3] = {3000, 1500, BUFSIZ};
    char* buffers[3];
    for (int i = 0; i < 3; i++) {
      buffers[i] = static_cast<char*>(malloc(kSizes[i]));
      ASSERT_NE(buffers[i], nullptr);
      if (i == 0) {
        ASSERT_EQ(setvbuf(stream, buffers[i], _IOFBF, kSizes[i]), 0);
      } else if (i == 1) {
        setbuffer(stream, buffers[i], kSizes[i]);
      } else {
        setbuf(stream, buffers[i]);
      }
      ASSERT_EQ(write(fds[1], "line\n", 5), 5);
      char line[8];
      ASSERT_NE(fgets(line, sizeof(line), stream), nullptr);
      EXPECT_STREQ(line, "line\n");
    }
    during = readCounter("mesh.pinned_spans");
    fclose(stream);
    close(fds[1]);
    for (char* buffer : buffers) free(buffer);
  }).join();
  EXPECT_EQ(afterStack, before) << "a stack buffer pinned a span";
  EXPECT_GE(during, before + 3) << "the program's stream buffers are not pinned";
  EXPECT_EQ(readCounter("mesh.pinned_spans"), before) << "emptied spans are still pinned";
}

// The other wrapped calls, into heap buffers (they must still work) and into bad ones (they
// must fail as the system call does).
TEST(IoWrappers, MoreCallsIntoHeapAndBadBuffers) {
  int* fds = static_cast<int*>(malloc(2 * sizeof(int)));
  ASSERT_EQ(pipe(fds), 0);
  ASSERT_EQ(write(fds[1], "abc", 3), 3);
  auto* readable = static_cast<fd_set*>(malloc(sizeof(fd_set)));
  FD_ZERO(readable);
  FD_SET(fds[0], readable);
  struct timeval* timeout = static_cast<struct timeval*>(malloc(sizeof(struct timeval)));
  *timeout = {1, 0};
  EXPECT_EQ(select(fds[0] + 1, readable, nullptr, nullptr, timeout), 1);
  EXPECT_TRUE(FD_ISSET(fds[0], readable));
  FILE* stream = fdopen(fds[0], "r");
  ASSERT_NE(stream, nullptr);
  char* buffer = static_cast<char*>(malloc(8));
  close(fds[1]);
  EXPECT_EQ(fread(buffer, 1, 8, stream), 3u);
  EXPECT_EQ(memcmp(buffer, "abc", 3), 0);
  fclose(stream);

  int* pair = static_cast<int*>(malloc(2 * sizeof(int)));
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  int* value = static_cast<int*>(malloc(sizeof(int)));
  auto* length = static_cast<socklen_t*>(malloc(sizeof(socklen_t)));
  *length = sizeof(int);
  ASSERT_EQ(getsockopt(pair[0], SOL_SOCKET, SO_TYPE, value, length), 0);
  EXPECT_EQ(*value, SOCK_STREAM);

  pid_t child = fork();
  if (child == 0) _exit(7);
  int* status = static_cast<int*>(malloc(sizeof(int)));
  ASSERT_EQ(waitpid(child, status, 0), child);
  EXPECT_TRUE(WIFEXITED(*status));
  EXPECT_EQ(WEXITSTATUS(*status), 7);

  for (void* bad : kBadPointers) {
    expectSame(outcomeOf([&] { return pipe(static_cast<int*>(bad)); }),
               outcomeOf([&] { return syscall(SYS_pipe2, bad, 0); }), "pipe");
    socklen_t goodLength = sizeof(int);
    expectSame(
        outcomeOf([&] { return getsockopt(pair[0], SOL_SOCKET, SO_TYPE, bad, &goodLength); }),
        outcomeOf([&] {
          return syscall(SYS_getsockopt, pair[0], SOL_SOCKET, SO_TYPE, bad, &goodLength);
        }),
        "getsockopt");
    expectSame(
        outcomeOf([&] {
          return getsockopt(pair[0], SOL_SOCKET, SO_TYPE, value, static_cast<socklen_t*>(bad));
        }),
        outcomeOf(
            [&] { return syscall(SYS_getsockopt, pair[0], SOL_SOCKET, SO_TYPE, value, bad); }),
        "getsockopt length");
    expectSame(
        outcomeOf([&] {
          return select(pair[0] + 1, static_cast<fd_set*>(bad), nullptr, nullptr, nullptr);
        }),
        outcomeOf([&] { return syscall(SYS_select, pair[0] + 1, bad, nullptr, nullptr, nullptr); }),
        "select");
    expectSame(outcomeOf([&] { return waitpid(-1, static_cast<int*>(bad), WNOHANG); }),
               outcomeOf([&] { return syscall(SYS_wait4, -1, bad, WNOHANG, nullptr); }), "waitpid");
  }
  close(pair[0]);
  close(pair[1]);
  free(status);
  free(length);
  free(value);
  free(pair);
  free(buffer);
  free(timeout);
  free(readable);
  free(fds);
}

// Programs built against glibc before 2.33 call the stat family as __xstat and friends, which
// glibc keeps as compatibility symbols; meshalloc defines those names too (an old program's
// versioned reference binds to the first definition in search order, as malloc's does), and
// its wrappers must reach glibc's compatibility functions.
TEST(IoWrappers, LegacyStatNamesAreWrapped) {
#if defined(__x86_64__)
  constexpr int kStatVersion = 1;  // _STAT_VER_LINUX
  using Xstat = int (*)(int, const char*, struct stat*);
  using Fxstat = int (*)(int, int, struct stat*);
  Dl_info self;
  ASSERT_NE(dladdr(reinterpret_cast<void*>(&meshalloc_mallctl), &self), 0);
  void* library = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
  ASSERT_NE(library, nullptr) << self.dli_fname;
  auto xstat = reinterpret_cast<Xstat>(dlsym(library, "__xstat"));
  auto fxstat = reinterpret_cast<Fxstat>(dlsym(library, "__fxstat"));
  ASSERT_NE(xstat, nullptr);
  ASSERT_NE(fxstat, nullptr);
  auto* status = static_cast<struct stat*>(malloc(sizeof(struct stat)));
  struct stat reference;
  ASSERT_EQ(syscall(SYS_stat, "/proc/self/exe", &reference), 0);
  ASSERT_EQ(xstat(kStatVersion, "/proc/self/exe", status), 0);
  EXPECT_EQ(status->st_ino, reference.st_ino);
  ASSERT_EQ(fxstat(kStatVersion, 0, status), syscall(SYS_fstat, 0, &reference));
  for (void* bad : kBadPointers) {
    auto* badStatus = static_cast<struct stat*>(bad);
    expectSame(outcomeOf([&] { return xstat(kStatVersion, "/proc/self/exe", badStatus); }),
               outcomeOf([&] { return syscall(SYS_stat, "/proc/self/exe", badStatus); }),
               "__xstat");
  }
  free(status);
  dlclose(library);
#else
  GTEST_SKIP() << "the compatibility names' version is known here for x86-64 only";
#endif
}
