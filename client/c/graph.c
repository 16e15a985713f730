/*
 * Modules, captures and replays: RegisterModule/ReleaseModule, one Capture
 * call for a list of callables with the mapping of each graph's static
 * region, replay over the session socket (REPLAY frame, the hot path) or
 * gRPC, and ReleaseGraph. Every graph handle is on its client's list and
 * holds a reference on it, so that the client outlives graphd_close until
 * the last handle is released.
 */
#include <stdlib.h>
#include <string.h>

#include "graphd.pb-c.h"
#include "graphd_int.h"

/* Archives up to this size go inline in RegisterModule; larger ones through a region. */
#define INLINE_MODULE_MAX (1u << 20)

static void session_ref(const graphd_client_t *c, Graphd__V1__SessionRef *ref)
{
    Graphd__V1__SessionRef init = GRAPHD__V1__SESSION_REF__INIT;
    *ref = init;
    ref->id = c->session_id;
    ref->token = c->session_token;
}

static int need_session(graphd_client_t *c)
{
    if (c->session_id == 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "no session: call graphd_hello first");
    return GRAPHD_OK;
}

/* ---- modules ---------------------------------------------------------------------------- */

int graphd_module_register(graphd_client_t *c, const void *bytes, size_t len, const char *name,
                           uint64_t *module_id)
{
    c->last_error[0] = '\0';
    if (bytes == NULL || len == 0 || module_id == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "no archive bytes or module_id is NULL");
    *module_id = 0;
    int rc = need_session(c);
    if (rc != GRAPHD_OK)
        return rc;

    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__RegisterModuleRequest req = GRAPHD__V1__REGISTER_MODULE_REQUEST__INIT;
    req.session = &ref;
    req.format = GRAPHD__V1__MODULE_FORMAT__MODULE_FORMAT_TORCHSCRIPT;
    req.name = (char *)(name != NULL ? name : "");
    Graphd__V1__RegionSlice slice = GRAPHD__V1__REGION_SLICE__INIT;
    graphd_region_t *tmp = NULL;
    if (len <= INLINE_MODULE_MAX) {
        req.source_case = GRAPHD__V1__REGISTER_MODULE_REQUEST__SOURCE_INLINE_BYTES;
        req.inline_bytes.data = (uint8_t *)bytes;
        req.inline_bytes.len = len;
    } else {
        /* No copy of a large archive through gRPC: the daemon reads it from shared memory. */
        rc = graphd_region_alloc(c, NULL, len, &tmp);
        if (rc != GRAPHD_OK)
            return rc;
        memcpy(graphd_region_ptr(tmp), bytes, len);
        slice.region_id = graphd_region_id(tmp);
        slice.offset = 0;
        slice.size = len;
        req.source_case = GRAPHD__V1__REGISTER_MODULE_REQUEST__SOURCE_REGION;
        req.region = &slice;
    }
    Graphd__V1__RegisterModuleReply *rep;
    rc = graphd__call(c, GRAPHD__METHOD("RegisterModule"), &req.base,
                      &graphd__v1__register_module_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc == GRAPHD_OK) {
        *module_id = rep->module_id;
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    if (tmp != NULL) {
        /* The daemon read the archive during the call; the register's outcome is what counts. */
        char saved[GRAPHD__ERRMSG_MAX];
        memcpy(saved, c->last_error, sizeof(saved));
        if (c->session_id != 0)
            (void)graphd_region_free(c, tmp);
        else
            graphd_region_release(tmp);
        memcpy(c->last_error, saved, sizeof(saved));
    }
    return rc;
}

int graphd_module_release(graphd_client_t *c, uint64_t module_id)
{
    c->last_error[0] = '\0';
    int rc = need_session(c);
    if (rc != GRAPHD_OK)
        return rc;
    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__ReleaseModuleRequest req = GRAPHD__V1__RELEASE_MODULE_REQUEST__INIT;
    req.session = &ref;
    req.module_id = module_id;
    ProtobufCMessage *rep;
    rc = graphd__call(c, GRAPHD__METHOD("ReleaseModule"), &req.base,
                      &graphd__v1__release_module_reply__descriptor, &rep);
    if (rc == GRAPHD_OK)
        protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}

/* ---- graph handles ---------------------------------------------------------------------- */

static void link_graph(graphd_client_t *c, graphd_graph_t *g)
{
    g->client = c;
    g->prev = NULL;
    g->next = c->graphs;
    if (c->graphs != NULL)
        c->graphs->prev = g;
    c->graphs = g;
    graphd__client_ref(c);
}

static void unlink_graph(graphd_graph_t *g)
{
    graphd_client_t *c = g->client;
    if (g->prev != NULL)
        g->prev->next = g->next;
    else
        c->graphs = g->next;
    if (g->next != NULL)
        g->next->prev = g->prev;
}

/* Unmaps what g holds and frees it (g is on no list). */
static void graph_unmap(graphd_graph_t *g)
{
    graphd_region_release(g->region);
    for (size_t k = 0; k < g->n_extra; k++)
        if (--g->extra[k]->shared_refs == 0)
            graphd_region_release(g->extra[k]);
    free(g->extra);
    free(g);
}

void graphd__graph_forget(graphd_graph_t *g)
{
    graphd_client_t *c = g->client;
    unlink_graph(g);
    graph_unmap(g);
    graphd__client_unref(c);
}

/* The mapping of a region other than the graph's own that one of its tensors lies in: the
 * client's existing one (a segment other graphs use too) or a new one; g holds it once. */
static int graph_extra_region(graphd_client_t *c, graphd_graph_t *g, uint64_t region_id,
                              const char *device, graphd_region_t **out)
{
    for (size_t k = 0; k < g->n_extra; k++)
        if (g->extra[k]->id == region_id) {
            *out = g->extra[k];
            return GRAPHD_OK;
        }
    graphd_region_t **grown = realloc(g->extra, (g->n_extra + 1) * sizeof *grown);
    if (grown == NULL)
        return graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
    g->extra = grown;
    graphd_region_t *r = c->regions;
    while (r != NULL && !(r->id == region_id && r->shared_refs > 0))
        r = r->next;
    if (r == NULL) {
        int rc = graphd__region_map(c, region_id, device, &r);
        if (rc != GRAPHD_OK)
            return rc;
        if (r->kind == NULL) {
            graphd_region_release(r);
            return graphd__fail(c, GRAPHD_EPROTO,
                                "graph %llu: tensor region %llu is not device memory",
                                (unsigned long long)g->id, (unsigned long long)region_id);
        }
    }
    r->shared_refs++;
    g->extra[g->n_extra++] = r;
    *out = r;
    return GRAPHD_OK;
}

/* ReleaseGraph by id only: nothing is unmapped here. */
static int release_graph_id(graphd_client_t *c, uint64_t graph_id)
{
    int rc = need_session(c);
    if (rc != GRAPHD_OK)
        return rc;
    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__ReleaseGraphRequest req = GRAPHD__V1__RELEASE_GRAPH_REQUEST__INIT;
    req.session = &ref;
    req.graph_id = graph_id;
    ProtobufCMessage *rep;
    rc = graphd__call(c, GRAPHD__METHOD("ReleaseGraph"), &req.base,
                      &graphd__v1__release_graph_reply__descriptor, &rep);
    if (rc == GRAPHD_OK)
        protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}

int graphd_graph_release(graphd_graph_t *g)
{
    if (g == NULL)
        return GRAPHD_OK;
    graphd_client_t *c = g->client;
    c->last_error[0] = '\0';
    graphd__client_ref(c); /* g's reference may be the last */
    /* Unmapped first: a device region's IPC mapping must be closed before the daemon frees it. */
    uint64_t id = g->id;
    graphd__graph_forget(g);
    int rc = release_graph_id(c, id);
    graphd__client_unref(c);
    return rc;
}

uint64_t graphd_graph_id(const graphd_graph_t *g)
{
    return g->id;
}

int graphd_graph_training(const graphd_graph_t *g)
{
    return g->training;
}

int graphd_graph_has_backward(const graphd_graph_t *g)
{
    return g->has_backward;
}

int graphd_graph_warmup_reused(const graphd_graph_t *g)
{
    return g->warmup_reused;
}

int graphd_graph_tensors(const graphd_graph_t *g, size_t *count, graphd_tensor_t *items)
{
    if (g == NULL || count == NULL)
        return GRAPHD_EINVALID_ARGUMENT;
    graphd_client_t *c = g->client;
    c->last_error[0] = '\0';
    size_t room = items != NULL ? *count : 0;
    size_t n = g->n_tensors < room ? g->n_tensors : room;
    if (n > 0)
        memcpy(items, g->tensors, n * sizeof(*items));
    *count = g->n_tensors;
    if (items != NULL && room < g->n_tensors)
        return graphd__fail(c, GRAPHD_ETRUNC, "%zu tensors, room for %zu", g->n_tensors, room);
    return GRAPHD_OK;
}

/* ---- capture ---------------------------------------------------------------------------- */

void graphd_capture_opts_init(graphd_capture_opts_t *o)
{
    o->num_warmup_iters = -1;
    o->allow_unused_input = 0;
    o->pool = NULL;
    o->device_resident = 0;
    o->copy_param_grads = 0;
}

/* The request's variable parts, in one allocation each. */
typedef struct capture_req {
    Graphd__V1__Callable *callables;
    Graphd__V1__Callable **callable_list;
    Graphd__V1__TensorSpec *specs;
    Graphd__V1__TensorSpec **spec_list;
} capture_req_t;

static void capture_req_free(capture_req_t *r)
{
    free(r->callables);
    free(r->callable_list);
    free(r->specs);
    free(r->spec_list);
}

static int capture_req_build(graphd_client_t *c, size_t n, const graphd_callable_t *callables,
                             capture_req_t *r)
{
    size_t nargs = 0;
    for (size_t i = 0; i < n; i++) {
        if (callables[i].n_args > 0 && callables[i].args == NULL)
            return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "callable %zu: args is NULL", i);
        for (size_t a = 0; a < callables[i].n_args; a++)
            if (callables[i].args[a].ndim > GRAPHD_MAX_DIMS)
                return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                                    "callable %zu arg %zu: %u dimensions (at most %d)", i, a,
                                    (unsigned)callables[i].args[a].ndim, GRAPHD_MAX_DIMS);
        nargs += callables[i].n_args;
    }
    r->callables = calloc(n, sizeof(*r->callables));
    r->callable_list = calloc(n, sizeof(*r->callable_list));
    r->specs = calloc(nargs + 1, sizeof(*r->specs));
    r->spec_list = calloc(nargs + 1, sizeof(*r->spec_list));
    if (r->callables == NULL || r->callable_list == NULL || r->specs == NULL ||
        r->spec_list == NULL)
        return graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
    size_t next = 0;
    for (size_t i = 0; i < n; i++) {
        const graphd_callable_t *in = &callables[i];
        Graphd__V1__Callable *out = &r->callables[i];
        graphd__v1__callable__init(out);
        out->module_id = in->module_id;
        out->method = (char *)(in->method != NULL ? in->method : "");
        out->n_sample_args = in->n_args;
        out->sample_args = &r->spec_list[next];
        for (size_t a = 0; a < in->n_args; a++, next++) {
            const graphd_tensor_spec_t *t = &in->args[a];
            Graphd__V1__TensorSpec *s = &r->specs[next];
            graphd__v1__tensor_spec__init(s);
            s->dtype = (Graphd__V1__DType)t->dtype;
            s->n_shape = t->ndim;
            s->shape = (int64_t *)t->shape;
            s->requires_grad = t->requires_grad != 0;
            r->spec_list[next] = s;
        }
        r->callable_list[i] = out;
    }
    return GRAPHD_OK;
}

