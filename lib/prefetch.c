/* prefetch.c: read ahead ext4 metadata through the block device (root): the
   inode-table blocks of a window's inodes, so the opens that follow find them
   cached instead of waiting one by one, and, for a walk (bfo_meta_ahead), a
   directory's entries' inode-table blocks and its subdirectories' blocks.  */

#include <config.h>

#include "bfo-int.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <sys/ioctl.h>

#include <ext2fs/ext2fs.h>
#include <ext2fs/ext3_extents.h>

/* Inode-table blocks closer than this are read in one request: reading a few
   unneeded blocks is cheaper than another request (and much cheaper than the
   dependent single-block reads it replaces).  */
#define PREFETCH_GAP_BLOCKS 32
/* The default read-ahead size of a block device (read_ahead_kb 128).  */
#define ADVISE_PIECE_BYTES (128u << 10)

struct bfo_itable
{
  int devfd;                    /* buffered: ext4 reads its metadata through this cache */
  dev_t dev;
  uint32_t inodes_per_group, inode_size, block_size, groups;
  uint64_t *table;              /* first inode-table block of each group */
  uint32_t *itable_used;        /* inodes of each group's table in use, or NULL */
};

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
  /* The part of each table in use (the rest has never held an inode), when
     the file system keeps count of it.  */
  if (ext2fs_has_group_desc_csum (fs)
      && (t->itable_used = malloc (t->groups * sizeof *t->itable_used)))
    for (uint32_t g = 0; g < t->groups; g++)
      {
        uint32_t unused = ext2fs_bg_itable_unused (fs, g);
        t->itable_used[g] = unused < t->inodes_per_group ? t->inodes_per_group - unused : 0;
      }
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
  free (t->itable_used);
  free (t);
}

static int
by_u64 (const void *a, const void *b)
{
  uint64_t x = *(const uint64_t *) a, y = *(const uint64_t *) b;
  return x < y ? -1 : x > y;
}

/* Blocks [start, end) of the device.  */
struct brange
{
  uint64_t start, end;
};

static int
by_start (const void *a, const void *b)
{
  const struct brange *x = a, *y = b;
  return x->start < y->start ? -1 : x->start > y->start;
}

/* Ask for the N ranges of R (sorted here), neighbours merged into one read.
   Returns the number of read-ahead requests issued.  */
static size_t
advise (struct bfo_itable *t, struct brange *r, size_t n)
{
  qsort (r, n, sizeof *r, by_start);
  size_t requests = 0;
  for (size_t i = 0; i < n;)
    {
      uint64_t start = r[i].start, end = r[i].end;
      size_t j = i + 1;
      for (; j < n && r[j].start <= end + PREFETCH_GAP_BLOCKS; j++)
        if (r[j].end > end)
          end = r[j].end;
      /* The kernel reads at most the device's read-ahead size (or its largest
         request) of one POSIX_FADV_WILLNEED and drops the rest: ask for the
         range in pieces that every device takes whole.  */
      uint64_t piece = ADVISE_PIECE_BYTES / t->block_size;
      for (uint64_t b = start; b < end; b += piece)
        posix_fadvise (t->devfd, (off_t) (b * t->block_size),
                       (off_t) ((end - b < piece ? end - b : piece) * t->block_size),
                       POSIX_FADV_WILLNEED);
      requests++;
      i = j;
    }
  return requests;
}

/* Append the inode-table blocks of INOS to R (room for N more).  */
static size_t
itable_ranges (const struct bfo_itable *t, const uint64_t *inos, size_t n, struct brange *r)
{
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
      r[m].start = t->table[g] + (idx % t->inodes_per_group) / per_block;
      r[m].end = r[m].start + 1;
      m++;
    }
  return m;
}

/* Ask for the inode-table blocks of INOS, merged into few large reads.  Only a
   hint: whatever it misses is read by the opens as usual.  Returns the number
   of read-ahead requests issued.  */
size_t
bfo_itable_prefetch (struct bfo_itable *t, const uint64_t *inos, size_t n)
{
  if (!t || n == 0 || !t->inodes_per_group || !t->block_size)
    return 0;
  struct brange *r = malloc (n * sizeof *r);
  if (!r)
    return 0;
  size_t requests = advise (t, r, itable_ranges (t, inos, n, r));
  free (r);
  return requests;
}

/* ------------------------------------------------- where a file's data lie */

void
bfo_itable_cursor_free (struct bfo_itable_cursor *c)
{
  free (c->buf);
  c->buf = NULL;
}

