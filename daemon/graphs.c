/*
 * Modules, captures, graphs and replays: the daemon's side of graph_runtime.
 *
 * The loop thread owns the tables (modules, graphs, runtime pools) and every
 * region. Device work runs on the device's worker: captures in two steps
 * (prepare on the worker; allocate the static regions on the loop, where the
 * pool limits live; finish on the worker), replays one job each. A replay
 * that came in on the session socket is answered by the worker itself through
 * the connection's wire; one that came through gRPC goes back to the loop.
 *
 * A graph maps its region a second time, privately: when its session ends the
 * region leaves the pool at once (status shows it gone), while the graph's own
 * mapping stays valid until the worker, after any replay still queued, has
 * destroyed the graph.
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
#include "daemon.h"
#include "graphd.pb-c.h"
#include "log.h"
#include "runtime.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#define MAX_CALLABLES 64
#define MAX_ARGS 256
#define MAX_WARMUP 1000

struct gd_module {
    uint64_t id;
    uint64_t session;
    gr_module_t *m;
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
 * Only the pool's worker touches rpools (creates, counts, measures, destroys them).
 */
typedef struct gd_rpool {
    uint64_t session;
    gr_pool_t *gp;
    uint32_t graphs; /* graphs captured in it and not yet destroyed */
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
    gd_worker_t *worker;
    gd_rpool_t *rpools; /* per session, created by the worker at the session's first capture */
    gd_borrow_t *borrows;
    uint32_t graphs;
    bool deleted;
    gd_hist_t latency;
    /* graph mempool bytes (gr_pool_memory), written by the worker, read by status */
    atomic_uint_fast64_t mempool_reserved, mempool_in_use;
    gd_gpool_t *next;
};

static void gpool_measure(gd_gpool_t *p);
static void rpools_destroy(gd_gpool_t *p);

