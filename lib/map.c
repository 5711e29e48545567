/* map.c: FIEMAP a queued file and classify its extents (BFOr "map" layer).
   A file keeps the fast path only if every extent is plainly readable; else it gets a fallback reason.  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/fiemap.h>
#include <linux/fs.h>

#ifndef __NR_cachestat
# define __NR_cachestat 451     /* Linux 6.5; one number on every architecture */
#endif

/* cachestat(2)'s argument and answer (linux/mman.h of Linux 6.5 and later).  */
struct bfo_cachestat_range
{
  uint64_t off, len;
};
struct bfo_cachestat
{
  uint64_t nr_cache, nr_dirty, nr_writeback, nr_evicted, nr_recently_evicted;
};

/* How bfo_cache_state asks: cachestat, mincore (kernels before 6.5, or
   BFO_CACHE_CHECK=mincore), or not at all (BFO_CACHE_CHECK=off).  */
enum { PROBE_UNSET, PROBE_CACHESTAT, PROBE_MINCORE, PROBE_OFF };
static int probe_how;

static int
probe_method (void)
{
  int how = __atomic_load_n (&probe_how, __ATOMIC_RELAXED);
  if (how == PROBE_UNSET)
    {
      const char *v = getenv ("BFO_CACHE_CHECK");
      how = !v || !*v ? PROBE_CACHESTAT
            : strcmp (v, "off") == 0 ? PROBE_OFF
            : strcmp (v, "mincore") == 0 ? PROBE_MINCORE : PROBE_CACHESTAT;
      __atomic_store_n (&probe_how, how, __ATOMIC_RELAXED);
    }
  return how;
}

/* Whether every page of the SIZE bytes of FD is in the page cache.  Files
   above 1 GiB are taken as not (a call per MiB: the reader streams such
   files anyway).  */
static bool
mincore_all (int fd, uint64_t size, uint64_t page)
{
  if (size > (1ull << 30) || size > SIZE_MAX / 2)
    return false;
  void *p = mmap (NULL, size, PROT_READ, MAP_SHARED, fd, 0);
  if (p == MAP_FAILED)
    return false;
  uint64_t pages = (size + page - 1) / page;
  unsigned char vec[256];
  bool all = true;
  for (uint64_t at = 0; all && at < pages; at += sizeof vec)
    {
      size_t n = pages - at < sizeof vec ? pages - at : sizeof vec;
      if (mincore ((char *) p + at * page, n * page, vec) < 0)
        all = false;
      for (size_t i = 0; all && i < n; i++)
        all = (vec[i] & 1) != 0;
    }
  munmap (p, size);
  return all;
}

int
bfo_file_cached (int fd)
{
  struct stat st;
  if (fstat (fd, &st) < 0)
    return -errno;
  if (!S_ISREG (st.st_mode))
    return 0;
  int c = bfo_cache_state (fd, &st);
  return c < 0 ? -EPERM : c;
}

/* Will mincore say which pages of FD are cached?  cachestat(2) and
   mincore(2) answer only for a file the caller owns or may write (or with
   CAP_FOWNER); for any other, cachestat fails with EPERM and mincore, which
   may not fail there, says that every page is in memory (Linux 5.0 and
   later; util-linux's fincore stopped falling back to mincore on EPERM for
   this reason).  A user archiving a tree of root's then had every file taken
   as cached: bfotar -c took the cold tree for a warm one and read none of it
   ahead (131072 aged 4 KiB files as nobody: 12.7-14.8 s, GNU tar 13.4 s).  */
static bool
may_tell (int fd, const struct stat *st)
{
  uid_t me = geteuid ();
  if (me == 0 || st->st_uid == me)
    return true;
  return faccessat (fd, "", W_OK, AT_EMPTY_PATH | AT_EACCESS) == 0;
}

/* Is cachestat refused whatever the file (a seccomp filter: containers
   refuse system calls their profile does not know), rather than only for
   files that are not ours?  Asked once, of a memfd of our own.  (Not from
   the owner and permissions of the file refused: root in a user namespace
   may not ask about files whose owner it does not map.)  */
static bool
cachestat_refused (void)
{
  static int refused = -1;
  int r = __atomic_load_n (&refused, __ATOMIC_RELAXED);
  if (r < 0)
    {
      int fd = memfd_create ("bfo-cachestat", MFD_CLOEXEC);
      struct bfo_cachestat_range range = { 0, 4096 };
      struct bfo_cachestat cs;
      r = fd >= 0 && syscall (__NR_cachestat, fd, &range, &cs, 0) != 0
          && (errno == EPERM || errno == ENOSYS);
      if (fd >= 0)
        close (fd);
      __atomic_store_n (&refused, r, __ATOMIC_RELAXED);
    }
  return r;
}

/* 1 when all the data of the regular file FD (whose fstat is ST) are in the
   page cache now (so reading it costs no disk request), 0 when not, -1 when
   the kernel will not tell for this file (may_tell).  */
