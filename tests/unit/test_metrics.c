/*
 * Unit tests for the metrics endpoint's parts that need no daemon: the metrics_listen grammar,
 * and a graphd built without libmicrohttpd refusing a non-empty metrics_listen (metrics.c is
 * compiled here without GD_HAVE_MHD, whatever this build found). test_metrics_http.c drives the
 * libmicrohttpd side; tests/python/test_metrics.py the whole.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#undef GD_HAVE_MHD
#include "metrics.c"

#include <stdio.h>
#include <unistd.h>

static int parse(const char *s, struct sockaddr_storage *a, char *err, size_t errlen)
{
    socklen_t len = 0;
    err[0] = 0;
    return gd_metrics_parse_listen(s, a, &len, err, errlen);
}

static void good_addresses(void **state)
{
    (void)state;
    struct sockaddr_storage a;
    char err[256];
    assert_int_equal(parse("127.0.0.1:9464", &a, err, sizeof err), 0);
    assert_int_equal(a.ss_family, AF_INET);
    assert_int_equal(ntohs(((struct sockaddr_in *)&a)->sin_port), 9464);
    assert_int_equal(parse("0.0.0.0:1", &a, err, sizeof err), 0);
    assert_int_equal(parse("[::1]:65535", &a, err, sizeof err), 0);
    assert_int_equal(a.ss_family, AF_INET6);
    assert_int_equal(ntohs(((struct sockaddr_in6 *)&a)->sin6_port), 65535);
    assert_int_equal(parse("[::]:9464", &a, err, sizeof err), 0);
}

static void bad_addresses_say_what_to_give(void **state)
{
    (void)state;
    static const struct {
        const char *listen, *says;
    } cases[] = {
        {"localhost:9464", "'localhost' is not an IP address"},
        {"9464", "has no port"},
        {"127.0.0.1:", "the port must be 1 to 65535"},
        {"127.0.0.1:65536", "the port must be 1 to 65535"},
        {"127.0.0.1:-1", "the port must be 1 to 65535"},
        {"127.0.0.1:94x", "the port must be 1 to 65535"},
        {"::1:9464", "an IPv6 address goes in brackets"},
        {"[::1:9464", "needs [ADDR]:PORT"},
        {"[127.0.0.1]:9464", "is not an IP address"},
        {"http://127.0.0.1:9464", "is not an IP address"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        struct sockaddr_storage a;
        char err[256];
        assert_int_equal(parse(cases[i].listen, &a, err, sizeof err), -1);
        if (strstr(err, cases[i].says) == NULL || strstr(err, "e.g. 127.0.0.1:9464") == NULL)
            fail_msg("%s: '%s' does not say '%s'", cases[i].listen, err, cases[i].says);
    }
}

/* gd_metrics_start with stderr (the log) redirected; returns its rc, *log what it wrote. */
static int start_logged(gd_daemon_t *d, char *log, size_t len)
{
    FILE *tmp = tmpfile();
    assert_non_null(tmp);
    fflush(stderr);
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    int rc = gd_metrics_start(d);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(log, 1, len - 1, tmp);
    log[n] = 0;
    fclose(tmp);
    return rc;
}

static void without_libmicrohttpd(void **state)
{
    (void)state;
    static gd_daemon_t d;
    char log[1024];
    d.cfg.metrics_listen = "";
    assert_int_equal(start_logged(&d, log, sizeof log), 0); /* off: nothing to refuse */
    assert_null(d.metrics);
    d.cfg.metrics_listen = "127.0.0.1:9464";
    assert_int_equal(start_logged(&d, log, sizeof log), -1);
    assert_null(d.metrics);
    assert_non_null(strstr(log, "graphd was built without libmicrohttpd (Debian: "
                                "libmicrohttpd-dev); metrics_listen needs it"));
    gd_metrics_stop(&d);
    char err[256];
    assert_int_equal(gd_metrics_check("127.0.0.1:9464", err, sizeof err), -1); /* --check-config */
    assert_non_null(strstr(err, "built without libmicrohttpd"));
    assert_int_equal(gd_metrics_check("", err, sizeof err), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(good_addresses),
        cmocka_unit_test(bad_addresses_say_what_to_give),
        cmocka_unit_test(without_libmicrohttpd),
    };
    return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
