/*
 * Tenants against a real daemon: sessions of different uids (SO_PEERCRED) cannot see, map,
 * replay, free, delete or squat each other's pools, regions, graphs and modules; Status shows a
 * tenant its own uid's objects in full and the rest as counts (an admin all, an anonymous
 * caller counts only); the module cache is per uid; and the per-uid and per-session bounds
 * answer RESOURCE_EXHAUSTED naming their setting.
 *
 * A tenant is a raw session opened by this (root) process: Hello over gRPC, then a session
 * socket connected by a short-lived child that switched to the tenant's uid and gid before
 * connect() (the uid SO_PEERCRED reports is the connecting process's) and handed the socket
 * back with SCM_RIGHTS; this process then attaches it. Every request is encoded with the
 * generated protobuf-c code so that any id, including another tenant's, can be asked for.
 * graphctl is also run as another uid through setpriv, end to end.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "graphd.pb-c.h"
#include "graphd_frame.h"

#define M(name) "/graphd.v1.Graphd/" name
/* Each test's tenants have uids of their own (next_uids), so that one test's failure, which
 * leaves its sessions open, cannot use up another's max_sessions_per_uid. */
static uid_t UID_A; /* tenant A, gid UID_A */
static uid_t UID_B; /* tenant B, gid UID_B */
static uid_t UID_C; /* tenant C, gid UID_A: A's group */
static uid_t UID_LIMITS;
static char uid_a_words[64], uid_a_private[64];

static int next_uids(void **state)
{
    static uid_t base = 4100;
    (void)state;
    base += 10;
    UID_A = base + 1;
    UID_B = base + 2;
    UID_C = base + 3;
    UID_LIMITS = base + 4;
    snprintf(uid_a_words, sizeof(uid_a_words), "belongs to uid %u", (unsigned)UID_A);
    snprintf(uid_a_private, sizeof(uid_a_private), "private to uid %u", (unsigned)UID_A);
    return 0;
}
#define GRPC_OK 0
#define GRPC_INVALID_ARGUMENT 3
#define GRPC_NOT_FOUND 5
#define GRPC_ALREADY_EXISTS 6
#define GRPC_PERMISSION_DENIED 7
#define GRPC_RESOURCE_EXHAUSTED 8
#define GRPC_FAILED_PRECONDITION 9

typedef struct tenant {
    uint64_t id, token;
    int fd; /* the attached session socket */
    uint64_t seq;
    uid_t uid;
} tenant_t;

typedef struct fixture {
    harness_fixture_t f;
    char session_path[HARNESS_PATH_MAX + 16];
    void *mlp;
    size_t mlp_len;
} fixture_t;

static char details[1024];

/* ---- raw calls ---------------------------------------------------------------------------- */

/* One call with req packed; *out (optional) gets the unpacked reply (free it). The gRPC code. */
static int call(const fixture_t *fx, const char *method, const ProtobufCMessage *req,
                const ProtobufCMessageDescriptor *rd, ProtobufCMessage **out)
{
    size_t n = protobuf_c_message_get_packed_size(req);
    uint8_t *buf = malloc(n + 1);
    assert_non_null(buf);
    protobuf_c_message_pack(req, buf);
    size_t cap = 1 << 20, len = cap;
    uint8_t *reply = malloc(cap);
    assert_non_null(reply);
    details[0] = '\0';
    int rc =
        harness_raw_call(fx->f.h.address, method, buf, n, details, sizeof(details), reply, &len);
    free(buf);
    if (out != NULL) {
        *out = NULL;
        if (rc == GRPC_OK) {
            assert_true(len <= cap);
            *out = protobuf_c_message_unpack(rd, NULL, len, reply);
            assert_non_null(*out);
        }
    }
    free(reply);
    return rc;
}

static void expect_code(int got, int want, const char *words)
{
    if (got != want)
        fail_msg("status %d, want %d: %s", got, want, details);
    if (words != NULL && strstr(details, words) == NULL)
        fail_msg("'%s' is not in the message: %s", words, details);
}

/* ---- tenants ------------------------------------------------------------------------------ */

