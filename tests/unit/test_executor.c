/*
 * Unit tests for the executor process (graph_runtime/executor.c): the test spawns
 * $BUILD/graphd-executor with two socketpairs at fds 3 and 4, drives it over the channel of
 * exec_proto.h as the daemon would, and checks a capture and replay against the same capture done
 * in this process with gr_ calls, bit for bit. Then hostile requests: each gets its error and the
 * executor goes on; a broken frame ends it non-zero, EOF ends it with 0, and a descriptor leaked
 * into it is closed.
 *
 * The model is traced at group setup by /usr/bin/python3 (GRAPHD_PYTHON overrides) into a fresh
 * temporary directory, removed at teardown.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "exec_proto.h"
#include "runtime.h"

#define LEAKED_FD 77 /* opened without CLOEXEC before the spawn: must not reach the executor */
#define IN_ROWS 5
#define IN_COLS 8

static const char MODEL_PY[] = "import sys, torch, torch.nn as nn\n"
                               "torch.manual_seed(7)\n"
                               "m = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))\n"
                               "torch.jit.trace(m, (torch.randn(5, 8),)).save(sys.argv[1])\n";

static struct {
    char dir[64];
    char model[128];
    void *archive;
    size_t archive_len;
    char exe[4096];
} G;

typedef struct executor {
    pid_t pid;
    int ch;  /* our end of its fd 3 */
    int urg; /* our end of its fd 4 */
    uint64_t seq;
} executor_t;

typedef struct reply {
    gx_msg_hdr_t hdr;
    uint8_t *p;
} reply_t;

/* ---- helpers ---------------------------------------------------------------------------- */

static void *read_all(const char *path, size_t *len)
{
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

/* $BUILD/graphd-executor: BUILD from the environment, else the build dir this test is in. */
static void find_executor(void)
{
    const char *build = getenv("BUILD");
    if (build && *build) {
        snprintf(G.exe, sizeof G.exe, "%s/graphd-executor", build);
        return;
    }
    char self[2048];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n > 0) {
        self[n] = '\0';
        for (int up = 0; up < 3; up++) { /* build/tests/unit/test_executor => build */
            char *slash = strrchr(self, '/');
            if (slash)
                *slash = '\0';
        }
        snprintf(G.exe, sizeof G.exe, "%s/graphd-executor", self);
        if (access(G.exe, X_OK) == 0)
            return;
    }
    snprintf(G.exe, sizeof G.exe, "build/graphd-executor");
}

/* Starts the executor with argv extra (NULL-terminated), LEAKED_FD open without CLOEXEC. */
static executor_t spawn_with(const char *const *extra)
{
    executor_t ex = {0};
    int ch[2], urg[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ch), 0);
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, urg), 0);
    int leak = open("/dev/null", O_RDONLY);
    assert_true(leak >= 0);
    assert_int_equal(dup2(leak, LEAKED_FD), LEAKED_FD); /* dup2: no CLOEXEC */
    close(leak);
    const char *argv[32] = {G.exe, "--device", "cpu:0", "--intra-op-threads", "1"};
    size_t n = 5;
    for (size_t i = 0; extra && extra[i] && n < 31; i++)
        argv[n++] = extra[i];
    argv[n] = NULL;
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        /* Above 4 first, so that dup2 to 3 and 4 never meets itself (and clears CLOEXEC). */
        int a = fcntl(ch[1], F_DUPFD, 10), b = fcntl(urg[1], F_DUPFD, 10);
        if (a < 0 || b < 0 || dup2(a, GX_CHANNEL_FD) < 0 || dup2(b, GX_URGENT_FD) < 0)
            _exit(126);
        execv(G.exe, (char *const *)argv);
        _exit(127);
    }
    close(LEAKED_FD);
    close(ch[1]);
    close(urg[1]);
    ex.pid = pid;
    ex.ch = ch[0];
    ex.urg = urg[0];
    return ex;
}

static void write_full(int fd, const void *p, size_t n, const int *fds, size_t nfds)
{
    size_t done = 0;
    while (done < n) {
        struct iovec iov = {(uint8_t *)p + done, n - done};
        struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
        union {
            char b[CMSG_SPACE(sizeof(int) * GX_MAX_FDS)];
            struct cmsghdr align;
        } ctl;
        if (done == 0 && nfds > 0) {
            mh.msg_control = ctl.b;
            mh.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
            struct cmsghdr *c = CMSG_FIRSTHDR(&mh);
            c->cmsg_level = SOL_SOCKET;
            c->cmsg_type = SCM_RIGHTS;
            c->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
            memcpy(CMSG_DATA(c), fds, sizeof(int) * nfds);
        }
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        assert_true(r > 0);
        done += (size_t)r;
    }
}

