// turnover: an allocation-heavy single-threaded program whose working set turns over, the
// pattern of espresso (a logic minimiser: a few thousand small cubes and covers live at once,
// most of them replaced soon after they were made, some kept for a long time). --slots live
// blocks of 8 - 512 bytes (log-uniform: half of them 64 bytes or less); each step frees a
// random block in a window of --window slots and mallocs a new one of a random size in its
// place, and the window moves on by one slot per step. A block made in the window is likely
// replaced again before the window has passed (a short life), and one that the window leaves
// behind lives until it comes round again (a long one), so the allocator sees short-lived
// blocks freed amid long-lived ones of the same size classes, in an order no LIFO cache
// predicts. Only the first word of a block is touched, so the time is the allocator's.
#include <iterator>

#include "common.h"

namespace {

uint64_t gIterations = 40000000, gSlots = 4096, gWindow = 256, gMin = 8, gMax = 512, gSeed = 1;

}  // namespace

int main(int argc, char** argv) {
  const bench::Option options[] = {
      {"iterations", &gIterations, "free+malloc replacements"},
      {"slots", &gSlots, "live blocks (a power of two, at most 65536)"},
      {"window", &gWindow, "slots a step chooses from, at most --slots"},
      {"min", &gMin, "smallest block size, at least 8"},
      {"max", &gMax, "largest block size, below 64 KiB"},
      {"seed", &gSeed, "random seed"},
  };
  bench::parseOptions(argc, argv, "turnover", options);
  if (!bench::WorkingSet::fits(gSlots, gMin, gMax, gWindow))
    bench::usage(argv[0], "turnover", options, std::size(options), "bad values");

  bench::Rng rng(gSeed);
  const bench::WorkingSet blocks(rng, gSlots, gMin, gMax, gWindow);
  double start = bench::now();
  const uint64_t checksum = blocks.run(gIterations, 1, 0);
  double seconds = bench::now() - start;

  bench::report("turnover", 1, seconds, gSlots + gIterations, checksum);
  return 0;
}
