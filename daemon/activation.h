/*
 * Socket activation (deploy/systemd/graphd.socket): the control socket comes from systemd
 * (LISTEN_FDS) instead of being bound by graphd, so that it outlives a restart of the daemon and
 * clients that connect in between wait in its backlog. gRPC core 1.51 cannot adopt a listening
 * socket, so graphd accepts on it here, on the loop, and hands each connection to the gRPC
 * server (gd_rpc_add_fd). The session socket is still created by graphd, beside it.
 */
#ifndef GD_ACTIVATION_H
#define GD_ACTIVATION_H

#include "daemon.h"

#include <stdbool.h>

/* Takes the socket systemd passed (and unsets LISTEN_FDS/LISTEN_PID, so that executors do not
 * see them). 1: taken, 0: none was passed (graphd binds listen itself, as without systemd), -1:
 * one that graphd cannot serve (logged, saying what to change). Before gd_rpc_start. */
int gd_activation_take(gd_daemon_t *d);
/* True once a socket was taken: graphd must not prepare, chmod or unlink the listen path. */
bool gd_activation_active(void);
/* Accepts connections on the taken socket from the loop, for the server rpc. 0 or -1. */
int gd_activation_start(gd_daemon_t *d);
/* Stops accepting (on SIGTERM); connections not yet accepted wait for the next daemon. */
void gd_activation_stop(void);

#endif
