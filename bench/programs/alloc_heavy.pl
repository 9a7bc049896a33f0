# An allocation-heavy Perl program for `meshalloc bench speed` and `real-apps`.
#
# Usage: perl alloc_heavy.pl SCALE          (the work is linear in SCALE)
#
# Perl allocates every scalar's string buffer, every array and every hash bucket array with
# malloc and frees it when the reference count drops, so text processing is allocator traffic
# throughout. The same kind of work as SPEC's 400.perlbench (mail filtering), written here:
# messages are generated, tokenised with regular expressions, counted in hashes of words,
# half of the corpus is dropped at random, the rest sorted, joined and split again.
# Deterministic (Perl randomises hash order per process, so only sorted or aggregated values
# are printed): one line with counts and a digest, identical under every allocator.
use strict;
use warnings;
use Digest::MD5 qw(md5_hex);

use constant MESSAGES_PER_SCALE => 1000;
use constant WORDS => [qw(offer free money meeting report invoice urgent hello project lunch
                          winner account password update schedule budget review click now)];

my $scale = shift // 1;
# A small linear congruential generator (Perl's rand() differs between builds); its low bits
# cycle quickly, so the value is taken from the high ones.
my $state = 2019;
sub next_random {
    my ($limit) = @_;
    $state = ($state * 1103515245 + 12345) % 2147483648;
    return ($state >> 12) % $limit;
}

my $words = WORDS;
my (%corpus, %counts);
for my $i (1 .. MESSAGES_PER_SCALE * $scale) {
    my $length = 20 + next_random(300);
    my $body = join " ", map { $words->[next_random(scalar @$words)] . next_random(100) } 1 .. $length;
    my $subject = "Re: " x next_random(4) . "message $i";
    $corpus{"msg$i"} = { subject => $subject, body => $body, headers => [map { "X-Header-$_: " . ("v" x next_random(80)) } 1 .. next_random(10)] };
    for my $token ($body =~ /([a-z]+)\d+/g) { $counts{$token}++; }
}
my $spam = 0;
for my $key (sort keys %corpus) {
    my $message = $corpus{$key};
    my $score = () = $message->{body} =~ /\b(?:free|money|winner|click|password)\d/g;
    $spam++ if $score > 40;
    delete $corpus{$key} if next_random(2);
}
my $joined = join "\n", map { "$_:" . length($corpus{$_}{body}) . ":" . scalar(@{ $corpus{$_}{headers} }) } sort keys %corpus;
my @lines = split /\n/, $joined;
my %lengths;
$lengths{ (split /:/, $_)[1] % 17 }++ for @lines;
my $summary = join ",", map { "$_=$counts{$_}" } sort keys %counts;
printf "kept=%d spam=%d words=%d lengths=%d md5=%s\n", scalar(keys %corpus), $spam, scalar(keys %counts),
    scalar(keys %lengths), substr(md5_hex($summary . $joined), 0, 16);
