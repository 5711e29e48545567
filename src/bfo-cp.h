/* bfo-cp.h: the interface between GNU cp (copy.c, cp.c, through patches/coreutils-9.1)
   and bfocp's batching glue (cp-batch.c).

   copy_internal hands a regular file's copy_reg call to bfo_cp_defer instead of
   making it; the glue reads deferred sources in batches through libbfo (in
   physical order, on a thread of its own, overlapping cp's walk and writes) and
   then makes the very copy_reg call cp would have made, in the order the data
   arrived.  Inside copy_reg, bfo_cp_data supplies the bytes already read when
   the open source is still the file that was read; otherwise cp reads it
   itself.  So every decision, message and attribute stays cp's own.  */

#ifndef BFO_CP_H
#define BFO_CP_H 1

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>

struct cp_options;

/* Make the copy_reg call that was deferred: SRC, DST and DST_RELNAME (inside
   DST) as copy_internal had them, ARGS the bytes given to bfo_cp_defer.  */
typedef bool (*bfo_cp_run_fn) (char const *src, char const *dst,
                               char const *dst_relname, void *args);

/* Our options.  OPT is one of enum bfo_cp_option; returns false after
   printing a diagnostic for an invalid ARG.  */
enum bfo_cp_option
{
  BFO_CP_OPT_BATCH = 0x4000,    /* --batch=auto|never */
  BFO_CP_OPT_BATCH_FILES,       /* --batch-files=N */
  BFO_CP_OPT_BATCH_BYTES,       /* --batch-bytes=SIZE */
  BFO_CP_OPT_IO_DEPTH,          /* --io-depth=N */
  BFO_CP_OPT_PROGRESS,          /* --progress */
  BFO_CP_OPT_STATS,             /* --stats */
  BFO_CP_OPT_LAYOUT,            /* --layout=walk|dir|refs|trace=FILE */
  BFO_CP_OPT_TRACE_SUPPORT,     /* --trace-support=PCT */
  BFO_CP_OPT_TRACE_BATCH_REFS,  /* --trace-batch-refs=N */
  BFO_CP_OPT_TRACE_ROOT,        /* --trace-root=DIR */
  BFO_CP_OPT_WRITE_BEHIND,      /* --write-behind=SIZE|0 */
  BFO_CP_OPT_CLONE_STEM,        /* --clone-stem=auto|always|never */
};
bool bfo_cp_option (int opt, char const *arg);
/* cp.c, before its getopt_long loop: take our options (spelled in full only,
   so that no abbreviation of cp's own changes meaning) out of ARGV, skipping
   the values of cp's options as getopt_long would see them.  Returns false
   after a diagnostic.  */
struct option;
bool bfo_cp_take_options (int *argc, char **argv, char const *shortopts,
                          struct option const *longopts);
/* The --help lines of those options.  */
char const *bfo_cp_usage (void);
/* cp.c, before the copy: start batching unless --batch=never or BFO_DISABLE=1.
   N_FILES, FILES: the operands (for --progress and the metadata walk ahead of
   cp); TARGET_GIVEN: -t was given (else the last operand is the destination).  */
void bfo_cp_start (int n_files, char *const *files, bool target_given);
/* cp.c, after the copy: finish every deferred copy, print --stats.  Returns
   false if one of them failed.  */
bool bfo_cp_finish (void);

/* copy_internal: defer copy_reg (SRC_NAME, DST_NAME, DST_DIRFD, DST_RELNAME, X,
   ..., SRC_SB) if the glue can batch this file; ARGS (ARGS_SIZE bytes, copied)
   carries the rest for RUN.  Returns false when the caller must copy now.  */
bool bfo_cp_defer (struct cp_options const *x, char const *src_name,
                   char const *dst_name, int dst_dirfd, char const *dst_relname,
                   struct stat const *src_sb, bool command_line_arg,
                   bool have_backup, bfo_cp_run_fn run, void const *args,
                   size_t args_size);

/* copy_internal, before it makes the entry of SRC_SB at DST_NAME
   (DST_DIRFD): near a full disk, the pending copies are finished first, and
   the copies after it are not deferred.  */
void bfo_cp_space (int dst_dirfd, char const *dst_name, struct stat const *src_sb);

