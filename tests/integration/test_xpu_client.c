/*
 * xpu regions through libgraphd's public API (graphd_region_alloc_device, graphd_region_read/
 * write, graphd_region_free), against a daemon that serves xpu:0 and xpu:1 from Debian's real
 * Level Zero loader and the test driver (tests/ze_driver/, ZE_ENABLE_ALT_DRIVERS, for the daemon
 * and for this process, which maps the regions in its own context through libgraphd's xpu row).
 * The daemon's side of each region is checked by the driver's free log (GRAPHD_ZE_TEST_FREE_LOG:
 * the first bytes the daemon's allocation held when it was freed), so a write here is seen there.
 * The suite runs twice, in re-executed children: the loader passing calls through, and with
 * ZE_ENABLE_LOADER_INTERCEPT=1.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../ze_driver/ze_test_util.h"

#define MiB (1024u * 1024u)

static char self_exe[PATH_MAX];

typedef struct fixture {
    harness_t h;
    graphd_client_t *c;
    char free_log[HARNESS_PATH_MAX + 16];
} fixture_t;

/* A daemon whose driver logs frees to a file of its own and, with dirty, hands out memory full
 * of 0xa5 (so that a zero read here is the daemon's fill). */
static void start(fixture_t *f, const char *tag, int dirty)
{
    memset(f, 0, sizeof(*f));
    snprintf(f->free_log, sizeof(f->free_log), "/tmp/graphd-xpuc-%s-%d.log", tag, (int)getpid());
    unlink(f->free_log);
    setenv("GRAPHD_ZE_TEST_FREE_LOG", f->free_log, 1);
    if (dirty)
        setenv("GRAPHD_ZE_TEST_DIRTY_ALLOC", "165", 1);
    assert_int_equal(harness_start(&f->h, NULL), 0);
    unsetenv("GRAPHD_ZE_TEST_FREE_LOG");
    unsetenv("GRAPHD_ZE_TEST_DIRTY_ALLOC");
    f->c = harness_client(&f->h, "xpu-client");
    assert_non_null(f->c);
}

static void stop(fixture_t *f)
{
    graphd_close(f->c);
    assert_int_equal(harness_stop(&f->h), 0);
    unlink(f->free_log);
}

static graphd_pool_t pool_of(graphd_client_t *c, const char *name)
{
    graphd_pool_t items[16];
    size_t n = 16;
    assert_int_equal(graphd_list_pools(c, &n, items), GRAPHD_OK);
    for (size_t i = 0; i < n; i++)
        if (strcmp(items[i].name, name) == 0)
            return items[i];
    fail_msg("no pool %s", name);
    graphd_pool_t none = {0};
    return none;
}

static void expect_pool_empty(graphd_client_t *c, const char *name)
{
    int64_t end = harness_now_ms() + 5000;
    graphd_pool_t p;
    while ((p = pool_of(c, name)).regions != 0 && harness_now_ms() < end)
        usleep(20000);
    assert_int_equal(p.regions, 0);
    assert_int_equal(p.reserved_bytes, 0);
    assert_int_equal(p.used_bytes, 0);
}

/* Waits up to 5 s for the driver's free log to hold line. */
static void expect_freed(const fixture_t *f, const char *line)
{
    int64_t end = harness_now_ms() + 5000;
    for (;;) {
        char buf[8192] = "";
        FILE *fp = fopen(f->free_log, "r");
        if (fp) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
            buf[n] = '\0';
            fclose(fp);
        }
        if (strstr(buf, line))
            return;
        if (harness_now_ms() > end)
            fail_msg("the daemon's driver never freed '%s'; its log:\n%s", line, buf);
        usleep(20000);
    }
}

static void hex16(const uint8_t *b, char *out)
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

/* alloc_device on xpu:dev, read the daemon's zero fill, write a pattern, read it back, free: the
 * daemon's memory held the pattern when it was freed, and the pool's figures are back. */
