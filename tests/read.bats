#!/usr/bin/env bats
# read.bats: bfo read on real file systems (ext4 variants, xfs, btrfs+zstd, tmpfs), its listing
# checked against sha256sum/stat; plus --stats, unreadable files and files changing mid-read.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup() {
  require_root_loop
  MNT=$BATS_TEST_TMPDIR/mnt
  EXPECTED=$BATS_TEST_TMPDIR/expected
}

teardown() {
  unlock_pages
  # A background writer (see the last test) must be gone before unmounting.
  if [ -n "${WRITER:-}" ]; then
    touch "$BATS_TEST_TMPDIR/stop"
    wait "$WRITER" 2>/dev/null || true
  fi
  loop_cleanup_all
}

# ------------------------------------------------------------------ helpers

rand() { head -c "$1" /dev/urandom; }

# N bytes of highly compressible text (btrfs compresses it, so its extents are encoded).
text() { yes "bfo read test line: the quick brown fox jumps over the lazy dog 0123456789" | head -c "$1"; }

# make_tree DIR COUNT MAXSIZE SEED: COUNT files of random sizes 0..MAXSIZE (fixed by SEED)
# spread over nested directories DIR/dNN/eN/fI; odd I random bytes, even I compressible text.
make_tree() {
  perl -MFile::Path=make_path -e '
    my ($dir, $n, $max, $seed) = @ARGV;
    srand($seed);
    open(my $r, "<", "/dev/urandom") or die "urandom: $!";
    for my $i (0 .. $n - 1) {
      my $sub = sprintf("%s/d%02d/e%d", $dir, $i % 17, $i % 3);
      make_path($sub);
      my $size = int(rand($max + 1));
      my $data = "";
      if ($i % 2) { read($r, $data, $size) == $size or die "short read" if $size }
      else { $data = substr(("tree file $i says hello; " x (1 + $size / 20)), 0, $size) }
      open(my $f, ">", "$sub/f$i") or die "$sub/f$i: $!";
      print $f $data;
      close($f) or die "$sub/f$i: $!";
    }' "$@"
}

# populate DIR: the awkward files every file system must get right.
populate() {
  local d=$1 n i
  mkdir -p "$d"
  # Sizes around nothing, inline-data limits and one block.
  : > "$d/empty"
  rand 1 > "$d/one-byte"
  for n in 10 59 60 61 100 150 2047 2048 2049 4095 4096 4097; do rand "$n" > "$d/size-$n"; done
  text 1000 > "$d/small-text"

  # Sparse: hole at the start, in the middle, at the end, all hole, unaligned data.
  truncate -s 1M "$d/hole-start"
  rand 12288 | dd of="$d/hole-start" bs=4096 seek=253 conv=notrunc status=none
  rand 65536 > "$d/hole-middle"
  truncate -s 2M "$d/hole-middle"
  rand 65536 | dd of="$d/hole-middle" bs=65536 seek=31 conv=notrunc status=none
  rand 100000 > "$d/hole-end"
  truncate -s 3M "$d/hole-end"
  truncate -s 5M "$d/all-hole"
  truncate -s 777777 "$d/hole-unaligned"
  printf 'bfo' | dd of="$d/hole-unaligned" bs=1 seek=300007 conv=notrunc status=none
  text 200000 > "$d/hole-text"
  truncate -s 1M "$d/hole-text"
  text 100000 | dd of="$d/hole-text" bs=1024 seek=768 conv=notrunc status=none

  # Preallocated (unwritten) extents: all of it, in the middle, and past EOF (-n keeps size).
  fallocate -l 1M "$d/prealloc"
  rand 65536 > "$d/prealloc-middle"
  fallocate -o 65536 -l 131072 "$d/prealloc-middle"
  rand 65536 | dd of="$d/prealloc-middle" bs=65536 seek=3 conv=notrunc status=none
  rand 50000 > "$d/prealloc-past-eof"
  fallocate -n -o 50000 -l 2M "$d/prealloc-past-eof"

  # Fragmented: two files appended in turn, each chunk forced to disk before the next.
  for i in $(seq 1 16); do
    rand 8192 >> "$d/frag-a"
    sync "$d/frag-a"
    text 12288 >> "$d/frag-b"
    sync "$d/frag-b"
  done

  # Shared extents where the file system can (btrfs, xfs).
  cp --reflink=always "$d/frag-a" "$d/reflinked" 2>/dev/null || rm -f "$d/reflinked"

  # Not regular files: never listed, never read (a fifo would hang a reader).
  ln -s size-4096 "$d/link-to-file"
  ln -s /nonexistent "$d/link-dangling"
  mkdir -p "$d/tree"
  ln -s tree "$d/link-to-dir"
  mkfifo "$d/fifo"
  mknod "$d/char-dev-null" c 1 3
  perl -MIO::Socket::UNIX -e 'IO::Socket::UNIX->new(Local => $ARGV[0], Listen => 1) or die "socket: $!"' "$d/socket"

  # Names: spaces, unicode, a leading dash, a quote, 255 bytes, and bytewise order
  # ("sub-file" < "sub.txt" < "sub/x" bytewise, unlike a per-component order).
  rand 333 > "$d/sp ace  two"
  rand 444 > "$d/ünïcödé-日本語.bin"
  rand 555 > "$d/-leading-dash"
  rand 666 > "$d/quote'name"
  rand 777 > "$d/$(printf 'L%.0s' {1..251}).bin"
  mkdir -p "$d/sub"
  rand 11 > "$d/sub/x"
  rand 12 > "$d/sub-file"
  rand 13 > "$d/sub.txt"
  mkdir -p "$d/deep/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t"
  rand 5000 > "$d/deep/a/b/c/d/e/f/g/h/i/j/k/l/m/n/o/p/q/r/s/t/bottom"
  mkdir -p "$d/empty-dir"

  # A nested tree of ~300 small files of random sizes.
  make_tree "$d/tree" 300 20000 42
}

