/*
 * Raw bytes for the integration tests: a minimal protobuf encoder (for
 * requests libgraphd would never send) and session-socket frame I/O with
 * cmocka assertions, shared by the bad-input tests.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"
#include "wire.h"

void pb_varint(pb_t *p, uint64_t v)
{
    while (v >= 0x80) {
        p->buf[p->len++] = (uint8_t)(v | 0x80);
        v >>= 7;
    }
    p->buf[p->len++] = (uint8_t)v;
}

void pb_uint(pb_t *p, unsigned field, uint64_t v)
{
    pb_varint(p, (uint64_t)field << 3);
    pb_varint(p, v);
}

void pb_fixed64(pb_t *p, unsigned field, uint64_t v)
{
    pb_varint(p, (uint64_t)field << 3 | 1);
    for (int i = 0; i < 8; i++)
        p->buf[p->len++] = (uint8_t)(v >> (8 * i));
}

void pb_bytes(pb_t *p, unsigned field, const void *data, size_t n)
{
    pb_varint(p, (uint64_t)field << 3 | 2);
    pb_varint(p, n);
    memcpy(p->buf + p->len, data, n);
    p->len += n;
}

/* SessionRef{id, token} as field 1 of the enclosing message. */
void pb_session(pb_t *p, uint64_t id, uint64_t token)
{
    pb_t ref = {.len = 0};
    pb_uint(&ref, 1, id);
    pb_fixed64(&ref, 2, token);
    pb_bytes(p, 1, ref.buf, ref.len);
}

int dp_connect(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    assert_true(fd >= 0);
    assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    return fd;
}

size_t dp_fds_to(const char *path, int *fds, size_t max)
{
    size_t n = 0;
    DIR *d = opendir("/proc/self/fd");
    assert_non_null(d);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int fd = atoi(e->d_name);
        struct sockaddr_un sa;
        socklen_t len = sizeof(sa);
        if (e->d_name[0] == '.' || fd == dirfd(d))
            continue;
        if (getpeername(fd, (struct sockaddr *)&sa, &len) == 0 && sa.sun_family == AF_UNIX &&
            len > offsetof(struct sockaddr_un, sun_path) && strcmp(sa.sun_path, path) == 0 &&
            n < max)
            fds[n++] = fd;
    }
    closedir(d);
    return n;
}

/* A client with a session, and the descriptor of its session socket in this process (the one
 * connection to the session socket that is new). */
graphd_client_t *dp_client_with_fd(const harness_t *h, const char *name, int *fd)
{
    char path[HARNESS_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s.session", h->sock_path);
    int before[64], after[64];
    size_t nb = dp_fds_to(path, before, 64);
    graphd_client_t *c = harness_client(h, name);
    assert_non_null(c);
    assert_string_equal(graphd_session_socket(c), path);
    size_t na = dp_fds_to(path, after, 64);
    assert_int_equal(na, nb + 1);
    *fd = -1;
    for (size_t i = 0; i < na; i++) {
        int seen = 0;
        for (size_t j = 0; j < nb; j++)
            seen |= after[i] == before[j];
        if (!seen)
            *fd = after[i];
    }
    assert_true(*fd >= 0);
    return c;
}

void dp_send(int fd, const void *buf, size_t n)
{
    assert_int_equal(send(fd, buf, n, MSG_NOSIGNAL), (ssize_t)n);
}

void dp_send_frame(int fd, uint16_t type, uint64_t seq, uint64_t id, uint64_t arg)
{
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = type,
                        .seq = seq,
                        .id = id,
                        .arg = arg};
    uint8_t raw[GRAPHD_FRAME_SIZE];
    graphd_frame_encode(&f, raw);
    dp_send(fd, raw, sizeof(raw));
}

