/*
 * The kill storm: STORM_CYCLES client processes, alternating two uids, each connecting,
 * registering a module, capturing it and replaying it in a loop, are SIGKILLed at a random point
 * (while connecting, with the session open, before, during or after the capture, or in the
 * middle of the replay loop), a few at a time. Meanwhile a bystander of a third uid replays the
 * whole time and must see no failure and no wrong output. At the end, within a few seconds,
 * Status (an admin's view) shows nothing of the storm left: only the watcher's and the
 * bystander's sessions, regions and graphs, no pool but default, the two uids' executors never
 * killed or crashed and mapping no region any more (they hold no graph), and the daemon alive.
 *
 * The kill points come from a PRNG whose seed is printed (GRAPHD_STORM_SEED=N repeats a run;
 * GRAPHD_STORM_CYCLES=N runs another number of cycles, for a longer soak by hand).
 * Children are this binary run again through setpriv (--child / --bystander), so each is a fresh
 * process of its uid with nothing of this one's gRPC state. They use public libgraphd calls only.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "graphd.h"
#include "../lib/harness.h"

extern char **environ;

#define STORM_CYCLES 200 /* the number; GRAPHD_STORM_CYCLES overrides it */
#define STORM_PARALLEL 3 /* children alive at once */
#define UID_A 4201       /* the storm alternates these two */
#define UID_B 4202
#define UID_BYSTANDER 4203
#define ATTACH_TIMEOUT_MS "1500" /* a child killed inside Hello leaves an unattached session */
#define SETTLE_MS 5000           /* everything gone within this after the last kill */
#define STAGE_TIMEOUT_MS 20000   /* a child that does not reach its kill point in time fails */

static const char *const daemon_args[] = {"--socket-mode", "0666", "--attach-timeout-ms",
                                          ATTACH_TIMEOUT_MS, NULL};

/* ---- the children ------------------------------------------------------------------------- */

/* The stages a child announces on stdout, one line each, in this order. */
enum stage {
    ST_NONE,       /* nothing written yet */
    ST_START,      /* "start": about to connect and say Hello */
    ST_HELLO,      /* "hello": the session is open and attached */
    ST_REGISTERED, /* "registered": its module is registered */
    ST_CAPTURING,  /* "capturing": inside graphd_capture */
    ST_CAPTURED,   /* "captured US": the graph is captured (US: how long it took) */
    ST_REPLAYING,  /* "replaying": inside the replay loop */
    ST_COUNT,
};
static const char *const stage_word[ST_COUNT] = {
    "", "start", "hello", "registered", "capturing", "captured", "replaying",
};
/* Where a child was when it died: the last stage it announced. */
static const char *const stage_where[ST_COUNT] = {
    "before main",
    "connecting (before Hello returned)",
    "session open, no module yet",
    "module registered, before capture",
    "during capture",
    "after capture, before replays",
    "in the replay loop",
};

static void say(const char *fmt, ...)
{
    char line[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0 || n >= (int)sizeof line - 1)
        n = (int)sizeof line - 2;
    line[n++] = '\n';
    if (write(1, line, (size_t)n) != n)
        _exit(4);
}

static int child_fail(graphd_client_t *c, const char *what, int rc)
{
    fprintf(stderr, "storm child (uid %d, pid %d): %s: %s: %s\n", (int)getuid(), (int)getpid(),
            what, graphd_err_name(rc), c ? graphd_last_error(c) : graphd_last_error(NULL));
    return 1;
}

/* Blocks until the parent closes our stdin (it kills us first: the EOF only comes should the
 * test itself die). */
static int pause_until_killed(void)
{
    char b;
    while (read(0, &b, 1) > 0)
        ;
    return 0;
}

/* Connects, opens a session (with a pool of its own, deleted with the session, unless pool is
 * "-") and registers mlp.pt, announcing each stage. 0, or 1 after a message. */
