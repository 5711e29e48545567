#!/usr/bin/env bats
# cp-batch.bats: bfocp with batching on behaves like GNU cp (Debian 12's /bin/cp
# is GNU cp 9.1): same trees, attributes, stdout, stderr and exit status, for
# the options cp users rely on, over trees big enough that batches really run.

load helpers/common
load helpers/loop

setup() {
  as_upstream_names
  T=$BATS_TEST_TMPDIR
  # bfocp does not batch sources in memory (tmpfs): give the tests a disk.
  if [ "$(stat -f -c %T "$T")" = tmpfs ]; then
    require_root_loop
    make_fs ext4 "$T/src" 256
  fi
}

teardown() {
  unlock_pages
  memcg_remove_all
  overlay_umount
  loop_cleanup_all
}

# make_batch_tree DIR: every file type, sparse files, hard links, xattrs, ACLs,
# unicode and long names, plus 360 small files in 12 directories (so batches
# run), with atimes in the future (no read updates them: both cps see the same).
make_batch_tree() {
  local d=$1 i j
  make_sample_tree "$d"
  for i in $(seq 1 12); do
    mkdir -p "$d/many/d$i"
    for j in $(seq 1 30); do
      head -c $(( (i * 977 + j * 131) % 9000 )) /dev/urandom > "$d/many/d$i/f$j"
    done
  done
  truncate -s 10M "$d/sparse-hole"
  printf 'start' | dd of="$d/sparse-mid" bs=1 seek=3000000 conv=notrunc 2>/dev/null
  dd if=/dev/zero of="$d/zeros" bs=64K count=4 2>/dev/null
  ln "$d/many/d1/f1" "$d/many/d2/link-to-d1-f1"
  setfattr -n user.colour -v blue "$d/many/d3/f3"
  setfattr -n user.empty "$d/a.txt"
  setfacl -m u:nobody:rx "$d/many/d4/f4"
  setfacl -d -m g:nogroup:rwx "$d/many/d5"
  long=$(printf 'L%.0s' $(seq 1 250))
  printf 'long\n' > "$d/many/$long"
  mkdir -p "$d/ünï/日本語"
  printf 'ü\n' > "$d/ünï/日本語/ファイル"
  chmod 0555 "$d/many/d6"        # read-only directory: its files still copied
  chmod 0600 "$d/many/d7/f7"
  chmod 4755 "$d/many/d8/f8"
  find "$d" \( -type f -o -type d \) -exec touch -a -d tomorrow {} +
  # files changed within 100 ms before the reader's window are cp's to read
  # (racy: a change after the read could keep their timestamps)
  sleep 0.2
}

# full_manifest DIR [notimes]: path, type, mode, owner, size, sparse or dense,
# link count, link target, mtime (unless notimes; symlinks' never), then the
# xattrs and ACLs of everything and the contents of the regular files.
full_manifest() {
  local notimes=${2:-}
  (cd "$1" || exit 1
   if [ -n "$notimes" ]; then
     find . -mindepth 1 -printf '%p %y %m %u:%g %s %b %n %l\n'
   else
     find . -mindepth 1 \( -type l -printf '%p %y %m %u:%g %s %b %n %l\n' \) -o \
                        -printf '%p %y %m %u:%g %s %b %n %l %T@ %A@\n'
   fi | awk '{ if ($2 == "f") $6 = ($6 * 512 < $5) ? "sparse" : "dense"; else $6 = "-";
               if ($2 == "d") $5 = "-"; print }' | LC_ALL=C sort
   getfattr -R -P -d -m - . 2>/dev/null | LC_ALL=C awk '/^# file:/ { f = $3; next } NF { print f, $0 }' | LC_ALL=C sort
   getfacl -R -P -p . 2>/dev/null | awk '/^# file:/ { f = $3; next } /^#/ || !NF { next } { print f, $0 }' | LC_ALL=C sort
   find . -type f -exec sha256sum {} + | LC_ALL=C sort -k2)
}

# same_as_gnu [--notimes] CP-ARGS...: run GNU cp and bfocp (as "cp") with the same
# arguments from $T/g and $T/b (each has its own copy of what ARGS name as
# destination, ../src is shared), then compare exit status, stdout, stderr and
# the destination trees.  The last argument is the destination.
same_as_gnu() {
  local notimes=
  if [ "$1" = --notimes ]; then notimes=1; shift; fi
  local dst=${!#}
  mkdir -p "$T/g" "$T/b"
  (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp "$@" > "$T/g.out" 2> "$T/g.err"; echo $? > "$T/g.rc")
  (set +e; cd "$T/b" && env PATH="$ASBIN:/usr/bin:/bin" BFO_STATS=0 cp "$@" > "$T/b.out" 2> "$T/b.err"; echo $? > "$T/b.rc")
  diff "$T/g.rc" "$T/b.rc"
  diff "$T/g.out" "$T/b.out"
  diff <(sort "$T/g.err") <(sort "$T/b.err")
  diff <(full_manifest "$T/g/$dst" $notimes) <(full_manifest "$T/b/$dst" $notimes)
}

# as_nobody_setup: $T reachable by nobody, and bfocp as $T/nbin/cp (the build
# tree itself may be in a directory nobody cannot enter).
# both_as_nobody CP-ARGS...: GNU cp in $T/g and bfocp in $T/b, as nobody (after
# as_nobody_setup), with CP-ARGS; both must fail with status 1 and print the
# same messages (in any order: deferred copies report later).
both_as_nobody() {
  local side p
  for side in g b; do
    if [ $side = g ]; then p=/usr/bin:/bin; else p=$T/nbin:/usr/bin:/bin; fi
    (set +e; cd "$T/$side" && runuser -u nobody -- env PATH="$p" cp "$@" > "$T/$side.out" 2> "$T/$side.err"; echo $? > "$T/$side.rc")
  done
  diff "$T/g.rc" "$T/b.rc"
  [ "$(cat "$T/b.rc")" -eq 1 ]
  diff <(sort "$T/g.err") <(sort "$T/b.err")
}

# merged_as_nobody OUT ARG...: cp ARG... as nobody in $T/g (GNU cp) and in
# $T/b (bfocp), stdout and stderr in one stream (their order counts) into
# $T/g.OUT and $T/b.OUT; the two exit statuses must be the same.
merged_as_nobody() {
  local out=$1 side p
  shift
  for side in g b; do
    if [ $side = g ]; then p=/usr/bin:/bin; else p=$T/nbin:/usr/bin:/bin; fi
    (set +e; cd "$T/$side" && runuser -u nobody -- env PATH="$p" cp "$@" > "$T/$side.$out" 2>&1; echo $? > "$T/$side.$out.rc")
  done
  diff "$T/g.$out.rc" "$T/b.$out.rc"
}

as_nobody_setup() {
  local d=$T
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
  mkdir -p "$T/nbin"
  cp "$BFOCP" "$T/nbin/cp"
  chmod 755 "$T/nbin" "$T/nbin/cp"
}

# batched N: bfocp's --stats line says N or more files were batched.
batched_at_least() {
  local n
  n=$(sed -n 's/.*batched \([0-9]*\) files.*/\1/p' "$1")
  [ -n "$n" ] && [ "$n" -ge "$2" ] || { echo "batched '$n' < $2 in $1:"; cat "$1"; return 1; }
}

@test "-r, -a, -p, --preserve=all, --no-preserve=mode: same as GNU cp, and batches ran" {
  make_batch_tree "$T/src"
  same_as_gnu --notimes -r ../src r
  same_as_gnu -a ../src a
  same_as_gnu -p -r ../src p
  same_as_gnu --preserve=all -r ../src all
  same_as_gnu --notimes -r --no-preserve=mode ../src nomode
  same_as_gnu --notimes -R --preserve=links,xattr ../src lx
  "$BFOCP" -a --stats "$T/src" "$T/stats" 2> "$T/stats.err"
  batched_at_least "$T/stats.err" 300
  grep -q 'data used for' "$T/stats.err"
  # -r takes the stat cp made just before the copy for the source's fstat
  # and opens no source whose data it holds; -a keeps the open (its xattrs
  # and ACL are read through it)
  ! grep -q 'sources cp did not open' "$T/stats.err"
  "$BFOCP" -r --stats "$T/src" "$T/stats-r" 2> "$T/stats-r.err"
  batched_at_least "$T/stats-r.err" 300
  grep -Eq 'sources cp did not open \(their data held, unchanged\): [1-9][0-9]{2}' "$T/stats-r.err"
}

@test "-v lists the same lines in the same order as GNU cp" {
  make_batch_tree "$T/src"
  same_as_gnu --notimes -rv ../src v
  [ "$(wc -l < "$T/b.out")" -gt 360 ]
}

@test "onto an existing tree: -u, -n, -f, --remove-destination, plain overwrite" {
  make_batch_tree "$T/src"
  for opt in "" -u -n -f --remove-destination; do
    for side in g b; do
      rm -rf "$T/$side/ex"; mkdir -p "$T/$side"
      cp -a "$T/src" "$T/$side/ex"
      # some files older, some newer, some different sizes
      find "$T/$side/ex/many/d2" -type f -exec touch -d '2000-01-01' {} +
      find "$T/$side/ex/many/d3" -type f -exec touch -d 'next year' {} +
      printf 'other\n' > "$T/$side/ex/many/d9/f9"
      chmod 0444 "$T/$side/ex/many/d10/f10"
    done
    same_as_gnu --notimes -r $opt ../src/. ex
  done
}

@test "-L, -P, -H, --parents, -t, -T, --strip-trailing-slashes, -x" {
  make_batch_tree "$T/src"
  ln -s many "$T/src/link-to-many"
  ln -s src "$T/src-link"
  same_as_gnu --notimes -rL ../src L
  same_as_gnu --notimes -rP ../src P
  same_as_gnu --notimes -rH ../src-link H
  mkdir -p "$T/g/par" "$T/b/par"
  same_as_gnu --notimes -r --parents ../src/many/d1 ../src/ünï par
  mkdir -p "$T/g/tdir" "$T/b/tdir"
  same_as_gnu --notimes -r -t tdir ../src/many ../src/sub
  same_as_gnu --notimes -rT ../src/many T
  same_as_gnu --notimes -r --strip-trailing-slashes ../src/ strip
  same_as_gnu --notimes -rx ../src x
}

@test "--sparse=auto|always|never and --reflink=auto|never: holes as GNU cp makes them" {
  make_batch_tree "$T/src"
  for s in auto always never; do
    same_as_gnu --notimes -r --sparse=$s ../src sparse-$s
  done
  same_as_gnu --notimes -r --reflink=never ../src nr
  same_as_gnu --notimes -r --reflink=auto ../src ra
}

@test "a directory into itself: same error; what is copied is whole" {
  make_batch_tree "$T/src"
  for side in g b; do mkdir -p "$T/$side"; cp -a "$T/src" "$T/$side/self"; done
  (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp -r self self/many/inside > "$T/g.out" 2>&1; echo $? >> "$T/g.out")
  (set +e; cd "$T/b" && env PATH="$ASBIN:/usr/bin:/bin" cp -r self self/many/inside > "$T/b.out" 2>&1; echo $? >> "$T/b.out")
  diff "$T/g.out" "$T/b.out"
  # How much is copied before cp meets its own destination depends on the inode
  # number the file system gives each new directory (copy_dir takes entries in
  # inode order), so GNU cp itself copies a different part from run to run (all
  # or none of many/'s 12 directories on this ext4 /tmp, 7 runs in 8).  What
  # must hold: every file in the destination is whole -- a copy of its source
  # (self/X into self/many/inside/X), or what was there before.
  local n=0
  while IFS= read -r -d '' f; do
    cmp -s "$T/b/self/many/inside/$f" "$T/src/$f" ||
      cmp "$T/b/self/many/inside/$f" "$T/src/many/inside/$f"
    n=$((n + 1))
  done < <(cd "$T/b/self/many/inside" && find . -type f -print0)
  [ "$n" -gt 0 ]
}

@test "unreadable files and directories (as nobody): same messages, status 1, the rest copied" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to run the copies as nobody"
  make_batch_tree "$T/src"
  chmod 000 "$T/src/many/d2/f5" "$T/src/many/d3/f8" "$T/src/many/d11"
  chmod -R a+rX "$T"; chmod 000 "$T/src/many/d2/f5" "$T/src/many/d3/f8" "$T/src/many/d11"
  mkdir -p "$T/g" "$T/b"; chown nobody "$T/g" "$T/b"
  as_nobody_setup
  both_as_nobody -r ../src out
  grep -q "cannot open '../src/many/d2/f5' for reading: Permission denied" "$T/b.err"
  diff <(full_manifest "$T/g/out" notimes) <(full_manifest "$T/b/out" notimes)
  # unreadable files are cp's to copy at once: its messages in its order
  # among the -v lines
  merged_as_nobody v -rv ../src v
  diff "$T/g.v" "$T/b.v"
  grep -q ' 2 unreadable, ' <(runuser -u nobody -- "$BFOCP" -r --stats "$T/src" "$T/b/again" 2>&1)
}

