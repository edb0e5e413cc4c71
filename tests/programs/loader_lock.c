/*
 * A library constructor that waits for the main thread while the dynamic
 * loader's lock is held: a thread `dlopen`s LIB (loader_lock_lib.c), whose
 * constructor waits for a byte on a pipe; the main thread sleeps 2 s in
 * nanosleep, writes it, joins the thread and prints what the library set.
 * A `dlopen` made by the main thread during those 2 s waits for the lock,
 * which the constructor holds until the main thread writes: neither would
 * ever go on.
 *
 * Usage: loader_lock LIB
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static const char *lib;
static int *value;

static void *load(void *arg) {
    (void)arg;
    void *h = dlopen(lib, RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
        exit(2);
    }
    value = dlsym(h, "loader_lock_value");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: loader_lock LIB\n");
        return 2;
    }
    lib = argv[1];
    int p[2];
    if (pipe(p) != 0)
        return 2;
    char fd[16];
    snprintf(fd, sizeof fd, "%d", p[0]);
    setenv("LOADER_LOCK_FD", fd, 1);
    pthread_t t;
    if (pthread_create(&t, NULL, load, NULL) != 0)
        return 2;
    struct timespec two = {2, 0};
    while (nanosleep(&two, &two) != 0) {
    }
    if (write(p[1], "", 1) != 1)
        return 2;
    pthread_join(t, NULL);
    printf("loaded %d\n", value ? *value : -1);
    return 0;
}
