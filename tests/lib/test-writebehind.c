/* test-writebehind.c: bfo_write_behind_trim on XFS.  A file that replaced an
   existing one's data (O_TRUNC) and is written back before its last writable
   descriptor is closed keeps XFS's speculative preallocation past its end
   (until XFS's background trim, minutes later); the trim gives it back when a
   write-back ran while the file was written, and leaves alone files made
   since the helper started (their close gives the blocks back) and files no
   write-back overlapped.  Needs a directory on XFS in BFO_TEST_XFS_DIR:
   tests/tar-extract.bats runs it on an XFS image it makes (as root, with
   loop devices).  */

#include <config.h>

#include "bfo.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "check.h"

/* Mostly zeros, written dense, as in session 26's randomized comparison.  */
enum { SIZE = 5922994 };
static unsigned char data[SIZE];

static int
write_all (int fd)
{
  for (size_t off = 0; off < SIZE; )
    {
      ssize_t w = write (fd, data + off, SIZE - off);
      if (w <= 0)
        return -1;
      off += w;
    }
  return 0;
}

static long long
blocks_of (int dirfd, const char *name)
{
  struct stat st;
  return fstatat (dirfd, name, &st, 0) == 0 ? (long long) st.st_blocks : -1;
}

static int
same_data (int dirfd, const char *name)
{
  int fd = openat (dirfd, name, O_RDONLY);
  if (fd < 0)
    return 0;
  static unsigned char back[SIZE];
  size_t off = 0;
  ssize_t r;
  while (off < SIZE && (r = read (fd, back + off, SIZE - off)) > 0)
    off += r;
  char extra;
  int ok = off == SIZE && read (fd, &extra, 1) == 0 && memcmp (back, data, SIZE) == 0;
  close (fd);
  return ok;
}

/* Write NAME (replacing it with O_TRUNC if REPLACE, else new), with a
   write-back through WB under way and the file's own data written back before
   the trim if OVERLAP; return what the trim returned, and the file's blocks
   after its close and a sync in *BLOCKS.  */
static int
write_one (struct bfo_write_behind *wb, int dirfd, const char *name, int replace,
           int overlap, long long *blocks)
{
  int fd = openat (dirfd, name, O_WRONLY | O_CREAT | (replace ? O_TRUNC : O_EXCL), 0644);
  if (fd < 0)
    return -1000;
  uint64_t mark = bfo_write_behind_mark (wb);
  if (write_all (fd) != 0)
    return -1001;
  if (overlap)
    {
      /* a write-back falls due on the directory and starts at the next call */
      bfo_write_behind_note (wb, dirfd, (uint64_t) 64 << 20);
      bfo_write_behind_mark (wb);
      /* (the helper's thread starts it: on a loaded machine the trim came
         first in one run of make check, and found no write-back) */
      for (int i = 0; i < 10000 && bfo_write_behind_mark (wb) == mark; i++)
        usleep (1000);
      syncfs (fd);              /* the file written back before its close */
    }
  int r = bfo_write_behind_trim (wb, fd, SIZE, mark);
  close (fd);
  sync ();
  *blocks = blocks_of (dirfd, name);
  return r;
}

int
main (void)
{
  const char *dir = getenv ("BFO_TEST_XFS_DIR");
  if (!dir || !*dir)
    {
      printf ("SKIP: BFO_TEST_XFS_DIR (a directory on XFS) not set;"
              " tests/tar-extract.bats runs this on an XFS image\n");
      return 77;
    }
  int dirfd = open (dir, O_RDONLY | O_DIRECTORY);
  struct statfs sf;
  check (dirfd >= 0 && fstatfs (dirfd, &sf) == 0 && sf.f_type == 0x58465342,
         "BFO_TEST_XFS_DIR is a directory on XFS");
  if (failures)
    return 1;
  for (size_t i = 0; i < SIZE; i += 65536)
    data[i] = (unsigned char) (i / 65536 + 1);
  data[SIZE - 1] = 0x5a;
  long long need = ((long long) SIZE + sf.f_bsize - 1) / sf.f_bsize * sf.f_bsize / 512;

  /* older files, made before the helper starts */
  const char *old[] = { "old-overlap", "old-quiet", "old-control" };
  for (size_t i = 0; i < sizeof old / sizeof *old; i++)
    {
      int fd = openat (dirfd, old[i], O_WRONLY | O_CREAT | O_EXCL, 0644);
      check (fd >= 0 && write_all (fd) == 0 && close (fd) == 0, "an older file is written");
    }
  sync ();
  sleep (1);                    /* (a coarse clock apart from the helper's start) */

  struct bfo_write_behind *wb;
  check (bfo_write_behind_new (&wb, (uint64_t) 1 << 20, 0) == 0, "the helper starts");
  long long blocks;

  /* the kernel's behaviour this works around (told, not checked: a kernel
     that trims such a file at its close makes the trim unnecessary) */
  {
    int fd = openat (dirfd, "old-control", O_WRONLY | O_TRUNC);
    check (fd >= 0 && write_all (fd) == 0, "the control file is rewritten");
    syncfs (fd);
    close (fd);
    sync ();
    printf ("note: a file replaced, written back before its close, no trim: %lld sectors"
            " (%lld needed)\n", blocks_of (dirfd, "old-control"), need);
  }

  int r = write_one (wb, dirfd, "old-overlap", 1, 1, &blocks);
  printf ("note: trim returned %d, %lld sectors after (%lld needed)\n", r, blocks, need);
  check (r == 1 || r == 0, "the trim of a replaced file a write-back overlapped succeeds");
  check (blocks == need, "it keeps no block past its end");
  check (same_data (dirfd, "old-overlap"), "its size and data are unchanged");

  r = write_one (wb, dirfd, "new-overlap", 0, 1, &blocks);
  check (r == 0, "a file made since the helper started is left to its close");
  check (blocks == need, "and keeps no block past its end");
  check (same_data (dirfd, "new-overlap"), "its size and data are unchanged");

  r = write_one (wb, dirfd, "old-quiet", 1, 0, &blocks);
  check (r == 0, "a replaced file no write-back overlapped is left to its close");
  check (same_data (dirfd, "old-quiet"), "its size and data are unchanged");

  check (bfo_write_behind_trim (NULL, dirfd, 0, 1) == 0, "no helper, nothing to do");

  struct bfo_write_behind_stats st;
  bfo_write_behind_free (wb, &st);
  printf ("note: %llu write-backs, %llu trimmed\n", (unsigned long long) st.writebacks,
          (unsigned long long) st.trimmed);
  check (st.writebacks >= 1, "write-backs ran");
  check (st.trimmed <= 1, "only the replaced, overlapped file was trimmed");
  close (dirfd);
  return failures ? 1 : 0;
}