@test "sources made unreadable after the reader opened them (as nobody, cp stopped part-way): GNU cp's Permission denied, none copied but the one cp was at" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to run the copies as nobody and drop caches"
  command -v setpriv > /dev/null || skip "needs setpriv (util-linux): runuser would stop, not cp"
  local try pid rc n exercised=0
  python3 -c '
import os, sys
for d in range(10):
    os.makedirs(os.path.join(sys.argv[1], "d%d" % d))
    for f in range(300):
        with open(os.path.join(sys.argv[1], "d%d" % d, "f%d" % f), "wb") as o:
            o.write(os.urandom(4096))' "$T/w/src"
  as_nobody_setup
  chown -R nobody "$T/w"
  for try in 1 2 3 4 5 6 7 8; do
    chmod -R u+rwX "$T/w/src"; rm -rf "$T/w/dst"
    sync; echo 3 > /proc/sys/vm/drop_caches
    # setpriv execs cp itself, so that SIGSTOP stops it (runuser would wait in a parent)
    (cd "$T/w" && exec setpriv --reuid=nobody --regid="$(id -g nobody)" --clear-groups \
       "$T/nbin/cp" -r src dst 2> "$T/w/err") &
    pid=$!
    sleep "0.0$try"
    kill -STOP "$pid" 2> /dev/null || { wait "$pid" || true; continue; }
    # every source cp has not yet made a copy of, made unreadable while cp
    # stands still: the reader has opened (and read) some of them already
    python3 -c '
import os, sys
src, dst = sys.argv[1], sys.argv[2]
for d, _, names in os.walk(src):
    for n in names:
        rel = os.path.relpath(os.path.join(d, n), src)
        if not os.path.lexists(os.path.join(dst, rel)):
            os.chmod(os.path.join(src, rel), 0)
            print(rel)' "$T/w/src" "$T/w/dst" > "$T/w/chmodded"
    kill -CONT "$pid"
    rc=0; wait "$pid" || rc=$?
    n=$(wc -l < "$T/w/chmodded")
    [ "$n" -gt 0 ] || continue
    exercised=$((exercised + 1))
    # GNU cp: each one's open fails, nothing is created for it, status 1.
    # Except the one file cp may have been in the middle of when it was
    # stopped: GNU cp copies a source it opened before the chmod, and
    # bfocp one its stat by name (bfo_cp_fresh, which stands for the open)
    # saw unchanged before it.  That one is copied whole, and only it.
    (cd "$T/w/dst" && ls -d $(cat "$T/w/chmodded") 2> /dev/null) > "$T/w/copied" || true
    sed "s/^/try $try: copied: /" "$T/w/copied"
    [ "$(wc -l < "$T/w/copied")" -le 1 ]
    [ "$rc" -eq "$((n > $(wc -l < "$T/w/copied")))" ] ||
      { echo "try $try: status $rc, $n sources made unreadable"; cat "$T/w/err"; false; }
    while read -r f; do cmp "$T/w/src/$f" "$T/w/dst/$f"; done < "$T/w/copied"
    diff <(grep -vxFf "$T/w/copied" "$T/w/chmodded" | sed "s|.*|cannot open 'src/&' for reading: Permission denied|" | sort) \
         <(sed 's/^[^:]*: //' "$T/w/err" | sort)
  done
  [ "$exercised" -ge 2 ]
}

@test "read-only destination directory (as nobody): same messages and status, also with -a (which then gives it the source's mode)" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to run the copies as nobody"
  local opt side
  make_batch_tree "$T/src"
  chmod -R a+rX "$T/src"
  as_nobody_setup
  for opt in -r -a -rv; do
    rm -rf "$T/g" "$T/b"
    for side in g b; do
      mkdir -p "$T/$side/ro"; cp -r "$T/src/many" "$T/$side/ro/many"
      rm "$T/$side/ro/many/d3/f3" "$T/$side/ro/many/d4/f4"
      chown -R nobody "$T/$side"; chmod 555 "$T/$side/ro/many/d3" "$T/$side/ro/many/d4"
    done
    if [ $opt = -rv ]; then
      # the copies into a directory cp cannot write are cp's to make at
      # once: their messages in its order among the -v lines
      merged_as_nobody v -rv ../src/many ro
      diff "$T/g.v" "$T/b.v"
      grep -q "cannot create regular file 'ro/many/d3/f3': Permission denied" "$T/b.v"
    else
      both_as_nobody $opt ../src/many ro
      grep -q "cannot create regular file 'ro/many/d3/f3': Permission denied" "$T/b.err"
    fi
    diff <(full_manifest "$T/g/ro" notimes) <(full_manifest "$T/b/ro" notimes)
  done
  rm -rf "$T/b/ro/many/d2"
  grep -q ' [1-9][0-9]* not writable$' <(cd "$T/b" && runuser -u nobody -- "$T/nbin/cp" -r --stats ../src/many ro 2>&1)
}

@test "existing destination files cp cannot write (as nobody): -fv's removed lines and the messages without -f in GNU cp's order" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to run the copies as nobody"
  local opt side
  make_batch_tree "$T/src"
  chmod -R a+rX "$T/src"
  as_nobody_setup
  for opt in -rfv -rv; do
    rm -rf "$T/g" "$T/b"
    for side in g b; do
      mkdir -p "$T/$side"; cp -r "$T/src/many" "$T/$side/many"
      chmod 444 "$T/$side/many/d3/f3" "$T/$side/many/d4/f4" "$T/$side/many/d9/f1"
      chown -R nobody "$T/$side"
    done
    merged_as_nobody out $opt ../src/many/. many/
    grep -c "many/./d3/f3" "$T/g.out"
    diff "$T/g.out" "$T/b.out"
    diff <(full_manifest "$T/g/many" notimes) <(full_manifest "$T/b/many" notimes)
  done
  grep -qx "cp: cannot create regular file 'many/./d4/f4': Permission denied" "$T/b.out"
}

