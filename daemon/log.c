/* Leveled logging to stderr for the daemon (see log.h). */
#include "log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static const char *const level_names[] = {"error", "warn", "info", "debug"};
static const int level_prio[] = {3, 4, 6, 7};
static atomic_int current_level = GD_LOG_INFO;

int gd_log_level_parse(const char *s)
{
    for (int i = 0; i < 4; i++)
        if (strcmp(s, level_names[i]) == 0)
            return i;
    if (strcmp(s, "warning") == 0)
        return GD_LOG_WARN;
    return -1;
}

const char *gd_log_level_name(int level)
{
    return level >= 0 && level < 4 ? level_names[level] : "?";
}

void gd_log_set_level(int level)
{
    atomic_store(&current_level, level);
}

int gd_log_enabled(int level)
{
    return level <= atomic_load(&current_level);
}

/* Where stderr goes, decided at the first record: a terminal (local time of day), journald
 * (syslog priority prefixes, which it reads, and no time: it stamps each line itself), or
 * anything else, such as a file (UTC timestamps with the date). journald is detected as systemd
 * says to: $JOURNAL_STREAM names the device and inode of stderr. */
enum { OUT_UNKNOWN, OUT_TTY, OUT_JOURNAL, OUT_FILE };
static atomic_int out_kind = OUT_UNKNOWN;

static int stderr_kind(void)
{
    int k = atomic_load(&out_kind);
    if (k != OUT_UNKNOWN)
        return k;
    k = OUT_FILE;
    const char *js = getenv("JOURNAL_STREAM");
    struct stat st;
    unsigned long long dev, ino;
    if (isatty(STDERR_FILENO))
        k = OUT_TTY;
    else if (js && sscanf(js, "%llu:%llu", &dev, &ino) == 2 && fstat(STDERR_FILENO, &st) == 0 &&
             (unsigned long long)st.st_dev == dev && (unsigned long long)st.st_ino == ino)
        k = OUT_JOURNAL;
    atomic_store(&out_kind, k);
    return k;
}

void gd_log(int level, const char *fmt, ...)
{
    if (!gd_log_enabled(level))
        return;
    char line[2048];
    int n;
    int kind = stderr_kind();
    if (kind == OUT_JOURNAL) {
        n = snprintf(line, sizeof line, "<%d>%s: ", level_prio[level], level_names[level]);
    } else {
        struct timespec ts;
        struct tm tm;
        clock_gettime(CLOCK_REALTIME, &ts);
        if (kind == OUT_TTY) {
            localtime_r(&ts.tv_sec, &tm);
            n = snprintf(line, sizeof line, "%02d:%02d:%02d.%03ld %-5s ", tm.tm_hour, tm.tm_min,
                         tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
        } else {
            gmtime_r(&ts.tv_sec, &tm);
            n = snprintf(line, sizeof line, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ %-5s ",
                         tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour, tm.tm_min,
                         tm.tm_sec, ts.tv_nsec / 1000000, level_names[level]);
        }
    }
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof line - (size_t)n - 1, fmt, ap);
    va_end(ap);
    size_t len = strlen(line);
    line[len++] = '\n';
    /* One write per record so lines from different threads do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, len);
    (void)w;
}
