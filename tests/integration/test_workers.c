/*
 * One worker per executor (issue 14, "never block the daemon on one client"): every job the
 * daemon makes on an executor's behalf - capture steps, runtime pools, graph destroys, replays
 * sent on the session socket - runs on the worker thread of that executor (uid, device). While
 * uid A's capture or session-socket replay loops for ever, uid B on the same device registers,
 * captures and replays on the session socket (GRAPHD_DIRECT=0: through its worker, not straight
 * to its executor) well inside A's bound; on one worker per device B's capture and replays
 * waited for the whole bound, and B's module load waited too while A's loads, blocked on A's
 * executor, filled the loop's thread pool. A then gets DEADLINE_EXCEEDED naming the bound, and B's
 * session goes on. A worker's thread exits once idle for worker_idle_ms and comes back with the
 * next job: a daemon that served many uids keeps threads only for the busy ones.
 *
 * A is this process (root); B is a child that switched to another uid. tests/models: forever.pt
 * (a forward that never returns), stall.pt (loops x[0] times), mlp.pt (fast).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <grp.h>
#include <pthread.h>
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

#define BOUND_MS 4500
#define IDLE_MS 400

/* A's bound, and worker_idle_ms. */
static const char *const daemon_args[] = {"--socket-mode",
                                          "0666",
                                          "--max-capture-ms",
                                          "4500",
                                          "--max-replay-ms",
                                          "4500",
                                          "--worker-idle-ms",
                                          "400",
                                          NULL};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static double ms_since(uint64_t t0)
{
    return (double)(now_ns() - t0) / 1e6;
}

/* One callable over one float32 tensor of shape [d0] (ndim 1) or [d0, d1]; no warm-up. */
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

/* A client of this process whose replays go on the session socket, through its worker. */
static graphd_client_t *socket_client(const harness_t *h, const char *name)
{
    setenv("GRAPHD_DIRECT", "0", 1);
    graphd_client_t *c = harness_client(h, name);
    unsetenv("GRAPHD_DIRECT");
    return c;
}

/* ---- tenant B --------------------------------------------------------------------------- */

typedef struct tenant_b {
    pid_t pid;
    int to;   /* "go", then "again" */
    int from; /* "ready", the timings, then "ok" */
} tenant_b_t;

static void line_out(int fd, const char *fmt, ...)
{
    char buf[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (write(fd, buf, (size_t)n) != n)
        _exit(4);
}

/* Reads one line (up to '\n') from fd into buf. */
static void line_in(int fd, char *buf, size_t size)
{
    size_t got = 0;
    while (got < size - 1 && read(fd, buf + got, 1) == 1 && buf[got] != '\n')
        got++;
    buf[got] = 0;
}

/* B's part, in the child: warm up (its executor starts with its first module), then at "go"
 * register, capture and replay 20 times on the session socket and report the times; at "again"
 * replay 5 more times. */
static void tenant_b_main(const harness_t *h, const harness_models_t *m, uid_t uid, int in, int out)
{
    if (setgroups(0, NULL) != 0 || setresgid(uid, uid, uid) != 0 || setresuid(uid, uid, uid) != 0)
        _exit(2);
    graphd_client_t *c = socket_client(h, "tenant-b");
    if (c == NULL || harness_models_register(c, m, "mlp.pt") == 0)
        _exit(3);
    line_out(out, "ready\n");
    char cmd[32];
    line_in(in, cmd, sizeof cmd);
    uint64_t t0 = now_ns();
    uint64_t mid = harness_models_register(c, m, "mlp.pt");
    double reg_ms = ms_since(t0);
    uint64_t t1 = now_ns();
    graphd_graph_t *g = NULL;
    int rc = mid ? capture(c, mid, 2, 16, 16, &g) : GRAPHD_EINTERNAL;
    double cap_ms = ms_since(t1);
    if (rc != GRAPHD_OK) {
        line_out(out, "capture failed: %s: %s\n", graphd_err_name(rc), graphd_last_error(c));
        _exit(5);
    }
    double worst = 0;
    unsigned failed = 0;
    for (int i = 0; i < 20; i++) {
        uint64_t t = now_ns();
        failed += graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL) != GRAPHD_OK;
        double dt = ms_since(t);
        worst = dt > worst ? dt : worst;
    }
    line_out(out, "%.1f %.1f %.1f %.1f %u\n", reg_ms, cap_ms, worst, ms_since(t0), failed);
    line_in(in, cmd, sizeof cmd);
    failed = 0;
    for (int i = 0; i < 5; i++)
        failed += graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL) != GRAPHD_OK;
    line_out(out, "ok %u\n", failed);
    graphd_graph_release(g);
    graphd_close(c);
    _exit(0);
}

