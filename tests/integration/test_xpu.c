/*
 * xpu:N devices in the daemon, through Debian's real Level Zero loader and the test driver
 * (tests/ze_driver/, ZE_ENABLE_ALT_DRIVERS): discovery and properties in ListDevices and Status,
 * Sysman telemetry, device regions on an xpu pool (the daemon allocates and zero-fills them, the
 * MAP reply passes the handle and the fd, this process maps them with gr_ze_import in its own
 * context), their reclaim after FreeRegion, Goodbye and a SIGKILLed client, every failure the
 * driver can inject, what stays CUDA-only, and a daemon without any driver.
 *
 * The suite runs twice, in re-executed children: the loader passing calls through, and with
 * ZE_ENABLE_LOADER_INTERCEPT=1. The client side is raw gRPC and session-socket frames (tests/lib),
 * not libgraphd, so that this tests the daemon alone.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "../lib/harness.h"
#include "../lib/wire.h"
#include "runtime.h"
#include "ze_layer.h"
#include "../ze_driver/ze_test_util.h"

#define M(name) "/graphd.v1.Graphd/" name
enum {
    OK = 0,
    INVALID_ARGUMENT = 3,
    NOT_FOUND = 5,
    RESOURCE_EXHAUSTED = 8,
    ALREADY_EXISTS = 6,
    FAILED_PRECONDITION = 9,
    UNIMPLEMENTED = 12,
    UNAVAILABLE = 14,
};
#define MiB (1024u * 1024u)
#define DEVICE_MB 256 /* the test driver's default device memory */

static char self_exe[PATH_MAX];
static char driver_path[PATH_MAX];
static gr_ze_t *ze; /* this process's own layer: the importing side */

/* ---- raw protobuf ------------------------------------------------------------------------- */

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

/* The first field `field` of a message: its varint/fixed64 value in *v, or its bytes in *data and
 * *len. 0 when found, -1 when not. */
static int pb_get(const uint8_t *p, size_t n, unsigned field, uint64_t *v, const uint8_t **data,
                  size_t *len)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key, x = 0;
        assert_int_equal(read_varint(&p, end, &key), 0);
        switch (key & 7) {
        case 0:
            assert_int_equal(read_varint(&p, end, &x), 0);
            if ((key >> 3) == field) {
                *v = x;
                return 0;
            }
            break;
        case 1:
            assert_true(end - p >= 8);
            for (int i = 0; i < 8; i++)
                x |= (uint64_t)p[i] << (8 * i);
            p += 8;
            if ((key >> 3) == field) {
                *v = x;
                return 0;
            }
            break;
        case 2:
            assert_int_equal(read_varint(&p, end, &x), 0);
            assert_true((uint64_t)(end - p) >= x);
            if ((key >> 3) == field) {
                *data = p;
                *len = (size_t)x;
                return 0;
            }
            p += x;
            break;
        case 5:
            p += 4;
            break;
        default:
            fail_msg("unexpected wire type");
        }
    }
    return -1;
}

typedef struct raw {
    const harness_t *h;
    uint64_t id, token;
    int fd; /* attached session socket */
    uint64_t seq;
} raw_t;

static void raw_hello(const harness_t *h, raw_t *s)
{
    pb_t req = {.len = 0};
    pb_bytes(&req, 1, "xpu-test", 8);
    pb_uint(&req, 2, (uint64_t)getpid());
    pb_uint(&req, 3, 1);
    uint8_t reply[8192];
    size_t n = sizeof(reply);
    char details[256] = "";
    assert_int_equal(harness_raw_call(h->address, M("Hello"), req.buf, req.len, details,
                                      sizeof(details), reply, &n),
                     OK);
    memset(s, 0, sizeof(*s));
    s->h = h;
    const uint8_t *ref, *sock;
    size_t ref_len, sock_len;
    uint64_t unused;
    assert_int_equal(pb_get(reply, n, 1, &unused, &ref, &ref_len), 0);
    assert_int_equal(pb_get(ref, ref_len, 1, &s->id, NULL, NULL), 0);
    assert_int_equal(pb_get(ref, ref_len, 2, &s->token, NULL, NULL), 0);
    assert_int_equal(pb_get(reply, n, 3, &unused, &sock, &sock_len), 0);
    char path[128];
    assert_true(sock_len < sizeof(path));
    memcpy(path, sock, sock_len);
    path[sock_len] = '\0';
    s->fd = dp_connect(path);
    dp_send_frame(s->fd, GRAPHD_FRAME_ATTACH, 1, s->id, s->token);
    graphd_frame_t f;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    dp_recv_frame(s->fd, &f, msg, sizeof(msg));
    assert_int_equal(f.status, OK);
    s->seq = 2;
}

static int raw_call(const raw_t *s, const char *method, const pb_t *req, char *details,
                    size_t dsize, uint8_t *reply, size_t *reply_len)
{
    char d[512];
    int rc = harness_raw_call(s->h->address, method, req->buf, req->len, details ? details : d,
                              details ? dsize : sizeof(d), reply, reply_len);
    return rc;
}

static int create_pool(const raw_t *s, const char *name, const char *device, uint64_t limit,
                       char *details, size_t dsize)
{
    pb_t req = {.len = 0};
    pb_bytes(&req, 1, name, strlen(name));
    pb_bytes(&req, 2, device, strlen(device));
    if (limit)
        pb_uint(&req, 3, limit);
    pb_t ref = {.len = 0};
    pb_uint(&ref, 1, s->id);
    pb_fixed64(&ref, 2, s->token);
    pb_bytes(&req, 4, ref.buf, ref.len);
    return raw_call(s, M("CreatePool"), &req, details, dsize, NULL, NULL);
}

/* AllocRegion in pool; *id gets the region. The reply's device must be the pool's. */
static int alloc_region(const raw_t *s, const char *pool, uint64_t size, int device, uint64_t *id,
                        char *details, size_t dsize)
{
    pb_t req = {.len = 0};
    pb_session(&req, s->id, s->token);
    pb_bytes(&req, 2, pool, strlen(pool));
    pb_uint(&req, 3, size);
    if (device)
        pb_uint(&req, 4, 1);
    uint8_t reply[512];
    size_t n = sizeof(reply);
    int rc = raw_call(s, M("AllocRegion"), &req, details, dsize, reply, &n);
    *id = 0;
    if (rc == OK) {
        assert_int_equal(pb_get(reply, n, 1, id, NULL, NULL), 0);
        uint64_t v;
        assert_int_equal(pb_get(reply, n, 2, &v, NULL, NULL), 0);
        assert_int_equal(v, size);
    }
    return rc;
}

static int free_region(const raw_t *s, uint64_t id)
{
    pb_t req = {.len = 0};
    pb_session(&req, s->id, s->token);
    pb_uint(&req, 2, id);
    return raw_call(s, M("FreeRegion"), &req, NULL, 0, NULL, NULL);
}

static void goodbye(raw_t *s)
{
    pb_t req = {.len = 0};
    pb_session(&req, s->id, s->token);
    assert_int_equal(raw_call(s, M("Goodbye"), &req, NULL, 0, NULL, NULL), OK);
    close(s->fd);
    s->fd = -1;
}

