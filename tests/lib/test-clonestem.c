/* test-clonestem.c: the clone stem's staging on its own thread
   (bfo_clone_stem_stage_async), with stems small enough that a new one
   starts every few runs while the files of the run before are still cloned
   from the old one.  Runs alternate between block-aligned buffers (written
   with O_DIRECT) and buffers off by a byte (through the page cache), so one
   stem gets both.  Needs a directory on a file system that clones, in
   BFO_TEST_CLONE_DIR: tests/cp-batch.bats runs it on a Btrfs image it makes
   (as root, with loop devices).  */

#define STEM_MAX ((uint64_t) 96 << 10)
#include "../../lib/clonestem.c"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"

enum { RUNS = 40, PER_RUN = 7, BS_MAX = 65536 };

/* The byte at offset K of buffer I.  */
static unsigned char
pattern (size_t i, size_t k)
{
  return (unsigned char) (i * 131 + k / 512 * 7 + 1);
}

int
main (void)
{
  const char *dir = getenv ("BFO_TEST_CLONE_DIR");
  if (!dir || !*dir)
    {
      printf ("SKIP: BFO_TEST_CLONE_DIR (a directory on a file system that clones) not set;"
              " tests/cp-batch.bats runs this on Btrfs\n");
      return 77;
    }
  struct bfo_clone_stem *cs;
  int r = bfo_clone_stem_new (&cs, dir, 0);
  check (r == 0, "a stem opens in the directory");
  if (r != 0)
    return 1;
  size_t bs = cs->bs;
  /* Buffers of 1 to 5 blocks, some with a partial last block; block-aligned
     in even runs, a byte off in odd ones.  */
  size_t n = RUNS * PER_RUN;
  struct iovec *bufs = calloc (n, sizeof *bufs);
  unsigned char **mem = calloc (n, sizeof *mem);
  int64_t *at = calloc (n, sizeof *at);
  for (size_t i = 0; i < n; i++)
    {
      size_t len = (i % 5 + 1) * bs + (i % 3 == 0 ? 100 : 0);
      void *m = NULL;
      if (posix_memalign (&m, bs, len + bs) != 0)
        return 1;
      mem[i] = m;
      unsigned char *p = mem[i] + (i / PER_RUN % 2);
      for (size_t k = 0; k < len; k++)
        p[k] = pattern (i, k);
      bufs[i] = (struct iovec) { p, len };
    }
  /* Stage run k+1 while run k is cloned, as bfocp does.  */
  size_t bad = 0, cloned = 0, sizes_bad = 0;
  bfo_clone_stem_stage_async (cs, bufs, PER_RUN, at);
  bfo_clone_stem_wait (cs);
  for (size_t run = 0; run < RUNS; run++)
    {
      size_t first = run * PER_RUN;
      if (run + 1 < RUNS)
        bfo_clone_stem_stage_async (cs, bufs + first + PER_RUN, PER_RUN, at + first + PER_RUN);
      for (size_t i = first; i < first + PER_RUN; i++)
        {
          char name[64];
          snprintf (name, sizeof name, "%s/f%zu", dir, i);
          int fd = open (name, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
          if (fd < 0)
            {
              bad++;
              continue;
            }
          size_t got = bfo_clone_stem_clone (cs, fd, at[i], bufs[i].iov_len);
          cloned += got > 0;
          const unsigned char *p = bufs[i].iov_base;
          if (pwrite (fd, p + got, bufs[i].iov_len - got, got)
              != (ssize_t) (bufs[i].iov_len - got))
            bad++;
          unsigned char *back = malloc (bufs[i].iov_len);
          if (pread (fd, back, bufs[i].iov_len, 0) != (ssize_t) bufs[i].iov_len
              || memcmp (back, p, bufs[i].iov_len) != 0)
            bad++;
          struct stat st;
          if (fstat (fd, &st) != 0 || (size_t) st.st_size != bufs[i].iov_len)
            sizes_bad++;
          free (back);
          close (fd);
          unlink (name);
        }
      if (run + 1 < RUNS)
        bfo_clone_stem_wait (cs);
    }
  struct bfo_clone_stem_stats st;
  bfo_clone_stem_free (cs, &st);
  check (bad == 0, "every file has its own bytes, cloned from a stem or written");
  check (sizes_bad == 0, "every file has its size");
  check (cloned == n, "every file's whole blocks were cloned");
  check (st.stems >= 10, "new stems started while the run before was being cloned");
  check (st.cloned == n && st.failed == 0, "the counts agree: clones made, none refused");
  check (st.direct > 0 && st.direct < st.writes,
         "aligned runs written with O_DIRECT, the others through the page cache");
  printf ("stems %llu, files %llu, writes %llu (%llu direct), cloned %llu\n",
          (unsigned long long) st.stems, (unsigned long long) st.files,
          (unsigned long long) st.writes, (unsigned long long) st.direct,
          (unsigned long long) st.cloned);
  for (size_t i = 0; i < n; i++)
    free (mem[i]);
  free (mem);
  free (bufs);
  free (at);
  return failures ? 1 : 0;
}