static int read_full(int fd, void *p, size_t n)
{
    size_t done = 0;
    while (done < n) {
        ssize_t r = read(fd, (uint8_t *)p + done, n - done);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        done += (size_t)r;
    }
    return 0;
}

/* Sends a request with header fields as given (nfds_hdr: the header's count). */
static void send_raw(executor_t *ex, uint32_t magic, uint32_t op, const gx_wbuf_t *b,
                     const int *fds, size_t nfds, uint32_t nfds_hdr)
{
    size_t len = b ? b->len : 0;
    gx_msg_hdr_t h = {magic, op, ++ex->seq, len, 0, nfds_hdr};
    uint8_t *msg = malloc(sizeof h + len);
    memcpy(msg, &h, sizeof h);
    if (len)
        memcpy(msg + sizeof h, b->data, len);
    write_full(ex->ch, msg, sizeof h + len, fds, nfds);
    free(msg);
}

static void get_reply(executor_t *ex, uint32_t op, reply_t *r)
{
    memset(r, 0, sizeof *r);
    assert_int_equal(read_full(ex->ch, &r->hdr, sizeof r->hdr), 0);
    assert_int_equal(r->hdr.magic, GX_MAGIC);
    assert_int_equal(r->hdr.op, op);
    assert_int_equal(r->hdr.nfds, 0);
    if (op != GX_OP_READY)
        assert_int_equal(r->hdr.seq, ex->seq);
    assert_true(r->hdr.len < (1u << 26));
    r->p = malloc(r->hdr.len + 1);
    assert_int_equal(read_full(ex->ch, r->p, r->hdr.len), 0);
    r->p[r->hdr.len] = '\0'; /* error messages come without a NUL */
}

/* One request and its reply; returns rc. */
static int call_fds(executor_t *ex, uint32_t op, const gx_wbuf_t *b, const int *fds, size_t nfds,
                    reply_t *r)
{
    send_raw(ex, GX_MAGIC, op, b, fds, nfds, (uint32_t)nfds);
    get_reply(ex, op, r);
    return r->hdr.rc;
}

static int call(executor_t *ex, uint32_t op, const gx_wbuf_t *b, reply_t *r)
{
    return call_fds(ex, op, b, NULL, 0, r);
}

/* A call that must fail with want and a message holding needle. */
static void call_fails(executor_t *ex, uint32_t op, const gx_wbuf_t *b, int want,
                       const char *needle)
{
    reply_t r;
    int rc = call(ex, op, b, &r);
    if (rc != want || strstr((char *)r.p, needle) == NULL)
        fail_msg("op %u: got %s '%s', want %s with '%s'", op, gr_err_name(rc), (char *)r.p,
                 gr_err_name(want), needle);
    free(r.p);
}

static void ok(int rc, const reply_t *r, const char *what)
{
    if (rc != GR_OK)
        fail_msg("%s: %s: %s", what, gr_err_name(rc), (char *)r->p);
}

static gx_rbuf_t rbuf(const reply_t *r)
{
    gx_rbuf_t b = {r->p, (size_t)r->hdr.len, 0, false};
    return b;
}

static void read_ready(executor_t *ex, int sandboxed)
{
    reply_t r;
    get_reply(ex, GX_OP_READY, &r);
    assert_int_equal(r.hdr.rc, GR_OK);
    gx_rbuf_t b = rbuf(&r);
    char version[64], off[256];
    gx_get_str(&b, version, sizeof version);
    uint32_t nnp = gx_get_u32(&b);
    uint32_t landlock = gx_get_u32(&b);
    uint32_t seccomp = gx_get_u32(&b);
    gx_get_str(&b, off, sizeof off);
    assert_false(b.bad);
    assert_int_equal(b.pos, b.len);
    assert_string_equal(version, gr_runtime_torch_version());
    assert_int_equal(nnp, 1); /* always, sandbox or not */
    if (sandboxed) {
        assert_int_equal(seccomp, 1);
        if (landlock == 0) /* a kernel without Landlock: READY says so */
            assert_non_null(strstr(off, "landlock"));
        else
            assert_string_equal(off, "");
    } else {
        assert_int_equal(landlock, 0);
        assert_int_equal(seccomp, 0);
        assert_non_null(strstr(off, "executor_sandbox is 0"));
    }
    free(r.p);
}

static executor_t spawn(void)
{
    executor_t ex = spawn_with(NULL);
    read_ready(&ex, 1);
    return ex;
}

