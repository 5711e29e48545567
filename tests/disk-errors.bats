#!/usr/bin/env bats
# disk-errors.bats: disks with bad sectors.
#
# Reads: bfocp and bfotar -c read file data ahead in batches (O_DIRECT through
# io_uring, several files a request) and bfo read --raw reads the block device
# itself; a read that fails there must cost no other file anything, and the
# files it hits must get GNU cp's and tar's own messages, results and exit
# status.
#
# Writes: GNU cp and tar leave written data in the page cache; a write-back
# that fails later is the user's sync -f to report.  bfocp's and bfotar -x's
# write-behind calls syncfs meanwhile, which takes that report from the
# user's sync, so bfocp and bfotar must make it themselves.
#
# The bad sectors come from tests/lib/eio-disk (a FUSE program under a loop
# device), since this kernel has neither device-mapper nor fault injection.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup_file() {
  build_stock_tar
}

setup() {
  require_root_loop
  EIO_DISK=$top_builddir/tests/lib/eio-disk
  [ -x "$EIO_DISK" ] ||
    skip "tests/lib/eio-disk was not built: configure found no libfuse3 (install libfuse3-dev)"
  [ -c /dev/fuse ] || skip "no /dev/fuse (the kernel's fuse module is missing)"
  stock_tar_setup
}

teardown() {
  loop_cleanup_all
}

# ------------------------------------------------------------------ helpers

# first_byte FS DEV FILE: the byte offset on DEV of FILE's first data block.
first_byte() {
  local o
  # (filefrag pads "A.. B:" to a width: "0..8388607:" once B is wide)
  o=$(filefrag -e -b1 "$3" | awk '$1 == "0:" { gsub(/\.\. */, ".."); sub(/\.\..*/, "", $3); print $3; exit }')
  if [ "$1" = btrfs ]; then   # a logical address in Btrfs's own address space
    btrfs-map-logical -l "$o" "$2" 2>/dev/null | awk '/physical/ { print $6; exit }'
  else
    echo "$o"
  fi
}

# bad_tree FS: a tree on FS at $W/m0 (300 small files in t/a, files of 3 and
# 10 MB and 50 small ones in t/b, 400 tiny ones in t/c), then moved onto a
# disk whose reads fail at the first block of t/a/f100, 1 MiB into t/b/big,
# 6 MiB into t/b/huge (above the reader's 8 MiB: streamed), on ext4 at the
# inode table block of t/b/g7 and the first block of directory t/c, and on
# XFS at that directory's first block.
# The file system ends up read-only on $W/m.
bad_tree() {
  local fs=$1 t=$W/m0/t i dev bad=() ino blk
  make_fs "$fs" "$W/m0"
  mkdir -p "$t/a" "$t/b" "$t/c"
  for i in $(seq 1 300); do head -c $((i * 61 % 20000 + 1)) /dev/urandom > "$t/a/f$i"; done
  head -c 3000000 /dev/urandom > "$t/b/big"
  head -c 10000000 /dev/urandom > "$t/b/huge"
  for i in $(seq 1 50); do head -c 5000 /dev/urandom > "$t/b/g$i"; done
  for i in $(seq 1 400); do echo "$i" > "$t/c/n$i"; done
  sync
  dev=$(findmnt -n -o SOURCE -M "$W/m0")
  bad+=("$(first_byte "$fs" "$dev" "$t/a/f100")+4096")
  bad+=("$(( $(first_byte "$fs" "$dev" "$t/b/big") + 1048576 ))+4096")
  bad+=("$(( $(first_byte "$fs" "$dev" "$t/b/huge") + 6291456 ))+4096")
  if [ "$fs" = ext4 ]; then
    ino=$(stat -c %i "$t/b/g7")
    blk=$(debugfs -R "imap <$ino>" "$dev" 2>/dev/null | awk '/located at block/ { sub(/,/, "", $4); print $4 }')
    bad+=("$((blk * 4096))+4096" "$(first_byte "$fs" "$dev" "$t/c")+4096")
  elif [ "$fs" = xfs ]; then
    # (no FIEMAP for XFS directories; xfs_bmap counts 512-byte sectors)
    blk=$(xfs_bmap "$t/c" | awk 'NR == 2 { split($3, r, /\.\./); print r[1] }')
    bad+=("$((blk * 512))+4096")
  fi
  for i in "${bad[@]}"; do
    [[ $i =~ ^[0-9]+\+4096$ ]] || { echo "no offset for a bad sector: '$i' (${bad[*]})"; return 1; }
  done
  eio_remount "$W/m0" "$W/m" "${bad[@]}"
}

