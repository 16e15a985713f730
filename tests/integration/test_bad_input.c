/*
 * Bad input gets a precise status and never hurts anyone else: bad pools,
 * names, sizes and regions through libgraphd; undecodable, hand-made and
 * oversize gRPC messages through raw calls; garbage, out-of-order and
 * forged frames on the session socket.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <stdint.h>
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

enum { OK = 0, INVALID_ARGUMENT = 3, NOT_FOUND = 5, RESOURCE_EXHAUSTED = 8 };
enum { FAILED_PRECONDITION = 9, UNIMPLEMENTED = 12 };

/* ---- a little protobuf by hand, for messages libgraphd would never send ---------------- */

static int pb_read_varint(const uint8_t **p, const uint8_t *end, uint64_t *v)
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

/* Calls field(tag, wire type, varint value or length-delimited bytes) for each field. */
static int pb_walk(const uint8_t *p, size_t n,
                   void (*field)(void *ctx, unsigned tag, uint64_t v, const uint8_t *d, size_t dn),
                   void *ctx)
{
    const uint8_t *end = p + n;
    while (p < end) {
        uint64_t key, v = 0;
        if (pb_read_varint(&p, end, &key) != 0)
            return -1;
        const uint8_t *d = NULL;
        size_t dn = 0;
        switch (key & 7) {
        case 0:
            if (pb_read_varint(&p, end, &v) != 0)
                return -1;
            break;
        case 1:
            if (end - p < 8)
                return -1;
            for (int i = 0; i < 8; i++)
                v |= (uint64_t)p[i] << (8 * i);
            p += 8;
            break;
        case 2:
            if (pb_read_varint(&p, end, &v) != 0 || (uint64_t)(end - p) < v)
                return -1;
            d = p, dn = (size_t)v;
            p += v;
            break;
        case 5:
            if (end - p < 4)
                return -1;
            p += 4;
            break;
        default:
            return -1;
        }
        field(ctx, (unsigned)(key >> 3), v, d, dn);
    }
    return 0;
}

typedef struct raw_session {
    uint64_t id, token;
    char socket[108];
} raw_session_t;

static void on_ref_field(void *ctx, unsigned tag, uint64_t v, const uint8_t *d, size_t dn)
{
    raw_session_t *s = ctx;
    (void)d, (void)dn;
    if (tag == 1)
        s->id = v;
    else if (tag == 2)
        s->token = v;
}

static void on_hello_field(void *ctx, unsigned tag, uint64_t v, const uint8_t *d, size_t dn)
{
    raw_session_t *s = ctx;
    (void)v;
    if (tag == 1 && d != NULL)
        pb_walk(d, dn, on_ref_field, s);
    else if (tag == 3 && d != NULL && dn < sizeof(s->socket)) {
        memcpy(s->socket, d, dn);
        s->socket[dn] = '\0';
    }
}

/* Hello by raw gRPC: a session whose id and token this test knows. */
static void raw_hello(const harness_t *h, raw_session_t *s)
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
    assert_int_equal(pb_walk(reply, reply_len, on_hello_field, s), 0);
    assert_true(s->id != 0);
    assert_true(s->socket[0] != '\0');
}

/* ---- session-socket helpers ------------------------------------------------------------ */

/* A client that still works end to end: alloc, write, free. */
static void still_serving(graphd_client_t *c)
{
    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, NULL, 4096, &r), GRAPHD_OK);
    memset(graphd_region_ptr(r), 1, 4096);
    assert_int_equal(graphd_region_free(c, r), GRAPHD_OK);
}

/* ---- through libgraphd ----------------------------------------------------------------- */

static void bad_regions(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "bad-regions");
    assert_non_null(c);
    graphd_region_t *r = NULL;
    assert_int_equal(graphd_region_alloc(c, "no-such-pool", 4096, &r), GRAPHD_ENOT_FOUND);
    assert_true(strlen(graphd_last_error(c)) > 0);
    assert_int_equal(graphd_region_alloc(c, NULL, 0, &r), GRAPHD_EINVALID_ARGUMENT);
    assert_int_equal(graphd_region_alloc(c, NULL, UINT64_MAX, &r), GRAPHD_EINVALID_ARGUMENT);
    assert_int_equal(graphd_region_alloc(c, NULL, 1ULL << 62, &r), GRAPHD_EINVALID_ARGUMENT);
    /* Above the daemon's max_region_bytes (64 GiB by default). */
    assert_int_equal(graphd_region_alloc(c, NULL, 1ULL << 40, &r), GRAPHD_EINVALID_ARGUMENT);
    assert_null(r);
    assert_int_equal(graphd_region_free_id(c, 987654321), GRAPHD_ENOT_FOUND);
    assert_int_equal(graphd_region_map(c, 987654321, &r), GRAPHD_ENOT_FOUND);
    int rc = graphd_region_free_id(c, 0);
    assert_true(rc == GRAPHD_ENOT_FOUND || rc == GRAPHD_EINVALID_ARGUMENT);
    still_serving(c);
    graphd_close(c);
}

