/* Unit tests for session bookkeeping and the daemon's error mapping. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "daemon.h"

#include <string.h>

static int setup(void **state)
{
    static gd_daemon_t d;
    memset(&d, 0, sizeof d);
    char err[256];
    if (gd_config_load(&d.cfg, NULL, false, NULL, err, sizeof err) != 0)
        return -1;
    d.loop = uv_default_loop();
    if (pm_manager_create(0, &d.pools) != PM_OK)
        return -1;
    if (pm_pool_create(d.pools, "default", "cpu:0", 0, NULL) != PM_OK)
        return -1;
    *state = &d;
    return 0;
}

static int teardown(void **state)
{
    gd_daemon_t *d = *state;
    gd_sessions_end_all(d);
    int rc = pm_manager_destroy(d->pools);
    gd_config_free(&d->cfg);
    return rc == PM_OK ? 0 : -1;
}

static void create_find_end(void **state)
{
    gd_daemon_t *d = *state;
    gd_session_t *a = gd_session_create(d, "alpha", 100);
    gd_session_t *b = gd_session_create(d, "beta", 200);
    assert_non_null(a);
    assert_non_null(b);
    assert_int_not_equal(a->id, b->id);
    assert_int_not_equal(a->token, b->token);
    assert_int_equal(d->nsessions, 2);
    assert_ptr_equal(gd_session_find(d, a->id), a);
    assert_ptr_equal(gd_session_find(d, b->id), b);
    assert_null(gd_session_find(d, 999999));
    assert_string_equal(a->name, "alpha");
    assert_false(a->attached);

    uint64_t aid = a->id;
    gd_session_end(d, a, "test");
    assert_null(gd_session_find(d, aid));
    assert_int_equal(d->nsessions, 1);
    gd_session_end(d, b, "test");
    assert_int_equal(d->nsessions, 0);
}

static void end_reclaims_regions(void **state)
{
    gd_daemon_t *d = *state;
    gd_session_t *a = gd_session_create(d, "a", 1);
    gd_session_t *b = gd_session_create(d, "b", 2);
    pm_pool_t *p = pm_pool_find(d->pools, "default");
    pm_region_t *r;
    assert_int_equal(pm_region_alloc(p, a->id, 10000, &r), PM_OK);
    assert_int_equal(pm_region_alloc(p, a->id, 20000, &r), PM_OK);
    assert_int_equal(pm_region_alloc(p, b->id, 4096, &r), PM_OK);
    uint64_t bregion = pm_region_id(r);
    pm_pool_info_t info;
    pm_pool_info(p, &info);
    assert_int_equal(info.regions, 3);
    assert_int_equal(info.sessions, 2);

    gd_session_end(d, a, "test");
    pm_pool_info(p, &info);
    assert_int_equal(info.regions, 1);
    assert_int_equal(info.sessions, 1);
    assert_non_null(pm_region_find(d->pools, bregion));
    gd_session_end(d, b, "test");
    pm_pool_info(p, &info);
    assert_int_equal(info.regions, 0);
    assert_int_equal(info.reserved_bytes, 0);
}

static void unattached_sessions_expire(void **state)
{
    gd_daemon_t *d = *state;
    d->cfg.attach_timeout_ms = 100;
    gd_session_t *old = gd_session_create(d, "old", 1);
    gd_session_t *fresh = gd_session_create(d, "fresh", 2);
    gd_session_t *attached = gd_session_create(d, "attached", 3);
    old->created_mono_ms -= 1000;
    attached->created_mono_ms -= 1000;
    attached->attached = true;
    uint64_t old_id = old->id;
    gd_sessions_expire(d);
    assert_null(gd_session_find(d, old_id));
    assert_ptr_equal(gd_session_find(d, fresh->id), fresh);
    assert_ptr_equal(gd_session_find(d, attached->id), attached);
    attached->attached = false; /* no connection to close */
    gd_sessions_end_all(d);
    assert_int_equal(d->nsessions, 0);
}

static void error_mapping(void **state)
{
    (void)state;
    assert_int_equal(pm_err_grpc(PM_OK), GD_OK);
    assert_int_equal(pm_err_grpc(PM_EINVAL), GD_INVALID_ARGUMENT);
    assert_int_equal(pm_err_grpc(PM_ENOENT), GD_NOT_FOUND);
    assert_int_equal(pm_err_grpc(PM_EEXIST), GD_ALREADY_EXISTS);
    assert_int_equal(pm_err_grpc(PM_ELIMIT), GD_RESOURCE_EXHAUSTED);
    assert_int_equal(pm_err_grpc(PM_EBUSY), GD_FAILED_PRECONDITION);
    assert_int_equal(pm_err_grpc(PM_EPERM), GD_PERMISSION_DENIED);
    assert_int_equal(pm_err_grpc(PM_ESYS), GD_INTERNAL);
    assert_int_equal(pm_err_grpc(-12345), GD_INTERNAL);
    assert_string_equal(gd_status_name(GD_NOT_FOUND), "NOT_FOUND");
    assert_string_equal(gd_status_name(GD_UNAUTHENTICATED), "UNAUTHENTICATED");
    assert_string_equal(gd_status_name(99), "UNKNOWN");
}

static void method_table_is_complete(void **state)
{
    (void)state;
    /* Every RPC of the service has exactly one handler. */
    for (size_t i = 0; i < gd_methods_count; i++) {
        assert_non_null(gd_methods[i].handler);
        assert_non_null(gd_methods[i].request);
        for (size_t j = i + 1; j < gd_methods_count; j++)
            assert_string_not_equal(gd_methods[i].path, gd_methods[j].path);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_find_end),
        cmocka_unit_test(end_reclaims_regions),
        cmocka_unit_test(unattached_sessions_expire),
        cmocka_unit_test(error_mapping),
        cmocka_unit_test(method_table_is_complete),
    };
    return cmocka_run_group_tests_name("session", tests, setup, teardown);
}