/* Reads one reply frame, its message into msg (n bytes; *msg_len gets how many) and the fd
 * passed with it into *passed (-1: none). */
static void recv_frame_fd(int fd, graphd_frame_t *f, uint8_t *msg, size_t n, size_t *msg_len,
                          int *passed)
{
    uint8_t raw[GRAPHD_FRAME_SIZE + GRAPHD_FRAME_MAX_MSG];
    size_t got = 0, want = GRAPHD_FRAME_SIZE;
    *passed = -1;
    while (got < want) {
        struct pollfd p = {.fd = fd, .events = POLLIN};
        assert_true(poll(&p, 1, 5000) == 1);
        char control[CMSG_SPACE(sizeof(int) * 4)];
        struct iovec iov = {.iov_base = raw + got, .iov_len = want - got};
        struct msghdr mh = {.msg_iov = &iov,
                            .msg_iovlen = 1,
                            .msg_control = control,
                            .msg_controllen = sizeof(control)};
        ssize_t r = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        assert_true(r > 0);
        for (struct cmsghdr *cm = CMSG_FIRSTHDR(&mh); cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_type == SCM_RIGHTS) {
                assert_int_equal(*passed, -1);
                memcpy(passed, CMSG_DATA(cm), sizeof(int));
            }
        got += (size_t)r;
        if (got >= GRAPHD_FRAME_SIZE && want == GRAPHD_FRAME_SIZE) {
            graphd_frame_decode(raw, f);
            want = GRAPHD_FRAME_SIZE + f->msg_len;
        }
    }
    assert_int_equal(f->magic, GRAPHD_FRAME_MAGIC);
    assert_true(f->msg_len <= n);
    memcpy(msg, raw + GRAPHD_FRAME_SIZE, f->msg_len);
    *msg_len = f->msg_len;
}

/* The reply (type) to request seq that passes an IPC handle and an fd: OK with the handle in
 * *ipc, the fd in *fd and the reply's arg in *arg, or the error status (text gets the message). */
static int ipc_reply(raw_t *s, uint16_t type, uint64_t seq, gr_ze_ipc_t *ipc, int *fd,
                     uint64_t *arg, char *text, size_t tsize)
{
    graphd_frame_t f = {0};
    uint8_t msg[GRAPHD_FRAME_MAX_MSG];
    size_t len;
    recv_frame_fd(s->fd, &f, msg, sizeof(msg), &len, fd);
    assert_int_equal(f.type, type | GRAPHD_FRAME_REPLY);
    assert_int_equal(f.seq, seq);
    if (f.status != OK) {
        snprintf(text, tsize, "%.*s", (int)len, (const char *)msg);
        assert_int_equal(*fd, -1);
        return (int)f.status;
    }
    assert_int_equal(len, GR_ZE_IPC_SIZE);
    memcpy(ipc->data, msg, GR_ZE_IPC_SIZE);
    assert_true(*fd >= 0);
    *arg = f.arg;
    return OK;
}

/* MAP of region id: OK with the handle in *ipc, the fd in *fd and the size in *size, or the
 * error status (msg gets the text). */
static int map_region(raw_t *s, uint64_t id, gr_ze_ipc_t *ipc, int *fd, uint64_t *size, char *text,
                      size_t tsize)
{
    uint64_t seq = s->seq++;
    dp_send_frame(s->fd, GRAPHD_FRAME_MAP, seq, id, 0);
    return ipc_reply(s, GRAPHD_FRAME_MAP, seq, ipc, fd, size, text, tsize);
}

/* An ordering frame (EVENTS carries a 64-byte handle) for device code; returns the status. */
static int order_frame(raw_t *s, uint16_t type, uint64_t code, char *text, size_t tsize)
{
    uint8_t raw[GRAPHD_FRAME_SIZE + GRAPHD_IPC_HANDLE_SIZE];
    graphd_frame_t req = {.magic = GRAPHD_FRAME_MAGIC,
                          .version = GRAPHD_FRAME_VERSION,
                          .type = type,
                          .seq = s->seq++,
                          .id = code,
                          .msg_len = type == GRAPHD_FRAME_EVENTS ? GRAPHD_IPC_HANDLE_SIZE : 0};
    graphd_frame_encode(&req, raw);
    memset(raw + GRAPHD_FRAME_SIZE, 0x5a, GRAPHD_IPC_HANDLE_SIZE);
    dp_send(s->fd, raw, GRAPHD_FRAME_SIZE + req.msg_len);
    graphd_frame_t rep;
    dp_recv_frame(s->fd, &rep, text, tsize);
    assert_int_equal(rep.type, type | GRAPHD_FRAME_REPLY);
    assert_int_equal(rep.seq, req.seq);
    return (int)rep.status;
}

/* EVENTS on an xpu device (code): no payload, arg = count (0: the daemon's default). OK with the
 * pool's handle in *ipc, its fd in *fd and its count in *count, or the error status (text gets
 * the message). */
static int events_frame(raw_t *s, uint64_t code, uint64_t count, gr_ze_ipc_t *ipc, int *fd,
                        uint32_t *got, char *text, size_t tsize)
{
    uint64_t seq = s->seq++;
    dp_send_frame(s->fd, GRAPHD_FRAME_EVENTS, seq, code, count);
    uint64_t arg = 0;
    int rc = ipc_reply(s, GRAPHD_FRAME_EVENTS, seq, ipc, fd, &arg, text, tsize);
    if (rc == OK) {
        assert_true(arg > 0 && arg <= GR_ZE_EVENTS_MAX);
        *got = (uint32_t)arg;
    }
    return rc;
}

/* ---- the daemon ----------------------------------------------------------------------------- */

typedef struct fixture {
    harness_t h;
    graphd_client_t *c; /* for Status */
    char free_log[HARNESS_PATH_MAX + 16];
} fixture_t;

/* Starts a daemon with knobs ("NAME=value" set, "NAME" unset, for its environment only) and
 * extra arguments. */
static void start(fixture_t *f, const char *const *knobs, const char *const *args)
{
    static const char *const none[] = {NULL};
    if (knobs == NULL)
        knobs = none;
    memset(f, 0, sizeof(*f));
    char saved[16][PATH_MAX];
    int had[16] = {0};
    size_t n = 0;
    for (; knobs[n] != NULL; n++) {
        char name[128];
        const char *eq = strchr(knobs[n], '=');
        snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - knobs[n]) : (int)strlen(knobs[n]),
                 knobs[n]);
        const char *old = getenv(name);
        had[n] = old != NULL;
        snprintf(saved[n], sizeof(saved[n]), "%s", old ? old : "");
        if (eq)
            setenv(name, eq + 1, 1);
        else
            unsetenv(name);
    }
    assert_int_equal(harness_start(&f->h, args), 0);
    for (size_t i = 0; i < n; i++) {
        char name[128];
        const char *eq = strchr(knobs[i], '=');
        snprintf(name, sizeof(name), "%.*s", eq ? (int)(eq - knobs[i]) : (int)strlen(knobs[i]),
                 knobs[i]);
        if (had[i])
            setenv(name, saved[i], 1);
        else
            unsetenv(name);
    }
    f->c = harness_client(&f->h, "watch");
    assert_non_null(f->c);
}

