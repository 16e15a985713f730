/*
 * What orders a session's device-resident replays against its client's stream, per CUDA device:
 * EVENTS and SEQ frames, and the objects they make.
 *
 * CUDA IPC events (EVENTS, ordered REPLAYs): the client sends, once per device, the IPC handle of
 * an event it records on its own stream after writing a replay's inputs; the daemon answers with
 * the handle of an event it records on the pool's stream after each ordered replay. The pool's
 * stream waits on the client's event, the client's stream waits on the daemon's, and the daemon
 * replies as soon as the graph is launched. Re-recording either event is safe because a wait
 * takes the event's state when it is queued: the client waits on the daemon's event before its
 * next REPLAY frame, and the daemon queues its wait before it replies.
 *
 * Sequence counters (SEQ, posted REPLAYs): two 64-bit counters in device memory (gr_seq_t) that
 * both sides' streams write and wait for with CUDA stream memory operations, so the client need
 * not wait for an answer (docs/PROTOCOL.md). The loop checks each posted replay's number against
 * the last one it took. At the session's end the counters are released first (gr_seq_release,
 * from the loop: both jump past every wait), so that no stream of the daemon waits forever on a
 * client that is gone, and nothing queued behind such a wait on the worker hangs the device.
 *
 * The objects are made and destroyed on the worker of the session's uid's executor on the device
 * (they live in that executor); the session's list of them belongs to the loop.
 */
#include "daemon.h"
#include "exec.h"
#include "log.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The client finds the counters by graphd_frame.h's layout; graph_runtime lays them out. */
_Static_assert(GR_SEQ_BYTES == GRAPHD_SEQ_BYTES && GR_SEQ_READY_OFFSET == GRAPHD_SEQ_READY_OFFSET &&
                   GR_SEQ_DONE_OFFSET == GRAPHD_SEQ_DONE_OFFSET &&
                   GR_SEQ_RELEASED == GRAPHD_SEQ_RELEASED,
               "graph_runtime's sequence counters and the wire protocol disagree");

struct gd_order {
    gd_order_kind_t kind;
    char device[32];     /* "cuda:0" (a family with ordering primitives) */
    gd_worker_t *worker; /* x's */
    uint64_t session;    /* whose queue its jobs go to (worker.h) */
    gd_exec_t *x;        /* the session's uid's executor on the device */
    gd_xevent_t *wait;   /* EVENTS: the client's, opened there */
    gd_xevent_t *done;   /* EVENTS: the executor's */
    gd_xseq_t *seq;      /* SEQ */
    uint64_t last;       /* SEQ: the last sequence number taken */
    gd_order_t *next;
};

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_wire_t *wire;
    uint64_t session, seq, device_index;
    uint8_t client_handle[GRAPHD_IPC_HANDLE_SIZE]; /* EVENTS */
    uint8_t handle[GRAPHD_IPC_HANDLE_SIZE];        /* the daemon's, for the reply */
    gd_order_t *o;
    int rc;
    char msg[GRAPHD_FRAME_MAX_MSG];
} order_job_t;

static const char *kind_name(gd_order_kind_t kind)
{
    return kind == GD_ORDER_EVENTS ? "events" : "sequence counters";
}

static void send_reply(gd_wire_t *wire, gd_order_kind_t kind, uint64_t seq, uint64_t id, int status,
                       const char *msg, const uint8_t *handle)
{
    graphd_frame_t f = {
        .magic = GRAPHD_FRAME_MAGIC,
        .version = GRAPHD_FRAME_VERSION,
        .type = (uint16_t)((kind == GD_ORDER_EVENTS ? GRAPHD_FRAME_EVENTS : GRAPHD_FRAME_SEQ) |
                           GRAPHD_FRAME_REPLY),
        .seq = seq,
        .id = id,
        .status = status};
    if (status == GD_OK)
        gd_wire_send_bytes(wire, &f, handle, GRAPHD_IPC_HANDLE_SIZE, -1);
    else
        gd_wire_send(wire, &f, msg, -1);
}

static void destroy_run(gd_job_t *job)
{
    order_job_t *j = (order_job_t *)job;
    if (j->o) {
        gd_exec_event_destroy(j->o->wait);
        gd_exec_event_destroy(j->o->done);
        gd_exec_seq_destroy(j->o->seq);
        free(j->o);
    }
    free(j);
}

/* Releases o's counters now, and destroys o on its worker after every replay already queued
 * there. */
static void destroy_later(gd_order_t *o)
{
    if (o->seq != NULL && gd_exec_seq_release(o->seq) != GR_OK)
        gd_warn("releasing the sequence counters on %s: %s", o->device, gd_exec_last_error());
    order_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) { /* leak them rather than destroy them under a queued replay */
        gd_error("out of memory: leaking the %s of %s", kind_name(o->kind), o->device);
        return;
    }
    j->o = o;
    j->job.run = destroy_run;
    j->job.session = o->session; /* behind the session's replays that use it */
    gd_worker_submit(o->worker, &j->job);
}

static void open_run(gd_job_t *job)
{
    order_job_t *j = (order_job_t *)job;
    gd_order_t *o = j->o;
    if (o->kind == GD_ORDER_SEQ) {
        j->rc = gd_exec_seq_create(o->x, o->device, &o->seq, j->handle);
        if (j->rc == GR_OK) /* for the session's replays on its direct connection */
            j->rc = gd_exec_seq_bind(o->seq, o->session);
    } else {
        j->rc = gd_exec_event_open(o->x, o->device, j->client_handle, &o->wait);
        if (j->rc == GR_OK)
            j->rc = gd_exec_event_create(o->x, o->device, &o->done, j->handle);
        if (j->rc == GR_OK)
            j->rc = gd_exec_events_bind(o->wait, o->done, o->session);
    }
    if (j->rc != GR_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", gd_exec_last_error());
        gd_exec_event_destroy(o->wait);
        gd_exec_event_destroy(o->done);
        gd_exec_seq_destroy(o->seq);
        o->wait = o->done = NULL;
        o->seq = NULL;
    }
}

