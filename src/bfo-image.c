/* bfo-image.c: the bfo tool's ext4-image commands: mkimage (populate an unmounted ext4
   image from a tree, the job of mke2fs -d) and plan --write (which write backend, and why).  */

#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "bfo.h"
#include "bfo-cmds.h"
#include "error.h"
#include "progname.h"


/* ------------------------------------------------------------------ IMG:/dir */

bool
bfo_split_image_dst (const char *dst, bool whole, char **image, char **dir)
{
  /* The first ':' whose prefix is an image file or a block device splits; so
     image names may hold ':' and directories may too.  */
  for (const char *c = strchr (dst, ':'); c; c = strchr (c + 1, ':'))
    {
      char *prefix = strndup (dst, c - dst);
      struct stat st;
      if (!prefix)
        bfo_die_nomem ();
      if ((c[1] == '/' || c[1] == '\0') && stat (prefix, &st) == 0
          && (S_ISREG (st.st_mode) || S_ISBLK (st.st_mode)))
        {
          *image = prefix;
          *dir = strdup (c[1] ? c + 1 : "/");
          if (!*dir)
            bfo_die_nomem ();
          return true;
        }
      free (prefix);
    }
  if (!whole)
    return false;
  *image = strdup (dst);
  *dir = strdup ("/");
  if (!*image || !*dir)
    bfo_die_nomem ();
  return true;
}

void
bfo_image_open_error (int status, int err, const char *image, const char *dir)
{
  switch (err)
    {
    case EBUSY:
      error (status, 0, "cannot write into '%s': it is mounted, attached to a loop device "
             "or open in another writer; bfo writes only unmounted ext4 file systems", image);
      break;
    case EPERM:
      error (status, 0, "cannot write into '%s': writing the file system of a block device "
             "needs root", image);
      break;
    case EMEDIUMTYPE:
      error (status, 0, "cannot write into '%s': no ext2/ext3/ext4 file system found", image);
      break;
    case EOPNOTSUPP:
      error (status, 0, "cannot write into '%s': its file system has features the image "
             "backend does not write (it needs extents, no bigalloc, and quota files, if any, "
             "in the kernel's format)", image);
      break;
    case EUCLEAN:
      error (status, 0, "cannot write into '%s': the file system needs a check first "
             "(not cleanly unmounted, errors, or a journal to recover: run e2fsck -f)", image);
      break;
    case ENOENT: case ENOTDIR:
      error (status, err, "cannot write into '%s:%s'", image, dir);
      break;
    default:
      error (status, err, "cannot write into '%s'", image);
    }
}

/* ------------------------------------------------------------------ mkimage */

/* Hard-link groups: the first path written for a (dev, ino) with several links.  */
struct hl
{
  dev_t dev;
  ino_t ino;
  char *path;
};

struct mk
{
  const char *src;              /* without trailing slashes */
  size_t src_len;
  const char *image;
  struct bfo_writer *w;
  struct hl *hl;                /* open hash table */
  size_t hl_n, hl_cap;
  unsigned char *big;           /* a file read in pieces, gathered */
  size_t big_cap;
  uint64_t skipped;
  int failed;
  int stop;
};

static int
mk_write_cb (const struct bfo_written *f, void *arg)
{
  struct mk *m = arg;
  if (f->error)
    {
      bool xattr = f->error_op && strcmp (f->error_op, "xattr") == 0;
      error (0, f->error, "%s '%s' into '%s'",
             xattr ? "cannot set an extended attribute of" : "cannot write", f->path,
             m->image);
      m->failed = 1;
    }
  return 0;
}

static struct bfo_write_attrs
attrs_of (const struct stat *st)
{
  return (struct bfo_write_attrs) {
    .flags = BFO_ATTR_MODE | BFO_ATTR_OWNER | BFO_ATTR_ATIME | BFO_ATTR_MTIME,
    .mode = st->st_mode & 07777, .uid = st->st_uid, .gid = st->st_gid,
    .atime = st->st_atim, .mtime = st->st_mtim,
  };
}

