#!/usr/bin/env bats
# write.bats: bfo write through the batch writer on real file systems (reflink on XFS and
# Btrfs, ordered on ext4): exact copies, no helper files left, clean failures (ENOSPC,
# read-only, permissions).

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup() {
  require_root_loop
  MNT=$BATS_TEST_TMPDIR/mnt
  SRC=$BATS_TEST_TMPDIR/src
}

teardown() {
  overlay_umount
  loop_cleanup_all
}

# make_tree DIR: thousands of small files (0 B up), files of 1-20 MiB, a deep path, a
# 255-byte name, unicode names, assorted modes and nanosecond mtimes.
make_tree() {
  local d=$1 i sz
  mkdir -p "$d"
  for i in $(seq 1 30); do
    sz=$(( (i * 389) % 12000 + 1 ))
    mkdir -p "$d/small/d$i"
    head -c $((sz * 100)) /dev/urandom | split -b "$sz" -a 3 - "$d/small/d$i/f"
  done
  for i in $(seq 1 20); do : > "$d/small/empty$i"; done
  mkdir -p "$d/big"
  head -c $((1024 * 1024 + 1)) /dev/urandom > "$d/big/one-mib-plus-one"
  head -c $((5 * 1024 * 1024)) /dev/urandom > "$d/big/five-mib"
  head -c $((20 * 1024 * 1024)) /dev/urandom > "$d/big/twenty-mib"
  local deep=$d
  for i in $(seq 1 40); do deep=$deep/level-$i-abcdefghijklmnop; done
  mkdir -p "$deep"
  printf 'deep\n' > "$deep/leaf"
  printf 'long\n' > "$d/$(printf 'L%.0s' $(seq 1 255))"
  mkdir -p "$d/ünïcödé dir"
  printf 'unicode\n' > "$d/ünïcödé dir/日本語 ✓ ñame.txt"
  head -c 7777 /dev/urandom > "$d/ünïcödé dir/Ελληνικά"
  printf 'private\n' > "$d/mode-600"; chmod 600 "$d/mode-600"
  printf 'exec\n' > "$d/mode-755"; chmod 755 "$d/mode-755"
  printf 'ro\n' > "$d/mode-444"; chmod 444 "$d/mode-444"
  touch -d '2001-02-03 04:05:06.123456789' "$d/mode-600" "$d/small/d3/faaa"
  ln -s mode-600 "$d/a-symlink"
  mkfifo "$d/a-fifo"
}

# No helper file (.bfo-journal/-jtmp/-stem/-probe/-tmp) anywhere under DIR.
no_leftovers() {
  local left
  left=$(find "$1" -name '.bfo-*')
  [ -z "$left" ] || { echo "helper files left: $left"; false; }
}

stat_of() { sed -n "s/.* $1=\([0-9a-z]*\).*/\1/p" <<< "$2"; }

copy_and_compare() {  # FS BACKEND-EXPECTED [bfo write options...]
  local fs=$1 want=$2
  shift 2
  make_fs "$fs" "$MNT" 1024
  make_tree "$SRC"
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
  [ "$(wc -l < "$BATS_TEST_TMPDIR/want")" -gt 3000 ]
  run --separate-stderr "$BFO" write --stats "$@" "$SRC" "$MNT/dst"
  echo "$stderr"
  [ "$status" -eq 0 ]
  [ "$(stat_of backend "$stderr")" = "$want" ]
  [ "$(stat_of errors "$stderr")" = 0 ]
  [ "$(stat_of skipped "$stderr")" = 1 ]     # the fifo
  tree_manifest "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
  diff "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got"
  no_leftovers "$MNT"
  [ "$(readlink "$MNT/dst/a-symlink")" = mode-600 ] && [ ! -e "$MNT/dst/a-fifo" ]
  [ "$(stat -c %Y "$MNT/dst/a-symlink")" = "$(stat -c %Y "$SRC/a-symlink")" ]
  STATS=$stderr
}

# write_reflink [bfo write options...] SRC DST: bfo write --stats succeeds with the
# reflink backend; its statistics in $stderr.
write_reflink() {
  run --separate-stderr "$BFO" write --stats "$@"
  echo "$stderr"
  [ "$status" -eq 0 ]
  [ "$(stat_of backend "$stderr")" = reflink ]
}

# Files the reflink backend clones: one clone each of their whole blocks (the partial
# last block is written, not cloned and truncated, which would copy it on write).
# Files under 64 KiB with a partial last block are written whole instead.
whole_block_files() {
  find "$SRC" -type f -printf '%s\n' \
    | awk '$1 >= 4096 && ($1 % 4096 == 0 || $1 >= 65536) { n++ } END { print n + 0 }'
}

