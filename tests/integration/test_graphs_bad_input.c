/*
 * Bad input to the graph calls gets a precise status and never hurts anyone
 * else: sample specs the module does not accept, bad archives, unknown,
 * released and foreign graphs (through frames and gRPC), BACKWARD before
 * FORWARD, a module that throws at replay, a pool too small for a capture,
 * garbage on the session socket of a session that holds graphs, and a
 * daemon that does not answer a replay in time.
 *
 * Frames a libgraphd client would never send go out on its own session
 * socket, found by its peer address (see session_fd); foreign sessions are
 * made by raw gRPC so that the test knows their tokens.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "graphd_frame.h"

#define M(name) "/graphd.v1.Graphd/" name

enum { OK = 0, INVALID_ARGUMENT = 3, NOT_FOUND = 5, PERMISSION_DENIED = 7, UNIMPLEMENTED = 12 };
enum { FAILED_PRECONDITION = 9, INTERNAL = 13 };

typedef harness_fixture_t fixture_t;

/* ---- a little protobuf by hand (as in test_bad_input.c) --------------------------------- */

/* The session id, token and socket path of a HelloReply, found by a flat walk. */
typedef struct raw_session {
    uint64_t id, token;
    char socket[108];
    int fd; /* attached session socket */
} raw_session_t;

static int read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
{
    *v = 0;
    for (int shift = 0; *p < end && shift < 64; shift += 7) {
        uint8_t b = *(*p)++;
        *v |= (uint64_t)(b & 0x7f) << shift;
        if (!(b & 0x80))
            return 0;
    }
    return -1;
}

static void parse_hello(const uint8_t *p, size_t n, raw_session_t *s, int depth)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key, v = 0;
        assert_int_equal(read_varint(&p, end, &key), 0);
        unsigned tag = (unsigned)(key >> 3);
        switch (key & 7) {
        case 0:
            assert_int_equal(read_varint(&p, end, &v), 0);
            if (depth == 1 && tag == 1)
                s->id = v;
            break;
        case 1:
            assert_true(end - p >= 8);
            for (int i = 0; i < 8; i++)
                v |= (uint64_t)p[i] << (8 * i);
            p += 8;
            if (depth == 1 && tag == 2)
                s->token = v;
            break;
        case 2:
            assert_int_equal(read_varint(&p, end, &v), 0);
            assert_true((uint64_t)(end - p) >= v);
            if (depth == 0 && tag == 1)
                parse_hello(p, (size_t)v, s, 1);
            else if (depth == 0 && tag == 3 && v < sizeof(s->socket)) {
                memcpy(s->socket, p, (size_t)v);
                s->socket[v] = '\0';
            }
            p += v;
            break;
        case 5:
            p += 4;
            break;
        default:
            fail_msg("unexpected wire type in HelloReply");
        }
    }
}

/* ---- session-socket helpers ------------------------------------------------------------- */