/* A socket connected to path by a child running as uid/gid. */
static int connect_as(const char *path, uid_t uid, gid_t gid)
{
    int sp[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (setgroups(0, NULL) != 0 || setresgid(gid, gid, gid) != 0 ||
            setresuid(uid, uid, uid) != 0)
            _exit(2);
        int fd = socket(AF_UNIX, SOCK_STREAM, 0);
        struct sockaddr_un sa = {.sun_family = AF_UNIX};
        if (strlen(path) >= sizeof(sa.sun_path))
            _exit(5);
        memcpy(sa.sun_path, path, strlen(path) + 1);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0)
            _exit(3);
        char control[CMSG_SPACE(sizeof(int))] = {0};
        char one = 1;
        struct iovec iov = {.iov_base = &one, .iov_len = 1};
        struct msghdr msg = {.msg_iov = &iov,
                             .msg_iovlen = 1,
                             .msg_control = control,
                             .msg_controllen = sizeof(control)};
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof(int));
        _exit(sendmsg(sp[1], &msg, 0) == 1 ? 0 : 4);
    }
    close(sp[1]);
    int status = 0;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
        fail_msg("the child connecting as uid %u failed (status 0x%x)", (unsigned)uid, status);
    char control[CMSG_SPACE(sizeof(int))];
    char one;
    struct iovec iov = {.iov_base = &one, .iov_len = 1};
    struct msghdr msg = {.msg_iov = &iov,
                         .msg_iovlen = 1,
                         .msg_control = control,
                         .msg_controllen = sizeof(control)};
    assert_int_equal(recvmsg(sp[0], &msg, 0), 1);
    struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
    assert_non_null(cm);
    int fd;
    memcpy(&fd, CMSG_DATA(cm), sizeof(int));
    close(sp[0]);
    return fd;
}

/* Hello, then the session socket connected as uid/gid and ATTACHed. The ATTACH reply's status
 * (GD codes = gRPC codes), its message in details. */
static int tenant_try_open(const fixture_t *fx, uid_t uid, gid_t gid, tenant_t *t)
{
    memset(t, 0, sizeof(*t));
    t->uid = uid;
    Graphd__V1__HelloRequest req = GRAPHD__V1__HELLO_REQUEST__INIT;
    char name[32];
    snprintf(name, sizeof(name), "tenant-%u", (unsigned)uid);
    req.client_name = name;
    req.pid = (int32_t)getpid();
    req.protocol_version = 1;
    Graphd__V1__HelloReply *rep;
    expect_code(call(fx, M("Hello"), &req.base, &graphd__v1__hello_reply__descriptor,
                     (ProtobufCMessage **)&rep),
                GRPC_OK, NULL);
    t->id = rep->session->id;
    t->token = rep->session->token;
    protobuf_c_message_free_unpacked(&rep->base, NULL);
    t->fd = connect_as(fx->session_path, uid, gid);
    dp_send_frame(t->fd, GRAPHD_FRAME_ATTACH, ++t->seq, t->id, t->token);
    graphd_frame_t f;
    dp_recv_frame(t->fd, &f, details, sizeof(details));
    return (int)f.status;
}

static void tenant_open(const fixture_t *fx, uid_t uid, gid_t gid, tenant_t *t)
{
    expect_code(tenant_try_open(fx, uid, gid, t), GRPC_OK, NULL);
}

/* Closing the socket ends the session, as a killed client's would. */
static void tenant_close(tenant_t *t)
{
    close(t->fd);
    t->fd = -1;
}

static Graphd__V1__SessionRef ref_of(const tenant_t *t)
{
    Graphd__V1__SessionRef r = GRAPHD__V1__SESSION_REF__INIT;
    r.id = t->id;
    r.token = t->token;
    return r;
}

static int create_pool(const fixture_t *fx, const tenant_t *t, const char *name, const char *device,
                       Graphd__V1__PoolMode mode, int with_session)
{
    Graphd__V1__SessionRef r =
        t ? ref_of(t) : (Graphd__V1__SessionRef)GRAPHD__V1__SESSION_REF__INIT;
    Graphd__V1__CreatePoolRequest req = GRAPHD__V1__CREATE_POOL_REQUEST__INIT;
    req.name = (char *)name;
    req.device = (char *)(device ? device : "");
    req.session = t ? &r : NULL;
    req.mode = mode;
    req.delete_with_session = with_session;
    return call(fx, M("CreatePool"), &req.base, NULL, NULL);
}

static int delete_pool(const fixture_t *fx, const tenant_t *t, const char *name)
{
    Graphd__V1__SessionRef r = ref_of(t);
    Graphd__V1__DeletePoolRequest req = GRAPHD__V1__DELETE_POOL_REQUEST__INIT;
    req.name = (char *)name;
    req.session = &r;
    return call(fx, M("DeletePool"), &req.base, NULL, NULL);
}

