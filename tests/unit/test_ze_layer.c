/*
 * graph_runtime/ze_layer.c through Debian's real Level Zero loader and the test driver
 * (tests/ze_driver/libze_graphd_test.so, found at ../ze_driver/ beside this binary's directory).
 * Run without arguments, this program runs its suite twice, each in a fresh process (the loader
 * reads its environment once): with the loader passing calls straight to the driver, and with
 * ZE_ENABLE_LOADER_INTERCEPT=1.
 *
 * What needs a process of its own (an importer, a failure knob read at zeInit, no driver at all,
 * two drivers) runs as a "role": this binary exec'd with --role NAME [ARG], which checks its part
 * and exits 0, or prints what failed and exits 1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "runtime.h"
#include "ze_layer.h"
#include "../ze_driver/ze_test_util.h"

#define MiB (1024u * 1024u)
#define SEC_NS 1000000000ull
#define DEV_MEM (256ull * MiB) /* the test driver's default device memory */

static char self_exe[PATH_MAX];
static char driver_path[PATH_MAX];

static bool intercepting(void)
{
    const char *s = getenv("ZE_ENABLE_LOADER_INTERCEPT");
    return s != NULL && strcmp(s, "1") == 0;
}

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

static bool fd_open(int fd)
{
    return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC_NS + (uint64_t)ts.tv_nsec;
}

/* The message between exporter and importer: handle bytes and a size (bytes, or event count). */
typedef struct {
    gr_ze_ipc_t ipc;
    uint64_t size;
} msg_t;

/* ---- running roles ------------------------------------------------------------------------ */

/* Starts this binary as role `role` (arg may be NULL); env holds "NAME=value" to set and "NAME"
 * to unset; keep_fd stays open in the child (-1: none). Returns the pid. */
static pid_t spawn_role(const char *role, const char *arg, const char *const *env, int keep_fd)
{
    return zt_spawn_role(self_exe, role, arg, env, keep_fd, -1);
}

static int run_role(const char *role, const char *const *env)
{
    return zt_wait_role(spawn_role(role, NULL, env, -1));
}

/* ---- the roles ---------------------------------------------------------------------------- */

static const char *role_name = "";

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "role %s (%s): %s:%d: %s [last error: %s]\n", role_name,               \
                    intercepting() ? "intercept" : "direct", __FILE__, __LINE__, #cond,            \
                    gr_last_error());                                                              \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

static gr_ze_t *role_open(void)
{
    gr_ze_t *ze = NULL;
    char why[256] = "";
    int err = gr_ze_open(&ze, why, sizeof(why));
    if (err != 0)
        fprintf(stderr, "role %s: gr_ze_open: %s\n", role_name, why);
    CHECK(err == 0 && ze != NULL);
    return ze;
}

/* Any setting under which zeInit fails. Nothing after zeInit may be called: when the driver's
 * init failed the direct-mode loader still points into the unloaded driver, so a zeDriverGet
 * would crash this process. A second open fails the same way. */
static int role_no_driver(void)
{
    for (int k = 0; k < 2; k++) {
        gr_ze_t *ze = (gr_ze_t *)&ze;
        char why[256] = "";
        CHECK(gr_ze_open(&ze, why, sizeof(why)) == GR_EUNSUPPORTED);
        CHECK(ze == NULL);
        CHECK(strcmp(why, "no Level Zero driver: zeInit answered ZE_RESULT_ERROR_UNINITIALIZED") ==
              0);
        CHECK(strcmp(gr_last_error(), why) == 0);
    }
    return 0;
}

static int role_no_gpu(void) /* GRAPHD_ZE_TEST_DEVICES=0 */
{
    gr_ze_t *ze = NULL;
    char why[256] = "";
    CHECK(gr_ze_open(&ze, why, sizeof(why)) == GR_ENOTFOUND);
    CHECK(ze == NULL);
    CHECK(strncmp(why, "no Level Zero GPU device: 1 driver found", 39) == 0);
    return 0;
}

