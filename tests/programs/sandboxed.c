/* A program that puts itself in a seccomp sandbox partway through, as a
 * privilege-separated server child or a browser's renderer does: the filter
 * allows what the program needs and kills the process (or fails the call
 * with EPERM) at the system calls a profiler makes and it never does
 * (ioctl, perf_event_open, the POSIX timers, sigaltstack, fallocate,
 * socketpair, pidfd_open).  It works before the filter, then after it: in a
 * new thread, in a fork child that ends with abort(), and in an image it
 * execs (which inherits the filter).
 *
 * Usage: sandboxed prctl|sysprctl|seccomp|tsync kill|errno [rounds [wait|late]]
 *          prints checksums and how its children ended; exits 3 (with
 *          `wait`, it works in the sandbox until its stdin closes first;
 *          with `late`, it works until its stdin closes before it enters
 *          the sandbox: a target to attach to first).  `sysprctl` is prctl
 *          through syscall(2).  `tsync` is seccomp(2)
 *          with SECCOMP_FILTER_FLAG_TSYNC: the filter goes on every thread
 *          of the process, as a browser's sandbox does, not only the caller.
 *        sandboxed exec-child rounds
 *          the exec'd image: prints a checksum; exits 5
 *        sandboxed run kill|errno COMMAND [ARGS...]
 *          runs COMMAND in the sandbox (execvp)
 */
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stdin_closed.h"

static unsigned buf[4096];

/* Stores overwritten before anyone reads them, and some that are read. */
static unsigned long work(long rounds) {
    unsigned long s = 0;
    for (long i = 0; i < rounds; i++) {
        buf[i & 4095] = (unsigned)i;
        buf[(i * 7) & 4095] = (unsigned)i;
        s += buf[(i * 13) & 4095];
    }
    return s;
}

static void *thread_work(void *arg) {
    return (void *)work((long)arg);
}

#define DENY(nr) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, action)

static void enter_sandbox(const char *how, int kill) {
    unsigned action = kill ? SECCOMP_RET_KILL_PROCESS : SECCOMP_RET_ERRNO | 1; /* EPERM */
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        DENY(SYS_ioctl), DENY(SYS_perf_event_open), DENY(SYS_timer_create), DENY(SYS_timer_settime),
        DENY(SYS_timer_delete), DENY(SYS_sigaltstack), DENY(SYS_fallocate), DENY(SYS_socketpair),
        DENY(SYS_pidfd_open),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof f / sizeof f[0], f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) {
        perror("PR_SET_NO_NEW_PRIVS");
        exit(2);
    }
    unsigned flags = strcmp(how, "tsync") == 0 ? SECCOMP_FILTER_FLAG_TSYNC : 0;
    int r = strcmp(how, "prctl") == 0      ? prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)
            : strcmp(how, "sysprctl") == 0 ? (int)syscall(SYS_prctl, PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0)
                                           : (int)syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, flags, &prog);
    if (r != 0) {
        perror("seccomp");
        exit(2);
    }
}

static void report_child(const char *what, pid_t pid) {
    int status;
    if (waitpid(pid, &status, 0) != pid) {
        perror("waitpid");
        exit(2);
    }
    if (WIFSIGNALED(status))
        printf("%s: signal %d\n", what, WTERMSIG(status));
    else
        printf("%s: exit %d\n", what, WEXITSTATUS(status));
}

int main(int argc, char **argv) {
    if (argc == 3 && strcmp(argv[1], "exec-child") == 0) {
        printf("exec'd image: %lu\n", work(atol(argv[2])));
        return 5;
    }
    if (argc >= 4 && strcmp(argv[1], "run") == 0) {
        enter_sandbox("prctl", strcmp(argv[2], "kill") == 0);
        execvp(argv[3], argv + 3);
        perror("execvp");
        return 127;
    }
    if (argc < 3) {
        fprintf(stderr, "usage: sandboxed prctl|sysprctl|seccomp|tsync kill|errno [rounds [wait|late]]\n");
        return 2;
    }
    long rounds = argc > 3 ? atol(argv[3]) : 30000000;
    if (argc > 4 && strcmp(argv[4], "late") == 0) {
        unsigned long s = 0;
        do /* at least once: what `before` reads is the same however long */
            s += work(100000);
        while (!stdin_closed());
        printf("worked until stdin closed: %d\n", s != 1);
    }
    printf("before: %lu\n", work(rounds));
    fflush(stdout);
    enter_sandbox(argv[1], strcmp(argv[2], "kill") == 0);
    if (argc > 4 && strcmp(argv[4], "wait") == 0) {
        unsigned long s = 0;
        while (!stdin_closed())
            s += work(100000);
        printf("waited: %d\n", s != 1);
    }
    printf("after: %lu\n", work(rounds));

    pthread_t t;
    void *got;
    if (pthread_create(&t, NULL, thread_work, (void *)rounds) != 0 || pthread_join(t, &got) != 0) {
        fprintf(stderr, "thread failed\n");
        return 2;
    }
    printf("thread: %lu\n", (unsigned long)got);
    fflush(stdout);

    pid_t pid = fork();
    if (pid == 0) {
        printf("fork child: %lu\n", work(rounds));
        fflush(stdout);
        abort();
    }
    report_child("fork child", pid);
    fflush(stdout);

    pid = fork();
    if (pid == 0) {
        char n[32];
        snprintf(n, sizeof n, "%ld", rounds);
        execl("/proc/self/exe", "sandboxed", "exec-child", n, (char *)NULL);
        perror("execl");
        _exit(2);
    }
    report_child("exec'd image", pid);
    return 3;
}
