/*
 * Unit tests for graph_runtime (runtime.h): module loading and the registry, capture with
 * make_graphed_callables semantics, replay over caller-owned static blocks, and the error cases.
 *
 * The models and the reference values are made at group setup by tests/models/make_models.py
 * (Debian's python3-torch; GRAPHD_PYTHON overrides /usr/bin/python3, GRAPHD_SRC the source root,
 * default the current directory) into a fresh temporary directory, removed at teardown.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime.h"

#define STEPS 50
#define LR 0.05f
#define REL_TOL 1e-5

typedef struct ref_entry {
    char *key;
    size_t n;
    double *v;
} ref_entry_t;

static struct {
    char dir[64];
    ref_entry_t *refs;
    size_t n_refs;
} G;

/* One captured graph with its static block and layout. */
typedef struct tgraph {
    gr_graph_t *g;
    uint8_t *block;
    gr_tensor_desc_t *layout;
    size_t count;
    uint64_t total;
} tgraph_t;

/* ---- helpers ---------------------------------------------------------------------------- */

static int run_make_models(const char *dir)
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

static void *read_file(const char *name, size_t *len)
{
    char path[256];
    snprintf(path, sizeof path, "%s/%s", G.dir, name);
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return NULL;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    void *buf = malloc(n > 0 ? (size_t)n : 1);
    if (buf && fread(buf, 1, (size_t)n, f) != (size_t)n) {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    *len = (size_t)n;
    return buf;
}

/* ref.txt: "<key> <count> <values...>" per line. */
static int load_refs(void)
{
    size_t len = 0;
    char *text = read_file("ref.txt", &len);
    if (text == NULL)
        return -1;
    char *grown = realloc(text, len + 1);
    if (grown == NULL) {
        free(text);
        return -1;
    }
    text = grown;
    text[len] = '\0';
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char *p = line, *end;
        char *key = strsep(&p, " ");
        size_t n = strtoul(p, &end, 10);
        ref_entry_t e = {strdup(key), n, calloc(n ? n : 1, sizeof(double))};
        for (size_t i = 0; i < n; i++)
            e.v[i] = strtod(end, &end);
        G.refs = realloc(G.refs, (G.n_refs + 1) * sizeof *G.refs);
        G.refs[G.n_refs++] = e;
    }
    free(text);
    return 0;
}

static const double *ref(const char *key, size_t expect_n)
{
    for (size_t i = 0; i < G.n_refs; i++)
        if (strcmp(G.refs[i].key, key) == 0) {
            if (expect_n)
                assert_int_equal(G.refs[i].n, expect_n);
            return G.refs[i].v;
        }
    fail_msg("no reference '%s'", key);
    return NULL;
}

static gr_module_t *load_model(const char *name)
{
    size_t len = 0;
    void *bytes = read_file(name, &len);
    assert_non_null(bytes);
    gr_module_t *m = NULL;
    int rc = gr_module_load(bytes, len, &m);
    if (rc != GR_OK)
        fail_msg("load %s: %s: %s", name, gr_err_name(rc), gr_last_error());
    free(bytes);
    return m;
}

static gr_arg_spec_t f32_arg(uint32_t ndim, const int64_t *shape, int requires_grad)
{
    gr_arg_spec_t a;
    memset(&a, 0, sizeof a);
    a.dtype = GR_DTYPE_F32;
    a.ndim = ndim;
    memcpy(a.shape, shape, ndim * sizeof *shape);
    a.requires_grad = requires_grad;
    return a;
}

/* Prepares and finishes a capture of n callables on device into fresh 64-byte aligned blocks. */
static int capture_on(const char *device, size_t n, const gr_callable_spec_t *specs,
                      const gr_capture_opts_t *opts, tgraph_t *out)
{
    gr_capture_t *c = NULL;
    int rc = gr_capture_prepare(device, n, specs, opts, &c);
    if (rc != GR_OK)
        return rc;
    void *bases[8];
    gr_graph_t *graphs[8];
    assert_true(n <= 8);
    for (size_t i = 0; i < n; i++) {
        memset(&out[i], 0, sizeof out[i]);
        assert_int_equal(gr_capture_layout(c, i, &out[i].count, NULL, &out[i].total), GR_OK);
        assert_int_equal(out[i].total % GR_ALIGN, 0);
        out[i].block = aligned_alloc(GR_ALIGN, out[i].total ? out[i].total : GR_ALIGN);
        memset(out[i].block, 0xa5, out[i].total); /* finish must zero it */
        bases[i] = out[i].block;
    }
    rc = gr_capture_finish(c, bases, graphs);
    if (rc != GR_OK) {
        for (size_t i = 0; i < n; i++)
            free(out[i].block);
        return rc;
    }
    for (size_t i = 0; i < n; i++) {
        out[i].g = graphs[i];
        size_t count = 0;
        assert_int_equal(gr_graph_layout(graphs[i], &count, NULL, NULL), GR_OK);
        assert_int_equal(count, out[i].count);
        out[i].layout = calloc(count, sizeof *out[i].layout);
        assert_int_equal(gr_graph_layout(graphs[i], &count, out[i].layout, NULL), GR_OK);
        assert_int_equal(count, out[i].count);
    }
    return GR_OK;
}

/* capture_on that must succeed: a failure fails the test with the runtime's message. */
static void capture_ok(const char *device, size_t n, const gr_callable_spec_t *specs,
                       const gr_capture_opts_t *opts, tgraph_t *out)
{
    int rc = capture_on(device, n, specs, opts, out);
    if (rc != GR_OK)
        fail_msg("capture on %s: %s: %s", device, gr_err_name(rc), gr_last_error());
}

static int capture(size_t n, const gr_callable_spec_t *specs, const gr_capture_opts_t *opts,
                   tgraph_t *out)
{
    return capture_on("cpu:0", n, specs, opts, out);
}

static void release(tgraph_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        assert_int_equal(gr_graph_destroy(t[i].g), GR_OK);
        free(t[i].block);
        free(t[i].layout);
    }
}

static const gr_tensor_desc_t *find(const tgraph_t *t, int role, uint32_t index)
{
    for (size_t k = 0; k < t->count; k++)
        if (t->layout[k].role == role && t->layout[k].index == index)
            return &t->layout[k];
    return NULL;
}

static size_t count_role(const tgraph_t *t, int role)
{
    size_t n = 0;
    for (size_t k = 0; k < t->count; k++)
        n += t->layout[k].role == role;
    return n;
}

/* The static tensor at offset of t's block. */
static void *at(const tgraph_t *t, uint64_t offset)
{
    return t->block + offset;
}

static float *f32(const tgraph_t *t, int role, uint32_t index)
{
    const gr_tensor_desc_t *d = find(t, role, index);
    if (d == NULL)
        fail_msg("no %s %u", gr_role_name(role), index);
    assert_int_equal(d->dtype, GR_DTYPE_F32);
    return at(t, d->offset);
}

static size_t numel(const gr_tensor_desc_t *d)
{
    size_t n = 1;
    for (uint32_t k = 0; k < d->ndim; k++)
        n *= (size_t)d->shape[k];
    return n;
}

static void put(const tgraph_t *t, int role, uint32_t index, const double *v)
{
    float *p = f32(t, role, index);
    size_t n = numel(find(t, role, index));
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

static void replay_ok(gr_graph_t *g, int phase)
{
    int rc = gr_graph_replay(g, phase, NULL, NULL);
    if (rc != GR_OK)
        fail_msg("replay phase %d: %s: %s", phase, gr_err_name(rc), gr_last_error());
}

/* MSE of the OUTPUT against y; writes d loss / d output into GRAD_OUTPUT. */
static double mse_step(const tgraph_t *t, const double *y)
{
    const gr_tensor_desc_t *od = find(t, GR_ROLE_OUTPUT, 0);
    const float *out = f32(t, GR_ROLE_OUTPUT, 0);
    float *gout = f32(t, GR_ROLE_GRAD_OUTPUT, 0);
    size_t n = numel(od);
    double loss = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)out[i] - y[i];
        loss += d * d;
        gout[i] = (float)(2.0 / (double)n * d);
    }
    return loss / (double)n;
}

static void sgd(const tgraph_t *t)
{
    for (size_t k = 0; k < t->count; k++) {
        const gr_tensor_desc_t *g = &t->layout[k];
        if (g->role != GR_ROLE_PARAM_GRAD)
            continue;
        float *p = f32(t, GR_ROLE_PARAM, g->index);
        const float *gp = at(t, g->offset);
        for (size_t i = 0; i < numel(g); i++)
            p[i] -= LR * gp[i];
    }
}

static void assert_rel(double got, double want, const char *what, int step)
{
    double rel = fabs(got - want) / fmax(fabs(want), 1e-12);
    if (rel > REL_TOL)
        fail_msg("%s step %d: loss %.9g, reference %.9g (rel %.3g)", what, step, got, want, rel);
}

static void assert_error(int rc, int want, const char *needle)
{
    if (rc != want)
        fail_msg("got %s (%s), want %s", gr_err_name(rc), gr_last_error(), gr_err_name(want));
    if (needle && strstr(gr_last_error(), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", gr_last_error(), needle);
}

/* ---- group setup ------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    snprintf(G.dir, sizeof G.dir, "/tmp/graphd-models-XXXXXX");
    if (mkdtemp(G.dir) == NULL)
        return -1;
    if (run_make_models(G.dir) != 0) {
        fprintf(stderr, "make_models.py failed (GRAPHD_PYTHON, GRAPHD_SRC)\n");
        return -1;
    }
    return load_refs();
}

static int group_teardown(void **state)
{
    (void)state;
    DIR *dir = opendir(G.dir);
    if (dir) {
        struct dirent *e;
        char path[512];
        while ((e = readdir(dir)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            snprintf(path, sizeof path, "%s/%s", G.dir, e->d_name);
            unlink(path);
        }
        closedir(dir);
        rmdir(G.dir);
    }
    for (size_t i = 0; i < G.n_refs; i++) {
        free(G.refs[i].key);
        free(G.refs[i].v);
    }
    free(G.refs);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

static void test_sha256_known_vectors(void **state)
{
    (void)state;
    static const uint8_t abc[32] = {0xba, 0x78, 0x16, 0xbf, 0x8f, 0x01, 0xcf, 0xea,
                                    0x41, 0x41, 0x40, 0xde, 0x5d, 0xae, 0x22, 0x23,
                                    0xb0, 0x03, 0x61, 0xa3, 0x96, 0x17, 0x7a, 0x9c,
                                    0xb4, 0x10, 0xff, 0x61, 0xf2, 0x00, 0x15, 0xad};
    static const uint8_t empty[32] = {0xe3, 0xb0, 0xc4, 0x42, 0x98, 0xfc, 0x1c, 0x14,
                                      0x9a, 0xfb, 0xf4, 0xc8, 0x99, 0x6f, 0xb9, 0x24,
                                      0x27, 0xae, 0x41, 0xe4, 0x64, 0x9b, 0x93, 0x4c,
                                      0xa4, 0x95, 0x99, 0x1b, 0x78, 0x52, 0xb8, 0x55};
    uint8_t out[32];
    assert_int_equal(gr_sha256("abc", 3, out), GR_OK);
    assert_memory_equal(out, abc, 32);
    assert_int_equal(gr_sha256(NULL, 0, out), GR_OK);
    assert_memory_equal(out, empty, 32);
    assert_error(gr_sha256(NULL, 3, out), GR_EINVAL, NULL);
}

static void test_tables(void **state)
{
    (void)state;
    assert_string_equal(gr_err_name(GR_EPRECOND), "GR_EPRECOND");
    assert_string_equal(gr_strerror(GR_OK), "success");
    assert_string_equal(gr_err_name(-999), "GR_UNKNOWN");
    assert_int_equal(gr_dtype_size(GR_DTYPE_BF16), 2);
    assert_int_equal(gr_dtype_size(GR_DTYPE_I64), 8);
    assert_int_equal(gr_dtype_size(0), 0);
    assert_string_equal(gr_dtype_name(GR_DTYPE_BOOL), "bool");
    assert_null(gr_dtype_name(77));
    assert_int_equal(gr_dtype_from_name("float16"), GR_DTYPE_F16);
    assert_int_equal(gr_dtype_from_name("complex64"), GR_DTYPE_INVALID);
    assert_string_equal(gr_role_name(GR_ROLE_PARAM_GRAD), "param_grad");
    assert_string_equal(gr_role_name(GR_ROLE_BUFFER), "buffer");
    assert_int_equal(GR_ROLE_BUFFER, 6);
    assert_int_equal(GR_ROLE_COUNT, 8);
    assert_null(gr_role_name(GR_ROLE_COUNT));
    assert_int_equal(gr_runtime_init(0), GR_OK);
    assert_error(gr_runtime_init(-2), GR_EINVAL, NULL);
    assert_non_null(gr_runtime_torch_version());
}

static void test_bad_archive(void **state)
{
    (void)state;
    gr_module_t *m = (gr_module_t *)1;
    const char garbage[] = "this is not a zip archive at all";
    assert_error(gr_module_load(garbage, sizeof garbage, &m), GR_EINVAL, "TorchScript archive");
    assert_null(m);
    assert_non_null(strstr(gr_last_error(), "not a ZIP archive"));

    size_t len = 0;
    uint8_t *bytes = read_file("mlp.pt", &len);
    assert_error(gr_module_load(bytes, len / 2, &m), GR_EINVAL, "truncated");
    free(bytes);
    /* A well-formed ZIP that is not a TorchScript archive. */
    bytes = read_file("notmodel.pt", &len);
    assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, "no version record");
    free(bytes);
    /* A TorchScript archive whose code is damaged: libtorch's own error, on one line. */
    bytes = read_file("badcode.pt", &len);
    assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, "not a loadable TorchScript archive: ");
    assert_true(strlen(gr_last_error()) < 500);
    assert_null(strchr(gr_last_error(), '\n'));
    assert_null(strstr(gr_last_error(), "Could this error message be improved"));
    free(bytes);
    /* Crafted tensor views: refused at load, before anything reads them. */
    bytes = read_file("badview.pt", &len);
    assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, "tensor 'b' has a view of 65536 bytes");
    assert_non_null(strstr(gr_last_error(), "over a storage of 16"));
    free(bytes);
    bytes = read_file("negview.pt", &len);
    assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, "a negative storage offset");
    free(bytes);
    /* A zip bomb: 8 MiB of zeros deflated to kilobytes, over a bound of 4 MiB. */
    bytes = read_file("bomb.pt", &len);
    assert_true(len < (1 << 20));
    assert_int_equal(gr_module_max_unpacked(4 << 20), GR_OK);
    assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, "would unpack to ");
    assert_non_null(strstr(gr_last_error(), "over the daemon's bound of 4194304"));
    assert_int_equal(gr_module_max_unpacked(UINT64_C(4) << 30), GR_OK); /* the default */
    assert_int_equal(gr_module_load(bytes, len, &m), GR_OK);
    assert_int_equal(gr_module_release(m), GR_OK);
    free(bytes);
    /* Code that reaches outside its tensors: refused from the archive's source, before
     * torch::jit::load runs any of it (setstate.pt would map /etc/passwd while loading). */
    static const struct {
        const char *file, *why;
    } reaching[] = {
        {"fromfile.pt", "names 'from_file'"},
        {"setstate.pt", "names 'from_file'"},
        {"alias.pt", "names '_reshape_alias'"},
        {"foreign.pt", "calls profiler::_record_function_enter (only aten, prim and quantized"},
        {"foreign_split.pt", "calls profiler::_record_function_enter"},
    };
    for (size_t i = 0; i < sizeof reaching / sizeof reaching[0]; i++) {
        bytes = read_file(reaching[i].file, &len);
        assert_error(gr_module_load(bytes, len, &m), GR_EINVAL, reaching[i].why);
        assert_non_null(strstr(gr_last_error(), "module refused: its code (code/__torch__.py)"));
        free(bytes);
    }
    bytes = read_file("view.pt", &len); /* the archive they were made from loads */
    assert_int_equal(gr_module_load(bytes, len, &m), GR_OK);
    assert_int_equal(gr_module_release(m), GR_OK);
    free(bytes);
    assert_error(gr_module_load(NULL, 0, &m), GR_EINVAL, NULL);
    assert_int_equal(gr_module_loaded_count(), 0);
}

