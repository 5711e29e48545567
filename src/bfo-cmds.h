/* bfo-cmds.h: bfo tool commands implemented outside bfo.c, each taking the command's
   own argv (argv[0] is the command name) and returning the exit status.  */

#ifndef BFO_CMDS_H
#define BFO_CMDS_H 1

#include <dirent.h>
#include <stdbool.h>
#include <stdint.h>

/* A count or size option's value, or exit naming WHAT (bfo.c).  */
uint64_t bfo_parse_count (const char *arg, const char *what, int allow_suffix);

/* Exit with "memory exhausted" (bfo-write.c).  */
_Noreturn void bfo_die_nomem (void);
/* An entry of a directory: its name and d_type.  */
struct bfo_dirent
{
  char *name;
  unsigned char type;
};

/* The entries of directory D but "." and "..", and without regular files if
   SKIP_REGULAR (by d_type), sorted by name (strcmp); *N gets their count.
   Closes D.  The array and each name are malloc'd.  */
struct bfo_dirent *bfo_sorted_names (DIR *d, bool skip_regular, size_t *n);

/* bfo write [OPTION]... SRC DST: copy a tree through the batch writer.  */
int bfo_cmd_write (int argc, char **argv);
/* bfo recover DIR: complete or roll back interrupted batch writes in DIR.  */
int bfo_cmd_recover (int argc, char **argv);

/* bfo mkimage [OPTION]... IMAGE SRCDIR: populate an unmounted ext4 image (bfo-image.c).  */
int bfo_cmd_mkimage (int argc, char **argv);
/* bfo plan --write DST: print the write backend DST would get and why; exit status.  */
int bfo_plan_write (const char *dst);
/* Split DST of the form IMAGE:/DIR, where IMAGE is an existing regular file or block
   device (the first such ':' wins).  Without one: false, or with WHOLE the whole of
   DST is the image and DIR is "/".  *IMAGE and *DIR are malloc'd.  */
bool bfo_split_image_dst (const char *dst, bool whole, char **image, char **dir);
/* Report why an image writer could not open (ERR an errno); exits when STATUS != 0.  */
void bfo_image_open_error (int status, int err, const char *image, const char *dir);

/* --layout and the trace options, shared by write, mkimage and plan (bfo-write.c).  */
struct bfo_layout_opts;
enum { BFO_OPT_LAYOUT = 512, BFO_OPT_TRACE_SUPPORT, BFO_OPT_TRACE_BATCH_REFS, BFO_OPT_TRACE_ROOT };
#define BFO_LAYOUT_OPTIONS \
  {"layout", required_argument, NULL, BFO_OPT_LAYOUT}, \
  {"trace-support", required_argument, NULL, BFO_OPT_TRACE_SUPPORT}, \
  {"trace-batch-refs", required_argument, NULL, BFO_OPT_TRACE_BATCH_REFS}, \
  {"trace-root", required_argument, NULL, BFO_OPT_TRACE_ROOT}
/* Their --help text.  */
extern const char bfo_layout_help[];
struct bfo_layout_args
{
  const char *spec;            /* NULL: walk */
  double support;              /* fraction; 0: default */
  unsigned int batch_refs;
  const char *root;
};
/* Take option CH (one of BFO_OPT_*) with ARG; false if CH is not one of them.  */
bool bfo_layout_option (int ch, const char *arg, struct bfo_layout_args *a);
/* The layout the options ask for, or NULL for walk; exits with a message when the
   spec is wrong or the trace cannot be read.  */
struct bfo_layout *bfo_layout_make (const struct bfo_layout_args *a);
/* bfo plan --write DST --layout=SPEC SRC: the groups each batch of SRC would form.  */
int bfo_plan_layout (const char *src, const struct bfo_layout_args *a,
                     unsigned int batch_files, uint64_t batch_bytes);

#endif /* BFO_CMDS_H */