@test "ENOSPC on a small tmpfs: same status; no file reported copied is short" {
  require_root_loop
  make_batch_tree "$T/src"
  make_fs tmpfs "$T/small" 1
  run env PATH="$ASBIN:/usr/bin:/bin" cp -r "$T/src" "$T/small/out"
  [ "$status" -eq 1 ]
  [[ $output == *"No space left on device"* ]]
  # every file that reached its full size has the right contents
  whole_where_full "$T/small/out" "$T/src"
}

@test "nearly full XFS and Btrfs: the files GNU cp could not make are not made empty ahead; the one it fills part way gets as much" {
  require_root_loop
  local i fs
  mkdir -p "$T/src/big"
  for i in $(seq 1 40); do head -c 3000000 /dev/urandom > "$T/src/big/f$i"; done
  for fs in xfs btrfs; do
    rm -rf "$T/g" "$T/b"
    make_fs $fs "$T/g/m" 320
    make_fs $fs "$T/b/m" 320
    fill_to "$T/g/m" 61440
    fill_to "$T/b/m" 61440
    drop_caches
    same_as_gnu --notimes -r "$T/src/big" m/out
    grep -q 'No space left on device' "$T/b.err"
    # (bfocp batched before the disk ran full)
    (cd "$T/b" && rm -rf m/out && env PATH="$ASBIN:/usr/bin:/bin" cp -r --stats "$T/src/big" m/out 2>&1 | grep 'free space:') || false
    # XFS needs space for a new inode: the names after the disk filled fail,
    # as with GNU cp, where bfocp made them all empty ("error writing")
    [ $fs != xfs ] || grep -q "cannot create regular file 'm/out/f[0-9]*': No space left on device" "$T/b.err"
    umount_image "$T/g/m"
    umount_image "$T/b/m"
  done
}

@test "a Btrfs qgroup limit: the files GNU cp could not make are not made empty ahead; the one it fills part way gets as much" {
  require_root_loop
  local i d
  mkdir -p "$T/src/big"
  for i in $(seq 1 40); do head -c 3000000 /dev/urandom > "$T/src/big/f$i"; done
  # (statfs does not show a quota: 320 MiB free, 60 MiB allowed); a new
  # name, then into a target directory (cp's descriptor of it is O_PATH)
  for dst in m/out m/t/; do
    rm -rf "$T/g" "$T/b"
    for d in g b; do
      make_fs btrfs "$T/$d/m" 320
      qgroup_limit "$T/$d/m" 60M
      mkdir "$T/$d/m/t"
    done
    drop_caches
    same_as_gnu --notimes -r "$T/src/big" $dst
    grep -q "cannot create regular file 'm/[a-z]*/.*': Disk quota exceeded" "$T/b.err"
    # (bfocp batched before the quota ran out)
    (cd "$T/b" && rm -rf m/out m/t/big && env PATH="$ASBIN:/usr/bin:/bin" cp -r --stats "$T/src/big" $dst 2>&1 | grep 'free space:') || false
    umount_image "$T/g/m"
    umount_image "$T/b/m"
  done
}

@test "a 1 MiB ext4 whose directories run out of blocks: GNU cp's last mkdir fails, and so does bfocp's; no file cp wrote whole is left empty" {
  require_root_loop
  local d
  dirs_of_three "$T/src/tiny" 1 30
  for d in g b; do
    make_fs ext4 "$T/$d/m" 1 -b 1024 -N 256
    fill_to "$T/$d/m" 230
  done
  drop_caches
  same_as_gnu --notimes -r "$T/src/tiny" m/out
  grep -q "cannot create directory 'm/out/d[0-9]*': No space left on device" "$T/b.err"
}

@test "an ext4 out of inodes: the directory GNU cp could not make is not made ahead of the files before it" {
  require_root_loop
  local d
  dirs_of_three "$T/src/few" 0 3
  # (mkfs.ext4 -N 16: blocks to spare, inodes for three directories of three)
  for d in g b; do make_fs ext4 "$T/$d/m" 20 -N 16; done
  drop_caches
  same_as_gnu --notimes -a "$T/src/few" m/dst
  grep -q "cannot create directory 'm/dst/d3': No space left on device" "$T/b.err"
}

@test "ENOSPC within one ext4: GNU cp's copy_file_range message (error copying), error writing with --reflink=never; no file reported copied is short" {
  require_root_loop
  local opt tool
  for opt in "" --reflink=never; do
    for tool in gnu bfo; do
      make_fs ext4 "$T/e-$tool$opt" 24
      mkdir "$T/e-$tool$opt/src"
      python3 -c '
import os, sys
for i in range(600):
    with open(os.path.join(sys.argv[1], "f%03d" % i), "wb") as f:
        f.write(os.urandom(4096 * (1 + i % 10)))' "$T/e-$tool$opt/src"
      local bin=/usr/bin/cp
      [ "$tool" = gnu ] || bin=$BFOCP
      (cd "$T/e-$tool$opt" && "$bin" -r $opt src dst 2> "$T/$tool.err") && false
      sed -E "s/'[^']*'/Q/g; s/^[^:]*: //" "$T/$tool.err" | LC_ALL=C sort -u > "$T/$tool.kinds"
      whole_where_full "$T/e-$tool$opt/dst" "$T/e-$tool$opt/src"
    done
    cat "$T/gnu.kinds"
    if [ -z "$opt" ]; then
      grep -qx 'error copying Q to Q: No space left on device' "$T/gnu.kinds"
    else
      grep -qx 'error writing Q: No space left on device' "$T/gnu.kinds"
    fi
    # the same kinds of message for the data (cp writes some files part way:
    # the lists of names differ, and whether some creates fail too)
    diff <(grep -v '^cannot create regular file Q: ' "$T/gnu.kinds") \
         <(grep -v '^cannot create regular file Q: ' "$T/bfo.kinds")
  done
}

@test "files rewritten during the copy: every copy is one whole version" {
  # temporary files beside the tree, on its file system: renames stay atomic
  mkdir -p "$T/src/tree"
  for i in $(seq 1 400); do head -c 3000 /dev/zero | tr '\0' A > "$T/src/tree/f$i"; done
  ( for round in 1 2 3 4 5 6; do
      for i in $(seq 1 400); do
        head -c 3000 /dev/zero | tr '\0' "$round" > "$T/src/new" && mv "$T/src/new" "$T/src/tree/f$i"
      done
    done ) &
  writer=$!
  "$BFOCP" -r "$T/src/tree" "$T/out"
  wait "$writer"
  for f in "$T"/out/f*; do
    [ "$(tr -d "$(head -c1 "$f")" < "$f" | wc -c)" -eq 0 ] || { echo "mixed: $f"; false; }
    [ "$(stat -c %s "$f")" -eq 3000 ] || { echo "short: $f"; false; }
  done
}

@test "files changed just before their window (racy: timestamps a change after the read might keep) are read by cp itself: the tree as GNU cp -a's" {
  make_batch_tree "$T/src"
  # one with a modification time ahead of the clock, one changed right now
  touch -m -d "@$(( $(date +%s) + 3600 ))" "$T/src/many/d9/f9"
  printf 'changed' >> "$T/src/many/d10/f10"
  "$BFOCP" -a --stats "$T/src" "$T/b" 2> "$T/b.err"
  grep -Eq 'read but left to cp, changed just before: [1-9]' "$T/b.err"
  batched_at_least "$T/b.err" 300
  /bin/cp -a "$T/src" "$T/g"
  diff <(full_manifest "$T/g") <(full_manifest "$T/b")
}

@test "a file replaced again and again during cp -a, and cp -r --preserve=timestamps (which does not open sources it holds): data and times of one version" {
  local d i t v m
  mkdir -p "$T/src/tree/d1" "$T/src/tree/d2" "$T/src/tree/d3" "$T/src/tree/d4" "$T/src/tmp"
  for d in 1 2 3 4; do
    for i in $(seq 1 40); do head -c 3000 /dev/urandom > "$T/src/tree/d$d/g$i"; done
  done
  { echo "version 0"; head -c 300000 /dev/urandom; } > "$T/src/tree/d2/hot"
  touch -d @1000000000 "$T/src/tree/d2/hot"
  sync -f "$T/src"
  # each version written beside the tree, its time set, renamed over hot
  ( i=1; while :; do
      { echo "version $i"; head -c $((RANDOM * 10)) /dev/urandom; } > "$T/src/tmp/t$i"
      touch -d @$((1000000000 + i)) "$T/src/tmp/t$i"; mv "$T/src/tmp/t$i" "$T/src/tree/d2/hot"
      i=$((i + 1))
    done ) &
  mutator=$!
  local bad= opts
  for t in $(seq 1 40); do
    rm -rf "$T/out"
    opts=-a
    [ $((t % 2)) = 0 ] || opts="-r --preserve=timestamps"
    env BFO_CACHE_CHECK=off "$BFOCP" $opts "$T/src/tree" "$T/out" 2> "$T/err" || true
    if [ ! -f "$T/out/d2/hot" ]; then
      grep -q 'replaced while being copied' "$T/err" || bad="run $t: no copy: $(cat "$T/err")"
      continue
    fi
    v=$(head -1 "$T/out/d2/hot" | cut -d' ' -f2); m=$(( $(stat -c %Y "$T/out/d2/hot") - 1000000000 ))
    [ "$v" = "$m" ] || bad="run $t ($opts): data of version $v, mtime of version $m"
    [ -z "$bad" ] || break
  done
  kill "$mutator"; wait "$mutator" 2>/dev/null || true
  [ -z "$bad" ] || { echo "$bad"; false; }
}

