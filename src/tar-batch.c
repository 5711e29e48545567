/* tar-batch.c: bfotar's read-ahead on create.  A thread walks each top-level
   directory in exactly the order tar will dump it, reads windows of its regular
   files through libbfo's batch reader (physical order, O_DIRECT, deep queue)
   into memory, and tar's block-filling loop takes a file's bytes from there
   when its own fstat shows the very state that was read; otherwise tar reads
   the file itself, so a wrong guess costs a read, never wrong data.  */

#include <config.h>

#include <argp.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "bfo.h"
#include "bfo-util.h"
#include "tar-batch.h"

/* Defaults, measured with bench/run tar-create (aged 131072 x 4 KiB files on
   ext4, cold cache, 2-core VM):
   - a window of 16384 files is mapped and read in physical order at once; the
     reader's own measurements (lib/bfo-int.h) favour big windows, and memory,
     not the file count, is what bounds it here.  8192-file windows fit the
     reader's descriptor budget here and stay open from mapping to reading
     (no second open): bench/run tar-create 4.41 s against tar's 19.71 s
     (4.47x), but the simulated disk time doubled (77 s against 40 s), so
     16384 stays;
   - 128 MiB of read-ahead data: a window may fill half, so one window is read
     while tar archives the previous one;
   - the first window is 512 files, so that tar starts within milliseconds
     rather than after a whole window's metadata phase, and the next ones
     grow eightfold to the full size (TB_WINDOW_GROWTH).  */
#define TB_DEFAULT_FILES         16384u
#define TB_DEFAULT_BYTES         (128ull << 20)
/* Not the default: windows four times as big (65536 files, 512M), as bfocp
   takes them with 16 GiB or more.  Each window of an aged tree, read in
   physical order, is one sweep of a disk over all the blocks the tree has,
   so on a disk that seeks they cut the source's cost: 131072 aged 4 KiB
   files, ext4, cold, to a pipe, source traced (bfo-bench trace), 2026-11-27:
   115270 -> 66400 reads, simulated disk 29.4 s -> 7.8 s (bench/run
   tar-create: 700.7 s for GNU tar), peak RSS 181-201 MB -> 559-629 MB.  But
   the wall on this machine's loop devices, which do not seek, was longer:
   four alternating cold runs 2.24-2.50 s against 1.96-2.14 s (the reader
   waits for a whole first big window to be listed).  Disks that seek are
   better served by --batch-files=65536 --batch-bytes=512M.  */
/* With at least TB_BIG_MEMORY of memory (as bfocp's bigger batches), windows
   twice as big (32768 files, 256M): a window of an aged tree holds more
   physical neighbours, so the source takes fewer requests and half the
   sweeps.  bench/run tar-create, 2026-11-29: 2.92 s (4.70x GNU tar), 99150
   requests, 15.0 s of simulated disk, against 3.04 s (4.45x), 115409 and
   29.6 s with 16384 and 128M; peak RSS 302 MiB against 188 MiB.  (Session
   25's 65536 and 512M waited longer for the first big window.)  */
#define TB_BIG_FILES             32768u
#define TB_BIG_BYTES             (256ull << 20)
#define TB_BIG_MEMORY            (16ull << 30)
#define TB_FIRST_WINDOW_FILES    512u
/* The windows after the first grow by this factor up to --batch-files.  The
   first is often cut short (tar waits for its first file: the window takes
   what the walk has listed, a file or two), and a second window of all
   --batch-files had tar, the reader and the device wait while the walk
   listed it: 131072 aged 4 KiB files, cold, to a pipe, 32768-file windows:
   tar's first byte after 0.47-0.59 s, no device read in the first 0.2 s.
   Growing by 4 from 512: the first byte after 0.14-0.15 s, the run 2.49 s
   against 2.59 s on average (eight alternating rounds).  But each smaller
   window is one more sweep of a disk that seeks: bench/run tar-create,
   simulated disk of the source 15.0 s without growing, 23.9 s by 4 (2.84
   s), 19.9 s by 8 (2.70 s; 2.92 s without, each in its own run).  Hence 8.
   Session 25 had tried windows doubling from 512 (16384-file windows then),
   within noise.  */
#define TB_WINDOW_GROWTH         8u
/* A tree of at most this many entries in at most this many directories is
   tar's to read, when it comes before any larger one: starting the readers
   and the threads costs more than batching so few files could save (a
   directory of 10 warm files: bfotar 3.3 ms, GNU tar 1.6 ms).  */
#define TB_SMALL_ENTRIES         32u
#define TB_SMALL_DIRS            4u
/* Files sampled to tell a warm tree (see sample_warm).  */
#define TB_WARM_SAMPLE           64u
/* While the tree is taken as warm, the walk goes on without listing files
   and looks at every TB_WARM_EVERY-th file with data; when TB_COLD_OF of the
   last TB_WARM_RECENT it looked at are not wholly in the page cache, it lists
   files again (see walk_warm).  */
#define TB_WARM_EVERY            16u
#define TB_WARM_RECENT           8u
#define TB_COLD_OF               4u
/* Files above this (or a quarter of --batch-bytes) are left to tar: one large
   read per file costs tar little, and they would crowd the window.  */
#define TB_FILE_MAX_BYTES        (8ull << 20)
/* Below this soft RLIMIT_NOFILE, no read-ahead (see tar_batch_start).  */
#define TB_MIN_NOFILE            256u
/* A soft RLIMIT_NOFILE from TB_RAISE_FROM (the usual default) up is raised to
   TB_RAISE_TO, within the hard limit (see tar_batch_more_descriptors).  */
#define TB_RAISE_FROM            1024u
#define TB_RAISE_TO              65536u

enum tb_state { TB_PENDING, TB_READING, TB_READY, TB_FAILED };

/* One regular file of the walk, in tar's order.  */
struct tb_root;

struct tb_file
{
  struct tb_file *next;         /* walk order, until tar passes it */
  struct tb_file *rnext;        /* walk order, until the reader takes it */
  struct tb_root *root;         /* its path starts at this root's descriptor */
  struct tb_file *hnext;        /* hash chain */
  uint64_t seq;
  dev_t dev;
  ino_t ino;
  off_t walk_size;              /* what the walk saw: sizes the windows */
  enum tb_state state;
  bool in_window;               /* the thread still uses it: only it may free it */
  bool dropped;                 /* tar is done with it: the thread frees it */
  struct stat st;               /* the reader's: the state the data are of */
  unsigned char *data;          /* from tb.pool, ST.st_size bytes */
  uint64_t have;                /* bytes stored */
  uint64_t charged;             /* bytes counted in live_bytes */
  char *path;                   /* for the reader (relative to root->fd), until read */
};

/* One directory of the walk: its entries in tar's order.  */
struct tb_dir
{
  int fd;
  dev_t dev;
  char *rel;                    /* path below the root, "" for the root */
  char **names;
  unsigned char *types;
  size_t n, pos;
};

struct tb_root
{
  struct tb_root *next;
  int fd;                       /* our own descriptor of the directory */
  dev_t dev;
  size_t refs;                  /* the walk, and files whose path uses fd */
};

/* A window of walked files: the mapper thread maps it (open, fstat, FIEMAP)
   while the reader thread reads the window before, on the other reader.  */
struct tb_window
{
  struct tb_file **w;
  size_t n;
  struct bfo_reader *reader;
  struct timespec start;        /* before its files were stat'ed */
};

struct tb_counts
{
  uint64_t walked, walked_bytes, windows;
  uint64_t ahead_requests;      /* the walk's metadata read-ahead (root, ext4) */
  uint64_t read_files, read_bytes;
  uint64_t used, used_bytes, stale, not_used, missed, waits;
  uint64_t skip_large, skip_sparse, skip_racy, skip_failed;
  uint64_t skip_cached;         /* in the page cache already: tar reads them as fast */
  uint64_t warm_at;             /* files walked when the tree was found warm (0: never) */
  uint64_t cold_at;             /* files walked when it was found cold again (0: never) */
  uint64_t skip_atime_roots;    /* trees tar read itself, for their access times */
  uint64_t small_roots;         /* trees tar read itself, being small */
};

static struct
{
  /* settings */
  bool off, progress, stats, started;
  bool launched;                /* the threads were started (at the first root) */
  bool exclude;                 /* tar may pass over files the walk reads */
  unsigned int window_files, io_depth;
  uint64_t budget_bytes, file_max;
  const char *layout, *trace_root;
  double trace_support;
  unsigned int trace_batch_refs;
  uint64_t write_behind;        /* --write-behind: bytes, 0 for none */
  unsigned int write_behind_flags;
  int clone_stem;               /* --clone-stem: TAR_BATCH_STEM_* */
  struct tar_batch_setup setup;

