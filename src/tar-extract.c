/* tar-extract.c: bfotar's extract side.  tar keeps every decision and creates
   each regular file itself; a writer thread then writes its data, sets its
   times, owner and mode and closes it, while tar parses the next members.
   With --ext4-image, members go into an unmounted ext4 image through libbfo.
   With --layout, the writer thread takes the queue when tar waits for room
   (a full queue, or the end) and writes it in the layout's order; in an
   image the libbfo writer places each batch in that order.  */

#include <config.h>

#include <errno.h>
#include <error.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "bfo.h"
#include "bfo-util.h"
#include "tar-batch.h"
#include "tar-extract.h"

/* Defaults, measured with bench/run tar-extract (131072 x 4 KiB files and the
   Linux tree from /dev/shm onto ext4, XFS and Btrfs, 2-core VM).  Creating a
   file on a mounted file system costs tens of microseconds of system calls
   whatever the I/O pattern, so what pays is running them on two cores: tar
   parses and creates, the writer thread writes, sets attributes and closes.
   A queue of a few hundred files is enough to ride out either side's
   hiccups; more only holds descriptors and memory.  */
#define TE_DEFAULT_FILES       4096u
#define TE_DEFAULT_BYTES       (64ull << 20)
/* The writer thread sleeps until this many files are queued (or tar waits
   for room, or the end), then takes at most this many at a time.  Woken for
   every file, it took turns with tar instead of running beside it: 39,000
   context switches for 131072 files and 1.04 CPUs busy.  */
#define TE_WAKE_FILES          64u
/* With a clone stem (each burst one stem write and its write-back): 131072
   4 KiB files onto Btrfs, run without sync, two rounds: bursts of 64 files
   2.73-2.79 s, 128 2.60-2.67 s, 256 2.54-2.61 s, 512 2.63-2.70 s.  (On ext4,
   without a stem, 64 1.68-1.71 s, 256 1.72-1.75 s, 512 1.77-1.79 s.)  */
#define TE_STEM_WAKE_FILES     256u
/* Finished jobs up to this size go back to tar's thread for its next files,
   at most TE_SPARE_MAX of them: freed on the writer's thread and allocated
   on tar's, each went through the malloc arena's lock (above tcache sizes)
   and the two threads waited on each other there.  */
#define TE_SPARE_BYTES         (64u << 10)
#define TE_SPARE_MAX           (2 * TE_WAKE_FILES)
/* Larger members are written by tar itself: one big write costs it little.  */
#define TE_FILE_MAX_BYTES      (8ull << 20)
/* Each queued file holds a descriptor: leave this many for tar and its
   compressor, and queue at most half of the rest.  */
#define TE_FD_RESERVE          64
/* An archive file this small is tar's to extract: the writer thread costs
   more than it could save on so few files (10 files of 3000 bytes, warm:
   bfotar 2.16 ms, GNU tar 1.56 ms).  */
#define TE_SMALL_ARCHIVE       (128u << 10)

/* S_IXUGO, MODE_RWX and MODE_ALL as tar defines them.  */
#define TE_MODE_RWX  (S_IRWXU | S_IRWXG | S_IRWXO)
#define TE_MODE_ALL  (S_ISUID | S_ISGID | S_ISVTX | TE_MODE_RWX)

struct tar_extract_job
{
  struct tar_extract_job *next;
  struct tar_extract_file f;
  char *name;                   /* f.name points here */
  unsigned char *data;
  size_t have;
  size_t *chunks;               /* the lengths tar's own write loop would write */
  size_t n_chunks, cap_chunks;
  size_t inline_chunks[2];
  int64_t stem_at;              /* where its whole blocks are in the clone stem, or -1 */
  struct tar_extract_redo redo;
  bool owner_ok;                 /* attrs_early: no chown needed */
  bool mode_done;               /* attrs_early: the mode is set */
  bool create_final;            /* created with its final mode (tar_extract_create_mode) */
  bool pieces;                  /* near a full disk: written a piece at a time */
  bool ow_counted;              /* --overwrite: counted in te.ow_pending[ow_slot] */
  uint32_t ow_slot;
  size_t cap;                   /* bytes for data before the job (see job_alloc) */
  size_t cap_name;              /* bytes for the name after it */
};

/* A job's block holds its data first, aligned for direct I/O (the clone
   stem writes it with O_DIRECT: bfo_clone_stem_stage), then the job, then
   its name: one allocation on tar's thread and one free on the writer's,
   not three of each (freed on the other thread, each went through the
   arena's lock).  */
#define TE_DATA_ALIGN 4096u

/* What an image entry's callback needs to name it in tar's words.  */
struct te_image_item
{
  uint64_t seq;                 /* the member's place in the archive */
  uint64_t key, sub;            /* where its message goes (see by_seq) */
  uint64_t skey, ssub;          /* where a failure of tar's set_stat of it goes */
  int error;                    /* the writer's errno, until reported */
  char typeflag;
  char *name;
  char *link_name;
  char *xattr;                  /* an extended attribute's name, if it is one */
  char *interdir;               /* a directory on the way tar would fail to make */
  int interdir_error;
  /* A directory member: tar would set its attributes later (te_dirs).  */
  mode_t mode, found_mode;
  uid_t uid;
  gid_t gid;
  int attrs_error;
  bool on_stack;                /* in te_dirs: freed when it leaves */
  bool written;                 /* the writer reported it */
  bool settled;                 /* tar would have set its attributes (at KEY) */
  bool done;                    /* nothing more to report */
  bool dropped;                 /* listed again (--delay-directory-restore): tar
                                   sets the attributes of the later one only */
  bool after_links;             /* set in tar's last pass (see dirs_mark) */
};

struct te_counts
{
  uint64_t deferred, deferred_bytes, by_tar, waits, redone;
  uint64_t reopen_waits;        /* --overwrite: for a name that may be queued */
  uint64_t space_waits;         /* tar_extract_space */
};

static struct
{
  /* settings */
  bool started, active, image_given, image_mode, stats;
  bool want_thread;             /* start the writer thread at the first file */
  uid_t euid;                   /* (tar_extract_create_mode) */
  gid_t egid;
  char *dir;                    /* the last regular file's directory, */
  size_t dir_len;               /* (its length in a name, 0: "."), */
  gid_t dir_gid;                /* its group */
  uint64_t dir_member;          /* and that file's member number; 0: none */
  bool create_final;            /* the file being opened gets its final mode */
  struct tar_extract_job *open_job;  /* begun, its data not yet all passed */
  bool small;                   /* a small archive: tar writes its files */
  uint64_t wb_every;            /* write-behind (see writer_start) */
  unsigned int wb_flags;
  struct tar_extract_setup setup;
  size_t max_jobs;
  uint64_t budget_bytes, file_max;
  bool fit_memory;              /* budget_bytes is the default: fit it (writer_start) */
  char *image, *image_dir;

  /* the writer thread, under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;           /* the writer thread waits on it */
  sem_t tar_wake;                /* tar's thread waits on it (wait_until) */
  pthread_t thread;
  bool thread_running, stop, worker_waiting, tar_waiting;
  struct tar_extract_job *head, **tail;     /* queued for the thread */
  struct tar_extract_job *back, **back_tail; /* handed back to tar */
  struct tar_extract_job *spare;             /* finished, to be reused */
  bool any_back;                             /* back is not empty */
  size_t n_spare;
  struct tar_extract_job *tar_spare;         /* tar's own, without the lock */
  size_t n_jobs;                 /* queued or being written */
  size_t n_queued;               /* queued, not yet taken by the thread */
  size_t wake_files;             /* the thread's burst */
  uint64_t finished;             /* (atomic) files the thread has done */
  bool interrupted;              /* (atomic) a signal came: leave memory be */
  uint64_t bytes;                /* their data */
  struct te_counts c;
  /* --overwrite: files queued or handed back, counted by a hash of their
     device and inode (atomic; see tar_extract_before_open) */
  uint32_t *ow_pending;
  /* a file system running full (tar_extract_space) */
  struct bfo_space space;
  bool space_tight;             /* the member being made is near a full disk */
  bool space_low;               /* (atomic) bfo_space_low: no write-behind */

  /* image mode */
  struct bfo_writer *writer;

  /* --layout */
  struct bfo_layout *layout;
  uint64_t layout_runs;

  /* write-behind (used by the writer thread) */
  struct bfo_write_behind *wb;
  struct bfo_write_behind_stats wb_stats;

  /* the clone stem (the writer thread's) */
  int stem_mode;                /* TAR_BATCH_STEM_* */
  bool stem_tried;
  struct bfo_clone_stem *stem;
  struct bfo_clone_stem_stats stem_stats;
  /* a burst's buffers and places, two: one burst's are written on the
     stem's thread while the burst before is finished (stem_stage) */
  struct iovec *stem_iov[2];
  int64_t *stem_at[2];
  size_t stem_cap[2];
  unsigned int stem_bursts;
} te = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

/* ---------------------------------------------------------------- options */

bool
tar_extract_option_image (char const *arg)
{
  if (!arg || !*arg)
    return false;
  free (te.image);
  free (te.image_dir);
  te.image = strdup (arg);
  te.image_dir = NULL;
  if (!te.image)
    return false;
  /* IMG:/DIR -- the last ':' followed by '/' ends the image's name.  */
  char *colon = NULL;
  for (char *p = te.image; (p = strchr (p, ':')); p++)
    if (p[1] == '/')
      colon = p;
  if (colon && colon != te.image)
    {
      *colon = '\0';
      te.image_dir = strdup (colon + 1);
    }
  else
    te.image_dir = strdup ("/");
  te.image_given = te.image_dir != NULL;
  return te.image_given;
}

bool
tar_extract_image_given (void)
{
  return te.image_given;
}

bool
tar_extract_image_active (void)
{
  return te.image_mode;
}

/* ---------------------------------------------------------------- the writer thread */

static void
free_job (struct tar_extract_job *j)
{
  if (j->chunks != j->inline_chunks)
    free (j->chunks);
  free ((char *) j - j->cap);
}

/* A job for SIZE bytes of data and a name of NAME_LEN bytes (with its NUL).  */
static struct tar_extract_job *
job_alloc (size_t size, size_t name_len)
{
  /* Rounded up, a spare fits the next files of about the same size.  */
  size_t cap = (size + 1023) & ~(size_t) 1023;
  size_t cap_name = (name_len + 255) & ~(size_t) 255;
  void *p;
  if (posix_memalign (&p, TE_DATA_ALIGN, cap + sizeof (struct tar_extract_job) + cap_name) != 0)
    return NULL;
  struct tar_extract_job *j = (struct tar_extract_job *) ((char *) p + cap);
  j->cap = cap;
  j->cap_name = cap_name;
  return j;
}

static void
free_jobs (struct tar_extract_job *list)
{
  while (list)
    {
      struct tar_extract_job *j = list;
      list = j->next;
      free_job (j);
    }
}

/* set_stat's set_mode for F (after its chown): *OUT receives the mode to
   give it, or -1 if none.  ST: F's status if known, else fetched when needed
   (false: fstat failed).  */
