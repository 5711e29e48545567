/* cp-batch.c: bfocp's batching glue between GNU cp 9.1 and libbfo.

   Compiled against coreutils' own config.h and copy.h (it takes cp's struct
   cp_options, as the copy code does) and linked into bfocp only.

   Flow.  copy_internal offers each regular file's copy_reg call to
   bfo_cp_defer.  A batchable one becomes a job: its source path goes to the
   reader thread, which feeds libbfo's batch reader (metadata in inode order,
   extents sorted by physical address, merged O_DIRECT reads at depth) and
   queues each file's bytes, in the order they arrive, for the main thread.
   The main thread, whenever cp calls in (the next defer, a directory's end,
   the end of an operand), runs the delivered jobs in the order cp deferred
   them (its walk order, whatever order the reads completed in: file systems
   that place a file near its directory, as XFS does, then allocate a
   directory's files together, as for cp): it makes cp's own copy_reg
   call, and copy_reg takes the bytes from bfo_cp_data when the source it opened
   is still the file that was read (same device, inode, size, mtime, ctime);
   otherwise it reads the file itself.  cp's walk and writes on one core, the
   batched reads on the other.

   Layout.  With --layout other than walk, the main thread holds the jobs of a
   reader window (the reader ends each with a marker) and runs them in the
   layout's order, so that cp's writes, and a destination allocator that
   follows write order (ext4's for small files), put them in that order; a
   window whose held data pass half the in-flight cap is run in parts.

   What is never batched (cp copies it at once, upstream's way): operands,
   backups, -i, SELinux contexts, --sparse=always, --reflink=always, hard links
   cp must preserve, empty files, files that may be sparse, files above the size cap, and
   files that a clone will copy (reflink-capable file system, same device).  */

#include <config.h>

#include "system.h"
#include "backupfile.h"
#include "copy.h"
#include "dirname.h"
#include "error.h"
#include "quote.h"
#include "stat-size.h"
#include "stat-time.h"
#include "xstrtol.h"

#include "bfo-cp.h"
#include "bfo.h"
#include "bfo-util.h"

#include <dirent.h>
#include <getopt.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <time.h>
#include <sys/resource.h>
#include <sys/ioctl.h>
#include <sys/statfs.h>
#include <sys/uio.h>
#include <linux/fs.h>

#ifndef BTRFS_SUPER_MAGIC
# define BTRFS_SUPER_MAGIC 0x9123683E
#endif
#ifndef TMPFS_MAGIC
# define TMPFS_MAGIC 0x01021994
#endif
#ifndef RAMFS_MAGIC
# define RAMFS_MAGIC 0x858458f6
#endif
#ifndef EXT4_SUPER_MAGIC
# define EXT4_SUPER_MAGIC 0xEF53
#endif

/* Files above this are copied by cp itself (its own loop streams them).  */
enum { MAX_BATCH_FILE = 8 << 20 };
/* Below this soft RLIMIT_NOFILE cp copies everything itself: the reader's
   ring and queued files would take descriptors cp needs (with 6, where GNU
   cp -a copies a 60-level tree, bfocp failed with "Too many open files").
   bfotar's create reads nothing ahead below the same limit.  */
enum { MIN_NOFILE = 256 };
enum { DEFAULT_BATCH_FILES = 32768 };
/* With at least BIG_BATCH_MEMORY of physical memory the batches are twice as
   big: an aged tree's files are strewn over all of its blocks, so each batch
   read in physical order is one sweep over them all, and on a disk that
   seeks the sweeps are what the source costs.  131072 aged 4 KiB files, ext4
   source traced (bfo-bench trace), 2 alternating rounds, 2026-11-27: onto
   Btrfs 32768/128M 9.73/9.12 s, source simulated disk 15.95/15.85 s, peak
   RSS 479560 KiB; 65536/256M 9.09/9.20 s, 8.70/8.69 s, 643428 KiB; onto ext4
   5.60/5.69 s, 15.74/15.88 s against 5.57/5.94 s, 8.71/8.72 s.  (One batch
   of all 131072 files, 512M: 5.05 s of disk, 671160 KiB.)  The Linux tree
   (not aged) gains nothing and takes more: 761808-796928 KiB against
   433656-668096 KiB.  Hence only where that is at most a twentieth.  */
enum { BIG_BATCH_FILES = 65536 };
#define BIG_BATCH_BYTES ((uint64_t) 256 << 20)
#define BIG_BATCH_MEMORY ((uint64_t) 16 << 30)
/* Source trees of at most this many entries in at most this many directories,
   all the operands together, are cp's to copy (bfo_tree_small).  */
enum { SMALL_ENTRIES = 32, SMALL_DIRS = 4 };
#define DEFAULT_BATCH_BYTES ((uint64_t) 128 << 20)
/* Files in the reader's first window; the next ones are full (--batch-files).
   A first window small enough to be read at once gives cp data to write while
   the reader works on the next one (5120 4 KiB files, ext4 to ext4: 0.70 s
   against 0.78-1.03 s with one window of them all).  Windows doubling from
   1024 up to 32768, as before, cost an HDD most: each small window of an aged
   set is strewn over the whole set's blocks, so every one is a pass of seeks
   over them.  131072 aged 4 KiB files, ext4 to ext4, simulated disk time of
   the source reads (bfo-bench trace): 45.0 and 45.4 s doubling, 27.6 and
   27.0 s with 1024 then 32768, 28.6 and 28.5 s with 32768 from the start;
   walls 7.83/7.32 s, 7.99/7.23 s, 7.37/7.31 s.  With the metadata read
   ahead, the first window's own files were the rest of the seeks: 1024 files
   over 512 MiB lie farther apart than a disk skips, so nearly each was a seek
   (712 of the source's 722).  Ext4 to Btrfs, the same set: source 18.74 and
   18.88 s with 1024, 16.54 and 16.49 s with 256, 15.87 and 16.02 s with 128;
   walls alike (8.18-8.54 s traced); 5120 files ext4 to ext4 0.35-0.40 s
   either way.  */
enum { FIRST_WINDOW = 128 };
/* Directories whose times wait for deferred copies, before we drain them all.  */
enum { MAX_DIR_TIMES = 65536 };
/* Deferred jobs that wake the reader thread: a wake-up per job cost both
   threads a context switch per file (the reader took one job at a time).
   The reader cannot start a window before it has all of it anyway, and
   whoever waits for the reader (drain, bfo_cp_finish) wakes it first.  */
enum { TODO_WAKE = 64 };

struct job
{
  struct job *next;
  char *src, *dst;              /* one allocation: src, dst, args follow the struct */
  size_t rel_off;               /* dst_relname = dst + rel_off */
  bfo_cp_run_fn run;
  void *args;
  uint64_t seq;                 /* deferral order: jobs run in this order */
  /* Filled by the reader thread.  */
  size_t idx;                   /* in the reader thread's list of added jobs */
  bool pieces, have_data;
  void *data;
  size_t len;
  dev_t dev;
  ino_t ino;
  off_t size;
  struct timespec mtime, ctime;
  bool marker;                  /* not a job: the end of a reader window */
  /* Main thread: where its whole blocks are in the clone stem, or -1.  */
  off_t stem_at;
  uint64_t want;                /* the size bfo_cp_defer saw (g.pending_bytes) */
};

struct dir_times
{
  int dirfd;
  char *relname, *name;
  struct timespec ts[2];
};

static struct
{
  bool enabled, never, progress, stats;
  struct bfo_read_opts ropts;
  uint64_t max_inflight;        /* bytes read but not yet written */
  /* Existing destinations of deferred copies (device, inode), until they
     are all done: a later copy onto one of them waits for them.  */
  struct dst_key { dev_t dev; ino_t ino; } *dsts, cand;
  size_t dsts_size, n_dsts;
  bool have_cand;
  size_t max_pending;           /* jobs deferred but not yet run */

  /* Shared with the reader thread, under LOCK.  */
  pthread_mutex_t lock;
  pthread_cond_t reader_cv, main_cv, space_cv;
  pthread_t thread;
  bool thread_up, quit, flush_req;
  struct job *todo, **todo_tail;
  size_t n_todo;                /* jobs in TODO */
  struct job *done, **done_tail;
  uint64_t inflight;
  struct bfo_read_stats rstats;
  int reader_error;

  /* Main thread only.  */
  size_t pending;
  uint64_t pending_bytes;       /* their sizes */
  /* a file system running full (bfo_cp_space) */
  struct bfo_space space;
  bool space_tight;             /* the entry being made is near a full disk */
  uint64_t space_waits;
  uint64_t next_seq, next_run;  /* seq of the next job deferred, of the next to run */
  struct job **ready;           /* delivered jobs waiting for their turn, by seq % max_pending */
  bool failed;                  /* a deferred copy failed since the last bfo_cp_flush */
  struct job *current;
  struct dir_times *dirs;
  size_t n_dirs, dirs_cap;
  dev_t reflink_dev, dst_dev;   /* caches: last reflink verdict, last destination dir */
  bool reflink_dev_ok, reflink_yes, in_memory, dst_dev_ok;
  bool reflink_probe;           /* the verdict is the kernel's to give (clone_probe) */
  /* Whether files of device XDEV_SRC clone into device XDEV_DST (Btrfs
     subvolumes are devices of their own): the kernel's last verdict.  */
  dev_t xdev_src, xdev_dst;
  bool xdev_ok, xdev_clones;
  char *dst_dir;
  int dst_dirfd;

  /* --layout: the layout, and the delivered jobs held until their window ends.  */
  char const *layout_spec;
  struct bfo_layout_opts layout_opts;
  struct bfo_layout *layout;
  struct job **held;
  size_t n_held, held_cap;
  uint64_t held_bytes, layout_runs;

  /* Counters.  */
  uint64_t deferred, deferred_bytes, used, used_bytes, reread, direct, direct_bytes;
  uint64_t declined_size, declined_sparse, declined_reflink, declined_links, declined_opts,
           declined_memory, declined_unreadable, declined_unwritable, declined_space,
           aliased, stale_dsts;
  bool dangling;                /* bfo_cp_dst_stale found a dangling symlink */
  bool fresh_ok;                /* bfo_cp_fresh: FRESH is the source's stat */
  struct stat fresh;
  uint64_t not_opened;          /* sources bfo_cp_held let cp not open */
  uint64_t racy;                /* the reader thread's: read, but racy (bfo_racy) */
  int wdir_fd;                  /* note_dst_dir's cache: the directory last asked */
  char *wdir;
  size_t wdir_len;
  bool wdir_unwritable;
  int wdir_path_fd;             /* it, opened O_PATH (or -1): for look_up_dst */
  bool small_tried, small;      /* the operands' trees are small: cp copies them */
  bool sized;                   /* size_batches ran */

