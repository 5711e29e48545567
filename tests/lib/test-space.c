/* test-space.c: the free-space guard (lib/space.c) asks for no statfs far
   from full, asks again when its count runs low or every BFO_SPACE_RECHECK
   entries, says "tight" when less than BFO_SPACE_SLACK would be left after
   what is queued, takes Btrfs's lagging statfs from the space there was,
   lets root count ext4's reserved blocks, takes the room a quota leaves
   when that is less, and guards nothing on a file system that gives no
   sizes.  statfs results are made up here; the
   programs are tested on full loop images (tests/tar-extract.bats,
   tests/cp-batch.bats).  */

#include <config.h>

#include <stdint.h>
#include <string.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "bfo.h"

#include "check.h"

#define MiB ((uint64_t) 1 << 20)

static struct statfs
fs (long type, uint64_t avail, uint64_t free)
{
  struct statfs sf;
  memset (&sf, 0, sizeof sf);
  sf.f_type = type;
  sf.f_bsize = sf.f_frsize = 4096;
  sf.f_blocks = 1 << 20;
  sf.f_bavail = avail / 4096;
  sf.f_bfree = free / 4096;
  return sf;
}

int
main (void)
{
  struct bfo_space s;
  memset (&s, 0, sizeof s);
  struct statfs xfs = fs (0x58465342, 1024 * MiB, 1024 * MiB);

  /* the first entry asks; 1 GiB free: not tight */
  check (bfo_space_note (&s, 4096) == 1, "the first entry asks for a statfs");
  check (bfo_space_update (&s, &xfs, UINT64_MAX, 0, 0, 0) == 0, "1 GiB free: not tight");
  /* 4 KiB files cost 8 KiB each: about 131000 of them before the count runs
     low; a statfs every 4096 entries meanwhile */
  int asked = 0;
  for (int i = 0; i < 8192; i++)
    if (bfo_space_note (&s, 4096))
      {
        asked++;
        check (bfo_space_update (&s, &xfs, UINT64_MAX, 0, 0, 0) == 0, "still far from full");
      }
  check (asked == 2, "8192 entries far from full: a statfs every 4096 entries");

  /* 20 MiB free, 16 MiB queued: tight for a 1 MiB member */
  memset (&s, 0, sizeof s);
  struct statfs small = fs (0x58465342, 20 * MiB, 20 * MiB);
  check (bfo_space_note (&s, MiB) == 1 && bfo_space_update (&s, &small, UINT64_MAX, 16 * MiB, 16, 0) == 1,
         "20 MiB free, 16 MiB queued: tight");
  check (bfo_space_note (&s, 0) == 1, "tight: the next entry asks again");
  check (bfo_space_update (&s, &small, UINT64_MAX, 0, 0, 0) == 0, "queue written, 20 MiB free: not tight");
  check (s.checks == 2 && s.tight == 1, "counts of statfs and of tight ones");

  /* the count runs low before the next statfs is due */
  memset (&s, 0, sizeof s);
  struct statfs mid = fs (0x58465342, 100 * MiB, 100 * MiB);
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, &mid, UINT64_MAX, 0, 0, 0) == 0,
         "100 MiB free");
  asked = 0;
  for (int i = 0; i < 100 && !asked; i++)
    asked = bfo_space_note (&s, MiB) ? i + 1 : 0;
  check (asked >= 85 && asked <= 95, "1 MiB members: asked again once about 92 MiB may be taken");
  check (bfo_space_low (&s), "then under BFO_SPACE_LOW");

  /* Btrfs: statfs still says 100 MiB after 95 MiB of members */
  memset (&s, 0, sizeof s);
  struct statfs btrfs = fs (0x9123683e, 100 * MiB, 120 * MiB);
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, &btrfs, UINT64_MAX, 0, 0, 0) == 0,
         "Btrfs, 100 MiB available");
  int tight = 0;
  for (int i = 0; i < 95; i++)
    if (bfo_space_note (&s, MiB))
      tight = bfo_space_update (&s, &btrfs, UINT64_MAX, 0, 0, 0);
  check (tight, "Btrfs: 95 MiB later, tight though statfs has not moved");

  /* ext4: root may take the reserved blocks (f_bfree), others not */
  memset (&s, 0, sizeof s);
  struct statfs ext4 = fs (0xef53, 4 * MiB, 60 * MiB);
  bfo_space_note (&s, 0);
  int t = bfo_space_update (&s, &ext4, UINT64_MAX, 0, 0, 0);
  check (geteuid () == 0 ? t == 0 : t == 1,
         "ext4 with 4 MiB available, 60 MiB free: tight only for users other than root");

  /* inodes: 1 GiB free but 20 inodes, 10 files queued to be made: tight */
  memset (&s, 0, sizeof s);
  struct statfs few = fs (0xef53, 1024 * MiB, 1024 * MiB);
  few.f_files = 64;
  few.f_ffree = 20;
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, &few, UINT64_MAX, 0, 10, 10) == 1,
         "20 free inodes, 10 files queued to be made: tight");
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, &few, UINT64_MAX, 0, 10, 0) == 0,
         "20 free inodes, the files queued made already: not tight");
  few.f_ffree = 100;
  memset (&s, 0, sizeof s);
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, &few, UINT64_MAX, 0, 0, 0) == 0,
         "100 free inodes");
  asked = 0;
  for (int i = 0; i < 100 && !asked; i++)
    asked = bfo_space_note (&s, 0) ? i + 1 : 0;
  check (asked == 84, "asked again when fewer than BFO_SPACE_INODES would be left");

  /* a quota leaves less room than the disk: 1 GiB free, 20 MiB of quota
     room, 16 MiB queued: tight for a 1 MiB member; the queue written, not */
  memset (&s, 0, sizeof s);
  check (bfo_space_note (&s, MiB) == 1
         && bfo_space_update (&s, &xfs, 20 * MiB, 16 * MiB, 16, 0) == 1,
         "20 MiB of quota room, 16 MiB queued: tight");
  check (bfo_space_note (&s, MiB) == 1
         && bfo_space_update (&s, &xfs, 20 * MiB, 0, 0, 0) == 0,
         "queue written, 20 MiB of quota room: not tight");
  check (s.quota_checks == 2, "counts of statfs with a quota limit");
  /* the count down starts from the quota's room: asked again within it */
  asked = 0;
  for (int i = 0; i < 20 && !asked; i++)
    asked = bfo_space_note (&s, MiB) ? i + 1 : 0;
  check (asked >= 9 && asked <= 12, "1 MiB members: asked again once the quota's room runs low");
  /* a quota larger than the free space changes nothing */
  memset (&s, 0, sizeof s);
  check (bfo_space_note (&s, MiB) == 1
         && bfo_space_update (&s, &small, 1024 * MiB, 16 * MiB, 16, 0) == 1,
         "20 MiB free, a 1 GiB quota, 16 MiB queued: tight");

  /* no sizes (f_blocks 0), or no statfs: not guarded */
  memset (&s, 0, sizeof s);
  struct statfs none = fs (0x1234, 0, 0);
  none.f_blocks = 0;
  check (bfo_space_note (&s, MiB) == 1 && bfo_space_update (&s, &none, UINT64_MAX, 64 * MiB, 1, 1) == 0,
         "a file system with no sizes: not tight");
  check (bfo_space_note (&s, MiB) == 0, "and not asked again before BFO_SPACE_RECHECK");
  memset (&s, 0, sizeof s);
  check (bfo_space_note (&s, 0) == 1 && bfo_space_update (&s, NULL, UINT64_MAX, 64 * MiB, 1, 1) == 0,
         "statfs failed: not tight");
  return failures ? 1 : 0;
}