/* B runs in a fresh process (this binary again, "tenant-b"): a child that only forked would
 * share this process's gRPC state, epoll sets included, and each would take the other's
 * events (a reply lost until the call's deadline). */
static void tenant_b_start(const harness_t *h, const harness_models_t *m, uid_t uid, tenant_b_t *b)
{
    int to[2], from[2];
    assert_int_equal(pipe(to), 0);
    assert_int_equal(pipe(from), 0);
    char uids[16], ins[16], outs[16];
    snprintf(uids, sizeof uids, "%u", (unsigned)uid);
    snprintf(ins, sizeof ins, "%d", to[0]);
    snprintf(outs, sizeof outs, "%d", from[1]);
    b->pid = fork();
    assert_true(b->pid >= 0);
    if (b->pid == 0) {
        close(to[1]);
        close(from[0]);
        execl("/proc/self/exe", "test_workers", "tenant-b", h->address, m->dir, uids, ins, outs,
              (char *)NULL);
        _exit(127);
    }
    close(to[0]);
    close(from[1]);
    b->to = to[1];
    b->from = from[0];
    char line[64];
    line_in(b->from, line, sizeof line);
    if (strcmp(line, "ready") != 0)
        fail_msg("tenant B did not start ('%s')", line);
}

/* Tells B to go and returns its time for register + capture + 20 replays (ms). */
static double tenant_b_run(tenant_b_t *b, const char *during)
{
    line_out(b->to, "go\n");
    char line[256];
    line_in(b->from, line, sizeof line);
    double reg = 0, cap = 0, worst = 0, total = 0;
    unsigned failed = 0;
    if (sscanf(line, "%lf %lf %lf %lf %u", &reg, &cap, &worst, &total, &failed) != 5)
        fail_msg("tenant B: %s", line);
    printf("    tenant B during %s: register %.1f ms, capture %.1f ms, worst of 20 session-socket "
           "replays %.1f ms; %.1f ms in all (bound %d ms)\n",
           during, reg, cap, worst, total, BOUND_MS);
    assert_int_equal(failed, 0);
    return total;
}

