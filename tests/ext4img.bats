#!/usr/bin/env bats
# ext4img.bats: the ext4 image backend (bfo mkimage, bfo write IMG:/dir, bfo plan --write):
# results equal to the source and to mke2fs -d, e2fsck -fn clean on every feature variant,
# refusals (mounted, non-root on a device), ENOSPC, large files, many files, crashes.

bats_require_minimum_version 1.5.0
load helpers/common
load helpers/loop

setup() {
  T=$BATS_TEST_TMPDIR
  SRC=$T/src
}

teardown() {
  loop_cleanup_all
}

# new_image IMG SIZE_MB [mkfs.ext4 options...]: an empty ext4 image file.
new_image() {
  local img=$1 size=$2
  shift 2
  truncate -s "${size}M" "$img"
  mkfs.ext4 -q -F "$@" "$img"
}

# img_manifest DIR [sec]: one line per entry below DIR (lost+found aside): path, type,
# mode, owner, size, link count, mtime and atime in nanoseconds (with 'sec': mtime in
# seconds, no atime), content hash (read with O_NOATIME) or symlink target.
img_manifest() {
  python3 - "$1" "${2:-ns}" <<'PY'
import hashlib, os, stat, sys
root, res = sys.argv[1], sys.argv[2]
def t(ns):
    return str(ns // 10**9) if res == "sec" else "%d.%09d" % divmod(ns, 10**9)
out = []
for d, dirs, files in os.walk(root):
    if d == root and "lost+found" in dirs:
        dirs.remove("lost+found")
    for name in dirs + files:
        p = os.path.join(d, name)
        st = os.lstat(p)
        rel = "./" + os.path.relpath(p, root)
        own = "%d %d" % (st.st_uid, st.st_gid)
        if stat.S_ISLNK(st.st_mode):
            out.append((rel, "%s link %s %s %s" % (rel, own, t(st.st_mtime_ns), os.readlink(p))))
        elif stat.S_ISREG(st.st_mode):
            h = hashlib.sha256()
            fd = os.open(p, os.O_RDONLY | os.O_NOATIME)
            while True:
                b = os.read(fd, 1 << 20)
                if not b:
                    break
                h.update(b)
            os.close(fd)
            at = "" if res == "sec" else " " + t(st.st_atime_ns)
            out.append((rel, "%s file %o %s %d %d %s%s %s" % (rel, stat.S_IMODE(st.st_mode), own,
                        st.st_size, st.st_nlink, t(st.st_mtime_ns), at, h.hexdigest()[:16])))
        elif stat.S_ISDIR(st.st_mode):
            out.append((rel, "%s dir %o %s %s" % (rel, stat.S_IMODE(st.st_mode), own,
                                                  t(st.st_mtime_ns))))
        else:
            kind = ("chr" if stat.S_ISCHR(st.st_mode) else "blk" if stat.S_ISBLK(st.st_mode)
                    else "fifo" if stat.S_ISFIFO(st.st_mode) else "sock")
            at = "" if res == "sec" else " " + t(st.st_atime_ns)
            out.append((rel, "%s %s %o %s %d:%d %d %s%s" % (rel, kind, stat.S_IMODE(st.st_mode), own,
                        os.major(st.st_rdev), os.minor(st.st_rdev), st.st_nlink,
                        t(st.st_mtime_ns), at)))
def xattrs(rel):
    p = os.path.join(root, rel)
    names = sorted(os.listxattr(p, follow_symlinks=False))
    return ",".join("%s=%s" % (n, os.getxattr(p, n, follow_symlinks=False).hex()) for n in names)
for rel, line in sorted(out, key=lambda x: x[0].encode()):
    x = xattrs(rel)
    print(line + (" xattrs " + x if x else ""))
PY
}

# Read every file under DIR once: with relatime the first read after a write moves
# the atime, so a manifest (which reads) would change what it describes.  bfo reads
# with O_NOATIME.
settle_atimes() {
  find "$1" -type f -exec cat {} + > /dev/null
}

fsck_clean() {
  run e2fsck -fn "$1"
  echo "$output"
  [ "$status" -eq 0 ]
}

stat_of() { sed -n "s/.* $1=\([0-9a-z]*\).*/\1/p" <<< "$2"; }

# A sample tree without special files: owners, modes, nanosecond times, a hard link.
sample_tree() {
  make_sample_tree "$1"
  # devices (one number beyond the old 8-bit form), a fifo and a second name of a device
  mkdir "$1/dev"
  mknod -m 620 "$1/dev/null" c 1 3
  mknod "$1/dev/big" c 300 70000
  mknod -m 660 "$1/dev/sda" b 8 0
  chown 0:6 "$1/dev/sda"
  ln "$1/dev/null" "$1/dev/null-again"
  # extended attributes: user and trusted ones, an access and a default ACL, one
  # too big for the inode (the block holds it), on a file, directories, a symlink
  # and a device
  setfattr -n user.color -v blue "$1/a.txt"
  setfattr -n user.long -v "$(head -c 700 /dev/zero | tr '\0' x)" "$1/a.txt"
  setfacl -m u:nobody:r,g:daemon:rw "$1/a.txt"
  setfacl -d -m u:nobody:rx "$1/sub"
  setfattr -n user.dir -v 1 "$1/sub/deeper"
  setfattr -n trusted.t -v 0x00ff "$1/link-to-a"
  setfattr -n trusted.d -v 0x01 "$1/dev/big"
  touch -h -d '2001-02-03 04:05:06.7' "$1/dev/big" "$1/fifo"
  chown 1234:5678 "$1/sub/random.bin"
  chown 99999:4242 "$1/sub/deeper"
  chmod 2750 "$1/sub/deeper"
  chown -h 7:8 "$1/link-to-a"
  touch -h -d '2010-01-01 00:00:00.5' "$1/link-to-a"
  touch -d '1999-12-31 23:59:59.999999999' "$1/sub/deeper/numbers" "$1/empty-dir"
  touch -d '2040-06-01 12:00:00.25' "$1/empty"
  settle_atimes "$1"
}

@test "bfo mkimage: the same files, contents, modes, owners and times as the source and as mke2fs -d" {
  require_root_loop
  sample_tree "$SRC"
  setfattr -n user.root -v top "$SRC"
  new_image "$T/mke2fs.img" 64 -d "$SRC"
  new_image "$T/bfo.img" 64
  run --separate-stderr "$BFO" mkimage --stats "$T/bfo.img" "$SRC"
  echo "$stderr"
  [ "$status" -eq 0 ]
  [ "$(stat_of errors "$stderr")" = 0 ]
  [ "$(stat_of links "$stderr")" = 2 ]
  fsck_clean "$T/bfo.img"
  img_manifest "$SRC" > "$T/src.txt"
  img_manifest "$SRC" sec > "$T/src-sec.txt"
  mount_image "$T/bfo.img" "$T/m-bfo"
  mount_image "$T/mke2fs.img" "$T/m-mke2fs"
  img_manifest "$T/m-bfo" > "$T/bfo.txt"
  img_manifest "$T/m-bfo" sec > "$T/bfo-sec.txt"
  img_manifest "$T/m-mke2fs" sec > "$T/mke2fs-sec.txt"
  # Exactly the source, to the nanosecond (atimes as they are after both tools read
  # the source); and what mke2fs -d makes, which keeps whole seconds, takes atimes
  # from before its own reads, and (1.47.0) stores a time after 2038 without the
  # epoch bits: ./empty (2040) is compared with the source only.
  diff "$T/src.txt" "$T/bfo.txt"
  diff <(grep -v '^\./empty ' "$T/mke2fs-sec.txt") <(grep -v '^\./empty ' "$T/bfo-sec.txt")
  diff "$T/src-sec.txt" "$T/bfo-sec.txt"
  [ "$(stat -c '%a %u %g %.9Y' "$SRC")" = "$(stat -c '%a %u %g %.9Y' "$T/m-bfo")" ]
  [ "$(getfattr --only-values -n user.root "$T/m-bfo")" = top ]
  [ "$(stat -c %i "$T/m-bfo/a.txt")" = "$(stat -c %i "$T/m-bfo/sub/hardlink-to-a")" ]
}

@test "bfo mkimage on feature variants (no metadata_csum, no 64bit, no huge_file, inline_data, 1 KiB blocks): e2fsck clean, exact" {
  require_root_loop
  sample_tree "$SRC"
  mkdir -p "$SRC/many"
  for i in $(seq 1 700); do printf '%s\n' "$i" > "$SRC/many/file-with-a-longer-name-$i"; done
  head -c 3M /dev/urandom > "$SRC/three-mib"
  settle_atimes "$SRC"
  img_manifest "$SRC" > "$T/src.txt"
  local i=0 opts
  for opts in "-O ^metadata_csum" "-O ^metadata_csum,^64bit" "-O ^huge_file,^dir_index" \
              "-O metadata_csum,64bit,huge_file" "-O inline_data" "-b 1024"; do
    i=$((i + 1))
    # shellcheck disable=SC2086
    new_image "$T/v$i.img" 64 $opts
    run "$BFO" mkimage "$T/v$i.img" "$SRC"
    echo "$opts: $output"
    [ "$status" -eq 0 ]
    fsck_clean "$T/v$i.img"
    mount_image "$T/v$i.img" "$T/m$i"
    img_manifest "$T/m$i" > "$T/got$i.txt"
    umount_image "$T/m$i"
    diff "$T/src.txt" "$T/got$i.txt"
  done
}

@test "bfo mkimage: holes stay holes (the source's data map, mke2fs -d's on 4 KiB blocks), 4 and 1 KiB blocks" {
  require_root_loop
  sparse_tree "$SRC"
  settle_atimes "$SRC"
  data_map "$SRC" > "$T/src.map"
  cat "$T/src.map"
  grep -q '^s/all-hole 10485760 none$' "$T/src.map"
  img_manifest "$SRC" > "$T/src.txt"
  new_image "$T/mke2fs.img" 512 -d "$SRC"
  mount_image "$T/mke2fs.img" "$T/m-mke2fs"
  data_map "$T/m-mke2fs" > "$T/mke2fs.map"
  umount_image "$T/m-mke2fs"
  local b
  for b in 4096 1024; do
    new_image "$T/bfo-$b.img" 512 -b $b
    run --separate-stderr "$BFO" mkimage --stats "$T/bfo-$b.img" "$SRC"
    echo "$stderr"
    [ "$status" -eq 0 ]
    fsck_clean "$T/bfo-$b.img"
    mount_image "$T/bfo-$b.img" "$T/m-$b"
    data_map "$T/m-$b" > "$T/bfo-$b.map"
    img_manifest "$T/m-$b" > "$T/bfo-$b.txt"
    umount_image "$T/m-$b"
    diff "$T/src.txt" "$T/bfo-$b.txt"
    diff "$T/src.map" "$T/bfo-$b.map"
  done
  diff "$T/mke2fs.map" "$T/bfo-4096.map"
  # blocks only for the data: 43 MiB of data plus a few blocks, not 250 MiB
  [ "$(debugfs -R 'stat /s/large' "$T/bfo-4096.img" 2>/dev/null | sed -n 's/.*Blockcount: \([0-9]*\).*/\1/p')" -le $((44 * 2048)) ]
}

@test "thousands of files, a 40-level tree, 255-byte and unicode names, hard-link groups" {
  require_root_loop
  local i d
  for i in $(seq 1 20); do
    mkdir -p "$SRC/small/d$i"
    head -c $((i * 40000)) /dev/urandom | split -b $((i * 97)) -a 3 - "$SRC/small/d$i/f"
  done
  mkdir -p "$SRC/flat"
  for i in $(seq 1 3000); do : > "$SRC/flat/entry-number-$i"; done
  d=$SRC
  for i in $(seq 1 40); do d=$d/level-$i-abcdefghijklmnop; done
  mkdir -p "$d"
  printf 'deep\n' > "$d/leaf"
  printf 'long\n' > "$SRC/$(printf 'L%.0s' $(seq 1 255))"
  mkdir -p "$SRC/ünïcödé dir"
  printf 'unicode\n' > "$SRC/ünïcödé dir/日本語 ✓ ñame.txt"
  head -c 7777 /dev/urandom > "$SRC/ünïcödé dir/Ελληνικά"
  for i in 1 2 3; do ln "$SRC/ünïcödé dir/Ελληνικά" "$SRC/small/link-$i"; done
  [ "$(find "$SRC" -type f | wc -l)" -gt 5000 ]
  settle_atimes "$SRC"
  new_image "$T/img" 256
  run --separate-stderr "$BFO" mkimage --stats --batch-files 1000 "$T/img" "$SRC"
  echo "$stderr" | tail -3
  [ "$status" -eq 0 ]
  [ "$(stat_of links "$stderr")" = 3 ]
  [ "$(stat_of batches "$stderr")" -gt 5 ]
  fsck_clean "$T/img"
  img_manifest "$SRC" > "$T/want"
  mount_image "$T/img" "$T/m"
  img_manifest "$T/m" > "$T/got"
  diff "$T/want" "$T/got"
}

@test "a 1 GiB file: byte-identical, few extents, e2fsck clean" {
  require_root_loop
  mkdir -p "$SRC"
  # Fast non-repeating data: AES-CTR keystream if openssl is there, else urandom.
  if command -v openssl >/dev/null; then
    head -c 1G /dev/zero | openssl enc -aes-128-ctr -K 00112233445566778899aabbccddeeff \
      -iv 0 -nosalt 2>/dev/null > "$SRC/one-gib"
  else
    head -c 1G /dev/urandom > "$SRC/one-gib"
  fi
  printf 'small\n' > "$SRC/small"
  [ "$(stat -c %s "$SRC/one-gib")" -eq $((1 << 30)) ]
  want=$(sha256sum < "$SRC/one-gib")
  new_image "$T/img" 1400
  run --separate-stderr "$BFO" mkimage --stats --dir /data/in "$T/img" "$SRC"
  echo "$stderr"
  [ "$status" -eq 0 ]
  [ "$(stat_of bytes "$stderr")" -eq $(( (1 << 30) + 6 )) ]
  rm -f "$SRC/one-gib"              # room for the disk
  fsck_clean "$T/img"
  mount_image "$T/img" "$T/m"
  [ "$(stat -c %s "$T/m/data/in/one-gib")" -eq $((1 << 30)) ]
  [ "$(sha256sum < "$T/m/data/in/one-gib")" = "$want" ]
  [ "$(cat "$T/m/data/in/small")" = small ]
  # Contiguous: 8 extents of 128 MiB (the largest ext4 extent) on a fresh image.
  run filefrag "$T/m/data/in/one-gib"
  echo "$output"
  [[ "$output" =~ :\ ([0-9]+)\ extents? ]] && [ "${BASH_REMATCH[1]}" -le 12 ]
}

@test "a mounted image, or one attached to a loop device, is refused with a clear message" {
  require_root_loop
  mkdir -p "$SRC"; echo x > "$SRC/x"
  new_image "$T/img" 32
  records=$(_loop_records)
  printf 'image\t%s\n' "$T/img" >> "$records"
  dev=$(losetup --find --show "$T/img")
  printf 'mount\t%s\t%s\n' "$T/m" "$dev" >> "$records"
  mkdir -p "$T/m"
  mount "$dev" "$T/m"
  run "$BFO" mkimage "$T/img" "$SRC"
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"cannot write into '$T/img': it is mounted"* ]]
  run "$BFO" write --backend ext4img "$SRC" "$T/img:/dst"
  [ "$status" -eq 1 ]
  [[ "$output" == *"it is mounted"* ]]
  run "$BFO" mkimage "$dev" "$SRC"
  [ "$status" -eq 1 ]
  [[ "$output" == *"it is mounted"* ]]
  run "$BFO" plan --write "$T/img:/dst"
  [ "$status" -eq 1 ]
  [[ "$output" == *"backend:     none"* ]]
  [ ! -e "$T/m/x" ]
  umount "$T/m"
  # Attached but not mounted: still refused (a mount could come at any time).
  run "$BFO" mkimage "$T/img" "$SRC"
  [ "$status" -eq 1 ]
  [[ "$output" == *"attached to a loop device"* ]]
  losetup -d "$dev"
  fsck_clean "$T/img"
}

