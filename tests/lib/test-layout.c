/* test-layout.c: layout policies through the public API: spec parsing, dir and refs
   grouping rules, the Apriori miner (maximal sets, support, many-file sets), trace formats.  */

#include <config.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bfo.h"

#include "check.h"

static char tmpl[] = "/tmp/test-layout.XXXXXX";

static const char *
write_trace (const char *text)
{
  static char path[64];
  snprintf (path, sizeof path, "%s/trace", tmpl);
  FILE *f = fopen (path, "w");
  fputs (text, f);
  fclose (f);
  return path;
}

/* The placement of PATHS (texts DATA, NULL for none) as "p1 p2 | p3" (groups by '|').  */
static char *
placed (const struct bfo_layout *l, const char *const *paths, const char *const *data, size_t n)
{
  struct bfo_layout_file f[64];
  size_t order[64];
  for (size_t i = 0; i < n; i++)
    f[i] = (struct bfo_layout_file) { paths[i], data ? data[i] : NULL,
                                      data && data[i] ? strlen (data[i]) : 0 };
  struct bfo_layout_group *g;
  size_t ng;
  static char out[4096];
  out[0] = '\0';
  if (bfo_layout_order (l, f, n, order, &g, &ng) < 0)
    return strcpy (out, "error");
  for (size_t k = 0; k < ng; k++)
    {
      if (k)
        strcat (out, " |");
      for (size_t j = g[k].first; j < g[k].first + g[k].count; j++)
        {
          strcat (out, j == g[k].first && !k ? "" : " ");
          strcat (out, paths[order[j]]);
        }
    }
  bfo_layout_groups_free (g, ng);
  printf ("  -> %s\n", out);
  return out;
}