/* One REPLAY frame and its reply's status; the message goes to msg. */
static int dp_replay(int fd, uint64_t seq, uint64_t graph, uint64_t phase, char *msg, size_t size)
{
    dp_send_frame(fd, GRAPHD_FRAME_REPLAY, seq, graph, phase);
    graphd_frame_t f;
    dp_recv_frame(fd, &f, msg, size);
    assert_int_equal(f.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
    assert_int_equal(f.seq, seq);
    return f.status;
}

/* Hello by raw gRPC and a raw ATTACH: a session whose token this test knows. */
static void raw_session(const harness_t *h, raw_session_t *s)
{
    pb_t req = {.len = 0};
    pb_bytes(&req, 1, "raw", 3);
    pb_uint(&req, 2, (uint64_t)getpid());
    pb_uint(&req, 3, 1);
    uint8_t reply[4096];
    size_t reply_len = sizeof(reply);
    char details[256];
    assert_int_equal(harness_raw_call(h->address, M("Hello"), req.buf, req.len, details,
                                      sizeof(details), reply, &reply_len),
                     OK);
    memset(s, 0, sizeof(*s));
    parse_hello(reply, reply_len, s, 0);
    assert_true(s->id != 0);
    s->fd = dp_connect(s->socket);
    dp_send_frame(s->fd, GRAPHD_FRAME_ATTACH, 1, s->id, s->token);
    graphd_frame_t f;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    dp_recv_frame(s->fd, &f, msg, sizeof(msg));
    assert_int_equal(f.status, OK);
}

/* A Replay (or ReleaseGraph, with phase < 0) by raw gRPC for session s; the status. */
static int raw_graph_call(const harness_t *h, const raw_session_t *s, uint64_t graph, int phase,
                          char *details, size_t size)
{
    pb_t req = {.len = 0};
    pb_session(&req, s->id, s->token);
    pb_uint(&req, 2, graph);
    if (phase > 0)
        pb_uint(&req, 3, (uint64_t)phase);
    return harness_raw_call(h->address, phase < 0 ? M("ReleaseGraph") : M("Replay"), req.buf,
                            req.len, details, size, NULL, NULL);
}

/* ---- graph helpers ---------------------------------------------------------------------- */

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

static uint64_t register_model(graphd_client_t *c, const fixture_t *f, const char *name)
{
    uint64_t id = harness_models_register(c, &f->m, name);
    if (id == 0)
        fail_msg("cannot register %s", name);
    return id;
}

/* A graph of mlp.pt (x [16, 16], requiring grad as asked). */
static graphd_graph_t *capture_mlp(graphd_client_t *c, const fixture_t *f, int requires_grad)
{
    const int64_t xs[2] = {16, 16};
    graphd_tensor_spec_t arg = f32_spec(2, xs, requires_grad);
    graphd_callable_t callable = {register_model(c, f, "mlp.pt"), NULL, 1, &arg};
    graphd_graph_t *g = NULL;
    int rc = graphd_capture(c, 1, &callable, NULL, &g);
    if (rc != GRAPHD_OK)
        fail_msg("capture mlp.pt: %s: %s", graphd_err_name(rc), graphd_last_error(c));
    return g;
}

static void expect(graphd_client_t *c, int rc, int want, const char *needle)
{
    if (rc != want)
        fail_msg("got %s (%s), want %s", graphd_err_name(rc), graphd_last_error(c),
                 graphd_err_name(want));
    if (needle != NULL && strstr(graphd_last_error(c), needle) == NULL)
        fail_msg("message '%s' lacks '%s'", graphd_last_error(c), needle);
}

static void replays_fine(graphd_client_t *c, graphd_graph_t *g)
{
    expect(c, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
    expect(c, graphd_replay_rpc(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
}

static json_t *status_pool(json_t *st, const char *name)
{
    return harness_find(json_object_get(st, "pools"), "name", name);
}

/* ---- capture ---------------------------------------------------------------------------- */

static void sample_specs_the_module_rejects(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "specs");
    assert_non_null(c);
    uint64_t mid = register_model(c, f, "mlp.pt");
    const int64_t good[2] = {16, 16}, bad[2] = {4, 3};
    graphd_tensor_spec_t arg = f32_spec(2, bad, 0);
    graphd_callable_t callable = {mid, NULL, 1, &arg};
    graphd_graph_t *g = (graphd_graph_t *)1;
    /* libtorch's own words come back. */
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT,
           "mat1 and mat2 shapes cannot be multiplied");
    assert_null(g);
    arg = f32_spec(2, good, 0);
    arg.dtype = GRAPHD_FLOAT64;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT,
           "mat1 and mat2 must have the same dtype");
    const int64_t vec[1] = {3};
    arg = f32_spec(1, vec, 0);
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, "shapes");
    graphd_tensor_spec_t two[2] = {f32_spec(2, good, 0), f32_spec(2, good, 0)};
    callable.n_args = 2;
    callable.args = two;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, NULL);
    callable.n_args = 1;
    callable.args = &arg;

    /* What the daemon checks before running anything. */
    arg = f32_spec(2, good, 1);
    arg.dtype = GRAPHD_INT64;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT,
           "floating point");
    arg = f32_spec(2, good, 0);
    arg.dtype = 99;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, "dtype");
    arg = f32_spec(2, good, 0);
    arg.shape[0] = -1;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, "shape");
    arg = f32_spec(2, good, 0);
    callable.method = "nope";
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT,
           "no method 'nope'");
    callable.method = NULL;
    callable.module_id = 987654;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_ENOT_FOUND, NULL);
    callable.module_id = mid;
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.pool = "no-such-pool";
    expect(c, graphd_capture(c, 1, &callable, &opts, &g), GRAPHD_ENOT_FOUND, NULL);
    opts.pool = NULL;
    opts.num_warmup_iters = 100000;
    expect(c, graphd_capture(c, 1, &callable, &opts, &g), GRAPHD_EINVALID_ARGUMENT, NULL);

    /* What libgraphd refuses itself. */
    arg.ndim = GRAPHD_MAX_DIMS + 1;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, "dimensions");
    arg = f32_spec(2, good, 0);
    expect(c, graphd_capture(c, 0, &callable, NULL, &g), GRAPHD_EINVALID_ARGUMENT, NULL);
    assert_null(g);

    /* Another session's module. */
    graphd_client_t *other = harness_client(&f->h, "other");
    assert_non_null(other);
    expect(other, graphd_capture(other, 1, &callable, NULL, &g), GRAPHD_EPERMISSION_DENIED, NULL);
    graphd_close(other);

    /* None of it left anything behind. */
    json_t *st = harness_status(c);
    json_t *s = harness_find_int(json_object_get(st, "sessions"), "id", graphd_session_id(c));
    assert_int_equal(harness_int(s, "graphs"), 0);
    assert_int_equal(harness_int(s, "regions"), 0);
    json_decref(st);
    g = capture_mlp(c, f, 0);
    replays_fine(c, g);
    graphd_close(c);
    graphd_graph_release(g); /* the session is over: only frees the handle, and c */

    /* Without a session. */
    assert_int_equal(graphd_connect(f->h.address, &c), GRAPHD_OK);
    uint64_t id = 0;
    expect(c, graphd_module_register(c, "x", 1, NULL, &id), GRAPHD_EFAILED_PRECONDITION, NULL);
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_EFAILED_PRECONDITION, NULL);
    graphd_close(c);
}

