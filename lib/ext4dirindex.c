/* Hashed (htree) indexes for directories an image writer made.

   Copyright (C) 2026 bfo developers.
   This program is free software: you can redistribute it and/or modify it
   under the terms of the GNU General Public License as published by the
   Free Software Foundation, either version 3 of the License, or (at your
   option) any later version.

   libext2fs links names into a directory one block after the other and
   never indexes it.  The kernel indexes a directory once it outgrows its
   first block (with dir_index), and looks names up through the index; in a
   big unindexed directory every lookup reads the blocks one after the other
   (5000 random lookups among 50000 names: 3.0 s against 0.21 s).  So once
   the writer is done, each directory it made that holds more than a block
   is written again in the kernel's format: the names sorted by their hash
   into leaf blocks, 20 % of each left free (as e2fsck -D leaves them), and
   a root block (with one level of index blocks below it when the leaves
   are too many for the root) that maps hash ranges to leaves.

   Crash safety: the new blocks are newly taken ones, written and synced
   before any directory's inode points to them (one sync for all); each
   directory then changes in one inode write, and its old blocks are freed.
   A crash leaves every directory whole, old or new, and at worst blocks
   taken that nothing uses (e2fsck gives them back).  */

#include <config.h>

#include "ext4dirindex.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <ext2fs/ext3_extents.h>

/* One name of the directory.  */
struct dx_name
{
  ext2_dirhash_t hash, minor;
  ext2_ino_t ino;
  int type;
  unsigned int len;
  char *name;
};

struct dx_read
{
  struct dx_name *n;
  size_t count, cap;
  ext2_ino_t parent;
  errcode_t err;
};

static int
read_cb (struct ext2_dir_entry *de, int offset, int blocksize, char *buf, void *arg)
{
  (void) offset;
  (void) blocksize;
  (void) buf;
  struct dx_read *r = arg;
  unsigned int len = ext2fs_dirent_name_len (de);
  if (len == 1 && de->name[0] == '.')
    return 0;
  if (len == 2 && de->name[0] == '.' && de->name[1] == '.')
    {
      r->parent = de->inode;
      return 0;
    }
  if (r->count == r->cap)
    {
      size_t ncap = r->cap ? 2 * r->cap : 256;
      struct dx_name *x = realloc (r->n, ncap * sizeof *x);
      if (!x)
        {
          r->err = EXT2_ET_NO_MEMORY;
          return DIRENT_ABORT;
        }
      r->n = x;
      r->cap = ncap;
    }
  char *name = malloc (len);
  if (!name)
    {
      r->err = EXT2_ET_NO_MEMORY;
      return DIRENT_ABORT;
    }
  memcpy (name, de->name, len);
  r->n[r->count++] = (struct dx_name) { 0, 0, de->inode, ext2fs_dirent_file_type (de), len, name };
  return 0;
}

/* e2fsck's order: hash, minor hash, name.  */
static int
by_hash (const void *a, const void *b)
{
  const struct dx_name *x = a, *y = b;
  if (x->hash != y->hash)
    return x->hash < y->hash ? -1 : 1;
  if (x->minor != y->minor)
    return x->minor < y->minor ? -1 : 1;
  unsigned int l = x->len < y->len ? x->len : y->len;
  int c = memcmp (x->name, y->name, l);
  return c ? c : (x->len > y->len) - (x->len < y->len);
}

/* The last entry LAST of a leaf block filled up to OFF takes the rest of it,
   up to END.  */
static void
close_leaf (ext2_filsys fs, struct ext2_dir_entry *last, unsigned int off, unsigned int end)
{
  unsigned int rec;
  if (last && ext2fs_get_rec_len (fs, last, &rec) == 0)
    ext2fs_set_rec_len (fs, rec + (end - off), last);
}

/* Lay NAMES[0..N) out in leaf blocks of BS bytes (BUF, grown as needed):
   their count in *NLEAF, each one's first hash in *HASHES (low bit set when
   the hash goes on from the block before, as the kernel marks it).  */