  /* shared between tar and the thread, under lock */
  pthread_mutex_t lock;
  pthread_cond_t cond;
  pthread_t thread, mapper, walker;
  bool thread_running, mapper_running, walker_running, stop, walk_idle;
  bool warm;                    /* the tree is in the page cache: nothing is listed */
  bool warm_decided;            /* (the walker's) */
  unsigned int sampled, sampled_cached;
  /* (the walker's, while warm) files with data seen; the last samples, a bit
     each, 1 for a file not wholly in the page cache */
  uint64_t warm_seen;
  unsigned int recent_cold;
  bool relisting;               /* the walk lists files again: a first window */
  size_t map_want;              /* files the mapper waits for (its window's size) */
  struct tb_root *roots, **roots_tail;
  struct tb_file *head, **tail;  /* walked, not yet passed by tar */
  struct tb_file *rhead, **rtail;  /* walked, not yet taken by the reader */
  size_t n_unread;
  uint64_t unread_bytes;
  struct tb_file **hash;
  size_t hash_size;
  uint64_t next_seq, live_bytes;
  bool waiting;                 /* tar waited for a file of the first window */
  struct tb_file *wait_for;     /* the file tar waits for */
  bool budget_waiting;          /* the reader thread waits for tar to free memory */
  struct tb_window *mapped;     /* mapped, for the reader thread to read */
  struct tb_counts c;
  struct bfo_read_stats rstats;
  /* The read-ahead data (lib/pool.c), kept to the end of the process: tar
     may drop a file's data at any time before.  */
  struct bfo_pool *pool;

  /* tar's side only */
  struct tb_file *current;      /* whose data tar is archiving */
  uint64_t done_files, done_bytes;
  struct timespec t_start, t_last;
  bool progress_tty, progress_shown;
  double progress_every;        /* seconds between progress lines */

  /* extract: ETA from how far tar has read an archive of known size */
  bool extracting, archive_checked;
  uint64_t members;              /* members extract_archive has begun */
  uint64_t archive_size, archive_pos;
} tb = { .lock = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER,
         .write_behind = BFO_WRITE_BEHIND_DEFAULT, .write_behind_flags = BFO_WRITE_BEHIND_AUTO };

/* ---------------------------------------------------------------- options */

/* A positive count, or with SIZE a size with an optional K, M, G (KiB...) suffix.  */
static bool
parse_count (const char *arg, bool size, uint64_t *out)
{
  char *end;
  uint64_t mult = 1;
  if (!arg || *arg < '0' || *arg > '9')
    return false;
  errno = 0;
  unsigned long long v = strtoull (arg, &end, 10);
  if (size && *end)
    {
      switch (*end)
        {
        case 'k': case 'K': mult = 1ull << 10; break;
        case 'm': case 'M': mult = 1ull << 20; break;
        case 'g': case 'G': mult = 1ull << 30; break;
        default: return false;
        }
      if (end[1] == '\0' || strcmp (end + 1, "iB") == 0)
        end += strlen (end);
    }
  if (errno || *end || v == 0 || v > (size ? (4ull << 40) : UINT32_MAX) / mult)
    return false;
  *out = v * mult;
  return true;
}

const char *
tar_batch_option (enum tar_batch_option which, const char *arg)
{
  uint64_t v;
  switch (which)
    {
    case TAR_BATCH_MODE:
      if (strcmp (arg, "auto") == 0)
        tb.off = false;
      else if (strcmp (arg, "never") == 0)
        tb.off = true;
      else
        return "--batch";
      break;
    case TAR_BATCH_FILES:
      if (!parse_count (arg, false, &v))
        return "--batch-files";
      tb.window_files = v;
      break;
    case TAR_BATCH_BYTES:
      if (!parse_count (arg, true, &v) || v < (1u << 20))
        return "--batch-bytes";
      tb.budget_bytes = v;
      break;
    case TAR_BATCH_IO_DEPTH:
      if (!parse_count (arg, false, &v) || v > 4096)
        return "--io-depth";
      tb.io_depth = v;
      break;
    case TAR_BATCH_PROGRESS:
      tb.progress = true;
      break;
    case TAR_BATCH_STATS:
      tb.stats = true;
      break;
    case TAR_BATCH_LAYOUT:
      /* A trace is read when extraction starts; one that cannot be read is
         refused here already.  */
      if (!(strcmp (arg, "walk") == 0 || strcmp (arg, "dir") == 0
            || strcmp (arg, "refs") == 0
            || (strncmp (arg, "trace=", 6) == 0 && arg[6] && access (arg + 6, R_OK) == 0)))
        return "--layout";
      tb.layout = arg;
      break;
    case TAR_BATCH_TRACE_SUPPORT:
      if (bfo_layout_parse_support (arg, &tb.trace_support) < 0)
        return "--trace-support";
      break;
    case TAR_BATCH_TRACE_BATCH_REFS:
      if (!parse_count (arg, false, &v) || v > UINT_MAX)
        return "--trace-batch-refs";
      tb.trace_batch_refs = v;
      break;
    case TAR_BATCH_TRACE_ROOT:
      tb.trace_root = arg;
      break;
    case TAR_BATCH_EXCLUDE:
      tb.exclude = true;
      break;
    case TAR_BATCH_WRITE_BEHIND:
      if (strcmp (arg, "auto") == 0)
        {
          tb.write_behind = BFO_WRITE_BEHIND_DEFAULT;
          tb.write_behind_flags = BFO_WRITE_BEHIND_AUTO;
          break;
        }
      if (strcmp (arg, "0") == 0)
        v = 0;
      else if (!parse_count (arg, true, &v) || v < (1u << 20))
        return "--write-behind";
      tb.write_behind = v;
      tb.write_behind_flags = 0;
      break;
    case TAR_BATCH_CLONE_STEM:
      if (strcmp (arg, "auto") == 0)
        tb.clone_stem = TAR_BATCH_STEM_AUTO;
      else if (strcmp (arg, "always") == 0)
        tb.clone_stem = TAR_BATCH_STEM_ALWAYS;
      else if (strcmp (arg, "never") == 0)
        tb.clone_stem = TAR_BATCH_STEM_NEVER;
      else
        return "--clone-stem";
      break;
    }
  return NULL;
}

void
tar_batch_get_settings (struct tar_batch_settings *s)
{
  s->off = tb.off;
  s->progress = tb.progress;
  s->stats = tb.stats;
  s->files = tb.window_files;
  s->bytes = tb.budget_bytes;
  s->layout = tb.layout;
  s->trace_support = tb.trace_support;
  s->trace_batch_refs = tb.trace_batch_refs;
  s->trace_root = tb.trace_root;
  s->write_behind = tb.write_behind;
  s->write_behind_flags = tb.write_behind_flags;
  s->clone_stem = tb.clone_stem;
}

/* ---------------------------------------------------------------- the table */

static size_t
hash_of (dev_t dev, ino_t ino)
{
  uint64_t h = ((uint64_t) dev * 0x9e3779b97f4a7c15ull) ^ ((uint64_t) ino * 0xff51afd7ed558ccdull);
  return (h ^ (h >> 29)) & (tb.hash_size - 1);
}

static struct tb_file *
hash_find (dev_t dev, ino_t ino)
{
  for (struct tb_file *f = tb.hash[hash_of (dev, ino)]; f; f = f->hnext)
    if (f->dev == dev && f->ino == ino)
      return f;
  return NULL;
}

static void
hash_remove (struct tb_file *f)
{
  struct tb_file **p = &tb.hash[hash_of (f->dev, f->ino)];
  while (*p && *p != f)
    p = &(*p)->hnext;
  if (*p)
    *p = f->hnext;
}

/* Free F's data and give its bytes back to the budget (lock held).  */
static void
release_data (struct tb_file *f)
{
  bfo_pool_free (tb.pool, f->data, f->st.st_size);
  f->data = NULL;
  tb.live_bytes -= f->charged;
  f->charged = 0;
  /* Wake a waiting thread only when it has a reason: a wake-up per file costs
     two context switches.  */
  if (tb.budget_waiting)
    pthread_cond_broadcast (&tb.cond);
}

/* Drop one reference to R (lock held).  */
static void
unref_root (struct tb_root *r)
{
  if (r && --r->refs == 0)
    {
      close (r->fd);
      free (r);
    }
}

static void
free_file (struct tb_file *f)
{
  release_data (f);
  free (f->path);
  free (f);
}

/* Take the first file off the walk list (lock held): freed, or, while the
   thread still reads it, marked for the thread to free.  */
