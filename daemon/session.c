/*
 * Sessions and the data-plane socket (docs/PROTOCOL.md). One listening Unix
 * stream socket serves every session: a connection attaches to a session with
 * its id and token, the peer's credentials come from SO_PEERCRED, region
 * memfds go out with SCM_RIGHTS, and EOF ends the session and reclaims what it
 * owns. Replies go out through the connection's wire (wire.c), which never
 * waits for the client: a client that leaves more than reply_buffer_max_bytes
 * of replies unread is disconnected and its session ended.
 */
#include "daemon.h"
#include "graphd_frame.h"
#include "log.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define CONN_BUF (GRAPHD_FRAME_SIZE * 64)

struct gd_conn {
    uv_pipe_t pipe;
    gd_daemon_t *d;
    gd_session_t *session;
    gd_wire_t *wire;
    uint8_t buf[CONN_BUF];
    size_t len;
    bool closing;
    uint64_t opened_mono_ms; /* accepted at; an unattached one is closed after attach_timeout_ms */
    gd_conn_t *next, *prev;
};

static void conn_close(gd_conn_t *c);
static void conn_close_why(gd_conn_t *c, const char *why);
static void on_wire_failed(void *ctx);

/* ---- sending ---------------------------------------------------------- */

static int conn_fd(gd_conn_t *c)
{
    uv_os_fd_t fd = -1;
    uv_fileno((uv_handle_t *)&c->pipe, &fd);
    return fd;
}

static int conn_send(gd_conn_t *c, const graphd_frame_t *f, const char *msg, int fd)
{
    return gd_wire_send(c->wire, f, msg, fd);
}

static int reply(gd_conn_t *c, const graphd_frame_t *req, int status, uint64_t arg, const char *msg,
                 int fd)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = (uint16_t)(req->type | GRAPHD_FRAME_REPLY),
                        .seq = req->seq,
                        .id = req->id,
                        .arg = arg,
                        .status = status};
    return conn_send(c, &f, status == GD_OK ? NULL : msg, fd);
}

/* Sends an ERROR frame and closes the connection (ending its session). */
static void protocol_error(gd_conn_t *c, uint64_t seq, const char *msg)
{
    gd_warn("session socket%s: protocol error: %s; closing", c->session ? "" : " (unattached)",
            msg);
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_ERROR,
                        .seq = seq,
                        .status = GD_INVALID_ARGUMENT};
    conn_send(c, &f, msg, -1);
    conn_close(c);
}

/* ---- requests --------------------------------------------------------- */

static void on_attach(gd_conn_t *c, const graphd_frame_t *f)
{
    gd_daemon_t *d = c->d;
    if (c->session) {
        protocol_error(c, f->seq, "ATTACH on a connection that is already attached");
        return;
    }
    gd_session_t *s = gd_session_find(d, f->id);
    if (s == NULL || s->token != f->arg) {
        reply(c, f, GD_NOT_FOUND, 0, "no such session", -1);
        conn_close(c);
        return;
    }
    if (s->attached) {
        reply(c, f, GD_FAILED_PRECONDITION, 0, "session is already attached", -1);
        conn_close(c);
        return;
    }
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(conn_fd(c), SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
        gd_error("session %llu: SO_PEERCRED: %s", (unsigned long long)s->id, strerror(errno));
        reply(c, f, GD_INTERNAL, 0, "cannot read peer credentials", -1);
        conn_close(c);
        return;
    }
    uint32_t held = gd_uid_sessions(d, cred.uid);
    if (held >= d->cfg.max_sessions_per_uid) {
        char msg[192];
        snprintf(msg, sizeof msg,
                 "uid %u already has %u sessions attached (max_sessions_per_uid = %llu): end "
                 "one first",
                 (unsigned)cred.uid, held, (unsigned long long)d->cfg.max_sessions_per_uid);
        gd_warn("session %llu (%s, pid %d): %s", (unsigned long long)s->id, s->name, (int)cred.pid,
                msg);
        reply(c, f, GD_RESOURCE_EXHAUSTED, 0, msg, -1);
        conn_close(c);
        gd_session_end(d, s, "refused at attach: max_sessions_per_uid");
        return;
    }
    s->uid = cred.uid;
    s->gid = cred.gid;
    s->pid = cred.pid;
    s->attached = true;
    s->conn = c;
    c->session = s;
    gd_info("session %llu (%s) attached: uid %u pid %d", (unsigned long long)s->id, s->name,
            (unsigned)s->uid, (int)s->pid);
    if (reply(c, f, GD_OK, 0, NULL, -1) != 0)
        on_wire_failed(c);
}

