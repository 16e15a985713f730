/*
 * Replay connections: a session's REPLAY frames go straight to the executor that holds the graph
 * (exec_proto.h, "the direct data plane"), on a socket pair the daemon makes at the session's
 * DIRECT frame: one end goes to the executor (CONN_OPEN, on the worker of the graph's executor,
 * in the session's queue), the other to the client with the reply. The daemon keeps a descriptor of
 * the executor's end (a link), so that it can end the connection without asking the executor: at
 * the session's end, and when the executor is killed or dies (the executor's own end goes with it,
 * but the daemon's would keep the socket open). The client sees EOF, asks DIRECT again, and is
 * told why: the bound its replay passed, or how the executor died.
 */
#include "graphs.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

struct gd_link {
    gd_exec_t *x;
    uint64_t gen; /* the executor process it goes to */
    uint64_t key; /* the client's name for it (the DIRECT reply's arg) */
    int efd;      /* the executor's end */
    bool shut;    /* shut down: the executor is gone */
    gd_link_t *next;
};

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_wire_t *wire;
    uint64_t session, seq, graph_id, gen;
    gd_exec_t *x;
    gd_xgraph_t *xg;
    int fds[2]; /* the client's end, the executor's */
    int rc;
    char msg[GRAPHD_FRAME_MAX_MSG];
} direct_job_t;

static void reply(gd_wire_t *wire, uint64_t seq, uint64_t id, int status, uint64_t arg,
                  const char *msg, int fd)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_DIRECT | GRAPHD_FRAME_REPLY,
                        .seq = seq,
                        .id = id,
                        .arg = arg,
                        .status = status};
    gd_wire_send(wire, &f, status == GD_OK ? NULL : msg, fd);
}

static void link_free(gd_link_t *l)
{
    shutdown(l->efd, SHUT_RDWR);
    close(l->efd);
    free(l);
}

static void link_drop(gd_session_t *s, gd_link_t *l)
{
    gd_link_t **pp = &s->links;
    while (*pp && *pp != l)
        pp = &(*pp)->next;
    if (*pp)
        *pp = l->next;
    link_free(l);
}

static gd_link_t *link_find(const gd_session_t *s, const gd_exec_t *x)
{
    for (gd_link_t *l = s->links; l; l = l->next)
        if (l->x == x)
            return l;
    return NULL;
}

static void open_run(gd_job_t *job)
{
    direct_job_t *j = (direct_job_t *)job;
    j->rc = gd_exec_conn_open(j->xg, j->session, j->fds[1]);
    if (j->rc != GR_OK)
        snprintf(j->msg, sizeof j->msg, "graph %llu: %s", (unsigned long long)j->graph_id,
                 gd_exec_last_error());
}

static void open_done(gd_job_t *job)
{
    direct_job_t *j = (direct_job_t *)job;
    gd_session_t *s = gd_session_find(j->d, j->session);
    gd_link_t *l = NULL;
    if (j->rc == GR_OK && s != NULL && (l = calloc(1, sizeof *l)) == NULL) {
        j->rc = GR_ENOMEM;
        snprintf(j->msg, sizeof j->msg, "out of memory");
    }
    if (j->rc != GR_OK || s == NULL) {
        if (s != NULL)
            reply(j->wire, j->seq, j->graph_id, gr_err_grpc(j->rc), 0, j->msg, -1);
        close(j->fds[1]);
    } else {
        gd_link_t *old = link_find(s, j->x); /* a second DIRECT overtook this one */
        if (old)
            link_drop(s, old);
        *l = (gd_link_t){.x = j->x, .gen = j->gen, .key = ++j->d->next_link_key, .efd = j->fds[1]};
        l->next = s->links;
        s->links = l;
        reply(j->wire, j->seq, j->graph_id, GD_OK, l->key, NULL, j->fds[0]);
        gd_debug("session %llu: replay connection %llu to the executor of graph %llu",
                 (unsigned long long)s->id, (unsigned long long)l->key,
                 (unsigned long long)j->graph_id);
    }
    close(j->fds[0]);
    gd_wire_unref(j->wire);
    free(j);
}

