/*
 * A session's ordering events on an xpu:N device: one Level Zero IPC event pool per session and
 * device (EVENTS frame, docs/PROTOCOL.md), made by the daemon in its own context and exported
 * with its handle and fd (SCM_RIGHTS), as a device region's MAP reply is; the client opens it in
 * its own context (zeEventPoolOpenIpcHandle). When the session ends - Goodbye, EOF, a SIGKILLed
 * client, the daemon stopping - the daemon host-signals every event of the pool before it
 * destroys it, so that no process waiting on one (zeEventHostSynchronize) hangs on a client
 * that is gone.
 *
 * Creating, signalling and destroying a pool are driver calls: they run on libuv's thread pool,
 * never on the loop. The session's list of pools belongs to the loop.
 */
#include "daemon.h"
#include "log.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

struct gd_xpu_events {
    char device[32]; /* "xpu:0" */
    gr_ze_event_pool_t *pool;
    gd_xpu_events_t *next;
};

typedef struct {
    uv_work_t req;
    gd_daemon_t *d;
    gr_ze_t *ze;
    gd_wire_t *wire; /* the request's (create), or NULL (release) */
    uint64_t session, seq, code;
    unsigned index;
    uint32_t count;
    char device[32];
    gr_ze_event_pool_t *pool;
    int fd;
    gr_ze_ipc_t ipc;
    int rc;
    char msg[GRAPHD_FRAME_MAX_MSG];
} ev_job_t;

static void send_reply(gd_wire_t *wire, uint64_t seq, uint64_t code, uint32_t count, int status,
                       const char *msg, const gr_ze_ipc_t *ipc, int fd)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = (uint16_t)(GRAPHD_FRAME_EVENTS | GRAPHD_FRAME_REPLY),
                        .seq = seq,
                        .id = code,
                        .arg = status == GD_OK ? count : 0,
                        .status = status};
    if (status == GD_OK)
        gd_wire_send_bytes(wire, &f, ipc->data, GR_ZE_IPC_SIZE, fd);
    else
        gd_wire_send(wire, &f, msg, -1);
}

/* ---- release: signal every event, then destroy the pool (off the loop) -------------------- */

static void release_work(uv_work_t *req)
{
    ev_job_t *j = req->data;
    if (gr_ze_events_signal_all(j->pool) != GR_OK)
        gd_warn("signalling the events of a session on %s at its end: %s", j->device,
                gr_last_error());
    if (gr_ze_event_pool_close(j->pool) != GR_OK)
        gd_warn("destroying the event pool of a session on %s: %s", j->device, gr_last_error());
}

static void release_after(uv_work_t *req, int status)
{
    (void)status;
    free(req->data);
}

static void release_later(gd_daemon_t *d, const char *device, gr_ze_event_pool_t *pool)
{
    ev_job_t *j = calloc(1, sizeof *j);
    if (j != NULL) {
        j->pool = pool;
        snprintf(j->device, sizeof j->device, "%s", device);
        j->req.data = j;
        if (uv_queue_work(d->loop, &j->req, release_work, release_after) == 0)
            return;
        free(j);
    }
    /* Nothing can queue it: do it here rather than leave a waiter hanging. */
    gd_warn("releasing the events of a session on %s on the loop: cannot queue it", device);
    ev_job_t tmp = {.pool = pool};
    snprintf(tmp.device, sizeof tmp.device, "%s", device);
    tmp.req.data = &tmp;
    release_work(&tmp.req);
}

/* ---- create ------------------------------------------------------------------------------- */

static void create_work(uv_work_t *req)
{
    ev_job_t *j = req->data;
    j->fd = -1;
    j->rc = gr_ze_event_pool_create(j->ze, j->index, j->count, &j->pool, &j->fd, &j->ipc);
    if (j->rc != GR_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", gr_last_error());
        j->pool = NULL;
        j->fd = -1;
    }
}

