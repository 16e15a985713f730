/*
 * ze_layer: the Level Zero device layer (ze_layer.h has the contract). Plain C over the loader;
 * every ze_result_t becomes a gr_err_t through one table, with a message naming the call, the
 * device or driver, and what to do.
 */
#include "ze_layer.h"

#include "runtime_int.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <level_zero/loader/ze_loader.h>
#include <level_zero/ze_api.h>
#include <level_zero/zes_api.h>

/* ---- results ------------------------------------------------------------------------------ */

/* ze_result_t -> name, gr_err_t, and what to do about it (NULL: the caller says). */
#define ZE_RESULT_MAP(X)                                                                           \
    X(ZE_RESULT_NOT_READY, GR_ETIMEDOUT, NULL)                                                     \
    X(ZE_RESULT_ERROR_DEVICE_LOST, GR_ELOST,                                                       \
      "the device is lost: free what was allocated on it; it needs a reset (the driver's "         \
      "recovery "                                                                                  \
      "or a reboot) before graphd can use it again")                                               \
    X(ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY, GR_ENOMEM, "the host is out of memory")                  \
    X(ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY, GR_ENOMEM,                                             \
      "the device is out of memory: free regions on it or ask for less")                           \
    X(ZE_RESULT_ERROR_MODULE_BUILD_FAILURE, GR_EINTERNAL, NULL)                                    \
    X(ZE_RESULT_ERROR_MODULE_LINK_FAILURE, GR_EINTERNAL, NULL)                                     \
    X(ZE_RESULT_ERROR_DEVICE_REQUIRES_RESET, GR_ELOST, "the device needs a reset")                 \
    X(ZE_RESULT_ERROR_DEVICE_IN_LOW_POWER_STATE, GR_EPRECOND,                                      \
      "the device is in a low-power state")                                                        \
    X(ZE_RESULT_ERROR_INSUFFICIENT_PERMISSIONS, GR_EPRECOND,                                       \
      "graphd lacks the permissions the driver wants (render node access?)")                       \
    X(ZE_RESULT_ERROR_NOT_AVAILABLE, GR_EPRECOND, NULL)                                            \
    X(ZE_RESULT_ERROR_DEPENDENCY_UNAVAILABLE, GR_EPRECOND, NULL)                                   \
    X(ZE_RESULT_ERROR_UNINITIALIZED, GR_EPRECOND, "the driver is not initialised")                 \
    X(ZE_RESULT_ERROR_UNSUPPORTED_VERSION, GR_EUNSUPPORTED, "the driver does not support this")    \
    X(ZE_RESULT_ERROR_UNSUPPORTED_FEATURE, GR_EUNSUPPORTED, "the driver does not support this")    \
    X(ZE_RESULT_ERROR_INVALID_ARGUMENT, GR_EINVAL, NULL)                                           \
    X(ZE_RESULT_ERROR_INVALID_NULL_HANDLE, GR_EINVAL, NULL)                                        \
    X(ZE_RESULT_ERROR_HANDLE_OBJECT_IN_USE, GR_EBUSY, "release what still uses it first")          \
    X(ZE_RESULT_ERROR_INVALID_NULL_POINTER, GR_EINVAL, NULL)                                       \
    X(ZE_RESULT_ERROR_INVALID_SIZE, GR_EINVAL, NULL)                                               \
    X(ZE_RESULT_ERROR_UNSUPPORTED_SIZE, GR_EINVAL, NULL)                                           \
    X(ZE_RESULT_ERROR_UNSUPPORTED_ALIGNMENT, GR_EINVAL, NULL)                                      \
    X(ZE_RESULT_ERROR_INVALID_SYNCHRONIZATION_OBJECT, GR_EINVAL, NULL)                             \
    X(ZE_RESULT_ERROR_INVALID_ENUMERATION, GR_EINVAL, NULL)                                        \
    X(ZE_RESULT_ERROR_UNSUPPORTED_ENUMERATION, GR_EUNSUPPORTED, NULL)                              \
    X(ZE_RESULT_ERROR_INVALID_COMMAND_LIST_TYPE, GR_EINVAL, NULL)                                  \
    X(ZE_RESULT_ERROR_UNKNOWN, GR_EINTERNAL, NULL)

static const char *result_name(ze_result_t r)
{
    static _Thread_local char buf[32];
    switch (r) {
    case ZE_RESULT_SUCCESS:
        return "ZE_RESULT_SUCCESS";
#define ZE_NAME(name, err, hint)                                                                   \
    case name:                                                                                     \
        return #name;
        ZE_RESULT_MAP(ZE_NAME)
#undef ZE_NAME
    default:
        break;
    }
    snprintf(buf, sizeof(buf), "ze_result_t 0x%x", (unsigned)r);
    return buf;
}

static int result_err(ze_result_t r)
{
    switch (r) {
    case ZE_RESULT_SUCCESS:
        return GR_OK;
#define ZE_ERR(name, err, hint)                                                                    \
    case name:                                                                                     \
        return err;
        ZE_RESULT_MAP(ZE_ERR)
#undef ZE_ERR
    default:
        return GR_EINTERNAL;
    }
}

static const char *result_hint(ze_result_t r)
{
    switch (r) {
#define ZE_HINT(name, err, hint)                                                                   \
    case name:                                                                                     \
        return hint;
        ZE_RESULT_MAP(ZE_HINT)
#undef ZE_HINT
    default:
        return NULL;
    }
}

/* ---- the layer's state -------------------------------------------------------------------- */

typedef ze_result_t(ZE_APICALL *mem_put_fn)(ze_context_handle_t, ze_ipc_mem_handle_t);
typedef ze_result_t(ZE_APICALL *pool_put_fn)(ze_context_handle_t, ze_ipc_event_pool_handle_t);
typedef ze_result_t(ZE_APICALL *fd_from_ipc_fn)(ze_context_handle_t, ze_ipc_mem_handle_t,
                                                uint64_t *);

typedef struct {
    ze_driver_handle_t h;
    ze_context_handle_t ctx; /* NULL for a driver without GPU devices */
    void *raw_ctx;           /* ctx as the driver knows it, for extension functions */
    uint32_t index;
    uint32_t version;
    uint32_t api_major, api_minor;
    int ipc_mem, ipc_pool;
    mem_put_fn mem_put; /* spec 1.6 extensions, NULL when absent */
    pool_put_fn pool_put;
    fd_from_ipc_fn fd_from_ipc;
} zdrv_t;