@test "onto destination names that are one file (hard links, a symbolic link to a file also copied onto): written in cp's order, as GNU cp" {
  local i side
  mkdir -p "$T/src/d"
  for i in $(seq 1 100); do head -c 3000 /dev/urandom > "$T/src/d/g$i"; done
  printf 'new contents of f1\n' > "$T/src/d/f1"
  # hard links f1 and f2: GNU cp writes f2 (empty, never deferred) last
  : > "$T/src/d/f2"
  printf 'contents of h2\n' > "$T/src/d/h2"
  printf 'new contents of h1\n' > "$T/src/d/h1"
  for side in g b; do
    mkdir -p "$T/$side/dst/d"
    printf 'old\n' > "$T/$side/dst/d/f1"
    ln "$T/$side/dst/d/f1" "$T/$side/dst/d/f2"
    # h2 a symbolic link to h1: both copies write h1, the later one wins
    printf 'old h1\n' > "$T/$side/dst/d/h1"
    ln -s h1 "$T/$side/dst/d/h2"
  done
  (cd "$T/g" && env PATH=/usr/bin:/bin cp -rT ../src dst)
  (cd "$T/b" && env PATH="$ASBIN:/usr/bin:/bin" cp -rT --stats ../src dst 2> "$T/b.err")
  diff <(full_manifest "$T/g/dst" notimes) <(full_manifest "$T/b/dst" notimes)
  [ ! -s "$T/b/dst/d/f1" ]
  grep -q "copied in cp's order after the deferred ones: [1-9]" "$T/b.err"
}

@test "destination symbolic links to files deferred copies write or make: cp -r follows them, cp -a -u compares the written file, as GNU cp" {
  local side
  mkdir -p "$T/src/d"
  for i in $(seq 1 100); do head -c 3000 /dev/urandom > "$T/src/d/g$i"; done
  # made in this order, so that both cps copy a before b, and x before y
  # (new files of one directory take increasing inode numbers)
  printf 'file A\n' > "$T/src/d/a"; printf 'file B\n' > "$T/src/d/b"
  printf 'file X, newer\n' > "$T/src/d/x"; printf 'file Y, older\n' > "$T/src/d/y"
  touch -d 2023-01-01 "$T/src/d/x"; touch -d 2020-01-01 "$T/src/d/y"
  for side in g b s; do
    mkdir -p "$T/$side/r/d" "$T/$side/u/d"
    # dangling until a is copied: GNU cp then writes b's data through it
    ln -s a "$T/$side/r/d/b"
    # x and y both reach victim: after x's copy, -u finds it newer than y
    printf 'victim\n' > "$T/$side/u/victim"; touch -d 2001-01-01 "$T/$side/u/victim"
    ln -s ../victim "$T/$side/u/d/x"; ln -s ../victim "$T/$side/u/d/y"
  done
  sync -f "$T"
  # stdout and stderr in one stream, and the status; bfocp once more (in s) for --stats
  (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp -rv ../src/. r > r.out 2>&1; echo $? >> r.out
   env PATH=/usr/bin:/bin cp -a -u -v ../src/. u > u.out 2>&1; echo $? >> u.out)
  (set +e; cd "$T/b" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -rv ../src/. r > r.out 2>&1; echo $? >> r.out
   env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -a -u -v ../src/. u > u.out 2>&1; echo $? >> u.out)
  (cd "$T/s" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -r --stats ../src/. r 2> r.err
   env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -a -u --stats ../src/. u 2> u.err)
  diff "$T/g/r.out" "$T/b/r.out"
  diff "$T/g/u.out" "$T/b/u.out"
  diff <(full_manifest "$T/g/r" notimes) <(full_manifest "$T/b/r" notimes)
  diff <(full_manifest "$T/g/u") <(full_manifest "$T/b/u")
  # (inode numbers give cp's order: a before b, x before y, unless another
  # process freed a lower one meanwhile)
  if [ "$(cat "$T/g/r/d/a")" = "file B" ]; then
    [ "$(cat "$T/b/r/d/a")" = "file B" ]
    grep -q "finished before cp looked at destinations they write: 1$" "$T/s/r.err"
  fi
  if [ "$(cat "$T/g/u/victim")" = "file X, newer" ]; then
    [ "$(cat "$T/b/u/victim")" = "file X, newer" ]
    # (a destination reached through a symbolic link is copied at once)
    grep -q "copied in cp's order after the deferred ones: [1-9]" "$T/s/u.err"
  fi
  # A link that stays dangling: cp refuses to write through it, in its order
  # (here before the error about q, a directory in the way).  -u through a
  # link to a directory cp made: compared with the times cp gave it.
  mkdir -p "$T/src2/a" "$T/src2/fill"
  for i in $(seq 1 60); do
    head -c 3000 /dev/urandom > "$T/src2/a/g$i"; head -c 3000 /dev/urandom > "$T/src2/fill/h$i"
  done
  echo 'file b' > "$T/src2/b"; echo p > "$T/src2/fill/p"; echo q > "$T/src2/fill/q"
  touch -d 2010-01-01 "$T/src2/b"; touch -d 2000-01-01 "$T/src2/a"
  for side in g b; do
    mkdir -p "$T/$side/n/fill" "$T/$side/n/fill/q"; ln -s nowhere "$T/$side/n/fill/p"
    mkdir -p "$T/$side/ud"; ln -s a "$T/$side/ud/b"
  done
  sync -f "$T"
  (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp -rv ../src2/. n > n.out 2>&1; echo $? >> n.out
   env PATH=/usr/bin:/bin cp -R -u --preserve=timestamps ../src2/. ud > ud.out 2>&1; echo $? >> ud.out)
  (set +e; cd "$T/b" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -rv ../src2/. n > n.out 2>&1; echo $? >> n.out
   env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -R -u --preserve=timestamps ../src2/. ud > ud.out 2>&1; echo $? >> ud.out)
  diff "$T/g/n.out" "$T/b/n.out"
  grep -q "not writing through dangling symlink" "$T/b/n.out"
  diff "$T/g/ud.out" "$T/b/ud.out"
  # (cp's order of a and b is their inode numbers': b before a when the
  # directory a got a higher one, and then the link is still dangling)
  grep -E -q "cannot overwrite directory 'ud/./b' with non-directory|not writing through dangling symlink 'ud/./b'" "$T/b/ud.out"
  # -u remembers the files it skips: c (the same file as b under -L) becomes
  # a hard link to b's destination, followed to the a cp made before
  mkdir -p "$T/src3/fill"
  for i in $(seq 1 100); do head -c 3000 /dev/urandom > "$T/src3/fill/g$i"; done
  echo 'file a' > "$T/src3/a"; echo top > "$T/top"; ln -s ../top "$T/src3/b"; ln -s ../top "$T/src3/c"
  touch -d 2001-01-01 "$T/top"
  for side in g b; do mkdir -p "$T/$side/l"; ln -s a "$T/$side/l/b"; ln -s other "$T/$side/l/c"; done
  sync -f "$T"
  (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp -r -L -u --remove-destination ../src3/. l > l.out 2>&1; echo $? >> l.out)
  (set +e; cd "$T/b" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -r -L -u --remove-destination ../src3/. l > l.out 2>&1; echo $? >> l.out)
  diff "$T/g/l.out" "$T/b/l.out"
  diff <(full_manifest "$T/g/l" notimes) <(full_manifest "$T/b/l" notimes)
  # (when cp takes a before b and c: the order of their inode numbers)
  if [ "$(stat -c %i "$T/g/l/a")" = "$(stat -c %i "$T/g/l/c")" ]; then
    [ "$(stat -c %i "$T/b/l/a")" = "$(stat -c %i "$T/b/l/c")" ]
  fi
}

@test "a destination symbolic link chain the copy itself re-points (x -> m -> victim, then m copied): written where GNU cp writes" {
  local kind o side
  mkdir -p "$T/src/fill"
  for i in $(seq 1 100); do head -c 3000 /dev/urandom > "$T/src/fill/g$i"; done
  for kind in dir file; do
    rm -rf "$T/src/x" "$T/src/y" "$T/src/m" "$T/src/dir"
    echo 'data of y' > "$T/src/y"; mkdir "$T/src/dir"; echo 'data of x' > "$T/src/x"
    if [ $kind = dir ]; then ln -s dir "$T/src/m"; else ln -s y "$T/src/m"; fi
    sync -f "$T"
    for o in -R -Rf; do
      for side in g b; do
        rm -rf "$T/$side"; mkdir -p "$T/$side/out"; echo victim > "$T/$side/out/victim"
        ln -s m "$T/$side/out/x"; ln -s victim "$T/$side/out/m"
      done
      (set +e; cd "$T/g" && env PATH=/usr/bin:/bin cp $o ../src/. out > o.out 2>&1; echo $? >> o.out)
      (set +e; cd "$T/b" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp $o ../src/. out > o.out 2>&1; echo $? >> o.out)
      diff "$T/g/o.out" "$T/b/o.out"
      diff <(full_manifest "$T/g/out" notimes) <(full_manifest "$T/b/out" notimes)
    done
  done
}

