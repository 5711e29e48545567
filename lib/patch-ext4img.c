/* patch-ext4img.c: the ext4 image backend of the batch writer: files go into an unmounted
   ext4 image or block device through libext2fs, each batch's data in runs of free blocks.  */

#include <config.h>

#include "bfo-write-int.h"
#include "ext4dirindex.h"
#include "ext4quota.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <ext2fs/ext2_fs.h>
#include <ext2fs/ext2fs.h>

/* Kinds of queued entries.  */
enum { IMG_FILE = BFO_IMG_FILE, IMG_DIR = BFO_IMG_DIR, IMG_SYMLINK = BFO_IMG_SYMLINK,
       IMG_LINK = BFO_IMG_LINK, IMG_NODE = BFO_IMG_NODE, IMG_XATTR = BFO_IMG_XATTR };

/* The largest single data write, and the most vector elements in it (files
   whose data are not neighbours in the batch buffer but are on disk).  */
#define IMG_MAX_IO_BYTES (32u << 20)
#define IMG_MAX_IOV 1024

/* The memory alignment of the bounce buffer: a page, enough for O_DIRECT.  */
#define IMG_DIRECT_ALIGN 4096

/* Batch defaults of the image backend.  Nothing it writes is visible before the
   volume is mounted, so a batch need not be cut after 100 ms, and each batch
   costs a data sync (the barrier before its metadata): batches are bounded by the
   64 MiB arena (there are two: one filled while the worker thread writes the
   other) and 65536 files.  On the 4 KiB set (131072 files, bfo mkimage) the
   writer's 4096-file, 100 ms batches made 33 batches and 66 syncs; these make 8
   batches and 16 syncs.  */
#define IMG_DEFAULT_BATCH_FILES 65536u
#define IMG_DEFAULT_BATCH_MS 10000u

/* A batch goes before it is full when the worker thread has nothing to do and
   it holds at least this many files or bytes (see idle_cut).  With the
   directory and data work made cheap, bfo mkimage of the 4 KiB set waits on
   the reader, and full 64 MiB batches left the last one, 16384 files, to be
   written after the reader was done (0.3-0.45 s of 8.6 s); bfotar -x
   --ext4-image likewise.  Smaller batches cost a data sync and a metadata
   flush each (0.05-0.1 s here), paid while the worker would wait anyway.  */
#define IMG_IDLE_CUT_FILES 2048u
#define IMG_IDLE_CUT_BYTES (8u << 20)

struct img_entry
{
  int kind;
  char *path;
  char *target;                 /* symlink target, or the existing path of a hard link;
                                   IMG_XATTR: the name, then (after its NUL) LEN bytes
                                   of value */
  const unsigned char *data;    /* IMG_FILE: in the arena, or the caller's (alone) */
  uint64_t len;
  struct bfo_write_attrs attrs;
  void *user;
  size_t add_order;
  bool padded;                  /* data is readable up to the next block boundary */
  struct img_seg *segs;         /* IMG_FILE with holes: its data blocks (the DATA,
                                   one after the other), ascending; else NULL */
  size_t n_segs;
  bool sparse;                  /* SEGS says where the data go (none: all hole) */
  uint64_t size;                /* IMG_FILE: i_size (LEN unless sparse) */
  uint64_t bytes;               /* IMG_FILE: data bytes, for the counters */
  mode_t node_mode;             /* IMG_NODE: its file type (S_IFCHR ...) */
  dev_t rdev;                   /* IMG_NODE: a device's number */
  /* Filled while the batch runs.  */
  ext2_ino_t parent;
  const char *base;
  size_t run_first, n_runs;     /* into the batch's run table */
  int error;
  const char *error_op;
  ext2_ino_t new_ino, old_ino;  /* IMG_FILE replacing OLD_INO: see repoint_files */
  bool repointed;
  bool aliased;                 /* its path goes through a symbolic link (see run_batch) */
  size_t interdir_len;          /* a directory on the way that could not be made: the
                                   first INTERDIR_LEN bytes of PATH, and why */
  int interdir_err;
  mode_t found_mode;            /* IMG_DIR: what was kept at its name (see bfo_written) */
  int attrs_error;
  bool dir_target;              /* IMG_LINK: TARGET was named with a trailing '/' */
  size_t member;                /* IMG_XATTR: its entry in the batch (index + 1), or 0 */
};

struct img_run
{
  blk64_t pblk, len;
};

/* Logical blocks LBLK .. LBLK + LEN - 1 of a sparse file hold data.  */
struct img_seg
{
  blk64_t lblk, len;
};

/* A pending data write: IOV[0..N) go to the image at byte OFF, contiguously.  */
struct img_io
{
  struct iovec iov[IMG_MAX_IOV];
  int n;
  uint64_t off, bytes;
};

/* A name in a directory this writer made (see link_name).  INO 0: removed.  */
struct img_name
{
  char *name;
  ext2_ino_t dir, ino;
  uint32_t hash;                /* of DIR and NAME: most misses compare no name */
  __u16 mode;                   /* the type bits only */
};

/* A map of nonzero keys to values, open addressing at most half full (see
   map_slot, map_put, map_get).  */
struct img_map
{
  uint64_t *key;                /* 0: a free slot */
  size_t *val;
  size_t n, cap;
};

/* A directory whose attributes are set at close, after its last entry was linked.  */
struct img_dirattr
{
  ext2_ino_t ino;
  struct bfo_write_attrs attrs;
  size_t seq;                   /* its entry's add_order */
  size_t prev;                  /* the one before for the same directory, or SIZE_MAX */
  bool keep_dir;                /* found with BFO_ATTR_KEEP_DIR (see tar_dir_view) */
  bool has_early;               /* BFO_ATTR_KEEP_DIR: unless set late (tar_dirs_late), */
  mode_t early_mode;            /* ... its mode is this */
};

/* BFO_WRITE_TAR_DIRS: a directory entry whose attributes tar -x would not
   have set yet (see tar_dirs_note), and one it would have set when entry
   FINAL was added.  */
struct img_dpending
{
  char *path;
  size_t len, seq;
  bool after_links;             /* set in tar's last pass (see tar_dirs_mark) */
};

/* Directory entry SEQ, whose attributes tar sets ORDER-th, when entry FINAL
   is added (IMG_END: at the end; IMG_LATE: in its last pass); SKIP: never
   (--delay-directory-restore, listed again: the later one's are set).  */
struct img_dfinal
{
  size_t seq, final, order;
  bool skip;
};

#define IMG_LATE SIZE_MAX
#define IMG_END (SIZE_MAX - 1)

/* A symbolic link tar makes last (see bfo_target_escapes): first a
   placeholder file NAME in DIR, which it replaces by the link at the end if
   it is still there, changing DIR then.  */
struct img_placeholder
{
  ext2_ino_t dir, ino;
  char *name;
};

/* A batch: the files' data laid out block-aligned as they will be on disk, the
   queued entries, and, while it runs, the runs of blocks given to them.  */
struct img_slot
{
  unsigned char *arena;
  uint64_t arena_used;
  struct img_entry *e;
  size_t n, cap;
  struct img_run *runs;
  size_t n_runs, cap_runs;
  struct timespec first_add;
  struct img_entry **order;     /* set by run_batch: the entries in path order */
  struct bfo_write_stats stats; /* of this batch, added to the writer's when reported */
  uint64_t seq;                 /* queue order; 0: not queued */
  bool done;                    /* ran; waits to be reported */
  int ret;                      /* 0 or -errno that stopped the batch as a whole */
};

struct bfo_ext4img
{
  ext2_filsys fs;
  int fd;                       /* the image, locked; data are written through it */
  ext2_ino_t root;              /* the destination directory */
  struct bfo_write_opts o;
  bfo_write_cb cb;
  void *arg;
  unsigned int bs;
  unsigned int inode_size;
  uint16_t orig_state;
  bool broken;                  /* a metadata write failed: leave the image marked unclean */
  bool freed;                   /* blocks were freed since libext2fs's cache was flushed */
  mode_t umask;
  uid_t uid;
  gid_t gid;
  gid_t *groups;                /* supplementary groups (see in_group) */
  int n_groups;
  /* Two batches: the caller fills one while the worker thread writes the other.  */
  struct img_slot slot[2];
  int cur;                      /* the slot being filled */
  int pending;                  /* the slot handed to the worker and not yet reported, or -1 */
  uint64_t arena_cap;
  size_t added;
  uint64_t queued;              /* batches handed over so far */
  /* Files of the running batch whose names are still to be pointed at
     their new inodes (see repoint_files).  */
  struct img_entry **rp;
  size_t rp_n, rp_cap;
  /* The paths of the batch being filled (see batch_conflict).  */
  uint64_t *ps_key;
  unsigned char *ps_flag;
  size_t ps_n, ps_cap;
  pthread_t thread;
  bool threaded, quit;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  /* The worker's: the batch it runs, and what persists between batches.  */
  struct img_slot *rb;
  struct img_dirattr *dirs;
  size_t n_dirs, cap_dirs;
  blk64_t goal;
  ext2fs_inode_bitmap made_dirs;  /* directories this writer made (see link_name) */
  ext2fs_inode_bitmap loaded;     /* others whose names are in the index (see load_dir) */
  ext2fs_inode_bitmap touched;    /* directories whose entries changed (see touch_dir) */
  ext2fs_inode_bitmap opaque;     /* symbolic links not followed (see create_symlink) */
  ext2fs_inode_bitmap seen_dirs;  /* directories of the image linked into (see link_name), */
  ext2fs_inode_bitmap small_dirs; /* ... those of one block then, not indexed */
  ext2_ino_t *touched_list;
  size_t n_touched, cap_touched;
  /* BFO_WRITE_TAR_DIRS: the caller's thread's stack of directories whose
     attributes tar would still delay, and those it would have set; the
     worker's last entry changing each directory (by inode, open hash).  */
  struct img_dpending *dpend;
  size_t n_dpend, cap_dpend;
  size_t *dp_slot;              /* BFO_WRITE_TAR_DELAY: an index of DPEND's paths */
  size_t n_dp_slots;
  struct img_placeholder *ph;   /* BFO_WRITE_TAR_DIRS: links tar makes last */
  size_t n_ph, cap_ph;
  struct img_dfinal *dfinal;
  size_t n_dfinal, cap_dfinal;
  /* ... and, for the worker (under MU), the entry when tar sets each
     directory entry's attributes before the end (key: the entry's
     add_order + 1); the worker's last attributes of each directory inode
     (key: the inode; value: index into DIRS + 1), and the last entry
     changing each directory (key: the inode).  */
  struct img_map fin, da, lt;
  size_t cur_seq;               /* add_order of the entry being made */
  bool dir_target;              /* the link being added: see bfo_ext4img_add */
  ext2_ino_t absent;            /* resolve_parent takes this inode's names as gone */
  char *pc_dir;                 /* the last parent resolved ("" = root) and its inode */
  ext2_ino_t pc_ino;
  size_t mk_fail_len;           /* the last resolve_parent's directory it could not make */
  int mk_fail_err;
  bool mk_fail_enoent;          /* ... where the call on the entry's own name fails ENOENT */
  char *xs_dir;                 /* the last parent looked at by through_symlink, and its answer */
  size_t xs_len;
  bool xs_valid, xs_val;
  /* Directories this writer made hold only the names it linked: those names are
     indexed in NAMES (an open hash table), and the last block of the directory
     being filled is kept in DB_BLOCK and written once, when it is full, when
     another directory's turn comes, before libext2fs touches a directory, and
     at the end of the batch (see link_name).  */
  bool fast_dirs;
  struct img_name *names;
  size_t n_names, cap_names;
  ext2_ino_t db_dir;            /* whose last block DB_BLOCK holds, or 0 */
  blk64_t db_pblk;
  unsigned int db_last;         /* offset of its last entry */
  unsigned int db_end;          /* where entries end (the checksum tail begins) */
  bool db_dirty;
  int db_err;                   /* a failed write of DB_BLOCK, for the batch's end */
  unsigned char *db_block;
  unsigned char *bounce;        /* one block, for unpadded tails */
  bool direct;                  /* FD writes bypass the page cache (O_DIRECT) */
  struct img_io *io;
  struct bfo_write_stats stats;
  int stop;
};



/* A libext2fs error as a negative errno.  Values below 256 are errno values
   passed up from the I/O layer.  */
static int
img_errno (errcode_t err)
{
  if (err == 0)
    return 0;
  if (err > 0 && err < 256)
    return -(int) err;
  switch (err)
    {
    case EXT2_ET_NO_MEMORY:
      return -ENOMEM;
    case EXT2_ET_BLOCK_ALLOC_FAIL: case EXT2_ET_INODE_ALLOC_FAIL:
    case EXT2_ET_DIR_NO_SPACE: case EXT2_ET_EXTENT_NO_SPACE:
    case EXT2_ET_DIR_NO_SPACE_FOR_CSUM: case EXT2_ET_INLINE_DATA_NO_SPACE:
    case EXT2_ET_EA_NO_SPACE:
      return -ENOSPC;
    case EXT2_ET_FILE_NOT_FOUND:
      return -ENOENT;
    case EXT2_ET_SYMLINK_LOOP:
      return -ELOOP;
    case EXT2_ET_NO_DIRECTORY:
      return -ENOTDIR;
    case EXT2_ET_FILE_EXISTS: case EXT2_ET_DIR_EXISTS:
      return -EEXIST;
    case EXT2_ET_RO_FILSYS:
      return -EROFS;
    case EXT2_ET_BAD_MAGIC:
      return -EMEDIUMTYPE;
    case EXT2_ET_UNSUPP_FEATURE: case EXT2_ET_RO_UNSUPP_FEATURE:
    case EXT2_ET_DIRHASH_UNSUPP: case EXT2_ET_UNKNOWN_CSUM:
      return -EOPNOTSUPP;
    case EXT2_ET_SHORT_READ: case EXT2_ET_SHORT_WRITE:
      return -EIO;
    case EXT2_ET_DIR_CORRUPTED: case EXT2_ET_DIR_CSUM_INVALID:
    case EXT2_ET_INODE_CSUM_INVALID: case EXT2_ET_INODE_CORRUPTED:
    case EXT2_ET_EXTENT_CSUM_INVALID: case EXT2_ET_EXTENT_HEADER_BAD:
    case EXT2_ET_BLOCK_BITMAP_CSUM_INVALID: case EXT2_ET_INODE_BITMAP_CSUM_INVALID:
    case EXT2_ET_SB_CSUM_INVALID: case EXT2_ET_CORRUPT_SUPERBLOCK:
    case EXT2_ET_FILESYSTEM_CORRUPTED: case EXT2_ET_EXT_ATTR_CSUM_INVALID:
      return -EUCLEAN;
    case EXT2_ET_INVALID_ARGUMENT:
      return -EINVAL;
    default:
      return -EIO;
    }
}

/* ------------------------------------------------------------------ opening */

/* Whether the regular file ST is the backing file of a loop device (mounted or
   not: a mount could come at any time, and the kernel would cache what we change).  */
static bool
loop_backed (const struct stat *st, char *dev, size_t devsize)
{
  DIR *d = opendir ("/sys/block");
  if (!d)
    return false;
  bool found = false;
  struct dirent *de;
  while (!found && (de = readdir (d)))
    {
      if (strncmp (de->d_name, "loop", 4) != 0)
        continue;
      char path[PATH_MAX], back[PATH_MAX];
      snprintf (path, sizeof path, "/sys/block/%s/loop/backing_file", de->d_name);
      FILE *f = fopen (path, "re");
      if (!f)
        continue;
      if (fgets (back, sizeof back, f))
        {
          back[strcspn (back, "\n")] = '\0';
          struct stat bst;
          if (stat (back, &bst) == 0 && bst.st_dev == st->st_dev && bst.st_ino == st->st_ino)
            {
              found = true;
              snprintf (dev, devsize, "/dev/%s", de->d_name);
            }
        }
      fclose (f);
    }
  closedir (d);
  return found;
}

/* The checks shared by bfo_image_check and bfo_ext4img_open; FD_OUT (may be NULL)
   receives a locked descriptor of IMAGE.  */
static int
check_image_file (const char *image, bool write, int *fd_out)
{
  struct stat st;
  if (stat (image, &st) < 0)
    return -errno;
  bool blk = S_ISBLK (st.st_mode);
  if (!blk && !S_ISREG (st.st_mode))
    return -ENOTBLK;
  /* Raw metadata of a device is root's business (decision 2 of the design),
     whatever the device node's permissions say.  */
  if (blk && geteuid () != 0)
    return -EPERM;
  int mount_flags = 0;
  if (ext2fs_check_if_mounted (image, &mount_flags) == 0
      && (mount_flags & (EXT2_MF_MOUNTED | EXT2_MF_BUSY | EXT2_MF_SWAP)))
    return -EBUSY;
  char dev[300];
  if (!blk && loop_backed (&st, dev, sizeof dev))
    return -EBUSY;
  /* O_EXCL on a block device fails with EBUSY while the kernel has it mounted.  */
  int fd = open (image, (write ? O_RDWR : O_RDONLY) | O_CLOEXEC | (blk ? O_EXCL : 0));
  if (fd < 0)
    return -errno;
  /* One writer per image: a second bfo writer waits for nobody, it fails.  */
  if (flock (fd, (write ? LOCK_EX : LOCK_SH) | LOCK_NB) < 0)
    {
      int e = errno == EWOULDBLOCK ? EBUSY : errno;
      close (fd);
      return -e;
    }
  if (fd_out)
    *fd_out = fd;
  else
    close (fd);
  return 0;
}

/* Refuse what this backend does not write correctly, and volumes that need fsck.  */
static int
check_fs (ext2_filsys fs)
{
  struct ext2_super_block *sb = fs->super;
  if (!ext2fs_has_feature_extents (sb) || ext2fs_has_feature_bigalloc (sb))
    return -EOPNOTSUPP;
  if (ext2fs_has_feature_journal_needs_recovery (sb) || (sb->s_state & EXT2_ERROR_FS)
      || !(sb->s_state & EXT2_VALID_FS) || sb->s_last_orphan
      || ext2fs_has_feature_orphan_present (sb))
    return -EUCLEAN;
  /* Quota files are rewritten at close: only in the format we write.  */
  return bfo_quota_check (fs);
}

static int
open_fs (const char *image, bool write, ext2_filsys *fsp)
{
  int flags = EXT2_FLAG_64BITS | (write ? EXT2_FLAG_RW : 0);
  errcode_t err = ext2fs_open2 (image, NULL, flags, 0, 0, unix_io_manager, fsp);
  if (err)
    return img_errno (err);
  int r = check_fs (*fsp);
  if (r < 0)
    {
      ext2fs_close_free (fsp);
      return r;
    }
  return 0;
}

/* Resolve DIR (absolute in the image), following symbolic links.  */
static int
lookup_path (ext2_filsys fs, const char *dir, ext2_ino_t *ino)
{
  ext2_ino_t cur = EXT2_ROOT_INO;
  const char *p = dir;
  while (*p)
    {
      while (*p == '/')
        p++;
      if (!*p)
        break;
      size_t k = strcspn (p, "/");
      ext2_ino_t next;
      errcode_t err = ext2fs_lookup (fs, cur, p, k, NULL, &next);
      if (err)
        return img_errno (err);
      struct ext2_inode inode;
      err = ext2fs_read_inode (fs, next, &inode);
      /* A symbolic link is followed, as tar -C follows it on the mounted
         image (absolute targets from the image's root).  */
      if (!err && LINUX_S_ISLNK (inode.i_mode))
        {
          err = ext2fs_follow_link (fs, EXT2_ROOT_INO, cur, next, &next);
          if (!err)
            err = ext2fs_read_inode (fs, next, &inode);
        }
      if (err)
        return img_errno (err);
      if (!LINUX_S_ISDIR (inode.i_mode))
        return -ENOTDIR;
      cur = next;
      p += k;
    }
  *ino = cur;
  return 0;
}

int
bfo_image_check (const char *image, const char *dir)
{
  int r = check_image_file (image, false, NULL);
  if (r < 0)
    return r;
  ext2_filsys fs;
  r = open_fs (image, false, &fs);
  if (r < 0)
    return r;
  ext2_ino_t ino;
  r = lookup_path (fs, dir && *dir ? dir : "/", &ino);
  ext2fs_close_free (&fs);
  return r;
}

/* ------------------------------------------------------------------ inodes */

/* The range of times an inode can hold, as the kernel's ext4 sets it
   (s_time_min, s_time_max): 32 signed bits of seconds, and with the extra
   fields 2 epoch bits more (up to 2446-05-10).  */
#define IMG_TIME_MIN ((int64_t) INT32_MIN)
#define IMG_TIME_MAX_SMALL ((int64_t) INT32_MAX)
#define IMG_TIME_MAX_LARGE (((int64_t) 1 << 34) - 1 + INT32_MIN)

/* Set an on-disk time: 32 bits of seconds, and where the inode is large enough
   the epoch bits and nanoseconds (ext4's encoding).  A time out of range is
   clamped to it, with no nanoseconds, as the kernel does (timestamp_truncate)
   when tar -x sets it on a mounted file system.  */
static void
set_time (bool large, __u32 *lo, __u32 *extra, struct timespec ts)
{
  int64_t max = large ? IMG_TIME_MAX_LARGE : IMG_TIME_MAX_SMALL;
  if (ts.tv_sec <= IMG_TIME_MIN || ts.tv_sec >= max)
    {
      ts.tv_sec = ts.tv_sec <= IMG_TIME_MIN ? IMG_TIME_MIN : max;
      ts.tv_nsec = 0;
    }
  *lo = (__u32) ts.tv_sec;
  if (large)
    *extra = ((__u32) (((int64_t) ts.tv_sec - (int32_t) *lo) >> 32) & EXT4_EPOCH_MASK)
             | ((__u32) ts.tv_nsec << EXT4_EPOCH_BITS);
}

