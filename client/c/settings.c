/*
 * The client settings: one table of the environment variables that libgraphd and the Python
 * package read (name, type, accepted values, default, what it does), and the one reader that
 * checks and normalizes them. graphd_connect and the Python package (through graphd_setting)
 * read every setting here; client/python/README.md ("Settings (environment)") documents the
 * same rows.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/sysinfo.h>

#include "graphd_int.h"

typedef enum {
    SET_ADDRESS, /* a gRPC target; a bare absolute path becomes "unix:PATH" */
    SET_PATH,    /* a file name, taken as given */
    SET_UINT,    /* a decimal integer in [min, max] */
    SET_CHOICE,  /* one of choices */
    SET_BOOL,    /* 0 or 1 */
} set_type_t;

typedef struct setting {
    const char *name;
    set_type_t type;
    const char *def;             /* the default; NULL: def_fn() */
    const char *(*def_fn)(void); /* a default that depends on the host */
    unsigned long min, max;      /* SET_UINT */
    const char *const *choices;  /* SET_CHOICE: NULL-terminated */
    const char *doc;
} setting_t;

/* 200 µs on hosts with at least 4 CPUs and 0 on smaller ones, where the polling thread would take
 * the core the daemon needs to answer. */
static const char *spin_default(void)
{
    return get_nprocs() >= 4 ? "200" : "0";
}

static const char *const replay_orders[] = {"posted", "events", "sync", NULL};
static const char *const trace_caches[] = {"disk", "memory", "off", NULL};

static const setting_t settings[] = {
    {"GRAPHD_ADDRESS", SET_ADDRESS, GRAPHD_DEFAULT_ADDRESS, NULL, 0, 0, NULL,
     "daemon address when the program names none: unix:PATH, a bare /PATH (read as unix:PATH), "
     "or host:port (always TLS)"},
    {"GRAPHD_TIMEOUT_MS", SET_UINT, "60000", NULL, 1, 24ul * 3600 * 1000, NULL,
     "deadline of each RPC and session-socket exchange, in milliseconds"},
    {"GRAPHD_SPIN_US", SET_UINT, NULL, spin_default, 0, 100000, NULL,
     "how long a session-socket exchange polls for its reply before blocking, in microseconds "
     "(default 200 on hosts with 4 or more CPUs, else 0)"},
    {"GRAPHD_DIRECT", SET_BOOL, "1", NULL, 0, 1, NULL,
     "1: REPLAY frames go straight to the executor that holds the graph, on a replay connection "
     "per executor; 0: through the daemon's session socket (one hop more)"},
    {"GRAPHD_REPLAY_RING", SET_BOOL, "1", NULL, 0, 1, NULL,
     "1: posted replays go to the executor through a ring in memory shared with it, with no "
     "system call while the executor is awake; 0: a REPLAY frame each on the replay connection "
     "(needs GRAPHD_DIRECT=1)"},
    {"GRAPHD_TLS_CA", SET_PATH, "", NULL, 0, 0, NULL,
     "PEM file of the roots trusted for a TCP address (a private CA or the daemon's self-signed "
     "certificate); empty: gRPC's default roots"},
    {"GRAPHD_REPLAY_ORDER", SET_CHOICE, "posted", NULL, 0, 0, replay_orders,
     "how device-resident replays are ordered against the caller's CUDA stream: posted "
     "(sequence counters both streams write and wait for, no answer waited for), events (CUDA "
     "IPC events, each replay waits for the daemon's launch), sync (the Python package "
     "synchronises both sides; libgraphd posts)"},
    {"GRAPHD_COPY_PARAM_GRADS", SET_BOOL, "0", NULL, 0, 1, NULL,
     "device-resident captures of the Python package: 1 has BACKWARD copy each parameter "
     "gradient into the graph's own region instead of leaving it in the graph mempool (C "
     "callers set graphd_capture_opts_t.copy_param_grads)"},
    {"GRAPHD_ZE_LOADER", SET_PATH, "libze_loader.so.1", NULL, 0, 0, NULL,
     "the Level Zero loader libgraphd loads (dlopen) the first time it maps an xpu region "
     "(Debian: package libze1); a name is searched as dlopen does, a path taken as given"},
    {"GRAPHD_REPLAY_PROFILE", SET_BOOL, "0", NULL, 0, 1, NULL,
     "1: libgraphd times the parts of each posted replay call (the drain of earlier answers, "
     "the frame or ring slot, the stream operations, the rest) and prints their means to stderr "
     "when the "
     "process exits; for profiles (bench/step_profile.py), not for production"},
    {"GRAPHD_SLOW_CAPTURE_S", SET_UINT, "2", NULL, 0, 86400, NULL,
     "the Python package logs one line (logger \"graphd\") when make_graphed_callables has been "
     "tracing and capturing for this many seconds, and one when it ends; 0: for every capture"},
    {"GRAPHD_TRACE_CACHE", SET_CHOICE, "disk", NULL, 0, 0, trace_caches,
     "the Python package's traced archives reused across captures of the same module structure "
     "and sample specs: disk (in memory and in GRAPHD_TRACE_CACHE_DIR, so a new process skips "
     "the trace too), memory (this process only), off (trace every capture)"},
    {"GRAPHD_TRACE_CACHE_DIR", SET_PATH, "", NULL, 0, 0, NULL,
     "directory of the disk trace cache, which must be the user's own with mode 0700; empty: "
     "$XDG_CACHE_HOME/graphd/traces, else ~/.cache/graphd/traces"},
};

