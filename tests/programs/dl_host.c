/* A plugin host: loads its plugin with dlopen after it started, then
 * spends its time in the plugin's dead-store loops (dl_plugin.c).
 *
 * Usage: dl_host PLUGIN [reps [FIRST|- [close]]]
 *   PLUGIN is passed to dlopen as given: a path, a bare name found through
 *   the host's RUNPATH, or "$ORIGIN/..." (the loader resolves both from the
 *   caller of dlopen, which a wrapper must not change).
 *   FIRST: another plugin to load before, work in briefly, start and join a
 *   thread while it is loaded, and unload (PLUGIN is then typically mapped
 *   where FIRST was).
 *   close: unload PLUGIN before exiting (as plugin hosts do at shutdown).
 * Prints a checksum, exits 3 (2 if the plugin cannot be loaded).
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#define N (1L << 19)

static volatile long a[N];

static void *idle(void *arg) { return arg; }

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: dl_host PLUGIN [reps]\n");
        return 1;
    }
    long reps = argc > 2 ? atol(argv[2]) : 200;
    if (argc > 3 && argv[3][0] != '-') {
        void *f = dlopen(argv[3], RTLD_NOW);
        long (*first)(volatile long *, long, long) = f ? (long (*)(volatile long *, long, long))dlsym(f, "plugin_work") : NULL;
        if (!first) {
            fprintf(stderr, "dl_host: %s\n", dlerror());
            return 2;
        }
        long r = first(a, N, 20);
        pthread_t t;
        pthread_create(&t, NULL, idle, NULL);
        pthread_join(t, NULL);
        dlclose(f);
        printf("dl_host first %ld\n", r);
    }
    void *h = dlopen(argv[1], RTLD_NOW);
    if (!h) {
        fprintf(stderr, "dl_host: %s\n", dlerror());
        return 2;
    }
    long (*work)(volatile long *, long, long) = (long (*)(volatile long *, long, long))dlsym(h, "plugin_work");
    if (!work) {
        fprintf(stderr, "dl_host: %s\n", dlerror());
        return 2;
    }
    printf("dl_host %ld\n", work(a, N, reps));
    if (argc > 4) dlclose(h);
    return 3;
}
