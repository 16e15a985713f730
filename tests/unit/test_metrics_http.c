/*
 * Unit tests for the /metrics HTTP side (libmicrohttpd's thread) with a loop that never runs:
 * a scrape gets 503 after its 2 s wait instead of holding anything up, other paths and methods
 * are answered without the loop, a taken port is refused with a message, and stop closes it all.
 * Skipped in a build without libmicrohttpd (test_metrics.c covers that build's refusal).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#ifdef GD_HAVE_MHD

static int free_port(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(bind(s, (struct sockaddr *)&a, sizeof a), 0);
    socklen_t len = sizeof a;
    assert_int_equal(getsockname(s, (struct sockaddr *)&a, &len), 0);
    close(s);
    return ntohs(a.sin_port);
}

/* One HTTP/1.0 request; the whole answer into buf. */
static void request(int port, const char *method, const char *path, char *buf, size_t len)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    assert_int_equal(connect(s, (struct sockaddr *)&a, sizeof a), 0);
    char req[256];
    int n = snprintf(req, sizeof req, "%s %s HTTP/1.0\r\nHost: x\r\n\r\n", method, path);
    assert_int_equal(write(s, req, (size_t)n), n);
    size_t got = 0;
    ssize_t r;
    while (got + 1 < len && (r = read(s, buf + got, len - 1 - got)) > 0)
        got += (size_t)r;
    buf[got] = 0;
    close(s);
}

static void a_loop_that_does_not_answer(void **state)
{
    (void)state;
    static gd_daemon_t d;
    uv_loop_t loop;
    assert_int_equal(uv_loop_init(&loop), 0);
    d.loop = &loop;
    char listen[64], buf[4096];
    int port = free_port();
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    d.cfg.metrics_listen = listen;
    assert_int_equal(gd_metrics_start(&d), 0);
    assert_non_null(d.metrics);

    request(port, "GET", "/metrics", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 503"));
    assert_non_null(strstr(buf, "graphd's loop did not answer within 2 s"));
    request(port, "GET", "/", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 404"));
    request(port, "DELETE", "/metrics", buf, sizeof buf);
    assert_non_null(strstr(buf, "HTTP/1.1 405"));
    assert_non_null(strstr(buf, "Allow: GET, HEAD"));

    static gd_daemon_t other; /* the same port again */
    other.loop = &loop;
    other.cfg.metrics_listen = listen;
    assert_int_equal(gd_metrics_start(&other), -1);
    assert_null(other.metrics);

    gd_metrics_stop(&d);
    assert_null(d.metrics);
    assert_int_equal(uv_run(&loop, UV_RUN_DEFAULT), 0); /* the close callbacks */
    assert_int_equal(uv_loop_close(&loop), 0);
}

#else

static void a_loop_that_does_not_answer(void **state)
{
    (void)state;
    skip(); /* built without libmicrohttpd */
}

#endif

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_loop_that_does_not_answer),
    };
    return cmocka_run_group_tests_name("metrics_http", tests, NULL, NULL);
}
