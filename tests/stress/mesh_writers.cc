// Writers against the mesher: no write may ever be lost, no system call may fail.
// (--stdio-rounds N runs only the stdio reader described below, N rounds of 100 ms.)
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
// the kernel must never see a protected page (no EFAULT, no short read). A stdio reader reads
// lines with fgets and blocks with fread from a pipe: glibc fills the FILE's buffer (allocated
// among sparse blocks of its class) and, for a block as large as that buffer, the destination
// (a surviving block) with its internal read(), which no wrapper sees. A freer
// thread frees its share of the survivors one by one meanwhile, so frees land in spans between
// their copy and the switch of the page map; after each round, once everything is freed, the
// class must hold exactly the objects it held before the round (no slot lost or counted twice).
//
// Linked with libmeshalloc. Prints the totals; exits 1 on any lost write or failed read.
#include <errno.h>
#include <fcntl.h>
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

#include "heap_counters.h"
#include "meshalloc.h"

namespace {

using stress::liveObjectsOfClass;
using stress::readCounter;

struct Options {
  unsigned writers = 2;
  uint64_t targetWrites = 10'000'000;
  size_t objectsPerRound = 60000;
  unsigned passesPerRound = 40;
  // --stdio-rounds N: only the stdio reader against the mesher, N rounds of kStdioRoundMs.
  unsigned stdioRounds = 0;
};

std::atomic<bool> gFailed{false};
// The stdio reader: the FILE's buffer (glibc would allocate st_blksize, 4 KiB, for a pipe; the
// test gives it one of 3 KiB, because classes of whole-page objects are trimmed, never meshed)
// lies among as many sparse blocks of its class; fread reads blocks twice that size straight
// into the block (glibc reads a whole number of buffers past what the buffer holds), which are
// sparse in their class too.
constexpr size_t kStdioBufferClassBlock = 3072;
constexpr size_t kStdioBlock = 2 * kStdioBufferClassBlock;
constexpr size_t kStdioBlocksPerRound = 3000;
constexpr size_t kStdioItemsPerFillerFree = 4;
constexpr size_t kStdioMinKept = 64;
constexpr int kStdioPipeBytes = 1 << 20;
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

// Keeps one block of `all` in `oneIn`, chosen at random, in `kept`, and frees the others.
template <typename Block>
void keepSome(const std::vector<Block*>& all, unsigned oneIn, std::mt19937_64& rng,
              std::vector<Block*>& kept) {
  for (Block* block : all) {
    if (rng() % oneIn == 0)
      kept.push_back(block);
    else
      free(block);
  }
}

// Fills `pattern` with item `i`'s bytes: a line for even items, a block for odd ones.
size_t stdioItem(size_t i, char* pattern) {
  if (i % 2 == 0) return static_cast<size_t>(snprintf(pattern, 64, "line %zu of the feeder\n", i));
  memset(pattern, static_cast<int>('a' + i % 26), kStdioBlock);
  return kStdioBlock;
}

// The stdio side of one round: a FILE whose buffer lies among sparse blocks, read through while
// the mesher runs. Returns the items read.
class StdioRound {
 public:
  explicit StdioRound(std::mt19937_64& rng) {
    if (pipe(fds_) != 0) return;
    // A deep pipe lets the feeder run far ahead: with every CPU busy, a reader that waited
    // for each item would do a few hundred reads a round.
    fcntl(fds_[1], F_SETPIPE_SZ, kStdioPipeBytes);
    // A thread of its own allocates the blocks and the FILE's buffer and exits: its spans are
    // detached, mostly empty, and mesh candidates at once.
    std::thread populate([&] {
      std::vector<char*> all, fillers;
      for (size_t i = 0; i < kStdioBlocksPerRound; i++) {
        all.push_back(static_cast<char*>(malloc(kStdioBlock)));
        fillers.push_back(static_cast<char*>(malloc(kStdioBufferClassBlock)));
        if (i == kStdioBlocksPerRound / 2) {
          in_ = fdopen(fds_[0], "r");
          buffer_ = static_cast<char*>(malloc(kStdioBufferClassBlock));
          char line[8];
          if (!in_ || !buffer_ || setvbuf(in_, buffer_, _IOFBF, kStdioBufferClassBlock) != 0 ||
              write(fds_[1], "x\n", 2) != 2 || !fgets(line, sizeof(line), in_))
            return;
        }
      }
      keepSome(all, 4, rng, kept_);
      keepSome(fillers, 2, rng, fillers_);
    });
    populate.join();
  }
  ~StdioRound() {
    if (in_) fclose(in_);
    free(buffer_);  // after fclose: the FILE reads into it until then
    if (fds_[1] >= 0) close(fds_[1]);
    for (char* block : kept_) free(block);
    for (char* filler : fillers_) free(filler);
  }

  // Until `stop`: the reader reads for as long as the writers write.
  void feed(const std::atomic<bool>& stop) {
    std::vector<char> pattern(kStdioBlock);
    for (size_t i = 0; !stop; i++) {
      size_t length = stdioItem(i, pattern.data());
      if (write(fds_[1], pattern.data(), length) != static_cast<ssize_t>(length)) break;
    }
    close(fds_[1]);
    fds_[1] = -1;
  }

