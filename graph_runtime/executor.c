/*
 * graphd-executor: runs graph_runtime's C ABI for one tenant on one device, driven by the daemon
 * over the executor channel (exec_proto.h). It owns that tenant's modules, pools, captures,
 * graphs (and the mappings of their static blocks), device blocks, events and sequence counters,
 * each in a table keyed by an id of its own (from 1, never reused).
 *
 * Everything on the channel is checked as hostile input: a request that does not parse, or
 * names an object this executor does not hold, gets an error reply and the executor goes on;
 * only a message that cannot be framed (bad magic, a payload over GX_MAX_PAYLOAD, a short read)
 * ends it (exit 3). EOF on the channel ends it cleanly (exit 0), freeing everything.
 *
 * Threads: the main thread serves GX_CHANNEL_FD and the direct connections of the sessions
 * (exec_proto.h, "the direct data plane": REPLAY frames from the clients, checked here as the
 * daemon would); one more serves GX_URGENT_FD (SEQ_RELEASE, no reply), sharing the seq table
 * under a mutex. Only the main thread creates or destroys objects.
 */
#include "exec_proto.h"
#include "graphd_frame.h"
#include "runtime.h"
#include "sandbox.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <pthread.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define EXIT_USAGE 2  /* bad arguments, or the runtime refused them */
#define EXIT_BROKEN 3 /* a message on the channel that cannot be framed */

#define METHOD_MAX 256   /* bytes of a method name, NUL included */
#define MAX_CALLABLES 64 /* one memfd each (GX_MAX_FDS); the daemon's bound too */
#define MAX_ARGS 256     /* sample args of one callable, as the daemon's bound */
#define MAX_PATHS 64     /* --read / --rw / --tmp each */
#define OFF_MAX 256      /* bytes of READY's "off" text */
#define ERR_MAX 1024     /* bytes of an error reply's message */
#define URGENT_MAX 4096  /* largest payload the urgent socket skips over */
#define CONN_MAX 256     /* direct connections: this uid's sessions using this device */
#define CONN_IN 16384    /* bytes of frames read ahead per connection */

/* ---- arguments and READY ------------------------------------------------------------------ */

typedef struct exec_args {
    char device[GR_DEVICE_MAX];
    int intra_op_threads;
    int cpu_devices; /* 0: not given */
    uint64_t max_unpacked;
    bool max_unpacked_set;
    uint64_t call_memory;
    bool no_sandbox;
    bool no_landlock, no_seccomp; /* one layer off, to find which one a device driver needs */
    uint64_t reply_max; /* a direct connection's unsent answers, in bytes, before it is dropped */
    uint64_t spin_us;   /* poll, not sleep, this long after a device replay (0: never) */
    uint64_t spin_slice_us; /* while hot: watch the rings this long between polls (0: never) */
    uint64_t cuda_queues;   /* CUDA_DEVICE_MAX_CONNECTIONS for a cuda device (0: left as it is) */
    const char *read_paths[MAX_PATHS];
    size_t n_read;
    const char *rw_paths[MAX_PATHS];
    size_t n_rw;
    const char *tmp_paths[MAX_PATHS];
    size_t n_tmp;
} exec_args_t;

typedef struct ready_info {
    uint32_t no_new_privs;
    uint32_t landlock_abi; /* 0: Landlock not applied */
    uint32_t seccomp;      /* 1: a seccomp filter is on */
    char off[OFF_MAX];     /* which protections are off, and why ("" when none) */
} ready_info_t;

/* ---- object tables ------------------------------------------------------------------------ */

/* A block DEVICE_ALLOC gave out; CAPTURE_FINISH and DEVICE_FREE accept no other pointer. */
typedef struct devblock {
    void *ptr;
    uint64_t bytes;
    char device[GR_DEVICE_MAX];
    uint32_t users; /* graphs captured over it: DEVICE_FREE is GR_EBUSY until they are gone */
} devblock_t;

/* One object; obj is its gr_ handle, the rest is per kind. */
typedef struct entry {
    uint64_t id;
    void *obj;
    /* captures */
    size_t n;
    int resident;
    uint64_t *totals; /* n static block sizes */
    /* graphs */
    void *map; /* the host block's mapping (NULL for a device block) */
    size_t map_len;
    devblock_t *dev; /* the device block (NULL for a host block) */
    /* graphs bound for direct replays (GRAPH_BIND): the daemon's id, its session, the state
     * page's slot; handle 0 when not bound */
    uint64_t handle, session;
    uint32_t slot;
} entry_t;

/* Entries in increasing id order (ids only grow), so a look-up is a binary search. */
typedef struct table {
    const char *what; /* "module": for messages */
    entry_t *v;
    size_t n, cap;
    uint64_t next_id;
} table_t;

/* A session's direct connection (CONN_OPEN): frames read ahead, answers not yet sent. */
typedef struct conn {
    int fd;
    uint64_t session;
    uint8_t in[CONN_IN];
    size_t in_len;
    uint8_t *out;
    size_t out_len, out_cap;
    int passed_fd;       /* a descriptor that came with the frames read (RING takes it), or -1 */
    graphd_ring_t *ring; /* the client's replay ring (RING), or NULL */
    uint64_t ring_taken; /* slots taken from it: ours, never read back from the ring */
} conn_t;

/* What SESSION_BIND gave a session (object ids, 0: none), and its last posted replay. */
typedef struct sess {
    uint64_t session, seq, wait, done, last;
} sess_t;

static struct {
    exec_args_t args;
    table_t modules, pools, captures, graphs, events, seqs;
    conn_t *conns[CONN_MAX];
    size_t nconns, rr;
    sess_t *sess;
    size_t nsess, cap_sess;
    gx_state_t *state;        /* the page the daemon reads (a private one when it gave none) */
    pthread_mutex_t seq_lock; /* seqs: the urgent thread looks up and releases under it */
    devblock_t **devblocks;
    size_t n_devblocks, cap_devblocks;
    char err[ERR_MAX]; /* the message of the failing request (main thread only) */
} X = {
    .modules = {"module", NULL, 0, 0, 1},
    .pools = {"pool", NULL, 0, 0, 1},
    .captures = {"capture", NULL, 0, 0, 1},
    .graphs = {"graph", NULL, 0, 0, 1},
    .events = {"event", NULL, 0, 0, 1},
    .seqs = {"seq", NULL, 0, 0, 1},
    .seq_lock = PTHREAD_MUTEX_INITIALIZER,
};

/* Room for n more entries, so that adding them cannot fail. */
static bool table_reserve(table_t *t, size_t n)
{
    if (t->n + n <= t->cap)
        return true;
    size_t cap = t->cap ? t->cap : 16;
    while (cap < t->n + n)
        cap *= 2;
    entry_t *v = realloc(t->v, cap * sizeof *v);
    if (v == NULL)
        return false;
    t->v = v;
    t->cap = cap;
    return true;
}

/* Adds obj under a fresh id (0 when out of memory). */
static entry_t *table_add(table_t *t, void *obj)
{
    if (!table_reserve(t, 1))
        return NULL;
    entry_t *e = &t->v[t->n++];
    memset(e, 0, sizeof *e);
    e->id = t->next_id++;
    e->obj = obj;
    return e;
}

