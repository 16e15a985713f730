/*
 * Several devices served at once, on a daemon whose CPU is split into two
 * logical devices (--cpu-devices 2): ListDevices and graphctl show cpu:0 and
 * cpu:1, pools are made per device, graphs in a cpu:1 pool and in a cpu:0
 * pool train like PyTorch side by side and show under their pool and device
 * in status, a pool on a device the daemon does not have is refused, and a
 * slow replay on cpu:1 does not hold up a fast one on cpu:0 (each device has
 * its own worker).
 *
 * The models and references come from tests/models/make_models.py (mlp.pt,
 * slow.pt).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "graphd_frame.h"

#define STEPS 50
#define LR 0.05f
#define REL_TOL 1e-5

typedef harness_fixture_t fixture_t;

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static graphd_tensor_spec_t f32_spec(int64_t rows, int64_t cols, int requires_grad)
{
    graphd_tensor_spec_t s;
    memset(&s, 0, sizeof(s));
    s.dtype = GRAPHD_FLOAT32;
    s.ndim = 2;
    s.shape[0] = rows;
    s.shape[1] = cols;
    s.requires_grad = requires_grad;
    return s;
}

/* Captures model (one [rows, cols] input) in pool with warmup iterations; fails the test on
 * error. */
static void capture_in(graphd_client_t *c, const fixture_t *f, const char *model, int64_t rows,
                       int64_t cols, const char *pool, int warmup, harness_graph_t *out)
{
    uint64_t mid = harness_models_register(c, &f->m, model);
    if (mid == 0)
        fail_msg("cannot register %s", model);
    graphd_tensor_spec_t arg = f32_spec(rows, cols, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.pool = pool;
    opts.num_warmup_iters = warmup;
    graphd_graph_t *g = NULL;
    int rc = graphd_capture(c, 1, &callable, &opts, &g);
    if (rc != GRAPHD_OK)
        fail_msg("capture %s in pool %s: %s: %s", model, pool ? pool : "(default)",
                 graphd_err_name(rc), graphd_last_error(c));
    assert_int_equal(harness_graph_load(out, c, g), 0);
}

static float *f32(const harness_graph_t *g, int role, uint32_t index)
{
    const graphd_tensor_t *t = harness_tensor(g, role, index);
    if (t == NULL)
        fail_msg("graph %llu has no tensor of role %d index %u",
                 (unsigned long long)graphd_graph_id(g->g), role, index);
    assert_int_equal(t->dtype, GRAPHD_FLOAT32);
    return t->data;
}

static void replay_ok(const harness_graph_t *g, int phase)
{
    int rc = graphd_replay(g->g, phase, NULL);
    if (rc != GRAPHD_OK)
        fail_msg("replay phase %d of graph %llu: %s: %s", phase,
                 (unsigned long long)graphd_graph_id(g->g), graphd_err_name(rc),
                 graphd_last_error(g->c));
}

/* One SGD step of mlp.pt on (x, y) (MSE loss, LR) with every tensor in g's region; the loss. */
static double train_step(const harness_graph_t *g, const double *x, const double *y)
{
    float *in = f32(g, GRAPHD_ROLE_INPUT, 0);
    for (size_t i = 0; i < harness_numel(harness_tensor(g, GRAPHD_ROLE_INPUT, 0)); i++)
        in[i] = (float)x[i];
    replay_ok(g, GRAPHD_PHASE_FORWARD);
    const float *out = f32(g, GRAPHD_ROLE_OUTPUT, 0);
    float *gout = f32(g, GRAPHD_ROLE_GRAD_OUTPUT, 0);
    size_t n = harness_numel(harness_tensor(g, GRAPHD_ROLE_OUTPUT, 0));
    double loss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - y[i];
        loss += d * d;
        gout[i] = (float)(2.0 / (double)n * d);
    }
    replay_ok(g, GRAPHD_PHASE_BACKWARD);
    for (size_t k = 0; k < g->n; k++) {
        const graphd_tensor_t *gt = &g->t[k];
        if (gt->role != GRAPHD_ROLE_PARAM_GRAD)
            continue;
        float *p = f32(g, GRAPHD_ROLE_PARAM, gt->index);
        const float *gp = gt->data;
        for (size_t i = 0; i < harness_numel(gt); i++)
            p[i] -= LR * gp[i];
    }
    return loss / (double)n;
}

static const char *str_of(json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    if (s == NULL)
        fail_msg("status member '%s' missing", key);
    return s;
}

/* ---- devices and pools ------------------------------------------------------------------ */

