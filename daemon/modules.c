/* Modules: RegisterModule loads TorchScript in the uid's cpu:0 executor (on that executor's
 * worker, in the session's queue: a load waits only for its own uid's executor, never in a pool
 * of threads that another uid's stuck executor could fill); ReleaseModule. */
#include "graphs.h"
#include "graphd.pb-c.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

/* ---- modules ----------------------------------------------------------- */

typedef struct {
    gd_job_t job;
    gd_daemon_t *d;
    gd_call_t *call;
    uint64_t session;
    gd_exec_t *x; /* the uid's executor on cpu:0, where registration loads (and so checks) it */
    char name[GD_NAME_MAX + 1];
    const void *bytes;
    size_t len;
    void *map; /* a private mapping of the source region, or NULL for inline bytes */
    size_t map_len;
    uint8_t expect[GR_SHA256_LEN];
    bool check_sha;
    int rc;
    char msg[1024];
    gd_xmodule_t *m;
    gr_module_info_t info;
} load_op_t;

static void load_run(gd_job_t *job)
{
    load_op_t *op = (load_op_t *)job;
    op->rc = gd_exec_module_load(op->x, op->bytes, op->len, &op->m, &op->info);
    if (op->rc != GR_OK)
        snprintf(op->msg, sizeof op->msg, "%s", gd_exec_last_error());
}

static void load_done(gd_job_t *job)
{
    load_op_t *op = (load_op_t *)job;
    gd_daemon_t *d = op->d;
    if (op->map)
        munmap(op->map, op->map_len);
    if (op->rc != GR_OK) {
        gd_call_fail(op->call, gr_err_grpc(op->rc), "module does not load: %s", op->msg);
        free(op);
        return;
    }
    if (op->check_sha && memcmp(op->expect, op->info.sha256, GR_SHA256_LEN) != 0) {
        gd_exec_module_release(op->m);
        gd_call_fail(op->call, GD_INVALID_ARGUMENT,
                     "module bytes do not match the expected SHA-256 (corrupt or changed)");
        free(op);
        return;
    }
    gd_session_t *s = gd_session_find(d, op->session);
    gd_module_t *m = s ? calloc(1, sizeof *m) : NULL;
    if (m == NULL) {
        gd_exec_module_release(op->m);
        gd_call_fail(op->call, s ? GD_INTERNAL : GD_NOT_FOUND,
                     s ? "out of memory" : "the session ended during the load");
        free(op);
        return;
    }
    m->id = ++d->next_module_id;
    m->session = op->session;
    m->uid = s->uid;
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
    rep.reused = op->info.refcount > 1; /* loads in this uid's own executor only */
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
    gd_worker_t *w = gd_worker_for(d, s->uid, "cpu:0", &op->x);
    if (w == NULL) {
        gd_call_fail(call, GD_INTERNAL, "out of memory");
        free(op);
        return;
    }
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
    op->job.run = load_run;
    op->job.done = load_done; /* no drop: a load runs even if its session ends meanwhile */
    op->job.session = s->id;
    gd_worker_submit(w, &op->job);
}

/* Finds a module handle of session s; on failure finishes the call. */
gd_module_t *gd_module_of(gd_daemon_t *d, gd_call_t *call, gd_session_t *s, uint64_t id)
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
    gd_module_t *m = gd_module_of(d, call, s, req->module_id);
    if (m == NULL)
        return;
    m->released = true;
    s->modules--;
    gd_module_unref(d, m);
    Graphd__V1__ReleaseModuleReply rep = GRAPHD__V1__RELEASE_MODULE_REPLY__INIT;
    gd_call_reply(call, &rep.base);
}