static void bad_archives(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "archives");
    assert_non_null(c);
    uint64_t id = 7;
    const char garbage[] = "this is not a zip archive at all";
    expect(c, graphd_module_register(c, garbage, sizeof(garbage), NULL, &id),
           GRAPHD_EINVALID_ARGUMENT, "not a ZIP archive");
    assert_int_equal(id, 0);
    size_t len = 0;
    void *bytes = harness_models_read(&f->m, "mlp.pt", &len);
    assert_non_null(bytes);
    expect(c, graphd_module_register(c, bytes, len / 2, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "truncated");
    free(bytes);
    bytes = harness_models_read(&f->m, "notmodel.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "no version record");
    free(bytes);
    /* Code that does not compile: libtorch's message, on one line. */
    bytes = harness_models_read(&f->m, "badcode.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "not a loadable TorchScript archive: ");
    assert_null(strchr(graphd_last_error(c), '\n'));
    free(bytes);
    /* A tensor view past its storage (it read 64 KiB of the daemon's heap through a region, and
     * crashed the daemon at 256 KiB): refused at registration. */
    bytes = harness_models_read(&f->m, "badview.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "has a view of 65536 bytes over a storage of 16");
    free(bytes);
    /* A module that maps a file (the daemon's user can open /etc/passwd, and through
     * /proc/self/fd other sessions' regions), when called or while its archive loads. */
    bytes = harness_models_read(&f->m, "fromfile.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "names 'from_file', which reaches outside the module's tensors");
    free(bytes);
    bytes = harness_models_read(&f->m, "setstate.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "names 'from_file'");
    free(bytes);
    bytes = harness_models_read(&f->m, "alias.pt", &len);
    expect(c, graphd_module_register(c, bytes, len, NULL, &id), GRAPHD_EINVALID_ARGUMENT,
           "names '_reshape_alias'");
    free(bytes);
    expect(c, graphd_module_register(c, NULL, 0, NULL, &id), GRAPHD_EINVALID_ARGUMENT, NULL);
    expect(c, graphd_module_release(c, 424242), GRAPHD_ENOT_FOUND, NULL);

    json_t *st = harness_status(c);
    json_t *s = harness_find_int(json_object_get(st, "sessions"), "id", graphd_session_id(c));
    assert_int_equal(harness_int(s, "modules"), 0);
    json_decref(st);
    graphd_close(c);
}

static long long modules_loaded(graphd_client_t *c)
{
    json_t *st = harness_status(c);
    long long n = harness_int(json_object_get(st, "daemon"), "modules_loaded");
    json_decref(st);
    return n;
}

static void same_bytes_loaded_once(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *a = harness_client(&f->h, "twice-a");
    graphd_client_t *b = harness_client(&f->h, "twice-b");
    assert_non_null(a);
    assert_non_null(b);
    long long base = modules_loaded(a);
    uint64_t m1 = register_model(a, f, "two_a.pt");
    assert_int_equal(modules_loaded(a), base + 1);
    uint64_t m2 = register_model(a, f, "two_a.pt");
    uint64_t m3 = register_model(b, f, "two_a.pt");
    assert_true(m1 != m2 && m2 != m3);
    assert_int_equal(modules_loaded(a), base + 1);
    expect(a, graphd_module_release(a, m1), GRAPHD_OK, NULL);
    expect(a, graphd_module_release(a, m2), GRAPHD_OK, NULL);
    assert_int_equal(modules_loaded(a), base + 1); /* b still holds it */
    expect(a, graphd_module_release(a, m3), GRAPHD_EPERMISSION_DENIED, NULL);
    graphd_close(b);
    assert_int_equal(modules_loaded(a), base);
    graphd_close(a);
}

static void pool_too_small_for_the_capture(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "tiny");
    assert_non_null(c);
    /* two_a needs 16 KiB and two_b 12 KiB of static region: the first fits, the second not. */
    assert_int_equal(graphd_pool_create(c, "it-tiny", NULL, 20480, NULL), GRAPHD_OK);
    uint64_t ma = register_model(c, f, "two_a.pt"), mb = register_model(c, f, "two_b.pt");
    const int64_t xa[2] = {16, 16}, xb[2] = {16, 12};
    graphd_tensor_spec_t arg_a = f32_spec(2, xa, 0), arg_b = f32_spec(2, xb, 1);
    graphd_callable_t callables[2] = {{ma, NULL, 1, &arg_a}, {mb, NULL, 1, &arg_b}};
    graphd_capture_opts_t opts;
    graphd_capture_opts_init(&opts);
    opts.pool = "it-tiny";
    graphd_graph_t *g[2] = {(graphd_graph_t *)1, (graphd_graph_t *)1};
    for (int attempt = 0; attempt < 3; attempt++) {
        /* Callable 0's region was taken before callable 1's failed: it must be given back. */
        expect(c, graphd_capture(c, 2, callables, &opts, g), GRAPHD_ERESOURCE_EXHAUSTED,
               "for callable 1");
        assert_null(g[0]);
        assert_null(g[1]);
        json_t *st = harness_status(c);
        json_t *pool = status_pool(st, "it-tiny");
        assert_int_equal(harness_int(pool, "reserved_bytes"), 0);
        assert_int_equal(harness_int(pool, "regions"), 0);
        assert_int_equal(harness_int(pool, "graphs"), 0);
        json_t *s = harness_find_int(json_object_get(st, "sessions"), "id", graphd_session_id(c));
        assert_int_equal(harness_int(s, "graphs"), 0);
        assert_int_equal(harness_int(s, "regions"), 0);
        json_decref(st);
    }
    /* One callable alone fits, and a pool the same size serves it. */
    expect(c, graphd_capture(c, 1, callables, &opts, g), GRAPHD_OK, NULL);
    replays_fine(c, g[0]);
    expect(c, graphd_pool_delete(c, "it-tiny"), GRAPHD_EFAILED_PRECONDITION, NULL);
    expect(c, graphd_graph_release(g[0]), GRAPHD_OK, NULL);
    expect(c, graphd_pool_delete(c, "it-tiny"), GRAPHD_OK, NULL);
    graphd_close(c);
}

/* ---- replay ----------------------------------------------------------------------------- */

static void unknown_and_released_graphs(void **state)
{
    fixture_t *f = *state;
    int fd;
    graphd_client_t *c = dp_client_with_fd(&f->h, "released", &fd);
    graphd_graph_t *keep = capture_mlp(c, f, 0);
    graphd_graph_t *gone = capture_mlp(c, f, 0);
    uint64_t gone_id = graphd_graph_id(gone);
    expect(c, graphd_graph_release(gone), GRAPHD_OK, NULL);

    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    /* On the client's own socket: a reply, not a closed connection. */
    assert_int_equal(dp_replay(fd, 1ull << 40, gone_id, 0, msg, sizeof(msg)), NOT_FOUND);
    assert_non_null(strstr(msg, "no graph"));
    assert_int_equal(dp_replay(fd, (1ull << 40) + 1, 987654321, 1, msg, sizeof(msg)), NOT_FOUND);
    assert_int_equal(dp_replay(fd, (1ull << 40) + 2, graphd_graph_id(keep), 7, msg, sizeof(msg)),
                     INVALID_ARGUMENT);
    replays_fine(c, keep); /* the client's stream is still in step */
    expect(c, graphd_replay(keep, 2, NULL), GRAPHD_EINVALID_ARGUMENT, "phase");
    expect(c, graphd_replay_rpc(keep, -1, NULL), GRAPHD_EINVALID_ARGUMENT, NULL);

    /* Through gRPC and another session's socket alike. */
    raw_session_t s;
    raw_session(&f->h, &s);
    char details[256];
    assert_int_equal(raw_graph_call(&f->h, &s, gone_id, 0, details, sizeof(details)), NOT_FOUND);
    assert_int_equal(raw_graph_call(&f->h, &s, 987654321, 1, details, sizeof(details)), NOT_FOUND);
    assert_int_equal(raw_graph_call(&f->h, &s, gone_id, -1, details, sizeof(details)), NOT_FOUND);
    assert_int_equal(dp_replay(s.fd, 5, gone_id, 0, msg, sizeof(msg)), NOT_FOUND);
    close(s.fd);
    replays_fine(c, keep);
    expect(c, graphd_graph_release(keep), GRAPHD_OK, NULL);
    graphd_close(c);
}

static void session_gone(graphd_client_t *watch, uint64_t sid, uint64_t gid);

/* Ordered replays (CUDA IPC events) on a daemon without CUDA devices, and the malformed
 * frames around them: refused with a reply, the session going on; only a wrong message length
 * breaks the stream. */
/* These two are about a daemon without CUDA devices; on a GPU machine tests/python/test_cuda.py
 * covers ordered and posted replays. */
static void skip_on_a_cuda_machine(fixture_t *f)
{
    graphd_client_t *c = harness_client(&f->h, "devices");
    assert_non_null(c);
    json_t *st = harness_status(c);
    size_t i;
    json_t *d;
    int cuda = 0;
    json_array_foreach(json_object_get(st, "devices"), i, d)
    {
        const char *kind = json_string_value(json_object_get(d, "kind"));
        cuda |= kind != NULL && strcmp(kind, "cuda") == 0;
    }
    json_decref(st);
    graphd_close(c);
    if (cuda) {
        fprintf(stderr, "skipped: the daemon has CUDA devices (test_cuda.py covers them)\n");
        skip();
    }
}

static void ordered_replays_without_cuda(void **state)
{
    fixture_t *f = *state;
    skip_on_a_cuda_machine(f);
    int fd;
    graphd_client_t *c = dp_client_with_fd(&f->h, "ordered", &fd);
    graphd_graph_t *g = capture_mlp(c, f, 0);
    uint64_t gid = graphd_graph_id(g);
    char msg[GRAPHD_FRAME_MAX_MSG + 1];

    /* An ordered REPLAY without EVENTS first, and unknown flags. */
    assert_int_equal(dp_replay(fd, 1ull << 41, gid, GRAPHD_REPLAY_ORDERED, msg, sizeof(msg)),
                     FAILED_PRECONDITION);
    assert_non_null(strstr(msg, "EVENTS"));
    assert_int_equal(dp_replay(fd, (1ull << 41) + 1, gid, 0x400, msg, sizeof(msg)),
                     INVALID_ARGUMENT);
    assert_non_null(strstr(msg, "flags"));

    /* EVENTS for a device the daemon does not have (ids are GRAPHD_DEVICE_CODEs), for a device
     * whose family has no ordering primitives (cpu:0 is code 0, which frame version 1 read as
     * cuda:0), and for a code of no family. */
    static const struct {
        uint64_t id;
        int status;
        const char *says;
    } cases[] = {
        {GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, 0), NOT_FOUND, "cuda:0"},
        {GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CPU, 0), UNIMPLEMENTED, "cpu:0 has no events"},
        {GRAPHD_DEVICE_CODE(3, 0), INVALID_ARGUMENT, "GRAPHD_DEVICE_CODE"},
        {1000, INVALID_ARGUMENT, "GRAPHD_DEVICE_CODE"},
    };
    graphd_frame_t rep;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        uint8_t raw[GRAPHD_FRAME_SIZE + GRAPHD_IPC_HANDLE_SIZE];
        graphd_frame_t req = {.magic = GRAPHD_FRAME_MAGIC,
                              .version = GRAPHD_FRAME_VERSION,
                              .type = GRAPHD_FRAME_EVENTS,
                              .seq = (1ull << 41) + 100 + i,
                              .id = cases[i].id,
                              .msg_len = GRAPHD_IPC_HANDLE_SIZE};
        graphd_frame_encode(&req, raw);
        memset(raw + GRAPHD_FRAME_SIZE, 0x5a, GRAPHD_IPC_HANDLE_SIZE);
        dp_send(fd, raw, sizeof(raw));
        dp_recv_frame(fd, &rep, msg, sizeof(msg));
        assert_int_equal(rep.type, GRAPHD_FRAME_EVENTS | GRAPHD_FRAME_REPLY);
        assert_int_equal(rep.seq, req.seq);
        assert_int_equal(rep.status, cases[i].status);
        assert_non_null(strstr(msg, cases[i].says));
    }
    replays_fine(c, g); /* still in step */

    /* libgraphd refuses a stream-ordered replay of a host graph before any CUDA call. */
    expect(c, graphd_replay_stream(g, GRAPHD_PHASE_FORWARD, NULL, NULL), GRAPHD_EINVALID_ARGUMENT,
           "host-staged");

    /* EVENTS without its handle: the message length is part of the frame, so a wrong one is a
     * protocol error that closes the session. */
    uint64_t sid = graphd_session_id(c);
    graphd_client_t *bystander = harness_client(&f->h, "bystander");
    assert_non_null(bystander);
    dp_send_frame(fd, GRAPHD_FRAME_EVENTS, (1ull << 41) + 3, 0, 0);
    expect_error_then_close(fd, "EVENTS without a handle");
    session_gone(bystander, sid, gid);
    graphd_close(c);
    graphd_graph_release(g); /* the session is over: only frees the handle, and c */
    graphd_close(bystander);
}

/* Posted replays (sequence counters) on a daemon without CUDA devices: SEQ is refused with a
 * reply; a posted REPLAY the daemon cannot take in sequence ends the session, since the client's
 * stream would wait for its done forever otherwise. */
static void posted_replays_without_cuda(void **state)
{
    fixture_t *f = *state;
    skip_on_a_cuda_machine(f);
    int fd;
    graphd_client_t *c = dp_client_with_fd(&f->h, "posted", &fd);
    graphd_graph_t *g = capture_mlp(c, f, 0);
    uint64_t gid = graphd_graph_id(g);
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    graphd_frame_t rep;

    dp_send_frame(fd, GRAPHD_FRAME_SEQ, 1ull << 42, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, 0), 0);
    dp_recv_frame(fd, &rep, msg, sizeof(msg));
    assert_int_equal(rep.type, GRAPHD_FRAME_SEQ | GRAPHD_FRAME_REPLY);
    assert_int_equal(rep.seq, 1ull << 42);
    assert_int_equal(rep.status, NOT_FOUND);
    assert_non_null(strstr(msg, "cuda:0"));
    dp_send_frame(fd, GRAPHD_FRAME_SEQ, (1ull << 42) + 10, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CPU, 0),
                  0);
    dp_recv_frame(fd, &rep, msg, sizeof(msg));
    assert_int_equal(rep.status, UNIMPLEMENTED);
    assert_non_null(strstr(msg, "cpu:0 has no sequence counters"));
    replays_fine(c, g); /* still in step */

    uint64_t sid = graphd_session_id(c);
    graphd_client_t *bystander = harness_client(&f->h, "bystander");
    assert_non_null(bystander);
    uint64_t arg = GRAPHD_PHASE_FORWARD | GRAPHD_REPLAY_POSTED |
                   (GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_CUDA, 0) << GRAPHD_REPLAY_DEVICE_SHIFT) |
                   (1ull << GRAPHD_REPLAY_SEQ_SHIFT);
    dp_send_frame(fd, GRAPHD_FRAME_REPLAY, (1ull << 42) + 1, gid, arg);
    dp_recv_frame(fd, &rep, msg, sizeof(msg));
    assert_int_equal(rep.type, GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY);
    assert_int_equal(rep.seq, (1ull << 42) + 1);
    assert_int_equal(rep.status, FAILED_PRECONDITION);
    assert_non_null(strstr(msg, "SEQ"));
    uint8_t more;
    assert_int_equal(dp_read(fd, &more, 1), 0); /* EOF: the session is over */
    session_gone(bystander, sid, gid);
    graphd_close(c);
    graphd_graph_release(g); /* the session is over: only frees the handle, and c */
    graphd_close(bystander);
}

