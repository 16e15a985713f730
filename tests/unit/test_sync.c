/*
 * Unit tests for graph_runtime's synchronisation rule (docs/ARCHITECTURE.md, "Synchronisation"):
 * captures, warm-ups, replays, graph destruction and frees wait only for streams of their own,
 * never for the whole device. Every host wait the runtime makes is counted by scope
 * (gr_sync_stats); these tests run those paths and check that the device-wide count does not
 * move. On the CPU (everywhere) with one and two logical devices and a shared pool; on CUDA
 * (skipped without a GPU) host-staged and device-resident, with the resident blocks freed
 * (deferred) and reclaimed. tests/python/test_sync_paths.py checks the sources for device-wide
 * calls that would bypass the count.
 *
 * The model (mlp.pt) is made at group setup by tests/models/make_models.py (as
 * test_graph_runtime.c: GRAPHD_PYTHON, GRAPHD_SRC) into a temporary directory.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime.h"

#define ROUNDS 5

static char dir[64];

static int run_make_models(void)
{
    const char *python = getenv("GRAPHD_PYTHON");
    const char *src = getenv("GRAPHD_SRC");
    char script[4096];
    snprintf(script, sizeof script, "%s/tests/models/make_models.py", src ? src : ".");
    if (python == NULL || *python == '\0')
        python = "/usr/bin/python3";
    pid_t pid = fork();
    if (pid < 0)
        return -1;
    if (pid == 0) {
        execl(python, python, script, dir, (char *)NULL);
        fprintf(stderr, "exec %s: %s\n", python, strerror(errno));
        _exit(127);
    }
    int status = 0;
    if (waitpid(pid, &status, 0) < 0)
        return -1;
    return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int group_setup(void **state)
{
    (void)state;
    snprintf(dir, sizeof dir, "/tmp/gr_sync_XXXXXX");
    if (mkdtemp(dir) == NULL || run_make_models() != 0) {
        fprintf(stderr, "test_sync: tests/models/make_models.py failed\n");
        return -1;
    }
    return gr_runtime_init(1) == GR_OK && gr_cpu_devices(2) == GR_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    return system(cmd) == 0 ? 0 : -1;
}

static gr_module_t *load_mlp(void)
{
    char path[256];
    snprintf(path, sizeof path, "%s/mlp.pt", dir);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    assert_true(n > 0);
    void *buf = malloc((size_t)n);
    assert_non_null(buf);
    assert_int_equal(fread(buf, 1, (size_t)n, f), (size_t)n);
    fclose(f);
    gr_module_t *m = NULL;
    int rc = gr_module_load(buf, (size_t)n, &m);
    if (rc != GR_OK)
        fail_msg("load mlp.pt: %s: %s", gr_err_name(rc), gr_last_error());
    free(buf);
    return m;
}

static gr_sync_stats_t stats(void)
{
    gr_sync_stats_t s;
    assert_int_equal(gr_sync_stats(&s), GR_OK);
    return s;
}

/* The static block of one graph: host memory, or (resident) a gr_device_alloc block. */
typedef struct block {
    void *p;
    int device; /* from gr_device_alloc */
} block_t;

/* Captures mlp.pt (warm-up included) on device into a fresh block, replays FORWARD and BACKWARD
 * ROUNDS times and destroys the graph; a resident block is freed with gr_device_free. */
static void capture_replay_destroy(const char *device, gr_pool_t *pool, int resident)
{
    gr_module_t *m = load_mlp();
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg;
    memset(&arg, 0, sizeof arg);
    arg.dtype = GR_DTYPE_F32;
    arg.ndim = 2;
    memcpy(arg.shape, xs, sizeof xs);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.pool = pool;
    opts.resident = resident;
    opts.copy_param_grads = 1;
    gr_capture_t *c = NULL;
    int rc = gr_capture_prepare(device, 1, &spec, &opts, &c);
    if (rc != GR_OK)
        fail_msg("prepare on %s: %s: %s", device, gr_err_name(rc), gr_last_error());
    uint64_t total = 0;
    size_t count = 0;
    assert_int_equal(gr_capture_layout(c, 0, &count, NULL, &total), GR_OK);
    block_t b = {NULL, resident};
    if (resident) {
        uint8_t handle[GR_IPC_HANDLE_SIZE];
        assert_int_equal(gr_device_alloc(device, total, &b.p, handle), GR_OK);
    } else {
        b.p = aligned_alloc(GR_ALIGN, total ? total : GR_ALIGN);
        assert_non_null(b.p);
    }
    gr_graph_t *g = NULL;
    void *bases[1] = {b.p};
    rc = gr_capture_finish(c, bases, &g);
    if (rc != GR_OK)
        fail_msg("finish on %s: %s: %s", device, gr_err_name(rc), gr_last_error());
    for (int i = 0; i < ROUNDS; i++) {
        rc = gr_graph_replay(g, GR_PHASE_FORWARD, NULL, NULL);
        if (rc == GR_OK)
            rc = gr_graph_replay(g, GR_PHASE_BACKWARD, NULL, NULL);
        if (rc != GR_OK)
            fail_msg("replay on %s: %s: %s", device, gr_err_name(rc), gr_last_error());
    }
    assert_int_equal(gr_graph_destroy(g), GR_OK);
    if (resident)
        assert_int_equal(gr_device_free(device, b.p), GR_OK);
    else
        free(b.p);
    gr_module_release(m);
}

