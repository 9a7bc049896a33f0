// The heap's counters are declared once (api/stats.h, MESHALLOC_HEAP_STATISTICS): each one is a
// mallctl name and a line of the exit report, with the same value in both.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <set>
#include <string>

#include "api/ctl.h"
#include "api/stats.h"
#include "heap/heap.h"

namespace meshalloc {
namespace {

std::string report(bool json) {
  FILE* file = tmpfile();
  EXPECT_NE(file, nullptr);
  if (!file) return {};
  api::writeStats(fileno(file), json);
  std::string text;
  char buffer[4096];
  rewind(file);
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, file)) > 0) text.append(buffer, n);
  fclose(file);
  return text;
}

// The number after `"key":` in the report's JSON "stats" object.
bool jsonStat(const std::string& json, const std::string& key, uint64_t* value) {
  size_t stats = json.find("\"stats\":{");
  if (stats == std::string::npos) return false;
  size_t at = json.find("\"" + key + "\":", stats);
  if (at == std::string::npos || at > json.find('}', stats)) return false;
  *value = strtoull(json.c_str() + at + key.size() + 3, nullptr, 10);
  return true;
}

TEST(Statistics, EachCounterIsAMallctlNameAndAReportLineWithOneValue) {
  ASSERT_TRUE(heap::ensureInitialized());
  void* kept = heap::allocate(1000);
  ASSERT_NE(kept, nullptr);
  std::set<std::string> ctlNames;
  std::set<std::string> reportNames;
  // Refreshes the snapshot mallctl reads; nothing allocates between it and the report.
  uint64_t epoch = 1;
  ASSERT_EQ(api::control("epoch", nullptr, nullptr, &epoch, sizeof epoch), 0);
  std::string json = report(true);
  std::string text = report(false);
  for (size_t i = 0; i < api::kHeapStatisticCount; i++) {
    const api::HeapStatistic& s = api::kHeapStatistics[i];
    EXPECT_TRUE(ctlNames.insert(s.ctlName).second) << "duplicate mallctl name " << s.ctlName;
    EXPECT_TRUE(reportNames.insert(s.reportName).second)
        << "duplicate report name " << s.reportName;
    size_t viaCtl = 0;
    size_t length = sizeof viaCtl;
    EXPECT_EQ(api::control(s.ctlName, &viaCtl, &length, nullptr, 0), 0) << s.ctlName;
    uint64_t inReport = 0;
    EXPECT_TRUE(jsonStat(json, s.reportName, &inReport)) << s.reportName << " not in the report";
    EXPECT_NE(text.find(std::string("  ") + s.reportName + " "), std::string::npos)
        << s.reportName << " not in the text report";
    // Counters that only grow or stay put between the two readings are compared exactly.
    std::string name = s.ctlName;
    if (name == "stats.allocated" || name == "stats.large.count" || name == "mesh.count" ||
        name == "stats.thread_heaps") {
      EXPECT_EQ(viaCtl, inReport) << name;
    }
  }
  size_t allocated = 0;
  size_t length = sizeof allocated;
  ASSERT_EQ(api::control("stats.allocated", &allocated, &length, nullptr, 0), 0);
  EXPECT_GE(allocated, 1000u);
  heap::deallocate(kept);
}

}  // namespace
}  // namespace meshalloc
