#!/usr/bin/env bats
# deb.bats: the Debian packages of make deb, installed in a throw-away Debian root made
# with debootstrap: bfo-as-default makes cp and tar the bfo programs, dpkg keeps working,
# coreutils/tar upgrades keep the diversions, bfo cannot be pulled from under it, and
# removing it puts GNU's cp and tar back byte for byte.
#
# Root and network (debootstrap and apt use the host's Debian mirror); about 10 minutes
# with the package build.  Run by `make check-deb`, not by `make check`.  The tests run
# in order on one root.  Every dpkg and apt command runs inside the chroot (in_root);
# the last test checks that the host's cp, tar and diversions were not touched.
# Environment: BFO_DEB_BUILT=1      use the packages already in $top_builddir/deb
#              BFO_DEB_MIRROR       Debian mirror (default: the host's apt sources)
#              BFO_DEB_ROOT_PARENT  where the throw-away root is made (default /var/tmp)
#              BFO_DEB_KEEP_ROOT=1  keep the root afterwards (it is printed)

load helpers/common

DEB_DIR=$top_builddir/deb

# Run a command inside the throw-away root, never on the host.
in_root() {
  [ -n "${ROOT-}" ] && [ "$ROOT" != / ] && [ -x "$ROOT/usr/bin/dpkg" ] || {
    echo "in_root: no throw-away root (ROOT='${ROOT-}')" >&2; return 99; }
  chroot "$ROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin LC_ALL=C \
    DEBIAN_FRONTEND=noninteractive HOME=/root "$@"
}

host_state() {
  sha256sum /usr/bin/cp /usr/bin/tar
  dpkg-divert --list | LC_ALL=C sort
}

mounts_under() {  # deepest first
  findmnt -rn -o TARGET | awk -v r="$1/" 'index($0, r) == 1' | LC_ALL=C sort -r
}

mirror() {
  if [ -n "${BFO_DEB_MIRROR-}" ]; then echo "$BFO_DEB_MIRROR"; return; fi
  local m
  m=$(awk '$1 == "URIs:" && $2 !~ /security/ { print $2; exit }' /etc/apt/sources.list.d/debian.sources 2>/dev/null)
  echo "${m:-http://deb.debian.org/debian}"
}

setup_file() {
  [ "$(id -u)" = 0 ] || skip "needs root (debootstrap, chroot)"
  for t in debootstrap lintian dpkg-buildpackage; do
    command -v "$t" >/dev/null || skip "needs $t (apt-get install debootstrap lintian dpkg-dev debhelper)"
  done
  . /etc/os-release
  [ "${VERSION_CODENAME-}" = bookworm ] || skip "written for Debian 12 (bookworm), this is ${PRETTY_NAME-unknown}"

  host_state > "$BATS_FILE_TMPDIR/host-before"
  if [ "${BFO_DEB_BUILT-}" != 1 ] || ! ls "$DEB_DIR"/bfo_*.deb >/dev/null 2>&1; then
    make -s -C "$top_builddir" deb >&3 2>&1
  fi
  arch=$(dpkg --print-architecture)
  # One root per run, outside bats' temporary directory (bats removes that with
  # rm -rf, which must never meet a mount point).
  ROOT=$(mktemp -d "${BFO_DEB_ROOT_PARENT:-/var/tmp}/bfo-deb-root.XXXXXX")
  echo "$ROOT" > "$BATS_FILE_TMPDIR/root"
  mkdir -p "$top_builddir/deb-cache"
  echo "# debootstrap bookworm into $ROOT from $(mirror)" >&3
  debootstrap --variant=minbase --cache-dir="$top_builddir/deb-cache" bookworm "$ROOT" "$(mirror)" \
    > "$BATS_FILE_TMPDIR/debootstrap.log" 2>&1 ||
    { tail -n 20 "$BATS_FILE_TMPDIR/debootstrap.log" >&3; false; }
  [ -z "$(mounts_under "$ROOT")" ] || { echo "debootstrap left mounts under $ROOT" >&3; false; }
  cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
  mkdir "$ROOT/debs"
  cp "$DEB_DIR"/*.deb "$ROOT/debs/"
  in_root apt-get -q update > "$BATS_FILE_TMPDIR/apt-update.log" 2>&1 ||
    { tail -n 20 "$BATS_FILE_TMPDIR/apt-update.log" >&3; false; }
}

teardown_file() {
  ROOT=$(cat "$BATS_FILE_TMPDIR/root" 2>/dev/null) || return 0
  case $ROOT in /*/bfo-deb-root.*) ;; *) return 0 ;; esac
  local m
  for m in $(mounts_under "$ROOT"); do umount "$m"; done
  if [ -n "$(mounts_under "$ROOT")" ]; then
    echo "# still mounted under $ROOT, not removing it" >&3
  elif [ "${BFO_DEB_KEEP_ROOT-}" = 1 ]; then
    echo "# kept $ROOT" >&3
  else
    rm -rf --one-file-system "$ROOT"
  fi
}

