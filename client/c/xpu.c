/*
 * The xpu row: device regions on Intel GPUs through Level Zero, in this process's own context.
 * The loader (GRAPHD_ZE_LOADER, libze_loader.so.1 of Debian's libze1) is loaded with dlopen the
 * first time an xpu region is mapped, so libgraphd neither links Level Zero nor calls zeInit for
 * host regions. xpu:N counts the GPU devices of every driver as the daemon does
 * (graph_runtime/ze_layer.c): drivers in zeDriverGet order, GPU devices in zeDeviceGet order. One
 * context per driver; one synchronous immediate command list per device for the copies of
 * graphd_region_read/write, serialised by the device's mutex (a command list is not thread-safe).
 *
 * IPC (proto/graphd_frame.h, MAP): the daemon sends the 64 bytes of its zeMemGetIpcHandle and the
 * allocation's fd with SCM_RIGHTS; the fd number received here goes into the handle's first 4
 * bytes before zeMemOpenIpcHandle. The region keeps the fd until zeMemCloseIpcHandle.
 *
 * Events (graphd_events_open): the session's Level Zero IPC event pool on an xpu device, made by
 * the daemon (EVENTS frame: its handle, the count in arg, the pool's fd with SCM_RIGHTS, written
 * into the handle's first 4 bytes as for memory) and opened here with zeEventPoolOpenIpcHandle,
 * its events created here by index. The daemon host-signals every one when the session ends, so a
 * wait here never outlives the session. There is no xpu graph family to order replays against:
 * the row's replay_ordered is NULL.
 */
#include <dlfcn.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <level_zero/ze_api.h>

#include "graphd_int.h"

#define XPU_MAX GRAPHD_DEVICE_INDEX_MAX + 1

typedef struct xdev {
    ze_device_handle_t h;
    ze_context_handle_t ctx; /* its driver's */
    unsigned driver;         /* index in zeDriverGet order */
    uint32_t driver_version;
    uint32_t copy_ordinal;
    char name[ZE_MAX_DEVICE_NAME];
    pthread_mutex_t lock; /* imm */
    ze_command_list_handle_t imm;
} xdev_t;

static struct {
    pthread_once_t once;
    int err; /* GRAPHD_OK once loaded; else the error and message below */
    char error[512];
    ze_result_t(ZE_APICALL *init)(ze_init_flags_t);
    ze_result_t(ZE_APICALL *driver_get)(uint32_t *, ze_driver_handle_t *);
    ze_result_t(ZE_APICALL *driver_props)(ze_driver_handle_t, ze_driver_properties_t *);
    ze_result_t(ZE_APICALL *device_get)(ze_driver_handle_t, uint32_t *, ze_device_handle_t *);
    ze_result_t(ZE_APICALL *device_props)(ze_device_handle_t, ze_device_properties_t *);
    ze_result_t(ZE_APICALL *queue_groups)(ze_device_handle_t, uint32_t *,
                                          ze_command_queue_group_properties_t *);
    ze_result_t(ZE_APICALL *context_create)(ze_driver_handle_t, const ze_context_desc_t *,
                                            ze_context_handle_t *);
    ze_result_t(ZE_APICALL *open_ipc)(ze_context_handle_t, ze_device_handle_t, ze_ipc_mem_handle_t,
                                      ze_ipc_memory_flags_t, void **);
    ze_result_t(ZE_APICALL *close_ipc)(ze_context_handle_t, const void *);
    ze_result_t(ZE_APICALL *address_range)(ze_context_handle_t, const void *, void **, size_t *);
    ze_result_t(ZE_APICALL *list_immediate)(ze_context_handle_t, ze_device_handle_t,
                                            const ze_command_queue_desc_t *,
                                            ze_command_list_handle_t *);
    ze_result_t(ZE_APICALL *append_copy)(ze_command_list_handle_t, void *, const void *, size_t,
                                         ze_event_handle_t, uint32_t, ze_event_handle_t *);
    /* events (graphd_events_*) */
    ze_result_t(ZE_APICALL *pool_open_ipc)(ze_context_handle_t, ze_ipc_event_pool_handle_t,
                                           ze_event_pool_handle_t *);
    ze_result_t(ZE_APICALL *pool_close_ipc)(ze_event_pool_handle_t);
    ze_result_t(ZE_APICALL *event_create)(ze_event_pool_handle_t, const ze_event_desc_t *,
                                          ze_event_handle_t *);
    ze_result_t(ZE_APICALL *event_destroy)(ze_event_handle_t);
    ze_result_t(ZE_APICALL *event_signal)(ze_event_handle_t);
    ze_result_t(ZE_APICALL *event_sync)(ze_event_handle_t, uint64_t);
    ze_result_t(ZE_APICALL *event_query)(ze_event_handle_t);
    ze_result_t(ZE_APICALL *event_reset)(ze_event_handle_t);
    unsigned ndrivers;
    unsigned ndev;
    xdev_t dev[XPU_MAX];
} ze = {.once = PTHREAD_ONCE_INIT};

