#!/usr/bin/env bash
# git: init a repository, add and commit several files over three commits, log, diff, repack
# and fsck, in a temporary directory. With fixed identities and dates the commit hashes are
# deterministic, so the whole history must equal that of the same steps without the preload.
source "$(dirname "$0")/lib.sh"
require_cmd git

export HOME="$WORK/home" GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null
export GIT_AUTHOR_NAME=Tester GIT_AUTHOR_EMAIL=tester@example.invalid
export GIT_COMMITTER_NAME=Tester GIT_COMMITTER_EMAIL=tester@example.invalid
mkdir -p "$HOME"

# history DIR [preloaded] : prints the repository's history, diffs and checks.
history() {
  local dir=$1 n
  shift
  local -a g=("$@" git -C "$dir")
  "${g[@]:0:$#}" git init -q -b main "$dir"
  for n in 1 2 3; do
    export GIT_AUTHOR_DATE="2024-01-0$n 12:00:00 +0000" GIT_COMMITTER_DATE="2024-01-0$n 12:00:00 +0000"
    mkdir -p "$dir/src/$n"
    awk -v n="$n" -v dir="$dir" 'BEGIN {
      for (i = 1; i <= 60; i++) {
        f = dir "/src/" n "/file" i ".txt"
        for (j = i; j <= i * n * 37; j++) print j > f
        close(f)
      }
      for (j = 1; j <= 100000 * n; j++) print j, "some repeated text for the delta compressor" > (dir "/big.txt")
    }'
    printf 'commit %d\n' "$n" >>"$dir/README"
    "${g[@]}" add -A
    "${g[@]}" commit -q -m "commit $n: $((n * 60)) files"
  done
  "${g[@]}" log --format='%H %T %s'
  "${g[@]}" diff --stat HEAD~2 HEAD | tail -1
  "${g[@]}" -c pack.threads=2 repack -a -d -f -q
  "${g[@]}" fsck --strict --no-progress 2>&1
  "${g[@]}" count-objects -v | grep -E '^(count|in-pack|packs):'
  "${g[@]}" cat-file -p HEAD:README
}

expected=$(history "$WORK/ref")
actual=$(history "$WORK/test" preloaded) || fail "git exited with status $?"
[[ $actual == "$expected" ]] || fail "history differs from an unpreloaded run:
--- without meshalloc
$expected
--- with meshalloc
$actual"
commits=$(grep -c ' commit [0-9]: ' <<<"$actual")
expect_eq "commits in log" 3 "$commits"
expect_eq "README at HEAD" "$(printf 'commit 1\ncommit 2\ncommit 3')" "$(tail -3 <<<"$actual")"
log "ok: $(head -1 <<<"$actual")"
