/* bfo-write-int.h: internals of the batch writer (BFOw) shared by writer, journal, stem,
   the patcher backends and recovery.  Not installed; may change between releases.  */

#ifndef BFO_WRITE_INT_H
#define BFO_WRITE_INT_H 1

#include "bfo.h"
#include "bfo-util.h"

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

struct io_uring;

/* Defaults of struct bfo_write_opts.  64 MiB bounds a batch's buffer (the design
   says ~64 MiB) while making the stem one large sequential write; 4096 files and
   100 ms match the reader's batches.  Stem writes are 1 MiB O_DIRECT requests;
   a 60 MiB stem (bfo write of one file from tmpfs, wall time with fsync, best of
   3, loop-mounted 1 GiB images on the 2-core VM) took 0.150 s at depth 4 and
   0.129-0.132 s at depth 16, 32 and 64 on XFS, 0.226-0.234 s at every depth on
   Btrfs: 32 is on the flat part with room for faster disks.  */
#define BFO_WRITE_DEFAULT_BATCH_FILES 4096u
#define BFO_WRITE_DEFAULT_BATCH_BYTES (64ull << 20)
#define BFO_WRITE_DEFAULT_BATCH_MS    100u
#define BFO_WRITE_DEFAULT_IO_DEPTH    32u
#define BFO_STEM_IO_BYTES             (1u << 20)

/* A batch's targets are created, filled and renamed by this many threads, each
   on its own directories: on mounted file systems per-file create, attribute and
   rename syscalls are the cost, not the I/O.  Two bfo write processes on two
   halves of 32768 4 KiB files (ext4, 2-core VM) took 1.74 s against 2.66 s one
   after the other.  Batches below BFO_WRITE_FILL_MIN_FILES stay on one thread.  */
#define BFO_WRITE_FILL_THREADS        2u
#define BFO_WRITE_FILL_MIN_FILES      64u
/* Descriptors left to the caller when the ordered backend keeps a batch's
   unnamed files open until its sync.  */
#define BFO_WRITE_FD_RESERVE          256u

/* Every file's data starts at a multiple of this in the stem (at least the file
   system block, so that FICLONERANGE accepts each range, and the O_DIRECT alignment).  */
#define BFO_STEM_MIN_ALIGN 4096u
/* Reflink backend: files below this with a partial last block are written
   whole instead of cloned (see patch-reflink.c).  */
#ifndef BFO_REFLINK_WRITE_BELOW
# define BFO_REFLINK_WRITE_BELOW (64u << 10)
#endif
/* Whether the reflink backend writes a LEN-byte file whole (given its data).  */
static inline bool
bfo_reflink_writes_whole (uint64_t len, uint32_t align)
{
  return len % align != 0 && len < BFO_REFLINK_WRITE_BELOW;
}

/* Names of the helper files.  All carry the writer's pid and batch number, so
   recovery can tell whose they are and find a batch's temporary files.  */
#define BFO_JOURNAL_PREFIX ".bfo-journal."   /* .bfo-journal.PID.SEQ (destination directory) */
#define BFO_JTMP_PREFIX    ".bfo-jtmp."      /* the journal before it is complete */
#define BFO_STEM_PREFIX    ".bfo-stem."      /* .bfo-stem.PID.SEQ */
#define BFO_PROBE_PREFIX   ".bfo-probe."     /* .bfo-probe.PID.a/b: the reflink probe */
#define BFO_TMP_PREFIX     ".bfo-tmp."       /* .bfo-tmp.PID.SEQ.IDX, beside the target */
#define BFO_NAME_MAX 64

/* ---------------------------------------------------------------- journal.c */

#define BFO_JOURNAL_VERSION 4u

/* Flags of a journal (version 2).  DIRECT: the batch creates its targets at
   their names at once (the journal is durable before the first one is made);
   each entry's stem offset holds the CRC32C of its data, and recovery keeps a
   target only if its size and CRC32C are the batch's.  */
#define BFO_JOURNAL_DIRECT 1u

/* An entry's attribute flag (version 4), in the journal only: its stem offset
   holds the CRC32C of its data, which the stem does not hold (a reflink
   batch's file written whole); recovery keeps the target only if its size and
   CRC32C are the entry's, as for a direct batch.  */
#define BFO_JENTRY_CRC (1u << 31)

/* One target of a batch, as the journal records it.  */
struct bfo_jentry
{
  char *path;                  /* relative to the destination directory */
  uint64_t stem_off, len;
  struct bfo_write_attrs attrs;
  bool crc;                    /* BFO_JENTRY_CRC: stem_off is the data's CRC32C */
};

/* A batch's ORDER_LIST.  */
struct bfo_journal
{
  uint32_t version;
  uint32_t backend;            /* enum bfo_write_backend the batch started with */
  uint32_t pid;
  uint32_t align;
  uint32_t flags;              /* BFO_JOURNAL_* */
  uint64_t seq;
  uint64_t stem_bytes;         /* 0: no stem */
  struct timespec start;       /* version 3: made at (file system clock); set on write */
  size_t n;
  struct bfo_jentry *entries;
  bool stem_durable;           /* decode: the valid commit record follows */
};

