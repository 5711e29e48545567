/* bfo.h: the public interface of libbfo, batch-file operations for big trees of small files.
   The only header users include; every symbol is bfo_* / BFO_*, errors are -errno returns.  */

#ifndef BFO_H
#define BFO_H 1

#ifdef __cplusplus
extern "C" {
#endif

/* The version of the library actually linked, e.g. "0.1.0".  */
const char *bfo_version (void);

/* Features, as bits of the mask bfo_features returns.  */
enum bfo_feature
{
  BFO_FEATURE_IO_URING = 1u << 0,  /* this kernel accepts io_uring_setup */
  BFO_FEATURE_EXT4IMG  = 1u << 1,  /* the libext2fs image backend is built in */
};

/* Probe what this build and this kernel offer; a bitmask of enum bfo_feature.
   Never fails: a feature that cannot be probed is reported absent.  */
unsigned int bfo_features (void);

/* The short name of one feature bit ("io_uring", "ext4img"), or NULL.  */
const char *bfo_feature_name (unsigned int feature);

/* The version of the libext2fs library linked in, e.g. "1.47.0".  */
const char *bfo_ext2fs_version (void);

/* ------------------------------------------------------------------ batch read
   A batch reader takes regular files (one by one or as whole trees), reads the
   metadata of a batch together (statx in inode order, FIEMAP), sorts the files'
   extents by physical address, merges neighbours, reads them with O_DIRECT at a
   deep io_uring queue, and hands each file's data to a callback, in physical
   order.  Files that cannot take the fast path (no FIEMAP, inline, encoded,
   changing) are read the plain way, still within the batch.  */

#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/uio.h>

/* Flags of struct bfo_read_opts.  */
enum
{
  BFO_READ_NO_DIRECT = 1u << 0,  /* buffered reads (still batched, physical order) */
  BFO_READ_RAW       = 1u << 1,  /* read merged extents from the block device (root) */
  BFO_READ_NO_PREFETCH = 1u << 2, /* root on ext4: do not read ahead inode tables */
  BFO_READ_ATIME     = 1u << 3,  /* update access times as read(2) would (no O_NOATIME) */
  BFO_READ_SHARE_FDS = 1u << 4,  /* another reader runs beside: half the descriptors */
  BFO_READ_SKIP_CACHED = 1u << 5, /* files wholly in the page cache are not read:
                                    delivered with BFO_FILE_CACHED and no data */
  BFO_READ_MAP_INODES = 1u << 6, /* root on ext2/3/4: files added with their inode
                                    (bfo_reader_add_known) are placed by their
                                    inode in the inode table instead of being
                                    opened for FIEMAP; their data come as one
                                    range, holes read as zeros (for callers that
                                    do not keep holes) */
};

/* Tuning; a zero field takes the default (see BFO_DEFAULT_* in bfo-int.h).  */
struct bfo_read_opts
{
  unsigned int flags;          /* BFO_READ_* */
  unsigned int io_depth;       /* io_uring queue depth */
  unsigned int window_files;   /* files whose metadata is read and sorted together */
  unsigned int batch_files;    /* flush a batch at this many files ... */
  uint64_t batch_bytes;        /* ... or this many bytes of data ... */
  unsigned int batch_ms;       /* ... or when its first file waited this long */
  uint64_t max_io_bytes;       /* largest single read request */
  uint64_t large_file_bytes;   /* files above this are streamed in pieces */
  uint64_t raw_gap_bytes;      /* raw mode: read gaps up to this between extents */
};

/* A logical byte range of a file that holds data; what lies between is a hole.  */
struct bfo_range
{
  uint64_t offset;
  uint64_t length;
};

/* Flags of struct bfo_file.  */
enum
{
  BFO_FILE_FALLBACK = 1u << 0,  /* read the plain way (reason in fallback) */
  BFO_FILE_CHANGED  = 1u << 1,  /* changed during the batch; data was read again */
  BFO_FILE_CACHED   = 1u << 2,  /* wholly in the page cache (BFO_READ_SKIP_CACHED):
                                   not read, data NULL; the caller reads it */
  BFO_FILE_SHORT    = 1u << 3,  /* ended before st_size with its stat unchanged
                                   (sysfs, a stale network size): the pieces
                                   hold only the bytes it had, fewer than st_size */
  BFO_FILE_LONG     = 1u << 4,  /* reads go on past st_size with its stat
                                   unchanged (FUSE direct I/O, a stale size):
                                   the pieces hold st_size bytes, not all */
};

/* One piece of one file's data, as the callback sees it.  Small files come in
   one piece (offset 0, last set); large files in consecutive pieces.  */
struct bfo_file
{
  const char *path;            /* as added; for trees ROOT/relative/name */
  const struct stat *st;       /* its metadata at batch time */
  int error;                   /* 0, or the errno that stopped it (data NULL) */
  const char *error_op;        /* what failed: "open", "stat", "read" ... */
  uint64_t offset;             /* of this piece in the file */
  size_t len;                  /* bytes at data; holes read as zeros */
  const void *data;
  int last;                    /* this is the file's last piece */
  const struct bfo_range *ranges;  /* data ranges of the whole file, ascending */
  size_t n_ranges;             /* (holes are what is not covered) */
  unsigned int flags;          /* BFO_FILE_* */
  const char *fallback;        /* why it took the plain path, or NULL */
  void *user;                  /* as given to bfo_reader_add */
};

/* Called for every piece of every file, and once per failed file.  Return 0 to
   go on, or a negative errno to stop: the reader then returns that value.  */
typedef int (*bfo_read_cb) (const struct bfo_file *file, void *arg);

/* Counters of a reader's work, for --stats and tests.  */
struct bfo_read_stats
{
  uint64_t files, bytes, batches;
  uint64_t extents, requests, merged;     /* extents read; requests issued; extents merged away */
  uint64_t holes, unwritten;              /* hole / unwritten ranges never read */
  uint64_t fallback_no_fiemap, fallback_inline, fallback_encoded, fallback_unaligned,
           fallback_delalloc, fallback_changed, fallback_other;
  uint64_t raw_files, raw_gap_bytes;      /* raw mode: files read from the device; gap bytes read */
  uint64_t fallback_no_raw;               /* raw asked but the file system / user not eligible */
  uint64_t us_meta, us_reopen, us_read, us_deliver;  /* time in each phase (microseconds) */
  uint64_t prefetch_requests;             /* inode-table read-ahead requests (root, ext4) */
  uint64_t errors;
  uint64_t cached;                        /* files wholly in the page cache: read from there */
  uint64_t inode_mapped;                  /* files placed by their inode (BFO_READ_MAP_INODES) */
  uint64_t pread_threads;                 /* no io_uring: threads that made the reads */
  uint64_t size_not_end;                  /* reads ended elsewhere than the size,
                                             stat unchanged (BFO_FILE_SHORT, _LONG) */
  uint64_t cache_unknown;                 /* files the kernel would not say were cached
                                             (another user's): read buffered */
};

struct bfo_reader;

/* Create a reader; OPTS may be NULL.  Returns 0 or -errno.  */
int bfo_reader_open (struct bfo_reader **reader, const struct bfo_read_opts *opts,
                     bfo_read_cb cb, void *arg);
/* Queue one regular file; may run a batch.  Returns 0 or the callback's stop value.  */
int bfo_reader_add (struct bfo_reader *reader, const char *path, void *user);
/* The same for PATH relative to the directory DIRFD (as openat takes it), which
   must stay open until the file has been delivered; the callback sees PATH.  */
int bfo_reader_add_at (struct bfo_reader *reader, int dirfd, const char *path, void *user);
/* The same for a file the caller has just stat'ed: DEV and INO are its st_dev
   and st_ino (O_NOFOLLOW, as for a walked file; with BFO_READ_MAP_INODES, what
   places it).  Phase 2 reads whatever file is at PATH then; one with another
   inode number comes with BFO_FILE_CHANGED.  */
int bfo_reader_add_known (struct bfo_reader *reader, int dirfd, const char *path, dev_t dev,
                          uint64_t ino, void *user);
/* Queue every regular file under ROOT (symlinks not followed, other types skipped);
   errors on directories come to the callback with error set.  */
int bfo_reader_add_tree (struct bfo_reader *reader, const char *root);
/* Read the metadata of everything queued (open, fstat, FIEMAP) and plan its
   reads, without reading data: the next bfo_reader_flush then only reads and
   delivers.  So one thread can map a window while another reader reads the
   previous one.  Adding a file to a mapped reader flushes it first.  Returns 0
   or a negative errno (the flush then returns it too).  */
int bfo_reader_map (struct bfo_reader *reader);
/* 1 when all of the regular file FD's data are in the page cache now, 0 when
   not, -EPERM when the kernel will not tell (a file the caller neither owns
   nor may write: cachestat(2) and mincore(2) answer only for those), another
   -errno when FD cannot be stat'ed.  */
int bfo_file_cached (int fd);
/* Read and deliver everything queued.  */
int bfo_reader_flush (struct bfo_reader *reader);
void bfo_reader_get_stats (const struct bfo_reader *reader, struct bfo_read_stats *stats);
/* Flush, then free.  Returns what the flush returned.  */
int bfo_reader_close (struct bfo_reader *reader);

/* The simple call: read N paths as batches, deliver through CB.  */
int bfo_batchread (const char *const *paths, size_t n, const struct bfo_read_opts *opts,
                   bfo_read_cb cb, void *arg);

/* What a batch read of the queued files would do, without reading data.  */
struct bfo_plan
{
  uint64_t files, bytes, extents, requests, merged;
  uint64_t request_bytes;       /* total bytes the requests would read */
  uint64_t sequential;          /* requests starting where the previous one ended */
  struct bfo_read_stats why;    /* fallback counters */
};
int bfo_plan_tree (const char *const *roots, size_t n, const struct bfo_read_opts *opts,
                   struct bfo_plan *plan);

/* Metadata read-ahead for a program's own walk of a tree: before it stats a
   directory's entries and descends into its subdirectories one by one, the
   inode-table blocks of all the entries and the blocks of all the
   subdirectories are asked for at once, in physical order, merged into few
   reads.  On a disk that must seek, the walk then finds them cached instead of
   jumping back and forth between them and whatever else is being read.  Root
   only (the reads go through the block device's cache, where ext4 keeps its
   metadata), ext2/3/4 only; it reads, never writes.  */
struct bfo_meta_ahead;

/* For the file system holding PATH (relative to DIRFD, or AT_FDCWD).  Returns
   0, -EPERM (not root), -EOPNOTSUPP (not ext2/3/4) or -errno.  */
int bfo_meta_ahead_open (int dirfd, const char *path, struct bfo_meta_ahead **ma);
/* An entry of a directory listing, as readdir gave it.  */
struct bfo_meta_entry
{
  char *name;
  uint64_t ino;                 /* d_ino */
  unsigned char type;           /* d_type: DT_DIR entries are subdirectories */
};
/* Directory DIRFD was listed: ES[0..N) are its entries.  Only a hint;
   returns the read-ahead requests it issued.  MA may be NULL.  */
size_t bfo_meta_ahead_dir (struct bfo_meta_ahead *ma, int dirfd,
                           const struct bfo_meta_entry *es, size_t n);
void bfo_meta_ahead_close (struct bfo_meta_ahead *ma);

/* Is the tree at PATH (relative to DIRFD; "." for DIRFD itself) small: at most
   *ENTRIES entries (PATH itself if it is not a directory, else everything
   below it) in at most *DIRS directories, each entry's type known from its
   directory?  The budgets are decreased by what it has, so that several
   trees can share them.  Reads at most *DIRS directories and stops as soon
   as a budget runs out (then 0); 1 if small; -errno if PATH cannot be read.
   For a program to leave a tree too small to gain from batching to its own
   loop: starting readers and threads costs about a millisecond.  */
int bfo_tree_small (int dirfd, const char *path, unsigned int *entries, unsigned int *dirs);

/* ----------------------------------------------------------------- batch write
   A batch writer takes files (a path relative to one destination directory, the
   data, attributes) and writes them in batches.  Per batch the ORDER_LIST
   (targets, stem offsets, lengths, attributes) first goes to a journal file in
   the destination, fsync'd; then, with the reflink backend, the batch's data is
   written as one stem file (fallocate'd, O_DIRECT through io_uring, each file
   block-aligned), fsync'd and marked durable in the journal, and every target is
   cloned from its range of the stem into a temporary file beside it, whose
   attributes are set before it is renamed over the target.  With the ordered
   backend a batch is direct: its journal also holds each file's CRC32C, and
   once it is durable each new target is created at its name, written, given
   its attributes and closed, in target order (a target that fails is removed);
   a name already taken gets a temporary file that is renamed over it after the
   batch's sync (also every file of a batch that names a path twice).  The file
   system is synced once per batch.  Stem and journal are removed when the batch
   is done (synced); after a crash bfo_recover (also run by the next writer in
   that destination) completes or removes what the journal names, keeping a
   direct batch's target only if its size and CRC32C are the journal's: no
   target is left claiming a size or contents it does not have, and an existing
   target is either the old file or the new one.  Helper files are named .bfo-journal.*, .bfo-jtmp.*,
   .bfo-stem.*, .bfo-probe.* (destination directory) and .bfo-tmp.* (beside
   their target).  */

#include <sys/types.h>
#include <time.h>

/* How a stem range becomes a file's data.  */
enum bfo_write_backend
{
  BFO_BACKEND_AUTO    = 0,  /* reflink where a test clone works, except on Btrfs
                               (its stem's extents would keep deleted files'
                               space), else ordered */
  BFO_BACKEND_REFLINK = 1,  /* stem + FICLONERANGE (XFS, Btrfs, ...) */
  BFO_BACKEND_ORDERED = 2,  /* no stem: temp files written in target order, one sync */
  BFO_BACKEND_EXT4IMG = 3,  /* unmounted ext4 image or device, through libext2fs
                               (bfo_writer_open_image only) */
};

/* Flags of struct bfo_write_opts.  */
enum
{
  BFO_WRITE_NO_DIRECT  = 1u << 0,  /* write the stem buffered instead of O_DIRECT */
  BFO_WRITE_MKDIRS     = 1u << 1,  /* create missing parent directories (mode 0755 & ~umask);
                                      without it a missing parent is ENOENT for that file */
  BFO_WRITE_NO_RECOVER = 1u << 2,  /* do not recover stale journals at open */
  BFO_WRITE_ORDERED_DIRECT = 1u << 3,  /* ordered backend: fallocate + O_DIRECT instead of
                                          buffered writes (measured slower; for benchmarks) */
  BFO_WRITE_OVERWRITE  = 1u << 4,  /* image backend: a regular file's new data go into the
                                      regular file already at its name, in its inode (as
                                      tar --overwrite opens it with O_TRUNC: hard links keep
                                      sharing it); a directory there is EISDIR, a fifo or
                                      socket ENXIO.  Without it the name gets a new inode */
  BFO_WRITE_TAR_DIRS   = 1u << 5,  /* image backend: a directory's attributes are set, as
                                      tar -x sets them (its delayed set_stat), when an entry
                                      not under it is added; a change to its entries after
                                      that gives it the time of the change, as the kernel
                                      gives it in tar -x.  Without it they win at close */
  BFO_WRITE_TAR_DELAY  = 1u << 6,  /* with BFO_WRITE_TAR_DIRS: tar
                                      --delay-directory-restore, which sets them all
                                      at the end */
};

struct bfo_layout;              /* see "layout policies" below */

/* Tuning; a zero field takes the default (see BFO_WRITE_DEFAULT_* in bfo-write-int.h).  */
struct bfo_write_opts
{
  int backend;                 /* enum bfo_write_backend */
  unsigned int flags;          /* BFO_WRITE_* */
  unsigned int batch_files;    /* run a batch at this many files ... */
  uint64_t batch_bytes;        /* ... or when the next file's data would pass this ... */
  unsigned int batch_ms;       /* ... or when its first file waited this long (checked at add) */
  unsigned int io_depth;       /* io_uring queue depth of the stem writes */
  const struct bfo_layout *layout;  /* placement order of a batch's files (NULL: walk);
                                       must outlive the writer */
};

/* Which attributes to apply (flags of struct bfo_write_attrs).  Without
   BFO_ATTR_MODE a file is created with mode 0666 as open(2) does (umask and
   default ACLs apply); with it the file gets exactly MODE (07777 bits, set after
   the owner).  Owner and times are left as creation makes them unless asked.  */
enum
{
  BFO_ATTR_MODE   = 1u << 0,
  BFO_ATTR_OWNER  = 1u << 1,   /* uid/gid; (uid_t) -1 or (gid_t) -1 leaves that one */
  BFO_ATTR_ATIME  = 1u << 2,
  BFO_ATTR_MTIME  = 1u << 3,
  BFO_ATTR_CALLER = 1u << 4,   /* the caller sets all attributes itself once the file
                                  is in place (from the callback); until then it has mode
                                  0600.  No other bit may be set with this one */
  BFO_ATTR_REPLACE = 1u << 5,  /* image backend with BFO_WRITE_OVERWRITE: an existing
                                  file at the name is replaced by a new one, as
                                  without that flag, not rewritten in place (tar
                                  --overwrite --xattrs does so for a member with
                                  extended attributes).  Other backends ignore it */
  BFO_ATTR_KEEP_DIR = 1u << 6,  /* image backend, bfo_writer_mkdir: a directory already
                                  at the name keeps its owner and gets its own mode
                                  masked by KEEP_MASK (tar --no-overwrite-dir); MODE
                                  is for a new one.  If the kernel would refuse that
                                  chmod (an immutable or append-only directory), the
                                  entry fails EPERM, error_op "chmod", FOUND_MODE set.
                                  Other backends refuse it (EINVAL) */
  BFO_ATTR_MODE_PERMS = 1u << 7,  /* image backend, bfo_writer_mkdir, with BFO_ATTR_MODE:
                                  only MODE's permission bits (0777) are set; the
                                  set-user-ID, set-group-ID and sticky bits stay as
                                  found or as creation made them (tar -x
                                  --no-same-permissions, whose chmod keeps the bits
                                  it does not mask).  Other backends refuse it */
  BFO_ATTR_NEW_SGID = 1u << 8,  /* image backend, bfo_writer_mkdir, with BFO_ATTR_MODE:
                                  a new directory keeps the set-group-ID bit its
                                  parent gives it (tar -x, when its mkdir made the
                                  mode and no chmod followed).  Other backends
                                  refuse it */
  BFO_ATTR_TAR_MODE = 1u << 9,  /* image backend with BFO_WRITE_OVERWRITE, with
                                  BFO_ATTR_MODE: a regular file rewritten in place
                                  gets the mode tar -x --overwrite leaves: from the
                                  mode found, less the set-id bits the kernel clears
                                  on the truncation (not root) and on the chown
                                  (BFO_ATTR_OWNER), chmod'ed to MODE under KEEP_MASK
                                  (tar's mask: 07777 or 0777) only where tar's idea
                                  of the mode differs from it, so cleared bits may
                                  stay cleared.  A new file gets MODE.  Other
                                  backends refuse it */
};

struct bfo_write_attrs
{
  unsigned int flags;          /* BFO_ATTR_* */
  mode_t mode;
  uid_t uid;
  gid_t gid;
  struct timespec atime, mtime;
  mode_t keep_mask;            /* BFO_ATTR_KEEP_DIR, BFO_ATTR_TAR_MODE */
  mode_t keep_safe;            /* BFO_ATTR_KEEP_DIR: bits tar's chmod to a safe mode
                                  adds (not root: u+wx).  A directory found that
                                  holds those of them KEEP_MASK keeps gets its rwx
                                  bits and these (tar's set_stat runs no chmod) */
};

/* What the callback learns about one file: it is in place (error 0), or it
   failed and nothing was left at its name by this writer (an existing file
   there stays as it was).  */
struct bfo_written
{
  const char *path;            /* relative, as added */
  int error;                   /* 0 or an errno */
  const char *error_op;        /* what failed: "path", "create", "write", "clone", "attrs",
                                  "sync", "rename", "journal", "stem" */
  void *user;                  /* as given to bfo_writer_add */
  /* Image writers: a directory on the way to PATH that could not be made
     (the first components of PATH, where tar -x says "Cannot mkdir"), and
     why; else NULL.  */
  const char *interdir;
  int interdir_error;
  /* Image writers, bfo_writer_mkdir of a name where something was kept (a
     directory, or what could not be removed): its mode (with the type bits),
     and EPERM in ATTRS_ERROR if the attributes asked for were left alone
     because the kernel refuses to change them (immutable or append-only).  */
  mode_t found_mode;
  int attrs_error;
};

/* Called once per added file, always in the caller's thread: for a batch's
   files (in path order) when the batch is done, that is from the add, flush or
   close that runs the next batch or waits for it (a batch syncs and renames
   while the next one is filled), or from bfo_writer_add for a path or
   attributes it refuses (EINVAL).  Return 0 to go on or a negative errno to
   stop: the batches in progress are still finished (and reported to no one),
   later adds and the flush/close return that value.  */
typedef int (*bfo_write_cb) (const struct bfo_written *file, void *arg);

/* Counters of a writer's work, for --stats and tests.  */
struct bfo_write_stats
{
  uint64_t files, bytes, batches, errors;
  uint64_t stem_bytes, stem_writes;   /* bytes of stems (padding included); write requests */
  uint64_t stem_buffered;             /* stems written buffered (O_DIRECT refused or off) */
  uint64_t clones;                    /* FICLONERANGE calls */
  uint64_t ordered_files;             /* files written by the ordered path */
  uint64_t stem_fallbacks;            /* reflink batches written ordered: the stem did not fit */
  uint64_t syncs;                     /* syncfs / fsync of a batch's data */
  uint64_t journals, recovered;       /* journals written; stale journals recovered at open */
  uint64_t image_writes;              /* ext4img: data write requests to the image */
  uint64_t image_extents;             /* ext4img: data runs mapped into files */
  uint64_t image_dirs, image_symlinks, image_links;  /* ext4img: made by the writer */
  uint64_t ag_splits;                 /* XFS: batches filled by two threads in disjoint AGs */
};

struct bfo_writer;

/* Create a writer into the existing directory DST_DIR; OPTS may be NULL.  Recovers
   stale journals in DST_DIR (their process is gone) unless told not to, probes the
   backend, and checks that DST_DIR takes new files.  Returns 0 or -errno (-EROFS,
   -EACCES...; -EOPNOTSUPP: reflink asked for where cloning does not work).
   Parent directories are resolved beneath DST_DIR: a '..' or symlink leading
   outside it fails that file with EXDEV.  A batch runs when it reaches
   batch_files or batch_bytes, or at the first add after batch_ms (there is no
   timer thread: call bfo_writer_flush when adds pause).  Files are durable once
   bfo_writer_close returned 0 (it ends with one syncfs).  */
int bfo_writer_open (struct bfo_writer **writer, const char *dst_dir,
                     const struct bfo_write_opts *opts, bfo_write_cb cb, void *arg);
/* Queue one file: RELPATH under the destination (no leading '/', no empty, '.' or
   '..' components, no name starting with a helper prefix: such a file fails with
   EINVAL), LEN bytes at DATA (copied or written before this returns: the caller
   may reuse the buffer at once), ATTRS (may be NULL: see BFO_ATTR_*).  May run a
   batch.  Returns 0, the callback's stop value, or -errno (-ENOMEM).  */
int bfo_writer_add (struct bfo_writer *writer, const char *relpath, const void *data,
                    size_t len, const struct bfo_write_attrs *attrs, void *user);
/* Write everything queued, wait until it is done and report it.  */
int bfo_writer_flush (struct bfo_writer *writer);
/* The backend in use: BFO_BACKEND_REFLINK, BFO_BACKEND_ORDERED or BFO_BACKEND_EXT4IMG.  */
int bfo_writer_backend (const struct bfo_writer *writer);
void bfo_writer_get_stats (const struct bfo_writer *writer, struct bfo_write_stats *stats);
/* Flush, then free.  Returns what the flush returned.  */
int bfo_writer_close (struct bfo_writer *writer);
/* "auto", "reflink", "ordered", "ext4img", or NULL.  */
const char *bfo_backend_name (int backend);

/* ---------------------------------------------------------- ext4 image backend
   The writer can also fill an *unmounted* ext4 file system, an image file or a
   block device, through libext2fs: no kernel mount, no journal file, no stem.
   Per batch the files' blocks are reserved in runs of free space (one run after
   the other, so neighbours are neighbours on disk), the data are written with
   large sequential writes and synced, and only then are inodes, extent trees and
   directory entries made; bitmaps, group descriptors and superblock are written
   once per batch.  While a writer has the volume open it is marked "not cleanly
   unmounted": a crash leaves it for a full e2fsck (see libbfo(3) for what that
   finds).  A file that fails (ENOSPC...) leaves no inode, entry or block behind.
   An existing non-directory at a target's name is replaced; a directory there
   fails that file with EISDIR.  Symlinks inside the image are not followed.  */

/* Open a writer into directory DIR (absolute inside the file system, "/" for its
   root; created with BFO_WRITE_MKDIRS) of the ext4 file system on IMAGE, a
   regular file or a block device.  Returns 0 or -errno: -EBUSY (IMAGE is
   mounted, attached to a loop device, or open in another writer), -EPERM (a
   block device and not root), -EMEDIUMTYPE (no ext2/3/4 superblock), -EOPNOTSUPP
   (no extents feature, bigalloc, or unknown features), -EUCLEAN (needs e2fsck
   or journal recovery), -ENOENT / -ENOTDIR (DIR), -EACCES...  */
int bfo_writer_open_image (struct bfo_writer **writer, const char *image, const char *dir,
                           const struct bfo_write_opts *opts, bfo_write_cb cb, void *arg);
/* The same checks without writing anything: 0 if a writer could open IMAGE:DIR.  */
int bfo_image_check (const char *image, const char *dir);

/* Image writers only (others return -EOPNOTSUPP), queued like bfo_writer_add and
   reported through the callback.  A directory RELPATH (existing or made now; "."
   is the destination itself) gets ATTRS when the writer closes, after its entries.
   A symlink RELPATH -> TARGET (at most a block long) gets owner and times from
   ATTRS.  A hard link RELPATH to EXISTING (a relative path of a non-directory
   added earlier, in this batch or before, or already in the image; as
   link(2) fails: a directory or "." EPERM, and with a trailing
   '/' ENOTDIR unless a directory after symbolic links).  A device,
   fifo or socket RELPATH: MODE's file type (S_IFCHR, S_IFBLK, S_IFIFO, S_IFSOCK;
   -EINVAL otherwise), RDEV for a device, permissions, owner and times from
   ATTRS; made whoever the caller is, as mke2fs -d does.  Each replaces a
   non-directory at its name.  An extended attribute NAME (namespace included,
   as "user.x"; at most 255 bytes) = VALUE (SIZE bytes, at most 64 KiB) of
   RELPATH (added before, in this batch or earlier, or already in the image;
   "." is the destination), set after the batch's entries are made, replacing
   one of that name; POSIX ACLs (system.posix_acl_*) in the kernel's format,
   an access ACL also setting the permission bits and not stored when it says
   no more than they do, as the kernel's setxattr(2).  A regular file with
   holes (bfo_writer_add_sparse): SIZE bytes long, data only in RANGES
   (ascending, not overlapping, within SIZE), whose N_RANGES lengths of bytes
   follow each other at DATA; every block a range touches is allocated (zeros
   where the range does not reach), the others are holes, as writing each
   range at its offset into an empty file of SIZE bytes makes them.  */
int bfo_writer_mkdir (struct bfo_writer *writer, const char *relpath,
                      const struct bfo_write_attrs *attrs, void *user);
int bfo_writer_symlink (struct bfo_writer *writer, const char *relpath, const char *target,
                        const struct bfo_write_attrs *attrs, void *user);
int bfo_writer_link (struct bfo_writer *writer, const char *relpath, const char *existing,
                     void *user);
int bfo_writer_mknod (struct bfo_writer *writer, const char *relpath, mode_t mode, dev_t rdev,
                      const struct bfo_write_attrs *attrs, void *user);
int bfo_writer_setxattr (struct bfo_writer *writer, const char *relpath, const char *name,
                         const void *value, size_t size, void *user);
int bfo_writer_add_sparse (struct bfo_writer *writer, const char *relpath, const void *data,
                           const struct bfo_range *ranges, size_t n_ranges, uint64_t size,
                           const struct bfo_write_attrs *attrs, void *user);

/* The simple call: write N files (BUFS[i], LENS[i] bytes, at PATHS[i] relative to
   DST) as batches, with default attributes, reporting through CB.  */
int bfo_batchwrite (const void *const *bufs, const size_t *lens, const char *const *paths,
                    size_t n, const char *dst, const struct bfo_write_opts *opts,
                    bfo_write_cb cb, void *arg);

/* What recovery did with one file of an interrupted batch.  */
enum bfo_fate
{
  BFO_FATE_COMPLETED = 0,      /* written from the durable stem now */
  BFO_FATE_WAS_COMPLETE,       /* already in place before the crash */
  BFO_FATE_REMOVED,            /* its data was not durable: partial temp file removed,
                                  the target is absent (or the file that was there before) */
  BFO_FATE_FAILED,             /* completing it failed (error) */
};

struct bfo_recovered
{
  const char *journal;         /* journal file name in the directory */
  const char *path;            /* target, relative to the directory; NULL for a
                                  journal-level report (error set) */
  enum bfo_fate fate;
  int error;                   /* 0 or an errno */
};

typedef int (*bfo_recover_cb) (const struct bfo_recovered *r, void *arg);

enum
{
  BFO_RECOVER_LIVE = 1u << 0,  /* also journals whose writer process still runs */
};

/* Find the journals in DIR (that directory only: stems and journals are always
   written there, not below), and for each: validate it; complete every file
   from the stem if the journal says the stem is durable, else remove the
   batch's temporary files; then remove stem and journal.  Reports each file's
   fate through CB (may be NULL).  A journal that fails validation is reported
   (-EBADMSG checksum, -ENOTSUP version) and left in place.  Returns 0 when
   everything was handled, -EIO when some journal or file could not be, another
   -errno when DIR cannot be read, or the callback's stop value.  A journal
   whose writer still runs is reported (EBUSY) and left alone: its writer
   holds a lock on it (flock), which tells in any pid namespace (containers
   sharing a volume), and where there are no locks, its pid still runs.  */
int bfo_recover (const char *dir, unsigned int flags, bfo_recover_cb cb, void *arg);
/* "completed", "was complete", "removed", "failed".  */
const char *bfo_fate_name (enum bfo_fate fate);

/* ---------------------------------------------------------- layout policies
   Which files of a batch end up next to each other on disk: the writer places a
   batch's data (stem, ordered writes, image blocks) in the order a layout gives.
     walk   the order files were added (the tree's or the archive's order);
     dir    each directory's files together, directories in first-seen order;
     refs   a file followed by the files it references: html href/src, C/C++
            #include "...", Makefile sources (see libbfo(3) for the rules);
     trace=FILE  frequently co-accessed sets mined from an access trace with
            Apriori, each set together, sets in first-access order.  */

enum bfo_layout_policy
{
  BFO_LAYOUT_WALK = 0,
  BFO_LAYOUT_DIR,
  BFO_LAYOUT_REFS,
  BFO_LAYOUT_TRACE,
};

/* Tuning of trace=FILE; a zero field takes the default.  */
struct bfo_layout_opts
{
  double trace_support;        /* a set is frequent in at least this fraction of a mining
                                  batch's transactions (and in 2); default 0.05 */
  unsigned int trace_batch_refs;  /* references mined together; default 50000 */
  unsigned int trace_window;   /* references per transaction where the trace marks no
                                  boundaries; default 16 */
  const char *trace_root;      /* trace paths are relative to this directory (exact
                                  match); NULL: a trace path matches the batch path
                                  that is its longest suffix on '/' boundaries */
};

/* Parse SPEC ("walk", "dir", "refs", "trace=FILE"); for a trace, read and mine
   FILE now.  Returns 0 or -errno: -EINVAL (unknown policy, bad option), errors
   opening or reading FILE.  */
int bfo_layout_new (struct bfo_layout **layout, const char *spec,
                    const struct bfo_layout_opts *opts);
void bfo_layout_free (struct bfo_layout *layout);
int bfo_layout_policy (const struct bfo_layout *layout);
/* "walk", "dir", "refs", "trace", or NULL.  */
const char *bfo_layout_policy_name (int policy);
/* A --trace-support argument: a percentage PCT, above 0 and at most 100, into
   *FRACTION (PCT / 100, for trace_support).  Returns 0 or -EINVAL.  */
int bfo_layout_parse_support (const char *pct, double *fraction);

/* What a mined trace held, for bfo plan.  */
struct bfo_layout_trace_info
{
  const char *format;          /* "paths", "strace", "access-log" */
  uint64_t references, transactions, mining_batches, frequent_sets;
};
int bfo_layout_trace_info (const struct bfo_layout *layout, struct bfo_layout_trace_info *info);

/* One file of a batch, in add order.  DATA (LEN bytes) is read by refs only.  */
struct bfo_layout_file
{
  const char *path;            /* relative to the destination */
  const void *data;
  uint64_t len;
};

/* A run of the placement order that belongs together, and why.  */
struct bfo_layout_group
{
  size_t first, count;         /* ORDER[first .. first+count) */
  char *why;
};

/* Place the N FILES: ORDER (N entries) receives their indexes in placement order.
   The same path added twice keeps its adds together in add order (the later one
   wins).  With GROUPS non-NULL, *GROUPS (malloc'd; free with
   bfo_layout_groups_free) and *N_GROUPS describe the runs of ORDER.  Returns 0 or
   -ENOMEM.  */
int bfo_layout_order (const struct bfo_layout *layout, const struct bfo_layout_file *files,
                      size_t n, size_t *order, struct bfo_layout_group **groups,
                      size_t *n_groups);
void bfo_layout_groups_free (struct bfo_layout_group *groups, size_t n_groups);

/* ------------------------------------------------------------ write-behind */

/* A program that writes many files through plain calls (cp, tar -x) leaves
   their data in the page cache until a sync.  A write-behind helper has the
   file system write it back while the program goes on: every EVERY bytes
   noted (data plus BFO_WRITE_BEHIND_FILE_BYTES per file, for its inode and
   directory entry), a helper thread calls syncfs(2) on the file system of the
   file just noted, unless the one before is still under way.  It writes back
   other programs' dirty data on that file system too, as sync -f would.  */
struct bfo_write_behind;

#define BFO_WRITE_BEHIND_FILE_BYTES 4096u
/* The size bfocp and bfotar -x use unless told otherwise (lib/writebehind.c
   says how it was measured).  */
#define BFO_WRITE_BEHIND_DEFAULT ((uint64_t) 32 << 20)

struct bfo_write_behind_stats
{
  uint64_t every;               /* bytes between write-backs */
  uint64_t writebacks;          /* syncfs calls made */
  uint64_t failed;              /* of them, failed */
  uint64_t us;                  /* time they took, in microseconds */
  uint64_t skipped;             /* not made: BFO_WRITE_BEHIND_AUTO, a file system where it does not pay */
  uint64_t trimmed;             /* files given back their blocks past the end (bfo_write_behind_trim) */
  int error;                    /* the errno of the first failed write-back (not of
                                   a refused syncfs: EPERM, ENOSYS), else 0: some
                                   data written may not be on the disk.  The caller
                                   must report it: the user's sync no longer does */
};

/* Only on file systems where write-behind measured better: not on Btrfs, where
   each syncfs commits a transaction between the files' data and spreads them
   (a third more simulated disk time for about 3 % less wall time).  */
#define BFO_WRITE_BEHIND_AUTO 1u

/* Start a helper (a thread).  FLAGS: 0 or BFO_WRITE_BEHIND_AUTO.  Returns 0,
   -EINVAL (EVERY is 0, unknown flags) or -errno.  */
int bfo_write_behind_new (struct bfo_write_behind **wb, uint64_t every, unsigned int flags);
/* BYTES were written into FD (still open).  From one thread at a time; WB may
   be NULL (nothing happens).  A write-back that falls due starts at the
   noting thread's next call (note or mark), once the caller has closed FD,
   or at none if there is none: a file written back before the close of its
   last writable descriptor keeps XFS's preallocation past its end.  */
void bfo_write_behind_note (struct bfo_write_behind *wb, int fd, uint64_t bytes);
/* For a file about to be written by the noting thread: a mark for
   bfo_write_behind_trim.  Also starts a write-back due (as note does).  */
uint64_t bfo_write_behind_mark (struct bfo_write_behind *wb);
/* FD (open for writing, SIZE bytes long now) was written since MARK was taken
   and is not yet closed.  If a write-back ran meanwhile and FD is on XFS with
   blocks past its end, and the file was not made after WB started (it was
   opened with O_TRUNC over an older file), they are given back (a hole punched past the end:
   size and data unchanged, the file's times are, so set them after).
   Returns 1 if it did, 0 if there was nothing to do, -errno if the punch
   failed (the blocks then go at XFS's background trim).  */
int bfo_write_behind_trim (struct bfo_write_behind *wb, int fd, uint64_t size, uint64_t mark);
/* Wait for the write-back under way, if any, and free WB (may be NULL); STATS
   (may be NULL) receives what it did.  */
void bfo_write_behind_free (struct bfo_write_behind *wb, struct bfo_write_behind_stats *stats);

/* ------------------------------------------------------------ held data */

/* Buffers for file data a program holds between reading and writing them,
   carved in order from slabs of BFO_POOL_SLAB bytes that are kept mapped for
   reuse once all their buffers are freed (lib/pool.c says what it saved).
   Any thread may allocate or free.  */
struct bfo_pool;

#define BFO_POOL_SLAB ((size_t) 2 << 20)
/* Larger buffers are plain posix_memalign ones.  */
#define BFO_POOL_MAX (BFO_POOL_SLAB / 8)

struct bfo_pool_stats
{
  uint64_t buffers;             /* buffers carved from slabs */
  uint64_t large;               /* buffers allocated on their own */
  uint64_t mapped, reused;      /* slabs mapped, and taken again from the free list */
  uint64_t unmapped;            /* slabs unmapped when the free list was full */
};

/* KEEP: bytes of empty slabs kept for reuse.  Returns 0 or -ENOMEM.  */
int bfo_pool_new (struct bfo_pool **pool, uint64_t keep);
/* LEN bytes, on a 4096-byte boundary when LEN is at least 4096, else on 16
   bytes; NULL when out of memory.  */
void *bfo_pool_alloc (struct bfo_pool *pool, size_t len);
/* Free BUF (may be NULL), allocated with length LEN.  */
void bfo_pool_free (struct bfo_pool *pool, void *buf, size_t len);
/* Free POOL (may be NULL) once every buffer is freed; STATS (may be NULL)
   receives its counts.  */
void bfo_pool_destroy (struct bfo_pool *pool, struct bfo_pool_stats *stats);

/* The memory this process may use: the machine's physical memory, or less
   where a memory cgroup it is in (v2 memory.max and memory.high, v1
   memory.limit_in_bytes, its own or an ancestor's: a container's limit) says
   so, or the address space and data segment limits (ulimit -v, ulimit -d)
   when lower.  For sizing batches: bfocp and bfotar take smaller ones under
   a small limit, where the defaults would have the kernel kill them.  */
uint64_t bfo_memory_limit (void);
/* Nonzero when the address space (or data segment) limit is so small that
   batching should not run at all: below BFO_MIN_ADDRESS_SPACE, where the
   batches' threads (their stacks), rings and buffers would leave the
   program too little (ulimit -v 50000: GNU cp -a copied a tree, bfocp said
   "memory exhausted").  */
#define BFO_MIN_ADDRESS_SPACE ((uint64_t) 256 << 20)
int bfo_memory_scarce (void);

/* ------------------------------------------------------------ free space */

/* A program that makes names ahead of the data it has queued (bfotar -x,
   bfocp -r) must not let them take the space the data need: on a file system
   that fills up it must leave what GNU tar and cp leave, who write each file
   before they make the next name (lib/space.c).  Zero-initialized; one per
   run, used from one thread.  */
struct bfo_space
{
  uint64_t checks;              /* statfs results given (bfo_space_update) */
  uint64_t tight;               /* of them, with less than BFO_SPACE_SLACK left */
  uint64_t quota_checks;        /* of them, with a quota limit known */
  /* the rest is the guard's own */
  uint64_t left;                /* free space less the queue, less what the
                                   entries since may take */
  uint64_t cost;                /* what the last entry noted may take */
  uint64_t start, data;         /* (Btrfs) free space at the first statfs, and
                                   the entries' data since */
  uint64_t inodes;              /* free inodes less those queued, less one an
                                   entry since */
  uint32_t entries;             /* entries since the last statfs */
  unsigned char started;
  /* (Btrfs quotas: the sysfs qgroups directory and the subvolume's qgroup
     name of the subvolume whose statfs f_fsid is quota_fsid, found once) */
  unsigned char quota_found;
  int quota_fsid[2];
  char quota_dir[64], quota_own[32];
};

/* The queue is written first while less than this would be left.  */
#define BFO_SPACE_SLACK ((uint64_t) 8 << 20)
/* Or while fewer inodes than this would be left.  */
#define BFO_SPACE_INODES 16
/* statfs at least every this many entries.  */
#define BFO_SPACE_RECHECK 4096
/* Under this, writing back ahead of the program changes what fits (see
   bfo_space_low).  */
#define BFO_SPACE_LOW ((uint64_t) 32 << 20)

/* Before an entry with SIZE data bytes is made: returns 1 when the caller
   must hand bfo_space_update the statfs of the file system it goes to, 0
   when it is far from full (no system call needed).  */
int bfo_space_note (struct bfo_space *s, uint64_t size);
/* SF: that statfs (NULL if it failed: not guarded until the next one);
   QUOTA: the room quota limits leave (bfo_space_quota), UINT64_MAX for
   none; QUEUED_BYTES in QUEUED_FILES files are queued and not yet written,
   and QUEUED_INODES files queued are not yet made.  Returns 1 when less
   than BFO_SPACE_SLACK, or fewer than BFO_SPACE_INODES inodes, would be left
   after the entry: the caller writes its queue first, and the entry's data
   as GNU's program would (a piece at a time); else 0.  */
struct statfs;
int bfo_space_update (struct bfo_space *s, const struct statfs *sf,
                      uint64_t quota, uint64_t queued_bytes,
                      uint64_t queued_files, uint64_t queued_inodes);
/* The room for new data the quota limits of directory DIR_FD's file system
   leave (AT_FDCWD: the working directory), SF its statfs: Btrfs qgroup
   limits, read from sysfs (any user may), of the directory's subvolume and
   of every qgroup of level 1 and up.  UINT64_MAX when no limit is known
   (no quotas, another file system: VFS quotas are not read).  Where in
   sysfs the subvolume's qgroups are is kept in S.  */
uint64_t bfo_space_quota (struct bfo_space *s, int dir_fd, const struct statfs *sf);
/* Whether less than BFO_SPACE_LOW may be left: a write-behind then would have
   the file system allocate, and give back the rest of its reservations,
   earlier than GNU's writes (on ext4 near full, the last files got other
   sizes).  */
static inline int
bfo_space_low (const struct bfo_space *s)
{
  return s->left < BFO_SPACE_LOW;
}

/* ------------------------------------------------------------ clone stem */

/* On a file system that shares extents, a program writing many small files
   through plain calls (cp, tar -x) can stage a run of them as one stream into
   an unnamed stem file and give each file its whole blocks by FICLONERANGE
   from it (lib/clonestem.c says what it measured).  */
struct bfo_clone_stem;

struct bfo_clone_stem_stats
{
  uint64_t stems;               /* stem files opened */
  uint64_t files, bytes;        /* buffers staged, and their bytes in the stem */
  uint64_t writes;              /* stem writes */
  uint64_t cloned, cloned_bytes;  /* clones made, and their bytes */
  uint64_t failed;              /* clones refused: the caller wrote the data */
  uint64_t direct;              /* of the stem writes, those made with O_DIRECT */
};

/* Only where it measured faster and deleting some of the files frees their
   space: only buffers of whole blocks (a partial last block would be written
   anyway, and then the clone costs more than it saves), and only with
   BFO_CLONE_STEM_XFS, on XFS.  Never on Btrfs, where a stem measured faster
   but one extent holds many files' blocks and stays allocated until all of
   them are deleted.  */
#define BFO_CLONE_STEM_AUTO 1u
/* With AUTO, XFS: for a caller whose buffers are block-aligned, which the
   stem then writes with O_DIRECT (through the page cache, a stem on XFS cost
   more than the files' own writes).  */
#define BFO_CLONE_STEM_XFS 2u

/* Open a stem (an O_TMPFILE file) in directory DIR.  FLAGS: 0 or
   BFO_CLONE_STEM_AUTO, optionally with BFO_CLONE_STEM_XFS.  Returns 0,
   -EOPNOTSUPP (DIR's file system does not clone, or AUTO and it is not XFS
   with BFO_CLONE_STEM_XFS), -EINVAL or -errno.  */
int bfo_clone_stem_new (struct bfo_clone_stem **cs, const char *dir, unsigned int flags);
/* Write the whole blocks of the N buffers BUFS into the stem, as one stream in
   that order, and start its write-back (runs of block-aligned buffers are
   written with O_DIRECT instead, so the call returns when they are written).  AT[i] receives where buffer i's
   blocks are, or -1 (not staged: too short, a partial block with AUTO, or the
   stem failed).  The places are valid until the next call.  CS may be NULL.  */
void bfo_clone_stem_stage (struct bfo_clone_stem *cs, const struct iovec *bufs, size_t n,
                           int64_t *at);
/* The same, with the writes on a thread of the stem's own, so that the caller
   can clone the files of the run before while this one is written: AT is
   final, and the buffers may be freed, once bfo_clone_stem_wait returns (the
   next stage call waits too).  Clone only from runs that were waited for; one
   run is staged at a time.  */
void bfo_clone_stem_stage_async (struct bfo_clone_stem *cs, const struct iovec *bufs, size_t n,
                                 int64_t *at);
/* Wait until the run given to bfo_clone_stem_stage_async is staged.  CS may
   be NULL.  */
void bfo_clone_stem_wait (struct bfo_clone_stem *cs);
/* FD (open for writing, empty) receives the whole blocks of a LEN-byte buffer
   staged at AT, from offset 0, and its file offset is set after them.  Returns
   the bytes cloned: the caller writes the rest of the buffer from there.  0
   (errno set if a clone failed): the caller writes all of it.  */
size_t bfo_clone_stem_clone (struct bfo_clone_stem *cs, int fd, int64_t at, size_t len);
/* Close the stem and free CS (may be NULL); STATS (may be NULL) receives its
   counts.  */
void bfo_clone_stem_free (struct bfo_clone_stem *cs, struct bfo_clone_stem_stats *stats);

#ifdef __cplusplus
}
#endif

#endif /* BFO_H */