static int child_setup(const char *address, const char *models, const char *pool,
                       graphd_client_t **cp, uint64_t *mid)
{
    graphd_client_t *c = NULL;
    int rc = graphd_connect(address, &c);
    if (rc != GRAPHD_OK)
        return child_fail(NULL, "connect", rc);
    if ((rc = graphd_hello(c, "storm")) != GRAPHD_OK)
        return child_fail(c, "hello", rc);
    say("hello");
    if (strcmp(pool, "-") != 0 &&
        (rc = graphd_pool_create_ex(c, pool, "cpu:0", 0, GRAPHD_POOL_PRIVATE,
                                    GRAPHD_POOL_DELETE_WITH_SESSION, NULL)) != GRAPHD_OK)
        return child_fail(c, "pool create", rc);
    harness_models_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.dir, sizeof m.dir, "%s", models);
    if ((*mid = harness_models_register(c, &m, "mlp.pt")) == 0)
        return child_fail(c, "register mlp.pt", GRAPHD_EUNKNOWN);
    say("registered");
    *cp = c;
    return 0;
}

static int child_capture(graphd_client_t *c, uint64_t mid, const char *pool, graphd_graph_t **g)
{
    graphd_tensor_spec_t arg;
    memset(&arg, 0, sizeof arg);
    arg.dtype = GRAPHD_FLOAT32;
    arg.ndim = 2;
    arg.shape[0] = 16;
    arg.shape[1] = 16;
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.num_warmup_iters = 1;
    opts.pool = strcmp(pool, "-") != 0 ? pool : NULL;
    return graphd_capture(c, 1, &callable, &opts, g);
}

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000ull + (uint64_t)ts.tv_nsec / 1000;
}

/* One storm child: argv ADDRESS MODELS STOP POOL. STOP "registered" or "captured" waits there to
 * be killed; "-" replays (forward, backward) until killed. Exits 1 on any failure: nothing that
 * happens to the other clients may fail this one's calls. */
static int child_main(char **argv)
{
    const char *address = argv[0], *models = argv[1], *stop = argv[2], *pool = argv[3];
    say("start");
    graphd_client_t *c = NULL;
    graphd_graph_t *g = NULL;
    uint64_t mid = 0;
    if (child_setup(address, models, pool, &c, &mid) != 0)
        return 1;
    if (strcmp(stop, "registered") == 0)
        return pause_until_killed();
    say("capturing");
    uint64_t t0 = now_us();
    int rc = child_capture(c, mid, pool, &g);
    if (rc != GRAPHD_OK)
        return child_fail(c, "capture", rc);
    say("captured %llu", (unsigned long long)(now_us() - t0));
    if (strcmp(stop, "captured") == 0)
        return pause_until_killed();
    say("replaying");
    int backward = graphd_graph_has_backward(g);
    for (;;) {
        if ((rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL)) != GRAPHD_OK)
            return child_fail(c, "replay forward", rc);
        if (backward && (rc = graphd_replay(g, GRAPHD_PHASE_BACKWARD, NULL)) != GRAPHD_OK)
            return child_fail(c, "replay backward", rc);
    }
}

/* The bystander: argv ADDRESS MODELS. Captures mlp.pt, says "ready SESSION_ID", then replays
 * FORWARD until its stdin has a line or ends, checking each output against its first one, and
 * says "done REPLAYS FAILURES WRONG WORST_PAUSE_US". */
