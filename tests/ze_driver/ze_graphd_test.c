/*
 * A Level Zero driver for tests (libze_graphd_test.so): devices backed by host memory, loaded by
 * the real loader through ZE_ENABLE_ALT_DRIVERS. ze_graphd_test.h states the IPC contract;
 * README.md lists what is implemented, what is faked and the GRAPHD_ZE_TEST_* knobs.
 *
 * The loader (1.8.12) accepts a driver only if it exports zeGetGlobalProcAddrTable with pfnInit
 * set, every non-Exp ze/zet/zes Get...ProcAddrTable, and zetGetTracerExpProcAddrTable, the one
 * Exp table whose absence it does not forgive: 46 exports. Entries left NULL answer
 * ZE_RESULT_ERROR_UNSUPPORTED_FEATURE when the loader passes calls through, and
 * ZE_RESULT_ERROR_UNINITIALIZED when it intercepts. Only the table getters are exported; every
 * entry point is static so nothing here interposes on the loader's own ze* symbols.
 *
 * Handles are pointers to objects kept in one registry; a handle is checked by looking it up
 * there, never by reading through it, so a stale or foreign handle (say, a loader handle passed
 * untranslated to an extension function) answers ZE_RESULT_ERROR_INVALID_NULL_HANDLE.
 * One mutex guards all state; host waits on events sleep without it.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <level_zero/ze_api.h>
#include <level_zero/ze_ddi.h>
#include <level_zero/zes_api.h>
#include <level_zero/zes_ddi.h>
#include <level_zero/zet_api.h>
#include <level_zero/zet_ddi.h>

#include "ze_graphd_test.h"

#define MAX_DEVICES 8
#define PAGE 4096u
#define MAX_FILL_PATTERN 128u
#define N_ENGINES 3
#define API_VERSION_DEFAULT ZE_MAKE_VERSION(1, 6)

/* ---- objects and the handle registry ------------------------------------------------------- */

typedef enum {
    K_DRIVER = 1,
    K_DEVICE,
    K_CONTEXT,
    K_QUEUE,
    K_LIST,
    K_POOL,
    K_EVENT,
    K_MEMMOD,
    K_ENGINE,
} kind_t;

typedef struct obj {
    struct obj *next;
    kind_t kind;
} obj_t;

typedef struct device device_t;

typedef struct {
    obj_t o;
    device_t *dev;
} memmod_t;

typedef struct {
    obj_t o;
    device_t *dev;
    zes_engine_group_t group;
} engine_t;

struct device {
    obj_t o;
    uint32_t index;
    uint64_t mem_size;
    uint64_t mem_used;
    uint64_t active_ns[2]; /* per queue group: 0 compute, 1 copy */
    memmod_t memmod;
    engine_t engines[N_ENGINES];
};

typedef struct {
    obj_t o;
} driver_t;

typedef struct {
    obj_t o;
    unsigned children; /* allocations, pools, queues and lists made in it */
} context_t;

typedef struct {
    obj_t o;
    context_t *ctx;
    device_t *dev;
    uint32_t ordinal;
} queue_t;

typedef struct {
    obj_t o;
    context_t *ctx;
    uint32_t count;
    ze_event_pool_flags_t flags;
    bool imported;
    int fd;                   /* owner: the memfd; imported: -1 (the importer owns its fd) */
    _Atomic uint32_t *states; /* one word per event, in the shared mapping */
    size_t map_len;
    unsigned events; /* live events made from this pool in this process */
    int ipc_fds[8];  /* fds owned by outstanding IPC handles */
} pool_t;

typedef struct {
    obj_t o;
    pool_t *pool;
    uint32_t index;
} event_t;

typedef enum { C_COPY, C_FILL, C_BARRIER, C_SIGNAL, C_WAIT, C_RESET } op_t;

typedef struct {
    op_t op;
    void *dst;
    const void *src;
    size_t size;
    uint8_t pattern[MAX_FILL_PATTERN];
    size_t pattern_size;
    event_t *event; /* C_SIGNAL, C_WAIT, C_RESET */
} cmd_t;

typedef struct {
    obj_t o;
    context_t *ctx;
    device_t *dev;
    uint32_t ordinal;
    bool immediate;
    bool closed;
    cmd_t *cmds;
    size_t n, cap;
} list_t;

typedef struct alloc {
    struct alloc *next;
    context_t *ctx;
    device_t *dev; /* NULL for host allocations */
    ze_memory_type_t type;
    bool imported;
    char *base;
    size_t size;    /* what the caller asked for */
    size_t charged; /* page-rounded bytes counted against dev */
    size_t map_len;
    int fd; /* owner: the memfd; imported: -1 */
    uint64_t id;
    int ipc_fds[8];
} alloc_t;

/* ---- configuration (GRAPHD_ZE_TEST_*) ------------------------------------------------------- */

typedef struct {
    bool bad;           /* a knob did not parse: zeInit fails */
    unsigned devices;   /* GRAPHD_ZE_TEST_DEVICES */
    uint64_t mem_bytes; /* GRAPHD_ZE_TEST_MEM_MB */
    long fail_alloc_after;
    long lost_after;
    bool no_ipc;
    bool no_event_ipc; /* GRAPHD_ZE_TEST_NO_EVENT_IPC: memory IPC only, no event-pool IPC */
    bool no_sysman;
    bool init_fail;
    long hang_ms;
    ze_api_version_t api_version;
    bool sysman_enabled; /* ZES_ENABLE_SYSMAN=1 at zeInit */
    long dirty_byte;     /* GRAPHD_ZE_TEST_DIRTY_ALLOC: fresh device memory holds it; -1: zeros */
    char free_log[256];  /* GRAPHD_ZE_TEST_FREE_LOG: where device frees are recorded; "": none */
} config_t;

static struct {
    pthread_mutex_t lock;
    pthread_once_t cfg_once;
    config_t cfg;
    bool initialized;
    driver_t driver;
    device_t devices[MAX_DEVICES];
    obj_t *objs; /* every live handle */
    alloc_t *allocs;
    uint64_t next_alloc_id;
    long device_allocs; /* successful device allocations, for fail_alloc_after */
    long calls;         /* counted calls, for lost_after */
    bool lost;
} g = {
    .lock = PTHREAD_MUTEX_INITIALIZER,
    .cfg_once = PTHREAD_ONCE_INIT,
    .next_alloc_id = 1,
};

static bool knob_long(const char *name, long min, long max, long def, long *out)
{
    const char *s = getenv(name);
    *out = def;
    if (s == NULL || *s == '\0')
        return true;
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min || v > max) {
        fprintf(stderr, "libze_graphd_test: %s=%s is not an integer in [%ld, %ld]\n", name, s, min,
                max);
        return false;
    }
    *out = v;
    return true;
}

static bool knob_flag(const char *name)
{
    const char *s = getenv(name);
    return s != NULL && strcmp(s, "1") == 0;
}

static void cfg_load(void)
{
    config_t *c = &g.cfg;
    long devices, mem_mb, major = 1, minor = 6;
    bool ok = knob_long("GRAPHD_ZE_TEST_DEVICES", 0, MAX_DEVICES, 2, &devices);
    ok &= knob_long("GRAPHD_ZE_TEST_MEM_MB", 1, 1 << 20, 256, &mem_mb);
    ok &= knob_long("GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER", -1, LONG_MAX, -1, &c->fail_alloc_after);
    ok &= knob_long("GRAPHD_ZE_TEST_DEVICE_LOST_AFTER", -1, LONG_MAX, -1, &c->lost_after);
    ok &= knob_long("GRAPHD_ZE_TEST_HANG_MS", 1, 3600000, 10000, &c->hang_ms);
    ok &= knob_long("GRAPHD_ZE_TEST_DIRTY_ALLOC", -1, 255, -1, &c->dirty_byte);
    const char *log = getenv("GRAPHD_ZE_TEST_FREE_LOG");
    if (log != NULL && strlen(log) >= sizeof c->free_log) {
        fprintf(stderr, "libze_graphd_test: GRAPHD_ZE_TEST_FREE_LOG is longer than %zu bytes\n",
                sizeof c->free_log - 1);
        ok = false;
    } else if (log != NULL) {
        snprintf(c->free_log, sizeof c->free_log, "%s", log);
    }
    const char *v = getenv("GRAPHD_ZE_TEST_API_VERSION");
    if (v != NULL && *v != '\0') {
        char extra;
        if (sscanf(v, "%ld.%ld%c", &major, &minor, &extra) != 2 || major != 1 || minor < 0 ||
            minor > 0xffff) {
            fprintf(stderr, "libze_graphd_test: GRAPHD_ZE_TEST_API_VERSION=%s is not 1.<minor>\n",
                    v);
            ok = false;
            major = 1, minor = 6;
        }
    }
    c->bad = !ok;
    c->devices = (unsigned)devices;
    c->mem_bytes = (uint64_t)mem_mb << 20;
    c->no_ipc = knob_flag("GRAPHD_ZE_TEST_NO_IPC");
    c->no_event_ipc = knob_flag("GRAPHD_ZE_TEST_NO_EVENT_IPC");
    c->no_sysman = knob_flag("GRAPHD_ZE_TEST_NO_SYSMAN");
    c->init_fail = knob_flag("GRAPHD_ZE_TEST_INIT_FAIL");
    c->api_version = (ze_api_version_t)ZE_MAKE_VERSION(major, minor);
    c->sysman_enabled = knob_flag("ZES_ENABLE_SYSMAN");
}

static const config_t *cfg(void)
{
    pthread_once(&g.cfg_once, cfg_load);
    return &g.cfg;
}

/* ---- helpers (called with g.lock held unless they say otherwise) ------------------------------
 */

static void reg_add(obj_t *o, kind_t kind)
{
    o->kind = kind;
    o->next = g.objs;
    g.objs = o;
}

