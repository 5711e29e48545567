#!/usr/bin/env bats
# install.bats: make install puts the programs, libbfo (shared and static), its header,
# bfo.pc and the man pages in place; a program builds against them; uninstall removes them.

load helpers/common

setup_file() {
  export D=$BATS_FILE_TMPDIR/root
  make -s -C "$top_builddir" install DESTDIR="$D" >/dev/null
}

@test "make install installs the programs, library, header, pkg-config file and man pages" {
  prefix=$(sed -n 's/^prefix = //p' "$top_builddir/Makefile")
  for f in bin/bfocp bin/bfotar bin/bfo lib/libbfo.so lib/libbfo.a include/bfo.h \
           lib/pkgconfig/bfo.pc share/man/man1/bfocp.1 share/man/man1/bfotar.1 \
           share/man/man8/bfo.8 share/man/man3/libbfo.3; do
    [ -e "$D$prefix/$f" ] || { echo "missing $prefix/$f"; false; }
  done
  "$D$prefix/bin/bfocp" --version | grep -q "^bfocp: a bfo build of GNU cp 9.1"
  LD_LIBRARY_PATH=$D$prefix/lib "$D$prefix/bin/bfo" --version | grep -q "^libbfo $PACKAGE_VERSION"
}

@test "the installed man pages describe the bfo builds" {
  prefix=$(sed -n 's/^prefix = //p' "$top_builddir/Makefile")
  grep -q 'GNU cp 9.1' "$D$prefix/share/man/man1/bfocp.1"
  grep -q -- 'reflink' "$D$prefix/share/man/man1/bfocp.1"
  grep -q 'GNU tar 1.34' "$D$prefix/share/man/man1/bfotar.1"
  grep -q 'bfo_features' "$D$prefix/share/man/man3/libbfo.3"
}

@test "a program builds and runs against the installed libbfo through pkg-config" {
  prefix=$(sed -n 's/^prefix = //p' "$top_builddir/Makefile")
  cat > "$BATS_TEST_TMPDIR/t.c" <<'C'
#include <bfo.h>
#include <stdio.h>
int main (void) { printf ("%s\n", bfo_version ()); return 0; }
C
  flags=$(PKG_CONFIG_PATH=$D$prefix/lib/pkgconfig PKG_CONFIG_SYSROOT_DIR=$D pkg-config --cflags --libs bfo)
  cc -o "$BATS_TEST_TMPDIR/t" "$BATS_TEST_TMPDIR/t.c" $flags
  run env LD_LIBRARY_PATH=$D$prefix/lib "$BATS_TEST_TMPDIR/t"
  [ "$status" -eq 0 ]
  [ "$output" = "$PACKAGE_VERSION" ]
  # only the bfo_ interface is exported
  ! nm -D --defined-only "$D$prefix/lib/libbfo.so" | awk '{print $3}' | grep -v '^bfo_' | grep -q .
}

@test "make uninstall removes every installed file" {
  make -s -C "$top_builddir" uninstall DESTDIR="$D" >/dev/null
  run find "$D" -type f -o -type l
  [ "$output" = "" ]
}
