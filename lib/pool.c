/* pool.c: memory for the file data a program holds between reading and
   writing them (bfocp's deferred copies, bfotar's read-ahead).  Any thread
   allocates or frees; buffers are carved in order from slabs of BFO_POOL_SLAB bytes, and a
   slab whose buffers are all freed is kept for reuse (up to KEEP bytes), so
   its pages stay mapped.

   Why: bfocp -r of 131072 aged 4 KiB files held each file's data in a
   posix_memalign'd buffer of its own.  glibc then took an arena lock on every
   free from cp's thread (the reader thread's arena), consolidated chunks
   (unlink_chunk), grew and shrank the reader's heap with mprotect and faulted
   its pages in one by one: together about 6 % of all CPU samples of the run
   (perf, 2026-11-27), on a machine whose two cores are both busy.

   A slab is freed only with its last buffer: when buffers are freed in
   another order than they were carved (bfocp frees in cp's order what the
   reader read in disk order), the memory held can pass the bytes still
   live by up to the slabs of one read window.  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

#ifndef MADV_POPULATE_WRITE
# define MADV_POPULATE_WRITE 23
#endif

struct slab
{
  struct slab *next;            /* in the free list */
  size_t used;                  /* bytes carved, the header's included */
  unsigned long refs;           /* live buffers, plus one while it is the current slab */
};

/* The header takes the slab's first bytes; buffers of a block or more start
   on a block boundary, smaller ones on BFO_POOL_ALIGN bytes.  */
#define BFO_POOL_ALIGN 16u
#define BLOCK 4096u

struct bfo_pool
{
  pthread_mutex_t lock;
  struct slab *cur;             /* the one being carved, or NULL */
  struct slab *free;            /* empty slabs kept for reuse */
  size_t n_free, keep;          /* keep: slabs the free list may hold */
  struct bfo_pool_stats st;
};

static size_t
up (size_t n, size_t a)
{
  return (n + a - 1) / a * a;
}

int
bfo_pool_new (struct bfo_pool **pool, uint64_t keep)
{
  struct bfo_pool *p = calloc (1, sizeof *p);
  if (!p)
    return -ENOMEM;
  pthread_mutex_init (&p->lock, NULL);
  p->keep = keep / BFO_POOL_SLAB;
  *pool = p;
  return 0;
}

/* A slab-aligned mapping of BFO_POOL_SLAB bytes, so that a buffer finds its
   slab by rounding its address down.  */
static struct slab *
map_slab (void)
{
  size_t size = 2 * (size_t) BFO_POOL_SLAB;
  unsigned char *m = mmap (NULL, size, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED)
    return NULL;
  uintptr_t a = ((uintptr_t) m + BFO_POOL_SLAB - 1) & ~((uintptr_t) BFO_POOL_SLAB - 1);
  unsigned char *s = (unsigned char *) a;
  if (s > m)
    munmap (m, s - m);
  if (s + BFO_POOL_SLAB < m + size)
    munmap (s + BFO_POOL_SLAB, m + size - (s + BFO_POOL_SLAB));
  /* Not inherited by a child: a program that forks to exec something (tar's
     --checkpoint-action=exec, its compressors and volume scripts) would
     otherwise copy the page tables of all the data held, and unmap them again
     at the exec, on every fork: bfotar --checkpoint=5
     --checkpoint-action=exec='sh -c true' of a 130 MB tree took 10.1-11.2 s
     against GNU tar's 4.6-4.9 s (copy_page_range and unmap_page_range 32 %
     of its samples).  Nothing a child runs before its exec touches held
     data.  */
  madvise (s, BFO_POOL_SLAB, MADV_DONTFORK);
  /* Its pages in one call rather than a fault each (Linux 5.14; the faults
     happen anyway where it is refused).  */
  madvise (s, BFO_POOL_SLAB, MADV_POPULATE_WRITE);
  return (struct slab *) s;
}

/* Called with the lock held: S has no buffer left and is not current.  */
static void
release (struct bfo_pool *p, struct slab *s)
{
  if (p->n_free < p->keep)
    {
      s->next = p->free;
      p->free = s;
      p->n_free++;
    }
  else
    {
      munmap (s, BFO_POOL_SLAB);
      p->st.unmapped++;
    }
}

