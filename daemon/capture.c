/* Captures: prepare on the worker of the session's executor on the pool's device, static regions
 * on the loop, finish on that worker (see lifetime.c). */
#include "graphs.h"
#include "graphd.pb-c.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- capture ----------------------------------------------------------- */

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_call_t *call;
    uint64_t session;
    gd_gpool_t *pool;
    gd_worker_t *worker; /* x's: every step runs there */
    gd_rpool_t *rpool;   /* set on the worker in step 1 */
    size_t n;
    gd_module_t *mods[MAX_CALLABLES];
    uint32_t reserved; /* graphs counted in the session's capturing (max_graphs_per_session) */
    gd_exec_t *x;      /* the session's uid's executor on the pool's device */
    gd_xcallable_t specs[MAX_CALLABLES];
    gr_arg_spec_t *args;
    gd_xcapture_opts_t opts;
    gd_xcapture_t *cap;
    int rc;
    char msg[1024];
    /* gd_now_ns() at each step's start and end, for the capture's log line: where its time goes
     * (the gaps between them are waits in the worker's queue and the loop's) */
    uint64_t t0, prepare_start, prepare_end, regions_start, regions_end, finish_start, finish_end;
    bool succeeded; /* answered with the graphs */
    /* filled on the loop between the two steps */
    uint64_t region_ids[MAX_CALLABLES];
    /* host regions: fd is the op's own duplicate of the region's memfd (-1: none), since the
     * region may be freed on the loop (its session ending) before the worker sends it */
    gd_xbase_t bases[MAX_CALLABLES];
    gd_xgraph_t *graphs[MAX_CALLABLES];
    uint64_t graph_ids[MAX_CALLABLES]; /* taken on the loop before the finish step */
    /* device-resident (opts.resident): blocks allocated by the worker after prepare, owned here
     * until the loop registers them as regions (then NULL here) */
    gd_xblock_t *dev_ptrs[MAX_CALLABLES];
    uint64_t dev_sizes[MAX_CALLABLES];
    uint8_t dev_handles[MAX_CALLABLES][GR_IPC_HANDLE_SIZE];
} capture_op_t;

/* Closes the op's duplicates of the regions' memfds. */
static void close_bases(capture_op_t *op)
{
    for (size_t i = 0; i < MAX_CALLABLES; i++) {
        if (op->bases[i].fd >= 0)
            close(op->bases[i].fd);
        op->bases[i].fd = -1;
    }
}

/* The end of every capture, on the loop (its graphs, if any, are registered by now). */
static void capture_op_free(gd_daemon_t *d, capture_op_t *op)
{
    if (op->t0 != 0) { /* it started: count it for the metrics */
        d->captures++;
        d->captures_failed += !op->succeeded;
        gd_hist_add(&d->capture_latency, gd_now_ns() - op->t0);
    }
    close_bases(op);
    gd_session_t *s = op->reserved ? gd_session_find(d, op->session) : NULL;
    if (s != NULL) {
        s->capturing -= op->reserved;
        if (s->capturing == 0)
            s->capturing_since_unix_ms = 0;
    }
    if (op->pool != NULL)
        gd_gpool_capture_done(d, op->pool);
    for (size_t i = 0; i < op->n; i++)
        if (op->mods[i])
            gd_module_unref(d, op->mods[i]);
    free(op->args);
    free(op);
}

/* Gives back what phase 2 took: the graphs' regions, unless the session's end has reclaimed them
 * already (device blocks go with their regions). */
static void capture_unwind(gd_daemon_t *d, capture_op_t *op, bool free_regions)
{
    close_bases(op);
    for (size_t i = 0; i < op->n; i++) {
        op->bases[i] = (gd_xbase_t){.fd = -1};
        if (op->region_ids[i] && free_regions)
            pm_region_free(d->pools, op->region_ids[i], op->session);
        op->region_ids[i] = 0;
    }
}

/* On the worker: frees the device blocks that no region owns. */
static void capture_free_blocks(capture_op_t *op)
{
    for (size_t i = 0; i < op->n; i++) {
        if (op->dev_ptrs[i] && gd_exec_device_free(op->dev_ptrs[i]) != GR_OK)
            gd_warn("freeing device memory on %s: %s", op->pool->device, gd_exec_last_error());
        op->dev_ptrs[i] = NULL;
    }
}

