/* bfo-write.c: the bfo tool's write and recover commands: copy a tree through the batch
   writer (a front end for tests and benchmarks), and recover interrupted batch writes.  */

#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bfo.h"
#include "bfo-util.h"
#include "bfo-cmds.h"
#include "error.h"
#include "progname.h"

_Noreturn void
bfo_die_nomem (void)
{
  error (EXIT_FAILURE, ENOMEM, "memory exhausted");
  abort ();
}

static void
write_usage (int status)
{
  if (status != EXIT_SUCCESS)
    {
      fprintf (stderr, "Try '%s write --help' for more information.\n", program_name);
      exit (status);
    }
  printf ("Usage: %s write [OPTION]... SRC DST\n", program_name);
  fputs ("\
Copy every regular file under SRC to the same relative path under DST through\n\
the batch writer; directories and symbolic links are recreated, other file\n\
types are skipped.  Files keep their mode and times (and owner when run as root).  DST is created\n\
if missing; existing files in it are replaced.  DST may be IMAGE:/DIR, a\n\
directory in the unmounted ext4 file system on IMAGE (an image file, or as root\n\
a block device), written with the ext4img backend.\n\
\n\
      --backend=NAME       auto (default: ext4img for IMAGE:/DIR, else reflink\n\
                             where cloning works except on Btrfs, else\n\
                             ordered), reflink, ordered, or ext4img\n\
      --batch-files=N      files per batch (default 4096)\n\
      --batch-bytes=SIZE   data bytes per batch, suffixes K M G (default 64M)\n\
      --batch-ms=N         run a batch when its first file waited N ms (default 100)\n\
      --io-depth=N         io_uring queue depth of the stem writes (default 32)\n\
      --no-direct          write stems buffered instead of with O_DIRECT\n\
      --ordered-direct     ordered backend: fallocate + O_DIRECT (for benchmarks)\n\
      --stats              print the writer's counters on stderr (also BFO_STATS=1)\n", stdout);
  fputs (bfo_layout_help, stdout);
  fputs ("\
  -h, --help               display this help and exit\n", stdout);
  exit (status);
}

/* ------------------------------------------------------------------ layout options */

const char bfo_layout_help[] = "\
      --layout=POLICY      which files a batch places next to each other on disk:\n\
                             walk (default: the order files come in), dir (each\n\
                             directory's files together), refs (a file followed by\n\
                             the files it references: html href/src, C #include,\n\
                             Makefile sources), trace=FILE (sets of files often\n\
                             used together in the access trace FILE: one path per\n\
                             line, strace -e trace=openat output, or a web server\n\
                             access log)\n\
      --trace-support=PCT  a set is frequent in PCT % of the trace's transactions\n\
                             (default 5)\n\
      --trace-batch-refs=N trace references mined together (default 50000)\n\
      --trace-root=DIR     trace paths are relative to DIR (default: a trace path\n\
                             stands for the file whose path is its longest suffix)\n";

bool
bfo_layout_option (int ch, const char *arg, struct bfo_layout_args *a)
{
  switch (ch)
    {
    case BFO_OPT_LAYOUT:
      a->spec = arg;
      return true;
    case BFO_OPT_TRACE_SUPPORT:
      if (bfo_layout_parse_support (arg, &a->support) < 0)
        error (EXIT_FAILURE, 0, "invalid trace support (a percentage above 0, at most 100): '%s'",
               arg);
      return true;
    case BFO_OPT_TRACE_BATCH_REFS:
      a->batch_refs = bfo_parse_count (arg, "trace batch size", 0);
      return true;
    case BFO_OPT_TRACE_ROOT:
      a->root = arg;
      return true;
    default:
      return false;
    }
}

struct bfo_layout *
bfo_layout_make (const struct bfo_layout_args *a)
{
  if (!a->spec)
    return NULL;
  struct bfo_layout_opts lo = { .trace_support = a->support, .trace_batch_refs = a->batch_refs,
                                .trace_root = a->root };
  struct bfo_layout *l;
  int r = bfo_layout_new (&l, a->spec, &lo);
  if (r == -EINVAL)
    error (EXIT_FAILURE, 0, "invalid layout '%s' (walk, dir, refs or trace=FILE)", a->spec);
  if (r < 0 && strncmp (a->spec, "trace=", 6) == 0)
    error (EXIT_FAILURE, -r, "cannot read the trace '%s'", a->spec + 6);
  if (r < 0)
    error (EXIT_FAILURE, -r, "cannot set up layout '%s'", a->spec);
  return l;
}

/* A file of the tree bfo plan lays out.  */
struct pfile
{
  char *rel;
  unsigned char *data;
  size_t len;
};

