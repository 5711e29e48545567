/* test-journal.c: the batch writer's journal survives a round trip, its checksum catches
   any flipped byte, another version is refused, and the stem's commit record is seen.  */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bfo-write-int.h"

#include "check.h"

int
main (void)
{
  check (bfo_crc32 (0, "123456789", 9) == 0xCBF43926u, "CRC32 of the standard check string");

  struct bfo_jentry es[3] = {
    { "a.txt", 0, 5, { BFO_ATTR_MODE | BFO_ATTR_MTIME, 0644, 0, 0, { 0, 0 }, { 1234567890, 123456789 } } },
    { "dir/sub/\xc3\xbcnicode name", 4096, 0, { 0, 0, 0, 0, { 0, 0 }, { 0, 0 } } },
    { "big", 8192, 3 << 20, { BFO_ATTR_OWNER | BFO_ATTR_ATIME, 0, 1000, (gid_t) -1,
                              { -5, 999999999 }, { 0, 0 } } },
  };
  struct bfo_journal j = { .version = BFO_JOURNAL_VERSION, .backend = BFO_BACKEND_REFLINK,
                           .pid = 4242, .align = 4096, .seq = 7,
                           .stem_bytes = 8192 + (3 << 20), .n = 3, .entries = es };
  unsigned char *buf;
  size_t len;
  check (bfo_journal_encode (&j, &buf, &len) == 0, "encodes");

  struct bfo_journal d;
  int r = bfo_journal_decode (buf, len, &d);
  check (r == 0, "decodes what it encoded");
  int same = r == 0 && d.n == 3 && d.pid == 4242 && d.seq == 7 && d.align == 4096
             && d.backend == BFO_BACKEND_REFLINK && d.stem_bytes == j.stem_bytes
             && !d.stem_durable;
  for (size_t i = 0; same && i < 3; i++)
    same = strcmp (d.entries[i].path, es[i].path) == 0
           && d.entries[i].stem_off == es[i].stem_off && d.entries[i].len == es[i].len
           && d.entries[i].attrs.flags == es[i].attrs.flags
           && d.entries[i].attrs.mode == es[i].attrs.mode
           && d.entries[i].attrs.uid == es[i].attrs.uid
           && d.entries[i].attrs.gid == es[i].attrs.gid
           && d.entries[i].attrs.atime.tv_sec == es[i].attrs.atime.tv_sec
           && d.entries[i].attrs.atime.tv_nsec == es[i].attrs.atime.tv_nsec
           && d.entries[i].attrs.mtime.tv_sec == es[i].attrs.mtime.tv_sec
           && d.entries[i].attrs.mtime.tv_nsec == es[i].attrs.mtime.tv_nsec;
  check (same, "every field survives the round trip, stem not yet durable");
  if (r == 0)
    bfo_journal_free (&d);

  /* Every single flipped byte is caught: by the magic, the version, or the checksum.  */
  int caught = 1;
  for (size_t i = 0; i < len; i++)
    {
      buf[i] ^= 0x20;
      r = bfo_journal_decode (buf, len, &d);
      if (r == 0)
        {
          bfo_journal_free (&d);
          caught = 0;
        }
      buf[i] ^= 0x20;
    }
  check (caught, "a flipped byte anywhere is refused");
  buf[len / 2] ^= 1;
  check (bfo_journal_decode (buf, len, &d) == -EBADMSG, "a flipped data byte is -EBADMSG");
  buf[len / 2] ^= 1;

  check (bfo_journal_decode (buf, len - 1, &d) == -EBADMSG, "a truncated journal is -EBADMSG");

  /* Version 2 with a checksum that matches: refused for its version.  */
  unsigned char *v2 = malloc (len);
  memcpy (v2, buf, len);
  v2[8] = 2;
  uint32_t crc = bfo_crc32 (0, v2, len - 4);
  for (int i = 0; i < 4; i++)
    v2[len - 4 + i] = crc >> (8 * i);
  check (bfo_journal_decode (v2, len, &d) == -ENOTSUP, "another version is refused (-ENOTSUP)");
  free (v2);

  /* The commit record marks the stem durable; a torn one does not.  */
  unsigned char *withc = malloc (len + BFO_JOURNAL_COMMIT_BYTES);
  memcpy (withc, buf, len);
  bfo_journal_encode_commit (&j, withc + len);
  r = bfo_journal_decode (withc, len + BFO_JOURNAL_COMMIT_BYTES, &d);
  check (r == 0 && d.stem_durable, "the commit record marks the stem durable");
  if (r == 0)
    bfo_journal_free (&d);
  r = bfo_journal_decode (withc, len + BFO_JOURNAL_COMMIT_BYTES - 1, &d);
  check (r == 0 && !d.stem_durable, "a torn commit record does not");
  if (r == 0)
    bfo_journal_free (&d);
  withc[len + 10] ^= 1;
  r = bfo_journal_decode (withc, len + BFO_JOURNAL_COMMIT_BYTES, &d);
  check (r == 0 && !d.stem_durable, "nor does a commit record of another batch");
  if (r == 0)
    bfo_journal_free (&d);
  free (withc);

  /* A journal naming a path the writer refuses, or a range outside its stem, is refused
     even with a valid checksum.  */
  struct bfo_jentry bad[1] = { { "../escape", 0, 1, { 0 } } };
  struct bfo_journal jb = j;
  jb.n = 1;
  jb.entries = bad;
  free (buf);
  check (bfo_journal_encode (&jb, &buf, &len) == 0
         && bfo_journal_decode (buf, len, &d) == -EBADMSG, "a '..' path is refused");
  free (buf);
  bad[0] = (struct bfo_jentry) { "x", j.stem_bytes, 1, { 0 } };
  check (bfo_journal_encode (&jb, &buf, &len) == 0
         && bfo_journal_decode (buf, len, &d) == -EBADMSG, "a range past the stem is refused");
  free (buf);

  char name[BFO_NAME_MAX];
  uint32_t pid;
  uint64_t seq;
  bfo_helper_name (name, BFO_JOURNAL_PREFIX, 4242, 7);
  check (strcmp (name, ".bfo-journal.4242.7") == 0
         && bfo_helper_parse (name, BFO_JOURNAL_PREFIX, &pid, &seq) && pid == 4242 && seq == 7,
         "helper names parse back");
  check (!bfo_helper_parse (".bfo-journal.42x.7", BFO_JOURNAL_PREFIX, &pid, &seq)
         && !bfo_helper_parse (".bfo-journal.42.7.new", BFO_JOURNAL_PREFIX, &pid, &seq)
         && !bfo_helper_parse (".bfo-stem.42.7", BFO_JOURNAL_PREFIX, &pid, &seq),
         "other names do not");
  return failures ? 1 : 0;
}
