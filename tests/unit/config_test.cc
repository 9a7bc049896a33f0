#include "heap/config.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include "api/ctl.h"
#include "heap/heap.h"

namespace meshalloc {
namespace {

class ConfigTest : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = gHeapConfig; }
  void TearDown() override {
    for (const char* name : {"MESHALLOC_CONFIG", "MESHALLOC_CONF", "MESHALLOC_MESH",
                             "MESHALLOC_RANDOMIZE", "MESHALLOC_DIRTY_CACHE", "MESHALLOC_STATS"}) {
      unsetenv(name);
    }
    gHeapConfig = saved_;
  }
  HeapConfig saved_;
};

TEST_F(ConfigTest, PaperConfigurationNamesSetMeshingAndRandomization) {
  struct Case {
    const char* name;
    bool mesh;
    Randomization level;
  } cases[] = {{"0n", false, Randomization::kNone},
               {"2n", false, Randomization::kOnRefillAndFree},
               {"0y", true, Randomization::kNone},
               {"1y", true, Randomization::kOnRefill},
               {"2y", true, Randomization::kOnRefillAndFree},
               {"3n", false, Randomization::kRotatedRuns},
               {"3y", true, Randomization::kRotatedRuns}};
  for (const Case& c : cases) {
    setenv("MESHALLOC_CONFIG", c.name, 1);
    loadConfigFromEnvironment();
    EXPECT_EQ(gHeapConfig.meshing, c.mesh) << c.name;
    EXPECT_EQ(gHeapConfig.randomization, c.level) << c.name;
  }
}

TEST_F(ConfigTest, ConfStringAndVariablesWithSuffixes) {
  setenv("MESHALLOC_CONF", "mesh:off,randomize:1,dirty_cache:64K", 1);
  loadConfigFromEnvironment();
  EXPECT_FALSE(gHeapConfig.meshing);
  EXPECT_EQ(gHeapConfig.randomization, Randomization::kOnRefill);
  EXPECT_EQ(gHeapConfig.dirtyCacheBytes, 64u << 10);
  // A dedicated variable wins over the CONF string.
  setenv("MESHALLOC_DIRTY_CACHE", "2MiB", 1);
  setenv("MESHALLOC_MESH", "on", 1);
  setenv("MESHALLOC_STATS", "json", 1);
  loadConfigFromEnvironment();
  EXPECT_EQ(gHeapConfig.dirtyCacheBytes, 2u << 20);
  EXPECT_TRUE(gHeapConfig.meshing);
  EXPECT_EQ(gHeapConfig.statsAtExit, StatsFormat::kJson);
}

TEST_F(ConfigTest, BadValuesKeepTheDefaultAndWarn) {
  setenv("MESHALLOC_RANDOMIZE", "7", 1);
  setenv("MESHALLOC_DIRTY_CACHE", "lots", 1);
  testing::internal::CaptureStderr();
  loadConfigFromEnvironment();
  std::string warnings = testing::internal::GetCapturedStderr();
  EXPECT_EQ(gHeapConfig.randomization, saved_.randomization);
  EXPECT_EQ(gHeapConfig.dirtyCacheBytes, saved_.dirtyCacheBytes);
  EXPECT_NE(warnings.find("MESHALLOC_RANDOMIZE=7"), std::string::npos) << warnings;
  EXPECT_NE(warnings.find("MESHALLOC_DIRTY_CACHE=lots"), std::string::npos) << warnings;
}

TEST(Control, JemallocNamesAndErrors) {
  ASSERT_TRUE(heap::ensureInitialized());
  uint64_t epoch = 1;
  size_t length = sizeof(epoch);
  ASSERT_EQ(api::control("epoch", &epoch, &length, &epoch, sizeof(epoch)), 0);
  size_t allocated = 0;
  length = sizeof(allocated);
  EXPECT_EQ(api::control("stats.allocated", &allocated, &length, nullptr, 0), 0);
  unsigned narenas = 0;
  length = sizeof(narenas);
  EXPECT_EQ(api::control("arenas.narenas", &narenas, &length, nullptr, 0), 0);
  EXPECT_EQ(narenas, 1u);
  size_t size = 0;
  length = sizeof(size);
  EXPECT_EQ(api::control("arenas.bin.3.size", &size, &length, nullptr, 0), 0);
  EXPECT_EQ(size, 64u);
  bool mesh = false;
  length = sizeof(mesh);
  EXPECT_EQ(api::control("opt.mesh", &mesh, &length, nullptr, 0), 0);
  EXPECT_EQ(api::control("opt.mesh", nullptr, nullptr, &mesh, sizeof(mesh)), EPERM);
  EXPECT_EQ(api::control("no.such.name", nullptr, nullptr, nullptr, 0), ENOENT);
  length = 1;
  EXPECT_EQ(api::control("stats.allocated", &allocated, &length, nullptr, 0), EINVAL);
  EXPECT_EQ(api::control("arena.0.purge", nullptr, nullptr, nullptr, 0), 0);
  EXPECT_EQ(api::control("thread.tcache.flush", nullptr, nullptr, nullptr, 0), 0);
}

}  // namespace
}  // namespace meshalloc