# A 1 GiB file, half data half holes: data in 128 MiB runs at 0, 256, 512 and 768 MiB,
# hole at the end.
make_big_mixed() {
  local f=$1 i
  truncate -s 1G "$f"
  for i in 0 2 4 6; do
    dd if=/dev/urandom of="$f" bs=1M count=128 seek=$((i * 128)) iflag=fullblock conv=notrunc status=none
  done
}

# check_read DIR [bfo read options...]: bfo read prints exactly $EXPECTED, nothing on
# stderr, and exits 0 (reading from disk: caches are dropped first).
check_read() {
  local dir=$1
  shift
  drop_caches
  run --separate-stderr timeout -k 10 300 "$BFO" read "$@" "$dir"
  if [ "$status" -eq 124 ] || [ "$status" -eq 137 ]; then
    echo "bfo read${*:+ $*} $dir did not finish within 300 s (stuck on the fifo or socket?)"
    return 1
  fi
  if [ "$status" -ne 0 ] || [ -n "$stderr" ]; then
    echo "bfo read${*:+ $*} $dir: exit status $status, stderr:"
    printf '%s\n' "$stderr"
    return 1
  fi
  if ! diff -u "$EXPECTED" <(printf '%s\n' "$output") > "$BATS_TEST_TMPDIR/diff"; then
    echo "bfo read${*:+ $*} $dir differs from sha256sum/stat (- expected, + bfo read):"
    head -n 60 "$BATS_TEST_TMPDIR/diff"
    return 1
  fi
}

# fs_check TYPE SIZE_MB [mkfs options...]: fresh file system with populate's files (plus
# whatever $EXTRA_FILES names: big64, big1g), then bfo read must match sha256sum/stat.
fs_check() {
  local type=$1 size=$2
  shift 2
  make_fs "$type" "$MNT" "$size" "$@"
  populate "$MNT"
  case " ${EXTRA_FILES:-} " in *" big64 "*) rand 64M > "$MNT/big-64MiB" ;; esac
  case " ${EXTRA_FILES:-} " in *" big1g "*) make_big_mixed "$MNT/big-1GiB-mixed" ;; esac
  drop_caches
  expected_manifest "$MNT" > "$EXPECTED"
  [ "$(wc -l < "$EXPECTED")" -gt 300 ]
  check_read "$MNT"
}

# ------------------------------------------------------------------ file systems

@test "bfo read hashes every file right on ext4 (1 GiB file too), also --no-direct and small batches" {
  EXTRA_FILES="big64 big1g" fs_check ext4 1536
  check_read "$MNT" --no-direct
  check_read "$MNT" --batch-files 7 --batch-bytes 100000 --depth 4
}

@test "bfo read hashes tiny inline-data files right on ext4 -O inline_data" {
  fs_check ext4 512 -O inline_data
}

