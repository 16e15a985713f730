/*
 * Graphs through the real daemon, end to end with libgraphd: a module is
 * registered, captured with make_graphed_callables semantics, and trained by
 * replays with every tensor in shared regions; the losses match plain
 * PyTorch. Also the capture variants (two callables sharing a pool, unused
 * inputs, eval mode, BatchNorm buffers, several outputs), bit-identical
 * results from the fast path and gRPC, a module sent through a region,
 * status, and reclaim when a client with graphs dies.
 *
 * The models and references come from tests/models/make_models.py, run at
 * group setup (see harness_models_make). A client that must die is this
 * binary run again with "--child ADDRESS MODELS_DIR".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"

extern char **environ;

#define STEPS 50
#define LR 0.05f
#define REL_TOL 1e-5
#define RECLAIM_WITHIN_MS 1000

typedef harness_fixture_t fixture_t;

/* ---- helpers ---------------------------------------------------------------------------- */

static uint64_t register_model(graphd_client_t *c, const fixture_t *f, const char *name)
{
    uint64_t id = harness_models_register(c, &f->m, name);
    if (id == 0)
        fail_msg("cannot register %s", name);
    return id;
}

static graphd_tensor_spec_t f32_spec(uint32_t ndim, const int64_t *shape, int requires_grad)
{
    graphd_tensor_spec_t s;
    memset(&s, 0, sizeof(s));
    s.dtype = GRAPHD_FLOAT32;
    s.ndim = ndim;
    memcpy(s.shape, shape, ndim * sizeof(*shape));
    s.requires_grad = requires_grad;
    return s;
}

/* Captures n callables and loads their tensor lists; fails the test on error. */
static void capture_ok(graphd_client_t *c, size_t n, const graphd_callable_t *callables,
                       const graphd_capture_opts_t *opts, harness_graph_t *out)
{
    graphd_graph_t *graphs[8];
    assert_true(n <= 8);
    int rc = graphd_capture(c, n, callables, opts, graphs);
    if (rc != GRAPHD_OK)
        fail_msg("capture: %s: %s", graphd_err_name(rc), graphd_last_error(c));
    for (size_t i = 0; i < n; i++)
        assert_int_equal(harness_graph_load(&out[i], c, graphs[i]), 0);
}

static const graphd_tensor_t *tensor(const harness_graph_t *g, int role, uint32_t index)
{
    const graphd_tensor_t *t = harness_tensor(g, role, index);
    if (t == NULL)
        fail_msg("graph %llu has no tensor of role %d index %u",
                 (unsigned long long)graphd_graph_id(g->g), role, index);
    return t;
}

static float *f32(const harness_graph_t *g, int role, uint32_t index)
{
    const graphd_tensor_t *t = tensor(g, role, index);
    assert_int_equal(t->dtype, GRAPHD_FLOAT32);
    return t->data;
}

static void put(const harness_graph_t *g, int role, uint32_t index, const double *v)
{
    float *p = f32(g, role, index);
    size_t n = harness_numel(tensor(g, role, index));
    for (size_t i = 0; i < n; i++)
        p[i] = (float)v[i];
}

static void assert_close(const float *got, const double *want, size_t n, double tol,
                         const char *what)
{
    for (size_t i = 0; i < n; i++)
        if (fabs(got[i] - want[i]) > tol * (1.0 + fabs(want[i])))
            fail_msg("%s[%zu]: got %.9g, want %.9g", what, i, got[i], want[i]);
}

enum { FAST, RPC };

static void replay_ok(const harness_graph_t *g, int phase, int path)
{
    uint64_t ns = 0;
    int rc = path == FAST ? graphd_replay(g->g, phase, &ns) : graphd_replay_rpc(g->g, phase, &ns);
    if (rc != GRAPHD_OK)
        fail_msg("%s replay phase %d of graph %llu: %s: %s", path == FAST ? "frame" : "gRPC", phase,
                 (unsigned long long)graphd_graph_id(g->g), graphd_err_name(rc),
                 graphd_last_error(g->c));
    assert_true(ns > 0);
}

/* MSE of OUTPUT 0 against y; writes d loss / d output into GRAD_OUTPUT 0. */
static double mse_step(const harness_graph_t *g, const double *y)
{
    const float *out = f32(g, GRAPHD_ROLE_OUTPUT, 0);
    float *gout = f32(g, GRAPHD_ROLE_GRAD_OUTPUT, 0);
    size_t n = harness_numel(tensor(g, GRAPHD_ROLE_OUTPUT, 0));
    double loss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - y[i];
        loss += d * d;
        gout[i] = (float)(2.0 / (double)n * d);
    }
    return loss / (double)n;
}

/* SGD over the PARAM memory with the PARAM_GRAD memory, in place. */
static void sgd(const harness_graph_t *g)
{
    for (size_t k = 0; k < g->n; k++) {
        const graphd_tensor_t *gt = &g->t[k];
        if (gt->role != GRAPHD_ROLE_PARAM_GRAD)
            continue;
        float *p = f32(g, GRAPHD_ROLE_PARAM, gt->index);
        const float *gp = gt->data;
        for (size_t i = 0; i < harness_numel(gt); i++)
            p[i] -= LR * gp[i];
    }
}

