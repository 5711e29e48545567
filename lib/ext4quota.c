/* ext4quota.c: extended attribute inodes' charges and quota files of ext4
   images written by libbfo's ext4 image backend (patch-ext4img.c).

   The kernel charges the inode whose attribute lives in an attribute inode
   (ea_inode feature) with the value's space, in its i_blocks and its owners'
   quota, and one inode more; libext2fs does neither.  With the quota feature
   the usage per user, group and project lives in hidden quota files (the
   kernel's v2 format: a 4-level radix tree of 1 KiB blocks over the 32-bit
   id, leaf blocks of 72-byte entries), which e2fsck compares with what the
   inodes add up to.  The image writer recomputes them at close, as mke2fs -d
   does, keeping the limits and grace times already there.  */

#include <config.h>

#include "ext4quota.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <ext2fs/ext2_ext_attr.h>

enum { QT_BLK = 1024, QT_DEPTH = 4, QT_HEAD = 16, QT_ENTRY = 72,
       QT_PER_BLOCK = (QT_BLK - QT_HEAD) / QT_ENTRY, QT_INFO = 8, QT_TYPES = 3 };

/* The files' magic numbers per type (user, group, project); revision 1.  */
static const uint32_t qt_magic[QT_TYPES] = { 0xd9c01f11, 0xd9c01927, 0xd9c03f14 };

static uint32_t
get32 (const unsigned char *p)
{
  return p[0] | p[1] << 8 | p[2] << 16 | (uint32_t) p[3] << 24;
}

static uint64_t
get64 (const unsigned char *p)
{
  return get32 (p) | (uint64_t) get32 (p + 4) << 32;
}

static void
put32 (unsigned char *p, uint32_t v)
{
  p[0] = v;
  p[1] = v >> 8;
  p[2] = v >> 16;
  p[3] = v >> 24;
}

static void
put64 (unsigned char *p, uint64_t v)
{
  put32 (p, (uint32_t) v);
  put32 (p + 4, (uint32_t) (v >> 32));
}

static void
count_entries (ext2_filsys fs, const unsigned char *p, const unsigned char *end,
               blk64_t *blocks, unsigned int *count)
{
  uint64_t cluster = (uint64_t) fs->blocksize << fs->cluster_ratio_bits;
  while (p + sizeof (struct ext2_ext_attr_entry) <= end && get32 (p) != 0)
    {
      const struct ext2_ext_attr_entry *e = (const struct ext2_ext_attr_entry *) p;
      if (e->e_value_inum)
        {
          *blocks += EXT2FS_C2B (fs, (e->e_value_size + cluster - 1) / cluster);
          ++*count;
        }
      p += EXT2_EXT_ATTR_LEN (e->e_name_len);
    }
}

int
bfo_ea_inode_charge (ext2_filsys fs, ext2_ino_t ino, const struct ext2_inode_large *li,
                     blk64_t *blocks, unsigned int *count)
{
  *blocks = 0;
  *count = 0;
  if (!ext2fs_has_feature_ea_inode (fs->super))
    return 0;
  size_t isize = EXT2_INODE_SIZE (fs->super);
  if (isize > EXT2_GOOD_OLD_INODE_SIZE
      && EXT2_GOOD_OLD_INODE_SIZE + li->i_extra_isize + 4u <= isize)
    {
      const unsigned char *p = (const unsigned char *) li + EXT2_GOOD_OLD_INODE_SIZE
                               + li->i_extra_isize;
      if (get32 (p) == EXT2_EXT_ATTR_MAGIC)
        count_entries (fs, p + 4, (const unsigned char *) li + isize, blocks, count);
    }
  blk64_t blk = ext2fs_file_acl_block (fs, (const struct ext2_inode *) li);
  if (blk)
    {
      unsigned char *buf = malloc (fs->blocksize);
      if (!buf)
        return -ENOMEM;
      errcode_t err = ext2fs_read_ext_attr3 (fs, blk, buf, ino);
      if (!err)
        count_entries (fs, buf + sizeof (struct ext2_ext_attr_header), buf + fs->blocksize,
                       blocks, count);
      free (buf);
      if (err)
        return -EIO;
    }
  return 0;
}

static ext2_ino_t
quota_ino (ext2_filsys fs, int type)
{
  return type == 0 ? fs->super->s_usr_quota_inum
         : type == 1 ? fs->super->s_grp_quota_inum : fs->super->s_prj_quota_inum;
}

