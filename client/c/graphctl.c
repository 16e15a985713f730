/*
 * graphctl: the operator's CLI for graphd. Every command gets its data as
 * JSON (the Status RPC through graphd_status_json, or a list turned into the
 * same JSON shape) and prints either that JSON (--json) or human tables made
 * from it, so both outputs always agree. Sections are rendered generically:
 * a section with a spec in `sections` gets its columns and headers from it,
 * any other array of objects (a later "graphs", say) gets every scalar field
 * as a column, and values are formatted by field name (*_bytes, *_unix_ms,
 * *_ms, *_ns). A column that only some devices have (MPS, telemetry, the
 * graph mempool) is shown only when a row has a value for it. status --watch
 * (and top) fetch Status again every few seconds and add replay rates from
 * the difference of two replies. docs/OPERATIONS.md, "Reading status",
 * lists every field.
 */
#include <errno.h>
#include <getopt.h>
#include <pwd.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "graphd.h"
#include "graphd_bytes.h"

#ifndef GRAPHD_VERSION
#define GRAPHD_VERSION "0.0.0"
#endif

#define EXIT_USAGE 2
#define CELL_MAX 96

static const char usage[] =
    "usage: graphctl [--address ADDR] [--json] COMMAND\n"
    "\n"
    "commands:\n"
    "  status [--config]               daemon, devices, pools, sessions, graphs,\n"
    "                                  executors (--config: and the daemon's settings,\n"
    "                                  last)\n"
    "  status --watch [SECONDS] [--count N]\n"
    "                                  status again every SECONDS (default 2), with\n"
    "                                  replays/s per pool, session and graph; Ctrl-C\n"
    "                                  stops it, --count after N refreshes\n"
    "  top [SECONDS] [--count N]       the same as status --watch\n"
    "  devices                         devices the daemon serves\n"
    "  pools                           the pools section of status\n"
    "  pool create NAME [--device DEV] [--limit BYTES] [--mode MODE]\n"
    "                                  create a pool (BYTES as in graphd.conf: 64M, 1Gi,\n"
    "                                  \"5 MiB\"; K/M/G/T are powers of 1000, Ki/Mi/Gi/Ti\n"
    "                                  powers of 1024; MODE:\n"
    "                                  private (default), group or public)\n"
    "  pool delete NAME                delete an empty pool (its owner or an admin)\n"
    "\n"
    "Each command opens a session as the calling user: status and pools show what\n"
    "that user may see (all of it for root or the daemon's user).\n"
    "\n"
    "options:\n"
    "  -a, --address ADDR  daemon address (default $GRAPHD_ADDRESS, else " GRAPHD_DEFAULT_ADDRESS
    ")\n"
    "  -j, --json          print JSON instead of tables (docs/OPERATIONS.md,\n"
    "                      \"Reading status\", lists the fields)\n"
    "  -h, --help          this text\n"
    "  -V, --version       graphctl's version\n";

/* ---- errors ---------------------------------------------------------------------------- */

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "graphctl: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, " (see graphctl --help)\n");
    return EXIT_USAGE;
}

/* One line on stderr: "graphctl: <what>: <ERR_NAME>: <message>"; returns the exit status 1. */
static int fail(graphd_client_t *c, const char *what, int rc)
{
    char msg[1024];
    const char *last = c != NULL ? graphd_last_error(c) : "";
    snprintf(msg, sizeof(msg), "%s", last[0] != '\0' ? last : graphd_strerror(rc));
    for (char *p = msg; *p != '\0'; p++)
        if (*p == '\n' || *p == '\r')
            *p = ' ';
    if (rc == GRAPHD_EUNAVAILABLE && c != NULL)
        fprintf(stderr, "graphctl: cannot reach graphd at %s: %s: %s\n", graphd_address(c),
                graphd_err_name(rc), msg);
    else
        fprintf(stderr, "graphctl: %s: %s: %s\n", what, graphd_err_name(rc), msg);
    return 1;
}

/* ---- value formatting ------------------------------------------------------------------ */

static int ends_with(const char *s, const char *suffix)
{
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

static int starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

static void fmt_bytes(char *out, size_t n, double v)
{
    static const char *units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
    unsigned u = 0;
    while (v >= 1024 && u + 1 < sizeof(units) / sizeof(units[0]))
        v /= 1024, u++;
    if (u == 0) {
        snprintf(out, n, "%.0f B", v);
        return;
    }
    snprintf(out, n, "%.1f", v);
    if (ends_with(out, ".0"))
        out[strlen(out) - 2] = '\0';
    size_t len = strlen(out);
    snprintf(out + len, n - len, " %s", units[u]);
}

/* "3d 4h", "2h 5m", "5m 3s", "12s", "450ms". */
static void fmt_duration_ms(char *out, size_t n, double ms)
{
    unsigned long long s = (unsigned long long)(ms / 1000);
    if (ms < 1000)
        snprintf(out, n, "%.0fms", ms);
    else if (s < 60)
        snprintf(out, n, "%llus", s);
    else if (s < 3600)
        snprintf(out, n, "%llum %llus", s / 60, s % 60);
    else if (s < 86400)
        snprintf(out, n, "%lluh %llum", s / 3600, s % 3600 / 60);
    else
        snprintf(out, n, "%llud %lluh", s / 86400, s % 86400 / 3600);
}

static double now_unix_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec * 1000 + (double)ts.tv_nsec / 1e6;
}

