# loop.bash: bats helpers for tests on real file systems: loop images or tmpfs (load 'helpers/loop').
# Touches only what it made: images, loop devices, mounts are recorded for loop_cleanup_all.

# Where images and the record of what to undo live: the test's temp dir inside a test
# (setup/test/teardown), the file's temp dir in setup_file/teardown_file.  So a test's
# teardown cleans up the test's file systems and teardown_file those of setup_file.
_loop_scope_dir() {
  local d=${BATS_TEST_TMPDIR:-${BATS_FILE_TMPDIR:-}}
  if [ -z "$d" ] || [ ! -d "$d" ]; then
    echo "loop.bash: no bats temp dir (BATS_TEST_TMPDIR/BATS_FILE_TMPDIR); use these helpers from bats" >&2
    return 1
  fi
  printf '%s\n' "$d"
}

_loop_records() { printf '%s/loop-records\n' "$(_loop_scope_dir)"; }

_loop_fail() {
  echo "make_fs: $*" >&2
  return 1
}

# _loop_mkfs TYPE: the command that makes a TYPE (ext4, xfs, btrfs) file
# system quietly over whatever is there, in the caller's array mkfs.
_loop_mkfs() {
  case $1 in
    ext4) mkfs=(mkfs.ext4 -q -F) ;;
    xfs) mkfs=(mkfs.xfs -q -f) ;;
    btrfs) mkfs=(mkfs.btrfs -q -f) ;;
    *) return 1 ;;
  esac
}

# require_root_loop: skip the test (with the reason) unless we are root and can use loop devices.
require_root_loop() {
  local why=
  if [ "$(id -u)" -ne 0 ]; then
    why="not running as root"
  elif ! command -v losetup >/dev/null 2>&1; then
    why="losetup not found (util-linux)"
  elif ! command -v mount >/dev/null 2>&1 || ! command -v umount >/dev/null 2>&1; then
    why="mount/umount not found"
  elif ! command -v findmnt >/dev/null 2>&1; then
    why="findmnt not found (util-linux)"
  elif [ ! -e /dev/loop-control ] && ! ls /dev/loop[0-9]* >/dev/null 2>&1; then
    why="no /dev/loop-control or /dev/loopN (loop module missing?)"
  elif ! losetup --find >/dev/null 2>&1; then
    why="losetup --find finds no free loop device"
  fi
  if [ -n "$why" ]; then
    skip "needs root and loop devices: $why"
  fi
}