struct gd_graph {
    uint64_t id;
    uint64_t session;
    gd_gpool_t *pool;
    gd_rpool_t *rpool; /* the session's runtime pool in it (worker-side) */
    gd_worker_t *worker;
    gr_graph_t *g;
    void *base; /* the graph's own mapping of its region */
    size_t map_len;
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

int gd_status_from_gr(int err)
{
    switch (err) {
    case GR_OK:
        return GD_OK;
    case GR_EINVAL:
        return GD_INVALID_ARGUMENT;
    case GR_ENOTFOUND:
        return GD_NOT_FOUND;
    case GR_EPRECOND:
    case GR_EBUSY:
        return GD_FAILED_PRECONDITION;
    case GR_ENOMEM:
        return GD_RESOURCE_EXHAUSTED;
    case GR_EUNSUPPORTED:
        return GD_UNIMPLEMENTED;
    default:
        return GD_INTERNAL;
    }
}

gd_worker_t *gd_worker_for(gd_daemon_t *d, const char *device)
{
    for (size_t i = 0; i < d->nworkers; i++)
        if (strcmp(d->workers[i].device, device) == 0)
            return &d->workers[i];
    return NULL;
}

/* ---- device memory ----------------------------------------------------- */

/* Frees one device block on its device's worker, after whatever is queued there. */
typedef struct {
    gd_job_t job;
    char device[GR_DEVICE_MAX];
    void *ptr;
} devfree_job_t;

static void devfree_run(gd_job_t *job)
{
    devfree_job_t *j = (devfree_job_t *)job;
    if (gr_device_free(j->device, j->ptr) != GR_OK)
        gd_warn("freeing device memory on %s: %s", j->device, gr_last_error());
    free(j);
}

/* The pool manager's device-free hook (loop thread): a device region was freed. */
static void device_free_hook(void *ctx, const char *device, void *ptr, uint64_t size)
{
    gd_daemon_t *d = ctx;
    gd_worker_t *w = gd_worker_for(d, device);
    if (w == NULL) { /* the workers have stopped: nothing can use the memory any more */
        if (gr_device_free(device, ptr) != GR_OK)
            gd_warn("freeing device memory on %s: %s", device, gr_last_error());
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
    snprintf(j->device, sizeof j->device, "%s", device);
    j->ptr = ptr;
    gd_worker_submit(w, &j->job);
}

/* ---- start and stop ---------------------------------------------------- */

int gd_graphs_start(gd_daemon_t *d)
{
    pm_manager_set_device_free(d->pools, device_free_hook, d);
    if (gr_runtime_init((int)d->cfg.intra_op_threads) != GR_OK ||
        gr_cpu_devices((int)d->cfg.cpu_devices) != GR_OK ||
        gr_module_max_unpacked(d->cfg.max_module_unpacked_bytes) != GR_OK) {
        gd_error("graph runtime: %s", gr_last_error());
        return -1;
    }
    gd_info("graph runtime: libtorch %s", gr_runtime_torch_version());
    for (size_t i = 0; i < d->ndevices; i++) {
        if (gd_worker_start(&d->workers[i], d->loop, d->devices[i].id, d->cfg.worker_spin_us) != 0)
            return -1;
        d->nworkers++;
    }
    bool can_spin = d->nworkers > 0 && d->workers[0].can_spin;
    if (!can_spin && (d->cfg.worker_spin_us > 0 || d->cfg.replay_spin_us > 0))
        gd_info("worker_spin_us and replay_spin_us ignored: fewer than 4 CPUs, idle threads "
                "sleep at once");
    d->replay_spin_ns = can_spin ? d->cfg.replay_spin_us * 1000u : 0;
    uv_idle_init(d->loop, &d->replay_spin);
    d->replay_spin.data = d;
    return 0;
}

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

static void module_unref(gd_daemon_t *d, gd_module_t *m)
{
    if (--m->refs > 0)
        return;
    gd_module_t **pp = &d->modules;
    while (*pp && *pp != m)
        pp = &(*pp)->next;
    if (*pp)
        *pp = m->next;
    gr_module_release(m->m);
    free(m);
}

void gd_graphs_stop(gd_daemon_t *d)
{
    if (uv_is_active((uv_handle_t *)&d->replay_spin))
        uv_idle_stop(&d->replay_spin);
    for (size_t i = 0; i < d->nworkers; i++)
        gd_worker_stop(&d->workers[i]);
    d->nworkers = 0;
    while (d->gpools) {
        gd_gpool_t *p = d->gpools;
        d->gpools = p->next;
        rpools_destroy(p);
        free(p);
    }
    while (d->modules) {
        gd_module_t *m = d->modules;
        d->modules = m->next;
        gr_module_release(m->m);
        free(m);
    }
}

/* Destroys every runtime pool of p (its graphs are gone); on p's worker, or after it stopped. */
static void rpools_destroy(gd_gpool_t *p)
{
    while (p->rpools) {
        gd_rpool_t *r = p->rpools;
        p->rpools = r->next;
        if (gr_pool_destroy(r->gp) != GR_OK)
            gd_warn("pool %s: %s", p->name, gr_last_error());
        free(r);
    }
}

/* The session's runtime pool in p, created on first use; on p's worker. GR_OK, or an error with
 * its message in msg. */
static int rpool_get(gd_gpool_t *p, uint64_t session, gd_rpool_t **out, char *msg, size_t len)
{
    for (gd_rpool_t *r = p->rpools; r; r = r->next)
        if (r->session == session) {
            *out = r;
            return GR_OK;
        }
    gd_rpool_t *r = calloc(1, sizeof *r);
    if (r == NULL) {
        snprintf(msg, len, "out of memory");
        return GR_ENOMEM;
    }
    int rc = gr_pool_create(p->worker->device, &r->gp);
    if (rc != GR_OK) {
        snprintf(msg, len, "%s", gr_last_error());
        free(r);
        return rc;
    }
    r->session = session;
    r->next = p->rpools;
    p->rpools = r;
    *out = r;
    return GR_OK;
}

/* A graph of r was destroyed; the last one takes the session's graph mempool with it, unless a
 * capture of the session holds the runtime pool (gr_pool_destroy refuses: GR_EBUSY), in which
 * case it stays for that capture's graphs. On the worker. */
static void rpool_graph_gone(gd_gpool_t *p, gd_rpool_t *r)
{
    if (r == NULL || --r->graphs > 0 || gr_pool_destroy(r->gp) != GR_OK)
        return;
    gd_rpool_t **pp = &p->rpools;
    while (*pp && *pp != r)
        pp = &(*pp)->next;
    if (*pp)
        *pp = r->next;
    free(r);
}

static gd_gpool_t *gpool_get(gd_daemon_t *d, const char *name, gd_worker_t *w)
{
    for (gd_gpool_t *p = d->gpools; p; p = p->next)
        if (strcmp(p->name, name) == 0 && !p->deleted)
            return p;
    gd_gpool_t *p = calloc(1, sizeof *p);
    if (p == NULL)
        return NULL;
    snprintf(p->name, sizeof p->name, "%s", name);
    p->worker = w;
    p->next = d->gpools;
    d->gpools = p;
    return p;
}

static gd_gpool_t *gpool_find(gd_daemon_t *d, const char *name)
{
    for (gd_gpool_t *p = d->gpools; p; p = p->next)
        if (strcmp(p->name, name) == 0 && !p->deleted)
            return p;
    return NULL;
}

/* Frees a deleted pool's runtime state once no graph uses it; on its worker, since a device
 * family may need its context to free graph memory. */
typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_gpool_t *pool;
} gpool_job_t;

static void gpool_destroy_run(gd_job_t *job)
{
    gpool_job_t *j = (gpool_job_t *)job;
    rpools_destroy(j->pool);
}

static void gpool_destroy_done(gd_job_t *job)
{
    gpool_job_t *j = (gpool_job_t *)job;
    gd_gpool_t **pp = &j->d->gpools;
    while (*pp && *pp != j->pool)
        pp = &(*pp)->next;
    if (*pp)
        *pp = j->pool->next;
    free(j->pool);
    free(j);
}

static void gpool_maybe_free(gd_daemon_t *d, gd_gpool_t *p)
{
    if (!p->deleted || p->graphs > 0)
        return;
    gpool_job_t *j = calloc(1, sizeof *j);
    if (j == NULL)
        return; /* freed at exit instead */
    j->job.run = gpool_destroy_run;
    j->job.done = gpool_destroy_done;
    j->d = d;
    j->pool = p;
    gd_worker_submit(p->worker, &j->job);
}

void gd_graphs_pool_deleted(gd_daemon_t *d, const char *pool)
{
    gd_gpool_t *p = gpool_find(d, pool);
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
} graph_job_t;

static void graph_destroy_run(gd_job_t *job)
{
    graph_job_t *j = (graph_job_t *)job;
    if (j->graph->g)
        gr_graph_destroy(j->graph->g);
    j->graph->g = NULL;
    rpool_graph_gone(j->graph->pool, j->graph->rpool);
    gpool_measure(j->graph->pool);
}

static void graph_destroy_done(gd_job_t *job)
{
    graph_job_t *j = (graph_job_t *)job;
    gd_graph_t *g = j->graph;
    if (g->base)
        munmap(g->base, g->map_len);
    g->pool->graphs--;
    gpool_maybe_free(j->d, g->pool);
    free(g);
    free(j);
}

/* The borrowed region of the mempool segment e lies in, for g's session: g takes a reference
 * (one per segment, however many of its tensors lie there). 0 and *region_id, or a PM_ error. */
static int graph_borrow(gd_graph_t *g, pm_pool_t *pool, const gr_external_t *e, uint64_t *region_id)
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
static void graph_release(gd_daemon_t *d, gd_graph_t *g, bool free_region)
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
        j->d = d;
        j->graph = g;
        gd_worker_submit(g->worker, &j->job);
    }
    /* After the destroy job: a device region's memory is freed behind it on the worker. */
    if (free_region)
        pm_region_free(d->pools, region_id, session);
}

static gd_graph_t *graph_find(gd_daemon_t *d, uint64_t id)
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
            graph_release(d, g, false);
        g = next;
    }
    gd_module_t *m = d->modules;
    while (m) {
        gd_module_t *next = m->next;
        if (m->session == s->id && !m->released) {
            m->released = true;
            module_unref(d, m);
        }
        m = next;
    }
}

/* ---- modules ----------------------------------------------------------- */

typedef struct {
    uv_work_t work;
    gd_daemon_t *d;
    gd_call_t *call;
    uint64_t session;
    char name[GD_NAME_MAX + 1];
    const void *bytes;
    size_t len;
    void *map; /* a private mapping of the source region, or NULL for inline bytes */
    size_t map_len;
    uint8_t expect[GR_SHA256_LEN];
    bool check_sha;
    int rc;
    char msg[1024];
    gr_module_t *m;
    gr_module_info_t info;
} load_op_t;

static void load_run(uv_work_t *w)
{
    load_op_t *op = w->data;
    op->rc = gr_module_load(op->bytes, op->len, &op->m);
    if (op->rc != GR_OK) {
        snprintf(op->msg, sizeof op->msg, "%s", gr_last_error());
        return;
    }
    gr_module_info(op->m, &op->info);
}

