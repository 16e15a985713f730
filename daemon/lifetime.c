/*
 * Graph lifetime: the daemon's side of the executors (exec.c), their start and stop, graph
 * pools and the graphs themselves (modules.c, capture.c and replay.c make and run them).
 *
 * The loop thread owns the tables (modules, graphs, runtime pools) and every
 * region. Device work runs on the device's worker: captures in two steps
 * (prepare on the worker; allocate the static regions on the loop, where the
 * pool limits live; finish on the worker), replays one job each. A replay
 * that came in on the session socket is answered by the worker itself through
 * the connection's wire; one that came through gRPC goes back to the loop.
 *
 * The executor maps a graph's region a second time, from the memfd sent with
 * the capture: when its session ends the region leaves the pool at once (status
 * shows it gone), while the executor's mapping stays valid until the worker,
 * after any replay still queued, has destroyed the graph.
 *
 * Device-resident captures (CaptureRequest.device_resident) put the static
 * tensors in device memory instead: the worker allocates one block per
 * callable right after prepare (gr_device_alloc, exported with CUDA IPC), the
 * loop registers the blocks as device regions of the pool (limits apply as
 * for host regions), and the worker finishes over them. A device region that
 * is freed goes to the pool manager's device-free hook, which queues a
 * gr_device_free job on the device's worker: it runs after every replay (and
 * the graph's destroy) already queued there, so no graph ever runs on freed
 * memory.
 */
#include "cgroup.h"
#include "graphs.h"
#include "graphd.pb-c.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

gd_worker_t *gd_worker_for(gd_daemon_t *d, uid_t uid, const char *device, gd_exec_t **out)
{
    if (gd_device_find(d, device) == NULL || d->exec == NULL)
        return NULL;
    gd_exec_t *x = gd_exec_get(d->exec, uid, device);
    gd_worker_t *w = x ? gd_workers_get(&d->workers, x, uid, device) : NULL;
    if (out)
        *out = x;
    return w;
}

/* ---- device memory ----------------------------------------------------- */

/* Frees one device block on the worker of its executor, after whatever is queued there. */
typedef struct {
    gd_job_t job;
    char device[GR_DEVICE_MAX];
    void *ptr;
} devfree_job_t;

static void devfree_run(gd_job_t *job)
{
    devfree_job_t *j = (devfree_job_t *)job;
    if (gd_exec_device_free(j->ptr) != GR_OK)
        gd_warn("freeing device memory on %s: %s", j->device, gd_exec_last_error());
    free(j);
}

/* The pool manager's device-free hook (loop thread): a device region was freed. */
static void device_free_hook(void *ctx, const char *device, void *ptr, uint64_t size)
{
    gd_daemon_t *d = ctx;
    const gd_family_t *fam = gd_family_of(device);
    if (fam != NULL && fam->memory == GD_DEVMEM_ZE) { /* the daemon's own (xpu.c) */
        gd_xpu_free(d, device, ptr, -1);
        return;
    }
    /* Only the executor that allocated the block can use it (it is in that one's address space):
     * its worker's jobs are the ones to follow. */
    gd_worker_t *w = gd_workers_find(&d->workers, gd_exec_block_exec(ptr));
    if (w == NULL) { /* the workers are gone: nothing can use the memory any more */
        if (gd_exec_device_free(ptr) != GR_OK)
            gd_warn("freeing device memory on %s: %s", device, gd_exec_last_error());
        return;
    }
    devfree_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        gd_error("out of memory freeing %llu bytes on %s; they stay allocated",
                 (unsigned long long)size, device);
        return;
    }
    j->job.run = devfree_run;
    j->job.done = NULL;
    j->job.session = 0; /* the daemon's queue: after every job of the executor's */
    snprintf(j->device, sizeof j->device, "%s", device);
    j->ptr = ptr;
    gd_worker_submit(w, &j->job);
}

/* ---- start and stop ---------------------------------------------------- */

/* max_call_memory_bytes, or half the machine's memory for 0: one call must not take the
 * memory every other tenant's work lives in. */
static uint64_t machine_share(uint64_t set, uint64_t num, uint64_t den)
{
    if (set)
        return set;
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    return pages > 0 && page > 0 ? (uint64_t)pages * (uint64_t)page / den * num : 0;
}