  /* The metadata walk ahead of cp (warm_main), started at the first deferred
     file of a recursive copy.  */
  int n_ops;
  char *const *ops;             /* the source operands */
  pthread_t warm_thread;
  bool warm_tried, warm_up, warm_quit;  /* warm_quit: atomic */
  uint64_t offered, warmed;     /* atomic: files cp offered; files the walk stat'ed */
  uint64_t warm_dirs_skipped;
  struct bfo_meta_ahead *meta_ahead;    /* the walk's, while it is in an operand */
  uint64_t warm_ahead_requests;         /* its read-ahead requests */

  /* --progress.  */
  struct timespec t0, last_report;
  uint64_t total_files, total_bytes;   /* from the counting walk, when done */
  bool totals_known, tty;
  pthread_t count_thread;
  bool count_up;

  /* --write-behind (cp's thread): bytes (0: none) and flags */
  uint64_t wb_every;
  unsigned int wb_flags;
  bool wb_tried;
  struct bfo_write_behind *wb;
  struct bfo_write_behind_stats wb_stats;

  /* The held data (lib/pool.c): the reader thread allocates, cp's frees.  */
  struct bfo_pool *pool;
  struct bfo_pool_stats pool_stats;

  /* --clone-stem (main thread) */
  enum { STEM_AUTO, STEM_ALWAYS, STEM_NEVER } stem_mode;
  bool reflink_never;           /* --reflink=never: no file shares blocks */
  bool stem_tried;
  struct bfo_clone_stem *stem;
  struct bfo_clone_stem_stats stem_stats;
  struct iovec *stem_iov;
  int64_t *stem_at;
  size_t stem_cap;
  struct job **run;             /* run_jobs: the jobs of a run, in order */
  size_t run_cap;
} g = { .lock = PTHREAD_MUTEX_INITIALIZER, .reader_cv = PTHREAD_COND_INITIALIZER,
        .main_cv = PTHREAD_COND_INITIALIZER, .space_cv = PTHREAD_COND_INITIALIZER,
        .wb_every = BFO_WRITE_BEHIND_DEFAULT, .wb_flags = BFO_WRITE_BEHIND_AUTO,
        .wdir_path_fd = -1 };

static uint64_t
parse_size (int opt, char const *name, char const *arg, uint64_t max)
{
  uintmax_t v;
  char const *suffixes = (opt == BFO_CP_OPT_BATCH_BYTES || opt == BFO_CP_OPT_WRITE_BEHIND
                          ? "bkKMGT" : "");
  enum strtol_error e = xstrtoumax (arg, NULL, 10, &v, suffixes);
  if (e != LONGINT_OK || v == 0 || v > max)
    {
      error (0, 0, _("invalid %s argument %s"), name, quote (arg));
      return 0;
    }
  return v;
}

bool
bfo_cp_option (int opt, char const *arg)
{
  switch (opt)
    {
    case BFO_CP_OPT_BATCH:
      if (STREQ (arg, "auto"))
        g.never = false;
      else if (STREQ (arg, "never"))
        g.never = true;
      else
        {
          error (0, 0, _("invalid argument %s for %s"), quote_n (0, arg), quote_n (1, "--batch"));
          fputs (_("Valid arguments are:\n  - 'auto'\n  - 'never'\n"), stderr);
          return false;
        }
      return true;
    case BFO_CP_OPT_BATCH_FILES:
      return (g.ropts.batch_files = parse_size (opt, "--batch-files", arg, 1u << 20)) != 0;
    case BFO_CP_OPT_BATCH_BYTES:
      return (g.ropts.batch_bytes = parse_size (opt, "--batch-bytes", arg,
                                                (uint64_t) 1 << 36)) != 0;
    case BFO_CP_OPT_IO_DEPTH:
      return (g.ropts.io_depth = parse_size (opt, "--io-depth", arg, 4096)) != 0;
    case BFO_CP_OPT_PROGRESS:
      g.progress = true;
      return true;
    case BFO_CP_OPT_STATS:
      g.stats = true;
      return true;
    case BFO_CP_OPT_LAYOUT:
      if (!(STREQ (arg, "walk") || STREQ (arg, "dir") || STREQ (arg, "refs")
            || (STRNCMP_LIT (arg, "trace=") == 0 && arg[6])))
        {
          error (0, 0, _("invalid argument %s for %s"), quote_n (0, arg),
                 quote_n (1, "--layout"));
          fputs (_("Valid arguments are:\n  - 'walk'\n  - 'dir'\n  - 'refs'\n"
                   "  - 'trace=FILE'\n"), stderr);
          return false;
        }
      g.layout_spec = arg;
      return true;
    case BFO_CP_OPT_TRACE_SUPPORT:
      if (bfo_layout_parse_support (arg, &g.layout_opts.trace_support) < 0)
        {
          error (0, 0, _("invalid %s argument %s"), "--trace-support", quote (arg));
          return false;
        }
      return true;
    case BFO_CP_OPT_TRACE_BATCH_REFS:
      return (g.layout_opts.trace_batch_refs
              = parse_size (opt, "--trace-batch-refs", arg, UINT_MAX)) != 0;
    case BFO_CP_OPT_TRACE_ROOT:
      g.layout_opts.trace_root = arg;
      return true;
    case BFO_CP_OPT_CLONE_STEM:
      if (STREQ (arg, "auto"))
        g.stem_mode = STEM_AUTO;
      else if (STREQ (arg, "always"))
        g.stem_mode = STEM_ALWAYS;
      else if (STREQ (arg, "never"))
        g.stem_mode = STEM_NEVER;
      else
        {
          error (0, 0, _("invalid argument %s for %s"), quote_n (0, arg),
                 quote_n (1, "--clone-stem"));
          fputs (_("Valid arguments are:\n  - 'auto'\n  - 'always'\n  - 'never'\n"), stderr);
          return false;
        }
      return true;
    case BFO_CP_OPT_WRITE_BEHIND:
      if (STREQ (arg, "auto"))
        {
          g.wb_every = BFO_WRITE_BEHIND_DEFAULT;
          g.wb_flags = BFO_WRITE_BEHIND_AUTO;
          return true;
        }
      if (STREQ (arg, "0"))
        g.wb_every = 0;
      else if ((g.wb_every = parse_size (opt, "--write-behind", arg, (uint64_t) 1 << 40)) == 0)
        return false;
      else if (g.wb_every < (1u << 20))
        {
          error (0, 0, _("invalid %s argument %s"), "--write-behind", quote (arg));
          return false;
        }
      g.wb_flags = 0;
      return true;
    }
  return false;
}

static struct
{
  char const *name;
  int opt;
  bool has_arg;
} const bfo_opts[] =
{
  { "batch", BFO_CP_OPT_BATCH, true },
  { "batch-files", BFO_CP_OPT_BATCH_FILES, true },
  { "batch-bytes", BFO_CP_OPT_BATCH_BYTES, true },
  { "io-depth", BFO_CP_OPT_IO_DEPTH, true },
  { "progress", BFO_CP_OPT_PROGRESS, false },
  { "stats", BFO_CP_OPT_STATS, false },
  { "layout", BFO_CP_OPT_LAYOUT, true },
  { "trace-support", BFO_CP_OPT_TRACE_SUPPORT, true },
  { "trace-batch-refs", BFO_CP_OPT_TRACE_BATCH_REFS, true },
  { "trace-root", BFO_CP_OPT_TRACE_ROOT, true },
  { "write-behind", BFO_CP_OPT_WRITE_BEHIND, true },
  { "clone-stem", BFO_CP_OPT_CLONE_STEM, true },
};

/* Does the long option NAME (LEN bytes, maybe abbreviated) of LONGOPTS take
   the next argument as its value?  As getopt_long would resolve it.  */
static bool
long_takes_next (struct option const *longopts, char const *name, size_t len)
{
  struct option const *found = NULL;
  for (struct option const *o = longopts; o->name; o++)
    if (strncmp (o->name, name, len) == 0)
      {
        if (strlen (o->name) == len)
          return o->has_arg == required_argument;
        if (found && (found->has_arg != o->has_arg || found->val != o->val))
          return false;         /* ambiguous: getopt_long reports it */
        found = o;
      }
  return found && found->has_arg == required_argument;
}

bool
bfo_cp_take_options (int *argc, char **argv, char const *shortopts,
                     struct option const *longopts)
{
  bool posixly = getenv ("POSIXLY_CORRECT") != NULL;
  int out = 1;
  int i = 1;
  while (i < *argc)
    {
      char *a = argv[i];
      if (STREQ (a, "--"))
        break;
      if (a[0] != '-' || a[1] == '\0')
        {
          if (posixly)
            break;
          argv[out++] = argv[i++];
          continue;
        }
      if (a[1] == '-')
        {
          char const *eq = strchr (a + 2, '=');
          size_t len = eq ? (size_t) (eq - (a + 2)) : strlen (a + 2);
          size_t k;
          for (k = 0; k < sizeof bfo_opts / sizeof *bfo_opts; k++)
            if (strlen (bfo_opts[k].name) == len
                && strncmp (bfo_opts[k].name, a + 2, len) == 0)
              break;
          if (k < sizeof bfo_opts / sizeof *bfo_opts)
            {
              char const *val = NULL;
              if (bfo_opts[k].has_arg)
                {
                  if (eq)
                    val = eq + 1;
                  else if (i + 1 < *argc)
                    val = argv[++i];
                  else
                    {
                      error (0, 0, _("option '--%s' requires an argument"),
                             bfo_opts[k].name);
                      return false;
                    }
                }
              else if (eq)
                {
                  error (0, 0, _("option '--%s' doesn't allow an argument"),
                         bfo_opts[k].name);
                  return false;
                }
              if (! bfo_cp_option (bfo_opts[k].opt, val))
                return false;
              i++;
              continue;
            }
          argv[out++] = argv[i++];
          if (!eq && long_takes_next (longopts, a + 2, len) && i < *argc)
            argv[out++] = argv[i++];
          continue;
        }
      /* A cluster of short options: the first one taking an argument takes
         the rest of the cluster, or the next word.  */
      argv[out++] = argv[i++];
      for (char const *c = a + 1; *c; c++)
        {
          char const *p = strchr (shortopts, *c);
          if (p && p[1] == ':')
            {
              if (!c[1] && i < *argc)
                argv[out++] = argv[i++];
              break;
            }
        }
    }
  while (i < *argc)
    argv[out++] = argv[i++];
  argv[out] = NULL;
  *argc = out;
  return true;
}

