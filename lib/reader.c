/* reader.c: the batch reader (BFOr): queue files, then per batch open+fstat in inode
   order, FIEMAP, read the ORDER_LIST through io_uring with O_DIRECT, deliver in physical order.  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <sys/mman.h>
#include <unistd.h>

struct bfo_reader
{
  struct bfo_read_opts o;
  bfo_read_cb cb;
  void *arg;
  struct io_uring ring;
  bool have_ring;
  struct preaders *preaders;    /* no ring: threads that read in its stead */
  struct bfo_entry *entries;
  size_t n, cap;
  struct timespec first_add;
  struct bfo_read_stats stats;
  struct bfo_plan *plan;        /* non-NULL: plan only, read nothing */
  unsigned char *arena;         /* the current group's file buffers, reused */
  uint64_t arena_size;
  unsigned char *rawwin;        /* raw mode: the device-read window, reused */
  uint64_t rawwin_size;
  struct bfo_itable *itable;    /* root on ext4: inode-table read-ahead */
  bool itable_tried;
  int raw_fd;                   /* raw mode: the device, or -errno why not */
  dev_t raw_dev;
  bool raw_tried;               /* (read and set under raw_lock) */
  pthread_mutex_t raw_lock;     /* prepare_entry runs on two threads */
  int stop;                     /* the callback's stop value */
  size_t fd_room;               /* descriptors the reader may hold at once */
  bool keep_open;               /* this window's files stay open after phase 1 */
  bool mapped;                  /* phase 1 of the queued window is done ... */
  int map_ret;                  /* ... and returned this */
};

/* One read: FD's [off, off+len) into buf.  */
struct rd
{
  int fd;
  unsigned char *buf;
  uint32_t len;
  uint64_t off;
  int res;
};




int
bfo_reader_open (struct bfo_reader **reader, const struct bfo_read_opts *opts,
                 bfo_read_cb cb, void *arg)
{
  struct bfo_reader *r = calloc (1, sizeof *r);
  if (!r)
    return -ENOMEM;
  if (opts)
    r->o = *opts;
  if (!r->o.io_depth)
    r->o.io_depth = BFO_DEFAULT_IO_DEPTH;
  if (!r->o.batch_files)
    r->o.batch_files = BFO_DEFAULT_BATCH_FILES;
  if (!r->o.window_files)
    r->o.window_files = BFO_DEFAULT_WINDOW_FILES;
  if (!r->o.batch_bytes)
    r->o.batch_bytes = BFO_DEFAULT_BATCH_BYTES;
  if (!r->o.batch_ms)
    r->o.batch_ms = BFO_DEFAULT_BATCH_MS;
  if (!r->o.max_io_bytes)
    r->o.max_io_bytes = BFO_DEFAULT_MAX_IO_BYTES;
  if (!r->o.large_file_bytes)
    r->o.large_file_bytes = BFO_DEFAULT_LARGE_FILE_BYTES;
  if (!r->o.raw_gap_bytes)
    r->o.raw_gap_bytes = BFO_DEFAULT_RAW_GAP_BYTES;
  r->raw_fd = -1;
  pthread_mutex_init (&r->raw_lock, NULL);
  if (r->o.io_depth > 4096 || r->o.max_io_bytes < BFO_DIO_ALIGN || r->o.max_io_bytes > (1u << 30))
    {
      free (r);
      return -EINVAL;
    }
  r->o.max_io_bytes = round_up (r->o.max_io_bytes, BFO_DIO_ALIGN);
  if (r->o.large_file_bytes > r->o.batch_bytes)
    r->o.large_file_bytes = r->o.batch_bytes;
  if (r->o.large_file_bytes > (1ull << 30))
    r->o.large_file_bytes = 1ull << 30;
  r->o.large_file_bytes = round_up (r->o.large_file_bytes, BFO_DIO_ALIGN);
  /* Every queued file holds a descriptor during its batch: stay well below the
     soft limit, leaving room for the caller's own files: half the limit and
     32 more, but no more than BFO_READ_FD_RESERVE_MAX.  (With half of 65536,
     the limit bfotar raises the usual soft 1024 to, each of its two readers
     had 16368 descriptors, 16 fewer than its 16384-file window, so every
     window was opened twice.)  */
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
    {
      /* (a quarter of a small limit: 16 of 10 starved tar's own opens) */
      rlim_t reserve = rl.rlim_cur / 2 + 32;
      if (reserve > BFO_READ_FD_RESERVE_MAX)
        reserve = BFO_READ_FD_RESERVE_MAX;
      rlim_t room = rl.rlim_cur > 128 ? rl.rlim_cur - reserve
                    : rl.rlim_cur >= 8 ? rl.rlim_cur / 4 : 1;
      if ((r->o.flags & BFO_READ_SHARE_FDS) && room > 1)
        room /= 2;
      if (r->o.batch_files > room)
        r->o.batch_files = room;
      r->fd_room = room;
    }
  else
    r->fd_room = SIZE_MAX;
  if (r->o.window_files < r->o.batch_files)
    r->o.window_files = r->o.batch_files;
  r->cb = cb;
  r->arg = arg;
  /* No io_uring (old kernel, sysctl, seccomp): synchronous reads, same order.  */
  r->have_ring = io_uring_queue_init (r->o.io_depth, &r->ring, 0) == 0;
  *reader = r;
  return 0;
}

static int
queue_entry (struct bfo_reader *r, int dirfd, const char *path, dev_t dev, uint64_t ino,
             void *user);

int
bfo_reader_add (struct bfo_reader *r, const char *path, void *user)
{
  return queue_entry (r, AT_FDCWD, path, 0, 0, user);
}

int
bfo_reader_add_at (struct bfo_reader *r, int dirfd, const char *path, void *user)
{
  return queue_entry (r, dirfd, path, 0, 0, user);
}

int
bfo_reader_add_known (struct bfo_reader *r, int dirfd, const char *path, dev_t dev,
                      uint64_t ino, void *user)
{
  return queue_entry (r, dirfd, path, dev, ino, user);
}

static int
walk_add (void *ctx, const char *path, uint64_t ino)
{
  return queue_entry (ctx, AT_FDCWD, path, 0, ino, NULL);
}

static int
deliver_error (struct bfo_reader *r, const char *path, const struct stat *st, int error,
               const char *op, void *user)
{
  r->stats.errors++;
  if (r->plan || r->stop)
    return r->stop;
  struct bfo_file f = { .path = path, .st = st, .error = error, .error_op = op, .last = 1,
                        .user = user };
  int s = r->cb ? r->cb (&f, r->arg) : 0;
  if (s)
    r->stop = s;
  return r->stop;
}

static int
walk_err (void *ctx, const char *path, int error, const char *op)
{
  if (error < 0)
    return error;
  return deliver_error (ctx, path, NULL, error, op, NULL);
}

int
bfo_reader_add_tree (struct bfo_reader *r, const char *root)
{
  return bfo_walk_tree (root, walk_add, walk_err, r);
}

/* What run_reads tells as the reads complete (see read_group): DONE for each
   read that completed, AFTER once a round's completions are in and the ring
   has been topped up again, so that its work overlaps the reads in flight.  */
struct rd_progress
{
  void (*done) (void *ctx, size_t idx);
  void (*after) (void *ctx);
  void *ctx;
};

static void
rd_done (const struct rd_progress *pg, size_t idx)
{
  if (pg)
    pg->done (pg->ctx, idx);
}

/* Queue READS[*NEXT..N) into the ring while fewer than io_depth are in flight.  */
static void
fill_ring (struct bfo_reader *r, struct rd *rds, size_t n, size_t *next, size_t *inflight)
{
  while (*next < n && *inflight < r->o.io_depth)
    {
      struct io_uring_sqe *sqe = io_uring_get_sqe (&r->ring);
      if (!sqe)
        break;
      io_uring_prep_read (sqe, rds[*next].fd, rds[*next].buf, rds[*next].len, rds[*next].off);
      io_uring_sqe_set_data64 (sqe, *next);
      (*next)++;
      (*inflight)++;
    }
}

/* Without io_uring (a seccomp profile such as Docker's default one refuses
   io_uring_setup; kernel.io_uring_disabled; old kernels) one thread reading
   one request after another kept a single read in flight: bfotar -c of
   131072 cold 4 KiB files read for 6.8 s instead of 1.1 s.  Instead, up to
   PREAD_THREADS threads take the requests in the given order and pread
   them, so that many are in flight as with the ring.  */
enum { PREAD_THREADS = 32, PREAD_STACK = 64 << 10 };

