// Built against an installed meshalloc (tests/install/install_test.sh), dynamically or
// statically: checks through meshalloc_mallctl that operator new is meshalloc's.
#include <meshalloc.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr std::size_t kBlocks = 1000;
constexpr std::size_t kBlockSize = 1000;

std::size_t readSize(const char* name) {
  std::uint64_t epoch = 1;
  std::size_t len = sizeof epoch;
  if (meshalloc_mallctl("epoch", &epoch, &len, &epoch, sizeof epoch) != 0) {
    std::fprintf(stderr, "program.cc: mallctl(\"epoch\") failed\n");
    std::exit(1);
  }
  std::size_t value = 0;
  len = sizeof value;
  if (int error = meshalloc_mallctl(name, &value, &len, nullptr, 0); error != 0) {
    std::fprintf(stderr, "program.cc: mallctl(\"%s\") failed: %d\n", name, error);
    std::exit(1);
  }
  return value;
}

}  // namespace

int main() {
  const char* version = nullptr;
  std::size_t len = sizeof version;
  if (meshalloc_mallctl("version", &version, &len, nullptr, 0) != 0 || version == nullptr) {
    std::fprintf(stderr, "program.cc: mallctl(\"version\") failed\n");
    return 1;
  }
  std::vector<std::unique_ptr<char[]>> blocks;
  blocks.reserve(kBlocks);
  std::size_t before = readSize("stats.allocated");
  for (std::size_t i = 0; i < kBlocks; i++) {
    blocks.emplace_back(new char[kBlockSize]);
    blocks.back()[kBlockSize - 1] = static_cast<char>(i);
  }
  std::size_t after = readSize("stats.allocated");
  if (after < before + kBlocks * kBlockSize) {
    std::fprintf(stderr,
                 "program.cc: operator new is not meshalloc's: stats.allocated %zu -> %zu\n",
                 before, after);
    return 1;
  }
  std::string text = "C++ program: meshalloc " + std::string(version);
  std::printf("%s, stats.allocated +%zu bytes\n", text.c_str(), after - before);
  return 0;
}