static void roundtrip_on(fixture_t *f, unsigned dev, uint64_t size)
{
    char pool[16], device[16];
    snprintf(pool, sizeof(pool), "xp%u", dev);
    snprintf(device, sizeof(device), "xpu:%u", dev);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(f->c, pool, device, 8 * MiB, &info), GRAPHD_OK);
    graphd_region_t *r = NULL;
    int rc = graphd_region_alloc_device(f->c, pool, size, &r);
    if (rc != GRAPHD_OK)
        fail_msg("alloc_device on %s: %s: %s", device, graphd_err_name(rc),
                 graphd_last_error(f->c));
    assert_int_equal(graphd_region_is_device(r), 1);
    assert_int_equal(graphd_region_size(r), size);
    graphd_pool_t p = pool_of(f->c, pool);
    assert_int_equal(p.regions, 1);
    assert_int_equal(p.used_bytes, size);

    uint8_t *buf = malloc(size), *pat = malloc(size);
    assert_non_null(buf);
    assert_non_null(pat);
    assert_int_equal(graphd_region_read(r, 0, buf, size), GRAPHD_OK);
    for (uint64_t i = 0; i < size; i++)
        if (buf[i] != 0)
            fail_msg("byte %llu of a new %s region reads 0x%02x, not the daemon's zero fill",
                     (unsigned long long)i, device, buf[i]);
    for (uint64_t i = 0; i < size; i++)
        pat[i] = (uint8_t)(i * 13 + 1 + dev);
    assert_int_equal(graphd_region_write(r, 0, pat, size), GRAPHD_OK);
    assert_int_equal(graphd_region_read(r, 0, buf, size), GRAPHD_OK);
    assert_memory_equal(buf, pat, size);
    /* past the end: refused, with the figures in the message */
    assert_int_equal(graphd_region_write(r, size, pat, 1), GRAPHD_EINVALID_ARGUMENT);
    assert_non_null(strstr(graphd_last_error(f->c), "pass the end of region"));

    assert_int_equal(graphd_region_free(f->c, r), GRAPHD_OK);
    char line[128], hex[33];
    hex16(pat, hex);
    snprintf(line, sizeof(line), "free %u %llu %s", dev, (unsigned long long)size, hex);
    expect_freed(f, line);
    expect_pool_empty(f->c, pool);
    free(buf);
    free(pat);
}

static void region_roundtrip_xpu0(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "rt0", 1);
    roundtrip_on(&f, 0, MiB + 100);
    stop(&f);
}

static void region_roundtrip_xpu1(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "rt1", 1);
    roundtrip_on(&f, 1, 4096);
    stop(&f);
}

/* graphd_region_map by id of an xpu region: the MAP reply names its device (here xpu:1, not the
 * default), so the region opens there: a second mapping of the same memory in this process. */
static void map_by_id_of_xpu_region(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "map", 0);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(f.c, "xp", "xpu:1", 0, &info), GRAPHD_OK);
    graphd_region_t *r = NULL, *again = NULL;
    assert_int_equal(graphd_region_alloc_device(f.c, "xp", 4096, &r), GRAPHD_OK);
    uint8_t pat[4096], buf[4096];
    for (size_t i = 0; i < sizeof(pat); i++)
        pat[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(graphd_region_write(r, 0, pat, sizeof(pat)), GRAPHD_OK);
    int rc = graphd_region_map(f.c, graphd_region_id(r), &again);
    if (rc != GRAPHD_OK)
        fail_msg("graphd_region_map of an xpu:1 region: %s: %s", graphd_err_name(rc),
                 graphd_last_error(f.c));
    assert_int_equal(graphd_region_is_device(again), 1);
    assert_int_equal(graphd_region_size(again), 4096);
    assert_int_equal(graphd_region_read(again, 0, buf, sizeof(buf)), GRAPHD_OK);
    assert_memory_equal(buf, pat, sizeof(buf));
    memset(pat, 0x3c, 16);
    assert_int_equal(graphd_region_write(again, 0, pat, 16), GRAPHD_OK);
    assert_int_equal(graphd_region_read(r, 0, buf, 16), GRAPHD_OK);
    assert_memory_equal(buf, pat, 16);
    graphd_region_release(again);
    assert_int_equal(graphd_region_free(f.c, r), GRAPHD_OK);
    expect_freed(&f, "free 1 4096 3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c3c");
    expect_pool_empty(f.c, "xp");
    stop(&f);
}