static bool
mode_to_set (struct tar_extract_file const *f, struct stat const *st, mode_t *out)
{
  mode_t cur_mask = f->current_mode_mask;
  if (te.setup.same_owner)
    cur_mask = bfo_tar_mask_after_chown (f->current_mode, cur_mask);
  mode_t mask = te.setup.same_permissions ? TE_MODE_ALL : TE_MODE_RWX;
  mode_t mode;
  int r = bfo_tar_set_mode (f->current_mode, cur_mask, f->want_mode, mask, &mode);
  if (r < 0)
    {
      struct stat buf;
      if (!st && fstat (f->fd, &buf) != 0)
        return false;
      r = bfo_tar_set_mode ((st ? st : &buf)->st_mode, TE_MODE_ALL, f->want_mode, mask, &mode);
    }
  *out = r > 0 ? mode : (mode_t) -1;
  return true;
}

/* Would a chown of F, whose status is ST, change nothing but its ctime: a
   file tar has just made (O_EXCL, unless --overwrite) that already has the
   owner and group it should have, and no set-id bits or file capabilities
   for a chown to clear?  Then it is skipped: it is a journaled inode update
   (about 5% of the CPU time of extracting 131072 4 KiB files as root)
   where fstat is not.  */
static bool
owner_unchanged (struct tar_extract_file const *f, struct stat const *st)
{
  return !te.setup.overwrite && st->st_uid == f->uid && st->st_gid == f->gid
         && !(st->st_mode & (S_ISUID | S_ISGID));
}

/* A file created with its final mode (tar_extract_create_mode) whose status
   ST is known: set_stat's mode comparison starts from the mode it has, not
   the one asked for.  */
static void
known_mode (struct tar_extract_job *j, struct stat const *st)
{
  if (j->create_final)
    {
      j->f.current_mode = st->st_mode & TE_MODE_ALL;
      j->f.current_mode_mask = TE_MODE_ALL;
    }
}

/* Done on tar's thread as tar queues J, of what apply_attrs would do on the
   writer's: the writer thread is the busier of the two (131072 4 KiB files
   onto XFS: 3.17 s of CPU against tar's 2.39 s), and these need no data:
   the owner check (J->owner_ok: no chown needed); then its mode, unless it is to have set-id bits (a write by a user
   without CAP_FSETID clears them, so they are set after the data, as tar
   sets them): J->mode_done.  Any failure leaves the step to the writer.  */
static void
attrs_early (struct tar_extract_job *j)
{
  struct tar_extract_file const *f = &j->f;
  struct stat st;
  /* Not with a layout: a chmod puts the inode on the write-back list, which
     then takes the files in tar's order, not in the layout's in which the
     writer thread writes them (ext4 allocates their blocks in that order:
     tests/layout.bats).  */
  if (te.layout || te.setup.overwrite || fstat (f->fd, &st) != 0)
    return;
  known_mode (j, &st);
  if (te.setup.same_owner)
    {
      if (!owner_unchanged (f, &st))
        return;
      j->owner_ok = true;
    }
  mode_t mode;
  if (!mode_to_set (f, &st, &mode))
    return;
  if (mode != (mode_t) -1
      && ((mode & (S_ISUID | S_ISGID)) || fchmod (f->fd, mode) != 0))
    return;
  j->mode_done = true;
}

/* What tar's set_stat does to a new regular file open on its descriptor,
   without xattrs, ACLs or SELinux contexts (such extractions are not
   deferred), less what attrs_early did for J.  Any failure sends the file
   back to tar, whose set_stat then does it all again and says what
   failed.  */
static bool
apply_attrs (struct tar_extract_job *j)
{
  struct tar_extract_file const *f = &j->f;
  if (!te.setup.touch)
    {
      struct timespec ts[2] = { { .tv_sec = 0, .tv_nsec = UTIME_OMIT }, f->mtime };
      if (futimens (f->fd, ts) != 0)
        return false;
    }
  if (te.setup.same_owner && !j->owner_ok)
    {
      struct stat st;
      bool known = !te.setup.overwrite && fstat (f->fd, &st) == 0;
      if (known)
        known_mode (j, &st);
      if ((!known || !owner_unchanged (f, &st))
          && fchown (f->fd, f->uid, f->gid) != 0)
        return false;
    }
  mode_t mode;
  if (j->mode_done)
    return true;
  if (!mode_to_set (f, NULL, &mode))
    return false;
  return mode == (mode_t) -1 || fchmod (f->fd, mode) == 0;
}

static void file_too_big (void);

/* Write J as tar would have: its chunks in order, then attributes, then
   close.  Returns false if tar must finish it (J->redo says why).  */
static bool
finish_job (struct tar_extract_job *j)
{
  /* One write for the whole member, not one per record piece as tar's loop
     makes them: a third of 4 KiB members straddle two records, and each
     write also updates the inode's times (a journaled update on ext4, a
     transaction on Btrfs).  The same bytes reach the file either way: the
     kernel writes what it can and blocking_write retries a short write until
     it fails, so a failure is reported as the write of the piece tar would
     have been writing, and as far into it.  */
  uint64_t mark = bfo_write_behind_mark (te.wb);
  size_t cloned = bfo_clone_stem_clone (te.stem, j->f.fd, j->stem_at, j->have);
  size_t n = cloned;
  errno = 0;
  if (!j->pieces)
    n += te.setup.write (j->f.fd, j->data + n, j->have - n);
  if (j->pieces || (n != j->have && (errno == ENOSPC || errno == EDQUOT)))
    {
      /* Near a full disk (tar_extract_space), or out of space, a member's
         write as one may get nothing where tar's record-sized ones fill
         what is left: XFS reserves a write's blocks at once (120 members of
         3 MB onto a full 320 MiB XFS: tar "Wrote only 8704 of 10240 bytes",
         the writer "Cannot write", leaving the space for the names after it
         to be made, empty), and Btrfs gave it a page of a piece whose own
         write got nothing.  So it is written as tar would have, a piece at
         a time, up to the one that fails.  */
      size_t off = 0, i = 0;
      while (i < j->n_chunks && off + j->chunks[i] <= n)
        off += j->chunks[i++];
      for (; i < j->n_chunks; i++)
        {
          off += j->chunks[i];
          errno = 0;
          n += te.setup.write (j->f.fd, j->data + n, off - n);
          if (n != off)
            break;
        }
    }
  if (n != j->have && errno == EFBIG)
    file_too_big ();
  if (n != j->have)
    {
      size_t off = 0, i = 0;
      while (i + 1 < j->n_chunks && off + j->chunks[i] <= n)
        off += j->chunks[i++];
      j->redo = (struct tar_extract_redo) { .failure = TAR_EXTRACT_WRITE_FAILED,
                                            .error = errno, .wrote = n - off,
                                            .chunk = j->chunks[i] };
      return false;
    }
  /* Before the times are set (a punch changes them).  */
  bool wrote = !cloned || cloned < j->have;
  if (wrote)
    bfo_write_behind_trim (te.wb, j->f.fd, j->have, mark);
  if (!apply_attrs (j))
    {
      j->redo = (struct tar_extract_redo) { .failure = TAR_EXTRACT_ATTRS_FAILED,
                                            .error = errno };
      return false;
    }
  /* Only what was written: cloned blocks are on the device already (the
     stem's direct writes or its own write-back), and a file cloned whole has
     nothing to write back; syncfs calls for such files only forced the log
     (131072 4 KiB files onto XFS, bench/run tar-extract: 3.20 s with them,
     2.95 s without write-behind).  */
  /* (not near a full disk: it had ext4 allocate, and give back the rest of
     its reservations, earlier than tar's writes, and the last files got
     other sizes than with GNU tar) */
  if (wrote && !__atomic_load_n (&te.space_low, __ATOMIC_RELAXED))
    bfo_write_behind_note (te.wb, j->f.fd, j->have - cloned);
  if (close (j->f.fd) != 0)
    {
      j->redo = (struct tar_extract_redo) { .failure = TAR_EXTRACT_CLOSE_FAILED,
                                            .error = errno };
      return false;
    }
  return true;
}

/* A write past RLIMIT_FSIZE (ulimit -f): tar's own write would have got
   SIGXFSZ, which this thread blocks, and died of it unless tar's caller
   ignores it; so does this thread then (the shell reports status 153).  */