static void exec_bounds(gd_daemon_t *d)
{
    gd_exec_host_bounds(d->exec, d->cfg.max_load_ms, d->cfg.max_capture_ms, d->cfg.max_replay_ms,
                        machine_share(d->cfg.max_executor_memory_bytes, 3, 4));
}

void gd_graphs_reload(gd_daemon_t *d)
{
    if (d->exec)
        exec_bounds(d);
}

/* The executors' watchdog: memory, direct replays past max_replay_ms, connections of executors
 * gone. A replay past its bound is killed within this much of it. */
#define EXEC_WATCH_MS 50

static void on_exec_watch(uv_timer_t *t)
{
    gd_daemon_t *d = t->data;
    gd_exec_host_watch(d->exec);
    gd_direct_watch(d);
}

/* The executor binary: executor_path, else beside graphd, else ../libexec/graphd/ from it. */
static void executor_path(const gd_daemon_t *d, char *buf, size_t len)
{
    if (d->cfg.executor_path && d->cfg.executor_path[0]) {
        snprintf(buf, len, "%s", d->cfg.executor_path);
        return;
    }
    char self[3072];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    self[n > 0 ? n : 0] = 0;
    char *slash = strrchr(self, '/');
    if (slash)
        *slash = 0;
    snprintf(buf, len, "%s/graphd-executor", self);
    if (access(buf, X_OK) != 0)
        snprintf(buf, len, "%s/../libexec/graphd/graphd-executor", self);
}

int gd_graphs_start(gd_daemon_t *d)
{
    pm_manager_set_device_free(d->pools, device_free_hook, d);
    char path[4096];
    executor_path(d, path, sizeof path);
    gd_exec_opts_t o = {
        .path = path,
        .intra_op_threads = (int)d->cfg.intra_op_threads,
        .cpu_devices = (int)d->cfg.cpu_devices,
        .max_unpacked = d->cfg.max_module_unpacked_bytes,
        .call_memory = machine_share(d->cfg.max_call_memory_bytes, 1, 2),
        .sandbox = d->cfg.executor_sandbox != 0,
        .spin = sysconf(_SC_NPROCESSORS_ONLN) >= 4,
        .replay_spin_us = d->cfg.replay_spin_us,
        .spin_slice_us = d->cfg.replay_spin_slice_us,
        .reply_max = d->cfg.reply_buffer_max_bytes,
        .cuda_queues = d->cfg.executor_cuda_queues,
    };
    if (d->cfg.executor_cgroup && (d->cgroup = gd_cgroup_open(NULL)) == NULL)
        return -1;
    o.cgroup = d->cgroup;
    if (gd_exec_host_create(&o, &d->exec) != 0)
        return -1;
    exec_bounds(d);
    uv_timer_init(d->loop, &d->exec_watch);
    d->exec_watch.data = d;
    uv_timer_start(&d->exec_watch, on_exec_watch, EXEC_WATCH_MS, EXEC_WATCH_MS);
    gd_info("module code runs in executors (%s), one per uid and device%s", path,
            o.sandbox ? "" : ", NOT sandboxed (executor_sandbox = 0)");
    if (gd_workers_init(&d->workers, d->loop, d->cfg.worker_spin_us, d->cfg.worker_idle_ms) != 0)
        return -1;
    bool can_spin = d->workers.can_spin;
    if (!can_spin && (d->cfg.worker_spin_us > 0 || d->cfg.replay_spin_us > 0))
        gd_info("worker_spin_us and replay_spin_us ignored: fewer than 4 CPUs, idle threads "
                "sleep at once");
    d->replay_spin_ns = can_spin ? d->cfg.replay_spin_us * 1000u : 0;
    uv_idle_init(d->loop, &d->replay_spin);
    d->replay_spin.data = d;
    return 0;
}

static void rpools_destroy(gd_gpool_t *p);

void gd_module_unref(gd_daemon_t *d, gd_module_t *m)
{
    if (--m->refs > 0)
        return;
    gd_module_t **pp = &d->modules;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    gd_exec_module_release(m->m);
    free(m);
}

_Noreturn void gd_exit_around_stuck_work(gd_daemon_t *d)
{
    if (strncmp(d->cfg.listen, "unix:", 5) == 0)
        unlink(d->cfg.listen + 5);
    fflush(stderr);
    _exit(d->exit_code);
}

