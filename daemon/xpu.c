/*
 * xpu:N devices: Intel GPUs through the Level Zero device layer (graph_runtime/ze_layer.h).
 * The layer is opened once, in main before any thread starts (it may setenv ZES_ENABLE_SYSMAN);
 * its devices join the device table at discovery. Every driver call that can take time - Sysman
 * reads, allocations, fills, frees - runs on libuv's thread pool, never on the loop: telemetry
 * is read on a timer and cached in the device table (Status shows the cache with its time), and
 * a device region is allocated and zero-filled there, then registered on the loop.
 */
#include "daemon.h"
#include "log.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define GD_XPU_TELEMETRY_MS 1000

void gd_xpu_open(gd_daemon_t *d)
{
    d->ze = NULL;
    if (d->cfg.xpu == GD_XPU_OFF) {
        gd_info("no xpu device listed: xpu = off");
        return;
    }
    char why[512] = "";
    if (gr_ze_open(&d->ze, why, sizeof why) != GR_OK) {
        d->ze = NULL;
        gd_info("no xpu device listed: %s", why);
    }
}

void gd_xpu_discover(gd_daemon_t *d)
{
    unsigned n = gr_ze_count(d->ze);
    for (unsigned i = 0; i < n; i++) {
        gr_ze_device_info_t info;
        if (gr_ze_info(d->ze, i, &info) != GR_OK)
            continue;
        if (d->ndevices >= GD_MAX_DEVICES || i > GRAPHD_DEVICE_INDEX_MAX) {
            gd_warn("device %s (%s) left out: the daemon lists at most %d devices", info.device,
                    info.name, GD_MAX_DEVICES);
            continue;
        }
        gd_device_t *dev = &d->devices[d->ndevices++];
        memset(dev, 0, sizeof *dev);
        snprintf(dev->id, sizeof dev->id, "%.31s", info.device);
        snprintf(dev->kind, sizeof dev->kind, "xpu");
        dev->ordinal = i;
        snprintf(dev->name, sizeof dev->name, "%.127s", info.name);
        dev->memory_total = info.total_bytes;
        snprintf(dev->uuid, sizeof dev->uuid, "%s", info.uuid_hex);
        dev->compute_units = info.compute_units;
        dev->max_clock_mhz = info.max_clock_mhz;
        snprintf(dev->driver, sizeof dev->driver, "Level Zero %u.%u, driver %u", info.api_major,
                 info.api_minor, info.driver_version);
        dev->telemetry = true;
    }
}

/* ---- telemetry ---------------------------------------------------------- */

typedef struct {
    uv_work_t req;
    gd_daemon_t *d;
    gr_ze_t *ze;
    size_t n;
    size_t slot[GD_MAX_DEVICES]; /* index in d->devices */
    unsigned index[GD_MAX_DEVICES];
    gr_ze_telemetry_t t[GD_MAX_DEVICES];
    int rc[GD_MAX_DEVICES];
    uint64_t at[GD_MAX_DEVICES];
} tel_job_t;

static void tel_work(uv_work_t *req)
{
    tel_job_t *j = req->data;
    for (size_t i = 0; i < j->n; i++) {
        j->rc[i] = gr_ze_telemetry(j->ze, j->index[i], &j->t[i]);
        j->at[i] = gd_now_unix_ms();
    }
}

static void tel_done(uv_work_t *req, int status)
{
    tel_job_t *j = req->data;
    gd_daemon_t *d = j->d;
    d->xpu_reading = false;
    for (size_t i = 0; status == 0 && i < j->n; i++) {
        gd_device_t *dev = &d->devices[j->slot[i]];
        if (j->rc[i] != GR_OK)
            continue;
        dev->tel = j->t[i];
        dev->tel_unix_ms = j->at[i];
        if (dev->tel.have_memory)
            dev->memory_free = dev->tel.mem_free_bytes;
        /* Once per device: these do not heal without an operator. */
        if (dev->tel.have_reset && dev->tel.wedged && !dev->warned_wedged) {
            dev->warned_wedged = true;
            gd_warn("device %s (%s) is wedged: it needs a reset before it can be used again",
                    dev->id, dev->name);
        }
        if (dev->tel.have_health && dev->tel.mem_health >= 2 && !dev->warned_health) {
            dev->warned_health = true;
            gd_warn("device %s (%s): memory health is %s", dev->id, dev->name,
                    dev->tel.mem_health_name ? dev->tel.mem_health_name : "degraded");
        }
    }
    free(j);
}

static void on_tick(uv_timer_t *t)
{
    gd_daemon_t *d = t->data;
    if (d->xpu_reading || d->stopping)
        return;
    tel_job_t *j = calloc(1, sizeof *j);
    if (j == NULL)
        return;
    j->d = d;
    j->ze = d->ze;
    for (size_t i = 0; i < d->ndevices; i++)
        if (strcmp(d->devices[i].kind, "xpu") == 0) {
            j->slot[j->n] = i;
            j->index[j->n] = d->devices[i].ordinal;
            j->n++;
        }
    j->req.data = j;
    if (j->n == 0 || uv_queue_work(d->loop, &j->req, tel_work, tel_done) != 0) {
        free(j);
        return;
    }
    d->xpu_reading = true;
}

