/*
 * graphctl against a real daemon: status as JSON and as tables (the
 * executors' table too, as root and as a tenant), pool create/delete with
 * their exit codes, usage errors, and the one-line failure when the daemon
 * is not there.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

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
    /* The graph mempool is CUDA's: no such columns for pools on the CPU. */
    assert_null(strstr(r->out, "MEMPOOL"));

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

    /* The daemon's size grammar (graphd.conf), spaces and case included: one parser. */
    r = graphctl("--address", h->address, "pool", "create", "it-ctl3", "--limit", "5 MiB",
                 "--json");
    assert_int_equal(r->status, 0);
    created = json_loads(r->out, 0, NULL);
    assert_int_equal(harness_int(created, "limit_bytes"), 5 << 20);
    json_decref(created);
    r = graphctl("--address", h->address, "pool", "delete", "it-ctl3");
    assert_int_equal(r->status, 0);
    r = graphctl("--address", h->address, "pool", "create", "it-ctl4", "--limit", "2gib", "--json");
    assert_int_equal(r->status, 0);
    created = json_loads(r->out, 0, NULL);
    assert_int_equal(harness_int(created, "limit_bytes"), 2LL << 30);
    json_decref(created);
    r = graphctl("--address", h->address, "pool", "delete", "it-ctl4");
    assert_int_equal(r->status, 0);
}

/* The lines of section title ("# Executors") in graphctl's table output: *header gets its
 * header line; the rows follow it up to the blank line. NULL when the section is missing. */
static char *section_of(const char *out, const char *title, char *header, size_t size)
{
    char want[64];
    snprintf(want, sizeof(want), "%s\n", title);
    const char *p = strstr(out, want);
    if (p == NULL)
        return NULL;
    p += strlen(want);
    const char *nl = strchr(p, '\n');
    if (nl == NULL)
        return NULL;
    snprintf(header, size, "%.*s", (int)(nl - p), p);
    const char *end = strstr(nl, "\n\n");
    return strndup(nl + 1, end ? (size_t)(end - nl) : strlen(nl + 1));
}

/* The header line split at runs of spaces must be exactly want (NULL-terminated). */
static void expect_columns(const char *header, const char *const *want)
{
    char copy[512], *save = NULL;
    snprintf(copy, sizeof(copy), "%s", header);
    size_t i = 0;
    for (char *tok = strtok_r(copy, " ", &save); tok; tok = strtok_r(NULL, " ", &save), i++)
        if (want[i] == NULL || strcmp(tok, want[i]) != 0)
            fail_msg("executors header '%s': column %zu is '%s', want '%s'", header, i, tok,
                     want[i] ? want[i] : "(none)");
    if (want[i] != NULL)
        fail_msg("executors header '%s': column '%s' is missing", header, want[i]);
}

/* The row of rows whose first two cells are uid and device; NULL when none. */
static const char *executor_row(const char *rows, const char *uid, const char *device)
{
    static char line[512];
    for (const char *p = rows; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL) {
        const char *nl = strchr(p, '\n');
        snprintf(line, sizeof(line), "%.*s", (int)(nl ? nl - p : (long)strlen(p)), p);
        char a[64] = "", b[64] = "";
        if (sscanf(line, "%63s %63s", a, b) == 2 && strcmp(a, uid) == 0 && strcmp(b, device) == 0)
            return line;
    }
    return NULL;
}

/* status_shows_executors' own daemon and models, stopped by its teardown also when it fails. */
static harness_t exec_h;
static harness_models_t exec_m;

static int stop_exec_daemon(void **state)
{
    (void)state;
    int rc = harness_stop(&exec_h);
    harness_models_remove(&exec_m);
    return rc == 0 ? 0 : -1;
}

/* graphctl status shows an Executors table (uid, device, pid, rss, starts, kills, deaths,
 * sandbox): root sees its executor after a capture, with the pid status gives; a tenant sees
 * none of root's (the header and "(none)"); an executor killed at max_capture_ms shows PID "-"
 * and KILLED_TIME 1. A daemon of its own: socket open to the tenant, a short capture bound. */
