/*
 * The control-plane handlers: one plain function per RPC, run on the loop
 * thread. Each validates its request, acts on the daemon's state and finishes
 * the call with a reply or a precise status. gRPC statuses are chosen here,
 * at the daemon's edge, from the modules' own error codes.
 */
#include "daemon.h"
#include "graphd.pb-c.h"
#include "log.h"
#include "exec.h"
#include "runtime.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Finds the caller's session; on failure finishes the call and returns NULL. */
gd_session_t *gd_session_of(gd_daemon_t *d, gd_call_t *call, const Graphd__V1__SessionRef *ref)
{
    if (ref == NULL || ref->id == 0) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "session is required (call Hello first)");
        return NULL;
    }
    gd_session_t *s = gd_session_find(d, ref->id);
    if (s == NULL || s->token != ref->token) {
        gd_call_fail(call, GD_NOT_FOUND, "no such session: %llu", (unsigned long long)ref->id);
        return NULL;
    }
    return s;
}

/* As gd_session_of, for calls that act in the session (all but Goodbye): a session whose socket
 * is not attached has no owner yet (SO_PEERCRED), so it may do nothing but attach; what names
 * the call for the message. */
gd_session_t *gd_attached_session_of(gd_daemon_t *d, gd_call_t *call,
                                     const Graphd__V1__SessionRef *ref, const char *what)
{
    gd_session_t *s = gd_session_of(d, call, ref);
    if (s != NULL && !s->attached) {
        gd_call_fail(call, GD_FAILED_PRECONDITION,
                     "attach the session socket before %s: a session that is not attached has "
                     "no owner and can only attach",
                     what);
        return NULL;
    }
    return s;
}

static void hello(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__HelloRequest *req = (const void *)msg;
    if (req->protocol_version != GD_PROTOCOL_VERSION) {
        gd_call_fail(call, GD_FAILED_PRECONDITION,
                     "protocol version %u is not supported (this daemon speaks %u)",
                     req->protocol_version, GD_PROTOCOL_VERSION);
        return;
    }
    if (strlen(req->client_name) > GD_NAME_MAX) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "client_name is longer than %d bytes", GD_NAME_MAX);
        return;
    }
    if (d->nsessions >= d->cfg.max_sessions) {
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED, "too many sessions (max_sessions = %llu)",
                     (unsigned long long)d->cfg.max_sessions);
        return;
    }
    gd_session_t *s = gd_session_create(d, req->client_name, req->pid);
    if (s == NULL) {
        gd_call_fail(call, GD_INTERNAL, "cannot create a session");
        return;
    }
    Graphd__V1__Device storage[GD_MAX_DEVICES];
    Graphd__V1__SessionRef ref = GRAPHD__V1__SESSION_REF__INIT;
    Graphd__V1__HelloReply rep = GRAPHD__V1__HELLO_REPLY__INIT;
    ref.id = s->id;
    ref.token = s->token;
    rep.session = &ref;
    rep.daemon_version = GRAPHD_VERSION;
    rep.session_socket = d->cfg.session_socket;
    rep.protocol_version = GD_PROTOCOL_VERSION;
    rep.devices = gd_status_devices(d, storage);
    rep.n_devices = rep.devices ? d->ndevices : 0;
    gd_call_reply(call, &rep.base);
    free(rep.devices);
}

static void goodbye(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__GoodbyeRequest *req = (const void *)msg;
    gd_session_t *s = gd_session_of(d, call, req->session);
    if (s == NULL)
        return;
    gd_session_end(d, s, "goodbye");
    Graphd__V1__GoodbyeReply rep = GRAPHD__V1__GOODBYE_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}

static void list_devices(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    (void)msg;
    Graphd__V1__Device storage[GD_MAX_DEVICES];
    Graphd__V1__ListDevicesReply rep = GRAPHD__V1__LIST_DEVICES_REPLY__INIT;
    rep.devices = gd_status_devices(d, storage);
    rep.n_devices = rep.devices ? d->ndevices : 0;
    gd_call_reply(call, &rep.base);
    free(rep.devices);
}

/* CreatePool and DeletePool act for an owner: an attached session (a call without one is
 * FAILED_PRECONDITION; graphctl and the clients open one). */
static gd_session_t *pool_session(gd_daemon_t *d, gd_call_t *call,
                                  const Graphd__V1__SessionRef *ref, const char *what)
{
    if (ref == NULL || ref->id == 0) {
        gd_call_fail(call, GD_FAILED_PRECONDITION,
                     "%s needs an attached session: pools belong to its uid (call Hello, attach "
                     "the session socket and pass the session)",
                     what);
        return NULL;
    }
    return gd_attached_session_of(d, call, ref, what);
}