/* A quota file's whole contents.  */
static int
read_qfile (ext2_filsys fs, ext2_ino_t ino, unsigned char **bufp, size_t *lenp)
{
  ext2_file_t f;
  if (ext2fs_file_open (fs, ino, 0, &f))
    return -EIO;
  __u64 size = 0;
  unsigned char *buf = NULL;
  int r = ext2fs_file_get_lsize (f, &size) ? -EIO : 0;
  if (r == 0 && (size < QT_BLK * 2 || size > (1u << 30) || size % QT_BLK))
    r = -EUCLEAN;
  if (r == 0 && !(buf = malloc (size)))
    r = -ENOMEM;
  unsigned int got = 0;
  if (r == 0 && (ext2fs_file_read (f, buf, size, &got) || got != size))
    r = -EIO;
  ext2fs_file_close (f);
  if (r < 0)
    {
      free (buf);
      return r;
    }
  *bufp = buf;
  *lenp = size;
  return 0;
}

static bool
header_ok (const unsigned char *buf, int type)
{
  return get32 (buf) == qt_magic[type] && get32 (buf + 4) == 1;
}

/* One id's entry.  */
struct dq
{
  uint32_t id;
  uint64_t ihard, isoft, inodes, bhard, bsoft, space, btime, itime;
};

/* The entries of one type, found by id through an open-addressed index.  */
struct dqset
{
  struct dq *v;
  size_t n, cap;
  uint32_t *slot;               /* 1 + index into v, 0 free */
  size_t nslot;
};

static struct dq *
dq_get (struct dqset *s, uint32_t id)
{
  if (2 * (s->n + 1) > s->nslot)
    {
      size_t nslot = s->nslot ? 2 * s->nslot : 256;
      uint32_t *slot = calloc (nslot, sizeof *slot);
      if (!slot)
        return NULL;
      for (size_t i = 0; i < s->n; i++)
        {
          size_t h = (s->v[i].id * 2654435761u) & (nslot - 1);
          while (slot[h])
            h = (h + 1) & (nslot - 1);
          slot[h] = i + 1;
        }
      free (s->slot);
      s->slot = slot;
      s->nslot = nslot;
    }
  size_t h = (id * 2654435761u) & (s->nslot - 1);
  while (s->slot[h])
    {
      if (s->v[s->slot[h] - 1].id == id)
        return &s->v[s->slot[h] - 1];
      h = (h + 1) & (s->nslot - 1);
    }
  if (s->n == s->cap)
    {
      size_t cap = s->cap ? 2 * s->cap : 64;
      struct dq *v = realloc (s->v, cap * sizeof *v);
      if (!v)
        return NULL;
      s->v = v;
      s->cap = cap;
    }
  s->slot[h] = s->n + 1;
  struct dq *d = &s->v[s->n++];
  memset (d, 0, sizeof *d);
  d->id = id;
  return d;
}

/* The entries under tree block BLK at DEPTH: their limits and times.  SEEN
   marks blocks visited (a tree block twice is a loop; a leaf block may be
   shared).  */
static int
walk (const unsigned char *buf, uint32_t nblk, uint32_t blk, int depth, unsigned char *seen,
      struct dqset *s)
{
  if (blk == 0)
    return 0;
  if (blk >= nblk)
    return -EUCLEAN;
  const unsigned char *b = buf + (size_t) blk * QT_BLK;
  if (depth == QT_DEPTH)
    {
      if (seen[blk])
        return 0;
      seen[blk] = 1;
      for (int i = 0; i < QT_PER_BLOCK; i++)
        {
          const unsigned char *e = b + QT_HEAD + i * QT_ENTRY;
          static const unsigned char zero[QT_ENTRY];
          if (memcmp (e, zero, QT_ENTRY) == 0)
            continue;
          struct dq *d = dq_get (s, get32 (e));
          if (!d)
            return -ENOMEM;
          d->ihard = get64 (e + 8);
          d->isoft = get64 (e + 16);
          d->bhard = get64 (e + 32);
          d->bsoft = get64 (e + 40);
          d->btime = get64 (e + 56);
          d->itime = get64 (e + 64);
          /* Only the marker that keeps an all-zero entry from looking free.  */
          if (d->id == 0 && d->itime == 1 && !d->ihard && !d->isoft && !d->bhard && !d->bsoft
              && !d->btime && !get64 (e + 24) && !get64 (e + 48))
            d->itime = 0;
        }
      return 0;
    }
  if (seen[blk])
    return -EUCLEAN;
  seen[blk] = 1;
  for (int i = 0; i < QT_BLK / 4; i++)
    {
      int r = walk (buf, nblk, get32 (b + 4 * i), depth + 1, seen, s);
      if (r < 0)
        return r;
    }
  return 0;
}

