/* Replays: REPLAY frames from the session socket and the Replay RPC, run on the worker of the
 * graph's executor. */
#include "graphs.h"
#include "graphd.pb-c.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

static void on_replay_spin(uv_idle_t *h)
{
    gd_daemon_t *d = h->data;
    if (gd_now_ns() >= d->replay_hot_until)
        uv_idle_stop(h);
}

/* A device-resident replay came at now: the loop (which reads the next REPLAY frame) and w
 * (which runs it) poll rather than sleep for replay_spin_us, so that neither has to be woken. */
static void replay_keep_hot(gd_daemon_t *d, gd_worker_t *w, uint64_t now)
{
    if (d->replay_spin_ns == 0)
        return;
    d->replay_hot_until = now + d->replay_spin_ns;
    gd_worker_keep_hot(w, d->replay_hot_until);
    if (!uv_is_active((uv_handle_t *)&d->replay_spin))
        uv_idle_start(&d->replay_spin, on_replay_spin);
}

/* ---- replay ------------------------------------------------------------ */

typedef struct {
    gd_job_t job;
    gd_graph_t *graph;
    int phase;
    uint64_t t0;
    /* session-socket replays */
    gd_wire_t *wire;
    uint64_t seq;
    gd_xevent_t *wait, *done; /* ordered replays (GRAPHD_REPLAY_ORDERED), else NULL */
    gd_xseq_t *seqs;          /* posted replays (GRAPHD_REPLAY_POSTED): answered on failure only */
    uint64_t n;
    /* gRPC replays */
    gd_call_t *call;
    int rc;
    uint64_t device_ns;
    char msg[GRAPHD_FRAME_MAX_MSG];
} replay_job_t;

static void replay_account(replay_job_t *j)
{
    gd_graph_t *g = j->graph;
    if (j->rc != GR_OK)
        atomic_fetch_add(&g->replay_errors, 1);
    else if (j->phase == GR_PHASE_FORWARD)
        atomic_fetch_add(&g->replays_forward, 1);
    else
        atomic_fetch_add(&g->replays_backward, 1);
    uint64_t ns = gd_now_ns() - j->t0;
    gd_hist_add(&g->latency, ns);
    gd_hist_add(&g->pool->latency, ns);
}

/* The error reply to the REPLAY frame seq of graph id. */
static void replay_reply_error(gd_wire_t *wire, uint64_t seq, uint64_t id, int status,
                               const char *msg)
{
    graphd_frame_t r = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY,
                        .seq = seq,
                        .id = id,
                        .status = status};
    gd_wire_send(wire, &r, msg, -1);
}

static void replay_frame_run(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    j->rc =
        gd_exec_graph_replay(j->graph->g, j->phase, j->wait, j->done, j->seqs, j->n, &j->device_ns);
    if (j->seqs != NULL) {
        replay_account(j);
        if (j->rc != GR_OK)
            replay_reply_error(j->wire, j->seq, j->graph->id, gr_err_grpc(j->rc),
                               gd_exec_last_error());
        gd_wire_unref(j->wire);
        free(j);
        return;
    }
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY,
                        .seq = j->seq,
                        .id = j->graph->id,
                        .arg = j->device_ns,
                        .status = gr_err_grpc(j->rc)};
    replay_account(j);
    gd_wire_send(j->wire, &f, j->rc == GR_OK ? NULL : gd_exec_last_error(), -1);
    gd_wire_unref(j->wire);
    free(j);
}

/* The session of a frame replay ended before it ran: its connection is gone, nothing to answer
 * (a posted replay's counters were released with the session). */
static void replay_frame_drop(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    gd_wire_unref(j->wire);
    free(j);
}

static void replay_call_run(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    j->rc = gd_exec_graph_replay(j->graph->g, j->phase, NULL, NULL, NULL, 0, &j->device_ns);
    if (j->rc != GR_OK)
        snprintf(j->msg, sizeof j->msg, "%s", gd_exec_last_error());
    replay_account(j);
}

static void replay_call_done(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    if (j->rc != GR_OK) {
        gd_call_fail(j->call, gr_err_grpc(j->rc), "%s", j->msg);
    } else {
        Graphd__V1__ReplayReply rep = GRAPHD__V1__REPLAY_REPLY__INIT;
        rep.device_ns = j->device_ns;
        gd_call_reply(j->call, &rep.base);
    }
    free(j);
}

static void replay_call_drop(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    gd_call_fail(j->call, GD_ABORTED,
                 "the session ended before replay of graph %llu ran; it was dropped, not run",
                 (unsigned long long)j->graph->id);
    free(j);
}

