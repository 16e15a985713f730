/*
 * libgraphd client: the gRPC channel, the session (Hello, ATTACH on the
 * session socket, Goodbye), devices, pools and status. Modules, captures
 * and replays are in graph.c.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <grpc/grpc.h>
#include <grpc/grpc_security.h>

#include "graphd.pb-c.h"
#include "graphd_int.h"

#ifndef GRAPHD_VERSION
#define GRAPHD_VERSION "0.0.0"
#endif

void graphd__strlcpy(char *dst, const char *src, size_t size)
{
    if (size == 0)
        return;
    size_t n = src != NULL ? strlen(src) : 0;
    if (n >= size)
        n = size - 1;
    if (n > 0)
        memcpy(dst, src, n);
    dst[n] = '\0';
}

int graphd__fail(graphd_client_t *c, int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    return err;
}

int graphd__fail_sys(graphd_client_t *c, const char *fmt, ...)
{
    int saved = errno;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(c->last_error, sizeof(c->last_error), fmt, ap);
    va_end(ap);
    if (n >= 0 && (size_t)n < sizeof(c->last_error))
        snprintf(c->last_error + n, sizeof(c->last_error) - (size_t)n, ": %s", strerror(saved));
    return GRAPHD_ESYS;
}

void graphd__session_end(graphd_client_t *c)
{
    graphd__dp_close(c);
    graphd__kinds_session_end(c);
    c->session_id = 0;
    c->session_token = 0;
    c->session_socket[0] = '\0';
}

static void clear_error(graphd_client_t *c)
{
    c->last_error[0] = '\0';
}

/* The message of the last failed call without a client on this thread (graphd_last_error(NULL)),
 * as graph_runtime keeps gr_last_error per thread. */
static _Thread_local char thread_error[GRAPHD__ERRMSG_MAX];

int graphd__fail_thread(int err, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(thread_error, sizeof(thread_error), fmt, ap);
    va_end(ap);
    return err;
}

void graphd__clear_thread_error(void)
{
    thread_error[0] = '\0';
}

const char *graphd_version(void)
{
    return GRAPHD_VERSION;
}

void graphd__client_ref(graphd_client_t *c)
{
    c->refs++;
}

void graphd__client_unref(graphd_client_t *c)
{
    if (--c->refs > 0)
        return;
    free(c->address);
    free(c);
}

/* Reads the settings graphd_connect uses into c (address: the caller's, else GRAPHD_ADDRESS). */
static int read_settings(graphd_client_t *c, const char *address)
{
    char err[GRAPHD__ERRMSG_MAX], value[GRAPHD__SETTING_MAX];
    unsigned long timeout_ms, spin_us, direct, ring, profile;
    int rc = graphd__setting_uint("GRAPHD_TIMEOUT_MS", &timeout_ms, err, sizeof(err));
    if (rc == GRAPHD_OK)
        rc = graphd__setting_uint("GRAPHD_SPIN_US", &spin_us, err, sizeof(err));
    if (rc == GRAPHD_OK)
        rc = graphd__setting_uint("GRAPHD_DIRECT", &direct, err, sizeof(err));
    if (rc == GRAPHD_OK)
        rc = graphd__setting_uint("GRAPHD_REPLAY_RING", &ring, err, sizeof(err));
    if (rc == GRAPHD_OK)
        rc = graphd__setting("GRAPHD_REPLAY_ORDER", value, sizeof(value), err, sizeof(err));
    if (rc == GRAPHD_OK) /* checked here, read with the CUDA runtime (cuda.c) */
        rc = graphd__setting_uint("GRAPHD_REPLAY_PROFILE", &profile, err, sizeof(err));
    if (rc != GRAPHD_OK)
        return graphd__fail_thread(rc, "%s", err);
    c->timeout_ms = (int)timeout_ms;
    c->spin_us = (int)spin_us;
    c->direct_on = direct != 0;
    c->ring_on = ring != 0;
    c->posted = strcmp(value, "events") != 0; /* "sync" is the Python package's own */
    rc = graphd__address(address, value, sizeof(value), err, sizeof(err));
    if (rc != GRAPHD_OK)
        return graphd__fail_thread(rc, "%s", err);
    c->address = strdup(value);
    if (c->address == NULL)
        return graphd__fail_thread(GRAPHD_ENOMEM, "out of memory");
    return GRAPHD_OK;
}

