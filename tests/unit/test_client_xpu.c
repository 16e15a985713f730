/*
 * libgraphd's xpu row (client/c/xpu.c) through Debian's real Level Zero loader and the test
 * driver (tests/ze_driver/libze_graphd_test.so, ../ze_driver/ beside this binary's directory),
 * without a daemon: an exporter process (this binary as a role, with graph_runtime/ze_layer.c's
 * gr_ze_alloc, as the daemon's executor will) allocates device memory, fills it and sends the
 * IPC handle and the fd over a socketpair; this process maps them through the row, in its own
 * context, reads and writes with graphd_region_read/write, and the exporter reads the write back.
 * The suite runs once per loader mode (direct, ZE_ENABLE_LOADER_INTERCEPT=1), each in a fresh
 * process. Failures that need a process of their own (no loader, no driver, a driver without IPC)
 * are roles too.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "graphd_int.h"
#include "runtime.h"
#include "ze_layer.h"
#include "../ze_driver/ze_test_util.h"

#define SIZE (64u * 1024u)
#define FILL 0x5a

static char self_exe[PATH_MAX];
static char driver_path[PATH_MAX];

typedef struct {
    gr_ze_ipc_t ipc;
    uint64_t size;
} msg_t;

static int count_fds(void)
{
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL)
        return -1;
    int n = 0;
    while (readdir(d) != NULL)
        n++;
    closedir(d);
    return n;
}

static int read_all(int fd, void *buf, size_t n)
{
    for (size_t got = 0; got < n;) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k <= 0)
            return -1;
        got += (size_t)k;
    }
    return 0;
}

static int write_all(int fd, const void *buf, size_t n)
{
    for (size_t put = 0; put < n;) {
        ssize_t k = write(fd, (const char *)buf + put, n - put);
        if (k <= 0)
            return -1;
        put += (size_t)k;
    }
    return 0;
}

/* ---- roles -------------------------------------------------------------------------------- */

/* Starts this binary as role (arg may be NULL) with env ("NAME=value" sets, "NAME" unsets);
 * keep_fd stays open in it. */
static pid_t spawn_role(const char *role, const char *arg, const char *const *env, int keep_fd)
{
    return zt_spawn_role(self_exe, role, arg, env, keep_fd, -1);
}

/* The exporter ("DEV,SOCK"): allocates SIZE bytes on xpu:DEV with gr_ze_alloc, fills them with
 * FILL, sends handle and fd; then answers 'r' with the memory's bytes, and 'q' by freeing. */
static int role_exporter(const char *arg)
{
    unsigned dev;
    int sock;
    if (arg == NULL || sscanf(arg, "%u,%d", &dev, &sock) != 2)
        return 2;
    gr_ze_t *ze = NULL;
    char why[256];
    void *ptr = NULL;
    int fd = -1;
    msg_t m = {.size = SIZE};
    if (gr_ze_open(&ze, why, sizeof(why)) != 0 ||
        gr_ze_alloc(ze, dev, SIZE, &ptr, &fd, &m.ipc) != 0 ||
        gr_ze_fill(ze, dev, ptr, FILL, SIZE) != 0) {
        fprintf(stderr, "exporter: %s\n", gr_last_error());
        return 1;
    }
    if (zt_send_fd(sock, fd, &m, sizeof(m)) != 0)
        return 1;
    close(fd);
    static uint8_t buf[SIZE];
    for (;;) {
        char cmd;
        if (read_all(sock, &cmd, 1) != 0)
            cmd = 'q'; /* the importer went away */
        if (cmd == 'r') {
            if (gr_ze_copy(ze, dev, buf, ptr, SIZE) != 0 || write_all(sock, buf, SIZE) != 0)
                return 1;
            continue;
        }
        int bad = gr_ze_free(ze, ptr) != 0 || gr_ze_close(ze) != 0;
        return bad;
    }
}

/* An exporter of xpu:dev for this process: *sock talks to it, *fd and *m are what it sent. */
static pid_t start_exporter(unsigned dev, int *sock, int *fd, msg_t *m)
{
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0)
        return -1;
    char arg[64];
    snprintf(arg, sizeof(arg), "%u,%d", dev, sv[1]);
    /* The exporter's knobs are its own: never the importer's failure knobs. */
    static const char *const env[] = {"GRAPHD_ZE_TEST_NO_IPC", "GRAPHD_ZE_TEST_INIT_FAIL", NULL};
    pid_t pid = spawn_role("exporter", arg, env, sv[1]);
    close(sv[1]);
    if (zt_recv_fd(sv[0], fd, m, sizeof(*m)) != 0) {
        close(sv[0]);
        zt_wait_role(pid);
        return -1;
    }
    *sock = sv[0];
    return pid;
}