static entry_t *table_find(const table_t *t, uint64_t id)
{
    size_t lo = 0, hi = t->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t->v[mid].id == id)
            return &t->v[mid];
        if (t->v[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

static void table_remove(table_t *t, entry_t *e)
{
    size_t i = (size_t)(e - t->v);
    memmove(&t->v[i], &t->v[i + 1], (t->n - i - 1) * sizeof *e);
    t->n--;
}

static devblock_t *devblock_find(const void *ptr)
{
    for (size_t i = 0; i < X.n_devblocks; i++)
        if (X.devblocks[i]->ptr == ptr)
            return X.devblocks[i];
    return NULL;
}

/* ---- errors ------------------------------------------------------------------------------- */

/* Keeps the message of a refused request; returns rc. */
__attribute__((format(printf, 2, 3))) static int reject(int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(X.err, sizeof X.err, fmt, ap);
    va_end(ap);
    return rc;
}

/* A gr_ call failed: its message is the reply's. */
static int gr_failed(int rc)
{
    snprintf(X.err, sizeof X.err, "%s", gr_last_error());
    return rc;
}

static int not_found(const table_t *t, uint64_t id)
{
    return reject(GR_ENOTFOUND, "no %s %" PRIu64 " in this executor", t->what, id);
}

/* The payload parsed exactly: nothing missing, nothing left over. */
static int parsed(const gx_rbuf_t *r, const char *op)
{
    if (r->bad)
        return reject(GR_EINVAL,
                      "%s: malformed payload (truncated, or a string too long or "
                      "holding a NUL)",
                      op);
    if (r->pos != r->len)
        return reject(GR_EINVAL, "%s: %zu bytes after the payload's end", op, r->len - r->pos);
    return GR_OK;
}

/* A device string of a request: it must be this executor's device. */
static int check_device(const char *device, const char *op)
{
    if (strcmp(device, X.args.device) != 0)
        return reject(GR_EINVAL, "%s: device '%s' is not this executor's device '%s'", op, device,
                      X.args.device);
    return GR_OK;
}

/* ---- the channel -------------------------------------------------------------------------- */

typedef struct msg {
    gx_msg_hdr_t hdr;
    uint8_t *payload; /* hdr.len bytes; NULL when they did not fit in memory (then skipped) */
    int fds[GX_MAX_FDS];
    size_t nfds;
    bool fds_lost; /* more fds than GX_MAX_FDS, or the kernel cut them (MSG_CTRUNC) */
    bool owned;    /* payload is malloc'd (else it points into the input buffer) */
} msg_t;

static void msg_close_fds(msg_t *m)
{
    for (size_t i = 0; i < m->nfds; i++)
        if (m->fds[i] >= 0)
            close(m->fds[i]);
    m->nfds = 0;
}

/* Frees what a request holds (its payload, its fds not taken). */
static void msg_free(msg_t *m)
{
    if (m->owned)
        free(m->payload);
    m->payload = NULL;
    m->owned = false;
    msg_close_fds(m);
}

/* One recvmsg into buf (at most n bytes), keeping any fds that come with the bytes in m. */
static ssize_t recv_some(int fd, void *buf, size_t n, msg_t *m)
{
    union {
        char b[CMSG_SPACE(sizeof(int) * GX_MAX_FDS)];
        struct cmsghdr align;
    } ctl;
    struct iovec iov = {buf, n};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    mh.msg_control = ctl.b;
    mh.msg_controllen = sizeof ctl.b;
    ssize_t r;
    do
        r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
    while (r < 0 && errno == EINTR);
    if (r < 0)
        return r;
    if (mh.msg_flags & MSG_CTRUNC)
        m->fds_lost = true;
    for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
        if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
            continue;
        size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        const uint8_t *data = CMSG_DATA(c);
        for (size_t i = 0; i < k; i++) {
            int one;
            memcpy(&one, data + i * sizeof(int), sizeof one);
            if (m->nfds < GX_MAX_FDS) {
                m->fds[m->nfds++] = one;
            } else {
                close(one);
                m->fds_lost = true;
            }
        }
    }
    return r;
}

/* Reads exactly n bytes (into buf, or discarded when buf is NULL), keeping any fds that come
 * with them. 1: done; 0: EOF before the first byte; -1: EOF or an error part way. */
static int read_full(int fd, void *buf, uint64_t n, msg_t *m)
{
    static uint8_t sink[65536];
    uint64_t got = 0;
    while (got < n) {
        size_t want = (size_t)(n - got);
        if (buf == NULL && want > sizeof sink)
            want = sizeof sink;
        ssize_t r = recv_some(fd, buf ? (uint8_t *)buf + got : sink, want, m);
        if (r < 0)
            return -1;
        if (r == 0)
            return got == 0 ? 0 : -1;
        got += (uint64_t)r;
    }
    return 1;
}

/* The channel's input: a request and its payload usually arrive in one recvmsg, and a payload
 * that fits is used in place (a replay costs one read and no allocation). The daemon sends one
 * request at a time, so what is read ahead is at most the next one. */
static struct {
    uint8_t b[64 * 1024];
    size_t head, tail;
} IN;

/* At least n (<= sizeof IN.b) bytes buffered. 1; 0: EOF with nothing buffered; -1: EOF part way
 * or an error. */
static int fill(int fd, size_t n, msg_t *m)
{
    if (IN.tail - IN.head >= n)
        return 1;
    memmove(IN.b, IN.b + IN.head, IN.tail - IN.head);
    IN.tail -= IN.head;
    IN.head = 0;
    while (IN.tail < n) {
        ssize_t r = recv_some(fd, IN.b + IN.tail, sizeof IN.b - IN.tail, m);
        if (r < 0)
            return -1;
        if (r == 0)
            return IN.tail == 0 ? 0 : -1;
        IN.tail += (size_t)r;
    }
    return 1;
}

/* Reads one request. 1: one read; 0: EOF between messages; -1: broken (message on stderr). */
static int read_msg(int fd, msg_t *m, const char *channel)
{
    memset(m, 0, sizeof *m);
    int r = fill(fd, sizeof m->hdr, m);
    if (r == 0 && m->nfds == 0)
        return 0;
    if (r <= 0) {
        fprintf(stderr, "graphd-executor: %s: the channel ended inside a message header\n",
                channel);
        goto broken;
    }
    memcpy(&m->hdr, IN.b + IN.head, sizeof m->hdr);
    IN.head += sizeof m->hdr;
    if (m->hdr.magic != GX_MAGIC) {
        fprintf(stderr, "graphd-executor: %s: bad magic 0x%08" PRIx32 " (want 0x%08x)\n", channel,
                m->hdr.magic, GX_MAGIC);
        goto broken;
    }
    if (m->hdr.len > GX_MAX_PAYLOAD) {
        fprintf(stderr,
                "graphd-executor: %s: payload of %" PRIu64 " bytes is over GX_MAX_PAYLOAD\n",
                channel, m->hdr.len);
        goto broken;
    }
    uint64_t len = m->hdr.len;
    if (len <= sizeof IN.b) {
        if (fill(fd, (size_t)len, m) != 1)
            goto short_payload;
        m->payload = IN.b + IN.head;
        IN.head += (size_t)len;
        return 1;
    }
    /* Larger than the buffer (a module archive): its own allocation, NULL when it does not fit
     * in memory (then the bytes are read and dropped, and the request fails with GR_ENOMEM). */
    size_t have = IN.tail - IN.head;
    m->payload = malloc((size_t)len);
    m->owned = true;
    if (m->payload)
        memcpy(m->payload, IN.b + IN.head, have);
    IN.head = IN.tail = 0;
    if (read_full(fd, m->payload ? m->payload + have : NULL, len - have, m) != 1)
        goto short_payload;
    return 1;
short_payload:
    fprintf(stderr, "graphd-executor: %s: the channel ended inside a %" PRIu64 "-byte payload\n",
            channel, m->hdr.len);
broken:
    msg_free(m);
    return -1;
}

/* Sends a whole message; false when the daemon's end is gone. */
static bool send_msg(int fd, uint32_t op, uint64_t seq, int32_t rc, const void *payload, size_t len)
{
    gx_msg_hdr_t h = {GX_MAGIC, op, seq, len, rc, 0};
    struct iovec iov[2] = {{&h, sizeof h}, {(void *)payload, len}};
    size_t total = sizeof h + len, sent = 0;
    while (sent < total) {
        struct iovec part[2];
        int k = 0;
        size_t skip = sent;
        for (int i = 0; i < 2; i++) {
            if (skip >= iov[i].iov_len) {
                skip -= iov[i].iov_len;
                continue;
            }
            part[k].iov_base = (uint8_t *)iov[i].iov_base + skip;
            part[k].iov_len = iov[i].iov_len - skip;
            skip = 0;
            k++;
        }
        struct msghdr mh = {.msg_iov = part, .msg_iovlen = (size_t)k};
        ssize_t r = sendmsg(fd, &mh, MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return false;
        sent += (size_t)r;
    }
    return true;
}

/* ---- the sandbox -------------------------------------------------------------------------- */

/*
 * SANDBOX: the one place the executor restricts itself, after the runtime is set up and before
 * it reads any request (so before any module loads): graph_runtime/sandbox.h's default lists for
 * the device's family plus the --read / --rw / --tmp paths, then gr_sandbox_enter (no_new_privs,
 * Landlock, seccomp; --no-landlock / --no-seccomp / --no-sandbox leave layers out, for
 * bench/exec_probe.py and executor_sandbox = 0). Fills the READY fields; a failure to restrict
 * is fatal (the caller exits).
 */
static int enter_sandbox(const exec_args_t *a, ready_info_t *r)
{
    memset(r, 0, sizeof *r);
    if (a->no_sandbox) {
        if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0)
            r->no_new_privs = 1;
        snprintf(r->off, sizeof r->off, "landlock and seccomp: executor_sandbox is 0");
        return 0;
    }
    gr_sandbox_opts_t o;
    if (gr_sandbox_default_paths(a->device, &o) != 0) { /* by the device's family */
        fprintf(stderr, "graphd-executor: the sandbox's path lists for %s: %s\n", a->device,
                errno == EINVAL ? "no device family of that name" : "out of memory");
        return -1;
    }
    o.landlock = !a->no_landlock;
    o.seccomp = !a->no_seccomp;
    int rc = 0;
    for (size_t i = 0; i < a->n_read && rc == 0; i++)
        rc = gr_sandbox_paths_add(&o, 'r', a->read_paths[i]);
    for (size_t i = 0; i < a->n_rw && rc == 0; i++)
        rc = gr_sandbox_paths_add(&o, 'w', a->rw_paths[i]);
    for (size_t i = 0; i < a->n_tmp && rc == 0; i++)
        rc = gr_sandbox_paths_add(&o, 't', a->tmp_paths[i]);
    gr_sandbox_report_t rep;
    if (rc == 0)
        rc = gr_sandbox_enter(&o, &rep);
    gr_sandbox_paths_free(&o);
    if (rc != 0) {
        fprintf(stderr, "graphd-executor: entering the sandbox: %s\n", rep.off);
        return -1;
    }
    r->no_new_privs = (uint32_t)rep.no_new_privs;
    r->landlock_abi = (uint32_t)rep.landlock_abi;
    r->seccomp = (uint32_t)rep.seccomp;
    size_t used = strnlen(rep.off, sizeof rep.off - 1);
    memcpy(r->off, rep.off, used);
    r->off[used] = 0;
    return 0;
}

/* ---- ops ---------------------------------------------------------------------------------- */

typedef int (*op_fn)(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out);

static int op_module_load(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    uint64_t n = 0;
    const void *bytes = gx_get_bytes(r, &n);
    int rc = parsed(r, "MODULE_LOAD");
    if (rc)
        return rc;
    if (!table_reserve(&X.modules, 1))
        return reject(GR_ENOMEM, "MODULE_LOAD: out of memory for the module table");
    gr_module_t *mod = NULL;
    rc = gr_module_load(bytes, (size_t)n, &mod);
    if (rc)
        return gr_failed(rc);
    gr_module_info_t info;
    rc = gr_module_info(mod, &info);
    if (rc) {
        rc = gr_failed(rc);
        gr_module_release(mod);
        return rc;
    }
    entry_t *e = table_add(&X.modules, mod);
    gx_put_u64(out, e->id);
    gx_put(out, &info, sizeof info);
    return GR_OK;
}

static int op_module_release(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint32_t n = gx_get_u32(r);
    if (!r->bad && (uint64_t)n * 8 != r->len - r->pos)
        return reject(GR_EINVAL, "MODULE_RELEASE: %u ids, but %zu bytes follow", n,
                      r->len - r->pos);
    const uint8_t *ids = gx_get_span(r, (size_t)n * 8);
    int rc = parsed(r, "MODULE_RELEASE");
    if (rc)
        return rc;
    /* All or nothing: every id must be held, and at most once. */
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;
        memcpy(&id, ids + (size_t)i * 8, 8);
        if (table_find(&X.modules, id) == NULL)
            return not_found(&X.modules, id);
        for (uint32_t k = 0; k < i; k++)
            if (memcmp(ids + (size_t)k * 8, &id, 8) == 0)
                return reject(GR_EINVAL, "MODULE_RELEASE: module %" PRIu64 " listed twice", id);
    }
    for (uint32_t i = 0; i < n; i++) {
        uint64_t id;
        memcpy(&id, ids + (size_t)i * 8, 8);
        entry_t *e = table_find(&X.modules, id);
        gr_module_release(e->obj);
        table_remove(&X.modules, e);
    }
    return GR_OK;
}

static int op_pool_create(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    int rc = parsed(r, "POOL_CREATE");
    if (rc || (rc = check_device(device, "POOL_CREATE")))
        return rc;
    if (!table_reserve(&X.pools, 1))
        return reject(GR_ENOMEM, "POOL_CREATE: out of memory for the pool table");
    gr_pool_t *p = NULL;
    rc = gr_pool_create(device, &p);
    if (rc)
        return gr_failed(rc);
    gx_put_u64(out, table_add(&X.pools, p)->id);
    return GR_OK;
}

static int op_pool_destroy(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "POOL_DESTROY");
    if (rc)
        return rc;
    entry_t *e = table_find(&X.pools, id);
    if (e == NULL)
        return not_found(&X.pools, id);
    rc = gr_pool_destroy(e->obj);
    if (rc)
        return gr_failed(rc);
    table_remove(&X.pools, e);
    return GR_OK;
}

static int op_pool_memory(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "POOL_MEMORY");
    if (rc)
        return rc;
    entry_t *e = table_find(&X.pools, id);
    if (e == NULL)
        return not_found(&X.pools, id);
    uint64_t reserved = 0, in_use = 0;
    rc = gr_pool_memory(e->obj, &reserved, &in_use);
    if (rc)
        return gr_failed(rc);
    gx_put_u64(out, reserved);
    gx_put_u64(out, in_use);
    return GR_OK;
}

/* One sample arg of a CAPTURE_PREPARE request, checked as the runtime will read it. */
static int get_arg(gx_rbuf_t *r, gr_arg_spec_t *a, size_t ci, size_t ai)
{
    memset(a, 0, sizeof *a);
    a->dtype = gx_get_i32(r);
    a->ndim = gx_get_u32(r);
    if (r->bad)
        return parsed(r, "CAPTURE_PREPARE");
    if (a->ndim > GR_MAX_DIMS)
        return reject(GR_EINVAL,
                      "CAPTURE_PREPARE: callable %zu arg %zu: ndim %u is over GR_MAX_DIMS (%d)", ci,
                      ai, a->ndim, GR_MAX_DIMS);
    size_t esize = gr_dtype_size(a->dtype);
    if (esize == 0)
        return reject(GR_EINVAL, "CAPTURE_PREPARE: callable %zu arg %zu: dtype %d is not a dtype",
                      ci, ai, a->dtype);
    uint64_t bytes = esize;
    bool too_big = false;
    for (uint32_t k = 0; k < a->ndim; k++) {
        a->shape[k] = gx_get_i64(r);
        if (a->shape[k] < 0)
            return reject(
                GR_EINVAL,
                "CAPTURE_PREPARE: callable %zu arg %zu: dimension %u is negative (%" PRId64 ")", ci,
                ai, k, a->shape[k]);
        if (a->shape[k] != 0 && bytes > GX_MAX_PAYLOAD / (uint64_t)a->shape[k])
            too_big = true;
        else
            bytes *= (uint64_t)a->shape[k];
    }
    a->requires_grad = gx_get_i32(r);
    uint64_t n = 0;
    a->data = gx_get_bytes(r, &n);
    if (r->bad)
        return parsed(r, "CAPTURE_PREPARE");
    if (n == 0) {
        a->data = NULL;
    } else if (too_big || n != bytes) {
        return reject(GR_EINVAL,
                      "CAPTURE_PREPARE: callable %zu arg %zu: %" PRIu64
                      " bytes of data for a tensor of %" PRIu64 " bytes",
                      ci, ai, n, too_big ? UINT64_MAX : bytes);
    }
    return GR_OK;
}