/* Whether LI has the nanosecond and creation-time fields.  */
static bool
has_extra (const struct bfo_ext4img *w, const struct ext2_inode_large *li)
{
  return w->inode_size > EXT2_GOOD_OLD_INODE_SIZE
         && (size_t) EXT2_GOOD_OLD_INODE_SIZE + li->i_extra_isize
            >= offsetof (struct ext2_inode_large, i_crtime_extra) + sizeof li->i_crtime_extra;
}

static struct timespec
now_ts (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_REALTIME, &ts);
  return ts;
}

/* Apply A (or the defaults of a new file: creator's owner, now) to LI.  NEW: the
   inode is being created (ctime/crtime are now; unset attributes get defaults).  */
static void
apply_attrs (struct bfo_ext4img *w, struct ext2_inode_large *li, const struct bfo_write_attrs *a,
             bool is_new)
{
  bool large = has_extra (w, li);
  struct timespec now = now_ts ();
  if (is_new)
    {
      li->i_uid = w->uid & 0xffff;
      ext2fs_set_i_uid_high (*li, w->uid >> 16);
      li->i_gid = w->gid & 0xffff;
      ext2fs_set_i_gid_high (*li, w->gid >> 16);
      set_time (large, &li->i_atime, &li->i_atime_extra, now);
      set_time (large, &li->i_mtime, &li->i_mtime_extra, now);
      if (large)
        set_time (large, &li->i_crtime, &li->i_crtime_extra, now);
    }
  set_time (large, &li->i_ctime, &li->i_ctime_extra, now);
  if (a->flags & BFO_ATTR_OWNER)
    {
      if (a->uid != (uid_t) -1)
        {
          li->i_uid = a->uid & 0xffff;
          ext2fs_set_i_uid_high (*li, a->uid >> 16);
        }
      if (a->gid != (gid_t) -1)
        {
          li->i_gid = a->gid & 0xffff;
          ext2fs_set_i_gid_high (*li, a->gid >> 16);
        }
    }
  if ((a->flags & BFO_ATTR_MODE) && !LINUX_S_ISLNK (li->i_mode))
    li->i_mode = a->flags & BFO_ATTR_MODE_PERMS
                 ? (li->i_mode & (LINUX_S_IFMT | 07000)) | (a->mode & 0777)
                 : a->flags & BFO_ATTR_NEW_SGID
                 ? (li->i_mode & (LINUX_S_IFMT | LINUX_S_ISGID)) | (a->mode & 07777)
                 : (li->i_mode & LINUX_S_IFMT) | (a->mode & 07777);
  if (a->flags & BFO_ATTR_ATIME)
    set_time (large, &li->i_atime, &li->i_atime_extra, a->atime);
  if (a->flags & BFO_ATTR_MTIME)
    set_time (large, &li->i_mtime, &li->i_mtime_extra, a->mtime);
}

/* A zeroed in-memory inode of the image's inode size.  */
static struct ext2_inode_large *
new_inode_buf (struct bfo_ext4img *w)
{
  struct ext2_inode_large *li = calloc (1, w->inode_size);
  if (li && w->inode_size > EXT2_GOOD_OLD_INODE_SIZE)
    li->i_extra_isize = sizeof (struct ext2_inode_large) - EXT2_GOOD_OLD_INODE_SIZE;
  return li;
}

static int read_full (struct bfo_ext4img *w, ext2_ino_t ino, struct ext2_inode_large **lip);

/* What a new inode takes from its directory, as ext4's __ext4_new_inode
   gives it (EXT4_FL_INHERITED through ext4_mask_flags): a directory all of
   these flags, a regular file all but the directory ones, other types only
   nodump and noatime; and the directory's project ID under +P.  */
#define INHERIT_FL (EXT2_SECRM_FL | EXT2_UNRM_FL | EXT2_COMPR_FL | EXT2_SYNC_FL \
                    | EXT2_NODUMP_FL | EXT2_NOATIME_FL | EXT2_NOCOMPR_FL \
                    | EXT3_JOURNAL_DATA_FL | EXT2_NOTAIL_FL | EXT2_DIRSYNC_FL \
                    | EXT4_PROJINHERIT_FL | EXT4_CASEFOLD_FL | FS_DAX_FL)
#define DIR_ONLY_FL (EXT2_DIRSYNC_FL | EXT2_TOPDIR_FL | EXT4_CASEFOLD_FL | EXT4_PROJINHERIT_FL)

/* Whether LI has room for its project ID.  */
static bool
has_projid (const struct bfo_ext4img *w, const struct ext2_inode_large *li)
{
  return w->inode_size > EXT2_GOOD_OLD_INODE_SIZE
         && (size_t) EXT2_GOOD_OLD_INODE_SIZE + li->i_extra_isize
            >= offsetof (struct ext2_inode_large, i_projid) + sizeof li->i_projid;
}

/* BFO_WRITE_TAR_DIRS: tar -x sets a directory's attributes when it reaches
   a member not under it (see tar_dirs_note), and what it makes in the
   directory after that takes the directory's new set-group-ID bit and group
   (a directory made on the way, a file it does not chown), where this
   writer sets them only at close.  The caller's thread records when tar
   sets each directory entry's (fin_put, under MU), the worker keeps each
   directory inode's attributes (da_put), and inherit looks at the
   directory as tar has it then (tar_dir_view).  */

static size_t
mix (uint64_t x, size_t cap)
{
  x *= 0x9e3779b97f4a7c15ull;
  return (size_t) (x >> 32) & (cap - 1);
}

/* The slot of KEY in M (which has slots): holding it, or free.  */
static size_t
map_slot (const struct img_map *m, uint64_t key)
{
  size_t i = mix (key, m->cap);
  while (m->key[i] && m->key[i] != key)
    i = (i + 1) & (m->cap - 1);
  return i;
}

/* KEY's slot in M, made (value 0) if new; SIZE_MAX without memory.  */
static size_t
map_put (struct img_map *m, uint64_t key)
{
  if (2 * (m->n + 1) > m->cap)
    {
      size_t ncap = m->cap ? 2 * m->cap : 256;
      struct img_map g = { calloc (ncap, sizeof *g.key), malloc (ncap * sizeof *g.val),
                           m->n, ncap };
      if (!g.key || !g.val)
        {
          free (g.key);
          free (g.val);
          return SIZE_MAX;
        }
      for (size_t i = 0; i < m->cap; i++)
        if (m->key[i])
          {
            size_t j = map_slot (&g, m->key[i]);
            g.key[j] = m->key[i];
            g.val[j] = m->val[i];
          }
      free (m->key);
      free (m->val);
      *m = g;
    }
  size_t i = map_slot (m, key);
  if (!m->key[i])
    {
      m->key[i] = key;
      m->val[i] = 0;
      m->n++;
    }
  return i;
}

/* KEY's value in M into *VAL: false if it has none.  */
static bool
map_get (const struct img_map *m, uint64_t key, size_t *val)
{
  if (!m->cap)
    return false;
  size_t i = map_slot (m, key);
  if (!m->key[i])
    return false;
  *val = m->val[i];
  return true;
}

/* Directory entry SEQ's attributes are set when entry FINAL comes.  Without
   memory they count as set at the end.  */
static void
fin_put (struct bfo_ext4img *w, size_t seq, size_t final)
{
  pthread_mutex_lock (&w->mu);
  size_t i = map_put (&w->fin, seq + 1);
  if (i != SIZE_MAX)
    w->fin.val[i] = final;
  pthread_mutex_unlock (&w->mu);
}

/* When directory entry SEQ's attributes are set: an entry, or IMG_END.  */
static size_t
fin_get (struct bfo_ext4img *w, size_t seq)
{
  size_t final;
  pthread_mutex_lock (&w->mu);
  if (!map_get (&w->fin, seq + 1, &final))
    final = IMG_END;
  pthread_mutex_unlock (&w->mu);
  return final;
}

/* DIRS[I] is directory inode INO's latest: chain it to the one before.
   Without memory it is not chained (tar_dir_view does not see it).  */
static void
da_put (struct bfo_ext4img *w, ext2_ino_t ino, size_t i)
{
  size_t j = map_put (&w->da, ino);
  w->dirs[i].prev = j == SIZE_MAX || !w->da.val[j] ? SIZE_MAX : w->da.val[j] - 1;
  if (j != SIZE_MAX)
    w->da.val[j] = i + 1;
}

/* PL, directory DIR as it is in the image, as tar has it when the entry being
   made (CUR_SEQ) comes: with the modes and owners of its directory entries
   before CUR_SEQ whose attributes tar has set by then, oldest first, and
   without set-user-ID, set-group-ID and sticky bits if a later one came
   with --no-overwrite-dir (tar's chmod to a safe mode until it sets them).  */
static void
tar_dir_view (struct bfo_ext4img *w, ext2_ino_t dir, struct ext2_inode_large *pl)
{
  size_t last;
  if ((w->o.flags & (BFO_WRITE_TAR_DIRS | BFO_WRITE_TAR_DELAY)) != BFO_WRITE_TAR_DIRS
      || !map_get (&w->da, dir, &last))
    return;
  size_t n = 0;
  for (size_t i = last - 1; i != SIZE_MAX; i = w->dirs[i].prev)
    n++;
  size_t buf[16], *chain = n <= 16 ? buf : malloc (n * sizeof *chain);
  if (!chain)
    return;
  n = 0;
  for (size_t i = last - 1; i != SIZE_MAX; i = w->dirs[i].prev)
    chain[n++] = i;
  bool safe = false;
  while (n--)
    {
      const struct img_dirattr *d = &w->dirs[chain[n]];
      if (d->seq >= w->cur_seq)
        continue;               /* (made early: comes later in tar's order) */
      if (fin_get (w, d->seq) > w->cur_seq)
        {
          safe |= d->keep_dir;
          continue;
        }
      struct bfo_write_attrs a = d->attrs;
      a.flags &= BFO_ATTR_OWNER | BFO_ATTR_MODE | BFO_ATTR_MODE_PERMS | BFO_ATTR_NEW_SGID;
      if (d->has_early)
        a.mode = d->early_mode;
      apply_attrs (w, pl, &a, false);
      safe = false;
    }
  if (chain != buf)
    free (chain);
  if (safe)
    pl->i_mode &= ~07000;
}

/* Give the new inode LI (its type in i_mode) what it inherits from DIR.  In a
   set-group-ID directory it also takes the directory's group (not when A
   gives it one, as tar's chown then does) and, a directory, the set-group-ID
   bit (not when A gives its mode but with BFO_ATTR_MODE_PERMS or
   BFO_ATTR_NEW_SGID, as tar's chmod then does), as the
   kernel's inode_init_owner gives them.  */
static void
inherit (struct bfo_ext4img *w, ext2_ino_t dir, struct ext2_inode_large *li,
         const struct bfo_write_attrs *a)
{
  struct ext2_inode_large *pl;
  if (read_full (w, dir, &pl) < 0)
    return;
  tar_dir_view (w, dir, pl);
  if (pl->i_mode & LINUX_S_ISGID)
    {
      if (!(a->flags & BFO_ATTR_OWNER) || a->gid == (gid_t) -1)
        {
          li->i_gid = pl->i_gid;
          ext2fs_set_i_gid_high (*li, pl->osd2.linux2.l_i_gid_high);
        }
      if (LINUX_S_ISDIR (li->i_mode)
          && (!(a->flags & BFO_ATTR_MODE)
              || (a->flags & (BFO_ATTR_MODE_PERMS | BFO_ATTR_NEW_SGID))))
        li->i_mode |= LINUX_S_ISGID;
    }
  __u32 f = pl->i_flags & INHERIT_FL;
  if (LINUX_S_ISREG (li->i_mode))
    f &= ~DIR_ONLY_FL;
  else if (!LINUX_S_ISDIR (li->i_mode))
    f &= EXT2_NODUMP_FL | EXT2_NOATIME_FL;
  li->i_flags |= f;
  if ((pl->i_flags & EXT4_PROJINHERIT_FL) && ext2fs_has_feature_project (w->fs->super)
      && has_projid (w, pl) && has_projid (w, li))
    li->i_projid = pl->i_projid;
  free (pl);
}

static int
read_full (struct bfo_ext4img *w, ext2_ino_t ino, struct ext2_inode_large **lip)
{
  struct ext2_inode_large *li = malloc (w->inode_size);
  if (!li)
    return -ENOMEM;
  errcode_t err = ext2fs_read_inode_full (w->fs, ino, (struct ext2_inode *) li, w->inode_size);
  if (err)
    {
      free (li);
      return img_errno (err);
    }
  *lip = li;
  return 0;
}

static int
write_full (struct bfo_ext4img *w, ext2_ino_t ino, struct ext2_inode_large *li)
{
  return img_errno (ext2fs_write_inode_full (w->fs, ino, (struct ext2_inode *) li,
                                             w->inode_size));
}

/* The names of INO's extended attributes, collected by ext2fs_xattrs_iterate.  */
struct xa_names
{
  char **v;
  size_t n, cap;
  bool failed;
};

static int
xa_name_cb (char *name, char *value, size_t len, void *data)
{
  (void) value;
  (void) len;
  struct xa_names *x = data;
  if (x->n == x->cap)
    {
      size_t cap = x->cap ? 2 * x->cap : 8;
      char **v = realloc (x->v, cap * sizeof *v);
      if (!v)
        {
          x->failed = true;
          return XATTR_ABORT;
        }
      x->v = v;
      x->cap = cap;
    }
  if (!(x->v[x->n] = strdup (name)))
    {
      x->failed = true;
      return XATTR_ABORT;
    }
  x->n++;
  return 0;
}

/* Remove the extended attributes of INO (LI) if any keeps its value in an
   attribute inode (ea_inode), so that those inodes lose its reference and
   are freed with the last one, as the kernel frees them.  1 if it removed
   them (INO's inode changed), 0 if there were none such, or -errno.  */
static int
drop_ea_inodes (struct bfo_ext4img *w, ext2_ino_t ino, const struct ext2_inode_large *li)
{
  blk64_t blocks;
  unsigned int count;
  int r = bfo_ea_inode_charge (w->fs, ino, li, &blocks, &count);
  if (r < 0 || count == 0)
    return r;
  struct ext2_xattr_handle *h;
  errcode_t err = ext2fs_xattrs_open (w->fs, ino, &h);
  if (err)
    return img_errno (err);
  struct xa_names x = { NULL, 0, 0, false };
  err = ext2fs_xattrs_read (h);
  if (!err)
    err = ext2fs_xattrs_iterate (h, xa_name_cb, &x);
  for (size_t i = 0; i < x.n; i++)
    {
      if (!err)
        err = ext2fs_xattr_remove (h, x.v[i]);
      free (x.v[i]);
    }
  free (x.v);
  errcode_t cerr = ext2fs_xattrs_close (&h);
  if (!err)
    err = cerr;
  return x.failed ? -ENOMEM : err ? img_errno (err) : 1;
}

/* The kernel's guard, which holds for root too: an immutable or append-only
   inode is neither removed, replaced, linked to nor written in place (nor its
   attributes changed), and an immutable directory neither gets a name nor
   loses one (an append-only one only gets them).  tar -x on the mounted image
   meets EPERM there; so does this writer.  */
#define GUARD_FL (EXT2_IMMUTABLE_FL | EXT2_APPEND_FL)

static __u32
inode_flags (struct bfo_ext4img *w, ext2_ino_t ino)
{
  struct ext2_inode in;
  return ext2fs_read_inode (w->fs, ino, &in) == 0 ? in.i_flags : 0;
}

static __u32
guard_flags (struct bfo_ext4img *w, ext2_ino_t ino)
{
  return inode_flags (w, ino) & GUARD_FL;
}

/* may_add for a directory with flags FLAGS.  */
static int
add_refused (__u32 flags)
{
  return flags & EXT2_IMMUTABLE_FL ? -EPERM
         : flags & (EXT4_CASEFOLD_FL | EXT4_ENCRYPT_FL) ? -EOPNOTSUPP : 0;
}

/* May a name be added to directory DIR?  0, -EPERM, or -EOPNOTSUPP for a
   case-folded directory (chattr +F: the kernel finds a name there by its
   case-folded form, and makes new directories in it case-folded too; this
   writer matches names byte for byte, so it would add "A" beside "a") or an
   encrypted one (fscrypt: its names and contents are ciphertext, which this
   writer cannot make).  */
static int
may_add (struct bfo_ext4img *w, ext2_ino_t dir)
{
  return add_refused (inode_flags (w, dir));
}

/* May the name of inode INO in directory DIR go?  0 or -EPERM.  */
static int
may_remove (struct bfo_ext4img *w, ext2_ino_t dir, ext2_ino_t ino)
{
  return guard_flags (w, dir) || guard_flags (w, ino) ? -EPERM : 0;
}

/* Drop one link of inode INO (its name is already gone); free it with its blocks
   and extended-attribute block (and attribute inodes) when that was the last.  */
static int
drop_link (struct bfo_ext4img *w, ext2_ino_t ino)
{
  struct ext2_inode_large *li;
  int r = read_full (w, ino, &li);
  if (r < 0)
    return r;
  if (li->i_links_count > 1)
    {
      li->i_links_count--;
      set_time (has_extra (w, li), &li->i_ctime, &li->i_ctime_extra, now_ts ());
      r = write_full (w, ino, li);
      free (li);
      return r;
    }
  if (ext2fs_has_feature_ea_inode (w->fs->super)
      && (r = drop_ea_inodes (w, ino, li)) != 0)
    {
      free (li);
      if (r > 0)
        r = read_full (w, ino, &li);
      if (r < 0)
        return r;
    }
  errcode_t err = 0;
  w->freed = true;
  if (ext2fs_inode_has_valid_blocks2 (w->fs, (struct ext2_inode *) li))
    err = ext2fs_punch (w->fs, ino, (struct ext2_inode *) li, NULL, 0, ~0ULL);
  if (!err && ext2fs_file_acl_block (w->fs, (struct ext2_inode *) li))
    err = ext2fs_free_ext_attr (w->fs, ino, li);
  if (!err)
    {
      li->i_links_count = 0;
      li->i_dtime = (__u32) time (NULL);
      r = write_full (w, ino, li);
      if (r == 0)
        ext2fs_inode_alloc_stats2 (w->fs, ino, -1, LINUX_S_ISDIR (li->i_mode));
    }
  free (li);
  return err ? img_errno (err) : r;
}

/* ------------------------------------------------------------------ directories */

static int dir_release (struct bfo_ext4img *w);

static uint32_t
name_hash (ext2_ino_t dir, const char *name)
{
  uint64_t h = 0xcbf29ce484222325ull ^ dir;
  for (const unsigned char *p = (const unsigned char *) name; *p; p++)
    h = (h ^ *p) * 0x100000001b3ull;
  return (uint32_t) (h ^ (h >> 32));
}

/* The slot of NAME in DIR: its entry, or the empty slot it would take.  */
static struct img_name *
name_slot (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, uint32_t hash)
{
  size_t h = hash & (w->cap_names - 1);
  while (w->names[h].name
         && !(w->names[h].hash == hash && w->names[h].dir == dir
              && strcmp (w->names[h].name, name) == 0))
    h = (h + 1) & (w->cap_names - 1);
  return &w->names[h];
}

/* Record NAME -> INO (MODE's type; INO 0: removed) in the index of directory
   DIR, which this writer made.  Without memory for it the index goes: lookups
   read the directories again (dir_release has written everything before).  */
static void
name_set (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, ext2_ino_t ino,
          __u16 mode)
{
  if (!w->fast_dirs)
    return;
  if (2 * (w->n_names + 1) > w->cap_names)
    {
      size_t ocap = w->cap_names;
      struct img_name *old = w->names;
      w->cap_names = ocap ? 2 * ocap : 4096;
      w->names = calloc (w->cap_names, sizeof *w->names);
      if (!w->names)
        {
          w->names = old;
          w->cap_names = ocap;
          dir_release (w);
          w->fast_dirs = false;
          return;
        }
      for (size_t i = 0; i < ocap; i++)
        if (old[i].name)
          *name_slot (w, old[i].dir, old[i].name, old[i].hash) = old[i];
      free (old);
    }
  uint32_t hash = name_hash (dir, name);
  struct img_name *x = name_slot (w, dir, name, hash);
  if (!x->name)
    {
      if (!(x->name = strdup (name)))
        {
          dir_release (w);
          w->fast_dirs = false;
          return;
        }
      x->dir = dir;
      x->hash = hash;
      w->n_names++;
    }
  x->ino = ino;
  x->mode = mode & LINUX_S_IFMT;
}

/* Whether DIR's names are kept in the index (when there is one): it was
   made by this writer, or loaded.  */
static bool
in_index (struct bfo_ext4img *w, ext2_ino_t dir)
{
  return ext2fs_test_inode_bitmap2 (w->made_dirs, dir)
         || ext2fs_test_inode_bitmap2 (w->loaded, dir);
}

/* Whether DIR's names are all in the index.  */
static bool
indexed (struct bfo_ext4img *w, ext2_ino_t dir)
{
  return w->fast_dirs && in_index (w, dir);
}

/* The mode type of directory entry type TYPE, or 0.  */
static __u16
ft_mode (int type)
{
  static const __u16 mode_of[EXT2_FT_MAX] = {
    [EXT2_FT_REG_FILE] = LINUX_S_IFREG, [EXT2_FT_DIR] = LINUX_S_IFDIR,
    [EXT2_FT_CHRDEV] = LINUX_S_IFCHR, [EXT2_FT_BLKDEV] = LINUX_S_IFBLK,
    [EXT2_FT_FIFO] = LINUX_S_IFIFO, [EXT2_FT_SOCK] = LINUX_S_IFSOCK,
    [EXT2_FT_SYMLINK] = LINUX_S_IFLNK,
  };
  return type >= 0 && type < EXT2_FT_MAX ? mode_of[type] : 0;
}

