/* refuse.c: run a command with some system calls refused by a seccomp
   filter, as containers' profiles refuse them, so that the tests can check
   that bfo's programs then still work, and right.
   Usage: refuse WHAT[,WHAT]... CMD [ARG]...  where WHAT is
     io_uring  io_uring_setup fails with EPERM (Docker's default profile)
     openat2   openat2 fails with EPERM (profiles older than the call)
     syncfs    syncfs fails with EPERM
     cachestat cachestat fails with EPERM (profiles older than the call)
     tmpfile   open and openat with O_TMPFILE fail with EOPNOTSUPP (file
               systems that make no unnamed files, as overlays before 6.6)  */

#include <config.h>

#include <errno.h>
#include <fcntl.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

#define LOAD_NR BPF_STMT (BPF_LD | BPF_W | BPF_ABS, offsetof (struct seccomp_data, nr))
#define LOAD_ARG(i) BPF_STMT (BPF_LD | BPF_W | BPF_ABS, offsetof (struct seccomp_data, args[i]))
#define FAIL(e) BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (e))
#define ALLOW BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

static struct sock_filter prog[64];
static unsigned short len;

static void
put (struct sock_filter f)
{
  prog[len++] = f;
}

/* Fail system call NR with E.  */
static void
refuse_call (int nr, int e)
{
  put ((struct sock_filter) LOAD_NR);
  put ((struct sock_filter) BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 1));
  put ((struct sock_filter) FAIL (e));
}

/* Fail system call NR with E when its argument ARG has all of FLAGS.  */
static void
refuse_flags (int nr, int arg, unsigned flags, int e)
{
  put ((struct sock_filter) LOAD_NR);
  put ((struct sock_filter) BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, nr, 0, 4));
  put ((struct sock_filter) LOAD_ARG (arg));
  put ((struct sock_filter) BPF_STMT (BPF_ALU | BPF_AND | BPF_K, flags));
  put ((struct sock_filter) BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, flags, 0, 1));
  put ((struct sock_filter) FAIL (e));
}

int
main (int argc, char **argv)
{
  if (argc < 3)
    {
      fprintf (stderr, "usage: %s io_uring|openat2|syncfs|cachestat|tmpfile[,...] CMD [ARG]...\n",
               argv[0]);
      return 2;
    }
  for (char *save, *w = strtok_r (argv[1], ",", &save); w; w = strtok_r (NULL, ",", &save))
    if (strcmp (w, "io_uring") == 0)
      refuse_call (__NR_io_uring_setup, EPERM);
    else if (strcmp (w, "openat2") == 0)
      refuse_call (__NR_openat2, EPERM);
    else if (strcmp (w, "syncfs") == 0)
      refuse_call (__NR_syncfs, EPERM);
    else if (strcmp (w, "cachestat") == 0)
      refuse_call (451, EPERM);         /* (__NR_cachestat: Linux 6.5's headers) */
    else if (strcmp (w, "tmpfile") == 0)
      {
#ifdef __NR_open
        refuse_flags (__NR_open, 1, __O_TMPFILE, EOPNOTSUPP);
#endif
        refuse_flags (__NR_openat, 2, __O_TMPFILE, EOPNOTSUPP);
      }
    else
      {
        fprintf (stderr, "%s: cannot refuse '%s'\n", argv[0], w);
        return 2;
      }
  put ((struct sock_filter) ALLOW);
  struct sock_fprog fprog = { len, prog };
  if (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
      || prctl (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &fprog) != 0)
    {
      perror ("refuse: seccomp");
      return 126;
    }
  execvp (argv[2], argv + 2);
  perror (argv[2]);
  return 127;
}