setup() {
  ROOT=$(cat "$BATS_FILE_TMPDIR/root")
  arch=$(dpkg --print-architecture)
  VERSION=$(dpkg-deb -f "$DEB_DIR"/bfo_*_"$arch".deb Version)
}

sha_in_root() { in_root sha256sum "$@" | cut -d' ' -f1; }
pkg_status() { in_root dpkg-query -W -f '${db:Status-Status}' "$1" 2>/dev/null || echo not-installed; }

# Diversions, links and versions that must hold whenever bfo-as-default is installed.
assert_bfo_is_default() {
  in_root dpkg-divert --list 'bfo-as-default' | LC_ALL=C sort > "$BATS_TEST_TMPDIR/div"
  printf '%s\n' 'diversion of /bin/cp to /bin/cp.gnu by bfo-as-default' \
    'diversion of /bin/tar to /bin/tar.gnu by bfo-as-default' \
    'diversion of /usr/share/man/man1/cp.1.gz to /usr/share/man/man1/cp.gnu.1.gz by bfo-as-default' \
    'diversion of /usr/share/man/man1/tar.1.gz to /usr/share/man/man1/tar.gnu.1.gz by bfo-as-default' |
    diff - "$BATS_TEST_TMPDIR/div"
  [ "$(in_root readlink /bin/cp)" = /usr/bin/bfocp ]
  [ "$(in_root readlink /bin/tar)" = /usr/bin/bfotar ]
  in_root cp --version | grep -q '^bfocp: a bfo build of GNU cp 9\.1'
  in_root tar --version | grep -q '^bfotar: a bfo build of GNU tar 1\.34'
  in_root cp.gnu --version | head -n 1 | grep -qx 'cp (GNU coreutils) 9\.1'
  [[ $(in_root cp.gnu --version) != *bfo* ]]
  [[ $(in_root tar.gnu --version) != *bfo* ]]
  [ "$(sha_in_root /bin/cp.gnu)" = "$(cat "$BATS_FILE_TMPDIR/cp.sha")" ]
  [ "$(sha_in_root /bin/tar.gnu)" = "$(cat "$BATS_FILE_TMPDIR/tar.sha")" ]
  [ "$(in_root readlink /usr/share/man/man1/cp.1.gz)" = bfocp.1.gz ]
  [ "$(in_root readlink /usr/share/man/man1/tar.1.gz)" = bfotar.1.gz ]
  [ "$(in_root sha256sum /usr/share/man/man1/cp.gnu.1.gz /usr/share/man/man1/tar.gnu.1.gz)" = \
    "$(sed 's/\.1\.gz$/.gnu.1.gz/' "$BATS_FILE_TMPDIR/man.sha")" ]
}