static void stop(fixture_t *f)
{
    graphd_close(f->c);
    assert_int_equal(harness_stop(&f->h), 0);
}

static char *daemon_log(const fixture_t *f)
{
    FILE *fp = fopen(f->h.log_path, "r");
    assert_non_null(fp);
    static char buf[1 << 18];
    size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
    buf[n] = '\0';
    fclose(fp);
    return buf;
}

static int count_in(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = strstr(text, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The daemon's memory descriptors (memfds: the regions' and the driver's, whose exports hold
 * them), the ones a leaked region keeps; its sockets come and go with gRPC connections. */
static int daemon_fds(const fixture_t *f)
{
    char path[64];
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)f->h.pid);
    DIR *d = opendir(path);
    assert_non_null(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        char link[PATH_MAX + 80], target[PATH_MAX] = "";
        snprintf(link, sizeof(link), "%s/%s", path, e->d_name);
        ssize_t len = readlink(link, target, sizeof(target) - 1);
        if (len > 0) {
            target[len] = '\0';
            n += strncmp(target, "/memfd:", 7) == 0;
        }
    }
    closedir(d);
    return n;
}

/* Waits up to 5 s for the daemon's descriptor count to come back to want (frees run off the
 * loop). */
static void expect_fds(const fixture_t *f, int want)
{
    int64_t end = harness_now_ms() + 5000;
    while (daemon_fds(f) != want && harness_now_ms() < end)
        usleep(20000);
    assert_int_equal(daemon_fds(f), want);
}

static json_t *device_json(const fixture_t *f, const char *id)
{
    json_t *st = harness_status(f->c);
    assert_non_null(st);
    json_t *d = harness_find(json_object_get(st, "devices"), "id", id);
    if (d)
        json_incref(d);
    json_decref(st);
    return d;
}

typedef struct {
    long long regions, reserved, used;
} figures_t;

static figures_t pool_figures(const fixture_t *f, const char *pool)
{
    json_t *st = harness_status(f->c);
    assert_non_null(st);
    json_t *p = harness_find(json_object_get(st, "pools"), "name", pool);
    assert_non_null(p);
    figures_t k = {harness_int(p, "regions"), harness_int(p, "reserved_bytes"),
                   harness_int(p, "used_bytes")};
    json_decref(st);
    return k;
}

static void expect_pool_empty(const fixture_t *f, const char *pool)
{
    int64_t end = harness_now_ms() + 5000;
    figures_t k;
    while ((k = pool_figures(f, pool)).regions != 0 && harness_now_ms() < end)
        usleep(20000);
    assert_int_equal(k.regions, 0);
    assert_int_equal(k.reserved, 0);
    assert_int_equal(k.used, 0);
}

/* Waits up to 5 s for xpu device id's telemetry to satisfy have (a member that must be true),
 * and returns the device (json_decref it). */
static json_t *telemetry_with(const fixture_t *f, const char *id, const char *have)
{
    int64_t end = harness_now_ms() + 5000;
    for (;;) {
        json_t *d = device_json(f, id);
        assert_non_null(d);
        json_t *t = json_object_get(d, "telemetry");
        assert_true(json_is_object(t));
        if (json_integer_value(json_object_get(t, "read_unix_ms")) > 0 &&
            (have == NULL || json_is_true(json_object_get(t, have))))
            return d;
        json_decref(d);
        if (harness_now_ms() > end)
            fail_msg("%s telemetry never had %s", id, have ? have : "a read");
        usleep(50000);
    }
}

/* Waits up to 5 s for the driver's free log to hold line (a prefix of one of its lines). */
static void expect_freed(const fixture_t *f, const char *line)
{
    int64_t end = harness_now_ms() + 5000;
    for (;;) {
        char buf[8192] = "";
        FILE *fp = fopen(f->free_log, "r");
        if (fp) {
            size_t n = fread(buf, 1, sizeof(buf) - 1, fp);
            buf[n] = '\0';
            fclose(fp);
        }
        if (strstr(buf, line))
            return;
        if (harness_now_ms() > end)
            fail_msg("the driver never freed '%s'; its log:\n%s", line, buf);
        usleep(20000);
    }
}

static void hex16(const uint8_t *b, char *out)
{
    for (int i = 0; i < 16; i++)
        sprintf(out + 2 * i, "%02x", b[i]);
}

/* ---- tests -------------------------------------------------------------------------------- */

/* Devices in a Status reply other than CUDA ones (which a GPU machine adds to every list). */
static size_t devices_but_cuda(json_t *devs)
{
    size_t n = 0, i;
    json_t *d;
    json_array_foreach(devs, i, d)
    {
        const char *kind = json_string_value(json_object_get(d, "kind"));
        n += kind == NULL || strcmp(kind, "cuda") != 0;
    }
    return n;
}

/* Both test devices are listed with their Level Zero properties (ListDevices, Status), and read
 * Sysman telemetry with presence flags; the cpu has none. */
