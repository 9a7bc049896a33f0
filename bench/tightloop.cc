// tight-loop: the simplest malloc benchmark, the pattern of glibc's single-threaded malloc
// benchmark. One thread mallocs a small block (16 - 128 bytes, uniform), writes a tag in its
// first word and frees it, over and over; with --batch=N it mallocs N blocks, then checks and
// frees them in the order they were made (first in, first out), so the allocator pops and
// pushes N different blocks of several size classes rather than one. Nothing else happens in
// the loop and the sizes come from a precomputed cycle: the time is the allocator's fast path
// (size-class lookup, thread-cache pop and push), which the heavier benchmarks bury under
// their own memory traffic. --iterations counts mallocs, whatever the batch.
#include <iterator>

#include "common.h"

namespace {

uint64_t gIterations = 25000000, gBatch = 1, gMin = 16, gMax = 128, gSeed = 1;

// Sizes cycled through: long enough that the size sequence is no pattern a branch predictor
// learns, short enough to stay in the L1 cache beside the blocks.
constexpr size_t kCycle = 4096;
constexpr uint64_t kMaxBatch = 64;

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "mallocs (and frees) in all"},
      {"batch", &gBatch, "blocks allocated before they are freed, 1 - 64"},
      {"min", &gMin, "smallest block size, at least 8"},
      {"max", &gMax, "largest block size"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "tight-loop", options);
  if (gBatch < 1 || gBatch > kMaxBatch || gMin < 8 || gMin > gMax)
    bench::usage(argv[0], "tight-loop", options, std::size(options), "bad values");

  bench::Rng rng(gSeed);
  uint32_t* sizes = bench::precompute(kCycle, [&] { return rng.between(gMin, gMax); });
  void* blocks[kMaxBatch];
  const uint64_t rounds = gIterations / gBatch;
  uint64_t checksum = 0, made = 0;

  double start = bench::now();
  for (uint64_t round = 0; round < rounds; round++) {
    const uint64_t first = made;
    for (uint64_t j = 0; j < gBatch; j++, made++) {
      const size_t size = sizes[made % kCycle];
      blocks[j] = bench::mustMalloc(size);
      bench::touchWord(blocks[j], bench::tagFor(made, size));
    }
    for (uint64_t j = 0; j < gBatch; j++) {
      const uint64_t id = first + j;
      checksum += bench::checkWord(blocks[j], bench::tagFor(id, sizes[id % kCycle]));
      free(blocks[j]);
    }
  }
  double seconds = bench::now() - start;

  bench::report("tight-loop", 1, seconds, made, checksum);
  free(sizes);
  return 0;
}
