/* bfo-int.h: internals shared by the lib/ sources (batch read: walk, map, order, reader).
   Not installed; everything here may change between releases.  */

#ifndef BFO_INT_H
#define BFO_INT_H 1

#include "bfo.h"
#include "bfo-util.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* Defaults of struct bfo_read_opts, measured with bench/tune-read and bfo read
   --stats on this project's 2-core VMs (virtio disk; aged set of 131072 x 4 KiB
   files on ext4, cold cache; tar -cf takes 17-19 s there):
   - io_depth 256: depth 1/16/128/512 read in 19.9/6.2/4.2/4.3 s; with phase 1
     on two threads and the reopen on a helper thread, 128/256/512 took
     3.67/3.18/3.43 s (medians of 4 runs each, 2026-11-23);
   - window_files 131072: data are read in physical order across a window, and an
     aged tree scatters neighbours across the walk: raw mode needed 98470 requests
     with 4096-file windows, 3145 with 65536, 513 (= 512 MiB / 1 MiB) with 131072;
     wall 4.2 -> 3.1 s.  Memory ~300 bytes a file plus the group arena;
   - batch_files 8192: files opened and buffered at once (descriptors; the reader
     caps it at half the soft RLIMIT_NOFILE); 4096 -> 16384 took raw from 3.55 to
     3.11 s, the fd budget (hard limit 20000 here) allows ~10000;
   - batch_bytes 64 MiB: 16/64/256 MiB made no difference (4.5-4.7 s) beyond noise;
   - batch_ms 100: only the first window is cut by time, so the first data come
     soon; later windows fill to window_files (10/100/1000 ms: 4.5/4.3/4.6 s);
   - max_io_bytes 1 MiB: the block layer splits larger requests anyway (the
     trace shows 127 KiB mean requests on the loop device).  */
#define BFO_DEFAULT_IO_DEPTH        256u
#define BFO_DEFAULT_BATCH_FILES     8192u
#define BFO_DEFAULT_BATCH_BYTES     (64ull << 20)
#define BFO_DEFAULT_BATCH_MS        100u
#define BFO_DEFAULT_MAX_IO_BYTES    (1ull << 20)
#define BFO_DEFAULT_LARGE_FILE_BYTES (8ull << 20)
#define BFO_DEFAULT_WINDOW_FILES    131072u
/* Raw mode reads a gap between two extents rather than issue another request
   when the gap is at most this: on a disk a skip this short costs less than a
   seek; on the SSD-like test disks it costs ~60 us against ~15 us per request
   at depth, so keep it small.  Raw reads are done in windows of this size.  */
#define BFO_DEFAULT_RAW_GAP_BYTES   (32ull << 10)
#define BFO_RAW_WINDOW_BYTES        (32ull << 20)
/* O_DIRECT buffers and offsets are aligned to this (covers 512 and 4096-byte
   logical blocks; FIEMAP offsets of 4 KiB-block file systems are multiples).  */
#define BFO_DIO_ALIGN 4096u

/* Phase 1 (fstat + FIEMAP) runs on two threads from this many files of a chunk
   on: below, a thread costs more than it saves.  */
#define BFO_READ_PREP_MIN_FILES 256u

/* At most this many descriptors of the soft limit are left to the caller
   (below 32768, half the limit and 32 are).  A window whose files all fit
   the rest stays open from phase 1 to phase 2: bfotar -c of the aged 4 KiB
   set with 4096-file windows took 2.54-3.11 s (mean 2.73) kept open against
   2.67-3.08 s (mean 2.89) opened twice, six alternating runs, 2026-11-27.  */
#define BFO_READ_FD_RESERVE_MAX 16384u

/* One physically contiguous piece of a file's data, from FIEMAP.  */
struct bfo_extent
{
  uint64_t logical, physical, length;
};