static void test_same_bytes_same_module(void **state)
{
    (void)state;
    size_t len = 0;
    void *bytes = read_file("mlp.pt", &len);
    size_t before = gr_module_loaded_count();
    gr_module_t *a = NULL, *b = NULL;
    assert_int_equal(gr_module_load(bytes, len, &a), GR_OK);
    assert_int_equal(gr_module_load(bytes, len, &b), GR_OK);
    assert_ptr_equal(a, b);
    assert_int_equal(gr_module_loaded_count(), before + 1);

    gr_module_info_t info;
    assert_int_equal(gr_module_info(a, &info), GR_OK);
    assert_int_equal(info.refcount, 2);
    assert_int_equal(info.n_parameters, 6);
    assert_int_equal(info.n_trainable, 6);
    assert_int_equal(info.n_buffers, 0);
    assert_int_equal(info.is_training, 1);
    assert_int_equal(info.archive_bytes, len);
    assert_int_equal(info.parameter_bytes, (16 * 32 + 32 + 32 * 32 + 32 + 32 * 8 + 8) * 4);
    uint8_t sha[32], want[32];
    assert_int_equal(gr_module_sha256(a, sha), GR_OK);
    gr_sha256(bytes, len, want);
    assert_memory_equal(sha, want, 32);
    assert_int_equal(memcmp(info.sha256, want, 32), 0);
    assert_int_equal(gr_module_has_method(a, "forward"), 1);
    assert_int_equal(gr_module_has_method(a, "backward_not_here"), 0);

    assert_int_equal(gr_module_release(a), GR_OK);
    assert_int_equal(gr_module_loaded_count(), before + 1);
    assert_int_equal(gr_module_release(b), GR_OK);
    assert_int_equal(gr_module_loaded_count(), before);
    free(bytes);
}

/* A keyed load shares only within its key: another tenant's load of the same bytes is a module of
 * its own, whose refcount tells nothing of the first. */
static void test_keyed_modules_do_not_share(void **state)
{
    (void)state;
    size_t len = 0;
    void *bytes = read_file("mlp.pt", &len);
    size_t before = gr_module_loaded_count();
    gr_module_t *a = NULL, *a2 = NULL, *b = NULL, *plain = NULL;
    assert_int_equal(gr_module_load_keyed(bytes, len, 1001, &a), GR_OK);
    assert_int_equal(gr_module_load_keyed(bytes, len, 1002, &b), GR_OK);
    assert_int_equal(gr_module_load(bytes, len, &plain), GR_OK); /* key 0 */
    assert_ptr_not_equal(a, b);
    assert_ptr_not_equal(a, plain);
    gr_module_info_t info;
    assert_int_equal(gr_module_info(b, &info), GR_OK);
    assert_int_equal(info.refcount, 1);
    assert_int_equal(gr_module_load_keyed(bytes, len, 1001, &a2), GR_OK);
    assert_ptr_equal(a, a2);
    assert_int_equal(gr_module_info(a2, &info), GR_OK);
    assert_int_equal(info.refcount, 2);
    assert_int_equal(gr_module_loaded_count(), before + 3);
    assert_int_equal(gr_module_release(a), GR_OK);
    assert_int_equal(gr_module_release(a2), GR_OK);
    assert_int_equal(gr_module_release(b), GR_OK);
    assert_int_equal(gr_module_release(plain), GR_OK);
    assert_int_equal(gr_module_loaded_count(), before);
    free(bytes);
}

/* A graph whose static tensors are all in its block: no GR_TENSOR_EXTERNAL, nothing in
 * gr_graph_external. */
static void assert_no_external(const tgraph_t *t)
{
    for (size_t k = 0; k < t->count; k++)
        assert_int_equal(t->layout[k].flags & GR_TENSOR_EXTERNAL, 0);
    size_t n = 7;
    assert_int_equal(gr_graph_external(t->g, &n, NULL), GR_OK);
    assert_int_equal(n, 0);
    gr_external_t e;
    n = 1;
    assert_int_equal(gr_graph_external(t->g, &n, &e), GR_OK);
    assert_int_equal(n, 0);
    assert_error(gr_graph_external(NULL, &n, NULL), GR_EINVAL, NULL);
    assert_error(gr_graph_external(t->g, NULL, NULL), GR_EINVAL, NULL);
}

static void test_mlp_training_parity(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    assert_int_equal(opts.copy_param_grads, 1);
    opts.copy_param_grads = 0; /* for device-resident captures only: ignored here */
    tgraph_t t;
    assert_int_equal(capture(1, &spec, &opts, &t), GR_OK);
    assert_no_external(&t);

    assert_int_equal(count_role(&t, GR_ROLE_INPUT), 1);
    assert_int_equal(count_role(&t, GR_ROLE_OUTPUT), 1);
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_OUTPUT), 1);
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_INPUT), 0); /* the input needs no grad */
    assert_int_equal(count_role(&t, GR_ROLE_PARAM), 6);
    assert_int_equal(count_role(&t, GR_ROLE_PARAM_GRAD), 6);
    const gr_tensor_desc_t *w0 = find(&t, GR_ROLE_PARAM, 0);
    assert_string_equal(w0->name, "0.weight");
    assert_int_equal(w0->ndim, 2);
    assert_int_equal(w0->shape[0], 32);
    assert_int_equal(w0->shape[1], 16);
    assert_int_equal(w0->strides[0], 16);
    assert_int_equal(w0->strides[1], 1);
    assert_true(w0->flags & GR_TENSOR_REQUIRES_GRAD);
    assert_string_equal(find(&t, GR_ROLE_PARAM_GRAD, 5)->name, "4.bias");
    const gr_tensor_desc_t *od = find(&t, GR_ROLE_OUTPUT, 0);
    assert_int_equal(od->shape[0], 16);
    assert_int_equal(od->shape[1], 8);
    assert_true(od->flags & GR_TENSOR_REQUIRES_GRAD);
    for (size_t k = 0; k < t.count; k++) {
        assert_int_equal(t.layout[k].offset % GR_ALIGN, 0);
        assert_true(t.layout[k].offset + t.layout[k].nbytes <= t.total);
        if (k > 0)
            assert_true(t.layout[k].offset >= t.layout[k - 1].offset + t.layout[k - 1].nbytes);
    }
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_string_equal(info.device, "cpu:0");
    assert_int_equal(info.is_training, 1);
    assert_int_equal(info.has_backward, 1);
    assert_int_equal(info.counts[GR_ROLE_PARAM], 6);
    assert_int_equal(info.total_bytes, t.total);

    const double *x = ref("mlp.x", 256), *y = ref("mlp.y", 128);
    const double *losses = ref("mlp.losses", STEPS);
    for (int step = 0; step < STEPS; step++) {
        put(&t, GR_ROLE_INPUT, 0, x);
        uint64_t ns = 0;
        assert_int_equal(gr_graph_replay(t.g, GR_PHASE_FORWARD, NULL, &ns), GR_OK);
        assert_true(ns > 0);
        double loss = mse_step(&t, y);
        replay_ok(t.g, GR_PHASE_BACKWARD);
        sgd(&t);
        assert_rel(loss, losses[step], "mlp", step);
    }
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.forward_replays, STEPS);
    assert_int_equal(info.backward_replays, STEPS);
    assert_int_equal(info.failed_replays, 0);
    release(&t, 1);
    gr_module_release(m);
}

static void test_two_callables_parity(void **state)
{
    (void)state;
    gr_module_t *ma = load_model("two_a.pt"), *mb = load_model("two_b.pt");
    const int64_t xa[2] = {16, 16}, xb[2] = {16, 12};
    gr_arg_spec_t arg_a = f32_arg(2, xa, 0), arg_b = f32_arg(2, xb, 1);
    gr_callable_spec_t specs[2] = {{ma, "forward", 1, &arg_a}, {mb, NULL, 1, &arg_b}};
    gr_pool_t *pool = NULL;
    assert_int_equal(gr_pool_create("cpu", &pool), GR_OK);
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.pool = pool;
    tgraph_t t[2];
    assert_int_equal(capture(2, specs, &opts, t), GR_OK);
    assert_error(gr_pool_destroy(pool), GR_EBUSY, NULL);
    /* A CPU pool holds no memory of its own: its static tensors are the caller's blocks. */
    uint64_t reserved = 1, in_use = 1;
    assert_int_equal(gr_pool_memory(pool, &reserved, &in_use), GR_OK);
    assert_int_equal(reserved, 0);
    assert_int_equal(in_use, 0);
    assert_error(gr_pool_memory(NULL, &reserved, &in_use), GR_EINVAL, NULL);
    assert_error(gr_pool_memory(pool, NULL, &in_use), GR_EINVAL, NULL);
    assert_int_equal(count_role(&t[0], GR_ROLE_GRAD_INPUT), 0);
    assert_int_equal(count_role(&t[1], GR_ROLE_GRAD_INPUT), 1);

    const double *x = ref("two.x", 256), *y = ref("two.y", 128);
    const double *losses = ref("two.losses", STEPS);
    size_t n_mid = numel(find(&t[0], GR_ROLE_OUTPUT, 0));
    assert_int_equal(n_mid, 16 * 12);
    for (int step = 0; step < STEPS; step++) {
        put(&t[0], GR_ROLE_INPUT, 0, x);
        replay_ok(t[0].g, GR_PHASE_FORWARD);
        memcpy(f32(&t[1], GR_ROLE_INPUT, 0), f32(&t[0], GR_ROLE_OUTPUT, 0), n_mid * 4);
        replay_ok(t[1].g, GR_PHASE_FORWARD);
        double loss = mse_step(&t[1], y);
        replay_ok(t[1].g, GR_PHASE_BACKWARD);
        memcpy(f32(&t[0], GR_ROLE_GRAD_OUTPUT, 0), f32(&t[1], GR_ROLE_GRAD_INPUT, 0), n_mid * 4);
        replay_ok(t[0].g, GR_PHASE_BACKWARD);
        sgd(&t[0]);
        sgd(&t[1]);
        assert_rel(loss, losses[step], "two", step);
    }
    release(t, 2);
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    gr_module_release(ma);
    gr_module_release(mb);
}

