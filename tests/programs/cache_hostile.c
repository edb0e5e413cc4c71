/* What a burst window run from the code cache can meet, all at once: the
 * program's own handlers for signals arriving at a high rate (a profiling
 * timer, and signals from another thread), each checking that the PC its
 * context holds is the program's own code, never a copy of it; a SIGFPE
 * handler that steps over the faulting `idiv` by editing its context's PC;
 * a SIGSEGV handler that leaves with siglongjmp; code the program writes
 * and runs itself, rewritten again and again; AVX-512 stores when the
 * machine has them; `rep` strings; threads, fork + exec. Its output depends
 * only on its arguments, so under witch it must print the same lines and
 * exit with the same status as natively.
 *
 * Usage: cache_hostile [rounds]   prints a checksum and counts, exits 3.
 */
#define _GNU_SOURCE
#include <immintrin.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <ucontext.h>
#include <unistd.h>

/* The program's own code: file-backed executable mappings, read at start. */
static struct { uintptr_t lo, hi; } code[64];
static int ncode;
static uint8_t *jit; /* the page of code the program writes */
static long bad_pc, prof_ticks, usr1_seen, fpe_skipped, segv_jumps;
static __thread sigjmp_buf env;
static __thread volatile int armed;
static char *guard; /* a page nobody may touch */

static int own_code(uintptr_t pc) {
    if (jit && pc >= (uintptr_t)jit && pc < (uintptr_t)jit + 4096) return 1;
    for (int i = 0; i < ncode; i++)
        if (pc >= code[i].lo && pc < code[i].hi) return 1;
    return 0;
}

static void read_maps(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    while (f && fgets(line, sizeof line, f) && ncode < 64) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && perms[2] == 'x' && strchr(line, '/')) {
            code[ncode].lo = lo;
            code[ncode].hi = hi;
            ncode++;
        }
        /* The vDSO too: the program's code. */
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && strstr(line, "[vdso]")) {
            code[ncode].lo = lo;
            code[ncode].hi = hi;
            ncode++;
        }
    }
    if (f) fclose(f);
}

static void check_pc(void *ucv) {
    ucontext_t *uc = ucv;
    uintptr_t pc = (uintptr_t)uc->uc_mcontext.gregs[REG_RIP];
    if (!own_code(pc)) __atomic_fetch_add(&bad_pc, 1, __ATOMIC_RELAXED);
}

static void on_prof(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)si;
    check_pc(uc);
    __atomic_fetch_add(&prof_ticks, 1, __ATOMIC_RELAXED);
}

static void on_usr1(int sig, siginfo_t *si, void *uc) {
    (void)sig, (void)si;
    check_pc(uc);
    __atomic_fetch_add(&usr1_seen, 1, __ATOMIC_RELAXED);
}

/* Step over `idivl %ecx` (2 bytes: F7 F9), leaving a result of -1. */
static void on_fpe(int sig, siginfo_t *si, void *ucv) {
    (void)sig, (void)si;
    ucontext_t *uc = ucv;
    uint8_t *pc = (uint8_t *)uc->uc_mcontext.gregs[REG_RIP];
    if (!own_code((uintptr_t)pc) || pc[0] != 0xF7 || pc[1] != 0xF9) {
        __atomic_fetch_add(&bad_pc, 1, __ATOMIC_RELAXED);
        _exit(99); /* it would loop forever: say so */
    }
    uc->uc_mcontext.gregs[REG_RIP] += 2;
    uc->uc_mcontext.gregs[REG_RAX] = -1;
    __atomic_fetch_add(&fpe_skipped, 1, __ATOMIC_RELAXED);
}

static void on_segv(int sig, siginfo_t *si, void *ucv) {
    (void)sig;
    check_pc(ucv);
    if (armed && (char *)si->si_addr >= guard && (char *)si->si_addr < guard + 4096) siglongjmp(env, 1);
    /* Not the fault the program makes: say where, and die of it. */
    ucontext_t *uc = ucv;
    char msg[128];
    int n = snprintf(msg, sizeof msg, "cache_hostile: unexpected SIGSEGV at pc %llx, address %p, armed %d\n",
                     (unsigned long long)uc->uc_mcontext.gregs[REG_RIP], si->si_addr, armed);
    write(2, msg, n);
    signal(SIGSEGV, SIG_DFL);
}

static int divide(int a, int b) {
    int q;
    __asm__ volatile("cltd; idivl %%ecx" : "=a"(q) : "a"(a), "c"(b) : "rdx", "cc");
    return q;
}