static void pool_limits(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "limits");
    assert_non_null(c);
    assert_int_equal(graphd_pool_create(c, "it-small", NULL, 64 * 1024, NULL), GRAPHD_OK);
    graphd_region_t *r1, *r2 = NULL;
    assert_int_equal(graphd_region_alloc(c, "it-small", 64 * 1024 + 1, &r1),
                     GRAPHD_ERESOURCE_EXHAUSTED);
    assert_int_equal(graphd_region_alloc(c, "it-small", 40000, &r1), GRAPHD_OK);
    /* 2 × 40960 page-rounded bytes would pass the 64 KiB limit. */
    assert_int_equal(graphd_region_alloc(c, "it-small", 40000, &r2), GRAPHD_ERESOURCE_EXHAUSTED);
    assert_null(r2);
    assert_int_equal(graphd_region_alloc(c, "it-small", 20000, &r2), GRAPHD_OK);

    assert_int_equal(graphd_pool_delete(c, "it-small"), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_region_free(c, r1), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, "it-small"), GRAPHD_EFAILED_PRECONDITION);
    assert_int_equal(graphd_region_free(c, r2), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, "it-small"), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, "it-small"), GRAPHD_ENOT_FOUND);
    graphd_close(c);
}

static void pool_names(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c;
    assert_int_equal(graphd_connect(h->address, &c), GRAPHD_OK);
    assert_int_equal(graphd_hello(c, "it-pool-names"), GRAPHD_OK); /* pools need an owner */
    char name[80];
    memset(name, 'a', 63);
    name[63] = '\0';
    assert_int_equal(graphd_pool_create(c, name, NULL, 0, NULL), GRAPHD_OK);
    assert_int_equal(graphd_pool_delete(c, name), GRAPHD_OK);
    memset(name, 'a', 64);
    name[64] = '\0';
    assert_int_equal(graphd_pool_create(c, name, NULL, 0, NULL), GRAPHD_EINVALID_ARGUMENT);

    const char *bad[] = {"", "bad name", "a/b", "pool\n", "caf\xc3\xa9", "x;y", "../etc"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        int rc = graphd_pool_create(c, bad[i], NULL, 0, NULL);
        if (rc != GRAPHD_EINVALID_ARGUMENT)
            fail_msg("pool name '%s': %s, want INVALID_ARGUMENT", bad[i], graphd_err_name(rc));
    }
    assert_int_equal(graphd_pool_create(c, "ok.name_1-2", NULL, 0, NULL), GRAPHD_OK);
    assert_int_equal(graphd_pool_create(c, "ok.name_1-2", NULL, 0, NULL), GRAPHD_EALREADY_EXISTS);
    assert_int_equal(graphd_pool_create(c, "default", NULL, 0, NULL), GRAPHD_EALREADY_EXISTS);
    /* The daemon's pool: a client deleting it could re-create it with a 4 KiB limit. */
    assert_int_equal(graphd_pool_delete(c, "default"), GRAPHD_EPERMISSION_DENIED);
    assert_non_null(strstr(graphd_last_error(c), "default pool and cannot be deleted"));
    assert_int_equal(graphd_pool_create(c, "default", NULL, 4096, NULL), GRAPHD_EALREADY_EXISTS);
    assert_int_equal(graphd_pool_delete(c, "ok.name_1-2"), GRAPHD_OK);
    int rc = graphd_pool_delete(c, "");
    assert_true(rc == GRAPHD_ENOT_FOUND || rc == GRAPHD_EINVALID_ARGUMENT);
    rc = graphd_pool_create(c, "it-dev", "cuda:7", 0, NULL);
    if (rc != GRAPHD_ENOT_FOUND && rc != GRAPHD_EINVALID_ARGUMENT)
        fail_msg("unknown device: %s, want NOT_FOUND or INVALID_ARGUMENT", graphd_err_name(rc));
    graphd_close(c);
}