static errcode_t
fill_leaves (ext2_filsys fs, const struct dx_name *names, size_t n, char **buf,
             ext2_dirhash_t **hashes, size_t *nleaf)
{
  unsigned int bs = fs->blocksize;
  unsigned int csum = ext2fs_has_feature_metadata_csum (fs->super)
                      ? sizeof (struct ext2_dir_entry_tail) : 0;
  unsigned int end = bs - csum;
  unsigned int slack = end / 5;
  size_t cap = 0, nl = 0;
  char *b = NULL;
  ext2_dirhash_t *h = NULL;
  unsigned int off = end;       /* no block yet */
  struct ext2_dir_entry *last = NULL;
  ext2_dirhash_t prev = 1;
  for (size_t i = 0; i < n; i++)
    {
      unsigned int rec = EXT2_DIR_REC_LEN (names[i].len);
      if (off + rec > end || (off > 0 && end - off < slack && last))
        {
          close_leaf (fs, last, off, end);
          if (nl == cap)
            {
              size_t ncap = cap ? 2 * cap : 16;
              char *x = realloc (b, ncap * bs);
              ext2_dirhash_t *y = x ? realloc (h, ncap * sizeof *y) : NULL;
              if (x)
                b = x;
              if (!y)
                {
                  free (b);
                  free (h);
                  return EXT2_ET_NO_MEMORY;
                }
              h = y;
              cap = ncap;
            }
          memset (b + nl * bs, 0, bs);
          if (csum)
            ext2fs_initialize_dirent_tail (fs, EXT2_DIRENT_TAIL (b + nl * bs, bs));
          h[nl] = names[i].hash | (names[i].hash == prev);
          nl++;
          off = 0;
          last = NULL;
        }
      struct ext2_dir_entry *de = (struct ext2_dir_entry *) (b + (nl - 1) * bs + off);
      de->inode = names[i].ino;
      ext2fs_dirent_set_name_len (de, (int) names[i].len);
      ext2fs_dirent_set_file_type (de, names[i].type);
      memcpy (de->name, names[i].name, names[i].len);
      ext2fs_set_rec_len (fs, rec, de);
      last = de;
      off += rec;
      prev = names[i].hash;
    }
  close_leaf (fs, last, off, end);
  *buf = b;
  *hashes = h;
  *nleaf = nl;
  return 0;
}

/* An index block's entry table at ENTRIES (LIMIT of them fit): COUNT entries
   for leaves FIRST.. with their hashes (the first one's is implied 0).  */
static void
set_entries (struct ext2_dx_entry *entries, unsigned int limit, const ext2_dirhash_t *hashes,
             size_t count, blk64_t first)
{
  struct ext2_dx_countlimit *cl = (struct ext2_dx_countlimit *) entries;
  cl->limit = ext2fs_cpu_to_le16 (limit);
  cl->count = ext2fs_cpu_to_le16 (count);
  entries[0].block = ext2fs_cpu_to_le32 (first);
  for (size_t i = 1; i < count; i++)
    {
      entries[i].hash = ext2fs_cpu_to_le32 (hashes[i]);
      entries[i].block = ext2fs_cpu_to_le32 (first + i);
    }
}

/* A directory written again: its new blocks (at most 4 runs, mapped in the
   inode) and the blocks it had.  */
struct dx_job
{
  ext2_ino_t ino;
  blk64_t total;
  blk64_t run_start[4], run_len[4];
  int runs;
};

/* Blocks for TOTAL logical blocks in at most 4 runs, taken in the bitmap:
   false (none taken) if the free space is too broken up or too small.  */
static bool
take_blocks (ext2_filsys fs, ext2_ino_t dir, struct dx_job *j)
{
  blk64_t left = j->total;
  blk64_t goal = ext2fs_find_inode_goal (fs, dir, NULL, 0);
  j->runs = 0;
  while (left && j->runs < 4)
    {
      blk64_t start, len;
      if (ext2fs_new_range (fs, 0, goal, left, NULL, &start, &len) || !len)
        break;
      if (len > left)
        len = left;
      if (len > 32768)
        len = 32768;
      ext2fs_block_alloc_stats_range (fs, start, len, +1);
      j->run_start[j->runs] = start;
      j->run_len[j->runs++] = len;
      left -= len;
      goal = start + len;
    }
  if (!left)
    return true;
  for (int i = 0; i < j->runs; i++)
    ext2fs_block_alloc_stats_range (fs, j->run_start[i], j->run_len[i], -1);
  j->runs = 0;
  return false;
}

static blk64_t
job_pblk (const struct dx_job *j, blk64_t lb)
{
  for (int i = 0; i < j->runs; i++)
    {
      if (lb < j->run_len[i])
        return j->run_start[i] + lb;
      lb -= j->run_len[i];
    }
  return 0;
}

/* Phase 1 for DIR: its names sorted into new blocks, written; *J says where.
   0 with J->total 0 when DIR stays as it is.  */