/* GRAPHD_ZE_TEST_NO_SYSMAN=1, or ZES_ENABLE_SYSMAN=0 set by the caller: every value absent. */
static int role_sysman_absent(void)
{
    const char *pre = getenv("ZES_ENABLE_SYSMAN");
    int fds = count_fds();
    gr_ze_t *ze = role_open();
    if (pre != NULL)
        CHECK(strcmp(getenv("ZES_ENABLE_SYSMAN"), pre) == 0); /* the caller's choice is kept */
    for (unsigned i = 0; i < 2; i++) {
        for (int k = 0; k < 2; k++) {
            gr_ze_telemetry_t t;
            memset(&t, 0x5a, sizeof(t));
            CHECK(gr_ze_telemetry(ze, i, &t) == 0);
            CHECK(!t.have_memory && !t.have_health && !t.have_engine && !t.have_utilisation &&
                  !t.have_reset);
            CHECK(t.mem_free_bytes == 0 && t.mem_total_bytes == 0);
        }
    }
    gr_ze_device_info_t in;
    CHECK(gr_ze_info(ze, 0, &in) == 0 && in.total_bytes == DEV_MEM); /* properties still there */
    CHECK(gr_ze_close(ze) == 0);
    CHECK(count_fds() == fds);
    return 0;
}

static int role_oom_knob(void) /* GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER=0 */
{
    int fds = count_fds();
    gr_ze_t *ze = role_open();
    void *p = NULL;
    int fd = -1;
    gr_ze_ipc_t ipc;
    CHECK(gr_ze_alloc(ze, 1, MiB, &p, &fd, &ipc) == GR_ENOMEM);
    CHECK(p == NULL && fd == -1);
    const char *m = gr_last_error();
    CHECK(strstr(m, "xpu:1 (graphd test XPU 1)") != NULL);
    CHECK(strstr(m, "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY") != NULL);
    CHECK(strstr(m, "allocating 1048576 bytes (268435456 of 268435456 bytes free)") != NULL);
    CHECK(gr_ze_close(ze) == 0);
    CHECK(count_fds() == fds);
    return 0;
}

/* GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=3: zeContextCreate, zeMemAllocDevice and zeMemGetIpcHandle
 * work, the device is lost at the next counted call. */
static int role_lost(void)
{
    int fds = count_fds();
    gr_ze_t *ze = role_open();
    void *p = NULL, *q = NULL;
    int fd = -1, fd2 = -1;
    gr_ze_ipc_t ipc;
    CHECK(gr_ze_alloc(ze, 0, MiB, &p, &fd, &ipc) == 0);
    CHECK(gr_ze_alloc(ze, 1, MiB, &q, &fd2, &ipc) == GR_ELOST);
    const char *m = gr_last_error();
    CHECK(strstr(m, "xpu:1 (graphd test XPU 1): zeMemAllocDevice answered "
                    "ZE_RESULT_ERROR_DEVICE_LOST: the device is lost") != NULL);
    CHECK(q == NULL && fd2 == -1);
    CHECK(gr_ze_fill(ze, 0, p, 1, MiB) == GR_ELOST);
    gr_ze_event_pool_t *pool = NULL;
    CHECK(gr_ze_event_pool_create(ze, 0, 2, &pool, &fd2, &ipc) == GR_ELOST && pool == NULL);
    gr_ze_telemetry_t t;
    CHECK(gr_ze_telemetry(ze, 0, &t) == 0 && t.have_reset && t.wedged);
    /* What was allocated is released after a loss. */
    CHECK(gr_ze_free(ze, p) == 0);
    close(fd);
    CHECK(gr_ze_close(ze) == 0);
    CHECK(count_fds() == fds);
    return 0;
}

static int role_lost_now(void) /* GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=0 */
{
    int fds = count_fds();
    gr_ze_t *ze = NULL;
    char why[256] = "";
    CHECK(gr_ze_open(&ze, why, sizeof(why)) == GR_ELOST);
    CHECK(ze == NULL);
    CHECK(strstr(why, "Level Zero driver 0") != NULL);
    CHECK(strstr(why, "zeContextCreate answered ZE_RESULT_ERROR_DEVICE_LOST") != NULL);
    CHECK(count_fds() == fds);
    return 0;
}

