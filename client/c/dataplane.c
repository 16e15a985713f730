/*
 * Data-plane I/O: fixed-size frames (graphd_frame.h) with an optional message (error text, or a
 * binary payload in an OK reply) and an optional file descriptor (SCM_RIGHTS), on the session
 * socket (ATTACH, MAP, EVENTS, SEQ, DIRECT: graphd__dp_exchange) or on a replay connection (REPLAY
 * frames, straight to the executor that holds the graph: graphd__dp_replay). A broken session
 * socket ends the session; a broken replay connection only closes that connection.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "graphd_int.h"

#define MAX_FDS_PER_MSG 4

static int64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

static int64_t now_ms(void)
{
    return now_us() / 1000;
}

int graphd__dp_set_timeouts(graphd_client_t *c, int fd)
{
    struct timeval tv = {.tv_sec = c->timeout_ms / 1000, .tv_usec = (c->timeout_ms % 1000) * 1000};
    if (setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) != 0 ||
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) != 0)
        return graphd__fail_sys(c, "setsockopt on the session socket");
    return GRAPHD_OK;
}

/* Which socket an exchange is on: fd, and its name in messages. */
typedef struct sock {
    int fd;
    const char *name;
} sock_t;

#define SESSION_SOCK(c) ((sock_t){(c)->session_fd, "the session socket"})

static int timed_out(graphd_client_t *c, sock_t s)
{
    return graphd__fail(c, GRAPHD_EDEADLINE_EXCEEDED, "no answer on %s within %d ms", s.name,
                        c->timeout_ms);
}

/* The peer closed the socket (EOF, reset, a send into a closed socket). */
static int closed(graphd_client_t *c, sock_t s)
{
    return graphd__fail(c, GRAPHD_EUNAVAILABLE, "graphd closed %s", s.name);
}

/*
 * The socket blocks, bounded by SO_SNDTIMEO/SO_RCVTIMEO (graphd__dp_set_timeouts), so that an
 * exchange costs one send and one receive rather than a try, a poll and a retry. Each call waits
 * at most the client's timeout; the deadline bounds a frame that comes in pieces.
 */
static int send_all(graphd_client_t *c, sock_t s, const uint8_t *buf, size_t len, int64_t deadline,
                    int send_fd)
{
    graphd_fd_control_t control;
    while (len > 0) {
        struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        if (send_fd >= 0) /* with the first bytes only */
            graphd_attach_fd(&msg, &control, send_fd);
        ssize_t n = sendmsg(s.fd, &msg, MSG_NOSIGNAL);
        if (n >= 0) {
            buf += n, len -= (size_t)n;
            send_fd = -1;
            if (len > 0 && now_ms() >= deadline)
                return timed_out(c, s);
            continue;
        }
        if (errno == EINTR)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return timed_out(c, s);
        if (errno == EPIPE || errno == ECONNRESET)
            return closed(c, s);
        return graphd__fail_sys(c, "send on %s", s.name);
    }
    return GRAPHD_OK;
}

/* Reads exactly len bytes; descriptors that arrive with them go to graphd_take_fds. */
static int recv_all(graphd_client_t *c, sock_t s, uint8_t *buf, size_t len, int64_t deadline,
                    int *fd_out)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * MAX_FDS_PER_MSG)];
        struct cmsghdr align;
    } control;

    while (len > 0) {
        struct iovec iov = {.iov_base = buf, .iov_len = len};
        struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
        msg.msg_control = control.buf;
        msg.msg_controllen = sizeof(control.buf);
        ssize_t n = recvmsg(s.fd, &msg, MSG_CMSG_CLOEXEC);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno == EAGAIN || errno == EWOULDBLOCK)
                return timed_out(c, s);
            if (errno == ECONNRESET)
                return closed(c, s);
            return graphd__fail_sys(c, "recvmsg on %s", s.name);
        }
        graphd_take_fds(&msg, fd_out);
        if (msg.msg_flags & MSG_CTRUNC)
            return graphd__fail(c, GRAPHD_EPROTO, "descriptors dropped on %s", s.name);
        if (n == 0)
            return closed(c, s);
        buf += n, len -= (size_t)n;
        if (len > 0 && now_ms() >= deadline)
            return timed_out(c, s);
    }
    return GRAPHD_OK;
}

