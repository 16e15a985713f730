/*
 * The metrics text (Prometheus text exposition format 0.0.4) built from the Status reply as
 * gd_viewer_all sees it, plus the counters Status does not carry (RPCs by method and code,
 * captures). docs/OPERATIONS.md lists every metric; keep the two in step.
 */
#include "metrics.h"
#include "status.h"

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The bucket bounds of the histograms: 2^k ns for k in [HIST_K_MIN, HIST_K_MAX], where the
 * daemon's log-linear histograms have exact bucket boundaries (1.024 us to 17.2 s). */
#define HIST_K_MIN 10
#define HIST_K_MAX 34

static void family(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* A label value with \, " and newline escaped, as the format wants. */
static void label_value(FILE *f, const char *v)
{
    for (; v && *v; v++) {
        if (*v == '\\' || *v == '"')
            fputc('\\', f), fputc(*v, f);
        else if (*v == '\n')
            fputs("\\n", f);
        else
            fputc(*v, f);
    }
}

/* name{k1="v1",k2="v2"} value: labels is a NULL-ended list of key, value pairs. */
static void sample(FILE *f, const char *name, const char *const *labels, uint64_t value)
{
    fputs(name, f);
    for (size_t i = 0; labels && labels[i]; i += 2) {
        fprintf(f, "%s%s=\"", i ? "," : "{", labels[i]);
        label_value(f, labels[i + 1]);
        fputc('"', f);
    }
    if (labels && labels[0])
        fputc('}', f);
    fprintf(f, " %" PRIu64 "\n", value);
}

static void sample_double(FILE *f, const char *name, double value)
{
    fprintf(f, "%s %.3f\n", name, value);
}

/* A histogram of ns samples in seconds: _bucket{le} for each 2^k ns, +Inf, _sum and _count.
 * A sample of exactly 2^k ns counts in the next bucket up (it starts the daemon's bucket). */
static void histogram(FILE *f, const char *name, const char *const *labels, const gd_hist_t *h)
{
    char bucket[128], le[32];
    const char *lab[16];
    size_t n = 0;
    for (; labels && labels[n] && n < 12; n += 2)
        lab[n] = labels[n], lab[n + 1] = labels[n + 1];
    lab[n] = "le";
    lab[n + 1] = le;
    lab[n + 2] = NULL;
    snprintf(bucket, sizeof bucket, "%s_bucket", name);
    uint64_t count = gd_hist_count(h);
    for (unsigned k = HIST_K_MIN; k <= HIST_K_MAX; k++) {
        uint64_t below = gd_hist_below_pow2(h, k);
        snprintf(le, sizeof le, "%.10g", ldexp(1.0, (int)k) / 1e9);
        sample(f, bucket, lab, below < count ? below : count); /* count is read last */
    }
    snprintf(le, sizeof le, "+Inf");
    sample(f, bucket, lab, count);
    fputs(name, f);
    fputs("_sum", f);
    for (size_t i = 0; i < n; i += 2) {
        fprintf(f, "%s%s=\"", i ? "," : "{", lab[i]);
        label_value(f, lab[i + 1]);
        fputc('"', f);
    }
    fprintf(f, "%s %.17g\n", n ? "}" : "", (double)gd_hist_sum(h) / 1e9);
    char cname[128];
    snprintf(cname, sizeof cname, "%s_count", name);
    sample(f, cname, labels, count);
}

static void daemon_section(FILE *f, const Graphd__V1__StatusReply *rep)
{
    const Graphd__V1__DaemonStatus *ds = rep->daemon;
    family(f, "graphd_build_info", "gauge", "graphd's version, as a label; always 1");
    sample(f, "graphd_build_info", (const char *[]){"version", ds->version, NULL}, 1);
    family(f, "graphd_up", "gauge", "1 while graphd answers");
    sample(f, "graphd_up", NULL, 1);
    family(f, "graphd_start_time_seconds", "gauge", "when graphd started, in Unix seconds");
    sample_double(f, "graphd_start_time_seconds", (double)ds->started_unix_ms / 1e3);
    family(f, "graphd_uptime_seconds", "gauge", "seconds since graphd started");
    sample_double(f, "graphd_uptime_seconds", (double)ds->uptime_ms / 1e3);
    family(f, "graphd_sessions", "gauge", "client sessions open, attached or not");
    sample(f, "graphd_sessions", NULL, ds->sessions);
    family(f, "graphd_modules_loaded", "gauge", "distinct module archives loaded, per uid");
    sample(f, "graphd_modules_loaded", NULL, ds->modules_loaded);
    family(f, "graphd_config_reloads_total", "counter", "SIGHUP reloads of the settings");
    sample(f, "graphd_config_reloads_total", NULL, ds->config_reloads);
    family(f, "graphd_replays_dropped_total", "counter",
           "queued replays of ended sessions, removed unrun");
    sample(f, "graphd_replays_dropped_total", NULL, ds->replays_dropped);
    family(f, "graphd_clients_disconnected_total", "counter",
           "sessions ended for not reading their replies (reply_buffer_max_bytes)");
    sample(f, "graphd_clients_disconnected_total", NULL, ds->clients_disconnected);
}

static void devices_section(FILE *f, const Graphd__V1__StatusReply *rep)
{
    family(f, "graphd_device_info", "gauge", "one per device served, its identity as labels");
    for (size_t i = 0; i < rep->n_devices; i++) {
        const Graphd__V1__Device *m = rep->devices[i];
        sample(f, "graphd_device_info",
               (const char *[]){"device", m->id, "kind", m->kind, "name", m->name,
                                "compute_capability", m->compute_capability, NULL},
               1);
    }
    static const struct {
        const char *name, *help;
    } fams[] = {
        {"graphd_device_memory_total_bytes", "the device's memory"},
        {"graphd_device_memory_free_bytes", "the device's memory free, as its driver says"},
        {"graphd_device_memory_used_bytes", "total minus free: used by any process"},
        {"graphd_device_memory_reserved_bytes", "reserved by graphd's pools on the device"},
        {"graphd_device_mps", "CUDA: 1 when graphd's contexts go through an MPS server"},
    };
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
        family(f, fams[k].name, "gauge", fams[k].help);
        for (size_t i = 0; i < rep->n_devices; i++) {
            const Graphd__V1__Device *m = rep->devices[i];
            uint64_t v = 0;
            switch (k) {
            case 0:
                v = m->memory_total;
                break;
            case 1:
                v = m->memory_free;
                break;
            case 2:
                v = m->memory_total > m->memory_free ? m->memory_total - m->memory_free : 0;
                break;
            case 3:
                for (size_t p = 0; p < rep->n_pools; p++)
                    if (strcmp(rep->pools[p]->device, m->id) == 0)
                        v += rep->pools[p]->reserved_bytes;
                break;
            default:
                v = m->mps;
            }
            sample(f, fams[k].name, (const char *[]){"device", m->id, NULL}, v);
        }
    }
}