static int op_capture_prepare(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gr_capture_opts_t opts;
    gr_capture_opts_init(&opts);
    gx_get_str(r, device, sizeof device);
    opts.num_warmup_iters = gx_get_i32(r);
    opts.allow_unused_input = gx_get_i32(r);
    uint64_t pool_id = gx_get_u64(r);
    opts.resident = gx_get_i32(r);
    opts.copy_param_grads = gx_get_i32(r);
    opts.reuse_warmup = gx_get_i32(r) != 0;
    uint32_t n = gx_get_u32(r);
    if (r->bad)
        return parsed(r, "CAPTURE_PREPARE");
    if (n == 0 || n > MAX_CALLABLES)
        return reject(GR_EINVAL, "CAPTURE_PREPARE: %u callables (1 to %d)", n, MAX_CALLABLES);
    int rc = check_device(device, "CAPTURE_PREPARE");
    if (rc)
        return rc;
    if (pool_id) {
        entry_t *p = table_find(&X.pools, pool_id);
        if (p == NULL)
            return not_found(&X.pools, pool_id);
        opts.pool = p->obj;
    }

    gr_callable_spec_t specs[MAX_CALLABLES];
    char methods[MAX_CALLABLES][METHOD_MAX];
    gr_arg_spec_t *args[MAX_CALLABLES] = {0};
    uint64_t *totals = NULL;
    gr_capture_t *c = NULL;
    for (uint32_t i = 0; i < n; i++) {
        uint64_t mid = gx_get_u64(r);
        gx_get_str(r, methods[i], sizeof methods[i]);
        uint32_t n_args = gx_get_u32(r);
        if (r->bad) {
            rc = parsed(r, "CAPTURE_PREPARE");
            goto out;
        }
        entry_t *me = table_find(&X.modules, mid);
        if (me == NULL) {
            rc = not_found(&X.modules, mid);
            goto out;
        }
        if (n_args > MAX_ARGS) {
            rc = reject(GR_EINVAL, "CAPTURE_PREPARE: callable %u has %u args (at most %d)", i,
                        n_args, MAX_ARGS);
            goto out;
        }
        args[i] = calloc(n_args ? n_args : 1, sizeof *args[i]);
        if (args[i] == NULL) {
            rc = reject(GR_ENOMEM, "CAPTURE_PREPARE: out of memory");
            goto out;
        }
        for (uint32_t k = 0; k < n_args; k++)
            if ((rc = get_arg(r, &args[i][k], i, k)) != GR_OK)
                goto out;
        specs[i].module = me->obj;
        specs[i].method = methods[i][0] ? methods[i] : NULL;
        specs[i].n_args = n_args;
        specs[i].args = args[i];
    }
    if ((rc = parsed(r, "CAPTURE_PREPARE")) != GR_OK)
        goto out;
    totals = calloc(n, sizeof *totals);
    if (totals == NULL || !table_reserve(&X.captures, 1)) {
        rc = reject(GR_ENOMEM, "CAPTURE_PREPARE: out of memory");
        goto out;
    }
    rc = gr_capture_prepare(device, n, specs, &opts, &c);
    if (rc) {
        rc = gr_failed(rc);
        goto out;
    }
    entry_t *e = table_add(&X.captures, c);
    e->n = n;
    e->resident = opts.resident != 0;
    e->totals = totals;
    gx_put_u64(out, e->id);
    gx_put_u32(out, n);
    for (uint32_t i = 0; i < n; i++) {
        size_t count = 0;
        gr_capture_layout(c, i, &count, NULL, &totals[i]);
        gx_put_u64(out, count);
        gx_put_u64(out, totals[i]);
    }
    totals = NULL;
out:
    for (uint32_t i = 0; i < n; i++)
        free(args[i]);
    free(totals);
    return rc;
}

static void capture_free(entry_t *e, bool abort_it)
{
    if (abort_it)
        gr_capture_abort(e->obj);
    free(e->totals);
    table_remove(&X.captures, e);
}

static int op_capture_abort(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "CAPTURE_ABORT");
    if (rc)
        return rc;
    entry_t *e = table_find(&X.captures, id);
    if (e == NULL)
        return not_found(&X.captures, id);
    capture_free(e, true);
    return GR_OK;
}

/* One graph of a CAPTURE_FINISH reply. */
static int put_graph(gx_wbuf_t *out, uint64_t id, gr_graph_t *g)
{
    gr_graph_info_t info;
    size_t count = 0, next = 0;
    uint64_t total = 0;
    int rc = gr_graph_info(g, &info);
    if (rc == GR_OK)
        rc = gr_graph_layout(g, &count, NULL, &total);
    if (rc == GR_OK)
        rc = gr_graph_external(g, &next, NULL);
    if (rc)
        return gr_failed(rc);
    gr_tensor_desc_t *descs = calloc(count ? count : 1, sizeof *descs);
    gr_external_t *ext = calloc(next ? next : 1, sizeof *ext);
    if (descs == NULL || ext == NULL) {
        free(descs);
        free(ext);
        return reject(GR_ENOMEM, "CAPTURE_FINISH: out of memory for the reply");
    }
    rc = gr_graph_layout(g, &count, descs, NULL);
    if (rc == GR_OK)
        rc = gr_graph_external(g, &next, ext);
    if (rc) {
        rc = gr_failed(rc);
    } else {
        gx_put_u64(out, id);
        gx_put(out, &info, sizeof info);
        gx_put_u64(out, total);
        gx_put_u32(out, (uint32_t)count);
        for (size_t k = 0; k < count; k++) {
            const gr_tensor_desc_t *d = &descs[k];
            gx_put_i32(out, d->role);
            gx_put_u32(out, d->index);
            gx_put_str(out, d->name);
            gx_put_i32(out, d->dtype);
            gx_put_u32(out, d->ndim);
            for (uint32_t j = 0; j < d->ndim && j < GR_MAX_DIMS; j++)
                gx_put_i64(out, d->shape[j]);
            for (uint32_t j = 0; j < d->ndim && j < GR_MAX_DIMS; j++)
                gx_put_i64(out, d->strides[j]);
            gx_put_u64(out, d->offset);
            gx_put_u64(out, d->nbytes);
            gx_put_u32(out, d->flags);
        }
        gx_put_u32(out, (uint32_t)next);
        for (size_t k = 0; k < next; k++) {
            gx_put_u64(out, ext[k].tensor);
            gx_put_u64(out, (uint64_t)(uintptr_t)ext[k].base);
            gx_put_u64(out, ext[k].size);
            gx_put_u64(out, ext[k].offset);
            gx_put(out, ext[k].handle, GR_IPC_HANDLE_SIZE);
        }
    }
    free(descs);
    free(ext);
    return rc;
}

static void graph_free(entry_t *e)
{
    gr_graph_destroy(e->obj);
    if (e->map)
        munmap(e->map, e->map_len);
    if (e->dev)
        e->dev->users--;
    table_remove(&X.graphs, e);
}

static int op_capture_finish(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    uint64_t id = gx_get_u64(r);
    uint32_t n = gx_get_u32(r);
    uint32_t kinds[MAX_CALLABLES];
    uint64_t values[MAX_CALLABLES];
    if (!r->bad && n > MAX_CALLABLES)
        return reject(GR_EINVAL, "CAPTURE_FINISH: %u blocks (at most %d)", n, MAX_CALLABLES);
    for (uint32_t i = 0; i < n && !r->bad; i++) {
        kinds[i] = gx_get_u32(r);
        values[i] = gx_get_u64(r);
    }
    int rc = parsed(r, "CAPTURE_FINISH");
    if (rc)
        return rc;
    entry_t *ce = table_find(&X.captures, id);
    if (ce == NULL)
        return not_found(&X.captures, id);
    if (n != ce->n)
        return reject(GR_EINVAL,
                      "CAPTURE_FINISH: %u blocks for capture %" PRIu64 " of %zu callables", n, id,
                      ce->n);
    if (m->fds_lost)
        return reject(GR_EINVAL, "CAPTURE_FINISH: more than GX_MAX_FDS (%d) fds, or fds cut",
                      GX_MAX_FDS);
    uint32_t want_kind = ce->resident ? GX_BLOCK_DEVICE : GX_BLOCK_HOST;
    size_t hosts = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kinds[i] != want_kind)
            return reject(GR_EINVAL,
                          "CAPTURE_FINISH: block %u is of kind %u; capture %" PRIu64
                          " is %s, so every block must be %s",
                          i, kinds[i], id, ce->resident ? "device-resident" : "host-staged",
                          ce->resident ? "GX_BLOCK_DEVICE" : "GX_BLOCK_HOST");
        hosts += kinds[i] == GX_BLOCK_HOST;
    }
    if (hosts != m->nfds || m->hdr.nfds != m->nfds)
        return reject(GR_EINVAL,
                      "CAPTURE_FINISH: %zu host blocks, but the message carries %zu fds (header "
                      "says %u)",
                      hosts, m->nfds, m->hdr.nfds);

    /* Check every block before mapping any. */
    devblock_t *devs[MAX_CALLABLES] = {0};
    size_t fi = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kinds[i] == GX_BLOCK_DEVICE) {
            devs[i] = devblock_find((void *)(uintptr_t)values[i]);
            if (devs[i] == NULL)
                return reject(GR_EINVAL,
                              "CAPTURE_FINISH: block %u: 0x%" PRIx64
                              " is not a block DEVICE_ALLOC gave out",
                              i, values[i]);
            for (uint32_t k = 0; k < i; k++)
                if (devs[k] == devs[i])
                    return reject(GR_EINVAL,
                                  "CAPTURE_FINISH: blocks %u and %u are the same device block", k,
                                  i);
            if (devs[i]->bytes < ce->totals[i])
                return reject(GR_EINVAL,
                              "CAPTURE_FINISH: device block %u has %" PRIu64
                              " bytes; callable %u needs %" PRIu64,
                              i, devs[i]->bytes, i, ce->totals[i]);
            continue;
        }
        if (values[i] < ce->totals[i] || values[i] == 0)
            return reject(GR_EINVAL,
                          "CAPTURE_FINISH: block %u has %" PRIu64
                          " bytes; callable %u needs %" PRIu64,
                          i, values[i], i, ce->totals[i]);
        struct stat st;
        if (fstat(m->fds[fi], &st) != 0 || !S_ISREG(st.st_mode))
            return reject(GR_EINVAL, "CAPTURE_FINISH: fd of block %u is not a memfd", i);
        if ((uint64_t)st.st_size < values[i] || values[i] > SIZE_MAX)
            return reject(GR_EINVAL,
                          "CAPTURE_FINISH: memfd of block %u has %lld bytes, less than the %" PRIu64
                          " to map",
                          i, (long long)st.st_size, values[i]);
        fi++;
    }
    if (!table_reserve(&X.graphs, n))
        return reject(GR_ENOMEM, "CAPTURE_FINISH: out of memory for the graph table");

    void *bases[MAX_CALLABLES];
    void *maps[MAX_CALLABLES] = {0};
    gr_graph_t *graphs[MAX_CALLABLES] = {0};
    fi = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (kinds[i] == GX_BLOCK_DEVICE) {
            bases[i] = devs[i]->ptr;
            continue;
        }
        void *p = mmap(NULL, (size_t)values[i], PROT_READ | PROT_WRITE, MAP_SHARED, m->fds[fi], 0);
        if (p == MAP_FAILED) {
            rc = reject(GR_EINVAL, "CAPTURE_FINISH: mapping block %u (%" PRIu64 " bytes): %s", i,
                        values[i], strerror(errno));
            for (uint32_t k = 0; k < i; k++)
                if (maps[k])
                    munmap(maps[k], (size_t)values[k]);
            return rc;
        }
        close(m->fds[fi]);
        m->fds[fi++] = -1;
        maps[i] = bases[i] = p;
    }
    gr_capture_t *c = ce->obj;
    capture_free(ce, false); /* gr_capture_finish consumes it whatever it returns */
    rc = gr_capture_finish(c, bases, graphs);
    if (rc) {
        rc = gr_failed(rc);
        for (uint32_t i = 0; i < n; i++)
            if (maps[i])
                munmap(maps[i], (size_t)values[i]);
        return rc;
    }
    uint64_t ids[MAX_CALLABLES];
    for (uint32_t i = 0; i < n; i++) {
        entry_t *g = table_add(&X.graphs, graphs[i]);
        g->map = maps[i];
        g->map_len = maps[i] ? (size_t)values[i] : 0;
        g->dev = devs[i];
        if (devs[i])
            devs[i]->users++;
        ids[i] = g->id;
    }
    gx_put_u32(out, n);
    for (uint32_t i = 0; i < n && rc == GR_OK; i++)
        rc = put_graph(out, ids[i], graphs[i]);
    if (rc) /* the daemon never learns these ids: do not keep the graphs */
        for (uint32_t i = 0; i < n; i++)
            graph_free(table_find(&X.graphs, ids[i]));
    return rc;
}