static void status_shows_executors(void **state)
{
    (void)state;
    static const char *const cols[] = {"UID",  "USER",    "DEVICE",      "PID",
                                       "RSS",  "STARTS",  "KILLED_TIME", "KILLED_MEM",
                                       "DIED", "SANDBOX", NULL};
    harness_models_t *m = &exec_m;
    assert_int_equal(harness_models_make(m), 0);
    harness_t *h = &exec_h;
    static const char *const args[] = {"--socket-mode", "0666", "--max-capture-ms", "500", NULL};
    assert_int_equal(harness_start(h, args), 0);
    assert_int_equal(chmod(h->dir, 0755), 0);

    graphd_client_t *c = harness_client(h, "exec-ctl");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, m, "mlp.pt");
    assert_true(mid != 0);
    graphd_tensor_spec_t arg = {.dtype = GRAPHD_FLOAT32, .ndim = 2, .shape = {16, 16}};
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.num_warmup_iters = 0;
    graphd_graph_t *g = NULL;
    assert_int_equal(graphd_capture(c, 1, &callable, &opts, &g), GRAPHD_OK);

    run_t *r = graphctl("--address", h->address, "--json", "status");
    assert_int_equal(r->status, 0);
    json_t *js = json_loads(r->out, 0, NULL);
    json_t *ex = harness_find_int(json_object_get(js, "executors"), "uid", 0);
    assert_non_null(ex);
    char pid[32];
    snprintf(pid, sizeof(pid), "%lld", harness_int(ex, "pid"));
    json_decref(js);

    r = graphctl("--address", h->address, "status");
    assert_int_equal(r->status, 0);
    char header[512];
    char *rows = section_of(r->out, "# Executors", header, sizeof(header));
    if (rows == NULL)
        fail_msg("no '# Executors' table in graphctl status:\n%s", r->out);
    expect_columns(header, cols);
    const char *row = executor_row(rows, "0", "root"); /* UID, then USER */
    if (row == NULL)
        fail_msg("no executor row for uid 0 on cpu:0:\n%s\n%s", header, rows);
    char cells[10][64] = {{0}};
    /* USER is root's name; RSS is two words ("163.5 MiB"): STARTS is the 7th word,
     * KILLED_TIME the 8th */
    int n = sscanf(row, "%63s %63s %63s %63s %63s %63s %63s %63s %63s %63s", cells[0], cells[1],
                   cells[2], cells[3], cells[4], cells[5], cells[6], cells[7], cells[8], cells[9]);
    assert_int_equal(n, 10);
    assert_string_equal(cells[1], "root");
    assert_string_equal(cells[3], pid);
    assert_true(strcmp(cells[5], "MiB") == 0 || strcmp(cells[5], "GiB") == 0);
    assert_string_equal(cells[6], "1"); /* starts */
    assert_string_equal(cells[7], "0"); /* killed_time */
    assert_non_null(strstr(row, "no_new_privs"));
    free(rows);

    /* A tenant sees no executor of root's: the table is there, empty. */
    char path[PATH_MAX + 16], out[65536], err[4096];
    snprintf(path, sizeof(path), "%s/graphctl", harness_build_dir());
    const char *argv[] = {"/usr/bin/setpriv", "--reuid=4301", "--regid=4301",
                          "--clear-groups",   path,           "--address",
                          h->address,         "status",       NULL};
    int rc = harness_run(argv, out, sizeof(out), err, sizeof(err), 10000);
    if (rc != 0)
        fail_msg("graphctl as uid 4301: exit %d: %s", rc, err);
    rows = section_of(out, "# Executors", header, sizeof(header));
    if (rows == NULL)
        fail_msg("no '# Executors' table for uid 4301:\n%s", out);
    expect_columns(header, cols);
    assert_string_equal(rows, "(none)\n");
    free(rows);

    /* Killed at max_capture_ms: not running (PID "-") and counted. */
    uint64_t forever = harness_models_register(c, m, "forever.pt");
    assert_true(forever != 0);
    graphd_tensor_spec_t arg1 = {.dtype = GRAPHD_FLOAT32, .ndim = 1, .shape = {4}};
    graphd_callable_t stuck = {forever, NULL, 1, &arg1};
    graphd_graph_t *g2 = NULL;
    assert_int_equal(graphd_capture(c, 1, &stuck, &opts, &g2), GRAPHD_EDEADLINE_EXCEEDED);
    r = graphctl("--address", h->address, "status");
    assert_int_equal(r->status, 0);
    rows = section_of(r->out, "# Executors", header, sizeof(header));
    assert_non_null(rows);
    row = executor_row(rows, "0", "root");
    assert_non_null(row);
    n = sscanf(row, "%63s %63s %63s %63s %63s %63s %63s %63s", cells[0], cells[1], cells[2],
               cells[3], cells[4], cells[5], cells[6], cells[7]);
    if (n != 8 || strcmp(cells[3], "-") != 0 || strcmp(cells[7], "1") != 0)
        fail_msg("after the kill, want PID '-' and KILLED_TIME 1:\n%s\n%s", header, rows);
    free(rows);

    graphd_graph_release(g);
    graphd_close(c);
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
        cmocka_unit_test(status_json_lists_cpu),
        cmocka_unit_test(status_tables),
        cmocka_unit_test(pool_create_delete),
        cmocka_unit_test_teardown(status_shows_executors, stop_exec_daemon),
        cmocka_unit_test(usage_errors),
        cmocka_unit_test(missing_daemon_one_line),
    };
    return cmocka_run_group_tests_name("graphctl", tests, harness_group_setup,
                                       harness_group_teardown);
}