static void pools_section(FILE *f, const gd_status_t *st)
{
    const Graphd__V1__StatusReply *rep = &st->rep;
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"graphd_pool_limit_bytes", "gauge", "the pool's byte limit (0: none)"},
        {"graphd_pool_reserved_bytes", "gauge", "bytes the pool's regions reserve"},
        {"graphd_pool_used_bytes", "gauge", "bytes of the pool in use"},
        {"graphd_pool_regions", "gauge", "regions in the pool"},
        {"graphd_pool_graphs", "gauge", "captured graphs in the pool"},
        {"graphd_pool_sessions", "gauge", "sessions holding regions in the pool"},
        {"graphd_pool_graph_mempool_reserved_bytes", "gauge",
         "CUDA: device memory of the pool's graph mempool"},
        {"graphd_pool_graph_mempool_used_bytes", "gauge",
         "CUDA: the part of the graph mempool in use"},
        {"graphd_pool_replays_total", "counter", "replays run in the pool (graphs gone included)"},
    };
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
        family(f, fams[k].name, fams[k].type, fams[k].help);
        for (size_t p = 0; p < rep->n_pools; p++) {
            const Graphd__V1__Pool *m = rep->pools[p];
            const uint64_t v[] = {m->limit_bytes,
                                  m->reserved_bytes,
                                  m->used_bytes,
                                  m->regions,
                                  m->graphs,
                                  m->sessions,
                                  m->graph_mempool_reserved_bytes,
                                  m->graph_mempool_in_use_bytes,
                                  m->replays};
            sample(f, fams[k].name, (const char *[]){"pool", m->name, "device", m->device, NULL},
                   v[k]);
        }
    }
    family(f, "graphd_pool_replay_duration_seconds", "histogram",
           "replay latency in the pool, from the request read to the answer sent");
    for (size_t p = 0; p < rep->n_pools; p++) {
        const Graphd__V1__Pool *m = rep->pools[p];
        histogram(f, "graphd_pool_replay_duration_seconds",
                  (const char *[]){"pool", m->name, "device", m->device, NULL},
                  &st->pool_latency[p]);
    }
}

