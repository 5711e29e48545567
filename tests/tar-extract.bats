#!/usr/bin/env bats
# tar-extract.bats: bfotar -x finishes regular files on a writer thread and
# still leaves exactly the tree, messages and exit status of GNU tar 1.34 built
# from the same source without our patches (ext4, XFS, Btrfs, tmpfs; old-file
# options, repeated names, bad archives, kill -9); --ext4-image fills an
# unmounted image with what tar -xf puts into the mounted one.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup_file() {
  build_stock_tar
}

setup() {
  stock_tar_setup
}

teardown() {
  loop_cleanup_all
}

# ------------------------------------------------------------------ helpers

# xmanifest DIR: one line per entry below DIR: type, path, mode, owner, size
# (not for directories), mtime, content hash or link target, hard-link group
# (the first path of its inode), whether it has holes, user xattrs.
xmanifest() {
  python3 - "$1" <<'EOF'
import hashlib, os, stat, sys
root = sys.argv[1]
rows, first = [], {}
for dp, dns, fns in os.walk(root):
    dns.sort()
    for n in sorted(dns + fns):
        p = os.path.join(dp, n)
        rel = os.path.relpath(p, root)
        if rel == 'lost+found':
            continue
        st = os.lstat(p)
        kind = 'd' if os.path.isdir(p) and not os.path.islink(p) else 'l' if os.path.islink(p) else 'f' if os.path.isfile(p) else 'o'
        what, group, sparse = '', '', ''
        if kind == 'o':
            what = '%s%d:%d' % ('c' if stat.S_ISCHR(st.st_mode) else 'b' if stat.S_ISBLK(st.st_mode)
                                else 'p' if stat.S_ISFIFO(st.st_mode) else 's',
                                os.major(st.st_rdev), os.minor(st.st_rdev))
        if kind == 'f':
            with open(p, 'rb') as f:
                what = hashlib.sha256(f.read()).hexdigest()
            key = (st.st_dev, st.st_ino)
            group = first.setdefault(key, rel)
            sparse = 'holes' if st.st_blocks * 512 + 65536 < st.st_size else ''
        elif kind == 'l':
            what = os.readlink(p)
        try:
            xs = sorted(x for x in os.listxattr(p, follow_symlinks=False) if x.startswith('user.'))
            xattrs = ','.join('%s=%s' % (x, os.getxattr(p, x, follow_symlinks=False).hex()) for x in xs)
        except OSError:
            xattrs = ''
        size = '' if kind == 'd' else st.st_size
        # times tar does not restore are the time of the run: two runs differ
        mtime = 'recent' if st.st_mtime_ns >= int(os.environ['T0']) else st.st_mtime_ns
        rows.append('%s %s %o %d:%d %s %s %s %s %s %s' % (kind, rel, st.st_mode & 0o7777, st.st_uid, st.st_gid,
                    size, mtime, what, group, sparse, xattrs))
print('\n'.join(sorted(rows)))
EOF
}

# A tree with what extraction treats specially: many small files, owners,
# set-id and read-only modes, hard and symbolic links, a sparse file, a file
# above the writer thread's size cap, user xattrs, old and odd time stamps.
make_tree() {
  local d=$1 i
  make_sample_tree "$d"
  rm -f "$d/fifo"
  mkdir -p "$d/many/a/b" "$d/many/c" "$d/ro-dir"
  for i in $(seq 1 300); do
    printf 'file %d\n%0*d\n' "$i" $((i * 37)) 0 > "$d/many/a/f$i"
    printf '%d' "$i" > "$d/many/c/g$i"
  done
  chown 1234:567 "$d/many/a/f1" "$d/many/c"
  chmod 4755 "$d/many/a/f2"
  chmod 2750 "$d/many/a/f3"
  chmod 0400 "$d/many/a/f4"
  chmod 0600 "$d/many/a/f5"
  chmod 0664 "$d/many/a/f10"    # modes the umask would not let open give
  chmod 0777 "$d/many/a/f11"
  chmod 1755 "$d/many/a/f12"
  printf 'in a read-only directory\n' > "$d/ro-dir/inside"
  chmod 0555 "$d/ro-dir"
  touch -d '1999-12-31 23:59:59.5' "$d/many/a/f6"
  head -c $((9 * 1024 * 1024)) /dev/urandom > "$d/big.bin"
  truncate -s 5M "$d/sparse.img"
  printf 'data in the middle' | dd of="$d/sparse.img" bs=1 seek=2000000 conv=notrunc status=none
  ln "$d/many/a/f7" "$d/many/c/link-to-f7"
  ln -s ../a/f8 "$d/many/c/sym-to-f8"
  setfattr -n user.colour -v blue "$d/many/a/f9" 2>/dev/null || true
}

# fs_now DIR: the time stamp the file system of DIR gives a file made now, in
# ns. Files it stamps later are never older; "date +%s%N" is not a safe start
# line, for the kernel stamps new files with a clock that may lag it by a tick.
fs_now() {
  local mark
  mark=$(mktemp "$1/.t0.XXXXXX")
  stat -c %.9Y "$mark" | tr -d .
  rm -f "$mark"
}

# extract_both NAME ARGS...: in $W/NAME.stock and $W/NAME.bfo (each holding a
# directory x, after $PREPARE ran in it if set), run stock tar and bfotar (both
# as "tar") with ARGS; require the same status, stderr, stdout and trees.
# archive_of_3mb N: $W/a.tar of N files of 3 MB in d/ (the full-disk and
# quota tests).
archive_of_3mb() {
  local i
  mkdir -p "$W/src/d"
  for i in $(seq 1 "$1"); do head -c 3000000 /dev/urandom > "$W/src/d/f$i"; done
  tar -C "$W/src" -cf "$W/a.tar" .
}

extract_both() {
  local name=$1 a
  shift
  # what the archives hold is older than this
  export T0=$(fs_now "$W")
  for a in stock bfo; do
    local bin=$STOCKBIN d=$W/$name.$a
    [ $a = bfo ] && bin=$ASBIN
    mkdir -p "$d/x"
    [ -z "${PREPARE:-}" ] || (cd "$d" && eval "$PREPARE")
    # (a status taken with ||: bats' ERR trap would fail the test on it)
    local rc=0
    if [ -n "${STDIN_CMD:-}" ]; then
      (cd "$d" && env PATH="$bin:/usr/bin:/bin" sh -c "$STDIN_CMD | tar \"\$@\"" sh "$@" \
         > "$d.out" 2> "$d.err") || rc=$?
    else
      (cd "$d" && env PATH="$bin:/usr/bin:/bin" tar "$@" > "$d.out" 2> "$d.err") || rc=$?
    fi
    echo $rc > "$d.status"
    xmanifest "$d/x" > "$d.manifest"
  done
  diff "$W/$name.stock.status" "$W/$name.bfo.status"
  diff "$W/$name.stock.err" "$W/$name.bfo.err"
  cmp "$W/$name.stock.out" "$W/$name.bfo.out"
  diff "$W/$name.stock.manifest" "$W/$name.bfo.manifest"
}

# The options that change what extraction does to regular files, on one file system.
options_on() {
  make_fs "$@" "$W/fs" 512 || { [ "$1" = tmpfs ] || skip "cannot make $1"; false; }
  W=$W/fs
  make_tree "$W/src"
  tar -C "$W/src" --xattrs --sparse -cf "$W/a.tar" .
  gzip -c "$W/a.tar" > "$W/a.tgz"
  extract_both plain -xf "$W/a.tar" -C x
  extract_both p -xpf "$W/a.tar" -C x
  extract_both xattrs --xattrs -xf "$W/a.tar" -C x
  extract_both owner --same-owner -xf "$W/a.tar" -C x
  extract_both noperm --no-same-permissions -xf "$W/a.tar" -C x
  extract_both strip --strip-components=2 -xf "$W/a.tar" -C x
  extract_both xform --transform='s,^\./many/a,./moved,' -xf "$W/a.tar" -C x
  extract_both wild --wildcards -xf "$W/a.tar" -C x './many/a/f1*' './sub'
  extract_both list -xf "$W/a.tar" -C x ./many/c ./a.txt ./missing
  extract_both gz -xzf "$W/a.tgz" -C x
  extract_both touch -xmf "$W/a.tar" -C x
  STDIN_CMD="cat $W/a.tgz" extract_both pipe -xzf - -C x
  # the writer thread took the small files (and gave none back)
  (cd "$W/plain.bfo" && rm -rf x && mkdir x && "$BFOTAR" --stats -xf "$W/a.tar" -C x 2> stats.err)
  grep -q 'written by the writer thread' "$W/plain.bfo/stats.err"
  ! grep -q ' 0 files (0 bytes) written by the writer thread' "$W/plain.bfo/stats.err"
  grep -q ' 0 handed back' "$W/plain.bfo/stats.err"
  grep -Eq 'write-behind every 33554432 bytes: 0 write-backs .*, 0 skipped' "$W/plain.bfo/stats.err"
  # write-behind after every MiB: write-backs ran, and the tree is the same
  (cd "$W/plain.bfo" && rm -rf x && mkdir x &&
     "$BFOTAR" --stats --write-behind=1M -xf "$W/a.tar" -C x 2> wb.err)
  xmanifest "$W/plain.bfo/x" | diff "$W/plain.stock.manifest" -
  grep -Eq 'write-behind every 1048576 bytes: [1-9][0-9]* write-backs \([0-9]+ ms, 0 failed\), 0 skipped' \
    "$W/plain.bfo/wb.err"
  # --write-behind=0: none
  (cd "$W/plain.bfo" && rm -rf x && mkdir x &&
     "$BFOTAR" --stats --write-behind=0 -xf "$W/a.tar" -C x 2> wb0.err)
  ! grep -q 'write-behind' "$W/plain.bfo/wb0.err"
}

# ------------------------------------------------------------------ trees

@test "ext4: trees extracted by bfotar equal stock tar's, for every option that touches files" {
  require_root_loop
  options_on ext4
}

@test "XFS: trees extracted by bfotar equal stock tar's" {
  require_root_loop
  command -v mkfs.xfs >/dev/null || skip "mkfs.xfs not installed"
  options_on xfs
}

@test "Btrfs: trees extracted by bfotar equal stock tar's" {
  require_root_loop
  command -v mkfs.btrfs >/dev/null || skip "mkfs.btrfs not installed"
  options_on btrfs
}

@test "--write-behind=auto (the default) leaves Btrfs alone; a size given applies there too" {
  require_root_loop
  local i
  make_fs btrfs "$W/fs" 512
  mkdir "$W/src"
  # (a partial last block each: with --clone-stem=always, a file cloned
  # whole would have nothing to write back)
  for i in $(seq 1 40); do head -c 1048676 /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" -cf "$W/a.tar" .
  mkdir "$W/fs/auto" "$W/fs/given"
  "$BFOTAR" --stats -xf "$W/a.tar" -C "$W/fs/auto" 2> "$W/auto.err"
  grep -Eq 'write-behind every 33554432 bytes: 0 write-backs \(0 ms, 0 failed\), [1-9][0-9]* skipped \(Btrfs\)' "$W/auto.err"
  "$BFOTAR" --stats --write-behind=32M -xf "$W/a.tar" -C "$W/fs/given" 2> "$W/given.err"
  grep -Eq 'write-behind every 33554432 bytes: [1-9][0-9]* write-backs \([0-9]+ ms, 0 failed\), 0 skipped' "$W/given.err"
  diff -r "$W/src" "$W/fs/auto"
  diff -r "$W/src" "$W/fs/given"
  # files cloned whole from the stem (XFS, auto) have nothing to write back
  make_fs xfs "$W/xfs" 512
  mkdir "$W/whole" "$W/xfs/out"
  for i in $(seq 1 40); do head -c 1048576 /dev/urandom > "$W/whole/f$i"; done
  tar -C "$W/whole" -cf "$W/w.tar" .
  "$BFOTAR" --stats --write-behind=1M -xf "$W/w.tar" -C "$W/xfs/out" 2> "$W/whole.err"
  cat "$W/whole.err"
  grep -Eq 'clone stem: 40 files .* 40 cloned' "$W/whole.err"
  grep -Eq 'write-behind every 1048576 bytes: 0 write-backs' "$W/whole.err"
  diff -r "$W/whole" "$W/xfs/out"
}

@test "--overwrite onto XFS with write-behind: no file keeps XFS's preallocation past its end (bfotar, bfocp; tests/lib/test-writebehind)" {
  require_root_loop
  local i who
  make_fs xfs "$W/xfs" 1024
  make_fs ext4 "$W/ext4" 512
  mkdir "$W/xfs/unit"
  unit_on_fs BFO_TEST_XFS_DIR "$W/xfs/unit" test-writebehind
  # 40 files of 5.9 MB (more than cp leaves to itself), mostly zeros but
  # stored dense: XFS preallocates past the end of such files as they grow,
  # and a file that replaced an older one (O_TRUNC: tar --overwrite, cp onto
  # an existing file) kept it when written back before its close (session
  # 26: 13.6 MiB for a 5.6 MiB file)
  mkdir "$W/ext4/src"
  for i in $(seq 1 40); do
    head -c 5922894 /dev/zero > "$W/ext4/src/f$i"
    head -c 100 /dev/urandom >> "$W/ext4/src/f$i"
  done
  tar -C "$W/ext4/src" -cf "$W/a.tar" .
  for who in tar cp; do
    "$STOCKBIN/tar" -xf "$W/a.tar" -C "$W/xfs" --transform="s,^\.,$who,"
  done
  sync -f "$W/xfs"
  "$BFOTAR" --stats --overwrite --write-behind=8M -xf "$W/a.tar" -C "$W/xfs/tar" 2> "$W/tar.err"
  drop_caches
  "$BFOCP" --stats -r --write-behind=8M "$W/ext4/src/." "$W/xfs/cp/" 2> "$W/cp.err"
  cat "$W/tar.err" "$W/cp.err"
  sync -f "$W/xfs"
  diff -r "$W/ext4/src" "$W/xfs/tar"
  diff -r "$W/ext4/src" "$W/xfs/cp"
  grep -Eq 'write-behind every 8388608 bytes: [1-9][0-9]* write-backs .*, [0-9]+ trimmed' "$W/tar.err"
  grep -Eq 'write-behind every 8388608 bytes: [1-9][0-9]* write-backs .*, [0-9]+ trimmed' "$W/cp.err"
  grep -Eq 'batched 40 files' "$W/cp.err"
  # 5922994 bytes in 4 KiB blocks: 11576 sectors each, no more
  for who in tar cp; do
    find "$W/xfs/$who" -type f -printf '%b %p\n' | awk '$1 != 11576' > "$W/$who.more"
    cat "$W/$who.more"
    [ ! -s "$W/$who.more" ]
  done
}

@test "--clone-stem: whole blocks cloned from one unnamed stem (auto: XFS, whole-block files; not Btrfs), written with O_DIRECT; trees as stock tar's" {
  require_root_loop
  local fs mode writes direct
  make_tree "$W/src"
  make_stem_tree "$W/src"
  tar -C "$W/src" --xattrs -cf "$W/a.tar" .
  export T0=$(fs_now "$W")
  for fs in btrfs xfs; do
    make_fs $fs "$W/$fs" 512
    mkdir "$W/$fs/stock"
    "$STOCKBIN/tar" -xpf "$W/a.tar" -C "$W/$fs/stock"
    for mode in auto always never; do
      mkdir "$W/$fs/$mode"
      "$BFOTAR" --stats --clone-stem=$mode -xpf "$W/a.tar" -C "$W/$fs/$mode" 2> "$W/$fs-$mode.err"
      diff <(xmanifest "$W/$fs/stock") <(xmanifest "$W/$fs/$mode")
      check_stem $fs $mode "$W/$fs-$mode.err" "$W/$fs/$mode" xfs
      # Its jobs' data are block-aligned: every stem write is direct.
      if [ $mode = always ] || [ $mode-$fs = auto-xfs ]; then
        read -r writes direct <<< "$(stem_writes "$W/$fs-$mode.err")"
        [ "$writes" -ge 1 ] && [ "$direct" -eq "$writes" ]
      fi
    done
  done
  run "$BFOTAR" --clone-stem=sometimes -xf "$W/a.tar" -C "$W"
  [ "$status" -eq 2 ]
  [[ $output == *"Invalid argument 'sometimes' for '--clone-stem'"* ]] || [[ $output == *"sometimes"*"--clone-stem"* ]]
}

@test "Btrfs: deleting half of the files bfotar extracted (default) frees their space, as after stock tar; with --clone-stem=always it does not (shared stem extents)" {
  require_root_loop
  local i mode used0 used1 used2
  mkdir "$W/src"
  for i in $(seq 1 600); do head -c $(( (i % 8 + 1) * 8192 )) /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" -cf "$W/a.tar" .
  # data used on the file system, after a commit
  data_used() { sync; btrfs filesystem sync "$1" > /dev/null; btrfs filesystem usage -b "$1" | sed -n 's/^Data,[^:]*: *Size:[0-9]*, *Used:\([0-9]*\).*/\1/p'; }
  for mode in default always; do
    make_fs btrfs "$W/$mode" 512
    used0=$(data_used "$W/$mode")
    if [ $mode = default ]; then "$BFOTAR" -xf "$W/a.tar" -C "$W/$mode"
    else "$BFOTAR" --clone-stem=always -xf "$W/a.tar" -C "$W/$mode"; fi
    used1=$(data_used "$W/$mode")
    for i in $(seq 1 2 600); do rm "$W/$mode/f$i"; done
    used2=$(data_used "$W/$mode")
    echo "# $mode: data used $used0 -> $used1 -> $used2 after deleting half"
    [ $((used1 - used0)) -ge $((20 << 20)) ]
    if [ $mode = default ]; then
      # at least 40 % of what the files took comes back
      [ $((used1 - used2)) -ge $(( (used1 - used0) * 2 / 5 )) ]
    else
      [ $((used1 - used2)) -lt $(( (used1 - used0) / 10 )) ]
    fi
  done
}

@test "--clone-stem=always on a nearly full Btrfs: tar's status; no file with its archive size is wrong" {
  require_root_loop
  local i
  mkdir -p "$W/src"
  for i in $(seq 1 600); do head -c $(( (i % 8 + 1) * 4096 )) /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" -cf "$W/a.tar" .
  make_fs btrfs "$W/fs" 160
  fallocate -l $(( $(stat -f -c %a "$W/fs") * $(stat -f -c %S "$W/fs") - 6 * 1048576 )) "$W/fs/fill" || :
  sync -f "$W/fs"
  mkdir "$W/fs/out"
  run env LC_ALL=C "$BFOTAR" --clone-stem=always -xf "$W/a.tar" -C "$W/fs/out"
  echo "$output" | head -5
  [ "$status" -eq 2 ]
  [[ $output == *"No space left on device"* ]]
  whole_where_full "$W/fs/out" "$W/src"
}

@test "a small archive file (128 KiB at most) is tar's to extract: no thread; a larger one or a pipe gets the writer thread; trees as stock tar's" {
  command -v strace > /dev/null || skip "strace is not installed (quickstart installs it)"
  local i
  mkdir "$W/src" "$W/stock" "$W/small" "$W/big" "$W/pipe"
  for i in $(seq 1 10); do head -c 3000 /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" -cf "$W/s.tar" .
  [ "$(stat -c %s "$W/s.tar")" -le 131072 ]
  "$STOCKBIN/tar" -xf "$W/s.tar" -C "$W/stock"
  strace -f -o "$W/small.trace" -e trace=clone,clone3 \
    "$BFOTAR" --stats -xf "$W/s.tar" -C "$W/small" 2> "$W/small.err"
  diff <(xmanifest "$W/stock") <(xmanifest "$W/small")
  ! grep -E 'clone' "$W/small.trace" || { cat "$W/small.trace"; false; }
  grep -q 'extract: a small archive, tar wrote it; 0 files' "$W/small.err"
  # the same members from a pipe: the size is not known, the thread starts
  cat "$W/s.tar" | "$BFOTAR" --stats -xf - -C "$W/pipe" 2> "$W/pipe.err"
  grep -q 'extract: writer thread; 10 files' "$W/pipe.err"
  diff <(xmanifest "$W/stock") <(xmanifest "$W/pipe")
  # past 128 KiB: the writer thread
  for i in $(seq 11 60); do head -c 3000 /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" -cf "$W/b.tar" .
  "$BFOTAR" --stats -xf "$W/b.tar" -C "$W/big" 2> "$W/big.err"
  grep -q 'extract: writer thread; 60 files' "$W/big.err"
  diff -r "$W/src" "$W/big"
}

