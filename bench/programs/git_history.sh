#!/bin/sh
# The git workload of `meshalloc bench speed` and `real-apps` (prepared by
# python/meshalloc_cli/bench/programs.py, which generates the repository).
#
#   git_history.sh REPOSITORY FILE
#
# What a developer's day does to git's allocator, on a generated bare repository: the whole
# history with patches (every commit diffed against its parent), a blame of the most edited
# FILE, a full repack that recomputes every delta, and a strict fsck that inflates and parses
# every object. Only git's own work is measured; the repository is never changed in substance
# (repack rewrites the same objects into one new pack), so every run does the same work.
# Prints one line of checksums, identical under every allocator.
set -eu
repo=$1
file=$2
log_sum=$(git -C "$repo" log -p --stat --format='%H %an %s' main | cksum)
blame_sum=$(git -C "$repo" blame -s main -- "$file" | cksum)
# One delta thread: the timing should show the allocator, not how two threads share two CPUs
# with whatever else the machine runs. No fsync: disk latency is not the allocator's.
git -C "$repo" -c pack.threads=1 -c core.fsync=none repack -a -d -f -q
git -C "$repo" fsck --strict --no-progress
echo "commits=$(git -C "$repo" rev-list --count main) log=$log_sum blame=$blame_sum"
