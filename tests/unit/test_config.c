/* Unit tests for the daemon's settings table: defaults, file, flags, bounds, reload. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "config.h"
#include "log.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char *write_temp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/graphd-test-conf-XXXXXX");
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

static void defaults(void **state)
{
    (void)state;
    gd_config_t cfg;
    char err[256];
    assert_int_equal(gd_config_load(&cfg, NULL, false, NULL, err, sizeof err), 0);
    assert_string_equal(cfg.listen, GD_DEFAULT_LISTEN);
    assert_string_equal(cfg.session_socket, "/run/graphd/graphd.sock.session");
    assert_int_equal(cfg.max_message_bytes, 64ull << 20);
    assert_int_equal(cfg.log_level, GD_LOG_INFO);
    assert_int_equal(cfg.socket_mode, 0660);
    assert_string_equal(cfg.default_pool, "default");
    gd_config_free(&cfg);
}

static void every_setting_has_a_valid_default(void **state)
{
    (void)state;
    for (size_t i = 0; i < gd_settings_count; i++) {
        const gd_setting_t *s = &gd_settings[i];
        assert_ptr_equal(gd_setting_find(s->name), s);
        assert_non_null(s->help);
        gd_config_t cfg;
        memset(&cfg, 0, sizeof cfg);
        char err[256];
        assert_int_equal(gd_config_set(&cfg, s, s->def, err, sizeof err), 0);
        gd_config_free(&cfg);
    }
}

static void file_and_flags(void **state)
{
    (void)state;
    const char *path = write_temp("# comment\n[graphd]\nlisten = unix:/tmp/x.sock\n"
                                  "max_message_bytes = 1Mi\nlog_level = debug\n"
                                  "max_sessions = 7\n");
    gd_overrides_t ov = {0};
    ov.setting[0] = gd_setting_find("max-sessions"); /* flags spell it with dashes */
    ov.value[0] = strdup("9");
    ov.count = 1;
    gd_config_t cfg;
    char err[256];
    assert_int_equal(gd_config_load(&cfg, path, true, &ov, err, sizeof err), 0);
    assert_string_equal(cfg.listen, "unix:/tmp/x.sock");
    assert_string_equal(cfg.session_socket, "/tmp/x.sock.session");
    assert_int_equal(cfg.max_message_bytes, 1 << 20);
    assert_int_equal(cfg.log_level, GD_LOG_DEBUG);
    assert_int_equal(cfg.max_sessions, 9); /* the flag wins over the file */
    char buf[64];
    gd_config_format(&cfg, gd_setting_find("log_level"), buf, sizeof buf);
    assert_string_equal(buf, "debug");
    gd_config_free(&cfg);
    gd_overrides_free(&ov);
    unlink(path);
}

