/*
 * The write side of a session-socket connection. Replies come from the loop (ATTACH, MAP,
 * errors) and straight from device workers (REPLAY completions, so a replay costs one thread
 * hop, not two); the mutex keeps frames whole and in order and orders a close after any write in
 * progress.
 *
 * A send never waits for the client. It writes what the socket takes now (MSG_DONTWAIT: on the
 * fast path, nothing buffered, that is the whole frame in one sendmsg) and keeps the rest in the
 * wire's output buffer; the loop flushes the buffer when the socket becomes writable (a uv_poll_t
 * on the wire's socket, started through a uv_async_t since workers send too). A frame that passes
 * a descriptor (SCM_RIGHTS) and could not start keeps a dup of it until its first byte goes. A
 * wire whose buffer would pass its bound (reply_buffer_max_bytes), or whose socket fails, stops
 * sending, drops what it holds and tells the loop (on_fail), which ends the session.
 *
 * The wire holds its own dup of the socket, so a worker never writes to a descriptor number that
 * the loop has closed and the kernel has handed out again.
 */
#include "daemon.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct {
    uint64_t pos; /* stream position of the frame's first byte */
    int fd;       /* our dup, sent with that byte */
} pending_fd_t;

struct gd_wire {
    pthread_mutex_t lock;
    int fd; /* -1 once closed */
    atomic_int refs;
    gd_wire_state_t state;
    /* unsent bytes: buf[head..len), the first at stream position head_pos */
    uint8_t *buf;
    size_t head, len, cap, max;
    uint64_t head_pos;
    pending_fd_t *fds; /* descriptors of buffered frames, by position */
    size_t nfds, fds_cap;
    bool flush_wanted; /* the async is signalled or the poll runs: the loop will flush */
    /* loop side */
    uv_async_t async;
    uv_poll_t poll;
    bool polling, reported;
    int open_handles;
    void (*on_fail)(void *ctx);
    void *ctx;
};

static void wire_free(gd_wire_t *w)
{
    if (w->fd >= 0)
        close(w->fd);
    for (size_t i = 0; i < w->nfds; i++)
        close(w->fds[i].fd);
    free(w->fds);
    free(w->buf);
    pthread_mutex_destroy(&w->lock);
    free(w);
}

void gd_wire_ref(gd_wire_t *w)
{
    atomic_fetch_add(&w->refs, 1);
}

void gd_wire_unref(gd_wire_t *w)
{
    if (w && atomic_fetch_sub(&w->refs, 1) == 1)
        wire_free(w);
}

/* Drops what is buffered (under the lock). */
static void discard(gd_wire_t *w)
{
    for (size_t i = 0; i < w->nfds; i++)
        close(w->fds[i].fd);
    w->nfds = 0;
    w->head_pos += w->len - w->head;
    w->head = w->len = 0;
}

/* Marks the wire failed and has the loop report it (under the lock). */
static void fail(gd_wire_t *w, gd_wire_state_t why)
{
    if (w->state != GD_WIRE_OK)
        return;
    w->state = why;
    discard(w);
    uv_async_send(&w->async);
}

/* Has the loop flush the buffer (under the lock). */
static void want_flush(gd_wire_t *w)
{
    if (!w->flush_wanted) {
        w->flush_wanted = true;
        uv_async_send(&w->async);
    }
}

/* Appends n bytes to the buffer (under the lock); false without memory. */
static bool append(gd_wire_t *w, const void *p, size_t n)
{
    if (n == 0)
        return true;
    if (w->len + n > w->cap && w->head > 0) {
        memmove(w->buf, w->buf + w->head, w->len - w->head);
        w->len -= w->head;
        w->head = 0;
    }
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n)
            cap *= 2;
        uint8_t *grown = realloc(w->buf, cap);
        if (grown == NULL)
            return false;
        w->buf = grown;
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
    return true;
}

/* Sends buffered bytes until the socket takes no more or none are left (under the lock, on the
 * loop). One sendmsg never runs past the start of the next frame with a descriptor, which goes
 * with that frame's first byte. */