/* ---- the direct data plane ---------------------------------------------------------------- */

/* gRPC status codes of the answers this file writes itself (graphd_frame.h's status). */
enum {
    ST_INVALID_ARGUMENT = 3,
    ST_NOT_FOUND = 5,
    ST_ALREADY_EXISTS = 6,
    ST_PERMISSION_DENIED = 7,
    ST_RESOURCE_EXHAUSTED = 8,
    ST_FAILED_PRECONDITION = 9,
};

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static sess_t *sess_find(uint64_t session)
{
    for (size_t i = 0; i < X.nsess; i++)
        if (X.sess[i].session == session)
            return &X.sess[i];
    return NULL;
}

/* The session's entry, made when missing; NULL when out of memory. */
static sess_t *sess_get(uint64_t session)
{
    sess_t *s = sess_find(session);
    if (s)
        return s;
    if (X.nsess == X.cap_sess) {
        size_t cap = X.cap_sess ? X.cap_sess * 2 : 8;
        sess_t *v = realloc(X.sess, cap * sizeof *v);
        if (v == NULL)
            return NULL;
        X.sess = v;
        X.cap_sess = cap;
    }
    s = &X.sess[X.nsess++];
    memset(s, 0, sizeof *s);
    s->session = session;
    return s;
}

/* Object id is gone (SEQ_DESTROY, EVENT_DESTROY): no session uses it any more; a session left
 * with nothing bound is forgotten. */
static void sess_forget(uint64_t id, bool is_seq)
{
    for (size_t i = X.nsess; i-- > 0;) {
        sess_t *s = &X.sess[i];
        if (is_seq && s->seq == id)
            s->seq = s->last = 0;
        if (!is_seq && s->wait == id)
            s->wait = 0;
        if (!is_seq && s->done == id)
            s->done = 0;
        if (s->seq == 0 && s->wait == 0 && s->done == 0)
            X.sess[i] = X.sess[--X.nsess];
    }
}

/* The graph bound to handle (GRAPH_BIND), or NULL. */
static entry_t *graph_by_handle(uint64_t handle)
{
    if (handle == 0)
        return NULL;
    for (size_t i = 0; i < X.graphs.n; i++)
        if (X.graphs.v[i].handle == handle)
            return &X.graphs.v[i];
    return NULL;
}

/* Queues bytes on c's output after what is already there; false over --reply-max. */
static bool conn_queue(conn_t *c, const uint8_t *p, size_t n)
{
    if (c->out_len + n > X.args.reply_max)
        return false;
    if (c->out_len + n > c->out_cap) {
        size_t cap = c->out_cap ? c->out_cap : 4096;
        while (cap < c->out_len + n)
            cap *= 2;
        uint8_t *grown = realloc(c->out, cap);
        if (grown == NULL)
            return false;
        c->out = grown;
        c->out_cap = cap;
    }
    memcpy(c->out + c->out_len, p, n);
    c->out_len += n;
    return true;
}

/* Sends what c's output holds, as far as the socket takes it now. false: the peer is gone. */
static bool conn_flush(conn_t *c)
{
    size_t off = 0;
    while (off < c->out_len) {
        ssize_t r = send(c->fd, c->out + off, c->out_len - off, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (r <= 0)
            return false;
        off += (size_t)r;
    }
    memmove(c->out, c->out + off, c->out_len - off);
    c->out_len -= off;
    return true;
}

/* Answers a frame: straight to the socket when nothing waits before it, else after what does.
 * false when the connection must close (the peer is gone, or it does not read its answers). */
static bool conn_answer(conn_t *c, uint16_t type, uint64_t seq, uint64_t id, uint64_t arg,
                        int status, const char *msg)
{
    size_t n = msg && status ? strlen(msg) : 0;
    if (n > GRAPHD_FRAME_MAX_MSG)
        n = GRAPHD_FRAME_MAX_MSG;
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = type,
                        .seq = seq,
                        .id = id,
                        .arg = arg,
                        .status = status,
                        .msg_len = (uint32_t)n};
    uint8_t raw[GRAPHD_FRAME_SIZE + GRAPHD_FRAME_MAX_MSG];
    graphd_frame_encode(&f, raw);
    if (n)
        memcpy(raw + GRAPHD_FRAME_SIZE, msg, n);
    if (!conn_queue(c, raw, GRAPHD_FRAME_SIZE + n)) {
        atomic_fetch_add(&X.state->dropped_conns, 1);
        fprintf(stderr,
                "graphd-executor: session %" PRIu64 " does not read its replay answers (%zu bytes "
                "unsent, --reply-max %" PRIu64 "): its connection is closed\n",
                c->session, c->out_len, X.args.reply_max);
        return false;
    }
    return conn_flush(c);
}

/* An error that ends the connection: an ERROR frame saying why, then the caller closes it. */
static bool conn_refuse(conn_t *c, uint64_t seq, int status, const char *msg)
{
    conn_answer(c, GRAPHD_FRAME_ERROR, seq, 0, 0, status, msg);
    return false;
}

static void slot_count(entry_t *g, int phase, int rc, uint64_t t0)
{
    if (g->slot >= GX_STATE_SLOTS)
        return;
    gx_slot_t *s = &X.state->slot[g->slot];
    if (rc != GR_OK)
        atomic_fetch_add_explicit(&s->errors, 1, memory_order_relaxed);
    else if (phase == GR_PHASE_FORWARD)
        atomic_fetch_add_explicit(&s->forward, 1, memory_order_relaxed);
    else
        atomic_fetch_add_explicit(&s->backward, 1, memory_order_relaxed);
    gx_hist_add(&s->latency, now_ns() - t0);
}

/* The session's posted replay n: its counters, and n its next number. NULL with the message in
 * X.err when not. */
static gr_seq_t *posted_counters(conn_t *c, unsigned code, uint64_t n)
{
    /* The frame names the device by GRAPHD_DEVICE_CODE (frame version 2): family and index. */
    static const char *const kinds[] = {
        [GRAPHD_DEVICE_CPU] = "cpu", [GRAPHD_DEVICE_CUDA] = "cuda", [GRAPHD_DEVICE_XPU] = "xpu"};
    const unsigned family = GRAPHD_DEVICE_CODE_FAMILY(code);
    char device[32];
    if (family < sizeof kinds / sizeof kinds[0])
        snprintf(device, sizeof device, "%s:%u", kinds[family], GRAPHD_DEVICE_CODE_INDEX(code));
    else
        snprintf(device, sizeof device, "device family %u, index %u", family,
                 GRAPHD_DEVICE_CODE_INDEX(code));
    sess_t *s = sess_find(c->session);
    gr_seq_t *seq = NULL;
    if (s && s->seq) {
        pthread_mutex_lock(&X.seq_lock);
        entry_t *e = table_find(&X.seqs, s->seq);
        seq = e ? e->obj : NULL;
        pthread_mutex_unlock(&X.seq_lock);
    }
    if (strcmp(device, X.args.device) != 0)
        reject(GR_EINVAL, "posted REPLAY for %s on the connection of %s", device, X.args.device);
    else if (seq == NULL)
        reject(GR_EPRECOND,
               "a posted REPLAY needs the session's sequence counters for %s (SEQ frame) first",
               device);
    else if (n != s->last + 1)
        reject(GR_EPRECOND, "posted REPLAY %" PRIu64 " on %s out of sequence (next: %" PRIu64 ")",
               n, device, s->last + 1);
    else {
        s->last = n;
        return seq;
    }
    return NULL;
}

/* A posted replay of c was answered with an error (queued on the socket first): with a ring, the
 * client reads its socket once failed moves. */
static void ring_failed(conn_t *c)
{
    if (c->ring != NULL)
        __atomic_fetch_add(&c->ring->failed, 1, __ATOMIC_RELEASE);
}

/* Runs one REPLAY frame of c. false when the connection must close. */
static bool direct_replay(conn_t *c, const graphd_frame_t *f)
{
    const uint64_t t0 = now_ns();
    const uint16_t rtype = GRAPHD_FRAME_REPLAY | GRAPHD_FRAME_REPLY;
    const uint64_t phase = f->arg & GRAPHD_REPLAY_PHASE_MASK;
    const bool posted = (f->arg & GRAPHD_REPLAY_POSTED) != 0;
    const uint64_t n = f->arg >> GRAPHD_REPLAY_SEQ_SHIFT;
    gr_seq_t *seq = NULL;
    if (posted) {
        unsigned code =
            (unsigned)((f->arg >> GRAPHD_REPLAY_DEVICE_SHIFT) & GRAPHD_REPLAY_DEVICE_MASK);
        seq = posted_counters(c, code, n);
        if (seq == NULL) { /* as the daemon: out of step, the session's stream cannot be trusted */
            conn_refuse(c, f->seq, ST_FAILED_PRECONDITION, X.err);
            ring_failed(c);
            return false;
        }
    }
    int st = 0;
    entry_t *g = graph_by_handle(f->id);
    if (phase != GR_PHASE_FORWARD && phase != GR_PHASE_BACKWARD) {
        st = ST_INVALID_ARGUMENT;
        reject(GR_EINVAL, "unknown phase %" PRIu64, phase);
    } else if (g == NULL) {
        st = ST_NOT_FOUND;
        reject(GR_ENOTFOUND, "no graph %" PRIu64 " on %s", f->id, X.args.device);
    } else if (g->session != c->session) {
        st = ST_PERMISSION_DENIED;
        reject(GR_EINVAL, "graph %" PRIu64 " belongs to another session", f->id);
    } else if (posted && (f->arg & GRAPHD_REPLAY_FLAGS_MASK) != GRAPHD_REPLAY_POSTED) {
        st = ST_INVALID_ARGUMENT;
        reject(GR_EINVAL, "REPLAY flags 0x%" PRIx64 ": POSTED goes alone",
               f->arg & GRAPHD_REPLAY_FLAGS_MASK);
    } else if (!posted &&
               (f->arg & ~(uint64_t)(GRAPHD_REPLAY_PHASE_MASK | GRAPHD_REPLAY_ORDERED))) {
        st = ST_INVALID_ARGUMENT;
        reject(GR_EINVAL, "unknown REPLAY flags 0x%" PRIx64,
               f->arg & ~(uint64_t)GRAPHD_REPLAY_PHASE_MASK);
    }
    entry_t *wait = NULL, *done = NULL;
    if (st == 0 && (f->arg & GRAPHD_REPLAY_ORDERED)) {
        sess_t *s = sess_find(c->session);
        wait = s && s->wait ? table_find(&X.events, s->wait) : NULL;
        done = s && s->done ? table_find(&X.events, s->done) : NULL;
        if (wait == NULL || done == NULL) {
            st = ST_FAILED_PRECONDITION;
            reject(GR_EPRECOND,
                   "an ordered REPLAY needs the session's events for %s (EVENTS frame) first",
                   X.args.device);
        }
    }
    if (st != 0) {
        if (seq)
            gr_seq_skip(seq, n); /* done = n all the same: the client's stream goes on */
        bool ok = conn_answer(c, rtype, f->seq, f->id, 0, st, X.err);
        if (posted)
            ring_failed(c);
        return ok;
    }
    uint64_t ns = 0;
    atomic_store(&X.state->busy_graph, f->id);
    atomic_store(&X.state->busy_since_ns, t0);
    gr_order_t order = {0};
    if (seq) {
        order.seq = seq;
        order.n = n;
    } else if (wait) {
        order.wait = wait->obj;
        order.done = done->obj;
    }
    int rc = gr_graph_replay(g->obj, (int)phase, seq || wait ? &order : NULL, &ns);
    atomic_store(&X.state->busy_since_ns, 0);
    if (rc != GR_OK)
        snprintf(X.err, sizeof X.err, "%s", gr_last_error());
    slot_count(g, (int)phase, rc, t0);
    if (posted && rc == GR_OK)
        return true; /* answered only when it fails */
    bool ok = conn_answer(c, rtype, f->seq, f->id, ns, gr_err_grpc(rc), rc ? X.err : NULL);
    if (posted)
        ring_failed(c);
    return ok;
}