@test "bfo read hashes files right on ext4 with bigalloc 64 KiB clusters" {
  fs_check ext4 512 -O bigalloc -C 65536
}

@test "bfo read hashes files right on xfs, 64 MiB file and reflinks included" {
  EXTRA_FILES=big64 fs_check xfs 512
}

@test "bfo read hashes zstd-compressed and inline extents right on btrfs" {
  MOUNT_OPTS=compress=zstd fs_check btrfs 512
  # The text really is stored compressed (else this test checks less than it says).
  filefrag -v "$MNT/hole-text" | grep -q encoded ||
    { echo "btrfs did not compress hole-text:"; filefrag -v "$MNT/hole-text"; false; }
}

@test "bfo read hashes files right on tmpfs" {
  fs_check tmpfs 512
}

# ------------------------------------------------------------------ specific cases

@test "bfo read takes files and directories together and lists them in one sorted listing" {
  make_fs tmpfs "$MNT" 64
  make_tree "$MNT/t1" 40 5000 7
  make_tree "$MNT/t2" 40 5000 8
  rand 100 > "$MNT/a-file"
  rand 200 > "$MNT/z-file"
  expected_manifest "$MNT/z-file" "$MNT/t2" "$MNT/a-file" "$MNT/t1" > "$EXPECTED"
  run --separate-stderr "$BFO" read "$MNT/z-file" "$MNT/t2" "$MNT/a-file" "$MNT/t1"
  [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
}

@test "bfo read --discard --stats prints no listing and counts every regular file on stderr" {
  make_fs ext4 "$MNT" 512
  populate "$MNT"
  local nfiles
  nfiles=$(find "$MNT" -type f | wc -l)
  drop_caches
  run --separate-stderr "$BFO" read --discard --stats "$MNT"
  [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
  [ -z "$output" ] || { echo "--discard printed a listing: ${lines[0]}..."; false; }
  [ "${#stderr_lines[@]}" -eq 1 ] || { echo "expected one stats line on stderr, got: $stderr"; false; }
  [[ ${stderr_lines[0]} == "bfo: stats:"* ]] || { echo "not a stats line: ${stderr_lines[0]}"; false; }
  [[ " ${stderr_lines[0]} " == *" files=$nfiles "* ]] ||
    { echo "stats do not say files=$nfiles: ${stderr_lines[0]}"; false; }
  [[ ${stderr_lines[0]} =~ \ bytes=[0-9]+(\ |$) ]] || { echo "no bytes=: ${stderr_lines[0]}"; false; }
  [[ ${stderr_lines[0]} =~ \ requests=[0-9]+(\ |$) ]] || { echo "no requests=: ${stderr_lines[0]}"; false; }

  # BFO_STATS=1 gives the same stats line, here along with the normal listing.
  expected_manifest "$MNT" > "$EXPECTED"
  drop_caches
  run --separate-stderr env BFO_STATS=1 "$BFO" read "$MNT"
  [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
  [ "${#stderr_lines[@]}" -eq 1 ] && [[ ${stderr_lines[0]} == "bfo: stats:"* ]] ||
    { echo "BFO_STATS=1 gave no single stats line: $stderr"; false; }
  [[ " ${stderr_lines[0]} " == *" files=$nfiles "* ]]
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
}

@test "bfo read as a user reports an unreadable file, still lists the others and exits 1" {
  make_fs tmpfs "$MNT" 128
  chmod 755 "$MNT"
  make_tree "$MNT/tree" 60 20000 3
  rand 4096 > "$MNT/tree/secret"
  rand 100 > "$MNT/readable"
  chmod 000 "$MNT/tree/secret"
  nobody_reaches "$MNT"
  su nobody -s /bin/sh -c 'cd "$0"' "$MNT" 2>/dev/null ||
    skip "user nobody cannot reach $MNT (TMPDIR not world-searchable)"
  su nobody -s /bin/sh -c '"$0" --version' "$BFO" >/dev/null 2>&1 ||
    skip "user nobody cannot run $BFO (build tree not world-accessible)"
  expected_manifest "$MNT" | grep -v "  $MNT/tree/secret\$" > "$EXPECTED"
  drop_caches
  run --separate-stderr su nobody -s /bin/sh -c 'exec "$0" read "$1"' "$BFO" "$MNT"
  [ "$status" -eq 1 ] || { echo "expected exit status 1, got $status; stderr: $stderr"; false; }
  [ "$stderr" = "bfo: cannot read '$MNT/tree/secret': Permission denied" ] ||
    { echo "unexpected stderr: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
}

@test "bfo read neither crashes nor misreports others while files are truncated, rewritten, deleted" {
  make_fs ext4 "$MNT" 512
  make_tree "$MNT/tree" 2000 20000 99
  # Victims: files whose name ends in 0 (200 of them); the others stay untouched.
  local -a victims
  mapfile -t victims < <(find "$MNT/tree" -type f -name '*0' | LC_ALL=C sort)
  [ "${#victims[@]}" -eq 200 ]
  expected_manifest "$MNT" > "$EXPECTED"
  grep -v '0$' "$EXPECTED" > "$EXPECTED.untouched"

  local -A known
  local p
  while IFS= read -r p; do known[$p]=1; done < <(cut -d' ' -f5- "$EXPECTED")

  local stop=$BATS_TEST_TMPDIR/stop junk round
  junk=$(text 7000)
  (
    trap - ERR
    set +e
    n=0
    while [ ! -e "$stop" ]; do
      for i in "${!victims[@]}"; do
        v=${victims[i]}
        case $(((n + i) % 5)) in
          0) : > "$v" ;;
          1) printf '%s' "$junk" > "$v" ;;
          2) rm -f -- "$v" ;;
          3) head -c 30000 /dev/urandom > "$v" ;;
          4) [ ! -e "$v" ] || truncate -s 3000 -- "$v" ;;
        esac
      done
      n=$((n + 1))
    done
  ) 3>&- &
  WRITER=$!

  local line re_ok re_err nerr
  re_ok='^[0-9a-f]{64}  [0-9]+  (/.*)$'
  re_err="^bfo: cannot read '(.*0)': (.+)\$"
  for round in 1 2 3; do
    drop_caches
    run --separate-stderr timeout -k 10 120 "$BFO" read "$MNT"
    [ "$status" -eq 0 ] || [ "$status" -eq 1 ] ||
      { echo "round $round: bfo read exited $status (>= 128 is a crash, 124 a hang); stderr: $stderr"; false; }
    # Untouched files: all listed, all right.
    if ! diff -u "$EXPECTED.untouched" <(printf '%s\n' "$output" | grep -v '0$') > "$BATS_TEST_TMPDIR/diff"; then
      echo "round $round: listing of untouched files differs (- expected, + bfo read):"
      head -n 40 "$BATS_TEST_TMPDIR/diff"
      false
    fi
    # Every line well formed and naming a file of the tree.
    for line in "${lines[@]}"; do
      [[ $line =~ $re_ok ]] || { echo "round $round: malformed line: $line"; false; }
      [ -n "${known[${BASH_REMATCH[1]}]:-}" ] || { echo "round $round: listed a path never created: $line"; false; }
    done
    # Errors only about victims, in bfo's format; errors if and only if exit status 1.
    nerr=0
    for line in "${stderr_lines[@]}"; do
      [[ $line =~ $re_err ]] || { echo "round $round: unexpected stderr line: $line"; false; }
      nerr=$((nerr + 1))
    done
    if [ "$nerr" -gt 0 ] && [ "$status" -ne 1 ]; then
      echo "round $round: $nerr errors reported but exit status $status"; false
    fi
    if [ "$status" -eq 1 ] && [ "$nerr" -eq 0 ]; then
      echo "round $round: exit status 1 without saying why: $stderr"; false
    fi
    echo "# round $round: exit $status, ${#lines[@]} files listed, $nerr errors" >&3
  done
}