/* Builds the handle for one GraphInfo, mapping its region. */
static int graph_from_info(graphd_client_t *c, const Graphd__V1__GraphInfo *info,
                           graphd_graph_t **out)
{
    graphd_graph_t *g = calloc(1, sizeof(*g) + info->n_tensors * sizeof(g->tensors[0]));
    if (g == NULL)
        return graphd__fail(c, GRAPHD_ENOMEM, "out of memory");
    int rc = graphd__region_map(c, info->region_id, info->device, &g->region);
    if (rc != GRAPHD_OK) {
        free(g);
        return rc;
    }
    g->id = info->graph_id;
    for (size_t k = 0; k < info->n_tensors; k++) {
        const Graphd__V1__TensorDesc *d = info->tensors[k];
        graphd_tensor_t *t = &g->tensors[k];
        graphd_region_t *r = g->region;
        if (d->region_id != info->region_id) {
            rc = graph_extra_region(c, g, d->region_id, info->device, &r);
            if (rc != GRAPHD_OK) {
                graph_unmap(g);
                return rc;
            }
        }
        uint64_t size = graphd_region_mapped_size(r);
        if (d->offset > size || d->nbytes > size - d->offset || d->n_shape > GRAPHD_MAX_DIMS ||
            d->n_strides != d->n_shape) {
            rc = graphd__fail(c, GRAPHD_EPROTO,
                              "graph %llu: tensor %zu does not fit its region %llu of %llu bytes",
                              (unsigned long long)info->graph_id, k,
                              (unsigned long long)d->region_id, (unsigned long long)size);
            graph_unmap(g);
            return rc;
        }
        t->role = (int)d->role;
        t->index = d->index;
        graphd__strlcpy(t->name, d->name, sizeof(t->name));
        t->dtype = (int)d->dtype;
        t->ndim = (uint32_t)d->n_shape;
        if (d->n_shape > 0) { /* a 0-d tensor (num_batches_tracked) comes with NULL arrays */
            memcpy(t->shape, d->shape, d->n_shape * sizeof(t->shape[0]));
            memcpy(t->strides, d->strides, d->n_strides * sizeof(t->strides[0]));
        }
        t->nbytes = d->nbytes;
        t->requires_grad = d->requires_grad != 0;
        t->data = (uint8_t *)graphd_region_ptr(r) + d->offset;
        t->absent = d->absent != 0;
        t->on_device = graphd_region_is_device(r);
    }
    g->training = info->training != 0;
    g->has_backward = info->has_backward != 0;
    g->warmup_reused = info->warmup_reused != 0;
    g->n_tensors = info->n_tensors;
    link_graph(c, g);
    *out = g;
    return GRAPHD_OK;
}