/* Formats v (the field key's value) for a table cell; *numeric says "align right". */
static void fmt_value(char *out, size_t n, const char *key, const json_t *v, int *numeric)
{
    *numeric = 0;
    if (json_is_string(v)) {
        const char *str = json_string_value(v);
        snprintf(out, n, "%s", str[0] != '\0' ? str : "-");
        if (strlen(str) >= n && n > 4) /* cut: say so (--json has it whole) */
            memcpy(out + n - 4, "...", 4);
        return;
    }
    if (json_is_boolean(v)) {
        snprintf(out, n, "%s", json_is_true(v) ? "yes" : "no");
        return;
    }
    if (!json_is_number(v)) {
        snprintf(out, n, "%s", v == NULL || json_is_null(v) ? "-" : "...");
        return;
    }
    *numeric = 1;
    double d = json_number_value(v);
    if (starts_with(key, "limit") && d == 0) {
        snprintf(out, n, "none");
        *numeric = 0;
    } else if (strcmp(key, "pid") == 0 && d == 0) {
        snprintf(out, n, "-"); /* no process (an executor not running) */
    } else if (starts_with(key, "capturing_since")) {
        *numeric = 0;
        if (d == 0) {
            snprintf(out, n, "-");
        } else {
            char dur[48];
            double age = now_unix_ms() - d;
            fmt_duration_ms(dur, sizeof(dur), age < 0 ? 0 : age);
            snprintf(out, n, "yes, for %s", dur);
        }
    } else if (ends_with(key, "_per_s")) {
        snprintf(out, n, "%.1f", d);
    } else if (ends_with(key, "_unix_ms")) {
        *numeric = 0;
        if (d == 0) {
            snprintf(out, n, "-");
        } else {
            char dur[48];
            double age = now_unix_ms() - d;
            fmt_duration_ms(dur, sizeof(dur), age < 0 ? 0 : age);
            snprintf(out, n, "%s ago", dur);
        }
    } else if (ends_with(key, "_bytes") || strcmp(key, "bytes") == 0 ||
               starts_with(key, "memory_")) {
        fmt_bytes(out, n, d);
    } else if (ends_with(key, "_ms")) {
        fmt_duration_ms(out, n, d);
    } else if (ends_with(key, "_ns")) {
        if (d == 0)
            snprintf(out, n, "-");
        else if (d < 1e3)
            snprintf(out, n, "%.0fns", d);
        else if (d < 1e6)
            snprintf(out, n, "%.1fus", d / 1e3);
        else
            fmt_duration_ms(out, n, d / 1e6);
    } else if (json_is_integer(v)) {
        snprintf(out, n, "%lld", (long long)json_integer_value(v));
    } else {
        snprintf(out, n, "%g", d);
    }
}

/* A field name as a label: "started_unix_ms" ⇒ "started", "calls_total" stays. */
static void label_of(char *out, size_t n, const char *key)
{
    static const char *suffixes[] = {"_unix_ms", "_ms", "_ns"};
    snprintf(out, n, "%s", key);
    for (size_t i = 0; i < sizeof(suffixes) / sizeof(suffixes[0]); i++)
        if (ends_with(out, suffixes[i]) && strlen(out) > strlen(suffixes[i])) {
            out[strlen(out) - strlen(suffixes[i])] = '\0';
            break;
        }
}

/* ---- tables ---------------------------------------------------------------------------- */

/* A column: a field of each row, "a.b" for field b of the nested object a. */
typedef struct column {
    const char *key;
    const char *header;
    int optional; /* shown only when a row has a value for it (a kind's own, a rate) */
} column_t;

typedef struct section {
    const char *key;   /* JSON key */
    const char *title; /* "# Title" */
    const column_t *cols;
    const char *latency_of; /* rows with latency columns: "pool", "graph"; else NULL */
} section_t;

/* A column key with this suffix shows the user name of the uid in the field before it. */
#define USER_OF "@user"
/* The replay rate graphctl adds to pools, sessions and graphs in --watch (not in Status). */
#define RATE_KEY "replays_per_s"
/* The seconds between the two replies that the rates come from; 0: no rates. */
static double rate_window_s;

static const column_t device_cols[] = {
    {"id", "ID", 0},
    {"kind", "KIND", 0},
    {"name", "NAME", 0},
    {"memory_total", "MEMORY", 0},
    {"memory_free", "FREE", 0},
    {"compute_capability", "CC", 1},
    {"mps", "MPS", 1},
    {"compute_units", "CUS", 1},
    {"max_clock_mhz", "CLOCK_MHZ", 1},
    {"telemetry.memory_free", "T_FREE", 1},
    {"telemetry.utilisation", "UTIL", 1},
    {"telemetry.memory_health", "HEALTH", 1},
    {"telemetry.wedged", "WEDGED", 1},
    {"uuid", "UUID", 1},
    {"driver", "DRIVER", 1},
    {NULL, NULL, 0},
};
static const column_t pool_cols[] = {
    {"name", "NAME", 0},
    {"device", "DEVICE", 0},
    {"owner_uid" USER_OF, "OWNER", 0},
    {"reserved_bytes", "RESERVED", 0},
    {"used_bytes", "USED", 0},
    {"limit_bytes", "LIMIT", 0},
    {"regions", "REGIONS", 0},
    {"sessions", "SESSIONS", 0},
    {"graphs", "GRAPHS", 0},
    {"replays", "REPLAYS", 0},
    {RATE_KEY, "REPLAYS/S", 1},
    {"latency.p50_ns", "P50_ALL", 0},
    {"latency.p99_ns", "P99_ALL", 0},
    {"graph_mempool_reserved_bytes", "MEMPOOL", 1},
    {"graph_mempool_in_use_bytes", "MEMPOOL_USED", 1},
    {"created_unix_ms", "CREATED", 0},
    {NULL, NULL, 0},
};
static const column_t session_cols[] = {
    {"id", "ID", 0},
    {"name", "NAME", 0},
    {"uid", "UID", 0},
    {"uid" USER_OF, "USER", 0},
    {"pid", "PID", 0},
    {"attached", "ATTACHED", 0},
    {"regions", "REGIONS", 0},
    {"bytes", "BYTES", 0},
    {"modules", "MODULES", 0},
    {"graphs", "GRAPHS", 0},
    {"replays", "REPLAYS", 0},
    {RATE_KEY, "REPLAYS/S", 1},
    {"capturing_since_unix_ms", "CAPTURING", 0},
    {"connected_since_unix_ms", "CONNECTED", 0},
    {NULL, NULL, 0},
};
static const column_t graph_cols[] = {
    {"id", "ID", 0},
    {"session", "SESSION", 0},
    {"pool", "POOL", 0},
    {"device", "DEVICE", 0},
    {"module", "MODULE", 0},
    {"training", "TRAINING", 0},
    {"replays_forward", "FWD", 0},
    {"replays_backward", "BWD", 0},
    {RATE_KEY, "REPLAYS/S", 1},
    {"replay_errors", "ERRORS", 0},
    {"latency.p50_ns", "P50_ALL", 0},
    {"latency.p99_ns", "P99_ALL", 0},
    {"region_bytes", "BYTES", 0},
    {NULL, NULL, 0},
};
/* One executor process per (uid, device): PID "-" when it is not running (it starts at that
 * uid's next call there); KILLED_TIME and KILLED_MEM count kills at max_*_ms and at
 * max_executor_memory_bytes, DIED ends of its own (a crash in module code). */
