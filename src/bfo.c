/* bfo.c: the bfo admin tool (plan, read, write, recover come with later features).
   A thin front end over libbfo: it parses options, calls the library, prints.  */

#include <config.h>

#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfo.h"
#include "error.h"
#include "progname.h"
#include "version-etc.h"

/* version-etc prints this with "(C)" and the year; bfo is not FSF-copyrighted.  */
const char version_etc_copyright[] = "Copyright %s %d the bfo developers";

static const struct option long_options[] =
{
  {"help", no_argument, NULL, 'h'},
  {"version", no_argument, NULL, 'V'},
  {NULL, 0, NULL, 0}
};

static void
usage (int status)
{
  if (status != EXIT_SUCCESS)
    {
      fprintf (stderr, "Try '%s --help' for more information.\n", program_name);
      exit (status);
    }
  printf ("Usage: %s [OPTION]... COMMAND [ARG]...\n", program_name);
  fputs ("\
Inspect and administer bfo batch-file operations.\n\
\n\
Commands:\n\
  features       list the features this libbfo build and kernel offer\n\
\n\
Options:\n\
  -h, --help     display this help and exit\n\
  -V, --version  output version information and exit\n\
\n\
bfocp(1) and bfotar(1) are GNU cp and GNU tar with batched file I/O.\n", stdout);
  printf ("\nReport bugs to: %s\n", PACKAGE_BUGREPORT);
  exit (status);
}

static int
cmd_features (void)
{
  unsigned int have = bfo_features ();
  static const unsigned int all[] = { BFO_FEATURE_IO_URING, BFO_FEATURE_EXT4IMG };
  printf ("libbfo %s\n", bfo_version ());
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
    printf ("%-10s %s\n", bfo_feature_name (all[i]), (have & all[i]) ? "yes" : "no");
  printf ("%-10s %s\n", "libext2fs", bfo_ext2fs_version ());
  return EXIT_SUCCESS;
}

int
main (int argc, char **argv)
{
  set_program_name (argv[0]);

  int c;
  while ((c = getopt_long (argc, argv, "+hV", long_options, NULL)) != -1)
    switch (c)
      {
      case 'h':
        usage (EXIT_SUCCESS);
        break;
      case 'V':
        version_etc (stdout, "bfo", PACKAGE_NAME, PACKAGE_VERSION, "the bfo developers",
                     (char *) NULL);
        printf ("\nlibbfo %s\n", bfo_version ());
        return EXIT_SUCCESS;
      default:
        usage (EXIT_FAILURE);
      }

  if (optind == argc)
    {
      error (0, 0, "missing command");
      usage (EXIT_FAILURE);
    }
  const char *cmd = argv[optind];
  if (strcmp (cmd, "features") == 0 && optind + 1 == argc)
    return cmd_features ();
  if (strcmp (cmd, "features") == 0)
    error (0, 0, "extra operand '%s'", argv[optind + 1]);
  else
    error (0, 0, "unknown command '%s'", cmd);
  usage (EXIT_FAILURE);
}
