/*
 * The settings table and everything that reads it: defaults, the INI file,
 * command-line overrides, formatting for status, and reload.
 */
#include "config.h"
#include "graphd_bytes.h"
#include "log.h"

#include <errno.h>
#include <ini.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#define FIELD(f) offsetof(gd_config_t, f)
#define KiB 1024ull
#define MiB (1024ull * KiB)
#define GiB (1024ull * MiB)
#define TiB (1024ull * GiB)

const gd_setting_t gd_settings[] = {
    {"listen", GD_CFG_STRING, FIELD(listen), GD_DEFAULT_LISTEN, 0, 0, false,
     "control-plane address: unix:PATH, or host:port (TCP needs tls_cert and tls_key)", NULL},
    {"session_socket", GD_CFG_STRING, FIELD(session_socket), "", 0, 0, false,
     "data-plane socket path (empty: the listen path with .session appended)", NULL},
    {"socket_group", GD_CFG_STRING, FIELD(socket_group), "graphd", 0, 0, false,
     "group given access to the sockets, when it exists", NULL},
    {"socket_mode", GD_CFG_OCTAL, FIELD(socket_mode), "0660", 0, 0777, false,
     "permission bits of the sockets", NULL},
    {"tls_cert", GD_CFG_STRING, FIELD(tls_cert), "", 0, 0, false,
     "PEM certificate chain for a TCP listener", NULL},
    {"tls_key", GD_CFG_STRING, FIELD(tls_key), "", 0, 0, false,
     "PEM private key for a TCP listener", NULL},
    {"metrics_listen", GD_CFG_STRING, FIELD(metrics_listen), "", 0, 0, false,
     "address of the Prometheus endpoint GET /metrics: IP:PORT, e.g. 127.0.0.1:9464 or "
     "[::1]:9464 (empty: off; docs/OPERATIONS.md lists the metrics)",
     NULL},
    {"log_level", GD_CFG_LOG_LEVEL, FIELD(log_level), "info", 0, 3, true,
     "error, warn, info or debug", NULL},
    {"max_message_bytes", GD_CFG_BYTES, FIELD(max_message_bytes), "64Mi", 1 * KiB, 2 * GiB - 1,
     false, "largest gRPC message accepted", NULL},
    {"max_region_bytes", GD_CFG_BYTES, FIELD(max_region_bytes), "64Gi", 4 * KiB, 16 * TiB, true,
     "largest single shared region", NULL},
    {"default_pool_limit", GD_CFG_BYTES, FIELD(default_pool_limit), "0", 0, 16 * TiB * 64, true,
     "byte limit of pools created without one (0: none)", NULL},
    {"default_pool", GD_CFG_STRING, FIELD(default_pool), "default", 0, 0, false,
     "pool created on cpu:0 at start and used when a request names none (empty: none)", NULL},
    {"max_sessions", GD_CFG_UINT, FIELD(max_sessions), "1024", 1, 1000000, true,
     "most client sessions at once", NULL},
    {"max_sessions_per_uid", GD_CFG_UINT, FIELD(max_sessions_per_uid), "256", 1, 1000000, true,
     "most attached sessions of one uid at once (checked at ATTACH, when the uid is known)", NULL},
    {"max_pools_per_uid", GD_CFG_UINT, FIELD(max_pools_per_uid), "64", 0, 1000000, true,
     "most pools one uid may own (the default pool not counted)", NULL},
    {"max_graphs_per_session", GD_CFG_UINT, FIELD(max_graphs_per_session), "1024", 1, 1000000, true,
     "most graphs one session may hold, captures in flight included", NULL},
    {"max_regions_per_session", GD_CFG_UINT, FIELD(max_regions_per_session), "4096", 1, 1000000,
     true, "most regions one session may hold, its graphs' static regions included", NULL},
    {"attach_timeout_ms", GD_CFG_UINT, FIELD(attach_timeout_ms), "10000", 100, 3600000, true,
     "how long a new session may take to attach its session socket", NULL},
    {"shutdown_grace_ms", GD_CFG_UINT, FIELD(shutdown_grace_ms), "5000", 0, 600000, true,
     "how long SIGTERM waits for in-flight calls before cancelling them", NULL},
    {"inline_module_max_bytes", GD_CFG_BYTES, FIELD(inline_module_max_bytes), "4Mi", 0, 1 * GiB,
     true, "largest module archive accepted inline in a RegisterModule request", NULL},
    {"max_module_unpacked_bytes", GD_CFG_BYTES, FIELD(max_module_unpacked_bytes), "4Gi", 1 * MiB,
     1 * TiB, false,
     "largest total a module archive's files may unpack to (checked in its ZIP directory "
     "before loading)",
     NULL},
    {"max_call_memory_bytes", GD_CFG_BYTES, FIELD(max_call_memory_bytes), "0", 0, 1 * TiB * 64,
     false,
     "host memory one capture or replay may hold through libtorch at once; past it that call "
     "fails with RESOURCE_EXHAUSTED (0: half the machine's memory)",
     NULL},
    {"executor_path", GD_CFG_STRING, FIELD(executor_path), "", 0, 0, false,
     "the graphd-executor binary that runs module code (empty: beside graphd, else "
     "../libexec/graphd/ from it)",
     NULL},
    {"executor_sandbox", GD_CFG_UINT, FIELD(executor_sandbox), "1", 0, 1, false,
     "1: executors enter Landlock and seccomp before loading any module; 0: they do not "
     "(only for debugging: module code can then read what the daemon's user can)",
     NULL},
    {"max_load_ms", GD_CFG_UINT, FIELD(max_load_ms), "120000", 0, 86400000, true,
     "longest a module load may take in its executor; past it the executor is killed and the "
     "call fails with DEADLINE_EXCEEDED (0: no bound)",
     NULL},
    {"max_capture_ms", GD_CFG_UINT, FIELD(max_capture_ms), "600000", 0, 86400000, true,
     "longest one capture step (warm-up and layout, or the capture itself) may take; past it "
     "the executor is killed and the call fails with DEADLINE_EXCEEDED (0: no bound)",
     NULL},
    {"reuse_warmup", GD_CFG_UINT, FIELD(reuse_warmup), "1", 0, 1, true,
     "1: a capture skips its warm-up where the tenant's executor has warmed up the same module "
     "archive, method and sample specs before and the warm-up could change no state (no random "
     "ops, no buffers, nothing outside the method written, floating-point args only; "
     "docs/ARCHITECTURE.md); 0: every capture runs its num_warmup_iters warm-up iterations",
     NULL},
    {"max_replay_ms", GD_CFG_UINT, FIELD(max_replay_ms), "60000", 0, 86400000, true,
     "longest one replay may take; past it the tenant's executor on that device is killed, "
     "the replay fails with DEADLINE_EXCEEDED and the tenant's graphs there are gone (0: no "
     "bound)",
     NULL},
    {"max_executor_memory_bytes", GD_CFG_BYTES, FIELD(max_executor_memory_bytes), "0", 0,
     1 * TiB * 64, true,
     "resident memory one executor (one uid on one device) may hold; past it the watchdog "
     "kills it and its call fails with RESOURCE_EXHAUSTED (0: three quarters of the machine's "
     "memory); also its cgroup's memory.max where executor_cgroup applies",
     NULL},
    {"executor_cgroup", GD_CFG_UINT, FIELD(executor_cgroup), "1", 0, 1, false,
     "1: where the daemon has a delegated cgroup v2 (systemd Delegate=yes), each executor gets "
     "a child cgroup with memory.max = max_executor_memory_bytes, and the kernel kills it past "
     "that (RESOURCE_EXHAUSTED); 0, or no delegated cgroup: the RSS watchdog",
     NULL},
    {"cpu_devices", GD_CFG_UINT, FIELD(cpu_devices), "1", 1, 8, false,
     "logical CPU devices cpu:0..cpu:N-1, each with its own worker thread and pools (a split of "
     "the queues, not of the cores: all share the host's cores and libtorch's intra-op "
     "threading, whose intra_op_threads is process-wide)",
     NULL},
    {"intra_op_threads", GD_CFG_UINT, FIELD(intra_op_threads), "0", 0, 1024, false,
     "libtorch intra-op threads per device worker (0: libtorch's default)", NULL},
    {"worker_spin_us", GD_CFG_UINT, FIELD(worker_spin_us), "50", 0, 100000, false,
     "how long an idle device worker polls for the next job before sleeping (lower replay "
     "latency for a core's time; 0 on hosts with fewer than 4 CPUs)",
     NULL},
    {"worker_idle_ms", GD_CFG_UINT, FIELD(worker_idle_ms), "10000", 0, 86400000, false,
     "how long the worker thread of an executor (one per uid and device) waits for a job before "
     "it exits; the next job starts it again (0: threads never exit)",
     NULL},
    {"replay_spin_us", GD_CFG_UINT, FIELD(replay_spin_us), "2000", 0, 100000, false,
     "after a device-resident replay, how long the event loop and the device's worker poll for "
     "the next one before sleeping: a training step's next replay comes hundreds of "
     "microseconds later, and each sleeping thread takes tens of microseconds to wake (a core "
     "each while a GPU trains; 0 on hosts with fewer than 4 CPUs)",
     NULL},
    {"replay_spin_slice_us", GD_CFG_UINT, FIELD(replay_spin_slice_us), "20", 0, 1000, false,
     "while an executor polls after a device-resident replay (replay_spin_us) and every one of "
     "its connections is on a replay ring, how long it watches the rings in user space, with the "
     "CPU's spin-wait hint, between polls of its sockets (a frame on a socket waits up to this "
     "much longer); 0: a poll() on every turn",
     NULL},
    {"executor_cuda_queues", GD_CFG_UINT, FIELD(executor_cuda_queues), "32", 0, 32, false,
     "hardware queues a CUDA executor asks for (CUDA_DEVICE_MAX_CONNECTIONS, at most 32; 0: "
     "CUDA's default or the environment's). Each session's replays have a stream of their own, "
     "and streams sharing a queue run in one order, so a session waiting for its client would "
     "hold up the others on its queue; under MPS the queues come from the MPS server's shared "
     "supply, so lower it where training processes then fail to start with 'out of memory'",
     NULL},
    {"reply_buffer_max_bytes", GD_CFG_BYTES, FIELD(reply_buffer_max_bytes), "1Mi", 4 * KiB, 1 * GiB,
     false,
     "replies a session socket may hold unsent because its client does not read them (beyond "
     "the kernel's socket buffer); a client past it is disconnected and its session ended",
     NULL},
    {"max_queued_replays", GD_CFG_UINT, FIELD(max_queued_replays), "4096", 1, 100000000, true,
     "replays one session may have queued on one device and not yet started; the next is "
     "answered RESOURCE_EXHAUSTED",
     NULL},
    {"xpu", GD_CFG_CHOICE, FIELD(xpu), "auto", 0, 1, false,
     "auto: list the Intel GPUs (xpu:N) that a Level Zero driver finds; off: do not open Level "
     "Zero at all",
     "auto|off"},
};
const size_t gd_settings_count = sizeof gd_settings / sizeof gd_settings[0];