/* ---- raw gRPC -------------------------------------------------------------------------- */

static void undecodable_messages(void **state)
{
    harness_t *h = *state;
    uint8_t junk[16];
    memset(junk, 0xff, sizeof(junk));
    const char *methods[] = {M("Hello"),      M("Goodbye"),     M("CreatePool"),
                             M("DeletePool"), M("AllocRegion"), M("FreeRegion")};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        char details[256];
        int st = harness_raw_call(h->address, methods[i], junk, sizeof(junk), details,
                                  sizeof(details), NULL, NULL);
        if (st != INVALID_ARGUMENT)
            fail_msg("%s with 0xff bytes: status %d (%s), want INVALID_ARGUMENT", methods[i], st,
                     details);
    }
    char details[256];
    assert_int_equal(harness_raw_call(h->address, M("NoSuchMethod"), "", 0, details,
                                      sizeof(details), NULL, NULL),
                     UNIMPLEMENTED);
}

/* Strings that protobuf-c would take as they come: invalid UTF-8 (an invalid client_name made
 * every later StatusReply undecodable for standard protobuf clients) and embedded NUL bytes
 * (cut silently at the NUL). */
static void invalid_strings(void **state)
{
    harness_t *h = *state;
    static const struct {
        const char *method;
        const char *bytes;
        size_t len;
        const char *field;
    } cases[] = {
        {M("Hello"), "bad\xff\xfename", 9, "'client_name' of graphd.v1.HelloRequest is not valid"},
        {M("Hello"), "\xed\xa0\x80", 3, "is not valid UTF-8"}, /* a surrogate */
        {M("Hello"), "ab\0cd", 5, "'client_name' of graphd.v1.HelloRequest holds a NUL"},
        {M("CreatePool"), "pool\0x", 6, "'name' of graphd.v1.CreatePoolRequest holds a NUL"},
        {M("CreatePool"), "\xc0\xaf", 2, "is not valid UTF-8"}, /* an overlong '/' */
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pb_t req = {.len = 0};
        pb_bytes(&req, 1, cases[i].bytes, cases[i].len);
        char details[256] = "";
        int st = harness_raw_call(h->address, cases[i].method, req.buf, req.len, details,
                                  sizeof(details), NULL, NULL);
        if (st != INVALID_ARGUMENT || strstr(details, cases[i].field) == NULL)
            fail_msg("case %zu: status %d (%s), want INVALID_ARGUMENT with \"%s\"", i, st, details,
                     cases[i].field);
    }
    /* Valid UTF-8 beyond ASCII is a name like any other, and status still decodes. */
    graphd_client_t *c = harness_client(h, "caf\xc3\xa9 \xe2\x9c\x93");
    assert_non_null(c);
    json_t *st = harness_status(c);
    assert_non_null(st);
    json_decref(st);
    graphd_close(c);
}

