/*
 * The Level Zero test driver (libze_graphd_test.so) through Debian's real loader, never linked
 * directly. Run without arguments, this program runs its suite twice, each in a fresh process
 * (the loader reads its environment once): with the loader passing calls straight to the driver,
 * and with ZE_ENABLE_LOADER_INTERCEPT=1, where the loader wraps every handle.
 *
 * Whatever needs its own process (another importer for IPC, a failure knob read at zeInit, a
 * driver the loader must refuse, two drivers at once) runs as a "role": this same binary,
 * exec'd with --role NAME, which checks its part and exits 0, or prints what failed and exits 1.
 *
 * The driver is found at ../ze_driver/libze_graphd_test.so beside this binary's directory.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <level_zero/ze_api.h>
#include <level_zero/zes_api.h>
#include <level_zero/loader/ze_loader.h>

#include "ze_graphd_test.h"
#include "ze_test_util.h"

#define MiB (1024u * 1024u)
#define SEC_NS 1000000000ull

/* ---- shared by the suite and the roles --------------------------------------------------------
 */

typedef struct {
    ze_driver_handle_t driver;
    uint32_t n_devices;
    ze_device_handle_t dev[8];
    ze_context_handle_t ctx;
} ze_t;

static bool intercepting(void)
{
    const char *s = getenv("ZE_ENABLE_LOADER_INTERCEPT");
    return s != NULL && strcmp(s, "1") == 0;
}

/* What the loader answers for a table entry the driver left NULL. */
static ze_result_t missing_code(void)
{
    return intercepting() ? ZE_RESULT_ERROR_UNINITIALIZED : ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
}

