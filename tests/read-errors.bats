#!/usr/bin/env bats
# read-errors.bats: a source disk with bad sectors.  bfocp and bfotar -c read
# file data ahead in batches (O_DIRECT through io_uring, several files a
# request) and bfo read --raw reads the block device itself; a read that fails
# there must cost no other file anything, and the files it hits must get GNU
# cp's and tar's own messages, results and exit status.  The bad sectors come
# from tests/lib/eio-disk (a FUSE program under a loop device), since this
# kernel has neither device-mapper nor fault injection.

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
  o=$(filefrag -e -b1 "$3" | awk '$1 == "0:" { sub(/\.\..*/, "", $4); print $4; exit }')
  if [ "$1" = btrfs ]; then   # a logical address in Btrfs's own address space
    btrfs-map-logical -l "$o" "$2" 2>/dev/null | awk '/physical/ { print $6; exit }'
  else
    echo "$o"
  fi
}

# bad_tree FS: a tree on FS at $W/m0 (300 small files in t/a, a 3 MB file and
# 50 small ones in t/b, 400 tiny ones in t/c), then moved onto a disk whose
# reads fail at the first block of t/a/f100, 1 MiB into t/b/big and, on ext4,
# at the inode table block of t/b/g7 and the first block of directory t/c.
# The file system ends up read-only on $W/m.
bad_tree() {
  local fs=$1 t=$W/m0/t i dev bad=() ino blk
  make_fs "$fs" "$W/m0"
  mkdir -p "$t/a" "$t/b" "$t/c"
  for i in $(seq 1 300); do head -c $((i * 61 % 20000 + 1)) /dev/urandom > "$t/a/f$i"; done
  head -c 3000000 /dev/urandom > "$t/b/big"
  for i in $(seq 1 50); do head -c 5000 /dev/urandom > "$t/b/g$i"; done
  for i in $(seq 1 400); do echo "$i" > "$t/c/n$i"; done
  sync
  dev=$(findmnt -n -o SOURCE -M "$W/m0")
  bad+=("$(first_byte "$fs" "$dev" "$t/a/f100")+4096")
  bad+=("$(( $(first_byte "$fs" "$dev" "$t/b/big") + 1048576 ))+4096")
  if [ "$fs" = ext4 ]; then
    ino=$(stat -c %i "$t/b/g7")
    blk=$(debugfs -R "imap <$ino>" "$dev" 2>/dev/null | awk '/located at block/ { sub(/,/, "", $4); print $4 }')
    bad+=("$((blk * 4096))+4096" "$(first_byte "$fs" "$dev" "$t/c")+4096")
  fi
  for i in "${bad[@]}"; do
    [[ $i =~ ^[0-9]+\+4096$ ]] || { echo "no offset for a bad sector: '$i' (${bad[*]})"; return 1; }
  done
  eio_remount "$W/m0" "$W/m" "${bad[@]}"
}

# same_as_gnu_cp CP-ARGS: GNU cp and bfocp (as "cp"), each from a cold cache,
# copy t from $W/m into $W/g/out and $W/b/out: same exit status, messages and
# trees.  GNU must have met the bad sectors.
same_as_gnu_cp() {
  local side p
  for side in g b; do
    if [ $side = g ]; then p=/usr/bin:/bin; else p=$ASBIN:/usr/bin:/bin; fi
    rm -rf "$W/$side"; mkdir -p "$W/$side"
    drop_caches
    (set +e; cd "$W/m" && env PATH="$p" BFO_STATS=0 cp "$@" t "$W/$side/out" \
       > "$W/$side.out" 2> "$W/$side.err"; echo $? > "$W/$side.rc")
  done
  cat "$W/b.err"
  grep -q "error reading 't/a/f100': Input/output error" "$W/g.err"
  diff "$W/g.rc" "$W/b.rc"
  [ "$(cat "$W/b.rc")" -eq 1 ]
  diff "$W/g.out" "$W/b.out"
  diff <(sort "$W/g.err") <(sort "$W/b.err")
  diff -r "$W/g/out" "$W/b/out"
  diff <(cd "$W/g/out" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort) \
       <(cd "$W/b/out" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort)
}

# same_as_gnu_tar TAR-ARGS: stock tar and bfotar, cold, archive t from $W/m:
# the same exit status, messages and archive, byte for byte.
same_as_gnu_tar() {
  local side p
  for side in g b; do
    if [ $side = g ]; then p=$STOCKBIN:/usr/bin:/bin; else p=$ASBIN:/usr/bin:/bin; fi
    drop_caches
    (set +e; cd "$W/m" && env PATH="$p" BFO_STATS=0 tar "$@" -cf "$W/$side.tar" t \
       > "$W/$side.out" 2> "$W/$side.err"; echo $? > "$W/$side.rc")
  done
  cat "$W/b.err"
  grep -q "t/a/f100: Read error at byte 0, while reading [0-9]* bytes: Input/output error" "$W/g.err"
  diff "$W/g.rc" "$W/b.rc"
  [ "$(cat "$W/b.rc")" -eq 2 ]
  diff "$W/g.out" "$W/b.out"
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

# ------------------------------------------------------------------ tests

@test "ext4 with bad sectors under data, an inode table and a directory: bfocp and bfotar -c fail as GNU does" {
  bad_tree ext4
  same_as_gnu_cp -r
  grep -q "error reading 't/b/big': Input/output error" "$W/g.err"
  grep -q "Input/output error" <(grep -v "t/a/f100\|t/b/big" "$W/g.err")
  same_as_gnu_cp -a
  batched_through_errors
  same_as_gnu_tar
  same_as_gnu_tar --sort=name
}

@test "XFS with bad sectors under file data: bfocp and bfotar -c fail as GNU does" {
  bad_tree xfs
  same_as_gnu_cp -r
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
  # The device reads were merged across files, and the failed ones retried.
  [[ $stderr =~ raw_files=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 300 ]
  [[ $stderr =~ fallback_other=([0-9]+) ]] && [ "${BASH_REMATCH[1]}" -ge 2 ]
  [ "$output" = "$plain" ]
  diff <(grep -v stats <<< "$stderr" | sort) <(sort <<< "$plain_err")
  [ "$(wc -l <<< "$output")" -ge 300 ]
}