static void load_done(uv_work_t *w, int status)
{
    (void)status;
    load_op_t *op = w->data;
    gd_daemon_t *d = op->d;
    if (op->map)
        munmap(op->map, op->map_len);
    if (op->rc != GR_OK) {
        gd_call_fail(op->call, gd_status_from_gr(op->rc), "module does not load: %s", op->msg);
        free(op);
        return;
    }
    if (op->check_sha && memcmp(op->expect, op->info.sha256, GR_SHA256_LEN) != 0) {
        gr_module_release(op->m);
        gd_call_fail(op->call, GD_INVALID_ARGUMENT,
                     "module bytes do not match the expected SHA-256 (corrupt or changed)");
        free(op);
        return;
    }
    gd_session_t *s = gd_session_find(d, op->session);
    gd_module_t *m = s ? calloc(1, sizeof *m) : NULL;
    if (m == NULL) {
        gr_module_release(op->m);
        gd_call_fail(op->call, s ? GD_INTERNAL : GD_NOT_FOUND,
                     s ? "out of memory" : "the session ended during the load");
        free(op);
        return;
    }
    m->id = ++d->next_module_id;
    m->session = op->session;
    m->m = op->m;
    m->refs = 1;
    m->training = op->info.is_training;
    memcpy(m->sha256, op->info.sha256, GR_SHA256_LEN);
    if (op->name[0])
        snprintf(m->name, sizeof m->name, "%s", op->name);
    else
        snprintf(m->name, sizeof m->name, "sha256:%02x%02x%02x%02x%02x%02x", m->sha256[0],
                 m->sha256[1], m->sha256[2], m->sha256[3], m->sha256[4], m->sha256[5]);
    m->next = d->modules;
    d->modules = m;
    s->modules++;
    gd_info("session %llu: module %llu (%s) loaded%s", (unsigned long long)s->id,
            (unsigned long long)m->id, m->name, op->info.refcount > 1 ? " (reused)" : "");
    Graphd__V1__RegisterModuleReply rep = GRAPHD__V1__REGISTER_MODULE_REPLY__INIT;
    rep.module_id = m->id;
    rep.sha256.data = m->sha256;
    rep.sha256.len = GR_SHA256_LEN;
    rep.reused = op->info.refcount > 1;
    rep.training = m->training != 0;
    gd_call_reply(op->call, &rep.base);
    free(op);
}

void gd_rpc_register_module(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__RegisterModuleRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "registering modules");
    if (s == NULL)
        return;
    if (req->format != GRAPHD__V1__MODULE_FORMAT__MODULE_FORMAT_UNSPECIFIED &&
        req->format != GRAPHD__V1__MODULE_FORMAT__MODULE_FORMAT_TORCHSCRIPT) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "unknown module format %d", (int)req->format);
        return;
    }
    if (req->sha256.len != 0 && req->sha256.len != GR_SHA256_LEN) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "sha256 must be 32 bytes, not %zu",
                     req->sha256.len);
        return;
    }
    if (strlen(req->name) > GD_NAME_MAX) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "module name is longer than %d bytes", GD_NAME_MAX);
        return;
    }
    load_op_t *op = calloc(1, sizeof *op);
    if (op == NULL) {
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    op->d = d;
    op->call = call;
    op->session = s->id;
    snprintf(op->name, sizeof op->name, "%s", req->name);
    if (req->sha256.len) {
        op->check_sha = true;
        memcpy(op->expect, req->sha256.data, GR_SHA256_LEN);
    }
    if (req->source_case == GRAPHD__V1__REGISTER_MODULE_REQUEST__SOURCE_INLINE_BYTES) {
        if (req->inline_bytes.len == 0) {
            gd_call_fail(call, GD_INVALID_ARGUMENT, "inline_bytes is empty");
            free(op);
            return;
        }
        if (req->inline_bytes.len > d->cfg.inline_module_max_bytes) {
            gd_call_fail(call, GD_INVALID_ARGUMENT,
                         "inline module of %zu bytes is over inline_module_max_bytes (%llu); "
                         "put it in a region",
                         req->inline_bytes.len, (unsigned long long)d->cfg.inline_module_max_bytes);
            free(op);
            return;
        }
        /* The request stays alive until the call is finished. */
        op->bytes = req->inline_bytes.data;
        op->len = req->inline_bytes.len;
    } else if (req->source_case == GRAPHD__V1__REGISTER_MODULE_REQUEST__SOURCE_REGION) {
        const Graphd__V1__RegionSlice *sl = req->region;
        pm_region_t *r = pm_region_find(d->pools, sl->region_id);
        if (r == NULL) {
            gd_call_fail(call, GD_NOT_FOUND, "no region %llu", (unsigned long long)sl->region_id);
            free(op);
            return;
        }
        if (pm_region_owner(r) != s->id) {
            gd_call_fail(call, GD_PERMISSION_DENIED, "region %llu belongs to another session",
                         (unsigned long long)sl->region_id);
            free(op);
            return;
        }
        if (pm_region_is_device(r)) {
            gd_call_fail(call, GD_INVALID_ARGUMENT,
                         "region %llu is device memory; put the module in a host region",
                         (unsigned long long)sl->region_id);
            free(op);
            return;
        }
        uint64_t rsize = pm_region_size(r);
        if (sl->size == 0 || sl->offset > rsize || sl->size > rsize - sl->offset) {
            gd_call_fail(call, GD_INVALID_ARGUMENT,
                         "bytes [%llu, +%llu) are not inside region %llu of %llu bytes",
                         (unsigned long long)sl->offset, (unsigned long long)sl->size,
                         (unsigned long long)sl->region_id, (unsigned long long)rsize);
            free(op);
            return;
        }
        /* A private read-only mapping: the session may free the region while the load runs. */
        op->map_len = pm_region_mapped_size(r);
        op->map = mmap(NULL, op->map_len, PROT_READ, MAP_SHARED, pm_region_fd(r), 0);
        if (op->map == MAP_FAILED) {
            gd_error("mmap region %llu: %s", (unsigned long long)sl->region_id, strerror(errno));
            gd_call_fail(call, GD_RESOURCE_EXHAUSTED, "cannot map region %llu",
                         (unsigned long long)sl->region_id);
            free(op);
            return;
        }
        op->bytes = (const char *)op->map + sl->offset;
        op->len = sl->size;
    } else {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "give the module as a region slice or inline");
        free(op);
        return;
    }
    op->work.data = op;
    uv_queue_work(d->loop, &op->work, load_run, load_done);
}

/* Finds a module handle of session s; on failure finishes the call. */
static gd_module_t *module_of(gd_daemon_t *d, gd_call_t *call, gd_session_t *s, uint64_t id)
{
    for (gd_module_t *m = d->modules; m; m = m->next) {
        if (m->id != id || m->released)
            continue;
        if (m->session != s->id) {
            gd_call_fail(call, GD_PERMISSION_DENIED, "module %llu belongs to another session",
                         (unsigned long long)id);
            return NULL;
        }
        return m;
    }
    gd_call_fail(call, GD_NOT_FOUND, "no module %llu", (unsigned long long)id);
    return NULL;
}

void gd_rpc_release_module(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__ReleaseModuleRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "releasing modules");
    if (s == NULL)
        return;
    gd_module_t *m = module_of(d, call, s, req->module_id);
    if (m == NULL)
        return;
    m->released = true;
    s->modules--;
    module_unref(d, m);
    Graphd__V1__ReleaseModuleReply rep = GRAPHD__V1__RELEASE_MODULE_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}