static const ze_context_desc_t ctx_desc = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
static const ze_device_mem_alloc_desc_t dev_desc = {.stype =
                                                        ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
static const ze_host_mem_alloc_desc_t host_desc = {.stype = ZE_STRUCTURE_TYPE_HOST_MEM_ALLOC_DESC};

/* zeInit, the first driver, its devices and a context; the first failing call's result. */
static ze_result_t ze_open(ze_t *z)
{
    memset(z, 0, sizeof(*z));
    ze_result_t r = zeInit(0);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    uint32_t n = 1;
    if ((r = zeDriverGet(&n, &z->driver)) != ZE_RESULT_SUCCESS)
        return r;
    z->n_devices = 8;
    if ((r = zeDeviceGet(z->driver, &z->n_devices, z->dev)) != ZE_RESULT_SUCCESS)
        return r;
    return zeContextCreate(z->driver, &ctx_desc, &z->ctx);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * SEC_NS + (uint64_t)ts.tv_nsec;
}

static void put_fd_in_handle(void *handle_data, int fd)
{
    gzt_ipc_handle_t h;
    memcpy(&h, handle_data, sizeof(h));
    h.fd = fd;
    memcpy(handle_data, &h, sizeof(h));
}

static int handle_fd(const void *handle_data)
{
    gzt_ipc_handle_t h;
    memcpy(&h, handle_data, sizeof(h));
    return h.fd;
}

static bool fd_open(int fd)
{
    return fcntl(fd, F_GETFD) != -1;
}

/* ---- running roles ----------------------------------------------------------------------------
 */

static char self_exe[PATH_MAX];
static char driver_path[PATH_MAX];

/*
 * Starts this binary as role `role` with extra argument arg (may be NULL). env holds "NAME=value"
 * to set and "NAME" to unset; keep_fd stays open in the child (-1: none); stderr_fd, if not -1,
 * becomes the child's stderr. Returns the pid.
 */
static pid_t spawn_role(const char *role, const char *arg, const char *const *env, int keep_fd,
                        int stderr_fd)
{
    return zt_spawn_role(self_exe, role, arg, env, keep_fd, stderr_fd);
}

static int run_role(const char *role, const char *const *env)
{
    return zt_wait_role(spawn_role(role, NULL, env, -1, -1));
}

/* ---- the roles --------------------------------------------------------------------------------
 */

static const char *role_name = "";

#define CHECK(cond)                                                                                \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "role %s (%s): %s:%d: %s\n", role_name,                                \
                    intercepting() ? "intercept" : "direct", __FILE__, __LINE__, #cond);           \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

#define CHECK_R(call, want)                                                                        \
    do {                                                                                           \
        ze_result_t got_ = (call);                                                                 \
        if (got_ != (want)) {                                                                      \
            fprintf(stderr, "role %s (%s): %s:%d: %s = 0x%x, want 0x%x\n", role_name,              \
                    intercepting() ? "intercept" : "direct", __FILE__, __LINE__, #call,            \
                    (unsigned)got_, (unsigned)(want));                                             \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

/* Importer of a memory allocation: maps it in its own context, reads, writes back. */
static int role_ipc_mem_child(int sock)
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    ze_ipc_mem_handle_t h;
    int fd;
    CHECK(zt_recv_fd(sock, &fd, h.data, sizeof(h.data)) == 0);
    CHECK(handle_fd(h.data) != fd || fd >= 0); /* the exporter's number means nothing here */
    put_fd_in_handle(h.data, fd);
    void *p = NULL;
    CHECK_R(zeMemOpenIpcHandle(z.ctx, z.dev[0], h, 0, &p), ZE_RESULT_SUCCESS);
    CHECK(close(fd) == 0); /* the importer owns its fd; the mapping outlives it */
    ze_memory_allocation_properties_t props = {.stype =
                                                   ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t dev = NULL;
    CHECK_R(zeMemGetAllocProperties(z.ctx, p, &props, &dev), ZE_RESULT_SUCCESS);
    CHECK(props.type == ZE_MEMORY_TYPE_DEVICE);
    size_t size = 0;
    CHECK_R(zeMemGetAddressRange(z.ctx, (char *)p + 10, NULL, &size), ZE_RESULT_SUCCESS);
    CHECK(size == MiB);
    const unsigned char *b = p;
    for (size_t i = 0; i < MiB; i++)
        CHECK(b[i] == 0xA5);
    memset(p, 0x5A, MiB / 2);
    CHECK_R(zeMemFree(z.ctx, p), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* close it, don't free it */
    CHECK_R(zeMemCloseIpcHandle(z.ctx, p), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    CHECK(write(sock, "d", 1) == 1);
    return 0;
}

/* Importer of an event pool: waits for the exporter's host signal, then signals back. */
static int role_ipc_event_child(int sock)
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    ze_ipc_event_pool_handle_t h;
    int fd;
    CHECK(zt_recv_fd(sock, &fd, h.data, sizeof(h.data)) == 0);
    put_fd_in_handle(h.data, fd);
    ze_event_pool_handle_t pool;
    CHECK_R(zeEventPoolOpenIpcHandle(z.ctx, h, &pool), ZE_RESULT_SUCCESS);
    close(fd);
    ze_event_handle_t ev[3];
    for (uint32_t i = 0; i < 3; i++) {
        ze_event_desc_t d = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = i};
        CHECK_R(zeEventCreate(pool, &d, &ev[i]), ZE_RESULT_SUCCESS);
    }
    /* A wait with a timeout on an event nobody signals ends on time. */
    uint64_t t0 = now_ns();
    CHECK_R(zeEventHostSynchronize(ev[2], 50000000u), ZE_RESULT_NOT_READY);
    uint64_t dt = now_ns() - t0;
    CHECK(dt >= 45000000u && dt < 30 * SEC_NS); /* the upper bound: it ended, however loaded */
    CHECK(write(sock, "r", 1) == 1);
    CHECK_R(zeEventHostSynchronize(ev[0], 10 * SEC_NS), ZE_RESULT_SUCCESS);
    CHECK_R(zeEventQueryStatus(ev[0]), ZE_RESULT_SUCCESS);
    CHECK_R(zeEventHostSignal(ev[1]), ZE_RESULT_SUCCESS);
    for (int i = 0; i < 3; i++)
        CHECK_R(zeEventDestroy(ev[i]), ZE_RESULT_SUCCESS);
    CHECK_R(zeEventPoolCloseIpcHandle(pool), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_devices(void) /* GRAPHD_ZE_TEST_DEVICES=3 GRAPHD_ZE_TEST_MEM_MB=64 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    CHECK(z.n_devices == 3);
    uint32_t n = 1;
    ze_device_memory_properties_t mp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
    CHECK_R(zeDeviceGetMemoryProperties(z.dev[2], &n, &mp), ZE_RESULT_SUCCESS);
    CHECK(mp.totalSize == 64ull * MiB);
    void *a, *b;
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, 65 * MiB, 0, z.dev[2], &a),
            ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, 40 * MiB, 0, z.dev[2], &a), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, 40 * MiB, 0, z.dev[2], &b),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    CHECK_R(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_no_devices(void) /* GRAPHD_ZE_TEST_DEVICES=0 */
{
    CHECK_R(zeInit(0), ZE_RESULT_SUCCESS);
    uint32_t n = 1;
    ze_driver_handle_t drv;
    CHECK_R(zeDriverGet(&n, &drv), ZE_RESULT_SUCCESS);
    n = 0;
    CHECK_R(zeDeviceGet(drv, &n, NULL), ZE_RESULT_SUCCESS);
    CHECK(n == 0);
    return 0;
}

static int role_knob_fail_alloc(void) /* GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER=1 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    void *a, *b, *h;
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &a), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[1], &b),
            ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    CHECK_R(zeMemAllocHost(z.ctx, &host_desc, MiB, 0, &h), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemFree(z.ctx, h), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_lost_after(void) /* GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=3 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS); /* counted call 1: zeContextCreate */
    void *a, *b, *c;
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &a), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &b), ZE_RESULT_SUCCESS);
    CHECK_R(zeDeviceGetStatus(z.dev[0]), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &c), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_R(zeDeviceGetStatus(z.dev[0]), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK_R(zeContextGetStatus(z.ctx), ZE_RESULT_ERROR_DEVICE_LOST);
    zes_device_state_t st = {.stype = ZES_STRUCTURE_TYPE_DEVICE_STATE};
    CHECK_R(zesDeviceGetState((zes_device_handle_t)z.dev[0], &st), ZE_RESULT_SUCCESS);
    CHECK(st.reset & ZES_RESET_REASON_FLAG_WEDGED);
    /* Cleanup still works, so a caller can release everything after a loss. */
    CHECK_R(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemFree(z.ctx, b), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_lost_now(void) /* GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=0 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_ERROR_DEVICE_LOST); /* discovery works, the context does not */
    CHECK(z.n_devices == 2);
    ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    CHECK_R(zeDeviceGetProperties(z.dev[1], &p), ZE_RESULT_SUCCESS);
    CHECK_R(zeDeviceGetStatus(z.dev[1]), ZE_RESULT_ERROR_DEVICE_LOST);
    return 0;
}

static int role_knob_no_ipc(void) /* GRAPHD_ZE_TEST_NO_IPC=1 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    ze_driver_ipc_properties_t ip = {.stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
    CHECK_R(zeDriverGetIpcProperties(z.driver, &ip), ZE_RESULT_SUCCESS);
    CHECK(ip.flags == 0);
    void *a;
    CHECK_R(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &a), ZE_RESULT_SUCCESS);
    ze_ipc_mem_handle_t h;
    CHECK_R(zeMemGetIpcHandle(z.ctx, a, &h), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    ze_event_pool_desc_t pd = {
        .stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .flags = ZE_EVENT_POOL_FLAG_IPC, .count = 1};
    ze_event_pool_handle_t pool;
    CHECK_R(zeEventPoolCreate(z.ctx, &pd, 0, NULL, &pool), ZE_RESULT_SUCCESS);
    ze_ipc_event_pool_handle_t ph;
    CHECK_R(zeEventPoolGetIpcHandle(pool, &ph), ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    CHECK_R(zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
    CHECK_R(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_no_sysman(void) /* GRAPHD_ZE_TEST_NO_SYSMAN=1: the Sysman tables are empty */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    uint32_t n = 0;
    CHECK_R(zesDeviceEnumMemoryModules((zes_device_handle_t)z.dev[0], &n, NULL), missing_code());
    CHECK_R(zesDeviceEnumEngineGroups((zes_device_handle_t)z.dev[0], &n, NULL), missing_code());
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_sysman_off(void) /* ZES_ENABLE_SYSMAN unset before zeInit */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    uint32_t n = 0;
    CHECK_R(zesDeviceEnumMemoryModules((zes_device_handle_t)z.dev[0], &n, NULL),
            ZE_RESULT_ERROR_UNINITIALIZED);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

/*
 * Any setting under which zeInit must fail. Nothing but zeInit is called after: when the only
 * driver's init fails, the 1.8.12 loader unloads it, yet without interception its tables still
 * point into it, so zeDriverGet would jump into unmapped code. A second zeInit is safe (the
 * loader answers the first result again).
 */
static int role_init_fails(void)
{
    ze_result_t r = zeInit(0);
    CHECK(r != ZE_RESULT_SUCCESS);
    CHECK_R(zeInit(0), r);
    return 0;
}

static int role_knob_hang(void) /* GRAPHD_ZE_TEST_HANG_MS=100 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .count = 1};
    ze_event_pool_handle_t pool;
    CHECK_R(zeEventPoolCreate(z.ctx, &pd, 0, NULL, &pool), ZE_RESULT_SUCCESS);
    ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC};
    ze_event_handle_t ev;
    CHECK_R(zeEventCreate(pool, &ed, &ev), ZE_RESULT_SUCCESS);
    ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC};
    ze_command_queue_handle_t q;
    CHECK_R(zeCommandQueueCreate(z.ctx, z.dev[0], &qd, &q), ZE_RESULT_SUCCESS);
    ze_command_list_desc_t ld = {.stype = ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC};
    ze_command_list_handle_t l;
    CHECK_R(zeCommandListCreate(z.ctx, z.dev[0], &ld, &l), ZE_RESULT_SUCCESS);
    CHECK_R(zeCommandListAppendWaitOnEvents(l, 1, &ev), ZE_RESULT_SUCCESS);
    CHECK_R(zeCommandListClose(l), ZE_RESULT_SUCCESS);
    uint64_t t0 = now_ns();
    CHECK_R(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_ERROR_DEVICE_LOST);
    CHECK(now_ns() - t0 < 2 * SEC_NS);
    CHECK_R(zeCommandListDestroy(l), ZE_RESULT_SUCCESS);
    CHECK_R(zeCommandQueueDestroy(q), ZE_RESULT_SUCCESS);
    CHECK_R(zeEventDestroy(ev), ZE_RESULT_SUCCESS);
    CHECK_R(zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

static int role_knob_api_1_4(void) /* GRAPHD_ZE_TEST_API_VERSION=1.4 */
{
    ze_t z;
    CHECK_R(ze_open(&z), ZE_RESULT_SUCCESS);
    ze_api_version_t v;
    CHECK_R(zeDriverGetApiVersion(z.driver, &v), ZE_RESULT_SUCCESS);
    CHECK(v == ZE_API_VERSION_1_4);
    void *fn = NULL;
    CHECK_R(zeDriverGetExtensionFunctionAddress(z.driver, "zeMemPutIpcHandle", &fn),
            ZE_RESULT_ERROR_INVALID_ARGUMENT);
    CHECK_R(zeDriverGetExtensionFunctionAddress(z.driver, GZT_EXT_DEVICE_INDEX, &fn),
            ZE_RESULT_SUCCESS);
    CHECK_R(zeContextDestroy(z.ctx), ZE_RESULT_SUCCESS);
    return 0;
}

/* ZE_ENABLE_ALT_DRIVERS names the driver and a copy of it: the loader intercepts by itself. */
static int role_two_drivers(void)
{
    CHECK_R(zeInit(0), ZE_RESULT_SUCCESS);
    uint32_t n = 0;
    CHECK_R(zeDriverGet(&n, NULL), ZE_RESULT_SUCCESS);
    CHECK(n == 2);
    ze_driver_handle_t drv[2];
    CHECK_R(zeDriverGet(&n, drv), ZE_RESULT_SUCCESS);
    for (int d = 0; d < 2; d++) {
        ze_device_handle_t dev[2];
        uint32_t nd = 2;
        CHECK_R(zeDeviceGet(drv[d], &nd, dev), ZE_RESULT_SUCCESS);
        CHECK(nd == 2);
        gzt_device_index_fn fn = NULL;
        CHECK_R(zeDriverGetExtensionFunctionAddress(drv[d], GZT_EXT_DEVICE_INDEX, (void **)&fn),
                ZE_RESULT_SUCCESS);
        void *raw = NULL;
        CHECK_R(zelLoaderTranslateHandle(ZEL_HANDLE_DEVICE, dev[1], &raw), ZE_RESULT_SUCCESS);
        CHECK(raw != NULL && raw != (void *)dev[1]); /* two drivers: the loader wraps handles */
        uint32_t idx = 99;
        CHECK_R(fn((ze_device_handle_t)raw, &idx), ZE_RESULT_SUCCESS);
        CHECK(idx == 1);
        CHECK_R(fn(dev[1], &idx), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
        ze_context_handle_t ctx;
        CHECK_R(zeContextCreate(drv[d], &ctx_desc, &ctx), ZE_RESULT_SUCCESS);
        void *p;
        CHECK_R(zeMemAllocDevice(ctx, &dev_desc, MiB, 0, dev[0], &p), ZE_RESULT_SUCCESS);
        memset(p, d, MiB);
        CHECK_R(zeMemFree(ctx, p), ZE_RESULT_SUCCESS);
        CHECK_R(zeContextDestroy(ctx), ZE_RESULT_SUCCESS);
    }
    return 0;
}

static int role_main(const char *role, const char *arg)
{
    role_name = role;
    static const struct {
        const char *name;
        int (*fn)(void);
    } roles[] = {
        {"knob-devices", role_knob_devices},       {"knob-no-devices", role_knob_no_devices},
        {"knob-fail-alloc", role_knob_fail_alloc}, {"knob-lost-after", role_knob_lost_after},
        {"knob-lost-now", role_knob_lost_now},     {"knob-no-ipc", role_knob_no_ipc},
        {"knob-no-sysman", role_knob_no_sysman},   {"sysman-off", role_sysman_off},
        {"init-fails", role_init_fails},           {"knob-hang", role_knob_hang},
        {"knob-api-1.4", role_knob_api_1_4},       {"two-drivers", role_two_drivers},
    };
    if (strcmp(role, "ipc-mem-child") == 0 && arg != NULL)
        return role_ipc_mem_child(atoi(arg));
    if (strcmp(role, "ipc-event-child") == 0 && arg != NULL)
        return role_ipc_event_child(atoi(arg));
    for (size_t i = 0; i < sizeof(roles) / sizeof(roles[0]); i++) {
        if (strcmp(role, roles[i].name) == 0)
            return roles[i].fn();
    }
    fprintf(stderr, "unknown role %s\n", role);
    return 2;
}

/* ---- the suite (one process per loader mode) --------------------------------------------------
 */

static ze_t z;

static int group_setup(void **state)
{
    (void)state;
    return ze_open(&z) == ZE_RESULT_SUCCESS && z.n_devices == 2 ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    return zeContextDestroy(z.ctx) == ZE_RESULT_SUCCESS ? 0 : -1;
}

static void test_discovery_and_properties(void **state)
{
    (void)state;
    assert_int_equal(zeInit(0), ZE_RESULT_SUCCESS); /* again: harmless */
    uint32_t n = 0;
    assert_int_equal(zeDriverGet(&n, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 1);
    ze_api_version_t v;
    assert_int_equal(zeDriverGetApiVersion(z.driver, &v), ZE_RESULT_SUCCESS);
    assert_true(v >= ZE_API_VERSION_1_4);
    ze_driver_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES};
    assert_int_equal(zeDriverGetProperties(z.driver, &dp), ZE_RESULT_SUCCESS);
    assert_memory_equal(dp.uuid.id, "graphd-ze-test", 14);
    ze_driver_ipc_properties_t ip = {.stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
    assert_int_equal(zeDriverGetIpcProperties(z.driver, &ip), ZE_RESULT_SUCCESS);
    assert_int_equal(ip.flags, ZE_IPC_PROPERTY_FLAG_MEMORY | ZE_IPC_PROPERTY_FLAG_EVENT_POOL);
    ze_driver_extension_properties_t ext[4];
    n = 4;
    assert_int_equal(zeDriverGetExtensionProperties(z.driver, &n, ext), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 1);
    assert_string_equal(ext[0].name, "ZEX_graphd_test_driver");

    ze_device_properties_t p[2];
    for (int i = 0; i < 2; i++) {
        p[i] = (ze_device_properties_t){.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
        assert_int_equal(zeDeviceGetProperties(z.dev[i], &p[i]), ZE_RESULT_SUCCESS);
        assert_int_equal(p[i].type, ZE_DEVICE_TYPE_GPU);
        assert_int_equal(p[i].vendorId, 0x8086);
        char want[64];
        snprintf(want, sizeof(want), "graphd test XPU %d", i);
        assert_string_equal(p[i].name, want);
        assert_int_equal(p[i].maxMemAllocSize, 256ull * MiB);
        assert_int_equal(zeDeviceGetStatus(z.dev[i]), ZE_RESULT_SUCCESS);
    }
    assert_memory_not_equal(p[0].uuid.id, p[1].uuid.id, ZE_MAX_DEVICE_UUID_SIZE);
    assert_int_equal(p[0].numSlices * p[0].numSubslicesPerSlice * p[0].numEUsPerSubslice, 64);
    assert_int_equal(p[1].numSlices * p[1].numSubslicesPerSlice * p[1].numEUsPerSubslice, 96);

    ze_device_memory_properties_t mp[2];
    n = 2;
    for (int i = 0; i < 2; i++)
        mp[i] =
            (ze_device_memory_properties_t){.stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES};
    assert_int_equal(zeDeviceGetMemoryProperties(z.dev[1], &n, mp), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 1);
    assert_int_equal(mp[0].totalSize, 256ull * MiB);
    ze_device_compute_properties_t cp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_COMPUTE_PROPERTIES};
    assert_int_equal(zeDeviceGetComputeProperties(z.dev[0], &cp), ZE_RESULT_SUCCESS);
    assert_true(cp.maxTotalGroupSize > 0);
    n = 0;
    assert_int_equal(zeDeviceGetCommandQueueGroupProperties(z.dev[0], &n, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 2);
    n = 5;
    assert_int_equal(zeDeviceGetSubDevices(z.dev[0], &n, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 0);
    /* Left NULL in the driver's tables: the loader answers for it. */
    ze_device_cache_properties_t cache;
    n = 1;
    assert_int_equal(zeDeviceGetCacheProperties(z.dev[0], &n, &cache), missing_code());
}

static void test_memory_and_addresses(void **state)
{
    (void)state;
    void *d = NULL, *h = NULL, *s = NULL, *al = NULL;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, MiB + 3, 0, z.dev[1], &d),
                     ZE_RESULT_SUCCESS);
    memset(d, 7, MiB + 3);
    ze_memory_allocation_properties_t p = {.stype = ZE_STRUCTURE_TYPE_MEMORY_ALLOCATION_PROPERTIES};
    ze_device_handle_t dev = NULL;
    assert_int_equal(zeMemGetAllocProperties(z.ctx, (char *)d + 100, &p, &dev), ZE_RESULT_SUCCESS);
    assert_int_equal(p.type, ZE_MEMORY_TYPE_DEVICE);
    assert_true(p.id != 0);
    assert_ptr_equal(dev, z.dev[1]); /* the loader hands back its own handle for the device */
    void *base = NULL;
    size_t size = 0;
    assert_int_equal(zeMemGetAddressRange(z.ctx, (char *)d + MiB, &base, &size), ZE_RESULT_SUCCESS);
    assert_ptr_equal(base, d);
    assert_int_equal(size, MiB + 3);

    assert_int_equal(zeMemAllocHost(z.ctx, &host_desc, 4096, 0, &h), ZE_RESULT_SUCCESS);
    dev = z.dev[0];
    assert_int_equal(zeMemGetAllocProperties(z.ctx, h, &p, &dev), ZE_RESULT_SUCCESS);
    assert_int_equal(p.type, ZE_MEMORY_TYPE_HOST);
    assert_null(dev);
    assert_int_equal(zeMemAllocShared(z.ctx, &dev_desc, &host_desc, 100, 0, z.dev[0], &s),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemGetAllocProperties(z.ctx, s, &p, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(p.type, ZE_MEMORY_TYPE_SHARED);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 4096, 1u << 20, z.dev[0], &al),
                     ZE_RESULT_SUCCESS);
    assert_int_equal((uintptr_t)al % (1u << 20), 0);

    int local;
    assert_int_equal(zeMemGetAllocProperties(z.ctx, &local, &p, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(p.type, ZE_MEMORY_TYPE_UNKNOWN);
    assert_int_equal(zeMemGetAddressRange(z.ctx, &local, &base, &size),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT);
    void *x;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 0, 0, z.dev[0], &x),
                     ZE_RESULT_ERROR_UNSUPPORTED_SIZE);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 64, 3, z.dev[0], &x),
                     ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT);

    /* A context with live allocations is in use; freeing twice is an error, not a crash. */
    ze_context_handle_t c2;
    void *y;
    assert_int_equal(zeContextCreate(z.driver, &ctx_desc, &c2), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocDevice(c2, &dev_desc, 4096, 0, z.dev[0], &y), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, y), ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not z.ctx's */
    assert_int_equal(zeContextDestroy(c2), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    assert_int_equal(zeMemFree(c2, y), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(c2, y), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(zeContextDestroy(c2), ZE_RESULT_SUCCESS);

    assert_int_equal(zeMemFree(z.ctx, d), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, d), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(zeMemFree(z.ctx, &local), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(zeMemFree(z.ctx, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    assert_int_equal(zeMemFree(z.ctx, h), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, s), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, al), ZE_RESULT_SUCCESS);
}

static void test_device_memory_limit(void **state)
{
    (void)state;
    void *a, *b, *c;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 200 * MiB, 0, z.dev[0], &a),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 100 * MiB, 0, z.dev[0], &b),
                     ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 100 * MiB, 0, z.dev[1], &b),
                     ZE_RESULT_SUCCESS); /* each device has its own memory */
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 257 * MiB, 0, z.dev[1], &c),
                     ZE_RESULT_ERROR_UNSUPPORTED_SIZE); /* over maxMemAllocSize */
    assert_int_equal(zeMemAllocHost(z.ctx, &host_desc, 100 * MiB, 0, &c), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, c), ZE_RESULT_SUCCESS); /* host memory is not counted */
    assert_int_equal(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 100 * MiB, 0, z.dev[0], &a),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, b), ZE_RESULT_SUCCESS);
}