struct load_ctx
{
  struct bfo_ext4img *w;
  bool ok;
};

/* Whether a directory iterator's entry DE is "." or "..".  An inline-data
   directory's come as entries of blocks of their own
   (ext2fs_inline_data_dir_iterate): ".." as DIRENT_OTHER_FILE.  */
static bool
dot_entry (int entry, const struct ext2_dir_entry *de)
{
  if (entry == DIRENT_DOT_FILE || entry == DIRENT_DOT_DOT_FILE)
    return true;
  int len = ext2fs_dirent_name_len (de);
  return de->name[0] == '.' && (len == 1 || (len == 2 && de->name[1] == '.'));
}

static int
load_cb (ext2_ino_t dir, int entry, struct ext2_dir_entry *de, int offset, int blocksize,
         char *buf, void *arg)
{
  (void) offset;
  (void) blocksize;
  (void) buf;
  struct load_ctx *c = arg;
  if (dot_entry (entry, de) || de->inode == 0)
    return 0;
  int len = ext2fs_dirent_name_len (de);
  __u16 mode = ft_mode (ext2fs_dirent_file_type (de));
  char name[EXT2_NAME_LEN + 1];
  memcpy (name, de->name, len);
  name[len] = '\0';
  if (mode)
    name_set (c->w, dir, name, de->inode, mode);
  if (!mode || !c->w->fast_dirs)
    {
      c->ok = false;
      return DIRENT_ABORT;
    }
  return 0;
}

/* Put the names of DIR, a directory that was there before, into the index,
   so that looking names up and linking them there is no longer a walk of
   all its blocks each (30000 files into an existing directory took 43 s,
   into a new one 0.5 s).  Entries must carry their type (filetype).  If the
   walk fails the index goes, as when memory runs out (see name_set).  */
static void
load_dir (struct bfo_ext4img *w, ext2_ino_t dir)
{
  if (!w->fast_dirs || !ext2fs_has_feature_filetype (w->fs->super) || dir_release (w) < 0)
    return;
  struct load_ctx c = { w, true };
  errcode_t err = ext2fs_dir_iterate2 (w->fs, dir, 0, NULL, load_cb, &c);
  if (err || !c.ok)
    {
      w->fast_dirs = false;
      return;
    }
  ext2fs_mark_inode_bitmap2 (w->loaded, dir);
}

static void
free_names (struct bfo_ext4img *w)
{
  for (size_t i = 0; i < w->cap_names; i++)
    free (w->names[i].name);
  free (w->names);
  w->names = NULL;
  w->n_names = w->cap_names = 0;
}

/* Write the directory block being filled (if changed) and forget it: before
   libext2fs reads or changes a directory, and at the end of a batch.  */
static int
dir_release (struct bfo_ext4img *w)
{
  int r = 0;
  if (w->db_dir && w->db_dirty)
    r = img_errno (ext2fs_write_dir_block4 (w->fs, w->db_pblk, w->db_block, 0, w->db_dir));
  if (r < 0 && w->db_err == 0)
    w->db_err = r;
  w->db_dir = 0;
  w->db_dirty = false;
  return r;
}

/* Take DIR's last block into DB_BLOCK: 0, 1 when DIR is not a plain block
   directory whose last block ends as expected (the caller takes libext2fs's
   way), or -errno.  Its checksum is verified only for a directory this
   writer did not make (see link_name).  */
static int
dir_load (struct bfo_ext4img *w, ext2_ino_t dir)
{
  ext2_filsys fs = w->fs;
  struct ext2_inode inode;
  errcode_t err = ext2fs_read_inode (fs, dir, &inode);
  if (err)
    return img_errno (err);
  uint64_t size = EXT2_I_SIZE (&inode);
  if ((inode.i_flags & (EXT2_INDEX_FL | EXT4_INLINE_DATA_FL)) || size == 0
      || size % w->bs)
    return 1;
  blk64_t pblk = 0;
  err = ext2fs_bmap2 (fs, dir, &inode, NULL, 0, size / w->bs - 1, NULL, &pblk);
  if (err)
    return img_errno (err);
  if (pblk == 0)
    return 1;
  bool ignoring = fs->flags & EXT2_FLAG_IGNORE_CSUM_ERRORS;
  if (ext2fs_test_inode_bitmap2 (w->made_dirs, dir))
    fs->flags |= EXT2_FLAG_IGNORE_CSUM_ERRORS;
  err = ext2fs_read_dir_block4 (fs, pblk, w->db_block, 0, dir);
  if (!ignoring)
    fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
  if (err)
    return img_errno (err);
  unsigned int end = w->bs;
  if (ext2fs_has_feature_metadata_csum (fs->super))
    {
      struct ext2_dir_entry_tail *t = EXT2_DIRENT_TAIL (w->db_block, w->bs);
      if (t->det_reserved_zero1 != 0 || t->det_rec_len != sizeof *t
          || t->det_reserved_name_len != EXT2_DIR_NAME_LEN_CSUM)
        return 1;
      end -= sizeof *t;
    }
  unsigned int off = 0, last = 0;
  while (off < end)
    {
      unsigned int rec_len;
      struct ext2_dir_entry *de = (struct ext2_dir_entry *) (w->db_block + off);
      if (ext2fs_get_rec_len (fs, de, &rec_len) || rec_len < 12 || rec_len % 4
          || rec_len > end - off)
        return 1;
      last = off;
      off += rec_len;
    }
  w->db_dir = dir;
  w->db_pblk = pblk;
  w->db_last = last;
  w->db_end = end;
  w->db_dirty = false;
  return 0;
}

/* Append NAME -> INO after the last entry of DB_BLOCK, as ext2fs_link would
   put it there; false when it does not fit.  */
static bool
dir_append (struct bfo_ext4img *w, const char *name, size_t len, ext2_ino_t ino, int type)
{
  struct ext2_dir_entry *last = (struct ext2_dir_entry *) (w->db_block + w->db_last);
  unsigned int rec_len;
  if (ext2fs_get_rec_len (w->fs, last, &rec_len))
    return false;
  unsigned int used = last->inode ? EXT2_DIR_REC_LEN (ext2fs_dirent_name_len (last)) : 0;
  if (rec_len < used + EXT2_DIR_REC_LEN (len))
    return false;
  struct ext2_dir_entry *de = last;
  if (used)
    {
      if (ext2fs_set_rec_len (w->fs, used, last))
        return false;
      de = (struct ext2_dir_entry *) (w->db_block + w->db_last + used);
      ext2fs_set_rec_len (w->fs, rec_len - used, de);
    }
  de->inode = ino;
  ext2fs_dirent_set_name_len (de, (int) len);
  ext2fs_dirent_set_file_type (de, ext2fs_has_feature_filetype (w->fs->super) ? type : 0);
  memcpy (de->name, name, len);
  w->db_last += used;
  w->db_dirty = true;
  return true;
}

/* Link NAME -> INO into DIR, a directory this writer made, through DB_BLOCK:
   0, 1 when it must go through libext2fs, or -errno.  */
static int
fast_link (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, ext2_ino_t ino, int type)
{
  size_t len = strlen (name);
  if (len > EXT2_NAME_LEN)
    return -ENAMETOOLONG;
  for (int tries = 0; tries < 2; tries++)
    {
      int r;
      if (w->db_dir != dir)
        {
          if ((r = dir_release (w)) < 0 || (r = dir_load (w, dir)) != 0)
            return r;
        }
      if (dir_append (w, name, len, ino, type))
        return 0;
      if ((r = dir_release (w)) < 0)
        return r;
      if (tries == 0 && (r = img_errno (ext2fs_expand_dir (w->fs, dir))) < 0)
        return r;
    }
  return 1;
}

/* DIR changes for the entry being made (CUR_SEQ): the last such entry is
   kept, for tar_dirs_later.  Without memory the change is not noted (the
   directory keeps the attributes asked for).  */
static void
last_touch_note (struct bfo_ext4img *w, ext2_ino_t dir)
{
  size_t i = map_put (&w->lt, dir);
  if (i != SIZE_MAX && w->lt.val[i] < w->cur_seq)
    w->lt.val[i] = w->cur_seq;
}

/* DIR's entries change: at close it gets the time of the change as its
   modification and change time, as the kernel gives a directory it links
   into or unlinks from (before the attributes asked for directories are
   applied: those win, as tar's delayed set_stat does).  Without memory for
   the list, the directory keeps its times.  */
static void
touch_dir (struct bfo_ext4img *w, ext2_ino_t dir)
{
  if (w->o.flags & BFO_WRITE_TAR_DIRS)
    last_touch_note (w, dir);
  if (ext2fs_test_inode_bitmap2 (w->touched, dir))
    return;
  if (w->n_touched == w->cap_touched)
    {
      size_t ncap = w->cap_touched ? 2 * w->cap_touched : 64;
      ext2_ino_t *x = realloc (w->touched_list, ncap * sizeof *x);
      if (!x)
        return;
      w->touched_list = x;
      w->cap_touched = ncap;
    }
  ext2fs_mark_inode_bitmap2 (w->touched, dir);
  w->touched_list[w->n_touched++] = dir;
}

/* Link NAME -> INO into DIR, growing the directory when it is full.  ext2fs_link
   reads every block of DIR, verifies its checksum (a crc32c of the whole block)
   and writes the block with a new one, for each name.  Into directories this
   writer made, names go through DB_BLOCK instead (fast_link): each block is read
   once and written once when full, with one checksum, and lookups are answered
   by the index of their names.  On the 4 KiB set (bfo mkimage, perf) libext2fs's
   crc32c was 11 % of all CPU samples, a quarter of the image thread's, and the
   directory walks of lookups and links another 2 %.  Elsewhere ext2fs_link does
   the work; for directories this writer made, whose every block it wrote itself,
   verifying again is skipped.  The blocks it writes get their checksums as always.  */
static int
link_name (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, ext2_ino_t ino, int type)
{
  __u16 mode = ft_mode (type);
  bool made = ext2fs_test_inode_bitmap2 (w->made_dirs, dir);
  bool kept = made || ext2fs_test_inode_bitmap2 (w->loaded, dir);
  if (!made && !ext2fs_test_inode_bitmap2 (w->seen_dirs, dir))
    {
      /* A directory of the image the kernel would index once it outgrows
         its one block (see bfo_dir_index at close).  */
      struct ext2_inode inode;
      ext2fs_mark_inode_bitmap2 (w->seen_dirs, dir);
      if (ext2fs_read_inode (w->fs, dir, &inode) == 0 && EXT2_I_SIZE (&inode) <= w->bs
          && !(inode.i_flags & EXT2_INDEX_FL))
        ext2fs_mark_inode_bitmap2 (w->small_dirs, dir);
    }
  touch_dir (w, dir);
  if (kept && w->fast_dirs)
    {
      int r = fast_link (w, dir, name, ino, type);
      if (r == 0)
        name_set (w, dir, name, ino, mode);
      if (r <= 0)
        return r;
    }
  int r = dir_release (w);
  if (r < 0)
    return r;
  bool trusted = !(w->fs->flags & EXT2_FLAG_IGNORE_CSUM_ERRORS) && made;
  for (int tries = 0;; tries++)
    {
      if (trusted)
        w->fs->flags |= EXT2_FLAG_IGNORE_CSUM_ERRORS;
      errcode_t err = ext2fs_link (w->fs, dir, name, ino, type);
      if (trusted)
        w->fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
      if (err == 0 && kept)
        name_set (w, dir, name, ino, mode);
      if (err != EXT2_ET_DIR_NO_SPACE || tries == 2)
        return img_errno (err);
      err = ext2fs_expand_dir (w->fs, dir);
      if (err)
        return img_errno (err);
    }
}

/* Point the existing entry NAME of DIR at INO (type TYPE): the file it named is
   replaced in one directory-block write, as rename(2) replaces a target.  */
struct repoint
{
  const char *name;
  size_t len;
  ext2_ino_t ino;
  int type;
  bool done;
};

static int
repoint_cb (ext2_ino_t dir, int entry, struct ext2_dir_entry *de, int offset, int blocksize,
            char *buf, void *arg)
{
  (void) dir;
  (void) entry;
  (void) offset;
  (void) blocksize;
  (void) buf;
  struct repoint *rp = arg;
  if (de->inode == 0 || (size_t) ext2fs_dirent_name_len (de) != rp->len
      || memcmp (de->name, rp->name, rp->len) != 0)
    return 0;
  de->inode = rp->ino;
  ext2fs_dirent_set_file_type (de, rp->type);
  rp->done = true;
  return DIRENT_CHANGED | DIRENT_ABORT;
}

static int
repoint_name (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, ext2_ino_t ino, int type)
{
  struct repoint rp = { name, strlen (name), ino,
                        ext2fs_has_feature_filetype (w->fs->super) ? type : 0, false };
  int r = dir_release (w);
  if (r < 0)
    return r;
  errcode_t err = ext2fs_dir_iterate2 (w->fs, dir, 0, NULL, repoint_cb, &rp);
  if (err)
    return img_errno (err);
  if (!rp.done)
    return -ENOENT;
  touch_dir (w, dir);
  if (in_index (w, dir))
    {
      struct ext2_inode inode;
      err = ext2fs_read_inode (w->fs, ino, &inode);
      if (err)
        return img_errno (err);
      name_set (w, dir, name, ino, inode.i_mode);
    }
  return 0;
}

/* Look NAME up in DIR: 0 and its inode and mode, -ENOENT, or another error.  */
static int
lookup_name (struct bfo_ext4img *w, ext2_ino_t dir, const char *name, ext2_ino_t *ino,
             __u16 *mode)
{
  if (!indexed (w, dir))
    load_dir (w, dir);
  if (indexed (w, dir))
    {
      struct img_name *x = w->cap_names ? name_slot (w, dir, name, name_hash (dir, name)) : NULL;
      if (!x || !x->name || !x->ino)
        return -ENOENT;
      *ino = x->ino;
      *mode = x->mode;
      return 0;
    }
  errcode_t err = ext2fs_lookup (w->fs, dir, name, strlen (name), NULL, ino);
  if (err)
    return img_errno (err);
  struct ext2_inode inode;
  err = ext2fs_read_inode (w->fs, *ino, &inode);
  if (err)
    return img_errno (err);
  *mode = inode.i_mode;
  return 0;
}

static int
file_type (__u16 mode)
{
  if (LINUX_S_ISDIR (mode))
    return EXT2_FT_DIR;
  if (LINUX_S_ISLNK (mode))
    return EXT2_FT_SYMLINK;
  if (LINUX_S_ISREG (mode))
    return EXT2_FT_REG_FILE;
  if (LINUX_S_ISCHR (mode))
    return EXT2_FT_CHRDEV;
  if (LINUX_S_ISBLK (mode))
    return EXT2_FT_BLKDEV;
  if (LINUX_S_ISFIFO (mode))
    return EXT2_FT_FIFO;
  if (LINUX_S_ISSOCK (mode))
    return EXT2_FT_SOCK;
  return EXT2_FT_UNKNOWN;
}

/* Create directory NAME in PARENT with default attributes; its inode in *INO.  */
static int
make_dir (struct bfo_ext4img *w, ext2_ino_t parent, const char *name, ext2_ino_t *ino)
{
  /* The parent's link count as the kernel keeps it: past EXT2_LINK_MAX
     (65000) it is 1, "too many to count" (dir_nlink); without dir_nlink no
     more subdirectories can be made.  ext2fs_mkdir only adds one (a 16-bit
     count: 65536 subdirectories made it 0).  */
  struct ext2_inode pi;
  errcode_t err = ext2fs_read_inode (w->fs, parent, &pi);
  if (err)
    return img_errno (err);
  int refused = add_refused (pi.i_flags);
  if (refused < 0)
    return refused;
  __u16 plinks = pi.i_links_count;
  bool many = plinks == 1 || plinks >= EXT2_LINK_MAX;
  if (many && !ext2fs_has_feature_dir_nlink (w->fs->super))
    return -EMLINK;
  err = ext2fs_new_inode (w->fs, parent, LINUX_S_IFDIR | 0755, NULL, ino);
  if (err)
    return img_errno (err);
  int r = dir_release (w);
  if (r < 0)
    return r;
  /* Without a name ext2fs_mkdir makes and accounts for the directory and
     counts it in its parent, but neither looks the name up nor links it
     (both read the whole parent: 66000 subdirectories took 140 s): the
     name goes in as any other, through link_name.  */
  err = ext2fs_mkdir (w->fs, parent, *ino, NULL);
  if (err)
    return img_errno (err);
  r = link_name (w, parent, name, *ino, EXT2_FT_DIR);
  struct ext2_inode_large *li;
  int r2 = 0;
  /* ext2fs_mkdir's count (PLINKS + 1) stands unless it is "many" or the
     name could not be linked.  */
  if ((r < 0 || many) && (r2 = read_full (w, parent, &li)) == 0)
    {
      li->i_links_count = r < 0 ? plinks : 1;
      r2 = write_full (w, parent, li);
      free (li);
    }
  if (r < 0)
    {
      /* Unmade: its "." and its name's link go together.  */
      if (read_full (w, *ino, &li) == 0)
        {
          li->i_links_count = 1;
          if (write_full (w, *ino, li) == 0)
            drop_link (w, *ino);
          free (li);
        }
      return r;
    }
  if (r2 < 0)
    return r2;
  ext2fs_mark_inode_bitmap2 (w->made_dirs, *ino);
  r = read_full (w, *ino, &li);
  if (r < 0)
    return r;
  li->i_mode = LINUX_S_IFDIR | (0777 & ~w->umask);
  struct bfo_write_attrs none = { 0 };
  apply_attrs (w, li, &none, true);
  inherit (w, parent, li, &none);
  r = write_full (w, *ino, li);
  free (li);
  return r;
}

/* What symbolic link LINK in directory DIR leads to (through any chain of
   links): its inode in *TO and mode in *MODE.  Absolute targets start at the
   image's root, as if tar ran chrooted into it (on the mounted image the
   kernel would start at the host's root).  */
/* Why following symbolic link LINK (in DIR) found nothing, as the kernel
   says it: a name in its target longer than a directory entry can hold
   before any missing one is "File name too long", else "No such file or
   directory".  Components are looked up plainly, up to a symbolic link.  */
static int
missing_why (struct bfo_ext4img *w, ext2_ino_t dir, ext2_ino_t link)
{
  struct ext2_inode inode;
  if (ext2fs_read_inode (w->fs, link, &inode) || !LINUX_S_ISLNK (inode.i_mode)
      || inode.i_size == 0 || inode.i_size >= w->bs)
    return -ENOENT;
  char target[EXT2_MAX_BLOCK_SIZE + 1];
  size_t len = inode.i_size;
  if (ext2fs_is_fast_symlink (&inode))
    memcpy (target, (char *) inode.i_block, len);
  else
    {
      ext2_file_t f;
      unsigned int got = 0;
      if (ext2fs_file_open (w->fs, link, 0, &f))
        return -ENOENT;
      errcode_t err = ext2fs_file_read (f, target, len, &got);
      ext2fs_file_close (f);
      if (err || got != len)
        return -ENOENT;
    }
  target[len] = '\0';
  ext2_ino_t cur = target[0] == '/' ? EXT2_ROOT_INO : dir;
  for (char *p = target; *p;)
    {
      while (*p == '/')
        p++;
      size_t k = strcspn (p, "/");
      if (k == 0)
        break;
      if (k > EXT2_NAME_LEN)
        return -ENAMETOOLONG;
      ext2_ino_t next;
      struct ext2_inode in;
      if (ext2fs_lookup (w->fs, cur, p, (int) k, NULL, &next)
          || ext2fs_read_inode (w->fs, next, &in) || !LINUX_S_ISDIR (in.i_mode))
        return -ENOENT;
      cur = next;
      p += k;
    }
  return -ENOENT;
}

static int
follow (struct bfo_ext4img *w, ext2_ino_t dir, ext2_ino_t link, ext2_ino_t *to, __u16 *mode)
{
  /* libext2fs reads the directories: the block being filled goes first.  */
  int r = dir_release (w);
  if (r < 0)
    return r;
  errcode_t err = ext2fs_follow_link (w->fs, EXT2_ROOT_INO, dir, link, to);
  if (err == EXT2_ET_FILE_NOT_FOUND)
    return missing_why (w, dir, link);
  if (err)
    return img_errno (err);
  struct ext2_inode inode;
  err = ext2fs_read_inode (w->fs, *to, &inode);
  if (err)
    return img_errno (err);
  *mode = inode.i_mode;
  return 0;
}

/* Forget the last parent resolved: a directory or symbolic link on its path
   is going.  */
static void
forget_parent (struct bfo_ext4img *w)
{
  free (w->pc_dir);
  w->pc_dir = NULL;
  w->pc_ino = 0;
}

/* The inode of RELPATH's parent directory (created when MKDIRS), and its last
   component in *BASE.  Symbolic links on the way are followed, as the kernel
   follows them for tar -x on the mounted image (see follow); a missing
   component is made, but not the target of a dangling link (ENOENT).  */
