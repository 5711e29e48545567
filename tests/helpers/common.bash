# common.bash: paths and helpers shared by the bats files (load 'helpers/common').
# Works under make check (top_srcdir/top_builddir exported) and under plain bats.

: "${top_srcdir:=$(cd "$BATS_TEST_DIRNAME/.." && pwd)}"
: "${top_builddir:=$top_srcdir}"
BFOCP=$top_builddir/src/bfocp
BFOTAR=$top_builddir/src/bfotar
BFO=$top_builddir/src/bfo
# libbfo reads a file that is wholly in the page cache from there, and bfotar
# leaves a warm tree to tar (BFO_CACHE_CHECK, libbfo(3)).  The tests read trees
# they have just written, so they turn that off to exercise the disk paths;
# the tests of the page-cache paths run with it unset.
export BFO_CACHE_CHECK=off
PACKAGE_VERSION=$(sed -n 's/^AC_INIT(\[bfo\], \[\([^]]*\)\].*/\1/p' "$top_srcdir/configure.ac")

# lock_pages DIR...: keep the data of every regular file under the DIRs in the
# page cache until unlock_pages: a helper maps each file, locks its mappings
# (mlockall) and waits to be killed.  Machines with proactive reclaim (a DAMON
# pageout scheme on the CI machine: pages of files read once are taken within
# seconds) would otherwise take some back, and the tests of the page-cache
# paths would see them cold.
LOCK_PAGES='
import ctypes, mmap, os, sys, time
keep = []
for top in sys.argv[1:-1]:
    for dp, dns, fns in os.walk(top):
        for n in fns:
            p = os.path.join(dp, n)
            if os.path.islink(p) or not os.path.isfile(p) or os.path.getsize(p) == 0:
                continue
            with open(p, "rb") as f:
                keep.append(mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ))
if ctypes.CDLL(None, use_errno=True).mlockall(1) != 0:
    sys.exit("mlockall: errno %d" % ctypes.get_errno())
open(sys.argv[-1], "w").close()
time.sleep(600)
'
lock_pages() {
  local flag=$BATS_TEST_TMPDIR/locked.$$.$RANDOM
  python3 -c "$LOCK_PAGES" "$@" "$flag" &
  LOCKER_PID=$!
  while [ ! -e "$flag" ]; do
    kill -0 "$LOCKER_PID" 2> /dev/null || { echo "cannot lock the pages of $*"; return 1; }
    sleep 0.1
  done
}
unlock_pages() {
  [ -n "${LOCKER_PID:-}" ] || return 0
  kill "$LOCKER_PID" 2> /dev/null || true
  wait "$LOCKER_PID" 2> /dev/null || true
  LOCKER_PID=
}

# nobody_reaches DIR: let user nobody search its way down to DIR (the bats
# temp dirs are private), to run the programs there as nobody; directories
# above the run's temp dir are left alone.
nobody_reaches() {
  local d=$1 top
  top=$(dirname "$BATS_RUN_TMPDIR")
  while [ "$d" != / ] && [ "$d" != /tmp ] && [ "$d" != "$top" ]; do
    chmod o+x "$d"
    d=$(dirname "$d")
  done
}

# Run the bfo programs under their upstream names, as they are when installed as
# the system's cp and tar: messages then start with "cp:" / "tar:" as GNU's do.
as_upstream_names() {
  ASBIN=$BATS_TEST_TMPDIR/asbin
  mkdir -p "$ASBIN"
  ln -sf "$BFOCP" "$ASBIN/cp"
  ln -sf "$BFOTAR" "$ASBIN/tar"
}

