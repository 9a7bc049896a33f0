// Replays the fuzzer's seed corpus (tests/fuzz/corpus) and the inputs of crashes it found
// through the same driver, in every build (gcc release, ASan/UBSan, TSan): no clang needed.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "heap_driver.h"

namespace meshalloc::fuzz {
namespace {

std::vector<uint8_t> readFile(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

TEST(FuzzReplay, SeedCorpus) {
  std::vector<std::filesystem::path> inputs;
  for (const auto& entry : std::filesystem::directory_iterator(MESHALLOC_FUZZ_CORPUS))
    if (entry.is_regular_file()) inputs.push_back(entry.path());
  std::sort(inputs.begin(), inputs.end());
  ASSERT_FALSE(inputs.empty()) << "no inputs in " << MESHALLOC_FUZZ_CORPUS;
  uint64_t operations = 0, remoteFrees = 0, compacts = 0, forks = 0;
  for (const auto& path : inputs) {
    SCOPED_TRACE(path.string());
    std::vector<uint8_t> data = readFile(path);
    ProgramStats s = runHeapProgram(data.data(), data.size());  // aborts on a wrong answer
    operations += s.operations;
    remoteFrees += s.remoteFrees;
    compacts += s.compacts;
    forks += s.forks;
  }
  // The corpus reaches every kind of step the driver has.
  EXPECT_GT(operations, 1000u);
  EXPECT_GT(remoteFrees, 0u);
  EXPECT_GT(compacts, 0u);
  EXPECT_GT(forks, 0u);
}

TEST(FuzzReplay, EmptyAndTinyPrograms) {
  runHeapProgram(nullptr, 0);
  for (unsigned op = 0; op < 256; op++) {
    uint8_t program[] = {static_cast<uint8_t>(op), 1, 2, 3, 4, 5, 6, 7};
    runHeapProgram(program, sizeof(program));
  }
}

}  // namespace
}  // namespace meshalloc::fuzz