/* Inode INO of T's file system (device DEV) as its inode table holds it in
   the block device's cache, which is where ext4 keeps its own copy of every
   inode (the table blocks are there once the inode was looked up: by the stat
   of a walk).  Into *OUT: its size and the first block of its data,
   when the inode says plainly: extents in the inode itself (or block
   pointers), no inline data, no encryption, a block for its first byte.
   -EXDEV for another device, -ENODATA when the inode does not say plainly,
   -errno if its block cannot be read.  C keeps the last table block read:
   inodes asked for in increasing order share blocks.  Only a hint (delayed
   allocation, for one, has no block in the inode yet): what reads the file
   goes through its own descriptor.  */
int
bfo_itable_inode (struct bfo_itable *t, struct bfo_itable_cursor *c, dev_t dev, uint64_t ino,
                  struct bfo_itable_inode *out)
{
  if (!t || dev != t->dev || ino == 0 || !t->block_size || t->inode_size < EXT2_GOOD_OLD_INODE_SIZE)
    return -EXDEV;
  uint64_t idx = ino - 1, g = idx / t->inodes_per_group;
  if (g >= t->groups)
    return -ENODATA;
  uint64_t byte = (idx % t->inodes_per_group) * t->inode_size;
  uint64_t blk = t->table[g] + byte / t->block_size;
  if (!c->buf || c->block != blk)
    {
      if (!c->buf && !(c->buf = malloc (t->block_size)))
        return -ENOMEM;
      ssize_t k = pread (t->devfd, c->buf, t->block_size, (off_t) (blk * t->block_size));
      if (k != (ssize_t) t->block_size)
        {
          c->block = 0;
          return k < 0 ? -errno : -EIO;
        }
      c->block = blk;
    }
  struct ext2_inode in;
  memcpy (&in, c->buf + byte % t->block_size, sizeof in);
  uint32_t flags = ext2fs_le32_to_cpu (in.i_flags);
  uint16_t mode = ext2fs_le16_to_cpu (in.i_mode);
  if (!LINUX_S_ISREG (mode) || in.i_links_count == 0
      || (flags & (EXT4_INLINE_DATA_FL | EXT4_ENCRYPT_FL | EXT4_VERITY_FL)))
    return -ENODATA;
  out->size = ext2fs_le32_to_cpu (in.i_size) | (uint64_t) ext2fs_le32_to_cpu (in.i_size_high) << 32;
  uint64_t first = 0;
  if (flags & EXT4_EXTENTS_FL)
    {
      const struct ext3_extent_header *h = (const void *) in.i_block;
      const struct ext3_extent *x = (const void *) (h + 1);
      if (ext2fs_le16_to_cpu (h->eh_magic) != EXT3_EXT_MAGIC || h->eh_depth != 0
          || h->eh_entries == 0 || ext2fs_le16_to_cpu (h->eh_entries) > 4)
        return -ENODATA;
      first = ext2fs_le32_to_cpu (x->ee_start) | (uint64_t) ext2fs_le16_to_cpu (x->ee_start_hi) << 32;
    }
  else
    first = ext2fs_le32_to_cpu (in.i_block[0]);
  if (first == 0)
    return -ENODATA;
  out->block = first;
  out->block_size = t->block_size;
  return 0;
}

/* --------------------------------------------------- read-ahead for a walk */

/* Directory blocks asked for per call, at most: a hint should not fill the
   cache with what the walk reaches much later.  */
#define DIR_AHEAD_MAX_BYTES ((uint64_t) 64 << 20)

struct bfo_meta_ahead
{
  struct bfo_itable *t;
  unsigned char *group_done;    /* groups whose whole table was asked for */
};

int
bfo_meta_ahead_open (int dirfd, const char *path, struct bfo_meta_ahead **out)
{
  *out = NULL;
  struct bfo_meta_ahead *ma = calloc (1, sizeof *ma);
  if (!ma)
    return -ENOMEM;
  int ret = bfo_itable_open (dirfd, path, &ma->t);
  if (ret == 0 && !(ma->group_done = calloc (ma->t->groups, 1)))
    {
      bfo_itable_close (ma->t);
      ret = -ENOMEM;
    }
  if (ret < 0)
    {
      free (ma);
      return ret;
    }
  *out = ma;
  return 0;
}

void
bfo_meta_ahead_close (struct bfo_meta_ahead *ma)
{
  if (!ma)
    return;
  bfo_itable_close (ma->t);
  free (ma->group_done);
  free (ma);
}

/* The inode-table blocks of INOS[0..N) into R (room for N): a group's whole
   table in use, once, when the inodes in it are dense enough that reading it
   all wastes no more per inode than merging neighbours does; otherwise the
   inodes' own blocks.  An aged tree's files are strewn over its groups' tables,
   so reading them whole at its first directories is one sweep instead of a
   few reads at every directory.  Sorts INOS.  */