static void test_ipc_memory_across_processes(void **state)
{
    (void)state;
    void *p;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, MiB, 0, z.dev[0], &p), ZE_RESULT_SUCCESS);
    memset(p, 0xA5, MiB);
    ze_ipc_mem_handle_t h;
    assert_int_equal(zeMemGetIpcHandle(z.ctx, p, &h), ZE_RESULT_SUCCESS);
    int fd = handle_fd(h.data);
    assert_true(fd_open(fd));

    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", sv[1]);
    pid_t pid = spawn_role("ipc-mem-child", arg, NULL, sv[1], -1);
    close(sv[1]);
    assert_int_equal(zt_send_fd(sv[0], fd, h.data, sizeof(h.data)), 0);
    char done = 0;
    assert_int_equal(read(sv[0], &done, 1), 1);
    assert_int_equal(zt_wait_role(pid), 0);
    close(sv[0]);
    const unsigned char *b = p;
    assert_int_equal(b[0], 0x5A);
    assert_int_equal(b[MiB / 2 - 1], 0x5A);
    assert_int_equal(b[MiB / 2], 0xA5);

    /* Opening in this process works too, with the handle's own fd. */
    void *q;
    assert_int_equal(zeMemOpenIpcHandle(z.ctx, z.dev[0], h, 0, &q), ZE_RESULT_SUCCESS);
    assert_ptr_not_equal(q, p);
    assert_int_equal(((unsigned char *)q)[0], 0x5A);
    assert_int_equal(zeMemCloseIpcHandle(z.ctx, q), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemCloseIpcHandle(z.ctx, q), ZE_RESULT_ERROR_INVALID_ARGUMENT);

    /* The 1.6 calls, through the extension table: fd <-> handle, and put. */
    void *raw_ctx;
    assert_int_equal(zelLoaderTranslateHandle(ZEL_HANDLE_CONTEXT, z.ctx, &raw_ctx),
                     ZE_RESULT_SUCCESS);
    ze_result_t(ZE_APICALL * get_fd)(ze_context_handle_t, ze_ipc_mem_handle_t, uint64_t *);
    ze_result_t(ZE_APICALL * from_fd)(ze_context_handle_t, uint64_t, ze_ipc_mem_handle_t *);
    ze_result_t(ZE_APICALL * put)(ze_context_handle_t, ze_ipc_mem_handle_t);
    assert_int_equal(zeDriverGetExtensionFunctionAddress(
                         z.driver, "zeMemGetFileDescriptorFromIpcHandleExp", (void **)&get_fd),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeDriverGetExtensionFunctionAddress(
                         z.driver, "zeMemGetIpcHandleFromFileDescriptorExp", (void **)&from_fd),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(
        zeDriverGetExtensionFunctionAddress(z.driver, "zeMemPutIpcHandle", (void **)&put),
        ZE_RESULT_SUCCESS);
    uint64_t got = 0;
    assert_int_equal(get_fd((ze_context_handle_t)raw_ctx, h, &got), ZE_RESULT_SUCCESS);
    assert_int_equal(got, (uint64_t)fd);
    ze_ipc_mem_handle_t h2;
    assert_int_equal(from_fd((ze_context_handle_t)raw_ctx, got, &h2), ZE_RESULT_SUCCESS);
    assert_int_equal(handle_fd(h2.data), fd);
    if (intercepting()) /* an untranslated loader handle is not the driver's */
        assert_int_equal(put(z.ctx, h), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(put((ze_context_handle_t)raw_ctx, h), ZE_RESULT_SUCCESS);
    assert_false(fd_open(fd)); /* put closed the handle's fd */
    assert_int_equal(put((ze_context_handle_t)raw_ctx, h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    /* Opening a handle whose fd is not open here fails cleanly. */
    assert_int_equal(zeMemOpenIpcHandle(z.ctx, z.dev[0], h, 0, &q),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ze_ipc_mem_handle_t junk;
    memset(&junk, 0x11, sizeof(junk));
    assert_int_equal(zeMemOpenIpcHandle(z.ctx, z.dev[0], junk, 0, &q),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT);

    /* Handles never put are closed when the allocation is freed. */
    assert_int_equal(zeMemGetIpcHandle(z.ctx, p, &h), ZE_RESULT_SUCCESS);
    fd = handle_fd(h.data);
    assert_true(fd_open(fd));
    assert_int_equal(zeMemGetIpcHandle(z.ctx, (char *)p + 64, &h),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT); /* only an allocation's base */
    assert_int_equal(zeMemFree(z.ctx, p), ZE_RESULT_SUCCESS);
    assert_false(fd_open(fd));
}

static void test_ipc_event_pool_across_processes(void **state)
{
    (void)state;
    ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                               .flags = ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                               .count = 4};
    ze_event_pool_handle_t pool;
    assert_int_equal(zeEventPoolCreate(z.ctx, &pd, 1, &z.dev[0], &pool), ZE_RESULT_SUCCESS);
    ze_event_handle_t ev[3];
    for (uint32_t i = 0; i < 3; i++) {
        ze_event_desc_t d = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = i};
        assert_int_equal(zeEventCreate(pool, &d, &ev[i]), ZE_RESULT_SUCCESS);
    }
    ze_event_desc_t dup = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = 1};
    ze_event_handle_t e;
    assert_int_equal(zeEventCreate(pool, &dup, &e), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    dup.index = 4;
    assert_int_equal(zeEventCreate(pool, &dup, &e), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    ze_ipc_event_pool_handle_t h;
    assert_int_equal(zeEventPoolGetIpcHandle(pool, &h), ZE_RESULT_SUCCESS);

    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
    char arg[16];
    snprintf(arg, sizeof(arg), "%d", sv[1]);
    pid_t pid = spawn_role("ipc-event-child", arg, NULL, sv[1], -1);
    close(sv[1]);
    assert_int_equal(zt_send_fd(sv[0], handle_fd(h.data), h.data, sizeof(h.data)), 0);
    char ready = 0;
    assert_int_equal(read(sv[0], &ready, 1), 1);
    assert_int_equal(zeEventQueryStatus(ev[0]), ZE_RESULT_NOT_READY);
    assert_int_equal(zeEventHostSignal(ev[0]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventHostSynchronize(ev[1], 10 * SEC_NS), ZE_RESULT_SUCCESS);
    assert_int_equal(zt_wait_role(pid), 0);
    close(sv[0]);
    assert_int_equal(zeEventHostSynchronize(ev[2], 0), ZE_RESULT_NOT_READY);
    assert_int_equal(zeEventHostReset(ev[1]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventQueryStatus(ev[1]), ZE_RESULT_NOT_READY);

    assert_int_equal(zeEventPoolDestroy(pool), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    for (int i = 0; i < 3; i++)
        assert_int_equal(zeEventDestroy(ev[i]), ZE_RESULT_SUCCESS);
    int fd = handle_fd(h.data);
    assert_true(fd_open(fd));
    assert_int_equal(zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
    assert_false(fd_open(fd)); /* the handle's fd went with the pool */

    /* A pool made without ZE_EVENT_POOL_FLAG_IPC has no IPC handle. */
    pd.flags = 0;
    assert_int_equal(zeEventPoolCreate(z.ctx, &pd, 0, NULL, &pool), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventPoolGetIpcHandle(pool, &h), ZE_RESULT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
}

static void test_command_lists(void **state)
{
    (void)state;
    const size_t n = 64 * 1024;
    void *src, *dst, *host;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, n, 0, z.dev[0], &src), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, n, 0, z.dev[0], &dst), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocHost(z.ctx, &host_desc, n, 0, &host), ZE_RESULT_SUCCESS);
    ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC, .count = 2};
    ze_event_pool_handle_t pool;
    assert_int_equal(zeEventPoolCreate(z.ctx, &pd, 0, NULL, &pool), ZE_RESULT_SUCCESS);
    ze_event_handle_t ev[2];
    for (uint32_t i = 0; i < 2; i++) {
        ze_event_desc_t d = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC, .index = i};
        assert_int_equal(zeEventCreate(pool, &d, &ev[i]), ZE_RESULT_SUCCESS);
    }
    ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC};
    ze_command_queue_handle_t q;
    assert_int_equal(zeCommandQueueCreate(z.ctx, z.dev[0], &qd, &q), ZE_RESULT_SUCCESS);
    ze_command_list_desc_t ld = {.stype = ZE_STRUCTURE_TYPE_COMMAND_LIST_DESC};
    ze_command_list_handle_t l;
    assert_int_equal(zeCommandListCreate(z.ctx, z.dev[0], &ld, &l), ZE_RESULT_SUCCESS);

    const uint32_t pattern = 0xC0FFEE11;
    assert_int_equal(zeCommandListAppendMemoryFill(l, src, &pattern, 4, n, NULL, 0, NULL),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendBarrier(l, NULL, 0, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryCopy(l, dst, src, n, ev[0], 0, NULL),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryCopy(l, host, dst, n, NULL, 1, &ev[0]),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendSignalEvent(l, ev[1]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryFill(l, src, &pattern, 3, n, NULL, 0, NULL),
                     ZE_RESULT_ERROR_INVALID_SIZE);
    assert_int_equal(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT); /* not closed yet */
    assert_int_equal(zeCommandListClose(l), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendBarrier(l, NULL, 0, NULL),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT); /* closed */
    assert_int_equal(zeEventQueryStatus(ev[1]), ZE_RESULT_NOT_READY);
    assert_int_equal(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandQueueSynchronize(q, UINT64_MAX), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventQueryStatus(ev[0]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventHostSynchronize(ev[1], 0), ZE_RESULT_SUCCESS);
    for (size_t i = 0; i < n; i += 4)
        assert_int_equal(*(uint32_t *)((char *)host + i), pattern);

    /* Reset, then an event reset and a fill of a single byte, run again. */
    assert_int_equal(zeCommandListReset(l), ZE_RESULT_SUCCESS);
    const uint8_t z8 = 0;
    assert_int_equal(zeCommandListAppendEventReset(l, ev[1]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryFill(l, host, &z8, 1, n, NULL, 0, NULL),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListClose(l), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandQueueExecuteCommandLists(q, 1, &l, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventQueryStatus(ev[1]), ZE_RESULT_NOT_READY);
    assert_int_equal(((unsigned char *)host)[n - 1], 0);

    /* An immediate list runs at append. */
    ze_command_list_handle_t il;
    assert_int_equal(zeCommandListCreateImmediate(z.ctx, z.dev[0], &qd, &il), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryCopy(il, host, src, 16, ev[1], 0, NULL),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(*(uint32_t *)host, pattern);
    assert_int_equal(zeEventQueryStatus(ev[1]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandQueueExecuteCommandLists(q, 1, &il, NULL),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT);

    /* A list for the copy group does not go to a compute queue. */
    ze_command_list_handle_t cl;
    ld.commandQueueGroupOrdinal = 1;
    assert_int_equal(zeCommandListCreate(z.ctx, z.dev[0], &ld, &cl), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListClose(cl), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandQueueExecuteCommandLists(q, 1, &cl, NULL),
                     ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE);

    assert_int_equal(zeContextDestroy(z.ctx), ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE);
    assert_int_equal(zeCommandListDestroy(cl), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListDestroy(il), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListDestroy(l), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandQueueDestroy(q), ZE_RESULT_SUCCESS);
    for (int i = 0; i < 2; i++)
        assert_int_equal(zeEventDestroy(ev[i]), ZE_RESULT_SUCCESS);
    assert_int_equal(zeEventPoolDestroy(pool), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, src), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, dst), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, host), ZE_RESULT_SUCCESS);
}

static uint64_t engine_active(zes_engine_handle_t e)
{
    zes_engine_stats_t s;
    assert_int_equal(zesEngineGetActivity(e, &s), ZE_RESULT_SUCCESS);
    assert_true(s.timestamp > 0);
    return s.activeTime;
}

static void test_sysman(void **state)
{
    (void)state;
    zes_device_handle_t sd = (zes_device_handle_t)z.dev[1];
    zes_device_properties_t dp = {.stype = ZES_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    assert_int_equal(zesDeviceGetProperties(sd, &dp), ZE_RESULT_SUCCESS);
    assert_string_equal(dp.core.name, "graphd test XPU 1");
    zes_device_state_t st = {.stype = ZES_STRUCTURE_TYPE_DEVICE_STATE};
    assert_int_equal(zesDeviceGetState(sd, &st), ZE_RESULT_SUCCESS);
    assert_int_equal(st.reset, 0);

    uint32_t n = 0;
    assert_int_equal(zesDeviceEnumMemoryModules(sd, &n, NULL), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 1);
    zes_mem_handle_t mem;
    assert_int_equal(zesDeviceEnumMemoryModules(sd, &n, &mem), ZE_RESULT_SUCCESS);
    zes_mem_properties_t mp = {.stype = ZES_STRUCTURE_TYPE_MEM_PROPERTIES};
    assert_int_equal(zesMemoryGetProperties(mem, &mp), ZE_RESULT_SUCCESS);
    assert_int_equal(mp.location, ZES_MEM_LOC_DEVICE);
    assert_int_equal(mp.physicalSize, 256ull * MiB);
    zes_mem_state_t ms = {.stype = ZES_STRUCTURE_TYPE_MEM_STATE};
    assert_int_equal(zesMemoryGetState(mem, &ms), ZE_RESULT_SUCCESS);
    assert_int_equal(ms.health, ZES_MEM_HEALTH_OK);
    assert_int_equal(ms.size, 256ull * MiB);
    uint64_t free0 = ms.free;
    void *p;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 64 * MiB, 0, z.dev[1], &p),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zesMemoryGetState(mem, &ms), ZE_RESULT_SUCCESS);
    assert_int_equal(ms.free, free0 - 64ull * MiB);
    assert_int_equal(zeMemFree(z.ctx, p), ZE_RESULT_SUCCESS);
    assert_int_equal(zesMemoryGetState(mem, &ms), ZE_RESULT_SUCCESS);
    assert_int_equal(ms.free, free0);
    assert_int_equal(zesMemoryGetBandwidth(mem, NULL), missing_code());

    zes_engine_handle_t eng[4];
    n = 4;
    assert_int_equal(zesDeviceEnumEngineGroups(sd, &n, eng), ZE_RESULT_SUCCESS);
    assert_int_equal(n, 3);
    zes_engine_group_t types[3];
    for (int i = 0; i < 3; i++) {
        zes_engine_properties_t ep = {.stype = ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES};
        assert_int_equal(zesEngineGetProperties(eng[i], &ep), ZE_RESULT_SUCCESS);
        types[i] = ep.type;
    }
    assert_int_equal(types[0], ZES_ENGINE_GROUP_ALL);
    assert_int_equal(types[1], ZES_ENGINE_GROUP_COMPUTE_ALL);
    assert_int_equal(types[2], ZES_ENGINE_GROUP_COPY_ALL);
    uint64_t all0 = engine_active(eng[0]), compute0 = engine_active(eng[1]);
    uint64_t copy0 = engine_active(eng[2]);
    void *a, *b;
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 16 * MiB, 0, z.dev[1], &a),
                     ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 16 * MiB, 0, z.dev[1], &b),
                     ZE_RESULT_SUCCESS);
    ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC};
    ze_command_list_handle_t il;
    assert_int_equal(zeCommandListCreateImmediate(z.ctx, z.dev[1], &qd, &il), ZE_RESULT_SUCCESS);
    assert_int_equal(zeCommandListAppendMemoryCopy(il, b, a, 16 * MiB, NULL, 0, NULL),
                     ZE_RESULT_SUCCESS);
    assert_true(engine_active(eng[0]) > all0);
    assert_true(engine_active(eng[1]) > compute0);
    assert_int_equal(engine_active(eng[2]), copy0); /* ordinal 0 is the compute group */
    assert_int_equal(zeCommandListDestroy(il), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, a), ZE_RESULT_SUCCESS);
    assert_int_equal(zeMemFree(z.ctx, b), ZE_RESULT_SUCCESS);

    assert_int_equal(run_role("sysman-off", (const char *[]){"ZES_ENABLE_SYSMAN", NULL}), 0);
}

