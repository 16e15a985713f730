/*
 * The Prometheus endpoint (metrics_listen): libmicrohttpd serves GET /metrics from its own
 * thread, which asks the loop for the text through a uv_async_t and waits for it at most 2 s;
 * the loop builds it (gd_metrics_text) from the same Status the RPC returns.
 */
#ifndef GD_METRICS_H
#define GD_METRICS_H

#include "daemon.h"

#include <stddef.h>
#include <sys/socket.h>

typedef struct gd_metrics gd_metrics_t;

/* Parses metrics_listen ("127.0.0.1:9464", "[::1]:9464": an IP address and a port 1..65535) into
 * addr. 0, or -1 with what to change in err. */
int gd_metrics_parse_listen(const char *listen, struct sockaddr_storage *addr, socklen_t *len,
                            char *err, size_t errlen);
/* Whether graphd can serve metrics_listen (empty: off, fine): this build has libmicrohttpd and
 * the address parses. 0, or -1 with what to change in err. For start-up and --check-config. */
int gd_metrics_check(const char *listen, char *err, size_t errlen);
/* Starts the endpoint when d->cfg.metrics_listen is set (d->metrics; NULL when off). 0, or -1
 * (logged): a bad address, a graphd built without libmicrohttpd, or the port taken. */
int gd_metrics_start(gd_daemon_t *d);
/* Stops the endpoint (waiting scrapes get 503) and closes its handle; on the loop. */
void gd_metrics_stop(gd_daemon_t *d);
/* The metrics text (Prometheus text format 0.0.4), on the loop: *text (free it) and *len. 0, or
 * -1 out of memory. */
int gd_metrics_text(gd_daemon_t *d, char **text, size_t *len);

#endif