char const *
bfo_cp_usage (void)
{
  return _("\n\
bfo batching (regular files of a recursive copy are read in batches, in\n\
physical order, while earlier ones are written):\n\
      --batch=WHEN             auto (default) or never; BFO_DISABLE=1 in the\n\
                                 environment also turns batching off\n\
      --batch-files=N          files sorted and read together (default 65536\n\
                                 with 16 GiB of memory or more, else 32768)\n\
      --batch-bytes=SIZE       data read per batch (default 256M with 16 GiB\n\
                                 of memory or more, else 128M)\n\
      --io-depth=N             read requests in flight (default 256)\n\
      --progress               show files, bytes, rate and ETA on stderr\n\
      --stats                  print what the batches did on stderr\n\
      --layout=POLICY          the order files are written in, which is where\n\
                                 a file system that allocates in write order\n\
                                 puts them: walk (default: cp's order), dir (each\n\
                                 directory's files together), refs (html with\n\
                                 what it links, C with its headers, Makefile\n\
                                 with its sources), trace=FILE (sets of files\n\
                                 often used together in an access trace)\n\
      --trace-support=PCT      a set is frequent in PCT % of the trace's\n\
                                 transactions (default 5)\n\
      --trace-batch-refs=N     trace references mined together (default 50000)\n\
      --trace-root=DIR         trace paths are relative to DIR (default: a\n\
                                 trace path is the file its longest suffix names)\n\
      --write-behind=SIZE      after every SIZE bytes of batched files copied,\n\
                                 start writing the destination file system's\n\
                                 dirty data back while the copy goes on; auto\n\
                                 (default): every 32M, but not on Btrfs; 0:\n\
                                 leave it to the kernel and the user's sync\n\
      --clone-stem=WHEN        write batched files' whole blocks as one stream\n\
                                 into an unnamed file on the destination and\n\
                                 clone each file's blocks from it: always (any\n\
                                 file system that clones; faster onto Btrfs,\n\
                                 but there files share extents, and deleting\n\
                                 some frees no space until all are gone);\n\
                                 auto (default) and never: no stem; not with\n\
                                 --reflink=never\n\
");
}

/* ------------------------------------------------------------ reader thread */

/* The reader thread's jobs added since its last flush, and which of them came
   back: once handed to the main thread a job may be freed at any moment, so
   these are the only record of it the reader thread may look at.  */
static struct job **added;
static bool *returned;
static size_t n_added, added_cap;

static void
push_done (struct job *j)
{
  returned[j->idx] = true;
  pthread_mutex_lock (&g.lock);
  while (j->have_data && g.done && g.inflight + j->len > g.max_inflight)
    pthread_cond_wait (&g.space_cv, &g.lock);
  g.inflight += j->len;
  j->next = NULL;
  *g.done_tail = j;
  g.done_tail = &j->next;
  pthread_cond_signal (&g.main_cv);
  pthread_mutex_unlock (&g.lock);
}

/* When the reader thread's current window began: before any of its files
   was opened (for bfo_racy: a file changed just before is left to cp, as
   bfotar leaves such files to tar).  */
static struct timespec window_start;

static int
on_read (struct bfo_file const *f, void *arg)
{
  struct job *j = f->user;
  (void) arg;
  if (!f->last)
    {
      j->pieces = true;         /* large now: cp reads it itself */
      return 0;
    }
  /* (Not a file whose reads end elsewhere than its size: cp copies up to
     where its reads end.)  */
  bool whole = (!f->error && !j->pieces && f->offset == 0 && f->st
                && f->st->st_size == (off_t) f->len
                && !(f->flags & (BFO_FILE_SHORT | BFO_FILE_LONG)));
  if (whole && bfo_racy (f->st, window_start))
    g.racy++;
  else if (whole)
    {
      /* Block-aligned from a block on, so that the clone stem writes it
         with O_DIRECT (bfo_clone_stem_stage), not through the page cache.  */
      j->data = bfo_pool_alloc (g.pool, f->len);
      if (j->data)
        {
          memcpy (j->data, f->data, f->len);
          j->len = f->len;
          j->have_data = true;
          j->dev = f->st->st_dev;
          j->ino = f->st->st_ino;
          j->size = f->st->st_size;
          j->mtime = get_stat_mtime (f->st);
          j->ctime = get_stat_ctime (f->st);
        }
    }
  push_done (j);
  return 0;
}

/* Read everything added; hand back, without data, what the reader did not.  */
static void
reader_flush (struct bfo_reader *r)
{
  int ret = bfo_reader_flush (r);
  if (ret < 0)
    g.reader_error = -ret;
  for (size_t i = 0; i < n_added; i++)
    if (!returned[i])
      push_done (added[i]);
  n_added = 0;
  if (g.layout)
    {
      /* The window is complete: the main thread may place it.  */
      struct job *m = xzalloc (sizeof *m);
      m->marker = true;
      pthread_mutex_lock (&g.lock);
      *g.done_tail = m;
      g.done_tail = &m->next;
      pthread_cond_signal (&g.main_cv);
      pthread_mutex_unlock (&g.lock);
    }
}

static void *
reader_main (void *arg)
{
  struct bfo_reader *r = arg;
  /* The first window is small, so that cp has data to write at once; the
     rest are full, which sorts and merges best.  */
  size_t window = FIRST_WINDOW < g.ropts.window_files ? FIRST_WINDOW : g.ropts.window_files;

  pthread_mutex_lock (&g.lock);
  for (;;)
    {
      if (g.todo)
        {
          struct job *list = g.todo;
          g.todo = NULL;
          g.todo_tail = &g.todo;
          g.n_todo = 0;
          pthread_mutex_unlock (&g.lock);
          for (struct job *j = list, *next; j; j = next)
            {
              next = j->next;   /* J may be run and freed once added */
              if (n_added == added_cap)
                {
                  added = x2nrealloc (added, &added_cap, sizeof *added);
                  returned = xrealloc (returned, added_cap * sizeof *returned);
                }
              if (n_added == 0)
                clock_gettime (CLOCK_REALTIME, &window_start);
              j->idx = n_added;
              added[n_added] = j;
              returned[n_added++] = false;
              bfo_reader_add (r, j->src, j);
              if (n_added >= window)
                {
                  reader_flush (r);
                  window = g.ropts.window_files;
                }
            }
          pthread_mutex_lock (&g.lock);
          continue;
        }
      if (g.flush_req || g.quit)
        {
          g.flush_req = false;
          bool quit = g.quit;
          pthread_mutex_unlock (&g.lock);
          if (n_added)
            reader_flush (r);
          pthread_mutex_lock (&g.lock);
          if (quit && !g.todo)
            break;
          continue;
        }
      pthread_cond_wait (&g.reader_cv, &g.lock);
    }
  bfo_reader_get_stats (r, &g.rstats);
  pthread_mutex_unlock (&g.lock);
  bfo_reader_close (r);
  return NULL;
}

/* ------------------------------------------------------------ progress */

static double
secs_since (struct timespec const *t)
{
  struct timespec now;
  clock_gettime (CLOCK_MONOTONIC, &now);
  return (now.tv_sec - t->tv_sec) + (now.tv_nsec - t->tv_nsec) / 1e9;
}