@test "cp -rL through source symbolic links into the destination (a file and a directory the copy makes): as GNU cp" {
  mkdir -p "$T/src/d" "$T/src/e"
  for i in $(seq 1 100); do head -c 3000 /dev/urandom > "$T/src/d/g$i"; done
  echo 'new content of a' > "$T/src/d/a"
  ln -s ../../out/d/a "$T/src/e/x"; ln -s ../../out/d "$T/src/e/dd"
  sync -f "$T"
  # one source for both (one order of entries); the links lead into $T/out
  (set +e; cd "$T" && env PATH=/usr/bin:/bin cp -rvL src/. out > g.out 2>&1; echo $? >> g.out)
  mv "$T/out" "$T/g-out"
  (set +e; cd "$T" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -rvL src/. out > b.out 2>&1; echo $? >> b.out)
  diff "$T/g.out" "$T/b.out"
  diff <(full_manifest "$T/g-out" notimes) <(full_manifest "$T/out" notimes)
  # (when cp copies d before e: the order of their inode numbers)
  if [ -e "$T/g-out/e/x" ]; then
    [ "$(cat "$T/out/e/x")" = "new content of a" ]
    [ "$(ls "$T/out/e/dd" | wc -l)" -eq 101 ]
  fi
}

@test "a destination name linking into the source tree (-a), and -p of hard-linked sources: data and times as GNU cp" {
  local side i
  for side in g b; do
    mkdir -p "$T/$side/src/d" "$T/$side/out/src/d"
    printf 'new data of f1\n' > "$T/$side/src/d/f1"    # made first: copied first
    for i in $(seq 1 100); do head -c 3000 /dev/zero > "$T/$side/src/d/g$i"; done
    printf 'old f2\n' > "$T/$side/src/d/f2"
    touch -d '2001-01-01 00:00:00.123456789' "$T/$side/src/d/f2" "$T/$side/src/d"/g*
    touch -d '2002-02-02 00:00:00.5' "$T/$side/src/d/f1"
    # cp writes f1's data through it into the source's f2, then copies f2
    ln -s ../../../src/d/f2 "$T/$side/out/src/d/f1"
    touch -d 2003-03-03 "$T/$side/src/d" "$T/$side/src"
  done
  sync -f "$T"
  (cd "$T/g" && env PATH=/usr/bin:/bin cp -a src out)
  (cd "$T/b" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -a --stats src out 2> "$T/b.err")
  cat "$T/b.err"
  diff <(full_manifest "$T/g/out") <(full_manifest "$T/b/out")
  [ "$(cat "$T/b/out/src/d/f2")" = "new data of f1" ]
  grep -q "copied in cp's order after the deferred ones: [1-9]" "$T/b.err"
  # -rp, f1 and f2 one file whose atime is older than its mtime: GNU cp reads
  # f1 (relatime sets its atime) before it stats f2
  rm -rf "$T/h"; mkdir -p "$T/h/src/d"
  echo data > "$T/h/src/d/f1"; ln "$T/h/src/d/f1" "$T/h/src/d/f2"
  for i in $(seq 1 100); do head -c 3000 /dev/zero > "$T/h/src/d/g$i"; done
  touch -m -d '2021-01-01' "$T/h/src/d/f1"; touch -a -d '2020-01-01' "$T/h/src/d/f1"
  (cd "$T/h" && env BFO_CACHE_CHECK=off PATH="$ASBIN:/usr/bin:/bin" cp -rp src dst)
  [ "$(stat -c %X "$T/h/dst/d/f1")" = "$(date -d 2020-01-01 +%s)" ]
  [ "$(stat -c %X "$T/h/dst/d/f2")" = "$(stat -c %X "$T/h/src/d/f1")" ]
  [ "$(stat -c %X "$T/h/dst/d/f2")" -gt "$(date -d 2021-01-01 +%s)" ]
}

@test "--batch=never, BFO_DISABLE=1, --stats, --progress and bad option values" {
  make_batch_tree "$T/src"
  "$BFOCP" -r --batch=never --stats "$T/src" "$T/n" 2> "$T/n.err"
  grep -q 'batched 0 files' "$T/n.err"
  BFO_DISABLE=1 "$BFOCP" -r --stats "$T/src" "$T/d" 2> "$T/d.err"
  grep -q 'batched 0 files' "$T/d.err"
  "$BFOCP" -r --batch-files=64 --batch-bytes=256K --io-depth=8 --stats "$T/src" "$T/s" 2> "$T/s.err"
  batched_at_least "$T/s.err" 300
  diff <(full_manifest "$T/n" notimes) <(full_manifest "$T/s" notimes)
  "$BFOCP" -r --progress "$T/src" "$T/p" 2> "$T/p.err"
  grep -Eq 'cp: [0-9]+ files, .*B, .*B/s.*done' "$T/p.err"
  run env LC_ALL=C "$BFOCP" -r --batch=sometimes "$T/src" "$T/x"
  [ "$status" -eq 1 ]
  [[ $output == *"invalid argument 'sometimes' for '--batch'"* ]]
  run env LC_ALL=C "$BFOCP" -r --batch-bytes=lots "$T/src" "$T/x"
  [ "$status" -eq 1 ]
  [[ $output == *"invalid --batch-bytes argument 'lots'"* ]]
  for v in 5 512K 2X automatic; do
    run env LC_ALL=C "$BFOCP" -r --write-behind=$v "$T/src" "$T/x"
    [ "$status" -eq 1 ]
    [[ $output == *"invalid --write-behind argument '$v'"* ]]
  done
  "$BFOCP" --help | grep -q -- '--batch-files=N'
  "$BFOCP" --help | grep -q -- '--write-behind=SIZE'
  run env LC_ALL=C "$BFOCP" -r --clone-stem=sometimes "$T/src" "$T/x"
  [ "$status" -eq 1 ]
  [[ $output == *"invalid argument 'sometimes' for '--clone-stem'"* ]]
  "$BFOCP" --help | grep -q -- '--clone-stem=WHEN'
}

# python3 -c "$NOFILE_EXEC" N CMD...: run CMD with descriptors 0-2 only and a
# soft RLIMIT_NOFILE of N.
NOFILE_EXEC='
import os, resource, sys
os.closerange(3, 65536)
resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
os.execvp(sys.argv[2], sys.argv[2:])
'

@test "scarce descriptors (ulimit -n 6 and 20, a 60-level tree): the tree, messages and status of GNU cp -a; batches from 256 on" {
  local p=$T/src/deep d f lim who bin
  for d in $(seq 0 59); do
    p=$p/d$d
    mkdir -p "$p"
    for f in 0 1 2; do head -c $((d * 300 + f * 1000 + 1)) /dev/urandom > "$p/f$f"; done
  done
  for lim in 6 20; do
    for who in g b; do
      bin=/usr/bin
      [ $who = g ] || bin=$ASBIN
      rm -rf "$T/$who/out"
      mkdir -p "$T/$who"
      # (only cp under the limit, with no descriptor but 0-2 open: bats's
      # own and bash's redirections need more)
      (set +e; cd "$T/$who" &&
         python3 -c "$NOFILE_EXEC" $lim env PATH="$bin:/usr/bin:/bin" cp -a ../src/deep out \
           > "$T/$who.out" 2> "$T/$who.err"
       echo $? > "$T/$who.rc")
    done
    diff "$T/g.rc" "$T/b.rc"
    [ "$(cat "$T/b.rc")" -eq 0 ] || { echo "ulimit -n $lim:"; cat "$T/b.err"; false; }
    diff "$T/g.out" "$T/b.out"
    diff "$T/g.err" "$T/b.err"
    # (without times: the first copy's reads change the source's atimes)
    diff <(full_manifest "$T/g/out" notimes) <(full_manifest "$T/b/out" notimes)
  done
  python3 -c "$NOFILE_EXEC" 255 "$BFOCP" -a --stats "$T/src/deep" "$T/s255" 2> "$T/s255.err"
  grep -q 'batched 0 files' "$T/s255.err" || { cat "$T/s255.err"; false; }
  python3 -c "$NOFILE_EXEC" 256 "$BFOCP" -a --stats "$T/src/deep" "$T/s256" 2> "$T/s256.err"
  batched_at_least "$T/s256.err" 150
  diff <(full_manifest "$T/g/out" notimes) <(full_manifest "$T/s256" notimes)
}