# The stems' bytes: the files that clone blocks, each from a block boundary.  Files
# written whole (and empty ones) are not in any stem: the journal has their CRC32C.
stem_bytes_wanted() {
  find "$SRC" -type f -printf '%s\n' \
    | awk '$1 > 0 && !($1 % 4096 && $1 < 65536) { n += int(($1 + 4095) / 4096) * 4096 }
           END { print n + 0 }'
}

@test "bfo write on XFS picks reflink and copies a tree exactly (content, size, mode, mtime)" {
  copy_and_compare xfs reflink
  [ "$(stat_of clones "$STATS")" -eq "$(whole_block_files)" ]
  [ "$(stat_of stem_bytes "$STATS")" -eq "$(stem_bytes_wanted)" ]
  [ "$(stat_of stem_fallbacks "$STATS")" = 0 ]
  # The clones share the stems' blocks: data is not duplicated on disk.
  [ "$(stat_of stem_buffered "$STATS")" = 0 ]
}

@test "bfo write on XFS: a batch's two threads in different allocation groups; no sync of its own for a batch cloned whole" {
  make_fs xfs "$MNT" 1024 -d agcount=4
  local i
  for i in $(seq 1 16); do
    mkdir -p "$SRC/d$i"
    head -c $((128 * 4096)) /dev/urandom | split -b 4096 -a 3 - "$SRC/d$i/f"
  done
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
  write_reflink --batch-files=1024 "$SRC" "$MNT/dst"
  [ "$(stat_of clones "$stderr")" -eq 2048 ]
  # Each batch (8 directories, rotated over the 4 AGs) is split by AG.
  [ "$(stat_of ag_splits "$stderr")" -eq "$(stat_of batches "$stderr")" ]
  # All cloned whole: no sync but each stem's own (XFS logs metadata in order).
  [ "$(stat_of syncs "$stderr")" -eq "$(stat_of batches "$stderr")" ]
  tree_manifest "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
  diff "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got"
  no_leftovers "$MNT"
  # A tail to write in every batch: each batch syncs before its stem goes.
  for i in $(seq 1 16); do printf 'tail' >> "$SRC/d$i/faaa"; done
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
  run --separate-stderr "$BFO" write --stats --batch-files=1024 "$SRC" "$MNT/dst2"
  [ "$status" -eq 0 ]
  [ "$(stat_of syncs "$stderr")" -eq $((2 * $(stat_of batches "$stderr"))) ]
  tree_manifest "$MNT/dst2" > "$BATS_TEST_TMPDIR/got"
  diff "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got"
}

@test "bfo write --backend reflink on Btrfs clones from stems and copies a tree exactly" {
  copy_and_compare btrfs reflink --backend reflink
  [ "$(stat_of clones "$STATS")" -eq "$(whole_block_files)" ]
  [ "$(stat_of stem_bytes "$STATS")" -eq "$(stem_bytes_wanted)" ]
}

# Btrfs frees an extent only when no file refers to any of it: files cloned from
# one stem extent keep each other's space after a delete.
@test "bfo write on Btrfs picks ordered (not reflink): deleting 90 % of the files frees their space" {
  copy_and_compare btrfs ordered
  [ "$(stat_of clones "$STATS")" = 0 ]
  run "$BFO" plan --write "$MNT"
  echo "$output"
  [[ "$output" == *"backend:     ordered"*"--backend=reflink"* ]]
  # 2000 files of 64 KiB (125 MiB), 90 % deleted: GNU cp's copy keeps ~13 MiB.
  local i used
  mkdir -p "$SRC.big"
  for i in $(seq 1 2000); do head -c 65536 /dev/urandom > "$SRC.big/f$i"; done
  rm -rf "$MNT/dst"
  "$BFO" write "$SRC.big" "$MNT/big"
  for i in $(seq 1 2000); do [ $((i % 10)) = 0 ] || rm "$MNT/big/f$i"; done
  sync -f "$MNT"; btrfs filesystem sync "$MNT"
  used=$(btrfs filesystem usage -b "$MNT" | awk '/^Data,/ { sub(/.*Used:/, ""); print $1 + 0 }')
  echo "data used after deleting 90 %: $used"
  [ "$used" -lt $((40 << 20)) ]
}

