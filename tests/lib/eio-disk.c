/* eio-disk: a disk image with bad sectors, for the read-error tests.

   eio-disk IMAGE MOUNTPOINT [-o FUSE-OPTIONS] [[w:|rw:]START+LENGTH | stale:N ...]

   Mounts a FUSE file system at MOUNTPOINT holding one file, "disk", whose
   contents are IMAGE's.  A read that touches one of the byte ranges given
   fails with EIO, as a disk's bad sector does; writes go through.  With
   "w:" it is writes that fail there, with "rw:" both.  Attach
   MOUNTPOINT/disk to a loop device and mount that: the file system on it
   then reads EIO from those ranges.  This machine's kernel has neither
   device-mapper nor fault injection, so this is how the tests make one.

   With "stale:N", "disk" claims N bytes (and blocks) more than IMAGE has and
   its reads end where IMAGE ends, as a file whose size a network file system
   has not caught up with: readers meet the end of the file before its size.

   Runs in the foreground, single-threaded, until MOUNTPOINT is unmounted.  */

#define FUSE_USE_VERSION 31
#include <fuse.h>

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct range
{
  uint64_t start, length;
  bool reads, writes;           /* which fail there */
};

static int image_fd = -1;
static struct range *bad;
static size_t n_bad;
static unsigned long eio_count;
static int64_t stale_bytes;      /* claimed beyond IMAGE's end (< 0: short of it) */

static bool
touches_bad (uint64_t off, uint64_t len, bool write)
{
  for (size_t i = 0; i < n_bad; i++)
    if ((write ? bad[i].writes : bad[i].reads)
        && off < bad[i].start + bad[i].length && bad[i].start < off + len)
      return true;
  return false;
}

static int
disk_getattr (const char *path, struct stat *st, struct fuse_file_info *fi)
{
  (void) fi;
  memset (st, 0, sizeof *st);
  if (strcmp (path, "/") == 0)
    {
      st->st_mode = S_IFDIR | 0755;
      st->st_nlink = 2;
      return 0;
    }
  if (strcmp (path, "/disk") != 0)
    return -ENOENT;
  struct stat img;
  if (fstat (image_fd, &img) < 0)
    return -errno;
  st->st_mode = S_IFREG | 0600;
  st->st_nlink = 1;
  st->st_size = img.st_size + stale_bytes;
  st->st_blocks = stale_bytes > 0 ? img.st_blocks + stale_bytes / 512 : img.st_blocks;
  return 0;
}

static int
disk_readdir (const char *path, void *buf, fuse_fill_dir_t fill,
              off_t off, struct fuse_file_info *fi,
              enum fuse_readdir_flags flags)
{
  (void) off, (void) fi, (void) flags;
  if (strcmp (path, "/") != 0)
    return -ENOENT;
  fill (buf, ".", NULL, 0, 0);
  fill (buf, "..", NULL, 0, 0);
  fill (buf, "disk", NULL, 0, 0);
  return 0;
}

static int
disk_open (const char *path, struct fuse_file_info *fi)
{
  if (strcmp (path, "/disk") != 0)
    return -ENOENT;
  /* No page cache of ours: every read the loop device makes comes here.  */
  fi->direct_io = 1;
  return 0;
}

static int
disk_read (const char *path, char *buf, size_t size, off_t off,
           struct fuse_file_info *fi)
{
  (void) path, (void) fi;
  if (touches_bad (off, size, false))
    {
      eio_count++;
      return -EIO;
    }
  ssize_t n = pread (image_fd, buf, size, off);
  return n < 0 ? -errno : (int) n;
}

static int
disk_write (const char *path, const char *buf, size_t size, off_t off,
            struct fuse_file_info *fi)
{
  (void) path, (void) fi;
  if (touches_bad (off, size, true))
    {
      eio_count++;
      return -EIO;
    }
  ssize_t n = pwrite (image_fd, buf, size, off);
  return n < 0 ? -errno : (int) n;
}

static int
disk_fsync (const char *path, int datasync, struct fuse_file_info *fi)
{
  (void) path, (void) fi;
  return (datasync ? fdatasync (image_fd) : fsync (image_fd)) < 0 ? -errno : 0;
}

static void
disk_destroy (void *data)
{
  (void) data;
  fprintf (stderr, "eio-disk: %lu reads or writes failed\n", eio_count);
}

static const struct fuse_operations ops = {
  .getattr = disk_getattr,
  .readdir = disk_readdir,
  .open = disk_open,
  .read = disk_read,
  .write = disk_write,
  .fsync = disk_fsync,
  .destroy = disk_destroy,
};

int
main (int argc, char **argv)
{
  if (argc < 3)
    {
      fprintf (stderr, "usage: %s IMAGE MOUNTPOINT [-o FUSE-OPTIONS] "
               "[[w:|rw:]START+LENGTH | stale:N ...]\n", argv[0]);
      return 2;
    }
  char *fargv[] = { argv[0], "-f", "-s", argv[2], "-o", NULL, NULL };
  int fargc = 4, first = 3;
  if (argc >= 5 && strcmp (argv[3], "-o") == 0)
    {
      fargv[5] = argv[4];
      fargc = 6, first = 5;
    }
  image_fd = open (argv[1], O_RDWR);
  if (image_fd < 0)
    {
      fprintf (stderr, "%s: %s: %s\n", argv[0], argv[1], strerror (errno));
      return 1;
    }
  n_bad = argc - first;
  bad = calloc (n_bad ? n_bad : 1, sizeof *bad);
  for (size_t i = 0; i < n_bad; i++)
    {
      char *arg = argv[first + i], *end;
      if (strncmp (arg, "stale:", 6) == 0)
        {
          stale_bytes = strtoll (arg + 6, &end, 0);
          if (*end || end == arg + 6)
            {
              fprintf (stderr, "%s: bad '%s' (want stale:N)\n", argv[0], arg);
              return 2;
            }
          continue;             /* (its range stays empty: never touched) */
        }
      bad[i].reads = true;
      if (strncmp (arg, "w:", 2) == 0 || strncmp (arg, "rw:", 3) == 0)
        {
          bad[i].reads = arg[0] == 'r';
          bad[i].writes = true;
          arg = strchr (arg, ':') + 1;
        }
      bad[i].start = strtoull (arg, &end, 0);
      if (*end != '+' || (bad[i].length = strtoull (end + 1, &end, 0)) == 0
          || *end)
        {
          fprintf (stderr, "%s: bad range '%s' (want START+LENGTH)\n",
                   argv[0], arg);
          return 2;
        }
    }
  return fuse_main (fargc, fargv, &ops, NULL);
}