/* A file queued in a batch.  */
struct bfo_entry
{
  char *path;
  int dirfd;                    /* path is relative to it (AT_FDCWD: as given) */
  void *user;
  uint64_t ino;                 /* from the directory entry, 0 if unknown */
  dev_t dev;                    /* with INO from the caller's stat (bfo_reader_add_known), else 0 */
  bool inode_mapped;            /* phase 1 read its inode, did not open it (map_by_inode) */
  int fd;
  struct stat st;
  struct bfo_extent *extents;   /* data extents to read (unwritten/holes dropped) */
  size_t n_extents;
  struct bfo_range *ranges;     /* the same, as ranges for the callback */
  size_t n_ranges;
  unsigned char *buf;           /* whole-file buffer (small files): in the reader's arena, */
  bool buf_owned;               /* or malloc'd for this file alone */
  uint64_t buf_size;
  int error;
  const char *error_op;
  const char *fallback;         /* non-NULL: read the plain way */
  unsigned int flags;
  bool direct;                  /* read with O_DIRECT (set_direct puts it on fd) */
  bool fd_direct;               /* fd has O_DIRECT */
  bool large;                   /* streamed in pieces, not buffered whole */
  bool raw;                     /* its extents are read from the block device */
  bool cached;                  /* wholly in the page cache: read buffered, whole */
  bool skip;                    /* ... and not read at all (BFO_READ_SKIP_CACHED) */
  uint64_t first_physical;      /* delivery order */
};

/* One read of the ORDER_LIST: a file's logical range at a physical address.  */
struct bfo_request
{
  uint32_t entry;
  uint64_t logical, physical, length;
};

/* map.c */
int bfo_map_entry (struct bfo_entry *e, struct bfo_read_stats *stats);
int bfo_cache_state (int fd, const struct stat *st);

/* order.c */
int bfo_order_build (struct bfo_entry *entries, size_t n, uint64_t max_io_bytes,
                     struct bfo_request **requests, size_t *n_requests);
uint64_t bfo_order_sequential (const struct bfo_request *requests, size_t n);

/* statfs f_type of the file systems raw mode and prefetch know (ext2/3/4 share one).  */
#define BFO_EXT4_MAGIC 0xEF53
#define BFO_XFS_MAGIC  0x58465342

/* raw.c: a descriptor of the block device under FD's file system, or -errno;
   /dev/NAME of a block device from sysfs.  */
int bfo_raw_open (int fd, dev_t *dev);
/* raw.c: the fields of a /proc/self/mountinfo LINE, split in place (false if
   it has not all of them).  */
struct bfo_mountinfo { char *majmin, *root, *mnt, *fstype, *source, *super; };
bool bfo_mountinfo_split (char *line, struct bfo_mountinfo *m);

/* pool.c: bfo_memory_limit with the process's cgroup list (SELF_CGROUP, as
   /proc/self/cgroup) and mount table (MOUNTINFO, as /proc/self/mountinfo)
   read from the files given, and LIMIT for the machine's memory; the unit
   tests hand it made-up cgroup v1 and v2 hierarchies.  */
uint64_t bfo_memory_limit_in (const char *self_cgroup, const char *mountinfo, uint64_t limit);
int bfo_device_path (dev_t dev, char *buf, size_t size);

/* prefetch.c: ext4 inode-table read-ahead through the block device (root).  */
struct bfo_itable;
int bfo_itable_open (int dirfd, const char *path_in_fs, struct bfo_itable **table);
size_t bfo_itable_prefetch (struct bfo_itable *table, const uint64_t *inos, size_t n);
void bfo_itable_close (struct bfo_itable *table);
struct bfo_itable_cursor
{
  uint64_t block;               /* the table block in BUF */
  unsigned char *buf;
};
struct bfo_itable_inode
{
  uint32_t block_size;
  uint64_t size;
  uint64_t block;               /* of the first data */
};
int bfo_itable_inode (struct bfo_itable *table, struct bfo_itable_cursor *cursor, dev_t dev,
                      uint64_t ino, struct bfo_itable_inode *out);
void bfo_itable_cursor_free (struct bfo_itable_cursor *cursor);

/* walk.c: calls ADD for every regular file under ROOT, ERR for failures.  */
typedef int (*bfo_walk_add_fn) (void *ctx, const char *path, uint64_t ino);
typedef int (*bfo_walk_err_fn) (void *ctx, const char *path, int error, const char *op);
int bfo_walk_tree (const char *root, bfo_walk_add_fn add, bfo_walk_err_fn err, void *ctx);

#endif /* BFO_INT_H */
