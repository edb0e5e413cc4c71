/* A program that keeps per-CPU counters with restartable sequences, as
 * tcmalloc's per-CPU caches and librseq's users do: each thread reads the
 * CPU it runs on from the rseq area glibc registered for it, and adds one
 * to that CPU's counter in a critical section (read the counter, work a
 * while, store the counter plus one) that the kernel aborts and the
 * thread restarts whenever the thread is preempted, migrated or signalled
 * inside it. No atomic instruction and no lock: the kernel's aborts alone
 * make the sum exact. A profiler that runs the section from anywhere but
 * its own addresses (a copy in a code cache) takes the abort away, and
 * threads sharing a CPU lose each other's increments.
 *
 * The descriptor sits in the `__rseq_cs` section with a pointer to it in
 * `__rseq_cs_ptr_array`, librseq's convention.
 *
 * Usage: rseq_counters [threads] [adds per thread] [spin]
 *          prints the sum and what it should be (and on stderr the aborts
 *          taken, which vary from run to run); adds 0: until its stdin
 *          closes (a target to attach to), then the same check, against
 *          the adds the threads counted themselves;
 *          exits 0 when the sum is exact, 1 when increments were lost,
 *          3 when this system gives the threads no rseq area.
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/rseq.h>
#include <unistd.h>
#include "stdin_closed.h"

#define MAX_CPUS 1024
#define STRIDE 8 /* one counter per 64-byte line */

static long counters[MAX_CPUS * STRIDE] __attribute__((aligned(64)));
static long adds = 2000000, spin = 40;
static long aborts_total, adds_total;
static volatile int stop;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

/* One increment of this CPU's counter; returns 0 when committed, 1 when
 * the kernel aborted the section (the caller retries). */
static int add_one(void) {
    long off = (long)__rseq_offset;
    __asm__ __volatile__ goto(
        ".pushsection __rseq_cs, \"aw\"\n\t"
        ".balign 32\n\t"
        "3:\n\t"
        ".long 0, 0\n\t"
        ".quad 1f, (2f - 1f), 4f\n\t"
        ".popsection\n\t"
        ".pushsection __rseq_cs_ptr_array, \"aw\"\n\t"
        ".quad 3b\n\t"
        ".popsection\n\t"
        "leaq 3b(%%rip), %%rax\n\t"
        "movq %%rax, %%fs:8(%[off])\n\t"
        "1:\n\t"
        "movl %%fs:4(%[off]), %%eax\n\t"  /* cpu_id */
        "shll $6, %%eax\n\t"               /* * 64 bytes */
        "leaq (%[base], %%rax), %%rdx\n\t"
        "movq (%%rdx), %%rcx\n\t"          /* read the counter */
        "movq %[spin], %%rax\n\t"
        "5:\n\t"
        "decq %%rax\n\t"
        "jnz 5b\n\t"
        "incq %%rcx\n\t"
        "movq %%rcx, (%%rdx)\n\t"          /* commit */
        "2:\n\t"
        ".pushsection __rseq_failure, \"ax\"\n\t"
        ".long 0x53053053\n\t"            /* glibc's RSEQ_SIG, before the abort address */
        "4:\n\t"
        "jmp %l[aborted]\n\t"
        ".popsection\n\t"
        :
        : [off] "r"(off), [base] "r"(counters), [spin] "r"(spin)
        : "memory", "cc", "rax", "rcx", "rdx"
        : aborted);
    return 0;
aborted:
    return 1;
}

static void *work(void *arg) {
    (void)arg;
    long ab = 0, i;
    for (i = 0; adds ? i < adds : !stop; i++)
        while (add_one()) ab++;
    pthread_mutex_lock(&lock);
    aborts_total += ab;
    adds_total += i;
    pthread_mutex_unlock(&lock);
    return NULL;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 6;
    if (argc > 2) adds = atol(argv[2]);
    if (argc > 3) spin = atol(argv[3]);
    if (threads < 1 || threads > 64 || adds < 0 || spin < 1) return 2;
    struct rseq *area = (struct rseq *)((char *)__builtin_thread_pointer() + __rseq_offset);
    if (__rseq_size == 0 || (int)area->cpu_id < 0) {
        printf("no rseq area (glibc.pthread.rseq=0, or a kernel without rseq)\n");
        return 3;
    }
    pthread_t t[64];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, work, NULL);
    while (!adds && !stdin_closed()) usleep(10000);
    stop = 1;
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    long sum = 0;
    for (int c = 0; c < MAX_CPUS; c++) sum += counters[c * STRIDE];
    long want = adds_total;
    printf("sum %ld of %ld (%s)\n", sum, want, sum == want ? "exact" : "increments lost");
    fprintf(stderr, "%ld sections aborted and restarted\n", aborts_total);
    return sum == want ? 0 : 1;
}