static size_t
hl_slot (const struct mk *m, dev_t dev, ino_t ino)
{
  size_t h = ((size_t) ino * 0x9E3779B97F4A7C15ull ^ (size_t) dev) & (m->hl_cap - 1);
  while (m->hl[h].path && !(m->hl[h].dev == dev && m->hl[h].ino == ino))
    h = (h + 1) & (m->hl_cap - 1);
  return h;
}

/* The first path of ST's hard-link group, or NULL after recording REL as it.  */
static const char *
hl_first (struct mk *m, const struct stat *st, const char *rel)
{
  if (2 * (m->hl_n + 1) > m->hl_cap)
    {
      size_t ocap = m->hl_cap;
      struct hl *old = m->hl;
      m->hl_cap = ocap ? 2 * ocap : 1024;
      m->hl = calloc (m->hl_cap, sizeof *m->hl);
      if (!m->hl)
        bfo_die_nomem ();
      for (size_t i = 0; i < ocap; i++)
        if (old[i].path)
          m->hl[hl_slot (m, old[i].dev, old[i].ino)] = old[i];
      free (old);
    }
  size_t h = hl_slot (m, st->st_dev, st->st_ino);
  if (m->hl[h].path)
    return m->hl[h].path;
  m->hl[h] = (struct hl) { st->st_dev, st->st_ino, strdup (rel) };
  if (!m->hl[h].path)
    bfo_die_nomem ();
  m->hl_n++;
  return NULL;
}

/* The extended attributes of SRCPATH (not followed if a symlink) onto REL, all
   of them, as mke2fs -d copies them (POSIX ACLs included); none where the source
   has no support for them.  */
static void
mk_xattrs (struct mk *m, const char *srcpath, const char *rel)
{
  static char *list, *value;
  static size_t list_cap;
  if (m->stop)
    return;
  if (!value && (!(value = malloc (XATTR_SIZE_MAX))
                 || !(list = malloc (list_cap = 4096))))
    bfo_die_nomem ();
  ssize_t n;
  while ((n = llistxattr (srcpath, list, list_cap)) < 0 && errno == ERANGE)
    {
      ssize_t need = llistxattr (srcpath, NULL, 0);
      if (need < 0)
        break;
      free (list);
      list_cap = need + 256;
      if (!(list = malloc (list_cap)))
        bfo_die_nomem ();
    }
  if (n < 0)
    {
      if (errno != ENOTSUP)
        {
          error (0, errno, "cannot list the extended attributes of '%s'", srcpath);
          m->failed = 1;
        }
      return;
    }
  for (ssize_t i = 0; i < n && !m->stop; i += strlen (list + i) + 1)
    {
      ssize_t k = lgetxattr (srcpath, list + i, value, XATTR_SIZE_MAX);
      if (k < 0 && errno == ENODATA)
        continue;               /* removed since the listing */
      if (k < 0)
        {
          error (0, errno, "cannot read extended attribute '%s' of '%s'", list + i, srcpath);
          m->failed = 1;
          continue;
        }
      m->stop = bfo_writer_setxattr (m->w, rel, list + i, value, k, NULL);
    }
}