static void on_map(gd_conn_t *c, const graphd_frame_t *f)
{
    pm_region_t *r = pm_region_find(c->d->pools, f->id);
    int rc;
    if (r == NULL)
        rc = reply(c, f, GD_NOT_FOUND, 0, "no such region", -1);
    else if (pm_region_owner(r) != c->session->id)
        rc = reply(c, f, GD_PERMISSION_DENIED, 0, "region belongs to another session", -1);
    else if (pm_region_is_device(r)) {
        /* Device memory: its IPC handle as the payload, its size in arg; a descriptor where the
         * family's export has one (xpu: the allocation's dma-buf/memfd fd, SCM_RIGHTS). */
        graphd_frame_t out = {.magic = GRAPHD_FRAME_MAGIC,
                              .version = GRAPHD_FRAME_VERSION,
                              .type = (uint16_t)(f->type | GRAPHD_FRAME_REPLY),
                              .seq = f->seq,
                              .id = f->id,
                              .arg = pm_region_size(r),
                              .status = GD_OK};
        uint8_t msg[GRAPHD_MAP_DEVICE_PAYLOAD];
        size_t len = PM_IPC_HANDLE_SIZE;
        memcpy(msg, pm_region_ipc_handle(r), PM_IPC_HANDLE_SIZE);
        if (f->arg & GRAPHD_MAP_NAME_DEVICE) /* the device's code after the handle */
            len = gd_map_device_payload(r, msg);
        rc = gd_wire_send_bytes(c->wire, &out, msg, len, pm_region_fd(r));
    } else
        rc = reply(c, f, GD_OK, pm_region_mapped_size(r), NULL, pm_region_fd(r));
    if (rc != 0)
        on_wire_failed(c);
}

/* The message bytes a request frame may carry: the client's event handle in EVENTS (none on a
 * family whose events the daemon makes, xpu), nothing in any other. */
static uint32_t request_msg_len(const graphd_frame_t *f)
{
    const gd_family_t *fam =
        f->id > 0xff ? NULL : gd_family_of_wire(GRAPHD_DEVICE_CODE_FAMILY(f->id));
    if (f->type != GRAPHD_FRAME_EVENTS || (fam != NULL && fam->ze_events))
        return 0;
    return GRAPHD_IPC_HANDLE_SIZE;
}

/* Handles one frame (payload: its msg_len bytes); returns false once the connection is closing. */
static bool on_frame(gd_conn_t *c, const graphd_frame_t *fp, const uint8_t *payload)
{
    graphd_frame_t f = *fp;
    char msg[128];
    if (f.magic != GRAPHD_FRAME_MAGIC) {
        snprintf(msg, sizeof msg, "bad frame magic 0x%08x", f.magic);
        protocol_error(c, f.seq, msg);
        return false;
    }
    if (f.version != GRAPHD_FRAME_VERSION) {
        snprintf(msg, sizeof msg, "unsupported frame version %u", f.version);
        protocol_error(c, f.seq, msg);
        return false;
    }
    if (f.msg_len != request_msg_len(&f)) {
        snprintf(msg, sizeof msg, "a type 0x%04x request carries %u message bytes, not %u", f.type,
                 request_msg_len(&f), f.msg_len);
        protocol_error(c, f.seq, msg);
        return false;
    }
    if (f.type != GRAPHD_FRAME_ATTACH && c->session == NULL) {
        protocol_error(c, f.seq, "the first frame must be ATTACH");
        return false;
    }
    switch (f.type) {
    case GRAPHD_FRAME_ATTACH:
        on_attach(c, &f);
        break;
    case GRAPHD_FRAME_MAP:
        on_map(c, &f);
        break;
    case GRAPHD_FRAME_REPLAY:
        gd_replay_frame(c->d, c->session, c->wire, &f);
        break;
    case GRAPHD_FRAME_EVENTS:
    case GRAPHD_FRAME_SEQ:
        gd_order_frame(c->d, c->session, c->wire, &f, payload);
        break;
    case GRAPHD_FRAME_DIRECT:
        gd_direct_frame(c->d, c->session, c->wire, &f);
        break;
    default:
        snprintf(msg, sizeof msg, "unknown frame type 0x%04x", f.type);
        protocol_error(c, f.seq, msg);
        return false;
    }
    return !c->closing;
}