/* Waits for the executor to exit; its wait status. */
static int reap(executor_t *ex)
{
    int status = 0;
    for (int i = 0; i < 1000; i++) { /* up to 10 s */
        pid_t p = waitpid(ex->pid, &status, WNOHANG);
        if (p == ex->pid) {
            close(ex->ch);
            close(ex->urg);
            return status;
        }
        usleep(10000);
    }
    kill(ex->pid, SIGKILL);
    waitpid(ex->pid, &status, 0);
    close(ex->ch);
    close(ex->urg);
    fail_msg("the executor did not exit within 10 s of its request");
    return -1;
}

/* EOF on the channel: the executor exits 0. */
static void finish(executor_t *ex)
{
    shutdown(ex->ch, SHUT_WR);
    int status = reap(ex);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static uint64_t load_module(executor_t *ex)
{
    gx_wbuf_t b = {0};
    gx_put_bytes(&b, G.archive, G.archive_len);
    reply_t r;
    ok(call(ex, GX_OP_MODULE_LOAD, &b, &r), &r, "MODULE_LOAD");
    gx_wbuf_free(&b);
    gx_rbuf_t rb = rbuf(&r);
    uint64_t id = gx_get_u64(&rb);
    gr_module_info_t info;
    gx_get(&rb, &info, sizeof info);
    assert_false(rb.bad);
    assert_int_equal(rb.pos, rb.len);
    assert_int_equal(info.archive_bytes, G.archive_len);
    assert_int_equal(info.n_parameters, 4);
    free(r.p);
    return id;
}

static float sample[IN_ROWS * IN_COLS];

/* A CAPTURE_PREPARE payload for one callable: module, one float32[5, 8] arg. */
static void prepare_payload(gx_wbuf_t *b, uint64_t module, uint32_t ndim, int with_data)
{
    gx_put_str(b, "cpu:0");
    gx_put_i32(b, 2); /* warm-up */
    gx_put_i32(b, 0); /* allow_unused */
    gx_put_u64(b, 0); /* private pool */
    gx_put_i32(b, 0); /* resident */
    gx_put_i32(b, 1); /* copy_param_grads */
    gx_put_i32(b, 1); /* reuse_warmup */
    gx_put_u32(b, 1);
    gx_put_u64(b, module);
    gx_put_str(b, "");
    gx_put_u32(b, 1);
    gx_put_i32(b, GR_DTYPE_F32);
    gx_put_u32(b, ndim);
    gx_put_i64(b, IN_ROWS);
    gx_put_i64(b, IN_COLS);
    for (uint32_t k = 2; k < ndim; k++)
        gx_put_i64(b, 1);
    gx_put_i32(b, 0); /* requires_grad */
    if (with_data)
        gx_put_bytes(b, sample, sizeof sample);
    else
        gx_put_bytes(b, NULL, 0);
}

/* CAPTURE_PREPARE of the model; the capture id, its block size in *total. */
static uint64_t prepare(executor_t *ex, uint64_t module, uint64_t *total)
{
    gx_wbuf_t b = {0};
    prepare_payload(&b, module, 2, 1);
    reply_t r;
    ok(call(ex, GX_OP_CAPTURE_PREPARE, &b, &r), &r, "CAPTURE_PREPARE");
    gx_wbuf_free(&b);
    gx_rbuf_t rb = rbuf(&r);
    uint64_t id = gx_get_u64(&rb);
    assert_int_equal(gx_get_u32(&rb), 1);
    uint64_t count = gx_get_u64(&rb);
    *total = gx_get_u64(&rb);
    assert_false(rb.bad);
    assert_int_equal(rb.pos, rb.len);
    assert_true(count > 0);
    assert_true(*total > 0);
    free(r.p);
    return id;
}

static int make_memfd(uint64_t bytes)
{
    int fd = memfd_create("test-executor-block", MFD_CLOEXEC);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)bytes), 0);
    return fd;
}

static void finish_payload(gx_wbuf_t *b, uint64_t capture, uint64_t len)
{
    gx_put_u64(b, capture);
    gx_put_u32(b, 1);
    gx_put_u32(b, GX_BLOCK_HOST);
    gx_put_u64(b, len);
}

/* A graph of a CAPTURE_FINISH reply, as the daemon reads it. */
typedef struct rgraph {
    uint64_t id;
    gr_graph_info_t info;
    uint64_t total;
    uint32_t count;
    gr_tensor_desc_t descs[32];
} rgraph_t;

