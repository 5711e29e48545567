/* bfo-util.h: small helpers shared by the read and write halves of libbfo.  */

#ifndef BFO_UTIL_H
#define BFO_UTIL_H 1

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* FNV-1a of S[0..LEN) (64-bit, standard offset basis): the hash of the
   image writer's tables.  */
static inline uint64_t
bfo_hash_bytes (const char *s, size_t len)
{
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char) s[i]) * 0x100000001b3ull;
  return h;
}

/* Whether a symbolic link's TARGET is absolute or has a ".." component:
   tar -x makes such a link last (a placeholder file until the end), and the
   image writer follows none that it made.  */
static inline int
bfo_target_escapes (const char *target)
{
  if (target[0] == '/')
    return 1;
  for (const char *p = target; (p = strstr (p, "..")); p += 2)
    if ((p == target || p[-1] == '/') && (p[2] == '\0' || p[2] == '/'))
      return 1;
  return 0;
}

/* GNU tar 1.34's set_stat on the mode of a file: CUR is the mode tar
   believes the file has, known in the bits of CUR_MASK (its current_mode,
   current_mode_mask).  After its chown, which may clear set-id bits, those
   of an executable file count as unknown: the mask then.  */
static inline mode_t
bfo_tar_mask_after_chown (mode_t cur, mode_t cur_mask)
{
  if ((cur | ~cur_mask) & (S_IXUSR | S_IXGRP | S_IXOTH))
    cur_mask &= ~(cur & (S_ISUID | S_ISGID));
  return cur_mask;
}

/* ... and its set_mode, for the member's MODE under tar's MASK (07777
   under -p, else 0777): 0, no chmod; 1, a chmod to *OUT; -1, tar stats the
   file first (a bit outside MASK is unknown): ask again with the stat's mode
   as CUR and 07777 as CUR_MASK.  */
static inline int
bfo_tar_set_mode (mode_t cur, mode_t cur_mask, mode_t mode, mode_t mask, mode_t *out)
{
  if (!(((cur ^ mode) | ~cur_mask) & mask))
    return 0;
  if (07777 & ~mask & ~cur_mask)
    return -1;
  cur &= 07777;
  *out = (cur & ~mask) | (mode & mask);
  return cur != *out;
}

/* pthread_create, with every signal blocked in the new thread: a program's
   handlers (tar's --totals=SIGNAL, bfotar's catching of SIGINT and the like
   while files are queued) then run on the program's own thread, never on a
   helper that happened to take the signal.  The thread is called NAME (at
   most 15 bytes), so that top -H, perf and /proc/PID/task/TID/comm tell
   the helpers apart.  STACK, if not 0, is the new thread's stack size
   (threads that only wait in system calls need little of the default 8
   MiB of address space, which a ulimit -v counts).  */
static inline int
bfo_thread_create_stack (pthread_t *thread, const char *name,
                         void *(*fn) (void *), void *arg, size_t stack)
{
  pthread_attr_t attr;
  if (stack && pthread_attr_init (&attr) != 0)
    return -1;
  if (stack)
    pthread_attr_setstacksize (&attr, stack);
  sigset_t all, old;
  sigfillset (&all);
  pthread_sigmask (SIG_SETMASK, &all, &old);
  int rc = pthread_create (thread, stack ? &attr : NULL, fn, arg);
  pthread_sigmask (SIG_SETMASK, &old, NULL);
  if (stack)
    pthread_attr_destroy (&attr);
  if (rc == 0)
    pthread_setname_np (*thread, name);
  return rc;
}

/* The same with the default stack size.  */
static inline int
bfo_thread_create (pthread_t *thread, const char *name,
                   void *(*fn) (void *), void *arg)
{
  return bfo_thread_create_stack (thread, name, fn, arg, 0);
}

/* syncfs (FD), or where a seccomp filter refuses it (EPERM or ENOSYS, which
   syncfs itself never returns), sync (2): it writes back every file system,
   FD's among them, though without syncfs's report of write-back errors.
   Without it a container that refuses syncfs had bfo write fail every file
   ("cannot sync") and leave its journal behind.  */
