// System calls that write into user memory, wrapped so that meshing never makes them fail.
// The kernel does not take a SIGSEGV when it copies into a write-protected page: the call
// fails with EFAULT. So a call whose buffer lies in the heap publishes the buffer for its
// duration (the mesher leaves spans that overlap a published buffer alone), waits out a
// barrier that is already up, and, should fork's snapshot barrier (which protects every
// meshed span) catch it anyway, retries once the barrier is down. The real functions are
// glibc's, found with dlsym(RTLD_NEXT), so cancellation points and errno behave as usual.
#include <dirent.h>
#include <dlfcn.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <sys/epoll.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cstdint>

#include <atomic>
#include <type_traits>

#include "api/export.h"
#include "api/next_symbol.h"
#include "heap/arena.h"
#include "heap/heap.h"
#include "heap/thread_heap.h"
#include "mesh/write_barrier.h"

namespace meshalloc {
namespace {

// The real function of a name glibc keeps only as a compatibility symbol (no default version:
// dlsym does not see it), under the base version of the architectures we build for.
template <typename Function>
Function realCompatFunction(std::atomic<Function>& cache, const char* name) {
  static const char* const kBaseVersions[] = {"GLIBC_2.2.5", "GLIBC_2.17", "GLIBC_2.27",
                                              "GLIBC_2.0"};
  Function f = cache.load(std::memory_order_acquire);
  for (const char* version : kBaseVersions) {
    if (f) break;
    f = reinterpret_cast<Function>(dlvsym(RTLD_NEXT, name, version));
  }
  if (f) cache.store(f, std::memory_order_release);
  return f;
}

// As MESHALLOC_NEXT_SYMBOL (api/next_symbol.h), for those names.
#define MESHALLOC_COMPAT_SYMBOL(function)                               \
  ([]() -> decltype(&::function) {                                      \
    static constinit std::atomic<decltype(&::function)> cache{nullptr}; \
    return ::meshalloc::realCompatFunction(cache, #function);           \
  }())

bool inHeap(uintptr_t start, uintptr_t end) {
  return Arena::contains(start) || Arena::contains(end - 1);
}

// Descriptor arrays (iovecs, message headers, an address length) are read here only where
// reading cannot fault: in the heap, or on the caller's stack just above this frame. Anywhere
// else (a static array, or a bad pointer the kernel would answer with EFAULT) they are left
// to the kernel, so a wrapper never crashes where the plain call would have failed cleanly;
// the buffers they point to then go unprotected.
constexpr uintptr_t kCallerStackWindow = uintptr_t{1} << 20;

__attribute__((noinline)) bool safeToRead(const void* pointer, size_t length) {
  uintptr_t first = reinterpret_cast<uintptr_t>(pointer);
  uintptr_t last = first + length;
  if (pointer == nullptr || last < first) return false;
  if (Arena::contains(first) && Arena::contains(last - 1)) return true;
  uintptr_t frame = reinterpret_cast<uintptr_t>(__builtin_frame_address(0));
  return first >= frame && last <= frame + kCallerStackWindow && last > frame;
}

// The part of the heap a call may write into: the smallest range covering every piece of its
// buffers that lies in the arena (pieces elsewhere need no protection). One range per thread
// is published, so calls with several buffers (readv, recvmsg) cover the gaps between them
// too: the mesher then leaves a few more spans alone for the duration of the call.
struct HeapRange {
  uintptr_t start = UINTPTR_MAX;
  uintptr_t end = 0;
  void add(const void* buffer, size_t length) {
    uintptr_t first = reinterpret_cast<uintptr_t>(buffer);
    uintptr_t last = first + length;
    if (length == 0 || last < first || !inHeap(first, last)) return;
    if (first < start) start = first;
    if (last > end) end = last;
  }
  void addVector(const struct iovec* vector, int count) {
    if (count <= 0 || !safeToRead(vector, static_cast<size_t>(count) * sizeof(*vector))) return;
    for (int i = 0; i < count; i++) add(vector[i].iov_base, vector[i].iov_len);
  }
  bool empty() const { return end == 0; }
};

// fread's size_t result cannot tell an EFAULT apart: it is never retried (only fork's snapshot
// barrier, which protects spans regardless of published buffers, could cause one).
template <typename Result>
bool failedWithEfault(Result result, int error) {
  if constexpr (std::is_signed_v<Result>) {
    return result < 0 && error == EFAULT;
  } else {
    (void)result;
    (void)error;
    return false;
  }
}

template <typename Call>
auto guardedRange(const HeapRange& range, Call call) -> decltype(call()) {
  if (range.empty()) return call();
  // A thread that never allocated still needs a record to publish its buffer in.
  ThreadHeap* heap = heap::currentThreadHeap();
  if (!heap) return call();
  ThreadActivity& activity = heap->activity();
  // A nested call (from a signal handler) keeps the outer buffer published: both stay safe
  // only if the outer one does, and the outer call republishes nothing on return.
  if (activity.ioBufferEnd.load(std::memory_order_relaxed) != 0) return call();
  for (;;) {
    activity.ioBufferStart.store(range.start, std::memory_order_seq_cst);
    activity.ioBufferEnd.store(range.end, std::memory_order_seq_cst);
    uint32_t sequence = WriteBarrier::sequence();
    // Only a barrier that may protect this buffer is waited for: a mesh batch protects a few
    // spans, and an event loop's epoll_wait or read during one would otherwise sleep through it
    // (Redis: about 450 waits during one LRU insertion).
    if ((sequence & 1) && WriteBarrier::mayProtect(sequence, range.start, range.end)) {
      activity.ioBufferEnd.store(0, std::memory_order_seq_cst);
      WriteBarrier::waitForRelease(sequence);
      continue;
    }
    auto result = call();
    int error = errno;
    activity.ioBufferEnd.store(0, std::memory_order_release);
    if (failedWithEfault(result, error) && WriteBarrier::sequence() != sequence) {
      uint32_t now = WriteBarrier::sequence();
      if (now & 1) WriteBarrier::waitForEnd(now);
      continue;
    }
    errno = error;
    return result;
  }
}

template <typename Call>
auto guarded(const void* buffer, size_t length, Call call) -> decltype(call()) {
  HeapRange range;
  range.add(buffer, length);
  return guardedRange(range, call);
}

// recvmsg writes the data, the sender's address, the control data and, in the header itself,
// their lengths and the flags.
void addMessage(HeapRange& range, struct msghdr* message) {
  range.add(message, sizeof(*message));
  range.add(message->msg_name, message->msg_namelen);
  range.add(message->msg_control, message->msg_controllen);
  if (message->msg_iovlen <= static_cast<size_t>(INT32_MAX))
    range.addVector(message->msg_iov, static_cast<int>(message->msg_iovlen));
}

HeapRange messageRange(struct msghdr* message) {
  HeapRange range;
  if (safeToRead(message, sizeof(*message))) addMessage(range, message);
  return range;
}

// recvmmsg also writes each message's length into its mmsghdr.
HeapRange messagesRange(struct mmsghdr* messages, unsigned count) {
  HeapRange range;
  if (!safeToRead(messages, static_cast<size_t>(count) * sizeof(*messages))) return range;
  for (unsigned i = 0; i < count; i++) {
    range.add(&messages[i].msg_len, sizeof(messages[i].msg_len));
    addMessage(range, &messages[i].msg_hdr);
  }
  return range;
}

HeapRange vectorRange(const struct iovec* vector, int count) {
  HeapRange range;
  range.addVector(vector, count);
  return range;
}

HeapRange pollRange(struct pollfd* fds, nfds_t count) {
  HeapRange range;
  if (count <= SIZE_MAX / sizeof(struct pollfd)) range.add(fds, count * sizeof(struct pollfd));
  return range;
}

HeapRange eventsRange(struct epoll_event* events, int maxEvents) {
  HeapRange range;
  if (maxEvents > 0) range.add(events, static_cast<size_t>(maxEvents) * sizeof(*events));
  return range;
}

// A buffer whose size the caller passes by pointer, and which the kernel writes back with the
// bytes it stored: accept's, getsockname's and getpeername's address, getsockopt's value.
HeapRange valueAndLengthRange(void* value, socklen_t* length) {
  HeapRange range;
  if (value && safeToRead(length, sizeof(*length))) {
    range.add(length, sizeof(*length));
    range.add(value, *length);
  }
  return range;
}

// select writes back the three descriptor sets, as many bytes of each as cover `count` bits in
// whole longs (the kernel's FDS_BYTES), and the time left.
HeapRange selectRange(int count, fd_set* sets[3], struct timeval* timeout) {
  HeapRange range;
  if (count > 0) {
    constexpr size_t kBitsPerWord = 8 * sizeof(long);
    size_t bytes = (static_cast<size_t>(count) + kBitsPerWord - 1) / kBitsPerWord * sizeof(long);
    for (int i = 0; i < 3; i++) range.add(sets[i], bytes);
  }
  range.add(timeout, sizeof(*timeout));
  return range;
}

// wait3/wait4 write the status and the child's resource usage.
HeapRange statusRange(int* status, struct rusage* usage) {
  HeapRange range;
  range.add(status, sizeof(*status));
  range.add(usage, sizeof(*usage));
  return range;
}

// fread writes `count` items of `size` bytes at most.
HeapRange itemsRange(void* buffer, size_t size, size_t count) {
  HeapRange range;
  if (size == 0 || count <= SIZE_MAX / size) range.add(buffer, size * count);
  return range;
}

}  // namespace
}  // namespace meshalloc

using namespace meshalloc;

MESHALLOC_EXPORT ssize_t read(int fd, void* buffer, size_t count) {
  auto real = MESHALLOC_NEXT_SYMBOL(read);
  return guarded(buffer, count, [&] { return real(fd, buffer, count); });
}

MESHALLOC_EXPORT ssize_t pread(int fd, void* buffer, size_t count, off_t offset) {
  auto real = MESHALLOC_NEXT_SYMBOL(pread);
  return guarded(buffer, count, [&] { return real(fd, buffer, count, offset); });
}

MESHALLOC_EXPORT ssize_t pread64(int fd, void* buffer, size_t count, off_t offset) {
  auto real = MESHALLOC_NEXT_SYMBOL(pread64);
  return guarded(buffer, count, [&] { return real(fd, buffer, count, offset); });
}

MESHALLOC_EXPORT ssize_t recv(int fd, void* buffer, size_t length, int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(recv);
  return guarded(buffer, length, [&] { return real(fd, buffer, length, flags); });
}

MESHALLOC_EXPORT ssize_t recvfrom(int fd, void* buffer, size_t length, int flags,
                                  struct sockaddr* address, socklen_t* addressLength) {
  auto real = MESHALLOC_NEXT_SYMBOL(recvfrom);
  return guarded(buffer, length,
                 [&] { return real(fd, buffer, length, flags, address, addressLength); });
}

MESHALLOC_EXPORT ssize_t readv(int fd, const struct iovec* vector, int count) {
  auto real = MESHALLOC_NEXT_SYMBOL(readv);
  return guardedRange(vectorRange(vector, count), [&] { return real(fd, vector, count); });
}

MESHALLOC_EXPORT ssize_t preadv(int fd, const struct iovec* vector, int count, off_t offset) {
  auto real = MESHALLOC_NEXT_SYMBOL(preadv);
  return guardedRange(vectorRange(vector, count), [&] { return real(fd, vector, count, offset); });
}

MESHALLOC_EXPORT ssize_t preadv64(int fd, const struct iovec* vector, int count, off_t offset) {
  auto real = MESHALLOC_NEXT_SYMBOL(preadv64);
  return guardedRange(vectorRange(vector, count), [&] { return real(fd, vector, count, offset); });
}

MESHALLOC_EXPORT ssize_t preadv2(int fd, const struct iovec* vector, int count, off_t offset,
                                 int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(preadv2);
  return guardedRange(vectorRange(vector, count),
                      [&] { return real(fd, vector, count, offset, flags); });
}

MESHALLOC_EXPORT ssize_t preadv64v2(int fd, const struct iovec* vector, int count, off_t offset,
                                    int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(preadv64v2);
  return guardedRange(vectorRange(vector, count),
                      [&] { return real(fd, vector, count, offset, flags); });
}

MESHALLOC_EXPORT ssize_t recvmsg(int fd, struct msghdr* message, int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(recvmsg);
  return guardedRange(messageRange(message), [&] { return real(fd, message, flags); });
}

MESHALLOC_EXPORT ssize_t getrandom(void* buffer, size_t length, unsigned flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(getrandom);
  return guarded(buffer, length, [&] { return real(buffer, length, flags); });
}

MESHALLOC_EXPORT int poll(struct pollfd* fds, nfds_t count, int timeout) {
  auto real = MESHALLOC_NEXT_SYMBOL(poll);
  return guardedRange(pollRange(fds, count), [&] { return real(fds, count, timeout); });
}

MESHALLOC_EXPORT int ppoll(struct pollfd* fds, nfds_t count, const struct timespec* timeout,
                           const sigset_t* mask) {
  auto real = MESHALLOC_NEXT_SYMBOL(ppoll);
  return guardedRange(pollRange(fds, count), [&] { return real(fds, count, timeout, mask); });
}

MESHALLOC_EXPORT int epoll_wait(int epfd, struct epoll_event* events, int maxEvents, int timeout) {
  auto real = MESHALLOC_NEXT_SYMBOL(epoll_wait);
  return guardedRange(eventsRange(events, maxEvents),
                      [&] { return real(epfd, events, maxEvents, timeout); });
}

MESHALLOC_EXPORT int epoll_pwait(int epfd, struct epoll_event* events, int maxEvents, int timeout,
                                 const sigset_t* mask) {
  auto real = MESHALLOC_NEXT_SYMBOL(epoll_pwait);
  return guardedRange(eventsRange(events, maxEvents),
                      [&] { return real(epfd, events, maxEvents, timeout, mask); });
}

MESHALLOC_EXPORT int accept(int fd, struct sockaddr* address, socklen_t* length) {
  auto real = MESHALLOC_NEXT_SYMBOL(accept);
  return guardedRange(valueAndLengthRange(address, length),
                      [&] { return real(fd, address, length); });
}

MESHALLOC_EXPORT int accept4(int fd, struct sockaddr* address, socklen_t* length, int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(accept4);
  return guardedRange(valueAndLengthRange(address, length),
                      [&] { return real(fd, address, length, flags); });
}

MESHALLOC_EXPORT int recvmmsg(int fd, struct mmsghdr* messages, unsigned count, int flags,
                              struct timespec* timeout) {
  auto real = MESHALLOC_NEXT_SYMBOL(recvmmsg);
  return guardedRange(messagesRange(messages, count),
                      [&] { return real(fd, messages, count, flags, timeout); });
}

MESHALLOC_EXPORT ssize_t readlink(const char* path, char* buffer, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(readlink);
  return guarded(buffer, size, [&] { return real(path, buffer, size); });
}

MESHALLOC_EXPORT ssize_t readlinkat(int dirfd, const char* path, char* buffer, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(readlinkat);
  return guarded(buffer, size, [&] { return real(dirfd, path, buffer, size); });
}

MESHALLOC_EXPORT int stat(const char* path, struct stat* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(stat);
  return guarded(status, sizeof(*status), [&] { return real(path, status); });
}

MESHALLOC_EXPORT int lstat(const char* path, struct stat* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(lstat);
  return guarded(status, sizeof(*status), [&] { return real(path, status); });
}

MESHALLOC_EXPORT int fstat(int fd, struct stat* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(fstat);
  return guarded(status, sizeof(*status), [&] { return real(fd, status); });
}

MESHALLOC_EXPORT int fstatat(int dirfd, const char* path, struct stat* status, int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(fstatat);
  return guarded(status, sizeof(*status), [&] { return real(dirfd, path, status, flags); });
}

MESHALLOC_EXPORT int stat64(const char* path, struct stat64* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(stat64);
  return guarded(status, sizeof(*status), [&] { return real(path, status); });
}

MESHALLOC_EXPORT int lstat64(const char* path, struct stat64* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(lstat64);
  return guarded(status, sizeof(*status), [&] { return real(path, status); });
}

MESHALLOC_EXPORT int fstat64(int fd, struct stat64* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(fstat64);
  return guarded(status, sizeof(*status), [&] { return real(fd, status); });
}

MESHALLOC_EXPORT int fstatat64(int dirfd, const char* path, struct stat64* status, int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(fstatat64);
  return guarded(status, sizeof(*status), [&] { return real(dirfd, path, status, flags); });
}

MESHALLOC_EXPORT int statx(int dirfd, const char* path, int flags, unsigned mask,
                           struct statx* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(statx);
  return guarded(status, sizeof(*status), [&] { return real(dirfd, path, flags, mask, status); });
}

MESHALLOC_EXPORT int getsockname(int fd, struct sockaddr* address, socklen_t* length) {
  auto real = MESHALLOC_NEXT_SYMBOL(getsockname);
  return guardedRange(valueAndLengthRange(address, length),
                      [&] { return real(fd, address, length); });
}

MESHALLOC_EXPORT int getpeername(int fd, struct sockaddr* address, socklen_t* length) {
  auto real = MESHALLOC_NEXT_SYMBOL(getpeername);
  return guardedRange(valueAndLengthRange(address, length),
                      [&] { return real(fd, address, length); });
}

MESHALLOC_EXPORT int getsockopt(int fd, int level, int name, void* value, socklen_t* length) {
  auto real = MESHALLOC_NEXT_SYMBOL(getsockopt);
  return guardedRange(valueAndLengthRange(value, length),
                      [&] { return real(fd, level, name, value, length); });
}

MESHALLOC_EXPORT int select(int count, fd_set* readable, fd_set* writable, fd_set* exceptional,
                            struct timeval* timeout) {
  auto real = MESHALLOC_NEXT_SYMBOL(select);
  fd_set* sets[3] = {readable, writable, exceptional};
  return guardedRange(selectRange(count, sets, timeout),
                      [&] { return real(count, readable, writable, exceptional, timeout); });
}

MESHALLOC_EXPORT int pselect(int count, fd_set* readable, fd_set* writable, fd_set* exceptional,
                             const struct timespec* timeout, const sigset_t* mask) {
  auto real = MESHALLOC_NEXT_SYMBOL(pselect);
  fd_set* sets[3] = {readable, writable, exceptional};
  return guardedRange(selectRange(count, sets, nullptr),
                      [&] { return real(count, readable, writable, exceptional, timeout, mask); });
}

MESHALLOC_EXPORT pid_t wait(int* status) {
  auto real = MESHALLOC_NEXT_SYMBOL(wait);
  return guarded(status, sizeof(*status), [&] { return real(status); });
}

MESHALLOC_EXPORT pid_t waitpid(pid_t pid, int* status, int options) {
  auto real = MESHALLOC_NEXT_SYMBOL(waitpid);
  return guarded(status, sizeof(*status), [&] { return real(pid, status, options); });
}

MESHALLOC_EXPORT pid_t wait3(int* status, int options, struct rusage* usage) {
  auto real = MESHALLOC_NEXT_SYMBOL(wait3);
  return guardedRange(statusRange(status, usage), [&] { return real(status, options, usage); });
}

MESHALLOC_EXPORT pid_t wait4(pid_t pid, int* status, int options, struct rusage* usage) {
  auto real = MESHALLOC_NEXT_SYMBOL(wait4);
  return guardedRange(statusRange(status, usage),
                      [&] { return real(pid, status, options, usage); });
}

MESHALLOC_EXPORT int waitid(idtype_t type, id_t id, siginfo_t* info, int options) {
  auto real = MESHALLOC_NEXT_SYMBOL(waitid);
  return guarded(info, sizeof(*info), [&] { return real(type, id, info, options); });
}

MESHALLOC_EXPORT int pipe(int fds[2]) {
  auto real = MESHALLOC_NEXT_SYMBOL(pipe);
  return guarded(fds, 2 * sizeof(int), [&] { return real(fds); });
}

MESHALLOC_EXPORT int pipe2(int fds[2], int flags) {
  auto real = MESHALLOC_NEXT_SYMBOL(pipe2);
  return guarded(fds, 2 * sizeof(int), [&] { return real(fds, flags); });
}

MESHALLOC_EXPORT int socketpair(int domain, int type, int protocol, int fds[2]) {
  auto real = MESHALLOC_NEXT_SYMBOL(socketpair);
  return guarded(fds, 2 * sizeof(int), [&] { return real(domain, type, protocol, fds); });
}

MESHALLOC_EXPORT ssize_t getdents64(int fd, void* buffer, size_t length) {
  auto real = MESHALLOC_NEXT_SYMBOL(getdents64);
  return guarded(buffer, length, [&] { return real(fd, buffer, length); });
}

MESHALLOC_EXPORT ssize_t getxattr(const char* path, const char* name, void* value, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(getxattr);
  return guarded(value, size, [&] { return real(path, name, value, size); });
}

MESHALLOC_EXPORT ssize_t lgetxattr(const char* path, const char* name, void* value, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(lgetxattr);
  return guarded(value, size, [&] { return real(path, name, value, size); });
}

MESHALLOC_EXPORT ssize_t fgetxattr(int fd, const char* name, void* value, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(fgetxattr);
  return guarded(value, size, [&] { return real(fd, name, value, size); });
}

MESHALLOC_EXPORT ssize_t listxattr(const char* path, char* list, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(listxattr);
  return guarded(list, size, [&] { return real(path, list, size); });
}

MESHALLOC_EXPORT ssize_t llistxattr(const char* path, char* list, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(llistxattr);
  return guarded(list, size, [&] { return real(path, list, size); });
}

MESHALLOC_EXPORT ssize_t flistxattr(int fd, char* list, size_t size) {
  auto real = MESHALLOC_NEXT_SYMBOL(flistxattr);
  return guarded(list, size, [&] { return real(fd, list, size); });
}

// A large fread goes around the stream's buffer: glibc reads straight into the caller's buffer
// with its internal read(), which the read wrapper never sees. (The stream's own buffer is
// pinned instead: api/libc_buffers.h.)
MESHALLOC_EXPORT size_t fread(void* buffer, size_t size, size_t count, FILE* stream) {
  auto real = MESHALLOC_NEXT_SYMBOL(fread);
  return guardedRange(itemsRange(buffer, size, count),
                      [&] { return real(buffer, size, count, stream); });
}

MESHALLOC_EXPORT size_t fread_unlocked(void* buffer, size_t size, size_t count, FILE* stream) {
  auto real = MESHALLOC_NEXT_SYMBOL(fread_unlocked);
  return guardedRange(itemsRange(buffer, size, count),
                      [&] { return real(buffer, size, count, stream); });
}

MESHALLOC_EXPORT int uname(struct utsname* name) {
  auto real = MESHALLOC_NEXT_SYMBOL(uname);
  return guarded(name, sizeof(*name), [&] { return real(name); });
}

MESHALLOC_EXPORT int getrusage(int who, struct rusage* usage) {
  auto real = MESHALLOC_NEXT_SYMBOL(getrusage);
  return guarded(usage, sizeof(*usage), [&] { return real(who, usage); });
}

// The stat family's names in programs built against glibc before 2.33, which glibc still
// serves as compatibility symbols.
MESHALLOC_EXPORT int __xstat(int version, const char* path, struct stat* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__xstat);
  return guarded(status, sizeof(*status), [&] { return real(version, path, status); });
}

