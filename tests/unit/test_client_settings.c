/*
 * Unit tests for libgraphd's settings table (client/c/settings.c): defaults, normalization, one
 * error message per invalid value, the same from graphd_setting and graphd_connect, and the
 * version libgraphd reports. No daemon: graphd_connect does no I/O.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "graphd.h"

static const char *const names[] = {
    "GRAPHD_ADDRESS",        "GRAPHD_TIMEOUT_MS",       "GRAPHD_SPIN_US",
    "GRAPHD_DIRECT",         "GRAPHD_REPLAY_RING",      "GRAPHD_TLS_CA",
    "GRAPHD_REPLAY_ORDER",   "GRAPHD_COPY_PARAM_GRADS", "GRAPHD_ZE_LOADER",
    "GRAPHD_REPLAY_PROFILE", "GRAPHD_SLOW_CAPTURE_S",   "GRAPHD_TRACE_CACHE",
    "GRAPHD_TRACE_CACHE_DIR"};
#define NNAMES (sizeof(names) / sizeof(names[0]))

static int setup(void **state)
{
    (void)state;
    for (size_t i = 0; i < NNAMES; i++)
        unsetenv(names[i]);
    return 0;
}

/* graphd_setting's value for name, failing the test on an error. */
static const char *value(const char *name)
{
    static char buf[4200];
    size_t len = sizeof(buf);
    int rc = graphd_setting(name, buf, &len);
    if (rc != GRAPHD_OK)
        fail_msg("%s: %s: %s", name, graphd_err_name(rc), graphd_last_error(NULL));
    assert_int_equal(len, strlen(buf) + 1);
    return buf;
}

/* graphd_setting must refuse name's current value with GRAPHD_EINVALID_ARGUMENT, and
 * graphd_connect the same with the same message, which must contain want. */