static void devices_and_telemetry(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, NULL, NULL);
    json_t *st = harness_status(f.c);
    assert_non_null(st);
    json_t *devs = json_object_get(st, "devices");
    assert_int_equal(devices_but_cuda(devs), 3);
    json_t *cpu = harness_find(devs, "id", "cpu:0");
    assert_non_null(cpu);
    assert_true(json_is_null(json_object_get(cpu, "telemetry")));
    static const struct {
        const char *id, *name;
        long long cu;
    } want[] = {{"xpu:0", "graphd test XPU 0", 64}, {"xpu:1", "graphd test XPU 1", 96}};
    char uuids[2][40];
    for (int i = 0; i < 2; i++) {
        json_t *d = harness_find(devs, "id", want[i].id);
        assert_non_null(d);
        assert_string_equal(json_string_value(json_object_get(d, "kind")), "xpu");
        assert_int_equal(harness_int(d, "ordinal"), i);
        assert_string_equal(json_string_value(json_object_get(d, "name")), want[i].name);
        assert_int_equal(harness_int(d, "compute_units"), want[i].cu);
        assert_true(harness_int(d, "max_clock_mhz") > 0);
        assert_int_equal(harness_int(d, "memory_total"), (long long)DEVICE_MB * MiB);
        const char *uuid = json_string_value(json_object_get(d, "uuid"));
        assert_int_equal(strlen(uuid), 32);
        snprintf(uuids[i], sizeof(uuids[i]), "%s", uuid);
        assert_non_null(strstr(json_string_value(json_object_get(d, "driver")), "Level Zero 1."));
    }
    assert_string_not_equal(uuids[0], uuids[1]);
    json_decref(st);

    /* ListDevices carries the same (its bytes name both devices and their UUIDs). */
    raw_t s;
    raw_hello(&f.h, &s);
    pb_t none = {.len = 0};
    uint8_t reply[4096];
    size_t n = sizeof(reply);
    assert_int_equal(raw_call(&s, M("ListDevices"), &none, NULL, 0, reply, &n), OK);
    assert_non_null(memmem(reply, n, "xpu:1", 5));
    assert_non_null(memmem(reply, n, uuids[0], 32));
    assert_non_null(memmem(reply, n, uuids[1], 32));

    /* Telemetry: read off the loop within a second; utilisation needs two reads. */
    json_t *d = telemetry_with(&f, "xpu:1", "have_utilisation");
    json_t *t = json_object_get(d, "telemetry");
    assert_true(json_is_true(json_object_get(t, "have_memory")));
    assert_int_equal(harness_int(t, "memory_total"), (long long)DEVICE_MB * MiB);
    assert_int_equal(harness_int(t, "memory_free"), (long long)DEVICE_MB * MiB);
    assert_true(json_is_true(json_object_get(t, "have_engine")));
    assert_string_equal(json_string_value(json_object_get(t, "memory_health")), "ok");
    assert_true(json_is_true(json_object_get(t, "have_reset")));
    assert_false(json_is_true(json_object_get(t, "wedged")));
    json_decref(d);
    assert_int_equal(count_in(daemon_log(&f), "no xpu device listed"), 0);

    /* graphctl status --json prints what Status has: both devices and their telemetry. */
    char path[HARNESS_PATH_MAX + 16];
    snprintf(path, sizeof(path), "%s/graphctl", harness_build_dir());
    const char *argv[] = {path, "--address", f.h.address, "--json", "status", NULL};
    static char out[1 << 16];
    char err[4096];
    assert_int_equal(harness_run(argv, out, sizeof(out), err, sizeof(err), 10000), 0);
    json_error_t jerr;
    json_t *js = json_loads(out, 0, &jerr);
    assert_non_null(js);
    json_t *x1 = harness_find(json_object_get(js, "devices"), "id", "xpu:1");
    assert_non_null(x1);
    assert_string_equal(json_string_value(json_object_get(x1, "uuid")), uuids[1]);
    assert_true(json_is_object(json_object_get(x1, "telemetry")));
    json_decref(js);
    goodbye(&s);
    stop(&f);
}

/* An xpu region: the daemon zero-fills it (the driver hands out dirty memory here), MAP passes
 * the handle and the fd, this process maps it in its own context and writes, and the daemon's
 * side holds the write when it frees the memory (the driver's free log). The pool's figures and
 * the device's telemetry follow; FreeRegion gives everything back. */
static void region_roundtrip(void **state)
{
    (void)state;
    fixture_t f;
    char log_knob[HARNESS_PATH_MAX + 64];
    snprintf(log_knob, sizeof(log_knob), "GRAPHD_ZE_TEST_FREE_LOG=/tmp/graphd-xpu-free-%d.log",
             (int)getpid());
    const char *knobs[] = {"GRAPHD_ZE_TEST_DIRTY_ALLOC=165", log_knob, NULL};
    unlink(strchr(log_knob, '=') + 1);
    start(&f, knobs, NULL);
    snprintf(f.free_log, sizeof(f.free_log), "%s", strchr(log_knob, '=') + 1);
    raw_t s;
    raw_hello(&f.h, &s);
    int fds0 = daemon_fds(&f);
    char details[512];
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 8 * MiB, details, sizeof(details)), OK);

    const uint64_t size = MiB + 100;
    uint64_t id;
    assert_int_equal(alloc_region(&s, "xp", size, 1, &id, details, sizeof(details)), OK);
    figures_t k = pool_figures(&f, "xp");
    assert_int_equal(k.regions, 1);
    assert_int_equal(k.used, size);
    assert_true(k.reserved >= (long long)size);

    gr_ze_ipc_t ipc;
    int fd;
    uint64_t got;
    assert_int_equal(map_region(&s, id, &ipc, &fd, &got, details, sizeof(details)), OK);
    assert_int_equal(got, size);
    void *ptr = NULL;
    assert_int_equal(gr_ze_import(ze, 0, &ipc, fd, size, &ptr), 0);
    close(fd);
    uint8_t *buf = malloc(size);
    assert_non_null(buf);
    assert_int_equal(gr_ze_copy(ze, 0, buf, ptr, size), 0);
    for (uint64_t i = 0; i < size; i++)
        if (buf[i] != 0)
            fail_msg("byte %llu of a new region is 0x%02x, not the daemon's zero fill",
                     (unsigned long long)i, buf[i]);
    for (uint64_t i = 0; i < size; i++)
        buf[i] = (uint8_t)(i * 7 + 3);
    assert_int_equal(gr_ze_copy(ze, 0, ptr, buf, size), 0);
    assert_int_equal(gr_ze_unimport(ze, ptr), 0);

    /* The device's memory, as Sysman reads it in the daemon, holds the region. */
    int64_t end = harness_now_ms() + 5000;
    for (;;) {
        json_t *d = telemetry_with(&f, "xpu:0", "have_memory");
        long long fr = harness_int(json_object_get(d, "telemetry"), "memory_free");
        json_decref(d);
        if (fr == (long long)DEVICE_MB * MiB - k.reserved)
            break;
        if (harness_now_ms() > end)
            fail_msg("xpu:0 telemetry shows %lld bytes free, not %lld", fr,
                     (long long)DEVICE_MB * MiB - k.reserved);
        usleep(100000);
    }

    assert_int_equal(free_region(&s, id), OK);
    char line[128], hex[33];
    hex16(buf, hex);
    snprintf(line, sizeof(line), "free 0 %llu %s", (unsigned long long)size, hex);
    expect_freed(&f, line);
    expect_pool_empty(&f, "xp");
    expect_fds(&f, fds0);
    /* A freed region maps no more. */
    assert_int_equal(map_region(&s, id, &ipc, &fd, &got, details, sizeof(details)), NOT_FOUND);
    free(buf);
    goodbye(&s);
    stop(&f);
    unlink(f.free_log);
}

/* Goodbye reclaims a session's xpu regions, as it does host regions. */
static void reclaimed_on_goodbye(void **state)
{
    (void)state;
    fixture_t f;
    char log_knob[HARNESS_PATH_MAX + 64];
    snprintf(log_knob, sizeof(log_knob), "GRAPHD_ZE_TEST_FREE_LOG=/tmp/graphd-xpu-bye-%d.log",
             (int)getpid());
    unlink(strchr(log_knob, '=') + 1);
    const char *knobs[] = {log_knob, NULL};
    start(&f, knobs, NULL);
    snprintf(f.free_log, sizeof(f.free_log), "%s", strchr(log_knob, '=') + 1);
    raw_t s;
    raw_hello(&f.h, &s);
    int fds0 = daemon_fds(&f);
    assert_int_equal(create_pool(&s, "xp1", "xpu:1", 0, NULL, 0), OK);
    uint64_t a, b;
    assert_int_equal(alloc_region(&s, "xp1", 4096, 1, &a, NULL, 0), OK);
    assert_int_equal(alloc_region(&s, "xp1", 70000, 1, &b, NULL, 0), OK);
    assert_int_equal(pool_figures(&f, "xp1").regions, 2);
    /* MAP once without importing: the fd this process got is its own to close. */
    gr_ze_ipc_t ipc;
    int fd;
    uint64_t got;
    assert_int_equal(map_region(&s, b, &ipc, &fd, &got, NULL, 0), OK);
    close(fd);
    goodbye(&s);
    expect_freed(&f, "free 1 4096 ");
    expect_freed(&f, "free 1 70000 ");
    expect_pool_empty(&f, "xp1");
    expect_fds(&f, fds0);
    stop(&f);
    unlink(f.free_log);
}

