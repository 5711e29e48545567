/* order.c: the ORDER_LIST: every extent of a batch as a read request, sorted by
   physical address, long extents split at max_io_bytes (BFOr "order" layer).  */

#include <config.h>

#include "bfo-int.h"

#include <errno.h>
#include <stdlib.h>

static int
by_physical (const void *a, const void *b)
{
  const struct bfo_request *x = a, *y = b;
  if (x->physical != y->physical)
    return x->physical < y->physical ? -1 : 1;
  return x->entry < y->entry ? -1 : x->entry > y->entry;
}

/* Requests for the entries that read through the fast path (no fallback, not
   streamed), sorted by physical address.  Extents already joined per file in
   map.c; what the block layer can merge further are neighbours across files,
   which sorting puts next to each other in one submission.  */
int
bfo_order_build (struct bfo_entry *entries, size_t n, uint64_t max_io_bytes,
                 struct bfo_request **requests, size_t *n_requests)
{
  size_t count = 0;
  for (size_t i = 0; i < n; i++)
    if (!entries[i].error && !entries[i].fallback && !entries[i].large)
      {
        for (size_t k = 0; k < entries[i].n_extents; k++)
          count += (entries[i].extents[k].length + max_io_bytes - 1) / max_io_bytes;
        if (entries[i].cached)
          count += ((uint64_t) entries[i].st.st_size + max_io_bytes - 1) / max_io_bytes;
      }
  struct bfo_request *r = malloc ((count ? count : 1) * sizeof *r);
  if (!r)
    return -ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < n; i++)
    {
      struct bfo_entry *e = &entries[i];
      if (e->error || e->fallback || e->large)
        continue;
      /* A file in the page cache: its whole length from the start, first (at
         physical 0), as the disk is not involved.  */
      for (uint64_t off = 0; e->cached && off < (uint64_t) e->st.st_size; off += max_io_bytes)
        {
          uint64_t len = e->st.st_size - off < max_io_bytes ? e->st.st_size - off : max_io_bytes;
          r[m++] = (struct bfo_request) { (uint32_t) i, off, 0, len };
        }
      for (size_t k = 0; k < e->n_extents; k++)
        {
          const struct bfo_extent *x = &e->extents[k];
          for (uint64_t off = 0; off < x->length; off += max_io_bytes)
            {
              uint64_t len = x->length - off < max_io_bytes ? x->length - off : max_io_bytes;
              r[m++] = (struct bfo_request) { (uint32_t) i, x->logical + off,
                                              x->physical + off, len };
            }
        }
    }
  qsort (r, m, sizeof *r, by_physical);
  /* Delivery follows the physical order of each file's first request.  */
  for (size_t j = m; j-- > 0;)
    entries[r[j].entry].first_physical = r[j].physical;
  *requests = r;
  *n_requests = m;
  return 0;
}

/* How many requests start exactly where the previous one ended: what the device
   sees as sequential once the block layer has merged a sorted submission.  */
uint64_t
bfo_order_sequential (const struct bfo_request *requests, size_t n)
{
  uint64_t seq = 0;
  for (size_t i = 1; i < n; i++)
    if (requests[i].physical == requests[i - 1].physical + requests[i - 1].length)
      seq++;
  return seq;
}