static int stop_exporter(pid_t pid, int sock)
{
    (void)write_all(sock, "q", 1);
    close(sock);
    return zt_wait_role(pid);
}

/* A client for the row's messages; no daemon is asked anything. */
static graphd_client_t *offline_client(void)
{
    graphd_client_t *c = NULL;
    if (graphd_connect("unix:/nonexistent/graphd.sock", &c) != GRAPHD_OK)
        return NULL;
    return c;
}

/* Maps an exporter's region through the xpu row; 0 or the row's error, printed. */
static int role_open_fails(const char *want_msg, int want_rc)
{
    graphd_client_t *c = offline_client();
    if (c == NULL)
        return 2;
    int sock = -1, fd = -1;
    msg_t m;
    pid_t pid = start_exporter(0, &sock, &fd, &m);
    if (pid < 0)
        return 2;
    void *p = NULL;
    int rc = graphd__kind_xpu.open(c, 0, m.ipc.data, &fd, m.size, &p);
    int ok = rc == want_rc && strstr(graphd_last_error(c), want_msg) != NULL && p == NULL;
    if (!ok)
        fprintf(stderr, "open: rc %d (want %d), \"%s\" (want \"%s\")\n", rc, want_rc,
                graphd_last_error(c), want_msg);
    if (fd >= 0)
        close(fd);
    if (stop_exporter(pid, sock) != 0)
        ok = 0;
    graphd_close(c);
    return ok ? 0 : 1;
}

static int role_main(const char *role, const char *arg)
{
    if (strcmp(role, "exporter") == 0)
        return role_exporter(arg);
    if (strcmp(role, "no-ipc") == 0)
        return role_open_fails("zeMemOpenIpcHandle on xpu:0 (graphd test XPU 0) of Level Zero "
                               "driver 0",
                               GRAPHD_EFAILED_PRECONDITION);
    if (strcmp(role, "no-loader") == 0)
        return role_open_fails("install the libze1 package", GRAPHD_EFAILED_PRECONDITION);
    if (strcmp(role, "no-driver") == 0)
        return role_open_fails("no Level Zero driver in this process", GRAPHD_EFAILED_PRECONDITION);
    return 2;
}

/* ---- the suite ---------------------------------------------------------------------------- */

/* Maps xpu:dev's exported region, reads the exporter's fill, writes a pattern the exporter
 * reads back, unmaps; no fd is left behind. */
static void roundtrip(unsigned dev)
{
    graphd_client_t *c = offline_client();
    assert_non_null(c);
    /* warm: the first call loads the loader and opens the driver's contexts */
    (void)graphd__kind_xpu.copy(c, 9, NULL, NULL, 0, 1);
    int fds = count_fds();

    int sock = -1, fd = -1;
    msg_t m;
    pid_t pid = start_exporter(dev, &sock, &fd, &m);
    assert_true(pid > 0);
    assert_int_equal(m.size, SIZE);
    void *p = NULL;
    int rc = graphd__kind_xpu.open(c, (int)dev, m.ipc.data, &fd, m.size, &p);
    assert_int_equal(rc, GRAPHD_OK);
    assert_non_null(p);
    assert_true(fd >= 0); /* kept with the mapping */
    graphd_region_t r = {.client = c,
                         .kind = &graphd__kind_xpu,
                         .device = (int)dev,
                         .fd = fd,
                         .ptr = p,
                         .size = SIZE,
                         .mapped_size = SIZE};

    static uint8_t buf[SIZE], pat[SIZE], back[SIZE];
    assert_int_equal(graphd_region_read(&r, 0, buf, SIZE), GRAPHD_OK);
    for (size_t i = 0; i < SIZE; i++)
        if (buf[i] != FILL)
            fail_msg("byte %zu of xpu:%u reads 0x%02x, the exporter wrote 0x%02x", i, dev, buf[i],
                     FILL);
    for (size_t i = 0; i < SIZE; i++)
        pat[i] = (uint8_t)(i * 7 + dev);
    assert_int_equal(graphd_region_write(&r, 0, pat, SIZE), GRAPHD_OK);
    /* a part at an offset reads back as written */
    assert_int_equal(graphd_region_read(&r, 1000, buf, 24), GRAPHD_OK);
    assert_memory_equal(buf, pat + 1000, 24);
    /* outside the mapping: refused before any device call */
    assert_int_equal(graphd_region_write(&r, SIZE - 1, pat, 2), GRAPHD_EINVALID_ARGUMENT);
    assert_non_null(strstr(graphd_last_error(c), "pass the end of region"));
    assert_int_equal(graphd_region_read(&r, SIZE + 1, buf, 0), GRAPHD_EINVALID_ARGUMENT);

    /* the exporter, another process, reads this process's write */
    assert_int_equal(write_all(sock, "r", 1), 0);
    assert_int_equal(read_all(sock, back, SIZE), 0);
    assert_memory_equal(back, pat, SIZE);

    graphd__kind_xpu.close((int)dev, p);
    close(fd);
    assert_int_equal(stop_exporter(pid, sock), 0);
    assert_int_equal(count_fds(), fds);
    graphd_close(c);
}

