/* What sigaction reads back: for SIGTRAP, SIGRTMIN+7 (the signals witch
 * takes) and SIGUSR1 (an SA_ONSTACK handler, whose mask witch adds to), the
 * program installs a handler and reads its disposition back, printing the
 * flags and the mask it sees.  Under witch the output must be the same as
 * without it (glibc adds SA_RESTORER to what it passes the kernel, and the
 * kernel reports it back).  Prints one line per signal; exits 3. */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>

static void on_sig(int sig) { (void)sig; }

static void show(const char *name, int sig, int flags) {
    struct sigaction sa = {0}, old;
    sa.sa_handler = on_sig;
    sa.sa_flags = flags;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGUSR2);
    if (sigaction(sig, &sa, NULL) != 0 || sigaction(sig, NULL, &old) != 0) {
        printf("%s: sigaction failed\n", name);
        return;
    }
    unsigned long mask = 0;
    for (int s = 1; s < 64; s++)
        if (sigismember(&old.sa_mask, s)) mask |= 1UL << (s - 1);
    printf("%s: handler %s flags %#x restorer %s mask %#lx\n", name, old.sa_handler == on_sig ? "ours" : "OTHER", old.sa_flags,
           old.sa_restorer ? "set" : "none", mask);
}

int main(void) {
    show("SIGTRAP", SIGTRAP, SA_RESTART);
    show("SIGRTMIN+7", SIGRTMIN + 7, 0);
    show("SIGUSR1", SIGUSR1, SA_ONSTACK | SA_RESTART);
    return 3;
}