static const char *result_name(ze_result_t r)
{
    switch (r) {
    case ZE_RESULT_SUCCESS:
        return "ZE_RESULT_SUCCESS";
    case ZE_RESULT_ERROR_UNINITIALIZED:
        return "ZE_RESULT_ERROR_UNINITIALIZED";
    case ZE_RESULT_ERROR_DEVICE_LOST:
        return "ZE_RESULT_ERROR_DEVICE_LOST";
    case ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY:
        return "ZE_RESULT_ERROR_OUT_OF_HOST_MEMORY";
    case ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY:
        return "ZE_RESULT_ERROR_OUT_OF_DEVICE_MEMORY";
    case ZE_RESULT_ERROR_UNSUPPORTED_FEATURE:
        return "ZE_RESULT_ERROR_UNSUPPORTED_FEATURE";
    case ZE_RESULT_ERROR_INVALID_ARGUMENT:
        return "ZE_RESULT_ERROR_INVALID_ARGUMENT";
    case ZE_RESULT_ERROR_INVALID_NULL_HANDLE:
        return "ZE_RESULT_ERROR_INVALID_NULL_HANDLE";
    case ZE_RESULT_ERROR_INVALID_NULL_POINTER:
        return "ZE_RESULT_ERROR_INVALID_NULL_POINTER";
    default:
        return "a Level Zero error";
    }
}

static void *sym(void *h, const char *name, int *missing)
{
    void *f = dlsym(h, name);
    if (f == NULL && *missing == 0) {
        *missing = 1;
        snprintf(ze.error, sizeof(ze.error),
                 "the Level Zero loader lacks %s: install a libze1 of spec 1.0 or later", name);
    }
    return f;
}