static void refused(const char *name, const char *want)
{
    char buf[64];
    size_t len = sizeof(buf);
    assert_int_equal(graphd_setting(name, buf, &len), GRAPHD_EINVALID_ARGUMENT);
    char msg[1024];
    strncpy(msg, graphd_last_error(NULL), sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    if (strstr(msg, want) == NULL)
        fail_msg("%s: message \"%s\" lacks \"%s\"", name, msg, want);
    if (strcmp(name, "GRAPHD_COPY_PARAM_GRADS") == 0 || strcmp(name, "GRAPHD_SLOW_CAPTURE_S") == 0)
        return; /* the Python package's alone: graphd_connect does not read them */
    graphd_client_t *c = (graphd_client_t *)&c; /* not NULL, to see it cleared */
    assert_int_equal(graphd_connect(NULL, &c), GRAPHD_EINVALID_ARGUMENT);
    assert_null(c);
    assert_string_equal(graphd_last_error(NULL), msg);
}

static void the_table_lists_every_setting(void **state)
{
    (void)state;
    size_t n = 0;
    while (graphd_setting_name(n) != NULL)
        n++;
    assert_int_equal(n, NNAMES);
    for (size_t i = 0; i < NNAMES; i++)
        assert_string_equal(graphd_setting_name(i), names[i]);
    assert_null(graphd_setting_name((size_t)-1));
}

static void defaults_when_unset_or_empty(void **state)
{
    (void)state;
    for (int pass = 0; pass < 2; pass++) {
        if (pass == 1)
            for (size_t i = 0; i < NNAMES; i++)
                setenv(names[i], "", 1); /* set but empty reads as unset */
        assert_string_equal(value("GRAPHD_ADDRESS"), GRAPHD_DEFAULT_ADDRESS);
        assert_string_equal(value("GRAPHD_TIMEOUT_MS"), "60000");
        assert_string_equal(value("GRAPHD_SPIN_US"), get_nprocs() >= 4 ? "200" : "0");
        assert_string_equal(value("GRAPHD_TLS_CA"), "");
        assert_string_equal(value("GRAPHD_REPLAY_ORDER"), "posted");
        assert_string_equal(value("GRAPHD_COPY_PARAM_GRADS"), "0");
        assert_string_equal(value("GRAPHD_ZE_LOADER"), "libze_loader.so.1");
        assert_string_equal(value("GRAPHD_REPLAY_PROFILE"), "0");
        assert_string_equal(value("GRAPHD_REPLAY_RING"), "1");
        assert_string_equal(value("GRAPHD_SLOW_CAPTURE_S"), "2");
        assert_string_equal(value("GRAPHD_TRACE_CACHE"), "disk");
        assert_string_equal(value("GRAPHD_TRACE_CACHE_DIR"), "");
    }
    assert_string_equal(graphd_last_error(NULL), "");
}

static void values_are_normalized(void **state)
{
    (void)state;
    setenv("GRAPHD_ADDRESS", "/tmp/x.sock", 1);
    assert_string_equal(value("GRAPHD_ADDRESS"), "unix:/tmp/x.sock");
    setenv("GRAPHD_ADDRESS", "localhost:7070", 1);
    assert_string_equal(value("GRAPHD_ADDRESS"), "localhost:7070");
    setenv("GRAPHD_ADDRESS", "[::1]:7070", 1);
    assert_string_equal(value("GRAPHD_ADDRESS"), "[::1]:7070");
    setenv("GRAPHD_ADDRESS", "unix-abstract:graphd", 1);
    assert_string_equal(value("GRAPHD_ADDRESS"), "unix-abstract:graphd");
    setenv("GRAPHD_TIMEOUT_MS", "0250", 1);
    assert_string_equal(value("GRAPHD_TIMEOUT_MS"), "250");
    setenv("GRAPHD_TIMEOUT_MS", "86400000", 1);
    assert_string_equal(value("GRAPHD_TIMEOUT_MS"), "86400000");
    setenv("GRAPHD_SPIN_US", "0", 1);
    assert_string_equal(value("GRAPHD_SPIN_US"), "0");
    setenv("GRAPHD_TLS_CA", "/etc/ssl/ca.pem", 1);
    assert_string_equal(value("GRAPHD_TLS_CA"), "/etc/ssl/ca.pem");
    for (const char *const *o = (const char *const[]){"posted", "events", "sync", NULL}; *o; o++) {
        setenv("GRAPHD_REPLAY_ORDER", *o, 1);
        assert_string_equal(value("GRAPHD_REPLAY_ORDER"), *o);
    }
    setenv("GRAPHD_COPY_PARAM_GRADS", "1", 1);
    assert_string_equal(value("GRAPHD_COPY_PARAM_GRADS"), "1");
    setenv("GRAPHD_REPLAY_PROFILE", "1", 1);
    assert_string_equal(value("GRAPHD_REPLAY_PROFILE"), "1");
    setenv("GRAPHD_SLOW_CAPTURE_S", "010", 1);
    assert_string_equal(value("GRAPHD_SLOW_CAPTURE_S"), "10");

    /* graphd_connect takes them: the address from the environment, normalized. */
    setenv("GRAPHD_ADDRESS", "/tmp/x.sock", 1);
    graphd_client_t *c;
    assert_int_equal(graphd_connect(NULL, &c), GRAPHD_OK);
    assert_string_equal(graphd_address(c), "unix:/tmp/x.sock");
    graphd_close(c);
    assert_int_equal(graphd_connect("/tmp/y.sock", &c), GRAPHD_OK);
    assert_string_equal(graphd_address(c), "unix:/tmp/y.sock");
    graphd_close(c);
}

static void invalid_values_name_variable_value_and_what_is_accepted(void **state)
{
    (void)state;
    static const struct {
        const char *name, *bad, *want;
    } cases[] = {
        {"GRAPHD_TIMEOUT_MS", "0",
         "GRAPHD_TIMEOUT_MS=0 is not valid: expected an integer from 1 to 86400000"},
        {"GRAPHD_TIMEOUT_MS", "86400001", "GRAPHD_TIMEOUT_MS=86400001 is not valid"},
        {"GRAPHD_TIMEOUT_MS", "abc", "GRAPHD_TIMEOUT_MS=abc is not valid"},
        {"GRAPHD_TIMEOUT_MS", "-5", "GRAPHD_TIMEOUT_MS=-5 is not valid"},
        {"GRAPHD_TIMEOUT_MS", " 5", "GRAPHD_TIMEOUT_MS= 5 is not valid"},
        {"GRAPHD_TIMEOUT_MS", "99999999999999999999999", "expected an integer from 1 to"},
        {"GRAPHD_SPIN_US", "100001",
         "GRAPHD_SPIN_US=100001 is not valid: expected an integer from 0 to 100000"},
        {"GRAPHD_SPIN_US", "10us", "GRAPHD_SPIN_US=10us is not valid"},
        {"GRAPHD_REPLAY_ORDER", "fast",
         "GRAPHD_REPLAY_ORDER=fast is not valid: expected one of posted, events, sync"},
        {"GRAPHD_REPLAY_ORDER", "Events", "GRAPHD_REPLAY_ORDER=Events is not valid"},
        {"GRAPHD_COPY_PARAM_GRADS", "true",
         "GRAPHD_COPY_PARAM_GRADS=true is not valid: expected 0 or 1"},
        {"GRAPHD_REPLAY_PROFILE", "yes", "GRAPHD_REPLAY_PROFILE=yes is not valid: expected 0 or 1"},
        {"GRAPHD_REPLAY_RING", "on", "GRAPHD_REPLAY_RING=on is not valid: expected 0 or 1"},
        {"GRAPHD_SLOW_CAPTURE_S", "86401",
         "GRAPHD_SLOW_CAPTURE_S=86401 is not valid: expected an integer from 0 to 86400"},
        /* Addresses gRPC would take for DNS names or fail on with its own words. */
        {"GRAPHD_ADDRESS", "relative.sock",
         "GRAPHD_ADDRESS=relative.sock is not valid: expected unix:/ABSOLUTE/PATH"},
        {"GRAPHD_ADDRESS", "unix:run/g.sock", "a unix socket path must be absolute"},
        {"GRAPHD_ADDRESS", "http://localhost:7070", "(not a URL)"},
        {"GRAPHD_ADDRESS", "/run/graphd/graphd.sock.session",
         "that is graphd's session socket (its data plane); give the control socket, "
         "unix:/run/graphd/graphd.sock"},
        {"GRAPHD_ADDRESS", "localhost:http", "HOST:PORT"},
        {"GRAPHD_ADDRESS", "localhost:70000", "HOST:PORT"},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        setenv(cases[i].name, cases[i].bad, 1);
        refused(cases[i].name, cases[i].want);
        unsetenv(cases[i].name);
    }
    /* A value too long for any buffer is refused, not cut. */
    char *long_path = malloc(5000);
    assert_non_null(long_path);
    memset(long_path, 'a', 4999);
    long_path[0] = '/';
    long_path[4999] = '\0';
    setenv("GRAPHD_ADDRESS", long_path, 1);
    free(long_path);
    refused("GRAPHD_ADDRESS", "GRAPHD_ADDRESS is not valid: longer than 4095 bytes");
}

static void two_calls_unknown_names_and_the_tls_file(void **state)
{
    (void)state;
    setenv("GRAPHD_REPLAY_ORDER", "events", 1);
    size_t len = 0;
    assert_int_equal(graphd_setting("GRAPHD_REPLAY_ORDER", NULL, &len), GRAPHD_OK);
    assert_int_equal(len, sizeof("events"));
    char small[3];
    len = sizeof(small);
    assert_int_equal(graphd_setting("GRAPHD_REPLAY_ORDER", small, &len), GRAPHD_ETRUNC);
    assert_int_equal(len, sizeof("events"));
    assert_int_equal(graphd_setting("GRAPHD_NO_SUCH", NULL, &len), GRAPHD_ENOT_FOUND);
    assert_string_equal(graphd_last_error(NULL), "GRAPHD_NO_SUCH is not a graphd client setting");
    assert_int_equal(graphd_setting(NULL, NULL, &len), GRAPHD_ENOT_FOUND);
    assert_int_equal(graphd_setting("GRAPHD_SPIN_US", NULL, NULL), GRAPHD_EINVALID_ARGUMENT);

    /* GRAPHD_TLS_CA is read for a TCP address only; a file that is not there is named. */
    setenv("GRAPHD_TLS_CA", "/nonexistent/ca.pem", 1);
    graphd_client_t *c;
    assert_int_equal(graphd_connect("unix:/tmp/z.sock", &c), GRAPHD_OK);
    graphd_close(c);
    assert_int_equal(graphd_connect("localhost:7070", &c), GRAPHD_ESYS);
    assert_null(c);
    assert_non_null(strstr(graphd_last_error(NULL), "GRAPHD_TLS_CA=/nonexistent/ca.pem"));
}

static void version_is_the_build_one(void **state)
{
    (void)state;
    assert_string_equal(graphd_version(), GRAPHD_VERSION); /* -DGRAPHD_VERSION: VERSION's text */
    assert_true(strlen(graphd_version()) > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(the_table_lists_every_setting, setup),
        cmocka_unit_test_setup(defaults_when_unset_or_empty, setup),
        cmocka_unit_test_setup(values_are_normalized, setup),
        cmocka_unit_test_setup(invalid_values_name_variable_value_and_what_is_accepted, setup),
        cmocka_unit_test_setup(two_calls_unknown_names_and_the_tls_file, setup),
        cmocka_unit_test_setup(version_is_the_build_one, setup),
    };
    return cmocka_run_group_tests_name("client_settings", tests, NULL, NULL);
}