@test "a block device needs root; an image file only needs write permission" {
  require_root_loop
  # nobody must reach the files through bats' private temp directories.
  d=$T
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
  mkdir -p "$SRC/sub"; echo hi > "$SRC/sub/x"; chmod -R a+rX "$SRC"
  mknod "$SRC/sub/null" c 1 3
  new_image "$T/img" 32
  records=$(_loop_records)
  printf 'image\t%s\n' "$T/img" >> "$records"
  dev=$(losetup --find --show "$T/img")
  chmod 0666 "$dev"                 # even a device nobody may write is root's business
  run setpriv --reuid=nobody --regid=nogroup --clear-groups "$BFO" mkimage "$dev" "$SRC"
  echo "$output"
  [ "$status" -eq 1 ]
  [[ "$output" == *"cannot write into '$dev': writing the file system of a block device needs root"* ]]
  # Root writes through the device.
  run "$BFO" mkimage "$dev" "$SRC"
  echo "$output"
  [ "$status" -eq 0 ]
  chmod 0660 "$dev"
  losetup -d "$dev"
  fsck_clean "$T/img"
  # An image file nobody owns: nobody may fill it; one nobody cannot write: refused.
  new_image "$T/own.img" 32
  chown nobody "$T/own.img"
  run setpriv --reuid=nobody --regid=nogroup --clear-groups "$BFO" mkimage "$T/own.img" "$SRC"
  echo "$output"
  [ "$status" -eq 0 ]
  fsck_clean "$T/own.img"
  # devices are made in an image whoever fills it, as mke2fs -d makes them
  debugfs -R 'stat /sub/null' "$T/own.img" 2>/dev/null > "$T/null.stat"
  grep -q 'Type: character special' "$T/null.stat"
  grep -q 'Device major/minor number: 01:03' "$T/null.stat"
  chown root "$T/own.img"; chmod 0644 "$T/own.img"
  run setpriv --reuid=nobody --regid=nogroup --clear-groups "$BFO" mkimage "$T/own.img" "$SRC"
  [ "$status" -eq 1 ]
  [[ "$output" == *"Permission denied"* ]]
}