static void assert_rel(double got, double want, const char *what, int step)
{
    double rel = fabs(got - want) / fmax(fabs(want), 1e-12);
    if (rel > REL_TOL)
        fail_msg("%s step %d: loss %.9g, reference %.9g (rel %.3g)", what, step, got, want, rel);
}

static json_t *status_graph(json_t *st, uint64_t id)
{
    return harness_find_int(json_object_get(st, "graphs"), "id", id);
}

static json_t *status_pool(json_t *st, const char *name)
{
    return harness_find(json_object_get(st, "pools"), "name", name);
}

static json_t *status_session(json_t *st, uint64_t id)
{
    return harness_find_int(json_object_get(st, "sessions"), "id", id);
}

/* ---- training parity -------------------------------------------------------------------- */

static void mlp_trains_like_pytorch(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "mlp");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "mlp.pt");
    const int64_t xs[2] = {16, 16};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);

    assert_int_equal(graphd_graph_training(g.g), 1);
    assert_int_equal(graphd_graph_has_backward(g.g), 1);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_INPUT), 1);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_OUTPUT), 1);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_OUTPUT), 1);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_INPUT), 0); /* x needs no grad */
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_PARAM), 6);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_PARAM_GRAD), 6);
    const graphd_tensor_t *w0 = tensor(&g, GRAPHD_ROLE_PARAM, 0);
    assert_string_equal(w0->name, "0.weight");
    assert_int_equal(w0->ndim, 2);
    assert_int_equal(w0->shape[0], 32);
    assert_int_equal(w0->shape[1], 16);
    assert_int_equal(w0->strides[0], 16);
    assert_int_equal(w0->strides[1], 1);
    assert_int_equal(w0->nbytes, 32 * 16 * 4);
    assert_true(w0->requires_grad);
    assert_string_equal(tensor(&g, GRAPHD_ROLE_PARAM_GRAD, 5)->name, "4.bias");
    const graphd_tensor_t *in = tensor(&g, GRAPHD_ROLE_INPUT, 0);
    assert_false(in->requires_grad);
    const graphd_tensor_t *out = tensor(&g, GRAPHD_ROLE_OUTPUT, 0);
    assert_int_equal(out->shape[0], 16);
    assert_int_equal(out->shape[1], 8);
    assert_true(out->requires_grad);
    /* Every tensor is 64-byte aligned in the mapping, and none overlaps the next. */
    for (size_t k = 0; k < g.n; k++) {
        assert_int_equal((uintptr_t)g.t[k].data % 64, 0);
        for (size_t j = 0; j < g.n; j++) {
            const char *a = g.t[k].data, *b = g.t[j].data;
            if (j != k && a < b)
                assert_true(a + g.t[k].nbytes <= b);
        }
    }

    const double *x = harness_fixture_ref(f, "mlp.x", 256),
                 *y = harness_fixture_ref(f, "mlp.y", 128);
    const double *losses = harness_fixture_ref(f, "mlp.losses", STEPS);
    for (int step = 0; step < STEPS; step++) {
        put(&g, GRAPHD_ROLE_INPUT, 0, x);
        replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
        double loss = mse_step(&g, y);
        replay_ok(&g, GRAPHD_PHASE_BACKWARD, FAST);
        sgd(&g);
        assert_rel(loss, losses[step], "mlp", step);
    }

    /* Status shows the graph, its pool and its session with the replays just made. */
    json_t *st = harness_status(c);
    assert_non_null(st);
    json_t *gs = status_graph(st, graphd_graph_id(g.g));
    assert_non_null(gs);
    assert_int_equal(harness_int(gs, "session"), graphd_session_id(c));
    assert_string_equal(json_string_value(json_object_get(gs, "pool")), "default");
    assert_string_equal(json_string_value(json_object_get(gs, "device")), "cpu:0");
    assert_string_equal(json_string_value(json_object_get(gs, "module")), "mlp.pt");
    assert_true(json_is_true(json_object_get(gs, "training")));
    assert_int_equal(harness_int(gs, "replays_forward"), STEPS);
    assert_int_equal(harness_int(gs, "replays_backward"), STEPS);
    assert_int_equal(harness_int(gs, "replay_errors"), 0);
    assert_true(harness_int(gs, "region_bytes") > 0);
    json_t *lat = json_object_get(gs, "latency");
    assert_int_equal(harness_int(lat, "count"), 2 * STEPS);
    assert_true(harness_int(lat, "p50_ns") > 0);
    assert_true(harness_int(lat, "p99_ns") >= harness_int(lat, "p50_ns"));
    json_t *pool = status_pool(st, "default");
    assert_true(harness_int(pool, "graphs") >= 1);
    assert_true(harness_int(pool, "replays") >= 2 * STEPS);
    lat = json_object_get(pool, "latency");
    assert_true(harness_int(lat, "p50_ns") > 0);
    assert_true(harness_int(lat, "p99_ns") > 0);
    json_t *ss = status_session(st, graphd_session_id(c));
    assert_int_equal(harness_int(ss, "graphs"), 1);
    assert_int_equal(harness_int(ss, "modules"), 1);
    assert_int_equal(harness_int(ss, "replays"), 2 * STEPS);
    long long regions = harness_int(ss, "regions");
    json_decref(st);

    /* Released: gone from status, with its region. */
    uint64_t gid = graphd_graph_id(g.g);
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    st = harness_status(c);
    assert_null(status_graph(st, gid));
    ss = status_session(st, graphd_session_id(c));
    assert_int_equal(harness_int(ss, "graphs"), 0);
    assert_int_equal(harness_int(ss, "regions"), regions - 1);
    json_decref(st);
    assert_int_equal(graphd_module_release(c, mid), GRAPHD_OK);
    graphd_close(c);
}

