# tar-differential.bash: extract one archive with bfotar and with stock tar 1.34
# and compare what a user sees.  Sourced by tests/tar-fuzz.bats and build-aux/fuzz-tar.
#
# Both programs run as "tar" (symlinks), from a directory of their own, as
#   tar -xf INPUT -C out [OPTIONS...]
# and must agree on the exit status, stderr byte for byte, and the tree under
# the run directory (so a file written outside out/, by ../ or a symlink,
# shows up too).  Needs: TD_BFO and TD_STOCK, directories holding "tar".

# The tree under $1, one line per entry: path (escaped), type, mode, size,
# link count, owner, mtime, content hash or link target.  Times inside
# [$2, $3] (when the run started and ended, in seconds) print as "now": tar
# gives implicitly made directories the time of the run, which differs
# between two runs.  The captured rc, err, stdout and tree files are left out.
td_tree() {
  python3 -S - "$@" <<'PY'
import hashlib, os, stat, sys
root, t0, t1 = os.fsencode(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
skip = {b'rc', b'err', b'stdout', b'tree', b'tree.tmp'}
rows = []
for dp, dns, fns in os.walk(root):
    for n in dns + fns:
        p = os.path.join(dp, n)
        rel = os.path.relpath(p, root)
        if dp == root and n in skip:
            continue
        st = os.lstat(p)
        t = st.st_mtime_ns
        when = 'now' if t0 <= t // 10**9 <= t1 else '%d.%09d' % divmod(t, 10**9)
        line = '%r %o %d %d %d:%d %s' % (rel, st.st_mode, 0 if stat.S_ISDIR(st.st_mode) else st.st_size,
                                        st.st_nlink, st.st_uid, st.st_gid, when)
        if stat.S_ISREG(st.st_mode):
            try:
                with open(p, 'rb') as f:
                    line += ' ' + hashlib.sha256(f.read()).hexdigest()[:16]
            except OSError as e:
                line += ' unreadable:%d' % e.errno
        elif stat.S_ISLNK(st.st_mode):
            line += ' -> %r' % os.readlink(p)
        rows.append(line)
print('\n'.join(sorted(rows)))
PY
}

# td_run BINDIR RUNDIR INPUT [OPTIONS...]: one extraction; leaves RUNDIR/{rc,err,tree}.
td_run() {
  local bindir=$1 run=$2 input=$3 t0 t1 rc
  shift 3
  # (one second back: the kernel stamps files with a clock lagging date's)
  t0=$(( $(date +%s) - 1 ))
  rm -rf "$run" && mkdir -p "$run/out" || return 2
  (cd "$run" && PATH=$bindir:$PATH timeout -s KILL "${TD_TIMEOUT:-20}" \
     tar -xf "$input" -C out "$@" > stdout 2> err < /dev/null)
  rc=$?
  t1=$(( $(date +%s) + 1 ))
  echo "$rc" > "$run/rc"
  td_tree "$run" "$t0" "$t1" > "$run/tree.tmp" && mv "$run/tree.tmp" "$run/tree"
}

# td_compare INPUT WORKDIR [OPTIONS...]: 0 if bfotar and stock tar agree on
# INPUT; else 1, with the differences on stdout.  A death by signal (status
# above 128) of bfotar is a failure even if stock tar died the same way.
td_compare() {
  local input=$1 w=$2
  shift 2
  td_run "$TD_STOCK" "$w/stock" "$input" "$@"
  td_run "$TD_BFO" "$w/bfo" "$input" "$@"
  local fail=0 rs rb
  rs=$(cat "$w/stock/rc") rb=$(cat "$w/bfo/rc")
  if [ "$rs" != "$rb" ]; then
    echo "exit status: stock tar $rs, bfotar $rb"; fail=1
  fi
  if [ "$rb" -gt 128 ]; then
    echo "bfotar died: status $rb"; fail=1
  fi
  if ! cmp -s "$w/stock/err" "$w/bfo/err"; then
    echo "stderr differs:"; diff "$w/stock/err" "$w/bfo/err" | head -n 20; fail=1
  fi
  if ! cmp -s "$w/stock/stdout" "$w/bfo/stdout"; then
    echo "stdout differs"; fail=1
  fi
  if ! cmp -s "$w/stock/tree" "$w/bfo/tree"; then
    echo "extracted tree differs:"; diff "$w/stock/tree" "$w/bfo/tree" | head -n 20; fail=1
  fi
  return $fail
}

# td_make_seeds DIR: one small archive per format and member kind (blocking
# factor 1, so each is a few KiB), made by stock tar from a fixed tree.
td_make_seeds() {
  local out=$1 t
  t=$(mktemp -d) || return 2
  mkdir -p "$out" "$t/tree/dir/sub" "$t/long" && out=$(cd "$out" && pwd) || return 2
  printf 'hello\n' > "$t/tree/file"
  seq 1 300 > "$t/tree/dir/numbers"
  : > "$t/tree/dir/empty"
  ln "$t/tree/file" "$t/tree/dir/hard"
  ln -s ../file "$t/tree/dir/sym"
  chmod 0750 "$t/tree/dir/sub"
  local n=aaaaaaaaa/bbbbbbbbbbbbbbbbbbbb/cccccccccccccccccccccccccccccc/ddddddddddddddddddddddddddddddddddddddddd/eeeeeeeeeeeeeeeeeee
  mkdir -p "$t/long/${n%/*}" && printf 'long\n' > "$t/long/$n"
  mkdir -p "$t/sparse"
  printf 'head' > "$t/sparse/s" && printf 'tail' | dd of="$t/sparse/s" bs=1 seek=40000 conv=notrunc status=none
  mkdir -p "$t/xattr" && printf 'x\n' > "$t/xattr/f"
  setfattr -n user.bfo -v fuzz "$t/xattr/f" 2>/dev/null
  # Fixed times: none that could pass for the time of a run.
  find "$t" -mindepth 1 -exec touch -h -d '2001-02-03 04:05:06' {} +
  touch -d '1999-12-31 23:59:59.5' "$t/tree/dir/numbers"
  local f st=$STOCK_TAR
  for f in gnu oldgnu posix ustar v7; do
    (cd "$t/tree" && "$st" -b1 --format=$f -cf "$out/tree-$f.tar" --owner=0 --group=0 .) || return 2
  done
  (cd "$t/long" && "$st" -b1 --format=gnu -cf "$out/long-gnu.tar" .
   "$st" -b1 --format=posix -cf "$out/long-posix.tar" .) || return 2
  (cd "$t/sparse" && "$st" -b1 --sparse --format=gnu -cf "$out/sparse-gnu.tar" s
   for v in 0.0 0.1 1.0; do
     "$st" -b1 --sparse --format=posix --sparse-version=$v -cf "$out/sparse-posix-$v.tar" s
   done) || return 2
  (cd "$t/xattr" && "$st" -b1 --xattrs --format=posix -cf "$out/xattr-posix.tar" f) || return 2
  (cd "$t/tree" && "$st" -b1 --format=gnu -g "$t/snar" -cf "$out/incremental-gnu.tar" dir) || return 2
  # Hostile names: absolute (a file and a hard link to it), dot-dot, and
  # symbolic links out of the target (absolute, to TD_ESCAPE, and relative)
  # each followed by a member below it.
  mkdir -p "$t/h/esc" && printf 'evil\n' > "$t/h/f" && ln "$t/h/f" "$t/h/f2" &&
    touch -d '2001-02-03 04:05:06' "$t/h/f" "$t/h/esc"
  (cd "$t/h" && "$st" -b1 -P --format=gnu -cf "$out/hostile-abs.tar" "$t/h/f" "$t/h/f2"
   "$st" -b1 -P --format=gnu -cf "$out/hostile-dotdot.tar" esc/../f ../h/f) || return 2
  ln -s "${TD_ESCAPE:-/tmp/bfo-fuzz-escape}" "$t/h/l" && ln -s ../.. "$t/h/r" &&
    touch -h -d '2001-02-03 04:05:06' "$t/h/l" "$t/h/r" &&
    (cd "$t/h" && "$st" -b1 --format=gnu -cf "$out/hostile-symlink.tar" l r) || return 2
  rm "$t/h/l" "$t/h/r" && mkdir "$t/h/l" "$t/h/r" && printf 'evil\n' > "$t/h/l/escaped" &&
    printf 'evil\n' > "$t/h/r/escaped" &&
    find "$t/h" -mindepth 1 -exec touch -h -d '2001-02-03 04:05:06' {} + &&
    (cd "$t/h" && "$st" -b1 --format=gnu -rf "$out/hostile-symlink.tar" l/escaped r/escaped) || return 2
  rm -rf "$t"
}
