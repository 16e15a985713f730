/*
 * Regions across sessions: two clients map their own regions and cannot
 * touch each other's; status and ListPools numbers follow every alloc and
 * free; Goodbye frees a session's regions while the client's mapping stays;
 * device memory is refused on a CPU pool.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"

static uint64_t page_round(uint64_t n)
{
    uint64_t page = (uint64_t)sysconf(_SC_PAGESIZE);
    return (n + page - 1) / page * page;
}

static void fill(graphd_region_t *r, uint8_t seed)
{
    uint8_t *p = graphd_region_ptr(r);
    for (uint64_t i = 0; i < graphd_region_size(r); i++)
        p[i] = (uint8_t)(seed + i * 7);
}

static int check(const void *ptr, uint64_t size, uint8_t seed)
{
    const uint8_t *p = ptr;
    for (uint64_t i = 0; i < size; i++)
        if (p[i] != (uint8_t)(seed + i * 7))
            return 0;
    return 1;
}

static void two_clients_are_isolated(void **state)
{
    harness_t *h = *state;
    graphd_client_t *a = harness_client(h, "client-a");
    graphd_client_t *b = harness_client(h, "client-b");
    assert_non_null(a);
    assert_non_null(b);
    assert_int_not_equal(graphd_session_id(a), graphd_session_id(b));

    graphd_region_t *ra, *rb;
    assert_int_equal(graphd_region_alloc(a, NULL, 100000, &ra), GRAPHD_OK);
    assert_int_equal(graphd_region_alloc(b, "default", 5000, &rb), GRAPHD_OK);
    assert_int_equal(graphd_region_size(ra), 100000);
    assert_int_equal(graphd_region_mapped_size(ra), page_round(100000));
    assert_int_equal(graphd_region_size(rb), 5000);
    assert_int_not_equal(graphd_region_id(ra), graphd_region_id(rb));

    fill(ra, 1);
    fill(rb, 2);
    assert_true(check(graphd_region_ptr(ra), 100000, 1));
    assert_true(check(graphd_region_ptr(rb), 5000, 2));

    /* A second mapping of A's region sees A's bytes: it is the same shared memory. */
    graphd_region_t *ra2;
    assert_int_equal(graphd_region_map(a, graphd_region_id(ra), &ra2), GRAPHD_OK);
    assert_int_equal(graphd_region_mapped_size(ra2), graphd_region_mapped_size(ra));
    assert_true(check(graphd_region_ptr(ra2), 100000, 1));
    ((uint8_t *)graphd_region_ptr(ra2))[0] = 0xAB;
    assert_int_equal(((uint8_t *)graphd_region_ptr(ra))[0], 0xAB);
    ((uint8_t *)graphd_region_ptr(ra2))[0] = 1;
    graphd_region_release(ra2);

    /* B can neither free nor map A's region. */
    assert_int_equal(graphd_region_free_id(b, graphd_region_id(ra)), GRAPHD_EPERMISSION_DENIED);
    assert_true(strlen(graphd_last_error(b)) > 0);
    graphd_region_t *stolen = NULL;
    assert_int_equal(graphd_region_map(b, graphd_region_id(ra), &stolen),
                     GRAPHD_EPERMISSION_DENIED);
    assert_null(stolen);

    /* Both sessions carry on: B's session socket stays usable after the refused MAP. */
    graphd_region_t *rb2;
    assert_int_equal(graphd_region_alloc(b, NULL, 10, &rb2), GRAPHD_OK);
    assert_int_equal(graphd_region_free(b, rb2), GRAPHD_OK);
    assert_true(check(graphd_region_ptr(ra), 100000, 1));
    assert_true(check(graphd_region_ptr(rb), 5000, 2));

    uint64_t ida = graphd_region_id(ra);
    assert_int_equal(graphd_region_free(a, ra), GRAPHD_OK);
    /* Gone for its owner too. */
    assert_int_equal(graphd_region_free_id(a, ida), GRAPHD_ENOT_FOUND);
    graphd_region_t *again = NULL;
    assert_int_equal(graphd_region_map(a, ida, &again), GRAPHD_ENOT_FOUND);
    assert_int_equal(graphd_region_free(b, rb), GRAPHD_OK);
    graphd_close(a);
    graphd_close(b);
}

typedef struct counts {
    long long reserved, used, regions, sessions, daemon_sessions;
} counts_t;

static counts_t pool_counts(graphd_client_t *c, const char *pool)
{
    counts_t k = {-1, -1, -1, -1, -1};
    json_t *st = harness_status(c);
    assert_non_null(st);
    json_t *p = harness_find(json_object_get(st, "pools"), "name", pool);
    assert_non_null(p);
    k.reserved = harness_int(p, "reserved_bytes");
    k.used = harness_int(p, "used_bytes");
    k.regions = harness_int(p, "regions");
    k.sessions = harness_int(p, "sessions");
    k.daemon_sessions = harness_int(json_object_get(st, "daemon"), "sessions");
    json_decref(st);
    return k;
}

