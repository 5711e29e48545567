/* ext4dirindex.h: hashed (htree) indexes for the directories the ext4 image
   writer made.  Not installed.  */

#ifndef BFO_EXT4DIRINDEX_H
#define BFO_EXT4DIRINDEX_H 1

#include <ext2fs/ext2fs.h>

/* With dir_index: write each directory in DIRS that holds more than a block
   (and is not indexed, inline, casefolded or encrypted, and is mapped by
   extents) again as the kernel would have indexed it: its names sorted by
   hash into leaf blocks with a fifth of each free, one or two levels of
   index, in new blocks (at most 4 runs; a directory for which there are none
   stays as it is).  0 or an errcode; after one, the image needs e2fsck.  */
errcode_t bfo_dir_index (ext2_filsys fs, ext2fs_inode_bitmap dirs);

#endif