static void reg_del(obj_t *o)
{
    for (obj_t **p = &g.objs; *p != NULL; p = &(*p)->next) {
        if (*p == o) {
            *p = o->next;
            return;
        }
    }
}

/* The object behind handle h if it is a live object of that kind, else NULL. */
static void *lookup(const void *h, kind_t kind)
{
    for (obj_t *o = g.objs; o != NULL; o = o->next) {
        if ((const void *)o == h)
            return o->kind == kind ? o : NULL;
    }
    return NULL;
}

static ze_result_t ready(void)
{
    return g.initialized ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_UNINITIALIZED;
}

/* A call that does device work: counts towards GRAPHD_ZE_TEST_DEVICE_LOST_AFTER. */
static ze_result_t device_call(void)
{
    if (g.lost)
        return ZE_RESULT_ERROR_DEVICE_LOST;
    if (g.cfg.lost_after >= 0 && g.calls >= g.cfg.lost_after) {
        g.lost = true;
        return ZE_RESULT_ERROR_DEVICE_LOST;
    }
    g.calls++;
    return ZE_RESULT_SUCCESS;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static alloc_t *alloc_at(const void *ptr) /* the allocation whose range holds ptr */
{
    for (alloc_t *a = g.allocs; a != NULL; a = a->next) {
        if ((const char *)ptr >= a->base && (const char *)ptr < a->base + a->size)
            return a;
    }
    return NULL;
}

static alloc_t *alloc_based(const void *ptr, const context_t *ctx)
{
    for (alloc_t *a = g.allocs; a != NULL; a = a->next) {
        if (a->base == ptr && a->ctx == ctx)
            return a;
    }
    return NULL;
}

static void close_fds(int *fds, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (fds[i] >= 0)
            close(fds[i]);
        fds[i] = -1;
    }
}

static bool keep_fd(int *fds, size_t n, int fd)
{
    for (size_t i = 0; i < n; i++) {
        if (fds[i] < 0) {
            fds[i] = fd;
            return true;
        }
    }
    return false;
}

static bool drop_fd(int *fds, size_t n, int fd)
{
    for (size_t i = 0; i < n; i++) {
        if (fds[i] == fd && fd >= 0) {
            close(fd);
            fds[i] = -1;
            return true;
        }
    }
    return false;
}

#define NFDS(arr) (sizeof(arr) / sizeof((arr)[0]))

static long futex(_Atomic uint32_t *addr, int op, uint32_t val, const struct timespec *ts)
{
    /* Not FUTEX_PRIVATE: the word may be shared with another process through the pool's memfd. */
    return syscall(SYS_futex, (uint32_t *)addr, op, val, ts, NULL, 0);
}

/* Waits until *state is non-zero or timeout_ns passes; called without g.lock. */
static bool wait_state(_Atomic uint32_t *state, uint64_t timeout_ns)
{
    uint64_t deadline = timeout_ns == UINT64_MAX ? UINT64_MAX : now_ns() + timeout_ns;
    for (;;) {
        if (atomic_load(state) != 0)
            return true;
        uint64_t now = now_ns();
        if (now >= deadline)
            return false;
        uint64_t left = deadline - now;
        if (left > 100000000u)
            left = 100000000u; /* re-check at least every 100 ms */
        struct timespec ts = {.tv_sec = 0, .tv_nsec = (long)left};
        futex(state, FUTEX_WAIT, 0, &ts);
    }
}

static void set_state(_Atomic uint32_t *state, uint32_t v)
{
    atomic_store(state, v);
    if (v != 0)
        futex(state, FUTEX_WAKE, INT_MAX, NULL);
}

