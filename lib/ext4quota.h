/* ext4quota.h: what the ext4 image writer keeps in step besides inodes and
   directories: extended attribute inodes' charges and the quota files.  Not
   installed.  */

#ifndef BFO_EXT4QUOTA_H
#define BFO_EXT4QUOTA_H 1

#include <ext2fs/ext2fs.h>

/* The extended attribute inodes (ea_inode feature) the attributes of inode
   INO (LI, the whole on-disk inode) refer to: *COUNT of them, *BLOCKS the
   file-system blocks the kernel charges INO for their values (each value's size
   rounded up to clusters), as e2fsck counts them.  0 or -errno.  */
int bfo_ea_inode_charge (ext2_filsys fs, ext2_ino_t ino, const struct ext2_inode_large *li,
                         blk64_t *blocks, unsigned int *count);

/* With the quota feature: 0 if every quota file of FS is one this code can
   rewrite (the kernel's v2 format, revision 1; else -EOPNOTSUPP) with a sound
   tree (else -EUCLEAN: e2fsck first).  */
int bfo_quota_check (ext2_filsys fs);

/* With the quota feature: the usage in every quota file of FS computed anew
   from the inodes as e2fsck computes it (space, inodes; per user, group and
   project), limits and grace times kept.  0 or -errno.  */
int bfo_quota_update (ext2_filsys fs);

#endif