static void test_knob_devices_and_memory(void **state)
{
    (void)state;
    const char *env[] = {"GRAPHD_ZE_TEST_DEVICES=3", "GRAPHD_ZE_TEST_MEM_MB=64", NULL};
    assert_int_equal(run_role("knob-devices", env), 0);
    const char *none[] = {"GRAPHD_ZE_TEST_DEVICES=0", NULL};
    assert_int_equal(run_role("knob-no-devices", none), 0);
}

static void test_knob_out_of_device_memory(void **state)
{
    (void)state;
    const char *env[] = {"GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER=1", NULL};
    assert_int_equal(run_role("knob-fail-alloc", env), 0);
}

static void test_knob_device_lost(void **state)
{
    (void)state;
    const char *after[] = {"GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=3", NULL};
    assert_int_equal(run_role("knob-lost-after", after), 0);
    const char *now[] = {"GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=0", NULL};
    assert_int_equal(run_role("knob-lost-now", now), 0);
    const char *hang[] = {"GRAPHD_ZE_TEST_HANG_MS=100", NULL};
    assert_int_equal(run_role("knob-hang", hang), 0);
}

static void test_knob_ipc_unsupported(void **state)
{
    (void)state;
    const char *env[] = {"GRAPHD_ZE_TEST_NO_IPC=1", NULL};
    assert_int_equal(run_role("knob-no-ipc", env), 0);
}

