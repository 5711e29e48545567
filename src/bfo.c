/* bfo.c: the bfo admin tool: features, read (batch read a tree), plan (what a batch
   read would do); write and recover come with batch write.  A thin front end over libbfo.  */

#include <config.h>

#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include "bfo.h"
#include "bfo-cmds.h"
#include "error.h"
#include "progname.h"
#include "sha256.h"
#include "version-etc.h"

/* version-etc prints this with "(C)" and the year; bfo is not FSF-copyrighted.  */
const char version_etc_copyright[] = "Copyright %s %d the bfo developers";

enum { OPT_RAW = 256, OPT_NO_DIRECT, OPT_DEPTH, OPT_BATCH_FILES, OPT_BATCH_BYTES,
       OPT_BATCH_MS, OPT_WINDOW_FILES, OPT_NO_PREFETCH, OPT_DISCARD, OPT_STATS, OPT_WRITE,
       OPT_RAW_GAP };

static const struct option long_options[] =
{
  {"raw", no_argument, NULL, OPT_RAW},
  {"raw-gap", required_argument, NULL, OPT_RAW_GAP},
  {"no-direct", no_argument, NULL, OPT_NO_DIRECT},
  {"depth", required_argument, NULL, OPT_DEPTH},
  {"io-depth", required_argument, NULL, OPT_DEPTH},
  {"batch-files", required_argument, NULL, OPT_BATCH_FILES},
  {"batch-bytes", required_argument, NULL, OPT_BATCH_BYTES},
  {"batch-ms", required_argument, NULL, OPT_BATCH_MS},
  {"window-files", required_argument, NULL, OPT_WINDOW_FILES},
  {"no-prefetch", no_argument, NULL, OPT_NO_PREFETCH},
  {"discard", no_argument, NULL, OPT_DISCARD},
  {"stats", no_argument, NULL, OPT_STATS},
  {"write", required_argument, NULL, OPT_WRITE},
  BFO_LAYOUT_OPTIONS,
  {"help", no_argument, NULL, 'h'},
  {"version", no_argument, NULL, 'V'},
  {NULL, 0, NULL, 0}
};

static void
usage (int status)
{
  if (status != EXIT_SUCCESS)
    {
      fprintf (stderr, "Try '%s --help' for more information.\n", program_name);
      exit (status);
    }
  printf ("Usage: %s [OPTION]... COMMAND [ARG]...\n", program_name);
  fputs ("\
Inspect and administer bfo batch-file operations.\n\
\n\
Commands:\n\
  features       list the features this libbfo build and kernel offer\n\
  read PATH...   read every regular file under PATH through the batch reader\n\
                   and print 'SHA256  SIZE  PATH' per file, sorted by path\n\
  plan PATH...   show what a batch read of PATH would do: files, extents,\n\
                   requests, sequential fraction, fallbacks and why\n\
  plan --write DST  show which write backend DST gets and why (DST a directory,\n\
                   or IMAGE:/DIR for a directory in an unmounted ext4 image)\n\
  plan --write DST --layout=POLICY [SRC]  also the layout: with SRC, the groups\n\
                   each batch of SRC's files forms and why (see 'bfo write --help'\n\
                   for the policies and the --trace-* options)\n\
  write SRC DST  copy the regular files under SRC to DST through the batch\n\
                   writer (see 'bfo write --help')\n\
  mkimage IMAGE SRCDIR  copy a tree into an unmounted ext4 image, as mke2fs -d\n\
                   does (see 'bfo mkimage --help')\n\
  recover DIR    complete or roll back interrupted batch writes into DIR\n\
\n\
Options for read and plan:\n\
      --raw                root: read merged extents from the block device\n\
                             (ext2/3/4, XFS); others fall back per file\n\
      --raw-gap=SIZE       raw mode: read a gap of up to SIZE between two\n\
                             extents rather than issue another request\n\
                             (default 32K)\n\
      --no-direct          buffered reads (still batched, in physical order)\n\
      --depth=N            io_uring queue depth (default 256)\n\
      --batch-files=N      files read together (open at once; default 8192)\n\
      --window-files=N     files mapped and sorted together (default 131072)\n\
      --no-prefetch        root on ext4: do not read inode tables ahead\n\
      --batch-bytes=SIZE   data bytes per batch, suffixes K M G (default 64M)\n\
      --batch-ms=N         cut the first window when its first file waited N ms\n\
                             (default 100)\n\
      --discard            read but print nothing per file (read only)\n\
      --stats              print the reader's counters on stderr (also BFO_STATS=1)\n\
\n\
  -h, --help     display this help and exit\n\
  -V, --version  output version information and exit\n\
\n\
bfocp(1) and bfotar(1) are GNU cp and GNU tar with batched file I/O.\n", stdout);
  printf ("\nReport bugs to: %s\n", PACKAGE_BUGREPORT);
  exit (status);
}

