/*
 * The /metrics endpoint (metrics.h). libmicrohttpd's one polling thread answers the requests;
 * for the text it bumps `asked`, wakes the loop through the uv_async_t and waits on the
 * condition variable until the loop has built a text for that ask (`answered`), at most
 * ANSWER_WAIT_S: a busy loop costs a scrape a 503, never the loop a wait.
 */
#include "metrics.h"
#include "log.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gd_metrics_parse_listen(const char *listen, struct sockaddr_storage *addr, socklen_t *len,
                            char *err, size_t errlen)
{
    static const char want[] = "give IP:PORT, e.g. 127.0.0.1:9464, [::1]:9464 or 0.0.0.0:9464";
    char host[64];
    const char *colon;
    memset(addr, 0, sizeof *addr);
    if (listen[0] == '[') {
        const char *end = strchr(listen, ']');
        if (end == NULL || end[1] != ':' || (size_t)(end - listen - 1) >= sizeof host) {
            snprintf(err, errlen, "metrics_listen '%s': an IPv6 address needs [ADDR]:PORT; %s",
                     listen, want);
            return -1;
        }
        snprintf(host, sizeof host, "%.*s", (int)(end - listen - 1), listen + 1);
        colon = end + 1;
    } else {
        colon = strrchr(listen, ':');
        if (colon == NULL || (size_t)(colon - listen) >= sizeof host) {
            snprintf(err, errlen, "metrics_listen '%s' has no port; %s", listen, want);
            return -1;
        }
        snprintf(host, sizeof host, "%.*s", (int)(colon - listen), listen);
    }
    char *end;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (colon[1] < '0' || colon[1] > '9' || *end != 0 || errno || port == 0 || port > 65535) {
        snprintf(err, errlen, "metrics_listen '%s': the port must be 1 to 65535; %s", listen, want);
        return -1;
    }
    struct sockaddr_in *v4 = (struct sockaddr_in *)addr;
    struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)addr;
    if (listen[0] != '[' && inet_pton(AF_INET, host, &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons((uint16_t)port);
        *len = sizeof *v4;
        return 0;
    }
    if (listen[0] == '[' && inet_pton(AF_INET6, host, &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons((uint16_t)port);
        *len = sizeof *v6;
        return 0;
    }
    snprintf(err, errlen, "metrics_listen '%s': '%s' is not an IP address (no host names%s); %s",
             listen, host, strchr(host, ':') ? "; an IPv6 address goes in brackets" : "", want);
    return -1;
}

int gd_metrics_check(const char *listen, char *err, size_t errlen)
{
    if (listen == NULL || listen[0] == 0)
        return 0;
#ifndef GD_HAVE_MHD
    snprintf(err, errlen,
             "graphd was built without libmicrohttpd (Debian: libmicrohttpd-dev); metrics_listen "
             "needs it");
    return -1;
#else
    struct sockaddr_storage addr;
    socklen_t len;
    return gd_metrics_parse_listen(listen, &addr, &len, err, errlen);
#endif
}

#ifndef GD_HAVE_MHD

int gd_metrics_start(gd_daemon_t *d)
{
    d->metrics = NULL;
    char err[256];
    if (gd_metrics_check(d->cfg.metrics_listen, err, sizeof err) == 0)
        return 0;
    gd_error("%s", err);
    return -1;
}

void gd_metrics_stop(gd_daemon_t *d)
{
    (void)d;
}

#else

#include <microhttpd.h>
#include <pthread.h>
#include <stdarg.h>
#include <time.h>

#define ANSWER_WAIT_S 2

struct gd_metrics {
    gd_daemon_t *d;
    uv_async_t async;
    struct MHD_Daemon *mhd;
    pthread_mutex_t lock; /* guards what follows */
    pthread_cond_t answered_cond;
    uint64_t asked, answered; /* asks made by the HTTP thread, and the last one the loop met */
    char *text;               /* the loop's latest text (NULL: it could not build one) */
    size_t len;
    bool closing;
};

/* On the loop: builds the text for every ask made so far and wakes the waiting request. */
static void on_ask(uv_async_t *h)
{
    gd_metrics_t *m = h->data;
    pthread_mutex_lock(&m->lock);
    uint64_t asked = m->asked;
    pthread_mutex_unlock(&m->lock);
    char *text = NULL;
    size_t len = 0;
    if (gd_metrics_text(m->d, &text, &len) != 0)
        gd_error("metrics: out of memory building the text");
    pthread_mutex_lock(&m->lock);
    free(m->text);
    m->text = text;
    m->len = len;
    m->answered = asked;
    pthread_cond_broadcast(&m->answered_cond);
    pthread_mutex_unlock(&m->lock);
}

static enum MHD_Result respond(struct MHD_Connection *conn, unsigned code, char *body, size_t len,
                               const char *type)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    if (r == NULL) {
        free(body);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    if (code == MHD_HTTP_METHOD_NOT_ALLOWED)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, "GET, HEAD");
    enum MHD_Result rc = MHD_queue_response(conn, code, r);
    MHD_destroy_response(r);
    return rc;
}