struct ptree
{
  const char *src;
  struct pfile *f;
  size_t n, cap;
};

static int read_whole (int fd, unsigned char *buf, size_t size, size_t *got);

/* Regular files under SRC/REL, in the order bfo write adds them.  */
static void
plan_walk (struct ptree *t, const char *rel)
{
  char *path;
  if (asprintf (&path, "%s%s%s", t->src, *rel ? "/" : "", rel) < 0)
    bfo_die_nomem ();
  DIR *d = opendir (path);
  if (!d)
    error (EXIT_FAILURE, errno, "cannot read directory '%s'", path);
  size_t n;
  struct bfo_dirent *ents = bfo_sorted_names (d, false, &n);
  for (size_t i = 0; i < n; i++)
    {
      char *sub, *sp;
      struct stat st;
      if (asprintf (&sub, "%s%s%s", rel, *rel ? "/" : "", ents[i].name) < 0
          || asprintf (&sp, "%s/%s", path, ents[i].name) < 0)
        bfo_die_nomem ();
      if (lstat (sp, &st) < 0)
        error (EXIT_FAILURE, errno, "cannot stat '%s'", sp);
      if (S_ISDIR (st.st_mode))
        plan_walk (t, sub);
      else if (S_ISREG (st.st_mode))
        {
          int fd = open (sp, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
          unsigned char *buf = malloc (st.st_size ? st.st_size : 1);
          size_t got = 0;
          int e = fd < 0 ? errno : !buf ? ENOMEM : read_whole (fd, buf, st.st_size, &got);
          if (fd >= 0)
            close (fd);
          if (e)
            error (EXIT_FAILURE, e, "cannot read '%s'", sp);
          if (t->n == t->cap && !(t->f = realloc (t->f, (t->cap = t->cap ? 2 * t->cap : 256)
                                                        * sizeof *t->f)))
            bfo_die_nomem ();
          t->f[t->n++] = (struct pfile) { sub, buf, got };
          sub = NULL;
        }
      free (sub);
      free (sp);
      free (ents[i].name);
    }
  free (ents);
  free (path);
}

/* The writer's batch defaults (bfo-write-int.h), for cutting the plan's batches.  */
#define PLAN_BATCH_FILES 4096u
#define PLAN_BATCH_BYTES (64ull << 20)
#define PLAN_ALIGN 4096u

static void
plan_batch (const struct bfo_layout *l, const struct ptree *t, size_t from, size_t to,
            unsigned long batch)
{
  size_t n = to - from;
  struct bfo_layout_file *f = malloc (n * sizeof *f);
  size_t *order = malloc (n * sizeof *order);
  if (!f || !order)
    bfo_die_nomem ();
  for (size_t i = 0; i < n; i++)
    f[i] = (struct bfo_layout_file) { t->f[from + i].rel, t->f[from + i].data, t->f[from + i].len };
  struct bfo_layout_group *g;
  size_t ng;
  int r = bfo_layout_order (l, f, n, order, &g, &ng);
  if (r < 0)
    error (EXIT_FAILURE, -r, "cannot lay out batch %lu", batch);
  printf ("batch %lu: %zu file%s, %zu group%s\n", batch, n, n == 1 ? "" : "s", ng,
          ng == 1 ? "" : "s");
  for (size_t k = 0; k < ng; k++)
    {
      printf ("  group %zu (%zu file%s): %s\n", k + 1, g[k].count, g[k].count == 1 ? "" : "s",
              g[k].why);
      for (size_t j = g[k].first; j < g[k].first + g[k].count; j++)
        printf ("    %s\n", f[order[j]].path);
    }
  bfo_layout_groups_free (g, ng);
  free (f);
  free (order);
}

int
bfo_plan_layout (const char *src, const struct bfo_layout_args *a, unsigned int batch_files,
                 uint64_t batch_bytes)
{
  struct bfo_layout *l = bfo_layout_make (a);
  int policy = bfo_layout_policy (l);
  printf ("layout:      %s%s%s\n", bfo_layout_policy_name (policy),
          policy == BFO_LAYOUT_TRACE ? " " : "", policy == BFO_LAYOUT_TRACE ? a->spec + 6 : "");
  struct bfo_layout_trace_info ti;
  if (bfo_layout_trace_info (l, &ti) == 0)
    printf ("trace:       %s, %" PRIu64 " references, %" PRIu64 " transactions in %" PRIu64
            " mining batch%s, %" PRIu64 " frequent set%s\n", ti.format, ti.references,
            ti.transactions, ti.mining_batches, ti.mining_batches == 1 ? "" : "es",
            ti.frequent_sets, ti.frequent_sets == 1 ? "" : "s");
  if (src)
    {
      struct ptree t = { .src = src };
      plan_walk (&t, "");
      if (!batch_files)
        batch_files = PLAN_BATCH_FILES;
      if (!batch_bytes)
        batch_bytes = PLAN_BATCH_BYTES;
      unsigned long batch = 0;
      size_t from = 0;
      uint64_t bytes = 0;
      for (size_t i = 0; i <= t.n; i++)
        {
          uint64_t span = i < t.n ? (t.f[i].len + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN : 0;
          if (i == t.n || i - from == batch_files || (i > from && bytes + span > batch_bytes))
            {
              if (i > from)
                plan_batch (l, &t, from, i, ++batch);
              from = i;
              bytes = 0;
            }
          bytes += span;
        }
      for (size_t i = 0; i < t.n; i++)
        {
          free (t.f[i].rel);
          free (t.f[i].data);
        }
      free (t.f);
    }
  bfo_layout_free (l);
  return EXIT_SUCCESS;
}

/* A directory made by the copy: its mode and times are set last, deepest first,
   so that a read-only directory still takes its files.  */
struct dir
{
  char *path;
  struct stat st;
};

struct copy
{
  const char *src, *dst;
  bool image;                   /* directories go through bfo_writer_mkdir */
  bool root;                    /* owners are kept (geteuid, once) */
  struct bfo_writer *w;
  struct dir *dirs;
  size_t n_dirs, cap_dirs;
  uint64_t skipped;
  int failed;
  int stop;                     /* fatal libbfo error */
  /* Files' data, read by the read-ahead thread, freed by this one once the
     writer has copied them (lib/pool.c).  */
  struct bfo_pool *pool;
};

static const char *
op_message (const char *op)
{
  if (!op)
    return "cannot write";
  if (strcmp (op, "create") == 0)
    return "cannot create";
  if (strcmp (op, "path") == 0)
    return "refusing to write";
  if (strcmp (op, "attrs") == 0)
    return "cannot set attributes of";
  if (strcmp (op, "rename") == 0)
    return "cannot move into place";
  if (strcmp (op, "journal") == 0)
    return "cannot journal the batch of";
  if (strcmp (op, "stem") == 0)
    return "cannot write the stem of";
  if (strcmp (op, "sync") == 0)
    return "cannot sync";
  return "cannot write";
}

static int
write_cb (const struct bfo_written *f, void *arg)
{
  struct copy *c = arg;
  if (f->error)
    {
      error (0, f->error, "%s '%s/%s'", op_message (f->error_op), c->dst, f->path);
      c->failed = 1;
    }
  return 0;
}

static int
read_whole (int fd, unsigned char *buf, size_t size, size_t *got)
{
  *got = 0;
  while (*got < size)
    {
      ssize_t k = read (fd, buf + *got, size - *got);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0)
        return errno;
      if (k == 0)
        break;
      *got += k;
    }
  return 0;
}

static int
by_name (const void *a, const void *b)
{
  return strcmp (((const struct bfo_dirent *) a)->name, ((const struct bfo_dirent *) b)->name);
}

struct bfo_dirent *
bfo_sorted_names (DIR *d, bool skip_regular, size_t *np)
{
  struct bfo_dirent *ents = NULL;
  size_t n = 0, cap = 0;
  struct dirent *de;
  while ((de = readdir (d)))
    {
      if (strcmp (de->d_name, ".") == 0 || strcmp (de->d_name, "..") == 0
          || (skip_regular && de->d_type == DT_REG))
        continue;
      if (n == cap)
        {
          cap = cap ? 2 * cap : 64;
          ents = realloc (ents, cap * sizeof *ents);
          if (!ents)
            bfo_die_nomem ();
        }
      ents[n].type = de->d_type;
      if (!(ents[n++].name = strdup (de->d_name)))
        bfo_die_nomem ();
    }
  closedir (d);
  qsort (ents, n, sizeof *ents, by_name);
  *np = n;
  return ents;
}

/* ------------------------------------------------------------------ read-ahead
   The source is walked and read by a thread of its own, which queues what it
   found in walk order; the caller's thread makes directories and symbolic links
   and adds the files to the writer, whose batches it runs.  Read in line, the
   source's opens and reads (a third of the CPU time from a tree in tmpfs onto
   ext4) left one of the two filling threads idle between batches.  */

enum item_kind { IT_FILE, IT_DIR, IT_SYMLINK };

struct item
{
  struct item *next;
  int kind;
  char *rel;                    /* relative path */
  unsigned char *data;          /* IT_FILE: LEN bytes; IT_SYMLINK: the target */
  size_t len;                   /* IT_FILE: at most st.st_size, DATA's size in the pool */
  struct stat st;
};

/* The queue holds at most this many bytes of data (one larger file alone).  */
#define RA_BYTES (64u << 20)
#define RA_ITEMS 16384u

struct ra
{
  pthread_mutex_t mu;
  pthread_cond_t cv;
  struct item *head, **tail;
  size_t n;
  uint64_t bytes;
  bool done;                    /* the walk ended */
  bool quit;                    /* the consumer stopped: drop the rest */
  bool unbounded;               /* no thread: the walk queues everything first */
  struct copy *c;
};

static void
ra_free (struct ra *q, struct item *it)
{
  free (it->rel);
  if (it->kind == IT_FILE)
    bfo_pool_free (q->c->pool, it->data, it->st.st_size);
  else
    free (it->data);
  free (it);
}

/* Queue IT (freed instead once the consumer quit).  Returns false if it did.  */
static bool
ra_push (struct ra *q, struct item *it)
{
  pthread_mutex_lock (&q->mu);
  while (!q->quit && !q->unbounded && q->n > 0
         && (q->n >= RA_ITEMS || q->bytes + it->len > RA_BYTES))
    pthread_cond_wait (&q->cv, &q->mu);
  bool quit = q->quit;
  if (!quit)
    {
      it->next = NULL;
      *q->tail = it;
      q->tail = &it->next;
      q->n++;
      q->bytes += it->len;
      pthread_cond_broadcast (&q->cv);
    }
  pthread_mutex_unlock (&q->mu);
  if (quit)
    ra_free (q, it);
  return !quit;
}

static struct item *
ra_pop (struct ra *q)
{
  pthread_mutex_lock (&q->mu);
  while (!q->head && !q->done)
    pthread_cond_wait (&q->cv, &q->mu);
  struct item *it = q->head;
  if (it)
    {
      q->head = it->next;
      if (!q->head)
        q->tail = &q->head;
      q->n--;
      q->bytes -= it->len;
      pthread_cond_broadcast (&q->cv);
    }
  pthread_mutex_unlock (&q->mu);
  return it;
}

static struct item *
new_item (int kind, const char *rel, const struct stat *st)
{
  struct item *it = calloc (1, sizeof *it);
  if (!it || !(it->rel = strdup (rel)))
    bfo_die_nomem ();
  it->kind = kind;
  it->st = *st;
  return it;
}

static void
set_failed (struct copy *c)
{
  __atomic_store_n (&c->failed, 1, __ATOMIC_RELAXED);
}

/* Read the regular file PATH for REL.  With OTHER (the walk's d_type said a
   regular file, so no lstat came first), something else there (a race) sets
   *OTHER, and nothing is reported: the caller looks at it again.  */
static bool
read_file (struct ra *q, const char *path, const char *rel, bool *other)
{
  int fd = open (path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  struct stat st;
  int err = fd < 0 || fstat (fd, &st) < 0 ? errno : 0;
  if (other && (err == ELOOP || err == ENOENT || (!err && !S_ISREG (st.st_mode))))
    {
      *other = true;
      if (fd >= 0)
        close (fd);
      return true;
    }
  if (err)
    {
      error (0, err, "cannot read '%s'", path);
      set_failed (q->c);
      if (fd >= 0)
        close (fd);
      return true;
    }
  unsigned char *buf = bfo_pool_alloc (q->c->pool, st.st_size);
  size_t got = 0;
  int e = buf ? read_whole (fd, buf, st.st_size, &got) : ENOMEM;
  close (fd);
  if (e)
    {
      error (0, e, "cannot read '%s'", path);
      set_failed (q->c);
      bfo_pool_free (q->c->pool, buf, st.st_size);
      return true;
    }
  struct item *it = new_item (IT_FILE, rel, &st);
  it->data = buf;
  it->len = got;
  return ra_push (q, it);
}

/* The symbolic link PATH (stat ST) for REL.  */
static bool
read_symlink (struct ra *q, const char *path, const char *rel, const struct stat *st)
{
  char target[PATH_MAX + 1];
  ssize_t k = readlink (path, target, sizeof target - 1);
  if (k < 0)
    {
      error (0, errno, "cannot read symbolic link '%s'", path);
      set_failed (q->c);
      return true;
    }
  target[k] = '\0';
  struct item *it = new_item (IT_SYMLINK, rel, st);
  if (!(it->data = (unsigned char *) strdup (target)))
    bfo_die_nomem ();
  return ra_push (q, it);
}

/* Walk SRC/REL (REL "" for SRC itself), entries in name order.  False once the
   consumer quit.  */
static bool
walk_dir (struct ra *q, const char *rel)
{
  struct copy *c = q->c;
  char *path = *rel ? NULL : strdup (c->src);
  if (*rel && asprintf (&path, "%s/%s", c->src, rel) < 0)
    path = NULL;
  if (!path)
    bfo_die_nomem ();
  DIR *d = opendir (path);
  if (!d)
    {
      error (0, errno, "cannot read directory '%s'", path);
      set_failed (c);
      free (path);
      return true;
    }
  size_t n;
  struct bfo_dirent *ents = bfo_sorted_names (d, false, &n);
  bool go = true;
  for (size_t i = 0; i < n; i++)
    {
      char *sub, *srcpath;
      if (asprintf (&sub, "%s%s%s", rel, *rel ? "/" : "", ents[i].name) < 0
          || asprintf (&srcpath, "%s/%s", path, ents[i].name) < 0)
        bfo_die_nomem ();
      struct stat st;
      bool other = false;
      if (!go)
        ;
      else if (ents[i].type == DT_REG && (go = read_file (q, srcpath, sub, &other), !other))
        ;                       /* (one stat fewer a file) */
      else if (lstat (srcpath, &st) < 0)
        {
          error (0, errno, "cannot stat '%s'", srcpath);
          set_failed (c);
        }
      else if (S_ISREG (st.st_mode))
        go = read_file (q, srcpath, sub, NULL);
      else if (S_ISLNK (st.st_mode))
        go = read_symlink (q, srcpath, sub, &st);
      else if (S_ISDIR (st.st_mode))
        go = ra_push (q, new_item (IT_DIR, sub, &st)) && walk_dir (q, sub);
      else
        c->skipped++;
      free (sub);
      free (srcpath);
      free (ents[i].name);
    }
  free (ents);
  free (path);
  return go;
}

static void *
ra_thread (void *arg)
{
  struct ra *q = arg;
  walk_dir (q, "");
  pthread_mutex_lock (&q->mu);
  q->done = true;
  pthread_cond_broadcast (&q->cv);
  pthread_mutex_unlock (&q->mu);
  return NULL;
}

/* --------------------------------------------------------------- the consumer */

/* What a copy keeps of ST: mode and times, and the owner when run as root.  */
static struct bfo_write_attrs
copy_attrs (const struct copy *c, const struct stat *st)
{
  struct bfo_write_attrs a = {
    .flags = BFO_ATTR_MODE | BFO_ATTR_ATIME | BFO_ATTR_MTIME,
    .mode = st->st_mode & 07777, .atime = st->st_atim, .mtime = st->st_mtim,
  };
  if (c->root)
    {
      a.flags |= BFO_ATTR_OWNER;
      a.uid = st->st_uid;
      a.gid = st->st_gid;
    }
  return a;
}

static void
add_file (struct copy *c, struct item *it)
{
  struct bfo_write_attrs a = copy_attrs (c, &it->st);
  int r = bfo_writer_add (c->w, it->rel, it->data, it->len, &a, NULL);
  if (r < 0)
    c->stop = r;
}

/* Recreate the symbolic link REL -> TARGET (stat ST): through the writer in an
   image, else at once (a link has no data to batch), replacing a non-directory.  */
static void
make_symlink (struct copy *c, const char *rel, const char *target, const struct stat *st)
{
  bool root = c->root;
  if (c->image)
    {
      struct bfo_write_attrs a = {
        .flags = BFO_ATTR_ATIME | BFO_ATTR_MTIME | (root ? BFO_ATTR_OWNER : 0),
        .uid = st->st_uid, .gid = st->st_gid, .atime = st->st_atim, .mtime = st->st_mtim,
      };
      int r = bfo_writer_symlink (c->w, rel, target, &a, NULL);
      if (r < 0)
        c->stop = r;
      return;
    }
  char *dpath;
  if (asprintf (&dpath, "%s/%s", c->dst, rel) < 0)
    bfo_die_nomem ();
  int r = symlink (target, dpath);
  if (r < 0 && errno == EEXIST && unlink (dpath) == 0)
    r = symlink (target, dpath);
  struct timespec ts[2] = { st->st_atim, st->st_mtim };
  if (r < 0)
    error (0, errno, "cannot create symbolic link '%s'", dpath);
  else if ((root && lchown (dpath, st->st_uid, st->st_gid) < 0)
           || utimensat (AT_FDCWD, dpath, ts, AT_SYMLINK_NOFOLLOW) < 0)
    {
      error (0, errno, "cannot set attributes of '%s'", dpath);
      r = -1;
    }
  if (r < 0)
    set_failed (c);
  free (dpath);
}

/* Make the directory REL (stat ST).  False if it could not be made: the caller
   skips what the walk found under it.  */
static bool
make_dir (struct copy *c, const char *rel, const struct stat *st)
{
  if (c->image)
    {
      /* Made in the image, attributes set when the writer closes.  */
      struct bfo_write_attrs a = copy_attrs (c, st);
      int r = bfo_writer_mkdir (c->w, rel, &a, NULL);
      if (r < 0)
        c->stop = r;
      return r >= 0;
    }
  char *dpath;
  if (asprintf (&dpath, "%s/%s", c->dst, rel) < 0)
    bfo_die_nomem ();
  if (mkdir (dpath, 0700) == 0)
    {
      if (c->n_dirs == c->cap_dirs)
        {
          c->cap_dirs = c->cap_dirs ? 2 * c->cap_dirs : 64;
          c->dirs = realloc (c->dirs, c->cap_dirs * sizeof *c->dirs);
          if (!c->dirs)
            bfo_die_nomem ();
        }
      c->dirs[c->n_dirs++] = (struct dir) { dpath, *st };
      return true;
    }
  /* An existing directory keeps its own mode, as cp -r leaves it.  */
  if (errno == EEXIST)
    {
      free (dpath);
      return true;
    }
  error (0, errno, "cannot create directory '%s'", dpath);
  set_failed (c);
  free (dpath);
  return false;
}

/* Copy the tree: the read-ahead thread walks and reads, this thread writes.  */
static void
copy_tree (struct copy *c)
{
  struct ra q = { .c = c };
  q.tail = &q.head;
  /* (empty slabs kept: the queue's worth, which the thread refills) */
  if (bfo_pool_new (&c->pool, RA_BYTES) < 0)
    bfo_die_nomem ();
  pthread_mutex_init (&q.mu, NULL);
  pthread_cond_init (&q.cv, NULL);
  pthread_t tid;
  bool threaded = bfo_thread_create (&tid, "bfo-readahead", ra_thread, &q) == 0;
  if (!threaded)
    {
      q.unbounded = true;
      ra_thread (&q);
    }
  char *skip = NULL;            /* a directory that could not be made */
  size_t skip_len = 0;
  struct item *it;
  while ((it = ra_pop (&q)))
    {
      if (skip && strncmp (it->rel, skip, skip_len) == 0 && it->rel[skip_len] == '/')
        ;
      else if (c->stop)
        {
          pthread_mutex_lock (&q.mu);
          q.quit = true;
          pthread_cond_broadcast (&q.cv);
          pthread_mutex_unlock (&q.mu);
        }
      else if (it->kind == IT_FILE)
        add_file (c, it);
      else if (it->kind == IT_SYMLINK)
        make_symlink (c, it->rel, (const char *) it->data, &it->st);
      else if (!make_dir (c, it->rel, &it->st))
        {
          free (skip);
          skip = strdup (it->rel);
          if (!skip)
            bfo_die_nomem ();
          skip_len = strlen (skip);
        }
      ra_free (&q, it);
    }
  if (threaded)
    pthread_join (tid, NULL);
  bfo_pool_destroy (c->pool, NULL);
  c->pool = NULL;
  free (skip);
  pthread_mutex_destroy (&q.mu);
  pthread_cond_destroy (&q.cv);
}

static void
print_write_stats (struct bfo_writer *w, uint64_t skipped)
{
  struct bfo_write_stats s;
  bfo_writer_get_stats (w, &s);
  fprintf (stderr, "%s: write stats: backend=%s files=%" PRIu64 " bytes=%" PRIu64
           " batches=%" PRIu64 " errors=%" PRIu64 " stem_bytes=%" PRIu64
           " stem_writes=%" PRIu64 " stem_buffered=%" PRIu64 " clones=%" PRIu64
           " ordered_files=%" PRIu64 " stem_fallbacks=%" PRIu64 " syncs=%" PRIu64
           " journals=%" PRIu64 " recovered=%" PRIu64 " skipped=%" PRIu64
           " ag_splits=%" PRIu64 "\n",
           program_name, bfo_backend_name (bfo_writer_backend (w)), s.files, s.bytes,
           s.batches, s.errors, s.stem_bytes, s.stem_writes, s.stem_buffered, s.clones,
           s.ordered_files, s.stem_fallbacks, s.syncs, s.journals, s.recovered, skipped,
           s.ag_splits);
}

enum { OPT_BACKEND = 256, OPT_BATCH_FILES, OPT_BATCH_BYTES, OPT_BATCH_MS, OPT_NO_DIRECT,
       OPT_ORDERED_DIRECT, OPT_STATS, OPT_IO_DEPTH };

int
bfo_cmd_write (int argc, char **argv)
{
  static const struct option opts[] = {
    {"backend", required_argument, NULL, OPT_BACKEND},
    {"batch-files", required_argument, NULL, OPT_BATCH_FILES},
    {"batch-bytes", required_argument, NULL, OPT_BATCH_BYTES},
    {"batch-ms", required_argument, NULL, OPT_BATCH_MS},
    {"io-depth", required_argument, NULL, OPT_IO_DEPTH},
    {"no-direct", no_argument, NULL, OPT_NO_DIRECT},
    {"ordered-direct", no_argument, NULL, OPT_ORDERED_DIRECT},
    {"stats", no_argument, NULL, OPT_STATS},
    BFO_LAYOUT_OPTIONS,
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}
  };
  struct bfo_write_opts o = { 0 };
  struct bfo_layout_args la = { 0 };
  int stats = getenv ("BFO_STATS") && strcmp (getenv ("BFO_STATS"), "0") != 0;
  int ch;
  while ((ch = getopt_long (argc, argv, "h", opts, NULL)) != -1)
    switch (ch)
      {
      case OPT_BACKEND:
        if (strcmp (optarg, "auto") == 0)
          o.backend = BFO_BACKEND_AUTO;
        else if (strcmp (optarg, "reflink") == 0)
          o.backend = BFO_BACKEND_REFLINK;
        else if (strcmp (optarg, "ordered") == 0)
          o.backend = BFO_BACKEND_ORDERED;
        else if (strcmp (optarg, "ext4img") == 0)
          o.backend = BFO_BACKEND_EXT4IMG;
        else
          {
            error (0, 0, "unknown backend '%s' (auto, reflink, ordered or ext4img)", optarg);
            write_usage (EXIT_FAILURE);
          }
        break;
      case OPT_BATCH_FILES: o.batch_files = bfo_parse_count (optarg, "batch file count", 0); break;
      case OPT_BATCH_BYTES: o.batch_bytes = bfo_parse_count (optarg, "batch size", 1); break;
      case OPT_BATCH_MS: o.batch_ms = bfo_parse_count (optarg, "batch time", 0); break;
      case OPT_IO_DEPTH: o.io_depth = bfo_parse_count (optarg, "queue depth", 0); break;
      case OPT_NO_DIRECT: o.flags |= BFO_WRITE_NO_DIRECT; break;
      case OPT_ORDERED_DIRECT: o.flags |= BFO_WRITE_ORDERED_DIRECT; break;
      case OPT_STATS: stats = 1; break;
      case 'h': write_usage (EXIT_SUCCESS); break;
      default:
        if (!bfo_layout_option (ch, optarg, &la))
          write_usage (EXIT_FAILURE);
      }
  if (argc - optind < 2)
    {
      error (0, 0, "missing SRC or DST for write");
      write_usage (EXIT_FAILURE);
    }
  if (argc - optind > 2)
    {
      error (0, 0, "extra operand '%s'", argv[optind + 2]);
      write_usage (EXIT_FAILURE);
    }
  struct copy c = { .src = argv[optind], .dst = argv[optind + 1], .root = geteuid () == 0 };
  struct stat st;
  if (stat (c.src, &st) < 0)
    error (EXIT_FAILURE, errno, "cannot stat '%s'", c.src);
  if (!S_ISDIR (st.st_mode))
    error (EXIT_FAILURE, ENOTDIR, "cannot copy '%s'", c.src);
  struct bfo_layout *layout = bfo_layout_make (&la);
  o.layout = layout;
  char *image = NULL, *idir = NULL;
  int r;
  if ((o.backend == BFO_BACKEND_AUTO || o.backend == BFO_BACKEND_EXT4IMG)
      && bfo_split_image_dst (c.dst, o.backend == BFO_BACKEND_EXT4IMG, &image, &idir))
    {
      o.backend = BFO_BACKEND_EXT4IMG;
      o.flags |= BFO_WRITE_MKDIRS;
      c.image = true;
      r = bfo_writer_open_image (&c.w, image, idir, &o, write_cb, &c);
      if (r < 0)
        bfo_image_open_error (EXIT_FAILURE, -r, image, idir);
    }
  else
    {
      if (mkdir (c.dst, 0777) < 0 && errno != EEXIST)
        error (EXIT_FAILURE, errno, "cannot create directory '%s'", c.dst);
      /* The ordered backend keeps two batches of files open: with the usual
         soft limit of 1024 its batches would be cut to 384 files, and each
         costs a sync.  The hard limit is ours to take.  */
      struct rlimit rl;
      if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
        {
          rl.rlim_cur = rl.rlim_max;
          setrlimit (RLIMIT_NOFILE, &rl);
        }
      r = bfo_writer_open (&c.w, c.dst, &o, write_cb, &c);
    }
  free (image);
  free (idir);
  if (r == -EOPNOTSUPP && o.backend == BFO_BACKEND_REFLINK)
    error (EXIT_FAILURE, 0, "cannot write into '%s' with the reflink backend: "
           "its file system does not clone file ranges", c.dst);
  if (r < 0)
    error (EXIT_FAILURE, -r, "cannot write into '%s'", c.dst);
  copy_tree (&c);
  if (c.stop == 0)
    c.stop = bfo_writer_flush (c.w);
  if (stats)
    print_write_stats (c.w, c.skipped);
  r = bfo_writer_close (c.w);
  bfo_layout_free (layout);
  if (c.stop < 0)
    error (EXIT_FAILURE, -c.stop, "batch write into '%s' failed", c.dst);
  if (r < 0)
    error (EXIT_FAILURE, -r, "cannot sync '%s'", c.dst);
  /* Deepest first: a directory's times change while its subdirectories are fixed.  */
  for (size_t i = c.n_dirs; i-- > 0;)
    {
      struct dir *d = &c.dirs[i];
      struct timespec ts[2] = { d->st.st_atim, d->st.st_mtim };
      if ((c.root && lchown (d->path, d->st.st_uid, d->st.st_gid) < 0)
          || chmod (d->path, d->st.st_mode & 07777) < 0
          || utimensat (AT_FDCWD, d->path, ts, AT_SYMLINK_NOFOLLOW) < 0)
        {
          error (0, errno, "cannot set attributes of '%s'", d->path);
          c.failed = 1;
        }
      free (d->path);
    }
  free (c.dirs);
  return c.failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ------------------------------------------------------------------ recover */

static int
recover_cb (const struct bfo_recovered *x, void *arg)
{
  const char *dir = arg;
  if (!x->path)
    {
      if (x->error == EBUSY)
        error (0, 0, "'%s/%s': its writer is still running; left alone", dir, x->journal);
      else if (x->error == EBADMSG)
        error (0, 0, "'%s/%s': not a valid journal (format or checksum); left in place",
               dir, x->journal);
      else if (x->error == ENOTSUP)
        error (0, 0, "'%s/%s': journal of an unsupported version; left in place",
               dir, x->journal);
      else
        error (0, x->error, "cannot recover '%s/%s'", dir, x->journal);
      return 0;
    }
  if (x->fate == BFO_FATE_FAILED)
    error (0, x->error, "cannot complete '%s/%s'", dir, x->path);
  printf ("%-12s %s\n", bfo_fate_name (x->fate), x->path);
  return 0;
}

static void
recover_usage (int status)
{
  if (status != EXIT_SUCCESS)
    {
      fprintf (stderr, "Try '%s recover --help' for more information.\n", program_name);
      exit (status);
    }
  printf ("Usage: %s recover DIR\n", program_name);
  fputs ("\
Complete or roll back the batch writes interrupted in DIR (the directory a batch\n\
writer wrote into; its journals are there, not in subdirectories).  Prints each\n\
file's fate: 'completed' (written now from the durable stem), 'was complete',\n\
'removed' (its data was not durable yet: the partial file is gone), or 'failed'.\n\
Journals of writers still running are left alone: each holds a lock on its\n\
journals, which tells from any pid namespace (containers sharing a volume).\n\
\n\
  -h, --help     display this help and exit\n", stdout);
  exit (status);
}

int
bfo_cmd_recover (int argc, char **argv)
{
  static const struct option opts[] = {
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}
  };
  int ch;
  while ((ch = getopt_long (argc, argv, "h", opts, NULL)) != -1)
    switch (ch)
      {
      case 'h': recover_usage (EXIT_SUCCESS); break;
      default: recover_usage (EXIT_FAILURE);
      }
  if (argc - optind < 1)
    {
      error (0, 0, "missing DIR for recover");
      recover_usage (EXIT_FAILURE);
    }
  if (argc - optind > 1)
    {
      error (0, 0, "extra operand '%s'", argv[optind + 1]);
      recover_usage (EXIT_FAILURE);
    }
  const char *dir = argv[optind];
  int r = bfo_recover (dir, 0, recover_cb, (void *) dir);
  if (r < 0 && r != -EIO)
    error (EXIT_FAILURE, -r, "cannot recover '%s'", dir);
  return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
}
