/*
 * Executors: module code runs in one process per (uid, device), outside the daemon. A stuck
 * capture or replay is killed at its bound (DEADLINE_EXCEEDED) and an executor over its memory
 * bound by the watchdog (RESOURCE_EXHAUSTED), while another uid's replays go on; two uids never
 * share an executor or each other's shared memory.
 *
 * The attacker is this process (root); the bystander is a child running as another uid with its
 * own client, replaying a small graph the whole time and reporting its worst pause.
 * tests/models/make_models.py: forever.pt (a forward that never returns) and stall.pt (loops
 * x[0] times holding x[1] floats: small at capture, as large as the client writes at replay).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <grp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphd.h"
#include "../lib/harness.h"

#define BYSTANDER_UID 4201

static const char *const daemon_args[] = {
    "--socket-mode", "0666", "--max-capture-ms", "1500", "--max-replay-ms", "1000", NULL};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* One callable over one float32 tensor of the given shape; 0 warm-up iterations. */
static int capture(graphd_client_t *c, uint64_t mid, int ndim, int64_t d0, int64_t d1,
                   graphd_graph_t **g)
{
    graphd_tensor_spec_t arg;
    memset(&arg, 0, sizeof arg);
    arg.dtype = GRAPHD_FLOAT32;
    arg.ndim = (uint32_t)ndim;
    arg.shape[0] = d0;
    arg.shape[1] = d1;
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.num_warmup_iters = 0;
    return graphd_capture(c, 1, &callable, &opts, g);
}

/* ---- the bystander ------------------------------------------------------------------------ */

typedef struct bystander {
    pid_t pid;
    int fd; /* its report: "ready\n", then "<replays> <failures> <worst pause in us>\n" */
} bystander_t;

/* The bystander's process (this binary again, "bystander": a child that only forked would share
 * this process's gRPC state, epoll sets included, and a reply could go to the wrong side): as
 * BYSTANDER_UID, replays mlp.pt for ms milliseconds and writes "ready\n", then its report, to
 * out_fd. */
static _Noreturn void bystander_main(const harness_t *h, const harness_models_t *m, int ms,
                                     int out_fd)
{
    FILE *out = fdopen(out_fd, "w");
    if (out == NULL || setgroups(0, NULL) != 0 ||
        setresgid(BYSTANDER_UID, BYSTANDER_UID, BYSTANDER_UID) ||
        setresuid(BYSTANDER_UID, BYSTANDER_UID, BYSTANDER_UID) != 0)
        _exit(2);
    graphd_client_t *c = harness_client(h, "bystander");
    uint64_t mid = c ? harness_models_register(c, m, "mlp.pt") : 0;
    graphd_graph_t *g = NULL;
    if (mid == 0 || capture(c, mid, 2, 16, 16, &g) != GRAPHD_OK) {
        fprintf(stderr, "bystander: %s\n", c ? graphd_last_error(c) : "no client");
        _exit(3);
    }
    fprintf(out, "ready\n");
    fflush(out);
    uint64_t end = now_ns() + (uint64_t)ms * 1000000ull, worst = 0;
    unsigned replays = 0, failures = 0;
    while (now_ns() < end) {
        uint64_t t0 = now_ns();
        int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
        uint64_t dt = now_ns() - t0;
        worst = dt > worst ? dt : worst;
        replays++;
        if (rc != GRAPHD_OK) {
            failures++;
            fprintf(stderr, "bystander: replay: %s: %s\n", graphd_err_name(rc),
                    graphd_last_error(c));
        }
        usleep(2000);
    }
    fprintf(out, "%u %u %llu\n", replays, failures, (unsigned long long)(worst / 1000));
    fflush(out);
    graphd_graph_release(g);
    graphd_close(c);
    _exit(0);
}