static void test_knob_sysman_absent(void **state)
{
    (void)state;
    const char *env[] = {"GRAPHD_ZE_TEST_NO_SYSMAN=1", NULL};
    assert_int_equal(run_role("knob-no-sysman", env), 0);
}

static void test_knob_init_fails_and_bad_values(void **state)
{
    (void)state;
    const char *fail[] = {"GRAPHD_ZE_TEST_INIT_FAIL=1", NULL};
    assert_int_equal(run_role("init-fails", fail), 0);
    /* A knob that does not parse fails zeInit and says which knob and what it takes. */
    FILE *err = tmpfile();
    assert_non_null(err);
    const char *bad[] = {"GRAPHD_ZE_TEST_DEVICES=lots", NULL};
    assert_int_equal(zt_wait_role(spawn_role("init-fails", NULL, bad, -1, fileno(err))), 0);
    char buf[512] = {0};
    rewind(err);
    size_t got = fread(buf, 1, sizeof(buf) - 1, err);
    fclose(err);
    assert_true(got > 0);
    assert_non_null(strstr(buf, "GRAPHD_ZE_TEST_DEVICES=lots is not an integer in [0, 8]"));
    const char *api[] = {"GRAPHD_ZE_TEST_API_VERSION=1.4", NULL};
    assert_int_equal(run_role("knob-api-1.4", api), 0);
}