static int role_no_ipc(void) /* GRAPHD_ZE_TEST_NO_IPC=1 */
{
    int fds = count_fds();
    gr_ze_t *ze = role_open();
    gr_ze_device_info_t in;
    CHECK(gr_ze_info(ze, 0, &in) == 0 && !in.ipc_memory && !in.ipc_event_pool);
    void *p = NULL;
    int fd = -1;
    gr_ze_ipc_t ipc;
    CHECK(gr_ze_alloc(ze, 0, MiB, &p, &fd, &ipc) == GR_EUNSUPPORTED);
    CHECK(strstr(gr_last_error(), "xpu:0: Level Zero driver 0 (version ") != NULL);
    CHECK(strstr(gr_last_error(), "has no memory IPC") != NULL);
    CHECK(p == NULL && fd == -1);
    gr_ze_event_pool_t *pool = NULL;
    CHECK(gr_ze_event_pool_create(ze, 0, 2, &pool, &fd, &ipc) == GR_EUNSUPPORTED);
    CHECK(strstr(gr_last_error(), "has no event-pool IPC") != NULL);
    CHECK(gr_ze_import(ze, 0, &ipc, 0, MiB, &p) == GR_EUNSUPPORTED);
    gr_ze_telemetry_t t;
    CHECK(gr_ze_telemetry(ze, 0, &t) == 0 && t.have_memory && t.mem_free_bytes == DEV_MEM);
    CHECK(gr_ze_close(ze) == 0);
    CHECK(count_fds() == fds);
    return 0;
}

/* GRAPHD_ZE_TEST_API_VERSION=1.4: no zeMemPutIpcHandle; zeMemFree closes the handle's fd. */
static int role_api_1_4(void)
{
    int fds = count_fds();
    gr_ze_t *ze = role_open();
    gr_ze_device_info_t in;
    CHECK(gr_ze_info(ze, 0, &in) == 0);
    CHECK(in.api_major == 1 && in.api_minor == 4 && !in.ipc_put && in.ipc_memory);
    void *p = NULL;
    int fd = -1;
    gr_ze_ipc_t ipc;
    CHECK(gr_ze_alloc(ze, 0, MiB, &p, &fd, &ipc) == 0);
    int hfd;
    memcpy(&hfd, ipc.data, sizeof(hfd));
    CHECK(hfd != fd && fd_open(hfd) && fd_open(fd));
    CHECK(gr_ze_free(ze, p) == 0);
    CHECK(!fd_open(hfd));
    CHECK(close(fd) == 0);
    CHECK(gr_ze_close(ze) == 0);
    CHECK(count_fds() == fds);
    return 0;
}

/* ZE_ENABLE_ALT_DRIVERS names the driver and a copy: two drivers, the loader intercepts. */
static int role_two_drivers(void)
{
    gr_ze_t *ze = role_open();
    CHECK(gr_ze_count(ze) == 4);
    gr_ze_device_info_t in;
    CHECK(gr_ze_info(ze, 3, &in) == 0);
    CHECK(strcmp(in.device, "xpu:3") == 0 && in.driver_index == 1 && in.ipc_put);
    CHECK(strcmp(in.name, "graphd test XPU 1") == 0);
    void *p = NULL;
    int fd = -1;
    gr_ze_ipc_t ipc;
    CHECK(gr_ze_alloc(ze, 3, MiB, &p, &fd, &ipc) == 0);
    CHECK(gr_ze_fill(ze, 3, p, 7, MiB) == 0);
    CHECK(gr_ze_free(ze, p) == 0); /* the put needs the translated context */
    close(fd);
    CHECK(gr_ze_close(ze) == 0);
    return 0;
}

/* Importer of a region: maps it in its own context, checks and writes it through copies. */
static int role_import_child(int sock)
{
    gr_ze_t *ze = role_open();
    msg_t m;
    int fd = -1;
    CHECK(zt_recv_fd(sock, &fd, &m, sizeof(m)) == 0);
    void *p = NULL;
    CHECK(gr_ze_import(ze, 0, &m.ipc, fd, m.size, &p) == 0);
    CHECK(close(fd) == 0); /* the importer owns its fd; the mapping outlives it */
    unsigned char *buf = malloc(m.size);
    CHECK(buf != NULL);
    CHECK(gr_ze_copy(ze, 0, buf, p, m.size) == 0);
    for (size_t i = 0; i < m.size; i++)
        CHECK(buf[i] == 0xA5);
    memset(buf, 0x5A, m.size / 2);
    CHECK(gr_ze_copy(ze, 0, p, buf, m.size / 2) == 0);
    free(buf);
    CHECK(gr_ze_free(ze, p) == GR_EINVAL); /* an import is unimported, not freed */
    CHECK(gr_ze_unimport(ze, p) == 0);
    CHECK(gr_ze_unimport(ze, p) == GR_EINVAL);
    CHECK(gr_ze_close(ze) == 0);
    CHECK(write(sock, "d", 1) == 1);
    return 0;
}

