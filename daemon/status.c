/* The Status reply, one function per section. */
#include "status.h"
#include "log.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* gp's replay latencies: those the daemon ran and those of graphs gone (gp->latency), and the
 * direct replays of its live graphs (their executors' state pages). */
static void pool_latency(const gd_daemon_t *d, const gd_gpool_t *gp, gd_hist_t *out)
{
    memset(out, 0, sizeof *out);
    gd_hist_merge(out, &gp->latency);
    for (const gd_graph_t *g = d->graphs; g; g = g->next)
        if (g->pool == gp && g->g) {
            gd_xstats_t x;
            gd_exec_graph_stats(g->g, &x);
            gd_hist_merge(out, &x.latency);
        }
}

/* The graph side of pool's message from gp (NULL: a pool with no graph state yet); h gets the
 * pool's latencies (pool_latency; empty for NULL). */
static void pool_fill(const gd_daemon_t *d, const gd_gpool_t *gp, Graphd__V1__Pool *pool,
                      gd_hist_t *h)
{
    memset(h, 0, sizeof *h);
    if (gp == NULL)
        return;
    pool_latency(d, gp, h);
    pool->graphs = gp->graphs;
    pool->replays = gd_hist_count(h);
    pool->graph_mempool_reserved_bytes = atomic_load(&gp->mempool_reserved);
    pool->graph_mempool_in_use_bytes = atomic_load(&gp->mempool_in_use);
}

void gd_graphs_pool_fill(gd_daemon_t *d, Graphd__V1__Pool *pool)
{
    gd_hist_t h;
    pool_fill(d, gd_gpool_find(d, pool->name), pool, &h);
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

/* Whether viewer sees graph g in full: it sees g's session. */
static bool sees_graph(gd_daemon_t *d, const gd_session_t *viewer, const gd_graph_t *g)
{
    if (gd_is_admin(viewer))
        return true;
    const gd_session_t *s = gd_session_find(d, g->session);
    return s != NULL && gd_sees_session(viewer, s);
}

/* The graphs section (the graphs viewer sees; the rest counted in rep->others), and the graph
 * figures of the pools and sessions sections. */
/* Distinct archives per uid held by module handles (each uid's executors load their own). */
static uint32_t distinct_modules(const gd_daemon_t *d)
{
    uint32_t n = 0;
    for (const gd_module_t *m = d->modules; m; m = m->next) {
        const gd_module_t *o = d->modules;
        while (o != m && (o->uid != m->uid || memcmp(o->sha256, m->sha256, GR_SHA256_LEN) != 0))
            o = o->next;
        n += o == m;
    }
    return n;
}

/* The direct replays of the session's live graphs. */
static uint64_t session_direct(const gd_daemon_t *d, uint64_t session)
{
    uint64_t n = 0;
    for (const gd_graph_t *g = d->graphs; g; g = g->next)
        if (g->session == session && g->g) {
            gd_xstats_t x;
            gd_exec_graph_stats(g->g, &x);
            n += x.forward + x.backward + x.errors;
        }
    return n;
}

/* gd_graphs_status; pool_hists (optional, rep->n_pools entries) gets each pool's latencies. */
static void graphs_status(gd_daemon_t *d, const gd_session_t *viewer, Graphd__V1__StatusReply *rep,
                          gd_hist_t *pool_hists)
{
    size_t ng = 0;
    for (gd_graph_t *g = d->graphs; g; g = g->next) {
        if (sees_graph(d, viewer, g))
            ng++;
        else if (rep->others)
            rep->others->graphs++;
    }
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
    for (gd_graph_t *g = d->graphs; g && i < ng; g = g->next) {
        if (!sees_graph(d, viewer, g))
            continue;
        Graphd__V1__GraphStatus *x = &st->gs[i];
        graphd__v1__graph_status__init(x);
        x->id = g->id;
        x->session = g->session;
        x->pool = g->pool->name;
        x->device = g->worker->device;
        x->module = g->module;
        x->training = g->training;
        gd_xstats_t direct = {0};
        if (g->g)
            gd_exec_graph_stats(g->g, &direct);
        x->replays_forward = atomic_load(&g->replays_forward) + direct.forward;
        x->replays_backward = atomic_load(&g->replays_backward) + direct.backward;
        x->replay_errors = atomic_load(&g->replay_errors) + direct.errors;
        x->region_bytes = g->region_bytes;
        gd_hist_merge(&direct.latency, &g->latency);
        fill_latency(&st->lat[i], &direct.latency);
        x->latency = &st->lat[i];
        st->gl[i] = x;
        i++;
    }
    st->gl[ng + 1] = (void *)st; /* past the end: only gd_graphs_status_free looks there */
    rep->graphs = st->gl;
    rep->n_graphs = ng;
    for (size_t p = 0; p < rep->n_pools; p++) {
        Graphd__V1__Pool *pool = rep->pools[p];
        gd_gpool_t *gp = gd_gpool_find(d, pool->name);
        Graphd__V1__LatencyStatus *l = &st->lat[ng + p];
        gd_hist_t h;
        pool_fill(d, gp, pool, &h);
        fill_latency(l, &h); /* all zero for a pool with no graph state */
        pool->latency = l;
        if (pool_hists)
            memcpy(&pool_hists[p], &h, sizeof h);
    }
    for (size_t k = 0; k < rep->n_sessions; k++) {
        gd_session_t *s = gd_session_find(d, rep->sessions[k]->id);
        if (s) {
            rep->sessions[k]->graphs = s->graphs;
            rep->sessions[k]->modules = s->modules;
            rep->sessions[k]->replays = s->replays + session_direct(d, s->id);
        }
    }
    rep->daemon->modules_loaded = distinct_modules(d);
}

void gd_graphs_status(gd_daemon_t *d, const gd_session_t *viewer, Graphd__V1__StatusReply *rep)
{
    graphs_status(d, viewer, rep, NULL);
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

/* ---- devices and pools (also ListDevices, ListPools, CreatePool) --------- */

static void fill_telemetry(Graphd__V1__DeviceTelemetry *t, const gd_device_t *dev)
{
    graphd__v1__device_telemetry__init(t);
    t->read_unix_ms = dev->tel_unix_ms;
    if (dev->tel_unix_ms == 0)
        return; /* not read yet: everything absent */
    const gr_ze_telemetry_t *z = &dev->tel;
    t->have_memory = z->have_memory != 0;
    t->memory_free = z->have_memory ? z->mem_free_bytes : 0;
    t->memory_total = z->have_memory ? z->mem_total_bytes : 0;
    t->have_engine = z->have_engine != 0;
    t->engine_active_us = z->have_engine ? z->engine_active_us : 0;
    t->have_utilisation = z->have_utilisation != 0;
    t->utilisation = z->have_utilisation ? z->utilisation : 0;
    t->memory_health = (char *)(z->have_health && z->mem_health_name ? z->mem_health_name : "");
    t->have_reset = z->have_reset != 0;
    t->wedged = z->have_reset && z->wedged;
}

/* tel: storage for the device's telemetry, used when its family reads one. */
static void fill_device(Graphd__V1__Device *m, const gd_device_t *dev,
                        Graphd__V1__DeviceTelemetry *tel)
{
    graphd__v1__device__init(m);
    m->id = (char *)dev->id;
    m->kind = (char *)dev->kind;
    m->ordinal = dev->ordinal;
    m->name = (char *)dev->name;
    m->memory_total = dev->memory_total;
    m->memory_free = dev->memory_free;
    m->compute_capability = (char *)dev->compute_capability;
    m->mps = dev->mps;
    m->uuid = (char *)dev->uuid;
    m->compute_units = dev->compute_units;
    m->max_clock_mhz = dev->max_clock_mhz;
    m->driver = (char *)dev->driver;
    if (dev->telemetry) {
        fill_telemetry(tel, dev);
        m->telemetry = tel;
    }
}

Graphd__V1__Device **gd_status_devices(gd_daemon_t *d, Graphd__V1__Device *storage)
{
    /* One block, freed with free(list): the pointers, then each device's telemetry. */
    size_t n = d->ndevices ? d->ndevices : 1;
    Graphd__V1__Device **list =
        calloc(1, n * sizeof *list + n * sizeof(Graphd__V1__DeviceTelemetry));
    if (list == NULL)
        return NULL;
    Graphd__V1__DeviceTelemetry *tel = (Graphd__V1__DeviceTelemetry *)(void *)(list + n);
    gd_devices_refresh(d);
    for (size_t i = 0; i < d->ndevices; i++) {
        fill_device(&storage[i], &d->devices[i], &tel[i]);
        list[i] = &storage[i];
    }
    return list;
}

void gd_status_pool(Graphd__V1__Pool *m, const pm_pool_t *p)
{
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    graphd__v1__pool__init(m);
    m->name = (char *)info.name;
    m->device = (char *)info.device;
    m->limit_bytes = info.limit_bytes;
    m->reserved_bytes = info.reserved_bytes;
    m->used_bytes = info.used_bytes;
    m->regions = info.regions;
    m->sessions = info.sessions;
    m->created_unix_ms = info.created_unix_ms;
    m->owner_uid = info.owner.uid;
    m->owner_gid = info.owner.gid;
    m->mode = (Graphd__V1__PoolMode)info.owner.mode; /* pm_mode_t numbers the wire's */
    m->delete_with_session = info.owner.session != 0;
}

_Static_assert((int)GRAPHD__V1__POOL_MODE__POOL_MODE_PRIVATE == (int)PM_MODE_PRIVATE &&
                   (int)GRAPHD__V1__POOL_MODE__POOL_MODE_GROUP == (int)PM_MODE_GROUP &&
                   (int)GRAPHD__V1__POOL_MODE__POOL_MODE_PUBLIC == (int)PM_MODE_PUBLIC,
               "pool modes of the wire and of pool_manager disagree");

/* The pools viewer may use, for a reply; *n gets the count, *hidden how many were left out.
 * Free the result with gd_status_pools_free. */
Graphd__V1__Pool **gd_status_pools(gd_daemon_t *d, const gd_session_t *viewer, size_t *n,
                                   uint32_t *hidden)
{
    *hidden = 0;
    size_t count = 0;
    pm_pool_list(d->pools, &count, NULL);
    pm_pool_t **pools = calloc(count + 1, sizeof *pools);
    Graphd__V1__Pool **list = calloc(count + 1, sizeof *list);
    Graphd__V1__Pool *storage = calloc(count + 1, sizeof *storage);
    if (pools == NULL || list == NULL || storage == NULL) {
        free(pools);
        free(list);
        free(storage);
        *n = 0;
        return NULL;
    }
    pm_pool_list(d->pools, &count, pools);
    size_t shown = 0;
    for (size_t i = 0; i < count; i++) {
        if (!gd_may_use_pool(viewer, pools[i])) {
            (*hidden)++;
            continue;
        }
        gd_status_pool(&storage[shown], pools[i]);
        list[shown] = &storage[shown];
        shown++;
    }
    list[shown] = storage; /* past the end: only gd_status_pools_free looks there */
    free(pools);
    *n = shown;
    return list;
}

void gd_status_pools_free(Graphd__V1__Pool **list, size_t n)
{
    if (list) {
        free(list[n]);
        free(list);
    }
}

/* ---- the Status RPC ---------------------------------------------------- */

/* The daemon section: identity, counters and the live settings (values formatted into cfg). */
struct gd_status_daemon {
    Graphd__V1__DaemonStatus ds;
    Graphd__V1__ConfigEntry entries[64];
    Graphd__V1__ConfigEntry *list[64];
    char values[64][256];
};
typedef gd_status_daemon_t daemon_section_t;

static void status_daemon(gd_daemon_t *d, daemon_section_t *sec)
{
    Graphd__V1__DaemonStatus *ds = &sec->ds;
    graphd__v1__daemon_status__init(ds);
    ds->version = GRAPHD_VERSION;
    ds->pid = (int32_t)getpid();
    ds->uptime_ms = gd_now_mono_ms() - d->started_mono_ms;
    ds->started_unix_ms = d->started_unix_ms;
    ds->sessions = d->nsessions;
    ds->calls_total = gd_rpc_calls_total(d->rpc);
    ds->calls_failed = gd_rpc_calls_failed(d->rpc);
    ds->config_reloads = d->reloads;
    uint64_t dropped = 0, conns = 0;
    if (d->exec)
        gd_exec_host_direct(d->exec, &dropped, &conns);
    ds->replays_dropped = d->replays_dropped + dropped;
    ds->clients_disconnected = d->clients_disconnected + conns;
    size_t n = gd_settings_count < 64 ? gd_settings_count : 64;
    for (size_t i = 0; i < n; i++) {
        graphd__v1__config_entry__init(&sec->entries[i]);
        sec->entries[i].name = (char *)gd_settings[i].name;
        gd_config_format(&d->cfg, &gd_settings[i], sec->values[i], sizeof sec->values[i]);
        sec->entries[i].value = sec->values[i];
        sec->entries[i].reloadable = gd_settings[i].reloadable;
        sec->list[i] = &sec->entries[i];
    }
    ds->config = sec->list;
    ds->n_config = n;
}

/* The sessions section, without graph figures (gd_graphs_status adds them): the sessions viewer
 * sees, the others counted in rep->others. The arrays are the caller's to free, also when the
 * reply has no sessions. */
static void status_sessions(gd_daemon_t *d, const gd_session_t *viewer,
                            Graphd__V1__StatusReply *rep, Graphd__V1__SessionStatus **storage)
{
    size_t ns = d->nsessions, i = 0;
    Graphd__V1__SessionStatus *ss = calloc(ns + 1, sizeof *ss);
    Graphd__V1__SessionStatus **sl = calloc(ns + 1, sizeof *sl);
    *storage = ss;
    if (ss == NULL || sl == NULL) {
        free(sl);
        return;
    }
    for (gd_session_t *s = d->sessions; s && i < ns; s = s->next) {
        pm_usage_t u;
        pm_owner_usage(d->pools, s->id, &u);
        if (!gd_sees_session(viewer, s)) {
            rep->others->sessions++;
            rep->others->modules += s->modules;
            rep->others->regions += u.regions;
            rep->others->bytes += u.bytes;
            continue;
        }
        graphd__v1__session_status__init(&ss[i]);
        ss[i].id = s->id;
        ss[i].uid = s->attached ? (uint32_t)s->uid : 0;
        ss[i].pid = (int32_t)s->pid;
        ss[i].name = s->name;
        ss[i].regions = u.regions;
        ss[i].bytes = u.bytes;
        ss[i].connected_since_unix_ms = s->created_unix_ms;
        ss[i].attached = s->attached;
        ss[i].capturing_since_unix_ms = s->capturing ? s->capturing_since_unix_ms : 0;
        ss[i].capturing_graphs = s->capturing;
        sl[i] = &ss[i];
        i++;
    }
    rep->sessions = sl;
    rep->n_sessions = i;
}

/* The executors section: the viewer's own uid's, all for an admin. */
static void status_executors(gd_daemon_t *d, const gd_session_t *viewer,
                             Graphd__V1__StatusReply *rep, gd_exec_info_t **infos,
                             Graphd__V1__ExecutorStatus **storage)
{
    size_t n = gd_exec_host_list(d->exec, NULL, 0);
    *infos = calloc(n + 1, sizeof **infos);
    *storage = calloc(n + 1, sizeof **storage);
    Graphd__V1__ExecutorStatus **list = calloc(n + 1, sizeof *list);
    if (*infos == NULL || *storage == NULL || list == NULL) {
        free(list);
        return;
    }
    /* Executors started since the count above are left out: the list is bounded by what was
     * allocated, and gd_exec_host_list returns the count, which may now be larger. */
    size_t now = gd_exec_host_list(d->exec, *infos, n);
    n = now < n ? now : n;
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        const gd_exec_info_t *e = &(*infos)[i];
        if (!gd_is_admin(viewer) && (viewer == NULL || !viewer->attached || viewer->uid != e->uid))
            continue;
        Graphd__V1__ExecutorStatus *m = &(*storage)[k];
        graphd__v1__executor_status__init(m);
        m->uid = (uint32_t)e->uid;
        m->device = (char *)e->device;
        m->pid = e->pid;
        m->rss_bytes = e->rss;
        m->starts = e->starts;
        m->killed_time = e->killed_time;
        m->killed_memory = e->killed_memory;
        m->died = e->died;
        m->sandbox = (char *)e->sandbox;
        list[k++] = m;
    }
    rep->executors = list;
    rep->n_executors = k;
}

static const gd_session_t viewer_all = {.attached = true, .uid = 0};
const gd_session_t *const gd_viewer_all = &viewer_all;

int gd_status_build(gd_daemon_t *d, const gd_session_t *viewer, gd_status_t *st)
{
    memset(st, 0, sizeof *st);
    graphd__v1__status_reply__init(&st->rep);
    graphd__v1__hidden_status__init(&st->others);
    Graphd__V1__StatusReply *rep = &st->rep;
    rep->others = &st->others;
    st->daemon = calloc(1, sizeof *st->daemon);
    if (st->daemon == NULL)
        return -1;
    status_daemon(d, st->daemon);
    rep->daemon = &st->daemon->ds;
    rep->devices = gd_status_devices(d, st->devices);
    rep->n_devices = rep->devices ? d->ndevices : 0;
    rep->pools = gd_status_pools(d, viewer, &rep->n_pools, &st->others.pools);
    st->pool_latency = calloc(rep->n_pools + 1, sizeof *st->pool_latency);
    status_sessions(d, viewer, rep, &st->sessions);
    graphs_status(d, viewer, rep, st->pool_latency);
    status_executors(d, viewer, rep, &st->exec_infos, &st->exec_storage);
    return st->pool_latency ? 0 : -1;
}

void gd_status_release(gd_status_t *st)
{
    Graphd__V1__StatusReply *rep = &st->rep;
    free(rep->executors);
    free(st->exec_storage);
    free(st->exec_infos);
    gd_graphs_status_free(rep);
    free(rep->sessions);
    free(st->sessions);
    gd_status_pools_free(rep->pools, rep->n_pools);
    free(rep->devices);
    free(st->pool_latency);
    free(st->daemon);
    memset(st, 0, sizeof *st);
}

void gd_rpc_status(void *ctx, gd_call_t *call, const ProtobufCMessage *msg)
{
    gd_daemon_t *d = ctx;
    const Graphd__V1__StatusRequest *req = (const void *)msg;
    gd_session_t *viewer;
    if (!gd_viewer_of(d, call, req->session, &viewer))
        return;
    gd_status_t *st = calloc(1, sizeof *st);
    if (st == NULL || gd_status_build(d, viewer, st) != 0)
        gd_call_fail(call, GD_INTERNAL, "out of memory");
    else
        gd_call_reply(call, &st->rep.base);
    if (st)
        gd_status_release(st);
    free(st);
}