# make_fs TYPE MNTDIR [SIZE_MB] [mkfs options...]
#   TYPE ext4, xfs or btrfs: make a SIZE_MB (default 512) sparse image in the temp dir,
#   attach it to a free loop device (direct I/O when the kernel allows it), mkfs it with
#   the given options and mount it on MNTDIR (created; must be under the bats temp dirs).
#   TYPE tmpfs: mount a tmpfs of SIZE_MB on MNTDIR instead.
#   Env MOUNT_OPTS: extra mount options, e.g. MOUNT_OPTS=compress=zstd for btrfs.
#   Prints nothing on success; on failure says why on stderr and returns 1 (whatever was
#   already set up is recorded and left for loop_cleanup_all).
make_fs() {
  local type=${1:-} mnt=${2:-} size=512
  if [ -z "$type" ] || [ -z "$mnt" ]; then
    _loop_fail "usage: make_fs TYPE MNTDIR [SIZE_MB] [mkfs options...]"; return 1
  fi
  shift 2
  if [ $# -gt 0 ] && [[ $1 =~ ^[0-9]+$ ]]; then
    size=$1
    shift
  fi
  local scope records
  scope=$(_loop_scope_dir) || return 1
  records=$scope/loop-records

  mkdir -p "$mnt" || { _loop_fail "cannot create mount point '$mnt'"; return 1; }
  mnt=$(cd "$mnt" && pwd -P) || { _loop_fail "cannot resolve '$mnt'"; return 1; }
  local base ok=
  for base in "${BATS_TEST_TMPDIR:-}" "${BATS_FILE_TMPDIR:-}"; do
    [ -n "$base" ] && [ -d "$base" ] || continue
    base=$(cd "$base" && pwd -P)
    case $mnt/ in "$base"/?*) ok=1 ;; esac
  done
  [ -n "$ok" ] || { _loop_fail "mount point '$mnt' is not under the bats temp dir"; return 1; }
  if findmnt -n -M "$mnt" >/dev/null 2>&1; then
    _loop_fail "'$mnt' is already a mount point"; return 1
  fi

  local mkfs
  case $type in
    ext4|xfs|btrfs) _loop_mkfs "$type" ;;
    tmpfs)
      [ $# -eq 0 ] || { _loop_fail "tmpfs takes no mkfs options (got: $*)"; return 1; }
      local tag
      tag=$(mktemp "$scope/bfo-tmpfs.XXXXXX") || { _loop_fail "mktemp failed in '$scope'"; return 1; }
      tag=bfo-test-${tag##*/}
      # Record first: a mount that then fails is simply not found at cleanup.
      printf 'mount\t%s\t%s\n' "$mnt" "$tag" >> "$records"
      mount -t tmpfs -o "size=${size}m${MOUNT_OPTS:+,$MOUNT_OPTS}" "$tag" "$mnt" ||
        { _loop_fail "mount -t tmpfs on '$mnt' failed"; return 1; }
      return 0
      ;;
    *) _loop_fail "unknown file system type '$type' (ext4, xfs, btrfs or tmpfs)"; return 1 ;;
  esac
  command -v "${mkfs[0]}" >/dev/null 2>&1 ||
    { _loop_fail "${mkfs[0]} not found (install e2fsprogs, xfsprogs or btrfs-progs)"; return 1; }

  local img dev err
  img=$(mktemp "$scope/bfo-$type.XXXXXX.img") || { _loop_fail "mktemp failed in '$scope'"; return 1; }
  # Record the image before attaching it: cleanup detaches whatever loop device is
  # backed by this exact file, even one attached just before a failure.
  printf 'image\t%s\n' "$img" >> "$records"
  truncate -s "${size}M" "$img" || { _loop_fail "cannot size image '$img'"; return 1; }
  if ! dev=$(losetup --find --show --direct-io=on "$img" 2>/dev/null); then
    _loop_detach_image "$img" >/dev/null 2>&1
    dev=$(losetup --find --show "$img") || { _loop_fail "losetup --find --show '$img' failed"; return 1; }
  fi
  case $dev in
    /dev/loop[0-9]*) ;;
    *) _loop_fail "losetup returned '$dev', not a loop device"; return 1 ;;
  esac
  printf 'loop\t%s\t%s\n' "$dev" "$img" >> "$records"

  err=$("${mkfs[@]}" "$@" "$dev" 2>&1) ||
    { _loop_fail "${mkfs[*]} $* $dev failed: $err"; return 1; }
  printf 'mount\t%s\t%s\n' "$mnt" "$dev" >> "$records"
  err=$(mount -t "$type" ${MOUNT_OPTS:+-o "$MOUNT_OPTS"} "$dev" "$mnt" 2>&1) ||
    { _loop_fail "mount -t $type ${MOUNT_OPTS:+-o $MOUNT_OPTS }$dev $mnt failed: $err"; return 1; }
  return 0
}

# mount_image IMG MNT [TYPE]: mount the image IMG (of TYPE, default ext4) read-only on its
# own loop device, recorded for loop_cleanup_all (which unmounts and detaches exactly these).
mount_image() {
  local img=$1 mnt=$2 type=${3:-ext4} dev records
  records=$(_loop_records)
  printf 'image\t%s\n' "$img" >> "$records"
  dev=$(losetup --find --show --read-only "$img")
  printf 'mount\t%s\t%s\n' "$mnt" "$dev" >> "$records"
  mkdir -p "$mnt"
  mount -t "$type" -o ro "$dev" "$mnt"
}

# mount_image_rw IMG MNT: the same, read-write.
mount_image_rw() {
  local img=$1 mnt=$2 dev records
  records=$(_loop_records)
  printf 'image\t%s\n' "$img" >> "$records"
  dev=$(losetup --find --show "$img")
  printf 'mount\t%s\t%s\n' "$mnt" "$dev" >> "$records"
  mkdir -p "$mnt"
  mount -t ext4 "$dev" "$mnt"
}

# fill_to MNT KIB: leave about KIB KiB free on the file system at MNT (one
# file, MNT/fill, takes the rest).
fill_to() {
  local avail
  avail=$(( $(stat -f -c '%a * %S' "$1") ))
  fallocate -l $(( avail - $2 * 1024 )) "$1/fill"
  sync -f "$1"
}

# qgroup_limit MNT SIZE: turn on Btrfs quotas on the file system at MNT and
# limit its top subvolume to SIZE (btrfs qgroup limit's units: 60M).
qgroup_limit() {
  btrfs quota enable "$1"
  btrfs qgroup limit "$2" "$1"
  sync -f "$1"
}