/* Importer of an event pool: a timed wait ends on time; a wait for ever ends at signal_all. */
static int role_event_child(int sock)
{
    gr_ze_t *ze = role_open();
    msg_t m;
    int fd = -1;
    CHECK(zt_recv_fd(sock, &fd, &m, sizeof(m)) == 0);
    gr_ze_event_pool_t *pool = NULL;
    CHECK(gr_ze_event_pool_open(ze, 0, &m.ipc, fd, (uint32_t)m.size, &pool) == 0);
    CHECK(close(fd) == 0);
    CHECK(gr_ze_event_pool_count(pool) == m.size);
    uint64_t t0 = now_ns();
    CHECK(gr_ze_event_wait(pool, 1, 50000000u) == GR_ETIMEDOUT);
    CHECK(strstr(gr_last_error(), "event 1 not signalled within 50000000 ns") != NULL);
    uint64_t dt = now_ns() - t0;
    /* Not before its time; the upper bound only says it ended (a loaded machine may take long). */
    CHECK(dt >= 45000000u && dt < 30 * SEC_NS);
    CHECK(gr_ze_event_query(pool, 2) == 0);
    CHECK(write(sock, "r", 1) == 1);
    CHECK(gr_ze_event_wait(pool, 2, 10 * SEC_NS) == 0); /* released by the exporter's signal_all */
    /* signal_all signals the events one after the other: one after event 2 may not be signalled
     * yet when event 2's wait returns, so each is waited for, not queried. */
    for (uint32_t k = 0; k < m.size; k++)
        CHECK(gr_ze_event_wait(pool, k, 10 * SEC_NS) == 0);
    CHECK(gr_ze_event_pool_close(pool) == 0);
    CHECK(gr_ze_close(ze) == 0);
    return 0;
}

static int role_main(const char *role, const char *arg)
{
    role_name = role;
    static const struct {
        const char *name;
        int (*fn)(void);
    } roles[] = {
        {"no-driver", role_no_driver},
        {"no-gpu", role_no_gpu},
        {"sysman-absent", role_sysman_absent},
        {"oom-knob", role_oom_knob},
        {"lost", role_lost},
        {"lost-now", role_lost_now},
        {"no-ipc", role_no_ipc},
        {"api-1.4", role_api_1_4},
        {"two-drivers", role_two_drivers},
    };
    if (strcmp(role, "import-child") == 0 && arg != NULL)
        return role_import_child(atoi(arg));
    if (strcmp(role, "event-child") == 0 && arg != NULL)
        return role_event_child(atoi(arg));
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(role, roles[i].name) == 0)
            return roles[i].fn();
    }
    fprintf(stderr, "unknown role %s\n", role);
    return 2;
}

/* ---- the suite ---------------------------------------------------------------------------- */

static gr_ze_t *ze;