static void
count_tree (int at, char const *name)
{
  struct stat st;
  if (fstatat (at, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
    return;
  if (!S_ISDIR (st.st_mode))
    {
      if (S_ISREG (st.st_mode))
        {
          g.total_files++;
          g.total_bytes += st.st_size;
        }
      return;
    }
  int fd = openat (at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0)
    return;
  DIR *d = fdopendir (fd);
  if (!d)
    {
      close (fd);
      return;
    }
  struct dirent *e;
  while ((e = readdir (d)))
    if (!bfo_dot_or_dotdot (e->d_name))
      count_tree (dirfd (d), e->d_name);
  closedir (d);
}

struct count_arg
{
  int n;
  char *const *files;
};

static void *
count_main (void *arg)
{
  struct count_arg *c = arg;
  for (int i = 0; i < c->n; i++)
    count_tree (AT_FDCWD, c->files[i]);
  free (c);
  __atomic_store_n (&g.totals_known, true, __ATOMIC_RELEASE);
  return NULL;
}

static void
human (char *buf, size_t size, double v, char const *unit)
{
  static char const p[] = " KMGTP";
  int i = 0;
  while (v >= 1024 && p[i + 1])
    {
      v /= 1024;
      i++;
    }
  if (i == 0)
    snprintf (buf, size, "%.0f %s", v, unit);
  else
    snprintf (buf, size, "%.1f %ci%s", v, p[i], unit);
}

static void
report (bool final)
{
  if (!g.progress)
    return;
  if (!final && secs_since (&g.last_report) < 1.0)
    return;
  clock_gettime (CLOCK_MONOTONIC, &g.last_report);
  double t = secs_since (&g.t0);
  uint64_t files = g.used + g.reread + g.direct;
  uint64_t bytes = g.used_bytes + g.direct_bytes;
  char b[32], rate[32], eta[64] = "";
  human (b, sizeof b, bytes, "B");
  human (rate, sizeof rate, t > 0 ? bytes / t : 0, "B/s");
  if (__atomic_load_n (&g.totals_known, __ATOMIC_ACQUIRE) && !final)
    {
      double left = g.total_bytes > bytes ? g.total_bytes - bytes : 0;
      double r = t > 0 ? bytes / t : 0;
      if (r > 0)
        {
          long s = left / r + 0.5;
          snprintf (eta, sizeof eta, ", ETA %ld:%02ld:%02ld (of %" PRIu64 " files)",
                    s / 3600, s / 60 % 60, s % 60, g.total_files);
        }
    }
  fprintf (stderr, "%s%s: %" PRIu64 " files, %s, %s%s%s%s", g.tty ? "\r" : "",
           program_name, files, b, rate, eta, final ? _(", done") : "",
           g.tty ? (final ? "\033[K\n" : "\033[K") : "\n");
  fflush (stderr);
}

/* ------------------------------------------------------ metadata ahead of cp */

/* cp's walk stats every entry it meets, and on a cold cache that first stat
   waits for the directory block and the inode-table block, on cp's thread.
   A second thread walks the source operands the way cp does (each directory's
   entries in inode order, as savedir's SAVEDIR_SORT_FASTREAD gives them to
   copy_dir, depth first) and stats each entry first, at most WARM_AHEAD regular
   files ahead of what cp has offered, so cp finds them in the caches.  It
   changes nothing: directories are opened with O_NOATIME (one that may not be
   is not read, so that no access time cp would preserve changes), files are
   only stat'ed, and nothing below another file system is visited.  Measured
   onto Btrfs (4 KiB set): cp's thread spent 27 % of its time in fstatat; with
   the source's metadata in the cache bfocp -r took 11.1 s instead of 12.9 s.
   As root on ext4 the walk also asks, per directory, for its entries'
   inode-table blocks and its subdirectories' blocks at once, in physical order
   (bfo_meta_ahead; BFO_CP_META_AHEAD=0 turns it off): its one-by-one reads
   otherwise make a disk seek back and forth between them and the batch
   reads.  */
enum { WARM_AHEAD = 16384, WARM_MAX_DEPTH = 64 };

static int
warm_by_ino (void const *a, void const *b)
{
  struct bfo_meta_entry const *x = a, *y = b;
  return x->ino < y->ino ? -1 : x->ino > y->ino;
}

static bool
warm_quit (void)
{
  return __atomic_load_n (&g.warm_quit, __ATOMIC_ACQUIRE);
}

static void
warm_dir (int fd, dev_t dev, int depth)
{
  DIR *d = fdopendir (fd);
  if (!d)
    {
      close (fd);
      return;
    }
  struct bfo_meta_entry *es = NULL;
  size_t n = 0, cap = 0;
  struct dirent *e;
  while ((e = readdir (d)) && !warm_quit ())
    {
      if (bfo_dot_or_dotdot (e->d_name))
        continue;
      if (n == cap)
        {
          cap = cap ? 2 * cap : 64;
          struct bfo_meta_entry *x = realloc (es, cap * sizeof *x);
          if (!x)
            break;
          es = x;
        }
      if (!(es[n].name = strdup (e->d_name)))
        break;
      es[n].type = e->d_type;
      es[n++].ino = e->d_ino;
    }
  qsort (es, n, sizeof *es, warm_by_ino);
  /* Root on ext4: the inode-table blocks of these entries and the blocks of
     the subdirectories, asked for at once in physical order, before the walk
     stats them and descends one by one (lib/prefetch.c).  */
  g.warm_ahead_requests += bfo_meta_ahead_dir (g.meta_ahead, dirfd (d), es, n);
  for (size_t i = 0; i < n && !warm_quit (); i++)
    {
      while (__atomic_load_n (&g.warmed, __ATOMIC_RELAXED)
             > __atomic_load_n (&g.offered, __ATOMIC_RELAXED) + WARM_AHEAD
             && !warm_quit ())
        {
          struct timespec ms = { 0, 1000000 };
          nanosleep (&ms, NULL);
        }
      struct stat st;
      if (fstatat (dirfd (d), es[i].name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        continue;
      if (S_ISREG (st.st_mode))
        __atomic_add_fetch (&g.warmed, 1, __ATOMIC_RELAXED);
      else if (S_ISDIR (st.st_mode) && st.st_dev == dev && depth < WARM_MAX_DEPTH)
        {
          int sub = openat (dirfd (d), es[i].name,
                            O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NOATIME | O_CLOEXEC);
          if (sub >= 0)
            warm_dir (sub, dev, depth + 1);
          else
            g.warm_dirs_skipped++;
        }
    }
  for (size_t i = 0; i < n; i++)
    free (es[i].name);
  free (es);
  closedir (d);
}

static void *
warm_main (void *arg)
{
  (void) arg;
  for (int i = 0; i < g.n_ops && !warm_quit (); i++)
    {
      int fd = open (g.ops[i], O_RDONLY | O_DIRECTORY | O_NOATIME | O_CLOEXEC);
      struct stat st;
      if (fd < 0)
        continue;
      if (fstat (fd, &st) != 0)
        {
          close (fd);
          continue;
        }
      bfo_meta_ahead_close (g.meta_ahead);
      g.meta_ahead = NULL;
      char const *e = getenv ("BFO_CP_META_AHEAD");
      if (!(e && STREQ (e, "0")))
        bfo_meta_ahead_open (AT_FDCWD, g.ops[i], &g.meta_ahead);
      warm_dir (fd, st.st_dev, 0);
    }
  bfo_meta_ahead_close (g.meta_ahead);
  g.meta_ahead = NULL;
  return NULL;
}

/* At the first file cp offers in a recursive copy.  */
static void
warm_start (struct cp_options const *x)
{
  g.warm_tried = true;
  char const *e = getenv ("BFO_CP_WARM");
  if (!x->recursive || g.n_ops <= 0 || (e && STREQ (e, "0")))
    return;
  /* It holds a directory descriptor per level (up to WARM_MAX_DEPTH): not
     with few descriptors, which cp needs for its own deep walk (batching,
     and so this walk, is off below MIN_NOFILE: bfo_cp_start).  */
  /* (it takes no signals: bfo_thread_create) */
  g.warm_up = bfo_thread_create (&g.warm_thread, "bfo-walk", warm_main, NULL) == 0;
}

static void
warm_stop (void)
{
  if (!g.warm_up)
    return;
  __atomic_store_n (&g.warm_quit, true, __ATOMIC_RELEASE);
  pthread_join (g.warm_thread, NULL);
  g.warm_up = false;
}

/* ------------------------------------------------------------ main thread */

void
bfo_cp_start (int n_files, char *const *files, bool target_given)
{
  /* Without -t the last operand is the destination.  */
  g.ops = files;
  g.n_ops = target_given ? n_files : n_files - 1;
  char const *d = getenv ("BFO_DISABLE");
  g.enabled = !g.never && !(d && *d && !STREQ (d, "0"));
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < MIN_NOFILE)
    g.enabled = false;
  if (bfo_memory_scarce ())
    g.enabled = false;          /* (ulimit -v or -d too small for the batches) */
  if (getenv ("BFO_STATS") && *getenv ("BFO_STATS") && !STREQ (getenv ("BFO_STATS"), "0"))
    g.stats = true;
  clock_gettime (CLOCK_MONOTONIC, &g.t0);
  g.last_report = g.t0;
  g.tty = isatty (STDERR_FILENO);
  if (g.progress)
    {
      struct count_arg *c = malloc (sizeof *c);
      if (c)
        {
          c->n = g.n_ops;     /* not the destination */
          c->files = files;
          g.count_up = bfo_thread_create (&g.count_thread, "bfo-count", count_main, c) == 0;
          if (!g.count_up)
            free (c);
        }
    }
  if (!g.enabled)
    return;

  if (g.layout_spec && !STREQ (g.layout_spec, "walk"))
    {
      int r = bfo_layout_new (&g.layout, g.layout_spec, &g.layout_opts);
      if (r < 0 && STRNCMP_LIT (g.layout_spec, "trace=") == 0)
        error (EXIT_FAILURE, -r, _("cannot read the trace %s"), quoteaf (g.layout_spec + 6));
      if (r < 0)
        xalloc_die ();
    }
  g.todo_tail = &g.todo;
  g.done_tail = &g.done;
}

/* Open the batch reader and start its thread, at the first file to batch:
   `cp a b', the common case in scripts and builds, then costs no io_uring
   and no thread (bfocp took 1.73 ms against cp's 1.32 ms for one file).  */
static bool
reader_start (void)
{
  struct bfo_reader *r;
  /* Empty slabs kept: a window's worth, as cp frees a window's data about
     when the reader has the next one (its files come in physical order).  */
  if (!g.pool && bfo_pool_new (&g.pool, g.ropts.batch_bytes) < 0)
    xalloc_die ();
  if (bfo_reader_open (&r, &g.ropts, on_read, NULL) < 0)
    {
      g.enabled = false;
      return false;
    }
  if (bfo_thread_create (&g.thread, "bfo-read", reader_main, r) != 0)
    {
      bfo_reader_close (r);
      g.enabled = false;
      return false;
    }
  g.thread_up = true;
  return true;
}

/* ------------------------------------------------------------ clone stem */

/* Files per run of the clone stem: the stem's own thread writes the next run
   while cp's thread clones and finishes this one's files.  */
enum { STEM_RUN = 256 };

/* Whether the data of JOBS[0..N) go through the clone stem (libbfo's
   bfo_clone_stem: only with --clone-stem=always; auto makes none, see
   lib/clonestem.c), opened at the first job with data in the directory of
   its destination.  */
static bool
stem_open (struct job **jobs, size_t n)
{
  if (!g.stem_tried)
    for (size_t i = 0; i < n && !g.stem_tried; i++)
      if (jobs[i]->have_data)
        {
          g.stem_tried = true;
          /* Files cloned from one stem share its extents (on Btrfs one
             extent holds the blocks of many files): not a copy
             --reflink=never asks for.  */
          if (g.stem_mode != STEM_ALWAYS || g.reflink_never)
            break;
          char const *dst = jobs[i]->dst, *slash = strrchr (dst, '/');
          char *dir = slash ? ximemdup0 (dst, slash == dst ? 1 : slash - dst) : xstrdup (".");
          bfo_clone_stem_new (&g.stem, dir, 0);
          free (dir);
        }
  return g.stem;
}

/* Stage the data of JOBS[0..N), in that order, in the clone stem, on the
   stem's thread: stem_staged gives them their places.  */
static void
stem_stage (struct job **jobs, size_t n)
{
  if (g.stem_cap < n)
    {
      free (g.stem_iov);
      free (g.stem_at);
      g.stem_cap = MAX (n, 2 * g.stem_cap);
      g.stem_iov = xnmalloc (g.stem_cap, sizeof *g.stem_iov);
      g.stem_at = xnmalloc (g.stem_cap, sizeof *g.stem_at);
    }
  for (size_t i = 0; i < n; i++)
    {
      jobs[i]->stem_at = -1;
      g.stem_iov[i] = (struct iovec) { jobs[i]->have_data ? jobs[i]->data : NULL,
                                       jobs[i]->have_data ? jobs[i]->len : 0 };
    }
  bfo_clone_stem_stage_async (g.stem, g.stem_iov, n, g.stem_at);
}

/* The places of the N jobs of the run staged last.  */
static void
stem_staged (struct job **jobs, size_t n)
{
  bfo_clone_stem_wait (g.stem);
  for (size_t i = 0; i < n; i++)
    jobs[i]->stem_at = g.stem_at[i];
}

static void
run_job (struct job *j)
{
  g.current = j;
  bool ok = j->run (j->src, j->dst, j->dst + j->rel_off, j->args);
  g.current = NULL;
  if (!ok)
    g.failed = true;
  if (j->have_data)
    {
      pthread_mutex_lock (&g.lock);
      g.inflight -= j->len;
      pthread_cond_signal (&g.space_cv);
      pthread_mutex_unlock (&g.lock);
      bfo_pool_free (g.pool, j->data, j->len);
    }
  g.pending_bytes -= j->want;
  free (j);
  g.pending--;
  report (false);
}

/* Room for N jobs in g.run.  */
static void
run_room (size_t n)
{
  if (g.run_cap < n)
    {
      free (g.run);
      g.run = xnmalloc (g.run_cap = MAX (n, 2 * g.run_cap), sizeof *g.run);
    }
}

/* Run the N jobs of g.run in that order; with a clone stem, their data are
   staged in it a run ahead.  */
static void
run_jobs (size_t n)
{
  if (!stem_open (g.run, n))
    {
      for (size_t i = 0; i < n; i++)
        {
          g.run[i]->stem_at = -1;
          run_job (g.run[i]);
        }
      return;
    }
  size_t len = MIN (n, STEM_RUN);
  stem_stage (g.run, len);
  stem_staged (g.run, len);
  for (size_t i = 0; i < n;)
    {
      size_t next = i + len, next_len = MIN (n - next, STEM_RUN);
      if (next_len)
        stem_stage (g.run + next, next_len);
      for (size_t k = i; k < next; k++)
        run_job (g.run[k]);
      if (next_len)
        stem_staged (g.run + next, next_len);
      i = next;
      len = next_len;
    }
}

static int
by_seq (void const *a, void const *b)
{
  struct job const *x = *(struct job *const *) a, *y = *(struct job *const *) b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Run the held jobs in the layout's order (as delivered if it cannot be made).  */
static void
run_held (void)
{
  size_t n = g.n_held;
  if (!n)
    return;
  /* The window in cp's order first: the layout keeps it where it has no
     reason to move a file.  */
  qsort (g.held, n, sizeof *g.held, by_seq);
  struct bfo_layout_file *f = malloc (n * sizeof *f);
  size_t *order = malloc (n * sizeof *order);
  bool laid = f && order;
  for (size_t i = 0; laid && i < n; i++)
    {
      struct job *j = g.held[i];
      f[i] = (struct bfo_layout_file) { j->dst + strspn (j->dst, "/"),
                                        j->have_data ? j->data : NULL,
                                        j->have_data ? j->len : 0 };
    }
  laid = laid && bfo_layout_order (g.layout, f, n, order, NULL, NULL) == 0;
  free (f);
  g.n_held = 0;
  g.held_bytes = 0;
  g.layout_runs++;
  run_room (n);
  for (size_t i = 0; i < n; i++)
    g.run[i] = g.held[laid ? order[i] : i];
  free (order);
  run_jobs (n);
}

/* A delivered job with a layout: held until its window's marker, or until the
   held data pass half the in-flight cap (the reader may then go on).  */
static void
hold_job (struct job *j)
{
  if (j->marker)
    {
      free (j);
      run_held ();
      return;
    }
  if (g.n_held == g.held_cap)
    g.held = x2nrealloc (g.held, &g.held_cap, sizeof *g.held);
  g.held[g.n_held++] = j;
  g.held_bytes += j->have_data ? j->len : 0;
  if (g.held_bytes >= g.max_inflight / 2)
    run_held ();
}

/* Run the delivered jobs whose turn it is, in deferral order.  */
static void
run_ready (void)
{
  size_t n = 0;
  while (n < g.max_pending && g.ready[(g.next_run + n) % g.max_pending])
    n++;
  if (!n)
    return;
  run_room (n);
  for (size_t i = 0; i < n; i++)
    {
      struct job **slot = &g.ready[g.next_run++ % g.max_pending];
      g.run[i] = *slot;
      *slot = NULL;
    }
  run_jobs (n);
}

/* Run delivered jobs, in deferral order or, with a layout, in the layout's
   order per window; then, while more than LIMIT are pending, wait for more.  */
static void
drain (size_t limit)
{
  pthread_mutex_lock (&g.lock);
  for (;;)
    {
      if (g.done)
        {
          struct job *list = g.done;
          g.done = NULL;
          g.done_tail = &g.done;
          /* The reader thread waits for space only while delivered jobs
             wait to be taken (push_done): taken, they no longer hold it
             back.  Without this wake-up it waited on for good when the job
             cp runs next was still unread behind it (files read in
             physical order, run in cp's).  */
          pthread_cond_signal (&g.space_cv);
          pthread_mutex_unlock (&g.lock);
          /* At most max_pending jobs are pending, so their seqs take
             distinct slots.  */
          for (struct job *j = list, *next; j; j = next)
            {
              next = j->next;
              if (g.layout)
                hold_job (j);
              else
                g.ready[j->seq % g.max_pending] = j;
            }
          if (!g.layout)
            run_ready ();
          pthread_mutex_lock (&g.lock);
          continue;
        }
      if (g.pending <= limit)
        break;
      g.flush_req = true;
      pthread_cond_signal (&g.reader_cv);
      pthread_cond_wait (&g.main_cv, &g.lock);
    }
  pthread_mutex_unlock (&g.lock);
}

static void
apply_dir_times (void)
{
  for (size_t i = 0; i < g.n_dirs; i++)
    {
      struct dir_times *d = &g.dirs[i];
      if (utimensat (d->dirfd, d->relname, d->ts, 0) != 0)
        {
          error (0, errno, _("preserving times for %s"), quoteaf (d->name));
          g.failed = true;
        }
      free (d->relname);
      free (d->name);
    }
  g.n_dirs = 0;
}

/* Finish every deferred copy, then the directory times that waited for them.  */
static void
settle (void)
{
  if (g.pending)
    drain (0);
  if (g.n_dsts)
    {
      memset (g.dsts, 0, g.dsts_size * sizeof *g.dsts);
      g.n_dsts = 0;
    }
  /* (note_dst_dir puts a directory in the table again)  */
  free (g.wdir);
  g.wdir = NULL;
  apply_dir_times ();
}

bool
bfo_cp_flush (void)
{
  settle ();
  bool ok = !g.failed;
  g.failed = false;
  return ok;
}

bool
bfo_cp_dir_settle (bool restrictive)
{
  /* Its mode is about to change: ask note_dst_dir's question again.  */
  free (g.wdir);
  g.wdir = NULL;
  if (!restrictive || !g.pending)
    return true;
  settle ();
  return !g.failed;
}

static void dst_add (struct dst_key k);

bool
bfo_cp_dir_times (int dirfd, char const *relname, char const *name,
                  struct timespec const ts[2])
{
  if (!g.pending)
    return false;
  if (g.n_dirs == MAX_DIR_TIMES)
    settle ();
  /* Known by its inode too: cp may reach it again through a symbolic link
     in the destination, and -u would then compare its final times.  */
  struct stat st;
  if (fstatat (dirfd, relname, &st, AT_SYMLINK_NOFOLLOW) == 0)
    dst_add ((struct dst_key) { st.st_dev, st.st_ino });
  if (g.n_dirs == g.dirs_cap)
    g.dirs = x2nrealloc (g.dirs, &g.dirs_cap, sizeof *g.dirs);
  struct dir_times *d = &g.dirs[g.n_dirs++];
  d->dirfd = dirfd;
  d->relname = xstrdup (relname);
  d->name = xstrdup (name);
  d->ts[0] = ts[0];
  d->ts[1] = ts[1];
  return true;
}

struct cp_options const *
bfo_cp_keep_options (struct cp_options const *x)
{
  /* Only a few distinct ones exist (cp's, copy_dir's for entries), and each is
     kept for good: jobs may point to any of them.  */
  static struct cp_options **kept;
  static size_t n_kept, kept_cap;
  for (size_t i = 0; i < n_kept; i++)
    if (memcmp (kept[i], x, sizeof *x) == 0)
      return kept[i];
  if (n_kept == kept_cap)
    kept = x2nrealloc (kept, &kept_cap, sizeof *kept);
  return kept[n_kept++] = xmemdup (x, sizeof *x);
}

/* What the source file system of SRC_NAME (on SRC_SB's device) is: sets
   g.reflink_yes (Btrfs: clones work), g.reflink_probe (they may: see
   clone_probe) and g.in_memory (tmpfs, ramfs: nothing to gain from
   batched reads).  Cached per device.  */
static void
src_fs_kind (char const *src_name, struct stat const *src_sb)
{
  if (g.reflink_dev_ok && g.reflink_dev == src_sb->st_dev)
    return;
  struct statfs fs;
  bool ok = statfs (src_name, &fs) == 0;
  g.reflink_dev = src_sb->st_dev;
  g.reflink_dev_ok = true;
  g.reflink_yes = !ok || fs.f_type == BTRFS_SUPER_MAGIC;
  g.in_memory = ok && (fs.f_type == TMPFS_MAGIC || fs.f_type == RAMFS_MAGIC);
  /* Other types may clone or not: XFS made without reflink (RHEL 7's, or
     mkfs.xfs -m reflink=0) does not, an overlay clones where its layers'
     file system does (Docker's overlay2 on XFS), NFS 4.2, ZFS, bcachefs,
     OCFS2 and CIFS may.  Ask the kernel (clone_probe).  */
  g.reflink_probe = ok && !g.reflink_yes && !g.in_memory && fs.f_type != EXT4_SUPER_MAGIC;
}

/* Whether the kernel clones SRC_NAME's file into a new file of the
   directory DIR (below DST_DIRFD; "" for DST_DIRFD itself): 1 yes, 0 no, -1
   if it could not be asked (a file or directory that would not open).
   Before, bfocp -r inside an overlay on XFS wrote a copy of each file where
   GNU cp's clone (cp's --reflink=auto) shared its blocks: 3000 files of
   64 KiB took 189 MiB where GNU cp took 1.6 MiB.  The new file has no
   name (O_TMPFILE), or, where the file system makes none (overlays before
   Linux 6.6), loses its name right after its creation.  */
static int
clone_probe (char const *src_name, int dst_dirfd, char const *dir)
{
  int sfd = open (src_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (sfd < 0)
    return -1;
  int dfd = openat (dst_dirfd, *dir ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  int tfd = dfd < 0 ? -1 : openat (dfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
  for (unsigned k = 0; tfd < 0 && dfd >= 0 && errno != EACCES && errno != EROFS && k < 16; k++)
    {
      char name[64];
      snprintf (name, sizeof name, ".bfocp-clone-probe.%ld.%u", (long) getpid (), k);
      tfd = openat (dfd, name, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0600);
      if (tfd >= 0)
        unlinkat (dfd, name, 0);
      else if (errno != EEXIST)
        break;
    }
  int verdict = tfd < 0 ? -1 : ioctl (tfd, FICLONE, sfd) == 0;
  if (0 <= tfd)
    close (tfd);
  if (0 <= dfd)
    close (dfd);
  close (sfd);
  return verdict;
}

/* Would copy_reg's clone_file take this file SRC_NAME: reflink-capable
   source file system, destination directory on the same device?  */
static bool
will_clone (struct cp_options const *x, char const *src_name, struct stat const *src_sb,
            int dst_dirfd, char const *dst_relname)
{
  if (x->reflink_mode == REFLINK_NEVER || (!g.reflink_yes && !g.reflink_probe))
    return false;
  char const *slash = strrchr (dst_relname, '/');
  size_t dlen = slash ? (size_t) (slash - dst_relname) : 0;
  if (!g.dst_dir || g.dst_dirfd != dst_dirfd || strlen (g.dst_dir) != dlen
      || memcmp (g.dst_dir, dst_relname, dlen) != 0)
    {
      struct stat st;
      free (g.dst_dir);
      g.dst_dir = ximemdup0 (dst_relname, dlen);
      g.dst_dirfd = dst_dirfd;
      g.dst_dev_ok = fstatat (dst_dirfd, dlen ? g.dst_dir : ".", &st, 0) == 0;
      g.dst_dev = st.st_dev;
    }
  /* Unknown counts as the same device: then cp decides, as upstream.  Another
     device may be the same file system: each Btrfs subvolume has a device
     number of its own, and cp's clone works between them (before, bfocp -r
     wrote copies there where GNU cp's shared the source's extents).  Asked
     of the kernel once per pair of devices.  */
  if (g.dst_dev_ok && g.dst_dev != src_sb->st_dev)
    {
      if (!g.xdev_ok || g.xdev_src != src_sb->st_dev || g.xdev_dst != g.dst_dev)
        {
          int verdict = clone_probe (src_name, dst_dirfd, g.dst_dir);
          if (verdict < 0)
            return true;        /* cp's to copy; ask again at the next file */
          g.xdev_src = src_sb->st_dev;
          g.xdev_dst = g.dst_dev;
          g.xdev_ok = true;
          g.xdev_clones = verdict;
        }
      return g.xdev_clones;
    }
  if (g.reflink_probe)
    {
      int verdict = clone_probe (src_name, dst_dirfd, g.dst_dir);
      if (verdict < 0)
        return true;            /* cp's to copy; ask again at the next file */
      g.reflink_probe = false;
      g.reflink_yes = verdict;
      return verdict;
    }
  return true;
}

/* A slot of the table of existing destinations holds a key ({0, 0}: none).  */
static bool
dst_used (struct dst_key const *s)
{
  return s->ino || s->dev;
}

/* The slot of K in the table of existing destinations (empty if absent).  */
static struct dst_key *
dst_slot (struct dst_key k)
{
  size_t i = ((size_t) k.ino * 0x9E3779B97F4A7C15ull ^ (size_t) k.dev) & (g.dsts_size - 1);
  while (dst_used (&g.dsts[i]) && !(g.dsts[i].ino == k.ino && g.dsts[i].dev == k.dev))
    i = (i + 1) & (g.dsts_size - 1);
  return &g.dsts[i];
}

static void
dst_add (struct dst_key k)
{
  if (2 * (g.n_dsts + 1) > g.dsts_size)
    {
      struct dst_key *old = g.dsts;
      size_t old_size = g.dsts_size;
      g.dsts_size = old_size ? 2 * old_size : 1024;
      g.dsts = xcalloc (g.dsts_size, sizeof *g.dsts);
      for (size_t i = 0; i < old_size; i++)
        if (dst_used (&old[i]))
          *dst_slot (old[i]) = old[i];
      free (old);
    }
  struct dst_key *s = dst_slot (k);
  if (!dst_used (s))
    {
      *s = k;
      g.n_dsts++;
    }
}

bool
bfo_cp_existing_dst (int dst_dirfd, char const *dst_relname,
                     struct stat const *dst_sb)
{
  g.have_cand = false;
  if (!g.enabled)
    return false;
  struct dst_key k = { dst_sb->st_dev, dst_sb->st_ino };
  /* Another name of it (a hard link) may be copied onto too, or it may be
     the destination of a copy still deferred (reached through a symbolic
     link): the copies run in cp's order, this one now.  So does one cp
     cannot open for writing: its "removed" line (-fv) or its message comes
     in cp's order.  And one reached through a symbolic link: where the link
     leads may change before a deferred copy would open it (the copy itself
     may replace a link of the chain).  */
  struct stat lst;
  if (1 < dst_sb->st_nlink || (g.n_dsts && dst_used (dst_slot (k)))
      || (S_ISREG (dst_sb->st_mode)
          && faccessat (dst_dirfd, dst_relname, W_OK, AT_EACCESS) != 0)
      || (fstatat (dst_dirfd, dst_relname, &lst, AT_SYMLINK_NOFOLLOW) == 0
          && S_ISLNK (lst.st_mode)))
    {
      g.aliased++;
      settle ();
      return true;
    }
  g.cand = k;
  g.have_cand = true;
  return false;
}

bool
bfo_cp_dst_stale (int dst_dirfd, char const *dst_relname,
                  struct stat const *dst_sb)
{
  if (dst_sb)
    {
      struct dst_key k = { dst_sb->st_dev, dst_sb->st_ino };
      if (!g.pending || !g.n_dsts || !dst_used (dst_slot (k)))
        return false;
    }
  else
    {
      /* Only a symbolic link makes a name stat does not find.  Dangling
         still once the deferred copies are done, cp will refuse to write
         through it: that copy is cp's to make at once, so that its message
         comes in cp's order.  */
      struct stat st;
      if (!g.enabled
          || fstatat (dst_dirfd, dst_relname, &st, AT_SYMLINK_NOFOLLOW) != 0
          || !S_ISLNK (st.st_mode))
        return false;
      g.dangling = true;
      if (!g.pending)
        return false;
    }
  g.stale_dsts++;
  settle ();
  return true;
}

void
bfo_cp_link_target (int dirfd, char const *relname, bool follow)
{
  struct stat st;
  if (g.pending
      && fstatat (dirfd, relname, &st, follow ? 0 : AT_SYMLINK_NOFOLLOW) != 0)
    {
      g.stale_dsts++;
      settle ();
    }
}

/* The directory of DST_DIRFD+DST_RELNAME, where a copy is to be deferred:
   put in the table of destinations, since cp may come to it again as a
   source (cp -rL, through a source symbolic link into the destination) and
   must then find in it the files the deferred copies make.  Returns whether
   a new file cannot be made there: the directory refuses us write or search
   (permissions, a read-only file system), so that cp's open will fail with
   a message, which must come in cp's order.  Done once per directory while
   cp copies its entries (and again after a settle).  */
static bool
note_dst_dir (int dst_dirfd, char const *dst_relname)
{
  char const *slash = strrchr (dst_relname, '/');
  size_t len = slash ? (size_t) (slash - dst_relname) : 0;
  if (!(g.wdir && g.wdir_fd == dst_dirfd && g.wdir_len == len
        && memcmp (g.wdir, dst_relname, len) == 0))
    {
      struct stat st;
      free (g.wdir);
      g.wdir = ximemdup0 (dst_relname, len);
      g.wdir_fd = dst_dirfd;
      g.wdir_len = len;
      g.wdir_unwritable = faccessat (dst_dirfd, len ? g.wdir : ".", W_OK | X_OK,
                                     AT_EACCESS) != 0;
      if (0 <= g.wdir_path_fd)
        close (g.wdir_path_fd);
      g.wdir_path_fd = openat (dst_dirfd, len ? g.wdir : ".",
                               O_PATH | O_DIRECTORY | O_CLOEXEC);
      if (fstatat (dst_dirfd, len ? g.wdir : ".", &st, 0) == 0)
        dst_add ((struct dst_key) { st.st_dev, st.st_ino });
    }
  return g.wdir_unwritable;
}

/* Look DST_RELNAME up in its directory (note_dst_dir's), now: a name not
   there yet is then a negative entry in the dentry cache when the deferred
   copy creates it, and its open does not scan the directory for it.  cp
   makes a directory and defers its files' copies before it copies any of
   them, so that this lookup meets a directory still (nearly) empty, where
   the one made by the create met all the entries made before it: on ext4,
   ext4_lookup took 11.6 % of cp's thread's samples, 3.4 % with this.
   131072 aged 4 KiB files, ext4 to ext4, bfocp -r, cold, three alternating
   rounds each: cp's thread ran 3.63-3.86 s (once 4.19 s) against 4.08-4.27 s
   without.  Nothing depends on it: a name made meanwhile by anyone is
   found by the open as before.  */
static void
look_up_dst (char const *dst_relname)
{
  if (g.wdir_path_fd < 0)
    return;
  char const *slash = strrchr (dst_relname, '/');
  struct stat st;
  fstatat (g.wdir_path_fd, slash ? slash + 1 : dst_relname, &st,
           AT_SYMLINK_NOFOLLOW | AT_NO_AUTOMOUNT);
}

bool
bfo_cp_src_missing (void)
{
  if (!g.pending)
    return false;
  g.stale_dsts++;
  settle ();
  return true;
}

/* Whether cp will fail to open SRC_NAME (SRC_SB) for reading: then it
   copies it at once, and its message comes in cp's order among the others
   (deferred, the copy failed when it ran, after later files' lines).  The
   mode bits answer for the owner and for a file all may read; otherwise
   (groups, ACLs) faccessat does.  Root reads everything.  */
static bool
unreadable (char const *src_name, struct stat const *src_sb)
{
  static uid_t euid = (uid_t) -1;
  if (euid == (uid_t) -1)
    euid = geteuid ();
  if (euid == 0)
    return false;
  if (src_sb->st_uid == euid)
    return !(src_sb->st_mode & S_IRUSR);
  if ((src_sb->st_mode & (S_IRGRP | S_IROTH)) == (S_IRGRP | S_IROTH))
    return false;
  return faccessat (AT_FDCWD, src_name, R_OK, AT_EACCESS) != 0;
}

/* The batch sizes, at the first file bfocp may batch: the memory limit
   they are fitted to takes reading cgroup files (130 us), which `cp a b'
   need not pay.  */
static void
size_batches (void)
{
  if (g.sized)
    return;
  g.sized = true;
  /* Measured on 131072 aged 4 KiB files (bench/run cp-4k, README): windows
     growing to 16384 files beat 8192 (2.99x against 2.58x cp -r), with a
     quarter of the simulated disk time of 8192.  With the reader and cp's
     side as of 2026-11-23, 32768 took the same wall time as 16384 (ext4 →
     XFS 4.31/4.09 s against 4.16/4.27 s, → Btrfs 5.18/4.78 s against
     5.01/5.02 s, the Linux tree 3.68/3.52 s against 3.35/3.74 s; two runs
     each) and cut the source's simulated disk time from 56 s to 45 s (ext4 →
     ext4 bfocp's total 62.8 s → 51.4 s, cp's 628.8 s); 65536 (with 256M)
     took 3.97 s against 3.69 s for 41 s.  */
  if (!g.ropts.batch_bytes || !g.ropts.batch_files)
    {
      uint64_t memory = bfo_memory_limit ();
      bool big = memory >= BIG_BATCH_MEMORY;
      uint64_t bytes = big ? BIG_BATCH_BYTES : DEFAULT_BATCH_BYTES;
      unsigned int files = big ? BIG_BATCH_FILES : DEFAULT_BATCH_FILES;
      bfo_fit_memory (memory, &bytes, &files);   /* (less under a small memory limit) */
      if (!g.ropts.batch_bytes)
        g.ropts.batch_bytes = bytes;
      if (!g.ropts.batch_files)
        g.ropts.batch_files = files;
    }
  uint64_t bb = g.ropts.batch_bytes;
  unsigned int bf = g.ropts.batch_files;
  /* A window per batch, so the first data arrive while cp walks on; the
     reader's own batch rules (files, bytes) split a window further.  */
  g.ropts.window_files = bf;
  g.ropts.flags |= BFO_READ_ATIME;      /* cp's reads update atimes: so do ours */
  g.max_inflight = 2 * bb;
  g.max_pending = 4 * (size_t) bf;
  g.ready = xcalloc (g.max_pending, sizeof *g.ready);
}

bool
bfo_cp_defer (struct cp_options const *x, char const *src_name,
              char const *dst_name, int dst_dirfd, char const *dst_relname,
              struct stat const *src_sb, bool command_line_arg,
              bool have_backup, bfo_cp_run_fn run, void const *args,
              size_t args_size)
{
  bool have_cand = g.have_cand, dangling = g.dangling;
  g.have_cand = g.dangling = false;
  if (!g.enabled)
    return false;
  if (x->reflink_mode == REFLINK_NEVER)
    g.reflink_never = true;
  /* Drain what arrived meanwhile, and keep the queue bounded.  */
  if (g.thread_up)
    drain (g.max_pending - 1);
  if (!S_ISREG (src_sb->st_mode))
    return false;
  __atomic_add_fetch (&g.offered, 1, __ATOMIC_RELAXED);
  if (g.space_tight)
    {
      /* Near a full disk, cp copies it now, as GNU cp: see bfo_cp_space.  */
      g.declined_space++;
      return false;
    }
  /* (a --layout given is honoured whatever the size) */
  if (!g.small_tried && !command_line_arg && !g.layout)
    {
      /* Trees this small are cp's to copy: the reader and its threads cost
         more than batching so few files could save (a directory of 10 warm
         files: bfocp 2.41 ms, GNU cp 1.41 ms).  */
      g.small_tried = true;
      unsigned int entries = SMALL_ENTRIES, dirs = SMALL_DIRS;
      int small = 1;
      for (int i = 0; i < g.n_ops && small == 1; i++)
        small = bfo_tree_small (AT_FDCWD, g.ops[i], &entries, &dirs);
      if (small == 1)
        {
          g.small = true;
          g.enabled = false;
          return false;
        }
    }
  if (!g.warm_tried && !command_line_arg)
    {
      src_fs_kind (src_name, src_sb);
      if (!g.in_memory)
        warm_start (x);
      g.warm_tried = true;
    }
  if (command_line_arg || have_backup || !x->data_copy_required || x->move_mode
      || x->install_mode || x->interactive == I_ASK_USER || x->set_security_context
      || x->preserve_security_context || x->sparse_mode == SPARSE_ALWAYS
      || x->reflink_mode == REFLINK_ALWAYS)
    {
      g.declined_opts++;
      return false;
    }
  /* Keeping times, cp stats a file's other names after it read this one,
     and so gives them the access time its read set (relatime): copied now,
     this one is read before.  */
  if ((x->preserve_links && (1 < src_sb->st_nlink || x->dereference == DEREF_ALWAYS))
      || (x->preserve_timestamps && 1 < src_sb->st_nlink))
    {
      g.declined_links++;
      return false;
    }
  if (src_sb->st_size == 0)
    return false;               /* nothing to read: cp just creates it */
  size_batches ();
  if (src_sb->st_size > MAX_BATCH_FILE
      || (g.ropts.batch_bytes && (uint64_t) src_sb->st_size > g.ropts.batch_bytes))
    {
      g.declined_size++;
      return false;
    }
  /* copy_reg's own test for "may be sparse": then it looks for holes.  */
  if (ST_NBLOCKS (*src_sb) < src_sb->st_size / ST_NBLOCKSIZE)
    {
      g.declined_sparse++;
      return false;
    }
  if (unreadable (src_name, src_sb))
    {
      g.declined_unreadable++;
      return false;
    }
  /* Copies that will fail at their open: their messages in cp's order.  */
  if (dangling || note_dst_dir (dst_dirfd, dst_relname))
    {
      g.declined_unwritable++;
      return false;
    }
  src_fs_kind (src_name, src_sb);
  if (g.in_memory)
    {
      g.declined_memory++;
      return false;
    }
  if (will_clone (x, src_name, src_sb, dst_dirfd, dst_relname))
    {
      g.declined_reflink++;
      return false;
    }
  if (!g.thread_up && !reader_start ())
    return false;
  look_up_dst (dst_relname);

  size_t ls = strlen (src_name) + 1, ld = strlen (dst_name) + 1;
  struct job *j = xzalloc (sizeof *j + ls + ld + args_size + 16);
  char *p = (char *) (j + 1);
  j->args = p;
  memcpy (p, args, args_size);
  p += (args_size + 15) / 16 * 16;
  j->src = memcpy (p, src_name, ls);
  j->dst = memcpy (p + ls, dst_name, ld);
  j->rel_off = dst_relname - dst_name;
  j->run = run;
  j->seq = g.next_seq++;
  j->stem_at = -1;
  j->want = src_sb->st_size;
  if (have_cand)
    dst_add (g.cand);
  g.deferred++;
  g.deferred_bytes += src_sb->st_size;
  g.pending++;
  g.pending_bytes += src_sb->st_size;

  pthread_mutex_lock (&g.lock);
  *g.todo_tail = j;
  g.todo_tail = &j->next;
  if (++g.n_todo >= TODO_WAKE)
    pthread_cond_signal (&g.reader_cv);
  pthread_mutex_unlock (&g.lock);
  return true;
}

/* Whether job J holds the data of the file SB is a stat of, as it is now.  */
static bool
job_holds (struct job const *j, struct stat const *sb)
{
  return (j && j->have_data && S_ISREG (sb->st_mode)
          && j->dev == sb->st_dev && j->ino == sb->st_ino
          && j->size == sb->st_size
          && timespec_cmp (j->mtime, get_stat_mtime (sb)) == 0
          && timespec_cmp (j->ctime, get_stat_ctime (sb)) == 0);
}

void
bfo_cp_fresh (struct stat const *sb, struct stat const *walked)
{
  /* Only a source whose ctime is the one cp's walk saw (before the job was
     queued, so before the reader opened it) may go unopened: see
     bfo_cp_held.  */
  g.fresh_ok = (sb && SAME_INODE (*sb, *walked)
                && timespec_cmp (get_stat_ctime (sb), get_stat_ctime (walked)) == 0);
  if (g.fresh_ok)
    g.fresh = *sb;
}

bool
bfo_cp_held (struct cp_options const *x, struct stat *sb)
{
  bool fresh_ok = g.fresh_ok;
  g.fresh_ok = false;
  /* Opening it now would find it readable if the reader's open did and
     nothing changed since: the file's ctime when cp's walk stat'ed it,
     before the job was queued and so before the reader opened it, must be
     the one the stat of just now sees (bfo_cp_fresh), and the one of the
     data the reader holds.  (The reader's own stat, taken after its open and taken again
     when it saw a change, may be newer than its open: a chmod 000 between
     the two left it reading through a descriptor cp could no longer get.)
     What copy_reg does with the descriptor besides reading it: clone it
     (declined by bfo_cp_defer where that could work, so the ioctl could
     only fail), copy its xattrs and ACL (they could go by name, at a path
     walk each: these keep the open), close it.  */
  if (!fresh_ok || !job_holds (g.current, &g.fresh)
      || x->preserve_xattr || x->preserve_mode || x->move_mode
      || x->reflink_mode == REFLINK_ALWAYS
      || x->set_security_context || x->preserve_security_context)
    return false;
  *sb = g.fresh;
  g.not_opened++;
  return true;
}

/* cp's buffer (IO_BUFSIZE, where st_blksize is at most that) */
#define CP_PIECE ((size_t) 128 << 10)

/* A file system running full must fail the copies GNU cp's would (see
   lib/space.c): before each entry cp makes, while free space less what is
   pending may fall under BFO_SPACE_SLACK, the pending copies are finished
   first, and the copies after it are cp's own (not deferred) until there is
   room again.  */
void
bfo_cp_space (int dst_dirfd, char const *dst_name, struct stat const *src_sb)
{
  if (!g.thread_up)
    return;
  uint64_t size = S_ISREG (src_sb->st_mode) && src_sb->st_size > 0 ? src_sb->st_size : 0;
  g.space_tight = false;
  if (!bfo_space_note (&g.space, size))
    return;
  struct statfs sf;
  int rc;
  uint64_t quota = UINT64_MAX;
  if (dst_dirfd != AT_FDCWD)
    {
      rc = fstatfs (dst_dirfd, &sf);
      if (rc == 0)
        quota = bfo_space_quota (&g.space, dst_dirfd, &sf);
    }
  else
    {
      char *dir = dir_name (dst_name);
      int fd = open (dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
      rc = fd < 0 ? statfs (dir, &sf) : fstatfs (fd, &sf);
      if (rc == 0 && fd >= 0)
        quota = bfo_space_quota (&g.space, fd, &sf);
      if (fd >= 0)
        close (fd);
      free (dir);
    }
  /* (a deferred copy makes its file when it runs) */
  g.space_tight = bfo_space_update (&g.space, rc == 0 ? &sf : NULL, quota,
                                    g.pending_bytes, g.pending, g.pending);
  if (g.space_tight && g.pending)
    {
      g.space_waits++;
      drain (0);
    }
}

int
bfo_cp_data (int src_fd, struct stat const *sb, int dst_fd)
{
  struct job *j = g.current;
  (void) src_fd;

  if (!job_holds (j, sb))
    {
      if (j)
        g.reread++;
      else if (S_ISREG (sb->st_mode))
        {
          g.direct++;
          g.direct_bytes += sb->st_size;
        }
      report (false);
      return 0;
    }
  char const *p = j->data;
  size_t left = j->len;
  uint64_t mark = bfo_write_behind_mark (g.wb);
  size_t cloned = bfo_clone_stem_clone (g.stem, dst_fd, j->stem_at, left);
  p += cloned;
  left -= cloned;
  /* One write; out of space, the rest a buffer's worth at a time, as cp
     would have written it: XFS reserves a write's blocks at once, so the
     one write got nothing where cp's filled what was left (see
     bfo_cp_space).  */
  bool pieces = false;
  while (left)
    {
      size_t n = (pieces
                  ? MIN (left, CP_PIECE - (size_t) (p - (char const *) j->data) % CP_PIECE)
                  : left);
      ssize_t w = write (dst_fd, p, n);
      if (w < 0)
        {
          if (errno == EINTR)
            continue;
          if ((errno == ENOSPC || errno == EDQUOT) && !pieces && n > CP_PIECE)
            {
              pieces = true;
              continue;
            }
          return -1;
        }
      if (w == 0)
        {
          errno = ENOSPC;
          return -1;
        }
      p += w;
      left -= w;
    }
  g.used++;
  g.used_bytes += j->len;
  /* Write-behind (lib/writebehind.c), started with the first batched file;
     without a helper, none.  */
  if (!g.wb_tried)
    {
      g.wb_tried = true;
      if (g.wb_every)
        bfo_write_behind_new (&g.wb, g.wb_every, g.wb_flags);
    }
  /* Only what was written: a file cloned whole has nothing to write back
     (as in bfotar's finish_job).  */
  if (!cloned || cloned < j->len)
    {
      /* (cp sets the times after this) */
      bfo_write_behind_trim (g.wb, dst_fd, j->len, mark);
      bfo_write_behind_note (g.wb, dst_fd, j->len - cloned);
    }
  return 1;
}

bool
bfo_cp_copy_range (char const *src_name, int src_fd, int dst_fd,
                   bool reflink_allowed)
{
  if (!reflink_allowed)
    return false;
  /* Files deferred are never sparse-looking (bfo_cp_defer), so sparse_copy
     would have tried copy_file_range first.  Nothing is copied with a length
     of 0; a pair the kernel does not take (EXDEV across file systems) fails
     as it would have, and cp would then have read and written.  A source
     copy_reg did not open is opened here, not following a symbolic link, not
     waiting for a fifo's writer: the name may have been taken since.  */
  int saved = errno;
  int fd = (src_fd < 0
            ? open (src_name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)
            : src_fd);
  loff_t in = 0, out = 0;
  bool taken = fd >= 0 && copy_file_range (fd, &in, dst_fd, &out, 0, 0) == 0;
  if (fd >= 0 && fd != src_fd)
    close (fd);
  errno = saved;
  return taken;
}

bool
bfo_cp_finish (void)
{
  warm_stop ();
  bool ok = bfo_cp_flush ();
  if (g.thread_up)
    {
      pthread_mutex_lock (&g.lock);
      g.quit = true;
      pthread_cond_signal (&g.reader_cv);
      pthread_mutex_unlock (&g.lock);
      pthread_join (g.thread, NULL);
      g.thread_up = false;
    }
  free (g.ready);
  g.ready = NULL;
  bfo_pool_destroy (g.pool, &g.pool_stats);
  g.pool = NULL;
  if (0 <= g.wdir_path_fd)
    close (g.wdir_path_fd);
  g.wdir_path_fd = -1;
  free (g.wdir);
  g.wdir = NULL;
  bfo_write_behind_free (g.wb, &g.wb_stats);
  g.wb = NULL;
  if (g.wb_stats.error)
    {
      /* Some data did not reach the disk, and write-behind saw it first:
         the user's sync -f, which would have said so, now says nothing.  */
      error (0, g.wb_stats.error, _("writing back the copied data failed"));
      ok = false;
    }
  bfo_clone_stem_free (g.stem, &g.stem_stats);
  g.stem = NULL;
  if (g.progress)
    report (true);
  if (g.stats)
    {
      struct bfo_read_stats const *r = &g.rstats;
      fprintf (stderr, _("%s: batched %" PRIu64 " files (%" PRIu64 " bytes) in %" PRIu64
                         " batches; data used for %" PRIu64 ", re-read by cp for %" PRIu64
                         " (changed, unreadable or failed)\n"),
               program_name, g.deferred, g.deferred_bytes, r->batches, g.used, g.reread);
      fprintf (stderr, _("%s: copied directly %" PRIu64 " files (%" PRIu64 " bytes); not "
                         "batched: %" PRIu64 " by options, %" PRIu64 " hard links, %" PRIu64
                         " large, %" PRIu64 " maybe sparse, %" PRIu64 " cloned, %" PRIu64
                         " in memory (tmpfs), %" PRIu64 " unreadable, %" PRIu64
                         " not writable\n"),
               program_name, g.direct, g.direct_bytes, g.declined_opts, g.declined_links,
               g.declined_size, g.declined_sparse, g.declined_reflink, g.declined_memory,
               g.declined_unreadable, g.declined_unwritable);
      if (g.space_waits || g.declined_space)
        fprintf (stderr, _("%s: free space: %" PRIu64 " statfs (%" PRIu64 " with a quota"
                           " limit), %" PRIu64 " waits for the pending copies, %" PRIu64
                           " copied at once near a full disk or quota\n"),
                 program_name, g.space.checks, g.space.quota_checks, g.space_waits,
                 g.declined_space);
      if (g.racy)
        fprintf (stderr, _("%s: read but left to cp, changed just before: %" PRIu64 "\n"),
                 program_name, g.racy);
      if (g.not_opened)
        fprintf (stderr, _("%s: sources cp did not open (their data held, unchanged): %"
                           PRIu64 "\n"), program_name, g.not_opened);
      if (g.aliased)
        fprintf (stderr, _("%s: copied in cp's order after the deferred ones: %" PRIu64
                           " onto destinations other names reach or cp cannot write\n"),
                 program_name, g.aliased);
      if (g.stale_dsts)
        fprintf (stderr, _("%s: deferred copies finished before cp looked at"
                           " destinations they write: %" PRIu64 "\n"),
                 program_name, g.stale_dsts);
      if (g.small)
        fprintf (stderr, _("%s: a small tree (at most %d entries in %d directories):"
                           " copied by cp itself\n"), program_name, SMALL_ENTRIES, SMALL_DIRS);
      fprintf (stderr, _("%s: reads: %" PRIu64 " requests for %" PRIu64 " extents (%"
                         PRIu64 " merged), %" PRIu64 " holes, fallbacks: %" PRIu64
                         " no FIEMAP, %" PRIu64 " inline, %" PRIu64 " changed, %" PRIu64
                         " other, %" PRIu64 " in the page cache; %" PRIu64 " errors\n"),
               program_name, r->requests, r->extents, r->merged, r->holes,
               r->fallback_no_fiemap, r->fallback_inline, r->fallback_changed,
               r->fallback_other + r->fallback_encoded + r->fallback_unaligned
               + r->fallback_delalloc, r->cached, r->errors);
      if (r->pread_threads)
        fprintf (stderr, _("%s: reads: no io_uring: made on %" PRIu64 " threads\n"),
                 program_name, r->pread_threads);
      if (g.warm_tried)
        fprintf (stderr, _("%s: metadata walk ahead of cp: %" PRIu64 " files stat'ed, %"
                           PRIu64 " directories skipped (no O_NOATIME), %" PRIu64
                           " read-ahead requests\n"),
                 program_name, g.warmed, g.warm_dirs_skipped, g.warm_ahead_requests);
      if (g.pool_stats.buffers || g.pool_stats.large)
        fprintf (stderr, _("%s: held data: %" PRIu64 " buffers in %" PRIu64 " slabs of %zu"
                           " KiB (%" PRIu64 " reused), %" PRIu64 " on their own\n"),
                 program_name, g.pool_stats.buffers, g.pool_stats.mapped,
                 BFO_POOL_SLAB >> 10, g.pool_stats.reused, g.pool_stats.large);
      if (g.wb_stats.every)
        fprintf (stderr, _("%s: write-behind every %" PRIu64 " bytes: %" PRIu64
                           " write-backs (%" PRIu64 " ms, %" PRIu64 " failed), %" PRIu64
                           " skipped (Btrfs), %" PRIu64 " trimmed\n"),
                 program_name, g.wb_stats.every, g.wb_stats.writebacks,
                 g.wb_stats.us / 1000, g.wb_stats.failed, g.wb_stats.skipped,
                 g.wb_stats.trimmed);
      if (g.stem_stats.files)
        fprintf (stderr, _("%s: clone stem: %" PRIu64 " files (%" PRIu64 " bytes) staged in %"
                           PRIu64 " writes (%" PRIu64 " direct); %" PRIu64 " cloned (%" PRIu64
                           " bytes), %" PRIu64 " written instead\n"),
                 program_name, g.stem_stats.files, g.stem_stats.bytes, g.stem_stats.writes,
                 g.stem_stats.direct, g.stem_stats.cloned, g.stem_stats.cloned_bytes,
                 g.stem_stats.failed);
      if (g.layout)
        fprintf (stderr, _("%s: layout %s: %" PRIu64 " runs of held files placed\n"),
                 program_name, g.layout_spec, g.layout_runs);
      if (g.reader_error)
        fprintf (stderr, _("%s: batch reader stopped early: %s\n"), program_name,
                 strerror (g.reader_error));
    }
  return ok;
}
