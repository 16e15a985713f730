/*
 * The write side of a session-socket connection. Replies come from the loop
 * (ATTACH, MAP, errors) and straight from device workers (REPLAY completions,
 * so a replay costs one thread hop, not two); the mutex keeps frames whole and
 * orders a close after any write in progress. The wire holds its own dup of
 * the socket, so a worker never writes to a descriptor number that the loop
 * has closed and the kernel has handed out again.
 */
#include "daemon.h"
#include "log.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define SEND_TIMEOUT_MS 1000

struct gd_wire {
    pthread_mutex_t lock;
    int fd; /* -1 once closed */
    atomic_int refs;
};

gd_wire_t *gd_wire_create(int sock)
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
    pthread_mutex_init(&w->lock, NULL);
    atomic_store(&w->refs, 1);
    return w;
}

void gd_wire_ref(gd_wire_t *w)
{
    atomic_fetch_add(&w->refs, 1);
}

void gd_wire_unref(gd_wire_t *w)
{
    if (w && atomic_fetch_sub(&w->refs, 1) == 1) {
        if (w->fd >= 0)
            close(w->fd);
        pthread_mutex_destroy(&w->lock);
        free(w);
    }
}

void gd_wire_close(gd_wire_t *w)
{
    pthread_mutex_lock(&w->lock);
    if (w->fd >= 0) {
        close(w->fd);
        w->fd = -1;
    }
    pthread_mutex_unlock(&w->lock);
}

static int send_all(int sock, struct msghdr *mh, size_t total)
{
    size_t sent = 0;
    while (sent < total) {
        ssize_t n = sendmsg(sock, mh, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            struct pollfd p = {sock, POLLOUT, 0};
            if (poll(&p, 1, SEND_TIMEOUT_MS) == 1)
                continue;
            gd_warn("session socket: peer does not read its replies");
            return -1;
        }
        if (n < 0) {
            gd_debug("session socket: sendmsg: %s", strerror(errno));
            return -1;
        }
        sent += (size_t)n;
        /* Ancillary data went with the first byte; send only what is left. */
        mh->msg_control = NULL;
        mh->msg_controllen = 0;
        while (n > 0 && mh->msg_iovlen > 0) {
            if ((size_t)n >= mh->msg_iov[0].iov_len) {
                n -= (ssize_t)mh->msg_iov[0].iov_len;
                mh->msg_iov++;
                mh->msg_iovlen--;
            } else {
                mh->msg_iov[0].iov_base = (char *)mh->msg_iov[0].iov_base + n;
                mh->msg_iov[0].iov_len -= (size_t)n;
                n = 0;
            }
        }
    }
    return 0;
}

int gd_wire_send(gd_wire_t *w, const graphd_frame_t *f, const char *msg, int pass_fd)
{
    return gd_wire_send_bytes(w, f, msg, msg ? strnlen(msg, GRAPHD_FRAME_MAX_MSG) : 0, pass_fd);
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
    struct iovec iov[2] = {{head, sizeof head}, {(void *)msg, mlen}};
    union {
        struct cmsghdr align;
        char buf[CMSG_SPACE(sizeof(int))];
    } ctl;
    struct msghdr mh = {.msg_iov = iov, .msg_iovlen = mlen ? 2 : 1};
    if (pass_fd >= 0) {
        memset(&ctl, 0, sizeof ctl);
        mh.msg_control = ctl.buf;
        mh.msg_controllen = sizeof ctl.buf;
        struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &pass_fd, sizeof pass_fd);
    }
    pthread_mutex_lock(&w->lock);
    int rc = w->fd >= 0 ? send_all(w->fd, &mh, sizeof head + mlen) : -1;
    pthread_mutex_unlock(&w->lock);
    return rc;
}