static int group_setup(void **state)
{
    (void)state;
    char why[256] = "";
    if (gr_ze_open(&ze, why, sizeof(why)) != 0) {
        fprintf(stderr, "gr_ze_open: %s\n", why);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    (void)state;
    return gr_ze_close(ze) == 0 ? 0 : -1;
}

static void test_no_driver(void **state)
{
    (void)state;
    /* A path with no library, no path at all (the loader's system search finds no driver
     * here), and a driver whose zeInit fails (in direct mode, calling on would crash). */
    const char *nowhere[] = {"ZE_ENABLE_ALT_DRIVERS=/nonexistent/libze_nothing.so", NULL};
    assert_int_equal(run_role("no-driver", nowhere), 0);
    /* Without ZE_ENABLE_ALT_DRIVERS the loader searches the system: only where Intel's driver
     * is not installed (always here) must that find nothing. */
    static const char *const intel[] = {"/usr/lib/x86_64-linux-gnu/libze_intel_gpu.so.1",
                                        "/usr/lib64/libze_intel_gpu.so.1",
                                        "/usr/local/lib/libze_intel_gpu.so.1"};
    bool system_driver = false;
    for (size_t i = 0; i < sizeof(intel) / sizeof(intel[0]); i++)
        system_driver |= access(intel[i], F_OK) == 0;
    const char *unset[] = {"ZE_ENABLE_ALT_DRIVERS", NULL};
    if (!system_driver)
        assert_int_equal(run_role("no-driver", unset), 0);
    const char *init_fail[] = {"GRAPHD_ZE_TEST_INIT_FAIL=1", NULL};
    assert_int_equal(run_role("no-driver", init_fail), 0);
    const char *no_gpu[] = {"GRAPHD_ZE_TEST_DEVICES=0", NULL};
    assert_int_equal(run_role("no-gpu", no_gpu), 0);
}

static void test_two_devices_info(void **state)
{
    (void)state;
    assert_string_equal(getenv("ZES_ENABLE_SYSMAN"), "1"); /* set by gr_ze_open */
    assert_int_equal(gr_ze_count(ze), 2);
    assert_int_equal(gr_ze_count(NULL), 0);
    gr_ze_device_info_t in[2];
    for (unsigned i = 0; i < 2; i++) {
        assert_int_equal(gr_ze_info(ze, i, &in[i]), 0);
        char want[64];
        snprintf(want, sizeof(want), "xpu:%u", i);
        assert_string_equal(in[i].device, want);
        snprintf(want, sizeof(want), "graphd test XPU %u", i);
        assert_string_equal(in[i].name, want);
        assert_int_equal(in[i].vendor_id, 0x8086);
        assert_int_equal(in[i].total_bytes, DEV_MEM);
        assert_int_equal(in[i].compute_units, (2 + i) * 4 * 8);
        assert_int_equal(strlen(in[i].uuid_hex), 32);
        char hex[3];
        snprintf(hex, sizeof(hex), "%02x", in[i].uuid[15]);
        assert_memory_equal(in[i].uuid_hex + 30, hex, 2);
        assert_int_equal(in[i].driver_index, 0);
        assert_int_equal(in[i].api_major, 1);
        assert_int_equal(in[i].api_minor, 6);
        assert_true(in[i].ipc_memory && in[i].ipc_event_pool && in[i].ipc_put);
    }
    assert_memory_not_equal(in[0].uuid, in[1].uuid, 16);
    assert_int_equal(gr_ze_info(ze, 2, &in[0]), GR_EINVAL);
    assert_string_equal(gr_last_error(),
                        "gr_ze_info: no device xpu:2 (this node has 2 xpu devices)");
    assert_int_equal(gr_ze_info(ze, 0, NULL), GR_EINVAL);
}

static void test_telemetry_present(void **state)
{
    (void)state;
    gr_ze_telemetry_t t;
    assert_int_equal(gr_ze_telemetry(ze, 1, &t), 0);
    assert_true(t.have_memory);
    assert_int_equal(t.mem_total_bytes, DEV_MEM);
    assert_int_equal(t.mem_free_bytes, DEV_MEM);
    assert_true(t.have_health);
    assert_string_equal(t.mem_health_name, "ok");
    assert_true(t.have_engine);
    assert_false(t.have_utilisation); /* the first sample of xpu:1 */
    assert_true(t.have_reset);
    assert_false(t.wedged);
    void *p;
    int fd;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_alloc(ze, 1, 64 * MiB, &p, &fd, &ipc), 0);
    assert_int_equal(gr_ze_fill(ze, 1, p, 0x11, 64 * MiB), 0); /* work for the engine */
    assert_int_equal(gr_ze_telemetry(ze, 1, &t), 0);
    assert_int_equal(t.mem_free_bytes, DEV_MEM - 64 * MiB);
    assert_true(t.have_utilisation);
    assert_true(t.utilisation > 0.0 && t.utilisation <= 1.0);
    uint64_t busy = t.engine_active_us;
    assert_true(busy > 0);
    assert_int_equal(gr_ze_free(ze, p), 0);
    close(fd);
    assert_int_equal(gr_ze_telemetry(ze, 1, &t), 0);
    assert_int_equal(t.mem_free_bytes, DEV_MEM);
    assert_true(t.engine_active_us >= busy);
    assert_int_equal(gr_ze_telemetry(ze, 2, &t), GR_EINVAL);

    const char *no_sysman[] = {"GRAPHD_ZE_TEST_NO_SYSMAN=1", NULL};
    assert_int_equal(run_role("sysman-absent", no_sysman), 0);
    const char *off[] = {"ZES_ENABLE_SYSMAN=0", NULL};
    assert_int_equal(run_role("sysman-absent", off), 0);
}