# braces DIR ARG...: the ARGs with {} standing for DIR, in the array args.
braces() {
  local dir=$1 a
  shift
  args=()
  for a in "$@"; do args+=("${a//\{\}/$dir}"); done
}

# both_sides GNUBIN CMD...: CMD from $W/m, cold, with GNU's program first
# (GNUBIN first in PATH, side g) and then bfo's ($ASBIN, side b); each
# side's {} stands for $W/g or $W/b.  Output, messages and exit status in
# $W/SIDE.out, .err and .rc.
both_sides() {
  local gnubin=$1 side p args
  shift
  for side in g b; do
    if [ $side = g ]; then p=$gnubin:/usr/bin:/bin; else p=$ASBIN:/usr/bin:/bin; fi
    braces "$W/$side" "$@"
    drop_caches
    (set +e; cd "$W/m" && env PATH="$p" BFO_STATS=0 "${args[@]}" \
       > "$W/$side.out" 2> "$W/$side.err"; echo $? > "$W/$side.rc")
  done
  cat "$W/b.err"
  diff "$W/g.rc" "$W/b.rc"
  diff "$W/g.out" "$W/b.out"
}

# same_as_gnu_cp CP-ARGS: GNU cp and bfocp (as "cp") copy t from $W/m into
# $W/g/out and $W/b/out: same exit status, messages and trees.  GNU must
# have met the bad sectors.
same_as_gnu_cp() {
  rm -rf "$W/g" "$W/b"
  mkdir -p "$W/g" "$W/b"
  both_sides /usr/bin cp "$@" t {}/out
  grep -q "error reading 't/a/f100': Input/output error" "$W/g.err"
  [ "$(cat "$W/b.rc")" -eq 1 ]
  diff <(sort "$W/g.err") <(sort "$W/b.err")
  diff -r "$W/g/out" "$W/b/out"
  diff <(cd "$W/g/out" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort) \
       <(cd "$W/b/out" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort)
}

# same_as_gnu_tar TAR-ARGS: stock tar and bfotar archive t from $W/m: the
# same exit status, messages and archive, byte for byte.
same_as_gnu_tar() {
  both_sides "$STOCKBIN" tar "$@" -cf {}.tar t
  grep -q "t/a/f100: Read error at byte 0, while reading [0-9]* bytes: Input/output error" "$W/g.err"
  [ "$(cat "$W/b.rc")" -eq 2 ]
  diff "$W/g.err" "$W/b.err"
  cmp "$W/g.tar" "$W/b.tar"
}

# batched_through_errors: bfocp --stats, cold, batched the tree's files, met
# the bad sectors and still copied every other file right.
batched_through_errors() {
  rm -rf "$W/s"
  drop_caches
  run -1 "$BFOCP" --stats -r "$W/m/t" "$W/s"
  echo "$output"
  [[ $output == *"error reading '$W/m/t/a/f100': Input/output error"* ]]
  local n
  n=$(sed -n 's/.*batched \([0-9]*\) files.*/\1/p' <<< "$output")
  [ -n "$n" ] && [ "$n" -ge 300 ]
  diff -r -x f100 -x big "$W/g/out" "$W/s"
}

# data_ranges FS DIR: w:START+LENGTH for the device ranges that hold the data of
# the files under DIR (extents closer than 64 KiB joined), leaving out XFS's
# log, whose failed writes would shut the file system down.
data_ranges() {
  local dev log_start=0 log_len=0 ls
  dev=$(findmnt -n -o SOURCE -T "$2")
  if [ "$1" = xfs ]; then
    ls=$(xfs_db -r -c "sb 0" -c "p logstart" "$dev" | awk '{ print $3 }')
    log_start=$(xfs_db -r -c "convert fsb $ls byte" "$dev" | awk '{ print $1 }')
    log_len=$(( $(xfs_db -r -c "sb 0" -c "p logblocks" "$dev" | awk '{ print $3 }') * 4096 ))
  fi
  find "$2" -type f -exec filefrag -e -b1 {} + |
    awk '$1 ~ /^[0-9]+:$/ { gsub(/\.\. */, ".."); split($3, p, /\.\.|:/); print p[1], p[2] }' |
    sort -n |
    awk -v ls="$log_start" -v ll="$log_len" '
      function out() { if (n && !(s < ls + ll && ls < e)) printf "w:%d+%d\n", s, e - s }
      { if (n && $1 - e <= 65536) { if ($2 + 1 > e) e = $2 + 1 }
        else { out(); s = $1; e = $2 + 1; n = 1 } }
      END { out() }'
}