/* Polls the socket for up to the client's spin time before the blocking read: a replay's reply
 * often comes within tens of microseconds, sooner than a sleeping thread wakes up. */
static void spin_until_readable(graphd_client_t *c, sock_t s)
{
    if (c->spin_us <= 0)
        return;
    int64_t until = now_us() + c->spin_us;
    struct pollfd p = {.fd = s.fd, .events = POLLIN};
    while (poll(&p, 1, 0) == 0 && now_us() < until)
        ;
}

/* Reads one frame and its message. On failure the socket is in an unknown state. */
static int recv_frame(graphd_client_t *c, sock_t s, graphd_frame_t *f, char *msg, int64_t deadline,
                      int *fd_out)
{
    uint8_t raw[GRAPHD_FRAME_SIZE];
    int rc = recv_all(c, s, raw, sizeof(raw), deadline, fd_out);
    if (rc != GRAPHD_OK)
        return rc;
    graphd_frame_decode(raw, f);
    if (f->magic != GRAPHD_FRAME_MAGIC || f->version != GRAPHD_FRAME_VERSION)
        return graphd__fail(c, GRAPHD_EPROTO, "bad frame from graphd (magic 0x%08x version %u)",
                            (unsigned)f->magic, (unsigned)f->version);
    if (f->msg_len > GRAPHD_FRAME_MAX_MSG)
        return graphd__fail(c, GRAPHD_EPROTO, "frame message of %u bytes from graphd (max %d)",
                            (unsigned)f->msg_len, GRAPHD_FRAME_MAX_MSG);
    rc = recv_all(c, s, (uint8_t *)msg, f->msg_len, deadline, fd_out);
    if (rc != GRAPHD_OK)
        return rc;
    msg[f->msg_len] = '\0';
    return GRAPHD_OK;
}

/* The error for an ERROR frame f (the daemon closes the session, or the executor the replay
 * connection, after it). */
static int closed_by_daemon(graphd_client_t *c, sock_t s, const graphd_frame_t *f, const char *msg)
{
    int err = f->status != 0 ? graphd_err_from_grpc(f->status) : GRAPHD_EPROTO;
    return graphd__fail(c, err, "graphd closed %s: %s",
                        s.fd == c->session_fd ? "the session" : s.name,
                        msg[0] != '\0' ? msg : graphd_strerror(err));
}

/* The answer to a posted replay, which comes only when it failed: keeps the first such failure
 * for the next replay call. 1 when f was one (consumed), 0 when not. */
static int take_posted_answer(graphd_client_t *c, const graphd_frame_t *f, const char *msg)
{
    if (f->type != (GRAPHD_FRAME_REPLY | GRAPHD_FRAME_REPLAY) || f->status == 0 || c->nseqs == 0)
        return 0;
    if (!c->posted_err) {
        c->posted_err = graphd_err_from_grpc(f->status);
        snprintf(c->posted_msg, sizeof(c->posted_msg),
                 "an earlier posted replay of graph %llu failed: %s", (unsigned long long)f->id,
                 msg[0] != '\0' ? msg : graphd_strerror(c->posted_err));
    }
    return 1;
}

static int no_socket(graphd_client_t *c)
{
    return graphd__fail(c, GRAPHD_EFAILED_PRECONDITION,
                        "no session socket: call graphd_hello first");
}

/* Sends a request frame, the client's next seq (into *seq), with send_len bytes of message and
 * send_fd (-1: none) as SCM_RIGHTS. */