void gd_graphs_stop(gd_daemon_t *d)
{
    if (uv_is_active((uv_handle_t *)&d->replay_spin))
        uv_idle_stop(&d->replay_spin);
    /* The workers run what they hold, within another shutdown_grace_ms. One still in a job
     * then is in a module that does not return (a forward that loops for ever): nothing can
     * stop that thread, and freeing what it uses would crash, so the daemon exits around it. */
    uint64_t wait_ms = d->cfg.shutdown_grace_ms ? d->cfg.shutdown_grace_ms : 1;
    gd_workers_stop_begin(&d->workers);
    gd_worker_t *stuck = gd_workers_join(&d->workers, wait_ms);
    if (stuck != NULL) {
        /* The worker waits for an executor that does not answer (a module that does not
         * return): killing the executors ends that wait. */
        gd_warn("the worker of uid %u on %s is still in a call %llu ms after the last grace "
                "period; killing the executors",
                (unsigned)stuck->uid, stuck->device, (unsigned long long)wait_ms);
        gd_exec_host_kill_all(d->exec);
        stuck = gd_workers_join(&d->workers, wait_ms);
    }
    if (stuck != NULL) {
        gd_error("the worker of uid %u on %s is still in a call after its executors were killed; "
                 "exiting without it",
                 (unsigned)stuck->uid, stuck->device);
        gd_exit_around_stuck_work(d);
    }
    gd_workers_close(&d->workers); /* after it, device blocks are freed on the loop */
    while (d->modules) {
        gd_module_t *m = d->modules;
        d->modules = m->next;
        gd_exec_module_release(m->m);
        free(m);
    }
    while (d->gpools) {
        gd_gpool_t *p = d->gpools;
        d->gpools = p->next;
        rpools_destroy(p);
        pthread_mutex_destroy(&p->rlock);
        free(p);
    }
    if (d->exec) {
        uv_timer_stop(&d->exec_watch);
        gd_exec_host_destroy(d->exec, wait_ms);
        d->exec = NULL;
    }
    gd_cgroup_close(d->cgroup); /* after the executors: their cgroups are empty now */
    d->cgroup = NULL;
}

/* Destroys r and forgets it (its graphs are gone); on its worker, or after the workers stopped.
 * The rlock is not held. */
static void rpool_destroy(gd_gpool_t *p, gd_rpool_t *r)
{
    if (gd_exec_pool_destroy(r->gp) != GR_OK)
        gd_warn("pool %s: %s", p->name, gd_exec_last_error());
    free(r);
}

/* Destroys every runtime pool of p (its graphs are gone), after the workers stopped. */
static void rpools_destroy(gd_gpool_t *p)
{
    while (p->rpools) {
        gd_rpool_t *r = p->rpools;
        p->rpools = r->next;
        rpool_destroy(p, r);
    }
}

/* Sums p's runtime pools' last measures into the figures status reads. Any worker. */
static void gpool_sum(gd_gpool_t *p)
{
    uint64_t reserved = 0, in_use = 0;
    pthread_mutex_lock(&p->rlock);
    for (gd_rpool_t *r = p->rpools; r; r = r->next) {
        reserved += atomic_load(&r->reserved);
        in_use += atomic_load(&r->in_use);
    }
    atomic_store(&p->mempool_reserved, reserved);
    atomic_store(&p->mempool_in_use, in_use);
    pthread_mutex_unlock(&p->rlock);
}

/* Unlinks r from p's list. */
static void rpool_unlink(gd_gpool_t *p, gd_rpool_t *r)
{
    pthread_mutex_lock(&p->rlock);
    gd_rpool_t **pp = &p->rpools;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    pthread_mutex_unlock(&p->rlock);
}