static int
cmd_features (void)
{
  unsigned int have = bfo_features ();
  static const unsigned int all[] = { BFO_FEATURE_IO_URING, BFO_FEATURE_EXT4IMG };
  printf ("libbfo %s\n", bfo_version ());
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    printf ("%-10s %s\n", bfo_feature_name (all[i]), (have & all[i]) ? "yes" : "no");
  printf ("%-10s %s\n", "libext2fs", bfo_ext2fs_version ());
  return EXIT_SUCCESS;
}

/* A positive count (or with ALLOW_SUFFIX a size with K, M, G, KiB... suffixes)
   from the command line; exits with a message naming WHAT if it is not one.
   Counts fit an unsigned int, sizes 4 TiB.  */
uint64_t
bfo_parse_count (const char *arg, const char *what, int allow_suffix)
{
  char *end;
  errno = 0;
  unsigned long long v = strtoull (arg, &end, 10);
  uint64_t mult = 1;
  if (allow_suffix && *end)
    {
      switch (*end)
        {
        case 'k': case 'K': mult = 1ull << 10; break;
        case 'm': case 'M': mult = 1ull << 20; break;
        case 'g': case 'G': mult = 1ull << 30; break;
        default: mult = 0;
        }
      if (mult && (end[1] == '\0' || strcmp (end + 1, "iB") == 0))
        end += strlen (end);
    }
  if (errno || end == arg || *end || !mult || v == 0 || v > UINT64_MAX / mult
      || v * mult > UINT32_MAX * (allow_suffix ? 1024ull : 1) || *arg == '-')
    error (EXIT_FAILURE, 0, "invalid %s: '%s'", what, arg);
  return v * mult;
}

/* What 'bfo read' keeps per file: its manifest line, sorted at the end.  */
struct line
{
  char *path;
  char hex[65];
  uint64_t size;
};

struct read_state
{
  int discard;
  struct sha256_ctx ctx;
  struct line *lines;
  size_t n, cap;
  int failed;
};

static int
read_cb (const struct bfo_file *f, void *arg)
{
  struct read_state *s = arg;
  if (f->error)
    {
      error (0, f->error, "cannot read '%s'", f->path);
      s->failed = 1;
      return 0;
    }
  if (s->discard)
    return 0;
  /* Pieces of one file come in order and are not interleaved with other files.  */
  if (f->offset == 0)
    sha256_init_ctx (&s->ctx);
  sha256_process_bytes (f->data, f->len, &s->ctx);
  if (!f->last)
    return 0;
  unsigned char digest[32];
  sha256_finish_ctx (&s->ctx, digest);
  if (s->n == s->cap)
    {
      s->cap = s->cap ? 2 * s->cap : 1024;
      s->lines = realloc (s->lines, s->cap * sizeof *s->lines);
      if (!s->lines)
        return -ENOMEM;
    }
  struct line *l = &s->lines[s->n++];
  l->path = strdup (f->path);
  if (!l->path)
    return -ENOMEM;
  for (int i = 0; i < 32; i++)
    sprintf (l->hex + 2 * i, "%02x", digest[i]);
  l->size = f->offset + f->len;
  return 0;
}

static int
by_path (const void *a, const void *b)
{
  return strcmp (((const struct line *) a)->path, ((const struct line *) b)->path);
}

