/* stem.c: the stem file of a batch write: allocated in one fallocate, written with large
   O_DIRECT writes through io_uring (buffered pwrite where O_DIRECT is refused), fsync'd.  */

#include <config.h>

#include "bfo-write-int.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* One write request of the stem.  */
struct wr
{
  const unsigned char *buf;
  uint32_t len;
  uint64_t off;
  int res;
};

int
bfo_stem_create (int dirfd, const char *name, uint64_t bytes, bool direct,
                 struct bfo_stem *stem)
{
  int flags = O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC;
  stem->fd = -1;
  stem->bytes = bytes;
  stem->direct = false;
  int fd = -1;
  if (direct)
    {
      fd = openat (dirfd, name, flags | O_DIRECT, 0600);
      if (fd >= 0)
        stem->direct = true;
      else if (errno != EINVAL)
        return -errno;
    }
  if (fd < 0)
    fd = openat (dirfd, name, flags, 0600);
  if (fd < 0)
    return -errno;
  stem->fd = fd;
  /* One allocation for the whole batch lets the file system place it contiguously;
     where fallocate is not offered the writes allocate as they go.  */
  if (bytes && fallocate (fd, 0, 0, bytes) < 0 && errno != EOPNOTSUPP && errno != ENOSYS)
    {
      int e = -errno;
      close (fd);
      unlinkat (dirfd, name, 0);
      stem->fd = -1;
      return e;
    }
  return 0;
}

/* Write W[i] synchronously (the no-ring path and the retry path).  */
static void
write_sync (int fd, struct wr *w)
{
  uint32_t done = 0;
  while (done < w->len)
    {
      ssize_t k = pwrite (fd, w->buf + done, w->len - done, w->off + done);
      if (k < 0 && errno == EINTR)
        continue;
      if (k <= 0)
        {
          w->res = k < 0 ? -errno : -EIO;
          return;
        }
      done += k;
    }
  w->res = done;
}

/* Issue WS through the ring at up to DEPTH in flight; each gets its result.  */
static int
run_writes (int fd, struct io_uring *ring, unsigned int depth, struct wr *ws, size_t n)
{
  if (!ring)
    {
      for (size_t i = 0; i < n; i++)
        write_sync (fd, &ws[i]);
      return 0;
    }
  size_t next = 0, inflight = 0, done = 0;
  while (done < n)
    {
      while (next < n && inflight < depth)
        {
          struct io_uring_sqe *sqe = io_uring_get_sqe (ring);
          if (!sqe)
            break;
          io_uring_prep_write (sqe, fd, ws[next].buf, ws[next].len, ws[next].off);
          io_uring_sqe_set_data64 (sqe, next);
          next++;
          inflight++;
        }
      int s = io_uring_submit_and_wait (ring, 1);
      if (s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY)
        return s;               /* the ring is broken; what is in flight is lost to us */
      struct io_uring_cqe *cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe (ring, head, cqe)
        {
          ws[io_uring_cqe_get_data64 (cqe)].res = cqe->res;
          seen++;
        }
      io_uring_cq_advance (ring, seen);
      inflight -= seen;
      done += seen;
    }
  return 0;
}

/* Switch the stem to buffered writes: O_DIRECT was refused at write time.  */
static void
go_buffered (struct bfo_stem *stem, struct bfo_write_stats *stats)
{
  if (!stem->direct)
    return;
  int fl = fcntl (stem->fd, F_GETFL);
  if (fl >= 0)
    fcntl (stem->fd, F_SETFL, fl & ~O_DIRECT);
  stem->direct = false;
  stats->stem_buffered++;
}

int
bfo_stem_write (struct bfo_stem *stem, struct io_uring *ring, unsigned int depth,
                uint64_t off, const void *data, uint64_t len, bool padded,
                struct bfo_write_stats *stats)
{
  const unsigned char *src = data;
  uint64_t padded_len = (len + BFO_STEM_MIN_ALIGN - 1) / BFO_STEM_MIN_ALIGN * BFO_STEM_MIN_ALIGN;
  if (!stem->direct)
    stats->stem_buffered++;
  /* Padded (arena) data goes out straight from it, all requests in one run at
     DEPTH in flight; unpadded data is copied into a few aligned bounce buffers,
     a window of them at a time.  */
  size_t window = padded ? (padded_len + BFO_STEM_IO_BYTES - 1) / BFO_STEM_IO_BYTES
                         : (depth < 4 ? depth : 4);
  if (window == 0)
    window = 1;
  unsigned char *bounce = NULL;
  if (!padded)
    {
      void *p;
      if (posix_memalign (&p, BFO_STEM_MIN_ALIGN, (size_t) window * BFO_STEM_IO_BYTES) != 0)
        return -ENOMEM;
      bounce = p;
    }
  struct wr *ws = malloc (window * sizeof *ws);
  if (!ws)
    {
      free (bounce);
      return -ENOMEM;
    }
  int ret = 0;
  uint64_t pos = 0;
  while (pos < padded_len && ret == 0)
    {
      size_t n = 0;
      for (; n < window && pos < padded_len; n++)
        {
          uint64_t chunk = padded_len - pos < BFO_STEM_IO_BYTES ? padded_len - pos : BFO_STEM_IO_BYTES;
          const unsigned char *buf = src + pos;
          if (!padded)
            {
              unsigned char *b = bounce + n * (size_t) BFO_STEM_IO_BYTES;
              uint64_t have = pos < len ? (len - pos < chunk ? len - pos : chunk) : 0;
              memcpy (b, src + pos, have);
              memset (b + have, 0, chunk - have);
              buf = b;
            }
          ws[n] = (struct wr) { buf, (uint32_t) chunk, off + pos, 0 };
          pos += chunk;
        }
      ret = run_writes (stem->fd, stem->direct ? ring : NULL, depth, ws, n);
      if (ret < 0)
        {
          /* The ring failed as a whole: redo this window synchronously.  */
          ret = 0;
          for (size_t i = 0; i < n; i++)
            write_sync (stem->fd, &ws[i]);
        }
      stats->stem_writes += n;
      for (size_t i = 0; i < n && ret == 0; i++)
        {
          if (ws[i].res == (int) ws[i].len)
            continue;
          if (ws[i].res == -EINVAL && stem->direct)
            go_buffered (stem, stats);
          else if (ws[i].res < 0 && ws[i].res != -EAGAIN && ws[i].res != -EINTR)
            {
              ret = ws[i].res;
              break;
            }
          /* Short, refused or interrupted: finish this request the plain way.  */
          uint32_t done = ws[i].res > 0 ? (uint32_t) ws[i].res : 0;
          struct wr rest = { ws[i].buf + done, ws[i].len - done, ws[i].off + done, 0 };
          if (stem->direct && (done % BFO_STEM_MIN_ALIGN))
            go_buffered (stem, stats);
          write_sync (stem->fd, &rest);
          if (rest.res < 0)
            ret = rest.res;
        }
    }
  free (ws);
  free (bounce);
  return ret;
}

int
bfo_stem_sync (struct bfo_stem *stem)
{
  return fsync (stem->fd) < 0 ? -errno : 0;
}

void
bfo_stem_close (struct bfo_stem *stem)
{
  if (stem->fd >= 0)
    close (stem->fd);
  stem->fd = -1;
}