/* b(a(x)) as two callables captured together in one pool: fwd a, fwd b, bwd b, bwd a. */
static void two_callables_share_a_pool(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "two");
    assert_non_null(c);
    assert_int_equal(graphd_pool_create(c, "it-two", NULL, 0, NULL), GRAPHD_OK);
    uint64_t ma = register_model(c, f, "two_a.pt"), mb = register_model(c, f, "two_b.pt");
    const int64_t xa[2] = {16, 16}, xb[2] = {16, 12};
    graphd_tensor_spec_t arg_a = f32_spec(2, xa, 0), arg_b = f32_spec(2, xb, 1);
    graphd_callable_t callables[2] = {{ma, "forward", 1, &arg_a}, {mb, NULL, 1, &arg_b}};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    assert_int_equal(opts.num_warmup_iters, -1);
    assert_int_equal(opts.allow_unused_input, 0);
    assert_null(opts.pool);
    opts.pool = "it-two";
    harness_graph_t g[2];
    capture_ok(c, 2, callables, &opts, g);
    assert_int_equal(harness_count_role(&g[0], GRAPHD_ROLE_GRAD_INPUT), 0);
    assert_int_equal(harness_count_role(&g[1], GRAPHD_ROLE_GRAD_INPUT), 1);
    assert_true(graphd_graph_id(g[0].g) != graphd_graph_id(g[1].g));

    const double *x = harness_fixture_ref(f, "two.x", 256),
                 *y = harness_fixture_ref(f, "two.y", 128);
    const double *losses = harness_fixture_ref(f, "two.losses", STEPS);
    size_t n_mid = harness_numel(tensor(&g[0], GRAPHD_ROLE_OUTPUT, 0));
    assert_int_equal(n_mid, 16 * 12);
    for (int step = 0; step < STEPS; step++) {
        /* Alternate the planes: the results must not depend on the path. */
        int path = step % 2 == 0 ? RPC : FAST;
        put(&g[0], GRAPHD_ROLE_INPUT, 0, x);
        replay_ok(&g[0], GRAPHD_PHASE_FORWARD, path);
        memcpy(f32(&g[1], GRAPHD_ROLE_INPUT, 0), f32(&g[0], GRAPHD_ROLE_OUTPUT, 0), n_mid * 4);
        replay_ok(&g[1], GRAPHD_PHASE_FORWARD, path);
        double loss = mse_step(&g[1], y);
        replay_ok(&g[1], GRAPHD_PHASE_BACKWARD, path);
        memcpy(f32(&g[0], GRAPHD_ROLE_GRAD_OUTPUT, 0), f32(&g[1], GRAPHD_ROLE_GRAD_INPUT, 0),
               n_mid * 4);
        replay_ok(&g[0], GRAPHD_PHASE_BACKWARD, path);
        sgd(&g[0]);
        sgd(&g[1]);
        assert_rel(loss, losses[step], "two", step);
    }

    json_t *st = harness_status(c);
    json_t *pool = status_pool(st, "it-two");
    assert_non_null(pool);
    assert_int_equal(harness_int(pool, "graphs"), 2);
    assert_int_equal(harness_int(pool, "regions"), 2);
    assert_int_equal(harness_int(pool, "replays"), 4 * STEPS);
    assert_true(harness_int(json_object_get(pool, "latency"), "p99_ns") > 0);
    json_decref(st);
    assert_int_equal(harness_graph_release(&g[1]), GRAPHD_OK);
    assert_int_equal(harness_graph_release(&g[0]), GRAPHD_OK);
    /* The graphs' regions went with them, so the pool can go. */
    assert_int_equal(graphd_pool_delete(c, "it-two"), GRAPHD_OK);
    graphd_close(c);
}

/* ---- capture variants ------------------------------------------------------------------- */