static int
mk_read_cb (const struct bfo_file *f, void *arg)
{
  struct mk *m = arg;
  if (f->error)
    {
      error (0, f->error, "cannot read '%s'", f->path);
      m->failed = 1;
      return 0;
    }
  if (m->stop)
    return m->stop;
  const char *rel = f->path + m->src_len + 1;
  if (f->st->st_nlink > 1)
    {
      const char *first = hl_first (m, f->st, rel);
      if (first && strcmp (first, rel) != 0)
        {
          /* Pieces of a large second link: only the first one links.  */
          if (f->offset == 0)
            m->stop = bfo_writer_link (m->w, rel, first, NULL);
          return m->stop;
        }
    }
  const void *data = f->data;
  size_t len = f->len;
  /* Holes stay holes, as mke2fs -d keeps them: only the data ranges are
     gathered, one after the other.  */
  uint64_t data_bytes = 0;
  for (size_t i = 0; i < f->n_ranges; i++)
    data_bytes += f->ranges[i].length;
  bool sparse = data_bytes < (uint64_t) f->st->st_size;
  if (sparse || !(f->offset == 0 && f->last))
    {
      /* A large file comes in pieces: gather it, then write it as one.  */
      size_t size = sparse ? data_bytes : (size_t) f->st->st_size;
      if (f->offset == 0 && size > m->big_cap)
        {
          if (m->big)
            munmap (m->big, m->big_cap);
          m->big = mmap (NULL, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
                         -1, 0);
          if (m->big == MAP_FAILED)
            {
              m->big = NULL;
              m->big_cap = 0;
              return -ENOMEM;
            }
          m->big_cap = size;
        }
      if (sparse)
        {
          uint64_t packed = 0, lo = f->offset, hi = f->offset + f->len;
          for (size_t i = 0; i < f->n_ranges; i++)
            {
              uint64_t a = f->ranges[i].offset, b = a + f->ranges[i].length;
              if (a < hi && b > lo)
                {
                  uint64_t from = a > lo ? a : lo, to = b < hi ? b : hi;
                  if (packed + (from - a) + (to - from) > m->big_cap)
                    return -EIO;
                  memcpy (m->big + packed + (from - a),
                          (const unsigned char *) f->data + (from - lo), to - from);
                }
              packed += f->ranges[i].length;
            }
        }
      else
        {
          if (f->offset + f->len > m->big_cap)
            return -EIO;        /* grew while read: the reader flags it, we do not guess */
          memcpy (m->big + f->offset, f->data, f->len);
        }
      if (!f->last)
        return 0;
      data = m->big;
      len = f->offset + f->len;
    }
  struct bfo_write_attrs a = attrs_of (f->st);
  if (sparse)
    m->stop = bfo_writer_add_sparse (m->w, rel, data, f->ranges, f->n_ranges,
                                     f->st->st_size, &a, NULL);
  else
    m->stop = bfo_writer_add (m->w, rel, data, len, &a, NULL);
  mk_xattrs (m, f->path, rel);
  return m->stop;
}


/* Directories and symlinks under SRC/REL, in name order (the batch reader does
   the regular files).  */
static void
mk_walk (struct mk *m, const char *rel)
{
  char *path;
  if (asprintf (&path, "%s%s%s", m->src, *rel ? "/" : "", rel) < 0)
    bfo_die_nomem ();
  DIR *d = opendir (path);
  if (!d)
    {
      error (0, errno, "cannot read directory '%s'", path);
      m->failed = 1;
      free (path);
      return;
    }
  size_t n;
  struct bfo_dirent *ents = bfo_sorted_names (d, true, &n);
  for (size_t i = 0; i < n; i++)
    {
      char *sub, *srcpath;
      if (asprintf (&sub, "%s%s%s", rel, *rel ? "/" : "", ents[i].name) < 0
          || asprintf (&srcpath, "%s/%s", path, ents[i].name) < 0)
        bfo_die_nomem ();
      struct stat st;
      if (m->stop)
        ;
      else if (lstat (srcpath, &st) < 0)
        {
          error (0, errno, "cannot stat '%s'", srcpath);
          m->failed = 1;
        }
      else if (S_ISDIR (st.st_mode))
        {
          struct bfo_write_attrs a = attrs_of (&st);
          m->stop = bfo_writer_mkdir (m->w, sub, &a, NULL);
          mk_xattrs (m, srcpath, sub);
          if (!m->stop)
            mk_walk (m, sub);
        }
      else if (S_ISLNK (st.st_mode))
        {
          char target[PATH_MAX + 1];
          ssize_t k = readlink (srcpath, target, sizeof target - 1);
          if (k < 0)
            {
              error (0, errno, "cannot read symbolic link '%s'", srcpath);
              m->failed = 1;
            }
          else
            {
              target[k] = '\0';
              struct bfo_write_attrs a = attrs_of (&st);
              m->stop = bfo_writer_symlink (m->w, sub, target, &a, NULL);
              mk_xattrs (m, srcpath, sub);
            }
        }
      else if (!S_ISREG (st.st_mode))
        {
          /* Devices, fifos and sockets, made in the image whoever we are (as
             mke2fs -d does); a second name of one is a hard link.  */
          const char *first = st.st_nlink > 1 ? hl_first (m, &st, sub) : NULL;
          struct bfo_write_attrs a = attrs_of (&st);
          if (first)
            m->stop = bfo_writer_link (m->w, sub, first, NULL);
          else
            {
              m->stop = bfo_writer_mknod (m->w, sub, st.st_mode, st.st_rdev, &a, NULL);
              mk_xattrs (m, srcpath, sub);
            }
        }
      free (sub);
      free (srcpath);
      free (ents[i].name);
    }
  free (ents);
  free (path);
}

