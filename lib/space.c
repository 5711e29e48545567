/* space.c: when a program that makes names ahead of the data it has queued
   must write the queue first, because the file system is running full.

   GNU tar and cp write each file before they make the next name, so on a
   disk that fills up the names they made before it filled have their data,
   and the first one they cannot make fails ("Cannot mkdir", "Cannot open")
   and is not left.  bfotar -x and bfocp -r queue files' data while tar and
   cp make the names after them (directories, inodes, directory blocks):
   those took the space the queued data needed, which then failed "Cannot
   write" and left empty files where GNU left none (120 files of 3 MB onto a
   320 MiB XFS: 120 files, 37 of them empty, against GNU's 84; on a 1 MiB
   ext4 a directory tar could not make was made, with three empty files).
   So before each entry, while free space less what is queued may fall
   under BFO_SPACE_SLACK, the caller writes its queue first.

   Far from full this costs no system call: the space left is counted down
   by what each entry may take (its data in 4 KiB blocks, and one block), and
   statfs is asked again only when that count runs low, or every
   BFO_SPACE_RECHECK entries (other writers, a mount crossed).  Btrfs counts
   data in statfs only once written back (100 MB written: the same free
   space; after sync -f, 100 MB less), so there the data of the entries
   since the first statfs are taken from the space there was then.  Root may
   take ext4's reserved blocks; Btrfs's f_bfree counts space its data cannot
   have (a 320 MiB one: 329 MB free, 250 MB available).  Free inodes count
   as well: fewer than BFO_SPACE_INODES left is near full too (an ext4 made
   with -N 16: bfocp made a directory ahead of three deferred files, whose
   creation then failed where GNU cp's mkdir did).

   Quotas: statfs does not show them.  A Btrfs qgroup limit fails creates
   and writes "Disk quota exceeded" for root too (session 29: bfotar left
   empty files where GNU tar's open failed), and any user may read the
   limits and usage in sysfs (/sys/fs/btrfs/FSID/qgroups/LEVEL_ID/); unlike
   statfs they count data as soon as it is written (rsv_data: 30 MB written,
   30 MB reserved at once, and in "referenced" after the commit), so the room
   a limit leaves is the limit less both, as the kernel's own check takes it
   (qgroup_check_limits).  Which level-1-and-up qgroups hold the entry's
   subvolume sysfs does not say, so each of them with a limit counts.  The
   caller passes the directory of the entry's own (bfotar asks again when a
   member's directory is on another file system or subvolume).  VFS
   quotas (ext4, XFS) are not read: this project's kernel has neither ext4's
   quota format (QFMT_V2) nor XFS quota, so no such code could be tried.  */

#include <config.h>

#include "bfo-int.h"

#include <dirent.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <unistd.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>

#define SPACE_BLOCK 4096u
#define BTRFS_MAGIC 0x9123683e
#define EXT4_MAGIC  0xef53

int
bfo_space_note (struct bfo_space *s, uint64_t size)
{
  uint64_t data = (size + SPACE_BLOCK - 1) / SPACE_BLOCK * SPACE_BLOCK;
  uint64_t cost = SPACE_BLOCK + data;
  s->data += data;
  s->cost = cost;
  s->left = s->left > cost ? s->left - cost : 0;
  s->inodes = s->inodes > 1 ? s->inodes - 1 : 0;
  if (s->left >= BFO_SPACE_SLACK && s->inodes >= BFO_SPACE_INODES
      && ++s->entries < BFO_SPACE_RECHECK)
    return 0;
  s->entries = 0;
  return 1;
}

/* DIR/NAME as a number; 0 (and *OK false) if it cannot be read.  */
static uint64_t
read_u64 (int dir, char const *name, bool *ok)
{
  char buf[32];
  int fd = openat (dir, name, O_RDONLY | O_CLOEXEC);
  ssize_t n = fd < 0 ? -1 : read (fd, buf, sizeof buf - 1);
  if (fd >= 0)
    close (fd);
  if (n <= 0)
    {
      *ok = false;
      return 0;
    }
  buf[n] = 0;
  return strtoull (buf, NULL, 10);
}

/* The room the limits of qgroup directory NAME (under QGROUPS) leave, or
   UINT64_MAX.  */
static uint64_t
qgroup_room (int qgroups, char const *name)
{
  int dir = openat (qgroups, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0)
    return UINT64_MAX;
  bool ok = true;
  uint64_t flags = read_u64 (dir, "limit_flags", &ok);
  uint64_t room = UINT64_MAX;
  if (ok && (flags & (BTRFS_QGROUP_LIMIT_MAX_RFER | BTRFS_QGROUP_LIMIT_MAX_EXCL)))
    {
      uint64_t rsv = read_u64 (dir, "rsv_data", &ok)
                     + read_u64 (dir, "rsv_meta_pertrans", &ok)
                     + read_u64 (dir, "rsv_meta_prealloc", &ok);
      static char const *const used[] = { "referenced", "exclusive" };
      static char const *const max[] = { "max_referenced", "max_exclusive" };
      static uint64_t const bit[] = { BTRFS_QGROUP_LIMIT_MAX_RFER,
                                      BTRFS_QGROUP_LIMIT_MAX_EXCL };
      for (int i = 0; i < 2; i++)
        if (flags & bit[i])
          {
            uint64_t m = read_u64 (dir, max[i], &ok);
            uint64_t u = read_u64 (dir, used[i], &ok) + rsv;
            uint64_t r = m > u ? m - u : 0;
            if (r < room)
              room = r;
          }
      if (!ok)
        room = UINT64_MAX;
    }
  close (dir);
  return room;
}