# A tree with the file types cp -a and tar care about.
make_sample_tree() {
  local d=$1
  mkdir -p "$d/sub/deeper" "$d/empty-dir"
  printf 'hello\n' > "$d/a.txt"
  : > "$d/empty"
  # deterministic bytes, so that two sample trees are identical
  LC_ALL=C awk 'BEGIN { srand(42); for (i = 0; i < 100000; i++) printf "%c", int(rand() * 256) }' > "$d/sub/random.bin"
  seq 1 20000 > "$d/sub/deeper/numbers"
  ln -s a.txt "$d/link-to-a"
  ln -s /nonexistent "$d/dangling"
  ln "$d/a.txt" "$d/sub/hardlink-to-a"
  mkfifo "$d/fifo"
  printf 'x' > "$d/sp ace & ünïcode"
  chmod 0640 "$d/sub/random.bin"
  chmod 0755 "$d/sub/deeper"
  touch -d '2001-02-03 04:05:06' "$d/a.txt" "$d/sub"
}

# One line per entry: path, type, mode, size, link count, mtime, content hash or link target.
manifest() {
  (cd "$1" && find . -mindepth 1 | LC_ALL=C sort | while IFS= read -r p; do
     if [ -L "$p" ]; then
       printf '%s link %s\n' "$p" "$(readlink "$p")"
     elif [ -f "$p" ]; then
       printf '%s file %s %s %s\n' "$p" "$(stat -c '%a %s %h %Y' "$p")" "$(sha256sum < "$p" | cut -c1-16)"
     else
       printf '%s %s %s\n' "$p" "$(stat -c '%F %a' "$p")" "$( [ -d "$p" ] && stat -c %Y "$p")"
     fi
   done)
}

# Flush and drop the page cache so that the next read comes from the (loop) disk.
drop_caches() {
  sync
  { echo 3 > /proc/sys/vm/drop_caches; } 2>/dev/null ||
    echo "# note: cannot drop caches; reads may come from the page cache" >&3
}