static size_t
ahead_itable_ranges (struct bfo_meta_ahead *ma, uint64_t *inos, size_t n, struct brange *r)
{
  const struct bfo_itable *t = ma->t;
  uint32_t per_block = t->block_size / t->inode_size;
  qsort (inos, n, sizeof *inos, by_u64);
  size_t m = 0;
  for (size_t i = 0; i < n;)
    {
      if (inos[i] == 0 || (inos[i] - 1) / t->inodes_per_group >= t->groups)
        {
          i++;
          continue;
        }
      uint64_t g = (inos[i] - 1) / t->inodes_per_group;
      size_t j = i;
      while (j < n && inos[j] && (inos[j] - 1) / t->inodes_per_group == g)
        j++;
      uint64_t used = t->itable_used ? t->itable_used[g] : t->inodes_per_group;
      uint64_t blocks = (used + per_block - 1) / per_block;
      if (ma->group_done[g])
        ;
      else if ((j - i) * PREFETCH_GAP_BLOCKS >= blocks)
        {
          ma->group_done[g] = 1;
          if (blocks)
            {
              r[m].start = t->table[g];
              r[m++].end = t->table[g] + blocks;
            }
        }
      else
        m += itable_ranges (t, inos + i, j - i, r + m);
      i = j;
    }
  return m;
}

/* Append the blocks of directory NAME in DIRFD to *R (*N used of *CAP), up to
   *BUDGET blocks.  */
static void
dir_ranges (const struct bfo_itable *t, int dirfd, const char *name, struct brange **r,
            size_t *n, size_t *cap, uint64_t *budget)
{
  int fd = openat (dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NOATIME | O_CLOEXEC);
  if (fd < 0)
    return;
  struct stat st;
  if (fstat (fd, &st) != 0 || st.st_dev != t->dev)
    {
      close (fd);
      return;
    }
  enum { EXTENTS = 32 };
  struct
  {
    struct fiemap fm;
    struct fiemap_extent fe[EXTENTS];
  } u;
  uint64_t start = 0;
  bool last = false;
  while (!last && *budget)
    {
      memset (&u.fm, 0, sizeof u.fm);
      u.fm.fm_start = start;
      u.fm.fm_length = FIEMAP_MAX_OFFSET - start;
      u.fm.fm_extent_count = EXTENTS;
      if (ioctl (fd, FS_IOC_FIEMAP, &u.fm) != 0 || u.fm.fm_mapped_extents == 0)
        break;
      uint64_t asked = start;
      for (uint32_t i = 0; i < u.fm.fm_mapped_extents && *budget; i++)
        {
          const struct fiemap_extent *e = &u.fm.fm_extents[i];
          last = e->fe_flags & FIEMAP_EXTENT_LAST;
          start = e->fe_logical + e->fe_length;
          if (e->fe_flags & (FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC
                             | FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_NOT_ALIGNED))
            continue;
          if (*n == *cap)
            {
              size_t c = *cap ? 2 * *cap : 64;
              struct brange *x = realloc (*r, c * sizeof *x);
              if (!x)
                {
                  *budget = 0;
                  break;
                }
              *r = x;
              *cap = c;
            }
          uint64_t b = e->fe_physical / t->block_size;
          uint64_t len = (e->fe_length + t->block_size - 1) / t->block_size;
          if (len > *budget)
            len = *budget;
          (*r)[*n].start = b;
          (*r)[(*n)++].end = b + len;
          *budget -= len;
        }
      if (start <= asked)
        break;                  /* (no progress: a mapping we do not understand) */
    }
  close (fd);
}

size_t
bfo_meta_ahead_dir (struct bfo_meta_ahead *ma, int dirfd, const struct bfo_meta_entry *es,
                    size_t n_es)
{
  if (!ma || !ma->t->block_size)
    return 0;
  const struct bfo_itable *t = ma->t;
  size_t requests = 0;
  /* The entries' inodes first: opening the subdirectories needs theirs.  */
  struct brange *r = NULL;
  size_t n = 0, cap = 0;
  uint64_t *inos = n_es ? malloc (n_es * sizeof *inos) : NULL;
  if (inos && (r = malloc (n_es * sizeof *r)))
    {
      for (size_t i = 0; i < n_es; i++)
        inos[i] = es[i].ino;
      size_t k = ahead_itable_ranges (ma, inos, n_es, r);
      if (k)
        requests += advise (ma->t, r, k);
    }
  free (inos);
  free (r);
  r = NULL;
  uint64_t budget = DIR_AHEAD_MAX_BYTES / t->block_size;
  for (size_t i = 0; i < n_es && budget; i++)
    if (es[i].type == DT_DIR)
      dir_ranges (t, dirfd, es[i].name, &r, &n, &cap, &budget);
  if (n)
    requests += advise (ma->t, r, n);
  free (r);
  return requests;
}
