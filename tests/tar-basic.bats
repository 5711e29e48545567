#!/usr/bin/env bats
# tar-basic.bats: bfotar archives byte-identically to GNU tar 1.34 (Debian 12's
# /bin/tar) and extracts the same tree; messages and exit status match.

load helpers/common

setup() {
  as_upstream_names
  SRC=$BATS_TEST_TMPDIR/src
  make_sample_tree "$SRC"
}

@test "bfotar -cf is byte-identical to GNU tar -cf (default options)" {
  (cd "$BATS_TEST_TMPDIR" && /bin/tar -cf gnu.tar src && "$BFOTAR" -cf bfo.tar src)
  cmp "$BATS_TEST_TMPDIR/gnu.tar" "$BATS_TEST_TMPDIR/bfo.tar"
}

@test "bfotar -c is byte-identical for posix format, name sort, fixed owner and mtime" {
  opts=(--format=posix --sort=name --owner=0 --group=0 --numeric-owner --mtime=@1000000000
        --pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime)
  /bin/tar -C "$BATS_TEST_TMPDIR" "${opts[@]}" -cf - src > "$BATS_TEST_TMPDIR/gnu.tar"
  "$BFOTAR" -C "$BATS_TEST_TMPDIR" "${opts[@]}" -cf - src > "$BATS_TEST_TMPDIR/bfo.tar"
  cmp "$BATS_TEST_TMPDIR/gnu.tar" "$BATS_TEST_TMPDIR/bfo.tar"
}

@test "bfotar -xf extracts the same tree as GNU tar -xf" {
  /bin/tar -C "$BATS_TEST_TMPDIR" -cf "$BATS_TEST_TMPDIR/a.tar" src
  mkdir "$BATS_TEST_TMPDIR/gnu" "$BATS_TEST_TMPDIR/bfo"
  /bin/tar -C "$BATS_TEST_TMPDIR/gnu" -xf "$BATS_TEST_TMPDIR/a.tar"
  "$BFOTAR" -C "$BATS_TEST_TMPDIR/bfo" -xf "$BATS_TEST_TMPDIR/a.tar"
  diff <(manifest "$BATS_TEST_TMPDIR/gnu") <(manifest "$BATS_TEST_TMPDIR/bfo")
  diff <(manifest "$SRC") <(manifest "$BATS_TEST_TMPDIR/bfo/src")
}

@test "a missing archive: same message and exit status as GNU tar" {
  run env PATH=/usr/bin:/bin tar -xf "$BATS_TEST_TMPDIR/nope.tar"
  gnu_status=$status gnu_output=$output
  run env PATH="$ASBIN:/usr/bin:/bin" tar -xf "$BATS_TEST_TMPDIR/nope.tar"
  [ "$status" -eq "$gnu_status" ]
  [ "$status" -eq 2 ]
  [ "$output" = "$gnu_output" ]
}

@test "a truncated archive: same diagnostics and exit status as GNU tar" {
  start=$(date +%s)
  /bin/tar -C "$SRC" -cf "$BATS_TEST_TMPDIR/a.tar" sub/random.bin a.txt
  head -c 50000 "$BATS_TEST_TMPDIR/a.tar" > "$BATS_TEST_TMPDIR/t.tar"
  mkdir "$BATS_TEST_TMPDIR/g" "$BATS_TEST_TMPDIR/b"
  run env PATH=/usr/bin:/bin tar -C "$BATS_TEST_TMPDIR/g" -xf "$BATS_TEST_TMPDIR/t.tar"
  gnu_status=$status gnu_output=$output
  run env PATH="$ASBIN:/usr/bin:/bin" tar -C "$BATS_TEST_TMPDIR/b" -xf "$BATS_TEST_TMPDIR/t.tar"
  [ "$status" -eq "$gnu_status" ]
  [ "$status" -eq 2 ]
  [ "$output" = "$gnu_output" ]
  [[ "$output" == *"Unexpected EOF in archive"* ]]
  # The cut-short file and its directory keep the time they were written
  # (neither tar sets the archive's): compared without times, which two
  # runs a second apart do not share; then checked to be no older than the run.
  diff <(manifest "$BATS_TEST_TMPDIR/g" | without_times) <(manifest "$BATS_TEST_TMPDIR/b" | without_times)
  [ "$(stat -c %Y "$BATS_TEST_TMPDIR/b/sub/random.bin")" -ge "$start" ]
  [ "$(stat -c %Y "$BATS_TEST_TMPDIR/b/sub")" -ge "$start" ]
}

# manifest's lines without their mtimes (a file's 6th field, a directory's 4th).
without_times() {
  awk '$2 == "file" { $6 = "-" } $2 == "directory" { $4 = "-" } { print }'
}

@test "abbreviations of tar's own options keep their meaning (--ba, --sta, --ext)" {
  cd "$BATS_TEST_TMPDIR"
  echo x > f
  for a in --ba=t --sta=f --ext; do
    run env LC_ALL=C PATH=/usr/bin:/bin tar "$a" -cf /dev/null f
    gnu_status=$status gnu_output=$output
    run env LC_ALL=C PATH="$ASBIN:/usr/bin:/bin" tar "$a" -cf /dev/null f
    [ "$status" -eq "$gnu_status" ]
    [ "$output" = "$gnu_output" ]
  done
  # a value that looks like an abbreviation stays a value
  env PATH="$ASBIN:/usr/bin:/bin" tar -cf x.tar --exclude --sta f
  [ "$(tar -tf x.tar)" = f ]
}