static void parse_graph(gx_rbuf_t *b, rgraph_t *g)
{
    memset(g, 0, sizeof *g);
    g->id = gx_get_u64(b);
    gx_get(b, &g->info, sizeof g->info);
    g->total = gx_get_u64(b);
    g->count = gx_get_u32(b);
    assert_true(g->count <= 32);
    for (uint32_t k = 0; k < g->count && !b->bad; k++) {
        gr_tensor_desc_t *d = &g->descs[k];
        char name[128];
        d->role = gx_get_i32(b);
        d->index = gx_get_u32(b);
        gx_get_str(b, name, sizeof name);
        d->dtype = gx_get_i32(b);
        d->ndim = gx_get_u32(b);
        assert_true(d->ndim <= GR_MAX_DIMS);
        for (uint32_t j = 0; j < d->ndim; j++)
            d->shape[j] = gx_get_i64(b);
        for (uint32_t j = 0; j < d->ndim; j++)
            d->strides[j] = gx_get_i64(b);
        d->offset = gx_get_u64(b);
        d->nbytes = gx_get_u64(b);
        d->flags = gx_get_u32(b);
    }
    uint32_t next = gx_get_u32(b);
    assert_int_equal(next, 0); /* host blocks: no external tensors */
    assert_false(b->bad);
}

static const gr_tensor_desc_t *desc_of(const gr_tensor_desc_t *d, size_t n, int role,
                                       uint32_t index)
{
    for (size_t k = 0; k < n; k++)
        if (d[k].role == role && d[k].index == index)
            return &d[k];
    fail_msg("no %s %u", gr_role_name(role), index);
    return NULL;
}

static void replay(executor_t *ex, uint64_t graph, int phase)
{
    gx_wbuf_t b = {0};
    gx_put_u64(&b, graph);
    gx_put_i32(&b, phase);
    gx_put_u32(&b, GX_REPLAY_PLAIN);
    reply_t r;
    ok(call(ex, GX_OP_GRAPH_REPLAY, &b, &r), &r, "GRAPH_REPLAY");
    assert_int_equal(r.hdr.len, 8);
    gx_wbuf_free(&b);
    free(r.p);
}

static void put_u64_only(gx_wbuf_t *b, uint64_t v)
{
    gx_put_u64(b, v);
}

/* ---- group setup ------------------------------------------------------------------------ */

static int group_setup(void **state)
{
    (void)state;
    find_executor();
    if (access(G.exe, X_OK) != 0) {
        fprintf(stderr, "no executor at %s (make all builds it)\n", G.exe);
        return -1;
    }
    for (size_t i = 0; i < IN_ROWS * IN_COLS; i++)
        sample[i] = (float)((int)(i * 7 % 13) - 6) / 4.0f;
    snprintf(G.dir, sizeof G.dir, "/tmp/graphd-exec-XXXXXX");
    if (mkdtemp(G.dir) == NULL)
        return -1;
    snprintf(G.model, sizeof G.model, "%s/tiny.pt", G.dir);
    const char *python = getenv("GRAPHD_PYTHON");
    if (python == NULL || *python == '\0')
        python = "/usr/bin/python3";
    pid_t pid = fork();
    if (pid == 0) {
        execl(python, python, "-c", MODEL_PY, G.model, (char *)NULL);
        _exit(127);
    }
    int status = 0;
    if (pid < 0 || waitpid(pid, &status, 0) < 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "tracing the test model with %s failed\n", python);
        return -1;
    }
    G.archive = read_all(G.model, &G.archive_len);
    if (G.archive == NULL)
        return -1;
    /* The in-process reference runs on one thread, as the executor does. */
    return gr_runtime_init(1) == GR_OK ? 0 : -1;
}

static int group_teardown(void **state)
{
    (void)state;
    free(G.archive);
    unlink(G.model);
    rmdir(G.dir);
    return 0;
}

/* ---- tests ------------------------------------------------------------------------------ */

/* READY, MODULE_LOAD, CAPTURE_PREPARE/FINISH over a memfd, FORWARD and BACKWARD replays: the
 * whole static block equals the one of the same capture made in this process, bit for bit. */
