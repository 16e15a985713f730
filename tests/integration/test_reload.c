/*
 * SIGHUP reloads the config file: reloadable settings change at once and
 * show in status, the others keep their running value, and a file that does
 * not parse leaves the running config alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "../lib/harness.h"

static void write_conf(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *config_value(json_t *status, const char *name)
{
    json_t *entry =
        json_object_get(json_object_get(json_object_get(status, "daemon"), "config"), name);
    assert_non_null(entry);
    return json_string_value(json_object_get(entry, "value"));
}

/* Waits until status shows config_reloads == n. */
static json_t *wait_reloads(graphd_client_t *c, long long n)
{
    for (int i = 0; i < 100; i++) {
        json_t *st = harness_status(c);
        if (harness_int(json_object_get(st, "daemon"), "config_reloads") == n)
            return st;
        json_decref(st);
        usleep(20000);
    }
    fail_msg("config_reloads never reached %lld", n);
    return NULL;
}

/* 1 when the daemon's log has a line containing needle. */
static int log_has(const harness_t *h, const char *needle)
{
    FILE *f = fopen(h->log_path, "r");
    char buf[4096];
    int found = 0;
    while (f && !found && fgets(buf, sizeof buf, f))
        found = strstr(buf, needle) != NULL;
    if (f)
        fclose(f);
    return found;
}

static void sighup_reloads(void **state)
{
    (void)state;
    char conf[128];
    snprintf(conf, sizeof conf, "/tmp/graphd-reload-%d.conf", (int)getpid());
    write_conf(conf, "[graphd]\nmax_sessions = 8\nlog_level = info\n");
    const char *args[] = {"--config", conf, NULL};
    harness_t h;
    assert_int_equal(harness_start(&h, args), 0);
    graphd_client_t *c = harness_client(&h, "watcher");
    assert_non_null(c);
    json_t *st = harness_status(c);
    assert_string_equal(config_value(st, "max_sessions"), "8");
    json_decref(st);

    /* max_sessions and log_level reload; listen does not. */
    write_conf(conf, "[graphd]\nmax_sessions = 1\nlog_level = debug\n"
                     "listen = unix:/tmp/elsewhere.sock\n");
    assert_int_equal(kill(h.pid, SIGHUP), 0);
    st = wait_reloads(c, 1);
    assert_string_equal(config_value(st, "max_sessions"), "1");
    assert_string_equal(config_value(st, "log_level"), "debug");
    assert_string_equal(config_value(st, "listen"), h.address);
    json_decref(st);
    /* The log names what changed. */
    assert_true(log_has(&h, "reload: max_sessions = 1 (was 8)"));

    /* The watcher holds the one session allowed now. */
    graphd_client_t *second;
    assert_int_equal(graphd_connect(h.address, &second), GRAPHD_OK);
    assert_int_equal(graphd_hello(second, "second"), GRAPHD_ERESOURCE_EXHAUSTED);
    assert_non_null(strstr(graphd_last_error(second), "max_sessions"));
    graphd_close(second);

    /* A broken file is refused and the running values stay. */
    write_conf(conf, "[graphd]\nmax_sessions = many\n");
    assert_int_equal(kill(h.pid, SIGHUP), 0);
    usleep(300000);
    st = harness_status(c);
    assert_string_equal(config_value(st, "max_sessions"), "1");
    assert_int_equal(harness_int(json_object_get(st, "daemon"), "config_reloads"), 1);
    json_decref(st);

    graphd_close(c);
    assert_int_equal(harness_stop(&h), 0);
    unlink(conf);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sighup_reloads),
    };
    return cmocka_run_group_tests_name("reload", tests, NULL, NULL);
}