static int send_request(graphd_client_t *c, sock_t s, uint16_t type, uint64_t id, uint64_t arg,
                        const void *send, size_t send_len, int64_t deadline, uint64_t *seq,
                        int send_fd)
{
    graphd_frame_t req = {
        .magic = GRAPHD_FRAME_MAGIC,
        .version = GRAPHD_FRAME_VERSION,
        .type = type,
        .seq = ++c->seq,
        .id = id,
        .arg = arg,
        .msg_len = (uint32_t)send_len,
    };
    uint8_t raw[GRAPHD_FRAME_SIZE + GRAPHD_FRAME_MAX_MSG];
    graphd_frame_encode(&req, raw);
    if (send_len > 0)
        memcpy(raw + GRAPHD_FRAME_SIZE, send, send_len);
    *seq = req.seq;
    return send_all(c, s, raw, GRAPHD_FRAME_SIZE + send_len, deadline, send_fd);
}

/* ---- replay connections ------------------------------------------------------------------ */

/* The replay connection named key, or NULL. */
static struct graphd__direct *direct_find(graphd_client_t *c, uint64_t key)
{
    for (size_t i = 0; i < c->ndirect; i++)
        if (c->direct[i].key == key)
            return &c->direct[i];
    return NULL;
}

/* The replay connection on fd, or NULL. */
static struct graphd__direct *direct_of(graphd_client_t *c, int fd)
{
    for (size_t i = 0; i < c->ndirect; i++)
        if (c->direct[i].fd == fd)
            return &c->direct[i];
    return NULL;
}

/* Closes a replay connection and unmaps its ring. */
static void direct_close(struct graphd__direct *d)
{
    close(d->fd);
    if (d->ring != NULL)
        munmap(d->ring, GRAPHD_RING_BYTES);
    d->ring = NULL;
}

/* Closes the replay connection on fd (it broke, or the executor ended it). */
static void direct_forget(graphd_client_t *c, int fd)
{
    for (size_t i = 0; i < c->ndirect; i++)
        if (c->direct[i].fd == fd) {
            direct_close(&c->direct[i]);
            c->direct[i] = c->direct[--c->ndirect];
            return;
        }
}

void graphd__dp_close(graphd_client_t *c)
{
    while (c->ndirect > 0)
        direct_close(&c->direct[--c->ndirect]);
    if (c->session_fd >= 0) {
        close(c->session_fd);
        c->session_fd = -1;
    }
}

/* A socket broke or went out of step: a replay connection is closed (the session goes on), the
 * session socket ends the session (the daemon ends a session whose socket closes). */
static void broken(graphd_client_t *c, sock_t s)
{
    if (s.fd == c->session_fd)
        graphd__session_end(c);
    else
        direct_forget(c, s.fd);
}

/* Asks for g's replay connection (DIRECT frame): *fd is the one to use. */
static int direct_ask(graphd_client_t *c, graphd_graph_t *g, int *fd)
{
    uint64_t key = 0;
    int nfd = -1;
    int rc = graphd__dp_request(c, GRAPHD_FRAME_DIRECT, g->id, 0, &key, &nfd);
    if (rc == GRAPHD_OK && nfd < 0 && direct_find(c, key) == NULL) /* one we no longer have */
        rc = graphd__dp_request(c, GRAPHD_FRAME_DIRECT, g->id, GRAPHD_DIRECT_RENEW, &key, &nfd);
    if (rc != GRAPHD_OK)
        return rc;
    if (nfd >= 0) {
        struct graphd__direct *d = direct_find(c, key);
        if (d == NULL && c->ndirect == GRAPHD__MAX_DIRECT) {
            close(nfd);
            return graphd__fail(c, GRAPHD_ERESOURCE_EXHAUSTED,
                                "the session already has %d replay connections",
                                GRAPHD__MAX_DIRECT);
        }
        rc = graphd__dp_set_timeouts(c, nfd);
        if (rc != GRAPHD_OK) {
            close(nfd);
            return rc;
        }
        if (d == NULL)
            d = &c->direct[c->ndirect++];
        else
            direct_close(d);
        *d = (struct graphd__direct){.key = key, .fd = nfd};
    } else if (direct_find(c, key) == NULL) {
        return graphd__fail(c, GRAPHD_EPROTO, "graphd named replay connection %llu, unknown here",
                            (unsigned long long)key);
    }
    g->direct_key = key;
    *fd = direct_find(c, key)->fd;
    return GRAPHD_OK;
}