static void create_pool(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__CreatePoolRequest *req = (const void *)msg;
    gd_session_t *s = pool_session(d, call, req->session, "creating a pool");
    if (s == NULL)
        return;
    const char *devname = req->device[0] ? req->device : "cpu:0";
    const gd_device_t *dev = gd_device_find(d, devname);
    if (dev == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no device '%.64s' (see ListDevices)", devname);
        return;
    }
    int mode = gd_pool_mode_from_wire((int)req->mode);
    if (mode < 0) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "unknown pool mode %d (PRIVATE 1, GROUP 2 or PUBLIC 3)", (int)req->mode);
        return;
    }
    uint32_t owned = gd_uid_pools(d, s->uid);
    if (owned >= d->cfg.max_pools_per_uid) {
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                     "uid %u owns %u pools (max_pools_per_uid = %llu): delete one first",
                     (unsigned)s->uid, owned, (unsigned long long)d->cfg.max_pools_per_uid);
        return;
    }
    uint64_t limit = req->limit_bytes ? req->limit_bytes : d->cfg.default_pool_limit;
    pm_pool_t *p = NULL;
    int rc = pm_pool_create(d->pools, req->name, dev->id, limit, &p);
    if (rc != PM_OK) {
        if (rc == PM_EINVAL)
            gd_call_fail(call, GD_INVALID_ARGUMENT,
                         "pool name must be 1 to %d characters of A-Z a-z 0-9 . _ -", PM_NAME_MAX);
        else if (rc == PM_EEXIST)
            gd_call_fail(call, GD_ALREADY_EXISTS, "pool '%s' already exists", req->name);
        else
            gd_call_fail(call, pm_err_grpc(rc), "cannot create pool: %s", pm_strerror(rc));
        return;
    }
    pm_pool_owner_t owner = {(uint32_t)s->uid, (uint32_t)s->gid, mode,
                             req->delete_with_session ? s->id : 0};
    pm_pool_set_owner(p, &owner);
    gd_info("pool %s created on %s by uid %u (%s%s, limit %llu bytes)", req->name, dev->id,
            (unsigned)s->uid, gd_pool_mode_name(mode),
            req->delete_with_session ? ", deleted with its session" : "",
            (unsigned long long)limit);
    Graphd__V1__Pool pool;
    gd_status_pool(&pool, p);
    Graphd__V1__CreatePoolReply rep = GRAPHD__V1__CREATE_POOL_REPLY__INIT;
    rep.pool = &pool;
    gd_call_reply(call, &rep.base);
}

static void delete_pool(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__DeletePoolRequest *req = (const void *)msg;
    gd_session_t *s = pool_session(d, call, req->session, "deleting a pool");
    if (s == NULL)
        return;
    if (d->cfg.default_pool[0] != '\0' && strcmp(req->name, d->cfg.default_pool) == 0) {
        /* else any client could delete it and re-make it with a tiny limit */
        gd_call_fail(call, GD_PERMISSION_DENIED,
                     "pool '%s' is the daemon's default pool and cannot be deleted", req->name);
        return;
    }
    pm_pool_t *p = pm_pool_find(d->pools, req->name);
    if (p == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no pool named '%.64s'", req->name);
        return;
    }
    if (!gd_pool_owner_check(call, s, p, "delete"))
        return;
    int rc = gd_pool_delete(d, req->name);
    if (rc == PM_EBUSY) {
        gd_call_fail(call, GD_FAILED_PRECONDITION, "pool '%s' still holds regions", req->name);
        return;
    }
    if (rc != PM_OK) {
        gd_call_fail(call, pm_err_grpc(rc), "cannot delete pool: %s", pm_strerror(rc));
        return;
    }
    Graphd__V1__DeletePoolReply rep = GRAPHD__V1__DELETE_POOL_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}

bool gd_viewer_of(gd_daemon_t *d, gd_call_t *call, const Graphd__V1__SessionRef *ref,
                  gd_session_t **out)
{
    *out = NULL;
    if (ref == NULL || ref->id == 0)
        return true; /* anonymous: counts only */
    *out = gd_attached_session_of(d, call, ref, "asking as a session");
    return *out != NULL;
}

static void list_pools(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__ListPoolsRequest *req = (const void *)msg;
    gd_session_t *viewer;
    if (!gd_viewer_of(d, call, req->session, &viewer))
        return;
    Graphd__V1__ListPoolsReply rep = GRAPHD__V1__LIST_POOLS_REPLY__INIT;
    rep.pools = gd_status_pools(d, viewer, &rep.n_pools, &rep.hidden);
    for (size_t i = 0; i < rep.n_pools; i++)
        gd_graphs_pool_fill(d, rep.pools[i]);
    gd_call_reply(call, &rep.base);
    gd_status_pools_free(rep.pools, rep.n_pools);
}