/* graphd_events_*: the session's event pool on xpu:0, opened here; signal, query, reset and
 * wait; the refusals; and graphd_goodbye has the daemon signal every event. */
static void events_through_libgraphd(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "ev", 0);
    graphd_client_t *c = harness_client(&f.h, "events");
    assert_non_null(c);
    graphd_events_t *e = NULL;
    assert_int_equal(graphd_events_open(c, "cuda:0", 4, &e), GRAPHD_EUNIMPLEMENTED);
    assert_non_null(strstr(graphd_last_error(c), "graphd_replay_stream"));
    assert_int_equal(graphd_events_open(c, "cpu:0", 4, &e), GRAPHD_EINVALID_ARGUMENT);
    assert_non_null(strstr(graphd_last_error(c), "xpu:0"));
    assert_int_equal(graphd_events_open(c, "xpu:0", GRAPHD_EVENTS_MAX + 1, &e),
                     GRAPHD_EINVALID_ARGUMENT);
    assert_int_equal(graphd_events_open(c, "xpu:9", 4, &e), GRAPHD_ENOT_FOUND);
    assert_null(e);
    int rc = graphd_events_open(c, "xpu:0", 4, &e);
    if (rc != GRAPHD_OK)
        fail_msg("graphd_events_open: %s: %s", graphd_err_name(rc), graphd_last_error(c));
    assert_int_equal(graphd_events_count(e), 4);
    graphd_events_t *twice = NULL;
    assert_int_equal(graphd_events_open(c, "xpu:0", 4, &twice), GRAPHD_EALREADY_EXISTS);
    for (unsigned k = 0; k < 4; k++)
        assert_int_equal(graphd_events_query(e, k), 0);
    assert_int_equal(graphd_events_signal(e, 3), GRAPHD_OK);
    assert_int_equal(graphd_events_query(e, 3), 1);
    assert_int_equal(graphd_events_wait(e, 3, UINT64_MAX), GRAPHD_OK);
    assert_int_equal(graphd_events_reset(e, 3), GRAPHD_OK);
    assert_int_equal(graphd_events_wait(e, 3, 1000), GRAPHD_EDEADLINE_EXCEEDED);
    assert_non_null(strstr(graphd_last_error(c), "not signalled"));
    assert_int_equal(graphd_events_query(e, 4), GRAPHD_EINVALID_ARGUMENT);
    assert_non_null(strstr(graphd_last_error(c), "event 4"));

    assert_int_equal(graphd_goodbye(c), GRAPHD_OK);
    graphd_close(c);                 /* e keeps what it needs */
    for (unsigned k = 0; k < 4; k++) /* 30 s: a guard against a hang, not a measure */
        assert_int_equal(graphd_events_wait(e, k, 30ull * 1000000000ull), GRAPHD_OK);
    graphd_events_release(e);
    graphd_events_release(NULL);
    stop(&f);
}

/* Goodbye: libgraphd closes the mapping, the daemon frees the region; the handle stays until
 * released and refuses reads. */
static void reclaimed_on_goodbye(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "bye", 0);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(f.c, "xp", "xpu:1", 0, &info), GRAPHD_OK);
    graphd_client_t *c = harness_client(&f.h, "leaver");
    assert_non_null(c);
    graphd_region_t *r = NULL;
    assert_int_equal(graphd_region_alloc_device(c, "xp", 70000, &r), GRAPHD_OK);
    uint8_t b[16];
    memset(b, 0x77, sizeof(b));
    assert_int_equal(graphd_region_write(r, 0, b, sizeof(b)), GRAPHD_OK);
    assert_int_equal(graphd_goodbye(c), GRAPHD_OK);
    expect_freed(&f, "free 1 70000 77777777777777777777777777777777");
    expect_pool_empty(f.c, "xp");
    assert_int_equal(graphd_region_read(r, 0, b, sizeof(b)), GRAPHD_EFAILED_PRECONDITION);
    assert_non_null(strstr(graphd_last_error(c), "unmapped"));
    graphd_region_release(r);
    graphd_close(c);
    stop(&f);
}

