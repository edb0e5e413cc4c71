/* A program that installs a SIGTRAP handler of its own partway through
 * (through the C library's sigaction, or through syscall(SYS_rt_sigaction)
 * with its own signal return, as a program that makes its own system calls
 * does), then works, then raises SIGTRAP once: its handler must see that
 * one trap and no other. A profiler whose traps (a watchpoint's, a code
 * cache's exits) reached the program's handler would change its count or
 * kill it.
 *
 * Usage: trap_handler libc|syscall [reps [late]]
 *          with `late`, it works until its stdin closes before it installs
 *          the handler (a target to attach to first);
 *          prints the traps its handler saw and a checksum; exits 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "stdin_closed.h"

/* The kernel's struct sigaction, and a signal return of the program's. */
struct kernel_sigaction {
    void (*handler)(int, siginfo_t *, void *);
    unsigned long flags;
    void (*restorer)(void);
    unsigned long mask;
};
#define SA_RESTORER_FLAG 0x04000000
void trap_handler_restore(void);
__asm__(".text\n.globl trap_handler_restore\ntrap_handler_restore:\n mov $15, %rax\n syscall\n");

static volatile long traps;
static void on_trap(int s, siginfo_t *si, void *uc) {
    (void)s;
    (void)si;
    (void)uc;
    traps++;
}

static long a[4096];

/* Stores overwritten before anyone reads them, and some that are read. */
static long work(long reps, long seed) {
    long s = 0;
    for (long r = 0; r < reps; r++) {
        for (long i = 0; i < 4096; i++) a[i] = i * r + seed;
        for (long i = 0; i < 4096; i += 64) s += a[i];
    }
    return s;
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    long reps = argc > 2 ? atol(argv[2]) : 20000;
    int late = argc > 3 && strcmp(argv[3], "late") == 0;
    long s = work(reps, 1);
    while (late && !stdin_closed()) s += work(50, 2);
    int r;
    if (strcmp(argv[1], "syscall") == 0) {
        struct kernel_sigaction k = {on_trap, SA_SIGINFO | SA_RESTORER_FLAG, trap_handler_restore, 0}, old;
        r = (int)syscall(SYS_rt_sigaction, SIGTRAP, &k, &old, 8);
        r |= old.handler != NULL; /* the default action before */
    } else {
        struct sigaction sa, old;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_trap;
        sa.sa_flags = SA_SIGINFO;
        r = sigaction(SIGTRAP, &sa, &old);
        r |= old.sa_handler != SIG_DFL;
    }
    s += work(reps, 3);
    struct sigaction now;
    sigaction(SIGTRAP, NULL, &now);
    raise(SIGTRAP);
    printf("installed %d (its own: %s), traps seen %ld, checksum %ld\n", r, now.sa_sigaction == on_trap ? "yes" : "no", traps,
           late ? 0 : s);
    return 0;
}
