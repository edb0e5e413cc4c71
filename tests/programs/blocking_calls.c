/* Blocking calls that an attach must not cut short: each of sleep,
 * nanosleep, usleep, poll, epoll_wait, select and ppoll (with a signal mask
 * of its own for the wait, after which the thread's must be back) waits SECONDS with nothing
 * to wake it, and reports whether it returned as it does undisturbed (0,
 * no error, after the full time).  With KIND "all", one thread per call
 * (and the main thread joining them); otherwise the one call on the main
 * thread, the only thread.  Results are printed in a fixed order, so an
 * undisturbed run always prints the same.
 *
 * Usage: blocking_calls KIND SECONDS; exits 0.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static const char *kinds[] = {"sleep", "nanosleep", "usleep", "poll", "epoll", "select", "recv", "accept", "ppoll"};
#define KINDS 9
static int seconds;
static char result[KINDS][160];

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void *call(void *arg) {
    int k = (int)(long)arg;
    double t0 = now();
    long r = 0;
    int err = 0, mask_kept = 1;
    errno = 0;
    switch (k) {
    case 0: r = sleep(seconds); break;
    case 1: {
        struct timespec t = {seconds, 0}, rem;
        r = nanosleep(&t, &rem);
        break;
    }
    case 2: r = usleep(seconds * 1000000u); break;
    case 3: r = poll(NULL, 0, seconds * 1000); break;
    case 4: {
        int ep = epoll_create1(0);
        struct epoll_event ev;
        r = epoll_wait(ep, &ev, 1, seconds * 1000);
        break;
    }
    case 5: {
        struct timeval tv = {seconds, 0};
        r = select(0, NULL, NULL, NULL, &tv);
        break;
    }
    case 6: {
        /* Nothing ever arrives: -1 EAGAIN after the timeout. */
        int sv[2];
        char b[8];
        struct timeval tv = {seconds, 0};
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0 || setsockopt(sv[0], SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0) return NULL;
        errno = 0;
        r = recv(sv[0], b, sizeof b, 0);
        break;
    }
    case 7: {
        /* An abstract listening socket nobody connects to. */
        int l = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un a = {.sun_family = AF_UNIX};
        struct timeval tv = {seconds, 0};
        snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "witch-blocking-calls-%d", (int)getpid());
        if (l < 0 || bind(l, (struct sockaddr *)&a, sizeof a) != 0 || listen(l, 1) != 0 ||
            setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) != 0)
            return NULL;
        errno = 0;
        r = accept(l, NULL, NULL);
        break;
    }
    case 8: {
        /* SIGUSR2 blocked, and during the wait SIGUSR1 instead: afterwards
         * the thread's own mask must be back. */
        sigset_t own, during, after;
        struct timespec t = {seconds, 0};
        sigemptyset(&own);
        sigaddset(&own, SIGUSR2);
        sigemptyset(&during);
        sigaddset(&during, SIGUSR1);
        pthread_sigmask(SIG_SETMASK, &own, NULL);
        r = ppoll(NULL, 0, &t, &during);
        err = r < 0 ? errno : 0;
        pthread_sigmask(SIG_SETMASK, NULL, &after);
        mask_kept = sigismember(&after, SIGUSR2) == 1 && sigismember(&after, SIGUSR1) == 0;
        errno = err;
        break;
    }
    }
    err = r < 0 ? errno : 0;
    double took = now() - t0;
    snprintf(result[k], sizeof result[k], "%s returned %ld%s%s, %s%s", kinds[k], r, err ? " errno " : "", err ? strerror(err) : "",
             took >= seconds - 0.02 ? "after the full time" : "EARLY", k == 8 && !mask_kept ? ", SIGNAL MASK CHANGED" : "");
    return NULL;
}

int main(int argc, char **argv) {
    if (argc < 3) return 2;
    seconds = atoi(argv[2]);
    if (strcmp(argv[1], "all") == 0) {
        pthread_t t[KINDS];
        for (long k = 0; k < KINDS; k++)
            if (pthread_create(&t[k], NULL, call, (void *)k) != 0) return 100;
        for (int k = 0; k < KINDS; k++) pthread_join(t[k], NULL);
        for (int k = 0; k < KINDS; k++) printf("%s\n", result[k]);
        return 0;
    }
    for (int k = 0; k < KINDS; k++) {
        if (strcmp(argv[1], kinds[k]) == 0) {
            call((void *)(long)k);
            printf("%s\n", result[k]);
            return 0;
        }
    }
    return 2;
}