/* ---- connections ------------------------------------------------------ */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    (void)suggested;
    gd_conn_t *c = h->data;
    buf->base = (char *)c->buf + c->len;
    buf->len = CONN_BUF - c->len;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    (void)buf;
    gd_conn_t *c = stream->data;
    if (nread < 0) {
        if (c->len != 0 && nread == UV_EOF) {
            /* The peer may have shut down only its write side: tell it why it is dropped. */
            char msg[96];
            snprintf(msg, sizeof msg, "truncated frame: %zu of %d bytes, then EOF", c->len,
                     GRAPHD_FRAME_SIZE);
            protocol_error(c, 0, msg);
            return;
        } else if (nread != UV_EOF) {
            gd_debug("session socket: read: %s", uv_strerror((int)nread));
        }
        conn_close(c);
        return;
    }
    c->len += (size_t)nread;
    size_t off = 0;
    while (c->len - off >= GRAPHD_FRAME_SIZE) {
        graphd_frame_t f;
        graphd_frame_decode(c->buf + off, &f);
        /* A frame whose msg_len is wrong for its type is refused by on_frame before its message
         * is awaited, so a bad length cannot stall the connection. */
        size_t need = GRAPHD_FRAME_SIZE;
        if (f.magic == GRAPHD_FRAME_MAGIC && f.msg_len == request_msg_len(&f))
            need += f.msg_len;
        if (c->len - off < need)
            break;
        if (!on_frame(c, &f, c->buf + off + GRAPHD_FRAME_SIZE))
            return;
        off += need;
    }
    memmove(c->buf, c->buf + off, c->len - off);
    c->len -= off;
}

static void on_conn_closed(uv_handle_t *h)
{
    gd_conn_t *c = h->data;
    gd_wire_unref(c->wire);
    free(c);
}

static void conn_close(gd_conn_t *c)
{
    conn_close_why(c, "session socket closed");
}

/* The wire failed (on the loop): a client that does not read its replies, or a broken socket. */
static void on_wire_failed(void *ctx)
{
    gd_conn_t *c = ctx;
    if (c->closing)
        return;
    if (gd_wire_state(c->wire) != GD_WIRE_OVERFLOW) {
        conn_close_why(c, "session socket failed");
        return;
    }
    gd_daemon_t *d = c->d;
    char why[160];
    snprintf(why, sizeof why,
             "its client left more than reply_buffer_max_bytes (%llu) of "
             "replies unread",
             (unsigned long long)d->cfg.reply_buffer_max_bytes);
    d->clients_disconnected++;
    if (c->session)
        gd_warn("session %llu (%s, uid %u, pid %d): disconnected: %s",
                (unsigned long long)c->session->id, c->session->name, (unsigned)c->session->uid,
                (int)c->session->pid, why);
    else
        gd_warn("session socket (unattached): disconnected: %s", why);
    conn_close_why(c, why);
}

static void conn_close_why(gd_conn_t *c, const char *why)
{
    if (c->closing)
        return;
    c->closing = true;
    gd_daemon_t *d = c->d;
    if (c->prev)
        c->prev->next = c->next;
    else
        d->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    uv_read_stop((uv_stream_t *)&c->pipe);
    if (c->wire)
        gd_wire_close(c->wire);
    uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
    gd_session_t *s = c->session;
    c->session = NULL;
    if (s) {
        s->conn = NULL;
        gd_session_end(d, s, why);
    }
}