/* Fails an AllocRegion whose pool refused rc for size bytes. */
static void alloc_fail(gd_call_t *call, pm_pool_t *p, int rc, uint64_t size)
{
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    if (rc == PM_ELIMIT)
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                     "pool '%s' limit %llu bytes: %llu reserved, %llu more asked for", info.name,
                     (unsigned long long)info.limit_bytes, (unsigned long long)info.reserved_bytes,
                     (unsigned long long)size);
    else if (rc == PM_ESYS)
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED, "cannot allocate %llu bytes of shared memory",
                     (unsigned long long)size);
    else
        gd_call_fail(call, pm_err_grpc(rc), "cannot allocate region: %s", pm_strerror(rc));
}

static void alloc_reply(gd_call_t *call, const pm_region_t *r)
{
    pm_pool_info_t info;
    pm_pool_info(pm_region_pool(r), &info);
    Graphd__V1__AllocRegionReply rep = GRAPHD__V1__ALLOC_REGION_REPLY__INIT;
    rep.region_id = pm_region_id(r);
    rep.size = pm_region_size(r);
    /* A device region maps (cudaIpcOpenMemHandle) exactly the block: the MAP reply's size. */
    rep.mapped_size = pm_region_is_device(r) ? pm_region_size(r) : pm_region_mapped_size(r);
    rep.pool = (char *)info.name;
    rep.device = (char *)info.device;
    gd_call_reply(call, &rep.base);
}

/* AllocRegion with device: the block is allocated in the session's uid's executor on the device,
 * on that executor's worker, behind the work queued there (gr_device_alloc: cudaMalloc, exported
 * with CUDA IPC), and registered on the loop, where the pool's limit is checked again (it was
 * checked first so that a refused region costs no cudaMalloc). A block no region took is freed on
 * the worker. */
typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_call_t *call;
    gd_worker_t *worker;
    uint64_t session;
    char pool[PM_NAME_MAX + 1];
    uint64_t size;
    gd_exec_t *x; /* the session's uid's executor on the device */
    gd_xblock_t *ptr;
    uint8_t handle[GR_IPC_HANDLE_SIZE];
    int rc;
    char msg[512];
} devregion_op_t;

static void devregion_free_run(gd_job_t *job)
{
    devregion_op_t *op = (devregion_op_t *)job;
    if (op->ptr != NULL && gd_exec_device_free(op->ptr) != GR_OK)
        gd_warn("freeing device memory on %s: %s", op->worker->device, gd_exec_last_error());
    free(op);
}

static void devregion_alloc_run(gd_job_t *job)
{
    devregion_op_t *op = (devregion_op_t *)job;
    op->rc = gd_exec_device_alloc(op->x, op->worker->device, op->size, &op->ptr, op->handle);
    if (op->rc != GR_OK) {
        op->ptr = NULL;
        snprintf(op->msg, sizeof op->msg, "%s", gd_exec_last_error());
    }
}

static void devregion_alloc_done(gd_job_t *job)
{
    devregion_op_t *op = (devregion_op_t *)job;
    gd_daemon_t *d = op->d;
    if (op->rc != GR_OK) {
        gd_call_fail(op->call, gr_err_grpc(op->rc), "device memory on %s: %s", op->worker->device,
                     op->msg);
        free(op);
        return;
    }
    gd_session_t *s = gd_session_find(d, op->session);
    pm_pool_t *p = pm_pool_find(d->pools, op->pool);
    pm_region_t *r = NULL;
    if (s == NULL || p == NULL)
        gd_call_fail(op->call, GD_NOT_FOUND, "%s during the allocation",
                     s ? "the pool was deleted" : "the session ended");
    else {
        int rc = pm_region_alloc_device(p, s->id, op->size, op->ptr, op->handle, &r);
        if (rc != PM_OK)
            alloc_fail(op->call, p, rc, op->size);
    }
    if (r == NULL) { /* the block is still ours: free it behind whatever the worker holds */
        op->job.run = devregion_free_run;
        op->job.done = NULL;
        op->job.session = 0; /* the daemon's queue of its executor's worker (worker.h) */
        gd_worker_submit(op->worker, &op->job);
        return;
    }
    pm_region_set_tag(r, GD_REGION_TAG_DEVICE_BUFFER);
    gd_debug("session %llu: device region %llu (%llu bytes) in pool %s", (unsigned long long)s->id,
             (unsigned long long)pm_region_id(r), (unsigned long long)op->size, op->pool);
    alloc_reply(op->call, r);
    free(op);
}