int
main (void)
{
  if (!mkdtemp (tmpl))
    return 99;
  struct bfo_layout *l;

  check (bfo_layout_new (&l, "size", NULL) == -EINVAL, "an unknown policy is EINVAL");
  check (bfo_layout_new (&l, "trace=", NULL) == -EINVAL, "trace= needs a file");
  check (bfo_layout_new (&l, "trace=/nonexistent/t", NULL) == -ENOENT,
         "a missing trace is ENOENT");
  struct bfo_layout_opts bad = { .trace_support = 1.5 };
  check (bfo_layout_new (&l, "dir", &bad) == -EINVAL, "support above 100 % is EINVAL");
  double f = 0;
  check (bfo_layout_parse_support ("2.5", &f) == 0 && f == 0.025, "support 2.5 % is 0.025");
  check (bfo_layout_parse_support ("0", &f) == -EINVAL
         && bfo_layout_parse_support ("101", &f) == -EINVAL
         && bfo_layout_parse_support ("5x", &f) == -EINVAL
         && bfo_layout_parse_support ("", &f) == -EINVAL, "bad supports are EINVAL");

  /* walk and dir; the same path twice stays in add order, next to its first add.  */
  const char *p1[] = { "a/x", "b", "a/y", "c/z", "b", "a/sub/w" };
  check (bfo_layout_new (&l, "walk", NULL) == 0, "walk");
  check (strcmp (placed (l, p1, NULL, 6), "a/x b b a/y c/z a/sub/w") == 0,
         "walk: add order, a repeated path follows its first add");
  bfo_layout_free (l);
  check (bfo_layout_new (&l, "dir", NULL) == 0 && bfo_layout_policy (l) == BFO_LAYOUT_DIR, "dir");
  check (strcmp (placed (l, p1, NULL, 6), "a/x a/y | b b | c/z | a/sub/w") == 0,
         "dir: directories in first-seen order, subdirectories apart");
  bfo_layout_free (l);

  /* refs: first referrer in add order claims; no cycles; bare include names.  */
  const char *p2[] = { "a.html", "b.html", "img/1.png", "img/2.png", "lonely", "s/m.c",
                       "s/x.h", "inc/y.h" };
  const char *d2[] = { "<a href=\"b.html\"><img src=img/2.png>",
                       "<a HREF='a.html'><img src=\"img/1.png\"><img src=\"img/2.png\">",
                       NULL, NULL, NULL,
                       "#include \"x.h\"\n  #  include \"y.h\"\n#include <stdio.h>\n",
                       "#include \"../inc/y.h\"\n", "" };
  check (bfo_layout_new (&l, "refs", NULL) == 0, "refs");
  check (strcmp (placed (l, p2, d2, 8),
                 "a.html b.html img/1.png img/2.png | lonely | s/m.c s/x.h inc/y.h") == 0,
         "refs: a.html claims b.html and img/2.png, b.html img/1.png; m.c x.h and y.h");
  bfo_layout_free (l);

  /* trace (paths, blank lines end transactions): {c a d} 4 times, {e f} 3 times,
     {a b} once; 8 transactions, so 5 % is 1 (2 at least): {a b} is not frequent.  */
  char t1[512], *w = t1;
  for (const char *c = "cad|cad|ef|cda|ef|dca|ef|ab"; *c; c++)
    w += *c == '|' ? sprintf (w, "\n") : sprintf (w, "/srv/www/x/%c\n", *c);
  check (bfo_layout_new (&l, "trace=", NULL) == -EINVAL, "trace= alone");
  check (bfo_layout_new (&l, (char[128]) { 0 }, NULL) == -EINVAL, "empty spec");
  char spec[128];
  snprintf (spec, sizeof spec, "trace=%s", write_trace (t1));
  check (bfo_layout_new (&l, spec, NULL) == 0, "trace of paths");
  struct bfo_layout_trace_info ti;
  check (bfo_layout_trace_info (l, &ti) == 0 && strcmp (ti.format, "paths") == 0
         && ti.references == 20 && ti.transactions == 8 && ti.frequent_sets == 2,
         "20 references, 8 transactions, 2 maximal frequent sets");
  const char *p3[] = { "x/a", "x/b", "x/c", "x/d", "x/e", "x/f", "x/g" };
  check (strcmp (placed (l, p3, NULL, 7), "x/c x/a x/d | x/e x/f | x/b x/g") == 0,
         "sets in first-access order, members in first-access order, the rest after");
  bfo_layout_free (l);

  /* Higher support: {c a d} (4 of 8) stays, {e f} (3 of 8) goes.  */
  struct bfo_layout_opts o50 = { .trace_support = 0.5 };
  check (bfo_layout_new (&l, spec, &o50) == 0 && bfo_layout_trace_info (l, &ti) == 0
         && ti.frequent_sets == 1, "support 50 %: one set");
  bfo_layout_free (l);
  /* Mining batches of 9 references: the sets must be frequent within a batch.  */
  struct bfo_layout_opts ob = { .trace_batch_refs = 9 };
  check (bfo_layout_new (&l, spec, &ob) == 0 && bfo_layout_trace_info (l, &ti) == 0
         && ti.mining_batches == 3, "9-reference mining batches: 3 of them");
  bfo_layout_free (l);

  /* 200 files always used together: one set (identical transaction sets are one
     item), found without enumerating its subsets.  */
  char *big = malloc (200 * 16 * 4 + 16), *q = big;
  for (int r = 0; r < 4; r++)
    {
      for (int i = 0; i < 200; i++)
        q += sprintf (q, "/w/f%03d\n", i);
      q += sprintf (q, "\n");
    }
  snprintf (spec, sizeof spec, "trace=%s", write_trace (big));
  free (big);
  check (bfo_layout_new (&l, spec, NULL) == 0 && bfo_layout_trace_info (l, &ti) == 0
         && ti.frequent_sets == 1, "200 files used together: one frequent set");
  bfo_layout_free (l);

  /* strace without pids: windows of trace_window references.  */
  const char *t2 = "openat(AT_FDCWD, \"/p/a\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/b\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/\\x63\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/d\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/a\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/b\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/c\", O_RDONLY) = 3\n"
                   "openat(AT_FDCWD, \"/p/d\", O_RDONLY) = -1 ENOENT (No such file)\n";
  snprintf (spec, sizeof spec, "trace=%s", write_trace (t2));
  struct bfo_layout_opts ow = { .trace_window = 2 };
  check (bfo_layout_new (&l, spec, &ow) == 0 && bfo_layout_trace_info (l, &ti) == 0
         && strcmp (ti.format, "strace") == 0 && ti.references == 7 && ti.transactions == 4
         && ti.frequent_sets == 1,
         "strace, no pids: 7 references (failed open left out) in windows of 2");
  const char *p4[] = { "a", "b", "c", "d" };
  check (strcmp (placed (l, p4, NULL, 4), "a b | c d") == 0,
         "windows {a b} {c d} {a b} {c}: {a b} is the only frequent set");
  bfo_layout_free (l);

  /* Without a root the longest suffix that is a batch path: /p/a is p/a; with the
     root /p (given as "/p/"), exactly a.  */
  const char *p5[] = { "p/a", "p/b", "a", "b" };
  check (bfo_layout_new (&l, spec, &ow) == 0, "trace, no root");
  check (strcmp (placed (l, p5, NULL, 4), "p/a p/b | a b") == 0, "/p/a is p/a");
  bfo_layout_free (l);
  struct bfo_layout_opts or = { .trace_window = 2, .trace_root = "/p/" };
  check (bfo_layout_new (&l, spec, &or) == 0, "trace root");
  check (strcmp (placed (l, p5, NULL, 4), "a b | p/a p/b") == 0,
         "with the root /p, /p/a is exactly a");
  bfo_layout_free (l);

  snprintf (spec, sizeof spec, "%s/trace", tmpl);
  unlink (spec);
  rmdir (tmpl);
  return failures ? 1 : 0;
}