static inline int
bfo_syncfs (int fd)
{
  if (syncfs (fd) == 0)
    return 0;
  if (errno != EPERM && errno != ENOSYS)
    return -1;
  sync ();
  return 0;
}

/* X rounded up to a multiple of A.  */
static inline uint64_t
round_up (uint64_t x, uint64_t a)
{
  return (x + a - 1) / a * a;
}

/* Is NAME "." or "..", a directory entry a walk skips?  */
static inline int
bfo_dot_or_dotdot (const char *name)
{
  return name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2]));
}

/* The monotonic clock in microseconds and in milliseconds.  */
static inline uint64_t
now_us (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline uint64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Is the file ST describes racy for data read from a window that began at
   START (CLOCK_REALTIME, before any of its files was opened)?  Changed within
   BFO_RACY_NS before that (BFO_RACY_COARSE_NS where timestamps have whole
   seconds: the nanoseconds are 0), or stamped later, it might change again
   within the same timestamp tick after the read, and comparing its ctime
   before and after could not see it: coarse timestamps are every file
   system's before Linux 6.13 (Debian 12's 6.1 included).  Such a file's data
   are left to the program (bfotar's tar, bfocp's cp) to read.  */
#define BFO_RACY_NS              (100 * 1000 * 1000ll)
#define BFO_RACY_COARSE_NS       (2 * 1000 * 1000 * 1000ll)

static inline int
bfo_racy (const struct stat *st, struct timespec start)
{
  int64_t margin = (st->st_ctim.tv_nsec == 0 && st->st_mtim.tv_nsec == 0
                    ? BFO_RACY_COARSE_NS : BFO_RACY_NS);
  int64_t limit = (int64_t) start.tv_sec * 1000000000ll + start.tv_nsec - margin;
  return ((int64_t) st->st_ctim.tv_sec * 1000000000ll + st->st_ctim.tv_nsec > limit
          || (int64_t) st->st_mtim.tv_sec * 1000000000ll + st->st_mtim.tv_nsec > limit);
}

/* Batch sizes *BYTES and *FILES (a program's defaults) that fit MEMORY, the
   memory the process may use (bfo_memory_limit): at most a sixteenth of it
   in batch bytes, files in proportion, at least BFO_FIT_MIN_BYTES and
   BFO_FIT_MIN_FILES.  bfocp's peak RSS is about four times its batch bytes
   and bfotar's less, so a program keeps within a quarter of a container's
   limit.  Before (2026-11-27, on a 24 GiB machine: 256M for bfocp, 512M
   for bfotar -c) a memory cgroup of 300 MiB killed bfocp -r and bfotar -c
   of 131072 4 KiB files, and one of 100 MiB killed them on 117 MiB of
   files (tests/cp-batch.bats, tests/tar-create.bats); now they take 90
   and 52 MiB there.  */
#define BFO_FIT_MIN_BYTES ((uint64_t) 4 << 20)
#define BFO_FIT_MIN_FILES 1024u
static inline void
bfo_fit_memory (uint64_t memory, uint64_t *bytes, unsigned int *files)
{
  uint64_t fit = memory / 16;
  if (fit < BFO_FIT_MIN_BYTES)
    fit = BFO_FIT_MIN_BYTES;
  if (*bytes <= fit)
    return;
  if (files)
    {
      uint64_t f = (uint64_t) *files * fit / *bytes;
      unsigned int least = *files < BFO_FIT_MIN_FILES ? *files : BFO_FIT_MIN_FILES;
      *files = f < least ? least : (unsigned int) f;
    }
  *bytes = fit;
}

/* Add every counter of *FROM to *TO: the counter structs (bfo_read_stats,
   bfo_write_stats) hold nothing but uint64_t, so that per-thread or per-batch
   counts are summed by one call whatever fields are added later.  */
#define BFO_COUNTERS_ADD(to, from) \
  bfo_counters_add ((to), (from), sizeof *(to) / sizeof (uint64_t))

static inline void
bfo_counters_add (void *to, const void *from, size_t n)
{
  uint64_t *t = to;
  const uint64_t *f = from;
  for (size_t i = 0; i < n; i++)
    t[i] += f[i];
}

#endif /* BFO_UTIL_H */
