#!/usr/bin/env bash
# perl: a hash- and string-heavy program with a result known in closed form, which must also
# match the same program run without the preload.
source "$(dirname "$0")/lib.sh"
require_cmd perl

# 300000 keys "k<i>" with values of i % 50 copies of "ab"; half the keys are deleted, the rest
# are joined, split, sorted and counted.
program='
  my %h;
  for my $i (1 .. 300000) { $h{"k$i"} = "ab" x ($i % 50); }
  delete $h{"k$_"} for grep { $_ % 2 } 1 .. 300000;
  my $total = 0;
  $total += length $h{$_} for keys %h;
  my $joined = join ",", map { "$_=$h{$_}" } sort keys %h;
  my @parts = split /,/, $joined;
  my %seen;
  $seen{length $_}++ for @parts;
  my @words = map { scalar reverse $_ } grep { /7/ } @parts;
  printf "%d %d %d %d %d\n", scalar(keys %h), $total, length($joined), scalar(keys %seen),
    scalar(@words);
'

expected=$(perl -e "$program")
actual=$(preloaded perl -e "$program") || fail "perl exited with status $?"
expect_eq "result matches an unpreloaded run" "$expected" "$actual"
# Even i in 1..300000: 150000 keys; value length 2 * (i % 50) summed over even i:
# 6000 cycles of 50 (even residues 0,2,..,48 sum to 600) => 2 * 600 * 6000 = 7200000.
read -r keys total _ <<<"$actual"
expect_eq "keys" 150000 "$keys"
expect_eq "total value length" 7200000 "$total"
expect_meshing