static void
print_image_stats (struct bfo_writer *w, uint64_t skipped)
{
  struct bfo_write_stats s;
  bfo_writer_get_stats (w, &s);
  fprintf (stderr, "%s: write stats: backend=%s files=%" PRIu64 " bytes=%" PRIu64
           " batches=%" PRIu64 " errors=%" PRIu64 " image_writes=%" PRIu64
           " image_extents=%" PRIu64 " dirs=%" PRIu64 " symlinks=%" PRIu64
           " links=%" PRIu64 " syncs=%" PRIu64 " skipped=%" PRIu64 "\n",
           program_name, bfo_backend_name (bfo_writer_backend (w)), s.files, s.bytes,
           s.batches, s.errors, s.image_writes, s.image_extents, s.image_dirs,
           s.image_symlinks, s.image_links, s.syncs, skipped);
}

static void
mkimage_usage (int status)
{
  if (status != EXIT_SUCCESS)
    {
      fprintf (stderr, "Try '%s mkimage --help' for more information.\n", program_name);
      exit (status);
    }
  printf ("Usage: %s mkimage [OPTION]... IMAGE SRCDIR\n", program_name);
  fputs ("\
Copy the tree SRCDIR into the existing, unmounted ext4 file system IMAGE (an image\n\
file, or as root a block device), as 'mke2fs -d' does when it makes one: regular\n\
files, directories, symbolic links, hard links, devices, fifos and sockets, with\n\
their modes, owners, access and modification times and extended attributes (POSIX\n\
ACLs included); SRCDIR's own attributes go to the target directory.  Devices are\n\
made whoever runs it, as mke2fs -d makes them; holes stay holes.  Files are read\n\
with the batch reader and written with the ext4 image backend.\n\
\n\
      --dir=PATH           the directory inside IMAGE to fill (default /; created\n\
                             if missing)\n\
      --batch-files=N      files per batch (default 4096)\n\
      --batch-bytes=SIZE   data bytes per batch, suffixes K M G (default 64M)\n\
      --stats              print the writer's counters on stderr (also BFO_STATS=1)\n", stdout);
  fputs (bfo_layout_help, stdout);
  fputs ("\
  -h, --help               display this help and exit\n", stdout);
  exit (status);
}

enum { OPT_DIR = 256, OPT_BATCH_FILES, OPT_BATCH_BYTES, OPT_STATS, OPT_WRITE };