static int bystander_main(char **argv)
{
    const char *address = argv[0], *models = argv[1];
    graphd_client_t *c = NULL;
    graphd_graph_t *g = NULL;
    int rc = graphd_connect(address, &c);
    if (rc != GRAPHD_OK)
        return child_fail(NULL, "bystander connect", rc);
    if ((rc = graphd_hello(c, "storm-bystander")) != GRAPHD_OK)
        return child_fail(c, "bystander hello", rc);
    harness_models_t m;
    memset(&m, 0, sizeof m);
    snprintf(m.dir, sizeof m.dir, "%s", models);
    uint64_t mid = harness_models_register(c, &m, "mlp.pt");
    if (mid == 0)
        return child_fail(c, "bystander register", GRAPHD_EUNKNOWN);
    if ((rc = child_capture(c, mid, "-", &g)) != GRAPHD_OK)
        return child_fail(c, "bystander capture", rc);
    size_t n = 0;
    graphd_graph_tensors(g, &n, NULL);
    graphd_tensor_t *t = calloc(n + 1, sizeof *t);
    if (t == NULL || graphd_graph_tensors(g, &n, t) != GRAPHD_OK)
        return child_fail(c, "bystander tensors", GRAPHD_ENOMEM);
    float *in = NULL, *out = NULL;
    size_t n_in = 0, n_out = 0;
    for (size_t k = 0; k < n; k++) {
        if (t[k].role == GRAPHD_ROLE_INPUT && t[k].index == 0)
            in = t[k].data, n_in = t[k].nbytes / sizeof(float);
        if (t[k].role == GRAPHD_ROLE_OUTPUT && t[k].index == 0)
            out = t[k].data, n_out = t[k].nbytes / sizeof(float);
    }
    if (in == NULL || out == NULL)
        return child_fail(c, "bystander: no input or output tensor", GRAPHD_EUNKNOWN);
    for (size_t i = 0; i < n_in; i++)
        in[i] = (float)((int)(i % 13) - 6) / 8.0f;
    if ((rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL)) != GRAPHD_OK)
        return child_fail(c, "bystander first replay", rc);
    float *want = malloc(n_out * sizeof *want);
    if (want == NULL)
        return child_fail(c, "bystander", GRAPHD_ENOMEM);
    memcpy(want, out, n_out * sizeof *want);
    say("ready %llu", (unsigned long long)graphd_session_id(c));

    unsigned long replays = 0, failures = 0, wrong = 0;
    uint64_t worst = 0;
    for (;;) {
        struct pollfd pf = {.fd = 0, .events = POLLIN};
        if (poll(&pf, 1, 0) != 0)
            break;
        memset(out, 0, n_out * sizeof *out);
        uint64_t t0 = now_us();
        rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
        uint64_t dt = now_us() - t0;
        worst = dt > worst ? dt : worst;
        replays++;
        if (rc != GRAPHD_OK) {
            failures++;
            fprintf(stderr, "bystander: replay: %s: %s\n", graphd_err_name(rc),
                    graphd_last_error(c));
        } else {
            for (size_t i = 0; i < n_out; i++)
                if (fabsf(out[i] - want[i]) > 1e-5f * (1.0f + fabsf(want[i]))) {
                    wrong++;
                    fprintf(stderr, "bystander: output %zu is %g, was %g\n", i, out[i], want[i]);
                    break;
                }
        }
        usleep(1000);
    }
    say("done %lu %lu %lu %llu", replays, failures, wrong, (unsigned long long)worst);
    free(want);
    free(t);
    graphd_graph_release(g);
    graphd_close(c);
    return 0;
}

/* ---- the parent's side of a child --------------------------------------------------------- */

/* Where the parent means to kill a child: once it has announced trigger, after a random delay
 * up to max_delay_ms (0: at once); stop makes the child wait there. */
typedef struct plan {
    const char *name;
    enum stage trigger;
    int max_delay_ms; /* -1: the capture's running estimate */
    const char *stop;
    int weight;
} plan_t;

static const plan_t plans[] = {
    {"while connecting", ST_START, 10, "-", 1},
    {"with the session open", ST_HELLO, 30, "-", 1},
    {"before capture", ST_REGISTERED, 0, "registered", 1},
    {"during capture", ST_CAPTURING, -1, "-", 3},
    {"after capture", ST_CAPTURED, 0, "captured", 1},
    {"mid-replay loop", ST_REPLAYING, 150, "-", 3},
};
#define NPLANS (sizeof plans / sizeof plans[0])

typedef struct child {
    pid_t pid;
    int out, in; /* its stdout (non-blocking) and stdin */
    char buf[512];
    size_t used;
    enum stage stage;
    unsigned long long session;     /* the bystander's */
    uint64_t capture_us;            /* from "captured US" */
    int64_t started_ms, kill_at_ms; /* kill_at_ms 0: not yet due */
    const plan_t *plan;
    int cycle;
    uid_t uid;
    char last[128]; /* the bystander's last line */
} child_t;

static char self_exe[PATH_MAX];