/* On the CPU devices: captures (own pool and a shared one), replays, destroys and the idle
 * reclaim make no device-wide wait, and no stream wait either (the CPU family has no streams). */
static void test_cpu_paths_make_no_device_wait(void **state)
{
    (void)state;
    gr_sync_stats_t before = stats();
    capture_replay_destroy("cpu:0", NULL, 0);
    capture_replay_destroy("cpu:1", NULL, 0);
    gr_pool_t *pool = NULL;
    assert_int_equal(gr_pool_create("cpu:0", &pool), GR_OK);
    capture_replay_destroy("cpu:0", pool, 0);
    capture_replay_destroy("cpu:0", pool, 0);
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    uint64_t pending = 99;
    assert_int_equal(gr_device_reclaim("cpu:0", 0, &pending), GR_OK);
    assert_int_equal(pending, 0);
    gr_sync_stats_t after = stats();
    assert_int_equal(after.device_waits, before.device_waits);
    assert_int_equal(after.stream_waits, before.stream_waits);
    assert_int_equal(after.frees_deferred, before.frees_deferred);
    assert_int_equal(after.frees_pending, 0);
}

static void test_bad_arguments(void **state)
{
    (void)state;
    assert_int_equal(gr_sync_stats(NULL), GR_EINVAL);
    assert_non_null(strstr(gr_last_error(), "NULL out"));
    assert_int_equal(gr_device_reclaim(NULL, 0, NULL), GR_EINVAL);
    assert_int_equal(gr_device_reclaim("tpu:0", 0, NULL), GR_EINVAL);
    assert_non_null(strstr(gr_last_error(), "unknown device kind 'tpu'"));
    assert_int_equal(gr_device_reclaim("cpu:0", 1, NULL), GR_OK);
}

static size_t cuda_count(void)
{
    size_t n = 0;
    gr_device_info_t items[16];
    size_t count = 16;
    if (gr_devices(&count, items) != GR_OK)
        return 0;
    for (size_t i = 0; i < count; i++)
        n += strncmp(items[i].device, "cuda:", 5) == 0;
    return n;
}

/* On cuda:0: host-staged and device-resident captures, replays and destroys wait for their own
 * streams only; the resident blocks' frees are deferred, and the idle reclaim frees them without
 * a device-wide wait once their streams are done. */
static void test_cuda_paths_make_no_device_wait(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    gr_sync_stats_t before = stats();
    capture_replay_destroy("cuda:0", NULL, 0);
    gr_pool_t *pool = NULL;
    assert_int_equal(gr_pool_create("cuda:0", &pool), GR_OK);
    capture_replay_destroy("cuda:0", pool, 1);
    capture_replay_destroy("cuda:0", pool, 1);
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    gr_sync_stats_t mid = stats();
    assert_int_equal(mid.frees_deferred - before.frees_deferred, 2);
    /* Nothing else runs on the device: the idle reclaim frees both, in a bounded number of
     * tries (the events of a finished stream are done at once; the loop only rides out the
     * driver's bookkeeping). */
    uint64_t pending = 1;
    for (int i = 0; i < 1000 && pending != 0; i++) {
        assert_int_equal(gr_device_reclaim("cuda:0", 0, &pending), GR_OK);
        if (pending != 0)
            usleep(1000);
    }
    assert_int_equal(pending, 0);
    gr_sync_stats_t after = stats();
    assert_int_equal(after.device_waits, before.device_waits);
    assert_true(after.stream_waits > before.stream_waits);
    assert_int_equal(after.frees_pending, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cpu_paths_make_no_device_wait),
        cmocka_unit_test(test_bad_arguments),
        cmocka_unit_test(test_cuda_paths_make_no_device_wait),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
