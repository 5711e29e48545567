/* check.h: the one assertion the C unit tests share: print ok/FAIL with what was
   checked, count failures; main returns failures ? 1 : 0 (automake's protocol).  */

#ifndef BFO_TEST_CHECK_H
#define BFO_TEST_CHECK_H 1

#include <stdio.h>

static int failures;

static void
check (int ok, const char *what)
{
  printf ("%s: %s\n", ok ? "ok" : "FAIL", what);
  if (!ok)
    failures++;
}

#endif /* BFO_TEST_CHECK_H */