#define NSETTINGS (sizeof(settings) / sizeof(settings[0]))

static const setting_t *find(const char *name)
{
    for (size_t i = 0; name != NULL && i < NSETTINGS; i++)
        if (strcmp(settings[i].name, name) == 0)
            return &settings[i];
    return NULL;
}

const char *graphd_setting_name(size_t index)
{
    return index < NSETTINGS ? settings[index].name : NULL;
}

/*
 * An address graphd listens on: unix:/ABSOLUTE/PATH (or the bare path), unix-abstract:NAME, or
 * HOST:PORT (TLS), as gRPC takes them. Anything else is refused here with what to write instead:
 * gRPC would take a relative path or a URL for a DNS name and fail with its resolver's words,
 * and the session socket (the data plane) would fail with "Failed parsing HTTP/2".
 */
static int normalize_address(const char *name, const char *value, char *out, size_t size, char *err,
                             size_t errlen)
{
    static const char expected[] = "expected unix:/ABSOLUTE/PATH (or the bare absolute path) of "
                                   "graphd's control socket, or HOST:PORT of a TLS listener";
    const char *path = NULL;
    if (value[0] == '/')
        path = value;
    else if (strncmp(value, "unix:", 5) == 0)
        path = value + 5;
    if (path != NULL) {
        if (path[0] != '/') {
            snprintf(err, errlen, "%s=%s is not valid: a unix socket path must be absolute (%s)",
                     name, value, expected);
            return GRAPHD_EINVALID_ARGUMENT;
        }
        size_t n = strlen(path);
        if (n >= 8 && strcmp(path + n - 8, ".session") == 0) {
            snprintf(err, errlen,
                     "%s=%s is not valid: that is graphd's session socket (its data plane); give "
                     "the control socket, unix:%.*s",
                     name, value, (int)(n - 8), path);
            return GRAPHD_EINVALID_ARGUMENT;
        }
        snprintf(out, size, "unix:%s", path);
        return GRAPHD_OK;
    }
    if (strncmp(value, "unix-abstract:", 14) == 0 || strncmp(value, "dns:", 4) == 0 ||
        strncmp(value, "ipv4:", 5) == 0 || strncmp(value, "ipv6:", 5) == 0) {
        snprintf(out, size, "%s", value);
        return GRAPHD_OK;
    }
    const char *colon = strrchr(value, ':');
    const char *scheme = strstr(value, "://");
    char *end = NULL;
    unsigned long port = colon ? strtoul(colon + 1, &end, 10) : 0;
    if (scheme != NULL || colon == NULL || colon == value || colon[1] == '\0' || *end != '\0' ||
        port == 0 || port > 65535 || strchr(value, '/') != NULL) {
        snprintf(err, errlen, "%s=%s is not valid: %s%s", name, value, expected,
                 scheme                                ? " (not a URL)"
                 : strchr(value, '/') || colon == NULL ? " (a path must be absolute)"
                                                       : "");
        return GRAPHD_EINVALID_ARGUMENT;
    }
    snprintf(out, size, "%s", value);
    return GRAPHD_OK;
}

/* Checks value against s's type; on success writes the normalized value to out, which has room
 * for GRAPHD__SETTING_MAX + 8 bytes (value is shorter than GRAPHD__SETTING_MAX). */