int gd_rpool_get(gd_gpool_t *p, uint64_t session, gd_exec_t *x, gd_worker_t *w, gd_rpool_t **out,
                 char *msg, size_t len)
{
    pthread_mutex_lock(&p->rlock);
    gd_rpool_t *r = p->rpools;
    while (r && r->session != session)
        r = r->next;
    pthread_mutex_unlock(&p->rlock);
    /* r, if any, is this session's: only this worker touches it. */
    if (r != NULL && r->gp != NULL && !gd_exec_pool_lost(r->gp)) {
        r->captures++;
        *out = r;
        return GR_OK;
    }
    bool fresh = r == NULL;
    if (fresh && (r = calloc(1, sizeof *r)) == NULL) {
        snprintf(msg, len, "out of memory");
        return GR_ENOMEM;
    }
    /* A pool left by an executor that was killed is gone with it: make it again. */
    gd_exec_pool_destroy(r->gp);
    r->gp = NULL;
    int rc = gd_exec_pool_create(x, p->device, &r->gp);
    if (rc != GR_OK) {
        snprintf(msg, len, "%s", gd_exec_last_error());
        if (fresh)
            free(r);
        return rc;
    }
    if (fresh) {
        r->session = session;
        r->worker = w;
        atomic_init(&r->reserved, 0);
        atomic_init(&r->in_use, 0);
        pthread_mutex_lock(&p->rlock);
        r->next = p->rpools;
        p->rpools = r;
        pthread_mutex_unlock(&p->rlock);
    }
    r->captures++;
    *out = r;
    return GR_OK;
}

/* On r's worker, after a capture and after a graph destroy (the times the graph mempool grows or
 * shrinks): destroys r when no graph and no capture holds it any more, else measures it. Status
 * never asks the runtime itself: the allocator snapshot takes the allocator's locks and walks its
 * segments (milliseconds on a busy device), and the loop thread must not wait on an executor; on
 * the worker it also never runs beside a capture in that executor. */
static void rpool_settle(gd_gpool_t *p, gd_rpool_t *r)
{
    if (r->graphs > 0 || r->captures > 0) {
        uint64_t res = 0, use = 0;
        if (gd_exec_pool_memory(r->gp, &res, &use) != GR_OK)
            gd_debug("pool %s: graph mempool size unknown: %s", p->name, gd_exec_last_error());
        atomic_store(&r->reserved, res);
        atomic_store(&r->in_use, use);
        gpool_sum(p);
        return;
    }
    int rc = gd_exec_pool_destroy(r->gp);
    if (rc == GR_EBUSY) /* the executor still has a use of it: it stays */
        return;
    if (rc != GR_OK) /* the handle is gone either way */
        gd_warn("pool %s: session %llu's graph mempool: %s", p->name,
                (unsigned long long)r->session, gd_exec_last_error());
    rpool_unlink(p, r);
    free(r);
    gpool_sum(p);
}

/* A graph of r was destroyed; the last one takes the session's graph mempool with it, unless a
 * capture of the session still holds it (for that capture's graphs). On r's worker. */
static void rpool_graph_gone(gd_gpool_t *p, gd_rpool_t *r)
{
    if (r == NULL || r->graphs == 0)
        return;
    r->graphs--;
    rpool_settle(p, r);
}

void gd_rpool_put(gd_gpool_t *p, gd_rpool_t *r)
{
    if (r == NULL || r->captures == 0)
        return;
    r->captures--;
    rpool_settle(p, r);
}

gd_gpool_t *gd_gpool_get(gd_daemon_t *d, const char *name, const char *device)
{
    for (gd_gpool_t *p = d->gpools; p; p = p->next)
        if (strcmp(p->name, name) == 0 && !p->deleted)
            return p;
    gd_gpool_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    snprintf(p->name, sizeof p->name, "%s", name);
    snprintf(p->device, sizeof p->device, "%s", device);
    pthread_mutex_init(&p->rlock, NULL);
    p->next = d->gpools;
    d->gpools = p;
    return p;
}

gd_gpool_t *gd_gpool_find(gd_daemon_t *d, const char *name)
{
    for (gd_gpool_t *p = d->gpools; p; p = p->next)
        if (strcmp(p->name, name) == 0 && !p->deleted)
            return p;
    return NULL;
}

/* Unlinks and frees a pool's runtime state (its runtime pools are gone). */
static void gpool_free(gd_daemon_t *d, gd_gpool_t *p)
{
    gd_gpool_t **pp = &d->gpools;
    while (*pp && *pp != p)
        pp = &(*pp)->next;
    if (*pp)
        *pp = p->next;
    pthread_mutex_destroy(&p->rlock);
    free(p);
}