/* Reads exactly n bytes within 5 s; returns bytes read (< n at EOF), closing passed fds. */
size_t dp_read(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (poll(&p, 1, 5000) <= 0)
            fail_msg("no data on the session socket within 5 s");
        char control[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = {.iov_base = (char *)buf + got, .iov_len = n - got};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control,
                             .msg_controllen = sizeof(control)};
        ssize_t r = recvmsg(fd, &msg, MSG_CMSG_CLOEXEC);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && errno == ECONNRESET)
            return got;
        assert_true(r >= 0);
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm))
            if (cm->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); i++)
                    close(((int *)CMSG_DATA(cm))[i]);
        if (r == 0)
            return got;
        got += (size_t)r;
    }
    return got;
}

/* Reads one frame (and its message) and checks magic and version. */
void dp_recv_frame(int fd, graphd_frame_t *f, char *msg, size_t msg_size)
{
    uint8_t raw[GRAPHD_FRAME_SIZE];
    assert_int_equal(dp_read(fd, raw, sizeof(raw)), sizeof(raw));
    graphd_frame_decode(raw, f);
    assert_int_equal(f->magic, GRAPHD_FRAME_MAGIC);
    assert_int_equal(f->version, GRAPHD_FRAME_VERSION);
    assert_true(f->msg_len <= GRAPHD_FRAME_MAX_MSG);
    assert_true(f->msg_len < msg_size);
    assert_int_equal(dp_read(fd, msg, f->msg_len), f->msg_len);
    msg[f->msg_len] = '\0';
}

/* The daemon must answer with one ERROR frame (INVALID_ARGUMENT) and then close; fd stays open. */
void expect_error_then_close(int fd, const char *what)
{
    graphd_frame_t f;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    uint8_t raw[GRAPHD_FRAME_SIZE];
    size_t got = dp_read(fd, raw, sizeof(raw));
    if (got != sizeof(raw))
        fail_msg("%s: %zu bytes then EOF instead of an ERROR frame", what, got);
    graphd_frame_decode(raw, &f);
    assert_int_equal(f.magic, GRAPHD_FRAME_MAGIC);
    assert_true(f.msg_len < sizeof(msg));
    assert_int_equal(dp_read(fd, msg, f.msg_len), f.msg_len);
    msg[f.msg_len] = '\0';
    assert_int_equal(f.type, GRAPHD_FRAME_ERROR);
    assert_int_equal(f.status, 3); /* INVALID_ARGUMENT */
    assert_true(f.msg_len > 0);
    uint8_t more;
    assert_int_equal(dp_read(fd, &more, 1), 0); /* EOF */
}

int dp_direct(int fd, uint64_t seq, uint64_t graph_id, uint64_t arg, graphd_frame_t *rep, char *msg,
              size_t msg_size)
{
    dp_send_frame(fd, GRAPHD_FRAME_DIRECT, seq, graph_id, arg);
    struct pollfd p = {.fd = fd, .events = POLLIN};
    if (poll(&p, 1, 10000) <= 0)
        fail_msg("no DIRECT reply within 10 s");
    uint8_t raw[GRAPHD_FRAME_SIZE];
    char control[CMSG_SPACE(sizeof(int))];
    struct iovec iov = {.iov_base = raw, .iov_len = sizeof(raw)};
    struct msghdr mh = {.msg_iov = &iov,
                        .msg_iovlen = 1,
                        .msg_control = control,
                        .msg_controllen = sizeof(control)};
    ssize_t r;
    do
        r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (r < 0 && errno == EINTR);
    assert_int_equal(r, (ssize_t)sizeof(raw));
    int got = -1;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
        if (cm->cmsg_type == SCM_RIGHTS)
            memcpy(&got, CMSG_DATA(cm), sizeof(int));
    graphd_frame_decode(raw, rep);
    assert_int_equal(rep->magic, GRAPHD_FRAME_MAGIC);
    assert_int_equal(rep->type, GRAPHD_FRAME_DIRECT | GRAPHD_FRAME_REPLY);
    assert_int_equal(rep->seq, seq);
    assert_true(rep->msg_len < msg_size);
    assert_int_equal(dp_read(fd, msg, rep->msg_len), rep->msg_len);
    msg[rep->msg_len] = '\0';
    return got;
}