/* ---- capture ----------------------------------------------------------- */

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_call_t *call;
    uint64_t session;
    gd_gpool_t *pool;
    gd_rpool_t *rpool; /* set on the worker in step 1 */
    size_t n;
    gd_module_t *mods[MAX_CALLABLES];
    gr_callable_spec_t specs[MAX_CALLABLES];
    gr_arg_spec_t *args;
    gr_capture_opts_t opts;
    gr_capture_t *cap;
    int rc;
    char msg[1024];
    /* gd_now_ns() at each step's start and end, for the capture's log line: where its time goes
     * (the gaps between them are waits in the worker's queue and the loop's) */
    uint64_t t0, prepare_start, prepare_end, regions_start, regions_end, finish_start, finish_end;
    /* filled on the loop between the two steps */
    uint64_t region_ids[MAX_CALLABLES];
    void *bases[MAX_CALLABLES];
    size_t map_lens[MAX_CALLABLES];
    gr_graph_t *graphs[MAX_CALLABLES];
    /* device-resident (opts.resident): blocks allocated by the worker after prepare, owned here
     * until the loop registers them as regions (then NULL here) */
    void *dev_ptrs[MAX_CALLABLES];
    uint64_t dev_sizes[MAX_CALLABLES];
    uint8_t dev_handles[MAX_CALLABLES][GR_IPC_HANDLE_SIZE];
} capture_op_t;

static void capture_op_free(gd_daemon_t *d, capture_op_t *op)
{
    for (size_t i = 0; i < op->n; i++)
        if (op->mods[i])
            module_unref(d, op->mods[i]);
    free(op->args);
    free(op);
}

/* Gives back what phase 2 took: the graphs' mappings, and their regions unless the session's end
 * has reclaimed them already. */
static void capture_unwind(gd_daemon_t *d, capture_op_t *op, bool free_regions)
{
    for (size_t i = 0; i < op->n; i++) {
        if (op->bases[i] && !op->opts.resident) /* device blocks go with their regions */
            munmap(op->bases[i], op->map_lens[i]);
        op->bases[i] = NULL;
        if (op->region_ids[i] && free_regions)
            pm_region_free(d->pools, op->region_ids[i], op->session);
        op->region_ids[i] = 0;
    }
}

/* On the worker: frees the device blocks that no region owns. */
static void capture_free_blocks(capture_op_t *op)
{
    for (size_t i = 0; i < op->n; i++) {
        if (op->dev_ptrs[i] && gr_device_free(op->pool->worker->device, op->dev_ptrs[i]) != GR_OK)
            gd_warn("freeing device memory on %s: %s", op->pool->worker->device, gr_last_error());
        op->dev_ptrs[i] = NULL;
    }
}

static void capture_abort_run(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    if (op->cap)
        gr_capture_abort(op->cap);
    op->cap = NULL;
    capture_free_blocks(op);
}

static void capture_abort_done(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    capture_op_free(op->d, op);
}

/* Fails the call and drops the prepared capture on its worker. */
static void capture_fail(capture_op_t *op, int status, const char *msg)
{
    gd_call_fail(op->call, status, "%s", msg);
    op->job.run = capture_abort_run;
    op->job.done = capture_abort_done;
    gd_worker_submit(op->pool->worker, &op->job);
}

/* Borrowed regions for g's external tensors: region_ids[k] for layout tensor k (0 for those in
 * g's own region). false, and the call failed, when a region cannot be made. */
static bool graph_borrow_all(gd_graph_t *g, pm_pool_t *pool, uint64_t *region_ids, size_t count,
                             gd_call_t *call)
{
    size_t n = 0;
    if (gr_graph_external(g->g, &n, NULL) != GR_OK || n == 0)
        return true;
    gr_external_t *ext = calloc(n, sizeof *ext);
    if (ext == NULL || gr_graph_external(g->g, &n, ext) != GR_OK) {
        free(ext);
        gd_call_fail(call, GD_INTERNAL, "out of memory describing graph %llu",
                     (unsigned long long)g->id);
        return false;
    }
    for (size_t k = 0; k < n; k++) {
        int rc = ext[k].tensor < count && pool != NULL
                     ? graph_borrow(g, pool, &ext[k], &region_ids[ext[k].tensor])
                     : PM_EINVAL;
        if (rc != PM_OK) {
            gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                         "graph %llu: cannot export the memory of tensor %zu: %s",
                         (unsigned long long)g->id, ext[k].tensor, pm_strerror(rc));
            free(ext);
            return false;
        }
    }
    free(ext);
    return true;
}

/* fill_desc's role mapping: graphd.v1.TensorRole is gr_role_t + 1 (0 is ROLE_UNSPECIFIED), and
 * the wire has a role for each of graph_runtime's. */
_Static_assert(GRAPHD__V1__TENSOR_ROLE__ROLE_INPUT == GR_ROLE_INPUT + 1 &&
                   GRAPHD__V1__TENSOR_ROLE__ROLE_BUFFER == GR_ROLE_BUFFER + 1 &&
                   GRAPHD__V1__TENSOR_ROLE__ROLE_RNG_STATE == GR_ROLE_RNG_STATE + 1 &&
                   GR_ROLE_COUNT == GR_ROLE_RNG_STATE + 1,
               "graph_runtime's tensor roles and the wire protocol's disagree");

static void fill_desc(Graphd__V1__TensorDesc *t, const gr_tensor_desc_t *g, uint64_t region)
{
    graphd__v1__tensor_desc__init(t);
    t->role = (Graphd__V1__TensorRole)(g->role + 1);
    t->index = g->index;
    t->name = (char *)(g->name ? g->name : "");
    t->dtype = (Graphd__V1__DType)g->dtype;
    t->n_shape = g->ndim;
    t->shape = (int64_t *)g->shape;
    t->n_strides = g->ndim;
    t->strides = (int64_t *)g->strides;
    t->region_id = region;
    t->offset = g->offset;
    t->nbytes = g->nbytes;
    t->requires_grad = (g->flags & GR_TENSOR_REQUIRES_GRAD) != 0;
    t->absent = (g->flags & GR_TENSOR_ABSENT) != 0;
}

static void capture_finish_run(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    op->finish_start = gd_now_ns();
    op->rc = gr_capture_finish(op->cap, op->bases, op->graphs);
    op->cap = NULL; /* consumed either way */
    if (op->rc == GR_OK)
        op->rpool->graphs += (uint32_t)op->n;
    gpool_measure(op->pool);
    if (op->rc != GR_OK)
        snprintf(op->msg, sizeof op->msg, "%s", gr_last_error());
    op->finish_end = gd_now_ns();
}