int graphd_capture(graphd_client_t *c, size_t n, const graphd_callable_t *callables,
                   const graphd_capture_opts_t *opts, graphd_graph_t **graphs)
{
    c->last_error[0] = '\0';
    if (n == 0 || callables == NULL || graphs == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "give at least one callable and room for its graph");
    memset(graphs, 0, n * sizeof(*graphs));
    int rc = need_session(c);
    if (rc != GRAPHD_OK)
        return rc;
    graphd_capture_opts_t defaults;
    graphd_capture_opts_init(&defaults);
    if (opts == NULL)
        opts = &defaults;

    capture_req_t parts = {0};
    rc = capture_req_build(c, n, callables, &parts);
    if (rc != GRAPHD_OK) {
        capture_req_free(&parts);
        return rc;
    }
    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__CaptureRequest req = GRAPHD__V1__CAPTURE_REQUEST__INIT;
    req.session = &ref;
    req.n_callables = n;
    req.callables = parts.callable_list;
    if (opts->num_warmup_iters >= 0) {
        req.warmup_case = GRAPHD__V1__CAPTURE_REQUEST__WARMUP_NUM_WARMUP_ITERS;
        req.num_warmup_iters = opts->num_warmup_iters;
    }
    req.allow_unused_input = opts->allow_unused_input != 0;
    req.pool = (char *)(opts->pool != NULL ? opts->pool : "");
    req.device_resident = opts->device_resident != 0;
    req.copy_param_grads = opts->copy_param_grads != 0;
    Graphd__V1__CaptureReply *rep;
    rc = graphd__call(c, GRAPHD__METHOD("Capture"), &req.base,
                      &graphd__v1__capture_reply__descriptor, (ProtobufCMessage **)&rep);
    capture_req_free(&parts);
    if (rc != GRAPHD_OK)
        return rc;

    if (rep->n_graphs != n)
        rc = graphd__fail(c, GRAPHD_EPROTO, "Capture of %zu callables returned %zu graphs", n,
                          rep->n_graphs);
    for (size_t i = 0; i < n && rc == GRAPHD_OK; i++)
        rc = graph_from_info(c, rep->graphs[i], &graphs[i]);
    if (rc != GRAPHD_OK) {
        /* Leave nothing behind: the daemon's graphs (and their regions) go too. */
        char saved[GRAPHD__ERRMSG_MAX];
        memcpy(saved, c->last_error, sizeof(saved));
        for (size_t i = 0; i < rep->n_graphs; i++)
            if (c->session_id != 0)
                (void)release_graph_id(c, rep->graphs[i]->graph_id);
        for (size_t i = 0; i < n; i++) {
            if (graphs[i] != NULL)
                graphd__graph_forget(graphs[i]);
            graphs[i] = NULL;
        }
        memcpy(c->last_error, saved, sizeof(saved));
    }
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return rc;
}