typedef struct {
    ze_device_handle_t h;
    zdrv_t *drv;
    gr_ze_device_info_t info;
    uint64_t max_alloc; /* maxMemAllocSize */
    uint32_t copy_ordinal;
    pthread_mutex_t lock; /* imm: held for a whole copy or fill */
    ze_command_list_handle_t imm;
    pthread_mutex_t sample_lock; /* the activity sample: never held across a driver call */
    int have_prev;
    uint64_t prev_active, prev_ts;
} zdev_t;

/* One allocation of gr_ze_alloc or import of gr_ze_import. */
typedef struct rec {
    struct rec *next;
    void *ptr;
    zdev_t *dev;
    uint64_t size;
    int imported;
    ze_ipc_mem_handle_t ipc; /* an allocation's handle, to put at free */
} rec_t;

struct gr_ze {
    pthread_mutex_t lock; /* recs, n_pools */
    unsigned n_drv;
    zdrv_t *drv;
    unsigned n_dev;
    zdev_t dev[GR_ZE_DEVICES_MAX];
    rec_t *recs;
    unsigned n_pools;
};

struct gr_ze_event_pool {
    gr_ze_t *ze;
    zdev_t *dev;
    ze_event_pool_handle_t h;
    int opened;
    ze_ipc_event_pool_handle_t ipc; /* a created pool's handle, to put at close */
    uint32_t count;
    ze_event_handle_t ev[];
};

static const char *label(const zdev_t *d)
{
    static _Thread_local char buf[320];
    snprintf(buf, sizeof(buf), "%s (%s)", d->info.device, d->info.name);
    return buf;
}

static const char *drv_label(const zdrv_t *drv)
{
    static _Thread_local char buf[96];
    snprintf(buf, sizeof(buf), "Level Zero driver %u (version 0x%x, API %u.%u)", drv->index,
             drv->version, drv->api_major, drv->api_minor);
    return buf;
}

/*
 * Sets the message "<who>: <call> answered <result>: <hint>" and returns the mapped error; hint
 * (printf-style, may be NULL) replaces the table's.
 */
__attribute__((format(printf, 4, 5))) static int fail(ze_result_t r, const char *who,
                                                      const char *call, const char *hint, ...)
{
    char h[512] = "";
    if (hint != NULL) {
        va_list ap;
        va_start(ap, hint);
        vsnprintf(h, sizeof(h), hint, ap);
        va_end(ap);
    } else if (result_hint(r) != NULL) {
        snprintf(h, sizeof(h), "%s", result_hint(r));
    }
    return gr__set_errorf(result_err(r), "%s: %s answered %s%s%s", who, call, result_name(r),
                          h[0] ? ": " : "", h);
}

static int check_dev(const gr_ze_t *ze, unsigned i, const char *fn)
{
    if (ze == NULL)
        return gr__set_errorf(GR_EINVAL, "%s: NULL layer", fn);
    if (i >= ze->n_dev)
        return gr__set_errorf(GR_EINVAL, "%s: no device xpu:%u (this node has %u xpu device%s)", fn,
                              i, ze->n_dev, ze->n_dev == 1 ? "" : "s");
    return 0;
}

static int fd_is_open(int fd)
{
    return fd >= 0 && fcntl(fd, F_GETFD) != -1;
}

static int handle_fd(const void *data)
{
    int32_t fd;
    memcpy(&fd, data, sizeof(fd));
    return fd;
}

static void set_handle_fd(void *data, int fd)
{
    int32_t v = fd;
    memcpy(data, &v, sizeof(v));
}

/* ---- open and close ----------------------------------------------------------------------- */

static void why_set(char *why, size_t n, int err)
{
    if (why != NULL && n > 0)
        snprintf(why, n, "%s", gr_last_error());
    (void)err;
}

static void *ext_fn(ze_driver_handle_t drv, const char *name)
{
    void *fn = NULL;
    if (zeDriverGetExtensionFunctionAddress(drv, name, &fn) != ZE_RESULT_SUCCESS)
        return NULL;
    return fn;
}

/* Fills what zeDeviceGetProperties and friends say about device d. */
static ze_result_t read_device(zdev_t *d, unsigned index, const char **call)
{
    ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
    ze_result_t r;
    *call = "zeDeviceGetProperties";
    if ((r = zeDeviceGetProperties(d->h, &p)) != ZE_RESULT_SUCCESS)
        return r;
    gr_ze_device_info_t *in = &d->info;
    snprintf(in->device, sizeof(in->device), "xpu:%u", index);
    snprintf(in->name, sizeof(in->name), "%.*s", (int)sizeof(p.name), p.name);
    memcpy(in->uuid, p.uuid.id, sizeof(in->uuid));
    for (int k = 0; k < 16; k++)
        snprintf(in->uuid_hex + 2 * k, 3, "%02x", in->uuid[k]);
    in->vendor_id = p.vendorId;
    in->device_id = p.deviceId;
    in->compute_units = p.numSlices * p.numSubslicesPerSlice * p.numEUsPerSubslice;
    in->max_clock_mhz = p.coreClockRate;
    d->max_alloc = p.maxMemAllocSize;

    *call = "zeDeviceGetMemoryProperties";
    uint32_t n = 0;
    if ((r = zeDeviceGetMemoryProperties(d->h, &n, NULL)) != ZE_RESULT_SUCCESS)
        return r;
    if (n > 0) {
        ze_device_memory_properties_t *mp = calloc(n, sizeof(*mp));
        if (mp == NULL)
            return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        for (uint32_t k = 0; k < n; k++)
            mp[k].stype = ZE_STRUCTURE_TYPE_DEVICE_MEMORY_PROPERTIES;
        r = zeDeviceGetMemoryProperties(d->h, &n, mp);
        for (uint32_t k = 0; r == ZE_RESULT_SUCCESS && k < n; k++)
            in->total_bytes += mp[k].totalSize;
        free(mp);
        if (r != ZE_RESULT_SUCCESS)
            return r;
    }

    /* Copies and fills go to the first queue group that copies (compute groups do). */
    *call = "zeDeviceGetCommandQueueGroupProperties";
    n = 0;
    if ((r = zeDeviceGetCommandQueueGroupProperties(d->h, &n, NULL)) != ZE_RESULT_SUCCESS)
        return r;
    d->copy_ordinal = 0;
    if (n > 0) {
        ze_command_queue_group_properties_t *gp = calloc(n, sizeof(*gp));
        if (gp == NULL)
            return ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY;
        for (uint32_t k = 0; k < n; k++)
            gp[k].stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
        r = zeDeviceGetCommandQueueGroupProperties(d->h, &n, gp);
        for (uint32_t k = 0; r == ZE_RESULT_SUCCESS && k < n; k++) {
            if (gp[k].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) {
                d->copy_ordinal = k;
                break;
            }
        }
        free(gp);
    }
    return r;
}

