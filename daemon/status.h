/*
 * The Status reply built in one place (status.c) for whoever reads it: the Status RPC, as its
 * caller's session sees it, and the metrics endpoint (metrics.c), as gd_viewer_all sees it, so
 * that both report the same figures.
 */
#ifndef GD_STATUS_H
#define GD_STATUS_H

#include "graphd.pb-c.h"
#include "graphs.h"

/* A viewer that sees every session, pool, graph and executor (an admin's view). */
extern const gd_session_t *const gd_viewer_all;

typedef struct gd_status_daemon gd_status_daemon_t;

typedef struct gd_status {
    Graphd__V1__StatusReply rep;
    Graphd__V1__HiddenStatus others;
    /* rep.n_pools histograms: the latencies each pool's replays and latency come from */
    gd_hist_t *pool_latency;
    /* storage behind rep; only gd_status_release reads it */
    gd_status_daemon_t *daemon;
    Graphd__V1__Device devices[GD_MAX_DEVICES];
    Graphd__V1__SessionStatus *sessions;
    gd_exec_info_t *exec_infos;
    Graphd__V1__ExecutorStatus *exec_storage;
} gd_status_t;

/* Builds the reply as viewer sees it (NULL: anonymous, counts only), on the loop thread. 0, or
 * -1 out of memory (st released). Release with gd_status_release either way. */
int gd_status_build(gd_daemon_t *d, const gd_session_t *viewer, gd_status_t *st);
void gd_status_release(gd_status_t *st);

#endif