/* The status entry of session id: its regions and bytes (-1 when absent). */
static void session_counts(graphd_client_t *c, uint64_t id, long long *regions, long long *bytes)
{
    json_t *st = harness_status(c);
    assert_non_null(st);
    json_t *s = harness_find_int(json_object_get(st, "sessions"), "id", id);
    *regions = s != NULL ? harness_int(s, "regions") : -1;
    *bytes = s != NULL ? harness_int(s, "bytes") : -1;
    json_decref(st);
}

static void status_numbers_follow_allocs(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "stats");
    assert_non_null(c);
    counts_t base = pool_counts(c, "default");

    /* The session's own entry: who it is. */
    json_t *st = harness_status(c);
    json_t *me = harness_find_int(json_object_get(st, "sessions"), "id", graphd_session_id(c));
    assert_non_null(me);
    assert_string_equal(json_string_value(json_object_get(me, "name")), "stats");
    assert_int_equal(harness_int(me, "pid"), getpid());
    assert_int_equal(harness_int(me, "uid"), getuid());
    assert_true(json_is_true(json_object_get(me, "attached")));
    assert_int_equal(harness_int(me, "regions"), 0);
    assert_int_equal(harness_int(me, "bytes"), 0);
    assert_true(harness_int(me, "connected_since_unix_ms") > 0);
    json_decref(st);

    const uint64_t sizes[] = {1, 4096, 10000, 1 << 20};
    graphd_region_t *r[4];
    long long want_reserved = 0, want_used = 0;
    for (int i = 0; i < 4; i++) {
        assert_int_equal(graphd_region_alloc(c, NULL, sizes[i], &r[i]), GRAPHD_OK);
        assert_int_equal(graphd_region_mapped_size(r[i]), page_round(sizes[i]));
        want_reserved += (long long)graphd_region_mapped_size(r[i]);
        want_used += (long long)sizes[i];
    }
    counts_t k = pool_counts(c, "default");
    assert_int_equal(k.reserved, base.reserved + want_reserved);
    assert_int_equal(k.used, base.used + want_used);
    assert_int_equal(k.regions, base.regions + 4);
    assert_int_equal(k.sessions, base.sessions + 1);
    assert_int_equal(k.daemon_sessions, base.daemon_sessions);
    long long regions, bytes;
    session_counts(c, graphd_session_id(c), &regions, &bytes);
    assert_int_equal(regions, 4);
    assert_int_equal(bytes, want_reserved);

    /* ListPools says the same as Status. */
    size_t n = 0;
    assert_int_equal(graphd_list_pools(c, &n, NULL), GRAPHD_OK);
    assert_true(n >= 1);
    graphd_pool_t pools[64];
    assert_true(n <= 64);
    assert_int_equal(graphd_list_pools(c, &n, pools), GRAPHD_OK);
    int found = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(pools[i].name, "default") != 0)
            continue;
        found = 1;
        assert_string_equal(pools[i].device, "cpu:0");
        assert_int_equal(pools[i].reserved_bytes, k.reserved);
        assert_int_equal(pools[i].used_bytes, k.used);
        assert_int_equal(pools[i].regions, k.regions);
    }
    assert_true(found);

    /* Free two: the numbers drop by exactly those. */
    long long freed_reserved =
        (long long)(graphd_region_mapped_size(r[1]) + graphd_region_mapped_size(r[3]));
    long long freed_used = (long long)(sizes[1] + sizes[3]);
    assert_int_equal(graphd_region_free(c, r[1]), GRAPHD_OK);
    assert_int_equal(graphd_region_free(c, r[3]), GRAPHD_OK);
    k = pool_counts(c, "default");
    assert_int_equal(k.reserved, base.reserved + want_reserved - freed_reserved);
    assert_int_equal(k.used, base.used + want_used - freed_used);
    assert_int_equal(k.regions, base.regions + 2);
    session_counts(c, graphd_session_id(c), &regions, &bytes);
    assert_int_equal(regions, 2);
    assert_int_equal(bytes, want_reserved - freed_reserved);

    assert_int_equal(graphd_region_free(c, r[0]), GRAPHD_OK);
    assert_int_equal(graphd_region_free(c, r[2]), GRAPHD_OK);
    k = pool_counts(c, "default");
    assert_int_equal(k.reserved, base.reserved);
    assert_int_equal(k.used, base.used);
    assert_int_equal(k.regions, base.regions);
    assert_int_equal(k.sessions, base.sessions);
    session_counts(c, graphd_session_id(c), &regions, &bytes);
    assert_int_equal(regions, 0);
    assert_int_equal(bytes, 0);
    graphd_close(c);
}