struct preaders
{
  pthread_mutex_t lock;
  pthread_cond_t work, done;
  pthread_t tid[PREAD_THREADS];
  unsigned n_threads;
  bool quit;
  struct rd *rds;               /* the reads of the run_reads under way */
  size_t n, next;               /* how many; the next one to take */
  size_t *fin;                  /* indices of completed reads, in completion order */
  size_t n_fin, n_seen;         /* completed; handed to run_reads's caller */
};

static void
pread_one (struct rd *rd)
{
  ssize_t k;
  do
    k = pread (rd->fd, rd->buf, rd->len, rd->off);
  while (k < 0 && errno == EINTR);
  rd->res = k < 0 ? -errno : (int) k;
}

static void *
preader (void *arg)
{
  struct preaders *p = arg;
  pthread_mutex_lock (&p->lock);
  for (;;)
    {
      while (!p->quit && p->next >= p->n)
        pthread_cond_wait (&p->work, &p->lock);
      if (p->quit)
        break;
      size_t i = p->next++;
      struct rd *rd = &p->rds[i];
      pthread_mutex_unlock (&p->lock);
      pread_one (rd);
      pthread_mutex_lock (&p->lock);
      p->fin[p->n_fin++] = i;
      pthread_cond_signal (&p->done);
    }
  pthread_mutex_unlock (&p->lock);
  return NULL;
}

static void
preaders_stop (struct preaders *p)
{
  if (!p)
    return;
  pthread_mutex_lock (&p->lock);
  p->quit = true;
  pthread_cond_broadcast (&p->work);
  pthread_mutex_unlock (&p->lock);
  for (unsigned k = 0; k < p->n_threads; k++)
    pthread_join (p->tid[k], NULL);
  pthread_cond_destroy (&p->work);
  pthread_cond_destroy (&p->done);
  pthread_mutex_destroy (&p->lock);
  free (p);
}

/* The reader's pread threads, started at its first reads; NULL if none
   could be (then reads are made one after another).  */
static struct preaders *
preaders_get (struct bfo_reader *r)
{
  if (r->preaders)
    return r->preaders->n_threads ? r->preaders : NULL;
  struct preaders *p = calloc (1, sizeof *p);
  if (!p)
    return NULL;
  pthread_mutex_init (&p->lock, NULL);
  pthread_cond_init (&p->work, NULL);
  pthread_cond_init (&p->done, NULL);
  unsigned want = r->o.io_depth < PREAD_THREADS ? r->o.io_depth : PREAD_THREADS;
  while (p->n_threads < want
         && bfo_thread_create_stack (&p->tid[p->n_threads], "bfo-pread", preader, p,
                                     PREAD_STACK) == 0)
    p->n_threads++;
  r->preaders = p;
  r->stats.pread_threads = p->n_threads;
  return p->n_threads ? p : NULL;
}

/* run_reads without a ring: on the pread threads (or here, one by one, if
   there are none), telling PG of completions as the ring's loop does.  */
static void
run_preads (struct bfo_reader *r, struct rd *rds, size_t n, const struct rd_progress *pg)
{
  struct preaders *p = n > 1 ? preaders_get (r) : NULL;
  size_t *fin = p ? malloc (n * sizeof *fin) : NULL;
  if (!fin)
    {
      for (size_t i = 0; i < n; i++)
        {
          pread_one (&rds[i]);
          rd_done (pg, i);
        }
      return;
    }
  pthread_mutex_lock (&p->lock);
  p->rds = rds;
  p->fin = fin;
  p->n_fin = p->n_seen = p->next = 0;
  p->n = n;
  pthread_cond_broadcast (&p->work);
  while (p->n_seen < n)
    {
      while (p->n_fin == p->n_seen)
        pthread_cond_wait (&p->done, &p->lock);
      size_t from = p->n_seen, to = p->n_fin;
      p->n_seen = to;
      pthread_mutex_unlock (&p->lock);
      for (size_t k = from; k < to; k++)
        rd_done (pg, fin[k]);
      if (pg && pg->after)
        pg->after (pg->ctx);
      pthread_mutex_lock (&p->lock);
    }
  /* every read is done: no thread looks at RDS or FIN any more */
  p->rds = NULL;
  p->fin = NULL;
  p->n = p->next = 0;
  pthread_mutex_unlock (&p->lock);
  free (fin);
}

/* Run READS (in the given order) through the ring, keeping up to io_depth in
   flight and submitting sorted groups together so the block layer can merge
   neighbours.  Each rd gets its result in res; PG (or NULL) hears of them.  */
static void
run_reads (struct bfo_reader *r, struct rd *rds, size_t n, const struct rd_progress *pg)
{
  if (!r->have_ring)
    {
      run_preads (r, rds, n, pg);
      r->stats.requests += n;
      return;
    }
  size_t next = 0, inflight = 0, done = 0;
  bool failed = false;
  while (done < n)
    {
      fill_ring (r, rds, n, &next, &inflight);
      int s = failed ? 0 : io_uring_submit_and_wait (&r->ring, 1);
      if (!failed && s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY)
        {
          /* The ring failed as a whole: finish the rest synchronously.  */
          failed = true;
          for (size_t i = next; i < n; i++)
            {
              pread_one (&rds[i]);
              rd_done (pg, i);
            }
          done += n - next;
          next = n;
        }
      struct io_uring_cqe *cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe (&r->ring, head, cqe)
        {
          size_t idx = io_uring_cqe_get_data64 (cqe);
          rds[idx].res = cqe->res;
          rd_done (pg, idx);
          seen++;
        }
      io_uring_cq_advance (&r->ring, seen);
      inflight -= seen;
      done += seen;
      if (pg && pg->after && seen)
        {
          /* Top the ring up before the caller's work, so the device stays busy.  */
          if (!failed)
            {
              fill_ring (r, rds, n, &next, &inflight);
              io_uring_submit (&r->ring);
            }
          pg->after (pg->ctx);
        }
    }
  r->stats.requests += n;
}

/* Does FD give a byte at SIZE, its size by stat?  Where no file system
   keeps reads to the size (FUSE's direct I/O, procfs-like files), GNU cp
   copies up to the end its reads find.  */
static bool
reads_past (int fd, uint64_t size)
{
  unsigned char b;
  ssize_t k;
  while ((k = pread (fd, &b, 1, size)) < 0 && errno == EINTR)
    ;
  return k > 0;
}

/* Read the plain way: buffered pread of [0, size) into buf.  The bytes read
   (fewer than SIZE when the file ends first), or -errno.  */
static int64_t
read_plain (int fd, unsigned char *buf, uint64_t size)
{
  uint64_t got = 0;
  while (got < size)
    {
      ssize_t k = pread (fd, buf + got, size - got, got);
      if (k < 0)
        {
          if (errno == EINTR)
            continue;
          return -errno;
        }
      if (k == 0)
        break;
      got += k;
    }
  return got;
}

/* Data ranges of a file read the plain way, from SEEK_DATA/SEEK_HOLE (which
   every file system answers, if only with "all data"), so holes stay holes.  */
static void
ranges_by_seek (struct bfo_entry *e)
{
  free (e->ranges);
  e->ranges = NULL;
  e->n_ranges = 0;
  size_t cap = 0;
  off_t size = e->st.st_size, pos = 0;
  while (pos < size)
    {
      off_t data = lseek (e->fd, pos, SEEK_DATA);
      if (data < 0 || data >= size)
        break;
      off_t hole = lseek (e->fd, data, SEEK_HOLE);
      if (hole < 0 || hole > size)
        hole = size;
      if (e->n_ranges == cap)
        {
          cap = cap ? 2 * cap : 4;
          struct bfo_range *x = realloc (e->ranges, cap * sizeof *x);
          if (!x)
            {
              /* Without memory for the map, say "all data": never a false hole.  */
              free (e->ranges);
              e->ranges = malloc (sizeof *e->ranges);
              e->n_ranges = e->ranges != NULL;
              if (e->ranges)
                e->ranges[0] = (struct bfo_range) { 0, (uint64_t) size };
              return;
            }
          e->ranges = x;
        }
      e->ranges[e->n_ranges++] = (struct bfo_range) { (uint64_t) data, (uint64_t) (hole - data) };
      pos = hole;
    }
}

static bool
same_file_state (const struct stat *a, const struct stat *b)
{
  return a->st_size == b->st_size && a->st_ino == b->st_ino
         && a->st_mtim.tv_sec == b->st_mtim.tv_sec && a->st_mtim.tv_nsec == b->st_mtim.tv_nsec
         && a->st_ctim.tv_sec == b->st_ctim.tv_sec && a->st_ctim.tv_nsec == b->st_ctim.tv_nsec;
}