static void on_connection(uv_stream_t *server, int status)
{
    gd_daemon_t *d = server->data;
    if (status < 0) {
        gd_warn("session socket: accept: %s", uv_strerror(status));
        return;
    }
    gd_conn_t *c = calloc(1, sizeof *c);
    if (c == NULL) {
        gd_error("session socket: out of memory");
        return;
    }
    c->d = d;
    c->opened_mono_ms = gd_now_mono_ms();
    uv_pipe_init(d->loop, &c->pipe, 0);
    c->pipe.data = c;
    if (uv_accept(server, (uv_stream_t *)&c->pipe) != 0) {
        uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
        return;
    }
    c->wire = gd_wire_create(d->loop, conn_fd(c), d->cfg.reply_buffer_max_bytes, on_wire_failed, c);
    if (c->wire == NULL) {
        uv_close((uv_handle_t *)&c->pipe, on_conn_closed);
        return;
    }
    c->next = d->conns;
    if (d->conns)
        d->conns->prev = c;
    d->conns = c;
    uv_read_start((uv_stream_t *)&c->pipe, on_alloc, on_read);
}

/* Removes a socket file left by a daemon that is gone; refuses one that still answers. */
static int clear_stale_socket(const char *path)
{
    struct stat st;
    if (lstat(path, &st) != 0)
        return 0;
    if (!S_ISSOCK(st.st_mode)) {
        gd_error("%s exists and is not a socket", path);
        return -1;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", path);
    int rc = connect(fd, (struct sockaddr *)&sa, sizeof sa);
    close(fd);
    if (rc == 0) {
        gd_error("%s is in use by another process (another graphd?)", path);
        return -1;
    }
    if (unlink(path) != 0) {
        gd_error("cannot remove stale socket %s: %s", path, strerror(errno));
        return -1;
    }
    return 0;
}

void gd_socket_permissions(const gd_daemon_t *d, const char *path)
{
    if (chmod(path, (mode_t)d->cfg.socket_mode) != 0)
        gd_warn("chmod %s: %s", path, strerror(errno));
    if (d->cfg.socket_group[0]) {
        struct group *g = getgrnam(d->cfg.socket_group);
        static bool warned; /* once: both sockets get here, from the loop thread */
        if (g == NULL && !warned) {
            warned = true;
            struct group *own = getgrgid(getegid());
            gd_warn("socket_group '%s' does not exist: the sockets keep group %s (mode %04o), so "
                    "users outside it cannot connect; create the group (groupadd --system %s, or "
                    "systemd-sysusers) and add users to it, or set socket_group",
                    d->cfg.socket_group, own ? own->gr_name : "?", (unsigned)d->cfg.socket_mode,
                    d->cfg.socket_group);
        } else if (g != NULL && chown(path, (uid_t)-1, g->gr_gid) != 0) {
            gd_warn("chgrp %s %s: %s", d->cfg.socket_group, path, strerror(errno));
        }
    }
}

int gd_socket_prepare(const char *path)
{
    char dir[4096];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash && slash != dir) {
        *slash = 0;
        if (mkdir(dir, 0755) != 0 && errno != EEXIST) {
            gd_error("cannot create %s: %s", dir, strerror(errno));
            return -1;
        }
    }
    return clear_stale_socket(path);
}

int gd_sessions_listen(gd_daemon_t *d)
{
    const char *path = d->cfg.session_socket;
    if (gd_socket_prepare(path) != 0)
        return -1;
    uv_pipe_init(d->loop, &d->session_listener, 0);
    d->session_listener.data = d;
    d->session_listener_open = true;
    int rc = uv_pipe_bind(&d->session_listener, path);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&d->session_listener, 128, on_connection);
    if (rc != 0) {
        gd_error("cannot listen on session socket %s: %s", path, uv_strerror(rc));
        return -1;
    }
    gd_socket_permissions(d, path);
    gd_info("session socket on %s", path);
    return 0;
}

void gd_sessions_close_listener(gd_daemon_t *d)
{
    if (!d->session_listener_open)
        return;
    d->session_listener_open = false;
    uv_close((uv_handle_t *)&d->session_listener, NULL);
    unlink(d->cfg.session_socket);
}