static void both_cpu_devices_are_listed(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "devices");
    assert_non_null(c);
    graphd_device_t devs[16];
    size_t n = 16;
    assert_int_equal(graphd_list_devices(c, &n, devs), GRAPHD_OK);
    const graphd_device_t *cpu[3] = {NULL, NULL, NULL};
    for (size_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++) {
            char id[16];
            snprintf(id, sizeof(id), "cpu:%d", k);
            if (strcmp(devs[i].id, id) == 0)
                cpu[k] = &devs[i];
        }
    assert_non_null(cpu[0]);
    assert_non_null(cpu[1]);
    assert_null(cpu[2]);
    for (int k = 0; k < 2; k++) {
        assert_string_equal(cpu[k]->kind, "cpu");
        assert_int_equal(cpu[k]->ordinal, k);
        assert_true(cpu[k]->memory_total > 0);
        assert_int_equal(cpu[k]->mps, 0); /* MPS is a CUDA matter */
    }
    /* Two queues on one host: the same processor and memory. */
    assert_string_equal(cpu[0]->name, cpu[1]->name);
    assert_int_equal(cpu[0]->memory_total, cpu[1]->memory_total);

    /* graphctl lists both, as a table and as JSON. */
    char path[HARNESS_PATH_MAX + 16], out[8192], err[1024];
    snprintf(path, sizeof(path), "%s/graphctl", harness_build_dir());
    const char *table[] = {path, "--address", f->h.address, "devices", NULL};
    assert_int_equal(harness_run(table, out, sizeof(out), err, sizeof(err), 10000), 0);
    assert_non_null(strstr(out, "cpu:0"));
    assert_non_null(strstr(out, "cpu:1"));
    /* The MPS column (CUDA's) and the xpu ones mean nothing on CPU devices: not shown at all,
     * neither as 0 nor as "-" (issue 16). */
    static const char *const none[] = {"MPS",    "CUS",    "CLOCK_MHZ", "T_FREE", "UTIL",
                                       "HEALTH", "WEDGED", "UUID",      "DRIVER"};
    for (size_t k = 0; k < sizeof(none) / sizeof(none[0]); k++)
        if (strstr(out, none[k]) != NULL)
            fail_msg("graphctl devices shows %s for CPU devices only:\n%s", none[k], out);
    assert_non_null(strstr(out, "  FREE\n")); /* the last column: memory free */
    const char *as_json[] = {path, "--address", f->h.address, "--json", "devices", NULL};
    assert_int_equal(harness_run(as_json, out, sizeof(out), err, sizeof(err), 10000), 0);
    json_error_t jerr;
    json_t *doc = json_loads(out, 0, &jerr);
    if (doc == NULL)
        fail_msg("graphctl --json devices is not JSON: %s\n%s", jerr.text, out);
    json_t *list = json_is_array(doc) ? doc : json_object_get(doc, "devices");
    assert_non_null(harness_find(list, "id", "cpu:0"));
    assert_non_null(harness_find(list, "id", "cpu:1"));
    for (int k = 0; k < 2; k++) {
        char id[16];
        snprintf(id, sizeof(id), "cpu:%d", k);
        assert_true(json_is_false(json_object_get(harness_find(list, "id", id), "mps")));
    }
    json_decref(doc);
    graphd_close(c);
}

