#!/usr/bin/env bash
# ruby: strings, arrays and hashes with GC in between (Ruby's heap grows and shrinks through
# malloc); the result is known in closed form and must match a run without the preload.
source "$(dirname "$0")/lib.sh"
require_cmd ruby

program='
  h = {}
  (1..200_000).each { |i| h["key#{i}"] = "x" * (i % 64) + i.to_s }
  h.delete_if { |k, _| k.end_with?("3", "7") }
  GC.start
  strings = h.values.map { |v| v.reverse.upcase }
  total = strings.sum(&:bytesize)
  arrays = (1..2000).map { |i| Array.new(i % 300) { |j| j * i } }
  asum = arrays.sum { |a| a.sum }
  threads = 4.times.map do |t|
    Thread.new { (1..20_000).map { |i| ("t#{t}-" * (i % 20)) }.join.bytesize }
  end
  tsum = threads.sum(&:value)
  GC.compact if GC.respond_to?(:compact)
  puts [h.size, total, asum, tsum].join(" ")
'

expected=$(ruby -e "$program")
actual=$(preloaded ruby -e "$program") || fail "ruby exited with status $?"
expect_eq "result matches an unpreloaded run" "$expected" "$actual"
read -r size _ _ tsum <<<"$actual"
# Keys ending in 3 or 7 are 2 in every 10 of 1..200000.
expect_eq "hash size" 160000 "$size"
# Each thread: 3 bytes * sum(i % 20 for i in 1..20000) = 3 * 1000 * 190.
expect_eq "thread string bytes" $((4 * 3 * 1000 * 190)) "$tsum"
# No expect_meshing: this program frees a fifth of its strings, too few for spans to mesh
# reliably (1-8 meshes per mesh-stress run); it still runs under that configuration.