static void test_unused_input_rejected(void **state)
{
    (void)state;
    gr_module_t *m = load_model("unused.pt");
    const int64_t s[2] = {2, 4};
    gr_arg_spec_t args[2] = {f32_arg(2, s, 1), f32_arg(2, s, 1)};
    gr_callable_spec_t spec = {m, NULL, 2, args};
    gr_capture_t *c = (gr_capture_t *)1;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, NULL, &c), GR_EINVAL,
                 "appears to not have been used in the graph");
    assert_null(c);
    /* Without warm-up the probe still catches it. */
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.num_warmup_iters = 0;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, &opts, &c), GR_EINVAL, "allow_unused=True");
    gr_module_release(m);
}

/* Reused warm-ups (runtime.h, gr_capture_prepare): a second capture of the same archive, loaded
 * under the same scope, with the same specs skips its warm-up and computes what the warmed-up
 * one does; reuse_warmup 0, another scope (another tenant) and other specs warm up. */
static void test_warmup_reused(void **state)
{
    (void)state;
    size_t len = 0;
    void *bytes = read_file("mlp.pt", &len);
    assert_non_null(bytes);
    gr_module_t *a = NULL, *b = NULL;
    assert_int_equal(gr_module_load_keyed(bytes, len, 4301, &a), GR_OK);
    assert_int_equal(gr_module_load_keyed(bytes, len, 4302, &b), GR_OK);
    free(bytes);
    const int64_t s5[2] = {5, 16}, s6[2] = {6, 16}; /* batches no other test captures */
    gr_arg_spec_t a5 = f32_arg(2, s5, 0), a6 = f32_arg(2, s6, 0);
    gr_callable_spec_t specs[] = {{a, NULL, 1, &a5},
                                  {a, NULL, 1, &a5},
                                  {a, NULL, 1, &a5},
                                  {b, NULL, 1, &a5},
                                  {a, NULL, 1, &a6}};
    gr_capture_opts_t on, off;
    gr_capture_opts_init(&on);
    gr_capture_opts_init(&off);
    off.reuse_warmup = 0;
    const gr_capture_opts_t *opts[] = {&on, &on, &off, &on, &on};
    const int want[] = {0, 1, 0, 0, 0};
    tgraph_t t[5];
    for (int k = 0; k < 5; k++) {
        capture_ok("cpu:0", 1, &specs[k], opts[k], &t[k]);
        gr_graph_info_t info;
        assert_int_equal(gr_graph_info(t[k].g, &info), GR_OK);
        if (info.warmup_reused != want[k])
            fail_msg("capture %d: warmup_reused %d, want %d", k, info.warmup_reused, want[k]);
    }
    /* The reused capture's forward and backward give the warmed-up one's bytes. */
    for (int k = 0; k < 2; k++) {
        float *x = f32(&t[k], GR_ROLE_INPUT, 0), *gout = f32(&t[k], GR_ROLE_GRAD_OUTPUT, 0);
        for (int i = 0; i < 5 * 16; i++)
            x[i] = (float)((i * 7) % 13) * 0.125f - 0.75f;
        for (int i = 0; i < 5 * 8; i++)
            gout[i] = (float)(i % 5) * 0.5f - 1.0f;
        replay_ok(t[k].g, GR_PHASE_FORWARD);
        replay_ok(t[k].g, GR_PHASE_BACKWARD);
    }
    assert_int_equal(t[0].count, t[1].count);
    for (size_t k = 0; k < t[0].count; k++) {
        const gr_tensor_desc_t *d0 = &t[0].layout[k], *d1 = &t[1].layout[k];
        assert_int_equal(d0->role, d1->role);
        assert_int_equal(d0->nbytes, d1->nbytes);
        if (memcmp(at(&t[0], d0->offset), at(&t[1], d1->offset), d0->nbytes) != 0)
            fail_msg("%s %u differs between the warmed-up and the reused capture",
                     gr_role_name(d0->role), d0->index);
    }
    release(t, 5);
    gr_module_release(a);
    gr_module_release(b);
}

static void test_unused_input_allowed(void **state)
{
    (void)state;
    gr_module_t *m = load_model("unused.pt");
    const int64_t s[2] = {2, 4};
    gr_arg_spec_t args[2] = {f32_arg(2, s, 1), f32_arg(2, s, 1)};
    gr_callable_spec_t spec = {m, NULL, 2, args};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.allow_unused_input = 1;
    tgraph_t t;
    assert_int_equal(capture(1, &spec, &opts, &t), GR_OK);
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_INPUT), 2);
    assert_false(find(&t, GR_ROLE_GRAD_INPUT, 0)->flags & GR_TENSOR_ABSENT);
    assert_true(find(&t, GR_ROLE_GRAD_INPUT, 1)->flags & GR_TENSOR_ABSENT);

    float *x = f32(&t, GR_ROLE_INPUT, 0), *gx = f32(&t, GR_ROLE_GRAD_INPUT, 0);
    float *gy = f32(&t, GR_ROLE_GRAD_INPUT, 1), *gout = f32(&t, GR_ROLE_GRAD_OUTPUT, 0);
    const float *w = f32(&t, GR_ROLE_PARAM, 0); /* lin.weight [3, 4] */
    for (int i = 0; i < 8; i++) {
        x[i] = (float)i * 0.25f;
        gy[i] = 7.0f;
    }
    replay_ok(t.g, GR_PHASE_FORWARD);
    for (int i = 0; i < 6; i++)
        gout[i] = 1.0f;
    replay_ok(t.g, GR_PHASE_BACKWARD);
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 4; k++) {
            float want = w[0 * 4 + k] + w[1 * 4 + k] + w[2 * 4 + k];
            assert_float_equal(gx[r * 4 + k], want, 1e-5);
            assert_float_equal(gy[r * 4 + k], 0.0f, 0.0f); /* absent: zero-filled */
        }
    release(&t, 1);
    gr_module_release(m);
}

static void test_eval_mode(void **state)
{
    (void)state;
    gr_module_t *m = load_model("eval.pt");
    gr_module_info_t mi;
    assert_int_equal(gr_module_info(m, &mi), GR_OK);
    assert_int_equal(mi.is_training, 0);
    assert_int_equal(mi.n_trainable, 0);
    assert_int_equal(mi.n_buffers, 3);
    const int64_t s[2] = {4, 6};
    gr_arg_spec_t arg = f32_arg(2, s, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    assert_int_equal(capture(1, &spec, NULL, &t), GR_OK);
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.is_training, 0);
    assert_int_equal(info.has_backward, 0);
    assert_int_equal(info.counts[GR_ROLE_GRAD_OUTPUT], 0);
    assert_int_equal(info.counts[GR_ROLE_PARAM_GRAD], 0);
    assert_int_equal(info.counts[GR_ROLE_PARAM], 6);
    assert_false(find(&t, GR_ROLE_OUTPUT, 0)->flags & GR_TENSOR_REQUIRES_GRAD);

    for (int rep = 0; rep < 2; rep++) { /* dropout off, running stats fixed */
        put(&t, GR_ROLE_INPUT, 0, ref("eval.x", 24));
        replay_ok(t.g, GR_PHASE_FORWARD);
        assert_close(f32(&t, GR_ROLE_OUTPUT, 0), ref("eval.out", 12), 12, 1e-5, "eval.out");
    }
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, "no backward");
    replay_ok(t.g, GR_PHASE_FORWARD);
    release(&t, 1);
    gr_module_release(m);
}

static void test_batchnorm_buffers(void **state)
{
    (void)state;
    gr_module_t *m = load_model("bn.pt");
    const int64_t s[2] = {6, 5};
    float x0[30];
    const double *rx0 = ref("bn.x0", 30);
    for (int i = 0; i < 30; i++)
        x0[i] = (float)rx0[i];
    gr_arg_spec_t arg = f32_arg(2, s, 1);
    arg.data = x0; /* warm-up updates the running stats with these values, as upstream */
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    assert_int_equal(capture(1, &spec, NULL, &t), GR_OK);
    assert_int_equal(count_role(&t, GR_ROLE_OUTPUT), 3);
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_OUTPUT), 1);
    assert_true(find(&t, GR_ROLE_OUTPUT, 0)->flags & GR_TENSOR_REQUIRES_GRAD);
    assert_false(find(&t, GR_ROLE_OUTPUT, 1)->flags & GR_TENSOR_REQUIRES_GRAD);
    assert_string_equal(find(&t, GR_ROLE_OUTPUT, 2)->name, "2");
    /* The INPUT holds the sample values after capture, as upstream's static inputs do. */
    assert_close(f32(&t, GR_ROLE_INPUT, 0), rx0, 30, 0, "bn.input");

    const char *steps[2][4] = {{"bn.x1", "bn.y1", "bn.rm1", "bn.rv1"},
                               {"bn.x2", "bn.y2", "bn.rm2", "bn.rv2"}};
    for (int k = 0; k < 2; k++) {
        put(&t, GR_ROLE_INPUT, 0, ref(steps[k][0], 30));
        replay_ok(t.g, GR_PHASE_FORWARD);
        assert_close(f32(&t, GR_ROLE_OUTPUT, 0), ref(steps[k][1], 12), 12, 1e-5, steps[k][1]);
        assert_close(f32(&t, GR_ROLE_OUTPUT, 1), ref(steps[k][2], 5), 5, 1e-5, steps[k][2]);
        assert_close(f32(&t, GR_ROLE_OUTPUT, 2), ref(steps[k][3], 5), 5, 1e-5, steps[k][3]);
        replay_ok(t.g, GR_PHASE_BACKWARD);
    }
    release(&t, 1);
    gr_module_release(m);
}

/* The static tensor of role named name. */
static const gr_tensor_desc_t *find_named(const tgraph_t *t, int role, const char *name)
{
    for (size_t k = 0; k < t->count; k++)
        if (t->layout[k].role == role && strcmp(t->layout[k].name, name) == 0)
            return &t->layout[k];
    fail_msg("no %s '%s'", gr_role_name(role), name);
    return NULL;
}

/* Column j of a rows x cols matrix: mean, biased and unbiased variance. */
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

/* What one training-mode FORWARD does to BatchNorm1d's running stats (momentum 0.1). */
static void bn_update(const float *x, int rows, int cols, const float *rm, const float *rv,
                      double *want_rm, double *want_rv)
{
    for (int j = 0; j < cols; j++) {
        double mean, var, var_u;
        column_stats(x, rows, cols, j, &mean, &var, &var_u);
        want_rm[j] = 0.9 * rm[j] + 0.1 * mean;
        want_rv[j] = 0.9 * rv[j] + 0.1 * var_u;
    }
}

/*
 * BnNet in training mode: its buffers are BUFFER tensors (after the parameters and their grads)
 * that hold the running stats as warm-up left them, that every FORWARD updates in place as
 * PyTorch updates the module's own buffers (BACKWARD leaves them alone), and that the client may
 * write: the next FORWARD starts from what it wrote.
 */