/* Find where in sysfs the qgroups of the subvolume of directory DIR_FD
   are, into S (once per subvolume: SF's f_fsid tells Btrfs subvolumes
   apart).  */
static bool
btrfs_quota_find (struct bfo_space *s, int dir_fd, const struct statfs *sf)
{
  int fsid[2];
  memcpy (fsid, &sf->f_fsid, sizeof fsid);
  if (s->quota_found && memcmp (fsid, s->quota_fsid, sizeof fsid) == 0)
    return true;
  s->quota_found = 0;
  /* (opened again: DIR_FD may be an O_PATH descriptor, as cp's target
     directory is, which takes no ioctl) */
  int fd = openat (dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return false;
  struct btrfs_ioctl_fs_info_args fi;
  struct btrfs_ioctl_ino_lookup_args il;
  memset (&fi, 0, sizeof fi);
  memset (&il, 0, sizeof il);
  /* (both unprivileged: the file system's id, and the subvolume's, asked
     by the objectid of a subvolume's root directory) */
  il.objectid = BTRFS_FIRST_FREE_OBJECTID;
  bool ok = ioctl (fd, BTRFS_IOC_FS_INFO, &fi) == 0
            && ioctl (fd, BTRFS_IOC_INO_LOOKUP, &il) == 0;
  close (fd);
  if (!ok)
    return false;
  int n = snprintf (s->quota_dir, sizeof s->quota_dir, "/sys/fs/btrfs/");
  for (int i = 0; i < 16; i++)
    n += snprintf (s->quota_dir + n, sizeof s->quota_dir - n, "%s%02x",
                   i == 4 || i == 6 || i == 8 || i == 10 ? "-" : "", fi.fsid[i]);
  snprintf (s->quota_dir + n, sizeof s->quota_dir - n, "/qgroups");
  snprintf (s->quota_own, sizeof s->quota_own, "0_%" PRIu64, (uint64_t) il.treeid);
  memcpy (s->quota_fsid, fsid, sizeof fsid);
  s->quota_found = 1;
  return true;
}

uint64_t
bfo_space_quota (struct bfo_space *s, int dir_fd, const struct statfs *sf)
{
  if (!sf || sf->f_type != BTRFS_MAGIC || !btrfs_quota_find (s, dir_fd, sf))
    return UINT64_MAX;
  int qgroups = open (s->quota_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (qgroups < 0)
    return UINT64_MAX;          /* (quotas not enabled) */
  uint64_t room = qgroup_room (qgroups, s->quota_own);
  int dup_fd = dup (qgroups);
  DIR *d = dup_fd < 0 ? NULL : fdopendir (dup_fd);
  if (!d && dup_fd >= 0)
    close (dup_fd);
  for (struct dirent *e; d && (e = readdir (d)); )
    {
      /* (qgroups of level 1 and up: "1_0", ...) */
      char *end;
      unsigned long level = strtoul (e->d_name, &end, 10);
      if (level > 0 && *end == '_' && end[1] >= '0' && end[1] <= '9')
        {
          uint64_t r = qgroup_room (qgroups, e->d_name);
          if (r < room)
            room = r;
        }
    }
  if (d)
    closedir (d);
  close (qgroups);
  return room;
}

int
bfo_space_update (struct bfo_space *s, const struct statfs *sf,
                  uint64_t quota, uint64_t queued_bytes,
                  uint64_t queued_files, uint64_t queued_inodes)
{
  s->checks++;
  /* (a file system that gives no sizes is not guarded) */
  if (!sf || sf->f_blocks == 0)
    {
      s->left = s->inodes = UINT64_MAX;
      return 0;
    }
  /* Inodes: out of them (an ext4 made with few), a directory made ahead
     took the inode a queued file needed (bfocp makes a deferred copy's
     file when it runs it).  Btrfs counts none.  */
  if (sf->f_files == 0)
    s->inodes = UINT64_MAX;
  else
    s->inodes = (uint64_t) sf->f_ffree > queued_inodes + 1
                ? sf->f_ffree - queued_inodes - 1 : 0;
  uint64_t unit = sf->f_frsize ? sf->f_frsize : sf->f_bsize;
  uint64_t avail = (sf->f_type == EXT4_MAGIC && geteuid () == 0
                    ? sf->f_bfree : sf->f_bavail) * unit;
  uint64_t queued = queued_bytes + queued_files * SPACE_BLOCK;
  uint64_t need = queued + s->cost;
  s->left = avail > need ? avail - need : 0;
  if (!s->started)
    {
      s->started = 1;
      s->start = avail > queued ? avail - queued : 0;
      s->data = s->cost - SPACE_BLOCK;
    }
  if (sf->f_type == BTRFS_MAGIC)
    {
      uint64_t bound = s->start > s->data ? s->start - s->data : 0;
      if (bound < s->left)
        s->left = bound;
    }
  /* (a quota counts what was written already: only the queue and the entry
     are to come) */
  if (quota != UINT64_MAX)
    {
      s->quota_checks++;
      uint64_t room = quota > need ? quota - need : 0;
      if (room < s->left)
        s->left = room;
    }
  if (s->left >= BFO_SPACE_SLACK && s->inodes >= BFO_SPACE_INODES)
    return 0;
  s->tight++;
  return 1;
}