static const column_t executor_cols[] = {
    {"uid", "UID", 0},
    {"uid" USER_OF, "USER", 0},
    {"device", "DEVICE", 0},
    {"pid", "PID", 0},
    {"rss_bytes", "RSS", 0},
    {"starts", "STARTS", 0},
    {"killed_time", "KILLED_TIME", 0},
    {"killed_memory", "KILLED_MEM", 0},
    {"died", "DIED", 0},
    {"sandbox", "SANDBOX", 0},
    {NULL, NULL, 0},
};
static const column_t config_cols[] = {
    {"name", "NAME", 0},
    {"value", "VALUE", 0},
    {"reloadable", "RELOADABLE", 0},
    {NULL, NULL, 0},
};

/* What the latency columns are: the daemon keeps one histogram per pool and graph, from its
 * creation on, and Status gives its percentiles; there is no window. */
static const char latency_note[] =
    "P50_ALL, P99_ALL: replay latency over all replays since the %s was created (cumulative, "
    "not windowed)";

/* Sections with a chosen layout. The "# Daemon" block and any other section are generic. */
static const section_t sections[] = {
    {"devices", "Devices", device_cols, NULL},       {"pools", "Pools", pool_cols, "pool"},
    {"sessions", "Sessions", session_cols, NULL},    {"graphs", "Graphs", graph_cols, "graph"},
    {"executors", "Executors", executor_cols, NULL}, {"config", "Config", config_cols, NULL},
};

/* Fields that only rows of one device kind have (a device's "kind", else the family part of a
 * row's "device"): the other rows show "-" (MPS and the graph mempool are CUDA's). */
static const struct {
    const char *key;
    const char *kind;
} kind_only[] = {
    {"mps", "cuda"},
    {"graph_mempool_reserved_bytes", "cuda"},
    {"graph_mempool_in_use_bytes", "cuda"},
};

/* 1 when row (a device, or a pool on one) is of a kind that key does not apply to. */
static int not_for_kind(const char *key, json_t *row)
{
    char kind[CELL_MAX];
    const char *k = json_string_value(json_object_get(row, "kind"));
    const char *dev = json_string_value(json_object_get(row, "device"));
    if (k != NULL)
        snprintf(kind, sizeof(kind), "%s", k);
    else if (dev != NULL)
        snprintf(kind, sizeof(kind), "%.*s", (int)strcspn(dev, ":"), dev);
    else
        return 0;
    for (size_t i = 0; i < sizeof(kind_only) / sizeof(kind_only[0]); i++)
        if (strcmp(kind_only[i].key, key) == 0 && strcmp(kind_only[i].kind, kind) != 0)
            return 1;
    return 0;
}

static const section_t *find_section(const char *key)
{
    for (size_t i = 0; i < sizeof(sections) / sizeof(sections[0]); i++)
        if (strcmp(sections[i].key, key) == 0)
            return &sections[i];
    return NULL;
}

/* The value at path ("a" or "a.b") in obj, NULL when absent. */
static json_t *get_path(json_t *obj, const char *path)
{
    const char *dot = strchr(path, '.');
    if (dot == NULL)
        return json_object_get(obj, path);
    char head[CELL_MAX];
    snprintf(head, sizeof(head), "%.*s", (int)(dot - path), path);
    return get_path(json_object_get(obj, head), dot + 1);
}

/* The field name that decides the format: the last part of a path. */
static const char *leaf(const char *path)
{
    const char *dot = strrchr(path, '.');
    return dot != NULL ? dot + 1 : path;
}

/* The account name of uid (getpwuid_r, so NSS users too), else the uid itself. The last few
 * answers are kept: a table asks for the same uids row after row. */
static void user_name(char *out, size_t n, long long uid)
{
    static struct {
        long long uid;
        char name[64];
    } cache[8];
    static unsigned next, used;
    for (unsigned i = 0; i < used; i++)
        if (cache[i].uid == uid) {
            snprintf(out, n, "%s", cache[i].name);
            return;
        }
    struct passwd pw, *found = NULL;
    char buf[4096];
    if (uid >= 0 && getpwuid_r((uid_t)uid, &pw, buf, sizeof(buf), &found) == 0 && found != NULL)
        snprintf(out, n, "%s", found->pw_name);
    else
        snprintf(out, n, "%lld", uid);
    snprintf(cache[next].name, sizeof(cache[next].name), "%s", out);
    cache[next].uid = uid;
    next = (next + 1) % 8;
    used += used < 8;
}

/* A cell of row for column key: "-" for a value the row's kind does not have; *blank says that
 * the row has no value there (absent, null or ""), *numeric "align right". */