static void bn_buffer_tensors_on(const char *device, double tol)
{
    gr_module_t *m = load_model("bn.pt");
    const int64_t s[2] = {6, 5};
    float x0[30];
    const double *rx0 = ref("bn.x0", 30);
    for (int i = 0; i < 30; i++)
        x0[i] = (float)rx0[i];
    gr_arg_spec_t arg = f32_arg(2, s, 1);
    arg.data = x0; /* warm-up updates the running stats with these values, as upstream */
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    capture_ok(device, 1, &spec, NULL, &t);

    assert_int_equal(count_role(&t, GR_ROLE_BUFFER), 3);
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.counts[GR_ROLE_BUFFER], 3);
    assert_int_equal(info.counts[GR_ROLE_PARAM], 4);
    const char *names[3] = {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked"};
    const int dtypes[3] = {GR_DTYPE_F32, GR_DTYPE_F32, GR_DTYPE_I64};
    for (uint32_t i = 0; i < 3; i++) {
        const gr_tensor_desc_t *d = find(&t, GR_ROLE_BUFFER, i);
        assert_non_null(d);
        assert_string_equal(d->name, names[i]);
        assert_int_equal(d->dtype, dtypes[i]);
        assert_int_equal(d->flags, 0);
        assert_int_equal(d->ndim, i < 2 ? 1 : 0);
        assert_int_equal(d->nbytes, i < 2 ? 5 * 4 : 8);
        for (size_t k = 0; k < t.count; k++) /* the buffers come last in the block */
            if (t.layout[k].role != GR_ROLE_BUFFER)
                assert_true(t.layout[k].offset < d->offset);
    }
    float *rm = f32(&t, GR_ROLE_BUFFER, 0), *rv = f32(&t, GR_ROLE_BUFFER, 1);
    int64_t *nbt = at(&t, find(&t, GR_ROLE_BUFFER, 2)->offset);

    /* After capture: as the three warm-up iterations on x0 left them from (0, 1) (capture
     * leaves no trace). */
    float warm_rm[5] = {0, 0, 0, 0, 0}, warm_rv[5] = {1, 1, 1, 1, 1};
    double want_warm_rm[5], want_warm_rv[5];
    for (int it = 0; it < 3; it++) {
        bn_update(x0, 6, 5, warm_rm, warm_rv, want_warm_rm, want_warm_rv);
        for (int j = 0; j < 5; j++) {
            warm_rm[j] = (float)want_warm_rm[j];
            warm_rv[j] = (float)want_warm_rv[j];
        }
    }
    assert_close(rm, want_warm_rm, 5, tol, "rm after capture");
    assert_close(rv, want_warm_rv, 5, tol, "rv after capture");
    assert_int_equal(*nbt, 3);

    const char *inputs[2] = {"bn.x1", "bn.x2"};
    for (int k = 0; k < 2; k++) {
        put(&t, GR_ROLE_INPUT, 0, ref(inputs[k], 30));
        double want_rm[5], want_rv[5];
        bn_update(f32(&t, GR_ROLE_INPUT, 0), 6, 5, rm, rv, want_rm, want_rv);
        replay_ok(t.g, GR_PHASE_FORWARD);
        assert_close(rm, want_rm, 5, tol, "rm");
        assert_close(rv, want_rv, 5, tol, "rv");
        assert_int_equal(*nbt, 4 + k);
        /* and as PyTorch itself moved them */
        assert_close(rm, ref(k == 0 ? "bn.rm1" : "bn.rm2", 5), 5, tol, "bn.rm");
        assert_close(rv, ref(k == 0 ? "bn.rv1" : "bn.rv2", 5), 5, tol, "bn.rv");
        float brm[5], brv[5];
        memcpy(brm, rm, sizeof brm);
        memcpy(brv, rv, sizeof brv);
        float *gout = f32(&t, GR_ROLE_GRAD_OUTPUT, 0);
        for (size_t i = 0; i < numel(find(&t, GR_ROLE_GRAD_OUTPUT, 0)); i++)
            gout[i] = 1.0f;
        replay_ok(t.g, GR_PHASE_BACKWARD);
        assert_memory_equal(brm, rm, sizeof brm); /* BACKWARD leaves the buffers alone */
        assert_memory_equal(brv, rv, sizeof brv);
        assert_int_equal(*nbt, 4 + k);
    }

    /* The client writes the buffers (as load_state_dict would): the next FORWARD reads and
     * updates what it wrote. OUTPUT 1 is the running mean after the FORWARD's update. */
    for (int j = 0; j < 5; j++) {
        rm[j] = 0.0f;
        rv[j] = 1.0f;
    }
    *nbt = 100;
    put(&t, GR_ROLE_INPUT, 0, ref("bn.x1", 30));
    double want_rm[5], want_rv[5];
    bn_update(f32(&t, GR_ROLE_INPUT, 0), 6, 5, rm, rv, want_rm, want_rv);
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_close(f32(&t, GR_ROLE_OUTPUT, 1), want_rm, 5, tol, "OUTPUT 1 after a write");
    assert_close(rm, want_rm, 5, tol, "rm after a write");
    assert_close(rv, want_rv, 5, tol, "rv after a write");
    assert_int_equal(*nbt, 101);
    release(&t, 1);
    gr_module_release(m);
}

static void test_batchnorm_buffer_tensors(void **state)
{
    (void)state;
    bn_buffer_tensors_on("cpu:0", 1e-5);
}

/*
 * EvalNet (lin1, bn, dropout, lin2) in eval mode: FORWARD reads the running stats from the
 * BUFFER tensors and leaves them alone; stats the client writes there change the output exactly
 * as they would change the module's.
 */
static void eval_buffer_writes_on(const char *device, double tol)
{
    gr_module_t *m = load_model("eval.pt");
    const int64_t s[2] = {4, 6};
    gr_arg_spec_t arg = f32_arg(2, s, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    capture_ok(device, 1, &spec, NULL, &t);
    assert_int_equal(count_role(&t, GR_ROLE_BUFFER), 3);
    const gr_tensor_desc_t *rmd = find_named(&t, GR_ROLE_BUFFER, "bn.running_mean");
    const gr_tensor_desc_t *rvd = find_named(&t, GR_ROLE_BUFFER, "bn.running_var");
    const gr_tensor_desc_t *nd = find_named(&t, GR_ROLE_BUFFER, "bn.num_batches_tracked");
    assert_int_equal(nd->dtype, GR_DTYPE_I64);
    float *rm = at(&t, rmd->offset), *rv = at(&t, rvd->offset);
    int64_t nbt = *(int64_t *)at(&t, nd->offset);

    put(&t, GR_ROLE_INPUT, 0, ref("eval.x", 24));
    const float *out = f32(&t, GR_ROLE_OUTPUT, 0);
    uint8_t saved[2][32];
    memcpy(saved[0], rm, 32);
    memcpy(saved[1], rv, 32);
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_close(out, ref("eval.out", 12), 12, tol, "eval.out");
    assert_memory_equal(saved[0], rm, 32); /* eval mode: the stats are only read */
    assert_memory_equal(saved[1], rv, 32);
    assert_int_equal(*(int64_t *)at(&t, nd->offset), nbt);

    for (int j = 0; j < 8; j++) {
        rm[j] = 0.3f - 0.1f * (float)j;
        rv[j] = 0.5f + 0.25f * (float)j;
    }
    replay_ok(t.g, GR_PHASE_FORWARD);
    /* out = lin2(relu(bn(lin1(x)))) with the stats written above; dropout is off in eval. */
    const float *w1 = at(&t, find_named(&t, GR_ROLE_PARAM, "lin1.weight")->offset);
    const float *b1 = at(&t, find_named(&t, GR_ROLE_PARAM, "lin1.bias")->offset);
    const float *gamma = at(&t, find_named(&t, GR_ROLE_PARAM, "bn.weight")->offset);
    const float *beta = at(&t, find_named(&t, GR_ROLE_PARAM, "bn.bias")->offset);
    const float *w2 = at(&t, find_named(&t, GR_ROLE_PARAM, "lin2.weight")->offset);
    const float *b2 = at(&t, find_named(&t, GR_ROLE_PARAM, "lin2.bias")->offset);
    const float *x = f32(&t, GR_ROLE_INPUT, 0);
    double want[12];
    for (int r = 0; r < 4; r++) {
        double h[8];
        for (int o = 0; o < 8; o++) {
            double acc = b1[o];
            for (int i = 0; i < 6; i++)
                acc += (double)w1[o * 6 + i] * x[r * 6 + i];
            acc = (acc - rm[o]) / sqrt((double)rv[o] + 1e-5) * gamma[o] + beta[o];
            h[o] = acc > 0 ? acc : 0;
        }
        for (int o = 0; o < 3; o++) {
            double acc = b2[o];
            for (int i = 0; i < 8; i++)
                acc += (double)w2[o * 8 + i] * h[i];
            want[r * 3 + o] = acc;
        }
    }
    assert_close(out, want, 12, tol, "eval out with written stats");
    const double *old = ref("eval.out", 12);
    int differs = 0;
    for (int i = 0; i < 12; i++)
        differs |= fabs(out[i] - old[i]) > 1e-3;
    assert_true(differs);
    release(&t, 1);
    gr_module_release(m);
}

static void test_eval_buffer_writes(void **state)
{
    (void)state;
    eval_buffer_writes_on("cpu:0", 1e-5);
}

static void test_buffer_requiring_grad_rejected(void **state)
{
    (void)state;
    gr_module_t *m = load_model("badbuf.pt");
    const int64_t s[2] = {2, 3};
    gr_arg_spec_t arg = f32_arg(2, s, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_t *c = NULL;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, NULL, &c), GR_EINVAL,
                 "All buffers must have ``requires_grad=False``");
    assert_non_null(strstr(gr_last_error(), "scale"));
    gr_module_release(m);
}

static void test_multiple_outputs(void **state)
{
    (void)state;
    gr_module_t *m = load_model("multi.pt");
    const int64_t sx[2] = {5, 4}, sy[2] = {5, 2};
    gr_arg_spec_t args[2] = {f32_arg(2, sx, 1), f32_arg(2, sy, 0)};
    gr_callable_spec_t spec = {m, NULL, 2, args};
    tgraph_t t;
    assert_int_equal(capture(1, &spec, NULL, &t), GR_OK);

    const char *names[4] = {"0", "1.b", "1.c", "2.0"};
    const int rg[4] = {1, 0, 1, 0};
    assert_int_equal(count_role(&t, GR_ROLE_OUTPUT), 4);
    for (uint32_t i = 0; i < 4; i++) {
        const gr_tensor_desc_t *d = find(&t, GR_ROLE_OUTPUT, i);
        assert_string_equal(d->name, names[i]);
        assert_int_equal((d->flags & GR_TENSOR_REQUIRES_GRAD) != 0, rg[i]);
        assert_int_equal(find(&t, GR_ROLE_GRAD_OUTPUT, i) != NULL, rg[i]);
    }
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_INPUT), 1); /* y needs no grad */
    assert_non_null(find(&t, GR_ROLE_GRAD_INPUT, 0));
    assert_int_equal(count_role(&t, GR_ROLE_PARAM_GRAD), 4);

    put(&t, GR_ROLE_INPUT, 0, ref("multi.x", 20));
    put(&t, GR_ROLE_INPUT, 1, ref("multi.y", 10));
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_close(f32(&t, GR_ROLE_OUTPUT, 0), ref("multi.a", 15), 15, 1e-5, "a");
    assert_close(f32(&t, GR_ROLE_OUTPUT, 1), ref("multi.b", 5), 5, 1e-5, "b");
    assert_close(f32(&t, GR_ROLE_OUTPUT, 2), ref("multi.c", 15), 15, 1e-5, "c");
    assert_close(f32(&t, GR_ROLE_OUTPUT, 3), ref("multi.d", 20), 20, 0, "d");
    put(&t, GR_ROLE_GRAD_OUTPUT, 0, ref("multi.ga", 15));
    put(&t, GR_ROLE_GRAD_OUTPUT, 2, ref("multi.gc", 15));
    replay_ok(t.g, GR_PHASE_BACKWARD);
    assert_close(f32(&t, GR_ROLE_GRAD_INPUT, 0), ref("multi.gx", 20), 20, 1e-5, "gx");
    for (size_t k = 0; k < t.count; k++) {
        const gr_tensor_desc_t *d = &t.layout[k];
        if (d->role != GR_ROLE_PARAM_GRAD)
            continue;
        char key[128];
        snprintf(key, sizeof key, "multi.g.%s", d->name);
        assert_close(at(&t, d->offset), ref(key, numel(d)), numel(d), 1e-5, key);
    }
    release(&t, 1);
    gr_module_release(m);
}

static void test_params_updated_in_place(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.num_warmup_iters = 0;
    tgraph_t t;
    assert_int_equal(capture(1, &spec, &opts, &t), GR_OK);
    /* The graph's own copy outlives the caller's reference. */
    size_t loaded = gr_module_loaded_count();
    assert_int_equal(gr_module_release(m), GR_OK);
    assert_int_equal(gr_module_loaded_count(), loaded - 1);

    /* Zero the last layer's weight and set its bias: the output must be the bias everywhere. */
    const gr_tensor_desc_t *w = find(&t, GR_ROLE_PARAM, 4), *b = find(&t, GR_ROLE_PARAM, 5);
    assert_string_equal(w->name, "4.weight");
    memset(t.block + w->offset, 0, w->nbytes);
    float *bias = f32(&t, GR_ROLE_PARAM, 5);
    for (int j = 0; j < 8; j++)
        bias[j] = (float)j + 0.5f;
    replay_ok(t.g, GR_PHASE_FORWARD);
    const float *out = f32(&t, GR_ROLE_OUTPUT, 0);
    for (int r = 0; r < 16; r++)
        for (int j = 0; j < 8; j++)
            assert_float_equal(out[r * 8 + j], (float)j + 0.5f, 0);
    assert_int_equal(b->nbytes, 8 * 4);
    release(&t, 1);
}