static errcode_t
build (ext2_filsys fs, ext2_ino_t dir, struct dx_job *j)
{
  unsigned int bs = fs->blocksize;
  struct ext2_inode inode;
  memset (j, 0, sizeof *j);
  errcode_t err = ext2fs_read_inode (fs, dir, &inode);
  if (err)
    return err;
  struct ext3_extent_header *eh = (struct ext3_extent_header *) inode.i_block;
  if (!LINUX_S_ISDIR (inode.i_mode) || !(inode.i_flags & EXT4_EXTENTS_FL)
      || (inode.i_flags & (EXT2_INDEX_FL | EXT4_INLINE_DATA_FL | EXT4_CASEFOLD_FL
                           | EXT4_ENCRYPT_FL))
      || EXT2_I_SIZE (&inode) <= bs || ext2fs_le16_to_cpu (eh->eh_magic) != EXT3_EXT_MAGIC)
    return 0;

  struct dx_read r = { 0 };
  err = ext2fs_dir_iterate (fs, dir, 0, NULL, read_cb, &r);
  if (!err)
    err = r.err;
  int alg = fs->super->s_def_hash_version;
  if (alg <= EXT2_HASH_TEA && (fs->super->s_flags & EXT2_FLAGS_UNSIGNED_HASH))
    alg += 3;
  for (size_t i = 0; !err && i < r.count; i++)
    err = ext2fs_dirhash2 (alg, r.n[i].name, (int) r.n[i].len, NULL, 0,
                           fs->super->s_hash_seed, &r.n[i].hash, &r.n[i].minor);
  char *leaves = NULL, *blk = NULL;
  ext2_dirhash_t *hashes = NULL;
  size_t nleaf = 0;
  if (!err && !r.parent)
    err = EXT2_ET_DIR_CORRUPTED;
  if (!err)
    {
      qsort (r.n, r.count, sizeof *r.n, by_hash);
      err = fill_leaves (fs, r.n, r.count, &leaves, &hashes, &nleaf);
    }
  unsigned int tail = ext2fs_has_feature_metadata_csum (fs->super)
                      ? sizeof (struct ext2_dx_tail) : 0;
  unsigned int root_limit = (bs - 32 - tail) / sizeof (struct ext2_dx_entry);
  unsigned int node_limit = (bs - 8 - tail) / sizeof (struct ext2_dx_entry);
  size_t nnode = nleaf <= root_limit ? 0 : (nleaf + node_limit - 1) / node_limit;
  /* (Too many leaves for two levels, or no room: stays as it is.)  */
  if (!err && nleaf >= 1 && nnode <= root_limit)
    {
      j->ino = dir;
      j->total = 1 + nnode + nleaf;
      if (!take_blocks (fs, dir, j))
        j->total = 0;
    }
  if (j->total && !(blk = calloc (1, bs)))
    err = EXT2_ET_NO_MEMORY;
  for (blk64_t lb = 0; !err && lb < j->total; lb++)
    {
      const char *data;
      if (lb == 0)
        {
          /* The root: "." and ".." as the kernel writes them, then the index.  */
          memset (blk, 0, bs);
          int ft = ext2fs_has_feature_filetype (fs->super) ? EXT2_FT_DIR : 0;
          struct ext2_dir_entry *de = (struct ext2_dir_entry *) blk;
          de->inode = dir;
          ext2fs_dirent_set_name_len (de, 1);
          ext2fs_dirent_set_file_type (de, ft);
          de->name[0] = '.';
          ext2fs_set_rec_len (fs, 12, de);
          de = (struct ext2_dir_entry *) (blk + 12);
          de->inode = r.parent;
          ext2fs_dirent_set_name_len (de, 2);
          ext2fs_dirent_set_file_type (de, ft);
          de->name[0] = de->name[1] = '.';
          ext2fs_set_rec_len (fs, bs - 12, de);
          struct ext2_dx_root_info *info = (struct ext2_dx_root_info *) (blk + 24);
          info->hash_version = fs->super->s_def_hash_version;
          info->info_length = 8;
          info->indirect_levels = nnode ? 1 : 0;
          struct ext2_dx_entry *e = (struct ext2_dx_entry *) (blk + 32);
          if (!nnode)
            set_entries (e, root_limit, hashes, nleaf, 1);
          else
            {
              /* Node K covers leaves K * NODE_LIMIT..: its first leaf's hash.  */
              ext2_dirhash_t *nh = malloc (nnode * sizeof *nh);
              if (!nh)
                {
                  err = EXT2_ET_NO_MEMORY;
                  break;
                }
              for (size_t k = 0; k < nnode; k++)
                nh[k] = hashes[k * node_limit];
              set_entries (e, root_limit, nh, nnode, 1);
              free (nh);
            }
          data = blk;
        }
      else if (lb <= nnode)
        {
          size_t k = lb - 1, first = k * node_limit;
          size_t cnt = nleaf - first < node_limit ? nleaf - first : node_limit;
          memset (blk, 0, bs);
          struct ext2_dir_entry *de = (struct ext2_dir_entry *) blk;
          ext2fs_set_rec_len (fs, bs, de);
          set_entries ((struct ext2_dx_entry *) (blk + 8), node_limit, hashes + first, cnt,
                       1 + nnode + first);
          data = blk;
        }
      else
        data = leaves + (lb - 1 - nnode) * bs;
      /* (Checksums for DIR, whose blocks these become.)  */
      err = ext2fs_write_dir_block4 (fs, job_pblk (j, lb), (void *) data, 0, dir);
    }
  if (err && j->total)
    {
      for (int i = 0; i < j->runs; i++)
        ext2fs_block_alloc_stats_range (fs, j->run_start[i], j->run_len[i], -1);
      j->total = 0;
    }
  for (size_t i = 0; i < r.count; i++)
    free (r.n[i].name);
  free (r.n);
  free (leaves);
  free (hashes);
  free (blk);
  return err;
}