int
bfo_cache_state (int fd, const struct stat *st)
{
  uint64_t size = st->st_size;
  static uint64_t page;
  if (!page)
    page = sysconf (_SC_PAGESIZE) > 0 ? (uint64_t) sysconf (_SC_PAGESIZE) : 4096;
  int how = probe_method ();
  if (size == 0 || how == PROBE_OFF)
    return 0;
  if (how == PROBE_CACHESTAT)
    {
      struct bfo_cachestat_range range = { 0, size };
      struct bfo_cachestat cs;
      if (syscall (__NR_cachestat, fd, &range, &cs, 0) == 0)
        return cs.nr_cache >= (size + page - 1) / page;
      if (errno != ENOSYS && errno != EPERM)
        return 0;
      /* This file's refusal, not a seccomp filter's: mincore would say
         "all cached".  */
      if (errno == EPERM && !cachestat_refused ())
        return -1;
      /* No cachestat here (or a seccomp filter refuses it): mincore from now on.  */
      __atomic_store_n (&probe_how, PROBE_MINCORE, __ATOMIC_RELAXED);
    }
  if (!may_tell (fd, st))
    return -1;
  return mincore_all (fd, size, page);
}

/* Extents fetched per FIEMAP call: most small files have one, fragmented ones a few.  */
#define MAP_CHUNK 64

static int
push_extent (struct bfo_entry *e, size_t *cap, uint64_t logical, uint64_t physical,
             uint64_t length, struct bfo_read_stats *stats)
{
  if (e->n_extents > 0)
    {
      struct bfo_extent *last = &e->extents[e->n_extents - 1];
      /* Logically and physically contiguous: one read.  */
      if (last->logical + last->length == logical && last->physical + last->length == physical)
        {
          last->length += length;
          stats->merged++;
          return 0;
        }
    }
  if (e->n_extents == *cap)
    {
      size_t ncap = *cap ? 2 * *cap : 4;
      struct bfo_extent *x = realloc (e->extents, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      e->extents = x;
      *cap = ncap;
    }
  e->extents[e->n_extents++] = (struct bfo_extent) { logical, physical, length };
  return 0;
}

/* Fill e->extents and e->ranges from FIEMAP, or set e->fallback.  Returns 0, or
   -errno for failures that are not a reason to fall back (ENOMEM).  */
int
bfo_map_entry (struct bfo_entry *e, struct bfo_read_stats *stats)
{
  uint64_t size = e->st.st_size;
  size_t cap = 0;
  uint64_t start = 0;
  union
  {
    struct fiemap fm;
    char space[sizeof (struct fiemap) + MAP_CHUNK * sizeof (struct fiemap_extent)];
  } u;

  if (size == 0)
    return 0;
  for (;;)
    {
      memset (&u.fm, 0, sizeof u.fm);
      u.fm.fm_start = start;
      u.fm.fm_length = FIEMAP_MAX_OFFSET - start;
      /* Dirty pages would show as delalloc or stale extents: write them first.  */
      u.fm.fm_flags = FIEMAP_FLAG_SYNC;
      u.fm.fm_extent_count = MAP_CHUNK;
      if (ioctl (e->fd, FS_IOC_FIEMAP, &u.fm) < 0)
        {
          e->fallback = "no-fiemap";
          stats->fallback_no_fiemap++;
          e->n_extents = 0;
          return 0;
        }
      if (u.fm.fm_mapped_extents == 0)
        break;
      bool last = false;
      for (unsigned int i = 0; i < u.fm.fm_mapped_extents; i++)
        {
          const struct fiemap_extent *x = &u.fm.fm_extents[i];
          uint32_t f = x->fe_flags;
          last = (f & FIEMAP_EXTENT_LAST) != 0;
          start = x->fe_logical + x->fe_length;
          if (x->fe_logical >= size)
            continue;           /* preallocated past EOF */
          uint64_t len = x->fe_length;
          if (x->fe_logical + len > size)
            len = size - x->fe_logical;
          const char *why = NULL;
          if (f & (FIEMAP_EXTENT_UNKNOWN | FIEMAP_EXTENT_DELALLOC))
            why = "delalloc", stats->fallback_delalloc++;
          else if (f & (FIEMAP_EXTENT_DATA_INLINE | FIEMAP_EXTENT_DATA_TAIL))
            why = "inline", stats->fallback_inline++;
          else if (f & (FIEMAP_EXTENT_ENCODED | FIEMAP_EXTENT_DATA_ENCRYPTED))
            why = "encoded", stats->fallback_encoded++;
          else if (f & FIEMAP_EXTENT_NOT_ALIGNED)
            why = "unaligned", stats->fallback_unaligned++;
          if (why)
            {
              e->fallback = why;
              e->n_extents = 0;
              return 0;
            }
          if (f & FIEMAP_EXTENT_UNWRITTEN)
            {
              stats->unwritten++;   /* reads as zeros: never read from disk */
              continue;
            }
          stats->extents++;
          int r = push_extent (e, &cap, x->fe_logical, x->fe_physical, len, stats);
          if (r < 0)
            return r;
        }
      if (last || u.fm.fm_mapped_extents < MAP_CHUNK)
        break;
    }

  /* Ranges for the caller: the data extents in logical order, neighbours joined.  */
  if (e->n_extents)
    {
      e->ranges = malloc (e->n_extents * sizeof *e->ranges);
      if (!e->ranges)
        return -ENOMEM;
      uint64_t end = 0;
      for (size_t i = 0; i < e->n_extents; i++)
        {
          const struct bfo_extent *x = &e->extents[i];
          if (x->logical > end)
            stats->holes++;
          if (e->n_ranges && e->ranges[e->n_ranges - 1].offset
                             + e->ranges[e->n_ranges - 1].length == x->logical)
            e->ranges[e->n_ranges - 1].length += x->length;
          else
            e->ranges[e->n_ranges++] = (struct bfo_range) { x->logical, x->length };
          end = x->logical + x->length;
        }
      if (end < size)
        stats->holes++;
    }
  else
    stats->holes++;
  return 0;
}
