#!/usr/bin/env bats
# recover.bats: crash tests of the batch writer: bfo write killed with SIGKILL at random
# points, then bfo recover: every file absent or complete and correct, no helper files
# left, the file system clean.  Also: recovery at writer start, bad and busy journals.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup() {
  require_root_loop
  MNT=$BATS_TEST_TMPDIR/mnt
  SRC=$BATS_TEST_TMPDIR/src
}

teardown() {
  if [ -n "${SLEEPER:-}" ]; then kill "$SLEEPER" 2>/dev/null; wait "$SLEEPER" 2>/dev/null; fi
  loop_cleanup_all
}

# ~2000 small files (0 B to ~30 KiB) in 20 directories, assorted modes and mtimes.
make_small_tree() {
  local d=$1 i
  for i in $(seq 0 19); do
    mkdir -p "$d/d$i"
    head -c $(( (i * 1499) % 9000 * 100 + 100 )) /dev/urandom |
      split -b $(( (i * 1499) % 9000 + 1 )) -a 2 - "$d/d$i/f"
  done
  for i in $(seq 1 20); do : > "$d/d$i-empty"; done
  chmod 600 "$d"/d3/*
  chmod 755 "$d"/d4/*
  touch -d '2001-02-03 04:05:06.5' "$d"/d5/*
}

now_ms() { echo $(( $(date +%s%N) / 1000000 )); }

# run_window [bfo write options...]: WINDOW="LO FULL", the milliseconds a run of bfo
# write from $SRC into $MNT takes to start up (a run on an empty tree) and in all.
run_window() {
  local start lo=-1 t full i
  rm -rf "$BATS_TEST_TMPDIR/empty" "$MNT/full"
  mkdir "$BATS_TEST_TMPDIR/empty"
  # (the fastest of two: one start-up in CI took 170 ms, the whole run 159 ms,
  # and 100 kills in 170-179 ms left no journal)
  for i in 1 2; do
    start=$(now_ms)
    "$BFO" write "$@" "$BATS_TEST_TMPDIR/empty" "$MNT/full"
    t=$(( $(now_ms) - start ))
    [ "$lo" -ge 0 ] && [ "$lo" -le "$t" ] || lo=$t
    rm -rf "$MNT/full"
  done
  start=$(now_ms)
  "$BFO" write "$@" "$SRC" "$MNT/full"
  full=$(( $(now_ms) - start + 20 ))
  rm -rf "$MNT/full"
  # (a window of less than a quarter of the run is not trusted: all of it)
  [ $(( 4 * (full - lo) )) -ge "$full" ] || lo=0
  WINDOW="$lo $full"
}

# kill_phase JOURNALS JTMPS STEMS TEMPS RECOVER_OUTPUT: where in a batch the writer was
# killed, from the helper files it left (counted before recovery) and what recovery then
# did with the batch.  (Ordered batches are direct: their targets are made at their names,
# so "mid-rename" there means some were whole and kept, others cut short and removed.)
kill_phase() {
  local journals=$1 jtmps=$2 stems=$3 temps=$4 out=$5 done was removed
  done=$(grep -c '^completed ' <<< "$out" || true)
  was=$(grep -c '^was complete ' <<< "$out" || true)
  removed=$(grep -c '^removed ' <<< "$out" || true)
  if [ "$journals" -eq 0 ] && [ "$jtmps" -gt 0 ]; then echo "mid-journal"
  elif [ "$journals" -eq 0 ]; then echo "no-batch"          # reading the next batch, start, end
  elif [ "$done" -eq 0 ] && [ "$was" -eq 0 ]; then            # nothing durable to complete from
    if [ "$stems" -gt 0 ]; then echo "mid-stem"
    elif [ "$temps" -gt 0 ]; then echo "mid-write"            # ordered: temporary files
    else echo "journal-only"; fi
  elif [ "$was" -eq 0 ]; then                                 # stem durable, nothing renamed
    if [ "$temps" -gt 0 ]; then echo "mid-clone"; else echo "stem-durable"; fi
  elif [ "$done" -eq 0 ] && [ "$removed" -eq 0 ]; then echo "after-renames"
  else echo "mid-rename"; fi
}

# crash_trials FS BACKEND TRIALS [bfo write options...]: kill -9 bfo write at random
# points of its run, then bfo recover; check every trial, then the file system after
# unmounting.  Prints how many kills landed in each phase of a batch (kill_phase).
crash_trials() {
  local fs=$1 backend=$2 trials=$3 t lo full delay pid
  shift 3
  make_fs "$fs" "$MNT" 1024
  make_small_tree "$SRC"
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/want"
  [ "$(wc -l < "$BATS_TEST_TMPDIR/want")" -ge 2000 ]
  # Batches of 200 files: a kill lands in any of the phases of some batch.
  local opts=(--backend "$backend" --batch-files 200 "$@")
  # Kills land between the end of start-up (a run on an empty tree) and the end of a
  # whole run, so most of them hit a batch.
  run_window "${opts[@]}"
  lo=${WINDOW% *} full=${WINDOW#* }
  local completed=0 removed=0 journals=0 nj njt ns nt phase
  declare -A phases=()
  # TRIALS kills, and more (up to 3 x TRIALS) until 3 have left a journal: on a
  # loaded machine a run's phases stretch unevenly and fewer kills land in a batch.
  t=0
  while [ "$t" -lt "$trials" ] || { [ "$journals" -lt 3 ] && [ "$t" -lt $((3 * trials)) ]; }; do
    t=$((t + 1))
    rm -rf "$MNT/dst"
    mkdir "$MNT/dst"
    delay=$(( lo + RANDOM * (full - lo) / 32768 ))
    "$BFO" write "${opts[@]}" "$SRC" "$MNT/dst" 2>/dev/null &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    nj=$(find "$MNT/dst" -maxdepth 1 -name '.bfo-journal.*' | wc -l)
    njt=$(find "$MNT/dst" -maxdepth 1 -name '.bfo-jtmp.*' | wc -l)
    ns=$(find "$MNT/dst" -maxdepth 1 -name '.bfo-stem.*' | wc -l)
    nt=$(find "$MNT/dst" -name '.bfo-tmp.*' | wc -l)
    [ "$nj" -gt 0 ] && journals=$((journals + 1))
    run --separate-stderr "$BFO" recover "$MNT/dst"
    [ "$status" -eq 0 ] || { echo "trial $t (kill at ${delay} ms): recover failed: $stderr"; false; }
    phase=$(kill_phase "$nj" "$njt" "$ns" "$nt" "$output")
    phases[$phase]=$(( ${phases[$phase]:-0} + 1 ))
    completed=$((completed + $(grep -c '^completed ' <<< "$output" || true)))
    removed=$((removed + $(grep -c '^removed ' <<< "$output" || true)))
    tree_manifest "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
    bad=$(comm -13 "$BATS_TEST_TMPDIR/want" "$BATS_TEST_TMPDIR/got" | head -5)
    [ -z "$bad" ] || { echo "trial $t (kill at ${delay} ms, $phase): wrong files: $bad"; false; }
    left=$(find "$MNT" -name '.bfo-*' | head -5)
    [ -z "$left" ] || { echo "trial $t (kill at ${delay} ms, $phase): left: $left"; false; }
  done
  local dist=
  for phase in "${!phases[@]}"; do dist+=" $phase=${phases[$phase]}"; done
  echo "# $fs/$backend: $t kills at $lo-$full ms: $journals left a journal," \
       "$completed files completed, $removed removed by recovery; kills by phase:$dist" >&3
  # Recovery did real work in some trials, not only after the end of a run.
  [ "$journals" -ge 3 ]
  local dev
  dev=$(findmnt -n -o SOURCE "$MNT")
  # A killed writer's io_uring is torn down asynchronously: the mount may be busy briefly.
  for t in 1 2 3 4 5 6 7 8 9 10; do umount "$MNT" 2>/dev/null && break; sleep 0.5; done
  ! findmnt -n -M "$MNT" >/dev/null
  case $fs in
    xfs) run xfs_repair -n "$dev" ;;
    ext4) run e2fsck -fn "$dev" ;;
    btrfs) run btrfs check "$dev" ;;
  esac
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "crash tests: reflink on XFS, 30 kills at random points, recover" {
  crash_trials xfs reflink 30
}

@test "crash tests: ordered on ext4, 30 kills at random points, recover" {
  crash_trials ext4 ordered 30
}

@test "crash tests: reflink on Btrfs, 30 kills at random points, recover" {
  crash_trials btrfs reflink 30
}

@test "crash tests: reflink on XFS with --layout=dir (a permuted stem), 15 kills, recover" {
  crash_trials xfs reflink 15 --layout=dir
}

# over_old_trials FS BACKEND TRIALS [present]: kill -9 bfo write over an older copy of
# the tree at random points, then bfo recover: every file is its old or its new
# version, or (unless "present") absent.
over_old_trials() {
  local fs=$1 backend=$2 trials=$3 present=${4:-}
  make_fs "$fs" "$MNT" 1024
  make_small_tree "$SRC"
  tree_manifest "$SRC" > "$BATS_TEST_TMPDIR/new"
  # The older copy: other contents in half of the directories, other modes in one.
  cp -a "$SRC" "$BATS_TEST_TMPDIR/old"
  local f i pid delay lo full t kept=0 journals=0
  for i in 1 3 5 7 9 11 13 15 17 19; do
    for f in "$BATS_TEST_TMPDIR/old/d$i"/*; do echo old >> "$f"; done
  done
  chmod 700 "$BATS_TEST_TMPDIR/old"/d2/*
  tree_manifest "$BATS_TEST_TMPDIR/old" > "$BATS_TEST_TMPDIR/oldm"
  cat "$BATS_TEST_TMPDIR/new" "$BATS_TEST_TMPDIR/oldm" | LC_ALL=C sort -u > "$BATS_TEST_TMPDIR/either"
  run_window --backend "$backend" --batch-files 200
  lo=${WINDOW% *} full=${WINDOW#* }
  for t in $(seq 1 "$trials"); do
    rm -rf "$MNT/dst"
    cp -a "$BATS_TEST_TMPDIR/old" "$MNT/dst"
    sync -f "$MNT"
    delay=$(( lo + RANDOM * (full - lo) / 32768 ))
    "$BFO" write --backend "$backend" --batch-files 200 "$SRC" "$MNT/dst" 2>/dev/null &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ -z "$(find "$MNT/dst" -maxdepth 1 -name '.bfo-journal.*')" ] || journals=$((journals + 1))
    run --separate-stderr "$BFO" recover "$MNT/dst"
    [ "$status" -eq 0 ] || { echo "trial $t: recover failed: $stderr"; false; }
    tree_manifest "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
    bad=$(comm -13 "$BATS_TEST_TMPDIR/either" "$BATS_TEST_TMPDIR/got" | head -5)
    [ -z "$bad" ] || { echo "trial $t (kill at $delay ms): neither old nor new: $bad"; false; }
    if [ -n "$present" ]; then
      bad=$(LC_ALL=C comm -23 <(cut -f1 "$BATS_TEST_TMPDIR/oldm" | LC_ALL=C sort) \
                              <(cut -f1 "$BATS_TEST_TMPDIR/got" | LC_ALL=C sort) | head -5)
      [ -z "$bad" ] || { echo "trial $t (kill at $delay ms): gone: $bad"; false; }
    fi
    kept=$((kept + $(comm -12 "$BATS_TEST_TMPDIR/oldm" "$BATS_TEST_TMPDIR/got" | comm -23 - "$BATS_TEST_TMPDIR/new" | wc -l)))
    left=$(find "$MNT" -name '.bfo-*' | head -5)
    [ -z "$left" ] || { echo "trial $t: left: $left"; false; }
  done
  echo "# $fs/$backend over an older tree: $trials kills at $lo-$full ms, $journals left a journal; old versions still there: $kept" >&3
  [ "$journals" -ge 1 ]
}

@test "crash tests: ordered on ext4 over an older copy of the tree, 15 kills: every file old, new or absent" {
  over_old_trials ext4 ordered 15
}

@test "crash tests: reflink on XFS over an older copy of the tree, 15 kills: every file old or new, none gone" {
  over_old_trials xfs reflink 15 present
}

# power_loss_trials FS BACKEND TRIALS [fresh]: bfo write over an older copy of the tree
# (with "fresh": into an empty directory); at a random point of its run the file
# system is shut down without flushing its log
# (xfs_io -x -c shutdown: the disk is left as a power loss would leave it, unlike
# kill -9, after which the page cache still writes everything back), unmounted,
# mounted again (log replay) and recovered: every file its old or its new version,
# none gone (fresh: every file there whole and right), no helper file left, the file
# system clean.  XFS and ext4 (Btrfs has
# no such shutdown on this kernel).
power_loss_trials() {
  local fs=$1 backend=$2 trials=$3 fresh=${4:-} t dev pid delay lo full journals=0 bad gone
  command -v xfs_io > /dev/null || skip "xfs_io is not installed (xfsprogs)"
  make_fs "$fs" "$MNT" 1024
  dev=$(findmnt -n -o SOURCE "$MNT")
  rm -rf "$SRC" "$BATS_TEST_TMPDIR/old"
  make_small_tree "$SRC"
  # Files the reflink backend clones from its stem: whole blocks, and whole blocks
  # plus a tail (the small tree's are all written whole).
  mkdir "$SRC/d20" "$SRC/d21"
  head -c $((40 * 8192)) /dev/urandom | split -b 8192 -a 2 - "$SRC/d20/f"
  head -c $((20 * 70001)) /dev/urandom | split -b 70001 -a 2 - "$SRC/d21/f"
  cp -a "$SRC" "$BATS_TEST_TMPDIR/old"
  local f i
  for i in 1 3 5 7 9 11 13 15 17 19 21; do
    for f in "$BATS_TEST_TMPDIR/old/d$i"/*; do echo old >> "$f"; done
  done
  sums() { (cd "$1" && find . -type f -print0 | xargs -0 -r sha256sum | LC_ALL=C sort); }
  sums "$SRC" > "$BATS_TEST_TMPDIR/new.sums"
  sums "$BATS_TEST_TMPDIR/old" > "$BATS_TEST_TMPDIR/old.sums"
  LC_ALL=C sort -u "$BATS_TEST_TMPDIR/new.sums" "$BATS_TEST_TMPDIR/old.sums" > "$BATS_TEST_TMPDIR/either"
  run_window --backend "$backend" --batch-files 200
  lo=${WINDOW% *} full=${WINDOW#* }
  for t in $(seq 1 "$trials"); do
    rm -rf "$MNT/dst"
    if [ -n "$fresh" ]; then mkdir "$MNT/dst"; else cp -a "$BATS_TEST_TMPDIR/old" "$MNT/dst"; fi
    sync -f "$MNT"
    delay=$(( lo + RANDOM * (full - lo) / 32768 ))
    "$BFO" write --backend "$backend" --batch-files 200 "$SRC" "$MNT/dst" 2>/dev/null &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    xfs_io -x -c shutdown "$MNT"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    for i in 1 2 3 4 5 6 7 8 9 10; do umount "$MNT" 2>/dev/null && break; sleep 0.5; done
    mount "$dev" "$MNT"
    [ -z "$(find "$MNT/dst" -maxdepth 1 -name '.bfo-journal.*')" ] || journals=$((journals + 1))
    run --separate-stderr "$BFO" recover "$MNT/dst"
    [ "$status" -eq 0 ] || { echo "trial $t (at $delay ms): recover failed: $stderr"; false; }
    sums "$MNT/dst" > "$BATS_TEST_TMPDIR/got"
    if [ -n "$fresh" ]; then
      bad=$(LC_ALL=C comm -13 "$BATS_TEST_TMPDIR/new.sums" "$BATS_TEST_TMPDIR/got" | head -5)
      [ -z "$bad" ] || { echo "trial $t (at $delay ms): not whole: $bad"; false; }
      left=$(find "$MNT" -name '.bfo-*' | head -5)
      [ -z "$left" ] || { echo "trial $t (at $delay ms): left: $left"; false; }
      continue
    fi
    bad=$(LC_ALL=C comm -13 "$BATS_TEST_TMPDIR/either" "$BATS_TEST_TMPDIR/got" | head -5)
    [ -z "$bad" ] || { echo "trial $t (at $delay ms): neither old nor new: $bad"; false; }
    gone=$(LC_ALL=C comm -23 <(awk '{ print $2 }' "$BATS_TEST_TMPDIR/old.sums" | LC_ALL=C sort) \
                             <(awk '{ print $2 }' "$BATS_TEST_TMPDIR/got" | LC_ALL=C sort) | head -5)
    [ -z "$gone" ] || { echo "trial $t (at $delay ms): gone: $gone"; false; }
    left=$(find "$MNT" -name '.bfo-*' | head -5)
    [ -z "$left" ] || { echo "trial $t (at $delay ms): left: $left"; false; }
  done
  local where="over an older tree"
  [ -z "$fresh" ] || where="into an empty directory"
  echo "# $fs/$backend, power loss (shutdown) $where: $trials at $lo-$full ms, $journals left a journal" >&3
  [ "$journals" -ge 1 ]
  for i in 1 2 3 4 5 6 7 8 9 10; do umount "$MNT" 2>/dev/null && break; sleep 0.5; done
  case $fs in
    xfs) run xfs_repair -n "$dev" ;;
    ext4) run e2fsck -fn "$dev" ;;
  esac
  echo "$output"
  [ "$status" -eq 0 ]
}

@test "power loss (XFS shut down, log not flushed) during bfo write over an older tree: every file old or new, none gone" {
  power_loss_trials xfs reflink 12
}

@test "power loss (ext4 shut down, journal not flushed) during bfo write over an older tree: every file old or new, none gone" {
  power_loss_trials ext4 ordered 12
}

@test "power loss during bfo write into an empty directory (XFS reflink, ext4 ordered): every file there whole" {
  power_loss_trials xfs reflink 10 fresh
  loop_cleanup_all
  power_loss_trials ext4 ordered 10 fresh
}

# kill bfo write into DST until a journal is left behind (at most 100 tries), at
# random points of a run (run_window: the machine's speed decides where they fall).
leave_journal() {
  local i pid lo full delay
  run_window --batch-files 200
  lo=${WINDOW% *} full=${WINDOW#* }
  for i in $(seq 1 100); do
    rm -rf "$1"; mkdir "$1"
    "$BFO" write --batch-files 200 "$SRC" "$1" 2>/dev/null &
    pid=$!
    delay=$(( lo + RANDOM * (full - lo) / 32768 ))
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    [ -z "$(find "$1" -maxdepth 1 -name '.bfo-journal.*')" ] || { echo "# try $i at ${lo}-${full}" >&3; return 0; }
  done
  echo "no journal left after 100 kills at ${lo}-${full} ms"
  return 1
}

@test "a new writer recovers the stale journals in its destination, then writes" {
  make_fs xfs "$MNT" 512
  make_small_tree "$SRC"
  leave_journal "$MNT/dst"
  # (two when a batch was filled while the one before it still synced)
  n=$(find "$MNT/dst" -maxdepth 1 -name '.bfo-journal.*' | wc -l)
  run --separate-stderr "$BFO" write --stats "$SRC" "$MNT/dst"
  [ "$status" -eq 0 ]
  [[ "$stderr" == *" recovered=$n "* ]]
  diff <(tree_manifest "$SRC") <(tree_manifest "$MNT/dst")
  [ -z "$(find "$MNT" -name '.bfo-*')" ]
}

@test "recover refuses a damaged journal and leaves alone a running writer's" {
  make_fs ext4 "$MNT" 512
  make_small_tree "$SRC"
  leave_journal "$MNT/dst"
  j=$(find "$MNT/dst" -maxdepth 1 -name '.bfo-journal.*' | sort | head -n 1)
  # (no -p: the journal's mtime does not matter; version 3 records the batch's
  # start inside it)
  cp "$j" "$BATS_TEST_TMPDIR/journal"
  # One flipped byte in the middle: refused, left in place, exit status 1.
  size=$(stat -c %s "$j")
  printf '\x55' | dd of="$j" bs=1 seek=$((size / 2)) conv=notrunc status=none
  cmp -s "$j" "$BATS_TEST_TMPDIR/journal" && printf '\xaa' | dd of="$j" bs=1 seek=$((size / 2)) conv=notrunc status=none
  run "$BFO" recover "$MNT/dst"
  [ "$status" -eq 1 ]
  [[ "$output" == *"'$j': not a valid journal (format or checksum); left in place"* ]]
  [ -e "$j" ]
  # A journal whose writer still runs is not touched.
  sleep 300 &
  SLEEPER=$!
  busy=$MNT/dst/.bfo-journal.$SLEEPER.1
  cp "$BATS_TEST_TMPDIR/journal" "$busy"
  cp "$BATS_TEST_TMPDIR/journal" "$j"
  run "$BFO" recover "$MNT/dst"
  [ "$status" -eq 1 ]
  [[ "$output" == *"'$busy': its writer is still running; left alone"* ]]
  [ -e "$busy" ] && [ ! -e "$j" ]
  rm "$busy"
  run "$BFO" recover "$MNT/dst"
  [ "$status" -eq 0 ]
  [ -z "$(find "$MNT" -name '.bfo-*')" ]
  comm -13 <(tree_manifest "$SRC") <(tree_manifest "$MNT/dst") > "$BATS_TEST_TMPDIR/bad"
  [ ! -s "$BATS_TEST_TMPDIR/bad" ]
}

# stop_with_journal PID DIR: stop process PID (SIGSTOP, every thread of it) at a
# moment when DIR holds one of its journals.  (A thread stops only when the call
# it is in returns: a journal being removed may go after the signal.)
stop_with_journal() {
  local pid=$1 dir=$2 try i t state stopped
  for try in $(seq 1 20); do
    for i in $(seq 1 2000); do
      compgen -G "$dir/.bfo-journal.*" > /dev/null && break
      sleep 0.005
    done
    kill -STOP "$pid" || return 1
    for i in $(seq 1 500); do
      stopped=1
      for t in /proc/"$pid"/task/*/stat; do
        state=$(sed 's/.*) //' "$t" 2>/dev/null | cut -d' ' -f1)
        [ "$state" = T ] || [ "$state" = t ] || [ -z "$state" ] || stopped=0
      done
      [ "$stopped" = 1 ] && break
      sleep 0.01
    done
    compgen -G "$dir/.bfo-journal.*" > /dev/null && return 0
    kill -CONT "$pid"
  done
  return 1
}

