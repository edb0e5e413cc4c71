/* A program that patches its own code, as hot-patching and function-hook
 * libraries do: it calls a function of its own many times, makes the
 * function's page writable (mprotect, through the C library or through
 * syscall(2)), writes new instructions over the function (return x + 2
 * instead of x + 1), makes it executable again, and calls it as many
 * times more. The sums tell whether every call after the patch ran the
 * new code.
 *
 * Usage: hot_patch libc|syscall [calls [late]]
 *          with `late`, it calls the function until its stdin closes
 *          before it patches (a target to attach to first);
 *          prints the difference of the two sums against the calls;
 *          exits 0 when every call after the patch ran the new code.
 */
#define _GNU_SOURCE
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include "stdin_closed.h"

__attribute__((noinline, aligned(64))) int f(int x) { return x + 1; }

__attribute__((noinline)) static long run(long n) {
    long s = 0;
    int (*volatile g)(int) = f;
    for (long i = 0; i < n; i++) s += g((int)i & 7);
    return s;
}

static int protect(void *p, size_t len, int prot, int raw) {
    return raw ? (int)syscall(SYS_mprotect, p, len, prot) : mprotect(p, len, prot);
}

int main(int argc, char **argv) {
    if (argc < 2) return 2;
    int raw = strcmp(argv[1], "syscall") == 0;
    long n = argc > 2 ? atol(argv[2]) : 20000000;
    int late = argc > 3 && strcmp(argv[3], "late") == 0;
    long before = run(n);
    while (late && !stdin_closed()) run(100000);
    void *page = (void *)((uintptr_t)f & ~4095UL);
    if (protect(page, 8192, PROT_READ | PROT_WRITE | PROT_EXEC, raw)) {
        perror("mprotect");
        return 3;
    }
    static const unsigned char code[] = {0x8d, 0x47, 0x02, 0xc3}; /* lea eax, [rdi+2]; ret */
    memcpy((void *)f, code, sizeof code);
    __builtin___clear_cache((char *)f, (char *)f + sizeof code);
    protect(page, 8192, PROT_READ | PROT_EXEC, raw);
    long after = run(n);
    printf("after the patch: %ld more of %ld calls\n", after - before, n);
    return after - before == n ? 0 : 1;
}