/* Starts the bystander (bystander_main in a fresh process) and waits until it replays. */
static void bystander_start(const harness_t *h, const harness_models_t *m, int ms, bystander_t *b)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    char mss[16], fds[16];
    snprintf(mss, sizeof mss, "%d", ms);
    snprintf(fds, sizeof fds, "%d", p[1]);
    b->pid = fork();
    assert_true(b->pid >= 0);
    if (b->pid == 0) {
        close(p[0]);
        execl("/proc/self/exe", "test_executors", "bystander", h->address, m->dir, mss, fds,
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    b->fd = p[0];
    char line[64] = {0};
    ssize_t n = read(b->fd, line, sizeof line - 1);
    if (n <= 0 || strncmp(line, "ready", 5) != 0)
        fail_msg("the bystander did not start (%zd)", n);
}

/* Waits for the bystander's report: every replay must have worked. */
/* The bystander's report; its worst pause must stay under bound_ms (0: not checked): the issue's
 * "other tenants' replays never pause more than the bound". Its replays go on its own replay
 * connection to its own executor, so a stuck call of another uid does not hold them at all (they
 * waited about the whole bound while replays went through the device's one worker). */
static void bystander_finish(bystander_t *b, const char *during, unsigned bound_ms)
{
    char line[128] = {0};
    size_t got = 0;
    ssize_t n;
    while (got < sizeof line - 1 && (n = read(b->fd, line + got, sizeof line - 1 - got)) > 0)
        got += (size_t)n;
    close(b->fd);
    int st = 0;
    assert_int_equal(waitpid(b->pid, &st, 0), b->pid);
    unsigned replays = 0, failures = 0;
    unsigned long long worst_us = 0;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0 ||
        sscanf(line, "%u %u %llu", &replays, &failures, &worst_us) != 3)
        fail_msg("the bystander failed (status 0x%x, report '%s')", st, line);
    printf("    bystander (uid %d) during %s: %u replays, %u failed, worst pause %.1f ms\n",
           BYSTANDER_UID, during, replays, failures, (double)worst_us / 1000.0);
    assert_int_equal(failures, 0);
    assert_true(replays > 10);
    if (bound_ms && worst_us >= bound_ms * 1000ull)
        fail_msg("the bystander paused %.1f ms during %s, past the bound (%u ms)",
                 (double)worst_us / 1000.0, during, bound_ms);
}

/* ---- tests ------------------------------------------------------------------------------- */

/* A capture whose forward never returns is killed at max_capture_ms: DEADLINE_EXCEEDED naming
 * the bound; the same uid captures again right after (a fresh executor), and the other uid's
 * replays go on throughout. Before executors, the forward held the device's worker for ever. */
static void stuck_capture_is_killed_at_the_bound(void **state)
{
    harness_fixture_t *f = *state;
    bystander_t b;
    bystander_start(&f->h, &f->m, 4000, &b);
    graphd_client_t *c = harness_client(&f->h, "attacker");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, &f->m, "forever.pt");
    assert_true(mid != 0);
    graphd_graph_t *g = NULL;
    uint64_t t0 = now_ns();
    int rc = capture(c, mid, 1, 4, 0, &g);
    double took = (double)(now_ns() - t0) / 1e6;
    printf("    stuck capture answered %s after %.0f ms: %s\n", graphd_err_name(rc), took,
           graphd_last_error(c));
    assert_int_equal(rc, GRAPHD_EDEADLINE_EXCEEDED);
    assert_non_null(strstr(graphd_last_error(c), "max_capture_ms"));
    uint64_t ok = harness_models_register(c, &f->m, "mlp.pt");
    assert_true(ok != 0);
    assert_int_equal(capture(c, ok, 2, 16, 16, &g), GRAPHD_OK);
    assert_int_equal(graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    graphd_graph_release(g);
    graphd_close(c);
    bystander_finish(&b, "a stuck capture", 1500);
}

/* Writes v into element i of g's first INPUT (a host region). */
static void set_input(graphd_graph_t *g, size_t i, float v)
{
    size_t n = 0;
    assert_int_equal(graphd_graph_tensors(g, &n, NULL), GRAPHD_OK);
    graphd_tensor_t *t = calloc(n, sizeof *t);
    assert_non_null(t);
    assert_int_equal(graphd_graph_tensors(g, &n, t), GRAPHD_OK);
    for (size_t k = 0; k < n; k++)
        if (t[k].role == GRAPHD_ROLE_INPUT && t[k].index == 0)
            ((float *)t[k].data)[i] = v;
    free(t);
}

/* Whether the daemon's log holds needle. */
static bool log_has(const harness_t *h, const char *needle)
{
    FILE *f = fopen(h->log_path, "r");
    assert_non_null(f);
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, needle) != NULL;
    fclose(f);
    return found;
}

/* A replay that does not return is killed at max_replay_ms; that graph is gone (ABORTED, capture
 * again), a new capture works, and the other uid's replays go on. A module released while the
 * executor is down is not released again in the next one (whose ids are its own). */