static void load_fail(int err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void load_fail(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    ze.err = err;
    vsnprintf(ze.error, sizeof(ze.error), fmt, ap);
    va_end(ap);
}

/* Loads the loader, calls zeInit and lists the GPU devices; ze.err says how it went. */
static void load(void)
{
    char path[GRAPHD__SETTING_MAX], why[256];
    if (graphd__setting("GRAPHD_ZE_LOADER", path, sizeof(path), why, sizeof(why)) != GRAPHD_OK) {
        ze.err = GRAPHD_EINVALID_ARGUMENT;
        snprintf(ze.error, sizeof(ze.error), "%s", why);
        return;
    }
    void *h = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (h == NULL) {
        const char *e = dlerror();
        ze.err = GRAPHD_EFAILED_PRECONDITION;
        snprintf(ze.error, sizeof(ze.error),
                 "cannot load the Level Zero loader %.200s (install the libze1 package, or set "
                 "GRAPHD_ZE_LOADER): %.200s",
                 path, e != NULL ? e : "not found");
        return;
    }
    int missing = 0;
    ze.init = (ze_result_t(ZE_APICALL *)(ze_init_flags_t))sym(h, "zeInit", &missing);
    ze.driver_get = (ze_result_t(ZE_APICALL *)(uint32_t *, ze_driver_handle_t *))sym(
        h, "zeDriverGet", &missing);
    ze.driver_props = (ze_result_t(ZE_APICALL *)(ze_driver_handle_t, ze_driver_properties_t *))sym(
        h, "zeDriverGetProperties", &missing);
    ze.device_get = (ze_result_t(ZE_APICALL *)(
        ze_driver_handle_t, uint32_t *, ze_device_handle_t *))sym(h, "zeDeviceGet", &missing);
    ze.device_props = (ze_result_t(ZE_APICALL *)(ze_device_handle_t, ze_device_properties_t *))sym(
        h, "zeDeviceGetProperties", &missing);
    ze.queue_groups = (ze_result_t(ZE_APICALL *)(ze_device_handle_t, uint32_t *,
                                                 ze_command_queue_group_properties_t *))
        sym(h, "zeDeviceGetCommandQueueGroupProperties", &missing);
    ze.context_create =
        (ze_result_t(ZE_APICALL *)(ze_driver_handle_t, const ze_context_desc_t *,
                                   ze_context_handle_t *))sym(h, "zeContextCreate", &missing);
    ze.open_ipc = (ze_result_t(ZE_APICALL *)(ze_context_handle_t, ze_device_handle_t,
                                             ze_ipc_mem_handle_t, ze_ipc_memory_flags_t,
                                             void **))sym(h, "zeMemOpenIpcHandle", &missing);
    ze.close_ipc = (ze_result_t(ZE_APICALL *)(ze_context_handle_t, const void *))sym(
        h, "zeMemCloseIpcHandle", &missing);
    ze.address_range =
        (ze_result_t(ZE_APICALL *)(ze_context_handle_t, const void *, void **, size_t *))sym(
            h, "zeMemGetAddressRange", &missing);
    ze.list_immediate = (ze_result_t(ZE_APICALL *)(
        ze_context_handle_t, ze_device_handle_t, const ze_command_queue_desc_t *,
        ze_command_list_handle_t *))sym(h, "zeCommandListCreateImmediate", &missing);
    ze.append_copy = (ze_result_t(ZE_APICALL *)(
        ze_command_list_handle_t, void *, const void *, size_t, ze_event_handle_t, uint32_t,
        ze_event_handle_t *))sym(h, "zeCommandListAppendMemoryCopy", &missing);
    ze.pool_open_ipc =
        (ze_result_t(ZE_APICALL *)(ze_context_handle_t, ze_ipc_event_pool_handle_t,
                                   ze_event_pool_handle_t *))sym(h, "zeEventPoolOpenIpcHandle",
                                                                 &missing);
    ze.pool_close_ipc = (ze_result_t(ZE_APICALL *)(ze_event_pool_handle_t))sym(
        h, "zeEventPoolCloseIpcHandle", &missing);
    ze.event_create =
        (ze_result_t(ZE_APICALL *)(ze_event_pool_handle_t, const ze_event_desc_t *,
                                   ze_event_handle_t *))sym(h, "zeEventCreate", &missing);
    ze.event_destroy =
        (ze_result_t(ZE_APICALL *)(ze_event_handle_t))sym(h, "zeEventDestroy", &missing);
    ze.event_signal =
        (ze_result_t(ZE_APICALL *)(ze_event_handle_t))sym(h, "zeEventHostSignal", &missing);
    ze.event_sync = (ze_result_t(ZE_APICALL *)(ze_event_handle_t, uint64_t))sym(
        h, "zeEventHostSynchronize", &missing);
    ze.event_query =
        (ze_result_t(ZE_APICALL *)(ze_event_handle_t))sym(h, "zeEventQueryStatus", &missing);
    ze.event_reset =
        (ze_result_t(ZE_APICALL *)(ze_event_handle_t))sym(h, "zeEventHostReset", &missing);
    if (missing) {
        ze.err = GRAPHD_EFAILED_PRECONDITION;
        return;
    }
    ze_result_t r = ze.init(ZE_INIT_FLAG_GPU_ONLY);
    if (r != ZE_RESULT_SUCCESS) {
        /* Nothing else may be called now: the loader may have unloaded the driver. */
        load_fail(GRAPHD_EFAILED_PRECONDITION,
                  "no Level Zero driver in this process: zeInit answered %s (0x%x); install "
                  "Intel's GPU driver (intel-level-zero-gpu) and check access to /dev/dri",
                  result_name(r), (unsigned)r);
        return;
    }
    uint32_t nd = 0;
    if ((r = ze.driver_get(&nd, NULL)) != ZE_RESULT_SUCCESS) {
        load_fail(GRAPHD_EFAILED_PRECONDITION, "zeDriverGet%s: %s (0x%x)", "", result_name(r),
                  (unsigned)r);
        return;
    }
    ze_driver_handle_t drivers[16];
    if (nd > 16)
        nd = 16;
    if (nd > 0 && (r = ze.driver_get(&nd, drivers)) != ZE_RESULT_SUCCESS) {
        load_fail(GRAPHD_EFAILED_PRECONDITION, "zeDriverGet%s: %s (0x%x)", "", result_name(r),
                  (unsigned)r);
        return;
    }
    ze.ndrivers = nd;
    for (unsigned k = 0; k < nd; k++) {
        uint32_t cnt = 0;
        char what[64];
        snprintf(what, sizeof(what), " of Level Zero driver %u", k);
        if ((r = ze.device_get(drivers[k], &cnt, NULL)) != ZE_RESULT_SUCCESS) {
            load_fail(GRAPHD_EFAILED_PRECONDITION, "zeDeviceGet%s: %s (0x%x)", what, result_name(r),
                      (unsigned)r);
            return;
        }
        ze_device_handle_t *devs = calloc(cnt ? cnt : 1, sizeof(*devs));
        if (devs == NULL) {
            ze.err = GRAPHD_ENOMEM;
            snprintf(ze.error, sizeof(ze.error), "out of memory");
            return;
        }
        if (cnt > 0 && (r = ze.device_get(drivers[k], &cnt, devs)) != ZE_RESULT_SUCCESS) {
            free(devs);
            load_fail(GRAPHD_EFAILED_PRECONDITION, "zeDeviceGet%s: %s (0x%x)", what, result_name(r),
                      (unsigned)r);
            return;
        }
        unsigned first = ze.ndev;
        for (uint32_t j = 0; j < cnt && ze.ndev < XPU_MAX; j++) {
            ze_device_properties_t p = {.stype = ZE_STRUCTURE_TYPE_DEVICE_PROPERTIES};
            if ((r = ze.device_props(devs[j], &p)) != ZE_RESULT_SUCCESS) {
                free(devs);
                load_fail(GRAPHD_EFAILED_PRECONDITION, "zeDeviceGetProperties%s: %s (0x%x)", what,
                          result_name(r), (unsigned)r);
                return;
            }
            if (p.type != ZE_DEVICE_TYPE_GPU)
                continue;
            xdev_t *d = &ze.dev[ze.ndev++];
            d->h = devs[j];
            d->driver = k;
            snprintf(d->name, sizeof(d->name), "%s", p.name);
            pthread_mutex_init(&d->lock, NULL);
            /* Copies go to the first queue group that copies (compute groups do too). */
            uint32_t ng = 0;
            if (ze.queue_groups(d->h, &ng, NULL) == ZE_RESULT_SUCCESS && ng > 0) {
                ze_command_queue_group_properties_t *gp = calloc(ng, sizeof(*gp));
                for (uint32_t g = 0; gp != NULL && g < ng; g++)
                    gp[g].stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_GROUP_PROPERTIES;
                if (gp != NULL && ze.queue_groups(d->h, &ng, gp) == ZE_RESULT_SUCCESS)
                    for (uint32_t g = 0; g < ng; g++)
                        if (gp[g].flags & ZE_COMMAND_QUEUE_GROUP_PROPERTY_FLAG_COPY) {
                            d->copy_ordinal = g;
                            break;
                        }
                free(gp);
            }
        }
        free(devs);
        if (ze.ndev == first)
            continue; /* a driver without GPU devices gets no context */
        ze_driver_properties_t dp = {.stype = ZE_STRUCTURE_TYPE_DRIVER_PROPERTIES};
        uint32_t version =
            ze.driver_props(drivers[k], &dp) == ZE_RESULT_SUCCESS ? dp.driverVersion : 0;
        ze_context_desc_t cd = {.stype = ZE_STRUCTURE_TYPE_CONTEXT_DESC};
        ze_context_handle_t ctx = NULL;
        if ((r = ze.context_create(drivers[k], &cd, &ctx)) != ZE_RESULT_SUCCESS) {
            load_fail(GRAPHD_EFAILED_PRECONDITION, "zeContextCreate%s: %s (0x%x)", what,
                      result_name(r), (unsigned)r);
            return;
        }
        for (unsigned j = first; j < ze.ndev; j++) {
            ze.dev[j].ctx = ctx;
            ze.dev[j].driver_version = version;
        }
    }
    ze.err = GRAPHD_OK;
}

/* The device xpu:index after loading, or an error naming what to change. */
static int device_of(graphd_client_t *c, int index, xdev_t **out)
{
    pthread_once(&ze.once, load);
    if (ze.err != GRAPHD_OK)
        return graphd__fail(c, ze.err, "xpu region: %s", ze.error);
    if (index < 0 || (unsigned)index >= ze.ndev)
        return graphd__fail(c, GRAPHD_ENOT_FOUND,
                            "xpu:%d: this process sees %u Level Zero GPU device%s (%u driver%s); "
                            "run it where the daemon's device is visible, with the same "
                            "ZE_AFFINITY_MASK and ZE_ENABLE_ALT_DRIVERS as the daemon",
                            index, ze.ndev, ze.ndev == 1 ? "" : "s", ze.ndrivers,
                            ze.ndrivers == 1 ? "" : "s");
    *out = &ze.dev[index];
    return GRAPHD_OK;
}

static int xpu_open(graphd_client_t *c, int index, const uint8_t *handle, int *fd, uint64_t size,
                    void **ptr)
{
    if (index < 0)
        return graphd__fail(c, GRAPHD_EPROTO,
                            "an xpu region's MAP reply needs the region's device named");
    if (*fd < 0)
        return graphd__fail(c, GRAPHD_EPROTO,
                            "MAP reply for a region on xpu:%d without its descriptor (the "
                            "allocation's fd comes with the IPC handle)",
                            index);
    xdev_t *d;
    int rc = device_of(c, index, &d);
    if (rc != GRAPHD_OK)
        return rc;
    ze_ipc_mem_handle_t h;
    memcpy(h.data, handle, sizeof(h.data));
    int32_t v = *fd;
    memcpy(h.data, &v, sizeof(v)); /* the number of the fd received here */
    void *p = NULL;
    ze_result_t r = ze.open_ipc(d->ctx, d->h, h, 0, &p);
    if (r != ZE_RESULT_SUCCESS)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                            "zeMemOpenIpcHandle on xpu:%d (%s) of Level Zero driver %u (version "
                            "0x%x): %s (0x%x)%s",
                            index, d->name, d->driver, d->driver_version, result_name(r),
                            (unsigned)r,
                            r == ZE_RESULT_ERROR_UNSUPPORTED_FEATURE
                                ? ": this driver does not share memory between processes"
                                : "");
    size_t got = 0;
    if (ze.address_range(d->ctx, p, NULL, &got) == ZE_RESULT_SUCCESS && got < size) {
        (void)ze.close_ipc(d->ctx, p);
        return graphd__fail(c, GRAPHD_EPROTO,
                            "xpu:%d: the allocation mapped is %zu bytes, the daemon said %llu",
                            index, got, (unsigned long long)size);
    }
    *ptr = p;
    return GRAPHD_OK; /* *fd stays the region's until close */
}

