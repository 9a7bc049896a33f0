// handle_cache: a key-value LRU cache server speaking Redis's protocol, with its entries kept
// either in malloc'd memory or behind meshalloc handles (--storage), so that the same program
// measures what moving objects through handles buys over meshing and over Redis's own active
// defragmentation (meshalloc bench handles, docs/handles-bench.md).
//
// Like Redis: one thread, an epoll loop, pipelined requests answered in order, eviction before
// each command while the accounted memory is above maxmemory. Commands: SET key value, GET,
// DEL, DBSIZE, PING, INFO [section], CONFIG GET/SET (maxmemory, maxmemory-samples, ...),
// MEMORY MALLOC-STATS, SHUTDOWN [NOSAVE|SAVE], QUIT, COMMAND.
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <string_view>
#include <type_traits>
#include <unordered_map>
#include <vector>

#include "options.h"
#include "resp.h"
#include "storage.h"
#include "store.h"

namespace handle_cache {

namespace {

constexpr size_t kReadChunk = 64 * 1024;
constexpr int kMaxEvents = 64;
constexpr uint64_t kMsPerSecond = 1000;
constexpr const char* kVersion = "1";
// meshalloc's handle statistics INFO shows with --storage handles, as handles_<name>.
constexpr const char* kHandleStatistics[] = {
    "live",   "live_bytes",  "committed", "table_bytes", "fragmentation_permille",
    "moved",  "moved_bytes", "passes",    "released",    "cpu_ns",
    "pauses", "pause_max_ns"};

uint64_t wallMs() {
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  return static_cast<uint64_t>(now.tv_sec) * kMsPerSecond +
         static_cast<uint64_t>(now.tv_nsec) / 1000000;
}

uint64_t monotonicMs() {
  timespec now;
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<uint64_t>(now.tv_sec) * kMsPerSecond +
         static_cast<uint64_t>(now.tv_nsec) / 1000000;
}

double seconds(const timeval& time) {
  return static_cast<double>(time.tv_sec) + static_cast<double>(time.tv_usec) / 1e6;
}

[[noreturn]] void die(const char* what) {
  fprintf(stderr, "handle_cache: %s: %s\n", what, strerror(errno));
  exit(1);
}

struct Client {
  int fd;
  std::string in;
  std::string out;
  size_t written = 0;
  bool closeAfterReply = false;
};

template <typename Storage>
class Server {
 public:
  explicit Server(const Options& options)
      : options_(options), store_(options.seed), log_(openLog(options.logfile)) {}

  int run() {
    listen();
    logLine("handle_cache " + std::string(kVersion) + " storage=" + Storage::kName +
            " ready to accept connections on port " + std::to_string(options_.port));
    uint64_t nextCompact = monotonicMs() + options_.compactIntervalMs;
    epoll_event events[kMaxEvents];
    while (!shutdown_) {
      int timeout = -1;
      if (options_.compactIntervalMs != 0) {
        uint64_t now = monotonicMs();
        if (now >= nextCompact) {
          compacted_ += Storage::compact(options_.compactBudgetUs * 1000);
          nextCompact = now + options_.compactIntervalMs;
        }
        timeout = static_cast<int>(nextCompact - now);
      }
      int ready = epoll_wait(epoll_, events, kMaxEvents, timeout);
      if (ready < 0) {
        if (errno == EINTR) continue;
        die("epoll_wait");
      }
      store_.setClock(static_cast<uint32_t>(wallMs() / kMsPerSecond));
      for (int i = 0; i < ready && !shutdown_; i++) {
        if (events[i].data.fd == listener_) {
          accept();
        } else {
          serve(events[i].data.fd, events[i].events);
        }
      }
    }
    logLine("shutting down");
    for (auto& [fd, client] : clients_) close(fd);
    close(listener_);
    close(epoll_);
    // The entries are not freed, as Redis does not free its key space at exit: freeing them
    // would show as a drop of PSS at the end of every sampled run.
    if (log_ != stdout) fclose(log_);
    return 0;
  }

 private:
  static FILE* openLog(const std::string& path) {
    if (path.empty()) return stdout;
    FILE* file = fopen(path.c_str(), "a");
    if (file == nullptr) {
      fprintf(stderr, "handle_cache: cannot open --logfile %s: %s\n", path.c_str(),
              strerror(errno));
      exit(1);
    }
    return file;
  }

  void logLine(const std::string& line) {
    fprintf(log_, "%d: %s\n", getpid(), line.c_str());
    fflush(log_);
  }