static void stuck_replay_is_killed_at_the_bound(void **state)
{
    harness_fixture_t *f = *state;
    bystander_t b;
    bystander_start(&f->h, &f->m, 3000, &b);
    graphd_client_t *c = harness_client(&f->h, "attacker");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, &f->m, "stall.pt");
    assert_true(mid != 0);
    uint64_t other = harness_models_register(c, &f->m, "mlp.pt");
    assert_true(other != 0);
    graphd_graph_t *g = NULL;
    assert_int_equal(capture(c, mid, 1, 4, 0, &g), GRAPHD_OK);
    set_input(g, 0, 1e15f); /* loops "for ever" */
    set_input(g, 1, 1.0f);
    uint64_t t0 = now_ns();
    int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    double took = (double)(now_ns() - t0) / 1e6;
    printf("    stuck replay answered %s after %.0f ms: %s\n", graphd_err_name(rc), took,
           graphd_last_error(c));
    assert_int_equal(rc, GRAPHD_EDEADLINE_EXCEEDED);
    assert_non_null(strstr(graphd_last_error(c), "max_replay_ms"));
    set_input(g, 0, 0.0f);
    rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    assert_int_equal(rc, GRAPHD_EABORTED);
    assert_non_null(strstr(graphd_last_error(c), "capture again"));
    /* Through the worker: the daemon reaps the killed executor here. */
    assert_int_equal(graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EABORTED);
    assert_int_equal(graphd_module_release(c, other), GRAPHD_OK);
    graphd_graph_release(g);
    assert_int_equal(capture(c, mid, 1, 4, 0, &g), GRAPHD_OK);
    set_input(g, 0, 3.0f);
    set_input(g, 1, 1.0f);
    assert_int_equal(graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    assert_int_equal(graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    graphd_graph_release(g);
    if (log_has(&f->h, "releasing modules in the executor"))
        fail_msg("a module released while its executor was down was released again in the next "
                 "one");
    graphd_close(c);
    bystander_finish(&b, "a stuck replay", 1000);
}

/* An executor that grows past max_executor_memory_bytes is killed by the watchdog: its call fails
 * with RESOURCE_EXHAUSTED naming the bound, and the other uid goes on. A daemon of its own, with
 * no time bound: page faults are slow on a loaded machine, and only the watchdog may end this. */
static void executor_over_its_memory_is_killed(void **state)
{
    harness_fixture_t *f = *state;
    harness_t h;
    static const char *const args[] = {
        "--socket-mode", "0666", "--max-replay-ms", "0", "--max-executor-memory-bytes",
        "640Mi",         NULL};
    assert_int_equal(harness_start(&h, args), 0);
    assert_int_equal(chmod(h.dir, 0755), 0);
    bystander_t b;
    bystander_start(&h, &f->m, 2000, &b);
    graphd_client_t *c = harness_client(&h, "attacker");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, &f->m, "stall.pt");
    assert_true(mid != 0);
    graphd_graph_t *g = NULL;
    assert_int_equal(capture(c, mid, 1, 4, 0, &g), GRAPHD_OK);
    set_input(g, 0, 1e8f);   /* holds it for a while: many seconds of loop */
    set_input(g, 1, 512e6f); /* 2 GiB of ones */
    int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    printf("    the big replay answered %s: %s\n", graphd_err_name(rc), graphd_last_error(c));
    assert_int_equal(rc, GRAPHD_ERESOURCE_EXHAUSTED);
    assert_non_null(strstr(graphd_last_error(c), "max_executor_memory_bytes"));
    graphd_graph_release(g);
    graphd_close(c);
    /* Who killed it: the kernel where executors run under memory.max (cgroup v2 delegated, as
     * with GRAPHD_TEST_CGROUP), else the RSS watchdog. The daemon logs the kernel's kill when it
     * reaps the executor, which may come after the answer (at the graph's release here). */
    bool in_cgroup = log_has(&h, "memory.max per executor under");
    const char *says = in_cgroup ? "killed by the kernel's OOM killer in its cgroup"
                                 : "max_executor_memory_bytes (671088640): killing it";
    bool seen = false;
    for (int64_t t0 = harness_now_ms(); !seen && harness_now_ms() - t0 < 5000; usleep(20000))
        seen = log_has(&h, says);
    printf("    killed by %s\n", in_cgroup ? "the kernel's OOM killer in the executor's cgroup"
                                           : "the RSS watchdog (no cgroup memory.max here)");
    if (!seen)
        fail_msg("the daemon's log does not say \"%s\"", says);
    bystander_finish(&b, "a greedy replay", 0);
    assert_int_equal(harness_stop(&h), 0);
}

