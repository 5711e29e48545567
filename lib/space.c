/* space.c: when a program that makes names ahead of the data it has queued
   must write the queue first, because the file system is running full.

   GNU tar and cp write each file before they make the next name, so on a
   disk that fills up the names they made before it filled have their data,
   and the first one they cannot make fails ("Cannot mkdir", "Cannot open")
   and is not left.  bfotar -x and bfocp -r queue files' data while tar and
   cp make the names after them (directories, inodes, directory blocks):
   those took the space the queued data needed, which then failed "Cannot
   write" and left empty files where GNU left none (120 files of 3 MB onto a
   320 MiB XFS: 120 files, 37 of them empty, against GNU's 84; on a 1 MiB
   ext4 a directory tar could not make was made, with three empty files).
   So before each entry, while free space less what is queued may fall
   under BFO_SPACE_SLACK, the caller writes its queue first.

   Far from full this costs no system call: the space left is counted down
   by what each entry may take (its data in 4 KiB blocks, and one block), and
   statfs is asked again only when that count runs low, or every
   BFO_SPACE_RECHECK entries (other writers, a mount crossed).  Btrfs counts
   data in statfs only once written back (100 MB written: the same free
   space; after sync -f, 100 MB less), so there the data of the entries
   since the first statfs are taken from the space there was then.  Root may
   take ext4's reserved blocks; Btrfs's f_bfree counts space its data cannot
   have (a 320 MiB one: 329 MB free, 250 MB available).  Free inodes count
   as well: fewer than BFO_SPACE_INODES left is near full too (an ext4 made
   with -N 16: bfocp made a directory ahead of three deferred files, whose
   creation then failed where GNU cp's mkdir did).  Quotas are not looked
   at (statfs does not show them).  */

#include <config.h>

#include "bfo-int.h"

#include <stdint.h>
#include <sys/statfs.h>
#include <unistd.h>

#define SPACE_BLOCK 4096u
#define BTRFS_MAGIC 0x9123683e
#define EXT4_MAGIC  0xef53

int
bfo_space_note (struct bfo_space *s, uint64_t size)
{
  uint64_t data = (size + SPACE_BLOCK - 1) / SPACE_BLOCK * SPACE_BLOCK;
  uint64_t cost = SPACE_BLOCK + data;
  s->data += data;
  s->cost = cost;
  s->left = s->left > cost ? s->left - cost : 0;
  s->inodes = s->inodes > 1 ? s->inodes - 1 : 0;
  if (s->left >= BFO_SPACE_SLACK && s->inodes >= BFO_SPACE_INODES
      && ++s->entries < BFO_SPACE_RECHECK)
    return 0;
  s->entries = 0;
  return 1;
}

int
bfo_space_update (struct bfo_space *s, const struct statfs *sf,
                  uint64_t queued_bytes, uint64_t queued_files,
                  uint64_t queued_inodes)
{
  s->checks++;
  /* (a file system that gives no sizes is not guarded) */
  if (!sf || sf->f_blocks == 0)
    {
      s->left = s->inodes = UINT64_MAX;
      return 0;
    }
  /* Inodes: out of them (an ext4 made with few), a directory made ahead
     took the inode a queued file needed (bfocp makes a deferred copy's
     file when it runs it).  Btrfs counts none.  */
  if (sf->f_files == 0)
    s->inodes = UINT64_MAX;
  else
    s->inodes = (uint64_t) sf->f_ffree > queued_inodes + 1
                ? sf->f_ffree - queued_inodes - 1 : 0;
  uint64_t unit = sf->f_frsize ? sf->f_frsize : sf->f_bsize;
  uint64_t avail = (sf->f_type == EXT4_MAGIC && geteuid () == 0
                    ? sf->f_bfree : sf->f_bavail) * unit;
  uint64_t queued = queued_bytes + queued_files * SPACE_BLOCK;
  uint64_t need = queued + s->cost;
  s->left = avail > need ? avail - need : 0;
  if (!s->started)
    {
      s->started = 1;
      s->start = avail > queued ? avail - queued : 0;
      s->data = s->cost - SPACE_BLOCK;
    }
  if (sf->f_type == BTRFS_MAGIC)
    {
      uint64_t bound = s->start > s->data ? s->start - s->data : 0;
      if (bound < s->left)
        s->left = bound;
    }
  if (s->left >= BFO_SPACE_SLACK && s->inodes >= BFO_SPACE_INODES)
    return 0;
  s->tight++;
  return 1;
}