@test "ENOSPC on a small image: what fits is complete, the rest absent and reported, e2fsck clean" {
  require_root_loop
  mkdir -p "$SRC/a" "$SRC/b"
  for i in $(seq 1 12); do head -c 1M /dev/urandom > "$SRC/a/m$i"; done
  for i in $(seq 1 300); do head -c $((i * 13)) /dev/urandom > "$SRC/b/s$i"; done
  settle_atimes "$SRC"
  new_image "$T/img" 12 -m 0
  run --separate-stderr "$BFO" mkimage --stats --batch-files 50 "$T/img" "$SRC"
  echo "$stderr" | tail -5
  [ "$status" -eq 1 ]
  [[ "$stderr" == *"No space left on device"* ]]
  fsck_clean "$T/img"
  img_manifest "$SRC" | grep ' file ' > "$T/want"
  mount_image "$T/img" "$T/m"
  img_manifest "$T/m" | grep ' file ' > "$T/got"
  # Everything present is exactly the source; something fitted, something did not.
  [ -z "$(LC_ALL=C comm -13 "$T/want" "$T/got")" ]
  [ "$(wc -l < "$T/got")" -gt 10 ]
  [ -n "$(LC_ALL=C comm -23 "$T/want" "$T/got")" ]
  LC_ALL=C comm -23 "$T/want" "$T/got" | cut -d' ' -f1 | while IFS= read -r p; do
    grep -qF "'${p#./}'" <<< "$stderr" || { echo "not reported: $p"; false; }
  done
}