static void unused_input_both_ways(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "unused");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "unused.pt");
    const int64_t s[2] = {2, 4};
    graphd_tensor_spec_t args[2] = {f32_spec(2, s, 1), f32_spec(2, s, 1)};
    graphd_callable_t callable = {mid, NULL, 2, args};
    graphd_graph_t *gp = (graphd_graph_t *)1;
    assert_int_equal(graphd_capture(c, 1, &callable, NULL, &gp), GRAPHD_EINVALID_ARGUMENT);
    assert_non_null(strstr(graphd_last_error(c), "appears to not have been used in the graph"));
    assert_null(gp);

    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.allow_unused_input = 1;
    harness_graph_t g;
    capture_ok(c, 1, &callable, &opts, &g);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_INPUT), 2);
    float *x = f32(&g, GRAPHD_ROLE_INPUT, 0), *gx = f32(&g, GRAPHD_ROLE_GRAD_INPUT, 0);
    float *gy = f32(&g, GRAPHD_ROLE_GRAD_INPUT, 1), *gout = f32(&g, GRAPHD_ROLE_GRAD_OUTPUT, 0);
    const float *w = f32(&g, GRAPHD_ROLE_PARAM, 0); /* lin.weight [3, 4] */
    for (int i = 0; i < 8; i++) {
        x[i] = (float)i * 0.25f;
        gy[i] = 7.0f;
    }
    replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
    for (int i = 0; i < 6; i++)
        gout[i] = 1.0f;
    replay_ok(&g, GRAPHD_PHASE_BACKWARD, FAST);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 4; k++) {
            assert_float_equal(gx[r * 4 + k], w[k] + w[4 + k] + w[8 + k], 1e-5);
            assert_float_equal(gy[r * 4 + k], 0.0f, 0.0f); /* no gradient: zero-filled */
        }
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

static void eval_mode_module(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "eval");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "eval.pt");
    const int64_t s[2] = {4, 6};
    graphd_tensor_spec_t arg = f32_spec(2, s, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);
    assert_int_equal(graphd_graph_training(g.g), 0);
    assert_int_equal(graphd_graph_has_backward(g.g), 0);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_PARAM), 6);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_PARAM_GRAD), 0);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_OUTPUT), 0);
    assert_false(tensor(&g, GRAPHD_ROLE_OUTPUT, 0)->requires_grad);
    for (int rep = 0; rep < 3; rep++) { /* dropout off, running stats fixed */
        put(&g, GRAPHD_ROLE_INPUT, 0, harness_fixture_ref(f, "eval.x", 24));
        replay_ok(&g, GRAPHD_PHASE_FORWARD, rep == 1 ? RPC : FAST);
        assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 0), harness_fixture_ref(f, "eval.out", 12), 12,
                     1e-5, "eval");
    }
    assert_int_equal(graphd_replay(g.g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

/* Column statistics of x [rows, cols]: mean, biased and unbiased variance. */
static void column_stats(const float *x, int rows, int cols, int j, double *mean, double *var,
                         double *var_unbiased)
{
    double m = 0, v = 0;
    for (int r = 0; r < rows; r++)
        m += x[r * cols + j];
    m /= rows;
    for (int r = 0; r < rows; r++)
        v += (x[r * cols + j] - m) * (x[r * cols + j] - m);
    *mean = m;
    *var = v / rows;
    *var_unbiased = v / (rows - 1);
}

/*
 * BnNet: y = lin(bn(x)), plus copies of the running stats. The sample values the daemon warms up
 * with are its own, so the stats are checked against what each replay must do to them (momentum
 * 0.1) rather than against fixed numbers. The copies are taken after batch_norm updates the
 * stats, as in eager mode (graphd runs TorchScript without graph optimisation: make_models.py).
 */
static void batchnorm_buffers(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "bn");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "bn.pt");
    const int64_t s[2] = {6, 5};
    graphd_tensor_spec_t arg = f32_spec(2, s, 1);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_OUTPUT), 3);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_OUTPUT), 1);
    assert_true(tensor(&g, GRAPHD_ROLE_OUTPUT, 0)->requires_grad);
    assert_false(tensor(&g, GRAPHD_ROLE_OUTPUT, 1)->requires_grad);
    assert_false(tensor(&g, GRAPHD_ROLE_OUTPUT, 2)->requires_grad);
    assert_string_equal(tensor(&g, GRAPHD_ROLE_PARAM, 0)->name, "bn.weight");
    assert_string_equal(tensor(&g, GRAPHD_ROLE_PARAM, 2)->name, "lin.weight");
    /* The module's buffers are static tensors too (ROLE_BUFFER): FORWARD updates them there. */
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_BUFFER), 3);
    assert_string_equal(tensor(&g, GRAPHD_ROLE_BUFFER, 0)->name, "bn.running_mean");
    assert_string_equal(tensor(&g, GRAPHD_ROLE_BUFFER, 1)->name, "bn.running_var");
    const graphd_tensor_t *nbt_t = tensor(&g, GRAPHD_ROLE_BUFFER, 2);
    assert_string_equal(nbt_t->name, "bn.num_batches_tracked");
    assert_int_equal(nbt_t->dtype, GRAPHD_INT64);
    assert_int_equal(nbt_t->ndim, 0);
    assert_false(nbt_t->requires_grad);
    const float *buf_rm = f32(&g, GRAPHD_ROLE_BUFFER, 0), *buf_rv = f32(&g, GRAPHD_ROLE_BUFFER, 1);
    const int64_t *nbt = nbt_t->data;
    assert_int_equal(*nbt, 3); /* the daemon's three warm-up iterations */

    const char *inputs[3] = {"bn.x1", "bn.x2", "bn.x0"};
    float *x = f32(&g, GRAPHD_ROLE_INPUT, 0);
    const float *y = f32(&g, GRAPHD_ROLE_OUTPUT, 0);
    const float *rm = f32(&g, GRAPHD_ROLE_OUTPUT, 1), *rv = f32(&g, GRAPHD_ROLE_OUTPUT, 2);
    const float *gamma = f32(&g, GRAPHD_ROLE_PARAM, 0), *beta = f32(&g, GRAPHD_ROLE_PARAM, 1);
    const float *w = f32(&g, GRAPHD_ROLE_PARAM, 2), *b = f32(&g, GRAPHD_ROLE_PARAM, 3);
    for (int k = 0; k < 3; k++) {
        double before_rm[5], before_rv[5];
        for (int j = 0; j < 5; j++) {
            before_rm[j] = buf_rm[j];
            before_rv[j] = buf_rv[j];
        }
        put(&g, GRAPHD_ROLE_INPUT, 0, harness_fixture_ref(f, inputs[k], 30));
        replay_ok(&g, GRAPHD_PHASE_FORWARD, k == 1 ? RPC : FAST);
        double mean[5], var[5], var_u[5];
        for (int j = 0; j < 5; j++)
            column_stats(x, 6, 5, j, &mean[j], &var[j], &var_u[j]);
        /* y = lin(bn(x)) with the batch statistics. */
        for (int r = 0; r < 6; r++)
            for (int o = 0; o < 2; o++) {
                double acc = b[o];
                for (int j = 0; j < 5; j++) {
                    double xn = (x[r * 5 + j] - mean[j]) / sqrt(var[j] + 1e-5);
                    acc += w[o * 5 + j] * (gamma[j] * xn + beta[j]);
                }
                assert_float_equal(y[r * 2 + o], acc, 1e-4 * (1 + fabs(acc)));
            }
        for (int j = 0; j < 5; j++) {
            double want_rm = 0.9 * before_rm[j] + 0.1 * mean[j];
            double want_rv = 0.9 * before_rv[j] + 0.1 * var_u[j];
            /* updated in the BUFFER tensors, and returned as updated */
            assert_float_equal(buf_rm[j], want_rm, 1e-5);
            assert_float_equal(buf_rv[j], want_rv, 1e-5);
            assert_float_equal(rm[j], want_rm, 1e-5);
            assert_float_equal(rv[j], want_rv, 1e-5);
        }
        assert_int_equal(*nbt, 4 + k);
        replay_ok(&g, GRAPHD_PHASE_BACKWARD, FAST);
    }
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

