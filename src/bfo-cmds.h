/* bfo-cmds.h: bfo tool commands implemented outside bfo.c, each taking the command's
   own argv (argv[0] is the command name) and returning the exit status.  */

#ifndef BFO_CMDS_H
#define BFO_CMDS_H 1

#include <stdint.h>

/* A count or size option's value, or exit naming WHAT (bfo.c).  */
uint64_t bfo_parse_count (const char *arg, const char *what, int allow_suffix);

/* bfo write [OPTION]... SRC DST: copy a tree through the batch writer.  */
int bfo_cmd_write (int argc, char **argv);
/* bfo recover DIR: complete or roll back interrupted batch writes in DIR.  */
int bfo_cmd_recover (int argc, char **argv);

#endif /* BFO_CMDS_H */
