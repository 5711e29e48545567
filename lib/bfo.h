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

/* Flags of struct bfo_read_opts.  */
enum
{
  BFO_READ_NO_DIRECT = 1u << 0,  /* buffered reads (still batched, physical order) */
  BFO_READ_RAW       = 1u << 1,  /* read merged extents from the block device (root) */
};

/* Tuning; a zero field takes the default (see BFO_DEFAULT_* in bfo-int.h).  */
struct bfo_read_opts
{
  unsigned int flags;          /* BFO_READ_* */
  unsigned int io_depth;       /* io_uring queue depth */
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
  uint64_t errors;
};

struct bfo_reader;

/* Create a reader; OPTS may be NULL.  Returns 0 or -errno.  */
int bfo_reader_open (struct bfo_reader **reader, const struct bfo_read_opts *opts,
                     bfo_read_cb cb, void *arg);
/* Queue one regular file; may run a batch.  Returns 0 or the callback's stop value.  */
int bfo_reader_add (struct bfo_reader *reader, const char *path, void *user);
/* Queue every regular file under ROOT (symlinks not followed, other types skipped);
   errors on directories come to the callback with error set.  */
int bfo_reader_add_tree (struct bfo_reader *reader, const char *root);
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

#ifdef __cplusplus
}
#endif

#endif /* BFO_H */
