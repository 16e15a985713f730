/*
 * Executors' memory bound on the real daemon: the start-up "isolation:" line and status say
 * whether executors run under a cgroup v2 memory.max (a delegated cgroup, systemd Delegate=yes)
 * or only under the RSS watchdog, and why. Where the machine has no cgroup2 at /sys/fs/cgroup,
 * or the daemon's cgroup is not delegated, the line must say the cgroup bound is off and why;
 * the real memory.max path cannot run there and is skipped with a message (tests/unit/
 * test_cgroup.c covers its decisions against a stand-in cgroup root).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "graphd.h"
#include "../lib/harness.h"

#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

static bool machine_has_cgroup2(void)
{
    struct statfs s;
    return statfs("/sys/fs/cgroup", &s) == 0 && (unsigned long)s.f_type == CGROUP2_SUPER_MAGIC;
}

/* The daemon's "isolation:" log line (a static buffer; "" when absent). */
static const char *isolation_line(const harness_t *h)
{
    static char line[8192];
    line[0] = 0;
    FILE *f = fopen(h->log_path, "r");
    if (f == NULL)
        return line;
    char buf[8192];
    while (fgets(buf, sizeof buf, f))
        if (strstr(buf, "isolation:")) {
            snprintf(line, sizeof line, "%s", buf);
            break;
        }
    fclose(f);
    return line;
}

static const char *config_value(json_t *status, const char *name)
{
    json_t *entry =
        json_object_get(json_object_get(json_object_get(status, "daemon"), "config"), name);
    assert_non_null(entry);
    return json_string_value(json_object_get(entry, "value"));
}

/* Whether the line says the cgroup bound is on; fails the test when it says neither. */
static bool says_cgroup_on(const char *line)
{
    bool on = strstr(line, "max_executor_memory_bytes by cgroup v2 (memory.max per executor "
                           "under /sys/fs/cgroup/") != NULL;
    bool off = strstr(line, "max_executor_memory_bytes by the RSS watchdog only (cgroup "
                            "memory.max off: ") != NULL;
    if (on == off)
        fail_msg("the isolation line says neither cgroup nor watchdog: %s", line);
    return on;
}

/* At start the daemon says which memory bound applies and why; on this kind of machine (cgroup
 * v1, or no delegation) that the cgroup bound is off. */
static void start_up_line_says_which_memory_bound(void **state)
{
    harness_fixture_t *f = *state;
    const char *line = isolation_line(&f->h);
    printf("    %s", line);
    assert_true(line[0] != 0);
    bool on = says_cgroup_on(line);
    const char *given = getenv("GRAPHD_TEST_CGROUP");
    if (given != NULL && *given != '\0' && !on)
        fail_msg("GRAPHD_TEST_CGROUP=%s gives the daemon a cgroup of its own, yet the cgroup "
                 "bound is off: %s",
                 given, line);
    if (!machine_has_cgroup2()) {
        assert_false(on);
        assert_non_null(strstr(line, "no cgroup2 at /sys/fs/cgroup (cgroup v1 or hybrid)"));
    }
    graphd_client_t *c = harness_client(&f->h, "cgroup");
    assert_non_null(c);
    json_t *st = harness_status(c);
    assert_string_equal(config_value(st, "executor_cgroup"), "1");
    json_decref(st);
    graphd_close(c);
    if (!on)
        printf("    SKIPPED the cgroup memory.max path: no cgroup v2 delegation for this daemon "
               "here, so executors are bounded by the RSS watchdog only\n");
}

/* Status's executors section says the same per executor. */
static void status_says_which_memory_bound(void **state)
{
    harness_fixture_t *f = *state;
    bool on = says_cgroup_on(isolation_line(&f->h));
    graphd_client_t *c = harness_client(&f->h, "cgroup");
    assert_non_null(c);
    assert_true(harness_models_register(c, &f->m, "mlp.pt") != 0); /* starts its executor */
    json_t *st = harness_status(c);
    json_t *ex = json_object_get(st, "executors");
    size_t seen = 0;
    for (size_t i = 0; i < json_array_size(ex); i++) {
        json_t *e = json_array_get(ex, i);
        const char *sandbox = json_string_value(json_object_get(e, "sandbox"));
        if (harness_int(e, "pid") == 0 || sandbox == NULL)
            continue;
        printf("    executor uid %lld on %s: %s\n", harness_int(e, "uid"),
               json_string_value(json_object_get(e, "device")), sandbox);
        if (on)
            assert_non_null(strstr(sandbox, "; memory: cgroup memory.max"));
        else
            assert_non_null(strstr(sandbox, "; memory: RSS watchdog only (cgroup: "));
        if (!machine_has_cgroup2())
            assert_non_null(strstr(sandbox, "no cgroup2 at /sys/fs/cgroup"));
        seen++;
    }
    json_decref(st);
    graphd_close(c);
    assert_true(seen > 0);
}

/* executor_cgroup = 0: the cgroup is not looked at, and the line says that is why. */
static void executor_cgroup_0_turns_it_off(void **state)
{
    (void)state;
    harness_t h;
    static const char *const args[] = {"--executor-cgroup", "0", NULL};
    assert_int_equal(harness_start(&h, args), 0);
    const char *line = isolation_line(&h);
    printf("    %s", line);
    assert_false(says_cgroup_on(line));
    assert_non_null(strstr(line, "(cgroup memory.max off: not used (executor_cgroup = 0))"));
    graphd_client_t *c = harness_client(&h, "cgroup");
    assert_non_null(c);
    json_t *st = harness_status(c);
    assert_string_equal(config_value(st, "executor_cgroup"), "0");
    json_decref(st);
    graphd_close(c);
    assert_int_equal(harness_stop(&h), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(start_up_line_says_which_memory_bound),
        cmocka_unit_test(status_says_which_memory_bound),
        cmocka_unit_test(executor_cgroup_0_turns_it_off),
    };
    return cmocka_run_group_tests(tests, harness_fixture_group_setup,
                                  harness_fixture_group_teardown);
}