/* Queues a replay job on its graph's worker, in its session's queue. 0, or GD_RESOURCE_EXHAUSTED
 * with msg set when the session already has max_queued_replays replays queued there. */
static int replay_submit(gd_daemon_t *d, gd_session_t *s, replay_job_t *j, char *msg, size_t len)
{
    gd_worker_t *w = j->graph->worker;
    j->job.session = s->id;
    w->max_queued_replays = d->cfg.max_queued_replays; /* reloadable: read at each submit */
    if (gd_worker_submit(w, &j->job) != 0) {
        snprintf(msg, len,
                 "session %llu already has %llu replays queued on %s (max_queued_replays); wait "
                 "for their replies before sending more, or raise max_queued_replays",
                 (unsigned long long)s->id, (unsigned long long)d->cfg.max_queued_replays,
                 w->device);
        return GD_RESOURCE_EXHAUSTED;
    }
    s->replays++;
    return GD_OK;
}

/* Looks the graph up for session s; returns a status and a message for failures. */
static int replay_target(gd_daemon_t *d, gd_session_t *s, uint64_t id, uint64_t phase,
                         gd_graph_t **out, char *msg, size_t len)
{
    if (phase != GR_PHASE_FORWARD && phase != GR_PHASE_BACKWARD) {
        snprintf(msg, len, "unknown phase %llu", (unsigned long long)phase);
        return GD_INVALID_ARGUMENT;
    }
    gd_graph_t *g = gd_graph_find(d, id);
    if (g == NULL) {
        snprintf(msg, len, "no graph %llu", (unsigned long long)id);
        return GD_NOT_FOUND;
    }
    if (g->session != s->id) {
        snprintf(msg, len, "graph %llu belongs to another session", (unsigned long long)id);
        return GD_PERMISSION_DENIED;
    }
    *out = g;
    return GD_OK;
}

/* A zeroed replay job when *st is GD_OK; NULL otherwise, or with *st GD_INTERNAL and msg saying
 * why when there is no memory. */
static replay_job_t *replay_job_new(int *st, char *msg, size_t len)
{
    if (*st != GD_OK)
        return NULL;
    replay_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        *st = GD_INTERNAL;
        snprintf(msg, len, "out of memory");
    }
    return j;
}

/* Queues j, a zeroed job for a REPLAY frame f of g with its ordering set, on g's worker. GD_OK, or
 * GD_RESOURCE_EXHAUSTED with msg set (j freed) when the session has max_queued_replays queued. */
static int replay_frame_submit(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire,
                               const graphd_frame_t *f, gd_graph_t *g, int phase, uint64_t t0,
                               replay_job_t *j, char *msg, size_t len)
{
    j->job.run = replay_frame_run;
    j->job.drop = replay_frame_drop;
    j->graph = g;
    j->phase = phase;
    j->t0 = t0;
    j->seq = f->seq;
    j->wire = wire;
    gd_wire_ref(wire);
    /* Device-resident replays, however ordered. Not host-staged ones or the CPU's: those clients
     * compute on the host's cores (a CPU module, its optimizer). With the two threads polling
     * after host-staged replays too, host-staged steps got several times slower on an H200
     * (docs/BENCHMARKS.md, benchmark 1, history: fourth session, run 6). */
    if (g->resident)
        replay_keep_hot(d, g->worker, t0);
    int st = replay_submit(d, s, j, msg, len);
    if (st != GD_OK) {
        gd_wire_unref(wire);
        free(j);
    }
    return st;
}

/* A REPLAY with GRAPHD_REPLAY_POSTED: answered only when it fails. Whatever happens to it, its
 * sequence number ends up written to the counters' done (by the replay, or by gr_seq_skip), so
 * the client's stream never waits for it forever; a frame out of sequence ends the session,
 * whose end releases the counters. */