static double ms_between(uint64_t from, uint64_t to)
{
    return (double)(to - from) / 1e6;
}

static void capture_finish_done(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    gd_daemon_t *d = op->d;
    gd_session_t *s = gd_session_find(d, op->session);
    if (op->rc != GR_OK) {
        capture_unwind(d, op, s != NULL);
        gd_call_fail(op->call, gd_status_from_gr(op->rc), "capture failed: %s", op->msg);
        capture_op_free(d, op);
        return;
    }
    /* Register the graphs even if the session is gone: releasing them is the one cleanup path. */
    gd_graph_t *graphs[MAX_CALLABLES] = {0};
    for (size_t i = 0; i < op->n; i++) {
        gd_graph_t *g = calloc(1, sizeof *g);
        if (g == NULL)
            abort(); /* a few hundred bytes; nothing sane to unwind to */
        gr_graph_info_t info;
        gr_graph_info(op->graphs[i], &info);
        g->id = ++d->next_graph_id;
        g->session = op->session;
        g->pool = op->pool;
        g->rpool = op->rpool;
        g->worker = op->pool->worker;
        g->g = op->graphs[i];
        g->base = op->opts.resident ? NULL : op->bases[i]; /* device memory: its region's */
        g->resident = op->opts.resident != 0;
        g->map_len = op->map_lens[i];
        g->region_id = op->region_ids[i];
        g->region_bytes = info.total_bytes;
        g->training = info.is_training != 0;
        snprintf(g->module, sizeof g->module, "%s", op->mods[i]->name);
        g->next = d->graphs;
        d->graphs = g;
        op->pool->graphs++;
        if (s)
            s->graphs++;
        graphs[i] = g;
    }
    if (s == NULL) {
        for (size_t i = 0; i < op->n; i++)
            graph_release(d, graphs[i], false);
        gd_call_fail(op->call, GD_NOT_FOUND, "the session ended during the capture");
        capture_op_free(d, op);
        return;
    }
    uint64_t ns = gd_now_ns() - op->t0;
    double steps_ms = ms_between(op->prepare_start, op->prepare_end) +
                      ms_between(op->regions_start, op->regions_end) +
                      ms_between(op->finish_start, op->finish_end);
    gd_info("session %llu: captured %zu graph%s in pool %s (%.1f ms: prepare %.1f ms, regions "
            "%.1f ms, finish %.1f ms, queued %.1f ms)",
            (unsigned long long)op->session, op->n, op->n == 1 ? "" : "s", op->pool->name,
            (double)ns / 1e6, ms_between(op->prepare_start, op->prepare_end),
            ms_between(op->regions_start, op->regions_end),
            ms_between(op->finish_start, op->finish_end), (double)ns / 1e6 - steps_ms);

    Graphd__V1__CaptureReply rep = GRAPHD__V1__CAPTURE_REPLY__INIT;
    Graphd__V1__GraphInfo infos[MAX_CALLABLES], *info_list[MAX_CALLABLES];
    gr_tensor_desc_t *descs[MAX_CALLABLES] = {0};
    Graphd__V1__TensorDesc *tds[MAX_CALLABLES] = {0};
    Graphd__V1__TensorDesc **tdl[MAX_CALLABLES] = {0};
    uint64_t *ext_regions[MAX_CALLABLES] = {0};
    bool oom = false, failed = false;
    pm_pool_t *pool = pm_pool_find(d->pools, op->pool->name);
    for (size_t i = 0; i < op->n && !failed; i++) {
        gd_graph_t *g = graphs[i];
        gr_graph_info_t gi;
        gr_graph_info(g->g, &gi);
        size_t count = 0;
        gr_graph_layout(g->g, &count, NULL, NULL);
        descs[i] = calloc(count + 1, sizeof *descs[i]);
        tds[i] = calloc(count + 1, sizeof *tds[i]);
        tdl[i] = calloc(count + 1, sizeof *tdl[i]);
        ext_regions[i] = calloc(count + 1, sizeof *ext_regions[i]);
        if (!descs[i] || !tds[i] || !tdl[i] || !ext_regions[i]) {
            oom = true;
            count = 0;
        } else {
            gr_graph_layout(g->g, &count, descs[i], NULL);
            failed = !graph_borrow_all(g, pool, ext_regions[i], count, op->call);
        }
        for (size_t k = 0; k < count; k++) {
            fill_desc(&tds[i][k], &descs[i][k],
                      ext_regions[i][k] ? ext_regions[i][k] : g->region_id);
            tdl[i][k] = &tds[i][k];
        }
        graphd__v1__graph_info__init(&infos[i]);
        infos[i].graph_id = g->id;
        infos[i].pool = op->pool->name;
        infos[i].device = g->worker->device;
        infos[i].training = g->training;
        infos[i].region_id = g->region_id;
        infos[i].region_bytes = g->region_bytes;
        infos[i].tensors = tdl[i];
        infos[i].n_tensors = count;
        infos[i].num_inputs = gi.counts[GR_ROLE_INPUT];
        infos[i].num_outputs = gi.counts[GR_ROLE_OUTPUT];
        infos[i].num_params = gi.counts[GR_ROLE_PARAM];
        infos[i].num_buffers = gi.counts[GR_ROLE_BUFFER];
        infos[i].has_backward = gi.has_backward != 0;
        info_list[i] = &infos[i];
    }
    if (failed || oom) {
        if (!failed)
            gd_call_fail(op->call, GD_INTERNAL, "out of memory describing the graphs");
        for (size_t i = 0; i < op->n; i++) /* the client has none of them: they all go */
            graph_release(d, graphs[i], true);
    } else {
        rep.graphs = info_list;
        rep.n_graphs = op->n;
        rep.capture_ns = ns;
        gd_call_reply(op->call, &rep.base);
    }
    for (size_t i = 0; i < op->n; i++) {
        free(descs[i]);
        free(tds[i]);
        free(tdl[i]);
        free(ext_regions[i]);
    }
    capture_op_free(d, op);
}