static void maps_xpu0_region_of_another_process(void **state)
{
    (void)state;
    roundtrip(0);
}

/* xpu:1 is the second GPU of the driver, numbered as the daemon numbers it. */
static void maps_xpu1_region_of_another_process(void **state)
{
    (void)state;
    roundtrip(1);
}

static void unknown_device_and_missing_fd_are_refused(void **state)
{
    (void)state;
    graphd_client_t *c = offline_client();
    assert_non_null(c);
    int sock = -1, fd = -1;
    msg_t m;
    pid_t pid = start_exporter(0, &sock, &fd, &m);
    assert_true(pid > 0);
    void *p = NULL;
    assert_int_equal(graphd__kind_xpu.open(c, 5, m.ipc.data, &fd, m.size, &p), GRAPHD_ENOT_FOUND);
    assert_non_null(strstr(graphd_last_error(c), "xpu:5: this process sees 2 Level Zero GPU"));
    int none = -1;
    assert_int_equal(graphd__kind_xpu.open(c, 0, m.ipc.data, &none, m.size, &p), GRAPHD_EPROTO);
    assert_non_null(strstr(graphd_last_error(c), "without its descriptor"));
    /* a size larger than the allocation: not the region the daemon meant */
    assert_int_equal(graphd__kind_xpu.open(c, 0, m.ipc.data, &fd, 2 * SIZE, &p), GRAPHD_EPROTO);
    assert_non_null(strstr(graphd_last_error(c), "the allocation mapped is"));
    assert_null(p);
    close(fd);
    assert_int_equal(stop_exporter(pid, sock), 0);

    /* an unmapped region (its session ended) is refused, not touched */
    graphd_region_t r = {.client = c, .kind = &graphd__kind_xpu, .fd = -1, .mapped_size = SIZE};
    uint8_t b[8];
    assert_int_equal(graphd_region_read(&r, 0, b, sizeof(b)), GRAPHD_EFAILED_PRECONDITION);
    assert_non_null(strstr(graphd_last_error(c), "unmapped"));
    graphd_close(c);
}

static void driver_without_ipc_names_the_driver(void **state)
{
    (void)state;
    static const char *const env[] = {"GRAPHD_ZE_TEST_NO_IPC=1", NULL};
    assert_int_equal(zt_wait_role(spawn_role("no-ipc", NULL, env, -1)), 0);
}

static void missing_loader_names_the_package(void **state)
{
    (void)state;
    static const char *const env[] = {"GRAPHD_ZE_LOADER=/nonexistent/libze_loader.so.1", NULL};
    assert_int_equal(zt_wait_role(spawn_role("no-loader", NULL, env, -1)), 0);
}

static void no_driver_says_so(void **state)
{
    (void)state;
    static const char *const env[] = {"GRAPHD_ZE_TEST_INIT_FAIL=1", NULL};
    assert_int_equal(zt_wait_role(spawn_role("no-driver", NULL, env, -1)), 0);
}

static int run_suite(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(maps_xpu0_region_of_another_process),
        cmocka_unit_test(maps_xpu1_region_of_another_process),
        cmocka_unit_test(unknown_device_and_missing_fd_are_refused),
        cmocka_unit_test(driver_without_ipc_names_the_driver),
        cmocka_unit_test(missing_loader_names_the_package),
        cmocka_unit_test(no_driver_says_so),
    };
    return cmocka_run_group_tests_name(
        getenv("ZE_ENABLE_LOADER_INTERCEPT") ? "intercept" : "direct", tests, NULL, NULL);
}

/* Runs the suite once per loader mode, each in a fresh process (the loader reads its
 * environment once). */
static int run_modes(void)
{
    return zt_run_modes(self_exe, "test_client_xpu", "GZX_SUITE", NULL, driver_path);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 2;
    self_exe[n] = '\0';
    if (argc >= 3 && strcmp(argv[1], "--role") == 0)
        return role_main(argv[2], argc >= 4 ? argv[3] : NULL);
    if (getenv("GZX_SUITE") == NULL)
        return run_modes();
    return run_suite();
}
