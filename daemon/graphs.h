/*
 * What the daemon's graph files share (lifetime.c, modules.c, capture.c, replay.c, status.c):
 * the loop-side tables of modules, graph pools and graphs. See lifetime.c for who owns what.
 */
#ifndef GD_GRAPHS_H
#define GD_GRAPHS_H

#include "daemon.h"
#include "exec.h"
#include "runtime.h"

#include <stdatomic.h>

#define MAX_CALLABLES 64
#define MAX_ARGS 256
#define MAX_WARMUP 1000

struct gd_module {
    uint64_t id;
    uint64_t session;
    uid_t uid; /* the session's: each uid's executors load their own copy */
    gd_xmodule_t *m;
    char name[GD_NAME_MAX + 1];
    uint8_t sha256[GR_SHA256_LEN];
    int training;
    int refs; /* the session's handle, plus captures in flight */
    bool released;
    gd_module_t *next;
};

/*
 * One runtime pool (graph mempool) per session of a pool. Graphs of one session share
 * intermediates, as upstream's graphs of one pool do: that process replays them in the order it
 * captured them. Graphs of two sessions must not: nothing orders one process's FORWARD ...
 * BACKWARD against another's, and the other's FORWARD would overwrite, in memory the allocator
 * handed to both captures, the activations the first saved for its BACKWARD. Each runtime pool
 * also has a stream of its own (the CUDA family's make_pool), so two sessions' replays may overlap
 * on the device. The daemon's pool (its name, device, limit, regions, status) is still one.
 * A runtime pool lives in its session's uid's executor, and only that executor's worker touches
 * it (creates, counts, measures, destroys it); a pool used by several uids has runtime pools on
 * several workers, so the list itself is under the pool's rlock.
 */
typedef struct gd_rpool {
    uint64_t session;
    gd_worker_t *worker; /* its executor's */
    gd_xpool_t *gp;      /* in the session's executor on the pool's device */
    uint32_t graphs;     /* graphs captured in it and not yet destroyed */
    uint32_t captures;   /* captures in flight that hold it (gd_rpool_get to gd_rpool_put) */
    /* its graph mempool's bytes as its worker last measured them (gr_pool_memory) */
    atomic_uint_fast64_t reserved, in_use;
    struct gd_rpool *next;
} gd_rpool_t;

/* A segment of a session's graph mempool that holds parameter gradients of its graphs
 * (gr_graph_external), exported to that session as a borrowed region; the session's graphs
 * whose gradients lie in it share it. Loop-side. */
typedef struct gd_borrow {
    uint64_t session;
    void *base;
    uint64_t region_id;
    uint32_t refs; /* graphs using it */
    struct gd_borrow *next;
} gd_borrow_t;

struct gd_gpool {
    char name[PM_NAME_MAX + 1];
    char device[32];
    pthread_mutex_t rlock; /* rpools, the list (its entries are their workers') */
    gd_rpool_t *rpools;    /* per session, created by its worker at the session's first capture */
    gd_borrow_t *borrows;
    uint32_t graphs;
    /* captures in flight in it (loop-side): a deleted pool's runtime state waits for them too,
     * since each still uses this struct and its session's runtime pool (a session ending in the
     * middle of a capture deletes its own pool under it) */
    uint32_t captures;
    bool deleted;
    uint32_t destroying; /* a deleted pool's runtime pools being destroyed on their workers */
    gd_hist_t latency;
    /* graph mempool bytes, the sum of its runtime pools' (written by workers, read by status) */
    atomic_uint_fast64_t mempool_reserved, mempool_in_use;
    gd_gpool_t *next;
};

struct gd_graph {
    uint64_t id;
    uint64_t session;
    gd_gpool_t *pool;
    gd_rpool_t *rpool;   /* the session's runtime pool in it (worker-side) */
    gd_worker_t *worker; /* its executor's: (session's uid, pool's device) */
    gd_xgraph_t *g;
    uint64_t region_id;
    uint64_t region_bytes;
    char module[GD_NAME_MAX + 1];
    bool training;
    bool resident;         /* static tensors in device memory (a device-resident capture) */
    gd_borrow_t **borrows; /* the mempool segments its external gradients lie in */
    size_t nborrows;
    atomic_uint_fast64_t replays_forward, replays_backward, replay_errors;
    gd_hist_t latency;
    gd_graph_t *next;
};

/* lifetime.c */
void gd_module_unref(gd_daemon_t *d, gd_module_t *m);
/* The session's runtime pool in p, created on first use in x (the session's uid's executor on
 * p's device), held for one capture; on w, x's worker. GR_OK, or an error with its message in
 * msg. */
int gd_rpool_get(gd_gpool_t *p, uint64_t session, gd_exec_t *x, gd_worker_t *w, gd_rpool_t **out,
                 char *msg, size_t len);
/* The capture that held r is over (its graphs, if any, counted in r->graphs): a runtime pool
 * left with no graph and no capture goes, one still held is measured for status. On r's worker. */
void gd_rpool_put(gd_gpool_t *p, gd_rpool_t *r);
gd_gpool_t *gd_gpool_get(gd_daemon_t *d, const char *name, const char *device);
gd_gpool_t *gd_gpool_find(gd_daemon_t *d, const char *name);
/* A capture in p is over (on the loop, after its graphs are registered): a deleted pool with no
 * graph and no capture left is freed. */
void gd_gpool_capture_done(gd_daemon_t *d, gd_gpool_t *p);
/* The borrowed region of the mempool segment e lies in, for g's session. */
int gd_graph_borrow(gd_graph_t *g, pm_pool_t *pool, const gr_external_t *e, uint64_t *region_id);
/* Unlinks g and destroys it on its worker; the region is freed when free_region. */
void gd_graph_release(gd_daemon_t *d, gd_graph_t *g, bool free_region);
gd_graph_t *gd_graph_find(gd_daemon_t *d, uint64_t id);

/* modules.c: a module handle of session s; on failure finishes the call and returns NULL. */
gd_module_t *gd_module_of(gd_daemon_t *d, gd_call_t *call, gd_session_t *s, uint64_t id);

/* replay.c */
void gd_replay_spin_start(gd_daemon_t *d);

#endif