/* A module whose parameters and buffer the archive holds as one value expanded to a shape (the
 * Python client's archives): the module reports their full size, and a capture gets them written
 * out in full on its device, a tied weight still one parameter. */
static void expanded_params_on(const char *device, double tol)
{
    gr_module_t *m = load_model("expanded.pt");
    gr_module_info_t info;
    assert_int_equal(gr_module_info(m, &info), GR_OK);
    assert_int_equal(info.n_parameters, 3);
    assert_int_equal(info.n_buffers, 1);
    assert_int_equal(info.parameter_bytes, (8 * 8 + 8 + 8) * 4);
    const int64_t xs[2] = {4, 8};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    capture_ok(device, 1, &spec, NULL, &t);
    assert_int_equal(count_role(&t, GR_ROLE_PARAM), 3);
    const struct {
        const char *name;
        int role;
        size_t n;
        float value;
    } want[] = {{"l1.weight", GR_ROLE_PARAM, 64, 0.25f},
                {"l1.bias", GR_ROLE_PARAM, 8, 0.5f},
                {"l2.bias", GR_ROLE_PARAM, 8, -0.125f},
                {"scale", GR_ROLE_BUFFER, 8, 2.0f}};
    for (size_t k = 0; k < sizeof want / sizeof want[0]; k++) {
        const gr_tensor_desc_t *d = find_named(&t, want[k].role, want[k].name);
        assert_non_null(d);
        assert_int_equal(numel(d), want[k].n);
        const float *v = at(&t, d->offset);
        for (size_t i = 0; i < want[k].n; i++)
            assert_float_equal(v[i], want[k].value, 0);
    }
    put(&t, GR_ROLE_INPUT, 0, ref("expanded.x", 32));
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_close(f32(&t, GR_ROLE_OUTPUT, 0), ref("expanded.out", 32), 32, tol, "expanded out");
    release(&t, 1);
    gr_module_release(m);
}

static void test_expanded_params(void **state)
{
    (void)state;
    expanded_params_on("cpu:0", REL_TOL);
}

static void test_shape_mismatch(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {4, 3};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_t *c = NULL;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, NULL, &c), GR_EINVAL,
                 "mat1 and mat2 shapes cannot be multiplied");
    assert_null(strchr(gr_last_error(), '\n'));
    gr_module_release(m);
}

static void test_backward_before_forward(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 1);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    assert_int_equal(capture(1, &spec, NULL, &t), GR_OK);
    assert_int_equal(count_role(&t, GR_ROLE_GRAD_INPUT), 1);
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, "FORWARD");
    replay_ok(t.g, GR_PHASE_FORWARD);
    replay_ok(t.g, GR_PHASE_BACKWARD);
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, NULL);
    assert_error(gr_graph_replay(t.g, 2, NULL, NULL), GR_EINVAL, NULL);
    assert_error(gr_graph_replay(NULL, GR_PHASE_FORWARD, NULL, NULL), GR_EINVAL, NULL);
    release(&t, 1);
    gr_module_release(m);
}

static void test_throwing_forward(void **state)
{
    (void)state;
    gr_module_t *m = load_model("throws.pt");
    const int64_t xs[2] = {2, 4};
    gr_arg_spec_t arg = f32_arg(2, xs, 1);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    assert_int_equal(capture(1, &spec, NULL, &t), GR_OK);
    float *x = f32(&t, GR_ROLE_INPUT, 0);
    for (int i = 0; i < 8; i++)
        x[i] = 1e7f;
    assert_error(gr_graph_replay(t.g, GR_PHASE_FORWARD, NULL, NULL), GR_EINTERNAL,
                 "input sum too large");
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, NULL);
    for (int i = 0; i < 8; i++)
        x[i] = 0.5f;
    replay_ok(t.g, GR_PHASE_FORWARD);
    replay_ok(t.g, GR_PHASE_BACKWARD);
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.failed_replays, 1);
    assert_int_equal(info.forward_replays, 1);
    assert_int_equal(info.backward_replays, 1);
    release(&t, 1);
    gr_module_release(m);
}

/* max_call_memory_bytes: a forward that allocates 256 MiB fails its capture, and its replay, at
 * a 64 MiB bound, and the graph still works once the bound allows it; memory a call frees is
 * given back to its budget (churn.pt takes 1 MiB 40 times per call, under 8 MiB). */
static void test_call_memory_bound(void **state)
{
    (void)state;
    const int64_t shape[] = {2, 4};
    gr_arg_spec_t arg = f32_arg(2, shape, 1);
    gr_module_t *hungry = load_model("hungry.pt"), *churn = load_model("churn.pt");
    gr_callable_spec_t spec = {hungry, NULL, 1, &arg};
    tgraph_t t[1];
    assert_int_equal(gr_call_memory_max(64u << 20), GR_OK);
    assert_error(capture(1, &spec, NULL, t), GR_ENOMEM, "max_call_memory_bytes");
    assert_non_null(strstr(gr_last_error(), "over 67108864"));
    assert_int_equal(gr_call_memory_max(0), GR_OK);
    assert_int_equal(capture(1, &spec, NULL, t), GR_OK);
    assert_int_equal(gr_call_memory_max(64u << 20), GR_OK);
    uint64_t ns = 0;
    assert_error(gr_graph_replay(t[0].g, GR_PHASE_FORWARD, NULL, &ns), GR_ENOMEM,
                 "max_call_memory_bytes");
    assert_int_equal(gr_call_memory_max(0), GR_OK);
    replay_ok(t[0].g, GR_PHASE_FORWARD);
    replay_ok(t[0].g, GR_PHASE_BACKWARD);
    release(t, 1);

    gr_callable_spec_t small = {churn, NULL, 1, &arg};
    assert_int_equal(gr_call_memory_max(8u << 20), GR_OK);
    assert_int_equal(capture(1, &small, NULL, t), GR_OK);
    for (int i = 0; i < 3; i++) {
        replay_ok(t[0].g, GR_PHASE_FORWARD);
        replay_ok(t[0].g, GR_PHASE_BACKWARD);
    }
    assert_int_equal(gr_call_memory_max(0), GR_OK);
    release(t, 1);
    assert_int_equal(gr_module_release(hungry), GR_OK);
    assert_int_equal(gr_module_release(churn), GR_OK);
}

/* The device families are one table: a kind graphd knows but this build lacks answers
 * GR_EUNSUPPORTED with "built without" from every entry point that takes a device (the daemon
 * answers UNIMPLEMENTED), an unknown kind GR_EINVAL, and the CPU family, which has no device
 * memory of its own, GR_EUNSUPPORTED naming itself for memory, events and counters. */
static void unbuilt_family(const char *device, const char *needle, const gr_callable_spec_t *spec)
{
    gr_pool_t *pool = NULL;
    gr_capture_t *c = NULL;
    void *ptr = NULL;
    uint8_t handle[GR_IPC_HANDLE_SIZE];
    gr_event_t *ev = NULL;
    gr_seq_t *seq = NULL;
    assert_error(gr_pool_create(device, &pool), GR_EUNSUPPORTED, needle);
    assert_null(pool);
    assert_error(gr_capture_prepare(device, 1, spec, NULL, &c), GR_EUNSUPPORTED, needle);
    assert_null(c);
    assert_error(gr_device_alloc(device, 4096, &ptr, handle), GR_EUNSUPPORTED, needle);
    assert_null(ptr);
    assert_error(gr_device_free(device, handle), GR_EUNSUPPORTED, needle);
    assert_error(gr_event_create(device, &ev, handle), GR_EUNSUPPORTED, needle);
    assert_error(gr_event_open(device, handle, &ev), GR_EUNSUPPORTED, needle);
    assert_null(ev);
    assert_error(gr_seq_create(device, &seq, handle), GR_EUNSUPPORTED, needle);
    assert_null(seq);
}

static void test_family_table(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};

    /* No XPU libtorch exists here. */
    unbuilt_family("xpu:0", "this graphd was built without an XPU libtorch", &spec);
    unbuilt_family("xpu", "without an XPU libtorch", &spec);
    /* CUDA: unbuilt in the CPU build; where it is built, the GPU tests cover it. */
    gr_pool_t *pool = NULL;
    int rc = gr_pool_create("cuda:0", &pool);
    if (rc == GR_EUNSUPPORTED)
        unbuilt_family("cuda:0", "this graphd was built without a CUDA libtorch", &spec);
    else if (rc == GR_OK)
        assert_int_equal(gr_pool_destroy(pool), GR_OK);
    else
        assert_error(rc, GR_ENOTFOUND, "cuda:0"); /* built, no GPU */

    /* An unknown kind is the caller's mistake, and the message lists the kinds graphd knows. */
    gr_capture_t *c = NULL;
    void *ptr = NULL;
    uint8_t handle[GR_IPC_HANDLE_SIZE];
    gr_event_t *ev = NULL;
    gr_seq_t *seq = NULL;
    assert_error(gr_pool_create("tpu:0", &pool), GR_EINVAL, "unknown device kind 'tpu'");
    assert_error(gr_capture_prepare("tpu:0", 1, &spec, NULL, &c), GR_EINVAL, "cpu, cuda, xpu");
    assert_error(gr_device_alloc("tpu:0", 4096, &ptr, handle), GR_EINVAL, "tpu");
    assert_error(gr_event_create("tpu:0", &ev, handle), GR_EINVAL, "tpu");
    assert_error(gr_seq_create("tpu:0", &seq, handle), GR_EINVAL, "tpu");
    assert_error(gr_device_alloc("cpu:x", 4096, &ptr, handle), GR_EINVAL, "malformed");
    assert_error(gr_device_alloc(NULL, 4096, &ptr, handle), GR_EINVAL, NULL);
    assert_error(gr_device_alloc("cpu:9", 4096, &ptr, handle), GR_ENOTFOUND, "cpu:9");

    /* The CPU family has no device memory, events or counters of its own. */
    assert_error(gr_device_alloc("cpu:0", 4096, &ptr, handle), GR_EUNSUPPORTED,
                 "cpu has no device memory of its own");
    assert_error(gr_device_alloc("cpu:0", 0, &ptr, handle), GR_EINVAL, "0 bytes");
    assert_int_equal(gr_device_free("cpu:0", NULL), GR_OK);
    assert_error(gr_event_create("cpu:0", &ev, handle), GR_EUNSUPPORTED, "cpu has no");
    assert_error(gr_seq_create("cpu", &seq, handle), GR_EUNSUPPORTED, "cpu has no");
    assert_int_equal(gr_event_destroy(NULL), GR_OK);
    assert_int_equal(gr_seq_destroy(NULL), GR_OK);
    assert_error(gr_seq_skip(NULL, 1), GR_EINVAL, NULL);
    assert_error(gr_seq_release(NULL), GR_EINVAL, NULL);
    /* ... nor can it share memory with another process: no device-resident capture. */
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.resident = 1;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, &opts, &c), GR_EINVAL,
                 "device-resident static tensors need a device with memory of its own");
    assert_null(c);
    assert_int_equal(gr_module_release(m), GR_OK);
}

/* One replay entry point: NULL order replays synchronously; any order needs a device-resident
 * graph (a CPU graph never is), and an order naming nothing is refused as such. */
static void test_replay_order(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 1);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    capture_ok("cpu:0", 1, &spec, NULL, &t);
    uint64_t ns = 0;
    assert_int_equal(gr_graph_replay(t.g, GR_PHASE_FORWARD, NULL, &ns), GR_OK);
    assert_true(ns > 0);
    assert_int_equal(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_OK);

    gr_order_t none;
    memset(&none, 0, sizeof none);
    assert_error(gr_graph_replay(t.g, GR_PHASE_FORWARD, &none, &ns), GR_EINVAL,
                 "an ordered replay needs a device-resident graph");
    gr_order_t counted = none;
    counted.n = 1; /* a number without counters is no order either */
    assert_error(gr_graph_replay(t.g, GR_PHASE_FORWARD, &counted, NULL), GR_EINVAL,
                 "device-resident");
    assert_error(gr_graph_replay(NULL, GR_PHASE_FORWARD, &none, NULL), GR_EINVAL, "NULL graph");
    /* Nothing ran: the graph is as it was, and a BACKWARD still needs a FORWARD. */
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.forward_replays, 1);
    assert_int_equal(info.forward_pending, 0);
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, "FORWARD");
    replay_ok(t.g, GR_PHASE_FORWARD);
    replay_ok(t.g, GR_PHASE_BACKWARD);
    release(&t, 1);
    assert_int_equal(gr_module_release(m), GR_OK);
}