# What must hold once bfo-as-default is gone: GNU's files back, no trace of ours.
assert_gnu_is_back() {
  [ ! -L "$ROOT/usr/bin/cp" ] && [ ! -L "$ROOT/usr/bin/tar" ]
  [ "$(sha_in_root /bin/cp)" = "$(cat "$BATS_FILE_TMPDIR/cp.sha")" ]
  [ "$(sha_in_root /bin/tar)" = "$(cat "$BATS_FILE_TMPDIR/tar.sha")" ]
  [ ! -e "$ROOT/usr/bin/cp.gnu" ] && [ ! -e "$ROOT/usr/bin/tar.gnu" ]
  [ "$(in_root sha256sum /usr/share/man/man1/cp.1.gz /usr/share/man/man1/tar.1.gz)" = \
    "$(cat "$BATS_FILE_TMPDIR/man.sha")" ]
  [ -z "$(find "$ROOT/usr/share/man/man1" -name '*.gnu.1.gz')" ]
  [ -z "$(in_root dpkg-divert --list 'bfo-as-default')" ]
  [ "$(in_root dpkg -S /bin/cp)" = "coreutils: /bin/cp" ]
  [ "$(in_root dpkg -S /bin/tar)" = "tar: /bin/tar" ]
  in_root dpkg --verify coreutils tar
  [[ $(in_root cp --version) != *bfo* ]]
  [[ $(in_root tar --version) != *bfo* ]]
}

@test "make deb built libbfo0, libbfo-dev, bfo and bfo-as-default with their files and relations" {
  for p in libbfo0_*_"$arch" libbfo-dev_*_"$arch" bfo_*_"$arch" bfo-as-default_*_all; do
    ls "$DEB_DIR"/$p.deb
  done
  [[ $VERSION == "$PACKAGE_VERSION"-* ]]
  dpkg-deb -c "$DEB_DIR"/bfo_*_"$arch".deb > "$BATS_TEST_TMPDIR/bfo"
  for f in usr/bin/bfocp usr/bin/bfotar usr/bin/bfo usr/share/man/man1/bfocp.1.gz \
           usr/share/man/man1/bfotar.1.gz usr/share/man/man8/bfo.8.gz usr/share/doc/bfo/copyright; do
    grep -q " \./$f\$" "$BATS_TEST_TMPDIR/bfo" || { echo "bfo lacks $f"; false; }
  done
  dpkg-deb -c "$DEB_DIR"/libbfo-dev_*.deb > "$BATS_TEST_TMPDIR/dev"
  for f in usr/include/bfo.h "usr/lib/[^ ]*/libbfo\.a" "usr/lib/[^ ]*/libbfo\.so -> libbfo\.so\.0\.0\.0" \
           "usr/lib/[^ ]*/pkgconfig/bfo\.pc" usr/share/man/man3/libbfo.3.gz; do
    grep -q " \./$f\$" "$BATS_TEST_TMPDIR/dev" || { echo "libbfo-dev lacks $f"; false; }
  done
  dpkg-deb -c "$DEB_DIR"/libbfo0_*.deb | grep -q ' \./usr/lib/[^ ]*/libbfo\.so\.0\.0\.0$'
  dpkg-deb -c "$DEB_DIR"/bfo-as-default_*.deb > "$BATS_TEST_TMPDIR/def"
  grep -q ' \./bin/cp -> /usr/bin/bfocp$' "$BATS_TEST_TMPDIR/def"
  grep -q ' \./bin/tar -> /usr/bin/bfotar$' "$BATS_TEST_TMPDIR/def"
  grep -q ' \./usr/share/man/man1/cp\.1\.gz -> bfocp\.1\.gz$' "$BATS_TEST_TMPDIR/def"
  grep -q ' \./usr/share/man/man1/tar\.1\.gz -> bfotar\.1\.gz$' "$BATS_TEST_TMPDIR/def"
  # Relations: found by dpkg-shlibdeps, and bfo-as-default tied to this very bfo.
  dpkg-deb -f "$DEB_DIR"/bfo_*_"$arch".deb Depends | grep -q "libbfo0 (>= 0\.1\.0)"
  dpkg-deb -f "$DEB_DIR"/bfo_*_"$arch".deb Depends | grep -q "liburing2"
  [ "$(dpkg-deb -f "$DEB_DIR"/bfo-as-default_*.deb Pre-Depends)" = "bfo (>= $VERSION)" ]
  [ "$(dpkg-deb -f "$DEB_DIR"/bfo-as-default_*.deb Depends)" = "bfo (<< $VERSION.1~)" ]
  dpkg-deb -I "$DEB_DIR"/libbfo0_*.deb symbols | grep -q '^ bfo_reader_open@Base 0\.1\.0$'
}

