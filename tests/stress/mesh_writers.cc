// Writers against the mesher: no write may ever be lost, no system call may fail.
//
// Each round, a short-lived thread allocates many small objects, fills them and frees a
// random three quarters, leaving sparse detached spans (ideal mesh candidates). The surviving
// objects are split among writer threads, which repeatedly check that each object still holds
// the value they last wrote and then write a new one, while a mesher thread calls
// meshalloc_compact() in a loop, so spans are write-protected, copied and remapped under the
// writers' feet. A reader thread meanwhile receives from a socket straight into surviving
// objects, with read, readv, recv or recvmsg/recvmmsg (its header in a heap object too) by
// round, and before each receive has getrandom, readlink, fstat (objects large enough) and poll
// (its pollfd array in the object) write into it:
// the kernel must never see a protected page (no EFAULT, no short read). A freer
// thread frees its share of the survivors one by one meanwhile, so frees land in spans between
// their copy and the switch of the page map; after each round, once everything is freed, the
// class must hold exactly the objects it held before the round (no slot lost or counted twice).
//
// Linked with libmeshalloc. Prints the totals; exits 1 on any lost write or failed read.
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "meshalloc.h"

namespace {

struct Options {
  unsigned writers = 2;
  uint64_t targetWrites = 10'000'000;
  size_t objectsPerRound = 60000;
  unsigned passesPerRound = 40;
};

std::atomic<bool> gFailed{false};
// getrandom calls into the reader's object before each receive: cheap system calls that write
// into the heap, so that an unwrapped one meets a write-protected span within a few rounds.
constexpr unsigned kRandomFillsPerReceive = 4;

void failure(const char* what, const void* where, uint64_t expected, uint64_t found) {
  fprintf(stderr, "mesh_writers: %s at %p: expected %016" PRIx64 " found %016" PRIx64 "\n", what,
          where, expected, found);
  gFailed = true;
}

uint64_t valueFor(const void* object, uint64_t version, size_t word) {
  return (reinterpret_cast<uintptr_t>(object) * 0x9e3779b97f4a7c15ull) ^ (version << 8) ^ word;
}

struct Owned {
  uint64_t* object;
  size_t words;
  uint64_t version;
};

uint64_t writeAndCheck(std::vector<Owned>& objects, unsigned passes) {
  uint64_t checked = 0;
  for (unsigned pass = 0; pass < passes && !gFailed; pass++) {
    for (Owned& o : objects) {
      for (size_t w = 0; w < o.words; w++) {
        uint64_t expected = valueFor(o.object, o.version, w);
        if (o.object[w] != expected) failure("lost write", o.object + w, expected, o.object[w]);
      }
      o.version++;
      for (size_t w = 0; w < o.words; w++) o.object[w] = valueFor(o.object, o.version, w);
      checked += o.words;
    }
  }
  return checked;
}

// Live objects of `size`'s class, with the calling thread's cached slots handed back first.
uint64_t liveObjectsOfClass(size_t size) {
  meshalloc_compact();
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  for (unsigned j = 0;; j++) {
    char name[64];
    size_t classSize = 0, objects = 0;
    length = sizeof(classSize);
    snprintf(name, sizeof(name), "stats.classes.%u.size", j);
    if (meshalloc_mallctl(name, &classSize, &length, nullptr, 0) != 0) return 0;
    if (classSize < size) continue;
    snprintf(name, sizeof(name), "stats.classes.%u.objects", j);
    length = sizeof(objects);
    meshalloc_mallctl(name, &objects, &length, nullptr, 0);
    return objects;
  }
}

}  // namespace