static struct tb_file *
pop_head (void)
{
  struct tb_file *f = tb.head;
  tb.head = f->next;
  if (!tb.head)
    tb.tail = &tb.head;
  hash_remove (f);
  f->next = NULL;
  return f;
}

/* Tar is done with F (lock held).  */
static void
discard (struct tb_file *f)
{
  if (f->in_window)
    f->dropped = true;
  else
    free_file (f);
}

/* Tar went past F without asking for it (lock held).  */
static void
pass_file (struct tb_file *f)
{
  if (f->state == TB_READY)
    tb.c.not_used++;
  discard (f);
}

/* ---------------------------------------------------------------- the walk */

static enum tar_batch_sort cmp_sort;

static int
cmp_dent (const void *a, const void *b)
{
  const struct bfo_meta_entry *x = a, *y = b;
  if (cmp_sort == TAR_BATCH_SORT_NAME)
    return strcmp (x->name, y->name);
  return x->ino < y->ino ? -1 : x->ino > y->ino;
}

/* The walk's metadata read-ahead (root on ext4: lib/prefetch.c), for the file
   system of the current root, and that file system.  Before the walk stats
   a directory's entries and descends into its subdirectories one by one, it
   asks for all their inode-table blocks and the subdirectories' blocks at
   once, in physical order.  BFO_TAR_META_AHEAD=0 turns it off.  */
static struct bfo_meta_ahead *meta_ahead;
static dev_t meta_ahead_dev;

/* At each root: a read-ahead for its file system, unless it has one.  */
static void
root_ahead (int fd, dev_t dev)
{
  if (meta_ahead && meta_ahead_dev == dev)
    return;
  bfo_meta_ahead_close (meta_ahead);
  meta_ahead = NULL;
  const char *e = getenv ("BFO_TAR_META_AHEAD");
  if (e && strcmp (e, "0") == 0)
    return;
  if (bfo_meta_ahead_open (fd, ".", &meta_ahead) == 0)
    meta_ahead_dev = dev;
}

/* Read directory FD's entries as tar's savedir does: readdir order without "."
   and "..", sorted by name or inode number if --sort says so.  Takes FD.  */
