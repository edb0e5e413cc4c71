/* Threads that check their own alternate signal stack, for attaches that
 * end while some of them are busy: two spinning threads (one with an
 * alternate stack of its own, one without), two threads that spin on
 * request and then block in read (likewise), and one blocked in read
 * throughout, with a stack of its own.  Each thread records the stack it
 * installed (or none) when it starts.
 *
 * Commands on stdin, a line each:
 *   g  the two "block" threads spin (busy) until b
 *   b  they stop spinning and block in read again
 *   r  every thread reports: its sigaltstack is still exactly the one it
 *      installed (or none), and a signal raised at itself (SA_ONSTACK
 *      handler) runs on that stack (or, with none, on the thread's own
 *      stack).  One line per thread, "NAME altstack ok signal ok", or
 *      WRONG with what it found.
 * At EOF every thread ends; exits 3.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#define NT 5
#define OWN_SIZE (64 * 1024)

struct th {
    const char *name;
    int own;   /* installs an alternate stack of its own */
    int kind;  /* 0 spins, 1 spins on request then blocks, 2 blocked throughout */
    int pipe[2];
    stack_t mine;
    uintptr_t lo, hi; /* the thread's own stack */
    char line[256];
};

static struct th ths[NT] = {
    {"spin-own", 1, 0}, {"spin-none", 0, 0}, {"block-own", 1, 1}, {"block-none", 0, 1}, {"idle-own", 1, 2},
};
static volatile int want, quit, busy;
static volatile int reported;
static volatile unsigned long sink;
static __thread volatile uintptr_t handler_sp;
static __thread volatile int handler_onstack;

static void on_usr1(int sig) {
    (void)sig;
    volatile char here;
    stack_t cur;
    handler_sp = (uintptr_t)&here;
    handler_onstack = sigaltstack(NULL, &cur) == 0 && (cur.ss_flags & SS_ONSTACK);
}

static void report(struct th *t) {
    stack_t cur;
    char alt[96], sig[96];
    if (sigaltstack(NULL, &cur) != 0) {
        snprintf(alt, sizeof alt, "WRONG(sigaltstack failed)");
    } else if (t->own ? (cur.ss_sp == t->mine.ss_sp && cur.ss_size == t->mine.ss_size && cur.ss_flags == 0)
                      : (cur.ss_flags & SS_DISABLE) != 0) {
        snprintf(alt, sizeof alt, "ok");
    } else {
        snprintf(alt, sizeof alt, "WRONG(sp=%p size=%zu flags=%d)", cur.ss_sp, cur.ss_size, cur.ss_flags);
    }
    handler_sp = 0;
    pthread_kill(pthread_self(), SIGUSR1);
    uintptr_t sp = handler_sp;
    uintptr_t lo = t->own ? (uintptr_t)t->mine.ss_sp : t->lo, hi = t->own ? lo + t->mine.ss_size : t->hi;
    if (sp >= lo && sp < hi && handler_onstack == t->own)
        snprintf(sig, sizeof sig, "ok");
    else
        snprintf(sig, sizeof sig, "WRONG(handler at %#lx, onstack %d)", (unsigned long)sp, handler_onstack);
    snprintf(t->line, sizeof t->line, "%s altstack %s signal %s\n", t->name, alt, sig);
    __atomic_add_fetch(&reported, 1, __ATOMIC_SEQ_CST);
}

static void work(void) {
    static __thread volatile unsigned long buf[1024];
    unsigned long s = sink;
    for (int i = 0; i < 10000; i++) buf[i & 1023] = s = s * 6364136223846793005UL + 1442695040888963407UL;
    sink = s;
}

static void *run(void *arg) {
    struct th *t = arg;
    pthread_attr_t a;
    void *base;
    size_t size;
    if (pthread_getattr_np(pthread_self(), &a) != 0 || pthread_attr_getstack(&a, &base, &size) != 0) exit(100);
    t->lo = (uintptr_t)base, t->hi = (uintptr_t)base + size;
    if (t->own) {
        void *m = mmap(NULL, OWN_SIZE, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
        if (m == MAP_FAILED) exit(101);
        t->mine = (stack_t){.ss_sp = m, .ss_size = OWN_SIZE, .ss_flags = 0};
        if (sigaltstack(&t->mine, NULL) != 0) exit(102);
    }
    int done = 0;
    if (t->kind == 0) {
        while (!quit) {
            work();
            if (want != done) report(t), done = want;
        }
        return NULL;
    }
    char c;
    while (read(t->pipe[0], &c, 1) == 1 && c != 'q') {
        if (c == 'r') report(t);
        while (c == 'g' && busy) work();
    }
    return NULL;
}

static void tell(int kind, char c) {
    for (int i = 0; i < NT; i++)
        if (ths[i].kind == kind || (kind < 0 && ths[i].kind != 0))
            if (write(ths[i].pipe[1], &c, 1) != 1) exit(103);
}

int main(void) {
    struct sigaction sa = {0};
    sa.sa_handler = on_usr1;
    sa.sa_flags = SA_ONSTACK | SA_RESTART;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGUSR1, &sa, NULL) != 0) return 104;
    pthread_t ids[NT];
    for (int i = 0; i < NT; i++)
        if (pipe(ths[i].pipe) != 0 || pthread_create(&ids[i], NULL, run, &ths[i]) != 0) return 105;
    char line[64];
    int reports = 0;
    while (fgets(line, sizeof line, stdin)) {
        if (line[0] == 'g') {
            busy = 1;
            tell(1, 'g');
        } else if (line[0] == 'b') {
            busy = 0;
        } else if (line[0] == 'r') {
            reported = 0;
            tell(-1, 'r');
            want++;
            while (__atomic_load_n(&reported, __ATOMIC_SEQ_CST) < NT) {
                struct timespec ms = {0, 1000000};
                nanosleep(&ms, NULL);
            }
            for (int i = 0; i < NT; i++) fputs(ths[i].line, stdout);
            fflush(stdout);
            reports++;
        }
    }
    quit = 1;
    busy = 0;
    tell(-1, 'q');
    for (int i = 0; i < NT; i++) pthread_join(ids[i], NULL);
    printf("reports %d\n", reports);
    return 3;
}