/* Role "tenant": through libgraphd, allocates a 64 KiB xpu:0 region in pool xp of the daemon at
 * address, writes 0x5c into it, says "ready" on stdout and waits to be killed. */
static int tenant_main(const char *address)
{
    graphd_client_t *c = NULL;
    if (graphd_connect(address, &c) != GRAPHD_OK || graphd_hello(c, "tenant") != GRAPHD_OK)
        return 3;
    graphd_region_t *r = NULL;
    if (graphd_region_alloc_device(c, "xp", 65536, &r) != GRAPHD_OK) {
        fprintf(stderr, "tenant: %s\n", graphd_last_error(c));
        return 4;
    }
    static uint8_t b[65536];
    memset(b, 0x5c, sizeof(b));
    if (graphd_region_write(r, 0, b, sizeof(b)) != GRAPHD_OK)
        return 5;
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* A libgraphd client SIGKILLed while it holds an xpu region: the daemon reclaims it. */
static void reclaimed_on_sigkill(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, "kill", 0);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(f.c, "xp", "xpu:0", 0, &info), GRAPHD_OK);
    char *argv[] = {self_exe, "--role", "tenant", f.h.address, NULL};
    pid_t pid = zt_spawn_until(argv, "ready", 10000);
    assert_true(pid > 0);
    graphd_pool_t k = pool_of(f.c, "xp");
    assert_int_equal(k.regions, 1);
    assert_int_equal(k.used_bytes, 65536);
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    expect_freed(&f, "free 0 65536 5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c");
    expect_pool_empty(f.c, "xp");
    stop(&f);
}

/* graphctl devices and status, text and JSON: xpu:0 and xpu:1 with their properties and
 * telemetry; with Sysman absent (GRAPHD_ZE_TEST_NO_SYSMAN=1) its values are left out of the
 * JSON, not shown as 0. */