/* The entries of FS's quota file of TYPE into S, its grace times and flags
   into INFO: -EOPNOTSUPP if it is not in the format we write, -EUCLEAN if its
   tree is broken.  */
static int
load_qfile (ext2_filsys fs, int type, struct dqset *s, unsigned char info[12])
{
  unsigned char *buf;
  size_t len;
  int r = read_qfile (fs, quota_ino (fs, type), &buf, &len);
  if (r < 0)
    return r;
  uint32_t nblk = len / QT_BLK;
  unsigned char *seen = calloc (nblk, 1);
  if (!header_ok (buf, type))
    r = -EOPNOTSUPP;
  else if (!seen)
    r = -ENOMEM;
  else
    {
      memcpy (info, buf + QT_INFO, 12);
      r = walk (buf, nblk, 1, 0, seen, s);
    }
  free (seen);
  free (buf);
  return r;
}

int
bfo_quota_check (ext2_filsys fs)
{
  if (!ext2fs_has_feature_quota (fs->super))
    return 0;
  int r = 0;
  for (int type = 0; type < QT_TYPES && r == 0; type++)
    if (quota_ino (fs, type))
      {
        struct dqset s = { 0 };
        unsigned char info[12];
        r = load_qfile (fs, type, &s, info);
        free (s.v);
        free (s.slot);
      }
  return r;
}

static int
cmp_id (const void *a, const void *b)
{
  uint32_t x = ((const struct dq *) a)->id, y = ((const struct dq *) b)->id;
  return x < y ? -1 : x > y;
}

/* The file for the entries of S (sorted by id), with the info block INFO
   (grace times and flags) of the old one: *OUT, *OUTLEN bytes.  Entries are
   packed in id order; each tree path leads to its entry's leaf block.  */
static int
build (int type, const unsigned char *info, const struct dqset *s, unsigned char **out,
       size_t *outlen)
{
  size_t cap = 16, nblk = 2;
  unsigned char *buf = calloc (cap, QT_BLK);
  if (!buf)
    return -ENOMEM;
  uint32_t leaf = 0, in_leaf = 0;
  for (size_t i = 0; i < s->n; i++)
    {
      /* At most a new leaf and three new tree blocks for this entry.  */
      if (nblk + 4 > cap)
        {
          unsigned char *nb = realloc (buf, 2 * cap * QT_BLK);
          if (!nb)
            {
              free (buf);
              return -ENOMEM;
            }
          memset (nb + cap * QT_BLK, 0, cap * QT_BLK);
          buf = nb;
          cap *= 2;
        }
      const struct dq *d = &s->v[i];
      if (!leaf || in_leaf == QT_PER_BLOCK)
        {
          leaf = nblk++;
          in_leaf = 0;
        }
      unsigned char *lb = buf + (size_t) leaf * QT_BLK;
      unsigned char *e = lb + QT_HEAD + in_leaf * QT_ENTRY;
      put32 (e, d->id);
      put64 (e + 8, d->ihard);
      put64 (e + 16, d->isoft);
      put64 (e + 24, d->inodes);
      put64 (e + 32, d->bhard);
      put64 (e + 40, d->bsoft);
      put64 (e + 48, d->space);
      put64 (e + 56, d->btime);
      put64 (e + 64, d->itime);
      static const unsigned char zero[QT_ENTRY];
      if (memcmp (e, zero, QT_ENTRY) == 0)
        put64 (e + 64, 1);
      in_leaf++;
      lb[8] = in_leaf;
      lb[9] = in_leaf >> 8;
      uint32_t blk = 1;
      for (int depth = 0; depth < QT_DEPTH; depth++)
        {
          unsigned char *ref = buf + (size_t) blk * QT_BLK + 4 * ((d->id >> (8 * (3 - depth))) & 0xff);
          if (depth == QT_DEPTH - 1)
            put32 (ref, leaf);
          else
            {
              if (!get32 (ref))
                put32 (ref, nblk++);
              blk = get32 (ref);
            }
        }
    }
  put32 (buf, qt_magic[type]);
  put32 (buf + 4, 1);
  memcpy (buf + QT_INFO, info, 12);         /* block and inode grace, flags */
  put32 (buf + QT_INFO + 12, nblk);         /* blocks in the file */
  put32 (buf + QT_INFO + 16, 0);            /* no free blocks */
  put32 (buf + QT_INFO + 20, leaf && in_leaf < QT_PER_BLOCK ? leaf : 0);  /* free entries */
  *out = buf;
  *outlen = nblk * QT_BLK;
  return 0;
}