struct dx_old
{
  blk64_t *b;
  size_t n, cap;
};

static int
old_cb (ext2_filsys fs, blk64_t *blocknr, e2_blkcnt_t blockcnt, blk64_t ref_blk,
        int ref_offset, void *arg)
{
  (void) fs;
  (void) blockcnt;
  (void) ref_blk;
  (void) ref_offset;
  struct dx_old *o = arg;
  if (o->n == o->cap)
    {
      size_t ncap = o->cap ? 2 * o->cap : 64;
      blk64_t *x = realloc (o->b, ncap * sizeof *x);
      if (!x)
        return BLOCK_ABORT;
      o->b = x;
      o->cap = ncap;
    }
  o->b[o->n++] = *blocknr;
  return 0;
}

/* Phase 2 for J: the directory takes its new blocks in one inode write; its
   old ones (extent blocks too) are freed.  */
static errcode_t
commit (ext2_filsys fs, const struct dx_job *j)
{
  struct ext2_inode inode;
  errcode_t err = ext2fs_read_inode (fs, j->ino, &inode);
  struct dx_old o = { 0 };
  if (!err)
    err = ext2fs_block_iterate3 (fs, j->ino, BLOCK_FLAG_READ_ONLY, NULL, old_cb, &o);
  if (!err)
    {
      struct ext3_extent_header *eh = (struct ext3_extent_header *) inode.i_block;
      memset (inode.i_block, 0, sizeof inode.i_block);
      eh->eh_magic = ext2fs_cpu_to_le16 (EXT3_EXT_MAGIC);
      eh->eh_entries = ext2fs_cpu_to_le16 ((__u16) j->runs);
      eh->eh_max = ext2fs_cpu_to_le16 ((sizeof inode.i_block - sizeof *eh)
                                       / sizeof (struct ext3_extent));
      struct ext3_extent *x = (struct ext3_extent *) (eh + 1);
      blk64_t lb = 0;
      for (int i = 0; i < j->runs; i++, x++)
        {
          x->ee_block = ext2fs_cpu_to_le32 ((__u32) lb);
          x->ee_len = ext2fs_cpu_to_le16 ((__u16) j->run_len[i]);
          x->ee_start_hi = ext2fs_cpu_to_le16 ((__u16) (j->run_start[i] >> 32));
          x->ee_start = ext2fs_cpu_to_le32 ((__u32) j->run_start[i]);
          lb += j->run_len[i];
        }
      err = ext2fs_iblk_set (fs, &inode, j->total);
    }
  if (!err)
    err = ext2fs_inode_size_set (fs, &inode, j->total * fs->blocksize);
  if (!err)
    {
      inode.i_flags |= EXT2_INDEX_FL;
      err = ext2fs_write_inode (fs, j->ino, &inode);
    }
  for (size_t i = 0; !err && i < o.n; i++)
    ext2fs_block_alloc_stats2 (fs, o.b[i], -1);
  free (o.b);
  return err;
}

errcode_t
bfo_dir_index (ext2_filsys fs, ext2fs_inode_bitmap dirs)
{
  if (!ext2fs_has_feature_dir_index (fs->super))
    return 0;
  struct dx_job *jobs = NULL;
  size_t n = 0, cap = 0;
  errcode_t err = 0;
  ext2_ino_t ino = 1, last = fs->super->s_inodes_count;
  while (ino <= last && ext2fs_find_first_set_inode_bitmap2 (dirs, ino, last, &ino) == 0)
    {
      if (n == cap)
        {
          size_t ncap = cap ? 2 * cap : 64;
          struct dx_job *x = realloc (jobs, ncap * sizeof *x);
          if (!x)
            break;              /* (the others stay as they are) */
          jobs = x;
          cap = ncap;
        }
      err = build (fs, ino, &jobs[n]);
      if (err)
        break;
      if (jobs[n].total)
        n++;
      ino++;
    }
  /* The new blocks are on disk before any directory points to them.  */
  if (!err && n)
    err = io_channel_flush (fs->io);
  /* (After a failure, blocks taken for the directories not committed stay
     taken: the caller leaves the image for e2fsck, which gives them back.)  */
  for (size_t i = 0; !err && i < n; i++)
    err = commit (fs, &jobs[i]);
  free (jobs);
  return err;
}