const gd_setting_t *gd_setting_find(const char *name)
{
    for (size_t i = 0; i < gd_settings_count; i++) {
        const char *a = gd_settings[i].name, *b = name;
        /* Flags spell underscores as dashes; accept both everywhere. */
        while (*a && (*a == *b || (*a == '_' && *b == '-')))
            a++, b++;
        if (*a == 0 && *b == 0)
            return &gd_settings[i];
    }
    return NULL;
}

int gd_parse_bytes(const char *s, uint64_t *out)
{
    return graphd_parse_bytes(s, out);
}

int gd_config_set(gd_config_t *cfg, const gd_setting_t *s, const char *value, char *err,
                  size_t errlen)
{
    void *field = (char *)cfg + s->offset;
    uint64_t v = 0;
    char *end = NULL;
    switch (s->type) {
    case GD_CFG_STRING: {
        char *copy = strdup(value);
        if (copy == NULL) {
            snprintf(err, errlen, "%s: out of memory", s->name);
            return -1;
        }
        free(*(char **)field);
        *(char **)field = copy;
        return 0;
    }
    case GD_CFG_LOG_LEVEL: {
        int level = gd_log_level_parse(value);
        if (level < 0) {
            snprintf(err, errlen, "%s: '%s' is not one of error, warn, info, debug", s->name,
                     value);
            return -1;
        }
        *(uint64_t *)field = (uint64_t)level;
        return 0;
    }
    case GD_CFG_CHOICE: {
        const char *w = s->choices;
        for (uint64_t i = 0; w != NULL && *w; i++) {
            size_t n = strcspn(w, "|");
            if (strlen(value) == n && strncmp(w, value, n) == 0) {
                *(uint64_t *)field = i;
                return 0;
            }
            w += n + (w[n] == '|');
        }
        snprintf(err, errlen, "%s: '%s' is not one of %s", s->name, value,
                 s->choices ? s->choices : "");
        return -1;
    }
    case GD_CFG_UINT:
    case GD_CFG_OCTAL:
        errno = 0;
        v = strtoull(value, &end, s->type == GD_CFG_OCTAL ? 8 : 10);
        if (errno != 0 || end == value || *end != 0 || value[0] == '-') {
            snprintf(err, errlen, "%s: '%s' is not a%s number", s->name, value,
                     s->type == GD_CFG_OCTAL ? "n octal" : "");
            return -1;
        }
        break;
    case GD_CFG_BYTES:
        if (gd_parse_bytes(value, &v) != 0) {
            snprintf(err, errlen, "%s: '%s' is not a byte count (e.g. 4096, 64Mi, 2G)", s->name,
                     value);
            return -1;
        }
        break;
    }
    if (v < s->min || v > s->max) {
        snprintf(err, errlen, "%s: %" PRIu64 " is outside [%" PRIu64 ", %" PRIu64 "]", s->name, v,
                 s->min, s->max);
        return -1;
    }
    *(uint64_t *)field = v;
    return 0;
}

