/*
 * Socket activation: see activation.h. One socket, the control socket, named by ListenStream= in
 * graphd.socket and by listen in graphd.conf (the same path: clients and graphctl look there,
 * and the session socket's default path is derived from it).
 */
#include "activation.h"
#include "log.h"
#include "rpc.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

/* Connections accepted per readable event: the loop serves other work in between. */
#define ACCEPT_BATCH 64
/* After EMFILE/ENFILE: how long accepting pauses (the socket stays readable, and would spin). */
#define ACCEPT_PAUSE_MS 100

static struct {
    int fd;
    bool active, polling;
    uv_poll_t poll;
    uv_timer_t pause;
    gd_daemon_t *d;
} act = {.fd = -1};

bool gd_activation_active(void)
{
    return act.active;
}

int gd_activation_take(gd_daemon_t *d)
{
    int n = sd_listen_fds(1);
    if (n < 0) {
        gd_error("socket activation: LISTEN_FDS: %s", strerror(-n));
        return -1;
    }
    if (n == 0)
        return 0;
    if (n > 1) {
        gd_error("socket activation: systemd passed %d sockets; graphd takes one, its control "
                 "socket: give graphd.socket a single ListenStream= (the session socket is "
                 "created beside it by graphd)",
                 n);
        return -1;
    }
    int fd = SD_LISTEN_FDS_START;
    if (sd_is_socket_unix(fd, SOCK_STREAM, 1, NULL, 0) <= 0) {
        gd_error("socket activation: the socket systemd passed is not a listening unix stream "
                 "socket: graphd.socket needs ListenStream=/run/graphd/graphd.sock (a path, "
                 "not a port or a datagram socket)");
        return -1;
    }
    struct sockaddr_un sa;
    socklen_t len = sizeof sa;
    memset(&sa, 0, sizeof sa);
    if (getsockname(fd, (struct sockaddr *)&sa, &len) != 0 || sa.sun_path[0] == 0) {
        gd_error("socket activation: the socket systemd passed has no path (abstract or "
                 "unnamed): graphd.socket needs ListenStream=/run/graphd/graphd.sock");
        return -1;
    }
    const char *listen = d->cfg.listen;
    if (strncmp(listen, "unix:", 5) != 0 || strcmp(listen + 5, sa.sun_path) != 0) {
        gd_error("socket activation: systemd passed the socket %s (ListenStream= in "
                 "graphd.socket) but listen = %s: set listen = unix:%s in graphd.conf, or the "
                 "other path in graphd.socket (clients find the daemon at listen)",
                 sa.sun_path, listen, sa.sun_path);
        return -1;
    }
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) != 0) {
        gd_error("socket activation: cannot make the socket non-blocking: %s", strerror(errno));
        return -1;
    }
    act.fd = fd;
    act.active = true;
    act.d = d;
    return 1;
}

static void on_readable(uv_poll_t *h, int status, int events);

static void on_pause_over(uv_timer_t *t)
{
    (void)t;
    if (act.polling)
        uv_poll_start(&act.poll, UV_READABLE, on_readable);
}

static void on_readable(uv_poll_t *h, int status, int events)
{
    (void)h;
    (void)events;
    if (status < 0) {
        gd_error("socket activation: polling the control socket: %s", uv_strerror(status));
        return;
    }
    for (int i = 0; i < ACCEPT_BATCH; i++) {
        int c = accept4(act.fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (c >= 0) {
            gd_rpc_add_fd(act.d->rpc, c);
            continue;
        }
        if (errno == EINTR || errno == ECONNABORTED)
            continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK)
            return;
        if (errno == EMFILE || errno == ENFILE) {
            gd_warn("control socket: cannot accept a connection: %s (LimitNOFILE); trying "
                    "again in %d ms",
                    strerror(errno), ACCEPT_PAUSE_MS);
            uv_poll_stop(&act.poll);
            uv_timer_start(&act.pause, on_pause_over, ACCEPT_PAUSE_MS, 0);
            return;
        }
        gd_error("control socket: accept: %s", strerror(errno));
        return;
    }
}

int gd_activation_start(gd_daemon_t *d)
{
    int rc = uv_poll_init_socket(d->loop, &act.poll, act.fd);
    if (rc == 0)
        rc = uv_poll_start(&act.poll, UV_READABLE, on_readable);
    if (rc != 0) {
        gd_error("socket activation: cannot poll the control socket: %s", uv_strerror(rc));
        return -1;
    }
    uv_timer_init(d->loop, &act.pause);
    act.polling = true;
    return 0;
}

static void on_poll_closed(uv_handle_t *h)
{
    (void)h;
    /* systemd keeps its own descriptor: the socket, and its backlog, wait for the next daemon. */
    close(act.fd);
    act.fd = -1;
}

void gd_activation_stop(void)
{
    if (!act.polling)
        return;
    act.polling = false;
    uv_close((uv_handle_t *)&act.pause, NULL);
    uv_close((uv_handle_t *)&act.poll, on_poll_closed);
}