/* Nested outputs (a, {b, c}, [d]) where b and d need no grad; y is a sample arg without grad. */
static void several_outputs_some_with_grad(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "multi");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "multi.pt");
    const int64_t sx[2] = {5, 4}, sy[2] = {5, 2};
    graphd_tensor_spec_t args[2] = {f32_spec(2, sx, 1), f32_spec(2, sy, 0)};
    graphd_callable_t callable = {mid, NULL, 2, args};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);

    const char *names[4] = {"0", "1.b", "1.c", "2.0"};
    const int rg[4] = {1, 0, 1, 0};
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_OUTPUT), 4);
    for (uint32_t i = 0; i < 4; i++) {
        const graphd_tensor_t *t = tensor(&g, GRAPHD_ROLE_OUTPUT, i);
        assert_string_equal(t->name, names[i]);
        assert_int_equal(t->requires_grad, rg[i]);
        assert_int_equal(harness_tensor(&g, GRAPHD_ROLE_GRAD_OUTPUT, i) != NULL, rg[i]);
    }
    assert_true(tensor(&g, GRAPHD_ROLE_INPUT, 0)->requires_grad);
    assert_false(tensor(&g, GRAPHD_ROLE_INPUT, 1)->requires_grad);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_INPUT), 1); /* none for y */
    assert_non_null(harness_tensor(&g, GRAPHD_ROLE_GRAD_INPUT, 0));
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_PARAM_GRAD), 4);

    put(&g, GRAPHD_ROLE_INPUT, 0, harness_fixture_ref(f, "multi.x", 20));
    put(&g, GRAPHD_ROLE_INPUT, 1, harness_fixture_ref(f, "multi.y", 10));
    replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
    assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 0), harness_fixture_ref(f, "multi.a", 15), 15, 1e-5,
                 "a");
    assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 1), harness_fixture_ref(f, "multi.b", 5), 5, 1e-5,
                 "b");
    assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 2), harness_fixture_ref(f, "multi.c", 15), 15, 1e-5,
                 "c");
    assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 3), harness_fixture_ref(f, "multi.d", 20), 20, 0, "d");
    put(&g, GRAPHD_ROLE_GRAD_OUTPUT, 0, harness_fixture_ref(f, "multi.ga", 15));
    put(&g, GRAPHD_ROLE_GRAD_OUTPUT, 2, harness_fixture_ref(f, "multi.gc", 15));
    replay_ok(&g, GRAPHD_PHASE_BACKWARD, FAST);
    assert_close(f32(&g, GRAPHD_ROLE_GRAD_INPUT, 0), harness_fixture_ref(f, "multi.gx", 20), 20,
                 1e-5, "gx");
    for (size_t k = 0; k < g.n; k++) {
        const graphd_tensor_t *t = &g.t[k];
        if (t->role != GRAPHD_ROLE_PARAM_GRAD)
            continue;
        char key[160];
        snprintf(key, sizeof(key), "multi.g.%s", t->name);
        assert_close(t->data, harness_fixture_ref(f, key, harness_numel(t)), harness_numel(t), 1e-5,
                     key);
    }
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

