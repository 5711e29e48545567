/* test-writer.c: the batch writer API on whatever file system holds $TMPDIR: bad paths
   fail with EINVAL per file, parents are needed (or made with BFO_WRITE_MKDIRS), modes and
   times are applied exactly, the same path twice keeps the later data, stop values work.  */

#include <config.h>

#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bfo.h"

#include "check.h"

struct seen
{
  char path[64][64];
  int error[64];
  int n;
  int stop_after;               /* return -ECANCELED after this many callbacks (0: never) */
};

static int
cb (const struct bfo_written *f, void *arg)
{
  struct seen *s = arg;
  if (s->n < 64)
    {
      snprintf (s->path[s->n], sizeof s->path[0], "%s", f->path);
      s->error[s->n] = f->error;
    }
  s->n++;
  return s->stop_after && s->n >= s->stop_after ? -ECANCELED : 0;
}

static int
error_of (const struct seen *s, const char *path)
{
  for (int i = 0; i < s->n && i < 64; i++)
    if (strcmp (s->path[i], path) == 0)
      return s->error[i];
  return -1;
}

static int
file_is (const char *dir, const char *rel, const char *want)
{
  char p[4096], buf[256];
  snprintf (p, sizeof p, "%s/%s", dir, rel);
  FILE *f = fopen (p, "r");
  if (!f)
    return 0;
  size_t n = fread (buf, 1, sizeof buf - 1, f);
  fclose (f);
  buf[n] = '\0';
  return strcmp (buf, want) == 0;
}