static void xpu_close(int index, void *ptr)
{
    if (ptr == NULL || index < 0 || (unsigned)index >= ze.ndev)
        return;
    /* Copies here are synchronous: nothing of this process is still queued on ptr. */
    (void)ze.close_ipc(ze.dev[index].ctx, ptr);
}

static int xpu_copy(graphd_client_t *c, int index, void *dev, void *host, size_t n, int to_device)
{
    xdev_t *d;
    int rc = device_of(c, index, &d);
    if (rc != GRAPHD_OK)
        return rc;
    pthread_mutex_lock(&d->lock);
    const char *call = "zeCommandListCreateImmediate";
    ze_result_t r = ZE_RESULT_SUCCESS;
    if (d->imm == NULL) {
        ze_command_queue_desc_t qd = {.stype = ZE_STRUCTURE_TYPE_COMMAND_QUEUE_DESC,
                                      .ordinal = d->copy_ordinal,
                                      .mode = ZE_COMMAND_QUEUE_MODE_SYNCHRONOUS};
        r = ze.list_immediate(d->ctx, d->h, &qd, &d->imm);
        if (r != ZE_RESULT_SUCCESS)
            d->imm = NULL;
    }
    if (r == ZE_RESULT_SUCCESS) {
        call = "zeCommandListAppendMemoryCopy";
        r = to_device ? ze.append_copy(d->imm, dev, host, n, NULL, 0, NULL)
                      : ze.append_copy(d->imm, host, dev, n, NULL, 0, NULL);
    }
    pthread_mutex_unlock(&d->lock);
    if (r != ZE_RESULT_SUCCESS)
        return graphd__fail(
            c, GRAPHD_EFAILED_PRECONDITION, "%s %s xpu:%d (%s, %zu bytes): %s (0x%x)", call,
            to_device ? "to" : "from", index, d->name, n, result_name(r), (unsigned)r);
    return GRAPHD_OK;
}

