/* A program that single-steps itself with the trap flag, as debuggers,
 * emulators and anti-debugging code do, and checks that it never finds the
 * trap flag set when it did not set it. Under witch (whose software sampler
 * single-steps threads in bursts) its output must be the same as natively:
 * every one of its own steps reaches its SIGTRAP handler, and no step of
 * witch's leaks into it.
 *
 * Usage: self_step [rounds]   prints "self_step STEPS LEAKS", exits 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

#define STEPS 40
#define TF 0x100L

static volatile long left, steps, strays;
static volatile long arr[64];

static void on_trap(int sig, siginfo_t *si, void *ucv) {
    ucontext_t *uc = ucv;
    (void)sig;
    if (si->si_code != TRAP_TRACE) {
        strays++;
        return;
    }
    steps++;
    if (--left <= 0) uc->uc_mcontext.gregs[REG_EFL] &= ~TF;
}

static inline long flags(void) {
    long f;
    __asm__ volatile("pushfq; popq %0" : "=r"(f));
    return f;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_trap;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGTRAP, &sa, NULL);
    long leaks = 0;
    for (long r = 0; r < rounds; r++) {
        for (long i = 0; i < 20000; i++) {
            arr[i & 63] = i * r;
            if (flags() & TF) leaks++;
        }
        left = STEPS;
        __asm__ volatile("pushfq; orq $0x100, (%%rsp); popfq" ::: "memory", "cc");
        while (left > 0) arr[0]++;
    }
    printf("self_step %ld %ld %ld\n", steps, leaks, strays);
    return 0;
}
