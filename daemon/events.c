/*
 * Ordering by CUDA IPC events: EVENTS frames and ordered REPLAYs.
 *
 * A device-resident client sends, once per device, the IPC handle of an event it records on its
 * own stream after writing a replay's inputs; the daemon answers with the handle of an event it
 * records on the pool's stream after each ordered replay. A REPLAY with GRAPHD_REPLAY_ORDERED
 * then costs no host synchronisation on either side: the pool's stream waits on the client's
 * event, the client's stream waits on the daemon's, and the daemon replies as soon as the graph
 * is launched. Re-recording either event is safe because a wait takes the event's state when it
 * is queued: the client waits on the daemon's event before its next REPLAY frame, and the daemon
 * queues its wait before it replies.
 *
 * The events are opened, used and destroyed on the device's worker thread, the only thread that
 * touches that device; the session's list of them belongs to the loop.
 */
#include "daemon.h"
#include "log.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct gd_events {
    char device[32]; /* "cuda:0" */
    gd_worker_t *worker;
    gr_event_t *wait; /* the client's, opened here */
    gr_event_t *done; /* the daemon's */
    gd_events_t *next;
};

/* ---- EVENTS frames ------------------------------------------------------ */

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_wire_t *wire;
    uint64_t session, seq, device_index;
    uint8_t client_handle[GRAPHD_IPC_HANDLE_SIZE];
    uint8_t handle[GRAPHD_IPC_HANDLE_SIZE]; /* the daemon's, for the reply */
    gd_events_t *ev;
    int rc;
    char msg[GRAPHD_FRAME_MAX_MSG];
} events_job_t;

static void send_reply(gd_wire_t *wire, uint64_t seq, uint64_t id, int status, const char *msg,
                       const uint8_t *handle)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_EVENTS | GRAPHD_FRAME_REPLY,
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
    events_job_t *j = (events_job_t *)job;
    if (j->ev) {
        gr_event_destroy(j->ev->wait);
        gr_event_destroy(j->ev->done);
        free(j->ev);
    }
    free(j);
}

/* Destroys ev's events on its worker, after every replay already queued there. */
static void destroy_later(gd_events_t *ev)
{
    events_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) { /* leak the two events rather than destroy them under a queued replay */
        gd_error("out of memory: leaking the events of %s", ev->device);
        return;
    }
    j->ev = ev;
    j->job.run = destroy_run;
    gd_worker_submit(ev->worker, &j->job);
}

static void open_run(gd_job_t *job)
{
    events_job_t *j = (events_job_t *)job;
    gd_events_t *ev = j->ev;
    j->rc = gr_event_open(ev->device, j->client_handle, &ev->wait);
    if (j->rc == GR_OK)
        j->rc = gr_event_create(ev->device, &ev->done, j->handle);
    if (j->rc != GR_OK) {
        snprintf(j->msg, sizeof j->msg, "%s", gr_last_error());
        gr_event_destroy(ev->wait);
        ev->wait = NULL;
    }
}

static void open_done(gd_job_t *job)
{
    events_job_t *j = (events_job_t *)job;
    gd_session_t *s = gd_session_find(j->d, j->session);
    if (j->rc != GR_OK) {
        send_reply(j->wire, j->seq, j->device_index,
                   j->rc == GR_EUNSUPPORTED ? GD_UNIMPLEMENTED : GD_INVALID_ARGUMENT, j->msg, NULL);
        free(j->ev);
    } else if (s == NULL || gd_events_find(s, j->ev->device) != NULL) {
        /* The session ended meanwhile, or a second EVENTS for the device overtook this one. */
        send_reply(j->wire, j->seq, j->device_index, GD_ALREADY_EXISTS,
                   "the session already has events for this device", NULL);
        destroy_later(j->ev);
    } else {
        j->ev->next = s->events;
        s->events = j->ev;
        send_reply(j->wire, j->seq, j->device_index, GD_OK, NULL, j->handle);
        gd_debug("session %llu: replays on %s ordered by IPC events", (unsigned long long)s->id,
                 j->ev->device);
    }
    gd_wire_unref(j->wire);
    free(j);
}

