/* test-version.c: libbfo's version and feature queries answer sensibly.
   Exit 0 pass, 1 fail (automake's protocol); prints what it checked.  */

#include <config.h>

#include <stdio.h>
#include <string.h>

#include "bfo.h"

#include "check.h"

int
main (void)
{
  check (strcmp (bfo_version (), PACKAGE_VERSION) == 0,
         "bfo_version() is the version configure was given");

  unsigned int features = bfo_features ();
  check ((features & BFO_FEATURE_EXT4IMG) != 0, "the ext4 image backend is built in");
  check (bfo_features () == features, "feature probe is stable across calls");
  check (strcmp (bfo_feature_name (BFO_FEATURE_IO_URING), "io_uring") == 0,
         "io_uring feature has its name");
  check (bfo_feature_name (1u << 30) == NULL, "unknown feature has no name");

  const char *e2 = bfo_ext2fs_version ();
  check (e2 != NULL && e2[0] >= '1' && e2[0] <= '9' && strchr (e2, '.') != NULL,
         "libext2fs version looks like N.N.N");
  printf ("libbfo %s, libext2fs %s, io_uring %s\n", bfo_version (), e2 ? e2 : "?",
          (features & BFO_FEATURE_IO_URING) ? "available" : "not available");
  return failures ? 1 : 0;
}