/* AllocRegion with device on an xpu pool: allocated and zero-filled by the daemon through the
 * Level Zero layer, off the loop (gd_xpu_alloc), and registered here with the export's fd, which
 * the MAP reply passes (SCM_RIGHTS) beside the handle. The pool's limit is checked before the
 * allocation and again at registration, as for cuda. */
typedef struct {
    gd_daemon_t *d;
    gd_call_t *call;
    uint64_t session;
    char pool[PM_NAME_MAX + 1];
    char device[32];
    uint64_t size;
} xregion_op_t;

static void xregion_done(void *ctx, int rc, const char *msg, void *ptr, int fd, const uint8_t *ipc)
{
    xregion_op_t *op = ctx;
    gd_daemon_t *d = op->d;
    if (rc != GR_OK) {
        gd_call_fail(op->call, gd_xpu_grpc(rc), "device memory on %s (%llu bytes): %s", op->device,
                     (unsigned long long)op->size, msg);
        free(op);
        return;
    }
    gd_session_t *s = gd_session_find(d, op->session);
    pm_pool_t *p = pm_pool_find(d->pools, op->pool);
    pm_region_t *r = NULL;
    if (s == NULL || p == NULL)
        gd_call_fail(op->call, GD_NOT_FOUND, "%s during the allocation",
                     s ? "the pool was deleted" : "the session ended");
    else {
        int prc = pm_region_alloc_device_fd(p, s->id, op->size, ptr, ipc, fd, &r);
        if (prc != PM_OK)
            alloc_fail(op->call, p, prc, op->size);
    }
    if (r == NULL) { /* still ours */
        gd_xpu_free(d, op->device, ptr, fd);
        free(op);
        return;
    }
    pm_region_set_tag(r, GD_REGION_TAG_DEVICE_BUFFER);
    gd_debug("session %llu: %s region %llu (%llu bytes) in pool %s", (unsigned long long)s->id,
             op->device, (unsigned long long)pm_region_id(r), (unsigned long long)op->size,
             op->pool);
    alloc_reply(op->call, r);
    free(op);
}

static void alloc_xpu_region(gd_daemon_t *d, gd_call_t *call, gd_session_t *s,
                             const pm_pool_info_t *info, const gd_device_t *dev, uint64_t size)
{
    xregion_op_t *op = calloc(1, sizeof *op);
    if (op == NULL) {
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    op->d = d;
    op->call = call;
    op->session = s->id;
    snprintf(op->pool, sizeof op->pool, "%s", info->name);
    snprintf(op->device, sizeof op->device, "%s", dev->id);
    op->size = size;
    if (gd_xpu_alloc(d, dev->ordinal, size, xregion_done, op) != 0) {
        free(op);
        gd_call_fail(call, GD_INTERNAL, "cannot queue the allocation on %s", dev->id);
    }
}

static void alloc_device_region(gd_daemon_t *d, gd_call_t *call, gd_session_t *s, pm_pool_t *p,
                                uint64_t size)
{
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    const gd_family_t *fam = gd_family_of(info.device);
    if (fam == NULL || fam->memory == GD_DEVMEM_NONE) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "device memory needs a pool on a cuda or xpu device; pool '%s' is on %s",
                     info.name, info.device);
        return;
    }
    const gd_device_t *dev = gd_device_find(d, info.device);
    if (dev == NULL) {
        gd_call_fail(call, GD_FAILED_PRECONDITION, "pool '%s' is on %s, which has no worker",
                     info.name, info.device);
        return;
    }
    int rc = pm_pool_check_size(p, size);
    if (rc != PM_OK) {
        alloc_fail(call, p, rc, size);
        return;
    }
    if (fam->memory == GD_DEVMEM_ZE) {
        alloc_xpu_region(d, call, s, &info, dev, size);
        return;
    }
    devregion_op_t *op = calloc(1, sizeof *op);
    gd_worker_t *w = op ? gd_worker_for(d, s->uid, info.device, &op->x) : NULL;
    if (w == NULL) {
        free(op);
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        return;
    }
    op->job.run = devregion_alloc_run;
    op->job.done = devregion_alloc_done;
    op->job.session = s->id;
    op->d = d;
    op->call = call;
    op->worker = w;
    op->session = s->id;
    snprintf(op->pool, sizeof op->pool, "%s", info.name);
    op->size = size;
    gd_worker_submit(w, &op->job);
}