/* Maps len bytes of fd at an address aligned to align (a power of two, or 0). */
static void *map_aligned(int fd, size_t len, size_t align)
{
    if (align <= PAGE)
        return mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    size_t span = len + align;
    char *res = mmap(NULL, span, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (res == MAP_FAILED)
        return MAP_FAILED;
    char *at = (char *)(((uintptr_t)res + align - 1) & ~(uintptr_t)(align - 1));
    void *m = mmap(at, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    if (m == MAP_FAILED) {
        munmap(res, span);
        return MAP_FAILED;
    }
    if (at > res)
        munmap(res, (size_t)(at - res));
    if (at + len < res + span)
        munmap(at + len, (size_t)(res + span - (at + len)));
    return at;
}

static size_t round_page(size_t n)
{
    return (n + PAGE - 1) & ~(size_t)(PAGE - 1);
}

#define LOCKED(expr)                                                                               \
    do {                                                                                           \
        pthread_mutex_lock(&g.lock);                                                               \
        ze_result_t r_ = (expr);                                                                   \
        pthread_mutex_unlock(&g.lock);                                                             \
        return r_;                                                                                 \
    } while (0)

/* ---- global, driver, device ----------------------------------------------------------------- */

static ze_result_t init_locked(ze_init_flags_t flags)
{
    const config_t *c = cfg();
    if (c->bad)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (c->init_fail)
        return ZE_RESULT_ERROR_UNINITIALIZED;
    if (flags & ~(ze_init_flags_t)(ZE_INIT_FLAG_GPU_ONLY | ZE_INIT_FLAG_VPU_ONLY))
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    if ((flags & ZE_INIT_FLAG_VPU_ONLY) && !(flags & ZE_INIT_FLAG_GPU_ONLY))
        return ZE_RESULT_ERROR_UNINITIALIZED; /* GPUs only here */
    if (g.initialized)
        return ZE_RESULT_SUCCESS;
    reg_add(&g.driver.o, K_DRIVER);
    for (unsigned i = 0; i < c->devices; i++) {
        device_t *d = &g.devices[i];
        memset(d, 0, sizeof(*d));
        d->index = i;
        d->mem_size = c->mem_bytes;
        reg_add(&d->o, K_DEVICE);
        d->memmod.dev = d;
        reg_add(&d->memmod.o, K_MEMMOD);
        static const zes_engine_group_t groups[N_ENGINES] = {
            ZES_ENGINE_GROUP_ALL, ZES_ENGINE_GROUP_COMPUTE_ALL, ZES_ENGINE_GROUP_COPY_ALL};
        for (unsigned e = 0; e < N_ENGINES; e++) {
            d->engines[e].dev = d;
            d->engines[e].group = groups[e];
            reg_add(&d->engines[e].o, K_ENGINE);
        }
    }
    g.initialized = true;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_init(ze_init_flags_t flags)
{
    LOCKED(init_locked(flags));
}

static ze_result_t driver_get(uint32_t *pCount, ze_driver_handle_t *phDrivers)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (pCount == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*pCount == 0 || phDrivers == NULL) {
        *pCount = 1;
        return ZE_RESULT_SUCCESS;
    }
    phDrivers[0] = (ze_driver_handle_t)&g.driver;
    *pCount = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_driver_get(uint32_t *pCount, ze_driver_handle_t *phDrivers)
{
    LOCKED(driver_get(pCount, phDrivers));
}

static ze_result_t check_driver(ze_driver_handle_t h)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    return lookup(h, K_DRIVER) ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t driver_api_version(ze_driver_handle_t h, ze_api_version_t *version)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (version == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *version = g.cfg.api_version;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_driver_api_version(ze_driver_handle_t h, ze_api_version_t *v)
{
    LOCKED(driver_api_version(h, v));
}

static ze_result_t driver_properties(ze_driver_handle_t h, ze_driver_properties_t *p)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (p == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    memset(p->uuid.id, 0, sizeof(p->uuid.id));
    memcpy(p->uuid.id, "graphd-ze-test", 14);
    p->driverVersion = 1;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_driver_properties(ze_driver_handle_t h, ze_driver_properties_t *p)
{
    LOCKED(driver_properties(h, p));
}

static ze_result_t driver_ipc_properties(ze_driver_handle_t h, ze_driver_ipc_properties_t *p)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (p == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    p->flags = g.cfg.no_ipc ? 0 : ZE_IPC_PROPERTY_FLAG_MEMORY;
    if (!g.cfg.no_ipc && !g.cfg.no_event_ipc)
        p->flags |= ZE_IPC_PROPERTY_FLAG_EVENT_POOL;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_driver_ipc_properties(ze_driver_handle_t h,
                                                        ze_driver_ipc_properties_t *p)
{
    LOCKED(driver_ipc_properties(h, p));
}

static const char *const extension_names[] = {"ZEX_graphd_test_driver"};

static ze_result_t driver_ext_properties(ze_driver_handle_t h, uint32_t *pCount,
                                         ze_driver_extension_properties_t *p)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (pCount == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    uint32_t n = sizeof(extension_names) / sizeof(extension_names[0]);
    if (*pCount == 0 || p == NULL) {
        *pCount = n;
        return ZE_RESULT_SUCCESS;
    }
    if (*pCount > n)
        *pCount = n;
    for (uint32_t i = 0; i < *pCount; i++) {
        snprintf(p[i].name, sizeof(p[i].name), "%s", extension_names[i]);
        p[i].version = ZE_MAKE_VERSION(1, 0);
    }
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_driver_ext_properties(ze_driver_handle_t h, uint32_t *pCount,
                                                        ze_driver_extension_properties_t *p)
{
    LOCKED(driver_ext_properties(h, pCount, p));
}

static ze_result_t device_get(ze_driver_handle_t h, uint32_t *pCount, ze_device_handle_t *ph)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (pCount == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    uint32_t n = g.cfg.devices;
    if (*pCount == 0 || ph == NULL) {
        *pCount = n;
        return ZE_RESULT_SUCCESS;
    }
    if (*pCount > n)
        *pCount = n;
    for (uint32_t i = 0; i < *pCount; i++)
        ph[i] = (ze_device_handle_t)&g.devices[i];
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_device_get(ze_driver_handle_t h, uint32_t *pCount,
                                             ze_device_handle_t *ph)
{
    LOCKED(device_get(h, pCount, ph));
}

static ze_result_t check_device(const void *h, device_t **out)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    *out = lookup(h, K_DEVICE);
    return *out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t ZE_APICALL drv_device_sub_devices(ze_device_handle_t h, uint32_t *pCount,
                                                     ze_device_handle_t *ph)
{
    (void)ph;
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && pCount == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS)
        *pCount = 0;
    pthread_mutex_unlock(&g.lock);
    return r;
}

static void fill_device_properties(const device_t *d, ze_device_properties_t *p)
{
    p->type = ZE_DEVICE_TYPE_GPU;
    p->vendorId = 0x8086;
    p->deviceId = 0x0bd5; /* a Data Center GPU Max id; nothing depends on it */
    p->flags = 0;
    p->subdeviceId = 0;
    p->coreClockRate = 1600;
    p->maxMemAllocSize = d->mem_size;
    p->maxHardwareContexts = 64;
    p->maxCommandQueuePriority = 0;
    p->numThreadsPerEU = 8;
    p->physicalEUSimdWidth = 16;
    p->numEUsPerSubslice = 8;
    p->numSubslicesPerSlice = 4;
    p->numSlices = 2 + d->index; /* compute units differ per device: 64, 96, ... */
    p->timerResolution = 1;
    p->timestampValidBits = 64;
    p->kernelTimestampValidBits = 32;
    memset(p->uuid.id, 0, sizeof(p->uuid.id));
    memcpy(p->uuid.id, "gdzetest", 8);
    p->uuid.id[ZE_MAX_DEVICE_UUID_SIZE - 1] = (uint8_t)d->index;
    snprintf(p->name, sizeof(p->name), "graphd test XPU %u", d->index);
}

static ze_result_t ZE_APICALL drv_device_properties(ze_device_handle_t h, ze_device_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && p == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS)
        fill_device_properties(d, p);
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL drv_device_compute_properties(ze_device_handle_t h,
                                                            ze_device_compute_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && p == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS) {
        p->maxTotalGroupSize = 1024;
        p->maxGroupSizeX = p->maxGroupSizeY = p->maxGroupSizeZ = 1024;
        p->maxGroupCountX = p->maxGroupCountY = p->maxGroupCountZ = UINT32_MAX;
        p->maxSharedLocalMemory = 128 * 1024;
        p->numSubGroupSizes = 2;
        memset(p->subGroupSizes, 0, sizeof(p->subGroupSizes));
        p->subGroupSizes[0] = 16;
        p->subGroupSizes[1] = 32;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL drv_device_memory_properties(ze_device_handle_t h, uint32_t *pCount,
                                                           ze_device_memory_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && pCount == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS) {
        if (*pCount > 0 && p != NULL) {
            p[0].flags = 0;
            p[0].maxClockRate = 3200;
            p[0].maxBusWidth = 4096;
            p[0].totalSize = d->mem_size;
            snprintf(p[0].name, sizeof(p[0].name), "HBM");
        }
        *pCount = 1;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL drv_device_queue_groups(ze_device_handle_t h, uint32_t *pCount,
                                                      ze_command_queue_group_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && pCount == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS) {
        uint32_t n = 2;
        if (*pCount > 0 && p != NULL) {
            if (*pCount > n)
                *pCount = n;
            for (uint32_t i = 0; i < *pCount; i++) {
                p[i].flags = ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY;
                if (i == 0)
                    p[i].flags |= ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COMPUTE;
                p[i].maxMemoryFillPatternSize = MAX_FILL_PATTERN;
                p[i].numQueues = 1;
            }
        } else {
            *pCount = n;
        }
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL drv_device_status(ze_device_handle_t h)
{
    pthread_mutex_lock(&g.lock);
    device_t *d;
    ze_result_t r = check_device(h, &d);
    if (r == ZE_RESULT_SUCCESS && g.lost)
        r = ZE_RESULT_ERROR_DEVICE_LOST;
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- contexts ---------------------------------------------------------------------------------
 */

static ze_result_t check_context(const void *h, context_t **out)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    *out = lookup(h, K_CONTEXT);
    return *out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t context_create(ze_driver_handle_t h, const ze_context_desc_t *desc,
                                  ze_context_handle_t *ph)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (desc == NULL || ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    context_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    reg_add(&c->o, K_CONTEXT);
    *ph = (ze_context_handle_t)c;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_context_create(ze_driver_handle_t h, const ze_context_desc_t *d,
                                                 ze_context_handle_t *ph)
{
    LOCKED(context_create(h, d, ph));
}

static ze_result_t ZE_APICALL drv_context_create_ex(ze_driver_handle_t h,
                                                    const ze_context_desc_t *d, uint32_t n,
                                                    ze_device_handle_t *devs,
                                                    ze_context_handle_t *ph)
{
    pthread_mutex_lock(&g.lock);
    ze_result_t r = ZE_RESULT_SUCCESS;
    for (uint32_t i = 0; i < n && r == ZE_RESULT_SUCCESS; i++) {
        if (devs == NULL || !lookup(devs[i], K_DEVICE))
            r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (r == ZE_RESULT_SUCCESS)
        r = context_create(h, d, ph);
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t context_destroy(ze_context_handle_t h)
{
    context_t *c;
    ze_result_t r = check_context(h, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (c->children > 0)
        return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    reg_del(&c->o);
    free(c);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_context_destroy(ze_context_handle_t h)
{
    LOCKED(context_destroy(h));
}

static ze_result_t ZE_APICALL drv_context_status(ze_context_handle_t h)
{
    pthread_mutex_lock(&g.lock);
    context_t *c;
    ze_result_t r = check_context(h, &c);
    if (r == ZE_RESULT_SUCCESS && g.lost)
        r = ZE_RESULT_ERROR_DEVICE_LOST;
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- memory -----------------------------------------------------------------------------------
 */

static ze_result_t mem_alloc(ze_context_handle_t hc, ze_device_handle_t hd, ze_memory_type_t type,
                             size_t size, size_t alignment, void **pptr)
{
    context_t *c;
    device_t *d = NULL;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (type != ZE_MEMORY_TYPE_HOST || hd != NULL) {
        if (!(d = lookup(hd, K_DEVICE)))
            return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (pptr == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    if (size == 0)
        return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    if (alignment & (alignment - 1) || alignment > (64u << 20))
        return ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT;
    size_t len = round_page(size);
    if (len < size)
        return ZE_RESULT_ERROR_UNSUPPORTED_SIZE;
    bool charge = type != ZE_MEMORY_TYPE_HOST;
    if (charge) {
        if (size > d->mem_size)
            return ZE_RESULT_ERROR_UNSUPPORTED_SIZE; /* over maxMemAllocSize */
        if (g.cfg.fail_alloc_after >= 0 && g.device_allocs >= g.cfg.fail_alloc_after)
            return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
        if (len > d->mem_size - d->mem_used)
            return ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY;
    }
    alloc_t *a = calloc(1, sizeof(*a));
    if (a == NULL)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    int fd = memfd_create("ze-graphd-test", MFD_CLOEXEC);
    if (fd < 0 || ftruncate(fd, (off_t)len) != 0) {
        if (fd >= 0)
            close(fd);
        free(a);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    void *m = map_aligned(fd, len, alignment);
    if (m == MAP_FAILED) {
        close(fd);
        free(a);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    if (charge && g.cfg.dirty_byte >= 0) /* what a previous user of the memory left there */
        memset(m, (int)g.cfg.dirty_byte, len);
    a->ctx = c;
    a->dev = d;
    a->type = type;
    a->base = m;
    a->size = size;
    a->map_len = len;
    a->charged = charge ? len : 0;
    a->fd = fd;
    a->id = g.next_alloc_id++;
    for (size_t i = 0; i < NFDS(a->ipc_fds); i++)
        a->ipc_fds[i] = -1;
    a->next = g.allocs;
    g.allocs = a;
    c->children++;
    if (charge) {
        d->mem_used += len;
        g.device_allocs++;
    }
    *pptr = m;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_alloc_device(ze_context_handle_t hc,
                                                   const ze_device_mem_alloc_desc_t *desc,
                                                   size_t size, size_t alignment,
                                                   ze_device_handle_t hd, void **pptr)
{
    if (desc == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    LOCKED(mem_alloc(hc, hd, ZE_MEMORY_TYPE_DEVICE, size, alignment, pptr));
}

static ze_result_t ZE_APICALL drv_mem_alloc_host(ze_context_handle_t hc,
                                                 const ze_host_mem_alloc_desc_t *desc, size_t size,
                                                 size_t alignment, void **pptr)
{
    if (desc == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    LOCKED(mem_alloc(hc, NULL, ZE_MEMORY_TYPE_HOST, size, alignment, pptr));
}

static ze_result_t ZE_APICALL drv_mem_alloc_shared(ze_context_handle_t hc,
                                                   const ze_device_mem_alloc_desc_t *ddesc,
                                                   const ze_host_mem_alloc_desc_t *hdesc,
                                                   size_t size, size_t alignment,
                                                   ze_device_handle_t hd, void **pptr)
{
    if (ddesc == NULL || hdesc == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    /* Shared memory without a device lives on the host, like Intel's. */
    LOCKED(mem_alloc(hc, hd, hd == NULL ? ZE_MEMORY_TYPE_HOST : ZE_MEMORY_TYPE_SHARED, size,
                     alignment, pptr));
}

static void alloc_unlink(alloc_t *a)
{
    for (alloc_t **p = &g.allocs; *p != NULL; p = &(*p)->next) {
        if (*p == a) {
            *p = a->next;
            break;
        }
    }
    munmap(a->base, a->map_len);
    if (a->fd >= 0)
        close(a->fd);
    close_fds(a->ipc_fds, NFDS(a->ipc_fds));
    if (a->dev != NULL)
        a->dev->mem_used -= a->charged;
    a->ctx->children--;
    free(a);
}

/* GRAPHD_ZE_TEST_FREE_LOG: one line per device allocation freed, "free <device> <size> <hex of
 * its first 16 bytes>", so a test can see what the memory held when its owner freed it. */
static void log_free(const alloc_t *a)
{
    FILE *f = fopen(g.cfg.free_log, "ae");
    if (f == NULL)
        return;
    fprintf(f, "free %u %zu ", (unsigned)(a->dev - g.devices), a->size);
    for (size_t i = 0; i < 16 && i < a->size; i++)
        fprintf(f, "%02x", (unsigned char)a->base[i]);
    fprintf(f, "\n");
    fclose(f);
}

static ze_result_t mem_free(ze_context_handle_t hc, void *ptr)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ptr == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    alloc_t *a = alloc_based(ptr, c);
    if (a == NULL || a->imported)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* not an allocation of c: freed twice, or never */
    if (a->dev != NULL && g.cfg.free_log[0])
        log_free(a);
    alloc_unlink(a);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_free(ze_context_handle_t hc, void *ptr)
{
    LOCKED(mem_free(hc, ptr));
}

static ze_result_t mem_alloc_properties(ze_context_handle_t hc, const void *ptr,
                                        ze_memory_allocation_properties_t *p,
                                        ze_device_handle_t *phDevice)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ptr == NULL || p == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    alloc_t *a = alloc_at(ptr);
    if (a != NULL && a->ctx != c)
        a = NULL;
    p->type = a ? a->type : ZE_MEMORY_TYPE_UNKNOWN;
    p->id = a ? a->id : 0;
    p->pageSize = a ? PAGE : 0;
    if (phDevice != NULL)
        *phDevice = a && a->dev ? (ze_device_handle_t)a->dev : NULL;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_alloc_properties(ze_context_handle_t hc, const void *ptr,
                                                       ze_memory_allocation_properties_t *p,
                                                       ze_device_handle_t *phDevice)
{
    LOCKED(mem_alloc_properties(hc, ptr, p, phDevice));
}

static ze_result_t mem_address_range(ze_context_handle_t hc, const void *ptr, void **pBase,
                                     size_t *pSize)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ptr == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    alloc_t *a = alloc_at(ptr);
    if (a == NULL || a->ctx != c)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if (pBase != NULL)
        *pBase = a->base;
    if (pSize != NULL)
        *pSize = a->size;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_address_range(ze_context_handle_t hc, const void *ptr,
                                                    void **pBase, size_t *pSize)
{
    LOCKED(mem_address_range(hc, ptr, pBase, pSize));
}

/* ---- memory IPC -------------------------------------------------------------------------------
 */

static ze_result_t mem_get_ipc(ze_context_handle_t hc, const void *ptr, ze_ipc_mem_handle_t *out)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ptr == NULL || out == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (g.cfg.no_ipc)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    alloc_t *a = alloc_based(ptr, c);
    if (a == NULL || a->imported)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* only the base of an allocation made here */
    int fd = fcntl(a->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    if (!keep_fd(a->ipc_fds, NFDS(a->ipc_fds), fd)) {
        close(fd);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY; /* too many outstanding handles: put some */
    }
    gzt_ipc_handle_t h = {
        .fd = fd,
        .magic = GZT_IPC_MAGIC_MEM,
        .size = a->size,
        .device = a->dev ? a->dev->index : UINT32_MAX,
        .id = a->id,
    };
    memset(out->data, 0, sizeof(out->data));
    memcpy(out->data, &h, sizeof(h));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_get_ipc(ze_context_handle_t hc, const void *ptr,
                                              ze_ipc_mem_handle_t *out)
{
    LOCKED(mem_get_ipc(hc, ptr, out));
}

static ze_result_t mem_open_ipc(ze_context_handle_t hc, ze_device_handle_t hd,
                                ze_ipc_mem_handle_t handle, ze_ipc_memory_flags_t flags,
                                void **pptr)
{
    context_t *c;
    device_t *d;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (!(d = lookup(hd, K_DEVICE)))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (pptr == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (flags &
        ~(ze_ipc_memory_flags_t)(ZE_IPC_MEMORY_FLAG_BIAS_CACHED | ZE_IPC_MEMORY_FLAG_BIAS_UNCACHED))
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    if (g.cfg.no_ipc)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    gzt_ipc_handle_t h;
    memcpy(&h, handle.data, sizeof(h));
    struct stat st;
    if (h.magic != GZT_IPC_MAGIC_MEM || h.size == 0 || fstat(h.fd, &st) != 0 ||
        (uint64_t)st.st_size < h.size)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* not our handle, or its fd is not open here */
    size_t len = round_page(h.size);
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, h.fd, 0);
    if (m == MAP_FAILED)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    alloc_t *a = calloc(1, sizeof(*a));
    if (a == NULL) {
        munmap(m, len);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    a->ctx = c;
    a->dev = d;
    a->type = ZE_MEMORY_TYPE_DEVICE;
    a->imported = true;
    a->base = m;
    a->size = h.size;
    a->map_len = len;
    a->fd = -1;
    a->id = g.next_alloc_id++;
    for (size_t i = 0; i < NFDS(a->ipc_fds); i++)
        a->ipc_fds[i] = -1;
    a->next = g.allocs;
    g.allocs = a;
    c->children++;
    *pptr = m;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_open_ipc(ze_context_handle_t hc, ze_device_handle_t hd,
                                               ze_ipc_mem_handle_t handle,
                                               ze_ipc_memory_flags_t flags, void **pptr)
{
    LOCKED(mem_open_ipc(hc, hd, handle, flags, pptr));
}

static ze_result_t mem_close_ipc(ze_context_handle_t hc, const void *ptr)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ptr == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    alloc_t *a = alloc_based(ptr, c);
    if (a == NULL || !a->imported)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    alloc_unlink(a);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_mem_close_ipc(ze_context_handle_t hc, const void *ptr)
{
    LOCKED(mem_close_ipc(hc, ptr));
}

/* Spec 1.6 calls, reachable through zeDriverGetExtensionFunctionAddress only. */
static ze_result_t mem_put_ipc(ze_context_handle_t hc, ze_ipc_mem_handle_t handle)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    gzt_ipc_handle_t h;
    memcpy(&h, handle.data, sizeof(h));
    if (h.magic != GZT_IPC_MAGIC_MEM)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (alloc_t *a = g.allocs; a != NULL; a = a->next) {
        if (a->ctx == c && a->id == h.id && drop_fd(a->ipc_fds, NFDS(a->ipc_fds), h.fd))
            return ZE_RESULT_SUCCESS;
    }
    return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* put twice, or not from this context */
}

static ze_result_t ZE_APICALL ext_mem_put_ipc(ze_context_handle_t hc, ze_ipc_mem_handle_t handle)
{
    LOCKED(mem_put_ipc(hc, handle));
}

static ze_result_t fd_from_ipc(ze_context_handle_t hc, ze_ipc_mem_handle_t handle, uint64_t *pfd)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (pfd == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    gzt_ipc_handle_t h;
    memcpy(&h, handle.data, sizeof(h));
    if (h.magic != GZT_IPC_MAGIC_MEM || h.fd < 0)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    *pfd = (uint64_t)h.fd;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL ext_fd_from_ipc(ze_context_handle_t hc, ze_ipc_mem_handle_t handle,
                                              uint64_t *pfd)
{
    LOCKED(fd_from_ipc(hc, handle, pfd));
}

static ze_result_t ipc_from_fd(ze_context_handle_t hc, uint64_t fd, ze_ipc_mem_handle_t *out)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (out == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    struct stat st;
    if (fd > INT_MAX || fstat((int)fd, &st) != 0 || st.st_size <= 0)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    gzt_ipc_handle_t h = {
        .fd = (int32_t)fd,
        .magic = GZT_IPC_MAGIC_MEM,
        .size = (uint64_t)st.st_size,
        .device = UINT32_MAX,
    };
    memset(out->data, 0, sizeof(out->data));
    memcpy(out->data, &h, sizeof(h));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL ext_ipc_from_fd(ze_context_handle_t hc, uint64_t fd,
                                              ze_ipc_mem_handle_t *out)
{
    LOCKED(ipc_from_fd(hc, fd, out));
}

static ze_result_t device_index(ze_device_handle_t hd, uint32_t *index)
{
    device_t *d;
    ze_result_t r = check_device(hd, &d);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (index == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    *index = d->index;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL ext_device_index(ze_device_handle_t hd, uint32_t *index)
{
    LOCKED(device_index(hd, index));
}

/* ---- event pools and events -------------------------------------------------------------------
 */

static ze_result_t check_pool(const void *h, pool_t **out)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    *out = lookup(h, K_POOL);
    return *out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t check_event(const void *h, event_t **out)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    *out = lookup(h, K_EVENT);
    return *out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static pool_t *pool_new(context_t *c, uint32_t count, ze_event_pool_flags_t flags, int fd,
                        bool imported)
{
    size_t len = round_page((size_t)count * sizeof(uint32_t));
    void *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED)
        return NULL;
    pool_t *p = calloc(1, sizeof(*p));
    if (p == NULL) {
        munmap(m, len);
        return NULL;
    }
    p->ctx = c;
    p->count = count;
    p->flags = flags;
    p->imported = imported;
    p->fd = imported ? -1 : fd;
    p->states = m;
    p->map_len = len;
    for (size_t i = 0; i < NFDS(p->ipc_fds); i++)
        p->ipc_fds[i] = -1;
    reg_add(&p->o, K_POOL);
    c->children++;
    return p;
}

static ze_result_t pool_create(ze_context_handle_t hc, const ze_event_pool_desc_t *desc,
                               uint32_t n_devices, ze_device_handle_t *devs,
                               ze_event_pool_handle_t *ph)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    for (uint32_t i = 0; i < n_devices; i++) {
        if (devs == NULL || !lookup(devs[i], K_DEVICE))
            return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (desc == NULL || ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->count == 0 || desc->count > (1u << 20))
        return ZE_RESULT_ERROR_INVALID_SIZE;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    int fd = memfd_create("ze-graphd-test-events", MFD_CLOEXEC);
    if (fd < 0)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    if (ftruncate(fd, (off_t)round_page((size_t)desc->count * sizeof(uint32_t))) != 0) {
        close(fd);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    pool_t *p = pool_new(c, desc->count, desc->flags, fd, false);
    if (p == NULL) {
        close(fd);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    *ph = (ze_event_pool_handle_t)p;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_pool_create(ze_context_handle_t hc,
                                              const ze_event_pool_desc_t *desc, uint32_t n_devices,
                                              ze_device_handle_t *devs, ze_event_pool_handle_t *ph)
{
    LOCKED(pool_create(hc, desc, n_devices, devs, ph));
}

static ze_result_t pool_destroy(ze_event_pool_handle_t h, bool imported)
{
    pool_t *p;
    ze_result_t r = check_pool(h, &p);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (p->imported != imported)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* destroy what you created, close what you open */
    if (p->events > 0)
        return ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE;
    reg_del(&p->o);
    munmap((void *)p->states, p->map_len);
    if (p->fd >= 0)
        close(p->fd);
    close_fds(p->ipc_fds, NFDS(p->ipc_fds));
    p->ctx->children--;
    free(p);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_pool_destroy(ze_event_pool_handle_t h)
{
    LOCKED(pool_destroy(h, false));
}

static ze_result_t ZE_APICALL drv_pool_close_ipc(ze_event_pool_handle_t h)
{
    LOCKED(pool_destroy(h, true));
}

static ze_result_t pool_get_ipc(ze_event_pool_handle_t h, ze_ipc_event_pool_handle_t *out)
{
    pool_t *p;
    ze_result_t r = check_pool(h, &p);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (out == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (g.cfg.no_ipc || g.cfg.no_event_ipc)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if (!(p->flags & ZE_EVENT_POOL_FLAG_IPC) || p->imported)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* made without ZE_EVENT_POOL_FLAG_IPC */
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    int fd = fcntl(p->fd, F_DUPFD_CLOEXEC, 0);
    if (fd < 0)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    if (!keep_fd(p->ipc_fds, NFDS(p->ipc_fds), fd)) {
        close(fd);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    gzt_ipc_handle_t ih = {
        .fd = fd, .magic = GZT_IPC_MAGIC_POOL, .size = p->count, .device = UINT32_MAX};
    memset(out->data, 0, sizeof(out->data));
    memcpy(out->data, &ih, sizeof(ih));
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_pool_get_ipc(ze_event_pool_handle_t h,
                                               ze_ipc_event_pool_handle_t *out)
{
    LOCKED(pool_get_ipc(h, out));
}

static ze_result_t pool_open_ipc(ze_context_handle_t hc, ze_ipc_event_pool_handle_t handle,
                                 ze_event_pool_handle_t *ph)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (g.cfg.no_ipc || g.cfg.no_event_ipc)
        return ZE_RESULT_ERROR_UNSUPPORTED_FEATURE;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    gzt_ipc_handle_t ih;
    memcpy(&ih, handle.data, sizeof(ih));
    struct stat st;
    if (ih.magic != GZT_IPC_MAGIC_POOL || ih.size == 0 || ih.size > (1u << 20) ||
        fstat(ih.fd, &st) != 0 || (uint64_t)st.st_size < ih.size * sizeof(uint32_t))
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    pool_t *p = pool_new(c, (uint32_t)ih.size, ZE_EVENT_POOL_FLAG_IPC, ih.fd, true);
    if (p == NULL)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    *ph = (ze_event_pool_handle_t)p;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_pool_open_ipc(ze_context_handle_t hc,
                                                ze_ipc_event_pool_handle_t handle,
                                                ze_event_pool_handle_t *ph)
{
    LOCKED(pool_open_ipc(hc, handle, ph));
}

static ze_result_t pool_put_ipc(ze_context_handle_t hc, ze_ipc_event_pool_handle_t handle)
{
    context_t *c;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    gzt_ipc_handle_t ih;
    memcpy(&ih, handle.data, sizeof(ih));
    if (ih.magic != GZT_IPC_MAGIC_POOL)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (obj_t *o = g.objs; o != NULL; o = o->next) {
        pool_t *p = (pool_t *)o;
        if (o->kind == K_POOL && p->ctx == c && drop_fd(p->ipc_fds, NFDS(p->ipc_fds), ih.fd))
            return ZE_RESULT_SUCCESS;
    }
    return ZE_RESULT_ERROR_INVALID_ARGUMENT;
}

static ze_result_t ZE_APICALL ext_pool_put_ipc(ze_context_handle_t hc,
                                               ze_ipc_event_pool_handle_t handle)
{
    LOCKED(pool_put_ipc(hc, handle));
}

static ze_result_t event_create(ze_event_pool_handle_t hp, const ze_event_desc_t *desc,
                                ze_event_handle_t *ph)
{
    pool_t *p;
    ze_result_t r = check_pool(hp, &p);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (desc == NULL || ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (desc->index >= p->count)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    for (obj_t *o = g.objs; o != NULL; o = o->next) {
        if (o->kind == K_EVENT && ((event_t *)o)->pool == p && ((event_t *)o)->index == desc->index)
            return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* that slot has an event already */
    }
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    event_t *e = calloc(1, sizeof(*e));
    if (e == NULL)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    e->pool = p;
    e->index = desc->index;
    /* A new event starts unsignalled; one opened through IPC keeps the shared state. */
    if (!p->imported)
        atomic_store(&p->states[e->index], 0);
    reg_add(&e->o, K_EVENT);
    p->events++;
    *ph = (ze_event_handle_t)e;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_event_create(ze_event_pool_handle_t hp,
                                               const ze_event_desc_t *desc, ze_event_handle_t *ph)
{
    LOCKED(event_create(hp, desc, ph));
}

static ze_result_t event_destroy(ze_event_handle_t h)
{
    event_t *e;
    ze_result_t r = check_event(h, &e);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    reg_del(&e->o);
    e->pool->events--;
    free(e);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_event_destroy(ze_event_handle_t h)
{
    LOCKED(event_destroy(h));
}

/* The state word of event h for a host operation (counted as device work). */
static ze_result_t event_state(ze_event_handle_t h, _Atomic uint32_t **state)
{
    pthread_mutex_lock(&g.lock);
    event_t *e;
    ze_result_t r = check_event(h, &e);
    if (r == ZE_RESULT_SUCCESS)
        r = device_call();
    if (r == ZE_RESULT_SUCCESS)
        *state = &e->pool->states[e->index];
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL drv_event_host_signal(ze_event_handle_t h)
{
    _Atomic uint32_t *s;
    ze_result_t r = event_state(h, &s);
    if (r == ZE_RESULT_SUCCESS)
        set_state(s, 1);
    return r;
}

static ze_result_t ZE_APICALL drv_event_host_reset(ze_event_handle_t h)
{
    _Atomic uint32_t *s;
    ze_result_t r = event_state(h, &s);
    if (r == ZE_RESULT_SUCCESS)
        set_state(s, 0);
    return r;
}

static ze_result_t ZE_APICALL drv_event_query(ze_event_handle_t h)
{
    _Atomic uint32_t *s;
    ze_result_t r = event_state(h, &s);
    if (r == ZE_RESULT_SUCCESS && atomic_load(s) == 0)
        r = ZE_RESULT_NOT_READY;
    return r;
}

/* Sleeps without the lock; the caller must not destroy the event meanwhile (as with any driver). */
static ze_result_t ZE_APICALL drv_event_host_sync(ze_event_handle_t h, uint64_t timeout_ns)
{
    _Atomic uint32_t *s;
    ze_result_t r = event_state(h, &s);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    return wait_state(s, timeout_ns) ? ZE_RESULT_SUCCESS : ZE_RESULT_NOT_READY;
}

/* ---- command queues and lists -----------------------------------------------------------------
 */

static ze_result_t check_queue_desc(device_t *d, const ze_command_queue_desc_t *desc)
{
    (void)d;
    if (desc->ordinal >= 2 || desc->index != 0)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* two groups of one queue each */
    if ((unsigned)desc->mode > ZE_COMMAND_QUEUE_MODE_ASYNCHRONOUS)
        return ZE_RESULT_ERROR_INVALID_ENUMERATION;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t queue_create(ze_context_handle_t hc, ze_device_handle_t hd,
                                const ze_command_queue_desc_t *desc, ze_command_queue_handle_t *ph)
{
    context_t *c;
    device_t *d;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (!(d = lookup(hd, K_DEVICE)))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (desc == NULL || ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if ((r = check_queue_desc(d, desc)) != ZE_RESULT_SUCCESS)
        return r;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    queue_t *q = calloc(1, sizeof(*q));
    if (q == NULL)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    q->ctx = c;
    q->dev = d;
    q->ordinal = desc->ordinal;
    reg_add(&q->o, K_QUEUE);
    c->children++;
    *ph = (ze_command_queue_handle_t)q;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_queue_create(ze_context_handle_t hc, ze_device_handle_t hd,
                                               const ze_command_queue_desc_t *desc,
                                               ze_command_queue_handle_t *ph)
{
    LOCKED(queue_create(hc, hd, desc, ph));
}

static ze_result_t queue_destroy(ze_command_queue_handle_t h)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    queue_t *q = lookup(h, K_QUEUE);
    if (q == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    reg_del(&q->o);
    q->ctx->children--;
    free(q);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_queue_destroy(ze_command_queue_handle_t h)
{
    LOCKED(queue_destroy(h));
}

static ze_result_t ZE_APICALL drv_queue_sync(ze_command_queue_handle_t h, uint64_t timeout)
{
    (void)timeout; /* execution is synchronous: nothing is ever pending */
    pthread_mutex_lock(&g.lock);
    ze_result_t r = ready();
    if (r == ZE_RESULT_SUCCESS && !lookup(h, K_QUEUE))
        r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (r == ZE_RESULT_SUCCESS && g.lost)
        r = ZE_RESULT_ERROR_DEVICE_LOST;
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* Runs cmds on the host. Called without g.lock: a wait may sleep until another process signals. */
static ze_result_t run_cmds(const cmd_t *cmds, size_t n, long hang_ms)
{
    for (size_t i = 0; i < n; i++) {
        const cmd_t *c = &cmds[i];
        _Atomic uint32_t *s = c->event ? &c->event->pool->states[c->event->index] : NULL;
        switch (c->op) {
        case C_COPY:
            memmove(c->dst, c->src, c->size);
            break;
        case C_FILL:
            for (size_t off = 0; off < c->size; off += c->pattern_size) {
                size_t k = c->size - off < c->pattern_size ? c->size - off : c->pattern_size;
                memcpy((char *)c->dst + off, c->pattern, k);
            }
            break;
        case C_BARRIER:
            atomic_thread_fence(memory_order_seq_cst);
            break;
        case C_SIGNAL:
            set_state(s, 1);
            break;
        case C_RESET:
            set_state(s, 0);
            break;
        case C_WAIT:
            if (!wait_state(s, (uint64_t)hang_ms * 1000000u))
                return ZE_RESULT_ERROR_DEVICE_LOST; /* a hang check would reset the engine */
            break;
        }
    }
    return ZE_RESULT_SUCCESS;
}

/* Checks under g.lock that every event the commands use is still alive. */
static ze_result_t cmds_valid(const list_t *l)
{
    for (size_t i = 0; i < l->n; i++) {
        if (l->cmds[i].event != NULL && !lookup(l->cmds[i].event, K_EVENT))
            return ZE_RESULT_ERROR_INVALID_NULL_HANDLE; /* destroyed after it was appended */
    }
    return ZE_RESULT_SUCCESS;
}

static void account(device_t *d, uint32_t ordinal, uint64_t t0)
{
    uint64_t dt = now_ns() - t0;
    pthread_mutex_lock(&g.lock);
    d->active_ns[ordinal] += dt > 0 ? dt : 1;
    pthread_mutex_unlock(&g.lock);
}

static ze_result_t ZE_APICALL drv_queue_execute(ze_command_queue_handle_t h, uint32_t n,
                                                ze_command_list_handle_t *lists,
                                                ze_fence_handle_t fence)
{
    pthread_mutex_lock(&g.lock);
    ze_result_t r = ready();
    queue_t *q = NULL;
    if (r == ZE_RESULT_SUCCESS && !(q = lookup(h, K_QUEUE)))
        r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (r == ZE_RESULT_SUCCESS && fence != NULL)
        r = ZE_RESULT_ERROR_UNSUPPORTED_FEATURE; /* no fences here */
    if (r == ZE_RESULT_SUCCESS && (lists == NULL || n == 0))
        r = lists == NULL ? ZE_RESULT_ERROR_INVALID_NULL_POINTER : ZE_RESULT_ERROR_INVALID_SIZE;
    for (uint32_t i = 0; r == ZE_RESULT_SUCCESS && i < n; i++) {
        list_t *l = lookup(lists[i], K_LIST);
        if (l == NULL)
            r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
        else if (l->immediate || !l->closed || l->dev != q->dev || l->ctx != q->ctx)
            r = ZE_RESULT_ERROR_INVALID_ARGUMENT;
        else if (l->ordinal != q->ordinal)
            r = ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE;
        else
            r = cmds_valid(l);
    }
    if (r == ZE_RESULT_SUCCESS)
        r = device_call();
    long hang_ms = g.cfg.hang_ms;
    pthread_mutex_unlock(&g.lock);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    uint64_t t0 = now_ns();
    for (uint32_t i = 0; i < n && r == ZE_RESULT_SUCCESS; i++) {
        const list_t *l = (const list_t *)lists[i];
        r = run_cmds(l->cmds, l->n, hang_ms);
    }
    account(q->dev, q->ordinal, t0);
    return r;
}

static ze_result_t list_create(ze_context_handle_t hc, ze_device_handle_t hd, uint32_t ordinal,
                               bool immediate, ze_command_list_handle_t *ph)
{
    context_t *c;
    device_t *d;
    ze_result_t r = check_context(hc, &c);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (!(d = lookup(hd, K_DEVICE)))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (ph == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ordinal >= 2)
        return ZE_RESULT_ERROR_INVALID_ARGUMENT;
    if ((r = device_call()) != ZE_RESULT_SUCCESS)
        return r;
    list_t *l = calloc(1, sizeof(*l));
    if (l == NULL)
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    l->ctx = c;
    l->dev = d;
    l->ordinal = ordinal;
    l->immediate = immediate;
    reg_add(&l->o, K_LIST);
    c->children++;
    *ph = (ze_command_list_handle_t)l;
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_list_create(ze_context_handle_t hc, ze_device_handle_t hd,
                                              const ze_command_list_desc_t *desc,
                                              ze_command_list_handle_t *ph)
{
    if (desc == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    LOCKED(list_create(hc, hd, desc->commandQueueGroupOrdinal, false, ph));
}

static ze_result_t ZE_APICALL drv_list_create_immediate(ze_context_handle_t hc,
                                                        ze_device_handle_t hd,
                                                        const ze_command_queue_desc_t *desc,
                                                        ze_command_list_handle_t *ph)
{
    if (desc == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    LOCKED(list_create(hc, hd, desc->ordinal, true, ph));
}

static ze_result_t check_list(const void *h, list_t **out)
{
    ze_result_t r = ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    *out = lookup(h, K_LIST);
    return *out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
}

static ze_result_t list_destroy(ze_command_list_handle_t h)
{
    list_t *l;
    ze_result_t r = check_list(h, &l);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    reg_del(&l->o);
    l->ctx->children--;
    free(l->cmds);
    free(l);
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_list_destroy(ze_command_list_handle_t h)
{
    LOCKED(list_destroy(h));
}

static ze_result_t list_close(ze_command_list_handle_t h, bool reset)
{
    list_t *l;
    ze_result_t r = check_list(h, &l);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (reset) {
        l->n = 0;
        l->closed = false;
    } else {
        if (l->immediate)
            return ZE_RESULT_ERROR_INVALID_ARGUMENT;
        l->closed = true;
    }
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL drv_list_close(ze_command_list_handle_t h)
{
    LOCKED(list_close(h, false));
}

static ze_result_t ZE_APICALL drv_list_reset(ze_command_list_handle_t h)
{
    LOCKED(list_close(h, true));
}

static ze_result_t push(list_t *l, const cmd_t *c)
{
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 16;
        cmd_t *p = realloc(l->cmds, cap * sizeof(*p));
        if (p == NULL)
            return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        l->cmds = p;
        l->cap = cap;
    }
    l->cmds[l->n++] = *c;
    return ZE_RESULT_SUCCESS;
}

/*
 * The common part of every append: waits, then op (if any), then the signal. A regular list
 * records them; an immediate list runs them at once, after releasing g.lock.
 */
static ze_result_t append(ze_command_list_handle_t h, const cmd_t *op, ze_event_handle_t signal,
                          uint32_t n_wait, ze_event_handle_t *waits)
{
    pthread_mutex_lock(&g.lock);
    list_t *l;
    ze_result_t r = check_list(h, &l);
    event_t *sig = NULL;
    if (r == ZE_RESULT_SUCCESS && l->closed)
        r = ZE_RESULT_ERROR_INVALID_ARGUMENT; /* closed: reset it before appending again */
    if (r == ZE_RESULT_SUCCESS && n_wait > 0 && waits == NULL)
        r = ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (r == ZE_RESULT_SUCCESS && signal != NULL && !(sig = lookup(signal, K_EVENT)))
        r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    for (uint32_t i = 0; r == ZE_RESULT_SUCCESS && i < n_wait; i++) {
        if (!lookup(waits[i], K_EVENT))
            r = ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    }
    if (r == ZE_RESULT_SUCCESS)
        r = device_call();
    if (r != ZE_RESULT_SUCCESS) {
        pthread_mutex_unlock(&g.lock);
        return r;
    }
    size_t n = n_wait + (op != NULL) + (sig != NULL);
    cmd_t local[8];
    cmd_t *cmds = n <= 8 ? local : calloc(n, sizeof(*cmds));
    if (cmds == NULL) {
        pthread_mutex_unlock(&g.lock);
        return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
    }
    size_t k = 0;
    for (uint32_t i = 0; i < n_wait; i++)
        cmds[k++] = (cmd_t){.op = C_WAIT, .event = (event_t *)waits[i]};
    if (op != NULL)
        cmds[k++] = *op;
    if (sig != NULL)
        cmds[k++] = (cmd_t){.op = C_SIGNAL, .event = sig};
    bool immediate = l->immediate;
    device_t *dev = l->dev;
    uint32_t ordinal = l->ordinal;
    long hang_ms = g.cfg.hang_ms;
    for (size_t i = 0; !immediate && i < k && r == ZE_RESULT_SUCCESS; i++)
        r = push(l, &cmds[i]);
    pthread_mutex_unlock(&g.lock);
    if (immediate) {
        uint64_t t0 = now_ns();
        r = run_cmds(cmds, k, hang_ms);
        account(dev, ordinal, t0);
    }
    if (cmds != local)
        free(cmds);
    return r;
}

static ze_result_t ZE_APICALL drv_append_copy(ze_command_list_handle_t h, void *dst,
                                              const void *src, size_t size,
                                              ze_event_handle_t signal, uint32_t n_wait,
                                              ze_event_handle_t *waits)
{
    if (dst == NULL || src == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    cmd_t c = {.op = C_COPY, .dst = dst, .src = src, .size = size};
    return append(h, &c, signal, n_wait, waits);
}

static ze_result_t ZE_APICALL drv_append_fill(ze_command_list_handle_t h, void *ptr,
                                              const void *pattern, size_t pattern_size, size_t size,
                                              ze_event_handle_t signal, uint32_t n_wait,
                                              ze_event_handle_t *waits)
{
    if (ptr == NULL || pattern == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (pattern_size == 0 || pattern_size > MAX_FILL_PATTERN ||
        (pattern_size & (pattern_size - 1)) != 0)
        return ZE_RESULT_ERROR_INVALID_SIZE; /* a power of two up to maxMemoryFillPatternSize */
    cmd_t c = {.op = C_FILL, .dst = ptr, .size = size, .pattern_size = pattern_size};
    memcpy(c.pattern, pattern, pattern_size);
    return append(h, &c, signal, n_wait, waits);
}

static ze_result_t ZE_APICALL drv_append_barrier(ze_command_list_handle_t h,
                                                 ze_event_handle_t signal, uint32_t n_wait,
                                                 ze_event_handle_t *waits)
{
    cmd_t c = {.op = C_BARRIER};
    return append(h, &c, signal, n_wait, waits);
}

static ze_result_t ZE_APICALL drv_append_signal(ze_command_list_handle_t h, ze_event_handle_t ev)
{
    if (ev == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    return append(h, NULL, ev, 0, NULL);
}

static ze_result_t ZE_APICALL drv_append_wait(ze_command_list_handle_t h, uint32_t n,
                                              ze_event_handle_t *events)
{
    if (events == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    return append(h, NULL, NULL, n, events);
}

static ze_result_t ZE_APICALL drv_append_event_reset(ze_command_list_handle_t h,
                                                     ze_event_handle_t ev)
{
    pthread_mutex_lock(&g.lock);
    event_t *e = lookup(ev, K_EVENT);
    pthread_mutex_unlock(&g.lock);
    if (e == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    cmd_t c = {.op = C_RESET, .event = e};
    return append(h, &c, NULL, 0, NULL);
}

/* ---- Sysman -----------------------------------------------------------------------------------
 */

/* Sysman calls answer only when ZES_ENABLE_SYSMAN=1 was set before zeInit, as Intel's do. */
static ze_result_t sysman_ready(void)
{
    ze_result_t r = ready();
    if (r == ZE_RESULT_SUCCESS && !g.cfg.sysman_enabled)
        r = ZE_RESULT_ERROR_UNINITIALIZED;
    return r;
}

static ze_result_t enum_handles(const void *hd, uint32_t *pCount, void **out, size_t n,
                                obj_t *const *objs)
{
    ze_result_t r = sysman_ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (!lookup(hd, K_DEVICE))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    if (pCount == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (*pCount == 0 || out == NULL) {
        *pCount = (uint32_t)n;
        return ZE_RESULT_SUCCESS;
    }
    if (*pCount > n)
        *pCount = (uint32_t)n;
    for (uint32_t i = 0; i < *pCount; i++)
        out[i] = objs[i];
    return ZE_RESULT_SUCCESS;
}

static ze_result_t ZE_APICALL zes_enum_memory(zes_device_handle_t hd, uint32_t *pCount,
                                              zes_mem_handle_t *ph)
{
    pthread_mutex_lock(&g.lock);
    device_t *d = lookup(hd, K_DEVICE);
    obj_t *objs[1] = {d ? &d->memmod.o : NULL};
    ze_result_t r = enum_handles(hd, pCount, (void **)ph, 1, objs);
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_enum_engines(zes_device_handle_t hd, uint32_t *pCount,
                                               zes_engine_handle_t *ph)
{
    pthread_mutex_lock(&g.lock);
    device_t *d = lookup(hd, K_DEVICE);
    obj_t *objs[N_ENGINES] = {NULL};
    for (unsigned e = 0; d != NULL && e < N_ENGINES; e++)
        objs[e] = &d->engines[e].o;
    ze_result_t r = enum_handles(hd, pCount, (void **)ph, N_ENGINES, objs);
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t zes_check(const void *h, kind_t kind, const void *out, obj_t **o)
{
    ze_result_t r = sysman_ready();
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (!(*o = lookup(h, kind)))
        return ZE_RESULT_ERROR_INVALID_NULL_HANDLE;
    return out ? ZE_RESULT_SUCCESS : ZE_RESULT_ERROR_INVALID_NULL_POINTER;
}

static ze_result_t ZE_APICALL zes_device_properties(zes_device_handle_t h,
                                                    zes_device_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_DEVICE, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        const device_t *d = (const device_t *)o;
        fill_device_properties(d, &p->core);
        p->numSubdevices = 0;
        snprintf(p->serialNumber, sizeof(p->serialNumber), "GDZT%04u", d->index);
        snprintf(p->boardNumber, sizeof(p->boardNumber), "unknown");
        snprintf(p->brandName, sizeof(p->brandName), "graphd");
        snprintf(p->modelName, sizeof(p->modelName), "graphd test XPU");
        snprintf(p->vendorName, sizeof(p->vendorName), "graphd tests");
        snprintf(p->driverVersion, sizeof(p->driverVersion), "1");
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_device_state(zes_device_handle_t h, zes_device_state_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_DEVICE, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        p->reset = g.lost ? ZES_RESET_REASON_FLAG_WEDGED : 0;
        p->repaired = ZES_REPAIR_STATUS_UNSUPPORTED;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_memory_properties(zes_mem_handle_t h, zes_mem_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_MEMMOD, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        const device_t *d = ((const memmod_t *)o)->dev;
        p->type = ZES_MEM_TYPE_HBM;
        p->onSubdevice = 0;
        p->subdeviceId = 0;
        p->location = ZES_MEM_LOC_DEVICE;
        p->physicalSize = d->mem_size;
        p->busWidth = 4096;
        p->numChannels = -1; /* unknown, as the spec allows */
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_memory_state(zes_mem_handle_t h, zes_mem_state_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_MEMMOD, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        const device_t *d = ((const memmod_t *)o)->dev;
        p->health = g.lost ? ZES_MEM_HEALTH_UNKNOWN : ZES_MEM_HEALTH_OK;
        p->free = d->mem_size - d->mem_used;
        p->size = d->mem_size;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_engine_properties(zes_engine_handle_t h,
                                                    zes_engine_properties_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_ENGINE, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        p->type = ((const engine_t *)o)->group;
        p->onSubdevice = 0;
        p->subdeviceId = 0;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

static ze_result_t ZE_APICALL zes_engine_activity(zes_engine_handle_t h, zes_engine_stats_t *p)
{
    pthread_mutex_lock(&g.lock);
    obj_t *o;
    ze_result_t r = zes_check(h, K_ENGINE, p, &o);
    if (r == ZE_RESULT_SUCCESS) {
        const engine_t *e = (const engine_t *)o;
        uint64_t ns = e->group == ZES_ENGINE_GROUP_COMPUTE_ALL ? e->dev->active_ns[0]
                      : e->group == ZES_ENGINE_GROUP_COPY_ALL
                          ? e->dev->active_ns[1]
                          : e->dev->active_ns[0] + e->dev->active_ns[1];
        p->activeTime = (ns + 999) / 1000; /* microseconds, rounded up: any work shows */
        p->timestamp = now_ns() / 1000;
    }
    pthread_mutex_unlock(&g.lock);
    return r;
}

/* ---- extension functions ------------------------------------------------------------------ */

static const struct {
    const char *name;
    unsigned minor; /* the spec 1.x that has it; 0: this driver's own */
    void *fn;
} ext_fns[] = {
    {"zeMemPutIpcHandle", 6, (void *)ext_mem_put_ipc},
    {"zeEventPoolPutIpcHandle", 6, (void *)ext_pool_put_ipc},
    {"zeMemGetFileDescriptorFromIpcHandleExp", 6, (void *)ext_fd_from_ipc},
    {"zeMemGetIpcHandleFromFileDescriptorExp", 6, (void *)ext_ipc_from_fd},
    {GZT_EXT_DEVICE_INDEX, 0, (void *)ext_device_index},
};

static ze_result_t ext_address(ze_driver_handle_t h, const char *name, void **out)
{
    ze_result_t r = check_driver(h);
    if (r != ZE_RESULT_SUCCESS)
        return r;
    if (name == NULL || out == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    for (size_t i = 0; i < sizeof(ext_fns) / sizeof(ext_fns[0]); i++) {
        if (strcmp(ext_fns[i].name, name) == 0 &&
            ZE_MINOR_VERSION(g.cfg.api_version) >= ext_fns[i].minor) {
            *out = ext_fns[i].fn;
            return ZE_RESULT_SUCCESS;
        }
    }
    *out = NULL;
    return ZE_RESULT_ERROR_INVALID_ARGUMENT; /* unknown here, or newer than the API version */
}

static ze_result_t ZE_APICALL drv_ext_address(ze_driver_handle_t h, const char *name, void **out)
{
    LOCKED(ext_address(h, name, out));
}

/* ---- exported table getters --------------------------------------------------------------- */

static ze_result_t table_check(ze_api_version_t version, const void *table)
{
    if (table == NULL)
        return ZE_RESULT_ERROR_INVALID_NULL_POINTER;
    if (ZE_MAJOR_VERSION(version) != 1)
        return ZE_RESULT_ERROR_UNSUPPORTED_VERSION;
    return ZE_RESULT_SUCCESS;
}

/* A getter for a table this driver leaves empty: every entry NULL. */
#define EMPTY_TABLE(fn, type)                                                                      \
    ZE_DLLEXPORT ze_result_t ZE_APICALL fn(ze_api_version_t version, type *t)                      \
    {                                                                                              \
        ze_result_t r = table_check(version, t);                                                   \
        if (r == ZE_RESULT_SUCCESS)                                                                \
            memset(t, 0, sizeof(*t));                                                              \
        return r;                                                                                  \
    }

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetGlobalProcAddrTable(ze_api_version_t version,
                                                             ze_global_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnInit = drv_init;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDriverProcAddrTable(ze_api_version_t version,
                                                             ze_driver_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnGet = drv_driver_get;
        t->pfnGetApiVersion = drv_driver_api_version;
        t->pfnGetProperties = drv_driver_properties;
        t->pfnGetIpcProperties = drv_driver_ipc_properties;
        t->pfnGetExtensionProperties = drv_driver_ext_properties;
        t->pfnGetExtensionFunctionAddress = drv_ext_address;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetDeviceProcAddrTable(ze_api_version_t version,
                                                             ze_device_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnGet = drv_device_get;
        t->pfnGetSubDevices = drv_device_sub_devices;
        t->pfnGetProperties = drv_device_properties;
        t->pfnGetComputeProperties = drv_device_compute_properties;
        t->pfnGetCommandQueueGroupProperties = drv_device_queue_groups;
        t->pfnGetMemoryProperties = drv_device_memory_properties;
        t->pfnGetStatus = drv_device_status;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetContextProcAddrTable(ze_api_version_t version,
                                                              ze_context_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnCreate = drv_context_create;
        t->pfnCreateEx = drv_context_create_ex;
        t->pfnDestroy = drv_context_destroy;
        t->pfnGetStatus = drv_context_status;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandQueueProcAddrTable(ze_api_version_t version,
                                                                   ze_command_queue_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnCreate = drv_queue_create;
        t->pfnDestroy = drv_queue_destroy;
        t->pfnExecuteCommandLists = drv_queue_execute;
        t->pfnSynchronize = drv_queue_sync;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetCommandListProcAddrTable(ze_api_version_t version,
                                                                  ze_command_list_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnCreate = drv_list_create;
        t->pfnCreateImmediate = drv_list_create_immediate;
        t->pfnDestroy = drv_list_destroy;
        t->pfnClose = drv_list_close;
        t->pfnReset = drv_list_reset;
        t->pfnAppendBarrier = drv_append_barrier;
        t->pfnAppendMemoryCopy = drv_append_copy;
        t->pfnAppendMemoryFill = drv_append_fill;
        t->pfnAppendSignalEvent = drv_append_signal;
        t->pfnAppendWaitOnEvents = drv_append_wait;
        t->pfnAppendEventReset = drv_append_event_reset;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventProcAddrTable(ze_api_version_t version,
                                                            ze_event_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnCreate = drv_event_create;
        t->pfnDestroy = drv_event_destroy;
        t->pfnHostSignal = drv_event_host_signal;
        t->pfnHostSynchronize = drv_event_host_sync;
        t->pfnQueryStatus = drv_event_query;
        t->pfnHostReset = drv_event_host_reset;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetEventPoolProcAddrTable(ze_api_version_t version,
                                                                ze_event_pool_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnCreate = drv_pool_create;
        t->pfnDestroy = drv_pool_destroy;
        t->pfnGetIpcHandle = drv_pool_get_ipc;
        t->pfnOpenIpcHandle = drv_pool_open_ipc;
        t->pfnCloseIpcHandle = drv_pool_close_ipc;
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zeGetMemProcAddrTable(ze_api_version_t version,
                                                          ze_mem_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        t->pfnAllocShared = drv_mem_alloc_shared;
        t->pfnAllocDevice = drv_mem_alloc_device;
        t->pfnAllocHost = drv_mem_alloc_host;
        t->pfnFree = drv_mem_free;
        t->pfnGetAllocProperties = drv_mem_alloc_properties;
        t->pfnGetAddressRange = drv_mem_address_range;
        t->pfnGetIpcHandle = drv_mem_get_ipc;
        t->pfnOpenIpcHandle = drv_mem_open_ipc;
        t->pfnCloseIpcHandle = drv_mem_close_ipc;
    }
    return r;
}

/* Sysman: GRAPHD_ZE_TEST_NO_SYSMAN=1 leaves these tables empty, like a driver without Sysman. */
ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetDeviceProcAddrTable(ze_api_version_t version,
                                                              zes_device_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        if (!cfg()->no_sysman) {
            t->pfnGetProperties = zes_device_properties;
            t->pfnGetState = zes_device_state;
            t->pfnEnumMemoryModules = zes_enum_memory;
            t->pfnEnumEngineGroups = zes_enum_engines;
        }
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetMemoryProcAddrTable(ze_api_version_t version,
                                                              zes_memory_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        if (!cfg()->no_sysman) {
            t->pfnGetProperties = zes_memory_properties;
            t->pfnGetState = zes_memory_state;
        }
    }
    return r;
}

ZE_DLLEXPORT ze_result_t ZE_APICALL zesGetEngineProcAddrTable(ze_api_version_t version,
                                                              zes_engine_dditable_t *t)
{
    ze_result_t r = table_check(version, t);
    if (r == ZE_RESULT_SUCCESS) {
        memset(t, 0, sizeof(*t));
        if (!cfg()->no_sysman) {
            t->pfnGetProperties = zes_engine_properties;
            t->pfnGetActivity = zes_engine_activity;
        }
    }
    return r;
}

/* The rest: empty tables. The loader refuses a driver missing any of them (tested by building
 * this file with -DGZT_OMIT_ZES_TEMPERATURE, which drops the last one). */
EMPTY_TABLE(zeGetFenceProcAddrTable, ze_fence_dditable_t)
EMPTY_TABLE(zeGetImageProcAddrTable, ze_image_dditable_t)
EMPTY_TABLE(zeGetKernelProcAddrTable, ze_kernel_dditable_t)
EMPTY_TABLE(zeGetModuleProcAddrTable, ze_module_dditable_t)
EMPTY_TABLE(zeGetModuleBuildLogProcAddrTable, ze_module_build_log_dditable_t)
EMPTY_TABLE(zeGetPhysicalMemProcAddrTable, ze_physical_mem_dditable_t)
EMPTY_TABLE(zeGetSamplerProcAddrTable, ze_sampler_dditable_t)
EMPTY_TABLE(zeGetVirtualMemProcAddrTable, ze_virtual_mem_dditable_t)

EMPTY_TABLE(zetGetCommandListProcAddrTable, zet_command_list_dditable_t)
EMPTY_TABLE(zetGetContextProcAddrTable, zet_context_dditable_t)
EMPTY_TABLE(zetGetDebugProcAddrTable, zet_debug_dditable_t)
EMPTY_TABLE(zetGetDeviceProcAddrTable, zet_device_dditable_t)
EMPTY_TABLE(zetGetKernelProcAddrTable, zet_kernel_dditable_t)
EMPTY_TABLE(zetGetMetricGroupProcAddrTable, zet_metric_group_dditable_t)
EMPTY_TABLE(zetGetMetricProcAddrTable, zet_metric_dditable_t)
EMPTY_TABLE(zetGetMetricQueryPoolProcAddrTable, zet_metric_query_pool_dditable_t)
EMPTY_TABLE(zetGetMetricQueryProcAddrTable, zet_metric_query_dditable_t)
EMPTY_TABLE(zetGetMetricStreamerProcAddrTable, zet_metric_streamer_dditable_t)
EMPTY_TABLE(zetGetModuleProcAddrTable, zet_module_dditable_t)
EMPTY_TABLE(zetGetTracerExpProcAddrTable, zet_tracer_exp_dditable_t)

EMPTY_TABLE(zesGetDiagnosticsProcAddrTable, zes_diagnostics_dditable_t)
EMPTY_TABLE(zesGetDriverProcAddrTable, zes_driver_dditable_t)
EMPTY_TABLE(zesGetFabricPortProcAddrTable, zes_fabric_port_dditable_t)
EMPTY_TABLE(zesGetFanProcAddrTable, zes_fan_dditable_t)
EMPTY_TABLE(zesGetFirmwareProcAddrTable, zes_firmware_dditable_t)
EMPTY_TABLE(zesGetFrequencyProcAddrTable, zes_frequency_dditable_t)
EMPTY_TABLE(zesGetLedProcAddrTable, zes_led_dditable_t)
EMPTY_TABLE(zesGetPerformanceFactorProcAddrTable, zes_performance_factor_dditable_t)
EMPTY_TABLE(zesGetPowerProcAddrTable, zes_power_dditable_t)
EMPTY_TABLE(zesGetPsuProcAddrTable, zes_psu_dditable_t)
EMPTY_TABLE(zesGetRasProcAddrTable, zes_ras_dditable_t)
EMPTY_TABLE(zesGetSchedulerProcAddrTable, zes_scheduler_dditable_t)
EMPTY_TABLE(zesGetStandbyProcAddrTable, zes_standby_dditable_t)
#ifndef GZT_OMIT_ZES_TEMPERATURE
EMPTY_TABLE(zesGetTemperatureProcAddrTable, zes_temperature_dditable_t)
#endif