/* ---- the two planes --------------------------------------------------------------------- */

/* Copies of every tensor of a role set, to compare the two planes' results. */
static uint8_t *snapshot(const harness_graph_t *g, const int *roles, size_t n_roles, size_t *len)
{
    size_t total = 0;
    for (size_t k = 0; k < g->n; k++)
        for (size_t r = 0; r < n_roles; r++)
            if (g->t[k].role == roles[r])
                total += g->t[k].nbytes;
    uint8_t *buf = malloc(total + 1), *p = buf;
    assert_non_null(buf);
    for (size_t k = 0; k < g->n; k++)
        for (size_t r = 0; r < n_roles; r++)
            if (g->t[k].role == roles[r]) {
                memcpy(p, g->t[k].data, g->t[k].nbytes);
                p += g->t[k].nbytes;
            }
    *len = total;
    return buf;
}

static void fast_path_and_grpc_bit_identical(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "planes");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "mlp.pt");
    const int64_t xs[2] = {16, 16};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 1);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_GRAD_INPUT), 1);

    const int fwd_roles[] = {GRAPHD_ROLE_OUTPUT};
    const int bwd_roles[] = {GRAPHD_ROLE_GRAD_INPUT, GRAPHD_ROLE_PARAM_GRAD};
    const double *x = harness_fixture_ref(f, "mlp.x", 256);
    float *gout = f32(&g, GRAPHD_ROLE_GRAD_OUTPUT, 0);
    for (int round = 0; round < 3; round++) {
        put(&g, GRAPHD_ROLE_INPUT, 0, x);
        f32(&g, GRAPHD_ROLE_INPUT, 0)[round] += 0.5f; /* a different input each round */
        for (int i = 0; i < 128; i++)
            gout[i] = (float)((i % 7) - 3) * 0.125f + (float)round;

        size_t n1, n2, m1, m2;
        replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
        uint8_t *fwd_fast = snapshot(&g, fwd_roles, 1, &n1);
        memset(f32(&g, GRAPHD_ROLE_OUTPUT, 0), 0, n1);
        replay_ok(&g, GRAPHD_PHASE_FORWARD, RPC);
        uint8_t *fwd_rpc = snapshot(&g, fwd_roles, 1, &n2);
        assert_int_equal(n1, n2);
        assert_int_equal(memcmp(fwd_fast, fwd_rpc, n1), 0);

        replay_ok(&g, GRAPHD_PHASE_BACKWARD, RPC);
        uint8_t *bwd_rpc = snapshot(&g, bwd_roles, 2, &m1);
        for (size_t k = 0; k < g.n; k++)
            if (g.t[k].role == GRAPHD_ROLE_GRAD_INPUT || g.t[k].role == GRAPHD_ROLE_PARAM_GRAD)
                memset(g.t[k].data, 0, g.t[k].nbytes);
        replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
        replay_ok(&g, GRAPHD_PHASE_BACKWARD, FAST);
        uint8_t *bwd_fast = snapshot(&g, bwd_roles, 2, &m2);
        assert_int_equal(m1, m2);
        assert_int_equal(memcmp(bwd_fast, bwd_rpc, m1), 0);
        free(fwd_fast);
        free(fwd_rpc);
        free(bwd_fast);
        free(bwd_rpc);
        sgd(&g); /* new parameters for the next round, seen by both planes */
    }
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    graphd_close(c);
}

/* ---- modules ---------------------------------------------------------------------------- */

/* Over 1 MiB: libgraphd sends it through a temporary region, freed after the call. */
static void large_module_through_a_region(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "big");
    assert_non_null(c);
    size_t len = 0;
    void *bytes = harness_models_read(&f->m, "big.pt", &len);
    assert_non_null(bytes);
    assert_true(len > (1u << 20));

    json_t *st = harness_status(c);
    long long reserved = harness_int(status_pool(st, "default"), "reserved_bytes");
    long long loaded = harness_int(json_object_get(st, "daemon"), "modules_loaded");
    json_decref(st);

    uint64_t mid = 0;
    assert_int_equal(graphd_module_register(c, bytes, len, NULL, &mid), GRAPHD_OK);
    assert_true(mid != 0);
    st = harness_status(c);
    assert_int_equal(harness_int(status_pool(st, "default"), "reserved_bytes"), reserved);
    assert_int_equal(harness_int(json_object_get(st, "daemon"), "modules_loaded"), loaded + 1);
    assert_int_equal(harness_int(status_session(st, graphd_session_id(c)), "regions"), 0);
    json_decref(st);
    free(bytes);

    const int64_t xs[2] = {3, 640};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    harness_graph_t g;
    capture_ok(c, 1, &callable, NULL, &g);
    put(&g, GRAPHD_ROLE_INPUT, 0, harness_fixture_ref(f, "big.x", 3 * 640));
    replay_ok(&g, GRAPHD_PHASE_FORWARD, FAST);
    assert_close(f32(&g, GRAPHD_ROLE_OUTPUT, 0), harness_fixture_ref(f, "big.y", 3 * 512), 3 * 512,
                 1e-5, "big");
    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    assert_int_equal(graphd_module_release(c, mid), GRAPHD_OK);
    assert_int_equal(graphd_module_release(c, mid), GRAPHD_ENOT_FOUND);
    graphd_close(c);
}