/* A deleted pool's runtime pool left behind (its executor still had a use of it, or was
 * restarted), destroyed on its worker, since a device family may need its context to free graph
 * memory: in the daemon's queue, after that uid's graph destroys. */
typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_gpool_t *pool;
    gd_rpool_t *rpool;
} gpool_job_t;

static void gpool_destroy_run(gd_job_t *job)
{
    gpool_job_t *j = (gpool_job_t *)job;
    rpool_destroy(j->pool, j->rpool);
}

static void gpool_destroy_done(gd_job_t *job)
{
    gpool_job_t *j = (gpool_job_t *)job;
    if (--j->pool->destroying == 0)
        gpool_free(j->d, j->pool);
    free(j);
}

/* Frees a deleted pool's runtime state once no graph and no capture uses it. */
static void gpool_maybe_free(gd_daemon_t *d, gd_gpool_t *p)
{
    if (!p->deleted || p->graphs > 0 || p->captures > 0 || p->destroying > 0)
        return;
    /* Every job of the pool has run (the last graph destroy is done): its list is the loop's. */
    gd_rpool_t *rest = NULL;
    while (p->rpools) {
        gd_rpool_t *r = p->rpools;
        p->rpools = r->next;
        gpool_job_t *j = calloc(1, sizeof *j);
        if (j == NULL) { /* freed at exit instead */
            r->next = rest;
            rest = r;
            continue;
        }
        j->job.run = gpool_destroy_run;
        j->job.done = gpool_destroy_done;
        j->job.session = 0; /* the daemon's queue: after that uid's graph destroys */
        j->d = d;
        j->pool = p;
        j->rpool = r;
        p->destroying++;
        gd_worker_submit(r->worker, &j->job);
    }
    p->rpools = rest;
    if (p->destroying == 0 && rest == NULL)
        gpool_free(d, p);
}

void gd_gpool_capture_done(gd_daemon_t *d, gd_gpool_t *p)
{
    if (p->captures > 0)
        p->captures--;
    gpool_maybe_free(d, p);
}

void gd_graphs_pool_deleted(gd_daemon_t *d, const char *pool)
{
    gd_gpool_t *p = gd_gpool_find(d, pool);
    if (p) {
        p->deleted = true;
        gpool_maybe_free(d, p);
    }
}

/* ---- graph lifetime ---------------------------------------------------- */

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_graph_t *graph;
    uint64_t direct_replays; /* that came to its executor directly, for its session's count */
} graph_job_t;

static void graph_destroy_run(gd_job_t *job)
{
    graph_job_t *j = (graph_job_t *)job;
    gd_xstats_t last = {0};
    if (j->graph->g && gd_exec_graph_destroy(j->graph->g, &last) != GR_OK)
        gd_warn("graph %llu: %s", (unsigned long long)j->graph->id, gd_exec_last_error());
    /* The pool's and the session's figures keep its direct replays. */
    gd_hist_merge(&j->graph->pool->latency, &last.latency);
    j->direct_replays = last.forward + last.backward + last.errors;
    j->graph->g = NULL;
    rpool_graph_gone(j->graph->pool, j->graph->rpool); /* and measures it for status */
}

static void graph_destroy_done(gd_job_t *job)
{
    graph_job_t *j = (graph_job_t *)job;
    gd_graph_t *g = j->graph;
    gd_session_t *s = gd_session_find(j->d, g->session);
    if (s)
        s->replays += j->direct_replays;
    g->pool->graphs--;
    gpool_maybe_free(j->d, g->pool);
    free(g);
    free(j);
}

/* The borrowed region of the mempool segment e lies in, for g's session: g takes a reference
 * (one per segment, however many of its tensors lie there). 0 and *region_id, or a PM_ error. */
