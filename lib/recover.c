/* recover.c: recovery of interrupted batch writes: complete every file of a batch whose
   stem is durable, else remove its temporary files; then remove stem and journal.  */

#include <config.h>

#include "bfo-write-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

const char *
bfo_fate_name (enum bfo_fate fate)
{
  switch (fate)
    {
    case BFO_FATE_COMPLETED:     return "completed";
    case BFO_FATE_WAS_COMPLETE:  return "was complete";
    case BFO_FATE_REMOVED:       return "removed";
    case BFO_FATE_FAILED:        return "failed";
    default:                     return NULL;
    }
}

struct rec
{
  int rootfd;
  bfo_recover_cb cb;
  void *arg;
  int stop;
  bool problem;
};

static void
report (struct rec *r, const char *journal, const char *path, enum bfo_fate fate, int error)
{
  if (fate == BFO_FATE_FAILED)
    r->problem = true;
  if (r->stop || !r->cb)
    return;
  struct bfo_recovered x = { .journal = journal, .path = path, .fate = fate, .error = error };
  int s = r->cb (&x, r->arg);
  if (s)
    r->stop = s;
}

/* Whether the target already is what the batch meant it to be: size and the
   attributes the batch set, and (when the stem is there) every byte.  */
static bool
target_matches (int pfd, const char *base, const struct bfo_jentry *e, int stem_fd)
{
  struct stat st;
  if (fstatat (pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG (st.st_mode)
      || (uint64_t) st.st_size != e->len)
    return false;
  const struct bfo_write_attrs *a = &e->attrs;
  if ((a->flags & BFO_ATTR_MODE) && (st.st_mode & 07777) != (a->mode & 07777))
    return false;
  if ((a->flags & BFO_ATTR_MTIME) && (st.st_mtim.tv_sec != a->mtime.tv_sec
                                      || st.st_mtim.tv_nsec != a->mtime.tv_nsec))
    return false;
  if ((a->flags & BFO_ATTR_OWNER) && ((a->uid != (uid_t) -1 && st.st_uid != a->uid)
                                      || (a->gid != (gid_t) -1 && st.st_gid != a->gid)))
    return false;
  if (stem_fd < 0 || e->len == 0)
    return true;
  int fd = openat (pfd, base, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return false;
  size_t bs = 1u << 20;
  unsigned char *x = malloc (bs), *y = malloc (bs);
  bool same = x && y;
  for (uint64_t pos = 0; same && pos < e->len;)
    {
      size_t want = e->len - pos < bs ? e->len - pos : bs;
      ssize_t a1 = pread (fd, x, want, pos);
      ssize_t a2 = pread (stem_fd, y, want, e->stem_off + pos);
      same = a1 == (ssize_t) want && a2 == (ssize_t) want && memcmp (x, y, want) == 0;
      pos += want;
    }
  free (x);
  free (y);
  close (fd);
  return same;
}

static bool
before (struct timespec a, struct timespec b)
{
  return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

/* A direct batch's target: whole (size and CRC32C as journaled) it stays and gets
   the batch's attributes (a crash may have come between data and attributes);
   otherwise it is removed, unless it is older than the batch (changed last
   before JTIME, when the journal was made): then it is the file the batch was
   to replace, which it never reached, and it stays as it was.  */
static enum bfo_fate
recover_direct (int pfd, const char *base, const struct bfo_jentry *e, struct timespec jtime,
                int *error)
{
  *error = 0;
  int fd = openat (pfd, base, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st = { 0 };
  if (fd < 0)
    {
      if (errno == ENOENT || errno == ELOOP)
        return BFO_FATE_REMOVED;     /* never made (or not ours: a symlink stays) */
      *error = errno;
      return BFO_FATE_FAILED;
    }
  bool whole = fstat (fd, &st) == 0 && S_ISREG (st.st_mode) && (uint64_t) st.st_size == e->len;
  if (whole)
    {
      size_t bs = 1u << 20;
      unsigned char *x = malloc (bs);
      uint32_t crc = 0;
      uint64_t pos = 0;
      while (x && pos < e->len)
        {
          size_t want = e->len - pos < bs ? e->len - pos : bs;
          ssize_t k = pread (fd, x, want, pos);
          if (k <= 0)
            break;
          crc = bfo_crc32c (crc, x, k);
          pos += k;
        }
      whole = x && pos == e->len && crc == (uint32_t) e->stem_off;
      free (x);
    }
  if (whole)
    {
      /* (synced with the batch's others before its journal goes) */
      int r = bfo_wattrs_apply (fd, &e->attrs);
      close (fd);
      *error = -r;
      return r < 0 ? BFO_FATE_FAILED : BFO_FATE_WAS_COMPLETE;
    }
  bool regular = S_ISREG (st.st_mode);
  close (fd);
  if (!regular || before (st.st_ctim, jtime))
    return BFO_FATE_REMOVED;         /* not the batch's: something else, or the old file */
  if (unlinkat (pfd, base, 0) < 0 && errno != ENOENT)
    {
      *error = errno;
      return BFO_FATE_FAILED;
    }
  return BFO_FATE_REMOVED;
}

/* Write entry I of J again from the stem: temp file, data, attributes, rename.  */
static int
complete_entry (const struct bfo_journal *j, size_t i, int pfd, const char *base, int stem_fd,
                struct bfo_write_stats *stats)
{
  const struct bfo_jentry *e = &j->entries[i];
  char tmp[BFO_NAME_MAX];
  bfo_tmp_name (tmp, j->pid, j->seq, i);
  int fd = openat (pfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC,
                   bfo_wattrs_create_mode (&e->attrs));
  if (fd < 0)
    return -errno;
  struct bfo_wctx c = { .stem_fd = stem_fd, .align = j->align, .copy_fallback = true,
                        .stats = stats };
  const char *op;
  int ret = bfo_patcher_reflink.fill (&c, fd, e->stem_off, NULL, e->len, &op);
  if (ret == 0)
    ret = bfo_wattrs_apply (fd, &e->attrs);
  if (ret == 0 && fsync (fd) < 0)
    ret = -errno;
  if (close (fd) < 0 && ret == 0)
    ret = -errno;
  if (ret == 0 && renameat (pfd, tmp, pfd, base) < 0)
    ret = -errno;
  if (ret < 0)
    unlinkat (pfd, tmp, 0);
  return ret;
}

static void
recover_journal (struct rec *r, const char *name, uint32_t pid, uint64_t seq)
{
  struct bfo_journal j;
  int ret = bfo_journal_read (r->rootfd, name, &j);
  if (ret == 0 && (j.pid != pid || j.seq != seq))
    {
      bfo_journal_free (&j);
      ret = -EBADMSG;           /* renamed by hand: its helper files are not where it says */
    }
  if (ret < 0)
    {
      report (r, name, NULL, BFO_FATE_FAILED, -ret);
      return;
    }
  char sname[BFO_NAME_MAX];
  bfo_helper_name (sname, BFO_STEM_PREFIX, pid, seq);
  int stem_fd = -1;
  if (j.stem_durable && j.stem_bytes)
    {
      stem_fd = openat (r->rootfd, sname, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
      struct stat st;
      if (stem_fd >= 0 && (fstat (stem_fd, &st) < 0 || (uint64_t) st.st_size < j.stem_bytes))
        {
          close (stem_fd);
          stem_fd = -1;
        }
    }
  /* Without a durable stem nothing can be completed; with the stem gone although
     it was durable, the batch had finished its renames before it was removed.  */
  struct bfo_write_stats scratch = { 0 };
  struct bfo_dircache dc = { NULL, -1 };
  struct stat jst;
  struct timespec jtime = j.start;
  if (j.version < 3 && fstatat (r->rootfd, name, &jst, AT_SYMLINK_NOFOLLOW) == 0)
    jtime = jst.st_mtim;        /* (older journals: when it was last written) */
  bool completed = false, failed = false;
  for (size_t i = 0; i < j.n; i++)
    {
      const struct bfo_jentry *e = &j.entries[i];
      const char *base;
      char tmp[BFO_NAME_MAX];
      bfo_tmp_name (tmp, pid, seq, i);
      int pfd = bfo_wpath_parent (&dc, r->rootfd, e->path, false, &base);
      if (pfd < 0)
        {
          /* No parent, so no temporary file either.  */
          if (stem_fd >= 0)
            report (r, name, e->path, BFO_FATE_FAILED, -pfd), failed = true;
          else
            report (r, name, e->path, BFO_FATE_REMOVED, 0);
          continue;
        }
      bool had_temp = unlinkat (pfd, tmp, 0) == 0;
      if (!had_temp && errno != ENOENT)
        {
          report (r, name, e->path, BFO_FATE_FAILED, errno);
          failed = true;
          continue;
        }
      if ((j.flags & BFO_JOURNAL_DIRECT) || e->crc)
        {
          int err;
          enum bfo_fate fate = recover_direct (pfd, base, e, jtime, &err);
          report (r, name, e->path, fate, err);
          failed |= fate == BFO_FATE_FAILED;
          completed |= fate == BFO_FATE_WAS_COMPLETE;
          continue;
        }
      if (target_matches (pfd, base, e, stem_fd))
        {
          report (r, name, e->path, BFO_FATE_WAS_COMPLETE, 0);
          continue;
        }
      if (stem_fd < 0)
        {
          report (r, name, e->path, j.stem_durable ? BFO_FATE_FAILED : BFO_FATE_REMOVED,
                  j.stem_durable ? ENOENT : 0);
          failed |= j.stem_durable;
          continue;
        }
      int k = complete_entry (&j, i, pfd, base, stem_fd, &scratch);
      if (k < 0)
        {
          report (r, name, e->path, BFO_FATE_FAILED, -k);
          failed = true;
          continue;
        }
      completed = true;
      report (r, name, e->path, BFO_FATE_COMPLETED, 0);
    }
  bfo_dircache_drop (&dc);
  if (stem_fd >= 0)
    close (stem_fd);
  /* Completed files reach the disk before the journal that could redo them goes
     (and removals of a direct batch's broken files before the journal that
     names them).  */
  if (completed && bfo_syncfs (r->rootfd) < 0)
    {
      report (r, name, NULL, BFO_FATE_FAILED, errno);
      failed = true;
    }
  bfo_journal_free (&j);
  if (failed)
    return;                     /* keep stem and journal for another try */
  if (unlinkat (r->rootfd, sname, 0) < 0 && errno != ENOENT)
    {
      report (r, name, NULL, BFO_FATE_FAILED, errno);
      return;
    }
  if (unlinkat (r->rootfd, name, 0) < 0)
    {
      report (r, name, NULL, BFO_FATE_FAILED, errno);
      return;
    }
  fsync (r->rootfd);
}

/* Whether process PID, whose helper file it is, is gone (or taken as gone).  */
static bool
pid_gone (unsigned int flags, uint32_t self_pid, uint32_t pid)
{
  return (flags & BFO_RECOVER_LIVE) || pid == self_pid || bfo_pid_dead (pid);
}

/* Whether the writer of journal (or .bfo-jtmp) NAME, process PID, still runs:
   1 if so, 0 if not (*LOCK then holds the journal's lock when it could be
   taken), -1 if NAME is gone.  The lock tells, whatever pid namespace the
   writer is in (the same pid may be another process here, or nothing);
   where there are no locks, and for older writers that took none, a live
   process PID other than SELF_PID says it runs too.  */
static int
writer_runs (int rootfd, const char *name, unsigned int flags, uint32_t self_pid,
             uint32_t pid, int *lock)
{
  *lock = -1;
  if (flags & BFO_RECOVER_LIVE)
    return 0;
  int c = bfo_helper_claim (rootfd, name, lock);
  if (c == 1)
    return 1;
  if (c == -ENOENT)
    return -1;
  if (!pid_gone (flags, self_pid, pid))
    {
      if (*lock >= 0)
        close (*lock), *lock = -1;
      return 1;
    }
  return 0;
}

static int
by_name (const void *a, const void *b)
{
  return strcmp (*(char *const *) a, *(char *const *) b);
}

int
bfo_recover_fd (int rootfd, unsigned int flags, uint32_t self_pid, bfo_recover_cb cb,
                void *arg, uint64_t *recovered)
{
  int dfd = fcntl (rootfd, F_DUPFD_CLOEXEC, 0);
  if (dfd < 0)
    return -errno;
  DIR *d = fdopendir (dfd);
  if (!d)
    {
      int e = -errno;
      close (dfd);
      return e;
    }
  /* (the duplicate shares ROOTFD's position: a second call must not start
     where the first one's reading ended) */
  rewinddir (d);
  /* Collect first: recovery removes entries of the directory it reads.  */
  char **names = NULL;
  size_t n = 0, cap = 0;
  int ret = 0;
  struct dirent *de;
  errno = 0;
  while ((de = readdir (d)))
    {
      if (strncmp (de->d_name, ".bfo-", 5) != 0)
        continue;
      if (n == cap)
        {
          cap = cap ? 2 * cap : 16;
          char **x = realloc (names, cap * sizeof *x);
          if (!x)
            {
              ret = -ENOMEM;
              break;
            }
          names = x;
        }
      if (!(names[n] = strdup (de->d_name)))
        {
          ret = -ENOMEM;
          break;
        }
      n++;
    }
  if (!de && errno && ret == 0)
    ret = -errno;
  closedir (d);
  if (n)
    qsort (names, n, sizeof *names, by_name);

  struct rec r = { .rootfd = rootfd, .cb = cb, .arg = arg };
  uint32_t pid;
  uint64_t seq;
  /* Journals first (they may remove their stems), then helpers nobody owns.  */
  for (size_t i = 0; i < n && ret == 0 && !r.stop; i++)
    if (bfo_helper_parse (names[i], BFO_JOURNAL_PREFIX, &pid, &seq))
      {
        int lock = -1;
        int live = writer_runs (rootfd, names[i], flags, self_pid, pid, &lock);
        if (live)
          {
            if (cb && live > 0)
              report (&r, names[i], NULL, BFO_FATE_FAILED, EBUSY);
            continue;
          }
        recover_journal (&r, names[i], pid, seq);
        if (lock >= 0)
          close (lock);
        if (recovered)
          ++*recovered;
      }
  for (size_t i = 0; i < n && ret == 0; i++)
    {
      char jname[BFO_NAME_MAX];
      bool stale = false;
      int lock = -1;
      if (bfo_helper_parse (names[i], BFO_JTMP_PREFIX, &pid, &seq))
        /* (a deferred journal lives as .bfo-jtmp for its whole batch) */
        stale = writer_runs (rootfd, names[i], flags, self_pid, pid, &lock) == 0;
      else if (bfo_helper_parse (names[i], BFO_PROBE_PREFIX, &pid, NULL))
        stale = pid_gone (flags, self_pid, pid);
      else if (bfo_helper_parse (names[i], BFO_STEM_PREFIX, &pid, &seq))
        {
          /* A stem is made after its journal and removed before it: alone, it
             is from a batch that was done or never got its journal.  */
          bfo_helper_name (jname, BFO_JOURNAL_PREFIX, pid, seq);
          stale = faccessat (rootfd, jname, F_OK, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT
                  && pid_gone (flags, self_pid, pid);
        }
      if (stale && unlinkat (rootfd, names[i], 0) < 0 && errno != ENOENT)
        report (&r, names[i], NULL, BFO_FATE_FAILED, errno);
      if (lock >= 0)
        close (lock);
    }
  for (size_t i = 0; i < n; i++)
    free (names[i]);
  free (names);
  if (ret < 0)
    return ret;
  if (r.stop)
    return r.stop;
  return r.problem ? -EIO : 0;
}

int
bfo_recover (const char *dir, unsigned int flags, bfo_recover_cb cb, void *arg)
{
  int fd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int ret = bfo_recover_fd (fd, flags, getpid (), cb, arg, NULL);
  close (fd);
  return ret;
}