static void test_capture_replay_matches_in_process(void **state)
{
    (void)state;
    executor_t ex = spawn();
    uint64_t module = load_module(&ex);
    assert_int_equal(module, 1);
    uint64_t total = 0;
    uint64_t capture = prepare(&ex, module, &total);
    assert_int_equal(capture, 1);

    int fd = make_memfd(total);
    gx_wbuf_t b = {0};
    finish_payload(&b, capture, total);
    reply_t r;
    ok(call_fds(&ex, GX_OP_CAPTURE_FINISH, &b, &fd, 1, &r), &r, "CAPTURE_FINISH");
    gx_wbuf_free(&b);
    gx_rbuf_t rb = rbuf(&r);
    assert_int_equal(gx_get_u32(&rb), 1);
    rgraph_t g;
    parse_graph(&rb, &g);
    assert_int_equal(rb.pos, rb.len);
    free(r.p);
    assert_int_equal(g.id, 1);
    assert_int_equal(g.total, total);
    assert_string_equal(g.info.device, "cpu:0");
    assert_int_equal(g.info.has_backward, 1);
    uint8_t *block = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    assert_true(block != MAP_FAILED);
    close(fd);

    /* The same capture in this process. */
    gr_module_t *m = NULL;
    assert_int_equal(gr_module_load(G.archive, G.archive_len, &m), GR_OK);
    gr_arg_spec_t arg = {GR_DTYPE_F32, 2, {IN_ROWS, IN_COLS}, 0, sample};
    gr_callable_spec_t spec = {m, NULL, 1, &arg};
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    opts.num_warmup_iters = 2;
    gr_capture_t *c = NULL;
    if (gr_capture_prepare("cpu:0", 1, &spec, &opts, &c) != GR_OK)
        fail_msg("in-process prepare: %s", gr_last_error());
    uint64_t ltotal = 0;
    size_t count = 0;
    assert_int_equal(gr_capture_layout(c, 0, &count, NULL, &ltotal), GR_OK);
    assert_int_equal(ltotal, total);
    assert_int_equal(count, g.count);
    uint8_t *local = aligned_alloc(GR_ALIGN, ltotal);
    void *bases[1] = {local};
    gr_graph_t *lg = NULL;
    if (gr_capture_finish(c, bases, &lg) != GR_OK)
        fail_msg("in-process finish: %s", gr_last_error());
    gr_tensor_desc_t ldesc[32];
    assert_int_equal(gr_graph_layout(lg, &count, ldesc, NULL), GR_OK);
    for (size_t k = 0; k < count; k++) {
        assert_int_equal(ldesc[k].role, g.descs[k].role);
        assert_int_equal(ldesc[k].offset, g.descs[k].offset);
        assert_int_equal(ldesc[k].nbytes, g.descs[k].nbytes);
    }
    assert_memory_equal(block, local, total); /* parameters and samples, as finish left them */

    /* FORWARD over fresh inputs, then BACKWARD with grad-outputs of their own. */
    const gr_tensor_desc_t *in = desc_of(g.descs, g.count, GR_ROLE_INPUT, 0);
    const gr_tensor_desc_t *gout = desc_of(g.descs, g.count, GR_ROLE_GRAD_OUTPUT, 0);
    for (uint64_t i = 0; i < in->nbytes / 4; i++) {
        float v = (float)i / 16.0f - 1.0f;
        memcpy(block + in->offset + i * 4, &v, 4);
        memcpy(local + in->offset + i * 4, &v, 4);
    }
    replay(&ex, g.id, GR_PHASE_FORWARD);
    assert_int_equal(gr_graph_replay(lg, GR_PHASE_FORWARD, NULL, NULL), GR_OK);
    const gr_tensor_desc_t *out = desc_of(g.descs, g.count, GR_ROLE_OUTPUT, 0);
    float first;
    memcpy(&first, block + out->offset, 4);
    assert_true(first != 0.0f); /* the executor did write the output */
    assert_memory_equal(block + out->offset, local + out->offset, out->nbytes);
    assert_memory_equal(block, local, total);
    for (uint64_t i = 0; i < gout->nbytes / 4; i++) {
        float v = 0.25f * (float)(i % 5) - 0.5f;
        memcpy(block + gout->offset + i * 4, &v, 4);
        memcpy(local + gout->offset + i * 4, &v, 4);
    }
    replay(&ex, g.id, GR_PHASE_BACKWARD);
    assert_int_equal(gr_graph_replay(lg, GR_PHASE_BACKWARD, NULL, NULL), GR_OK);
    assert_memory_equal(block, local, total);

    /* GRAPH_DESTROY: the id is gone (and never comes back); MODULE_RELEASE likewise. */
    b = (gx_wbuf_t){0};
    put_u64_only(&b, g.id);
    ok(call(&ex, GX_OP_GRAPH_DESTROY, &b, &r), &r, "GRAPH_DESTROY");
    free(r.p);
    call_fails(&ex, GX_OP_GRAPH_DESTROY, &b, GR_ENOTFOUND, "no graph 1");
    gx_wbuf_free(&b);
    gx_put_u32(&b, 1);
    gx_put_u64(&b, module);
    ok(call(&ex, GX_OP_MODULE_RELEASE, &b, &r), &r, "MODULE_RELEASE");
    free(r.p);
    call_fails(&ex, GX_OP_MODULE_RELEASE, &b, GR_ENOTFOUND, "no module 1");
    gx_wbuf_free(&b);
    assert_int_equal(load_module(&ex), 2); /* ids are never reused */

    finish(&ex);
    munmap(block, total);
    gr_graph_destroy(lg);
    gr_module_release(m);
    free(local);
}