void gd_events_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                     const uint8_t *payload)
{
    char device[32];
    snprintf(device, sizeof device, "cuda:%llu", (unsigned long long)f->id);
    gd_worker_t *w = gd_worker_for(d, device);
    char msg[96];
    if (w == NULL) {
        snprintf(msg, sizeof msg, "no device %s", device);
        send_reply(wire, f->seq, f->id, GD_NOT_FOUND, msg, NULL);
        return;
    }
    if (gd_events_find(s, device) != NULL) {
        send_reply(wire, f->seq, f->id, GD_ALREADY_EXISTS,
                   "the session already has events for this device", NULL);
        return;
    }
    events_job_t *j = calloc(1, sizeof *j);
    gd_events_t *ev = calloc(1, sizeof *ev);
    if (j == NULL || ev == NULL) {
        free(j);
        free(ev);
        send_reply(wire, f->seq, f->id, GD_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    snprintf(ev->device, sizeof ev->device, "%s", device);
    ev->worker = w;
    j->ev = ev;
    j->d = d;
    j->wire = wire;
    gd_wire_ref(wire);
    j->session = s->id;
    j->seq = f->seq;
    j->device_index = f->id;
    memcpy(j->client_handle, payload, GRAPHD_IPC_HANDLE_SIZE);
    j->job.run = open_run;
    j->job.done = open_done;
    gd_worker_submit(w, &j->job);
}

/* ---- lookups and teardown ---------------------------------------------- */

gd_events_t *gd_events_find(const gd_session_t *s, const char *device)
{
    for (gd_events_t *ev = s->events; ev != NULL; ev = ev->next)
        if (strcmp(ev->device, device) == 0)
            return ev;
    return NULL;
}

gr_event_t *gd_events_wait(const gd_events_t *ev)
{
    return ev->wait;
}

gr_event_t *gd_events_done(const gd_events_t *ev)
{
    return ev->done;
}

void gd_events_session_ended(gd_session_t *s)
{
    gd_events_t *ev = s->events;
    s->events = NULL;
    while (ev) {
        gd_events_t *next = ev->next;
        destroy_later(ev);
        ev = next;
    }
}

/* ---- sequence counters (SEQ frames, posted replays) -------------------- */

/*
 * A session's sequence counters on one device (gr_seq_t): GRAPHD_REPLAY_POSTED replays are
 * ordered by CUDA stream memory operations on them, so the client need not wait for an answer.
 * The loop checks each posted replay's sequence number against the last one it took (last); the
 * counters are created and destroyed on the device's worker. At the session's end they are
 * released first (gr_seq_release, from the loop: both counters jump past every wait), so that no
 * stream of the daemon waits forever on a client that is gone, and nothing queued behind such a
 * wait on the worker hangs the device.
 */
struct gd_seqs {
    char device[32];
    gd_worker_t *worker;
    gr_seq_t *seq;
    uint64_t last; /* the last sequence number taken */
    gd_seqs_t *next;
};

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_wire_t *wire;
    uint64_t session, seq, device_index;
    uint8_t handle[GRAPHD_IPC_HANDLE_SIZE];
    gd_seqs_t *q;
    int rc;
    char msg[GRAPHD_FRAME_MAX_MSG];
} seqs_job_t;

static void seqs_reply(gd_wire_t *wire, uint64_t seq, uint64_t id, int status, const char *msg,
                       const uint8_t *handle)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_SEQ | GRAPHD_FRAME_REPLY,
                        .seq = seq,
                        .id = id,
                        .status = status};
    if (status == GD_OK)
        gd_wire_send_bytes(wire, &f, handle, GRAPHD_IPC_HANDLE_SIZE, -1);
    else
        gd_wire_send(wire, &f, msg, -1);
}

static void seqs_destroy_run(gd_job_t *job)
{
    seqs_job_t *j = (seqs_job_t *)job;
    if (j->q) {
        gr_seq_destroy(j->q->seq);
        free(j->q);
    }
    free(j);
}

