/*
 * The daemon's life as a client sees it: SIGTERM exits 0 (idle, and with
 * sessions, regions and an idle channel open); a daemon that is not there
 * is reported as UNAVAILABLE quickly; host regions outlive the daemon in
 * the client that maps them.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

static void sigterm_idle_exits_zero(void **state)
{
    (void)state;
    harness_t h;
    assert_int_equal(harness_start(&h, NULL), 0);
    assert_int_equal(harness_stop(&h), 0);
}

static void sigterm_with_sessions_exits_zero(void **state)
{
    (void)state;
    harness_t h;
    assert_int_equal(harness_start(&h, NULL), 0);
    graphd_client_t *a = harness_client(&h, "busy");
    assert_non_null(a);
    graphd_client_t *idle;
    assert_int_equal(graphd_connect(h.address, &idle), GRAPHD_OK);
    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(a, NULL, 1 << 16, &r), GRAPHD_OK);
    memset(graphd_region_ptr(r), 0x42, 1 << 16);
    assert_int_equal(graphd_pool_create(a, "it-life", NULL, 0, NULL), GRAPHD_OK);

    assert_int_equal(harness_stop(&h), 0);

    /* The host region stays valid in this process after the daemon is gone. */
    const unsigned char *p = graphd_region_ptr(r);
    for (int i = 0; i < 1 << 16; i++)
        if (p[i] != 0x42)
            fail_msg("byte %d changed after the daemon exited", i);

    /* Calls now fail with UNAVAILABLE, quickly, and closing does not hang. */
    int64_t t0 = harness_now_ms();
    size_t n = 0;
    assert_int_equal(graphd_list_pools(idle, &n, NULL), GRAPHD_EUNAVAILABLE);
    graphd_region_t *r2;
    int rc = graphd_region_alloc(a, NULL, 10, &r2);
    assert_int_equal(rc, GRAPHD_EUNAVAILABLE);
    assert_true(harness_now_ms() - t0 < 3000);
    graphd_close(a);
    graphd_close(idle);
    assert_true(harness_now_ms() - t0 < 5000);
    graphd_region_release(r); /* the last handle: frees a's client */
}

/* Session-socket connections that never send ATTACH are closed after attach_timeout_ms (each
 * held two descriptors forever, and a few thousand locked new clients out at the fd limit);
 * a client that attaches afterwards works. */
