#include "heap/config.h"

#include <cstring>

#include "platform/os.h"
#include "support/decimal.h"
#include "support/text_writer.h"

namespace meshalloc {

namespace {

constexpr char kEnvPrefix[] = "MESHALLOC_";
constexpr size_t kMaxNameLength = 64;

const OptionView kOptions[] = {
    {"mesh", OptionView::kBool, &gHeapConfig.meshing},
    {"randomize", OptionView::kRandomization, &gHeapConfig.randomization},
    {"dirty_cache", OptionView::kSize, &gHeapConfig.dirtyCacheBytes},
    {"dirty_cache_percent", OptionView::kUnsigned, &gHeapConfig.dirtyCachePercent},
    {"decay_ms", OptionView::kUnsigned, &gHeapConfig.decayMs},
    {"max_cached_run", OptionView::kSize, &gHeapConfig.maxCachedRunBytes},
    {"large_colouring", OptionView::kBool, &gHeapConfig.largeColouring},
    {"mesh_period_ms", OptionView::kUnsigned, &gHeapConfig.meshPeriodMs},
    {"mesh_budget_permille", OptionView::kUnsigned, &gHeapConfig.meshBudgetPermille},
    {"mesh_budget_max_permille", OptionView::kUnsigned, &gHeapConfig.meshBudgetMaxPermille},
    {"mesh_probes", OptionView::kUnsigned, &gHeapConfig.meshProbes},
    {"mesh_background", OptionView::kBool, &gHeapConfig.meshBackgroundThread},
    {"mesh_thread_nice", OptionView::kUnsigned, &gHeapConfig.meshThreadNice},
    {"idle_reclaim_ms", OptionView::kUnsigned, &gHeapConfig.idleReclaimMs},
    {"mesh_occupancy_percent", OptionView::kUnsigned, &gHeapConfig.meshOccupancyPercent},
    {"mesh_min_gain", OptionView::kSize, &gHeapConfig.meshMinGainBytes},
    {"handles_defrag", OptionView::kBool, &gHeapConfig.handlesDefrag},
    {"handles_period_ms", OptionView::kUnsigned, &gHeapConfig.handlesPeriodMs},
    {"handles_frag_high_permille", OptionView::kUnsigned, &gHeapConfig.handlesFragHighPermille},
    {"handles_frag_low_permille", OptionView::kUnsigned, &gHeapConfig.handlesFragLowPermille},
    {"handles_budget_permille", OptionView::kUnsigned, &gHeapConfig.handlesBudgetPermille},
    {"handles_move_permille", OptionView::kUnsigned, &gHeapConfig.handlesMovePermille},
    {"handles_min_gain", OptionView::kSize, &gHeapConfig.handlesMinGainBytes},
    {"stats", OptionView::kStatsFormat, &gHeapConfig.statsAtExit},
    {"stats_file", OptionView::kString, &gHeapConfig.statsFile},
    {"live_stats_ms", OptionView::kUnsigned, &gHeapConfig.liveStatsMs},
    {"show_options", OptionView::kBool, &gHeapConfig.showOptions},
};

void warn(const char* source, const char* value, const char* why) {
  char buffer[256];
  TextWriter out(buffer, sizeof(buffer));
  out.text("meshalloc: ignoring ")
      .text(source)
      .text("=")
      .text(value)
      .text(": ")
      .text(why)
      .text("\n");
  os::writeStderr(out.data(), out.length());
}

bool equalsIgnoreCase(const char* a, size_t length, const char* b) {
  if (strlen(b) != length) return false;
  for (size_t i = 0; i < length; i++) {
    char x = a[i] >= 'A' && a[i] <= 'Z' ? static_cast<char>(a[i] - 'A' + 'a') : a[i];
    if (x != b[i]) return false;
  }
  return true;
}

bool parseUnsigned(const char* text, size_t length, uint64_t* out, bool allowSuffix) {
  const char* cursor = text;
  uint64_t value;
  if (!parseDecimal(cursor, text + length, &value)) return false;
  size_t i = static_cast<size_t>(cursor - text);
  if (i < length && allowSuffix) {
    unsigned shift = 0;
    switch (text[i]) {
      case 'k':
      case 'K':
        shift = 10;
        break;
      case 'm':
      case 'M':
        shift = 20;
        break;
      case 'g':
      case 'G':
        shift = 30;
        break;
      default:
        return false;
    }
    i++;
    if (i < length && (text[i] == 'b' || text[i] == 'B' || text[i] == 'i')) i++;  // "KiB", "MB"
    if (i < length && (text[i] == 'b' || text[i] == 'B')) i++;
    if (value > (UINT64_MAX >> shift)) return false;
    value <<= shift;
  }
  if (i != length) return false;
  *out = value;
  return true;
}

// Applies one textual value to an option; returns an explanation on failure.
const char* apply(const OptionView& option, const char* value, size_t length) {
  uint64_t number = 0;
  switch (option.kind) {
    case OptionView::kBool:
      if (equalsIgnoreCase(value, length, "1") || equalsIgnoreCase(value, length, "on") ||
          equalsIgnoreCase(value, length, "true") || equalsIgnoreCase(value, length, "yes")) {
        *static_cast<bool*>(option.field) = true;
      } else if (equalsIgnoreCase(value, length, "0") || equalsIgnoreCase(value, length, "off") ||
                 equalsIgnoreCase(value, length, "false") ||
                 equalsIgnoreCase(value, length, "no")) {
        *static_cast<bool*>(option.field) = false;
      } else {
        return "expected 1/0, on/off, true/false";
      }
      return nullptr;
    case OptionView::kUnsigned:
      if (!parseUnsigned(value, length, &number, false)) return "expected a non-negative integer";
      *static_cast<uint64_t*>(option.field) = number;
      return nullptr;
    case OptionView::kSize:
      if (!parseUnsigned(value, length, &number, true))
        return "expected a size such as 4096, 64K, 8M or 1G";
      *static_cast<size_t*>(option.field) = number;
      return nullptr;
    case OptionView::kRandomization:
      if (length != 1 || value[0] < '0' || value[0] > '3') return "expected 0, 1, 2 or 3";
      *static_cast<Randomization*>(option.field) = static_cast<Randomization>(value[0] - '0');
      return nullptr;
    case OptionView::kStatsFormat:
      if (equalsIgnoreCase(value, length, "json")) {
        *static_cast<StatsFormat*>(option.field) = StatsFormat::kJson;
      } else if (equalsIgnoreCase(value, length, "text") || equalsIgnoreCase(value, length, "1") ||
                 equalsIgnoreCase(value, length, "on")) {
        *static_cast<StatsFormat*>(option.field) = StatsFormat::kText;
      } else if (equalsIgnoreCase(value, length, "0") || equalsIgnoreCase(value, length, "off")) {
        *static_cast<StatsFormat*>(option.field) = StatsFormat::kNone;
      } else {
        return "expected text, json or 0";
      }
      return nullptr;
    case OptionView::kString:
      return "cannot be set inside MESHALLOC_CONF; use its own variable";
  }
  return "unknown option kind";
}

// "0n 2n 0y 1y 2y": the artifact's names for randomisation level x meshing off/on; 1n, and
// level 3 (not the paper's), are accepted too.
bool applyPaperConfig(const char* value) {
  if (strlen(value) != 2 || value[0] < '0' || value[0] > '3' ||
      (value[1] != 'n' && value[1] != 'y'))
    return false;
  gHeapConfig.randomization = static_cast<Randomization>(value[0] - '0');
  gHeapConfig.meshing = value[1] == 'y';
  return true;
}

void applyConfString(const char* conf) {
  const char* cursor = conf;
  while (*cursor) {
    const char* end = strchr(cursor, ',');
    if (!end) end = cursor + strlen(cursor);
    const char* colon =
        static_cast<const char*>(memchr(cursor, ':', static_cast<size_t>(end - cursor)));
    char entry[kMaxNameLength * 2];
    size_t entryLength = static_cast<size_t>(end - cursor) < sizeof(entry) - 1
                             ? static_cast<size_t>(end - cursor)
                             : sizeof(entry) - 1;
    memcpy(entry, cursor, entryLength);
    entry[entryLength] = '\0';
    if (!colon) {
      if (entryLength) warn("MESHALLOC_CONF entry", entry, "expected name:value");
    } else {
      size_t nameLength = static_cast<size_t>(colon - cursor);
      const OptionView* match = nullptr;
      for (const OptionView& option : kOptions) {
        if (equalsIgnoreCase(cursor, nameLength, option.name)) match = &option;
      }
      if (!match) {
        warn("MESHALLOC_CONF entry", entry, "unknown option");
      } else if (const char* why = apply(*match, colon + 1, static_cast<size_t>(end - colon - 1))) {
        warn("MESHALLOC_CONF entry", entry, why);
      }
    }
    cursor = *end ? end + 1 : end;
  }
}

}  // namespace

constexpr size_t kMaxStringOptions = 4;
constexpr size_t kMaxStringOptionLength = 4096;

void loadConfigFromEnvironment() {
  if (const char* paper = os::getEnv("MESHALLOC_CONFIG")) {
    if (!applyPaperConfig(paper))
      warn("MESHALLOC_CONFIG", paper, "expected one of 0n 1n 2n 3n 0y 1y 2y 3y");
  }
  if (const char* conf = os::getEnv("MESHALLOC_CONF")) applyConfString(conf);
  for (const OptionView& option : kOptions) {
    char variable[sizeof(kEnvPrefix) + kMaxNameLength];
    TextWriter name(variable, sizeof(variable));
    name.text(kEnvPrefix);
    for (const char* c = option.name; *c; c++)
      name.put(*c >= 'a' && *c <= 'z' ? static_cast<char>(*c - 'a' + 'A') : *c);
    const char* value = os::getEnv(name.cString());
    if (!value) continue;
    if (option.kind == OptionView::kString) {
      // Copied: programs rewrite their environment block (Redis puts its process title there).
      static char copies[kMaxStringOptions][kMaxStringOptionLength];
      static size_t used = 0;
      size_t length = strlen(value);
      if (used >= kMaxStringOptions || length >= kMaxStringOptionLength) {
        warn(variable, value, "too long");
        continue;
      }
      memcpy(copies[used], value, length + 1);
      *static_cast<const char**>(option.field) = copies[used++];
    } else if (const char* why = apply(option, value, strlen(value))) {
      warn(variable, value, why);
    }
  }
}

const OptionView* findOption(const char* name) {
  for (const OptionView& option : kOptions) {
    if (strcmp(option.name, name) == 0) return &option;
  }
  return nullptr;
}
const OptionView* optionsBegin() {
  return kOptions;
}
const OptionView* optionsEnd() {
  return kOptions + sizeof(kOptions) / sizeof(kOptions[0]);
}

void writeOptionValue(TextWriter& out, const OptionView& option, bool json) {
  switch (option.kind) {
    case OptionView::kBool:
      out.boolean(*static_cast<bool*>(option.field));
      break;
    case OptionView::kUnsigned:
      out.unsignedValue(*static_cast<uint64_t*>(option.field));
      break;
    case OptionView::kSize:
      out.unsignedValue(*static_cast<size_t*>(option.field));
      break;
    case OptionView::kRandomization:
      out.unsignedValue(static_cast<unsigned>(*static_cast<Randomization*>(option.field)));
      break;
    case OptionView::kStatsFormat: {
      StatsFormat format = *static_cast<StatsFormat*>(option.field);
      if (json) out.put('"');
      out.text(format == StatsFormat::kJson   ? "json"
               : format == StatsFormat::kText ? "text"
                                              : "off");
      if (json) out.put('"');
      break;
    }
    case OptionView::kString: {
      const char* value = *static_cast<const char**>(option.field);
      if (!value) {
        out.text(json ? "null" : "(unset)");
        break;
      }
      if (json) out.put('"');
      for (const char* c = value; *c; c++) {
        if (json && (*c == '"' || *c == '\\')) out.put('\\');
        if (static_cast<unsigned char>(*c) >= 0x20) out.put(*c);
      }
      if (json) out.put('"');
      break;
    }
  }
}

void printConfig(int fd) {
  char buffer[2048];
  TextWriter out(buffer, sizeof(buffer));
  out.text("meshalloc options:\n");
  for (const OptionView& option : kOptions) {
    out.text("  ").text(option.name).text(" = ");
    writeOptionValue(out, option, false);
    out.text("\n");
  }
  os::writeFd(fd, out.data(), out.length());
}

}  // namespace meshalloc
