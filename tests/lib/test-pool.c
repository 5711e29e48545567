/* test-pool.c: the held-data pool carves aligned buffers from slabs, frees
   them from another thread, reuses empty slabs up to its keep and unmaps the
   rest, and hands large buffers out on their own; bfo_memory_limit is sane
   (tests/cp-batch.bats and tests/tar-create.bats run the programs under a
   memory cgroup).  */

#include <config.h>

#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bfo.h"

#include "check.h"

enum { N = 4096 };
static void *bufs[N];
static size_t lens[N];
static struct bfo_pool *pool;

static void *
free_odd (void *arg)
{
  (void) arg;
  for (int i = 1; i < N; i += 2)
    bfo_pool_free (pool, bufs[i], lens[i]);
  return NULL;
}

int
main (void)
{
  check (bfo_pool_new (&pool, 2 * BFO_POOL_SLAB) == 0, "a pool keeping two slabs");
  int aligned = 1, apart = 1;
  for (int i = 0; i < N; i++)
    {
      /* sizes 0..3 blocks and odd ones in between */
      lens[i] = (size_t) (i % 7) * 1500;
      bufs[i] = bfo_pool_alloc (pool, lens[i]);
      if (!bufs[i])
        break;
      memset (bufs[i], i & 0xff, lens[i]);
      uintptr_t a = (uintptr_t) bufs[i];
      aligned &= lens[i] >= 4096 ? a % 4096 == 0 : a % 16 == 0;
    }
  for (int i = 0; i < N && bufs[i]; i++)
    for (size_t k = 0; k < lens[i]; k++)
      if (((unsigned char *) bufs[i])[k] != (i & 0xff))
        apart = 0;
  check (bufs[N - 1] != NULL, "4096 buffers allocated");
  check (aligned, "buffers of a block or more start on a block, smaller ones on 16 bytes");
  check (apart, "no buffer overlaps another (each kept its own bytes)");

  pthread_t t;
  check (pthread_create (&t, NULL, free_odd, NULL) == 0 && pthread_join (t, NULL) == 0,
         "another thread frees half of them");
  for (int i = 0; i < N; i += 2)
    bfo_pool_free (pool, bufs[i], lens[i]);
  bfo_pool_free (pool, NULL, 0);

  /* Everything freed: new buffers come from the slabs kept.  */
  void *again[8];
  for (int i = 0; i < 8; i++)
    again[i] = bfo_pool_alloc (pool, BFO_POOL_MAX);
  void *large = bfo_pool_alloc (pool, BFO_POOL_MAX + 1);
  check (large && (uintptr_t) large % 4096 == 0, "a larger buffer, on a block boundary");
  bfo_pool_free (pool, large, BFO_POOL_MAX + 1);
  for (int i = 0; i < 8; i++)
    bfo_pool_free (pool, again[i], BFO_POOL_MAX);

  struct bfo_pool_stats st;
  bfo_pool_destroy (pool, &st);
  printf ("buffers %llu, large %llu, slabs mapped %llu, reused %llu, unmapped %llu\n",
          (unsigned long long) st.buffers, (unsigned long long) st.large,
          (unsigned long long) st.mapped, (unsigned long long) st.reused,
          (unsigned long long) st.unmapped);
  check (st.buffers == N + 8 && st.large == 1, "counts: slab buffers and the large one");
  check (st.mapped >= 3, "the 4096 buffers (about 24 MiB) took several slabs");
  check (st.reused >= 1, "a kept slab was taken again");
  check (st.mapped - st.unmapped <= 3,
         "slabs beyond the two kept (and the one being carved) were unmapped");

  /* The memory limit: at most the machine's memory, and more than nothing.  */
  long pages = sysconf (_SC_PHYS_PAGES), page = sysconf (_SC_PAGESIZE);
  uint64_t limit = bfo_memory_limit ();
  printf ("memory limit %llu bytes, physical %llu\n", (unsigned long long) limit,
          (unsigned long long) pages * (unsigned long long) page);
  check (limit > 0 && limit <= (uint64_t) pages * (uint64_t) page,
         "bfo_memory_limit is within the machine's memory");
  return failures ? 1 : 0;
}