static void spawn(child_t *ch, uid_t uid, char *const *args)
{
    char reuid[32], regid[32];
    snprintf(reuid, sizeof reuid, "--reuid=%u", (unsigned)uid);
    snprintf(regid, sizeof regid, "--regid=%u", (unsigned)uid);
    char *argv[16] = {"/usr/bin/setpriv", reuid, regid, "--clear-groups", self_exe};
    int k = 5;
    for (; *args != NULL && k < 15; args++)
        argv[k++] = *args;
    argv[k] = NULL;
    int p[2], q[2];
    assert_int_equal(pipe2(p, O_CLOEXEC), 0);
    assert_int_equal(pipe2(q, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, p[1], 1);
    posix_spawn_file_actions_adddup2(&fa, q[0], 0);
    int rc = posix_spawn(&ch->pid, argv[0], &fa, NULL, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    if (rc != 0)
        fail_msg("posix_spawn %s: %s", argv[0], strerror(rc));
    close(p[1]);
    close(q[0]);
    ch->out = p[0];
    ch->in = q[1];
    assert_int_equal(fcntl(ch->out, F_SETFL, O_NONBLOCK), 0);
    ch->used = 0;
    ch->stage = ST_NONE;
    ch->uid = uid;
    ch->started_ms = harness_now_ms();
    ch->kill_at_ms = 0;
}

/* Reads what the child wrote; advances its stage by each line. 0 while the pipe is open, 1 at
 * EOF. */
static int child_read(child_t *ch)
{
    for (;;) {
        ssize_t n = read(ch->out, ch->buf + ch->used, sizeof ch->buf - 1 - ch->used);
        if (n == 0)
            return 1;
        if (n < 0)
            return errno == EAGAIN || errno == EINTR ? 0 : 1;
        ch->used += (size_t)n;
        ch->buf[ch->used] = '\0';
        char *nl;
        while ((nl = strchr(ch->buf, '\n')) != NULL) {
            *nl = '\0';
            for (int s = ST_START; s < ST_COUNT; s++) {
                size_t len = strlen(stage_word[s]);
                if (strncmp(ch->buf, stage_word[s], len) == 0 &&
                    (ch->buf[len] == '\0' || ch->buf[len] == ' ')) {
                    ch->stage = (enum stage)s;
                    if (s == ST_CAPTURED)
                        ch->capture_us = strtoull(ch->buf + len, NULL, 10);
                }
            }
            snprintf(ch->last, sizeof ch->last, "%.*s", (int)sizeof ch->last - 1, ch->buf);
            size_t rest = ch->used - (size_t)(nl + 1 - ch->buf);
            memmove(ch->buf, nl + 1, rest);
            ch->used = rest;
            ch->buf[rest] = '\0';
        }
        if (ch->used >= sizeof ch->buf - 1)
            ch->used = 0; /* a runaway line: drop it */
    }
}

/* Waits for the child's next line for up to ms; 0 on a line, -1 on EOF or timeout. */
static int child_wait_line(child_t *ch, int ms)
{
    int64_t deadline = harness_now_ms() + ms;
    ch->last[0] = '\0';
    while (harness_now_ms() < deadline) {
        struct pollfd pf = {.fd = ch->out, .events = POLLIN};
        poll(&pf, 1, 100);
        int eof = child_read(ch);
        if (ch->last[0] != '\0')
            return 0;
        if (eof)
            return -1;
    }
    return -1;
}

/* ---- the PRNG ----------------------------------------------------------------------------- */

static uint64_t rng_state;

static uint64_t rng_next(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int rng_below(int n)
{
    return n <= 0 ? 0 : (int)(rng_next() % (uint64_t)n);
}

static const plan_t *rng_plan(void)
{
    int total = 0;
    for (size_t i = 0; i < NPLANS; i++)
        total += plans[i].weight;
    int r = rng_below(total);
    for (size_t i = 0; i < NPLANS; i++) {
        if (r < plans[i].weight)
            return &plans[i];
        r -= plans[i].weight;
    }
    return &plans[0];
}

/* ---- the test ----------------------------------------------------------------------------- */

typedef struct fixture {
    harness_fixture_t f;
} fixture_t;

static int planned[NPLANS], died_at[ST_COUNT];
/* The children alive: group_teardown kills what a failed test left. */
static child_t slots[STORM_PARALLEL], by;
static int storm_passed; /* else group_teardown shows the daemon's log */
static int capture_est_ms = 60;
static int with_own_pool;

static void start_cycle(const harness_fixture_t *f, child_t *ch, int cycle)
{
    ch->plan = rng_plan();
    ch->cycle = cycle;
    char pool[32] = "-";
    if (rng_below(2) == 0) {
        snprintf(pool, sizeof pool, "storm-%d", cycle);
        with_own_pool++;
    }
    char *args[] = {"--child", (char *)f->h.address, (char *)f->m.dir, (char *)ch->plan->stop, pool,
                    NULL};
    spawn(ch, cycle % 2 ? UID_B : UID_A, args);
    planned[ch->plan - plans]++;
}

/* Schedules the kill once the child reached its plan's stage; kills when due. Returns 1 when
 * the child is dead and reaped. Fails the test if it died on its own or got stuck. */
static int cycle_step(child_t *ch)
{
    int eof = child_read(ch);
    int64_t now = harness_now_ms();
    if (eof && ch->kill_at_ms == 0) {
        int st = 0;
        waitpid(ch->pid, &st, 0);
        ch->pid = 0;
        fail_msg("storm child %d (uid %u, plan '%s') ended on its own at '%s' (status 0x%x): "
                 "its calls failed (see above)",
                 ch->cycle, (unsigned)ch->uid, ch->plan->name, stage_word[ch->stage], st);
    }
    if (ch->kill_at_ms == 0) {
        if (ch->stage >= ch->plan->trigger) {
            int max = ch->plan->max_delay_ms < 0 ? capture_est_ms * 6 / 5 : ch->plan->max_delay_ms;
            ch->kill_at_ms = now + rng_below(max + 1);
        } else if (now - ch->started_ms > STAGE_TIMEOUT_MS) {
            kill(ch->pid, SIGKILL);
            waitpid(ch->pid, NULL, 0);
            ch->pid = 0;
            fail_msg("storm child %d (uid %u) stuck at '%s' for %d ms, waiting for '%s'", ch->cycle,
                     (unsigned)ch->uid, stage_word[ch->stage], STAGE_TIMEOUT_MS,
                     stage_word[ch->plan->trigger]);
        }
    }
    if (ch->kill_at_ms == 0 || now < ch->kill_at_ms)
        return 0;
    assert_int_equal(kill(ch->pid, SIGKILL), 0);
    int st = 0;
    assert_int_equal(waitpid(ch->pid, &st, 0), ch->pid);
    child_read(ch); /* what it wrote before it died says where it was */
    close(ch->out);
    close(ch->in);
    if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL)
        fail_msg("storm child %d (uid %u) exited (status 0x%x) before its SIGKILL", ch->cycle,
                 (unsigned)ch->uid, st);
    died_at[ch->stage]++;
    if (ch->capture_us > 0) /* a running estimate of how long a capture takes */
        capture_est_ms = (capture_est_ms * 3 + (int)(ch->capture_us / 1000) + 1) / 4;
    ch->pid = 0;
    return 1;
}

/* What is left of the storm, as text ("" when nothing). */
static void leftovers(json_t *st, uint64_t watch_id, uint64_t by_id, char *msg, size_t size)
{
    size_t used = 0;
    msg[0] = '\0';
#define LEFT(...)                                                                                  \
    do {                                                                                           \
        if (used < size)                                                                           \
            used += (size_t)snprintf(msg + used, size - used, __VA_ARGS__);                        \
    } while (0)
    json_t *sessions = json_object_get(st, "sessions"), *v;
    size_t i;
    long long by_regions = -1, by_bytes = -1, by_graphs = -1;
    json_array_foreach(sessions, i, v)
    {
        uint64_t id = (uint64_t)harness_int(v, "id");
        if (id == by_id) {
            by_regions = harness_int(v, "regions");
            by_bytes = harness_int(v, "bytes");
            by_graphs = harness_int(v, "graphs");
        } else if (id != watch_id) {
            LEFT("session %llu (uid %lld, %s, %lld regions, %lld graphs); ", (unsigned long long)id,
                 harness_int(v, "uid"),
                 json_is_true(json_object_get(v, "attached")) ? "attached" : "unattached",
                 harness_int(v, "regions"), harness_int(v, "graphs"));
        } else if (harness_int(v, "regions") != 0 || harness_int(v, "graphs") != 0) {
            LEFT("the watcher holds regions or graphs; ");
        }
    }
    if (by_regions < 0)
        LEFT("the bystander's session is gone; ");
    long long nsessions = harness_int(json_object_get(st, "daemon"), "sessions");
    if (nsessions != 2)
        LEFT("daemon.sessions %lld (want 2); ", nsessions);
    json_array_foreach(json_object_get(st, "pools"), i, v)
    {
        const char *name = json_string_value(json_object_get(v, "name"));
        if (name == NULL || strcmp(name, "default") != 0) {
            LEFT("pool %s (owner uid %lld, %lld regions); ", name ? name : "?",
                 harness_int(v, "owner_uid"), harness_int(v, "regions"));
            continue;
        }
        if (harness_int(v, "regions") != by_regions || harness_int(v, "reserved_bytes") != by_bytes)
            LEFT("default pool: %lld regions, %lld bytes (the bystander holds %lld, %lld); ",
                 harness_int(v, "regions"), harness_int(v, "reserved_bytes"), by_regions, by_bytes);
        if (harness_int(v, "graphs") != by_graphs)
            LEFT("default pool: %lld graphs not yet destroyed (the bystander holds %lld); ",
                 harness_int(v, "graphs"), by_graphs);
    }
    json_array_foreach(json_object_get(st, "graphs"), i, v)
    {
        if ((uint64_t)harness_int(v, "session") != by_id)
            LEFT("graph %lld of session %lld; ", harness_int(v, "id"), harness_int(v, "session"));
    }
    long long modules = harness_int(json_object_get(st, "daemon"), "modules_loaded");
    if (modules != 1)
        LEFT("modules_loaded %lld (the bystander's 1); ", modules);
    json_t *others = json_object_get(st, "others");
    const char *hidden[] = {"sessions", "graphs", "modules", "regions", "pools"};
    for (size_t k = 0; k < sizeof hidden / sizeof hidden[0]; k++)
        if (json_integer_value(json_object_get(others, hidden[k])) != 0)
            LEFT("others.%s %lld (an admin sees all); ", hidden[k],
                 (long long)json_integer_value(json_object_get(others, hidden[k])));
#undef LEFT
}

/* The region memfds an executor maps and holds open: its graphs' static regions. */
static int executor_regions(int pid)
{
    char path[64], line[512];
    int n = 0;
    snprintf(path, sizeof path, "/proc/%d/maps", pid);
    FILE *fp = fopen(path, "r");
    if (fp == NULL)
        return 0;
    while (fgets(line, sizeof line, fp))
        n += strstr(line, "/memfd:graphd-region-") != NULL;
    fclose(fp);
    snprintf(path, sizeof path, "/proc/%d/fd", pid);
    DIR *d = opendir(path);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        char link[PATH_MAX], target[PATH_MAX];
        snprintf(link, sizeof link, "%s/%s", path, e->d_name);
        ssize_t len = readlink(link, target, sizeof target - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strstr(target, "/memfd:graphd-region-") != NULL;
        }
    }
    if (d)
        closedir(d);
    return n;
}

/* The executors of the storm's uids: never killed nor crashed, holding no region. */
static void executor_leftovers(json_t *st, char *msg, size_t size, int print)
{
    size_t used = strlen(msg), i;
    json_t *v;
    int seen[2] = {0, 0};
    json_array_foreach(json_object_get(st, "executors"), i, v)
    {
        long long uid = harness_int(v, "uid");
        if (uid != UID_A && uid != UID_B)
            continue;
        seen[uid == UID_B]++;
        long long pid = harness_int(v, "pid");
        int held = pid > 0 ? executor_regions((int)pid) : 0;
        if (print)
            printf("    executor uid %lld pid %lld: %lld MiB resident, %lld starts, killed "
                   "%lld/%lld, died %lld, %d regions mapped\n",
                   uid, pid, harness_int(v, "rss_bytes") >> 20, harness_int(v, "starts"),
                   harness_int(v, "killed_time"), harness_int(v, "killed_memory"),
                   harness_int(v, "died"), held);
        if (harness_int(v, "killed_time") != 0 || harness_int(v, "killed_memory") != 0 ||
            harness_int(v, "died") != 0)
            used += (size_t)snprintf(msg + used, used < size ? size - used : 0,
                                     "executor of uid %lld was killed or died; ", uid);
        if (held != 0 && used < size)
            used += (size_t)snprintf(msg + used, size - used,
                                     "executor of uid %lld (pid %lld) maps %d regions; ", uid, pid,
                                     held);
    }
    if ((!seen[0] || !seen[1]) && used < size)
        snprintf(msg + used, size - used, "status lists no executor for uid %d or %d; ", UID_A,
                 UID_B);
}

static void kill_storm_leaves_nothing_behind(void **state)
{
    fixture_t *fx = *state;
    harness_fixture_t *f = &fx->f;
    const char *seed_env = getenv("GRAPHD_STORM_SEED");
    uint64_t seed = seed_env && seed_env[0] ? strtoull(seed_env, NULL, 0)
                                            : (uint64_t)time(NULL) ^ ((uint64_t)getpid() << 16);
    rng_state = seed;
    const char *cycles_env = getenv("GRAPHD_STORM_CYCLES");
    int cycles = cycles_env && atoi(cycles_env) > 0 ? atoi(cycles_env) : STORM_CYCLES;
    printf("    seed %llu (GRAPHD_STORM_SEED=%llu repeats this run)\n", (unsigned long long)seed,
           (unsigned long long)seed);
    fflush(stdout);

    graphd_client_t *watch = harness_client(&f->h, "storm-watch"); /* root: an admin's view */
    assert_non_null(watch);

    char *by_args[] = {"--bystander", (char *)f->h.address, (char *)f->m.dir, NULL};
    spawn(&by, UID_BYSTANDER, by_args);
    if (child_wait_line(&by, 30000) != 0 || sscanf(by.last, "ready %llu", &by.session) != 1)
        fail_msg("the bystander did not start: '%s'", by.last);

    int64_t t0 = harness_now_ms();
    int started = 0, done = 0;
    while (done < cycles) {
        struct pollfd pf[STORM_PARALLEL];
        int np = 0;
        for (int s = 0; s < STORM_PARALLEL; s++) {
            if (slots[s].pid == 0 && started < cycles)
                start_cycle(f, &slots[s], started++);
            if (slots[s].pid != 0)
                pf[np++] = (struct pollfd){.fd = slots[s].out, .events = POLLIN};
        }
        poll(pf, (nfds_t)np, 2);
        for (int s = 0; s < STORM_PARALLEL; s++)
            if (slots[s].pid != 0 && cycle_step(&slots[s])) {
                done++;
                if (done % 50 == 0) { /* Status answers during the storm too */
                    json_t *st = harness_status(watch);
                    assert_non_null(st);
                    json_decref(st);
                }
            }
    }
    int64_t storm_ms = harness_now_ms() - t0;

    /* Everything of the storm goes within SETTLE_MS of the last kill. */
    int64_t last_kill = harness_now_ms();
    char msg[4096] = "";
    json_t *st = NULL;
    for (;;) {
        st = harness_status(watch);
        assert_non_null(st);
        leftovers(st, graphd_session_id(watch), by.session, msg, sizeof msg);
        executor_leftovers(st, msg, sizeof msg, 0);
        if (msg[0] == '\0' || harness_now_ms() - last_kill > SETTLE_MS)
            break;
        json_decref(st);
        usleep(50000);
    }
    int64_t settled = harness_now_ms() - last_kill;

    /* The bystander's report: no failure, no wrong output. */
    assert_int_equal(write(by.in, "stop\n", 5), 5);
    int by_ok = child_wait_line(&by, 10000);
    int by_status = 0;
    waitpid(by.pid, &by_status, 0);
    by.pid = 0;
    close(by.in);
    close(by.out);
    unsigned long replays = 0, failures = 0, wrong = 0;
    unsigned long long worst_us = 0;
    if (by_ok != 0 ||
        sscanf(by.last, "done %lu %lu %lu %llu", &replays, &failures, &wrong, &worst_us) != 4 ||
        !WIFEXITED(by_status) || WEXITSTATUS(by_status) != 0)
        fail_msg("the bystander failed (status 0x%x, last line '%s')", by_status, by.last);

    printf("    %d cycles (uids %d and %d, %d at a time, %d with a pool of their own) in %.1f s\n",
           cycles, UID_A, UID_B, STORM_PARALLEL, with_own_pool, (double)storm_ms / 1000);
    printf("    planned kill points:");
    for (size_t i = 0; i < NPLANS; i++)
        printf("%s %s %d", i ? "," : "", plans[i].name, planned[i]);
    printf("\n    where the children died (their last stage):\n");
    for (int s = 0; s < ST_COUNT; s++)
        if (died_at[s] > 0)
            printf("      %-36s %3d\n", stage_where[s], died_at[s]);
    printf("    capture took about %d ms\n", capture_est_ms);
    printf("    bystander (uid %d): %lu replays, %lu failed, %lu wrong, worst pause %.1f ms\n",
           UID_BYSTANDER, replays, failures, wrong, (double)worst_us / 1000);
    char scratch[512] = "";
    executor_leftovers(st, scratch, sizeof scratch, 1);
    json_decref(st);
    if (msg[0] != '\0') {
        fail_msg("%lld ms after the last kill, left behind: %s", (long long)settled, msg);
    }
    printf("    nothing left %lld ms after the last kill\n", (long long)settled);
    assert_int_equal(failures, 0);
    assert_int_equal(wrong, 0);
    assert_true(replays > 0);
    /* Each stage was hit at least once (the planned ones all are, by construction). */
    assert_true(died_at[ST_CAPTURING] > 0);
    assert_true(died_at[ST_REPLAYING] > 0);

    /* The daemon is alive and still serves: its child process has not exited. */
    assert_int_equal(waitpid(f->h.pid, NULL, WNOHANG), 0);
    graphd_close(watch);
    storm_passed = 1;
}

/* ---- fixture ------------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    static fixture_t fx;
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n <= 0)
        return -1;
    self_exe[n] = '\0';
    if (harness_fixture_start(&fx.f, daemon_args) != 0)
        return -1;
    /* The children's uids must reach the sockets and the models. */
    if (chmod(fx.f.h.dir, 0755) != 0 || chmod(fx.f.m.dir, 0755) != 0) {
        harness_fixture_stop(&fx.f);
        return -1;
    }
    DIR *d = opendir(fx.f.m.dir);
    struct dirent *e;
    while (d && (e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.')
            continue;
        char p[512];
        snprintf(p, sizeof p, "%s/%s", fx.f.m.dir, e->d_name);
        chmod(p, 0644);
    }
    if (d)
        closedir(d);
    *state = &fx;
    return 0;
}

static int group_teardown(void **state)
{
    fixture_t *fx = *state;
    for (int s = 0; s <= STORM_PARALLEL; s++) {
        child_t *ch = s < STORM_PARALLEL ? &slots[s] : &by;
        if (ch->pid > 0) {
            kill(ch->pid, SIGKILL);
            waitpid(ch->pid, NULL, 0);
            ch->pid = 0;
        }
    }
    if (!storm_passed)
        harness_dump_log(&fx->f.h);
    return harness_fixture_stop(&fx->f) == 0 ? 0 : -1;
}

int main(int argc, char **argv)
{
    if (argc == 6 && strcmp(argv[1], "--child") == 0)
        return child_main(argv + 2);
    if (argc == 4 && strcmp(argv[1], "--bystander") == 0)
        return bystander_main(argv + 2);
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kill_storm_leaves_nothing_behind),
    };
    return cmocka_run_group_tests_name("storm", tests, group_setup, group_teardown);
}
