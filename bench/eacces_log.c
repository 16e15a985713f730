/*
 * An LD_PRELOAD shim for bench/exec_probe.py: logs to stderr every file-system, socket or ioctl
 * call that fails with EACCES or EPERM (what Landlock and seccomp answer), with its path or
 * request, so that a driver that does not start under the sandbox says what it was refused.
 * Probe tool only: never linked into graphd.
 * Built by make as build/bench/eacces_log.so.
 */

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static void note(const char *call, const char *what, long extra, int err)
{
    if (err != EACCES && err != EPERM)
        return;
    char line[640];
    int n = snprintf(line, sizeof line, "eacces_log: %s(%s, %#lx): %s\n", call, what ? what : "?",
                     extra, strerror(err));
    if (n > 0)
        (void)!write(2, line, (size_t)n < sizeof line ? (size_t)n : sizeof line - 1);
}

#define REAL(name, type)                                                                           \
    static __typeof__((type)0) real_##name;                                                        \
    if (!real_##name)                                                                              \
    real_##name = (type)dlsym(RTLD_NEXT, #name)

static int fd_path(int fd, char *buf, size_t n)
{
    char p[64];
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    ssize_t r = readlink(p, buf, n - 1);
    if (r < 0)
        return -1;
    buf[r] = 0;
    return 0;
}

#define OPEN_LIKE(name)                                                                            \
    int name(const char *path, int flags, ...)                                                     \
    {                                                                                              \
        REAL(name, int (*)(const char *, int, ...));                                               \
        mode_t mode = 0;                                                                           \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                       \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, mode_t);                                                             \
            va_end(ap);                                                                            \
        }                                                                                          \
        int r = real_##name(path, flags, mode);                                                    \
        if (r < 0) {                                                                               \
            int e = errno;                                                                         \
            note(#name, path, flags, e);                                                           \
            errno = e;                                                                             \
        }                                                                                          \
        return r;                                                                                  \
    }
OPEN_LIKE(open)
OPEN_LIKE(open64)

#define OPENAT_LIKE(name)                                                                          \
    int name(int dfd, const char *path, int flags, ...)                                            \
    {                                                                                              \
        REAL(name, int (*)(int, const char *, int, ...));                                          \
        mode_t mode = 0;                                                                           \
        if (flags & (O_CREAT | O_TMPFILE)) {                                                       \
            va_list ap;                                                                            \
            va_start(ap, flags);                                                                   \
            mode = va_arg(ap, mode_t);                                                             \
            va_end(ap);                                                                            \
        }                                                                                          \
        int r = real_##name(dfd, path, flags, mode);                                               \
        if (r < 0) {                                                                               \
            int e = errno;                                                                         \
            note(#name, path, flags, e);                                                           \
            errno = e;                                                                             \
        }                                                                                          \
        return r;                                                                                  \
    }
OPENAT_LIKE(openat)
OPENAT_LIKE(openat64)

int __open_2(const char *path, int flags)
{
    return open(path, flags);
}
int __open64_2(const char *path, int flags)
{
    return open64(path, flags);
}
int __openat_2(int dfd, const char *path, int flags)
{
    return openat(dfd, path, flags);
}

#define FOPEN_LIKE(name)                                                                           \
    FILE *name(const char *path, const char *mode)                                                 \
    {                                                                                              \
        REAL(name, FILE *(*)(const char *, const char *));                                         \
        FILE *f = real_##name(path, mode);                                                         \
        if (f == NULL) {                                                                           \
            int e = errno;                                                                         \
            note(#name, path, mode[0], e);                                                         \
            errno = e;                                                                             \
        }                                                                                          \
        return f;                                                                                  \
    }
FOPEN_LIKE(fopen)
FOPEN_LIKE(fopen64)

#define PATH_CALL(name, sig, args, path, extra)                                                    \
    int name sig                                                                                   \
    {                                                                                              \
        REAL(name, int(*) sig);                                                                    \
        int r = real_##name args;                                                                  \
        if (r < 0) {                                                                               \
            int e = errno;                                                                         \
            note(#name, path, (long)(extra), e);                                                   \
            errno = e;                                                                             \
        }                                                                                          \
        return r;                                                                                  \
    }
PATH_CALL(access, (const char *p, int m), (p, m), p, m)
PATH_CALL(faccessat, (int d, const char *p, int m, int f), (d, p, m, f), p, m)
PATH_CALL(mkdir, (const char *p, mode_t m), (p, m), p, m)
PATH_CALL(unlink, (const char *p), (p), p, 0)
PATH_CALL(stat, (const char *p, struct stat *st), (p, st), p, 0)
PATH_CALL(lstat, (const char *p, struct stat *st), (p, st), p, 0)
PATH_CALL(truncate, (const char *p, off_t l), (p, l), p, l)
PATH_CALL(ftruncate, (int fd, off_t l), (fd, l), "(fd)", fd)
PATH_CALL(socket, (int d, int t, int p), (d, t, p), "(socket)", d)
PATH_CALL(shm_unlink, (const char *p), (p), p, 0)

int shm_open(const char *p, int f, mode_t m)
{
    REAL(shm_open, int (*)(const char *, int, mode_t));
    int r = real_shm_open(p, f, m);
    if (r < 0) {
        int e = errno;
        note("shm_open", p, f, e);
        errno = e;
    }
    return r;
}

int connect(int fd, const struct sockaddr *a, socklen_t n)
{
    REAL(connect, int (*)(int, const struct sockaddr *, socklen_t));
    int r = real_connect(fd, a, n);
    if (r < 0) {
        int e = errno;
        const char *what = "(inet)";
        if (a && a->sa_family == AF_UNIX)
            what = ((const struct sockaddr_un *)a)->sun_path[0]
                       ? ((const struct sockaddr_un *)a)->sun_path
                       : "(abstract unix)";
        note("connect", what, fd, e);
        errno = e;
    }
    return r;
}

int ioctl(int fd, unsigned long req, ...)
{
    REAL(ioctl, int (*)(int, unsigned long, void *));
    va_list ap;
    va_start(ap, req);
    void *arg = va_arg(ap, void *);
    va_end(ap);
    int r = real_ioctl(fd, req, arg);
    if (r < 0 && (errno == EACCES || errno == EPERM)) {
        int e = errno;
        char path[256] = "?";
        fd_path(fd, path, sizeof path);
        note("ioctl", path, (long)req, e);
        errno = e;
    }
    return r;
}
