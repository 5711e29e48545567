/* patch-reflink.c: the reflink backend: a target receives the whole blocks of its range of
   the durable stem with FICLONERANGE (XFS, Btrfs, ...), sharing them, and its tail by a write.  */

#include <config.h>

#include "bfo-write-int.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

/* Clone one block of FD into a second helper file: the only reliable answer to
   "does this file system share extents" is the kernel's.  */
static int
reflink_probe (int dirfd, int fd)
{
  unsigned char block[BFO_STEM_MIN_ALIGN];
  memset (block, 'b', sizeof block);
  if (pwrite (fd, block, sizeof block, 0) != (ssize_t) sizeof block)
    return errno ? -errno : -EIO;
  char name[BFO_NAME_MAX];
  bfo_helper_name (name, BFO_PROBE_PREFIX, getpid (), bfo_seq_base () + 1);
  int dst = openat (dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (dst < 0)
    return -errno;
  struct file_clone_range r = { .src_fd = fd, .src_offset = 0, .src_length = sizeof block,
                                .dest_offset = 0 };
  int ret = ioctl (dst, FICLONERANGE, &r) < 0 ? -errno : 0;
  close (dst);
  unlinkat (dirfd, name, 0);
  return ret;
}

/* Errors that mean "this file system (or this pair of files) cannot clone".  */
static bool
clone_unsupported (int e)
{
  return e == EOPNOTSUPP || e == ENOTTY || e == EXDEV || e == EINVAL || e == ENOSYS;
}

/* Copy LEN bytes of the stem at OFF into FD at DOFF.  */
static int
copy_from_stem_at (int stem_fd, int fd, uint64_t off, uint64_t doff, uint64_t len)
{
  size_t bufsize = 1u << 20;
  unsigned char *buf = malloc (bufsize);
  if (!buf)
    return -ENOMEM;
  int ret = 0;
  for (uint64_t pos = 0; pos < len && ret == 0;)
    {
      size_t want = len - pos < bufsize ? len - pos : bufsize;
      ssize_t k = pread (stem_fd, buf, want, off + pos);
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0)
        {
          ret = k < 0 ? -errno : -EIO;   /* the stem is shorter than its journal says */
          break;
        }
      for (ssize_t w = 0; w < k;)
        {
          ssize_t m = pwrite (fd, buf + w, k - w, doff + pos + w);
          if (m < 0 && errno == EINTR)
            continue;
          if (m < 0)
            {
              ret = -errno;
              break;
            }
          w += m;
        }
      pos += k;
    }
  free (buf);
  return ret;
}

/* Write the LEN bytes of the tail at file offset OFF: from DATA when the caller
   has them, else from the stem at STEM_OFF.  */
static int
write_tail (const struct bfo_wctx *c, int fd, uint64_t off, const unsigned char *data,
            uint64_t stem_off, uint64_t len)
{
  if (!data)
    return copy_from_stem_at (c->stem_fd, fd, stem_off, off, len);
  while (len)
    {
      ssize_t k = pwrite (fd, data, len, off);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0)
        return -errno;
      data += k;
      off += k;
      len -= k;
    }
  return 0;
}

/* Clone the file's whole blocks from the stem; write the bytes of its last,
   partial block.  Cloning the padded block and truncating would be one syscall
   less, but truncating into a shared block makes XFS and Btrfs zero its tail,
   that is copy the block on write: per file a COW allocation, a 4 KiB write and
   a costlier truncate and close (bfo write of the Linux tree onto XFS: 94398
   write requests of 21 KiB and 125 s, against GNU tar's 9818 and 10 s).  */
static int
reflink_fill (const struct bfo_wctx *c, int fd, uint64_t stem_off, const void *data,
              uint64_t len, const char **op)
{
  if (len == 0)
    return 0;
  uint64_t whole = len / c->align * c->align;
  int ret = 0;
  /* A small file with a partial last block is written whole from the caller's
     data: its tail would be written anyway, and on its own (away from its
     cloned blocks, which the stem's next file follows) each tail became a
     request of its own.  The stem does not hold it (the writer keeps it in its
     side arena): the journal has its CRC32C, and recovery keeps it only whole,
     as a direct batch's file.  */
  if (c->written && len % c->align)
    (*c->written)++;              /* its tail, or all of it, is written */
  if (data && bfo_reflink_writes_whole (len, c->align))
    {
      *op = "write";
      return write_tail (c, fd, 0, data, stem_off, len);
    }
  if (whole)
    {
      struct file_clone_range r = { .src_fd = c->stem_fd, .src_offset = stem_off,
                                    .src_length = whole, .dest_offset = 0 };
      *op = "clone";
      if (ioctl (fd, FICLONERANGE, &r) < 0)
        {
          ret = -errno;
          if (c->copy_fallback && clone_unsupported (errno))
            {
              if (c->written && len % c->align == 0)
                (*c->written)++;
              *op = "write";
              ret = copy_from_stem_at (c->stem_fd, fd, stem_off, 0, whole);
            }
        }
      else
        c->stats->clones++;
    }
  if (ret == 0 && len > whole)
    {
      *op = "write";
      ret = write_tail (c, fd, whole, data ? (const unsigned char *) data + whole : NULL,
                        stem_off + whole, len - whole);
    }
  return ret;
}

const struct bfo_patcher bfo_patcher_reflink =
{
  .name = "reflink",
  .backend = BFO_BACKEND_REFLINK,
  .uses_stem = true,
  /* Clones share the fsync'd stem's blocks; the clone and the rename are metadata
     operations the file system journals in order.  The partial last blocks are
     written buffered: they must be durable before the journal and stem that can
     redo them go (sync_before_cleanup).  */
  .sync_before_rename = false,
  .sync_before_cleanup = true,
  .probe = reflink_probe,
  .fill = reflink_fill,
};