int
bfo_cmd_mkimage (int argc, char **argv)
{
  static const struct option opts[] = {
    {"dir", required_argument, NULL, OPT_DIR},
    {"batch-files", required_argument, NULL, OPT_BATCH_FILES},
    {"batch-bytes", required_argument, NULL, OPT_BATCH_BYTES},
    {"stats", no_argument, NULL, OPT_STATS},
    BFO_LAYOUT_OPTIONS,
    {"help", no_argument, NULL, 'h'},
    {NULL, 0, NULL, 0}
  };
  struct bfo_write_opts o = { .backend = BFO_BACKEND_EXT4IMG, .flags = BFO_WRITE_MKDIRS };
  struct bfo_layout_args la = { 0 };
  const char *dir = "/";
  int stats = getenv ("BFO_STATS") && strcmp (getenv ("BFO_STATS"), "0") != 0;
  int ch;
  while ((ch = getopt_long (argc, argv, "h", opts, NULL)) != -1)
    switch (ch)
      {
      case OPT_DIR: dir = optarg; break;
      case OPT_BATCH_FILES: o.batch_files = bfo_parse_count (optarg, "batch file count", 0); break;
      case OPT_BATCH_BYTES: o.batch_bytes = bfo_parse_count (optarg, "batch size", 1); break;
      case OPT_STATS: stats = 1; break;
      case 'h': mkimage_usage (EXIT_SUCCESS); break;
      default:
        if (!bfo_layout_option (ch, optarg, &la))
          mkimage_usage (EXIT_FAILURE);
      }
  if (argc - optind < 2)
    {
      error (0, 0, "missing IMAGE or SRCDIR for mkimage");
      mkimage_usage (EXIT_FAILURE);
    }
  if (argc - optind > 2)
    {
      error (0, 0, "extra operand '%s'", argv[optind + 2]);
      mkimage_usage (EXIT_FAILURE);
    }
  if (*dir != '/')
    error (EXIT_FAILURE, 0, "--dir must be an absolute path inside the image: '%s'", dir);
  struct mk m = { .image = argv[optind] };
  char *src = strdup (argv[optind + 1]);
  if (!src)
    bfo_die_nomem ();
  size_t sl = strlen (src);
  while (sl > 1 && src[sl - 1] == '/')
    src[--sl] = '\0';
  m.src = src;
  m.src_len = sl;
  struct stat st;
  if (stat (src, &st) < 0)
    error (EXIT_FAILURE, errno, "cannot stat '%s'", src);
  if (!S_ISDIR (st.st_mode))
    error (EXIT_FAILURE, ENOTDIR, "cannot copy '%s'", src);
  struct bfo_layout *layout = bfo_layout_make (&la);
  o.layout = layout;
  int r = bfo_writer_open_image (&m.w, m.image, dir, &o, mk_write_cb, &m);
  if (r < 0)
    bfo_image_open_error (EXIT_FAILURE, -r, m.image, dir);

  struct bfo_write_attrs root = attrs_of (&st);
  m.stop = bfo_writer_mkdir (m.w, ".", &root, NULL);
  mk_xattrs (&m, src, ".");
  if (!m.stop)
    mk_walk (&m, "");
  /* A batch holds a descriptor per file: allow as many as the hard limit.  */
  struct rlimit rl;
  if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max)
    {
      rl.rlim_cur = rl.rlim_max;
      setrlimit (RLIMIT_NOFILE, &rl);
    }
  struct bfo_reader *rd;
  if (!m.stop)
    {
      r = bfo_reader_open (&rd, NULL, mk_read_cb, &m);
      if (r < 0)
        error (EXIT_FAILURE, -r, "cannot start the batch reader");
      r = bfo_reader_add_tree (rd, src);
      if (r == 0)
        r = bfo_reader_flush (rd);
      bfo_reader_close (rd);
      if (r < 0 && !m.stop)
        m.stop = r;
    }
  if (!m.stop)
    m.stop = bfo_writer_flush (m.w);
  if (stats)
    print_image_stats (m.w, m.skipped);
  r = bfo_writer_close (m.w);
  bfo_layout_free (layout);
  if (m.stop < 0)
    error (EXIT_FAILURE, -m.stop, "populating '%s' failed", m.image);
  if (r < 0)
    error (EXIT_FAILURE, -r, "cannot finish writing '%s'", m.image);
  for (size_t i = 0; i < m.hl_cap; i++)
    free (m.hl[i].path);
  free (m.hl);
  if (m.big)
    munmap (m.big, m.big_cap);
  free (src);
  return m.failed ? EXIT_FAILURE : EXIT_SUCCESS;
}

/* ------------------------------------------------------------------ plan --write */