static void test_alloc_export_import_across_processes(void **state)
{
    (void)state;
    int fds = count_fds();
    void *p;
    int fd;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_alloc(ze, 0, MiB, &p, &fd, &ipc), 0);
    assert_true(fd_open(fd));
    assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
    assert_int_equal(gr_ze_fill(ze, 0, p, 0xA5, MiB), 0);

    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", sv[1]);
    pid_t pid = spawn_role("import-child", arg, NULL, sv[1]);
    close(sv[1]);
    msg_t m = {.ipc = ipc, .size = MiB};
    assert_int_equal(zt_send_fd(sv[0], fd, &m, sizeof(m)), 0);
    assert_int_equal(close(fd), 0); /* sent: the importer has its own */
    char done = 0;
    assert_int_equal(read(sv[0], &done, 1), 1);
    assert_int_equal(zt_wait_role(pid), 0);
    close(sv[0]);

    unsigned char *buf = malloc(MiB);
    assert_non_null(buf);
    assert_int_equal(gr_ze_copy(ze, 0, buf, p, MiB), 0);
    assert_int_equal(buf[0], 0x5A);
    assert_int_equal(buf[MiB / 2 - 1], 0x5A);
    assert_int_equal(buf[MiB / 2], 0xA5);
    assert_int_equal(buf[MiB - 1], 0xA5);
    free(buf);
    assert_int_equal(gr_ze_free(ze, p), 0);
    assert_int_equal(count_fds(), fds);
}

static void test_free_and_reimport_fails(void **state)
{
    (void)state;
    int fds = count_fds();
    void *p, *q = NULL;
    int fd;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_alloc(ze, 0, MiB, &p, &fd, &ipc), 0);
    /* Importing here works while the export lives, and needs an fd of this process. */
    assert_int_equal(gr_ze_import(ze, 0, &ipc, fd, MiB, &q), 0);
    assert_int_equal(gr_ze_import(ze, 0, &ipc, fd, 2 * MiB, &p), GR_EINVAL); /* wrong size */
    assert_non_null(strstr(gr_last_error(), "the exporter said 2097152"));
    assert_int_equal(gr_ze_unimport(ze, q), 0);
    assert_int_equal(gr_ze_free(ze, p), 0);
    assert_int_equal(close(fd), 0);
    /* After the free and the close, the same handle and fd number no longer open. */
    assert_int_equal(gr_ze_import(ze, 0, &ipc, fd, MiB, &q), GR_EINVAL);
    assert_non_null(strstr(gr_last_error(), "is not open in this process"));
    /* An open fd that is not an export (the handle says memory, the fd is a pipe). */
    int pp[2];
    assert_int_equal(pipe2(pp, O_CLOEXEC), 0);
    assert_int_equal(gr_ze_import(ze, 0, &ipc, pp[0], MiB, &q), GR_EINVAL);
    assert_non_null(strstr(gr_last_error(),
                           "xpu:0 (graphd test XPU 0): zeMemOpenIpcHandle answered "
                           "ZE_RESULT_ERROR_INVALID_ARGUMENT"));
    close(pp[0]);
    close(pp[1]);
    assert_int_equal(gr_ze_free(ze, p), GR_EINVAL); /* twice */
    assert_non_null(strstr(gr_last_error(), "is not a live allocation of gr_ze_alloc"));
    assert_int_equal(gr_ze_unimport(ze, p), GR_EINVAL);
    assert_int_equal(count_fds(), fds);
}

static void test_out_of_device_memory(void **state)
{
    (void)state;
    int fds = count_fds();
    void *a, *b = NULL;
    int fa, fb = -1;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_alloc(ze, 0, 200 * MiB, &a, &fa, &ipc), 0);
    assert_int_equal(gr_ze_alloc(ze, 0, 100 * MiB, &b, &fb, &ipc), GR_ENOMEM);
    assert_string_equal(gr_last_error(),
                        "xpu:0 (graphd test XPU 0): zeMemAllocDevice answered "
                        "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY: out of device memory allocating "
                        "104857600 bytes (58720256 of 268435456 bytes free): free regions on xpu:0 "
                        "or ask for less");
    assert_null(b);
    assert_int_equal(fb, -1);
    /* More than the device has at all is a bad request, not a full device. */
    assert_int_equal(gr_ze_alloc(ze, 1, 300 * MiB, &b, &fb, &ipc), GR_EINVAL);
    assert_non_null(strstr(gr_last_error(), "more than one allocation may be"));
    assert_int_equal(gr_ze_alloc(ze, 1, 0, &b, &fb, &ipc), GR_EINVAL);
    assert_int_equal(gr_ze_alloc(ze, 5, MiB, &b, &fb, &ipc), GR_EINVAL);
    /* The pool manager's early refusal: free and total are visible. */
    gr_ze_telemetry_t t;
    assert_int_equal(gr_ze_telemetry(ze, 0, &t), 0);
    assert_int_equal(t.mem_free_bytes, DEV_MEM - 200 * MiB);
    /* Closing the layer with a live allocation is refused. */
    assert_int_equal(gr_ze_close(ze), GR_EBUSY);
    assert_non_null(strstr(gr_last_error(), "1 allocation(s), 0 import(s) and 0 event pool(s)"));
    assert_int_equal(gr_ze_free(ze, a), 0);
    close(fa);
    assert_int_equal(count_fds(), fds);
    const char *knob[] = {"GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER=0", NULL};
    assert_int_equal(run_role("oom-knob", knob), 0);
}

