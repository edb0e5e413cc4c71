/* A program that installs a SIGSEGV handler of its own partway through,
 * then takes faults on purpose between stretches of work: a load from a
 * page it keeps inaccessible, whose handler finds the faulting instruction
 * by the PC in its ucontext (as a virtual machine's implicit null checks
 * and a garbage collector's barriers do) and goes on after it. Natively
 * every fault is at that one instruction. A profiler that ran the load
 * from a copy of its code, with no handler of its own in between, would
 * hand the program a PC it never had.
 *
 * Usage: fault_handler [faults [late]]
 *          with `late`, it works until its stdin closes before it installs
 *          the handler (a target to attach to first);
 *          prints how many faults its handler saw and how many were not at
 *          the faulting instruction, and a checksum; exits 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include "stdin_closed.h"

#define N 2048

extern char fault_handler_at[], fault_handler_after[];

/* The one faulting load: its address and the next instruction's are
 * labels the handler compares the PC with and resumes at. */
__attribute__((noinline)) static long probe(const volatile long *p) {
    long v = 0;
    __asm__ volatile(".globl fault_handler_at\nfault_handler_at:\n\tmovq (%1), %0\n"
                     ".globl fault_handler_after\nfault_handler_after:\n"
                     : "+r"(v)
                     : "r"(p)
                     : "memory");
    return v;
}

static volatile long seen, elsewhere;

static void on_segv(int sig, siginfo_t *si, void *ctx) {
    (void)sig;
    (void)si;
    ucontext_t *uc = ctx;
    seen++;
    if ((char *)uc->uc_mcontext.gregs[REG_RIP] != fault_handler_at) elsewhere++;
    uc->uc_mcontext.gregs[REG_RIP] = (greg_t)fault_handler_after;
}

static long a[N];

static long work(long r, long n) {
    long s = 0;
    for (long i = 0; i < n; i++) a[i] = i * r + (a[(i * 7) & (N - 1)] >> 1);
    for (long i = 0; i < n; i += 8) s += a[i];
    return s;
}

int main(int argc, char **argv) {
    long faults = argc > 1 ? atol(argv[1]) : 20000;
    int late = argc > 2 && strcmp(argv[2], "late") == 0;
    long sum = 0;
    for (long r = 0; late; r++) {
        sum += work(r, N);
        if ((r & 63) == 0 && stdin_closed()) break;
    }
    volatile long *guard = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (guard == MAP_FAILED) return 2;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    if (sigaction(SIGSEGV, &sa, NULL) != 0) return 2;
    for (long f = 0; f < faults; f++) {
        sum += work(f, N);
        sum += probe(guard);
    }
    printf("faults seen %ld, elsewhere %ld; checksum %ld\n", seen, elsewhere, sum);
    return 0;
}