void gd_config_format(const gd_config_t *cfg, const gd_setting_t *s, char *buf, size_t len)
{
    const void *field = (const char *)cfg + s->offset;
    switch (s->type) {
    case GD_CFG_STRING:
        snprintf(buf, len, "%s", *(char *const *)field ? *(char *const *)field : "");
        break;
    case GD_CFG_LOG_LEVEL:
        snprintf(buf, len, "%s", gd_log_level_name((int)*(const uint64_t *)field));
        break;
    case GD_CFG_OCTAL:
        snprintf(buf, len, "0%03" PRIo64, *(const uint64_t *)field);
        break;
    case GD_CFG_CHOICE: {
        const char *w = s->choices ? s->choices : "";
        for (uint64_t i = *(const uint64_t *)field; i > 0 && *w; i--)
            w += strcspn(w, "|") + (w[strcspn(w, "|")] == '|');
        snprintf(buf, len, "%.*s", (int)strcspn(w, "|"), w);
        break;
    }
    default:
        snprintf(buf, len, "%" PRIu64, *(const uint64_t *)field);
    }
}

struct ini_ctx {
    gd_config_t *cfg;
    char *err;
    size_t errlen;
    int failed;
};

static int on_ini_entry(void *user, const char *section, const char *name, const char *value)
{
    struct ini_ctx *ctx = user;
    if (ctx->failed)
        return 0;
    if (section[0] != 0 && strcmp(section, "graphd") != 0) {
        snprintf(ctx->err, ctx->errlen, "unknown section [%s] (settings go in [graphd])", section);
        ctx->failed = 1;
        return 0;
    }
    const gd_setting_t *s = gd_setting_find(name);
    if (s == NULL) {
        snprintf(ctx->err, ctx->errlen, "unknown setting '%s'", name);
        ctx->failed = 1;
        return 0;
    }
    if (gd_config_set(ctx->cfg, s, value, ctx->err, ctx->errlen) != 0) {
        ctx->failed = 1;
        return 0;
    }
    return 1;
}

