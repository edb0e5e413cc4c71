/* Holds process PID as its tracer (PTRACE_SEIZE, which neither stops nor
 * signals it) for SECONDS, then exits (the kernel lets it go).
 * Usage: tracer PID SECONDS; prints "tracing" once it holds PID. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/ptrace.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 3) {
        fprintf(stderr, "usage: tracer PID SECONDS\n");
        return 2;
    }
    if (ptrace(PTRACE_SEIZE, atoi(argv[1]), 0, 0) != 0) {
        perror("PTRACE_SEIZE");
        return 1;
    }
    printf("tracing\n");
    fflush(stdout);
    sleep(atoi(argv[2]));
    return 0;
}