/* The socket g's REPLAY frames go on: its replay connection (made on first use), or the session
 * socket with GRAPHD_DIRECT=0. */
static int replay_sock(graphd_client_t *c, graphd_graph_t *g, sock_t *s)
{
    if (c->session_fd < 0)
        return no_socket(c);
    *s = SESSION_SOCK(c);
    if (!c->direct_on)
        return GRAPHD_OK;
    s->name = "the replay connection";
    struct graphd__direct *d = g->direct_key ? direct_find(c, g->direct_key) : NULL;
    if (d != NULL) {
        s->fd = d->fd;
        return GRAPHD_OK;
    }
    return direct_ask(c, g, &s->fd);
}

/* The replay connection of g closed under a replay (EOF, reset): the executor was killed or died,
 * or the session ended. The daemon says which; rc is the error when it has nothing to say. */
static int direct_lost(graphd_client_t *c, graphd_graph_t *g, int rc)
{
    if (c->session_fd < 0)
        return rc;
    char saved[GRAPHD__ERRMSG_MAX];
    memcpy(saved, c->last_error, sizeof(saved));
    int fd;
    int why = direct_ask(c, g, &fd);
    if (why != GRAPHD_OK)
        return why; /* the daemon's account: the bound the replay passed, how the executor died */
    memcpy(c->last_error, saved, sizeof(saved));
    return graphd__fail(c, GRAPHD_EUNAVAILABLE,
                        "the replay connection of graph %llu closed during the replay; it may not "
                        "have run (%s)",
                        (unsigned long long)g->id, saved);
}

/* ---- exchanges ------------------------------------------------------------------------------ */

static int post_on(graphd_client_t *c, sock_t s, uint16_t type, uint64_t id, uint64_t arg)
{
    uint64_t seq;
    int rc = send_request(c, s, type, id, arg, NULL, 0, now_ms() + c->timeout_ms, &seq, -1);
    if (rc != GRAPHD_OK)
        broken(c, s);
    return rc;
}

int graphd__dp_post(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg)
{
    if (c->session_fd < 0)
        return no_socket(c);
    return post_on(c, SESSION_SOCK(c), type, id, arg);
}

/* The failure of a posted replay not reported yet, once. */
static int posted_failure(graphd_client_t *c)
{
    if (c->posted_err) {
        int err = c->posted_err;
        c->posted_err = 0;
        return graphd__fail(c, err, "%s", c->posted_msg);
    }
    return GRAPHD_OK;
}

/* Reads the answers to posted replays that have come on s. */
static int drain_sock(graphd_client_t *c, sock_t s)
{
    struct pollfd p = {.fd = s.fd, .events = POLLIN};
    while (poll(&p, 1, 0) > 0) {
        graphd_frame_t f;
        char msg[GRAPHD_FRAME_MAX_MSG + 1];
        int rc = recv_frame(c, s, &f, msg, now_ms() + c->timeout_ms, NULL);
        if (rc == GRAPHD_OK && f.type == GRAPHD_FRAME_ERROR)
            rc = closed_by_daemon(c, s, &f, msg);
        else if (rc == GRAPHD_OK && !take_posted_answer(c, &f, msg))
            rc = graphd__fail(c, GRAPHD_EPROTO,
                              "unexpected frame from graphd (type 0x%x seq %llu) between requests",
                              (unsigned)f.type, (unsigned long long)f.seq);
        if (rc != GRAPHD_OK) {
            broken(c, s);
            return rc;
        }
    }
    return GRAPHD_OK;
}

/* How often graphd__dp_drain reads the sockets even while every ring is quiet: a replay
 * connection that closed (its executor died) or an ERROR frame on the session socket is seen
 * at the first replay this long after the last read, or when a ring fills up. At 1 ms a
 * training step of 1.4 ms still read them at every other replay (H100 profile). */
#define DRAIN_EVERY_US 20000

/* Whether the sockets may be left unread now: every posted replay goes into a ring, no ring's
 * failed count moved, and they were read less than DRAIN_EVERY_US ago. */