/* ---- events -------------------------------------------------------------------------------- */

struct graphd_events {
    graphd_client_t *client; /* a reference, for errors */
    int index;               /* xpu:index */
    int fd;                  /* the pool's, kept until zeEventPoolCloseIpcHandle */
    ze_event_pool_handle_t pool;
    uint32_t count;
    ze_event_handle_t ev[];
};

static void events_free(graphd_events_t *e)
{
    for (uint32_t k = 0; k < e->count; k++)
        if (e->ev[k] != NULL)
            (void)ze.event_destroy(e->ev[k]);
    if (e->pool != NULL)
        (void)ze.pool_close_ipc(e->pool);
    if (e->fd >= 0)
        close(e->fd);
    graphd__client_unref(e->client);
    free(e);
}

int graphd_events_open(graphd_client_t *c, const char *device, unsigned count,
                       graphd_events_t **out)
{
    if (c == NULL)
        return graphd__fail_thread(GRAPHD_EINVALID_ARGUMENT, "graphd_events_open: NULL client");
    c->last_error[0] = '\0';
    if (out == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    int index = -1;
    const graphd__kind_t *kind = graphd__kind_of(device, &index);
    if (kind == NULL || device == NULL || strchr(device, ':') == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "events on '%s': name an xpu device, as \"xpu:0\"",
                            device != NULL ? device : "(null)");
    if (kind != &graphd__kind_xpu)
        return graphd__fail(c, GRAPHD_EUNIMPLEMENTED,
                            "events on %s: graphd_events_* are for xpu devices; on cuda, "
                            "graphd_replay_stream orders replays by the stream",
                            device);
    if (count > GRAPHD_EVENTS_MAX)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "%u events on %s: at most %d in one session's pool", count, device,
                            GRAPHD_EVENTS_MAX);
    if (c->session_id == 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "no session: call graphd_hello first");
    xdev_t *d;
    int rc = device_of(c, index, &d);
    if (rc != GRAPHD_OK)
        return rc;
    uint8_t handle[GRAPHD__IPC_HANDLE_SIZE];
    size_t len = sizeof(handle);
    uint64_t got = 0;
    int fd = -1;
    rc = graphd__dp_exchange(c, GRAPHD_FRAME_EVENTS, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, index),
                             count, NULL, 0, &got, &fd, handle, &len);
    if (rc != GRAPHD_OK)
        return rc;
    if (len != sizeof(handle) || fd < 0 || got == 0 || got > GRAPHD_EVENTS_MAX ||
        (count != 0 && got != count)) {
        if (fd >= 0)
            close(fd);
        return graphd__fail(c, GRAPHD_EPROTO,
                            "EVENTS reply for %s with %zu bytes of handle, %s descriptor and %llu "
                            "events (asked %u)",
                            device, len, fd >= 0 ? "a" : "no", (unsigned long long)got, count);
    }
    graphd_events_t *e = calloc(1, sizeof(*e) + (size_t)got * sizeof(e->ev[0]));
    if (e == NULL) {
        close(fd);
        return graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
    }
    graphd__client_ref(c);
    e->client = c;
    e->index = index;
    e->fd = fd;
    ze_ipc_event_pool_handle_t h;
    memcpy(h.data, handle, sizeof(h.data));
    int32_t v = fd;
    memcpy(h.data, &v, sizeof(v)); /* the number of the fd received here */
    ze_result_t r = ze.pool_open_ipc(d->ctx, h, &e->pool);
    if (r != ZE_RESULT_SUCCESS) {
        e->pool = NULL;
        rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                          "zeEventPoolOpenIpcHandle on %s (%s) of Level Zero driver %u (version "
                          "0x%x): %s (0x%x)",
                          device, d->name, d->driver, d->driver_version, result_name(r),
                          (unsigned)r);
        events_free(e);
        return rc;
    }
    for (uint32_t k = 0; k < (uint32_t)got; k++) {
        ze_event_desc_t ed = {.stype = ZE_STRUCTURE_TYPE_EVENT_DESC,
                              .index = k,
                              .signal = ZE_EVENT_SCOPE_FLAG_HOST,
                              .wait = ZE_EVENT_SCOPE_FLAG_HOST};
        r = ze.event_create(e->pool, &ed, &e->ev[k]);
        if (r != ZE_RESULT_SUCCESS) {
            e->ev[k] = NULL;
            e->count = k;
            rc = graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "zeEventCreate %u on %s: %s (0x%x)",
                              k, device, result_name(r), (unsigned)r);
            events_free(e);
            return rc;
        }
        e->count = k + 1;
    }
    *out = e;
    return GRAPHD_OK;
}