/* Between the steps, on the loop: one region per callable for its static tensors. */
static void capture_prepare_done(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    gd_daemon_t *d = op->d;
    op->regions_start = gd_now_ns();
    if (op->rc != GR_OK) {
        gd_call_fail(op->call, gd_status_from_gr(op->rc), "%s", op->msg);
        capture_op_free(d, op);
        return;
    }
    gd_session_t *s = gd_session_find(d, op->session);
    pm_pool_t *pool = pm_pool_find(d->pools, op->pool->name);
    if (s == NULL || pool == NULL) {
        capture_fail(op, GD_NOT_FOUND,
                     s ? "the pool was deleted during the capture"
                       : "the session ended during the capture");
        return;
    }
    for (size_t i = 0; i < op->n; i++) {
        uint64_t total = 0;
        size_t count = 0;
        if (gr_capture_layout(op->cap, i, &count, NULL, &total) != GR_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "capture layout of callable %zu: %s", i, gr_last_error());
            capture_unwind(d, op, true);
            capture_fail(op, GD_INTERNAL, msg);
            return;
        }
        if (total == 0)
            total = GR_ALIGN; /* a callable with no static tensor still gets a region */
        pm_region_t *r = NULL;
        int rc = op->opts.resident ? pm_region_alloc_device(pool, s->id, op->dev_sizes[i],
                                                            op->dev_ptrs[i], op->dev_handles[i], &r)
                                   : pm_region_alloc(pool, s->id, total, &r);
        if (rc != PM_OK) {
            char msg[512];
            pm_pool_info_t info;
            pm_pool_info(pool, &info);
            if (rc == PM_ELIMIT)
                snprintf(msg, sizeof msg,
                         "pool '%s' limit %llu bytes: the capture needs %llu more bytes for "
                         "callable %zu, %llu are reserved",
                         op->pool->name, (unsigned long long)info.limit_bytes,
                         (unsigned long long)total, i, (unsigned long long)info.reserved_bytes);
            else
                snprintf(msg, sizeof msg, "cannot allocate %llu bytes for callable %zu: %s",
                         (unsigned long long)total, i, pm_strerror(rc));
            capture_unwind(d, op, true);
            capture_fail(op, rc == PM_EINVAL ? GD_INVALID_ARGUMENT : GD_RESOURCE_EXHAUSTED, msg);
            return;
        }
        op->region_ids[i] = pm_region_id(r);
        if (op->opts.resident) { /* the region owns the block now; no host mapping */
            op->bases[i] = op->dev_ptrs[i];
            op->dev_ptrs[i] = NULL;
            continue;
        }
        op->map_lens[i] = pm_region_mapped_size(r);
        void *base =
            mmap(NULL, op->map_lens[i], PROT_READ | PROT_WRITE, MAP_SHARED, pm_region_fd(r), 0);
        if (base == MAP_FAILED) {
            gd_error("mmap region %llu: %s", (unsigned long long)op->region_ids[i],
                     strerror(errno));
            capture_unwind(d, op, true);
            capture_fail(op, GD_RESOURCE_EXHAUSTED, "cannot map the static region");
            return;
        }
        op->bases[i] = base;
    }
    op->regions_end = gd_now_ns();
    op->job.run = capture_finish_run;
    op->job.done = capture_finish_done;
    gd_worker_submit(op->pool->worker, &op->job);
}

/* Step 1, on the worker: the runtime pool at its first capture, gr_capture_prepare, and for a
 * device-resident capture the static blocks. */
static void prepare_on_worker(capture_op_t *op)
{
    op->rc = rpool_get(op->pool, op->session, &op->rpool, op->msg, sizeof op->msg);
    if (op->rc != GR_OK)
        return;
    op->opts.pool = op->rpool->gp;
    op->rc = gr_capture_prepare(op->pool->worker->device, op->n, op->specs, &op->opts, &op->cap);
    if (op->rc != GR_OK) {
        snprintf(op->msg, sizeof op->msg, "%s", gr_last_error());
        return;
    }
    /* Device-resident: the static blocks are device memory, allocated here on the device's
     * thread; the loop registers them as regions. */
    for (size_t i = 0; op->opts.resident && i < op->n; i++) {
        uint64_t total = 0;
        size_t count = 0;
        op->rc = gr_capture_layout(op->cap, i, &count, NULL, &total);
        if (op->rc == GR_OK) {
            op->dev_sizes[i] = total ? total : GR_ALIGN;
            op->rc = gr_device_alloc(op->pool->worker->device, op->dev_sizes[i], &op->dev_ptrs[i],
                                     op->dev_handles[i]);
        }
        if (op->rc != GR_OK) {
            snprintf(op->msg, sizeof op->msg, "device memory for callable %zu: %s", i,
                     gr_last_error());
            capture_free_blocks(op);
            gr_capture_abort(op->cap);
            op->cap = NULL;
            return;
        }
    }
}

static void capture_prepare_run(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    op->prepare_start = gd_now_ns();
    prepare_on_worker(op);
    op->prepare_end = gd_now_ns();
}

/* Checks one sample-arg spec; on failure finishes the call. */
static bool check_spec(gd_daemon_t *d, gd_call_t *call, size_t ci, size_t ai,
                       const Graphd__V1__TensorSpec *t, gr_arg_spec_t *out)
{
    size_t esize = gr_dtype_size((int)t->dtype);
    if (esize == 0) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "callable %zu arg %zu: unknown dtype %d", ci, ai,
                     (int)t->dtype);
        return false;
    }
    if (t->n_shape > GR_MAX_DIMS) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "callable %zu arg %zu: %zu dimensions (at most %d)",
                     ci, ai, t->n_shape, GR_MAX_DIMS);
        return false;
    }
    uint64_t bytes = esize;
    for (size_t k = 0; k < t->n_shape; k++) {
        int64_t dim = t->shape[k];
        if (dim < 0 || (dim > 0 && bytes > d->cfg.max_region_bytes / (uint64_t)dim)) {
            gd_call_fail(call, GD_INVALID_ARGUMENT,
                         "callable %zu arg %zu: bad shape (dimension %zu is %lld)", ci, ai, k,
                         (long long)dim);
            return false;
        }
        bytes *= (uint64_t)dim;
        out->shape[k] = dim;
    }
    if (t->requires_grad && !gr_dtype_is_floating((int)t->dtype)) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "callable %zu arg %zu: only tensors of floating point dtype can require "
                     "gradients (%s)",
                     ci, ai, gr_dtype_name((int)t->dtype));
        return false;
    }
    out->dtype = (int)t->dtype;
    out->ndim = (uint32_t)t->n_shape;
    out->requires_grad = t->requires_grad;
    out->data = NULL;
    return true;
}