/* Requests a hostile or broken daemon could send: each gets a clear error, and the executor
 * still serves the next request. */
static void test_bad_requests_are_refused(void **state)
{
    (void)state;
    executor_t ex = spawn();
    uint64_t module = load_module(&ex);
    gx_wbuf_t b = {0};
    reply_t r;

    /* A payload larger than the executor's input buffer, sent in pieces: not an archive. */
    size_t big = 200 * 1024;
    uint8_t *junk = calloc(1, big);
    gx_put_bytes(&b, junk, big);
    free(junk);
    call_fails(&ex, GX_OP_MODULE_LOAD, &b, GR_EINVAL, "not a ZIP archive");
    gx_wbuf_free(&b);
    /* An unknown id. */
    gx_put_u64(&b, 999);
    gx_put_i32(&b, GR_PHASE_FORWARD);
    gx_put_u32(&b, GX_REPLAY_PLAIN);
    call_fails(&ex, GX_OP_GRAPH_REPLAY, &b, GR_ENOTFOUND, "no graph 999");
    gx_wbuf_free(&b);
    /* A replay mode that does not exist; ordering objects that do not. */
    gx_put_u64(&b, 1);
    gx_put_i32(&b, GR_PHASE_FORWARD);
    gx_put_u32(&b, 7);
    call_fails(&ex, GX_OP_GRAPH_REPLAY, &b, GR_EINVAL, "mode 7");
    gx_wbuf_free(&b);
    gx_put_u64(&b, 1);
    gx_put_i32(&b, GR_PHASE_FORWARD);
    gx_put_u32(&b, GX_REPLAY_POSTED);
    gx_put_u64(&b, 5);
    gx_put_u64(&b, 1);
    call_fails(&ex, GX_OP_GRAPH_REPLAY, &b, GR_ENOTFOUND, "no seq 5");
    gx_wbuf_free(&b);
    /* A module listed twice is refused whole: the module is still held afterwards. */
    gx_put_u32(&b, 2);
    gx_put_u64(&b, module);
    gx_put_u64(&b, module);
    call_fails(&ex, GX_OP_MODULE_RELEASE, &b, GR_EINVAL, "listed twice");
    gx_wbuf_free(&b);
    gx_put_u32(&b, 2);
    gx_put_u64(&b, module);
    call_fails(&ex, GX_OP_MODULE_RELEASE, &b, GR_EINVAL, "2 ids, but 8 bytes follow");
    gx_wbuf_free(&b);
    /* Counters and device memory on the CPU: the runtime's error, and the executor goes on. */
    gx_put_str(&b, "cpu:0");
    assert_int_not_equal(call(&ex, GX_OP_SEQ_CREATE, &b, &r), GR_OK);
    free(r.p);
    gx_put_u64(&b, 4096);
    assert_int_not_equal(call(&ex, GX_OP_DEVICE_ALLOC, &b, &r), GR_OK);
    free(r.p);
    gx_wbuf_free(&b);
    /* A truncated payload, and one with bytes left over. */
    gx_put_u32(&b, 1);
    call_fails(&ex, GX_OP_POOL_DESTROY, &b, GR_EINVAL, "malformed payload");
    gx_put_u32(&b, 1);
    gx_put_u64(&b, 1);
    call_fails(&ex, GX_OP_POOL_MEMORY, &b, GR_EINVAL, "after the payload's end");
    gx_wbuf_free(&b);
    /* A string that claims more bytes than follow; one with a NUL. */
    gx_put_u32(&b, 1000);
    gx_put(&b, "cpu:0", 5);
    call_fails(&ex, GX_OP_POOL_CREATE, &b, GR_EINVAL, "malformed payload");
    gx_wbuf_free(&b);
    gx_put_u32(&b, 6);
    gx_put(&b, "cpu\0:0", 6);
    call_fails(&ex, GX_OP_POOL_CREATE, &b, GR_EINVAL, "malformed payload");
    gx_wbuf_free(&b);
    /* Another device than the executor's. */
    gx_put_str(&b, "cpu:1");
    call_fails(&ex, GX_OP_POOL_CREATE, &b, GR_EINVAL, "not this executor's device 'cpu:0'");
    gx_wbuf_free(&b);
    /* An op that does not exist, and READY sent to the executor. */
    call_fails(&ex, 77, NULL, GR_EINVAL, "op 77");
    call_fails(&ex, GX_OP_READY, NULL, GR_EINVAL, "op 1");
    /* ndim 99; data that does not match the shape; a module that is not there. */
    prepare_payload(&b, module, 99, 0);
    call_fails(&ex, GX_OP_CAPTURE_PREPARE, &b, GR_EINVAL, "ndim 99 is over GR_MAX_DIMS (8)");
    gx_wbuf_free(&b);
    prepare_payload(&b, module, 2, 1);
    b.len -= sizeof sample + 8;
    gx_put_bytes(&b, sample, sizeof sample - 4);
    call_fails(&ex, GX_OP_CAPTURE_PREPARE, &b, GR_EINVAL, "156 bytes of data for a tensor of 160");
    gx_wbuf_free(&b);
    prepare_payload(&b, 41, 2, 1);
    call_fails(&ex, GX_OP_CAPTURE_PREPARE, &b, GR_ENOTFOUND, "no module 41");
    gx_wbuf_free(&b);
    /* fds on a request that takes none. */
    int fd = make_memfd(4096);
    gx_put_str(&b, "cpu:0");
    send_raw(&ex, GX_MAGIC, GX_OP_POOL_CREATE, &b, &fd, 1, 1);
    get_reply(&ex, GX_OP_POOL_CREATE, &r);
    assert_int_equal(r.hdr.rc, GR_EINVAL);
    assert_non_null(strstr((char *)r.p, "only CAPTURE_FINISH"));
    free(r.p);
    gx_wbuf_free(&b);
    close(fd);

    /* CAPTURE_FINISH with the wrong number of fds, a short memfd, a pointer nobody gave out: each
     * refused, and the capture is still there to finish right. */
    uint64_t total = 0;
    uint64_t capture = prepare(&ex, module, &total);
    finish_payload(&b, capture, total);
    call_fails(&ex, GX_OP_CAPTURE_FINISH, &b, GR_EINVAL,
               "1 host blocks, but the message carries 0");
    int two[2] = {make_memfd(total), make_memfd(total)};
    assert_int_equal(call_fds(&ex, GX_OP_CAPTURE_FINISH, &b, two, 2, &r), GR_EINVAL);
    assert_non_null(strstr((char *)r.p, "carries 2 fds"));
    free(r.p);
    close(two[1]);
    gx_wbuf_free(&b);
    finish_payload(&b, capture, total);
    send_raw(&ex, GX_MAGIC, GX_OP_CAPTURE_FINISH, &b, two, 1, 3); /* header says 3 */
    get_reply(&ex, GX_OP_CAPTURE_FINISH, &r);
    assert_int_equal(r.hdr.rc, GR_EINVAL);
    assert_non_null(strstr((char *)r.p, "header says 3"));
    free(r.p);
    gx_wbuf_free(&b);
    finish_payload(&b, capture, total / 2);
    assert_int_equal(call_fds(&ex, GX_OP_CAPTURE_FINISH, &b, two, 1, &r), GR_EINVAL);
    assert_non_null(strstr((char *)r.p, "bytes; callable 0 needs"));
    free(r.p);
    gx_wbuf_free(&b);
    int shortfd = make_memfd(total / 2);
    finish_payload(&b, capture, total);
    assert_int_equal(call_fds(&ex, GX_OP_CAPTURE_FINISH, &b, &shortfd, 1, &r), GR_EINVAL);
    assert_non_null(strstr((char *)r.p, "less than the"));
    free(r.p);
    close(shortfd);
    gx_wbuf_free(&b);
    gx_put_u64(&b, capture);
    gx_put_u32(&b, 1);
    gx_put_u32(&b, GX_BLOCK_DEVICE);
    gx_put_u64(&b, 0xdead0000);
    call_fails(&ex, GX_OP_CAPTURE_FINISH, &b, GR_EINVAL, "must be GX_BLOCK_HOST");
    gx_wbuf_free(&b);
    gx_put_str(&b, "cpu:0");
    gx_put_u64(&b, 0xdead0000);
    call_fails(&ex, GX_OP_DEVICE_FREE, &b, GR_EINVAL, "not a block DEVICE_ALLOC gave out");
    gx_wbuf_free(&b);
    finish_payload(&b, capture, total);
    ok(call_fds(&ex, GX_OP_CAPTURE_FINISH, &b, two, 1, &r), &r, "CAPTURE_FINISH after refusals");
    free(r.p);
    close(two[0]);
    /* The capture is consumed now. */
    call_fails(&ex, GX_OP_CAPTURE_FINISH, &b, GR_ENOTFOUND, "no capture 1");
    gx_wbuf_free(&b);

    /* The urgent socket: a SEQ_RELEASE of a seq that does not exist, and junk, are ignored. */
    gx_msg_hdr_t h = {GX_MAGIC, GX_OP_SEQ_RELEASE, 1, 8, 0, 0};
    uint8_t msg[sizeof h + 8] = {0};
    memcpy(msg, &h, sizeof h);
    write_full(ex.urg, msg, sizeof msg, NULL, 0);
    h.op = GX_OP_POOL_CREATE;
    memcpy(msg, &h, sizeof h);
    write_full(ex.urg, msg, sizeof msg, NULL, 0);

    /* Still serving: a pool round trip. */
    gx_put_str(&b, "cpu:0");
    ok(call(&ex, GX_OP_POOL_CREATE, &b, &r), &r, "POOL_CREATE");
    gx_rbuf_t rb = rbuf(&r);
    uint64_t pool = gx_get_u64(&rb);
    assert_int_equal(pool, 1);
    free(r.p);
    gx_wbuf_free(&b);
    gx_put_u64(&b, pool);
    ok(call(&ex, GX_OP_POOL_MEMORY, &b, &r), &r, "POOL_MEMORY");
    assert_int_equal(r.hdr.len, 16);
    free(r.p);
    ok(call(&ex, GX_OP_POOL_DESTROY, &b, &r), &r, "POOL_DESTROY");
    free(r.p);
    gx_wbuf_free(&b);
    /* EOF with a graph and a module still held: freed at exit (ASan checks). */
    finish(&ex);
}