static void another_sessions_graph(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *owner = harness_client(&f->h, "owner");
    assert_non_null(owner);
    graphd_graph_t *g = capture_mlp(owner, f, 0);
    uint64_t gid = graphd_graph_id(g);

    raw_session_t s;
    raw_session(&f->h, &s);
    char msg[GRAPHD_FRAME_MAX_MSG + 1], details[256];
    assert_int_equal(dp_replay(s.fd, 9, gid, 0, msg, sizeof(msg)), PERMISSION_DENIED);
    assert_non_null(strstr(msg, "another session"));
    assert_int_equal(raw_graph_call(&f->h, &s, gid, 0, details, sizeof(details)),
                     PERMISSION_DENIED);
    assert_int_equal(raw_graph_call(&f->h, &s, gid, 1, details, sizeof(details)),
                     PERMISSION_DENIED);
    assert_int_equal(raw_graph_call(&f->h, &s, gid, -1, details, sizeof(details)),
                     PERMISSION_DENIED);
    close(s.fd);

    /* A libgraphd client of another session, on its own socket, too. */
    int fd;
    graphd_client_t *thief = dp_client_with_fd(&f->h, "thief", &fd);
    assert_int_equal(dp_replay(fd, 77, gid, 1, msg, sizeof(msg)), PERMISSION_DENIED);
    graphd_close(thief);

    replays_fine(owner, g);
    expect(owner, graphd_graph_release(g), GRAPHD_OK, NULL);
    graphd_close(owner);
}