void gd_rpc_capture(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__CaptureRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "capturing");
    if (s == NULL)
        return;
    if (req->n_callables == 0 || req->n_callables > MAX_CALLABLES) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "give 1 to %d callables, not %zu", MAX_CALLABLES,
                     req->n_callables);
        return;
    }
    int warmup = 3;
    if (req->warmup_case == GRAPHD__V1__CAPTURE_REQUEST__WARMUP_NUM_WARMUP_ITERS) {
        if (req->num_warmup_iters < 0 || req->num_warmup_iters > MAX_WARMUP) {
            gd_call_fail(call, GD_INVALID_ARGUMENT, "num_warmup_iters must be 0 to %d", MAX_WARMUP);
            return;
        }
        warmup = req->num_warmup_iters;
    }
    const char *pool_name = req->pool[0] ? req->pool : d->cfg.default_pool;
    pm_pool_t *pool = pm_pool_find(d->pools, pool_name);
    if (pool == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no pool named '%.64s'", pool_name);
        return;
    }
    pm_pool_info_t pinfo;
    pm_pool_info(pool, &pinfo);
    if (req->device_resident && strncmp(pinfo.device, "cuda:", 5) != 0) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "device_resident needs a pool on a cuda device; pool '%s' is on %s", pool_name,
                     pinfo.device);
        return;
    }
    gd_worker_t *w = gd_worker_for(d, pinfo.device);
    if (w == NULL) {
        gd_call_fail(call, GD_FAILED_PRECONDITION, "pool '%s' is on %s, which runs no graphs",
                     pool_name, pinfo.device);
        return;
    }
    size_t nargs = 0;
    for (size_t i = 0; i < req->n_callables; i++)
        nargs += req->callables[i]->n_sample_args;
    if (nargs > MAX_ARGS) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "%zu sample args in all (at most %d)", nargs,
                     MAX_ARGS);
        return;
    }
    capture_op_t *op = calloc(1, sizeof *op);
    gr_arg_spec_t *args = calloc(nargs + 1, sizeof *args);
    gd_gpool_t *gp = gpool_get(d, pool_name, w);
    if (op == NULL || args == NULL || gp == NULL) {
        free(op);
        free(args);
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    op->args = args;
    size_t next_arg = 0;
    for (size_t i = 0; i < req->n_callables; i++) {
        const Graphd__V1__Callable *c = req->callables[i];
        gd_module_t *m = module_of(d, call, s, c->module_id);
        if (m == NULL) {
            capture_op_free(d, op);
            return;
        }
        m->refs++;
        op->mods[i] = m;
        op->n = i + 1;
        const char *method = c->method[0] ? c->method : "forward";
        if (gr_module_has_method(m->m, method) != 1) {
            gd_call_fail(call, GD_INVALID_ARGUMENT, "module %llu has no method '%.64s'",
                         (unsigned long long)c->module_id, method);
            capture_op_free(d, op);
            return;
        }
        for (size_t a = 0; a < c->n_sample_args; a++)
            if (!check_spec(d, call, i, a, c->sample_args[a], &args[next_arg + a])) {
                capture_op_free(d, op);
                return;
            }
        op->specs[i].module = m->m;
        op->specs[i].method = c->method[0] ? c->method : NULL; /* the request outlives the op */
        op->specs[i].n_args = c->n_sample_args;
        op->specs[i].args = &args[next_arg];
        next_arg += c->n_sample_args;
    }
    gr_capture_opts_init(&op->opts);
    op->opts.num_warmup_iters = warmup;
    op->opts.allow_unused_input = req->allow_unused_input;
    op->opts.resident = req->device_resident ? 1 : 0;
    op->opts.copy_param_grads = req->copy_param_grads ? 1 : 0;
    op->d = d;
    op->call = call;
    op->session = s->id;
    op->pool = gp;
    op->t0 = gd_now_ns();
    op->job.run = capture_prepare_run;
    op->job.done = capture_prepare_done;
    gd_worker_submit(w, &op->job);
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
    gr_event_t *wait, *done; /* ordered replays (GRAPHD_REPLAY_ORDERED), else NULL */
    gr_seq_t *seqs;          /* posted replays (GRAPHD_REPLAY_POSTED): answered on failure only */
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
    if (j->seqs != NULL) {
        j->rc = gr_graph_replay_posted(j->graph->g, j->phase, j->seqs, j->n, &j->device_ns);
        replay_account(j);
        if (j->rc != GR_OK)
            replay_reply_error(j->wire, j->seq, j->graph->id, gd_status_from_gr(j->rc),
                               gr_last_error());
        gd_wire_unref(j->wire);
        free(j);
        return;
    }
    j->rc = j->wait != NULL
                ? gr_graph_replay_ordered(j->graph->g, j->phase, j->wait, j->done, &j->device_ns)
                : gr_graph_replay(j->graph->g, j->phase, &j->device_ns);
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY,
                        .seq = j->seq,
                        .id = j->graph->id,
                        .arg = j->device_ns,
                        .status = gd_status_from_gr(j->rc)};
    replay_account(j);
    gd_wire_send(j->wire, &f, j->rc == GR_OK ? NULL : gr_last_error(), -1);
    gd_wire_unref(j->wire);
    free(j);
}

static void replay_call_run(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    j->rc = gr_graph_replay(j->graph->g, j->phase, &j->device_ns);
    if (j->rc != GR_OK)
        snprintf(j->msg, sizeof j->msg, "%s", gr_last_error());
    replay_account(j);
}

static void replay_call_done(gd_job_t *job)
{
    replay_job_t *j = (replay_job_t *)job;
    if (j->rc != GR_OK) {
        gd_call_fail(j->call, gd_status_from_gr(j->rc), "%s", j->msg);
    } else {
        Graphd__V1__ReplayReply rep = GRAPHD__V1__REPLAY_REPLY__INIT;
        rep.device_ns = j->device_ns;
        gd_call_reply(j->call, &rep.base);
    }
    free(j);
}

/* Looks the graph up for session s; returns a status and a message for failures. */
static int replay_target(gd_daemon_t *d, gd_session_t *s, uint64_t id, uint64_t phase,
                         gd_graph_t **out, char *msg, size_t len)
{
    if (phase != GR_PHASE_FORWARD && phase != GR_PHASE_BACKWARD) {
        snprintf(msg, len, "unknown phase %llu", (unsigned long long)phase);
        return GD_INVALID_ARGUMENT;
    }
    gd_graph_t *g = graph_find(d, id);
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

/* Queues j, a zeroed job for a REPLAY frame f of g with its ordering set, on g's worker. */
static void replay_frame_submit(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire,
                                const graphd_frame_t *f, gd_graph_t *g, int phase, uint64_t t0,
                                replay_job_t *j)
{
    j->job.run = replay_frame_run;
    j->graph = g;
    j->phase = phase;
    j->t0 = t0;
    j->seq = f->seq;
    j->wire = wire;
    gd_wire_ref(wire);
    s->replays++;
    /* Device-resident replays, however ordered. Not host-staged ones or the CPU's: those clients
     * compute on the host's cores (a CPU module, its optimizer). With the two threads polling
     * after host-staged replays too, a host-staged (64, 512, 8) step took 13.5 ms in one H200
     * run, against 1.9-3.4 ms in five runs without. */
    if (g->resident)
        replay_keep_hot(d, g->worker, t0);
    gd_worker_submit(g->worker, &j->job);
}

/* A REPLAY with GRAPHD_REPLAY_POSTED: answered only when it fails. Whatever happens to it, its
 * sequence number ends up written to the counters' done (by the replay, or by gr_seq_skip), so
 * the client's stream never waits for it forever; a frame out of sequence ends the session,
 * whose end releases the counters. */
static void replay_posted(gd_daemon_t *d, gd_session_t *s, gd_wire_t *wire, const graphd_frame_t *f,
                          uint64_t t0)
{
    const uint64_t phase = f->arg & GRAPHD_REPLAY_PHASE_MASK;
    const unsigned index =
        (unsigned)((f->arg >> GRAPHD_REPLAY_DEVICE_SHIFT) & GRAPHD_REPLAY_DEVICE_MASK);
    const uint64_t n = f->arg >> GRAPHD_REPLAY_SEQ_SHIFT;
    const uint64_t flags = f->arg & GRAPHD_REPLAY_FLAGS_MASK;
    char device[32], msg[256];
    snprintf(device, sizeof device, "cuda:%u", index);
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
        if (gr_seq_skip(gd_order_counters(q), n) != GR_OK)
            gd_warn("posted replay %llu on %s: %s", (unsigned long long)n, device, gr_last_error());
        return;
    }
    j->seqs = gd_order_counters(q);
    j->n = n;
    replay_frame_submit(d, s, wire, f, g, (int)phase, t0, j);
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
    replay_frame_submit(d, s, wire, f, g, (int)phase, t0, j);
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
    j->graph = g;
    j->phase = (int)req->phase;
    j->t0 = t0;
    j->call = call;
    s->replays++;
    gd_worker_submit(g->worker, &j->job);
}