static int
write_qfile (ext2_filsys fs, ext2_ino_t ino, const unsigned char *buf, size_t len)
{
  ext2_file_t f;
  if (ext2fs_file_open (fs, ino, EXT2_FILE_WRITE, &f))
    return -EIO;
  unsigned int done = 0;
  errcode_t err = ext2fs_file_write (f, buf, len, &done);
  if (!err && done != len)
    err = EXT2_ET_SHORT_WRITE;
  if (!err)
    err = ext2fs_file_set_size2 (f, len);
  errcode_t cerr = ext2fs_file_close (f);
  if (!err)
    err = cerr;
  return !err ? 0 : err == EXT2_ET_BLOCK_ALLOC_FAIL ? -ENOSPC : -EIO;
}

int
bfo_quota_update (ext2_filsys fs)
{
  if (!ext2fs_has_feature_quota (fs->super))
    return 0;
  struct dqset set[QT_TYPES] = { { 0 } };
  unsigned char info[QT_TYPES][12] = { { 0 } };
  bool on[QT_TYPES] = { false };
  int r = 0;
  for (int type = 0; type < QT_TYPES && r == 0; type++)
    {
      ext2_ino_t ino = quota_ino (fs, type);
      on[type] = ino != 0;
      if (!on[type])
        continue;
      /* (Limits and times only: the usage is what the inodes say.)  */
      r = load_qfile (fs, type, &set[type], info[type]);
    }

  /* The inodes e2fsck counts: the root and every ordinary inode in use but
     the project quota file, the orphan file and attribute inodes.  */
  ext2_inode_scan scan = NULL;
  size_t isize = EXT2_INODE_SIZE (fs->super);
  struct ext2_inode_large *li = r == 0 ? malloc (isize) : NULL;
  if (r == 0 && !li)
    r = -ENOMEM;
  if (r == 0 && ext2fs_open_inode_scan (fs, 0, &scan))
    r = -EIO;
  while (r == 0)
    {
      ext2_ino_t ino;
      errcode_t err = ext2fs_get_next_inode_full (scan, &ino, (struct ext2_inode *) li, isize);
      if (err)
        {
          r = -EIO;
          break;
        }
      if (ino == 0)
        break;
      if (!li->i_links_count || (li->i_flags & EXT4_EA_INODE_FL)
          || (ino != EXT2_ROOT_INO && ino < EXT2_FIRST_INODE (fs->super))
          || ino == fs->super->s_prj_quota_inum || ino == fs->super->s_orphan_file_inum)
        continue;
      blk64_t eablocks;
      unsigned int eainodes;
      r = bfo_ea_inode_charge (fs, ino, li, &eablocks, &eainodes);
      uint64_t space = (uint64_t) ext2fs_get_stat_i_blocks (fs, (struct ext2_inode *) li) << 9;
      for (int type = 0; type < QT_TYPES && r == 0; type++)
        {
          if (!on[type])
            continue;
          uint32_t id;
          if (type == 0)
            id = inode_uid (*li);
          else if (type == 1)
            id = inode_gid (*li);
          else
            id = isize > EXT2_GOOD_OLD_INODE_SIZE
                 && EXT2_GOOD_OLD_INODE_SIZE + (size_t) li->i_extra_isize
                    >= offsetof (struct ext2_inode_large, i_projid) + sizeof li->i_projid
                 ? li->i_projid : 0;
          struct dq *d = dq_get (&set[type], id);
          if (!d)
            r = -ENOMEM;
          else
            {
              d->space += space;
              d->inodes += 1 + eainodes;
            }
        }
    }
  if (scan)
    ext2fs_close_inode_scan (scan);
  free (li);

  for (int type = 0; type < QT_TYPES; type++)
    {
      if (r == 0 && on[type])
        {
          qsort (set[type].v, set[type].n, sizeof *set[type].v, cmp_id);
          unsigned char *out;
          size_t len;
          r = build (type, info[type], &set[type], &out, &len);
          if (r == 0)
            {
              r = write_qfile (fs, quota_ino (fs, type), out, len);
              free (out);
            }
        }
      free (set[type].v);
      free (set[type].slot);
    }
  return r;
}