static int
resolve_parent (struct bfo_ext4img *w, const char *relpath, bool mkdirs, ext2_ino_t *parent,
                const char **base)
{
  const char *slash = strrchr (relpath, '/');
  *base = slash ? slash + 1 : relpath;
  size_t dlen = slash ? (size_t) (slash - relpath) : 0;
  w->mk_fail_len = 0;
  if (dlen == 0)
    {
      *parent = w->root;
      return 0;
    }
  if (w->pc_dir && strlen (w->pc_dir) == dlen && memcmp (w->pc_dir, relpath, dlen) == 0)
    {
      *parent = w->pc_ino;
      return 0;
    }
  ext2_ino_t cur = w->root;
  const char *p = relpath;
  while (p < relpath + dlen)
    {
      size_t k = strcspn (p, "/");
      /* What tar's make_directories would report (see resolve_entry): the
         mkdir of this component, or of the next one through this one.  */
      size_t here = (size_t) (p - relpath) + k;
      if (k > EXT2_NAME_LEN)
        {
          if (mkdirs)
            w->mk_fail_len = here, w->mk_fail_err = ENAMETOOLONG, w->mk_fail_enoent = false;
          return -ENAMETOOLONG;
        }
      char name[EXT2_NAME_LEN + 1];
      memcpy (name, p, k);
      name[k] = '\0';
      ext2_ino_t next;
      __u16 mode;
      int r = lookup_name (w, cur, name, &next, &mode);
      if (r == 0 && next == w->absent)
        r = -ENOENT;            /* (see create_link) */
      bool there = r == 0;
      if (r == -ENOENT && mkdirs)
        {
          r = make_dir (w, cur, name, &next);
          mode = LINUX_S_IFDIR;
          if (r == 0)
            w->rb->stats.image_dirs++;
          else
            w->mk_fail_len = here, w->mk_fail_err = -r, w->mk_fail_enoent = true;
          /* tar says "Cannot mkdir" of it (resolve_entry), then the
             member's own call fails for want of it: ENOENT.  */
          if (r < 0)
            return r == -ENOMEM || r == -EIO ? r : -ENOENT;
        }
      else if (r == 0 && LINUX_S_ISLNK (mode))
        r = ext2fs_test_inode_bitmap2 (w->opaque, next) ? -ENOTDIR
            : follow (w, cur, next, &next, &mode);
      if (r == 0 && !LINUX_S_ISDIR (mode))
        r = -ENOTDIR;
      if (r < 0)
        {
          /* Something is there (mkdir: EEXIST), but it leads nowhere: tar
             fails to make the next directory through it, if any.  */
          if (mkdirs && there && p + k < relpath + dlen && r != -ENOMEM && r != -EIO)
            w->mk_fail_len = here + 1 + strcspn (p + k + 1, "/"), w->mk_fail_err = -r,
            w->mk_fail_enoent = r == -ENOENT;
          return r;
        }
      cur = next;
      p += k + 1;
    }
  free (w->pc_dir);
  w->pc_dir = strndup (relpath, dlen);
  w->pc_ino = w->pc_dir ? cur : 0;
  *parent = cur;
  return 0;
}

/* resolve_parent for entry E's own path; a directory on the way that could
   not be made is kept for its report.  tar -x says "Cannot mkdir" for it
   before the member's own message: its make_directories runs when the call
   on the member's name fails with ENOENT, a missing directory on the way (or,
   with ALWAYS, for a hard link, whose missing target gives ENOENT).  */
static int
resolve_entry (struct bfo_ext4img *w, struct img_entry *e, bool mkdirs, bool always)
{
  int r = resolve_parent (w, e->path, mkdirs, &e->parent, &e->base);
  if (r < 0 && w->mk_fail_len && (always || w->mk_fail_enoent) && !e->interdir_len)
    {
      e->interdir_len = w->mk_fail_len;
      e->interdir_err = w->mk_fail_err;
    }
  return r;
}

/* Whether the directories of PATH go through a symbolic link in the image
   as it is now (see run_batch).  Only looks; the answer for the last parent
   asked about is kept (XS_VALID).  */
static bool
through_symlink (struct bfo_ext4img *w, const char *path)
{
  const char *slash = strrchr (path, '/');
  size_t dlen = slash ? (size_t) (slash - path) : 0;
  if (dlen == 0)
    return false;
  if (w->xs_valid && w->xs_len == dlen && memcmp (w->xs_dir, path, dlen) == 0)
    return w->xs_val;
  bool val = false;
  ext2_ino_t cur = w->root;
  for (const char *p = path; p < path + dlen; )
    {
      size_t k = strcspn (p, "/");
      if (k > EXT2_NAME_LEN)
        break;
      char name[EXT2_NAME_LEN + 1];
      memcpy (name, p, k);
      name[k] = '\0';
      ext2_ino_t next;
      __u16 mode;
      if (lookup_name (w, cur, name, &next, &mode) < 0)
        break;                  /* missing: made on the way, so no link beyond */
      if (LINUX_S_ISLNK (mode))
        {
          val = true;
          break;
        }
      if (!LINUX_S_ISDIR (mode))
        break;
      cur = next;
      p += k + 1;
    }
  char *d = realloc (w->xs_dir, dlen + 1);
  w->xs_valid = d != NULL;
  if (d)
    {
      memcpy (d, path, dlen);
      w->xs_dir = d;
      w->xs_len = dlen;
      w->xs_val = val;
    }
  return val;
}

/* ------------------------------------------------------------------ open/close */

static void free_slots (struct bfo_ext4img *w);
static void *worker (void *arg);

int
bfo_ext4img_open (struct bfo_ext4img **imgp, const char *image, const char *dir,
                  const struct bfo_write_opts *opts, bfo_write_cb cb, void *arg)
{
  struct bfo_ext4img *w = calloc (1, sizeof *w);
  if (!w)
    return -ENOMEM;
  w->fd = -1;
  if (opts)
    w->o = *opts;
  w->o.backend = BFO_BACKEND_EXT4IMG;
  if (!w->o.batch_files)
    w->o.batch_files = IMG_DEFAULT_BATCH_FILES;
  if (!w->o.batch_bytes)
    w->o.batch_bytes = BFO_WRITE_DEFAULT_BATCH_BYTES;
  if (!w->o.batch_ms)
    w->o.batch_ms = IMG_DEFAULT_BATCH_MS;
  w->cur = 0;
  w->pending = -1;
  w->rb = &w->slot[0];
  pthread_mutex_init (&w->mu, NULL);
  pthread_cond_init (&w->cv, NULL);
  w->cb = cb;
  w->arg = arg;
  w->uid = geteuid ();
  w->gid = getegid ();
  int ng = getgroups (0, NULL);
  if (ng > 0 && (w->groups = malloc (ng * sizeof *w->groups)))
    w->n_groups = getgroups (ng, w->groups) < 0 ? 0 : ng;
  w->umask = umask (022);
  umask (w->umask);
  int r = w->o.batch_bytes > (16ull << 30) ? -EINVAL : 0;
  if (r == 0)
    r = check_image_file (image, true, &w->fd);
  if (r == 0)
    r = open_fs (image, true, &w->fs);
  if (r == 0)
    r = img_errno (ext2fs_read_bitmaps (w->fs));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "directories made", &w->made_dirs));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "directories changed", &w->touched));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "directories indexed", &w->loaded));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "links not followed", &w->opaque));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "directories seen", &w->seen_dirs));
  if (r == 0)
    r = img_errno (ext2fs_allocate_inode_bitmap (w->fs, "small directories", &w->small_dirs));
  if (r == 0)
    {
      w->bs = w->fs->blocksize;
      w->inode_size = EXT2_INODE_SIZE (w->fs->super);
      /* Inline, case-folded and encrypted directories keep libext2fs's way.  */
      struct ext2_super_block *sb = w->fs->super;
      w->db_block = malloc (w->bs);
      w->fast_dirs = w->db_block && !ext2fs_has_feature_inline_data (sb)
                     && !ext2fs_has_feature_casefold (sb) && !ext2fs_has_feature_encrypt (sb);
      w->fs->umask = w->umask;
      r = lookup_path (w->fs, dir && *dir ? dir : "/", &w->root);
      if (r == -ENOENT && (w->o.flags & BFO_WRITE_MKDIRS))
        {
          /* mkdir -p of the destination itself.  */
          char *rel = NULL;
          const char *d = dir;
          while (*d == '/')
            d++;
          w->root = EXT2_ROOT_INO;
          if (asprintf (&rel, "%s/x", d) < 0)
            r = -ENOMEM;
          else
            {
              ext2_ino_t ino;
              const char *base;
              r = resolve_parent (w, rel, true, &ino, &base);
              w->root = ino;
              free (rel);
              free (w->pc_dir);
              w->pc_dir = NULL;
            }
        }
    }
  if (r == 0)
    {
      w->arena_cap = round_up (w->o.batch_bytes, w->bs);
      for (int k = 0; k < 2; k++)
        {
          void *p = mmap (NULL, w->arena_cap, PROT_READ | PROT_WRITE,
                          MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p != MAP_FAILED)
            w->slot[k].arena = p;
          else
            r = -ENOMEM;
        }
      void *b;
      w->bounce = posix_memalign (&b, IMG_DIRECT_ALIGN, w->bs) == 0 ? b : NULL;
      w->io = malloc (sizeof *w->io);
      if (!w->bounce || !w->io)
        r = -ENOMEM;
    }
  if (r == 0)
    {
      /* Data go out with O_DIRECT where the image's file system or device takes
         it: the kernel's copy into the page cache, and its write-back later,
         were 13 % of all CPU samples of bfo mkimage on the 4 KiB set (perf; the
         2-core machine's other thread reads the source).  Every data write is
         block-aligned in memory and on disk; where that is not enough
         (io_flush: EINVAL) writes go through the page cache again.  */
      int fl = fcntl (w->fd, F_GETFL);
      w->direct = fl >= 0 && fcntl (w->fd, F_SETFL, fl | O_DIRECT) == 0;
    }
  if (r == 0)
    {
      /* While we write, the volume says it was not cleanly unmounted: a crash
         leaves it flagged for a full e2fsck, as a kernel crash would.  */
      w->orig_state = w->fs->super->s_state;
      w->fs->super->s_state &= ~EXT2_VALID_FS;
      ext2fs_mark_super_dirty (w->fs);
      r = img_errno (ext2fs_flush2 (w->fs, 0));
    }
  if (r < 0)
    {
      if (w->made_dirs)
        ext2fs_free_inode_bitmap (w->made_dirs);
      if (w->touched)
        ext2fs_free_inode_bitmap (w->touched);
      if (w->loaded)
        ext2fs_free_inode_bitmap (w->loaded);
      if (w->opaque)
        ext2fs_free_inode_bitmap (w->opaque);
      if (w->seen_dirs)
        ext2fs_free_inode_bitmap (w->seen_dirs);
      if (w->small_dirs)
        ext2fs_free_inode_bitmap (w->small_dirs);
      if (w->fs)
        {
          if (w->orig_state)
            w->fs->super->s_state = w->orig_state;
          ext2fs_close_free (&w->fs);
        }
      free_slots (w);
      pthread_mutex_destroy (&w->mu);
      pthread_cond_destroy (&w->cv);
      free (w->bounce);
      free (w->io);
      free (w->pc_dir);
      free_names (w);
      free (w->db_block);
      free (w->groups);
      if (w->fd >= 0)
        close (w->fd);
      free (w);
      return r;
    }
  /* No thread (resource limits): batches run in the caller's thread.  */
  w->threaded = bfo_thread_create (&w->thread, "bfo-ext4img", worker, w) == 0;
  *imgp = w;
  return 0;
}

/* ------------------------------------------------------------------ batches */

static void
deliver (struct bfo_ext4img *w, const struct img_entry *e)
{
  if (e->error)
    w->stats.errors++;
  if (w->stop || !w->cb)
    return;
  struct bfo_written f = { .path = e->path, .error = e->error,
                           .error_op = e->error ? e->error_op : NULL, .user = e->user,
                           .found_mode = e->found_mode, .attrs_error = e->attrs_error };
  char *interdir = NULL;
  if (e->error && e->interdir_len && (interdir = strndup (e->path, e->interdir_len)))
    {
      f.interdir = interdir;
      f.interdir_error = e->interdir_err;
    }
  int s = w->cb (&f, w->arg);
  free (interdir);
  if (s)
    w->stop = s;
}

/* Report PATH refused at once (ERROR, from OP).  */
static void
refuse (struct bfo_ext4img *w, const char *path, int error, const char *op, void *user)
{
  struct img_entry e = { .path = (char *) path, .error = error, .error_op = op,
                         .user = user };
  deliver (w, &e);
}

static int
by_path (const void *a, const void *b)
{
  const struct img_entry *x = *(struct img_entry *const *) a;
  const struct img_entry *y = *(struct img_entry *const *) b;
  int c = strcmp (x->path, y->path);
  if (c)
    return c;
  return x->add_order < y->add_order ? -1 : x->add_order > y->add_order;
}

static void
free_entry (struct img_entry *e)
{
  free (e->path);
  free (e->target);
  free (e->segs);
}

static int
add_run (struct bfo_ext4img *w, blk64_t pblk, blk64_t len)
{
  if (w->rb->n_runs == w->rb->cap_runs)
    {
      size_t ncap = w->rb->cap_runs ? 2 * w->rb->cap_runs : 1024;
      struct img_run *x = realloc (w->rb->runs, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      w->rb->runs = x;
      w->rb->cap_runs = ncap;
    }
  w->rb->runs[w->rb->n_runs++] = (struct img_run) { pblk, len };
  return 0;
}

static void
free_runs (struct bfo_ext4img *w, struct img_entry *e, size_t from)
{
  for (size_t i = from; i < e->n_runs; i++)
    {
      struct img_run *r = &w->rb->runs[e->run_first + i];
      ext2fs_block_alloc_stats_range (w->fs, r->pblk, r->len, -1);
    }
  e->n_runs = 0;
}

/* Reserve NBLOCKS for E, in one run after the previous file's if possible, else
   in the longest runs available; -ENOSPC (nothing reserved) when they do not fit.  */
static int
alloc_blocks (struct bfo_ext4img *w, struct img_entry *e, blk64_t nblocks)
{
  e->run_first = w->rb->n_runs;
  e->n_runs = 0;
  if (nblocks == 0)
    return 0;
  if (nblocks > ext2fs_free_blocks_count (w->fs->super))
    return -ENOSPC;
  blk64_t pblk, plen;
  errcode_t err = ext2fs_new_range (w->fs, EXT2_NEWRANGE_MIN_LENGTH, w->goal, nblocks, NULL,
                                    &pblk, &plen);
  if (err == 0)
    {
      int r = add_run (w, pblk, nblocks);
      if (r < 0)
        return r;
      ext2fs_block_alloc_stats_range (w->fs, pblk, nblocks, +1);
      e->n_runs = 1;
      w->goal = pblk + nblocks;
      return 0;
    }
  /* Fragmented: take free runs in address order from the goal.  */
  blk64_t left = nblocks;
  while (left)
    {
      err = ext2fs_new_range (w->fs, 0, w->goal, left, NULL, &pblk, &plen);
      if (err)
        {
          free_runs (w, e, 0);
          return err == EXT2_ET_BLOCK_ALLOC_FAIL ? -ENOSPC : img_errno (err);
        }
      if (plen > left)
        plen = left;
      int r = add_run (w, pblk, plen);
      if (r < 0)
        {
          free_runs (w, e, 0);
          return r;
        }
      ext2fs_block_alloc_stats_range (w->fs, pblk, plen, +1);
      e->n_runs++;
      left -= plen;
      w->goal = pblk + plen;
    }
  return 0;
}

static int
io_flush (struct bfo_ext4img *w, struct img_io *io)
{
  int i = 0;
  while (i < io->n)
    {
      ssize_t k = pwritev (w->fd, io->iov + i, io->n - i, (off_t) io->off);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0 && errno == EINVAL && w->direct)
        {
          /* Not aligned enough for O_DIRECT here (a caller's buffer, small
             blocks on a device with larger sectors): the page cache from now on.  */
          int fl = fcntl (w->fd, F_GETFL);
          if (fl >= 0 && fcntl (w->fd, F_SETFL, fl & ~O_DIRECT) == 0)
            {
              w->direct = false;
              continue;
            }
        }
      if (k < 0)
        return -errno;
      if (k == 0)
        return -EIO;
      w->rb->stats.image_writes++;
      io->off += k;
      /* A short write: go on from where it stopped.  */
      while (i < io->n && (size_t) k >= io->iov[i].iov_len)
        k -= io->iov[i++].iov_len;
      if (i < io->n)
        {
          io->iov[i].iov_base = (char *) io->iov[i].iov_base + k;
          io->iov[i].iov_len -= k;
        }
    }
  io->n = 0;
  io->bytes = 0;
  return 0;
}

/* Queue BYTES at PTR for image byte OFF; neighbours on disk join one request,
   neighbours in memory one vector element.  */
static int
io_add (struct bfo_ext4img *w, struct img_io *io, const unsigned char *ptr, uint64_t off,
        uint64_t bytes)
{
  if (bytes == 0)
    return 0;
  if (io->n && (io->off + io->bytes != off || io->n == IMG_MAX_IOV
                || io->bytes + bytes > IMG_MAX_IO_BYTES))
    {
      int r = io_flush (w, io);
      if (r < 0)
        return r;
    }
  if (io->n == 0)
    io->off = off;
  struct iovec *last = io->n ? &io->iov[io->n - 1] : NULL;
  if (last && (const unsigned char *) last->iov_base + last->iov_len == ptr)
    last->iov_len += bytes;
  else
    io->iov[io->n++] = (struct iovec) { (void *) ptr, bytes };
  io->bytes += bytes;
  return 0;
}

/* Queue E's data for its runs.  The caller's buffer of a file alone in its batch
   may end inside the last block: that block goes through the bounce buffer.  */
static int
write_data (struct bfo_ext4img *w, struct img_entry *e, struct img_io *io)
{
  const unsigned char *p = e->data;
  uint64_t left = e->len;
  for (size_t i = 0; i < e->n_runs; i++)
    {
      struct img_run *r = &w->rb->runs[e->run_first + i];
      uint64_t bytes = r->len * w->bs, off = r->pblk * w->bs;
      uint64_t direct = e->padded || left >= bytes ? bytes : left / w->bs * w->bs;
      int ret = io_add (w, io, p, off, direct);
      if (ret == 0 && direct < bytes)
        {
          memset (w->bounce, 0, w->bs);
          memcpy (w->bounce, p + direct, left - direct);
          ret = io_add (w, io, w->bounce, off + direct, w->bs);
        }
      if (ret < 0)
        return ret;
      p += bytes;
      left = left > bytes ? left - bytes : 0;
    }
  return 0;
}

/* E's blocks in file order, as extents: pieces contiguous in the file and on
   disk, of at most EXT_INIT_MAX_LEN blocks, split where a run of disk blocks or
   a data segment (of a sparse file) ends.  */
struct piece_it
{
  size_t run, seg;
  blk64_t run_off, seg_off;
};

static bool
next_piece (const struct bfo_ext4img *w, const struct img_entry *e, struct piece_it *it,
            struct ext2fs_extent *ex, bool *run_done)
{
  if (it->run >= e->n_runs)
    return false;
  const struct img_run *r = &w->rb->runs[e->run_first + it->run];
  /* Without holes one segment from block 0: the runs follow each other.  */
  blk64_t n = r->len - it->run_off, lblk = it->seg_off;
  if (e->sparse)
    {
      const struct img_seg *g = &e->segs[it->seg];
      if (g->len - it->seg_off < n)
        n = g->len - it->seg_off;
      lblk += g->lblk;
    }
  if (n > EXT_INIT_MAX_LEN)
    n = EXT_INIT_MAX_LEN;
  *ex = (struct ext2fs_extent) { .e_pblk = r->pblk + it->run_off, .e_lblk = lblk,
                                 .e_len = (__u32) n, .e_flags = 0 };
  it->run_off += n;
  it->seg_off += n;
  *run_done = it->run_off == r->len;
  if (*run_done)
    {
      it->run++;
      it->run_off = 0;
    }
  if (e->sparse && it->seg_off == e->segs[it->seg].len)
    {
      it->seg++;
      it->seg_off = 0;
    }
  return true;
}

/* Map E's runs into the (new, written) inode LI through the extent API.  Returns
   how many runs were mapped in *DONE, so that a failure frees the others.  */
static int
map_extents (struct bfo_ext4img *w, ext2_ino_t ino, struct ext2_inode_large *li,
             struct img_entry *e, size_t *done)
{
  *done = 0;
  if (e->n_runs == 0)
    return 0;
  ext2_extent_handle_t h;
  errcode_t err = ext2fs_extent_open2 (w->fs, ino, (struct ext2_inode *) li, &h);
  if (err)
    return img_errno (err);
  bool first = true, run_done;
  struct piece_it it = { 0 };
  struct ext2fs_extent ex;
  while (!err && next_piece (w, e, &it, &ex, &run_done))
    {
      err = ext2fs_extent_insert (h, first ? 0 : EXT2_EXTENT_INSERT_AFTER, &ex);
      if (!err)
        err = ext2fs_extent_fix_parents (h);
      first = false;
      if (!err && run_done)
        {
          const struct img_run *r = &w->rb->runs[e->run_first + *done];
          err = ext2fs_iblk_add_blocks (w->fs, (struct ext2_inode *) li, r->len);
          if (!err)
            {
              (*done)++;
              w->rb->stats.image_extents++;
            }
        }
    }
  ext2fs_extent_free (h);
  return img_errno (err);
}

/* Map E's runs straight into the new inode LI when they fit in its i_block (4
   extents, the empty tree ext2fs_extent_open2 would set up there): the extent
   API writes the inode at each insert and fix_parents, and each write
   checksums it; with the inode written before and after, that was 4-5 inode
   writes per file.  A file without blocks gets the empty tree, as the kernel
   gives it.  False (LI untouched) when the runs need a deeper tree.  */