/* ---- handles and sessions --------------------------------------------------------------- */

static void close_and_goodbye_with_live_graphs(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *watch = harness_client(&f->h, "watch");
    assert_non_null(watch);
    const int64_t xs[2] = {16, 16};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 0);

    /* graphd_close with graphs and a region open ends the session (the daemon frees them with
     * it) but not the handles: each holds a reference on the client, whose memory and mappings
     * go with the last release. Under ASan this checks that nothing leaks or is used freed. */
    graphd_client_t *c = harness_client(&f->h, "closer");
    assert_non_null(c);
    uint64_t sid = graphd_session_id(c);
    graphd_callable_t callable = {register_model(c, f, "mlp.pt"), NULL, 1, &arg};
    harness_graph_t hg[2], left;
    capture_ok(c, 1, &callable, NULL, &hg[0]);
    capture_ok(c, 1, &callable, NULL, &hg[1]);
    float *in = f32(&hg[1], GRAPHD_ROLE_INPUT, 0);
    for (size_t i = 0; i < 16 * 16; i++)
        in[i] = (float)i / 256.0f;
    replay_ok(&hg[1], GRAPHD_PHASE_FORWARD, FAST);
    size_t nout = harness_numel(tensor(&hg[1], GRAPHD_ROLE_OUTPUT, 0));
    float *out1 = f32(&hg[1], GRAPHD_ROLE_OUTPUT, 0);
    float *seen = malloc(nout * sizeof(*seen));
    assert_non_null(seen);
    memcpy(seen, out1, nout * sizeof(*seen));
    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, NULL, 4096, &r), GRAPHD_OK);
    memset(graphd_region_ptr(r), 0x5a, 4096);
    uint64_t g0 = graphd_graph_id(hg[0].g), g1 = graphd_graph_id(hg[1].g);
    json_t *st = harness_status(watch);
    assert_non_null(status_graph(st, g0));
    json_decref(st);
    graphd_close(c);
    st = harness_status(watch);
    assert_null(status_session(st, sid));
    assert_null(status_graph(st, g0));
    assert_null(status_graph(st, g1));
    json_decref(st);
    /* The handles outlive the close: the static tensors and the region stay mapped and readable,
     * replays fail, and the releases (the last frees the client) report the ended session. */
    assert_memory_equal(f32(&hg[1], GRAPHD_ROLE_OUTPUT, 0), seen, nout * sizeof(*seen));
    free(seen);
    assert_int_equal(((unsigned char *)graphd_region_ptr(r))[4095], 0x5a);
    assert_int_equal(graphd_graph_id(hg[0].g), g0);
    assert_int_equal(graphd_replay(hg[0].g, GRAPHD_PHASE_FORWARD, NULL),
                     GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_replay_rpc(hg[1].g, GRAPHD_PHASE_FORWARD, NULL),
                     GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(harness_graph_release(&hg[1]), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(harness_graph_release(&hg[0]), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(((unsigned char *)graphd_region_ptr(r))[0], 0x5a);
    graphd_region_release(r);

    /* Closed with nothing open, the client goes at once (ASan: no leak). */
    c = harness_client(&f->h, "closer2");
    assert_non_null(c);
    graphd_close(c);

    /* After Goodbye a graph's memory stays mapped; replay fails, release frees the handle. */
    c = harness_client(&f->h, "leaver");
    assert_non_null(c);
    callable.module_id = register_model(c, f, "mlp.pt");
    graphd_graph_t *g;
    assert_int_equal(graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_OK);
    assert_int_equal(harness_graph_load(&left, c, g), 0);
    assert_int_equal(graphd_goodbye(c), GRAPHD_OK);
    float *out = f32(&left, GRAPHD_ROLE_OUTPUT, 0);
    out[0] = 1.5f;
    assert_float_equal(out[0], 1.5f, 0);
    assert_int_equal(graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(harness_graph_release(&left), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_graph_release(NULL), GRAPHD_OK);
    graphd_close(c);
    graphd_close(watch);
}

/* The child: a session with a module, a captured graph replayed once, "ready SESSION GRAPH" on
 * stdout, then it waits to be killed (or for stdin's EOF, should the test die first). */
static int child_main(const char *address, const char *models_dir)
{
    harness_models_t m;
    memset(&m, 0, sizeof(m));
    snprintf(m.dir, sizeof(m.dir), "%s", models_dir);
    graphd_client_t *c;
    if (graphd_connect(address, &c) != GRAPHD_OK || graphd_hello(c, "doomed") != GRAPHD_OK)
        return 1;
    uint64_t mid = harness_models_register(c, &m, "mlp.pt");
    const int64_t xs[2] = {16, 16};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 1);
    graphd_callable_t callables[2] = {{mid, NULL, 1, &arg}, {mid, NULL, 1, &arg}};
    graphd_graph_t *g[2];
    if (mid == 0 || graphd_capture(c, 2, callables, NULL, g) != GRAPHD_OK ||
        graphd_replay(g[0], GRAPHD_PHASE_FORWARD, NULL) != GRAPHD_OK) {
        fprintf(stderr, "child: setup failed: %s\n", graphd_last_error(c));
        return 1;
    }
    printf("ready %llu %llu\n", (unsigned long long)graphd_session_id(c),
           (unsigned long long)graphd_graph_id(g[0]));
    fflush(stdout);
    char b;
    while (read(0, &b, 1) != 0)
        ;
    return 0;
}

/* Status once the default pool holds only the graphs of live sessions: a graph an earlier test
 * released may still be on its way out (the destroy runs on a worker), and would leave the
 * baseline one too high. */
static json_t *settled_status(graphd_client_t *watch)
{
    for (int64_t t0 = harness_now_ms();;) {
        json_t *st = harness_status(watch);
        assert_non_null(st);
        long long held = 0;
        json_t *ss = json_object_get(st, "sessions");
        for (size_t i = 0; i < json_array_size(ss); i++)
            held += harness_int(json_array_get(ss, i), "graphs");
        if (harness_int(status_pool(st, "default"), "graphs") == held ||
            harness_now_ms() - t0 > 5000)
            return st;
        json_decref(st);
        usleep(20000);
    }
}

static void sigkill_reclaims_graphs(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *watch = harness_client(&f->h, "watch");
    assert_non_null(watch);
    json_t *st = settled_status(watch);
    json_t *pool = status_pool(st, "default");
    long long base_reserved = harness_int(pool, "reserved_bytes");
    long long base_regions = harness_int(pool, "regions");
    long long base_graphs = harness_int(pool, "graphs");
    json_decref(st);

    int out[2], in[2];
    assert_int_equal(pipe2(out, O_CLOEXEC), 0);
    assert_int_equal(pipe2(in, O_CLOEXEC), 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out[1], 1);
    posix_spawn_file_actions_adddup2(&fa, in[0], 0);
    char *argv[] = {"/proc/self/exe", "--child", f->h.address, f->m.dir, NULL};
    pid_t pid;
    assert_int_equal(posix_spawn(&pid, "/proc/self/exe", &fa, NULL, argv, environ), 0);
    posix_spawn_file_actions_destroy(&fa);
    close(out[1]);
    close(in[0]);
    char line[128] = "";
    size_t used = 0;
    for (int64_t t0 = harness_now_ms(); !strchr(line, '\n') && harness_now_ms() - t0 < 30000;) {
        struct pollfd p = {.fd = out[0], .events = POLLIN};
        if (poll(&p, 1, 100) <= 0)
            continue;
        ssize_t n = read(out[0], line + used, sizeof(line) - used - 1);
        if (n <= 0)
            break;
        used += (size_t)n;
        line[used] = '\0';
    }
    unsigned long long sid = 0, gid = 0;
    assert_int_equal(sscanf(line, "ready %llu %llu", &sid, &gid), 2);

    st = harness_status(watch);
    json_t *ss = status_session(st, sid);
    assert_non_null(ss);
    assert_int_equal(harness_int(ss, "graphs"), 2);
    assert_int_equal(harness_int(ss, "regions"), 2);
    assert_non_null(status_graph(st, gid));
    assert_int_equal(harness_int(status_pool(st, "default"), "graphs"), base_graphs + 2);
    json_decref(st);

    assert_int_equal(kill(pid, SIGKILL), 0);
    assert_int_equal(waitpid(pid, NULL, 0), pid);
    close(out[0]);
    close(in[1]);
    int64_t died = harness_now_ms();
    int gone = 0;
    while (!gone && harness_now_ms() - died <= RECLAIM_WITHIN_MS) {
        st = harness_status(watch);
        assert_non_null(st);
        pool = status_pool(st, "default");
        gone = status_session(st, sid) == NULL && status_graph(st, gid) == NULL &&
               harness_int(pool, "graphs") == base_graphs &&
               harness_int(pool, "regions") == base_regions &&
               harness_int(pool, "reserved_bytes") == base_reserved;
        json_decref(st);
        if (!gone)
            usleep(20000);
    }
    if (!gone)
        fail_msg("graphs or regions of killed session %llu still there after %d ms", sid,
                 RECLAIM_WITHIN_MS);
    graphd_close(watch);
}

int main(int argc, char **argv)
{
    if (argc == 4 && strcmp(argv[1], "--child") == 0)
        return child_main(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(mlp_trains_like_pytorch),
        cmocka_unit_test(two_callables_share_a_pool),
        cmocka_unit_test(unused_input_both_ways),
        cmocka_unit_test(eval_mode_module),
        cmocka_unit_test(batchnorm_buffers),
        cmocka_unit_test(several_outputs_some_with_grad),
        cmocka_unit_test(fast_path_and_grpc_bit_identical),
        cmocka_unit_test(large_module_through_a_region),
        cmocka_unit_test(close_and_goodbye_with_live_graphs),
        cmocka_unit_test(sigkill_reclaims_graphs),
    };
    return cmocka_run_group_tests_name("graphs", tests, harness_fixture_group_setup,
                                       harness_fixture_group_teardown);
}
