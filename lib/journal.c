/* journal.c: the batch writer's journal: a batch's ORDER_LIST (targets, stem offsets,
   lengths, attributes), versioned and CRC32-checked, fsync'd before any data is written.  */

#include <config.h>

#include "bfo-write-int.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* On-disk layout, little-endian:
     header (80 bytes; 64 before version 3): magic "BFOJRNL\n", u32 version,
       u32 header bytes (80; 64), u32 backend, u32 pid, u32 align, u32 flags
       (version 2; 0 in 1), u64 seq, u64 stem bytes, u64 entries, u64 total
       bytes (header + entries + checksum), and from version 3: i64 start s,
       u32 start ns (the journal file's creation time, by the file system's
       clock: every target the batch makes is changed at or after it), u32 0
     per entry: u64 stem offset (in a direct batch, BFO_JOURNAL_DIRECT, and
       from version 4 for an entry with BFO_JENTRY_CRC among its attribute
       flags: the CRC32C of the file's data, which the stem does not hold), u64
       length, u32 attribute flags, u32 mode,
       u32 uid, u32 gid, i64 atime s, u32 atime ns, i64 mtime s, u32 mtime ns,
       u32 path length, the path (no NUL)
     u32 CRC32 (IEEE) of everything before it
   then, once the stem is fsync'd, the commit record (28 bytes): magic
   "BFOCOMIT", u64 seq, u64 stem bytes, u32 CRC32 of the first 24 bytes.  */

#define HEADER_BYTES 80u
#define HEADER_BYTES_V2 64u     /* versions 1 and 2 */
#define ENTRY_FIXED_BYTES 60u
static const char journal_magic[8] = { 'B', 'F', 'O', 'J', 'R', 'N', 'L', '\n' };
static const char commit_magic[8] = { 'B', 'F', 'O', 'C', 'O', 'M', 'I', 'T' };

/* A journal is ~80 bytes per file, 300 KiB for a batch of 4096: bitwise, its CRC
   was 1.7 % of bfo write's CPU time (131072 4 KiB files onto ext4); through a
   table it is an eighth of that.  */
static uint32_t crc32_table[256], crc32c_table[256];

/* The byte table of the reflected CRC with polynomial POLY.  */
static void
crc_table (uint32_t table[256], uint32_t poly)
{
  for (uint32_t i = 0; i < 256; i++)
    {
      uint32_t c = i;
      for (int k = 0; k < 8; k++)
        c = (c >> 1) ^ (poly & -(c & 1));
      table[i] = c;
    }
}

static void
crc32_init (void)
{
  crc_table (crc32_table, 0xEDB88320u);
}

uint32_t
bfo_crc32 (uint32_t crc, const void *buf, size_t len)
{
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once (&once, crc32_init);
  const unsigned char *p = buf;
  crc = ~crc;
  while (len--)
    crc = crc32_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return ~crc;
}

/* CRC32C (Castagnoli) of a direct batch's file data, which recovery checks: with
   the SSE 4.2 instruction where the CPU has it (a 4 KiB file: ~0.3 us), else
   through a table.  */
static void
crc32c_init (void)
{
  crc_table (crc32c_table, 0x82F63B78u);
}

static uint32_t
crc32c_soft (uint32_t crc, const unsigned char *p, size_t len)
{
  static pthread_once_t once = PTHREAD_ONCE_INIT;
  pthread_once (&once, crc32c_init);
  while (len--)
    crc = crc32c_table[(crc ^ *p++) & 0xff] ^ (crc >> 8);
  return crc;
}

#if defined __x86_64__ && defined __GNUC__
__attribute__ ((target ("sse4.2"))) static uint32_t
crc32c_sse42 (uint32_t crc, const unsigned char *p, size_t len)
{
  uint64_t c = crc;
  for (; len >= 8; p += 8, len -= 8)
    {
      uint64_t v;
      memcpy (&v, p, 8);
      c = __builtin_ia32_crc32di (c, v);
    }
  uint32_t c32 = (uint32_t) c;
  for (; len; p++, len--)
    c32 = __builtin_ia32_crc32qi (c32, *p);
  return c32;
}
#endif

uint32_t
bfo_crc32c (uint32_t crc, const void *buf, size_t len)
{
  crc = ~crc;
#if defined __x86_64__ && defined __GNUC__
  if (__builtin_cpu_supports ("sse4.2"))
    return ~crc32c_sse42 (crc, buf, len);
#endif
  return ~crc32c_soft (crc, buf, len);
}

static unsigned char *
put32 (unsigned char *p, uint32_t v)
{
  for (int i = 0; i < 4; i++)
    *p++ = v >> (8 * i);
  return p;
}

static unsigned char *
put64 (unsigned char *p, uint64_t v)
{
  for (int i = 0; i < 8; i++)
    *p++ = v >> (8 * i);
  return p;
}

static uint32_t
get32 (const unsigned char *p)
{
  uint32_t v = 0;
  for (int i = 0; i < 4; i++)
    v |= (uint32_t) p[i] << (8 * i);
  return v;
}

static uint64_t
get64 (const unsigned char *p)
{
  uint64_t v = 0;
  for (int i = 0; i < 8; i++)
    v |= (uint64_t) p[i] << (8 * i);
  return v;
}

int
bfo_journal_encode (const struct bfo_journal *j, unsigned char **bufp, size_t *lenp)
{
  /* (older versions only for the tests that read them)  */
  uint32_t version = j->version ? j->version : BFO_JOURNAL_VERSION;
  uint32_t header = version >= 3 ? HEADER_BYTES : HEADER_BYTES_V2;
  size_t total = header + 4;
  for (size_t i = 0; i < j->n; i++)
    {
      if (j->entries[i].crc && version < 4)
        return -EINVAL;
      total += ENTRY_FIXED_BYTES + strlen (j->entries[i].path);
    }
  unsigned char *buf = malloc (total), *p = buf;
  if (!buf)
    return -ENOMEM;
  memcpy (p, journal_magic, 8);
  p += 8;
  p = put32 (p, version);
  p = put32 (p, header);
  p = put32 (p, j->backend);
  p = put32 (p, j->pid);
  p = put32 (p, j->align);
  p = put32 (p, j->flags);
  p = put64 (p, j->seq);
  p = put64 (p, j->stem_bytes);
  p = put64 (p, j->n);
  p = put64 (p, total);
  if (version >= 3)
    {
      p = put64 (p, (uint64_t) j->start.tv_sec);
      p = put32 (p, (uint32_t) j->start.tv_nsec);
      p = put32 (p, 0);
    }
  for (size_t i = 0; i < j->n; i++)
    {
      const struct bfo_jentry *e = &j->entries[i];
      size_t plen = strlen (e->path);
      p = put64 (p, e->stem_off);
      p = put64 (p, e->len);
      p = put32 (p, e->attrs.flags | (e->crc ? BFO_JENTRY_CRC : 0));
      p = put32 (p, e->attrs.mode);
      p = put32 (p, e->attrs.uid);
      p = put32 (p, e->attrs.gid);
      p = put64 (p, (uint64_t) e->attrs.atime.tv_sec);
      p = put32 (p, (uint32_t) e->attrs.atime.tv_nsec);
      p = put64 (p, (uint64_t) e->attrs.mtime.tv_sec);
      p = put32 (p, (uint32_t) e->attrs.mtime.tv_nsec);
      p = put32 (p, plen);
      memcpy (p, e->path, plen);
      p += plen;
    }
  p = put32 (p, bfo_crc32 (0, buf, total - 4));
  *bufp = buf;
  *lenp = total;
  return 0;
}

void
bfo_journal_encode_commit (const struct bfo_journal *j, unsigned char out[BFO_JOURNAL_COMMIT_BYTES])
{
  memcpy (out, commit_magic, 8);
  put64 (out + 8, j->seq);
  put64 (out + 16, j->stem_bytes);
  put32 (out + 24, bfo_crc32 (0, out, 24));
}

void
bfo_journal_free (struct bfo_journal *j)
{
  for (size_t i = 0; i < j->n; i++)
    free (j->entries[i].path);
  free (j->entries);
  j->entries = NULL;
  j->n = 0;
}

int
bfo_journal_decode (const unsigned char *buf, size_t len, struct bfo_journal *j)
{
  memset (j, 0, sizeof *j);
  if (len < HEADER_BYTES_V2 + 4 || memcmp (buf, journal_magic, 8) != 0)
    return -EBADMSG;
  /* Another version may lay out everything after the version differently.  */
  j->version = get32 (buf + 8);
  if (j->version < 1 || j->version > BFO_JOURNAL_VERSION)
    return -ENOTSUP;
  uint32_t header = j->version >= 3 ? HEADER_BYTES : HEADER_BYTES_V2;
  uint64_t total = get64 (buf + 56);
  if (get32 (buf + 12) != header || total < header + 4 || total > len)
    return -EBADMSG;
  if (bfo_crc32 (0, buf, total - 4) != get32 (buf + total - 4))
    return -EBADMSG;
  j->backend = get32 (buf + 16);
  j->pid = get32 (buf + 20);
  j->align = get32 (buf + 24);
  j->flags = j->version >= 2 ? get32 (buf + 28) : 0;
  if (j->flags & ~BFO_JOURNAL_DIRECT)
    return -ENOTSUP;
  if ((j->flags & BFO_JOURNAL_DIRECT) && get64 (buf + 40) != 0)
    return -EBADMSG;            /* a direct batch has no stem */
  j->seq = get64 (buf + 32);
  j->stem_bytes = get64 (buf + 40);
  if (j->version >= 3)
    {
      j->start.tv_sec = (int64_t) get64 (buf + 64);
      j->start.tv_nsec = get32 (buf + 72);
      if (j->start.tv_nsec >= 1000000000 || get32 (buf + 76) != 0)
        return -EBADMSG;
    }
  uint64_t n = get64 (buf + 48);
  if (n > (total - header) / ENTRY_FIXED_BYTES)
    return -EBADMSG;
  j->entries = calloc (n ? n : 1, sizeof *j->entries);
  if (!j->entries)
    return -ENOMEM;
  const unsigned char *p = buf + header, *end = buf + total - 4;
  for (j->n = 0; j->n < n; j->n++)
    {
      struct bfo_jentry *e = &j->entries[j->n];
      if ((size_t) (end - p) < ENTRY_FIXED_BYTES)
        goto bad;
      e->stem_off = get64 (p);
      e->len = get64 (p + 8);
      e->attrs.flags = get32 (p + 16);
      e->crc = e->attrs.flags & BFO_JENTRY_CRC;
      e->attrs.flags &= ~BFO_JENTRY_CRC;
      if (e->crc && j->version < 4)
        goto bad;
      e->attrs.mode = get32 (p + 20);
      e->attrs.uid = get32 (p + 24);
      e->attrs.gid = get32 (p + 28);
      e->attrs.atime.tv_sec = (int64_t) get64 (p + 32);
      e->attrs.atime.tv_nsec = get32 (p + 40);
      e->attrs.mtime.tv_sec = (int64_t) get64 (p + 44);
      e->attrs.mtime.tv_nsec = get32 (p + 52);
      uint32_t plen = get32 (p + 56);
      p += ENTRY_FIXED_BYTES;
      if ((size_t) (end - p) < plen)
        goto bad;
      e->path = malloc (plen + 1);
      if (!e->path)
        {
          bfo_journal_free (j);
          return -ENOMEM;
        }
      memcpy (e->path, p, plen);
      e->path[plen] = '\0';
      p += plen;
      /* A journal is trusted only as far as it names files the writer could have
         named, and ranges inside its stem.  */
      if (strlen (e->path) != plen || bfo_wpath_check (e->path) < 0
          || (j->stem_bytes && e->len && !e->crc
              && (e->stem_off > j->stem_bytes || e->len > j->stem_bytes - e->stem_off)))
        {
          j->n++;
          goto bad;
        }
    }
  if (p != end)
    goto bad;
  if (len - total >= BFO_JOURNAL_COMMIT_BYTES)
    {
      unsigned char want[BFO_JOURNAL_COMMIT_BYTES];
      bfo_journal_encode_commit (j, want);
      j->stem_durable = memcmp (buf + total, want, BFO_JOURNAL_COMMIT_BYTES) == 0;
    }
  return 0;
 bad:
  bfo_journal_free (j);
  return -EBADMSG;
}

void
bfo_helper_name (char *buf, const char *prefix, uint32_t pid, uint64_t seq)
{
  snprintf (buf, BFO_NAME_MAX, "%s%u.%llu", prefix, (unsigned) pid, (unsigned long long) seq);
}

uint64_t
bfo_seq_base (void)
{
  uint32_t r;
  if (getrandom (&r, sizeof r, GRND_NONBLOCK) != (ssize_t) sizeof r)
    {
      struct timespec ts;
      clock_gettime (CLOCK_MONOTONIC, &ts);
      r = (uint32_t) (ts.tv_nsec ^ ts.tv_sec ^ ((uint64_t) getpid () << 12)
                      ^ (uintptr_t) &ts);
    }
  return (uint64_t) (r & 0x7fffffff) << 32;
}

int
bfo_helper_claim (int dirfd, const char *name, int *lock)
{
  *lock = -1;
  int fd = openat (dirfd, name, O_RDWR | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0 && (errno == EACCES || errno == EROFS || errno == EPERM))
    fd = openat (dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return -errno;
  if (flock (fd, LOCK_EX | LOCK_NB) < 0)
    {
      int e = errno;
      close (fd);
      return e == EWOULDBLOCK ? 1 : -e;
    }
  /* Removed by its writer, done, between the open and the lock.  */
  struct stat st;
  if (fstat (fd, &st) < 0 || st.st_nlink == 0)
    {
      close (fd);
      return -ENOENT;
    }
  *lock = fd;
  return 0;
}

void
bfo_tmp_name (char *buf, uint32_t pid, uint64_t seq, size_t idx)
{
  snprintf (buf, BFO_NAME_MAX, "%s%u.%llu.%zu", BFO_TMP_PREFIX, (unsigned) pid,
            (unsigned long long) seq, idx);
}

static bool
parse_number (const char **s, uint64_t *v, uint64_t max)
{
  const char *p = *s;
  uint64_t x = 0;
  if (*p < '0' || *p > '9')
    return false;
  for (; *p >= '0' && *p <= '9'; p++)
    {
      if (x > (max - (*p - '0')) / 10)
        return false;
      x = x * 10 + (*p - '0');
    }
  *s = p;
  *v = x;
  return true;
}

bool
bfo_helper_parse (const char *name, const char *prefix, uint32_t *pid, uint64_t *seq)
{
  size_t k = strlen (prefix);
  if (strncmp (name, prefix, k) != 0)
    return false;
  const char *p = name + k;
  uint64_t v;
  if (!parse_number (&p, &v, UINT32_MAX) || *p != '.')
    return false;
  *pid = v;
  p++;
  if (!seq)
    return *p != '\0';
  return parse_number (&p, seq, UINT64_MAX) && *p == '\0';
}

static int
write_all (int fd, const unsigned char *buf, size_t len)
{
  while (len)
    {
      ssize_t k = write (fd, buf, len);
      if (k < 0)
        {
          if (errno == EINTR)
            continue;
          return -errno;
        }
      buf += k;
      len -= k;
    }
  return 0;
}

/* Create DIRFD/NAME and take its lock, the sign that its writer runs (see
   bfo_helper_claim).  A recovery that took the lock between the create and
   ours removes the file: then it is made again.  */
static int
create_locked (int dirfd, const char *name)
{
  for (int tries = 0;; tries++)
    {
      int fd = openat (dirfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
      if (fd < 0)
        return -errno;
      /* (blocking: a recovery holds it only to remove the file) */
      while (flock (fd, LOCK_EX) < 0 && errno == EINTR)
        continue;
      struct stat st;
      if (fstat (fd, &st) < 0)
        {
          int e = -errno;
          close (fd);
          unlinkat (dirfd, name, 0);
          return e;
        }
      if (st.st_nlink > 0 || tries == 3)
        return st.st_nlink > 0 ? fd : (close (fd), -ESTALE);
      close (fd);
    }
}

/* Write J as DIRFD/.bfo-jtmp.PID.SEQ, fsync'd when SYNC; on failure nothing is
   left.  The descriptor, which holds the journal's lock, goes to *LOCK: to be
   closed once the journal is removed.  */
static int
write_jtmp (int dirfd, const struct bfo_journal *j, bool sync, int *lock)
{
  char tmp[BFO_NAME_MAX];
  bfo_helper_name (tmp, BFO_JTMP_PREFIX, j->pid, j->seq);
  int fd = create_locked (dirfd, tmp);
  if (fd < 0)
    return fd;
  /* The batch starts when its journal is made, by the file system's clock and
     granularity: what recovery compares the targets' ctimes with (not the
     journal's mtime, which a copy of it would not keep).  */
  struct bfo_journal jj = *j;
  struct stat st;
  int ret = fstat (fd, &st) < 0 ? -errno : 0;
  unsigned char *buf = NULL;
  size_t len;
  if (ret == 0)
    {
      jj.start = st.st_mtim;
      ret = bfo_journal_encode (&jj, &buf, &len);
    }
  if (ret == 0)
    ret = write_all (fd, buf, len);
  free (buf);
  if (ret == 0 && sync && fsync (fd) < 0)
    ret = -errno;
  if (ret < 0)
    {
      unlinkat (dirfd, tmp, 0);
      close (fd);
    }
  else
    *lock = fd;
  return ret;
}

int
bfo_journal_write (int dirfd, const struct bfo_journal *j, int *lock)
{
  char name[BFO_NAME_MAX];
  bfo_helper_name (name, BFO_JOURNAL_PREFIX, j->pid, j->seq);
  int ret = bfo_journal_write_ordered (dirfd, j, lock);
  if (ret < 0)
    return ret;
  if (fsync (dirfd) < 0)
    {
      ret = -errno;
      unlinkat (dirfd, name, 0);
      close (*lock), *lock = -1;
    }
  return ret;
}

int
bfo_journal_write_deferred (int dirfd, const struct bfo_journal *j, int *lock)
{
  return write_jtmp (dirfd, j, false, lock);
}

int
bfo_journal_write_ordered (int dirfd, const struct bfo_journal *j, int *lock)
{
  int ret = write_jtmp (dirfd, j, true, lock);
  if (ret < 0)
    return ret;
  ret = bfo_journal_publish (dirfd, j);
  if (ret < 0)
    {
      char tmp[BFO_NAME_MAX];
      bfo_helper_name (tmp, BFO_JTMP_PREFIX, j->pid, j->seq);
      unlinkat (dirfd, tmp, 0);
      close (*lock), *lock = -1;
    }
  return ret;
}

int
bfo_journal_publish (int dirfd, const struct bfo_journal *j)
{
  char tmp[BFO_NAME_MAX], name[BFO_NAME_MAX];
  bfo_helper_name (tmp, BFO_JTMP_PREFIX, j->pid, j->seq);
  bfo_helper_name (name, BFO_JOURNAL_PREFIX, j->pid, j->seq);
  return renameat (dirfd, tmp, dirfd, name) < 0 ? -errno : 0;
}

int
bfo_journal_commit_stem (int dirfd, const struct bfo_journal *j)
{
  char name[BFO_NAME_MAX];
  unsigned char rec[BFO_JOURNAL_COMMIT_BYTES];
  bfo_helper_name (name, BFO_JOURNAL_PREFIX, j->pid, j->seq);
  bfo_journal_encode_commit (j, rec);
  int fd = openat (dirfd, name, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0)
    return -errno;
  int ret = write_all (fd, rec, sizeof rec);
  if (ret == 0 && fsync (fd) < 0)
    ret = -errno;
  if (close (fd) < 0 && ret == 0)
    ret = -errno;
  return ret;
}

/* Journals hold ~60 bytes and a path per file; anything this big is not one of ours.  */
#define JOURNAL_MAX_BYTES (256ull << 20)

int
bfo_journal_read (int dirfd, const char *name, struct bfo_journal *j)
{
  memset (j, 0, sizeof *j);
  int fd = openat (dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
  if (fd < 0)
    return -errno;
  struct stat st;
  int ret = 0;
  if (fstat (fd, &st) < 0)
    ret = -errno;
  else if (!S_ISREG (st.st_mode) || (uint64_t) st.st_size > JOURNAL_MAX_BYTES)
    ret = -EBADMSG;
  unsigned char *buf = NULL;
  size_t got = 0;
  if (ret == 0 && !(buf = malloc (st.st_size ? st.st_size : 1)))
    ret = -ENOMEM;
  while (ret == 0 && got < (size_t) st.st_size)
    {
      ssize_t k = pread (fd, buf + got, st.st_size - got, got);
      if (k < 0 && errno == EINTR)
        continue;
      if (k < 0)
        ret = -errno;
      else if (k == 0)
        break;
      else
        got += k;
    }
  close (fd);
  if (ret == 0)
    ret = bfo_journal_decode (buf, got, j);
  free (buf);
  return ret;
}
