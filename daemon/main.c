/*
 * graphd: start-up, signals and shutdown. Builds the daemon context from the
 * config, starts the gRPC server and the session socket, and runs the libuv
 * loop until SIGTERM/SIGINT have drained the in-flight calls.
 */
#include "activation.h"
#include "cgroup.h"
#include "daemon.h"
#include "log.h"
#include "metrics.h"
#include "runtime.h"

#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <systemd/sd-daemon.h>
#include <sys/syscall.h>
#include <unistd.h>

/* Writes text at indent, wrapped at 80 columns (words longer than a line stay whole). */
static void wrap(FILE *out, const char *text, int indent)
{
    int col = 0;
    const char *p = text;
    while (*p) {
        while (*p == ' ')
            p++;
        size_t n = strcspn(p, " ");
        if (n == 0)
            break;
        if (col > indent && col + 1 + (int)n > 80) {
            fputc('\n', out);
            col = 0;
        }
        if (col == 0)
            col = fprintf(out, "%*s", indent, "");
        else
            col += fprintf(out, " ");
        col += fprintf(out, "%.*s", (int)n, p);
        p += n;
    }
    if (col > 0)
        fputc('\n', out);
}

static void flag_name(const char *setting, char *flag, size_t len)
{
    snprintf(flag, len, "%s", setting);
    for (char *p = flag; *p; p++)
        if (*p == '_')
            *p = '-';
}

static void usage(FILE *out)
{
    fprintf(out, "usage: graphd [--config FILE] [--SETTING VALUE ...]\n"
                 "       graphd --check-config [--config FILE] [--SETTING VALUE ...]\n\n"
                 "  --config FILE    settings file (default " GD_DEFAULT_CONFIG ")\n"
                 "  --check-config   read and check the settings, print them, and exit\n"
                 "  --version        print the version and exit\n"
                 "  --help           print this help and exit\n\n"
                 "settings (also 'name = value' under [graphd] in the file):\n");
    for (size_t i = 0; i < gd_settings_count; i++) {
        const gd_setting_t *st = &gd_settings[i];
        char flag[64], line[512];
        flag_name(st->name, flag, sizeof flag);
        fprintf(out, "  --%s\n", flag);
        snprintf(line, sizeof line, "%s. Default: %s%s.", st->help, st->def[0] ? st->def : "empty",
                 st->reloadable ? "; reloadable (SIGHUP)" : "");
        wrap(out, line, 6);
    }
}

/* The setting whose flag is closest to arg ("--max-session" -> max_sessions), or NULL when
 * none is close: a prefix of it, or at most 2 edits away. */
static const gd_setting_t *closest_setting(const char *arg)
{
    while (*arg == '-')
        arg++;
    char want[64];
    snprintf(want, sizeof want, "%.*s", (int)strcspn(arg, "="), arg);
    const gd_setting_t *best = NULL;
    size_t best_d = 3;
    for (size_t i = 0; i < gd_settings_count; i++) {
        char flag[64];
        flag_name(gd_settings[i].name, flag, sizeof flag);
        size_t a = strlen(want), b = strlen(flag);
        if (a >= 4 && strncmp(flag, want, a) == 0)
            return &gd_settings[i];
        if (a > 63 || b > 63)
            continue;
        size_t prev[64], cur[64]; /* Levenshtein distance, two rows */
        for (size_t j = 0; j <= b; j++)
            prev[j] = j;
        for (size_t k = 1; k <= a; k++) {
            cur[0] = k;
            for (size_t j = 1; j <= b; j++) {
                size_t sub = prev[j - 1] + (want[k - 1] != flag[j - 1]);
                size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
                cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
            }
            memcpy(prev, cur, (b + 1) * sizeof prev[0]);
        }
        if (prev[b] < best_d) {
            best_d = prev[b];
            best = &gd_settings[i];
        }
    }
    return best;
}

/* Parses argv into d->config_path and d->overrides. Returns -1 to exit 0, 0 to go on, 2 on a
 * usage error, 3 for --check-config. */
