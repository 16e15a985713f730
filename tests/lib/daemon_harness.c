/*
 * Integration-test harness: the daemon's lifecycle in a temporary
 * directory, child programs with captured output, and status as JSON.
 */
#include <setjmp.h> /* cmocka needs these first */
#include <stdarg.h>
#include <stddef.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

extern char **environ;

#define START_TIMEOUT_MS 10000
#define STOP_TIMEOUT_MS 10000

int64_t harness_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_ms(int ms)
{
    struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static char build_dir[PATH_MAX];

/* Fills build_dir once: the first callers may be several threads at once. */
static void find_build_dir(void)
{
    const char *env = getenv("GRAPHD_BUILD");
    if (env != NULL && env[0] != '\0') {
        snprintf(build_dir, sizeof(build_dir), "%s", env);
        return;
    }
    /* build/tests/integration/test_x ⇒ build */
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
    if (n > 0) {
        exe[n] = '\0';
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(exe, '/');
            if (slash == NULL)
                break;
            *slash = '\0';
        }
        char probe[PATH_MAX + 16];
        snprintf(probe, sizeof(probe), "%s/graphd", exe);
        if (access(probe, X_OK) == 0) {
            snprintf(build_dir, sizeof(build_dir), "%s", exe);
            return;
        }
    }
    snprintf(build_dir, sizeof(build_dir), "build");
}

const char *harness_build_dir(void)
{
    static pthread_once_t once = PTHREAD_ONCE_INIT;
    pthread_once(&once, find_build_dir);
    return build_dir;
}

static void remove_dir(const char *path)
{
    if (getenv("GRAPHD_TEST_KEEP") != NULL) {
        fprintf(stderr, "harness: keeping %s\n", path);
        return;
    }
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[HARNESS_PATH_MAX * 2];
            snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
            unlink(p);
        }
        closedir(d);
    }
    rmdir(path);
}

/* Removes a cgroup directory and the (empty) cgroups under it, deepest first: cgroupfs lets
 * rmdir remove a cgroup with its control files, not with child cgroups. */
static void remove_cgroup(const char *path)
{
    DIR *d = opendir(path);
    if (d != NULL) {
        struct dirent *e;
        while ((e = readdir(d)) != NULL) {
            if (e->d_type != DT_DIR || strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
                continue;
            char p[HARNESS_PATH_MAX * 2];
            snprintf(p, sizeof(p), "%s/%s", path, e->d_name);
            remove_cgroup(p);
        }
        closedir(d);
    }
    if (rmdir(path) != 0 && errno != ENOENT)
        fprintf(stderr, "harness: removing cgroup %s: %s\n", path, strerror(errno));
}

void harness_dump_log(const harness_t *h)
{
    FILE *f = fopen(h->log_path, "r");
    if (f == NULL)
        return;
    fprintf(stderr, "---- graphd log (%s) ----\n", h->log_path);
    char line[1024];
    while (fgets(line, sizeof(line), f) != NULL)
        fputs(line, stderr);
    fprintf(stderr, "---- end of graphd log ----\n");
    fclose(f);
}

/* Decodes a wait status: exit code, or 128+signal. */
static int exit_code(int status)
{
    if (WIFEXITED(status))
        return WEXITSTATUS(status);
    if (WIFSIGNALED(status))
        return 128 + WTERMSIG(status);
    return -1;
}

/* Whether the daemon answers a ListDevices call. */
static int answers(const harness_t *h)
{
    graphd_client_t *c;
    if (graphd_connect(h->address, &c) != GRAPHD_OK)
        return 0;
    size_t n = 0;
    int rc = graphd_list_devices(c, &n, NULL);
    graphd_close(c);
    return rc == GRAPHD_OK;
}

int harness_start(harness_t *h, const char *const *extra_args)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->dir, sizeof(h->dir), "/tmp/graphd-it-XXXXXX");
    if (mkdtemp(h->dir) == NULL) {
        fprintf(stderr, "harness: mkdtemp: %s\n", strerror(errno));
        return -1;
    }
    snprintf(h->sock_path, sizeof(h->sock_path), "%s/graphd.sock", h->dir);
    snprintf(h->address, sizeof(h->address), "unix:%s", h->sock_path);
    snprintf(h->log_path, sizeof(h->log_path), "%s/graphd.log", h->dir);

    char graphd[PATH_MAX + 16];
    snprintf(graphd, sizeof(graphd), "%s/graphd", harness_build_dir());
    const char *argv[68] = {graphd,  "--listen", h->address, "--log-level",
                            "debug", "--config", "/dev/null"};
    size_t argc = 7;
    for (size_t i = 0; extra_args != NULL && extra_args[i] != NULL && argc < 63; i++)
        argv[argc++] = extra_args[i];
    argv[argc] = NULL;
    const char *cg_parent = getenv("GRAPHD_TEST_CGROUP");
    if (cg_parent != NULL && *cg_parent != '\0') {
        /* The daemon enters its cgroup before it execs, through sh: no window in which it
         * could read /proc/self/cgroup before the move. */
        snprintf(h->cgroup, sizeof(h->cgroup), "%s/%s", cg_parent, h->dir + 5);
        if (mkdir(h->cgroup, 0755) != 0) {
            fprintf(stderr, "harness: GRAPHD_TEST_CGROUP: mkdir %s: %s\n", h->cgroup,
                    strerror(errno));
            h->cgroup[0] = 0;
            remove_dir(h->dir);
            return -1;
        }
        memmove(argv + 4, argv, (argc + 1) * sizeof *argv);
        argv[0] = "/bin/sh";
        argv[1] = "-c";
        argv[2] = "echo $$ > \"$0/cgroup.procs\" && exec \"$@\"";
        argv[3] = h->cgroup;
    }

    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 2, h->log_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    posix_spawn_file_actions_adddup2(&fa, 2, 1);
    int err = posix_spawn(&h->pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (err != 0) {
        fprintf(stderr, "harness: cannot start %s: %s\n", graphd, strerror(err));
        h->pid = 0;
        remove_dir(h->dir);
        if (h->cgroup[0])
            remove_cgroup(h->cgroup);
        return -1;
    }

    int64_t deadline = harness_now_ms() + START_TIMEOUT_MS;
    while (harness_now_ms() < deadline) {
        int status;
        if (waitpid(h->pid, &status, WNOHANG) == h->pid) {
            fprintf(stderr, "harness: graphd exited at start (status %d)\n", exit_code(status));
            harness_dump_log(h);
            h->pid = 0;
            remove_dir(h->dir);
            if (h->cgroup[0])
                remove_cgroup(h->cgroup);
            return -1;
        }
        if (access(h->sock_path, F_OK) == 0 && answers(h))
            return 0;
        sleep_ms(20);
    }
    fprintf(stderr, "harness: graphd did not answer on %s within %d ms\n", h->address,
            START_TIMEOUT_MS);
    harness_stop(h);
    return -1;
}

