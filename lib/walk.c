/* walk.c: the tree walk of a batch read: every regular file under a root, with the
   inode number from the directory entry so the batch can stat in inode order.  */

#include <config.h>

#include "bfo-int.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct dent
{
  uint64_t ino;
  unsigned char type;
  char *name;
};

static int
by_name (const void *a, const void *b)
{
  return strcmp (((const struct dent *) a)->name, ((const struct dent *) b)->name);
}

static char *
join (const char *dir, const char *name)
{
  size_t ld = strlen (dir), ln = strlen (name);
  bool slash = ld > 0 && dir[ld - 1] == '/';
  char *p = malloc (ld + !slash + ln + 1);
  if (p)
    {
      memcpy (p, dir, ld);
      if (!slash)
        p[ld++] = '/';
      memcpy (p + ld, name, ln + 1);
    }
  return p;
}

/* Depth first, entries of one directory in name order, so a walk is reproducible;
   memory is one directory's entries plus the stack of pending directories.  */
int
bfo_walk_tree (const char *root, bfo_walk_add_fn add, bfo_walk_err_fn err, void *ctx)
{
  struct stat st;
  if (stat (root, &st) < 0)
    return err (ctx, root, errno, "stat");
  if (S_ISREG (st.st_mode))
    return add (ctx, root, st.st_ino);
  if (!S_ISDIR (st.st_mode))
    return 0;

  size_t n_stack = 0, cap_stack = 16;
  char **stack = malloc (cap_stack * sizeof *stack);
  char *first = strdup (root);
  if (!stack || !first)
    {
      free (stack);
      free (first);
      return -ENOMEM;
    }
  stack[n_stack++] = first;
  int ret = 0;
  bool at_root = true;          /* the root may be a symlink to a directory */

  while (n_stack > 0 && ret == 0)
    {
      char *dir = stack[--n_stack];
      int dfd = open (dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | (at_root ? 0 : O_NOFOLLOW));
      at_root = false;
      DIR *d = dfd < 0 ? NULL : fdopendir (dfd);
      if (!d)
        {
          int e = errno;
          if (dfd >= 0)
            close (dfd);
          ret = err (ctx, dir, e, "open directory");
          free (dir);
          continue;
        }
      struct dent *ents = NULL;
      size_t n = 0, cap = 0;
      struct dirent *de;
      errno = 0;
      while ((de = readdir (d)) != NULL)
        {
          if (bfo_dot_or_dotdot (de->d_name))
            continue;
          if (n == cap)
            {
              cap = cap ? 2 * cap : 64;
              struct dent *x = realloc (ents, cap * sizeof *x);
              if (!x)
                {
                  ret = -ENOMEM;
                  break;
                }
              ents = x;
            }
          ents[n].name = strdup (de->d_name);
          if (!ents[n].name)
            {
              ret = -ENOMEM;
              break;
            }
          ents[n].ino = de->d_ino;
          ents[n].type = de->d_type;
          n++;
        }
      if (ret == 0 && errno != 0 && de == NULL)
        ret = err (ctx, dir, errno, "read directory");
      closedir (d);
      qsort (ents, n, sizeof *ents, by_name);

      size_t first_sub = n_stack;
      for (size_t i = 0; i < n; i++)
        {
          char *path = ret == 0 ? join (dir, ents[i].name) : NULL;
          if (ret == 0 && !path)
            ret = -ENOMEM;
          unsigned char type = ents[i].type;
          if (ret == 0 && type == DT_UNKNOWN)
            {
              /* Some file systems leave d_type unset: ask.  */
              if (lstat (path, &st) < 0)
                ret = err (ctx, path, errno, "stat");
              else
                type = S_ISREG (st.st_mode) ? DT_REG : S_ISDIR (st.st_mode) ? DT_DIR : DT_LNK;
            }
          if (ret == 0 && type == DT_REG)
            ret = add (ctx, path, ents[i].ino);
          if (ret == 0 && type == DT_DIR)
            {
              if (n_stack == cap_stack)
                {
                  char **x = realloc (stack, 2 * cap_stack * sizeof *x);
                  if (!x)
                    ret = -ENOMEM;
                  else
                    stack = x, cap_stack *= 2;
                }
              if (ret == 0)
                {
                  stack[n_stack++] = path;
                  path = NULL;
                }
            }
          free (path);
          free (ents[i].name);
        }
      free (ents);
      /* Visit subdirectories in name order: reverse what was pushed.  */
      for (size_t a = first_sub, b = n_stack; b > a + 1; a++, b--)
        {
          char *t = stack[a];
          stack[a] = stack[b - 1];
          stack[b - 1] = t;
        }
      free (dir);
    }
  while (n_stack > 0)
    free (stack[--n_stack]);
  free (stack);
  return ret;
}

int
bfo_tree_small (int at, const char *path, unsigned int *entries, unsigned int *dirs)
{
  int fd = openat (at, path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    {
      if (errno != ENOTDIR)
        return -errno;
      if (*entries == 0)
        return 0;
      --*entries;
      return 1;
    }
  /* Directories to list: FDS[NEXT..N).  */
  int fds[64];
  size_t n = 0, next = 0;
  int ret = 1;
  if (*dirs == 0)
    ret = 0;
  else
    {
      --*dirs;
      fds[n++] = fd;
      fd = -1;
    }
  while (ret == 1 && next < n)
    {
      DIR *d = fdopendir (fds[next]);
      if (!d)
        {
          ret = -errno;
          break;
        }
      fds[next++] = -1;
      struct dirent *e;
      while (ret == 1 && (e = readdir (d)))
        {
          if (bfo_dot_or_dotdot (e->d_name))
            continue;
          if (*entries == 0 || e->d_type == DT_UNKNOWN)
            ret = 0;
          else
            {
              --*entries;
              if (e->d_type == DT_DIR)
                {
                  if (*dirs == 0 || n == sizeof fds / sizeof *fds)
                    ret = 0;
                  else
                    {
                      int sub = openat (dirfd (d), e->d_name,
                                        O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
                      if (sub < 0)
                        ret = 0;
                      else
                        {
                          --*dirs;
                          fds[n++] = sub;
                        }
                    }
                }
            }
        }
      closedir (d);
    }
  if (fd >= 0)
    close (fd);
  for (size_t i = next; i < n; i++)
    if (fds[i] >= 0)
      close (fds[i]);
  return ret;
}