# umount_image MNT: unmount and detach now (at most two loop devices at a time).
umount_image() {
  local dev
  dev=$(findmnt -n -o SOURCE -M "$1")
  umount "$1"
  case $dev in /dev/loop[0-9]*) losetup -d "$dev" ;; esac
}

# eio_remount [--fresh TYPE] [--rw] MNT0 MNT [w:|rw:]START+LENGTH...: move the
# file system make_fs mounted on MNT0 onto a disk with bad sectors: unmount and
# detach it, serve its image through tests/lib/eio-disk (reads touching the
# given byte ranges fail with EIO; writes with w:, both with rw:) and mount
# that on MNT, read-only unless --rw.  --fresh TYPE: mkfs.TYPE the image again
# first (the same size and options: the same places for the same writes).
# All recorded for loop_cleanup_all.
eio_remount() {
  local fresh= ro=1 mnt0 mnt records img dev fuse err mkfs
  while :; do
    case $1 in
      --fresh) fresh=$2; shift 2 ;;
      --rw) ro=; shift ;;
      *) break ;;
    esac
  done
  mnt0=$1 mnt=$2
  shift 2
  records=$(_loop_records) || return 1
  dev=$(findmnt -n -o SOURCE -M "$mnt0") || { _loop_fail "'$mnt0' is not mounted"; return 1; }
  img=$(awk -F'\t' -v d="$dev" '$1 == "loop" && $2 == d { i = $3 } END { print i }' "$records")
  [ -n "$img" ] || { _loop_fail "'$mnt0' is not a make_fs file system"; return 1; }
  umount_image "$mnt0" || return 1
  if [ -n "$fresh" ]; then
    _loop_mkfs "$fresh" || { _loop_fail "eio_remount --fresh: ext4, xfs or btrfs, not '$fresh'"; return 1; }
    err=$("${mkfs[@]}" "$img" 2>&1) || { _loop_fail "${mkfs[*]} $img: $err"; return 1; }
  fi
  _eio_serve eio "$img" "$@" || return 1
  fuse=$_EIO_DIR
  printf 'attach\t%s\n' "$fuse/disk" >> "$records"
  dev=$(losetup --find --show "$fuse/disk") || { _loop_fail "losetup '$fuse/disk' failed"; return 1; }
  printf 'mount\t%s\t%s\n' "$mnt" "$dev" >> "$records"
  mkdir -p "$mnt"
  err=$(mount ${ro:+-o ro} "$dev" "$mnt" 2>&1) || { _loop_fail "mount $dev $mnt failed: $err"; return 1; }
  EIO_IMAGE=$img
}

# stale_file FILE N: serve FILE through tests/lib/eio-disk as STALE_FILE, a file
# that claims N bytes (and blocks) more than FILE has and whose reads end where
# FILE ends (a size a network file system has not caught up with).  Recorded
# for loop_cleanup_all.
stale_file() {
  _eio_serve stale "$1" "stale:$2" || return 1
  STALE_FILE=$_EIO_DIR/disk
}

# _eio_serve KIND FILE ARGS...: start tests/lib/eio-disk FILE ARGS... on a new
# directory, _EIO_DIR, recorded for loop_cleanup_all; wait for its "disk".
_eio_serve() {
  local kind=$1 file=$2 records fuse tag i
  shift 2
  records=$(_loop_records) || return 1
  fuse=$(mktemp -d "$(_loop_scope_dir)/$kind.XXXXXX") || return 1
  tag=bfo-$kind-${fuse##*.}
  printf 'mount\t%s\t%s\n' "$fuse" "$tag" >> "$records"
  "$top_builddir/tests/lib/eio-disk" "$file" "$fuse" -o "fsname=$tag" "$@" \
    2> "$fuse.log" &
  for i in $(seq 100); do [ -e "$fuse/disk" ] && break; sleep 0.1; done
  [ -e "$fuse/disk" ] || { _loop_fail "eio-disk did not start: $(cat "$fuse.log")"; return 1; }
  _EIO_DIR=$fuse
}

# eio_check TYPE MNT CHECKMNT: after eio_remount, unmount MNT and detach its disk
# with bad sectors; check the image (TYPE ext4: e2fsck -fn, xfs: xfs_repair -n)
# and mount it as it is now, read-only, on CHECKMNT.
eio_check() {
  local type=$1 mnt=$2 check=$3 dev err
  if findmnt -n -M "$mnt" >/dev/null 2>&1; then
    umount_image "$mnt" || return 1
  else  # (unmounted by the caller; its disk is still attached)
    dev=$(awk -F'\t' -v m="$mnt" '$1 == "mount" && $2 == m { d = $3 } END { print d }' \
            "$(_loop_records)")
    case $dev in /dev/loop[0-9]*) losetup -d "$dev" ;; esac
  fi
  case $type in
    ext4) err=$(e2fsck -fn "$EIO_IMAGE" 2>&1) || { echo "e2fsck -fn: $err"; return 1; } ;;
    xfs) err=$(xfs_repair -n -f "$EIO_IMAGE" 2>&1) || { echo "xfs_repair -n: $err"; return 1; } ;;
  esac
  mount_image "$EIO_IMAGE" "$check" "$type"
}