#define RING_BYTES_TEXT "135168"
_Static_assert(GRAPHD_RING_BYTES == 135168, "RING_BYTES_TEXT is GRAPHD_RING_BYTES");

/* Slots of c's ring not yet taken, or -1 when its head is out of reach (the client wrote a head
 * behind what was taken or more than a ring ahead of it). */
static int64_t ring_waiting(const conn_t *c)
{
    uint64_t head = __atomic_load_n(&c->ring->head, __ATOMIC_ACQUIRE);
    uint64_t n = head - c->ring_taken;
    return n > GRAPHD_RING_SLOTS ? -1 : (int64_t)n;
}

/* Ends c: its ring's head is out of reach (ring_waiting < 0). The ERROR frame goes first, then
 * failed moves, so that the client reads it. Returns false (the connection must close). */
static bool ring_out_of_step(conn_t *c)
{
    conn_refuse(c, 0, ST_INVALID_ARGUMENT,
                "the replay ring's head is out of step with what the executor took");
    ring_failed(c);
    return false;
}

/* Runs the next slot of c's ring as the REPLAY frame it stands for. */
static bool ring_serve_one(conn_t *c)
{
    const graphd_ring_slot_t *s = &c->ring->slot[c->ring_taken % GRAPHD_RING_SLOTS];
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC,
                        .version = GRAPHD_FRAME_VERSION,
                        .type = GRAPHD_FRAME_REPLAY,
                        .seq = __atomic_load_n(&s->seq, __ATOMIC_RELAXED),
                        .id = __atomic_load_n(&s->id, __ATOMIC_RELAXED),
                        .arg = __atomic_load_n(&s->arg, __ATOMIC_RELAXED)};
    c->ring_taken++;
    __atomic_store_n(&c->ring->tail, c->ring_taken, __ATOMIC_RELEASE); /* the slot is copied */
    if (!(f.arg & GRAPHD_REPLAY_POSTED)) {
        conn_refuse(c, f.seq, ST_INVALID_ARGUMENT,
                    "the replay ring takes posted replays only (GRAPHD_REPLAY_POSTED); other "
                    "REPLAYs go as frames");
        ring_failed(c);
        return false;
    }
    return direct_replay(c, &f);
}

/* RING: maps the client's ring from the memfd that came with the frame. The connection stays
 * open when it is refused (the client goes on with REPLAY frames). */
static bool conn_ring(conn_t *c, const graphd_frame_t *f)
{
    const uint16_t rtype = GRAPHD_FRAME_RING | GRAPHD_FRAME_REPLY;
    int fd = c->passed_fd;
    c->passed_fd = -1;
    const char *why = NULL;
    int st = ST_INVALID_ARGUMENT;
    struct stat sb;
    int seals = fd >= 0 ? fcntl(fd, F_GET_SEALS) : -1;
    if (c->ring != NULL) {
        why = "the connection already has a replay ring";
        st = ST_ALREADY_EXISTS;
    } else if (fd < 0) {
        why = "RING comes with the ring's memfd (SCM_RIGHTS)";
    } else if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode) || sb.st_size != GRAPHD_RING_BYTES) {
        why = "the replay ring must be a memfd of exactly GRAPHD_RING_BYTES (" RING_BYTES_TEXT
              ") bytes";
    } else if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
        why = "the replay ring's memfd must be sealed against shrinking (F_SEAL_SHRINK)";
    } else {
        void *m = mmap(NULL, GRAPHD_RING_BYTES, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
        if (m == MAP_FAILED) {
            why = "the replay ring could not be mapped";
            st = ST_RESOURCE_EXHAUSTED;
        } else {
            c->ring = m;
            c->ring_taken = __atomic_load_n(&c->ring->head, __ATOMIC_ACQUIRE);
            __atomic_store_n(&c->ring->tail, c->ring_taken, __ATOMIC_RELEASE);
            __atomic_store_n(&c->ring->asleep, 0, __ATOMIC_RELAXED);
        }
    }
    if (fd >= 0)
        close(fd);
    if (why != NULL)
        return conn_answer(c, rtype, f->seq, 0, 0, st, why);
    return conn_answer(c, rtype, f->seq, 0, GRAPHD_RING_SLOTS, 0, NULL);
}

/* Runs c's next slot of its ring (use_ring), else its next buffered frame, if a whole one is
 * there. Slots first: the client puts a posted replay into the ring only while no frame it sent
 * waits for its answer, so a frame in the socket came after the slots. false when the
 * connection must close. */
static bool conn_serve_one(conn_t *c, bool *ran, bool use_ring)
{
    *ran = false;
    if (use_ring && c->ring != NULL) {
        int64_t waiting = ring_waiting(c);
        if (waiting < 0)
            return ring_out_of_step(c);
        if (waiting > 0) {
            *ran = true;
            return ring_serve_one(c);
        }
    }
    if (c->in_len < GRAPHD_FRAME_SIZE)
        return true;
    graphd_frame_t f;
    graphd_frame_decode(c->in, &f);
    char msg[160];
    if (f.magic != GRAPHD_FRAME_MAGIC || f.version != GRAPHD_FRAME_VERSION) {
        snprintf(msg, sizeof msg, "bad frame (magic 0x%08x version %u) on the replay connection",
                 f.magic, f.version);
        return conn_refuse(c, f.seq, ST_INVALID_ARGUMENT, msg);
    }
    bool ringed = f.type == GRAPHD_FRAME_RING || (f.type == GRAPHD_FRAME_WAKE && c->ring != NULL);
    if ((f.type != GRAPHD_FRAME_REPLAY && !ringed) || f.msg_len != 0) {
        snprintf(msg, sizeof msg,
                 "the replay connection takes REPLAY, RING and (with a ring) WAKE frames without "
                 "a message, not type 0x%04x with %u bytes (other frames go on the session socket)",
                 f.type, f.msg_len);
        return conn_refuse(c, f.seq, ST_INVALID_ARGUMENT, msg);
    }
    memmove(c->in, c->in + GRAPHD_FRAME_SIZE, c->in_len - GRAPHD_FRAME_SIZE);
    c->in_len -= GRAPHD_FRAME_SIZE;
    if (f.type == GRAPHD_FRAME_RING)
        return conn_ring(c, &f);
    if (f.type == GRAPHD_FRAME_WAKE)
        return true;         /* the ring is looked at each round anyway */
    if (c->passed_fd >= 0) { /* a descriptor that no frame here takes */
        close(c->passed_fd);
        c->passed_fd = -1;
    }
    *ran = true;
    return direct_replay(c, &f);
}

/* Reads what c's socket holds, up to max bytes and the room left. false: EOF or an error. A
 * descriptor that comes with the bytes is kept for RING (one at a time; others are closed). */
static bool conn_read(conn_t *c, size_t max)
{
    size_t room = sizeof c->in - c->in_len;
    if (room > max)
        room = max;
    if (room == 0)
        return true;
    union {
        char buf[CMSG_SPACE(sizeof(int) * 4)];
        struct cmsghdr align;
    } control;
    struct iovec iov = {.iov_base = c->in + c->in_len, .iov_len = room};
    struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t r;
    do {
        mh.msg_control = control.buf;
        mh.msg_controllen = sizeof control.buf;
        r = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    } while (r < 0 && errno == EINTR);
    if (r < 0)
        return errno == EAGAIN || errno == EWOULDBLOCK;
    graphd_take_fds(&mh, &c->passed_fd);
    if (r == 0)
        return false;
    c->in_len += (size_t)r;
    return true;
}

/* Closes c; the frames still queued on it (read ahead, or in its socket) are dropped unrun. */
static void conn_close(conn_t *c)
{
    int queued = 0;
    if (ioctl(c->fd, FIONREAD, &queued) != 0 || queued < 0)
        queued = 0;
    uint64_t frames = (c->in_len + (size_t)queued) / GRAPHD_FRAME_SIZE;
    if (c->ring != NULL) {
        int64_t waiting = ring_waiting(c);
        frames += waiting > 0 ? (uint64_t)waiting : 0;
        munmap(c->ring, GRAPHD_RING_BYTES);
    }
    if (c->passed_fd >= 0)
        close(c->passed_fd);
    if (frames)
        atomic_fetch_add(&X.state->replays_dropped, frames);
    shutdown(c->fd,
             SHUT_RDWR); /* the daemon holds this end too: the client sees EOF all the same */
    close(c->fd);
    free(c->out);
    free(c);
}

/* Removes the connections marked closed (fd < 0 after conn_close's caller marks it). */
static void conns_compact(void)
{
    size_t k = 0;
    for (size_t i = 0; i < X.nconns; i++)
        if (X.conns[i])
            X.conns[k++] = X.conns[i];
    X.nconns = k;
}

static void conn_drop(size_t i)
{
    conn_close(X.conns[i]);
    X.conns[i] = NULL;
}

/* Runs the frames that session's connections hold now (read ahead or queued in the socket), so
 * that a replay sent before a release of its graph still runs. Bounded by what is queued now. */
static void drain_session(uint64_t session)
{
    for (size_t i = 0; i < X.nconns; i++) {
        conn_t *c = X.conns[i];
        if (c == NULL || c->session != session)
            continue;
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        if (poll(&p, 1, 0) > 0 && (p.revents & (POLLHUP | POLLERR | POLLNVAL))) {
            conn_drop(i); /* the session has ended: its queued frames go unrun */
            continue;
        }
        int queued = 0;
        if (ioctl(c->fd, FIONREAD, &queued) != 0 || queued < 0)
            queued = 0;
        size_t budget = (size_t)queued;
        bool ok = true, ran = false;
        /* The ring's slots written by now first (the client may go on writing: bounded). */
        int64_t slots = c->ring != NULL ? ring_waiting(c) : 0;
        for (int64_t k = 0; ok && k < slots; k++)
            ok = ring_serve_one(c);
        if (slots < 0)
            ok = ring_out_of_step(c);
        for (;;) {
            while (ok && (ok = conn_serve_one(c, &ran, false)) && ran)
                ;
            if (!ok || budget == 0)
                break;
            size_t before = c->in_len;
            ok = conn_read(c, budget);
            size_t got = c->in_len - before;
            if (got == 0)
                break;
            budget -= got < budget ? got : budget;
        }
        if (!ok)
            conn_drop(i);
    }
    conns_compact();
}

static int op_conn_open(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)out;
    uint64_t session = gx_get_u64(r);
    int rc = parsed(r, "CONN_OPEN");
    if (rc)
        return rc;
    struct stat st;
    if (m->nfds != 1 || m->fds_lost || fstat(m->fds[0], &st) != 0 || !S_ISSOCK(st.st_mode))
        return reject(GR_EINVAL, "CONN_OPEN takes one socket");
    if (session == 0)
        return reject(GR_EINVAL, "CONN_OPEN: session 0");
    if (X.nconns == CONN_MAX)
        return reject(GR_ENOMEM,
                      "CONN_OPEN: this executor already serves %d connections; end sessions of "
                      "this uid on %s first",
                      CONN_MAX, X.args.device);
    conn_t *c = calloc(1, sizeof *c);
    if (c == NULL)
        return reject(GR_ENOMEM, "CONN_OPEN: out of memory");
    int fl = fcntl(m->fds[0], F_GETFL);
    if (fl < 0 || fcntl(m->fds[0], F_SETFL, fl | O_NONBLOCK) != 0) {
        free(c);
        return reject(GR_EINTERNAL, "CONN_OPEN: fcntl: %s", strerror(errno));
    }
    c->fd = m->fds[0];
    c->passed_fd = -1;
    m->fds[0] = -1; /* the connection's now */
    c->session = session;
    X.conns[X.nconns++] = c;
    return GR_OK;
}