static void named_pool_accounting(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "named");
    assert_non_null(c);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(c, "it-named", NULL, 1 << 20, &info), GRAPHD_OK);
    assert_string_equal(info.name, "it-named");
    assert_string_equal(info.device, "cpu:0");
    assert_int_equal(info.limit_bytes, 1 << 20);
    assert_int_equal(info.reserved_bytes, 0);

    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, "it-named", 300000, &r), GRAPHD_OK);
    counts_t k = pool_counts(c, "it-named");
    assert_int_equal(k.reserved, (long long)page_round(300000));
    assert_int_equal(k.used, 300000);
    assert_int_equal(k.regions, 1);
    assert_int_equal(k.sessions, 1);
    assert_int_equal(graphd_region_free(c, r), GRAPHD_OK);
    k = pool_counts(c, "it-named");
    assert_int_equal(k.reserved, 0);
    assert_int_equal(k.regions, 0);
    assert_int_equal(k.sessions, 0);
    assert_int_equal(graphd_pool_delete(c, "it-named"), GRAPHD_OK);

    json_t *st = harness_status(c);
    assert_null(harness_find(json_object_get(st, "pools"), "name", "it-named"));
    json_decref(st);
    graphd_close(c);
}

static void goodbye_frees_but_mapping_stays(void **state)
{
    harness_t *h = *state;
    graphd_client_t *watch = harness_client(h, "watcher");
    graphd_client_t *c = harness_client(h, "leaver");
    assert_non_null(watch);
    assert_non_null(c);
    counts_t base = pool_counts(watch, "default");

    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, NULL, 8192, &r), GRAPHD_OK);
    fill(r, 9);
    uint64_t id = graphd_session_id(c);
    assert_int_equal(graphd_goodbye(c), GRAPHD_OK);
    assert_int_equal(graphd_session_id(c), 0);

    /* The daemon freed it at once... */
    counts_t k = pool_counts(watch, "default");
    assert_int_equal(k.reserved, base.reserved);
    assert_int_equal(k.regions, base.regions);
    long long regions, bytes;
    session_counts(watch, id, &regions, &bytes);
    assert_int_equal(regions, -1);
    /* ...but this process's mapping is still valid memory. */
    assert_true(check(graphd_region_ptr(r), 8192, 9));

    /* Without a session, session calls fail locally; a new Hello works. */
    graphd_region_t *r2;
    assert_int_equal(graphd_region_alloc(c, NULL, 10, &r2), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_goodbye(c), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_hello(c, "again"), GRAPHD_OK);
    assert_int_equal(graphd_hello(c, "twice"), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_region_alloc(c, NULL, 10, &r2), GRAPHD_OK);
    /* graphd_close ends the session (the daemon frees r2); both handles stay mapped until they are
     * released, the last freeing the client. */
    fill(r2, 3);
    graphd_close(c);
    k = pool_counts(watch, "default");
    assert_int_equal(k.reserved, base.reserved);
    assert_int_equal(k.daemon_sessions, base.daemon_sessions - 1);
    assert_true(check(graphd_region_ptr(r), 8192, 9));
    assert_true(check(graphd_region_ptr(r2), 10, 3));
    graphd_region_release(r);
    graphd_region_release(r2);
    graphd_close(watch);
}

/* Device memory needs a pool on a cuda device: on the CPU it is refused, nothing is allocated
 * and the session carries on. The graph mempool figures of a cpu pool are 0. */