static void test_bad_capture_arguments(void **state)
{
    (void)state;
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_t *c = NULL;

    assert_error(gr_capture_prepare("xpu:0", 1, &spec, NULL, &c), GR_EUNSUPPORTED, "xpu");
    assert_error(gr_capture_prepare("cpu:1", 1, &spec, NULL, &c), GR_ENOTFOUND, NULL);
    assert_error(gr_capture_prepare("tpu:0", 1, &spec, NULL, &c), GR_EINVAL, NULL);
    assert_error(gr_capture_prepare("cpu:x", 1, &spec, NULL, &c), GR_EINVAL, NULL);
    assert_error(gr_capture_prepare("cpu:0", 0, &spec, NULL, &c), GR_EINVAL, NULL);
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, NULL, NULL), GR_EINVAL, NULL);

    gr_callable_spec_t bad = spec;
    bad.method = "nope";
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "no method 'nope'");
    bad = spec;
    bad.module = NULL;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "callable 0");

    gr_arg_spec_t a = arg;
    bad = spec;
    bad.args = &a;
    a.dtype = 99;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "dtype 99");
    a = arg;
    a.dtype = GR_DTYPE_I64;
    a.requires_grad = 1;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "floating-point");
    a = arg;
    a.ndim = GR_MAX_DIMS + 1;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "dimensions");
    a = arg;
    a.shape[0] = -1;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "negative");
    a = arg;
    a.dtype = GR_DTYPE_F64; /* the module is float32 */
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "callable 0");
    a = arg;
    bad.n_args = 2;
    gr_arg_spec_t two[2] = {arg, arg};
    bad.args = two;
    assert_error(gr_capture_prepare("cpu:0", 1, &bad, NULL, &c), GR_EINVAL, "argument");

    gr_pool_t *pool = NULL;
    assert_error(gr_pool_create("xpu:0", &pool), GR_EUNSUPPORTED, NULL);

    /* A misaligned block: the capture is consumed and nothing leaks. */
    assert_int_equal(gr_capture_prepare("cpu:0", 1, &spec, NULL, &c), GR_OK);
    size_t count = 0, small = 2;
    uint64_t total = 0;
    assert_int_equal(gr_capture_layout(c, 0, &count, NULL, &total), GR_OK);
    assert_int_equal(count, 1 + 1 + 1 + 6 + 6);
    gr_tensor_desc_t two_items[2];
    assert_int_equal(gr_capture_layout(c, 0, &small, two_items, NULL), GR_OK);
    assert_int_equal(small, 2);
    assert_int_equal(two_items[1].role, GR_ROLE_OUTPUT);
    assert_error(gr_capture_layout(c, 1, &count, NULL, NULL), GR_EINVAL, NULL);
    gr_graph_info_t info;
    assert_int_equal(gr_capture_info(c, 0, &info), GR_OK);
    assert_int_equal(info.total_bytes, total);
    assert_int_equal(info.forward_replays, 0);
    uint8_t *block = aligned_alloc(GR_ALIGN, total + GR_ALIGN);
    void *base = block + 8;
    gr_graph_t *g = NULL;
    assert_error(gr_capture_finish(c, &base, &g), GR_EINVAL, "aligned");
    assert_null(g);
    free(block);

    assert_int_equal(gr_capture_prepare("cpu:0", 1, &spec, NULL, &c), GR_OK);
    assert_int_equal(gr_capture_abort(c), GR_OK);
    assert_error(gr_capture_abort(NULL), GR_EINVAL, NULL);
    gr_module_release(m);
}

typedef struct worker {
    const void *bytes;
    size_t len;
    gr_module_t *module;
    int rc;
    char msg[256];
} worker_t;

/* What a device worker does: load, capture, replay, destroy, release. */
static void *worker_main(void *arg)
{
    worker_t *w = arg;
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t a = f32_arg(2, xs, 1);
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.num_warmup_iters = 1;
    gr_capture_t *c = NULL;
    gr_graph_t *g = NULL;
    uint64_t total = 0;
    size_t count = 0;
    void *block = NULL;
    if ((w->rc = gr_module_load(w->bytes, w->len, &w->module)) != GR_OK)
        goto out;
    gr_callable_spec_t spec = {w->module, NULL, 1, &a};
    if ((w->rc = gr_capture_prepare("cpu:0", 1, &spec, &opts, &c)) != GR_OK)
        goto out;
    gr_capture_layout(c, 0, &count, NULL, &total);
    block = aligned_alloc(GR_ALIGN, total);
    if ((w->rc = gr_capture_finish(c, &block, &g)) != GR_OK)
        goto out;
    for (int i = 0; i < 5 && w->rc == GR_OK; i++) {
        w->rc = gr_graph_replay(g, GR_PHASE_FORWARD, NULL, NULL);
        if (w->rc == GR_OK)
            w->rc = gr_graph_replay(g, GR_PHASE_BACKWARD, NULL, NULL);
    }
    gr_graph_destroy(g);
out:
    if (w->rc != GR_OK)
        snprintf(w->msg, sizeof w->msg, "%s", gr_last_error());
    free(block);
    return NULL;
}

static void test_concurrent_workers(void **state)
{
    (void)state;
    size_t len = 0;
    void *bytes = read_file("mlp.pt", &len);
    size_t before = gr_module_loaded_count();
    worker_t w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        memset(&w[i], 0, sizeof w[i]);
        w[i].bytes = bytes;
        w[i].len = len;
        assert_int_equal(pthread_create(&th[i], NULL, worker_main, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 4; i++) {
        if (w[i].rc != GR_OK)
            fail_msg("worker %d: %s: %s", i, gr_err_name(w[i].rc), w[i].msg);
        assert_ptr_equal(w[i].module, w[0].module);
    }
    gr_module_info_t info;
    assert_int_equal(gr_module_info(w[0].module, &info), GR_OK);
    assert_int_equal(info.refcount, 4);
    assert_int_equal(gr_module_loaded_count(), before + 1);
    for (int i = 0; i < 4; i++)
        assert_int_equal(gr_module_release(w[i].module), GR_OK);
    assert_int_equal(gr_module_loaded_count(), before);
    free(bytes);
}

/* The CPU split into two devices (gr_cpu_devices): cpu:1 exists only after the split, trains
 * exactly as cpu:0 in a pool of its own and says so in its info; gr_devices still lists no CPU
 * device. The split is undone at the end for the tests that follow. */
static void test_cpu_devices(void **state)
{
    (void)state;
    size_t listed = 0, listed_split = 0;
    assert_int_equal(gr_devices(&listed, NULL), GR_OK);
    gr_pool_t *pool = NULL;
    assert_error(gr_pool_create("cpu:1", &pool), GR_ENOTFOUND, "cpu:1");
    assert_error(gr_cpu_devices(0), GR_EINVAL, NULL);
    assert_error(gr_cpu_devices(65), GR_EINVAL, NULL);
    assert_int_equal(gr_cpu_devices(2), GR_OK);
    assert_error(gr_pool_create("cpu:2", &pool), GR_ENOTFOUND, "cpu:2");
    assert_int_equal(gr_devices(&listed_split, NULL), GR_OK);
    assert_int_equal(listed_split, listed);

    assert_int_equal(gr_pool_create("cpu:1", &pool), GR_OK);
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.pool = pool;
    gr_capture_t *c = NULL;
    assert_error(gr_capture_prepare("cpu:0", 1, &spec, &opts, &c), GR_EINVAL, "pool is on cpu:1");
    tgraph_t t;
    assert_int_equal(capture_on("cpu:1", 1, &spec, &opts, &t), GR_OK);
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_string_equal(info.device, "cpu:1");
    assert_error(gr_pool_destroy(pool), GR_EBUSY, NULL);

    const double *x = ref("mlp.x", 256), *y = ref("mlp.y", 128);
    const double *losses = ref("mlp.losses", STEPS);
    for (int step = 0; step < STEPS; step++) {
        put(&t, GR_ROLE_INPUT, 0, x);
        replay_ok(t.g, GR_PHASE_FORWARD);
        double loss = mse_step(&t, y);
        replay_ok(t.g, GR_PHASE_BACKWARD);
        sgd(&t);
        assert_rel(loss, losses[step], "mlp on cpu:1", step);
    }
    release(&t, 1);
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    gr_module_release(m);
    assert_int_equal(gr_cpu_devices(1), GR_OK);
    assert_error(gr_pool_create("cpu:1", &pool), GR_ENOTFOUND, NULL);
}

/* ---- CUDA (host-staged); skipped where gr_devices lists no GPU --------------------------- */

#define CUDA_REL_TOL 1e-4

static size_t cuda_count(void)
{
    size_t n = 0;
    assert_int_equal(gr_devices(&n, NULL), GR_OK);
    return n;
}

static void test_devices(void **state)
{
    (void)state;
    size_t n = cuda_count();
    assert_error(gr_devices(NULL, NULL), GR_EINVAL, NULL);
    gr_pool_t *pool = NULL;
    if (n == 0) {
        int rc = gr_pool_create("cuda:0", &pool);
        assert_true(rc == GR_EUNSUPPORTED || rc == GR_ENOTFOUND);
        return;
    }
    gr_device_info_t items[4];
    size_t got = 4;
    assert_int_equal(gr_devices(&got, items), GR_OK);
    assert_int_equal(got, n < 4 ? n : 4);
    for (size_t i = 0; i < got; i++) {
        char want[GR_DEVICE_MAX];
        snprintf(want, sizeof want, "cuda:%zu", i);
        assert_string_equal(items[i].device, want);
        assert_true(items[i].name[0] != '\0');
        assert_true(strchr(items[i].compute_capability, '.') != NULL);
        assert_true(items[i].total_bytes > 0);
        assert_true(items[i].free_bytes > 0 && items[i].free_bytes <= items[i].total_bytes);
        assert_int_equal(items[i].mps, gr_cuda_mps_pipe(NULL, 0));
        printf("# %s: %s, cc %s, %.1f GiB, %.1f GiB free, MPS %s\n", items[i].device, items[i].name,
               items[i].compute_capability, items[i].total_bytes / 1073741824.0,
               items[i].free_bytes / 1073741824.0, items[i].mps ? "yes" : "no");
    }
    got = 0;
    assert_int_equal(gr_devices(&got, items), GR_OK);
    assert_int_equal(got, 0);
    char past[GR_DEVICE_MAX];
    snprintf(past, sizeof past, "cuda:%zu", n);
    assert_error(gr_pool_create(past, &pool), GR_ENOTFOUND, NULL);
}

/* The MPS look-up needs no GPU: $CUDA_MPS_PIPE_DIRECTORY (else /tmp/nvidia-mps) is the
 * directory, and a "control" entry in it means a control daemon is there. The variable is
 * restored at the end. */
static void test_cuda_mps_pipe(void **state)
{
    (void)state;
    const char *saved = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char *old = saved ? strdup(saved) : NULL;
    char tmp[] = "/tmp/gr-mps-XXXXXX", control[64], dir[64];
    assert_non_null(mkdtemp(tmp));
    snprintf(control, sizeof control, "%s/control", tmp);

    assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", tmp, 1), 0);
    assert_int_equal(gr_cuda_mps_pipe(dir, sizeof dir), 0);
    assert_string_equal(dir, tmp);
    FILE *f = fopen(control, "w");
    assert_non_null(f);
    fclose(f);
    assert_int_equal(gr_cuda_mps_pipe(dir, sizeof dir), 1);
    assert_int_equal(gr_cuda_mps_pipe(NULL, 0), 1);
    char small[8];
    assert_int_equal(gr_cuda_mps_pipe(small, sizeof small), 1);
    assert_int_equal(strlen(small), sizeof small - 1); /* truncated, still NUL-terminated */
    assert_error(gr_cuda_mps_pipe(NULL, sizeof dir), GR_EINVAL, NULL);

    /* Unset or empty: the default directory (whatever this machine has there). */
    assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", "", 1), 0);
    int rc = gr_cuda_mps_pipe(dir, sizeof dir);
    assert_true(rc == 0 || rc == 1);
    assert_string_equal(dir, "/tmp/nvidia-mps");
    assert_int_equal(unsetenv("CUDA_MPS_PIPE_DIRECTORY"), 0);
    assert_int_equal(gr_cuda_mps_pipe(dir, sizeof dir), rc);
    assert_string_equal(dir, "/tmp/nvidia-mps");

    assert_int_equal(unlink(control), 0);
    assert_int_equal(rmdir(tmp), 0);
    if (old != NULL)
        assert_int_equal(setenv("CUDA_MPS_PIPE_DIRECTORY", old, 1), 0);
    free(old);
}

static void test_cuda_mlp_training_parity(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.copy_param_grads = 0; /* host-staged: the gradients are copied to the host anyway */
    tgraph_t t;
    capture_ok("cuda:0", 1, &spec, &opts, &t);
    assert_no_external(&t);
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_string_equal(info.device, "cuda:0");
    assert_int_equal(info.has_backward, 1);
    assert_int_equal(count_role(&t, GR_ROLE_PARAM_GRAD), 6);

    /* BACKWARD before any FORWARD is refused, as on the CPU. */
    assert_error(gr_graph_replay(t.g, GR_PHASE_BACKWARD, NULL, NULL), GR_EPRECOND, NULL);

    const double *x = ref("mlp.x", 256), *y = ref("mlp.y", 128);
    const double *losses = ref("mlp.losses", STEPS);
    for (int step = 0; step < STEPS; step++) {
        put(&t, GR_ROLE_INPUT, 0, x);
        uint64_t ns = 0;
        assert_int_equal(gr_graph_replay(t.g, GR_PHASE_FORWARD, NULL, &ns), GR_OK);
        assert_true(ns > 0);
        double loss = mse_step(&t, y);
        replay_ok(t.g, GR_PHASE_BACKWARD);
        sgd(&t); /* on the host block: the next FORWARD copies the parameters in */
        double rel = fabs(loss - losses[step]) / fmax(fabs(losses[step]), 1e-12);
        if (rel > CUDA_REL_TOL)
            fail_msg("cuda mlp step %d: loss %.9g, reference %.9g (rel %.3g)", step, loss,
                     losses[step], rel);
    }
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.forward_replays, STEPS);
    assert_int_equal(info.backward_replays, STEPS);
    release(&t, 1);
    gr_module_release(m);
}

