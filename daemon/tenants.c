/*
 * Tenants: who owns what and who may see or use it. A tenant is a uid, known from SO_PEERCRED
 * once its session attaches; an admin is uid 0 or the daemon's own uid. Pools have an owner
 * (uid, gid) and a mode (pm_pool_owner_t); sessions, graphs and modules belong to their
 * session's uid. This file answers the questions the handlers and the status builder ask
 * (may this session use, delete, see that?), counts per uid for the per-uid bounds, and
 * deletes the pools that go with their session. docs/PROTOCOL.md, "Ownership and visibility".
 */
#include "daemon.h"
#include "graphd.pb-c.h"
#include "log.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

bool gd_is_admin(const gd_session_t *s)
{
    return s != NULL && s->attached && (s->uid == 0 || s->uid == geteuid());
}

bool gd_may_use_pool(const gd_session_t *s, const pm_pool_t *p)
{
    if (s == NULL || !s->attached)
        return false;
    return gd_is_admin(s) || pm_pool_may_use(p, (uint32_t)s->uid, (uint32_t)s->gid);
}

bool gd_sees_session(const gd_session_t *viewer, const gd_session_t *s)
{
    if (gd_is_admin(viewer))
        return true;
    return viewer != NULL && viewer->attached && s->attached && s->uid == viewer->uid;
}

static const char *mode_name(int mode)
{
    switch (mode) {
    case PM_MODE_GROUP:
        return "group";
    case PM_MODE_PUBLIC:
        return "public";
    default:
        return "private";
    }
}

bool gd_pool_use_check(gd_call_t *call, const gd_session_t *s, const pm_pool_t *p)
{
    if (gd_may_use_pool(s, p))
        return true;
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    if (info.owner.mode == PM_MODE_GROUP)
        gd_call_fail(call, GD_PERMISSION_DENIED,
                     "pool '%s' is a group pool of uid %u, gid %u: only sessions of that uid or "
                     "gid may use it; use a pool of your own",
                     info.name, (unsigned)info.owner.uid, (unsigned)info.owner.gid);
    else
        gd_call_fail(call, GD_PERMISSION_DENIED,
                     "pool '%s' is private to uid %u: only its owner's sessions may use it; use a "
                     "pool of your own, or ask its owner for a group or public one",
                     info.name, (unsigned)info.owner.uid);
    return false;
}

bool gd_pool_owner_check(gd_call_t *call, const gd_session_t *s, const pm_pool_t *p,
                         const char *what)
{
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    if (gd_is_admin(s) || (s != NULL && s->attached && s->uid == info.owner.uid))
        return true;
    gd_call_fail(call, GD_PERMISSION_DENIED,
                 "pool '%s' belongs to uid %u: only its owner or an admin (uid 0 or the daemon's "
                 "uid %u) may %s it",
                 info.name, (unsigned)info.owner.uid, (unsigned)geteuid(), what);
    return false;
}

int gd_pool_mode_from_wire(int wire)
{
    switch (wire) {
    case GRAPHD__V1__POOL_MODE__POOL_MODE_UNSPECIFIED:
    case GRAPHD__V1__POOL_MODE__POOL_MODE_PRIVATE:
        return PM_MODE_PRIVATE;
    case GRAPHD__V1__POOL_MODE__POOL_MODE_GROUP:
        return PM_MODE_GROUP;
    case GRAPHD__V1__POOL_MODE__POOL_MODE_PUBLIC:
        return PM_MODE_PUBLIC;
    default:
        return -1;
    }
}

const char *gd_pool_mode_name(int mode)
{
    return mode_name(mode);
}

uint32_t gd_uid_sessions(const gd_daemon_t *d, uid_t uid)
{
    uint32_t n = 0;
    for (const gd_session_t *s = d->sessions; s; s = s->next)
        n += s->attached && s->uid == uid;
    return n;
}

/* Every pool, in creation order (free it); *count gets how many. NULL when out of memory. */
static pm_pool_t **all_pools(const gd_daemon_t *d, size_t *count)
{
    *count = 0;
    pm_pool_list(d->pools, count, NULL);
    pm_pool_t **pools = calloc(*count + 1, sizeof *pools);
    if (pools == NULL) {
        gd_error("out of memory listing %zu pools", *count);
        *count = 0;
        return NULL;
    }
    pm_pool_list(d->pools, count, pools);
    return pools;
}

uint32_t gd_uid_pools(const gd_daemon_t *d, uid_t uid)
{
    size_t count = 0;
    pm_pool_t **pools = all_pools(d, &count);
    uint32_t n = 0;
    for (size_t i = 0; i < count; i++) {
        pm_pool_info_t info;
        pm_pool_info(pools[i], &info);
        bool is_default = d->cfg.default_pool[0] && strcmp(info.name, d->cfg.default_pool) == 0;
        n += !is_default && info.owner.uid == (uint32_t)uid;
    }
    free(pools);
    return n;
}

int gd_pool_delete(gd_daemon_t *d, const char *name)
{
    int rc = pm_pool_delete(d->pools, name);
    if (rc != PM_OK)
        return rc;
    gd_graphs_pool_deleted(d, name);
    gd_info("pool %s deleted", name);
    return PM_OK;
}

/* Pools that go with their session: those whose session has ended and that hold nothing now (a
 * pool still holding regions of another session of its uid goes when that one ends). Called
 * after each session's end, and so also deletes what an earlier end had to leave. */
void gd_pools_session_ended(gd_daemon_t *d)
{
    size_t count = 0;
    pm_pool_t **pools = all_pools(d, &count);
    for (size_t i = 0; i < count; i++) {
        pm_pool_info_t info;
        pm_pool_info(pools[i], &info);
        if (info.owner.session == 0 || gd_session_find(d, info.owner.session) != NULL)
            continue;
        char name[PM_NAME_MAX + 1];
        strcpy(name, info.name); /* the pool owns info.name */
        int rc = gd_pool_delete(d, name);
        if (rc == PM_EBUSY)
            gd_debug("pool %s outlives its session %llu: %u regions of other sessions are in it",
                     name, (unsigned long long)info.owner.session, info.regions);
        else if (rc != PM_OK)
            gd_warn("pool %s: cannot delete it with its session: %s", name, pm_strerror(rc));
    }
    free(pools);
}