/* AllocRegion in pool (NULL: default); *id (optional) gets the region. */
static int alloc_region(const fixture_t *fx, const tenant_t *t, const char *pool, uint64_t *id)
{
    Graphd__V1__SessionRef r = ref_of(t);
    Graphd__V1__AllocRegionRequest req = GRAPHD__V1__ALLOC_REGION_REQUEST__INIT;
    req.session = &r;
    req.pool = (char *)(pool ? pool : "");
    req.size = 4096;
    Graphd__V1__AllocRegionReply *rep;
    int rc = call(fx, M("AllocRegion"), &req.base, &graphd__v1__alloc_region_reply__descriptor,
                  (ProtobufCMessage **)&rep);
    if (rc == GRPC_OK) {
        if (id)
            *id = rep->region_id;
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    return rc;
}

static int free_region(const fixture_t *fx, const tenant_t *t, uint64_t id)
{
    Graphd__V1__SessionRef r = ref_of(t);
    Graphd__V1__FreeRegionRequest req = GRAPHD__V1__FREE_REGION_REQUEST__INIT;
    req.session = &r;
    req.region_id = id;
    return call(fx, M("FreeRegion"), &req.base, NULL, NULL);
}

/* RegisterModule with mlp.pt inline; *id and *reused get the reply's. */
static int register_mlp(const fixture_t *fx, const tenant_t *t, uint64_t *id, int *reused)
{
    Graphd__V1__SessionRef r = ref_of(t);
    Graphd__V1__RegisterModuleRequest req = GRAPHD__V1__REGISTER_MODULE_REQUEST__INIT;
    req.session = &r;
    req.source_case = GRAPHD__V1__REGISTER_MODULE_REQUEST__SOURCE_INLINE_BYTES;
    req.inline_bytes.data = fx->mlp;
    req.inline_bytes.len = fx->mlp_len;
    req.name = "mlp-secret-name";
    Graphd__V1__RegisterModuleReply *rep;
    int rc = call(fx, M("RegisterModule"), &req.base,
                  &graphd__v1__register_module_reply__descriptor, (ProtobufCMessage **)&rep);
    if (rc == GRPC_OK) {
        *id = rep->module_id;
        *reused = rep->reused;
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    return rc;
}

/* Captures n graphs of module mid (mlp: x of 16x16) in pool; *gid gets the first graph. */
static int capture(const fixture_t *fx, const tenant_t *t, uint64_t mid, size_t n, const char *pool,
                   uint64_t *gid)
{
    Graphd__V1__SessionRef r = ref_of(t);
    int64_t shape[2] = {16, 16};
    Graphd__V1__TensorSpec spec = GRAPHD__V1__TENSOR_SPEC__INIT;
    spec.dtype = GRAPHD__V1__DTYPE__DTYPE_FLOAT32;
    spec.n_shape = 2;
    spec.shape = shape;
    Graphd__V1__TensorSpec *specs[1] = {&spec};
    Graphd__V1__Callable c[4], *cl[4];
    assert_true(n <= 4);
    for (size_t i = 0; i < n; i++) {
        graphd__v1__callable__init(&c[i]);
        c[i].module_id = mid;
        c[i].method = "";
        c[i].n_sample_args = 1;
        c[i].sample_args = specs;
        cl[i] = &c[i];
    }
    Graphd__V1__CaptureRequest req = GRAPHD__V1__CAPTURE_REQUEST__INIT;
    req.session = &r;
    req.n_callables = n;
    req.callables = cl;
    req.pool = (char *)(pool ? pool : "");
    req.warmup_case = GRAPHD__V1__CAPTURE_REQUEST__WARMUP_NUM_WARMUP_ITERS;
    req.num_warmup_iters = 0;
    Graphd__V1__CaptureReply *rep;
    int rc = call(fx, M("Capture"), &req.base, &graphd__v1__capture_reply__descriptor,
                  (ProtobufCMessage **)&rep);
    if (rc == GRPC_OK) {
        if (gid)
            *gid = rep->graphs[0]->graph_id;
        protobuf_c_message_free_unpacked(&rep->base, NULL);
    }
    return rc;
}

/* A frame request on t's session socket; the reply's status, its message in details. */
static int frame(tenant_t *t, uint16_t type, uint64_t id)
{
    dp_send_frame(t->fd, type, ++t->seq, id, 0);
    graphd_frame_t f;
    dp_recv_frame(t->fd, &f, details, sizeof(details));
    assert_int_equal(f.seq, t->seq);
    return (int)f.status;
}

/* Status as t (NULL: anonymous). Free with protobuf_c_message_free_unpacked. */
static Graphd__V1__StatusReply *status_as(const fixture_t *fx, const tenant_t *t)
{
    Graphd__V1__SessionRef r =
        t ? ref_of(t) : (Graphd__V1__SessionRef)GRAPHD__V1__SESSION_REF__INIT;
    Graphd__V1__StatusRequest req = GRAPHD__V1__STATUS_REQUEST__INIT;
    req.session = t ? &r : NULL;
    Graphd__V1__StatusReply *rep;
    expect_code(call(fx, M("Status"), &req.base, &graphd__v1__status_reply__descriptor,
                     (ProtobufCMessage **)&rep),
                GRPC_OK, NULL);
    return rep;
}

static Graphd__V1__ListPoolsReply *pools_as(const fixture_t *fx, const tenant_t *t)
{
    Graphd__V1__SessionRef r =
        t ? ref_of(t) : (Graphd__V1__SessionRef)GRAPHD__V1__SESSION_REF__INIT;
    Graphd__V1__ListPoolsRequest req = GRAPHD__V1__LIST_POOLS_REQUEST__INIT;
    req.session = t ? &r : NULL;
    Graphd__V1__ListPoolsReply *rep;
    expect_code(call(fx, M("ListPools"), &req.base, &graphd__v1__list_pools_reply__descriptor,
                     (ProtobufCMessage **)&rep),
                GRPC_OK, NULL);
    return rep;
}

static const Graphd__V1__Pool *find_pool(Graphd__V1__Pool **pools, size_t n, const char *name)
{
    for (size_t i = 0; i < n; i++)
        if (strcmp(pools[i]->name, name) == 0)
            return pools[i];
    return NULL;
}

static const Graphd__V1__SessionStatus *find_session(const Graphd__V1__StatusReply *st, uint64_t id)
{
    for (size_t i = 0; i < st->n_sessions; i++)
        if (st->sessions[i]->id == id)
            return st->sessions[i];
    return NULL;
}

static const Graphd__V1__GraphStatus *find_graph(const Graphd__V1__StatusReply *st, uint64_t id)
{
    for (size_t i = 0; i < st->n_graphs; i++)
        if (st->graphs[i]->id == id)
            return st->graphs[i];
    return NULL;
}

/* ---- tests ------------------------------------------------------------------------------- */

static void pools_have_owners_and_modes(void **state)
{
    fixture_t *fx = *state;
    tenant_t a, b, c;
    tenant_open(fx, UID_A, UID_A, &a);
    tenant_open(fx, UID_B, UID_B, &b);
    tenant_open(fx, UID_C, UID_A, &c); /* A's group */

    /* No session, no owner. */
    expect_code(create_pool(fx, NULL, "t-anon", NULL, 0, 0), GRPC_FAILED_PRECONDITION,
                "needs an attached session");
    expect_code(create_pool(fx, &a, "t-a-priv", NULL, 0, 0), GRPC_OK, NULL); /* private */
    expect_code(create_pool(fx, &a, "t-a-group", NULL, GRAPHD__V1__POOL_MODE__POOL_MODE_GROUP, 0),
                GRPC_OK, NULL);
    expect_code(create_pool(fx, &a, "t-a-pub", NULL, GRAPHD__V1__POOL_MODE__POOL_MODE_PUBLIC, 0),
                GRPC_OK, NULL);
    expect_code(create_pool(fx, &a, "t-bad", NULL, (Graphd__V1__PoolMode)9, 0),
                GRPC_INVALID_ARGUMENT, "pool mode");

    /* B can neither squat, delete nor use A's private pool, nor touch the daemon's. */
    expect_code(create_pool(fx, &b, "t-a-priv", NULL, 0, 0), GRPC_ALREADY_EXISTS, NULL);
    expect_code(delete_pool(fx, &b, "t-a-priv"), GRPC_PERMISSION_DENIED, uid_a_words);
    expect_code(delete_pool(fx, &b, "t-a-pub"), GRPC_PERMISSION_DENIED,
                "only its owner or an admin");
    expect_code(delete_pool(fx, &b, "default"), GRPC_PERMISSION_DENIED, "default pool");
    expect_code(alloc_region(fx, &b, "t-a-priv", NULL), GRPC_PERMISSION_DENIED, uid_a_private);
    expect_code(alloc_region(fx, &b, "t-a-group", NULL), GRPC_PERMISSION_DENIED, "group pool");
    uint64_t mid = 0;
    int reused = 0;
    expect_code(register_mlp(fx, &b, &mid, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &b, mid, 1, "t-a-priv", NULL), GRPC_PERMISSION_DENIED, uid_a_private);
    /* ... but may use the public one and the default; C (A's gid) the group one. */
    uint64_t rb = 0, rc_ = 0;
    expect_code(alloc_region(fx, &b, "t-a-pub", &rb), GRPC_OK, NULL);
    expect_code(alloc_region(fx, &b, NULL, NULL), GRPC_OK, NULL);
    expect_code(alloc_region(fx, &c, "t-a-group", &rc_), GRPC_OK, NULL);
    expect_code(alloc_region(fx, &c, "t-a-priv", NULL), GRPC_PERMISSION_DENIED, NULL);

    /* ListPools shows each the pools it may use; the rest counted. */
    Graphd__V1__ListPoolsReply *lp = pools_as(fx, &b);
    assert_null(find_pool(lp->pools, lp->n_pools, "t-a-priv"));
    assert_null(find_pool(lp->pools, lp->n_pools, "t-a-group"));
    const Graphd__V1__Pool *pub = find_pool(lp->pools, lp->n_pools, "t-a-pub");
    assert_non_null(pub);
    assert_int_equal(pub->owner_uid, UID_A);
    assert_int_equal(pub->mode, GRAPHD__V1__POOL_MODE__POOL_MODE_PUBLIC);
    assert_non_null(find_pool(lp->pools, lp->n_pools, "default"));
    assert_true(lp->hidden >= 2);
    protobuf_c_message_free_unpacked(&lp->base, NULL);
    lp = pools_as(fx, &a);
    const Graphd__V1__Pool *priv = find_pool(lp->pools, lp->n_pools, "t-a-priv");
    assert_non_null(priv);
    assert_int_equal(priv->mode, GRAPHD__V1__POOL_MODE__POOL_MODE_PRIVATE);
    assert_int_equal(priv->owner_gid, UID_A);
    protobuf_c_message_free_unpacked(&lp->base, NULL);
    lp = pools_as(fx, NULL); /* anonymous: nothing listed */
    assert_int_equal(lp->n_pools, 0);
    assert_true(lp->hidden >= 4);
    protobuf_c_message_free_unpacked(&lp->base, NULL);

    /* The owner deletes its pools once empty; an admin may delete anyone's. */
    expect_code(delete_pool(fx, &a, "t-a-pub"), GRPC_FAILED_PRECONDITION, "still holds regions");
    expect_code(free_region(fx, &b, rb), GRPC_OK, NULL);
    expect_code(delete_pool(fx, &a, "t-a-pub"), GRPC_OK, NULL);
    expect_code(delete_pool(fx, &a, "t-a-priv"), GRPC_OK, NULL);
    graphd_client_t *root = harness_client(&fx->f.h, "it-root");
    assert_non_null(root);
    assert_int_equal(graphd_pool_delete(root, "t-a-group"), GRAPHD_EFAILED_PRECONDITION);
    tenant_close(&c); /* its region goes with it */
    int rc = GRAPHD_EFAILED_PRECONDITION;
    for (int i = 0; i < 100 && rc == GRAPHD_EFAILED_PRECONDITION; i++, usleep(10000))
        rc = graphd_pool_delete(root, "t-a-group");
    assert_int_equal(rc, GRAPHD_OK);
    graphd_close(root);
    tenant_close(&a);
    tenant_close(&b);
}

static void objects_stay_with_their_session(void **state)
{
    fixture_t *fx = *state;
    tenant_t a, b;
    tenant_open(fx, UID_A, UID_A, &a);
    tenant_open(fx, UID_B, UID_B, &b);
    uint64_t region = 0, mid = 0, gid = 0;
    int reused = 0;
    expect_code(alloc_region(fx, &a, NULL, &region), GRPC_OK, NULL);
    expect_code(register_mlp(fx, &a, &mid, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &a, mid, 1, NULL, &gid), GRPC_OK, NULL);

    assert_int_equal(frame(&b, GRAPHD_FRAME_MAP, region), GRPC_PERMISSION_DENIED);
    assert_int_equal(frame(&b, GRAPHD_FRAME_REPLAY, gid), GRPC_PERMISSION_DENIED);
    expect_code(free_region(fx, &b, region), GRPC_PERMISSION_DENIED, NULL);
    expect_code(capture(fx, &b, mid, 1, NULL, NULL), GRPC_PERMISSION_DENIED, "another session");
    Graphd__V1__SessionRef r = ref_of(&b);
    Graphd__V1__ReleaseGraphRequest rg = GRAPHD__V1__RELEASE_GRAPH_REQUEST__INIT;
    rg.session = &r;
    rg.graph_id = gid;
    expect_code(call(fx, M("ReleaseGraph"), &rg.base, NULL, NULL), GRPC_PERMISSION_DENIED, NULL);
    Graphd__V1__ReleaseModuleRequest rm = GRAPHD__V1__RELEASE_MODULE_REQUEST__INIT;
    rm.session = &r;
    rm.module_id = mid;
    expect_code(call(fx, M("ReleaseModule"), &rm.base, NULL, NULL), GRPC_PERMISSION_DENIED, NULL);
    /* A's own still work. */
    assert_int_equal(frame(&a, GRAPHD_FRAME_REPLAY, gid), GRPC_OK);
    tenant_close(&a);
    tenant_close(&b);
}

static void status_shows_a_tenant_its_own(void **state)
{
    fixture_t *fx = *state;
    tenant_t a, a2, b;
    tenant_open(fx, UID_A, UID_A, &a);
    tenant_open(fx, UID_A, UID_A, &a2); /* a second process of the same uid */
    tenant_open(fx, UID_B, UID_B, &b);
    uint64_t mid_a = 0, mid_b = 0, ga = 0, gb = 0;
    int reused = 0;
    expect_code(create_pool(fx, &b, "t-b-priv", NULL, 0, 0), GRPC_OK, NULL);
    expect_code(register_mlp(fx, &a, &mid_a, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &a, mid_a, 1, NULL, &ga), GRPC_OK, NULL);
    expect_code(register_mlp(fx, &b, &mid_b, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &b, mid_b, 1, "t-b-priv", &gb), GRPC_OK, NULL);

    /* A sees its uid's sessions and graphs in full, B's only counted. */
    Graphd__V1__StatusReply *st = status_as(fx, &a);
    assert_non_null(find_session(st, a.id));
    assert_non_null(find_session(st, a2.id));
    assert_int_equal(find_session(st, a2.id)->uid, UID_A);
    assert_null(find_session(st, b.id));
    for (size_t i = 0; i < st->n_sessions; i++)
        assert_int_equal(st->sessions[i]->uid, UID_A);
    assert_non_null(find_graph(st, ga));
    assert_string_equal(find_graph(st, ga)->module, "mlp-secret-name");
    assert_null(find_graph(st, gb));
    assert_null(find_pool(st->pools, st->n_pools, "t-b-priv"));
    assert_non_null(find_pool(st->pools, st->n_pools, "default"));
    assert_non_null(st->others);
    assert_true(st->others->sessions >= 1);
    assert_true(st->others->graphs >= 1);
    assert_true(st->others->modules >= 1);
    assert_true(st->others->regions >= 1 && st->others->bytes > 0); /* B's graph region */
    assert_true(st->others->pools >= 1);
    assert_int_equal(st->daemon->sessions, st->n_sessions + st->others->sessions);
    protobuf_c_message_free_unpacked(&st->base, NULL);

    /* B the same the other way round. */
    st = status_as(fx, &b);
    assert_non_null(find_session(st, b.id));
    assert_null(find_session(st, a.id));
    assert_non_null(find_graph(st, gb));
    assert_null(find_graph(st, ga));
    assert_non_null(find_pool(st->pools, st->n_pools, "t-b-priv"));
    protobuf_c_message_free_unpacked(&st->base, NULL);

    /* No session: counts only. */
    st = status_as(fx, NULL);
    assert_int_equal(st->n_sessions, 0);
    assert_int_equal(st->n_graphs, 0);
    assert_int_equal(st->n_pools, 0);
    assert_true(st->others->sessions >= 3 && st->others->graphs >= 2);
    protobuf_c_message_free_unpacked(&st->base, NULL);

    /* An admin (root) sees everything, uids included. */
    graphd_client_t *root = harness_client(&fx->f.h, "it-root");
    assert_non_null(root);
    json_t *js = harness_status(root);
    assert_non_null(js);
    json_t *sb = harness_find_int(json_object_get(js, "sessions"), "id", b.id);
    assert_non_null(sb);
    assert_int_equal(harness_int(sb, "uid"), UID_B);
    assert_non_null(harness_find_int(json_object_get(js, "sessions"), "id", a.id));
    assert_non_null(harness_find_int(json_object_get(js, "graphs"), "id", gb));
    assert_non_null(harness_find(json_object_get(js, "pools"), "name", "t-b-priv"));
    json_t *others = json_object_get(js, "others");
    assert_int_equal(harness_int(others, "sessions"), 0);
    assert_int_equal(harness_int(others, "graphs"), 0);
    json_decref(js);
    graphd_close(root);
    tenant_close(&a);
    tenant_close(&a2);
    tenant_close(&b);
}

static void module_cache_is_per_uid(void **state)
{
    fixture_t *fx = *state;
    tenant_t a, a2, b;
    tenant_open(fx, UID_A, UID_A, &a);
    tenant_open(fx, UID_A, UID_A, &a2);
    tenant_open(fx, UID_B, UID_B, &b);
    uint64_t mid = 0;
    int reused = -1;
    expect_code(register_mlp(fx, &a, &mid, &reused), GRPC_OK, NULL);
    assert_int_equal(reused, 0);
    /* The same bytes from another uid: a module of its own, and no word of A's. */
    expect_code(register_mlp(fx, &b, &mid, &reused), GRPC_OK, NULL);
    assert_int_equal(reused, 0);
    /* From A's uid again: its cache. */
    expect_code(register_mlp(fx, &a2, &mid, &reused), GRPC_OK, NULL);
    assert_int_equal(reused, 1);
    Graphd__V1__StatusReply *st = status_as(fx, &a);
    assert_true(st->daemon->modules_loaded >= 2); /* A's and B's objects */
    protobuf_c_message_free_unpacked(&st->base, NULL);
    tenant_close(&a);
    tenant_close(&a2);
    tenant_close(&b);
}

static void pool_goes_with_its_session_on_cpu1(void **state)
{
    fixture_t *fx = *state;
    tenant_t a;
    tenant_open(fx, UID_A, UID_A, &a);
    uint64_t mid = 0;
    int reused = 0;
    expect_code(create_pool(fx, &a, "t-a-mine", "cpu:1", 0, 1), GRPC_OK, NULL);
    expect_code(alloc_region(fx, &a, "t-a-mine", NULL), GRPC_OK, NULL);
    expect_code(register_mlp(fx, &a, &mid, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &a, mid, 1, "t-a-mine", NULL), GRPC_OK, NULL);
    Graphd__V1__ListPoolsReply *lp = pools_as(fx, &a);
    const Graphd__V1__Pool *p = find_pool(lp->pools, lp->n_pools, "t-a-mine");
    assert_non_null(p);
    assert_true(p->delete_with_session);
    assert_string_equal(p->device, "cpu:1");
    protobuf_c_message_free_unpacked(&lp->base, NULL);
    tenant_close(&a); /* EOF, as when the client is killed */
    graphd_client_t *root = harness_client(&fx->f.h, "it-root");
    assert_non_null(root);
    int gone = 0;
    for (int i = 0; i < 100 && !gone; i++) {
        json_t *js = harness_status(root);
        assert_non_null(js);
        gone = harness_find(json_object_get(js, "pools"), "name", "t-a-mine") == NULL;
        json_decref(js);
        if (!gone)
            usleep(10000);
    }
    assert_true(gone);
    /* The name is free again. */
    assert_int_equal(graphd_pool_create(root, "t-a-mine", "cpu:1", 0, NULL), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(root, "t-a-mine"), GRAPHD_OK);
    graphd_close(root);
}

/* The daemon runs with max_sessions_per_uid 3, max_pools_per_uid 3, max_graphs_per_session 2 and
 * max_regions_per_session 4 (group_setup). */
static void limits_answer_with_their_setting(void **state)
{
    fixture_t *fx = *state;
    tenant_t t[4];
    for (int i = 0; i < 3; i++)
        tenant_open(fx, UID_LIMITS, UID_LIMITS, &t[i]);
    expect_code(tenant_try_open(fx, UID_LIMITS, UID_LIMITS, &t[3]), GRPC_RESOURCE_EXHAUSTED,
                "max_sessions_per_uid = 3");
    /* The refused session is gone, not left unattached. */
    Graphd__V1__SessionRef r = ref_of(&t[3]);
    Graphd__V1__GoodbyeRequest bye = GRAPHD__V1__GOODBYE_REQUEST__INIT;
    bye.session = &r;
    expect_code(call(fx, M("Goodbye"), &bye.base, NULL, NULL), GRPC_NOT_FOUND, NULL);
    close(t[3].fd);
    /* Another uid is not held back by this one's sessions. */
    tenant_t other;
    tenant_open(fx, UID_B, UID_B, &other);
    tenant_close(&other);

    expect_code(create_pool(fx, &t[0], "t-l-1", NULL, 0, 0), GRPC_OK, NULL);
    expect_code(create_pool(fx, &t[1], "t-l-2", NULL, 0, 0), GRPC_OK, NULL);
    expect_code(create_pool(fx, &t[1], "t-l-3", NULL, 0, 0), GRPC_OK, NULL);
    expect_code(create_pool(fx, &t[2], "t-l-4", NULL, 0, 0), GRPC_RESOURCE_EXHAUSTED,
                "max_pools_per_uid = 3");
    expect_code(delete_pool(fx, &t[2], "t-l-1"), GRPC_OK, NULL); /* same uid: its owner */
    expect_code(create_pool(fx, &t[2], "t-l-4", NULL, 0, 0), GRPC_OK, NULL);

    for (int i = 0; i < 4; i++)
        expect_code(alloc_region(fx, &t[0], NULL, NULL), GRPC_OK, NULL);
    expect_code(alloc_region(fx, &t[0], NULL, NULL), GRPC_RESOURCE_EXHAUSTED,
                "max_regions_per_session = 4");

    uint64_t mid = 0;
    int reused = 0;
    expect_code(register_mlp(fx, &t[1], &mid, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &t[1], mid, 3, NULL, NULL), GRPC_RESOURCE_EXHAUSTED,
                "max_graphs_per_session = 2");
    expect_code(capture(fx, &t[1], mid, 2, NULL, NULL), GRPC_OK, NULL);
    expect_code(capture(fx, &t[1], mid, 1, NULL, NULL), GRPC_RESOURCE_EXHAUSTED,
                "max_graphs_per_session = 2");
    /* A capture's static regions count as the session's. */
    expect_code(register_mlp(fx, &t[0], &mid, &reused), GRPC_OK, NULL);
    expect_code(capture(fx, &t[0], mid, 1, NULL, NULL), GRPC_RESOURCE_EXHAUSTED,
                "max_regions_per_session = 4");
    for (int i = 0; i < 3; i++)
        tenant_close(&t[i]);
    graphd_client_t *root = harness_client(&fx->f.h, "it-root");
    assert_int_equal(graphd_pool_delete(root, "t-l-2"), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(root, "t-l-3"), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(root, "t-l-4"), GRAPHD_OK);
    graphd_close(root);
}

/* graphctl run by uid 4105 (setpriv, no account needed): it sees its own only and cannot
 * delete root's pool; root's graphctl sees that uid's pool. */
static void graphctl_as_another_uid(void **state)
{
    fixture_t *fx = *state;
    graphd_client_t *root = harness_client(&fx->f.h, "it-root");
    assert_non_null(root);
    assert_int_equal(graphd_pool_create(root, "t-root", NULL, 0, NULL), GRAPHD_OK);
    char graphctl[512], out[16384], err[4096];
    snprintf(graphctl, sizeof(graphctl), "%s/graphctl", harness_build_dir());
    const char *del[] = {
        "/usr/bin/setpriv", "--reuid=4105", "--regid=4105", "--clear-groups", graphctl, "--address",
        fx->f.h.address,    "pool",         "delete",       "t-root",         NULL};
    int rc = harness_run(del, out, sizeof(out), err, sizeof(err), 10000);
    if (rc != 1 || strstr(err, "PERMISSION_DENIED") == NULL ||
        strstr(err, "belongs to uid 0") == NULL)
        fail_msg("graphctl pool delete as uid 4105: exit %d: %s", rc, err);
    const char *mk[] = {"/usr/bin/setpriv",
                        "--reuid=4105",
                        "--regid=4105",
                        "--clear-groups",
                        graphctl,
                        "--address",
                        fx->f.h.address,
                        "pool",
                        "create",
                        "t-b-ctl",
                        "--mode",
                        "public",
                        NULL};
    if (harness_run(mk, out, sizeof(out), err, sizeof(err), 10000) != 0)
        fail_msg("graphctl pool create as uid 4105: %s", err);
    assert_non_null(strstr(out, "uid 4105"));
    const char *st[] = {
        "/usr/bin/setpriv", "--reuid=4105",  "--regid=4105", "--clear-groups", graphctl,
        "--address",        fx->f.h.address, "--json",       "status",         NULL};
    if (harness_run(st, out, sizeof(out), err, sizeof(err), 10000) != 0)
        fail_msg("graphctl status as uid 4105: %s", err);
    json_t *js = json_loads(out, 0, NULL);
    assert_non_null(js);
    json_t *sessions = json_object_get(js, "sessions");
    assert_int_equal(json_array_size(sessions), 1); /* graphctl's own */
    assert_int_equal(harness_int(json_array_get(sessions, 0), "uid"), 4105);
    assert_null(harness_find(json_object_get(js, "pools"), "name", "t-root"));
    assert_non_null(harness_find(json_object_get(js, "pools"), "name", "t-b-ctl"));
    assert_true(harness_int(json_object_get(js, "others"), "sessions") >= 1); /* root's */
    json_decref(js);
    js = harness_status(root);
    json_t *p = harness_find(json_object_get(js, "pools"), "name", "t-b-ctl");
    assert_non_null(p);
    assert_int_equal(harness_int(p, "owner_uid"), 4105);
    json_decref(js);
    assert_int_equal(graphd_pool_delete(root, "t-b-ctl"), GRAPHD_OK); /* an admin may */
    assert_int_equal(graphd_pool_delete(root, "t-root"), GRAPHD_OK);
    graphd_close(root);
}

static int group_setup(void **state)
{
    static fixture_t fx;
    const char *args[] = {"--socket-mode",
                          "0666",
                          "--cpu-devices",
                          "2",
                          "--max-sessions-per-uid",
                          "3",
                          "--max-pools-per-uid",
                          "3",
                          "--max-graphs-per-session",
                          "2",
                          "--max-regions-per-session",
                          "4",
                          NULL};
    if (harness_fixture_start(&fx.f, args) != 0)
        return -1;
    /* Other uids must reach the sockets in the harness's private directory. */
    if (chmod(fx.f.h.dir, 0755) != 0) {
        harness_fixture_stop(&fx.f);
        return -1;
    }
    snprintf(fx.session_path, sizeof(fx.session_path), "%s.session", fx.f.h.sock_path);
    fx.mlp = harness_models_read(&fx.f.m, "mlp.pt", &fx.mlp_len);
    if (fx.mlp == NULL) {
        harness_fixture_stop(&fx.f);
        return -1;
    }
    *state = &fx;
    return 0;
}

static int group_teardown(void **state)
{
    fixture_t *fx = *state;
    free(fx->mlp);
    return harness_fixture_stop(&fx->f) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup(pools_have_owners_and_modes, next_uids),
        cmocka_unit_test_setup(objects_stay_with_their_session, next_uids),
        cmocka_unit_test_setup(status_shows_a_tenant_its_own, next_uids),
        cmocka_unit_test_setup(module_cache_is_per_uid, next_uids),
        cmocka_unit_test_setup(pool_goes_with_its_session_on_cpu1, next_uids),
        cmocka_unit_test_setup(limits_answer_with_their_setting, next_uids),
        cmocka_unit_test_setup(graphctl_as_another_uid, next_uids),
    };
    return cmocka_run_group_tests_name("tenants", tests, group_setup, group_teardown);
}