/* Buffers the reader keeps and reuses (a group's arena, raw mode's window, so
   their pages stay mapped): mapped whole, page-aligned, so that a child the
   program forks does not inherit them (see map_slab in pool.c: every fork
   would copy their page tables).  grow makes *BUF hold NEED bytes.  */
static void
unmap_buf (unsigned char **buf, uint64_t *size)
{
  if (*buf)
    munmap (*buf, *size);
  *buf = NULL;
  *size = 0;
}

static int
grow (unsigned char **buf, uint64_t *size, uint64_t need)
{
  if (need <= *size)
    return 0;
  unmap_buf (buf, size);
  void *p = mmap (NULL, need, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED)
    return -ENOMEM;
  madvise (p, need, MADV_DONTFORK);
  *buf = p;
  *size = need;
  return 0;
}

static void
drop_buf (struct bfo_entry *e)
{
  if (e->buf_owned)
    free (e->buf);
  e->buf = NULL;
  e->buf_owned = false;
}

/* A buffer of E's own (for files re-read the plain way with a new size).  */
static int
alloc_buf (struct bfo_entry *e, uint64_t size)
{
  drop_buf (e);
  e->buf_size = round_up (size ? size : 1, BFO_DIO_ALIGN);
  void *p;
  if (posix_memalign (&p, BFO_DIO_ALIGN, e->buf_size) != 0)
    return -ENOMEM;
  e->buf = p;
  e->buf_owned = true;
  return 0;
}

/* Zero what no extent covers (holes, unwritten ranges, fallback files get
   overwritten anyway), so holes read as zeros without reading them.  */
static void
zero_holes (struct bfo_entry *e)
{
  uint64_t pos = 0;
  for (size_t i = 0; i < e->n_ranges; i++)
    {
      if (e->ranges[i].offset > pos)
        memset (e->buf + pos, 0, e->ranges[i].offset - pos);
      pos = e->ranges[i].offset + e->ranges[i].length;
    }
  if (pos < e->buf_size)
    memset (e->buf + pos, 0, e->buf_size - pos);
}

static void
free_entry (struct bfo_entry *e)
{
  if (e->fd >= 0)
    close (e->fd);
  free (e->path);
  free (e->extents);
  free (e->ranges);
  drop_buf (e);
  memset (e, 0, sizeof *e);
  e->fd = -1;
}