static void alloc_region(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__AllocRegionRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "allocating regions");
    if (s == NULL)
        return;
    const char *name = req->pool[0] ? req->pool : d->cfg.default_pool;
    pm_pool_t *p = pm_pool_find(d->pools, name);
    if (p == NULL) {
        gd_call_fail(call, GD_NOT_FOUND, "no pool named '%.64s'", name);
        return;
    }
    if (!gd_pool_use_check(call, s, p))
        return;
    if (req->size == 0) {
        gd_call_fail(call, GD_INVALID_ARGUMENT, "region size must be greater than 0");
        return;
    }
    pm_usage_t held;
    pm_owner_usage(d->pools, s->id, &held);
    if (held.regions >= d->cfg.max_regions_per_session) {
        gd_call_fail(call, GD_RESOURCE_EXHAUSTED,
                     "session %llu holds %u regions (max_regions_per_session = %llu): free one "
                     "first",
                     (unsigned long long)s->id, held.regions,
                     (unsigned long long)d->cfg.max_regions_per_session);
        return;
    }
    if (req->size > d->cfg.max_region_bytes) {
        gd_call_fail(call, GD_INVALID_ARGUMENT,
                     "region size %llu is larger than max_region_bytes (%llu)",
                     (unsigned long long)req->size, (unsigned long long)d->cfg.max_region_bytes);
        return;
    }
    if (req->device) {
        alloc_device_region(d, call, s, p, req->size);
        return;
    }
    pm_region_t *r = NULL;
    int rc = pm_region_alloc(p, s->id, req->size, &r);
    if (rc != PM_OK) {
        alloc_fail(call, p, rc, req->size);
        return;
    }
    gd_debug("session %llu: region %llu (%llu bytes) in pool %s", (unsigned long long)s->id,
             (unsigned long long)pm_region_id(r), (unsigned long long)req->size, name);
    alloc_reply(call, r);
}

static void free_region(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__FreeRegionRequest *req = (const void *)msg;
    gd_session_t *s = gd_attached_session_of(d, call, req->session, "freeing regions");
    if (s == NULL)
        return;
    pm_region_t *dr = pm_region_find(d->pools, req->region_id);
    if (dr != NULL && pm_region_owner(dr) == s->id && pm_region_is_device(dr) &&
        pm_region_tag(dr) != GD_REGION_TAG_DEVICE_BUFFER) {
        /* Its graph replays over it: the memory goes with the graph (ReleaseGraph). */
        gd_call_fail(call, GD_FAILED_PRECONDITION,
                     "region %llu holds a graph's static tensors in device memory; release the "
                     "graph instead",
                     (unsigned long long)req->region_id);
        return;
    }
    int rc = pm_region_free(d->pools, req->region_id, s->id);
    if (rc == PM_ENOENT) {
        gd_call_fail(call, GD_NOT_FOUND, "no region %llu", (unsigned long long)req->region_id);
        return;
    }
    if (rc == PM_EPERM) {
        gd_call_fail(call, GD_PERMISSION_DENIED, "region %llu belongs to another session",
                     (unsigned long long)req->region_id);
        return;
    }
    if (rc != PM_OK) {
        gd_call_fail(call, pm_err_grpc(rc), "cannot free region: %s", pm_strerror(rc));
        return;
    }
    Graphd__V1__FreeRegionReply rep = GRAPHD__V1__FREE_REGION_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}

#define METHOD(name, req, fn)                                                                      \
    {                                                                                              \
        "/graphd.v1.Graphd/" name, &graphd__v1__##req##__descriptor, fn                            \
    }
const gd_method_t gd_methods[] = {
    METHOD("Hello", hello_request, hello),
    METHOD("Goodbye", goodbye_request, goodbye),
    METHOD("ListDevices", list_devices_request, list_devices),
    METHOD("CreatePool", create_pool_request, create_pool),
    METHOD("DeletePool", delete_pool_request, delete_pool),
    METHOD("ListPools", list_pools_request, list_pools),
    METHOD("AllocRegion", alloc_region_request, alloc_region),
    METHOD("FreeRegion", free_region_request, free_region),
    METHOD("Status", status_request, gd_rpc_status),
    METHOD("RegisterModule", register_module_request, gd_rpc_register_module),
    METHOD("ReleaseModule", release_module_request, gd_rpc_release_module),
    METHOD("Capture", capture_request, gd_rpc_capture),
    METHOD("Replay", replay_request, gd_rpc_replay),
    METHOD("ReleaseGraph", release_graph_request, gd_rpc_release_graph),
};
const size_t gd_methods_count = sizeof gd_methods / sizeof gd_methods[0];