static void
file_too_big (void)
{
  struct sigaction sa;
  if (sigaction (SIGXFSZ, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL)
    {
      sigset_t xfsz;
      sigemptyset (&xfsz);
      sigaddset (&xfsz, SIGXFSZ);
      pthread_sigmask (SIG_UNBLOCK, &xfsz, NULL);
      raise (SIGXFSZ);
    }
}

/* LIST put in the layout's order (as it is if the order cannot be made).  */
static struct tar_extract_job *
in_layout_order (struct tar_extract_job *list)
{
  size_t n = 0;
  for (struct tar_extract_job *j = list; j; j = j->next)
    n++;
  struct tar_extract_job **v = malloc (n * sizeof *v);
  struct bfo_layout_file *f = malloc (n * sizeof *f);
  size_t *order = malloc (n * sizeof *order);
  bool ok = v && f && order;
  size_t i = 0;
  for (struct tar_extract_job *j = list; ok && j; j = j->next, i++)
    {
      v[i] = j;
      /* Member names as tar gives them ("./a/b" is a/b: '.' is no directory).  */
      const char *name = j->name;
      while (name[0] == '.' && name[1] == '/')
        name += 2;
      f[i] = (struct bfo_layout_file) { name + strspn (name, "/"), j->data, j->have };
    }
  ok = ok && bfo_layout_order (te.layout, f, n, order, NULL, NULL) == 0;
  if (ok)
    {
      for (i = 0; i < n; i++)
        v[order[i]]->next = i + 1 < n ? v[order[i + 1]] : NULL;
      list = v[order[0]];
      te.layout_runs++;
    }
  free (v);
  free (f);
  free (order);
  return list;
}

/* Stage the data of the N jobs of LIST in the clone stem (libbfo's
   bfo_clone_stem; on XFS by default, not on Btrfs: see lib/clonestem.c),
   opened at the first burst in the
   directory of its first file (tar works relative to its -C directory's
   descriptor, which the glue does not see: the file's path comes from
   /proc/self/fd; without /proc, no stem).  The writer thread's.  The stem's
   own thread writes them (bfo_clone_stem_stage_async) while the writer
   finishes the burst before: the stem's direct writes had the writer wait
   for the device, 513 writes of 1 MiB taking 0.85 s of a 3.4 s extraction
   of 131072 4 KiB files onto XFS, while tar's thread waited for room in the
   queue.  Returns which of the two buffers holds the places
   (stem_staged), or -1 if the burst is not staged.  */
static int
stem_stage (struct tar_extract_job *list, size_t n)
{
  for (struct tar_extract_job *j = list; j; j = j->next)
    j->stem_at = -1;
  if (!te.stem_tried)
    {
      te.stem_tried = true;
      char link[64], path[PATH_MAX];
      snprintf (link, sizeof link, "/proc/self/fd/%d", list ? list->f.fd : -1);
      ssize_t len = list && te.stem_mode != TAR_BATCH_STEM_NEVER
                    ? readlink (link, path, sizeof path - 1) : -1;
      char *slash = len > 0 && path[0] == '/' ? memrchr (path, '/', len) : NULL;
      if (slash)
        {
          *(slash == path ? slash + 1 : slash) = '\0';
          bfo_clone_stem_new (&te.stem, path,
                              te.stem_mode == TAR_BATCH_STEM_AUTO
                              ? BFO_CLONE_STEM_AUTO | BFO_CLONE_STEM_XFS : 0);
        }
      if (te.stem)
        {
          pthread_mutex_lock (&te.lock);
          if (te.wake_files < TE_STEM_WAKE_FILES && TE_STEM_WAKE_FILES <= te.max_jobs / 2)
            te.wake_files = TE_STEM_WAKE_FILES;
          pthread_mutex_unlock (&te.lock);
        }
    }
  if (!te.stem || n == 0)
    return -1;
  /* (near a full disk: see finish_job) */
  for (struct tar_extract_job *j = list; j; j = j->next)
    if (j->pieces)
      return -1;
  /* (the previous burst's write is done, and its places taken: the
     caller's stem_staged) */
  int b = te.stem_bursts++ & 1;
  if (te.stem_cap[b] < n)
    {
      size_t cap = n < 2 * te.stem_cap[b] ? 2 * te.stem_cap[b] : n;
      struct iovec *iov = realloc (te.stem_iov[b], cap * sizeof *iov);
      if (iov)
        te.stem_iov[b] = iov;
      int64_t *at = realloc (te.stem_at[b], cap * sizeof *at);
      if (at)
        te.stem_at[b] = at;
      if (!iov || !at)
        return -1;
      te.stem_cap[b] = cap;
    }
  size_t i = 0;
  for (struct tar_extract_job *j = list; j; j = j->next)
    te.stem_iov[b][i++] = (struct iovec) { j->data, j->have };
  bfo_clone_stem_stage_async (te.stem, te.stem_iov[b], i, te.stem_at[b]);
  return b;
}

/* Wait for the write of LIST, staged in buffer B (stem_stage), and give its
   jobs their places in the stem.  */
static void
stem_staged (struct tar_extract_job *list, int b)
{
  if (b < 0)
    return;
  bfo_clone_stem_wait (te.stem);
  size_t i = 0;
  for (struct tar_extract_job *j = list; j; j = j->next)
    j->stem_at = te.stem_at[b][i++];
}

/* --overwrite opens names again, truncating what is there: tar's thread
   must not do that to a file whose data are still queued (they would land
   after it), and waited for the whole queue whenever the name existed,
   which over an existing tree was every file (bfotar -x --overwrite over
   a tree of 82000 files it had made: 12.7 s, GNU tar 6.9 s).  So queued
   files are counted by a hash of their device and inode, and tar's thread
   waits only when the name's inode may be one of them.  2^20 counters:
   with a full queue of 16384 files, one name in 64 waits for nothing.  */
#define TE_OW_SLOTS (1u << 20)

static uint32_t
ow_hash (dev_t dev, ino_t ino)
{
  uint64_t h = ((uint64_t) ino * 0x9E3779B97F4A7C15ull) ^ ((uint64_t) dev * 0xC2B2AE3D27D4EB4Full);
  return (uint32_t) (h >> 44) & (TE_OW_SLOTS - 1);
}

/* Count job J's file (tar's thread, at commit).  */
static void
ow_add (struct tar_extract_job *j)
{
  struct stat st;
  if (!te.ow_pending)
    te.ow_pending = calloc (TE_OW_SLOTS + 1, sizeof *te.ow_pending);
  if (!te.ow_pending)
    return;                     /* (then every name waits) */
  /* One whose inode is not known is counted in the last slot, which every
     name looks at.  */
  j->ow_slot = fstat (j->f.fd, &st) == 0 ? ow_hash (st.st_dev, st.st_ino) : TE_OW_SLOTS;
  j->ow_counted = true;
  __atomic_add_fetch (&te.ow_pending[j->ow_slot], 1, __ATOMIC_RELEASE);
}

/* Job J's data are in place, or tar has redone it.  */
static void
ow_done (struct tar_extract_job *j)
{
  if (j->ow_counted)
    __atomic_sub_fetch (&te.ow_pending[j->ow_slot], 1, __ATOMIC_RELEASE);
  j->ow_counted = false;
}

/* Finish the N jobs of LIST and account for them (the writer thread's; called
   and returns with te.lock held).  */
static void
finish_list (struct tar_extract_job *list, size_t n)
{
  pthread_mutex_unlock (&te.lock);
  struct tar_extract_job *failed = NULL, **failed_tail = &failed;
  struct tar_extract_job *spare = NULL, **spare_tail = &spare;
  size_t n_spare = 0;
  uint64_t done_bytes = 0;
  while (list)
    {
      struct tar_extract_job *j = list;
      list = j->next;
      j->next = NULL;
      done_bytes += j->have;
      bool ok = finish_job (j);
      if (ok)
        ow_done (j);
      __atomic_store_n (&te.finished, te.finished + 1, __ATOMIC_RELAXED);
      if (!ok)
        {
          *failed_tail = j;
          failed_tail = &j->next;
        }
      else if (j->cap <= TE_SPARE_BYTES && n_spare < TE_SPARE_MAX)
        {
          if (j->chunks != j->inline_chunks)
            free (j->chunks);
          j->chunks = j->inline_chunks;
          *spare_tail = j;
          spare_tail = &j->next;
          n_spare++;
        }
      else if (!__atomic_load_n (&te.interrupted, __ATOMIC_RELAXED))
        free_job (j);
    }
  pthread_mutex_lock (&te.lock);
  if (failed)
    {
      *te.back_tail = failed;
      te.back_tail = failed_tail;
      __atomic_store_n (&te.any_back, true, __ATOMIC_RELAXED);
    }
  /* Released after any_back: tar, seeing the files done without the
     lock, sees those it must redo too.  */
  __atomic_store_n (&te.bytes, te.bytes - done_bytes, __ATOMIC_RELAXED);
  __atomic_store_n (&te.n_jobs, te.n_jobs - n, __ATOMIC_RELEASE);
  if (spare && te.n_spare + n_spare <= TE_SPARE_MAX)
    {
      *spare_tail = te.spare;
      te.spare = spare;
      te.n_spare += n_spare;
      spare = NULL;
    }
  if (te.tar_waiting)
    {
      te.tar_waiting = false;
      sem_post (&te.tar_wake);
    }
  if (spare && !__atomic_load_n (&te.interrupted, __ATOMIC_RELAXED))
    {
      pthread_mutex_unlock (&te.lock);
      free_jobs (spare);
      pthread_mutex_lock (&te.lock);
    }
}

static void *
writer_thread (void *arg)
{
  (void) arg;
  /* With a clone stem, a burst is staged one burst ahead of being finished:
     its stem range is then written back while the burst before is finished
     (a clone waits for the write-back of its range; finishing a burst right
     after staging it, the thread waited for every burst's write).  */
  struct tar_extract_job *staged = NULL;
  size_t n_staged = 0;
  int staged_buf = -1;
  pthread_mutex_lock (&te.lock);
  for (;;)
    {
      /* Wait for a burst: waking per file cost two context switches and a
         contended lock per file, and left the two threads taking turns.
         With a layout, the whole queue at once when tar waits for room.
         Holding a staged burst, take a new one only if it is there.  */
      bool ready = te.head && (te.tar_waiting || te.stop
                               || (!te.layout && te.n_queued >= te.wake_files));
      while (!staged && !ready && !te.stop)
        {
          /* (atomic: attrs_early reads it without the lock) */
          __atomic_store_n (&te.worker_waiting, true, __ATOMIC_RELAXED);
          pthread_cond_wait (&te.cond, &te.lock);
          __atomic_store_n (&te.worker_waiting, false, __ATOMIC_RELAXED);
          ready = te.head && (te.tar_waiting
                              || (!te.layout && te.n_queued >= te.wake_files));
        }
      if (te.stop && te.head)
        ready = true;
      if (!ready && !staged)
        break;
      struct tar_extract_job *list = NULL;
      size_t n = 0;
      if (ready)
        {
          /* Take at most a burst (the whole queue with a layout), so that
             the files done go back to the counts tar waits on every burst.  */
          struct tar_extract_job **end = &te.head;
          list = te.head;
          while (*end && (te.layout || n < te.wake_files))
            {
              end = &(*end)->next;
              n++;
            }
          te.head = *end;
          *end = NULL;
          if (!te.head)
            te.tail = &te.head;
          te.n_queued -= n;
          pthread_mutex_unlock (&te.lock);
          if (te.layout)
            list = in_layout_order (list);
          /* (the staged burst's write first: the stem's thread takes one
             at a time) */
          if (staged)
            stem_staged (staged, staged_buf);
          int b = stem_stage (list, n);
          pthread_mutex_lock (&te.lock);
          if (staged)
            finish_list (staged, n_staged);
          staged = NULL;
          if (te.stem)
            {
              staged = list;
              n_staged = n;
              staged_buf = b;
            }
          else
            finish_list (list, n);
        }
      else if (staged)
        {
          pthread_mutex_unlock (&te.lock);
          stem_staged (staged, staged_buf);
          pthread_mutex_lock (&te.lock);
          finish_list (staged, n_staged);
          staged = NULL;
        }
    }
  pthread_mutex_unlock (&te.lock);
  return NULL;
}

/* Hand the files the thread could not finish back to tar (tar's thread).  */
static void
redo_returned (void)
{
  /* Without the lock: one missed now is taken at the next file or the end.  */
  if (!__atomic_load_n (&te.any_back, __ATOMIC_RELAXED))
    return;
  pthread_mutex_lock (&te.lock);
  struct tar_extract_job *list = te.back;
  te.back = NULL;
  te.back_tail = &te.back;
  te.any_back = false;
  pthread_mutex_unlock (&te.lock);
  while (list)
    {
      struct tar_extract_job *j = list;
      list = j->next;
      j->redo.file = &j->f;
      te.c.redone++;
      te.setup.redo (&j->redo);
      ow_done (j);
      free_job (j);
    }
}

/* Wait (tar's thread) until at most MAX_JOBS files and MAX_BYTES bytes are
   queued.  tar's thread waits on a semaphore, not on the writer thread's
   condition variable: a signal handler that never returns (on_signal)
   leaves a thread in pthread_cond_wait registered as a waiter, and glibc's
   pthread_cond_broadcast may then wait for it to leave, for good: the
   writer thread stopped at its next burst, and the queue stayed unwritten
   (about one SIGINT in 10-20 while tar waited for room).  */
static void
wait_until (size_t max_jobs, uint64_t max_bytes)
{
  /* Without the lock first: only the writer thread changes these meanwhile,
     and only down, so counts within the limits are within them.  tar took
     the lock three times per file, and waited for it behind the thread.  */
  if (__atomic_load_n (&te.n_jobs, __ATOMIC_ACQUIRE) <= max_jobs
      && __atomic_load_n (&te.bytes, __ATOMIC_RELAXED) <= max_bytes)
    return;
  pthread_mutex_lock (&te.lock);
  if (te.n_jobs > max_jobs || te.bytes > max_bytes)
    {
      te.c.waits++;
      while (te.n_jobs > max_jobs || te.bytes > max_bytes)
        {
          /* (the writer thread posts after a burst, and clears the flag) */
          te.tar_waiting = true;
          if (te.worker_waiting)
            pthread_cond_broadcast (&te.cond);
          pthread_mutex_unlock (&te.lock);
          while (sem_wait (&te.tar_wake) != 0)
            continue;
          pthread_mutex_lock (&te.lock);
        }
      te.tar_waiting = false;
    }
  pthread_mutex_unlock (&te.lock);
}

/* ---------------------------------------------------------------- signals */

/* A signal that ends tar (SIGINT, SIGTERM, ...) must not end it with files
   it has created and queued still empty: GNU tar, killed, leaves at most the
   one file it was writing short, and an empty file with the time of the run
   is kept by a rerun with -k or --skip-old-files.  While the writer thread
   runs, these signals, where tar leaves them at their default, are caught:
   the handler (on tar's thread, which it never returns to) wakes a thread
   that has the queue written and then dies of the same signal, so the
   caller sees the status GNU tar gives.  Signals that come meanwhile wait
   (the handler blocks them all, and so does every other thread): timeout(1)
   sends its signal twice, to the process and to its group, and a second
   one that killed at once (SA_RESETHAND) left dozens of files empty in 2 of
   30 runs.  bfotar gives up and dies at once when tar's thread held the
   queue's lock (the writer could not take the queue), and when the writer
   makes no progress for TE_SIGNAL_STALL seconds (tar's thread may have
   been stopped holding a lock the writer needs).  */
#define TE_SIGNAL_STALL 10

static int const te_signals[] = { SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGPIPE,
                                  SIGALRM, SIGXCPU, SIGUSR1, SIGUSR2 };
#define TE_N_SIGNALS (sizeof te_signals / sizeof te_signals[0])

static struct
{
  volatile sig_atomic_t caught;   /* the signal that came; 0: stop the thread */
  pid_t pid;                      /* tar's (a child tar forks runs the default) */
  sem_t wake;
  pthread_t thread;
  bool running;
  bool installed[TE_N_SIGNALS];
} ts;

static void
on_signal (int sig)
{
  if (getpid () != ts.pid)
    {
      /* A child tar forked, before it execs: dies of it as it would have
         (once the handler returns and unblocks it).  */
      signal (sig, SIG_DFL);
      raise (sig);
      return;
    }
  ts.caught = sig;
  sem_post (&ts.wake);
  for (;;)
    pause ();
}

/* Have every queued file written, or give up (see above).  */
static void
finish_for_signal (void)
{
  __atomic_store_n (&te.interrupted, true, __ATOMIC_RELAXED);
  struct timespec until;
  clock_gettime (CLOCK_REALTIME, &until);
  until.tv_sec += 2;
  if (pthread_mutex_timedlock (&te.lock, &until) != 0)
    return;
  /* As at the end: the thread takes the whole queue, in bursts.  */
  te.stop = true;
  pthread_cond_broadcast (&te.cond);
  pthread_mutex_unlock (&te.lock);
  /* Polled: the thread reports each file it finishes.  */
  uint64_t last = __atomic_load_n (&te.finished, __ATOMIC_RELAXED);
  int stalled = 0;
  while (__atomic_load_n (&te.n_jobs, __ATOMIC_ACQUIRE) > 0
         && __atomic_load_n (&te.thread_running, __ATOMIC_ACQUIRE)
         && stalled < TE_SIGNAL_STALL * 100)
    {
      struct timespec tick = { 0, 10 * 1000 * 1000 };
      nanosleep (&tick, NULL);
      uint64_t now = __atomic_load_n (&te.finished, __ATOMIC_RELAXED);
      stalled = now == last ? stalled + 1 : 0;
      last = now;
    }
}

static void *
signal_thread (void *arg)
{
  (void) arg;
  while (sem_wait (&ts.wake) != 0)
    continue;
  int sig = ts.caught;
  if (!sig)
    return NULL;
  finish_for_signal ();
  signal (sig, SIG_DFL);
  sigset_t one;
  sigemptyset (&one);
  sigaddset (&one, sig);
  pthread_sigmask (SIG_UNBLOCK, &one, NULL);
  raise (sig);
  _exit (128 + sig);
}

/* Catch the signals (with the writer thread just started).  */
static void
signals_catch (void)
{
  ts.pid = getpid ();
  ts.caught = 0;
  if (sem_init (&ts.wake, 0, 0) != 0)
    return;
  ts.running = bfo_thread_create (&ts.thread, "bfo-signal", signal_thread, NULL) == 0;
  if (!ts.running)
    return;
  struct sigaction sa = { .sa_handler = on_signal,
                          .sa_flags = SA_RESTART };
  sigfillset (&sa.sa_mask);
  for (size_t i = 0; i < TE_N_SIGNALS; i++)
    {
      struct sigaction cur;
      ts.installed[i] = (sigaction (te_signals[i], NULL, &cur) == 0
                         && !(cur.sa_flags & SA_SIGINFO)
                         && cur.sa_handler == SIG_DFL
                         && sigaction (te_signals[i], &sa, NULL) == 0);
    }
}

/* The writer thread is gone: the signals go back to their default, where
   they are still ours, and the signal thread ends.  */
static void
signals_release (void)
{
  if (!ts.running)
    return;
  for (size_t i = 0; i < TE_N_SIGNALS; i++)
    {
      struct sigaction cur;
      if (ts.installed[i] && sigaction (te_signals[i], NULL, &cur) == 0
          && !(cur.sa_flags & SA_SIGINFO) && cur.sa_handler == on_signal)
        signal (te_signals[i], SIG_DFL);
      ts.installed[i] = false;
    }
  sem_post (&ts.wake);
  pthread_join (ts.thread, NULL);
  ts.running = false;
  sem_destroy (&ts.wake);
}

/* ---------------------------------------------------------------- image mode */

/* The items the image writer failed, to be reported in archive order: a
   batch makes directories, symbolic links and nodes before files and hard
   links, and reports them in path order, where tar gives its messages in
   the order of the members.  */
static struct
{
  struct te_image_item **it;
  size_t n, cap;
  uint64_t seq;
  uint64_t sub;
  uint64_t last;                /* the last member the writer failed to make, + 1 */
  uint64_t refused;             /* the last member refused at once, + 1 */
  char typeflag;                /* the last member's */
} te_failed;

/* The image directory members whose attributes tar -x would set later, as
   its delayed set_stat list (apply_nonancestor_delayed_set_stat): the
   directories above the member it reaches.  */
static struct
{
  struct te_image_item **it;
  char **rel;
  size_t n, cap;
  /* --delay-directory-restore, where nothing leaves before the end: an
     index of REL (open addressing; slots hold index + 1), for tar's
     delay_set_stat, which updates the entry of a name already delayed.  */
  size_t *slot;
  size_t n_slots;
} te_dirs;

/* The slot of REL in te_dirs' index: holding it, or empty.  */
static size_t *
dirs_slot (char const *rel)
{
  size_t mask = te_dirs.n_slots - 1;
  for (size_t i = bfo_hash_bytes (rel, strlen (rel)) & mask;; i = (i + 1) & mask)
    if (!te_dirs.slot[i] || strcmp (te_dirs.rel[te_dirs.slot[i] - 1], rel) == 0)
      return &te_dirs.slot[i];
}

/* Index entry I of te_dirs (its REL not yet there); false without memory.  */
static bool
dirs_index (size_t i)
{
  if (2 * (te_dirs.n + 1) > te_dirs.n_slots)
    {
      size_t n = te_dirs.n_slots ? 2 * te_dirs.n_slots : 256;
      size_t *x = calloc (n, sizeof *x);
      if (!x)
        return false;
      free (te_dirs.slot);
      te_dirs.slot = x;
      te_dirs.n_slots = n;
      for (size_t j = 0; j < te_dirs.n; j++)
        if (j != i)
          {
            size_t *s = dirs_slot (te_dirs.rel[j]);
            if (!*s)
              *s = j + 1;
          }
    }
  *dirs_slot (te_dirs.rel[i]) = i + 1;
  return true;
}

static void
free_item (struct te_image_item *it)
{
  free (it->name);
  free (it->link_name);
  free (it->xattr);
  free (it->interdir);
  free (it);
}

/* Messages go in the order of KEY, then SUB (the order they were queued):
   a member's own at 4 SEQ + 2, its extended attributes' at 4 SEQ + 3, and
   those of the directories tar sets when it reaches member SEQ at 4 SEQ + 1.  */
static int
by_seq (const void *a, const void *b)
{
  const struct te_image_item *x = *(struct te_image_item *const *) a;
  const struct te_image_item *y = *(struct te_image_item *const *) b;
  return x->key != y->key ? (x->key < y->key ? -1 : 1)
         : x->sub < y->sub ? -1 : x->sub > y->sub;
}

/* IT has nothing more to report: freed unless te_dirs still holds it.  */
static void
item_done (struct te_image_item *it)
{
  it->done = true;
  if (!it->on_stack)
    free_item (it);
}

/* Report IT's failure (IT->error), or the failure of tar's set_stat of it
   (IT->settled), in tar's words; then it is done.  */
static void
report_failure (struct te_image_item *it)
{
  struct tar_extract_image_error e = { .name = it->name, .link_name = it->link_name,
                                       .typeflag = it->typeflag, .error = it->error,
                                       .xattr = it->xattr, .interdir = it->interdir,
                                       .interdir_error = it->interdir_error,
                                       .found_mode = it->found_mode, .mode = it->mode,
                                       .uid = it->uid, .gid = it->gid };
  if (!it->error)
    e.attrs_error = it->attrs_error;
  te.setup.image_error (&e);
  item_done (it);
}

/* Set while the glue reports or takes the image writer's results: a message
   then must not flush the writer again (image_print_progname).  */
static bool te_reporting;

/* Report the failures the last call into the image writer delivered (all
   of one or more whole batches), in archive order.  */
static void
image_failures_report (void)
{
  bool outer = !te_reporting;
  te_reporting = true;
  qsort (te_failed.it, te_failed.n, sizeof *te_failed.it, by_seq);
  for (size_t i = 0; i < te_failed.n; i++)
    report_failure (te_failed.it[i]);
  te_failed.n = 0;
  if (outer)
    te_reporting = false;
}

/* Have everything queued for the image writer written and its failures
   reported (unless that is being done already).  */
static void
image_flush (void)
{
  if (!te_reporting && te.writer)
    {
      te_reporting = true;
      bfo_writer_flush (te.writer);
      te_reporting = false;
      image_failures_report ();
    }
}

/* error () calls this before each of tar's messages in image mode (its
   program name, as error () would print it).  Members queued for the image
   writer have not failed yet when tar goes on and warns about a later one;
   so their batch is written first and their failures reported, and
   messages come in archive order as from tar -x.  */
static void
image_print_progname (void)
{
  image_flush ();
  fprintf (stderr, "%s: ", program_invocation_name);
}

bool
tar_extract_image_last_made (void)
{
  image_flush ();
  return te_failed.seq == 0 || te_failed.last != te_failed.seq;
}

/* The first components of tar's member NAME that image_path made IMG_PREFIX
   (a prefix of image_path (NAME)), as tar names that directory; NULL if
   they cannot be found or without memory.  */
static char *
name_prefix (char const *name, char const *img_prefix)
{
  size_t want = 1;
  for (char const *q = img_prefix; *q; q++)
    want += *q == '/';
  char const *p = name;
  for (size_t got = 0; *p; )
    {
      while (*p == '/')
        p++;
      char const *e = strchrnul (p, '/');
      if (e > p && !(e - p == 1 && *p == '.') && ++got == want)
        return *e ? strndup (name, e - name) : NULL;
      p = e;
    }
  return NULL;
}

/* Queue IT for report_failure, in order; without memory report it now.  */
static void
queue_failure (struct te_image_item *it)
{
  if (te_failed.n == te_failed.cap)
    {
      size_t ncap = te_failed.cap ? 2 * te_failed.cap : 64;
      struct te_image_item **x = realloc (te_failed.it, ncap * sizeof *x);
      if (x)
        {
          te_failed.it = x;
          te_failed.cap = ncap;
        }
    }
  if (te_failed.n < te_failed.cap)
    te_failed.it[te_failed.n++] = it;
  else
    {
      /* Out of order rather than lost; inside a writer call: no flush.  */
      bool outer = !te_reporting;
      te_reporting = true;
      report_failure (it);
      if (outer)
        te_reporting = false;
    }
}

static int
on_image_written (struct bfo_written const *w, void *arg)
{
  (void) arg;
  struct te_image_item *it = w->user;
  if (!it)
    return 0;
  if (w->error && w->interdir && !it->interdir)
    {
      it->interdir = name_prefix (it->name, w->interdir);
      it->interdir_error = w->interdir_error;
    }
  it->written = true;
  it->error = w->error;
  if (w->error && !it->xattr && te_failed.last < it->seq + 1)
    te_failed.last = it->seq + 1;
  it->found_mode = !w->error || (w->error_op && strcmp (w->error_op, "chmod") == 0)
                   ? w->found_mode : 0;
  it->attrs_error = w->error ? 0 : w->attrs_error;
  if (!w->error && it->attrs_error && it->settled)
    {
      it->key = it->skey;
      it->sub = it->ssub;
    }
  if (w->error || (it->attrs_error && it->settled))
    queue_failure (it);
  else if (!it->attrs_error || it->dropped)
    item_done (it);
  /* else tar sets its attributes later: reported when it leaves te_dirs.  */
  return 0;
}

/* NAME as the image writer wants it: no '.' or empty components, no trailing
   '/'; "." for the destination itself.  Returns a new string or NULL.  */
static char *
image_path (char const *name)
{
  char *out = malloc (strlen (name) + 2), *o = out;
  if (!out)
    return NULL;
  for (char const *p = name; *p; )
    {
      while (*p == '/')
        p++;
      char const *e = strchrnul (p, '/');
      if (e - p == 1 && *p == '.')
        ;
      else if (e > p)
        {
          if (o > out)
            *o++ = '/';
          memcpy (o, p, e - p);
          o += e - p;
        }
      p = e;
    }
  if (o == out)
    *o++ = '.';
  *o = '\0';
  return out;
}

static struct te_image_item *
image_item (struct tar_extract_file const *f, char const *link_name)
{
  struct te_image_item *it = calloc (1, sizeof *it);
  if (!it)
    return NULL;
  it->seq = te_failed.seq++;
  it->key = 4 * it->seq + 2;
  it->sub = te_failed.sub++;
  it->typeflag = te_failed.typeflag = f->typeflag;
  it->mode = f->mode;
  it->uid = f->uid;
  it->gid = f->gid;
  it->name = strdup (f->name);
  it->link_name = link_name ? strdup (link_name) : NULL;
  if (!it->name || (link_name && !it->link_name))
    {
      free (it->name);
      free (it->link_name);
      free (it);
      return NULL;
    }
  return it;
}

/* The attributes tar would leave on a member it made: set_stat's mode rule
   for a new file, owner under --same-owner, the archive's mtime unless -m;
   the access time stays the creation time, as tar's UTIME_OMIT leaves it.  */
static void
image_attrs (struct tar_extract_file const *f, bool with_mode, struct bfo_write_attrs *a)
{
  memset (a, 0, sizeof *a);
  if (with_mode)
    {
      a->flags |= BFO_ATTR_MODE;
      a->mode = te.setup.same_permissions ? f->mode & TE_MODE_ALL
                                          : f->mode & TE_MODE_RWX & ~te.setup.umask;
    }
  if (te.setup.same_owner)
    {
      a->flags |= BFO_ATTR_OWNER;
      a->uid = f->uid;
      a->gid = f->gid;
    }
  if (!te.setup.touch)
    {
      a->flags |= BFO_ATTR_MTIME;
      a->mtime = f->mtime;
    }
}

/* With --overwrite a regular file found is rewritten in place, and tar's
   set_stat works from its mode (see BFO_ATTR_TAR_MODE).  */
static void
image_file_attrs (struct tar_extract_file const *f, struct bfo_write_attrs *a)
{
  image_attrs (f, true, a);
  if (f->replace)
    a->flags |= BFO_ATTR_REPLACE;
  else if (te.setup.overwrite)
    {
      a->flags |= BFO_ATTR_TAR_MODE;
      a->keep_mask = te.setup.same_permissions ? TE_MODE_ALL : TE_MODE_RWX;
    }
}

/* Report an entry the writer refused at once (tar's thread).  */
static int
image_refused (struct tar_extract_file const *f, char const *link_name, int err)
{
  struct tar_extract_image_error e = { .name = f->name, .link_name = link_name,
                                       .typeflag = f->typeflag, .error = err };
  te.setup.image_error (&e);
  te_failed.refused = te_failed.seq;
  return 1;
}

/* Directory member IT at REL (taken, unless false: no memory) joins te_dirs.  */
static bool
dirs_push (struct te_image_item *it, char *rel)
{
  size_t j = 0, *s = &j;
  if (te.setup.delay_dir_restore && te_dirs.n_slots)
    s = dirs_slot (rel);
  else if (!te.setup.delay_dir_restore)
    {
      /* Only one set in tar's last pass can still be there.  */
      for (j = te_dirs.n; j; j--)
        if (te_dirs.it[j - 1]->after_links && strcmp (te_dirs.rel[j - 1], rel) == 0)
          break;
    }
  if (*s)
    {
      /* Listed again: its entry stays where it is, with the later
         member's attributes (tar's delay_set_stat).  */
      struct te_image_item *old = te_dirs.it[*s - 1];
      it->after_links = old->after_links;
      old->on_stack = false;
      old->dropped = true;
      if (old->done || (old->written && !old->error))
        free_item (old);
      it->on_stack = true;
      te_dirs.it[*s - 1] = it;
      free (rel);
      return true;
    }
  if (te_dirs.n == te_dirs.cap)
    {
      size_t ncap = te_dirs.cap ? 2 * te_dirs.cap : 16;
      struct te_image_item **x = realloc (te_dirs.it, ncap * sizeof *x);
      if (x)
        te_dirs.it = x;
      char **y = x ? realloc (te_dirs.rel, ncap * sizeof *y) : NULL;
      if (!y)
        return false;
      te_dirs.rel = y;
      te_dirs.cap = ncap;
    }
  it->on_stack = true;
  it->after_links = strcmp (rel, ".") == 0;   /* (tar's must_be_dot_or_slash) */
  te_dirs.it[te_dirs.n] = it;
  te_dirs.rel[te_dirs.n++] = rel;
  if (te.setup.delay_dir_restore && !dirs_index (te_dirs.n - 1))
    {
      free (te_dirs.slot);      /* (then names listed again are not found) */
      te_dirs.slot = NULL;
      te_dirs.n_slots = 0;
    }
  return true;
}

/* The last of te_dirs leaves it: tar sets its attributes before member
   number SEQ (UINT64_MAX: at the end).  */
static void
dirs_pop (uint64_t seq)
{
  struct te_image_item *it = te_dirs.it[--te_dirs.n];
  free (te_dirs.rel[te_dirs.n]);
  it->on_stack = false;
  if (it->done)
    {
      free_item (it);
      return;
    }
  it->settled = true;
  it->skey = seq == UINT64_MAX ? UINT64_MAX : 4 * seq + 1;
  it->ssub = te_failed.sub++;
  if (it->written && !it->error && it->attrs_error)
    {
      it->key = it->skey;
      it->sub = it->ssub;
      queue_failure (it);
    }
  /* else its failure is queued, or it was not written yet (on_image_written).  */
}

void
tar_extract_image_settle (char const *name)
{
  if (!te.image_mode || !te_dirs.n)
    return;
  char *rel = image_path (name);
  if (!rel)
    return;
  size_t len = strlen (rel);
  while (te_dirs.n)
    {
      char const *d = te_dirs.rel[te_dirs.n - 1];
      size_t dl = strlen (d);
      if (te_dirs.it[te_dirs.n - 1]->after_links
          || (dl < len && rel[dl] == '/' && memcmp (rel, d, dl) == 0))
        break;
      dirs_pop (te_failed.seq);
    }
  free (rel);
  image_failures_report ();
}

int
tar_extract_image_dir (struct tar_extract_file const *f)
{
  struct bfo_write_attrs a;
  image_attrs (f, true, &a);
  /* set_stat's chmod: under the rwx mask it keeps the other bits; under
     MODE_ALL it does not run when the mode is what mkdir gave (tar's safe
     mode, less the umask), and a set-group-ID parent's bit stays.  */
  mode_t safe = (f->mode & (te.setup.same_owner || te.setup.same_permissions
                            ? S_IRWXU : TE_MODE_RWX))
                | (te.setup.root ? 0 : S_IWUSR | S_IXUSR);
  if (!te.setup.same_permissions)
    a.flags |= BFO_ATTR_MODE_PERMS;
  else if ((f->mode & TE_MODE_ALL & ~te.setup.umask) == (safe & ~te.setup.umask))
    a.flags |= BFO_ATTR_NEW_SGID;
  if (te.setup.no_overwrite_dir)
    {
      /* tar's chmod to a safe mode, then set_stat with that mode under
         its mode mask and umask.  */
      a.flags |= BFO_ATTR_KEEP_DIR;
      a.keep_mask = te.setup.same_permissions ? TE_MODE_ALL : TE_MODE_RWX & ~te.setup.umask;
      a.keep_safe = te.setup.root || te.setup.same_permissions ? 0 : S_IWUSR | S_IXUSR;
    }
  char *rel = image_path (f->name);
  struct te_image_item *it = image_item (f, NULL);
  /* tar delays the set_stat of a directory it made or found, and so may
     fail it, unless --no-overwrite-dir (whose failure is its chmod at once).  */
  bool pushed = false;
  if (rel && it && !te.setup.no_overwrite_dir)
    {
      char *copy = strdup (rel);
      pushed = copy && dirs_push (it, copy);   /* (COPY is taken or freed) */
      if (copy && !pushed)
        free (copy);
    }
  int rc = rel && it ? bfo_writer_mkdir (te.writer, rel, &a, it) : -ENOMEM;
  if (rc < 0 && pushed)
    {
      /* Not taken: nothing to report when it leaves te_dirs, where it is
         freed (once reported, if it was).  */
      it->done = true;
      it = NULL;
    }
  image_failures_report ();
  free (rel);
  if (rc == -ENOMEM && !it)
    return image_refused (f, NULL, ENOMEM);
  if (rc < 0)
    return image_refused (f, NULL, -rc);
  return 0;
}

/* Such a link at REL: the directory member that is its parent, if tar
   still delays it, and those delayed before it are set in tar's last pass,
   after the links (mark_after_links).  */
static void
dirs_mark (char const *rel)
{
  char const *slash = strrchr (rel, '/');
  size_t plen = slash ? (size_t) (slash - rel) : 1;
  char const *parent = slash ? rel : ".";
  size_t i = te_dirs.n;
  if (te_dirs.n_slots)
    {
      /* --delay-directory-restore: each name is there once.  */
      char *p = strndup (parent, plen);
      if (p)
        {
          size_t *s = dirs_slot (p);
          i = *s;
          free (p);
        }
    }
  while (i && (te_dirs.it[i - 1]->after_links || strlen (te_dirs.rel[i - 1]) != plen
               || memcmp (te_dirs.rel[i - 1], parent, plen) != 0))
    i--;
  for (; i && !te_dirs.it[i - 1]->after_links; i--)
    te_dirs.it[i - 1]->after_links = true;
}

int
tar_extract_image_symlink (struct tar_extract_file const *f, char const *target)
{
  struct bfo_write_attrs a;
  image_attrs (f, false, &a);
  char *rel = image_path (f->name);
  struct te_image_item *it = image_item (f, target);
  if (rel && bfo_target_escapes (target))
    dirs_mark (rel);
  int rc = rel && it ? bfo_writer_symlink (te.writer, rel, target, &a, it) : -ENOMEM;
  image_failures_report ();
  free (rel);
  if (rc < 0)
    return image_refused (f, target, -rc);
  return 0;
}

int
tar_extract_image_node (struct tar_extract_file const *f, dev_t rdev)
{
  struct bfo_write_attrs a;
  image_attrs (f, true, &a);
  char *rel = image_path (f->name);
  struct te_image_item *it = image_item (f, NULL);
  int rc = rel && it ? bfo_writer_mknod (te.writer, rel, f->mode, rdev, &a, it) : -ENOMEM;
  image_failures_report ();
  free (rel);
  if (rc < 0)
    return image_refused (f, NULL, -rc);
  return 0;
}

void
tar_extract_image_xattr (char const *name, char const *key, void const *value, size_t size)
{
  /* tar sets a member's attributes after making it: none for one refused
     (the writer skips those of one it fails to make).  */
  if (te_failed.seq && te_failed.refused == te_failed.seq)
    return;
  char *rel = image_path (name);
  struct te_image_item *it = calloc (1, sizeof *it);
  if (it)
    {
      it->seq = te_failed.seq ? te_failed.seq - 1 : 0;   /* its member's */
      it->typeflag = te_failed.typeflag;     /* (tar's message names lsetxattr for a link) */
      it->key = 4 * it->seq + 3;
      it->sub = te_failed.sub++;
      it->name = strdup (name);
      it->xattr = strdup (key);
    }
  int rc = rel && it && it->name && it->xattr
           ? bfo_writer_setxattr (te.writer, rel, key, value, size, it) : -ENOMEM;
  image_failures_report ();
  free (rel);
  if (rc < 0)
    {
      struct tar_extract_image_error e = { .name = name, .xattr = key, .error = -rc,
                                           .typeflag = te_failed.typeflag };
      te.setup.image_error (&e);
      if (it && rc == -ENOMEM)
        {
          free (it->name);
          free (it->xattr);
          free (it);
        }
    }
}

int
tar_extract_image_link (struct tar_extract_file const *f, char const *target)
{
  char *rel = image_path (f->name), *to = image_path (target);
  /* A trailing '/' makes link(2) want a directory there: the writer looks.  */
  size_t tl = strlen (target);
  if (to && tl > 1 && target[tl - 1] == '/')
    {
      char *t = realloc (to, strlen (to) + 2);
      if (t)
        strcat (t, "/");
      else
        free (to);
      to = t;
    }
  struct te_image_item *it = image_item (f, target);
  int rc = rel && to && it ? bfo_writer_link (te.writer, rel, to, it) : -ENOMEM;
  image_failures_report ();
  free (rel);
  free (to);
  if (rc < 0)
    return image_refused (f, target, -rc);
  return 0;
}

static int
image_commit (struct tar_extract_job *j)
{
  struct bfo_write_attrs a;
  image_file_attrs (&j->f, &a);
  char *rel = image_path (j->f.name);
  struct te_image_item *it = image_item (&j->f, NULL);
  int rc = rel && it ? bfo_writer_add (te.writer, rel, j->data, j->have, &a, it) : -ENOMEM;
  image_failures_report ();
  free (rel);
  te.c.deferred++;
  te.c.deferred_bytes += j->have;
  if (rc < 0)
    image_refused (&j->f, NULL, -rc);
  free_job (j);
  return rc < 0;
}

int
tar_extract_image_sparse_fd (void)
{
  return memfd_create ("bfotar-sparse", MFD_CLOEXEC);
}

static int
by_offset (void const *a, void const *b)
{
  struct bfo_range const *x = a, *y = b;
  return x->offset < y->offset ? -1 : x->offset > y->offset;
}

int
tar_extract_image_sparse (struct tar_extract_file const *f, int fd,
                          struct tar_extract_region const *map, size_t n)
{
  struct stat st;
  struct bfo_range *r = NULL;
  unsigned char *data = NULL;
  size_t k = 0;
  uint64_t bytes = 0;
  int rc = fstat (fd, &st) < 0 ? -errno : 0;
  if (rc == 0 && n && !(r = malloc (n * sizeof *r)))
    rc = -ENOMEM;
  /* What tar wrote: each region as far as the file goes (the archive may have
     ended inside it); sorted and merged, since a hostile map may overlap.  */
  for (size_t i = 0; rc == 0 && i < n; i++)
    {
      off_t a = map[i].offset, b;
      if (a < 0 || map[i].length <= 0 || a >= st.st_size)
        continue;
      b = map[i].length > st.st_size - a ? st.st_size : a + map[i].length;
      r[k++] = (struct bfo_range) { (uint64_t) a, (uint64_t) (b - a) };
    }
  if (k > 1)
    {
      qsort (r, k, sizeof *r, by_offset);
      size_t m = 0;
      for (size_t i = 1; i < k; i++)
        if (r[i].offset <= r[m].offset + r[m].length)
          {
            uint64_t end = r[i].offset + r[i].length;
            if (end > r[m].offset + r[m].length)
              r[m].length = end - r[m].offset;
          }
        else
          r[++m] = r[i];
      k = m + 1;
    }
  for (size_t i = 0; i < k; i++)
    bytes += r[i].length;
  if (rc == 0 && bytes && !(data = malloc (bytes)))
    rc = -ENOMEM;
  uint64_t at = 0;
  for (size_t i = 0; rc == 0 && i < k; i++)
    {
      for (uint64_t got = 0; rc == 0 && got < r[i].length; )
        {
          ssize_t g = pread (fd, data + at + got, r[i].length - got, r[i].offset + got);
          if (g < 0 && errno == EINTR)
            continue;
          if (g <= 0)
            rc = g < 0 ? -errno : -EIO;
          else
            got += g;
        }
      at += r[i].length;
    }
  close (fd);
  if (rc == 0)
    {
      struct bfo_write_attrs a;
      image_file_attrs (f, &a);
      char *rel = image_path (f->name);
      struct te_image_item *it = image_item (f, NULL);
      rc = rel && it ? bfo_writer_add_sparse (te.writer, rel, data, r, k,
                                              (uint64_t) st.st_size, &a, it)
                     : -ENOMEM;
      image_failures_report ();
      free (rel);
    }
  free (r);
  free (data);
  te.c.deferred++;
  te.c.deferred_bytes += bytes;
  if (rc < 0)
    image_refused (f, NULL, -rc);
  return rc < 0;
}

/* ---------------------------------------------------------------- tar's side */

int
tar_extract_start (struct tar_extract_setup const *setup, char const **image)
{
  struct tar_batch_settings s;
  tar_batch_get_settings (&s);
  char const *env = getenv ("BFO_STATS");
  te.stats = s.stats || (env && *env && strcmp (env, "0") != 0);
  te.setup = *setup;
  te.euid = geteuid ();
  te.egid = getegid ();
  te.started = true;
  te.tail = &te.head;
  te.back_tail = &te.back;
  te.budget_bytes = s.bytes ? s.bytes : TE_DEFAULT_BYTES;
  te.fit_memory = !s.bytes;     /* (writer_start: not for a small archive) */
  te.file_max = te.budget_bytes / 4 < TE_FILE_MAX_BYTES ? te.budget_bytes / 4
                                                        : TE_FILE_MAX_BYTES;
  *image = te.image;
  if (s.layout && strcmp (s.layout, "walk") != 0)
    {
      struct bfo_layout_opts lo = { .trace_support = s.trace_support,
                                    .trace_batch_refs = s.trace_batch_refs,
                                    .trace_root = s.trace_root };
      int rc = bfo_layout_new (&te.layout, s.layout, &lo);
      if (rc < 0)
        fprintf (stderr, "bfotar: cannot use --layout=%s: %s; writing in archive order\n",
                 s.layout, strerror (-rc));
    }
  if (te.image_given)
    {
      struct bfo_write_opts o = { .flags = BFO_WRITE_MKDIRS | BFO_WRITE_TAR_DIRS
                                          | (setup->delay_dir_restore ? BFO_WRITE_TAR_DELAY : 0)
                                          | (setup->overwrite ? BFO_WRITE_OVERWRITE : 0),
                                  .layout = te.layout };
      if (s.files)
        o.batch_files = s.files;
      if (s.bytes)
        o.batch_bytes = s.bytes;
      /* The image writer makes missing directories with the umask it finds
         at open: tar's for new directories, not the 0 tar runs with as
         root (they were mode 777).  */
      mode_t process_umask = umask (setup->newdir_umask);
      int rc = bfo_writer_open_image (&te.writer, te.image, te.image_dir, &o,
                                      on_image_written, NULL);
      umask (process_umask);
      if (rc < 0)
        return -rc;
      te.image_mode = true;
      te.file_max = UINT64_MAX;
      error_print_progname = image_print_progname;
      return 0;
    }
  env = getenv ("BFO_DISABLE");
  if (s.off || (env && *env && strcmp (env, "0") != 0) || !setup->deferrable
      || bfo_memory_scarce ())
    return 0;
  /* Under ulimit -f, a member past the limit is tar's to write: after the
     queue, its write gets SIGXFSZ, which kills it there (status 153) with
     that member short and no member after it made, as stock tar.  Queued,
     the writer thread met the limit while tar had already made the files of
     the members after it, which were left empty.  */
  struct rlimit fsize;
  if (getrlimit (RLIMIT_FSIZE, &fsize) == 0 && fsize.rlim_cur != RLIM_INFINITY
      && fsize.rlim_cur < te.file_max)
    te.file_max = fsize.rlim_cur;
  tar_batch_more_descriptors ();
  struct rlimit rl;
  size_t fds = getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
               ? rl.rlim_cur : 1024;
  te.max_jobs = s.files ? s.files : TE_DEFAULT_FILES;
  if (fds < 2 * TE_FD_RESERVE)
    return 0;
  if (te.max_jobs > (fds - TE_FD_RESERVE) / 2)
    te.max_jobs = (fds - TE_FD_RESERVE) / 2;
  te.wake_files = te.max_jobs / 2 < TE_WAKE_FILES ? te.max_jobs / 2 : TE_WAKE_FILES;
  if (te.wake_files == 0)
    te.wake_files = 1;
  te.stem_mode = s.clone_stem;
  te.wb_every = s.write_behind;
  te.wb_flags = s.write_behind_flags;
  te.want_thread = true;
  return 0;
}

/* Start the writer thread, at the first regular file tar offers: an archive
   without one starts nothing, nor does a small archive file.  */
static void
writer_start (void)
{
  te.want_thread = false;
  uint64_t size = tar_batch_archive_size ();
  /* (a --layout given is honoured whatever the size) */
  if (size && size <= TE_SMALL_ARCHIVE && !te.layout)
    {
      te.small = true;
      return;
    }
  /* The default budget, fitted to a memory cgroup's limit (a container's):
     here, at the first member to queue, so that extracting a small archive
     reads no cgroup file.  */
  if (te.fit_memory)
    {
      bfo_fit_memory (bfo_memory_limit (), &te.budget_bytes, NULL);
      if (te.budget_bytes / 4 < te.file_max)
        te.file_max = te.budget_bytes / 4;
    }
  /* The thread takes no signals (nor does any of libbfo's: see
     bfo_thread_create): tar's handlers and ours run on tar's thread.  */
  te.thread_running = (sem_init (&te.tar_wake, 0, 0) == 0
                       && bfo_thread_create (&te.thread, "bfo-write", writer_thread, NULL) == 0);
  te.active = te.thread_running;
  if (te.active)
    signals_catch ();
  /* Write-behind (lib/writebehind.c): the writer thread notes each file it
     finishes; without a helper, none.  */
  if (te.active && te.wb_every)
    bfo_write_behind_new (&te.wb, te.wb_every, te.wb_flags);
}

/* Tar's thread waits until every queued file is written, and reports those
   that came back.  */
static void
finish_queued (void)
{
  wait_until (0, 0);
  redo_returned ();
}

void
tar_extract_settle (void)
{
  if (te.thread_running)
    finish_queued ();
}

/* A file created with its final mode on FD, whose set_stat will not come:
   it gets the mode tar would have created it with (its owner's bits of
   CURRENT_MODE).  Returns that mode, or CURRENT_MODE if fchmod failed.  */
static mode_t
tar_mode_back (int fd, mode_t current_mode)
{
  mode_t mode = current_mode & S_IRWXU;
  return fchmod (fd, mode) == 0 ? mode : current_mode;
}

void
tar_extract_before_open (int dir_fd, char const *name)
{
  struct stat st;
  if (!te.active || !te.setup.overwrite)
    return;
  pthread_mutex_lock (&te.lock);
  bool pending = te.n_jobs > 0 || te.any_back;
  pthread_mutex_unlock (&te.lock);
  /* Opening an existing name again under --overwrite truncates it; if it is
     (a link to) a file still queued, its old data would land after that
     (see ow_add).  */
  if (pending && fstatat (dir_fd, name, &st, 0) == 0
      && (!te.ow_pending
          || __atomic_load_n (&te.ow_pending[ow_hash (st.st_dev, st.st_ino)],
                              __ATOMIC_ACQUIRE) > 0
          || __atomic_load_n (&te.ow_pending[TE_OW_SLOTS], __ATOMIC_ACQUIRE) > 0))
    {
      te.c.reopen_waits++;
      finish_queued ();
    }
}

/* The directory whose file system and quota the guard below asks: the
   nearest existing directory of the last member's directory, whose name
   (under tar's directory BASE) was DIR.  A member may be in a subvolume or
   a mount of its own below -C's directory, with a quota or a size of its
   own: 40 files of 3 MB into a Btrfs subvolume limited to 60M, below -C's
   unlimited one, had two files made empty ahead ("Cannot write: Disk quota
   exceeded") where stock tar's open failed.  Tar's thread's.  */
static struct
{
  int base;
  char *dir;
  size_t len, cap;
  int fd;                       /* O_PATH, or -1 */
  dev_t dev;
  long type;                    /* its statfs f_type, when asked */
} sd = { .fd = -1 };

/* Whether NAME's directory (under BASE) is on another file system or
   subvolume than the last member's; then sd.fd is its descriptor.  Costs a
   compare of names while the members stay in one directory.  */
static bool
space_dir_moved (int base, char const *name)
{
  char const *slash = strrchr (name, '/');
  size_t len = slash ? (size_t) (slash - name) : 0;
  if (sd.fd >= 0 && base == sd.base && len == sd.len
      && memcmp (name, sd.dir, len) == 0)
    return false;
  if (len + 1 > sd.cap)
    {
      char *x = realloc (sd.dir, len + 1);
      if (!x)
        return false;
      sd.dir = x;
      sd.cap = len + 1;
    }
  memcpy (sd.dir, name, len);
  sd.dir[len] = 0;
  sd.len = len;
  sd.base = base;
  /* (a directory tar has yet to make is on its parent's file system) */
  char *path = strdup (len ? sd.dir : ".");
  struct stat st;
  int rc = -1;
  while (path && (rc = fstatat (base, path, &st, 0)) != 0 && strcmp (path, ".") != 0)
    {
      char *up = strrchr (path, '/');
      if (up)
        *up = 0;
      else
        strcpy (path, ".");
    }
  bool moved = false;
  if (path && rc == 0 && (sd.fd < 0 || st.st_dev != sd.dev))
    {
      int fd = openat (base, path, O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fd >= 0)
        {
          if (sd.fd >= 0)
            close (sd.fd);
          sd.fd = fd;
          sd.dev = st.st_dev;
          moved = true;
        }
    }
  free (path);
  return moved;
}

/* A file system running full must fail the members GNU tar's would (see
   lib/space.c): before each member, while free space less what is queued
   may fall under BFO_SPACE_SLACK, the queue is written first, and the
   member's data are then written as tar's loop writes them (finish_job).
   A member whose directory is on another file system or subvolume than the
   last one's has its own asked at once.  */
void
tar_extract_space (int dir_fd, char const *name, uint64_t size)
{
  if (!te.active)
    return;
  te.space_tight = false;
  bool moved = space_dir_moved (dir_fd, name);
  if (bfo_space_note (&te.space, size) || moved)
    {
      int fd = sd.fd >= 0 ? sd.fd : dir_fd;
      struct statfs sf;
      bool ok = (fd == AT_FDCWD ? statfs (".", &sf) : fstatfs (fd, &sf)) == 0;
      /* (another kind of file system: Btrfs's bound on data not yet
         counted by statfs starts again; see lib/space.c) */
      if (ok && moved && sd.type && sf.f_type != sd.type)
        te.space.started = 0;
      if (ok)
        sd.type = sf.f_type;
      size_t n_jobs = __atomic_load_n (&te.n_jobs, __ATOMIC_ACQUIRE);
      te.space_tight = bfo_space_update (&te.space, ok ? &sf : NULL,
                                         ok ? bfo_space_quota (&te.space, fd, &sf) : UINT64_MAX,
                                         __atomic_load_n (&te.bytes, __ATOMIC_RELAXED),
                                         n_jobs, 0);
      if (te.space_tight && (n_jobs || __atomic_load_n (&te.any_back, __ATOMIC_RELAXED)))
        {
          te.c.space_waits++;
          finish_queued ();
        }
    }
  /* (see finish_job; stored when it changes: the writer thread reads it) */
  bool low = bfo_space_low (&te.space);
  if (low != te.space_low)
    __atomic_store_n (&te.space_low, low, __ATOMIC_RELAXED);
}

/* As root, tar creates a regular file without group and other bits: a
   chown may follow, and until then the file must not be open to the wrong
   group (permissions are checked at open, so whoever opens it meanwhile keeps
   it).  set_stat then chmods it to the member's bits: an inode update per
   file (a transaction on XFS, about 2 us).  When the file has its final
   owner from the start, whoever could open it meanwhile could open it
   afterwards; so it is created with the member's permission bits (the umask
   is 0 under -p, tar's default as root), and no chmod follows.  That is the
   case when the member's owner and group are ours and the directory's group
   is ours too (a set-group-ID directory, or a grpid mount, gives a new file
   the directory's group).  The directory's group is looked up once per run
   of consecutive members in it: tar changes a directory's status (its
   delayed set_stat) only when it extracts a member outside it.  */
mode_t
tar_extract_create_mode (int dir_fd, char const *name, mode_t mode,
                         struct stat const *member)
{
  if (te.want_thread)
    writer_start ();
  te.create_final = false;
  mode_t want = member->st_mode & TE_MODE_RWX;
  if (!te.active || te.setup.overwrite || !te.setup.same_owner
      || !te.setup.same_permissions || want == mode
      || member->st_uid != te.euid || member->st_gid != te.egid)
    return mode;
  char const *slash = strrchr (name, '/');
  size_t len = slash ? (size_t) (slash - name) : 0;
  uint64_t now = tar_batch_extract_members ();
  if (!(te.dir_member && te.dir_member + 1 == now && te.dir_len == len
        && memcmp (te.dir, name, len) == 0))
    {
      /* A default ACL would make the new file's mode other than the one
         asked for, and tar's chmod would set it right: not then.  */
      struct stat st;
      char *d = len ? strndup (name, len) : strdup (".");
      int fd = d ? openat (dir_fd, d, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
      bool ok = fd >= 0 && fstat (fd, &st) == 0
                && fgetxattr (fd, "system.posix_acl_default", NULL, 0) < 0
                && (errno == ENODATA || errno == EOPNOTSUPP);
      if (fd >= 0)
        close (fd);
      te.dir_member = 0;
      if (!ok)
        {
          free (d);
          return mode;
        }
      free (te.dir);
      te.dir = d;
      te.dir_len = len;
      te.dir_gid = st.st_gid;
    }
  te.dir_member = now;
  te.create_final = te.dir_gid == te.egid;
  return te.create_final ? want : mode;
}

/* Tar writes the file just opened on FD itself (not deferred): the queued
   files are finished first; if it was
   created with its final mode, it gets the one tar would have created it with
   (*CURRENT_MODE: its owner's bits), so that whatever tar's own path then
   does or does not do (a sparse member, an archive ending inside it) leaves
   what it leaves with tar's own open.  */
void
tar_extract_keep (int fd, mode_t *current_mode)
{
  /* The files queued before it are written first, as tar would have: on a
     file system running full they, not this one, get the space, and their
     failures are reported before this file's.  */
  if (te.active)
    finish_queued ();           /* (no lock when nothing is queued) */
  if (!te.create_final)
    return;
  te.create_final = false;
  *current_mode = tar_mode_back (fd, *current_mode);
}

struct tar_extract_job *
tar_extract_begin (struct tar_extract_file const *f)
{
  if (te.want_thread)
    writer_start ();
  if (!te.active && !te.image_mode)
    return NULL;
  if (f->size > te.file_max)
    {
      te.c.by_tar++;
      return NULL;
    }
  if (te.active)
    {
      redo_returned ();
      wait_until (te.max_jobs - 1, f->size > te.budget_bytes ? 0 : te.budget_bytes - f->size);
    }
  size_t name_len = strlen (f->name) + 1;
  if (f->size > SIZE_MAX - sizeof (struct tar_extract_job) - name_len - 2 * TE_DATA_ALIGN)
    return NULL;
  if (te.active && !te.tar_spare)
    {
      pthread_mutex_lock (&te.lock);
      te.tar_spare = te.spare;
      te.spare = NULL;
      te.n_spare = 0;
      pthread_mutex_unlock (&te.lock);
    }
  struct tar_extract_job *j = te.tar_spare;
  if (j)
    {
      te.tar_spare = j->next;
      if (j->cap < f->size || j->cap_name < name_len)
        {
          free_job (j);
          j = NULL;
        }
    }
  if (!j && !(j = job_alloc (f->size, name_len)))
    return NULL;
  size_t cap = j->cap, cap_name = j->cap_name;
  memset (j, 0, sizeof *j);
  j->cap = cap;
  j->cap_name = cap_name;
  j->f = *f;
  j->name = memcpy ((char *) (j + 1), f->name, name_len);
  j->data = (unsigned char *) j - cap;
  j->f.name = j->name;
  j->chunks = j->inline_chunks;
  j->cap_chunks = sizeof j->inline_chunks / sizeof j->inline_chunks[0];
  j->create_final = te.create_final;
  te.create_final = false;
  j->pieces = te.space_tight;
  te.open_job = j;
  return j;
}

size_t
tar_extract_data (struct tar_extract_job *j, void const *buf, size_t len)
{
  if (j->n_chunks == j->cap_chunks)
    {
      size_t cap = 2 * j->cap_chunks;
      size_t *c = malloc (cap * sizeof *c);
      if (!c)
        abort ();
      memcpy (c, j->chunks, j->n_chunks * sizeof *c);
      if (j->chunks != j->inline_chunks)
        free (j->chunks);
      j->chunks = c;
      j->cap_chunks = cap;
    }
  /* tar never hands more than the member's size (its loop clamps).  */
  memcpy (j->data + j->have, buf, len);
  j->have += len;
  j->chunks[j->n_chunks++] = len;
  return len;
}

int
tar_extract_commit (struct tar_extract_job *j)
{
  te.open_job = NULL;
  if (te.image_mode)
    return image_commit (j);
  te.c.deferred++;
  te.c.deferred_bytes += j->have;
  /* Only while the writer thread is busy: when it waits for files, tar's
     thread is the one that limits.  131072 4 KiB files from /dev/shm, walls
     with sync -f, alternating: onto ext4 (no stem) 2.90-2.94 s leaving them
     all to the writer, 3.08-3.17 s doing them all here, 2.91-3.02 s so;
     onto XFS (stem) 2.85-3.37 s all here, 2.93-2.94 s so.  */
  if (!__atomic_load_n (&te.worker_waiting, __ATOMIC_RELAXED))
    attrs_early (j);
  if (te.setup.overwrite)
    ow_add (j);
  pthread_mutex_lock (&te.lock);
  *te.tail = j;
  te.tail = &j->next;
  __atomic_store_n (&te.n_jobs, te.n_jobs + 1, __ATOMIC_RELAXED);
  te.n_queued++;
  __atomic_store_n (&te.bytes, te.bytes + j->have, __ATOMIC_RELAXED);
  bool wake = te.worker_waiting && !te.layout && te.n_queued >= te.wake_files;
  pthread_mutex_unlock (&te.lock);
  /* Signalled after the unlock, the thread does not wake only to wait for
     the lock.  */
  if (wake)
    pthread_cond_broadcast (&te.cond);
  return 0;
}

int
tar_extract_write_now (struct tar_extract_job *j, size_t *wrote, size_t *chunk)
{
  int rc = 0;
  if (te.open_job == j)
    te.open_job = NULL;
  if (!te.image_mode)
    {
      size_t off = 0;
      for (size_t i = 0; i < j->n_chunks && rc == 0; i++)
        {
          errno = 0;
          size_t n = te.setup.write (j->f.fd, j->data + off, j->chunks[i]);
          if (n != j->chunks[i])
            {
              int e = errno;
              *wrote = n;
              *chunk = j->chunks[i];
              rc = -1;
              errno = e;
            }
          off += n;
        }
      /* tar stops at this end of the archive before its set_stat: the file
         keeps the mode tar created it with.  */
      if (j->create_final)
        tar_mode_back (j->f.fd, j->f.current_mode);
    }
  int e = errno;
  free_job (j);
  errno = e;
  return rc;
}

int
tar_extract_abandon (size_t *wrote, size_t *chunk)
{
  if (!te.open_job)
    return 0;
  /* The files queued before it first, as tar wrote them before it.  */
  if (te.active)
    finish_queued ();
  /* (in an image it is only dropped: its entry is made at the commit) */
  return tar_extract_write_now (te.open_job, wrote, chunk);
}

static void
print_stats (struct bfo_write_stats const *image)
{
  if (image)
    {
      struct bfo_write_stats const w = *image;
      fprintf (stderr, "bfotar: extract: ext4 image %s: %" PRIu64 " files (%" PRIu64
               " bytes), %" PRIu64 " directories, %" PRIu64 " symlinks, %" PRIu64
               " hard links, %" PRIu64 " batches, %" PRIu64 " data writes, %" PRIu64
               " errors\n", te.image, w.files, w.bytes, w.image_dirs, w.image_symlinks,
               w.image_links, w.batches, w.image_writes, w.errors);
      return;
    }
  fprintf (stderr, "bfotar: extract: %s; %" PRIu64 " files (%" PRIu64
           " bytes) written by the writer thread, %" PRIu64 " by tar itself (large),"
           " %" PRIu64 " waits for the queue (%zu files, %" PRIu64 " bytes),"
           " %" PRIu64 " handed back, %" PRIu64 " waits for a name opened again,"
           " %" PRIu64 " for free space (%" PRIu64 " statfs, %" PRIu64
           " with a quota limit)\n",
           te.active ? "writer thread" : te.small ? "a small archive, tar wrote it"
           : "off", te.c.deferred, te.c.deferred_bytes,
           te.c.by_tar, te.c.waits, te.max_jobs, te.budget_bytes, te.c.redone,
           te.c.reopen_waits, te.c.space_waits, te.space.checks,
           te.space.quota_checks);
  if (te.wb_stats.every)
    fprintf (stderr, "bfotar: extract: write-behind every %" PRIu64 " bytes: %" PRIu64
             " write-backs (%" PRIu64 " ms, %" PRIu64 " failed), %" PRIu64 " skipped"
             " (Btrfs), %" PRIu64 " trimmed\n", te.wb_stats.every, te.wb_stats.writebacks,
             te.wb_stats.us / 1000, te.wb_stats.failed, te.wb_stats.skipped,
             te.wb_stats.trimmed);
  if (te.stem_stats.files)
    fprintf (stderr, "bfotar: extract: clone stem: %" PRIu64 " files (%" PRIu64 " bytes) staged"
             " in %" PRIu64 " writes (%" PRIu64 " direct); %" PRIu64 " cloned (%" PRIu64
             " bytes), %" PRIu64 " written instead\n", te.stem_stats.files,
             te.stem_stats.bytes, te.stem_stats.writes, te.stem_stats.direct,
             te.stem_stats.cloned, te.stem_stats.cloned_bytes, te.stem_stats.failed);
  if (te.layout)
    fprintf (stderr, "bfotar: extract: layout %s: %" PRIu64 " queue bursts written in its"
             " order\n", bfo_layout_policy_name (bfo_layout_policy (te.layout)),
             te.layout_runs);
}

int
tar_extract_drain (void)
{
  if (!te.started)
    return 0;
  if (te.thread_running)
    {
      pthread_mutex_lock (&te.lock);
      te.stop = true;
      pthread_cond_broadcast (&te.cond);
      pthread_mutex_unlock (&te.lock);
      pthread_join (te.thread, NULL);
      __atomic_store_n (&te.thread_running, false, __ATOMIC_RELEASE);
      sem_destroy (&te.tar_wake);
      signals_release ();
      bfo_write_behind_free (te.wb, &te.wb_stats);
      te.wb = NULL;
      bfo_clone_stem_free (te.stem, &te.stem_stats);
      te.stem = NULL;
      redo_returned ();
      free_jobs (te.spare);
      free_jobs (te.tar_spare);
      te.spare = te.tar_spare = NULL;
      te.n_spare = 0;
    }
  free (te.dir);
  te.dir = NULL;
  te.dir_member = 0;
  struct bfo_write_stats w;
  if (te.writer)
    {
      /* tar sets the attributes of the directories left at the end.  */
      while (te_dirs.n)
        dirs_pop (UINT64_MAX);
      free (te_dirs.it);
      free (te_dirs.rel);
      free (te_dirs.slot);
      te_dirs.it = NULL;
      te_dirs.rel = NULL;
      te_dirs.slot = NULL;
      te_dirs.cap = te_dirs.n_slots = 0;
      int rc = bfo_writer_flush (te.writer);
      image_failures_report ();
      bfo_writer_get_stats (te.writer, &w);
      int rc_close = bfo_writer_close (te.writer);
      image_failures_report ();
      free (te_failed.it);
      te_failed.it = NULL;
      te_failed.cap = 0;
      if (rc >= 0)
        rc = rc_close;
      if (rc < 0)
        {
          /* Typeflag 0: the image as a whole.  */
          struct tar_extract_file f = { .name = te.image, .typeflag = 0 };
          image_refused (&f, NULL, -rc);
        }
    }
  if (te.stats)
    print_stats (te.writer ? &w : NULL);
  te.writer = NULL;
  te.active = false;
  te.started = false;
  if (sd.fd >= 0)
    close (sd.fd);
  sd.fd = -1;
  sd.len = 0;
  return te.wb_stats.error;
}