static void bad_files(void **state)
{
    (void)state;
    static const char *const cases[][2] = {
        {"[graphd]\nno_such_setting = 1\n", "unknown setting"},
        {"[other]\nlisten = unix:/x\n", "unknown section"},
        {"max_sessions = 0\n", "outside"},
        {"max_sessions = lots\n", "not a number"},
        {"max_message_bytes = 12 parsecs\n", "byte count"},
        {"log_level = loud\n", "not one of"},
        {"listen = 127.0.0.1:7000\n", "tls_cert"},
        {"this line is not ini\n", "syntax"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *path = write_temp(cases[i][0]);
        gd_config_t cfg;
        char err[256] = "";
        assert_int_equal(gd_config_load(&cfg, path, true, NULL, err, sizeof err), -1);
        if (strstr(err, cases[i][1]) == NULL)
            fail_msg("case %zu: '%s' does not mention '%s'", i, err, cases[i][1]);
        unlink(path);
    }
    gd_config_t cfg;
    char err[256];
    assert_int_equal(gd_config_load(&cfg, "/nonexistent/graphd.conf", true, NULL, err, sizeof err),
                     -1);
    assert_non_null(strstr(err, "cannot read"));
    /* The default file may be missing. */
    assert_int_equal(gd_config_load(&cfg, "/nonexistent/graphd.conf", false, NULL, err, sizeof err),
                     0);
    gd_config_free(&cfg);
}

static void bytes(void **state)
{
    (void)state;
    uint64_t v;
    assert_int_equal(gd_parse_bytes("4096", &v), 0);
    assert_int_equal(v, 4096);
    assert_int_equal(gd_parse_bytes("64K", &v), 0);
    assert_int_equal(v, 64000);
    assert_int_equal(gd_parse_bytes("64Ki", &v), 0);
    assert_int_equal(v, 65536);
    assert_int_equal(gd_parse_bytes("2GiB", &v), 0);
    assert_int_equal(v, 2ull << 30);
    assert_int_equal(gd_parse_bytes("-1", &v), -1);
    assert_int_equal(gd_parse_bytes("", &v), -1);
    assert_int_equal(gd_parse_bytes("99999999999Ti", &v), -1); /* overflow */
    assert_int_equal(gd_parse_bytes("12 parsecs", &v), -1);
}

static int warned;
static void count_warning(const char *name)
{
    (void)name;
    warned++;
}

static void reload_keeps_fixed_settings(void **state)
{
    (void)state;
    gd_config_t cur, next;
    char err[256];
    const char *a = write_temp("listen = unix:/tmp/a.sock\nmax_sessions = 5\n");
    assert_int_equal(gd_config_load(&cur, a, true, NULL, err, sizeof err), 0);
    unlink(a);
    const char *b = write_temp("listen = unix:/tmp/b.sock\nmax_sessions = 6\nlog_level = warn\n");
    assert_int_equal(gd_config_load(&next, b, true, NULL, err, sizeof err), 0);
    unlink(b);
    warned = 0;
    int changed = gd_config_apply_reload(&cur, &next, count_warning);
    assert_int_equal(changed, 2); /* max_sessions, log_level */
    assert_int_equal(warned, 2);  /* listen and the derived session_socket */
    assert_string_equal(cur.listen, "unix:/tmp/a.sock");
    assert_int_equal(cur.max_sessions, 6);
    assert_int_equal(cur.log_level, GD_LOG_WARN);
    gd_config_free(&cur);
    gd_config_free(&next);
}

/* A setting of fixed words (xpu = auto|off): each word is taken and printed back; anything else
 * is refused with the words it takes. */
static void choice_setting(void **state)
{
    (void)state;
    const gd_setting_t *s = gd_setting_find("xpu");
    assert_non_null(s);
    gd_config_t cfg;
    char err[256];
    assert_int_equal(gd_config_load(&cfg, NULL, false, NULL, err, sizeof err), 0);
    assert_int_equal(cfg.xpu, GD_XPU_AUTO);
    char buf[32];
    gd_config_format(&cfg, s, buf, sizeof buf);
    assert_string_equal(buf, "auto");
    assert_int_equal(gd_config_set(&cfg, s, "off", err, sizeof err), 0);
    assert_int_equal(cfg.xpu, GD_XPU_OFF);
    gd_config_format(&cfg, s, buf, sizeof buf);
    assert_string_equal(buf, "off");
    static const char *const bad[] = {"of", "offf", "", "1", "Auto", "auto|off"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        assert_int_equal(gd_config_set(&cfg, s, bad[i], err, sizeof err), -1);
        assert_non_null(strstr(err, "is not one of auto|off"));
        assert_int_equal(cfg.xpu, GD_XPU_OFF); /* unchanged */
    }
    gd_config_free(&cfg);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(defaults),       cmocka_unit_test(every_setting_has_a_valid_default),
        cmocka_unit_test(file_and_flags), cmocka_unit_test(bad_files),
        cmocka_unit_test(bytes),          cmocka_unit_test(reload_keeps_fixed_settings),
        cmocka_unit_test(choice_setting),
    };
    return cmocka_run_group_tests_name("config", tests, NULL, NULL);
}
