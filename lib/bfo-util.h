/* bfo-util.h: small helpers shared by the read and write halves of libbfo.  */

#ifndef BFO_UTIL_H
#define BFO_UTIL_H 1

#include <stdint.h>
#include <time.h>

/* X rounded up to a multiple of A.  */
static inline uint64_t
round_up (uint64_t x, uint64_t a)
{
  return (x + a - 1) / a * a;
}

/* The monotonic clock in microseconds and in milliseconds.  */
static inline uint64_t
now_us (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static inline uint64_t
now_ms (void)
{
  struct timespec ts;
  clock_gettime (CLOCK_MONOTONIC, &ts);
  return (uint64_t) ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

#endif /* BFO_UTIL_H */
