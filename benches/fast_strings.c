/* Why an armed watchpoint costs even when it never fires: with any data
 * breakpoint enabled in DR7, the CPU turns off fast-string operation, and
 * the kernel clears new pages with `rep stosb` (clear_page_erms). This
 * times page faults with and without one armed watchpoint.
 *   gcc -O2 -o target/fast_strings benches/fast_strings.c && target/fast_strings */
#include <linux/perf_event.h>
#include <linux/hw_breakpoint.h>
#include <sys/syscall.h>
#include <sys/mman.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
static volatile long spot;
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + t.tv_nsec * 1e-9; }
static double faults(void) {
    double t = now();
    for (int r = 0; r < 20; r++) {
        char *p = mmap(0, 32 << 20, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        for (long i = 0; i < (32 << 20); i += 4096) p[i] = 1;
        munmap(p, 32 << 20);
    }
    return now() - t;
}
int main(void) {
    printf("page faults, no watchpoint: %.3f s\n", faults());
    struct perf_event_attr a; memset(&a, 0, sizeof a);
    a.type = PERF_TYPE_BREAKPOINT; a.size = sizeof a; a.bp_type = HW_BREAKPOINT_W;
    a.bp_addr = (unsigned long)&spot; a.bp_len = 8; a.sample_period = 1; a.exclude_kernel = 1; a.exclude_hv = 1;
    int fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    printf("page faults, watchpoint armed (fd %d): %.3f s\n", fd, faults());
    close(fd);
    printf("page faults, no watchpoint: %.3f s\n", faults());
}