static bool
in_inode_extents (struct bfo_ext4img *w, struct ext2_inode_large *li, struct img_entry *e)
{
  struct ext3_extent_header *eh = (struct ext3_extent_header *) li->i_block;
  size_t max = (sizeof li->i_block - sizeof *eh) / sizeof (struct ext3_extent), need = 0;
  struct piece_it it = { 0 };
  struct ext2fs_extent ex;
  bool run_done;
  while (need <= max && next_piece (w, e, &it, &ex, &run_done))
    need++;
  if (need > max)
    return false;
  memset (li->i_block, 0, sizeof li->i_block);
  eh->eh_magic = ext2fs_cpu_to_le16 (EXT3_EXT_MAGIC);
  eh->eh_entries = ext2fs_cpu_to_le16 ((__u16) need);
  eh->eh_max = ext2fs_cpu_to_le16 ((__u16) max);
  struct ext3_extent *x = (struct ext3_extent *) (eh + 1);
  it = (struct piece_it) { 0 };
  while (next_piece (w, e, &it, &ex, &run_done))
    {
      x->ee_block = ext2fs_cpu_to_le32 ((__u32) ex.e_lblk);
      x->ee_len = ext2fs_cpu_to_le16 ((__u16) ex.e_len);
      x->ee_start_hi = ext2fs_cpu_to_le16 ((__u16) (ex.e_pblk >> 32));
      x->ee_start = ext2fs_cpu_to_le32 ((__u32) ex.e_pblk);
      x++;
    }
  for (size_t i = 0; i < e->n_runs; i++)
    {
      /* No overflow: at most 4 × 32768 blocks of at most 64 KiB.  */
      ext2fs_iblk_add_blocks (w->fs, (struct ext2_inode *) li,
                              w->rb->runs[e->run_first + i].len);
      w->rb->stats.image_extents++;
    }
  li->i_flags |= EXT4_EXTENTS_FL;
  return true;
}

static int
empty_cb (ext2_ino_t dir, int entry, struct ext2_dir_entry *de, int offset, int blocksize,
          char *buf, void *arg)
{
  (void) dir;
  (void) offset;
  (void) blocksize;
  (void) buf;
  if (dot_entry (entry, de) || de->inode == 0)
    return 0;
  *(bool *) arg = false;
  return DIRENT_ABORT;
}

/* Remove NAME (inode INO of mode MODE) from directory PARENT, as unlink(2),
   or for an empty directory rmdir(2), removes it.  */
static int
remove_name (struct bfo_ext4img *w, ext2_ino_t parent, const char *name, ext2_ino_t ino,
             __u16 mode)
{
  bool isdir = LINUX_S_ISDIR (mode);
  int g = may_remove (w, parent, ino);
  if (g < 0)
    return g;
  if (isdir)
    {
      bool empty = true;
      int r = dir_release (w);
      errcode_t err = r < 0 ? 0 : ext2fs_dir_iterate2 (w->fs, ino, 0, NULL, empty_cb, &empty);
      if (r == 0)
        r = img_errno (err);
      if (r == 0 && !empty)
        r = -ENOTEMPTY;
      if (r < 0)
        return r;
    }
  int r = dir_release (w);
  if (r < 0)
    return r;
  errcode_t err = ext2fs_unlink (w->fs, parent, name, ino, 0);
  if (err)
    return img_errno (err);
  touch_dir (w, parent);
  if (in_index (w, parent))
    name_set (w, parent, name, 0, 0);
  if (isdir || LINUX_S_ISLNK (mode))
    forget_parent (w);
  if (!isdir)
    return drop_link (w, ino);
  /* The directory's own "." goes with its name; its ".." was a link of PARENT.  */
  struct ext2_inode_large *li;
  r = read_full (w, ino, &li);
  if (r < 0)
    return r;
  li->i_links_count = 1;
  r = write_full (w, ino, li);
  free (li);
  if (r == 0)
    r = drop_link (w, ino);
  if (r < 0)
    return r;
  ext2fs_unmark_inode_bitmap2 (w->made_dirs, ino);
  ext2fs_unmark_inode_bitmap2 (w->loaded, ino);
  ext2fs_unmark_inode_bitmap2 (w->seen_dirs, ino);
  ext2fs_unmark_inode_bitmap2 (w->small_dirs, ino);
  ext2fs_unmark_inode_bitmap2 (w->touched, ino);
  for (size_t i = 0; i < w->n_touched; i++)
    if (w->touched_list[i] == ino)
      w->touched_list[i] = 0;
  for (size_t i = 0; i < w->n_dirs; i++)
    if (w->dirs[i].ino == ino)
      w->dirs[i].ino = 0;
  r = read_full (w, parent, &li);
  if (r < 0)
    return r;
  /* 1 is dir_nlink's "too many to count": it stays.  */
  if (li->i_links_count > 2)
    li->i_links_count--;
  r = write_full (w, parent, li);
  free (li);
  return r;
}

/* What E's name holds now, as tar -x finds it: *OLD is the non-directory
   there (which the caller replaces), or 0 if none.  An empty directory is
   removed first and one with entries is -EEXIST, as tar's open or symlink
   fails there after it could not remove it; so is a name the kernel keeps
   (may_remove).  A new name in an immutable directory is -EPERM.  */
static int
old_entry (struct bfo_ext4img *w, const struct img_entry *e, ext2_ino_t *old)
{
  __u16 mode;
  int r = lookup_name (w, e->parent, e->base, old, &mode);
  if (r == -ENOENT)
    {
      *old = 0;
      return may_add (w, e->parent);
    }
  if (r == 0 && LINUX_S_ISDIR (mode))
    {
      r = remove_name (w, e->parent, e->base, *old, mode);
      *old = 0;
      return r == -ENOTEMPTY || r == -EPERM ? -EEXIST : r;
    }
  /* (tar's call fails EEXIST, then its unlink EPERM: it reports the first.)  */
  if (r == 0 && may_remove (w, e->parent, *old) < 0)
    return -EEXIST;
  /* A symbolic link may be on the path of the last parent resolved.  */
  if (r == 0 && LINUX_S_ISLNK (mode))
    forget_parent (w);
  return r;
}

/* Create E's inode, map its blocks and link it at its name (replacing a non-directory
   there).  On failure nothing of it is left: blocks and inode are freed.  */

/* Queue E, whose new inode INO replaces OLD at its name, for repoint_files;
   false without memory (the caller repoints it now).  */
static bool
queue_repoint (struct bfo_ext4img *w, struct img_entry *e, ext2_ino_t ino, ext2_ino_t old)
{
  if (w->rp_n == w->rp_cap)
    {
      size_t ncap = w->rp_cap ? 2 * w->rp_cap : 256;
      struct img_entry **x = realloc (w->rp, ncap * sizeof *x);
      if (!x)
        return false;
      w->rp = x;
      w->rp_cap = ncap;
    }
  e->new_ino = ino;
  e->old_ino = old;
  e->repointed = false;
  w->rp[w->rp_n++] = e;
  return true;
}

/* The files of one directory being repointed, by name.  */
struct rp_set
{
  struct img_entry **e;
  size_t n, cap, left;
  int type;                     /* the entries' file type (0 without filetype) */
};

static struct img_entry **
rp_slot (struct rp_set *t, const char *name, size_t len)
{
  size_t i = bfo_hash_bytes (name, len) & (t->cap - 1);
  while (t->e[i] && !(strlen (t->e[i]->base) == len && memcmp (t->e[i]->base, name, len) == 0))
    i = (i + 1) & (t->cap - 1);
  return &t->e[i];
}

static int
rp_cb (ext2_ino_t dir, int entry, struct ext2_dir_entry *de, int offset, int blocksize,
       char *buf, void *arg)
{
  (void) dir;
  (void) entry;
  (void) offset;
  (void) blocksize;
  (void) buf;
  struct rp_set *t = arg;
  if (de->inode == 0)
    return 0;
  struct img_entry *e = *rp_slot (t, de->name, ext2fs_dirent_name_len (de));
  if (!e || e->repointed || de->inode != e->old_ino)
    return 0;
  de->inode = e->new_ino;
  ext2fs_dirent_set_file_type (de, t->type);
  e->repointed = true;
  return DIRENT_CHANGED | (--t->left ? 0 : DIRENT_ABORT);
}

/* Point the names of the queued files at their new inodes: one walk of each
   directory for all its files, where repoint_name walks it for each
   (replacing 30000 files of one directory took 19 s).  Then the old inodes
   lose those links.  A name not found (or without memory for the walk's
   table) fails that file as repoint_name would: its new inode goes.  */
static void
repoint_files (struct bfo_ext4img *w)
{
  for (size_t i = 0; i < w->rp_n;)
    {
      size_t j = i;
      while (j < w->rp_n && w->rp[j]->parent == w->rp[i]->parent)
        j++;
      struct rp_set t = { NULL, j - i, 1, j - i,
                          ext2fs_has_feature_filetype (w->fs->super) ? EXT2_FT_REG_FILE : 0 };
      while (t.cap < 2 * t.n)
        t.cap *= 2;
      t.e = calloc (t.cap, sizeof *t.e);
      int r = dir_release (w);
      if (r == 0 && !t.e)
        r = -ENOMEM;
      if (r == 0)
        {
          for (size_t k = i; k < j; k++)
            *rp_slot (&t, w->rp[k]->base, strlen (w->rp[k]->base)) = w->rp[k];
          r = img_errno (ext2fs_dir_iterate2 (w->fs, w->rp[i]->parent, 0, NULL, rp_cb, &t));
        }
      free (t.e);
      for (size_t k = i; k < j; k++)
        {
          struct img_entry *e = w->rp[k];
          int rk = e->repointed ? 0 : r < 0 ? r : -ENOENT;
          if (rk == 0)
            {
              w->cur_seq = e->add_order;
              touch_dir (w, e->parent);
              if (in_index (w, e->parent))
                name_set (w, e->parent, e->base, e->new_ino, LINUX_S_IFREG);
              rk = drop_link (w, e->old_ino);
              if (rk < 0)
                e->error = -rk, e->error_op = "replace";
            }
          else
            {
              drop_link (w, e->new_ino);
              e->error = -rk;
              e->error_op = "link";
            }
        }
      i = j;
    }
  w->rp_n = 0;
}

/* Whether we are in group GID, as the kernel's in_group_p sees it.  */
static bool
in_group (const struct bfo_ext4img *w, gid_t gid)
{
  if (gid == w->gid)
    return true;
  for (int i = 0; i < w->n_groups; i++)
    if (w->groups[i] == gid)
      return true;
  return false;
}

/* The set-id bits of a regular file of mode MODE and group GID the kernel
   clears on its truncation or write (not root) or its chown (anyone):
   set-user-ID always, set-group-ID when group-executable or, not root,
   when the group is not ours (setattr_should_drop_suidgid).  */
static mode_t
kill_bits (const struct bfo_ext4img *w, mode_t mode, gid_t gid)
{
  mode_t k = mode & S_ISUID;
  if ((mode & S_ISGID) && ((mode & S_IXGRP) || (w->uid != 0 && !in_group (w, gid))))
    k |= S_ISGID;
  return k;
}

/* BFO_ATTR_TAR_MODE: the mode tar -x --overwrite leaves on the regular
   file LI it rewrites in place.  Its open (O_TRUNC) and write clear set-id
   bits when not root; it fstat's the file then, and takes that mode for the
   current one.  Its chown (BFO_ATTR_OWNER) clears them again, even for
   root, and its set_mode may chmod from the mode it believes, so bits the
   kernel cleared may stay cleared (GNU tar 1.34's result, kept).  That
   chmod, not root, clears the set-group-ID bit of a file whose group is
   not ours.  */
static mode_t
tar_overwrite_mode (const struct bfo_ext4img *w, const struct ext2_inode_large *li,
                    const struct bfo_write_attrs *a)
{
  gid_t gid = inode_gid (*li);
  mode_t cur = li->i_mode & 07777;
  if (w->uid != 0)
    cur &= ~kill_bits (w, cur, gid);
  mode_t actual = cur, cur_mask = 07777;
  if (a->flags & BFO_ATTR_OWNER)
    {
      actual &= ~kill_bits (w, actual, gid);
      cur_mask = bfo_tar_mask_after_chown (cur, cur_mask);
    }
  mode_t m;
  int r = bfo_tar_set_mode (cur, cur_mask, a->mode, a->keep_mask, &m);
  if (r < 0)
    r = bfo_tar_set_mode (actual, 07777, a->mode, a->keep_mask, &m);
  if (r > 0)
    {
      gid_t now = (a->flags & BFO_ATTR_OWNER) && a->gid != (gid_t) -1 ? a->gid : gid;
      actual = w->uid != 0 && !in_group (w, now) ? m & ~S_ISGID : m;
    }
  return actual;
}

/* With BFO_WRITE_OVERWRITE (tar --overwrite, which opens an existing file
   with O_TRUNC): E's data replace those of the regular file OLD in its own
   inode, so that hard links to it keep sharing it; its extended attributes
   and, unless E's attributes say otherwise, owner stay.  1: OLD cannot be
   rewritten in place (inline data), the caller replaces it.  */
static int
overwrite_file (struct bfo_ext4img *w, struct img_entry *e, ext2_ino_t old, const char **op)
{
  struct ext2_inode_large *li;
  int r = read_full (w, old, &li);
  if (r == 0 && (li->i_flags & EXT4_INLINE_DATA_FL))
    {
      /* Replaced (see create_file), with the mode tar would leave.  */
      if (e->attrs.flags & BFO_ATTR_TAR_MODE)
        {
          e->attrs.mode = tar_overwrite_mode (w, li, &e->attrs);
          e->attrs.flags &= ~BFO_ATTR_TAR_MODE;
        }
      free (li);
      return 1;
    }
  if (r < 0)
    {
      free_runs (w, e, 0);
      return r;
    }
  *op = "overwrite";
  errcode_t err = 0;
  if (ext2fs_inode_has_valid_blocks2 (w->fs, (struct ext2_inode *) li))
    err = ext2fs_punch (w->fs, old, (struct ext2_inode *) li, NULL, 0, ~0ULL);
  r = img_errno (err);
  if (r == 0)
    {
      w->freed = true;
      r = img_errno (ext2fs_inode_size_set (w->fs, (struct ext2_inode *) li, e->size));
    }
  size_t mapped = 0;
  if (r == 0)
    {
      struct bfo_write_attrs a = e->attrs;
      if (a.flags & BFO_ATTR_TAR_MODE)
        a.mode = tar_overwrite_mode (w, li, &a);
      apply_attrs (w, li, &a, false);
      bool here = in_inode_extents (w, li, e);
      mapped = here ? e->n_runs : 0;
      r = write_full (w, old, li);
      if (r == 0 && !here)
        {
          r = map_extents (w, old, li, e, &mapped);
          int r2 = write_full (w, old, li);
          if (r == 0)
            r = r2;
        }
    }
  if (r < 0)
    free_runs (w, e, mapped);
  free (li);
  return r;
}

static int
create_file (struct bfo_ext4img *w, struct img_entry *e, const char **op)
{
  w->cur_seq = e->add_order;
  *op = "create";
  ext2_ino_t old = 0;
  int r;
  __u16 mode;
  if ((w->o.flags & BFO_WRITE_OVERWRITE) && !(e->attrs.flags & BFO_ATTR_REPLACE)
      && (r = lookup_name (w, e->parent, e->base, &old, &mode)) != -ENOENT)
    {
      /* What open (O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW) does there;
         a symbolic link or device is replaced, as tar does after the open
         fails or finds no regular file (for a device, after writing to the
         host's device: not done here).  */
      if (r == 0)
        r = LINUX_S_ISDIR (mode) ? -EISDIR
            : LINUX_S_ISFIFO (mode) || LINUX_S_ISSOCK (mode) ? -ENXIO : 0;
      if (r == 0 && LINUX_S_ISREG (mode)
          && (inode_flags (w, old) & (GUARD_FL | EXT4_VERITY_FL)))
        r = -EPERM;             /* (open with O_TRUNC; an fs-verity file is read-only) */
      if (r == 0 && LINUX_S_ISREG (mode))
        {
          r = overwrite_file (w, e, old, op);
          if (r <= 0)
            return r;
        }
      else if (r == 0 && LINUX_S_ISLNK (mode))
        {
          /* tar's open meets ELOOP, then removes the link if it may.  */
          if (may_remove (w, e->parent, old) < 0)
            r = -ELOOP;
          forget_parent (w);
        }
      if (r < 0)
        {
          free_runs (w, e, 0);
          return r;
        }
    }
  else
    r = old_entry (w, e, &old);
  if (r < 0)
    {
      free_runs (w, e, 0);
      return r;
    }
  ext2_ino_t ino;
  errcode_t err = ext2fs_new_inode (w->fs, e->parent, LINUX_S_IFREG | 0600, NULL, &ino);
  if (err)
    {
      free_runs (w, e, 0);
      return img_errno (err);
    }
  struct ext2_inode_large *li = new_inode_buf (w);
  if (!li)
    {
      free_runs (w, e, 0);
      return -ENOMEM;
    }
  li->i_mode = LINUX_S_IFREG | (0666 & ~w->umask);
  li->i_links_count = 1;
  apply_attrs (w, li, &e->attrs, true);
  inherit (w, e->parent, li, &e->attrs);
  if (e->attrs.flags & BFO_ATTR_CALLER)
    li->i_mode = LINUX_S_IFREG | 0600;
  r = img_errno (ext2fs_inode_size_set (w->fs, (struct ext2_inode *) li, e->size));
  bool mapped_here = r == 0 && in_inode_extents (w, li, e);
  /* The inode must be in the table before the extent code may write it.  */
  if (r == 0)
    r = write_full (w, ino, li);
  if (r == 0)
    ext2fs_inode_alloc_stats2 (w->fs, ino, +1, 0);
  else
    {
      free (li);
      free_runs (w, e, 0);
      return r;
    }
  size_t mapped = mapped_here ? e->n_runs : 0;
  if (!mapped_here)
    {
      r = map_extents (w, ino, li, e, &mapped);
      if (r == 0)
        r = write_full (w, ino, li);
    }
  if (r == 0 && old && queue_repoint (w, e, ino, old))
    {
      /* Its name goes to the new inode with the others of its directory.  */
      free (li);
      return 0;
    }
  if (r == 0)
    {
      *op = "link";
      r = old ? repoint_name (w, e->parent, e->base, ino, EXT2_FT_REG_FILE)
              : link_name (w, e->parent, e->base, ino, EXT2_FT_REG_FILE);
    }
  if (r < 0)
    {
      /* Mapped blocks go with the inode; unmapped runs are freed here.  */
      free_runs (w, e, mapped);
      write_full (w, ino, li);
      drop_link (w, ino);
      free (li);
      return r;
    }
  free (li);
  if (old)
    {
      *op = "replace";
      r = drop_link (w, old);
      if (r < 0)
        return r;
    }
  return 0;
}

