#!/usr/bin/env bats
# tar-fuzz.bats: bad and hostile archives (the seeds of make check-fuzz, made by
# stock tar, and the inputs the fuzzer found, kept in tests/data/tar-fuzz/)
# extracted by bfotar and by stock GNU tar 1.34: same exit status, same stderr,
# same tree, no file outside the target, and with --ext4-image no crash and an
# image e2fsck finds clean.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/tar-differential

setup_file() {
  build_stock_tar
}

setup() {
  stock_tar_setup
  TD_BFO=$ASBIN TD_STOCK=$STOCKBIN
  # Where the hostile seeds' absolute symbolic link points: must stay empty.
  export TD_ESCAPE=$W/escape
  mkdir -p "$TD_ESCAPE"
  td_make_seeds "$W/seeds"
}

# Every kept input, under the options given, through both programs.
replay_all() {
  local f fail=0 n=0
  for f in "$W"/seeds/*.tar "$top_srcdir"/tests/data/tar-fuzz/*.tar; do
    [ -f "$f" ] || continue
    n=$((n + 1))
    if ! td_compare "$f" "$W/replay" "$@" > "$W/why" 2>&1; then
      echo "# ${f##*/} ($*):" >&3; sed 's/^/#   /' "$W/why" >&3; fail=1
    fi
    [ -z "$(ls -A "$TD_ESCAPE")" ] || { echo "# ${f##*/}: wrote into $TD_ESCAPE" >&3; return 1; }
  done
  # 16 seeds and the 24 archives of tests/data/tar-fuzz at least
  [ $n -ge 40 ] || { echo "# only $n inputs" >&3; return 1; }
  return $fail
}

@test "seeds and fuzzer-found archives: bfotar extracts exactly as stock tar" {
  replay_all
}

@test "seeds and fuzzer-found archives with -p --delay-directory-restore --strip-components=1" {
  replay_all -p --delay-directory-restore --strip-components=1
}

@test "each archive twice in a row: default and --overwrite" {
  # Every member meets its own earlier copy.
  local f opt fail=0
  for f in "$W"/seeds/*.tar "$top_srcdir"/tests/data/tar-fuzz/*.tar; do
    [ -f "$f" ] || continue
    cp "$f" "$W/twice.tar"
    cat "$f" >> "$W/twice.tar"
    for opt in --ignore-zeros --overwrite; do
      td_compare "$W/twice.tar" "$W/replay" --ignore-zeros $opt > "$W/why" 2>&1 ||
        { echo "# ${f##*/} ($opt):" >&3; sed 's/^/#   /' "$W/why" >&3; fail=1; }
    done
  done
  [ $fail = 0 ]
}

@test "hostile names: no file outside the target, same messages as stock tar" {
  local f
  for f in hostile-abs hostile-dotdot hostile-symlink; do
    run td_compare "$W/seeds/$f.tar" "$W/replay"
    [ "$status" -eq 0 ] || { echo "# $f: $output" >&3; false; }
    # Everything extracted lies under out/ (the run directory holds only the
    # captured output besides it) and nothing reached the escape directory.
    run find "$W/replay/bfo" -mindepth 1 -maxdepth 1 ! -name out ! -name rc ! -name err \
      ! -name stdout ! -name tree
    [ -z "$output" ]
    [ -z "$(ls -A "$TD_ESCAPE")" ]
    cp "$W/replay/bfo/err" "$W/$f.err"
    cp "$W/replay/bfo/rc" "$W/$f.rc"
    (cd "$W/replay/bfo/out" && find . -mindepth 1 -printf '%p %y %n\n' | LC_ALL=C sort) > "$W/$f.tree"
  done
  # Absolute names and hard-link targets lose their leading slash: both
  # names end up below the target, as one file.
  grep -q "Removing leading \`/' from member names" "$W/hostile-abs.err"
  grep -q "Removing leading \`/' from hard link targets" "$W/hostile-abs.err"
  [ "$(grep -c '/h/f2\? f 2$' "$W/hostile-abs.tree")" -eq 2 ]
  # Names with .. are refused, nothing is written.
  [ "$(cat "$W/hostile-dotdot.rc")" -eq 2 ]
  grep -q "esc/../f: Member name contains '..'" "$W/hostile-dotdot.err"
  [ ! -s "$W/hostile-dotdot.tree" ]
  # A member below a symbolic link that leads out is refused (the link is
  # only made at the end), the links themselves are made.
  [ "$(cat "$W/hostile-symlink.rc")" -eq 2 ]
  grep -q "l/escaped: Cannot open: Not a directory" "$W/hostile-symlink.err"
  grep -q "r/escaped: Cannot open: Not a directory" "$W/hostile-symlink.err"
  diff <(printf './l l 1\n./r l 1\n') "$W/hostile-symlink.tree"
}

