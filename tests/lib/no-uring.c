/* no-uring.c: run a command with io_uring_setup refused (EPERM), as a
   container's seccomp profile does (Docker's default one among them), so
   that tests/no-uring.bats can check that libbfo's programs then read and
   write without io_uring, and still right.  Usage: no-uring CMD [ARG]...  */

#include <config.h>

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <linux/filter.h>
#include <linux/seccomp.h>

int
main (int argc, char **argv)
{
  if (argc < 2)
    {
      fprintf (stderr, "usage: %s CMD [ARG]...\n", argv[0]);
      return 2;
    }
  struct sock_filter filter[] = {
    BPF_STMT (BPF_LD | BPF_W | BPF_ABS, offsetof (struct seccomp_data, nr)),
    BPF_JUMP (BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    BPF_STMT (BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  struct sock_fprog prog = { sizeof filter / sizeof filter[0], filter };
  if (prctl (PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
      || prctl (PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog) != 0)
    {
      perror ("no-uring: seccomp");
      return 126;
    }
  execvp (argv[1], argv + 1);
  perror (argv[1]);
  return 127;
}
