/* layout.c: layout policies (walk, dir, refs, trace=FILE): which files of a batch are
   placed next to each other, and why; the trace policy mines co-access sets with Apriori.  */

#include <config.h>

#include "bfo.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/types.h>

/* Defaults of the trace policy, as in the CFFS work: a set is frequent when it
   is in 5 % of the transactions of a mining batch of 50,000 references.  */
#define LAYOUT_DEFAULT_SUPPORT 0.05
#define LAYOUT_DEFAULT_BATCH_REFS 50000u
/* Transaction size where the trace marks no boundaries (a plain path list
   without blank lines, strace output without pids): a window of consecutive
   references about the size of a page with its assets or a compile's headers.  */
#define LAYOUT_DEFAULT_WINDOW 16u
/* Apriori stops going to larger sets when one level has more candidates than
   this (the sets found so far are kept): a trace where hundreds of files are
   always used together is collapsed before mining (identical transaction sets
   are one item), so only pathological traces reach it.  */
#define LAYOUT_MAX_CANDIDATES 20000u
/* refs reads at most this much of a file for references.  */
#define LAYOUT_REFS_SCAN_BYTES (1u << 20)

/* ------------------------------------------------------------------ strings */

static uint64_t
hash_bytes (const char *s, size_t len)
{
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < len; i++)
    h = (h ^ (unsigned char) s[i]) * 1099511628211ull;
  return h;
}

/* An open-addressing map from strings (not owned) to indexes.  */
struct strmap
{
  const char **key;
  size_t *keylen;
  size_t *val;
  size_t cap, n;
};

static int
strmap_init (struct strmap *m, size_t want)
{
  size_t cap = 16;
  while (cap < 2 * want + 16)
    cap *= 2;
  m->key = calloc (cap, sizeof *m->key);
  m->keylen = calloc (cap, sizeof *m->keylen);
  m->val = calloc (cap, sizeof *m->val);
  m->cap = cap;
  m->n = 0;
  if (!m->key || !m->keylen || !m->val)
    {
      free (m->key);
      free (m->keylen);
      free (m->val);
      return -ENOMEM;
    }
  return 0;
}

static void
strmap_free (struct strmap *m)
{
  free (m->key);
  free (m->keylen);
  free (m->val);
}

static size_t
strmap_slot (const struct strmap *m, const char *s, size_t len)
{
  size_t i = hash_bytes (s, len) & (m->cap - 1);
  while (m->key[i] && (m->keylen[i] != len || memcmp (m->key[i], s, len) != 0))
    i = (i + 1) & (m->cap - 1);
  return i;
}

/* The value of S[0..LEN), or SIZE_MAX.  */
static size_t
strmap_get (const struct strmap *m, const char *s, size_t len)
{
  size_t i = strmap_slot (m, s, len);
  return m->key[i] ? m->val[i] : SIZE_MAX;
}

static int
strmap_grow (struct strmap *m)
{
  struct strmap g;
  if (strmap_init (&g, m->cap) < 0)
    return -ENOMEM;
  for (size_t i = 0; i < m->cap; i++)
    if (m->key[i])
      {
        size_t j = strmap_slot (&g, m->key[i], m->keylen[i]);
        g.key[j] = m->key[i];
        g.keylen[j] = m->keylen[i];
        g.val[j] = m->val[i];
        g.n++;
      }
  strmap_free (m);
  *m = g;
  return 0;
}

/* Insert S -> V unless S is there; *OLD gets the value there (or V).  */
static int
strmap_put (struct strmap *m, const char *s, size_t len, size_t v, size_t *old)
{
  if (2 * (m->n + 1) > m->cap && strmap_grow (m) < 0)
    return -ENOMEM;
  size_t i = strmap_slot (m, s, len);
  if (!m->key[i])
    {
      m->key[i] = s;
      m->keylen[i] = len;
      m->val[i] = v;
      m->n++;
    }
  if (old)
    *old = m->val[i];
  return 0;
}

/* Normalize the relative path P in place: no empty or '.' components; '..'
   removes the previous one.  Returns false when '..' would leave the root.  */
static bool
normalize_path (char *p)
{
  char *out = p, *in = p;
  while (*in)
    {
      char *slash = strchr (in, '/');
      size_t k = slash ? (size_t) (slash - in) : strlen (in);
      char *next = in + k + (slash != NULL);
      if (k == 0 || (k == 1 && in[0] == '.'))
        ;
      else if (k == 2 && in[0] == '.' && in[1] == '.')
        {
          if (out == p)
            return false;
          while (out > p && out[-1] != '/')
            out--;
          if (out > p)
            out--;
        }
      else
        {
          /* OUT never passes IN: each component moves left or stays.  */
          if (out > p)
            *out++ = '/';
          memmove (out, in, k);
          out += k;
        }
      in = next;
    }
  *out = '\0';
  return true;
}

static char *
path_join (const char *dir, size_t dirlen, const char *rel, size_t rellen)
{
  char *s = malloc (dirlen + rellen + 2);
  if (!s)
    return NULL;
  memcpy (s, dir, dirlen);
  size_t k = dirlen;
  if (k)
    s[k++] = '/';
  memcpy (s + k, rel, rellen);
  s[k + rellen] = '\0';
  return s;
}

static size_t
dir_len (const char *path)
{
  const char *slash = strrchr (path, '/');
  return slash ? (size_t) (slash - path) : 0;
}

/* ------------------------------------------------------------------ groups */

struct groups
{
  struct bfo_layout_group *g;
  size_t n, cap;
  bool want;
  int err;
};

static void
group_add (struct groups *gs, size_t first, size_t count, char *why)
{
  if (!gs->want || gs->err || count == 0)
    {
      free (why);
      return;
    }
  if (!why)
    {
      gs->err = -ENOMEM;
      return;
    }
  if (gs->n == gs->cap)
    {
      size_t ncap = gs->cap ? 2 * gs->cap : 16;
      struct bfo_layout_group *x = realloc (gs->g, ncap * sizeof *x);
      if (!x)
        {
          free (why);
          gs->err = -ENOMEM;
          return;
        }
      gs->g = x;
      gs->cap = ncap;
    }
  gs->g[gs->n++] = (struct bfo_layout_group) { first, count, why };
}

static char *
fmt (const char *f, ...) __attribute__ ((format (printf, 1, 2)));

static char *
fmt (const char *f, ...)
{
  va_list ap;
  va_start (ap, f);
  char *s;
  int r = vasprintf (&s, f, ap);
  va_end (ap);
  return r < 0 ? NULL : s;
}

void
bfo_layout_groups_free (struct bfo_layout_group *groups, size_t n_groups)
{
  for (size_t i = 0; i < n_groups; i++)
    free (groups[i].why);
  free (groups);
}

/* ------------------------------------------------------------------ the layout */

/* A frequent set mined from the trace: trace items in first-access order.  */
struct fset
{
  size_t *items;
  size_t n;
  uint64_t first;              /* first access of any member (reference index) */
  uint64_t support, transactions;   /* in its mining batch */
  uint64_t batch;
};

struct bfo_layout
{
  int policy;
  struct bfo_layout_opts o;
  char *trace_root;
  /* trace */
  const char *format;
  char **item;                 /* trace paths, normalized (relative or absolute) */
  uint64_t *item_first;
  size_t n_items, cap_items;
  struct fset *sets;
  size_t n_sets, cap_sets;
  uint64_t references, transactions, mining_batches;
};