static void open_done(gd_job_t *job)
{
    order_job_t *j = (order_job_t *)job;
    gd_order_t *o = j->o;
    gd_session_t *s = gd_session_find(j->d, j->session);
    if (j->rc != GR_OK) {
        send_reply(j->wire, o->kind, j->seq, j->device_index,
                   j->rc == GR_EUNSUPPORTED ? GD_UNIMPLEMENTED : GD_INVALID_ARGUMENT, j->msg, NULL);
        free(o);
    } else if (s == NULL || gd_order_find(s, o->device, o->kind) != NULL) {
        /* The session ended meanwhile, or a second frame for the device overtook this one. */
        char msg[96];
        snprintf(msg, sizeof msg, "the session already has %s for this device", kind_name(o->kind));
        send_reply(j->wire, o->kind, j->seq, j->device_index, GD_ALREADY_EXISTS, msg, NULL);
        destroy_later(o);
    } else {
        o->next = s->orders;
        s->orders = o;
        send_reply(j->wire, o->kind, j->seq, j->device_index, GD_OK, NULL, j->handle);
        gd_debug("session %llu: replays on %s ordered by %s", (unsigned long long)s->id, o->device,
                 kind_name(o->kind));
    }
    gd_wire_unref(j->wire);
    free(j);
}

void gd_order_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                    const uint8_t *payload)
{
    gd_order_kind_t kind = f->type == GRAPHD_FRAME_EVENTS ? GD_ORDER_EVENTS : GD_ORDER_SEQ;
    char device[96];
    char msg[192];
    const gd_family_t *fam = NULL;
    if (!gd_device_code_name(f->id, device, sizeof device, &fam)) {
        snprintf(msg, sizeof msg, "no device: %s", device);
        send_reply(wire, kind, f->seq, f->id, GD_INVALID_ARGUMENT, msg, NULL);
        return;
    }
    if (gd_device_find(d, device) == NULL) {
        snprintf(msg, sizeof msg, "no device %s", device);
        send_reply(wire, kind, f->seq, f->id, GD_NOT_FOUND, msg, NULL);
        return;
    }
    if (kind == GD_ORDER_EVENTS && fam->ze_events) { /* xpu: the daemon's IPC event pool */
        gd_xpu_events_frame(d, s, wire, f, device);
        return;
    }
    if (!fam->ordering) {
        snprintf(msg, sizeof msg,
                 "%s has no %s in this graphd: ordered and posted replays are for cuda devices",
                 device, kind_name(kind));
        send_reply(wire, kind, f->seq, f->id, GD_UNIMPLEMENTED, msg, NULL);
        return;
    }
    if (gd_order_find(s, device, kind) != NULL) {
        snprintf(msg, sizeof msg, "the session already has %s for this device", kind_name(kind));
        send_reply(wire, kind, f->seq, f->id, GD_ALREADY_EXISTS, msg, NULL);
        return;
    }
    order_job_t *j = calloc(1, sizeof *j);
    gd_order_t *o = calloc(1, sizeof *o);
    if (j == NULL || o == NULL) {
        free(j);
        free(o);
        send_reply(wire, kind, f->seq, f->id, GD_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    o->kind = kind;
    gd_worker_t *w = gd_worker_for(d, s->uid, device, &o->x);
    if (w == NULL) {
        free(j);
        free(o);
        send_reply(wire, kind, f->seq, f->id, GD_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    snprintf(o->device, sizeof o->device, "%.31s", device);
    o->worker = w;
    o->session = s->id;
    j->o = o;
    j->d = d;
    j->wire = wire;
    gd_wire_ref(wire);
    j->session = s->id;
    j->seq = f->seq;
    j->device_index = f->id;
    if (kind == GD_ORDER_EVENTS)
        memcpy(j->client_handle, payload, GRAPHD_IPC_HANDLE_SIZE);
    j->job.run = open_run;
    j->job.done = open_done;
    j->job.session = s->id;
    gd_worker_submit(w, &j->job);
}

/* ---- lookups and teardown ---------------------------------------------- */

gd_order_t *gd_order_find(const gd_session_t *s, const char *device, gd_order_kind_t kind)
{
    for (gd_order_t *o = s->orders; o != NULL; o = o->next)
        if (o->kind == kind && strcmp(o->device, device) == 0)
            return o;
    return NULL;
}

gd_xevent_t *gd_order_wait(const gd_order_t *o)
{
    return o->wait;
}

gd_xevent_t *gd_order_done(const gd_order_t *o)
{
    return o->done;
}

gd_xseq_t *gd_order_counters(const gd_order_t *o)
{
    return o->seq;
}

bool gd_order_take(gd_order_t *o, uint64_t n)
{
    if (n != o->last + 1)
        return false;
    o->last = n;
    return true;
}

uint64_t gd_order_last(const gd_order_t *o)
{
    return o->last;
}

void gd_order_session_ended(gd_session_t *s)
{
    gd_order_t *o = s->orders;
    s->orders = NULL;
    while (o) {
        gd_order_t *next = o->next;
        destroy_later(o);
        o = next;
    }
}