# expected_manifest PATH...: what bfo read PATH... must print, computed with sha256sum and
# stat: "<sha256>  <size>  <path>" for every regular file under the PATHs (symlinks not
# followed), sorted bytewise by path.  Paths must not contain tabs, newlines or backslashes.
expected_manifest() {
  local -A size
  local p s line
  while IFS=$'\t' read -r -d '' p s; do
    size[$p]=$s
  done < <(find "$@" -type f -exec stat --printf '%n\t%s\0' -- {} +)
  find "$@" -type f -print0 | xargs -0 -r sha256sum -- | while IFS= read -r line; do
    p=${line#*  }
    printf '%s\t%s  %s  %s\n' "$p" "${line%%  *}" "${size[$p]}" "$p"
  done | LC_ALL=C sort -t $'\t' -k1,1 | cut -f2-
}

# tree_manifest DIR: "PATH<TAB>SIZE MODE MTIME SHA256" per regular file under DIR, sorted
# bytewise.  MTIME has nanoseconds.  Paths must not hold tabs, newlines or backslashes.
tree_manifest() {
  local d=$1 t
  t=$(mktemp "$BATS_TEST_TMPDIR/manifest.XXXXXX")
  (cd "$d" && find . -type f -print0 | xargs -0 -r sha256sum -- |
     sed 's/^\([0-9a-f]*\)  \.\//\1\t/') > "$t.sums"
  (cd "$d" && find . -type f -printf '%P\t%s %m %T@\n') > "$t.meta"
  awk -F'\t' 'NR == FNR { h[$2] = $1; next } { print $1 "\t" $2 " " h[$1] }' \
    "$t.sums" "$t.meta" | LC_ALL=C sort
  rm -f "$t" "$t.sums" "$t.meta"
}

# Stock tar 1.34 from the pristine tarball, configured like the patched one;
# built once per build tree (about a minute) and kept in upstream/stock-tar.
# For setup_file: exports STOCK_TAR.
build_stock_tar() {
  local dir=$top_builddir/upstream/stock-tar
  export STOCK_TAR=$dir/tar-1.34/src/tar
  [ -x "$STOCK_TAR" ] && return 0
  local patched=$top_builddir/upstream/tar-1.34
  [ -f "$patched/config.status" ] || { echo "# $patched is not configured: run make" >&3; return 1; }
  mkdir -p "$dir/no-patches" && : > "$dir/no-patches/series"
  "$top_srcdir/build-aux/bfo-upstream" prepare tar "$UPSTREAM_CACHE" "$dir" "$dir/no-patches" >&3 2>&1
  local args
  args=$(cd "$patched" && ./config.status --config)
  (cd "$dir/tar-1.34" && eval "FORCE_UNSAFE_CONFIGURE=1 ./configure $args" &&
     make -C gnu && make -C lib && make -C src tar) > "$dir/build.log" 2>&1 ||
    { echo "# building stock tar failed; see $dir/build.log" >&3; return 1; }
}

# For setup: bfo programs as cp/tar in $ASBIN, stock tar as tar in $STOCKBIN, W the test's dir.
stock_tar_setup() {
  as_upstream_names
  STOCKBIN=$BATS_TEST_TMPDIR/stockbin
  mkdir -p "$STOCKBIN"
  ln -sf "$STOCK_TAR" "$STOCKBIN/tar"
  W=$BATS_TEST_TMPDIR
}

# make_stem_tree DIR: 120 files of whole 4 KiB blocks (blocks/wN) and 60 with
# a partial last block (blocks/tN), for the --clone-stem tests.
make_stem_tree() {
  local i
  mkdir -p "$1/blocks"
  for i in $(seq 1 120); do head -c $(( (i % 4 + 1) * 4096 )) /dev/urandom > "$1/blocks/w$i"; done
  for i in $(seq 1 60); do head -c $(( i * 211 + 4096 )) /dev/urandom > "$1/blocks/t$i"; done
}

# stem_counts FILE: the --stats line of bfocp or bfotar about the clone stem,
# as "STAGED CLONED FAILED" (nothing when no stem was used).
stem_counts() {
  sed -n 's/.*clone stem: \([0-9]*\) files .* writes[^;]*; \([0-9]*\) cloned .*, \([0-9]*\) written instead/\1 \2 \3/p' "$1"
}

# stem_writes FILE: the --stats line about the clone stem's writes, as
# "WRITES DIRECT" (those of them made with O_DIRECT).
stem_writes() {
  sed -n 's/.*clone stem: .* staged in \([0-9]*\) writes (\([0-9]*\) direct);.*/\1 \2/p' "$1"
}

# check_stem FS MODE ERRFILE DIR [AUTO_FS]: what --clone-stem=MODE must have
# done on FS for a make_stem_tree tree copied or extracted into DIR, by the
# --stats in ERRFILE: auto on the file systems AUTO_FS (default none) clones
# every whole-block file, always on any file system that clones every file
# with a whole block, and nothing else stages.
check_stem() {
  local fs=$1 mode=$2 c staged cloned failed auto=${5:-}
  c=$(stem_counts "$3")
  echo "# $fs $mode: ${c:-no stem}"
  [ "$mode" = auto ] && [[ " $auto " == *" $fs "* ]] && mode=auto-here
  case $fs-$mode in
    *-auto-here)
      read -r staged cloned failed <<< "$c"
      [ "$staged" -ge 120 ] || return 1
      [ "$cloned" -eq "$staged" ] || return 1
      [ "$failed" -eq 0 ] || return 1
      # (on XFS a block stops being shared once the stem is gone)
      [ "$fs" = xfs ] || filefrag -v "$4/blocks/w3" | grep -q shared || return 1 ;;
    *-always)
      read -r staged cloned failed <<< "$c"
      [ "$staged" -ge 180 ] || return 1
      [ "$cloned" -eq "$staged" ] || return 1
      [ "$failed" -eq 0 ] || return 1
      # (on XFS a block stops being shared once the stem is gone)
      [ "$fs" = xfs ] || filefrag -v "$4/blocks/t7" | grep -q shared || return 1 ;;
    *) [ -z "$c" ] || return 1 ;;
  esac
}

# whole_where_full OUT SRC: every regular file under OUT that has its size in
# SRC has its contents too (what a copy or extraction that ran out of space
# may leave: short files, never wrong ones of the right size).
whole_where_full() {
  (cd "$1" && find . -type f | while IFS= read -r f; do
     if [ "$(stat -c %s "$f")" -eq "$(stat -c %s "$2/$f")" ]; then
       cmp -s "$f" "$2/$f" || { echo "wrong contents: $f"; exit 1; }
     fi
   done)
}