int
bfo_layout_parse_support (const char *pct, double *fraction)
{
  char *end;
  errno = 0;
  double v = strtod (pct, &end);
  if (errno || end == pct || *end || !(v > 0 && v <= 100))
    return -EINVAL;
  *fraction = v / 100;
  return 0;
}

const char *
bfo_layout_policy_name (int policy)
{
  switch (policy)
    {
    case BFO_LAYOUT_WALK:  return "walk";
    case BFO_LAYOUT_DIR:   return "dir";
    case BFO_LAYOUT_REFS:  return "refs";
    case BFO_LAYOUT_TRACE: return "trace";
    default:               return NULL;
    }
}

int
bfo_layout_policy (const struct bfo_layout *l)
{
  return l ? l->policy : BFO_LAYOUT_WALK;
}

int
bfo_layout_trace_info (const struct bfo_layout *l, struct bfo_layout_trace_info *info)
{
  if (!l || l->policy != BFO_LAYOUT_TRACE)
    return -EINVAL;
  *info = (struct bfo_layout_trace_info) {
    .format = l->format, .references = l->references, .transactions = l->transactions,
    .mining_batches = l->mining_batches, .frequent_sets = l->n_sets,
  };
  return 0;
}

void
bfo_layout_free (struct bfo_layout *l)
{
  if (!l)
    return;
  for (size_t i = 0; i < l->n_items; i++)
    free (l->item[i]);
  free (l->item);
  free (l->item_first);
  for (size_t i = 0; i < l->n_sets; i++)
    free (l->sets[i].items);
  free (l->sets);
  free (l->trace_root);
  free (l);
}

/* ------------------------------------------------------------------ trace parsing */

/* One reference of the trace: an item, the session it belongs to (client,
   process) and whether it starts a new transaction of that session.  */
struct tref
{
  size_t item;
  uint64_t key;
  bool cut;
};

struct tparse
{
  struct bfo_layout *l;
  struct strmap items;
  struct strmap keys;
  char **keynames;
  size_t n_keys, cap_keys;
  struct tref *refs;
  size_t n, cap;
  bool any_cut, any_key, pending_cut;
  int kind;                    /* 0 not known yet, 1 paths, 2 strace, 3 access log */
};