static void pools_are_per_device(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "pools");
    assert_non_null(c);
    graphd_pool_t info;
    assert_int_equal(graphd_pool_create(c, "it-cpu1", "cpu:1", 0, &info), GRAPHD_OK);
    assert_string_equal(info.device, "cpu:1");
    /* "cpu" alone is cpu:0, as torch.device("cpu"); so is no device at all. */
    assert_int_equal(graphd_pool_create(c, "it-cpu", "cpu", 0, &info), GRAPHD_OK);
    assert_string_equal(info.device, "cpu:0");

    graphd_pool_t pools[64];
    size_t n = 64;
    assert_int_equal(graphd_list_pools(c, &n, pools), GRAPHD_OK);
    int seen = 0;
    for (size_t i = 0; i < n; i++) {
        if (strcmp(pools[i].name, "default") == 0) {
            assert_string_equal(pools[i].device, "cpu:0");
            seen |= 1;
        } else if (strcmp(pools[i].name, "it-cpu1") == 0) {
            assert_string_equal(pools[i].device, "cpu:1");
            seen |= 2;
        }
    }
    assert_int_equal(seen, 3);

    /* A device the daemon does not have: no pool, and a capture naming it fails cleanly. */
    int rc = graphd_pool_create(c, "it-cpu5", "cpu:5", 0, NULL);
    assert_int_equal(rc, GRAPHD_ENOT_FOUND);
    assert_non_null(strstr(graphd_last_error(c), "cpu:5"));
    uint64_t mid = harness_models_register(c, &f->m, "mlp.pt");
    assert_true(mid != 0);
    graphd_tensor_spec_t arg = f32_spec(16, 16, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.pool = "it-cpu5";
    graphd_graph_t *g = NULL;
    rc = graphd_capture(c, 1, &callable, &opts, &g);
    assert_int_equal(rc, GRAPHD_ENOT_FOUND);
    assert_non_null(strstr(graphd_last_error(c), "it-cpu5"));

    /* The session carries on: the same module captures on cpu:1. */
    opts.pool = "it-cpu1";
    rc = graphd_capture(c, 1, &callable, &opts, &g);
    if (rc != GRAPHD_OK)
        fail_msg("capture on cpu:1: %s: %s", graphd_err_name(rc), graphd_last_error(c));
    assert_int_equal(graphd_graph_release(g), GRAPHD_OK);
    graphd_close(c);

    c = harness_client(&f->h, "pools-cleanup");
    assert_non_null(c);
    assert_int_equal(graphd_pool_delete(c, "it-cpu1"), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, "it-cpu"), GRAPHD_OK);
    graphd_close(c);
}

/* ---- graphs ----------------------------------------------------------------------------- */

/* mlp.pt captured on each device, trained step by step side by side: both follow PyTorch's
 * losses, and status puts each graph under its pool and device. */
static void graphs_on_each_device_train_like_pytorch(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "train");
    assert_non_null(c);
    assert_int_equal(graphd_pool_create(c, "it-train1", "cpu:1", 0, NULL), GRAPHD_OK);
    harness_graph_t g[2];
    capture_in(c, f, "mlp.pt", 16, 16, NULL, -1, &g[0]);
    capture_in(c, f, "mlp.pt", 16, 16, "it-train1", -1, &g[1]);

    const double *x = harness_fixture_ref(f, "mlp.x", 16 * 16);
    const double *y = harness_fixture_ref(f, "mlp.y", 16 * 8);
    const double *losses = harness_fixture_ref(f, "mlp.losses", STEPS);
    for (int step = 0; step < STEPS; step++) {
        for (int k = 0; k < 2; k++) {
            double loss = train_step(&g[k], x, y);
            double rel = fabs(loss - losses[step]) / fmax(fabs(losses[step]), 1e-12);
            if (rel > REL_TOL)
                fail_msg("cpu:%d step %d: loss %.9g, reference %.9g", k, step, loss, losses[step]);
        }
    }

    json_t *st = harness_status(c);
    assert_non_null(st);
    json_t *graphs = json_object_get(st, "graphs");
    json_t *g0 = harness_find_int(graphs, "id", graphd_graph_id(g[0].g));
    json_t *g1 = harness_find_int(graphs, "id", graphd_graph_id(g[1].g));
    assert_non_null(g0);
    assert_non_null(g1);
    assert_string_equal(str_of(g0, "pool"), "default");
    assert_string_equal(str_of(g0, "device"), "cpu:0");
    assert_string_equal(str_of(g1, "pool"), "it-train1");
    assert_string_equal(str_of(g1, "device"), "cpu:1");
    json_t *pools = json_object_get(st, "pools");
    json_t *p0 = harness_find(pools, "name", "default");
    json_t *p1 = harness_find(pools, "name", "it-train1");
    assert_non_null(p0);
    assert_non_null(p1);
    assert_string_equal(str_of(p0, "device"), "cpu:0");
    assert_string_equal(str_of(p1, "device"), "cpu:1");
    assert_int_equal(harness_int(p1, "graphs"), 1);
    assert_int_equal(harness_int(p1, "replays"), 2 * STEPS);
    assert_true(harness_int(p0, "graphs") >= 1);
    assert_true(harness_int(p0, "replays") >= 2 * STEPS);
    json_decref(st);

    assert_int_equal(harness_graph_release(&g[0]), GRAPHD_OK);
    assert_int_equal(harness_graph_release(&g[1]), GRAPHD_OK);
    graphd_close(c);
    c = harness_client(&f->h, "train-cleanup");
    assert_non_null(c);
    assert_int_equal(graphd_pool_delete(c, "it-train1"), GRAPHD_OK);
    graphd_close(c);
}