@test "bfo write IMG:/dir: a tree into a directory of an image, existing files replaced and their blocks freed" {
  require_root_loop
  mkdir -p "$SRC/d/e"
  head -c 300000 /dev/urandom > "$SRC/d/big"
  printf 'one\n' > "$SRC/d/e/one"
  new_image "$T/img" 64
  run "$BFO" write --stats "$SRC" "$T/img:/into/here"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"backend=ext4img"* ]]
  free1=$(dumpe2fs -h "$T/img" 2>/dev/null | sed -n 's/^Free blocks: *//p')
  # Again with other contents of the same sizes: replaced, nothing leaked.
  head -c 300000 /dev/urandom > "$SRC/d/big"
  printf 'two\n' > "$SRC/d/e/one"
  run "$BFO" write "$SRC" "$T/img:/into/here"
  [ "$status" -eq 0 ]
  free2=$(dumpe2fs -h "$T/img" 2>/dev/null | sed -n 's/^Free blocks: *//p')
  [ "$free1" = "$free2" ]
  fsck_clean "$T/img"
  tree_manifest "$SRC" > "$T/want"
  mount_image "$T/img" "$T/m"
  tree_manifest "$T/m/into/here" > "$T/got"
  diff "$T/want" "$T/got"
}

@test "bfo plan --write names the backend and why" {
  require_root_loop
  new_image "$T/img" 32
  run "$BFO" plan --write "$T/img:/"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"backend:     ext4img"* ]]
  run "$BFO" plan --write "$T/img:/missing"
  [ "$status" -eq 1 ]
  [[ "$output" == *"No such file or directory"* ]]
  make_fs ext4 "$T/ext4" 256
  run "$BFO" plan --write "$T/ext4"
  echo "$output"
  [ "$status" -eq 0 ]
  [[ "$output" == *"file system: ext2/ext3/ext4 (statfs type 0xef53)"* ]]
  [[ "$output" == *"backend:     ordered"* ]]
  [ -z "$(ls -A "$T/ext4" | grep -v lost+found)" ]
  if command -v mkfs.xfs >/dev/null; then
    loop_cleanup_all
    make_fs xfs "$T/xfs" 512
    run "$BFO" plan --write "$T/xfs"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"backend:     reflink"* ]]
    # a DST not made yet (bfo write makes it): planned in its parent
    run "$BFO" plan --write "$T/xfs/new/"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"destination: $T/xfs/new/ (not there yet: bfo write makes it in $T/xfs)"* ]]
    [[ "$output" == *"backend:     reflink"* ]]
    [ ! -e "$T/xfs/new" ]
    [ -z "$(ls -A "$T/xfs")" ]
    run "$BFO" plan --write "$T/xfs/new/deeper"
    [ "$status" -eq 1 ]
  fi
  if command -v mkfs.btrfs >/dev/null; then
    loop_cleanup_all
    make_fs btrfs "$T/btrfs" 512
    run "$BFO" plan --write "$T/btrfs"
    echo "$output"
    [ "$status" -eq 0 ]
    [[ "$output" == *"backend:     ordered"*"Btrfs frees an extent only when no file refers to any of it"* ]]
  fi
}

