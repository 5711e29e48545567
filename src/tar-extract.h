/* tar-extract.h: what bfotar's extract patch calls to have regular files
   written and their attributes set on a writer thread, or to extract into an
   unmounted ext4 image through libbfo's image writer.  */

#ifndef TAR_EXTRACT_H
#define TAR_EXTRACT_H 1

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>
#include <time.h>

/* One member as tar extracts it: the name tar uses (relative to its working
   directory), the descriptor tar opened, and what tar's set_stat would apply
   to it.  */
struct tar_extract_file
{
  char const *name;
  int fd;                      /* -1 in an image */
  char typeflag;
  int atflag;                  /* set_stat's */
  mode_t mode;                 /* the member's st_mode */
  mode_t want_mode;            /* st_mode & ~current_umask */
  uid_t uid;
  gid_t gid;
  struct timespec atime, mtime;
  mode_t current_mode, current_mode_mask;  /* as open_output_file knows them */
  size_t size;                 /* data bytes tar will hand over */
  bool replace;                /* in an image: replaced even under --overwrite */
};

/* Why a deferred file comes back to tar, which then finishes it with its own
   calls and messages.  */
enum tar_extract_failure
{
  TAR_EXTRACT_WRITE_FAILED = 1,   /* a write was short: WROTE of CHUNK bytes */
  TAR_EXTRACT_ATTRS_FAILED,       /* utimens, chown, stat or chmod failed */
  TAR_EXTRACT_CLOSE_FAILED,       /* close failed (the descriptor is gone) */
};

struct tar_extract_redo
{
  struct tar_extract_file const *file;
  enum tar_extract_failure failure;
  int error;                   /* errno of the failure */
  size_t wrote, chunk;         /* TAR_EXTRACT_WRITE_FAILED */
};

/* Image members tar could not have made, for tar's messages.  */
struct tar_extract_image_error
{
  char const *name;            /* the member name tar used */
  char const *link_name;       /* a link's target, else NULL */
  char typeflag;
  int error;
  char const *xattr;           /* setting this extended attribute failed */
  char const *interdir;        /* first, this directory on the way could not be made */
  int interdir_error;
  /* A directory member kept where it was found (a directory, or a file that
     could not go), whose attributes tar's set_stat would fail to set with
     ATTRS_ERROR (immutable or append-only); reported when tar would have set
     them.  FOUND_MODE is its mode (with --no-overwrite-dir also when
     ERROR is tar's failed chmod at once); MODE, UID and GID the member's.  */
  int attrs_error;
  mode_t found_mode, mode;
  uid_t uid;
  gid_t gid;
};

/* What the patch tells the glue when extraction starts.  */
struct tar_extract_setup
{
  bool deferrable;             /* no option needs tar's own order of calls */
  bool overwrite;              /* --overwrite: an existing name may be reopened */
  bool touch;                  /* -m: no utimens */
  bool same_owner;             /* chown (and we may) */
  bool same_permissions;       /* mode mask MODE_ALL, else the rwx bits */
  bool root;
  bool no_overwrite_dir;       /* --no-overwrite-dir */
  bool delay_dir_restore;      /* --delay-directory-restore */
  mode_t umask;                /* for image members, as tar's current_umask */
  mode_t newdir_umask;         /* for directories made on the way in an image, as
                                  tar's make_directories (022 as root, whose
                                  current_umask is 0) */
  size_t (*write) (int fd, void const *buf, size_t count);   /* blocking_write */
  void (*redo) (struct tar_extract_redo const *redo);        /* on tar's thread */
  void (*image_error) (struct tar_extract_image_error const *e);  /* on tar's thread */
};

/* --ext4-image=IMG[:/DIR]: remember it.  Returns false if ARG is empty.  */
bool tar_extract_option_image (char const *arg);
/* True when --ext4-image was given.  */
bool tar_extract_image_given (void);

/* Extraction begins (after extr_init).  In image mode this opens the image;
   returns 0, or an errno for tar's fatal message naming IMAGE.  */
int tar_extract_start (struct tar_extract_setup const *setup, char const **image);

/* True when members go into an ext4 image rather than through tar's calls.  */
bool tar_extract_image_active (void);

/* --overwrite: tar is about to open FILE (in DIR_FD) again; if a deferred
   file may be at that name, wait until every deferred file is finished.  */
void tar_extract_before_open (int dir_fd, char const *name);