/* One session sends a REPLAY of a slow graph on cpu:1, then one of a fast graph on cpu:0, on its
 * session socket without waiting: the cpu:0 reply must come back first.
 *
 * This is an ordering check with a wide margin, not a timing threshold. Were the two devices one
 * queue, the fast replay would run after the slow one and its reply would come second however
 * fast or slow either graph is, so no timing can make the test pass wrongly. With a queue each,
 * it comes first as long as the fast replay finishes before the slow one: slow.pt is sized to
 * take well over 100 times as long (here, with the reference BLAS on 2 cores, about 0.4 s
 * against under 1 ms), so a loaded machine does not make it flaky either. Both are measured
 * alone first, for the failure message. */
static void a_slow_device_does_not_hold_up_another(void **state)
{
    fixture_t *f = *state;
    int fd;
    graphd_client_t *c = dp_client_with_fd(&f->h, "independent", &fd);
    assert_int_equal(graphd_pool_create(c, "it-slow1", "cpu:1", 0, NULL), GRAPHD_OK);
    harness_graph_t slow, fast;
    /* slow.pt at [256, 256]: 64 rounds of a [256, 256] x [256, 256] matmul (1 GFLOP); no
     * warm-up iterations, to keep the capture short. mlp.pt at [16, 16]: tiny. */
    capture_in(c, f, "slow.pt", 256, 256, "it-slow1", 0, &slow);
    capture_in(c, f, "mlp.pt", 16, 16, NULL, -1, &fast);
    assert_int_equal(graphd_graph_has_backward(slow.g), 0);

    /* Each alone, round trips: the slowest of a few fast ones, and one slow one. */
    uint64_t fast_ns = 0;
    for (int i = 0; i < 5; i++) {
        uint64_t t0 = now_ns();
        replay_ok(&fast, GRAPHD_PHASE_FORWARD);
        uint64_t dt = now_ns() - t0;
        fast_ns = dt > fast_ns ? dt : fast_ns;
    }
    uint64_t t0 = now_ns();
    replay_ok(&slow, GRAPHD_PHASE_FORWARD);
    uint64_t slow_ns = now_ns() - t0;
    print_message("slow.pt on cpu:1 %.1f ms, mlp.pt on cpu:0 %.3f ms, alone\n", slow_ns / 1e6,
                  fast_ns / 1e6);

    /* Both at once on the raw session socket, libgraphd idle (it reads only inside a call). */
    const uint64_t slow_seq = 901, fast_seq = 902;
    dp_send_frame(fd, GRAPHD_FRAME_REPLAY, slow_seq, graphd_graph_id(slow.g), GRAPHD_PHASE_FORWARD);
    dp_send_frame(fd, GRAPHD_FRAME_REPLAY, fast_seq, graphd_graph_id(fast.g), GRAPHD_PHASE_FORWARD);
    graphd_frame_t first, second;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    dp_recv_frame(fd, &first, msg, sizeof(msg));
    assert_int_equal(first.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
    assert_int_equal(first.status, 0);
    dp_recv_frame(fd, &second, msg, sizeof(msg));
    assert_int_equal(second.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
    assert_int_equal(second.status, 0);
    if (first.seq != fast_seq)
        fail_msg("the cpu:0 replay came back after the cpu:1 one: cpu:0 waited for cpu:1 (alone "
                 "they take %.3f ms and %.1f ms)",
                 fast_ns / 1e6, slow_ns / 1e6);
    assert_int_equal(second.seq, slow_seq);

    /* libgraphd carries on over the same socket. */
    replay_ok(&fast, GRAPHD_PHASE_FORWARD);
    assert_int_equal(harness_graph_release(&slow), GRAPHD_OK);
    assert_int_equal(harness_graph_release(&fast), GRAPHD_OK);
    graphd_close(c);
    c = harness_client(&f->h, "independent-cleanup");
    assert_non_null(c);
    assert_int_equal(graphd_pool_delete(c, "it-slow1"), GRAPHD_OK);
    graphd_close(c);
}

/* ---- main ------------------------------------------------------------------------------- */

static int group_setup(void **state)
{
    static fixture_t f;
    static const char *const args[] = {"--cpu-devices", "2", NULL};
    *state = &f;
    return harness_fixture_start(&f, args);
}

static int group_teardown(void **state)
{
    return harness_fixture_stop(*state);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(both_cpu_devices_are_listed),
        cmocka_unit_test(pools_are_per_device),
        cmocka_unit_test(graphs_on_each_device_train_like_pytorch),
        cmocka_unit_test(a_slow_device_does_not_hold_up_another),
    };
    return cmocka_run_group_tests_name("devices", tests, group_setup, group_teardown);
}