uint32_t bfo_crc32 (uint32_t crc, const void *buf, size_t len);
uint32_t bfo_crc32c (uint32_t crc, const void *buf, size_t len);
/* Serialize J (without the commit record) into a malloc'd buffer.  */
int bfo_journal_encode (const struct bfo_journal *j, unsigned char **buf, size_t *len);
/* The commit record appended once the stem is fsync'd.  */
#define BFO_JOURNAL_COMMIT_BYTES 28u
void bfo_journal_encode_commit (const struct bfo_journal *j,
                                unsigned char out[BFO_JOURNAL_COMMIT_BYTES]);
/* Parse BUF: -EBADMSG (not a journal, truncated, checksum), -ENOTSUP (version).
   On success J owns its entries (bfo_journal_free).  */
int bfo_journal_decode (const unsigned char *buf, size_t len, struct bfo_journal *j);
void bfo_journal_free (struct bfo_journal *j);
/* Write J as DIRFD/.bfo-journal.PID.SEQ: written as .bfo-jtmp.*, fsync'd, renamed,
   and the directory fsync'd, so a journal under its real name is always whole.
   The journal is locked (flock) from its creation: its descriptor goes to *LOCK,
   to be closed once the journal is removed, so
   that recovery in another process, whatever its pid namespace, leaves alone
   the journal of a writer that still runs (bfo_helper_claim).  The same for
   the next two.  */
int bfo_journal_write (int dirfd, const struct bfo_journal *j, int *lock);
/* The same without any sync, as .bfo-jtmp.PID.SEQ only: for a batch whose
   targets get names only after a syncfs, which makes it durable; then
   bfo_journal_publish renames it to its real name (before any target is
   named: file systems journal metadata updates in order).  */
int bfo_journal_write_deferred (int dirfd, const struct bfo_journal *j, int *lock);
int bfo_journal_publish (int dirfd, const struct bfo_journal *j);
/* For a direct batch: the journal's data synced, then renamed to its real name
   without a sync of the directory: file systems that journal metadata persist
   the rename before the targets the batch then creates.  */
int bfo_journal_write_ordered (int dirfd, const struct bfo_journal *j, int *lock);
/* Append the commit record ("the stem is durable") and fsync.  */
int bfo_journal_commit_stem (int dirfd, const struct bfo_journal *j);
int bfo_journal_read (int dirfd, const char *name, struct bfo_journal *j);
/* NAME of kind PREFIX for PID.SEQ; bfo_tmp_name adds the entry's index.  */
void bfo_helper_name (char *buf, const char *prefix, uint32_t pid, uint64_t seq);
void bfo_tmp_name (char *buf, uint32_t pid, uint64_t seq, size_t idx);
/* Where a writer's batch numbers start: random in the upper half, so that the
   helper files of writers with the same pid (in different pid namespaces on
   one file system: containers sharing a volume) do not meet.  */
uint64_t bfo_seq_base (void);
/* Try to take the lock of DIRFD/NAME, a journal (or .bfo-jtmp) that may be a
   running writer's: 0 when taken (its writer is gone; *LOCK holds it until
   closed, so two recoveries do not do the same journal), 1 when its writer
   holds it, -ENOENT when it is gone, another -errno when it cannot tell (no
   locks there: the caller goes by the writer's pid).  */
int bfo_helper_claim (int dirfd, const char *name, int *lock);
/* Parse "PREFIXPID.SEQ" (SEQ may be NULL to accept any rest); false if NAME is not one.  */
bool bfo_helper_parse (const char *name, const char *prefix, uint32_t *pid, uint64_t *seq);

/* ---------------------------------------------------------------- stem.c */

struct bfo_stem
{
  int fd;
  bool direct;                 /* fd is O_DIRECT */
  uint64_t bytes;
};

/* Create DIRFD/NAME (exclusive) and allocate BYTES; -ENOSPC when they do not fit.  */
int bfo_stem_create (int dirfd, const char *name, uint64_t bytes, bool direct,
                     struct bfo_stem *stem);
/* Write LEN bytes of DATA at stem offset OFF (a multiple of BFO_STEM_MIN_ALIGN).
   PADDED: DATA is aligned and readable (zeros) up to the next multiple of the
   alignment, so it can be written straight; otherwise it goes through aligned
   bounce buffers.  Uses RING when non-NULL.  O_DIRECT refused: goes buffered.  */
int bfo_stem_write (struct bfo_stem *stem, struct io_uring *ring, unsigned int depth,
                    uint64_t off, const void *data, uint64_t len, bool padded,
                    struct bfo_write_stats *stats);
/* fsync the stem.  */
int bfo_stem_sync (struct bfo_stem *stem);
void bfo_stem_close (struct bfo_stem *stem);

/* ---------------------------------------------------------------- patchers */

/* What a backend needs to fill one temporary file.  */
struct bfo_wctx
{
  int stem_fd;                 /* -1 without stem */
  uint32_t align;              /* of the stem's ranges */
  unsigned int flags;          /* BFO_WRITE_* */
  bool copy_fallback;          /* recovery: copy bytes when cloning is refused */
  struct bfo_write_stats *stats;
  size_t *written;             /* if set, counts the files given bytes by writes */
};

