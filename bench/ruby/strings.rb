#!/usr/bin/env ruby
# frozen_string_literal: true

# The string-retention workload of the Mesh paper's section 6.3 (figure 8), for
# `meshalloc bench ruby-strings` (docs/ruby-strings.md).
#
# Each round allocates a batch of equally long strings, keeps every fourth one, lets the
# garbage collector free the other three quarters, and holds on to the survivors until the
# end ("accumulating results from an API and periodically filtering some out"). The next
# round's strings are twice as long. MRI keeps only the string *headers* in its own
# object arena; every string longer than 23 bytes has its contents in a separate malloc
# block, so the allocator under test sees:
#
#   round 0: B bytes of S-byte blocks, then 3/4 of them freed, one live block in four
#   round 1: B/2 bytes of 2S-byte blocks, 3/4 freed
#   round k: B/2^k bytes of (S * 2^k)-byte blocks ...
#
# Freeing three blocks in every four, regularly, leaves every page of the small size
# classes a quarter full: a non-compacting allocator can return none of them, and the
# next round's blocks belong to another size class, so they cannot reuse the holes. A
# meshing allocator can merge pages whose live blocks do not overlap -- but when blocks
# were handed out in address order, the survivors of every page sit at the same offsets
# and no two pages mesh. Randomised placement is what makes them meshable: that is the
# point of the experiment.
#
# The batch budget halves each round (the paper's artifact does the same), so the batch
# of round 0 -- the whole budget, 128 MB in the paper -- is the most string data ever
# live at once, and the survivors add up to about half the budget.
#
# Usage: ruby strings.rb [--budget-mb 128] [--first-size 512] [--rounds N]
#                        [--keep-every 4] [--pause-ms 200]
# Prints one `round ...` line per round and a final `strings ...` line of key=value pairs;
# exits 1 when the survivors' contents do not check out at the end.

require "optparse"

MIB = 1024 * 1024
# MRI stores a string of up to this many bytes inside its object slot, without malloc;
# longer ones get a malloc block of length + 1 (the terminating NUL).
EMBED_MAX = 23
# Fill characters cycle over the alphabet, so survivors of one round do not all hold the
# same bytes and a block moved to the wrong place changes the checksum.
FILL = ("a".."z").to_a.freeze
# String#sum below this many bits is computed in C in one pass; at 64 MRI switches to
# bignum arithmetic, which is far slower.
CHECKSUM_BITS = 32
CHECKSUM_MODULUS = 1 << CHECKSUM_BITS

def monotonic
  Process.clock_gettime(Process::CLOCK_MONOTONIC)
end

def parse_options(argv)
  options = { budget_mb: 128.0, first_size: 512, rounds: nil, keep_every: 4, pause_ms: 200 }
  OptionParser.new do |parser|
    parser.banner = "usage: strings.rb [options]"
    parser.on("--budget-mb MB", Float, "string bytes of the first batch (default 128)") { |v| options[:budget_mb] = v }
    parser.on("--first-size BYTES", Integer, "malloc size of the first round's strings (default 512)") do |v|
      options[:first_size] = v
    end
    parser.on("--rounds N", Integer, "stop after N rounds (default: until a batch is below one string)") do |v|
      options[:rounds] = v
    end
    parser.on("--keep-every N", Integer, "keep one string in N (default 4: 25 %)") { |v| options[:keep_every] = v }
    parser.on("--pause-ms MS", Integer, "pause after each round, holding the survivors (default 200)") do |v|
      options[:pause_ms] = v
    end
  end.parse!(argv)
  abort "strings.rb: --first-size must exceed #{EMBED_MAX + 1} (shorter strings never reach malloc)" if
    options[:first_size] <= EMBED_MAX + 1
  abort "strings.rb: --keep-every must be at least 1" if options[:keep_every] < 1
  abort "strings.rb: --budget-mb must be positive" unless options[:budget_mb].positive?
  abort "strings.rb: --rounds must be at least 1" if options[:rounds] && options[:rounds] < 1
  options
end