static void device_region_refused_on_cpu(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "device-on-cpu");
    assert_non_null(c);
    assert_int_equal(graphd_pool_create(c, "it-dev-cpu", "cpu:0", 0, NULL), GRAPHD_OK);
    counts_t base = pool_counts(c, "default");

    const char *pools[] = {NULL, "it-dev-cpu"};
    for (int i = 0; i < 2; i++) {
        graphd_region_t *r = (graphd_region_t *)&r; /* must come back NULL */
        assert_int_equal(graphd_region_alloc_device(c, pools[i], 4096, &r),
                         GRAPHD_EINVALID_ARGUMENT);
        assert_null(r);
        assert_non_null(strstr(graphd_last_error(c), "cuda"));
        assert_non_null(strstr(graphd_last_error(c), "cpu:0"));
    }
    /* Size checks come first, as for host regions. */
    graphd_region_t *r = NULL;
    assert_int_equal(graphd_region_alloc_device(c, NULL, 0, &r), GRAPHD_EINVALID_ARGUMENT);
    assert_int_equal(graphd_region_alloc_device(c, "no-such-pool", 4096, &r), GRAPHD_ENOT_FOUND);

    counts_t k = pool_counts(c, "default");
    assert_int_equal(k.reserved, base.reserved);
    assert_int_equal(k.regions, base.regions);
    k = pool_counts(c, "it-dev-cpu");
    assert_int_equal(k.regions, 0);
    assert_int_equal(k.reserved, 0);

    /* A host region in the same pool still works. */
    assert_int_equal(graphd_region_alloc(c, "it-dev-cpu", 100, &r), GRAPHD_OK);
    assert_int_equal(graphd_region_is_device(r), 0);
    fill(r, 3);
    assert_true(check(graphd_region_ptr(r), 100, 3));
    assert_int_equal(graphd_region_free(c, r), GRAPHD_OK);

    /* Status and ListPools carry the graph mempool figures: none on the CPU. */
    json_t *st = harness_status(c);
    json_t *p = harness_find(json_object_get(st, "pools"), "name", "it-dev-cpu");
    assert_non_null(p);
    assert_non_null(json_object_get(p, "graph_mempool_reserved_bytes"));
    assert_int_equal(harness_int(p, "graph_mempool_reserved_bytes"), 0);
    assert_int_equal(harness_int(p, "graph_mempool_in_use_bytes"), 0);
    json_decref(st);
    graphd_pool_t list[64];
    size_t n = 64;
    assert_int_equal(graphd_list_pools(c, &n, list), GRAPHD_OK);
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(list[i].graph_mempool_reserved_bytes, 0);
        assert_int_equal(list[i].graph_mempool_in_use_bytes, 0);
    }
    assert_int_equal(graphd_pool_delete(c, "it-dev-cpu"), GRAPHD_OK);
    graphd_close(c);
}

static void lists_use_two_calls(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c;
    assert_int_equal(graphd_connect(h->address, &c), GRAPHD_OK);
    /* No session needed for these. */
    size_t n = 0;
    assert_int_equal(graphd_list_devices(c, &n, NULL), GRAPHD_OK);
    assert_true(n >= 1);
    graphd_device_t devs[16];
    size_t room = 0;
    assert_int_equal(graphd_list_devices(c, &room, devs), GRAPHD_ETRUNC);
    assert_int_equal(room, n);
    room = 16;
    assert_int_equal(graphd_list_devices(c, &room, devs), GRAPHD_OK);
    assert_int_equal(room, n);
    int cpu = 0;
    for (size_t i = 0; i < n; i++)
        if (strcmp(devs[i].id, "cpu:0") == 0) {
            cpu = 1;
            assert_string_equal(devs[i].kind, "cpu");
            assert_true(devs[i].memory_total > 0);
        }
    assert_true(cpu);

    /* Pools belong to a session's uid: without a session there is no owner. */
    assert_int_equal(graphd_pool_create(c, "it-two-a", NULL, 0, NULL), GRAPHD_EFAILED_PRECONDITION);
    assert_non_null(strstr(graphd_last_error(c), "needs an attached session"));
    assert_int_equal(graphd_hello(c, "it-lists"), GRAPHD_OK);
    assert_int_equal(graphd_pool_create(c, "it-two-a", NULL, 0, NULL), GRAPHD_OK);
    assert_int_equal(graphd_pool_create(c, "it-two-b", "cpu:0", 0, NULL), GRAPHD_OK);
    size_t total = 0;
    assert_int_equal(graphd_list_pools(c, &total, NULL), GRAPHD_OK);
    assert_true(total >= 3);
    graphd_pool_t pools[2];
    room = 2;
    assert_int_equal(graphd_list_pools(c, &room, pools), total > 2 ? GRAPHD_ETRUNC : GRAPHD_OK);
    assert_int_equal(room, total);
    assert_int_equal(graphd_pool_delete(c, "it-two-a"), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, "it-two-b"), GRAPHD_OK);

    /* The JSON two-call contract. */
    size_t len = 0;
    assert_int_equal(graphd_status_json(c, NULL, &len), GRAPHD_OK);
    assert_true(len > 2);
    char small[4];
    size_t slen = sizeof(small);
    assert_int_equal(graphd_status_json(c, small, &slen), GRAPHD_ETRUNC);
    assert_true(slen > sizeof(small));
    graphd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_clients_are_isolated),
        cmocka_unit_test(status_numbers_follow_allocs),
        cmocka_unit_test(named_pool_accounting),
        cmocka_unit_test(goodbye_frees_but_mapping_stays),
        cmocka_unit_test(device_region_refused_on_cpu),
        cmocka_unit_test(lists_use_two_calls),
    };
    return cmocka_run_group_tests_name("regions", tests, harness_group_setup,
                                       harness_group_teardown);
}
