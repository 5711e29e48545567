/* test-reader.c: the batch reader through its public API, on files made under
   a temporary directory: bfo_reader_add_at (paths relative to a directory
   descriptor) delivers every file's exact bytes with the path as given; a
   window of many groups (one reopened ahead on the helper thread) delivers
   each file once; two readers taking turns with mapped windows
   (bfo_reader_map) deliver each file once; a callback that stops ends the
   read with its value; files that grow past the large-file threshold while
   their reads are in flight are streamed once with their new bytes; and no
   descriptor is left open after any of it.  Argument: the directory to work
   in (default: $TMPDIR or /tmp).  */

#include <config.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bfo.h"

#include "check.h"

enum { N_FILES = 3000 };

struct seen
{
  unsigned int calls, bad, twice;
  unsigned int stop_after;      /* 0: never stop */
  unsigned char got[N_FILES];
};

/* File I holds I % 9000 + 1 bytes, each (I + offset) & 0xff.  */
static size_t
file_size (unsigned int i)
{
  return i % 9000 + 1;
}

static int
on_file (const struct bfo_file *f, void *arg)
{
  struct seen *s = arg;
  unsigned int i;
  s->calls++;
  if (f->error || sscanf (f->path, "d%*u/f%u", &i) != 1 || i >= N_FILES
      || (uintptr_t) f->user != i + 1)
    {
      s->bad++;
      return 0;
    }
  bool ok = f->offset == 0 && f->last && f->len == file_size (i);
  for (size_t k = 0; ok && k < f->len; k++)
    ok = ((const unsigned char *) f->data)[k] == ((i + k) & 0xff);
  if (!ok)
    s->bad++;
  if (s->got[i]++)
    s->twice++;
  if (s->stop_after && s->calls == s->stop_after)
    return -ECANCELED;
  return 0;
}

static int
count_fds (void)
{
  DIR *d = opendir ("/proc/self/fd");
  int n = 0;
  if (!d)
    return -1;
  while (readdir (d))
    n++;
  closedir (d);
  return n;
}

/* Read every file through a reader with options O and callback CB (ARG).  */
static int
run_cb (int dirfd, const struct bfo_read_opts *o, bfo_read_cb cb, void *arg)
{
  struct bfo_reader *r;
  int ret = bfo_reader_open (&r, o, cb, arg);
  if (ret < 0)
    return ret;
  char path[64];
  for (unsigned int i = 0; i < N_FILES && ret == 0; i++)
    {
      snprintf (path, sizeof path, "d%u/f%u", i % 7, i);
      ret = bfo_reader_add_at (r, dirfd, path, (void *) (uintptr_t) (i + 1));
    }
  int closed = bfo_reader_close (r);
  return ret ? ret : closed;
}

static int
run (int dirfd, const struct bfo_read_opts *o, struct seen *s)
{
  return run_cb (dirfd, o, on_file, s);
}

/* The callback of the growing test: at its first call every other file grows
   to GROWN bytes (the same pattern on); then each file must come whole, with
   the bytes it has when delivered, in consecutive pieces.  */
enum { GROWN = 20000 };

struct grow_seen
{
  int dirfd;
  bool grown;
  unsigned int bad, changed;
  size_t next[N_FILES];
  unsigned char done[N_FILES];
};

static int
on_grow (const struct bfo_file *f, void *arg)
{
  struct grow_seen *g = arg;
  unsigned int i;
  if (f->error || sscanf (f->path, "d%*u/f%u", &i) != 1 || i >= N_FILES)
    {
      g->bad++;
      return 0;
    }
  if (!g->grown)
    {
      g->grown = true;
      unsigned char *more = malloc (GROWN);
      char path[64];
      for (unsigned int j = 0; j < N_FILES && more; j++)
        {
          if (j == i)
            continue;
          for (size_t k = file_size (j); k < GROWN; k++)
            more[k] = (j + k) & 0xff;
          snprintf (path, sizeof path, "d%u/f%u", j % 7, j);
          int fd = openat (g->dirfd, path, O_WRONLY | O_APPEND | O_CLOEXEC);
          size_t len = GROWN - file_size (j);
          if (fd < 0 || write (fd, more + file_size (j), len) != (ssize_t) len || close (fd) < 0)
            g->bad++;
        }
      free (more);
    }
  size_t want = f->st ? (size_t) f->st->st_size : 0;
  bool ok = f->offset == g->next[i] && f->offset + f->len <= want
            && (want == GROWN || want == file_size (i)) && !g->done[i];
  for (size_t k = 0; ok && k < f->len; k++)
    ok = ((const unsigned char *) f->data)[k] == ((i + f->offset + k) & 0xff);
  g->next[i] += f->len;
  if (!ok)
    g->bad++;
  if (f->last)
    {
      g->done[i] += g->next[i] == want;
      g->changed += (f->flags & BFO_FILE_CHANGED) != 0;
    }
  return 0;
}

