/* raw.c: raw block-device mode of the batch reader (root only): find and vet the one
   device under an ext2/3/4 or XFS file system, so merged extents can be read from it directly.  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

/* Split a /proc/self/mountinfo LINE in place into *M:
   "id parent MAJ:MIN root mountpoint opts ... - fstype source superopts".  */
bool
bfo_mountinfo_split (char *line, struct bfo_mountinfo *m)
{
  char *save, *tok = strtok_r (line, " ", &save);
  tok = tok ? strtok_r (NULL, " ", &save) : NULL;
  m->majmin = tok ? strtok_r (NULL, " ", &save) : NULL;
  m->root = m->majmin ? strtok_r (NULL, " ", &save) : NULL;
  m->mnt = m->root ? strtok_r (NULL, " ", &save) : NULL;
  char *dash = m->mnt ? strstr (save, " - ") : NULL;
  if (!dash)
    return false;
  m->fstype = strtok_r (dash + 3, " ", &save);
  m->source = m->fstype ? strtok_r (NULL, " ", &save) : NULL;
  m->super = m->source ? strtok_r (NULL, " \n", &save) : NULL;
  return m->super != NULL;
}

/* The mount's super options for device DEV, from /proc/self/mountinfo, into BUF.  */
static int
mount_options (dev_t dev, char *buf, size_t size)
{
  FILE *f = fopen ("/proc/self/mountinfo", "re");
  if (!f)
    return -errno;
  char *line = NULL;
  size_t cap = 0;
  int ret = -ENOENT;
  char want[32];
  snprintf (want, sizeof want, "%u:%u", major (dev), minor (dev));
  struct bfo_mountinfo m;
  while (getline (&line, &cap, f) > 0)
    if (bfo_mountinfo_split (line, &m) && strcmp (m.majmin, want) == 0)
      {
        snprintf (buf, size, ",%s,", m.super);
        ret = 0;
        break;
      }
  free (line);
  fclose (f);
  return ret;
}

/* /dev/NAME of block device DEV, from sysfs (no udev /dev/block links needed).  */
int
bfo_device_path (dev_t dev, char *buf, size_t size)
{
  char p[64];
  snprintf (p, sizeof p, "/sys/dev/block/%u:%u/uevent", major (dev), minor (dev));
  FILE *f = fopen (p, "re");
  if (!f)
    return -errno;
  char line[256];
  int ret = -ENOENT;
  while (fgets (line, sizeof line, f))
    if (strncmp (line, "DEVNAME=", 8) == 0)
      {
        line[strcspn (line, "\n")] = '\0';
        snprintf (buf, size, "/dev/%s", line + 8);
        ret = 0;
        break;
      }
  fclose (f);
  return ret;
}

/* Open the block device holding the file FD for raw reads, or say why not:
   -EPERM (not root), -EOPNOTSUPP (file system or mount not eligible).  */
int
bfo_raw_open (int fd, dev_t *dev_out)
{
  struct stat st;
  struct statfs sf;
  if (fstat (fd, &st) < 0 || fstatfs (fd, &sf) < 0)
    return -errno;
  if (geteuid () != 0)
    return -EPERM;
  /* ext2/3/4 and XFS report FIEMAP physical addresses as byte offsets on their
     one data device; Btrfs (multi-device, logical addresses) does not.  */
  if (sf.f_type != BFO_EXT4_MAGIC && sf.f_type != BFO_XFS_MAGIC)
    return -EOPNOTSUPP;
  char opts[4096];
  if (mount_options (st.st_dev, opts, sizeof opts) < 0)
    return -EOPNOTSUPP;
  /* data=journal may leave the newest data only in the journal; a realtime
     device holds some files' data elsewhere.  */
  if (strstr (opts, ",data=journal,") || strstr (opts, ",rtdev="))
    return -EOPNOTSUPP;
  char path[PATH_MAX];
  if (bfo_device_path (st.st_dev, path, sizeof path) < 0)
    return -EOPNOTSUPP;
  int dfd = open (path, O_RDONLY | O_DIRECT | O_CLOEXEC);
  if (dfd < 0)
    return errno == EACCES ? -EPERM : -EOPNOTSUPP;
  struct stat ds;
  if (fstat (dfd, &ds) < 0 || !S_ISBLK (ds.st_mode) || ds.st_rdev != st.st_dev)
    {
      close (dfd);
      return -EOPNOTSUPP;
    }
  *dev_out = st.st_dev;
  return dfd;
}