/* Per uid: the attached sessions' figures summed (unattached ones have no uid yet). */
static void uids_section(FILE *f, const Graphd__V1__StatusReply *rep)
{
    static const char *const names[] = {"graphd_uid_sessions", "graphd_uid_regions",
                                        "graphd_uid_region_bytes"};
    static const char *const helps[] = {"attached sessions of the uid",
                                        "regions the uid's sessions hold",
                                        "bytes of the regions the uid's sessions hold"};
    for (size_t k = 0; k < 3; k++) {
        family(f, names[k], "gauge", helps[k]);
        for (size_t i = 0; i < rep->n_sessions; i++) {
            const Graphd__V1__SessionStatus *s = rep->sessions[i];
            bool first = s->attached;
            for (size_t j = 0; j < i && first; j++)
                first = !(rep->sessions[j]->attached && rep->sessions[j]->uid == s->uid);
            if (!first)
                continue;
            uint64_t v = 0;
            for (size_t j = i; j < rep->n_sessions; j++) {
                const Graphd__V1__SessionStatus *o = rep->sessions[j];
                if (o->attached && o->uid == s->uid)
                    v += k == 0 ? 1 : k == 1 ? o->regions : o->bytes;
            }
            char uid[16];
            snprintf(uid, sizeof uid, "%u", s->uid);
            sample(f, names[k], (const char *[]){"uid", uid, NULL}, v);
        }
    }
}

static void captures_section(FILE *f, const gd_daemon_t *d)
{
    family(f, "graphd_captures_total", "counter", "captures started");
    sample(f, "graphd_captures_total", NULL, d->captures);
    family(f, "graphd_capture_failures_total", "counter", "captures that ended in an error");
    sample(f, "graphd_capture_failures_total", NULL, d->captures_failed);
    family(f, "graphd_capture_warmups_reused_total", "counter",
           "graphs captured without a warm-up of their own (reuse_warmup)");
    sample(f, "graphd_capture_warmups_reused_total", NULL, d->warmups_reused);
    family(f, "graphd_capture_duration_seconds", "histogram",
           "captures from their first step queued to their end, failed ones included");
    histogram(f, "graphd_capture_duration_seconds", NULL, &d->capture_latency);
}

static void rpc_section(FILE *f, const gd_daemon_t *d)
{
    if (d->rpc == NULL)
        return;
    const gd_method_t *methods;
    size_t n = gd_rpc_methods(d->rpc, &methods);
    family(f, "graphd_rpc_calls_total", "counter",
           "gRPC calls finished, by method and status code (OK always shown)");
    for (size_t i = 0; i <= n; i++) {
        const char *method = i < n ? strrchr(methods[i].path, '/') + 1 : "unknown";
        for (int code = 0; code < GD_RPC_CODES; code++) {
            uint64_t v = gd_rpc_calls_by(d->rpc, i, code);
            if (v || (code == 0 && i < n))
                sample(f, "graphd_rpc_calls_total",
                       (const char *[]){"method", method, "code", gd_status_name(code), NULL}, v);
        }
    }
}

static void executors_section(FILE *f, const Graphd__V1__StatusReply *rep)
{
    static const struct {
        const char *name, *type, *help;
    } fams[] = {
        {"graphd_executor_starts_total", "counter", "times the executor process started"},
        {"graphd_executor_time_kills_total", "counter",
         "kills past max_load_ms, max_capture_ms or max_replay_ms"},
        {"graphd_executor_memory_kills_total", "counter",
         "kills past max_executor_memory_bytes (watchdog or cgroup)"},
        {"graphd_executor_deaths_total", "counter", "exits graphd did not ask for"},
        {"graphd_executor_resident_bytes", "gauge", "the executor's resident memory"},
    };
    for (size_t k = 0; k < sizeof fams / sizeof fams[0]; k++) {
        family(f, fams[k].name, fams[k].type, fams[k].help);
        for (size_t i = 0; i < rep->n_executors; i++) {
            const Graphd__V1__ExecutorStatus *e = rep->executors[i];
            const uint64_t v[] = {e->starts, e->killed_time, e->killed_memory, e->died,
                                  e->rss_bytes};
            char uid[16];
            snprintf(uid, sizeof uid, "%u", e->uid);
            sample(f, fams[k].name, (const char *[]){"uid", uid, "device", e->device, NULL}, v[k]);
        }
    }
}

int gd_metrics_text(gd_daemon_t *d, char **text, size_t *len)
{
    *text = NULL;
    *len = 0;
    gd_status_t *st = calloc(1, sizeof *st);
    if (st == NULL)
        return -1;
    if (gd_status_build(d, gd_viewer_all, st) != 0) {
        gd_status_release(st);
        free(st);
        return -1;
    }
    FILE *f = open_memstream(text, len);
    if (f != NULL) {
        daemon_section(f, &st->rep);
        devices_section(f, &st->rep);
        pools_section(f, st);
        uids_section(f, &st->rep);
        captures_section(f, d);
        rpc_section(f, d);
        executors_section(f, &st->rep);
    }
    gd_status_release(st);
    free(st);
    if (f == NULL || fclose(f) != 0) {
        free(*text);
        *text = NULL;
        return -1;
    }
    return 0;
}