static int normalize(const setting_t *s, const char *value, char *out, char *err, size_t errlen)
{
    const size_t size = GRAPHD__SETTING_MAX + 8;
    switch (s->type) {
    case SET_ADDRESS:
        return normalize_address(s->name, value, out, size, err, errlen);
    case SET_PATH:
        snprintf(out, size, "%s", value);
        return GRAPHD_OK;
    case SET_UINT: {
        char *end;
        errno = 0;
        unsigned long v = strtoul(value, &end, 10);
        if (value[0] < '0' || value[0] > '9' || *end != '\0' || errno != 0 || v < s->min ||
            v > s->max) {
            snprintf(err, errlen, "%s=%s is not valid: expected an integer from %lu to %lu",
                     s->name, value, s->min, s->max);
            return GRAPHD_EINVALID_ARGUMENT;
        }
        snprintf(out, size, "%lu", v); /* "007" => "7" */
        return GRAPHD_OK;
    }
    case SET_CHOICE: {
        char accepted[256] = "";
        size_t used = 0;
        for (const char *const *c = s->choices; *c != NULL; c++) {
            if (strcmp(*c, value) == 0) {
                snprintf(out, size, "%s", *c);
                return GRAPHD_OK;
            }
            int n = snprintf(accepted + used, sizeof(accepted) - used, "%s%s",
                             c == s->choices ? "" : ", ", *c);
            if (n > 0 && (size_t)n < sizeof(accepted) - used)
                used += (size_t)n;
        }
        snprintf(err, errlen, "%s=%s is not valid: expected one of %s", s->name, value, accepted);
        return GRAPHD_EINVALID_ARGUMENT;
    }
    case SET_BOOL:
        if (strcmp(value, "0") != 0 && strcmp(value, "1") != 0) {
            snprintf(err, errlen, "%s=%s is not valid: expected 0 or 1", s->name, value);
            return GRAPHD_EINVALID_ARGUMENT;
        }
        snprintf(out, size, "%s", value);
        return GRAPHD_OK;
    }
    snprintf(err, errlen, "%s: a setting of unknown type", s->name);
    return GRAPHD_EINTERNAL;
}

/* The normalized value of s for value (NULL or "": the default) into buf[size]. */
static int resolve(const setting_t *s, const char *value, char *buf, size_t size, char *err,
                   size_t errlen)
{
    if (value == NULL || value[0] == '\0') /* set but empty: the default, as unset */
        value = s->def != NULL ? s->def : s->def_fn();
    if (strlen(value) >= GRAPHD__SETTING_MAX) {
        snprintf(err, errlen, "%s is not valid: longer than %d bytes", s->name,
                 GRAPHD__SETTING_MAX - 1);
        return GRAPHD_EINVALID_ARGUMENT;
    }
    char out[GRAPHD__SETTING_MAX + 8];
    int rc = normalize(s, value, out, err, errlen);
    if (rc != GRAPHD_OK)
        return rc;
    size_t n = strlen(out);
    if (n >= size) {
        snprintf(err, errlen, "%s needs %zu bytes, the buffer has %zu", s->name, n + 1, size);
        return GRAPHD_ETRUNC;
    }
    memcpy(buf, out, n + 1);
    return GRAPHD_OK;
}

int graphd__setting(const char *name, char *buf, size_t size, char *err, size_t errlen)
{
    const setting_t *s = find(name);
    if (s == NULL) {
        snprintf(err, errlen, "%s is not a graphd client setting", name != NULL ? name : "(null)");
        return GRAPHD_ENOT_FOUND;
    }
    return resolve(s, getenv(s->name), buf, size, err, errlen);
}

int graphd__setting_uint(const char *name, unsigned long *out, char *err, size_t errlen)
{
    char buf[32];
    int rc = graphd__setting(name, buf, sizeof(buf), err, errlen);
    if (rc == GRAPHD_OK)
        *out = strtoul(buf, NULL, 10);
    return rc;
}

int graphd__address(const char *address, char *buf, size_t size, char *err, size_t errlen)
{
    if (address == NULL || address[0] == '\0')
        return graphd__setting("GRAPHD_ADDRESS", buf, size, err, errlen);
    return resolve(find("GRAPHD_ADDRESS"), address, buf, size, err, errlen);
}

int graphd_setting(const char *name, char *buf, size_t *len)
{
    char value[GRAPHD__SETTING_MAX + 8];
    char err[GRAPHD__ERRMSG_MAX];
    if (len == NULL)
        return graphd__fail_thread(GRAPHD_EINVALID_ARGUMENT, "len is NULL");
    int rc = graphd__setting(name, value, sizeof(value), err, sizeof(err));
    if (rc != GRAPHD_OK)
        return graphd__fail_thread(rc, "%s", err);
    size_t need = strlen(value) + 1;
    rc = GRAPHD_OK;
    if (buf != NULL && *len >= need)
        memcpy(buf, value, need);
    else if (buf != NULL)
        rc = graphd__fail_thread(GRAPHD_ETRUNC, "%s needs %zu bytes, the buffer has %zu", name,
                                 need, *len);
    *len = need;
    if (rc == GRAPHD_OK)
        graphd__clear_thread_error();
    return rc;
}