static void
print_stats (const struct bfo_read_stats *st)
{
  fprintf (stderr, "%s: stats: files=%" PRIu64 " bytes=%" PRIu64 " batches=%" PRIu64
           " extents=%" PRIu64 " requests=%" PRIu64 " merged=%" PRIu64 " holes=%" PRIu64
           " unwritten=%" PRIu64 " fallback_no_fiemap=%" PRIu64 " fallback_inline=%" PRIu64
           " fallback_encoded=%" PRIu64 " fallback_unaligned=%" PRIu64
           " fallback_delalloc=%" PRIu64 " fallback_changed=%" PRIu64
           " fallback_other=%" PRIu64 " raw_files=%" PRIu64 " raw_gap_bytes=%" PRIu64
           " fallback_no_raw=%" PRIu64 " errors=%" PRIu64 " ms_meta=%" PRIu64
           " ms_reopen=%" PRIu64 " ms_read=%" PRIu64 " ms_deliver=%" PRIu64
           " prefetch_requests=%" PRIu64 " cached=%" PRIu64 " pread_threads=%" PRIu64
           " size_not_end=%" PRIu64 " cache_unknown=%" PRIu64 "\n",
           program_name, st->files, st->bytes, st->batches, st->extents, st->requests,
           st->merged, st->holes, st->unwritten, st->fallback_no_fiemap,
           st->fallback_inline, st->fallback_encoded, st->fallback_unaligned,
           st->fallback_delalloc, st->fallback_changed, st->fallback_other, st->raw_files,
           st->raw_gap_bytes, st->fallback_no_raw, st->errors, st->us_meta / 1000,
           st->us_reopen / 1000, st->us_read / 1000, st->us_deliver / 1000,
           st->prefetch_requests, st->cached, st->pread_threads, st->size_not_end,
           st->cache_unknown);
}

