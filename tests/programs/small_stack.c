/* A target for attaching whose one thread outside the C library has almost
 * no stack left: the main thread is nearly always inside memset (where an
 * attaching witch does not stop a thread: it may hold a lock the injected
 * calls need), and a worker thread sits blocked in read() with ROOM bytes
 * of its stack left below it, a guard page under them.  Before the worker
 * blocks, its stack below it is filled with a pattern.
 *
 * Usage: small_stack ROOM
 *   runs until its stdin closes, then wakes the worker, which prints how
 *   many bytes below its blocked frame were written meanwhile ("written N"),
 *   and exits 0.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include "stdin_closed.h"

#define STACK (256 << 10)
#define PATTERN 0xa5

static char *stack_lo; /* lowest usable byte of the worker's stack */
static long room;
static int wake[2];

static __attribute__((noinline)) long block_here(void) {
    char here;
    /* Fill what is left below this frame (keep 256 bytes for read's own). */
    char *top = &here - 256;
    memset(stack_lo, PATTERN, (size_t)(top - stack_lo));
    char c;
    if (read(wake[0], &c, 1) != 1)
        return -1;
    char *p = stack_lo;
    while (p < top && (unsigned char)*p == PATTERN)
        p++;
    return top - p;
}

/* Use the stack down to `room` bytes above its lowest byte, then block. */
static __attribute__((noinline)) long descend(void) {
    char here;
    long use = (&here - stack_lo) - room;
    if (use < 0)
        use = 0;
    char *pad = __builtin_alloca((size_t)use + 1);
    __asm__ volatile("" : : "r"(pad) : "memory");
    return block_here();
}

static void *worker(void *arg) {
    (void)arg;
    return (void *)descend();
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: small_stack ROOM\n");
        return 2;
    }
    room = atol(argv[1]);
    long page = sysconf(_SC_PAGESIZE);
    char *mem = mmap(NULL, STACK + page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (mem == MAP_FAILED || mprotect(mem, page, PROT_NONE) != 0 || pipe(wake) != 0) {
        perror("setup");
        return 2;
    }
    stack_lo = mem + page;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setstack(&attr, stack_lo, STACK);
    pthread_t t;
    if (pthread_create(&t, &attr, worker, NULL) != 0) {
        fprintf(stderr, "pthread_create failed\n");
        return 2;
    }
    static char big[8 << 20];
    unsigned i = 0;
    while (!stdin_closed())
        memset(big, (int)i++, sizeof big);
    if (write(wake[1], "x", 1) != 1)
        return 2;
    void *got;
    pthread_join(t, &got);
    printf("written %ld\n", (long)got);
    return 0;
}