@test "as root, a new file whose owner is final from the start gets its mode at creation (no chmod); other owners and set-group-ID directories of another group as tar does" {
  [ "$(id -u)" -eq 0 ] || skip "needs root: tar restricts new files' modes only as root"
  command -v strace > /dev/null || skip "strace is not installed (quickstart installs it)"
  local i
  mkdir -p "$W/src/plain" "$W/src/other" "$W/src/sg" "$W/src/pre"
  for i in $(seq 1 40); do head -c 3000 /dev/urandom > "$W/src/plain/f$i"; done
  chmod 0640 "$W/src/plain/f2"
  chmod 0604 "$W/src/plain/f3"
  chmod 4755 "$W/src/plain/f4"
  head -c 3000 /dev/urandom > "$W/src/other/o1"
  chown 1234:567 "$W/src/other/o1"
  for i in 1 2; do head -c 3000 /dev/urandom > "$W/src/sg/s$i"; done
  chgrp 4321 "$W/src/sg"
  chmod 2775 "$W/src/sg"
  head -c 3000 /dev/urandom > "$W/src/pre/p1"
  ln -s plain/f1 "$W/src/y"
  # sg/s1 comes while tar has made sg (its group still ours), sg/s2 after a
  # member outside it, when tar has given sg its group 4321 and set-gid bit;
  # pre is a set-group-ID directory of group 4321 before tar runs
  (cd "$W/src" && tar --no-recursion -cf "$W/a.tar" plain $(ls -d plain/*) other other/o1 sg sg/s1 y sg/s2 pre/p1)
  [ "$(stat -c %s "$W/a.tar")" -gt 131072 ]
  PREPARE='mkdir x/pre && chgrp 4321 x/pre && chmod 2775 x/pre' extract_both created -xf "$W/a.tar" -C x
  mkdir -p "$W/t/x/pre" && chgrp 4321 "$W/t/x/pre" && chmod 2775 "$W/t/x/pre"
  (cd "$W/t" && strace -f -o "$W/t.trace" -e trace=openat,fchmod "$BFOTAR" --stats -xf "$W/a.tar" -C x 2> "$W/t.err")
  grep -q 'extract: writer thread; 44 files' "$W/t.err"
  diff "$W/created.stock.manifest" <(xmanifest "$W/t/x")
  mode_of() { grep -E "openat\(.*\"$1\", [^)]*O_CREAT[^)]*, 0[0-7]+\)" "$W/t.trace" | sed -E 's/.*, (0[0-7]+)\).*/\1/'; }
  [ "$(mode_of plain/f1)" = 0644 ]
  [ "$(mode_of plain/f2)" = 0640 ]
  [ "$(mode_of plain/f3)" = 0604 ]
  [ "$(mode_of plain/f4)" = 0755 ]      # (the set-uid bit after the data, as tar)
  [ "$(mode_of sg/s1)" = 0644 ]
  # tar's own restricted mode where a chown follows or may give the group back
  [ "$(mode_of other/o1)" = 0600 ]
  [ "$(mode_of sg/s2)" = 0600 ]
  [ "$(mode_of pre/p1)" = 0600 ]
  # fchmod only for those three and the set-uid file: not for the 41 others
  [ "$(grep -c ' fchmod(' "$W/t.trace")" -eq 4 ] || { grep ' fchmod(' "$W/t.trace"; false; }
  # a default ACL on the directory makes the mode of a new file other than
  # the one asked for, and tar's chmod sets it right: tar's way there
  PREPARE='setfacl -d -m u::rwx,g::---,o::--- x' extract_both acl -xf "$W/a.tar" -C x
  grep -q ' plain/f1 644 ' "$W/acl.bfo.manifest"
  # the archive ends inside a member the writer thread took, and inside one
  # too large for it that tar writes itself: tar leaves both with the mode
  # it created them with, and so do we
  head -c $((9 * 1024 * 1024)) /dev/urandom > "$W/src/z-big"
  (cd "$W/src" && tar --no-recursion -cf "$W/b.tar" $(ls -d plain/*) z-big)
  head -c $(( $(stat -c %s "$W/b.tar") - 5 * 1024 * 1024 )) "$W/b.tar" > "$W/big-cut.tar"
  head -c $(( 512 * 40 + 3072 * 39 + 1024 )) "$W/b.tar" > "$W/small-cut.tar"
  extract_both big-cut -xf "$W/big-cut.tar" -C x
  extract_both small-cut -xf "$W/small-cut.tar" -C x
  grep -q ' z-big 600 ' "$W/big-cut.bfo.manifest"
  grep -q ' plain/f[0-9]* 600 ' "$W/small-cut.bfo.manifest"
}

@test "a file size limit (ulimit -f) kills bfotar with SIGXFSZ as it kills stock tar, leaving the same files" {
  local i a bin rc
  mkdir -p "$W/src"
  # small members first (queued), then members past the limit
  for i in $(seq 10 39); do head -c 20000 /dev/urandom > "$W/src/a$i"; done
  for i in $(seq 1 40); do head -c 100000 /dev/urandom > "$W/src/f$i"; done
  tar -C "$W/src" --sort=name -cf "$W/a.tar" .
  for a in stock bfo; do
    bin=$STOCKBIN
    [ $a = bfo ] && bin=$ASBIN
    mkdir -p "$W/$a"
    rc=0
    (cd "$W/$a" && env PATH="$bin:/usr/bin:/bin" bash -c 'ulimit -f 50; exec tar -xf "$1"' sh "$W/a.tar") || rc=$?
    [ "$rc" -eq 153 ] || { echo "$a: status $rc, not 153 (SIGXFSZ)"; false; }
  done
  # Stock tar dies at the first member past the limit, leaving it short
  # (51200 bytes, mode 0600) and none after it; bfotar used to leave every
  # member it had queued after it empty.
  diff <(cd "$W/stock" && find . -printf '%p %y %s %m\n' | sort) \
       <(cd "$W/bfo" && find . -printf '%p %y %s %m\n' | sort)
  for i in $(seq 10 39); do cmp "$W/src/a$i" "$W/bfo/a$i"; done
  cmp -n 51200 "$W/src/f1" "$W/bfo/f1"
}

@test "tmpfs: trees extracted by bfotar equal stock tar's" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to mount tmpfs"
  options_on tmpfs
}

@test "non-root: modes under the umask, --same-owner refused per file as stock" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to switch to nobody"
  make_tree "$W/src"
  tar -C "$W/src" -cf "$W/a.tar" .
  chmod 644 "$W/a.tar"
  # nobody must reach the test's directory (bats makes its run directory 0700)
  nobody_reaches "$W"
  local a
  for a in stock bfo; do
    local bin=$STOCKBIN
    [ $a = bfo ] && bin=$ASBIN
    mkdir -p "$W/nr.$a/x" && chown -R nobody "$W/nr.$a"
    export T0=$(fs_now "$W")
    for opts in "-xf" "--same-owner -xf"; do
      set +e
      (cd "$W/nr.$a" && rm -rf x && mkdir x &&
         setpriv --reuid=nobody --regid=nogroup --clear-groups \
           env PATH="$bin:/usr/bin:/bin" sh -c "umask 027; tar $opts $W/a.tar -C x" \
           >> "$W/nr.$a.out" 2>> "$W/nr.$a.err"
       echo $? >> "$W/nr.$a.status")
      set -e
      xmanifest "$W/nr.$a/x" >> "$W/nr.$a.manifest"
    done
  done
  diff "$W/nr.stock.status" "$W/nr.bfo.status"
  diff "$W/nr.stock.err" "$W/nr.bfo.err"
  diff "$W/nr.stock.manifest" "$W/nr.bfo.manifest"
  grep -q 'Cannot change ownership' "$W/nr.bfo.err"
}

@test "a full file system: stock's messages, exit status and tree for the writes that fail" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to mount tmpfs"
  local i
  mkdir -p "$W/src/d"
  # two-page files, most of them split across two records: the second page
  # of some is refused, so their writes come short within a record's piece
  for i in $(seq 1 300); do
    head -c $((5000 + 37 * i)) /dev/urandom > "$W/src/d/f$i"
  done
  tar -C "$W/src" -cf "$W/a.tar" .
  # one 1 MiB tmpfs for each run (tmpfs refuses writes page by page, the
  # same pages in the same order for both)
  make_fs tmpfs "$W/fs.stock" 1
  make_fs tmpfs "$W/fs.bfo" 1
  ln -s fs.stock "$W/full.stock"
  ln -s fs.bfo "$W/full.bfo"
  extract_both full -xf "$W/a.tar" -C x
  grep -q 'Wrote only' "$W/full.bfo.err"
  grep -q 'No space left on device' "$W/full.bfo.err"
}

@test "a full file system and a member too large for the writer thread: the files before it get the space first, as with stock" {
  [ "$(id -u)" -eq 0 ] || skip "needs root to mount tmpfs"
  local i
  mkdir -p "$W/src/src"
  # (tar writes z itself; the queued a1-a6 used to reach the disk after it)
  for i in 1 2 3 4 5 6; do head -c 1048576 /dev/urandom > "$W/src/src/a$i"; done
  head -c $((9 * 1048576)) /dev/urandom > "$W/src/src/z"
  tar -C "$W/src" --sort=name -cf "$W/a.tar" src
  make_fs tmpfs "$W/fs.stock" 8
  make_fs tmpfs "$W/fs.bfo" 8
  ln -s fs.stock "$W/big.stock"
  ln -s fs.bfo "$W/big.bfo"
  extract_both big -xf "$W/a.tar" -C x
  grep -q 'src/z: Wrote only' "$W/big.bfo.err"
}

@test "nearly full XFS and Btrfs: the files stock tar could not make are not made empty ahead; the one it fills part way gets as much" {
  require_root_loop
  local i fs
  archive_of_3mb 40
  for fs in xfs btrfs; do
    make_fs $fs "$W/fs$fs.stock" 320
    make_fs $fs "$W/fs$fs.bfo" 320
    fill_to "$W/fs$fs.stock" 61440
    fill_to "$W/fs$fs.bfo" 61440
    ln -s "fs$fs.stock" "$W/$fs.stock"
    ln -s "fs$fs.bfo" "$W/$fs.bfo"
    # (the same messages, status and tree as stock tar: extract_both)
    extract_both $fs -xf "$W/a.tar" -C x
    grep -q 'No space left on device' "$W/$fs.bfo.err"
  done
  # XFS needs space for a new inode: the names after the disk filled fail at
  # their open, as with stock, where bfotar made them all empty ("Cannot write")
  grep -q 'Cannot open: No space left on device' "$W/xfs.bfo.err"
  grep -q 'Wrote only' "$W/xfs.bfo.err"
}

@test "a Btrfs qgroup limit: the files stock tar could not open are not made empty ahead; the one it fills part way gets as much" {
  require_root_loop
  local i
  archive_of_3mb 40
  # (statfs does not show a quota: 320 MiB free, 60 MiB allowed)
  for i in stock bfo; do
    make_fs btrfs "$W/fs.$i" 320
    qgroup_limit "$W/fs.$i" 60M
    ln -s "fs.$i" "$W/q.$i"
  done
  extract_both q -xf "$W/a.tar" -C x
  grep -q 'Cannot open: Disk quota exceeded' "$W/q.bfo.err"
  grep -q 'Wrote only' "$W/q.bfo.err"
  # as nobody (the limits are read from sysfs, which any user may read)
  local a
  nobody_reaches "$W"
  chmod 644 "$W/a.tar"
  for a in stock bfo; do
    local bin=$STOCKBIN
    [ $a = bfo ] && bin=$ASBIN
    umount_image "$W/fs.$a"
    make_fs btrfs "$W/fs.$a" 320
    qgroup_limit "$W/fs.$a" 60M
    mkdir "$W/fs.$a/x" && chown nobody "$W/fs.$a/x"
    (set +e; cd "$W/fs.$a/x" && setpriv --reuid=nobody --regid=nogroup --clear-groups \
       env PATH="$bin:/usr/bin:/bin" tar -xf "$W/a.tar" > "$W/n.$a.out" 2> "$W/n.$a.err"
     echo $? > "$W/n.$a.status")
    xmanifest "$W/fs.$a/x" > "$W/n.$a.manifest"
  done
  diff "$W/n.stock.status" "$W/n.bfo.status"
  diff "$W/n.stock.err" "$W/n.bfo.err"
  diff "$W/n.stock.manifest" "$W/n.bfo.manifest"
  grep -q 'Cannot open: Disk quota exceeded' "$W/n.bfo.err"
}

@test "a Btrfs subvolume below -C's directory with a qgroup limit of its own: its files stock tar could not open are not made empty ahead" {
  require_root_loop
  local i
  archive_of_3mb 40
  # (-C's directory is in the top subvolume, which has no limit; the
  # members go into x/d, a subvolume limited to 60M)
  for i in stock bfo; do
    make_fs btrfs "$W/fs.$i" 320
    btrfs quota enable "$W/fs.$i"
    mkdir "$W/fs.$i/x"
    btrfs -q subvolume create "$W/fs.$i/x/d"
    btrfs qgroup limit 60M "$W/fs.$i/x/d"
    sync -f "$W/fs.$i"
    ln -s "fs.$i" "$W/q.$i"
  done
  extract_both q -xf "$W/a.tar" -C x
  grep -q 'Cannot open: Disk quota exceeded' "$W/q.bfo.err"
  ! grep -q 'Cannot write' "$W/q.bfo.err"
}

@test "a nearly full XFS mounted below -C's directory: its files stock tar could not open are not made empty ahead" {
  require_root_loop
  local i
  archive_of_3mb 120
  # (-C's directory on a tmpfs with room for the names; the members' data
  # go to x/d, a 300 MiB XFS: about 77 of the 120 fit)
  for i in stock bfo; do
    make_fs tmpfs "$W/fs.$i" 64
    make_fs xfs "$W/fs.$i/x/d" 300
    ln -s "fs.$i" "$W/m.$i"
  done
  extract_both m -xf "$W/a.tar" -C x
  grep -q 'Cannot open: No space left on device' "$W/m.bfo.err"
  ! grep -q 'Cannot write' "$W/m.bfo.err"
}

@test "a 1 MiB ext4 whose directories run out of blocks: stock tar's last mkdir fails, and so does bfotar's; no file tar wrote whole is left empty" {
  require_root_loop
  local i
  dirs_of_three "$W/src" 1 30
  tar -C "$W/src" -cf "$W/a.tar" .
  for i in stock bfo; do
    make_fs ext4 "$W/fs.$i" 1 -b 1024 -N 256
    fill_to "$W/fs.$i" 230
    ln -s "fs.$i" "$W/tiny.$i"
  done
  extract_both tiny -xf "$W/a.tar" -C x
  grep -q 'Cannot mkdir: No space left on device' "$W/tiny.bfo.err"
}

@test "--unlink-first onto a disk that has just filled up: the space of a file it removes goes where stock tar gives it, not to queued files" {
  require_root_loop
  local i
  mkdir -p "$W/src/top"
  head -c 3000000 /dev/urandom > "$W/src/top/B"
  head -c 2619 /dev/urandom > "$W/src/top/n"
  head -c 5494 /dev/urandom > "$W/src/top/a"
  tar -C "$W/src" -cf "$W/a.tar" top/B top/n top/a
  for i in stock bfo; do
    make_fs ext4 "$W/fs.$i" 12
    ln -s "fs.$i" "$W/ul.$i"
  done
  # a earlier extraction left top/a; 1000 KiB are free: B fills them, n
  # fails; removing the old a frees the space the new a takes (bfotar gave
  # it to the queued n, and a came out short)
  PREPARE="mkdir -p x/top && cp '$W/src/top/a' x/top/a && fill_to . 1000" \
    extract_both ul --unlink-first -xf "$W/a.tar" -C x
  grep -q 'top/n: Cannot write: No space left on device' "$W/ul.bfo.err"
}

# ------------------------------------------------------------------ existing files

@test "old files: default, --keep-old-files, --skip-old-files, --overwrite, --unlink-first, --recursive-unlink" {
  make_tree "$W/src"
  tar -C "$W/src" -cf "$W/a.tar" .
  # x already holds an older extraction with some files changed, replaced by
  # directories or symlinks, and one new file
  PREPARE="tar -xf $W/a.tar -C x && echo changed > x/many/a/f10 && rm x/many/a/f11 &&
           mkdir x/many/a/f11 && echo keep > x/many/a/f11/in && rm x/many/a/f12 &&
           ln -s f13 x/many/a/f12 && echo new > x/new && chmod u+w x/ro-dir"
  extract_both default -xf "$W/a.tar" -C x
  extract_both keep -xkf "$W/a.tar" -C x
  extract_both skip --skip-old-files -xf "$W/a.tar" -C x
  extract_both over --overwrite -xf "$W/a.tar" -C x
  extract_both unlink -xUf "$W/a.tar" -C x
  extract_both recur --recursive-unlink -xUf "$W/a.tar" -C x
  extract_both newer --keep-newer-files -xf "$W/a.tar" -C x
  [ "$(cat "$W/keep.bfo.status")" = 2 ]
  grep -q 'Cannot open: File exists' "$W/keep.bfo.err"
}

@test "members naming earlier ones: repeated names, hard links to them, --overwrite of a link" {
  mkdir -p "$W/s1/d" "$W/s2/d"
  printf 'first version\n' > "$W/s1/d/f"
  printf 'second, longer version\n' > "$W/s2/d/f"
  chmod 0600 "$W/s2/d/f"
  touch -d '2010-01-01' "$W/s1/d/f"
  tar -C "$W/s1" -cf "$W/a.tar" d
  tar -C "$W/s2" -rf "$W/a.tar" d/f
  ln "$W/s2/d/f" "$W/s2/d/g"
  tar -C "$W/s2" -rf "$W/a.tar" d/g
  printf 'third\n' > "$W/s1/d/g"
  tar -C "$W/s1" -rf "$W/a.tar" d/g d/f
  extract_both repeat -xf "$W/a.tar" -C x
  extract_both repeat-over --overwrite -xf "$W/a.tar" -C x
  extract_both repeat-keep -xkf "$W/a.tar" -C x
  extract_both occurrence --occurrence=2 -xf "$W/a.tar" -C x d/f
}

@test "--overwrite over an existing tree: a name opened again while its earlier member's data are queued (the same name, a hard link to it) gets the later data; the rest does not wait" {
  python3 - "$W/a.tar" <<'EOF'
import io, sys, tarfile
t = tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT)
def reg(name, data):
    i = tarfile.TarInfo(name); i.size = len(data); i.mtime = 1500000000; i.mode = 0o644
    t.addfile(i, io.BytesIO(data))
for k in range(2000):
    reg('d/f%d' % k, b'first %d ' % k * 300)
    if k >= 8:
        j = k - 8
        reg('d/f%d' % j, b'second %d' % j)              # shorter, 8 members later
        h = tarfile.TarInfo('d/h%d' % j); h.type = tarfile.LNKTYPE
        h.linkname = 'd/f%d' % j; h.mtime = 1500000000; t.addfile(h)
        reg('d/h%d' % j, b'third, through the link %d ' % j * 50)   # truncates f's inode
t.close()
EOF
  PREPARE="tar -xf '$W/a.tar' -C x" extract_both over --overwrite -xf "$W/a.tar" -C x
  extract_both fresh --overwrite -xf "$W/a.tar" -C x
  grep -q 'third, through the link 5 ' "$W/over.bfo/x/d/f5"
  [ "$(stat -c %h "$W/over.bfo/x/d/f5")" = 2 ]
  # of the 7976 regular members over the tree, only those naming a file still
  # queued (at most the 3984 later members) wait; the first 2000 never do
  mkdir -p "$W/st/x" && tar -C "$W/st/x" -xf "$W/a.tar"
  "$BFOTAR" --stats --overwrite -C "$W/st/x" -xf "$W/a.tar" 2> "$W/st.err"
  cat "$W/st.err"
  local n
  n=$(sed -n 's/.* \([0-9]*\) waits for a name opened again,.*/\1/p' "$W/st.err")
  [ -n "$n" ] && [ "$n" -le 3984 ]
}

# ------------------------------------------------------------------ bad archives

@test "bad archives: truncated, corrupted header, bad checksum, huge size give stock's messages and trees" {
  make_tree "$W/src"
  tar -C "$W/src" -cf "$W/good.tar" ./many ./a.txt
  local size
  size=$(stat -c %s "$W/good.tar")
  head -c $((size / 2 + 100)) "$W/good.tar" > "$W/trunc.tar"
  head -c 700 "$W/good.tar" > "$W/short.tar"
  cp "$W/good.tar" "$W/chk.tar"
  printf 'XXXX' | dd of="$W/chk.tar" bs=1 seek=$((512 * 9 + 148)) conv=notrunc status=none
  cp "$W/good.tar" "$W/garbage.tar"
  head -c 2048 /dev/urandom | dd of="$W/garbage.tar" bs=512 seek=30 conv=notrunc status=none
  cp "$W/good.tar" "$W/huge.tar"
  python3 - "$W/huge.tar" <<'EOF'
import sys
f = open(sys.argv[1], 'r+b'); b = bytearray(f.read(512))
b[124:136] = b'77777777777\0'; b[148:156] = b'        '
b[148:155] = (b'%06o\0' % sum(b)) + b' '
f.seek(0); f.write(b)
EOF
  local t
  for t in trunc short chk garbage huge; do
    extract_both "$t" -xf "$W/$t.tar" -C x
    STDIN_CMD="cat $W/$t.tar" extract_both "$t-pipe" -xf - -C x
  done
  [ "$(cat "$W/trunc.bfo.status")" = 2 ]
  grep -q 'Unexpected EOF in archive' "$W/trunc.bfo.err"
}

# ------------------------------------------------------------------ upstream's paths

@test "-t, -tv, -O, --to-command, -d, -r, -u and -A keep stock tar's output and archives" {
  make_tree "$W/src"
  rm -f "$W/src/big.bin"
  tar -C "$W/src" -cf "$W/a.tar" .
  tar -C "$W/src" -cf "$W/b.tar" ./many/c
  extract_both list -tf "$W/a.tar"
  extract_both listv -tvf "$W/a.tar" --numeric-owner --full-time
  extract_both tostdout -xOf "$W/a.tar" ./many/a ./sub
  extract_both tocmd --to-command='sha256sum' -xf "$W/a.tar"
  [ -s "$W/tocmd.bfo.out" ]
  PREPARE="tar -xf '$W/a.tar' -C x && echo changed > x/many/a/f3 && rm x/many/a/f4" \
    extract_both diff -df "$W/a.tar" -C x
  grep -q 'f3: Size differs' "$W/diff.bfo.out"
  grep -q 'f4: Warning: Cannot stat' "$W/diff.bfo.err"
  [ "$(cat "$W/diff.bfo.status")" -eq 1 ]
  # -r, -u and -A write the archive with tar's own code: the same bytes
  touch -d '2030-01-01' "$W/src/many/c/g1"
  PREPARE="cp '$W/a.tar' arch.tar" extract_both append -rf arch.tar -C "$W/src" ./many/c
  PREPARE="cp '$W/a.tar' arch.tar" extract_both update -uf arch.tar -C "$W/src" ./many/c
  PREPARE="cp '$W/a.tar' arch.tar" extract_both concat -Af arch.tar "$W/b.tar"
  for t in append update concat; do
    cmp "$W/$t.stock/arch.tar" "$W/$t.bfo/arch.tar"
  done
  [ "$(tar -tf "$W/update.bfo/arch.tar" | grep -c '^./many/c/g1$')" -eq 2 ]
}

# ------------------------------------------------------------------ --progress

# progress_lines FILE: the progress lines in FILE (bfotar's line, run as tar).
progress_lines() { grep -E '^tar: [0-9]+ files, ' "$1" || true; }

@test "-x --progress: files, bytes, rate and ETA on stderr, nothing else changes" {
  make_tree "$W/src"
  tar -C "$W/src" -cf "$W/a.tar" .
  gzip -c "$W/a.tar" > "$W/a.tgz"
  local members
  members=$(tar -tf "$W/a.tar" | wc -l)
  # Not a terminal: a line a second, and the last line with the time taken.
  # BFO_PROGRESS_INTERVAL=0 asks for a line per member, so that the test
  # sees intermediate lines however fast the machine.
  extract_both plain -xf "$W/a.tar" -C x
  mkdir -p "$W/p/x"
  (cd "$W/p" && PATH=$ASBIN:$PATH BFO_PROGRESS_INTERVAL=0 tar --progress -xvf "$W/a.tar" -C x \
     > "$W/p.out" 2> "$W/p.err")
  # stdout (the -v listing) is tar's; the tree is the same as without --progress
  cmp "$W/plain.bfo.out" /dev/null
  diff <(tar -tf "$W/a.tar") "$W/p.out"
  xmanifest "$W/p/x" > "$W/p.manifest"
  diff "$W/plain.bfo.manifest" "$W/p.manifest"
  [ "$(progress_lines "$W/p.err" | wc -l)" -eq $((members + 1)) ]
  # stderr holds nothing but the progress lines
  [ "$(wc -l < "$W/p.err")" -eq $((members + 1)) ]
  # intermediate lines: an ETA from how far tar read the archive (a regular file)
  progress_lines "$W/p.err" | sed -n 2p |
    grep -Eq '^tar: 2 files, [0-9.]+ [KMG]?i?B, [0-9.]+ [KMG]?i?B/s, ETA [0-9]+:[0-5][0-9]$'
  # the last: every member and the whole of the data, with the time taken
  tail -n 1 "$W/p.err" | grep -Eq "^tar: $members files, [0-9.]+ [KMG]iB, [0-9.]+ [KMG]?i?B/s, [0-9.]+ s\$"
  # through a decompressor the size left is unknown: no ETA
  mkdir -p "$W/z/x"
  (cd "$W/z" && PATH=$ASBIN:$PATH BFO_PROGRESS_INTERVAL=0 tar --progress -xzf "$W/a.tgz" -C x \
     2> "$W/z.err")
  progress_lines "$W/z.err" | sed -n 2p | grep -Eq ', ETA --:--$'
  [ "$(progress_lines "$W/z.err" | wc -l)" -eq $((members + 1)) ]
  # default interval: at least the last line, and nothing else
  mkdir -p "$W/d/x"
  (cd "$W/d" && PATH=$ASBIN:$PATH tar --progress -xf "$W/a.tar" -C x 2> "$W/d.err")
  [ "$(progress_lines "$W/d.err" | wc -l)" -eq "$(wc -l < "$W/d.err")" ]
  tail -n 1 "$W/d.err" | grep -Eq "^tar: $members files, .* s\$"
}

@test "-x --progress keeps the exit status and messages of a bad archive" {
  make_tree "$W/src"
  tar -C "$W/src" -cf "$W/good.tar" ./many
  head -c $(( $(stat -c %s "$W/good.tar") / 2 + 100)) "$W/good.tar" > "$W/trunc.tar"
  mkdir -p "$W/n/x" "$W/p/x"
  run -2 env PATH="$ASBIN:$PATH" sh -c "cd '$W/n' && tar -xf '$W/trunc.tar' -C x 2> '$W/n.err'"
  run -2 env PATH="$ASBIN:$PATH" sh -c "cd '$W/p' && tar --progress -xf '$W/trunc.tar' -C x 2> '$W/p.err'"
  # the same messages as without --progress, and a last progress line (the
  # fatal error's hook prints it, before tar's last words)
  grep -q 'Unexpected EOF in archive' "$W/n.err"
  diff "$W/n.err" <(grep -Ev '^tar: [0-9]+ files, ' "$W/p.err")
  progress_lines "$W/p.err" | tail -n 1 | grep -Eq '^tar: [0-9]+ files, .* s$'
}

# ------------------------------------------------------------------ signals

# signal_trial TAR SIG OUT [OPTION...]: TAR OPTION... -xf - from a pipe that stalls half way
# through the archive $W/s.tar; SIG is sent while TAR waits there (with
# SIGINT at its default, as from a terminal); prints TAR's exit status.
signal_trial() {
  local bin=$1 sig=$2 out=$3 st=0
  shift 3
  rm -rf "$out" "$W/fifo" && mkdir "$out" && mkfifo "$W/fifo"
  python3 -c '
import os, sys, time
data = open(sys.argv[1], "rb").read()
os.write(1, data[:len(data) // 2])
time.sleep(60)' "$W/s.tar" > "$W/fifo" &
  local feeder=$!
  # (default dispositions: a background job ignores SIGINT, and make check
  # run under nohup would have tar ignore SIGHUP too)
  python3 -c 'import os, signal, sys
for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
    signal.signal(s, signal.SIG_DFL)
os.execvp(sys.argv[1], sys.argv[1:])' "$bin" "$@" -xf - -C "$out" < "$W/fifo" &
  local pid=$!
  # wait until the files of the first half are there
  local n=0 last=-1 i
  for i in $(seq 1 100); do
    n=$(find "$out" -type f | wc -l)
    [ "$n" -gt 500 ] && [ "$n" = "$last" ] && break
    last=$n
    sleep 0.2
  done
  # twice, as timeout(1) sends it (to the process, then to its group)
  kill -"$sig" "$pid"
  kill -"$sig" "$pid" 2>/dev/null || true
  wait "$pid" || st=$?
  kill "$feeder" 2>/dev/null || true
  wait "$feeder" 2>/dev/null || true
  echo "$st"
}

# random_tree DIR DIRS FILES: DIRS directories of FILES files of 1000-9999
# random bytes each.
random_tree() {
  python3 -c '
import os, sys
root, dirs, files = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
for d in range(dirs):
    os.mkdir(os.path.join(root, "d%d" % d))
    for i in range(files):
        with open(os.path.join(root, "d%d/f%04d" % (d, i)), "wb") as f:
            f.write(os.urandom(1000 + (i * 37) % 9000))' "$@"
}

# complete_list OUT: each regular file under OUT, "ok" if it has its source's
# bytes, else its size.
complete_list() {
  (cd "$1" && find . -type f | LC_ALL=C sort | while read -r f; do
     if cmp -s "$f" "$W/ssrc/$f"; then echo "$f ok"; else echo "$f $(stat -c %s "$f")"; fi
   done)
}

@test "SIGINT, SIGTERM, SIGHUP mid-extract: the queued files are written first; as stock, only the file tar was reading is short, and the status is the signal's" {
  mkdir -p "$W/ssrc"
  random_tree "$W/ssrc" 4 500
  tar -C "$W/ssrc" -cf "$W/s.tar" .
  local sig opt st_b st_s
  for sig in INT TERM HUP; do
    for opt in "" -p; do
      st_b=$(signal_trial "$BFOTAR" "$sig" "$W/b" $opt)
      st_s=$(signal_trial "$STOCK_TAR" "$sig" "$W/s" $opt)
      echo "# $sig $opt: bfotar $st_b, stock $st_s"
      [ "$st_b" = "$st_s" ]
      [ "$st_b" = $((128 + $(kill -l "$sig"))) ]
      complete_list "$W/b" > "$W/b.list"
      complete_list "$W/s" > "$W/s.list"
      # the same files, the same complete; at most one short, the same one
      [ "$(grep -vc ' ok$' "$W/s.list")" -le 1 ]
      diff <(sed 's/ [0-9]*$/ short/' "$W/b.list") <(sed 's/ [0-9]*$/ short/' "$W/s.list")
      [ "$(grep -c ' ok$' "$W/b.list")" -gt 500 ]
    done
  done
}

@test "--checkpoint-action=exec and wait: a command run at a checkpoint sees the files extracted so far written, as with stock" {
  mkdir -p "$W/ssrc"
  random_tree "$W/ssrc" 2 400
  tar -C "$W/ssrc" -cf "$W/s.tar" .
  # at each checkpoint: its number, the regular files there, those not whole
  printf '%s\n' '#!/bin/sh' \
    'cd "$OUT" && find . -type f | LC_ALL=C sort | while read -r f; do' \
    '  cmp -s "$f" "$SRC/$f" || echo "short $f"; done > "$OUT.short"' \
    'echo "$TAR_CHECKPOINT $(find . -type f | wc -l) $(wc -l < "$OUT.short") $(cat "$OUT.short")"' \
    > "$W/chk"
  chmod +x "$W/chk"
  local t
  for t in "$BFOTAR" "$STOCK_TAR"; do
    rm -rf "$W/x" && mkdir "$W/x"
    OUT=$W/x SRC=$W/ssrc "$t" --checkpoint=60 --checkpoint-action="exec=$W/chk" \
      -xf - -C "$W/x" < "$W/s.tar" > "$W/$(basename "$t").log"
  done
  cat "$W/tar.log"
  [ "$(wc -l < "$W/tar.log")" -ge 5 ]
  diff "$W/bfotar.log" "$W/tar.log"
  # wait=SIGUSR1: another process looks while tar waits
  rm -rf "$W/x" && mkdir "$W/x"
  "$BFOTAR" --checkpoint=100 --checkpoint-action='echo=at %u' --checkpoint-action=wait=SIGUSR1 \
    -xf - -C "$W/x" < "$W/s.tar" 2> "$W/w.err" &
  local pid=$! n
  for n in $(seq 1 100); do grep -q 'at ' "$W/w.err" && break; sleep 0.1; done
  OUT=$W/x SRC=$W/ssrc "$W/chk" > "$W/w.log"
  while kill -USR1 "$pid" 2>/dev/null; do sleep 0.05; done
  wait "$pid"
  cat "$W/w.log"
  grep -Eq '^ [0-9]+ [01] ' "$W/w.log"
}

# ------------------------------------------------------------------ kill -9

# kill_trials FS [BFOTAR-OPTIONS...]: kill -9 bfotar -x at three points on a
# fresh FS; a file that carries the archive's mtime must have all its data.
kill_trials() {
  local fs=$1
  shift
  make_fs "$fs" "$W/fs" 512
  mkdir -p "$W/fs/src"
  local i d
  for d in $(seq 1 40); do
    mkdir "$W/fs/src/d$d"
    for i in $(seq 1 200); do printf 'file %d %d\n%0*d\n' "$d" "$i" $((i * 31)) 0 > "$W/fs/src/d$d/f$i"; done
  done
  touch -d '2005-05-05 05:05:05' "$W/fs/src"/d*/f*
  tar -C "$W/fs/src" -cf "$W/a.tar" .
  local trial stamp
  stamp=$(date -d '2005-05-05 05:05:05' +%s)
  for trial in 1 2 3; do
    rm -rf "$W/fs/x" && mkdir "$W/fs/x"
    "$BFOTAR" "$@" -xf "$W/a.tar" -C "$W/fs/x" &
    local pid=$!
    sleep 0.$((trial * 2))
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || true
    # a file looks complete when it carries the archive's mtime: it must be
    (cd "$W/fs/x" && find . -type f -printf '%T@ %P\n' | sed -n "s/^$stamp\.0* //p" |
       while read -r f; do cmp -s "$f" "$W/fs/src/$f" || echo "BAD $f"; done) > "$W/bad"
    [ ! -s "$W/bad" ] || { cat "$W/bad"; false; }
  done
}

@test "kill -9 mid-extract: every file with its archive time stamp has all its data" {
  require_root_loop
  kill_trials ext4
}

@test "kill -9 mid-extract onto Btrfs with --clone-stem=always: the same" {
  require_root_loop
  kill_trials btrfs --clone-stem=always
}

# ------------------------------------------------------------------ --ext4-image

@test "--ext4-image: e2fsck clean and, mounted, what tar -xf puts into the mounted image" {
  require_root_loop
  command -v e2fsck >/dev/null || skip "e2fsck not installed"
  make_tree "$W/src"
  rm -f "$W/src/sparse.img"
  # devices (one number beyond the old 8-bit form) and a fifo
  mkdir "$W/src/dev"
  mknod -m 620 "$W/src/dev/null" c 1 3
  mknod "$W/src/dev/big" c 300 70000
  mknod -m 660 "$W/src/dev/sda" b 8 0
  chown 0:6 "$W/src/dev/sda"
  mkfifo -m 600 "$W/src/dev/fifo"
  touch -h -d '2001-02-03 04:05:06.7' "$W/src/dev/big" "$W/src/dev/fifo"
  setfattr -n user.dev -v 1 "$W/src/dev"
  tar --xattrs -C "$W/src" -cf "$W/a.tar" .
  truncate -s 128M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  run "$BFOTAR" --xattrs -xf "$W/a.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  e2fsck -fn "$W/img"
  mkdir -p "$W/m"
  mount -o loop "$W/ref" "$W/m"
  tar --xattrs -xf "$W/a.tar" -C "$W/m"
  xmanifest "$W/m" | sed 's/^\(d [^ ]* [0-7]* [0-9:]*\) [0-9]*/\1/' > "$W/ref.manifest"
  umount "$W/m"
  mount -o loop,ro "$W/img" "$W/m"
  xmanifest "$W/m" | sed 's/^\(d [^ ]* [0-7]* [0-9:]*\) [0-9]*/\1/' > "$W/img.manifest"
  umount "$W/m"
  diff "$W/ref.manifest" "$W/img.manifest"
  # into a subdirectory, with a member list and --strip-components
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img:/sub/dir" --strip-components=2 ./many/c
  [ "$status" -eq 0 ]
  e2fsck -fn "$W/img"
  debugfs -R 'ls -l /sub/dir/c' "$W/img" 2>/dev/null | grep -q 'link-to-f7'
}

@test "--ext4-image --xattrs: an attribute that does not fit gives stock tar's warning and status" {
  require_root_loop
  mkdir -p "$W/s" "$W/m"
  echo x > "$W/s/f"
  setfattr -n user.small -v 1 "$W/s/f"
  setfattr -n user.big -v "$(head -c 3000 /dev/zero | tr '\0' a)" "$W/s/f"
  tar --xattrs -C "$W/s" -cf "$W/x.tar" .
  truncate -s 32M "$W/img" "$W/ref"
  mkfs.ext4 -q -F -b 1024 "$W/img"
  mkfs.ext4 -q -F -b 1024 "$W/ref"
  mount -o loop "$W/ref" "$W/m"
  run tar --xattrs -xf "$W/x.tar" -C "$W/m"
  umount "$W/m"
  local want_status=$status want_output=$output
  echo "stock: $want_status $want_output"
  run "$BFOTAR" --xattrs -xf "$W/x.tar" --ext4-image="$W/img"
  echo "bfotar: $status $output"
  [ "$status" -eq "$want_status" ]
  [ "${output#*: }" = "${want_output#*: }" ]
  [[ $output == *"Cannot set 'user.big' extended attribute for file './f': No space left on device"* ]]
  e2fsck -fn "$W/img"
  debugfs -R 'ea_get /f user.small' "$W/img" 2>/dev/null | grep -q 1
}

@test "--ext4-image --acls: access and default ACLs (and modes) as tar -x --acls sets them" {
  require_root_loop
  command -v getfacl >/dev/null || skip "getfacl not installed (acl)"
  mkdir -p "$W/s/d/sub" "$W/m"
  echo x > "$W/s/f"
  echo y > "$W/s/plain"
  echo z > "$W/s/d/g"
  setfacl -m u:nobody:rw,g:daemon:r "$W/s/f"
  setfacl -m u:nobody:rwx "$W/s/d"
  setfacl -d -m u:nobody:rx,g:daemon:rwx "$W/s/d" "$W/s/d/sub"
  setfacl -m g:daemon:r "$W/s/d/g"
  chmod 640 "$W/s/plain"
  ln -s f "$W/s/link"
  tar --acls -C "$W/s" -cf "$W/acl.tar" .
  truncate -s 32M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  mount -o loop "$W/ref" "$W/m"
  tar --acls -xf "$W/acl.tar" -C "$W/m"
  (cd "$W/m" && find . -path ./lost+found -prune -o ! -type l -print | LC_ALL=C sort | xargs -d '\n' getfacl -p -n && find . -path ./lost+found -prune -o -printf '%p %M %U %G\n' | LC_ALL=C sort) > "$W/ref.acl"
  umount "$W/m"
  run "$BFOTAR" --acls -xf "$W/acl.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  e2fsck -fn "$W/img"
  mount -o loop,ro "$W/img" "$W/m"
  (cd "$W/m" && find . -path ./lost+found -prune -o ! -type l -print | LC_ALL=C sort | xargs -d '\n' getfacl -p -n && find . -path ./lost+found -prune -o -printf '%p %M %U %G\n' | LC_ALL=C sort) > "$W/img.acl"
  umount "$W/m"
  diff "$W/ref.acl" "$W/img.acl"
  grep -q 'default:user:65534:r-x' "$W/img.acl"
  grep -q 'user:65534:rw-' "$W/img.acl"
}

@test "--ext4-image --selinux: the archive's contexts as tar -x --selinux sets them" {
  require_root_loop
  mkdir -p "$W/s/d" "$W/m"
  echo a > "$W/s/d/f"
  ln -s f "$W/s/d/l"
  tar --format=posix --pax-option='RHT.security.selinux:=system_u:object_r:etc_t:s0' \
    -C "$W/s" -cf "$W/sel.tar" .
  truncate -s 32M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  mount -o loop "$W/ref" "$W/m"
  tar --selinux -xf "$W/sel.tar" -C "$W/m"
  (cd "$W/m" && getfattr -R -h -d -m security.selinux . | grep -v '^$' | paste - - | LC_ALL=C sort) > "$W/ref.sel"
  umount "$W/m"
  run "$BFOTAR" --selinux -xf "$W/sel.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  e2fsck -fn "$W/img"
  mount -o loop,ro "$W/img" "$W/m"
  (cd "$W/m" && getfattr -R -h -d -m security.selinux . | grep -v '^$' | paste - - | LC_ALL=C sort) > "$W/img.sel"
  umount "$W/m"
  cat "$W/img.sel"
  diff "$W/ref.sel" "$W/img.sel"
  [ "$(grep -c etc_t "$W/img.sel")" -ge 3 ]
}

@test "--ext4-image refuses mounted images, other subcommands and options it cannot honour" {
  require_root_loop
  tar -C "$BATS_TEST_DIRNAME" -cf "$W/a.tar" helpers
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F "$W/img"
  mkdir -p "$W/m"
  mount -o loop "$W/img" "$W/m"
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img"
  umount "$W/m"
  [ "$status" -eq 2 ]
  [[ $output == *"it is mounted or in use; unmount it first"* ]]
  local opt
  for opt in --to-stdout -P -k --skip-old-files -U --overwrite-dir; do
    run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img" $opt
    if [ "$opt" = --overwrite-dir ]; then [ "$status" -eq 0 ]; continue; fi
    [ "$status" -eq 2 ]
    [[ $output == *"cannot be used with"* ]]
  done
  run "$BFOTAR" -tf "$W/a.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ] && [[ $output == *"--ext4-image works only with --extract"* ]]
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img" -C /tmp
  [ "$status" -eq 2 ] && [[ $output == *"'--ext4-image' cannot be used with '--directory'"* ]]
  e2fsck -fn "$W/img"
}

@test "--ext4-image: sparse members of every format get tar -x's holes and data, 4 and 1 KiB blocks" {
  require_root_loop
  sparse_tree "$W/src"
  export T0=$(fs_now "$W")
  local fmt b
  for fmt in gnu oldgnu "posix --sparse-version=0.0" "posix --sparse-version=0.1" \
             "posix --sparse-version=1.0"; do
    # shellcheck disable=SC2086
    tar -S --format=$fmt -C "$W/src" -cf "$W/sp.tar" .
    for b in 4096 1024; do
      [ "$b" = 4096 ] || [ "$fmt" = gnu ] || [ "$fmt" = "posix --sparse-version=1.0" ] || continue
      rm -f "$W/img" "$W/ref"
      truncate -s 512M "$W/img" "$W/ref"
      mkfs.ext4 -q -F -b $b "$W/img"
      mkfs.ext4 -q -F -b $b "$W/ref"
      mount_image_rw "$W/ref" "$W/m"
      tar -xf "$W/sp.tar" -C "$W/m"
      (xmanifest "$W/m" && data_map "$W/m") > "$W/ref.manifest"
      umount_image "$W/m"
      run "$BFOTAR" -xf "$W/sp.tar" --ext4-image="$W/img"
      echo "$fmt, $b: $output"
      [ "$status" -eq 0 ] && [ -z "$output" ]
      e2fsck -fn "$W/img"
      mount_image "$W/img" "$W/m"
      (xmanifest "$W/m" && data_map "$W/m") > "$W/img.manifest"
      umount_image "$W/m"
      diff "$W/ref.manifest" "$W/img.manifest"
      grep -q '^s/large 212860928 0-41943040,209715200-212860928$' "$W/img.manifest"
      grep -q '^s/all-hole 10485760 none$' "$W/img.manifest"
    done
  done
}

# time_archive FILE FORMAT: members with time stamps on both sides of what
# ext4 holds (before 1901, 1969, 2038, 2106, 2446, far beyond), large owner
# numbers, and symbolic links tar makes last (absolute or ".." targets).
time_archive() {
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
fmt = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT}[sys.argv[2]]
times = [0, -1, -2**31, -2**31 - 1, -2**33, 2**31 - 1, 2**31, 2**32 + 5, 2**34 - 1,
         2**34, 3 * 2**32 + 2**31 - 1, 3 * 2**32 + 2**31, 2**36, -1.5, 10**11]
ids = [0, 1000, 65535, 65536, 70000, 2**31 - 1, 4294967294]
with tarfile.open(sys.argv[1], 'w', format=fmt) as t:
    def add(name, typ, mtime, link='', data=None, uid=0, gid=0):
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = mtime; ti.linkname = link
        ti.mode = 0o755 if typ == tarfile.DIRTYPE else 0o644; ti.uid = uid; ti.gid = gid
        if data is None:
            t.addfile(ti)
        else:
            ti.size = len(data); t.addfile(ti, io.BytesIO(data))
    add('d', tarfile.DIRTYPE, 2**33)
    for i, tm in enumerate(times):
        o = dict(uid=ids[i % len(ids)], gid=ids[(i + 3) % len(ids)])
        add('d/f%02d' % i, tarfile.REGTYPE, tm, data=b'x' * (100 + i), **o)
        add('d/l%02d' % i, tarfile.SYMTYPE, tm, link='f%02d' % i, **o)
        add('d/x%02d' % i, tarfile.DIRTYPE, tm, **o)
        add('d/p%02d' % i, tarfile.FIFOTYPE, tm, **o)
    add('d/a', tarfile.DIRTYPE, 2**33 + 1)
    add('d/a/abs', tarfile.SYMTYPE, 2**33 + 3, link='/etc/passwd')
    add('d/a/up', tarfile.SYMTYPE, 2**33 + 4, link='../f00')
    add('d/a/ok', tarfile.SYMTYPE, 2**33 + 5, link='../../d')
    add('d/a/f', tarfile.REGTYPE, -5, data=b'z')
    add('z', tarfile.DIRTYPE, -9)
    for j in range(40):
        add('z/q%02d' % j, tarfile.REGTYPE, 1e9, data=b'q' * 3000)
PY
}

@test "--ext4-image: time stamps beyond ext4's range are clamped as the kernel does, with tar's warnings in tar's order" {
  require_root_loop
  local fmt isize
  for fmt in pax gnu; do
    time_archive "$W/t.tar" $fmt
    for isize in 256 128; do
      rm -f "$W/img" "$W/ref"
      truncate -s 64M "$W/img" "$W/ref"
      mkfs.ext4 -q -F -I $isize "$W/img" 2>/dev/null
      mkfs.ext4 -q -F -I $isize "$W/ref" 2>/dev/null
      mount_image_rw "$W/ref" "$W/m"
      (cd "$W/m" && "$STOCK_TAR" -xf "$W/t.tar" 2> "$W/ref.err"; echo "status $?" >> "$W/ref.err")
      # shellcheck disable=SC2016
      (cd "$W/m" && find d z -printf '%p %y %m %U %G %T@\n' | sort) > "$W/ref.list"
      umount_image "$W/m"
      "$BFOTAR" -xf "$W/t.tar" --ext4-image="$W/img" 2> "$W/img.err"; echo "status $?" >> "$W/img.err"
      e2fsck -fn "$W/img"
      mount_image "$W/img" "$W/m"
      (cd "$W/m" && find d z -printf '%p %y %m %U %G %T@\n' | sort) > "$W/img.list"
      umount_image "$W/m"
      echo "$fmt, inodes of $isize bytes"
      diff "$W/ref.list" "$W/img.list"
      sed -i 's/^[^:]*: //; s/ is [0-9.]* s in the future/ in the future/' "$W/ref.err" "$W/img.err"
      diff "$W/ref.err" "$W/img.err"
      grep -q '^d/f03: implausibly old time stamp' "$W/img.err"
      grep -q '^d/a/abs: time stamp .* in the future' "$W/img.err"
      [ "$(tail -1 "$W/img.err")" = "status 0" ]
      # clamped, not wrapped: 2^34 s is after 2446 (256-byte inodes) and 2038 (128)
      if [ $isize = 256 ]; then
        grep -q '^d/f09 f 644 65535 2147483647 15032385535\.0000000000$' "$W/img.list"
      else
        grep -q '^d/f09 f 644 65535 2147483647 2147483647\.0000000000$' "$W/img.list"
      fi
      grep -q '^d/f04 f 644 70000 0 -2147483648\.0000000000$' "$W/img.list"
    done
  done
  # -m and --warning=no-timestamp: no warnings, as tar
  run "$BFOTAR" -m -xf "$W/t.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  run "$BFOTAR" --warning=no-timestamp -xf "$W/t.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
}

# conflict_archives A B: A makes a tree; B has members of other types at its
# names (a directory at a file, a file at an empty and at a full directory, a
# directory at a symbolic link, files at a fifo and at hard links, one through
# a symbolic link to a directory, a hard link to nothing).
conflict_archives() {
  python3 - "$1" "$2" <<'PY'
import io, sys, tarfile
def build(path, entries):
    with tarfile.open(path, 'w', format=tarfile.GNU_FORMAT) as t:
        for name, typ, extra in entries:
            ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
            ti.mode = 0o755 if typ == tarfile.DIRTYPE else 0o640
            if typ in (tarfile.SYMTYPE, tarfile.LNKTYPE):
                ti.linkname = extra
            if typ == tarfile.REGTYPE:
                d = (extra or 'data of ' + name).encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
            else:
                t.addfile(ti)
D, F, S, H, P = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE
A = [('t', D, ''), ('t/file2dir', F, ''), ('t/dir2file', D, ''), ('t/dir2file/in', F, ''),
     ('t/emptydir2file', D, ''), ('t/file2link', F, ''), ('t/link2file', S, 'x'),
     ('t/link2dir', S, 'file2dir'), ('t/hl_src', F, 'shared'), ('t/hl', H, 't/hl_src'),
     ('t/fifo2file', P, ''), ('t/file2fifo', F, ''), ('t/same', F, 'old'),
     ('t/dirlink', S, 'dir2file'), ('t/dangling', S, 'nowhere'), ('t/e1', D, ''), ('t/e2', D, '')]
B = [('t', D, ''), ('t/file2dir', D, ''), ('t/file2dir/new', F, ''), ('t/dir2file', F, 'replaced'),
     ('t/emptydir2file', F, 'replaced'), ('t/file2link', S, 'same'), ('t/link2file', F, 'lf'),
     ('t/link2dir', D, ''), ('t/hl_src', F, 'new content'), ('t/fifo2file', F, 'ff'),
     ('t/file2fifo', P, ''), ('t/same', F, 'new'), ('t/dirlink/through', F, 'via link'),
     ('t/dangling', F, 'through dangling'), ('t/hl2', H, 't/same'), ('t/missing_hl', H, 't/nonexistent'),
     ('t/e1', S, 'same'), ('t/e2', H, 't/same')]
for i in range(40):
    A.append(('t/pad%02d' % i, F, 'p' * 2000)); B.append(('t/padb%02d' % i, F, 'q' * 2000))
build(sys.argv[1], A); build(sys.argv[2], B)
PY
}

# image_list DIR: every entry below DIR with its type, mode, links, size,
# target, owner and (but for directories) modification time.
image_list() {
  (cd "$1" && find t -printf '%p %y %m %n %s %l %U %G %T@\n' | sort \
     | awk '$2 == "d" { $5 = ""; $NF = "" } { print }')
}

@test "--ext4-image: a member the writer fails to make (a file, link or fifo where a directory with entries is) gets no time stamp warning, as tar's failed open gets none; one made does" {
  require_root_loop
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
D, F, L, P = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.FIFOTYPE
# (time stamps before 1970: tar's warning for them has no varying part)
E = [('x/', D, 1000000000), ('x/y', F, 1000000000), ('x', F, -2000000000),
     ('x', L, -3000000000), ('x', P, -4000000000), ('z', F, -2000000000),
     ('x/w', F, -3000000000)]
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:
    for name, typ, mt in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = mt
        ti.mode = 0o755 if typ == D else 0o644
        if typ == L:
            ti.linkname = 'foo'
        if typ == F:
            d = b'abc'; ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --overwrite; do
    # shellcheck disable=SC2086
    limits_compare "$W/a.tar" "" $opt
    [ "$(grep -c '^x: Cannot ' "$W/img.err")" = 3 ]
    grep -q '^z: implausibly old time stamp' "$W/img.err"
    grep -q '^x/w: implausibly old time stamp' "$W/img.err"
    ! grep -q '^x: .*time stamp' "$W/img.err"
  done
}

@test "--ext4-image on an inline_data image: an empty directory is replaced by a later file, link or device of its name, as by tar -x on the mounted image (libext2fs gives an inline directory's '..' as an ordinary entry)" {
  require_root_loop
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
D, F, L, C = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.CHRTYPE
E = [('x/', D), ('x', C), ('y/', D), ('y', F), ('z/', D), ('z', L),
     ('w/', D), ('w/v', F), ('w', F)]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1000000000
        ti.mode = 0o755 if typ == D else 0o644
        if typ == L:
            ti.linkname = 'b'
        if typ == F:
            d = b'abc'; ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
  limits_compare "$W/a.tar" "-O inline_data"
  grep -q '^x 0o20644 ' "$W/img.manifest"
  grep -q '^y 0o100644 ' "$W/img.manifest"
  grep -q '^z 0o120777 ' "$W/img.manifest"
  grep -q '^w 0o40755 ' "$W/img.manifest"   # (not empty: tar's open fails)
}

@test "--ext4-image: hard links to a target with a trailing slash (a file, a directory, links to them, a dangling link, nothing) and to '.': link(2)'s errors, in order, and nothing made, as tar -x on the mounted image" {
  require_root_loop
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
D, F, H, L = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.LNKTYPE, tarfile.SYMTYPE
E = [('d/', D, ''), ('y', F, ''), ('s', L, 'y'), ('t', L, 'd'), ('u', L, 'nowhere'),
     ('h1', H, 'y/'), ('h2', H, 'd/'), ('h3', H, 's/'), ('h4', H, 't/'), ('h5', H, 'u/'),
     ('q/r/h6', H, ''), ('h7', H, '.'), ('h8', H, './'),
     ('d2/', D, ''), ('d2/x', F, ''), ('d2', H, 'y/'), ('e/', D, ''), ('e', H, 'd/'),
     ('h9', H, 'nonexist/'), ('ok', H, 'y')]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ, link in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1000000000
        ti.mode = 0o755 if typ == D else 0o644; ti.linkname = link
        if typ == F:
            ti.size = 1; t.addfile(ti, io.BytesIO(b'1'))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --overwrite; do
    # shellcheck disable=SC2086
    limits_compare "$W/a.tar" "" $opt
    grep -q '^h1: Cannot hard link to .y/.: Not a directory$' "$W/img.err"
    grep -q '^h7: Cannot hard link to .\..: Operation not permitted$' "$W/img.err"
    grep -q '^d2 0o40755 ' "$W/img.manifest"
    grep -q '^ok 0o100644 2 ' "$W/img.manifest"
  done
}

@test "--ext4-image --xattrs: none set for a member that could not be made (a file where a directory with entries is, under a file); user.* refused on links, fifos and devices with tar's lsetxattr/setxattrat warnings: as tar -x on the mounted image" {
  require_root_loop
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
D, F, L, P, C = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.FIFOTYPE, tarfile.CHRTYPE
E = [('s', L, {'user.a': 'v1'}), ('fifo', P, {'user.a': 'v2'}), ('dev', C, {'user.a': 'v3'}),
     ('x', F, {}), ('x/y', F, {'user.a': 'v4'}),
     ('a/', D, {}), ('a/x', F, {}), ('a', F, {'user.a': 'fromfile'}),
     ('ok', F, {'user.a': 'v5'}), ('d/', D, {'user.b': 'v6'}), ('s2', L, {'trusted.t': 'v7'})]
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:
    for name, typ, xa in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1000000000
        ti.mode = 0o755 if typ == D else 0o644
        ti.pax_headers = {'SCHILY.xattr.' + k: v for k, v in xa.items()}
        if typ == L:
            ti.linkname = 't'
        if typ == F:
            ti.size = 3; t.addfile(ti, io.BytesIO(b'abc'))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --overwrite; do
    # shellcheck disable=SC2086
    limits_compare "$W/a.tar" "" --xattrs $opt
    grep -q "^lsetxattr: Cannot set 'user.a' extended attribute for file 's': Operation not permitted$" "$W/img.err"
    grep -q "^setxattrat: Cannot set 'user.a' extended attribute for file 'fifo': Operation not permitted$" "$W/img.err"
    ! grep -q "x/y.*extended attribute\|'a'" "$W/img.err"
    grep -q "^a 0o40755 .* \[\]$" "$W/img.manifest"
    grep -q "^ok 0o100644 .*'user.a'" "$W/img.manifest"
  done
}

@test "--ext4-image over an existing tree: other types replaced or refused as by tar -x on the mounted image; --overwrite rewrites files in place" {
  require_root_loop
  conflict_archives "$W/A.tar" "$W/B.tar"
  local opt start rc
  for opt in "" --overwrite; do
    rm -f "$W/img" "$W/ref"
    truncate -s 64M "$W/img" "$W/ref"
    mkfs.ext4 -q -F "$W/img"
    mkfs.ext4 -q -F "$W/ref"
    start=$(date +%s)
    mount_image_rw "$W/ref" "$W/m"
    # shellcheck disable=SC2086
    (cd "$W/m" && "$STOCK_TAR" -xf "$W/A.tar" && { rc=0; "$STOCK_TAR" $opt -xf "$W/B.tar" 2> "$W/ref.err" || rc=$?; echo "status $rc" >> "$W/ref.err"; })
    image_list "$W/m" > "$W/ref.list"
    (cd "$W/m" && find t -type f -exec sha256sum {} + | sort -k2) > "$W/ref.sum"
    umount_image "$W/m"
    "$BFOTAR" -xf "$W/A.tar" --ext4-image="$W/img"
    rc=0
    # shellcheck disable=SC2086
    "$BFOTAR" $opt -xf "$W/B.tar" --ext4-image="$W/img" 2> "$W/img.err" || rc=$?
    echo "status $rc" >> "$W/img.err"
    e2fsck -fn "$W/img"
    mount_image "$W/img" "$W/m"
    image_list "$W/m" > "$W/img.list"
    (cd "$W/m" && find t -type f -exec sha256sum {} + | sort -k2) > "$W/img.sum"
    # a directory an entry went into keeps the time of that change
    [ "$(stat -c %Y "$W/m/t/dir2file")" -ge "$start" ]
    umount_image "$W/m"
    echo "[$opt]"
    diff "$W/ref.list" "$W/img.list"
    diff "$W/ref.sum" "$W/img.sum"
    sed -i 's/^[^:]*: //' "$W/ref.err" "$W/img.err"
    diff "$W/ref.err" "$W/img.err"
    grep -q '^t/dir2file: Cannot open: ' "$W/img.err"
    grep -q '^t/file2dir d 755 2 ' "$W/img.list"
    grep -q '^t/link2dir d 755 2 ' "$W/img.list"
    grep -q '^t/dirlink l .* dir2file ' "$W/img.list"
  done
  # --overwrite: the hard links of the rewritten file share its new data
  grep -q '^t/hl f 640 2 11 ' "$W/img.list"
  grep -q '^t/fifo2file p ' "$W/img.list"
}

@test "--ext4-image --overwrite of a hard-linked file with a deep extent tree: rewritten in its inode, e2fsck clean, as tar on the mounted image" {
  require_root_loop
  truncate -s 256M "$W/img"
  mkfs.ext4 -q -F "$W/img"
  mount_image_rw "$W/img" "$W/m"
  mkdir "$W/m/t"
  # two files written in turns, each block synced: the first gets many extents
  python3 - "$W/m/t" <<'PY'
import os, sys
d = sys.argv[1]
a = os.open(d + '/big', os.O_WRONLY | os.O_CREAT, 0o644)
b = os.open(d + '/other', os.O_WRONLY | os.O_CREAT, 0o644)
for i in range(1500):
    os.write(a, os.urandom(4096)); os.fsync(a); os.write(b, os.urandom(4096)); os.fsync(b)
PY
  ln "$W/m/t/big" "$W/m/t/big.hl"
  rm "$W/m/t/other"
  [ "$(filefrag "$W/m/t/big" | awk '{print $2}')" -gt 4 ]
  umount_image "$W/m"
  cp "$W/img" "$W/ref"
  mkdir -p "$W/s/t"
  head -c 3000000 /dev/urandom > "$W/s/t/big"
  tar -C "$W/s" -cf "$W/b.tar" t
  run "$BFOTAR" --overwrite -xf "$W/b.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  e2fsck -fn "$W/img"
  mount_image_rw "$W/ref" "$W/m"
  (cd "$W/m" && "$STOCK_TAR" --overwrite -xf "$W/b.tar")
  image_list "$W/m" > "$W/ref.list"
  umount_image "$W/m"
  mount_image "$W/img" "$W/m"
  image_list "$W/m" > "$W/img.list"
  cmp "$W/m/t/big.hl" "$W/s/t/big"
  umount_image "$W/m"
  diff "$W/ref.list" "$W/img.list"
  grep -q '^t/big f 644 2 3000000 ' "$W/img.list"
}

# extract_twice_compare ARCHIVE [OPTION]: ARCHIVE extracted twice with OPTION
# into a fresh image mounted, by stock tar, and into another with bfotar
# --ext4-image: the same entries (modes, links, owners; times but for
# directories), contents, messages and statuses, and e2fsck clean.  Leaves
# $W/img.list and $W/img.err (messages without the program name).
extract_twice_compare() {
  local archive=$1 opt=${2:-} k rc
  rm -f "$W/img" "$W/ref" "$W/ref.err" "$W/img.err"
  truncate -s 64M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  for k in 1 2; do
    rc=0
    # shellcheck disable=SC2086
    (cd "$W/m" && "$STOCK_TAR" $opt -xf "$archive") 2>> "$W/ref.err" || rc=$?
    echo "status $rc" >> "$W/ref.err"
  done
  image_list "$W/m" | awk '$2 != "d" { $NF = "" } { print }' > "$W/ref.list"
  (cd "$W/m" && find t -type f -exec sha256sum {} + | sort -k2) > "$W/ref.sum"
  umount_image "$W/m"
  for k in 1 2; do
    rc=0
    # shellcheck disable=SC2086
    "$BFOTAR" $opt -xf "$archive" --ext4-image="$W/img" 2>> "$W/img.err" || rc=$?
    echo "status $rc" >> "$W/img.err"
  done
  e2fsck -fn "$W/img" > /dev/null
  mount_image "$W/img" "$W/m"
  image_list "$W/m" | awk '$2 != "d" { $NF = "" } { print }' > "$W/img.list"
  (cd "$W/m" && find t -type f -exec sha256sum {} + | sort -k2) > "$W/img.sum"
  umount_image "$W/m"
  echo "$(basename "$archive") [$opt]"
  diff "$W/ref.list" "$W/img.list"
  diff "$W/ref.sum" "$W/img.sum"
  sed -i 's/^[^:]*: //' "$W/ref.err" "$W/img.err"
  diff "$W/ref.err" "$W/img.err"
}

@test "--ext4-image into an image with immutable and append-only files and directories: kept as the kernel keeps them from tar -x, same messages and status (tar's refused utime, chown and chmod of them where tar sets them)" {
  require_root_loop
  local t=$W/s/t opt rc x
  mkdir -p "$t/d" "$t/idir" "$t/ad" "$t/imm/sub/deep"
  for x in 1 2 3 4 5 6; do echo "new $x" > "$t/d/f$x"; done
  echo new > "$t/idir/x"; ln -s f1 "$t/d/l3"
  echo a > "$t/ad/keep"; echo b > "$t/ad/new"; echo t > "$t/tgt"; ln "$t/tgt" "$t/hl1"
  ln "$t/tgt" "$t/ad/hl2"; mkdir "$t/fdir"; echo y > "$t/imm/sub/deep/y"
  mknod "$t/dev" c 1 3; echo z > "$t/plain"; ln "$t/plain" "$t/hl3"
  echo over-link > "$t/ad/s"; echo over-fifo > "$t/ad/p"; mkdir "$t/ad/kf"
  (cd "$W/s" && "$STOCK_TAR" -cf "$W/a.tar" t)
  # then a file of the name of that directory: the kept file t/ad/kf takes
  # the directory's attributes, then (--overwrite) the file's
  mkdir -p "$W/s2/t/ad"
  echo kf > "$W/s2/t/ad/kf"
  chmod 640 "$W/s2/t/ad/kf"
  (cd "$W/s2" && "$STOCK_TAR" -rf "$W/a.tar" t/ad/kf)
  for opt in "" --overwrite; do
    rm -f "$W/img" "$W/ref" "$W/ref.err" "$W/img.err"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F "$W/img"
    mount_image_rw "$W/img" "$W/m"
    (cd "$W/m" && mkdir -p t/d t/idir t/ad t/imm &&
       for x in 1 2 3 4 5; do echo old > "t/d/f$x"; done &&
       echo old > t/d/l3 && echo old > t/ad/keep && echo old > t/tgt && echo old > t/hl1 &&
       echo old > t/fdir && echo old > t/dev && echo old > t/plain && echo old > t/hl3 &&
       ln -s target t/ad/s && mkfifo t/ad/p && echo old > t/ad/kf &&
       chattr +i t/d/f1 t/d/f2 t/d/l3 t/idir t/tgt t/imm t/dev t/plain &&
       chattr +a t/d/f3 t/ad t/fdir)
    umount_image "$W/m"
    cp --sparse=always "$W/img" "$W/ref"
    mount_image_rw "$W/ref" "$W/m"
    rc=0
    # shellcheck disable=SC2086
    (cd "$W/m" && "$STOCK_TAR" $opt -xf "$W/a.tar") 2> "$W/ref.err" || rc=$?
    echo "status $rc" >> "$W/ref.err"
    (cd "$W/m" && find t -printf '%p %y %m %n %s %l\n' | sort && lsattr -R t | sort &&
       find t -type f -exec sha256sum {} + | sort -k2) > "$W/ref.list"
    umount_image "$W/m"
    rc=0
    # shellcheck disable=SC2086
    "$BFOTAR" $opt -xf "$W/a.tar" --ext4-image="$W/img" 2> "$W/img.err" || rc=$?
    echo "status $rc" >> "$W/img.err"
    e2fsck -fn "$W/img" > /dev/null
    mount_image "$W/img" "$W/m"
    (cd "$W/m" && find t -printf '%p %y %m %n %s %l\n' | sort && lsattr -R t | sort &&
       find t -type f -exec sha256sum {} + | sort -k2) > "$W/img.list"
    umount_image "$W/m"
    diff "$W/ref.list" "$W/img.list"
    grep -q '^t/d/f1 f 644 1 4 $' "$W/img.list"      # immutable: kept
    grep -q '^t/idir/x' "$W/img.list" && false       # nothing made in it
    sed -i 's/^[^:]*: //' "$W/ref.err" "$W/img.err"
    # The kernel's refusals of tar's utime, chown and chmod of a kept
    # directory (or of the file where one comes), where tar's delayed
    # set_stat meets them.
    [ "$(grep -c -E '^t/(idir|imm|ad|fdir): Cannot (utime|change ownership|change mode)' "$W/ref.err")" -eq 9 ]
    diff "$W/ref.err" "$W/img.err"
    grep -q '^t/imm/sub: Cannot mkdir: Operation not permitted$' "$W/img.err"
    grep -q '^t/imm/sub/deep/y: Cannot open: No such file or directory$' "$W/img.err"
    grep -q '^t/hl3: Cannot hard link to .t/plain.: Operation not permitted$' "$W/img.err"
  done
}

@test "--ext4-image over directories it finds, with --no-overwrite-dir and --delay-directory-restore, immutable ones and kept links where a directory comes: modes, owners, times, messages and status as tar -x on the mounted image" {
  require_root_loop
  local t=$W/s/t opt
  mkdir -p "$t/d/sub" "$t/e" "$t/g" "$t/i" "$t/a" "$t/k/ln" "$t/k/lf" "$t/k/lk" "$t/z" \
           "$t/s" "$t/sg/new"
  for x in 1 2 3; do echo $x > "$t/d/f$x"; echo $x > "$t/d/sub/s$x"; done
  echo x > "$t/e/x"; echo i > "$t/i/f"; echo a > "$t/a/f"; echo z > "$t/z/f"
  chmod 2750 "$t/g"; chmod 1777 "$t/e"; chmod 700 "$t/d/sub" "$t/i"; chmod 750 "$t/a"
  chmod 700 "$t/k/lf"; chmod 777 "$t/k/lk"; chmod 700 "$t/s" "$t/sg/new"
  chown 7:8 "$t/d"; chown 5:5 "$t/a"
  touch -d @2000000 "$t/d/sub" "$t/d" "$t/e" "$t/g" "$t/i" "$t/a" "$t/k"/* "$t/k" "$t/z" "$t/s" \
        "$t/sg/new" "$t/sg" "$t"
  # t/z comes back after t/e: tar has set its attributes then, unless
  # --delay-directory-restore
  (cd "$W/s" && "$STOCK_TAR" -cf "$W/a.tar" --no-recursion t t/d t/d/f1 t/d/f2 t/d/f3 \
     t/d/sub t/d/sub/s1 t/e t/e/x t/g t/i t/i/f t/a t/a/f t/k t/k/ln t/k/lf t/k/lk \
     t/z t/e/x t/z/f t/s t/sg t/sg/new)
  for opt in "" --no-overwrite-dir "--no-overwrite-dir --no-same-permissions" \
             --delay-directory-restore "--delay-directory-restore -m" --no-same-owner \
             --no-same-permissions; do
    rm -f "$W/img" "$W/ref"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F "$W/img"
    mount_image_rw "$W/img" "$W/m"
    # found: t/d (711 3:4), t/d/sub, t/e (755); immutable t/i (2755) and
    # append-only t/a; in append-only t/k a dangling link, a link to a
    # file and one to an immutable file where directories come; t/s with
    # set-ID and sticky bits, set-group-ID t/sg
    (cd "$W/m" && mkdir -p t/d/sub t/e t/i t/a t/k t/s t/sg && chmod 711 t/d && chown 3:4 t/d &&
       chmod 3755 t/s && chmod 2755 t/sg &&
       chmod 2755 t/i && echo f > t/k/file && echo f > t/k/imm &&
       ln -s nowhere t/k/ln && ln -s file t/k/lf && ln -s imm t/k/lk &&
       touch -d @3000000 t/d t/e && chattr +i t/i t/k/imm && chattr +a t/a t/k)
    umount_image "$W/m"
    # shellcheck disable=SC2086
    image_compare "$W/a.tar" $opt
    case $opt in
      --no-overwrite-dir*)
        grep -q '^t/d 0o40711 3 3 4 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/i: Cannot change mode to rwx------: Operation not permitted$' "$W/img.err" ;;
      --delay*)
        if [ "$opt" = --delay-directory-restore ]; then
          grep -q '^t/z 0o40755 2 0 0 2000000000000000 ' "$W/img.manifest"
        fi
        grep -q '^t/k/ln: Cannot change mode to rwxr-xr-x: No such file or directory$' "$W/img.err" ;;
      --no-same-permissions)
        # its chmod keeps what its mask leaves out
        grep -q '^t/s 0o43700 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/sg/new 0o42700 2 0 0 2000000000000000 ' "$W/img.manifest" ;;
      "")
        grep -q '^t/s 0o40700 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/d 0o40755 3 7 8 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/z 0o40755 2 0 0 NOW ' "$W/img.manifest"
        grep -q '^t/k/ln: Cannot utime: No such file or directory$' "$W/img.err"
        grep -q '^t/i: Cannot change mode to rwx------: Operation not permitted$' "$W/img.err" ;;
    esac
  done
}

@test "--ext4-image as a user other than root (an image of theirs, mkfs -E root_owner): modes under the umask, -p, --no-overwrite-dir, no chown: as that user's tar -x on the mounted image" {
  require_root_loop
  local t=$W/s/t opt
  # nobody must reach the test's directory (bats makes its run directory 0700)
  nobody_reaches "$W"
  mkdir -p "$t/d/sub" "$t/e" "$t/r" "$t/g"
  for x in 1 2 3; do echo $x > "$t/d/f$x"; done
  echo s > "$t/d/sub/s"; echo e > "$t/e/x"; ln -s ../d/f1 "$t/e/l"; ln "$t/d/f2" "$t/e/h"
  chmod 4755 "$t/d/f3"; chmod 1777 "$t/e"; chmod 2750 "$t/g"; chmod 700 "$t/d/sub"
  chown 7:8 "$t/d/f1" "$t/d"
  touch -d @2000000 "$t/d/sub" "$t/d" "$t/e" "$t/r" "$t/g" "$t"
  (cd "$W/s" && "$STOCK_TAR" -cf "$W/a.tar" t)
  chmod 644 "$W/a.tar"
  for opt in "" -p --no-overwrite-dir "--no-overwrite-dir -p" --overwrite; do
    rm -f "$W/img" "$W/ref"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F -E root_owner=65534:65534 "$W/img"
    mount_image_rw "$W/img" "$W/m"
    # found: t/d with the bits a umask of 027 masks, t/e set-ID and
    # sticky, t/r without u+wx; all nobody's
    (cd "$W/m" && mkdir -p t/d t/e t/r && echo old > t/d/f1 && chmod 755 t/d &&
       chmod 3775 t/e && chmod 555 t/r && chown -R 65534:65534 t)
    umount_image "$W/m"
    # shellcheck disable=SC2086
    nobody_compare 027 $opt
  done
  # no chown: the user's files; the last run (--overwrite) under the umask
  grep -q '^t/d/f1 0o100640 1 65534 65534 ' "$W/img.manifest"
  grep -q '^t/d 0o40750 3 65534 65534 2000000000000000 ' "$W/img.manifest"
}

@test "--ext4-image --overwrite of files with set-user-ID and set-group-ID bits: rewritten in place with the modes tar -x's open, chown and chmod leave (tar 1.34 keeps the bits its chown cleared off), as root with its options and as another user: as tar -x on the mounted image" {
  require_root_loop
  local t=$W/s/t opt m0 m i
  nobody_reaches "$W"
  local old="4755 2755 2745 4644 6711 1755 0755 0644" new="4755 0755 2755 0644 6755 1777 2711 0700"
  # old files of these modes, each overwritten by members of those
  mkdir -p "$t"
  i=0
  for m0 in $old; do
    for m in $new; do
      i=$((i + 1))
      echo "new $i" > "$t/o$i"
      chown 0:101 "$t/o$i"   # (a chown clears set-ID bits: before the chmod)
      chmod "$m" "$t/o$i"
    done
  done
  (cd "$W/s" && "$STOCK_TAR" -cf "$W/a.tar" t)
  chmod 644 "$W/a.tar"
  # old_files OWNER GROUP: the old files in the mounted image $W/m
  old_files() {
    local j=0 a b
    mkdir -p "$W/m/t"
    chown "$1" "$W/m/t"
    for a in $old; do
      for b in $new; do
        j=$((j + 1))
        echo "old $j" > "$W/m/t/o$j"
        chown "$1:$2" "$W/m/t/o$j"
        chmod "$a" "$W/m/t/o$j"
      done
    done
  }
  for opt in "" --no-same-permissions --no-same-owner "--numeric-owner -m"; do
    rm -f "$W/img"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F "$W/img"
    mount_image_rw "$W/img" "$W/m"
    old_files 0 101
    umount_image "$W/m"
    # shellcheck disable=SC2086
    image_compare "$W/a.tar" --overwrite $opt
  done
  # tar's chown cleared the bits, its chmod did not run: 4755 over 4755
  grep -q '^t/o1 0o100755 1 0 101 ' "$W/img.manifest"
  # another user's files, of their group and of one not theirs
  for g in 65534 0; do
    for opt in "" -p; do
      rm -f "$W/img" "$W/ref"
      truncate -s 64M "$W/img"
      mkfs.ext4 -q -F -E root_owner=65534:65534 "$W/img"
      mount_image_rw "$W/img" "$W/m"
      old_files 65534 $g
      umount_image "$W/m"
      echo "group $g"
      # shellcheck disable=SC2086
      nobody_compare 022 --overwrite $opt
    done
  done
  # -p's chmod of a file of group 0 cleared its set-group-ID bit: 2755 over 4755
  grep -q '^t/o3 0o100755 1 65534 0 ' "$W/img.manifest"
}

@test "--ext4-image into a case-folded directory (chattr +F): a name it does not hold byte for byte is refused, not added beside its other case; e2fsck clean" {
  require_root_loop
  # (This kernel has no CONFIG_UNICODE: it cannot mount a casefold image, so
  # there is no tar -x on the mounted image to compare with; the directory
  # is made case-folded with debugfs.)
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F -O casefold "$W/img"
  printf old > "$W/old"
  debugfs -w -R "mkdir t" "$W/img" 2> /dev/null
  debugfs -w -R "mkdir t/cf" "$W/img" 2> /dev/null
  debugfs -w -R "set_inode_field t/cf flags 0x40080000" "$W/img"   # casefold, extents
  debugfs -w -R "write $W/old t/cf/a" "$W/img" > /dev/null 2>&1
  e2fsck -fn "$W/img" > /dev/null
  entries_archive "$W/cf.tar" <<'PY'
[('t/cf/A', F, 'upper'), ('t/cf/a', F, 'lower'), ('t/cf/NEW/x', F, 'x'), ('t/cf/sub', D, ''),
 ('t/other/A', F, 'A'), ('t/other/a', F, 'a')]
PY
  run --separate-stderr "$BFOTAR" -xf "$W/cf.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ]
  diff - <(printf '%s\n' "$stderr" | sed 's/^[^:]*: //') <<'MSG'
t/cf/A: Cannot open: Operation not supported
t/cf/NEW: Cannot mkdir: Operation not supported
t/cf/NEW/x: Cannot open: No such file or directory
t/cf/sub: Cannot mkdir: Operation not supported
Exiting with failure status due to previous errors
MSG
  e2fsck -fn "$W/img" > /dev/null
  debugfs -R "ls t/cf" "$W/img" 2> /dev/null | tr -s ' ' '\n' | grep -v -e '^$' -e '^(' -e '^[0-9]' | sort > "$W/cf.ls"
  diff <(printf '%s\n' . .. a) "$W/cf.ls"
  [ "$(debugfs -R "cat t/cf/a" "$W/img" 2> /dev/null)" = lower ]
  [ "$(debugfs -R "cat t/other/A" "$W/img" 2> /dev/null)" = A ]
}

@test "--ext4-image: new inodes take their directory's inheritable flags (chattr +A +d +S +D) as tar -x's on the mounted image, and its project ID under +P" {
  require_root_loop
  local d e=()
  for d in t/A t/d t/S t/D t/T t/all; do
    e+=("('$d/f', F, 'f'), ('$d/sub', D, ''), ('$d/sub/g', F, 'g'), ('$d/l', S, 'f'),")
    e+=("('$d/h', H, '$d/f'), ('$d/new/deep/x', F, 'x'), ('$d/big', F, 'b' * 100000),")
  done
  printf '[%s]\n' "${e[*]}" | entries_archive "$W/fl.tar"
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F "$W/img"
  mount_image_rw "$W/img" "$W/m"
  (cd "$W/m" && mkdir -p t/A t/d t/S t/D t/T t/all && chattr +A t/A && chattr +d t/d &&
     chattr +S t/S && chattr +D t/D && chattr +T t/T && chattr +AdSD t/all)
  umount_image "$W/m"
  cp --sparse=always "$W/img" "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  (cd "$W/m" && "$STOCK_TAR" -xf "$W/fl.tar")
  (cd "$W/m" && lsattr -R t | grep -v -e '^$' -e ':$' | sort -k2) > "$W/ref.list"
  umount_image "$W/m"
  "$BFOTAR" -xf "$W/fl.tar" --ext4-image="$W/img"
  e2fsck -fn "$W/img" > /dev/null
  mount_image "$W/img" "$W/m"
  (cd "$W/m" && lsattr -R t | grep -v -e '^$' -e ':$' | sort -k2) > "$W/img.list"
  umount_image "$W/m"
  diff "$W/ref.list" "$W/img.list"
  # (sync, nodump, noatime reach a file two new directories down; dirsync
  # and topdir stay on directories)
  grep -q '^--S---dA------e------- t/all/new/deep/x$' "$W/img.list"
  grep -q '^--SD--dA------e------- t/all/new/deep$' "$W/img.list"
  grep -q '^--------------e------- t/T/new$' "$W/img.list"
  # Project IDs: this kernel has no CONFIG_QUOTA (no read-write mount of a
  # quota image), so +P and the ID are set with debugfs and read back there.
  rm -f "$W/img"
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F -O quota,project -I 256 "$W/img"
  debugfs -w -R "mkdir t" "$W/img" 2> /dev/null
  debugfs -w -R "mkdir t/P" "$W/img" 2> /dev/null
  debugfs -w -R "set_inode_field t/P flags 0x20080000" "$W/img"   # projinherit, extents
  debugfs -w -R "set_inode_field t/P projid 42" "$W/img"
  entries_archive "$W/pj.tar" <<'PY'
[('t/P/f', F, 'x' * 5000), ('t/P/new/g', F, 'g'), ('t/P/l', S, 'f'), ('t/q', F, 'q')]
PY
  "$BFOTAR" -xf "$W/pj.tar" --ext4-image="$W/img"
  e2fsck -fn "$W/img" > /dev/null
  for d in t/P/f t/P/new t/P/new/g t/P/l t/q; do
    debugfs -R "stat $d" "$W/img" 2> /dev/null | grep -o 'Project: *[0-9]*' | tr -s ' '
  done > "$W/pj.list"
  diff <(printf 'Project: %s\n' 42 42 42 42 0) "$W/pj.list"
  [ "$(debugfs -R "stat t/P/new" "$W/img" 2> /dev/null | grep -o 'Flags: 0x[0-9a-f]*')" = "Flags: 0x20080000" ]
}

@test "--ext4-image into an encrypted directory (fscrypt, e4crypt): refused, no plaintext name written into it; e2fsck clean" {
  require_root_loop
  command -v e4crypt > /dev/null || skip "no e4crypt (e2fsprogs)"
  [ -e /sys/fs/ext4/features/encryption ] || skip "this kernel's ext4 has no encryption"
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F -O encrypt "$W/img"
  mount_image_rw "$W/img" "$W/m"
  mkdir -p "$W/m/t/e"
  printf passphrase | e4crypt add_key -S 0x1234567812345678 "$W/m/t/e" > /dev/null
  echo secret > "$W/m/t/e/inside"
  umount_image "$W/m"
  entries_archive "$W/enc.tar" <<'PY'
[('t/e/new', F, 'x'), ('t/e/inside', F, 'replaced'), ('t/e/d/f', F, 'f'), ('t/plain', F, 'p')]
PY
  run --separate-stderr "$BFOTAR" -xf "$W/enc.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ]
  diff - <(printf '%s\n' "$stderr" | sed 's/^[^:]*: //') <<'MSG'
t/e/new: Cannot open: Operation not supported
t/e/inside: Cannot open: Operation not supported
t/e/d: Cannot mkdir: Operation not supported
t/e/d/f: Cannot open: No such file or directory
Exiting with failure status due to previous errors
MSG
  # (before 2026-11-28: plaintext names in it, "Encrypted entry ... is too
  # short" from e2fsck and "Structure needs cleaning" from the kernel)
  e2fsck -fn "$W/img" > /dev/null
  mount_image "$W/img" "$W/m"
  [ "$(ls "$W/m/t/e" | wc -l)" -eq 1 ]
  [ "$(cat "$W/m/t/plain")" = p ]
  umount_image "$W/m"
}

@test "--ext4-image into a set-group-ID directory: new entries take its group, new directories its set-group-ID bit, as tar -x's on the mounted image" {
  require_root_loop
  entries_archive "$W/sg.tar" <<'PY'
[('t/g/f', F, 'f'), ('t/g/sub', D, ''), ('t/g/sub/x', F, 'x'), ('t/g/imp/deep/y', F, 'y'),
 ('t/g/l', S, 'f'), ('t/h/imp2/z', F, 'z')]
PY
  local opt
  for opt in "" --no-same-owner; do
    rm -f "$W/img" "$W/ref"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F "$W/img"
    mount_image_rw "$W/img" "$W/m"
    (cd "$W/m" && mkdir -p t/g t/h && chgrp 1234 t/g t/h && chmod 2775 t/g && chmod 775 t/h)
    umount_image "$W/m"
    cp --sparse=always "$W/img" "$W/ref"
    mount_image_rw "$W/ref" "$W/m"
    # shellcheck disable=SC2086
    (cd "$W/m" && "$STOCK_TAR" $opt -xf "$W/sg.tar")
    (cd "$W/m" && find t -path 't/pad*' -prune -o -printf '%p %y %m %U %G\n' | sort) > "$W/ref.list"
    umount_image "$W/m"
    # shellcheck disable=SC2086
    "$BFOTAR" $opt -xf "$W/sg.tar" --ext4-image="$W/img"
    e2fsck -fn "$W/img" > /dev/null
    mount_image "$W/img" "$W/m"
    (cd "$W/m" && find t -path 't/pad*' -prune -o -printf '%p %y %m %U %G\n' | sort) > "$W/img.list"
    umount_image "$W/m"
    diff "$W/ref.list" "$W/img.list"
    grep -q '^t/g/imp/deep d 2755 0 1234$' "$W/img.list"
    grep -q '^t/h/imp2 d 755 0 0$' "$W/img.list"
  done
}

@test "--ext4-image: members naming earlier ones in other types (file, directory, symlink on the way, fifo, hard links, a link to a later member), twice over: as tar -x on the mounted image" {
  require_root_loop
  python3 - "$W/i.tar" <<'PY'
import io, sys, tarfile
D, F, S, H, P = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE
E = [('t', D, ''), ('t/x', F, 'x1'), ('t/x', D, ''), ('t/x/y', F, 'y'),
     ('t/d', D, ''), ('t/d', F, 'file over empty dir'),
     ('t/e', D, ''), ('t/e/in', F, ''), ('t/e', F, 'file over full dir'),
     ('t/s', S, 'x'), ('t/s/through', F, 'via link'), ('t/s', D, ''), ('t/s/z', F, 'z'),
     ('t/f', F, 'one'), ('t/h', H, 't/f'), ('t/f', F, 'two'), ('t/h2', H, 't/f'),
     ('t/l', S, 'a'), ('t/l', S, 'b'), ('t/l', F, 'c'),
     ('t/p', P, ''), ('t/p', F, 'over fifo'), ('t/q', F, 'q'), ('t/q', P, ''),
     ('t/r', F, 'r1'), ('t/r', F, 'r2'), ('t/r', F, 'r3'),
     ('t/hs', H, 't/sl'), ('t/sl', S, 'f'), ('t/hs2', H, 't/sl')]
E += [('t/pad%02d' % i, F, 'p' * 2000) for i in range(40)]
E += [('t/late', D, ''), ('t/late', S, 'x'), ('t/pad00', D, ''), ('t/pad00/k', F, 'k')]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ, extra in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
        ti.mode = 0o755 if typ == D else 0o640
        if typ in (S, H):
            ti.linkname = extra
        if typ == F:
            d = (extra or 'data of ' + name).encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --overwrite; do
    extract_twice_compare "$W/i.tar" "$opt"
    grep -q '^t/x/through f ' "$W/img.list"
    grep -q '^t/hs: Cannot hard link to .t/sl.: No such file or directory$' "$W/img.err"
    grep -q '^t/h2 f 640 [23] ' "$W/img.list"
  done
}

# entries_archive FILE: a GNU archive of the members E (a Python list of
# (name, type, content or link target), D F S H for the types) read from
# stdin, then 40 files of 2000 bytes (t/padNN: batches of their own).
entries_archive() {
  python3 -c '
import io, sys, tarfile
D, F, S, H = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE
E = eval(sys.stdin.read())
E += [("t/pad%02d" % i, F, "p" * 2000) for i in range(40)]
with tarfile.open(sys.argv[1], "w", format=tarfile.GNU_FORMAT) as t:
    for name, typ, extra in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
        ti.mode = 0o755 if typ == D else 0o644
        if typ in (S, H):
            ti.linkname = extra
        if typ == F:
            d = extra.encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
' "$1"
}

@test "--ext4-image: members through a symbolic link from an earlier batch land where tar -x puts them, as the archive's order makes directories on the way; 'Cannot mkdir' for a directory under a dangling link" {
  require_root_loop
  # Each symbolic link is made before the members through it (a batch of its
  # own: they name it).  t/1: a link that fails makes t/1/a on the way, and the
  # symlink through t/1/b lands in it.  t/2: the member through t/2/y comes
  # before anything makes t/2/a, so it fails, and t/2/a/f is made after it.
  # t/3: t/3/a is made first, so the member through t/3/y lands in it.
  # t/4 to t/6: tar's make_directories cannot make t/N/A/x under the dangling
  # link (a directory, a file, a hard link).  t/7: the link leads to m/n.
  # t/8: tar removes the symbolic link t/8/b to make the hard link there,
  # and then its target t/8/b/x is gone.
  entries_archive "$W/v.tar" <<'PY'
[('t', D, ''),
 ('t/1', D, ''), ('t/1/b', S, 'a'), ('t/1/a/x', H, 't/1/c/z'), ('t/1/b/x', S, 'a'),
 ('t/2', D, ''), ('t/2/y', S, 'a'), ('t/2/y/x', F, 'through'), ('t/2/a/f', F, 'f'),
 ('t/3', D, ''), ('t/3/y', S, 'a'), ('t/3/a/f', F, 'f'), ('t/3/y/x', F, 'through'),
 ('t/4', D, ''), ('t/4/A', S, 'missing'), ('t/4/A/x/q', D, ''),
 ('t/5', D, ''), ('t/5/A', S, 'missing'), ('t/5/A/x/f', F, 'f'), ('t/5/A/g', F, 'g'),
 ('t/6', D, ''), ('t/6/f', F, 'f'), ('t/6/A', S, 'missing'), ('t/6/A/x/l', H, 't/6/f'),
 ('t/7', D, ''), ('t/7/A', S, 'm/n'), ('t/7/A/x/y/f', F, 'f'),
 ('t/8', D, ''), ('t/8/a/x', F, 'x'), ('t/8/b', S, 'a'), ('t/8/b', H, 't/8/b/x')]
PY
  local opt
  for opt in "" --overwrite; do
    extract_twice_compare "$W/v.tar" "$opt"
    grep -q '^t/1/a/x l ' "$W/img.list"
    grep -q '^t/2/a/x f ' "$W/img.list"   # (the second run's)
    grep -q '^t/3/a/x f ' "$W/img.list"
    head -13 "$W/img.err" > "$W/first.err"
    diff - "$W/first.err" <<'EOF'
t/1/a/x: Cannot hard link to ‘t/1/c/z’: No such file or directory
t/2/y/x: Cannot open: No such file or directory
t/4/A/x: Cannot mkdir: No such file or directory
t/4/A/x/q: Cannot mkdir: No such file or directory
t/5/A/x: Cannot mkdir: No such file or directory
t/5/A/x/f: Cannot open: No such file or directory
t/5/A/g: Cannot open: No such file or directory
t/6/A/x: Cannot mkdir: No such file or directory
t/6/A/x/l: Cannot hard link to ‘t/6/f’: No such file or directory
t/7/A/x: Cannot mkdir: No such file or directory
t/7/A/x/y/f: Cannot open: No such file or directory
t/8/b: Cannot hard link to ‘t/8/b/x’: No such file or directory
Exiting with failure status due to previous errors
EOF
  done
}

@test "--ext4-image: a directory members come back into after tar has set its attributes gets the time of the change, as from tar -x; one listed again gets the archive's" {
  require_root_loop
  python3 - "$W/r.tar" <<'PY'
import io, sys, tarfile
D, F = tarfile.DIRTYPE, tarfile.REGTYPE
# tar sets a directory's attributes when a member not under it comes
# (t/b at t/c, t/f at t/g); a member made in it after that changes its
# time (t/b/g, t/f/new/h).  t/d is listed again: set again at the end.
# t/h's own subdirectory comes in between: t/h is not set before t/h/k.
E = [('t', D), ('t/b', D), ('t/b/f', F), ('t/c', D), ('t/b/g', F),
     ('t/d', D), ('t/e', D), ('t/d/x', F), ('t/d', D),
     ('t/f', D), ('t/g', D), ('t/f/new/h', F),
     ('t/h', D), ('t/h/i', D), ('t/h/i/j', F), ('t/h/k', F)]
E += [('t/pad%02d' % i, F) for i in range(40)]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
        ti.mode = 0o755 if typ == D else 0o644
        if typ == F:
            d = ('data of ' + name).encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --overwrite; do
    # shellcheck disable=SC2086
    limits_compare "$W/r.tar" "" $opt
    grep -q '^t/b 0o40755 2 0 0 NOW \[\]$' "$W/img.manifest"
    grep -q '^t/f 0o40755 3 0 0 NOW \[\]$' "$W/img.manifest"
    grep -q '^t/c 0o40755 2 0 0 1600000000000000000 \[\]$' "$W/img.manifest"
    grep -q '^t/d 0o40755 2 0 0 1600000000000000000 \[\]$' "$W/img.manifest"
    grep -q '^t/h 0o40755 3 0 0 1600000000000000000 \[\]$' "$W/img.manifest"
  done
}

@test "--ext4-image: what tar makes in a directory after it has set the directory's attributes takes its set-group-ID bit and group (directories on the way, files it does not chown), also under --no-overwrite-dir and for a directory listed twice: as tar -x on the mounted image" {
  require_root_loop
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
D, F = tarfile.DIRTYPE, tarfile.REGTYPE
# s is set (2775, group 100) at t: s/new, made on the way after that, takes
# its bit and group, and so does s/g without tar's chown.  u is not set yet
# when u/a is made (no bit), but is when u/b is.  w, set at x and listed
# again, is as the first listing left it when w/c is made, unless
# --no-overwrite-dir chmod'ed it to a safe mode meanwhile.  y is listed twice
# in a row: tar sets the first listing's mode before the second.
E = [('s/x', F, 0o644, 0), ('s', D, 0o2775, 100), ('t', D, 0o755, 0),
     ('s/new/f', F, 0o644, 0), ('s/g', F, 0o644, 0),
     ('u', D, 0o2755, 200), ('u/a/f', F, 0o644, 0), ('v', D, 0o755, 0),
     ('u/b/f', F, 0o644, 0),
     ('w', D, 0o2755, 300), ('x', D, 0o755, 0), ('w', D, 0o755, 0), ('w/c/f', F, 0o644, 0),
     ('y/', D, 0o311, 0), ('y/', D, 0o755, 0), ('z', F, 0o644, 0)]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ, mode, gid in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
        ti.mode = mode; ti.gid = gid
        if typ == F:
            d = ('data of ' + name).encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
  local opt
  for opt in "" --no-same-owner -m --delay-directory-restore --no-same-permissions \
             --no-overwrite-dir; do
    # shellcheck disable=SC2086
    limits_compare "$W/a.tar" "" $opt
    case $opt in
      --delay-directory-restore|--no-same-permissions|--no-overwrite-dir)
        # (all set at the end; the chmod under the rwx mask sets no bit;
        # s, found, keeps its mode)
        grep -q '^s/new 0o40755 2 0 0 NOW \[\]$' "$W/img.manifest" ;;
      --no-same-owner)
        grep -q '^s/new 0o42755 2 0 0 NOW \[\]$' "$W/img.manifest"
        grep -q '^s/g 0o100644 1 0 0 ' "$W/img.manifest" ;;
      *)
        grep -q '^s/new 0o42755 2 0 100 NOW \[\]$' "$W/img.manifest"
        grep -q '^u/a 0o40755 2 0 0 NOW \[\]$' "$W/img.manifest"
        grep -q '^u/b 0o42755 2 0 200 NOW \[\]$' "$W/img.manifest" ;;
    esac
  done
}

@test "--ext4-image: directories above a symbolic link tar makes last (absolute or '..' target) get their attributes in tar's last pass: times and set-group-ID bits as tar -x on the mounted image, also with --delay-directory-restore" {
  require_root_loop
  local t=$W/s/t opt
  mkdir -p "$t/q" "$t/n" "$t/a" "$t/b" "$t/c" "$t/d" "$t/e"
  echo q > "$t/q/f"; ln -s ../x "$t/n/l"; ln -s /abs "$t/a/l"; echo f > "$t/a/f"
  ln -s ../q "$t/d/l"
  chmod 700 "$t/q" "$t/n"
  touch -h -d @2000000 "$t"/*/l
  touch -d @2000000 "$t"/* "$t"
  # t/a is left (t/b) and come back into (t/a/f): tar has not set it then;
  # t/d is set (at t/e) before its link comes, which tar makes at the end
  (cd "$W/s" && "$STOCK_TAR" -cf "$W/a.tar" --no-recursion t t/q t/q/f t/n t/n/l t/a t/a/l \
     t/b t/a/f t/c t/d t/e t/d/l)
  # t/n/l again: tar finds its placeholder there and skips it
  mkdir -p "$W/s2/t/n"
  ln -s /other "$W/s2/t/n/l"
  (cd "$W/s2" && "$STOCK_TAR" -rf "$W/a.tar" t/n/l)
  for opt in "" --delay-directory-restore --no-same-permissions; do
    rm -f "$W/img"
    truncate -s 64M "$W/img"
    mkfs.ext4 -q -F "$W/img"
    mount_image_rw "$W/img" "$W/m"
    (cd "$W/m" && mkdir t && chmod 2755 t)
    umount_image "$W/m"
    # shellcheck disable=SC2086
    image_compare "$W/a.tar" $opt
    case $opt in
      "")
        # t/q is set when t/n comes (its mode what mkdir gave: no chmod);
        # t/n in the last pass, where tar's chmod clears the bit
        grep -q '^t/q 0o42700 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/n 0o40700 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/a 0o40755 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/d 0o40755 2 0 0 NOW ' "$W/img.manifest"
        grep -q '^t/n/l .* \.\./x \[\]$' "$W/img.manifest" ;;
      --delay*)
        grep -q '^t/q 0o40700 2 0 0 2000000000000000 ' "$W/img.manifest"
        grep -q '^t/a 0o40755 2 0 0 2000000000000000 ' "$W/img.manifest" ;;
      *)
        # its chmod keeps the bit the directory took from t
        grep -q '^t/a 0o42755 2 0 0 2000000000000000 ' "$W/img.manifest" ;;
    esac
  done
}

@test "--ext4-image: no member goes through a symbolic link to an absolute or '..' target made by the same run (tar makes those last), as tar; other links are followed" {
  require_root_loop
  entries_archive "$W/u.tar" <<'PY'
[('t', D, ''), ('t/in', D, ''), ('t/abs', S, '/t/in'), ('t/abs/x', F, 'abs'),
 ('t/up', S, '../t/in'), ('t/up/y', F, 'up'), ('t/ok', S, 'in'), ('t/ok/z', F, 'ok'),
 ('t/hl', H, 't/abs'), ('t/a..b', D, ''), ('t/dd', S, 'a..b'), ('t/dd/v', F, 'dd')]
PY
  truncate -s 64M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  run "$STOCK_TAR" -C "$W/m" -xf "$W/u.tar"
  echo "$output" | sed 's/^[^:]*: //' > "$W/ref.err"
  image_list "$W/m" > "$W/ref.list"
  umount_image "$W/m"
  run "$BFOTAR" -xf "$W/u.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ]
  echo "$output" | sed 's/^[^:]*: //' > "$W/img.err"
  e2fsck -fn "$W/img"
  mount_image "$W/img" "$W/m"
  image_list "$W/m" > "$W/img.list"
  umount_image "$W/m"
  diff "$W/ref.err" "$W/img.err"
  diff "$W/ref.list" "$W/img.list"
  grep -qx 't/abs/x: Cannot open: Not a directory' "$W/img.err"
  grep -qx 't/up/y: Cannot open: Not a directory' "$W/img.err"
  grep -q '^t/in/z f ' "$W/img.list"
  grep -q '^t/a\.\.b/v f ' "$W/img.list"
  ! grep -q '^t/in/[xy] ' "$W/img.list"
  grep -q '^t/hl l 777 2 5 /t/in ' "$W/img.list"
}

@test "--ext4-image: directories over a block get the kernel's hashed index (one and two levels, 1/2/4 KiB blocks, with and without metadata_csum); e2fsck clean before and after the kernel looks up, adds, removes and renames names in them; one of the image that outgrows its block too; without room one stays unindexed" {
  require_root_loop
  python3 - "$W/d.tar" <<'PY'
import io, random, sys, tarfile
random.seed(5)
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for d, n in [('one', 20), ('two', 120), ('mid', 3000), ('big', 12000), ('long', 3000)]:
        ti = tarfile.TarInfo('t/' + d); ti.type = tarfile.DIRTYPE; ti.mode = 0o755; t.addfile(ti)
        for i in range(n):
            name = ('x' * random.randint(1, 200) + '%d' % i) if d == 'long' else 'f%d' % i
            ti = tarfile.TarInfo('t/%s/%s' % (d, name)); ti.size = 3; ti.mode = 0o644
            t.addfile(ti, io.BytesIO(b'abc'))
PY
  local mk
  for mk in "-b 4096" "-b 1024" "-b 2048 -O ^metadata_csum" "-b 1024 -O ^64bit,^metadata_csum,^filetype"; do
    rm -f "$W/img"
    truncate -s 1G "$W/img"
    # shellcheck disable=SC2086
    mkfs.ext4 -q -F $mk "$W/img"
    "$BFOTAR" -xf "$W/d.tar" --ext4-image="$W/img"
    e2fsck -fn "$W/img"
    debugfs -R 'stat t/one' "$W/img" 2>/dev/null | grep -q 'Flags: 0x80000$'
    debugfs -R 'stat t/mid' "$W/img" 2>/dev/null | grep -q 'Flags: 0x81000$'
    debugfs -R 'stat t/big' "$W/img" 2>/dev/null | grep -q 'Flags: 0x81000$'
    debugfs -R 'htree t/mid' "$W/img" 2>/dev/null | grep -q 'Indirect levels: 0'
    if [ "$mk" = "-b 1024" ]; then
      debugfs -R 'htree t/big' "$W/img" 2>/dev/null | grep -q 'Indirect levels: 1'
    fi
    mount_image_rw "$W/img" "$W/m"
    python3 - "$W/m/t" <<'PY'
import os, random, sys
r = sys.argv[1]; random.seed(2)
want = {'one': 20, 'two': 120, 'mid': 3000, 'big': 12000, 'long': 3000}
for d, n in want.items():
    names = os.listdir(os.path.join(r, d))
    assert len(names) == n, (d, len(names))
    for nm in random.sample(names, min(500, n)):
        assert open(os.path.join(r, d, nm)).read() == 'abc', nm
    for i in range(300):
        open(os.path.join(r, d, 'new%d' % i), 'w').write('n')
    for nm in random.sample(names, min(150, n)):
        os.unlink(os.path.join(r, d, nm))
    for i in range(0, 300, 3):
        os.rename(os.path.join(r, d, 'new%d' % i), os.path.join(r, d, 'ren%d' % i))
    assert len(os.listdir(os.path.join(r, d))) == n + 300 - min(150, n)
PY
    umount_image "$W/m"
    e2fsck -fn "$W/img"
  done
  # directories already in the image: one of a block (made by the kernel)
  # gets the index once names outgrow it, as the kernel would give it; one
  # of more blocks left unindexed (by mke2fs -d) stays so, as with the kernel
  mkdir -p "$W/src/lin"
  for i in $(seq 2000); do : > "$W/src/lin/l$i"; done
  rm -f "$W/img"
  truncate -s 512M "$W/img"
  mkfs.ext4 -q -F -d "$W/src" "$W/img"
  debugfs -R 'stat lin' "$W/img" 2>/dev/null | grep -q 'Flags: 0x80000$'
  mount_image_rw "$W/img" "$W/m"
  mkdir "$W/m/small"
  touch "$W/m/small/s1" "$W/m/small/s2"
  umount_image "$W/m"
  python3 - "$W/a.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for d in ('small', 'lin'):
        for i in range(3000):
            ti = tarfile.TarInfo('%s/n%05d' % (d, i)); ti.size = 1; t.addfile(ti, io.BytesIO(b'z'))
PY
  "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img"
  e2fsck -fn "$W/img"
  debugfs -R 'stat small' "$W/img" 2>/dev/null | grep -q 'Flags: 0x81000$'
  debugfs -R 'stat lin' "$W/img" 2>/dev/null | grep -q 'Flags: 0x80000$'
  mount_image "$W/img" "$W/m"
  [ "$(ls "$W/m/small" | wc -l)" -eq 3002 ] && [ "$(ls "$W/m/lin" | wc -l)" -eq 5000 ]
  umount_image "$W/m"
  # a directory for whose new blocks there is no room keeps its own
  python3 - "$W/f.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    ti = tarfile.TarInfo('big.bin'); ti.size = (33505 - 100) * 1024; t.addfile(ti, io.BytesIO(b'\1' * ti.size))
    for i in range(3000):
        ti = tarfile.TarInfo('d/longername-%05d' % i); t.addfile(ti)
PY
  rm -f "$W/img"
  truncate -s 40M "$W/img"
  mkfs.ext4 -q -F -b 1024 "$W/img"
  dumpe2fs -h "$W/img" 2>/dev/null | grep -q '^Free blocks: *33505$'
  "$BFOTAR" -xf "$W/f.tar" --ext4-image="$W/img"
  e2fsck -fn "$W/img"
  debugfs -R 'stat d' "$W/img" 2>/dev/null | grep -q 'Flags: 0x80000$'
  mount_image "$W/img" "$W/m"
  [ "$(ls "$W/m/d" | wc -l)" -eq 3000 ]
  umount_image "$W/m"
}

@test "--ext4-image: 66000 subdirectories of one directory: its link count as the kernel keeps it (1 past 65000; without dir_nlink tar's 'Too many links'), e2fsck clean, in seconds" {
  require_root_loop
  python3 - "$W/n.tar" <<'PY'
import sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for i in range(-1, 66000):
        d = tarfile.TarInfo('top' if i < 0 else 'top/d%05d' % i)
        d.type = tarfile.DIRTYPE; d.mode = 0o755; d.mtime = 1600000000
        t.addfile(d)
PY
  truncate -s 1G "$W/img"
  mkfs.ext4 -q -F -N 100000 "$W/img"
  local t0=$SECONDS
  run "$BFOTAR" -xf "$W/n.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  # 140 s when each name went through ext2fs_mkdir's scans of the parent
  [ $((SECONDS - t0)) -lt 30 ]
  e2fsck -fn "$W/img"
  debugfs -R 'stat /top' "$W/img" 2>/dev/null | grep -q 'Links: 1 '
  mount_image "$W/img" "$W/m"
  [ "$(ls "$W/m/top" | wc -l)" -eq 66000 ]
  umount_image "$W/m"
  # without dir_nlink the kernel makes no more than 64998: tar's messages
  rm -f "$W/img" "$W/ref"
  truncate -s 1G "$W/img" "$W/ref"
  mkfs.ext4 -q -F -N 100000 -O ^dir_nlink "$W/img"
  mkfs.ext4 -q -F -N 100000 -O ^dir_nlink "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  run "$STOCK_TAR" -C "$W/m" -xf "$W/n.tar"
  local ref_status=$status
  echo "$output" | sed 's/^[^:]*: //' > "$W/ref.err"
  umount_image "$W/m"
  run "$BFOTAR" -xf "$W/n.tar" --ext4-image="$W/img"
  [ "$status" -eq "$ref_status" ]
  echo "$output" | sed 's/^[^:]*: //' > "$W/img.err"
  diff "$W/ref.err" "$W/img.err"
  grep -qx 'top/d64998: Cannot mkdir: Too many links' "$W/img.err"
  e2fsck -fn "$W/img"
}

@test "--ext4-image into a directory the image already has: 30000 files in seconds (its names indexed once), then all replaced; e2fsck clean" {
  require_root_loop
  python3 - "$W/top.tar" "$W/m.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    d = tarfile.TarInfo('top'); d.type = tarfile.DIRTYPE; d.mode = 0o755; t.addfile(d)
with tarfile.open(sys.argv[2], 'w', format=tarfile.GNU_FORMAT) as t:
    for i in range(30000):
        f = tarfile.TarInfo('top/f%05d' % i); f.size = 10; f.mode = 0o644; f.mtime = 1600000000
        t.addfile(f, io.BytesIO(b'%010d' % i))
PY
  truncate -s 1G "$W/img"
  mkfs.ext4 -q -F -N 100000 "$W/img"
  "$BFOTAR" -xf "$W/top.tar" --ext4-image="$W/img"
  local t0=$SECONDS
  run "$BFOTAR" -xf "$W/m.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  # 43 s when each name was looked up and linked by walking the directory
  [ $((SECONDS - t0)) -lt 15 ]
  e2fsck -fn "$W/img"
  run "$BFOTAR" -xf "$W/m.tar" --ext4-image="$W/img"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  e2fsck -fn "$W/img"
  mount_image "$W/img" "$W/m"
  [ "$(ls "$W/m/top" | wc -l)" -eq 30000 ]
  [ "$(cat "$W/m/top/f12345")" = 0000012345 ]
  umount_image "$W/m"
}

@test "--ext4-image=IMG:/DIR where DIR is a symbolic link (relative or absolute) goes where it leads, as tar -C on the mounted image; a dangling one or a file is refused" {
  require_root_loop
  mkdir -p "$W/s/t"
  echo data > "$W/s/t/f"
  tar -C "$W/s" -cf "$W/a.tar" t
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F "$W/img"
  mount_image_rw "$W/img" "$W/m"
  mkdir "$W/m/real"
  ln -s real "$W/m/rel"
  ln -s /real "$W/m/abs"
  ln -s nowhere "$W/m/dang"
  touch "$W/m/file"
  umount_image "$W/m"
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img:/rel"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img:/abs/t"
  [ "$status" -eq 0 ] && [ -z "$output" ]
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img:/dang"
  [ "$status" -eq 2 ]
  [[ $output == *"Cannot extract into the ext4 image: No such file or directory"* ]]
  run "$BFOTAR" -xf "$W/a.tar" --ext4-image="$W/img:/file"
  [ "$status" -eq 2 ]
  [[ $output == *"Not a directory"* ]]
  e2fsck -fn "$W/img"
  mount_image "$W/img" "$W/m"
  [ "$(cat "$W/m/real/t/f")" = data ]
  [ "$(cat "$W/m/real/t/t/f")" = data ]
  [ -L "$W/m/rel" ] && [ -L "$W/m/abs" ]
  umount_image "$W/m"
}

@test "--ext4-image: 30 random archives naming paths again in other types (fixed seeds), twice over, default and --overwrite: trees and messages as tar -x on the mounted image" {
  require_root_loop
  local seed opt
  for seed in $(seq 1 30); do
    python3 - "$W/r.tar" "$seed" <<'PY'
import io, random, sys, tarfile
random.seed(int(sys.argv[2]))
D, F, S, H, P = tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.FIFOTYPE
names = ['t/a', 't/b', 't/c', 't/a/x', 't/a/y', 't/b/x', 't/c/z', 't/a/x/q', 't/d']
E = [('t', D, '')]
for i in range(random.randint(5, 30)):
    n = random.choice(names)
    k = random.choice([D, F, F, S, H, P])
    extra = ''
    if k == S:
        extra = random.choice(['a', 'b', 'x', 'nowhere', 'a/x', 'c/z'])
    if k == H:
        extra = random.choice(names)
    if k == F:
        extra = 'data %d %s' % (i, n)
    E.append((n, k, extra))
E += [('t/pad%02d' % i, F, 'p' * 2000) for i in range(35)]
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for name, typ, extra in E:
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mtime = 1600000000
        ti.mode = 0o755 if typ == D else 0o644
        if typ in (S, H):
            ti.linkname = extra
        if typ == F:
            d = extra.encode(); ti.size = len(d); t.addfile(ti, io.BytesIO(d))
        else:
            t.addfile(ti)
PY
    echo "seed $seed"
    for opt in "" --overwrite; do
      extract_twice_compare "$W/r.tar" "$opt"
    done
  done
}

@test "--ext4-image: directories an archive does not list get tar's 0755 (its umask for new directories), not 0777" {
  require_root_loop
  python3 - "$W/i.tar" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.GNU_FORMAT) as t:
    for i in range(40):
        ti = tarfile.TarInfo('a/b%d/f%02d' % (i % 3, i)); ti.size = 3; ti.mode = 0o644
        t.addfile(ti, io.BytesIO(b'abc'))
PY
  truncate -s 32M "$W/img" "$W/ref"
  mkfs.ext4 -q -F "$W/img"
  mkfs.ext4 -q -F "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  (umask 022 && cd "$W/m" && "$STOCK_TAR" -xf "$W/i.tar")
  stat -c '%n %a' "$W/m/a" "$W/m/a/b0" | sed "s|$W/m/||" > "$W/ref.modes"
  umount_image "$W/m"
  (umask 022 && "$BFOTAR" -xf "$W/i.tar" --ext4-image="$W/img")
  e2fsck -fn "$W/img"
  mount_image "$W/img" "$W/m"
  stat -c '%n %a' "$W/m/a" "$W/m/a/b0" | sed "s|$W/m/||" > "$W/img.modes"
  umount_image "$W/m"
  diff "$W/ref.modes" "$W/img.modes"
  grep -qx 'a 755' "$W/img.modes"
}

# limits_archive FILE FORMAT: members of every kind at ext4's limits: modes
# with set-ID and sticky bits, owner numbers past 16 bits, named owners known
# and unknown, device numbers past the old 8-bit form, symbolic links around
# 60 bytes (kept in the inode) and the block size, 255-byte names, deep paths,
# times before 1970 and with nanoseconds (pax), attributes in the inode, in a
# block and on directories and links (pax).
limits_archive() {
  python3 - "$1" "$2" <<'PY'
import io, random, sys, tarfile
fmt = {'gnu': tarfile.GNU_FORMAT, 'pax': tarfile.PAX_FORMAT, 'ustar': tarfile.USTAR_FORMAT}[sys.argv[2]]
pax = fmt == tarfile.PAX_FORMAT
random.seed(7)
D, F, S, H, P, C, B = (tarfile.DIRTYPE, tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.LNKTYPE,
                       tarfile.FIFOTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE)
with tarfile.open(sys.argv[1], 'w', format=fmt, encoding='utf-8') as t:
    def add(name, typ, mode=0o644, uid=0, gid=0, uname='', gname='', data=None, link='',
            mtime=1600000000, dev=(0, 0), px=None):
        ti = tarfile.TarInfo(name); ti.type = typ; ti.mode = mode; ti.uid = uid; ti.gid = gid
        ti.uname = uname; ti.gname = gname; ti.mtime = mtime; ti.linkname = link
        ti.devmajor, ti.devminor = dev
        if px and pax:
            ti.pax_headers = px
        try:
            if data is None:
                t.addfile(ti)
            else:
                ti.size = len(data); t.addfile(ti, io.BytesIO(data))
        except ValueError:
            pass                # not in this format (ustar: long names, old times)
    add('t', D, 0o755)
    for m in (0o700, 0o1777, 0o2755, 0o555, 0o000):
        add('t/d%o' % m, D, m); add('t/d%o/f' % m, F, data=b'in %o\n' % m)
    for sz in (0, 1, 59, 60, 61, 4095, 4096, 4097, 65537, 1 << 20):
        head = bytes(random.getrandbits(8) for _ in range(min(sz, 4097)))
        add('t/s%d' % sz, F, data=head + b'z' * max(0, sz - 4097))
    for m in (0o4755, 0o2755, 0o6711, 0o600, 0o000, 0o1644):
        add('t/m%o' % m, F, m, data=b'mode\n')
    for u in (0, 1000, 65535, 65536, 100000, 2097151 if fmt == tarfile.USTAR_FORMAT else 4294967294):
        add('t/u%d' % u, F, 0o640, uid=u, gid=u, data=b'u\n')
    add('t/named', F, uid=4242, gid=4242, uname='daemon', gname='daemon', data=b'named\n')
    add('t/unknown', F, uid=4243, gid=4244, uname='nosuchuserx', gname='nosuchgroupx', data=b'unk\n')
    for n in (1, 59, 60, 61, 100, 255, 1000, 1022, 1023, 4095):
        add('t/l%d' % n, S, 0o777, link='x' * (n - 1) + 'y')
    add('t/h1', H, link='t/s4097'); add('t/h2', H, link='t/l60')
    add('t/fifo', P, 0o640); add('t/h3', H, link='t/fifo')
    for j, dv in enumerate([(1, 3), (259, 70000), (4095, 1048575), (0, 0), (8, 1)]):
        add('t/c%d' % j, C, 0o620, dev=dv); add('t/b%d' % j, B, 0o660, dev=dv)
    add('t/' + 'n' * 255, F, data=b'long\n'); add('t/\u00e9t\u00e9-\u65e5\u672c', F, data=b'uni\n')
    add('t/' + '/'.join('p%02d' % i + 'q' * 90 for i in range(30)), F, data=b'deep\n')
    add('t/pre1970', F, mtime=-100000, data=b'old\n')
    add('t/ns', F, data=b'ns\n', px={'mtime': '1600000000.123456789', 'atime': '1500000000.987654321'})
    add('t/negns', F, data=b'negns\n', px={'mtime': '-1.5'})
    add('t/xa', F, data=b'xa\n', px={'SCHILY.xattr.user.a': 'v', 'SCHILY.xattr.user.empty': '',
                                    'SCHILY.xattr.user.big': 'B' * 900, 'SCHILY.xattr.trusted.t': 'tt'})
    add('t/xd', D, 0o755, px={'SCHILY.xattr.user.dir': 'd'}); add('t/xd/f', F, data=b'f\n')
    add('t/xl', S, 0o777, link='s0', px={'SCHILY.xattr.trusted.l': 'lnk'})
    # through symbolic links whose targets hold a name too long for ext4
    add('t/lz', S, 0o777, link='z' * 300 + '/y'); add('t/lz/f', F, data=b'f\n')
    add('t/lw', S, 0o777, link='w/' + 'q' * 256); add('t/lw/g', F, data=b'g\n')
PY
}

# full_manifest DIR: every entry below DIR (lost+found aside) with its mode,
# links, owner, modification time (ns), access time (ns) but for directories,
# size and content hash, link target or device numbers, and every extended
# attribute; times within the last hour (made now) as NOW.
full_manifest() {
  python3 - "$1" <<'PY'
import hashlib, os, stat, sys, time
root = sys.argv[1]; now = time.time_ns()
def T(t):
    return 'NOW' if abs(t - now) < 3600 * 10**9 else t
out = []
for dp, dns, fns in os.walk(root):
    for p in ([dp] if dp == root else []) + [os.path.join(dp, n) for n in dns + fns]:
        r = os.path.relpath(p, root)
        if r.split('/')[0] == 'lost+found':
            continue
        st = os.lstat(p)
        l = [r, oct(st.st_mode), st.st_nlink, st.st_uid, st.st_gid, T(st.st_mtime_ns)]
        if not stat.S_ISDIR(st.st_mode):
            l.append(T(st.st_atime_ns))
        if stat.S_ISREG(st.st_mode):
            l += [st.st_size, hashlib.sha256(open(p, 'rb').read()).hexdigest()]
        elif stat.S_ISLNK(st.st_mode):
            l.append(os.readlink(p))
        elif stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode):
            l.append((os.major(st.st_rdev), os.minor(st.st_rdev)))
        l.append(sorted((x, os.getxattr(p, x, follow_symlinks=False).hex())
                        for x in os.listxattr(p, follow_symlinks=False)))
        out.append(' '.join(map(str, l)))
print('\n'.join(sorted(out)))
PY
}

# manifests_diff REF IMG: full_manifest of the two images, mounted read-only in
# turn, into $W/ref.manifest and $W/img.manifest; their differences.
manifests_diff() {
  mount_image "$1" "$W/m"
  full_manifest "$W/m" > "$W/ref.manifest"
  umount_image "$W/m"
  mount_image "$2" "$W/m"
  full_manifest "$W/m" > "$W/img.manifest"
  umount_image "$W/m"
  diff "$W/ref.manifest" "$W/img.manifest"
}

# limits_compare ARCHIVE MKFS-OPTIONS [OPTION]...: ARCHIVE extracted with
# OPTIONs by stock tar into a fresh image mounted and by bfotar --ext4-image
# into another: e2fsck clean, the same full_manifest, the same messages.
limits_compare() {
  local a=$1 mk=$2
  shift 2
  rm -f "$W/img" "$W/ref"
  truncate -s 256M "$W/img"
  # shellcheck disable=SC2086
  mkfs.ext4 -q -F $mk "$W/img"
  echo "mkfs.ext4 $mk"
  image_compare "$a" "$@"
}

# nobody_compare UMASK [OPTION]...: $W/a.tar extracted with OPTIONs by user
# nobody (65534:65534, no other groups) under UMASK, by stock tar into a copy
# of $W/img mounted and by bfotar --ext4-image into $W/img (given to nobody):
# e2fsck clean, the same full_manifest, the same messages and status.
nobody_compare() {
  local um=$1 rc
  shift
  rm -f "$W/ref"
  cp --sparse=always "$W/img" "$W/ref"
  chown 65534 "$W/img"
  mount_image_rw "$W/ref" "$W/m"
  rc=0
  (cd "$W/m" && setpriv --reuid=65534 --regid=65534 --clear-groups \
     sh -c "umask $um; exec \"\$0\" $* -xf \"\$1\"" "$STOCK_TAR" "$W/a.tar") \
    2> "$W/ref.err" || rc=$?
  echo "status $rc" >> "$W/ref.err"
  umount_image "$W/m"
  rc=0
  setpriv --reuid=65534 --regid=65534 --clear-groups \
    sh -c "umask $um; exec \"\$0\" $* -xf \"\$1\" --ext4-image=\"\$2\"" \
    "$BFOTAR" "$W/a.tar" "$W/img" 2> "$W/img.err" || rc=$?
  echo "status $rc" >> "$W/img.err"
  e2fsck -fn "$W/img" > /dev/null
  echo "tar $* (umask $um, as nobody)"
  manifests_diff "$W/ref" "$W/img"
  sed -i 's/^[^:]*: //' "$W/ref.err" "$W/img.err"
  diff "$W/ref.err" "$W/img.err"
}

# image_compare ARCHIVE [OPTION]...: the same from $W/img as it is (and a
# copy of it).
image_compare() {
  local a=$1 st
  shift
  rm -f "$W/ref"
  cp --sparse=always "$W/img" "$W/ref"
  mount_image_rw "$W/ref" "$W/m"
  st=0
  (cd "$W/m" && "$STOCK_TAR" "$@" -xf "$a") 2> "$W/ref.err" || st=$?
  echo "status $st" >> "$W/ref.err"
  umount_image "$W/m"
  st=0
  "$BFOTAR" "$@" -xf "$a" --ext4-image="$W/img" 2> "$W/img.err" || st=$?
  echo "status $st" >> "$W/img.err"
  e2fsck -fn "$W/img" > "$W/fsck.out" 2>&1 || { cat "$W/fsck.out"; return 1; }
  echo "tar $*"
  manifests_diff "$W/ref" "$W/img"
  sed -i 's/^[^:]*: //' "$W/ref.err" "$W/img.err"
  diff "$W/ref.err" "$W/img.err"
}

@test "--ext4-image: members at ext4's limits (modes, ids, devices, symlinks of 60 bytes and of the block size, long names, times, attributes), pax/gnu/ustar, 1 and 4 KiB blocks, with tar's options: as tar -x on the mounted image" {
  require_root_loop
  local fmt bs opt
  for fmt in pax gnu ustar; do
    limits_archive "$W/l.tar" $fmt
    for bs in 1024 4096; do
      limits_compare "$W/l.tar" "-b $bs" --xattrs --xattrs-include='*'
      # a target as long as the block size or longer: the kernel's "File name too long"
      if [ $bs = 1024 ] && [ $fmt != ustar ]; then
        grep -q "^t/l4095: Cannot create symlink to .*: File name too long" "$W/img.err"
      fi
      ! grep -q "^t/l1023:" "$W/img.err"
      if [ $fmt != ustar ]; then
        grep -q "^t/lz/f: Cannot open: File name too long" "$W/img.err"
        grep -q "^t/lw/g: Cannot open: No such file or directory" "$W/img.err"
      fi
    done
  done
  limits_archive "$W/l.tar" pax
  # --one-top-level: tar 1.34 does not apply it to hard link targets, so the
  # links fail before the time stamp warnings of later members: messages in
  # archive order though the links wait for their batch
  for opt in "" --numeric-owner --no-same-owner --no-same-permissions -m --strip-components=1 \
             --transform=s,^t/,T/x/, --one-top-level; do
    limits_compare "$W/l.tar" "-b 4096" $opt
  done
  grep -q "^l/t/h1: Cannot hard link to .*: No such file or directory" "$W/img.err"
  [ "$(grep -n 'l/t/pre1970: implausibly old' "$W/img.err" | cut -d: -f1)" -gt \
    "$(grep -n 'l/t/h3: Cannot hard link' "$W/img.err" | cut -d: -f1)" ]
}

# xattr_archive FILE: files of several owners with attribute values from 100
# bytes to 60 KB (with ea_inode the large ones go into attribute inodes).
xattr_archive() {
  python3 - "$1" <<'PY'
import io, sys, tarfile
with tarfile.open(sys.argv[1], 'w', format=tarfile.PAX_FORMAT) as t:
    d = tarfile.TarInfo('t'); d.type = tarfile.DIRTYPE; d.mode = 0o755; t.addfile(d)
    for i, sz in enumerate([100, 3000, 5000, 10000, 60000]):
        ti = tarfile.TarInfo('t/x%d' % sz); ti.uid = 1000 + i; ti.gid = 2000 + i
        ti.pax_headers = {'SCHILY.xattr.user.v': 'V' * sz, 'SCHILY.xattr.user.w': 'W' * (sz // 2)}
        data = b'data %d\n' % sz * 700; ti.size = len(data); t.addfile(ti, io.BytesIO(data))
PY
}

# quota_limit IMG TYPE ID [LIMIT]: the block hard limit of ID in IMG's quota
# file of TYPE (user, group), read or (with LIMIT) written in place.
quota_limit() {
  python3 - "$@" <<'PY'
import re, struct, subprocess, sys
img, typ, qid = sys.argv[1], sys.argv[2], int(sys.argv[3])
dbg = lambda c: subprocess.run(['debugfs', '-R', c, img], capture_output=True).stdout
ino = {'user': 3, 'group': 4}[typ]
bs = int(re.search(rb'Block size:\s+(\d+)', dbg('stats')).group(1))
q = dbg('cat <%d>' % ino)
g32 = lambda o: struct.unpack_from('<I', q, o)[0]
blk = 1
for depth in range(4):
    blk = g32(blk * 1024 + 4 * ((qid >> (8 * (3 - depth))) & 255))
    assert blk, 'no entry for %d' % qid
off = next(blk * 1024 + 16 + i * 72 for i in range(14) if g32(blk * 1024 + 16 + i * 72) == qid
           and q[blk * 1024 + 16 + i * 72:][:72] != bytes(72)) + 32
if len(sys.argv) > 4:
    fsblk = int(dbg('bmap <%d> %d' % (ino, off // bs)))
    with open(img, 'r+b') as f:
        f.seek(fsblk * bs + off % bs); f.write(struct.pack('<Q', int(sys.argv[4])))
print(struct.unpack_from('<Q', q, off)[0] if len(sys.argv) == 4 else sys.argv[4])
PY
}

@test "--ext4-image and bfo mkimage with attribute inodes (ea_inode) and quota (user, group, project): inodes charged and usage kept as the kernel keeps them, e2fsck clean, limits kept; files as stock tar's" {
  require_root_loop
  xattr_archive "$W/x.tar"
  limits_archive "$W/l.tar" pax
  # attribute inodes: the file's i_blocks include its values (e2fsck checks)
  limits_compare "$W/x.tar" "-O ea_inode" --xattrs
  grep -q "^t/x60000 .*'user.v', '5656" "$W/img.manifest"
  # files replaced, then rewritten under --overwrite (made anew: they have
  # attributes): their old attribute inodes are freed with them
  "$BFOTAR" --xattrs -xf "$W/x.tar" --ext4-image="$W/img"
  "$BFOTAR" --xattrs --overwrite -xf "$W/x.tar" --ext4-image="$W/img"
  e2fsck -fn "$W/img"
  manifests_diff "$W/ref" "$W/img"
  limits_compare "$W/x.tar" "-O ea_inode -I 128" --xattrs
  limits_compare "$W/l.tar" "-O ea_inode" --xattrs
  # quota: usage recomputed at close, limits kept.  This kernel may not mount
  # images with quota read-write, so the reference is stock tar on one without.
  local mk ref
  for mk in "-O quota" "-O quota,project" "-O quota,project,ea_inode"; do
    rm -f "$W/img" "$W/ref"
    truncate -s 256M "$W/img" "$W/ref"
    # shellcheck disable=SC2086
    mkfs.ext4 -q -F $mk "$W/img"
    ref=${mk/quota,project,/}; ref=${ref/quota,project/^has_journal}; ref=${ref/quota/^has_journal}
    # shellcheck disable=SC2086
    mkfs.ext4 -q -F $ref "$W/ref"
    quota_limit "$W/img" user 0 5000000
    quota_limit "$W/img" group 0 7000000
    e2fsck -fn "$W/img"
    for opt in "" --overwrite; do
      run "$BFOTAR" --xattrs $opt -xf "$W/x.tar" --ext4-image="$W/img"
      run "$BFOTAR" --xattrs $opt -xf "$W/l.tar" --ext4-image="$W/img"
      e2fsck -fn "$W/img"
    done
    [ "$(quota_limit "$W/img" user 0)" = 5000000 ]
    [ "$(quota_limit "$W/img" group 0)" = 7000000 ]
    debugfs -R 'lq user' "$W/img" 2>/dev/null | grep -Eq '^ +1004 +[1-9][0-9]* '
    debugfs -R 'lq group' "$W/img" 2>/dev/null | grep -Eq '^ +2004 +[1-9][0-9]* '
    mount_image_rw "$W/ref" "$W/m"
    # the same two runs (--overwrite rewrites files in place: tar's chown
    # there clears set-ID bits its chmod does not set again)
    for opt in "" --overwrite; do
      # shellcheck disable=SC2086
      (cd "$W/m" && "$STOCK_TAR" --xattrs $opt -xf "$W/x.tar" 2>/dev/null
       "$STOCK_TAR" --xattrs $opt -xf "$W/l.tar") || true
    done
    umount_image "$W/m"
    echo "mkfs.ext4 $mk against $ref"
    manifests_diff "$W/ref" "$W/img"
  done
  # a quota file whose tree is broken: refused before anything is written
  rm -f "$W/img"
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F -b 1024 -O quota "$W/img"
  local blk
  blk=$(debugfs -R 'bmap <3> 1' "$W/img" 2>/dev/null)
  printf '\x9f\x86\x01\x00' | dd of="$W/img" bs=1 seek=$((blk * 1024)) conv=notrunc status=none
  run "$BFOTAR" -xf "$W/x.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ]
  [[ $output == *"Cannot extract into the ext4 image: Structure needs cleaning"* ]]
  ! debugfs -R 'ls /' "$W/img" 2>/dev/null | grep -q ' t '
  # bfo mkimage of a tree with owners and attributes into an image with quota
  mkdir -p "$W/src/d"
  local i
  for i in $(seq 1 50); do
    echo "file $i" > "$W/src/d/f$i"
    chown $((3000 + i % 7)):$((4000 + i % 5)) "$W/src/d/f$i"
  done
  setfattr -n user.big -v "$(head -c 3000 /dev/zero | tr '\0' a)" "$W/src/d/f1"
  rm -f "$W/img"
  truncate -s 64M "$W/img"
  mkfs.ext4 -q -F -O quota,project,ea_inode "$W/img"
  "$BFO" mkimage "$W/img" "$W/src"
  e2fsck -fn "$W/img"
  debugfs -R 'lq user' "$W/img" 2>/dev/null | grep -Eq '^ +3006 +[1-9][0-9]* +0 +0 +7 '
}

@test "--ext4-image --overwrite --xattrs: a member with extended attributes replaces the file (its other hard links keep the old data), one without is rewritten in place, as tar -x on the mounted image" {
  require_root_loop
  python3 - "$W" <<'PY'
import io, sys, tarfile
for n, x in (('o1', {'SCHILY.xattr.user.a': 'A', 'SCHILY.xattr.user.c': 'C1'}),
             ('o2', {'SCHILY.xattr.user.b': 'B', 'SCHILY.xattr.user.c': 'C2'})):
    with tarfile.open('%s/%s.tar' % (sys.argv[1], n), 'w', format=tarfile.PAX_FORMAT) as t:
        d = tarfile.TarInfo('t'); d.type = tarfile.DIRTYPE; d.mode = 0o755; d.pax_headers = dict(x)
        t.addfile(d)
        for f in ('f', 'g', 'p'):
            ti = tarfile.TarInfo('t/' + f); data = (n + f).encode() * 100; ti.size = len(data)
            ti.pax_headers = dict(x) if f != 'p' else {}
            t.addfile(ti, io.BytesIO(data))
        if n == 'o1':
            for a, b in (('h', 'g'), ('q', 'p')):
                ti = tarfile.TarInfo('t/' + a); ti.type = tarfile.LNKTYPE; ti.linkname = 't/' + b
                t.addfile(ti)
PY
  local opt a
  for opt in "--xattrs --overwrite" "--xattrs" "--overwrite"; do
    rm -f "$W/img" "$W/ref"
    truncate -s 32M "$W/img" "$W/ref"
    mkfs.ext4 -q -F "$W/img"
    mkfs.ext4 -q -F "$W/ref"
    mount_image_rw "$W/ref" "$W/m"
    for a in o1 o2; do
      # shellcheck disable=SC2086
      (cd "$W/m" && "$STOCK_TAR" $opt -xf "$W/$a.tar")
      # shellcheck disable=SC2086
      "$BFOTAR" $opt -xf "$W/$a.tar" --ext4-image="$W/img"
    done
    umount_image "$W/m"
    e2fsck -fn "$W/img"
    echo "$opt"
    manifests_diff "$W/ref" "$W/img"
  done
  # (--overwrite without --xattrs: g rewritten in place, so h has its new data)
  grep -q "^t/h 0o100644 2 " "$W/img.manifest"
}

@test "--ext4-image on mkfs variants (no filetype, orphan_file, meta_bg, sparse_super2, no flex_bg, uninit_bg, large_dir, 1 KiB inodes, casefold, encrypt, verity): three runs, the last with --overwrite, e2fsck clean; one needing recovery refused" {
  command -v e2fsck >/dev/null || skip "e2fsck not installed"
  limits_archive "$W/l.tar" pax
  local mk o
  for mk in "-O ^filetype" "-O orphan_file" "-O meta_bg,^resize_inode" "-O sparse_super2" \
            "-O ^flex_bg" "-O ^metadata_csum,uninit_bg" "-O large_dir" "-I 1024" \
            "-O casefold" "-O encrypt" "-O verity"; do
    rm -f "$W/img"
    truncate -s 64M "$W/img"
    # shellcheck disable=SC2086
    mkfs.ext4 -q -F -b 4096 $mk "$W/img"
    for o in "" "" --overwrite; do
      # shellcheck disable=SC2086
      "$BFOTAR" --xattrs $o -xf "$W/l.tar" --ext4-image="$W/img" 2> "$W/err" || true
      # (only the members through over-long symbolic link targets fail)
      ! grep -v -e "implausibly old time stamp" -e "t/lz/f: Cannot open: File name too long" \
          -e "t/lw/g: Cannot open: No such file or directory" \
          -e "Exiting with failure status" "$W/err"
    done
    echo "mkfs.ext4 $mk"
    e2fsck -fn "$W/img"
  done
  debugfs -w -R 'feature orphan_present' "$W/img"
  run "$BFOTAR" -xf "$W/l.tar" --ext4-image="$W/img"
  [ "$status" -eq 2 ]
  [[ $output == *"Cannot extract into the ext4 image: Structure needs cleaning"* ]]
}