static void unattached_connections_time_out(void **state)
{
    (void)state;
    harness_t h;
    static const char *const args[] = {"--attach-timeout-ms", "200", NULL};
    assert_int_equal(harness_start(&h, args), 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    int plen = snprintf(NULL, 0, "%s.session", h.sock_path);
    assert_true(plen > 0 && (size_t)plen < sizeof sa.sun_path);
    memcpy(sa.sun_path, h.sock_path, strlen(h.sock_path));
    memcpy(sa.sun_path + strlen(h.sock_path), ".session", sizeof ".session");
    enum { N = 20 };
    int fds[N];
    for (int i = 0; i < N; i++) {
        fds[i] = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        assert_true(fds[i] >= 0);
        assert_int_equal(connect(fds[i], (struct sockaddr *)&sa, sizeof sa), 0);
    }
    int64_t t0 = harness_now_ms();
    for (int i = 0; i < N; i++) {
        struct pollfd p = {fds[i], POLLIN, 0};
        int left = (int)(t0 + 5000 - harness_now_ms());
        if (poll(&p, 1, left > 0 ? left : 0) != 1)
            fail_msg("connection %d still open %lld ms after attach_timeout_ms of 200", i,
                     (long long)(harness_now_ms() - t0));
        char b;
        assert_int_equal(read(fds[i], &b, 1), 0); /* closed by the daemon */
        close(fds[i]);
    }
    graphd_client_t *c = harness_client(&h, "after");
    assert_non_null(c);
    graphd_close(c);
    assert_int_equal(harness_stop(&h), 0);
}

/* SIGTERM while a capture runs a forward that never returns: the call is cancelled after the
 * grace period, the device's worker cannot be stopped, and the daemon exits around it (it used to
 * wait for the worker for ever). */
static void sigterm_with_a_call_that_never_returns(void **state)
{
    (void)state;
    harness_fixture_t f;
    static const char *const args[] = {"--shutdown-grace-ms", "300", NULL};
    assert_int_equal(harness_fixture_start(&f, args), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        graphd_client_t *c = harness_client(&f.h, "forever");
        uint64_t id = c ? harness_models_register(c, &f.m, "forever.pt") : 0;
        graphd_tensor_spec_t arg;
        memset(&arg, 0, sizeof arg);
        arg.dtype = GRAPHD_FLOAT32;
        arg.ndim = 1;
        arg.shape[0] = 4;
        graphd_callable_t callable = {id, NULL, 1, &arg};
        graphd_graph_t *g = NULL;
        if (id != 0)
            graphd_capture(c, 1, &callable, NULL, &g); /* returns when the daemon is gone */
        _exit(0);
    }
    usleep(1500 * 1000); /* the capture is in its warm-up by now */
    int64_t t0 = harness_now_ms();
    assert_int_equal(harness_fixture_stop(&f), 0);
    int64_t took = harness_now_ms() - t0;
    if (took > 5000)
        fail_msg("graphd took %lld ms to exit after SIGTERM", (long long)took);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
}

static void missing_daemon_is_unavailable_fast(void **state)
{
    (void)state;
    graphd_client_t *c;
    assert_int_equal(graphd_connect("unix:/tmp/graphd-it-no-such-dir/graphd.sock", &c), GRAPHD_OK);
    int64_t t0 = harness_now_ms();
    size_t n = 0;
    assert_int_equal(graphd_list_devices(c, &n, NULL), GRAPHD_EUNAVAILABLE);
    assert_true(strlen(graphd_last_error(c)) > 0);
    assert_int_equal(graphd_hello(c, "nobody"), GRAPHD_EUNAVAILABLE);
    assert_int_equal(graphd_session_id(c), 0);
    size_t len = 0;
    assert_int_equal(graphd_status_json(c, NULL, &len), GRAPHD_EUNAVAILABLE);
    assert_true(harness_now_ms() - t0 < 2000);
    graphd_close(c);
}

static void address_resolution(void **state)
{
    (void)state;
    graphd_client_t *c;
    assert_int_equal(graphd_connect("/tmp/x.sock", &c), GRAPHD_OK);
    assert_string_equal(graphd_address(c), "unix:/tmp/x.sock");
    graphd_close(c);

    char *saved = getenv("GRAPHD_ADDRESS") ? strdup(getenv("GRAPHD_ADDRESS")) : NULL;
    setenv("GRAPHD_ADDRESS", "unix:/tmp/from-env.sock", 1);
    assert_int_equal(graphd_connect(NULL, &c), GRAPHD_OK);
    assert_string_equal(graphd_address(c), "unix:/tmp/from-env.sock");
    graphd_close(c);
    unsetenv("GRAPHD_ADDRESS");
    assert_int_equal(graphd_connect(NULL, &c), GRAPHD_OK);
    assert_string_equal(graphd_address(c), GRAPHD_DEFAULT_ADDRESS);
    graphd_close(c);
    if (saved != NULL) {
        setenv("GRAPHD_ADDRESS", saved, 1);
        free(saved);
    }
    graphd_close(NULL);
}

static void error_table(void **state)
{
    (void)state;
    assert_string_equal(graphd_err_name(GRAPHD_OK), "OK");
    assert_string_equal(graphd_err_name(GRAPHD_EINVALID_ARGUMENT), "INVALID_ARGUMENT");
    assert_string_equal(graphd_err_name(GRAPHD_EUNAVAILABLE), "UNAVAILABLE");
    assert_string_equal(graphd_err_name(GRAPHD_ESYS), "ESYS");
    assert_string_equal(graphd_err_name(GRAPHD_ETRUNC), "ETRUNC");
    for (int code = 0; code <= 16; code++) {
        int err = graphd_err_from_grpc(code);
        assert_int_equal(err, -code);
        assert_int_equal(graphd_err_to_grpc(err), code);
        assert_true(strlen(graphd_strerror(err)) > 0);
    }
    assert_int_equal(graphd_err_from_grpc(99), GRAPHD_EUNKNOWN);
    assert_int_equal(graphd_err_from_grpc(-1), GRAPHD_EUNKNOWN);
    assert_int_equal(graphd_err_to_grpc(GRAPHD_ESYS), -1);
    assert_string_equal(graphd_strerror(12345), "unknown error code");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sigterm_idle_exits_zero),
        cmocka_unit_test(sigterm_with_sessions_exits_zero),
        cmocka_unit_test(unattached_connections_time_out),
        cmocka_unit_test(sigterm_with_a_call_that_never_returns),
        cmocka_unit_test(missing_daemon_is_unavailable_fast),
        cmocka_unit_test(address_resolution),
        cmocka_unit_test(error_table),
    };
    return cmocka_run_group_tests_name("lifecycle", tests, NULL, NULL);
}