@test "kill -9 in the middle of mkimage, 30 trials: flagged unclean; after e2fsck -fy every file is complete or absent" {
  require_root_loop
  local i trial lo full start delay state rc pct
  # ~1900 files of 4-13 KiB (about 16 MiB) in 24 directories: cheap trials, 30 batches.
  for i in $(seq 1 24); do
    mkdir -p "$SRC/d$i"
    head -c $((i * 28000)) /dev/urandom | split -b $((4096 + i * 311)) -a 3 - "$SRC/d$i/f"
  done
  settle_atimes "$SRC"
  img_manifest "$SRC" | grep ' file ' > "$T/want"
  local nwant
  nwant=$(wc -l < "$T/want")
  # Kills land between the end of start-up (opening the image: a run on an empty tree)
  # and the end of a whole run.
  mkdir "$T/empty"
  new_image "$T/img" 64
  start=$(date +%s%N)
  "$BFO" mkimage "$T/img" "$T/empty"
  lo=$(( ($(date +%s%N) - start) / 1000000 ))
  new_image "$T/img" 64
  start=$(date +%s%N)
  "$BFO" mkimage --batch-files 64 "$T/img" "$SRC"
  full=$(( ($(date +%s%N) - start) / 1000000 + 10 ))
  [ "$lo" -lt "$full" ] || lo=0
  # Where the kills landed: 'finished' (image clean), 'consistent' (e2fsck -fy fixed
  # nothing but the flag: between batches or while a batch's data went to free blocks),
  # 'repaired' (inside a batch's metadata pass or its flush); and how far the run had got.
  local finished=0 consistent=0 repaired=0 progress=
  # 30 kills, and more (up to 90) until 5 landed inside the run: on a loaded
  # machine a run's length varies and more kills may come after its end.
  trial=0
  while [ "$trial" -lt 30 ] || { [ $((consistent + repaired)) -lt 5 ] && [ "$trial" -lt 90 ]; }; do
    trial=$((trial + 1))
    new_image "$T/img" 64
    delay=$(( lo + RANDOM * (full - lo) / 32768 ))
    "$BFO" mkimage --batch-files 64 "$T/img" "$SRC" 2>/dev/null &
    pid=$!
    sleep "$(printf '%d.%03d' $((delay / 1000)) $((delay % 1000)))"
    kill -9 "$pid" 2>/dev/null || true
    wait "$pid" || true
    # The image says it was not cleanly unmounted (unless mkimage finished first).
    state=$(dumpe2fs -h "$T/img" 2>/dev/null | sed -n 's/^Filesystem state: *//p')
    if [ "$state" != clean ]; then
      # Nobody writes into it again before a check.
      run "$BFO" mkimage "$T/img" "$SRC"
      [ "$status" -eq 1 ]
      [[ "$output" == *"needs a check first"* ]]
    fi
    rc=0
    e2fsck -fy "$T/img" > "$T/fsck.out" 2>&1 || rc=$?
    [ "$rc" -le 1 ] || { echo "trial $trial (kill at $delay ms): e2fsck -fy exit $rc"; cat "$T/fsck.out"; false; }
    fsck_clean "$T/img"
    mount_image "$T/img" "$T/m"
    img_manifest "$T/m" | grep ' file ' | grep -v '^./lost+found' > "$T/got" || true
    umount_image "$T/m"
    [ -z "$(LC_ALL=C comm -13 "$T/want" "$T/got")" ] ||
      { echo "trial $trial (kill at $delay ms, state $state, e2fsck $rc)"; LC_ALL=C comm -13 "$T/want" "$T/got" | head; false; }
    if [ "$state" = clean ]; then finished=$((finished + 1))
    elif ! grep -q '? yes$' "$T/fsck.out"; then consistent=$((consistent + 1))
    else repaired=$((repaired + 1)); fi
    pct=$(( $(wc -l < "$T/got") * 100 / nwant ))
    progress+=" $pct"
    rm -f "$T/img"
  done
  echo "# mkimage: $trial kills at $lo-$full ms: $finished finished, $consistent consistent," \
       "$repaired repaired by e2fsck; % of files present:$progress" >&3
  # Kills landed inside the run (not only after it), so e2fsck had work to check.
  [ $((consistent + repaired)) -ge 5 ]
}