@test "--ext4-image: every kept input gives no crash and a clean image" {
  [ "$(id -u)" = 0 ] || skip "needs root (e2fsck on the image, as the other image tests)"
  command -v mke2fs >/dev/null || skip "mke2fs not found"
  mke2fs -q -F -t ext4 "$W/empty.img" 8M
  local f rc fail=0
  for f in "$W"/seeds/*.tar "$top_srcdir"/tests/data/tar-fuzz/*.tar; do
    [ -f "$f" ] || continue
    cp "$W/empty.img" "$W/img"
    rc=0
    timeout -s KILL 60 "$BFOTAR" -xf "$f" --ext4-image="$W/img" > /dev/null 2> "$W/err" || rc=$?
    if [ $rc -gt 2 ]; then
      echo "# ${f##*/}: bfotar status $rc: $(head -c 300 "$W/err")" >&3; fail=1
    fi
    e2fsck -fn "$W/img" > "$W/fsck" 2>&1 ||
      { echo "# ${f##*/}: e2fsck:" >&3; sed 's/^/#   /' "$W/fsck" >&3; fail=1; }
  done
  [ $fail = 0 ]
}

@test "the two bugs of tar 1.34 Debian 12's tar fixes (CVE-2022-48303: a base-256 marker in a field's last byte; CVE-2023-39804: 'SCHILY.xattr' without its dot, a 3 MB value): Debian's diagnostics, no crash" {
  python3 - "$W" <<'PY'
import io, sys, tarfile
w = sys.argv[1]
for name, hdrs in [('nodot', {'SCHILY.xattr': 'v'}), ('big', {'SCHILY.xattr': 'A' * 3000000}),
                   ('ok', {'SCHILY.xattr.user.a': 'v'})]:
    with tarfile.open('%s/%s.tar' % (w, name), 'w', format=tarfile.PAX_FORMAT) as t:
        ti = tarfile.TarInfo('f'); ti.size = 1; ti.pax_headers = hdrs; t.addfile(ti, io.BytesIO(b'x'))
with tarfile.open(w + '/b256.tar', 'w', format=tarfile.USTAR_FORMAT) as t:
    ti = tarfile.TarInfo('g'); ti.size = 1; t.addfile(ti, io.BytesIO(b'x'))
b = bytearray(open(w + '/b256.tar', 'rb').read())
b[136:148] = b'           \x80'        # mtime: spaces, then 0200 in its last byte
s = sum(b[0:148]) + 8 * 32 + sum(b[156:512]); b[148:156] = b'%06o\x00 ' % s
open(w + '/b256.tar', 'wb').write(bytes(b))
PY
  local a st
  for a in nodot big; do
    rm -rf "$W/o"; mkdir "$W/o"
    st=0; LC_ALL=C "$BFOTAR" --xattrs -xf "$W/$a.tar" -C "$W/o" 2> "$W/err" || st=$?
    cat "$W/err"
    [ "$st" = 0 ]
    grep -q "Ignoring unknown extended header keyword 'SCHILY.xattr'" "$W/err"
    [ "$(cat "$W/o/f")" = x ]
  done
  rm -rf "$W/o"; mkdir "$W/o"
  "$BFOTAR" --xattrs -xf "$W/ok.tar" -C "$W/o"
  [ "$(cat "$W/o/f")" = x ]
  rm -rf "$W/o"; mkdir "$W/o"
  st=0; LC_ALL=C "$BFOTAR" -xf "$W/b256.tar" -C "$W/o" 2> "$W/err" || st=$?
  cat "$W/err"
  [ "$st" = 2 ]
  grep -q "where numeric time_t value expected" "$W/err"
  if dpkg-query -W -f '${Version}' tar 2>/dev/null | grep -q '^1\.34+dfsg-1\.2+deb12u1$'; then
    # the system's tar is Debian 12's, which has the same two fixes
    for a in nodot big b256; do
      rm -rf "$W/o" "$W/p"; mkdir "$W/o" "$W/p"
      (LC_ALL=C "$BFOTAR" --xattrs -xf "$W/$a.tar" -C "$W/o" 2>&1; echo "status $?") | sed 's/^[^:]*: //' > "$W/b.out"
      (LC_ALL=C /bin/tar --xattrs -xf "$W/$a.tar" -C "$W/p" 2>&1; echo "status $?") | sed 's/^[^:]*: //' > "$W/d.out"
      diff "$W/d.out" "$W/b.out"
      diff -r "$W/p" "$W/o"
    done
  fi
}