static bool rings_quiet(graphd_client_t *c, int64_t now)
{
    if (!c->direct_on || !c->ring_on || now - c->drained_us >= DRAIN_EVERY_US)
        return false;
    for (size_t i = 0; i < c->ndirect; i++) {
        const struct graphd__direct *d = &c->direct[i];
        if (d->ring == NULL || __atomic_load_n(&d->ring->failed, __ATOMIC_ACQUIRE) != d->failed)
            return false;
    }
    return true;
}

int graphd__dp_drain(graphd_client_t *c)
{
    int64_t now = now_us();
    if (rings_quiet(c, now))
        return posted_failure(c);
    c->drained_us = now;
    for (size_t i = 0; i < c->ndirect; i++)
        if (c->direct[i].ring != NULL)
            c->direct[i].failed = __atomic_load_n(&c->direct[i].ring->failed, __ATOMIC_ACQUIRE);
    /* One poll for every socket (this runs before each replay): only those with something to
     * read are drained. */
    struct pollfd p[GRAPHD__MAX_DIRECT + 1];
    nfds_t n = 0;
    for (size_t i = 0; i < c->ndirect; i++)
        p[n++] = (struct pollfd){.fd = c->direct[i].fd, .events = POLLIN};
    if (c->session_fd >= 0)
        p[n++] = (struct pollfd){.fd = c->session_fd, .events = POLLIN};
    int rc = GRAPHD_OK;
    if (n > 0 && poll(p, n, 0) > 0) {
        /* Replay connections first, the session socket last (its fd is the last entry); a
         * broken replay connection is closed (direct_forget) under the loop, so each is found
         * again by its fd. */
        for (nfds_t i = 0; i < n && rc == GRAPHD_OK; i++) {
            if (p[i].revents == 0)
                continue;
            if (p[i].fd == c->session_fd)
                rc = drain_sock(c, SESSION_SOCK(c));
            else if (direct_of(c, p[i].fd) != NULL)
                rc = drain_sock(c, (sock_t){p[i].fd, "the replay connection"});
        }
    }
    if (rc != GRAPHD_OK)
        return rc;
    return posted_failure(c);
}

int graphd__dp_request(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg,
                       uint64_t *arg_out, int *fd_out)
{
    return graphd__dp_exchange(c, type, id, arg, NULL, 0, arg_out, fd_out, NULL, NULL);
}

/* One request and its answer on s; see graphd__dp_exchange. *eof is set when s closed under it. */
static int exchange_on(graphd_client_t *c, sock_t s, uint16_t type, uint64_t id, uint64_t arg,
                       const void *send, size_t send_len, int send_fd, uint64_t *arg_out,
                       int *fd_out, void *payload, size_t *payload_len, int *eof)
{
    *eof = 0;
    if (send_len > GRAPHD_FRAME_MAX_MSG)
        return graphd__fail(c, GRAPHD_EINVALID_ARGUMENT, "frame message of %zu bytes", send_len);
    if (fd_out != NULL)
        *fd_out = -1;

    int64_t deadline = now_ms() + c->timeout_ms;
    uint64_t seq;
    int rc = send_request(c, s, type, id, arg, send, send_len, deadline, &seq, send_fd);
    if (rc != GRAPHD_OK)
        goto broken;

    graphd_frame_t rep;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    int fd = -1;
    spin_until_readable(c, s);
    rc = recv_frame(c, s, &rep, msg, deadline, &fd);
    /* Answers to earlier posted replays may come first. */
    while (rc == GRAPHD_OK && rep.seq != seq && take_posted_answer(c, &rep, msg))
        rc = recv_frame(c, s, &rep, msg, deadline, &fd);
    if (rc != GRAPHD_OK)
        goto broken_fd;
    if (rep.type == GRAPHD_FRAME_ERROR) {
        rc = closed_by_daemon(c, s, &rep, msg);
        goto broken_fd;
    }
    if (rep.type != (GRAPHD_FRAME_REPLY | type) || rep.seq != seq) {
        rc = graphd__fail(c, GRAPHD_EPROTO,
                          "unexpected frame from graphd (type 0x%x seq %llu, want 0x%x seq %llu)",
                          (unsigned)rep.type, (unsigned long long)rep.seq,
                          (unsigned)(GRAPHD_FRAME_REPLY | type), (unsigned long long)seq);
        goto broken_fd;
    }
    if (rep.status != 0) {
        if (fd >= 0)
            close(fd);
        int err = graphd_err_from_grpc(rep.status);
        return graphd__fail(c, err, "%s", msg[0] != '\0' ? msg : graphd_strerror(err));
    }
    if (arg_out != NULL)
        *arg_out = rep.arg;
    if (payload_len != NULL) {
        memcpy(payload, msg, rep.msg_len < *payload_len ? rep.msg_len : *payload_len);
        *payload_len = rep.msg_len;
    }
    if (fd_out != NULL)
        *fd_out = fd;
    else if (fd >= 0)
        close(fd);
    return GRAPHD_OK;

broken_fd:
    if (fd >= 0)
        close(fd);
broken:
    /* The stream is out of step (or gone): no later frame could be trusted. */
    *eof = rc == GRAPHD_EUNAVAILABLE;
    broken(c, s);
    return rc;
}