# data_map DIR: per regular file below DIR, its size and data ranges by SEEK_DATA/SEEK_HOLE.
data_map() {
  python3 - "$1" <<'PY'
import os, sys
root = sys.argv[1]
for d, dirs, files in sorted(os.walk(root)):
    dirs[:] = [x for x in dirs if x != "lost+found"]
    for name in sorted(files):
        p = os.path.join(d, name)
        fd = os.open(p, os.O_RDONLY)
        size, pos, ranges = os.fstat(fd).st_size, 0, []
        while pos < size:
            try:
                data = os.lseek(fd, pos, os.SEEK_DATA)
            except OSError:
                break
            hole = os.lseek(fd, data, os.SEEK_HOLE)
            ranges.append("%d-%d" % (data, hole))
            pos = hole
        os.close(fd)
        print(os.path.relpath(p, root), size, ",".join(ranges) or "none")
PY
}

# sparse_tree DIR: files with holes at the start, middle and end, all hole, unaligned
# data, and a large one read in pieces.
sparse_tree() {
  mkdir -p "$1/s"
  truncate -s 10M "$1/s/all-hole"
  printf 'middle' | dd of="$1/s/middle" bs=1 seek=3000000 conv=notrunc status=none
  truncate -s 5M "$1/s/middle"
  head -c 12288 /dev/urandom > "$1/s/edges"
  head -c 8192 /dev/urandom | dd of="$1/s/edges" bs=4096 seek=1000 conv=notrunc status=none
  truncate -s 8M "$1/s/edges"
  printf 'tail' | dd of="$1/s/unaligned" bs=1 seek=12345 conv=notrunc status=none
  head -c 40M /dev/urandom > "$1/s/large"
  head -c 3M /dev/urandom | dd of="$1/s/large" bs=1M seek=200 conv=notrunc status=none
  printf 'dense\n' > "$1/s/dense"
}

# Memory cgroups (a container's memory limit), for tests that run a program
# under one.  memcg_new LIMIT: make a memory cgroup below ours limited to LIMIT
# (v1 memory.limit_in_bytes, else v2 memory.max), its directory in MEMCG; when
# there is none to make, say why in MEMCG_WHY and return 1.  memcg_run DIR
# CMD...: run CMD in it.  memcg_oom_kills DIR: how many of its processes the
# kernel killed for memory.  memcg_remove_all: remove those made (teardown).
memcg_new() {
  local lim=$1 path d parent
  MEMCG= MEMCG_WHY=
  if [ "$(id -u)" -ne 0 ]; then
    MEMCG_WHY="not running as root"
    return 1
  fi
  path=$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3; exit }' /proc/self/cgroup)
  if [ -n "$path" ] && [ -f "/sys/fs/cgroup/memory${path%/}/memory.limit_in_bytes" ]; then
    d=/sys/fs/cgroup/memory${path%/}/bfo-test-$$-$RANDOM
    if ! mkdir "$d" 2>/dev/null || ! echo "$lim" > "$d/memory.limit_in_bytes"; then
      MEMCG_WHY="cannot make a v1 memory cgroup under /sys/fs/cgroup/memory$path"
      return 1
    fi
  elif grep -qw memory /sys/fs/cgroup/cgroup.controllers 2>/dev/null; then
    path=$(awk -F: '$1 == "0" { print $3; exit }' /proc/self/cgroup)
    parent=/sys/fs/cgroup${path%/}
    d=$parent/bfo-test-$$-$RANDOM
    if ! grep -qw memory "$parent/cgroup.subtree_control" 2>/dev/null \
       && ! echo +memory > "$parent/cgroup.subtree_control" 2>/dev/null; then
      MEMCG_WHY="cannot enable the memory controller below $parent (cgroup v2)"
      return 1
    fi
    if ! mkdir "$d" 2>/dev/null || ! echo "$lim" > "$d/memory.max"; then
      MEMCG_WHY="cannot make a v2 memory cgroup under $parent"
      return 1
    fi
  else
    MEMCG_WHY="no memory cgroup controller (neither v1 nor v2)"
    return 1
  fi
  echo "$d" >> "$BATS_TEST_TMPDIR/memcgs"
  MEMCG=$d
}
memcg_run() {
  local d=$1
  shift
  sh -c 'echo $$ > "$1/cgroup.procs" && shift && exec "$@"' sh "$d" "$@"
}
memcg_oom_kills() {
  if [ -f "$1/memory.oom_control" ]; then
    awk '$1 == "oom_kill" { print $2 }' "$1/memory.oom_control"
  else
    awk '$1 == "oom_kill" { print $2 }' "$1/memory.events"
  fi
}
memcg_remove_all() {
  local d i
  [ -f "$BATS_TEST_TMPDIR/memcgs" ] || return 0
  while read -r d; do
    for i in 1 2 3 4 5; do
      rmdir "$d" 2>/dev/null && break
      sleep 0.2
    done
  done < "$BATS_TEST_TMPDIR/memcgs"
  rm -f "$BATS_TEST_TMPDIR/memcgs"
}