@test "lintian finds no errors in the packages" {
  run lintian --fail-on error "$DEB_DIR"/*.deb
  echo "$output"
  [ "$status" -eq 0 ]
  [[ $output != *"E: "* ]]
}

@test "the throw-away root starts with stock GNU cp and tar" {
  [ "$(in_root readlink -f /bin/cp)" = /usr/bin/cp ]
  in_root cp --version | head -n 1 | grep -qx 'cp (GNU coreutils) 9\.1'
  in_root tar --version | head -n 1 | grep -qx 'tar (GNU tar) 1\.34'
  sha_in_root /bin/cp > "$BATS_FILE_TMPDIR/cp.sha"
  sha_in_root /bin/tar > "$BATS_FILE_TMPDIR/tar.sha"
  in_root sha256sum /usr/share/man/man1/cp.1.gz /usr/share/man/man1/tar.1.gz > "$BATS_FILE_TMPDIR/man.sha"
  [ -z "$(in_root dpkg-divert --list '*bfo*')" ]
}

@test "bfo-as-default cannot be installed before bfo (pre-dependency); cp stays GNU's" {
  run in_root dpkg -i /debs/bfo-as-default_"$VERSION"_all.deb
  echo "$output"
  [ "$status" -ne 0 ]
  [[ $output == *"pre-depends on bfo"* ]]
  in_root dpkg -P bfo-as-default
  assert_gnu_is_back
}

@test "installing libbfo0, bfo and bfo-as-default makes cp and tar the bfo programs" {
  in_root apt-get install -y -q --no-install-recommends /debs/libbfo0_"$VERSION"_"$arch".deb \
    /debs/bfo_"$VERSION"_"$arch".deb /debs/bfo-as-default_"$VERSION"_all.deb
  assert_bfo_is_default
  in_root dpkg -S /bin/cp | grep -qx 'diversion by bfo-as-default from: /bin/cp'
  in_root dpkg -S /bin/cp | grep -q '^[^:]*bfo-as-default[^:]*: /bin/cp$'
  # cp's messages are GNU's under its own name; tar's compiled-in defaults are Debian's
  run in_root cp /nonexistent /tmp/x
  [ "$status" -eq 1 ]
  [ "$output" = "cp: cannot stat '/nonexistent': No such file or directory" ]
  [ "$(in_root tar --show-defaults)" = "$(in_root tar.gnu --show-defaults)" ]
  in_root dpkg --verify coreutils tar bfo bfo-as-default libbfo0
  in_root bfo --version | grep -q "libbfo $PACKAGE_VERSION"
}

@test "dpkg builds, unpacks and installs packages with bfotar as tar" {
  in_root sh -ec '
    rm -rf /tmp/pkg && mkdir -p /tmp/pkg/DEBIAN /tmp/pkg/usr/share/bfo-hello
    printf "Package: bfo-hello\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.org>\nDescription: test\n a test package\n" > /tmp/pkg/DEBIAN/control
    seq 1 1000 > /tmp/pkg/usr/share/bfo-hello/numbers
    dpkg-deb --root-owner-group --build /tmp/pkg /tmp/bfo-hello.deb
    dpkg-deb -x /tmp/bfo-hello.deb /tmp/unpacked
    cmp /tmp/pkg/usr/share/bfo-hello/numbers /tmp/unpacked/usr/share/bfo-hello/numbers
    dpkg -i /tmp/bfo-hello.deb
    cmp /tmp/pkg/usr/share/bfo-hello/numbers /usr/share/bfo-hello/numbers
    dpkg -P bfo-hello
    test ! -e /usr/share/bfo-hello'
  # and a Debian package, through apt
  in_root apt-get install -y -q --no-install-recommends hello
  in_root hello | grep -qx 'Hello, world!'
  in_root apt-get purge -y -q hello
}

# One line per entry: path, type, mode, owner, group, link target, mtime; for files
# also size, link count and contents.
root_manifest() {
  (cd "$1" && find . -printf '%P\t%y\t%m\t%U\t%G\t%l\t%T@\n' | LC_ALL=C sort > "$2.meta" &&
   find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r stat -c '%n %s %h' > "$2.size" &&
   find . -type f -printf '%P\0' | LC_ALL=C sort -z | xargs -0 -r sha256sum > "$2.sha")
  cat "$2.meta" "$2.size" "$2.sha" > "$2"
}

@test "cp -a of /etc with cp (bfocp) matches cp.gnu -a" {
  in_root rm -rf /tmp/etc-bfo /tmp/etc-gnu
  in_root cp -a /etc /tmp/etc-bfo
  in_root cp.gnu -a /etc /tmp/etc-gnu
  root_manifest "$ROOT/tmp/etc-bfo" "$BATS_TEST_TMPDIR/bfo"
  root_manifest "$ROOT/tmp/etc-gnu" "$BATS_TEST_TMPDIR/gnu"
  [ "$(wc -l < "$BATS_TEST_TMPDIR/gnu.meta")" -gt 100 ]
  diff "$BATS_TEST_TMPDIR/gnu" "$BATS_TEST_TMPDIR/bfo"
  # and tar (bfotar) carries the copy through a pipe unchanged
  in_root sh -ec 'mkdir /tmp/etc-tar && tar -C /tmp/etc-bfo -cf - . | tar -C /tmp/etc-tar -xpf -'
  diff -r --no-dereference "$ROOT/tmp/etc-gnu" "$ROOT/tmp/etc-tar"
  in_root rm -rf /tmp/etc-bfo /tmp/etc-gnu /tmp/etc-tar
}

@test "reinstalling the coreutils and tar packages while diverted updates cp.gnu and tar.gnu only" {
  in_root sh -ec 'mkdir -p /tmp/up && cd /tmp/up && apt-get download -q \
    coreutils=$(dpkg-query -W -f "\${Version}" coreutils) tar=$(dpkg-query -W -f "\${Version}" tar)'
  cp_ino=$(stat -c %i "$ROOT/usr/bin/cp.gnu")
  tar_ino=$(stat -c %i "$ROOT/usr/bin/tar.gnu")
  in_root sh -c 'dpkg -i /tmp/up/coreutils_*.deb /tmp/up/tar_*.deb'
  # dpkg wrote new files (new inodes) under the diverted names, same contents
  [ "$(stat -c %i "$ROOT/usr/bin/cp.gnu")" != "$cp_ino" ]
  [ "$(stat -c %i "$ROOT/usr/bin/tar.gnu")" != "$tar_ino" ]
  assert_bfo_is_default
  [ -z "$(find "$ROOT/usr/bin" -name '*.dpkg-*')" ]
  in_root dpkg --verify coreutils tar
}

@test "reinstalling bfo-as-default (an upgrade) keeps the diversions" {
  in_root dpkg -i /debs/bfo-as-default_"$VERSION"_all.deb
  assert_bfo_is_default
}

@test "bfo cannot be removed from under bfo-as-default; apt removes both and GNU's programs return" {
  run in_root dpkg -r bfo
  echo "$output"
  [ "$status" -ne 0 ]
  [[ $output == *"bfo-as-default"* ]]
  assert_bfo_is_default
  # apt takes bfo-as-default away first
  in_root apt-get remove -y -q bfo
  [ "$(pkg_status bfo-as-default)" != installed ]
  [ "$(pkg_status bfo)" != installed ]
  assert_gnu_is_back
  in_root apt-get install -y -q --no-install-recommends /debs/bfo_"$VERSION"_"$arch".deb \
    /debs/bfo-as-default_"$VERSION"_all.deb
  assert_bfo_is_default
}

@test "removing, then purging bfo-as-default puts GNU cp and tar back byte for byte" {
  in_root dpkg -r bfo-as-default
  assert_gnu_is_back
  in_root dpkg -P bfo-as-default
  assert_gnu_is_back
  [ "$(pkg_status bfo-as-default)" = not-installed ]
  # bfo itself stays usable beside GNU's programs, then goes too
  in_root bfocp --version | grep -q '^bfocp: a bfo build'
  in_root dpkg -P bfo libbfo0
  [ ! -e "$ROOT/usr/bin/bfocp" ]
  assert_gnu_is_back
}

@test "the host's cp, tar and diversions were not touched" {
  host_state | diff "$BATS_FILE_TMPDIR/host-before" -
}