static int
by_ino (const void *a, const void *b)
{
  const struct bfo_entry *x = a, *y = b;
  return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* Walked entries were regular files in their directory: do not follow a symlink
   that replaced one since; never block on a FIFO that replaced one.  */
static int
open_flags (const struct bfo_entry *e)
{
  return O_RDONLY | O_CLOEXEC | O_NONBLOCK | (e->ino ? O_NOFOLLOW : 0);
}

/* O_NOATIME, unless the caller wants atimes updated as a plain read would.  */
static int
noatime (const struct bfo_reader *r)
{
  return r->o.flags & BFO_READ_ATIME ? 0 : O_NOATIME;
}

/* Open E's file with FLAGS, and O_NOATIME where the caller may use it and
   the kernel lets us (EPERM: not the file's owner).  */
static int
open_noatime (const struct bfo_reader *r, const struct bfo_entry *e, int flags)
{
  int fd = openat (e->dirfd, e->path, flags | noatime (r));
  if (fd < 0 && errno == EPERM)
    fd = openat (e->dirfd, e->path, flags);
  return fd;
}

/* Open a group's files through the ring (phase 2 when there is no helper
   thread to open them ahead): many opens in flight let cold ones' inode-table
   reads overlap instead of queueing one behind another.  O_NOATIME spares an inode write per
   file where the caller may use it.  */
static void
open_entries (struct bfo_reader *r, struct bfo_entry *es, size_t n)
{
  if (!r->have_ring)
    return;                     /* prepare_entry opens them one by one */
  size_t next = 0, inflight = 0, done = 0;
  while (done < n)
    {
      while (next < n && inflight < r->o.io_depth)
        {
          if (es[next].fd >= 0 || es[next].error)
            {
              next++;
              done++;
              continue;
            }
          struct io_uring_sqe *sqe = io_uring_get_sqe (&r->ring);
          if (!sqe)
            break;
          io_uring_prep_openat (sqe, es[next].dirfd, es[next].path,
                                open_flags (&es[next]) | noatime (r)
                                | (es[next].direct ? O_DIRECT : 0), 0);
          io_uring_sqe_set_data64 (sqe, next);
          next++;
          inflight++;
        }
      if (inflight == 0)
        continue;
      int s = io_uring_submit_and_wait (&r->ring, 1);
      if (s < 0 && s != -EINTR && s != -EAGAIN && s != -EBUSY)
        return;                 /* the rest open synchronously */
      struct io_uring_cqe *cqe;
      unsigned head, seen = 0;
      io_uring_for_each_cqe (&r->ring, head, cqe)
        {
          struct bfo_entry *e = &es[io_uring_cqe_get_data64 (cqe)];
          if (cqe->res >= 0)
            e->fd = cqe->res, e->fd_direct = e->direct;
          else if (cqe->res != -EPERM && cqe->res != -EINVAL && cqe->res != -EAGAIN)
            e->error = -cqe->res;  /* EPERM: O_NOATIME refused; EINVAL: no async open */
          seen++;
        }
      io_uring_cq_advance (&r->ring, seen);
      inflight -= seen;
      done += seen;
    }
}

/* Phase 1 for one entry: open (unless open_entries did), fstat, FIEMAP.
   Counts into STATS (per thread).  */
static int
prepare_entry (struct bfo_reader *r, struct bfo_entry *e, struct bfo_read_stats *stats)
{
  /* Walked entries were regular files in their directory: do not follow a
     symlink that replaced one since.  O_NOATIME spares an inode write per file
     where allowed.  */
  if (e->fd < 0 && !e->error)
    {
      e->fd = open_noatime (r, e, open_flags (e));
      if (e->fd < 0)
        e->error = errno;
    }
  if (e->fd < 0)
    {
      e->error_op = "open";
      return 0;
    }
  if (fstat (e->fd, &e->st) < 0)
    {
      e->error = errno;
      e->error_op = "stat";
      return 0;
    }
  if (!S_ISREG (e->st.st_mode))
    {
      e->error = S_ISDIR (e->st.st_mode) ? EISDIR : EINVAL;
      e->error_op = "open";
      return 0;
    }
  stats->files++;
  stats->bytes += e->st.st_size;
  e->large = (uint64_t) e->st.st_size > r->o.large_file_bytes;
  if (r->o.flags & BFO_READ_NO_DIRECT)
    ;
  else if (e->st.st_size > 0)
    e->direct = true;
  /* A file whose data are all in the page cache is read from there: O_DIRECT
     (or the device) would read it from the disk again, and FIEMAP's sync would
     first write back its dirty pages, so a warm tree took as long as a cold one
     (bfotar -c of 131072 cached 4 KiB files: 3.0 s against GNU tar's 1.2 s).
     A plan (bfo_plan_tree) describes the disk's reads whatever is cached.
     One the kernel will not tell about (another user's, bfo_cache_state) is
     read buffered, in physical order with the others: from the cache if it
     is there, from the disk once if not.  */
  int cached = e->direct && !r->plan ? bfo_cache_state (e->fd, &e->st) : 0;
  if (cached < 0)
    {
      e->direct = false;
      stats->cache_unknown++;
    }
  if (cached > 0)
    {
      e->direct = false;
      stats->cached++;
      if (r->o.flags & BFO_READ_SKIP_CACHED)
        {
          e->skip = true;
          e->flags |= BFO_FILE_CACHED;
          return 0;
        }
      if (e->large)
        {
          e->fallback = "cached";  /* streamed, buffered */
          return 0;
        }
      /* Read whole through the ring with the others (a buffered read of cached
         pages completes as it is submitted).  Its data ranges: GNU cp and tar
         look for holes only when st_blocks is below the size; so do we.  */
      e->cached = true;
      if (e->st.st_blocks < e->st.st_size / 512)
        ranges_by_seek (e);
      else if ((e->ranges = malloc (sizeof *e->ranges)) != NULL)
        {
          e->ranges[0] = (struct bfo_range) { 0, (uint64_t) e->st.st_size };
          e->n_ranges = 1;
        }
      else
        return -ENOMEM;
      return 0;
    }
  int ret = bfo_map_entry (e, stats);
  if (ret < 0)
    return ret;
  if (e->fallback)
    e->direct = false;
  if ((r->o.flags & BFO_READ_RAW) && !e->fallback && !e->large && e->n_extents)
    {
      /* One device per reader: the first file's; files elsewhere read per file.  */
      pthread_mutex_lock (&r->raw_lock);
      if (!r->raw_tried)
        {
          r->raw_tried = true;
          r->raw_fd = bfo_raw_open (e->fd, &r->raw_dev);
        }
      e->raw = r->raw_fd >= 0 && e->st.st_dev == r->raw_dev;
      pthread_mutex_unlock (&r->raw_lock);
      if (e->raw)
        {
          e->direct = false;
          stats->raw_files++;
        }
      else
        stats->fallback_no_raw++;
    }
  return 0;
}

static int
deliver (struct bfo_reader *r, struct bfo_entry *e, const void *data, uint64_t offset,
         size_t len, int last)
{
  if (r->stop)
    return r->stop;
  struct bfo_file f = {
    .path = e->path, .st = &e->st, .offset = offset, .len = len, .data = data, .last = last,
    .ranges = e->ranges, .n_ranges = e->n_ranges, .flags = e->flags,
    .fallback = e->fallback, .user = e->user,
  };
  if (e->fallback)
    f.flags |= BFO_FILE_FALLBACK;
  int s = r->cb ? r->cb (&f, r->arg) : 0;
  if (s)
    r->stop = s;
  return r->stop;
}

/* Switch E's descriptor to O_DIRECT unless it was opened so; a file system
   may refuse (tmpfs, some FUSE).  */
static void
set_direct (struct bfo_entry *e)
{
  if (!e->direct || e->fd_direct)
    return;
  int fl = fcntl (e->fd, F_GETFL);
  if (fl < 0 || fcntl (e->fd, F_SETFL, fl | O_DIRECT) < 0)
    e->direct = false;
  else
    e->fd_direct = true;
}

/* E is read the plain way from now on: its descriptor loses O_DIRECT.  */
static void
unset_direct (struct bfo_entry *e)
{
  if (e->fd_direct)
    {
      int fl = fcntl (e->fd, F_GETFL);
      if (fl >= 0)
        fcntl (e->fd, F_SETFL, fl & ~O_DIRECT);
      e->fd_direct = false;
    }
  e->direct = false;
}

/* Build the reads of the ORDER_LIST for entries [0, n).  */
static struct rd *
make_reads (struct bfo_entry *es, const struct bfo_request *req, size_t n_req)
{
  struct rd *rds = malloc ((n_req ? n_req : 1) * sizeof *rds);
  if (!rds)
    return NULL;
  for (size_t i = 0; i < n_req; i++)
    {
      struct bfo_entry *e = &es[req[i].entry];
      uint64_t off = req[i].logical, end = req[i].logical + req[i].length;
      if (e->direct)
        {
          /* O_DIRECT wants aligned offsets and lengths; the widened range is
             still this file's bytes (or its zeros), read into its own buffer.  */
          off = off / BFO_DIO_ALIGN * BFO_DIO_ALIGN;
          end = round_up (end, BFO_DIO_ALIGN);
        }
      if (end > e->buf_size)
        end = e->buf_size;
      rds[i] = (struct rd) { e->fd, e->buf + off, (uint32_t) (end - off), off, 0 };
    }
  return rds;
}

static int
by_delivery (const void *a, const void *b)
{
  struct bfo_entry *const *x = a, *const *y = b;
  if ((*x)->first_physical != (*y)->first_physical)
    return (*x)->first_physical < (*y)->first_physical ? -1 : 1;
  return *x < *y ? -1 : *x > *y;
}

static int
by_req_physical (const void *a, const void *b)
{
  const struct bfo_request *x = a, *y = b;
  return x->physical < y->physical ? -1 : x->physical > y->physical;
}

/* Raw mode: the requests of raw entries, sorted by physical address, merged into
   runs (neighbours, and gaps up to raw_gap_bytes, up to max_io_bytes a run),
   read from the device in windows of bounded size, then each request's bytes
   copied into its file's buffer.  Only the requests' own ranges are copied:
   gap bytes and the slack of alignment never reach a file.  */
static int
read_raw (struct bfo_reader *r, struct bfo_entry *es, struct bfo_request *rq, size_t n)
{
  qsort (rq, n, sizeof *rq, by_req_physical);
  size_t i = 0;
  while (i < n)
    {
      /* One window of runs.  */
      size_t cap = 64, nruns = 0;
      struct run { uint64_t start, end; size_t first, last; } *runs = malloc (cap * sizeof *runs);
      if (!runs)
        return -ENOMEM;
      uint64_t window = 0;
      while (i < n && window < BFO_RAW_WINDOW_BYTES)
        {
          uint64_t start = rq[i].physical / BFO_DIO_ALIGN * BFO_DIO_ALIGN;
          uint64_t end = round_up (rq[i].physical + rq[i].length, BFO_DIO_ALIGN);
          size_t j = i + 1;
          while (j < n)
            {
              uint64_t nend = round_up (rq[j].physical + rq[j].length, BFO_DIO_ALIGN);
              if (rq[j].physical > end + r->o.raw_gap_bytes
                  || (nend > end ? nend : end) - start > r->o.max_io_bytes)
                break;
              if (rq[j].physical > end)
                r->stats.raw_gap_bytes += rq[j].physical / BFO_DIO_ALIGN * BFO_DIO_ALIGN > end
                                          ? rq[j].physical / BFO_DIO_ALIGN * BFO_DIO_ALIGN - end : 0;
              if (nend > end)
                end = nend;
              j++;
            }
          if (nruns == cap)
            {
              cap *= 2;
              struct run *x = realloc (runs, cap * sizeof *x);
              if (!x)
                {
                  free (runs);
                  return -ENOMEM;
                }
              runs = x;
            }
          runs[nruns++] = (struct run) { start, end, i, j };
          r->stats.merged += j - i - 1;
          window += end - start;
          i = j;
        }
      struct rd *rds = malloc (nruns * sizeof *rds);
      if (!rds || grow (&r->rawwin, &r->rawwin_size, window) < 0)
        {
          free (rds);
          free (runs);
          return -ENOMEM;
        }
      unsigned char *win = r->rawwin;
      uint64_t off = 0;
      for (size_t k = 0; k < nruns; k++)
        {
          rds[k] = (struct rd) { r->raw_fd, win + off, (uint32_t) (runs[k].end - runs[k].start),
                                 runs[k].start, 0 };
          off += runs[k].end - runs[k].start;
        }
      run_reads (r, rds, nruns, NULL);
      for (size_t k = 0; k < nruns; k++)
        for (size_t q = runs[k].first; q < runs[k].last; q++)
          {
            struct bfo_entry *e = &es[rq[q].entry];
            uint64_t at = rq[q].physical - runs[k].start;
            if (rds[k].res < 0 || (uint64_t) rds[k].res < at + rq[q].length)
              {
                /* A failed device read: this file goes the plain way.  */
                if (!e->fallback)
                  e->fallback = "raw-retry", r->stats.fallback_other++;
                continue;
              }
            memcpy (e->buf + rq[q].logical, rds[k].buf + at, rq[q].length);
          }
      free (rds);
      free (runs);
    }
  return 0;
}

/* Whether E's extents are still where FIEMAP said before the raw read.  */
static bool
same_extents (struct bfo_entry *e)
{
  struct bfo_entry again = { .fd = e->fd, .st = e->st };
  struct bfo_read_stats scratch = { 0 };
  bool same = bfo_map_entry (&again, &scratch) == 0 && !again.fallback
              && again.n_extents == e->n_extents
              && memcmp (again.extents, e->extents, e->n_extents * sizeof *e->extents) == 0;
  free (again.extents);
  free (again.ranges);
  return same;
}

static int read_large (struct bfo_reader *r, struct bfo_entry *e);

/* E's reads end elsewhere than its size with its stat unchanged (a sysfs
   attribute, a stale network size, FUSE direct I/O): it comes with
   BFO_FILE_SHORT and only the bytes it had, so no caller takes zeros for its
   data, or with BFO_FILE_LONG, so none takes its size for its end.  */
static void
size_not_end (struct bfo_reader *r, struct bfo_entry *e, bool longer)
{
  e->flags |= longer ? BFO_FILE_LONG : BFO_FILE_SHORT;
  r->stats.size_not_end++;
}

/* A file whose data must be read again the plain way (it changed, or its fast
   read failed): SEEK_DATA ranges, then streamed if it grew past the large-file
   threshold, else read whole; delivered.  */
static int
deliver_slow (struct bfo_reader *r, struct bfo_entry *e)
{
  unset_direct (e);
  ranges_by_seek (e);
  if ((uint64_t) e->st.st_size > r->o.large_file_bytes)
    {
      /* Grew past the large-file threshold meanwhile: stream it.  */
      drop_buf (e);
      return read_large (r, e);
    }
  int64_t k = alloc_buf (e, e->st.st_size);
  if (k == 0)
    {
      memset (e->buf, 0, e->buf_size);
      k = read_plain (e->fd, e->buf, e->st.st_size);
    }
  if (k == -ENOMEM)
    return k;
  if (k < 0)
    {
      deliver_error (r, e->path, &e->st, -k, "read", e->user);
      return 0;
    }
  if (k < e->st.st_size || reads_past (e->fd, e->st.st_size))
    size_not_end (r, e, k == e->st.st_size);
  deliver (r, e, e->buf, 0, k, 1);
  drop_buf (e);
  return 0;
}

/* Delivery of a group while its reads run (read_group).  */
struct stream
{
  struct bfo_reader *r;
  struct bfo_entry *es;
  const struct bfo_request *req;
  const struct rd *rds;
  uint32_t *pend;               /* per entry: its reads not yet done */
  struct bfo_entry **order;     /* delivery order */
  size_t n, next;               /* ORDER[NEXT] is the next to deliver */
  struct bfo_entry **later;     /* streamed after the reads (reuses ORDER's front) */
  size_t n_later;
  bool reading;                 /* the ring is in use */
  int ret;
  uint64_t us;                  /* spent delivering */
};

/* Read IDX is done: a failed or short fast read sends its file to the plain
   path; a real I/O error shows up there again and is reported then.  */
static void
stream_done (void *ctx, size_t idx)
{
  struct stream *st = ctx;
  uint32_t k = st->req[idx].entry;
  struct bfo_entry *e = &st->es[k];
  const struct rd *rd = &st->rds[idx];
  bool short_read = rd->res >= 0 && rd->res < (int) rd->len
                    && rd->off + rd->res < (uint64_t) e->st.st_size;
  if ((rd->res < 0 || short_read) && !e->fallback)
    {
      e->fallback = rd->res == -EINVAL ? "unaligned" : "read-retry";
      if (rd->res == -EINVAL)
        st->r->stats.fallback_unaligned++;
      else
        st->r->stats.fallback_other++;
    }
  st->pend[k]--;
}

/* Deliver, in order, the files whose reads are all done.  */
static void
stream_after (void *ctx)
{
  struct stream *st = ctx;
  struct bfo_reader *r = st->r;
  uint64_t t0 = now_us ();
  for (; st->next < st->n && st->ret == 0 && !r->stop; st->next++)
    {
      struct bfo_entry *e = st->order[st->next];
      if (st->pend[e - st->es])
        break;
      if (e->error)
        {
          deliver_error (r, e->path, NULL, e->error, e->error_op, e->user);
          continue;
        }
      if (e->skip)
        {
          deliver (r, e, NULL, 0, 0, 1);
          continue;
        }
      struct stat now;
      bool changed = fstat (e->fd, &now) == 0 && !same_file_state (&e->st, &now);
      /* Device bytes are this file's only if its blocks did not move meanwhile.  */
      if (!changed && e->raw && !e->fallback && !same_extents (e))
        changed = true;
      if (changed)
        {
          e->flags |= BFO_FILE_CHANGED;
          r->stats.fallback_changed++;
          e->st = now;
        }
      if (changed || e->fallback)
        {
          if (st->reading && (uint64_t) e->st.st_size > r->o.large_file_bytes)
            st->later[st->n_later++] = e;       /* (NEXT is ahead of it) */
          else
            st->ret = deliver_slow (r, e);
          continue;
        }
      deliver (r, e, e->buf, 0, e->st.st_size, 1);
      drop_buf (e);
    }
  st->us += now_us () - t0;
}

/* Read and deliver a group of small entries whose buffers fit the batch bytes.  */
static int
read_group (struct bfo_reader *r, struct bfo_entry *es, size_t n)
{
  int ret = 0;
  uint64_t t_read = now_us ();
  /* One arena for the group: no allocation or page faults per file.  */
  uint64_t total = 0;
  for (size_t i = 0; i < n; i++)
    if (!es[i].error && !es[i].skip)
      total += round_up (es[i].st.st_size ? es[i].st.st_size : 1, BFO_DIO_ALIGN);
  if ((ret = grow (&r->arena, &r->arena_size, total ? total : BFO_DIO_ALIGN)) < 0)
    return ret;
  uint64_t off = 0;
  for (size_t i = 0; i < n; i++)
    {
      struct bfo_entry *e = &es[i];
      if (e->error || e->skip)
        continue;
      drop_buf (e);
      e->buf_size = round_up (e->st.st_size ? e->st.st_size : 1, BFO_DIO_ALIGN);
      e->buf = r->arena + off;
      off += e->buf_size;
      set_direct (e);
      zero_holes (e);
      e->first_physical = 0;
    }
  struct bfo_request *req;
  size_t n_req;
  if ((ret = bfo_order_build (es, n, r->o.max_io_bytes, &req, &n_req)) < 0)
    return ret;
  /* Raw entries' requests go to the device, merged across files; the rest
     keep their order and go through each file's descriptor.  */
  size_t n_fd = 0, n_raw = 0;
  for (size_t i = 0; i < n_req; i++)
    if (!es[req[i].entry].raw)
      req[n_fd++] = req[i];
    else
      n_raw++;
  if (n_raw)
    {
      struct bfo_request *rq = malloc (n_raw * sizeof *rq);
      if (!rq)
        {
          free (req);
          return -ENOMEM;
        }
      size_t k = 0;
      for (size_t i = 0; i < n; i++)
        if (es[i].raw)
          for (size_t x = 0; x < es[i].n_extents; x++)
            for (uint64_t off = 0; off < es[i].extents[x].length; off += r->o.max_io_bytes)
              {
                uint64_t len = es[i].extents[x].length - off;
                if (len > r->o.max_io_bytes)
                  len = r->o.max_io_bytes;
                rq[k++] = (struct bfo_request) { (uint32_t) i, es[i].extents[x].logical + off,
                                                 es[i].extents[x].physical + off, len };
              }
      ret = read_raw (r, es, rq, k);
      free (rq);
      if (ret < 0)
        {
          free (req);
          return ret;
        }
    }
  n_req = n_fd;
  struct rd *rds = make_reads (es, req, n_req);
  struct bfo_entry **order = malloc ((n ? n : 1) * sizeof *order);
  uint32_t *pend = calloc (n ? n : 1, sizeof *pend);
  if (!rds || !order || !pend)
    {
      free (rds);
      free (order);
      free (pend);
      free (req);
      return -ENOMEM;
    }
  for (size_t i = 0; i < n; i++)
    order[i] = &es[i];
  qsort (order, n, sizeof *order, by_delivery);
  for (size_t i = 0; i < n_req; i++)
    pend[req[i].entry]++;
  /* Files are delivered, in order, as soon as their reads are done, while the
     ring keeps the later ones in flight.  Delivering a group only after all
     its reads left the device idle meanwhile (bfotar -c of 131072 aged 4 KiB
     files: read 1.8 s, deliver 0.5 s); alternating runs on one ext4 image,
     3.45-3.70 s before, 3.01-3.47 s after.  Files that must be streamed again
     after all wait for the end of the reads: streaming uses the ring.  */
  struct stream st = { .r = r, .es = es, .req = req, .rds = rds, .pend = pend,
                       .order = order, .n = n, .later = order };
  struct rd_progress pg = { stream_done, stream_after, &st };
  stream_after (&st);            /* (files with no reads: the ring is free) */
  st.reading = true;
  run_reads (r, rds, n_req, &pg);
  st.reading = false;
  stream_after (&st);
  r->stats.us_read += now_us () - t_read - st.us;
  uint64_t t_later = now_us ();
  for (size_t i = 0; i < st.n_later && st.ret == 0 && !r->stop; i++)
    st.ret = deliver_slow (r, st.later[i]);
  r->stats.us_deliver += st.us + (now_us () - t_later);
  free (rds);
  free (req);
  free (order);
  free (pend);
  return st.ret ? st.ret : r->stop;
}

/* Stream one large file in pieces of large_file_bytes, each piece's data ranges
   read through the ring in max_io_bytes requests submitted together.  */
static int
read_large (struct bfo_reader *r, struct bfo_entry *e)
{
  uint64_t piece = r->o.large_file_bytes, size = e->st.st_size;
  void *p;
  if (posix_memalign (&p, BFO_DIO_ALIGN, piece) != 0)
    return -ENOMEM;
  unsigned char *buf = p;
  if (e->fallback)
    ranges_by_seek (e);
  set_direct (e);
  size_t max_rds = piece / r->o.max_io_bytes + 2 * (e->n_ranges + 1);
  struct rd *rds = malloc (max_rds * sizeof *rds);
  if (!rds)
    {
      free (buf);
      return -ENOMEM;
    }
  int ret = 0;
  for (uint64_t base = 0; base < size && !r->stop; base += piece)
    {
      uint64_t len = size - base < piece ? size - base : piece;
      size_t n = 0;
      if (e->fallback)
        rds[n++] = (struct rd) { e->fd, buf, (uint32_t) len, base, 0 };
      else
        {
          memset (buf, 0, len);
          for (size_t i = 0; i < e->n_ranges; i++)
            {
              uint64_t a = e->ranges[i].offset, b = a + e->ranges[i].length;
              if (b <= base || a >= base + len)
                continue;
              a = a < base ? base : a;
              b = b > base + len ? base + len : b;
              if (e->direct)
                {
                  a = a / BFO_DIO_ALIGN * BFO_DIO_ALIGN;
                  b = round_up (b, BFO_DIO_ALIGN);
                  if (b > base + piece)
                    b = base + piece;
                }
              for (uint64_t o = a; o < b; o += r->o.max_io_bytes)
                {
                  uint64_t l = b - o < r->o.max_io_bytes ? b - o : r->o.max_io_bytes;
                  rds[n++] = (struct rd) { e->fd, buf + (o - base), (uint32_t) l, o, 0 };
                }
            }
        }
      run_reads (r, rds, n, NULL);
      for (size_t i = 0; i < n; i++)
        {
          uint64_t want = rds[i].off + rds[i].len > size ? size - rds[i].off : rds[i].len;
          if (rds[i].res < 0 || (uint64_t) rds[i].res < want)
            {
              /* Retry the piece the plain way before calling it an error.  */
              unset_direct (e);
              memset (buf, 0, len);
              uint64_t got = 0;
              while (got < len)
                {
                  ssize_t k = pread (e->fd, buf + got, len - got, base + got);
                  if (k < 0 && errno == EINTR)
                    continue;
                  if (k < 0)
                    {
                      ret = deliver_error (r, e->path, &e->st, errno, "read", e->user);
                      goto out;
                    }
                  if (k == 0)
                    break;
                  got += k;
                }
              if (got < len)
                {
                  /* Ended early: this piece is its last.  */
                  size_not_end (r, e, false);
                  len = got;
                  size = base + got;
                }
              break;
            }
        }
      int last = base + len >= size;
      if (last && !(e->flags & BFO_FILE_SHORT) && (e->fallback || !e->direct)
          && reads_past (e->fd, size))
        size_not_end (r, e, true);
      if (last)
        {
          struct stat now;
          if (fstat (e->fd, &now) == 0 && !same_file_state (&e->st, &now))
            {
              e->flags |= BFO_FILE_CHANGED;
              r->stats.fallback_changed++;
            }
        }
      deliver (r, e, buf, base, len, last);
    }
 out:
  free (rds);
  free (buf);
  return ret ? ret : r->stop;
}

static void
plan_group (struct bfo_reader *r, struct bfo_entry *es, size_t n)
{
  struct bfo_request *req;
  size_t n_req;
  if (bfo_order_build (es, n, r->o.max_io_bytes, &req, &n_req) < 0)
    return;
  r->plan->requests += n_req;
  for (size_t i = 0; i < n_req; i++)
    r->plan->request_bytes += req[i].length;
  r->plan->sequential += bfo_order_sequential (req, n_req);
  free (req);
}

/* The inode tables of the file system of the window's first file (root on
   ext2/3/4), opened once; NULL elsewhere.  */
static struct bfo_itable *
reader_itable (struct bfo_reader *r)
{
  if (!r->itable_tried && r->n > 0 && geteuid () == 0)
    {
      r->itable_tried = true;
      if (bfo_itable_open (r->entries[0].dirfd, r->entries[0].path, &r->itable) < 0)
        r->itable = NULL;
    }
  return r->itable;
}

/* As root on ext4, read the window's inode-table blocks ahead in large requests
   (the opens would otherwise fetch them one dependent read at a time).  */
static void
prefetch_inodes (struct bfo_reader *r)
{
  if ((r->o.flags & BFO_READ_NO_PREFETCH) || !reader_itable (r))
    return;
  uint64_t *inos = malloc (r->n * sizeof *inos);
  if (!inos)
    return;
  /* (not those the caller has just stat'ed: their blocks are in the cache) */
  for (size_t i = 0; i < r->n; i++)
    inos[i] = r->entries[i].dev ? 0 : r->entries[i].ino;
  r->stats.prefetch_requests += bfo_itable_prefetch (r->itable, inos, r->n);
  free (inos);
}

/* Phase 1 without opening E (BFO_READ_MAP_INODES): its place from its inode
   in the inode table, read through the block device's cache (bfo_itable_inode),
   as one extent from its first block, its data one range; phase 2 opens it,
   takes its fstat for the truth and reads it through its descriptor by its
   logical offsets (reopen_group), so the inode only decides the order of the
   reads.  Per file, phase 1 was an open, an fstat, a FIEMAP, a cachestat and
   a close: about a sixth of all the CPU time of bfotar -c of an aged 4 KiB set.
   False (phase 1 as usual) when the inode does not say plainly where the
   data lie, or the file is empty or large.  */
static bool
map_by_inode (struct bfo_reader *r, struct bfo_entry *e, struct bfo_itable_cursor *c)
{
  struct bfo_itable_inode in;
  if (!e->ino || !e->dev || e->error || e->fd >= 0
      || bfo_itable_inode (r->itable, c, e->dev, e->ino, &in) < 0
      || in.size == 0 || in.size > r->o.large_file_bytes)
    return false;
  e->extents = malloc (sizeof *e->extents);
  e->ranges = malloc (sizeof *e->ranges);
  if (!e->extents || !e->ranges)
    {
      free (e->extents);
      free (e->ranges);
      e->extents = NULL;
      e->ranges = NULL;
      return false;
    }
  e->extents[0] = (struct bfo_extent) { 0, in.block * in.block_size,
                                        round_up (in.size, BFO_DIO_ALIGN) };
  e->n_extents = 1;
  e->ranges[0] = (struct bfo_range) { 0, in.size };
  e->n_ranges = 1;
  memset (&e->st, 0, sizeof e->st);
  e->st.st_mode = S_IFREG;
  e->st.st_size = in.size;
  e->st.st_ino = e->ino;
  e->st.st_dev = e->dev;
  e->inode_mapped = true;
  e->direct = !(r->o.flags & BFO_READ_NO_DIRECT);
  r->stats.files++;
  r->stats.bytes += in.size;
  r->stats.extents++;
  r->stats.inode_mapped++;
  return true;
}

/* Delivery classes: failed and plain-path files, fast-path files by their first
   extent, large files (streamed one by one, also by first extent).  */
static int
entry_class (const struct bfo_entry *e)
{
  if (e->error || e->fallback || e->skip || e->n_extents == 0)
    return 0;
  return e->large ? 2 : 1;
}

static int
by_class_physical (const void *a, const void *b)
{
  const struct bfo_entry *x = a, *y = b;
  int cx = entry_class (x), cy = entry_class (y);
  if (cx != cy)
    return cx - cy;
  uint64_t px = x->n_extents ? x->extents[0].physical : 0;
  uint64_t py = y->n_extents ? y->extents[0].physical : 0;
  if (px != py)
    return px < py ? -1 : 1;
  return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* The group's files were closed after phase 1: open them again (through the
   ring when RING, else one by one) and make sure each is still the file that
   was mapped; one that changed meanwhile goes the plain way, one that is gone
   is reported.  Counts into STATS.  */
static void
reopen_group (struct bfo_reader *r, struct bfo_entry *es, size_t n, bool ring,
              struct bfo_read_stats *stats)
{
  if (ring)
    open_entries (r, es, n);
  for (size_t i = 0; i < n; i++)
    {
      struct bfo_entry *e = &es[i];
      if (e->error || e->skip)
        continue;
      if (e->fd < 0)
        {
          /* Opened O_DIRECT at once if it will be read so (two fcntl calls
             per file less); a file system refusing it at open says EINVAL.  */
          e->fd = open_noatime (r, e, open_flags (e) | (e->direct ? O_DIRECT : 0));
          e->fd_direct = e->fd >= 0 && e->direct;
          if (e->fd < 0 && errno == EINVAL && e->direct)
            e->fd = open_noatime (r, e, open_flags (e));
        }
      struct stat now;
      if (e->fd < 0 || fstat (e->fd, &now) < 0)
        {
          e->error = errno;
          e->error_op = "open";
          continue;
        }
      bool placed = e->inode_mapped;
      int cached;
      e->inode_mapped = false;
      if (placed && S_ISREG (now.st_mode) && now.st_ino == e->ino && now.st_dev == e->dev)
        {
          /* Placed by its inode, not opened (map_by_inode): this fstat is the
             first look at it.  What the inode table said may lag (ext4 writes
             the size there as data reach the disk).  */
          e->st = now;
          e->extents[0].length = round_up (now.st_size, BFO_DIO_ALIGN);
          e->ranges[0].length = now.st_size;
          if (now.st_size == 0 || (uint64_t) now.st_size > r->o.large_file_bytes)
            {
              e->fallback = "inode";
              stats->fallback_other++;
              unset_direct (e);
            }
          else if ((cached = bfo_cache_state (e->fd, &now)) < 0)
            {
              stats->cache_unknown++;
              unset_direct (e);
            }
          else if (cached)
            {
              stats->cached++;
              if (r->o.flags & BFO_READ_SKIP_CACHED)
                {
                  e->skip = true;
                  e->flags |= BFO_FILE_CACHED;
                }
              else
                {
                  e->fallback = "cached";
                  unset_direct (e);
                }
            }
          continue;
        }
      if (!same_file_state (&e->st, &now))
        {
          e->st = now;
          e->flags |= BFO_FILE_CHANGED;
          stats->fallback_changed++;
          if (!e->fallback)
            e->fallback = "changed";
          unset_direct (e);
          e->raw = e->cached = false;
          e->large = (uint64_t) now.st_size > r->o.large_file_bytes;
          if (!S_ISREG (now.st_mode))
            e->error = EINVAL, e->error_op = "open";
        }
    }
}

static void
close_group (struct bfo_entry *es, size_t n)
{
  for (size_t i = 0; i < n; i++)
    if (es[i].fd >= 0)
      {
        close (es[i].fd);
        es[i].fd = -1;
        es[i].fd_direct = false;
      }
}

/* Phase 1 for ES[0..N) on two threads: per file it is system calls only (open,
   fstat, FIEMAP, close), which on one core were about half of a 4 KiB set's
   wall time (1.45 s of mapping for 131072 files).  The opens used to go through
   the ring first, so that cold opens' inode-table reads would overlap; with
   the two threads (and ext4's own inode read-ahead) plain opens on the threads
   measured faster: phase 1 of the aged 4 KiB set 0.89-0.98 s against
   1.22-1.38 s, with and without the root inode-table prefetch.  Each thread
   closes its file at once, so phase 1 holds two descriptors.  */
struct prep_job
{
  struct bfo_reader *r;
  struct bfo_entry *es;
  size_t n;
  struct bfo_read_stats stats;
  int ret;
  pthread_t tid;
};

static void *
prepare_part (void *arg)
{
  struct prep_job *j = arg;
  for (size_t i = 0; i < j->n && j->ret == 0; i++)
    {
      if (j->es[i].inode_mapped)
        continue;
      j->ret = prepare_entry (j->r, &j->es[i], &j->stats);
      if (j->es[i].fd >= 0 && !j->r->keep_open)
        {
          close (j->es[i].fd);
          j->es[i].fd = -1;
        }
    }
  return NULL;
}

_Static_assert (sizeof (struct bfo_read_stats) % sizeof (uint64_t) == 0,
                "bfo_read_stats holds only uint64_t counters");

static int
prepare_entries (struct bfo_reader *r, struct bfo_entry *es, size_t n)
{
  struct prep_job jobs[2] = { { .r = r, .es = es, .n = n } };
  bool two = n >= BFO_READ_PREP_MIN_FILES;
  if (two)
    {
      jobs[0].n = n / 2;
      jobs[1] = (struct prep_job) { .r = r, .es = es + n / 2, .n = n - n / 2 };
      two = bfo_thread_create (&jobs[1].tid, "bfo-prep", prepare_part, &jobs[1]) == 0;
      if (!two)
        jobs[0].n = n;
    }
  prepare_part (&jobs[0]);
  if (two)
    pthread_join (jobs[1].tid, NULL);
  BFO_COUNTERS_ADD (&r->stats, &jobs[0].stats);
  if (two)
    BFO_COUNTERS_ADD (&r->stats, &jobs[1].stats);
  return jobs[0].ret ? jobs[0].ret : two ? jobs[1].ret : 0;
}

/* Phase 2 runs group after group: reopen, read, deliver, close.  The reopen
   (an open and an fstat per file, all in the inode cache by now) is CPU work
   that the next group can do on a second thread while this group's reads are
   in flight: on the 4 KiB set about 0.4 s of 3.7 s.  The helper runs at most
   one group ahead, and only while both groups' descriptors fit the budget.  */
struct group
{
  size_t start, n;
  bool large;                   /* one large file, streamed */
};

struct reopen_pipe
{
  struct bfo_reader *r;
  struct bfo_entry *es;
  const struct group *g;
  size_t n_g;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  size_t ready;                 /* groups reopened */
  size_t done;                  /* groups read and closed */
  bool stop;
  struct bfo_read_stats stats;  /* the helper's counts */
};

static void *
reopen_ahead (void *arg)
{
  struct reopen_pipe *p = arg;
  for (size_t k = 0; k < p->n_g; k++)
    {
      pthread_mutex_lock (&p->mu);
      while (!p->stop && k > p->done
             && (k > p->done + 1 || p->g[k - 1].n + p->g[k].n > p->r->fd_room))
        pthread_cond_wait (&p->cv, &p->mu);
      bool stop = p->stop;
      pthread_mutex_unlock (&p->mu);
      if (stop)
        break;
      reopen_group (p->r, p->es + p->g[k].start, p->g[k].n, false, &p->stats);
      pthread_mutex_lock (&p->mu);
      p->ready = k + 1;
      pthread_cond_broadcast (&p->cv);
      pthread_mutex_unlock (&p->mu);
    }
  return NULL;
}

/* Read the groups one by one (the reopen in turn, or a group ahead on the
   helper thread when there are several).  */
static int
read_groups (struct bfo_reader *r, struct bfo_entry *es, const struct group *g, size_t n_g)
{
  struct reopen_pipe p = { .r = r, .es = es, .g = g, .n_g = n_g };
  bool ahead = n_g > 1 && !r->keep_open;
  if (ahead)
    {
      pthread_mutex_init (&p.mu, NULL);
      pthread_cond_init (&p.cv, NULL);
    }
  pthread_t tid;
  if (ahead && bfo_thread_create (&tid, "bfo-reopen", reopen_ahead, &p) != 0)
    {
      pthread_mutex_destroy (&p.mu);
      pthread_cond_destroy (&p.cv);
      ahead = false;
    }
  int ret = 0;
  size_t k;
  for (k = 0; k < n_g && ret == 0 && !r->stop; k++)
    {
      struct bfo_entry *ge = es + g[k].start;
      uint64_t t1 = now_us ();
      if (ahead)
        {
          pthread_mutex_lock (&p.mu);
          while (p.ready <= k)
            pthread_cond_wait (&p.cv, &p.mu);
          pthread_mutex_unlock (&p.mu);
        }
      else
        reopen_group (r, ge, g[k].n, true, &r->stats);
      r->stats.us_reopen += now_us () - t1;
      if (!g[k].large)
        ret = read_group (r, ge, g[k].n);
      else if (ge->error)
        deliver_error (r, ge->path, NULL, ge->error, ge->error_op, ge->user);
      else
        ret = read_large (r, ge);
      close_group (ge, g[k].n);
      if (ahead)
        {
          pthread_mutex_lock (&p.mu);
          p.done = k + 1;
          pthread_cond_broadcast (&p.cv);
          pthread_mutex_unlock (&p.mu);
        }
    }
  if (ahead)
    {
      pthread_mutex_lock (&p.mu);
      p.stop = true;
      pthread_cond_broadcast (&p.cv);
      pthread_mutex_unlock (&p.mu);
      pthread_join (tid, NULL);
      /* Groups the helper opened that were not read (the callback stopped).  */
      for (; k < p.ready; k++)
        close_group (es + g[k].start, g[k].n);
      pthread_mutex_destroy (&p.mu);
      pthread_cond_destroy (&p.cv);
      BFO_COUNTERS_ADD (&r->stats, &p.stats);
    }
  return ret;
}

/* Phase 2 over a window sorted by class and physical address: groups bounded
   by batch_files and batch_bytes, each large file a group of its own.  */
static int
read_window (struct bfo_reader *r, struct bfo_entry *es, size_t n)
{
  struct group *g = malloc ((n ? n : 1) * sizeof *g);
  if (!g)
    return -ENOMEM;
  /* Two groups open at once must fit the budget: smaller groups then, unless
     that would make them small (below 1024 files a group has few neighbours
     to merge with; then the reopens wait their turn).  */
  size_t cap = r->o.batch_files;
  if (cap > r->fd_room / 2 && r->fd_room / 2 >= 1024 && !r->keep_open)
    cap = r->fd_room / 2;
  size_t n_g = 0, start = 0;
  uint64_t bytes = 0;
  for (size_t i = 0; i <= n; i++)
    {
      struct bfo_entry *e = i < n ? &es[i] : NULL;
      int cls = e ? entry_class (e) : -1;
      uint64_t need = e && !e->error && !e->skip ? round_up (e->st.st_size, BFO_DIO_ALIGN) : 0;
      bool end = i == n || cls == 2 || i - start >= cap
                 || (bytes + need > r->o.batch_bytes && i > start)
                 || (i > start && entry_class (&es[start]) != cls);
      if (end && i > start)
        {
          g[n_g++] = (struct group) { start, i - start, false };
          start = i;
          bytes = 0;
        }
      if (cls == 2)
        {
          g[n_g++] = (struct group) { i, 1, true };
          start = i + 1;
          continue;
        }
      bytes += need;
    }
  int ret = read_groups (r, es, g, n_g);
  free (g);
  return ret;
}

/* Phase 1 of the queued window, in inode order: open, fstat, FIEMAP, close
   (two threads, each on its half of a chunk of batch_files).  */
static int
map_window (struct bfo_reader *r)
{
  int ret = 0;
  size_t n = r->n;
  r->stats.batches++;
  qsort (r->entries, n, sizeof *r->entries, by_ino);
  uint64_t t0 = now_us ();
  prefetch_inodes (r);
  size_t placed = 0;
  if ((r->o.flags & BFO_READ_MAP_INODES) && !(r->o.flags & BFO_READ_RAW) && !r->plan
      && reader_itable (r))
    {
      struct bfo_itable_cursor c = { 0, NULL };
      for (size_t i = 0; i < n; i++)
        placed += map_by_inode (r, &r->entries[i], &c);
      bfo_itable_cursor_free (&c);
    }
  /* A window that fits the descriptor budget keeps its files open from phase
     1 to phase 2: no second open (phase 2 still fstat's each file to see that
     it did not change).  Files placed by their inodes were not opened: phase
     2 opens them on its helper thread, which runs only when files are not
     kept open (read_groups).  */
  r->keep_open = n <= r->fd_room && !r->plan && placed == 0;
  size_t chunk = r->o.batch_files;
  for (size_t c = 0; c < n && ret == 0; c += chunk)
    {
      size_t m = n - c < chunk ? n - c : chunk;
      ret = prepare_entries (r, r->entries + c, m);
    }

  r->stats.us_meta += now_us () - t0;
  r->mapped = true;
  r->map_ret = ret;
  return ret;
}

int
bfo_reader_map (struct bfo_reader *r)
{
  if (r->n == 0)
    return r->stop;
  if (!r->mapped)
    map_window (r);
  return r->map_ret ? r->map_ret : r->stop;
}

/* Run the queued window: phase 1 unless bfo_reader_map did it; phase 2, in
   physical order over the whole window (so that files placed next to each
   other on disk are read together however the tree walk met them): groups
   bounded by batch_files and batch_bytes are opened again, read and
   delivered; large files are streamed last.  */
int
bfo_reader_flush (struct bfo_reader *r)
{
  size_t n = r->n;
  if (n == 0)
    return r->stop;
  if (!r->mapped)
    map_window (r);
  int ret = r->map_ret;
  r->mapped = false;
  if (ret == 0 && r->plan)
    {
      for (size_t i = 0; i < n; i++)
        {
          r->entries[i].large = false;
          if (!r->entries[i].error)
            r->plan->files++, r->plan->bytes += r->entries[i].st.st_size;
        }
      plan_group (r, r->entries, n);
    }
  else if (ret == 0)
    {
      qsort (r->entries, n, sizeof *r->entries, by_class_physical);
      ret = read_window (r, r->entries, n);
    }
  for (size_t i = 0; i < n; i++)
    free_entry (&r->entries[i]);
  r->n = 0;
  return ret ? ret : r->stop;
}

static int
queue_entry (struct bfo_reader *r, int dirfd, const char *path, dev_t dev, uint64_t ino,
             void *user)
{
  if (r->stop)
    return r->stop;
  if (r->mapped)
    {
      /* A window already mapped is read first: it takes nothing more.  */
      int ret = bfo_reader_flush (r);
      if (ret)
        return ret;
    }
  if (r->n == r->cap)
    {
      size_t ncap = r->cap ? 2 * r->cap : 256;
      if (ncap > r->o.window_files)
        ncap = r->o.window_files;
      struct bfo_entry *x = realloc (r->entries, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      r->entries = x;
      r->cap = ncap;
    }
  struct bfo_entry *e = &r->entries[r->n];
  memset (e, 0, sizeof *e);
  e->fd = -1;
  e->dirfd = dirfd;
  e->path = strdup (path);
  if (!e->path)
    return -ENOMEM;
  e->ino = ino;
  e->dev = dev;
  e->user = user;
  if (r->n++ == 0)
    clock_gettime (CLOCK_MONOTONIC, &r->first_add);
  uint64_t first = (uint64_t) r->first_add.tv_sec * 1000 + r->first_add.tv_nsec / 1000000;
  /* Only the first window is cut by time, so that the first data come soon;
     later ones fill up, since bigger windows read in fewer, larger requests.  */
  if (r->n >= r->o.window_files
      || (r->stats.batches == 0 && now_ms () - first >= r->o.batch_ms))
    return bfo_reader_flush (r);
  return 0;
}

void
bfo_reader_get_stats (const struct bfo_reader *r, struct bfo_read_stats *stats)
{
  *stats = r->stats;
}

int
bfo_reader_close (struct bfo_reader *r)
{
  if (!r)
    return 0;
  int ret = bfo_reader_flush (r);
  for (size_t i = 0; i < r->n; i++)
    free_entry (&r->entries[i]);
  free (r->entries);
  if (r->have_ring)
    io_uring_queue_exit (&r->ring);
  preaders_stop (r->preaders);
  if (r->raw_fd >= 0)
    close (r->raw_fd);
  pthread_mutex_destroy (&r->raw_lock);
  unmap_buf (&r->arena, &r->arena_size);
  unmap_buf (&r->rawwin, &r->rawwin_size);
  bfo_itable_close (r->itable);
  free (r);
  return ret;
}

int
bfo_batchread (const char *const *paths, size_t n, const struct bfo_read_opts *opts,
               bfo_read_cb cb, void *arg)
{
  struct bfo_reader *r;
  int ret = bfo_reader_open (&r, opts, cb, arg);
  if (ret < 0)
    return ret;
  for (size_t i = 0; i < n && ret == 0; i++)
    ret = bfo_reader_add (r, paths[i], NULL);
  int c = bfo_reader_close (r);
  return ret ? ret : c;
}

int
bfo_plan_tree (const char *const *roots, size_t n, const struct bfo_read_opts *opts,
               struct bfo_plan *plan)
{
  struct bfo_reader *r;
  memset (plan, 0, sizeof *plan);
  int ret = bfo_reader_open (&r, opts, NULL, NULL);
  if (ret < 0)
    return ret;
  r->plan = plan;
  for (size_t i = 0; i < n && ret == 0; i++)
    ret = bfo_reader_add_tree (r, roots[i]);
  if (ret == 0)
    ret = bfo_reader_flush (r);
  plan->extents = r->stats.extents;
  plan->merged = r->stats.merged;
  plan->why = r->stats;
  bfo_reader_close (r);
  return ret;
}