void gd_rpc_release_graph(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__ReleaseGraphRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "releasing graphs");
    if (s == NULL)
        return;
    gd_graph_t *g = graph_find(d, req->graph_id);
    if (g == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no graph %llu", (unsigned long long)req->graph_id);
        return;
    }
    if (g->session != s->id) {
        gd_call_fail(call, GD_PERMISSION_DENIED, "graph %llu belongs to another session",
                     (unsigned long long)req->graph_id);
        return;
    }
    graph_release(d, g, true);
    Graphd__V1__ReleaseGraphReply rep = GRAPHD__V1__RELEASE_GRAPH_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}

/* ---- status ------------------------------------------------------------ */

/* On the pool's worker, after a capture and after a graph destroy (the times the graph mempool
 * grows or shrinks): measures it into the atomics that status reads. Status never asks the
 * runtime itself: the allocator snapshot takes the allocator's locks and walks its segments
 * (milliseconds on a busy device), and the loop thread must not wait on libtorch or a device;
 * on the worker it also never runs beside a capture of that device. */
static void gpool_measure(gd_gpool_t *p)
{
    uint64_t reserved = 0, in_use = 0;
    for (gd_rpool_t *r = p->rpools; r; r = r->next) {
        uint64_t res = 0, use = 0;
        if (gr_pool_memory(r->gp, &res, &use) != GR_OK) {
            gd_debug("pool %s: graph mempool size unknown: %s", p->name, gr_last_error());
            continue;
        }
        reserved += res;
        in_use += use;
    }
    atomic_store(&p->mempool_reserved, reserved);
    atomic_store(&p->mempool_in_use, in_use);
}

/* The graph side of pool's message from gp (NULL: a pool with no graph state yet). */
static void pool_fill(const gd_gpool_t *gp, Graphd__V1__Pool *pool)
{
    if (gp == NULL)
        return;
    pool->graphs = gp->graphs;
    pool->replays = gd_hist_count(&gp->latency);
    pool->graph_mempool_reserved_bytes = atomic_load(&gp->mempool_reserved);
    pool->graph_mempool_in_use_bytes = atomic_load(&gp->mempool_in_use);
}

void gd_graphs_pool_fill(gd_daemon_t *d, Graphd__V1__Pool *pool)
{
    pool_fill(gpool_find(d, pool->name), pool);
}

static void fill_latency(Graphd__V1__LatencyStatus *l, const gd_hist_t *h)
{
    graphd__v1__latency_status__init(l);
    l->count = gd_hist_count(h);
    l->p50_ns = gd_hist_quantile(h, 0.50);
    l->p99_ns = gd_hist_quantile(h, 0.99);
}

typedef struct {
    Graphd__V1__GraphStatus *gs;
    Graphd__V1__GraphStatus **gl;
    Graphd__V1__LatencyStatus *lat; /* one per graph, then one per pool */
} status_storage_t;

void gd_graphs_status(gd_daemon_t *d, Graphd__V1__StatusReply *rep)
{
    size_t ng = 0;
    for (gd_graph_t *g = d->graphs; g; g = g->next)
        ng++;
    status_storage_t *st = calloc(1, sizeof *st);
    if (st == NULL)
        return;
    st->gs = calloc(ng + 1, sizeof *st->gs);
    st->gl = calloc(ng + 2, sizeof *st->gl);
    st->lat = calloc(ng + rep->n_pools + 1, sizeof *st->lat);
    if (!st->gs || !st->gl || !st->lat) {
        free(st->gs);
        free(st->gl);
        free(st->lat);
        free(st);
        return;
    }
    size_t i = 0;
    for (gd_graph_t *g = d->graphs; g; g = g->next, i++) {
        Graphd__V1__GraphStatus *x = &st->gs[i];
        graphd__v1__graph_status__init(x);
        x->id = g->id;
        x->session = g->session;
        x->pool = g->pool->name;
        x->device = g->worker->device;
        x->module = g->module;
        x->training = g->training;
        x->replays_forward = atomic_load(&g->replays_forward);
        x->replays_backward = atomic_load(&g->replays_backward);
        x->replay_errors = atomic_load(&g->replay_errors);
        x->region_bytes = g->region_bytes;
        fill_latency(&st->lat[i], &g->latency);
        x->latency = &st->lat[i];
        st->gl[i] = x;
    }
    st->gl[ng + 1] = (void *)st; /* past the end: only gd_graphs_status_free looks there */
    rep->graphs = st->gl;
    rep->n_graphs = ng;
    for (size_t p = 0; p < rep->n_pools; p++) {
        Graphd__V1__Pool *pool = rep->pools[p];
        gd_gpool_t *gp = gpool_find(d, pool->name);
        Graphd__V1__LatencyStatus *l = &st->lat[ng + p];
        pool_fill(gp, pool);
        if (gp)
            fill_latency(l, &gp->latency);
        else
            graphd__v1__latency_status__init(l);
        pool->latency = l;
    }
    for (size_t k = 0; k < rep->n_sessions; k++) {
        gd_session_t *s = gd_session_find(d, rep->sessions[k]->id);
        if (s) {
            rep->sessions[k]->graphs = s->graphs;
            rep->sessions[k]->modules = s->modules;
            rep->sessions[k]->replays = s->replays;
        }
    }
    rep->daemon->modules_loaded = (uint32_t)gr_module_loaded_count();
}

void gd_graphs_status_free(Graphd__V1__StatusReply *rep)
{
    if (rep->graphs == NULL)
        return;
    status_storage_t *st = (void *)rep->graphs[rep->n_graphs + 1];
    free(st->gs);
    free(st->gl);
    free(st->lat);
    free(st);
}