/* Reads driver drv's properties, its extension functions, and creates its context. */
static ze_result_t open_driver(zdrv_t *drv, const char **call)
{
    ze_result_t r;
    ze_driver_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES};
    *call = "zeDriverGetProperties";
    if ((r = zeDriverGetProperties(drv->h, &p)) != ZE_RESULT_SUCCESS)
        return r;
    drv->version = p.driverVersion;
    ze_api_version_t v;
    *call = "zeDriverGetApiVersion";
    if ((r = zeDriverGetApiVersion(drv->h, &v)) != ZE_RESULT_SUCCESS)
        return r;
    drv->api_major = ZE_MAJOR_VERSION(v);
    drv->api_minor = ZE_MINOR_VERSION(v);
    ze_driver_ipc_properties_t ip = {.stype = ZE_STRUCTURE_TYPE_DRIVER_IPC_PROPERTIES};
    *call = "zeDriverGetIpcProperties";
    if ((r = zeDriverGetIpcProperties(drv->h, &ip)) != ZE_RESULT_SUCCESS)
        return r;
    drv->ipc_mem = (ip.flags & ZE_IPC_PROPERTY_FLAG_MEMORY) != 0;
    drv->ipc_pool = (ip.flags & ZE_IPC_PROPERTY_FLAG_EVENT_POOL) != 0;
    ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
    *call = "zeContextCreate";
    if ((r = zeContextCreate(drv->h, &cd, &drv->ctx)) != ZE_RESULT_SUCCESS) {
        drv->ctx = NULL;
        return r;
    }
    /* Extension functions are the driver's own: under loader interception their handle
     * arguments must be the driver's, so keep the translated context (passing through, the
     * loader returns its input). Without a translation the extensions are not used. */
    if (zelLoaderTranslateHandle(ZEL_HANDLE_CONTEXT, drv->ctx, &drv->raw_ctx) ==
            ZE_RESULT_SUCCESS &&
        drv->raw_ctx != NULL) {
        drv->mem_put = (mem_put_fn)ext_fn(drv->h, "zeMemPutIpcHandle");
        drv->pool_put = (pool_put_fn)ext_fn(drv->h, "zeEventPoolPutIpcHandle");
        drv->fd_from_ipc = (fd_from_ipc_fn)ext_fn(drv->h, "zeMemGetFileDescriptorFromIpcHandleExp");
    }
    return ZE_RESULT_SUCCESS;
}

static void release(gr_ze_t *ze)
{
    for (unsigned i = 0; i < ze->n_dev; i++) {
        if (ze->dev[i].imm != NULL)
            zeCommandListDestroy(ze->dev[i].imm);
        pthread_mutex_destroy(&ze->dev[i].lock);
        pthread_mutex_destroy(&ze->dev[i].sample_lock);
    }
    for (unsigned k = 0; k < ze->n_drv; k++) {
        if (ze->drv[k].ctx != NULL)
            zeContextDestroy(ze->drv[k].ctx);
    }
    pthread_mutex_destroy(&ze->lock);
    free(ze->drv);
    free(ze);
}

