/* A program whose own signal handler runs for several sampling periods
 * while witch single-steps the code it interrupted: code the program
 * writes into a writable and executable page (which the code cache does
 * not translate, so a burst there single-steps it), interrupted by
 * SIGUSR1 from another thread, whose handler spins for about a
 * millisecond of CPU time. The kernel keeps the interrupted code's trap
 * flag in the handler's frame; when the handler returns, stepping goes
 * on. The program takes SIGTRAP by default: a step trap witch did not
 * take would kill it; with "own", it has a SIGTRAP handler of its own,
 * which natively never runs: one witch did not take would show as traps.
 *
 * Usage: slow_handler [rounds [own]]   prints a checksum, "handled=yes"
 * and "traps=0", exits 0. The rounds begin once the sender runs, and go
 * on until a few signals were handled (a loaded machine may run them all
 * before the sender's first), so the handler always ran.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

static volatile long handled;
static volatile int stop, started;
static volatile long traps;

static void on_trap(int sig) {
    (void)sig;
    traps++;
}

static double thread_cpu(void) {
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static void on_usr1(int sig) {
    (void)sig;
    double until = thread_cpu() + 0.001;
    volatile long spin = 0;
    while (thread_cpu() < until) spin++;
    handled++;
}

static void *sender(void *arg) {
    pthread_t main = *(pthread_t *)arg;
    started = 1;
    while (!stop) {
        pthread_kill(main, SIGUSR1);
        usleep(3000);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 400;
    /* add qword [rdi], 1; dec rsi; jnz -9; ret */
    static const unsigned char code[] = {0x48, 0x83, 0x07, 0x01, 0x48, 0xff, 0xce, 0x75, 0xf7, 0xc3};
    unsigned char *jit = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (jit == MAP_FAILED) return 2;
    memcpy(jit, code, sizeof code);
    void (*add)(long *, long) = (void (*)(long *, long))jit;
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_RESTART;
    sigaction(SIGUSR1, &sa, NULL);
    if (argc > 2 && strcmp(argv[2], "own") == 0) {
        sa.sa_handler = on_trap;
        sigaction(SIGTRAP, &sa, NULL);
    }
    pthread_t self = pthread_self(), snd;
    pthread_create(&snd, NULL, sender, &self);
    while (!started) sched_yield();
    long x = 0;
    for (long r = 0; r < rounds; r++) {
        add(&x, 100000);
        jit[4096 - 1] = (unsigned char)r; /* the page is written as it runs */
    }
    /* On a loaded machine the rounds may end before a few signals came:
     * go on running the code (on another counter, so the checksum stays)
     * until they have, for at most ten seconds. */
    long more = 0;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    while (handled < 3) {
        add(&more, 100000);
        clock_gettime(CLOCK_MONOTONIC, &t);
        if (t.tv_sec - t0.tv_sec > 10) break;
    }
    stop = 1;
    pthread_join(snd, NULL);
    printf("slow_handler %ld handled=%s traps=%ld\n", x, handled > 0 ? "yes" : "no", traps);
    return 0;
}