static int parse_args(gd_daemon_t *d, int argc, char **argv)
{
    struct option opts[GD_MAX_SETTINGS + 5];
    static char names[GD_MAX_SETTINGS][64];
    size_t n = 0;
    for (size_t i = 0; i < gd_settings_count && n < GD_MAX_SETTINGS; i++) {
        flag_name(gd_settings[i].name, names[n], sizeof names[n]);
        opts[n] = (struct option){names[n], required_argument, NULL, 1000 + (int)i};
        n++;
    }
    opts[n++] = (struct option){"config", required_argument, NULL, 'c'};
    opts[n++] = (struct option){"help", no_argument, NULL, 'h'};
    opts[n++] = (struct option){"version", no_argument, NULL, 'V'};
    opts[n++] = (struct option){"check-config", no_argument, NULL, 'C'};
    opts[n] = (struct option){NULL, 0, NULL, 0};
    d->config_path = GD_DEFAULT_CONFIG;
    bool check = false;
    int c;
    opterr = 0; /* one line of our own instead of getopt's and the whole help */
    while ((c = getopt_long(argc, argv, ":c:hV", opts, NULL)) != -1) {
        if (c == 'h') {
            usage(stdout);
            return -1;
        }
        if (c == 'V') {
            printf("graphd %s\n", GRAPHD_VERSION);
            return -1;
        }
        if (c == 'C') {
            check = true;
            continue;
        }
        if (c == 'c') {
            d->config_path = optarg;
            d->config_required = true;
            continue;
        }
        if (c >= 1000 && d->overrides.count < GD_MAX_SETTINGS) {
            d->overrides.setting[d->overrides.count] = &gd_settings[c - 1000];
            d->overrides.value[d->overrides.count] = strdup(optarg);
            d->overrides.count++;
            continue;
        }
        const char *bad = argv[optind - 1];
        if (c == ':') {
            fprintf(stderr, "graphd: %s needs a value (--%s VALUE); see graphd --help\n", bad,
                    bad + strspn(bad, "-"));
            return 2;
        }
        const gd_setting_t *near = closest_setting(bad);
        char flag[64] = "";
        if (near)
            flag_name(near->name, flag, sizeof flag);
        fprintf(stderr, "graphd: unknown option '%s'%s%s%s; see graphd --help\n", bad,
                near ? " (did you mean --" : "", flag, near ? "?)" : "");
        return 2;
    }
    if (optind < argc) {
        fprintf(stderr,
                "graphd: unexpected argument '%s'; settings are --NAME VALUE, see graphd "
                "--help\n",
                argv[optind]);
        return 2;
    }
    return check ? 3 : 0;
}

/* --check-config: the settings as graphd would run with them, or the first error. */
static int check_config(gd_daemon_t *d)
{
    char err[512];
    if (gd_config_load(&d->cfg, d->config_path, d->config_required, &d->overrides, err,
                       sizeof err) != 0) {
        fprintf(stderr, "graphd: %s\n", err);
        return 1;
    }
    if (gd_metrics_check(d->cfg.metrics_listen, err, sizeof err) != 0) {
        fprintf(stderr, "graphd: %s\n", err);
        gd_config_free(&d->cfg);
        return 1;
    }
    printf("# %s: OK\n", d->config_path);
    for (size_t i = 0; i < gd_settings_count; i++) {
        char v[4096];
        gd_config_format(&d->cfg, &gd_settings[i], v, sizeof v);
        printf("%s = %s\n", gd_settings[i].name, v);
    }
    gd_config_free(&d->cfg);
    return 0;
}

static void warn_not_reloadable(const char *name)
{
    gd_warn("reload: %s cannot change while running; restart graphd to apply it", name);
}

