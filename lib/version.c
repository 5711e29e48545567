/* version.c: libbfo's version and feature queries.
   Probes at run time rather than trusting build-time checks: io_uring may be disabled by sysctl.  */

#include <config.h>

#include "bfo.h"

#include <liburing.h>
#include <ext2fs/ext2fs.h>

const char *
bfo_version (void)
{
  return PACKAGE_VERSION;
}

/* io_uring can be compiled in yet refused at run time (kernel.io_uring_disabled,
   seccomp in containers), so ask the kernel with the smallest possible ring.  */
static int
probe_io_uring (void)
{
  struct io_uring ring;
  if (io_uring_queue_init (1, &ring, 0) < 0)
    return 0;
  io_uring_queue_exit (&ring);
  return 1;
}

unsigned int
bfo_features (void)
{
  unsigned int features = BFO_FEATURE_EXT4IMG;
  if (probe_io_uring ())
    features |= BFO_FEATURE_IO_URING;
  return features;
}

const char *
bfo_feature_name (unsigned int feature)
{
  switch (feature)
    {
    case BFO_FEATURE_IO_URING: return "io_uring";
    case BFO_FEATURE_EXT4IMG:  return "ext4img";
    default:                   return NULL;
    }
}

const char *
bfo_ext2fs_version (void)
{
  const char *version = NULL;
  ext2fs_get_library_version (&version, NULL);
  return version;
}