static int is_local_target(const char *target)
{
    return strncmp(target, "unix:", 5) == 0 || strncmp(target, "unix-abstract:", 14) == 0;
}

/* The whole of a small text file, NUL-terminated; NULL when it cannot be read. */
static char *read_text_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    for (;;) {
        char *nb = realloc(buf, len + 4097);
        if (nb == NULL) {
            free(buf);
            fclose(f);
            return NULL;
        }
        buf = nb;
        size_t n = fread(buf + len, 1, 4096, f);
        len += n;
        if (n < 4096)
            break;
    }
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return NULL;
    }
    buf[len] = '\0';
    return buf;
}

int graphd_connect(const char *address, graphd_client_t **out)
{
    graphd__clear_thread_error();
    if (out == NULL)
        return graphd__fail_thread(GRAPHD_EINVALID_ARGUMENT, "out is NULL");
    *out = NULL;
    graphd_client_t *c = calloc(1, sizeof(*c));
    if (c == NULL)
        return graphd__fail_thread(GRAPHD_ENOMEM, "out of memory");
    c->refs = 1;
    c->session_fd = -1;
    int rc = read_settings(c, address);
    if (rc != GRAPHD_OK) {
        graphd__client_unref(c);
        return rc;
    }

    grpc_init();
    c->grpc_inited = 1;
    grpc_arg args[] = {
        {.type = GRPC_ARG_STRING,
         .key = GRPC_ARG_PRIMARY_USER_AGENT_STRING,
         .value.string = "libgraphd/" GRAPHD_VERSION},
        /* A client's reconnect backoff is its own, not shared with other clients in-process. */
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, .value.integer = 1},
        /* The daemon is local: retry a restarted one soon rather than after minutes. Not
         * GRPC_ARG_MIN_RECONNECT_BACKOFF_MS: gRPC takes it as the least time a connection
         * attempt has to get the server's SETTINGS, and a daemon that systemd starts for this
         * very connection (graphd.socket) needs longer than a backoff step to answer. */
        {.type = GRPC_ARG_INTEGER,
         .key = GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS,
         .value.integer = 100},
        {.type = GRPC_ARG_INTEGER, .key = GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, .value.integer = 2000},
    };
    grpc_channel_args chargs = {.num_args = sizeof(args) / sizeof(args[0]), .args = args};
    grpc_channel_credentials *creds = NULL;
    if (is_local_target(c->address)) {
        creds = grpc_insecure_credentials_create();
    } else {
        /* TCP is always TLS. $GRAPHD_TLS_CA names a PEM file of roots (a private CA or a
         * self-signed daemon certificate); without it, gRPC's default roots apply. */
        char *roots = NULL, ca[GRAPHD__SETTING_MAX], err[GRAPHD__ERRMSG_MAX];
        rc = graphd__setting("GRAPHD_TLS_CA", ca, sizeof(ca), err, sizeof(err));
        if (rc != GRAPHD_OK) {
            graphd__fail_thread(rc, "%s", err);
            graphd_close(c);
            return rc;
        }
        if (ca[0] != '\0' && (roots = read_text_file(ca)) == NULL) {
            graphd__fail_thread(GRAPHD_ESYS, "GRAPHD_TLS_CA=%s: cannot read the file: %s", ca,
                                strerror(errno));
            graphd_close(c);
            return GRAPHD_ESYS;
        }
        creds = grpc_ssl_credentials_create(roots, NULL, NULL, NULL);
        free(roots);
    }
    if (creds != NULL) {
        c->channel = grpc_channel_create(c->address, creds, &chargs);
        grpc_channel_credentials_release(creds);
    }
    c->cq = grpc_completion_queue_create_for_pluck(NULL);
    if (c->channel == NULL || c->cq == NULL) {
        graphd__fail_thread(GRAPHD_EINTERNAL, "cannot make a gRPC channel for %s", c->address);
        graphd_close(c);
        return GRAPHD_EINTERNAL;
    }
    *out = c;
    return GRAPHD_OK;
}

void graphd_close(graphd_client_t *c)
{
    if (c == NULL || c->closed)
        return;
    if (c->session_id != 0 && c->channel != NULL)
        (void)graphd_goodbye(c);
    graphd__session_end(c);
    if (c->channel != NULL)
        grpc_channel_destroy(c->channel);
    if (c->cq != NULL) {
        /* Every call has completed and been plucked, so the queue is empty. */
        grpc_completion_queue_shutdown(c->cq);
        grpc_completion_queue_destroy(c->cq);
    }
    if (c->grpc_inited)
        grpc_shutdown();
    c->channel = NULL;
    c->cq = NULL;
    c->grpc_inited = 0;
    c->closed = 1;
    /* Open region and graph handles keep the body, and their mappings, until they are released. */
    graphd__client_unref(c);
}

