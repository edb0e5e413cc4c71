/* A store that faults and runs again: each pass makes the page read-only,
 * so its first store (@store) faults; the program's SIGSEGV handler makes
 * the page writable and returns, and the store runs again. Every pass
 * stores the same values, so each store after the first pass is silent;
 * the attempt that faulted stored nothing and is no store at all.
 * Usage: exact_fault [n] [passes]   prints a checksum and the faults, exits 0.
 */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>

static long *page;
static volatile long faults;

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)uc;
    if ((char *)si->si_addr < (char *)page || (char *)si->si_addr >= (char *)page + 4096) abort();
    mprotect(page, 4096, PROT_READ | PROT_WRITE);
    faults++;
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 16;
    long passes = argc > 2 ? atol(argv[2]) : 4;
    if (n > 512) n = 512;
    page = mmap(0, 4096, PROT_READ, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (page == MAP_FAILED) return 1;
    struct sigaction sa = {0};
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigaction(SIGSEGV, &sa, 0);
    long sum = 0;
    for (long p = 0; p < passes; p++) {
        mprotect(page, 4096, PROT_READ);
        for (long i = 0; i < n; i++) ((volatile long *)page)[i] = i * 5; /* @store */
        for (long i = 0; i < n; i++) sum += ((volatile long *)page)[i];  /* @read */
    }
    printf("exact_fault %ld faults %ld\n", sum, faults);
    return 0;
}