static void forged_sessions(void **state)
{
    harness_t *h = *state;
    pb_t req = {.len = 0};
    char details[256];
    pb_session(&req, 999999, 1);
    pb_uint(&req, 3, 4096);
    assert_int_equal(harness_raw_call(h->address, M("AllocRegion"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     NOT_FOUND);

    /* A real session with the wrong token looks exactly like an unknown one. */
    graphd_client_t *c = harness_client(h, "victim");
    assert_non_null(c);
    graphd_region_t *r;
    assert_int_equal(graphd_region_alloc(c, NULL, 4096, &r), GRAPHD_OK);
    req.len = 0;
    pb_session(&req, graphd_session_id(c), 0x1234);
    pb_uint(&req, 3, 4096);
    assert_int_equal(harness_raw_call(h->address, M("AllocRegion"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     NOT_FOUND);
    req.len = 0;
    pb_session(&req, graphd_session_id(c), 0x1234);
    pb_uint(&req, 2, graphd_region_id(r));
    assert_int_equal(harness_raw_call(h->address, M("FreeRegion"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     NOT_FOUND);
    req.len = 0;
    pb_session(&req, graphd_session_id(c), 0x1234);
    assert_int_equal(harness_raw_call(h->address, M("Goodbye"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     NOT_FOUND);
    /* A forged ATTACH for it is refused, and the real session is untouched. */
    int fd = dp_connect(graphd_session_socket(c));
    dp_send_frame(fd, GRAPHD_FRAME_ATTACH, 1, graphd_session_id(c), 0x1234);
    graphd_frame_t f;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    dp_recv_frame(fd, &f, msg, sizeof(msg));
    assert_true(f.status != 0);
    close(fd);
    assert_int_equal(graphd_region_free(c, r), GRAPHD_OK);
    still_serving(c);
    graphd_close(c);

    /* Protocol version 2 is refused. */
    req.len = 0;
    pb_bytes(&req, 1, "future", 6);
    pb_uint(&req, 2, (uint64_t)getpid());
    pb_uint(&req, 3, 2);
    assert_int_equal(harness_raw_call(h->address, M("Hello"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     FAILED_PRECONDITION);
}

/* A session whose socket never attached has no owner (no SO_PEERCRED identity): every call
 * but Goodbye is refused, modules, captures and replays included. */
static void calls_before_attach(void **state)
{
    harness_t *h = *state;
    raw_session_t s;
    raw_hello(h, &s);
    pb_t req = {.len = 0};
    char details[256];
    pb_session(&req, s.id, s.token);
    pb_uint(&req, 3, 4096);
    int st = harness_raw_call(h->address, M("AllocRegion"), req.buf, req.len, details,
                              sizeof(details), NULL, NULL);
    if (st != FAILED_PRECONDITION)
        fail_msg("AllocRegion before ATTACH: status %d (%s), want FAILED_PRECONDITION", st,
                 details);
    const char *methods[] = {M("RegisterModule"), M("ReleaseModule"), M("Capture"),
                             M("Replay"),         M("ReleaseGraph"),  M("FreeRegion")};
    for (size_t i = 0; i < sizeof(methods) / sizeof(methods[0]); i++) {
        req.len = 0;
        pb_session(&req, s.id, s.token);
        st = harness_raw_call(h->address, methods[i], req.buf, req.len, details, sizeof(details),
                              NULL, NULL);
        if (st != FAILED_PRECONDITION || strstr(details, "attach the session socket") == NULL)
            fail_msg("%s before ATTACH: status %d (%s), want FAILED_PRECONDITION", methods[i], st,
                     details);
    }
    req.len = 0;
    pb_session(&req, s.id, s.token);
    assert_int_equal(harness_raw_call(h->address, M("Goodbye"), req.buf, req.len, details,
                                      sizeof(details), NULL, NULL),
                     OK);
}

/* ---- the session socket ---------------------------------------------------------------- */

static void garbage_on_session_socket(void **state)
{
    harness_t *h = *state;
    graphd_client_t *other = harness_client(h, "bystander");
    assert_non_null(other);
    const char *path = graphd_session_socket(other);

    /* 40 bytes of garbage. */
    uint8_t junk[GRAPHD_FRAME_SIZE];
    memset(junk, 0xee, sizeof(junk));
    int fd = dp_connect(path);
    dp_send(fd, junk, sizeof(junk));
    expect_error_then_close(fd, "garbage");
    close(fd);

    /* A well-formed frame with a bad version, and one with an unknown type. */
    graphd_frame_t f = {.magic = GRAPHD_FRAME_MAGIC, .version = 9, .type = GRAPHD_FRAME_ATTACH};
    uint8_t raw[GRAPHD_FRAME_SIZE];
    graphd_frame_encode(&f, raw);
    fd = dp_connect(path);
    dp_send(fd, raw, sizeof(raw));
    expect_error_then_close(fd, "bad version");
    close(fd);
    fd = dp_connect(path);
    dp_send_frame(fd, 0x1234, 1, 0, 0);
    expect_error_then_close(fd, "unknown type");
    close(fd);

    /* MAP before ATTACH. */
    fd = dp_connect(path);
    dp_send_frame(fd, GRAPHD_FRAME_MAP, 1, 1, 0);
    expect_error_then_close(fd, "MAP before ATTACH");
    close(fd);

    /* A truncated frame: 10 bytes, then the write side closes. */
    fd = dp_connect(path);
    dp_send(fd, junk, 10);
    shutdown(fd, SHUT_WR);
    expect_error_then_close(fd, "truncated frame");
    close(fd);

    still_serving(other);
    graphd_close(other);
}

static void garbage_ends_attached_session(void **state)
{
    harness_t *h = *state;
    graphd_client_t *watch = harness_client(h, "watch");
    assert_non_null(watch);
    raw_session_t s;
    raw_hello(h, &s);
    int fd = dp_connect(s.socket);
    graphd_frame_t f;
    char msg[GRAPHD_FRAME_MAX_MSG + 1];
    dp_send_frame(fd, GRAPHD_FRAME_ATTACH, 7, s.id, s.token);
    dp_recv_frame(fd, &f, msg, sizeof(msg));
    assert_int_equal(f.type, GRAPHD_FRAME_ATTACH | GRAPHD_FRAME_REPLY);
    assert_int_equal(f.seq, 7);
    assert_int_equal(f.status, 0);

    /* A second ATTACH for an attached session is refused; the first connection carries on. */
    int fd2 = dp_connect(s.socket);
    dp_send_frame(fd2, GRAPHD_FRAME_ATTACH, 1, s.id, s.token);
    dp_recv_frame(fd2, &f, msg, sizeof(msg));
    assert_true(f.status != 0);
    close(fd2);

    /* An unknown region: an error reply, not a closed connection. */
    dp_send_frame(fd, GRAPHD_FRAME_MAP, 8, 987654321, 0);
    dp_recv_frame(fd, &f, msg, sizeof(msg));
    assert_int_equal(f.type, GRAPHD_FRAME_MAP | GRAPHD_FRAME_REPLY);
    assert_int_equal(f.seq, 8);
    assert_int_equal(f.status, NOT_FOUND);

    json_t *st = harness_status(watch);
    assert_non_null(harness_find_int(json_object_get(st, "sessions"), "id", s.id));
    json_decref(st);

    /* Garbage: ERROR, close, and the session is gone. */
    uint8_t junk[GRAPHD_FRAME_SIZE];
    memset(junk, 0x00, sizeof(junk));
    dp_send(fd, junk, sizeof(junk));
    expect_error_then_close(fd, "garbage after ATTACH");
    close(fd);
    int gone = 0;
    for (int64_t t0 = harness_now_ms(); !gone && harness_now_ms() - t0 < 1000;) {
        st = harness_status(watch);
        gone = harness_find_int(json_object_get(st, "sessions"), "id", s.id) == NULL;
        json_decref(st);
        if (!gone)
            usleep(20000);
    }
    assert_true(gone);
    still_serving(watch);
    graphd_close(watch);
}

/* ---- a daemon with a small message limit ----------------------------------------------- */

static void oversize_message(void **state)
{
    harness_t *h = *state;
    graphd_client_t *c = harness_client(h, "big");
    assert_non_null(c);
    char *name = malloc(10 * 1024 + 1);
    assert_non_null(name);
    memset(name, 'n', 10 * 1024);
    name[10 * 1024] = '\0';
    assert_int_equal(graphd_pool_create(c, name, NULL, 0, NULL), GRAPHD_ERESOURCE_EXHAUSTED);
    /* Under the limit but far too long for a name. */
    name[3000] = '\0';
    assert_int_equal(graphd_pool_create(c, name, NULL, 0, NULL), GRAPHD_EINVALID_ARGUMENT);
    free(name);
    still_serving(c);
    graphd_close(c);
}

static int group_setup(void **state)
{
    static harness_t h;
    if (harness_start(&h, NULL) != 0)
        return -1;
    *state = &h;
    return 0;
}

static int small_limit_setup(void **state)
{
    static harness_t h;
    const char *args[] = {"--max-message-bytes", "4096", NULL};
    if (harness_start(&h, args) != 0)
        return -1;
    *state = &h;
    return 0;
}

static int group_teardown(void **state)
{
    return harness_stop(*state) == 0 ? 0 : -1;
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(bad_regions),
        cmocka_unit_test(pool_limits),
        cmocka_unit_test(pool_names),
        cmocka_unit_test(undecodable_messages),
        cmocka_unit_test(invalid_strings),
        cmocka_unit_test(forged_sessions),
        cmocka_unit_test(calls_before_attach),
        cmocka_unit_test(garbage_on_session_socket),
        cmocka_unit_test(garbage_ends_attached_session),
    };
    const struct CMUnitTest limit_tests[] = {
        cmocka_unit_test(oversize_message),
    };
    int failed = cmocka_run_group_tests_name("bad_input", tests, group_setup, group_teardown);
    failed += cmocka_run_group_tests_name("bad_input_small_limit", limit_tests, small_limit_setup,
                                          group_teardown);
    return failed;
}