static int op_graph_bind(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r), session = gx_get_u64(r), handle = gx_get_u64(r);
    uint32_t slot = gx_get_u32(r);
    int rc = parsed(r, "GRAPH_BIND");
    if (rc)
        return rc;
    entry_t *g = table_find(&X.graphs, id);
    if (g == NULL)
        return not_found(&X.graphs, id);
    if (handle == 0 || session == 0)
        return reject(GR_EINVAL, "GRAPH_BIND: handle and session must not be 0");
    if (slot >= GX_STATE_SLOTS && slot != GX_NO_SLOT)
        return reject(GR_EINVAL, "GRAPH_BIND: slot %u is past the state page's %d", slot,
                      GX_STATE_SLOTS);
    entry_t *other = graph_by_handle(handle);
    if (other != NULL && other != g)
        return reject(GR_EINVAL, "GRAPH_BIND: handle %" PRIu64 " is bound to graph %" PRIu64,
                      handle, other->id);
    g->handle = handle;
    g->session = session;
    g->slot = slot;
    return GR_OK;
}

static int op_session_bind(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t session = gx_get_u64(r);
    uint32_t what = gx_get_u32(r);
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "SESSION_BIND");
    if (rc)
        return rc;
    if (what > GX_BIND_DONE)
        return reject(GR_EINVAL, "SESSION_BIND: %u is not a GX_BIND_ kind", what);
    table_t *t = what == GX_BIND_SEQ ? &X.seqs : &X.events;
    if (table_find(t, id) == NULL)
        return not_found(t, id);
    if (session == 0)
        return reject(GR_EINVAL, "SESSION_BIND: session 0");
    sess_t *s = sess_get(session);
    if (s == NULL)
        return reject(GR_ENOMEM, "SESSION_BIND: out of memory");
    if (what == GX_BIND_SEQ) {
        s->seq = id;
        s->last = 0;
    } else if (what == GX_BIND_WAIT) {
        s->wait = id;
    } else {
        s->done = id;
    }
    return GR_OK;
}

static int op_graph_replay(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    uint64_t id = gx_get_u64(r);
    int32_t phase = gx_get_i32(r);
    uint32_t mode = gx_get_u32(r);
    uint64_t a = 0, b = 0;
    if (mode == GX_REPLAY_ORDERED || mode == GX_REPLAY_POSTED) {
        a = gx_get_u64(r);
        b = gx_get_u64(r);
    } else if (!r->bad && mode != GX_REPLAY_PLAIN) {
        return reject(GR_EINVAL, "GRAPH_REPLAY: mode %u is not a GX_REPLAY_ mode", mode);
    }
    int rc = parsed(r, "GRAPH_REPLAY");
    if (rc)
        return rc;
    entry_t *g = table_find(&X.graphs, id);
    uint64_t ns = 0;
    if (mode == GX_REPLAY_POSTED) {
        /* Only this thread destroys seqs, so the handle stays valid after the lock. */
        pthread_mutex_lock(&X.seq_lock);
        entry_t *s = table_find(&X.seqs, a);
        gr_seq_t *seq = s ? s->obj : NULL;
        pthread_mutex_unlock(&X.seq_lock);
        if (seq == NULL)
            return not_found(&X.seqs, a);
        if (b == 0)
            return reject(GR_EINVAL, "GRAPH_REPLAY: posted sequence number 0 (they start at 1)");
        if (g == NULL) {
            /* As gr_graph_replay by counters on failure: done = n, so the client's wait ends. */
            gr_seq_skip(seq, b);
            return not_found(&X.graphs, id);
        }
        const gr_order_t order = {.seq = seq, .n = b};
        rc = gr_graph_replay(g->obj, phase, &order, &ns);
    } else if (g == NULL) {
        return not_found(&X.graphs, id);
    } else if (mode == GX_REPLAY_ORDERED) {
        entry_t *w = table_find(&X.events, a), *d = table_find(&X.events, b);
        if (w == NULL || d == NULL)
            return not_found(&X.events, w == NULL ? a : b);
        const gr_order_t order = {.wait = w->obj, .done = d->obj};
        rc = gr_graph_replay(g->obj, phase, &order, &ns);
    } else {
        rc = gr_graph_replay(g->obj, phase, NULL, &ns);
    }
    if (rc)
        return gr_failed(rc);
    gx_put_u64(out, ns);
    return GR_OK;
}

static int op_graph_destroy(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "GRAPH_DESTROY");
    if (rc)
        return rc;
    entry_t *e = table_find(&X.graphs, id);
    if (e == NULL)
        return not_found(&X.graphs, id);
    if (e->handle) {
        drain_session(e->session); /* may run replays of e: look it up again after */
        e = table_find(&X.graphs, id);
    }
    graph_free(e);
    return GR_OK;
}

static int op_device_alloc(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    uint64_t bytes = gx_get_u64(r);
    int rc = parsed(r, "DEVICE_ALLOC");
    if (rc || (rc = check_device(device, "DEVICE_ALLOC")))
        return rc;
    if (X.n_devblocks == X.cap_devblocks) {
        size_t cap = X.cap_devblocks ? 2 * X.cap_devblocks : 16;
        devblock_t **v = realloc(X.devblocks, cap * sizeof *v);
        if (v == NULL)
            return reject(GR_ENOMEM, "DEVICE_ALLOC: out of memory");
        X.devblocks = v;
        X.cap_devblocks = cap;
    }
    devblock_t *b = calloc(1, sizeof *b);
    if (b == NULL)
        return reject(GR_ENOMEM, "DEVICE_ALLOC: out of memory");
    uint8_t handle[GR_IPC_HANDLE_SIZE] = {0};
    rc = gr_device_alloc(device, bytes, &b->ptr, handle);
    if (rc) {
        free(b);
        return gr_failed(rc);
    }
    b->bytes = bytes;
    snprintf(b->device, sizeof b->device, "%s", device);
    X.devblocks[X.n_devblocks++] = b;
    gx_put_u64(out, (uint64_t)(uintptr_t)b->ptr);
    gx_put(out, handle, sizeof handle);
    return GR_OK;
}

static void devblock_free(size_t i)
{
    devblock_t *b = X.devblocks[i];
    gr_device_free(b->device, b->ptr);
    free(b);
    X.devblocks[i] = X.devblocks[--X.n_devblocks];
}

static int op_device_free(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    uint64_t ptr = gx_get_u64(r);
    int rc = parsed(r, "DEVICE_FREE");
    if (rc || (rc = check_device(device, "DEVICE_FREE")))
        return rc;
    for (size_t i = 0; i < X.n_devblocks; i++) {
        devblock_t *b = X.devblocks[i];
        if ((uint64_t)(uintptr_t)b->ptr != ptr)
            continue;
        if (b->users)
            return reject(GR_EBUSY,
                          "DEVICE_FREE: block 0x%" PRIx64 " is the static block of %u graph(s); "
                          "destroy them first",
                          ptr, b->users);
        devblock_free(i);
        return GR_OK;
    }
    return reject(GR_EINVAL, "DEVICE_FREE: 0x%" PRIx64 " is not a block DEVICE_ALLOC gave out",
                  ptr);
}

static int op_event_create(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    int rc = parsed(r, "EVENT_CREATE");
    if (rc || (rc = check_device(device, "EVENT_CREATE")))
        return rc;
    if (!table_reserve(&X.events, 1))
        return reject(GR_ENOMEM, "EVENT_CREATE: out of memory for the event table");
    gr_event_t *ev = NULL;
    uint8_t handle[GR_IPC_HANDLE_SIZE] = {0};
    rc = gr_event_create(device, &ev, handle);
    if (rc)
        return gr_failed(rc);
    gx_put_u64(out, table_add(&X.events, ev)->id);
    gx_put(out, handle, sizeof handle);
    return GR_OK;
}

static int op_event_open(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    const uint8_t *handle = gx_get_span(r, GR_IPC_HANDLE_SIZE);
    int rc = parsed(r, "EVENT_OPEN");
    if (rc || (rc = check_device(device, "EVENT_OPEN")))
        return rc;
    if (!table_reserve(&X.events, 1))
        return reject(GR_ENOMEM, "EVENT_OPEN: out of memory for the event table");
    uint8_t h[GR_IPC_HANDLE_SIZE];
    memcpy(h, handle, sizeof h);
    gr_event_t *ev = NULL;
    rc = gr_event_open(device, h, &ev);
    if (rc)
        return gr_failed(rc);
    gx_put_u64(out, table_add(&X.events, ev)->id);
    return GR_OK;
}

static int op_event_destroy(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "EVENT_DESTROY");
    if (rc)
        return rc;
    entry_t *e = table_find(&X.events, id);
    if (e == NULL)
        return not_found(&X.events, id);
    gr_event_destroy(e->obj);
    table_remove(&X.events, e);
    sess_forget(id, false);
    return GR_OK;
}

static int op_seq_create(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    char device[GR_DEVICE_MAX];
    gx_get_str(r, device, sizeof device);
    int rc = parsed(r, "SEQ_CREATE");
    if (rc || (rc = check_device(device, "SEQ_CREATE")))
        return rc;
    gr_seq_t *s = NULL;
    uint8_t handle[GR_IPC_HANDLE_SIZE] = {0};
    rc = gr_seq_create(device, &s, handle);
    if (rc)
        return gr_failed(rc);
    pthread_mutex_lock(&X.seq_lock);
    entry_t *e = table_add(&X.seqs, s);
    uint64_t id = e ? e->id : 0;
    pthread_mutex_unlock(&X.seq_lock);
    if (id == 0) {
        gr_seq_destroy(s);
        return reject(GR_ENOMEM, "SEQ_CREATE: out of memory for the seq table");
    }
    gx_put_u64(out, id);
    gx_put(out, handle, sizeof handle);
    return GR_OK;
}

static int op_seq_skip(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    uint64_t n = gx_get_u64(r);
    int rc = parsed(r, "SEQ_SKIP");
    if (rc)
        return rc;
    pthread_mutex_lock(&X.seq_lock);
    entry_t *e = table_find(&X.seqs, id);
    gr_seq_t *s = e ? e->obj : NULL;
    pthread_mutex_unlock(&X.seq_lock);
    if (s == NULL)
        return not_found(&X.seqs, id);
    rc = gr_seq_skip(s, n);
    return rc ? gr_failed(rc) : GR_OK;
}

/* SEQ_SKIP from the urgent socket: under the lock, so SEQ_DESTROY waits for it. */
static int seq_skip(uint64_t id, uint64_t n)
{
    pthread_mutex_lock(&X.seq_lock);
    entry_t *e = table_find(&X.seqs, id);
    int rc = e ? gr_seq_skip(e->obj, n) : GR_ENOTFOUND;
    pthread_mutex_unlock(&X.seq_lock);
    return rc;
}

/* SEQ_RELEASE on either socket: under the lock, so SEQ_DESTROY waits for it. */
static int seq_release(uint64_t id)
{
    pthread_mutex_lock(&X.seq_lock);
    entry_t *e = table_find(&X.seqs, id);
    int rc = e ? gr_seq_release(e->obj) : GR_ENOTFOUND;
    pthread_mutex_unlock(&X.seq_lock);
    return rc;
}

static int op_seq_release(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "SEQ_RELEASE");
    if (rc)
        return rc;
    rc = seq_release(id);
    if (rc == GR_ENOTFOUND)
        return not_found(&X.seqs, id);
    return rc ? gr_failed(rc) : GR_OK;
}

static int op_seq_destroy(gx_rbuf_t *r, msg_t *m, gx_wbuf_t *out)
{
    (void)m;
    (void)out;
    uint64_t id = gx_get_u64(r);
    int rc = parsed(r, "SEQ_DESTROY");
    if (rc)
        return rc;
    pthread_mutex_lock(&X.seq_lock);
    entry_t *e = table_find(&X.seqs, id);
    gr_seq_t *s = e ? e->obj : NULL;
    if (e)
        table_remove(&X.seqs, e);
    pthread_mutex_unlock(&X.seq_lock);
    if (s == NULL)
        return not_found(&X.seqs, id);
    /* End every wait on them first. The daemon sends SEQ_RELEASE on the urgent socket before it
     * queues this, but the urgent thread may not have run it yet: a stream still waiting for a
     * dead client's ready would never end, and freeing the counters (which synchronizes) would
     * wait for it for ever. */
    (void)gr_seq_release(s);
    gr_seq_destroy(s);
    sess_forget(id, true);
    return GR_OK;
}