const char *graphd_last_error(const graphd_client_t *c)
{
    return c != NULL ? c->last_error : thread_error;
}

const char *graphd_address(const graphd_client_t *c)
{
    return c->address;
}

uint64_t graphd_session_id(const graphd_client_t *c)
{
    return c->session_id;
}

const char *graphd_session_socket(const graphd_client_t *c)
{
    return c->session_id != 0 ? c->session_socket : "";
}

const char *graphd_daemon_version(const graphd_client_t *c)
{
    return c->daemon_version;
}

static int attach(graphd_client_t *c)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(c->session_socket) >= sizeof(sa.sun_path))
        return graphd__fail(c, GRAPHD_EPROTO, "session socket path too long: %s",
                            c->session_socket);
    memcpy(sa.sun_path, c->session_socket, strlen(c->session_socket) + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return graphd__fail_sys(c, "socket");
    int rc = graphd__dp_set_timeouts(c, fd);
    if (rc != GRAPHD_OK) {
        close(fd);
        return rc;
    }
    while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        if (errno == EINTR)
            continue;
        rc = graphd__fail_sys(c, "connect to session socket %s", c->session_socket);
        close(fd);
        return rc;
    }
    c->session_fd = fd;
    c->seq = 0;
    return graphd__dp_request(c, GRAPHD_FRAME_ATTACH, c->session_id, c->session_token, NULL, NULL);
}

int graphd_hello(graphd_client_t *c, const char *client_name)
{
    clear_error(c);
    if (c->session_id != 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "a session is already open (id %llu)",
                            (unsigned long long)c->session_id);

    Graphd__V1__HelloRequest req = GRAPHD__V1__HELLO_REQUEST__INIT;
    req.client_name = (char *)(client_name != NULL ? client_name : "");
    req.pid = (int32_t)getpid();
    req.protocol_version = GRAPHD_PROTOCOL_VERSION;
    Graphd__V1__HelloReply *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("Hello"), &req.base,
                          &graphd__v1__hello_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    if (rep->session == NULL || rep->session->id == 0) {
        rc = graphd__fail(c, GRAPHD_EPROTO, "Hello reply without a session");
    } else if (rep->session_socket == NULL || rep->session_socket[0] == '\0') {
        rc = graphd__fail(c, GRAPHD_EPROTO, "Hello reply without a session socket");
    } else {
        c->session_id = rep->session->id;
        c->session_token = rep->session->token;
        graphd__strlcpy(c->session_socket, rep->session_socket, sizeof(c->session_socket));
        graphd__strlcpy(c->daemon_version, rep->daemon_version, sizeof(c->daemon_version));
    }
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    if (rc != GRAPHD_OK)
        return rc;

    rc = attach(c);
    if (rc != GRAPHD_OK) {
        /* Do not leave a half-open session behind; keep the attach error as the message. */
        char saved[GRAPHD__ERRMSG_MAX];
        memcpy(saved, c->last_error, sizeof(saved));
        (void)graphd_goodbye(c);
        memcpy(c->last_error, saved, sizeof(saved));
    }
    return rc;
}

static void session_ref(const graphd_client_t *c, Graphd__V1__SessionRef *ref)
{
    Graphd__V1__SessionRef init = GRAPHD__V1__SESSION_REF__INIT;
    *ref = init;
    ref->id = c->session_id;
    ref->token = c->session_token;
}

int graphd_goodbye(graphd_client_t *c)
{
    clear_error(c);
    if (c->session_id == 0)
        return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION, "no session is open");
    /* The daemon frees the session's device memory: close our IPC mappings of it first. */
    graphd__regions_close_device(c);
    Graphd__V1__SessionRef ref;
    session_ref(c, &ref);
    Graphd__V1__GoodbyeRequest req = GRAPHD__V1__GOODBYE_REQUEST__INIT;
    req.session = &ref;
    ProtobufCMessage *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("Goodbye"), &req.base,
                          &graphd__v1__goodbye_reply__descriptor, &rep);
    if (rc == GRAPHD_OK)
        protobuf_c_message_free_unpacked(rep, NULL);
    graphd__session_end(c);
    return rc;
}

