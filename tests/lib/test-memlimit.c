/* test-memlimit.c: bfo_memory_limit's reading of cgroup hierarchies, on
   made-up /proc/self/cgroup and /proc/self/mountinfo files and cgroup
   directories in a temporary directory: cgroup v2 (memory.max, memory.high,
   ancestors, a namespace's root), v1 (memory.limit_in_bytes, "unlimited",
   the memory controller's own hierarchy among others, a mount of a
   subtree) and the hybrid layout with both.  The machine this runs on may
   offer only one of them (tests/cp-batch.bats runs the programs under a
   real memory cgroup); this checks both.  */

#include <config.h>

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bfo-int.h"

#include "check.h"

static char top[64];

/* Write TEXT to the file at TOP/REL, making its directories.  */
static void
put (const char *rel, const char *fmt, ...)
{
  char path[512];
  snprintf (path, sizeof path, "%s/%s", top, rel);
  for (char *s = path + strlen (top) + 1; (s = strchr (s, '/')); s++)
    {
      *s = '\0';
      mkdir (path, 0755);
      *s = '/';
    }
  FILE *f = fopen (path, "w");
  if (!f)
    {
      perror (path);
      exit (99);
    }
  va_list ap;
  va_start (ap, fmt);
  vfprintf (f, fmt, ap);
  va_end (ap);
  fclose (f);
}

static uint64_t
limit (uint64_t phys)
{
  char cg[128], mi[128];
  snprintf (cg, sizeof cg, "%s/cgroup", top);
  snprintf (mi, sizeof mi, "%s/mountinfo", top);
  return bfo_memory_limit_in (cg, mi, phys);
}

#define MiB(n) ((uint64_t) (n) << 20)
#define PHYS MiB (24 << 10)

int
main (void)
{
  snprintf (top, sizeof top, "/tmp/bfo-memlimit.XXXXXX");
  if (!mkdtemp (top))
    {
      perror ("mkdtemp");
      return 99;
    }

  /* cgroup v2 (a systemd machine): the limit of an ancestor, and memory.high
     lower than memory.max in the process's own cgroup.  */
  put ("mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
       "31 22 0:26 / %s/v2 rw,nosuid,nodev shared:4 - cgroup2 cgroup2 rw,nsdelegate\n", top);
  put ("cgroup", "0::/system.slice/job.service\n");
  put ("v2/memory.max", "1234\n");      /* the root's: above the mount, still the top */
  put ("v2/system.slice/memory.max", "%llu\n", (unsigned long long) MiB (1024));
  put ("v2/system.slice/job.service/memory.max", "max\n");
  check (limit (PHYS) == 1234, "v2: the mount point's own cgroup counts");
  put ("v2/memory.max", "max\n");
  check (limit (PHYS) == MiB (1024), "v2: a parent's memory.max");
  put ("v2/system.slice/job.service/memory.high", "%llu\n", (unsigned long long) MiB (300));
  check (limit (PHYS) == MiB (300), "v2: the own memory.high below the parent's memory.max");
  check (limit (MiB (200)) == MiB (200), "v2: the machine's memory when it is less");
  put ("v2/system.slice/memory.max", "max\n");
  put ("v2/system.slice/job.service/memory.high", "max\n");
  check (limit (PHYS) == PHYS, "v2: no limit anywhere: the machine's memory");

  /* A container with its own cgroup namespace: "0::/" and its cgroup2
     mount's root is "/" too; its limits are in the mount's top.  */
  put ("mountinfo", "500 400 0:26 / %s/ns rw - cgroup2 cgroup rw\n", top);
  put ("cgroup", "0::/\n");
  put ("ns/memory.max", "%llu\n", (unsigned long long) MiB (100));
  check (limit (PHYS) == MiB (100), "v2 namespace: the container's memory.max");

  /* A mount of a subtree (root /kubepods/pod1): a process in
     /kubepods/pod1/c1 reads c1 and the mount's top, nothing above it.  */
  put ("mountinfo", "500 400 0:26 /kubepods/pod1 %s/sub/mnt rw - cgroup2 cgroup rw\n", top);
  put ("cgroup", "0::/kubepods/pod1/c1\n");
  put ("sub/memory.max", "4096\n");     /* outside the mount: not read */
  put ("sub/mnt/memory.max", "%llu\n", (unsigned long long) MiB (512));
  put ("sub/mnt/c1/memory.max", "%llu\n", (unsigned long long) MiB (700));
  check (limit (PHYS) == MiB (512), "v2 subtree mount: the mount's top, not above it");
  put ("cgroup", "0::/other/c1\n");
  check (limit (PHYS) == PHYS, "v2: a cgroup outside every mount: the machine's memory");

  /* cgroup v1 beside a v2 hierarchy without the memory controller (systemd's
     hybrid layout); v1's "unlimited" is a huge number.  */
  put ("mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n"
       "30 22 0:25 / %s/h/unified rw shared:5 - cgroup2 cgroup2 rw\n"
       "33 22 0:28 / %s/h/cpu,cpuacct rw shared:8 - cgroup cgroup rw,cpu,cpuacct\n"
       "35 22 0:30 / %s/h/memory rw shared:10 - cgroup cgroup rw,memory\n", top, top, top);
  put ("cgroup", "12:cpu,cpuacct:/docker/abc\n11:memory:/docker/abc\n0::/init.scope\n");
  put ("h/cpu,cpuacct/docker/abc/memory.limit_in_bytes", "4096\n");  /* not memory's */
  put ("h/memory/docker/abc/memory.limit_in_bytes", "9223372036854771712\n");
  put ("h/memory/memory.limit_in_bytes", "9223372036854771712\n");
  check (limit (PHYS) == PHYS, "v1: unlimited everywhere: the machine's memory");
  put ("h/memory/docker/memory.limit_in_bytes", "%llu\n", (unsigned long long) MiB (200));
  check (limit (PHYS) == MiB (200), "v1: a parent's limit, in the memory controller's hierarchy only");
  put ("h/unified/init.scope/memory.max", "%llu\n", (unsigned long long) MiB (150));
  check (limit (PHYS) == MiB (150), "hybrid: the lower of the v1 and v2 limits");

  /* v1 with the memory controller sharing a hierarchy, and no such mount.  */
  put ("mountinfo", "35 22 0:30 / %s/j rw - cgroup cgroup rw,memory,hugetlb\n", top);
  put ("cgroup", "7:hugetlb,memory:/x\n");
  put ("j/x/memory.limit_in_bytes", "%llu\n", (unsigned long long) MiB (64));
  check (limit (PHYS) == MiB (64), "v1: memory among other controllers");
  put ("mountinfo", "22 1 8:1 / / rw - ext4 /dev/sda1 rw\n");
  check (limit (PHYS) == PHYS, "no cgroup file system mounted: the machine's memory");
  char missing[128];
  snprintf (missing, sizeof missing, "%s/none", top);
  check (bfo_memory_limit_in (missing, missing, PHYS) == PHYS,
         "no /proc/self/cgroup: the machine's memory");

  char cmd[128];
  snprintf (cmd, sizeof cmd, "rm -rf '%s'", top);
  if (system (cmd) != 0)
    return 99;
  return failures ? 1 : 0;
}