static const char *
fs_name (unsigned long type)
{
  switch (type)
    {
    case 0xEF53: return "ext2/ext3/ext4";
    case 0x58465342: return "xfs";
    case 0x9123683E: return "btrfs";
    case 0x01021994: return "tmpfs";
    case 0x6969: return "nfs";
    case 0x794c7630: return "overlayfs";
    case 0x65735546: return "fuse";
    case 0xF2F52010: return "f2fs";
    case 0x2FC12FC1: return "zfs";
    default: return "other";
    }
}

int
bfo_plan_write (const char *dst)
{
  char *image, *dir;
  if (bfo_split_image_dst (dst, false, &image, &dir))
    {
      struct stat st;
      stat (image, &st);
      printf ("destination: %s\n", dst);
      printf ("image:       %s (%s), directory %s\n", image,
              S_ISBLK (st.st_mode) ? "block device" : "image file", dir);
      int r = bfo_image_check (image, dir);
      if (r < 0)
        {
          printf ("backend:     none\n");
          bfo_image_open_error (0, -r, image, dir);
        }
      else
        printf ("backend:     ext4img (an unmounted ext4 file system: written through "
                "libext2fs, data in runs of free blocks)\n");
      free (image);
      free (dir);
      return r < 0 ? EXIT_FAILURE : EXIT_SUCCESS;
    }
  struct statfs sf;
  const char *where = dst;
  char *parent = NULL;
  if (statfs (dst, &sf) < 0 && errno == ENOENT)
    {
      /* bfo write makes DST in its parent: plan there.  */
      parent = strdup (dst);
      if (!parent)
        error (EXIT_FAILURE, ENOMEM, "cannot plan writing into '%s'", dst);
      size_t len = strlen (parent);
      while (len > 1 && parent[len - 1] == '/')
        parent[--len] = '\0';
      char *slash = strrchr (parent, '/');
      if (!slash)
        strcpy (parent, ".");
      else
        slash[slash == parent] = '\0';
      where = parent;
    }
  if (statfs (where, &sf) < 0)
    error (EXIT_FAILURE, errno, "cannot plan writing into '%s'", dst);
  if (parent)
    printf ("destination: %s (not there yet: bfo write makes it in %s)\n", dst, parent);
  else
    printf ("destination: %s\n", dst);
  printf ("file system: %s (statfs type 0x%lx)\n", fs_name ((unsigned long) sf.f_type),
          (unsigned long) sf.f_type);
  struct bfo_write_opts o = { .backend = BFO_BACKEND_REFLINK, .flags = BFO_WRITE_NO_RECOVER };
  struct bfo_writer *w;
  int r = bfo_writer_open (&w, where, &o, NULL, NULL);
  free (parent);
  if (r == 0)
    {
      bfo_writer_close (w);
      printf ("reflink:     a test clone (FICLONERANGE) between two files there works\n");
      if (sf.f_type == 0x9123683E)
        printf ("backend:     ordered (temporary files written in target order, one sync "
                "per batch); not reflink, which --backend=reflink gives: files cloned "
                "from a stem share its extents, and Btrfs frees an extent only when no "
                "file refers to any of it, so deleting some of them would free no space\n");
      else if (sf.f_type != 0x58465342)
        printf ("backend:     ordered (temporary files written in target order, one sync "
                "per batch); not reflink, which --backend=reflink gives: whether this "
                "file system frees a stem's blocks file by file, as XFS does, is not "
                "known (an overlay on Btrfs does not)\n");
      else
        printf ("backend:     reflink (stem + clones)\n");
      return EXIT_SUCCESS;
    }
  if (r != -EOPNOTSUPP)
    {
      printf ("backend:     none\n");
      error (EXIT_FAILURE, -r, "cannot write into '%s'", dst);
    }
  printf ("reflink:     a test clone (FICLONERANGE) is refused there\n");
  printf ("backend:     ordered (temporary files written in target order, one sync "
          "per batch)\n");
  return EXIT_SUCCESS;
}
