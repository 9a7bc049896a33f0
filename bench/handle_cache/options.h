// The server's command line: the options redis-server takes in the Redis LRU experiment
// (redis_support.py passes the same ones to both servers), and the cache's own.
#ifndef HANDLE_CACHE_OPTIONS_H
#define HANDLE_CACHE_OPTIONS_H

#include <stdint.h>

#include <string>
#include <string_view>

namespace handle_cache {

struct Options {
  std::string storage = "malloc";  // --storage malloc|handles
  int port = 6379;
  std::string bind = "127.0.0.1";
  uint64_t maxmemory = 0;           // bytes; 0: no limit (Redis's default)
  bool evict = false;               // --maxmemory-policy allkeys-lru (else noeviction)
  uint64_t samples = 5;             // --maxmemory-samples, Redis's default
  std::string dir;                  // --dir: the working directory
  std::string logfile;              // --logfile: "" is stdout
  uint64_t compactIntervalMs = 0;   // --compact-interval-ms: mh_compact every N ms (0: never)
  uint64_t compactBudgetUs = 1000;  // --compact-budget-us: the time each call may take
  uint64_t seed = 1;                // --seed: the sampling generator's
};

// Parses argv; on a bad option prints one line on stderr and exits with status 1.
Options parseOptions(int argc, char** argv);

// Redis's memory syntax: "100mb" (MiB), "100m" (10^6), "1gb", "4096"; false when malformed.
bool parseMemory(std::string_view text, uint64_t* bytes);

}  // namespace handle_cache

#endif