static void cell_of(char *out, size_t n, const char *key, json_t *row, int *numeric, int *blank)
{
    *numeric = 0;
    *blank = 0;
    if (not_for_kind(key, row)) {
        snprintf(out, n, "-");
        *blank = 1;
        return;
    }
    if (ends_with(key, USER_OF)) { /* "uid@user": the name of the uid in field "uid" */
        char field[CELL_MAX];
        snprintf(field, sizeof(field), "%.*s", (int)(strlen(key) - strlen(USER_OF)), key);
        json_t *uid = get_path(row, field);
        if (!json_is_integer(uid)) {
            snprintf(out, n, "-");
            *blank = 1;
            return;
        }
        user_name(out, n, json_integer_value(uid));
        return;
    }
    json_t *v = get_path(row, key);
    *blank = v == NULL || json_is_null(v) || (json_is_string(v) && json_string_value(v)[0] == '\0');
    fmt_value(out, n, leaf(key), v, numeric);
}

typedef struct columns {
    size_t n;
    char *keys[64];
    char *headers[64];
    int optional[64];
} columns_t;

static void columns_add(columns_t *cols, const char *key, const char *header, int optional)
{
    if (cols->n >= sizeof(cols->keys) / sizeof(cols->keys[0]))
        return;
    cols->keys[cols->n] = strdup(key);
    cols->headers[cols->n] = strdup(header);
    if (cols->keys[cols->n] == NULL || cols->headers[cols->n] == NULL) {
        free(cols->keys[cols->n]);
        free(cols->headers[cols->n]);
        return;
    }
    cols->optional[cols->n] = optional;
    cols->n++;
}

static void columns_free(columns_t *cols)
{
    for (size_t i = 0; i < cols->n; i++) {
        free(cols->keys[i]);
        free(cols->headers[i]);
    }
    cols->n = 0;
}

/* "p50_ns" ⇒ "P50", "replays_forward" ⇒ "REPLAYS_FORWARD". */
static void header_of(char *out, size_t n, const char *key)
{
    label_of(out, n, key);
    for (char *p = out; *p != '\0'; p++)
        *p = (char)(*p >= 'a' && *p <= 'z' ? *p - 'a' + 'A' : *p);
}

/* Columns for rows: the section's spec, else every scalar field of the first row, and the
 * scalar fields of its nested objects as "object.field". */
static void pick_columns(const section_t *sec, json_t *rows, columns_t *cols)
{
    cols->n = 0;
    if (sec != NULL) {
        for (const column_t *c = sec->cols; c->key != NULL; c++)
            columns_add(cols, c->key, c->header, c->optional);
        return;
    }
    const char *key, *sub;
    json_t *v, *sv;
    json_object_foreach(json_array_get(rows, 0), key, v)
    {
        char header[CELL_MAX], h2[CELL_MAX / 2], path[CELL_MAX * 2];
        if (json_is_object(v)) {
            json_object_foreach(v, sub, sv)
            {
                if (json_is_object(sv) || json_is_array(sv))
                    continue;
                header_of(header, sizeof(header) / 2, key);
                header_of(h2, sizeof(h2), sub);
                size_t len = strlen(header);
                snprintf(header + len, sizeof(header) - len, " %s", h2);
                snprintf(path, sizeof(path), "%s.%s", key, sub);
                columns_add(cols, path, header, 0);
            }
        } else if (!json_is_array(v)) {
            header_of(header, sizeof(header), key);
            columns_add(cols, key, header, 0);
        }
    }
}

static void print_table(const section_t *sec, json_t *rows)
{
    columns_t cols;
    pick_columns(sec, rows, &cols);
    size_t ncols = cols.n;
    size_t nrows = json_array_size(rows);
    size_t width[64] = {0};
    int numeric[64] = {0};
    int shown[64] = {0};
    char(*cells)[CELL_MAX] = calloc(nrows * ncols + 1, sizeof(*cells));
    if (cells == NULL)
        goto out;

    for (size_t c = 0; c < ncols; c++) {
        width[c] = strlen(cols.headers[c]);
        shown[c] = !cols.optional[c]; /* an optional one: once a row has a value */
    }
    for (size_t r = 0; r < nrows; r++) {
        json_t *row = json_array_get(rows, r);
        for (size_t c = 0; c < ncols; c++) {
            int num, blank;
            char *cell = cells[r * ncols + c];
            cell_of(cell, CELL_MAX, cols.keys[c], row, &num, &blank);
            shown[c] |= !blank;
            numeric[c] |= num;
            if (strlen(cell) > width[c])
                width[c] = strlen(cell);
        }
    }
    size_t last = 0; /* the last shown column is not padded */
    for (size_t c = 0; c < ncols; c++)
        if (shown[c])
            last = c;
    /* Numbers align right (headers too), text left. */
    int first = 1;
    for (size_t c = 0; c < ncols; c++) {
        if (!shown[c])
            continue;
        int w = numeric[c] || c < last ? (int)width[c] : 0;
        printf(numeric[c] ? "%s%*s" : "%s%-*s", first ? "" : "  ", w, cols.headers[c]);
        first = 0;
    }
    printf("\n");
    if (nrows == 0)
        printf("(none)\n");
    for (size_t r = 0; r < nrows; r++) {
        first = 1;
        for (size_t c = 0; c < ncols; c++) {
            if (!shown[c])
                continue;
            int w = numeric[c] || c < last ? (int)width[c] : 0;
            printf(numeric[c] ? "%s%*s" : "%s%-*s", first ? "" : "  ", w, cells[r * ncols + c]);
            first = 0;
        }
        printf("\n");
    }
    if (sec != NULL && sec->latency_of != NULL && nrows > 0) {
        printf(latency_note, sec->latency_of);
        printf("\n");
    }
    for (size_t c = 0; c < ncols; c++)
        if (shown[c] && strcmp(cols.keys[c], RATE_KEY) == 0 && rate_window_s > 0) {
            printf("REPLAYS/S: over the last %.1f s\n", rate_window_s);
            break;
        }
out:
    free(cells);
    columns_free(&cols);
}