void gd_xpu_start(gd_daemon_t *d)
{
    if (gr_ze_count(d->ze) == 0)
        return;
    uv_timer_init(d->loop, &d->xpu_tick);
    d->xpu_tick.data = d;
    d->xpu_tick_on = true;
    uv_timer_start(&d->xpu_tick, on_tick, 0, GD_XPU_TELEMETRY_MS);
}

void gd_xpu_close(gd_daemon_t *d)
{
    if (d->ze == NULL)
        return;
    int rc = gr_ze_close(d->ze);
    if (rc != GR_OK)
        gd_warn("closing Level Zero: %s", gr_last_error());
    d->ze = NULL;
}

/* ---- device memory ------------------------------------------------------ */

typedef struct {
    uv_work_t req;
    gr_ze_t *ze;
    unsigned index;
    uint64_t size;
    gd_xpu_alloc_done_fn done;
    void *ctx;
    void *ptr;
    int fd;
    gr_ze_ipc_t ipc;
    int rc;
    char msg[512];
} alloc_job_t;

static void alloc_work(uv_work_t *req)
{
    alloc_job_t *j = req->data;
    j->fd = -1;
    j->rc = gr_ze_alloc(j->ze, j->index, j->size, &j->ptr, &j->fd, &j->ipc);
    if (j->rc != GR_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", gr_last_error());
        j->ptr = NULL;
        j->fd = -1;
        return;
    }
    /* Before anyone can map it: fresh device memory may hold what another tenant left there. */
    j->rc = gr_ze_fill(j->ze, j->index, j->ptr, 0, (size_t)j->size);
    if (j->rc != GR_OK) {
        snprintf(j->msg, sizeof j->msg, "zero-filling the new memory: %s", gr_last_error());
        (void)gr_ze_free(j->ze, j->ptr);
        close(j->fd);
        j->ptr = NULL;
        j->fd = -1;
    }
}

static void alloc_after(uv_work_t *req, int status)
{
    alloc_job_t *j = req->data;
    if (status != 0 && j->rc == GR_OK && j->ptr == NULL) {
        j->rc = GR_EINTERNAL;
        snprintf(j->msg, sizeof j->msg, "the allocation was cancelled");
    }
    j->done(j->ctx, j->rc, j->msg, j->ptr, j->fd, j->ipc.data);
    free(j);
}

int gd_xpu_alloc(gd_daemon_t *d, unsigned index, uint64_t size, gd_xpu_alloc_done_fn done,
                 void *ctx)
{
    alloc_job_t *j = calloc(1, sizeof *j);
    if (j == NULL)
        return -1;
    j->ze = d->ze;
    j->index = index;
    j->size = size;
    j->done = done;
    j->ctx = ctx;
    j->fd = -1;
    j->req.data = j;
    if (uv_queue_work(d->loop, &j->req, alloc_work, alloc_after) != 0) {
        free(j);
        return -1;
    }
    return 0;
}

typedef struct {
    uv_work_t req;
    gr_ze_t *ze;
    char device[32];
    void *ptr;
    int fd;
} free_job_t;

static void free_work(uv_work_t *req)
{
    free_job_t *j = req->data;
    if (gr_ze_free(j->ze, j->ptr) != GR_OK)
        gd_warn("freeing device memory on %s: %s", j->device, gr_last_error());
    if (j->fd >= 0)
        close(j->fd);
}

static void free_after(uv_work_t *req, int status)
{
    (void)status;
    free(req->data);
}

void gd_xpu_free(gd_daemon_t *d, const char *device, void *ptr, int fd)
{
    free_job_t *j = calloc(1, sizeof *j);
    if (j != NULL) {
        j->ze = d->ze;
        snprintf(j->device, sizeof j->device, "%s", device);
        j->ptr = ptr;
        j->fd = fd;
        j->req.data = j;
        if (uv_queue_work(d->loop, &j->req, free_work, free_after) == 0)
            return;
        free(j);
    }
    /* Nothing can queue the free: do it here rather than leak device memory. */
    gd_warn("freeing %s memory on the loop: cannot queue the free", device);
    if (gr_ze_free(d->ze, ptr) != GR_OK)
        gd_warn("freeing device memory on %s: %s", device, gr_last_error());
    if (fd >= 0)
        close(fd);
}

int gd_xpu_grpc(int rc)
{
    switch (rc) {
    case GR_ENOMEM:
        return GD_RESOURCE_EXHAUSTED;
    case GR_ELOST:
        return GD_UNAVAILABLE;
    case GR_EUNSUPPORTED:
        return GD_FAILED_PRECONDITION;
    default:
        return gr_err_grpc(rc);
    }
}