int harness_stop(harness_t *h)
{
    if (h == NULL || h->pid <= 0)
        return 0;
    int code = -1, status;
    kill(h->pid, SIGTERM);
    int64_t deadline = harness_now_ms() + STOP_TIMEOUT_MS;
    for (;;) {
        pid_t r = waitpid(h->pid, &status, WNOHANG);
        if (r == h->pid) {
            code = exit_code(status);
            break;
        }
        if (r < 0 && errno != EINTR) {
            fprintf(stderr, "harness: waitpid: %s\n", strerror(errno));
            break;
        }
        if (harness_now_ms() >= deadline) {
            fprintf(stderr, "harness: graphd still running %d ms after SIGTERM; killing it\n",
                    STOP_TIMEOUT_MS);
            kill(h->pid, SIGKILL);
            waitpid(h->pid, &status, 0);
            break;
        }
        sleep_ms(10);
    }
    if (code != 0) {
        fprintf(stderr, "harness: graphd exit status %d after SIGTERM\n", code);
        harness_dump_log(h);
    }
    h->pid = 0;
    remove_dir(h->dir);
    if (h->cgroup[0]) {
        remove_cgroup(h->cgroup);
        h->cgroup[0] = 0;
    }
    return code;
}

graphd_client_t *harness_client(const harness_t *h, const char *name)
{
    graphd_client_t *c;
    int rc = graphd_connect(h->address, &c);
    if (rc != GRAPHD_OK) {
        fprintf(stderr, "harness: graphd_connect: %s\n", graphd_err_name(rc));
        return NULL;
    }
    rc = graphd_hello(c, name);
    if (rc != GRAPHD_OK) {
        fprintf(stderr, "harness: graphd_hello: %s: %s\n", graphd_err_name(rc),
                graphd_last_error(c));
        graphd_close(c);
        return NULL;
    }
    return c;
}