/* SIGTERM while a session holds an xpu region: the daemon frees it before it closes the Level
 * Zero layer (which refuses to close over live allocations) and exits cleanly. */
static void region_at_shutdown(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, NULL, NULL);
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    uint64_t id;
    assert_int_equal(alloc_region(&s, "xp", 3 * 4096, 1, &id, NULL, 0), OK);
    graphd_close(f.c);
    f.c = NULL;
    assert_int_equal(kill(f.h.pid, SIGTERM), 0);
    int status = -1;
    int64_t end = harness_now_ms() + 10000;
    while (waitpid(f.h.pid, &status, WNOHANG) == 0 && harness_now_ms() < end)
        usleep(20000);
    const char *log = daemon_log(&f);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || strstr(log, "graphd stopped") == NULL ||
        strstr(log, "closing Level Zero") != NULL || strstr(log, "reclaimed 1 region") == NULL)
        fail_msg("the daemon (status 0x%x) did not stop cleanly over an xpu region:\n%s", status,
                 log);
    /* harness_stop's part, the daemon being gone: its directory (the log; the sockets went). */
    DIR *dir = opendir(f.h.dir);
    assert_non_null(dir);
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
            char path[HARNESS_PATH_MAX + 300];
            snprintf(path, sizeof(path), "%s/%s", f.h.dir, e->d_name);
            unlink(path);
        }
    closedir(dir);
    assert_int_equal(rmdir(f.h.dir), 0);
    close(s.fd);
}

/* Role "tenant" (a re-executed child): allocates an xpu:0 region in pool xp of the daemon at
 * argv address, maps it, writes 0x5c into it, says "ready" on stdout and waits to be killed. */
static int tenant_main(const char *address)
{
    gr_ze_t *own = NULL;
    if (gr_ze_open(&own, NULL, 0) != 0)
        return 3;
    harness_t h;
    memset(&h, 0, sizeof(h));
    snprintf(h.address, sizeof(h.address), "%s", address);
    raw_t s;
    raw_hello(&h, &s);
    uint64_t id;
    if (alloc_region(&s, "xp", 65536, 1, &id, NULL, 0) != OK)
        return 4;
    gr_ze_ipc_t ipc;
    int fd;
    uint64_t got;
    if (map_region(&s, id, &ipc, &fd, &got, NULL, 0) != OK)
        return 5;
    void *ptr;
    if (gr_ze_import(own, 0, &ipc, fd, got, &ptr) != 0 || gr_ze_fill(own, 0, ptr, 0x5c, got) != 0)
        return 6;
    printf("ready\n");
    fflush(stdout);
    for (;;)
        pause();
}

/* A client SIGKILLed while it holds an xpu region: the daemon reclaims it. */
static void reclaimed_on_sigkill(void **state)
{
    (void)state;
    fixture_t f;
    char log_knob[HARNESS_PATH_MAX + 64];
    snprintf(log_knob, sizeof(log_knob), "GRAPHD_ZE_TEST_FREE_LOG=/tmp/graphd-xpu-kill-%d.log",
             (int)getpid());
    unlink(strchr(log_knob, '=') + 1);
    const char *knobs[] = {log_knob, NULL};
    start(&f, knobs, NULL);
    snprintf(f.free_log, sizeof(f.free_log), "%s", strchr(log_knob, '=') + 1);
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    int fds0 = daemon_fds(&f);

    char *argv[] = {self_exe, "--role", "tenant", f.h.address, NULL};
    pid_t pid = zt_spawn_until(argv, "ready", 10000);
    assert_true(pid > 0);
    assert_int_equal(pool_figures(&f, "xp").regions, 1);
    assert_true(daemon_fds(&f) > fds0); /* the region's fd, the driver's export */
    kill(pid, SIGKILL);
    int status;
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFSIGNALED(status));
    expect_freed(&f, "free 0 65536 5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c5c");
    expect_pool_empty(&f, "xp");
    expect_fds(&f, fds0);
    goodbye(&s);
    stop(&f);
    unlink(f.free_log);
}

/* What an xpu device cannot do in this build: capture (UNIMPLEMENTED, before any executor
 * starts), sequence counters (SEQ); and device memory on a cpu pool, and past a pool's limit. */
static void refused_operations(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, NULL, NULL);
    raw_t s;
    raw_hello(&f.h, &s);
    char details[512] = "";
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 64 * 1024, details, sizeof(details)), OK);

    pb_t callable = {.len = 0};
    pb_uint(&callable, 1, 1);
    pb_t req = {.len = 0};
    pb_session(&req, s.id, s.token);
    pb_bytes(&req, 2, callable.buf, callable.len);
    pb_bytes(&req, 5, "xp", 2);
    assert_int_equal(raw_call(&s, M("Capture"), &req, details, sizeof(details), NULL, NULL),
                     UNIMPLEMENTED);
    assert_non_null(strstr(details, "built without an XPU libtorch"));
    assert_non_null(strstr(details, "xpu:0"));
    pb_uint(&req, 6, 1); /* device_resident */
    assert_int_equal(raw_call(&s, M("Capture"), &req, details, sizeof(details), NULL, NULL),
                     UNIMPLEMENTED);
    json_t *st = harness_status(f.c);
    assert_int_equal(json_array_size(json_object_get(st, "executors")), 0);
    json_decref(st);

    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    uint64_t x0 = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 0);
    assert_int_equal(order_frame(&s, GRAPHD_FRAME_SEQ, x0, msg, sizeof(msg)), UNIMPLEMENTED);
    assert_non_null(strstr(msg, "xpu:0 has no sequence counters"));
    uint64_t x5 = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 5);
    assert_int_equal(order_frame(&s, GRAPHD_FRAME_SEQ, x5, msg, sizeof(msg)), NOT_FOUND);
    assert_non_null(strstr(msg, "xpu:5"));

    /* The pool's limit is checked before any device memory is allocated. */
    uint64_t id;
    assert_int_equal(alloc_region(&s, "xp", 65 * 1024, 1, &id, details, sizeof(details)),
                     RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "limit"));
    assert_int_equal(alloc_region(&s, "default", 4096, 1, &id, details, sizeof(details)),
                     INVALID_ARGUMENT);
    assert_non_null(strstr(details, "cuda or xpu"));
    assert_int_equal(create_pool(&s, "nope", "xpu:7", 0, details, sizeof(details)), NOT_FOUND);
    /* Host regions in an xpu pool are host memory as in any pool. */
    assert_int_equal(alloc_region(&s, "xp", 4096, 0, &id, NULL, 0), OK);
    assert_int_equal(free_region(&s, id), OK);
    expect_pool_empty(&f, "xp");
    goodbye(&s);
    stop(&f);
}