static void backward_before_forward(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "order");
    assert_non_null(c);
    graphd_graph_t *g = capture_mlp(c, f, 1);
    for (int path = 0; path < 2; path++) {
        int (*replay)(graphd_graph_t *, int, uint64_t *) =
            path == 0 ? graphd_replay : graphd_replay_rpc;
        expect(c, replay(g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION, "FORWARD");
        expect(c, replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
        expect(c, replay(g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_OK, NULL);
        expect(c, replay(g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
    }
    /* An eval-mode graph has no backward at all. */
    const int64_t s[2] = {4, 6};
    graphd_tensor_spec_t arg = f32_spec(2, s, 0);
    graphd_callable_t callable = {register_model(c, f, "eval.pt"), NULL, 1, &arg};
    graphd_graph_t *e;
    expect(c, graphd_capture(c, 1, &callable, NULL, &e), GRAPHD_OK, NULL);
    expect(c, graphd_replay(e, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
    expect(c, graphd_replay(e, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
    expect(c, graphd_replay_rpc(e, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
    expect(c, graphd_graph_release(e), GRAPHD_OK, NULL);
    expect(c, graphd_graph_release(g), GRAPHD_OK, NULL);
    graphd_close(c);
}

static void throwing_forward_stays_usable(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *c = harness_client(&f->h, "throws");
    assert_non_null(c);
    const int64_t xs[2] = {2, 4};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 1);
    graphd_callable_t callable = {register_model(c, f, "throws.pt"), NULL, 1, &arg};
    graphd_graph_t *g;
    expect(c, graphd_capture(c, 1, &callable, NULL, &g), GRAPHD_OK, NULL);
    harness_graph_t hg;
    assert_int_equal(harness_graph_load(&hg, c, g), 0);
    float *x = harness_tensor(&hg, GRAPHD_ROLE_INPUT, 0)->data;
    for (int path = 0; path < 2; path++) {
        int (*replay)(graphd_graph_t *, int, uint64_t *) =
            path == 0 ? graphd_replay : graphd_replay_rpc;
        for (int i = 0; i < 8; i++)
            x[i] = 1e7f;
        expect(c, replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EINTERNAL, "input sum too large");
        expect(c, replay(g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
        for (int i = 0; i < 8; i++)
            x[i] = 0.5f;
        expect(c, replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
        expect(c, replay(g, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_OK, NULL);
    }
    json_t *st = harness_status(c);
    json_t *gs = harness_find_int(json_object_get(st, "graphs"), "id", graphd_graph_id(g));
    assert_int_equal(harness_int(gs, "replay_errors"), 4);
    assert_int_equal(harness_int(gs, "replays_forward"), 2);
    assert_int_equal(harness_int(gs, "replays_backward"), 2);
    json_decref(st);
    assert_int_equal(harness_graph_release(&hg), GRAPHD_OK);
    graphd_close(c);
}

/* ---- the session socket ----------------------------------------------------------------- */

/* Waits up to a second for session id to leave status with its graphs. */
static void session_gone(graphd_client_t *watch, uint64_t sid, uint64_t gid)
{
    int gone = 0;
    for (int64_t t0 = harness_now_ms(); !gone && harness_now_ms() - t0 < 1000;) {
        json_t *st = harness_status(watch);
        gone = harness_find_int(json_object_get(st, "sessions"), "id", sid) == NULL &&
               harness_find_int(json_object_get(st, "graphs"), "id", gid) == NULL;
        json_decref(st);
        if (!gone)
            usleep(20000);
    }
    if (!gone)
        fail_msg("session %llu or its graph %llu still in status after 1 s",
                 (unsigned long long)sid, (unsigned long long)gid);
}

static void garbage_on_a_session_with_graphs(void **state)
{
    fixture_t *f = *state;
    graphd_client_t *bystander = harness_client(&f->h, "bystander");
    assert_non_null(bystander);
    graphd_graph_t *bg = capture_mlp(bystander, f, 1);

    const struct {
        const char *what;
        size_t len;
        int shut;
    } cases[] = {{"40 bytes of garbage", GRAPHD_FRAME_SIZE, 0}, {"a truncated frame", 10, 1}};
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        int fd;
        graphd_client_t *c = dp_client_with_fd(&f->h, "victim", &fd);
        graphd_graph_t *g = capture_mlp(c, f, 1);
        expect(c, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
        uint64_t sid = graphd_session_id(c), gid = graphd_graph_id(g);

        uint8_t junk[GRAPHD_FRAME_SIZE];
        memset(junk, 0xee, sizeof(junk));
        dp_send(fd, junk, cases[k].len);
        if (cases[k].shut)
            shutdown(fd, SHUT_WR);
        expect_error_then_close(fd, cases[k].what);
        session_gone(bystander, sid, gid);

        /* libgraphd finds the socket closed, and the session over. */
        int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
        assert_true(rc == GRAPHD_EUNAVAILABLE || rc == GRAPHD_EINVALID_ARGUMENT);
        assert_int_equal(graphd_session_id(c), 0);
        expect(c, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
        graphd_close(c);
        assert_int_equal(graphd_graph_release(g), GRAPHD_EFAILED_PRECONDITION); /* frees c */

        /* Everyone else goes on. */
        expect(bystander, graphd_replay(bg, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
        expect(bystander, graphd_replay_rpc(bg, GRAPHD_PHASE_BACKWARD, NULL), GRAPHD_OK, NULL);
    }
    expect(bystander, graphd_graph_release(bg), GRAPHD_OK, NULL);
    graphd_close(bystander);
}

/* A daemon or an executor that does not answer: the replay gives up after GRAPHD_TIMEOUT_MS. On
 * the session socket that ends the session in the client (its stream is out of step); on a replay
 * connection it closes only that connection. Once they run again, they go on. */
static void replay_timeout(void **state)
{
    fixture_t *f = *state;
    /* The session socket (GRAPHD_DIRECT=0): the daemon stops answering. The stream is out of step
     * after a timeout, so the session ends. */
    setenv("GRAPHD_TIMEOUT_MS", "1000", 1);
    setenv("GRAPHD_DIRECT", "0", 1);
    graphd_client_t *c = harness_client(&f->h, "impatient");
    unsetenv("GRAPHD_DIRECT");
    graphd_client_t *d = harness_client(&f->h, "impatient-direct");
    unsetenv("GRAPHD_TIMEOUT_MS");
    assert_non_null(c);
    assert_non_null(d);
    graphd_graph_t *g = capture_mlp(c, f, 0);
    expect(c, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
    assert_int_equal(kill(f->h.pid, SIGSTOP), 0);
    int64_t t0 = harness_now_ms();
    int rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    int64_t waited = harness_now_ms() - t0;
    assert_int_equal(kill(f->h.pid, SIGCONT), 0);
    expect(c, rc, GRAPHD_EDEADLINE_EXCEEDED, "1000 ms");
    if (waited < 950 || waited > 5000)
        fail_msg("the replay gave up after %lld ms, want about 1000", (long long)waited);
    assert_int_equal(graphd_session_id(c), 0);
    expect(c, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_EFAILED_PRECONDITION, NULL);
    graphd_close(c);
    graphd_graph_release(g); /* the session is over: only frees the handle, and c */

    /* A replay connection: its executor stops answering. Only that connection is out of step:
     * it is closed, the session goes on, and the next replay opens a new one. */
    g = capture_mlp(d, f, 0);
    expect(d, graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL), GRAPHD_OK, NULL);
    json_t *st = harness_status(d);
    json_t *x = harness_find(json_object_get(st, "executors"), "device", "cpu:0");
    assert_non_null(x);
    pid_t pid = (pid_t)harness_int(x, "pid");
    json_decref(st);
    assert_true(pid > 0);
    assert_int_equal(kill(pid, SIGSTOP), 0);
    t0 = harness_now_ms();
    rc = graphd_replay(g, GRAPHD_PHASE_FORWARD, NULL);
    waited = harness_now_ms() - t0;
    assert_int_equal(kill(pid, SIGCONT), 0);
    expect(d, rc, GRAPHD_EDEADLINE_EXCEEDED, "replay connection");
    if (waited < 950 || waited > 5000)
        fail_msg("the replay gave up after %lld ms, want about 1000", (long long)waited);
    assert_true(graphd_session_id(d) != 0);
    replays_fine(d, g);
    expect(d, graphd_graph_release(g), GRAPHD_OK, NULL);
    graphd_close(d);

    graphd_client_t *other = harness_client(&f->h, "patient");
    assert_non_null(other);
    g = capture_mlp(other, f, 0);
    replays_fine(other, g);
    expect(other, graphd_graph_release(g), GRAPHD_OK, NULL);
    graphd_close(other);
}

/* A forward that allocates 256 MiB under max_call_memory_bytes = 64 MiB: that capture fails with
 * RESOURCE_EXHAUSTED naming the bound (it used to take the machine's memory and get the daemon
 * OOM-killed), and another session captures and replays on the same device meanwhile. */
static void call_over_the_memory_bound(void **state)
{
    (void)state;
    static const char *const args[] = {"--max-call-memory-bytes", "64Mi", NULL};
    fixture_t own;
    assert_int_equal(harness_fixture_start(&own, args), 0);
    graphd_client_t *greedy = harness_client(&own.h, "greedy");
    graphd_client_t *other = harness_client(&own.h, "other");
    assert_non_null(greedy);
    assert_non_null(other);
    const int64_t xs[2] = {2, 4};
    graphd_tensor_spec_t arg = f32_spec(2, xs, 1);
    graphd_callable_t callable = {register_model(greedy, &own, "hungry.pt"), NULL, 1, &arg};
    graphd_graph_t *g = (graphd_graph_t *)1;
    expect(greedy, graphd_capture(greedy, 1, &callable, NULL, &g), GRAPHD_ERESOURCE_EXHAUSTED,
           "over 67108864 (max_call_memory_bytes)");
    graphd_graph_t *fine = capture_mlp(other, &own, 1);
    replays_fine(other, fine);
    expect(other, graphd_graph_release(fine), GRAPHD_OK, NULL);
    graphd_close(other);
    graphd_close(greedy);
    assert_int_equal(harness_fixture_stop(&own), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(sample_specs_the_module_rejects),
        cmocka_unit_test(bad_archives),
        cmocka_unit_test(same_bytes_loaded_once),
        cmocka_unit_test(pool_too_small_for_the_capture),
        cmocka_unit_test(unknown_and_released_graphs),
        cmocka_unit_test(ordered_replays_without_cuda),
        cmocka_unit_test(posted_replays_without_cuda),
        cmocka_unit_test(another_sessions_graph),
        cmocka_unit_test(backward_before_forward),
        cmocka_unit_test(throwing_forward_stays_usable),
        cmocka_unit_test(garbage_on_a_session_with_graphs),
        cmocka_unit_test(replay_timeout),
        cmocka_unit_test(call_over_the_memory_bound),
    };
    return cmocka_run_group_tests_name("graphs_bad_input", tests, harness_fixture_group_setup,
                                       harness_fixture_group_teardown);
}