@test "bfo read takes files wholly in the page cache from there (cachestat or mincore), the others from the disk" {
  make_fs ext4 "$MNT" 256
  make_tree "$MNT/t" 200 20000 5
  expected_manifest "$MNT" > "$EXPECTED"
  local ndata nsome how
  ndata=$(find "$MNT" -type f -size +0 | wc -l)
  cached() { sed -n 's/.* cached=\([0-9]*\).*/\1/p' <<< "$1"; }
  extents() { sed -n 's/.* extents=\([0-9]*\) .*/\1/p' <<< "$1"; }
  # Cold: every file from the disk (O_DIRECT reads leave the page cache alone).
  drop_caches
  run --separate-stderr env BFO_CACHE_CHECK= "$BFO" read --stats "$MNT"
  [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
  [ "$(cached "$stderr")" -eq 0 ] || { echo "cold, yet: $stderr"; false; }
  [ "$(extents "$stderr")" -ge "$ndata" ]
  # Some of them read through the page cache: those from there, the rest as
  # before.  (Locked there: lock_pages.)
  lock_pages "$MNT"/t/d0*
  nsome=$(find "$MNT"/t/d0* -type f -size +0 | wc -l)
  run --separate-stderr env BFO_CACHE_CHECK= "$BFO" read --stats "$MNT"
  [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
  [ "$(cached "$stderr")" -eq "$nsome" ] || { echo "expected cached=$nsome: $stderr"; false; }
  # All of them, asked with cachestat (Linux 6.5) and with mincore (before it).
  unlock_pages
  lock_pages "$MNT"
  for how in "" mincore; do
    run --separate-stderr env BFO_CACHE_CHECK=$how "$BFO" read --stats "$MNT"
    [ "$status" -eq 0 ] || { echo "status $status: $stderr"; false; }
    diff -u "$EXPECTED" <(printf '%s\n' "$output")
    [ "$(cached "$stderr")" -eq "$ndata" ] || { echo "$how: expected cached=$ndata: $stderr"; false; }
    [ "$(extents "$stderr")" -eq 0 ] || { echo "$how: cached files were mapped: $stderr"; false; }
  done
  # bfo plan shows the disk's reads, whatever is in the page cache.
  run -0 env BFO_CACHE_CHECK= "$BFO" plan "$MNT"
  [ "$(sed -n 's/^extents: *\([0-9]*\).*/\1/p' <<< "$output")" -ge "$ndata" ] || { echo "plan of a cached tree: $output"; false; }
  # BFO_CACHE_CHECK=off: the disk paths, as the other tests use them.
  run --separate-stderr env BFO_CACHE_CHECK=off "$BFO" read --stats "$MNT"
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
  [ "$(cached "$stderr")" -eq 0 ]
  # Another user's files: cachestat refuses them (EPERM) and mincore says
  # every page is cached (it may not fail there), so no one can tell; they
  # are read buffered, mapped in physical order with the others (from the
  # cache if there, else from the disk once).  Before, mincore's answer took
  # them all as cached: bfotar -c left a cold tree to tar.
  nobody_reaches "$MNT"
  chmod 755 "$MNT"
  unknown() { sed -n 's/.* cache_unknown=\([0-9]*\).*/\1/p' <<< "$1"; }
  for how in "" mincore; do
    run --separate-stderr su nobody -s /bin/sh -c 'exec env BFO_CACHE_CHECK="$2" "$0" read --stats "$1"' "$BFO" "$MNT/t" "$how"
    [ "$status" -eq 0 ] || { echo "$how: status $status: $stderr"; false; }
    diff -u "$EXPECTED" <(printf '%s\n' "$output")
    [ "$(cached "$stderr")" -eq 0 ] || { echo "${how:-cachestat}: taken as cached: $stderr"; false; }
    [ "$(unknown "$stderr")" -eq "$ndata" ] || { echo "${how:-cachestat}: expected cache_unknown=$ndata: $stderr"; false; }
    [ "$(extents "$stderr")" -ge "$ndata" ] || { echo "${how:-cachestat}: not mapped: $stderr"; false; }
  done
  # A seccomp filter that refuses cachestat whatever the file: mincore then,
  # believed for root's own files, not for another user's.
  refuse_ready cachestat
  run --separate-stderr env BFO_CACHE_CHECK= "$REFUSE" cachestat "$BFO" read --stats "$MNT/t"
  [ "$status" -eq 0 ] || { echo "refused, root: status $status: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
  [ "$(cached "$stderr")" -eq "$ndata" ] || { echo "refused, root: expected cached=$ndata: $stderr"; false; }
  run --separate-stderr su nobody -s /bin/sh -c 'exec env BFO_CACHE_CHECK= "$0" cachestat "$1" read --stats "$2"' "$REFUSE" "$BFO" "$MNT/t"
  [ "$status" -eq 0 ] || { echo "refused, nobody: status $status: $stderr"; false; }
  diff -u "$EXPECTED" <(printf '%s\n' "$output")
  [ "$(cached "$stderr")" -eq 0 ] || { echo "refused, nobody: taken as cached: $stderr"; false; }
  [ "$(unknown "$stderr")" -eq "$ndata" ] || { echo "refused, nobody: expected cache_unknown=$ndata: $stderr"; false; }
  unlock_pages
}
