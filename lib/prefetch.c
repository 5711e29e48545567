/* prefetch.c: read ahead the ext4 inode-table blocks of a window's inodes through the
   block device (root), so the opens that follow find them cached instead of waiting one by one.  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <ext2fs/ext2fs.h>

/* Inode-table blocks closer than this are read in one request: reading a few
   unneeded blocks is cheaper than another request (and much cheaper than the
   dependent single-block reads it replaces).  */
#define PREFETCH_GAP_BLOCKS 32

struct bfo_itable
{
  int devfd;                    /* buffered: ext4 reads its metadata through this cache */
  dev_t dev;
  uint32_t inodes_per_group, inode_size, block_size, groups;
  uint64_t *table;              /* first inode-table block of each group */
};

static int
by_u64 (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

/* Geometry of the ext4 file system holding PATH (relative to DIRFD), read
   (never written) with libext2fs from its device.  -EPERM unless root,
   -EOPNOTSUPP unless ext2/3/4.  */
int
bfo_itable_open (int dirfd, const char *path_in_fs, struct bfo_itable **out)
{
  struct stat st;
  struct statfs sf;
  int fd = openat (dirfd, path_in_fs, O_PATH | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int k = fstat (fd, &st) < 0 || fstatfs (fd, &sf) < 0 ? -errno : 0;
  close (fd);
  if (k < 0)
    return k;
  if (geteuid () != 0)
    return -EPERM;
  if (sf.f_type != BFO_EXT4_MAGIC)
    return -EOPNOTSUPP;
  char path[PATH_MAX];
  if (bfo_device_path (st.st_dev, path, sizeof path) < 0)
    return -EOPNOTSUPP;
  ext2_filsys fs;
  /* Read-only, no journal replay, no MMP: only the superblock and descriptors.  */
  if (ext2fs_open2 (path, NULL, EXT2_FLAG_64BITS | EXT2_FLAG_IGNORE_CSUM_ERRORS, 0, 0,
                    unix_io_manager, &fs) != 0)
    return -EOPNOTSUPP;
  struct bfo_itable *t = calloc (1, sizeof *t);
  if (t)
    t->table = malloc (fs->group_desc_count * sizeof *t->table);
  if (!t || !t->table)
    {
      if (t)
        free (t);
      ext2fs_close_free (&fs);
      return -ENOMEM;
    }
  t->inodes_per_group = fs->super->s_inodes_per_group;
  t->inode_size = EXT2_INODE_SIZE (fs->super);
  t->block_size = fs->blocksize;
  t->groups = fs->group_desc_count;
  for (uint32_t g = 0; g < t->groups; g++)
    t->table[g] = ext2fs_inode_table_loc (fs, g);
  ext2fs_close_free (&fs);
  t->devfd = open (path, O_RDONLY | O_CLOEXEC);
  if (t->devfd < 0)
    {
      int e = errno;
      bfo_itable_close (t);
      return -e;
    }
  t->dev = st.st_dev;
  *out = t;
  return 0;
}

void
bfo_itable_close (struct bfo_itable *t)
{
  if (!t)
    return;
  if (t->devfd >= 0)
    close (t->devfd);
  free (t->table);
  free (t);
}

/* Ask for the inode-table blocks of INOS, merged into few large reads.  Only a
   hint: whatever it misses is read by the opens as usual.  Returns the number
   of read-ahead requests issued.  */
size_t
bfo_itable_prefetch (struct bfo_itable *t, const uint64_t *inos, size_t n)
{
  if (!t || n == 0 || !t->inodes_per_group || !t->block_size)
    return 0;
  uint64_t *blocks = malloc (n * sizeof *blocks);
  if (!blocks)
    return 0;
  size_t m = 0;
  uint32_t per_block = t->block_size / t->inode_size;
  for (size_t i = 0; i < n; i++)
    {
      if (inos[i] == 0)
        continue;
      uint64_t idx = inos[i] - 1;
      uint64_t g = idx / t->inodes_per_group;
      if (g >= t->groups)
        continue;
      blocks[m++] = t->table[g] + (idx % t->inodes_per_group) / per_block;
    }
  qsort (blocks, m, sizeof *blocks, by_u64);
  size_t requests = 0;
  for (size_t i = 0; i < m;)
    {
      uint64_t start = blocks[i], end = blocks[i] + 1;
      size_t j = i + 1;
      while (j < m && blocks[j] <= end + PREFETCH_GAP_BLOCKS)
        end = blocks[j++] + 1;
      posix_fadvise (t->devfd, (off_t) (start * t->block_size),
                     (off_t) ((end - start) * t->block_size), POSIX_FADV_WILLNEED);
      requests++;
      i = j;
    }
  free (blocks);
  return requests;
}