static const struct {
    const char *name;
    op_fn fn;
} OPS[] = {
    [GX_OP_MODULE_LOAD] = {"MODULE_LOAD", op_module_load},
    [GX_OP_MODULE_RELEASE] = {"MODULE_RELEASE", op_module_release},
    [GX_OP_POOL_CREATE] = {"POOL_CREATE", op_pool_create},
    [GX_OP_POOL_DESTROY] = {"POOL_DESTROY", op_pool_destroy},
    [GX_OP_POOL_MEMORY] = {"POOL_MEMORY", op_pool_memory},
    [GX_OP_CAPTURE_PREPARE] = {"CAPTURE_PREPARE", op_capture_prepare},
    [GX_OP_CAPTURE_ABORT] = {"CAPTURE_ABORT", op_capture_abort},
    [GX_OP_CAPTURE_FINISH] = {"CAPTURE_FINISH", op_capture_finish},
    [GX_OP_GRAPH_REPLAY] = {"GRAPH_REPLAY", op_graph_replay},
    [GX_OP_GRAPH_DESTROY] = {"GRAPH_DESTROY", op_graph_destroy},
    [GX_OP_DEVICE_ALLOC] = {"DEVICE_ALLOC", op_device_alloc},
    [GX_OP_DEVICE_FREE] = {"DEVICE_FREE", op_device_free},
    [GX_OP_EVENT_CREATE] = {"EVENT_CREATE", op_event_create},
    [GX_OP_EVENT_OPEN] = {"EVENT_OPEN", op_event_open},
    [GX_OP_EVENT_DESTROY] = {"EVENT_DESTROY", op_event_destroy},
    [GX_OP_SEQ_CREATE] = {"SEQ_CREATE", op_seq_create},
    [GX_OP_SEQ_SKIP] = {"SEQ_SKIP", op_seq_skip},
    [GX_OP_SEQ_RELEASE] = {"SEQ_RELEASE", op_seq_release},
    [GX_OP_SEQ_DESTROY] = {"SEQ_DESTROY", op_seq_destroy},
    [GX_OP_CONN_OPEN] = {"CONN_OPEN", op_conn_open},
    [GX_OP_GRAPH_BIND] = {"GRAPH_BIND", op_graph_bind},
    [GX_OP_SESSION_BIND] = {"SESSION_BIND", op_session_bind},
};

/* Runs one request and sends its reply; false when the reply cannot be sent. */
static bool serve_one(msg_t *m)
{
    gx_wbuf_t out = {0};
    uint32_t op = m->hdr.op;
    X.err[0] = '\0';
    int rc;
    if (op >= sizeof OPS / sizeof OPS[0] || OPS[op].fn == NULL) {
        rc = reject(GR_EINVAL, "op %u is not a request this executor serves", op);
    } else if (m->payload == NULL && m->hdr.len > 0) {
        rc = reject(GR_ENOMEM, "%s: no memory for a payload of %" PRIu64 " bytes", OPS[op].name,
                    m->hdr.len);
    } else if (op != GX_OP_CAPTURE_FINISH && op != GX_OP_CONN_OPEN &&
               (m->nfds || m->hdr.nfds || m->fds_lost)) {
        rc = reject(GR_EINVAL,
                    "%s: the request carries fds; only CAPTURE_FINISH and CONN_OPEN take any",
                    OPS[op].name);
    } else {
        gx_rbuf_t r = {m->payload, (size_t)m->hdr.len, 0, false};
        rc = OPS[op].fn(&r, m, &out);
        if (rc == GR_OK && out.oom) {
            /* Only reply building can run out here; the object stays, the daemon is told. */
            rc = reject(GR_ENOMEM, "%s: out of memory for the reply", OPS[op].name);
        }
    }
    bool ok;
    if (rc == GR_OK)
        ok = send_msg(GX_CHANNEL_FD, op, m->hdr.seq, GR_OK, out.data, out.len);
    else
        ok = send_msg(GX_CHANNEL_FD, op, m->hdr.seq, rc, X.err, strlen(X.err));
    gx_wbuf_free(&out);
    return ok;
}

/* ---- serving ------------------------------------------------------------------------------ */

/* One channel request, when one is there. 1: served; 0: EOF (the daemon is done); -1: broken. */
static int serve_channel(void)
{
    msg_t m;
    int r = read_msg(GX_CHANNEL_FD, &m, "channel");
    if (r <= 0)
        return r;
    bool sent = serve_one(&m);
    msg_free(&m);
    if (!sent) {
        fprintf(stderr, "graphd-executor: channel: the reply could not be sent: %s\n",
                strerror(errno));
        return -1;
    }
    return 1;
}

/*
 * The main thread's loop: in each round one channel request (when one is there), then one frame
 * of each direct connection, starting one further along each round. A connection whose peer is gone
 * is closed with what it still has queued. After a replay on a device it polls rather than sleeps
 * for --spin-us, as the daemon's threads did. 0 at the channel's EOF, else EXIT_BROKEN.
 */
/* Before the loop may sleep in poll (on): marks every ring asleep, then looks at each again
 * (after a full fence, which the client's side mirrors: graphd_ring_t). true when none has a
 * slot waiting, and the loop may sleep: a client that writes one from now on sends WAKE. false
 * (and nothing marked) when one has. After the poll (off): clears the marks. */
static bool rings_asleep(bool on)
{
    for (size_t i = 0; i < X.nconns; i++)
        if (X.conns[i]->ring != NULL)
            __atomic_store_n(&X.conns[i]->ring->asleep, on ? 1u : 0u, __ATOMIC_RELAXED);
    if (!on)
        return false;
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
    for (size_t i = 0; i < X.nconns; i++)
        if (X.conns[i]->ring != NULL && ring_waiting(X.conns[i]) != 0) {
            rings_asleep(false);
            return false;
        }
    return true;
}

/* While device frees are deferred, how often the idle loop retries them, in milliseconds. */
#define RECLAIM_POLL_MS 20

/* How long one turn of the hot loop waits for a ring slot in user space before it polls, unless
 * --spin-slice-us says otherwise (the daemon's replay_spin_slice_us). */
#define SPIN_SLICE_US_DEFAULT 20

/* While the loop is hot (--spin-us) and every connection is on a replay ring with nothing else
 * to do: waits for a ring slot with the CPU's spin-wait hint, up to --spin-slice-us or hot_until,
 * before the loop's poll (0: no wait, a poll on every turn). Polling on every turn made the hot
 * loop a system call every microsecond for as long as training went on. Sockets and the channel
 * are polled every slice still (a frame or a daemon request waits at most that much longer while
 * the loop is hot). 0 gave no gain over 20 µs in the step, the round trip or shared
 * throughput, one run each (docs/BENCHMARKS.md, issue 18's targets, twenty-fifth session). */
static void spin_on_rings(uint64_t hot_until)
{
    if (X.args.spin_slice_us == 0 || X.nconns == 0 || IN.tail > IN.head)
        return;
    for (size_t i = 0; i < X.nconns; i++)
        if (X.conns[i]->ring == NULL || X.conns[i]->in_len > 0 || X.conns[i]->out_len > 0)
            return;
    uint64_t until = now_ns() + X.args.spin_slice_us * 1000;
    if (until > hot_until)
        until = hot_until;
    do {
        for (int k = 0; k < 64; k++) {
            for (size_t i = 0; i < X.nconns; i++)
                if (ring_waiting(X.conns[i]) != 0)
                    return;
#if defined(__x86_64__) || defined(__i386__)
            __builtin_ia32_pause();
#elif defined(__aarch64__)
            __asm__ __volatile__("yield");
#endif
        }
    } while (now_ns() < until);
}

static int serve(void)
{
    static struct pollfd pf[1 + CONN_MAX];
    const bool device = strncmp(X.args.device, "cpu", 3) != 0;
    uint64_t hot_until = 0;
    /* Deferred device frees (gr_device_free, gr_seq_destroy: never a cudaFree that waits for
     * the device on a request's path) are run here, when the loop is about to sleep: after a
     * channel request, then every RECLAIM_POLL_MS while some are still deferred. */
    bool reclaim_due = false;
    uint64_t reclaim_pending = 0;
    for (;;) {
        bool more = IN.tail > IN.head;
        for (size_t i = 0; i < X.nconns && !more; i++)
            more = X.conns[i]->in_len >= GRAPHD_FRAME_SIZE ||
                   (X.conns[i]->ring != NULL && ring_waiting(X.conns[i]) != 0);
        int timeout = more || (hot_until && now_ns() < hot_until) ? 0 : -1;
        if (timeout < 0 && device && (reclaim_due || reclaim_pending)) {
            if (gr_device_reclaim(X.args.device, 0, &reclaim_pending) != GR_OK)
                fprintf(stderr, "graphd-executor: deferred frees: %s\n", gr_last_error());
            reclaim_due = false;
            if (reclaim_pending)
                timeout = RECLAIM_POLL_MS;
        }
        pf[0] = (struct pollfd){.fd = GX_CHANNEL_FD, .events = POLLIN};
        for (size_t i = 0; i < X.nconns; i++)
            pf[1 + i] =
                (struct pollfd){.fd = X.conns[i]->fd,
                                .events = (short)(POLLIN | (X.conns[i]->out_len ? POLLOUT : 0))};
        size_t npf = 1 + X.nconns;
        if (timeout == 0 && !more && device)
            spin_on_rings(hot_until);
        bool asleep = timeout != 0 && rings_asleep(true);
        if (timeout != 0 && !asleep)
            timeout = 0; /* a ring took a slot while we looked */
        int polled = poll(pf, npf, timeout);
        if (asleep)
            rings_asleep(false);
        if (polled < 0 && errno != EINTR) {
            fprintf(stderr, "graphd-executor: poll: %s\n", strerror(errno));
            return EXIT_BROKEN;
        }
        for (size_t i = 0; i + 1 < npf; i++) {
            short re = pf[1 + i].revents;
            conn_t *c = X.conns[i];
            bool ok = !(re & (POLLHUP | POLLERR | POLLNVAL));
            if (ok && (re & POLLOUT))
                ok = conn_flush(c);
            if (ok && (re & POLLIN))
                ok = conn_read(c, SIZE_MAX);
            if (!ok)
                conn_drop(i);
        }
        conns_compact();
        /* One channel request, then one frame of each connection: the daemon's calls (which
         * carry the replays of every session socket of this uid) take turns with them. */
        if ((pf[0].revents & (POLLIN | POLLHUP | POLLERR)) || IN.tail > IN.head) {
            int r = serve_channel();
            if (r <= 0)
                return r == 0 ? 0 : EXIT_BROKEN;
            reclaim_due = true;
        }
        size_t n = X.nconns;
        bool ran_any = false;
        for (size_t k = 0; k < n; k++) {
            size_t i = (X.rr + k) % n;
            bool ran;
            if (!conn_serve_one(X.conns[i], &ran, true))
                conn_drop(i);
            ran_any |= ran;
        }
        X.rr++;
        conns_compact();
        if (ran_any && device && X.args.spin_us)
            hot_until = now_ns() + X.args.spin_us * 1000;
    }
}

/* ---- the urgent socket -------------------------------------------------------------------- */

static void *urgent_main(void *arg)
{
    (void)arg;
    for (;;) {
        msg_t m;
        gx_msg_hdr_t *h = &m.hdr;
        memset(&m, 0, sizeof m);
        int r = read_full(GX_URGENT_FD, h, sizeof *h, &m);
        msg_close_fds(&m); /* nothing on this socket takes fds */
        if (r == 0)
            return NULL;
        if (r < 0 || h->magic != GX_MAGIC || h->len > URGENT_MAX) {
            fprintf(stderr, "graphd-executor: urgent socket: broken message; no longer served\n");
            return NULL;
        }
        uint8_t payload[URGENT_MAX];
        if (h->len && read_full(GX_URGENT_FD, payload, h->len, &m) != 1) {
            msg_close_fds(&m);
            fprintf(stderr, "graphd-executor: urgent socket: the channel ended inside a "
                            "payload; no longer served\n");
            return NULL;
        }
        msg_close_fds(&m);
        uint64_t id, n = 0;
        if (h->op == GX_OP_SEQ_RELEASE && h->len == 8) {
            memcpy(&id, payload, 8);
        } else if (h->op == GX_OP_SEQ_SKIP && h->len == 16) {
            memcpy(&id, payload, 8);
            memcpy(&n, payload + 8, 8);
        } else {
            fprintf(stderr,
                    "graphd-executor: urgent socket: op %u with %" PRIu64
                    " bytes ignored (only SEQ_RELEASE and SEQ_SKIP)\n",
                    h->op, h->len);
            continue;
        }
        int rc = h->op == GX_OP_SEQ_RELEASE ? seq_release(id) : seq_skip(id, n);
        if (rc)
            fprintf(stderr, "graphd-executor: %s of seq %" PRIu64 ": %s\n",
                    h->op == GX_OP_SEQ_RELEASE ? "SEQ_RELEASE" : "SEQ_SKIP", id,
                    rc == GR_ENOTFOUND ? "no such seq" : gr_last_error());
    }
}