/* Before tar makes member NAME of SIZE data bytes relative to DIR_FD (and
   removes what it replaces): the queue is written first when free space
   (of NAME's directory's file system and quota) runs short of it.  Nothing
   without the writer thread.  */
void tar_extract_space (int dir_fd, char const *name, uint64_t size);

/* The mode to create the new regular file NAME (in DIR_FD) with, of a member
   whose status is MEMBER: MODE (tar's: as root, no group or other bits until
   set_stat), or the member's permission bits when the file has its final
   owner from the start (no chmod then follows).  */
mode_t tar_extract_create_mode (int dir_fd, char const *name, mode_t mode,
                                struct stat const *member);
/* Tar writes the file just opened on FD itself: the queued files are
   finished first (in archive order, as tar would); it gets the mode tar would
   have created it with if tar_extract_create_mode gave another
   (*CURRENT_MODE is updated).  */
void tar_extract_keep (int fd, mode_t *current_mode);

/* Take over FILE (tar opened FILE->fd; in an image fd is -1): returns a handle
   to pass the member's data to, or NULL if tar must write it itself.  */
struct tar_extract_job *tar_extract_begin (struct tar_extract_file const *file);
/* The next LEN bytes of the member's data; returns LEN.  */
size_t tar_extract_data (struct tar_extract_job *job, void const *buf, size_t len);
/* The data are complete (or tar stopped at an unexpected end of the archive):
   queue the file for the writer thread, or write it into the image.  */
int tar_extract_commit (struct tar_extract_job *job);

/* Image members other than regular files; 0 or 1 as tar's extractors return.  */
int tar_extract_image_dir (struct tar_extract_file const *file);
int tar_extract_image_symlink (struct tar_extract_file const *file, char const *target);
int tar_extract_image_link (struct tar_extract_file const *file, char const *target);
/* Extended attribute KEY = VALUE (SIZE bytes) of the member just queued as
   NAME, set once the image entries are made; a failure is a warning.  */
void tar_extract_image_xattr (char const *name, char const *key, void const *value,
                              size_t size);
/* A device (RDEV) or fifo member, made in the image whoever runs tar.  */
int tar_extract_image_node (struct tar_extract_file const *file, dev_t rdev);
/* tar reaches member NAME and would now set the attributes of the directories
   it delayed that are not above NAME (apply_nonancestor_delayed_set_stat):
   those of image directory members it would fail to set are reported
   before NAME's messages.  */
void tar_extract_image_settle (char const *name);
/* Whether the member last queued was made (the writer's batch holding it
   is written first): tar warns about its time stamp only then.  */
bool tar_extract_image_last_made (void);

/* A sparse member: tar's sparse code writes it into the memory file
   tar_extract_image_sparse_fd returns (or -1, errno set), at the offsets of
   its N map regions MAP; then tar_extract_image_sparse puts what tar wrote
   there into the image, with blocks only for the regions, and closes FD.  */
struct tar_extract_region
{
  off_t offset, length;
};
int tar_extract_image_sparse_fd (void);
int tar_extract_image_sparse (struct tar_extract_file const *file, int fd,
                              struct tar_extract_region const *map, size_t n);

/* The archive ended inside the member: write the data JOB has now, on tar's
   thread, and forget JOB (tar finishes the file).  Returns 0, or -1 after a
   short write of *WROTE of *CHUNK bytes (errno set).  */
int tar_extract_write_now (struct tar_extract_job *job, size_t *wrote, size_t *chunk);

/* Extraction ends inside a member (a fatal error in the middle of its data,
   tar_extract_data called, tar_extract_commit not): what tar passed of it is
   written now, after the files queued before it, as tar's own loop had
   written it before the error, and the file keeps the mode tar created it
   with (tar leaves it so).  Returns 0 (also when there is no such member),
   or -1 with errno set and *WROTE and *CHUNK for tar's message about the
   member (still tar's current one).  */
int tar_extract_abandon (size_t *wrote, size_t *chunk);

/* Wait until every deferred file is finished (failures go back to tar through
   redo), and in image mode write everything queued.  Called when extraction
   ends, also on a fatal error.  Returns 0, or the errno of a write-back of
   write-behind that failed, for tar to report: the user's sync -f no longer
   would (bfo_write_behind_stats.error).  */
int tar_extract_drain (void);

/* Every file queued so far is written, its attributes set and closed, or
   handed back to tar (tar's thread): before tar runs a command that may look
   at them (--checkpoint-action=exec, wait).  */
void tar_extract_settle (void);

#endif /* TAR_EXTRACT_H */
