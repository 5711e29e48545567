/* bfo-cmds.h: bfo tool commands implemented outside bfo.c, each taking the command's
   own argv (argv[0] is the command name) and returning the exit status.  */

#ifndef BFO_CMDS_H
#define BFO_CMDS_H 1

/* bfo write [OPTION]... SRC DST: copy a tree through the batch writer.  */
int bfo_cmd_write (int argc, char **argv);
/* bfo recover DIR: complete or roll back interrupted batch writes in DIR.  */
int bfo_cmd_recover (int argc, char **argv);

#endif /* BFO_CMDS_H */