static void graphctl_shows(int sysman)
{
    fixture_t f;
    if (!sysman)
        setenv("GRAPHD_ZE_TEST_NO_SYSMAN", "1", 1);
    start(&f, "ctl", 0);
    unsetenv("GRAPHD_ZE_TEST_NO_SYSMAN");
    char path[HARNESS_PATH_MAX + 16];
    static char out[65536], err[4096];
    snprintf(path, sizeof(path), "%s/graphctl", harness_build_dir());

    /* the telemetry needs the daemon's second read for utilisation */
    int64_t end = harness_now_ms() + 5000;
    json_t *doc = NULL;
    for (;;) {
        const char *as_json[] = {path, "--address", f.h.address, "--json", "devices", NULL};
        assert_int_equal(harness_run(as_json, out, sizeof(out), err, sizeof(err), 10000), 0);
        json_error_t jerr;
        doc = json_loads(out, 0, &jerr);
        assert_non_null(doc);
        json_t *t = json_object_get(harness_find(doc, "id", "xpu:1"), "telemetry");
        if (!sysman || json_object_get(t, "utilisation") != NULL || harness_now_ms() > end)
            break;
        json_decref(doc);
        usleep(100000);
    }
    for (int i = 0; i < 2; i++) {
        char id[16];
        snprintf(id, sizeof(id), "xpu:%d", i);
        json_t *d = harness_find(doc, "id", id);
        assert_non_null(d);
        assert_int_equal(harness_int(d, "compute_units"), i ? 96 : 64);
        assert_int_equal(strlen(json_string_value(json_object_get(d, "uuid"))), 32);
        json_t *t = json_object_get(d, "telemetry");
        assert_true(json_is_object(t));
        if (sysman) {
            assert_int_equal(harness_int(t, "memory_total"), 256ll * MiB);
            assert_non_null(json_object_get(t, "engine_active_us"));
            assert_false(json_is_true(json_object_get(t, "wedged")));
        } else {
            static const char *const absent[] = {"memory_free", "memory_total", "engine_active_us",
                                                 "utilisation", "wedged"};
            for (size_t k = 0; k < sizeof(absent) / sizeof(absent[0]); k++)
                if (json_object_get(t, absent[k]) != NULL)
                    fail_msg("%s telemetry without Sysman has %s: %s", id, absent[k], out);
        }
    }
    if (sysman)
        assert_non_null(json_object_get(
            json_object_get(harness_find(doc, "id", "xpu:1"), "telemetry"), "utilisation"));
    /* the cpu device has no telemetry and no xpu properties */
    json_t *cpu = harness_find(doc, "id", "cpu:0");
    assert_true(json_is_null(json_object_get(cpu, "telemetry")));
    assert_null(json_object_get(cpu, "compute_units"));
    json_decref(doc);

    /* status --json: the same absences */
    const char *st_json[] = {path, "--address", f.h.address, "--json", "status", NULL};
    assert_int_equal(harness_run(st_json, out, sizeof(out), err, sizeof(err), 10000), 0);
    json_error_t jerr;
    doc = json_loads(out, 0, &jerr);
    assert_non_null(doc);
    json_t *devs = json_object_get(doc, "devices");
    json_t *t = json_object_get(harness_find(devs, "id", "xpu:0"), "telemetry");
    assert_true(json_is_object(t));
    assert_true((json_object_get(t, "memory_free") != NULL) == (sysman != 0));
    assert_null(json_object_get(harness_find(devs, "id", "cpu:0"), "compute_units"));
    json_decref(doc);

    /* text: the xpu rows with name, UUID and driver; absent values are "-" */
    const char *table[] = {path, "--address", f.h.address, "status", NULL};
    assert_int_equal(harness_run(table, out, sizeof(out), err, sizeof(err), 10000), 0);
    assert_non_null(strstr(out, "UUID"));
    const char *row = strstr(out, "\nxpu:1 ");
    assert_non_null(row);
    const char *eol = strchr(row + 1, '\n');
    assert_non_null(eol);
    char line[1024];
    snprintf(line, sizeof(line), "%.*s", (int)(eol - row - 1), row + 1);
    assert_non_null(strstr(line, "graphd test XPU 1"));
    assert_non_null(strstr(line, "Level Zero 1."));
    assert_non_null(strstr(line, "  96  "));
    if (!sysman)
        assert_null(strstr(line, "  0  ")); /* no telemetry 0 standing in for "unknown" */
    else
        assert_non_null(strstr(line, "  ok  ")); /* memory health */
    stop(&f);
}

static void graphctl_shows_telemetry(void **state)
{
    (void)state;
    graphctl_shows(1);
}

static void graphctl_without_sysman_shows_absent(void **state)
{
    (void)state;
    graphctl_shows(0);
}

static int run_suite(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(region_roundtrip_xpu0),
        cmocka_unit_test(region_roundtrip_xpu1),
        cmocka_unit_test(map_by_id_of_xpu_region),
        cmocka_unit_test(events_through_libgraphd),
        cmocka_unit_test(reclaimed_on_goodbye),
        cmocka_unit_test(reclaimed_on_sigkill),
        cmocka_unit_test(graphctl_shows_telemetry),
        cmocka_unit_test(graphctl_without_sysman_shows_absent),
    };
    return cmocka_run_group_tests_name(getenv("ZE_ENABLE_LOADER_INTERCEPT")
                                           ? "xpu client (ZE_ENABLE_LOADER_INTERCEPT=1)"
                                           : "xpu client (loader passing through)",
                                       tests, NULL, NULL);
}

static int run_modes(void)
{
    static const char *const env[] = {"GRAPHD_ZE_TEST_DEVICES=2", NULL};
    return zt_run_modes(self_exe, "test_xpu_client", "XPUC_TEST_SUITE", env, NULL);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 2;
    self_exe[n] = '\0';
    if (argc >= 4 && strcmp(argv[1], "--role") == 0 && strcmp(argv[2], "tenant") == 0)
        return tenant_main(argv[3]);
    if (getenv("XPUC_TEST_SUITE") == NULL)
        return run_modes();
    return run_suite();
}