/* Common end of the two-call list functions: n items exist, *count had room for how many. */
static int list_result(graphd_client_t *c, size_t n, size_t room, size_t *count, int have_items)
{
    *count = n;
    if (have_items && room < n)
        return graphd__fail(c, GRAPHD_ETRUNC, "%zu items, room for %zu", n, room);
    return GRAPHD_OK;
}

static void device_from_pb(graphd_device_t *d, const Graphd__V1__Device *p)
{
    memset(d, 0, sizeof(*d));
    graphd__strlcpy(d->id, p->id, sizeof(d->id));
    graphd__strlcpy(d->kind, p->kind, sizeof(d->kind));
    graphd__strlcpy(d->name, p->name, sizeof(d->name));
    graphd__strlcpy(d->compute_capability, p->compute_capability, sizeof(d->compute_capability));
    d->ordinal = p->ordinal;
    d->memory_total = p->memory_total;
    d->memory_free = p->memory_free;
    d->mps = p->mps ? 1 : 0;
    graphd__strlcpy(d->uuid, p->uuid, sizeof(d->uuid));
    d->compute_units = p->compute_units;
    d->max_clock_mhz = p->max_clock_mhz;
    graphd__strlcpy(d->driver, p->driver, sizeof(d->driver));
    const Graphd__V1__DeviceTelemetry *t = p->telemetry;
    if (t == NULL)
        return;
    d->have_telemetry = 1;
    d->telemetry_read_unix_ms = t->read_unix_ms;
    d->have_memory = t->have_memory ? 1 : 0;
    d->telemetry_memory_free = t->have_memory ? t->memory_free : 0;
    d->telemetry_memory_total = t->have_memory ? t->memory_total : 0;
    d->have_engine = t->have_engine ? 1 : 0;
    d->engine_active_us = t->have_engine ? t->engine_active_us : 0;
    d->have_utilisation = t->have_utilisation ? 1 : 0;
    d->utilisation = t->have_utilisation ? t->utilisation : 0;
    graphd__strlcpy(d->memory_health, t->memory_health, sizeof(d->memory_health));
    d->have_reset = t->have_reset ? 1 : 0;
    d->wedged = t->have_reset && t->wedged ? 1 : 0;
}

static void pool_from_pb(graphd_pool_t *d, const Graphd__V1__Pool *p)
{
    memset(d, 0, sizeof(*d));
    graphd__strlcpy(d->name, p->name, sizeof(d->name));
    graphd__strlcpy(d->device, p->device, sizeof(d->device));
    d->limit_bytes = p->limit_bytes;
    d->reserved_bytes = p->reserved_bytes;
    d->used_bytes = p->used_bytes;
    d->regions = p->regions;
    d->sessions = p->sessions;
    d->created_unix_ms = p->created_unix_ms;
    d->graph_mempool_reserved_bytes = p->graph_mempool_reserved_bytes;
    d->graph_mempool_in_use_bytes = p->graph_mempool_in_use_bytes;
    d->owner_uid = p->owner_uid;
    d->owner_gid = p->owner_gid;
    d->mode = (int)p->mode;
    d->delete_with_session = p->delete_with_session ? 1 : 0;
}

/* The open session for a request that names one optionally (NULL: none open). */
static Graphd__V1__SessionRef *optional_ref(const graphd_client_t *c, Graphd__V1__SessionRef *ref)
{
    if (c->session_id == 0)
        return NULL;
    session_ref(c, ref);
    return ref;
}

int graphd_list_devices(graphd_client_t *c, size_t *count, graphd_device_t *items)
{
    clear_error(c);
    if (count == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "count is NULL");
    Graphd__V1__ListDevicesRequest req = GRAPHD__V1__LIST_DEVICES_REQUEST__INIT;
    Graphd__V1__ListDevicesReply *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("ListDevices"), &req.base,
                          &graphd__v1__list_devices_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    size_t room = items != NULL ? *count : 0;
    for (size_t i = 0; i < rep->n_devices && i < room; i++)
        device_from_pb(&items[i], rep->devices[i]);
    rc = list_result(c, rep->n_devices, room, count, items != NULL);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return rc;
}