static void test_invalid_handles(void **state)
{
    (void)state;
    /* Null pointers: checked by the driver in both modes. */
    assert_int_equal(zeDeviceGet(z.driver, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    assert_int_equal(zeDeviceGetProperties(z.dev[0], NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    assert_int_equal(zeContextCreate(z.driver, NULL, NULL), ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    assert_int_equal(zeMemAllocDevice(z.ctx, NULL, 64, 0, z.dev[0], NULL),
                     ZE_RESULT_ERROR_INVALID_NULL_POINTER);
    if (intercepting())
        skip(); /* the 1.8.12 loader reads through every handle it is given: NULL would crash it */

    void *p;
    ze_context_handle_t c;
    ze_device_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    assert_int_equal(zeDeviceGetProperties(NULL, &dp), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeContextCreate(NULL, &ctx_desc, &c), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeMemAllocDevice(NULL, &dev_desc, 64, 0, z.dev[0], &p),
                     ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeMemAllocDevice(z.ctx, &dev_desc, 64, 0, NULL, &p),
                     ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeEventHostSignal(NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeCommandListClose(NULL), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeCommandQueueSynchronize(NULL, 0), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    zes_mem_state_t ms = {.stype = ZES_STRUCTURE_TYPE_MEM_STATE};
    assert_int_equal(zesMemoryGetState(NULL, &ms), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    /* A handle of the wrong kind, and a destroyed one. */
    assert_int_equal(zeDeviceGetProperties((ze_device_handle_t)z.ctx, &dp),
                     ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zesMemoryGetState((zes_mem_handle_t)z.dev[0], &ms),
                     ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeContextCreate(z.driver, &ctx_desc, &c), ZE_RESULT_SUCCESS);
    assert_int_equal(zeContextDestroy(c), ZE_RESULT_SUCCESS);
    assert_int_equal(zeContextDestroy(c), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    assert_int_equal(zeMemAllocHost(c, &host_desc, 64, 0, &p), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
}

static void test_extension_function_and_translation(void **state)
{
    (void)state;
    gzt_device_index_fn fn = NULL;
    assert_int_equal(
        zeDriverGetExtensionFunctionAddress(z.driver, GZT_EXT_DEVICE_INDEX, (void **)&fn),
        ZE_RESULT_SUCCESS);
    assert_non_null(fn);
    void *raw = NULL;
    assert_int_equal(zelLoaderTranslateHandle(ZEL_HANDLE_DEVICE, z.dev[1], &raw),
                     ZE_RESULT_SUCCESS);
    uint32_t idx = 99;
    assert_int_equal(fn((ze_device_handle_t)raw, &idx), ZE_RESULT_SUCCESS);
    assert_int_equal(idx, 1);
    if (intercepting()) {
        assert_ptr_not_equal(raw, z.dev[1]);
        assert_int_equal(fn(z.dev[1], &idx), ZE_RESULT_ERROR_INVALID_NULL_HANDLE);
    } else {
        assert_ptr_equal(raw, z.dev[1]); /* passing through: handles are the driver's */
    }
    void *x = &idx;
    assert_int_equal(zeDriverGetExtensionFunctionAddress(z.driver, "zeNoSuchCall", &x),
                     ZE_RESULT_ERROR_INVALID_ARGUMENT);
    assert_null(x);

    /* Two drivers at once (the driver and a copy): the loader intercepts without being told. */
    char dir[] = "/tmp/gzt-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char copy[PATH_MAX + 32], alt[2 * PATH_MAX + 64];
    snprintf(copy, sizeof(copy), "%s/libze_graphd_test_copy.so", dir);
    int in = open(driver_path, O_RDONLY), out = open(copy, O_WRONLY | O_CREAT | O_EXCL, 0755);
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

static void test_loader_refuses_incomplete_driver(void **state)
{
    (void)state;
    /* The same driver without zesGetTemperatureProcAddrTable, one of the 46 the loader needs. */
    char alt[PATH_MAX + 64], *slash;
    snprintf(alt, sizeof(alt), "ZE_ENABLE_ALT_DRIVERS=%s", driver_path);
    slash = strstr(alt, ".so");
    assert_non_null(slash);
    snprintf(slash, sizeof(alt) - (size_t)(slash - alt), "_notemp.so");
    struct stat st;
    assert_int_equal(stat(alt + strlen("ZE_ENABLE_ALT_DRIVERS="), &st), 0);
    const char *env[] = {alt, NULL};
    assert_int_equal(run_role("init-fails", env), 0);
}

/* ---- main -------------------------------------------------------------------------------------
 */

static int run_suite(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_discovery_and_properties),
        cmocka_unit_test(test_memory_and_addresses),
        cmocka_unit_test(test_device_memory_limit),
        cmocka_unit_test(test_ipc_memory_across_processes),
        cmocka_unit_test(test_ipc_event_pool_across_processes),
        cmocka_unit_test(test_command_lists),
        cmocka_unit_test(test_sysman),
        cmocka_unit_test(test_knob_devices_and_memory),
        cmocka_unit_test(test_knob_out_of_device_memory),
        cmocka_unit_test(test_knob_device_lost),
        cmocka_unit_test(test_knob_ipc_unsupported),
        cmocka_unit_test(test_knob_sysman_absent),
        cmocka_unit_test(test_knob_init_fails_and_bad_values),
        cmocka_unit_test(test_invalid_handles),
        cmocka_unit_test(test_extension_function_and_translation),
        cmocka_unit_test(test_loader_refuses_incomplete_driver),
    };
    return cmocka_run_group_tests_name(intercepting() ? "ze_loader (ZE_ENABLE_LOADER_INTERCEPT=1)"
                                                      : "ze_loader (direct)",
                                       tests, group_setup, group_teardown);
}

/* Runs the suite once per loader mode, each in a fresh process; fails if either does. */
static int run_modes(void)
{
    static const char *const env[] = {"ZES_ENABLE_SYSMAN=1", NULL};
    return zt_run_modes(self_exe, "test_ze_loader", "GZT_SUITE", env, driver_path);
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
    if (getenv("GZT_SUITE") == NULL)
        return run_modes();
    return run_suite();
}