int gr_ze_open(gr_ze_t **out, char *why, size_t n)
{
    if (out == NULL) {
        gr__set_error(GR_EINVAL, "gr_ze_open: NULL out");
        why_set(why, n, GR_EINVAL);
        return GR_EINVAL;
    }
    *out = NULL;
    /* Sysman answers only if asked for before zeInit (this loader has no zesInit). */
    setenv("ZES_ENABLE_SYSMAN", "1", 0);
    ze_result_t r = zeInit(ZE_INIT_FLAG_GPU_ONLY);
    if (r != ZE_RESULT_SUCCESS) {
        /* Nothing else may be called now: the loader may have unloaded the driver. */
        gr__set_errorf(GR_EUNSUPPORTED, "no Level Zero driver: zeInit answered %s", result_name(r));
        why_set(why, n, GR_EUNSUPPORTED);
        return GR_EUNSUPPORTED;
    }
    uint32_t nd = 0;
    if ((r = zeDriverGet(&nd, NULL)) != ZE_RESULT_SUCCESS) {
        int err = fail(r, "Level Zero", "zeDriverGet", NULL);
        why_set(why, n, err);
        return err;
    }
    gr_ze_t *ze = calloc(1, sizeof(*ze));
    ze_driver_handle_t *dh = calloc(nd ? nd : 1, sizeof(*dh));
    if (ze == NULL || dh == NULL || (nd && (ze->drv = calloc(nd, sizeof(*ze->drv))) == NULL)) {
        free(dh);
        if (ze != NULL)
            free(ze->drv);
        free(ze);
        gr__set_error(GR_ENOMEM, "gr_ze_open: out of host memory");
        why_set(why, n, GR_ENOMEM);
        return GR_ENOMEM;
    }
    pthread_mutex_init(&ze->lock, NULL);
    int err = 0;
    if (nd > 0 && (r = zeDriverGet(&nd, dh)) != ZE_RESULT_SUCCESS)
        err = fail(r, "Level Zero", "zeDriverGet", NULL);
    for (uint32_t k = 0; err == 0 && k < nd; k++) {
        zdrv_t *drv = &ze->drv[ze->n_drv++];
        drv->h = dh[k];
        drv->index = k;
        uint32_t cnt = 0;
        if ((r = zeDeviceGet(drv->h, &cnt, NULL)) != ZE_RESULT_SUCCESS) {
            err = fail(r, drv_label(drv), "zeDeviceGet", NULL);
            break;
        }
        ze_device_handle_t *devs = calloc(cnt ? cnt : 1, sizeof(*devs));
        if (devs == NULL) {
            err = gr__set_error(GR_ENOMEM, "gr_ze_open: out of host memory");
            break;
        }
        if (cnt > 0 && (r = zeDeviceGet(drv->h, &cnt, devs)) != ZE_RESULT_SUCCESS) {
            free(devs);
            err = fail(r, drv_label(drv), "zeDeviceGet", NULL);
            break;
        }
        unsigned first = ze->n_dev;
        for (uint32_t j = 0; j < cnt && ze->n_dev < GR_ZE_DEVICES_MAX; j++) {
            ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            if ((r = zeDeviceGetProperties(devs[j], &p)) != ZE_RESULT_SUCCESS) {
                err = fail(r, drv_label(drv), "zeDeviceGetProperties", NULL);
                break;
            }
            if (p.type != ZE_DEVICE_TYPE_GPU)
                continue;
            zdev_t *d = &ze->dev[ze->n_dev];
            d->h = devs[j];
            d->drv = drv;
            pthread_mutex_init(&d->lock, NULL);
            pthread_mutex_init(&d->sample_lock, NULL);
            ze->n_dev++;
            const char *call;
            if ((r = read_device(d, ze->n_dev - 1, &call)) != ZE_RESULT_SUCCESS) {
                err = fail(r, drv_label(drv), call, NULL);
                break;
            }
        }
        free(devs);
        if (err != 0 || ze->n_dev == first)
            continue; /* a driver without GPU devices gets no context */
        const char *call;
        if ((r = open_driver(drv, &call)) != ZE_RESULT_SUCCESS) {
            err = fail(r, drv_label(drv), call, NULL);
            break;
        }
        for (unsigned j = first; j < ze->n_dev; j++) {
            gr_ze_device_info_t *in = &ze->dev[j].info;
            in->driver_index = drv->index;
            in->driver_version = drv->version;
            in->api_major = drv->api_major;
            in->api_minor = drv->api_minor;
            in->ipc_memory = drv->ipc_mem;
            in->ipc_event_pool = drv->ipc_pool;
            in->ipc_put = drv->mem_put != NULL;
        }
    }
    free(dh);
    if (err == 0 && ze->n_dev == 0)
        err = gr__set_errorf(GR_ENOTFOUND,
                             "no Level Zero GPU device: %u driver%s found, none lists a GPU", nd,
                             nd == 1 ? "" : "s");
    if (err != 0) {
        release(ze);
        why_set(why, n, err);
        return err;
    }
    *out = ze;
    return 0;
}

int gr_ze_close(gr_ze_t *ze)
{
    if (ze == NULL)
        return 0;
    pthread_mutex_lock(&ze->lock);
    unsigned allocs = 0, imports = 0, pools = ze->n_pools;
    for (const rec_t *x = ze->recs; x != NULL; x = x->next)
        x->imported ? imports++ : allocs++;
    pthread_mutex_unlock(&ze->lock);
    if (allocs + imports + pools > 0)
        return gr__set_errorf(GR_EBUSY,
                              "gr_ze_close: %u allocation(s), %u import(s) and %u event pool(s) "
                              "still live: free, unimport and close them first",
                              allocs, imports, pools);
    release(ze);
    return 0;
}

unsigned gr_ze_count(const gr_ze_t *ze)
{
    return ze ? ze->n_dev : 0;
}