int graphd__dp_exchange(graphd_client_t *c, uint16_t type, uint64_t id, uint64_t arg,
                        const void *send, size_t send_len, uint64_t *arg_out, int *fd_out,
                        void *payload, size_t *payload_len)
{
    if (fd_out != NULL)
        *fd_out = -1;
    if (c->session_fd < 0)
        return no_socket(c);
    int eof;
    return exchange_on(c, SESSION_SOCK(c), type, id, arg, send, send_len, -1, arg_out, fd_out,
                       payload, payload_len, &eof);
}

int graphd__dp_replay(graphd_client_t *c, graphd_graph_t *g, uint64_t arg, uint64_t *arg_out)
{
    sock_t s;
    int rc = replay_sock(c, g, &s);
    if (rc != GRAPHD_OK)
        return rc;
    int eof;
    rc = exchange_on(c, s, GRAPHD_FRAME_REPLAY, g->id, arg, NULL, 0, -1, arg_out, NULL, NULL, NULL,
                     &eof);
    if (eof && s.fd != c->session_fd)
        rc = direct_lost(c, g, rc);
    return rc;
}

/* ---- replay rings ---------------------------------------------------------------------- */

/* Makes d's replay ring: a sealed memfd, mapped here and sent with a RING frame. A refusal
 * leaves d on REPLAY frames; GRAPHD_OK either way unless the connection broke under it. */