/* {name: {fields}} ⇒ [{name, fields...}] so that keyed objects print as tables. */
static json_t *keyed_to_rows(json_t *obj)
{
    json_t *rows = json_array();
    const char *key;
    json_t *v;
    json_object_foreach(obj, key, v)
    {
        json_t *row = json_object();
        json_object_set_new(row, "name", json_string(key));
        if (json_is_object(v))
            json_object_update(row, v);
        else
            json_object_set(row, "value", v);
        json_array_append_new(rows, row);
    }
    return rows;
}

static void print_section(const char *key, json_t *v)
{
    const section_t *sec = find_section(key);
    char title[CELL_MAX];
    if (sec != NULL) {
        snprintf(title, sizeof(title), "%s", sec->title);
    } else {
        snprintf(title, sizeof(title), "%s", key);
        if (title[0] >= 'a' && title[0] <= 'z')
            title[0] = (char)(title[0] - 'a' + 'A');
        for (char *p = title; *p != '\0'; p++)
            if (*p == '_')
                *p = ' ';
    }
    printf("# %s\n", title);
    if (json_is_array(v)) {
        print_table(sec, v);
    } else if (json_is_object(v)) {
        json_t *rows = keyed_to_rows(v);
        print_table(sec, rows);
        json_decref(rows);
    }
    printf("\n");
}

/* "2026-12-03 22:50:01 UTC" for a Unix time in milliseconds. */
static void fmt_utc(char *out, size_t n, double unix_ms)
{
    time_t t = (time_t)(unix_ms / 1000);
    struct tm tm;
    if (gmtime_r(&t, &tm) == NULL || strftime(out, n, "%Y-%m-%d %H:%M:%S UTC", &tm) == 0)
        snprintf(out, n, "%.0f", unix_ms / 1000);
}

/* Scalars of obj as an aligned "key  value" block; nested objects/arrays follow as sections,
 * except the daemon's "config" (print_status prints it last, with --config). The daemon's
 * uptime and start are one line. */
static void print_block(const char *title, json_t *obj)
{
    const char *key;
    json_t *v;
    size_t width = 0;
    json_t *started = json_object_get(obj, "started_unix_ms");
    json_t *uptime = json_object_get(obj, "uptime_ms");
    int one_line = json_is_number(started) && json_is_number(uptime);
    json_object_foreach(obj, key, v)
    {
        char label[CELL_MAX];
        label_of(label, sizeof(label), key);
        if (!json_is_object(v) && !json_is_array(v) && strlen(label) > width)
            width = strlen(label);
    }
    printf("# %s\n", title);
    json_object_foreach(obj, key, v)
    {
        if (json_is_object(v) || json_is_array(v) ||
            (one_line && strcmp(key, "started_unix_ms") == 0))
            continue;
        char label[CELL_MAX], cell[CELL_MAX];
        int num;
        label_of(label, sizeof(label), key);
        fmt_value(cell, sizeof(cell), key, v, &num);
        if (one_line && strcmp(key, "uptime_ms") == 0) {
            char when[64];
            fmt_utc(when, sizeof(when), json_number_value(started));
            size_t len = strlen(cell);
            snprintf(cell + len, sizeof(cell) - len, " (started %s)", when);
        }
        printf("%-*s  %s\n", (int)width, label, cell);
    }
    printf("\n");
    json_object_foreach(obj, key, v)
    {
        if ((json_is_object(v) || json_is_array(v)) && strcmp(key, "config") != 0)
            print_section(key, v);
    }
}

/* The sections in Status's order, the daemon block first and its settings last (only with
 * show_config: they are the same on every call and would push the rest off the screen). */
static void print_status(json_t *root, int show_config)
{
    const char *key;
    json_t *v;
    json_t *daemon = json_object_get(root, "daemon");
    if (json_is_object(daemon))
        print_block("Daemon", daemon);
    json_object_foreach(root, key, v)
    {
        if (strcmp(key, "daemon") == 0 || (!json_is_object(v) && !json_is_array(v)))
            continue; /* schema_version is for programs */
        if (strcmp(key, "others") == 0)
            print_block("Others (not yours: counts only)", v);
        else if (json_is_object(v))
            print_block(key, v);
        else
            print_section(key, v);
    }
    json_t *config = json_object_get(daemon, "config");
    if (show_config && config != NULL)
        print_section("config", config);
}

static void print_json(json_t *v)
{
    char *s = json_dumps(v, JSON_INDENT(2) | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
    if (s != NULL)
        printf("%s\n", s);
    free(s);
}

/* ---- commands -------------------------------------------------------------------------- */

typedef struct opts {
    const char *address;
    const char *device;
    const char *limit;
    const char *mode;
    int json;
    int config;
    double watch; /* seconds between refreshes; 0: print once */
    long count;   /* --count: refreshes to print, 0: until SIGINT */
} opts_t;

/* The Status reply as JSON (graphd_status_json), or NULL after saying why on stderr. */
static json_t *fetch_status(graphd_client_t *c, int *status)
{
    char *buf = NULL;
    size_t len = 0;
    int rc;
    for (int tries = 0; tries < 5; tries++) {
        rc = graphd_status_json(c, buf, &len);
        if (rc != GRAPHD_ETRUNC && (rc != GRAPHD_OK || buf != NULL))
            break;
        free(buf);
        len += 4096; /* room for a status that grows between the two calls */
        buf = malloc(len);
        if (buf == NULL) {
            fprintf(stderr, "graphctl: status: out of memory\n");
            *status = 1;
            return NULL;
        }
    }
    if (rc != GRAPHD_OK) {
        free(buf);
        *status = fail(c, "status", rc);
        return NULL;
    }
    json_error_t jerr;
    json_t *root = json_loads(buf, 0, &jerr);
    free(buf);
    if (root == NULL) {
        fprintf(stderr, "graphctl: status: bad JSON from libgraphd: %s\n", jerr.text);
        *status = 1;
    }
    return root;
}

/* The replays a row of section key counts: pools and sessions "replays", graphs both phases. */
static double replays_of(const char *key, json_t *row)
{
    if (strcmp(key, "graphs") == 0)
        return json_number_value(json_object_get(row, "replays_forward")) +
               json_number_value(json_object_get(row, "replays_backward"));
    return json_number_value(json_object_get(row, "replays"));
}

/* The row of rows whose field id equals want's. */
static json_t *same_row(json_t *rows, const char *id, json_t *want)
{
    size_t i;
    json_t *row;
    json_array_foreach(rows, i, row)
    {
        if (json_equal(json_object_get(row, id), want))
            return row;
    }
    return NULL;
}

/* Adds RATE_KEY (replays/s over secs) to the pools, sessions and graphs of now that prev has
 * too; a row new since prev, or one whose count went down (the daemon restarted), gets none. */
static void add_rates(json_t *now, json_t *prev, double secs)
{
    static const struct {
        const char *section, *id;
    } keyed[] = {{"pools", "name"}, {"sessions", "id"}, {"graphs", "id"}};
    for (size_t k = 0; k < sizeof(keyed) / sizeof(keyed[0]); k++) {
        json_t *rows = json_object_get(now, keyed[k].section);
        json_t *old_rows = json_object_get(prev, keyed[k].section);
        size_t i;
        json_t *row;
        json_array_foreach(rows, i, row)
        {
            json_t *old = same_row(old_rows, keyed[k].id, json_object_get(row, keyed[k].id));
            if (old == NULL || secs <= 0)
                continue;
            double d = replays_of(keyed[k].section, row) - replays_of(keyed[k].section, old);
            if (d >= 0)
                json_object_set_new(row, RATE_KEY, json_real(d / secs));
        }
    }
}

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    (void)sig;
    interrupted = 1;
}