static void rep_copy(char *dst, const char *src, long n) {
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

static void rep_fill(char *dst, int c, long n) {
    __asm__ volatile("rep stosb" : "+D"(dst), "+c"(n) : "a"(c) : "memory");
}

__attribute__((target("avx512f"))) static long avx512_sum(long *dst, long n, long seed) {
    __m512i v = _mm512_set1_epi64(seed);
    for (long i = 0; i + 8 <= n; i += 8) {
        _mm512_storeu_si512((void *)(dst + i), v);
        v = _mm512_add_epi64(v, _mm512_set1_epi64(1));
    }
    /* A masked tail store. */
    __mmask8 m = (__mmask8)((1u << (n & 7)) - 1);
    _mm512_mask_storeu_epi64(dst + (n & ~7L), m, v);
    long s = 0;
    for (long i = 0; i < n; i++) s += dst[i];
    return s;
}

/* Write `mov eax, imm32; ret` into the JIT page and run it. */
static int jit_run(int imm) {
    jit[0] = 0xB8;
    memcpy(jit + 1, &imm, 4);
    jit[5] = 0xC3;
    __builtin___clear_cache((char *)jit, (char *)jit + 6);
    return ((int (*)(void))jit)();
}

static long work(long seed, long rounds, int with_jit) {
    static __thread char a[8192], b[8192];
    static __thread long v[67];
    long sum = 0;
    for (long i = 0; i < rounds; i++) {
        rep_fill(a, (int)(seed + i) & 0xff, 256 + (i & 2047));
        rep_copy(b, a, 2048);
        for (int k = 0; k < 96; k++) b[(i * 7 + k) & 8191] ^= (char)k;
        sum += b[i & 8191] + a[(i * 13) & 8191];
        if (__builtin_cpu_supports("avx512f")) sum += avx512_sum(v, 67, seed + i) & 0xffff;
        else for (int k = 0; k < 67; k++) sum += (v[k] = seed + i + k) & 0xffff;
        if ((i & 511) == 0) sum += divide((int)i + 7, (i & 1024) ? 0 : 3);
        if (with_jit && (i & 63) == 0) sum += jit_run((int)i);
        if ((i & 2047) == 0) {
            armed = 1;
            if (sigsetjmp(env, 1) == 0) {
                guard[i & 4095] = 1; /* faults: the handler jumps back */
                sum += 1000000;     /* never */
            } else {
                __atomic_fetch_add(&segv_jumps, 1, __ATOMIC_RELAXED);
            }
            armed = 0;
        }
    }
    return sum;
}

struct job {
    long seed, rounds, sum;
};

static void *worker(void *arg) {
    struct job *j = arg;
    j->sum = work(j->seed, j->rounds, 0);
    return NULL;
}

static volatile int stop_sender;

static void *sender(void *arg) {
    pthread_t main = *(pthread_t *)arg;
    while (!stop_sender) {
        pthread_kill(main, SIGUSR1);
        usleep(200);
    }
    return NULL;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 60000;
    if (argc > 2) return atoi(argv[2]); /* the exec'd image */
    read_maps();
    jit = mmap(NULL, 4096, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    guard = mmap(NULL, 4096, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (jit == MAP_FAILED || guard == MAP_FAILED) return 2;
    struct sigaction sa = {0};
    sa.sa_flags = SA_SIGINFO | SA_RESTART;
    sa.sa_sigaction = on_prof;
    sigaction(SIGPROF, &sa, NULL);
    sa.sa_sigaction = on_usr1;
    sigaction(SIGUSR1, &sa, NULL);
    sa.sa_sigaction = on_fpe;
    sigaction(SIGFPE, &sa, NULL);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigaction(SIGSEGV, &sa, NULL);
    struct itimerval it = {{0, 1000}, {0, 1000}}; /* 1 kHz of process CPU time */
    setitimer(ITIMER_PROF, &it, NULL);

    pthread_t self = pthread_self(), snd;
    pthread_create(&snd, NULL, sender, &self);
    struct job jobs[3];
    pthread_t t[3];
    for (int i = 0; i < 3; i++) {
        jobs[i] = (struct job){.seed = i * 101, .rounds = rounds / 2};
        pthread_create(&t[i], NULL, worker, &jobs[i]);
    }
    long sum = work(7, rounds, 1);
    for (int i = 0; i < 3; i++) {
        pthread_join(t[i], NULL);
        sum += jobs[i].sum;
    }
    stop_sender = 1;
    pthread_join(snd, NULL);
    struct itimerval off = {{0, 0}, {0, 0}};
    setitimer(ITIMER_PROF, &off, NULL);
    /* fork + exec, and fork + _exit, after the rest. */
    for (int i = 0; i < 4; i++) {
        pid_t pid = fork();
        if (pid == 0) {
            if (i & 1) _exit(i);
            char arg[16];
            snprintf(arg, sizeof arg, "%d", i);
            execl("/proc/self/exe", argv[0], "1", arg, (char *)NULL);
            _exit(100);
        }
        int st;
        waitpid(pid, &st, 0);
        sum += WIFEXITED(st) ? WEXITSTATUS(st) : 1000;
    }
    /* Counts that do not depend on timing: faults and jumps; the signals'
     * arrival counts do, so only that they came and where they landed. */
    printf("cache_hostile %ld fpe=%ld segv=%ld bad_pc=%ld signals=%s\n", sum, fpe_skipped, segv_jumps, bad_pc,
           prof_ticks > 0 && usr1_seen > 0 ? "yes" : "no");
    return 3;
}
