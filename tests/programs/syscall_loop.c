/* Spends nearly all of its time in system calls: a loop of getppid(2),
 * each followed by one store, for 300 ms of its own CPU time. (The C
 * library's getppid makes the system call itself.) A CPU-time tick that
 * expires in the kernel is delivered when the call returns, so most ticks
 * land on the instruction right after the `syscall`: time that was the
 * kernel's, where a sampler must not anchor a burst.
 *
 * With "mixed", half of the CPU time goes to getppid through syscall(3),
 * which witch's agent wraps (so those ticks land in the agent's code), and
 * half to a loop of stores: the program's time in both halves earns the
 * overhead budget alike.
 *
 * Usage: syscall_loop [mixed]   prints "syscall_loop 1", exits 0.
 */
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <sys/syscall.h>

static volatile long a[64];

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    int mixed = argc > 1 && strcmp(argv[1], "mixed") == 0;
    long n = 0;
    if (!mixed) {
        while (cpu_seconds() < 0.3) {
            for (int i = 0; i < 1000; i++, n++) {
                a[i & 63] = getppid() + i; /* @after */
            }
        }
    } else {
        /* Alternate 10 ms of each until 1 s of CPU time. */
        double t = cpu_seconds(), end = t + 1.0;
        while (t < end) {
            double half = t + 0.01;
            while ((t = cpu_seconds()) < half)
                for (int i = 0; i < 100; i++, n++) a[i & 63] = syscall(SYS_getppid) + i;
            half = t + 0.01;
            while ((t = cpu_seconds()) < half)
                for (long i = 0; i < 10000; i++) a[i & 63] = i; /* @plain */
        }
    }
    printf("syscall_loop %ld\n", n > 0);
    return 0;
}