static void test_cuda_two_callables_shared_pool(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    gr_module_t *ma = load_model("two_a.pt"), *mb = load_model("two_b.pt");
    const int64_t xa[2] = {16, 16}, xb[2] = {16, 12};
    gr_arg_spec_t arg_a = f32_arg(2, xa, 0), arg_b = f32_arg(2, xb, 1);
    gr_callable_spec_t specs[2] = {{ma, "forward", 1, &arg_a}, {mb, NULL, 1, &arg_b}};
    gr_pool_t *pool = NULL;
    assert_int_equal(gr_pool_create("cuda:0", &pool), GR_OK);
    uint64_t reserved = 1, in_use = 1;
    assert_int_equal(gr_pool_memory(pool, &reserved, &in_use), GR_OK);
    assert_int_equal(reserved, 0); /* nothing captured into its mempool yet */
    assert_int_equal(in_use, 0);
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.pool = pool;
    tgraph_t t[2];
    capture_ok("cuda:0", 2, specs, &opts, t);
    assert_error(gr_pool_destroy(pool), GR_EBUSY, NULL);
    /* The captured forwards and backwards allocated their intermediates in the pool's mempool. */
    int rc = gr_pool_memory(pool, &reserved, &in_use);
    if (rc != GR_OK)
        fail_msg("gr_pool_memory: %s: %s", gr_err_name(rc), gr_last_error());
    printf("# cuda:0 pool mempool: %llu bytes reserved, %llu in use\n",
           (unsigned long long)reserved, (unsigned long long)in_use);
    assert_true(reserved > 0);
    assert_true(in_use <= reserved);
    assert_int_equal(count_role(&t[1], GR_ROLE_GRAD_INPUT), 1);

    const double *x = ref("two.x", 256), *y = ref("two.y", 128);
    const double *losses = ref("two.losses", STEPS);
    size_t n_mid = numel(find(&t[0], GR_ROLE_OUTPUT, 0));
    for (int step = 0; step < STEPS; step++) {
        put(&t[0], GR_ROLE_INPUT, 0, x);
        replay_ok(t[0].g, GR_PHASE_FORWARD);
        memcpy(f32(&t[1], GR_ROLE_INPUT, 0), f32(&t[0], GR_ROLE_OUTPUT, 0), n_mid * 4);
        replay_ok(t[1].g, GR_PHASE_FORWARD);
        double loss = mse_step(&t[1], y);
        replay_ok(t[1].g, GR_PHASE_BACKWARD);
        memcpy(f32(&t[0], GR_ROLE_GRAD_OUTPUT, 0), f32(&t[1], GR_ROLE_GRAD_INPUT, 0), n_mid * 4);
        replay_ok(t[0].g, GR_PHASE_BACKWARD);
        sgd(&t[0]);
        sgd(&t[1]);
        double rel = fabs(loss - losses[step]) / fmax(fabs(losses[step]), 1e-12);
        if (rel > CUDA_REL_TOL)
            fail_msg("cuda two step %d: loss %.9g, reference %.9g (rel %.3g)", step, loss,
                     losses[step], rel);
    }
    release(t, 2);
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    gr_module_release(ma);
    gr_module_release(mb);
}

static void test_cuda_replay_twice_identical(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    tgraph_t t;
    capture_ok("cuda:0", 1, &spec, NULL, &t);
    const gr_tensor_desc_t *od = find(&t, GR_ROLE_OUTPUT, 0);
    const gr_tensor_desc_t *gd = find(&t, GR_ROLE_PARAM_GRAD, 0);
    uint8_t *out1 = malloc(od->nbytes), *grad1 = malloc(gd->nbytes);
    put(&t, GR_ROLE_INPUT, 0, ref("mlp.x", 256));
    for (int i = 0; i < 2; i++) {
        replay_ok(t.g, GR_PHASE_FORWARD);
        mse_step(&t, ref("mlp.y", 128));
        replay_ok(t.g, GR_PHASE_BACKWARD);
        if (i == 0) {
            memcpy(out1, at(&t, od->offset), od->nbytes);
            memcpy(grad1, at(&t, gd->offset), gd->nbytes);
            memset(at(&t, od->offset), 0, od->nbytes); /* the next replay must write them again */
            memset(at(&t, gd->offset), 0, gd->nbytes);
        }
    }
    assert_memory_equal(out1, at(&t, od->offset), od->nbytes);
    assert_memory_equal(grad1, at(&t, gd->offset), gd->nbytes);
    /* A changed input is seen by the next replay. */
    f32(&t, GR_ROLE_INPUT, 0)[0] += 1.0f;
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_true(memcmp(out1, at(&t, od->offset), od->nbytes) != 0);
    free(out1);
    free(grad1);
    release(&t, 1);
    gr_module_release(m);
}

static void test_cuda_batchnorm_buffer_tensors(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    bn_buffer_tensors_on("cuda:0", CUDA_REL_TOL);
}

static void test_cuda_expanded_params(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    expanded_params_on("cuda:0", CUDA_REL_TOL);
}

static void test_cuda_eval_buffer_writes(void **state)
{
    (void)state;
    if (cuda_count() == 0)
        skip();
    eval_buffer_writes_on("cuda:0", CUDA_REL_TOL);
}

/* ---- XPU (host-staged only); skipped where the XPU family is not built (every build so far) -- */

static int xpu_built(void)
{
    gr_pool_t *pool = NULL;
    if (gr_pool_create("xpu:0", &pool) != GR_OK)
        return 0;
    assert_int_equal(gr_pool_destroy(pool), GR_OK);
    return 1;
}

static void test_xpu_batchnorm_buffer_tensors(void **state)
{
    (void)state;
    if (!xpu_built())
        skip();
    bn_buffer_tensors_on("xpu:0", CUDA_REL_TOL);
}

static void test_xpu_expanded_params(void **state)
{
    (void)state;
    if (!xpu_built())
        skip();
    expanded_params_on("xpu:0", CUDA_REL_TOL);
}

static void test_xpu_eval_buffer_writes(void **state)
{
    (void)state;
    if (!xpu_built())
        skip();
    eval_buffer_writes_on("xpu:0", CUDA_REL_TOL);
}

/* torch 2.11 cannot share XPU memory across processes: device-resident XPU captures are refused
 * with the reason, not attempted. */
static void test_xpu_resident_refused(void **state)
{
    (void)state;
    if (!xpu_built())
        skip();
    gr_module_t *m = load_model("mlp.pt");
    const int64_t xs[2] = {16, 16};
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.resident = 1;
    gr_capture_t *c = NULL;
    assert_error(gr_capture_prepare("xpu:0", 1, &spec, &opts, &c), GR_EUNSUPPORTED, "torch 2.11");
    void *ptr = NULL;
    uint8_t handle[GR_IPC_HANDLE_SIZE];
    assert_error(gr_device_alloc("xpu:0", 4096, &ptr, handle), GR_EUNSUPPORTED, "xpu has no");
    assert_int_equal(gr_module_release(m), GR_OK);
}

/* ---- random ops: the RNG_STATE tensor --------------------------------------------------- */

#define RNG_BYTES 5056 /* torch.get_rng_state().numel() in torch 1.13 */

/* The RNG_STATE tensor of t: uint8[RNG_BYTES] named "cpu", index 0, last in the block. */
static uint8_t *rng_state(const tgraph_t *t)
{
    const gr_tensor_desc_t *d = find(t, GR_ROLE_RNG_STATE, 0);
    if (d == NULL)
        fail_msg("no rng_state tensor");
    assert_int_equal(count_role(t, GR_ROLE_RNG_STATE), 1);
    assert_ptr_equal(d, &t->layout[t->count - 1]);
    assert_string_equal(d->name, "cpu");
    assert_int_equal(d->dtype, GR_DTYPE_U8);
    assert_int_equal(d->ndim, 1);
    assert_int_equal(d->shape[0], RNG_BYTES);
    assert_int_equal(d->nbytes, RNG_BYTES);
    assert_int_equal(d->flags, 0);
    assert_int_equal(d->offset % GR_ALIGN, 0);
    return at(t, d->offset);
}

/* A generator state from the references (bytes stored as numbers). */
static void put_state(const tgraph_t *t, const char *key)
{
    const double *v = ref(key, RNG_BYTES);
    uint8_t *s = rng_state(t);
    for (size_t i = 0; i < RNG_BYTES; i++)
        s[i] = (uint8_t)v[i];
}

static void assert_state(const tgraph_t *t, const char *key)
{
    const double *v = ref(key, RNG_BYTES);
    const uint8_t *s = rng_state(t);
    for (size_t i = 0; i < RNG_BYTES; i++)
        if (s[i] != (uint8_t)v[i])
            fail_msg("%s: byte %zu is %u, eager PyTorch's %u", key, i, s[i], (unsigned)v[i]);
}

/* Bit for bit: the references are float32 values printed exactly. */
static void assert_bits(const float *got, const char *key, size_t n)
{
    const double *want = ref(key, n);
    for (size_t i = 0; i < n; i++)
        if (got[i] != (float)want[i])
            fail_msg("%s[%zu]: got %.9g, eager PyTorch %.9g", key, i, got[i], want[i]);
}

/* The shapes of the random models' inputs (make_models.py's DropNet and RandNet). */
static const int64_t DROP_X[2] = {4, 6}, RAND_X[2] = {3, 4};

static void capture_model(const char *file, const int64_t *xs, tgraph_t *t, gr_module_t **m)
{
    *m = load_model(file);
    gr_arg_spec_t arg = f32_arg(2, xs, 0);
    gr_callable_spec_t spec = {*m, NULL, 1, &arg};
    capture_ok("cpu:0", 1, &spec, NULL, t);
}

/* A callable gets an RNG_STATE exactly when its method uses random ops: dropout in training
 * mode (traced, or scripted with self.training folded), rand_like and bernoulli; not an MLP,
 * nor a scripted eval-mode module whose dropout's train argument is its training flag. */
static void test_rng_state_tensor(void **state)
{
    (void)state;
    assert_int_equal(GR_ROLE_RNG_STATE, 7);
    assert_string_equal(gr_role_name(GR_ROLE_RNG_STATE), "rng_state");
    const struct {
        const char *file;
        const int64_t *xs;
        size_t n_rng;
    } cases[] = {{"drop.pt", DROP_X, 1},
                 {"drop_script.pt", DROP_X, 1},
                 {"rand.pt", RAND_X, 1},
                 {"mlp.pt", (const int64_t[]){16, 16}, 0},
                 {"eval.pt", (const int64_t[]){4, 6}, 0}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        gr_module_t *m;
        tgraph_t t;
        capture_model(cases[i].file, cases[i].xs, &t, &m);
        if (count_role(&t, GR_ROLE_RNG_STATE) != cases[i].n_rng)
            fail_msg("%s: %zu rng_state tensors, want %zu", cases[i].file,
                     count_role(&t, GR_ROLE_RNG_STATE), cases[i].n_rng);
        gr_graph_info_t info;
        assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
        assert_int_equal(info.counts[GR_ROLE_RNG_STATE], cases[i].n_rng);
        if (cases[i].n_rng)
            (void)rng_state(&t); /* its shape and place */
        release(&t, 1);
        gr_module_release(m);
    }

    /* Capture leaves a valid state there (the daemon's): replays without writing it run, and the
     * state advances from one to the next, with different masks. */
    gr_module_t *m;
    tgraph_t t;
    capture_model("drop.pt", DROP_X, &t, &m);
    put(&t, GR_ROLE_INPUT, 0, ref("drop.x", 24));
    uint8_t *s = rng_state(&t), before[RNG_BYTES];
    float out[32];
    memcpy(before, s, RNG_BYTES);
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_true(memcmp(before, s, RNG_BYTES) != 0);
    memcpy(out, f32(&t, GR_ROLE_OUTPUT, 0), sizeof out);
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_true(memcmp(out, f32(&t, GR_ROLE_OUTPUT, 0), sizeof out) != 0);
    release(&t, 1);
    gr_module_release(m);
}