/* One injected driver failure: the allocation fails with status and a message holding says[],
 * nothing leaks (pool figures, the daemon's fds), and the daemon serves others on. */
static void injected(const char *knob, uint64_t size, int status, const char *const *says)
{
    fixture_t f;
    const char *knobs[] = {knob, NULL};
    start(&f, knobs, NULL);
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    int fds0 = daemon_fds(&f);
    char details[512] = "";
    uint64_t id;
    for (int i = 0; i < 2; i++) { /* twice: the first failure left the daemon as it was */
        assert_int_equal(alloc_region(&s, "xp", size, 1, &id, details, sizeof(details)), status);
        for (size_t k = 0; says[k]; k++)
            if (strstr(details, says[k]) == NULL)
                fail_msg("%s: '%s' does not say '%s'", knob, details, says[k]);
        expect_pool_empty(&f, "xp");
        expect_fds(&f, fds0);
    }
    /* Others are served: a host region, and a new session. */
    assert_int_equal(alloc_region(&s, "xp", 4096, 0, &id, NULL, 0), OK);
    assert_int_equal(free_region(&s, id), OK);
    raw_t other;
    raw_hello(&f.h, &other);
    goodbye(&other);
    goodbye(&s);
    stop(&f);
}

static void injected_out_of_memory(void **state)
{
    (void)state;
    const char *says[] = {"xpu:0", "1048576", "out of device memory", NULL};
    injected("GRAPHD_ZE_TEST_FAIL_ALLOC_AFTER=0", MiB, RESOURCE_EXHAUSTED, says);
    /* The device really full: 4 MiB of device memory, 5 MiB asked in two regions. */
    fixture_t f;
    const char *knobs[] = {"GRAPHD_ZE_TEST_MEM_MB=4", NULL};
    start(&f, knobs, NULL);
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    uint64_t a, b;
    char details[512] = "";
    assert_int_equal(alloc_region(&s, "xp", 3 * MiB, 1, &a, NULL, 0), OK);
    assert_int_equal(alloc_region(&s, "xp", 2 * MiB, 1, &b, details, sizeof(details)),
                     RESOURCE_EXHAUSTED);
    assert_non_null(strstr(details, "xpu:0"));
    assert_non_null(strstr(details, "2097152"));
    assert_int_equal(pool_figures(&f, "xp").regions, 1);
    assert_int_equal(free_region(&s, a), OK);
    expect_pool_empty(&f, "xp");
    assert_int_equal(alloc_region(&s, "xp", 2 * MiB, 1, &b, NULL, 0), OK);
    goodbye(&s);
    expect_pool_empty(&f, "xp");
    stop(&f);
}

static void injected_device_lost(void **state)
{
    (void)state;
    /* The daemon's one context is the first counted call; the device is lost after it. */
    const char *says[] = {"xpu:0", "DEVICE_LOST", NULL};
    injected("GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=1", MiB, UNAVAILABLE, says);

    /* Status shows the device wedged, and the daemon warned once. */
    fixture_t f;
    const char *knobs[] = {"GRAPHD_ZE_TEST_DEVICE_LOST_AFTER=1", NULL};
    start(&f, knobs, NULL);
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    uint64_t id;
    assert_int_equal(alloc_region(&s, "xp", 4096, 1, &id, NULL, 0), UNAVAILABLE);
    json_t *d = telemetry_with(&f, "xpu:0", "wedged");
    json_decref(d);
    usleep(1200 * 1000); /* another read: still one warning */
    assert_int_equal(count_in(daemon_log(&f), "device xpu:0 (graphd test XPU 0) is wedged"), 1);
    goodbye(&s);
    stop(&f);
}

static void injected_no_ipc(void **state)
{
    (void)state;
    const char *says[] = {"xpu:0", "IPC", NULL};
    injected("GRAPHD_ZE_TEST_NO_IPC=1", 8192, FAILED_PRECONDITION, says);
}

/* A driver without Sysman: telemetry is read, and every value is absent, not zero. */
static void injected_no_sysman(void **state)
{
    (void)state;
    fixture_t f;
    const char *knobs[] = {"GRAPHD_ZE_TEST_NO_SYSMAN=1", NULL};
    start(&f, knobs, NULL);
    json_t *d = telemetry_with(&f, "xpu:0", NULL);
    json_t *t = json_object_get(d, "telemetry");
    static const char *const flags[] = {"have_memory", "have_engine", "have_utilisation",
                                        "have_reset"};
    for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++)
        assert_false(json_is_true(json_object_get(t, flags[i])));
    assert_string_equal(json_string_value(json_object_get(t, "memory_health")), "");
    json_decref(d);
    /* Regions still work. */
    raw_t s;
    raw_hello(&f.h, &s);
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    uint64_t id;
    assert_int_equal(alloc_region(&s, "xp", 4096, 1, &id, NULL, 0), OK);
    goodbye(&s);
    expect_pool_empty(&f, "xp");
    stop(&f);
}

/* No xpu device: the device list is the cpu's alone, and one info line says why. */
static void expect_no_xpu(const char *const *knobs, const char *const *args, const char *why)
{
    fixture_t f;
    start(&f, knobs, args);
    json_t *st = harness_status(f.c);
    json_t *devs = json_object_get(st, "devices");
    assert_int_equal(devices_but_cuda(devs), 1);
    assert_non_null(harness_find(devs, "id", "cpu:0"));
    json_decref(st);
    const char *log = daemon_log(&f);
    assert_int_equal(count_in(log, "no xpu device listed"), 1);
    if (strstr(log, why) == NULL)
        fail_msg("the daemon's log does not say '%s':\n%s", why, log);
    raw_t s;
    raw_hello(&f.h, &s);
    char details[256] = "";
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, details, sizeof(details)), NOT_FOUND);
    goodbye(&s);
    stop(&f);
}

static void without_driver(void **state)
{
    (void)state;
    const char *none[] = {"ZE_ENABLE_ALT_DRIVERS", NULL};
    expect_no_xpu(none, NULL,
                  "info  no xpu device listed: no Level Zero driver: zeInit answered "
                  "ZE_RESULT_ERROR_UNINITIALIZED");
    const char *init_fail[] = {"GRAPHD_ZE_TEST_INIT_FAIL=1", NULL};
    expect_no_xpu(init_fail, NULL, "info  no xpu device listed: no Level Zero driver");
    const char *off[] = {"--xpu", "off", NULL};
    expect_no_xpu(NULL, off, "info  no xpu device listed: xpu = off");
}

/* ---- events: a session's Level Zero IPC event pool ----------------------------------------- */