static void reload(gd_daemon_t *d)
{
    sd_notify(0, "RELOADING=1");
    gd_config_t next;
    char err[512];
    if (gd_config_load(&next, d->config_path, d->config_required, &d->overrides, err, sizeof err) !=
        0) {
        gd_error("reload: %s; keeping the running config", err);
    } else {
        int changed = gd_config_apply_reload(&d->cfg, &next, warn_not_reloadable);
        gd_config_free(&next);
        gd_log_set_level((int)d->cfg.log_level);
        pm_manager_set_max_region(d->pools, d->cfg.max_region_bytes);
        gd_graphs_reload(d);
        d->reloads++;
        gd_info("reload: %d setting%s changed", changed, changed == 1 ? "" : "s");
    }
    sd_notify(0, "READY=1");
}

static void on_close_walk(uv_handle_t *h, void *arg)
{
    (void)arg;
    if (!uv_is_closing(h))
        uv_close(h, NULL);
}

/* Everything drained: tear the rest down so that uv_run returns. */
static void on_rpc_idle(void *ctx)
{
    gd_daemon_t *d = ctx;
    gd_info("all calls finished; stopping");
    uv_timer_stop(&d->grace);
    gd_sessions_end_all(d);
    gd_sessions_close_listener(d);
    gd_graphs_stop(d);
    gd_metrics_stop(d);
    gd_rpc_destroy(d->rpc);
    d->rpc = NULL;
    if (strncmp(d->cfg.listen, "unix:", 5) == 0 && !gd_activation_active())
        unlink(d->cfg.listen + 5); /* systemd's socket stays for the next daemon */
    uv_walk(d->loop, on_close_walk, NULL);
}

static void on_grace_expired(uv_timer_t *t)
{
    gd_daemon_t *d = t->data;
    if (!d->calls_cancelled) {
        gd_warn("calls still in flight after %llu ms; cancelling them",
                (unsigned long long)d->cfg.shutdown_grace_ms);
        d->calls_cancelled = true;
        gd_rpc_cancel_all(d->rpc);
        uv_timer_start(&d->grace, on_grace_expired,
                       d->cfg.shutdown_grace_ms ? d->cfg.shutdown_grace_ms : 1, 0);
        return;
    }
    /* A cancelled call whose job never comes back: a worker in a module that does not return
     * (a forward that loops for ever). Nothing can stop that thread, and tearing down what it
     * uses would crash, so the daemon exits around it. */
    gd_error("calls still in flight %llu ms after they were cancelled (a module that does not "
             "return?); exiting without them",
             (unsigned long long)d->cfg.shutdown_grace_ms);
    gd_exit_around_stuck_work(d);
}

static void stop(gd_daemon_t *d, const char *why)
{
    if (d->stopping)
        return;
    d->stopping = true;
    sd_notify(0, "STOPPING=1");
    gd_info("%s: draining in-flight calls", why);
    uv_signal_stop(&d->sig_hup);
    uv_timer_stop(&d->tick);
    gd_sessions_close_listener(d);
    gd_activation_stop();
    uv_timer_start(&d->grace, on_grace_expired, d->cfg.shutdown_grace_ms, 0);
    gd_rpc_shutdown(d->rpc, on_rpc_idle);
}

static void on_signal(uv_signal_t *h, int signum)
{
    gd_daemon_t *d = h->data;
    if (signum == SIGHUP) {
        gd_info("SIGHUP: reloading %s", d->config_path);
        reload(d);
        return;
    }
    stop(d, signum == SIGTERM ? "SIGTERM" : "SIGINT");
}

/* Once a second, under systemd: the keep-alive WatchdogSec= waits for (sent from the loop, so a
 * stuck loop gets the daemon restarted), and a STATUS= line that `systemctl status` shows. Both
 * are no-ops without $NOTIFY_SOCKET. */
