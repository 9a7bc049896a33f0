#include "options.h"

#include <stdio.h>
#include <stdlib.h>
#include <strings.h>

#include <charconv>

namespace handle_cache {

namespace {

[[noreturn]] void fail(const std::string& message) {
  fprintf(stderr, "handle_cache: %s\n", message.c_str());
  exit(1);
}

uint64_t parseCount(std::string_view name, std::string_view text, uint64_t min, uint64_t max) {
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || ptr != text.data() + text.size() || value < min || value > max) {
    fail("bad value for --" + std::string(name) + ": '" + std::string(text) + "' (expected " +
         std::to_string(min) + ".." + std::to_string(max) + ")");
  }
  return value;
}

// redis-server options the experiment passes that must have the one value this cache
// implements (no persistence, no daemon).
bool fixedValue(std::string_view name, std::string_view value) {
  if (name == "save") return value.empty();
  if (name == "appendonly" || name == "daemonize")
    return strcasecmp(std::string(value).c_str(), "no") == 0;
  if (name == "protected-mode") return value == "yes" || value == "no";
  return false;
}

}  // namespace

bool parseMemory(std::string_view text, uint64_t* bytes) {
  struct Unit {
    const char* suffix;
    uint64_t scale;
  };
  // Longest suffixes first; Redis's memtoull.
  static const Unit kUnits[] = {{"kb", 1024}, {"mb", 1024 * 1024}, {"gb", 1024ULL << 20},
                                {"k", 1000},  {"m", 1000 * 1000},  {"g", 1000 * 1000 * 1000},
                                {"b", 1}};
  uint64_t scale = 1;
  std::string lower(text);
  for (char& c : lower) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
  std::string_view digits = lower;
  for (const Unit& unit : kUnits) {
    std::string_view suffix = unit.suffix;
    if (digits.size() > suffix.size() && digits.substr(digits.size() - suffix.size()) == suffix) {
      digits.remove_suffix(suffix.size());
      scale = unit.scale;
      break;
    }
  }
  uint64_t value = 0;
  auto [ptr, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (digits.empty() || ec != std::errc() || ptr != digits.data() + digits.size()) return false;
  if (value > UINT64_MAX / scale) return false;
  *bytes = value * scale;
  return true;
}

Options parseOptions(int argc, char** argv) {
  Options options;
  for (int i = 1; i < argc; i++) {
    std::string_view word = argv[i];
    if (word == "--help" || word == "-h") {
      printf(
          "usage: handle_cache [--storage malloc|handles] [--port N] [--bind ADDR] "
          "[--maxmemory SIZE] [--maxmemory-policy allkeys-lru|noeviction] "
          "[--maxmemory-samples N] [--dir DIR] [--logfile FILE] [--compact-interval-ms N] "
          "[--compact-budget-us N] [--seed N]\n");
      exit(0);
    }
    if (word.substr(0, 2) != "--") fail("unexpected argument '" + std::string(word) + "'");
    std::string_view name = word.substr(2);
    if (i + 1 >= argc) fail("missing value after " + std::string(word));
    std::string_view value = argv[++i];
    if (name == "storage") {
      if (value != "malloc" && value != "handles") {
        fail("--storage must be malloc or handles, not '" + std::string(value) + "'");
      }
      options.storage = value;
    } else if (name == "port") {
      options.port = static_cast<int>(parseCount(name, value, 1, 65535));
    } else if (name == "bind") {
      options.bind = value;
    } else if (name == "maxmemory") {
      if (!parseMemory(value, &options.maxmemory)) {
        fail("bad value for --maxmemory: '" + std::string(value) + "' (e.g. 100mb)");
      }
    } else if (name == "maxmemory-policy") {
      if (value != "allkeys-lru" && value != "noeviction") {
        fail("--maxmemory-policy: only allkeys-lru and noeviction, not '" + std::string(value) +
             "'");
      }
      options.evict = value == "allkeys-lru";
    } else if (name == "maxmemory-samples") {
      options.samples = parseCount(name, value, 1, 64);
    } else if (name == "dir") {
      options.dir = value;
    } else if (name == "logfile") {
      options.logfile = value;
    } else if (name == "compact-interval-ms") {
      options.compactIntervalMs = parseCount(name, value, 0, 3600 * 1000);
    } else if (name == "compact-budget-us") {
      options.compactBudgetUs = parseCount(name, value, 0, 10 * 1000 * 1000);
    } else if (name == "seed") {
      options.seed = parseCount(name, value, 0, UINT64_MAX);
    } else if (fixedValue(name, "") || name == "appendonly" || name == "daemonize" ||
               name == "protected-mode") {
      if (!fixedValue(name, value)) {
        fail("--" + std::string(name) + " '" + std::string(value) +
             "' is not supported (no persistence, no daemon)");
      }
    } else {
      fail("unknown option '" + std::string(word) + "'");
    }
  }
  return options;
}

}  // namespace handle_cache