static void capture_abort_run(gd_job_t *job)
{
    capture_op_t *op = (capture_op_t *)job;
    gd_exec_capture_abort(op->cap);
    op->cap = NULL;
    capture_free_blocks(op);
    gd_rpool_put(op->pool, op->rpool);
    op->rpool = NULL;
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
    gd_worker_submit(op->worker, &op->job);
}

/* Borrowed regions for g's external tensors: region_ids[k] for layout tensor k (0 for those in
 * g's own region). false, and the call failed, when a region cannot be made. */
static bool graph_borrow_all(gd_graph_t *g, pm_pool_t *pool, uint64_t *region_ids, size_t count,
                             gd_call_t *call)
{
    const gr_external_t *ext = NULL;
    size_t n = gd_exec_graph_external(g->g, &ext);
    for (size_t k = 0; k < n; k++) {
        int rc = ext[k].tensor < count && pool != NULL
                     ? gd_graph_borrow(g, pool, &ext[k], &region_ids[ext[k].tensor])
                     : PM_EINVAL;
        if (rc != PM_OK) {
            gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                         "graph %llu: cannot export the memory of tensor %zu: %s",
                         (unsigned long long)g->id, ext[k].tensor, pm_strerror(rc));
            return false;
        }
    }
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
    op->rc = gd_exec_capture_finish(op->cap, op->bases, op->graphs);
    op->cap = NULL;  /* consumed either way */
    close_bases(op); /* the executor has mapped them, or failed */
    /* Before the reply: the client may replay each graph on its direct connection at once. */
    for (size_t i = 0; i < op->n && op->rc == GR_OK; i++) {
        op->rc = gd_exec_graph_bind(op->graphs[i], op->session, op->graph_ids[i]);
        if (op->rc != GR_OK)
            for (size_t k = 0; k < op->n; k++) {
                gd_exec_graph_destroy(op->graphs[k], NULL);
                op->graphs[k] = NULL;
            }
    }
    if (op->rc != GR_OK)
        snprintf(op->msg, sizeof op->msg, "%s", gd_exec_last_error());
    if (op->rc == GR_OK)
        op->rpool->graphs += (uint32_t)op->n;
    /* A failed capture may leave it with no graph: it goes; else it is measured for status. */
    gd_rpool_put(op->pool, op->rpool);
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
        gd_call_fail(op->call, gr_err_grpc(op->rc), "capture failed: %s", op->msg);
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
        gd_exec_graph_info(op->graphs[i], &info);
        g->id = op->graph_ids[i];
        g->session = op->session;
        g->pool = op->pool;
        g->rpool = op->rpool;
        g->worker = op->worker;
        g->g = op->graphs[i];
        g->resident = op->opts.resident != 0;
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
            gd_graph_release(d, graphs[i], false);
        gd_call_fail(op->call, GD_NOT_FOUND, "the session ended during the capture");
        capture_op_free(d, op);
        return;
    }
    uint64_t ns = gd_now_ns() - op->t0;
    double steps_ms = ms_between(op->prepare_start, op->prepare_end) +
                      ms_between(op->regions_start, op->regions_end) +
                      ms_between(op->finish_start, op->finish_end);
    size_t reused = 0;
    for (size_t i = 0; i < op->n; i++) {
        gr_graph_info_t gi;
        gd_exec_graph_info(op->graphs[i], &gi);
        reused += gi.warmup_reused != 0;
    }
    d->warmups_reused += reused;
    gd_info("session %llu: captured %zu graph%s in pool %s (%.1f ms: prepare %.1f ms, regions "
            "%.1f ms, finish %.1f ms, queued %.1f ms; warm-up reused for %zu)",
            (unsigned long long)op->session, op->n, op->n == 1 ? "" : "s", op->pool->name,
            (double)ns / 1e6, ms_between(op->prepare_start, op->prepare_end),
            ms_between(op->regions_start, op->regions_end),
            ms_between(op->finish_start, op->finish_end), (double)ns / 1e6 - steps_ms, reused);

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
        gd_exec_graph_info(g->g, &gi);
        const gr_tensor_desc_t *layout = NULL;
        size_t count = gd_exec_graph_layout(g->g, &layout);
        descs[i] = calloc(count + 1, sizeof *descs[i]);
        tds[i] = calloc(count + 1, sizeof *tds[i]);
        tdl[i] = calloc(count + 1, sizeof *tdl[i]);
        ext_regions[i] = calloc(count + 1, sizeof *ext_regions[i]);
        if (!descs[i] || !tds[i] || !tdl[i] || !ext_regions[i]) {
            oom = true;
            count = 0;
        } else {
            memcpy(descs[i], layout, count * sizeof *layout);
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
        infos[i].warmup_reused = gi.warmup_reused != 0;
        info_list[i] = &infos[i];
    }
    if (failed || oom) {
        if (!failed)
            gd_call_fail(op->call, GD_INTERNAL, "out of memory describing the graphs");
        for (size_t i = 0; i < op->n; i++) /* the client has none of them: they all go */
            gd_graph_release(d, graphs[i], true);
    } else {
        rep.graphs = info_list;
        rep.n_graphs = op->n;
        rep.capture_ns = ns;
        op->succeeded = true;
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
        gd_call_fail(op->call, gr_err_grpc(op->rc), "%s", op->msg);
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
        if (gd_exec_capture_layout(op->cap, i, &count, &total) != GR_OK) {
            char msg[512];
            snprintf(msg, sizeof msg, "capture layout of callable %zu: %s", i,
                     gd_exec_last_error());
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
        if (op->opts.resident) { /* the region owns the block now */
            op->bases[i] = (gd_xbase_t){.fd = -1, .block = op->dev_ptrs[i]};
            op->dev_ptrs[i] = NULL;
            continue;
        }
        /* The executor maps the region itself (its memfd goes with the request): a duplicate,
         * which stays this region's memfd should the session end and free the region first. */
        int fd = fcntl(pm_region_fd(r), F_DUPFD_CLOEXEC, 0);
        if (fd < 0) {
            char msg[512];
            snprintf(msg, sizeof msg, "cannot pass the static region of callable %zu: %s", i,
                     strerror(errno));
            gd_error("session %llu: %s", (unsigned long long)op->session, msg);
            capture_unwind(d, op, true);
            capture_fail(op, GD_RESOURCE_EXHAUSTED, msg);
            return;
        }
        op->bases[i] = (gd_xbase_t){.fd = fd, .len = pm_region_mapped_size(r)};
    }
    op->regions_end = gd_now_ns();
    for (size_t i = 0; i < op->n; i++)
        op->graph_ids[i] = ++d->next_graph_id;
    op->job.run = capture_finish_run;
    op->job.done = capture_finish_done;
    gd_worker_submit(op->worker, &op->job);
}