void gd_direct_frame(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f)
{
    char msg[GRAPHD_FRAME_MAX_MSG];
    gd_graph_t *g = gd_graph_find(d, f->id);
    if (g == NULL || g->g == NULL) {
        snprintf(msg, sizeof msg, "no graph %llu", (unsigned long long)f->id);
        reply(wire, f->seq, f->id, GD_NOT_FOUND, 0, msg, -1);
        return;
    }
    if (g->session != s->id) {
        snprintf(msg, sizeof msg, "graph %llu belongs to another session",
                 (unsigned long long)f->id);
        reply(wire, f->seq, f->id, GD_PERMISSION_DENIED, 0, msg, -1);
        return;
    }
    if (f->arg > GRAPHD_DIRECT_RENEW) {
        snprintf(msg, sizeof msg, "DIRECT arg %llu: 0, or %u for a new connection",
                 (unsigned long long)f->arg, GRAPHD_DIRECT_RENEW);
        reply(wire, f->seq, f->id, GD_INVALID_ARGUMENT, 0, msg, -1);
        return;
    }
    uint64_t gen;
    gd_exec_t *x = gd_exec_graph_exec(g->g, &gen);
    gd_link_t *l = link_find(s, x);
    int rc;
    if (l != NULL && gd_exec_lost(x, l->gen, &rc, msg, sizeof msg)) {
        /* The connection's executor is gone (the client saw EOF): say why, once. */
        reply(wire, f->seq, f->id, gr_err_grpc(rc), 0, msg, -1);
        link_drop(s, l);
        return;
    }
    if (l != NULL && l->gen == gen && f->arg == 0) {
        reply(wire, f->seq, f->id, GD_OK, l->key, NULL, -1);
        return;
    }
    if (l != NULL)
        link_drop(s, l);
    char why[GRAPHD_FRAME_MAX_MSG - 64];
    if (gd_exec_lost(x, gen, &rc, why, sizeof why)) {
        snprintf(msg, sizeof msg, "graph %llu is gone with its executor; capture again (%s)",
                 (unsigned long long)f->id, why);
        reply(wire, f->seq, f->id, GD_ABORTED, 0, msg, -1);
        return;
    }
    direct_job_t *j = calloc(1, sizeof *j);
    if (j == NULL || socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, j->fds) != 0) {
        snprintf(msg, sizeof msg, "cannot make a replay connection: %s",
                 j ? strerror(errno) : "out of memory");
        free(j);
        reply(wire, f->seq, f->id, GD_RESOURCE_EXHAUSTED, 0, msg, -1);
        return;
    }
    j->d = d;
    j->wire = wire;
    gd_wire_ref(wire);
    j->session = s->id;
    j->seq = f->seq;
    j->graph_id = g->id;
    j->gen = gen;
    j->x = x;
    j->xg = g->g; /* its destroy is queued after this job, in the session's queue */
    j->job.run = open_run;
    j->job.done = open_done;
    j->job.session = s->id;
    gd_worker_submit(g->worker, &j->job);
}

void gd_direct_session_ended(gd_session_t *s)
{
    while (s->links) {
        gd_link_t *l = s->links;
        s->links = l->next;
        link_free(l);
    }
}

void gd_direct_watch(gd_daemon_t *d)
{
    for (gd_session_t *s = d->sessions; s; s = s->next)
        for (gd_link_t *l = s->links; l; l = l->next) {
            int rc;
            char msg[8];
            if (!l->shut && gd_exec_lost(l->x, l->gen, &rc, msg, sizeof msg)) {
                shutdown(l->efd, SHUT_RDWR); /* the client sees EOF and asks why */
                l->shut = true;
            }
        }
}