/* ---- replay ----------------------------------------------------------------------------- */

int graphd_replay(graphd_graph_t *g, int phase, uint64_t *device_ns)
{
    if (g == NULL)
        return GRAPHD_EINVALID_ARGUMENT;
    graphd_client_t *c = g->client;
    c->last_error[0] = '\0';
    if (c->nseqs > 0) { /* a posted replay that failed is reported at the next replay call */
        int rc = graphd__dp_drain(c);
        if (rc != GRAPHD_OK)
            return rc;
    }
    /* A negative phase would become a huge one on the wire; the daemon refuses both alike. */
    return graphd__dp_replay(c, g, (uint64_t)(int64_t)phase, device_ns);
}

int graphd_replay_stream(graphd_graph_t *g, int phase, void *stream, uint64_t *launch_ns)
{
    if (g == NULL)
        return GRAPHD_EINVALID_ARGUMENT;
    graphd_client_t *c = g->client;
    c->last_error[0] = '\0';
    if (g->region == NULL || g->region->kind == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT,
                            "graph %llu is host-staged: stream-ordered replays are for "
                            "device-resident graphs (use graphd_replay)",
                            (unsigned long long)g->id);
    const graphd__kind_t *kind = g->region->kind;
    if (kind->replay_ordered == NULL)
        return graphd__fail(c, GRAPHD_EUNIMPLEMENTED,
                            "graph %llu is on %s:%d: libgraphd has no stream-ordered replays "
                            "there (use graphd_replay)",
                            (unsigned long long)g->id, kind->name, g->region->device);
    return kind->replay_ordered(c, g->region->device, stream, g, phase, launch_ns);
}

int graphd_set_replay_posted(graphd_client_t *c, int posted)
{
    if (c == NULL)
        return 0;
    int prev = c->posted;
    c->posted = posted != 0;
    return prev;
}

int graphd_replay_rpc(graphd_graph_t *g, int phase, uint64_t *device_ns)
{
    if (g == NULL)
        return GRAPHD_EINVALID_ARGUMENT;
    graphd_client_t *c = g->client;
    c->last_error[0] = '\0';
    int rc = need_session(c);
    if (rc != GRAPHD_OK)
        return rc;
    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__ReplayRequest req = GRAPHD__V1__REPLAY_REQUEST__INIT;
    req.session = &ref;
    req.graph_id = g->id;
    req.phase = (Graphd__V1__Phase)phase;
    Graphd__V1__ReplayReply *rep;
    rc = graphd__call(c, GRAPHD__METHOD("Replay"), &req.base, &graphd__v1__replay_reply__descriptor,
                      (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    if (device_ns != NULL)
        *device_ns = rep->device_ns;
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return GRAPHD_OK;
}