static bool
open_dir (struct tb_dir *d, int fd, dev_t dev, char *rel)
{
  memset (d, 0, sizeof *d);
  d->fd = fd;
  d->dev = dev;
  d->rel = rel;
  int lfd = openat (fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  DIR *dir = lfd < 0 ? NULL : fdopendir (lfd);
  if (!dir)
    {
      if (lfd >= 0)
        close (lfd);
      return false;
    }
  struct bfo_meta_entry *v = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  bool ok = true;
  while ((de = readdir (dir)))
    {
      if (bfo_dot_or_dotdot (de->d_name))
        continue;
      if (n == cap)
        {
          cap = cap ? 2 * cap : 64;
          struct bfo_meta_entry *x = realloc (v, cap * sizeof *v);
          if (!x)
            {
              ok = false;
              break;
            }
          v = x;
        }
      v[n].name = strdup (de->d_name);
      v[n].ino = de->d_ino;
      v[n].type = de->d_type;
      if (!v[n].name)
        {
          ok = false;
          break;
        }
      n++;
    }
  closedir (dir);
  /* (not while the tree is taken as warm: its inode tables are cached too) */
  if (ok && !tb.warm)
    tb.c.ahead_requests += bfo_meta_ahead_dir (meta_ahead, fd, v, n);
  if (ok && tb.setup.sort != TAR_BATCH_SORT_NONE)
    {
      cmp_sort = tb.setup.sort;
      qsort (v, n, sizeof *v, cmp_dent);
    }
  d->names = malloc ((n ? n : 1) * sizeof *d->names);
  d->types = malloc (n ? n : 1);
  if (!ok || !d->names || !d->types)
    {
      for (size_t i = 0; i < n; i++)
        free (v[i].name);
      free (v);
      free (d->names);
      free (d->types);
      d->names = NULL;
      d->types = NULL;
      return false;
    }
  for (size_t i = 0; i < n; i++)
    {
      d->names[i] = v[i].name;
      d->types[i] = v[i].type;
    }
  free (v);
  d->n = n;
  return true;
}

static void
close_dir (struct tb_dir *d)
{
  for (size_t i = 0; i < d->n; i++)
    free (d->names[i]);
  free (d->names);
  free (d->types);
  free (d->rel);
  if (d->fd >= 0)
    close (d->fd);
  d->fd = -1;
}

static char *
join (const char *rel, const char *name)
{
  size_t a = strlen (rel), b = strlen (name);
  char *p = malloc (a + b + 2);
  if (p)
    {
      memcpy (p, rel, a);
      if (a)
        p[a++] = '/';
      memcpy (p + a, name, b + 1);
    }
  return p;
}

/* The walk of the current root: a stack of directories.  */
static struct tb_dir *stack;
static size_t depth, stack_cap;
static struct tb_root *root;

/* Inodes with several links already walked: tar archives later names as links.  */
struct tb_key { dev_t dev; ino_t ino; };
static struct tb_key *links;
static size_t links_n, links_cap;  /* cap a power of 2; ino 0 marks a free slot */

static bool
push_dir (int fd, dev_t dev, char *rel)
{
  if (depth == stack_cap)
    {
      size_t cap = stack_cap ? 2 * stack_cap : 16;
      struct tb_dir *x = realloc (stack, cap * sizeof *x);
      if (!x)
        {
          close (fd);
          free (rel);
          return false;
        }
      stack = x;
      stack_cap = cap;
    }
  if (!open_dir (&stack[depth], fd, dev, rel))
    {
      close (fd);
      free (rel);
      return false;
    }
  depth++;
  return true;
}

static size_t
key_slot (const struct tb_key *t, size_t cap, dev_t dev, ino_t ino)
{
  uint64_t h = ((uint64_t) dev * 0x9e3779b97f4a7c15ull) ^ ((uint64_t) ino * 0xff51afd7ed558ccdull);
  size_t i = (h ^ (h >> 29)) & (cap - 1);
  while (t[i].ino && !(t[i].dev == dev && t[i].ino == ino))
    i = (i + 1) & (cap - 1);
  return i;
}

/* Whether DEV/INO was seen before; remembers it (if memory allows).  */
static bool
seen_link (dev_t dev, ino_t ino)
{
  if (ino == 0)
    return false;
  if (2 * (links_n + 1) > links_cap)
    {
      size_t cap = links_cap ? 2 * links_cap : 1024;
      struct tb_key *t = calloc (cap, sizeof *t);
      if (!t)
        return false;
      for (size_t i = 0; i < links_cap; i++)
        if (links[i].ino)
          t[key_slot (t, cap, links[i].dev, links[i].ino)] = links[i];
      free (links);
      links = t;
      links_cap = cap;
    }
  size_t i = key_slot (links, links_cap, dev, ino);
  if (links[i].ino)
    return true;
  links[i].dev = dev;
  links[i].ino = ino;
  links_n++;
  return false;
}

/* The directory whose next entry the walk takes (its pos advanced past it:
   *NAME, *TYPE), closing those done; NULL when the walk is done.  */
static struct tb_dir *
next_entry (const char **name, unsigned char *type)
{
  while (depth > 0)
    {
      struct tb_dir *d = &stack[depth - 1];
      if (d->pos < d->n)
        {
          *name = d->names[d->pos];
          *type = d->types[d->pos];
          d->pos++;
          return d;
        }
      close_dir (d);
      depth--;
    }
  return NULL;
}

/* Walk into NAME, a directory in D whose stat is ST, as tar will.  */
static void
descend (struct tb_dir *d, const char *name, const struct stat *st)
{
  /* tar does not descend to another file system under --one-file-system.  */
  if (tb.setup.one_file_system && st->st_dev != d->dev)
    return;
  int fd = openat (d->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  char *rel = join (d->rel, name);
  if (fd < 0 || !rel)
    {
      if (fd >= 0)
        close (fd);
      free (rel);
      return;
    }
  push_dir (fd, st->st_dev, rel);
}

/* The next regular file worth reading ahead, in tar's order, or NULL when the
   current root is done.  Walks with the thread's own descriptors, never
   following symlinks; what it cannot read it leaves to tar.  */
static struct tb_file *
walk_next (void)
{
  struct tb_dir *d;
  const char *name;
  unsigned char type;
  while ((d = next_entry (&name, &type)))
    {
      if (type != DT_REG && type != DT_DIR && type != DT_UNKNOWN)
        continue;
      struct stat st;
      if (fstatat (d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        continue;
      if (S_ISDIR (st.st_mode))
        {
          descend (d, name, &st);
          continue;
        }
      if (!S_ISREG (st.st_mode))
        continue;
      pthread_mutex_lock (&tb.lock);  /* the progress line reads these */
      tb.c.walked++;
      tb.c.walked_bytes += st.st_size;
      pthread_mutex_unlock (&tb.lock);
      if (st.st_size == 0)
        continue;               /* nothing to read */
      if ((uint64_t) st.st_size > tb.file_max)
        {
          tb.c.skip_large++;
          continue;
        }
      if (tb.setup.sparse
          && (uint64_t) st.st_blocks * 512 < (uint64_t) st.st_size)
        {
          tb.c.skip_sparse++;   /* tar's sparse path reads it */
          continue;
        }
      if (st.st_nlink > 1 && seen_link (st.st_dev, st.st_ino))
        continue;               /* tar archives it as a link, with no data */
      struct tb_file *f = calloc (1, sizeof *f);
      char *rel = join (d->rel, name);
      if (!f || !rel)
        {
          free (f);
          free (rel);
          continue;
        }
      /* The reader opens REL relative to the root's descriptor (held until
         the window is read), so that tar's -C and a renamed parent do not
         matter.  (It went through /proc/self/fd/N/REL before: twice the cost
         of an open, 2.6 us more per open, two opens a file.)  */
      f->path = rel;
      f->dev = st.st_dev;
      f->ino = st.st_ino;
      f->walk_size = st.st_size;
      f->root = root;
      pthread_mutex_lock (&tb.lock);
      root->refs++;
      pthread_mutex_unlock (&tb.lock);
      return f;
    }
  return NULL;
}

/* ---------------------------------------------------------------- the reader */

static void
finish_file (struct tb_file *f, bool ok)
{
  pthread_mutex_lock (&tb.lock);
  f->state = ok ? TB_READY : TB_FAILED;
  if (ok)
    {
      tb.c.read_files++;
      tb.c.read_bytes += f->have;
      /* Charge what was actually stored (the stat's size was charged).  */
      tb.live_bytes += f->have;
      tb.live_bytes -= f->charged;
      f->charged = f->have;
    }
  else
    {
      bfo_pool_free (tb.pool, f->data, f->st.st_size);
      f->data = NULL;
      tb.live_bytes -= f->charged;
      f->charged = 0;
    }
  if (tb.wait_for == f)
    pthread_cond_broadcast (&tb.cond);
  pthread_mutex_unlock (&tb.lock);
}

/* Keep the read-ahead data within the budget, file by file as their data
   arrive: wait until SIZE more bytes fit (or nothing is held), then count
   them for F.  False if bfotar is stopping.  The reader thread reads the
   windows in order and a window holds at most half the budget, so every
   older window is wholly delivered and tar can always free it: the wait
   ends.  (Files of this window that tar is done with are freed only with
   the window; should they fill the budget, having grown since the walk,
   tar then waits for this window's next file, and that ends the wait too.)
   Reserving a whole window before reading it (as before) made the
   reader wait for tar to archive all of the window before last, the device
   idle meanwhile.  */
static bool
charge (struct tb_file *f, uint64_t size)
{
  pthread_mutex_lock (&tb.lock);
  tb.live_bytes -= f->charged;  /* (none so far, unless it comes again) */
  f->charged = 0;
  while (tb.live_bytes > 0 && tb.live_bytes + size > tb.budget_bytes && !tb.stop
         && !tb.wait_for)
    {
      tb.budget_waiting = true;
      pthread_cond_wait (&tb.cond, &tb.lock);
    }
  tb.budget_waiting = false;
  bool go = !tb.stop;
  if (go)
    {
      tb.live_bytes += size;
      f->charged = size;
    }
  pthread_mutex_unlock (&tb.lock);
  return go;
}

static int
on_data (const struct bfo_file *bf, void *arg)
{
  struct tb_window *win = arg;
  struct tb_file *f = bf->user;
  if (f->state != TB_READING)
    return 0;                   /* already given up on */
  if (bf->flags & BFO_FILE_CACHED)
    {
      tb.c.skip_cached++;
      finish_file (f, false);
      return 0;
    }
  const struct stat *st = bf->st;
  /* (A file whose reads end elsewhere than its size is tar's: it says
     "File shrank" of one.)  */
  bool ok = !bf->error && st && st->st_dev == f->dev && st->st_ino == f->ino
            && !(bf->flags & (BFO_FILE_CHANGED | BFO_FILE_SHORT | BFO_FILE_LONG))
            && (uint64_t) st->st_size <= tb.file_max;
  if (ok && bf->offset == 0)
    {
      /* Racy: changed so recently that a change after our read might leave
         the timestamps as they are.  */
      if (bfo_racy (st, win->start))
        {
          tb.c.skip_racy++;
          ok = false;
        }
      else if (!charge (f, st->st_size))
        ok = false;
      else
        {
          bfo_pool_free (tb.pool, f->data, f->st.st_size);
          f->st = *st;
          f->data = bfo_pool_alloc (tb.pool, st->st_size);
          f->have = 0;
          ok = f->data != NULL;
        }
    }
  if (ok && (bf->offset != f->have || f->have + bf->len > (uint64_t) f->st.st_size
             || !f->data))
    ok = false;
  if (!ok)
    {
      if (bf->error)
        tb.c.skip_failed++;
      finish_file (f, false);
      return 0;
    }
  memcpy (f->data + f->have, bf->data, bf->len);
  f->have += bf->len;
  if (bf->last)
    finish_file (f, f->have == (uint64_t) f->st.st_size);
  return 0;
}

static struct tb_window windows[2];

/* Map window WIN, whose files the mapper thread just took (the mapper's).  */
static void
map_window (struct tb_window *win)
{
  clock_gettime (CLOCK_REALTIME, &win->start);
  pthread_mutex_lock (&tb.lock);
  for (size_t i = 0; i < win->n; i++)
    if (!win->w[i]->dropped)
      win->w[i]->state = TB_READING;
  pthread_mutex_unlock (&tb.lock);
  for (size_t i = 0; i < win->n && !tb.stop; i++)
    if (win->w[i]->state == TB_READING)
      bfo_reader_add_known (win->reader, win->w[i]->root->fd, win->w[i]->path,
                            win->w[i]->dev, win->w[i]->ino, win->w[i]);
  bfo_reader_map (win->reader);
}

/* Read window WIN, mapped (the reader thread's).  */
static void
read_window (struct tb_window *win)
{
  pthread_mutex_lock (&tb.lock);
  tb.c.windows++;
  pthread_mutex_unlock (&tb.lock);
  bfo_reader_flush (win->reader);
  /* Whatever the reader did not deliver (it stopped, or a file vanished from
     its view) is failed here, so that tar never waits for it; then the window
     is tar's.  */
  for (size_t i = 0; i < win->n; i++)
    {
      struct tb_file *f = win->w[i];
      if (f->state == TB_READING || f->state == TB_PENDING)
        finish_file (f, false);
      pthread_mutex_lock (&tb.lock);
      free (f->path);
      f->path = NULL;
      unref_root (f->root);
      f->root = NULL;
      f->in_window = false;
      if (f->dropped)
        free_file (f);
      pthread_mutex_unlock (&tb.lock);
    }
}

/* Wait for work (lock held): the next root to walk, or the end.  */
static bool
next_root (void)
{
  for (;;)
    {
      if (tb.stop)
        return false;
      if (tb.roots)
        break;
      tb.walk_idle = true;
      pthread_cond_broadcast (&tb.cond);
      pthread_cond_wait (&tb.cond, &tb.lock);
    }
  struct tb_root *r = tb.roots;
  tb.roots = r->next;
  if (!tb.roots)
    tb.roots_tail = &tb.roots;
  tb.walk_idle = false;
  unref_root (root);
  root = r;
  r->refs = 1;
  pthread_mutex_unlock (&tb.lock);
  int fd = openat (r->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  char *rel = strdup ("");
  if (fd >= 0 && rel)
    {
      root_ahead (fd, r->dev);
      push_dir (fd, r->dev, rel);
    }
  else
    {
      if (fd >= 0)
        close (fd);
      free (rel);
    }
  pthread_mutex_lock (&tb.lock);
  return true;
}

/* Is the regular file NAME in directory FD not wholly in the page cache?
   -1: not a regular file with data (not counted).  (Opening reads nothing:
   no access time changes.)  For a file the kernel will not tell about
   (another user's: bfo_file_cached), a read of one byte that waits for no
   disk (RWF_NOWAIT) tells whether its first page is cached; it reads what
   tar reads next anyway, and on a miss the kernel starts reading the file
   ahead, which tar or the reader then finds in the cache.  */
static int
warm_sample_cold (int fd, const char *name)
{
  int ffd = openat (fd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (ffd < 0)
    return -1;
  struct stat st;
  int cold = -1;
  if (fstat (ffd, &st) == 0 && S_ISREG (st.st_mode) && st.st_size > 0)
    {
      int c = bfo_file_cached (ffd);
      if (c == -EPERM)
        {
          char byte;
          struct iovec iov = { &byte, 1 };
          c = preadv2 (ffd, &iov, 1, 0, RWF_NOWAIT) == 1;
        }
      cold = c != 1;
    }
  close (ffd);
  return cold;
}

/* Is the tree warm?  The walk's first TB_WARM_SAMPLE files with data decide
   (the walker's, lock not held).  When 7/8 of them are wholly in the page
   cache, reading ahead would only add the walk's, the mapper's and the
   reader's opens and stats to tar's own (131072 cached 4 KiB files: 1.8 s
   with every file left to tar as the reader found it cached, 1.2 s for GNU
   tar): the walk lists no more files, and tar reads what it did not list
   itself; but the walk goes on, looking at some files (walk_warm), so that
   a tree warm only where it starts is read ahead from where it is cold.  */
static void
sample_warm (const struct tb_file *f)
{
  int cold = warm_sample_cold (f->root->fd, f->path);
  if (cold < 0)
    return;
  tb.sampled++;
  tb.sampled_cached += !cold;
  if (tb.sampled < TB_WARM_SAMPLE)
    return;
  tb.warm_decided = true;
  if (tb.sampled_cached * 8 >= tb.sampled * 7)
    {
      pthread_mutex_lock (&tb.lock);
      tb.c.warm_at = tb.c.walked;
      tb.warm = true;
      pthread_cond_broadcast (&tb.cond);
      pthread_mutex_unlock (&tb.lock);
    }
}

/* The walk while the tree is taken as warm (the walker's, lock not held): up
   to a few hundred entries, listing nothing and stat'ing only directories (a
   stat of every file slowed tar's own thread: 131072 cached 4 KiB files 1.23-
   1.25 s against 1.01-1.12 s); every TB_WARM_EVERY-th regular file is opened
   and the kernel asked whether it is wholly cached.  When TB_COLD_OF of the
   last TB_WARM_RECENT are not, the tree is cold after all and the walk lists
   files again from there on.  Before, the first 64 files decided for the
   whole run: with the first 200 files of the aged 4 KiB set in the page
   cache and the rest not, tar read all 131008 others itself (10 s, as GNU
   tar; now 2.7-2.8 s).  */
static void
walk_warm (void)
{
  struct tb_dir *d;
  const char *name;
  unsigned char type;
  for (int budget = 256; budget > 0 && (d = next_entry (&name, &type)); budget--)
    {
      if (type == DT_DIR || type == DT_UNKNOWN)
        {
          struct stat st;
          if (fstatat (d->fd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
            continue;
          if (S_ISDIR (st.st_mode))
            descend (d, name, &st);
          if (!S_ISREG (st.st_mode))
            continue;
        }
      else if (type != DT_REG)
        continue;
      if (tb.warm_seen++ % TB_WARM_EVERY != 0)
        continue;
      int cold = warm_sample_cold (d->fd, name);
      if (cold < 0)
        continue;
      tb.recent_cold = ((tb.recent_cold << 1) | cold) & ((1u << TB_WARM_RECENT) - 1);
      if (cold && (unsigned int) __builtin_popcount (tb.recent_cold) >= TB_COLD_OF)
        {
          pthread_mutex_lock (&tb.lock);
          tb.warm = false;
          tb.relisting = true;
          tb.c.cold_at = tb.c.walked + tb.warm_seen;
          pthread_mutex_unlock (&tb.lock);
          return;
        }
    }
}

/* The walker thread: lists the files tar will dump, in its order, at most two
   windows ahead of the reader.  Each file goes on tar's list at once, so that
   tar waits for it rather than read it itself.  */
static void *
walker (void *arg)
{
  (void) arg;
  pthread_mutex_lock (&tb.lock);
  while (depth > 0 || next_root ())
    {
      while (tb.n_unread >= 2 * (size_t) tb.window_files && !tb.stop && !tb.warm)
        pthread_cond_wait (&tb.cond, &tb.lock);
      if (tb.stop)
        break;
      bool warm = tb.warm;
      pthread_mutex_unlock (&tb.lock);
      struct tb_file *f = NULL;
      if (warm)
        walk_warm ();
      else if ((f = walk_next ()) && !tb.warm_decided && f->walk_size > 0)
        sample_warm (f);
      pthread_mutex_lock (&tb.lock);
      if (!f)
        continue;
      f->seq = tb.next_seq++;
      f->state = TB_PENDING;
      f->in_window = true;
      *tb.tail = f;
      tb.tail = &f->next;
      *tb.rtail = f;
      tb.rtail = &f->rnext;
      tb.n_unread++;
      tb.unread_bytes += f->walk_size;
      f->hnext = tb.hash[hash_of (f->dev, f->ino)];
      tb.hash[hash_of (f->dev, f->ino)] = f;
      if (tb.c.windows == 0 || tb.n_unread >= tb.map_want
          || tb.unread_bytes >= tb.budget_bytes / 2 || tb.head == f)
        pthread_cond_broadcast (&tb.cond);
    }
  tb.walk_idle = true;
  tb.walker_running = false;
  pthread_cond_broadcast (&tb.cond);
  pthread_mutex_unlock (&tb.lock);
  while (depth > 0)
    close_dir (&stack[--depth]);
  bfo_meta_ahead_close (meta_ahead);
  meta_ahead = NULL;
  return NULL;
}

/* The mapper thread: takes windows of walked files and maps them, one window
   ahead of the reader thread (the two windows take turns with the two
   readers).  The reader's metadata phase (an open, fstat, FIEMAP and close
   per file) was a quarter of the reader thread's time, during which no data
   were read.  */
static void *
mapper (void *arg)
{
  (void) arg;
  size_t cap = tb.window_files;
  uint64_t window_max = tb.budget_bytes / 2;
  unsigned int first = TB_FIRST_WINDOW_FILES < cap ? TB_FIRST_WINDOW_FILES : cap;
  size_t grow = first;
  pthread_mutex_lock (&tb.lock);
  for (uint64_t k = 0;; k++)
    {
      /* WIN's last window has been read once the reader thread has taken the
         one mapped after it.  */
      struct tb_window *win = &windows[k % 2];
      while (tb.mapped && !tb.stop)
        pthread_cond_wait (&tb.cond, &tb.lock);
      /* A full window, or what there is when the walk waits for tar (its
         roots done) or tar waits for the first window (the first, or the
         first since the walk lists files again: walk_warm).  */
      bool start;
      size_t limit;
      for (;;)
        {
          start = k == 0 || tb.relisting;
          if (start)
            grow = first;
          limit = grow;
          tb.map_want = limit;
          if (tb.stop || tb.n_unread >= limit || tb.unread_bytes >= window_max
              || (tb.n_unread > 0 && (tb.walk_idle || (tb.waiting && start))))
            break;
          pthread_cond_wait (&tb.cond, &tb.lock);
        }
      if (tb.stop)
        break;
      tb.relisting = false;
      size_t n = 0;
      uint64_t bytes = 0;
      while (tb.rhead && n < limit && (n == 0 || bytes + tb.rhead->walk_size <= window_max))
        {
          struct tb_file *f = tb.rhead;
          tb.rhead = f->rnext;
          if (!tb.rhead)
            tb.rtail = &tb.rhead;
          tb.n_unread--;
          tb.unread_bytes -= f->walk_size;
          win->w[n++] = f;
          bytes += f->walk_size;
        }
      pthread_cond_broadcast (&tb.cond);  /* the walker may go on */
      win->n = n;
      grow = grow < cap / TB_WINDOW_GROWTH ? grow * TB_WINDOW_GROWTH : cap;
      pthread_mutex_unlock (&tb.lock);
      map_window (win);
      pthread_mutex_lock (&tb.lock);
      /* Handed over even when stopping: only the reader thread's flush and
         clean-up let go of its files.  */
      while (tb.mapped)
        pthread_cond_wait (&tb.cond, &tb.lock);
      tb.mapped = win;
      pthread_cond_broadcast (&tb.cond);
    }
  tb.mapper_running = false;
  pthread_cond_broadcast (&tb.cond);
  pthread_mutex_unlock (&tb.lock);
  return NULL;
}

/* The reader thread: reads the windows the mapper thread mapped, in turn.  */
static void *
producer (void *arg)
{
  (void) arg;
  pthread_mutex_lock (&tb.lock);
  for (;;)
    {
      while (!tb.mapped && tb.mapper_running)
        pthread_cond_wait (&tb.cond, &tb.lock);
      struct tb_window *win = tb.mapped;
      if (!win)
        break;
      tb.mapped = NULL;
      pthread_cond_broadcast (&tb.cond);  /* the mapper may map the next */
      /* (the budget is kept file by file, as the data arrive: on_data) */
      pthread_mutex_unlock (&tb.lock);
      read_window (win);
      pthread_mutex_lock (&tb.lock);
    }
  tb.thread_running = false;
  pthread_cond_broadcast (&tb.cond);
  pthread_mutex_unlock (&tb.lock);
  return NULL;
}

/* Add both readers' counts to tb.rstats, close them and free the windows.  */
static void
close_readers (void)
{
  for (int i = 0; i < 2; i++)
    {
      if (windows[i].reader)
        {
          struct bfo_read_stats s;
          bfo_reader_get_stats (windows[i].reader, &s);
          BFO_COUNTERS_ADD (&tb.rstats, &s);
          bfo_reader_close (windows[i].reader);
        }
      windows[i].reader = NULL;
      free (windows[i].w);
      windows[i].w = NULL;
    }
}

/* ---------------------------------------------------------------- tar's side */

/* Progress lines: every second when stderr is not a terminal (a log keeps
   one line a second), five a second in place on a terminal.
   BFO_PROGRESS_INTERVAL=SECONDS overrides (0: a line for every file).  */
static void
progress_begin (void)
{
  clock_gettime (CLOCK_MONOTONIC, &tb.t_start);
  tb.t_last = tb.t_start;
  tb.progress_tty = isatty (STDERR_FILENO);
  tb.progress_every = tb.progress_tty ? 0.2 : 1.0;
  const char *env = getenv ("BFO_PROGRESS_INTERVAL");
  char *end;
  double every = env && *env ? strtod (env, &end) : -1;
  if (every >= 0 && *end == '\0')
    tb.progress_every = every;
}

/* The soft limit of descriptors the system gives by default (1024) leaves
   each of create's two readers 240 and extraction about 480 queued files:
   groups of 240 files, reopened one group at a time.  With the soft limit at
   1024 and a high hard one, bfotar -c of 131072 aged 4 KiB files took 4.09-4.44
   s against 3.68-3.92 s at 20000 (reopen 630 ms against 124 ms), -x onto ext4
   3.24-3.30 s against 3.07-3.16 s.  So, as systemd advises programs that need
   many descriptors (and use no select), bfotar raises its soft limit, from
   TB_RAISE_FROM up (a lower one was set on purpose: tar's own test runs with
   10), to TB_RAISE_TO within the hard limit; the processes it starts
   (compressors, --to-command, rsh) get the limit it was given.  */
static struct rlimit nofile_given;

static void
nofile_restore (void)
{
  setrlimit (RLIMIT_NOFILE, &nofile_given);
}

void
tar_batch_more_descriptors (void)
{
  static bool tried;
  if (tried)
    return;
  tried = true;
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY
      || rl.rlim_cur < TB_RAISE_FROM || rl.rlim_cur >= TB_RAISE_TO
      || rl.rlim_max <= rl.rlim_cur)
    return;
  nofile_given = rl;
  if (pthread_atfork (NULL, NULL, nofile_restore) != 0)
    return;
  struct rlimit more = { rl.rlim_max < TB_RAISE_TO ? rl.rlim_max : TB_RAISE_TO, rl.rlim_max };
  setrlimit (RLIMIT_NOFILE, &more);
}

void
tar_batch_start (const struct tar_batch_setup *setup)
{
  const char *env = getenv ("BFO_DISABLE");
  if (env && *env && strcmp (env, "0") != 0)
    tb.off = true;
  env = getenv ("BFO_STATS");
  if (env && *env && strcmp (env, "0") != 0)
    tb.stats = true;
  tb.setup = *setup;
  progress_begin ();
  tb.started = true;
  /* Read-ahead holds descriptors beside tar's own, which it needs for deep
     trees: with few (tar's test "scarce file descriptors" runs with 10),
     tar reads everything itself.  */
  struct rlimit rl;
  bool scarce = getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < TB_MIN_NOFILE;
  if (tb.off || setup->incremental || setup->atime_preserve || setup->dev_null_output
      || !setup->recursion || scarce || bfo_memory_scarce ())
    {
      tb.off = true;
      return;
    }
}

/* Start the readers and the walker, mapper and reader threads: at the first
   directory tar hands over, so that `tar -cf a.tar file...' pays for none of
   it.  False (and tb.off) when they cannot be started.  */
static bool
launch (void)
{
  tb.launched = true;
  tar_batch_more_descriptors ();
  if (!tb.window_files || !tb.budget_bytes)
    {
      uint64_t memory = bfo_memory_limit ();
      bool big = memory >= TB_BIG_MEMORY;
      uint64_t bytes = big ? TB_BIG_BYTES : TB_DEFAULT_BYTES;
      unsigned int files = big ? TB_BIG_FILES : TB_DEFAULT_FILES;
      bfo_fit_memory (memory, &bytes, &files);   /* (less under a small memory limit) */
      if (!tb.window_files)
        tb.window_files = files;
      if (!tb.budget_bytes)
        tb.budget_bytes = bytes;
    }
  tb.file_max = tb.budget_bytes / 4 < TB_FILE_MAX_BYTES ? tb.budget_bytes / 4 : TB_FILE_MAX_BYTES;
  tb.hash_size = 1024;
  while (tb.hash_size < 4 * (size_t) tb.window_files)
    tb.hash_size *= 2;
  tb.hash = calloc (tb.hash_size, sizeof *tb.hash);
  struct bfo_read_opts o = { 0 };
  /* GNU tar reads the files it archives (unless --atime-preserve, which
     leaves it all to tar): its reads update their access times as the mount
     allows, and so do ours.  */
  o.flags = BFO_READ_ATIME | BFO_READ_SHARE_FDS;
  /* A file wholly in the page cache is tar's to read: reading it ahead would
     only add our opens and copies to tar's (a warm 4 KiB set took 1.8-1.9 s
     that way, against 1.2 s for GNU tar).  */
  o.flags |= BFO_READ_SKIP_CACHED;
  /* Placed by their inodes (root on ext4), not opened twice: tar reads holes
     as zeros unless --sparse, and the walk leaves files with holes to tar
     then.  */
  o.flags |= BFO_READ_MAP_INODES;
  o.io_depth = tb.io_depth;
  /* (one more than a window, and no time limit: the mapper's adds must never
     run the window themselves) */
  o.window_files = tb.window_files + 1;
  o.batch_ms = UINT_MAX / 2;
  o.batch_files = tb.window_files < 8192 ? tb.window_files : 8192;
  /* (each reader's group buffer: a quarter each, as one reader had half) */
  o.batch_bytes = tb.budget_bytes / 4;
  o.large_file_bytes = tb.file_max;
  bool ok = tb.hash != NULL
            && (tb.pool || bfo_pool_new (&tb.pool, tb.budget_bytes / 2) == 0);
  for (int i = 0; i < 2; i++)
    {
      windows[i].w = ok ? malloc (tb.window_files * sizeof *windows[i].w) : NULL;
      ok = windows[i].w
           && bfo_reader_open (&windows[i].reader, &o, on_data, &windows[i]) == 0;
    }
  if (!ok)
    {
      close_readers ();
      free (tb.hash);
      tb.hash = NULL;
      tb.off = true;
      return false;
    }
  tb.tail = &tb.head;
  tb.rtail = &tb.rhead;
  tb.roots_tail = &tb.roots;
  tb.walk_idle = true;
  /* The threads take no signals (bfo_thread_create): tar's handlers run
     on tar's thread.  (set before the threads start: each waits on the others' flags) */
  tb.mapper_running = tb.thread_running = tb.walker_running = true;
  bool mapper_ok = bfo_thread_create (&tb.mapper, "bfo-map", mapper, NULL) == 0;
  bool thread_ok = mapper_ok && bfo_thread_create (&tb.thread, "bfo-read", producer, NULL) == 0;
  bool walker_ok = thread_ok && bfo_thread_create (&tb.walker, "bfo-walk", walker, NULL) == 0;
  if (!walker_ok)
    {
      pthread_mutex_lock (&tb.lock);
      tb.stop = true;
      tb.walker_running = false;
      if (!thread_ok)
        tb.thread_running = false;
      if (!mapper_ok)
        tb.mapper_running = false;
      pthread_cond_broadcast (&tb.cond);
      pthread_mutex_unlock (&tb.lock);
      if (mapper_ok)
        pthread_join (tb.mapper, NULL);
      if (thread_ok)
        pthread_join (tb.thread, NULL);
      tb.thread_running = tb.mapper_running = false;
      close_readers ();
      tb.off = true;
    }
  return !tb.off;
}

void
tar_batch_root (int dir_fd, const struct stat *st)
{
  if (tb.off)
    return;
  /* Reading ahead updates access times as tar's reads would (BFO_READ_ATIME),
     but the walk also reads files tar then passes over (--exclude*, --newer):
     theirs would change where tar leaves them alone.  Unless the file system
     never updates access times, tar reads such a tree itself.  */
  struct statvfs vfs;
  if ((tb.exclude || tb.setup.newer)
      && !(fstatvfs (dir_fd, &vfs) == 0 && (vfs.f_flag & ST_NOATIME)))
    {
      tb.c.skip_atime_roots++;
      return;
    }
  unsigned int small_entries = TB_SMALL_ENTRIES, small_dirs = TB_SMALL_DIRS;
  if (!tb.launched && bfo_tree_small (dir_fd, ".", &small_entries, &small_dirs) == 1)
    {
      tb.c.small_roots++;
      return;
    }
  if ((!tb.launched && !launch ()) || !tb.thread_running)
    return;
  /* A descriptor of our own (a dup would share tar's directory offset).  */
  int fd = openat (dir_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  struct tb_root *r = fd < 0 ? NULL : malloc (sizeof *r);
  if (!r)
    {
      if (fd >= 0)
        close (fd);
      return;
    }
  r->fd = fd;
  r->dev = st->st_dev;
  r->refs = 0;
  r->next = NULL;
  pthread_mutex_lock (&tb.lock);
  *tb.roots_tail = r;
  tb.roots_tail = &r->next;
  tb.walk_idle = false;
  pthread_cond_broadcast (&tb.cond);
  pthread_mutex_unlock (&tb.lock);
}

static double
seconds_since (struct timespec t)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (now.tv_sec - t.tv_sec) + (now.tv_nsec - t.tv_nsec) / 1e9;
}

static void
human (char *buf, size_t size, double bytes)
{
  static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
  int u = 0;
  while (bytes >= 1024 && u < 4)
    bytes /= 1024, u++;
  snprintf (buf, size, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

/* How far along the ETA is measured, and the whole, if known: on create the
   bytes tar archived of those the walk found once it has walked everything;
   on extract the bytes tar read of an archive that is a regular file.  */
static bool
eta_basis (uint64_t *done, uint64_t *total)
{
  if (tb.extracting)
    {
      *done = tb.archive_pos;
      *total = tb.archive_size;
      return tb.archive_size > 0;
    }
  pthread_mutex_lock (&tb.lock);
  bool known = !tb.off && tb.walk_idle && !tb.roots;
  *total = tb.c.walked_bytes;
  pthread_mutex_unlock (&tb.lock);
  *done = tb.done_bytes;
  return known;
}

/* One progress line: files, bytes, rate and, once the total is known, ETA.  */
static void
show_progress (bool last)
{
  double secs = seconds_since (tb.t_start);
  char done[32], rate[32], eta[32] = "";
  human (done, sizeof done, tb.done_bytes);
  human (rate, sizeof rate, secs > 0 ? tb.done_bytes / secs : 0);
  uint64_t eta_done, eta_total;
  bool known = eta_basis (&eta_done, &eta_total);
  if (last)
    snprintf (eta, sizeof eta, ", %.1f s", secs);
  else if (known && eta_total >= eta_done && eta_done > 0 && secs > 0)
    {
      double left = (eta_total - eta_done) / (eta_done / secs);
      snprintf (eta, sizeof eta, ", ETA %d:%02d", (int) left / 60, (int) left % 60);
    }
  else
    snprintf (eta, sizeof eta, ", ETA --:--");
  fprintf (stderr, "%s%s: %" PRIu64 " files, %s, %s/s%s%s",
           tb.progress_tty ? "\r" : "", program_invocation_short_name,
           tb.done_files, done, rate, eta,
           tb.progress_tty ? (last ? "\033[K\n" : "\033[K") : "\n");
  fflush (stderr);
  tb.progress_shown = true;
}

static void
count_progress (uint64_t bytes)
{
  tb.done_files++;
  tb.done_bytes += bytes;
  if (!tb.progress)
    return;
  if (seconds_since (tb.t_last) >= tb.progress_every)
    {
      clock_gettime (CLOCK_MONOTONIC, &tb.t_last);
      show_progress (false);
    }
}

void
tar_batch_extract_begin (void)
{
  progress_begin ();
  tb.extracting = true;
  tb.started = true;
  tb.off = true;                /* nothing of create's reading ahead */
}

void
tar_batch_extract_member (uint64_t bytes, int archive_fd, uint64_t archive_pos)
{
  tb.members++;
  if (!tb.extracting)
    return;
  if (!tb.archive_checked)
    {
      /* A compressed archive comes through a pipe from the decompressor:
         its size says nothing of how much is left.  */
      struct stat st;
      tb.archive_checked = true;
      if (fstat (archive_fd, &st) == 0 && S_ISREG (st.st_mode) && st.st_size > 0)
        tb.archive_size = st.st_size;
    }
  tb.archive_pos = archive_pos;
  count_progress (bytes);
}

uint64_t
tar_batch_extract_members (void)
{
  return tb.members;
}

uint64_t
tar_batch_archive_size (void)
{
  return tb.archive_checked ? tb.archive_size : 0;
}

void
tar_batch_extract_end (void)
{
  if (!tb.extracting)
    return;
  if (tb.progress)
    show_progress (true);
  tb.extracting = false;
  tb.started = false;
}

/* The bytes of the regular file whose stat is ST, if read ahead from exactly
   that state; LOOKUP false: tar will not use any.  */
static char const *
take_data (bool lookup, const struct stat *st)
{
  if (!tb.started)
    return NULL;
  count_progress (st->st_size);
  if (tb.off)
    return NULL;
  if (!tb.launched)
    {
      /* (no directory yet: no other thread either) */
      if (lookup && st->st_size > 0)
        tb.c.missed++;
      return NULL;
    }
  pthread_mutex_lock (&tb.lock);
  if (tb.current)
    {
      discard (tb.current);
      tb.current = NULL;
    }
  struct tb_file *f = NULL;
  if (lookup && st->st_size > 0 && S_ISREG (st->st_mode))
    {
      /* Right after a root was handed over, give the walk a moment to list
         the first files before deciding this one was not read ahead.  */
      while (!(f = hash_find (st->st_dev, st->st_ino)) && tb.thread_running
             && !tb.walk_idle && !tb.head && !tb.warm)
        pthread_cond_wait (&tb.cond, &tb.lock);
    }
  if (!f)
    {
      if (lookup && st->st_size > 0)
        tb.c.missed++;
      pthread_mutex_unlock (&tb.lock);
      return NULL;
    }
  /* Everything walked before it, tar has gone past (excluded, other type,
     hard link): let it go.  */
  while (tb.head != f)
    pass_file (pop_head ());
  pop_head ();
  if (f->state == TB_PENDING || f->state == TB_READING)
    {
      tb.c.waits++;
      tb.waiting = true;
      tb.wait_for = f;
      pthread_cond_broadcast (&tb.cond);  /* the first window is read at once */
      while (f->state == TB_PENDING || f->state == TB_READING)
        pthread_cond_wait (&tb.cond, &tb.lock);
      tb.wait_for = NULL;
    }
  char const *data = NULL;
  if (f->state == TB_READY
      && f->st.st_size == st->st_size
      && f->st.st_mtim.tv_sec == st->st_mtim.tv_sec
      && f->st.st_mtim.tv_nsec == st->st_mtim.tv_nsec
      && f->st.st_ctim.tv_sec == st->st_ctim.tv_sec
      && f->st.st_ctim.tv_nsec == st->st_ctim.tv_nsec)
    {
      data = (char const *) f->data;
      tb.c.used++;
      tb.c.used_bytes += f->have;
    }
  else if (f->state == TB_READY)
    tb.c.stale++;
  tb.current = f;
  pthread_mutex_unlock (&tb.lock);
  return data;
}

/* The file tar_batch_data_unopened last answered NULL for, which tar then
   opens and dumps: it was taken and counted already.  Tar's thread's.  */
static struct
{
  bool set;
  dev_t dev;
  ino_t ino;
} unopened_missed;

char const *
tar_batch_data (int fd, const struct stat *st)
{
  bool taken = unopened_missed.set && unopened_missed.dev == st->st_dev
               && unopened_missed.ino == st->st_ino;
  unopened_missed.set = false;
  return taken ? NULL : take_data (fd > 0, st);
}

char const *
tar_batch_data_unopened (const struct stat *st)
{
  unopened_missed.set = false;
  if (!tb.started || !S_ISREG (st->st_mode) || st->st_nlink != 1 || st->st_size <= 0)
    return NULL;
  char const *data = take_data (true, st);
  if (!data)
    unopened_missed.set = true, unopened_missed.dev = st->st_dev,
      unopened_missed.ino = st->st_ino;
  return data;
}

static void
print_stats (void)
{
  const char *p = program_invocation_short_name;
  struct tb_counts *c = &tb.c;
  if (tb.off)
    {
      fprintf (stderr, "%s: batch: off; %" PRIu64 " files, %" PRIu64 " bytes read by tar\n",
               p, tb.done_files, tb.done_bytes);
      return;
    }
  fprintf (stderr, "%s: batch: walked %" PRIu64 " files (%" PRIu64 " bytes); read ahead %"
           PRIu64 " files (%" PRIu64 " bytes) in %" PRIu64 " windows\n",
           p, c->walked, c->walked_bytes, c->read_files, c->read_bytes, c->windows);
  fprintf (stderr, "%s: batch: used %" PRIu64 " files (%" PRIu64 " bytes); tar read %" PRIu64
           " itself (not read ahead %" PRIu64 ", changed since %" PRIu64 "); read but not used %"
           PRIu64 "; waited %" PRIu64 " times\n",
           p, c->used, c->used_bytes, c->missed + c->stale, c->missed, c->stale, c->not_used,
           c->waits);
  fprintf (stderr, "%s: batch: left to tar: large %" PRIu64 ", sparse %" PRIu64
           ", recently changed %" PRIu64 ", unreadable %" PRIu64 ", in the page cache %" PRIu64
           ", trees for access times %" PRIu64 ", small trees %" PRIu64 "\n",
           p, c->skip_large, c->skip_sparse, c->skip_racy, c->skip_failed, c->skip_cached,
           c->skip_atime_roots, c->small_roots);
  if (c->warm_at && !c->cold_at)
    fprintf (stderr, "%s: batch: warm tree (in the page cache): none listed after %" PRIu64
             " files, tar read the rest itself\n", p, c->warm_at);
  else if (c->warm_at)
    fprintf (stderr, "%s: batch: warm tree (in the page cache): none listed after %" PRIu64
             " files, cold again from file %" PRIu64 " on\n", p, c->warm_at, c->cold_at);
  struct bfo_read_stats *s = &tb.rstats;
  fprintf (stderr, "%s: reader: %" PRIu64 " extents, %" PRIu64 " requests, %" PRIu64
           " merged; fallbacks: no-fiemap %" PRIu64 ", inline %" PRIu64 ", encoded %" PRIu64
           ", unaligned %" PRIu64 ", delalloc %" PRIu64 ", changed %" PRIu64 ", other %" PRIu64
           ", in the page cache %" PRIu64 ", not told if cached (another user's: read buffered) %" PRIu64 "; placed by inode %" PRIu64 "; ms: meta %" PRIu64 ", reopen %" PRIu64 ", read %" PRIu64 ", deliver %" PRIu64 "\n",
           p, s->extents, s->requests, s->merged, s->fallback_no_fiemap, s->fallback_inline,
           s->fallback_encoded, s->fallback_unaligned, s->fallback_delalloc,
           s->fallback_changed, s->fallback_other, s->cached, s->cache_unknown, s->inode_mapped, s->us_meta / 1000, s->us_reopen / 1000,
           s->us_read / 1000, s->us_deliver / 1000);
  if (s->pread_threads)
    fprintf (stderr, "%s: reader: no io_uring: reads made on %" PRIu64 " threads\n", p,
             s->pread_threads);
  fprintf (stderr, "%s: walk: %" PRIu64 " metadata read-ahead requests\n", p,
           c->ahead_requests);
}

void
tar_batch_finish (void)
{
  if (!tb.started)
    return;
  if (!tb.off && tb.launched)
    {
      pthread_mutex_lock (&tb.lock);
      tb.stop = true;
      if (tb.current)
        discard (tb.current);
      tb.current = NULL;
      while (tb.head)
        pass_file (pop_head ());
      pthread_cond_broadcast (&tb.cond);
      pthread_mutex_unlock (&tb.lock);
      pthread_join (tb.walker, NULL);
      pthread_join (tb.mapper, NULL);
      pthread_join (tb.thread, NULL);
      close_readers ();
    }
  if (tb.progress)
    show_progress (true);
  if (tb.stats)
    print_stats ();
  tb.started = false;
}

/* ------------------------------------------------------------ abbreviations */

static bool
ours (const char *name)
{
  static const char *const names[] = { "batch", "batch-files", "batch-bytes", "io-depth",
                                       "progress", "stats", "ext4-image", "layout",
                                       "trace-support", "trace-batch-refs", "trace-root" };
  for (size_t i = 0; i < sizeof names / sizeof *names; i++)
    if (strcmp (name, names[i]) == 0)
      return true;
  return false;
}

struct abbrev_scan
{
  const char *word;             /* the name as typed */
  size_t len;
  const struct argp_option *exact, *unique;
  int matches;                  /* distinct (by key) prefix matches among tar's own */
  int key;
};

/* Whether OPT (or the option it is an alias of, PRIMARY) takes a value.  */
static bool
takes_value (const struct argp_option *primary)
{
  return primary && primary->arg && !(primary->flags & OPTION_ARG_OPTIONAL);
}

static void
scan_long (const struct argp *argp, struct abbrev_scan *a, const struct argp_option **primary_of_exact,
           const struct argp_option **primary_of_unique)
{
  const struct argp_option *primary = NULL;
  for (const struct argp_option *o = argp->options; o && (o->name || o->key || o->doc); o++)
    {
      if (!(o->flags & OPTION_ALIAS))
        primary = o;
      if (!o->name || (o->flags & OPTION_DOC))
        continue;
      if (strncmp (o->name, a->word, a->len) != 0)
        continue;
      if (strlen (o->name) == a->len)
        {
          a->exact = o;
          *primary_of_exact = primary;
        }
      else if (!ours (o->name) && (a->matches == 0 || a->key != primary->key))
        {
          a->matches += a->matches == 0 || a->key != primary->key;
          a->key = primary->key;
          a->unique = o;
          *primary_of_unique = primary;
        }
    }
  for (const struct argp_child *c = argp->children; c && c->argp; c++)
    scan_long (c->argp, a, primary_of_exact, primary_of_unique);
}

/* The primary option of short option KEY, or NULL.  */
static const struct argp_option *
find_short (const struct argp *argp, int key)
{
  const struct argp_option *primary = NULL;
  for (const struct argp_option *o = argp->options; o && (o->name || o->key || o->doc); o++)
    {
      if (!(o->flags & OPTION_ALIAS))
        primary = o;
      if (o->key == key && !(o->flags & OPTION_DOC))
        return primary;
    }
  for (const struct argp_child *c = argp->children; c && c->argp; c++)
    {
      const struct argp_option *p = find_short (c->argp, key);
      if (p)
        return p;
    }
  return NULL;
}

void
tar_batch_expand_abbrevs (int argc, char **argv, const struct argp *argp)
{
  for (int i = 1; i < argc; i++)
    {
      char *w = argv[i];
      if (strcmp (w, "--") == 0)
        return;
      if (w[0] != '-' || w[1] == '\0')
        continue;
      if (w[1] != '-')
        {
          /* Short options: the first that takes a value takes the rest of
             the word, or the next word.  */
          for (const char *c = w + 1; *c; c++)
            if (takes_value (find_short (argp, (unsigned char) *c)))
              {
                if (!c[1])
                  i++;
                break;
              }
          continue;
        }
      const char *eq = strchr (w + 2, '=');
      struct abbrev_scan a = { .word = w + 2, .len = eq ? (size_t) (eq - (w + 2)) : strlen (w + 2) };
      const struct argp_option *pe = NULL, *pu = NULL;
      if (a.len == 0)
        continue;
      scan_long (argp, &a, &pe, &pu);
      const struct argp_option *taken = NULL;
      if (a.exact)
        taken = pe;
      else if (a.matches == 1)
        {
          /* Spell it out: argp would otherwise find it ambiguous with ours.  */
          size_t n = strlen (a.unique->name), rest = eq ? strlen (eq) : 0;
          char *full = malloc (2 + n + rest + 1);
          if (!full)
            return;
          memcpy (full, "--", 2);
          memcpy (full + 2, a.unique->name, n);
          memcpy (full + 2 + n, eq ? eq : "", rest + 1);
          argv[i] = full;
          taken = pu;
        }
      if (!eq && takes_value (taken))
        i++;
    }
}