/* After A's call was killed: B's session goes on. */
static void tenant_b_finish(tenant_b_t *b)
{
    line_out(b->to, "again\n");
    char line[64];
    line_in(b->from, line, sizeof line);
    assert_string_equal(line, "ok 0");
    close(b->to);
    close(b->from);
    int st = 0;
    assert_int_equal(waitpid(b->pid, &st, 0), b->pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

/* ---- A's stuck call, on a thread of this process ------------------------------------------ */

typedef struct stuck_call {
    graphd_client_t *c;
    graphd_graph_t *g; /* a replay of g; NULL: a capture of module mid */
    uint64_t mid;
    int rc;
    char err[512];
    double ms;
    pthread_t thread;
} stuck_call_t;

static void *stuck_main(void *arg)
{
    stuck_call_t *s = arg;
    uint64_t t0 = now_ns();
    graphd_graph_t *g = NULL;
    s->rc =
        s->g ? graphd_replay(s->g, GRAPHD_PHASE_FORWARD, NULL) : capture(s->c, s->mid, 1, 4, 0, &g);
    s->ms = ms_since(t0);
    snprintf(s->err, sizeof s->err, "%s", graphd_last_error(s->c));
    return NULL;
}

/* Starts the call and gives it time to be in the executor's module code. */
static void stuck_start(stuck_call_t *s)
{
    assert_int_equal(pthread_create(&s->thread, NULL, stuck_main, s), 0);
    usleep(500000);
}

static void stuck_finish(stuck_call_t *s, const char *bound)
{
    pthread_join(s->thread, NULL);
    printf("    A's stuck call answered %s after %.0f ms: %s\n", graphd_err_name(s->rc), s->ms,
           s->err);
    assert_int_equal(s->rc, GRAPHD_EDEADLINE_EXCEEDED);
    assert_non_null(strstr(s->err, bound));
    assert_true(s->ms >= BOUND_MS - 100);
}

/* ---- tests -------------------------------------------------------------------------------- */

/* A module load of uid A's, which waits for A's stuck executor. */
typedef struct load_call {
    graphd_client_t *c;
    const harness_models_t *m;
    uint64_t mid;
    pthread_t thread;
} load_call_t;

static void *load_main(void *arg)
{
    load_call_t *l = arg;
    l->mid = harness_models_register(l->c, l->m, "mlp.pt");
    return NULL;
}

#define A_LOADS 4 /* libuv's default thread pool, where loads used to wait */

/* A's capture loops for ever, and four more sessions of A's register modules, which wait for
 * A's executor; B registers, captures and replays on the session socket meanwhile. */
static void another_uids_capture_and_replays_do_not_wait_for_a_stuck_capture(void **state)
{
    harness_fixture_t *f = *state;
    graphd_client_t *a = socket_client(&f->h, "tenant-a");
    assert_non_null(a);
    uint64_t mid = harness_models_register(a, &f->m, "forever.pt");
    assert_true(mid != 0);
    load_call_t loads[A_LOADS];
    for (int i = 0; i < A_LOADS; i++) {
        loads[i] = (load_call_t){.c = harness_client(&f->h, "tenant-a-load"), .m = &f->m};
        assert_non_null(loads[i].c);
    }
    tenant_b_t b;
    tenant_b_start(&f->h, &f->m, 4301, &b);
    stuck_call_t s = {.c = a, .mid = mid};
    stuck_start(&s);
    for (int i = 0; i < A_LOADS; i++)
        assert_int_equal(pthread_create(&loads[i].thread, NULL, load_main, &loads[i]), 0);
    usleep(200000);
    double took = tenant_b_run(&b, "a stuck capture");
    stuck_finish(&s, "max_capture_ms");
    if (took >= BOUND_MS / 3.0)
        fail_msg("tenant B took %.0f ms while another uid's capture was stuck (bound %d ms): it "
                 "waited for that uid's executor",
                 took, BOUND_MS);
    for (int i = 0; i < A_LOADS; i++) { /* they load in A's next executor */
        pthread_join(loads[i].thread, NULL);
        assert_true(loads[i].mid != 0);
        graphd_close(loads[i].c);
    }
    tenant_b_finish(&b);
    graphd_close(a);
}

/* A's replay, sent on the session socket, loops for ever; B captures and replays meanwhile. */
static void another_uids_capture_and_replays_do_not_wait_for_a_stuck_socket_replay(void **state)
{
    harness_fixture_t *f = *state;
    graphd_client_t *a = socket_client(&f->h, "tenant-a");
    assert_non_null(a);
    uint64_t mid = harness_models_register(a, &f->m, "stall.pt");
    assert_true(mid != 0);
    graphd_graph_t *g = NULL;
    assert_int_equal(capture(a, mid, 1, 4, 0, &g), GRAPHD_OK);
    set_input(g, 0, 1e15f); /* loops "for ever" */
    set_input(g, 1, 1.0f);
    tenant_b_t b;
    tenant_b_start(&f->h, &f->m, 4302, &b);
    stuck_call_t s = {.c = a, .g = g};
    stuck_start(&s);
    double took = tenant_b_run(&b, "a stuck session-socket replay");
    stuck_finish(&s, "max_replay_ms");
    if (took >= BOUND_MS / 3.0)
        fail_msg("tenant B took %.0f ms while another uid's replay was stuck (bound %d ms): it "
                 "waited for that uid's executor",
                 took, BOUND_MS);
    tenant_b_finish(&b);
    graphd_graph_release(g);
    graphd_close(a);
}

/* The daemon's worker threads ("gd<uid>/<device>"; the daemon's other threads are named
 * otherwise). */
static int worker_threads(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/task", (int)pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[400], comm[32] = {0};
        snprintf(p, sizeof p, "%s/%s/comm", path, e->d_name);
        FILE *fp = fopen(p, "r");
        if (fp == NULL)
            continue;
        if (fgets(comm, sizeof comm, fp) && strncmp(comm, "gd", 2) == 0)
            n++;
        fclose(fp);
    }
    closedir(d);
    return n;
}

/* Waits up to ms for the daemon to have n worker threads; returns how many it has. */
static int await_threads(pid_t pid, int n, int ms)
{
    int have = worker_threads(pid);
    for (int i = 0; i < ms / 20 && have != n; i++) {
        usleep(20000);
        have = worker_threads(pid);
    }
    return have;
}

/* A worker's thread exits after worker_idle_ms without a job, and the next job brings it back:
 * idle uids hold no thread. */
/* The pid status shows for the executor of uid on cpu:0 (0: not running). */
static long long executor_pid(graphd_client_t *c, uid_t uid)
{
    json_t *js = harness_status(c);
    assert_non_null(js);
    json_t *ex = json_object_get(js, "executors");
    long long pid = 0;
    for (size_t i = 0; i < json_array_size(ex); i++) {
        json_t *e = json_array_get(ex, i);
        if (harness_int(e, "uid") == (long long)uid &&
            strcmp(json_string_value(json_object_get(e, "device")), "cpu:0") == 0)
            pid = harness_int(e, "pid");
    }
    json_decref(js);
    return pid;
}

static void an_idle_workers_thread_exits_and_the_next_job_brings_it_back(void **state)
{
    harness_fixture_t *f = *state;
    int idle = await_threads(f->h.pid, 0, 5 * IDLE_MS);
    printf("    worker threads after %d ms idle: %d\n", 5 * IDLE_MS, idle);
    assert_int_equal(idle, 0);
    graphd_client_t *c = socket_client(&f->h, "tenant-a");
    assert_non_null(c);
    harness_graph_t g;
    assert_int_equal(harness_capture_matrix(c, &f->m, "mlp.pt", 16, 16, &g), 0);
    assert_int_equal(graphd_replay(g.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    int busy = worker_threads(f->h.pid);
    printf("    right after a capture and a replay: %d\n", busy);
    assert_int_equal(busy, 1);
    long long pid = executor_pid(c, 0);
    assert_true(pid > 0);
    idle = await_threads(f->h.pid, 0, 5 * IDLE_MS);
    assert_int_equal(idle, 0);
    /* The executor outlives the thread that had it started (its PR_SET_PDEATHSIG is the
     * spawner thread's, not the worker's), the thread comes back for the next job, and the
     * graph is as it was. */
    assert_int_equal(executor_pid(c, 0), pid);
    assert_int_equal(graphd_replay(g.g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK);
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

/* ---- the harness itself ---------------------------------------------------------------- */

#define READERS 8
#define READS 2000

typedef struct {
    const harness_models_t *m;
    int failed;
} reader_t;

static void *reader_main(void *arg)
{
    reader_t *r = arg;
    for (int i = 0; i < READS; i++) {
        size_t len = 0;
        void *bytes = harness_models_read(r->m, "mlp.pt", &len);
        r->failed += bytes == NULL || len == 0;
        free(bytes);
    }
    return NULL;
}

/* The tests above read models from several threads at once (the loads of A's sessions): a
 * model's path must not be shared between them. It was a static buffer, which snprintf empties
 * before it writes: another thread's fopen then saw "" (ENOENT), and a load failed at random. */
static void models_can_be_read_from_many_threads_at_once(void **state)
{
    harness_fixture_t *f = *state;
    reader_t r[READERS];
    pthread_t t[READERS];
    for (int i = 0; i < READERS; i++) {
        r[i] = (reader_t){.m = &f->m};
        assert_int_equal(pthread_create(&t[i], NULL, reader_main, &r[i]), 0);
    }
    int failed = 0;
    for (int i = 0; i < READERS; i++) {
        pthread_join(t[i], NULL);
        failed += r[i].failed;
    }
    assert_int_equal(failed, 0);
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
    if (argc == 7 && strcmp(argv[1], "tenant-b") == 0) { /* tenant_b_start's process */
        harness_fixture_t f;
        harness_fixture_attach(&f, argv[2], argv[3]);
        tenant_b_main(&f.h, &f.m, (uid_t)atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(another_uids_capture_and_replays_do_not_wait_for_a_stuck_capture),
        cmocka_unit_test(another_uids_capture_and_replays_do_not_wait_for_a_stuck_socket_replay),
        cmocka_unit_test(an_idle_workers_thread_exits_and_the_next_job_brings_it_back),
        cmocka_unit_test(models_can_be_read_from_many_threads_at_once),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