static int
item_id (struct tparse *tp, char *path, size_t *id)
{
  struct bfo_layout *l = tp->l;
  size_t len = strlen (path);
  size_t old;
  if (l->n_items == l->cap_items)
    {
      size_t ncap = l->cap_items ? 2 * l->cap_items : 1024;
      char **x = realloc (l->item, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      l->item = x;
      uint64_t *f = realloc (l->item_first, ncap * sizeof *f);
      if (!f)
        return -ENOMEM;
      l->item_first = f;
      l->cap_items = ncap;
    }
  if (strmap_put (&tp->items, path, len, l->n_items, &old) < 0)
    return -ENOMEM;
  if (old == l->n_items)
    {
      l->item[l->n_items] = path;
      l->item_first[l->n_items] = tp->n;
      l->n_items++;
    }
  else
    free (path);
  *id = old;
  return 0;
}

static int
key_id (struct tparse *tp, const char *s, size_t len, uint64_t *id)
{
  size_t old;
  char *copy = strndup (s, len);
  if (!copy)
    return -ENOMEM;
  if (tp->n_keys == tp->cap_keys)
    {
      size_t ncap = tp->cap_keys ? 2 * tp->cap_keys : 64;
      char **x = realloc (tp->keynames, ncap * sizeof *x);
      if (!x)
        {
          free (copy);
          return -ENOMEM;
        }
      tp->keynames = x;
      tp->cap_keys = ncap;
    }
  if (strmap_put (&tp->keys, copy, len, tp->n_keys, &old) < 0)
    {
      free (copy);
      return -ENOMEM;
    }
  if (old == tp->n_keys)
    tp->keynames[tp->n_keys++] = copy;
  else
    free (copy);
  *id = old + 1;
  return 0;
}

/* Add a reference to PATH (malloc'd, taken).  */
static int
add_ref (struct tparse *tp, char *path, uint64_t key, bool cut)
{
  /* Trace paths: no empty or '.' components, a trailing '/' is its index.html
     (web servers), '..' resolved.  */
  bool abs = path[0] == '/';
  size_t len = strlen (path);
  if (len && path[len - 1] == '/')
    {
      char *x = realloc (path, len + sizeof "index.html");
      if (!x)
        {
          free (path);
          return -ENOMEM;
        }
      path = x;
      strcpy (path + len, "index.html");
    }
  if (!normalize_path (path + abs) || !path[abs])
    {
      free (path);
      return 0;
    }
  if (tp->n == tp->cap)
    {
      size_t ncap = tp->cap ? 2 * tp->cap : 4096;
      struct tref *x = realloc (tp->refs, ncap * sizeof *x);
      if (!x)
        {
          free (path);
          return -ENOMEM;
        }
      tp->refs = x;
      tp->cap = ncap;
    }
  size_t id;
  int r = item_id (tp, path, &id);
  if (r < 0)
    return r;
  tp->refs[tp->n++] = (struct tref) { id, key, cut || tp->pending_cut };
  if (cut || tp->pending_cut)
    tp->any_cut = true;
  tp->pending_cut = false;
  return 0;
}

static int
hexval (int c)
{
  return isdigit (c) ? c - '0' : isxdigit (c) ? (tolower (c) - 'a' + 10) : -1;
}

/* An strace line: [pid N] or N, maybe a time, then a call.  Returns 1 if it is one
   (with a path reference added when it is a successful open), 0 if not.  */
static int
parse_strace (struct tparse *tp, const char *line, bool probe)
{
  const char *p = line;
  const char *pid = NULL;
  size_t pidlen = 0;
  if (strncmp (p, "[pid", 4) == 0)
    {
      p += 4;
      while (*p == ' ')
        p++;
      pid = p;
      while (isdigit ((unsigned char) *p))
        p++;
      pidlen = p - pid;
      if (*p != ']' || !pidlen)
        return 0;
      p++;
      while (*p == ' ')
        p++;
    }
  else if (isdigit ((unsigned char) *p))
    {
      const char *q = p;
      while (isdigit ((unsigned char) *q))
        q++;
      if (*q == ' ')
        {
          pid = p;
          pidlen = q - p;
          p = q;
          while (*p == ' ')
            p++;
        }
    }
  /* -t, -tt, -ttt times.  */
  if (isdigit ((unsigned char) *p))
    {
      while (isdigit ((unsigned char) *p) || *p == ':' || *p == '.')
        p++;
      while (*p == ' ')
        p++;
    }
  const char *name = p;
  while (isalnum ((unsigned char) *p) || *p == '_')
    p++;
  if (p == name)
    return (strncmp (name, "+++", 3) == 0 || strncmp (name, "---", 3) == 0
            || strncmp (name, "<...", 4) == 0) ? 1 : 0;
  if (*p != '(')
    return 0;
  if (probe)
    return 1;
  size_t nlen = p - name;
  if (!((nlen == 6 && memcmp (name, "openat", 6) == 0) || (nlen == 4 && memcmp (name, "open", 4) == 0)))
    return 1;
  const char *q = strchr (p, '"');
  if (!q)
    return 1;
  q++;
  char *path = malloc (strlen (q) + 1), *o = path;
  if (!path)
    return -ENOMEM;
  while (*q && *q != '"')
    {
      if (*q == '\\' && q[1])
        {
          q++;
          if (*q == 'x' && hexval ((unsigned char) q[1]) >= 0 && hexval ((unsigned char) q[2]) >= 0)
            {
              *o++ = (char) (hexval ((unsigned char) q[1]) * 16 + hexval ((unsigned char) q[2]));
              q += 3;
            }
          else if (*q >= '0' && *q <= '7')
            {
              int v = 0;
              for (int k = 0; k < 3 && *q >= '0' && *q <= '7'; k++)
                v = v * 8 + (*q++ - '0');
              *o++ = (char) v;
            }
          else
            {
              *o++ = *q == 'n' ? '\n' : *q == 't' ? '\t' : *q;
              q++;
            }
        }
      else
        *o++ = *q++;
    }
  *o = '\0';
  /* A failed open is no access; an unfinished one counts.  */
  const char *eq = strstr (q, ") = ");
  bool failed = eq && eq[4] == '-';
  if (failed || !*path)
    {
      free (path);
      return 1;
    }
  uint64_t key = 0;
  if (pid)
    {
      int r = key_id (tp, pid, pidlen, &key);
      if (r < 0)
        {
          free (path);
          return r;
        }
      tp->any_key = true;
    }
  int r = add_ref (tp, path, key, false);
  return r < 0 ? r : 1;
}

/* A page of a web site: a page view starts a transaction of its client.  */
static bool
is_page (const char *path)
{
  size_t len = strlen (path);
  const char *dot = strrchr (path, '.');
  const char *slash = strrchr (path, '/');
  if (len && path[len - 1] == '/')
    return true;
  if (!dot || (slash && dot < slash))
    return false;
  return strcmp (dot, ".html") == 0 || strcmp (dot, ".htm") == 0 || strcmp (dot, ".xhtml") == 0
         || strcmp (dot, ".php") == 0 || strcmp (dot, ".shtml") == 0;
}

/* Common / combined log format: HOST IDENT USER [TIME] "METHOD PATH PROTO" STATUS ...  */
static int
parse_access (struct tparse *tp, const char *line, bool probe)
{
  const char *p = line;
  const char *host = p;
  while (*p && *p != ' ')
    p++;
  size_t hostlen = p - host;
  for (int k = 0; k < 2; k++)
    {
      if (*p++ != ' ')
        return 0;
      while (*p && *p != ' ')
        p++;
    }
  if (strncmp (p, " [", 2) != 0 || !hostlen)
    return 0;
  p = strchr (p, ']');
  if (!p || strncmp (p, "] \"", 3) != 0)
    return 0;
  p += 3;
  const char *method = p;
  while (isupper ((unsigned char) *p))
    p++;
  if (p == method || *p != ' ')
    return 0;
  if (probe)
    return 1;
  p++;
  const char *path = p;
  while (*p && *p != ' ' && *p != '"')
    p++;
  size_t plen = p - path;
  const char *close = strchr (p, '"');
  int status = close ? atoi (close + 1) : 0;
  if (status >= 400 || status < 100 || plen == 0 || (method[0] != 'G' && method[0] != 'P'
                                                     && method[0] != 'H'))
    return 1;
  /* Absolute URLs: from the path on; query and fragment are not part of the file.  */
  const char *scheme = memmem (path, plen, "://", 3);
  if (scheme)
    {
      const char *s = memchr (scheme + 3, '/', plen - (scheme + 3 - path));
      if (!s)
        return 1;
      plen -= s - path;
      path = s;
    }
  char *out = malloc (plen + 1), *o = out;
  if (!out)
    return -ENOMEM;
  for (size_t i = 0; i < plen && path[i] != '?' && path[i] != '#'; i++)
    if (path[i] == '%' && i + 2 < plen && hexval ((unsigned char) path[i + 1]) >= 0
        && hexval ((unsigned char) path[i + 2]) >= 0)
      {
        *o++ = (char) (hexval ((unsigned char) path[i + 1]) * 16
                       + hexval ((unsigned char) path[i + 2]));
        i += 2;
      }
    else
      *o++ = path[i];
  *o = '\0';
  uint64_t key;
  int r = key_id (tp, host, hostlen, &key);
  if (r == 0)
    {
      tp->any_key = true;
      r = add_ref (tp, out, key, is_page (out));
    }
  else
    free (out);
  return r < 0 ? r : 1;
}

static int
parse_line (struct tparse *tp, char *line)
{
  size_t len = strlen (line);
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
    line[--len] = '\0';
  if (tp->kind == 0)
    {
      if (len == 0 || line[0] == '#')
        return 0;
      tp->kind = parse_access (tp, line, true) == 1 ? 3
                 : parse_strace (tp, line, true) == 1 ? 2 : 1;
      static const char *const names[] = { NULL, "paths", "strace", "access-log" };
      tp->l->format = names[tp->kind];
    }
  if (tp->kind == 3)
    return parse_access (tp, line, false) < 0 ? -ENOMEM : 0;
  if (tp->kind == 2)
    return parse_strace (tp, line, false) < 0 ? -ENOMEM : 0;
  /* One path per line; a blank line ends a transaction.  */
  if (len == 0)
    {
      tp->pending_cut = true;
      return 0;
    }
  if (line[0] == '#')
    return 0;
  char *path = strdup (line);
  if (!path)
    return -ENOMEM;
  return add_ref (tp, path, 0, false);
}

/* ------------------------------------------------------------------ Apriori */

struct miner
{
  size_t m;                    /* frequent items of this batch */
  size_t words;                /* of a transaction bitset */
  uint64_t *tid;               /* m x words: the transactions holding each item */
  uint64_t minsup;
};

static uint64_t
support_of (const struct miner *mi, const uint32_t *set, size_t k, uint64_t *tmp)
{
  memcpy (tmp, mi->tid + (size_t) set[0] * mi->words, mi->words * sizeof *tmp);
  for (size_t j = 1; j < k; j++)
    {
      const uint64_t *b = mi->tid + (size_t) set[j] * mi->words;
      for (size_t w = 0; w < mi->words; w++)
        tmp[w] &= b[w];
    }
  uint64_t c = 0;
  for (size_t w = 0; w < mi->words; w++)
    c += (uint64_t) __builtin_popcountll (tmp[w]);
  return c;
}

/* A level of Apriori: N sets of K sorted super-items each, in lexicographic order.  */
struct level
{
  uint32_t *s;
  uint64_t *sup;
  bool *maximal;
  size_t n, k;
};

static int
lex_cmp (const uint32_t *a, const uint32_t *b, size_t k)
{
  for (size_t i = 0; i < k; i++)
    if (a[i] != b[i])
      return a[i] < b[i] ? -1 : 1;
  return 0;
}

static ssize_t
level_find (const struct level *lv, const uint32_t *set)
{
  size_t lo = 0, hi = lv->n;
  while (lo < hi)
    {
      size_t mid = (lo + hi) / 2;
      int c = lex_cmp (lv->s + mid * lv->k, set, lv->k);
      if (c == 0)
        return (ssize_t) mid;
      if (c < 0)
        lo = mid + 1;
      else
        hi = mid;
    }
  return -1;
}

/* The next level from LV, or n == 0 when none (or too many candidates).  */
static int
next_level (const struct miner *mi, const struct level *lv, struct level *nx, uint64_t *tmp)
{
  size_t k = lv->k + 1;
  *nx = (struct level) { .k = k };
  size_t cap = 0;
  uint32_t *cand = malloc (k * sizeof *cand), *sub = malloc (k * sizeof *sub);
  if (!cand || !sub)
    {
      free (cand);
      free (sub);
      return -ENOMEM;
    }
  size_t tried = 0;
  int ret = 0;
  for (size_t i = 0; i < lv->n && ret == 0; i++)
    for (size_t j = i + 1; j < lv->n; j++)
      {
        const uint32_t *a = lv->s + i * lv->k, *b = lv->s + j * lv->k;
        if (lv->k > 1 && memcmp (a, b, (lv->k - 1) * sizeof *a) != 0)
          break;
        memcpy (cand, a, lv->k * sizeof *a);
        cand[k - 1] = b[lv->k - 1];
        /* Every (k-1)-subset must be frequent.  */
        bool ok = true;
        for (size_t drop = 0; drop + 2 < k && ok; drop++)
          {
            size_t o = 0;
            for (size_t t = 0; t < k; t++)
              if (t != drop)
                sub[o++] = cand[t];
            ok = level_find (lv, sub) >= 0;
          }
        if (!ok)
          continue;
        if (++tried > LAYOUT_MAX_CANDIDATES)
          {
            free (nx->s);
            free (nx->sup);
            *nx = (struct level) { .k = k };
            free (cand);
            free (sub);
            return 0;
          }
        uint64_t s = support_of (mi, cand, k, tmp);
        if (s < mi->minsup)
          continue;
        if (nx->n == cap)
          {
            cap = cap ? 2 * cap : 64;
            uint32_t *x = realloc (nx->s, cap * k * sizeof *x);
            uint64_t *y = x ? realloc (nx->sup, cap * sizeof *y) : NULL;
            if (x)
              nx->s = x;
            if (!x || !y)
              {
                ret = -ENOMEM;
                break;
              }
            nx->sup = y;
          }
        memcpy (nx->s + nx->n * k, cand, k * sizeof *cand);
        nx->sup[nx->n++] = s;
      }
  free (cand);
  free (sub);
  if (ret == 0 && nx->n)
    {
      nx->maximal = malloc (nx->n * sizeof *nx->maximal);
      if (!nx->maximal)
        ret = -ENOMEM;
      else
        for (size_t i = 0; i < nx->n; i++)
          nx->maximal[i] = true;
    }
  return ret;
}

static const struct bfo_layout *sort_layout;

static int
by_first_access (const void *a, const void *b)
{
  uint64_t x = sort_layout->item_first[*(const size_t *) a];
  uint64_t y = sort_layout->item_first[*(const size_t *) b];
  return x < y ? -1 : x > y;
}

static int
add_set (struct bfo_layout *l, size_t *items, size_t n, uint64_t support, uint64_t ntx,
         uint64_t batch)
{
  if (n < 2)
    {
      free (items);
      return 0;
    }
  if (l->n_sets == l->cap_sets)
    {
      size_t ncap = l->cap_sets ? 2 * l->cap_sets : 64;
      struct fset *x = realloc (l->sets, ncap * sizeof *x);
      if (!x)
        {
          free (items);
          return -ENOMEM;
        }
      l->sets = x;
      l->cap_sets = ncap;
    }
  sort_layout = l;
  qsort (items, n, sizeof *items, by_first_access);
  l->sets[l->n_sets++] = (struct fset) { items, n, l->item_first[items[0]], support, ntx, batch };
  return 0;
}

/* Mine references [FROM, TO) of TP: transactions, frequent items (identical
   transaction sets merged into one super-item), Apriori levels, maximal sets.  */
static int
mine_batch (struct tparse *tp, size_t from, size_t to, uint64_t batch)
{
  struct bfo_layout *l = tp->l;
  size_t nrefs = to - from;
  /* Transaction of each reference.  */
  size_t *tx = malloc (nrefs * sizeof *tx);
  uint64_t *open_tx = calloc (tp->n_keys + 1, sizeof *open_tx);  /* 0: none, else tx + 1 */
  uint32_t window = l->o.trace_window;
  bool windows = !tp->any_cut && !tp->any_key;
  if (!tx || !open_tx)
    {
      free (tx);
      free (open_tx);
      return -ENOMEM;
    }
  size_t ntx = 0;
  for (size_t i = from; i < to; i++)
    {
      const struct tref *r = &tp->refs[i];
      bool cut = r->cut || (windows && (i - from) % window == 0);
      if (cut || !open_tx[r->key])
        open_tx[r->key] = ++ntx;
      tx[i - from] = open_tx[r->key] - 1;
    }
  free (open_tx);
  l->transactions += ntx;
  uint64_t minsup = (uint64_t) (l->o.trace_support * (double) ntx + 0.999999);
  if (minsup < 2)
    minsup = 2;

  /* Items of this batch and their transactions (as bitsets).  */
  size_t words = (ntx + 63) / 64;
  size_t *local = malloc (l->n_items * sizeof *local);  /* item -> local index or SIZE_MAX */
  size_t *items = malloc (nrefs * sizeof *items);
  size_t m = 0;
  int ret = 0;
  if (!local || !items)
    ret = -ENOMEM;
  for (size_t i = 0; ret == 0 && i < l->n_items; i++)
    local[i] = SIZE_MAX;
  for (size_t i = from; ret == 0 && i < to; i++)
    if (local[tp->refs[i].item] == SIZE_MAX)
      {
        local[tp->refs[i].item] = m;
        items[m++] = tp->refs[i].item;
      }
  uint64_t *bits = ret == 0 ? calloc (m * words + 1, sizeof *bits) : NULL;
  if (ret == 0 && !bits)
    ret = -ENOMEM;
  for (size_t i = from; ret == 0 && i < to; i++)
    {
      size_t li = local[tp->refs[i].item], t = tx[i - from];
      bits[li * words + t / 64] |= 1ull << (t % 64);
    }
  /* Frequent items, with identical bitsets merged: sort by bitset.  */
  struct fitem { size_t local; uint64_t count; } *fi = NULL;
  size_t nf = 0;
  if (ret == 0 && !(fi = malloc ((m + 1) * sizeof *fi)))
    ret = -ENOMEM;
  for (size_t i = 0; ret == 0 && i < m; i++)
    {
      uint64_t c = 0;
      for (size_t w = 0; w < words; w++)
        c += (uint64_t) __builtin_popcountll (bits[i * words + w]);
      if (c >= minsup)
        fi[nf++] = (struct fitem) { i, c };
    }
  /* Super-items: members listed in SUPER_MEMBERS[super_first[s] .. super_first[s+1]).  */
  size_t *super_of = NULL, *super_first = NULL, *super_members = NULL;
  size_t ns = 0;
  uint64_t *sbits = NULL;
  if (ret == 0 && nf)
    {
      struct strmap byset;
      super_of = malloc (nf * sizeof *super_of);
      super_first = malloc ((nf + 1) * sizeof *super_first);
      super_members = malloc (nf * sizeof *super_members);
      sbits = malloc (nf * words * sizeof *sbits + 1);
      if (!super_of || !super_first || !super_members || !sbits
          || strmap_init (&byset, nf) < 0)
        ret = -ENOMEM;
      else
        {
          size_t *count = calloc (nf + 1, sizeof *count);
          if (!count)
            ret = -ENOMEM;
          for (size_t i = 0; ret == 0 && i < nf; i++)
            {
              const char *key = (const char *) (bits + fi[i].local * words);
              size_t old;
              if (strmap_put (&byset, key, words * sizeof *bits, ns, &old) < 0)
                {
                  ret = -ENOMEM;
                  break;
                }
              if (old == ns)
                {
                  memcpy (sbits + ns * words, bits + fi[i].local * words, words * sizeof *bits);
                  ns++;
                }
              super_of[i] = old;
              count[old]++;
            }
          if (ret == 0)
            {
              super_first[0] = 0;
              for (size_t s = 0; s < ns; s++)
                super_first[s + 1] = super_first[s] + count[s];
              memset (count, 0, (nf + 1) * sizeof *count);
              for (size_t i = 0; i < nf; i++)
                super_members[super_first[super_of[i]] + count[super_of[i]]++]
                  = items[fi[i].local];
            }
          free (count);
          strmap_free (&byset);
        }
    }

  /* Levels of frequent super-item sets.  */
  struct miner mi = { .m = ns, .words = words, .tid = sbits, .minsup = minsup };
  struct level *lv = NULL;
  size_t nlv = 0;
  uint64_t *tmp = ret == 0 ? malloc ((words + 1) * sizeof *tmp) : NULL;
  if (ret == 0 && ns)
    {
      lv = calloc (ns + 1, sizeof *lv);
      if (!lv || !tmp)
        ret = -ENOMEM;
      else
        {
          lv[0] = (struct level) { .k = 1, .n = ns, .s = malloc (ns * sizeof (uint32_t)),
                                   .sup = malloc (ns * sizeof (uint64_t)),
                                   .maximal = malloc (ns * sizeof (bool)) };
          if (!lv[0].s || !lv[0].sup || !lv[0].maximal)
            ret = -ENOMEM;
          for (size_t s = 0; ret == 0 && s < ns; s++)
            {
              lv[0].s[s] = (uint32_t) s;
              lv[0].sup[s] = support_of (&mi, &lv[0].s[s], 1, tmp);
              lv[0].maximal[s] = true;
            }
          nlv = 1;
          while (ret == 0 && nlv < ns)
            {
              ret = next_level (&mi, &lv[nlv - 1], &lv[nlv], tmp);
              if (ret < 0 || lv[nlv].n == 0)
                break;
              nlv++;
            }
          /* A set inside a frequent larger one is not maximal.  */
          uint32_t *sub = malloc ((nlv + 1) * sizeof *sub);
          if (!sub)
            ret = -ENOMEM;
          for (size_t k = 1; ret == 0 && k < nlv; k++)
            for (size_t i = 0; i < lv[k].n; i++)
              for (size_t drop = 0; drop <= k; drop++)
                {
                  size_t o = 0;
                  for (size_t t = 0; t <= k; t++)
                    if (t != drop)
                      sub[o++] = lv[k].s[i * (k + 1) + t];
                  ssize_t at = level_find (&lv[k - 1], sub);
                  if (at >= 0)
                    lv[k - 1].maximal[at] = false;
                }
          free (sub);
          /* Maximal sets, expanded to their items.  */
          for (size_t k = 0; ret == 0 && k < nlv; k++)
            for (size_t i = 0; ret == 0 && i < lv[k].n; i++)
              {
                if (!lv[k].maximal[i])
                  continue;
                size_t total = 0;
                for (size_t t = 0; t <= k; t++)
                  {
                    uint32_t s = lv[k].s[i * (k + 1) + t];
                    total += super_first[s + 1] - super_first[s];
                  }
                size_t *set = malloc (total * sizeof *set), o = 0;
                if (!set)
                  {
                    ret = -ENOMEM;
                    break;
                  }
                for (size_t t = 0; t <= k; t++)
                  {
                    uint32_t s = lv[k].s[i * (k + 1) + t];
                    for (size_t x = super_first[s]; x < super_first[s + 1]; x++)
                      set[o++] = super_members[x];
                  }
                ret = add_set (l, set, total, lv[k].sup[i], ntx, batch);
              }
        }
    }
  for (size_t k = 0; lv && k <= nlv && k < ns + 1; k++)
    {
      free (lv[k].s);
      free (lv[k].sup);
      free (lv[k].maximal);
    }
  free (lv);
  free (tmp);
  free (super_of);
  free (super_first);
  free (super_members);
  free (sbits);
  free (fi);
  free (bits);
  free (items);
  free (local);
  free (tx);
  return ret;
}

static int
by_set_first (const void *a, const void *b)
{
  const struct fset *x = a, *y = b;
  if (x->first != y->first)
    return x->first < y->first ? -1 : 1;
  /* Larger sets first, then mining batch: a stable, total order.  */
  if (x->n != y->n)
    return x->n > y->n ? -1 : 1;
  return x->batch < y->batch ? -1 : x->batch > y->batch;
}

static int
load_trace (struct bfo_layout *l, const char *file)
{
  FILE *f = fopen (file, "re");
  if (!f)
    return -errno;
  struct tparse tp = { .l = l };
  int ret = 0;
  if (strmap_init (&tp.items, 1024) < 0 || strmap_init (&tp.keys, 64) < 0)
    ret = -ENOMEM;
  char *line = NULL;
  size_t cap = 0;
  while (ret == 0 && getline (&line, &cap, f) >= 0)
    ret = parse_line (&tp, line);
  if (ret == 0 && ferror (f))
    ret = -EIO;
  free (line);
  fclose (f);
  if (!l->format)
    l->format = "paths";
  l->references = tp.n;
  size_t batch = l->o.trace_batch_refs;
  for (size_t from = 0; ret == 0 && from < tp.n; from += batch)
    {
      size_t to = tp.n - from > batch ? from + batch : tp.n;
      ret = mine_batch (&tp, from, to, l->mining_batches++);
    }
  if (ret == 0 && l->n_sets)
    qsort (l->sets, l->n_sets, sizeof *l->sets, by_set_first);
  strmap_free (&tp.items);
  strmap_free (&tp.keys);
  for (size_t i = 0; i < tp.n_keys; i++)
    free (tp.keynames[i]);
  free (tp.keynames);
  free (tp.refs);
  return ret;
}

int
bfo_layout_new (struct bfo_layout **layout, const char *spec, const struct bfo_layout_opts *opts)
{
  struct bfo_layout *l = calloc (1, sizeof *l);
  if (!l)
    return -ENOMEM;
  if (opts)
    l->o = *opts;
  if (l->o.trace_support == 0)
    l->o.trace_support = LAYOUT_DEFAULT_SUPPORT;
  if (!l->o.trace_batch_refs)
    l->o.trace_batch_refs = LAYOUT_DEFAULT_BATCH_REFS;
  if (!l->o.trace_window)
    l->o.trace_window = LAYOUT_DEFAULT_WINDOW;
  int ret = 0;
  if (!(l->o.trace_support > 0 && l->o.trace_support <= 1))
    ret = -EINVAL;
  if (ret == 0 && l->o.trace_root)
    {
      l->trace_root = strdup (l->o.trace_root);
      if (!l->trace_root)
        ret = -ENOMEM;
      else
        {
          /* Compared with normalized trace paths: no '.', '//' or trailing '/'.  */
          bool abs = l->trace_root[0] == '/';
          if (!normalize_path (l->trace_root + abs))
            ret = -EINVAL;
        }
      l->o.trace_root = l->trace_root;
    }
  if (ret == 0)
    {
      if (strcmp (spec, "walk") == 0)
        l->policy = BFO_LAYOUT_WALK;
      else if (strcmp (spec, "dir") == 0)
        l->policy = BFO_LAYOUT_DIR;
      else if (strcmp (spec, "refs") == 0)
        l->policy = BFO_LAYOUT_REFS;
      else if (strncmp (spec, "trace=", 6) == 0 && spec[6])
        {
          l->policy = BFO_LAYOUT_TRACE;
          ret = load_trace (l, spec + 6);
        }
      else
        ret = -EINVAL;
    }
  if (ret < 0)
    {
      bfo_layout_free (l);
      return ret;
    }
  *layout = l;
  return 0;
}

/* ------------------------------------------------------------------ placing a batch */

struct place
{
  const struct bfo_layout_file *f;
  size_t n;
  size_t *order;
  size_t n_out;
  bool *placed;
  size_t *next_dup;            /* the next add of the same path, or SIZE_MAX */
  bool *is_dup;                /* a later add of a path added before */
  struct strmap paths;         /* path -> its first add */
  struct strmap suffixes;      /* every '/'-boundary suffix of a path -> its first add
                                  (refs: made when first needed) */
  bool have_suffixes;
  struct groups gs;
};

/* Append file I (a first add) and the later adds of its path.  */
static void
emit (struct place *pl, size_t i)
{
  for (size_t j = i; j != SIZE_MAX; j = pl->next_dup[j])
    {
      pl->order[pl->n_out++] = j;
      pl->placed[j] = true;
    }
}

static void
place_walk (struct place *pl)
{
  for (size_t i = 0; i < pl->n; i++)
    if (!pl->is_dup[i])
      emit (pl, i);
  group_add (&pl->gs, 0, pl->n_out, fmt ("walk order (as added)"));
}

static void
place_dir (struct place *pl)
{
  /* Directories in first-seen order; a directory's files in add order.  */
  struct strmap dirs;
  size_t *dir_of = malloc (pl->n * sizeof *dir_of);
  size_t *first_of_dir = malloc ((pl->n + 1) * sizeof *first_of_dir);
  size_t *next_in_dir = malloc (pl->n * sizeof *next_in_dir);
  size_t *last_of_dir = malloc ((pl->n + 1) * sizeof *last_of_dir);
  if (!dir_of || !first_of_dir || !next_in_dir || !last_of_dir || strmap_init (&dirs, pl->n) < 0)
    {
      free (dir_of);
      free (first_of_dir);
      free (next_in_dir);
      free (last_of_dir);
      pl->gs.err = -ENOMEM;
      return;
    }
  size_t nd = 0;
  for (size_t i = 0; i < pl->n; i++)
    {
      next_in_dir[i] = SIZE_MAX;
      if (pl->is_dup[i])
        continue;
      size_t d;
      if (strmap_put (&dirs, pl->f[i].path, dir_len (pl->f[i].path), nd, &d) < 0)
        {
          pl->gs.err = -ENOMEM;
          break;
        }
      if (d == nd)
        {
          first_of_dir[nd] = i;
          last_of_dir[nd] = i;
          nd++;
        }
      else
        {
          next_in_dir[last_of_dir[d]] = i;
          last_of_dir[d] = i;
        }
    }
  for (size_t d = 0; d < nd && !pl->gs.err; d++)
    {
      size_t start = pl->n_out, files = 0;
      for (size_t i = first_of_dir[d]; i != SIZE_MAX; i = next_in_dir[i])
        {
          emit (pl, i);
          files++;
        }
      const char *p = pl->f[first_of_dir[d]].path;
      size_t dl = dir_len (p);
      group_add (&pl->gs, start, pl->n_out - start,
                 fmt ("directory %.*s: its %zu file%s", dl ? (int) dl : 1, dl ? p : ".", files,
                      files == 1 ? "" : "s"));
    }
  strmap_free (&dirs);
  free (dir_of);
  free (first_of_dir);
  free (next_in_dir);
  free (last_of_dir);
}

/* ---- refs */

enum ref_kind { REF_NONE, REF_HTML, REF_C, REF_MAKE };

static enum ref_kind
ref_kind (const char *path)
{
  const char *base = strrchr (path, '/');
  base = base ? base + 1 : path;
  if (strncmp (base, "Makefile", 8) == 0 || strcmp (base, "makefile") == 0
      || strcmp (base, "GNUmakefile") == 0)
    return REF_MAKE;
  const char *dot = strrchr (base, '.');
  if (!dot)
    return REF_NONE;
  static const char *const html[] = { ".html", ".htm", ".xhtml", ".shtml", NULL };
  static const char *const c[] = { ".c", ".h", ".cc", ".cpp", ".cxx", ".C", ".hh", ".hpp",
                                   ".hxx", ".H", ".ipp", ".inl", NULL };
  for (int i = 0; html[i]; i++)
    if (strcasecmp (dot, html[i]) == 0)
      return REF_HTML;
  for (int i = 0; c[i]; i++)
    if (strcmp (dot, c[i]) == 0)
      return REF_C;
  if (strcmp (dot, ".mk") == 0)
    return REF_MAKE;
  return REF_NONE;
}

/* The adjacency lists of references (file -> files it references, in text order).  */
struct refs
{
  size_t *first;               /* n + 1 */
  size_t *to;
  size_t n_to, cap_to;
  size_t *claimer;             /* the first referrer in add order, or SIZE_MAX */
  enum ref_kind *kind;
};

static int
ref_add (struct place *pl, struct refs *rf, size_t from, size_t to)
{
  if (to == SIZE_MAX || to == from)
    return 0;
  /* Once per referrer.  */
  for (size_t k = rf->first[from]; k < rf->n_to; k++)
    if (rf->to[k] == to)
      return 0;
  (void) pl;
  if (rf->n_to == rf->cap_to)
    {
      size_t ncap = rf->cap_to ? 2 * rf->cap_to : 256;
      size_t *x = realloc (rf->to, ncap * sizeof *x);
      if (!x)
        return -ENOMEM;
      rf->to = x;
      rf->cap_to = ncap;
    }
  rf->to[rf->n_to++] = to;
  /* The first referrer claims it, unless it is that referrer's own claimer,
     directly or through others: no cycles, every group has a head.  */
  if (rf->claimer[to] == SIZE_MAX)
    {
      size_t up = from;
      while (up != SIZE_MAX && up != to)
        up = rf->claimer[up];
      if (up == SIZE_MAX)
        rf->claimer[to] = from;
    }
  return 0;
}

/* The first file in add order whose path is S[0..LEN) or ends with "/S".  */
static size_t
suffix_get (struct place *pl, const char *text, size_t len)
{
  if (!pl->have_suffixes)
    {
      if (strmap_init (&pl->suffixes, 4 * pl->n) < 0)
        return SIZE_MAX;
      pl->have_suffixes = true;
      for (size_t i = 0; i < pl->n; i++)
        for (const char *q = pl->f[i].path; q && !pl->is_dup[i]; q = strchr (q, '/'))
          {
            q += *q == '/';
            if (strmap_put (&pl->suffixes, q, strlen (q), i, NULL) < 0)
              return SIZE_MAX;
          }
    }
  return strmap_get (&pl->suffixes, text, len);
}

/* Resolve reference TEXT[0..LEN) of file FROM: relative to FROM's directory (or
   to the batch root for a leading '/'); for C includes not found there, the
   first file in add order whose path ends with "/TEXT".  */
static size_t
ref_resolve (struct place *pl, size_t from, const char *text, size_t len, bool bare)
{
  const char *p = pl->f[from].path;
  size_t dl = dir_len (p);
  char *joined = text[0] == '/' ? path_join ("", 0, text + 1, len - 1)
                                : path_join (p, dl, text, len);
  size_t hit = SIZE_MAX;
  if (joined && normalize_path (joined) && *joined)
    hit = strmap_get (&pl->paths, joined, strlen (joined));
  free (joined);
  if (hit != SIZE_MAX || !bare)
    return hit;
  return suffix_get (pl, text, len);
}

static bool
url_skip (const char *v, size_t len)
{
  if (len == 0 || v[0] == '#' || (len >= 2 && v[0] == '/' && v[1] == '/'))
    return true;
  for (size_t i = 0; i < len && v[i] != '/'; i++)
    if (v[i] == ':')
      return true;             /* http:, mailto:, data: ... */
  return false;
}

static int
scan_html (struct place *pl, struct refs *rf, size_t i, const char *s, size_t len)
{
  for (size_t k = 0; k + 4 < len; k++)
    {
      size_t alen;
      if ((k == 0 || !isalnum ((unsigned char) s[k - 1]))
          && (strncasecmp (s + k, "href", 4) == 0 || strncasecmp (s + k, "src", 3) == 0))
        alen = tolower ((unsigned char) s[k]) == 'h' ? 4 : 3;
      else
        continue;
      size_t q = k + alen;
      while (q < len && isspace ((unsigned char) s[q]))
        q++;
      if (q >= len || s[q] != '=')
        continue;
      q++;
      while (q < len && isspace ((unsigned char) s[q]))
        q++;
      if (q >= len)
        break;
      char end = (s[q] == '"' || s[q] == '\'') ? s[q++] : 0;
      size_t v = q;
      while (q < len && (end ? s[q] != end : !isspace ((unsigned char) s[q]) && s[q] != '>'))
        q++;
      size_t vlen = q - v;
      for (size_t t = 0; t < vlen; t++)
        if (s[v + t] == '?' || s[v + t] == '#')
          {
            vlen = t;
            break;
          }
      if (!url_skip (s + v, vlen) && ref_add (pl, rf, i, ref_resolve (pl, i, s + v, vlen, false)) < 0)
        return -ENOMEM;
      k = q;
    }
  return 0;
}

static int
scan_c (struct place *pl, struct refs *rf, size_t i, const char *s, size_t len)
{
  for (size_t k = 0; k < len; k++)
    {
      if (k && s[k - 1] != '\n')
        continue;
      size_t q = k;
      while (q < len && (s[q] == ' ' || s[q] == '\t'))
        q++;
      if (q >= len || s[q] != '#')
        continue;
      q++;
      while (q < len && (s[q] == ' ' || s[q] == '\t'))
        q++;
      if (len - q < 7 || memcmp (s + q, "include", 7) != 0)
        continue;
      q += 7;
      while (q < len && (s[q] == ' ' || s[q] == '\t'))
        q++;
      if (q >= len || s[q] != '"')
        continue;
      size_t v = ++q;
      while (q < len && s[q] != '"' && s[q] != '\n')
        q++;
      if (q < len && s[q] == '"' && q > v
          && ref_add (pl, rf, i, ref_resolve (pl, i, s + v, q - v, true)) < 0)
        return -ENOMEM;
    }
  return 0;
}

static int
scan_make (struct place *pl, struct refs *rf, size_t i, const char *s, size_t len)
{
  /* Words that name a file of the batch relative to the Makefile.  */
  for (size_t k = 0; k < len;)
    {
      while (k < len && !(isalnum ((unsigned char) s[k]) || s[k] == '_' || s[k] == '.'
                          || s[k] == '/' || s[k] == '-' || s[k] == '+'))
        k++;
      size_t v = k;
      while (k < len && (isalnum ((unsigned char) s[k]) || s[k] == '_' || s[k] == '.'
                         || s[k] == '/' || s[k] == '-' || s[k] == '+'))
        k++;
      if (k > v && memchr (s + v, '.', k - v)
          && ref_add (pl, rf, i, ref_resolve (pl, i, s + v, k - v, false)) < 0)
        return -ENOMEM;
    }
  return 0;
}

static void
place_tree (struct place *pl, struct refs *rf, size_t i)
{
  /* Depth-first, references in text order; an explicit stack.  */
  size_t cap = 64, top = 0;
  size_t *st = malloc (cap * sizeof *st), *pos = malloc (cap * sizeof *pos);
  if (!st || !pos)
    {
      free (st);
      free (pos);
      pl->gs.err = -ENOMEM;
      return;
    }
  emit (pl, i);
  st[top] = i;
  pos[top++] = rf->first[i];
  while (top)
    {
      size_t f = st[top - 1];
      if (pos[top - 1] >= rf->first[f + 1])
        {
          top--;
          continue;
        }
      size_t t = rf->to[pos[top - 1]++];
      if (pl->placed[t] || rf->claimer[t] != f)
        continue;
      emit (pl, t);
      if (top == cap)
        {
          cap *= 2;
          size_t *x = realloc (st, cap * sizeof *x), *y = x ? realloc (pos, cap * sizeof *y) : NULL;
          if (x)
            st = x;
          if (!x || !y)
            {
              pl->gs.err = -ENOMEM;
              break;
            }
          pos = y;
        }
      st[top] = t;
      pos[top++] = rf->first[t];
    }
  free (st);
  free (pos);
}

static void
place_refs (struct place *pl)
{
  struct refs rf = { 0 };
  rf.first = malloc ((pl->n + 1) * sizeof *rf.first);
  rf.claimer = malloc (pl->n * sizeof *rf.claimer);
  rf.kind = malloc (pl->n * sizeof *rf.kind);
  if (!rf.first || !rf.claimer || !rf.kind)
    pl->gs.err = -ENOMEM;
  for (size_t i = 0; !pl->gs.err && i < pl->n; i++)
    rf.claimer[i] = SIZE_MAX;
  /* References in add order: the first referrer of a file claims it.  */
  for (size_t i = 0; !pl->gs.err && i < pl->n; i++)
    {
      rf.first[i] = rf.n_to;
      rf.kind[i] = pl->is_dup[i] ? REF_NONE : ref_kind (pl->f[i].path);
      /* The last add of a path is the content that will be there.  */
      size_t last = i;
      while (pl->next_dup[last] != SIZE_MAX)
        last = pl->next_dup[last];
      const char *s = pl->f[last].data;
      size_t len = pl->f[last].len > LAYOUT_REFS_SCAN_BYTES ? LAYOUT_REFS_SCAN_BYTES
                                                           : pl->f[last].len;
      int r = 0;
      if (!s)
        ;
      else if (rf.kind[i] == REF_HTML)
        r = scan_html (pl, &rf, i, s, len);
      else if (rf.kind[i] == REF_C)
        r = scan_c (pl, &rf, i, s, len);
      else if (rf.kind[i] == REF_MAKE)
        r = scan_make (pl, &rf, i, s, len);
      if (r < 0)
        pl->gs.err = r;
    }
  if (!pl->gs.err)
    rf.first[pl->n] = rf.n_to;
  /* Groups start at files nobody claimed, in add order (the second pass is a
     safety net: claims make no cycles).  */
  size_t single_start = SIZE_MAX;
  for (int pass = 0; pass < 2 && !pl->gs.err; pass++)
    for (size_t i = 0; i < pl->n && !pl->gs.err; i++)
      {
        if (pl->placed[i] || pl->is_dup[i] || (pass == 0 && rf.claimer[i] != SIZE_MAX))
          continue;
        size_t start = pl->n_out;
        place_tree (pl, &rf, i);
        size_t count = pl->n_out - start;
        size_t files = 0;
        for (size_t k = start; k < pl->n_out; k++)
          files += !pl->is_dup[pl->order[k]];
        if (files == 1 && single_start == SIZE_MAX)
          single_start = start;
        if (files == 1)
          continue;
        if (single_start != SIZE_MAX)
          group_add (&pl->gs, single_start, start - single_start,
                     fmt ("no references among them: walk order"));
        single_start = SIZE_MAX;
        static const char *const how[] = { "references", "links (href/src)",
                                           "includes (#include \"...\")", "names (Makefile)" };
        group_add (&pl->gs, start, count,
                   fmt ("%s and %zu file%s it %s, directly or through them", pl->f[i].path,
                        files - 1, files == 2 ? "" : "s", how[rf.kind[i]]));
      }
  if (single_start != SIZE_MAX)
    group_add (&pl->gs, single_start, pl->n_out - single_start,
               fmt ("no references among them: walk order"));
  free (rf.first);
  free (rf.to);
  free (rf.claimer);
  free (rf.kind);
}

/* ---- trace */

/* The batch file trace item ITEM stands for, or SIZE_MAX: the file whose path
   is, or ends with, the longest '/'-boundary suffix of the trace path (with a
   root: of its path relative to the root), a whole path before a path's end.  */
static size_t
trace_match (const struct bfo_layout *l, struct place *pl, size_t item)
{
  const char *p = l->item[item];
  if (l->trace_root)
    {
      size_t rl = strlen (l->trace_root);
      if (p[0] == '/')
        {
          if (strncmp (p, l->trace_root, rl) != 0 || p[rl] != '/')
            return SIZE_MAX;
          p += rl + 1;
        }
      size_t hit = strmap_get (&pl->paths, p, strlen (p));
      return hit != SIZE_MAX ? hit : suffix_get (pl, p, strlen (p));
    }
  while (*p == '/')
    p++;
  for (;;)
    {
      size_t hit = strmap_get (&pl->paths, p, strlen (p));
      if (hit == SIZE_MAX)
        hit = suffix_get (pl, p, strlen (p));
      if (hit != SIZE_MAX)
        return hit;
      const char *slash = strchr (p, '/');
      if (!slash)
        return SIZE_MAX;
      p = slash + 1;
    }
}

static void
place_trace (const struct bfo_layout *l, struct place *pl)
{
  size_t *members = malloc ((pl->n + 1) * sizeof *members);
  if (!members)
    {
      pl->gs.err = -ENOMEM;
      return;
    }
  for (size_t s = 0; s < l->n_sets && !pl->gs.err; s++)
    {
      const struct fset *fs = &l->sets[s];
      size_t k = 0;
      for (size_t j = 0; j < fs->n; j++)
        {
          size_t i = trace_match (l, pl, fs->items[j]);
          if (i == SIZE_MAX || pl->placed[i])
            continue;
          bool seen = false;
          for (size_t t = 0; t < k && !seen; t++)
            seen = members[t] == i;
          if (!seen)
            members[k++] = i;
        }
      if (k < 2)
        continue;
      size_t start = pl->n_out;
      for (size_t t = 0; t < k; t++)
        emit (pl, members[t]);
      group_add (&pl->gs, start, pl->n_out - start,
                 fmt ("frequent set %zu of the trace (%zu of its %zu files here; in %" PRIu64
                      " of %" PRIu64 " transactions of mining batch %" PRIu64 "; first access"
                      " at reference %" PRIu64 ")", s + 1, k, fs->n, fs->support,
                      fs->transactions, fs->batch + 1, fs->first + 1));
    }
  free (members);
  size_t start = pl->n_out;
  for (size_t i = 0; i < pl->n && !pl->gs.err; i++)
    if (!pl->placed[i] && !pl->is_dup[i])
      emit (pl, i);
  group_add (&pl->gs, start, pl->n_out - start, fmt ("in no frequent set: walk order"));
}

int
bfo_layout_order (const struct bfo_layout *l, const struct bfo_layout_file *files, size_t n,
                  size_t *order, struct bfo_layout_group **groups, size_t *n_groups)
{
  struct place pl = { .f = files, .n = n, .order = order, .gs = { .want = groups != NULL } };
  if (groups)
    {
      *groups = NULL;
      *n_groups = 0;
    }
  pl.placed = calloc (n + 1, sizeof *pl.placed);
  pl.is_dup = calloc (n + 1, sizeof *pl.is_dup);
  pl.next_dup = malloc ((n + 1) * sizeof *pl.next_dup);
  size_t *last = malloc ((n + 1) * sizeof *last);
  int ret = 0;
  if (!pl.placed || !pl.is_dup || !pl.next_dup || !last || strmap_init (&pl.paths, n) < 0)
    {
      free (pl.placed);
      free (pl.is_dup);
      free (pl.next_dup);
      free (last);
      return -ENOMEM;
    }
  /* The same path again: it follows its first add (renamed later, it wins).  */
  for (size_t i = 0; i < n && ret == 0; i++)
    {
      size_t first;
      pl.next_dup[i] = SIZE_MAX;
      ret = strmap_put (&pl.paths, files[i].path, strlen (files[i].path), i, &first);
      if (ret == 0 && first != i)
        {
          pl.is_dup[i] = true;
          pl.next_dup[last[first]] = i;
        }
      if (ret == 0)
        last[first] = i;
    }
  free (last);
  if (ret == 0)
    {
      switch (bfo_layout_policy (l))
        {
        case BFO_LAYOUT_DIR:   place_dir (&pl); break;
        case BFO_LAYOUT_REFS:  place_refs (&pl); break;
        case BFO_LAYOUT_TRACE: place_trace (l, &pl); break;
        default:               place_walk (&pl); break;
        }
      ret = pl.gs.err;
    }
  if (ret == 0 && pl.n_out != n)
    ret = -EIO;                /* cannot happen: every file is placed once */
  if (ret == 0 && groups)
    {
      *groups = pl.gs.g;
      *n_groups = pl.gs.n;
    }
  else
    bfo_layout_groups_free (pl.gs.g, pl.gs.n);
  strmap_free (&pl.paths);
  if (pl.have_suffixes)
    strmap_free (&pl.suffixes);
  free (pl.placed);
  free (pl.is_dup);
  free (pl.next_dup);
  return ret;
}