@test "copies of files named on the command line start no reader: no io_uring, no thread (a tree does)" {
  command -v strace > /dev/null || skip "strace is not installed (quickstart installs it)"
  make_batch_tree "$T/src"
  mkdir "$T/into"
  strace -f -o "$T/one.trace" -e trace=io_uring_setup,clone,clone3 \
    "$BFOCP" "$T/src/a.txt" "$T/src/many/d1/f2" "$T/into"
  cmp "$T/src/a.txt" "$T/into/a.txt"
  cmp "$T/src/many/d1/f2" "$T/into/f2"
  ! grep -E 'io_uring_setup|clone' "$T/one.trace" || { cat "$T/one.trace"; false; }
  strace -f -o "$T/tree.trace" -e trace=io_uring_setup,clone,clone3 \
    "$BFOCP" -r --stats "$T/src/many" "$T/tree" 2> "$T/tree.err"
  batched_at_least "$T/tree.err" 300
  grep -q io_uring_setup "$T/tree.trace"
  grep -qE 'clone3?\(' "$T/tree.trace"
}

@test "small trees (32 entries in 4 directories, all operands together) are cp's: no io_uring, no thread; larger ones batch; trees as GNU cp -a" {
  command -v strace > /dev/null || skip "strace is not installed (quickstart installs it)"
  local i
  mkdir -p "$T/s1/d1/d2" "$T/s2"
  for i in $(seq 1 20); do printf 'one %d\n' "$i" > "$T/s1/d1/d2/f$i"; done
  for i in $(seq 1 10); do printf 'two %d\n' "$i" > "$T/s2/g$i"; done
  # s1: 22 entries in 3 directories; s2: 10 entries in 1: 32 in 4
  # (atimes in the future: no read updates them)
  find "$T/s1" "$T/s2" -exec touch -a -d tomorrow {} +
  mkdir "$T/ref" "$T/small"
  /bin/cp -a "$T/s1" "$T/s2" "$T/ref"
  strace -f -o "$T/small.trace" -e trace=io_uring_setup,clone,clone3 \
    "$BFOCP" -a --stats "$T/s1" "$T/s2" "$T/small" 2> "$T/small.err"
  diff <(full_manifest "$T/ref") <(full_manifest "$T/small")
  ! grep -E 'io_uring_setup|clone' "$T/small.trace" || { cat "$T/small.trace"; false; }
  grep -q 'a small tree (at most 32 entries in 4 directories): copied by cp itself' "$T/small.err"
  # one entry more: batched
  printf 'three\n' > "$T/s2/extra"
  mkdir "$T/more"
  strace -f -o "$T/more.trace" -e trace=io_uring_setup,clone,clone3 \
    "$BFOCP" -a --stats "$T/s1" "$T/s2" "$T/more" 2> "$T/more.err"
  grep -q io_uring_setup "$T/more.trace"
  ! grep -q 'a small tree' "$T/more.err"
  batched_at_least "$T/more.err" 30
}

@test "-a killed by SIGTERM or SIGINT mid-copy: the signal's status; no directory has its source's times with entries missing; at most one file short, without the source's time" {
  require_root_loop
  make_fs ext4 "$T/e4" 512
  mkdir "$T/e4/src"
  python3 -c '
import os, sys
for d in range(60):
    p = os.path.join(sys.argv[1], "d%02d" % d)
    os.mkdir(p)
    for i in range(250):
        with open(os.path.join(p, "f%03d" % i), "wb") as f:
            f.write(os.urandom(4096))
    os.utime(p, (1577934245, 1577934245))' "$T/e4/src"
  make_fs ext4 "$T/dst" 512
  local sig delay st
  for sig in TERM INT; do
    for delay in 0.3 0.8; do
      rm -rf "$T/dst/out"
      drop_caches
      python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$BFOCP" -a "$T/e4/src" "$T/dst/out" &
      local pid=$!
      sleep "$delay"
      kill -"$sig" "$pid" 2>/dev/null || true
      st=0
      wait "$pid" || st=$?
      echo "# $sig after $delay s: status $st, $(find "$T/dst/out" -type f | wc -l) files"
      [ "$st" -eq 0 ] || [ "$st" -eq $((128 + $(kill -l "$sig"))) ]
      python3 -c '
import os, sys
src, out = sys.argv[1], sys.argv[2]
short = 0
for dp, dns, fns in os.walk(out):
    s = os.path.join(src, os.path.relpath(dp, out))
    if os.stat(dp).st_mtime_ns == os.stat(s).st_mtime_ns and sorted(dns + fns) != sorted(os.listdir(s)):
        sys.exit("%s has its source time and %d of %d entries" % (dp, len(dns + fns), len(os.listdir(s))))
    for f in fns:
        a, b = os.path.join(dp, f), os.path.join(s, f)
        if open(a, "rb").read() != open(b, "rb").read():
            short += 1
            if os.stat(a).st_mtime_ns == os.stat(b).st_mtime_ns:
                sys.exit("%s is short with its source time" % a)
if short > 1:
    sys.exit("%d files short" % short)' "$T/e4/src" "$T/dst/out"
    done
  done
}

@test "root on ext4: the walk ahead of cp reads directories and inode tables ahead (not as nobody, not with BFO_CP_META_AHEAD=0); trees as GNU cp -a" {
  require_root_loop
  make_fs ext4 "$T/e4" 256
  make_batch_tree "$T/e4/src"
  /bin/cp -a "$T/e4/src" "$T/g"
  drop_caches
  BFO_STATS=1 "$BFOCP" -a "$T/e4/src" "$T/b" 2> "$T/b.err"
  diff <(full_manifest "$T/g") <(full_manifest "$T/b")
  n=$(sed -n 's/.*metadata walk ahead of cp: .*, \([0-9]*\) read-ahead requests$/\1/p' "$T/b.err")
  echo "read-ahead requests: $n"
  [ "$n" -ge 2 ]
  drop_caches
  BFO_CP_META_AHEAD=0 BFO_STATS=1 "$BFOCP" -a "$T/e4/src" "$T/b0" 2> "$T/b0.err"
  diff <(full_manifest "$T/g") <(full_manifest "$T/b0")
  grep -q 'metadata walk ahead of cp: .*, 0 read-ahead requests$' "$T/b0.err"
  # Not root: nothing read through the device, the copy as before.
  as_nobody_setup
  chmod -R o+rX "$T/e4/src"
  mkdir "$T/n" && chown nobody "$T/n"
  (cd "$T/n" && runuser -u nobody -- env BFO_STATS=1 "$T/nbin/cp" -r "$T/e4/src" out 2> "$T/n.err")
  grep -q 'metadata walk ahead of cp: .*, 0 read-ahead requests$' "$T/n.err"
  diff <(cd "$T/e4/src" && find . -type f -exec sha256sum {} + | LC_ALL=C sort -k2) \
       <(cd "$T/n/out" && find . -type f -exec sha256sum {} + | LC_ALL=C sort -k2)
}

@test "files in the page cache are read from there, cold ones from the disk (cachestat, mincore): trees as GNU cp -a, holes too" {
  require_root_loop
  make_fs ext4 "$T/e4" 256
  make_batch_tree "$T/e4/src"
  /bin/cp -a "$T/e4/src" "$T/g"         # (which reads every file through the page cache)
  lock_pages "$T/e4/src"                # (kept there: lock_pages)
  in_cache() { sed -n 's/.* other, \([0-9]*\) in the page cache;.*/\1/p' "$1"; }
  local how n
  for how in "" mincore; do
    BFO_CACHE_CHECK=$how BFO_STATS=1 "$BFOCP" -a "$T/e4/src" "$T/b$how" 2> "$T/b.err"
    diff <(full_manifest "$T/g") <(full_manifest "$T/b$how")
    n=$(in_cache "$T/b.err")
    echo "${how:-cachestat}: $n files from the page cache"
    [ "$n" -ge 300 ] || { cat "$T/b.err"; false; }
  done
  unlock_pages
  drop_caches
  BFO_CACHE_CHECK= BFO_STATS=1 "$BFOCP" -a "$T/e4/src" "$T/c" 2> "$T/c.err"
  diff <(full_manifest "$T/g") <(full_manifest "$T/c")
  [ "$(in_cache "$T/c.err")" -eq 0 ] || { cat "$T/c.err"; false; }
  batched_at_least "$T/c.err" 300
}

@test "files read in an order other than cp's, more than the memory budget: no hang, the tree as GNU cp -a's" {
  require_root_loop
  local i k
  make_fs ext4 "$T/ext4" 512
  mkdir -p "$T/ext4/src/a" "$T/ext4/src/b" "$T/ext4/src/c"
  # made empty in one order (cp's, inode order) and written in another (the
  # disk's): the reader delivers in the disk's order, cp runs in its own,
  # and the files of 100 KiB - 1 MiB are 80 MiB against --batch-bytes=1M
  # (2 MiB in flight).  The reader waited for space for good once cp had
  # taken the delivered files but could not run them before an unread one.
  for i in $(seq 150); do : > "$T/ext4/src/$(echo abc | cut -c$((i % 3 + 1)))/f$i"; done
  for i in $(seq 150 | shuf --random-source=<(yes)); do
    head -c $(( 100000 + (i * 104729) % 900000 )) /dev/urandom \
      > "$T/ext4/src/$(echo abc | cut -c$((i % 3 + 1)))/f$i"
  done
  /bin/cp -a "$T/ext4/src" "$T/ext4/g"
  for k in 1 2 3; do
    sync
    echo 3 > /proc/sys/vm/drop_caches
    timeout 60 "$BFOCP" -a --batch-bytes=1M "$T/ext4/src" "$T/ext4/b$k"
    diff <(full_manifest "$T/ext4/g" notimes) <(full_manifest "$T/ext4/b$k" notimes)
    diff <(cd "$T/ext4/g" && find . -printf '%p %T@\n' | sort) <(cd "$T/ext4/b$k" && find . -printf '%p %T@\n' | sort)
    rm -rf "$T/ext4/b$k"
  done
}