@test "bfo write on XFS: batches of small files only (written whole, and empty) have no stem" {
  make_fs xfs "$MNT" 1024
  local i
  for i in $(seq 1 6); do
    mkdir -p "$SRC/d$i"
    head -c $((200 * (i * 331 + 17))) /dev/urandom | split -b $((i * 331 + 17)) -a 3 - "$SRC/d$i/f"
    : > "$SRC/d$i/empty"
  done
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
  write_reflink --batch-files=300 "$SRC" "$MNT/dst"
  [ "$(stat_of batches "$stderr")" -ge 4 ]
  [ "$(stat_of stem_bytes "$stderr")" -eq 0 ]
  [ "$(stat_of clones "$stderr")" -eq 0 ]
  # Their data are written, so each batch syncs before its journal goes.
  [ "$(stat_of syncs "$stderr")" -ge "$(stat_of batches "$stderr")" ]
  tree_manifest "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
  diff "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got"
  no_leftovers "$MNT"
}

@test "bfo write on ext4 picks ordered and copies a tree exactly" {
  copy_and_compare ext4 ordered
  [ "$(stat_of ordered_files "$STATS")" -gt 3000 ]
  [ "$(stat_of journals "$STATS")" -ge 1 ]
}

@test "bfo write in many small batches (files larger than a batch go alone) is still exact" {
  copy_and_compare xfs reflink --batch-files 97 --batch-bytes 256K
  [ "$(stat_of batches "$STATS")" -gt 30 ]
  for t in 1 2 3 4 5; do umount "$MNT" 2>/dev/null && break; sleep 0.5; done
  run xfs_repair -n "$(losetup -n -O NAME -j "$(ls "$BATS_TEST_TMPDIR"/bfo-xfs.*.img)")"
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "bfo write --backend reflink on ext4 is refused with a clear message" {
  make_fs ext4 "$MNT" 256
  mkdir -p "$SRC"; echo x > "$SRC/x"
  run "$BFO" write --backend reflink "$SRC" "$MNT/dst"
  [ "$status" -eq 1 ]
  [[ "$output" == *"cannot write into '$MNT/dst' with the reflink backend"* ]]
  no_leftovers "$MNT"
}

@test "existing target files are replaced, other files in DST are left alone" {
  for fs in xfs ext4; do
    make_fs $fs "$MNT-$fs" 512
    mkdir -p "$SRC/sub" "$MNT-$fs/dst/sub"
    printf 'new\n' > "$SRC/sub/f"
    printf 'an older, longer version of f\n' > "$MNT-$fs/dst/sub/f"
    printf 'mine\n' > "$MNT-$fs/dst/other"
    run "$BFO" write "$SRC" "$MNT-$fs/dst"
    [ "$status" -eq 0 ]
    [ "$(cat "$MNT-$fs/dst/sub/f")" = new ]
    [ "$(cat "$MNT-$fs/dst/other")" = mine ]
    no_leftovers "$MNT-$fs"
  done
}

# fill MNT until about KIB KiB are free.
fill_fs() {
  local avail
  avail=$(df -k --output=avail "$1" | tail -1)
  fallocate -l $(( (avail - $2) * 1024 )) "$1/filler"
}

@test "a nearly full file system: failing files reported, no target partially written" {
  for fs in xfs ext4; do
    # ext4: no blocks reserved for root, who would otherwise write into them.
    make_fs $fs "$MNT-$fs" 320 $([ $fs = ext4 ] && echo -m 0)
    rm -rf "$SRC"; mkdir -p "$SRC/a" "$SRC/b"
    for i in $(seq 1 12); do head -c 1M /dev/urandom > "$SRC/a/m$i"; done
    for i in $(seq 1 300); do head -c $((i * 13)) /dev/urandom > "$SRC/b/s$i"; done
    tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
    mkdir "$MNT-$fs/dst"
    fill_fs "$MNT-$fs" 6000
    run --separate-stderr "$BFO" write --stats "$SRC" "$MNT-$fs/dst"
    echo "$fs: $stderr" | head -20
    [ "$status" -eq 1 ]
    [[ "$stderr" == *"No space left on device"* ]]
    tree_manifest "$MNT-$fs/dst" > "$BATS_TEST_TMPDIR/got"
    # Whatever is at its final name is complete and correct; some files did fit.
    [ -z "$(comm -13 "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got")" ]
    [ "$(wc -l < "$BATS_TEST_TMPDIR/got")" -gt 0 ]
    # Every file that is missing was reported.
    comm -23 "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got" | cut -f1 | while IFS= read -r p; do
      grep -qF "'$MNT-$fs/dst/$p'" <<< "$stderr" || { echo "not reported: $p"; false; }
    done
    no_leftovers "$MNT-$fs"
  done
}

@test "a read-only destination fails with a clear message and exit status 1" {
  make_fs ext4 "$MNT" 256
  mkdir -p "$SRC" "$MNT/dst"; echo x > "$SRC/x"
  mount -o remount,ro "$MNT"
  run "$BFO" write "$SRC" "$MNT/dst"
  echo "$output"
  [ "$status" -eq 1 ]
  [ "$output" = "bfo: cannot write into '$MNT/dst': Read-only file system" ]
  [ -z "$(ls -A "$MNT/dst")" ]
}

@test "unwritable directories (as nobody): clear errors, exit status 1, the rest written" {
  make_fs ext4 "$MNT" 256
  # nobody must reach the mount through bats' private temp directories.
  d=$BATS_TEST_TMPDIR
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
  mkdir -p "$MNT/src/locked" "$MNT/root-owned" "$MNT/dst/locked"
  echo top > "$MNT/src/top"
  echo inner > "$MNT/src/locked/inner"
  chmod -R a+rX "$MNT/src"
  chown nobody "$MNT/dst"            # DST is nobody's, DST/locked is root's 0755
  run su nobody -s /bin/sh -c "'$BFO' write '$MNT/src' '$MNT/root-owned'"
  echo "$output"
  [ "$status" -eq 1 ]
  [ "$output" = "bfo: cannot write into '$MNT/root-owned': Permission denied" ]
  run su nobody -s /bin/sh -c "'$BFO' write '$MNT/src' '$MNT/dst'"
  echo "$output"
  [ "$status" -eq 1 ]
  [ "$output" = "bfo: cannot create '$MNT/dst/locked/inner': Permission denied" ]
  [ "$(cat "$MNT/dst/top")" = top ]
  [ ! -e "$MNT/dst/locked/inner" ]
  no_leftovers "$MNT"
}

# refusing_bfo WHAT: REFUSING, a bfo that runs with the system calls WHAT
# refused (tests/lib/refuse), as $BATS_TEST_TMPDIR/bfo-refusing; skips,
# saying why, where they cannot be refused.
refusing_bfo() {
  REFUSING=$BATS_TEST_TMPDIR/bfo-refusing
  refuse_ready "$1"
  printf '#!/bin/sh\nexec "%s" %s "%s" "$@"\n' "$REFUSE" "$1" "$BFO" > "$REFUSING"
  chmod +x "$REFUSING"
}

@test "openat2 and syncfs refused (seccomp profiles of containers), and no O_TMPFILE: bfo write still copies exactly on XFS, ext4 and Btrfs, no helper file left" {
  # (before: "cannot create ...: Operation not permitted" for every file
  # without openat2; without syncfs "cannot sync" for every file onto XFS,
  # and the journal left behind)
  refusing_bfo openat2,syncfs,tmpfile
  BFO=$REFUSING copy_and_compare xfs reflink
  loop_cleanup_all
  rm -rf "$SRC"
  BFO=$REFUSING copy_and_compare ext4 ordered
  loop_cleanup_all
  rm -rf "$SRC"
  BFO=$REFUSING copy_and_compare btrfs ordered
}

@test "bfo write inside an overlay on Btrfs (Docker's overlay2 there) picks ordered, not reflink though clones work: deleting 90 % of the files frees their space" {
  make_fs btrfs "$MNT" 1024
  overlay_mount "$MNT" "$BATS_TEST_TMPDIR/ov"
  run "$BFO" plan --write "$OVERLAY_MNT"
  echo "$output"
  [[ "$output" == *"test clone (FICLONERANGE) between two files there works"* ]]
  [[ "$output" == *"backend:     ordered"*"--backend=reflink"* ]]
  # 2000 files of 64 KiB (125 MiB), 90 % deleted: GNU cp's copy keeps ~13
  # MiB; reflink (auto before) kept 159 MiB of 160 of such a tree.
  local i used
  mkdir -p "$SRC.big"
  for i in $(seq 1 2000); do head -c 65536 /dev/urandom > "$SRC.big/f$i"; done
  run --separate-stderr "$BFO" write --stats "$SRC.big" "$OVERLAY_MNT/big"
  echo "$stderr"
  [ "$status" -eq 0 ]
  [ "$(stat_of backend "$stderr")" = ordered ]
  diff -r "$SRC.big" "$OVERLAY_MNT/big"
  no_leftovers "$OVERLAY_MNT"
  for i in $(seq 1 2000); do [ $((i % 10)) = 0 ] || rm "$OVERLAY_MNT/big/f$i"; done
  sync -f "$MNT"; btrfs filesystem sync "$MNT"
  used=$(btrfs filesystem usage -b "$MNT" | awk '/^Data,/ { sub(/.*Used:/, ""); print $1 + 0 }')
  echo "data used after deleting 90 %: $used"
  [ "$used" -lt $((40 << 20)) ]
}
