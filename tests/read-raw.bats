#!/usr/bin/env bats
# read-raw.bats: bfo read --raw reads merged extents from the block device (root, ext4/XFS)
# and never hands out bytes from outside a file, even while files change under it.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup() {
  require_root_loop
  MNT=$BATS_TEST_TMPDIR/mnt
}

teardown() {
  if [ -n "${WRITER:-}" ]; then
    touch "$BATS_TEST_TMPDIR/stop"
    wait "$WRITER" 2>/dev/null || true
  fi
  loop_cleanup_all
}

# A tree of small files written in shuffled order (aged-like layout), a sparse file,
# an unwritten range, and a file bigger than a batch piece.
populate() {
  local d=$1 i
  mkdir -p "$d/a" "$d/b/c"
  for i in $(seq 1 600 | shuf --random-source=<(yes)); do
    head -c $(( (i * 7919) % 20000 )) /dev/urandom > "$d/$( [ $((i % 3)) = 0 ] && echo a || echo b/c )/f$i"
  done
  truncate -s 300K "$d/sparse"
  printf 'middle' | dd of="$d/sparse" bs=1 seek=150000 conv=notrunc status=none
  fallocate -l 256K "$d/unwritten"
  printf 'head' | dd of="$d/unwritten" conv=notrunc status=none
  head -c 20M /dev/urandom > "$d/big"
}

check_raw_on() {  # FS
  make_fs "$1" "$MNT" 512
  populate "$MNT/t"
  expected_manifest "$MNT/t" > "$BATS_TEST_TMPDIR/want"
  drop_caches
  run --separate-stderr "$BFO" read --raw --stats "$MNT/t"
  [ "$status" -eq 0 ]
  diff "$BATS_TEST_TMPDIR/want" <(echo "$output")
  # Small files came from the device in merged requests: far fewer requests than files.
  files=$(sed -n 's/.* files=\([0-9]*\) .*/\1/p' <<< "$stderr")
  raw=$(sed -n 's/.* raw_files=\([0-9]*\) .*/\1/p' <<< "$stderr")
  requests=$(sed -n 's/.* requests=\([0-9]*\) .*/\1/p' <<< "$stderr")
  echo "# $1: files=$files raw_files=$raw requests=$requests" >&3
  [ "$raw" -ge 500 ]
  [ "$requests" -lt $((files / 4)) ]
}

@test "bfo read --raw on ext4 lists exactly the bytes sha256sum sees, in few requests" {
  check_raw_on ext4
}

@test "bfo read --raw on XFS lists exactly the bytes sha256sum sees, in few requests" {
  check_raw_on xfs
}

@test "bfo read --raw on btrfs and tmpfs falls back per file and still reads every byte" {
  for fs in btrfs tmpfs; do
    make_fs $fs "$MNT-$fs" 512
    populate "$MNT-$fs/t"
    expected_manifest "$MNT-$fs/t" > "$BATS_TEST_TMPDIR/want"
    drop_caches
    run --separate-stderr "$BFO" read --raw --stats "$MNT-$fs/t"
    [ "$status" -eq 0 ]
    diff "$BATS_TEST_TMPDIR/want" <(echo "$output")
    [[ "$stderr" == *" raw_files=0 "* ]]
  done
}

@test "bfo read --raw as a non-root user falls back and still reads every byte" {
  make_fs ext4 "$MNT" 256
  populate "$MNT/t"
  chmod -R a+rX "$MNT"
  # nobody must reach the mount through bats' private temp directories.
  d=$BATS_TEST_TMPDIR
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
  expected_manifest "$MNT/t" > "$BATS_TEST_TMPDIR/want"
  drop_caches
  run --separate-stderr su nobody -s /bin/sh -c "'$BFO' read --raw --stats '$MNT/t'"
  echo "$stderr"
  [ "$status" -eq 0 ]
  diff "$BATS_TEST_TMPDIR/want" <(echo "$output")
  [[ "$stderr" == *" raw_files=0 "* ]]
}

@test "files truncated while a raw read runs never show another file's blocks" {
  make_fs ext4 "$MNT" 256
  mkdir -p "$MNT/d" "$MNT/other"
  # Every file holds 8 KiB of 'A'; the writer truncates them (freeing their blocks)
  # and writes 'Z' files elsewhere that may reuse those blocks.
  head -c 8192 /dev/zero | tr '\0' A > "$BATS_TEST_TMPDIR/A"
  head -c 8192 /dev/zero | tr '\0' Z > "$BATS_TEST_TMPDIR/Z"
  for i in $(seq 1 3000); do cp "$BATS_TEST_TMPDIR/A" "$MNT/d/f$i"; done
  drop_caches
  (
    i=1
    while [ ! -e "$BATS_TEST_TMPDIR/stop" ] && [ $i -le 3000 ]; do
      : > "$MNT/d/f$i"
      cp "$BATS_TEST_TMPDIR/Z" "$MNT/other/g$i"
      [ $((i % 100)) = 0 ] && sync
      i=$((i + 3))
    done
  ) &
  WRITER=$!
  run --separate-stderr "$BFO" read --raw --batch-files 200 "$MNT/d"
  touch "$BATS_TEST_TMPDIR/stop"
  wait "$WRITER"
  WRITER=
  [ "$status" -eq 0 ]
  a=$(sha256sum < "$BATS_TEST_TMPDIR/A" | cut -d' ' -f1)
  empty=$(sha256sum < /dev/null | cut -d' ' -f1)
  [ "$(echo "$output" | wc -l)" -eq 3000 ]
  bad=$(echo "$output" | awk -v a="$a" -v e="$empty" '$1 != a && $1 != e' | head -5)
  [ -z "$bad" ] || { echo "files with bytes that were never theirs: $bad"; false; }
}