void *
bfo_pool_alloc (struct bfo_pool *p, size_t len)
{
  if (len > BFO_POOL_MAX)
    {
      void *b;
      if (posix_memalign (&b, BLOCK, len) != 0)
        return NULL;
      __atomic_add_fetch (&p->st.large, 1, __ATOMIC_RELAXED);
      return b;
    }
  size_t need = len >= BLOCK ? up (len, BLOCK) : up (len ? len : 1, BFO_POOL_ALIGN);
  pthread_mutex_lock (&p->lock);
  struct slab *s = p->cur;
  size_t off = 0;
  if (s)
    off = len >= BLOCK ? up (s->used, BLOCK) : s->used;
  if (!s || off + need > BFO_POOL_SLAB)
    {
      if (s && --s->refs == 0)
        release (p, s);
      p->cur = NULL;
      if (p->free)
        {
          s = p->free;
          p->free = s->next;
          p->n_free--;
          p->st.reused++;
        }
      else if ((s = map_slab ()) != NULL)
        p->st.mapped++;
      else
        {
          pthread_mutex_unlock (&p->lock);
          return NULL;
        }
      s->used = up (sizeof *s, BFO_POOL_ALIGN);
      s->refs = 1;
      p->cur = s;
      off = len >= BLOCK ? BLOCK : s->used;
    }
  s->used = off + need;
  s->refs++;
  p->st.buffers++;
  pthread_mutex_unlock (&p->lock);
  return (unsigned char *) s + off;
}

void
bfo_pool_free (struct bfo_pool *p, void *buf, size_t len)
{
  if (!buf)
    return;
  if (len > BFO_POOL_MAX)
    {
      free (buf);
      return;
    }
  struct slab *s = (struct slab *) ((uintptr_t) buf & ~((uintptr_t) BFO_POOL_SLAB - 1));
  pthread_mutex_lock (&p->lock);
  if (--s->refs == 0)
    release (p, s);
  pthread_mutex_unlock (&p->lock);
}

void
bfo_pool_destroy (struct bfo_pool *p, struct bfo_pool_stats *stats)
{
  if (!p)
    return;
  if (p->cur && --p->cur->refs == 0)
    munmap (p->cur, BFO_POOL_SLAB);
  /* (a current slab with buffers still held is left mapped: they are the
     caller's until it exits) */
  for (struct slab *s = p->free, *next; s; s = next)
    {
      next = s->next;
      munmap (s, BFO_POOL_SLAB);
    }
  if (stats)
    *stats = p->st;
  pthread_mutex_destroy (&p->lock);
  free (p);
}

/* ------------------------------------------------------------ memory limit */

/* The smallest limit in any of FILES (NULL-terminated) of DIR and of each
   directory above it down to the first TOP_LEN bytes (a cgroup and its
   ancestors), into *MIN.  Values that are not numbers ("max") or absurdly
   large (v1's "unlimited") do not count.  Truncates DIR.  */
static void
cgroup_limits (char *dir, size_t top_len, const char *const *files, uint64_t *min)
{
  for (;;)
    {
      for (const char *const *file = files; *file; file++)
        {
          char p[PATH_MAX + 64];
          snprintf (p, sizeof p, "%s/%s", dir, *file);
          FILE *f = fopen (p, "re");
          if (!f)
            continue;
          unsigned long long v;
          if (fscanf (f, "%llu", &v) == 1 && v > 0 && v < ((uint64_t) 1 << 60) && v < *min)
            *min = v;
          fclose (f);
        }
      char *slash = strrchr (dir, '/');
      if (!slash || (size_t) (slash - dir) < top_len)
        break;
      *slash = '\0';
    }
}

/* Where the hierarchy holding PATH (a /proc/self/cgroup path) is mounted:
   into DIR the directory of PATH, *TOP_LEN the length of the mount point in
   it.  V2: the cgroup2 mount; else the v1 mount whose options name
   CONTROLLER.  MOUNTINFO is the mount table's file.  False if there is
   none.  */