# dirs_of_three DIR FIRST LAST: directories DIR/dFIRST..dLAST, each of three
# files f1-f3 of 3000 random bytes (trees for file systems that fill up).
dirs_of_three() {
  local d i
  for d in $(seq "$2" "$3"); do
    mkdir -p "$1/d$d"
    for i in 1 2 3; do head -c 3000 /dev/urandom > "$1/d$d/f$i"; done
  done
}

# small_files_tree DIR DIRS FILES: DIRS directories of FILES files of 4 KiB of
# random bytes each (bigger than a small container's memory, for memcg tests).
small_files_tree() {
  python3 -c '
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
os.makedirs(root, exist_ok=True)
for d in range(dirs):
    os.mkdir(os.path.join(root, "d%03d" % d))
    for i in range(files):
        with open(os.path.join(root, "d%03d/f%04d" % (d, i)), "wb") as f:
            f.write(os.urandom(4096))' "$@"
}

# unit_on_fs VAR DIR PROG: run the C test tests/lib/PROG with VAR=DIR (the
# directory on the file system it needs); it must pass with no FAIL line.
unit_on_fs() {
  run env "$1=$2" "$top_builddir/tests/lib/$3"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output != *FAIL* ]]
}

# refuse_ready WHAT: REFUSE, tests/lib/refuse, can refuse WHAT (io_uring,
# openat2, syncfs, tmpfile) here, as a container's seccomp profile does;
# else skip, saying why.
refuse_ready() {
  REFUSE=$top_builddir/tests/lib/refuse
  local why
  why=$("$REFUSE" "$1" true 2>&1) || skip "cannot refuse $1 here: $why"
}

# overlay_mount DIR MNT: an overlay on MNT whose lower, upper and work
# directories are made in DIR (one file system, as Docker's overlay2);
# OVERLAY_MNT is MNT, for overlay_umount.  Skips, saying why, where
# overlays cannot be made.
overlay_mount() {
  grep -qw overlay /proc/filesystems || modprobe overlay 2> /dev/null ||
    skip "no overlay file system here (modprobe overlay failed)"
  mkdir -p "$1/lower" "$1/upper" "$1/work" "$2"
  mount -t overlay overlay -o "lowerdir=$1/lower,upperdir=$1/upper,workdir=$1/work" "$2" ||
    skip "cannot mount an overlay on $(stat -f -c %T "$1")"
  OVERLAY_MNT=$2
}

# overlay_umount: unmount overlay_mount's overlay, if any (teardown, before
# loop_cleanup_all).
overlay_umount() {
  if [ -n "${OVERLAY_MNT:-}" ] && findmnt -M "$OVERLAY_MNT" > /dev/null; then
    umount "$OVERLAY_MNT"
  fi
}
