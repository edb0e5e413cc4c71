/* A program linked without PIE that takes the addresses of functions the
 * agent takes the imports of when it attaches (malloc, free, syscall,
 * execve), and calls the first three through them. Such a program's
 * dynamic symbol table gives each of them a *canonical PLT entry* (the
 * symbol undefined, its value the PLT stub), which `dlsym(RTLD_DEFAULT)`
 * returns, and which every module's calls bind to. Built with -no-pie.
 *
 * Usage: no_pie_pointers [rounds]   (0: until stdin closes) prints the
 * rounds and a checksum, exits 5.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

void *(*volatile alloc)(size_t);
void (*volatile release)(void *);
long (*volatile sys)(long, ...);
int (*volatile run)(const char *, char *const[], char *const[]);

static int stdin_closed(void) {
    struct pollfd p = {0, POLLIN, 0};
    char c;
    return poll(&p, 1, 0) == 1 && read(0, &c, 1) == 0;
}

int main(int argc, char **argv) {
    long rounds = argc > 1 ? atol(argv[1]) : 2000;
    long sum = 0, r;
    /* Taken in code compiled without PIC: absolute addresses, which the
     * linker can only give as canonical PLT entries (a pointer in data
     * would get a dynamic relocation instead). */
    alloc = malloc;
    release = free;
    sys = syscall;
    run = execve;
    for (r = 0; rounds == 0 || r < rounds; r++) {
        if (rounds == 0 && r % 64 == 0 && stdin_closed()) break;
        for (int i = 0; i < 64; i++) {
            size_t n = (i % 2) ? 100000 : 100; /* one tracked, one not */
            char *p = alloc(n);
            if (!p) return 1;
            memset(p, i, n);
            sum += p[n - 1] + (sys(SYS_getpid) > 0);
            release(p);
        }
    }
    printf("rounds %ld checksum %ld %d\n", r, sum, run != NULL);
    return 5;
}