static int ring_open(graphd_client_t *c, struct graphd__direct *d, sock_t s)
{
    d->ring_tried = 1;
    int fd = memfd_create("graphd-replay-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0)
        return GRAPHD_OK; /* frames, as before */
    void *m = MAP_FAILED;
    if (ftruncate(fd, GRAPHD_RING_BYTES) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
        m = mmap(NULL, GRAPHD_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        close(fd);
        return GRAPHD_OK;
    }
    uint64_t slots = 0;
    int eof;
    int rc =
        exchange_on(c, s, GRAPHD_FRAME_RING, 0, 0, NULL, 0, fd, &slots, NULL, NULL, NULL, &eof);
    close(fd);
    if (rc == GRAPHD_OK && slots == GRAPHD_RING_SLOTS) {
        d = direct_of(c, s.fd); /* the exchange may have moved the table: it did not close s */
        d->ring = m;
        d->head = 0;
        d->failed = 0;
        return GRAPHD_OK;
    }
    munmap(m, GRAPHD_RING_BYTES);
    if (eof || direct_of(c, s.fd) == NULL)
        return rc != GRAPHD_OK ? rc : GRAPHD_EUNAVAILABLE; /* the connection is gone */
    return GRAPHD_OK; /* refused (a status): frames on this connection */
}

/* Sends WAKE on s: the executor may be asleep in poll with a slot of ours waiting. */
static int ring_wake(graphd_client_t *c, sock_t s)
{
    uint64_t seq;
    int rc =
        send_request(c, s, GRAPHD_FRAME_WAKE, 0, 0, NULL, 0, now_ms() + c->timeout_ms, &seq, -1);
    if (rc != GRAPHD_OK)
        broken(c, s);
    return rc;
}

/* Waits until d's ring has a free slot: the executor is behind by a whole ring (busy with
 * another request, or stopped). Reads the socket meanwhile (failures, its close), and gives up
 * after the client's timeout, as a send into a full socket would. */
static int ring_wait_room(graphd_client_t *c, struct graphd__direct *d, sock_t s)
{
    int64_t deadline = now_ms() + c->timeout_ms;
    while (d->head - __atomic_load_n(&d->ring->tail, __ATOMIC_ACQUIRE) >= GRAPHD_RING_SLOTS) {
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        if (__atomic_load_n(&d->ring->asleep, __ATOMIC_RELAXED)) {
            int rc = ring_wake(c, s);
            if (rc != GRAPHD_OK)
                return rc;
        }
        struct pollfd p = {.fd = s.fd, .events = POLLIN};
        if (poll(&p, 1, 1) > 0) {
            int rc = drain_sock(c, s);
            if (rc != GRAPHD_OK)
                return rc;
            if (direct_of(c, s.fd) == NULL)
                return closed(c, s);
        }
        if (now_ms() >= deadline)
            return graphd__fail(c, GRAPHD_EDEADLINE_EXCEEDED,
                                "the executor took none of the %d replays queued in %s's ring "
                                "within %d ms",
                                GRAPHD_RING_SLOTS, s.name, c->timeout_ms);
    }
    return GRAPHD_OK;
}

/* A posted REPLAY into d's ring: the slot, then head, then WAKE when the executor sleeps. */
static int ring_post(graphd_client_t *c, struct graphd__direct *d, sock_t s, uint64_t id,
                     uint64_t arg)
{
    if (d->head - __atomic_load_n(&d->ring->tail, __ATOMIC_ACQUIRE) >= GRAPHD_RING_SLOTS) {
        int rc = ring_wait_room(c, d, s);
        if (rc != GRAPHD_OK)
            return rc;
    }
    graphd_ring_slot_t *slot = &d->ring->slot[d->head % GRAPHD_RING_SLOTS];
    __atomic_store_n(&slot->seq, ++c->seq, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->id, id, __ATOMIC_RELAXED);
    __atomic_store_n(&slot->arg, arg, __ATOMIC_RELAXED);
    __atomic_store_n(&d->ring->head, ++d->head, __ATOMIC_RELEASE);
    __atomic_thread_fence(__ATOMIC_SEQ_CST); /* against the executor's asleep, then head */
    if (__atomic_load_n(&d->ring->asleep, __ATOMIC_RELAXED))
        return ring_wake(c, s);
    return GRAPHD_OK;
}

int graphd__dp_replay_post(graphd_client_t *c, graphd_graph_t *g, uint64_t arg)
{
    sock_t s;
    int rc = replay_sock(c, g, &s);
    if (rc != GRAPHD_OK)
        return rc;
    struct graphd__direct *d = s.fd != c->session_fd ? direct_of(c, s.fd) : NULL;
    if (d != NULL && c->ring_on && !d->ring_tried) {
        rc = ring_open(c, d, s);
        if (rc != GRAPHD_OK) {
            /* The connection closed under RING: an executor that does not know it ends the
             * connection. Frames from now on, on a new one. */
            c->ring_on = 0;
            rc = replay_sock(c, g, &s);
            if (rc != GRAPHD_OK)
                return rc;
        }
        d = s.fd != c->session_fd ? direct_of(c, s.fd) : NULL;
    }
    if (d != NULL && d->ring != NULL)
        rc = ring_post(c, d, s, g->id, arg);
    else
        rc = post_on(c, s, GRAPHD_FRAME_REPLAY, g->id, arg);
    if (rc == GRAPHD_EUNAVAILABLE && s.fd != c->session_fd)
        rc = direct_lost(c, g, rc);
    return rc;
}