static void hex_encode(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int hex_decode(const char *in, uint8_t *b, size_t n)
{
    if (strlen(in) != 2 * n)
        return -1;
    for (size_t i = 0; i < n; i++) {
        unsigned v;
        if (sscanf(in + 2 * i, "%2x", &v) != 1)
            return -1;
        b[i] = (uint8_t)v;
    }
    return 0;
}

/* Sends the pool (handle, count, fd) over a unix socket, the fd with SCM_RIGHTS. */
static void send_pool(int sock, const gr_ze_ipc_t *ipc, uint32_t count, int fd)
{
    uint8_t buf[GR_ZE_IPC_SIZE + 4];
    memcpy(buf, ipc->data, GR_ZE_IPC_SIZE);
    memcpy(buf + GR_ZE_IPC_SIZE, &count, 4);
    assert_int_equal(zt_send_fd(sock, fd, buf, sizeof(buf)), 0);
}

/* Role "events" (a re-executed child, "client A"): opens a session on the daemon at address,
 * gets its 8 events on xpu:0 and sends them on the socket sock, then waits to be killed. */
static int events_main(const char *address, int sock)
{
    harness_t h;
    memset(&h, 0, sizeof(h));
    snprintf(h.address, sizeof(h.address), "%s", address);
    raw_t s;
    raw_hello(&h, &s);
    gr_ze_ipc_t ipc;
    int fd;
    uint32_t got;
    char text[256];
    if (events_frame(&s, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 0), 8, &ipc, &fd, &got, text,
                     sizeof(text)) != OK)
        return 4;
    send_pool(sock, &ipc, got, fd);
    close(fd);
    for (;;)
        pause();
}

/* Role "waiter" (a re-executed child): opens the pool (fd, handle in hex, count) in its own
 * context, says "waiting" on stdout, waits for event k with zeEventHostSynchronize(UINT64_MAX)
 * and exits 0 once it is signalled. */
static int waiter_main(int fd, const char *hex, unsigned count, unsigned k)
{
    gr_ze_t *own = NULL;
    gr_ze_ipc_t ipc;
    if (hex_decode(hex, ipc.data, GR_ZE_IPC_SIZE) != 0 || gr_ze_open(&own, NULL, 0) != 0)
        return 3;
    gr_ze_event_pool_t *pool = NULL;
    if (gr_ze_event_pool_open(own, 0, &ipc, fd, count, &pool) != 0) {
        fprintf(stderr, "waiter: %s\n", gr_last_error());
        return 4;
    }
    if (gr_ze_event_query(pool, k) != 0)
        return 5; /* signalled before anyone did */
    printf("waiting\n");
    fflush(stdout);
    int rc = gr_ze_event_wait(pool, k, UINT64_MAX);
    if (rc != 0) {
        fprintf(stderr, "waiter: %s\n", gr_last_error());
        return 6;
    }
    gr_ze_event_pool_close(pool);
    gr_ze_close(own);
    return 0;
}

/* Waits up to 30 s for pid (a guard against a hang, not a measure) and returns its status; kills
 * it and fails when it has not ended. */
static int wait_guarded(pid_t pid, const char *what)
{
    int64_t end = harness_now_ms() + 30000;
    int status;
    for (;;) {
        pid_t r = waitpid(pid, &status, WNOHANG);
        if (r == pid)
            return status;
        assert_int_equal(r, 0);
        if (harness_now_ms() > end) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            fail_msg("%s still waits 30 s later: nothing signalled its event", what);
        }
        usleep(20000);
    }
}

/* Client A gets its events on xpu:0, a separate process waits on one with
 * zeEventHostSynchronize(UINT64_MAX), A is SIGKILLed: the daemon signals every event of A's pool,
 * so the waiter returns; the pool is destroyed (the daemon's memfds back where they were). */
static void events_released_on_sigkill(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, NULL, NULL);
    int fds0 = daemon_fds(&f);
    int sv[2];
    assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    fflush(NULL);
    pid_t a = fork();
    if (a == 0) {
        close(sv[0]);
        char sock[16];
        snprintf(sock, sizeof(sock), "%d", sv[1]);
        char *argv[] = {self_exe, "--role", "events", f.h.address, sock, NULL};
        execv(self_exe, argv);
        _exit(127);
    }
    close(sv[1]);
    /* A's pool, as A sent it */
    uint8_t buf[GR_ZE_IPC_SIZE + 4];
    int fd = -1;
    assert_int_equal(zt_recv_fd(sv[0], &fd, buf, sizeof(buf)), 0);
    fcntl(fd, F_SETFD, 0); /* the waiter inherits it */
    close(sv[0]);
    assert_true(fd >= 0);
    uint32_t count;
    memcpy(&count, buf + GR_ZE_IPC_SIZE, 4);
    assert_int_equal(count, 8);
    assert_true(daemon_fds(&f) > fds0); /* the pool's memfd */

    /* The waiter on event 5, and this process's own view of the pool. */
    char hex[2 * GR_ZE_IPC_SIZE + 1], fdarg[16];
    hex_encode(buf, GR_ZE_IPC_SIZE, hex);
    snprintf(fdarg, sizeof(fdarg), "%d", fd);
    char *argv[] = {self_exe, "--role", "waiter", fdarg, hex, "8", "5", NULL};
    pid_t w = zt_spawn_until(argv, "waiting", 10000);
    assert_true(w > 0);
    gr_ze_ipc_t ipc;
    memcpy(ipc.data, buf, GR_ZE_IPC_SIZE);
    gr_ze_event_pool_t *mine = NULL;
    assert_int_equal(gr_ze_event_pool_open(ze, 0, &ipc, fd, count, &mine), 0);
    close(fd);
    for (uint32_t k = 0; k < count; k++)
        assert_int_equal(gr_ze_event_query(mine, k), 0);
    int status;
    assert_int_equal(waitpid(w, &status, WNOHANG), 0); /* nothing has signalled it */

    kill(a, SIGKILL);
    assert_int_equal(waitpid(a, &status, 0), a);
    assert_true(WIFSIGNALED(status));
    status = wait_guarded(w, "the waiter on event 5 of a SIGKILLed client's pool");
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
    /* Every event, waited for: the daemon signals them one after another, so event 5's waiter
     * may be done before events 6 and 7 are signalled (a query here raced with that). */
    for (uint32_t k = 0; k < count; k++)
        assert_int_equal(gr_ze_event_wait(mine, k, 10ull * 1000000000ull), 0);
    assert_int_equal(gr_ze_event_pool_close(mine), 0);
    expect_fds(&f, fds0);
    stop(&f);
}

/* A clean session: the pool's events start unsignalled; what one side signals the other sees;
 * one pool per session and device; bad counts and devices refused; Goodbye and the daemon's
 * SIGTERM each signal every event of a session's pool, and the pools are destroyed. */