/* A frame that is not one ends the executor with a non-zero status. */
static void test_bad_magic_exits(void **state)
{
    (void)state;
    executor_t ex = spawn();
    gx_wbuf_t b = {0};
    gx_put_u64(&b, 1);
    send_raw(&ex, 0x12345678, GX_OP_POOL_DESTROY, &b, NULL, 0, 0);
    gx_wbuf_free(&b);
    int status = reap(&ex);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);

    /* A header cut short by EOF, likewise. */
    ex = spawn();
    gx_msg_hdr_t h = {GX_MAGIC, GX_OP_POOL_DESTROY, 1, 8, 0, 0};
    write_full(ex.ch, &h, 10, NULL, 0);
    shutdown(ex.ch, SHUT_WR);
    status = reap(&ex);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 3);
}

/* fds the daemon leaks (no CLOEXEC) are closed before the executor reads anything. */
static void test_inherited_fds_are_closed(void **state)
{
    (void)state;
    executor_t ex = spawn();
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ex.pid, LEAKED_FD);
    struct stat st;
    assert_int_equal(lstat(path, &st), -1);
    snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)ex.pid, GX_URGENT_FD);
    assert_int_equal(lstat(path, &st), 0); /* the check can see the executor's fds */
    finish(&ex);
}

/* Arguments: an unknown flag, a missing device, a bad number exit 2; --no-sandbox says so; the
 * rest (--cuda-queues and --spin-slice-us too, unused on a CPU device) are taken. */