  void listen() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(options_.port));
    if (inet_pton(AF_INET, options_.bind.c_str(), &address.sin_addr) != 1) {
      fprintf(stderr, "handle_cache: --bind: not an IPv4 address: %s\n", options_.bind.c_str());
      exit(1);
    }
    listener_ = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listener_ < 0) die("socket");
    int one = 1;
    setsockopt(listener_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(listener_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
      fprintf(stderr, "handle_cache: cannot listen on %s:%d: %s\n", options_.bind.c_str(),
              options_.port, strerror(errno));
      exit(1);
    }
    if (::listen(listener_, 128) != 0) die("listen");
    epoll_ = epoll_create1(EPOLL_CLOEXEC);
    if (epoll_ < 0) die("epoll_create1");
    watch(listener_, EPOLLIN, EPOLL_CTL_ADD);
  }

  void watch(int fd, uint32_t events, int operation) {
    epoll_event event{};
    event.events = events;
    event.data.fd = fd;
    if (epoll_ctl(epoll_, operation, fd, &event) != 0) die("epoll_ctl");
  }

  void accept() {
    for (;;) {
      int fd = accept4(listener_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
      if (fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
        if (errno == EMFILE || errno == ENFILE) return;  // try again on the next wakeup
        die("accept4");
      }
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
      clients_.emplace(fd, Client{fd, {}, {}, 0, false});
      watch(fd, EPOLLIN, EPOLL_CTL_ADD);
    }
  }

  void drop(int fd) {
    epoll_ctl(epoll_, EPOLL_CTL_DEL, fd, nullptr);
    close(fd);
    clients_.erase(fd);
  }

  void serve(int fd, uint32_t events) {
    auto found = clients_.find(fd);
    if (found == clients_.end()) return;
    Client& client = found->second;
    if (events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
      char chunk[kReadChunk];
      for (;;) {
        ssize_t n = read(fd, chunk, sizeof chunk);
        if (n > 0) {
          client.in.append(chunk, static_cast<size_t>(n));
          continue;
        }
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        drop(fd);  // EOF or a reset
        return;
      }
      process(client);
      if (shutdown_) return;
    }
    flush(client);
  }

  void process(Client& client) {
    size_t at = 0;
    while (at < client.in.size() && !client.closeAfterReply && !shutdown_) {
      ParseResult parsed = parseRequest(std::string_view(client.in).substr(at), arguments_);
      if (parsed.status == ParseStatus::kIncomplete) break;
      if (parsed.status == ParseStatus::kError) {
        replyError(client.out, std::string("ERR Protocol error: ") + parsed.error);
        client.closeAfterReply = true;
        break;
      }
      at += parsed.consumed;
      if (!arguments_.empty()) execute(client);
    }
    client.in.erase(0, at);
  }

  void flush(Client& client) {
    int fd = client.fd;
    while (client.written < client.out.size()) {
      ssize_t n = write(fd, client.out.data() + client.written, client.out.size() - client.written);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
        watch(fd, EPOLLIN | EPOLLOUT, EPOLL_CTL_MOD);
        return;
      }
      if (n < 0) {
        drop(fd);
        return;
      }
      client.written += static_cast<size_t>(n);
    }
    client.out.clear();
    client.written = 0;
    if (client.closeAfterReply) {
      drop(fd);
      return;
    }
    watch(fd, EPOLLIN, EPOLL_CTL_MOD);
  }

  // Redis's performEvictions: before a command, evict until the key space fits again.
  // False when it cannot (nothing left to evict, or no eviction policy).
  bool fitMemory() {
    if (options_.maxmemory == 0) return true;
    while (store_.usedMemory() > options_.maxmemory) {
      if (!options_.evict || !store_.evictOne(options_.samples)) return false;
    }
    return true;
  }