/* Releases q's counters now and destroys them on the worker after what is queued there. */
static void seqs_destroy_later(gd_seqs_t *q)
{
    if (q->seq != NULL && gr_seq_release(q->seq) != GR_OK)
        gd_warn("releasing the sequence counters on %s: %s", q->device, gr_last_error());
    seqs_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        gd_error("out of memory: leaking the sequence counters of %s", q->device);
        return;
    }
    j->q = q;
    j->job.run = seqs_destroy_run;
    gd_worker_submit(q->worker, &j->job);
}

static void seqs_open_run(gd_job_t *job)
{
    seqs_job_t *j = (seqs_job_t *)job;
    j->rc = gr_seq_create(j->q->device, &j->q->seq, j->handle);
    if (j->rc != GR_OK)
        snprintf(j->msg, sizeof j->msg, "%s", gr_last_error());
}

static void seqs_open_done(gd_job_t *job)
{
    seqs_job_t *j = (seqs_job_t *)job;
    gd_session_t *s = gd_session_find(j->d, j->session);
    if (j->rc != GR_OK) {
        seqs_reply(j->wire, j->seq, j->device_index,
                   j->rc == GR_EUNSUPPORTED ? GD_UNIMPLEMENTED : GD_INVALID_ARGUMENT, j->msg, NULL);
        free(j->q);
    } else if (s == NULL || gd_seqs_find(s, j->q->device) != NULL) {
        seqs_reply(j->wire, j->seq, j->device_index, GD_ALREADY_EXISTS,
                   "the session already has sequence counters for this device", NULL);
        seqs_destroy_later(j->q);
    } else {
        j->q->next = s->seqs;
        s->seqs = j->q;
        seqs_reply(j->wire, j->seq, j->device_index, GD_OK, NULL, j->handle);
        gd_debug("session %llu: posted replays on %s", (unsigned long long)s->id, j->q->device);
    }
    gd_wire_unref(j->wire);
    free(j);
}

void gd_seqs_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f)
{
    char device[32];
    snprintf(device, sizeof device, "cuda:%llu", (unsigned long long)f->id);
    gd_worker_t *w = gd_worker_for(d, device);
    char msg[96];
    if (w == NULL) {
        snprintf(msg, sizeof msg, "no device %s", device);
        seqs_reply(wire, f->seq, f->id, GD_NOT_FOUND, msg, NULL);
        return;
    }
    if (gd_seqs_find(s, device) != NULL) {
        seqs_reply(wire, f->seq, f->id, GD_ALREADY_EXISTS,
                   "the session already has sequence counters for this device", NULL);
        return;
    }
    seqs_job_t *j = calloc(1, sizeof *j);
    gd_seqs_t *q = calloc(1, sizeof *q);
    if (j == NULL || q == NULL) {
        free(j);
        free(q);
        seqs_reply(wire, f->seq, f->id, GD_RESOURCE_EXHAUSTED, "out of memory", NULL);
        return;
    }
    snprintf(q->device, sizeof q->device, "%s", device);
    q->worker = w;
    j->q = q;
    j->d = d;
    j->wire = wire;
    gd_wire_ref(wire);
    j->session = s->id;
    j->seq = f->seq;
    j->device_index = f->id;
    j->job.run = seqs_open_run;
    j->job.done = seqs_open_done;
    gd_worker_submit(w, &j->job);
}

gd_seqs_t *gd_seqs_find(const gd_session_t *s, const char *device)
{
    for (gd_seqs_t *q = s->seqs; q != NULL; q = q->next)
        if (strcmp(q->device, device) == 0)
            return q;
    return NULL;
}

bool gd_seqs_take(gd_seqs_t *q, uint64_t n)
{
    if (n != q->last + 1)
        return false;
    q->last = n;
    return true;
}

uint64_t gd_seqs_last(const gd_seqs_t *q)
{
    return q->last;
}

gr_seq_t *gd_seqs_counters(const gd_seqs_t *q)
{
    return q->seq;
}

gd_worker_t *gd_seqs_worker(const gd_seqs_t *q)
{
    return q->worker;
}

void gd_seqs_session_ended(gd_session_t *s)
{
    gd_seqs_t *q = s->seqs;
    s->seqs = NULL;
    while (q) {
        gd_seqs_t *next = q->next;
        seqs_destroy_later(q);
        q = next;
    }
}