unsigned graphd_events_count(const graphd_events_t *e)
{
    return e != NULL ? e->count : 0;
}

/* The checks of every per-event call; 0 or an error on e's client. */
static int event_arg(graphd_events_t *e, unsigned k, const char *fn)
{
    if (e == NULL)
        return graphd__fail_thread(GRAPHD_EINVALID_ARGUMENT, "%s: NULL events", fn);
    e->client->last_error[0] = '\0';
    if (k >= e->count)
        return graphd__fail(e->client, GRAPHD_EINVALID_ARGUMENT,
                            "%s: event %u of xpu:%d's %u events", fn, k, e->index, e->count);
    return GRAPHD_OK;
}

static int event_fail(graphd_events_t *e, unsigned k, const char *call, ze_result_t r)
{
    return graphd__fail(
        e->client,
        r == ZE_RESULT_ERROR_DEVICE_LOST ? GRAPHD_EUNAVAILABLE : GRAPHD_EFAILED_PRECONDITION,
        "%s of event %u on xpu:%d: %s (0x%x)", call, k, e->index, result_name(r), (unsigned)r);
}

/* A host operation on event k: signal or reset. */
static int event_op(graphd_events_t *e, unsigned k, const char *fn, const char *call,
                    ze_result_t(ZE_APICALL *op)(ze_event_handle_t))
{
    int rc = event_arg(e, k, fn);
    if (rc != GRAPHD_OK)
        return rc;
    ze_result_t r = op(e->ev[k]);
    return r == ZE_RESULT_SUCCESS ? GRAPHD_OK : event_fail(e, k, call, r);
}