static void notify_systemd(gd_daemon_t *d)
{
    uint64_t usec;
    if (sd_watchdog_enabled(0, &usec) > 0)
        sd_notify(0, "WATCHDOG=1");
    uint32_t graphs = 0, capturing = 0;
    for (gd_session_t *s = d->sessions; s; s = s->next) {
        graphs += s->graphs;
        capturing += s->capturing;
    }
    if (d->notified_sessions == d->nsessions && d->notified_graphs == graphs &&
        d->notified_capturing == capturing && d->notified_once)
        return;
    d->notified_sessions = d->nsessions, d->notified_graphs = graphs;
    d->notified_capturing = capturing, d->notified_once = true;
    sd_notifyf(0, "STATUS=%u session%s, %u graph%s%s", d->nsessions, d->nsessions == 1 ? "" : "s",
               graphs, graphs == 1 ? "" : "s", capturing ? ", capturing" : "");
}

static void on_tick(uv_timer_t *t)
{
    gd_sessions_expire(t->data);
    notify_systemd(t->data);
}

/* Every shared region holds an open memfd, so allow as many files as the hard limit does. */
static void raise_file_limit(void)
{
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            gd_warn("cannot raise the open-file limit: %s", strerror(errno));
    }
}

static int start(gd_daemon_t *d)
{
    raise_file_limit();
    if (gd_metrics_start(d) != 0)
        return -1;
    if (pm_manager_create(d->cfg.max_region_bytes, &d->pools) != PM_OK) {
        gd_error("cannot create the pool manager");
        return -1;
    }
    gd_devices_discover(d);
    for (size_t i = 0; i < d->ndevices; i++) {
        const gd_device_t *dev = &d->devices[i];
        gd_info("device %s: %s", dev->id, dev->name);
        const gd_family_t *fam = gd_family_of(dev->kind);
        if (fam == NULL || !fam->mps_check)
            continue;
        /* Without MPS every cross-process CUDA dependency switches GPU contexts, several times
         * the cost of an ordered replay under MPS (docs/BENCHMARKS.md, "Ordering probe"): worth
         * a warning for each GPU served. */
        char pipe_dir[PATH_MAX];
        (void)gr_cuda_mps_pipe(pipe_dir, sizeof pipe_dir);
        if (dev->mps)
            gd_info("device %s: MPS server: %s", dev->id, pipe_dir);
        else
            gd_warn("device %s: no MPS control daemon found at %s, so device-resident sessions "
                    "switch GPU contexts on every replay; start `nvidia-cuda-mps-control -d` "
                    "before graphd, with the same CUDA_MPS_PIPE_DIRECTORY for graphd and its "
                    "clients",
                    dev->id, pipe_dir);
    }
    if (gd_graphs_start(d) != 0)
        return -1;
    gd_xpu_start(d);
    if (d->cfg.default_pool[0]) {
        /* The daemon's own, public: every session may use it, none but an admin owns it. */
        pm_pool_t *p = NULL;
        pm_pool_owner_t owner = {(uint32_t)geteuid(), (uint32_t)getegid(), PM_MODE_PUBLIC, 0};
        int rc =
            pm_pool_create(d->pools, d->cfg.default_pool, "cpu:0", d->cfg.default_pool_limit, &p);
        if (rc == PM_OK)
            rc = pm_pool_set_owner(p, &owner);
        if (rc != PM_OK) {
            gd_error("default_pool '%s': %s", d->cfg.default_pool, pm_strerror(rc));
            return -1;
        }
    }
    int activated = gd_activation_take(d); /* graphd.socket: systemd's listening socket */
    if (activated < 0)
        return -1;
    bool is_unix = strncmp(d->cfg.listen, "unix:", 5) == 0 && !activated;
    if (is_unix && gd_socket_prepare(d->cfg.listen + 5) != 0)
        return -1;
    gd_rpc_opts_t ro = {d->cfg.listen, d->cfg.tls_cert, d->cfg.tls_key, d->cfg.max_message_bytes,
                        activated > 0};
    if (gd_rpc_start(d->loop, &ro, gd_methods, gd_methods_count, d, &d->rpc) != 0)
        return -1;
    if (is_unix)
        gd_socket_permissions(d, d->cfg.listen + 5);
    if (activated && gd_activation_start(d) != 0)
        return -1;
    if (gd_sessions_listen(d) != 0)
        return -1;
    gd_info("graphd %s listening on %s%s (pid %d)", GRAPHD_VERSION, d->cfg.listen,
            gd_activation_active() ? " (socket from systemd)" : "", (int)getpid());
    /* Which protections are off, so that an operator does not have to read the docs to know. */
    long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1u /* ..._VERSION */);
    char landlock[96];
    if (abi > 0)
        snprintf(landlock, sizeof landlock, "Landlock ABI %ld", abi);
    else
        snprintf(landlock, sizeof landlock, "NO Landlock (the kernel has none: %s)",
                 strerror(errno));
    char memory[2600];
    if (gd_cgroup_on(d->cgroup))
        snprintf(memory, sizeof memory, "memory bound max_executor_memory_bytes by cgroup v2 (%s)",
                 gd_cgroup_why(d->cgroup));
    else
        snprintf(memory, sizeof memory,
                 "memory bound max_executor_memory_bytes by the RSS watchdog only (cgroup "
                 "memory.max off: %s)",
                 gd_cgroup_why(d->cgroup));
    if (d->cfg.executor_sandbox)
        gd_info("isolation: executors per uid and device, with no_new_privs, seccomp and %s; "
                "time bounds max_load_ms/max_capture_ms/max_replay_ms; %s; docs/SECURITY.md",
                landlock, memory);
    else
        gd_warn("isolation: executors per uid and device WITHOUT Landlock or seccomp "
                "(executor_sandbox = 0): module code can read what the daemon's user can; %s",
                memory);
    return 0;
}