# Allocates one round's batch and returns the strings it keeps. The length is one less
# than `size` so that the malloc request (contents + NUL) is exactly `size`, a power of
# two when the first size is one: the top of a size class in every allocator measured.
def run_round(size, count, keep_every)
  length = size - 1
  batch = Array.new(count) { |index| FILL[index % FILL.size] * length }
  # Indices rather than each_slice: slices of four would be heap-allocated arrays, an
  # extra stream of small mallocs that is not part of the workload.
  survivors = (0...count).step(keep_every).map { |index| batch[index] }
  [survivors, batch.size]
end

# The checksum the survivors must have: each holds `length` copies of its fill character.
def expected_checksum(rounds)
  rounds.sum do |round|
    length = round[:size] - 1
    (0...round[:count]).step(round[:keep_every]).sum { |index| FILL[index % FILL.size].ord * length }
  end % CHECKSUM_MODULUS
end

def main
  options = parse_options(ARGV)
  budget = (options[:budget_mb] * MIB).to_i
  pause = options[:pause_ms] / 1000.0
  retained = []
  rounds = []
  size = options[:first_size]
  allocated_bytes = 0
  paused_s = 0.0
  started = monotonic

  loop do
    batch_bytes = budget >> rounds.size
    break if batch_bytes < size
    break if options[:rounds] && rounds.size >= options[:rounds]

    round_started = monotonic
    count = batch_bytes / size
    survivors, made = run_round(size, count, options[:keep_every])
    retained.concat(survivors)
    kept = survivors.size
    survivors = nil # only `retained` may keep them alive through the collection below
    # A full, immediately swept collection: the dropped strings' blocks are freed now, not
    # whenever MRI's lazy sweeping gets round to them, so every allocator sees the same
    # frees at the same point of the run.
    GC.start(full_mark: true, immediate_sweep: true)
    work_s = monotonic - round_started
    allocated_bytes += made * size
    rounds << { size: size, count: made, keep_every: options[:keep_every] }
    puts format("round %<round>d size=%<size>d allocated=%<count>d kept=%<kept>d retained_strings=%<strings>d " \
                "retained_bytes=%<bytes>d seconds=%<seconds>.3f",
                round: rounds.size - 1, size: size, count: made, kept: kept, strings: retained.size,
                bytes: retained.sum(&:bytesize) + retained.size, seconds: work_s)
    $stdout.flush
    # The "work" done with the filtered results: the survivors stay live, the heap keeps
    # its fragmented shape, and a background mesher has time to act on it.
    pause_started = monotonic
    sleep pause
    paused_s += monotonic - pause_started
    size *= 2
  end

  # Read every survivor back: meshing moves live blocks between pages, so this is the
  # check that none was lost or overwritten.
  checksum = retained.sum { |string| string.sum(CHECKSUM_BITS) } % CHECKSUM_MODULUS
  expected = expected_checksum(rounds)
  total_s = monotonic - started
  ok = checksum == expected && retained.all? { |string| string.bytesize >= EMBED_MAX + 1 }
  puts format("strings rounds=%<rounds>d first_size=%<first>d last_size=%<last>d budget_bytes=%<budget>d " \
              "keep_every=%<keep>d allocated_bytes=%<allocated>d retained_strings=%<strings>d " \
              "retained_bytes=%<bytes>d checksum=%<checksum>d expected=%<expected>d ok=%<ok>d " \
              "work_s=%<work>.3f paused_s=%<paused>.3f total_s=%<total>.3f ruby=%<ruby>s",
              rounds: rounds.size, first: options[:first_size], last: rounds.empty? ? 0 : rounds.last[:size],
              budget: budget, keep: options[:keep_every], allocated: allocated_bytes, strings: retained.size,
              bytes: retained.sum(&:bytesize) + retained.size, checksum: checksum, expected: expected,
              ok: ok ? 1 : 0, work: total_s - paused_s, paused: paused_s, total: total_s, ruby: RUBY_VERSION)
  exit(ok ? 0 : 1)
end

main