  void execute(Client& client) {
    std::string& out = client.out;
    std::string_view command = arguments_[0];
    size_t argc = arguments_.size();
    commands_++;
    bool fits = fitMemory();
    auto is = [&](std::string_view name) { return equalsIgnoreCase(command, name); };
    auto arity = [&](size_t min, size_t max) {
      if (argc >= min && argc <= max) return true;
      replyError(out, "ERR wrong number of arguments for '" + std::string(command) + "' command");
      return false;
    };
    if (is("SET")) {
      if (!arity(3, 3)) return;
      if (!fits) {
        replyError(out, "OOM command not allowed when used memory > 'maxmemory'.");
      } else if (!store_.set(arguments_[1], arguments_[2])) {
        replyError(out, "OOM the allocator has no memory for this entry");
      } else {
        replySimple(out, "OK");
      }
    } else if (is("GET")) {
      if (!arity(2, 2)) return;
      value_.clear();
      if (store_.get(arguments_[1], value_)) {
        replyBulk(out, value_);
      } else {
        replyNull(out);
      }
    } else if (is("DEL")) {
      if (!arity(2, SIZE_MAX)) return;
      int64_t removed = 0;
      for (size_t i = 1; i < argc; i++) removed += store_.erase(arguments_[i]) ? 1 : 0;
      replyInteger(out, removed);
    } else if (is("DBSIZE")) {
      if (arity(1, 1)) replyInteger(out, static_cast<int64_t>(store_.size()));
    } else if (is("PING")) {
      if (!arity(1, 2)) return;
      if (argc == 2) {
        replyBulk(out, arguments_[1]);
      } else {
        replySimple(out, "PONG");
      }
    } else if (is("INFO")) {
      replyBulk(out, info());
    } else if (is("CONFIG")) {
      config(out);
    } else if (is("MEMORY")) {
      if (argc == 2 && equalsIgnoreCase(arguments_[1], "MALLOC-STATS")) {
        mallocStats(out);
      } else {
        replyError(out, "ERR MEMORY takes MALLOC-STATS");
      }
    } else if (is("SHUTDOWN")) {
      if (argc == 2 && !isAny(arguments_[1], {"NOSAVE", "SAVE"})) {
        replyError(out, "ERR syntax error");
        return;
      }
      if (!arity(1, 2)) return;
      shutdown_ = true;  // Redis closes the connection without a reply
    } else if (is("QUIT")) {
      replySimple(out, "OK");
      client.closeAfterReply = true;
    } else if (is("COMMAND")) {
      replyArrayHeader(out, 0);  // redis-cli asks for the command table; it needs none
    } else {
      replyError(out, "ERR unknown command '" + std::string(command) + "'");
    }
  }

  static bool isAny(std::string_view word, std::initializer_list<std::string_view> names) {
    for (std::string_view name : names) {
      if (equalsIgnoreCase(word, name)) return true;
    }
    return false;
  }

  // The parameters CONFIG GET and SET know, as Redis names them.
  std::vector<std::pair<std::string, std::string>> parameters() const {
    return {{"maxmemory", std::to_string(options_.maxmemory)},
            {"maxmemory-policy", options_.evict ? "allkeys-lru" : "noeviction"},
            {"maxmemory-samples", std::to_string(options_.samples)},
            {"save", ""},
            {"appendonly", "no"},
            {"storage", Storage::kName}};
  }

  void config(std::string& out) {
    if (arguments_.size() == 3 && equalsIgnoreCase(arguments_[1], "GET")) {
      std::string_view pattern = arguments_[2];
      std::vector<std::pair<std::string, std::string>> matched;
      for (auto& parameter : parameters()) {
        if (pattern == "*" || equalsIgnoreCase(pattern, parameter.first))
          matched.push_back(parameter);
      }
      replyArrayHeader(out, 2 * matched.size());
      for (auto& [name, value] : matched) {
        replyBulk(out, name);
        replyBulk(out, value);
      }
      return;
    }
    if (arguments_.size() == 4 && equalsIgnoreCase(arguments_[1], "SET")) {
      std::string_view name = arguments_[2];
      std::string value(arguments_[3]);
      if (equalsIgnoreCase(name, "maxmemory")) {
        uint64_t bytes;
        if (!parseMemory(value, &bytes)) {
          replyError(out, "ERR Invalid argument '" + value + "' for CONFIG SET 'maxmemory'");
          return;
        }
        options_.maxmemory = bytes;
      } else if (equalsIgnoreCase(name, "maxmemory-samples")) {
        char* end;
        unsigned long samples = strtoul(value.c_str(), &end, 10);
        if (value.empty() || *end != '\0' || samples < 1 || samples > 64) {
          replyError(out,
                     "ERR Invalid argument '" + value + "' for CONFIG SET 'maxmemory-samples'");
          return;
        }
        options_.samples = samples;
      } else {
        replyError(out, "ERR Unsupported CONFIG parameter: " + std::string(name));
        return;
      }
      replySimple(out, "OK");
      return;
    }
    replyError(out, "ERR CONFIG takes GET <parameter> or SET <parameter> <value>");
  }