@test "--write-behind: write-backs while copying onto ext4, the same tree as GNU cp -a" {
  require_root_loop
  make_fs ext4 "$T/ext4" 256
  make_batch_tree "$T/ext4/src"
  /bin/cp -a "$T/ext4/src" "$T/ext4/g"
  "$BFOCP" -a --stats --write-behind=1M "$T/ext4/src" "$T/ext4/b" 2> "$T/wb.err"
  diff <(full_manifest "$T/ext4/g") <(full_manifest "$T/ext4/b")
  grep -Eq 'write-behind every 1048576 bytes: [1-9][0-9]* write-backs \([0-9]+ ms, 0 failed\)' "$T/wb.err"
  "$BFOCP" -a --stats --write-behind=0 "$T/ext4/src" "$T/ext4/b0" 2> "$T/wb0.err"
  diff <(full_manifest "$T/ext4/g") <(full_manifest "$T/ext4/b0")
  ! grep -q 'write-behind' "$T/wb0.err"
}

@test "--write-behind=auto (the default) leaves Btrfs alone; a size given applies there too" {
  require_root_loop
  local i
  make_fs ext4 "$T/ext4" 256
  make_fs btrfs "$T/btrfs" 512
  mkdir "$T/ext4/src"
  # (a partial last block each: with --clone-stem=always, a file cloned
  # whole would have nothing to write back)
  for i in $(seq 1 40); do head -c 1048676 /dev/urandom > "$T/ext4/src/f$i"; done
  sleep 0.2     # (not racy: see make_batch_tree)
  "$BFOCP" -r --stats "$T/ext4/src" "$T/btrfs/auto" 2> "$T/auto.err"
  grep -Eq 'write-behind every 33554432 bytes: 0 write-backs \(0 ms, 0 failed\), [1-9][0-9]* skipped \(Btrfs\)' "$T/auto.err"
  "$BFOCP" -r --stats --write-behind=32M "$T/ext4/src" "$T/btrfs/given" 2> "$T/given.err"
  grep -Eq 'write-behind every 33554432 bytes: [1-9][0-9]* write-backs \([0-9]+ ms, 0 failed\), 0 skipped' "$T/given.err"
  "$BFOCP" -r --stats --write-behind=auto "$T/ext4/src" "$T/ext4/auto" 2> "$T/ext4.err"
  grep -Eq 'write-behind every 33554432 bytes: [1-9][0-9]* write-backs \([0-9]+ ms, 0 failed\), 0 skipped' "$T/ext4.err"
  diff -r "$T/ext4/src" "$T/btrfs/auto"
  diff -r "$T/ext4/src" "$T/btrfs/given"
  diff -r "$T/ext4/src" "$T/ext4/auto"
}

@test "--clone-stem: whole blocks cloned from one unnamed stem (always; auto makes none), trees as GNU cp -a" {
  require_root_loop
  make_fs ext4 "$T/ext4" 256
  make_fs btrfs "$T/btrfs" 512
  make_fs xfs "$T/xfs" 320
  make_batch_tree "$T/ext4/src"
  make_stem_tree "$T/ext4/src"
  # (atimes in the future, as make_batch_tree's: no read updates them)
  find "$T/ext4/src/blocks" -exec touch -a -d tomorrow {} +
  for fs in btrfs xfs; do
    /bin/cp -a "$T/ext4/src" "$T/$fs/g"
    for mode in auto always never; do
      "$BFOCP" -a --stats --clone-stem=$mode "$T/ext4/src" "$T/$fs/$mode" 2> "$T/$fs-$mode.err"
      diff <(full_manifest "$T/$fs/g") <(full_manifest "$T/$fs/$mode")
      check_stem $fs $mode "$T/$fs-$mode.err" "$T/$fs/$mode"
    done
  done
  # on ext4 (no clones) a stem is never made
  "$BFOCP" -a --stats --clone-stem=always "$T/ext4/src" "$T/ext4/b" 2> "$T/ext4.err"
  [ -z "$(stem_counts "$T/ext4.err")" ]
  diff <(full_manifest "$T/ext4/src") <(full_manifest "$T/ext4/b")
  # --reflink=never: no file shares blocks, so no stem (auto or always)
  for mode in auto always; do
    "$BFOCP" -a --stats --reflink=never --clone-stem=$mode "$T/ext4/src" "$T/btrfs/rn-$mode" 2> "$T/rn.err"
    [ -z "$(stem_counts "$T/rn.err")" ]
    diff <(full_manifest "$T/btrfs/g") <(full_manifest "$T/btrfs/rn-$mode")
    ! filefrag -v "$T/btrfs/rn-$mode/blocks/"* | grep -q shared
  done
}

@test "the clone stem stages the next run on its own thread while this one is cloned, across new stems (tests/lib/test-clonestem on Btrfs)" {
  require_root_loop
  make_fs btrfs "$T/bt" 512
  mkdir "$T/bt/ct"
  unit_on_fs BFO_TEST_CLONE_DIR "$T/bt/ct" test-clonestem
  [ -z "$(ls -A "$T/bt/ct")" ]
}

@test "--clone-stem=always on a nearly full Btrfs: same status as GNU cp; no file reported copied is short" {
  require_root_loop
  make_fs ext4 "$T/ext4" 256
  make_fs btrfs "$T/btrfs" 160
  mkdir "$T/ext4/src"
  local i
  for i in $(seq 1 600); do head -c $(( (i % 8 + 1) * 4096 )) /dev/urandom > "$T/ext4/src/f$i"; done
  # fill the Btrfs but for a few MiB
  fallocate -l $(( $(stat -f -c %a "$T/btrfs") * $(stat -f -c %S "$T/btrfs") - 6 * 1048576 )) "$T/btrfs/fill" || :
  sync -f "$T/btrfs"
  run env LC_ALL=C "$BFOCP" -r --stats --clone-stem=always "$T/ext4/src" "$T/btrfs/out"
  echo "$output" | grep -v '^cp: ' | head -5
  [ "$status" -eq 1 ]
  [[ $output == *"No space left on device"* ]]
  whole_where_full "$T/btrfs/out" "$T/ext4/src"
}

@test "across ext4, XFS, Btrfs and tmpfs (source and destination): same as GNU cp -a" {
  require_root_loop
  make_fs ext4 "$T/ext4" 256
  make_fs xfs "$T/xfs" 320
  make_batch_tree "$T/ext4/src"
  cp -a "$T/ext4/src" "$T/xfs/src"
  for from in ext4 xfs; do
    for to in ext4 xfs; do
      /bin/cp -a "$T/$from/src" "$T/$to/g-$from"
      "$BFOCP" -a "$T/$from/src" "$T/$to/b-$from"
      diff <(full_manifest "$T/$to/g-$from") <(full_manifest "$T/$to/b-$from")
    done
  done
  loop_cleanup_all
  make_fs btrfs "$T/btrfs" 256
  make_fs tmpfs "$T/tmpfs" 256
  make_batch_tree "$T/btrfs/src"
  cp -a "$T/btrfs/src" "$T/tmpfs/src"
  for from in btrfs tmpfs; do
    for to in btrfs tmpfs; do
      /bin/cp -a "$T/$from/src" "$T/$to/g-$from"
      "$BFOCP" -a "$T/$from/src" "$T/$to/b-$from"
      diff <(full_manifest "$T/$to/g-$from") <(full_manifest "$T/$to/b-$from")
    done
  done
}

@test "abbreviations of cp's own options keep their meaning (--b, --st, --pr, --i)" {
  mkdir -p "$T/g" "$T/b"; echo x > "$T/g/a"; echo x > "$T/b/a"
  same_as_gnu --notimes --b=simple a a
  same_as_gnu --notimes --st -r a st1
  run env LC_ALL=C PATH="$ASBIN:/usr/bin:/bin" cp --pr=mode "$T/g/a" "$T/pr"
  [ "$status" -eq 0 ]
  run env LC_ALL=C PATH="$ASBIN:/usr/bin:/bin" cp --batch-files "$T/g/a" "$T/x"
  [ "$status" -eq 1 ]
  # with -S, "--stats" is the suffix, not our option
  (cd "$T/b" && env PATH="$ASBIN:/usr/bin:/bin" cp -b -S --stats a a2 && cp -b -S --stats a a2)
  [ -f "$T/b/a2--stats" ]
}

@test "in a memory cgroup of 100M (a container's limit), bfocp -r of 117 MiB of 4 KiB files is not killed and copies what GNU cp copies" {
  memcg_new 100M || skip "needs a memory cgroup to run bfocp in: $MEMCG_WHY"
  require_root_loop
  make_fs ext4 "$T/m" 1024 -N 120000
  small_files_tree "$T/m/src" 30 1000
  drop_caches
  # (with the batch sizes of before, 128M or more, the kernel killed it here)
  run memcg_run "$MEMCG" "$BFOCP" -r "$T/m/src" "$T/m/b"
  echo "$output"
  [ "$status" -eq 0 ]
  [ -z "$output" ]
  [ "$(memcg_oom_kills "$MEMCG")" = 0 ]
  /bin/cp -r "$T/m/src" "$T/m/s"
  # (30000 files: not manifest, a few processes per file; cp -r keeps no times)
  [ "$(cd "$T/m/b" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort)" = \
    "$(cd "$T/m/s" && find . -printf '%p %y %m %s\n' | LC_ALL=C sort)" ]
  diff -r "$T/m/src" "$T/m/b"
}