/* copy_internal, before bfo_cp_defer for a destination that exists
   (DST_DIRFD+DST_RELNAME, DST_SB as cp stat'ed it): true if other names may
   reach it (hard links, or a deferred copy onto the same file) or cp cannot
   open it for writing (then -f removes it, and -v says so; without -f the
   copy fails with a message): the deferred copies are then finished and the
   caller must copy now, in cp's order.  */
bool bfo_cp_existing_dst (int dst_dirfd, char const *dst_relname,
                          struct stat const *dst_sb);

/* copy_internal, having stat'ed an existing destination (DST_SB), or found
   none (DST_SB null: stat said ENOENT) at DST_DIRFD+DST_RELNAME: true if a
   deferred copy still writes that file, or is still to make the one a
   dangling symbolic link there names; the deferred copies are then finished
   and the caller must stat again, to see what cp would see (-u compares the
   written file's time; a link to a file cp made is followed, not refused as
   dangling).  Also asked with a source's stat: a deferred copy writes it
   when a destination name links into the source tree.  */
bool bfo_cp_dst_stale (int dst_dirfd, char const *dst_relname,
                       struct stat const *dst_sb);

/* copy_internal, when a source's stat found no file: true if copies are
   deferred (cp -rL: a source symbolic link may lead to a file one of them
   is still to make in the destination); they are then finished and the
   caller must stat again.  */
bool bfo_cp_src_missing (void);

/* create_hard_link, about to link a name to the earlier destination
   DIRFD+RELNAME (followed if FOLLOW): if that does not exist (yet), the
   deferred copies are finished, since one of them may be to make it.  */
void bfo_cp_link_target (int dirfd, char const *relname, bool follow);

/* A copy of *X that lives as long as the process: copy_dir hands its entries
   options on its stack, and deferred copies outlive it.  */
struct cp_options const *bfo_cp_keep_options (struct cp_options const *x);

/* The deferred copy_reg call's wrapper (bfo_copy_reg), having stat'ed the
   source by name just before the call: what it saw (SB; null: the stat
   failed), and what cp's walk saw before it deferred the copy (WALKED).  */
void bfo_cp_fresh (struct stat const *sb, struct stat const *walked);

/* copy_reg, before it opens the source: true if it need not, and *SB is then
   what fstat would say of it.  So when the glue holds the data of the very
   file bfo_cp_fresh saw, unchanged since before the reader opened it (its
   ctime from cp's walk on), and X asks nothing that reads the source
   through a descriptor.  */
bool bfo_cp_held (struct cp_options const *x, struct stat *sb);

/* copy_reg, when it would copy data from SRC_FD (fstat'ed as SRC_SB) to the
   regular file DST_FD: 1 if the glue wrote the data it had read for this very
   file, 0 if cp must copy it itself, -1 when writing failed (errno set).  */
int bfo_cp_data (int src_fd, struct stat const *src_sb, int dst_fd);

/* After bfo_cp_data failed: whether copy_reg, copying the data itself, would
   have used copy_file_range from SRC_FD (SRC_NAME, opened here if SRC_FD is
   -1) to DST_FD (it does where no holes are made and, REFLINK_ALLOWED,
   reflinks are; the kernel takes a pair on one file system), and so reported
   the failure as "error copying".  Keeps errno.  */
bool bfo_cp_copy_range (char const *src_name, int src_fd, int dst_fd,
                        bool reflink_allowed);

/* copy_internal, before a directory's final attributes: deferred copies may
   still be creating files in it.  If its final mode would keep us out
   (RESTRICTIVE), finish them all first; returns false if one failed.  */
bool bfo_cp_dir_settle (bool restrictive);
/* copy_internal, about to set a directory's times to TS: true if copies are
   still deferred (some may create files in it): its times are then set once
   they are done (a failure reported as cp would), so that an interrupted
   copy leaves no directory with its source's times and entries missing.
   False: the caller sets them now.  */
bool bfo_cp_dir_times (int dirfd, char const *relname, char const *name,
                       struct timespec const ts[2]);

/* copy (), at the end of each command-line argument: finish every deferred
   copy.  Returns false if one of them failed since the last call.  */
bool bfo_cp_flush (void);

#endif /* BFO_CP_H */