  // Redis's MEMORY MALLOC-STATS: the allocator's own report, here meshalloc's statistics in
  // JSON (its memory breakdown included, docs/memory.md), so that a client can take the heap
  // apart at any moment of a run. Under another allocator, an error.
  void mallocStats(std::string& out) {
    if (meshalloc_print_stats == nullptr) {
      replyError(out, "ERR MALLOC-STATS needs meshalloc (LD_PRELOAD=libmeshalloc.so)");
      return;
    }
    int fd = memfd_create("malloc-stats", 0);
    if (fd < 0) {
      replyError(out, std::string("ERR memfd_create: ") + strerror(errno));
      return;
    }
    meshalloc_print_stats(fd, 1);
    std::string report;
    char buffer[4096];
    ssize_t got;
    for (off_t at = 0; (got = pread(fd, buffer, sizeof buffer, at)) > 0; at += got) {
      report.append(buffer, static_cast<size_t>(got));
    }
    close(fd);
    replyBulk(out, report);
  }

  // INFO's text: the fields of Redis's INFO that the experiment reads, under Redis's names.
  std::string info() {
    rusage self{}, thread{};
    getrusage(RUSAGE_SELF, &self);
    getrusage(RUSAGE_THREAD, &thread);
    char text[2048];
    int length = snprintf(
        text, sizeof text,
        "# Server\r\nhandle_cache_version:%s\r\nstorage:%s\r\nprocess_id:%d\r\ntcp_port:%d\r\n"
        "\r\n# Clients\r\nconnected_clients:%zu\r\n"
        "\r\n# Memory\r\nused_memory:%zu\r\nused_memory_entries:%zu\r\nmaxmemory:%llu\r\n"
        "maxmemory_policy:%s\r\nhash_buckets:%zu\r\ncompacted_bytes:%zu\r\n"
        "\r\n# Stats\r\ntotal_commands_processed:%llu\r\nevicted_keys:%llu\r\n"
        "keyspace_hits:%llu\r\nkeyspace_misses:%llu\r\n"
        "\r\n# CPU\r\nused_cpu_sys:%.6f\r\nused_cpu_user:%.6f\r\nused_cpu_sys_main_thread:%.6f\r\n"
        "used_cpu_user_main_thread:%.6f\r\n"
        "\r\n# Keyspace\r\ndb0:keys=%zu,expires=0,avg_ttl=0\r\n",
        kVersion, Storage::kName, getpid(), options_.port, clients_.size(), store_.usedMemory(),
        store_.entryBytes(), static_cast<unsigned long long>(options_.maxmemory),
        options_.evict ? "allkeys-lru" : "noeviction", store_.buckets(), compacted_,
        static_cast<unsigned long long>(commands_),
        static_cast<unsigned long long>(store_.stats().evicted),
        static_cast<unsigned long long>(store_.stats().hits),
        static_cast<unsigned long long>(store_.stats().misses), seconds(self.ru_stime),
        seconds(self.ru_utime), seconds(thread.ru_stime), seconds(thread.ru_utime), store_.size());
    std::string result(text, static_cast<size_t>(length));
    if constexpr (std::is_same_v<Storage, HandleStorage>) {
      // What meshalloc's defragmenter did to the entries (its "handles.*" statistics).
      result += "\r\n# Handles\r\n";
      for (const char* name : kHandleStatistics) {
        result += std::string("handles_") + name + ":" +
                  std::to_string(HandleStorage::statistic(name)) + "\r\n";
      }
    }
    return result;
  }

  Options options_;
  Store<Storage> store_;
  FILE* log_;
  int listener_ = -1;
  int epoll_ = -1;
  bool shutdown_ = false;
  uint64_t commands_ = 0;
  size_t compacted_ = 0;
  std::unordered_map<int, Client> clients_;
  std::vector<std::string_view> arguments_;
  std::string value_;
};

}  // namespace

}  // namespace handle_cache

int main(int argc, char** argv) {
  using namespace handle_cache;
  Options options = parseOptions(argc, argv);
  if (!options.dir.empty() && chdir(options.dir.c_str()) != 0) {
    fprintf(stderr, "handle_cache: cannot change to --dir %s: %s\n", options.dir.c_str(),
            strerror(errno));
    return 1;
  }
  if (options.storage == HandleStorage::kName) {
    if (!HandleStorage::available()) {
      fprintf(stderr,
              "handle_cache: --storage handles needs the handle API (mh_alloc ...): run it with "
              "LD_PRELOAD=libmeshalloc.so of a build that has include/meshalloc_handle.h\n");
      return 1;
    }
    return Server<HandleStorage>(options).run();
  }
  if (options.compactIntervalMs != 0) {
    fprintf(stderr, "handle_cache: --compact-interval-ms needs --storage handles\n");
    return 1;
  }
  return Server<MallocStorage>(options).run();
}