@test "io_uring refused (a container's seccomp profile, as Docker's default): bfocp -a still reads a cold tree in batches, on threads; the tree as GNU cp -a's" {
  require_root_loop
  refuse_ready io_uring
  run "$REFUSE" io_uring "$BFO" features
  [[ $output == *"io_uring   no"* ]]
  make_fs ext4 "$T/m" 512
  make_batch_tree "$T/m/src"
  small_files_tree "$T/m/src/small" 10 300
  find "$T/m/src/small" -exec touch -a -d tomorrow {} +
  drop_caches
  # (one read after another before: bfocp -r of 131072 cold 4 KiB files
  # took 12.3 s without io_uring, 5.5 s with it; 6.0-6.4 s on threads)
  "$REFUSE" io_uring "$BFOCP" -a --stats "$T/m/src" "$T/m/b" 2> "$T/b.err"
  batched_at_least "$T/b.err" 3000
  grep -Eq 'reads: [0-9]{4,} requests for [0-9]{4,} extents' "$T/b.err" || { cat "$T/b.err"; false; }
  grep -Eq 'reads: no io_uring: made on ([2-9]|[1-9][0-9]+) threads' "$T/b.err" || { cat "$T/b.err"; false; }
  ! grep -v '^[^:]*bfocp: \(batched\|copied\|reads\|metadata\|held\|write-behind\|read but\)' "$T/b.err" ||
    { cat "$T/b.err"; false; }
  /bin/cp -a "$T/m/src" "$T/m/g"
  diff <(full_manifest "$T/m/g") <(full_manifest "$T/m/b")
}

# overlay_on FS: an overlay (lower and upper layers in one FS image, as
# Docker's overlay2) on $T/ov, its lower layer holding src/: 600 files of
# 64 KiB in 6 directories.  Skips, saying why, where overlays cannot be made.
overlay_on() {
  require_root_loop
  make_fs "$1" "$T/ovfs" 512
  mkdir -p "$T/ovfs/lower/src"
  local d i
  for d in 1 2 3 4 5 6; do
    mkdir "$T/ovfs/lower/src/d$d"
    for i in $(seq 1 100); do
      head -c 65536 /dev/urandom > "$T/ovfs/lower/src/d$d/f$i"
    done
  done
  find "$T/ovfs/lower/src" -exec touch -a -d tomorrow {} +
  overlay_mount "$T/ovfs" "$T/ov"
}

# used_kib [DIR]: KiB in use in DIR's file system (the overlay's), after a sync.
used_kib() {
  sync
  df -k --output=used "${1:-$T/ovfs}" | tail -1
}

@test "inside an overlay on XFS (Docker's overlay2 on XFS): cp -r and -a clone as GNU cp does (blocks shared, not written again); the trees as GNU cp's" {
  overlay_on xfs
  local u0 u1 gnu opt notimes
  for opt in -r -a; do
    notimes=; [ $opt = -r ] && notimes=1
    u0=$(used_kib)
    (cd "$T/ov" && /bin/cp $opt src g$opt)
    u1=$(used_kib)
    gnu=$((u1 - u0))
    drop_caches
    u0=$(used_kib)
    (cd "$T/ov" && "$BFOCP" $opt --stats src b$opt) 2> "$T/b.err"
    u1=$(used_kib)
    # (37.5 MiB of files: GNU cp's clones take about 1 MiB of metadata; bfocp
    # -r wrote 37.5 MiB of copies before)
    echo "$opt: GNU cp +$gnu KiB, bfocp +$((u1 - u0)) KiB"
    [ "$gnu" -lt 8192 ]
    [ $((u1 - u0)) -lt 8192 ]
    grep -q 'batched 0 files' "$T/b.err" || { cat "$T/b.err"; false; }
    diff <(full_manifest "$T/ov/g$opt" $notimes) <(full_manifest "$T/ov/b$opt" $notimes) | head -20
    [ "${PIPESTATUS[0]}" -eq 0 ]
  done
  # no probe file left behind
  [ -z "$(find "$T/ov" "$T/ovfs/upper" "$T/ovfs/work" -name '.bfocp-clone-probe*')" ]
}

@test "inside an overlay on ext4 (no clones there): cp -a still batches; the tree as GNU cp -a's" {
  overlay_on ext4
  (cd "$T/ov" && /bin/cp -a src g)
  drop_caches
  (cd "$T/ov" && "$BFOCP" -a --stats src b) 2> "$T/b.err"
  batched_at_least "$T/b.err" 600
  diff <(full_manifest "$T/ov/g") <(full_manifest "$T/ov/b")
}

@test "inside an overlay that makes no unnamed files (O_TMPFILE refused, as overlays before Linux 6.6): the clone probe's named file is gone at once; cp -r clones as GNU cp" {
  overlay_on xfs
  local u0 u1
  refuse_ready tmpfile
  ! "$REFUSE" tmpfile python3 -c 'import os; os.open("'"$T/ov"'", os.O_TMPFILE | os.O_WRONLY)' 2> /dev/null
  u0=$(used_kib)
  (cd "$T/ov" && "$REFUSE" tmpfile "$BFOCP" -r --stats src b) 2> "$T/b.err"
  u1=$(used_kib)
  echo "bfocp +$((u1 - u0)) KiB"
  [ $((u1 - u0)) -lt 8192 ]
  grep -q 'batched 0 files' "$T/b.err" || { cat "$T/b.err"; false; }
  diff -r "$T/ov/src" "$T/ov/b"
  [ -z "$(find "$T/ov" "$T/ovfs/upper" "$T/ovfs/work" -name '.bfocp-clone-probe*')" ]
}

@test "between two subvolumes of one Btrfs (devices of their own): cp -r clones as GNU cp does, nothing batched, the space GNU cp takes; onto another Btrfs bfocp batches" {
  require_root_loop
  local u0 u1 gnu
  make_fs btrfs "$T/x" 512
  btrfs subvolume create "$T/x/sv" > /dev/null
  small_files_tree "$T/x/sv/src" 4 500
  sync
  u0=$(used_kib "$T/x"); /bin/cp -r "$T/x/sv/src" "$T/x/g"; sync; u1=$(used_kib "$T/x"); gnu=$((u1 - u0))
  drop_caches
  u0=$(used_kib "$T/x"); "$BFOCP" -r --stats "$T/x/sv/src" "$T/x/b" 2> "$T/b.err"; sync
  u1=$(used_kib "$T/x")
  echo "subvolumes: GNU cp +$gnu KiB, bfocp +$((u1 - u0)) KiB (files: 8000 KiB)"
  [ "$gnu" -lt 4000 ] && [ $((u1 - u0)) -lt 4000 ]
  grep -q 'batched 0 files' "$T/b.err" || { cat "$T/b.err"; false; }
  diff -r "$T/x/g" "$T/x/b"
  # (a clone between two file systems fails: that pair is batched)
  make_fs btrfs "$T/y" 512
  drop_caches
  "$BFOCP" -r --stats "$T/x/sv/src" "$T/y/b" 2> "$T/y.err"
  batched_at_least "$T/y.err" 1000
  diff -r "$T/x/sv/src" "$T/y/b"
}

@test "within one XFS: with reflink (mkfs.xfs's default) cp -r clones, nothing batched, the space GNU cp takes; made without (-m reflink=0, RHEL 7's) bfocp batches; trees as GNU cp's" {
  require_root_loop
  local u0 u1 gnu
  make_fs xfs "$T/x" 512
  small_files_tree "$T/x/src" 4 500
  u0=$(used_kib "$T/x"); /bin/cp -r "$T/x/src" "$T/x/g"; u1=$(used_kib "$T/x"); gnu=$((u1 - u0))
  drop_caches
  u0=$(used_kib "$T/x"); "$BFOCP" -r --stats "$T/x/src" "$T/x/b" 2> "$T/b.err"; u1=$(used_kib "$T/x")
  echo "reflink: GNU cp +$gnu KiB, bfocp +$((u1 - u0)) KiB (files: 8000 KiB)"
  [ "$gnu" -lt 4000 ] && [ $((u1 - u0)) -lt 4000 ]
  grep -q 'batched 0 files' "$T/b.err" || { cat "$T/b.err"; false; }
  diff -r "$T/x/g" "$T/x/b"
  loop_cleanup_all
  # (before: taken for a file system that clones, so nothing was batched:
  # 30000 files of 4 KiB, cp -a + sync, 3.4-3.7 s as GNU cp's 3.7 s;
  # batched 1.5-1.6 s)
  make_fs xfs "$T/n" 512 -m reflink=0
  small_files_tree "$T/n/src" 4 500
  find "$T/n/src" -exec touch -a -d tomorrow {} +
  /bin/cp -a "$T/n/src" "$T/n/g"
  drop_caches
  "$BFOCP" -a --stats "$T/n/src" "$T/n/b" 2> "$T/n.err"
  batched_at_least "$T/n.err" 2000
  diff <(full_manifest "$T/n/g") <(full_manifest "$T/n/b")
}