/* The masks are eager PyTorch's for the state written (bit for bit), the state after FORWARD is
 * the eager generator's after the same forward, the state carried gives the next masks, the same
 * state twice the same masks, and BACKWARD reuses the mask and leaves the state alone. */
static void rng_parity(const char *file, const char *key, const int64_t *xs, size_t n_in,
                       size_t n_out)
{
    gr_module_t *m;
    tgraph_t t;
    capture_model(file, xs, &t, &m);
    char k[64];
    snprintf(k, sizeof k, "%s.x", key);
    put(&t, GR_ROLE_INPUT, 0, ref(k, n_in));
    const float *out = f32(&t, GR_ROLE_OUTPUT, 0);
    float first[32];
    assert_true(n_out <= 32);
    for (int rep = 0; rep < 2; rep++) {
        snprintf(k, sizeof k, "%s.state0", key);
        put_state(&t, k);
        for (int i = 1; i <= 2; i++) {
            replay_ok(t.g, GR_PHASE_FORWARD);
            snprintf(k, sizeof k, "%s.out%d", key, i);
            assert_bits(out, k, n_out);
            snprintf(k, sizeof k, "%s.state%d", key, i);
            assert_state(&t, k);
            if (i == 1)
                memcpy(first, out, n_out * sizeof *out);
            else
                assert_true(memcmp(first, out, n_out * sizeof *out) != 0);
        }
    }
    if (strcmp(key, "drop") == 0) {
        snprintf(k, sizeof k, "%s.state0", key);
        put_state(&t, k);
        replay_ok(t.g, GR_PHASE_FORWARD);
        uint8_t after[RNG_BYTES];
        memcpy(after, rng_state(&t), RNG_BYTES);
        float *gout = f32(&t, GR_ROLE_GRAD_OUTPUT, 0);
        for (size_t i = 0; i < n_out; i++)
            gout[i] = 1.0f;
        replay_ok(t.g, GR_PHASE_BACKWARD);
        assert_close(f32(&t, GR_ROLE_PARAM_GRAD, 0), ref("drop.gw1", 48), 48, 1e-6, "drop.gw1");
        assert_memory_equal(after, rng_state(&t), RNG_BYTES);
    }
    release(&t, 1);
    gr_module_release(m);
}

static void test_rng_dropout_parity(void **state)
{
    (void)state;
    rng_parity("drop.pt", "drop", DROP_X, 24, 32);
}

static void test_rng_rand_parity(void **state)
{
    (void)state;
    rng_parity("rand.pt", "rand", RAND_X, 12, 15);
}

/* libtorch's CPU generator state layout (CPUGeneratorImplState), for writing broken ones. */
#define RNG_LEFT 8        /* int: draws until the next twist */
#define RNG_SEEDED 12     /* int */
#define RNG_NEXT 16       /* uint64: next word of the 624 */
#define RNG_FLOAT_OK 5048 /* bool: a cached float normal sample is valid */

static void put_u64(uint8_t *s, size_t off, uint64_t v)
{
    memcpy(s + off, &v, sizeof v);
}

static void put_i32(uint8_t *s, size_t off, int32_t v)
{
    memcpy(s + off, &v, sizeof v);
}

/* A state that is not one: GR_EINVAL naming the tensor, nothing run, the bytes left as written;
 * the graph works again with a valid state. Includes a position libtorch's own check accepts
 * but that would read past the engine's words (left + next > 625). */
static void test_rng_state_invalid(void **state)
{
    (void)state;
    gr_module_t *m;
    tgraph_t t;
    capture_model("drop.pt", DROP_X, &t, &m);
    put(&t, GR_ROLE_INPUT, 0, ref("drop.x", 24));
    uint8_t *s = rng_state(&t), wrote[RNG_BYTES];
    const char *needle = "rng_state tensor 'cpu' is not a valid CPU generator state";
    for (int k = 0; k < 6; k++) {
        put_state(&t, "drop.state0");
        switch (k) {
        case 0:
            memset(s, 0xff, RNG_BYTES);
            break;
        case 1:
            memset(s, 0, RNG_BYTES);
            break;
        case 2: /* libtorch's is_valid() accepts it; the next 623 draws would overrun */
            put_i32(s, RNG_LEFT, 624);
            put_u64(s, RNG_NEXT, 624);
            break;
        case 3:
            put_u64(s, RNG_NEXT, (UINT64_C(1) << 32) + 3);
            break;
        case 4:
            put_i32(s, RNG_SEEDED, 0);
            break;
        case 5:
            s[RNG_FLOAT_OK] = 2;
            break;
        }
        memcpy(wrote, s, RNG_BYTES);
        assert_error(gr_graph_replay(t.g, GR_PHASE_FORWARD, NULL, NULL), GR_EINVAL, needle);
        assert_memory_equal(wrote, s, RNG_BYTES);
    }
    gr_graph_info_t info;
    assert_int_equal(gr_graph_info(t.g, &info), GR_OK);
    assert_int_equal(info.failed_replays, 6);
    assert_int_equal(info.forward_pending, 0);
    put_state(&t, "drop.state0");
    replay_ok(t.g, GR_PHASE_FORWARD);
    assert_bits(f32(&t, GR_ROLE_OUTPUT, 0), "drop.out1", 32);
    assert_state(&t, "drop.state1");
    release(&t, 1);
    gr_module_release(m);
}

typedef struct rng_worker {
    gr_graph_t *g; /* replays from state0 (the references'), or NULL: captures */
    uint8_t *block;
    const gr_tensor_desc_t *layout;
    size_t count;
    gr_module_t *module; /* for capturing workers */
    const char *device;
    int rounds;
    char err[256];
} rng_worker_t;

static void *worker_tensor(const rng_worker_t *w, int role)
{
    for (size_t k = 0; k < w->count; k++)
        if (w->layout[k].role == role && w->layout[k].index == 0)
            return w->block + w->layout[k].offset;
    return NULL;
}

/* Replays DropNet from state0 twice, rounds times, checking the outputs against eager PyTorch's
 * (no cmocka in threads: the first difference goes to err). */
static void *rng_replayer(void *arg)
{
    rng_worker_t *w = arg;
    const double *state0 = ref("drop.state0", RNG_BYTES), *x = ref("drop.x", 24);
    const double *outs[2] = {ref("drop.out1", 32), ref("drop.out2", 32)};
    float *in = worker_tensor(w, GR_ROLE_INPUT);
    const float *out = worker_tensor(w, GR_ROLE_OUTPUT);
    uint8_t *s = worker_tensor(w, GR_ROLE_RNG_STATE);
    for (int r = 0; r < w->rounds && w->err[0] == '\0'; r++) {
        for (size_t i = 0; i < 24; i++)
            in[i] = (float)x[i];
        for (size_t i = 0; i < RNG_BYTES; i++)
            s[i] = (uint8_t)state0[i];
        for (int k = 0; k < 2 && w->err[0] == '\0'; k++) {
            int rc = gr_graph_replay(w->g, GR_PHASE_FORWARD, NULL, NULL);
            if (rc != GR_OK) {
                snprintf(w->err, sizeof w->err, "replay: %s", gr_last_error());
                break;
            }
            for (size_t i = 0; i < 32; i++)
                if (out[i] != (float)outs[k][i]) {
                    snprintf(w->err, sizeof w->err,
                             "%s round %d replay %d: out[%zu] %.9g, want %.9g", w->device, r, k, i,
                             out[i], outs[k][i]);
                    break;
                }
        }
    }
    return NULL;
}

/* Captures RandNet over and over (its warm-up draws from the daemon's generator). */
static void *rng_capturer(void *arg)
{
    rng_worker_t *w = arg;
    gr_arg_spec_t a = f32_arg(2, RAND_X, 0);
    gr_callable_spec_t spec = {w->module, NULL, 1, &a};
    for (int r = 0; r < w->rounds && w->err[0] == '\0'; r++) {
        gr_capture_t *c = NULL;
        gr_graph_t *g = NULL;
        size_t count = 0;
        uint64_t total = 0;
        int rc = gr_capture_prepare(w->device, 1, &spec, NULL, &c);
        if (rc == GR_OK) {
            gr_capture_layout(c, 0, &count, NULL, &total);
            void *block = aligned_alloc(GR_ALIGN, total);
            rc = gr_capture_finish(c, &block, &g);
            if (rc == GR_OK)
                rc = gr_graph_replay(g, GR_PHASE_FORWARD, NULL, NULL);
            if (g != NULL)
                gr_graph_destroy(g);
            free(block);
        }
        if (rc != GR_OK)
            snprintf(w->err, sizeof w->err, "capture on %s: %s", w->device, gr_last_error());
    }
    return NULL;
}

/* Replays of random callables on two CPU devices, from two threads, while a third captures on a
 * third: each replay still draws exactly its own state's numbers (the runtime serialises every
 * use of the one CPU generator). */
static void test_rng_concurrent_devices(void **state)
{
    (void)state;
    assert_int_equal(gr_cpu_devices(3), GR_OK);
    gr_module_t *drop = load_model("drop.pt"), *rand = load_model("rand.pt");
    gr_arg_spec_t a = f32_arg(2, DROP_X, 0);
    gr_callable_spec_t spec = {drop, NULL, 1, &a};
    tgraph_t t[2];
    rng_worker_t w[3];
    memset(w, 0, sizeof w);
    const char *devices[3] = {"cpu:0", "cpu:1", "cpu:2"};
    for (int i = 0; i < 2; i++) {
        capture_ok(devices[i], 1, &spec, NULL, &t[i]);
        w[i] =
            (rng_worker_t){t[i].g, t[i].block, t[i].layout, t[i].count, NULL, devices[i], 40, ""};
    }
    w[2] = (rng_worker_t){NULL, NULL, NULL, 0, rand, devices[2], 8, ""};
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, i < 2 ? rng_replayer : rng_capturer, &w[i]),
                         0);
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    for (int i = 0; i < 3; i++)
        if (w[i].err[0] != '\0')
            fail_msg("worker %d: %s", i, w[i].err);
    release(t, 2);
    gr_module_release(drop);
    gr_module_release(rand);
    assert_int_equal(gr_cpu_devices(1), GR_OK);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sha256_known_vectors),
        cmocka_unit_test(test_tables),
        cmocka_unit_test(test_bad_archive),
        cmocka_unit_test(test_same_bytes_same_module),
        cmocka_unit_test(test_keyed_modules_do_not_share),
        cmocka_unit_test(test_mlp_training_parity),
        cmocka_unit_test(test_two_callables_parity),
        cmocka_unit_test(test_unused_input_rejected),
        cmocka_unit_test(test_unused_input_allowed),
        cmocka_unit_test(test_warmup_reused),
        cmocka_unit_test(test_eval_mode),
        cmocka_unit_test(test_batchnorm_buffers),
        cmocka_unit_test(test_batchnorm_buffer_tensors),
        cmocka_unit_test(test_eval_buffer_writes),
        cmocka_unit_test(test_buffer_requiring_grad_rejected),
        cmocka_unit_test(test_multiple_outputs),
        cmocka_unit_test(test_params_updated_in_place),
        cmocka_unit_test(test_expanded_params),
        cmocka_unit_test(test_shape_mismatch),
        cmocka_unit_test(test_backward_before_forward),
        cmocka_unit_test(test_throwing_forward),
        cmocka_unit_test(test_call_memory_bound),
        cmocka_unit_test(test_bad_capture_arguments),
        cmocka_unit_test(test_family_table),
        cmocka_unit_test(test_replay_order),
        cmocka_unit_test(test_concurrent_workers),
        cmocka_unit_test(test_cpu_devices),
        cmocka_unit_test(test_rng_state_tensor),
        cmocka_unit_test(test_rng_dropout_parity),
        cmocka_unit_test(test_rng_rand_parity),
        cmocka_unit_test(test_rng_state_invalid),
        cmocka_unit_test(test_rng_concurrent_devices),
        cmocka_unit_test(test_devices),
        cmocka_unit_test(test_cuda_mps_pipe),
        cmocka_unit_test(test_cuda_mlp_training_parity),
        cmocka_unit_test(test_cuda_two_callables_shared_pool),
        cmocka_unit_test(test_cuda_replay_twice_identical),
        cmocka_unit_test(test_cuda_batchnorm_buffer_tensors),
        cmocka_unit_test(test_cuda_eval_buffer_writes),
        cmocka_unit_test(test_cuda_expanded_params),
        cmocka_unit_test(test_xpu_batchnorm_buffer_tensors),
        cmocka_unit_test(test_xpu_expanded_params),
        cmocka_unit_test(test_xpu_eval_buffer_writes),
        cmocka_unit_test(test_xpu_resident_refused),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