static int
add_dirattr (struct bfo_ext4img *w, ext2_ino_t ino, const struct bfo_write_attrs *a,
             size_t seq)
{
  if (w->n_dirs == w->cap_dirs)
    {
      size_t ncap = w->cap_dirs ? 2 * w->cap_dirs : 64;
      struct img_dirattr *x = realloc (w->dirs, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      w->dirs = x;
      w->cap_dirs = ncap;
    }
  w->dirs[w->n_dirs] = (struct img_dirattr) { ino, *a, seq, SIZE_MAX, false, false, 0 };
  if (w->o.flags & BFO_WRITE_TAR_DIRS)
    da_put (w, ino, w->n_dirs);
  w->n_dirs++;
  return 0;
}

/* Directory entry E found directory INO at its name (or is the destination
   itself): it stays; the attributes asked for are set at close, as tar sets
   them on a directory it finds.  With BFO_ATTR_KEEP_DIR, tar
   --no-overwrite-dir, it keeps its owner and its mode masked (tar's chmod
   to a safe mode at once, and its restore with the umask), and only its
   times are the member's.  An immutable or append-only one keeps all: the
   kernel refuses tar's chmod at once (KEEP_DIR: the entry fails EPERM), or
   its delayed utime, chown and chmod (reported in ATTRS_ERROR).  */
static int
found_dir (struct bfo_ext4img *w, struct img_entry *e, ext2_ino_t ino)
{
  if (!e->attrs.flags)
    return 0;
  struct ext2_inode in;
  errcode_t err = ext2fs_read_inode (w->fs, ino, &in);
  if (err)
    return img_errno (err);
  e->found_mode = in.i_mode;
  struct bfo_write_attrs a = e->attrs;
  a.flags &= ~BFO_ATTR_NEW_SGID;
  /* The mode tar finds: what it set before, if it listed the directory.  */
  __u16 tar_mode = in.i_mode;
  if ((a.flags & BFO_ATTR_KEEP_DIR) && !(in.i_flags & GUARD_FL))
    {
      /* (the inode as read, without its extra part: mode and owner only) */
      struct ext2_inode_large view = { 0 };
      memcpy (&view, &in, sizeof in);
      tar_dir_view (w, ino, &view);
      tar_mode = view.i_mode;
    }
  if (in.i_flags & GUARD_FL)
    {
      if (a.flags & BFO_ATTR_KEEP_DIR)
        {
          e->error_op = "chmod";
          return -EPERM;
        }
      e->attrs_error = EPERM;
      return 0;
    }
  if (a.flags & BFO_ATTR_KEEP_DIR)
    {
      a.flags = (a.flags & (BFO_ATTR_ATIME | BFO_ATTR_MTIME)) | BFO_ATTR_MODE;
      a.mode = tar_mode & 07777 & a.keep_mask;
      if (in.i_mode & 07000)
        {
          /* tar's safe mode has none of these bits until its set_stat: what
             is made in it meanwhile does not take its set-group-ID.  */
          struct ext2_inode_large *li;
          int r = read_full (w, ino, &li);
          if (r < 0)
            return r;
          li->i_mode &= ~07000;
          set_time (has_extra (w, li), &li->i_ctime, &li->i_ctime_extra, now_ts ());
          r = write_full (w, ino, li);
          free (li);
          if (r < 0)
            return r;
        }
    }
  int r = add_dirattr (w, ino, &a, e->add_order);
  if (r == 0)
    w->dirs[w->n_dirs - 1].keep_dir = (e->attrs.flags & BFO_ATTR_KEEP_DIR) != 0;
  if (r == 0 && (e->attrs.flags & BFO_ATTR_KEEP_DIR) && a.keep_safe
      && !(a.keep_safe & a.keep_mask & ~tar_mode))
    {
      /* tar's set_stat runs no chmod then, unless in its last pass.  */
      w->dirs[w->n_dirs - 1].has_early = true;
      w->dirs[w->n_dirs - 1].early_mode = (tar_mode & 0777) | a.keep_safe;
    }
  return r;
}

/* A directory: created if missing; its attributes are set at close.  A
   non-directory there goes, as tar -x removes it (a symbolic link too, even
   to a directory: tar's --keep-directory-symlink would keep it).  */
static int
create_dir (struct bfo_ext4img *w, struct img_entry *e)
{
  ext2_ino_t ino;
  __u16 mode;
  int r = lookup_name (w, e->parent, e->base, &ino, &mode);
  if (r == 0 && !LINUX_S_ISDIR (mode))
    {
      r = remove_name (w, e->parent, e->base, ino, mode);
      if (r == 0)
        r = -ENOENT;
      else if (r == -EPERM)
        {
          /* Kept (the kernel refused its unlink): tar sets the member's
             attributes on it when it would set the directory's, before any
             later member of that name (a batch holds a name once), and the
             kernel refuses that too if it is immutable or append-only.  */
          struct ext2_inode_large *li = NULL;
          r = read_full (w, ino, &li);
          if (r < 0)
            return r;
          e->found_mode = li->i_mode;
          struct bfo_write_attrs a = e->attrs;
          a.flags &= ~BFO_ATTR_NEW_SGID;
          if (a.flags && !(a.flags & BFO_ATTR_KEEP_DIR) && LINUX_S_ISLNK (li->i_mode))
            {
              /* tar's utime, chown and chmod of it follow the link; its
                 chmod comes when the mode differs from the link's.  */
              free (li);
              li = NULL;
              __u16 tmode;
              r = follow (w, e->parent, ino, &ino, &tmode);
              if (r == -ENOMEM || r == -EIO)
                return r;
              if (r < 0)
                {
                  e->attrs_error = -r;
                  return 0;
                }
              r = read_full (w, ino, &li);
              if (r < 0)
                return r;
              if ((a.flags & BFO_ATTR_MODE) && a.mode == (e->found_mode & 07777))
                a.flags &= ~BFO_ATTR_MODE;
              a.flags &= ~BFO_ATTR_MODE_PERMS;   /* the link's: none */
            }
          if (a.flags & BFO_ATTR_KEEP_DIR)
            ;   /* tar --no-overwrite-dir delays no set_stat for it */
          else if (a.flags && (li->i_flags & GUARD_FL))
            e->attrs_error = EPERM;
          else if (a.flags)
            {
              apply_attrs (w, li, &a, false);
              r = write_full (w, ino, li);
            }
          free (li);
          return r;
        }
    }
  else if (r == 0)
    return found_dir (w, e, ino);
  if (r == -ENOENT)
    {
      r = make_dir (w, e->parent, e->base, &ino);
      if (r == 0)
        w->rb->stats.image_dirs++;
    }
  if (r == 0 && e->attrs.flags)
    r = add_dirattr (w, ino, &e->attrs, e->add_order);
  return r;
}

static int
create_symlink (struct bfo_ext4img *w, struct img_entry *e)
{
  ext2_ino_t old, ino;
  bool placeholder = (w->o.flags & BFO_WRITE_TAR_DIRS) && bfo_target_escapes (e->target);
  __u16 omode;
  if (placeholder && lookup_name (w, e->parent, e->base, &old, &omode) == 0
      && LINUX_S_ISLNK (omode) && ext2fs_test_inode_bitmap2 (w->opaque, old))
    return 0;   /* tar finds its placeholder there: a duplicate, skipped */
  int r = old_entry (w, e, &old);
  if (r == 0 && old)
    {
      /* Unlike a file, a symlink's inode is made by libext2fs at its name; so
         the old name goes first.  */
      r = dir_release (w);
      errcode_t err = r < 0 ? 0 : ext2fs_unlink (w->fs, e->parent, e->base, old, 0);
      if (r < 0)
        ;
      else if (!err)
        {
          touch_dir (w, e->parent);
          if (in_index (w, e->parent))
            name_set (w, e->parent, e->base, 0, 0);
          r = drop_link (w, old);
        }
      else
        r = img_errno (err);
    }
  if (r < 0)
    return r;
  errcode_t err = ext2fs_new_inode (w->fs, e->parent, LINUX_S_IFLNK | 0777, NULL, &ino);
  if (err)
    return img_errno (err);
  /* With no name, ext2fs_symlink makes and accounts for the inode (and block)
     without linking it; linking is ours, with a full directory grown.  */
  err = ext2fs_symlink (w->fs, e->parent, ino, NULL, e->target);
  if (err)
    return img_errno (err);
  r = link_name (w, e->parent, e->base, ino, EXT2_FT_SYMLINK);
  struct ext2_inode_large *li = NULL;
  if (r == 0)
    r = read_full (w, ino, &li);
  if (r == 0)
    {
      apply_attrs (w, li, &e->attrs, true);
      inherit (w, e->parent, li, &e->attrs);
      r = write_full (w, ino, li);
    }
  else
    drop_link (w, ino);
  free (li);
  if (r == 0)
    w->rb->stats.image_symlinks++;
  /* tar -x makes a link with an absolute target or a ".." in it only at the
     end (first a placeholder file, so that no member can go through it): such
     a link this writer made is not followed, entries under it are ENOTDIR.  */
  if (r == 0 && bfo_target_escapes (e->target))
    ext2fs_mark_inode_bitmap2 (w->opaque, ino);
  else
    ext2fs_unmark_inode_bitmap2 (w->opaque, ino);
  if (r == 0 && placeholder)
    {
      if (w->n_ph == w->cap_ph)
        {
          size_t ncap = w->cap_ph ? 2 * w->cap_ph : 64;
          struct img_placeholder *x = realloc (w->ph, ncap * sizeof *x);
          if (x)
            w->ph = x, w->cap_ph = ncap;
        }
      char *name = w->n_ph < w->cap_ph ? strdup (e->base) : NULL;
      if (name)
        w->ph[w->n_ph++] = (struct img_placeholder) { e->parent, ino, name };
    }
  return r;
}

/* A device, fifo or socket at E->path, replacing a non-directory there, as
   mknod(2) makes it (the device number in the inode's first block slots, old
   16-bit form where major and minor fit, as the kernel and mke2fs -d store it).  */
static int
create_node (struct bfo_ext4img *w, struct img_entry *e)
{
  ext2_ino_t old = 0, ino;
  int r = old_entry (w, e, &old);
  if (r < 0)
    return r;
  __u16 type = S_ISCHR (e->node_mode) ? LINUX_S_IFCHR : S_ISBLK (e->node_mode) ? LINUX_S_IFBLK
               : S_ISFIFO (e->node_mode) ? LINUX_S_IFIFO : LINUX_S_IFSOCK;
  errcode_t err = ext2fs_new_inode (w->fs, e->parent, type | 0600, NULL, &ino);
  if (err)
    return img_errno (err);
  struct ext2_inode_large *li = new_inode_buf (w);
  if (!li)
    return -ENOMEM;
  li->i_mode = type | ((e->node_mode & 07777) & ~w->umask);
  li->i_links_count = 1;
  apply_attrs (w, li, &e->attrs, true);
  inherit (w, e->parent, li, &e->attrs);
  if (type == LINUX_S_IFCHR || type == LINUX_S_IFBLK)
    {
      unsigned int ma = major (e->rdev), mi = minor (e->rdev);
      if (ma < 256 && mi < 256)
        li->i_block[0] = ext2fs_cpu_to_le32 (ma * 256 + mi);
      else
        li->i_block[1] = ext2fs_cpu_to_le32 ((mi & 0xff) | (ma << 8) | ((mi & ~0xffu) << 12));
    }
  r = write_full (w, ino, li);
  free (li);
  if (r < 0)
    return r;
  ext2fs_inode_alloc_stats2 (w->fs, ino, +1, 0);
  int ft = file_type (type);
  r = old ? repoint_name (w, e->parent, e->base, ino, ft)
          : link_name (w, e->parent, e->base, ino, ft);
  if (r < 0)
    {
      drop_link (w, ino);
      return r;
    }
  if (old)
    r = drop_link (w, old);
  return r;
}

/* link(2)'s lookup of a target named with a trailing '/' (INO, *MODE, in
   DIR): a symbolic link is followed, and it is ENOTDIR unless a directory
   (which link(2) refuses after it looked at the new name: *MODE says so).  */
static int
dir_target (struct bfo_ext4img *w, ext2_ino_t dir, ext2_ino_t ino, __u16 *mode)
{
  ext2_ino_t to;
  __u16 m = *mode;
  int r = LINUX_S_ISLNK (m) ? follow (w, dir, ino, &to, &m) : 0;
  if (r == 0 && !LINUX_S_ISDIR (m))
    r = -ENOTDIR;
  if (r == 0)
    *mode = m;
  return r;
}

/* A hard link RELPATH to the existing non-directory E->target (relative to the
   destination; written in this batch or before).  */
static int
create_link (struct bfo_ext4img *w, struct img_entry *e)
{
  w->cur_seq = e->add_order;
  ext2_ino_t tparent, tino, old = 0;
  const char *tbase;
  __u16 tmode;
  /* In the order of link(2) and tar's extract_link: the target must be
     there (tar then makes the name's missing directories all the same),
     the name is the target itself or names it already (nothing to do), a
     name there goes as tar removes it (an empty directory too; EEXIST for
     one with entries), and only then is a directory target refused.  */
  int r = 0;
  if (strcmp (e->target, ".") == 0)
    {
      /* The destination itself: a directory, refused once the name is seen to.  */
      tparent = tino = w->root;
      tmode = LINUX_S_IFDIR;
    }
  else if ((r = resolve_parent (w, e->target, false, &tparent, &tbase)) == 0)
    r = lookup_name (w, tparent, tbase, &tino, &tmode);
  if (r == 0 && e->dir_target)
    r = dir_target (w, tparent, tino, &tmode);
  if (r == -ENOENT && (w->o.flags & BFO_WRITE_MKDIRS))
    {
      /* tar tries again if that made a directory: the target may be it.  */
      uint64_t made = w->rb->stats.image_dirs;
      resolve_entry (w, e, true, true);
      if (w->rb->stats.image_dirs != made)
        {
          r = resolve_parent (w, e->target, false, &tparent, &tbase);
          if (r == 0)
            r = lookup_name (w, tparent, tbase, &tino, &tmode);
          if (r == 0 && e->dir_target)
            r = dir_target (w, tparent, tino, &tmode);
        }
    }
  if (r < 0)
    return r;
  if (strcmp (e->path, e->target) == 0)
    return 0;
  /* The parent cache now holds the target's directory.  */
  r = resolve_entry (w, e, w->o.flags & BFO_WRITE_MKDIRS, false);
  if (r < 0)
    return r;
  __u16 omode;
  r = lookup_name (w, e->parent, e->base, &old, &omode);
  if (r == 0 && old == tino)
    return 0;
  if (r == -ENOENT)
    old = 0, r = may_add (w, e->parent);
  else if (r == 0)
    r = old_entry (w, e, &old);
  if (r == 0 && old && LINUX_S_ISLNK (omode))
    {
      /* tar removes the name, then links again: a target it reached
         through that symbolic link is not there any more.  */
      ext2_ino_t p2;
      const char *b2;
      w->absent = old;
      r = resolve_parent (w, e->target, false, &p2, &b2);
      if (r == 0)
        r = lookup_name (w, p2, b2, &tino, &tmode);
      if (r == 0 && tino == old)
        r = -ENOENT;
      w->absent = 0;
      forget_parent (w);
      if (r < 0)
        {
          remove_name (w, e->parent, e->base, old, omode);
          return r;
        }
    }
  if (r < 0)
    return r;
  if (LINUX_S_ISDIR (tmode))
    {
      if (old)
        remove_name (w, e->parent, e->base, old, omode);
      return -EPERM;
    }
  struct ext2_inode_large *li;
  r = read_full (w, tino, &li);
  if (r < 0)
    return r;
  if (li->i_flags & GUARD_FL)
    {
      /* link(2) to an immutable or append-only file; the name tar removed
         stays removed.  */
      free (li);
      if (old)
        remove_name (w, e->parent, e->base, old, omode);
      return -EPERM;
    }
  if (li->i_links_count >= EXT2_LINK_MAX)
    {
      free (li);
      return -EMLINK;
    }
  li->i_links_count++;
  set_time (has_extra (w, li), &li->i_ctime, &li->i_ctime_extra, now_ts ());
  r = write_full (w, tino, li);
  if (r == 0)
    r = old ? repoint_name (w, e->parent, e->base, tino, file_type (tmode))
            : link_name (w, e->parent, e->base, tino, file_type (tmode));
  if (r < 0)
    {
      li->i_links_count--;
      write_full (w, tino, li);
    }
  free (li);
  if (r == 0 && old)
    r = drop_link (w, old);
  if (r == 0)
    w->rb->stats.image_links++;
  return r;
}

/* Extended attribute E->target (name, then value) of the entry at E->path
   ("." is the destination), as setxattr(2) would set it: replaced if there;
   POSIX ACLs given in the kernel's format are stored in ext4's.  */
static int
set_xattr (struct bfo_ext4img *w, struct img_entry *e)
{
  /* Those of an entry that could not be made are not set (tar sets a
     member's after making it).  */
  if (e->member && w->rb->e[e->member - 1].error)
    return 0;
  ext2_ino_t ino = w->root;
  __u16 mode = LINUX_S_IFDIR;
  if (strcmp (e->path, ".") != 0)
    {
      ext2_ino_t parent;
      const char *base;
      int r = resolve_parent (w, e->path, false, &parent, &base);
      if (r == 0)
        r = lookup_name (w, parent, base, &ino, &mode);
      if (r < 0)
        return r;
    }
  const char *name = e->target;
  /* The kernel keeps user.* attributes of regular files and directories
     only (xattr_permission).  */
  if (strncmp (name, "user.", 5) == 0 && !LINUX_S_ISREG (mode) && !LINUX_S_ISDIR (mode))
    return -EPERM;
  const unsigned char *value = (const unsigned char *) name + strlen (name) + 1;
  /* An access ACL also sets the permission bits, and one that says no more
     than they do is not stored (as the kernel does on setxattr).  */
  int acl_mode = -1;
  bool drop = false;
  if (strcmp (name, "system.posix_acl_access") == 0)
    {
      if (e->len < 4 || (e->len - 4) % 8 || value[0] != 2 || value[1] || value[2] || value[3])
        return -EINVAL;
      int user = -1, group = -1, mask = -1, other = -1;
      bool named = false;
      for (size_t off = 4; off < e->len; off += 8)
        {
          unsigned int tag = value[off] | value[off + 1] << 8;
          unsigned int perm = (value[off + 2] | value[off + 3] << 8) & 7;
          switch (tag)
            {
            case 0x01: user = perm; break;            /* ACL_USER_OBJ */
            case 0x04: group = perm; break;           /* ACL_GROUP_OBJ */
            case 0x10: mask = perm; break;            /* ACL_MASK */
            case 0x20: other = perm; break;           /* ACL_OTHER */
            case 0x02: case 0x08: named = true; break;  /* ACL_USER, ACL_GROUP */
            default: return -EINVAL;
            }
        }
      if (user < 0 || group < 0 || other < 0 || (named && mask < 0))
        return -EINVAL;
      acl_mode = user << 6 | (mask >= 0 ? mask : group) << 3 | other;
      drop = !named && mask < 0;
    }
  /* The kernel charges an inode for the values its attributes keep in
     attribute inodes (ea_inode); libext2fs does not.  */
  bool ea_inodes = ext2fs_has_feature_ea_inode (w->fs->super);
  blk64_t ea_before = 0;
  if (ea_inodes)
    {
      struct ext2_inode_large *li;
      unsigned int count;
      int r = read_full (w, ino, &li);
      if (r == 0)
        {
          r = bfo_ea_inode_charge (w->fs, ino, li, &ea_before, &count);
          free (li);
        }
      if (r < 0)
        return r;
    }
  struct ext2_xattr_handle *h;
  errcode_t err = ext2fs_xattrs_open (w->fs, ino, &h);
  if (err)
    return img_errno (err);
  err = ext2fs_xattrs_read (h);
  if (!err && drop)
    {
      err = ext2fs_xattr_remove (h, name);
      if (err == EXT2_ET_EA_KEY_NOT_FOUND)
        err = 0;
    }
  else if (!err)
    err = ext2fs_xattr_set (h, name, value, e->len);
  errcode_t cerr = ext2fs_xattrs_close (&h);
  if (!err)
    err = cerr;
  if (!err && (acl_mode >= 0 || ea_inodes))
    {
      struct ext2_inode_large *li;
      int r = read_full (w, ino, &li);
      if (r < 0)
        return r;
      blk64_t ea_after = 0;
      unsigned int count;
      if (ea_inodes)
        r = bfo_ea_inode_charge (w->fs, ino, li, &ea_after, &count);
      if (r == 0 && ea_after > ea_before)
        r = img_errno (ext2fs_iblk_add_blocks (w->fs, (struct ext2_inode *) li,
                                               ea_after - ea_before));
      else if (r == 0 && ea_after < ea_before)
        r = img_errno (ext2fs_iblk_sub_blocks (w->fs, (struct ext2_inode *) li,
                                               ea_before - ea_after));
      if (r == 0 && acl_mode >= 0)
        {
          li->i_mode = (li->i_mode & ~0777) | acl_mode;
          set_time (has_extra (w, li), &li->i_ctime, &li->i_ctime_extra, now_ts ());
        }
      if (r == 0 && (acl_mode >= 0 || ea_after != ea_before))
        r = write_full (w, ino, li);
      free (li);
      return r;
    }
  return img_errno (err);
}

/* FN for entry E; a failure is E's, as OP.  */
static void
run_entry (struct bfo_ext4img *w, struct img_entry *e, const char *op,
           int (*fn) (struct bfo_ext4img *, struct img_entry *))
{
  e->error_op = op;
  int r = fn (w, e);
  if (r < 0)
    e->error = -r;
}

/* run_entry for each entry of ORDER[0..N) of KIND, in order.  */
static void
run_kind (struct bfo_ext4img *w, struct img_entry **order, size_t n, int kind,
          const char *op, int (*fn) (struct bfo_ext4img *, struct img_entry *))
{
  for (size_t i = 0; i < n; i++)
    if (order[i]->kind == kind)
      run_entry (w, order[i], op, fn);
}

/* The batch's placement order: ORDER (the target order) without a layout or when
   it cannot be computed (the layout is advice), else a new array of the entries in
   the layout's order; NULL when out of memory.  */
static struct img_entry **
layout_order (struct bfo_ext4img *w, struct img_slot *sl, struct img_entry **order)
{
  size_t n = sl->n;
  if (n < 2 || bfo_layout_policy (w->o.layout) == BFO_LAYOUT_WALK)
    return order;
  struct img_entry **place = malloc (n * sizeof *place);
  struct bfo_layout_file *f = malloc (n * sizeof *f);
  size_t *idx = malloc (n * sizeof *idx), *perm = malloc (n * sizeof *perm);
  bool ok = place && f && idx && perm;
  /* Only files take data blocks: directories, symlinks and links would only
     shift the groups (a directory entry is a file of its parent for dir).  */
  size_t nf = 0;
  for (size_t i = 0; ok && i < n; i++)
    if (sl->e[i].kind == IMG_FILE)
      {
        f[nf] = (struct bfo_layout_file) { sl->e[i].path, sl->e[i].data, sl->e[i].len };
        idx[nf++] = i;
      }
  ok = ok && bfo_layout_order (w->o.layout, f, nf, perm, NULL, NULL) == 0;
  size_t k = 0;
  for (size_t j = 0; ok && j < nf; j++)
    place[k++] = &sl->e[idx[perm[j]]];
  for (size_t i = 0; ok && i < n; i++)
    if (sl->e[i].kind != IMG_FILE)
      place[k++] = &sl->e[i];
  free (f);
  free (idx);
  free (perm);
  if (ok)
    return place;
  free (place);
  return order;
}

/* Make directory, symbolic link or node E, or find file E's parent (made
   on the way): the first step of a batch for its entries of these kinds.  */
static void
make_early (struct bfo_ext4img *w, struct img_entry *e)
{
  w->cur_seq = e->add_order;
  e->error_op = "create";
  if (e->kind == IMG_DIR && strcmp (e->path, ".") == 0)
    {
      /* The destination itself: nothing to make, attributes at close.  */
      int r = found_dir (w, e, w->root);
      if (r < 0)
        e->error = -r;
      return;
    }
  int r = resolve_entry (w, e, w->o.flags & BFO_WRITE_MKDIRS, false);
  if (r == 0 && strlen (e->base) > EXT2_NAME_LEN)
    r = -ENAMETOOLONG;
  if (r == 0 && e->kind == IMG_DIR)
    r = create_dir (w, e);
  else if (r == 0 && e->kind == IMG_SYMLINK)
    r = create_symlink (w, e);
  else if (r == 0 && e->kind == IMG_NODE)
    r = create_node (w, e);
  if (r < 0)
    e->error = -r;
}

/* Whether an entry of batch SL has a path (or a hard link's target) through
   a symbolic link already in the image; such entries are marked ALIASED.
   The batch's cuts (batch_conflict) see names, not where a link leads: the
   directories such an entry lands in may be made or replaced by entries of
   the batch under other names, before or after it in the caller's order.  */
static bool
batch_aliased (struct bfo_ext4img *w, struct img_slot *sl)
{
  bool any = false;
  w->xs_valid = false;
  for (size_t i = 0; i < sl->n; i++)
    {
      struct img_entry *e = &sl->e[i];
      e->aliased = (through_symlink (w, e->path)
                    || (e->kind == IMG_LINK && through_symlink (w, e->target)));
      any |= e->aliased;
    }
  w->xs_valid = false;
  return any;
}

/* The steps of batch SL after its data were written (FATAL: their write
   failed), one entry after the other in the caller's order, as tar -x
   makes them: for a batch with an entry through a symbolic link
   (batch_aliased), which may land where an entry before it made a
   directory on the way, or where one after it will.  */
static void
run_in_order (struct bfo_ext4img *w, struct img_slot *sl, int fatal)
{
  for (size_t i = 0; i < sl->n; i++)
    {
      struct img_entry *e = &sl->e[i];
      /* Replaced names first: this entry may look at one of them.  */
      if (e->kind != IMG_FILE || e->aliased)
        repoint_files (w);
      int r;
      switch (e->kind)
        {
        case IMG_FILE:
          if (e->error)
            break;              /* (no blocks) */
          if (fatal)
            {
              free_runs (w, e, 0);
              e->error = -fatal;
              e->error_op = "write";
              break;
            }
          e->error_op = "create";
          r = resolve_entry (w, e, w->o.flags & BFO_WRITE_MKDIRS, false);
          if (r == 0 && strlen (e->base) > EXT2_NAME_LEN)
            r = -ENAMETOOLONG;
          const char *op = "create";
          if (r == 0)
            r = create_file (w, e, &op);
          else
            free_runs (w, e, 0);
          if (r < 0)
            e->error = -r, e->error_op = op;
          break;
        case IMG_LINK:
          run_entry (w, e, "link", create_link);
          break;
        case IMG_XATTR:
          run_entry (w, e, "xattr", set_xattr);
          break;
        default:
          make_early (w, e);
          break;
        }
    }
  repoint_files (w);
}

/* Run batch B (the worker's job): make its directories and symlinks, give its
   files blocks, write and sync their data, then make their inodes and entries,
   then hard links; bitmaps and superblock are written (not synced) at the end.
   A batch with an entry through a symbolic link makes its entries one after
   the other once the data are written (run_in_order).
   Returns 0 or -ENOMEM; per-entry results are in the entries.  */
static int
run_batch (struct bfo_ext4img *w, struct img_slot *sl)
{
  size_t n = sl->n;
  w->rb = sl;
  sl->stats.batches++;
  struct img_entry **order = malloc (n * sizeof *order);
  if (!order)
    return -ENOMEM;
  for (size_t i = 0; i < n; i++)
    order[i] = &sl->e[i];
  /* Target order: a directory's entries are made together, parents first.  */
  qsort (order, n, sizeof *order, by_path);
  sl->n_runs = 0;
  /* Placement order: the layout's (files only), else the target order.  */
  struct img_entry **place = layout_order (w, sl, order);
  if (!place)
    {
      free (order);
      return -ENOMEM;
    }

  /* Directories and symlinks, then the files' parents; blocks in placement order.  */
  bool in_order = batch_aliased (w, sl);
  for (size_t i = 0; i < n && !in_order; i++)
    if (order[i]->kind != IMG_LINK && order[i]->kind != IMG_XATTR)
      make_early (w, order[i]);
  for (size_t i = 0; i < n; i++)
    {
      struct img_entry *e = place[i];
      if (e->kind != IMG_FILE || e->error)
        continue;
      e->error_op = "write";
      int r = alloc_blocks (w, e, (e->len + w->bs - 1) / w->bs);  /* (sparse: packed) */
      if (r < 0)
        e->error = -r;
    }

  /* Data before any metadata that points to it, synced: a crash (even of the
     machine) can lose a file of this batch but never show one with another
     file's old blocks.  A metadata block freed since the last flush may sit
     dirty in libext2fs's cache and now be a file's: it goes out first, so that
     it cannot overwrite the data we write behind the cache's back.  Files were
     given blocks in placement order, so the requests come in ascending disk order.  */
  int fatal = 0;
  if (w->freed)
    {
      fatal = img_errno (io_channel_flush (w->fs->io));
      w->freed = false;
    }
  struct img_io *io = w->io;
  io->n = 0;
  io->bytes = 0;
  for (size_t i = 0; i < n && !fatal; i++)
    {
      struct img_entry *e = place[i];
      if (e->kind == IMG_FILE && !e->error)
        fatal = write_data (w, e, io);
    }
  if (place != order)
    free (place);
  if (!fatal)
    fatal = io_flush (w, io);
  if (!fatal && fdatasync (w->fd) < 0)
    fatal = -errno;
  if (!fatal)
    w->rb->stats.syncs++;

  if (in_order)
    run_in_order (w, sl, fatal);
  else
    {
      for (size_t i = 0; i < n; i++)
        {
          struct img_entry *e = order[i];
          if (e->kind != IMG_FILE || e->error)
            continue;
          if (fatal)
            {
              free_runs (w, e, 0);
              e->error = -fatal;
              e->error_op = "write";
              continue;
            }
          const char *op;
          int r = create_file (w, e, &op);
          if (r < 0)
            e->error = -r, e->error_op = op;
        }
      repoint_files (w);
      /* Hard links once their targets exist; extended attributes once every
         entry does.  */
      /* Links in the order they were added: one may name another's target
         (tar links to what is there when it reaches the link).  */
      for (size_t i = 0; i < n; i++)
        if (sl->e[i].kind == IMG_LINK)
          run_entry (w, &sl->e[i], "link", create_link);
      run_kind (w, order, n, IMG_XATTR, "xattr", set_xattr);
    }

  /* Bitmaps, group descriptors, superblock, and the metadata blocks libext2fs
     still caches: once per batch, synced, so a batch that was reported is on
     disk whatever happens to the next one (the worker thread hides the wait).
     A directory block that could not be written (DB_ERR) fails the batch: its
     entries were counted as linked.  */
  dir_release (w);
  int ferr = w->db_err;
  if (!ferr)
    ferr = img_errno (ext2fs_write_bitmaps (w->fs));
  if (!ferr)
    ferr = img_errno (ext2fs_flush2 (w->fs, 0));
  if (!ferr)
    {
      sl->stats.syncs++;
      w->freed = false;
    }
  else
    {
      w->broken = true;
      for (size_t i = 0; i < n; i++)
        if (!order[i]->error)
          order[i]->error = -ferr, order[i]->error_op = "sync";
    }
  for (size_t i = 0; i < n; i++)
    {
      struct img_entry *e = order[i];
      if (!e->error && e->kind == IMG_FILE)
        {
          sl->stats.files++;
          sl->stats.bytes += e->bytes;
        }
    }
  sl->order = order;
  return 0;
}

static void *
worker (void *arg)
{
  struct bfo_ext4img *w = arg;
  pthread_mutex_lock (&w->mu);
  for (;;)
    {
      struct img_slot *next = NULL;
      for (int i = 0; i < 2; i++)
        if (w->slot[i].seq && !w->slot[i].done
            && (!next || w->slot[i].seq < next->seq))
          next = &w->slot[i];
      if (!next && w->quit)
        break;
      if (!next)
        {
          pthread_cond_wait (&w->cv, &w->mu);
          continue;
        }
      pthread_mutex_unlock (&w->mu);
      int r = run_batch (w, next);
      pthread_mutex_lock (&w->mu);
      next->ret = r;
      next->done = true;
      pthread_cond_broadcast (&w->cv);
    }
  pthread_mutex_unlock (&w->mu);
  return NULL;
}

/* Report a batch that ran, in path order, and make its slot empty again.  */
static int
report (struct bfo_ext4img *w, struct img_slot *sl)
{
  /* The worker's path order, if it got that far: sorting again in this thread
     cost it 6 % of its CPU samples in bfotar -x --ext4-image (perf: strcmp
     alone, 3.5 % of all), and this thread is the busier one there.  */
  struct img_entry **order = sl->order;
  int ret = sl->ret;
  sl->order = NULL;
  if (!order)
    {
      order = malloc (sl->n * sizeof *order);
      if (order)
        {
          for (size_t i = 0; i < sl->n; i++)
            order[i] = &sl->e[i];
          qsort (order, sl->n, sizeof *order, by_path);
        }
      else if (ret == 0)
        ret = -ENOMEM;
    }
  for (size_t i = 0; i < sl->n; i++)
    {
      struct img_entry *e = order ? order[i] : &sl->e[i];
      if (sl->ret < 0 && !e->error)
        e->error = -sl->ret, e->error_op = "write";
      deliver (w, e);
    }
  for (size_t i = 0; i < sl->n; i++)
    free_entry (&sl->e[i]);
  free (order);
  BFO_COUNTERS_ADD (&w->stats, &sl->stats);
  memset (&sl->stats, 0, sizeof sl->stats);
  sl->n = 0;
  sl->arena_used = 0;
  sl->seq = 0;
  sl->done = false;
  sl->ret = 0;
  return ret;
}

/* Wait for the batch handed over before (if any) and report it.  */
static int
reap (struct bfo_ext4img *w)
{
  if (w->pending < 0)
    return 0;
  struct img_slot *sl = &w->slot[w->pending];
  pthread_mutex_lock (&w->mu);
  while (!sl->done)
    pthread_cond_wait (&w->cv, &w->mu);
  pthread_mutex_unlock (&w->mu);
  w->pending = -1;
  return report (w, sl);
}

/* Hand the batch being filled to the worker and take the other slot, once the
   worker is done with it, for filling.  Without a worker thread, run it here.  */
static void ps_clear (struct bfo_ext4img *w);

static int
submit (struct bfo_ext4img *w)
{
  struct img_slot *sl = &w->slot[w->cur];
  if (sl->n == 0)
    return 0;
  ps_clear (w);
  if (!w->threaded)
    {
      sl->ret = run_batch (w, sl);
      sl->done = true;
      int r = report (w, sl);
      return r < 0 ? r : w->stop;
    }
  pthread_mutex_lock (&w->mu);
  sl->seq = ++w->queued;
  pthread_cond_broadcast (&w->cv);
  pthread_mutex_unlock (&w->mu);
  int r = reap (w);
  w->pending = w->cur;
  w->cur = 1 - w->cur;
  return r < 0 ? r : w->stop;
}

/* Everything queued written and reported.  */
static int
drain (struct bfo_ext4img *w)
{
  int r = submit (w);
  int r2 = reap (w);
  if (r == 0)
    r = r2;
  return r < 0 ? r : w->stop;
}

int
bfo_ext4img_flush (struct bfo_ext4img *w)
{
  return drain (w);
}

/* The paths of the batch being filled.  A batch makes directories, symbolic
   links and nodes before files and hard links (run_batch), so entries whose
   order matters go into separate batches, in the order they were added:
   a name given twice, a name the batch has entries under or links to, and
   an entry under a name the batch has as a non-directory (tar archives may
   hold each, and tar -x applies them one after the other).  Archives list a directory
   before its entries, bfo write and mkimage add it before them: none of
   these cut their batches.  */
enum { PS_NONDIR = 1, PS_DIR = 2, PS_UNDER = 4, PS_TARGET = 8 };

/* The table holds the paths' 64-bit hashes, not the paths: two paths of one
   hash share their flags, which can only start a batch early (order kept,
   a batch smaller), never keep two entries in one that must not be.  No
   string is copied or compared for the entries of a batch.  */
static uint64_t
ps_key (const char *p, size_t len)
{
  uint64_t h = bfo_hash_bytes (p, len);
  return h ? h : 1;
}

/* The slot of KEY in the path table: its index; *FOUND says whether it is
   there.  The table has room (ps_grow).  */
static size_t
ps_slot (const struct bfo_ext4img *w, uint64_t key, bool *found)
{
  size_t i = key & (w->ps_cap - 1);
  while (w->ps_key[i] && w->ps_key[i] != key)
    i = (i + 1) & (w->ps_cap - 1);
  *found = w->ps_key[i] == key;
  return i;
}

static unsigned char
ps_get (const struct bfo_ext4img *w, const char *p, size_t len)
{
  bool found;
  if (!w->ps_cap)
    return 0;
  size_t i = ps_slot (w, ps_key (p, len), &found);
  return found ? w->ps_flag[i] : 0;
}

static void
ps_clear (struct bfo_ext4img *w)
{
  if (w->ps_n)
    memset (w->ps_key, 0, w->ps_cap * sizeof *w->ps_key);
  w->ps_n = 0;
}

static bool
ps_grow (struct bfo_ext4img *w)
{
  if (2 * (w->ps_n + 1) <= w->ps_cap)
    return true;
  size_t ocap = w->ps_cap, ncap = ocap ? 2 * ocap : 1024;
  uint64_t *ok = w->ps_key;
  unsigned char *of = w->ps_flag;
  w->ps_key = calloc (ncap, sizeof *w->ps_key);
  w->ps_flag = calloc (ncap, 1);
  if (!w->ps_key || !w->ps_flag)
    {
      free (w->ps_key);
      free (w->ps_flag);
      w->ps_key = ok;
      w->ps_flag = of;
      return false;
    }
  w->ps_cap = ncap;
  for (size_t i = 0; i < ocap; i++)
    if (ok[i])
      {
        bool found;
        size_t j = ps_slot (w, ok[i], &found);
        w->ps_key[j] = ok[i];
        w->ps_flag[j] = of[i];
      }
  free (ok);
  free (of);
  return true;
}

/* Add FLAG to P[0..LEN)'s; false without memory.  */
static bool
ps_set (struct bfo_ext4img *w, const char *p, size_t len, unsigned char flag)
{
  if (!ps_grow (w))
    return false;
  bool found;
  uint64_t key = ps_key (p, len);
  size_t i = ps_slot (w, key, &found);
  if (!found)
    {
      w->ps_key[i] = key;
      w->ps_flag[i] = 0;
      w->ps_n++;
    }
  w->ps_flag[i] |= flag;
  return true;
}

/* Whether an entry at PATH must wait for the batch being filled to be
   written (see PS_NONDIR).  */
static bool
batch_conflict (const struct bfo_ext4img *w, const char *path)
{
  size_t len = strlen (path);
  unsigned char f = ps_get (w, path, len);
  /* Even a directory at a name the batch has entries under: what is at that
     name now (a symbolic link, say) decided where they went.  */
  if (f)
    return true;
  /* The names it is under; those already under others were checked then.  */
  for (size_t k = len; k > 0; k--)
    if (path[k - 1] == '/' && k > 1)
      {
        f = ps_get (w, path, k - 1);
        /* (Under a link's target: the entry would make it a directory
           before the link is made.)  */
        if (f & (PS_NONDIR | PS_TARGET))
          return true;
        if (f & PS_UNDER)
          break;
      }
  return false;
}

/* Add FLAG to PATH and PS_UNDER to the names it is under; false without
   memory.  */
static bool
ps_note (struct bfo_ext4img *w, const char *path, unsigned char flag)
{
  size_t len = strlen (path);
  bool ok = ps_set (w, path, len, flag);
  for (size_t k = len; ok && k > 0; k--)
    if (path[k - 1] == '/' && k > 1)
      {
        if (ps_get (w, path, k - 1) & PS_UNDER)
          break;
        ok = ps_set (w, path, k - 1, PS_UNDER);
      }
  return ok;
}

/* Record the entry of KIND at PATH (a hard link's: to TARGET) in the batch
   being filled.  A hard link's target is noted too: an entry made there
   later in the batch must not be there before the link is (links go last
   in a batch; tar -x links to what is there when it reaches the link).
   Without memory the batch goes now: with no table every entry is a batch
   of its own, which is slow but keeps the order.  */
static int
batch_note (struct bfo_ext4img *w, int kind, const char *path, const char *target)
{
  bool ok = ps_note (w, path, kind == IMG_DIR ? PS_DIR : PS_NONDIR);
  if (ok && kind == IMG_LINK)
    ok = ps_note (w, target, PS_TARGET);
  return ok ? 0 : submit (w);
}

static struct img_entry *
new_entry (struct img_slot *sl)
{
  if (sl->n == sl->cap)
    {
      size_t ncap = sl->cap ? 2 * sl->cap : 256;
      struct img_entry *x = realloc (sl->e, ncap * sizeof *x);
      if (!x)
        return NULL;
      sl->e = x;
      sl->cap = ncap;
    }
  struct img_entry *e = &sl->e[sl->n];
  memset (e, 0, sizeof *e);
  return e;
}

/* Whether batch SL, not full, should go now: the worker thread is idle (the
   batch before has been written) and SL is worth its syncs.  Not with a layout,
   whose groups are placed within a batch.  */
static bool
idle_cut (struct bfo_ext4img *w, const struct img_slot *sl)
{
  if (!w->threaded || (sl->n < IMG_IDLE_CUT_FILES && sl->arena_used < IMG_IDLE_CUT_BYTES)
      || bfo_layout_policy (w->o.layout) != BFO_LAYOUT_WALK)
    return false;
  if (w->pending < 0)
    return true;
  pthread_mutex_lock (&w->mu);
  bool done = w->slot[w->pending].done;
  pthread_mutex_unlock (&w->mu);
  return done;
}

/* Where a sparse file's data go (see bfo_ext4img_add_sparse).  */
struct img_sparse
{
  struct img_seg *segs;         /* handed over: freed with the entry, or here */
  size_t n_segs;
  uint64_t size, bytes;
};

/* BFO_WRITE_TAR_DIRS, for each entry added (not attributes), in the caller's
   thread: tar -x sets the attributes of the directories it delayed that are
   not above the member it reaches (apply_nonancestor_delayed_set_stat), the
   last delayed first, before it makes the member.  "." (the destination) is
   above every entry.  Without memory a directory is taken as set at the end.  */
static void
dfinal_add (struct bfo_ext4img *w, size_t seq, size_t final, bool skip)
{
  if (w->n_dfinal == w->cap_dfinal)
    {
      size_t ncap = w->cap_dfinal ? 2 * w->cap_dfinal : 64;
      struct img_dfinal *x = realloc (w->dfinal, ncap * sizeof *x);
      if (x)
        w->dfinal = x, w->cap_dfinal = ncap;
    }
  if (w->n_dfinal < w->cap_dfinal)
    {
      w->dfinal[w->n_dfinal] = (struct img_dfinal) { seq, final, w->n_dfinal, skip };
      w->n_dfinal++;
    }
  if (final < IMG_END && !skip)
    fin_put (w, seq, final);
}

static void
tar_dirs_note (struct bfo_ext4img *w, const char *relpath)
{
  size_t len = strlen (relpath);
  while (w->n_dpend)
    {
      struct img_dpending *d = &w->dpend[w->n_dpend - 1];
      if (d->after_links
          || (d->len < len && relpath[d->len] == '/' && memcmp (relpath, d->path, d->len) == 0))
        break;
      dfinal_add (w, d->seq, w->added, false);
      free (d->path);
      w->n_dpend--;
    }
}

/* ... and a symbolic link RELPATH with an absolute or ".." target, which
   tar makes as a placeholder file and the link itself at the end
   (create_placeholder_file): the directory delayed that is its parent, if
   any, and those delayed before it are set in tar's last pass, after the
   links (mark_after_links), not when a member not under them comes.  */
static void
tar_dirs_mark (struct bfo_ext4img *w, const char *relpath)
{
  const char *slash = strrchr (relpath, '/');
  size_t plen = slash ? (size_t) (slash - relpath) : 1;
  const char *parent = slash ? relpath : ".";
  size_t i = w->n_dpend;
  while (i && (w->dpend[i - 1].after_links || w->dpend[i - 1].len != plen
               || memcmp (w->dpend[i - 1].path, parent, plen) != 0))
    i--;
  for (; i && !w->dpend[i - 1].after_links; i--)
    w->dpend[i - 1].after_links = true;
}

/* The slot of PATH in the index of DPEND: holding it, or empty.  */
static size_t *
dp_slot (struct bfo_ext4img *w, const char *path)
{
  size_t mask = w->n_dp_slots - 1;
  for (size_t i = bfo_hash_bytes (path, strlen (path)) & mask;; i = (i + 1) & mask)
    if (!w->dp_slot[i] || strcmp (w->dpend[w->dp_slot[i] - 1].path, path) == 0)
      return &w->dp_slot[i];
}

/* Index DPEND's last entry (at half load the index grows); without memory
   there is no index, and names listed again are not merged.  */
static void
dp_index (struct bfo_ext4img *w)
{
  if (2 * w->n_dpend > w->n_dp_slots)
    {
      size_t n = w->n_dp_slots ? 2 * w->n_dp_slots : 256;
      size_t *x = calloc (n, sizeof *x);
      free (w->dp_slot);
      w->dp_slot = x;
      w->n_dp_slots = x ? n : 0;
      for (size_t i = 0; x && i + 1 < w->n_dpend; i++)
        {
          size_t *sl = dp_slot (w, w->dpend[i].path);
          if (!*sl)
            *sl = i + 1;
        }
    }
  if (w->n_dp_slots)
    {
      size_t *sl = dp_slot (w, w->dpend[w->n_dpend - 1].path);
      if (!*sl)
        *sl = w->n_dpend;
    }
}

/* ... and a directory entry RELPATH taken (add_order SEQ) is delayed in
   turn.  A name delayed already (with BFO_WRITE_TAR_DELAY, or one marked
   after links) keeps its place with the later entry's attributes
   (delay_set_stat).  */
static void
tar_dirs_push (struct bfo_ext4img *w, const char *relpath, size_t seq)
{
  size_t j = 0;
  if ((w->o.flags & BFO_WRITE_TAR_DELAY) && w->n_dp_slots)
    j = *dp_slot (w, relpath);
  else if (!(w->o.flags & BFO_WRITE_TAR_DELAY))
    {
      /* Only one set in tar's last pass can still be there.  */
      size_t len = strlen (relpath);
      for (j = w->n_dpend; j; j--)
        if (w->dpend[j - 1].after_links && w->dpend[j - 1].len == len
            && memcmp (w->dpend[j - 1].path, relpath, len) == 0)
          break;
    }
  if (j)
    {
      dfinal_add (w, w->dpend[j - 1].seq, IMG_END, true);
      w->dpend[j - 1].seq = seq;
      return;
    }
  if (w->n_dpend == w->cap_dpend)
    {
      size_t ncap = w->cap_dpend ? 2 * w->cap_dpend : 64;
      struct img_dpending *x = realloc (w->dpend, ncap * sizeof *x);
      if (!x)
        return;
      w->dpend = x;
      w->cap_dpend = ncap;
    }
  char *p = strdup (relpath);
  /* "." is set in tar's last pass (delay_set_stat: must_be_dot_or_slash).  */
  if (p)
    {
      w->dpend[w->n_dpend++] = (struct img_dpending) { p, strlen (p), seq,
                                                       strcmp (p, ".") == 0 };
      if (w->o.flags & BFO_WRITE_TAR_DELAY)
        dp_index (w);
    }
}

static int
by_dseq (const void *a, const void *b)
{
  const struct img_dfinal *x = a, *y = b;
  return x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* BFO_WRITE_TAR_DIRS, at close: directory attribute I keeps the time of the
   change of its directory (TOUCHED then) instead of its modification time
   when an entry changed the directory after tar would have set them.  */
static const struct img_dfinal *
tar_dirs_final (struct bfo_ext4img *w, size_t i)
{
  if (!(w->o.flags & BFO_WRITE_TAR_DIRS))
    return NULL;
  struct img_dfinal key = { .seq = w->dirs[i].seq };
  return bsearch (&key, w->dfinal, w->n_dfinal, sizeof key, by_dseq);
}

static bool
tar_dirs_later (struct bfo_ext4img *w, size_t i)
{
  const struct img_dirattr *d = &w->dirs[i];
  const struct img_dfinal *f = tar_dirs_final (w, i);
  size_t last;
  if (!f || !map_get (&w->lt, d->ino, &last))
    return false;             /* set at the end, after every entry */
  return last >= f->final;
}

/* ... and it is set in tar's last pass, where tar takes the directory's
   mode as it is then (check_for_renamed_directories), not as it made it.  */
static bool
tar_dirs_late (struct bfo_ext4img *w, size_t i)
{
  const struct img_dfinal *f = tar_dirs_final (w, i);
  return f && f->final == IMG_LATE;
}

static int
by_ino (const void *a, const void *b)
{
  ext2_ino_t x = *(const ext2_ino_t *) a, y = *(const ext2_ino_t *) b;
  return x < y ? -1 : x > y;
}

/* The order in which tar sets the directories' attributes: as they left
   its delayed list (popped, then at the end from the last delayed down),
   those not noted last in the order they were added.  */
struct img_dapply
{
  size_t order, seq, i;
};

static int
by_apply (const void *a, const void *b)
{
  const struct img_dapply *x = a, *y = b;
  return x->order != y->order ? (x->order < y->order ? -1 : 1)
         : x->seq < y->seq ? -1 : x->seq > y->seq;
}

static int
img_add (struct bfo_ext4img *w, int kind, const char *relpath, const char *target,
         const void *data, size_t len, mode_t node_mode, dev_t rdev,
         const struct bfo_write_attrs *attrs, void *user, const struct img_sparse *sp)
{
  if (w->stop)
    {
      if (sp)
        free (sp->segs);
      return w->stop;
    }
  struct bfo_write_attrs a = { 0 };
  if (attrs)
    a = *attrs;
  if ((w->o.flags & (BFO_WRITE_TAR_DIRS | BFO_WRITE_TAR_DELAY)) == BFO_WRITE_TAR_DIRS
      && kind != IMG_XATTR)
    tar_dirs_note (w, relpath);
  if ((w->o.flags & BFO_WRITE_TAR_DIRS) && kind == IMG_SYMLINK && target
      && bfo_target_escapes (target))
    tar_dirs_mark (w, relpath);
  bool self = (kind == IMG_DIR || kind == IMG_XATTR) && strcmp (relpath, ".") == 0;
  if ((!self && bfo_wpath_check (relpath) < 0)
      || ((a.flags & BFO_ATTR_CALLER) && (a.flags != BFO_ATTR_CALLER || kind != IMG_FILE))
      || (a.flags & ~(BFO_ATTR_MODE | BFO_ATTR_OWNER | BFO_ATTR_ATIME | BFO_ATTR_MTIME
                      | BFO_ATTR_CALLER | BFO_ATTR_REPLACE | BFO_ATTR_KEEP_DIR
                      | BFO_ATTR_MODE_PERMS | BFO_ATTR_NEW_SGID | BFO_ATTR_TAR_MODE))
      || ((a.flags & (BFO_ATTR_REPLACE | BFO_ATTR_TAR_MODE)) && kind != IMG_FILE)
      || ((a.flags & BFO_ATTR_TAR_MODE) && !(a.flags & BFO_ATTR_MODE))
      || ((a.flags & (BFO_ATTR_KEEP_DIR | BFO_ATTR_MODE_PERMS | BFO_ATTR_NEW_SGID))
          && kind != IMG_DIR)
      || ((kind == IMG_SYMLINK || kind == IMG_LINK) && (!target || !*target))
      || (kind == IMG_LINK && strlen (target) >= w->bs)
      || (kind == IMG_LINK && strcmp (target, ".") != 0 && bfo_wpath_check (target) < 0)
      || (kind == IMG_NODE && !S_ISCHR (node_mode) && !S_ISBLK (node_mode)
          && !S_ISFIFO (node_mode) && !S_ISSOCK (node_mode))
      || (kind == IMG_XATTR && (!target || !*target || strlen (target) > 255
                                || len > 65536 || (len && !data) || a.flags)))
    {
      if (sp)
        free (sp->segs);
      refuse (w, relpath, EINVAL, "path", user);
      return w->stop;
    }
  /* A symbolic link's target and its NUL must fit in one block (the
     kernel's ENAMETOOLONG).  */
  if (kind == IMG_SYMLINK && strlen (target) >= w->bs)
    {
      refuse (w, relpath, ENAMETOOLONG, "create", user);
      return w->stop;
    }
  uint64_t span = kind == IMG_FILE ? round_up (len, w->bs) : 0;
  bool alone = span > w->arena_cap;
  struct img_slot *sl = &w->slot[w->cur];
  bool ordered = kind != IMG_XATTR && !self;
  int ret;
  if ((alone || sl->arena_used + span > w->arena_cap
       || (ordered && batch_conflict (w, relpath)))
      && (ret = submit (w)) != 0)
    {
      if (sp)
        free (sp->segs);
      return ret;
    }
  sl = &w->slot[w->cur];
  struct img_entry *e = new_entry (sl);
  if (!e)
    {
      if (sp)
        free (sp->segs);
      return -ENOMEM;
    }
  if (sp)
    {
      e->segs = sp->segs;
      e->n_segs = sp->n_segs;
      e->sparse = true;
    }
  e->kind = kind;
  e->dir_target = kind == IMG_LINK && w->dir_target;
  if (kind == IMG_XATTR)
    {
      /* The entry of its path added last in this batch, if it is the last
         entry other than attributes.  */
      size_t k = sl->n;
      while (k && sl->e[k - 1].kind == IMG_XATTR)
        k--;
      if (k && strcmp (sl->e[k - 1].path, relpath) == 0)
        e->member = k;
    }
  e->path = strdup (relpath);
  if (kind == IMG_XATTR)
    {
      size_t nl = strlen (target) + 1;
      e->target = malloc (nl + len);
      if (e->target)
        {
          memcpy (e->target, target, nl);
          if (len)
            memcpy (e->target + nl, data, len);
        }
      data = NULL;
    }
  else
    e->target = target ? strdup (target) : NULL;
  if (!e->path || (target && !e->target))
    {
      free_entry (e);
      return -ENOMEM;
    }
  e->len = len;
  e->size = sp ? sp->size : len;
  e->bytes = sp ? sp->bytes : len;
  e->node_mode = node_mode;
  e->rdev = rdev;
  e->attrs = a;
  e->user = user;
  e->add_order = w->added++;
  if ((w->o.flags & BFO_WRITE_TAR_DIRS) && kind == IMG_DIR)
    tar_dirs_push (w, relpath, e->add_order);
  if (ordered && !alone && (ret = batch_note (w, kind, relpath, target)) != 0)
    return ret;
  if (alone)
    {
      /* Larger than a batch: a batch of its own, from the caller's buffer, which
         is written before we return.  */
      e->data = data;
      sl->n = 1;
      return drain (w);
    }
  if (kind == IMG_FILE)
    {
      e->data = sl->arena + sl->arena_used;
      e->padded = true;
      memcpy (sl->arena + sl->arena_used, data, len);
      memset (sl->arena + sl->arena_used + len, 0, span - len);
      sl->arena_used += span;
    }
  if (sl->n++ == 0)
    clock_gettime (CLOCK_MONOTONIC, &sl->first_add);
  uint64_t first = (uint64_t) sl->first_add.tv_sec * 1000 + sl->first_add.tv_nsec / 1000000;
  if (sl->n >= w->o.batch_files || sl->arena_used >= w->arena_cap
      || now_ms () - first >= w->o.batch_ms || idle_cut (w, sl))
    return submit (w);
  return 0;
}

int
bfo_ext4img_add (struct bfo_ext4img *w, int kind, const char *relpath, const char *target,
                 const void *data, size_t len, const struct bfo_write_attrs *attrs, void *user)
{
  /* A hard link's target named with a trailing '/' must be a directory (after
     symbolic links), as link(2) looks it up: not a directory is ENOTDIR.  */
  size_t tl = kind == IMG_LINK && target ? strlen (target) : 0;
  if (tl > 1 && target[tl - 1] == '/')
    {
      while (tl > 1 && target[tl - 1] == '/')
        tl--;
      char *t = strndup (target, tl);
      if (!t)
        return -ENOMEM;
      w->dir_target = true;
      int r = img_add (w, kind, relpath, t, data, len, 0, 0, attrs, user, NULL);
      w->dir_target = false;
      free (t);
      return r;
    }
  return img_add (w, kind, relpath, target, data, len, 0, 0, attrs, user, NULL);
}

int
bfo_ext4img_add_xattr (struct bfo_ext4img *w, const char *relpath, const char *name,
                       const void *value, size_t size, void *user)
{
  return img_add (w, IMG_XATTR, relpath, name, value, size, 0, 0, NULL, user, NULL);
}

int
bfo_ext4img_add_node (struct bfo_ext4img *w, const char *relpath, mode_t mode, dev_t rdev,
                      const struct bfo_write_attrs *attrs, void *user)
{
  return img_add (w, IMG_NODE, relpath, NULL, NULL, 0, mode, rdev, attrs, user, NULL);
}

/* The highest logical block an extent can map, plus one.  */
#define IMG_MAX_LBLKS ((uint64_t) 1 << 32)

int
bfo_ext4img_add_sparse (struct bfo_ext4img *w, const char *relpath, const void *data,
                        const struct bfo_range *ranges, size_t n_ranges, uint64_t size,
                        const struct bfo_write_attrs *attrs, void *user)
{
  if (w->stop)
    return w->stop;
  /* The ranges' blocks, merged where they touch or share a block.  */
  struct img_seg *segs = n_ranges ? malloc (n_ranges * sizeof *segs) : NULL;
  if (n_ranges && !segs)
    return -ENOMEM;
  size_t n = 0;
  uint64_t end = 0, bytes = 0, blocks = 0;
  bool bad = false;
  for (size_t i = 0; i < n_ranges && !bad; i++)
    {
      const struct bfo_range *r = &ranges[i];
      if (r->length == 0)
        continue;
      if (r->offset < end || r->offset > size || r->length > size - r->offset
          || (r->offset + r->length + w->bs - 1) / w->bs > IMG_MAX_LBLKS - 1)
        {
          bad = true;
          break;
        }
      end = r->offset + r->length;
      bytes += r->length;
      blk64_t b0 = r->offset / w->bs, b1 = (end + w->bs - 1) / w->bs;
      if (n && segs[n - 1].lblk + segs[n - 1].len >= b0)
        {
          blk64_t e1 = segs[n - 1].lblk + segs[n - 1].len;
          if (b1 > e1)
            {
              segs[n - 1].len += b1 - e1;
              blocks += b1 - e1;
            }
        }
      else
        {
          segs[n++] = (struct img_seg) { b0, b1 - b0 };
          blocks += b1 - b0;
        }
    }
  if (bad || blocks > SIZE_MAX / w->bs || (bytes && !data))
    {
      free (segs);
      refuse (w, relpath, bad ? EINVAL : EFBIG, "path", user);
      return w->stop;
    }
  /* The data blocks one after the other, zeros where no range is.  */
  size_t packed = blocks * w->bs;
  unsigned char *buf = packed ? calloc (1, packed) : NULL;
  if (packed && !buf)
    {
      free (segs);
      return -ENOMEM;
    }
  const unsigned char *src = data;
  size_t g = 0;
  uint64_t before = 0;          /* blocks of the segments before G */
  for (size_t i = 0; i < n_ranges; i++)
    {
      const struct bfo_range *r = &ranges[i];
      if (r->length == 0)
        continue;
      blk64_t b0 = r->offset / w->bs;
      while (b0 >= segs[g].lblk + segs[g].len)
        before += segs[g++].len;
      memcpy (buf + (before + b0 - segs[g].lblk) * w->bs + r->offset % w->bs, src, r->length);
      src += r->length;
    }
  struct img_sparse sp = { segs, n, size, bytes };
  int ret = img_add (w, IMG_FILE, relpath, NULL, buf, packed, 0, 0, attrs, user, &sp);
  free (buf);
  return ret;
}

void
bfo_ext4img_get_stats (const struct bfo_ext4img *w, struct bfo_write_stats *stats)
{
  *stats = w->stats;
}

static void
free_slots (struct bfo_ext4img *w)
{
  for (int k = 0; k < 2; k++)
    {
      struct img_slot *sl = &w->slot[k];
      for (size_t i = 0; i < sl->n; i++)
        free_entry (&sl->e[i]);
      free (sl->e);
      free (sl->order);
      free (sl->runs);
      if (sl->arena)
        munmap (sl->arena, w->arena_cap);
    }
}

int
bfo_ext4img_close (struct bfo_ext4img *w)
{
  if (!w)
    return 0;
  int ret = drain (w);
  if (w->threaded)
    {
      pthread_mutex_lock (&w->mu);
      w->quit = true;
      pthread_cond_broadcast (&w->cv);
      pthread_mutex_unlock (&w->mu);
      pthread_join (w->thread, NULL);
    }
  pthread_mutex_destroy (&w->mu);
  pthread_cond_destroy (&w->cv);
  /* The directories this writer made that outgrew a block, and those of the
     image that did, get the kernel's hashed index (see ext4dirindex.c); one
     that cannot keeps its blocks as they are (they are sound).  */
  if (!w->broken)
    {
      /* Read as dir_load reads a directory this writer made.  */
      int r = dir_release (w);
      bool ignoring = w->fs->flags & EXT2_FLAG_IGNORE_CSUM_ERRORS;
      w->fs->flags |= EXT2_FLAG_IGNORE_CSUM_ERRORS;
      /* (MADE_DIRS is not needed any more: it takes SMALL_DIRS in.)  */
      ext2_ino_t ino = 1, last = w->fs->super->s_inodes_count;
      while (ino <= last
             && ext2fs_find_first_set_inode_bitmap2 (w->small_dirs, ino, last, &ino) == 0)
        ext2fs_mark_inode_bitmap2 (w->made_dirs, ino++);
      if (r == 0)
        r = img_errno (bfo_dir_index (w->fs, w->made_dirs));
      if (!ignoring)
        w->fs->flags &= ~EXT2_FLAG_IGNORE_CSUM_ERRORS;
      if (r < 0)
        {
          w->broken = true;
          if (ret == 0)
            ret = r;
        }
    }
  /* Directory times last: linking their entries does not touch them, but
     making subdirectories and growing them changes what they hold.  First
     the time of the change for every directory whose entries changed, then
     the attributes asked for.  */
  struct timespec now = now_ts ();
  for (size_t i = 0; i < w->n_touched; i++)
    {
      if (w->touched_list[i] == 0)
        continue;
      struct ext2_inode_large *li;
      int r = read_full (w, w->touched_list[i], &li);
      /* (A directory removed since may have left its inode to a file.)  */
      if (r == 0 && (!LINUX_S_ISDIR (li->i_mode) || li->i_links_count == 0))
        free (li);
      else if (r == 0)
        {
          bool large = has_extra (w, li);
          set_time (large, &li->i_mtime, &li->i_mtime_extra, now);
          set_time (large, &li->i_ctime, &li->i_ctime_extra, now);
          r = write_full (w, w->touched_list[i], li);
          free (li);
        }
      if (r < 0 && ret == 0)
        ret = r;
    }
  if (w->o.flags & BFO_WRITE_TAR_DIRS)
    {
      /* tar's first pass at the end sets the directories above the last
         one marked after links, the last delayed first; its last pass that
         one and those below.  */
      size_t k = w->n_dpend;
      while (k && !w->dpend[k - 1].after_links)
        k--;
      for (size_t i = w->n_dpend; i-- > 0; )
        dfinal_add (w, w->dpend[i].seq, i < k ? IMG_LATE : IMG_END, false);
    }
  if (w->n_dfinal)
    qsort (w->dfinal, w->n_dfinal, sizeof *w->dfinal, by_dseq);
  /* The directories where tar replaces a placeholder still there by its
     link at the end, after its first pass.  */
  ext2_ino_t *ph_dirs = w->n_ph ? malloc (w->n_ph * sizeof *ph_dirs) : NULL;
  size_t n_ph_dirs = 0;
  for (size_t i = 0; ph_dirs && i < w->n_ph; i++)
    {
      ext2_ino_t ino;
      __u16 mode;
      if (lookup_name (w, w->ph[i].dir, w->ph[i].name, &ino, &mode) == 0 && ino == w->ph[i].ino)
        ph_dirs[n_ph_dirs++] = w->ph[i].dir;
    }
  if (n_ph_dirs)
    qsort (ph_dirs, n_ph_dirs, sizeof *ph_dirs, by_ino);
  struct img_dapply *ap = w->n_dirs ? malloc (w->n_dirs * sizeof *ap) : NULL;
  for (size_t i = 0; ap && i < w->n_dirs; i++)
    {
      const struct img_dfinal *f = tar_dirs_final (w, i);
      ap[i] = (struct img_dapply) { f ? f->order : SIZE_MAX, w->dirs[i].seq, i };
      if (f && f->skip)
        w->dirs[i].ino = 0;
    }
  if (ap)
    qsort (ap, w->n_dirs, sizeof *ap, by_apply);
  for (size_t n = 0; n < w->n_dirs; n++)
    {
      struct ext2_inode_large *li;
      size_t i = ap ? ap[n].i : n;     /* (without memory: as added) */
      if (w->dirs[i].ino == 0)
        continue;
      int r = read_full (w, w->dirs[i].ino, &li);
      if (r == 0 && (li->i_flags & GUARD_FL))
        {
          /* The kernel refuses tar's utime, chown and chmod of it (reported
             when it was found, see found_dir).  */
          free (li);
          continue;
        }
      if (r == 0)
        {
          struct bfo_write_attrs a = w->dirs[i].attrs;
          if (tar_dirs_later (w, i))
            a.flags &= ~BFO_ATTR_MTIME;
          if (tar_dirs_late (w, i))
            a.flags &= ~BFO_ATTR_NEW_SGID;   /* tar's chmod runs if the mode differs */
          else
            {
              if (w->dirs[i].has_early)
                a.mode = w->dirs[i].early_mode;
              if (n_ph_dirs && bsearch (&w->dirs[i].ino, ph_dirs, n_ph_dirs, sizeof *ph_dirs,
                                        by_ino))
                a.flags &= ~BFO_ATTR_MTIME;   /* its link comes later */
            }
          apply_attrs (w, li, &a, false);
          r = write_full (w, w->dirs[i].ino, li);
          free (li);
        }
      if (r < 0 && ret == 0)
        ret = r;
    }
  free (ap);
  free (ph_dirs);
  /* The quota files (quota feature) as the inodes now add up; if that
     fails, e2fsck has to recompute them.  */
  if (!w->broken)
    {
      int r = bfo_quota_update (w->fs);
      if (r < 0)
        {
          w->broken = true;
          if (ret == 0)
            ret = r;
        }
    }
  if (!w->broken)
    w->fs->super->s_state = w->orig_state;
  ext2fs_mark_super_dirty (w->fs);
  ext2fs_free_inode_bitmap (w->made_dirs);
  ext2fs_free_inode_bitmap (w->touched);
  ext2fs_free_inode_bitmap (w->loaded);
  free (w->rp);
  ext2fs_free_inode_bitmap (w->opaque);
  ext2fs_free_inode_bitmap (w->seen_dirs);
  ext2fs_free_inode_bitmap (w->small_dirs);
  free (w->touched_list);
  /* ext2fs_close syncs: everything written is durable when we return.  */
  int r = img_errno (ext2fs_close_free (&w->fs));
  if (r < 0 && ret == 0)
    ret = r;
  free_slots (w);
  free (w->dirs);
  free (w->pc_dir);
  free (w->xs_dir);
  for (size_t i = 0; i < w->n_dpend; i++)
    free (w->dpend[i].path);
  free (w->dpend);
  free (w->dp_slot);
  for (size_t i = 0; i < w->n_ph; i++)
    free (w->ph[i].name);
  free (w->ph);
  free (w->dfinal);
  free (w->fin.key);
  free (w->fin.val);
  free (w->da.key);
  free (w->da.val);
  free (w->groups);
  free (w->lt.key);
  free (w->lt.val);
  free (w->bounce);
  free (w->io);
  free_names (w);
  ps_clear (w);
  free (w->ps_key);
  free (w->ps_flag);
  free (w->db_block);
  close (w->fd);
  free (w);
  return ret;
}
