/*
 * Leveled logging to stderr, one line per record, with a syslog priority
 * prefix ("<3>") that journald understands when the daemon runs under
 * systemd. The level is the only global state: it is set at start-up and on
 * reload, from the loop thread, and read anywhere.
 */
#ifndef GD_LOG_H
#define GD_LOG_H

typedef enum { GD_LOG_ERROR = 0, GD_LOG_WARN, GD_LOG_INFO, GD_LOG_DEBUG } gd_log_level_t;

/* Parses "error", "warn", "info", "debug"; -1 for anything else. */
int gd_log_level_parse(const char *s);
const char *gd_log_level_name(int level);
void gd_log_set_level(int level);
int gd_log_enabled(int level);
void gd_log(int level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define gd_error(...) gd_log(GD_LOG_ERROR, __VA_ARGS__)
#define gd_warn(...) gd_log(GD_LOG_WARN, __VA_ARGS__)
#define gd_info(...) gd_log(GD_LOG_INFO, __VA_ARGS__)
#define gd_debug(...)                                                                              \
    do {                                                                                           \
        if (gd_log_enabled(GD_LOG_DEBUG))                                                          \
            gd_log(GD_LOG_DEBUG, __VA_ARGS__);                                                     \
    } while (0)

#endif
