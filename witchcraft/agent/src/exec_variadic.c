/* execl, execlp and execle are variadic, which stable Rust cannot define.
 *
 * Preloaded, the exported wrappers below interpose the C library's: glibc
 * implements them with an internal execve that no preload can interpose,
 * so without them an image replaced through execl* would leave no profile.
 * They build argv and call the interposed execve / execvp, exactly as
 * glibc does.
 *
 * Attached (loaded with dlopen, RTLD_LOCAL: nothing is interposed), the
 * program's own imports of execl, execlp and execle are pointed at the
 * hidden twins at the end (interpose.rs, imports.rs). They build argv the
 * same way and hand it to the agent, which ends the session (its profile
 * sent) and calls on to the execve or execvp the program's own calls bind
 * to. Hidden, so that their address is the agent's own: inside the agent,
 * the address of an exported name is whatever the loader binds the name
 * to, the C library's when the agent is attached. */
#include <stdarg.h>
#include <stddef.h>
#include <unistd.h>

extern char **environ;

/* Declare `argv` (a VLA) holding `arg` and the variadic arguments up to and
 * including the terminating NULL, consuming them from `ap`. On the stack:
 * nothing is allocated between the session's end and the exec. */
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

#define HIDDEN __attribute__((visibility("hidden")))

/* What each twin is, for the agent (interpose.rs, `witch_attached_exec_argv`). */
enum { WITCH_EXECL = 0, WITCH_EXECLP = 1, WITCH_EXECLE = 2 };

/* The agent's attached exec (interpose.rs): ends the session, then execs.
 * Defined in Rust; declared hidden here, which makes the linked symbol
 * hidden (the most constraining visibility wins): not exported. */
HIDDEN int witch_attached_exec_argv(int which, const char *path, char *const *argv, char *const *envp);

HIDDEN int witch_attached_execl(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    va_end(ap);
    return witch_attached_exec_argv(WITCH_EXECL, path, (char *const *)argv, environ);
}

HIDDEN int witch_attached_execlp(const char *file, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    va_end(ap);
    return witch_attached_exec_argv(WITCH_EXECLP, file, (char *const *)argv, NULL);
}

HIDDEN int witch_attached_execle(const char *path, const char *arg, ...) {
    va_list ap;
    va_start(ap, arg);
    BUILD_ARGV(arg, ap, argv);
    char *const *envp = va_arg(ap, char *const *);
    va_end(ap);
    return witch_attached_exec_argv(WITCH_EXECLE, path, (char *const *)argv, envp);
}