# Loop devices currently backed by the exact image file IMG.
_loop_devices_of() {
  losetup -n -O NAME -j "$1" 2>/dev/null
}

# Detach every loop device backed by IMG.  A device still in use (say a lazily unmounted
# file system a straggler holds open) only gets autoclear from losetup -d, so give it a
# few seconds to go away.
_loop_detach_image() {
  local img=$1 dev try
  for try in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20; do
    dev=$(_loop_devices_of "$img")
    [ -n "$dev" ] || return 0
    for dev in $dev; do
      case $dev in /dev/loop[0-9]*) losetup -d "$dev" 2>/dev/null ;; esac
    done
    [ -n "$(_loop_devices_of "$img")" ] || return 0
    sleep 0.5
  done
  return 1
}

# Is MNT mounted from exactly SOURCE (a loop device or our tmpfs tag)?
_loop_is_mounted() {
  local mnt=$1 src=$2 s
  for s in $(findmnt -n -r -v -M "$mnt" -o SOURCE 2>/dev/null); do
    [ "$s" = "$src" ] && return 0
  done
  return 1
}

_loop_umount() {
  local mnt=$1 src=$2 try
  for try in 1 2 3 4 5 6 7 8 9 10; do
    _loop_is_mounted "$mnt" "$src" || return 0
    umount "$mnt" 2>/dev/null && continue
    sleep 0.3
  done
  _loop_is_mounted "$mnt" "$src" || return 0
  # Still busy (a straggling process?): detach it lazily so nothing stays visible.
  echo "loop_cleanup_all: '$mnt' is busy; unmounting lazily" >&2
  umount -l "$mnt" || return 1
  ! _loop_is_mounted "$mnt" "$src"
}

# loop_cleanup_all: unmount every mount and detach every loop device make_fs recorded in
# this scope (test, or file in setup_file/teardown_file), newest first, and delete the
# images.  Safe to call more than once and after a partial make_fs.  Returns 1 (saying
# what) if something could not be undone; that entry stays recorded for another try.
loop_cleanup_all() {
  local records
  records=$(_loop_records) || return 1
  [ -s "$records" ] || return 0
  local left=() line kind a b rc=0
  local -a lines
  mapfile -t lines < "$records"
  local i
  for ((i = ${#lines[@]} - 1; i >= 0; i--)); do
    line=${lines[i]}
    IFS=$'\t' read -r kind a b <<< "$line"
    case $kind in
      mount)
        if ! _loop_umount "$a" "$b"; then
          echo "loop_cleanup_all: cannot unmount '$a' ($b)" >&2
          left+=("$line"); rc=1
        fi
        ;;
      loop)
        # Detached through its image (older entry), which also catches a device
        # attached just before a failure that never got its own record.
        ;;
      attach)
        # A loop device on a file that is not ours to delete (eio_remount's disk).
        if ! _loop_detach_image "$a"; then
          echo "loop_cleanup_all: still attached to '$a':" $(_loop_devices_of "$a") >&2
          left+=("$line"); rc=1
        fi
        ;;
      image)
        if ! _loop_detach_image "$a"; then
          echo "loop_cleanup_all: still attached to '$a' (in use; autoclear set):" \
            $(_loop_devices_of "$a") >&2
          left+=("$line"); rc=1
        else
          rm -f "$a"
        fi
        ;;
    esac
  done
  if [ ${#left[@]} -eq 0 ]; then
    : > "$records"
  else
    # Keep the oldest-first order for the next attempt.
    for ((i = ${#left[@]} - 1; i >= 0; i--)); do printf '%s\n' "${left[i]}"; done > "$records"
  fi
  return $rc
}