/* Step 1, on the worker: the runtime pool at its first capture, gr_capture_prepare, and for a
 * device-resident capture the static blocks. */
static void prepare_on_worker(capture_op_t *op)
{
    op->rc =
        gd_rpool_get(op->pool, op->session, op->x, op->worker, &op->rpool, op->msg, sizeof op->msg);
    if (op->rc != GR_OK) {
        op->rpool = NULL;
        return;
    }
    op->opts.pool = op->rpool->gp;
    op->rc =
        gd_exec_capture_prepare(op->x, op->pool->device, op->n, op->specs, &op->opts, &op->cap);
    if (op->rc != GR_OK) {
        snprintf(op->msg, sizeof op->msg, "%s", gd_exec_last_error());
        return;
    }
    /* Device-resident: the static blocks are device memory, allocated here on the device's
     * thread; the loop registers them as regions. */
    for (size_t i = 0; op->opts.resident && i < op->n; i++) {
        uint64_t total = 0;
        size_t count = 0;
        op->rc = gd_exec_capture_layout(op->cap, i, &count, &total);
        if (op->rc == GR_OK) {
            op->dev_sizes[i] = total ? total : GR_ALIGN;
            op->rc = gd_exec_device_alloc(op->x, op->pool->device, op->dev_sizes[i],
                                          &op->dev_ptrs[i], op->dev_handles[i]);
        }
        if (op->rc != GR_OK) {
            snprintf(op->msg, sizeof op->msg, "device memory for callable %zu: %s", i,
                     gd_exec_last_error());
            capture_free_blocks(op);
            gd_exec_capture_abort(op->cap);
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
    if (op->rc != GR_OK) { /* no later step on the worker: give the runtime pool back here */
        gd_rpool_put(op->pool, op->rpool);
        op->rpool = NULL;
    }
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
    if (!gd_pool_use_check(call, s, pool))
        return;
    uint64_t graphs = (uint64_t)s->graphs + s->capturing + req->n_callables;
    if (graphs > d->cfg.max_graphs_per_session) {
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                     "session %llu would hold %llu graphs (max_graphs_per_session = %llu): "
                     "release some first",
                     (unsigned long long)s->id, (unsigned long long)graphs,
                     (unsigned long long)d->cfg.max_graphs_per_session);
        return;
    }
    pm_usage_t held;
    pm_owner_usage(d->pools, s->id, &held);
    uint64_t regions = (uint64_t)held.regions + s->capturing + req->n_callables;
    if (regions > d->cfg.max_regions_per_session) {
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                     "session %llu would hold %llu regions with this capture's static regions "
                     "(max_regions_per_session = %llu): free some first",
                     (unsigned long long)s->id, (unsigned long long)regions,
                     (unsigned long long)d->cfg.max_regions_per_session);
        return;
    }
    pm_pool_info_t pinfo;
    pm_pool_info(pool, &pinfo);
    const gd_family_t *fam = gd_family_of(pinfo.device);
    if (fam != NULL && !fam->graphs) { /* before any executor starts */
        gd_call_fail(call, GD_UNIMPLEMENTED, "pool '%s' is on %s: %s", pool_name, pinfo.device,
                     fam->no_graphs);
        return;
    }
    if (req->device_resident && (fam == NULL || !fam->resident)) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "device_resident needs a pool on a cuda device; pool '%s' is on %s", pool_name,
                     pinfo.device);
        return;
    }
    if (gd_device_find(d, pinfo.device) == NULL) {
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
    gd_gpool_t *gp = gd_gpool_get(d, pool_name, pinfo.device);
    if (op == NULL || args == NULL || gp == NULL) {
        free(op);
        free(args);
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    op->args = args;
    for (size_t i = 0; i < MAX_CALLABLES; i++)
        op->bases[i].fd = -1;
    size_t next_arg = 0;
    for (size_t i = 0; i < req->n_callables; i++) {
        const Graphd__V1__Callable *c = req->callables[i];
        gd_module_t *m = gd_module_of(d, call, s, c->module_id);
        if (m == NULL) {
            capture_op_free(d, op);
            return;
        }
        m->refs++;
        op->mods[i] = m;
        op->n = i + 1;
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
    /* The session's uid's executor on the pool's device, and its worker: another uid's stuck
     * call holds up none of this capture's steps. */
    op->worker = gd_worker_for(d, s->uid, pinfo.device, &op->x);
    if (op->worker == NULL) {
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        capture_op_free(d, op);
        return;
    }
    op->opts.num_warmup_iters = warmup;
    op->opts.allow_unused_input = req->allow_unused_input;
    op->opts.resident = req->device_resident ? 1 : 0;
    op->opts.copy_param_grads = req->copy_param_grads ? 1 : 0;
    op->opts.reuse_warmup = d->cfg.reuse_warmup ? 1 : 0;
    op->d = d;
    op->call = call;
    op->session = s->id;
    op->job.session = s->id; /* every step in the session's queue (worker.h) */
    op->pool = gp;
    gp->captures++; /* until capture_op_free: a deleted pool waits for its captures */
    op->t0 = gd_now_ns();
    op->reserved = (uint32_t)op->n;
    if (s->capturing == 0) /* Status: "capturing since" spans overlapping captures */
        s->capturing_since_unix_ms = gd_now_unix_ms();
    s->capturing += op->reserved;
    op->job.run = capture_prepare_run;
    op->job.done = capture_prepare_done;
    gd_worker_submit(op->worker, &op->job);
}