int graphd_list_pools(graphd_client_t *c, size_t *count, graphd_pool_t *items)
{
    clear_error(c);
    if (count == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "count is NULL");
    Graphd__V1__ListPoolsRequest req = GRAPHD__V1__LIST_POOLS_REQUEST__INIT;
    Graphd__V1__SessionRef ref;
    req.session = optional_ref(c, &ref);
    Graphd__V1__ListPoolsReply *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("ListPools"), &req.base,
                          &graphd__v1__list_pools_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    size_t room = items != NULL ? *count : 0;
    for (size_t i = 0; i < rep->n_pools && i < room; i++)
        pool_from_pb(&items[i], rep->pools[i]);
    rc = list_result(c, rep->n_pools, room, count, items != NULL);
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return rc;
}

int graphd_pool_create(graphd_client_t *c, const char *name, const char *device,
                       uint64_t limit_bytes, graphd_pool_t *info)
{
    return graphd_pool_create_ex(c, name, device, limit_bytes, GRAPHD_POOL_DEFAULT, 0, info);
}

int graphd_pool_create_ex(graphd_client_t *c, const char *name, const char *device,
                          uint64_t limit_bytes, int mode, unsigned flags, graphd_pool_t *info)
{
    clear_error(c);
    if (name == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "pool name is NULL");
    if (flags & ~GRAPHD_POOL_DELETE_WITH_SESSION)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "unknown pool flags 0x%x", flags);
    Graphd__V1__CreatePoolRequest req = GRAPHD__V1__CREATE_POOL_REQUEST__INIT;
    Graphd__V1__SessionRef ref;
    req.name = (char *)name;
    req.device = (char *)(device != NULL ? device : "");
    req.limit_bytes = limit_bytes;
    req.session = optional_ref(c, &ref); /* the daemon says why a session is needed */
    req.mode = (Graphd__V1__PoolMode)mode;
    req.delete_with_session = (flags & GRAPHD_POOL_DELETE_WITH_SESSION) != 0;
    Graphd__V1__CreatePoolReply *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("CreatePool"), &req.base,
                          &graphd__v1__create_pool_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc != GRAPHD_OK)
        return rc;
    if (info != NULL) {
        Graphd__V1__Pool empty = GRAPHD__V1__POOL__INIT;
        pool_from_pb(info, rep->pool != NULL ? rep->pool : &empty);
    }
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    return GRAPHD_OK;
}

int graphd_pool_delete(graphd_client_t *c, const char *name)
{
    clear_error(c);
    if (name == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "pool name is NULL");
    Graphd__V1__DeletePoolRequest req = GRAPHD__V1__DELETE_POOL_REQUEST__INIT;
    Graphd__V1__SessionRef ref;
    req.name = (char *)name;
    req.session = optional_ref(c, &ref);
    ProtobufCMessage *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("DeletePool"), &req.base,
                          &graphd__v1__delete_pool_reply__descriptor, &rep);
    if (rc == GRAPHD_OK)
        protobuf_c_message_free_unpacked(rep, NULL);
    return rc;
}

int graphd_status_json(graphd_client_t *c, char *buf, size_t *len)
{
    clear_error(c);
    if (len == NULL)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "len is NULL");
    Graphd__V1__StatusRequest req = GRAPHD__V1__STATUS_REQUEST__INIT;
    Graphd__V1__SessionRef ref;
    req.session = optional_ref(c, &ref);
    ProtobufCMessage *rep;
    int rc = graphd__call(c, GRAPHD__METHOD("Status"), &req.base,
                          &graphd__v1__status_reply__descriptor, &rep);
    if (rc != GRAPHD_OK)
        return rc;
    json_t *body = graphd__pb_to_json(rep);
    protobuf_c_message_free_unpacked(rep, NULL);
    json_t *root =
        body != NULL ? json_pack("{s:i}", "schema_version", GRAPHD_STATUS_SCHEMA_VERSION) : NULL;
    if (root != NULL && json_object_update(root, body) != 0) {
        json_decref(root);
        root = NULL;
    }
    json_decref(body);
    char *text = root != NULL ? json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(root);
    if (text == NULL)
        return graphd__fail(c, GRAPHD_ENOMEM, "cannot render the status as JSON");
    size_t need = strlen(text) + 1;
    if (buf != NULL && *len >= need) {
        memcpy(buf, text, need);
    } else if (buf != NULL) {
        rc = graphd__fail(c, GRAPHD_ETRUNC, "status needs %zu bytes, buffer has %zu", need, *len);
    }
    *len = need;
    free(text);
    return rc;
}