json_t *harness_status(graphd_client_t *c)
{
    size_t len = 0;
    int rc = graphd_status_json(c, NULL, &len);
    char *buf = NULL;
    for (int tries = 0; rc == GRAPHD_OK && tries < 5; tries++) {
        free(buf);
        len += 1024;
        buf = malloc(len);
        if (buf == NULL)
            return NULL;
        rc = graphd_status_json(c, buf, &len);
        if (rc != GRAPHD_ETRUNC)
            break;
        rc = GRAPHD_OK;
    }
    if (rc != GRAPHD_OK) {
        fprintf(stderr, "harness: graphd_status_json: %s: %s\n", graphd_err_name(rc),
                graphd_last_error(c));
        free(buf);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loads(buf, 0, &jerr);
    if (root == NULL)
        fprintf(stderr, "harness: status JSON does not parse: %s\n%s\n", jerr.text, buf);
    free(buf);
    return root;
}

json_t *harness_find(json_t *array, const char *key, const char *value)
{
    size_t i;
    json_t *e;
    json_array_foreach(array, i, e)
    {
        const char *s = json_string_value(json_object_get(e, key));
        if (s != NULL && strcmp(s, value) == 0)
            return e;
    }
    return NULL;
}

json_t *harness_find_int(json_t *array, const char *key, uint64_t value)
{
    size_t i;
    json_t *e;
    json_array_foreach(array, i, e)
    {
        json_t *v = json_object_get(e, key);
        if (json_is_integer(v) && (uint64_t)json_integer_value(v) == value)
            return e;
    }
    return NULL;
}

long long harness_int(const json_t *obj, const char *key)
{
    json_t *v = json_object_get(obj, key);
    if (!json_is_integer(v)) {
        fprintf(stderr, "harness: no integer '%s' in status object\n", key);
        return -1;
    }
    return json_integer_value(v);
}

/* Appends what is readable on *fd to buf; closes and sets *fd = -1 at EOF. */
static void drain(int *fd, char *buf, size_t size, size_t *used)
{
    char tmp[4096];
    ssize_t n = read(*fd, tmp, sizeof(tmp));
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) {
        close(*fd);
        *fd = -1;
        return;
    }
    size_t room = size > *used + 1 ? size - *used - 1 : 0;
    size_t take = (size_t)n < room ? (size_t)n : room;
    memcpy(buf + *used, tmp, take);
    *used += take;
    buf[*used] = '\0';
}

int harness_run(const char *const *argv, char *out, size_t out_size, char *err, size_t err_size,
                int timeout_ms)
{
    int po[2], pe[2];
    if (out_size > 0)
        out[0] = '\0';
    if (err_size > 0)
        err[0] = '\0';
    if (pipe2(po, O_CLOEXEC) != 0)
        return -1;
    if (pipe2(pe, O_CLOEXEC) != 0) {
        close(po[0]), close(po[1]);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, po[1], 1);
    posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    close(po[1]), close(pe[1]);
    if (e != 0) {
        fprintf(stderr, "harness: cannot run %s: %s\n", argv[0], strerror(e));
        close(po[0]), close(pe[0]);
        return -1;
    }

    size_t out_used = 0, err_used = 0;
    int fo = po[0], fe = pe[0];
    int64_t deadline = harness_now_ms() + timeout_ms;
    int timed_out = 0;
    while (fo >= 0 || fe >= 0) {
        int64_t left = deadline - harness_now_ms();
        if (left <= 0) {
            timed_out = 1;
            break;
        }
        struct pollfd p[2] = {{.fd = fo, .events = POLLIN}, {.fd = fe, .events = POLLIN}};
        if (poll(p, 2, (int)left) < 0 && errno != EINTR)
            break;
        if (fo >= 0 && (p[0].revents & (POLLIN | POLLHUP | POLLERR)))
            drain(&fo, out, out_size, &out_used);
        if (fe >= 0 && (p[1].revents & (POLLIN | POLLHUP | POLLERR)))
            drain(&fe, err, err_size, &err_used);
    }
    if (fo >= 0)
        close(fo);
    if (fe >= 0)
        close(fe);
    if (timed_out)
        kill(pid, SIGKILL);
    int status;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    if (timed_out) {
        fprintf(stderr, "harness: %s ran past %d ms\n", argv[0], timeout_ms);
        return -1;
    }
    return exit_code(status);
}

int harness_group_setup(void **state)
{
    static harness_t h;
    if (harness_start(&h, NULL) != 0)
        return -1;
    *state = &h;
    return 0;
}

int harness_group_teardown(void **state)
{
    return harness_stop(*state) == 0 ? 0 : -1;
}

int harness_fixture_group_setup(void **state)
{
    static harness_fixture_t f;
    *state = &f;
    return harness_fixture_start(&f, NULL);
}

int harness_fixture_group_teardown(void **state)
{
    return harness_fixture_stop(*state);
}

const double *harness_fixture_ref(const harness_fixture_t *f, const char *key, size_t n)
{
    const double *v = harness_models_ref(&f->m, key, n);
    if (v == NULL)
        fail_msg("reference %s missing", key);
    return v;
}

json_t *harness_status_entry(graphd_client_t *c, const char *section, uint64_t id)
{
    json_t *st = harness_status(c);
    assert_non_null(st);
    json_t *x = harness_find_int(json_object_get(st, section), "id", id);
    if (x)
        json_incref(x);
    json_decref(st);
    return x;
}

long long harness_daemon_counter(graphd_client_t *c, const char *key)
{
    json_t *st = harness_status(c);
    assert_non_null(st);
    long long v = harness_int(json_object_get(st, "daemon"), key);
    json_decref(st);
    return v;
}