static enum MHD_Result respond_text(struct MHD_Connection *conn, unsigned code, const char *msg)
{
    char *body = strdup(msg);
    return respond(conn, code, body, body ? strlen(body) : 0, "text/plain; charset=utf-8");
}

/* On libmicrohttpd's thread. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    gd_metrics_t *m = cls;
    (void)version;
    (void)upload_data;
    (void)con_cls;
    if (*upload_data_size != 0) { /* a body we do not want: consume it, answer at its end */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return respond_text(conn, MHD_HTTP_NOT_FOUND, "graphd serves only GET /metrics\n");
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0)
        return respond_text(conn, MHD_HTTP_METHOD_NOT_ALLOWED,
                            "/metrics answers GET (and HEAD) only\n");
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    deadline.tv_sec += ANSWER_WAIT_S;
    pthread_mutex_lock(&m->lock);
    uint64_t ask = ++m->asked;
    uv_async_send(&m->async);
    int rc = 0;
    while (m->answered < ask && !m->closing && rc != ETIMEDOUT)
        rc = pthread_cond_timedwait(&m->answered_cond, &m->lock, &deadline);
    bool got = m->answered >= ask, closing = m->closing;
    char *body = NULL;
    size_t len = 0;
    if (got && m->text) {
        body = malloc(m->len + 1);
        if (body) {
            memcpy(body, m->text, m->len);
            len = m->len;
        }
    }
    pthread_mutex_unlock(&m->lock);
    if (!got)
        return respond_text(conn, MHD_HTTP_SERVICE_UNAVAILABLE,
                            closing ? "graphd is stopping\n"
                                    : "graphd's loop did not answer within 2 s\n");
    if (body == NULL)
        return respond_text(conn, MHD_HTTP_INTERNAL_SERVER_ERROR,
                            "graphd ran out of memory building the metrics\n");
    return respond(conn, MHD_HTTP_OK, body, len, "text/plain; version=0.0.4; charset=utf-8");
}

/* libmicrohttpd's own messages, as log lines of ours (it may call this from its thread). */
static void mhd_log(void *cls, const char *fmt, va_list ap)
{
    (void)cls;
    char msg[512];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\n")] = 0;
    gd_warn("metrics: libmicrohttpd: %s", msg);
}

static void on_closed(uv_handle_t *h)
{
    gd_metrics_t *m = h->data;
    pthread_cond_destroy(&m->answered_cond);
    pthread_mutex_destroy(&m->lock);
    free(m->text);
    free(m);
}

int gd_metrics_start(gd_daemon_t *d)
{
    d->metrics = NULL;
    const char *listen = d->cfg.metrics_listen;
    if (listen == NULL || listen[0] == 0)
        return 0;
    struct sockaddr_storage addr;
    socklen_t addr_len;
    char err[256];
    if (gd_metrics_parse_listen(listen, &addr, &addr_len, err, sizeof err) != 0) {
        gd_error("%s", err);
        return -1;
    }
    gd_metrics_t *m = calloc(1, sizeof *m);
    if (m == NULL) {
        gd_error("metrics: out of memory");
        return -1;
    }
    m->d = d;
    pthread_mutex_init(&m->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&m->answered_cond, &ca);
    pthread_condattr_destroy(&ca);
    uv_async_init(d->loop, &m->async, on_ask);
    m->async.data = m;
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG;
    if (addr.ss_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    /* A scraper that stops reading is dropped after 10 s; it never holds up the loop. */
    /* The port is in addr; given again so that libmicrohttpd's messages name it. */
    uint16_t port = ntohs(addr.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&addr)->sin6_port
                                                     : ((struct sockaddr_in *)&addr)->sin_port);
    m->mhd = MHD_start_daemon(flags, port, NULL, NULL, on_request, m, MHD_OPTION_EXTERNAL_LOGGER,
                              mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
                              MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)10,
                              MHD_OPTION_CONNECTION_LIMIT, (unsigned)64, MHD_OPTION_END);
    if (m->mhd == NULL) {
        gd_error("metrics_listen %s: cannot listen there (%s); choose a free port or another "
                 "address",
                 listen, strerror(errno));
        uv_close((uv_handle_t *)&m->async, on_closed);
        return -1;
    }
    d->metrics = m;
    gd_info("metrics: Prometheus text at http://%s/metrics", listen);
    return 0;
}

void gd_metrics_stop(gd_daemon_t *d)
{
    gd_metrics_t *m = d->metrics;
    if (m == NULL)
        return;
    d->metrics = NULL;
    pthread_mutex_lock(&m->lock);
    m->closing = true;
    pthread_cond_broadcast(&m->answered_cond);
    pthread_mutex_unlock(&m->lock);
    MHD_stop_daemon(m->mhd); /* joins its thread: no uv_async_send after this */
    uv_close((uv_handle_t *)&m->async, on_closed);
}

#endif