/* ---- start and end ------------------------------------------------------------------------ */

/* Closes every fd above GX_STATE_FD: what the daemon leaked, possibly another tenant's. */
static void close_inherited_fds(void)
{
    if (close_range(GX_STATE_FD + 1, ~0u, 0) == 0)
        return;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) {
        for (int fd = GX_STATE_FD + 1; fd < 65536; fd++)
            close(fd);
        return;
    }
    int self = dirfd(d);
    struct dirent *e;
    int fds[256];
    size_t n = 0;
    while ((e = readdir(d)) != NULL && n < 256) {
        int fd = atoi(e->d_name);
        if (fd > GX_STATE_FD && fd != self)
            fds[n++] = fd;
    }
    closedir(d);
    for (size_t i = 0; i < n; i++)
        close(fds[i]);
    if (n == 256)
        close_inherited_fds(); /* more than one batch */
}

static void usage(const char *msg, const char *arg)
{
    fprintf(stderr, "graphd-executor: %s%s%s\n", msg, arg ? ": " : "", arg ? arg : "");
    fprintf(stderr,
            "usage: graphd-executor --device DEV [--intra-op-threads N] [--cpu-devices N]\n"
            "       [--max-unpacked BYTES] [--call-memory BYTES] [--no-sandbox]\n"
            "       [--reply-max BYTES] [--spin-us US] [--spin-slice-us US] [--cuda-queues N]\n"
            "       [--no-landlock] [--no-seccomp]\n"
            "       [--read PATH]... [--rw PATH]... [--tmp DIR]...\n"
            "fd %d is the daemon's channel, fd %d its urgent socket, fd %d (optional) the state\n"
            "page it reads (started by graphd)\n",
            GX_CHANNEL_FD, GX_URGENT_FD, GX_STATE_FD);
    exit(EXIT_USAGE);
}

static uint64_t parse_u64(const char *flag, const char *s, uint64_t max)
{
    char *end = NULL;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (*s < '0' || *s > '9' || errno || end == s || *end != '\0' || v > max) {
        char what[128];
        snprintf(what, sizeof what, "%s takes a number up to %" PRIu64, flag, max);
        usage(what, s);
    }
    return v;
}

static void parse_args(int argc, char **argv, exec_args_t *a)
{
    memset(a, 0, sizeof *a);
    a->reply_max = 1u << 20;
    a->spin_slice_us = SPIN_SLICE_US_DEFAULT;
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        if (strcmp(f, "--no-sandbox") == 0) {
            a->no_sandbox = true;
            continue;
        }
        if (strcmp(f, "--no-landlock") == 0 || strcmp(f, "--no-seccomp") == 0) {
            *(f[5] == 'l' ? &a->no_landlock : &a->no_seccomp) = true;
            continue;
        }
        if (strcmp(f, "--device") && strcmp(f, "--intra-op-threads") &&
            strcmp(f, "--cpu-devices") && strcmp(f, "--max-unpacked") &&
            strcmp(f, "--call-memory") && strcmp(f, "--read") && strcmp(f, "--rw") &&
            strcmp(f, "--tmp") && strcmp(f, "--reply-max") && strcmp(f, "--spin-us") &&
            strcmp(f, "--spin-slice-us") && strcmp(f, "--cuda-queues"))
            usage("unknown flag", f);
        if (i + 1 >= argc)
            usage("missing the value of", f);
        const char *v = argv[++i];
        if (strcmp(f, "--device") == 0) {
            if (strlen(v) == 0 || strlen(v) >= sizeof a->device)
                usage("--device takes a device name such as cpu:0 or cuda:0", v);
            snprintf(a->device, sizeof a->device, "%s", v);
        } else if (strcmp(f, "--intra-op-threads") == 0) {
            a->intra_op_threads = (int)parse_u64(f, v, 1024);
        } else if (strcmp(f, "--cpu-devices") == 0) {
            a->cpu_devices = (int)parse_u64(f, v, 64);
            if (a->cpu_devices == 0)
                usage("--cpu-devices takes 1 to 64", v);
        } else if (strcmp(f, "--max-unpacked") == 0) {
            a->max_unpacked = parse_u64(f, v, UINT64_MAX);
            a->max_unpacked_set = true;
        } else if (strcmp(f, "--call-memory") == 0) {
            a->call_memory = parse_u64(f, v, UINT64_MAX);
        } else if (strcmp(f, "--reply-max") == 0) {
            a->reply_max = parse_u64(f, v, UINT64_C(1) << 40);
        } else if (strcmp(f, "--spin-us") == 0) {
            a->spin_us = parse_u64(f, v, 1000000);
        } else if (strcmp(f, "--spin-slice-us") == 0) {
            a->spin_slice_us = parse_u64(f, v, 1000);
        } else if (strcmp(f, "--cuda-queues") == 0) {
            a->cuda_queues = parse_u64(f, v, 32);
        } else {
            bool rw = strcmp(f, "--rw") == 0, tmp = strcmp(f, "--tmp") == 0;
            size_t *n = rw ? &a->n_rw : tmp ? &a->n_tmp : &a->n_read;
            const char **v_of = rw ? a->rw_paths : tmp ? a->tmp_paths : a->read_paths;
            if (*n == MAX_PATHS)
                usage("too many paths for", f);
            v_of[(*n)++] = v;
        }
    }
    if (a->device[0] == '\0')
        usage("--device is required", NULL);
}

static void check_socket(int fd, const char *what)
{
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
        fprintf(stderr, "graphd-executor: fd %d (%s) is not a socket; graphd starts executors\n",
                fd, what);
        exit(EXIT_USAGE);
    }
}

/* The state page: the daemon's memfd at GX_STATE_FD when it gave one, else memory of our own (a
 * test that starts the executor by hand). */
static void map_state(void)
{
    struct stat st;
    void *p = MAP_FAILED;
    if (fstat(GX_STATE_FD, &st) == 0 && S_ISREG(st.st_mode) &&
        (uint64_t)st.st_size >= sizeof(gx_state_t))
        p = mmap(NULL, sizeof(gx_state_t), PROT_READ | PROT_WRITE, MAP_SHARED, GX_STATE_FD, 0);
    close(GX_STATE_FD);
    if (p == MAP_FAILED)
        p = mmap(NULL, sizeof(gx_state_t), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1,
                 0);
    if (p == MAP_FAILED) {
        fprintf(stderr, "graphd-executor: mapping the state page: %s\n", strerror(errno));
        exit(EXIT_USAGE);
    }
    X.state = p;
}

/* CUDA maps a context's streams onto CUDA_DEVICE_MAX_CONNECTIONS hardware queues (8 unless set),
 * and two streams on one queue run in one order: a session's replay stream waiting on its
 * client's counters would hold up the work of every other stream on that queue. This executor
 * keeps a stream per session's pool and one per session's counters, so graphd asks for up to 32
 * queues (executor_cuda_queues), set here before the context exists. */
static void runtime_setup(const exec_args_t *a)
{
    if (a->cuda_queues > 0 && strncmp(a->device, "cuda:", 5) == 0) {
        char n[24];
        snprintf(n, sizeof n, "%" PRIu64, a->cuda_queues);
        if (setenv("CUDA_DEVICE_MAX_CONNECTIONS", n, 1) != 0)
            fprintf(stderr, "graphd-executor: CUDA_DEVICE_MAX_CONNECTIONS: %s\n", strerror(errno));
    }
    int rc = gr_runtime_init(a->intra_op_threads);
    if (rc == GR_OK && a->cpu_devices)
        rc = gr_cpu_devices(a->cpu_devices);
    if (rc == GR_OK && a->max_unpacked_set)
        rc = gr_module_max_unpacked(a->max_unpacked);
    if (rc == GR_OK)
        rc = gr_call_memory_max(a->call_memory);
    if (rc != GR_OK) {
        fprintf(stderr, "graphd-executor: setting up the runtime: %s\n", gr_last_error());
        exit(EXIT_USAGE);
    }
}

static bool send_ready(const ready_info_t *ri)
{
    gx_wbuf_t out = {0};
    gx_put_str(&out, gr_runtime_torch_version());
    gx_put_u32(&out, ri->no_new_privs);
    gx_put_u32(&out, ri->landlock_abi);
    gx_put_u32(&out, ri->seccomp);
    gx_put_str(&out, ri->off);
    bool ok = !out.oom && send_msg(GX_CHANNEL_FD, GX_OP_READY, 0, GR_OK, out.data, out.len);
    gx_wbuf_free(&out);
    return ok;
}

/* Frees every object, dependents first (graphs before their pools and device blocks). */
static void free_all(void)
{
    for (size_t i = 0; i < X.nconns; i++)
        conn_drop(i);
    conns_compact();
    free(X.sess);
    X.sess = NULL;
    X.nsess = X.cap_sess = 0;
    while (X.graphs.n)
        graph_free(&X.graphs.v[X.graphs.n - 1]);
    while (X.captures.n)
        capture_free(&X.captures.v[X.captures.n - 1], true);
    for (size_t i = 0; i < X.pools.n; i++)
        gr_pool_destroy(X.pools.v[i].obj);
    for (size_t i = 0; i < X.modules.n; i++)
        gr_module_release(X.modules.v[i].obj);
    for (size_t i = 0; i < X.events.n; i++)
        gr_event_destroy(X.events.v[i].obj);
    for (size_t i = 0; i < X.seqs.n; i++)
        gr_seq_destroy(X.seqs.v[i].obj);
    while (X.n_devblocks)
        devblock_free(X.n_devblocks - 1);
    table_t *tables[] = {&X.modules, &X.pools, &X.captures, &X.graphs, &X.events, &X.seqs};
    for (size_t i = 0; i < sizeof tables / sizeof tables[0]; i++) {
        free(tables[i]->v);
        tables[i]->v = NULL;
        tables[i]->n = tables[i]->cap = 0;
    }
    free(X.devblocks);
    X.devblocks = NULL;
}

int main(int argc, char **argv)
{
    /* The daemon's worker thread that started it ends, or the daemon dies: this executor goes
     * too, whatever its module is doing. */
    pid_t parent = getppid();
    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
    if (getppid() != parent)
        _exit(EXIT_BROKEN);
    close_inherited_fds();
    parse_args(argc, argv, &X.args);
    check_socket(GX_CHANNEL_FD, "channel");
    check_socket(GX_URGENT_FD, "urgent socket");
    map_state();
    signal(SIGPIPE, SIG_IGN);
    runtime_setup(&X.args);

    ready_info_t ready;
    if (enter_sandbox(&X.args, &ready) != 0)
        return EXIT_USAGE;
    pthread_t urgent;
    int err = pthread_create(&urgent, NULL, urgent_main, NULL);
    if (err) {
        fprintf(stderr, "graphd-executor: starting the urgent thread: %s\n", strerror(err));
        return EXIT_USAGE;
    }
    int status = 0;
    if (!send_ready(&ready)) {
        fprintf(stderr, "graphd-executor: sending READY: %s\n", strerror(errno));
        status = EXIT_BROKEN;
    }
    if (status == 0)
        status = serve();
    /* Stop the urgent thread: a read shutdown wakes its recvmsg with EOF. */
    shutdown(GX_URGENT_FD, SHUT_RD);
    pthread_join(urgent, NULL);
    free_all();
#if defined(__SANITIZE_ADDRESS__)
    /* LeakSanitizer's check at exit needs ptrace and fork, which the sandbox refuses: it would
     * turn a clean exit into a failure. Everything is freed above all the same. */
    if (!X.args.no_sandbox) {
        fflush(NULL);
        _exit(status);
    }
#endif
    return status;
}
