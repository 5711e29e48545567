/* test-order.c: the ORDER_LIST sorts requests by physical address, splits long
   extents at max_io_bytes, orders delivery by first extent, counts sequential runs.  */

#include <config.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfo-int.h"

#include "check.h"

int
main (void)
{
  /* Three files: B lies before A on disk, C is two extents around A's; D failed.  */
  struct bfo_extent ea[] = { { 0, 40960, 8192 } };
  struct bfo_extent eb[] = { { 0, 4096, 4096 } };
  struct bfo_extent ec[] = { { 0, 8192, 4096 }, { 4096, 49152, 3 << 20 } };
  struct bfo_entry es[4];
  memset (es, 0, sizeof es);
  es[0].extents = ea, es[0].n_extents = 1;
  es[1].extents = eb, es[1].n_extents = 1;
  es[2].extents = ec, es[2].n_extents = 2;
  es[3].error = 5;
  struct bfo_request *rq;
  size_t n;
  check (bfo_order_build (es, 4, 1 << 20, &rq, &n) == 0, "builds");
  check (n == 1 + 1 + 1 + 3, "a 3 MiB extent is split into three 1 MiB requests");
  int sorted = 1;
  for (size_t i = 1; i < n; i++)
    sorted &= rq[i - 1].physical <= rq[i].physical;
  check (sorted, "requests are in physical order");
  check (rq[0].entry == 1 && rq[1].entry == 2 && rq[2].entry == 0,
         "B (4096), then C's first extent (8192), then A (40960)");
  check (rq[3].logical == 4096 && rq[4].logical == 4096 + (1 << 20),
         "split requests keep their logical offsets");
  check (es[1].first_physical == 4096 && es[2].first_physical == 8192
         && es[0].first_physical == 40960, "delivery follows each file's first request");
  /* B ends where C's first extent starts, A ends where C's big extent starts,
     and C's 1 MiB pieces follow each other.  */
  check (bfo_order_sequential (rq, n) == 4, "four requests start where the previous ended");
  free (rq);
  return failures ? 1 : 0;
}
