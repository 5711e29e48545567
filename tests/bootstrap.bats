#!/usr/bin/env bats
# bootstrap.bats: build-aux/bfo-upstream (what ./bootstrap and make use) accepts only
# the pinned tarballs, names a patch that does not apply, and leaves no half-patched
# tree; configure names the Debian package when a library is missing.

load helpers/common

UP=$top_srcdir/build-aux/bfo-upstream

setup() {
  CACHE=$BATS_TEST_TMPDIR/cache DEST=$BATS_TEST_TMPDIR/up
  mkdir -p "$CACHE" "$DEST"
  real=$(ls "$UPSTREAM_CACHE"/coreutils*9.1*.tar.xz 2>/dev/null | head -n1)
  [ -n "$real" ] || { echo "no coreutils tarball in UPSTREAM_CACHE=$UPSTREAM_CACHE; run ./bootstrap first" >&2; return 1; }
}

@test "a pinned tarball in the cache is verified, unpacked and patched" {
  cp "$real" "$CACHE/"
  run "$UP" prepare coreutils "$CACHE" "$DEST" "$top_srcdir/patches/coreutils-9.1"
  [ "$status" -eq 0 ]
  [[ "$output" == *"coreutils 9.1: verified"* ]]
  [[ "$output" == *"applied $(grep -vc '^#' "$top_srcdir/patches/coreutils-9.1/series") patches"* ]]
  grep -q 'bfo_version ()' "$DEST/coreutils-9.1/src/cp.c"
  [ -f "$DEST/coreutils-9.1/.bfo-patched" ]
}

@test "a corrupted tarball is refused with expected and actual sha256, no tree left" {
  cp "$real" "$CACHE/coreutils_9.1.orig.tar.xz"
  printf 'X' | dd of="$CACHE/coreutils_9.1.orig.tar.xz" bs=1 seek=100000 conv=notrunc 2>/dev/null
  actual=$(sha256sum "$CACHE/coreutils_9.1.orig.tar.xz" | cut -d' ' -f1)
  run "$UP" prepare coreutils "$CACHE" "$DEST" "$top_srcdir/patches/coreutils-9.1"
  [ "$status" -ne 0 ]
  [[ "$output" == *"sha256 mismatch"* ]]
  [[ "$output" == *"expected: 61a1f410d78ba7e7f37a5a4f50e6d1320aca33375484a3255eddf17a38580423"* ]]
  [[ "$output" == *"actual:   $actual"* ]]
  [ -z "$(ls -A "$DEST")" ]
}

@test "a patch that does not apply is named with its file and hunk, no tree left" {
  cp "$real" "$CACHE/"
  P=$BATS_TEST_TMPDIR/patches
  mkdir -p "$P"
  cp "$top_srcdir"/patches/coreutils-9.1/*.patch "$P/"
  cat > "$P/0099-stale.patch" <<'PATCH'
Subject: a patch written against some other cp.c
---
--- a/src/cp.c
+++ b/src/cp.c
@@ -1,3 +1,3 @@
-/* this line is not in cp.c */
+/* nor is this one */
 #include <config.h>
 #include <stdio.h>
PATCH
  { cat "$top_srcdir/patches/coreutils-9.1/series"; echo 0099-stale.patch; } > "$P/series"
  run "$UP" prepare coreutils "$CACHE" "$DEST" "$P"
  [ "$status" -ne 0 ]
  [[ "$output" == *"patching file src/cp.c"* ]]
  [[ "$output" == *"Hunk #1 FAILED at 1"* ]]
  [[ "$output" == *"patch 0099-stale.patch does not apply to coreutils 9.1"* ]]
  [ -z "$(ls -A "$DEST")" ]
}

@test "a series naming a missing patch is an error" {
  cp "$real" "$CACHE/"
  P=$BATS_TEST_TMPDIR/patches
  mkdir -p "$P" && echo 0001-missing.patch > "$P/series"
  run "$UP" prepare coreutils "$CACHE" "$DEST" "$P"
  [ "$status" -ne 0 ]
  [[ "$output" == *"series names 0001-missing.patch but"*"does not exist"* ]]
}

@test "the pins list both GNU and Debian tarballs of tar" {
  run "$UP" list
  [ "$status" -eq 0 ]
  [[ "$output" == *"tar-1.34.tar.xz 63bebd26879c5e1eea4352f0d03c991f966aeb3ddeb3c7445c902568d5411d28"* ]]
  [[ "$output" == *"tar_1.34+dfsg.orig.tar.xz 7d57029540cb928394defb3b377b3531237c947e795b51aa8acac0c5ba0e4844"* ]]
}

@test "configure without liburing or libext2fs names the Debian package to install" {
  # A copy of what configure needs up to its library checks: the source tree
  # itself may be configured in place, and configure refuses a second build then.
  S=$BATS_TEST_TMPDIR/src
  mkdir -p "$S/lib"
  cp "$top_srcdir/configure" "$S/"
  cp "$top_srcdir/lib/bfo.h" "$S/lib/"
  cp -r "$top_srcdir/build-aux" "$S/"
  cd "$S"
  run env PKG_CONFIG_LIBDIR=/nonexistent ./configure -q
  [ "$status" -ne 0 ]
  [[ "$output" == *"liburing not found: install the Debian package liburing-dev"* ]]
  run env PKG_CONFIG_LIBDIR=/nonexistent LIBURING_CFLAGS=' ' LIBURING_LIBS=-luring ./configure -q
  [ "$status" -ne 0 ]
  [[ "$output" == *"libext2fs not found: install the Debian package libext2fs-dev"* ]]
}