/* ---- bookkeeping ------------------------------------------------------ */

gd_session_t *gd_session_create(gd_daemon_t *d, const char *name, pid_t pid)
{
    gd_session_t *s = calloc(1, sizeof *s);
    if (s == NULL)
        return NULL;
    if (getrandom(&s->token, sizeof s->token, 0) != (ssize_t)sizeof s->token) {
        gd_error("getrandom: %s", strerror(errno));
        free(s);
        return NULL;
    }
    s->id = ++d->next_session_id;
    snprintf(s->name, sizeof s->name, "%s", name);
    s->hello_pid = pid;
    s->pid = pid;
    s->uid = (uid_t)-1;
    s->created_unix_ms = gd_now_unix_ms();
    s->created_mono_ms = gd_now_mono_ms();
    s->next = d->sessions;
    d->sessions = s;
    d->nsessions++;
    gd_info("session %llu (%s, pid %d) opened", (unsigned long long)s->id, s->name, (int)pid);
    return s;
}

gd_session_t *gd_session_find(gd_daemon_t *d, uint64_t id)
{
    for (gd_session_t *s = d->sessions; s; s = s->next)
        if (s->id == id)
            return s;
    return NULL;
}

void gd_session_end(gd_daemon_t *d, gd_session_t *s, const char *why)
{
    gd_session_t **pp = &d->sessions;
    while (*pp && *pp != s)
        pp = &(*pp)->next;
    if (*pp == NULL)
        return;
    *pp = s->next;
    d->nsessions--;
    gd_order_session_ended(s); /* first: a graph's stream may wait on this client's counter */
    gd_xpu_events_session_ended(d, s); /* no one waits on its xpu events for ever */
    gd_direct_session_ended(s); /* its executors drop the replays it still has queued there */
    /* Its queued replays go unrun (an RPC replay's call fails); its destroys stay queued. */
    uint64_t dropped = gd_workers_session_ended(&d->workers, s->uid, s->id);
    if (dropped > 0) {
        d->replays_dropped += dropped;
        gd_info("session %llu (%s): dropped %llu queued replays", (unsigned long long)s->id,
                s->name, (unsigned long long)dropped);
    }
    gd_graphs_session_ended(d, s);
    pm_usage_t freed = {0, 0};
    pm_reclaim_owner(d->pools, s->id, &freed);
    gd_pools_session_ended(d); /* after its regions: its pools are empty now */
    gd_info("session %llu (%s) ended: %s; reclaimed %u regions, %llu bytes",
            (unsigned long long)s->id, s->name, why, freed.regions,
            (unsigned long long)freed.bytes);
    if (s->conn) {
        gd_conn_t *c = s->conn;
        c->session = NULL;
        s->conn = NULL;
        conn_close(c);
    }
    free(s);
}

void gd_sessions_end_all(gd_daemon_t *d)
{
    while (d->sessions)
        gd_session_end(d, d->sessions, "daemon stopping");
    while (d->conns)
        conn_close(d->conns);
}

void gd_sessions_expire(gd_daemon_t *d)
{
    uint64_t now = gd_now_mono_ms();
    gd_session_t *s = d->sessions;
    while (s) {
        gd_session_t *next = s->next;
        if (!s->attached && now - s->created_mono_ms > d->cfg.attach_timeout_ms)
            gd_session_end(d, s, "did not attach its session socket in time");
        s = next;
    }
    /* Connections that never sent ATTACH: each holds descriptors (thousands of idle ones would
     * use up the daemon's limit and lock every new client out). */
    gd_conn_t *c = d->conns;
    while (c) {
        gd_conn_t *next = c->next;
        if (c->session == NULL && now - c->opened_mono_ms > d->cfg.attach_timeout_ms) {
            gd_info("session socket (unattached): closed: no ATTACH within attach_timeout_ms "
                    "(%llu)",
                    (unsigned long long)d->cfg.attach_timeout_ms);
            conn_close_why(c, "no ATTACH within attach_timeout_ms");
        }
        c = next;
    }
}