int main(int argc, char** argv) {
  Options options;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--writers"))
      options.writers = static_cast<unsigned>(atoi(argv[i + 1]));
    else if (!strcmp(argv[i], "--writes"))
      options.targetWrites = strtoull(argv[i + 1], nullptr, 10);
    else if (!strcmp(argv[i], "--objects"))
      options.objectsPerRound = strtoull(argv[i + 1], nullptr, 10);
    else {
      fprintf(stderr, "mesh_writers: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  std::atomic<uint64_t> totalChecked{0};
  uint64_t readsDone = 0;
  unsigned round = 0;
  std::mt19937_64 rng(42);
  const size_t sizes[] = {64, 48, 128, 256, 96};
  while (totalChecked < options.targetWrites && !gFailed) {
    size_t size = sizes[round % (sizeof(sizes) / sizeof(sizes[0]))];
    size_t words = size / sizeof(uint64_t);
    const uint64_t liveBefore = liveObjectsOfClass(size);
    {
      std::vector<uint64_t*> survivors;
      std::thread populate([&] {
        std::vector<uint64_t*> all(options.objectsPerRound);
        for (auto& p : all) {
          p = static_cast<uint64_t*>(malloc(size));
          for (size_t w = 0; w < words; w++) p[w] = valueFor(p, 0, w);
        }
        for (auto* p : all) {
          if (rng() % 4 == 0)
            survivors.push_back(p);
          else
            free(p);
        }
      });
      populate.join();

      // One share per writer, then the reader's, then the freer's.
      std::vector<std::vector<Owned>> shares(options.writers + 2);
      for (size_t i = 0; i < survivors.size(); i++)
        shares[i % shares.size()].push_back({survivors[i], words, 0});
      std::vector<Owned>& readerShare = shares[options.writers];
      std::vector<Owned> freerShare = std::move(shares.back());
      shares.pop_back();

      std::atomic<bool> stop{false};
      std::thread mesher([&] {
        while (!stop) meshalloc_compact();
      });
      // The reader: system calls write into heap objects while they are being meshed.
      int fds[2];
      if (socketpair(AF_UNIX, SOCK_STREAM, 0, fds) != 0) return 2;
      // recvmsg's header lives in the heap as well (the kernel writes its lengths and flags).
      auto* header = static_cast<struct mmsghdr*>(malloc(sizeof(struct mmsghdr)));
      auto* vector = static_cast<struct iovec*>(malloc(2 * sizeof(struct iovec)));
      std::thread feeder([&] {
        std::vector<char> message(size);
        for (size_t i = 0; i < readerShare.size() * 4; i++) {
          memset(message.data(), static_cast<int>(i & 0xff), size);
          if (write(fds[1], message.data(), size) != static_cast<ssize_t>(size)) break;
        }
        close(fds[1]);
      });
      // One kind of receive per round: calls that wait out the barrier (as the wrapped ones do)
      // fall into step with the mesher's batches, which hid unwrapped calls made between them.
      const unsigned receiveKind = round % 4;
      std::thread reader([&] {
        for (size_t i = 0; i < readerShare.size() * 4 && !gFailed; i++) {
          Owned& o = readerShare[i % readerShare.size()];
          char* bytes = reinterpret_cast<char*>(o.object);
          bool filled = true;
          for (unsigned r = 0; r < kRandomFillsPerReceive && filled; r++)
            filled = getrandom(bytes, size, 0) == static_cast<ssize_t>(size);
          filled = filled && readlink("/proc/self/exe", bytes, size) > 0;
          if (size >= sizeof(struct stat))
            filled = filled && fstat(fds[0], reinterpret_cast<struct stat*>(bytes)) == 0;
          if (!filled) {
            fprintf(stderr, "mesh_writers: getrandom, readlink or fstat into %p failed (%s)\n",
                    bytes, strerror(errno));
            gFailed = true;
            break;
          }
          auto* waiting = reinterpret_cast<struct pollfd*>(bytes);
          *waiting = {fds[0], POLLIN, 0};
          if (poll(waiting, 1, -1) != 1 || !(waiting->revents & POLLIN)) {
            fprintf(stderr, "mesh_writers: poll on %p failed (%s)\n", bytes, strerror(errno));
            gFailed = true;
            break;
          }
          ssize_t n = 0;
          switch (receiveKind) {
            case 0:
              n = read(fds[0], bytes, size);
              break;
            case 1:
              vector[0] = {bytes, size / 2};
              vector[1] = {bytes + size / 2, size - size / 2};
              n = readv(fds[0], vector, 2);
              break;
            case 2:
              n = recv(fds[0], bytes, size, MSG_WAITALL);
              break;
            default:
              // recvmsg and recvmmsg in turn, the header (mmsghdr's first member) in the heap.
              vector[0] = {bytes, size};
              *header = {};
              header->msg_hdr.msg_iov = vector;
              header->msg_hdr.msg_iovlen = 1;
              if (i % 2 == 0) {
                n = recvmsg(fds[0], &header->msg_hdr, MSG_WAITALL);
              } else {
                n = recvmmsg(fds[0], header, 1, MSG_WAITALL, nullptr) == 1
                        ? static_cast<ssize_t>(header->msg_len)
                        : -1;
              }
              break;
          }
          if (n != static_cast<ssize_t>(size)) {
            fprintf(stderr, "mesh_writers: read into %p returned %zd (%s)\n",
                    static_cast<void*>(o.object), n, n < 0 ? strerror(errno) : "short read");
            gFailed = true;
            break;
          }
          uint64_t expected;
          memset(&expected, static_cast<int>(i & 0xff), sizeof(expected));
          if (o.object[words - 1] != expected)
            failure("read() data", o.object, expected, o.object[words - 1]);
          readsDone++;
        }
        // Closing the read end makes a feeder still writing get EPIPE (SIGPIPE is ignored), so a
        // failed read ends the test instead of hanging it.
        shutdown(fds[0], SHUT_RDWR);
        close(fds[0]);
        // Leave the reader's objects in the writers' format again.
        for (Owned& o : readerShare) {
          for (size_t w = 0; w < o.words; w++) o.object[w] = valueFor(o.object, o.version, w);
        }
      });
      std::thread freer([&] {
        for (Owned& o : freerShare) {
          if (gFailed) break;
          for (size_t w = 0; w < o.words; w++) {
            if (o.object[w] != valueFor(o.object, 0, w))
              failure("freed object", o.object + w, valueFor(o.object, 0, w), o.object[w]);
          }
          free(o.object);
          sched_yield();  // spread the frees over the mesher's passes
        }
      });
      std::vector<std::thread> writers;
      for (unsigned t = 0; t < options.writers; t++) {
        writers.emplace_back(
            [&, t] { totalChecked += writeAndCheck(shares[t], options.passesPerRound); });
      }
      for (auto& w : writers) w.join();
      freer.join();
      reader.join();
      feeder.join();
      stop = true;
      mesher.join();
      free(vector);
      free(header);
      // Final check, then free everything from this thread (frees through meshed aliases).
      for (auto& share : shares) totalChecked += writeAndCheck(share, 1);
      for (auto& share : shares) {
        for (Owned& o : share) free(o.object);
      }
    }
    const uint64_t liveAfter = liveObjectsOfClass(size);
    if (liveAfter != liveBefore) {
      fprintf(stderr,
              "mesh_writers: round %u: %" PRIu64 " live objects of %zu bytes before, %" PRIu64
              " after everything was freed\n",
              round, liveBefore, size, liveAfter);
      gFailed = true;
    }
    round++;
  }
  uint64_t epoch = 1, meshes = 0, faults = 0;
  size_t length = sizeof(epoch);
  meshalloc_mallctl("epoch", &epoch, &length, &epoch, sizeof(epoch));
  length = sizeof(meshes);
  meshalloc_mallctl("mesh.count", &meshes, &length, nullptr, 0);
  length = sizeof(faults);
  meshalloc_mallctl("mesh.barrier_faults", &faults, &length, nullptr, 0);
  printf("mesh_writers: %u rounds, %" PRIu64 " checked writes, %" PRIu64 " reads, %" PRIu64
         " meshes, %" PRIu64 " writes waited on the barrier, %s\n",
         round, totalChecked.load(), readsDone, meshes, faults,
         gFailed ? "FAILED" : "no write lost");
  if (!gFailed && meshes == 0) {
    fprintf(stderr, "mesh_writers: nothing was meshed; the test did not test anything\n");
    return 1;
  }
  return gFailed ? 1 : 0;
}
