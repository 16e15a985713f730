/*
 * Random ops through the real daemon: a captured module with dropout has an
 * RNG_STATE tensor (GRAPHD_ROLE_RNG_STATE), FORWARD draws from the state the
 * client writes there and leaves the advanced state, so the same state gives
 * the same masks (eager PyTorch's for that state), on the session socket and
 * through gRPC alike; a state that is not one is INVALID_ARGUMENT and the
 * graph goes on working.
 *
 * The models and references come from tests/models/make_models.py (DropNet:
 * Linear(6, 8) + Dropout(0.5) in training mode, traced), run at group setup.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../lib/harness.h"

#define RNG_BYTES 5056 /* torch.get_rng_state().numel() */
#define DROP_IN 24     /* DropNet's input [4, 6] */
#define DROP_OUT 32    /* and output [4, 8] */

typedef harness_fixture_t fixture_t;

static void capture_model(graphd_client_t *c, const fixture_t *f, const char *file,
                          const int64_t *xs, harness_graph_t *out)
{
    uint64_t id = harness_models_register(c, &f->m, file);
    if (id == 0)
        fail_msg("cannot register %s", file);
    graphd_tensor_spec_t arg;
    memset(&arg, 0, sizeof(arg));
    arg.dtype = GRAPHD_FLOAT32;
    arg.ndim = 2;
    memcpy(arg.shape, xs, 2 * sizeof(*xs));
    graphd_callable_t callable = {id, NULL, 1, &arg};
    graphd_graph_t *g = NULL;
    int rc = graphd_capture(c, 1, &callable, NULL, &g);
    if (rc != GRAPHD_OK)
        fail_msg("capture %s: %s: %s", file, graphd_err_name(rc), graphd_last_error(c));
    assert_int_equal(harness_graph_load(out, c, g), 0);
}

enum { FAST, RPC };

static int replay(const harness_graph_t *g, int path)
{
    return path == FAST ? graphd_replay(g->g, GRAPHD_PHASE_FORWARD, NULL)
                        : graphd_replay_rpc(g->g, GRAPHD_PHASE_FORWARD, NULL);
}

static void replay_ok(const harness_graph_t *g, int path)
{
    int rc = replay(g, path);
    if (rc != GRAPHD_OK)
        fail_msg("%s FORWARD: %s: %s", path == FAST ? "frame" : "gRPC", graphd_err_name(rc),
                 graphd_last_error(g->c));
}

static void put_state(uint8_t *s, const double *v)
{
    for (size_t i = 0; i < RNG_BYTES; i++)
        s[i] = (uint8_t)v[i];
}

static void dropout_follows_the_written_state(void **state)
{
    const fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "rng");
    assert_non_null(c);
    harness_graph_t g, plain;
    capture_model(c, f, "drop.pt", (const int64_t[]){4, 6}, &g);
    capture_model(c, f, "mlp.pt", (const int64_t[]){16, 16}, &plain);
    assert_int_equal(harness_count_role(&plain, GRAPHD_ROLE_RNG_STATE), 0);

    /* The tensor: one, uint8[5056], named for the generator's device. */
    assert_int_equal(harness_count_role(&g, GRAPHD_ROLE_RNG_STATE), 1);
    const graphd_tensor_t *rt = harness_tensor(&g, GRAPHD_ROLE_RNG_STATE, 0);
    assert_non_null(rt);
    assert_string_equal(rt->name, "cpu");
    assert_int_equal(rt->dtype, GRAPHD_UINT8);
    assert_int_equal(rt->ndim, 1);
    assert_int_equal(rt->shape[0], RNG_BYTES);
    assert_int_equal(rt->nbytes, RNG_BYTES);
    assert_int_equal(rt->requires_grad, 0);
    uint8_t *rng = rt->data;
    float *x = harness_tensor(&g, GRAPHD_ROLE_INPUT, 0)->data;
    const float *out = harness_tensor(&g, GRAPHD_ROLE_OUTPUT, 0)->data;
    const double *xv = harness_fixture_ref(f, "drop.x", DROP_IN),
                 *state0 = harness_fixture_ref(f, "drop.state0", RNG_BYTES);
    const double *state1 = harness_fixture_ref(f, "drop.state1", RNG_BYTES),
                 *out1 = harness_fixture_ref(f, "drop.out1", DROP_OUT);
    for (size_t i = 0; i < DROP_IN; i++)
        x[i] = (float)xv[i];

    /* The same state written before each replay: the same masks, eager PyTorch's, whichever
     * path the replay takes; the state the replay leaves is the eager generator's. */
    float first[DROP_OUT];
    for (int k = 0; k < 4; k++) {
        put_state(rng, state0);
        replay_ok(&g, k % 2 ? RPC : FAST);
        if (k == 0)
            memcpy(first, out, sizeof(first));
        assert_memory_equal(first, out, sizeof(first));
        for (size_t i = 0; i < DROP_OUT; i++)
            if (out[i] != (float)out1[i])
                fail_msg("out[%zu] %.9g, eager PyTorch %.9g", i, out[i], out1[i]);
        for (size_t i = 0; i < RNG_BYTES; i++)
            if (rng[i] != (uint8_t)state1[i])
                fail_msg("state byte %zu is %u, eager PyTorch's %u", i, rng[i],
                         (unsigned)state1[i]);
    }
    /* The state carried on: the next masks. */
    replay_ok(&g, FAST);
    assert_true(memcmp(first, out, sizeof(first)) != 0);

    /* Not a generator state: INVALID_ARGUMENT with the reason, on both paths. */
    for (int path = FAST; path <= RPC; path++) {
        memset(rng, 0xff, RNG_BYTES);
        assert_int_equal(replay(&g, path), GRAPHD_EINVALID_ARGUMENT);
        if (strstr(graphd_last_error(c), "rng_state tensor 'cpu' is not a valid") == NULL)
            fail_msg("message: %s", graphd_last_error(c));
    }
    put_state(rng, state0);
    replay_ok(&g, FAST);
    assert_memory_equal(first, out, sizeof(first));

    assert_int_equal(harness_graph_release(&g), GRAPHD_OK);
    assert_int_equal(harness_graph_release(&plain), GRAPHD_OK);
    graphd_close(c);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(dropout_follows_the_written_state),
    };
    return cmocka_run_group_tests_name("graphs_rng", tests, harness_fixture_group_setup,
                                       harness_fixture_group_teardown);
}
