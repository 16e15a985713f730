/*
 * graphctl against a real daemon: status as JSON and as tables, pool
 * create/delete with their exit codes, usage errors, and the one-line
 * failure when the daemon is not there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "../lib/harness.h"

#define OUT_MAX 65536

typedef struct run {
    int status;
    char out[OUT_MAX];
    char err[OUT_MAX];
} run_t;

static run_t result;

/* Runs graphctl with args (NULL-terminated, at most 10) into result. */
static run_t *graphctl_argv(const char *const *args)
{
    static char path[PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/graphctl", harness_build_dir());
    const char *argv[12] = {path};
    int n = 1;
    for (; args[n - 1] != NULL && n < 11; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    result.status =
        harness_run(argv, result.out, sizeof(result.out), result.err, sizeof(result.err), 10000);
    return &result;
}

#define graphctl(...) graphctl_argv((const char *const[]){__VA_ARGS__, NULL})

static int count_lines(const char *s)
{
    int n = 0;
    for (; *s != '\0'; s++)
        n += *s == '\n';
    return n;
}

static void status_json_lists_cpu(void **state)
{
    harness_t *h = *state;
    run_t *r = graphctl("--address", h->address, "status", "--json");
    assert_int_equal(r->status, 0);
    assert_string_equal(r->err, "");
    json_error_t jerr;
    json_t *root = json_loads(r->out, 0, &jerr);
    if (root == NULL)
        fail_msg("graphctl status --json is not JSON: %s\n%s", jerr.text, r->out);
    json_t *cpu = harness_find(json_object_get(root, "devices"), "id", "cpu:0");
    assert_non_null(cpu);
    assert_string_equal(json_string_value(json_object_get(cpu, "kind")), "cpu");
    assert_true(json_is_false(json_object_get(cpu, "mps"))); /* written although false */
    assert_non_null(harness_find(json_object_get(root, "pools"), "name", "default"));
    json_t *daemon = json_object_get(root, "daemon");
    assert_true(json_is_object(daemon));
    assert_true(json_is_string(json_object_get(daemon, "version")));
    assert_true(harness_int(daemon, "pid") == (long long)h->pid);
    /* Config is keyed by setting name. */
    json_t *listen = json_object_get(json_object_get(daemon, "config"), "listen");
    assert_string_equal(json_string_value(json_object_get(listen, "value")), h->address);
    assert_true(json_is_boolean(json_object_get(listen, "reloadable")));
    assert_true(json_is_array(json_object_get(root, "sessions")));
    json_decref(root);
}

static void status_tables(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "table-client");
    assert_non_null(c);
    graphd_region_t *reg;
    assert_int_equal(graphd_region_alloc(c, NULL, 3 << 19, &reg), GRAPHD_OK); /* 1.5 MiB */

    run_t *r = graphctl("--address", h->address, "status");
    assert_int_equal(r->status, 0);
    const char *want[] = {"# Daemon", "# Devices",    "# Pools", "# Sessions", "cpu:0",
                          "default",  "table-client", "1.5 MiB", "ago",        "uptime"};
    for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
        if (strstr(r->out, want[i]) == NULL)
            fail_msg("'%s' missing from graphctl status:\n%s", want[i], r->out);
    graphd_close(c);
    graphd_region_release(reg);

    r = graphctl("--address", h->address, "devices");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "cpu:0"));
    r = graphctl("--address", h->address, "--json", "devices");
    assert_int_equal(r->status, 0);
    json_t *devs = json_loads(r->out, 0, NULL);
    json_t *cpu = harness_find(devs, "id", "cpu:0");
    assert_non_null(cpu);
    assert_true(json_is_false(json_object_get(cpu, "mps")));
    json_decref(devs);
}