static void test_device_lost(void **state)
{
    (void)state;
    const char *after[] = {"GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=3", NULL};
    assert_int_equal(run_role("lost", after), 0);
    const char *now[] = {"GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=0", NULL};
    assert_int_equal(run_role("lost-now", now), 0);
}

static void test_ipc_unsupported(void **state)
{
    (void)state;
    const char *knob[] = {"GRAPHD_ZE_TEST_NO_IPC=1", NULL};
    assert_int_equal(run_role("no-ipc", knob), 0);
}

/* Spec 1.6's zeMemPutIpcHandle, reached as an extension, with the context translated when the
 * loader intercepts (an untranslated one fails there, and gr_ze_free would report it). */
static void test_extension_put(void **state)
{
    (void)state;
    int fds = count_fds();
    void *p;
    int fd;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_alloc(ze, 1, MiB, &p, &fd, &ipc), 0);
    int hfd;
    memcpy(&hfd, ipc.data, sizeof(hfd));
    assert_true(hfd != fd && fd_open(hfd));
    assert_int_equal(gr_ze_free(ze, p), 0);
    assert_false(fd_open(hfd));
    close(fd);
    assert_int_equal(count_fds(), fds);
    const char *v14[] = {"GRAPHD_ZE_TEST_API_VERSION=1.4", NULL};
    assert_int_equal(run_role("api-1.4", v14), 0);

    /* Two drivers (the driver and a copy): the loader intercepts by itself. */
    char dir[] = "/tmp/gzl-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char copy[PATH_MAX + 32], alt[2 * PATH_MAX + 64];
    snprintf(copy, sizeof(copy), "%s/libze_graphd_test_copy.so", dir);
    int in = open(driver_path, O_RDONLY | O_CLOEXEC);
    int out = open(copy, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0755);
    assert_true(in >= 0 && out >= 0);
    char buf[65536];
    ssize_t k;
    while ((k = read(in, buf, sizeof(buf))) > 0)
        assert_int_equal(write(out, buf, (size_t)k), k);
    close(in);
    close(out);
    snprintf(alt, sizeof(alt), "ZE_ENABLE_ALT_DRIVERS=%s,%s", driver_path, copy);
    const char *env[] = {alt, "ZE_ENABLE_LOADER_INTERCEPT", NULL};
    int rc = run_role("two-drivers", env);
    unlink(copy);
    rmdir(dir);
    assert_int_equal(rc, 0);
}