# bad_dest FS CMD...: run CMD (bfocp or bfotar writing tree t into {}) onto a
# fresh FS once to see where the data go, then again onto the same FS made
# afresh on a disk whose writes fail there (mounted on $W/m, the {} then).
# Output and status of the second run in $output/$status.
bad_dest() {
  local fs=$1 ranges args
  shift
  make_fs "$fs" "$W/m0"
  braces "$W/m0" "$@"
  "${args[@]}" 2>/dev/null
  sync
  mapfile -t ranges < <(data_ranges "$fs" "$W/m0/t")
  [ ${#ranges[@]} -ge 1 ]
  eio_remount --fresh "$fs" --rw "$W/m0" "$W/m" "${ranges[@]}"
  braces "$W/m" "$@"
  run "${args[@]}"
  echo "$output"
}

write_tree() {
  local i
  mkdir -p "$W/src/t/a" "$W/src/t/b"
  for i in $(seq 1 300); do head -c $((i * 61 % 20000 + 1)) /dev/urandom > "$W/src/t/a/f$i"; done
  head -c 3000000 /dev/urandom > "$W/src/t/b/big"
  "$STOCK_TAR" -C "$W/src" -cf "$W/t.tar" t
}

# ------------------------------------------------------------------ tests

@test "ext4 with bad sectors under data, an inode table and a directory: bfocp and bfotar -c fail as GNU does" {
  bad_tree ext4
  same_as_gnu_cp -r
  grep -q "error reading 't/b/big': Input/output error" "$W/g.err"
  grep -q "error reading 't/b/huge': Input/output error" "$W/g.err"
  # (and the inode table's and directory's: t/a, t/c or their files)
  grep -q "Input/output error" <(grep -v "t/a/f100\|t/b/big\|t/b/huge" "$W/g.err")
  same_as_gnu_cp -a
  batched_through_errors
  same_as_gnu_tar
  same_as_gnu_tar --sort=name
}

@test "XFS with bad sectors under file data and a directory: bfocp and bfotar -c fail as GNU does" {
  bad_tree xfs
  same_as_gnu_cp -r
  grep -q "cannot access 't/c': Input/output error" "$W/g.err"
  same_as_gnu_cp -a
  batched_through_errors
  same_as_gnu_tar
}

@test "Btrfs with bad sectors under file data: bfocp and bfotar -c fail as GNU does" {
  bad_tree btrfs
  same_as_gnu_cp -r
  same_as_gnu_cp -a
  batched_through_errors
  same_as_gnu_tar
}

@test "bfo read --raw: a failed merged device read sends its files the plain way; each error named, the rest read right" {
  bad_tree ext4
  drop_caches
  run -1 --separate-stderr "$BFO" read "$W/m/t"
  local plain=$output plain_err=$stderr
  drop_caches
  run -1 --separate-stderr "$BFO" read --raw --stats "$W/m/t"
  echo "$stderr"
  [[ $stderr == *"cannot read '$W/m/t/a/f100': Input/output error"* ]]
  [[ $stderr == *"cannot read '$W/m/t/b/big': Input/output error"* ]]
  [[ $stderr == *"cannot read '$W/m/t/b/huge': Input/output error"* ]]
  # The device reads were merged across files, and the failed ones retried.
  [[ $stderr =~ raw_files=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 300 ]
  [[ $stderr =~ fallback_other=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 2 ]
  [ "$output" = "$plain" ]
  diff <(grep -v stats <<< "$stderr" | sort) <(sort <<< "$plain_err")
  [ "$(wc -l <<< "$output")" -ge 300 ]
}

@test "write-behind met failed write-backs: bfotar -x and bfocp say so and fail; without it, as GNU, the user's sync -f says so" {
  write_tree
  local fs
  for fs in xfs ext4; do
    bad_dest $fs "$BFOTAR" --write-behind=1M --stats -C {} -xf "$W/t.tar"
    [ "$status" -eq 2 ]
    [[ $output == *"bfotar: Cannot write back the extracted data: Input/output error"* ]]
    [[ $output =~ write-backs\ \([0-9]+\ ms,\ [1-9][0-9]*\ failed\) ]]
    loop_cleanup_all
    bad_dest $fs "$BFOCP" --write-behind=1M -r "$W/src/t" {}/t
    [ "$status" -eq 1 ]
    [[ $output == *"bfocp: writing back the copied data failed: Input/output error"* ]]
    loop_cleanup_all
    # Without write-behind, as GNU: nothing seen, exit 0; the sync reports.
    bad_dest $fs "$BFOTAR" --write-behind=0 -C {} -xf "$W/t.tar"
    [ "$status" -eq 0 ]
    run sync -f "$W/m/t"
    [ "$status" -eq 1 ]
    loop_cleanup_all
    bad_dest $fs "$BFOCP" --write-behind=0 -r "$W/src/t" {}/t
    [ "$status" -eq 0 ]
    run sync -f "$W/m/t"
    [ "$status" -eq 1 ]
    loop_cleanup_all
  done
}

# fates SRC DIR NAMEDIR: after a failed write of tree SRC into what is now DIR
# (NAMEDIR in the messages, $output): every file a message names is absent,
# every other one is complete, and DIR holds nothing SRC does not.
fates() {
  local f named=0 whole=0
  while IFS= read -r f; do
    f=${f#./}
    if grep -qF "'$3/$f'" <<< "$output"; then
      [ ! -e "$2/$f" ] || { echo "$f: named in an error, yet there"; return 1; }
      named=$((named + 1))
    else
      cmp "$1/$f" "$2/$f" || { echo "$f: named in no error, yet not whole"; return 1; }
      whole=$((whole + 1))
    fi
  done < <(cd "$1" && find . -type f)
  echo "$named files named in errors and absent, $whole complete"
  [ "$named" -ge 1 ]
  ! diff <(cd "$1" && find . | LC_ALL=C sort) \
         <(cd "$2" && find . | LC_ALL=C sort) | grep '^>'
}

@test "bfo write (ordered onto ext4, reflink onto XFS) with failing writes: a file named in an error is absent, every other one whole; fsck clean" {
  local one fs backend msg
  write_tree
  for one in "ext4 ordered cannot sync" "xfs reflink cannot write the stem of"; do
    read -r fs backend msg <<< "$one"
    bad_dest "$fs" "$BFO" write --backend="$backend" "$W/src/t" {}/t
    [ "$status" -eq 1 ]
    grep -q "$msg '$W/m/t/.*': Input/output error" <<< "$output"
    eio_check "$fs" "$W/m" "$W/c"
    fates "$W/src/t" "$W/c/t" "$W/m/t"
    loop_cleanup_all
  done
}

@test "bfo mkimage and bfotar --ext4-image onto a device whose writes fail: a file named in an error is absent, every other one whole; e2fsck clean" {
  write_tree
  local dev ranges what
  for what in mkimage tar; do
    make_fs ext4 "$W/m0"
    dev=$(findmnt -n -o SOURCE -M "$W/m0")
    umount "$W/m0"
    "$BFO" mkimage "$dev" "$W/src"
    mount "$dev" "$W/m0"
    mapfile -t ranges < <(data_ranges ext4 "$W/m0/t")
    [ ${#ranges[@]} -ge 1 ]
    eio_remount --fresh ext4 "$W/m0" "$W/m" "${ranges[@]}"
    dev=$(findmnt -n -o SOURCE -M "$W/m")
    umount "$W/m"
    if [ $what = mkimage ]; then
      run -1 "$BFO" mkimage "$dev" "$W/src"
      echo "$output"
      grep -q "cannot write 't/.*' into '$dev': Input/output error" <<< "$output"
      eio_check ext4 "$W/m" "$W/c"
      fates "$W/src/t" "$W/c/t" t
    else
      run -2 "$BFOTAR" -xf "$W/t.tar" --ext4-image="$dev"
      echo "$output"
      grep -q "t/.*: Cannot open: Input/output error" <<< "$output"
      eio_check ext4 "$W/m" "$W/c"
      # (tar's messages name members without quotes)
      output=$(sed "s|^.*: \(t/[^:]*\): Cannot open: .*|'\1'|" <<< "$output")
      fates "$W/src/t" "$W/c/t" t
    fi
    loop_cleanup_all
  done
}

@test "an archive on a disk with a bad sector: bfotar -x and -t as stock tar, the member it stops inside left as tar leaves it" {
  local t=$W/src/t i o
  mkdir -p "$t/a"
  for i in $(seq 1 300); do head -c $((i * 61 % 20000 + 1)) /dev/urandom > "$t/a/f$i"; done
  touch -d 2020-01-02 "$t/a"/*
  make_fs ext4 "$W/m0" 256
  "$STOCK_TAR" -C "$W/src" --sort=name -cf "$W/m0/t.tar" t
  sync
  o=$(first_byte ext4 "$(findmnt -n -o SOURCE -M "$W/m0")" "$W/m0/t.tar")
  eio_remount "$W/m0" "$W/m" "$((o + 2500000))+4096"
  both_sides "$STOCKBIN" tar -tvf t.tar
  diff "$W/g.err" "$W/b.err"
  mkdir -p "$W/g" "$W/b"
  both_sides "$STOCKBIN" tar -xf t.tar -C {}
  grep -q "Cannot read: Input/output error" "$W/g.err"
  grep -q "Too many errors, quitting" "$W/g.err"
  [ "$(cat "$W/b.rc")" -eq 2 ]
  diff "$W/g.err" "$W/b.err"
  diff -r "$W/g" "$W/b"
  # Sizes and modes; times too but for the member tar stopped inside, which
  # keeps the mode tar created it with and the time of the run.
  diff <(cd "$W/g" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort) \
       <(cd "$W/b" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort)
  diff <(cd "$W/g" && find . -type f -perm -044 -printf '%p %T@\n' | LC_ALL=C sort) \
       <(cd "$W/b" && find . -type f -perm -044 -printf '%p %T@\n' | LC_ALL=C sort)
  [ "$(cd "$W/g" && find . -type f ! -perm -044 | wc -l)" -eq 1 ]
}

@test "a file whose reads end elsewhere than its size (a stale network size, FUSE direct I/O): bfo read, bfocp and bfotar -c as GNU; small and streamed" {
  # (a 10 MB file is above the reader's 8 MiB: streamed in pieces)
  local size extra claim a
  mkdir -p "$W/s"
  for size in 3000 10000000; do
    head -c $size /dev/urandom > "$W/s/data-$size"
    for extra in 1048576 -1000; do
      claim=$((size + extra))
      stale_file "$W/s/data-$size" $extra
      [ "$(stat -c %s "$STALE_FILE")" -eq $claim ]
      # bfo read: the bytes the file has up to its size, no zeros after them
      run --separate-stderr "$BFO" read --stats "$STALE_FILE"
      [ "$status" -eq 0 ] || { echo "bfo read: $status $stderr"; false; }
      [ "$output" = "$(head -c $claim "$W/s/data-$size" | sha256sum | cut -d' ' -f1)  $((claim < size ? claim : size))  $STALE_FILE" ] ||
        { echo "bfo read ($size $extra): $output"; false; }
      [[ $stderr == *" size_not_end=1"* ]] || { echo "stats: $stderr"; false; }
      # bfocp as cp: up to where its reads end; with -r the small file goes
      # through a batch (before 2026-11-28 that copy had zeros up to the
      # claimed size, or ended at it)
      "$BFOCP" "$STALE_FILE" "$W/s/cp"
      cmp "$W/s/data-$size" "$W/s/cp"
      rm -rf "$W/s/cpr"
      "$BFOCP" --stats -r "$(dirname "$STALE_FILE")" "$W/s/cpr" 2> "$W/s/cpr.err"
      [ $claim -gt 8388608 ] || grep -q "batched 1 files" "$W/s/cpr.err" ||
        { cat "$W/s/cpr.err"; false; }
      cmp "$W/s/data-$size" "$W/s/cpr/disk"
      # bfotar -c as stock tar: "File shrank", zeros, status 1; or its size
      for a in stock bfo; do
        set +e
        (cd "$(dirname "$STALE_FILE")" &&
           env PATH="$([ $a = bfo ] && echo "$ASBIN" || echo "$STOCKBIN"):/usr/bin:/bin" \
             tar -cf "$W/s/$a.tar" disk 2> "$W/s/$a.err")
        echo $? > "$W/s/$a.status"
        set -e
      done
      cmp "$W/s/stock.tar" "$W/s/bfo.tar"
      diff "$W/s/stock.err" "$W/s/bfo.err"
      diff "$W/s/stock.status" "$W/s/bfo.status"
      if [ $extra -gt 0 ]; then
        [ "$(cat "$W/s/bfo.status")" -eq 1 ]
        grep -q "disk: File shrank by $extra bytes; padding with zeros" "$W/s/bfo.err"
      fi
    done
  done
}