# other_ns_writer FS WHERE: bfo write into $MNT/dst, stopped (SIGSTOP) mid-batch, with
# WHERE=ns its own pid namespace (its pid there, 1, is also the pid of the writer and of
# the recovery started below in theirs) or WHERE=here this one (its pid means nothing
# in theirs).  A writer and a bfo recover, each in a new pid namespace, must leave its
# batch alone; then it finishes, whole.
other_ns_writer() {
  local fs=$1 where=$2 ns=() a kid i
  [ "$where" = ns ] && ns=(unshare --pid --fork)
  make_fs "$fs" "$MNT" 512
  mkdir "$MNT/dst"
  "${ns[@]}" "$BFO" write --batch-files 200 "$SRC" "$MNT/dst" 2> "$BATS_TEST_TMPDIR/a.err" &
  a=$!
  if [ "$where" = ns ]; then
    for i in $(seq 1 200); do kid=$(pgrep -P "$a") && break; sleep 0.01; done
  else
    kid=$a
  fi
  stop_with_journal "$kid" "$MNT/dst" || { echo "no journal to see on $fs ($where)"; return 1; }
  run --separate-stderr unshare --pid --fork "$BFO" write --stats "$BATS_TEST_TMPDIR/src2" "$MNT/dst"
  [ "$status" -eq 0 ] || { echo "$stderr"; kill -CONT "$kid"; return 1; }
  [[ "$stderr" == *" recovered=0 "* ]] || { echo "$stderr"; kill -CONT "$kid"; return 1; }
  run unshare --pid --fork "$BFO" recover "$MNT/dst"
  kill -CONT "$kid"
  [ "$status" -eq 1 ] && [[ "$output" == *"its writer is still running; left alone"* ]] \
    || { echo "bfo recover ($fs, $where): status $status: $output"; ls -a "$MNT/dst"; return 1; }
  wait "$a" || { cat "$BATS_TEST_TMPDIR/a.err"; return 1; }
  [ ! -s "$BATS_TEST_TMPDIR/a.err" ]
  diff -r --exclude=x "$SRC" "$MNT/dst"
  diff -r "$BATS_TEST_TMPDIR/src2/x" "$MNT/dst/x"
  [ -z "$(find "$MNT" -name '.bfo-*')" ]
  loop_cleanup_all
}

@test "writers in other pid namespaces (containers on one volume): a running batch is left alone, whatever its pid means here" {
  unshare --pid --fork true 2> /dev/null \
    || skip "unshare --pid --fork fails here (no util-linux unshare, or pid namespaces refused): cannot run writers in pid namespaces"
  make_small_tree "$SRC"
  mkdir -p "$BATS_TEST_TMPDIR/src2/x"
  for i in $(seq 1 50); do head -c $((i * 300)) /dev/urandom > "$BATS_TEST_TMPDIR/src2/x/g$i"; done
  for fs in xfs ext4; do
    other_ns_writer "$fs" ns
    other_ns_writer "$fs" here
  done
}
