/* A program that forbids itself memory both writable and executable
 * (prctl(PR_SET_MDWE, PR_MDWE_REFUSE_EXEC_GAIN), as systemd sets for a
 * service with MemoryDenyWriteExecute=yes; children inherit it), then
 * works in three threads, and in a fork child. Its output depends only on
 * its arguments.
 *
 * Usage: write_xor_exec [reps]   prints whether the setting took and a
 *          checksum; exits 0 (3 if the kernel has no such setting);
 *          reps 0: works until its stdin closes (a target to attach to),
 *          and prints the rounds instead of the checksums.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>
#include "stdin_closed.h"

#define MDWE_SET 65 /* PR_SET_MDWE */
#define MDWE_GET 66
#define REFUSE_EXEC_GAIN 1

static long reps = 20000;
static volatile int stop;

/* Stores overwritten before anyone reads them, and some that are read. */
static void *work(void *arg) {
    long *a = calloc(4096, sizeof *a), s = 0, r;
    for (r = 0; reps ? r < reps : !stop; r++) {
        for (long i = 0; i < 4096; i++) a[i] = i * r + (long)arg;
        for (long i = 0; i < 4096; i += 64) s += a[i];
        if (!reps && !arg && (r & 255) == 0 && stdin_closed()) stop = 1;
    }
    free(a);
    return (void *)(reps ? s : r > 0);
}

int main(int argc, char **argv) {
    if (argc > 1) reps = atol(argv[1]);
    if (prctl(MDWE_SET, REFUSE_EXEC_GAIN, 0, 0, 0) != 0) {
        printf("no PR_SET_MDWE here\n");
        return 3;
    }
    printf("write xor execute: %d\n", prctl(MDWE_GET, 0, 0, 0, 0));
    fflush(stdout);
    pthread_t t[2];
    for (long i = 0; i < 2; i++) pthread_create(&t[i], NULL, work, (void *)(i + 1));
    long s = (long)work(0);
    for (int i = 0; i < 2; i++) {
        void *x;
        pthread_join(t[i], &x);
        s += (long)x;
    }
    printf("checksum %ld\n", s);
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        printf("child: checksum %ld\n", (long)work((void *)3));
        return 0;
    }
    int status = -1;
    waitpid(child, &status, 0);
    printf("child ended: %d\n", status);
    return 0;
}