int gr_ze_info(const gr_ze_t *ze, unsigned i, gr_ze_device_info_t *info)
{
    int err = check_dev(ze, i, "gr_ze_info");
    if (err != 0)
        return err;
    if (info == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_info: NULL info");
    *info = ze->dev[i].info;
    return 0;
}

/* ---- telemetry ---------------------------------------------------------------------------- */

#define ZES_MAX_HANDLES 64

static const char *health_name(int h)
{
    static const char *const names[] = {"unknown", "ok", "degraded", "critical", "replace"};
    return h >= 0 && h <= 4 ? names[h] : "unknown";
}

static void read_memory(zes_device_handle_t sh, gr_ze_telemetry_t *t)
{
    uint32_t n = 0;
    if (zesDeviceEnumMemoryModules(sh, &n, NULL) != ZE_RESULT_SUCCESS || n == 0)
        return;
    zes_mem_handle_t mods[ZES_MAX_HANDLES];
    if (n > ZES_MAX_HANDLES)
        n = ZES_MAX_HANDLES;
    if (zesDeviceEnumMemoryModules(sh, &n, mods) != ZE_RESULT_SUCCESS)
        return;
    uint64_t free_b = 0, total = 0;
    int worst = ZES_MEM_HEALTH_UNKNOWN;
    for (uint32_t k = 0; k < n; k++) {
        zes_mem_state_t st = {.stype = ZES_STRUCTURE_TYPE_MEM_STATE};
        if (zesMemoryGetState(mods[k], &st) != ZE_RESULT_SUCCESS)
            return; /* a partial sum would be a wrong value: leave memory absent */
        free_b += st.free;
        total += st.size;
        if ((int)st.health > worst && st.health <= ZES_MEM_HEALTH_REPLACE)
            worst = st.health;
    }
    t->have_memory = 1;
    t->mem_free_bytes = free_b;
    t->mem_total_bytes = total;
    if (worst != ZES_MEM_HEALTH_UNKNOWN) {
        t->have_health = 1;
        t->mem_health = worst;
        t->mem_health_name = health_name(worst);
    }
}

static void read_engine(zdev_t *d, zes_device_handle_t sh, gr_ze_telemetry_t *t)
{
    uint32_t n = 0;
    if (zesDeviceEnumEngineGroups(sh, &n, NULL) != ZE_RESULT_SUCCESS || n == 0)
        return;
    zes_engine_handle_t eng[ZES_MAX_HANDLES];
    if (n > ZES_MAX_HANDLES)
        n = ZES_MAX_HANDLES;
    if (zesDeviceEnumEngineGroups(sh, &n, eng) != ZE_RESULT_SUCCESS)
        return;
    zes_engine_handle_t pick = NULL;
    for (uint32_t k = 0; k < n; k++) {
        zes_engine_properties_t p = {.stype = ZES_STRUCTURE_TYPE_ENGINE_PROPERTIES};
        if (zesEngineGetProperties(eng[k], &p) != ZE_RESULT_SUCCESS || p.onSubdevice)
            continue;
        if (p.type == ZES_ENGINE_GROUP_ALL) {
            pick = eng[k];
            break;
        }
        if (p.type == ZES_ENGINE_GROUP_COMPUTE_ALL && pick == NULL)
            pick = eng[k];
    }
    zes_engine_stats_t s;
    memset(&s, 0, sizeof(s));
    if (pick == NULL || zesEngineGetActivity(pick, &s) != ZE_RESULT_SUCCESS)
        return;
    t->have_engine = 1;
    t->engine_active_us = s.activeTime;
    pthread_mutex_lock(&d->sample_lock);
    if (d->have_prev && s.timestamp > d->prev_ts && s.activeTime >= d->prev_active) {
        double u = (double)(s.activeTime - d->prev_active) / (double)(s.timestamp - d->prev_ts);
        t->have_utilisation = 1;
        t->utilisation = u > 1.0 ? 1.0 : u;
    }
    d->have_prev = 1;
    d->prev_active = s.activeTime;
    d->prev_ts = s.timestamp;
    pthread_mutex_unlock(&d->sample_lock);
}

int gr_ze_telemetry(gr_ze_t *ze, unsigned i, gr_ze_telemetry_t *out)
{
    int err = check_dev(ze, i, "gr_ze_telemetry");
    if (err != 0)
        return err;
    if (out == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_telemetry: NULL out");
    memset(out, 0, sizeof(*out));
    out->mem_health_name = "unknown";
    zdev_t *d = &ze->dev[i];
    /* Sysman takes the core device handle as its own (spec 1.4, no zesInit in this loader). */
    zes_device_handle_t sh = (zes_device_handle_t)d->h;
    read_memory(sh, out);
    read_engine(d, sh, out);
    zes_device_state_t st = {.stype = ZES_STRUCTURE_TYPE_DEVICE_STATE};
    if (zesDeviceGetState(sh, &st) == ZE_RESULT_SUCCESS) {
        out->have_reset = 1;
        out->wedged = (st.reset & ZES_RESET_REASON_FLAG_WEDGED) != 0;
    }
    return 0;
}

/* ---- memory ------------------------------------------------------------------------------- */

static void rec_push(gr_ze_t *ze, rec_t *x)
{
    pthread_mutex_lock(&ze->lock);
    x->next = ze->recs;
    ze->recs = x;
    pthread_mutex_unlock(&ze->lock);
}

/* Unlinks and returns the record of ptr of the kind asked for, or NULL. */
static rec_t *rec_take(gr_ze_t *ze, const void *ptr, int imported)
{
    pthread_mutex_lock(&ze->lock);
    rec_t **pp = &ze->recs, *x = NULL;
    for (; *pp != NULL; pp = &(*pp)->next) {
        if ((*pp)->ptr == ptr && (*pp)->imported == imported) {
            x = *pp;
            *pp = x->next;
            break;
        }
    }
    pthread_mutex_unlock(&ze->lock);
    return x;
}

static int no_ipc(const zdev_t *d, const char *what, const char *call, ze_result_t r)
{
    return gr__set_errorf(GR_EUNSUPPORTED,
                          "%s: %s has no %s IPC (%s answered %s): %s on %s cannot be shared with "
                          "another process; use host memory instead",
                          d->info.device, drv_label(d->drv), what, call, result_name(r),
                          strcmp(what, "memory") == 0 ? "device regions" : "event pools",
                          d->info.device);
}

static int oom(gr_ze_t *ze, unsigned i, uint64_t size, ze_result_t r)
{
    zdev_t *d = &ze->dev[i];
    gr_ze_telemetry_t t;
    char have[128] = "free memory unknown (no Sysman)";
    if (gr_ze_telemetry(ze, i, &t) == 0 && t.have_memory)
        snprintf(have, sizeof(have), "%" PRIu64 " of %" PRIu64 " bytes free", t.mem_free_bytes,
                 t.mem_total_bytes);
    return fail(r, label(d), "zeMemAllocDevice",
                "out of device memory allocating %" PRIu64 " bytes (%s): free regions on %s or ask "
                "for less",
                size, have, d->info.device);
}

int gr_ze_alloc(gr_ze_t *ze, unsigned i, uint64_t size, void **ptr, int *fd, gr_ze_ipc_t *ipc)
{
    int err = check_dev(ze, i, "gr_ze_alloc");
    if (err != 0)
        return err;
    if (ptr == NULL || fd == NULL || ipc == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_alloc: NULL ptr, fd or ipc");
    zdev_t *d = &ze->dev[i];
    if (size == 0 || size > SIZE_MAX)
        return gr__set_errorf(GR_EINVAL, "gr_ze_alloc: %s: size %" PRIu64 " is not valid",
                              d->info.device, size);
    if (d->max_alloc != 0 && size > d->max_alloc)
        return gr__set_errorf(GR_EINVAL,
                              "gr_ze_alloc: %s: %" PRIu64 " bytes is more than one allocation may "
                              "be on this device (maxMemAllocSize %" PRIu64 "): ask for less",
                              label(d), size, d->max_alloc);
    if (!d->drv->ipc_mem)
        return no_ipc(d, "memory", "zeDriverGetIpcProperties", ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    rec_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return gr__set_error(GR_ENOMEM, "gr_ze_alloc: out of host memory");
    ze_context_handle_t ctx = d->drv->ctx;
    ze_device_mem_alloc_desc_t md = {.stype = ZE_STRUCTURE_TYPE_DEVICE_MEM_ALLOC_DESC};
    void *p = NULL;
    ze_result_t r = zeMemAllocDevice(ctx, &md, (size_t)size, GR_ALIGN, d->h, &p);
    if (r != ZE_RESULT_SUCCESS) {
        free(x);
        if (r == ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY)
            return oom(ze, i, size, r);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_SIZE)
            return fail(r, label(d), "zeMemAllocDevice",
                        "%" PRIu64 " bytes is more than one allocation may be: ask for less", size);
        return fail(r, label(d), "zeMemAllocDevice", NULL);
    }
    if ((r = zeMemGetIpcHandle(ctx, p, &x->ipc)) != ZE_RESULT_SUCCESS) {
        zeMemFree(ctx, p);
        free(x);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
            return no_ipc(d, "memory", "zeMemGetIpcHandle", r);
        return fail(r, label(d), "zeMemGetIpcHandle", NULL);
    }
    int hfd = handle_fd(x->ipc.data);
    uint64_t fd64 = 0;
    if (d->drv->fd_from_ipc != NULL &&
        d->drv->fd_from_ipc((ze_context_handle_t)d->drv->raw_ctx, x->ipc, &fd64) ==
            ZE_RESULT_SUCCESS &&
        fd64 <= INT32_MAX)
        hfd = (int)fd64;
    int own = fd_is_open(hfd) ? fcntl(hfd, F_DUPFD_CLOEXEC, 0) : -1;
    if (own < 0) {
        int e = errno;
        if (d->drv->mem_put != NULL)
            d->drv->mem_put((ze_context_handle_t)d->drv->raw_ctx, x->ipc);
        zeMemFree(ctx, p);
        free(x);
        if (e == EMFILE || e == ENFILE)
            return gr__set_errorf(GR_ENOMEM, "gr_ze_alloc: %s: no fd left to export (%s)",
                                  d->info.device, strerror(e));
        return gr__set_errorf(GR_EUNSUPPORTED,
                              "gr_ze_alloc: %s: the IPC handle of %s carries no fd open in this "
                              "process (a driver that expects pidfd_getfd, which fails across "
                              "uids): device regions cannot be shared on it",
                              d->info.device, drv_label(d->drv));
    }
    x->ptr = p;
    x->dev = d;
    x->size = size;
    rec_push(ze, x);
    *ptr = p;
    *fd = own;
    memcpy(ipc->data, x->ipc.data, GR_ZE_IPC_SIZE);
    return 0;
}

int gr_ze_free(gr_ze_t *ze, void *ptr)
{
    if (ze == NULL || ptr == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_free: NULL layer or pointer");
    rec_t *x = rec_take(ze, ptr, 0);
    if (x == NULL)
        return gr__set_errorf(GR_EINVAL,
                              "gr_ze_free: %p is not a live allocation of gr_ze_alloc (freed "
                              "twice, or an import: gr_ze_unimport those)",
                              ptr);
    zdrv_t *drv = x->dev->drv;
    int err = 0;
    if (drv->mem_put != NULL) {
        ze_result_t r = drv->mem_put((ze_context_handle_t)drv->raw_ctx, x->ipc);
        if (r != ZE_RESULT_SUCCESS)
            err = fail(r, label(x->dev), "zeMemPutIpcHandle",
                       "the IPC handle was not released (its fd may stay open until the free "
                       "below); the memory is freed");
    }
    ze_result_t r = zeMemFree(drv->ctx, ptr);
    if (r != ZE_RESULT_SUCCESS && err == 0)
        err = fail(r, label(x->dev), "zeMemFree", NULL);
    free(x);
    return err;
}

int gr_ze_import(gr_ze_t *ze, unsigned i, const gr_ze_ipc_t *ipc, int fd, uint64_t size, void **ptr)
{
    int err = check_dev(ze, i, "gr_ze_import");
    if (err != 0)
        return err;
    if (ipc == NULL || ptr == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_import: NULL ipc or ptr");
    zdev_t *d = &ze->dev[i];
    if (!fd_is_open(fd))
        return gr__set_errorf(GR_EINVAL,
                              "gr_ze_import: %s: fd %d is not open in this process: pass the fd "
                              "received with SCM_RIGHTS",
                              d->info.device, fd);
    if (size == 0)
        return gr__set_errorf(GR_EINVAL, "gr_ze_import: %s: size 0", d->info.device);
    if (!d->drv->ipc_mem)
        return no_ipc(d, "memory", "zeDriverGetIpcProperties", ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    rec_t *x = calloc(1, sizeof(*x));
    if (x == NULL)
        return gr__set_error(GR_ENOMEM, "gr_ze_import: out of host memory");
    ze_ipc_mem_handle_t h;
    memcpy(h.data, ipc->data, GR_ZE_IPC_SIZE);
    set_handle_fd(h.data, fd);
    ze_context_handle_t ctx = d->drv->ctx;
    void *p = NULL;
    ze_result_t r = zeMemOpenIpcHandle(ctx, d->h, h, 0, &p);
    if (r != ZE_RESULT_SUCCESS) {
        free(x);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
            return no_ipc(d, "memory", "zeMemOpenIpcHandle", r);
        if (result_err(r) == GR_EINVAL)
            return fail(r, label(d), "zeMemOpenIpcHandle",
                        "fd %d with this handle is not a live exported allocation (freed by its "
                        "exporter, or not an export)",
                        fd);
        return fail(r, label(d), "zeMemOpenIpcHandle", NULL);
    }
    size_t got = 0;
    r = zeMemGetAddressRange(ctx, p, NULL, &got);
    if (r == ZE_RESULT_SUCCESS && got < size) {
        zeMemCloseIpcHandle(ctx, p);
        free(x);
        return gr__set_errorf(GR_EINVAL,
                              "gr_ze_import: %s: the allocation mapped is %zu bytes, the exporter "
                              "said %" PRIu64 ": not the allocation it sent",
                              d->info.device, got, size);
    }
    x->ptr = p;
    x->dev = d;
    x->size = size;
    x->imported = 1;
    rec_push(ze, x);
    *ptr = p;
    return 0;
}

int gr_ze_unimport(gr_ze_t *ze, void *ptr)
{
    if (ze == NULL || ptr == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_unimport: NULL layer or pointer");
    rec_t *x = rec_take(ze, ptr, 1);
    if (x == NULL)
        return gr__set_errorf(GR_EINVAL, "gr_ze_unimport: %p is not a live import", ptr);
    ze_result_t r = zeMemCloseIpcHandle(x->dev->drv->ctx, ptr);
    int err = r == ZE_RESULT_SUCCESS ? 0 : fail(r, label(x->dev), "zeMemCloseIpcHandle", NULL);
    free(x);
    return err;
}

/* Runs one append on device i's immediate list (synchronous), made at first use. */
static int run_imm(gr_ze_t *ze, unsigned i, int copy, void *dst, const void *src, uint8_t byte,
                   size_t size, const char *fn)
{
    int err = check_dev(ze, i, fn);
    if (err != 0)
        return err;
    if (dst == NULL || (copy && src == NULL))
        return gr__set_errorf(GR_EINVAL, "%s: NULL pointer", fn);
    if (size == 0)
        return 0;
    zdev_t *d = &ze->dev[i];
    pthread_mutex_lock(&d->lock);
    ze_result_t r = ZE_RESULT_SUCCESS;
    const char *call = "zeCommandListCreateImmediate";
    if (d->imm == NULL) {
        ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                      .ordinal = d->copy_ordinal,
                                      .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
        r = zeCommandListCreateImmediate(d->drv->ctx, d->h, &qd, &d->imm);
        if (r != ZE_RESULT_SUCCESS)
            d->imm = NULL;
    }
    if (r == ZE_RESULT_SUCCESS && copy) {
        call = "zeCommandListAppendMemoryCopy";
        r = zeCommandListAppendMemoryCopy(d->imm, dst, src, size, NULL, 0, NULL);
    } else if (r == ZE_RESULT_SUCCESS) {
        call = "zeCommandListAppendMemoryFill";
        r = zeCommandListAppendMemoryFill(d->imm, dst, &byte, 1, size, NULL, 0, NULL);
    }
    pthread_mutex_unlock(&d->lock);
    return r == ZE_RESULT_SUCCESS ? 0 : fail(r, label(d), call, NULL);
}

int gr_ze_copy(gr_ze_t *ze, unsigned i, void *dst, const void *src, size_t size)
{
    return run_imm(ze, i, 1, dst, src, 0, size, "gr_ze_copy");
}

int gr_ze_fill(gr_ze_t *ze, unsigned i, void *dst, uint8_t byte, size_t size)
{
    return run_imm(ze, i, 0, dst, NULL, byte, size, "gr_ze_fill");
}

/* ---- event pools -------------------------------------------------------------------------- */

static void pool_count(gr_ze_t *ze, int delta)
{
    pthread_mutex_lock(&ze->lock);
    ze->n_pools += (unsigned)delta;
    pthread_mutex_unlock(&ze->lock);
}

/* Creates the count events of pool p; on failure destroys those made and returns the error. */
static int make_events(gr_ze_event_pool_t *p)
{
    for (uint32_t k = 0; k < p->count; k++) {
        ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                              .index = k,
                              .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                              .wait = ZE_EVENT_SCOPE_FLAG_HOST};
        ze_result_t r = zeEventCreate(p->h, &ed, &p->ev[k]);
        if (r != ZE_RESULT_SUCCESS) {
            for (uint32_t j = 0; j < k; j++)
                zeEventDestroy(p->ev[j]);
            return fail(r, label(p->dev), "zeEventCreate", NULL);
        }
    }
    return 0;
}

static int pool_args(const gr_ze_t *ze, unsigned i, uint32_t count, const void *out, const char *fn)
{
    int err = check_dev(ze, i, fn);
    if (err != 0)
        return err;
    if (out == NULL)
        return gr__set_errorf(GR_EINVAL, "%s: NULL argument", fn);
    if (count == 0 || count > GR_ZE_EVENTS_MAX)
        return gr__set_errorf(GR_EINVAL, "%s: %u events: a pool holds 1 to %u", fn, count,
                              GR_ZE_EVENTS_MAX);
    if (!ze->dev[i].drv->ipc_pool)
        return no_ipc(&ze->dev[i], "event-pool", "zeDriverGetIpcProperties",
                      ZE_RESULT_ERROR_UNSUPPORTED_FEATURE);
    return 0;
}

int gr_ze_event_pool_create(gr_ze_t *ze, unsigned i, uint32_t count, gr_ze_event_pool_t **out,
                            int *fd, gr_ze_ipc_t *ipc)
{
    int err = pool_args(ze, i, count, out, "gr_ze_event_pool_create");
    if (err != 0)
        return err;
    if (fd == NULL || ipc == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_event_pool_create: NULL fd or ipc");
    zdev_t *d = &ze->dev[i];
    gr_ze_event_pool_t *p = calloc(1, sizeof(*p) + count * sizeof(p->ev[0]));
    if (p == NULL)
        return gr__set_error(GR_ENOMEM, "gr_ze_event_pool_create: out of host memory");
    p->ze = ze;
    p->dev = d;
    p->count = count;
    ze_event_pool_desc_t pd = {.stype = ZE_STRUCTURE_TYPE_EVENT_POOL_DESC,
                               .flags = ZE_EVENT_POOL_FLAG_IPC | ZE_EVENT_POOL_FLAG_HOST_VISIBLE,
                               .count = count};
    ze_result_t r = zeEventPoolCreate(d->drv->ctx, &pd, 1, &d->h, &p->h);
    if (r != ZE_RESULT_SUCCESS) {
        free(p);
        return fail(r, label(d), "zeEventPoolCreate", NULL);
    }
    if ((r = zeEventPoolGetIpcHandle(p->h, &p->ipc)) != ZE_RESULT_SUCCESS) {
        zeEventPoolDestroy(p->h);
        free(p);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
            return no_ipc(d, "event-pool", "zeEventPoolGetIpcHandle", r);
        return fail(r, label(d), "zeEventPoolGetIpcHandle", NULL);
    }
    int hfd = handle_fd(p->ipc.data);
    int own = fd_is_open(hfd) ? fcntl(hfd, F_DUPFD_CLOEXEC, 0) : -1;
    if (own < 0) {
        if (d->drv->pool_put != NULL)
            d->drv->pool_put((ze_context_handle_t)d->drv->raw_ctx, p->ipc);
        zeEventPoolDestroy(p->h);
        free(p);
        return gr__set_errorf(GR_EUNSUPPORTED,
                              "gr_ze_event_pool_create: %s: the event-pool IPC handle of %s "
                              "carries no fd open in this process: pools cannot be shared on it",
                              d->info.device, drv_label(d->drv));
    }
    if ((err = make_events(p)) != 0) {
        close(own);
        if (d->drv->pool_put != NULL)
            d->drv->pool_put((ze_context_handle_t)d->drv->raw_ctx, p->ipc);
        zeEventPoolDestroy(p->h);
        free(p);
        return err;
    }
    pool_count(ze, 1);
    memcpy(ipc->data, p->ipc.data, GR_ZE_IPC_SIZE);
    *fd = own;
    *out = p;
    return 0;
}

int gr_ze_event_pool_open(gr_ze_t *ze, unsigned i, const gr_ze_ipc_t *ipc, int fd, uint32_t count,
                          gr_ze_event_pool_t **out)
{
    int err = pool_args(ze, i, count, out, "gr_ze_event_pool_open");
    if (err != 0)
        return err;
    zdev_t *d = &ze->dev[i];
    if (ipc == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_event_pool_open: NULL ipc");
    if (!fd_is_open(fd))
        return gr__set_errorf(GR_EINVAL,
                              "gr_ze_event_pool_open: %s: fd %d is not open in this process: pass "
                              "the fd received with SCM_RIGHTS",
                              d->info.device, fd);
    gr_ze_event_pool_t *p = calloc(1, sizeof(*p) + count * sizeof(p->ev[0]));
    if (p == NULL)
        return gr__set_error(GR_ENOMEM, "gr_ze_event_pool_open: out of host memory");
    p->ze = ze;
    p->dev = d;
    p->count = count;
    p->opened = 1;
    ze_ipc_event_pool_handle_t h;
    memcpy(h.data, ipc->data, GR_ZE_IPC_SIZE);
    set_handle_fd(h.data, fd);
    ze_result_t r = zeEventPoolOpenIpcHandle(d->drv->ctx, h, &p->h);
    if (r != ZE_RESULT_SUCCESS) {
        free(p);
        if (r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE)
            return no_ipc(d, "event-pool", "zeEventPoolOpenIpcHandle", r);
        return fail(r, label(d), "zeEventPoolOpenIpcHandle", NULL);
    }
    if ((err = make_events(p)) != 0) {
        zeEventPoolCloseIpcHandle(p->h);
        free(p);
        return err;
    }
    pool_count(ze, 1);
    *out = p;
    return 0;
}

uint32_t gr_ze_event_pool_count(const gr_ze_event_pool_t *pool)
{
    return pool ? pool->count : 0;
}

int gr_ze_event_pool_close(gr_ze_event_pool_t *p)
{
    if (p == NULL)
        return 0;
    gr_ze_t *ze = p->ze;
    zdev_t *d = p->dev;
    for (uint32_t k = 0; k < p->count; k++)
        zeEventDestroy(p->ev[k]);
    int err = 0;
    ze_result_t r;
    if (p->opened) {
        if ((r = zeEventPoolCloseIpcHandle(p->h)) != ZE_RESULT_SUCCESS)
            err = fail(r, label(d), "zeEventPoolCloseIpcHandle", NULL);
    } else {
        if (d->drv->pool_put != NULL && (r = d->drv->pool_put((ze_context_handle_t)d->drv->raw_ctx,
                                                              p->ipc)) != ZE_RESULT_SUCCESS)
            err = fail(r, label(d), "zeEventPoolPutIpcHandle",
                       "the IPC handle was not released; the pool is destroyed");
        if ((r = zeEventPoolDestroy(p->h)) != ZE_RESULT_SUCCESS && err == 0)
            err = fail(r, label(d), "zeEventPoolDestroy", NULL);
    }
    free(p);
    pool_count(ze, -1);
    return err;
}

static int event_arg(const gr_ze_event_pool_t *p, uint32_t idx, const char *fn)
{
    if (p == NULL)
        return gr__set_errorf(GR_EINVAL, "%s: NULL pool", fn);
    if (idx >= p->count)
        return gr__set_errorf(GR_EINVAL, "%s: %s: event %u of a pool of %u", fn,
                              p->dev->info.device, idx, p->count);
    return 0;
}

int gr_ze_event_signal(gr_ze_event_pool_t *p, uint32_t idx)
{
    int err = event_arg(p, idx, "gr_ze_event_signal");
    if (err != 0)
        return err;
    ze_result_t r = zeEventHostSignal(p->ev[idx]);
    return r == ZE_RESULT_SUCCESS ? 0 : fail(r, label(p->dev), "zeEventHostSignal", NULL);
}

int gr_ze_events_signal_all(gr_ze_event_pool_t *p)
{
    if (p == NULL)
        return gr__set_error(GR_EINVAL, "gr_ze_events_signal_all: NULL pool");
    int first = 0;
    for (uint32_t k = 0; k < p->count; k++) {
        ze_result_t r = zeEventHostSignal(p->ev[k]);
        if (r != ZE_RESULT_SUCCESS && first == 0)
            first = fail(r, label(p->dev), "zeEventHostSignal", NULL);
    }
    return first;
}

int gr_ze_event_reset(gr_ze_event_pool_t *p, uint32_t idx)
{
    int err = event_arg(p, idx, "gr_ze_event_reset");
    if (err != 0)
        return err;
    ze_result_t r = zeEventHostReset(p->ev[idx]);
    return r == ZE_RESULT_SUCCESS ? 0 : fail(r, label(p->dev), "zeEventHostReset", NULL);
}

int gr_ze_event_query(gr_ze_event_pool_t *p, uint32_t idx)
{
    int err = event_arg(p, idx, "gr_ze_event_query");
    if (err != 0)
        return err;
    ze_result_t r = zeEventQueryStatus(p->ev[idx]);
    if (r == ZE_RESULT_SUCCESS)
        return 1;
    if (r == ZE_RESULT_NOT_READY)
        return 0;
    return fail(r, label(p->dev), "zeEventQueryStatus", NULL);
}

int gr_ze_event_wait(gr_ze_event_pool_t *p, uint32_t idx, uint64_t timeout_ns)
{
    int err = event_arg(p, idx, "gr_ze_event_wait");
    if (err != 0)
        return err;
    ze_result_t r = zeEventHostSynchronize(p->ev[idx], timeout_ns);
    if (r == ZE_RESULT_SUCCESS)
        return 0;
    if (r == ZE_RESULT_NOT_READY)
        return gr__set_errorf(GR_ETIMEDOUT,
                              "gr_ze_event_wait: %s: event %u not signalled within %" PRIu64 " ns",
                              p->dev->info.device, idx, timeout_ns);
    return fail(r, label(p->dev), "zeEventHostSynchronize", NULL);
}