static double now_mono_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Sleeps secs unless SIGINT comes first (no SA_RESTART: nanosleep returns EINTR). */
static void nap(double secs)
{
    struct timespec ts = {(time_t)secs, (long)((secs - (double)(time_t)secs) * 1e9)};
    while (!interrupted && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

/* status, status --watch and top. With --watch: a block per refresh, the screen cleared before
 * each on a terminal (plain blocks one after another otherwise, for a log or a pipe), until
 * SIGINT (exit status 0) or --count refreshes. */
static int cmd_status(graphd_client_t *c, const opts_t *o)
{
    int status = 0;
    if (o->watch <= 0) {
        json_t *root = fetch_status(c, &status);
        if (root == NULL)
            return status;
        if (o->json)
            print_json(root);
        else
            print_status(root, o->config);
        json_decref(root);
        return 0;
    }
    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    int tty = isatty(STDOUT_FILENO);
    json_t *prev = NULL;
    double prev_t = 0;
    for (long n = 0; !interrupted && (o->count == 0 || n < o->count); n++) {
        if (n > 0)
            nap(o->watch);
        if (interrupted)
            break;
        json_t *root = fetch_status(c, &status);
        double t = now_mono_s();
        if (root == NULL)
            break;
        rate_window_s = prev != NULL ? t - prev_t : 0;
        if (prev != NULL)
            add_rates(root, prev, rate_window_s);
        if (o->json) {
            print_json(root);
        } else {
            char when[64];
            fmt_utc(when, sizeof(when), now_unix_ms());
            if (tty)
                printf("\033[H\033[2J");
            printf("graphctl status --watch %g: %s, refresh %ld%s\n\n", o->watch, when, n + 1,
                   tty ? " (Ctrl-C stops)" : "");
            print_status(root, o->config);
        }
        fflush(stdout);
        json_decref(prev);
        prev = root;
        prev_t = t;
    }
    json_decref(prev);
    return status;
}

/* The device as status's JSON has it: numbers the device's family or driver does not give are
 * left out, strings are "" (the proto's absent). */
static json_t *device_json(const graphd_device_t *d)
{
    json_t *o = json_pack("{s:s, s:s, s:I, s:s, s:I, s:I, s:s, s:b}", "id", d->id, "kind", d->kind,
                          "ordinal", (json_int_t)d->ordinal, "name", d->name, "memory_total",
                          (json_int_t)d->memory_total, "memory_free", (json_int_t)d->memory_free,
                          "compute_capability", d->compute_capability, "mps", d->mps);
    if (o == NULL)
        return NULL;
    json_object_set_new(o, "uuid", json_string(d->uuid));
    if (d->compute_units != 0)
        json_object_set_new(o, "compute_units", json_integer(d->compute_units));
    if (d->max_clock_mhz != 0)
        json_object_set_new(o, "max_clock_mhz", json_integer(d->max_clock_mhz));
    json_object_set_new(o, "driver", json_string(d->driver));
    if (!d->have_telemetry) {
        json_object_set_new(o, "telemetry", json_null());
        return o;
    }
    json_t *t = json_object();
    json_object_set_new(t, "read_unix_ms", json_integer((json_int_t)d->telemetry_read_unix_ms));
    json_object_set_new(t, "have_memory", json_boolean(d->have_memory));
    json_object_set_new(t, "have_engine", json_boolean(d->have_engine));
    json_object_set_new(t, "have_utilisation", json_boolean(d->have_utilisation));
    json_object_set_new(t, "have_reset", json_boolean(d->have_reset));
    if (d->have_memory) {
        json_object_set_new(t, "memory_free", json_integer((json_int_t)d->telemetry_memory_free));
        json_object_set_new(t, "memory_total", json_integer((json_int_t)d->telemetry_memory_total));
    }
    if (d->have_engine)
        json_object_set_new(t, "engine_active_us", json_integer((json_int_t)d->engine_active_us));
    if (d->have_utilisation)
        json_object_set_new(t, "utilisation", json_real(d->utilisation));
    json_object_set_new(t, "memory_health", json_string(d->memory_health));
    if (d->have_reset)
        json_object_set_new(t, "wedged", json_boolean(d->wedged));
    json_object_set_new(o, "telemetry", t);
    return o;
}

static const char *const mode_names[] = {"", "private", "group", "public"};

static const char *mode_name(int mode)
{
    return mode >= GRAPHD_POOL_PRIVATE && mode <= GRAPHD_POOL_PUBLIC ? mode_names[mode] : "?";
}

static json_t *pool_json(const graphd_pool_t *p)
{
    return json_pack("{s:s, s:s, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:s, s:b}", "name",
                     p->name, "device", p->device, "limit_bytes", (json_int_t)p->limit_bytes,
                     "reserved_bytes", (json_int_t)p->reserved_bytes, "used_bytes",
                     (json_int_t)p->used_bytes, "regions", (json_int_t)p->regions, "sessions",
                     (json_int_t)p->sessions, "created_unix_ms", (json_int_t)p->created_unix_ms,
                     "graph_mempool_reserved_bytes", (json_int_t)p->graph_mempool_reserved_bytes,
                     "graph_mempool_in_use_bytes", (json_int_t)p->graph_mempool_in_use_bytes,
                     "owner_uid", (json_int_t)p->owner_uid, "mode", mode_name(p->mode),
                     "delete_with_session", p->delete_with_session);
}

static int cmd_devices(graphd_client_t *c, const opts_t *o)
{
    size_t n = 0;
    graphd_device_t *items = NULL;
    int rc = graphd_list_devices(c, &n, NULL);
    /* The list may grow between the calls: retry on GRAPHD_ETRUNC with the new count. */
    for (int tries = 0; rc == GRAPHD_OK && tries < 5; tries++) {
        free(items);
        items = calloc(n + 1, sizeof(*items));
        if (items == NULL)
            return fail(c, "devices", GRAPHD_ENOMEM);
        rc = graphd_list_devices(c, &n, items);
        if (rc != GRAPHD_ETRUNC || tries == 4)
            break;
        rc = GRAPHD_OK;
    }
    if (rc != GRAPHD_OK) {
        free(items);
        return fail(c, "devices", rc);
    }
    json_t *arr = json_array();
    for (size_t i = 0; i < n; i++)
        json_array_append_new(arr, device_json(&items[i]));
    free(items);
    if (o->json)
        print_json(arr);
    else
        print_section("devices", arr);
    json_decref(arr);
    return 0;
}

/* The pools section of Status, by the same code as status: the same rows and columns. --json:
 * the "pools" array of status --json (docs/OPERATIONS.md, "Reading status"). */
static int cmd_pools(graphd_client_t *c, const opts_t *o)
{
    int status = 0;
    json_t *root = fetch_status(c, &status);
    if (root == NULL)
        return status;
    json_t *pools = json_object_get(root, "pools");
    if (!json_is_array(pools)) {
        json_decref(root);
        fprintf(stderr, "graphctl: pools: the status has no pools list\n");
        return 1;
    }
    if (o->json) {
        print_json(pools);
    } else {
        print_section("pools", pools);
        json_int_t hidden =
            json_integer_value(json_object_get(json_object_get(root, "others"), "pools"));
        if (hidden > 0)
            printf("(%lld more not shown: pools this user may not use)\n", (long long)hidden);
    }
    json_decref(root);
    return 0;
}

static int cmd_pool_create(graphd_client_t *c, const opts_t *o, const char *name, uint64_t limit)
{
    graphd_pool_t p;
    char what[160];
    snprintf(what, sizeof(what), "pool create %s", name);
    int mode = GRAPHD_POOL_DEFAULT;
    for (int m = GRAPHD_POOL_PRIVATE; o->mode != NULL && m <= GRAPHD_POOL_PUBLIC; m++)
        if (strcmp(o->mode, mode_names[m]) == 0)
            mode = m;
    int rc = graphd_pool_create_ex(c, name, o->device, limit, mode, 0, &p);
    if (rc != GRAPHD_OK)
        return fail(c, what, rc);
    if (o->json) {
        json_t *v = pool_json(&p);
        print_json(v);
        json_decref(v);
    } else {
        char lim[CELL_MAX];
        int num;
        json_t *jl = json_integer((json_int_t)p.limit_bytes);
        fmt_value(lim, sizeof(lim), "limit_bytes", jl, &num);
        json_decref(jl);
        printf("pool %s created on %s (limit %s, %s to uid %u)\n", p.name[0] ? p.name : name,
               p.device[0] ? p.device : "?", lim,
               p.mode == GRAPHD_POOL_PUBLIC ? "public, owned by" : mode_name(p.mode),
               (unsigned)p.owner_uid);
    }
    return 0;
}

static int cmd_pool_delete(graphd_client_t *c, const opts_t *o, const char *name)
{
    char what[160];
    snprintf(what, sizeof(what), "pool delete %s", name);
    int rc = graphd_pool_delete(c, name);
    if (rc != GRAPHD_OK)
        return fail(c, what, rc);
    if (o->json) {
        json_t *v = json_pack("{s:s}", "deleted", name);
        print_json(v);
        json_decref(v);
    } else
        printf("pool %s deleted\n", name);
    return 0;
}

int main(int argc, char **argv)
{
    static const struct option longopts[] = {
        {"address", required_argument, NULL, 'a'},
        {"json", no_argument, NULL, 'j'},
        {"device", required_argument, NULL, 'd'},
        {"limit", required_argument, NULL, 'l'},
        {"mode", required_argument, NULL, 'm'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {"config", no_argument, NULL, 'c'},
        {"watch", optional_argument, NULL, 'w'},
        {"count", required_argument, NULL, 'n'},
        {NULL, 0, NULL, 0},
    };
    opts_t o = {0};
    int watch = 0;
    const char *interval = NULL, *count = NULL;
    int opt;
    opterr = 0;
    while ((opt = getopt_long(argc, argv, ":a:jhV", longopts, NULL)) != -1) {
        switch (opt) {
        case 'a':
            o.address = optarg;
            break;
        case 'j':
            o.json = 1;
            break;
        case 'd':
            o.device = optarg;
            break;
        case 'l':
            o.limit = optarg;
            break;
        case 'm':
            o.mode = optarg;
            break;
        case 'c':
            o.config = 1;
            break;
        case 'w':
            watch = 1;
            interval = optarg;
            break;
        case 'n':
            count = optarg;
            break;
        case 'h':
            fputs(usage, stdout);
            return 0;
        case 'V':
            printf("graphctl %s\n", GRAPHD_VERSION);
            return 0;
        case ':':
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }

    int npos = argc - optind;
    char **pos = argv + optind;
    if (npos == 0)
        return usage_error("%s", "no command given");
    const char *cmd = pos[0];
    /* top [SECONDS] is status --watch [SECONDS]; "--watch 5" (not "--watch=5") leaves 5 here */
    int is_top = strcmp(cmd, "top") == 0;
    if (is_top || (watch && strcmp(cmd, "status") == 0)) {
        watch = 1;
        if (npos == 2 && interval == NULL)
            interval = pos[1], npos = 1;
        cmd = "status";
    }
    if (watch && strcmp(cmd, "status") != 0)
        return usage_error("%s", "--watch goes with 'status' (or use 'top')");
    if (count != NULL && !watch)
        return usage_error("%s", "--count goes with 'status --watch' or 'top'");
    if (o.config && strcmp(cmd, "status") != 0)
        return usage_error("%s", "--config goes with 'status'");
    if (watch) {
        char *end = NULL;
        o.watch = interval != NULL ? strtod(interval, &end) : 2.0;
        if (interval != NULL &&
            (end == interval || *end != '\0' || !(o.watch >= 0.1) || o.watch > 86400))
            return usage_error("bad refresh interval '%s' (seconds, 0.1 to 86400: e.g. 2 or "
                               "0.5)",
                               interval);
    }
    if (count != NULL) {
        char *end = NULL;
        errno = 0;
        o.count = strtol(count, &end, 10);
        if (end == count || *end != '\0' || errno != 0 || o.count < 1)
            return usage_error("bad --count '%s' (a number of refreshes, 1 or more)", count);
    }
    int is_create = strcmp(cmd, "pool") == 0 && npos >= 2 && strcmp(pos[1], "create") == 0;
    if ((o.device != NULL || o.limit != NULL || o.mode != NULL) && !is_create)
        return usage_error("%s", "--device, --limit and --mode go with 'pool create'");
    if (o.mode != NULL && strcmp(o.mode, "private") != 0 && strcmp(o.mode, "group") != 0 &&
        strcmp(o.mode, "public") != 0)
        return usage_error("bad pool mode '%s' (private, group or public)", o.mode);
    uint64_t limit = 0;
    if (o.limit != NULL && graphd_parse_bytes(o.limit, &limit) != 0)
        return usage_error("bad byte count '%s' (e.g. 4096, 64M, 1Gi)", o.limit);

    enum { STATUS, DEVICES, POOLS, CREATE, DELETE } which;
    if (strcmp(cmd, "status") == 0 && npos == 1)
        which = STATUS;
    else if (strcmp(cmd, "devices") == 0 && npos == 1)
        which = DEVICES;
    else if (strcmp(cmd, "pools") == 0 && npos == 1)
        which = POOLS;
    else if (is_create && npos == 3)
        which = CREATE;
    else if (strcmp(cmd, "pool") == 0 && npos == 3 && strcmp(pos[1], "delete") == 0)
        which = DELETE;
    else if (strcmp(cmd, "pool") == 0)
        return usage_error("%s", "usage: pool create NAME [--device DEV] [--limit BYTES] | "
                                 "pool delete NAME");
    else if (strcmp(cmd, "status") == 0 || strcmp(cmd, "devices") == 0 || strcmp(cmd, "pools") == 0)
        return usage_error("'%s' takes no arguments", cmd);
    else
        return usage_error("unknown command '%s'", cmd);

    graphd_client_t *c;
    int status = 1;
    int rc = graphd_connect(o.address, &c);
    if (rc != GRAPHD_OK) {
        const char *msg = graphd_last_error(NULL);
        const char *env = getenv("GRAPHD_ADDRESS");
        const char *addr = o.address != NULL               ? o.address
                           : env != NULL && env[0] != '\0' ? env
                                                           : GRAPHD_DEFAULT_ADDRESS;
        const char *from = o.address != NULL               ? ""
                           : env != NULL && env[0] != '\0' ? " (from GRAPHD_ADDRESS)"
                                                           : " (the default)";
        fprintf(stderr, "graphctl: cannot use address '%s'%s: %s: %s\n", addr, from,
                graphd_err_name(rc), msg[0] != '\0' ? msg : graphd_strerror(rc));
        return 1;
    }
    /* A session identifies the caller (SO_PEERCRED): pools belong to it, and status shows what
     * it may see. devices needs none. */
    if (which != DEVICES) {
        rc = graphd_hello(c, "graphctl");
        if (rc != GRAPHD_OK && (rc == GRAPHD_EUNAVAILABLE || (which != STATUS && which != POOLS))) {
            status = fail(c,
                          which == CREATE   ? "pool create"
                          : which == DELETE ? "pool delete"
                                            : "session",
                          rc);
            graphd_close(c);
            return status;
        }
        if (rc != GRAPHD_OK)
            fprintf(stderr, "graphctl: no session (%s): showing counts only\n",
                    graphd_last_error(c));
    }
    switch (which) {
    case STATUS:
        status = cmd_status(c, &o);
        break;
    case DEVICES:
        status = cmd_devices(c, &o);
        break;
    case POOLS:
        status = cmd_pools(c, &o);
        break;
    case CREATE:
        status = cmd_pool_create(c, &o, pos[2], limit);
        break;
    case DELETE:
        status = cmd_pool_delete(c, &o, pos[2]);
        break;
    }
    graphd_close(c);
    if (fflush(stdout) != 0 && status == 0) {
        fprintf(stderr, "graphctl: writing output: %s\n", strerror(errno));
        status = 1;
    }
    return status;
}