MESHALLOC_EXPORT int __lxstat(int version, const char* path, struct stat* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__lxstat);
  return guarded(status, sizeof(*status), [&] { return real(version, path, status); });
}

MESHALLOC_EXPORT int __fxstat(int version, int fd, struct stat* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__fxstat);
  return guarded(status, sizeof(*status), [&] { return real(version, fd, status); });
}

MESHALLOC_EXPORT int __fxstatat(int version, int dirfd, const char* path, struct stat* status,
                                int flags) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__fxstatat);
  return guarded(status, sizeof(*status),
                 [&] { return real(version, dirfd, path, status, flags); });
}

MESHALLOC_EXPORT int __xstat64(int version, const char* path, struct stat64* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__xstat64);
  return guarded(status, sizeof(*status), [&] { return real(version, path, status); });
}

MESHALLOC_EXPORT int __lxstat64(int version, const char* path, struct stat64* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__lxstat64);
  return guarded(status, sizeof(*status), [&] { return real(version, path, status); });
}

MESHALLOC_EXPORT int __fxstat64(int version, int fd, struct stat64* status) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__fxstat64);
  return guarded(status, sizeof(*status), [&] { return real(version, fd, status); });
}

MESHALLOC_EXPORT int __fxstatat64(int version, int dirfd, const char* path, struct stat64* status,
                                  int flags) {
  auto real = MESHALLOC_COMPAT_SYMBOL(__fxstatat64);
  return guarded(status, sizeof(*status),
                 [&] { return real(version, dirfd, path, status, flags); });
}