static void create_after(uv_work_t *req, int status)
{
    ev_job_t *j = req->data;
    gd_daemon_t *d = j->d;
    if (status != 0 && j->rc == GR_OK && j->pool == NULL) {
        j->rc = GR_EINTERNAL;
        snprintf(j->msg, sizeof j->msg, "the event pool's creation was cancelled");
    }
    gd_session_t *s = gd_session_find(d, j->session);
    if (j->rc != GR_OK) {
        send_reply(j->wire, j->seq, j->code, 0, gd_xpu_grpc(j->rc), j->msg, NULL, -1);
    } else if (s == NULL || gd_xpu_events_find(s, j->device) != NULL) {
        /* The session ended meanwhile, or a second frame for the device overtook this one. */
        send_reply(j->wire, j->seq, j->code, 0, GD_ALREADY_EXISTS,
                   "the session already has events for this device", NULL, -1);
        release_later(d, j->device, j->pool);
    } else {
        gd_xpu_events_t *e = calloc(1, sizeof *e);
        if (e == NULL) {
            send_reply(j->wire, j->seq, j->code, 0, GD_RESOURCE_EXHAUSTED, "out of memory", NULL,
                       -1);
            release_later(d, j->device, j->pool);
        } else {
            snprintf(e->device, sizeof e->device, "%s", j->device);
            e->pool = j->pool;
            e->next = s->xpu_events;
            s->xpu_events = e;
            /* The wire passes a dup of the fd; the daemon keeps none (the pool is the driver's). */
            send_reply(j->wire, j->seq, j->code, j->count, GD_OK, NULL, &j->ipc, j->fd);
            gd_debug("session %llu: %u events on %s", (unsigned long long)s->id, j->count,
                     j->device);
        }
    }
    if (j->fd >= 0)
        close(j->fd);
    gd_wire_unref(j->wire);
    free(j);
}

void gd_xpu_events_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                         const char *device)
{
    char msg[192];
    const gd_device_t *dev = gd_device_find(d, device);
    if (f->arg > GR_ZE_EVENTS_MAX) {
        snprintf(msg, sizeof msg, "%llu events asked on %s: at most %d in one session's pool",
                 (unsigned long long)f->arg, device, GR_ZE_EVENTS_MAX);
        send_reply(wire, f->seq, f->id, 0, GD_INVALID_ARGUMENT, msg, NULL, -1);
        return;
    }
    if (dev == NULL || d->ze == NULL) {
        snprintf(msg, sizeof msg, "no device %s", device);
        send_reply(wire, f->seq, f->id, 0, GD_NOT_FOUND, msg, NULL, -1);
        return;
    }
    if (gd_xpu_events_find(s, device) != NULL) {
        send_reply(wire, f->seq, f->id, 0, GD_ALREADY_EXISTS,
                   "the session already has events for this device", NULL, -1);
        return;
    }
    ev_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        send_reply(wire, f->seq, f->id, 0, GD_RESOURCE_EXHAUSTED, "out of memory", NULL, -1);
        return;
    }
    j->d = d;
    j->ze = d->ze;
    j->wire = wire;
    j->session = s->id;
    j->seq = f->seq;
    j->code = f->id;
    j->index = dev->ordinal;
    j->count = f->arg != 0 ? (uint32_t)f->arg : GD_XPU_EVENTS_DEFAULT;
    snprintf(j->device, sizeof j->device, "%s", device);
    j->fd = -1;
    j->req.data = j;
    gd_wire_ref(wire);
    if (uv_queue_work(d->loop, &j->req, create_work, create_after) != 0) {
        gd_wire_unref(wire);
        free(j);
        send_reply(wire, f->seq, f->id, 0, GD_RESOURCE_EXHAUSTED, "cannot queue the work", NULL,
                   -1);
    }
}

gd_xpu_events_t *gd_xpu_events_find(const gd_session_t *s, const char *device)
{
    for (gd_xpu_events_t *e = s->xpu_events; e != NULL; e = e->next)
        if (strcmp(e->device, device) == 0)
            return e;
    return NULL;
}

void gd_xpu_events_session_ended(gd_daemon_t *d, gd_session_t *s)
{
    gd_xpu_events_t *e = s->xpu_events;
    s->xpu_events = NULL;
    while (e != NULL) {
        gd_xpu_events_t *next = e->next;
        release_later(d, e->device, e->pool);
        free(e);
        e = next;
    }
}