int
main (int argc, char **argv)
{
  const char *base = argc > 1 ? argv[1] : getenv ("TMPDIR") ? getenv ("TMPDIR") : "/tmp";
  char tmpl[4096];
  snprintf (tmpl, sizeof tmpl, "%s/test-reader.XXXXXX", base);
  if (!mkdtemp (tmpl))
    {
      perror ("mkdtemp");
      return 99;
    }
  int dirfd = open (tmpl, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  unsigned char *buf = malloc (9000);
  if (dirfd < 0 || !buf)
    return 99;
  char path[64];
  for (unsigned int d = 0; d < 7; d++)
    {
      snprintf (path, sizeof path, "d%u", d);
      mkdirat (dirfd, path, 0755);
    }
  for (unsigned int i = 0; i < N_FILES; i++)
    {
      snprintf (path, sizeof path, "d%u/f%u", i % 7, i);
      int fd = openat (dirfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      for (size_t k = 0; k < file_size (i); k++)
        buf[k] = (i + k) & 0xff;
      if (fd < 0 || write (fd, buf, file_size (i)) != (ssize_t) file_size (i) || close (fd) < 0)
        {
          perror (path);
          return 99;
        }
    }
  /* From elsewhere: the paths resolve against dirfd, not the working directory.  */
  if (chdir ("/") < 0)
    return 99;
  int fds0 = count_fds ();

  struct seen *s = calloc (1, sizeof *s);
  struct bfo_read_opts o = { .batch_files = 256 };
  int ret = run (dirfd, &o, s);
  unsigned int all = 0;
  for (unsigned int i = 0; i < N_FILES; i++)
    all += s->got[i] == 1;
  check (ret == 0, "groups of 256 files: the read succeeds");
  check (all == N_FILES && s->calls == N_FILES,
         "every file delivered once, by its path relative to the directory descriptor");
  check (s->bad == 0 && s->twice == 0, "with its exact bytes and its user pointer");
  check (count_fds () == fds0, "no descriptor left open");

  /* The same with a soft limit small enough that the window cannot stay open
     between the phases (room for (4200 - 64) / 2 = 2068 descriptors): groups
     of 1034 are reopened, one ahead on the helper thread.  */
  struct rlimit rl, low;
  if (getrlimit (RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max >= 4200)
    {
      low = rl;
      low.rlim_cur = 4200;
      setrlimit (RLIMIT_NOFILE, &low);
      memset (s, 0, sizeof *s);
      ret = run (dirfd, &(struct bfo_read_opts) { 0 }, s);
      all = 0;
      for (unsigned int i = 0; i < N_FILES; i++)
        all += s->got[i] == 1;
      check (ret == 0 && all == N_FILES && s->bad == 0 && s->twice == 0,
             "soft limit 4200: groups reopened ahead, every file once and exact");
      check (count_fds () == fds0, "no descriptor left open");

      memset (s, 0, sizeof *s);
      s->stop_after = 1500;
      ret = run (dirfd, &(struct bfo_read_opts) { 0 }, s);
      check (ret == -ECANCELED, "a callback that stops ends the read with its value");
      check (s->calls == 1500 && s->bad == 0, "and no file is delivered after it");
      check (count_fds () == fds0, "no descriptor left open after the stop");
      setrlimit (RLIMIT_NOFILE, &rl);
    }
  else
    printf ("skip: the hard RLIMIT_NOFILE (%llu) is below 4200\n",
            (unsigned long long) rl.rlim_max);

  /* Two readers taking turns with windows, as bfotar's mapper and reader
     threads do: each window mapped (bfo_reader_map) before the one before it
     is flushed; a file added to a mapped reader flushes it first.  */
  memset (s, 0, sizeof *s);
  struct bfo_reader *two[2];
  struct bfo_read_opts so = { .flags = BFO_READ_SHARE_FDS, .window_files = 1000,
                              .batch_files = 256 };
  ret = bfo_reader_open (&two[0], &so, on_file, s);
  if (ret == 0)
    ret = bfo_reader_open (&two[1], &so, on_file, s);
  check (ret == 0, "two readers with BFO_READ_SHARE_FDS open");
  unsigned int map_calls = 0, w = 0;
  check (bfo_reader_map (two[0]) == 0, "mapping an empty reader does nothing");
  for (; ret == 0 && w * 600 < N_FILES; w++)
    {
      struct bfo_reader *r = two[w % 2];
      for (unsigned int i = w * 600; i < (w + 1) * 600 && i < N_FILES && ret == 0; i++)
        {
          snprintf (path, sizeof path, "d%u/f%u", i % 7, i);
          ret = bfo_reader_add_at (r, dirfd, path, (void *) (uintptr_t) (i + 1));
        }
      unsigned int calls = s->calls;
      if (ret == 0)
        ret = bfo_reader_map (r);
      map_calls += s->calls - calls;
      if (w > 0 && ret == 0)
        ret = bfo_reader_flush (two[(w + 1) % 2]);
    }
  check (ret == 0 && map_calls == 0 && s->calls == N_FILES - 600,
         "mapping delivers nothing; each flush delivers its window");
  /* The last window is still mapped: one more file flushes it, then waits.  */
  ret = bfo_reader_add_at (two[(w - 1) % 2], dirfd, "d0/f0", (void *) (uintptr_t) 1);
  check (ret == 0 && s->calls == N_FILES,
         "adding to a mapped reader reads the mapped window first");
  s->got[0]--;
  ret = bfo_reader_close (two[(w - 1) % 2]);
  int ret0 = bfo_reader_close (two[w % 2]);
  all = 0;
  for (unsigned int i = 0; i < N_FILES; i++)
    all += s->got[i] == 1;
  check (ret == 0 && ret0 == 0 && all == N_FILES && s->bad == 0 && s->calls == N_FILES + 1,
         "two readers taking turns: every file once and exact");
  check (count_fds () == fds0, "no descriptor left open");

  memset (s, 0, sizeof *s);
  s->stop_after = 100;
  ret = run (dirfd, &(struct bfo_read_opts) { .batch_files = 64 }, s);
  check (ret == -ECANCELED && s->calls == 100, "groups of 64: the stop ends the read too");
  check (count_fds () == fds0, "no descriptor left open after the stop");

  /* Files that change while their group's reads are in flight: at the first
     delivery every other file grows past the large-file threshold, so that
     each is found changed when its turn comes (most while the reads still
     run: those are streamed once they are done) and streamed in pieces with
     its new bytes, once.  */
  syncfs (dirfd);               /* (allocated: the fast path, not delalloc's) */
  struct grow_seen *g = calloc (1, sizeof *g);
  g->dirfd = dirfd;
  ret = run_cb (dirfd, &(struct bfo_read_opts) { .batch_files = N_FILES, .io_depth = 2,
                                                 .large_file_bytes = 16384 }, on_grow, g);
  unsigned int whole = 0;
  for (unsigned int i = 0; i < N_FILES; i++)
    whole += g->done[i] == 1;
  check (ret == 0 && g->grown && g->bad == 0 && whole == N_FILES,
         "files grown past the large-file threshold mid-read: each streamed once, exact");
  check (g->changed == N_FILES - 1, "and flagged changed (all but the first delivered)");
  check (count_fds () == fds0, "no descriptor left open");
  free (g);

  for (unsigned int i = 0; i < N_FILES; i++)
    {
      snprintf (path, sizeof path, "d%u/f%u", i % 7, i);
      unlinkat (dirfd, path, 0);
    }
  for (unsigned int d = 0; d < 7; d++)
    {
      snprintf (path, sizeof path, "d%u", d);
      unlinkat (dirfd, path, AT_REMOVEDIR);
    }
  close (dirfd);
  rmdir (tmpl);
  free (s);
  free (buf);
  return failures ? 1 : 0;
}