/* max_replay_ms is reloadable: after SIGHUP a stuck replay is killed at the new bound. */
static void replay_bound_reloads(void **state)
{
    harness_fixture_t *f = *state;
    char conf[128];
    snprintf(conf, sizeof conf, "/tmp/graphd-exec-reload-%d.conf", (int)getpid());
    FILE *fp = fopen(conf, "w");
    assert_non_null(fp);
    fputs("[graphd]\nmax_replay_ms = 60000\n", fp);
    fclose(fp);
    harness_t h;
    const char *args[] = {"--config", conf, NULL};
    assert_int_equal(harness_start(&h, args), 0);
    graphd_client_t *c = harness_client(&h, "attacker");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, &f->m, "stall.pt");
    assert_true(mid != 0);
    graphd_graph_t *g = NULL;
    assert_int_equal(capture(c, mid, 1, 4, 0, &g), GRAPHD_OK);
    fp = fopen(conf, "w");
    assert_non_null(fp);
    fputs("[graphd]\nmax_replay_ms = 700\n", fp);
    fclose(fp);
    assert_int_equal(kill(h.pid, SIGHUP), 0);
    json_t *st = NULL;
    for (int i = 0; i < 100; i++) {
        st = harness_status(c);
        if (harness_int(json_object_get(st, "daemon"), "config_reloads") == 1)
            break;
        json_decref(st);
        st = NULL;
        usleep(50000);
    }
    assert_non_null(st);
    json_decref(st);
    set_input(g, 0, 1e15f);
    set_input(g, 1, 1.0f);
    int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    printf("    after the reload the stuck replay answered %s: %s\n", graphd_err_name(rc),
           graphd_last_error(c));
    assert_int_equal(rc, GRAPHD_EDEADLINE_EXCEEDED);
    assert_non_null(strstr(graphd_last_error(c), "max_replay_ms (700 ms)"));
    graphd_graph_release(g);
    graphd_close(c);
    assert_int_equal(harness_stop(&h), 0);
    unlink(conf);
}

/* The inodes of the memfds an executor has mapped (its static regions). */
static size_t memfd_inodes(int pid, unsigned long *out, size_t max)
{
    char path[64], line[512];
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *fp = fopen(path, "r");
    size_t n = 0;
    if (fp == NULL)
        return 0;
    while (fgets(line, sizeof line, fp))
        if (strstr(line, "/memfd:") != NULL) {
            unsigned long ino = 0;
            if (sscanf(line, "%*s %*s %*s %*s %lu", &ino) == 1 && n < max)
                out[n++] = ino;
        }
    fclose(fp);
    return n;
}

/* Two uids get two executors (status names both, with their sandbox), and neither maps the
 * other's regions. */
static void uids_never_share_an_executor(void **state)
{
    harness_fixture_t *f = *state;
    bystander_t b;
    bystander_start(&f->h, &f->m, 1500, &b);
    graphd_client_t *c = harness_client(&f->h, "attacker");
    assert_non_null(c);
    uint64_t mid = harness_models_register(c, &f->m, "mlp.pt");
    graphd_graph_t *g = NULL;
    assert_int_equal(capture(c, mid, 2, 16, 16, &g), GRAPHD_OK);
    json_t *js = harness_status(c); /* root: an admin sees every executor */
    json_t *ex = json_object_get(js, "executors");
    int mine = 0, theirs = 0;
    for (size_t i = 0; i < json_array_size(ex); i++) {
        json_t *e = json_array_get(ex, i);
        if (harness_int(e, "pid") == 0 ||
            strcmp(json_string_value(json_object_get(e, "device")), "cpu:0") != 0)
            continue;
        printf("    executor uid %lld pid %lld (%lld MiB resident): %s\n", harness_int(e, "uid"),
               harness_int(e, "pid"), harness_int(e, "rss_bytes") >> 20,
               json_string_value(json_object_get(e, "sandbox")));
        if (harness_int(e, "uid") == 0)
            mine = (int)harness_int(e, "pid");
        else if (harness_int(e, "uid") == BYSTANDER_UID)
            theirs = (int)harness_int(e, "pid");
    }
    json_decref(js);
    assert_true(mine > 0 && theirs > 0 && mine != theirs);
    unsigned long a[256], bb[256];
    size_t na = memfd_inodes(mine, a, 256), nb = memfd_inodes(theirs, bb, 256);
    if (na == 0 || nb == 0)
        fail_msg("executor %d maps %zu memfds, executor %d %zu: each should map its own region",
                 mine, na, theirs, nb);
    for (size_t i = 0; i < na; i++)
        for (size_t k = 0; k < nb; k++)
            if (a[i] == bb[k])
                fail_msg("executors %d and %d both map memfd inode %lu", mine, theirs, a[i]);
    graphd_graph_release(g);
    graphd_close(c);
    bystander_finish(&b, "a look at the executors", 0);
}

static int group_setup(void **state)
{
    static harness_fixture_t f;
    *state = &f; /* the teardown runs even when this fails: harness_fixture_stop copes */
    /* The other uid must reach the sockets and the models. */
    return harness_fixture_start_shared(&f, daemon_args);
}

static int group_teardown(void **state)
{
    return harness_fixture_stop(*state) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "bystander") == 0) { /* bystander_start's process */
        harness_fixture_t f;
        harness_fixture_attach(&f, argv[2], argv[3]);
        bystander_main(&f.h, &f.m, atoi(argv[4]), atoi(argv[5]));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(stuck_capture_is_killed_at_the_bound),
        cmocka_unit_test(stuck_replay_is_killed_at_the_bound),
        cmocka_unit_test(executor_over_its_memory_is_killed),
        cmocka_unit_test(replay_bound_reloads),
        cmocka_unit_test(uids_never_share_an_executor),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