  uint64_t read() {
    if (!in_ || kept_.empty()) {
      fprintf(stderr, "mesh_writers: cannot set up the stdio reader\n");
      gFailed = true;
      return 0;
    }
    std::vector<char> expected(kStdioBlock);
    uint64_t done = 0;
    for (size_t i = 0; !gFailed; i++) {
      size_t length = stdioItem(i, expected.data());
      char* block = kept_[i % kept_.size()];
      bool ok = i % 2 == 0 ? fgets(block, static_cast<int>(kStdioBlock), in_) != nullptr &&
                                 strcmp(block, expected.data()) == 0
                           : fread(block, 1, length, in_) == length &&
                                 memcmp(block, expected.data(), length) == 0;
      if (!ok && feof(in_) && !ferror(in_)) break;  // the feeder stopped between two items
      if (!ok) {
        fprintf(stderr, "mesh_writers: stdio %s into %p failed (%s)\n",
                i % 2 == 0 ? "fgets" : "fread", static_cast<void*>(block),
                ferror(in_) ? strerror(errno) : "wrong data");
        gFailed = true;
        break;
      }
      done++;
      // Freeing blocks as it goes keeps their spans (the buffer's and the destinations')
      // sparse enough to be meshed again and again while the stream is read.
      if (i % kStdioItemsPerFillerFree == 0) {
        if (!fillers_.empty()) {
          free(fillers_.back());
          fillers_.pop_back();
        }
        if (kept_.size() > kStdioMinKept) {
          free(kept_.back());
          kept_.pop_back();
        }
      }
    }
    // Drain what a failed reader left, so that the feeder is never stuck on a full pipe.
    if (gFailed) {
      char sink[512];
      while (fread(sink, 1, sizeof(sink), in_) > 0) {
      }
    }
    return done;
  }

 private:
  int fds_[2] = {-1, -1};
  FILE* in_ = nullptr;
  char* buffer_ = nullptr;  // the FILE's buffer, ours so that its class is one that meshes
  std::vector<char*> kept_;
  std::vector<char*> fillers_;  // keep the buffer's span sparse, not empty
};

constexpr unsigned kStdioRoundMs = 100;

// The stdio reader alone, round after round, against a mesher meshing its spans.
int runStdioRounds(unsigned rounds) {
  std::mt19937_64 rng(7);
  uint64_t reads = 0;
  uint64_t meshesBefore = readCounter("mesh.count");
  for (unsigned round = 0; round < rounds && !gFailed; round++) {
    StdioRound stdio(rng);
    std::atomic<bool> stop{false};
    std::thread mesher([&] {
      while (!stop) meshalloc_compact();
    });
    std::thread feeder([&] { stdio.feed(stop); });
    std::thread reader([&] { reads += stdio.read(); });
    usleep(kStdioRoundMs * 1000);
    stop = true;
    feeder.join();
    reader.join();
    mesher.join();
  }
  uint64_t meshes = readCounter("mesh.count") - meshesBefore;
  printf("mesh_writers: %u stdio rounds, %" PRIu64 " stdio reads, %" PRIu64 " meshes, %s\n", rounds,
         reads, meshes, gFailed ? "FAILED" : "no read failed");
  if (!gFailed && meshes == 0) {
    fprintf(stderr, "mesh_writers: nothing was meshed; the test did not test anything\n");
    return 1;
  }
  return gFailed ? 1 : 0;
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
    else if (!strcmp(argv[i], "--stdio-rounds"))
      options.stdioRounds = static_cast<unsigned>(atoi(argv[i + 1]));
    else {
      fprintf(stderr, "mesh_writers: unknown option %s\n", argv[i]);
      return 2;
    }
  }
  signal(SIGPIPE, SIG_IGN);
  if (options.stdioRounds) return runStdioRounds(options.stdioRounds);
  std::atomic<uint64_t> totalChecked{0};
  uint64_t readsDone = 0;
  uint64_t stdioReads = 0;
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
        keepSome(all, 4, rng, survivors);
      });
      populate.join();

      // One share per writer, then the reader's, then the freer's.
      std::vector<std::vector<Owned>> shares(options.writers + 2);
      for (size_t i = 0; i < survivors.size(); i++)
        shares[i % shares.size()].push_back({survivors[i], words, 0});
      std::vector<Owned>& readerShare = shares[options.writers];
      std::vector<Owned> freerShare = std::move(shares.back());
      shares.pop_back();

      StdioRound stdio(rng);
      std::atomic<bool> stopStdio{false};
      std::thread stdioFeeder([&] { stdio.feed(stopStdio); });
      std::thread stdioReader([&] { stdioReads += stdio.read(); });

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
      stopStdio = true;
      freer.join();
      reader.join();
      feeder.join();
      stdioReader.join();
      stdioFeeder.join();
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
      // Measured again a moment later, so that the report tells a slot lost for good from one
      // still on its way back; then the whole heap's statistics.
      usleep(200000);
      const uint64_t liveLater = liveObjectsOfClass(size);
      fprintf(stderr,
              "mesh_writers: round %u: %" PRIu64 " live objects of %zu bytes before, %" PRIu64
              " after everything was freed (%" PRIu64 " 200 ms later)\n",
              round, liveBefore, size, liveAfter, liveLater);
      stress::dumpClassOf(size, STDERR_FILENO);
      gFailed = true;
    }
    round++;
  }
  const uint64_t meshes = readCounter("mesh.count");
  const uint64_t faults = readCounter("mesh.barrier_faults");
  printf("mesh_writers: %u rounds, %" PRIu64 " checked writes, %" PRIu64 " reads, %" PRIu64
         " stdio reads, %" PRIu64 " meshes, %" PRIu64 " writes waited on the barrier, %s\n",
         round, totalChecked.load(), readsDone, stdioReads, meshes, faults,
         gFailed ? "FAILED" : "no write lost");
  if (!gFailed && meshes == 0) {
    fprintf(stderr, "mesh_writers: nothing was meshed; the test did not test anything\n");
    return 1;
  }
  return gFailed ? 1 : 0;
}