static bool
cgroup_dir (const char *mountinfo, const char *path, bool v2, const char *controller,
            char *dir, size_t size, size_t *top_len)
{
  FILE *f = fopen (mountinfo, "re");
  if (!f)
    return false;
  char *line = NULL;
  size_t cap = 0;
  bool found = false;
  struct bfo_mountinfo m;
  while (!found && getline (&line, &cap, f) > 0)
    {
      if (!bfo_mountinfo_split (line, &m) || strcmp (m.fstype, v2 ? "cgroup2" : "cgroup") != 0)
        continue;
      if (!v2)
        {
          bool has = false;
          char *save;
          for (char *o = strtok_r (m.super, ",", &save); o && !has; o = strtok_r (NULL, ",", &save))
            has = strcmp (o, controller) == 0;
          if (!has)
            continue;
        }
      /* PATH is relative to the cgroup namespace's root, as ROOT is.  */
      size_t rl = strcmp (m.root, "/") == 0 ? 0 : strlen (m.root);
      if (strncmp (path, m.root, rl) != 0 || (path[rl] != '/' && path[rl] != '\0'))
        continue;
      const char *rest = path + rl;
      if (strcmp (rest, "/") == 0)
        rest = "";
      *top_len = strlen (m.mnt);
      found = (size_t) snprintf (dir, size, "%s%s", m.mnt, rest) < size;
    }
  free (line);
  fclose (f);
  return found;
}

uint64_t
bfo_memory_limit_in (const char *self_cgroup, const char *mountinfo, uint64_t limit)
{
  FILE *f = fopen (self_cgroup, "re");
  if (!f)
    return limit;
  char *line = NULL;
  size_t cap = 0;
  while (getline (&line, &cap, f) > 0)
    {
      /* ID:CONTROLLERS:PATH; v2 is "0::PATH" */
      line[strcspn (line, "\n")] = '\0';
      char *c1 = strchr (line, ':'), *c2 = c1 ? strchr (c1 + 1, ':') : NULL;
      if (!c2)
        continue;
      *c2 = '\0';
      const char *controllers = c1 + 1, *path = c2 + 1;
      bool v2 = *controllers == '\0' && strncmp (line, "0:", 2) == 0;
      bool memory = false;
      if (!v2)
        {
          char *save, buf[256];
          snprintf (buf, sizeof buf, "%s", controllers);
          for (char *o = strtok_r (buf, ",", &save); o && !memory; o = strtok_r (NULL, ",", &save))
            memory = strcmp (o, "memory") == 0;
          if (!memory)
            continue;
        }
      char dir[PATH_MAX];
      size_t top;
      if (!cgroup_dir (mountinfo, path, v2, "memory", dir, sizeof dir, &top))
        continue;
      static const char *const v1_files[] = { "memory.limit_in_bytes", NULL };
      static const char *const v2_files[] = { "memory.max", "memory.high", NULL };
      cgroup_limits (dir, top, v2 ? v2_files : v1_files, &limit);
    }
  free (line);
  fclose (f);
  return limit;
}

/* The lower of the soft address space and data segment limits, or UINT64_MAX.  */
static uint64_t
rlimit_memory (void)
{
  uint64_t lim = UINT64_MAX;
  static const int which[] = { RLIMIT_AS, RLIMIT_DATA };
  for (size_t i = 0; i < sizeof which / sizeof *which; i++)
    {
      struct rlimit rl;
      if (getrlimit (which[i], &rl) == 0 && rl.rlim_cur != RLIM_INFINITY
          && (uint64_t) rl.rlim_cur < lim)
        lim = rl.rlim_cur;
    }
  return lim;
}

uint64_t
bfo_memory_limit (void)
{
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  uint64_t phys = pages > 0 && page > 0 ? (uint64_t) pages * (uint64_t) page : UINT64_MAX;
  uint64_t rl = rlimit_memory ();
  return bfo_memory_limit_in ("/proc/self/cgroup", "/proc/self/mountinfo",
                              rl < phys ? rl : phys);
}

int
bfo_memory_scarce (void)
{
  return rlimit_memory () < BFO_MIN_ADDRESS_SPACE;
}