static void replay_posted(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                          uint64_t t0)
{
    const uint64_t phase = f->arg & GRAPHD_REPLAY_PHASE_MASK;
    const uint64_t code = (f->arg >> GRAPHD_REPLAY_DEVICE_SHIFT) & GRAPHD_REPLAY_DEVICE_MASK;
    const uint64_t n = f->arg >> GRAPHD_REPLAY_SEQ_SHIFT;
    const uint64_t flags = f->arg & GRAPHD_REPLAY_FLAGS_MASK;
    char device[96], msg[256];
    /* An unknown code finds no counters below, and so ends the session like any posted replay
     * the daemon cannot take in sequence. */
    (void)gd_device_code_name(code, device, sizeof device, NULL);
    gd_order_t *q = gd_order_find(s, device, GD_ORDER_SEQ);
    if (q == NULL || !gd_order_take(q, n)) {
        if (q == NULL)
            snprintf(msg, sizeof msg,
                     "a posted REPLAY needs the session's sequence counters for %s (SEQ frame) "
                     "first",
                     device);
        else
            snprintf(msg, sizeof msg, "posted REPLAY %llu on %s out of sequence (next: %llu)",
                     (unsigned long long)n, device, (unsigned long long)gd_order_last(q) + 1);
        replay_reply_error(wire, f->seq, f->id, GD_FAILED_PRECONDITION, msg);
        gd_session_end(d, s, msg);
        return;
    }
    gd_graph_t *g = NULL;
    int st = replay_target(d, s, f->id, phase, &g, msg, sizeof msg);
    if (st == GD_OK && flags != GRAPHD_REPLAY_POSTED) {
        st = GD_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "REPLAY flags 0x%llx: POSTED goes alone",
                 (unsigned long long)flags);
    } else if (st == GD_OK && strcmp(g->worker->device, device) != 0) {
        st = GD_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "graph %llu is on %s, not %s", (unsigned long long)g->id,
                 g->worker->device, device);
    }
    replay_job_t *j = replay_job_new(&st, msg, sizeof msg);
    if (st != GD_OK) {
        replay_reply_error(wire, f->seq, f->id, st, msg);
        if (gd_exec_seq_skip(gd_order_counters(q), n) != GR_OK)
            gd_warn("posted replay %llu on %s: %s", (unsigned long long)n, device,
                    gd_exec_last_error());
        return;
    }
    j->seqs = gd_order_counters(q);
    j->n = n;
    st = replay_frame_submit(d, s, wire, f, g, (int)phase, t0, j, msg, sizeof msg);
    if (st != GD_OK) {
        replay_reply_error(wire, f->seq, f->id, st, msg);
        if (gd_exec_seq_skip(gd_order_counters(q), n) != GR_OK)
            gd_warn("posted replay %llu on %s: %s", (unsigned long long)n, device,
                    gd_exec_last_error());
    }
}

void gd_replay_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f)
{
    uint64_t t0 = gd_now_ns();
    if (f->arg & GRAPHD_REPLAY_POSTED) {
        replay_posted(d, s, wire, f, t0);
        return;
    }
    gd_graph_t *g = NULL;
    char msg[256];
    uint64_t phase = f->arg & GRAPHD_REPLAY_PHASE_MASK;
    gd_order_t *ev = NULL;
    int st = replay_target(d, s, f->id, phase, &g, msg, sizeof msg);
    if (st == GD_OK && (f->arg & ~(uint64_t)(GRAPHD_REPLAY_PHASE_MASK | GRAPHD_REPLAY_ORDERED))) {
        st = GD_INVALID_ARGUMENT;
        snprintf(msg, sizeof msg, "unknown REPLAY flags 0x%llx",
                 (unsigned long long)(f->arg & ~(uint64_t)GRAPHD_REPLAY_PHASE_MASK));
    } else if (st == GD_OK && (f->arg & GRAPHD_REPLAY_ORDERED)) {
        ev = gd_order_find(s, g->worker->device, GD_ORDER_EVENTS);
        if (ev == NULL) {
            st = GD_FAILED_PRECONDITION;
            snprintf(msg, sizeof msg,
                     "an ordered REPLAY needs the session's events for %s (EVENTS frame) first",
                     g->worker->device);
        }
    }
    replay_job_t *j = replay_job_new(&st, msg, sizeof msg);
    if (st != GD_OK) {
        replay_reply_error(wire, f->seq, f->id, st, msg);
        return;
    }
    j->wait = ev ? gd_order_wait(ev) : NULL;
    j->done = ev ? gd_order_done(ev) : NULL;
    st = replay_frame_submit(d, s, wire, f, g, (int)phase, t0, j, msg, sizeof msg);
    if (st != GD_OK)
        replay_reply_error(wire, f->seq, f->id, st, msg);
}

void gd_rpc_replay(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__ReplayRequest *req = (const void *)msg;
    uint64_t t0 = gd_now_ns();
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "replaying");
    if (s == NULL)
        return;
    gd_graph_t *g = NULL;
    char text[256];
    int st = replay_target(d, s, req->graph_id, (uint64_t)req->phase, &g, text, sizeof text);
    if (st != GD_OK) {
        gd_call_fail(call, st, "%s", text);
        return;
    }
    replay_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    j->job.run = replay_call_run;
    j->job.done = replay_call_done;
    j->job.drop = replay_call_drop;
    j->graph = g;
    j->phase = (int)req->phase;
    j->t0 = t0;
    j->call = call;
    st = replay_submit(d, s, j, text, sizeof text);
    if (st != GD_OK) {
        free(j);
        gd_call_fail(call, st, "%s", text);
    }
}
