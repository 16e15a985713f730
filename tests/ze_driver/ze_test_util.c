/* What the Level Zero tests share (ze_test_util.h). */
#include "ze_test_util.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

void zt_apply_env(const char *const *env)
{
    for (size_t i = 0; env != NULL && env[i] != NULL; i++) {
        const char *eq = strchr(env[i], '=');
        if (eq == NULL) {
            unsetenv(env[i]);
        } else {
            char name[128];
            snprintf(name, sizeof(name), "%.*s", (int)(eq - env[i]), env[i]);
            setenv(name, eq + 1, 1);
        }
    }
}

int zt_run_modes(const char *self_exe, const char *name, const char *suite_env,
                 const char *const *env, char *driver)
{
    char dir[PATH_MAX], path[PATH_MAX];
    snprintf(dir, sizeof(dir), "%s", self_exe);
    char *slash = strrchr(dir, '/');
    if (slash == NULL)
        return 2;
    *slash = '\0';
    char guess[PATH_MAX + 64];
    snprintf(guess, sizeof(guess), "%s/../ze_driver/libze_graphd_test.so", dir);
    if (realpath(guess, path) == NULL) {
        fprintf(stderr, "%s: no driver at %s (make builds it)\n", name, guess);
        return 2;
    }
    if (driver != NULL)
        snprintf(driver, PATH_MAX, "%s", path);
    static const char *const clear[] = {
        "GRAPHD_ZE_TEST_DEVICES",
        "GRAPHD_ZE_TEST_MEM_MB",
        "GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER",
        "GRAPHD_ZE_TEST_DEVICE_LOST_AFTER",
        "GRAPHD_ZE_TEST_NO_IPC",
        "GRAPHD_ZE_TEST_NO_EVENT_IPC",
        "GRAPHD_ZE_TEST_NO_SYSMAN",
        "GRAPHD_ZE_TEST_INIT_FAIL",
        "GRAPHD_ZE_TEST_HANG_MS",
        "GRAPHD_ZE_TEST_API_VERSION",
        "GRAPHD_ZE_TEST_DIRTY_ALLOC",
        "GRAPHD_ZE_TEST_FREE_LOG",
        "ZE_ENABLE_VALIDATION_LAYER",
        "ZE_ENABLE_TRACING_LAYER",
        "ZE_AFFINITY_MASK",
        "ZES_ENABLE_SYSMAN",
        "GRAPHD_ZE_LOADER",
    };
    for (size_t i = 0; i < sizeof(clear) / sizeof(clear[0]); i++)
        unsetenv(clear[i]);
    setenv("ZE_ENABLE_ALT_DRIVERS", path, 1);
    setenv("ZT_DRIVER", path, 1);
    zt_apply_env(env);
    int failed = 0;
    for (int mode = 0; mode < 2; mode++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            setenv(suite_env, "1", 1);
            if (mode)
                setenv("ZE_ENABLE_LOADER_INTERCEPT", "1", 1);
            else
                unsetenv("ZE_ENABLE_LOADER_INTERCEPT");
            char *argv[] = {(char *)self_exe, NULL};
            execv(self_exe, argv);
            _exit(127);
        }
        int rc = zt_wait_role(pid);
        if (rc != 0) {
            fprintf(stderr, "%s: the %s mode failed (status %d)\n", name,
                    mode ? "intercepting (ZE_ENABLE_LOADER_INTERCEPT=1)" : "passing-through", rc);
            failed = 1;
        }
    }
    return failed;
}

pid_t zt_spawn_role(const char *self_exe, const char *role, const char *arg, const char *const *env,
                    int keep_fd, int stderr_fd)
{
    fflush(NULL);
    pid_t pid = fork();
    if (pid != 0)
        return pid;
    zt_apply_env(env);
    if (keep_fd >= 0)
        fcntl(keep_fd, F_SETFD, 0);
    if (stderr_fd >= 0)
        dup2(stderr_fd, 2);
    char *argv[] = {(char *)self_exe, "--role", (char *)role, (char *)arg, NULL};
    execv(self_exe, argv);
    _exit(127);
}

int zt_wait_role(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return -1;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int zt_send_fd(int sock, int fd, const void *data, size_t len)
{
    char ctl[CMSG_SPACE(sizeof(int))];
    memset(ctl, 0, sizeof(ctl));
    struct iovec iov = {.iov_base = (void *)data, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(c), &fd, sizeof(int));
    return sendmsg(sock, &msg, 0) == (ssize_t)len ? 0 : -1;
}

int zt_recv_fd(int sock, int *fd, void *data, size_t len)
{
    char ctl[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = data, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = ctl, .msg_controllen = sizeof(ctl)};
    if (recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL) != (ssize_t)len)
        return -1;
    struct cmsghdr *c = CMSG_FIRSTHDR(&msg);
    if (c == NULL || c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
        return -1;
    memcpy(fd, CMSG_DATA(c), sizeof(int));
    return 0;
}

pid_t zt_spawn_until(char *const argv[], const char *word, int timeout_ms)
{
    int out[2];
    if (pipe(out) != 0)
        return -1;
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(out[1], 1);
        execv(argv[0], argv);
        _exit(127);
    }
    close(out[1]);
    char said[256] = "";
    size_t n = 0;
    while (pid > 0 && strstr(said, word) == NULL) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        ssize_t r = -1;
        if (n + 1 < sizeof(said) && poll(&p, 1, timeout_ms) == 1)
            r = read(out[0], said + n, sizeof(said) - 1 - n);
        if (r <= 0) {
            kill(pid, SIGKILL);
            zt_wait_role(pid);
            pid = -1;
            break;
        }
        n += (size_t)r;
        said[n] = '\0';
    }
    close(out[0]);
    return pid;
}