static int derive(gd_config_t *cfg, char *err, size_t errlen)
{
    bool is_unix = strncmp(cfg->listen, "unix:", 5) == 0;
    if (!is_unix && (cfg->tls_cert[0] == 0 || cfg->tls_key[0] == 0)) {
        snprintf(
            err, errlen,
            "listen: '%s' is TCP; a TCP listener needs tls_cert and tls_key (or use unix:PATH)",
            cfg->listen);
        return -1;
    }
    if (is_unix && cfg->listen[5] == 0) {
        snprintf(err, errlen, "listen: empty unix socket path");
        return -1;
    }
    if (cfg->session_socket[0] == 0) {
        char path[4096];
        if (is_unix)
            snprintf(path, sizeof path, "%s.session", cfg->listen + 5);
        else
            snprintf(path, sizeof path, "/run/graphd/graphd.sock.session");
        free(cfg->session_socket);
        cfg->session_socket = strdup(path);
        if (cfg->session_socket == NULL) {
            snprintf(err, errlen, "out of memory");
            return -1;
        }
    }
    if (strlen(cfg->session_socket) >= 108) {
        snprintf(err, errlen, "session_socket: path longer than 107 bytes: %s",
                 cfg->session_socket);
        return -1;
    }
    return 0;
}

int gd_config_load(gd_config_t *cfg, const char *path, bool required, const gd_overrides_t *ov,
                   char *err, size_t errlen)
{
    memset(cfg, 0, sizeof *cfg);
    for (size_t i = 0; i < gd_settings_count; i++)
        if (gd_config_set(cfg, &gd_settings[i], gd_settings[i].def, err, errlen) != 0)
            goto fail;
    if (path != NULL) {
        FILE *f = fopen(path, "r");
        if (f == NULL) {
            if (required || errno != ENOENT) {
                snprintf(err, errlen, "cannot read config file %s: %s", path, strerror(errno));
                goto fail;
            }
        } else {
            struct ini_ctx ctx = {cfg, err, errlen, 0};
            int rc = ini_parse_file(f, on_ini_entry, &ctx);
            fclose(f);
            if (ctx.failed || rc != 0) {
                char inner[512];
                snprintf(inner, sizeof inner, "%s", ctx.failed ? err : "syntax error");
                snprintf(err, errlen, "%s:%d: %s", path, rc, inner);
                goto fail;
            }
        }
    }
    for (size_t i = 0; ov != NULL && i < ov->count; i++)
        if (gd_config_set(cfg, ov->setting[i], ov->value[i], err, errlen) != 0)
            goto fail;
    if (derive(cfg, err, errlen) != 0)
        goto fail;
    return 0;
fail:
    gd_config_free(cfg);
    return -1;
}

int gd_config_apply_reload(gd_config_t *cur, const gd_config_t *next,
                           void (*warn)(const char *name))
{
    int changed = 0;
    for (size_t i = 0; i < gd_settings_count; i++) {
        const gd_setting_t *s = &gd_settings[i];
        char a[4096], b[4096];
        gd_config_format(cur, s, a, sizeof a);
        gd_config_format(next, s, b, sizeof b);
        if (strcmp(a, b) == 0)
            continue;
        if (!s->reloadable) {
            if (warn)
                warn(s->name);
            continue;
        }
        char err[256];
        if (gd_config_set(cur, s, b, err, sizeof err) == 0) {
            gd_info("reload: %s = %s (was %s)", s->name, b, a);
            changed++;
        }
    }
    return changed;
}

void gd_config_free(gd_config_t *cfg)
{
    for (size_t i = 0; i < gd_settings_count; i++) {
        if (gd_settings[i].type == GD_CFG_STRING) {
            char **p = (char **)((char *)cfg + gd_settings[i].offset);
            free(*p);
            *p = NULL;
        }
    }
}

void gd_overrides_free(gd_overrides_t *ov)
{
    for (size_t i = 0; i < ov->count; i++)
        free(ov->value[i]);
    ov->count = 0;
}