/* How a file's data reaches it: one backend per file behind this struct.  */
struct bfo_patcher
{
  const char *name;
  int backend;                 /* enum bfo_write_backend */
  bool uses_stem;              /* the batch's data goes to a durable stem first */
  bool sync_before_rename;     /* the temp files' data must be synced before renames */
  bool sync_before_cleanup;    /* ... before the batch's stem and journal are removed */
  /* 0 when the backend works in DIRFD's file system, else -errno.  FD is an
     empty file the writer just created there (a helper file, removed after).  */
  int (*probe) (int dirfd, int fd);
  /* Give the new, empty temporary file FD its LEN bytes: from the stem at
     STEM_OFF, or from DATA.  Returns 0 or -errno, with *OP naming what failed.  */
  int (*fill) (const struct bfo_wctx *c, int fd, uint64_t stem_off, const void *data,
               uint64_t len, const char **op);
};

extern const struct bfo_patcher bfo_patcher_reflink;
extern const struct bfo_patcher bfo_patcher_ordered;

/* ---------------------------------------------------------------- patch-ext4img.c */

/* The image backend keeps its own batches (no journal, stem or temporary files):
   bfo_writer_* hand over to these when the writer was opened on an image.  */
struct bfo_ext4img;
enum { BFO_IMG_FILE, BFO_IMG_DIR, BFO_IMG_SYMLINK, BFO_IMG_LINK, BFO_IMG_NODE,
       BFO_IMG_XATTR };
int bfo_ext4img_open (struct bfo_ext4img **img, const char *image, const char *dir,
                      const struct bfo_write_opts *opts, bfo_write_cb cb, void *arg);
/* KIND is BFO_IMG_*; TARGET is a symlink's target or a hard link's existing path,
   or with BFO_IMG_XATTR the attribute's name (DATA, LEN its value).  */
int bfo_ext4img_add (struct bfo_ext4img *img, int kind, const char *relpath, const char *target,
                     const void *data, size_t len, const struct bfo_write_attrs *attrs,
                     void *user);
/* Extended attribute NAME = VALUE (SIZE bytes) of RELPATH, added before.  */
int bfo_ext4img_add_xattr (struct bfo_ext4img *img, const char *relpath, const char *name,
                           const void *value, size_t size, void *user);
/* A device, fifo or socket: MODE's file type, with RDEV for a device.  */
int bfo_ext4img_add_node (struct bfo_ext4img *img, const char *relpath, mode_t mode, dev_t rdev,
                          const struct bfo_write_attrs *attrs, void *user);
/* A file with holes: see bfo_writer_add_sparse.  */
int bfo_ext4img_add_sparse (struct bfo_ext4img *img, const char *relpath, const void *data,
                            const struct bfo_range *ranges, size_t n_ranges, uint64_t size,
                            const struct bfo_write_attrs *attrs, void *user);
int bfo_ext4img_flush (struct bfo_ext4img *img);
void bfo_ext4img_get_stats (const struct bfo_ext4img *img, struct bfo_write_stats *stats);
int bfo_ext4img_close (struct bfo_ext4img *img);

/* ---------------------------------------------------------------- writer.c helpers */

/* The last parent directory resolved, kept open: a batch is sorted by path, so
   siblings resolve once.  */
struct bfo_dircache
{
  char *dir;                   /* relative parent path ("" = the root itself) */
  int fd;                      /* -1: nothing cached */
};

/* 0 if RELPATH is a path the writer accepts, else -EINVAL.  */
int bfo_wpath_check (const char *relpath);
/* Resolve RELPATH's parent beneath ROOTFD (symlinks may not lead outside; missing
   directories are created when MKDIRS); returns a directory fd owned by DC (do
   not close) or -errno, and the last component in *BASE.  */
int bfo_wpath_parent (struct bfo_dircache *dc, int rootfd, const char *relpath, bool mkdirs,
                      const char **base);
void bfo_dircache_drop (struct bfo_dircache *dc);
/* The mode to create a temporary file with, and the attributes to set on it.  */
mode_t bfo_wattrs_create_mode (const struct bfo_write_attrs *a);
int bfo_wattrs_apply (int fd, const struct bfo_write_attrs *a);
/* The same, without what DONE (BFO_ATTR_MODE, BFO_ATTR_OWNER) says is in place.  */
int bfo_wattrs_apply_some (int fd, const struct bfo_write_attrs *a, unsigned int done);
/* Whether the process PID is gone (and so its helper files are stale).  */
bool bfo_pid_dead (uint32_t pid);

/* ---------------------------------------------------------------- recover.c */

/* Recover the stale journals in ROOTFD (their writer is dead, or is SELF_PID:
   a pid reused since the crash).  Counts journals handled in *RECOVERED.  */
int bfo_recover_fd (int rootfd, unsigned int flags, uint32_t self_pid, bfo_recover_cb cb,
                    void *arg, uint64_t *recovered);

#endif /* BFO_WRITE_INT_H */