static void test_event_pool_across_processes(void **state)
{
    (void)state;
    int fds = count_fds();
    gr_ze_event_pool_t *pool = NULL;
    int fd;
    gr_ze_ipc_t ipc;
    assert_int_equal(gr_ze_event_pool_create(ze, 0, 0, &pool, &fd, &ipc), GR_EINVAL);
    assert_int_equal(gr_ze_event_pool_create(ze, 0, GR_ZE_EVENTS_MAX + 1, &pool, &fd, &ipc),
                     GR_EINVAL);
    assert_int_equal(gr_ze_event_pool_create(ze, 0, 4, &pool, &fd, &ipc), 0);
    assert_int_equal(gr_ze_event_pool_count(pool), 4);
    assert_int_equal(gr_ze_event_query(pool, 0), 0);
    assert_int_equal(gr_ze_event_signal(pool, 0), 0);
    assert_int_equal(gr_ze_event_query(pool, 0), 1);
    assert_int_equal(gr_ze_event_wait(pool, 0, 0), 0);
    assert_int_equal(gr_ze_event_reset(pool, 0), 0);
    assert_int_equal(gr_ze_event_query(pool, 0), 0);
    assert_int_equal(gr_ze_event_signal(pool, 4), GR_EINVAL);
    assert_string_equal(gr_last_error(), "gr_ze_event_signal: xpu:0: event 4 of a pool of 4");

    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", sv[1]);
    pid_t pid = spawn_role("event-child", arg, NULL, sv[1]);
    close(sv[1]);
    msg_t m = {.ipc = ipc, .size = 4};
    assert_int_equal(zt_send_fd(sv[0], fd, &m, sizeof(m)), 0);
    assert_int_equal(close(fd), 0);
    char ready = 0;
    assert_int_equal(read(sv[0], &ready, 1), 1); /* the child is about to wait for ever */
    usleep(20000);
    assert_int_equal(gr_ze_events_signal_all(pool), 0); /* session end: nothing hangs */
    assert_int_equal(zt_wait_role(pid), 0);
    close(sv[0]);
    for (uint32_t k = 0; k < 4; k++)
        assert_int_equal(gr_ze_event_query(pool, k), 1);
    assert_int_equal(gr_ze_close(ze), GR_EBUSY);
    assert_int_equal(gr_ze_event_pool_close(pool), 0);
    assert_int_equal(gr_ze_event_pool_close(NULL), 0);
    assert_int_equal(count_fds(), fds);
}

static void *alloc_loop(void *arg)
{
    unsigned dev = (unsigned)(uintptr_t)arg & 1;
    for (int k = 0; k < 50; k++) {
        void *p;
        int fd;
        gr_ze_ipc_t ipc;
        if (gr_ze_alloc(ze, dev, 64 * 1024, &p, &fd, &ipc) != 0)
            return (void *)1;
        int bad = gr_ze_fill(ze, dev, p, (uint8_t)k, 64 * 1024) != 0;
        close(fd);
        if (gr_ze_free(ze, p) != 0 || bad)
            return (void *)1;
    }
    return NULL;
}

static void test_concurrent_callers(void **state)
{
    (void)state;
    int fds = count_fds();
    pthread_t th[4];
    for (uintptr_t i = 0; i < 4; i++)
        assert_int_equal(pthread_create(&th[i], NULL, alloc_loop, (void *)i), 0);
    for (int i = 0; i < 4; i++) {
        void *rv = (void *)1;
        assert_int_equal(pthread_join(th[i], &rv), 0);
        assert_null(rv);
    }
    gr_ze_telemetry_t t;
    assert_int_equal(gr_ze_telemetry(ze, 0, &t), 0);
    assert_int_equal(t.mem_free_bytes, DEV_MEM);
    assert_int_equal(count_fds(), fds);
}

static int run_suite(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_no_driver),
        cmocka_unit_test(test_two_devices_info),
        cmocka_unit_test(test_telemetry_present),
        cmocka_unit_test(test_alloc_export_import_across_processes),
        cmocka_unit_test(test_free_and_reimport_fails),
        cmocka_unit_test(test_out_of_device_memory),
        cmocka_unit_test(test_device_lost),
        cmocka_unit_test(test_ipc_unsupported),
        cmocka_unit_test(test_extension_put),
        cmocka_unit_test(test_event_pool_across_processes),
        cmocka_unit_test(test_concurrent_callers),
    };
    return cmocka_run_group_tests_name(intercepting() ? "ze_layer (ZE_ENABLE_LOADER_INTERCEPT=1)"
                                                      : "ze_layer (direct)",
                                       tests, group_setup, group_teardown);
}

/* Runs the suite once per loader mode, each in a fresh process; fails if either does. */
static int run_modes(void)
{
    return zt_run_modes(self_exe, "test_ze_layer", "GZL_SUITE", NULL, driver_path);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 2;
    self_exe[n] = '\0';
    const char *drv = getenv("ZT_DRIVER");
    if (drv != NULL)
        snprintf(driver_path, sizeof(driver_path), "%s", drv);
    if (argc >= 3 && strcmp(argv[1], "--role") == 0)
        return role_main(argv[2], argc >= 4 ? argv[3] : NULL);
    if (getenv("GZL_SUITE") == NULL)
        return run_modes();
    return run_suite();
}
