/* bfo-int.h: internals shared by the lib/ sources (batch read: walk, map, order, reader).
   Not installed; everything here may change between releases.  */

#ifndef BFO_INT_H
#define BFO_INT_H 1

#include "bfo.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* Defaults of struct bfo_read_opts.  Chosen on this project's 2-core VMs (virtio
   disk, ~75k IOPS at depth 32): depth 128 keeps the device queue full while the
   CPU prepares the next group; 1 MiB requests are where sequential throughput
   flattens; 4096 files x 64 MiB bounds a batch's memory while amortising the
   metadata phase; 100 ms caps the wait for the first data, as the design says.  */
#define BFO_DEFAULT_IO_DEPTH        128u
#define BFO_DEFAULT_BATCH_FILES     4096u
/* Files mapped and sorted together.  Data are read in physical order across the
   whole window, so on an aged tree (files scattered in walk order) a bigger
   window means more neighbours read together; memory ~300 bytes a file.  */
#define BFO_DEFAULT_WINDOW_FILES    65536u
#define BFO_DEFAULT_BATCH_BYTES     (64ull << 20)
#define BFO_DEFAULT_BATCH_MS        100u
#define BFO_DEFAULT_MAX_IO_BYTES    (1ull << 20)
#define BFO_DEFAULT_LARGE_FILE_BYTES (8ull << 20)
/* Raw mode reads a gap between two extents rather than issue another request
   when the gap is at most this: on a disk a skip this short costs less than a
   seek; on the SSD-like test disks it costs ~60 us against ~15 us per request
   at depth, so keep it small.  Raw reads are done in windows of this size.  */
#define BFO_DEFAULT_RAW_GAP_BYTES   (32ull << 10)
#define BFO_RAW_WINDOW_BYTES        (32ull << 20)

/* O_DIRECT buffers and offsets are aligned to this (covers 512 and 4096-byte
   logical blocks; FIEMAP offsets of 4 KiB-block file systems are multiples).  */
#define BFO_DIO_ALIGN 4096u

/* One physically contiguous piece of a file's data, from FIEMAP.  */
struct bfo_extent
{
  uint64_t logical, physical, length;
};

/* A file queued in a batch.  */
struct bfo_entry
{
  char *path;
  void *user;
  uint64_t ino;                 /* from the directory entry, 0 if unknown */
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
  bool direct;                  /* fd is O_DIRECT */
  bool large;                   /* streamed in pieces, not buffered whole */
  bool raw;                     /* its extents are read from the block device */
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

/* order.c */
int bfo_order_build (struct bfo_entry *entries, size_t n, uint64_t max_io_bytes,
                     struct bfo_request **requests, size_t *n_requests,
                     struct bfo_read_stats *stats);
uint64_t bfo_order_sequential (const struct bfo_request *requests, size_t n);

/* raw.c: a descriptor of the block device under FD's file system, or -errno.  */
int bfo_raw_open (int fd, dev_t *dev);

/* walk.c: calls ADD for every regular file under ROOT, ERR for failures.  */
typedef int (*bfo_walk_add_fn) (void *ctx, const char *path, uint64_t ino);
typedef int (*bfo_walk_err_fn) (void *ctx, const char *path, int error, const char *op);
int bfo_walk_tree (const char *root, bfo_walk_add_fn add, bfo_walk_err_fn err, void *ctx);

#endif /* BFO_INT_H */