static void flush(gd_wire_t *w)
{
    while (w->state == GD_WIRE_OK && w->fd >= 0 && w->head < w->len) {
        size_t n = w->len - w->head;
        size_t fi = 0; /* the descriptor to pass now, if fds[0] is at head_pos */
        bool with_fd = w->nfds > 0 && w->fds[0].pos == w->head_pos;
        if (with_fd)
            fi = 1;
        if (fi < w->nfds && w->fds[fi].pos - w->head_pos < n)
            n = (size_t)(w->fds[fi].pos - w->head_pos);
        struct iovec iov = {w->buf + w->head, n};
        graphd_fd_control_t ctl;
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        if (with_fd)
            graphd_attach_fd(&mh, &ctl, w->fds[0].fd);
        ssize_t r = sendmsg(w->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            return;
        if (r < 0) {
            gd_debug("session socket: sendmsg: %s", strerror(errno));
            fail(w, GD_WIRE_BROKEN);
            return;
        }
        if (with_fd) {
            close(w->fds[0].fd);
            memmove(w->fds, w->fds + 1, (w->nfds - 1) * sizeof *w->fds);
            w->nfds--;
        }
        w->head += (size_t)r;
        w->head_pos += (uint64_t)r;
    }
    if (w->head == w->len)
        w->head = w->len = 0;
}

static void on_writable(uv_poll_t *h, int status, int events)
{
    (void)events;
    gd_wire_t *w = h->data;
    pthread_mutex_lock(&w->lock);
    if (status < 0)
        fail(w, GD_WIRE_BROKEN);
    else
        flush(w);
    if (w->state != GD_WIRE_OK || w->head == w->len) {
        uv_poll_stop(&w->poll);
        w->polling = false;
        w->flush_wanted = false;
    }
    pthread_mutex_unlock(&w->lock);
}

static void on_async(uv_async_t *h)
{
    gd_wire_t *w = h->data;
    pthread_mutex_lock(&w->lock);
    gd_wire_state_t state = w->state;
    if (state == GD_WIRE_OK && w->head < w->len && !w->polling && w->fd >= 0) {
        int rc = uv_poll_start(&w->poll, UV_WRITABLE, on_writable);
        if (rc == 0)
            w->polling = true;
        else {
            gd_error("session socket: cannot poll for writing: %s", uv_strerror(rc));
            fail(w, GD_WIRE_BROKEN);
            state = w->state;
        }
    }
    pthread_mutex_unlock(&w->lock);
    if (state != GD_WIRE_OK && !w->reported) {
        w->reported = true;
        w->on_fail(w->ctx);
    }
}

gd_wire_t *gd_wire_create(uv_loop_t *loop, int sock, uint64_t max_buffered,
                          void (*on_fail)(void *ctx), void *ctx)
{
    gd_wire_t *w = calloc(1, sizeof *w);
    if (w == NULL)
        return NULL;
    w->fd = fcntl(sock, F_DUPFD_CLOEXEC, 0);
    if (w->fd < 0) {
        gd_error("session socket: dup: %s", strerror(errno));
        free(w);
        return NULL;
    }
    int rc = uv_poll_init(loop, &w->poll, w->fd);
    if (rc != 0) {
        gd_error("session socket: uv_poll_init: %s", uv_strerror(rc));
        close(w->fd);
        free(w);
        return NULL;
    }
    uv_async_init(loop, &w->async, on_async);
    w->poll.data = w->async.data = w;
    w->open_handles = 2;
    w->max = max_buffered;
    w->on_fail = on_fail;
    w->ctx = ctx;
    pthread_mutex_init(&w->lock, NULL);
    atomic_store(&w->refs, 2); /* the caller's, and the loop handles' (gd_wire_close) */
    return w;
}

static void on_handle_closed(uv_handle_t *h)
{
    gd_wire_t *w = h->data;
    if (--w->open_handles == 0)
        gd_wire_unref(w);
}

void gd_wire_close(gd_wire_t *w)
{
    pthread_mutex_lock(&w->lock);
    if (w->fd >= 0) {
        /* The poll goes first: it takes the descriptor out of epoll while it is still open. */
        uv_close((uv_handle_t *)&w->poll, on_handle_closed);
        uv_close((uv_handle_t *)&w->async, on_handle_closed);
        w->polling = false;
        close(w->fd);
        w->fd = -1;
        discard(w);
    }
    pthread_mutex_unlock(&w->lock);
}

gd_wire_state_t gd_wire_state(gd_wire_t *w)
{
    pthread_mutex_lock(&w->lock);
    gd_wire_state_t s = w->state;
    pthread_mutex_unlock(&w->lock);
    return s;
}

int gd_wire_send(gd_wire_t *w, const graphd_frame_t *f, const char *msg, int pass_fd)
{
    return gd_wire_send_bytes(w, f, msg, msg ? strnlen(msg, GRAPHD_FRAME_MAX_MSG) : 0, pass_fd);
}

/* Keeps what sendmsg did not take: bytes [sent, total) of the frame (head and message), and a dup
 * of pass_fd when not one byte went (under the lock). 0, or -1 with the wire failed. */
static int keep_rest(gd_wire_t *w, const uint8_t *head, size_t hlen, const void *msg, size_t mlen,
                     size_t sent, int pass_fd)
{
    size_t rest = hlen + mlen - sent;
    if (w->len - w->head + rest > w->max) {
        fail(w, GD_WIRE_OVERFLOW);
        return -1;
    }
    uint64_t pos = w->head_pos + (w->len - w->head);
    if (pass_fd >= 0 && sent == 0) {
        if (w->nfds == w->fds_cap) {
            size_t cap = w->fds_cap ? w->fds_cap * 2 : 4;
            pending_fd_t *grown = realloc(w->fds, cap * sizeof *grown);
            if (grown == NULL) {
                gd_error("session socket: out of memory for a reply");
                fail(w, GD_WIRE_BROKEN);
                return -1;
            }
            w->fds = grown;
            w->fds_cap = cap;
        }
        int dup = fcntl(pass_fd, F_DUPFD_CLOEXEC, 0);
        if (dup < 0) {
            gd_error("session socket: dup of a reply's descriptor: %s", strerror(errno));
            fail(w, GD_WIRE_BROKEN);
            return -1;
        }
        w->fds[w->nfds++] = (pending_fd_t){pos, dup};
    }
    bool ok = sent < hlen ? append(w, head + sent, hlen - sent) && append(w, msg, mlen)
                          : append(w, (const uint8_t *)msg + (sent - hlen), rest);
    if (!ok) {
        gd_error("session socket: out of memory for a reply");
        fail(w, GD_WIRE_BROKEN);
        return -1;
    }
    want_flush(w);
    return 0;
}

int gd_wire_send_bytes(gd_wire_t *w, const graphd_frame_t *f, const void *msg, size_t mlen,
                       int pass_fd)
{
    uint8_t head[GRAPHD_FRAME_SIZE];
    graphd_frame_t out = *f;
    if (msg == NULL || mlen > GRAPHD_FRAME_MAX_MSG)
        mlen = msg == NULL ? 0 : GRAPHD_FRAME_MAX_MSG;
    out.msg_len = (uint32_t)mlen;
    graphd_frame_encode(&out, head);
    const size_t total = sizeof head + mlen;
    size_t sent = 0;
    int rc = 0;
    pthread_mutex_lock(&w->lock);
    if (w->fd < 0 || w->state != GD_WIRE_OK) {
        rc = -1;
    } else if (w->head == w->len) {
        /* Nothing buffered: send now, as much as the socket takes. */
        struct iovec iov[2] = {{head, sizeof head}, {(void *)msg, mlen}};
        graphd_fd_control_t ctl;
        struct msghdr mh = {.msg_iov = iov, .msg_iovlen = mlen ? 2 : 1};
        if (pass_fd >= 0)
            graphd_attach_fd(&mh, &ctl, pass_fd);
        while (sent < total) {
            ssize_t n = sendmsg(w->fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
                break;
            if (n < 0) {
                gd_debug("session socket: sendmsg: %s", strerror(errno));
                fail(w, GD_WIRE_BROKEN);
                rc = -1;
                break;
            }
            sent += (size_t)n;
            /* Ancillary data went with the first byte; send only what is left. */
            mh.msg_control = NULL;
            mh.msg_controllen = 0;
            while (n > 0 && mh.msg_iovlen > 0) {
                if ((size_t)n >= mh.msg_iov[0].iov_len) {
                    n -= (ssize_t)mh.msg_iov[0].iov_len;
                    mh.msg_iov++;
                    mh.msg_iovlen--;
                } else {
                    mh.msg_iov[0].iov_base = (char *)mh.msg_iov[0].iov_base + n;
                    mh.msg_iov[0].iov_len -= (size_t)n;
                    n = 0;
                }
            }
        }
        if (rc == 0 && sent < total)
            rc = keep_rest(w, head, sizeof head, msg, mlen, sent, pass_fd);
    } else {
        /* Behind buffered frames: keep order, the loop sends it. */
        rc = keep_rest(w, head, sizeof head, msg, mlen, 0, pass_fd);
    }
    pthread_mutex_unlock(&w->lock);
    return rc;
}