int main(int argc, char **argv)
{
    static gd_daemon_t daemon;
    gd_daemon_t *d = &daemon;
    int rc = parse_args(d, argc, argv);
    if (rc == 3) {
        rc = check_config(d);
        gd_overrides_free(&d->overrides);
        return rc;
    }
    if (rc != 0)
        return rc < 0 ? 0 : rc;
    char err[512];
    if (gd_config_load(&d->cfg, d->config_path, d->config_required, &d->overrides, err,
                       sizeof err) != 0) {
        fprintf(stderr, "graphd: %s\n", err);
        return 2;
    }
    gd_log_set_level((int)d->cfg.log_level);
    /* Before any thread exists: gr_ze_open may setenv(ZES_ENABLE_SYSMAN). */
    gd_xpu_open(d);
    d->loop = uv_default_loop();
    d->started_unix_ms = gd_now_unix_ms();
    d->started_mono_ms = gd_now_mono_ms();
    signal(SIGPIPE, SIG_IGN);

    uv_signal_init(d->loop, &d->sig_term);
    uv_signal_init(d->loop, &d->sig_int);
    uv_signal_init(d->loop, &d->sig_hup);
    d->sig_term.data = d->sig_int.data = d->sig_hup.data = d;
    uv_signal_start(&d->sig_term, on_signal, SIGTERM);
    uv_signal_start(&d->sig_int, on_signal, SIGINT);
    uv_signal_start(&d->sig_hup, on_signal, SIGHUP);
    uv_timer_init(d->loop, &d->tick);
    uv_timer_init(d->loop, &d->grace);
    d->tick.data = d->grace.data = d;

    if (start(d) != 0) {
        gd_error("start-up failed");
        return 1;
    }
    uv_timer_start(&d->tick, on_tick, 1000, 1000);
    sd_notify(0, "READY=1");
    uv_run(d->loop, UV_RUN_DEFAULT);

    int busy = uv_loop_close(d->loop);
    if (busy != 0)
        gd_warn("loop closed with handles open: %s", uv_strerror(busy));
    rc = pm_manager_destroy(d->pools);
    gd_xpu_close(d); /* after the regions: their frees ran on the loop's thread pool */
    if (rc != PM_OK)
        gd_warn("pool manager: %s at exit", pm_strerror(rc));
    gd_config_free(&d->cfg);
    gd_overrides_free(&d->overrides);
    gd_info("graphd stopped");
    return d->exit_code;
}