int gd_graph_borrow(gd_graph_t *g, pm_pool_t *pool, const gr_external_t *e, uint64_t *region_id)
{
    gd_borrow_t *b = g->pool->borrows;
    while (b && !(b->session == g->session && b->base == e->base))
        b = b->next;
    for (size_t k = 0; b && k < g->nborrows; k++)
        if (g->borrows[k] == b) {
            *region_id = b->region_id;
            return PM_OK;
        }
    gd_borrow_t **grown = realloc(g->borrows, (g->nborrows + 1) * sizeof *grown);
    if (grown == NULL)
        return PM_ENOMEM;
    g->borrows = grown;
    if (b == NULL) {
        b = calloc(1, sizeof *b);
        if (b == NULL)
            return PM_ENOMEM;
        pm_region_t *r = NULL;
        int rc = pm_region_borrow_device(pool, g->session, e->size, e->base, e->handle, &r);
        if (rc != PM_OK) {
            free(b);
            return rc;
        }
        b->session = g->session;
        b->base = e->base;
        b->region_id = pm_region_id(r);
        b->next = g->pool->borrows;
        g->pool->borrows = b;
    }
    b->refs++;
    g->borrows[g->nborrows++] = b;
    *region_id = b->region_id;
    return PM_OK;
}

/* Drops g's references to borrowed regions; a region no graph uses any more goes (unless the
 * session's end reclaims it: free_region false). */
static void graph_unborrow(gd_daemon_t *d, gd_graph_t *g, bool free_region)
{
    for (size_t k = 0; k < g->nborrows; k++) {
        gd_borrow_t *b = g->borrows[k];
        if (--b->refs > 0)
            continue;
        if (free_region)
            pm_region_free(d->pools, b->region_id, b->session);
        gd_borrow_t **pp = &g->pool->borrows;
        while (*pp && *pp != b)
            pp = &(*pp)->next;
        if (*pp)
            *pp = b->next;
        free(b);
    }
    free(g->borrows);
    g->borrows = NULL;
    g->nborrows = 0;
}

/* Unlinks a graph and destroys it on its worker, after whatever it still has queued. The region
 * is the caller's business: freed here when free_region, else reclaimed with the session. */
void gd_graph_release(gd_daemon_t *d, gd_graph_t *g, bool free_region)
{
    /* The borrowed regions only describe mempool memory: they go at once (the client has closed
     * its mappings), and the memory with the graph on the worker. */
    graph_unborrow(d, g, free_region);
    gd_graph_t **pp = &d->graphs;
    while (*pp && *pp != g)
        pp = &(*pp)->next;
    if (*pp)
        *pp = g->next;
    gd_session_t *s = gd_session_find(d, g->session);
    if (s)
        s->graphs--;
    uint64_t region_id = g->region_id, session = g->session;
    graph_job_t *j = calloc(1, sizeof *j);
    if (j == NULL) {
        gd_error("out of memory releasing graph %llu; it stays allocated",
                 (unsigned long long)g->id);
    } else {
        j->job.run = graph_destroy_run;
        j->job.done = graph_destroy_done;
        j->job.session = g->session; /* after the graph's replays queued there */
        j->d = d;
        j->graph = g;
        gd_worker_submit(g->worker, &j->job);
    }
    /* After the destroy job: a device region's memory is freed behind it on the worker. */
    if (free_region)
        pm_region_free(d->pools, region_id, session);
}

gd_graph_t *gd_graph_find(gd_daemon_t *d, uint64_t id)
{
    for (gd_graph_t *g = d->graphs; g; g = g->next)
        if (g->id == id)
            return g;
    return NULL;
}

void gd_graphs_session_ended(gd_daemon_t *d, gd_session_t *s)
{
    gd_graph_t *g = d->graphs;
    while (g) {
        gd_graph_t *next = g->next;
        if (g->session == s->id)
            gd_graph_release(d, g, false);
        g = next;
    }
    gd_module_t *m = d->modules;
    while (m) {
        gd_module_t *next = m->next;
        if (m->session == s->id && !m->released) {
            m->released = true;
            gd_module_unref(d, m);
        }
        m = next;
    }
}

void gd_rpc_release_graph(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__ReleaseGraphRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "releasing graphs");
    if (s == NULL)
        return;
    gd_graph_t *g = gd_graph_find(d, req->graph_id);
    if (g == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no graph %llu", (unsigned long long)req->graph_id);
        return;
    }
    if (g->session != s->id) {
        gd_call_fail(call, GD_PERMISSION_DENIED, "graph %llu belongs to another session",
                     (unsigned long long)req->graph_id);
        return;
    }
    gd_graph_release(d, g, true);
    Graphd__V1__ReleaseGraphReply rep = GRAPHD__V1__RELEASE_GRAPH_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}
