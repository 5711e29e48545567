/* tar-batch.h: what bfotar's patches call to read file data ahead in batches
   (libbfo's batch reader) on create, and to show progress and statistics.  */

#ifndef TAR_BATCH_H
#define TAR_BATCH_H 1

#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

/* bfotar's own options, as parse_opt sees them.  */
enum tar_batch_option
{
  TAR_BATCH_MODE,              /* --batch=auto|never */
  TAR_BATCH_FILES,             /* --batch-files=N */
  TAR_BATCH_BYTES,             /* --batch-bytes=SIZE */
  TAR_BATCH_IO_DEPTH,          /* --io-depth=N */
  TAR_BATCH_PROGRESS,          /* --progress */
  TAR_BATCH_STATS,             /* --stats */
  TAR_BATCH_LAYOUT,            /* --layout=walk|dir|refs|trace=FILE */
  TAR_BATCH_TRACE_SUPPORT,     /* --trace-support=PCT */
  TAR_BATCH_TRACE_BATCH_REFS,  /* --trace-batch-refs=N */
  TAR_BATCH_TRACE_ROOT,        /* --trace-root=DIR */
  TAR_BATCH_EXCLUDE,           /* tar's --exclude*, -X: tar may pass over walked files */
  TAR_BATCH_WRITE_BEHIND,      /* --write-behind=auto|SIZE|0 */
  TAR_BATCH_CLONE_STEM,        /* --clone-stem=auto|always|never */
};

/* Take option WHICH with argument ARG (NULL for flags).  Returns NULL, or if
   ARG is not valid for it the option's name for the caller's usage error.  */
const char *tar_batch_option (enum tar_batch_option which, const char *arg);

/* Before tar's argp_parse: rewrite in ARGV every abbreviated long option that
   names exactly one of tar's own options (those of ARGP and its children, not
   bfotar's) into that option's full name, so that bfotar's additions (--batch,
   --stats, --ext4-image...) take no abbreviation of tar's away: --ba is still
   --backup, --sta --starting-file, --ext --extract.  Values of options that
   take one are skipped as argp would see them.  ARGP is a struct argp.  */
struct argp;
void tar_batch_expand_abbrevs (int argc, char **argv, const struct argp *argp);

/* The values of bfotar's options as given (0: not given), for extract's glue.  */
struct tar_batch_settings
{
  bool off, progress, stats;
  unsigned int files;
  unsigned long long bytes;
  const char *layout;          /* --layout, or NULL */
  double trace_support;        /* fraction; 0: default */
  unsigned int trace_batch_refs;
  const char *trace_root;
  unsigned long long write_behind;   /* bytes between write-backs; 0: none */
  unsigned int write_behind_flags;   /* BFO_WRITE_BEHIND_AUTO unless a size was given */
  int clone_stem;                    /* TAR_BATCH_STEM_* */
};
enum { TAR_BATCH_STEM_AUTO, TAR_BATCH_STEM_ALWAYS, TAR_BATCH_STEM_NEVER };
void tar_batch_get_settings (struct tar_batch_settings *settings);

/* Directory listing order, as tar's --sort gives it to savedir.  */
enum tar_batch_sort
{
  TAR_BATCH_SORT_NONE,
  TAR_BATCH_SORT_NAME,
  TAR_BATCH_SORT_INODE,
};

/* What of tar's settings decides whether and how create may read ahead.  */
struct tar_batch_setup
{
  enum tar_batch_sort sort;
  bool recursion;              /* not --no-recursion */
  bool one_file_system;        /* --one-file-system */
  bool sparse;                 /* --sparse: sparse files take tar's own path */
  bool incremental;            /* -g/-G: tar's member order comes from snapshots */
  bool atime_preserve;         /* --atime-preserve: tar must see atimes as they were */
  bool newer;                  /* --newer, --after-date: tar passes over older files */
  bool dev_null_output;        /* tar does not read data at all */
};

/* Create begins: start reading ahead if the options and BFO_DISABLE allow.  */
void tar_batch_start (const struct tar_batch_setup *setup);

/* Raise the soft limit of descriptors for batching (once; see tar-batch.c);
   processes forked later get the limit as it was.  */
void tar_batch_more_descriptors (void);

/* Tar is about to walk the top-level directory open on DIR_FD (whose fstat is
   ST): read its regular files ahead, in the order tar will dump them.  */
void tar_batch_root (int dir_fd, const struct stat *st);

/* Tar dumps the regular file open on FD, whose fstat is ST.  Returns its
   ST->st_size bytes if they were read ahead from exactly this state of the file
   (device, inode, size, mtime, ctime), else NULL: tar reads FD itself.  The
   bytes stay valid until the next call or tar_batch_finish.  */
char const *tar_batch_data (int fd, const struct stat *st);

/* Tar is about to open a file, whose fstatat is ST, to dump it.  If it is a
   regular file with one link whose ST->st_size bytes were read ahead from
   exactly this state, returns them: tar then dumps them without opening the
   file (its final fstatat still checks that the file did not change), as if
   tar_batch_data had returned them.  Otherwise returns NULL and tar opens the
   file as usual; its tar_batch_data call for the file then returns NULL.  */
char const *tar_batch_data_unopened (const struct stat *st);

/* Create ends: stop reading ahead, print the last progress line and the
   statistics if asked for.  */
void tar_batch_finish (void);

/* Extract begins: --progress counts members from here.  */
void tar_batch_extract_begin (void);

/* tar extracts a member with BYTES of data, having read ARCHIVE_POS bytes of
   the archive open on ARCHIVE_FD (its size, if it is a regular file, gives the
   ETA); prints a progress line when one is due.  */
void tar_batch_extract_member (uint64_t bytes, int archive_fd, uint64_t archive_pos);

/* The size of the archive being extracted if it is a regular file read as it
   is (known from the first member on), else 0.  */
uint64_t tar_batch_archive_size (void);

/* How many members extraction has begun (each counted as
   tar_batch_extract_member sees it).  */
uint64_t tar_batch_extract_members (void);

/* Extract ends: the last progress line.  */
void tar_batch_extract_end (void);

#endif /* TAR_BATCH_H */
