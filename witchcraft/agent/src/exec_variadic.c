/* execl, execlp and execle are variadic, which stable Rust cannot define.
 * glibc implements them with an internal execve that no preload can
 * interpose, so without these wrappers an image replaced through execl*
 * would leave no profile. They build argv and call the interposed
 * execve / execvp, exactly as glibc does. */
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

extern char **environ;

/* Declare `argv` (a VLA) holding `arg` and the variadic arguments up to and
 * including the terminating NULL, consuming them from `ap`. */
#define BUILD_ARGV(arg, ap, argv)                                          \
    size_t n_ = 1;                                                         \
    {                                                                      \
        va_list c_;                                                        \
        va_copy(c_, ap);                                                   \
        while (va_arg(c_, const char *) != NULL) n_++;                     \
        va_end(c_);                                                        \
    }                                                                      \
    const char *argv[n_ + 1];                                              \
    argv[0] = arg;                                                         \
    for (size_t i_ = 1; i_ <= n_; i_++) argv[i_] = va_arg(ap, const char *)

int execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    va_end(ap);
    return execve(path, (char *const *)argv, environ);
}

int execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    va_end(ap);
    return execvp(file, (char *const *)argv);
}

int execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return execve(path, (char *const *)argv, envp);
}
