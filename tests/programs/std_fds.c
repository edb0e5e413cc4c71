/* Says which standard descriptors (0, 1, 2) it started with open, the
 * number its first open() gets (the lowest closed one), and which signals
 * it started with ignored.
 *
 * Usage: std_fds   prints two lines, exits 0.
 */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    int open_fds = 0;
    for (int fd = 0; fd < 3; fd++)
        if (fcntl(fd, F_GETFD) != -1) open_fds |= 1 << fd;
    int f = open("/dev/null", O_RDONLY);
    printf("standard descriptors open (bits): %d; the first open gets %d\n", open_fds, f);
    printf("ignored signals:");
    for (int s = 1; s < 32; s++) {
        struct sigaction a;
        if (sigaction(s, NULL, &a) == 0 && a.sa_handler == SIG_IGN) printf(" %d", s);
    }
    printf("\n");
    return 0;
}
