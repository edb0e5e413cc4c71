/* execl, execlp and execle are variadic, which stable Rust cannot define.
 * glibc implements them with an internal execve that no preload can
 * interpose, so without these wrappers an image replaced through execl*
 * would leave no profile. They build argv and call the interposed
 * execve / execvp, exactly as glibc does. */
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>
#include <errno.h>

extern char **environ;

#define COLLECT(first, ap, argv, n, envp_out)                          \
    do {                                                               \
        va_list c;                                                     \
        va_copy(c, ap);                                                \
        n = 1;                                                         \
        while (va_arg(c, const char *) != NULL) n++;                   \
        va_end(c);                                                     \
    } while (0)

int execl(const char *path, const char *arg, ...) {
    va_list ap;
    size_t n;
    va_start(ap, arg);
    COLLECT(arg, ap, argv, n, 0);
    const char *argv[n + 1];
    argv[0] = arg;
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(ap, const char *);
    va_end(ap);
    return execve(path, (char *const *)argv, environ);
}

int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    size_t n;
    va_start(ap, arg);
    COLLECT(arg, ap, argv, n, 0);
    const char *argv[n + 1];
    argv[0] = arg;
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(ap, const char *);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

int execle(const char *path, const char *arg, ...) {
    va_list ap;
    size_t n;
    va_start(ap, arg);
    COLLECT(arg, ap, argv, n, 0);
    const char *argv[n + 1];
    argv[0] = arg;
    for (size_t i = 1; i <= n; i++) argv[i] = va_arg(ap, const char *);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