static void test_arguments(void **state)
{
    (void)state;
    /* CUDA gives at most 32 queues; a ring watch between polls is at most 1 ms. */
    const char *bad[][3] = {{"--frobnicate", NULL, NULL},   {"--cpu-devices", "-1", NULL},
                            {"--call-memory", "12x", NULL}, {"--cpu-devices", NULL, NULL},
                            {"--cuda-queues", "33", NULL},  {"--spin-slice-us", "1001", NULL}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        executor_t ex = spawn_with(bad[i]);
        int status = reap(&ex);
        assert_true(WIFEXITED(status));
        assert_int_equal(WEXITSTATUS(status), 2);
    }
    const char *nosb[] = {"--no-sandbox", "--max-unpacked",  "1000000",  "--call-memory",
                          "100000000",    "--read",          "/usr/lib", "--cuda-queues",
                          "32",           "--spin-slice-us", "0",        NULL};
    executor_t ex = spawn_with(nosb);
    read_ready(&ex, 0);
    finish(&ex);
}

int main(void)
{
    signal(SIGPIPE, SIG_IGN);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_capture_replay_matches_in_process),
        cmocka_unit_test(test_bad_requests_are_refused),
        cmocka_unit_test(test_bad_magic_exits),
        cmocka_unit_test(test_inherited_fds_are_closed),
        cmocka_unit_test(test_arguments),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