static void pool_create_delete(void **state)
{
    harness_t *h = *state;
    run_t *r = graphctl("--address", h->address, "pool", "create", "it-ctl", "--limit", "2Mi");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "it-ctl"));

    r = graphctl("--address", h->address, "--json", "pools");
    assert_int_equal(r->status, 0);
    json_t *pools = json_loads(r->out, 0, NULL);
    json_t *p = harness_find(pools, "name", "it-ctl");
    assert_non_null(p);
    assert_int_equal(harness_int(p, "limit_bytes"), 2 << 20);
    assert_string_equal(json_string_value(json_object_get(p, "device")), "cpu:0");
    /* The graph mempool figures (CUDA pools; 0 on the CPU). */
    assert_non_null(json_object_get(p, "graph_mempool_reserved_bytes"));
    assert_int_equal(harness_int(p, "graph_mempool_reserved_bytes"), 0);
    assert_int_equal(harness_int(p, "graph_mempool_in_use_bytes"), 0);
    json_decref(pools);

    r = graphctl("--address", h->address, "pools");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "it-ctl"));
    assert_non_null(strstr(r->out, "2 MiB"));
    assert_non_null(strstr(r->out, "MEMPOOL"));
    assert_non_null(strstr(r->out, "MEMPOOL_USED"));

    /* Daemon-side errors: exit 1, one line naming the status. */
    r = graphctl("--address", h->address, "pool", "create", "it-ctl");
    assert_int_equal(r->status, 1);
    assert_int_equal(count_lines(r->err), 1);
    assert_non_null(strstr(r->err, "ALREADY_EXISTS"));
    assert_non_null(strstr(r->err, "graphctl: pool create it-ctl: "));
    r = graphctl("--address", h->address, "pool", "create", "bad name");
    assert_int_equal(r->status, 1);
    assert_non_null(strstr(r->err, "INVALID_ARGUMENT"));

    r = graphctl("--address", h->address, "pool", "delete", "it-ctl");
    assert_int_equal(r->status, 0);
    r = graphctl("--address", h->address, "pool", "delete", "it-ctl");
    assert_int_equal(r->status, 1);
    assert_int_equal(count_lines(r->err), 1);
    assert_non_null(strstr(r->err, "NOT_FOUND"));

    r = graphctl("--address", h->address, "pool", "create", "it-ctl2", "--limit", "1500K",
                 "--device", "cpu:0", "--json");
    assert_int_equal(r->status, 0);
    json_t *created = json_loads(r->out, 0, NULL);
    assert_int_equal(harness_int(created, "limit_bytes"), 1500000);
    json_decref(created);
    r = graphctl("--address", h->address, "pool", "delete", "it-ctl2");
    assert_int_equal(r->status, 0);
}

static void usage_errors(void **state)
{
    harness_t *h = *state;
    run_t *r = graphctl("--help");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "usage: graphctl"));
    r = graphctl("--version");
    assert_int_equal(r->status, 0);
    assert_non_null(strstr(r->out, "graphctl "));

    const char *bad[][6] = {
        {NULL},
        {"bogus", NULL},
        {"--bogus", "status", NULL},
        {"pool", NULL},
        {"pool", "create", NULL},
        {"pool", "create", "x", "--limit", "12X", NULL},
        {"pool", "create", "x", "--limit", "-1", NULL},
        {"pool", "create", "x", "--limit", "99999999999999999999", NULL},
        {"status", "--limit", "1", NULL},
        {"status", "extra", NULL},
        {"--address", NULL},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        r = graphctl(bad[i][0] ? "--address" : NULL, h->address, bad[i][0], bad[i][1], bad[i][2],
                     bad[i][3], bad[i][4]);
        if (r->status != 2 || count_lines(r->err) != 1)
            fail_msg("usage case %zu ('%s ...'): exit %d, stderr '%s'", i,
                     bad[i][0] ? bad[i][0] : "", r->status, r->err);
    }
}

static void missing_daemon_one_line(void **state)
{
    (void)state;
    int64_t t0 = harness_now_ms();
    run_t *r = graphctl("--address", "unix:/tmp/graphd-it-nowhere/graphd.sock", "status");
    assert_true(harness_now_ms() - t0 < 3000);
    assert_int_equal(r->status, 1);
    assert_string_equal(r->out, "");
    assert_int_equal(count_lines(r->err), 1);
    const char *want = "graphctl: cannot reach graphd at unix:/tmp/graphd-it-nowhere/graphd.sock: "
                       "UNAVAILABLE";
    if (strncmp(r->err, want, strlen(want)) != 0)
        fail_msg("stderr: %s", r->err);
    r = graphctl("--address", "unix:/tmp/graphd-it-nowhere/graphd.sock", "pool", "create", "x");
    assert_int_equal(r->status, 1);
    assert_int_equal(count_lines(r->err), 1);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(status_json_lists_cpu),   cmocka_unit_test(status_tables),
        cmocka_unit_test(pool_create_delete),      cmocka_unit_test(usage_errors),
        cmocka_unit_test(missing_daemon_one_line),
    };
    return cmocka_run_group_tests_name("graphctl", tests, harness_group_setup,
                                       harness_group_teardown);
}