int
main (void)
{
  const char *tmp = getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";
  char dir[4096];
  snprintf (dir, sizeof dir, "%s/bfo-test-writer.XXXXXX", tmp);
  if (!mkdtemp (dir))
    {
      printf ("skip: cannot make a directory under %s\n", tmp);
      return 77;
    }
  char p[4200];
  snprintf (p, sizeof p, "%s/sub", dir);
  mkdir (p, 0755);

  /* Bad paths fail one by one; the good ones of the batch are written.  */
  struct seen s = { 0 };
  const char *paths[] = { "../escape", "/abs", "a//b", "./x", "sub/..", ".bfo-tmp.1.2.3",
                          "ok", "sub/ok", "missing/parent", "ok" };
  const void *bufs[] = { "1", "2", "3", "4", "5", "6", "first", "sub", "7", "second" };
  size_t lens[10];
  for (int i = 0; i < 10; i++)
    lens[i] = strlen (bufs[i]);
  int r = bfo_batchwrite (bufs, lens, paths, 10, dir, NULL, cb, &s);
  check (r == 0, "bfo_batchwrite returns 0 despite per-file errors");
  check (s.n == 10, "one callback per file");
  int einval = 1;
  for (int i = 0; i < 6; i++)
    einval &= error_of (&s, paths[i]) == EINVAL;
  check (einval, "'..', absolute, empty and '.' components, helper names: EINVAL");
  check (error_of (&s, "missing/parent") == ENOENT, "a missing parent is ENOENT by default");
  check (file_is (dir, "ok", "second"), "the same path twice: the later add wins");
  check (file_is (dir, "sub/ok", "sub"), "a file in an existing subdirectory");

  /* BFO_WRITE_MKDIRS makes missing parents.  */
  struct bfo_write_opts o = { .flags = BFO_WRITE_MKDIRS };
  struct bfo_writer *w;
  memset (&s, 0, sizeof s);
  check (bfo_writer_open (&w, dir, &o, cb, &s) == 0, "opens a writer");
  struct bfo_write_attrs a = { .flags = BFO_ATTR_MODE | BFO_ATTR_MTIME, .mode = 04751,
                               .mtime = { 1000000000, 123456789 } };
  check (bfo_writer_add (w, "new/deep/er/file", "data", 4, &a, NULL) == 0, "adds");
  check (bfo_writer_close (w) == 0, "closes");
  struct stat st;
  snprintf (p, sizeof p, "%s/new/deep/er/file", dir);
  check (s.n == 1 && s.error[0] == 0 && stat (p, &st) == 0, "missing parents were made");
  check ((st.st_mode & 07777) == 04751 && st.st_mtim.tv_sec == 1000000000
         && st.st_mtim.tv_nsec == 123456789, "mode (with set-uid) and mtime exactly as asked");

  /* Modes the umask would mask, and modes it would not (created with the mode
     at once, no fchmod), come out exact; batches of many files use both
     threads and, where cloning works, unnamed files linked at their names.  */
  mode_t old_mask = umask (022);
  memset (&s, 0, sizeof s);
  o = (struct bfo_write_opts) { .flags = BFO_WRITE_MKDIRS, .batch_files = 200 };
  check (bfo_writer_open (&w, dir, &o, cb, &s) == 0, "opens a writer with 200-file batches");
  static const mode_t modes[] = { 0640, 0666, 0777, 0400, 02755, 01777, 0 };
  const int nm = sizeof modes / sizeof modes[0];
  bool added = true;
  for (int i = 0; i < 1000; i++)
    {
      char rel[64], data[32];
      snprintf (rel, sizeof rel, "m/d%d/f%d", i / 100, i);
      snprintf (data, sizeof data, "file %d", i);
      struct bfo_write_attrs ma = { .flags = BFO_ATTR_MODE, .mode = modes[i % nm] };
      added &= bfo_writer_add (w, rel, data, strlen (data), &ma, NULL) == 0;
    }
  /* ... and a path twice across batches and within one: the later add wins.  */
  added &= bfo_writer_add (w, "m/d3/f350", "again", 5, NULL, NULL) == 0;
  added &= bfo_writer_add (w, "m/d3/f350", "again2", 6, NULL, NULL) == 0;
  check (added && bfo_writer_close (w) == 0 && s.n == 1002, "1002 adds, 1002 reports");
  umask (old_mask);
  bool modes_ok = true, data_ok = true;
  for (int i = 0; i < 1000; i++)
    {
      char rel[64], want[32];
      snprintf (rel, sizeof rel, "m/d%d/f%d", i / 100, i);
      snprintf (p, sizeof p, "%s/%s", dir, rel);
      snprintf (want, sizeof want, "file %d", i);
      if (i != 350)
        data_ok &= file_is (dir, rel, want);
      if (i != 350 && (stat (p, &st) != 0 || (st.st_mode & 07777) != modes[i % nm]))
        modes_ok = false;
    }
  check (modes_ok, "modes exact whether or not the umask masks them");
  check (data_ok && file_is (dir, "m/d3/f350", "again2"), "contents exact, the last add wins");

  /* A callback's stop value stops the writer and comes back from add/close.  */
  memset (&s, 0, sizeof s);
  s.stop_after = 1;
  o = (struct bfo_write_opts) { .batch_files = 1 };
  check (bfo_writer_open (&w, dir, &o, cb, &s) == 0, "opens a writer with 1-file batches");
  /* A batch is reported when the next one has been filled: the add that ran
     the next batch returns the stop value (that batch is still finished).  */
  r = bfo_writer_add (w, "s1", "x", 1, NULL, NULL);
  int r2 = bfo_writer_add (w, "s2", "x", 1, NULL, NULL);
  check ((r == 0 || r == -ECANCELED) && r2 == -ECANCELED,
         "the stop value comes back from the add that ran the next batch");
  snprintf (p, sizeof p, "%s/s3", dir);
  check (bfo_writer_add (w, "s3", "x", 1, NULL, NULL) == -ECANCELED
         && bfo_writer_flush (w) == -ECANCELED && s.n == 1 && access (p, F_OK) != 0,
         "later adds and the flush return it without writing");
  bfo_writer_close (w);

  o = (struct bfo_write_opts) { .backend = 9 };
  check (bfo_writer_open (&w, dir, &o, cb, &s) == -EINVAL, "an unknown backend is EINVAL");
  check (bfo_writer_open (&w, "/nonexistent/dir", NULL, cb, &s) == -ENOENT,
         "a missing destination is ENOENT");
  check (bfo_recover (dir, 0, NULL, NULL) == 0, "nothing to recover in a clean directory");

  /* Sparse files: image writers only; bad maps fail per file with EINVAL.  */
  check (bfo_writer_open (&w, dir, NULL, cb, &s) == 0, "opens a directory writer");
  struct bfo_range one = { 0, 1 };
  check (bfo_writer_add_sparse (w, "sp", "x", &one, 1, 10, NULL, NULL) == -EOPNOTSUPP,
         "bfo_writer_add_sparse into a directory: EOPNOTSUPP");
  bfo_writer_close (w);
  char img[4200], cmd[8800];
  snprintf (img, sizeof img, "%s/img", dir);
  snprintf (cmd, sizeof cmd, "truncate -s 16M '%s' && mkfs.ext4 -q -F -b 4096 '%s' 2>/dev/null", img, img);
  if (system (cmd) != 0)
    printf ("skip: sparse files into an image: mkfs.ext4 did not make %s\n", img);
  else
    {
      memset (&s, 0, sizeof s);
      check (bfo_writer_open_image (&w, img, "/", NULL, cb, &s) == 0, "opens an image writer");
      struct bfo_range overlap[] = { { 0, 10 }, { 5, 10 } }, beyond[] = { { 4090, 20 } },
                       unsorted[] = { { 8192, 1 }, { 0, 1 } },
                       good[] = { { 1, 2 }, { 3, 1 }, { 5000, 3 }, { 0, 0 }, { 1 << 20, 4 } };
      check (bfo_writer_add_sparse (w, "overlap", "0123456789abcdefghij", overlap, 2, 100,
                                    NULL, NULL) == 0
             && bfo_writer_add_sparse (w, "beyond", "0123456789abcdefghij", beyond, 1, 4096,
                                       NULL, NULL) == 0
             && bfo_writer_add_sparse (w, "unsorted", "ab", unsorted, 2, 9000, NULL, NULL) == 0
             && bfo_writer_add_sparse (w, "good", "abcdefghij", good, 5, 2 << 20, NULL,
                                       NULL) == 0
             && bfo_writer_add_sparse (w, "hole", NULL, NULL, 0, 1 << 30, NULL, NULL) == 0,
             "adds sparse files");
      check (bfo_writer_close (w) == 0, "closes the image writer");
      check (error_of (&s, "overlap") == EINVAL && error_of (&s, "beyond") == EINVAL
             && error_of (&s, "unsorted") == EINVAL, "overlapping, unsorted or too long: EINVAL");
      check (error_of (&s, "good") == 0 && error_of (&s, "hole") == 0, "good maps are written");
      snprintf (cmd, sizeof cmd, "e2fsck -fn '%s' >/dev/null 2>&1", img);
      check (system (cmd) == 0, "e2fsck -fn is clean");
      /* debugfs shows the extents: blocks 0-1 (bytes 1-3, 5000-5002), block 256 (1 MiB).  */
      snprintf (cmd, sizeof cmd, "debugfs -R 'dump_extents /good' '%s' 2>/dev/null"
                " | awk 'NR > 1 { printf \"%%s-%%s \", $5, $7 }' | grep -qx '0-1 256-256 '",
                img);
      check (system (cmd) == 0, "holes and data where the map says (debugfs dump_extents)");
      snprintf (cmd, sizeof cmd, "debugfs -R 'cat /good' '%s' 2>/dev/null | od -An -c"
                " | tr -d ' \n' | grep -q '^\\\\0abc'", img);
      check (system (cmd) == 0, "data at their offsets, zeros before");
    }

  snprintf (cmd, sizeof cmd, "rm -rf '%s'", dir);
  if (system (cmd) != 0)
    printf ("note: could not remove %s\n", dir);
  return failures ? 1 : 0;
}
