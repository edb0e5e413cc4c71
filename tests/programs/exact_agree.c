/* The two exact modes on the same small run, for all three crafts: dead
 * and used stores in the main thread and in two workers, a `rep stosq`
 * string whose bytes are overwritten by a loop (dead) and then read
 * (used), and a system call between the loops (the code-cache mode runs
 * it natively and resumes after it). For the value crafts, each pass also
 * stores and loads values that repeat from pass to pass, or nearly, or
 * change: doubles that move by less than the default precision (@fstore,
 * @fload), a 16-byte vector store and load (@vstore, @vload), a `rep
 * movsq` between distinct buffers (@copy; again with a count of zero on
 * every other pass, which accesses nothing), an overlapping forward `rep
 * movsb` (a memmove-like shift, each element reading the byte the one
 * before it wrote: @shift), calls and returns of a function (@leaf: its
 * return address pushed and loaded), and a pipe's bytes written by the
 * kernel into a variable the program then loads (@pipe).
 * Usage: exact_agree [n] [passes]   prints checksums, exits 3.
 */
#include <emmintrin.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define THREADS 2

static long n = 16, passes = 3;

static void fill(long *a, long count, long v) {
    __asm__ volatile("rep stosq" : "+D"(a), "+c"(count) : "a"(v) : "memory"); /* @stos */
}

static void copy(long *dst, const long *src, long count) {
    __asm__ volatile("rep movsq" : "+D"(dst), "+S"(src), "+c"(count) : : "memory"); /* @copy */
}

static void shift(char *b, long count) {
    char *dst = b + 1;
    __asm__ volatile("rep movsb" : "+D"(dst), "+S"(b), "+c"(count) : : "memory"); /* @shift */
}

__attribute__((noinline)) static long leaf(long x) {
    __asm__ volatile("" ::: "memory");
    return x * 3 + 1; /* @leaf */
}

static volatile double f[8];
static long src[8], dst[8];
static char bytes[48];
static int vec[4];

static long values(long p, int pipe_out, int pipe_in) {
    long s = 0;
    for (int i = 0; i < 8; i++) f[i] = (i + 1) * (1.0 + p * 1e-4); /* @fstore */
    for (int i = 0; i < 8; i++) s += (long)f[i];                      /* @fload */
    __m128i x = _mm_set1_epi32((int)(p / 2)), v;
    __asm__ volatile("movdqu %1, %0" : "=m"(*(__m128i *)vec) : "x"(x)); /* @vstore */
    __asm__ volatile("movdqu %1, %0" : "=x"(v) : "m"(*(__m128i *)vec)); /* @vload */
    s += _mm_cvtsi128_si32(v);
    for (int i = 0; i < 8; i++) src[i] = i * (p / 2);
    copy(dst, src, 8);
    copy(dst + 4, src, p & 1 ? 2 : 0); /* a zero count on even passes: no access */
    bytes[0] = (char)(p / 2 + 'a');
    shift(bytes, 32);
    for (int i = 0; i < 8; i++) s += dst[i] + bytes[i * 4];
    s += leaf(p) + leaf(p);
    long token = p / 2, got = 0;
    if (write(pipe_out, &token, sizeof token) != sizeof token || read(pipe_in, &got, sizeof got) != sizeof got) return -1;
    s += *(volatile long *)&got; /* @pipe */
    return s;
}

static void *worker(void *arg) {
    volatile long *a = arg;
    for (long p = 0; p < passes; p++) {
        for (long i = 0; i < n; i++) a[i] = p + i;     /* @tw */
        for (long i = 0; i < n; i++) a[i] = p * 3 + i; /* @tk */
    }
    long s = 0;
    for (long i = 0; i < n; i++) s += a[i]; /* @tread */
    return (void *)s;
}

int main(int argc, char **argv) {
    if (argc > 1) n = atol(argv[1]);
    if (argc > 2) passes = atol(argv[2]);
    long *m = calloc(n, sizeof(long));
    int fds[2];
    if (pipe(fds) != 0) return 1;
    long sum = 0, vs = 0;
    for (long p = 0; p < passes; p++) {
        fill(m, n, p);
        getppid();
        for (long i = 0; i < n; i++) ((volatile long *)m)[i] = i * p; /* @over */
        for (long i = 0; i < n; i++) sum += ((volatile long *)m)[i];  /* @read */
        vs += values(p, fds[1], fds[0]);
    }
    pthread_t t[THREADS];
    long *arrays[THREADS];
    for (int k = 0; k < THREADS; k++) {
        arrays[k] = calloc(n, sizeof(long));
        pthread_create(&t[k], 0, worker, arrays[k]);
    }
    for (int k = 0; k < THREADS; k++) {
        void *r;
        pthread_join(t[k], &r);
        printf("worker %d %ld\n", k, (long)r);
    }
    printf("main %ld values %ld\n", sum, vs);
    return 3;
}