static void events_goodbye_and_stop(void **state)
{
    (void)state;
    fixture_t f;
    start(&f, NULL, NULL);
    int fds0 = daemon_fds(&f);
    raw_t s;
    raw_hello(&f.h, &s);
    uint64_t x0 = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 0);
    uint64_t x1 = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 1);
    gr_ze_ipc_t ipc;
    int fd;
    uint32_t got;
    char text[GRAPHD_FRAME_MAX_MSG + 1];
    assert_int_equal(
        events_frame(&s, x0, GR_ZE_EVENTS_MAX + 1, &ipc, &fd, &got, text, sizeof(text)),
        INVALID_ARGUMENT);
    assert_non_null(strstr(text, "at most 4096"));
    assert_int_equal(events_frame(&s, GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 5), 4, &ipc, &fd, &got,
                                  text, sizeof(text)),
                     NOT_FOUND);
    assert_non_null(strstr(text, "xpu:5"));
    assert_int_equal(events_frame(&s, x0, 4, &ipc, &fd, &got, text, sizeof(text)), OK);
    assert_int_equal(got, 4);
    gr_ze_event_pool_t *p0 = NULL;
    assert_int_equal(gr_ze_event_pool_open(ze, 0, &ipc, fd, got, &p0), 0);
    close(fd);
    assert_int_equal(events_frame(&s, x0, 4, &ipc, &fd, &got, text, sizeof(text)), ALREADY_EXISTS);
    assert_non_null(strstr(text, "already has events"));
    for (uint32_t k = 0; k < 4; k++)
        assert_int_equal(gr_ze_event_query(p0, k), 0);
    assert_int_equal(gr_ze_event_signal(p0, 2), 0);
    assert_int_equal(gr_ze_event_query(p0, 2), 1);
    assert_int_equal(gr_ze_event_reset(p0, 2), 0);
    /* A second session, on xpu:1 with the default count, left to the daemon's stop. */
    raw_t s2;
    raw_hello(&f.h, &s2);
    assert_int_equal(events_frame(&s2, x1, 0, &ipc, &fd, &got, text, sizeof(text)), OK);
    assert_int_equal(got, 64);
    gr_ze_event_pool_t *p1 = NULL;
    assert_int_equal(gr_ze_event_pool_open(ze, 1, &ipc, fd, got, &p1), 0);
    close(fd);
    assert_true(daemon_fds(&f) >= fds0 + 2);

    goodbye(&s);
    for (uint32_t k = 0; k < 4; k++)
        assert_int_equal(gr_ze_event_wait(p0, k, 30ull * 1000000000ull), 0);
    assert_int_equal(gr_ze_event_query(p1, 63), 0); /* another session's: not signalled */
    assert_int_equal(gr_ze_event_pool_close(p0), 0);

    char *log = daemon_log(&f);
    assert_null(strstr(log, "signalling the events"));
    assert_null(strstr(log, "destroying the event pool"));
    graphd_close(f.c);
    assert_int_equal(harness_stop(&f.h), 0); /* SIGTERM ends s2 */
    for (uint32_t k = 0; k < 64; k++)
        assert_int_equal(gr_ze_event_query(p1, k), 1);
    assert_int_equal(gr_ze_event_pool_close(p1), 0);
    close(s2.fd);
}

/* A driver without event-pool IPC (GRAPHD_ZE_TEST_NO_EVENT_IPC): EVENTS answers
 * FAILED_PRECONDITION naming the device, the driver and what it lacks, twice, leaving nothing
 * behind; device regions still work. */
static void events_injected_no_event_ipc(void **state)
{
    (void)state;
    fixture_t f;
    const char *knobs[] = {"GRAPHD_ZE_TEST_NO_EVENT_IPC=1", NULL};
    start(&f, knobs, NULL);
    int fds0 = daemon_fds(&f);
    raw_t s;
    raw_hello(&f.h, &s);
    uint64_t x0 = GRAPHD_DEVICE_CODE(GRAPHD_DEVICE_XPU, 0);
    gr_ze_ipc_t ipc;
    int fd;
    uint32_t got;
    char text[GRAPHD_FRAME_MAX_MSG + 1];
    for (int i = 0; i < 2; i++) {
        assert_int_equal(events_frame(&s, x0, 4, &ipc, &fd, &got, text, sizeof(text)),
                         FAILED_PRECONDITION);
        assert_non_null(strstr(text, "xpu:0"));
        assert_non_null(strstr(text, "event-pool IPC"));
        assert_non_null(strstr(text, "driver"));
        assert_int_equal(daemon_fds(&f), fds0);
    }
    assert_int_equal(create_pool(&s, "xp", "xpu:0", 0, NULL, 0), OK);
    uint64_t id;
    uint64_t size;
    assert_int_equal(alloc_region(&s, "xp", 4096, 1, &id, NULL, 0), OK);
    assert_int_equal(map_region(&s, id, &ipc, &fd, &size, text, sizeof(text)), OK);
    close(fd);
    assert_int_equal(free_region(&s, id), OK);
    expect_pool_empty(&f, "xp");
    goodbye(&s);
    expect_fds(&f, fds0);
    stop(&f);
}

/* ---- modes -------------------------------------------------------------------------------- */

static int run_suite(void)
{
    char why[256] = "";
    if (gr_ze_open(&ze, why, sizeof(why)) != 0) {
        fprintf(stderr, "test_xpu: this process cannot open the test driver: %s\n", why);
        return 1;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(devices_and_telemetry),   cmocka_unit_test(region_roundtrip),
        cmocka_unit_test(reclaimed_on_goodbye),    cmocka_unit_test(region_at_shutdown),
        cmocka_unit_test(reclaimed_on_sigkill),    cmocka_unit_test(refused_operations),
        cmocka_unit_test(injected_out_of_memory),  cmocka_unit_test(injected_device_lost),
        cmocka_unit_test(injected_no_ipc),         cmocka_unit_test(injected_no_sysman),
        cmocka_unit_test(without_driver),          cmocka_unit_test(events_released_on_sigkill),
        cmocka_unit_test(events_goodbye_and_stop), cmocka_unit_test(events_injected_no_event_ipc),
    };
    int rc = cmocka_run_group_tests_name(getenv("ZE_ENABLE_LOADER_INTERCEPT")
                                             ? "xpu (ZE_ENABLE_LOADER_INTERCEPT=1)"
                                             : "xpu (loader passing through)",
                                         tests, NULL, NULL);
    gr_ze_close(ze);
    return rc;
}

static int run_modes(void)
{
    static const char *const env[] = {"GRAPHD_ZE_TEST_DEVICES=2", NULL};
    return zt_run_modes(self_exe, "test_xpu", "XPU_TEST_SUITE", env, driver_path);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof(self_exe) - 1);
    if (n <= 0)
        return 2;
    self_exe[n] = '\0';
    if (argc >= 4 && strcmp(argv[1], "--role") == 0 && strcmp(argv[2], "tenant") == 0)
        return tenant_main(argv[3]);
    if (argc >= 5 && strcmp(argv[1], "--role") == 0 && strcmp(argv[2], "events") == 0)
        return events_main(argv[3], atoi(argv[4]));
    if (argc >= 7 && strcmp(argv[1], "--role") == 0 && strcmp(argv[2], "waiter") == 0)
        return waiter_main(atoi(argv[3]), argv[4], (unsigned)atoi(argv[5]),
                           (unsigned)atoi(argv[6]));
    if (getenv("XPU_TEST_SUITE") == NULL)
        return run_modes();
    return run_suite();
}