int graphd_events_signal(graphd_events_t *e, unsigned k)
{
    return event_op(e, k, "graphd_events_signal", "zeEventHostSignal", ze.event_signal);
}

int graphd_events_reset(graphd_events_t *e, unsigned k)
{
    return event_op(e, k, "graphd_events_reset", "zeEventHostReset", ze.event_reset);
}

int graphd_events_query(graphd_events_t *e, unsigned k)
{
    int rc = event_arg(e, k, "graphd_events_query");
    if (rc != GRAPHD_OK)
        return rc;
    ze_result_t r = ze.event_query(e->ev[k]);
    if (r == ZE_RESULT_SUCCESS)
        return 1;
    if (r == ZE_RESULT_NOT_READY)
        return 0;
    return event_fail(e, k, "zeEventQueryStatus", r);
}

int graphd_events_wait(graphd_events_t *e, unsigned k, uint64_t timeout_ns)
{
    int rc = event_arg(e, k, "graphd_events_wait");
    if (rc != GRAPHD_OK)
        return rc;
    ze_result_t r = ze.event_sync(e->ev[k], timeout_ns);
    if (r == ZE_RESULT_SUCCESS)
        return GRAPHD_OK;
    if (r == ZE_RESULT_NOT_READY)
        return graphd__fail(e->client, GRAPHD_EDEADLINE_EXCEEDED,
                            "event %u on xpu:%d not signalled within %llu ns", k, e->index,
                            (unsigned long long)timeout_ns);
    return event_fail(e, k, "zeEventHostSynchronize", r);
}

void graphd_events_release(graphd_events_t *e)
{
    if (e != NULL)
        events_free(e);
}

const graphd__kind_t graphd__kind_xpu = {
    .name = "xpu",
    .family = GRAPHD_DEVICE_XPU,
    .map_fd = 1,
    .open = xpu_open,
    .close = xpu_close,
    .copy = xpu_copy,
    .replay_ordered = NULL,
    .session_end = NULL,
};