static int
cmd_read (char **paths, int n, const struct bfo_read_opts *o, int discard, int stats)
{
  struct read_state s = { .discard = discard };
  struct bfo_reader *r;
  int ret = bfo_reader_open (&r, o, read_cb, &s);
  if (ret < 0)
    error (EXIT_FAILURE, -ret, "cannot start the batch reader");
  for (int i = 0; i < n && ret == 0; i++)
    ret = bfo_reader_add_tree (r, paths[i]);
  if (ret == 0)
    ret = bfo_reader_flush (r);
  struct bfo_read_stats st;
  bfo_reader_get_stats (r, &st);
  bfo_reader_close (r);
  if (ret < 0)
    error (EXIT_FAILURE, -ret, "batch read failed");
  qsort (s.lines, s.n, sizeof *s.lines, by_path);
  for (size_t i = 0; i < s.n; i++)
    {
      printf ("%s  %" PRIu64 "  %s\n", s.lines[i].hex, s.lines[i].size, s.lines[i].path);
      free (s.lines[i].path);
    }
  free (s.lines);
  if (stats)
    print_stats (&st);
  return s.failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

static int
cmd_plan (char **paths, int n, const struct bfo_read_opts *o, int stats)
{
  struct bfo_plan p;
  int ret = bfo_plan_tree ((const char *const *) paths, n, o, &p);
  if (ret < 0)
    error (EXIT_FAILURE, -ret, "cannot plan the batch read");
  printf ("files:      %" PRIu64 "\n", p.files);
  printf ("bytes:      %" PRIu64 "\n", p.bytes);
  printf ("extents:    %" PRIu64 " (joined with a neighbour: %" PRIu64 ")\n", p.extents, p.merged);
  printf ("requests:   %" PRIu64 " (mean %.1f KiB)\n", p.requests,
          p.requests ? p.request_bytes / 1024.0 / p.requests : 0.0);
  printf ("sequential: %.3f (%" PRIu64 " requests start where the previous ended)\n",
          p.requests > 1 ? (double) p.sequential / (p.requests - 1) : 1.0, p.sequential);
  printf ("unread:     holes %" PRIu64 ", unwritten %" PRIu64 "\n", p.why.holes, p.why.unwritten);
  printf ("fallbacks:  no-fiemap %" PRIu64 ", inline %" PRIu64 ", encoded %" PRIu64
          ", unaligned %" PRIu64 ", delalloc %" PRIu64 "\n",
          p.why.fallback_no_fiemap, p.why.fallback_inline, p.why.fallback_encoded,
          p.why.fallback_unaligned, p.why.fallback_delalloc);
  printf ("errors:     %" PRIu64 "\n", p.why.errors);
  if (stats)
    print_stats (&p.why);
  return p.why.errors ? EXIT_FAILURE : EXIT_SUCCESS;
}

int
main (int argc, char **argv)
{
  set_program_name (argv[0]);
  /* write and recover parse their own options.  */
  if (argc > 1 && strcmp (argv[1], "write") == 0)
    return bfo_cmd_write (argc - 1, argv + 1);
  if (argc > 1 && strcmp (argv[1], "recover") == 0)
    return bfo_cmd_recover (argc - 1, argv + 1);
  if (argc > 1 && strcmp (argv[1], "mkimage") == 0)
    return bfo_cmd_mkimage (argc - 1, argv + 1);

  struct bfo_read_opts o = { 0 };
  int discard = 0, stats = getenv ("BFO_STATS") && strcmp (getenv ("BFO_STATS"), "0") != 0;
  int raw = 0;
  const char *write_dst = NULL;
  struct bfo_layout_args la = { 0 };
  int c;
  while ((c = getopt_long (argc, argv, "hV", long_options, NULL)) != -1)
    switch (c)
      {
      case OPT_RAW: raw = 1; break;
      case OPT_RAW_GAP: o.raw_gap_bytes = bfo_parse_count (optarg, "raw gap", 1); break;
      case OPT_NO_DIRECT: o.flags |= BFO_READ_NO_DIRECT; break;
      case OPT_DEPTH: o.io_depth = bfo_parse_count (optarg, "queue depth", 0); break;
      case OPT_BATCH_FILES: o.batch_files = bfo_parse_count (optarg, "batch file count", 0); break;
      case OPT_BATCH_BYTES: o.batch_bytes = bfo_parse_count (optarg, "batch size", 1); break;
      case OPT_BATCH_MS: o.batch_ms = bfo_parse_count (optarg, "batch time", 0); break;
      case OPT_WINDOW_FILES: o.window_files = bfo_parse_count (optarg, "window file count", 0); break;
      case OPT_NO_PREFETCH: o.flags |= BFO_READ_NO_PREFETCH; break;
      case OPT_DISCARD: discard = 1; break;
      case OPT_STATS: stats = 1; break;
      case OPT_WRITE: write_dst = optarg; break;
      case 'h':
        usage (EXIT_SUCCESS);
        break;
      case 'V':
        version_etc (stdout, "bfo", PACKAGE_NAME, PACKAGE_VERSION, "the bfo developers",
                     (char *) NULL);
        printf ("\nlibbfo %s\n", bfo_version ());
        return EXIT_SUCCESS;
      default:
        if (!bfo_layout_option (c, optarg, &la))
          usage (EXIT_FAILURE);
      }

  if (optind == argc)
    {
      error (0, 0, "missing command");
      usage (EXIT_FAILURE);
    }
  const char *cmd = argv[optind++];
  int nargs = argc - optind;
  if (strcmp (cmd, "features") == 0)
    {
      if (nargs)
        {
          error (0, 0, "extra operand '%s'", argv[optind]);
          usage (EXIT_FAILURE);
        }
      return cmd_features ();
    }
  if (strcmp (cmd, "plan") == 0 && write_dst)
    {
      if (nargs > (la.spec ? 1 : 0))
        {
          error (0, 0, "extra operand '%s'", argv[optind + (la.spec ? 1 : 0)]);
          usage (EXIT_FAILURE);
        }
      int s = bfo_plan_write (write_dst);
      if (la.spec)
        {
          int ls = bfo_plan_layout (nargs ? argv[optind] : NULL, &la, o.batch_files,
                                    o.batch_bytes);
          if (s == EXIT_SUCCESS)
            s = ls;
        }
      return s;
    }
  if (strcmp (cmd, "read") == 0 || strcmp (cmd, "plan") == 0)
    {
      if (nargs == 0)
        {
          error (0, 0, "missing PATH for %s", cmd);
          usage (EXIT_FAILURE);
        }
      if (raw)
        o.flags |= BFO_READ_RAW;
      /* A batch holds a descriptor per file: allow as many as the hard limit.  */
      struct rlimit rl;
      if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
        {
          rl.rlim_cur = rl.rlim_max;
          setrlimit (RLIMIT_NOFILE, &rl);
        }
      if (cmd[0] == 'r')
        return cmd_read (argv + optind, nargs, &o, discard, stats);
      return cmd_plan (argv + optind, nargs, &o, stats);
    }
  error (0, 0, "unknown command '%s'", cmd);
  usage (EXIT_FAILURE);
}
