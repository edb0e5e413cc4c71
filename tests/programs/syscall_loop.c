/* Spends nearly all of its time in system calls: a loop of getppid(2),
 * each followed by one store, for 300 ms of its own CPU time. (The C
 * library's getppid makes the system call itself; syscall(2) would go
 * through witch's agent, which wraps it.) A CPU-time tick that expires in
 * the kernel is delivered when the call returns, so most ticks land on the
 * instruction right after the `syscall`: time that was the kernel's, where
 * a sampler must not anchor a burst.
 *
 * Usage: syscall_loop   prints "syscall_loop 1", exits 0.
 */
#include <stdio.h>
#include <time.h>
#include <unistd.h>

static volatile long a[64];

static double cpu_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(void) {
    long n = 0;
    while (cpu_seconds() < 0.3) {
        for (int i = 0; i < 1000; i++, n++) {
            a[i & 63] = getppid() + i; /* @after */
        }
    }
    printf("syscall_loop %ld\n", n > 0);
    return 0;
}
